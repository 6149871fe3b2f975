#!/usr/bin/python3
"""Step-time split of RL runs from their metrics.h5 (Debian's python3-h5py, numpy).

Usage: perf/step_split.py RUN_DIR [RUN_DIR ...]
Prints, per run, the median over steps of each phase's time (slowest rank), the step
time, and perf/trainer_idle_fraction: the share of trainer rank 0's step spent
neither training nor syncing weights.
"""
import sys

import h5py
import numpy as np

PHASES = ["eval", "rollout", "reward", "buffer", "train", "record", "weight_sync", "metrics"]


def main() -> None:
    rows = []
    for run in sys.argv[1:]:
        with h5py.File(f"{run}/metrics.h5") as f:
            n = len(f["steps/step"]) - 1  # the last row is the final evaluation
            def med(name):
                key = f"steps/perf/{name}"
                return float(np.nanmedian(f[key][:n])) if key in f else float("nan")
            rows.append((run, [med(f"{p}_time") for p in PHASES], med("step_time"), med("trainer_idle_fraction")))
    print(f"{'run':<36}" + "".join(f"{p:>12}" for p in PHASES) + f"{'step':>10}{'idle':>8}")
    for run, phases, step, idle in rows:
        print(f"{run[-36:]:<36}" + "".join(f"{1e3 * t:>10.1f}ms" for t in phases) + f"{1e3 * step:>8.1f}ms{idle:>8.2f}")


if __name__ == "__main__":
    main()
