#!/usr/bin/env bash
# Tensor parallelism (parallel.tensor_parallel) end to end, on the smoke policy (4 query
# heads over 2 key/value heads, q/k norms) with a reward that varies from the first step:
#  * np 4 split (2 trainer ranks: one tensor group of 2), np 2 colocated (one group of 2,
#    a KL loss: the reference model is split too) and np 4 colocated (TP 2 x DP 2) each
#    generate the tokens of the same run with whole models on every trainer rank and
#    log the same metrics to fp32 round-off (the engines get the gathered whole model
#    every step: a wrong gather would change the tokens); also with sequence
#    parallelism and with one_step_off;
#  * the distributed optimizer (DP 4; TP 2 x DP 2) gives the same run, and its job
#    steps (each rank's chunks of the moments saved in place and read back) equal its
#    straight run;
#  * job steps of a tensor-parallel run (2 + 2) equal the straight run bit for bit;
#  * a checkpoint holds whole tensors, each rank writing its own part: a run saved at
#    TP 2 x DP 2 resumes at TP 4 x DP 1 and at TP 1 x DP 4 (also with the distributed
#    optimizer, its moments re-chunked over 4) and continues as the straight run does; `slimpi export` writes
#    the whole model (the padded vocabulary rows dropped), and a tensor-parallel run
#    starts from that Hugging Face export;
#  * SFT with evaluation (the trainers gather a whole model to generate) matches;
#  * key/value heads replicated over a tensor group larger than their number (TP 4 over
#    the smoke policy's 2) generate the same tokens;
#  * colocated tensor-parallel engines (rollout.tensor_parallel = parallel.tensor_parallel:
#    each tensor group generates with the policy's own shards) generate the same tokens,
#    with sequence parallelism, the distributed optimizer and the KV cache freed while
#    training, across job steps bit for bit, and with replicated key/value heads; a bf16
#    copy of the shards runs;
#  * tensor-parallel engines (rollout.tensor_parallel = 2: one engine of 2 rollout ranks)
#    generate the tokens of two one-rank engines, with the sliced weight sync and with
#    the broadcast route (also with delta sync), with one_step_off, and across job steps bit for bit (and a
#    bf16 engine of 2 ranks runs);
#  * impossible layouts are refused with their numbers.
# Usage: tensor_parallel_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
# One optimizer step per rollout (global_batch_size = the rollout's 32 samples): with
# more, each step takes a slice of every data-parallel rank's share, so which samples
# meet in a step depends on the data-parallel size, which these layouts change.
base=(--set run.n_steps=4 --set model.qk_norm=true --set model.init_std=0.2 --set train.global_batch_size=32
      --set reward.style=command --set "reward.command=/usr/bin/python3 $root/tests/regression/ascii_reward.py" --set eval.path=)

args=(run inputs/smoke_rl.toml "${base[@]}")  # run NP NAME [--set ...] (run_helpers.sh)

echo "== np 4 split, 2 trainer ranks: tensor_parallel 2 vs 1"
run 4 split_tp1
run 4 split_tp2 --set parallel.tensor_parallel=2
grep -q "tensor parallelism: 1 group of 2 trainer ranks (data-parallel size 1); this rank is tensor rank 0: 2 of 4 query heads, 32 of 64 MLP columns, vocabulary rows 0..255 of 512 padded" "$out/split_tp2.log"
close split_tp1 split_tp2

echo "== colocated: np 2 (one group of 2, a split reference model) and np 4 (TP 2 x DP 2)"
kl=(--set train.use_kl_loss=true --set train.kl_loss_coef=0.01)
run 2 co2_tp1 --set parallel.placement=colocate "${kl[@]}"
run 2 co2_tp2 --set parallel.placement=colocate --set parallel.tensor_parallel=2 "${kl[@]}"
close co2_tp1 co2_tp2
run 2 co2_tp2_sp --set parallel.placement=colocate --set parallel.tensor_parallel=2 --set parallel.sequence_parallel=true \
  "${kl[@]}"
grep -q "sequence parallel: norms and residuals hold 1/2 of the tokens" "$out/co2_tp2_sp.log"
close co2_tp1 co2_tp2_sp
run 4 co4_tp1 --set parallel.placement=colocate
run 4 co4_tp2 --set parallel.placement=colocate --set parallel.tensor_parallel=2
grep -q "tensor parallelism: 2 groups of 2 trainer ranks (data-parallel size 2)" "$out/co4_tp2.log"
close co4_tp1 co4_tp2

