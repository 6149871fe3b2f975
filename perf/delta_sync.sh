#!/usr/bin/env bash
# Delta weight sync (rollout.weight_sync = "delta", docs/parallelism.md) on real weight
# changes: the quickstart's GRPO stage (inputs/quickstart_grpo.toml, np 4: 2 trainers +
# 2 rollout ranks, from the SFT policy of `bash jobs/quickstart.sh`) for STEPS steps,
# evaluation off, in five jobs: bf16 rollout with whole syncs, bf16 with deltas, fp32
# with deltas (anchors only at the first sync), and bf16 whole and delta at train.lr =
# 1e-6 (slime's usual RL learning rate; the deck's is 3e-4); then fp8 rollout
# (rollout.precision = "fp8", docs/model_engine.md) whole and delta at 1e-6. Prints per job the bytes a sync moved and
# its time (medians over the steps after the first), the density of the deltas (changed
# elements / elements), and delta / whole ratios of bytes and time.
# Usage: perf/delta_sync.sh [SFT_STATE [STEPS]]
#   (defaults: runs/quickstart_sft_s1/trainer_state.h5, 20 steps)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
sft=${1:-runs/quickstart_sft_s1/trainer_state.h5}
steps=${2:-20}
[ -f "$sft" ] || { echo "delta_sync: no $sft (run bash jobs/quickstart.sh first)"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
job() {  # job NAME PRECISION [--set ...]
  local name=$1 precision=$2; shift 2
  OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE mpirun "${flags[@]}" -np 4 build/slimpi run inputs/quickstart_grpo.toml \
    --set model.init_from="$sft" --set run.n_steps="$steps" --set eval.interval=0 --set checkpoint.interval=0 \
    --set rollout.precision="$precision" --set run.dir="$out/$name" "$@" >"$out/$name.log" 2>&1 \
    || { cat "$out/$name.log"; exit 1; }
}
delta=(--set rollout.weight_sync=delta --set rollout.delta_anchor_interval=1000000)
job bf16_full bf16
job bf16_delta bf16 "${delta[@]}"
job fp32_delta fp32 "${delta[@]}"
job bf16_full_lr1e-6 bf16 --set train.lr=1e-6
job bf16_delta_lr1e-6 bf16 "${delta[@]}" --set train.lr=1e-6
job fp8_full_lr1e-6 fp8 --set train.lr=1e-6
job fp8_delta_lr1e-6 fp8 "${delta[@]}" --set train.lr=1e-6
/usr/bin/python3 - "$out" <<'PY'
import sys
sys.path.insert(0, "perf")
from sync_stats import sync_stats
out = sys.argv[1]
def sync(name):
    return sync_stats(f"{out}/{name}")
rows = {name: sync(name) for name in ("bf16_full", "bf16_delta", "fp32_delta", "bf16_full_lr1e-6", "bf16_delta_lr1e-6",
                                     "fp8_full_lr1e-6", "fp8_delta_lr1e-6")}
for name, (b, t, d, dlo, dhi, first, _) in rows.items():
    print(f"{name:18s} {b:12.0f} bytes/sync  {t * 1e3:8.3f} ms/sync  density {d:.4f} ({dlo:.4f}-{dhi:.4f})  "
          f"first sync {first:.0f} bytes")
for name, base in (("bf16_delta", "bf16_full"), ("fp32_delta", "bf16_full"), ("bf16_delta_lr1e-6", "bf16_full_lr1e-6"),
                   ("fp8_full_lr1e-6", "bf16_full_lr1e-6"), ("fp8_delta_lr1e-6", "fp8_full_lr1e-6"),
                   ("fp8_delta_lr1e-6", "bf16_full_lr1e-6")):
    (b, t), (bw, tw) = rows[name][:2], rows[base][:2]
    print(f"{name} / {base}: bytes {b / bw:.4f}x, time {t / tw:.2f}x")
PY
