#!/usr/bin/env bash
# On-policy distillation end to end (train.opd_kl_coef, [teacher]):
#  * a teacher made here (60 SFT steps of the smoke shape on addition);
#  * pure distillation (train.opd_task_reward = false), np 2 colocated, 30 steps from the
#    seeded init: the reverse KL logp_student - logp_teacher on the student's own samples
#    falls to under a third, the student's log-probs of its samples rise;
#  * slime's numbers: rollouts.h5 holds teacher_log_probs, and numpy recomputes every
#    trained token's advantage A - opd_kl_coef * (old_log_prob - teacher_log_prob) with A the
#    GRPO reward (np 4 split, opd_kl_coef 0.3, task reward kept), |diff| < 1e-6;
#  * the top-k distillation loss (train.opd_topk_loss_coef, teacher.top_k 8) under tensor
#    parallelism: its KL from the teacher's top-k to the student halves, the reverse KL falls;
#  * a teacher equal to the student (both from the teacher's file) gives zero KL and the
#    advantages of the same run without a teacher, bit for bit;
#  * the teacher on the router (teacher.placement = "rollout"): the teacher log-probs and
#    advantages of the trainer-placed run to 1e-5 / 1e-4 (other micro-batches), its time in
#    perf/teacher_time;
#  * resume is bit for bit with a teacher: 2 + 2 job steps equal 4 straight, on the
#    trainers (synchronous) and on the router (one step off: the pending batch keeps its
#    teacher log-probs);
#  * refused with the reason: no teacher.path, a missing one, a Hugging Face teacher whose
#    tokenizer is not the student's, a slimpi teacher of another shape, teacher.top_k beyond
#    the vocabulary, teacher keys without opd_kl_coef, the router's teacher when colocated or
#    with the top-k loss; each within seconds (no rank left waiting).
# Usage: opd_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
compare="/usr/bin/python3 $root/tests/regression/compare_runs.py"

echo "== the teacher: 60 SFT steps"
args=(run inputs/smoke_rl.toml --set eval.interval=0 --set train.lr=3e-3)
run 2 teacher --set train.mode=sft --set run.n_steps=60 --set parallel.placement=colocate \
  --set data.path=inputs/data/addition_sft.jsonl --set train.global_batch_size=32
teacher="$out/teacher/trainer_state.h5"
args+=(--set train.opd_kl_coef=1.0 --set "teacher.path=$teacher")

echo "== pure distillation, 30 steps"
run 2 distil --set run.n_steps=30 --set parallel.placement=colocate --set train.opd_task_reward=false
grep -q "teacher: $teacher (the student's shape" "$out/distil.log"

echo "== the top-k distillation loss, tensor parallel (np 4: 2 trainer ranks of one tensor group + 2 rollout)"
run 4 topk --set run.n_steps=30 --set train.opd_task_reward=false --set train.opd_topk_loss_coef=1.0 \
  --set teacher.top_k=8 --set parallel.tensor_parallel=2 --set parallel.trainer_ranks=2

echo "== np 4 split: the advantages against slime's formula"
run 4 numbers --set run.n_steps=2 --set train.opd_kl_coef=0.3

echo "== the teacher on the router (teacher.placement = rollout): the trainer-placed run's numbers"
run 4 on_router --set run.n_steps=2 --set train.opd_kl_coef=0.3 --set teacher.placement=rollout

echo "== a teacher equal to the student"
run 2 same --set run.n_steps=1 --set parallel.placement=colocate --set "model.init_from=$teacher"
args=(run inputs/smoke_rl.toml --set eval.interval=0 --set train.lr=3e-3)
run 2 same_plain --set run.n_steps=1 --set parallel.placement=colocate --set "model.init_from=$teacher"

/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
with h5py.File(f"{out}/distil/metrics.h5") as f:
    kl, logp = f["steps/train/opd_reverse_kl"][:30], f["steps/rollout/log_probs"][:30]
first, last = kl[:3].mean(), kl[-3:].mean()
assert last < first / 3, f"reverse KL {first:.3f} -> {last:.3f}"
assert logp[-3:].mean() > logp[:3].mean() + 0.5, (logp[:3], logp[-3:])
print(f"opd_runs: pure distillation: reverse KL {first:.3f} -> {last:.3f} in 30 steps, "
      f"student log-probs {logp[:3].mean():.2f} -> {logp[-3:].mean():.2f}")
