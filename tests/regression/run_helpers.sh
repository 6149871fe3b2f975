# Helpers the regression scripts share (sourced). regression_setup makes the common
# start; the others expect: $slimpi, $mpirun, $out (a scratch directory), $tag (the
# script's name, for messages) and, for run / refused / kill9_in_checkpoint /
# killed_rank_ends_job, the array `args` (the slimpi command line before the run
# directory).

# regression_setup SLIMPI ROOT "MPIRUN FLAGS": the arguments every regression script
# gets (as $slimpi, $root, $mpirun), a scratch directory $out removed at exit (with any
# process still running from it), $tag = the script's name, and the working directory
# the repository root.
regression_setup() {
  slimpi=$1; root=$2; mpirun=$3
  out=$(mktemp -d)
  trap 'pkill -9 -f "$out" 2>/dev/null || true; rm -rf "$out"' EXIT
  tag=${tag:-$(basename "$0" .sh)}
  cd "$root"
}

close() {  # close RUN_A RUN_B: same tokens, rewards, advantages and old log-probs; same metrics to round-off
  /usr/bin/python3 tests/regression/same_tokens.py "$tag" "$out/$1" "$out/$2" tokens/values tokens/offsets reward step \
    advantages/values old_log_probs/values
}

job_fails() {  # job_fails NAME PATTERN NP ARGS...: slimpi ARGS must end non-zero within 120 s with PATTERN
  local name=$1 pattern=$2 np=$3; shift 3
  timeout 120 $mpirun -np "$np" "$slimpi" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  [ $rc -ne 124 ] || { echo "FAIL: $name hung"; cat "$out/$name.log"; exit 1; }
  [ $rc -ne 0 ] || { echo "FAIL: $name: exit 0, expected a failure"; cat "$out/$name.log"; exit 1; }
  grep -qF -- "$pattern" "$out/$name.log" || { echo "FAIL: $name: no '$pattern'"; cat "$out/$name.log"; exit 1; }
  echo "$tag: $name: refused as expected (exit $rc)"
}

job_runs() {  # job_runs NAME NP ARGS...: slimpi ARGS must finish (exit 0) within 300 s
  local name=$1 np=$2; shift 2
  timeout 300 $mpirun -np "$np" "$slimpi" "$@" >"$out/$name.log" 2>&1 \
    || { echo "FAIL: $name failed"; cat "$out/$name.log"; exit 1; }
  echo "$tag: $name: ran"
}

steps_done() {  # steps_done RUN_DIR N: the run finished step N of N (COMPLETE; metrics.h5 rows 0..N-1, a step's each, and N with the final evaluation)
  /usr/bin/python3 - "$1" "$2" <<'PY' || exit 1
import os, sys
import h5py
run, n = sys.argv[1], int(sys.argv[2])
assert os.path.exists(run + "/COMPLETE"), f"{run}: no COMPLETE marker"
with h5py.File(run + "/metrics.h5", "r") as f:
    steps = [int(s) for s in f["steps/step"][:]]
    assert steps in (list(range(n)), list(range(n + 1))), f"{run}: metrics.h5 holds the rows of steps {steps} for {n} steps"
PY
}

run() {  # run NP NAME [--set ...]: one job step, must succeed
  local np=$1 name=$2; shift 2
  $mpirun -np "$np" "$slimpi" "${args[@]}" --set run.dir="$out/$name" "$@" >>"$out/$name.log" 2>&1 \
    || { cat "$out/$name.log"; exit 1; }
}

refused() {  # refused NAME EXPECTED NP [--set ...]: every rank stops with EXPECTED
  local name=$1 expected=$2 np=$3; shift 3
  if timeout 120 $mpirun -np "$np" "$slimpi" "${args[@]}" --set run.dir="$out/$name" "$@" >"$out/$name.log" 2>&1; then
    cat "$out/$name.log"; echo "FAIL: $name ran; expected: $expected"; exit 1
  fi
  grep -qF -- "$expected" "$out/$name.log" || { cat "$out/$name.log"; echo "FAIL: no '$expected'"; exit 1; }
  echo "$tag: $name refused as expected"
}

