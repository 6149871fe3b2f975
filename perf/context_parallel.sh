#!/usr/bin/env bash
# Context parallelism (parallel.context_parallel): what one trainer rank allocates and how
# long one optimizer step takes for one long sequence split over CP = 1, 2, 4 ranks,
# measured by perf/train_memory (one RL step: the log-prob pass, then forward, backward
# and AdamW), one thread a rank.
#   perf/context_parallel.sh [BUILD_DIR] [MPIRUN FLAGS]
# Shape: d 256, 4 layers, 4 query heads of 64 over 2 key/value heads, vocabulary 4096;
# 8192 and 32768 tokens. Columns: torch's peak allocation growth on rank 0 over the
# step (activations, the gathered keys and values, temporaries, the AdamW moments made at
# the first step) and its ratio to CP 1's; the step's seconds, tokens/s and the speed-up
# over CP 1. With train.recompute = selective the gathered keys and values are not kept
# for backward (the attention, gather included, runs again there). CP 4 oversubscribes a
# machine of fewer than 4 cores: its time is then not a scaling number.
set -euo pipefail
build=${1:-build}
mpirun=${2:-"mpirun --allow-run-as-root --oversubscribe"}
bin="$build/perf/train_memory"
[ -x "$bin" ] || { echo "build $bin first (cmake --build $build --target train_memory)"; exit 1; }
export OMP_NUM_THREADS=1
echo "## one sequence over CP ranks (d 256, 4 layers, 4 heads / 2 kv heads, vocabulary 4096; $(getconf _NPROCESSORS_ONLN) cores)"
echo
echo "| tokens | train.recompute | CP | peak allocation growth (MB) | vs CP 1 | step (s) | tokens/s | speed-up |"
echo "|---|---|---|---|---|---|---|---|"
for tokens in 8192 32768; do
  for mode in none selective; do
    base=""
    for cp in 1 2 4; do
      line=$($mpirun -np "$cp" "$bin" 1 0 "$mode" "$tokens" 256 4 4096 fp32 "$cp" 1 2 | grep '"rank": 0')
      read -r mb s < <(/usr/bin/python3 -c "import json,sys; r=json.loads(sys.argv[1]); print((r['peak_allocated'] - r['allocated_before_steps']) / 2**20, r['step_s'])" "$line")
      [ -n "$base" ] || base="$mb $s"
      /usr/bin/python3 -c "import sys; mb, s, mb0, s0 = map(float, sys.argv[1:]); print(f'| $tokens | $mode | $cp | {mb:.0f} | {mb / mb0:.2f} | {s:.2f} | {$tokens / s:.0f} | {s0 / s:.2f} |')" "$mb" "$s" $base
    done
  done
done
