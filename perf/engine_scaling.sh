#!/usr/bin/env bash
# Engine scaling: the same `slimpi generate` workload at 1 and 2 rollout ranks (one
# core and one torch thread each), tokens/s from each run's metrics.h5, and the ratio.
# Usage: perf/engine_scaling.sh [N_PROMPTS]   (default 200 prompts x 8 samples)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-200}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
head -"$n" "$root/inputs/data/addition_eval.jsonl" >"$out/prompts.jsonl"
flags=(--oversubscribe); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
cd "$root"
for np in 1 2; do
  cmd=(mpirun "${flags[@]}" -np $np build/slimpi generate inputs/generate_addition.toml --set model.init_from=
       --set data.path="$out/prompts.jsonl" --set run.dir="$out/np$np" --set run.threads=1
       --set rollout.max_new_tokens=16)
  echo "engine_scaling: ${cmd[*]}"
  OMP_WAIT_POLICY=PASSIVE "${cmd[@]}" >"$out/np$np.log" 2>&1 || { cat "$out/np$np.log"; exit 1; }
done
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
out = sys.argv[1]
rate = {}
for np_ in (1, 2):
    with h5py.File(f"{out}/np{np_}/metrics.h5") as f:
        rate[np_] = f["steps/perf/rollout_tokens_per_s"][0]
print(f"engine_scaling: 1 rank {rate[1]:.0f} tokens/s, 2 ranks {rate[2]:.0f} tokens/s, ratio {rate[2] / rate[1]:.2f}")
PY
