#!/usr/bin/env bash
# What one trainer rank holds under each model-parallel layout, and what activation
# recomputation saves; measured by perf/train_memory (build/perf/train_memory).
#   perf/model_parallel_memory.sh [BUILD_DIR] [MPIRUN FLAGS]
# Part 1, in fp32 and in bf16 (train.precision: bf16 products over fp32 masters): bytes
# of parameters + gradient buffers + AdamW moments per model parameter on one rank, at
# (TP, DP) = (1,1), (1,4) with the distributed optimizer, (2,2), (2,2) with it, (4,1),
# against Megatron's formula (fp32: 16/t plain, (8 + 8/d)/t distributed; bf16
# parameters with fp32 gradients: 18/t plain, (6 + 12/d)/t distributed), and the peak
# of the bytes torch allocated on that rank over two optimizer steps of 512 tokens (the
# state plus activations and temporaries) per parameter. Part 2: what two optimizer
# steps of 4096 tokens at np 1 add to torch's peak allocation and to the peak resident
# set (activations and temporaries) with train.recompute = none / selective / full.
set -euo pipefail
build=${1:-build}
mpirun=${2:-"mpirun --allow-run-as-root --oversubscribe"}
bin="$build/perf/train_memory"
[ -x "$bin" ] || { echo "build $bin first (cmake --build $build --target train_memory)"; exit 1; }
export OMP_NUM_THREADS=1
shape=(512 4 4096)  # hidden, layers, vocabulary
echo "## bytes per parameter on one trainer rank (d 512, 4 layers, vocabulary 4096; 512 tokens a rank)"
echo
echo "| precision | TP | DP | distributed optimizer | params | grads | AdamW moments | state / parameter | Megatron | state / Megatron | peak allocated / parameter |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for precision in fp32 bf16; do
  for layout in "1 1 0" "4 1 1" "4 2 0" "4 2 1" "4 4 0"; do  # NP TP DO
    read -r np tp dist <<<"$layout"
    line=$($mpirun -np "$np" "$bin" "$tp" "$dist" none 512 "${shape[@]}" "$precision" | grep '"rank": 0')
    /usr/bin/python3 - "$line" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
P, t, d = r["model_params"], r["tp"], r["dp"]
total = r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"]
if r["precision"] == "bf16":
    megatron = ((6 + 12 / d) if r["distributed_optimizer"] else 18) / t
else:
    megatron = ((8 + 8 / d) if r["distributed_optimizer"] else 16) / t
print(f"| {r['precision']} | {t} | {d} | {'yes' if r['distributed_optimizer'] else 'no'} | {r['param_bytes'] / P:.2f} | "
      f"{r['grad_bytes'] / P:.2f} | {r['optimizer_bytes'] / P:.2f} | {total / P:.2f} | {megatron:.2f} | "
      f"{total / P / megatron:.3f} | {r['peak_allocated'] / P:.2f} |")
PY
  done
done
echo
echo "## activation memory: what two steps of 4096 tokens add to the peaks (np 1, fp32)"
echo
echo "| train.recompute | torch's peak allocation growth (MB) | vs none | peak RSS growth (MB) | vs none |"
echo "|---|---|---|---|---|"
base=""
for mode in none selective full; do
  line=$($mpirun -np 1 "$bin" 1 0 "$mode" 4096 "${shape[@]}")
  read -r alloc rss < <(/usr/bin/python3 -c "import json,sys; r=json.loads(sys.argv[1]); print((r['peak_allocated'] - r['allocated_before_steps']) / 2**20, (r['peak_rss_after'] - r['peak_rss_before']) / 2**20)" "$line")
  [ -n "$base" ] || base="$alloc $rss"
  /usr/bin/python3 -c "import sys; a, r, a0, r0 = map(float, sys.argv[1:]); print(f'| $mode | {a:.0f} | {a / a0:.2f} | {r:.0f} | {r / r0:.2f} |')" "$alloc" "$rss" $base
done
