#!/usr/bin/env bash
# One colocated RL step at real lengths (the Real-lengths issue's measurement): np 2,
# 16 prompts of 32..3000 byte tokens, 2 samples each, 8 new tokens, on
# inputs/smoke_rl.toml's 2-layer d-32 model. Reports the step's wall time and each
# rank's peak RSS (/usr/bin/time). With a second slimpi binary (an older build), runs
# the same step with it right after, and prints the time and memory ratios. Further
# arguments (--set KEY=VALUE ...) go to both runs.
# Usage: perf/real_length_step.sh [BASELINE_SLIMPI|-] [--set KEY=VALUE ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
baseline=${1:-}
[ "$baseline" != "-" ] || baseline=
[ $# -eq 0 ] || shift
extra=("$@")
[ -x /usr/bin/time ] || { echo "real_length_step: needs /usr/bin/time (apt-get install time)"; exit 1; }
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
/usr/bin/python3 - "$out/prompts.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(16):
        n = 32 + round(i * (3000 - 32) / 15)       # tokens: BOS + n - 1 bytes
        body = ("12+34=46; " * 400)[: n - 1 - 4]   # filler, then the question
        f.write(json.dumps({"prompt": body + "1+1=", "label": "2"}) + "\n")
PY
flags=(--oversubscribe); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
cd "$root"
run_step() {  # NAME SLIMPI
  local name=$1 slimpi=$2
  local t0 t1
  t0=$(date +%s.%N)
  OMP_WAIT_POLICY=PASSIVE mpirun "${flags[@]}" -np 2 /usr/bin/time -a -o "$out/$name.rss" -f "peak_rss_kb %M" "$slimpi" run \
    inputs/smoke_rl.toml --set run.n_steps=1 --set parallel.placement=colocate --set run.threads=1 \
    --set data.path="$out/prompts.jsonl" --set eval.path= --set model.max_seq_len=3016 \
    --set rollout.rollout_batch_size=16 --set rollout.n_samples_per_prompt=2 --set rollout.max_new_tokens=8 \
    --set rollout.block_size=16 --set rollout.kv_cache_tokens=65536 --set train.global_batch_size=32 \
    --set run.dir="$out/$name" "${extra[@]}" >"$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
  t1=$(date +%s.%N)
  local rss
  rss=$(grep -o 'peak_rss_kb [0-9]*' "$out/$name.rss" | awk '{printf "%s%.0f", sep, $2 / 1024; sep=" / "}')
  echo "real_length_step: $name: $(echo "$t1 - $t0" | bc) s, peak RSS per rank (MB): $rss" | tee -a "$out/summary"
}
run_step current build/slimpi
[ -z "$baseline" ] || run_step baseline "$baseline"
if [ -n "$baseline" ]; then
  awk '/: current:/ {c = $3; for (i = 1; i <= NF; ++i) if ($i ~ /^[0-9]+$/) cm = ($i > cm ? $i : cm)}
       /: baseline:/ {b = $3; for (i = 1; i <= NF; ++i) if ($i ~ /^[0-9]+$/) bm = ($i > bm ? $i : bm)}
       END {printf "real_length_step: baseline / current: time %.1fx, largest peak RSS %.1fx\n", b / c, bm / cm}' \
    "$out/summary"
fi
