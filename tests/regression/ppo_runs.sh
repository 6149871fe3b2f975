#!/usr/bin/env bash
# PPO with a critic (train.advantage_estimator = "ppo", [critic]) end to end:
#  * it learns: np 2 colocated, 40 steps on a reward learnt from scratch
#    (digit_reward.py): the reward rises, the critic's mean value follows the mean return
#    and explains part of its variance;
#  * slime's numbers: np 4 split, kl_coef 0.05 with a reference, gamma 0.97, lambd 0.9,
#    lambd_value 0.95: numpy recomputes from rollouts.h5 (values, kl, reward) the token
#    rewards, slime's vanilla_gae advantages and returns, and the whitening: |diff| < 1e-5;
#  * resume is bit for bit: 2 + 2 job steps equal a straight 4-step run (critic weights
#    and moments included: trainer_state.h5's critic group);
#  * critic.warmup_rollouts = 2: the first two steps train the critic alone;
#  * under tensor parallelism (the critic split as the policy): resume bit for bit, whole
#    tensors in the checkpoint;
#  * refused with the reason: a [critic] key without ppo, ppo under expert parallelism.
# Usage: ppo_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
compare="/usr/bin/python3 $root/tests/regression/compare_runs.py"
args=(run inputs/smoke_rl.toml --set eval.interval=0 --set reward.style=command
      --set "reward.command=/usr/bin/python3 $root/tests/regression/digit_reward.py" --set train.lr=3e-3
      --set train.advantage_estimator=ppo --set critic.lr=1e-3 --set train.normalize_advantages=true)

echo "== np 2 colocated, 40 steps: PPO learns"
run 2 learns --set parallel.placement=colocate --set run.n_steps=40 --set rollout.rollout_batch_size=16 \
  --set rollout.n_samples_per_prompt=8 --set train.global_batch_size=128
grep -q "critic: the policy's architecture, its trunk copied from the policy's initial weights" "$out/learns.log"

echo "== np 4 split, 3 steps: GAE with the KL in the rewards, against slime's formulas"
run 4 gae --set run.n_steps=3 --set train.kl_coef=0.05 --set train.gamma=0.97 --set train.lambd=0.9 \
  --set train.lambd_value=0.95 --set rollout.temperature=1.3

/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
with h5py.File(f"{out}/learns/metrics.h5") as f:
    s = f["steps"]
    r = s["rollout/raw_reward"][:40]
    v, g, ev = s["train/values_mean"][:40], s["train/returns_mean"][:40], s["train/explained_variance"][:40]
first, last = r[:5].mean(), r[-5:].mean()
assert last > first + 0.1, f"PPO did not learn: reward {first:.3f} -> {last:.3f}"
gap = np.abs(v[-10:] - g[-10:]).mean()
assert gap < 0.1, f"the critic's mean value is {gap:.3f} from the mean return over the last 10 steps"
assert np.nanmean(ev[-10:]) > 0, f"explained variance {ev[-10:]}"
print(f"ppo_runs: reward {first:.3f} -> {last:.3f} in 40 steps; |mean V - mean G| {gap:.3f}; "
      f"explained variance {np.nanmean(ev[-10:]):.2f} (last 10 steps)")

def rows(g, name, idx):
    off, vals = g[name + "/offsets"][:], g[name + "/values"][:]
    return [vals[off[i]:off[i + 1]].astype(np.float64) for i in idx]

def vanilla_gae(rewards, values, gamma, lambd):  # slime's ppo_utils.vanilla_gae, one row
    adv, last = np.zeros_like(values), 0.0
    for t in reversed(range(len(values))):
        nxt = values[t + 1] if t + 1 < len(values) else 0.0
        last = rewards[t] + gamma * nxt - values[t] + gamma * lambd * last
        adv[t] = last
    return adv, adv + values

worst = 0.0
with h5py.File(f"{out}/gae/rollouts.h5") as f:
    s = f["samples"]
    for step in range(3):
        idx = np.nonzero((s["step"][:] == step) & (s["status"][:] <= 2))[0]
        assert len(idx) == 32, (step, len(idx))
        vals, kls, rews = rows(s, "values", idx), rows(s, "kl", idx), s["reward"][:][idx]
        raw, adv, ret = rows(s, "raw_advantages", idx), rows(s, "advantages", idx), rows(s, "returns", idx)
        if step > 0:
            assert max(np.abs(k).max() for k in kls) > 0, "the KL never acted"
        want_adv = []
        for i in range(len(idx)):
            tok = -0.05 * kls[i]  # loss.py: token_level_rewards = kl * -kl_coef; [-1] += reward
            tok[-1] += rews[i]
            a, _ = vanilla_gae(tok, vals[i], 0.97, 0.9)
            _, g = vanilla_gae(tok, vals[i], 0.97, 0.95)
            worst = max(worst, np.abs(a - raw[i]).max(), np.abs(g - ret[i]).max())
            want_adv.append(a)
        flat = np.concatenate(want_adv)  # distributed_masked_whiten over the rollout
        mean, var = flat.mean(), ((flat ** 2).mean() - flat.mean() ** 2) * flat.size / (flat.size - 1)
        for i in range(len(idx)):
            worst = max(worst, np.abs((want_adv[i] - mean) / np.sqrt(var + 1e-8) - adv[i]).max())
