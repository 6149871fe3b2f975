#!/usr/bin/env bash
# Hybrid linear-attention policies (Qwen3.5's shape: three Gated DeltaNet layers and one
# gated full-attention layer, zero-centred norms) through RL, on a reward they learn from
# (digit_reward.py):
#  * the dense hybrid learns at np 4 split; the trainer's log-probs (the chunked delta
#    rule over packed sequences) are the engine's (chunked prefill, the recurrent decode
#    step) to fp32 round-off: |old - rollout| mean <= 2e-6 (measured 7.4e-7 on 2026-12-06);
#  * in bf16 (train.precision and rollout.precision) it learns too; its gap is reported
#    (mean 3.1e-5, max 0.061 on 2026-12-06; the dense model of the same shape: 6.1e-7, 3.7e-3)
#    and bounded loosely (mean < 1e-3);
#  * the MoE hybrid (Qwen3.5-MoE: every layer sparse, a gated shared expert) runs at np 2
#    colocated and records its routing traces (4 MoE layers x top-2 per token);
#  * one_step_off over 2 + 2 job steps equals 4 straight, bit for bit (the optimizer state
#    of the linear layers' parameters and the pending batch across the restart);
#  * train.async = "full", straight and in 3 + 3 + 2 job steps: every sample once
#    (check_full_async.py; with 6-token responses the engines finish before the trainer,
#    so no partial response is carried here: tests/unit/rollout/test_engine_hybrid.cpp
#    continues partial work in another engine, its linear layers' state recomputed);
#  * tensor parallelism (the Gated DeltaNet layers split by key heads): TP 2 trainers with
#    engines of 2 ranks generate the tokens of TP 1, colocated (with sequence parallelism)
#    and split; the exported policy loads into TP 2 from its Hugging Face files (its q/k/v
#    channels reordered by key head, then split) and generates what TP 1 does, with the
#    learnt reward;
#  * prefill/decode disaggregation (np 3: a prefill engine hands a decode engine the prompt's
#    full-attention rows and the linear layers' state) generates what two plain engines do;
#  * a checkpoint in the channel order of an older slimpi (no linear_channels attribute) is
#    refused, saying so;
#  * refused, with the key named: a tensor group that does not divide the key heads, an
#    explicit prefix cache, cached responses, no full-attention layer;
#  * the learnt policy exports as Qwen3_5ForCausalLM; a hybrid no family fits (plain norms)
#    is refused by export, saying what the families need;
#  * an MTP depth trained beside the hybrid (its gated full-attention layer) drafts for
#    speculative decoding (a rejected draft's chain restores the linear layers' state from
#    before it and recomputes the kept tokens: the trainer's log-probs are still the
#    engine's to fp32 round-off), exports as
#    Qwen3.5's mtp.* (mtp.fc's halves [embedding ; hidden], mtp_num_hidden_layers = 1) and a
#    run starts from that export with the depth loaded (its MTP loss where the run left it).
# Usage: hybrid_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
compare="/usr/bin/python3 $root/tests/regression/compare_runs.py"
args=(run inputs/smoke_rl.toml --set model.n_layers=4 --set model.full_attention_interval=4
      --set model.linear_num_key_heads=2 --set model.linear_num_value_heads=4 --set model.linear_key_head_dim=8
      --set model.linear_value_head_dim=8 --set model.attn_output_gate=true --set model.zero_centered_norm=true
      --set model.qk_norm=true --set model.head_dim=8 --set model.partial_rotary_factor=0.25 --set model.init_std=0.2
      --set reward.style=command --set "reward.command=/usr/bin/python3 $root/tests/regression/digit_reward.py"
      --set eval.path=)

echo "== dense hybrid: learns at np 4 split; the trainer's log-probs are the engine's"
run 4 learns --set run.n_steps=40 --set train.lr=3e-3 --set rollout.rollout_batch_size=16 \
  --set rollout.n_samples_per_prompt=8 --set train.global_batch_size=128
grep -q "rollout.prefix_cache: off for a hybrid linear-attention model" "$out/learns.log"
/usr/bin/python3 - "$out/learns" <<'PY'
import sys
import h5py
import numpy as np
run = sys.argv[1]
with h5py.File(f"{run}/metrics.h5") as f:
    r = f["steps/rollout/raw_reward"][:40]
