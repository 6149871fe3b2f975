#!/usr/bin/python3
"""Asserts that two run directories hold the same run, bit for bit.

Usage: compare_runs.py RUN_A RUN_B
metrics.h5: the same steps and, in every column but measurements of the machine
(perf/*_time, perf/*_s seconds, time/*, tokens/s, GB/s, resident memory perf/*_rss_mb), the same values (NaN where NaN); rollouts.h5: every dataset equal;
the final trainer_state.h5: the same model and optimizer tensors.
"""
import sys

import h5py
import numpy as np

a, b = sys.argv[1], sys.argv[2]


def timing(name):
    """A measurement of the machine, not of the run: timings and resident memory."""
    return (name.startswith("perf/") and ("time" in name or "per_s" in name or "gbps" in name or "rss" in name
                                          or name.endswith("_idle_fraction") or name.endswith("_s"))) \
        or name.startswith("time/")


def same(x, y):
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
        assert same(x, y), f"metrics column {c} differs:\n{x}\n{y}"
        compared += 1
    assert same(fa["ranks/step"][:], fb["ranks/step"][:])
    assert same(fa["ranks/rank"][:], fb["ranks/rank"][:])

with h5py.File(f"{a}/rollouts.h5") as fa, h5py.File(f"{b}/rollouts.h5") as fb:
    names = []
    fa["samples"].visit(lambda n: names.append(n) if isinstance(fa["samples/" + n], h5py.Dataset) else None)
    assert names, "rollouts.h5 has no datasets"
    for n in names:
        assert same(fa["samples/" + n][:], fb["samples/" + n][:]), f"rollouts.h5 samples/{n} differs"
    n_samples = fa["samples/step"].shape[0]

with h5py.File(f"{a}/trainer_state.h5") as fa, h5py.File(f"{b}/trainer_state.h5") as fb:
    tensors = []
    fa.visit(lambda n: tensors.append(n) if isinstance(fa[n], h5py.Dataset) else None)
    for n in tensors:
        if n.startswith("rng/"):
            continue
        assert same(fa[n][:], fb[n][:]), f"trainer_state.h5 {n} differs"

print(f"compare_runs: {a} == {b}: {compared} metric columns, {n_samples} samples, {len(tensors)} tensors")
