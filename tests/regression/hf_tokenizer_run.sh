#!/usr/bin/env bash
# A Hub-shaped checkpoint end to end: model.init_from = a Hugging Face directory with a
# byte-level BPE tokenizer.json (tests/fixtures/hf/qwen2_with_tokenizer). The run takes
# its shape from config.json and its vocabulary from tokenizer.json (tokenizer.path
# resolved to the directory, recorded in deck.resolved.toml): SFT trains 4 steps;
# `slimpi generate` encodes prompts exactly as the `tokenizers` library does (ids of the
# fixture cases) and stops on the tokenizer's EOS ids; the export carries the tokenizer
# files and their special ids. Conversations (message lists, data.chat_template) are
# encoded as transformers' apply_chat_template does and an RL step trains on them; with
# a base tokenizer (EOS <|endoftext|> only) chat generations still stop at <|im_end|>. A
# model too small for the tokenizer, a tokenizer.path without tokenizer.json, a message
# list without a template or with an unknown role, and template options that do not fit
# stop every rank cleanly.
# Usage: hf_tokenizer_run.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
model=tests/fixtures/hf/qwen2_with_tokenizer
cases=tests/fixtures/tokenizers/qwen2_style/cases.json

/usr/bin/python3 - "$cases" "$out" <<'PY'
import json, sys
cases = [c for c in json.load(open(sys.argv[1]))["cases"] if c["text"].strip() and "<|" not in c["text"]]
with open(f"{sys.argv[2]}/sft.jsonl", "w") as f:
    for c in cases[:40]:
        f.write(json.dumps({"prompt": c["text"][:40], "response": c["text"][-20:]}) + "\n")
with open(f"{sys.argv[2]}/prompts.jsonl", "w") as f:
    for c in cases[40:56]:
        f.write(json.dumps({"prompt": c["text"], "label": ""}) + "\n")
PY
cat >"$out/deck.toml" <<EOF
[run]
n_steps = 4
[parallel]
placement = "colocate"
[model]
init_from = "$model"
max_seq_len = 256
[data]
path = "$out/sft.jsonl"
[train]
mode = "sft"
global_batch_size = 8
[rollout]
max_new_tokens = 24
n_samples_per_prompt = 2
temperature = 1.0
EOF

$mpirun -np 2 "$slimpi" run "$out/deck.toml" --set run.dir="$out/sft" >"$out/sft.log" 2>&1 || { cat "$out/sft.log"; exit 1; }
grep -q "tokenizer: $model/tokenizer.json (900 ids, stop at 2, 0)" "$out/sft.log" || { cat "$out/sft.log"; exit 1; }
grep -q "^path = \"$model\" *# model.init_from" "$out/sft/deck.resolved.toml" \
  || { grep -n -A2 "\[tokenizer\]" "$out/sft/deck.resolved.toml"; exit 1; }

$mpirun -np 2 "$slimpi" generate "$out/deck.toml" --set data.path="$out/prompts.jsonl" --set run.dir="$out/gen" \
  >"$out/gen.log" 2>&1 || { cat "$out/gen.log"; exit 1; }
/usr/bin/python3 - "$cases" "$out/prompts.jsonl" "$out/gen/rollouts.h5" <<'PY'
import json, sys
import h5py
ids = {c["text"]: c["ids_with_specials"] for c in json.load(open(sys.argv[1]))["cases"]}
prompts = [json.loads(l)["prompt"] for l in open(sys.argv[2])]
with h5py.File(sys.argv[3]) as f:
    s = f["samples"]
    tok, off = s["tokens/values"][:], s["tokens/offsets"][:]
    plen, group, status = s["prompt_length"][:], s["group_index"][:], s["status"][:]
assert len(plen) == 2 * len(prompts), len(plen)
stopped = 0
for i in range(len(plen)):
    seq = tok[off[i]:off[i + 1]].tolist()
    want = ids[prompts[group[i]]]
    assert seq[:plen[i]] == want, (prompts[group[i]], seq[:plen[i]], want)
    response = seq[plen[i]:]
    assert all(t not in (0, 2) for t in response[:-1]), response  # generation stops at the first EOS
    stopped += response[-1] in (0, 2)
    assert max(response) < 900
print(f"hf_tokenizer_run: {len(plen)} samples, prompts encoded as tokenizers does, {stopped} ended at an EOS id")
PY

