#!/usr/bin/env bash
# Engine scaling: the same `slimpi generate` workload at 1 and 2 rollout ranks (one
# core and one torch thread each), tokens/s from each run's metrics.h5, and the ratio.
# Usage: perf/engine_scaling.sh [N_PROMPTS] [PROMPT_TOKENS] [NEW_TOKENS]
#   default: 200 addition prompts as they are (~8 tokens), 8 samples, 16 new tokens.
#   GRPO-shaped (the Real-lengths issue): perf/engine_scaling.sh 16 512 512: prompts of
#   512 tokens (distinct from their first token, so only a group's samples share one),
#   8 samples each, responses of up to 512 tokens (the random model stops at EOS now
#   and then; tokens/s counts what was generated).
# The model is the quickstart-size one (inputs/sft_addition.toml's shape), randomly
# initialised: the speed does not depend on the weights.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-200}
prompt_tokens=${2:-0}
new_tokens=${3:-16}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
if [ "$prompt_tokens" -gt 0 ]; then
  /usr/bin/python3 - "$out/prompts.jsonl" "$n" "$prompt_tokens" <<'PY'
import json, sys
path, n, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "w") as f:
    for i in range(n):
        text = (f"{i}: " + "7+8=15; " * length)[: length - 1]  # BOS + length - 1 bytes
        f.write(json.dumps({"prompt": text, "label": "0"}) + "\n")
PY
else
  head -"$n" "$root/inputs/data/addition_eval.jsonl" >"$out/prompts.jsonl"
fi
max_seq=$(( (prompt_tokens > 16 ? prompt_tokens : 16) + new_tokens + 16 ))
flags=(--oversubscribe); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
cd "$root"
for np in 1 2; do
  cmd=(mpirun "${flags[@]}" -np $np build/slimpi generate inputs/generate_addition.toml --set model.init_from=
       --set data.path="$out/prompts.jsonl" --set run.dir="$out/np$np" --set run.threads=1
       --set rollout.max_new_tokens="$new_tokens" --set model.max_seq_len="$max_seq"
       --set rollout.kv_cache_tokens=$(( 64 * max_seq )) --set rollout.block_size=16)
  [ "$prompt_tokens" -gt 0 ] && cmd+=(--set rollout.max_batch_tokens=2048)
  echo "engine_scaling: ${cmd[*]}"
  OMP_WAIT_POLICY=PASSIVE "${cmd[@]}" >"$out/np$np.log" 2>&1 || { cat "$out/np$np.log"; exit 1; }
done
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
out = sys.argv[1]
rate = {}
for np_ in (1, 2):
    with h5py.File(f"{out}/np{np_}/metrics.h5") as f:
        rate[np_] = f["steps/perf/rollout_tokens_per_s"][0]
print(f"engine_scaling: 1 rank {rate[1]:.0f} tokens/s, 2 ranks {rate[2]:.0f} tokens/s, ratio {rate[2] / rate[1]:.2f}")
PY
