#!/usr/bin/env bash
# `slimpi run` with train.mode = "sft": np 2 colocated (2 data-parallel trainers) and
# np 3 split (1 trainer; rollout ranks idle in SFT). The loss must drop, the metrics
# and trainer_state.h5 (model under Hugging Face names, optimizer, RNG) must be
# readable, and both must compute the same losses: data parallelism (2 ranks vs 1)
# changes nothing but fp32 round-off.
# Usage: sft_run.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
common=(--set run.n_steps=40 --set train.global_batch_size=32 --set train.warmup_steps=5 --set train.lr=3e-3 --set model.hidden_size=64 --set model.intermediate_size=128)

$mpirun -np 2 "$slimpi" run inputs/sft_addition.toml "${common[@]}" --set run.dir="$out/colo" >"$out/colo.log" 2>&1 \
  || { cat "$out/colo.log"; exit 1; }
$mpirun -np 3 "$slimpi" run inputs/sft_addition.toml "${common[@]}" --set run.dir="$out/split" \
  --set parallel.placement=split --set parallel.trainer_ranks=1 --set parallel.rollout_ranks=2 \
  >"$out/split.log" 2>&1 || { cat "$out/split.log"; exit 1; }
test -f "$out/colo/trainer_state.h5" && test -f "$out/split/trainer_state.h5"

/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
losses = {}
for run in ["colo", "split"]:
    with h5py.File(f"{out}/{run}/metrics.h5") as f:
        loss = f["steps/train/loss"][:]
        assert loss.shape == (40,), loss.shape
        assert loss[:3].mean() > 4.5 and loss[-3:].mean() < 0.6 * loss[:3].mean(), loss
        assert np.all(f["steps/train/lr"][:] > 0)
        losses[run] = loss
    with h5py.File(f"{out}/{run}/trainer_state.h5") as f:
        w = f["model/model.layers.0.self_attn.q_proj.weight"]
        assert w.shape == (64, 64) and w.attrs["dtype"] in (b"float32", "float32")
        assert f["optimizer"].attrs["n_steps"] == 40
        assert "optimizer/exp_avg/lm_head.weight" in f and "rng/torch_cpu" in f
np.testing.assert_allclose(losses["colo"], losses["split"], rtol=1e-4)
print("sft_run: losses", losses["colo"][0], "->", losses["colo"][-1])
PY
# data.path with a slice (file.jsonl@[a:b]), as the docs allow: the SFT data is those records.
$mpirun -np 1 "$slimpi" run inputs/sft_addition.toml --set run.n_steps=1 --set train.global_batch_size=8 \
  --set model.hidden_size=32 --set model.intermediate_size=64 --set model.n_layers=1 \
  --set 'data.path=inputs/data/addition_sft.jsonl@[100:150]' --set run.dir="$out/sliced" >"$out/sliced.log" 2>&1 \
  || { cat "$out/sliced.log"; exit 1; }
grep -q "SFT data: 50 samples from inputs/data/addition_sft.jsonl@\[100:150\]" "$out/sliced.log" \
  || { cat "$out/sliced.log"; echo "FAIL: the slice was not applied"; exit 1; }
echo "sft_run: ok"
