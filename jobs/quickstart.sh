#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the
# quickstart job at np 4 (2 trainer + 2 rollout ranks), then summarises its files.
# Today the quickstart is the platform job (inputs/platform_smoke.toml): the RL
# subsystems that later fill in its step table are not built yet.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
cd "$root"
jobs/run_local.sh 4 inputs/smoke_rl.toml
run_dir=runs/smoke_rl
for f in "$run_dir"/metrics.h5 "$run_dir"/rollouts.h5; do
  build/slimpi inspect "$f"
done
echo "quickstart: done; outputs in $run_dir (metrics.csv, metrics.h5, rollouts.h5, deck.resolved.toml)"
