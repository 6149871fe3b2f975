#!/usr/bin/env bash
# Real Slurm (ctest label "slurm"): starts a private single-node Slurm (munge +
# slurmctld + slurmd from Debian's packages, as root), submits jobs/slurm_run.sbatch
# with a 1-minute limit and --signal=USR1@30 for a run of ~45 s of compute (slurmctld
# checks time limits every 30 s and sends the warning at the first check after a start,
# so the run needs at least two starts), and checks that the run checkpoints on the
# signal, requeues itself, resumes, and reaches run.n_steps with the same metrics,
# rollouts and weights as a straight mpirun run. The number of steps comes from a short
# calibration run on this machine (SLIMPI_SLURM_TEST_STEPS sets it instead).
# Stops the daemons it started (by PID) however the test ends.
# Usage: slurm_requeue.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
slimpi=$1; root=$2; mpirun=$3
[ "$(id -u)" = 0 ] || { echo "slurm_requeue: needs root (slurmd runs as root)"; exit 1; }
for b in munged slurmctld slurmd sbatch; do
  command -v $b >/dev/null || { echo "slurm_requeue: $b missing: run scripts/install_deps.sh"; exit 1; }
done
out=$(mktemp -d)
cleanup() { stop_local_slurm 2>/dev/null || true; rm -rf "$out"; }
trap cleanup EXIT
source "$root/tests/slurm/local_slurm.sh" "$out/slurm"
cd "$root"
common=(inputs/smoke_rl.toml --set parallel.placement=colocate --set eval.interval=500)
steps=${SLIMPI_SLURM_TEST_STEPS:-}
if [ -z "$steps" ]; then  # ~45 s of steps here: more than the 30 s a start may run before its warning
  $mpirun -np 2 "$slimpi" run "${common[@]}" --set run.n_steps=200 --set run.dir="$out/calibrate" \
    >"$out/calibrate.log" 2>&1 || { cat "$out/calibrate.log"; exit 1; }
  seconds=$(grep -oE "finished: step 200 of 200 in [0-9.]+ s" "$out/calibrate.log" | grep -oE "[0-9.]+ s$" | tr -d ' s')
  steps=$(python3 -c "print(min(6000, max(600, int(45 * 200 / $seconds))))")
fi
args=("${common[@]}" --set run.n_steps=$steps)

# The straight run for comparison first: run alongside the job, it would share the
# cores, and Open MPI under srun (which does not know the node is oversubscribed)
# busy-polls without yielding, 40x slower.
$mpirun -np 2 "$slimpi" run "${args[@]}" --set run.dir="$out/straight" >"$out/straight.log" 2>&1 \
  || { cat "$out/straight.log"; exit 1; }
SLIMPI="$slimpi" SLIMPI_MAX_RESTARTS=30 sbatch --parsable -n 2 --time=1 --signal=USR1@30 \
  --output="$out/job.out" jobs/slurm_run.sbatch "${args[@]}" --set run.dir="$out/slurm_run" >"$out/jobid"
job=$(cat "$out/jobid")
echo "slurm_requeue: submitted job $job ($steps steps, 1-minute limit, USR1 30 s before it)"
for _ in $(seq 900); do  # 15 minutes at most
  grep -qE "the run is complete|not requeued|restarts already" "$out/job.out" 2>/dev/null && break
  sleep 1
done
cat "$out/job.out" | grep -E "^slurm_run|SIGUSR1|resuming at|finished:|error" || true
grep -q "slurm_run: the run is complete" "$out/job.out" || { cat "$out/job.out"; echo "FAIL: not complete"; exit 1; }
starts=$(grep -c "^slurm_run: job $job start" "$out/job.out")
[ "$starts" -ge 2 ] || { echo "FAIL: the job was never interrupted and requeued ($starts start)"; exit 1; }
grep -q "SIGUSR1 received: stopping after step" "$out/job.out"
grep -q "checkpointed before the time limit; requeueing job $job" "$out/job.out"
grep -q "resuming at step" "$out/job.out"
/usr/bin/python3 "$root/tests/regression/compare_runs.py" "$out/straight" "$out/slurm_run"
echo "slurm_requeue: OK ($starts job starts)"