with h5py.File(f"{out}/topk/metrics.h5") as f:
    topk, kl = f["steps/train/opd_topk_kl"][:30], f["steps/train/opd_reverse_kl"][:30]
assert topk[-3:].mean() < topk[:3].mean() / 2 and kl[-3:].mean() < kl[:3].mean() / 3, (topk, kl)
print(f"opd_runs: with the top-k loss (k 8, tensor parallel 2): top-k KL {topk[:3].mean():.3f} -> "
      f"{topk[-3:].mean():.3f}, reverse KL {kl[:3].mean():.3f} -> {kl[-3:].mean():.3f}")

def rows(g, name, idx):
    off, vals = g[name + "/offsets"][:], g[name + "/values"][:]
    return [vals[off[i]:off[i + 1]].astype(np.float64) for i in idx]

worst, n = 0.0, 0
with h5py.File(f"{out}/numbers/rollouts.h5") as f:
    s = f["samples"]
    idx = np.nonzero(s["status"][:] <= 2)[0]
    old, teach, raw = rows(s, "old_log_probs", idx), rows(s, "teacher_log_probs", idx), rows(s, "raw_advantages", idx)
    for i, r in zip(range(len(idx)), s["reward"][:][idx]):
        want = r - 0.3 * (old[i] - teach[i])  # loss.py apply_opd_kl_to_advantages on GRPO's returns
        worst = max(worst, np.abs(want - raw[i]).max())
        n += len(want)
assert n > 0 and worst < 1e-6, (n, worst)
print(f"opd_runs: {n} tokens' advantages equal slime's A - coef * (logp - logp_teacher) to {worst:.1e}")

with h5py.File(f"{out}/numbers/rollouts.h5") as a, h5py.File(f"{out}/on_router/rollouts.h5") as b:
    ta, tb = a["samples/teacher_log_probs/values"][:], b["samples/teacher_log_probs/values"][:]
    aa, ab = a["samples/advantages/values"][:], b["samples/advantages/values"][:]
    assert ta.shape == tb.shape and ta.size > 0 and np.abs(ta - tb).max() < 1e-5, np.abs(ta - tb).max()
    assert np.abs(aa - ab).max() < 1e-4, np.abs(aa - ab).max()
with h5py.File(f"{out}/on_router/metrics.h5") as f:
    assert np.all(f["steps/perf/teacher_time"][:2] > 0)
print(f"opd_runs: the router's teacher gives the trainers' teacher log-probs to {np.abs(ta - tb).max():.1e} and "
      f"advantages to {np.abs(aa - ab).max():.1e}")

with h5py.File(f"{out}/same/metrics.h5") as f:
    assert f["steps/train/opd_reverse_kl"][0] == 0.0
with h5py.File(f"{out}/same/rollouts.h5") as a, h5py.File(f"{out}/same_plain/rollouts.h5") as b:
    for name in ("advantages/values", "raw_advantages/values", "tokens/values"):
        assert np.array_equal(a["samples/" + name][:], b["samples/" + name][:]), name
    assert np.array_equal(a["samples/teacher_log_probs/values"][:], a["samples/old_log_probs/values"][:])
print("opd_runs: a teacher equal to the student: zero KL, the plain run's advantages bit for bit")
PY

echo "== resume with a teacher: 2 + 2 job steps equal 4 straight"
args+=(--set train.opd_kl_coef=0.5 --set "teacher.path=$teacher")
run 4 straight --set run.n_steps=4
run 4 chunked --set run.n_steps=4 --set run.job_steps=2
run 4 chunked --set run.n_steps=4 --set run.job_steps=2
$compare "$out/straight" "$out/chunked"
echo "== the router's teacher with train.async = one_step_off: 2 + 2 job steps equal 4 straight"
args+=(--set teacher.placement=rollout --set train.async=one_step_off)
run 4 straight_router --set run.n_steps=4
run 4 chunked_router --set run.n_steps=4 --set run.job_steps=2
run 4 chunked_router --set run.n_steps=4 --set run.job_steps=2
$compare "$out/straight_router" "$out/chunked_router"

