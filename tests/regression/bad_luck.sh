#!/usr/bin/env bash
# Bad input and bad luck, third round (the full disk is tests/regression/full_disk.sh):
#  * a reward.command_timeout_s not below parallel.timeout_s is refused naming both;
#    a reward command and its own child die with the job when the router rank is
#    killed (kill -9) and when mpirun is interrupted (no process of the job is left);
#  * a Hugging Face directory without config.json is refused naming the directory;
#  * a model's own chat template is noticed: one line when data.chat_template = none
#    ignores it, "auto" uses a recognised one and refuses an unknown one;
#  * model.max_seq_len below config.json's max_position_embeddings is allowed and said;
#  * GRPO groups of one are refused; a global_batch_size that does not divide a
#    rollout says what the optimizer steps will be;
#  * `slimpi export` takes a run directory, a checkpoint root, a checkpoint, and a
#    trainer_state.h5 (the same weights each time); export into the checkpoint is
#    refused; an SFT run stopped by eval.stop_at_pass1 leaves a checkpoint to export,
#    stays stopped when resumed under the same target and goes on without one;
#  * messages: a reward command that answers too many numbers says so; a collective
#    error is one line of its own; the short-batch warning is given once; a damaged
#    rollouts.h5 at resume says what to do (and doing it works).
# Usage: bad_luck.sh SLIMPI ROOT "MPIRUN FLAGS"
set -uo pipefail
slimpi=$1; root=$2; mpirun=$3
out=$(mktemp -d)
marker="slimpi_bad_luck_$$"
cleanup() { pkill -9 -f "$marker" 2>/dev/null; [ -n "${KEEP_OUT:-}" ] || rm -rf "$out"; }
trap cleanup EXIT
cd "$root"
deck="inputs/smoke_rl.toml --set run.n_steps=2"
fixture=tests/fixtures/hf/qwen2_with_tokenizer

tag=bad_luck
source "$root/tests/regression/run_helpers.sh"
fails() { job_fails "$@"; }  # NAME PATTERN NP ARGS...
runs() { job_runs "$@"; }    # NAME NP ARGS...
said() {  # NAME PATTERN: the log of NAME holds PATTERN
  grep -qF -- "$2" "$out/$1.log" || { echo "FAIL: $1: no '$2'"; cat "$out/$1.log"; exit 1; }
}

echo "== 2. reward commands and the watchdog"
fails slow_reward "reward.command_timeout_s = 60 (--set) must be below parallel.timeout_s = 40 (--set)" 4 run $deck \
  --set reward.style=command --set reward.command="sleep 1000" --set reward.command_timeout_s=60 \
  --set parallel.timeout_s=40 --set run.dir="$out/slow_reward"

# The command records its own pid, its child's and the rank's (its parent), then sleeps.
sleeper="sleep 1001 & echo \$! >$out/PIDS.tmp; echo \$\$ >>$out/PIDS.tmp; echo \$PPID >$out/RANK; mv $out/PIDS.tmp $out/PIDS; exec sleep 1000 # $marker"
dies_with_job() {  # HOW: start a job whose reward command sleeps, end it HOW, check nothing is left
  local how=$1 job left
  rm -f "$out/PIDS" "$out/RANK"
  $mpirun -np 4 "$slimpi" run $deck --set eval.path= --set reward.style=command --set reward.command="$sleeper" \
    --set reward.command_timeout_s=300 --set run.dir="$out/$how" >"$out/$how.log" 2>&1 &
  job=$!
  for _ in $(seq 600); do [ -s "$out/PIDS" ] && break; sleep 0.1; done
  [ -s "$out/PIDS" ] || { kill -9 $job; cat "$out/$how.log"; echo "FAIL: $how: the reward command never started"; exit 1; }
  if [ "$how" = kill9_router ]; then
    [ "$(cat /proc/"$(cat "$out/RANK")"/comm)" = slimpi ] || { kill -9 $job; echo "FAIL: $out/RANK is no slimpi rank"; exit 1; }
    kill -9 "$(cat "$out/RANK")"
  else
    kill -INT $job
  fi
  for _ in $(seq 600); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
  kill -0 $job 2>/dev/null && { kill -9 $job; cat "$out/$how.log"; echo "FAIL: $how: the job did not end in 60 s"; exit 1; }
  wait $job
  for _ in $(seq 100); do
    left=$(for p in $(cat "$out/PIDS"); do kill -0 "$p" 2>/dev/null && echo "$p"; done; pgrep -f "$marker")
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || { echo "FAIL: $how: processes outlived the job:"; ps -o pid,ppid,cmd -p $left; exit 1; }
  if pgrep -f "run.dir=$out/$how" >/dev/null; then echo "FAIL: $how: ranks outlived the job"; exit 1; fi
  echo "bad_luck: $how: the reward command and its child died with the job"
}
dies_with_job kill9_router
dies_with_job interrupt_mpirun

