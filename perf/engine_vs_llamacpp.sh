#!/usr/bin/env bash
# slimpi's engine against llama.cpp on the CPU: a Qwen3-0.6B-shaped model with random
# weights (perf/make_llamacpp_model.py: one set of weights, a Hugging Face directory for
# slimpi and a GGUF file for llama.cpp, both fp32), 27-token prompts, 32 new tokens, one
# sample a prompt, 1, 8 and 64 sequences at once, 2 threads each. slimpi: `slimpi
# generate` on one rank (continuous batching, the paged KV cache, temperature 1),
# perf/rollout_time = the whole batch from the first prefill to the last token.
# llama.cpp: llama-batched-bench (its prompts not shared: every sequence its own 27
# tokens, then 32 decode steps of all sequences; it computes logits but does not sample),
# T = T_PP + T_TG. The two alternate, twice each; the median of each is kept. slimpi runs
# with OMP_WAIT_POLICY=ACTIVE: its one rank owns both cores, and its OpenMP threads then
# spin between the ~250 parallel regions of a decode step, as llama.cpp's thread pool does
# (PASSIVE, right where ranks share cores, made the 1-sequence run ~25% slower).
#
# Needs (developer-only, perf/README.md "llama.cpp"): a venv with transformers
# (SLIMPI_HF_PYTHON, default /opt/slimpi/trl-dev/bin/python) and llama-cpp-python's
# sources with llama-batched-bench built (LLAMA_CPP_DIR, default
# /opt/slimpi/llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp).
# Usage: perf/engine_vs_llamacpp.sh [SEQUENCES ...]   (default: 1 8 64)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${SLIMPI_HF_PYTHON:-/opt/slimpi/trl-dev/bin/python}
llama=${LLAMA_CPP_DIR:-/opt/slimpi/llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp}
bench=$llama/build/bin/llama-batched-bench
[ -x "$bench" ] || { echo "engine_vs_llamacpp: $bench missing (perf/README.md says how to build it)"; exit 1; }
counts=("$@"); [ ${#counts[@]} -gt 0 ] || counts=(1 8 64)
out=${SLIMPI_PERF_OUT:-$(mktemp -d)}
[ -n "${SLIMPI_PERF_OUT:-}" ] || trap 'rm -rf "$out"' EXIT
flags=(--oversubscribe --bind-to none); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
cd "$root"
[ -f "$out/model.gguf" ] || "$py" perf/make_llamacpp_model.py "$out" "$llama" >"$out/make.log" 2>&1 \
  || { tail -20 "$out/make.log"; exit 1; }
# Prompts of 27 tokens in the model's tokenizer (checked below).
for n in "${counts[@]}"; do
  for i in $(seq "$n"); do printf '{"prompt": "%s"}\n' "$(printf 'QWhat is %05d plus %05d? A:' "$i" "$((i * 7))")"; done \
    >"$out/prompts_$n.jsonl"
done
cat >"$out/deck.toml" <<EOF
[run]
threads = 2
[model]
init_from = "$out/hf"
[data]
path = "$out/prompts_1.jsonl"
[rollout]
n_samples_per_prompt = 1
temperature = 1.0
max_new_tokens = 32
max_running = 64
max_batch_tokens = 2048
kv_cache_tokens = 8192
block_size = 16
EOF
for n in "${counts[@]}"; do
  for rep in 1 2; do
    dir="$out/slimpi_${n}_$rep"
    OMP_WAIT_POLICY=ACTIVE mpirun "${flags[@]}" -np 1 build/slimpi generate "$out/deck.toml" \
      --set data.path="$out/prompts_$n.jsonl" --set run.dir="$dir" >"$dir.log" 2>&1 || { tail -20 "$dir.log"; exit 1; }
    "$bench" -m "$out/model.gguf" -c $((n * 59 + 64)) -b 2048 -ub 512 -npp 27 -ntg 32 -npl "$n" -t 2 -tb 2 \
      --output-format jsonl >"$out/llama_${n}_$rep.jsonl" 2>"$out/llama_${n}_$rep.log" \
      || { tail -20 "$out/llama_${n}_$rep.log"; exit 1; }
  done
done
/usr/bin/python3 - "$out" "${counts[@]}" <<'PY'
import json
import statistics
import sys
import h5py
out, counts = sys.argv[1], [int(c) for c in sys.argv[2:]]
print("engine_vs_llamacpp: Qwen3-0.6B shape, fp32, 2 threads, 27-token prompts, 32 new tokens; "
      "seconds for the whole batch (median of 2 alternated runs)")
print("| sequences | slimpi s | llama.cpp s (prefill + decode) | slimpi tokens/s | llama.cpp tokens/s | slimpi / llama.cpp |")
print("|---|---|---|---|---|---|")
for n in counts:
    ours, theirs, theirs_pp, theirs_tg = [], [], [], []
    for rep in (1, 2):
        with h5py.File(f"{out}/slimpi_{n}_{rep}/metrics.h5") as f:
            ours.append(float(f["steps"]["perf/rollout_time"][-1]))
        with h5py.File(f"{out}/slimpi_{n}_{rep}/rollouts.h5") as f:
            smp = f["samples"]
            plen = smp["prompt_length"][:]
            assert (plen == 27).all(), f"prompt lengths {set(plen.tolist())}, want 27"
            rlen = smp["response_length"][:]
        row = [json.loads(l) for l in open(f"{out}/llama_{n}_{rep}.jsonl") if l.startswith("{")][-1]
        theirs.append(row["t"])
        theirs_pp.append(row["t_pp"])
        theirs_tg.append(row["t_tg"])
    generated = int(rlen.sum())
    t_ours, t_theirs = statistics.median(ours), statistics.median(theirs)
    # Throughput: generated tokens over the whole batch's seconds (a random model's sample
    # may stop early at its end-of-text id: the count is slimpi's own).
    ours_tps, theirs_tps = generated / t_ours, 32 * n / t_theirs
    print(f"| {n} | {t_ours:.2f} | {t_theirs:.2f} ({statistics.median(theirs_pp):.2f} + "
          f"{statistics.median(theirs_tg):.2f}) | {ours_tps:.1f} | {theirs_tps:.1f} | {ours_tps / theirs_tps:.2f} |")
PY
