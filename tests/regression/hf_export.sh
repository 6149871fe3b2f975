#!/usr/bin/env bash
# `slimpi export` end to end: a 3-step RL run's last checkpoint exported as
# model.safetensors + config.json holds exactly the checkpoint's weights under HF names
# (also sharded with an index, and in bf16)
# (read here with a plain-numpy safetensors parser) and a Llama config of the deck's
# shape; generating from the export (model.init_from = the directory) gives the same
# tokens and log-probs as generating from the checkpoint; MTP depths export in
# DeepSeek-V3's or MiMo's layout and load back; a corrupt checkpoint is refused.
# Usage: hf_export.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
$mpirun -np 2 "$slimpi" run inputs/smoke_rl.toml --set parallel.placement=colocate --set run.dir="$out/run" \
  >"$out/run.log" 2>&1 || { cat "$out/run.log"; exit 1; }
ckpt="$out/run/ckpt/step_00000003"
"$slimpi" export "$ckpt" "$out/hf" | tee "$out/export.log"

PYTHONPATH=tests/regression /usr/bin/python3 - "$ckpt" "$out/hf" <<'PY'
import json
import sys
import h5py
import numpy as np
from safetensors_file import SafetensorsFile
ckpt, hf = sys.argv[1], sys.argv[2]
st = SafetensorsFile(f"{hf}/model.safetensors")
header = st.header
assert st.header_bytes % 8 == 0 and header["__metadata__"]["format"] == "pt"
with h5py.File(f"{ckpt}/trainer_state.h5") as f:
    names = []
    f["model"].visit(lambda k: names.append(k) if isinstance(f["model"][k], h5py.Dataset) else None)
    assert sorted(names) == sorted(k for k in header if k != "__metadata__"), (names, list(header))
    for name in names:
        info = header[name]
        assert info["dtype"] == "F32", info
        assert np.array_equal(st.tensor(name), f["model"][name][:]), name
    # smoke_rl's model: 2 x (4 projections of attention, 3 of the MLP, 2 norms) + embedding, head, final norm
    assert len(names) == 21 and sum(int(np.prod(header[k]["shape"])) for k in names) == 35232, names
cfg = json.load(open(f"{hf}/config.json"))
expect = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 260,
          "max_position_embeddings": 32, "tie_word_embeddings": False, "hidden_act": "silu"}
for k, v in expect.items():
    assert cfg[k] == v, (k, cfg[k], v)
print(f"hf_export: {len(names)} tensors equal the checkpoint's; config.json matches the deck")
PY

# Sharded fp32 (index.json + shards) and bf16 exports.
"$slimpi" export "$ckpt" "$out/hf_sharded" --max-shard-size 20KB | tee "$out/export_sharded.log"
"$slimpi" export "$ckpt" "$out/hf_bf16" --dtype bf16 >/dev/null
PYTHONPATH=tests/regression /usr/bin/python3 - "$out/hf_sharded" "$out/hf_bf16" <<'PY'
import json
import os
import sys
from safetensors_file import SafetensorsFile
sharded, bf16 = sys.argv[1], sys.argv[2]
index = json.load(open(f"{sharded}/model.safetensors.index.json"))
shards = sorted(set(index["weight_map"].values()))
assert len(shards) > 1 and not os.path.exists(f"{sharded}/model.safetensors"), shards
for s in shards:
    assert os.path.getsize(f"{sharded}/{s}") <= 20 * 1024 + 4096 or len(SafetensorsFile(f"{sharded}/{s}").header) == 2, s
header = SafetensorsFile(f"{bf16}/model.safetensors").header
assert all(v["dtype"] == "BF16" for k, v in header.items() if k != "__metadata__")
assert json.load(open(f"{bf16}/config.json"))["torch_dtype"] == "bfloat16"
assert json.load(open(f"{bf16}/generation_config.json"))["eos_token_id"] == 258
print(f"hf_export: {len(shards)} shards and an index; bf16 export holds BF16 tensors")
PY

head -16 inputs/data/addition_eval.jsonl >"$out/prompts.jsonl"
for src in "$ckpt/trainer_state.h5" "$out/hf" "$out/hf_sharded"; do
  name=$(basename "$src")
  $mpirun -np 1 "$slimpi" generate inputs/smoke_rl.toml --set model.init_from="$src" --set data.path="$out/prompts.jsonl" \
    --set run.dir="$out/gen_$name" >"$out/gen_$name.log" 2>&1 || { cat "$out/gen_$name.log"; exit 1; }
