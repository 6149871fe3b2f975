#!/usr/bin/env bash
# Rollout Routing Replay on the quickstart task (the MoE issue's measurement): the
# quickstart model with 8 experts of width 344, top-2, in every layer (~4.4M parameters)
# is SFT'd to the quickstart's 20% pass@1, then trained by GRPO for STEPS steps with a
# bf16 rollout and fp32 training, once without and once with train.routing_replay, from
# the same SFT state; the dense quickstart model does the same GRPO stage with a bf16
# rollout as the reference. Reported per run (means over the steps): routing agreement
# at each rollout's first optimizer step (before replay), the train/rollout log-prob gap
# (train_rollout_logprob_abs_diff), ppo_kl and the final reward; for the replaying run
# also the gap it would have without replay, measured in the same run on the same
# rollouts under the weights that start each rollout (train.routing_replay_gap).
# Usage: perf/moe_replay.sh [STEPS]   (default 100; runs go to runs/moe_replay/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${1:-100}
cd "$root"
out=runs/moe_replay
mkdir -p "$out"
moe=(--set model.n_experts=8 --set model.n_experts_per_tok=2 --set model.moe_intermediate_size=344)
grpo=(--set run.n_steps="$steps" --set eval.path= --set rollout.precision=bf16 --set checkpoint.resume=never
      --set checkpoint.interval=0)
if [ ! -f "$out/sft_moe/trainer_state.h5" ]; then
  jobs/run_local.sh 4 inputs/quickstart_sft.toml "${moe[@]}" --set run.dir="$out/sft_moe" --set checkpoint.resume=never \
    >"$out/sft_moe.log" 2>&1 || { tail -20 "$out/sft_moe.log"; exit 1; }
fi
if [ ! -f "$out/sft_dense/trainer_state.h5" ]; then
  jobs/run_local.sh 4 inputs/quickstart_sft.toml --set run.dir="$out/sft_dense" --set checkpoint.resume=never \
    >"$out/sft_dense.log" 2>&1 || { tail -20 "$out/sft_dense.log"; exit 1; }
fi
jobs/run_local.sh 4 inputs/quickstart_grpo.toml "${moe[@]}" "${grpo[@]}" --set run.dir="$out/moe" \
  --set model.init_from="$out/sft_moe/trainer_state.h5" >"$out/moe.log" 2>&1 || { tail -20 "$out/moe.log"; exit 1; }
jobs/run_local.sh 4 inputs/quickstart_grpo.toml "${moe[@]}" "${grpo[@]}" --set run.dir="$out/moe_replay" \
  --set model.init_from="$out/sft_moe/trainer_state.h5" --set train.routing_replay=true \
  --set train.routing_replay_gap=true \
  >"$out/moe_replay.log" 2>&1 || { tail -20 "$out/moe_replay.log"; exit 1; }
jobs/run_local.sh 4 inputs/quickstart_grpo.toml "${grpo[@]}" --set run.dir="$out/dense" \
  --set model.init_from="$out/sft_dense/trainer_state.h5" >"$out/dense.log" 2>&1 || { tail -20 "$out/dense.log"; exit 1; }
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
print(f"{'run':12s} {'agreement':>10s} {'|train-rollout| logp':>21s} {'ppo_kl':>10s} {'reward first->last 10':>22s}")
unreplayed = None
for run in ("dense", "moe", "moe_replay"):
    with h5py.File(f"{out}/{run}/metrics.h5") as f:
        cols = f["steps"].attrs["columns"].decode().split()
        get = lambda c: f["steps/" + c][:] if c in cols else np.full(len(f["steps/step"]), np.nan)
        a = get("train_step/0/routing_agreement")
        agree = np.mean(a[np.isfinite(a)]) if np.isfinite(a).any() else float("nan")  # none for the dense model
        gap = np.nanmean(get("train/train_rollout_logprob_abs_diff"))
        kl = np.nanmean(get("train/ppo_kl"))
        r = get("rollout/raw_reward")
        r = r[np.isfinite(r)]
        print(f"{run:12s} {agree:10.4f} {gap:21.5f} {kl:10.2e} {np.mean(r[:10]):10.3f} -> {np.mean(r[-10:]):.3f}")
        if run == "moe_replay":
            unreplayed = (np.nanmean(get("train/train_rollout_logprob_abs_diff_unreplayed")),
                          np.nanmean(get("train/train_rollout_logprob_abs_diff")))
print(f"moe_replay, same run and rollouts (weights that start each rollout): gap {unreplayed[0]:.5f} without replay, "
      f"{unreplayed[1]:.5f} with")
PY
