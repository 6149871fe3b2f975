#!/usr/bin/env bash
# A mixture-of-experts policy (8 experts, top-2, both layers sparse) through RL, on a
# reward it learns from (digit_reward.py):
#  * routing traces: every sample in rollouts.h5 carries (tokens − 1) x 2 layers x 2
#    expert ids, each in [0, 8); with fp32 rollout and training the trainer's routers
#    pick exactly the engine's experts at each rollout's first optimizer step
#    (train_step/0/routing_agreement = 1 every step);
#  * a bf16 rollout routes some tokens elsewhere (agreement < 1); Rollout Routing Replay
#    (train.routing_replay) lowers the train/rollout log-prob gap on the same rollouts
#    (step 0, which the initial weights generated in both runs); train.routing_replay_gap
#    measures the gap without replay inside the replaying run (at step 0 it equals the
#    other run's), above the replayed gap at every step;
#  * debug.train_only replays the recorded samples, traces included, bit for bit (every
#    train/ metric of a replayed run with routing replay equals the recorded run's);
#  * the traces are the same at np 2 colocated and np 4 split (same seeds, same tokens),
#    and step 0's (the initial weights) at np 1 too;
#  * postprocess/moe_routing.py prints and plots expert load and agreement from the files;
#  * one_step_off with an MoE policy resumes bit for bit (the pending batch keeps its traces);
#  * train.routing_replay and the router-loss coefficients on a dense model are refused;
#  * DeepSeekMoE (sigmoid router with its correction bias, groups, scaled weights, a shared
#    expert, a dense first layer; half-rotary attention) learns at np 4 split with expert
#    parallelism 2, its trainer routes exactly as its engine, the correction bias is never
#    trained, and 2 + 2 job steps equal 4 straight (with DeepSeek-V3's latent attention);
#  * DeepSeek-V3's shape (multi-head latent attention, its engine of 2 ranks attending over
#    the cached latent) learns, its engine's log-probs the trainer's to fp32 round-off.
# Usage: moe_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
compare="/usr/bin/python3 $root/tests/regression/compare_runs.py"
moe=(--set run.n_steps=4 --set model.n_experts=8 --set model.n_experts_per_tok=2 --set model.moe_intermediate_size=32
     --set model.init_std=0.2 --set train.moe_aux_loss_coef=0.01 --set reward.style=command
     --set "reward.command=/usr/bin/python3 $root/tests/regression/digit_reward.py")

run() {  # NP NAME [--set ...]
  local np=$1 name=$2; shift 2
  $mpirun -np "$np" "$slimpi" run inputs/smoke_rl.toml "${moe[@]}" --set run.dir="$out/$name" "$@" \
    >>"$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
}

run 4 fp32 --set eval.path=
run 4 bf16 --set eval.path= --set rollout.precision=bf16
run 4 bf16_replay --set eval.path= --set rollout.precision=bf16 --set train.routing_replay=true \
  --set train.routing_replay_gap=true
run 2 colocated --set eval.path= --set parallel.placement=colocate
run 1 single --set eval.path= --set parallel.placement=colocate
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]

def traces(run):
    with h5py.File(f"{out}/{run}/rollouts.h5") as f:
        s = f["samples"]
        return (s["tokens/values"][:], s["tokens/offsets"][:], s["routing/values"][:], s["routing/offsets"][:],
                s["group_index"][:], s["index"][:], s["step"][:])

tok, toff, rout, roff, group, index, step = traces("fp32")
assert len(roff) > 1
for i in range(len(roff) - 1):
    n_tokens = toff[i + 1] - toff[i]
    assert roff[i + 1] - roff[i] == (n_tokens - 1) * 2 * 2, (i, roff[i + 1] - roff[i], n_tokens)
assert rout.min() >= 0 and rout.max() < 8 and len(np.unique(rout)) > 4, np.unique(rout)

def metric(run, name):
    with h5py.File(f"{out}/{run}/metrics.h5") as f:
        return f["steps/" + name][:4]

# At a rollout's first optimizer step the trainer holds the weights the engine sampled
# with (its second step has moved them: train/routing_agreement averages both).
agree = metric("fp32", "train_step/0/routing_agreement")
assert np.all(agree == 1.0), agree
for l in (0, 1):
    assert np.all(metric("fp32", f"train_step/0/routing_agreement_by_layer/{l}") == 1.0)
