#!/usr/bin/env bash
# What one trainer rank holds under each model-parallel layout, and what activation
# recomputation saves; measured by perf/train_memory (build/perf/train_memory).
#   perf/model_parallel_memory.sh [BUILD_DIR] [MPIRUN FLAGS]
# Part 1: bytes of parameters + gradient buffers + AdamW moments per model parameter on
# one rank (fp32 masters), at (TP, DP) = (1,1), (1,4) with the distributed optimizer,
# (2,2), (2,2) with it, (4,1), against Megatron's 16/t (plain) and (8 + 8/d)/t
# (distributed optimizer) bytes a parameter. Part 2: the growth of the peak resident set
# over two optimizer steps of 4096 tokens at np 1 (activations and temporaries) with
# train.recompute = none / selective / full.
set -euo pipefail
build=${1:-build}
mpirun=${2:-"mpirun --allow-run-as-root --oversubscribe"}
bin="$build/perf/train_memory"
[ -x "$bin" ] || { echo "build $bin first (cmake --build $build --target train_memory)"; exit 1; }
export OMP_NUM_THREADS=1
shape=(512 4 4096)  # hidden, layers, vocabulary
echo "## bytes per parameter on one trainer rank (fp32; d 512, 4 layers, vocabulary 4096; 512 tokens a rank)"
echo
echo "| TP | DP | distributed optimizer | params | grads | AdamW moments | bytes / parameter | Megatron | measured / Megatron |"
echo "|---|---|---|---|---|---|---|---|---|"
for layout in "1 1 0" "4 1 0" "4 1 1" "4 2 0" "4 2 1" "4 4 0"; do  # NP TP DO
  read -r np tp dist <<<"$layout"
  [ "$tp" -le "$np" ] || continue
  line=$($mpirun -np "$np" "$bin" "$tp" "$dist" none 512 "${shape[@]}" | grep '"rank": 0')
  /usr/bin/python3 - "$line" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
P, t, d = r["model_params"], r["tp"], r["dp"]
total = r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"]
megatron = ((8 + 8 / d) if r["distributed_optimizer"] else 16) / t
print(f"| {t} | {d} | {'yes' if r['distributed_optimizer'] else 'no'} | {r['param_bytes'] / P:.2f} | "
      f"{r['grad_bytes'] / P:.2f} | {r['optimizer_bytes'] / P:.2f} | {total / P:.2f} | {megatron:.2f} | "
      f"{total / P / megatron:.3f} |")
PY
done
echo
echo "## activation memory: growth of the peak resident set over two steps of 4096 tokens (np 1)"
echo
echo "| train.recompute | peak RSS growth (MB) | vs none |"
echo "|---|---|---|"
base=""
for mode in none selective full; do
  line=$($mpirun -np 1 "$bin" 1 0 "$mode" 4096 "${shape[@]}")
  grow=$(/usr/bin/python3 -c "import json,sys; r=json.loads(sys.argv[1]); print((r['peak_rss_after'] - r['peak_rss_before']) / 2**20)" "$line")
  [ -n "$base" ] || base=$grow
  /usr/bin/python3 -c "import sys; g, b = float(sys.argv[1]), float(sys.argv[2]); print(f'| $mode | {g:.0f} | {g / b:.2f} |')" "$grow" "$base"
done