echo "== 3. a Hugging Face directory without config.json"
cp -r "$fixture" "$out/no_config"
rm "$out/no_config/config.json"
fails no_config "$out/no_config has model.safetensors but no config.json (model.init_from, --set)" 2 run $deck \
  --set model.init_from="$out/no_config" --set run.dir="$out/no_config_run"

echo "== 4. the model's own chat template; 5. a shorter context than the model's"
printf '{"prompt": "1 + 1 =", "label": "2"}\n{"prompt": "2 + 2 =", "label": "4"}\n' >"$out/prompts.jsonl"
cat >"$out/chat.toml" <<EOF
[model]
init_from = "MODEL"
max_seq_len = 64
[data]
path = "$out/prompts.jsonl"
[rollout]
max_new_tokens = 4
EOF
with_template() {  # DIR JINJA: a copy of the fixture whose tokenizer_config.json ships JINJA
  cp -r "$fixture" "$1"
  /usr/bin/python3 - "$1/tokenizer_config.json" "$2" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["chat_template"] = sys.argv[2]
json.dump(cfg, open(sys.argv[1], "w"))
PY
}
with_template "$out/chatml_model" "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
with_template "$out/odd_model" "{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}"
sed -i "s|MODEL|$out/chatml_model|" "$out/chat.toml"
runs chat_none 2 generate "$out/chat.toml" --set run.dir="$out/chat_none"
said chat_none "the model ships a chat template slimpi renders as \"chatml\" ($out/chatml_model/tokenizer_config.json), but data.chat_template = none (default): prompts are used as they are"
said chat_none "model.max_seq_len = 64 ($out/chat.toml:3) is below max_position_embeddings = 512 in $out/chatml_model/config.json: the run uses the shorter context"
runs chat_auto 2 generate "$out/chat.toml" --set data.chat_template=auto --set run.dir="$out/chat_auto"
said chat_auto "data.chat_template = \"auto\" (--set): $out/chatml_model/tokenizer_config.json holds a chat template slimpi renders as \"chatml\": using it"
fails chat_odd "data.chat_template = \"auto\" (--set): the chat template in $out/odd_model/tokenizer_config.json is not one slimpi implements" \
  2 generate "$out/chat.toml" --set model.init_from="$out/odd_model" --set data.chat_template=auto --set run.dir="$out/chat_odd"

echo "== 6. decks that cannot learn, or train on less than asked"
fails group_of_one "rollout.n_samples_per_prompt = 1 (--set) with train.advantage_estimator = \"grpo\" (default): each reward is centred on its group's mean" \
  2 run $deck --set rollout.n_samples_per_prompt=1 --set run.dir="$out/group_of_one"
runs odd_batch 2 run $deck --set eval.path= --set train.global_batch_size=12 --set run.dir="$out/odd_batch"
said odd_batch "train.global_batch_size = 12 (--set) does not divide the 32 samples of a rollout (rollout.rollout_batch_size x rollout.n_samples_per_prompt): each rollout takes 2 optimizer steps (its samples split evenly over them)"
[ "$(grep -c "does not divide" "$out/odd_batch.log")" = 1 ] || { cat "$out/odd_batch.log"; echo "FAIL: said more than once"; exit 1; }
echo "bad_luck: the optimizer steps of an odd global_batch_size are said once"

echo "== 7. export of a finished run"
runs sft_stop 2 run inputs/quickstart_sft.toml --set eval.stop_at_pass1=0.02 --set eval.interval=5 \
  --set eval.path="inputs/data/addition_dev.jsonl@[0:50]" --set run.dir="$out/sft_stop"
said sft_stop "reached eval.stop_at_pass1 = 0.02: the run ends after this step"
ckpt=$(ls -d "$out"/sft_stop/ckpt/step_* | tail -1)
[ -f "$ckpt/DONE" ] || { ls -R "$out/sft_stop"; echo "FAIL: the stopped SFT run left no finished checkpoint"; exit 1; }
for source in "$out/sft_stop" "$out/sft_stop/ckpt" "$ckpt" "$ckpt/trainer_state.h5" "$out/sft_stop/trainer_state.h5"; do
  name=$(echo "$source" | md5sum | cut -c1-8)
  "$slimpi" export "$source" "$out/hf_$name" >"$out/export_$name.log" 2>&1 \
    || { cat "$out/export_$name.log"; echo "FAIL: export of $source"; exit 1; }
  cmp "$out/hf_$name/config.json" "$out/hf_$(echo "$out/sft_stop" | md5sum | cut -c1-8)/config.json" \
    || { echo "FAIL: export of $source gave another config.json"; exit 1; }
done
PYTHONPATH=tests/regression /usr/bin/python3 - "$out"/hf_*/model.safetensors <<'PY'
import sys
from safetensors_file import SafetensorsFile
def weights(path):  # the data section: the header holds the source path, the tensors do not
    return SafetensorsFile(path).data