check_refuses() {  # check_refuses NAME EXPECTED NP [--set ...]: `slimpi check` (one process, the layout of NP ranks) refuses with EXPECTED
  local name=$1 expected=$2 np=$3; shift 3
  if "$slimpi" check "${args[1]}" --np "$np" "${args[@]:2}" --set run.dir="$out/$name" "$@" >"$out/$name.log" 2>&1; then
    cat "$out/$name.log"; echo "FAIL: $name passed the check; expected: $expected"; exit 1
  fi
  grep -qF -- "$expected" "$out/$name.log" || { cat "$out/$name.log"; echo "FAIL: no '$expected'"; exit 1; }
  echo "$tag: $name refused by the check as expected"
}

kill9_in_checkpoint() {  # kill9_in_checkpoint NP NAME STEP: kill -9 every rank inside checkpoint STEP's write
  local np=$1 name=$2 step=$3 job
  SLIMPI_FAULT_CHECKPOINT_PAUSE_AT=$step $mpirun -np "$np" "$slimpi" "${args[@]}" --set run.dir="$out/$name" \
    >>"$out/$name.log" 2>&1 &
  job=$!
  for _ in $(seq 600); do grep -qF "fault injection: pausing 60 s" "$out/$name.log" 2>/dev/null && break; sleep 0.1; done
  grep -qF "fault injection: pausing 60 s inside $out/$name/ckpt/step_$(printf %08d "$step")" "$out/$name.log" \
    || { cat "$out/$name.log"; echo "FAIL: the job never paused in checkpoint $step"; exit 1; }
  kill -9 $(pgrep -f "^[^ ]*slimpi run .*run.dir=$out/$name( |$)") "$job" 2>/dev/null || true
  wait "$job" 2>/dev/null || true
  # The ranks are gone only when the kernel has reaped them: until then the run directory's
  # lock still names a live process, and the resume would be refused as a second job.
  for _ in $(seq 100); do pgrep -f "^[^ ]*slimpi run .*run.dir=$out/$name( |$)" >/dev/null || break; sleep 0.1; done
}

killed_rank_ends_job() {  # killed_rank_ends_job NP NAME STEPS: kill -9 the last rank after step 2
  local np=$1 name=$2 steps=$3 job victim ended=0
  $mpirun -np "$np" "$slimpi" "${args[@]}" --set run.n_steps="$steps" --set run.dir="$out/$name" >"$out/$name.log" 2>&1 &
  job=$!
  for _ in $(seq 600); do grep -qF "step 2/$steps" "$out/$name.log" 2>/dev/null && break; sleep 0.1; done
  victim=$(pgrep -f "^[^ ]*slimpi run .*run.dir=$out/$name( |$)" | sort -n | tail -1)  # the last rank: a rollout rank
  [ -n "$victim" ] || { cat "$out/$name.log"; echo "FAIL: no rank to kill"; exit 1; }
  kill -9 "$victim"
  for _ in $(seq 600); do kill -0 "$job" 2>/dev/null || { ended=1; break; }; sleep 0.1; done
  [ $ended = 1 ] || { kill -9 "$job"; cat "$out/$name.log"; echo "FAIL: the job outlived a killed rank by 60 s"; exit 1; }
  if wait "$job"; then cat "$out/$name.log"; echo "FAIL: exit 0 after a rank was killed"; exit 1; fi
  grep -q "exited on signal 9" "$out/$name.log" || { cat "$out/$name.log"; echo "FAIL: no word of the killed rank"; exit 1; }
  if pgrep -f "run.dir=$out/$name" >/dev/null; then echo "FAIL: ranks outlived the job"; exit 1; fi
  echo "$tag: a killed rollout rank ended the job: $(grep 'exited on signal 9' "$out/$name.log" | head -1)"
}
