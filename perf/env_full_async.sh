#!/usr/bin/env bash
# Multi-turn episodes, synchronous loop vs train.async = "full" (docs/environments.md,
# docs/async.md): `slimpi run` of the tool decks' model (inputs/tool_grpo.toml, random
# init: timing only) at np 4 (2 trainers + 2 rollout ranks), 16 groups x 8 episodes a
# step, every episode 3 turns with tests/fixtures/envs/probe_env.py thinking D ms per step
# (4 processes per rollout rank). Runs alternate (off, full, off, full ...); prints steps/s
# of each (wall time of the steps, from metrics.h5's perf/step_time), the ratio full / off
# per pair, the trainers' idle fraction and the episodes' environment wait fraction.
# Usage: perf/env_full_async.sh [D [STEPS [PAIRS]]]   (defaults: 10 ms, 6 steps, 2 pairs)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
delay=${1:-10}
steps=${2:-6}
pairs=${3:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
for i in $(seq "$pairs"); do
  for mode in off full; do
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE mpirun "${flags[@]}" -np 4 build/slimpi run inputs/tool_grpo.toml \
      --set model.init_from= --set rollout.environment=command --set rollout.env_processes=4 \
      --set "rollout.env_command=python3 $root/tests/fixtures/envs/probe_env.py --delay-ms $delay" \
      --set rollout.env_max_turns=3 --set rollout.dynamic_filter=none --set eval.path= --set checkpoint.interval=0 \
      --set train.async=$mode --set run.n_steps="$steps" --set run.dir="$out/${mode}_$i" >"$out/${mode}_$i.log" 2>&1 \
      || { cat "$out/${mode}_$i.log"; exit 1; }
  done
done
/usr/bin/python3 - "$out" "$pairs" <<'PY'
import sys
import h5py, numpy as np
out, pairs = sys.argv[1], int(sys.argv[2])
def row(name):
    with h5py.File(f"{out}/{name}/metrics.h5") as f:
        st = f["steps"]
        n = int(np.isfinite(st["perf/step_time"][:]).sum())
        t = float(np.nansum(st["perf/step_time"][:]))
        idle = float(np.nanmean(st["perf/trainer_idle_fraction"][:])) if "perf/trainer_idle_fraction" in st else float("nan")
        wait = float(np.nanmean(st["perf/env_wait_time_fraction"][:]))
    return n / t, idle, wait
for i in range(1, pairs + 1):
    (s_off, i_off, w_off), (s_full, i_full, w_full) = row(f"off_{i}"), row(f"full_{i}")
    print(f"pair {i}: off {s_off:.3f} steps/s (trainer idle {i_off:.2f}, env wait {w_off:.2f}); "
          f"full {s_full:.3f} steps/s (trainer idle {i_full:.2f}, env wait {w_full:.2f}); full / off {s_full / s_off:.2f}x")
PY