done
/usr/bin/python3 - "$out/gen_trainer_state.h5/rollouts.h5" "$out/gen_hf/rollouts.h5" "$out/gen_hf_sharded/rollouts.h5" <<'PY'
import sys
import h5py
import numpy as np
with h5py.File(sys.argv[1]) as a:
    for other in sys.argv[2:]:
        with h5py.File(other) as b:
            for k in ["tokens/values", "rollout_log_probs/values"]:
                assert a["samples"][k].shape[0] > 0 and np.array_equal(a["samples"][k][:], b["samples"][k][:]), k
print("hf_export: generation from the exports (single file, sharded) equals generation from the checkpoint")
PY

# MTP depths (model.mtp_num_layers = 1, trained beside the policy): a Llama exports them in
# DeepSeek-V3's layout (model.layers.<L>.eh_proj, its column halves swapped), a Qwen2
# shape as MiMoForCausalLM (model.mtp_layers.0.*); config.json says num_nextn_predict_layers;
# a run starts from each export.
for family in llama mimo; do
  flags=(--set model.mtp_num_layers=1)
  [ $family = mimo ] && flags+=(--set model.qkv_bias=true)
  $mpirun -np 1 "$slimpi" run inputs/smoke_rl.toml --set parallel.placement=colocate --set run.n_steps=2 "${flags[@]}" \
    --set run.dir="$out/mtp_$family" >"$out/mtp_$family.log" 2>&1 || { cat "$out/mtp_$family.log"; exit 1; }
  "$slimpi" export "$out/mtp_$family/ckpt/step_00000002" "$out/hf_mtp_$family" >/dev/null
  PYTHONPATH=tests/regression /usr/bin/python3 - "$out/mtp_$family" "$out/hf_mtp_$family" $family <<'PY'
import json
import sys
import h5py
import numpy as np
from safetensors_file import SafetensorsFile
run, hf, family = sys.argv[1:4]
st = SafetensorsFile(f"{hf}/model.safetensors")
header, tensor = st.header, st.tensor
cfg = json.load(open(f"{hf}/config.json"))
assert cfg["num_nextn_predict_layers"] == 1, cfg
with h5py.File(f"{run}/trainer_state.h5") as f:
    proj = f["model/model.mtp_layers.0.input_proj.weight"][:]
    assert proj.shape == (32, 64) and np.abs(proj).max() > 0
    if family == "llama":
        assert cfg["architectures"] == ["LlamaForCausalLM"], cfg
        assert "model.mtp_layers.0.input_proj.weight" not in header
        assert np.array_equal(tensor("model.layers.2.eh_proj.weight"), np.concatenate([proj[:, 32:], proj[:, :32]], 1))
        assert np.array_equal(tensor("model.layers.2.enorm.weight"), f["model/model.mtp_layers.0.token_layernorm.weight"][:])
        assert np.array_equal(tensor("model.layers.2.self_attn.q_proj.weight"),
                              f["model/model.mtp_layers.0.self_attn.q_proj.weight"][:])
    else:
        assert cfg["architectures"] == ["MiMoForCausalLM"] and cfg["model_type"] == "mimo", cfg
        assert np.array_equal(tensor("model.mtp_layers.0.input_proj.weight"), proj)
print(f"hf_export: the MTP depth exported in {'DeepSeek-V3' if family == 'llama' else 'MiMo'}'s layout")
PY
  $mpirun -np 1 "$slimpi" run inputs/smoke_rl.toml --set parallel.placement=colocate --set run.n_steps=1 \
    --set model.init_from="$out/hf_mtp_$family" --set run.dir="$out/from_mtp_$family" >"$out/from_mtp_$family.log" 2>&1 \
    || { cat "$out/from_mtp_$family.log"; exit 1; }
  steps_done "$out/from_mtp_$family" 1
done
grep -q "train/mtp_loss" "$out/mtp_llama/metrics.csv"

printf 'x' >>"$ckpt/deck.json"
if "$slimpi" export "$ckpt" "$out/hf2" >"$out/bad.log" 2>&1; then echo "FAIL: exported a corrupt checkpoint"; exit 1; fi
grep -q "is not a usable checkpoint: deck.json: .* bytes, the manifest says" "$out/bad.log" || { cat "$out/bad.log"; exit 1; }
echo "hf_export: OK"
