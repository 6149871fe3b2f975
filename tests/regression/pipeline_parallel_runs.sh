#!/usr/bin/env bash
# Pipeline parallelism (parallel.pipeline_parallel) end to end, on the smoke policy with 4
# layers and a reward that varies from the first step:
#  * np 4 split with one_step_off (2 trainer ranks: one pipeline of 2 stages; the engines
#    get the stages gathered every step), np 2 colocated (a KL loss and on-policy
#    distillation: the reference model and a trainer-side teacher in stages too) and np 4
#    colocated (PP 2 x DP 2, PP 4, TP 2 x PP 2, CP 2 x PP 2, uneven stages 3 + 1 with tied
#    embeddings and the distributed optimizer) generate the tokens of the same run with
#    whole models on every trainer rank and log the same metrics to fp32 round-off;
#  * job steps of a pipelined run (2 + 2) equal its straight run bit for bit;
#  * a checkpoint is layout-free: a run saved at PP 2 x DP 2 resumes at PP 1 (DP 4), and
#    one saved at TP 2 x CP 2 resumes at PP 2 x DP 2, each continuing as the straight run
#    does;
#  * SFT with evaluation (the stages gathered into the evaluation's engine) matches;
#  * a DeepSeek-V3-shaped model (latent attention, DeepSeekMoE with a dense first layer,
#    routing replay, load-balancing and z-losses, an MoE MTP depth trained) at PP 2 x DP 2
#    with expert parallelism 2 generates the tokens and routing of its PP 1 run; so does
#    a step from its Hugging Face export (each stage loading its layers, the KL
#    reference's too);
#  * PPO with its critic in stages, in job steps 2 + 2, matches PP 1;
#  * exact on-policy at PP 2 trains on the engine's bits (train/rollout abs_diff 0);
#  * impossible layouts and what is not pipelined yet are refused with their numbers.
# Usage: pipeline_parallel_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
# One optimizer step per rollout (see tensor_parallel_runs.sh); 4 layers split over 2 or 4
# stages; n_kv_heads 4 splits over TP 2.
base=(--set run.n_steps=4 --set model.qk_norm=true --set model.init_std=0.2 --set train.global_batch_size=32
      --set model.n_layers=4 --set model.n_kv_heads=4 --set train.n_micro_batches=4 --set reward.style=command
      --set "reward.command=/usr/bin/python3 $root/tests/regression/ascii_reward.py" --set eval.path=)
args=(run inputs/smoke_rl.toml "${base[@]}")  # run NP NAME [--set ...] (run_helpers.sh)

echo "== np 4 split, 2 trainer ranks, one_step_off: pipeline_parallel 2 vs 1"
run 4 async_pp1 --set train.async=one_step_off
run 4 async_pp2 --set train.async=one_step_off --set parallel.pipeline_parallel=2
grep -q "pipeline parallelism: 1 pipeline of 2 stages (1F1B over the micro-batches); this rank is stage 0: layers 0..1, the embedding" \
  "$out/async_pp2.log"
grep -q "weight sync: broadcast" "$out/async_pp2.log"
close async_pp1 async_pp2

echo "== colocated: np 4, and np 2 with a KL loss and on-policy distillation (the reference model and a teacher in the stages)"
co=(--set parallel.placement=colocate)
run 4 co4_pp1 "${co[@]}"
run 4 co4_pp2 "${co[@]}" --set parallel.pipeline_parallel=2
close co4_pp1 co4_pp2
kl=(--set train.use_kl_loss=true --set train.kl_loss_coef=0.01)
opd=(--set train.opd_kl_coef=0.5 --set train.opd_topk_loss_coef=0.5 --set teacher.top_k=4
     --set "teacher.path=$out/co4_pp1/ckpt/step_00000004")  # (the PP 1 run's last checkpoint)
run 2 co2_pp1 "${co[@]}" "${kl[@]}" "${opd[@]}"
run 2 co2_pp2 "${co[@]}" "${kl[@]}" "${opd[@]}" --set parallel.pipeline_parallel=2
grep -q "teacher: .* in 2 pipeline stages (this rank's: layers 0..1)" "$out/co2_pp2.log"
/usr/bin/python3 tests/regression/same_tokens.py "$tag" "$out/co2_pp1" "$out/co2_pp2" tokens/values tokens/offsets \
  reward step advantages/values old_log_probs/values ref_log_probs/values teacher_log_probs/values
