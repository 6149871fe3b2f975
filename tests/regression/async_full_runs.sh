#!/usr/bin/env bash
# train.async = "full" (split placement), on a reward the policy learns from
# (digit_reward.py), so that the weights change every step. How far generation gets
# while the trainers train is timing; every check here holds whatever it is
# (tests/regression/check_full_async.py):
#  * nothing lost, nothing twice: every sample of every group drawn is one row of
#    rollouts.h5 or unfinished work in the last checkpoint, exactly once: straight, in
#    3 + 3 + 2 job steps, and across kill -9 inside a checkpoint write + resume;
#  * tensor-parallel engines (np 5: 1 trainer + 2 engines of 2 ranks) across job steps;
#  * rollout.partial = continue, requeue (np 4: 1 trainer + 3 engines) and discard
#    (every trained sample of one weight version); mask_offpolicy_in_partial masks
#    exactly the tokens older than each sample's newest;
#  * rollout.max_staleness = 0 (regenerate) and 1 (drop): no trained token older;
#  * the metrics: rollout/async/*, staleness, idle fractions;
#  * a dynamic filter that drops every group gives short batches, not a hang; a resume
#    that changes rollout.n_samples_per_prompt under unfinished groups is refused;
#  * a rollout rank killed mid-generation ends the job, naming it, within 60 s;
#  * refused: full-only keys without it, regenerate without a bound, masking with
#    discard, colocate.
# Usage: async_full_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
check="/usr/bin/python3 $root/tests/regression/check_full_async.py"
args=(run inputs/smoke_rl.toml --set run.n_steps=8 --set eval.interval=4 --set checkpoint.interval=2
      --set train.async=full --set reward.style=command --set parallel.trainer_ranks=1
      --set "reward.command=/usr/bin/python3 $root/tests/regression/digit_reward.py" --set train.lr=3e-3
      --set checkpoint.keep_last=10)

tag=async_full_runs

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
              "perf/rollout_idle_fraction", "perf/async_pause_wait_s", "perf/engine_iteration_s"):
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
kill9_in_checkpoint 3 kill9 4
run 3 kill9
grep -q "resuming at step 2 from $out/kill9/ckpt/step_00000002" "$out/kill9.log"
$check "$out/kill9" 4 -1

echo "== rollout.partial = requeue at np 4 (3 engines), with mask_offpolicy_in_partial"
run 4 requeue --set rollout.partial=requeue --set rollout.mask_offpolicy_in_partial=true
$check "$out/requeue" 4 -1 --masked
echo "== tensor-parallel engines: np 5 (1 trainer + 2 engines of 2 rollout ranks), requeue, 4 + 4 job steps"
run 5 etp2 --set rollout.tensor_parallel=2 --set rollout.partial=requeue --set run.job_steps=4
run 5 etp2 --set rollout.tensor_parallel=2 --set rollout.partial=requeue
grep -q "resuming at step 4 from $out/etp2/ckpt/step_00000004" "$out/etp2.log"
$check "$out/etp2" 4 -1

echo "== rollout.partial = discard"
run 3 discard --set rollout.partial=discard
$check "$out/discard" 4 -1 --single-version
echo "== rollout.max_staleness = 0 (regenerate), 1 (drop)"
run 3 stale0 --set rollout.max_staleness=0 --set rollout.stale_policy=regenerate --set rollout.queue_batches=1
$check "$out/stale0" 4 0
run 3 stale1 --set rollout.max_staleness=1
$check "$out/stale1" 4 1

echo "== a dynamic filter that drops every group: short batches after max_sampling_rounds x over_sampling_batch_size"
run 3 filtered --set reward.style=exact_match --set rollout.dynamic_filter=nonzero_std \
  --set rollout.max_sampling_rounds=2 --set rollout.over_sampling_batch_size=12 --set run.n_steps=3 --set eval.path=
grep -q "0 of 8 groups to train: [0-9]* groups finished since the last batch ([0-9]* dropped by the dynamic filter, 0 with an episode the environment failed), and the bound (rollout.max_sampling_rounds x over_sampling_batch_size or rollout_batch_size = 24) was reached" "$out/filtered.log" \
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
killed_rank_ends_job 3 crash 400

echo "== refused"
# (one refusal as a job: every rank stops; the deck's through `slimpi check`, one process)
refused partial_without_full 'rollout.partial (--set) applies to train.async = "full" only' 3 \
  --set train.async=one_step_off --set rollout.partial=discard
check_refuses regenerate_unbounded 'rollout.stale_policy = "regenerate" (--set) needs a staleness bound' 3 \
  --set rollout.stale_policy=regenerate
check_refuses mask_with_discard 'rollout.mask_offpolicy_in_partial (--set) has nothing to mask with rollout.partial = "discard"' 3 \
  --set rollout.mask_offpolicy_in_partial=true --set rollout.partial=discard
check_refuses colocate_full 'train.async = "full" (--set) overlaps generation' 2 --set parallel.placement=colocate \
  --set parallel.trainer_ranks=0
echo "async_full_runs: OK"