assert np.all(metric("fp32", "train/routing_agreement") <= 1.0)
bf16 = metric("bf16", "train_step/0/routing_agreement")
assert np.all(bf16 < 1.0) and np.all(bf16 > 0.5), bf16
# Step 0: both runs trained on the same rollouts (the initial weights generated them).
gap, gap_replay = (metric(r, "train_step/0/train_rollout_logprob_abs_diff")[0] for r in ("bf16", "bf16_replay"))
assert gap_replay < gap, (gap_replay, gap)
# train.routing_replay_gap: the replaying run also measures each rollout's gap without
# replay (old log-probs without replay vs the engine's, over all its samples); on step
# 0's rollouts that is the gap of the run without replay (same weights, same forward).
unreplayed = metric("bf16_replay", "train/train_rollout_logprob_abs_diff_unreplayed")
whole_gap = metric("bf16", "train/train_rollout_logprob_abs_diff")[0]
assert abs(unreplayed[0] - whole_gap) <= 1e-6 + 1e-4 * whole_gap, (unreplayed[0], whole_gap)
replayed = metric("bf16_replay", "train/train_rollout_logprob_abs_diff")
assert np.all(unreplayed > replayed), (unreplayed, replayed)
print(f"moe_runs: agreement fp32 1.0, bf16 rollout {bf16.mean():.4f}; train/rollout log-prob gap {gap:.4g} -> "
      f"{gap_replay:.4g} with routing replay")

# np 2 colocated and np 4 split: same samples (in order of group and index), same traces.
def by_key(run):
    tok, toff, rout, roff, group, index, step = traces(run)
    return {(int(step[i]), int(group[i]), int(index[i])): (tok[toff[i]:toff[i + 1]].tolist(),
                                                           rout[roff[i]:roff[i + 1]].tolist())
            for i in range(len(group))}
a, b, c = by_key("fp32"), by_key("colocated"), by_key("single")
assert a.keys() == b.keys() and all(a[k] == b[k] for k in a), "traces differ between np 4 split and np 2 colocate"
# np 1 trains on one rank: its weights after step 0 differ from two trainers' by the
# order of the gradient sums (round-off), so its later samples may differ; step 0's
# rollouts (the initial weights) must not.
first = {k: v for k, v in a.items() if k[0] == 0}
assert first and all(c.get(k) == v for k, v in first.items()), "step 0 traces differ between np 4 split and np 1"
print(f"moe_runs: {len(a)} samples with identical tokens and routing traces at np 2 colocated and np 4 split, "
      f"and step 0's {len(first)} at np 1 too")
PY

