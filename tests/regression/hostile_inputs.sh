#!/usr/bin/env bash
# Bad input and bad luck end the job with a clear message; nothing waits forever,
# nothing non-finite trains, no reward process outlives the job, one job per run dir:
#  * a NaN reward (training) and an inf reward (evaluation) stop the job naming the
#    sample; no checkpoint is written;
#  * reward commands that close stdout and keep running (during eval), print without
#    end, or crash end the job within the time-out, are killed, and are named;
#  * eval.n_samples > rollout.max_running, train.num_steps_per_rollout > the samples of
#    a step, a KV cache too small for any group, a prompt longer than the context (file:line; skipped with
#    data.skip_bad_lines) and a deck path that is a directory are refused at load;
#  * trainer ranks without samples (SFT global_batch_size 2 at np 4, RL 1 sample on 2
#    trainers, an optimizer step empty on every rank) train like the others;
#  * a second job into a running job's run.dir is refused naming host and pid;
#  * `slimpi run --help` prints help, exits 0 and runs nothing.
# Usage: hostile_inputs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -uo pipefail
slimpi=$1; root=$2; mpirun=$3
out=$(mktemp -d)
marker="slimpi_hostile_$$"
cleanup() { pkill -f "$marker" 2>/dev/null; rm -rf "$out"; }
trap cleanup EXIT
cd "$root"
deck="inputs/smoke_rl.toml --set run.n_steps=2"

tag=hostile_inputs
source "$root/tests/regression/run_helpers.sh"
fails() { local name=$1 pattern=$2 np=$3; shift 3; job_fails "$name" "$pattern" "$np" "$@" --set run.dir="$out/$name"; }
runs() { local name=$1 np=$2; shift 2; job_runs "$name" "$np" "$@" --set run.dir="$out/$name"; }
no_orphans() {  # a reward command dies with its rank (PR_SET_PDEATHSIG): at once, but not before mpirun returns
  for _ in $(seq 100); do pgrep -f "$marker" >/dev/null || return 0; sleep 0.1; done
  echo "$1: reward processes outlived the job by 10 s:"; pgrep -af "$marker"; exit 1
}

# Non-finite rewards.
fails nan_reward "gave the non-finite reward nan to sample 0 of 32" 4 run $deck --set eval.path= \
  --set reward.style=command --set reward.command="awk '{print \"nan\"}'"
test ! -e "$out/nan_reward/ckpt/step_00000001" || { echo "nan_reward: a checkpoint was written"; exit 1; }
fails inf_eval "gave the non-finite reward inf to sample 0" 4 run $deck \
  --set reward.style=command --set reward.command="awk '{print \"inf\"}'"

# Reward commands that misbehave; their processes must not outlive the job.
fails silent_child "timed out after 3 s (reward.command_timeout_s)" 4 run $deck --set reward.command_timeout_s=3 \
  --set reward.style=command --set reward.command="exec >&-; exec sleep 600 # $marker"
no_orphans silent_child
fails flood "printed more than" 4 run $deck --set eval.path= --set reward.style=command \
  --set reward.command="yes 1 # $marker"
no_orphans flood
fails crash "killed by signal 11 (Segmentation fault)" 4 run $deck --set eval.path= --set reward.style=command \
  --set reward.command='kill -SEGV $$'

# Checked at load.
fails eval_samples "eval.n_samples = 9 (--set) exceeds rollout.max_running = 4 (--set)" 4 run $deck \
  --set eval.n_samples=9 --set rollout.max_running=4
fails steps_per_rollout "train.num_steps_per_rollout = 64 (--set) exceeds the 32 samples of a step" 4 run $deck \
  --set train.num_steps_per_rollout=64
fails kv_cache "rollout.kv_cache_tokens = 8 (--set) holds 2 blocks of rollout.block_size = 4" 4 run $deck \
  --set rollout.kv_cache_tokens=8
fails cache_responses "rollout.cache_responses = true (--set) stores responses in the prefix cache, but rollout.prefix_cache = false (--set)" \
  2 run $deck --set rollout.cache_responses=true --set rollout.prefix_cache=false
head -5 inputs/data/addition_sft.jsonl >"$out/long.jsonl"
/usr/bin/python3 -c "import json; print(json.dumps({'prompt': '1' * 100, 'label': '2'}))" >>"$out/long.jsonl"
fails long_prompt "long.jsonl:6: prompt of 101 tokens" 2 run $deck --set eval.path= \
  --set data.path="$out/long.jsonl" --set parallel.placement=colocate
runs long_prompt_skipped 2 run $deck --set eval.path= --set data.path="$out/long.jsonl" \
  --set parallel.placement=colocate --set data.skip_bad_lines=true --set rollout.rollout_batch_size=2
grep -q "(1 bad lines skipped)" "$out/long_prompt_skipped.log" || { cat "$out/long_prompt_skipped.log"; exit 1; }
fails directory_deck "deck file 'inputs' is a directory" 2 run inputs

# Ranks without samples.
runs sft_sparse 4 run inputs/sft_addition.toml --set run.n_steps=3 --set train.global_batch_size=2 \
  --set parallel.placement=colocate
# (Groups of one learn only without the group baseline: raw rewards as advantages.)
runs rl_sparse 4 run $deck --set eval.path= --set rollout.rollout_batch_size=1 --set rollout.n_samples_per_prompt=1 \
  --set train.global_batch_size=1 --set train.disable_rewards_normalization=true
# 2 samples on 2 trainers in 2 optimizer steps: each rank's first half is empty.
runs rl_empty_step 4 run $deck --set eval.path= --set rollout.rollout_batch_size=2 \
  --set rollout.n_samples_per_prompt=1 --set train.num_steps_per_rollout=2 --set train.disable_rewards_normalization=true

# One job per run directory: the first holds it (its reward waits for a file).
timeout 300 $mpirun -np 2 "$slimpi" run $deck --set eval.path= --set parallel.placement=colocate \
  --set reward.style=command \
  --set reward.command="while [ ! -e $out/go ]; do sleep 0.1; done; awk '{print 1}' # $marker" \
  --set run.dir="$out/shared" >"$out/first.log" 2>&1 &
first=$!
for _ in $(seq 600); do grep -q "run directory:" "$out/first.log" 2>/dev/null && break; sleep 0.2; done
timeout 120 $mpirun -np 2 "$slimpi" run $deck --set parallel.placement=colocate --set run.dir="$out/shared" \
  >"$out/second.log" 2>&1 && { echo "second job ran in a busy run.dir"; cat "$out/second.log"; exit 1; }
grep -q "another slimpi job is using it (host $(hostname) pid [0-9]* since" "$out/second.log" \
  || { cat "$out/second.log"; exit 1; }
touch "$out/go"
wait $first || { echo "the first job failed"; cat "$out/first.log"; exit 1; }
echo "hostile_inputs: a second job into a busy run.dir was refused; the first finished"

# --help runs nothing.
(cd "$out" && timeout 60 $mpirun -np 2 "$slimpi" run --help >"$out/help.log" 2>&1) \
  || { echo "--help exited non-zero"; cat "$out/help.log"; exit 1; }
grep -q "Usage" "$out/help.log" && test ! -e "$out/runs" || { echo "--help ran the command"; exit 1; }
echo "hostile_inputs: OK"
