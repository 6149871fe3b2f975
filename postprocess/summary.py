#!/usr/bin/python3
"""A text summary of a slimpi run: what ran, how learning went, where the time went.

Usage: summary.py RUN_DIR [--every N]
Reads RUN_DIR/metrics.h5 (and the row count of rollouts.h5) only.
"""
import argparse

import numpy as np

from slimpi_h5 import finite, load_run

ROW_METRICS = [("rollout/raw_reward", "reward", "{:.3f}"), ("eval/pass@1", "eval_p@1", "{:.3f}"),
               ("rollout/response_len/mean", "resp_len", "{:.1f}"), ("train/entropy_loss", "entropy", "{:.3f}"),
               ("train/ppo_kl", "ppo_kl", "{:.2e}"), ("train/loss", "loss", "{:.4f}"),
               ("perf/step_time", "step_s", "{:.3f}")]


def fmt(value, spec):
    return "-" if not np.isfinite(value) else spec.format(value)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--every", type=int, default=0, help="print every Nth step (default: about 20 rows)")
    a = ap.parse_args()
    run = load_run(a.run)
    n = len(run.steps)
    print(f"run {run.path}: {n} metric rows (steps {run.steps.min() if n else '-'}..{run.steps.max() if n else '-'}), "
          f"{run.world_size} rank(s), {run.n_samples} samples in rollouts.h5")
    if n == 0:
        return
    cols = [(m, label, spec) for m, label, spec in ROW_METRICS if run.has(m)]
    every = a.every or max(1, n // 20)
    print()
    print(f"{'step':>6} " + " ".join(f"{label:>9}" for _, label, _ in cols))
    for i in range(n):
        evaluated = run.has("eval/pass@1") and np.isfinite(run.metric("eval/pass@1")[i])
        if i % every and i != n - 1 and not evaluated:
            continue
        print(f"{run.steps[i]:>6} " + " ".join(f"{fmt(run.metric(m)[i], spec):>9}" for m, _, spec in cols))
    evals = [(int(s), v) for s, v in zip(run.steps, run.metric("eval/pass@1")) if np.isfinite(v)]
    if evals:
        print(f"\neval/pass@1: {evals[0][1]:.3f} at step {evals[0][0]} -> {evals[-1][1]:.3f} at step {evals[-1][0]} "
              f"({100 * (evals[-1][1] - evals[0][1]):+.1f} points)")
    step = finite(run.metric("perf/step_time"))
    if len(step):
        print(f"\nstep time: mean {step.mean():.3f} s, median {np.median(step):.3f} s, total {step.sum():.1f} s "
              f"over {len(step)} steps")
    if "rank" in run.ranks:
        phases = [k for k in sorted(run.ranks) if k.startswith("time/") and k != "time/step_s"]
        print("mean seconds per step of each rank's phases (waits included: a trainer's buffer phase is its wait "
              "for rollouts)")
        print("  rank " + " ".join(f"{p[5:-2]:>11}" for p in phases))
        for r in range(run.world_size):
            mine = run.ranks["rank"] == r
            print(f"  {r:>4} " + " ".join(f"{np.nanmean(run.ranks[p][mine]):>11.4f}" for p in phases))
    idle = finite(run.metric("perf/trainer_idle_fraction"))
    if len(idle):
        print(f"trainer idle fraction: mean {idle.mean():.3f}")
    tps = finite(run.metric("perf/rollout_tokens_per_s"))
    if len(tps):
        print(f"rollout tokens/s: mean {tps.mean():.0f}")


if __name__ == "__main__":
    main()