echo "== key/value heads replicated: the smoke policy's 2 over a tensor group of 4 (np 4 colocated)"
run 4 co4_tp4 --set parallel.placement=colocate --set parallel.tensor_parallel=4
grep -q "key/value heads replicated: the model's 2 key/value heads are fewer than the 4 ranks of a tensor group, so each is held whole by 2 consecutive tensor ranks" \
  "$out/co4_tp4.log"
close co4_tp1 co4_tp4

echo "== colocated tensor-parallel engines: each tensor group generates with its own shards"
cetp=(--set parallel.placement=colocate --set parallel.tensor_parallel=2 --set rollout.tensor_parallel=2)
run 2 co2_etp2 "${cetp[@]}" "${kl[@]}"
grep -q "tensor-parallel engines: 1 engine of 2 ranks, each a tensor group of the trainer running the policy's own shards" \
  "$out/co2_etp2.log"
close co2_tp1 co2_etp2
# TP 2 x DP 2 with sequence parallelism and the distributed optimizer, the KV cache freed
# while training, across job steps
run 4 co4_etp2 "${cetp[@]}" --set parallel.sequence_parallel=true --set train.distributed_optimizer=true \
  --set rollout.offload_between_phases=true
close co4_tp1 co4_etp2
run 4 co4_etp2_chunked "${cetp[@]}" --set parallel.sequence_parallel=true --set train.distributed_optimizer=true \
  --set rollout.offload_between_phases=true --set run.job_steps=2
run 4 co4_etp2_chunked "${cetp[@]}" --set parallel.sequence_parallel=true --set train.distributed_optimizer=true \
  --set rollout.offload_between_phases=true
/usr/bin/python3 tests/regression/compare_runs.py "$out/co4_etp2" "$out/co4_etp2_chunked"
# key/value heads replicated in the engine too (TP 4 groups of the 2 heads)
run 4 co4_etp4 --set parallel.placement=colocate --set parallel.tensor_parallel=4 --set rollout.tensor_parallel=4
close co4_tp1 co4_etp4
# bf16 engines: a copy of each rank's shard, refreshed every step (its tokens are its own)
run 2 co2_etp2_bf16 "${cetp[@]}" --set rollout.precision=bf16
grep -q "running a copy of its shards refreshed at every step" "$out/co2_etp2_bf16.log"
steps_done "$out/co2_etp2_bf16" 4

echo "== the distributed optimizer: DP 4 and TP 2 x DP 2, and its job steps bit for bit"
run 4 co4_do --set parallel.placement=colocate --set train.distributed_optimizer=true
grep -q "distributed optimizer: the AdamW moments sharded over the 4 data-parallel ranks" "$out/co4_do.log"
close co4_tp1 co4_do
do_tp2=(--set parallel.placement=colocate --set parallel.tensor_parallel=2 --set train.distributed_optimizer=true)
run 4 co4_tp2_do "${do_tp2[@]}"
close co4_tp1 co4_tp2_do
run 4 co4_tp2_do_chunked "${do_tp2[@]}" --set run.job_steps=2
run 4 co4_tp2_do_chunked "${do_tp2[@]}" --set run.job_steps=2
/usr/bin/python3 tests/regression/compare_runs.py "$out/co4_tp2_do" "$out/co4_tp2_do_chunked"

echo "== one_step_off, np 4 split"
run 4 async_tp1 --set train.async=one_step_off
run 4 async_tp2 --set train.async=one_step_off --set parallel.tensor_parallel=2
close async_tp1 async_tp2

echo "== tensor-parallel engines (np 4 split: trainer TP 2 + one engine of 2 rollout ranks)"
etp=(--set parallel.tensor_parallel=2 --set rollout.tensor_parallel=2 --set rollout.check_weight_update=true)
run 4 split_etp2 "${etp[@]}"
grep -q "tensor-parallel engines: 1 engine of 2 rollout ranks (the first of each routes and samples); each rank holds 2 of 4 query heads, 1 of 2 key/value heads" \
  "$out/split_etp2.log"
close split_tp1 split_etp2
run 4 split_etp2_broadcast "${etp[@]}" --set rollout.weight_sync_route=broadcast  # gather, broadcast, keep a slice
close split_tp1 split_etp2_broadcast
# Delta sync on both routes: sliced (each pair's bytes as a delta) and broadcast (the
# engine's ranks update their whole staging copy).
run 4 split_etp2_delta "${etp[@]}" --set rollout.weight_sync=delta --set rollout.delta_anchor_interval=2
grep -q "weight sync: sliced" "$out/split_etp2_delta.log"
close split_tp1 split_etp2_delta
run 4 split_etp2_delta_broadcast "${etp[@]}" --set rollout.weight_sync=delta --set rollout.delta_anchor_interval=2 \
  --set rollout.weight_sync_route=broadcast
