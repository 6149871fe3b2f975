#!/usr/bin/env bash
# A scaling study on this machine: the same deck at several rank counts or layouts, each
# run in runs/scaling/<deck name>_np<N>[_tp<T>], then one table of step-time components
# (postprocess/scaling.py; also written as a PNG next to the runs).
# Usage: jobs/scaling.sh DECK "NP[xTP] NP[xTP] ..." [--set key=value ...]
#   e.g. jobs/scaling.sh inputs/smoke_rl.toml "2 4" --set run.n_steps=20
#        jobs/scaling.sh inputs/smoke_rl.toml "4x1 4x2" --set parallel.placement=colocate
#   (NPxTP: NP ranks with parallel.tensor_parallel = TP: a layout axis at fixed NP)
# On a cluster, run the same loop inside one allocation with `srun -n N` instead of
# jobs/run_local.sh (see jobs/slurm_run.sbatch for the srun flags).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deck=${1:?usage: jobs/scaling.sh DECK "NP NP ..." [--set key=value ...]}
counts=${2:?usage: jobs/scaling.sh DECK "NP NP ..." [--set key=value ...]}
shift 2
name=$(basename "$deck" .toml)
dirs=()
for point in $counts; do
  np=${point%x*}
  layout=()
  dir=runs/scaling/${name}_np$np
  if [[ $point == *x* ]]; then
    layout=(--set parallel.tensor_parallel="${point#*x}")
    dir+=_tp${point#*x}
  fi
  echo "scaling: np $np ${layout[*]} -> $dir"
  mkdir -p "$root/runs/scaling"
  log="$root/runs/scaling_$(basename "$dir").log"
  (cd "$root" && jobs/run_local.sh "$np" "$deck" "$@" "${layout[@]}" --set run.dir="$dir" --set checkpoint.resume=never) \
    >"$log" 2>&1 || { tail -20 "$log"; exit 1; }
  dirs+=("$root/$dir")
done
cmd=(/usr/bin/python3 "$root/postprocess/scaling.py" "${dirs[@]}" --png "$root/runs/scaling/${name}.png")
echo "scaling: ${cmd[*]}"
"${cmd[@]}"
