#!/usr/bin/env bash
# Runs a deck on this machine under mpirun: jobs/run_local.sh NP DECK [--set key=value ...]
# Launch flags live here, not in slimpi: --oversubscribe lets 4 ranks share 2 cores,
# --allow-run-as-root is for containers; OMP_WAIT_POLICY=PASSIVE keeps idle OpenMP
# threads from spinning on a core another rank needs (docs/architecture.md, threads and memory).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
np=${1:?usage: jobs/run_local.sh NP DECK [--set key=value ...]}
deck=${2:?usage: jobs/run_local.sh NP DECK [--set key=value ...]}
shift 2
slimpi=${SLIMPI:-$root/build/slimpi}
[ -x "$slimpi" ] || { echo "run_local: $slimpi not built; run scripts/build.sh first" >&2; exit 1; }
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cmd=(mpirun "${flags[@]}" -np "$np" "$slimpi" run "$deck" "$@")
echo "run_local: ${cmd[*]}"
exec "${cmd[@]}"
