#!/usr/bin/env bash
# Stopping a run from outside (np 4, split 2+2, 12-step smoke run):
#  * SIGUSR1 to mpirun (forwarded to every rank, as Slurm's --signal does to the
#    tasks): the ranks finish the step, checkpoint, log why and exit 0; running the
#    same command again finishes the run with results identical to a straight run;
#  * SIGTERM sent to the ranks themselves: the same;
#  * a second signal ends the ranks at once (exit 138, no checkpoint of that step);
#    the job is held inside a checkpoint write meanwhile, so that no step can end
#    between the two signals;
#  * kill -9 of every process in the middle of a checkpoint write (held open by the
#    SLIMPI_FAULT_CHECKPOINT_PAUSE_AT hook): the unfinished checkpoint has no DONE, the
#    next job resumes from the one before and the results are again identical;
#  * kill -9 between checkpoints: at most the steps since the last DONE are redone.
# Usage: signals.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
compare="/usr/bin/python3 $root/tests/regression/compare_runs.py"
args=(run inputs/smoke_rl.toml --set run.n_steps=12 --set eval.interval=4 --set checkpoint.interval=4)

run() {  # run NAME: one job step in the foreground, must succeed
  local name=$1; shift
  $mpirun -np 4 "$slimpi" "${args[@]}" --set run.dir="$out/$name" "$@" >>"$out/$name.log" 2>&1 \
    || { cat "$out/$name.log"; exit 1; }
}
start() {  # start NAME: one job step in the background; its mpirun PID in $job
  local name=$1; shift
  $mpirun -np 4 "$slimpi" "${args[@]}" --set run.dir="$out/$name" "$@" >>"$out/$name.log" 2>&1 &
  job=$!
}
wait_for() {  # wait_for FILE TEXT: until TEXT appears in FILE (60 s at most)
  for _ in $(seq 600); do grep -qF -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  cat "$1"; echo "FAIL: '$2' never appeared in $1"; exit 1
}
ranks_of() { pgrep -f "^[^ ]*slimpi run .*run.dir=$out/$1( |$)" || true; }  # not mpirun

run straight

echo "== SIGUSR1 to mpirun"
start usr1
wait_for "$out/usr1.log" "step 2/12"
kill -USR1 "$job"
wait "$job" || { cat "$out/usr1.log"; echo "FAIL: exit status $? after SIGUSR1"; exit 1; }
grep -q "SIGUSR1 received: stopping after step" "$out/usr1.log"
grep -q "stopped at the step boundary after step" "$out/usr1.log"
test ! -e "$out/usr1/COMPLETE"
run usr1
steps_done "$out/usr1" 12
$compare "$out/straight" "$out/usr1"

echo "== SIGTERM to the ranks"
start term
wait_for "$out/term.log" "step 6/12"
kill -TERM $(ranks_of term)
wait "$job"
grep -q "SIGTERM received: stopping after step" "$out/term.log"
run term
$compare "$out/straight" "$out/term"

echo "== a second signal exits at once"
SLIMPI_FAULT_CHECKPOINT_PAUSE_AT=4 start twice  # holds the job in a checkpoint: no step ends
wait_for "$out/twice.log" "fault injection: pausing"
pids=$(ranks_of twice)
kill -USR1 $pids; sleep 0.5; kill -USR1 $pids
if wait "$job"; then cat "$out/twice.log"; echo "FAIL: exit 0 after two signals"; exit 1; fi
grep -q "second stop signal, exiting at once without a checkpoint" "$out/twice.log"

echo "== kill -9 inside a checkpoint write"
SLIMPI_FAULT_CHECKPOINT_PAUSE_AT=8 start kill9
wait_for "$out/kill9.log" "fault injection: pausing 60 s inside $out/kill9/ckpt/step_00000008"
kill -9 $(ranks_of kill9) "$job"
wait "$job" 2>/dev/null || true
test -f "$out/kill9/ckpt/step_00000004/DONE"
test -d "$out/kill9/ckpt/step_00000008" && test ! -e "$out/kill9/ckpt/step_00000008/DONE"
run kill9
grep -q "checkpoint $out/kill9/ckpt/step_00000008 skipped: no DONE marker" "$out/kill9.log"
grep -q "resuming at step 4 from $out/kill9/ckpt/step_00000004" "$out/kill9.log"
$compare "$out/straight" "$out/kill9"

echo "== kill -9 between checkpoints"
start kill9b
wait_for "$out/kill9b.log" "step 7/12"
kill -9 $(ranks_of kill9b) "$job"
wait "$job" 2>/dev/null || true
newest=$(ls -d "$out"/kill9b/ckpt/step_*/DONE | sort | tail -1 | xargs dirname)
run kill9b
grep -q "resuming at step $((10#${newest##*step_})) from $newest" "$out/kill9b.log"
$compare "$out/straight" "$out/kill9b"
echo "signals: OK"
