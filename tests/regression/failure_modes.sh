#!/usr/bin/env bash
# No hangs: a rank stuck in each kind of wait (point-to-point, Comm collective, raw
# MPI broadcast, idle barrier, HDF5 append) ends the job within timeout + 10 s, the
# watchdog naming the operation; a one-rank error aborts every rank with that rank's
# message; a collective error exits cleanly with one message. Only one rank waits in
# each case (the other sleeps outside MPI), so no assertion depends on which rank is
# faster. Usage: failure_modes.sh PROGRAM "MPIRUN FLAGS"
set -uo pipefail
prog=$1; mpirun=$2
log=$(mktemp); trap 'rm -f "$log"' EXIT

# mpirun's exit code: 3 from the watchdog (its rank's _Exit), 2 from run_guarded's
# MPI_Abort; a clean collective failure exits 1 on every rank.
check() {  # MODE EXPECTED_RC PATTERN
  local start=$SECONDS
  timeout 60 $mpirun -np 2 "$prog" $1 >"$log" 2>&1
  local rc=$?
  [ $((SECONDS - start)) -le 40 ] || { echo "$1: took $((SECONDS - start)) s (watchdog 2 s + 10 s, + start-up)"; exit 1; }
  [ $rc -ne 124 ] || { echo "$1: hung (timeout)"; cat "$log"; exit 1; }
  [ $rc -eq "$2" ] || { echo "$1: expected rc $2, got $rc"; cat "$log"; exit 1; }
  grep -q -- "$3" "$log" || { echo "$1: expected '$3' in:"; cat "$log"; exit 1; }
  [ "$(grep -c -- "$3" "$log")" = 1 ] || { echo "$1: message not printed exactly once"; cat "$log"; exit 1; }
}
check hang 3 "\[rank 1\] error: \[rank 1 of comm 'trainer' (2 ranks, mpi)\] recv of 1 x f32 from rank 0 has waited"
check allreduce 3 "\[rank 1\] error: \[rank 1 of comm 'trainer' (2 ranks, mpi)\] allreduce of 1 x f32 has waited"
check bcast 3 "\[rank 1\] error: \[broadcast of a byte string\] MPI_Bcast from rank 0 has waited"
check idle 3 "\[rank 1\] error: \[test\] idle barrier nobody else reaches idle barrier has waited"
check h5 3 "\[rank 1\] error: (HDF5 file) row counts for a collective append (allgather) has waited"
check throw 2 "\[rank 1\] error: rank-local failure on purpose"
check collective 1 "slimpi: error: the same failure on every rank"

# A command started by a rank (reward commands, environments) dies with it, and so does
# its own child: after the watchdog's _Exit and after MPI_Abort.
pids=$(mktemp -u)
for mode in child_watchdog child_abort; do
  rm -f "$pids"
  if [ $mode = child_watchdog ]; then check "$mode $pids" 3 "recv of 1 x f32 from rank 0 has waited"
  else check "$mode $pids" 2 "rank-local failure with a command running"; fi
  [ -s "$pids" ] || { echo "$mode: the command never started"; exit 1; }
  for _ in $(seq 100); do
    left=$(for p in $(cat "$pids"); do kill -0 "$p" 2>/dev/null && echo "$p"; done)
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || { echo "$mode: the command's processes outlived the job: $(ps -o pid,ppid,cmd -p $left)"; exit 1; }
  echo "failure_modes: $mode: the command and its child died with the rank"
done
rm -f "$pids"
echo "failure_modes: ok"
