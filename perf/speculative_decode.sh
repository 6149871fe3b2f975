#!/usr/bin/env bash
# Decode tokens/s with and without speculative decoding (rollout.speculative = "mtp",
# 3-token chains from one MTP depth) at 1, 8 and 64 running sequences, `slimpi generate`
# on one rank, the two modes alternated twice in one run (the median of each kept).
# The model: d 1024, 8 layers, 16 heads, MLP 2816, vocabulary 32000, one MTP depth (about
# 130M parameters, 0.5 GB in fp32: a decode step of one sequence reads every weight
# once, so it is bound by memory bandwidth, not arithmetic), random weights from the
# seed (model.init_std sets how peaked its distributions are, and so the acceptance a
# random draft gets; what is measured is reported with it). Prompts of ~10 tokens, one
# sample each, 48 new tokens at temperature 1.
# Usage: perf/speculative_decode.sh [INIT_STD]   (default 0.02)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
init_std=${1:-0.02}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
flags=(--oversubscribe --bind-to none); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
cd "$root"
shape=(--set model.init_from= --set model.vocab_size=32000 --set model.hidden_size=1024 --set model.n_layers=8
       --set model.n_heads=16 --set model.n_kv_heads=16 --set model.intermediate_size=2816 --set model.max_seq_len=96
       --set model.mtp_num_layers=1 --set model.init_std="$init_std")
for running in 1 8 64; do
  head -"$running" inputs/data/addition_eval.jsonl >"$out/prompts_$running.jsonl"
  for rep in 1 2; do
    for mode in none mtp; do
      dir="$out/r${running}_${mode}_$rep"
      OMP_WAIT_POLICY=PASSIVE mpirun "${flags[@]}" -np 1 build/slimpi generate inputs/generate_addition.toml \
        "${shape[@]}" --set data.path="$out/prompts_$running.jsonl" --set rollout.n_samples_per_prompt=1 \
        --set rollout.max_new_tokens=48 --set rollout.max_running=64 --set rollout.kv_cache_tokens=8192 \
        --set rollout.block_size=16 --set rollout.speculative=$mode --set rollout.spec_num_steps=3 \
        --set run.threads=0 --set run.dir="$dir" >"$dir.log" 2>&1 || { tail -20 "$dir.log"; exit 1; }
    done
  done
done
/usr/bin/python3 - "$out" "$init_std" <<'PY'
import statistics
import sys
import h5py
out, init_std = sys.argv[1], sys.argv[2]
print(f"speculative_decode: init_std {init_std}; tokens/s (median of 2 alternated runs)")
print("| running sequences | none | mtp (3-token chains) | mtp / none | accept rate | tokens per verify pass |")
print("|---|---|---|---|---|---|")
for running in (1, 8, 64):
    tps, rate, length = {}, None, None
    for mode in ("none", "mtp"):
        xs = []
        for rep in (1, 2):
            with h5py.File(f"{out}/r{running}_{mode}_{rep}/metrics.h5") as f:
                s = f["steps"]
                xs.append(float(s["perf/rollout_tokens_per_s"][-1]))
                if mode == "mtp":
                    rate = float(s["rollout/spec_accept_rate"][-1])
                    length = float(s["rollout/spec_accept_length"][-1])
        tps[mode] = statistics.median(xs)
    print(f"| {running} | {tps['none']:.1f} | {tps['mtp']:.1f} | {tps['mtp'] / tps['none']:.2f} | {rate:.3f} | {length:.2f} |")
PY
