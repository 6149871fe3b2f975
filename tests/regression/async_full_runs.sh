#!/usr/bin/env bash
# train.async = "full" (split placement), on a reward the policy learns from
# (digit_reward.py), so that the weights change every step. How far generation gets
# while the trainers train is timing; every check here holds whatever it is
# (tests/regression/check_full_async.py):
#  * nothing lost, nothing twice: every sample of every group drawn is one row of
#    rollouts.h5 or unfinished work in the last checkpoint, exactly once: straight, in
#    3 + 3 + 2 job steps, and across kill -9 inside a checkpoint write + resume;
#  * rollout.partial = continue, requeue (np 4: 1 trainer + 3 engines) and discard
#    (every trained sample of one weight version); mask_offpolicy_in_partial masks
#    exactly the tokens older than each sample's newest;
#  * rollout.max_staleness = 0 (regenerate) and 1 (drop): no trained token older;
#  * the metrics: rollout/async/*, staleness, idle fractions;
#  * a dynamic filter that drops every group gives short batches, not a hang; a resume
#    that changes rollout.n_samples_per_prompt under unfinished groups is refused;
#  * a rollout rank killed mid-generation ends the job, naming it, within 60 s;
#  * refused: full-only keys without it, sampling-round keys with it, colocate.
# Usage: async_full_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
slimpi=$1; root=$2; mpirun=$3
out=$(mktemp -d); trap 'pkill -9 -f "$out" 2>/dev/null || true; rm -rf "$out"' EXIT
cd "$root"
check="/usr/bin/python3 $root/tests/regression/check_full_async.py"
args=(run inputs/smoke_rl.toml --set run.n_steps=8 --set eval.interval=4 --set checkpoint.interval=2
      --set train.async=full --set reward.style=command --set parallel.trainer_ranks=1
      --set "reward.command=/usr/bin/python3 $root/tests/regression/digit_reward.py" --set train.lr=3e-3
      --set checkpoint.keep_last=10)

run() {  # run NP NAME [--set ...]: one job step, must succeed
  local np=$1 name=$2; shift 2
  $mpirun -np "$np" "$slimpi" "${args[@]}" --set run.dir="$out/$name" "$@" >>"$out/$name.log" 2>&1 \
    || { cat "$out/$name.log"; exit 1; }
}
refused() {  # refused NAME EXPECTED NP [--set ...]: every rank stops with EXPECTED
  local name=$1 expected=$2 np=$3; shift 3
  if timeout 120 $mpirun -np "$np" "$slimpi" "${args[@]}" --set run.dir="$out/$name" "$@" >"$out/$name.log" 2>&1; then
    cat "$out/$name.log"; echo "FAIL: $name ran; expected: $expected"; exit 1
  fi
  grep -qF -- "$expected" "$out/$name.log" || { cat "$out/$name.log"; echo "FAIL: no '$expected'"; exit 1; }
  echo "async_full_runs: $name refused as expected"
}

echo "== np 3 (1 trainer + 2 engines), rollout.partial = continue, checkpoints every 2 steps"
run 3 straight
$check "$out/straight" 4 -1
/usr/bin/python3 - "$out/straight" <<'PY'
import json, sys
import h5py, numpy as np
run = sys.argv[1]
with h5py.File(f"{run}/metrics.h5") as f:
    st = f["steps"]
    for k in ("rollout/async/ready_groups", "rollout/async/open_groups", "rollout/async/partial_continued",
              "rollout/async/stale_dropped_groups", "rollout/staleness/max", "perf/trainer_idle_fraction",
              "perf/rollout_idle_fraction"):
        assert np.isfinite(st[k][:8]).all(), k
    # queue depth: at most rollout.queue_batches (2) batches of 8 groups ahead
    assert (st["rollout/async/ready_groups"][:8] + st["rollout/async/open_groups"][:8] <= 16).all()
manifest = json.dumps(json.load(open(f"{run}/ckpt/step_00000004/manifest.json")))
for name in ("async_queue.h5", "async_work.h5", "async_state.json"):
    assert name in manifest, manifest
print("async_full_runs: metrics and checkpoint files present")
PY

echo "== 3 + 3 + 2 job steps"
run 3 chunked --set run.job_steps=3
run 3 chunked --set run.job_steps=3
grep -q "resuming at step 3 from $out/chunked/ckpt/step_00000003" "$out/chunked.log"
run 3 chunked
grep -q "resuming at step 6 from $out/chunked/ckpt/step_00000006" "$out/chunked.log"
$check "$out/chunked" 4 -1

