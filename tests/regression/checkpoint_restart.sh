#!/usr/bin/env bash
# Checkpoint/restart is bit for bit: a 6-step RL run straight through and the same run
# cut into job steps (run.job_steps, resume = "auto") give identical metrics rows (all
# but timings), identical rollouts.h5 and identical final weights and optimizer state,
# at np 4 (split 2+2) and np 2 (colocated). A run with another seed differs (the check
# can fail). A corrupt checkpoint (flipped byte, truncated file) is skipped by "auto"
# and refused when named; a changed model shape or world layout is refused with the
# keys named; a changed learning rate is allowed and logged. Nothing is destroyed by
# itself: "auto" with finished checkpoints of which none verifies is refused (each
# listed), with only unfinished ones (no DONE) it starts over and keeps them aside;
# resume = "never" moves the earlier run's files and checkpoints aside; a missing
# rollouts.h5 leaves metrics.h5 as it is; a resumed run needs no model.init_from file
# (unless a KL term's reference model is those weights: refused on every rank);
# a run already past run.n_steps says so and exits 0; an unwritable checkpoint.dir is
# found at start.
# Usage: checkpoint_restart.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
compare="/usr/bin/python3 $root/tests/regression/compare_runs.py"

# run NP NAME [--set ...]: one job step of the 6-step smoke run in $out/NAME.
run() {
  local np=$1 name=$2; shift 2
  $mpirun -np "$np" "$slimpi" run inputs/smoke_rl.toml --set run.n_steps=6 --set eval.interval=2 \
    --set run.dir="$out/$name" "$@" >>"$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
}
# refused NP NAME EXPECTED [--set ...]: the job must fail on every rank with EXPECTED, within 120 s.
refused() {
  local np=$1 name=$2 expected=$3 rc=0; shift 3
  timeout 120 $mpirun -np "$np" "$slimpi" run inputs/smoke_rl.toml --set run.n_steps=6 --set eval.interval=2 \
    --set run.dir="$out/$name" "$@" >"$out/refused.log" 2>&1 || rc=$?
  [ $rc -ne 0 ] || { cat "$out/refused.log"; echo "FAIL: the job ran; expected: $expected"; exit 1; }
  [ $rc -ne 124 ] || { cat "$out/refused.log"; echo "FAIL: the job hung; expected: $expected"; exit 1; }
  grep -qF -- "$expected" "$out/refused.log" || { cat "$out/refused.log"; echo "FAIL: no '$expected'"; exit 1; }
}

echo "== split np 4: 6 steps straight vs 3 + 3"
run 4 straight
run 4 chunked --set run.job_steps=3
test -f "$out/chunked/ckpt/step_00000003/DONE" && test ! -e "$out/chunked/COMPLETE"
run 4 chunked --set run.job_steps=3
grep -q "resuming at step 3 from $out/chunked/ckpt/step_00000003" "$out/chunked.log"
test -f "$out/chunked/COMPLETE"
$compare "$out/straight" "$out/chunked"  # every sample and metric row of steps 1..6

echo "== colocated np 2: 6 steps straight vs 4 + 2"
run 2 colo_straight --set parallel.placement=colocate
run 2 colo_chunked --set parallel.placement=colocate --set run.job_steps=4
run 2 colo_chunked --set parallel.placement=colocate
$compare "$out/colo_straight" "$out/colo_chunked"

echo "== the comparison can fail: another seed"
run 2 colo_seed2 --set parallel.placement=colocate --set run.seed=2
if $compare "$out/colo_straight" "$out/colo_seed2" >"$out/cmp.log" 2>&1; then
  echo "FAIL: runs with seeds 1234 and 2 compare equal"; exit 1
fi

