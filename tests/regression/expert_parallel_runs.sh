#!/usr/bin/env bash
# Expert parallelism (parallel.expert_parallel) end to end, on an MoE policy (8 experts,
# top-2, both layers sparse) with a reward that varies from the first step:
#  * np 4 split (2 trainer ranks, one group of 2), np 2 colocated (one group of 2) and
#    np 4 colocated (two groups of 2: the experts' gradients reduced over their
#    replicas) each generate exactly the tokens of the same run with every expert on
#    every trainer rank, and log the same metrics to fp32 round-off (the engines get the
#    gathered whole model every step: a wrong gather would change the tokens); with a
#    KL loss (a sharded reference model), routing replay, and one_step_off;
#  * job steps of an expert-parallel run (2 + 2) equal the straight run bit for bit;
#  * a checkpoint holds the whole model: resuming an expert-parallel run with
#    expert_parallel = 1 continues it (same tokens), and `slimpi export` writes it; an
#    expert-parallel run starts from that Hugging Face export;
#  * SFT with evaluation (the trainers gather a whole model to generate) matches;
#  * a DeepSeekMoE model training an MoE MTP depth gives the same run at expert_parallel 2;
#  * impossible group sizes, a dense model, and GPUs over MPI are refused by name.
# Usage: expert_parallel_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
moe=(--set run.n_steps=4 --set model.n_experts=8 --set model.n_experts_per_tok=2 --set model.moe_intermediate_size=32
     --set model.qk_norm=true --set model.init_std=0.2 --set train.moe_aux_loss_coef=0.01 --set train.moe_z_loss_coef=0.001
     --set reward.style=command --set "reward.command=/usr/bin/python3 $root/tests/regression/ascii_reward.py" --set eval.path=)

args=(run inputs/smoke_rl.toml "${moe[@]}")  # run NP NAME [--set ...] (run_helpers.sh)

close() {  # RUN_A RUN_B: same tokens, routing traces and rewards; same metrics to round-off
  /usr/bin/python3 tests/regression/same_tokens.py "$tag" "$out/$1" "$out/$2" tokens/values tokens/offsets \
    routing/values reward step
}

echo "== np 4 split, 2 trainer ranks: expert_parallel 2 vs 1"
run 4 split_ep1
run 4 split_ep2 --set parallel.expert_parallel=2
grep -q "expert parallelism: 1 group of 2 data-parallel ranks; this rank holds experts 0..3 of 8" "$out/split_ep2.log"
close split_ep1 split_ep2

echo "== colocated: np 2 (one group of 2) and np 4 (two groups of 2)"
kl=(--set train.use_kl_loss=true --set train.kl_loss_coef=0.01)  # a sharded reference model too
run 2 co2_ep1 --set parallel.placement=colocate "${kl[@]}"
run 2 co2_ep2 --set parallel.placement=colocate --set parallel.expert_parallel=2 "${kl[@]}"
close co2_ep1 co2_ep2
run 4 co4_ep1 --set parallel.placement=colocate --set train.routing_replay=true
run 4 co4_ep2 --set parallel.placement=colocate --set parallel.expert_parallel=2 --set train.routing_replay=true
grep -q "expert parallelism: 2 groups of 2 data-parallel ranks" "$out/co4_ep2.log"
close co4_ep1 co4_ep2

echo "== a DeepSeekMoE model whose trained MTP depth is an MoE layer, np 4 split"
dsmtp=(--set model.moe_router=sigmoid --set model.moe_router_bias=true --set model.moe_n_group=2
       --set model.moe_topk_group=1 --set model.n_shared_experts=1 --set model.mtp_num_layers=1
       --set train.mtp_loss_coef=0.3)
run 4 mtp_ep1 "${dsmtp[@]}"
run 4 mtp_ep2 "${dsmtp[@]}" --set parallel.expert_parallel=2
close mtp_ep1 mtp_ep2

echo "== one_step_off, np 4 split"
run 4 async_ep1 --set train.async=one_step_off
run 4 async_ep2 --set train.async=one_step_off --set parallel.expert_parallel=2
close async_ep1 async_ep2

echo "== job steps 2 + 2 = 4 straight, bit for bit"
run 4 split_ep2_chunked --set parallel.expert_parallel=2 --set run.job_steps=2
run 4 split_ep2_chunked --set parallel.expert_parallel=2 --set run.job_steps=2
/usr/bin/python3 tests/regression/compare_runs.py "$out/split_ep2" "$out/split_ep2_chunked"

