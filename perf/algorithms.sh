#!/usr/bin/env bash
# GRPO, RLOO, PPO (actor + critic) and GRPO + on-policy distillation on the quickstart
# task, from the same SFT state and seed: step time (the train phase, where the critic
# and the teacher cost) and learning curves (held-out greedy pass@1, overlaid by
# postprocess/compare_runs.py -> runs/algorithms_s<seed>.png).
# OPD's teacher is the GRPO run's final policy (the student, from the SFT state, distils
# what GRPO learnt while it trains on the task reward: opd_kl_coef 1). PPO: gamma = lambd
# = 1, critic lr 1e-3 (the policy's 3e-4), advantages whitened.
# Runs go to runs/algorithms_{grpo,rloo,ppo,opd}_s<seed>; an SFT state in
# runs/quickstart_sft_s<seed> is reused, else made.
# Usage: perf/algorithms.sh [STEPS [SEED]]   (defaults: 300 1)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
steps=${1:-300}
seed=${2:-1}
sft=runs/quickstart_sft_s$seed
if [ ! -f "$sft/trainer_state.h5" ]; then
  jobs/run_local.sh 4 inputs/quickstart_sft.toml --set run.seed="$seed" --set run.dir="$sft" \
    --set checkpoint.resume=never >"$sft.log" 2>&1 || { cat "$sft.log"; exit 1; }
fi
common=(--set run.seed="$seed" --set run.n_steps="$steps" --set model.init_from="$sft/trainer_state.h5"
        --set checkpoint.resume=never --set eval.interval=50)
run() {  # run NAME [--set ...]
  local name=$1; shift
  local dir=runs/algorithms_${name}_s$seed
  jobs/run_local.sh 4 inputs/quickstart_grpo.toml "${common[@]}" --set run.dir="$dir" "$@" >"$dir.log" 2>&1 \
    || { cat "$dir.log"; exit 1; }
}
run grpo
run rloo --set train.advantage_estimator=rloo
run ppo --set train.advantage_estimator=ppo --set critic.lr=1e-3 --set train.normalize_advantages=true
run opd --set train.opd_kl_coef=1.0 --set "teacher.path=runs/algorithms_grpo_s$seed/trainer_state.h5"
/usr/bin/python3 - "$seed" "$steps" <<'PY'
import sys
import h5py
import numpy as np
seed, steps = sys.argv[1], int(sys.argv[2])
rows = []
for name in ("grpo", "rloo", "ppo", "opd"):
    with h5py.File(f"runs/algorithms_{name}_s{seed}/metrics.h5") as f:
        s = f["steps"]
        train = s["perf/train_time"][:steps]
        step = s["perf/step_time"][:steps]
        p1 = s["eval/pass@1"][:]
        evals = [(int(i), float(v)) for i, v in zip(s["step"][:], p1) if v == v]
    rows.append((name, np.median(train), np.median(step), evals))
base_train, base_step = rows[0][1], rows[0][2]
print(f"seed {seed}, {steps} steps, np 4 (2 trainer + 2 rollout ranks); median per step:")
print("| run | train phase (s) | / GRPO | step (s) | / GRPO | held-out pass@1: first -> last eval |")
print("|---|---|---|---|---|---|")
for name, t, st, ev in rows:
    print(f"| {name} | {t:.3f} | {t / base_train:.2f} | {st:.3f} | {st / base_step:.2f} | "
          f"{ev[0][1]:.3f} -> {ev[-1][1]:.3f} (step {ev[-1][0]}) |")
PY
/usr/bin/python3 postprocess/compare_runs.py runs/algorithms_{grpo,rloo,ppo,opd}_s"$seed" --out "runs/algorithms_s$seed.png"