"$slimpi" export "$out/sft/ckpt/step_00000004" "$out/hf" >"$out/export.log" || { cat "$out/export.log"; exit 1; }
grep -q "3 tokenizer files\|2 tokenizer files" "$out/export.log" || { cat "$out/export.log"; exit 1; }
cmp "$model/tokenizer.json" "$out/hf/tokenizer.json"
/usr/bin/python3 - "$out/hf" <<'PY'
import json, sys
g = json.load(open(f"{sys.argv[1]}/generation_config.json"))
c = json.load(open(f"{sys.argv[1]}/config.json"))
assert g["eos_token_id"] == [2, 0] and g["pad_token_id"] == 0 and g["bos_token_id"] is None, g
assert c["vocab_size"] == 900 and c["architectures"] == ["Qwen2ForCausalLM"] and "slimpi_tokenizer" not in c, c
print("hf_tokenizer_run: the export carries the tokenizer files and their special ids")
PY

# Conversations: data lines holding message lists, rendered by data.chat_template.
# `slimpi generate` (chatml + Qwen2.5's default system prompt) must encode them as
# transformers' apply_chat_template does with Qwen2.5's own template (the fixture ids;
# the qwen_chat fixture tokenizer is this one plus markers these texts do not contain);
# an RL step (qwen3 template, string prompts as user turns) trains on them.
/usr/bin/python3 - tests/fixtures/chat/cases.json "$out" <<'PY'
import json, sys
cases = [c for c in json.load(open(sys.argv[1]))["cases"]
         if c["setting"] == "chatml_qwen2.5" and c["add_generation_prompt"] and "think>" not in c["text"]
         and "tool_response>" not in c["text"]]
json.dump(cases, open(f"{sys.argv[2]}/chat_cases.json", "w"))
with open(f"{sys.argv[2]}/chat_prompts.jsonl", "w") as f:
    for c in cases:
        f.write(json.dumps({"messages": c["messages"], "label": "x"}) + "\n")
with open(f"{sys.argv[2]}/chat_rl.jsonl", "w") as f:
    for i in range(16):
        f.write(json.dumps({"prompt": f"{i} + {i} =", "label": str(2 * i)}) + "\n")
PY
qwen_system="You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
$mpirun -np 2 "$slimpi" generate "$out/deck.toml" --set data.path="$out/chat_prompts.jsonl" \
  --set data.input_key=messages --set data.chat_template=chatml --set data.system_prompt="$qwen_system" \
  --set rollout.n_samples_per_prompt=1 --set run.dir="$out/chat_gen" >"$out/chat_gen.log" 2>&1 \
  || { cat "$out/chat_gen.log"; exit 1; }
/usr/bin/python3 - "$out/chat_cases.json" "$out/chat_gen/rollouts.h5" <<'PY'
import json, sys
import h5py
cases = json.load(open(sys.argv[1]))
with h5py.File(sys.argv[2]) as f:
    s = f["samples"]
    tok, off = s["tokens/values"][:], s["tokens/offsets"][:]
    plen, group = s["prompt_length"][:], s["group_index"][:]
assert len(plen) == len(cases), (len(plen), len(cases))
for i in range(len(plen)):
    assert tok[off[i]:off[i] + plen[i]].tolist() == cases[group[i]]["ids"], cases[group[i]]["messages"]
print(f"hf_tokenizer_run: {len(cases)} conversations encoded as transformers' apply_chat_template (Qwen2.5)")
PY
$mpirun -np 2 "$slimpi" run "$out/deck.toml" --set train.mode=rl --set data.path="$out/chat_rl.jsonl" \
  --set data.chat_template=qwen3 --set data.enable_thinking=false --set run.n_steps=1 \
  --set rollout.rollout_batch_size=4 --set rollout.max_new_tokens=8 --set run.dir="$out/chat_rl" \
  >"$out/chat_rl.log" 2>&1 || { cat "$out/chat_rl.log"; exit 1; }
/usr/bin/python3 - "$out/chat_rl/rollouts.h5" "$out/chat_cases.json" <<'PY'
import sys
import h5py
with h5py.File(sys.argv[1]) as f:
    s = f["samples"]
    tok, off, plen = s["tokens/values"][:], s["tokens/offsets"][:], s["prompt_length"][:]
