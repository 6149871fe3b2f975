#!/usr/bin/env bash
# Multi-turn episodes (docs/environments.md): what the environment protocol costs.
#  1. Per turn: build/perf/bench_env, one calculator step in process against
#     inputs/envs/calculator.py through its pipe (1 and 64 episodes in flight), in
#     microseconds per turn.
#  2. Episodes against single-turn rollouts of the same model tokens: `slimpi generate`
#     on 64 prompts x 4 samples of the smoke model (np 2), episodes of 3 turns x T tokens
#     with tests/fixtures/envs/probe_env.py (its observations ~17 tokens each) against one
#     response of 3T tokens; tokens/s of the model's tokens and episodes/s.
#  3. A slow environment: the same episodes with the probe thinking D ms per step, 1 and 4
#     processes per rollout rank: the time episodes wait for it
#     (perf/env_wait_time_fraction) and the wall time. (Sync vs full async:
#     perf/env_full_async.sh.)
# Usage: perf/env_episodes.sh [T [D]]   (defaults: 8 tokens per turn, 20 ms)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
t=${1:-8}
delay=${2:-20}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "== 1. protocol cost per turn"
build/perf/bench_env --benchmark_min_time=0.5s 2>/dev/null | grep -E "^BM_|Benchmark"
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
gen() {  # gen NAME [--set ...]: slimpi generate at np 2, prints its metrics row
  local name=$1; shift
  OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE mpirun "${flags[@]}" -np 2 build/slimpi generate inputs/smoke_rl.toml \
    --set model.max_seq_len=128 --set rollout.n_samples_per_prompt=4 --set rollout.block_size=16 \
    --set "data.path=inputs/data/addition_eval.jsonl@[0:64]" --set run.dir="$out/$name" "$@" >"$out/$name.log" 2>&1 \
    || { cat "$out/$name.log"; exit 1; }
}
probe="python3 $root/tests/fixtures/envs/probe_env.py"
env=(--set rollout.environment=command --set reward.style=environment --set rollout.env_max_turns=3
     --set rollout.env_max_total_tokens=96 --set rollout.max_new_tokens="$t")
echo "== 2. episodes (3 turns x $t tokens) vs single-turn rollouts of $((3 * t)) tokens (alternated, 3 each)"
for i in 1 2 3; do
  gen "single_$i" --set rollout.max_new_tokens=$((3 * t)) --set rollout.stop_strings=[] --set rollout.temperature=1.0
  gen "episodes_$i" "${env[@]}" --set "rollout.env_command=$probe"
done
echo "== 3. a slow environment ($delay ms a step)"
for procs in 1 4; do
  gen "slow_$procs" "${env[@]}" --set "rollout.env_command=$probe --delay-ms $delay --max-concurrent 1" \
    --set rollout.env_processes=$procs --set rollout.env_timeout_s=600
done
/usr/bin/python3 - "$out" <<'PY'
import sys, glob
import h5py, numpy as np
out = sys.argv[1]
def row(name):
    with h5py.File(f"{out}/{name}/metrics.h5") as f:
        cols = f["steps"].attrs["columns"].decode().split()
        m = {c: float(f["steps/" + c][-1]) for c in cols}
    with h5py.File(f"{out}/{name}/rollouts.h5") as f:
        g = f["samples"]
        mo, mv = g["loss_mask/offsets"][:], g["loss_mask/values"][:]
        n = g["step"].shape[0]
        model = float(mv.sum()) if len(mv) else float(g["response_length"][:].sum())
    return m, n, model
for kind in ("single", "episodes"):
    t, eps, tok = [], [], []
    for i in (1, 2, 3):
        m, n, model = row(f"{kind}_{i}")
        t.append(m["perf/rollout_time"]); eps.append(n / m["perf/rollout_time"]); tok.append(model / m["perf/rollout_time"])
    print(f"{kind:9s} {np.median(t):.3f} s  {np.median(eps):7.1f} samples/s  {np.median(tok):8.0f} model tokens/s (median of 3)")
for procs in (1, 4):
    m, n, model = row(f"slow_{procs}")
    print(f"slow env, {procs} process(es)/rank: {m['perf/rollout_time']:.2f} s, {n / m['perf/rollout_time']:.1f} episodes/s, "
          f"env wait fraction {m.get('perf/env_wait_time_fraction', float('nan')):.2f}")
PY
