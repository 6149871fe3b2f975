#!/usr/bin/env bash
# Exact on-policy mode (train.on_policy = "exact", docs/exact_on_policy.md) end to end on
# the smoke task:
#  * np 4 split, one optimizer step a rollout: the trainer's log-prob of every sampled
#    token is the engine's bit for bit: train/train_rollout_logprob_abs_diff is exactly 0
#    every step (and not without the mode), and rollouts.h5's old_log_probs (the
#    training forward's) equal its rollout_log_probs;
#  * the run repeats bit for bit (metrics, rollouts, trainer state with its recorded
#    generator states; timings aside) with
#    the machine loaded differently (a busy process on every core during the second run),
#    and at np 2 colocated;
#  * with 2 optimizer steps a rollout the old log-probs are the rollout's (the log says
#    their forward pass is skipped), and the first step's PPO KL is exactly 0; with the
#    pass forced (debug.recompute_old_log_probs) it gives the rollout's bits;
#  * an MoE policy with expert parallelism 2 at np 4, tensor parallelism (trainers and an
#    engine of 2 with sequence parallelism; 4 colocated) and prefill/decode
#    disaggregation at np 3, KV caches of e4m3 (split) and bf16 (colocated): exactly 0 too;
#  * bf16 forwards (train.precision = rollout.precision = "bf16": the trainer's fp32
#    masters as their bf16 roundings, the engines' bf16 weights and cache) at np 4 split,
#    with MoE and expert parallelism 2, and with tensor parallelism 2 (sequence-parallel,
#    with biases): exactly 0, and a rerun repeats bit for bit;
#  * multi-head latent attention (the trainer in the engines' absorbed form) and Gated
#    DeltaNet (the rule token by token on both sides), fp32 at np 4 and bf16 with tensor
#    parallelism 2: exactly 0;
#  * an SFT run with bf16 settings evaluates (its evaluation engine's cache is fp32), and
#    `slimpi generate` (bf16 engines whatever the deck's mode) repeats across np;
#  * what the mode does not cover yet is refused with its key.
# Usage: exact_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
# (f1 rewards and an entropy term: the policy moves every step, so the later steps'
# rollouts and the trainer state depend on what was learnt)
args=(run inputs/smoke_rl.toml --set run.n_steps=3 --set rollout.temperature=1.0 --set model.init_std=0.2
      --set reward.style=f1 --set train.entropy_coef=0.01)
exact=(--set train.on_policy=exact)
one_step=(--set train.global_batch_size=32)

run 4 exact "${exact[@]}" "${one_step[@]}"
run 4 plain "${one_step[@]}"
# The second run beside two busy processes: the engines' batches form differently.
( timeout 300 sh -c 'while :; do :; done' & timeout 300 sh -c 'while :; do :; done' & wait ) &
busy=$!
run 4 exact_loaded "${exact[@]}" "${one_step[@]}"
pkill -P $busy 2>/dev/null || true; kill $busy 2>/dev/null || true
/usr/bin/python3 tests/regression/compare_runs.py "$out/exact" "$out/exact_loaded" --with-rng
run 2 colocated "${exact[@]}" "${one_step[@]}" --set parallel.placement=colocate
run 2 colocated_again "${exact[@]}" "${one_step[@]}" --set parallel.placement=colocate
/usr/bin/python3 tests/regression/compare_runs.py "$out/colocated" "$out/colocated_again" --with-rng
run 4 two_steps "${exact[@]}"
grep -q "exact on-policy: the old log-probs are the rollout's" "$out/two_steps.log"
run 4 two_steps_recomputed "${exact[@]}" --set debug.recompute_old_log_probs=true
! grep -q "exact on-policy: the old log-probs are the rollout's" "$out/two_steps_recomputed.log"
run 4 moe "${exact[@]}" "${one_step[@]}" --set model.n_experts=4 --set model.n_experts_per_tok=2 \
    --set model.moe_intermediate_size=32 --set parallel.expert_parallel=2
# Tensor parallelism: trainers of 2 and an engine of 2 (split, with sequence parallelism),
# and 4 colocated (the sums in rank order over 4 parts; replicated kv heads); a
# disaggregated run (the prefill engine's KV rows to the decode engine).
run 4 tp2 "${exact[@]}" "${one_step[@]}" --set parallel.tensor_parallel=2 --set rollout.tensor_parallel=2 \
    --set parallel.sequence_parallel=true
