#!/usr/bin/python3
"""Expert load and routing agreement of a mixture-of-experts run, from its HDF5 files.

Usage: moe_routing.py RUN [--out FILE.png]   (default: RUN/moe_routing.png)

Expert load: rollouts.h5's routing traces (the experts every computed token ran in every
MoE layer, rows of (tokens - 1) x moe layers x k) counted per step, MoE layer and
expert; the shape comes from the run's deck ([model] n_layers, n_experts,
n_experts_per_tok, moe_layer_freq). Printed per layer: each step's load imbalance (the
busiest expert's tokens / the mean). Plotted: one heat map per MoE layer (steps x
experts, share of the step's token slots), and the routing agreement between engine
and trainer from metrics.h5 (train_step/0/routing_agreement: at each rollout's first
optimizer step; per layer from train_step/0/routing_agreement_by_layer/<l>).
"""
import argparse
import os
import sys
import tomllib

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slimpi_h5 import load_run  # noqa: E402


def moe_shape(deck_text):
    deck = tomllib.loads(deck_text)
    model = deck.get("model", {})
    n_layers, experts = int(model.get("n_layers", 0)), int(model.get("n_experts", 0))
    k, freq = int(model.get("n_experts_per_tok", 2)), int(model.get("moe_layer_freq", 1))
    layers = [l for l in range(n_layers) if experts > 0 and (l + 1) % freq == 0]
    return layers, experts, k


def expert_load(path, layers, experts, k):
    """{step: int64 [moe layers, experts]} token slots per expert."""
    with h5py.File(path, "r") as f:
        s = f["samples"]
        if "routing" not in s:
            raise SystemExit(f"{path}: no routing traces (a run from before they were recorded)")
        step, values, offsets = s["step"][:], s["routing/values"][:], s["routing/offsets"][:]
    load = {}
    for st in np.unique(step):
        rows = np.nonzero(step == st)[0]
        ids = np.concatenate([values[offsets[i]:offsets[i + 1]] for i in rows]).reshape(-1, len(layers), k)
        counts = np.zeros((len(layers), experts), dtype=np.int64)
        for j in range(len(layers)):
            counts[j] = np.bincount(ids[:, j, :].ravel(), minlength=experts)[:experts]
        load[int(st)] = counts
    return load


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--out")
    args = ap.parse_args()
    run = load_run(args.run)
    layers, experts, k = moe_shape(run.deck)
    if not layers:
        raise SystemExit(f"{args.run}: not a mixture-of-experts run (model.n_experts = 0 in its deck)")
    load = expert_load(os.path.join(run.path, "rollouts.h5"), layers, experts, k)
    steps = sorted(load)
    print(f"{run.name}: {experts} experts, top-{k}, MoE layers {layers}; {len(steps)} steps of routing traces")
    for j, l in enumerate(layers):
        imbalance = [load[s][j].max() / max(load[s][j].mean(), 1e-9) for s in steps]
        print(f"layer {l}: load imbalance (max / mean tokens per expert) by step: "
              + ", ".join(f"{s}: {x:.2f}" for s, x in zip(steps, imbalance)))
    agree = run.metric("train_step/0/routing_agreement")
    if np.isfinite(agree).any():
        print("routing agreement at each rollout's first optimizer step: "
              + ", ".join(f"{int(s)}: {a:.4f}" for s, a in zip(run.steps, agree) if np.isfinite(a)))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(layers) + 1, figsize=(4.5 * (len(layers) + 1), 4), squeeze=False)
    for j, l in enumerate(layers):
        share = np.array([load[s][j] / max(load[s][j].sum(), 1) for s in steps])  # [steps, experts]
        ax = axes[0][j]
        im = ax.imshow(share.T, aspect="auto", origin="lower", cmap="viridis",
                       extent=(steps[0] - 0.5, steps[-1] + 0.5, -0.5, experts - 0.5))
        ax.set_title(f"layer {l}: share of token slots")
        ax.set_xlabel("step")
        ax.set_ylabel("expert")
        fig.colorbar(im, ax=ax)
    ax = axes[0][-1]
    ax.plot(run.steps, agree, label="all MoE layers", color="black")
    for l in layers:
        ax.plot(run.steps, run.metric(f"train_step/0/routing_agreement_by_layer/{l}"), label=f"layer {l}", alpha=0.7)
    ax.set_title("routing agreement (engine vs trainer)")
    ax.set_xlabel("step")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = args.out or os.path.join(run.path, "moe_routing.png")
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
