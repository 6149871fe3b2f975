#!/usr/bin/env bash
# Checkpoint/restart is bit for bit: a 6-step RL run straight through and the same run
# cut into job steps (run.job_steps, resume = "auto") give identical metrics rows (all
# but timings), identical rollouts.h5 and identical final weights and optimizer state,
# at np 4 (split 2+2) and np 2 (colocated). A run with another seed differs (the check
# can fail). A corrupt checkpoint (flipped byte, truncated file) is skipped by "auto"
# and refused when named; a changed model shape or world layout is refused with the
# keys named; a changed learning rate is allowed and logged; resume = "never" clears
# the run directory's old checkpoints.
# Usage: checkpoint_restart.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
slimpi=$1; root=$2; mpirun=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
cd "$root"
compare="/usr/bin/python3 $root/tests/regression/compare_runs.py"

# run NP NAME [--set ...]: one job step of the 6-step smoke run in $out/NAME.
run() {
  local np=$1 name=$2; shift 2
  $mpirun -np "$np" "$slimpi" run inputs/smoke_rl.toml --set run.n_steps=6 --set eval.interval=2 \
    --set run.dir="$out/$name" "$@" >>"$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
}
# refused NP NAME EXPECTED [--set ...]: the job must fail on every rank with EXPECTED.
refused() {
  local np=$1 name=$2 expected=$3; shift 3
  if $mpirun -np "$np" "$slimpi" run inputs/smoke_rl.toml --set run.n_steps=6 --set eval.interval=2 \
    --set run.dir="$out/$name" "$@" >"$out/refused.log" 2>&1; then
    cat "$out/refused.log"; echo "FAIL: the job ran; expected: $expected"; exit 1
  fi
  grep -qF -- "$expected" "$out/refused.log" || { cat "$out/refused.log"; echo "FAIL: no '$expected'"; exit 1; }
}

echo "== split np 4: 6 steps straight vs 3 + 3"
run 4 straight
run 4 chunked --set run.job_steps=3
grep -q "run.job_steps = 3 reached: stopping after step 3 with a checkpoint" "$out/chunked.log"
test -f "$out/chunked/ckpt/step_00000003/DONE" && test ! -e "$out/chunked/COMPLETE"
run 4 chunked --set run.job_steps=3
grep -q "resuming at step 3 from $out/chunked/ckpt/step_00000003" "$out/chunked.log"
grep -q "cut back to step 3 (96 samples, 3 metric rows kept)" "$out/chunked.log"
test -f "$out/chunked/COMPLETE"
$compare "$out/straight" "$out/chunked"

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
grep -q "finished: step 7 of 7" "$out/chunked.log"

echo "== a fresh start clears the run's old checkpoints"
run 4 chunked --set run.n_steps=2 --set checkpoint.resume=never
grep -q "fresh start: removed $out/chunked/ckpt/step_00000007 of an earlier run" "$out/chunked.log"
[ "$(ls "$out/chunked/ckpt")" = "step_00000002" ] || { ls "$out/chunked/ckpt"; echo "FAIL: stale checkpoints"; exit 1; }
echo "checkpoint_restart: OK"
