#!/usr/bin/env bash
# Delta weight sync on a Qwen3-0.6B-shaped policy (perf/qwen3_shape.sh; random weights)
# over STEPS GRPO steps, the measurement issue 30 asks for beside the quickstart's
# (perf/delta_sync.sh): np 2 split (one trainer rank, one bf16 engine), 4 prompts x 4
# samples x 32 new tokens, train.lr = 1e-6 (slime's usual RL rate). Random weights earn
# no reward, so the policy gradient is zero; an entropy bonus (train.entropy_coef =
# 0.01) gives every weight a gradient, and AdamW then moves each by about the learning
# rate, as a real step does. Two jobs: whole syncs, and deltas (anchors only at the
# first sync). Prints per job the bytes a sync moved, its time and the deltas' density
# (medians over the syncs after the first), and delta / whole.
# Usage: perf/delta_sync_qwen3.sh [STEPS]   (default 4; about 2 minutes a step on 2 cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
steps=${1:-4}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
flags=(--oversubscribe --bind-to none); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
source perf/qwen3_shape.sh
grep -v '^kv_cache_tokens' inputs/smoke_rl.toml >"$out/deck.toml"
work=(--set run.n_steps="$steps" --set eval.path= --set rollout.rollout_batch_size=4 --set rollout.n_samples_per_prompt=4
      --set rollout.max_new_tokens=32 --set rollout.kv_cache_memory_gb=1 --set train.global_batch_size=16
      --set checkpoint.interval=0 --set parallel.trainer_ranks=1 --set rollout.precision=bf16 --set train.lr=1e-6
      --set train.entropy_coef=0.01 --set run.threads=0)
job() {  # NAME [--set ...]
  local name=$1; shift
  OMP_WAIT_POLICY=PASSIVE mpirun "${flags[@]}" -np 2 build/slimpi run "$out/deck.toml" "${qwen3_shape[@]}" "${work[@]}" \
    --set run.dir="$out/$name" "$@" >"$out/$name.log" 2>&1 || { tail -30 "$out/$name.log"; exit 1; }
  echo "delta_sync_qwen3: $name done"
}
job full
job delta --set rollout.weight_sync=delta --set rollout.delta_anchor_interval=1000000
/usr/bin/python3 - "$out" <<'PY'
import sys
sys.path.insert(0, "perf")
from sync_stats import sync_stats
out = sys.argv[1]
def sync(name):
    return sync_stats(f"{out}/{name}")
rows = {name: sync(name) for name in ("full", "delta")}
for name, (b, t, d, dlo, dhi, first, n) in rows.items():
    print(f"{name:6s} {n} syncs: {b / 1e6:10.2f} MB/sync  {t:7.3f} s/sync  density {d:.4f} ({dlo:.4f}-{dhi:.4f})  "
          f"first sync {first / 1e6:.2f} MB")
(b, t), (bw, tw) = rows["delta"][:2], rows["full"][:2]
print(f"delta / full: bytes {b / bw:.4f}x, time {t / tw:.2f}x")
PY
