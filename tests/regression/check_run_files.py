#!/usr/bin/python3
"""Checks an RL run directory's HDF5 files with h5py.

Usage: check_run_files.py RUN_DIR N_RANKS N_STEPS SAMPLES_PER_STEP
metrics.h5 has one row per step (plus the final-eval row), one /ranks row per rank
per step; rollouts.h5 has every sample of every step exactly once with consistent CSR
offsets; the trainer's log-probs equal the rollout's at step 0 and ppo_kl is 0 at the
first optimizer step of every rollout.
"""
import sys

import h5py
import numpy as np

run, n_ranks, n_steps, per_step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

with h5py.File(f"{run}/metrics.h5", "r") as f:
    assert f.attrs["kind"] == b"slimpi metrics" or f.attrs["kind"] == "slimpi metrics", f.attrs["kind"]
    steps = f["steps/step"][:]
    assert list(steps) == list(range(n_steps + 1)), steps  # + the final evaluation's row
    for name in f["steps"].attrs["columns"].decode().split():
        col = f["steps/" + name][:]
        assert col.shape == (n_steps + 1,), (name, col.shape)
    assert np.all(f["steps/perf/step_time"][:n_steps] > 0)
    assert f["steps/train/train_rollout_logprob_abs_diff"][0] < 1e-5
    first = f["steps/train_step/0/ppo_kl"][:n_steps]  # slime's gate: the first optimizer step of a rollout
    assert np.all(np.abs(first) < 1e-8), first
    assert np.all(f["steps/train/optimizer_steps"][:n_steps] == 2)
    mean = (f["steps/train_step/0/pg_loss"][:n_steps] + f["steps/train_step/1/pg_loss"][:n_steps]) / 2
    assert np.allclose(mean, f["steps/train/pg_loss"][:n_steps], rtol=1e-5, atol=1e-7)
    assert 0 <= f["steps/eval/pass@1"][0] <= 1 and not np.isnan(f["steps/eval/pass@1"][n_steps])
    ranks = f["ranks/rank"][:]
    assert list(ranks) == list(range(n_ranks)) * n_steps, ranks
    assert list(f["ranks/step"][:]) == [s for s in range(n_steps) for _ in range(n_ranks)]
    assert np.all(f["ranks/time/step_s"][:] > 0)

with h5py.File(f"{run}/rollouts.h5", "r") as f:
    assert "deck" in f.attrs and "slimpi_version" in f.attrs
    g = f["samples"]
    n = g["step"].shape[0]
    assert n == n_steps * per_step, n
    keys = set(zip(g["step"][:], g["group_index"][:], g["index"][:]))
    assert len(keys) == n, "a sample appears twice"
    assert list(g["step"][:]) == [s for s in range(n_steps) for _ in range(per_step)]
    lengths = g["prompt_length"][:] + g["response_length"][:]
    for name in ["group_index", "index", "weight_version", "weight_version_max", "prompt_length", "response_length",
                 "reward", "raw_reward", "advantage", "status"]:
        assert g[name].shape == (n,), name
    offsets = g["tokens/offsets"][:]
    assert offsets.shape == (n + 1,) and offsets[0] == 0
    assert offsets[-1] == g["tokens/values"].shape[0]
    assert np.array_equal(np.diff(offsets), lengths)
    lp = g["rollout_log_probs/offsets"][:]
    assert np.array_equal(np.diff(lp), g["response_length"][:])
    assert np.all(g["rollout_log_probs/values"][:] <= 0)
    # Trained rows hold what training used; every per-token row is empty or full.
    trained = np.isin(g["status"][:], [1, 2])
    for name in ["old_log_probs", "raw_advantages", "advantages"]:
        d = np.diff(g[name + "/offsets"][:])
        assert np.array_equal(d[trained], g["response_length"][:][trained]), name
        assert np.all(d[~trained] == 0), name

with open(f"{run}/metrics.csv") as f:
    lines = f.read().splitlines()
assert lines[0].startswith("step,") and len(lines) == n_steps + 2, lines  # header, steps, final eval
print(f"check_run_files: {run} ok")
