#!/usr/bin/env bash
# End to end: a 3-step RL job (inputs/smoke_rl.toml) at np 4 (split 2+2), np 3
# (split 1+2) and np 2 (colocated) writes deck.resolved.toml, rollouts.h5 and
# metrics.h5/.csv that h5dump and h5py read; every sample is in rollouts.h5 exactly
# once; engines verify a checksum of every weight update; the trainer's log-probs
# equal the rollout's at step 0 and ppo_kl is 0 at each rollout's first optimizer step.
# Usage: platform_smoke.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"

$mpirun -np 4 "$slimpi" run inputs/smoke_rl.toml --set run.dir="$out/split" >"$out/split.log" 2>&1 \
  || { cat "$out/split.log"; exit 1; }
grep -qx "run complete: 3 steps" "$out/split/COMPLETE"

$mpirun -np 3 "$slimpi" run inputs/smoke_rl.toml --set run.dir="$out/split3" --set parallel.trainer_ranks=1 \
  >"$out/split3.log" 2>&1 || { cat "$out/split3.log"; exit 1; }

$mpirun -np 2 "$slimpi" run inputs/smoke_rl.toml --set run.dir="$out/colo" --set parallel.placement=colocate \
  --set run.n_steps=2 >"$out/colo.log" 2>&1 || { cat "$out/colo.log"; exit 1; }

for run in split split3 colo; do
  test -s "$out/$run/deck.resolved.toml"
  h5dump -H "$out/$run/rollouts.h5" >/dev/null
  h5dump -d /steps/perf/step_time "$out/$run/metrics.h5" >/dev/null
  "$slimpi" inspect "$out/$run/metrics.h5" >"$out/inspect.txt"
  grep -q "kind: slimpi metrics" "$out/inspect.txt"
done
# inspect on files slimpi did not write: a `kind` stored as h5py stores a str (a
# variable-length string), and a group with `offsets` and `values` whose offsets is a
# scalar (not a CSR column: listed as plain datasets, not read as one; it crashed).
/usr/bin/python3 - "$out/odd.h5" <<'PYEOF'
import sys
import h5py
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["kind"] = "made by h5py"
    g = f.create_group("odd")
    g["offsets"] = 7
    g["values"] = [1.0, 2.0]
PYEOF
"$slimpi" inspect "$out/odd.h5" >"$out/inspect_odd.txt" || { cat "$out/inspect_odd.txt"; exit 1; }
grep -q "kind: made by h5py" "$out/inspect_odd.txt" || { cat "$out/inspect_odd.txt"; exit 1; }
grep -Eq "^ +offsets +int64 +\[\]" "$out/inspect_odd.txt" || { cat "$out/inspect_odd.txt"; exit 1; }
grep -Eq "^ +values +float64 +\[2\] +min 1" "$out/inspect_odd.txt" || { cat "$out/inspect_odd.txt"; exit 1; }

# The resolved deck is itself a valid deck, and the same deck gives the same run.
$mpirun -np 4 "$slimpi" run "$out/split/deck.resolved.toml" --set run.dir="$out/again" >/dev/null 2>&1
cmp <(h5dump -d /samples/tokens/values "$out/split/rollouts.h5" | tail -n +3) \
    <(h5dump -d /samples/tokens/values "$out/again/rollouts.h5" | tail -n +3)

# The rank layout each run had, as its last checkpoint records it.
/usr/bin/python3 - "$out" <<'PYEOF'
import sys
import h5py
out = sys.argv[1]
for run, steps, layout in [("split", 3, "split: 4 ranks, 2 trainer + 2 rollout"),
                           ("split3", 3, "split: 3 ranks, 1 trainer + 2 rollout"), ("colo", 2, "colocate: 2 ranks")]:
    with h5py.File(f"{out}/{run}/ckpt/step_{steps:08d}/run_state.h5") as f:
        got = f.attrs["layout"]
        got = got.decode() if isinstance(got, bytes) else str(got)
    assert got == layout, (run, got, layout)
PYEOF
/usr/bin/python3 "$root/tests/regression/check_run_files.py" "$out/split" 4 3 32
/usr/bin/python3 "$root/tests/regression/check_run_files.py" "$out/split3" 3 3 32
/usr/bin/python3 "$root/tests/regression/check_run_files.py" "$out/colo" 2 2 32
echo "platform_smoke: ok"