echo "== corrupt checkpoints"
cp -r "$out/chunked" "$out/flipped"
/usr/bin/python3 - "$out/flipped/ckpt/step_00000006/trainer_state.h5" <<'PY'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[len(data) // 2] ^= 0xFF
open(path, "wb").write(bytes(data))
PY
rm "$out/flipped/COMPLETE"
refused 4 flipped "step_00000006\" (--set) cannot be resumed from: trainer_state.h5: checksum" \
  --set checkpoint.resume="$out/flipped/ckpt/step_00000006"
run 4 flipped
grep -q "checkpoint $out/flipped/ckpt/step_00000006 skipped: trainer_state.h5: checksum" "$out/flipped.log"
grep -q "resuming at step 3" "$out/flipped.log"
$compare "$out/straight" "$out/flipped"
truncate -s 100 "$out/flipped/ckpt/step_00000003/run_state.h5"
refused 4 flipped "run_state.h5: 100 bytes, the manifest says" \
  --set checkpoint.resume="$out/flipped/ckpt/step_00000003"
rm "$out/flipped/ckpt/step_00000003/DONE"
refused 4 flipped "no DONE marker" --set checkpoint.resume="$out/flipped/ckpt/step_00000003"

echo "== structural keys and layout"
refused 4 chunked "model.hidden_size: 32 in the checkpoint, 64 now (--set)" --set model.hidden_size=64 \
  --set model.n_heads=4
refused 2 chunked "world layout: split: 4 ranks, 2 trainer + 2 rollout in the checkpoint, split: 2 ranks, 1 trainer + 1 rollout now"
refused 4 chunked "run.seed: 1234 in the checkpoint, 7 now (--set)" --set run.seed=7
run 4 chunked --set run.n_steps=7 --set train.lr=0.0005
grep -q "resume: changed since the checkpoint: train.lr: 0.001 in the checkpoint, 0.0005 now (--set)" "$out/chunked.log"
grep -q "resuming at step 6" "$out/chunked.log"
steps_done "$out/chunked" 7

echo "== a run past run.n_steps ends at once, exit 0"
run 4 chunked --set run.n_steps=3
grep -q "the run is already at step 7 (checkpoint $out/chunked/ckpt/step_00000007), run.n_steps = 3 (--set): nothing to do" \
  "$out/chunked.log"
/usr/bin/python3 - "$out/chunked" <<'PY'
import sys
import h5py
with h5py.File(f"{sys.argv[1]}/metrics.h5") as f:  # the final evaluation's row (step 7) is still there
    steps = list(f["steps/step"][:])
    assert steps == list(range(8)), steps
    assert f["steps/eval/pass@1"][7] == f["steps/eval/pass@1"][7], "no final evaluation in row 7"
PY

echo "== finished checkpoints of which none verifies: refused, nothing touched"
cp -r "$out/chunked" "$out/undone"
/usr/bin/python3 - "$out"/undone/ckpt/step_*/trainer_state.h5 <<'PY'
import sys
for path in sys.argv[1:]:
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
PY
# (the lock and deck.resolved.toml belong to the job that is running, not to the run)
data_files() { (cd "$out/undone" && find . -type f ! -name .slimpi.lock ! -name deck.resolved.toml | sort | xargs md5sum); }
before=$(data_files)
refused 4 undone "no checkpoint under $out/undone/ckpt can be resumed from:"
grep -qF "step_00000006: trainer_state.h5: checksum" "$out/refused.log"
grep -qF "step_00000007: trainer_state.h5: checksum" "$out/refused.log"
[ "$before" = "$(data_files)" ] \
  || { echo "FAIL: a refused resume changed the run directory"; exit 1; }

echo "== a fresh start moves the earlier run aside"
run 4 undone --set run.n_steps=2 --set checkpoint.resume=never
grep -q "were moved to $out/undone/previous_" "$out/undone.log"
aside=$(ls -d "$out"/undone/previous_*)
test -f "$aside/rollouts.h5" && test -f "$aside/metrics.h5" && test -d "$aside/ckpt/step_00000007"
[ "$(ls "$out/undone/ckpt")" = "step_00000002" ] || { ls "$out/undone/ckpt"; echo "FAIL: stale checkpoints"; exit 1; }

echo "== only unfinished checkpoints (no DONE: a job that died inside them): \"auto\" starts over, keeping them aside"
cp -r "$out/chunked" "$out/unfinished"
rm -f "$out"/unfinished/ckpt/step_*/DONE "$out/unfinished/COMPLETE"
run 4 unfinished --set run.n_steps=2
grep -qF "no finished checkpoint under $out/unfinished/ckpt (2 unfinished: no DONE marker); starting over" \
  "$out/unfinished.log"
grep -q "were moved to $out/unfinished/previous_" "$out/unfinished.log"
aside=$(ls -d "$out"/unfinished/previous_*)
test -d "$aside/ckpt/step_00000007" && test -f "$aside/rollouts.h5"
[ "$(ls "$out/unfinished/ckpt")" = "step_00000002" ] || { ls "$out/unfinished/ckpt"; echo "FAIL: unfinished checkpoints left"; exit 1; }

echo "== rollouts.h5 lost, metrics.h5 kept; model.init_from not needed to resume"
run 4 partial --set run.job_steps=3 --set model.init_from="$out/straight/trainer_state.h5"
rm "$out/partial/rollouts.h5" "$out/straight/trainer_state.h5"
run 4 partial --set model.init_from="$out/straight/trainer_state.h5"
grep -q "resuming without $out/partial/rollouts.h5: a new one holds steps 3 on" "$out/partial.log"
# ... unless the KL terms need it as their reference: refused on every rank (no rank waits for the trainers)
run 4 kl_ref --set run.job_steps=2 --set train.use_kl_loss=true --set train.kl_loss_coef=0.01 --set model.init_from="$out/partial/trainer_state.h5"
mv "$out/partial/trainer_state.h5" "$out/partial/trainer_state.h5.aside"
refused 4 kl_ref "model.init_from = \"$out/partial/trainer_state.h5\" (--set) is gone: the reference model of the KL terms" \
  --set train.use_kl_loss=true --set train.kl_loss_coef=0.01 --set model.init_from="$out/partial/trainer_state.h5"
mv "$out/partial/trainer_state.h5.aside" "$out/partial/trainer_state.h5"
/usr/bin/python3 - "$out/partial" <<'PY'
import sys
import h5py
with h5py.File(f"{sys.argv[1]}/metrics.h5") as f:
    assert list(f["steps/step"][:]) == list(range(7)), f["steps/step"][:]  # steps 0-2 kept, 3-5 + final eval
with h5py.File(f"{sys.argv[1]}/rollouts.h5") as f:
    assert set(f["samples/step"][:]) == {3, 4, 5}
PY

echo "== an unwritable checkpoint.dir is found before the first step"
touch "$out/not_a_dir"
refused 4 nockpt "is not writable" --set checkpoint.dir="$out/not_a_dir/ckpt"
grep -q "step 1/6" "$out/refused.log" && { echo "FAIL: trained before noticing"; exit 1; }
echo "checkpoint_restart: OK"
