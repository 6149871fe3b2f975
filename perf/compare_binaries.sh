#!/usr/bin/env bash
# Step time of two slimpi binaries on the same job, measured alternately in one session
# (old, new, old, new, ...), so that machine drift lands on both: the quickstart GRPO
# stage from a short SFT policy, np 1 (colocated: one process, no cross-rank waits),
# 1 thread. Prints each run's median step time (steps 2.., the first warms up) and the
# ratio new / old of the medians over runs.
# Usage: perf/compare_binaries.sh OLD_SLIMPI NEW_SLIMPI [ROUNDS=3] [STEPS=20]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
old=$(realpath "$1"); new=$(realpath "$2"); rounds=${3:-3}; steps=${4:-20}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
cd "$root"
flags=(--oversubscribe --bind-to none); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
mpirun "${flags[@]}" -np 1 "$new" run inputs/quickstart_sft.toml --set run.dir="$out/sft" --set run.n_steps=100 \
  --set eval.stop_at_pass1=0 --set eval.path= --set parallel.placement=colocate --set checkpoint.resume=never \
  >"$out/sft.log" 2>&1 || { tail -20 "$out/sft.log"; exit 1; }
for ((r = 0; r < rounds; ++r)); do
  for which in old new; do
    bin=$old; [ "$which" = new ] && bin=$new
    dir=$out/$which$r
    mpirun "${flags[@]}" -np 1 "$bin" run inputs/quickstart_grpo.toml --set run.dir="$dir" --set run.n_steps="$steps" \
      --set eval.path= --set parallel.placement=colocate --set run.threads=1 --set checkpoint.resume=never \
      --set model.init_from="$out/sft/trainer_state.h5" >"$dir.log" 2>&1 || { tail -20 "$dir.log"; exit 1; }
  done
done
/usr/bin/python3 - "$out" "$rounds" <<'PY'
import sys
import h5py
import numpy as np
out, rounds = sys.argv[1], int(sys.argv[2])
med = {"old": [], "new": []}
for r in range(rounds):
    for which in ("old", "new"):
        with h5py.File(f"{out}/{which}{r}/metrics.h5") as f:
            t = f["steps/perf/step_time"][:]
        t = t[np.isfinite(t)][1:]
        med[which].append(float(np.median(t)))
        print(f"round {r} {which}: median step {1e3 * med[which][-1]:.1f} ms over {len(t)} steps")
o, n = np.median(med["old"]), np.median(med["new"])
print(f"compare_binaries: new / old = {n / o:.3f} (median step {1e3 * n:.1f} ms vs {1e3 * o:.1f} ms, {rounds} rounds)")
PY