run 4 co4_pp4 "${co[@]}" --set parallel.pipeline_parallel=4
close co4_pp1 co4_pp4
run 4 co4_tp2_pp2 "${co[@]}" --set parallel.tensor_parallel=2 --set parallel.pipeline_parallel=2
close co4_pp1 co4_tp2_pp2
run 4 co4_cp2_pp2 "${co[@]}" --set parallel.context_parallel=2 --set parallel.pipeline_parallel=2
close co4_pp1 co4_cp2_pp2
tied=(--set model.tie_word_embeddings=true)
run 4 co4_tied_pp1 "${co[@]}" "${tied[@]}"
run 4 co4_tied_pp2_uneven_do "${co[@]}" "${tied[@]}" --set parallel.pipeline_parallel=2 --set parallel.pipeline_layers=3,1 \
  --set train.distributed_optimizer=true
grep -q "this rank is stage 0: layers 0..2, the embedding" "$out/co4_tied_pp2_uneven_do.log"
close co4_tied_pp1 co4_tied_pp2_uneven_do

echo "== job steps 2 + 2 = 4 straight, bit for bit"
run 4 co4_pp2_chunked "${co[@]}" --set parallel.pipeline_parallel=2 --set run.job_steps=2
run 4 co4_pp2_chunked "${co[@]}" --set parallel.pipeline_parallel=2
/usr/bin/python3 tests/regression/compare_runs.py "$out/co4_pp2" "$out/co4_pp2_chunked"

echo "== layout-free checkpoints: saved at PP 2 x DP 2, resumed at PP 1 (DP 4)"
run 4 layout_to_pp1 "${co[@]}" --set parallel.pipeline_parallel=2 --set run.job_steps=2
run 4 layout_to_pp1 "${co[@]}"
close co4_pp2 layout_to_pp1

echo "== across axes: saved at TP 2 x CP 2, resumed at PP 2 x DP 2"
run 4 layout_tp2cp2_to_pp2 "${co[@]}" --set parallel.tensor_parallel=2 --set parallel.context_parallel=2 \
  --set run.job_steps=2
run 4 layout_tp2cp2_to_pp2 "${co[@]}" --set parallel.pipeline_parallel=2
close co4_pp2 layout_tp2cp2_to_pp2

echo "== SFT with evaluation at np 2"
sft=(--set run.n_steps=4 --set model.hidden_size=32 --set model.n_heads=4 --set model.n_kv_heads=2
     --set "eval.path=inputs/data/addition_eval.jsonl@[0:16]" --set eval.interval=2 --set train.global_batch_size=16
     --set rollout.max_new_tokens=8)
for pp in 1 2; do
  $mpirun -np 2 "$slimpi" run inputs/sft_addition.toml "${sft[@]}" --set parallel.pipeline_parallel=$pp \
    --set run.dir="$out/sft_pp$pp" >"$out/sft_pp$pp.log" 2>&1 || { cat "$out/sft_pp$pp.log"; exit 1; }
done
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
with h5py.File(f"{out}/sft_pp1/metrics.h5") as a, h5py.File(f"{out}/sft_pp2/metrics.h5") as b:
    for k in ["train/loss", "train/grad_norm", "eval/pass@1"]:
        x, y = a["steps/" + k][:], b["steps/" + k][:]
        assert np.allclose(x, y, rtol=1e-5, atol=1e-6, equal_nan=True), (k, x, y)
print("pipeline_parallel_runs: SFT at PP 2 logs PP 1's losses, norms and evaluation")
PY

echo "== DeepSeek-V3's shape (MLA, DeepSeekMoE, MTP) at PP 2 x DP 2 with EP 2 (np 4 colocated) against PP 1"
moe=(--set model.n_experts=4 --set model.n_experts_per_tok=2 --set model.moe_intermediate_size=16
     --set model.moe_router=sigmoid --set model.moe_router_bias=true --set model.moe_n_group=2
     --set model.moe_topk_group=1 --set model.n_shared_experts=1 --set model.first_k_dense_replace=1
     --set train.moe_aux_loss_coef=0.01 --set train.moe_z_loss_coef=0.001 --set train.routing_replay=true)
v3=(--set model.kv_lora_rank=16 --set model.q_lora_rank=24 --set model.qk_nope_head_dim=8 --set model.qk_rope_head_dim=4
    --set model.v_head_dim=6 --set model.rope_interleave=true --set model.partial_rotary_factor=1 --set model.qk_norm=false
    --set model.mtp_num_layers=1 --set train.mtp_loss_coef=0.3)
