"""Reading a slimpi run directory's HDF5 files (the layout is in the README, "Files").

    run = load_run("runs/quickstart_grpo")
    run.steps            # int64 [n] step numbers of metrics.h5 /steps
    run.metric("rollout/raw_reward")   # float64 [n], NaN where a step has no value
    run.columns          # metric names in order of first use
    run.ranks            # {"rank": [...], "step": [...], "time/train_s": [...], ...} (/ranks)
    run.n_samples        # rows of rollouts.h5 (0 when absent)
Only h5py and numpy; every script in postprocess/ uses this module.
"""
import os

import h5py
import numpy as np


class Run:
    def __init__(self, path):
        self.path = path.rstrip("/")
        self.name = os.path.basename(self.path)
        metrics = os.path.join(self.path, "metrics.h5")
        if not os.path.exists(metrics):
            raise SystemExit(f"{metrics}: no such file (is {self.path} a slimpi run directory?)")
        with h5py.File(metrics, "r") as f:
            self.steps = f["steps/step"][:]
            self.columns = f["steps"].attrs["columns"].decode().split()
            self._metrics = {c: f["steps/" + c][:] for c in self.columns}
            self.ranks = {}
            if "ranks" in f:
                f["ranks"].visit(lambda k: self.ranks.__setitem__(k, f["ranks/" + k][:])
                                 if isinstance(f["ranks/" + k], h5py.Dataset) else None)
            deck = f.attrs.get("deck", b"")
            self.deck = deck.decode() if isinstance(deck, bytes) else str(deck)
        self.n_samples = 0
        rollouts = os.path.join(self.path, "rollouts.h5")
        if os.path.exists(rollouts):
            with h5py.File(rollouts, "r") as f:
                self.n_samples = int(f["samples/step"].shape[0])
        self.world_size = int(self.ranks["rank"].max()) + 1 if "rank" in self.ranks and len(self.ranks["rank"]) else 1

    def has(self, name):
        return name in self._metrics

    def metric(self, name):
        """The column, or all-NaN when the run never logged it."""
        return self._metrics.get(name, np.full(len(self.steps), np.nan))

    def training_rows(self):
        """Rows of real steps (the final-evaluation row has no step time)."""
        return ~np.isnan(self.metric("perf/step_time"))

    def phase_times(self):
        """{phase: per-step seconds (max over ranks)} for every perf/<phase>_time column."""
        phases = ["eval", "rollout", "reward", "buffer", "train", "record", "weight_sync", "metrics", "checkpoint"]
        return {p: self.metric(f"perf/{p}_time") for p in phases if self.has(f"perf/{p}_time")}


def load_run(path):
    return Run(path)


def finite(x):
    x = np.asarray(x, dtype=float)
    return x[np.isfinite(x)]