echo "== kill -9 inside the write of checkpoint 4, resume from checkpoint 2"
SLIMPI_FAULT_CHECKPOINT_PAUSE_AT=4 $mpirun -np 3 "$slimpi" "${args[@]}" --set run.dir="$out/kill9" \
  >>"$out/kill9.log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -qF "fault injection: pausing 60 s" "$out/kill9.log" 2>/dev/null && break; sleep 0.1; done
grep -qF "fault injection: pausing 60 s inside $out/kill9/ckpt/step_00000004" "$out/kill9.log" \
  || { cat "$out/kill9.log"; echo "FAIL: the job never paused in checkpoint 4"; exit 1; }
kill -9 $(pgrep -f "^[^ ]*slimpi run .*run.dir=$out/kill9( |$)") "$job" 2>/dev/null || true
wait "$job" 2>/dev/null || true
run 3 kill9
grep -q "resuming at step 2 from $out/kill9/ckpt/step_00000002" "$out/kill9.log"
$check "$out/kill9" 4 -1

echo "== rollout.partial = requeue at np 4 (3 engines), with mask_offpolicy_in_partial"
run 4 requeue --set rollout.partial=requeue --set rollout.mask_offpolicy_in_partial=true
$check "$out/requeue" 4 -1 --masked
echo "== rollout.partial = discard"
run 3 discard --set rollout.partial=discard
$check "$out/discard" 4 -1 --single-version
echo "== rollout.max_staleness = 0 (regenerate), 1 (drop)"
run 3 stale0 --set rollout.max_staleness=0 --set rollout.stale_policy=regenerate --set rollout.queue_batches=1
$check "$out/stale0" 4 0
run 3 stale1 --set rollout.max_staleness=1
$check "$out/stale1" 4 1

echo "== a dynamic filter that drops every group: short batches after max_sampling_rounds x rollout_batch_size"
run 3 filtered --set reward.style=exact_match --set rollout.dynamic_filter=nonzero_std \
  --set rollout.max_sampling_rounds=2 --set run.n_steps=3 --set eval.path=
grep -q "the dynamic filter kept 0 of 8 groups among the" "$out/filtered.log" \
  || { cat "$out/filtered.log"; echo "FAIL: no short-batch warning"; exit 1; }
$check "$out/filtered" 4 -1

echo "== a resume that changes the groups under way is refused"
if $mpirun -np 3 "$slimpi" "${args[@]}" --set run.dir="$out/chunked" --set run.n_steps=10 \
  --set rollout.n_samples_per_prompt=2 >"$out/resize.log" 2>&1; then
  cat "$out/resize.log"; echo "FAIL: resumed with other group sizes"; exit 1
fi
grep -qF "holds groups of 4 samples of up to 6 new tokens under way" "$out/resize.log" \
  || { cat "$out/resize.log"; echo "FAIL: the change was not named"; exit 1; }

echo "== a rollout rank killed mid-run ends the job, with the rank named, within 60 s"
$mpirun -np 3 "$slimpi" "${args[@]}" --set run.n_steps=400 --set run.dir="$out/crash" >"$out/crash.log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -qF "step 2/400" "$out/crash.log" 2>/dev/null && break; sleep 0.1; done
victim=$(pgrep -f "^[^ ]*slimpi run .*run.dir=$out/crash( |$)" | sort -n | tail -1)  # the last rank: an engine
[ -n "$victim" ] || { cat "$out/crash.log"; echo "FAIL: no rank to kill"; exit 1; }
kill -9 "$victim"
ended=0
for _ in $(seq 600); do kill -0 "$job" 2>/dev/null || { ended=1; break; }; sleep 0.1; done
[ $ended = 1 ] || { kill -9 "$job"; cat "$out/crash.log"; echo "FAIL: the job outlived a killed rank by 60 s"; exit 1; }
if wait "$job"; then cat "$out/crash.log"; echo "FAIL: exit 0 after a rank was killed"; exit 1; fi
grep -q "exited on signal 9" "$out/crash.log" || { cat "$out/crash.log"; echo "FAIL: no word of the killed rank"; exit 1; }
if pgrep -f "run.dir=$out/crash" >/dev/null; then echo "FAIL: ranks outlived the job"; exit 1; fi
echo "async_full_runs: a killed engine ended the job: $(grep 'exited on signal 9' "$out/crash.log" | head -1)"

echo "== refused"
refused partial_without_full 'rollout.partial (--set) applies to train.async = "full" only' 3 \
  --set train.async=one_step_off --set rollout.partial=discard
refused rounds_with_full 'rollout.over_sampling_batch_size (--set) does not apply to train.async = "full"' 3 \
  --set rollout.over_sampling_batch_size=12
refused colocate_full 'train.async = "full" (--set) overlaps generation' 2 --set parallel.placement=colocate \
  --set parallel.trainer_ranks=0
echo "async_full_runs: OK"
