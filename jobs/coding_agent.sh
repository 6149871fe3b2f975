#!/usr/bin/env bash
# A small model learns to work as a coding agent (docs/agents.md): an unmodified agent
# program written with the openai package (inputs/agents/coding_agent.py) reads test.py,
# writes sol.py and runs the tests through tools in a per-episode sandbox
# (inputs/agents/sandbox.py); slimpi starts it once per episode and serves it the policy.
# The reward is the fraction of hidden tests the final sol.py passes, when the model submitted
# (ended its episode with "done"; else 0).
#   1. inputs/coding_sft.toml: SFT from scratch on whole agent episodes (make-data coding)
#      until greedy pass@1 on 32 dev tasks reaches 50%.
#   2. inputs/coding_grpo.toml: GRPO from that policy, every sample an agent episode.
# Prints greedy pass@1 and mean reward on the evaluation tasks before and after GRPO (held
# out: functions that no SFT trace or GRPO prompt has, make-data coding_heldout).
# Usage: bash jobs/coding_agent.sh [SEED]   (default 1; after the README's build and
# scripts/install_deps.sh, which makes the openai venv /opt/slimpi/agent-clients)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seed=${1:-1}
[ -x /opt/slimpi/agent-clients/bin/python ] || { echo "coding_agent: run scripts/install_deps.sh first (the openai venv)" >&2; exit 1; }
sft=runs/coding_sft_s$seed grpo=runs/coding_grpo_s$seed
start=$(date +%s)
jobs/run_local.sh 4 inputs/coding_sft.toml --set run.seed="$seed" --set run.dir="$sft" --set checkpoint.resume=never
jobs/run_local.sh 4 inputs/coding_grpo.toml --set run.seed="$seed" --set run.dir="$grpo" \
  --set model.init_from="$sft/trainer_state.h5" --set checkpoint.resume=never
/usr/bin/python3 - "$grpo" "$seed" "$(( $(date +%s) - start ))" <<'PY'
import sys
import h5py
run, seed, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3])
with h5py.File(f"{run}/metrics.h5") as f:
    steps, p1, mr = f["steps/step"][:], f["steps/eval/pass@1"][:], f["steps/eval/mean_reward"][:]
    reward = f["steps/rollout/raw_reward"][:]
evals = [(int(s), float(v), float(m)) for s, v, m in zip(steps, p1, mr) if v == v]
reward = reward[reward == reward]
print(f"coding agent seed {seed}: eval greedy pass@1 {100 * evals[0][1]:.1f}% -> {100 * evals[-1][1]:.1f}%, "
      f"mean reward {evals[0][2]:.3f} -> {evals[-1][2]:.3f} after {evals[-1][0]} GRPO steps; sampled reward "
      f"{reward[0]:.3f} -> {reward[-1]:.3f}; {seconds} s in all")
print("  eval/pass@1, eval/mean_reward by step: " + ", ".join(f"{s}: {100 * v:.1f}, {m:.3f}" for s, v, m in evals))
PY