# "<|im_start|>user\n" opens every prompt (ids 1 = <|im_start|>), "<think>\n\n</think>\n\n" ends it.
assert len(plen) == 8, len(plen)
for i in range(len(plen)):
    p = tok[off[i]:off[i] + plen[i]].tolist()
    assert p[0] == 1 and p.count(1) == 2, p
print("hf_tokenizer_run: an RL step trained on qwen3-rendered prompts")
PY

# A base model's tokenizer ends generations at <|endoftext|> alone: with a chat template
# its turn marker <|im_end|> (id 2) joins the stop ids, and no response runs past it.
base="$out/base_model"
cp -r "$model" "$base"
/usr/bin/python3 - "$base" <<'PY'
import json, sys
d = sys.argv[1]
g = json.load(open(f"{d}/generation_config.json")); g["eos_token_id"] = 0
json.dump(g, open(f"{d}/generation_config.json", "w"))
t = json.load(open(f"{d}/tokenizer_config.json")); t["eos_token"] = "<|endoftext|>"
json.dump(t, open(f"{d}/tokenizer_config.json", "w"))
PY
$mpirun -np 2 "$slimpi" generate "$out/deck.toml" --set model.init_from="$base" --set data.path="$out/chat_prompts.jsonl" \
  --set data.input_key=messages --set data.chat_template=chatml --set rollout.n_samples_per_prompt=4 \
  --set rollout.max_new_tokens=48 --set run.dir="$out/chat_base" >"$out/chat_base.log" 2>&1 \
  || { cat "$out/chat_base.log"; exit 1; }
grep -q "stop at 0)" "$out/chat_base.log" && grep -q "data.chat_template = chatml: <|im_end|> (id 2) ends a generation too" \
  "$out/chat_base.log" || { cat "$out/chat_base.log"; exit 1; }
/usr/bin/python3 - "$out/chat_base/rollouts.h5" <<'PY'
import sys
import h5py
with h5py.File(sys.argv[1]) as f:
    s = f["samples"]
    tok, off, plen, status = s["tokens/values"][:], s["tokens/offsets"][:], s["prompt_length"][:], s["status"][:]
ended = 0
for i in range(len(plen)):
    response = tok[off[i] + plen[i]:off[i + 1]].tolist()
    assert 2 not in response[:-1], response  # stopped at the first <|im_end|>
    ended += response[-1] == 2
print(f"hf_tokenizer_run: with a base tokenizer (EOS <|endoftext|>) {ended} of {len(plen)} chat responses ended at <|im_end|>")
PY

fails() {  # NAME PATTERN ARGS...
  local name=$1 pattern=$2; shift 2
  timeout 120 $mpirun -np 2 "$slimpi" "$@" --set run.dir="$out/$name" >"$out/$name.log" 2>&1 && {
    echo "$name: expected a failure"; cat "$out/$name.log"; exit 1; }
  [ $? -ne 124 ] || { echo "$name: hung"; exit 1; }
  grep -qF -- "$pattern" "$out/$name.log" || { echo "$name: no '$pattern'"; cat "$out/$name.log"; exit 1; }
}
echo '{"prompt": [{"role": "developer", "content": "x"}], "label": ""}' >"$out/bad_role.jsonl"
fails small_model "model.vocab_size = 260 (inputs/smoke_rl.toml:13) is smaller than the tokenizer's 900 ids" \
  run inputs/smoke_rl.toml --set tokenizer.path="$model"
fails no_tokenizer "tokenizer.path = \"$out\" (--set): no tokenizer.json there" run inputs/smoke_rl.toml \
  --set tokenizer.path="$out"
fails messages_without_template "chat_prompts.jsonl:1: key 'messages': holds a list of messages" \
  generate "$out/deck.toml" --set data.path="$out/chat_prompts.jsonl" --set data.input_key=messages
fails thinking_without_qwen3 "data.enable_thinking = false (--set) is a switch of the qwen3, qwen3_5, glm45 and glm47 templates" \
  run "$out/deck.toml" --set data.chat_template=chatml --set data.enable_thinking=false
fails llama3_without_bos "data.chat_template = llama3 (--set) starts every conversation with the tokenizer's bos_token" \
  run "$out/deck.toml" --set data.chat_template=llama3
fails unknown_role "role 'developer' is not one the chatml template renders" \
  generate "$out/deck.toml" --set data.path="$out/bad_role.jsonl" --set data.chat_template=chatml
echo "hf_tokenizer_run: OK"
