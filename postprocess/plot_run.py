#!/usr/bin/python3
"""One PNG of a slimpi run: rewards and eval curves, response length, log-prob
mismatch (trainer vs rollout), KL and entropy, and the step-time breakdown.

Usage: plot_run.py RUN_DIR [--out FILE.png]     (default: RUN_DIR/plot.png)
Reads RUN_DIR/metrics.h5 only (matplotlib's Agg backend: no display needed).
"""
import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from slimpi_h5 import load_run  # noqa: E402


def curve(ax, run, name, label=None, **kw):
    """Plots a metric against the step, skipping NaN rows; returns whether anything was drawn."""
    y = run.metric(name)
    ok = np.isfinite(y)
    if not ok.any():
        return False
    ax.plot(run.steps[ok], y[ok], label=label or name, marker="o" if ok.sum() < 30 else None, ms=3, **kw)
    return True


def panel(ax, title, drawn):
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    if drawn:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes)


# (row, column, title, metrics) of the panels that are plain curves.
CURVE_PANELS = [(0, 0, "reward and held-out eval", ("rollout/raw_reward", "eval/pass@1", "eval/mean_reward")),
                (0, 1, "response length (tokens)", ("rollout/response_len/mean", "rollout/response_len/max")),
                (1, 0, "KL and clipping", ("train/ppo_kl", "train/kl_loss", "train/pg_clipfrac")),
                (1, 1, "entropy (nats/token) and loss", ("train/entropy_loss", "train/loss"))]


def plot_run(run, out):
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for row, col, title, metrics in CURVE_PANELS:
        drawn = [curve(axes[row, col], run, m) for m in metrics]
        panel(axes[row, col], title, any(drawn))
    ax = axes[0, 2]
    drawn = curve(ax, run, "train/train_rollout_logprob_abs_diff", "mean |logp_train - logp_rollout|")
    if drawn:
        ax.set_yscale("symlog", linthresh=1e-8)
    panel(ax, "log-prob mismatch", drawn)
    ax = axes[1, 2]
    drawn = False
    if "rank" in run.ranks:  # rank 0's own phase times: they add up to its step time
        mine = run.ranks["rank"] == 0
        steps = run.ranks["step"][mine]
        bottom = np.zeros(mine.sum())
        for k in sorted(run.ranks):
            if not k.startswith("time/") or k == "time/step_s":
                continue
            t = np.nan_to_num(run.ranks[k][mine])
            if t.any():
                ax.fill_between(steps, bottom, bottom + t, step="mid", label=k[5:-2], alpha=0.8)
                bottom += t
                drawn = True
    curve(ax, run, "perf/rollout_time", "rollout (max over ranks)", color="k", lw=0.6, ls=":")
    panel(ax, "rank 0's step by phase (s)", drawn)
    fig.suptitle(f"slimpi run {run.path}", fontsize=12)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--out")
    a = ap.parse_args()
    run = load_run(a.run)
    out = a.out or os.path.join(run.path, "plot.png")
    plot_run(run, out)
    print(f"plot_run: {out}")


if __name__ == "__main__":
    main()
