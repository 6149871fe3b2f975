#!/usr/bin/env bash
# train.async = "one_step_off" (split placement), on a reward the policy learns from
# (tests/regression/digit_reward.py), so that the weights change every step:
#  * the schedule: batch 0 is generated with the initial weights, batch k >= 1 with the
#    weights of step k-1 (every token's weight version in rollouts.h5), trained at step
#    k (rollout/staleness/{mean,max} = 0, then 1); a checkpoint holds the pending batch
#    (pending_rollout.h5 / .json, in the manifest), the last one too;
#  * deterministic whatever the timing: two runs give identical metrics (all but
#    timings), rollouts.h5 and final weights, at np 4 (2+2) and np 3 (1 trainer + 2
#    rollout ranks); and differ from the synchronous run;
#  * resume is bit for bit: 3 + 3 job steps, a finished 4-step run extended to 6, and
#    kill -9 inside a checkpoint write then resume from the one before, equal the
#    straight run (nothing lost, nothing trained twice);
#  * a rollout rank killed (kill -9) in the middle of a run ends the job within 60 s,
#    non-zero, naming the killed process, with no rank left behind;
#  * refused with the reason: colocated placement, SFT, a debug mode, and a resume that
#    changes train.async.
# Usage: async_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
compare="/usr/bin/python3 $root/tests/regression/compare_runs.py"
args=(run inputs/smoke_rl.toml --set run.n_steps=6 --set eval.interval=2 --set checkpoint.interval=2
      --set train.async=one_step_off --set reward.style=command
      --set "reward.command=/usr/bin/python3 $root/tests/regression/digit_reward.py" --set train.lr=3e-3 --set checkpoint.keep_last=10)

tag=async_runs

echo "== np 4 (2 trainers + 2 rollout ranks): the schedule, twice"
run 4 straight
run 4 again
$compare "$out/straight" "$out/again"
/usr/bin/python3 - "$out/straight" <<'PY'
import json, os, sys
import h5py
import numpy as np
run = sys.argv[1]
with h5py.File(f"{run}/rollouts.h5") as f:
    s = f["samples"]
    step, status = s["step"][:], s["status"][:]
    versions, offsets = s["weight_versions/values"][:], s["weight_versions/offsets"][:]
for i in range(len(step)):
    v = versions[offsets[i]:offsets[i + 1]]
    want = max(step[i] - 1, 0)
    assert len(v) > 0 and (v == want).all(), (i, step[i], v)
with h5py.File(f"{run}/metrics.h5") as f:
    mean, mx = f["steps/rollout/staleness/mean"][:6], f["steps/rollout/staleness/max"][:6]
    reward = f["steps/rollout/raw_reward"][:6]
assert list(mean) == [0, 1, 1, 1, 1, 1] and list(mx) == [0, 1, 1, 1, 1, 1], (mean, mx)
for k in (2, 4):
    d = f"{run}/ckpt/step_{k:08d}"
    manifest = json.load(open(f"{d}/manifest.json"))
    names = json.dumps(manifest)
    assert "pending_rollout.h5" in names and "pending_rollout.json" in names, manifest
    with h5py.File(f"{d}/pending_rollout.h5") as p:
        assert (p["samples/step"][:] == k).all() and (p["samples/weight_versions/values"][:] == k - 1).all()
        assert len(p["samples/step"]) == 32, len(p["samples/step"])  # 8 groups x 4 samples
# The last step generated the next batch too: raising run.n_steps continues exactly.
assert os.path.exists(f"{run}/ckpt/step_00000006/pending_rollout.h5")
print(f"async_runs: versions and staleness as scheduled; reward {reward[0]:.3f} -> {reward[-1]:.3f}")
PY

echo "== np 3 (1 trainer + 2 rollout ranks), twice"
run 3 np3 --set parallel.trainer_ranks=1
run 3 np3_again --set parallel.trainer_ranks=1
$compare "$out/np3" "$out/np3_again"

echo "== the synchronous run differs"
run 4 sync --set train.async=off
if $compare "$out/straight" "$out/sync" >"$out/cmp.log" 2>&1; then
  echo "FAIL: one_step_off and off compare equal"; exit 1
fi

echo "== 3 + 3 job steps"
run 4 chunked --set run.job_steps=3
test -f "$out/chunked/ckpt/step_00000003/DONE" && test ! -e "$out/chunked/COMPLETE"
run 4 chunked --set run.job_steps=3
grep -q "resuming at step 3 from $out/chunked/ckpt/step_00000003" "$out/chunked.log"
$compare "$out/straight" "$out/chunked"

echo "== a finished 4-step run extended to 6 steps"
run 4 extended --set run.n_steps=4
run 4 extended
grep -q "resuming at step 4 from $out/extended/ckpt/step_00000004" "$out/extended.log"
$compare "$out/straight" "$out/extended"

echo "== kill -9 inside the write of checkpoint 4, resume from checkpoint 2"
kill9_in_checkpoint 4 kill9 4
run 4 kill9
grep -q "resuming at step 2 from $out/kill9/ckpt/step_00000002" "$out/kill9.log"
$compare "$out/straight" "$out/kill9"

echo "== a rollout rank killed mid-run ends the job, with the rank named, within 60 s"
killed_rank_ends_job 4 crash 200

echo "== refused"
# (one refusal as a job: every rank stops; the deck's through `slimpi check`, one process)
refused colocate 'with parallel.placement = "colocate" (--set) the same ranks do both' 2 \
  --set parallel.placement=colocate
check_refuses sft 'it needs train.mode = "rl"' 2 --set train.mode=sft
check_refuses rollout_only 'debug.rollout_only (--set) runs one side only' 4 --set debug.rollout_only=true
if $mpirun -np 4 "$slimpi" "${args[@]}" --set run.dir="$out/chunked" --set run.n_steps=8 --set train.async=off \
  >"$out/switch.log" 2>&1; then cat "$out/switch.log"; echo "FAIL: a resume switched train.async"; exit 1; fi
grep -qF 'train.async: "one_step_off" in the checkpoint, "off" now (--set)' "$out/switch.log" \
  || { cat "$out/switch.log"; echo "FAIL: the switch was not refused naming train.async"; exit 1; }
echo "async_runs: OK"