with h5py.File(f"{run}/rollouts.h5") as f:
    s = f["samples"]
    old, rollout = s["old_log_probs/values"][:], s["rollout_log_probs/values"][:]
d = np.abs(old - rollout)
first, last = r[:5].mean(), r[-5:].mean()
print(f"hybrid_runs: reward {first:.4f} -> {last:.4f}; |trainer - engine log-prob| mean {d.mean():.3g} max "
      f"{d.max():.3g} over {d.size} tokens")
assert last > 0.1 and last > 5 * first, "the hybrid policy did not learn"
assert d.mean() < 2e-6, d.mean()
PY

echo "== dense hybrid in bf16: learns; the trainer's log-probs against the engine's, reported"
run 4 bf16 --set run.n_steps=40 --set train.lr=3e-3 --set rollout.rollout_batch_size=16 \
  --set rollout.n_samples_per_prompt=8 --set train.global_batch_size=128 --set train.precision=bf16 \
  --set rollout.precision=bf16
/usr/bin/python3 - "$out/bf16" <<'PY'
import sys
import h5py
import numpy as np
run = sys.argv[1]
with h5py.File(f"{run}/metrics.h5") as f:
    r = f["steps/rollout/raw_reward"][:40]
with h5py.File(f"{run}/rollouts.h5") as f:
    s = f["samples"]
    d = np.abs(s["old_log_probs/values"][:] - s["rollout_log_probs/values"][:])
first, last = r[:5].mean(), r[-5:].mean()
print(f"hybrid_runs: bf16 reward {first:.4f} -> {last:.4f}; |trainer - engine log-prob| mean {d.mean():.3g} max "
      f"{d.max():.3g}")
assert last > 0.1 and last > 5 * first, "the bf16 hybrid policy did not learn"
assert d.mean() < 1e-3, d.mean()
PY

echo "== MoE hybrid (Qwen3.5-MoE's shape) at np 2 colocated: routing traces of its 4 sparse layers"
run 2 moe --set parallel.placement=colocate --set model.n_experts=4 --set model.n_experts_per_tok=2 \
  --set model.moe_intermediate_size=16 --set model.shared_expert_intermediate_size=24
/usr/bin/python3 - "$out/moe" <<'PY'
import sys
import h5py
run = sys.argv[1]
with h5py.File(f"{run}/rollouts.h5") as f:
    s = f["samples"]
    toff, rout, roff = s["tokens/offsets"][:], s["routing/values"][:], s["routing/offsets"][:]
assert all(roff[i + 1] - roff[i] == (toff[i + 1] - toff[i] - 1) * 4 * 2 for i in range(len(roff) - 1))
assert rout.min() >= 0 and rout.max() < 4
print(f"hybrid_runs: MoE hybrid recorded {len(roff) - 1} samples' routing traces")
PY

echo "== one_step_off: 2 + 2 job steps equal 4 straight"
run 4 straight --set run.n_steps=4 --set train.async=one_step_off
run 4 chunked --set run.n_steps=4 --set train.async=one_step_off --set run.job_steps=2
run 4 chunked --set run.n_steps=4 --set train.async=one_step_off --set run.job_steps=2
$compare "$out/straight" "$out/chunked"

echo "== full async: every sample once, straight and in 3 + 3 + 2 job steps"
full=(--set run.n_steps=8 --set checkpoint.interval=2 --set checkpoint.keep_last=10 --set train.async=full
      --set parallel.trainer_ranks=1 --set train.lr=3e-3)
run 3 full "${full[@]}"
/usr/bin/python3 "$root/tests/regression/check_full_async.py" "$out/full" 4 -1
for i in 1 2; do run 3 full_chunked "${full[@]}" --set run.job_steps=3; done
run 3 full_chunked "${full[@]}"
/usr/bin/python3 "$root/tests/regression/check_full_async.py" "$out/full_chunked" 4 -1

echo "== tensor parallelism: TP 2 trainers and engines of 2 ranks generate the tokens of TP 1"
close() {  # RUN_A RUN_B: same tokens, rewards, advantages and old log-probs
  /usr/bin/python3 "$root/tests/regression/same_tokens.py" "$tag" "$out/$1" "$out/$2" tokens/values tokens/offsets \
    reward step advantages/values old_log_probs/values
}
tp=(--set run.n_steps=3 --set train.global_batch_size=32)  # (one optimizer step a rollout: DP 1 and 2 alike)
run 2 co_tp1 --set parallel.placement=colocate "${tp[@]}"
run 2 co_tp2 --set parallel.placement=colocate --set parallel.tensor_parallel=2 --set rollout.tensor_parallel=2 \
  --set parallel.sequence_parallel=true "${tp[@]}"
