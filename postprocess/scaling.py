#!/usr/bin/python3
"""The table of a scaling study: the same deck run at several rank counts or layouts
(each in its own run directory, e.g. by jobs/scaling.sh), one row per run with the
median step time and its components (median over steps after the first of each
phase's time, max over ranks), the speed-up and parallel efficiency against the first
run (fewest ranks, then smallest tensor-parallel size).

Usage: scaling.py RUN_DIR [RUN_DIR ...] [--png FILE.png]
Reads each RUN_DIR/metrics.h5 (the rank count is that of its /ranks rows) and the
tensor-parallel size from RUN_DIR/deck.resolved.toml (1 when it is absent).
"""
import argparse
import os
import tomllib

import numpy as np

from slimpi_h5 import load_run


def median_after_first(x):
    x = np.asarray(x, dtype=float)[1:]
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else float("nan")


def tensor_parallel(run_dir):
    path = os.path.join(run_dir, "deck.resolved.toml")
    if not os.path.exists(path):
        return 1
    with open(path, "rb") as f:
        return int(tomllib.load(f).get("parallel", {}).get("tensor_parallel", 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--png")
    a = ap.parse_args()
    runs = sorted((load_run(r) for r in a.runs), key=lambda r: (r.world_size, tensor_parallel(r.path)))
    phases = sorted({p for r in runs for p in r.phase_times()})
    base = None
    header = f"{'ranks':>5} {'tp':>3} {'step_s':>8} {'speedup':>8} {'effic':>6} " + " ".join(f"{p:>11}" for p in phases)
    print(header)
    table = []
    for run in runs:
        step = median_after_first(run.metric("perf/step_time"))
        comp = {p: median_after_first(t) for p, t in run.phase_times().items()}
        if base is None:
            base = (run.world_size, step)
        speedup = base[1] / step
        eff = speedup * base[0] / run.world_size
        tp = tensor_parallel(run.path)
        table.append((run.world_size, tp, step, comp))
        print(f"{run.world_size:>5} {tp:>3} {step:>8.4f} {speedup:>8.2f} {eff:>6.2f} "
              + " ".join(f"{comp.get(p, float('nan')):>11.4f}" for p in phases) + f"   {run.path}")
    if a.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.5))
        x = np.arange(len(table))
        bottom = np.zeros(len(table))
        for p in phases:
            h = np.nan_to_num([c.get(p, np.nan) for _, _, _, c in table])
            ax.bar(x, h, bottom=bottom, label=p)
            bottom += h
        ax.plot(x, [s for _, _, s, _ in table], "ko-", label="step time")
        ax.set_xticks(x, [f"{n}" if tp == 1 else f"{n} (TP {tp})" for n, tp, _, _ in table])
        ax.set_xlabel("ranks (tensor-parallel size)")
        ax.set_ylabel("seconds per step (median)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.png, dpi=90)
        print(f"scaling: {a.png}")


if __name__ == "__main__":
    main()
