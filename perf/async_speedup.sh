#!/usr/bin/env bash
# train.async = "one_step_off" and "full" vs "off" on the quickstart GRPO stage (the
# async issue's measurement): np 2 split = 1 trainer + 1 rollout rank, each bound to
# its own core with 1 thread, STEPS steps from the quickstart SFT state, no evaluation.
# The runs alternate (off, one_step_off, full, off, ...) so that load on the machine
# hits all alike; reports, per mode, the median step time over steps 2..STEPS and the
# mean trainer / rollout idle fractions, and the steps/s ratios to off.
# SFT_STATE defaults to runs/quickstart_sft_s1/trainer_state.h5 (jobs/quickstart.sh);
# when it is missing, the quickstart SFT stage runs first.
# Usage: perf/async_speedup.sh [STEPS] [SFT_STATE]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${1:-40}
sft=${2:-runs/quickstart_sft_s1/trainer_state.h5}
cd "$root"
slimpi=${SLIMPI:-$root/build/slimpi}
flags=(--bind-to core --map-by core); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
if [ ! -f "$sft" ]; then
  echo "async_speedup: $sft missing: running the quickstart SFT stage into runs/quickstart_sft_s1"
  jobs/run_local.sh 4 inputs/quickstart_sft.toml --set run.seed=1 --set run.dir=runs/quickstart_sft_s1 \
    --set checkpoint.resume=never >"$out/sft.log" 2>&1 || { cat "$out/sft.log"; exit 1; }
  sft=runs/quickstart_sft_s1/trainer_state.h5
fi
export OMP_WAIT_POLICY=PASSIVE
for round in 1 2; do
  for mode in off one_step_off full; do
    mpirun "${flags[@]}" -np 2 "$slimpi" run inputs/quickstart_grpo.toml --set run.dir="$out/${mode}_$round" \
      --set model.init_from="$sft" --set run.n_steps="$steps" --set eval.path= --set run.threads=1 \
      --set parallel.trainer_ranks=1 --set train.async="$mode" --set checkpoint.interval=0 \
      >"$out/${mode}_$round.log" 2>&1 || { cat "$out/${mode}_$round.log"; exit 1; }
  done
done
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
res = {}
for mode in ("off", "one_step_off", "full"):
    times, t_idle, r_idle = [], [], []
    for r in (1, 2):
        with h5py.File(f"{out}/{mode}_{r}/metrics.h5") as f:
            times += list(f["steps/perf/step_time"][1:])
            t_idle += list(f["steps/perf/trainer_idle_fraction"][1:])
            r_idle += list(f["steps/perf/rollout_idle_fraction"][1:])
    res[mode] = (np.median(times), np.mean(t_idle), np.mean(r_idle))
    print(f"{mode:13s} median step {res[mode][0]:.3f} s   trainer idle {100 * res[mode][1]:.1f}%   "
          f"rollout idle {100 * res[mode][2]:.1f}%")
for mode in ("one_step_off", "full"):
    print(f"steps/s {mode} / off: {res['off'][0] / res[mode][0]:.2f}")
# full: how long the trainers waited for the engines to pause, against an engine iteration
waits, iters = [], []
for r in (1, 2):
    with h5py.File(f"{out}/full_{r}/metrics.h5") as f:
        waits += list(f["steps/perf/async_pause_wait_s"][1:-1])
        iters += list(f["steps/perf/engine_iteration_s"][1:-1])
print(f"full: pause wait median {1e3 * np.median(waits):.2f} ms, engine iteration median {1e3 * np.median(iters):.2f} ms "
      f"(ratio {np.median(waits) / np.median(iters):.2f})")
PY
