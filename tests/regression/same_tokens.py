#!/usr/bin/python3
"""Two runs generated the same samples and logged the same metrics to fp32 round-off:
what a parallel layout must keep (expert_parallel_runs.sh, tensor_parallel_runs.sh).

Usage: same_tokens.py [--except=COLUMN,...] TAG RUN_A RUN_B [DATASET ...]
Every samples/<DATASET> of rollouts.h5 (default: tokens/values tokens/offsets reward
step) is equal (integers) or equal to relative 1e-3, absolute 1e-5 (floats); the
rewards vary; every train*, rollout/ and eval/ column of metrics.h5 is equal to
relative 1e-3, absolute 1e-6 (values near 0), train/grad_norm and train/pg_loss among them,
but the --except columns (counters a layout changes by design, e.g. prefix-cache hits).
"""
import sys

import h5py
import numpy as np

excepted = {c for a in sys.argv[1:] if a.startswith("--except=") for c in a[len("--except="):].split(",")}
argv = [a for a in sys.argv[1:] if not a.startswith("--except=")]
tag, a, b = argv[0:3]
datasets = argv[3:] or ["tokens/values", "tokens/offsets", "reward", "step"]
with h5py.File(f"{a}/rollouts.h5") as fa, h5py.File(f"{b}/rollouts.h5") as fb:
    for d in datasets:
        x, y = fa["samples/" + d][:], fb["samples/" + d][:]
        same = np.allclose(x, y, rtol=1e-3, atol=1e-5) if x.dtype.kind == "f" else np.array_equal(x, y)
        assert same, f"{a} vs {b}: samples/{d} differ"
    n = len(fa["samples/reward"][:])
    assert np.std(fa["samples/reward"][:]) > 0, "the reward did not vary"
with h5py.File(f"{a}/metrics.h5") as fa, h5py.File(f"{b}/metrics.h5") as fb:
    cols = [c for c in fa["steps"].attrs["columns"].decode().split()
            if c.startswith(("train", "rollout/", "eval/")) and c not in excepted]
    assert "train/grad_norm" in cols and "train/pg_loss" in cols
    for c in cols:
        x, y = fa["steps/" + c][:], fb["steps/" + c][:]
        assert np.allclose(x, y, rtol=1e-3, atol=1e-6, equal_nan=True), (c, x, y)
print(f"{tag}: {b} == {a}: {n} samples ({', '.join(datasets)}), {len(cols)} metrics")
