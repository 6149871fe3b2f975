#!/usr/bin/env bash
# An MTP draft trained online against a frozen one, on the quickstart task: the
# quickstart's SFT with one MTP depth (model.mtp_num_layers = 1, trained beside the
# policy from its first step), then three GRPO runs from it on the quickstart deck
# (np 4 split), each STEPS steps: speculative decoding (3-token chains) with the draft
# trained online (train.mtp_loss_coef 0.2), with the draft frozen at its SFT weights
# (train.mtp_loss_coef 0), and without speculation. Reported per 50 steps: the draft's
# acceptance (rollout/spec_accept_rate, tokens per verify pass), the rollout phase's
# time and its long tail (perf/rollout_tail_time: from the return of the group that
# completed 90% of a round's groups to the last one's), and held-out greedy pass@1; the
# acceptance curves go to OUT/accept.png.
# Usage: perf/mtp_draft_online.sh [STEPS] [OUT]   (default 300, runs/mtp_draft_online)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${1:-300}
out=${2:-runs/mtp_draft_online}
cd "$root"
mkdir -p "$out"
jobs/run_local.sh 4 inputs/quickstart_sft.toml --set run.seed=1 --set run.dir="$out/sft" --set checkpoint.resume=never \
  --set model.mtp_num_layers=1 >"$out/sft.log" 2>&1 || { tail -20 "$out/sft.log"; exit 1; }
grpo=(inputs/quickstart_grpo.toml --set run.seed=1 --set model.init_from="$out/sft/trainer_state.h5"
      --set checkpoint.resume=never --set model.mtp_num_layers=1 --set run.n_steps="$steps" --set eval.interval=50)
spec=(--set rollout.speculative=mtp --set rollout.spec_num_steps=3)
jobs/run_local.sh 4 "${grpo[@]}" "${spec[@]}" --set run.dir="$out/online" >"$out/online.log" 2>&1 \
  || { tail -20 "$out/online.log"; exit 1; }
jobs/run_local.sh 4 "${grpo[@]}" "${spec[@]}" --set train.mtp_loss_coef=0 --set run.dir="$out/frozen" \
  >"$out/frozen.log" 2>&1 || { tail -20 "$out/frozen.log"; exit 1; }
jobs/run_local.sh 4 "${grpo[@]}" --set run.dir="$out/none" >"$out/none.log" 2>&1 || { tail -20 "$out/none.log"; exit 1; }
/usr/bin/python3 - "$out" "$steps" <<'PY'
import sys
import h5py
import numpy as np
out, steps = sys.argv[1], int(sys.argv[2])
runs = {}
for name in ("online", "frozen", "none"):
    with h5py.File(f"{out}/{name}/metrics.h5") as f:
        s = f["steps"]
        runs[name] = {k: s[k][:] for k in ("step", "rollout/spec_accept_rate", "rollout/spec_accept_length",
                                           "perf/rollout_time", "perf/rollout_tail_time", "eval/pass@1", "train/mtp_loss")
                       if k in s}
print("| steps | accept rate online | frozen | tokens per verify pass online | frozen | rollout s/step online | frozen | none "
      "| long tail s/step online | frozen | none | pass@1 online | frozen | none |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for lo in range(0, steps, 50):
    row = []
    def window(run, key):
        st = runs[run]["step"]
        sel = (st >= lo) & (st < lo + 50)
        v = runs[run].get(key)
        return float(np.nanmean(v[sel])) if v is not None and sel.any() else float("nan")
    def at(run, key, step):
        st, v = runs[run]["step"], runs[run].get(key)
        i = np.where(st == step)[0]
        return float(v[i[0]]) if v is not None and len(i) else float("nan")
    print(f"| {lo}-{lo + 49} | {window('online', 'rollout/spec_accept_rate'):.3f} | {window('frozen', 'rollout/spec_accept_rate'):.3f} "
          f"| {window('online', 'rollout/spec_accept_length'):.2f} | {window('frozen', 'rollout/spec_accept_length'):.2f} "
          f"| {window('online', 'perf/rollout_time'):.3f} | {window('frozen', 'perf/rollout_time'):.3f} | {window('none', 'perf/rollout_time'):.3f} "
          f"| {window('online', 'perf/rollout_tail_time'):.3f} | {window('frozen', 'perf/rollout_tail_time'):.3f} "
          f"| {window('none', 'perf/rollout_tail_time'):.3f} "
          f"| {100 * at('online', 'eval/pass@1', lo + 50):.1f} | {100 * at('frozen', 'eval/pass@1', lo + 50):.1f} | {100 * at('none', 'eval/pass@1', lo + 50):.1f} |")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in ("online", "frozen"):
        st, v = runs[name]["step"], runs[name]["rollout/spec_accept_length"]
        ok = ~np.isnan(v)
        k = 10
        smooth = np.convolve(v[ok], np.ones(k) / k, mode="valid")
        ax.plot(st[ok][k - 1:], smooth, label=f"draft {name} (mean of {k} steps)")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("tokens per verify pass (3-token chains)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/accept.png", dpi=120)
    print(f"mtp_draft_online: {out}/accept.png")
except ImportError:
    print("mtp_draft_online: no matplotlib for /usr/bin/python3: no plot")
PY
