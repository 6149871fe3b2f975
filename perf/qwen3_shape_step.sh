#!/usr/bin/env bash
# A Qwen3-0.6B-shaped policy (d 1024, 28 layers, 16 heads / 8 KV heads, head dim 128,
# MLP 3072, vocabulary 151936, tied embeddings, q/k norms; random weights from the seed)
# on the model-parallelism issue's workload: GRPO steps of 16 samples (4 prompts x 4)
# x 32 new tokens, `rollout.kv_cache_memory_gb = 1`, 2 steps. Layouts (each a separate
# job, one after the other):
#   np1        colocated on one rank, train.recompute = full, the KV cache released
#              between phases (the best np-1 setting of perf/results/2026-12-02.md)
#   np4_split  2 trainer ranks as one tensor group (parallel.tensor_parallel = 2) and
#              one tensor-parallel engine of 2 rollout ranks (rollout.tensor_parallel =
#              2), the sliced weight sync between them
#   np4_split_bf16  the same with rollout.precision = bf16
#   np4_colocated  4 colocated ranks as TP 2 x DP 2 with the distributed optimizer, each
#              tensor group an engine running the policy's own shards (rollout.
#              tensor_parallel = 2), train.recompute = full, the KV cache released
#              between phases
#   trl        TRL's GRPOTrainer, same shape and workload (perf/trl_grpo_step.py; a venv
#              with trl: SLIMPI_TRL_PYTHON, default /opt/slimpi/trl-dev/bin/python)
# Reported: each rank's peak RSS (the kernel's high-water mark, /usr/bin/time) and the
# second step's time (perf/step_time). Exact-match rewards of random weights are 0, so
# the advantages are too, but every forward, backward, AdamW step and weight sync runs.
# Usage: perf/qwen3_shape_step.sh [LAYOUT ...]   (default: np1 np4_split)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
layouts=("$@")
[ ${#layouts[@]} -gt 0 ] || layouts=(np1 np4_split)
[ -x /usr/bin/time ] || { echo "qwen3_shape_step: needs /usr/bin/time (apt-get install time)"; exit 1; }
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
flags=(--oversubscribe --bind-to none); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
cd "$root"
# The smoke deck without its KV-cache size (kv_cache_memory_gb sizes it here).
grep -v '^kv_cache_tokens' inputs/smoke_rl.toml >"$out/deck.toml"
source perf/qwen3_shape.sh
work=(--set run.n_steps=2 --set eval.path= --set rollout.rollout_batch_size=4 --set rollout.n_samples_per_prompt=4
      --set rollout.max_new_tokens=32 --set rollout.kv_cache_memory_gb=1
      --set train.global_batch_size=16 --set checkpoint.interval=0 --set run.threads=0)
for layout in "${layouts[@]}"; do
  if [ "$layout" = trl ]; then  # TRL's GRPOTrainer on the same model and workload (perf/trl_grpo_step.py)
    python=${SLIMPI_TRL_PYTHON:-/opt/slimpi/trl-dev/bin/python}
    [ -x "$python" ] || { echo "qwen3_shape_step: trl needs a venv with trl (SLIMPI_TRL_PYTHON; docs/building.md)"; exit 1; }
    OMP_NUM_THREADS=2 /usr/bin/time -o "$out/trl.rss" -f "%M" "$python" perf/trl_grpo_step.py "$root" \
      >"$out/trl.log" 2>&1 || { tail -30 "$out/trl.log"; exit 1; }
    echo "qwen3_shape_step: trl: peak RSS (MB) $(( $(tail -1 "$out/trl.rss") / 1024 )); $(grep 'step times' "$out/trl.log")"
    continue
  fi
  case $layout in
    np1) np=1; args=(--set parallel.placement=colocate --set train.recompute=full
                     --set rollout.offload_between_phases=true) ;;
    np4_split) np=4; args=(--set parallel.tensor_parallel=2 --set rollout.tensor_parallel=2) ;;
    np4_split_bf16) np=4; args=(--set parallel.tensor_parallel=2 --set rollout.tensor_parallel=2
                                --set rollout.precision=bf16) ;;
    np4_colocated) np=4; args=(--set parallel.placement=colocate --set parallel.tensor_parallel=2
                               --set rollout.tensor_parallel=2 --set train.distributed_optimizer=true
                               --set train.recompute=full --set rollout.offload_between_phases=true) ;;
    *) echo "qwen3_shape_step: unknown layout $layout"; exit 1 ;;
  esac
  OMP_WAIT_POLICY=PASSIVE mpirun "${flags[@]}" -np $np sh -c \
    '/usr/bin/time -o "$0.rss.${OMPI_COMM_WORLD_RANK:-0}" -f "%M" "$@"' "$out/$layout" build/slimpi run \
    "$out/deck.toml" "${qwen3_shape[@]}" "${work[@]}" "${args[@]}" --set run.dir="$out/$layout" \
    >"$out/$layout.log" 2>&1 || { tail -30 "$out/$layout.log"; exit 1; }
  /usr/bin/python3 - "$out/$layout" "$np" "$layout" <<'PY'
import sys
import h5py
run, np_, layout = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rss = [int(open(f"{run}.rss.{r}").read().split()[-1]) / 1024 for r in range(np_)]
with h5py.File(f"{run}/metrics.h5") as f:
    step = f["steps/perf/step_time"][1]
print(f"qwen3_shape_step: {layout}: peak RSS per rank (MB) " + " / ".join(f"{x:.0f}" for x in rss) +
      f"; step 2: {step:.1f} s")
PY
done
