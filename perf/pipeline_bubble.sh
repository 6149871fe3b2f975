#!/usr/bin/env bash
# Pipeline parallelism's bubble: the share of an optimizer step each stage spends waiting
# for its neighbours, measured by perf/train_memory (Trainer::pipeline_wait_seconds: the
# time in receives and in completing sends, over the step's 1F1B schedule), against
# the 1F1B schedule's idle fraction (p − 1) / (m + p − 1) for m micro-batches.
#   perf/pipeline_bubble.sh [BUILD_DIR] [MPIRUN FLAGS] [PP] [STAGE_LAYERS]
# PP stages (default 2), one rank a stage, one thread a rank (run it on at least PP
# cores); d 256, 4 layers, 4 heads, vocabulary 4096; m = 1, 2, 4, 8 micro-batches of one
# 512-token sample each; the second of two steps is reported. STAGE_LAYERS: the layers of
# each stage ("3,1": the last stage's head and loss weigh about two layers; default even).
# A stage's idle share is the schedule's bubble plus its wait for slower stages.
set -euo pipefail
build=${1:-build}
mpirun=${2:-"mpirun --allow-run-as-root --oversubscribe"}
pp=${3:-2}
layers=${4:-}
bin="$build/perf/train_memory"
[ -x "$bin" ] || { echo "build $bin first (cmake --build $build --target train_memory)"; exit 1; }
export OMP_NUM_THREADS=1
echo "## the 1F1B bubble at PP $pp (stages ${layers:-even}; d 256, 4 layers, 512-token micro-batches; $(getconf _NPROCESSORS_ONLN) cores)"
echo
echo "| micro-batches m | step (s) | idle share per stage (first .. last) | mean | (p − 1) / (m + p − 1) |"
echo "|---|---|---|---|---|"
for m in 1 2 4 8; do
  $mpirun -np "$pp" "$bin" 1 0 none 512 256 4 4096 fp32 1 2 4 "$pp" "$m" $layers | grep '^{' | /usr/bin/python3 -c "
import json, sys
rows = sorted((json.loads(l) for l in sys.stdin), key=lambda r: r['stage'])
p, m = len(rows), $m
idle = [r['pipeline_wait_s'] / r['train_s'] for r in rows]
step = max(r['train_s'] for r in rows)
print(f'| {m} | {step:.3f} | ' + ' / '.join(f'{x:.2f}' for x in idle) + f' | {sum(idle) / p:.2f} | {(p - 1) / (m + p - 1):.2f} |')
"
done