close split_tp1 split_etp2_delta_broadcast
run 4 split_tp2_sliced --set parallel.tensor_parallel=2 --set rollout.weight_sync_route=sliced \
  --set rollout.check_weight_update=true  # two one-rank engines, each sent both trainer shards
close split_tp1 split_tp2_sliced
# Whole trainers, a bf16 engine of 2 ranks: its row-parallel sums round in bf16 in another
# order than one rank's products, so its tokens are its own; the run must work and record.
run 4 split_tp1_etp2_bf16 --set rollout.tensor_parallel=2 --set rollout.precision=bf16
steps_done "$out/split_tp1_etp2_bf16" 4
# An fp8 engine of 2 ranks: "auto" takes the broadcast route (a block is quantised whole);
# each rank de-quantises the whole image and keeps its shard (sync/fp8_weights.h).
run 4 split_tp1_etp2_fp8 --set rollout.tensor_parallel=2 --set rollout.precision=fp8 --set rollout.check_weight_update=true
grep -q "weight sync: broadcast" "$out/split_tp1_etp2_fp8.log"
steps_done "$out/split_tp1_etp2_fp8" 4
run 4 async_etp2 --set train.async=one_step_off "${etp[@]}"
close async_tp1 async_etp2
run 4 split_etp2_chunked "${etp[@]}" --set run.job_steps=2
run 4 split_etp2_chunked "${etp[@]}" --set run.job_steps=2
/usr/bin/python3 tests/regression/compare_runs.py "$out/split_etp2" "$out/split_etp2_chunked"
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
# The sliced sync moves what the engine's two ranks hold: the whole model once (what the
# broadcast sends), plus the replicated norms a second time.
with h5py.File(f"{out}/split_etp2/metrics.h5") as fa, h5py.File(f"{out}/split_etp2_broadcast/metrics.h5") as fb:
    a, b = fa["steps/perf/weight_sync_bytes"][:], fb["steps/perf/weight_sync_bytes"][:]
    assert np.all(a > b) and np.all(a < 1.01 * b), (a, b)
print("tensor_parallel_runs: tensor-parallel engines generate the one-rank engines' tokens")
PY

echo "== job steps 2 + 2 = 4 straight, bit for bit"
run 4 split_tp2_chunked --set parallel.tensor_parallel=2 --set run.job_steps=2
run 4 split_tp2_chunked --set parallel.tensor_parallel=2 --set run.job_steps=2
/usr/bin/python3 tests/regression/compare_runs.py "$out/split_tp2" "$out/split_tp2_chunked"

echo "== a checkpoint of whole tensors: saved at TP 2 x DP 2, resumed at TP 4 x DP 1 and TP 1 x DP 4 (and with the distributed optimizer)"
kv4=(--set parallel.placement=colocate --set model.n_kv_heads=4)
run 4 layout_straight "${kv4[@]}" --set parallel.tensor_parallel=2
for tp in 4 1; do
  run 4 "layout_to_tp$tp" "${kv4[@]}" --set parallel.tensor_parallel=2 --set run.job_steps=2
  run 4 "layout_to_tp$tp" "${kv4[@]}" --set parallel.tensor_parallel=$tp
  close layout_straight "layout_to_tp$tp"
done
# The distributed optimizer's moments, each rank's chunks written in place, re-chunked on
# resume over another data-parallel size (2 -> 4).
do=(--set train.distributed_optimizer=true)
run 4 layout_do_to_tp1 "${kv4[@]}" "${do[@]}" --set parallel.tensor_parallel=2 --set run.job_steps=2
run 4 layout_do_to_tp1 "${kv4[@]}" "${do[@]}" --set parallel.tensor_parallel=1
close layout_straight layout_do_to_tp1
"$slimpi" export "$out/split_tp2/ckpt/step_00000004" "$out/hf" >"$out/export.log"
PYTHONPATH=tests/regression /usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
from safetensors_file import SafetensorsFile
out = sys.argv[1]
st = SafetensorsFile(f"{out}/hf/model.safetensors")
header = st.header
assert header["model.embed_tokens.weight"]["shape"] == [260, 32], header["model.embed_tokens.weight"]
assert header["lm_head.weight"]["shape"] == [260, 32]
# Against the final model of the run with whole models on every trainer rank.
with h5py.File(f"{out}/split_tp1/trainer_state.h5") as f:
    for k in header:
        if k == "__metadata__":
            continue
        assert np.allclose(st.tensor(k), f["model/" + k][:], rtol=1e-4, atol=1e-6), k
print(f"tensor_parallel_runs: the export holds the {len(header) - 1} whole tensors of the run's final model")
PY
$mpirun -np 2 "$slimpi" run inputs/smoke_rl.toml --set run.n_steps=1 --set eval.path= --set parallel.tensor_parallel=2 \
  --set parallel.placement=colocate --set model.init_from="$out/hf" --set run.dir="$out/from_hf" \
  >"$out/from_hf.log" 2>&1 || { cat "$out/from_hf.log"; exit 1; }
