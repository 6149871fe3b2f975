#!/usr/bin/env bash
# A small model learns to use a tool (docs/environments.md): 2-3 digit multiplication,
# which a 0.86M-parameter byte model cannot do in its head, with the calculator tool.
#   1. inputs/tool_sft.toml: SFT from scratch on whole episodes (tool call, the tool's
#      response, the product copied) until greedy pass@1 of real episodes reaches 20%.
#   2. inputs/tool_grpo.toml: GRPO from that policy, every sample an episode with the
#      built-in calculator, the environment's tokens out of the loss.
# Prints held-out greedy pass@1 (episodes) before and after GRPO.
# Usage: bash jobs/tool_use.sh [SEED]   (default 1; after the README's build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seed=${1:-1}
sft=runs/tool_sft_s$seed grpo=runs/tool_grpo_s$seed
start=$(date +%s)
jobs/run_local.sh 4 inputs/tool_sft.toml --set run.seed="$seed" --set run.dir="$sft" --set checkpoint.resume=never
jobs/run_local.sh 4 inputs/tool_grpo.toml --set run.seed="$seed" --set run.dir="$grpo" \
  --set model.init_from="$sft/trainer_state.h5" --set checkpoint.resume=never
/usr/bin/python3 - "$grpo" "$seed" "$(( $(date +%s) - start ))" <<'PY'
import sys
import h5py
run, seed, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3])
with h5py.File(f"{run}/metrics.h5") as f:
    steps, p1 = f["steps/step"][:], f["steps/eval/pass@1"][:]
    calls = f["steps/rollout/env_tool_calls/mean"][:]
evals = [(int(s), float(v)) for s, v in zip(steps, p1) if v == v]
calls = calls[calls == calls]  # the steps' rows (the final evaluation's row has none)
print(f"tool use seed {seed}: held-out greedy pass@1 {100 * evals[0][1]:.1f}% -> {100 * evals[-1][1]:.1f}% after "
      f"{evals[-1][0]} GRPO steps; tool calls per episode {calls[0]:.2f} -> {calls[-1]:.2f}; {seconds} s in all")
print("  eval/pass@1 by step: " + ", ".join(f"{s}: {100 * v:.1f}" for s, v in evals))
PY
