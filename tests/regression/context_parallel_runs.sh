#!/usr/bin/env bash
# Context parallelism (parallel.context_parallel) end to end, on the smoke policy with a
# reward that varies from the first step:
#  * np 4 split (2 trainer ranks: one context group of 2), np 2 colocated (one group of
#    2, a KL loss: the reference model is split too) and np 4 colocated (CP 2 x DP 2, TP 2 x
#    CP 2 with sequence parallelism, CP 4, CP 2 x DP 2 with the distributed optimizer)
#    generate the tokens of the same run with whole sequences on every trainer rank and
#    log the same metrics to fp32 round-off (a wrong gradient would change the next
#    step's tokens); also with one_step_off;
#  * job steps of a context-parallel run (2 + 2) equal its straight run bit for bit;
#  * a checkpoint is layout-free: a run saved at TP 2 x CP 2 resumes at CP 1 (DP 4) and at
#    CP 4, and continues as the straight run does;
#  * SFT matches;
#  * exact on-policy at CP 2 trains on the engine's bits (train/rollout abs_diff 0);
#  * impossible layouts are refused with their numbers.
# Usage: context_parallel_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
# One optimizer step per rollout (see tensor_parallel_runs.sh); n_kv_heads 4 splits over TP 2 and 4.
base=(--set run.n_steps=4 --set model.qk_norm=true --set model.init_std=0.2 --set train.global_batch_size=32
      --set model.n_kv_heads=4 --set reward.style=command --set "reward.command=/usr/bin/python3 $root/tests/regression/ascii_reward.py"
      --set eval.path=)
args=(run inputs/smoke_rl.toml "${base[@]}")  # run NP NAME [--set ...] (run_helpers.sh)

echo "== np 4 split, 2 trainer ranks: context_parallel 2 vs 1"
run 4 split_cp1
run 4 split_cp2 --set parallel.context_parallel=2
grep -q "context parallelism: 1 group of 2 trainer ranks (data-parallel size 1); this rank is context rank 0: chunks 0 and 3 of the 4 of every packed sequence" \
  "$out/split_cp2.log"
close split_cp1 split_cp2
run 4 async_cp1 --set train.async=one_step_off
run 4 async_cp2 --set train.async=one_step_off --set parallel.context_parallel=2
close async_cp1 async_cp2

echo "== colocated: np 2 (one group of 2, a split reference model) and np 4"
kl=(--set train.use_kl_loss=true --set train.kl_loss_coef=0.01)
co=(--set parallel.placement=colocate)
run 2 co2_cp1 "${co[@]}" "${kl[@]}"
run 2 co2_cp2 "${co[@]}" "${kl[@]}" --set parallel.context_parallel=2
close co2_cp1 co2_cp2
run 4 co4_cp1 "${co[@]}"
run 4 co4_cp2 "${co[@]}" --set parallel.context_parallel=2
grep -q "context parallelism: 2 groups of 2 trainer ranks (data-parallel size 2)" "$out/co4_cp2.log"
close co4_cp1 co4_cp2
run 4 co4_cp4 "${co[@]}" --set parallel.context_parallel=4
close co4_cp1 co4_cp4
run 4 co4_tp2_cp2 "${co[@]}" --set parallel.tensor_parallel=2 --set parallel.context_parallel=2 \
  --set parallel.sequence_parallel=true
close co4_cp1 co4_tp2_cp2
run 4 co4_cp2_do "${co[@]}" --set parallel.context_parallel=2 --set train.distributed_optimizer=true
grep -q "distributed optimizer: the AdamW moments sharded over the 4 data and context-parallel ranks" "$out/co4_cp2_do.log"
close co4_cp1 co4_cp2_do

echo "== job steps 2 + 2 = 4 straight, bit for bit"
run 4 co4_cp2_chunked "${co[@]}" --set parallel.context_parallel=2 --set run.job_steps=2
run 4 co4_cp2_chunked "${co[@]}" --set parallel.context_parallel=2
/usr/bin/python3 tests/regression/compare_runs.py "$out/co4_cp2" "$out/co4_cp2_chunked"

echo "== layout-free checkpoints: saved at TP 2 x CP 2, resumed at CP 1 (DP 4) and CP 4"
for cp in 1 4; do
  run 4 "layout_to_cp$cp" "${co[@]}" --set parallel.tensor_parallel=2 --set parallel.context_parallel=2 --set run.job_steps=2
  run 4 "layout_to_cp$cp" "${co[@]}" --set parallel.context_parallel=$cp
  close co4_tp2_cp2 "layout_to_cp$cp"
done

echo "== SFT at np 2"
sft=(--set run.n_steps=4 --set model.hidden_size=32 --set model.n_layers=2 --set model.n_heads=4 --set model.n_kv_heads=2
     --set eval.path= --set train.global_batch_size=16)
for cp in 1 2; do
  $mpirun -np 2 "$slimpi" run inputs/sft_addition.toml "${sft[@]}" --set parallel.context_parallel=$cp \
    --set run.dir="$out/sft_cp$cp" >"$out/sft_cp$cp.log" 2>&1 || { cat "$out/sft_cp$cp.log"; exit 1; }
done
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
with h5py.File(f"{out}/sft_cp1/metrics.h5") as a, h5py.File(f"{out}/sft_cp2/metrics.h5") as b:
    la, lb = a["steps/train/loss"][:], b["steps/train/loss"][:]
    assert np.allclose(la, lb, rtol=1e-5, atol=1e-6), (la, lb)
print("context_parallel_runs: SFT at CP 2 logs CP 1's losses", la)
PY

echo "== refusals"
refused cp3 "parallel.tensor_parallel × parallel.context_parallel = 1 × 3 = 3 must divide the number of trainer ranks, 4" \
  4 "${co[@]}" --set parallel.context_parallel=3

echo "== exact on-policy: CP 2 trains on the engine's bits (abs_diff 0), as CP 1 does"
exact=(--set train.on_policy=exact --set train.normalize_advantages=true)
run 2 exact_cp2 "${co[@]}" "${exact[@]}" --set parallel.context_parallel=2
/usr/bin/python3 - "$out/exact_cp2" <<'PY'
import sys
import h5py
with h5py.File(sys.argv[1] + "/metrics.h5") as f:
    d = f["steps/train/train_rollout_logprob_abs_diff"][:]
    assert (d == 0).all(), d
print("context_parallel_runs: exact on-policy at CP 2: train/rollout abs_diff", d)
PY
echo "context_parallel_runs: OK"
