#!/usr/bin/env bash
# End to end: `slimpi run` at np 4 (split 2+2) and np 2 (colocate) writes
# deck.resolved.toml, rollouts.h5 and metrics.h5/.csv that h5dump and h5py read,
# with one /ranks row per rank per step. Usage: platform_smoke.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
slimpi=$1; root=$2; mpirun=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT

$mpirun -np 4 "$slimpi" run "$root/inputs/platform_smoke.toml" --set run.dir="$out/split" >"$out/split.log" 2>&1 \
  || { cat "$out/split.log"; exit 1; }
grep -q "rank layout: placement split, 4 ranks (2 trainer, 2 rollout" "$out/split.log"
grep -q "finished 3 step(s)" "$out/split.log"

$mpirun -np 2 "$slimpi" run "$root/inputs/platform_smoke.toml" --set run.dir="$out/colo" \
  --set parallel.placement=colocate --set parallel.trainer_ranks=0 --set parallel.rollout_ranks=0 \
  --set run.n_steps=2 >"$out/colo.log" 2>&1 || { cat "$out/colo.log"; exit 1; }
grep -q "placement colocate, 2 ranks" "$out/colo.log"

for run in split colo; do
  test -s "$out/$run/deck.resolved.toml"
  h5dump -H "$out/$run/rollouts.h5" >/dev/null
  h5dump -d /steps/perf/step_time "$out/$run/metrics.h5" >/dev/null
  "$slimpi" inspect "$out/$run/metrics.h5" | grep -q "kind: slimpi metrics"
done
# The resolved deck is itself a valid deck.
$mpirun -np 4 "$slimpi" run "$out/split/deck.resolved.toml" --set run.dir="$out/again" >/dev/null 2>&1

/usr/bin/python3 "$root/tests/regression/check_run_files.py" "$out/split" 4 3
/usr/bin/python3 "$root/tests/regression/check_run_files.py" "$out/colo" 2 2
echo "platform_smoke: ok"
