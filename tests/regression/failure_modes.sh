#!/usr/bin/env bash
# No hangs: a stuck wait is aborted by the watchdog with the operation named; a
# one-rank error aborts every rank with that rank's message; a collective error exits
# cleanly with one message. Usage: failure_modes.sh PROGRAM "MPIRUN FLAGS"
set -uo pipefail
prog=$1; mpirun=$2
log=$(mktemp); trap 'rm -f "$log"' EXIT

# mpirun's exit code is the MPI_Abort code: 3 from the watchdog, 2 from run_guarded;
# a clean collective failure exits 1 on every rank.
check() {  # MODE EXPECTED_RC PATTERN
  timeout 60 $mpirun -np 2 "$prog" "$1" >"$log" 2>&1
  local rc=$?
  [ $rc -ne 124 ] || { echo "$1: hung (timeout)"; cat "$log"; exit 1; }
  [ $rc -eq "$2" ] || { echo "$1: expected rc $2, got $rc"; cat "$log"; exit 1; }
  grep -q -- "$3" "$log" || { echo "$1: expected '$3' in:"; cat "$log"; exit 1; }
  [ "$(grep -c -- "$3" "$log")" = 1 ] || { echo "$1: message not printed exactly once"; cat "$log"; exit 1; }
}
check hang 3 "\[rank 1\] error: \[rank 1 of comm 'trainer' (2 ranks, mpi)\] recv of 1 x f32 from rank 0 has waited"
check throw 2 "\[rank 1\] error: rank-local failure on purpose"
check collective 1 "slimpi: error: the same failure on every rank"
echo "failure_modes: ok"
