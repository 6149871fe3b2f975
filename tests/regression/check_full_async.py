"""Checks a train.async = "full" run directory (tests/regression/async_full_runs.sh).

Usage: check_full_async.py RUN_DIR N_SAMPLES MAX_STALENESS [--single-version] [--masked]

* Nothing lost, nothing twice: every sample of every group the run drew, 0..next_group-1
  (next_group from the newest checkpoint's async_state.json), is either a row of
  rollouts.h5 or unfinished work in that checkpoint (a group not started stands for
  all its samples), exactly once.
* Every trained row (status 1, 2) is at most MAX_STALENESS versions behind its step
  (-1: no bound), and its groups are whole.
* --single-version: every trained sample's tokens have one weight version (discard).
* --masked: a trained sample's loss_mask is 0 exactly on tokens older than its newest.
Prints the run's async metrics summed over the steps.
"""
import collections
import glob
import json
import sys

import h5py
import numpy as np

run, n, max_stale = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
single_version = "--single-version" in sys.argv
masked = "--masked" in sys.argv


def csr(group, name, i):
    off = group[f"{name}/offsets"]
    return group[f"{name}/values"][off[i]:off[i + 1]]


with h5py.File(f"{run}/rollouts.h5") as f:
    s = f["samples"]
    step, gi, idx, status = s["step"][:], s["group_index"][:], s["index"][:], s["status"][:]
    v_off, v_val = s["weight_versions/offsets"][:], s["weight_versions/values"][:]
    m_off, m_val = s["loss_mask/offsets"][:], s["loss_mask/values"][:]
    v_min, v_max = s["weight_version"][:], s["weight_version_max"][:]
    rows = collections.Counter(zip(gi.tolist(), idx.tolist()))

ckpt = sorted(glob.glob(f"{run}/ckpt/step_*"))[-1]
state = json.load(open(f"{ckpt}/async_state.json"))
held = collections.Counter()
with h5py.File(f"{ckpt}/async_queue.h5") as f:
    held.update(zip(f["samples/group_index"][:].tolist(), f["samples/index"][:].tolist()))
with h5py.File(f"{ckpt}/async_work.h5") as f:
    for g, i in zip(f["samples/group_index"][:].tolist(), f["samples/index"][:].tolist()):
        held.update([(g, k) for k in range(n)] if i < 0 else [(g, i)])

# The checkpoint holds only what the run files do not: its queue and work are after its step.
with h5py.File(f"{run}/rollouts.h5") as f:
    ckpt_step = int(ckpt.rsplit("_", 1)[1])
    assert (step < ckpt_step).all(), "rollouts.h5 has rows past the newest checkpoint"
every = rows + held
want = {(g, k) for g in range(state["next_group"]) for k in range(n)}
twice = [p for p, c in every.items() if c > 1]
missing = want - set(every)
extra = set(every) - want
assert not twice, f"samples held twice: {twice[:10]}"
assert not missing, f"samples lost: {sorted(missing)[:10]}"
assert not extra, f"samples of groups never drawn: {sorted(extra)[:10]}"

trained = np.nonzero((status == 1) | (status == 2))[0]
per_group = collections.Counter(gi[trained].tolist())
assert all(c == n for c in per_group.values()), "a trained group is not whole"
worst, partial = 0, 0
for i in trained:
    v = v_val[v_off[i]:v_off[i + 1]]
    assert (np.diff(v) >= 0).all() and v_min[i] == v.min() and v_max[i] == v.max(), (i, v, v_min[i], v_max[i])
    worst = max(worst, int(step[i] - v.min()))
    partial += len(set(v.tolist())) > 1
    if single_version:
        assert len(set(v.tolist())) == 1, (i, v)
    if masked:
        m = m_val[m_off[i]:m_off[i + 1]]
        if len(set(v.tolist())) > 1:
            assert (m == (v == v.max())).all(), (i, v, m)
        else:
            assert len(m) == 0 or (m == 1).all(), (i, m)
    if max_stale >= 0:
        assert step[i] - v.min() <= max_stale, f"row {i} (step {step[i]}) has a token of version {v.min()}"

with h5py.File(f"{run}/metrics.h5") as f:
    a = f["steps/rollout/async"]
    sums = {k: float(np.nansum(a[k][:])) for k in a.keys()}
print(f"check_full_async: {run.rsplit('/', 1)[-1]}: {len(step)} rows, {len(trained)} trained, "
      f"{sum(held.values())} held in {ckpt.rsplit('/', 1)[-1]}, groups 0..{state['next_group'] - 1} each sample "
      f"once; staleness max {worst}; {partial} trained samples span versions; {sums}")
