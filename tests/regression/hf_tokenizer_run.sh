#!/usr/bin/env bash
# A Hub-shaped checkpoint end to end: model.init_from = a Hugging Face directory with a
# byte-level BPE tokenizer.json (tests/fixtures/hf/qwen2_with_tokenizer). The run takes
# its shape from config.json and its vocabulary from tokenizer.json (tokenizer.path
# resolved to the directory, recorded in deck.resolved.toml): SFT trains 4 steps;
# `slimpi generate` encodes prompts exactly as the `tokenizers` library does (ids of the
# fixture cases) and stops on the tokenizer's EOS ids; the export carries the tokenizer
# files and their special ids. A model too small for the tokenizer, or a tokenizer.path
# without tokenizer.json, stops every rank cleanly.
# Usage: hf_tokenizer_run.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
slimpi=$1; root=$2; mpirun=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
cd "$root"
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

fails() {  # NAME PATTERN ARGS...
  local name=$1 pattern=$2; shift 2
  timeout 120 $mpirun -np 2 "$slimpi" "$@" --set run.dir="$out/$name" >"$out/$name.log" 2>&1 && {
    echo "$name: expected a failure"; cat "$out/$name.log"; exit 1; }
  [ $? -ne 124 ] || { echo "$name: hung"; exit 1; }
  grep -qF -- "$pattern" "$out/$name.log" || { echo "$name: no '$pattern'"; cat "$out/$name.log"; exit 1; }
}
fails small_model "model.vocab_size = 260 (inputs/smoke_rl.toml:13) is smaller than the tokenizer's 900 ids" \
  run inputs/smoke_rl.toml --set tokenizer.path="$model"
fails no_tokenizer "tokenizer.path = \"$out\" (--set): no tokenizer.json there" run inputs/smoke_rl.toml \
  --set tokenizer.path="$out"
echo "hf_tokenizer_run: OK"
