#!/usr/bin/env bash
# Does train.async = "one_step_off" learn as well as the synchronous loop? The
# quickstart (SFT, then 600 GRPO steps at np 4 split) per seed, the GRPO stage once
# with train.async = "off" and once with "one_step_off" from the same SFT state (the
# same samples per step), then held-out greedy pass@1 at every evaluation side by side
# and the curves overlaid (postprocess/compare_runs.py -> runs/async_s<seed>.png).
# Runs go to runs/quickstart_{sft,grpo_off,grpo_async}_s<seed>; an SFT state already
# there is reused.
# Usage: perf/async_learning.sh [SEED ...]   (default: 1 2 3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seeds=("$@"); [ ${#seeds[@]} -gt 0 ] || seeds=(1 2 3)
for seed in "${seeds[@]}"; do
  sft=runs/quickstart_sft_s$seed
  if [ ! -f "$sft/trainer_state.h5" ]; then
    jobs/run_local.sh 4 inputs/quickstart_sft.toml --set run.seed="$seed" --set run.dir="$sft" \
      --set checkpoint.resume=never >"$sft.log" 2>&1 || { cat "$sft.log"; exit 1; }
  fi
  for mode in off one_step_off; do
    dir=runs/quickstart_grpo_${mode/one_step_off/async}_s$seed
    jobs/run_local.sh 4 inputs/quickstart_grpo.toml --set run.seed="$seed" --set run.dir="$dir" \
      --set model.init_from="$sft/trainer_state.h5" --set checkpoint.resume=never --set train.async="$mode" \
      >"$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
  done
  /usr/bin/python3 - "runs/quickstart_grpo_off_s$seed" "runs/quickstart_grpo_async_s$seed" "$seed" <<'PY'
import sys
import h5py
import numpy as np

def evals(run):
    with h5py.File(f"{run}/metrics.h5") as f:
        steps, p1 = f["steps/step"][:], f["steps/eval/pass@1"][:]
        t = f["steps/perf/step_time"][:]
    return {int(s): float(v) for s, v in zip(steps, p1) if v == v}, float(np.nansum(t))

off, t_off = evals(sys.argv[1])
asy, t_asy = evals(sys.argv[2])
print(f"seed {sys.argv[3]}: held-out pass@1 by step, off / one_step_off "
      f"(GRPO wall time {t_off:.0f} s / {t_asy:.0f} s):")
print("  " + ", ".join(f"{s}: {100 * off[s]:.1f} / {100 * asy.get(s, float('nan')):.1f}" for s in sorted(off)))
last = max(off)
print(f"  final: {100 * off[last]:.1f} / {100 * asy[last]:.1f} ({100 * (asy[last] - off[last]):+.1f} points)")
PY
  /usr/bin/python3 postprocess/compare_runs.py "runs/quickstart_grpo_off_s$seed" "runs/quickstart_grpo_async_s$seed" \
    --out "runs/async_s$seed.png" >/dev/null
done
