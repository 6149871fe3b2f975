#!/usr/bin/python3
"""Checks a run directory's HDF5 files with h5py: usage check_run_files.py RUN_DIR N_RANKS N_STEPS."""
import sys

import h5py
import numpy as np

run, n_ranks, n_steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

with h5py.File(f"{run}/metrics.h5", "r") as f:
    assert f.attrs["kind"] == b"slimpi metrics" or f.attrs["kind"] == "slimpi metrics", f.attrs["kind"]
    steps = f["steps/step"][:]
    assert list(steps) == list(range(n_steps)), steps
    for name in f["steps"].attrs["columns"].decode().split():
        col = f["steps/" + name][:]
        assert col.shape == (n_steps,), (name, col.shape)
    assert np.all(f["steps/perf/step_time"][:] > 0)
    ranks = f["ranks/rank"][:]
    assert list(ranks) == list(range(n_ranks)) * n_steps, ranks
    assert list(f["ranks/step"][:]) == [s for s in range(n_steps) for _ in range(n_ranks)]
    assert np.all(f["ranks/time/step_s"][:] > 0)

with h5py.File(f"{run}/rollouts.h5", "r") as f:
    assert "deck" in f.attrs and "slimpi_version" in f.attrs
    g = f["samples"]
    n = g["step"].shape[0]
    for name in ["group_index", "index", "weight_version", "prompt_length", "response_length",
                 "reward", "raw_reward", "advantage", "status"]:
        assert g[name].shape == (n,), name
    offsets = g["tokens/offsets"][:]
    assert offsets.shape == (n + 1,) and offsets[0] == 0
    assert offsets[-1] == g["tokens/values"].shape[0]

with open(f"{run}/metrics.csv") as f:
    lines = f.read().splitlines()
assert lines[0].startswith("step,") and len(lines) == n_steps + 1, lines
print(f"check_run_files: {run} ok")
