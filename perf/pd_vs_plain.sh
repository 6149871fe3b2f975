#!/usr/bin/env bash
# Prefill/decode disaggregation (rollout.prefill_ranks, docs/model_engine.md) against
# plain engines on long prompts with short responses: `slimpi generate` on N_PROMPTS
# prompts of 3000 byte tokens, 4 samples each, 16 new tokens, with a 10M-parameter
# byte-level policy (d 256, 6 layers, seeded init) in bf16, at the same rank count:
# plain engines (every rank prefills and decodes) against 1 prefill + (NP - 1) decode
# engines. Prints per job: seconds, generated tokens/s, each pool's busy fraction, the
# KV moved (MB) and the seconds spent sending and receiving it, and PD / plain.
# Usage: perf/pd_vs_plain.sh [NP [N_PROMPTS]]   (defaults: 2, 24)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
np=${1:-2}
n_prompts=${2:-24}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
/usr/bin/python3 - "$out/prompts.jsonl" "$n_prompts" <<'PY'
import json, random, sys
rng = random.Random(7)
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz +-=0123456789") for _ in range(2998))
        f.write(json.dumps({"prompt": text}) + "\n")
PY
cat >"$out/deck.toml" <<EOF2
[run]
name = "pd_vs_plain"
seed = 1
[model]
vocab_size = 260
hidden_size = 256
n_layers = 6
n_heads = 8
n_kv_heads = 2
intermediate_size = 688
max_seq_len = 3072
[data]
path = "$out/prompts.jsonl"
[rollout]
precision = "bf16"
n_samples_per_prompt = 4
temperature = 1.0
max_new_tokens = 16
max_running = 16
max_batch_tokens = 4096
kv_cache_tokens = 65536
block_size = 16
EOF2
job() {  # NAME [--set ...]
  local name=$1; shift
  OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE mpirun "${flags[@]}" -np "$np" build/slimpi generate "$out/deck.toml" \
    --set run.dir="$out/$name" "$@" >"$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
}
job plain
job pd --set rollout.prefill_ranks=1
/usr/bin/python3 - "$out" "$np" <<'PY'
import sys
import h5py
out, np_ = sys.argv[1], sys.argv[2]
rows = {}
for name in ("plain", "pd"):
    with h5py.File(f"{out}/{name}/metrics.h5") as f:
        rows[name] = {c: float(f["steps/" + c][0]) for c in f["steps"].attrs["columns"].decode().split()}
    r = rows[name]
    line = (f"{name:6s} np {np_}: {r['perf/rollout_time']:.2f} s, {r['perf/rollout_tokens_per_s']:.1f} generated tokens/s, "
            f"prefill computed {r['rollout/prefill_tokens_computed']:.0f} tokens")
    if name == "pd":
        line += (f"; busy prefill {r['rollout/pd_prefill_busy']:.2f} decode {r['rollout/pd_decode_busy']:.2f}; "
                 f"KV moved {r['perf/kv_transfer_bytes'] / 1e6:.1f} MB ({r['perf/kv_transfer_tokens']:.0f} positions), "
                 f"send {r['perf/kv_transfer_send_s']:.2f} s, receive {r['perf/kv_transfer_receive_s']:.2f} s")
    print(line)
print(f"pd / plain time: {rows['pd']['perf/rollout_time'] / rows['plain']['perf/rollout_time']:.2f}x")
PY