# One sample a micro-batch at DP 4 and at DP 2: the load-balancing loss is a micro-batch's
# (its choice shares times its mean probabilities), so the runs split the samples alike.
moe+=(--set train.n_micro_batches=16)
run 4 co4_moe_pp1 "${co[@]}" "${moe[@]}" "${v3[@]}"
run 4 co4_moe_pp2_ep2 "${co[@]}" "${moe[@]}" "${v3[@]}" --set parallel.pipeline_parallel=2 --set parallel.expert_parallel=2
/usr/bin/python3 tests/regression/same_tokens.py "$tag" "$out/co4_moe_pp1" "$out/co4_moe_pp2_ep2" tokens/values \
  tokens/offsets routing/values reward step advantages/values old_log_probs/values

echo "== ... and from its Hugging Face export (each stage loads its layers, the KL reference's too; in DeepSeek-V3's"
echo "   layout the MTP depth is layer 4, the last stage's)"
"$slimpi" export "$out/co4_moe_pp1/ckpt/step_00000004" "$out/hf_v3" >"$out/export_v3.log"
from_v3=("${co[@]}" "${moe[@]}" "${v3[@]}" "${kl[@]}" --set model.init_from="$out/hf_v3" --set run.n_steps=1)
run 4 from_hf_v3_pp1 "${from_v3[@]}"
run 4 from_hf_v3_pp2_ep2 "${from_v3[@]}" --set parallel.pipeline_parallel=2 --set parallel.expert_parallel=2
/usr/bin/python3 tests/regression/same_tokens.py "$tag" "$out/from_hf_v3_pp1" "$out/from_hf_v3_pp2_ep2" tokens/values \
  tokens/offsets routing/values reward step

echo "== PPO: the critic in stages too, run in job steps 2 + 2 (the critic resumed), against PP 1"
ppo=(--set train.advantage_estimator=ppo --set critic.lr=1e-3 --set train.normalize_advantages=true)
run 4 co4_ppo_pp1 "${co[@]}" "${ppo[@]}"
run 4 co4_ppo_pp2_chunked "${co[@]}" "${ppo[@]}" --set parallel.pipeline_parallel=2 --set run.job_steps=2
run 4 co4_ppo_pp2_chunked "${co[@]}" "${ppo[@]}" --set parallel.pipeline_parallel=2
/usr/bin/python3 tests/regression/same_tokens.py "$tag" "$out/co4_ppo_pp1" "$out/co4_ppo_pp2_chunked" tokens/values \
  tokens/offsets reward step advantages/values values/values returns/values

echo "== exact on-policy: PP 2 trains on the engine's bits (abs_diff 0)"
run 2 exact_pp2 "${co[@]}" --set train.on_policy=exact --set train.normalize_advantages=true \
  --set parallel.pipeline_parallel=2
/usr/bin/python3 - "$out/exact_pp2" <<'PY'
import sys
import h5py
with h5py.File(sys.argv[1] + "/metrics.h5") as f:
    d = f["steps/train/train_rollout_logprob_abs_diff"][:]
    assert (d == 0).all(), d
print("pipeline_parallel_runs: exact on-policy at PP 2: train/rollout abs_diff", d)
PY

echo "== refusals"
refused pp3 "parallel.tensor_parallel × parallel.context_parallel × parallel.pipeline_parallel = 1 × 1 × 3 = 3 must divide the number of trainer ranks, 4" \
  4 "${co[@]}" --set parallel.pipeline_parallel=3
# (the deck's own checks, which every rank runs alike: `slimpi check` in one process)
check_refuses pp8 "pipeline parallelism of 8 stages for a model of 4 layers" 8 "${co[@]}" --set parallel.pipeline_parallel=8
check_refuses layers_sum "pipeline layers [2, 1]: 2 stages of 3 layers in all, for 2 stages of the model's 4 layers" \
  2 "${co[@]}" --set parallel.pipeline_parallel=2 --set parallel.pipeline_layers=2,1
check_refuses layers_text "parallel.pipeline_layers = \"3,x\"" 2 "${co[@]}" --set parallel.pipeline_parallel=2 \
  --set parallel.pipeline_layers=3,x
check_refuses layers_alone "drop it or set pipeline_parallel above 1" 2 "${co[@]}" --set parallel.pipeline_layers=3,1
refused pp_ep4 "it must divide the number of data-parallel trainer ranks of a tensor rank and pipeline stage, 2" \
  4 "${co[@]}" "${moe[@]}" --set parallel.pipeline_parallel=2 --set parallel.expert_parallel=4
refused pp_sliced "rollout.weight_sync_route = \"sliced\"" 4 --set parallel.pipeline_parallel=2 \
  --set rollout.weight_sync_route=sliced
echo "pipeline_parallel_runs: OK"