run 4 tp4 "${exact[@]}" "${one_step[@]}" --set parallel.placement=colocate --set parallel.tensor_parallel=4 \
    --set rollout.tensor_parallel=4
run 3 pd "${exact[@]}" "${one_step[@]}" --set parallel.trainer_ranks=1 --set rollout.prefill_ranks=1
# KV caches of e4m3 and bf16 under fp32 engines: the trainer's attention reads them rounded alike.
run 4 kv_fp8 "${exact[@]}" "${one_step[@]}" --set rollout.kv_cache_dtype=fp8_e4m3
run 2 kv_bf16 "${exact[@]}" "${one_step[@]}" --set rollout.kv_cache_dtype=bf16 --set parallel.placement=colocate
# Multi-head latent attention (the trainer attends in the engines' absorbed form), fp32 at
# np 4 and bf16 with tensor parallelism 2.
mla=(--set model.kv_lora_rank=16 --set model.q_lora_rank=12 --set model.qk_nope_head_dim=8
     --set model.qk_rope_head_dim=4 --set model.v_head_dim=6 --set model.n_kv_heads=4)
run 4 mla "${exact[@]}" "${one_step[@]}" "${mla[@]}"
# Gated DeltaNet (Qwen3.5's hybrid layers; the rule token by token on both sides), fp32 at
# np 4 and bf16 with tensor parallelism 2.
hybrid=(--set model.n_layers=4 --set model.full_attention_interval=4 --set model.linear_num_key_heads=2
        --set model.linear_num_value_heads=4 --set model.linear_key_head_dim=8 --set model.linear_value_head_dim=8
        --set model.attn_output_gate=true --set model.zero_centered_norm=true --set model.qk_norm=true
        --set model.head_dim=8 --set model.partial_rotary_factor=0.25)
run 4 hybrid "${exact[@]}" "${one_step[@]}" "${hybrid[@]}"
# bf16 forwards.
bf16=(--set train.precision=bf16 --set rollout.precision=bf16)
run 4 bf16 "${exact[@]}" "${one_step[@]}" "${bf16[@]}"
run 4 bf16_again "${exact[@]}" "${one_step[@]}" "${bf16[@]}"
/usr/bin/python3 tests/regression/compare_runs.py "$out/bf16" "$out/bf16_again" --with-rng
run 4 bf16_moe "${exact[@]}" "${one_step[@]}" "${bf16[@]}" --set model.n_experts=4 --set model.n_experts_per_tok=2 \
    --set model.moe_intermediate_size=32 --set parallel.expert_parallel=2
# (with sequence parallelism, and q/k/v and o biases: the row-parallel o_proj's bias is
# added after the sum over the group)
run 4 bf16_tp2 "${exact[@]}" "${one_step[@]}" "${bf16[@]}" --set parallel.tensor_parallel=2 \
    --set rollout.tensor_parallel=2 --set parallel.sequence_parallel=true --set model.qkv_bias=true \
    --set model.o_bias=true
run 4 bf16_mla_tp2 "${exact[@]}" "${one_step[@]}" "${bf16[@]}" "${mla[@]}" --set parallel.tensor_parallel=2 \
    --set rollout.tensor_parallel=2
run 4 bf16_hybrid_tp2 "${exact[@]}" "${one_step[@]}" "${bf16[@]}" "${hybrid[@]}" --set parallel.tensor_parallel=2 \
    --set rollout.tensor_parallel=2
# An SFT run's evaluation engine runs the fp32 policy: its cache is fp32 whatever
# rollout.precision says (the trainer's exact attention must not round to bf16 there).
run 2 sft_bf16 "${exact[@]}" "${bf16[@]}" --set train.mode=sft --set run.n_steps=2
grep -q "final eval (after 2 steps)" "$out/sft_bf16.log"
# `slimpi generate` holds bf16 engine weights and caches whatever the deck's train.mode,
# and two runs (np 1, np 2) write the same log-probs.
head -24 inputs/data/addition_eval.jsonl >"$out/prompts.jsonl"
for np in 1 2; do
  $mpirun -np $np "$slimpi" generate inputs/generate_addition.toml --set model.init_from= --set train.mode=sft \
    --set data.path="$out/prompts.jsonl" --set run.dir="$out/generate$np" "${exact[@]}" "${bf16[@]}" \
    >"$out/generate$np.log" 2>&1 || { cat "$out/generate$np.log"; echo "FAIL: generate at np $np"; exit 1; }
