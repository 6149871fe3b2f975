#!/usr/bin/env bash
# slime's debug modes, np 4 (split 2+2):
#  * debug.rollout_only: rollouts.h5 gets every step's samples, all from the initial
#    weights (weight_version 0), and nothing trains (no train/* metrics);
#  * debug.train_only with debug.load_rollouts = a recorded run's rollouts.h5: the
#    train/* metrics of every step and the final weights equal the recorded run's,
#    bit for bit, without generating anything; replaying a run into its own
#    directory (which would overwrite the file being replayed) is refused;
#  * asking to replay a step the file does not have, or train_only without a file,
#    stops the job with the reason.
# Usage: debug_replay.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
run() {
  local name=$1; shift
  $mpirun -np 4 "$slimpi" run inputs/smoke_rl.toml --set run.n_steps=4 --set run.dir="$out/$name" "$@" \
    >"$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
}
run recorded
run rollout_only --set debug.rollout_only=true
run replay --set debug.train_only=true --set debug.load_rollouts="$out/recorded/rollouts.h5"

/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
with h5py.File(f"{out}/rollout_only/rollouts.h5") as f:
    s = f["samples"]
    assert list(np.unique(s["step"][:])) == [0, 1, 2, 3], np.unique(s["step"][:])
    assert np.all(s["weight_version"][:] == 0), "rollout_only changed the weights"
with h5py.File(f"{out}/rollout_only/metrics.h5") as f:
    cols = f["steps"].attrs["columns"].decode().split()
    assert not [c for c in cols if c.startswith("train/")], cols
    assert "rollout/raw_reward" in cols
    # The step table skipped train and weight_sync: no time of theirs.
    assert "perf/train_time" not in cols and "perf/weight_sync_time" not in cols, cols
with h5py.File(f"{out}/recorded/metrics.h5") as a, h5py.File(f"{out}/replay/metrics.h5") as b:
    train = [c for c in a["steps"].attrs["columns"].decode().split() if c.startswith("train/")]
    assert len(train) >= 8, train
    for c in train:
        x, y = a["steps/" + c][:], b["steps/" + c][:]
        assert np.array_equal(x, y, equal_nan=True), (c, x, y)
    # The replay generates nothing; the trainer-side rollout metrics (advantages,
    # log-probs) are recomputed and equal the recorded run's.
    replay_cols = b["steps"].attrs["columns"].decode().split()
    assert "rollout/raw_reward" not in replay_cols and "rollout/generated_tokens" not in replay_cols, replay_cols
    # The step table skipped rollout and reward: no time of theirs.
    assert "perf/rollout_time" not in replay_cols and "perf/reward_time" not in replay_cols, replay_cols
    for c in ["rollout/advantages", "rollout/log_probs"]:
        assert np.array_equal(a["steps/" + c][:], b["steps/" + c][:], equal_nan=True), c
with h5py.File(f"{out}/recorded/rollouts.h5") as a, h5py.File(f"{out}/replay/rollouts.h5") as b:
    # The replay's rollouts.h5 holds the trained rows again, with what it computed.
    trained = np.isin(a["samples/status"][:], [1, 2])
    assert b["samples/step"].shape[0] == trained.sum(), (b["samples/step"].shape, trained.sum())
    for c in ["tokens", "rollout_log_probs", "old_log_probs", "raw_advantages", "advantages"]:
        off = a[f"samples/{c}/offsets"][:]
        rows = [a[f"samples/{c}/values"][off[i]:off[i + 1]] for i in np.flatnonzero(trained)]
        assert np.array_equal(np.concatenate(rows), b[f"samples/{c}/values"][:]), c
with h5py.File(f"{out}/recorded/trainer_state.h5") as a, h5py.File(f"{out}/replay/trainer_state.h5") as b:
    for name in a["model"]:
        assert np.array_equal(a["model"][name][:], b["model"][name][:]), name
print(f"debug_replay: {len(train)} train/* columns and the final weights reproduced")
PY

if $mpirun -np 4 "$slimpi" run inputs/smoke_rl.toml --set run.n_steps=5 --set run.dir="$out/short" \
  --set debug.train_only=true --set debug.load_rollouts="$out/recorded/rollouts.h5" >"$out/short.log" 2>&1; then
  echo "FAIL: replayed a step that was never recorded"; exit 1
fi
grep -q "rollouts.h5 has no samples of step 4" "$out/short.log" || { cat "$out/short.log"; exit 1; }
if $mpirun -np 2 "$slimpi" run inputs/smoke_rl.toml --set run.dir="$out/bad" --set debug.train_only=true \
  >"$out/bad.log" 2>&1; then
  echo "FAIL: train_only ran without a file"; exit 1
fi
grep -q "debug.train_only (--set) needs debug.load_rollouts" "$out/bad.log" || { cat "$out/bad.log"; exit 1; }
if $mpirun -np 2 "$slimpi" run inputs/smoke_rl.toml --set run.dir="$out/recorded" --set debug.train_only=true \
  --set debug.load_rollouts="$out/recorded/rollouts.h5" >"$out/self.log" 2>&1; then
  echo "FAIL: replayed a run into itself"; exit 1
fi
grep -q "is this run's own rollouts.h5, which the run rewrites" "$out/self.log" || { cat "$out/self.log"; exit 1; }
echo "debug_replay: OK"