close co_tp1 co_tp2
run 4 split_tp1 --set parallel.trainer_ranks=2 "${tp[@]}"
run 4 split_tp2 --set parallel.trainer_ranks=2 --set parallel.tensor_parallel=2 --set rollout.tensor_parallel=2 "${tp[@]}"
grep -q "this rank runs 1 of 2 linear key heads" "$out/split_tp2.log"
grep -q "state slots (1 of 2 linear key heads)" "$out/split_tp2.log"
close split_tp1 split_tp2

echo "== prefill/decode disaggregation: a prefill engine hands the decode engine the rows and the linear layers' state"
run 3 plain3 --set parallel.trainer_ranks=1 "${tp[@]}"
run 3 pd3 --set parallel.trainer_ranks=1 --set rollout.prefill_ranks=1 "${tp[@]}"
/usr/bin/python3 "$root/tests/regression/same_tokens.py" \
  --except=rollout/prefill_tokens_computed,rollout/prefix_cache_hit_rate "$tag" "$out/plain3" "$out/pd3"

echo "== refused"
# (one refusal as a job: every rank stops; the deck's through `slimpi check`, one process)
refused tp4 "model.linear_num_key_heads = 2 (--set) is not divisible by 4" 4 --set parallel.placement=colocate \
  --set parallel.tensor_parallel=4
check_refuses prefix "rollout.prefix_cache = true" 2 --set rollout.prefix_cache=true
check_refuses cache_responses "rollout.cache_responses = true (--set) stores responses in the prefix cache, which a hybrid" 2 \
  --set rollout.cache_responses=true
check_refuses all_linear "leaves none of the 4 layers full attention" 2 --set model.full_attention_interval=5

echo "== export: the learnt policy as Qwen3_5ForCausalLM; a hybrid no family fits is refused, saying why"
"$slimpi" export "$out/learns" "$out/learns_hf" >"$out/export.log" 2>&1 || { cat "$out/export.log"; exit 1; }
grep -q '"Qwen3_5ForCausalLM"' "$out/learns_hf/config.json"
from_hf=(--set parallel.placement=colocate --set run.n_steps=1 --set train.global_batch_size=32
         --set "model.init_from=$out/learns_hf")
run 2 from_hf_tp1 "${from_hf[@]}"
run 2 from_hf_tp2 "${from_hf[@]}" --set parallel.tensor_parallel=2 --set rollout.tensor_parallel=2
close from_hf_tp1 from_hf_tp2
/usr/bin/python3 - "$out/learns" "$out/from_hf_tp2" <<'PY'
import sys
import h5py
with h5py.File(f"{sys.argv[1]}/metrics.h5") as f:
    learnt = f["steps/rollout/raw_reward"][35:40].mean()
with h5py.File(f"{sys.argv[2]}/metrics.h5") as f:
    loaded = f["steps/rollout/raw_reward"][0]
print(f"hybrid_runs: the export loaded at TP 2 scores {loaded:.4f} (the learnt policy's last steps: {learnt:.4f})")
assert loaded > 0.5 * learnt, "the exported policy did not load into TP 2 as learnt"
PY
state=$(find "$out/learns" -name trainer_state.h5 | sort | tail -1)
cp "$state" "$out/old_order.h5"
/usr/bin/python3 -c "import h5py, sys; f = h5py.File(sys.argv[1], 'a'); del f['model'].attrs['linear_channels']" \
  "$out/old_order.h5"
refused old_order "are in Hugging Face's channel order, written by an older slimpi" 2 \
  --set parallel.placement=colocate --set "model.init_from=$out/old_order.h5"
run 1 plain_norms --set run.n_steps=1 --set model.zero_centered_norm=false --set parallel.placement=colocate
if "$slimpi" export "$out/plain_norms" "$out/plain_hf" >"$out/plain_export.log" 2>&1; then
  echo "FAIL: a hybrid without zero-centred norms exported"; exit 1
