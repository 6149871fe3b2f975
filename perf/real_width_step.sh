#!/usr/bin/env bash
# Released models' real widths at reduced depth, loaded from Hugging Face shards, generate
# and take RL steps at np 4 with tensor and expert parallelism; each rank's peak memory.
# Shapes (perf/make_real_width_model.py; random bf16 weights, widths from the released
# config.json, 1 layer, 4 routed experts, vocabulary 8192):
#   deepseek_v3  latent attention (128 heads, latents 1536 / 512), DeepSeekMoE experts
#                of 2048 + a shared one, YaRN
#   glm45_air    96 heads / 8 key/value heads, half-rotary, experts of 1408 + a shared one
# Layout: 2 trainer ranks with the experts sharded over them (parallel.expert_parallel =
# 2), the distributed optimizer and full recomputation; 2 rollout ranks as one
# tensor-parallel engine (rollout.tensor_parallel = 2) in bf16, fed by the sliced weight
# sync. (Four colocated ranks as TP 2 x EP 2 ran out of this VM's 24 GiB.) Work: 2 GRPO
# steps of 8 samples (2 prompts x 4) x 16 new tokens.
# Reported: each rank's peak RSS (/usr/bin/time's high-water mark) and the second step's
# time. The models are made once into $SLIMPI_REAL_WIDTH_DIR (default /tmp/slimpi_real_width).
# Usage: perf/real_width_step.sh [SHAPE ...]   (default: deepseek_v3 glm45_air)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(deepseek_v3 glm45_air)
python=${SLIMPI_DEV_PYTHON:-/opt/slimpi/hf-dev/bin/python}
models=${SLIMPI_REAL_WIDTH_DIR:-/tmp/slimpi_real_width}
[ -x /usr/bin/time ] || { echo "real_width_step: needs /usr/bin/time (apt-get install time)"; exit 1; }
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
flags=(--oversubscribe --bind-to none); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
cd "$root"
# The smoke deck's data, rollout and reward, without its model (config.json gives it) or
# KV-cache size (kv_cache_memory_gb sizes it here).
/usr/bin/python3 - inputs/smoke_rl.toml "$out/deck.toml" <<'PY'
import sys
lines, skip = [], False
for line in open(sys.argv[1]):
    if line.startswith("["):
        skip = line.strip() == "[model]"
    if not skip and not line.startswith("kv_cache_tokens"):
        lines.append(line)
open(sys.argv[2], "w").writelines(lines)
PY
work=(--set run.n_steps=2 --set eval.path= --set rollout.rollout_batch_size=2 --set rollout.n_samples_per_prompt=4
      --set rollout.max_new_tokens=16 --set rollout.kv_cache_memory_gb=0.25 --set train.global_batch_size=8
      --set checkpoint.interval=0 --set run.threads=0 --set model.max_seq_len=128)
layout=(--set parallel.placement=split --set parallel.trainer_ranks=2 --set parallel.expert_parallel=2
        --set rollout.tensor_parallel=2 --set rollout.precision=bf16 --set train.distributed_optimizer=true
        --set train.recompute=full)
for shape in "${shapes[@]}"; do
  dir="$models/$shape"
  [ -f "$dir/config.json" ] || "$python" perf/make_real_width_model.py "$dir" "$shape"
  OMP_WAIT_POLICY=PASSIVE mpirun "${flags[@]}" -np 4 sh -c \
    '/usr/bin/time -o "$0.rss.${OMPI_COMM_WORLD_RANK:-0}" -f "%M" "$@"' "$out/$shape" build/slimpi run \
    "$out/deck.toml" --set model.init_from="$dir" "${work[@]}" "${layout[@]}" --set run.dir="$out/$shape" \
    >"$out/$shape.log" 2>&1 || { tail -30 "$out/$shape.log"; exit 1; }
  /usr/bin/python3 - "$out/$shape" "$shape" "$out/$shape.log" <<'PY'
import sys
import h5py
run, shape, log = sys.argv[1], sys.argv[2], sys.argv[3]
rss = [int(open(f"{run}.rss.{r}").read().split()[-1]) / 1024 for r in range(4)]
with h5py.File(f"{run}/metrics.h5") as f:
    step = f["steps/perf/step_time"][1]
    n = len(f["steps/perf/step_time"])
said = [l.split("] ", 1)[-1].strip() for l in open(log)
        if l.split("] ", 1)[-1].startswith(("policy:", "expert parallelism:", "tensor-parallel engine"))]
print(f"real_width_step: {shape}: {n} steps; peak RSS per rank (MB) " + " / ".join(f"{x:.0f}" for x in rss) +
      f" (trainer 0, 1, rollout 2, 3); step 2: {step:.1f} s")
for line in said:
    print(f"  {line}")
PY
done