echo "== a whole-model checkpoint: resumed with expert_parallel = 1, exported"
run 4 switch --set parallel.expert_parallel=2 --set run.job_steps=2
run 4 switch --set parallel.expert_parallel=1
close split_ep2 switch
"$slimpi" export "$out/split_ep2/ckpt/step_00000004" "$out/hf" >"$out/export.log"
PYTHONPATH=tests/regression /usr/bin/python3 - "$out" <<'PY'
import json
import sys
import h5py
import numpy as np
from safetensors_file import SafetensorsFile
out = sys.argv[1]
st = SafetensorsFile(f"{out}/hf/model.safetensors")
header = st.header
experts = sorted(k for k in header if ".mlp.experts." in k)
assert len(experts) == 2 * 8 * 3, len(experts)
# Against the final model of the run with every expert on every rank (round-off apart).
with h5py.File(f"{out}/split_ep1/trainer_state.h5") as f:
    for k in experts:
        assert np.allclose(st.tensor(k), f["model/" + k][:], rtol=1e-4, atol=1e-6), k
cfg = json.load(open(f"{out}/hf/config.json"))
assert cfg["architectures"] == ["Qwen3MoeForCausalLM"], cfg["architectures"]
print(f"expert_parallel_runs: the export holds all {len(experts)} expert tensors of the run's final model")
PY
# A Hugging Face directory as model.init_from: each shard reads its own experts of it.
$mpirun -np 4 "$slimpi" run inputs/smoke_rl.toml --set run.n_steps=1 --set eval.path= --set parallel.expert_parallel=2 \
  --set model.init_from="$out/hf" --set run.dir="$out/from_hf" >"$out/from_hf.log" 2>&1 || { cat "$out/from_hf.log"; exit 1; }
grep -q "this rank holds experts 0..3 of 8" "$out/from_hf.log"

echo "== SFT with evaluation at np 2"
sft=(--set run.n_steps=6 --set model.hidden_size=32 --set model.n_layers=2 --set model.n_experts=4
     --set model.moe_intermediate_size=32 --set "eval.path=inputs/data/addition_eval.jsonl@[0:16]" --set eval.interval=3
     --set eval.n_samples=2 --set train.global_batch_size=16 --set rollout.max_new_tokens=8)
for ep in 1 2; do
  $mpirun -np 2 "$slimpi" run inputs/sft_addition.toml "${sft[@]}" --set parallel.expert_parallel=$ep \
    --set run.dir="$out/sft_ep$ep" >"$out/sft_ep$ep.log" 2>&1 || { cat "$out/sft_ep$ep.log"; exit 1; }
done
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
with h5py.File(f"{out}/sft_ep1/metrics.h5") as fa, h5py.File(f"{out}/sft_ep2/metrics.h5") as fb:
    for c in ("train/loss", "train/grad_norm", "train/moe_z_loss", "eval/pass@1", "eval/mean_reward"):
        x, y = fa["steps/" + c][:], fb["steps/" + c][:]
        assert np.allclose(x, y, rtol=1e-4, atol=1e-6, equal_nan=True), (c, x, y)
    assert np.sum(np.isfinite(fb["steps/eval/pass@1"][:])) == 3  # steps 0, 3 and the final one
print("expert_parallel_runs: SFT with evaluation, expert_parallel 2 == 1")
PY

echo "== refusals"
refused() {  # NP PATTERN [--set ...]
  local np=$1 pattern=$2; shift 2
  if $mpirun -np "$np" "$slimpi" run inputs/smoke_rl.toml --set run.dir="$out/refused" "$@" >"$out/refused.log" 2>&1; then
    cat "$out/refused.log"; echo "FAIL: ran: $*"; exit 1
  fi
  grep -q -- "$pattern" "$out/refused.log" || { cat "$out/refused.log"; echo "FAIL: no '$pattern'"; exit 1; }
}
refused 4 "the model has none: model.n_experts = 0" --set parallel.expert_parallel=2
refused 4 "it must divide model.n_experts = 6" "${moe[@]}" --set model.n_experts=6 --set parallel.expert_parallel=4 \
  --set parallel.placement=colocate
refused 4 "it must divide the number of trainer ranks, 2" "${moe[@]}" --set parallel.expert_parallel=4
echo "expert_parallel_runs: OK"