first = weights(sys.argv[1])
assert all(weights(p) == first for p in sys.argv[2:]), "exports of one run hold different weights"
print(f"bad_luck: {len(sys.argv) - 1} exports hold the same {len(first)} bytes of weights")
PY
if "$slimpi" export "$out/sft_stop" "$ckpt/hf" >"$out/export_into.log" 2>&1; then echo "FAIL: exported into the checkpoint"; exit 1; fi
grep -qF "export into $ckpt/hf refused: it is (inside) the checkpoint" "$out/export_into.log" \
  || { cat "$out/export_into.log"; exit 1; }
if "$slimpi" export "$out" "$out/hf_none" >"$out/export_none.log" 2>&1; then echo "FAIL: exported a directory that is no run"; exit 1; fi
grep -qF "is not a checkpoint (no deck.json or DONE), a checkpoint root (no step_XXXXXXXX directories) or a run directory" \
  "$out/export_none.log" || { cat "$out/export_none.log"; exit 1; }
echo "bad_luck: export takes a run directory, a checkpoint root, a checkpoint and a trainer_state.h5; refuses the rest"
# Resumed with the same target, the stopped run has nothing left to do; with none (0), it goes on.
next=$((10#${ckpt##*step_}))
stopped=(run inputs/quickstart_sft.toml --set eval.interval=5 --set eval.path="inputs/data/addition_dev.jsonl@[0:50]"
         --set run.dir="$out/sft_stop" --set run.n_steps=$((next + 2)))
runs sft_same 2 "${stopped[@]}" --set eval.stop_at_pass1=0.02
said sft_same "that run had reached eval.stop_at_pass1: no step is left to run"
[ ! -d "$out/sft_stop/ckpt/step_$(printf %08d $((next + 2)))" ] || { echo "FAIL: a run past its target went on"; exit 1; }
runs sft_go_on 2 "${stopped[@]}" --set eval.stop_at_pass1=0
said sft_go_on "which reached its eval.stop_at_pass1; now 0 (--set): it goes on"
[ -f "$out/sft_stop/ckpt/step_$(printf %08d $((next + 2)))/DONE" ] \
  || { ls -R "$out/sft_stop/ckpt"; echo "FAIL: resumed without a target, the stopped run did not go on to its last step"; exit 1; }
echo "bad_luck: a run stopped at eval.stop_at_pass1 stays stopped under the same target and goes on without one"

echo "== 8. messages"
fails too_many "reward.command gave 64 numbers for 32 samples: 32 more than samples" 2 run $deck --set eval.path= \
  --set reward.style=command --set reward.command="awk '{print 1; print 1}'" --set run.dir="$out/too_many"
if grep -q "after the last of" "$out/too_many.log"; then cat "$out/too_many.log"; echo "FAIL: old wording"; exit 1; fi
fails glued "slimpi: error: " 2 run $deck --set rollout.n_samples_per_prompt=1 --set run.dir="$out/glued"
grep "slimpi: error: " "$out/glued.log" | grep -q "^slimpi: error: rollout.n_samples_per_prompt = 1" \
  || { cat "$out/glued.log"; echo "FAIL: the error does not start its own line"; exit 1; }
runs short 2 run $deck --set run.n_steps=6 --set eval.path= --set rollout.dynamic_filter=nonzero_std \
  --set rollout.max_sampling_rounds=1 --set run.dir="$out/short"
n=$(grep -c "groups to train after 1 round(s) of 8 ([0-9]* dropped by the dynamic filter, 0 with an episode the environment failed)" "$out/short.log")
[ "$n" = 1 ] || { cat "$out/short.log"; echo "FAIL: the short-batch warning was given $n times"; exit 1; }
said short "steps of this job trained a short batch (rollout/short_batch_groups in metrics.h5)"
echo "bad_luck: the short-batch warning is given once, then counted"
runs damaged 2 run $deck --set run.n_steps=4 --set run.job_steps=2 --set eval.path= --set run.dir="$out/damaged"
head -c 3000 "$out/damaged/rollouts.h5" >"$out/damaged/rollouts.h5.cut" && mv "$out/damaged/rollouts.h5.cut" "$out/damaged/rollouts.h5"
fails damaged_resume "$out/damaged/rollouts.h5 is damaged and cannot be continued" 2 run $deck --set run.n_steps=4 \
  --set eval.path= --set run.dir="$out/damaged"
said damaged_resume "Move it away (mv $out/damaged/rollouts.h5 $out/damaged/rollouts.h5.damaged) and run again"
mv "$out/damaged/rollouts.h5" "$out/damaged/rollouts.h5.damaged"
runs damaged_again 2 run $deck --set run.n_steps=4 --set eval.path= --set run.dir="$out/damaged"
said damaged_again "resuming at step 2"
echo "bad_luck: a damaged rollouts.h5 says what to do, and doing it resumes the run"
echo "bad_luck: OK"
