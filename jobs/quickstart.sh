#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the
# quickstart under mpirun -np 4: SFT from scratch on addition until the dev-set greedy
# pass@1 reaches 20% (inputs/quickstart_sft.toml, 4 data-parallel ranks), then GRPO
# from that policy (inputs/quickstart_grpo.toml, 2 trainer + 2 rollout ranks), and
# prints held-out greedy pass@1 before and after GRPO, and writes the GRPO run's plot
# (runs/quickstart_grpo_s<seed>/plot.png).
# Usage: bash jobs/quickstart.sh [SEED ...]      (default: seed 1)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
cd "$root"
seeds=("$@"); [ ${#seeds[@]} -gt 0 ] || seeds=(1)
for seed in "${seeds[@]}"; do
  sft=runs/quickstart_sft_s$seed grpo=runs/quickstart_grpo_s$seed
  start=$(date +%s)
  # checkpoint.resume = never: the quickstart always runs from scratch (a plain
  # `jobs/run_local.sh` of the same deck would continue from the run's checkpoints).
  jobs/run_local.sh 4 inputs/quickstart_sft.toml --set run.seed="$seed" --set run.dir="$sft" \
    --set checkpoint.resume=never
  jobs/run_local.sh 4 inputs/quickstart_grpo.toml --set run.seed="$seed" --set run.dir="$grpo" \
    --set model.init_from="$sft/trainer_state.h5" --set checkpoint.resume=never
  /usr/bin/python3 - "$grpo" "$seed" "$(( $(date +%s) - start ))" <<'PY'
import sys
import h5py
run, seed, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3])
with h5py.File(f"{run}/metrics.h5") as f:
    steps, p1 = f["steps/step"][:], f["steps/eval/pass@1"][:]
evals = [(int(s), float(v)) for s, v in zip(steps, p1) if v == v]
first, last = evals[0][1], evals[-1][1]
print(f"quickstart seed {seed}: held-out greedy pass@1 {100 * first:.1f}% -> {100 * last:.1f}% "
      f"({100 * (last - first):+.1f} points) after {evals[-1][0]} GRPO steps; {seconds} s in all")
print("  eval/pass@1 by step: " + ", ".join(f"{s}: {100 * v:.1f}" for s, v in evals))
PY
  /usr/bin/python3 postprocess/plot_run.py "$grpo"
done
