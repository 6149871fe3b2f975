#!/usr/bin/env bash
# A scaling study on this machine: the same deck at several rank counts, each run in
# runs/scaling/<deck name>_np<N>, then one table of step-time components
# (postprocess/scaling.py; also written as a PNG next to the runs).
# Usage: jobs/scaling.sh DECK "NP NP ..." [--set key=value ...]
#   e.g. jobs/scaling.sh inputs/smoke_rl.toml "2 4" --set run.n_steps=20
# On a cluster, run the same loop inside one allocation with `srun -n N` instead of
# jobs/run_local.sh (see jobs/slurm_run.sbatch for the srun flags).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deck=${1:?usage: jobs/scaling.sh DECK "NP NP ..." [--set key=value ...]}
counts=${2:?usage: jobs/scaling.sh DECK "NP NP ..." [--set key=value ...]}
shift 2
name=$(basename "$deck" .toml)
dirs=()
for np in $counts; do
  dir=runs/scaling/${name}_np$np
  echo "scaling: np $np -> $dir"
  mkdir -p "$root/runs/scaling"
  (cd "$root" && jobs/run_local.sh "$np" "$deck" "$@" --set run.dir="$dir" --set checkpoint.resume=never) \
    >"$root/runs/scaling_${name}_np$np.log" 2>&1 || { tail -20 "$root/runs/scaling_${name}_np$np.log"; exit 1; }
  dirs+=("$root/$dir")
done
cmd=(/usr/bin/python3 "$root/postprocess/scaling.py" "${dirs[@]}" --png "$root/runs/scaling/${name}.png")
echo "scaling: ${cmd[*]}"
"${cmd[@]}"