assert worst < 1e-5, worst
print(f"ppo_runs: GAE advantages, returns and their whitening equal slime's formulas to {worst:.1e}")
PY

echo "== np 4: 2 + 2 job steps equal 4 straight"
run 4 straight --set run.n_steps=4
run 4 chunked --set run.n_steps=4 --set run.job_steps=2
run 4 chunked --set run.n_steps=4 --set run.job_steps=2
$compare "$out/straight" "$out/chunked"
/usr/bin/python3 -c "
import h5py, sys
with h5py.File(sys.argv[1]) as f:
    assert 'critic/model/value_head.weight' in f and 'critic/optimizer/exp_avg/value_head.weight' in f, list(f)
    assert f['critic'].attrs['n_rollouts'] == 4 and f['critic/optimizer'].attrs['n_steps'] == 8
" "$out/chunked/trainer_state.h5"
echo "ppo_runs: resumed PPO run equals the straight one bit for bit (critic included)"

echo "== np 4, the trainers one tensor-parallel group of 2: 2 + 2 job steps equal 4 straight"
run 4 tp_straight --set run.n_steps=4 --set parallel.tensor_parallel=2 --set parallel.trainer_ranks=2
run 4 tp_chunked --set run.n_steps=4 --set parallel.tensor_parallel=2 --set parallel.trainer_ranks=2 \
  --set run.job_steps=2
run 4 tp_chunked --set run.n_steps=4 --set parallel.tensor_parallel=2 --set parallel.trainer_ranks=2 \
  --set run.job_steps=2
$compare "$out/tp_straight" "$out/tp_chunked"
/usr/bin/python3 -c "
import h5py, sys
with h5py.File(sys.argv[1]) as a, h5py.File(sys.argv[2]) as b:  # whole tensors, whatever the layout
    for name in ('critic/model/model.layers.0.mlp.gate_proj.weight', 'critic/model/value_head.weight'):
        assert a[name].shape == b[name].shape, name
" "$out/tp_straight/trainer_state.h5" "$out/straight/trainer_state.h5"
echo "ppo_runs: the tensor-parallel critic resumes bit for bit and stores whole tensors"

echo "== critic.warmup_rollouts = 2"
run 2 warmup --set parallel.placement=colocate --set run.n_steps=3 --set critic.warmup_rollouts=2
/usr/bin/python3 -c "
import h5py, sys
with h5py.File(sys.argv[1]) as f:
    s = f['steps']
    steps, critic = list(s['train/optimizer_steps'][:3]), list(s['train/critic_steps'][:3])
assert steps == [0, 0, 2] and critic == [2, 2, 2], (steps, critic)
" "$out/warmup/metrics.h5"
grep -q "critic warm-up rollout 2 of 2" "$out/warmup.log"
echo "ppo_runs: the first two rollouts trained the critic alone"

echo "== critic.init_from: read by a fresh start only; named when it cannot be read"
cp "$out/straight/trainer_state.h5" "$out/critic_init.h5"
run 2 init_critic --set parallel.placement=colocate --set run.n_steps=2 --set run.job_steps=1 \
  --set "critic.init_from=$out/critic_init.h5"
grep -q "critic: trunk and value head from $out/critic_init.h5" "$out/init_critic.log"
rm "$out/critic_init.h5"  # gone: the resumed job takes the critic from its checkpoint
run 2 init_critic --set parallel.placement=colocate --set run.n_steps=2 --set run.job_steps=1 \
  --set "critic.init_from=$out/critic_init.h5"
grep -q "is not read: the critic resumes from" "$out/init_critic.log"
# (one refusal as a job: every rank stops; the deck's through `slimpi check`, one process)
refused critic_init_missing "critic.init_from = \"$out/nowhere.h5\": no such file or directory" 2 \
  --set "critic.init_from=$out/nowhere.h5" --set run.n_steps=1
echo 'not hdf5' >"$out/garbage.h5"
refused critic_init_garbage "critic.init_from = \"$out/garbage.h5\" cannot be loaded" 2 \
  --set "critic.init_from=$out/garbage.h5" --set run.n_steps=1
"$slimpi" check inputs/smoke_rl.toml --np 2 --set train.advantage_estimator=ppo \
  --set "critic.init_from=$out/nowhere.h5" --set "run.dir=$out/check_only" >"$out/check_init.log" 2>&1 \
  || { cat "$out/check_init.log"; echo "FAIL: check refused the deck"; exit 1; }
grep -qF "note: critic.init_from = \"$out/nowhere.h5\" (--set) does not exist (yet)" "$out/check_init.log" \
  || { cat "$out/check_init.log"; echo "FAIL: check did not name critic.init_from"; exit 1; }
check_refuses lambd_value "train.lambd_value = -0.5 (--set) is GAE's lambda of the value targets: a value in [0, 1], or -1" 2 \
  --set train.lambd_value=-0.5 --set run.n_steps=1

check_refuses critic_without_ppo "critic.lr (--set) configures the critic of train.advantage_estimator = \"ppo\"" 2 \
  --set train.advantage_estimator=grpo --set run.n_steps=1
check_refuses ppo_ep "the critic is not expert-parallel yet" 4 --set model.n_experts=4 --set parallel.expert_parallel=2 \
  --set run.n_steps=1
echo "ppo_runs: passed"
