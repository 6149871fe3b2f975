#!/usr/bin/python3
"""Asserts that two run directories hold the same run, bit for bit.

Usage: compare_runs.py RUN_A RUN_B [--engine-scheduling-varies ATOL] [--with-rng]
--engine-scheduling-varies: with several engines fed by a router, an engine's batches
depend on when requests arrive, and so do a token's engine log-prob (the batch it was
computed in) and the prefix cache's hits. Then the engine's log-probs (rollouts.h5
rollout_log_probs, and train*/train_rollout_logprob_abs_diff computed from them) must
agree within ATOL, and the counters of engine scheduling (rollout/prefill_tokens_computed,
rollout/prefix_cache_hit_rate, rollout/preemptions) are not compared; every token,
reward, trainer-side value and weight still must be equal bit for bit.
metrics.h5: the same steps and, in every column but measurements of the machine
(perf/*_time, perf/*_s seconds, time/*, tokens/s, GB/s, resident memory perf/*_rss_mb), the same values (NaN where NaN); rollouts.h5: every dataset equal;
the final trainer_state.h5: the same model and optimizer tensors (--with-rng: and the
recorded generator states, rng/*, which a run seeds from run.seed).
"""
import sys

import h5py
import numpy as np

args = sys.argv[1:]
engine_atol = None
if "--engine-scheduling-varies" in args:
    i = args.index("--engine-scheduling-varies")
    engine_atol = float(args[i + 1])
    del args[i:i + 2]
with_rng = "--with-rng" in args
if with_rng:
    args.remove("--with-rng")
a, b = args[0], args[1]


def engine_logprobs(name):
    """Values computed from the engine's log-probs (compared within engine_atol when given)."""
    return engine_atol is not None and ("rollout_log_probs" in name or name.endswith("train_rollout_logprob_abs_diff"))


SCHEDULING = ("rollout/prefill_tokens_computed", "rollout/prefix_cache_hit_rate", "rollout/preemptions")


def timing(name):
    """A measurement of the machine, not of the run: timings and resident memory."""
    if engine_atol is not None and name in SCHEDULING:
        return True
    return (name.startswith("perf/") and ("time" in name or "per_s" in name or "gbps" in name or "rss" in name
                                          or name.endswith("_idle_fraction") or name.endswith("_s"))) \
        or name.startswith("time/")


def same(x, y, name=""):
    if engine_logprobs(name):
        return x.shape == y.shape and x.dtype == y.dtype and np.allclose(x, y, rtol=0, atol=engine_atol, equal_nan=True)
    return x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f")


with h5py.File(f"{a}/metrics.h5") as fa, h5py.File(f"{b}/metrics.h5") as fb:
    assert same(fa["steps/step"][:], fb["steps/step"][:]), (fa["steps/step"][:], fb["steps/step"][:])
    cols_a = fa["steps"].attrs["columns"].decode().split()
    cols_b = fb["steps"].attrs["columns"].decode().split()
    assert sorted(cols_a) == sorted(cols_b), set(cols_a) ^ set(cols_b)
    compared = 0
    for c in cols_a:
        if timing(c):
            continue
        x, y = fa["steps/" + c][:], fb["steps/" + c][:]
        assert same(x, y, c), f"metrics column {c} differs:\n{x}\n{y}"
        compared += 1
    assert same(fa["ranks/step"][:], fb["ranks/step"][:])
    assert same(fa["ranks/rank"][:], fb["ranks/rank"][:])

with h5py.File(f"{a}/rollouts.h5") as fa, h5py.File(f"{b}/rollouts.h5") as fb:
    names = []
    fa["samples"].visit(lambda n: names.append(n) if isinstance(fa["samples/" + n], h5py.Dataset) else None)
    assert names, "rollouts.h5 has no datasets"
    for n in names:
        if n in ("env_time_s", "episode_time_s"):  # multi-turn episodes' wall times: measurements of the machine
            continue
        assert same(fa["samples/" + n][:], fb["samples/" + n][:], n), f"rollouts.h5 samples/{n} differs"
    n_samples = fa["samples/step"].shape[0]

with h5py.File(f"{a}/trainer_state.h5") as fa, h5py.File(f"{b}/trainer_state.h5") as fb:
    tensors = []
    fa.visit(lambda n: tensors.append(n) if isinstance(fa[n], h5py.Dataset) else None)
    for n in tensors:
        if n.startswith("rng/") and not with_rng:
            continue
        assert same(fa[n][:], fb[n][:]), f"trainer_state.h5 {n} differs"

print(f"compare_runs: {a} == {b}: {compared} metric columns, {n_samples} samples, {len(tensors)} tensors")
