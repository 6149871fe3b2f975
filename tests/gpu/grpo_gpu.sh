#!/usr/bin/env bash
# A 30-step colocated GRPO run on the GPU (run.device = cuda, np 1) on the task of
# tests/regression/precision_runs.sh: the reward rises and the trainer's log-probs
# equal the engine's within 1e-5 (fp32); the same in bf16/bf16 (mismatch reported).
# Exit 77 (ctest: skipped) where no GPU is visible.
# Usage: grpo_gpu.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
slimpi=$1; root=$2; mpirun=$3
if "$slimpi" --version | grep -q "gpus: *none"; then
  echo "grpo_gpu: skipped, no GPU visible ($("$slimpi" --version | grep cuda:))"
  exit 77
fi
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
cd "$root"
run() {  # name train_precision rollout_precision
  $mpirun -np 1 "$slimpi" run inputs/smoke_rl.toml --set run.dir="$out/$1" --set run.device=cuda \
    --set parallel.placement=colocate --set train.precision="$2" --set rollout.precision="$3" \
    --set run.n_steps=30 --set eval.interval=0 --set reward.style=command \
    --set "reward.command=python3 $root/tests/regression/digit_reward.py" --set train.lr=3e-3 \
    --set rollout.rollout_batch_size=16 --set rollout.n_samples_per_prompt=8 --set train.global_batch_size=128 \
    >"$out/$1.log" 2>&1 || { cat "$out/$1.log"; exit 1; }
  grep -q "device cuda:0" "$out/$1.log" || { echo "grpo_gpu: $1 did not run on the GPU"; cat "$out/$1.log"; exit 1; }
}
run fp32 fp32 fp32
run bf16 bf16 bf16
python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
for name, limit in (("fp32", 1e-5), ("bf16", None)):
    s = h5py.File(f"{out}/{name}/metrics.h5")["steps"]
    r = s["rollout/raw_reward"][:30]
    d = np.nanmax(s["train/train_rollout_logprob_abs_diff"][:30])
    print(f"grpo_gpu {name}: reward {r[:5].mean():.4f} -> {r[-5:].mean():.4f}, "
          f"max train/rollout log-prob |diff| {d:.3g}")
    assert r[-5:].mean() > 3 * max(r[:5].mean(), 1e-3), f"{name}: the reward did not rise"
    if limit is not None:
        assert d < limit, f"{name}: train/rollout mismatch {d} >= {limit}"
print("grpo_gpu: ok")
PY