done
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
a, b = (h5py.File(f"{out}/generate{np_}/rollouts.h5") for np_ in (1, 2))
key = "samples/rollout_log_probs/values"
assert len(a[key]) > 0 and np.array_equal(a[key][:], b[key][:]), "generate: np 1 and np 2 log-probs differ"
print(f"generate: {len(a[key])} log-probs identical at np 1 and 2 (exact, bf16)")
PY

/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
def steps(name):
    f = h5py.File(f"{out}/{name}/metrics.h5")
    s = f["steps"]
    return s, s["step"][:] < 3  # the last row is the final evaluation's
for name in ["exact", "colocated", "moe", "tp2", "tp4", "pd", "kv_fp8", "kv_bf16", "two_steps_recomputed", "mla",
             "hybrid", "bf16", "bf16_moe", "bf16_tp2", "bf16_mla_tp2", "bf16_hybrid_tp2"]:
    s, rows = steps(name)
    gap = s["train/train_rollout_logprob_abs_diff"][rows]
    assert len(gap) == 3 and np.all(gap == 0.0), (name, gap)
    with h5py.File(f"{out}/{name}/rollouts.h5") as r:  # ragged fields: values and offsets
        o, ro = r["samples/old_log_probs/offsets"][:], r["samples/rollout_log_probs/offsets"][:]
        old, rollout = r["samples/old_log_probs/values"][:], r["samples/rollout_log_probs/values"][:]
        n_trained = 0
        for i in range(len(o) - 1):
            if o[i + 1] > o[i]:  # a trained sample (filtered ones carry no old log-probs)
                assert np.array_equal(old[o[i]:o[i + 1]], rollout[ro[i]:ro[i + 1]]), f"{name}: sample {i}"
                n_trained += int(o[i + 1] - o[i])
        assert n_trained > 0, name
    print(f"{name}: |trainer - engine| = 0 on every one of {n_trained} tokens")
s, rows = steps("plain")
gap = s["train/train_rollout_logprob_abs_diff"][rows]
assert np.all(gap > 0) and np.all(gap < 1e-5), ("without the mode", gap)
print(f"plain: |trainer - engine| mean {gap.mean():.2e} per step (not 0)")
s, rows = steps("two_steps")
kl0 = s["train_step/0/ppo_kl"][rows] if "train_step/0/ppo_kl" in s else None
assert kl0 is not None and np.all(kl0 == 0.0), ("first step's ppo_kl", kl0)
# The first step's part: the trainer's forward against the engine's (not the copy against itself).
gap = s["train/train_rollout_logprob_abs_diff"][rows]
assert np.array_equal(gap, s["train_step/0/train_rollout_logprob_abs_diff"][rows]) and np.all(gap == 0.0), gap
assert "train_step/1/train_rollout_logprob_abs_diff" not in s, "the second step's gap compares the copy with itself"
assert np.all(s["train_step/1/ppo_kl"][rows] != 0.0), "the policy did not move"
print("two_steps: old log-probs from the rollout; the first step's forward equals them: gap and ppo_kl exactly 0")
PY

# (one refusal as a job: every rank stops; the deck's through `slimpi check`, one process)
refused precisions "compute in one precision" 2 "${exact[@]}" --set train.precision=bf16
check_refuses fp8 "quantises them in blocks" 2 "${exact[@]}" "${bf16[@]}" --set rollout.precision=fp8
check_refuses tp "needs engines of the trainers' tensor size" 4 "${exact[@]}" --set parallel.tensor_parallel=2
check_refuses tp_colocated "needs engines of the trainers' tensor size" 2 "${exact[@]}" --set parallel.tensor_parallel=2 \
    --set parallel.placement=colocate
echo "$tag: OK"