fi
grep -q "hybrid linear-attention model has no Hugging Face architecture to export to" "$out/plain_export.log" \
  || { cat "$out/plain_export.log"; exit 1; }
echo "== an MTP depth: trained, exported as Qwen3.5's mtp.*, loaded back"
run 2 mtp --set parallel.placement=colocate --set run.n_steps=3 --set model.mtp_num_layers=1 \
  --set train.mtp_loss_coef=0.3 --set rollout.speculative=mtp --set rollout.spec_num_steps=2
/usr/bin/python3 - "$out/mtp" <<'PY'
import sys
import h5py
import numpy as np
run = sys.argv[1]
with h5py.File(f"{run}/metrics.h5") as f:
    rate, recomputed = f["steps/rollout/spec_accept_rate"][:3], f["steps/rollout/spec_recomputed_tokens"][:3]
with h5py.File(f"{run}/rollouts.h5") as f:
    s = f["samples"]
    d = np.abs(s["old_log_probs/values"][:] - s["rollout_log_probs/values"][:])
print(f"hybrid_runs: speculating with the MTP depth: accept rate {rate.mean():.3f}, {recomputed.sum():.0f} tokens "
      f"recomputed after rejected drafts; |trainer - engine log-prob| mean {d.mean():.3g} max {d.max():.3g}")
assert rate.min() > 0 and recomputed.sum() > 0, (rate, recomputed)
assert d.mean() < 2e-6, d.mean()
PY
"$slimpi" export "$out/mtp" "$out/mtp_hf" >"$out/mtp_export.log" 2>&1 || { cat "$out/mtp_export.log"; exit 1; }
PYTHONPATH=tests/regression /usr/bin/python3 - "$out/mtp" "$out/mtp_hf" <<'PY'
import json
import sys
import h5py
import numpy as np
from safetensors_file import SafetensorsFile
run, hf = sys.argv[1:3]
st = SafetensorsFile(f"{hf}/model.safetensors")
header, tensor = st.header, st.tensor
cfg = json.load(open(f"{hf}/config.json"))
assert cfg["architectures"] == ["Qwen3_5ForCausalLM"] and cfg["mtp_num_hidden_layers"] == 1, cfg
assert not any(k.startswith("model.mtp_layers.") for k in header), "slimpi's MTP names in a Qwen3.5 export"
with h5py.File(f"{run}/trainer_state.h5") as f:
    m = f["model"]
    proj = m["model.mtp_layers.0.input_proj.weight"][:]
    d = proj.shape[0]
    assert np.array_equal(tensor("mtp.fc.weight"), np.concatenate([proj[:, d:], proj[:, :d]], 1))
    for ours, theirs in [("token_layernorm.weight", "pre_fc_norm_embedding.weight"),
                         ("hidden_layernorm.weight", "pre_fc_norm_hidden.weight"), ("final_layernorm.weight", "norm.weight"),
                         ("self_attn.q_proj.weight", "layers.0.self_attn.q_proj.weight"),
                         ("mlp.down_proj.weight", "layers.0.mlp.down_proj.weight")]:
        assert np.array_equal(tensor("mtp." + theirs), m["model.mtp_layers.0." + ours][:]), theirs
print("hybrid_runs: the MTP depth exported as Qwen3.5's mtp.*")
PY
run 2 mtp_from_hf --set parallel.placement=colocate --set run.n_steps=1 --set "model.init_from=$out/mtp_hf" \
  --set train.mtp_loss_coef=0.3 --set train.lr=0  # (lr 0: its checkpoint holds the weights it loaded)
if grep -q "holds no multi-token-prediction layers" "$out/mtp_from_hf.log"; then
  echo "FAIL: the export's MTP depth was not read"; exit 1
fi
/usr/bin/python3 - "$out/mtp" "$out/mtp_from_hf" <<'PY'
import sys
import h5py
import numpy as np
with h5py.File(f"{sys.argv[1]}/trainer_state.h5") as a, h5py.File(f"{sys.argv[2]}/trainer_state.h5") as b:
    names = [k for k in a["model"] if k.startswith("model.mtp_layers.0.")]
    assert len(names) == 15, names
    for k in names:
        assert np.array_equal(a["model"][k][:], b["model"][k][:]), k
print(f"hybrid_runs: a run from the export holds the MTP depth's {len(names)} tensors as trained")
PY
echo "hybrid_runs: OK"