echo "== postprocess/moe_routing.py: expert load and agreement from the files alone"
/usr/bin/python3 postprocess/moe_routing.py "$out/bf16" --out "$out/moe.png" | tee "$out/moe.txt"
grep -q "8 experts, top-2, MoE layers \[0, 1\]; 4 steps of routing traces" "$out/moe.txt"
grep -q "^layer 1: load imbalance" "$out/moe.txt"
grep -q "^routing agreement at each rollout's first optimizer step: 0: 0\.9" "$out/moe.txt"
[ "$(head -c 8 "$out/moe.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || { echo "FAIL: not a PNG"; exit 1; }
if /usr/bin/python3 postprocess/moe_routing.py "$out/dense_run_missing" >/dev/null 2>&1; then echo "FAIL: a non-run"; exit 1; fi

echo "== debug.train_only replays the recorded traces"
run 4 replay_recorded --set train.routing_replay=true
run 4 replay_again --set train.routing_replay=true --set debug.train_only=true \
  --set debug.load_rollouts="$out/replay_recorded/rollouts.h5"
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
with h5py.File(f"{out}/replay_recorded/metrics.h5") as a, h5py.File(f"{out}/replay_again/metrics.h5") as b:
    train = [c for c in a["steps"].attrs["columns"].decode().split() if c.startswith("train/")]
    assert "train/routing_agreement" in train and "train/moe_aux_loss" in train, train
    for c in train:
        assert np.array_equal(a["steps/" + c][:], b["steps/" + c][:], equal_nan=True), c
print(f"moe_runs: debug.train_only with routing replay equals the recorded run on {len(train)} train/ metrics")
PY

echo "== one_step_off with an MoE policy: 2 + 2 job steps = 4 straight"
run 4 async --set train.async=one_step_off
run 4 async_chunked --set train.async=one_step_off --set run.job_steps=2
run 4 async_chunked --set train.async=one_step_off --set run.job_steps=2
$compare "$out/async" "$out/async_chunked"

echo "== refused on a dense model"
for key in train.routing_replay=true train.moe_aux_loss_coef=0.1; do
  if $mpirun -np 2 "$slimpi" run inputs/smoke_rl.toml --set "$key" --set run.dir="$out/dense" >"$out/dense.log" 2>&1; then
    cat "$out/dense.log"; echo "FAIL: $key on a dense model ran"; exit 1
  fi
  grep -q "model.n_experts = 0 (default)" "$out/dense.log" || { cat "$out/dense.log"; exit 1; }
done
echo "== DeepSeekMoE (GLM-4.5's shape): learns at np 4 split with expert parallelism 2; the trainer routes as the engine"
ds=(--set model.moe_router=sigmoid --set model.moe_router_bias=true --set model.moe_n_group=4
    --set model.moe_topk_group=2 --set model.moe_routed_scaling_factor=2.5 --set model.n_shared_experts=1
    --set model.first_k_dense_replace=1 --set model.partial_rotary_factor=0.5 --set parallel.trainer_ranks=2
    --set parallel.expert_parallel=2 --set eval.path=)
run 4 deepseek "${ds[@]}" --set run.n_steps=40 --set train.lr=3e-3 --set rollout.rollout_batch_size=16 \
  --set rollout.n_samples_per_prompt=8 --set train.global_batch_size=128
# DeepSeek-V3's attention too (latent attention, an engine of 2 ranks over the cached latent).
mla=(--set model.kv_lora_rank=16 --set model.q_lora_rank=24 --set model.qk_nope_head_dim=8
     --set model.qk_rope_head_dim=4 --set model.v_head_dim=6 --set model.rope_interleave=true
     --set model.partial_rotary_factor=1 --set rollout.tensor_parallel=2)
run 4 deepseek_straight "${ds[@]}" "${mla[@]}"
run 4 deepseek_chunked "${ds[@]}" "${mla[@]}" --set run.job_steps=2
run 4 deepseek_chunked "${ds[@]}" "${mla[@]}" --set run.job_steps=2
$compare "$out/deepseek_straight" "$out/deepseek_chunked"
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
with h5py.File(f"{out}/deepseek/metrics.h5") as f:
    r = f["steps/rollout/raw_reward"][:40]
    agree = f["steps/train_step/0/routing_agreement"][:40]
with h5py.File(f"{out}/deepseek/rollouts.h5") as f:
    s = f["samples"]
    toff, rout, roff = s["tokens/offsets"][:], s["routing/values"][:], s["routing/offsets"][:]
    # layer 0 is dense (first_k_dense_replace = 1): one MoE layer, top-2
    assert all(roff[i + 1] - roff[i] == (toff[i + 1] - toff[i] - 1) * 2 for i in range(len(roff) - 1))
    assert rout.min() >= 0 and rout.max() < 8
with h5py.File(f"{out}/deepseek/trainer_state.h5") as f:  # the correction bias is never trained
    assert not f["model/model.layers.1.mlp.gate.e_score_correction_bias"][:].any()
    assert "model/model.layers.1.mlp.shared_experts.up_proj.weight" in f
first, last = r[:5].mean(), r[-5:].mean()
print(f"moe_runs: DeepSeekMoE reward {first:.4f} -> {last:.4f}; routing agreement at each rollout's first step "
      f"{agree.min():.4f} (min)")
assert last > 0.1 and last > 5 * first, "the DeepSeekMoE policy did not learn"
assert np.all(agree == 1.0), agree
PY
echo "== DeepSeek-V3's shape (latent attention + DeepSeekMoE): learns at np 4 split, EP 2, an engine of 2 ranks"
run 4 deepseek_mla "${ds[@]}" "${mla[@]}" --set run.n_steps=40 --set train.lr=3e-3 --set rollout.rollout_batch_size=16 \
  --set rollout.n_samples_per_prompt=8 --set train.global_batch_size=128
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
with h5py.File(f"{out}/deepseek_mla/metrics.h5") as f:
    r = f["steps/rollout/raw_reward"][:40]
    gap = f["steps/train_step/0/train_rollout_logprob_abs_diff"][:40]
first, last = r[:5].mean(), r[-5:].mean()
# The engine attends over the cached latent (absorbed), the trainer in the expanded form:
# the same numbers to fp32 round-off.
print(f"moe_runs: latent attention + DeepSeekMoE reward {first:.4f} -> {last:.4f}; train/rollout log-prob gap at "
      f"each rollout's first step {np.nanmax(gap):.3g} (max)")
assert last > 0.1 and last > 5 * first, "the latent-attention policy did not learn"
assert np.nanmax(gap) < 1e-4, gap
PY
echo "moe_runs: OK"