args=(run inputs/smoke_rl.toml --set eval.interval=0 --set run.n_steps=1)
# (one refusal as a job: every rank stops; the deck's through `slimpi check`, one process)
refused no_teacher "train.opd_kl_coef = 1 (--set) needs a teacher: set teacher.path" 2 --set train.opd_kl_coef=1
check_refuses missing_teacher "teacher.path = \"$out/nowhere\" (--set) does not exist" 2 --set train.opd_kl_coef=1 \
  --set "teacher.path=$out/nowhere"
check_refuses other_vocabulary "its tokenizer" 2 --set train.opd_kl_coef=1 \
  --set teacher.path=tests/fixtures/hf/qwen2_with_tokenizer
grep -q "is not the student's" "$out/other_vocabulary.log"
mkdir -p "$out/bad_config" && echo '{"model_type": ' >"$out/bad_config/config.json"
check_refuses bad_teacher_config "(teacher.path, --set): not valid JSON" 2 --set train.opd_kl_coef=1 \
  --set "teacher.path=$out/bad_config"
if grep -q "model.init_from" "$out/bad_teacher_config.log"; then
  cat "$out/bad_teacher_config.log"; echo "FAIL: a teacher's config.json reported under model.init_from"; exit 1
fi
run 2 wide --set train.mode=sft --set run.n_steps=1 --set parallel.placement=colocate \
  --set data.path=inputs/data/addition_sft.jsonl --set model.hidden_size=64
refused wrong_shape "the teacher's weights $out/wide/trainer_state.h5 do not fit the student's shape" 2 \
  --set train.opd_kl_coef=1 --set "teacher.path=$out/wide/trainer_state.h5"
check_refuses deeper_teacher "is a slimpi checkpoint of 2 layer(s), 0 of them MoE; a checkpoint teacher takes the student's shape, 1 layer(s)" \
  2 --set train.opd_kl_coef=1 --set "teacher.path=$teacher" --set model.n_layers=1
check_refuses top_k_too_large "teacher.top_k = 300 (--set) exceeds the 260 ids both the teacher and the student" 2 \
  --set train.opd_kl_coef=1 --set "teacher.path=$teacher" --set train.opd_topk_loss_coef=1 --set teacher.top_k=300
# A NaN teacher makes the trainers' loss NaN: in split placement the rollout ranks wait for
# them at the record barrier, and the job must still end in seconds with the message (it
# waited for parallel.timeout_s = 600 s, printing nothing), as it does colocated.
cp "$teacher" "$out/nan_teacher.h5"
/usr/bin/python3 -c "
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], 'r+') as f:
    w = f['model/lm_head.weight']
    w[0, :] = np.nan
" "$out/nan_teacher.h5"
for placement in split colocate; do
  start=$SECONDS
  refused "nan_teacher_$placement" "stopping before they reach the weights" 4 --set train.opd_kl_coef=1 \
    --set "teacher.path=$out/nan_teacher.h5" --set parallel.placement=$placement
  [ $((SECONDS - start)) -le 90 ] || { cat "$out/nan_teacher_$placement.log"; echo "FAIL: took $((SECONDS - start)) s"; exit 1; }
  n=$(grep -c "stopping before they reach the weights" "$out/nan_teacher_$placement.log")
  [ "$n" = 1 ] || { cat "$out/nan_teacher_$placement.log"; echo "FAIL: the message was printed $n times"; exit 1; }
done
check_refuses teacher_without_opd "teacher.path (--set) configures on-policy distillation" 2 --set "teacher.path=$teacher"
check_refuses router_colocated "parallel.placement = \"colocate\" (--set) has none" 2 --set train.opd_kl_coef=1 \
  --set "teacher.path=$teacher" --set teacher.placement=rollout --set parallel.placement=colocate
check_refuses router_topk "the teacher's top-k ids do not travel with the samples" 2 --set train.opd_kl_coef=1 \
  --set "teacher.path=$teacher" --set teacher.placement=rollout --set train.opd_topk_loss_coef=1
echo "opd_runs: passed"
