#!/usr/bin/python3
"""Overlays the curves of two or more slimpi runs: reward, held-out pass@1, entropy,
response length and step time, and prints the last evaluation of each.

Usage: compare_runs.py RUN_A RUN_B [RUN ...] [--out FILE.png]   (default: compare.png)
Reads each RUN/metrics.h5 only.
"""
import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from slimpi_h5 import load_run  # noqa: E402

PANELS = [("rollout/raw_reward", "rollout reward"), ("eval/pass@1", "held-out greedy pass@1"),
          ("train/entropy_loss", "entropy (nats/token)"), ("rollout/response_len/mean", "response length"),
          ("perf/step_time", "step time (s)"), ("train/ppo_kl", "ppo_kl")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", default="compare.png")
    a = ap.parse_args()
    if len(a.runs) < 2:
        ap.error("give at least two run directories")
    runs = [load_run(r) for r in a.runs]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (name, title) in zip(axes.flat, PANELS):
        for run in runs:
            y = run.metric(name)
            ok = np.isfinite(y)
            if ok.any():
                ax.plot(run.steps[ok], y[ok], label=run.path, marker="o" if ok.sum() < 30 else None, ms=3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out, dpi=90)
    plt.close(fig)
    for run in runs:
        p = run.metric("eval/pass@1")
        ok = np.isfinite(p)
        last = f"eval/pass@1 {p[ok][-1]:.3f} at step {run.steps[ok][-1]}" if ok.any() else "no eval"
        print(f"{run.path}: {len(run.steps)} rows, {last}")
    print(f"compare_runs: {a.out}")


if __name__ == "__main__":
    main()