grep -q "this rank is tensor rank 0" "$out/from_hf.log"

echo "== SFT with evaluation at np 2"
sft=(--set run.n_steps=6 --set model.hidden_size=32 --set model.n_layers=2 --set model.n_heads=4 --set model.n_kv_heads=2
     --set "eval.path=inputs/data/addition_eval.jsonl@[0:16]" --set eval.interval=3
     --set eval.n_samples=2 --set train.global_batch_size=16 --set rollout.max_new_tokens=8)
for tp in 1 2; do
  $mpirun -np 2 "$slimpi" run inputs/sft_addition.toml "${sft[@]}" --set parallel.tensor_parallel=$tp \
    --set run.dir="$out/sft_tp$tp" >"$out/sft_tp$tp.log" 2>&1 || { cat "$out/sft_tp$tp.log"; exit 1; }
done
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
with h5py.File(f"{out}/sft_tp1/metrics.h5") as fa, h5py.File(f"{out}/sft_tp2/metrics.h5") as fb:
    for c in ("train/loss", "train/grad_norm", "eval/pass@1", "eval/mean_reward"):
        x, y = fa["steps/" + c][:], fb["steps/" + c][:]
        assert np.allclose(x, y, rtol=1e-4, atol=1e-6, equal_nan=True), (c, x, y)
    assert np.sum(np.isfinite(fb["steps/eval/pass@1"][:])) == 3  # steps 0, 3 and the final one
print("tensor_parallel_runs: SFT with evaluation, tensor_parallel 2 == 1")
PY

echo "== refusals"
# (one refusal as a job: every rank stops; the rest through `slimpi check`, one process)
refused tp_not_dividing "it must divide the number of trainer ranks, 2" 4 --set parallel.tensor_parallel=4
check_refuses sp_without_tp "parallel.sequence_parallel = true (--set) splits the tokens over the tensor-parallel group, but parallel.tensor_parallel = 1" \
  4 --set parallel.sequence_parallel=true
check_refuses tp_three "it must divide the number of trainer ranks, 4" 4 --set parallel.placement=colocate \
  --set parallel.tensor_parallel=3
check_refuses ep_over_dp "it must divide the number of data-parallel trainer ranks of a tensor rank, 2 (4 trainer ranks / parallel.tensor_parallel = 2" \
  4 --set parallel.placement=colocate --set parallel.tensor_parallel=2 --set model.n_experts=4 \
  --set model.moe_intermediate_size=16 --set parallel.expert_parallel=4
check_refuses kv_heads "model.n_kv_heads = 6 (--set) neither is divisible by 4 nor divides it" 4 \
  --set parallel.placement=colocate --set parallel.tensor_parallel=4 --set model.n_heads=12 --set model.n_kv_heads=6 \
  --set model.hidden_size=48
check_refuses mlp_width "model.intermediate_size = 66 (--set) is not divisible by 4" 4 --set parallel.placement=colocate \
  --set parallel.tensor_parallel=4 --set model.n_kv_heads=4 --set model.intermediate_size=66
check_refuses etp_not_dividing "rollout.tensor_parallel = 3 (--set) makes engines of 3 rollout ranks: it must divide the 2 rollout ranks" \
  4 --set rollout.tensor_parallel=3
check_refuses etp_colocated "so it must equal parallel.tensor_parallel = 2 (--set), or be 1" \
  4 --set parallel.placement=colocate --set parallel.tensor_parallel=2 --set rollout.tensor_parallel=4
check_refuses fp8_sliced 'rollout.precision = "fp8" (--set) quantises each whole weight matrix in 128 x 128 blocks at every sync: rollout.weight_sync_route = "sliced" (--set) moves slices' \
  4 --set rollout.precision=fp8 --set rollout.tensor_parallel=2 --set rollout.weight_sync_route=sliced
check_refuses fp8_colocated_tp 'colocated engines under model parallelism (parallel.tensor_parallel = 2, --set' \
  2 --set rollout.precision=fp8 --set parallel.placement=colocate --set parallel.tensor_parallel=2
check_refuses etp_kv_heads "rollout.tensor_parallel = 4 (--set) splits each engine's layers over 4 rollout ranks: model.n_kv_heads = 6 (--set) neither" \
  6 --set parallel.rollout_ranks=4 --set rollout.tensor_parallel=4 --set model.n_heads=12 --set model.n_kv_heads=6 \
  --set model.hidden_size=48
echo "tensor_parallel_runs: OK"
