#!/usr/bin/env bash
# Expert parallelism on the quickstart task: the quickstart model with 8 experts of
# width 344, top-2, in every layer (~4.4M parameters; perf/moe_replay.sh's SFT state) is
# trained by GRPO for STEPS steps at np 4 split (2 trainer + 2 rollout ranks), once with
# every expert on both trainer ranks (parallel.expert_parallel = 1) and once with the
# experts sharded over the two (= 2), from the same state. Reported: the parameters each
# trainer rank holds (weights, gradients and both AdamW moments scale with it), the
# median train-phase time per step and its ratio, and the share of samples the two runs
# generated identically (the runs differ by round-off only).
# Usage: perf/expert_parallel.sh [STEPS]   (default 20; runs go to runs/expert_parallel/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${1:-20}
cd "$root"
out=runs/expert_parallel
mkdir -p "$out"
moe=(--set model.n_experts=8 --set model.n_experts_per_tok=2 --set model.moe_intermediate_size=344)
sft=runs/moe_replay/sft_moe
if [ ! -f "$sft/trainer_state.h5" ]; then
  jobs/run_local.sh 4 inputs/quickstart_sft.toml "${moe[@]}" --set run.dir="$sft" --set checkpoint.resume=never \
    >"$sft.log" 2>&1 || { tail -20 "$sft.log"; exit 1; }
fi
for ep in 1 2; do
  jobs/run_local.sh 4 inputs/quickstart_grpo.toml "${moe[@]}" --set run.n_steps="$steps" --set eval.path= \
    --set checkpoint.resume=never --set checkpoint.interval=0 --set model.init_from="$sft/trainer_state.h5" \
    --set parallel.expert_parallel=$ep --set run.dir="$out/ep$ep" >"$out/ep$ep.log" 2>&1 ||
    { tail -20 "$out/ep$ep.log"; exit 1; }
done
/usr/bin/python3 - "$out" <<'PY'
import re
import sys
import h5py
import numpy as np
out = sys.argv[1]
def params(run):
    log = open(f"{out}/{run}.log").read()
    m = re.search(r"\((\d+) parameters here\)", log)
    return int(m.group(1)) if m else int(re.search(r"policy: (\d+) parameters", log).group(1))
def train_time(run):
    with h5py.File(f"{out}/{run}/metrics.h5") as f:
        return np.median(f["steps/perf/train_time"][1:])  # step 1 warms up
def samples(run):
    with h5py.File(f"{out}/{run}/rollouts.h5") as f:
        t, o = f["samples/tokens/values"][:], f["samples/tokens/offsets"][:]
        return [t[o[i]:o[i + 1]].tobytes() for i in range(len(o) - 1)]
p1, p2 = params("ep1"), params("ep2")
t1, t2 = train_time("ep1"), train_time("ep2")
a, b = samples("ep1"), samples("ep2")
same = sum(x == y for x, y in zip(a, b)) / max(len(a), 1)
print(f"parameters per trainer rank: {p1} (expert_parallel 1) vs {p2} (2): {p2 / p1:.3f}")
print(f"median train phase per step: {t1 * 1e3:.1f} ms vs {t2 * 1e3:.1f} ms: ep2 / ep1 = {t2 / t1:.2f}")
print(f"samples generated identically: {same:.3f} of {len(a)}")
PY
