#!/usr/bin/env bash
# slime's per-rollout math, end to end (np 4: 2 trainer + 2 rollout ranks, 3 steps):
# every number the trainers used is in rollouts.h5, and numpy recomputes it from the
# file with slime's formulas (loss.py compute_advantages_and_returns, ppo_utils.py):
#  * reinforce_plus_plus, kl_coef 0.05: kl = compute_approx_kl(old, ref, k1); token
#    rewards −kl_coef·kl·m + R at the last masked token; G_t = Σ γ^k r_{t+k}; whitened
#    over the whole rollout on both trainers — stored advantages |Δ| < 1e-5, and the
#    KL really acts (non-zero from step 1 on);
#  * reinforce_plus_plus_baseline, kl_coef 0.05: A = (R − group mean) − kl_coef·kl;
#  * rloo: r = R − the mean of the group's other samples, A_t = r;
#  * remax (one step off): each group's greedy response is recorded (status 7, index n,
#    never trained), r = R − its reward, rollout/remax_greedy_reward their mean;
#  * grpo with 2 optimizer steps per rollout: whitened once per rollout (not per
#    optimizer step: the per-step whitening differs and is rejected);
#  * top_k 3 + top_p 0.9: log-probs over the sampling support; at step 0 the trainer's
#    old log-probs equal the engine's (|Δ| < 1e-5) and ppo_kl is 0;
#  * a short batch (the filter kept fewer groups than rollout_batch_size) is logged as
#    rollout/short_batch_groups;
#  * the step table's phase times are what their names say (no empty phase).
# The untrained smoke model answers no sum right, so the reward is a command that
# varies with the response (its JSON line's length mod 5), and an entropy bonus moves
# the policy away from the reference.
# Usage: rl_math.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
run() {
  local name=$1; shift
  $mpirun -np 4 "$slimpi" run inputs/smoke_rl.toml --set run.n_steps=3 --set run.dir="$out/$name" \
    --set eval.path="" --set train.entropy_coef=0.05 --set reward.style=command \
    --set reward.command="awk '{print length(\$0) % 5}'" "$@" >"$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
}
run rfpp --set train.advantage_estimator=reinforce_plus_plus --set train.kl_coef=0.05 \
  --set train.normalize_advantages=true --set rollout.temperature=1.3
run rfpp_baseline --set train.advantage_estimator=reinforce_plus_plus_baseline --set train.kl_coef=0.05 \
  --set train.normalize_advantages=true --set train.gamma=0.9 --set rollout.temperature=1.3
run grpo_white --set train.normalize_advantages=true
run rloo --set train.advantage_estimator=rloo --set rollout.temperature=1.3
run remax --set train.advantage_estimator=remax --set rollout.temperature=1.3 --set train.async=one_step_off
run top_pk --set rollout.top_k=3 --set rollout.top_p=0.9
# Even groups score 0 (dropped by the filter), odd ones vary: half a batch per round.
run short --set rollout.dynamic_filter=nonzero_std --set rollout.max_sampling_rounds=1 \
  --set reward.command="awk '{g = int((NR - 1) / 4); print (g % 2 == 0) ? 0 : length(\$0) % 5}'"

/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np

out = sys.argv[1]

def rows(g, name, idx):
    off = g[name + "/offsets"][:]
    vals = g[name + "/values"][:]
    return [vals[off[i]:off[i + 1]].astype(np.float64) for i in idx]

def whiten(advs):  # slime's distributed_masked_whiten (masks all ones here), over the rollout
    flat = np.concatenate(advs)
    n = flat.size
    mean = flat.mean()
    var = ((flat ** 2).mean() - mean ** 2) * n / (n - 1)
    return [(a - mean) / np.sqrt(var + 1e-8) for a in advs]

def check(name, estimator, kl_coef, gamma=1.0, n_per_group=4):
    with h5py.File(f"{out}/{name}/rollouts.h5") as f:
        g = f["samples"]
        step, status = g["step"][:], g["status"][:]
        worst, kl_seen = 0.0, 0.0
        for s in range(3):
            idx = np.flatnonzero((step == s) & np.isin(status, [1, 2]))
            old, ref, kl = rows(g, "old_log_probs", idx), rows(g, "ref_log_probs", idx), rows(g, "kl", idx)
            raw_adv, adv = rows(g, "raw_advantages", idx), rows(g, "advantages", idx)
            reward, raw_reward = g["reward"][idx].astype(np.float64), g["raw_reward"][idx].astype(np.float64)
            want_adv = []
            for i in range(len(idx)):
                k1 = old[i] - ref[i]  # compute_approx_kl, kl_loss_type k1
                assert np.allclose(kl[i], k1, atol=1e-6), (name, s, i)
                kl_seen = max(kl_seen, np.abs(k1).max())
                if estimator == "reinforce_plus_plus":
                    assert reward[i] == raw_reward[i]  # no group post-processing
                    r = -kl_coef * k1
                    r[-1] += raw_reward[i]
                    G = np.zeros_like(r)
                    running = 0.0
                    for t in reversed(range(r.size)):
                        running = r[t] + gamma * running
                        G[t] = running
                    want_adv.append(G)
                else:  # reinforce_plus_plus_baseline: r = R − group mean
                    grp = raw_reward[(i // n_per_group) * n_per_group:(i // n_per_group + 1) * n_per_group]
                    assert abs(reward[i] - (raw_reward[i] - grp.mean())) < 1e-6
                    want_adv.append(reward[i] - kl_coef * k1)
            for a, b in zip(raw_adv, want_adv):
                worst = max(worst, np.abs(a - b).max())
            for a, b in zip(adv, whiten(want_adv)):
                worst = max(worst, np.abs(a - b).max())
        assert worst < 1e-5, (name, worst)
        assert kl_seen > 1e-4, (name, "the KL never acted", kl_seen)
        print(f"rl_math: {name}: advantages = slime's to {worst:.2e} over 3 steps (max |kl| {kl_seen:.3g})")

check("rfpp", "reinforce_plus_plus", 0.05)
check("rfpp_baseline", "reinforce_plus_plus_baseline", 0.05, gamma=0.9)

# GRPO, whitened once per rollout although the rollout trains in 2 optimizer steps.
with h5py.File(f"{out}/grpo_white/rollouts.h5") as f, h5py.File(f"{out}/grpo_white/metrics.h5") as m:
    g = f["samples"]
    assert np.all(m["steps/train/optimizer_steps"][:3] == 2)
    for s in range(3):
        idx = np.flatnonzero((g["step"][:] == s) & np.isin(g["status"][:], [1, 2]))
        raw, adv = rows(g, "raw_advantages", idx), rows(g, "advantages", idx)
        for i, a in enumerate(raw):
            assert np.allclose(a, g["reward"][idx[i]], atol=1e-6)  # A_t = r
        whole = whiten(raw)
        assert max(np.abs(a - b).max() for a, b in zip(adv, whole)) < 1e-5, s
        half = len(raw) // 2
        per_step = whiten(raw[:half]) + whiten(raw[half:])
        assert max(np.abs(a - b).max() for a, b in zip(adv, per_step)) > 1e-3, "indistinguishable from per-step"
print("rl_math: grpo: whitened once per rollout over both trainers")

# RLOO: each reward less the mean of its group's other samples (verl's
# compute_rloo_outcome_advantage), the same on every token; a group's rewards sum to 0.
with h5py.File(f"{out}/rloo/rollouts.h5") as f:
    g = f["samples"]
    worst, moved = 0.0, 0.0
    for s in range(3):
        idx = np.flatnonzero((g["step"][:] == s) & np.isin(g["status"][:], [1, 2]))
        R, r = g["raw_reward"][idx].astype(np.float64), g["reward"][idx].astype(np.float64)
        for start in range(0, len(idx), 4):
            grp = R[start:start + 4]
            want = grp - (grp.sum() - grp) / 3
            worst = max(worst, np.abs(r[start:start + 4] - want).max(), abs(r[start:start + 4].sum()))
            moved = max(moved, np.abs(want).max())
        for i, a in enumerate(rows(g, "raw_advantages", idx)):
            assert np.allclose(a, r[i], atol=1e-6)
    assert worst < 1e-5 and moved > 0, (worst, moved)
print(f"rl_math: rloo: rewards less the mean of the others to {worst:.1e}, groups sum to 0")

# ReMax: one greedy response per group, recorded apart (status 7, index n); the group's
# rewards less its reward (verl's compute_remax_outcome_advantage), on every token.
with h5py.File(f"{out}/remax/rollouts.h5") as f, h5py.File(f"{out}/remax/metrics.h5") as m:
    g = f["samples"]
    step, status, group, index = g["step"][:], g["status"][:], g["group_index"][:], g["index"][:]
    worst, moved = 0.0, 0.0
    for s in range(3):
        base = {int(group[i]): i for i in np.flatnonzero((step == s) & (status == 7))}
        trained = np.flatnonzero((step == s) & np.isin(status, [1, 2]))
        assert len(trained) == 32 and all(index[i] == 4 for i in base.values()), (len(trained), len(base))
        greedy_mean = float(np.mean([g["raw_reward"][i] for i in base.values()]))
        assert abs(m["steps/rollout/remax_greedy_reward"][s] - greedy_mean) < 1e-6
        for i in trained:
            want = g["raw_reward"][i] - g["raw_reward"][base[int(group[i])]]
            worst = max(worst, abs(g["reward"][i] - want))
            moved = max(moved, abs(want))
        for i, a in zip(trained, rows(g, "raw_advantages", trained)):
            assert np.allclose(a, g["reward"][i], atol=1e-6)
    assert worst < 1e-6 and moved > 0, (worst, moved)
print(f"rl_math: remax: rewards less the group's greedy reward to {worst:.1e}, the greedy responses recorded apart")

# Top-k/top-p: log-probs over the sampling support on both sides.
with h5py.File(f"{out}/top_pk/rollouts.h5") as f, h5py.File(f"{out}/top_pk/metrics.h5") as m:
    g = f["samples"]
    sup = g["sampling_support/values"][:]
    assert sup.size == g["rollout_log_probs/values"].shape[0], "a support size per generated token"
    assert sup.min() >= 1 and sup.max() <= 3, (sup.min(), sup.max())
    idx = np.flatnonzero((g["step"][:] == 0) & np.isin(g["status"][:], [1, 2]))
    d = max(np.abs(a - b).max() for a, b in zip(rows(g, "rollout_log_probs", idx), rows(g, "old_log_probs", idx)))
    assert d < 1e-5, d
    assert m["steps/train_step/0/train_rollout_logprob_abs_diff"][0] < 1e-5
    assert abs(m["steps/train_step/0/ppo_kl"][0]) < 1e-8
print(f"rl_math: top_k 3 / top_p 0.9: |logp_trainer - logp_rollout| = {d:.1e} at step 0, ppo_kl 0")

# A short batch is counted; the phases' times are what their names say.
with h5py.File(f"{out}/short/metrics.h5") as m:
    cols = m["steps"].attrs["columns"].decode().split()
    short = m["steps/rollout/short_batch_groups"][:3]
    dropped = m["steps/rollout/dynamic_filter/drop_zero_std"][:3]
    assert np.array_equal(short, dropped), (short, dropped)  # one round: every dropped group is missing
    assert short.sum() > 0, short
    for phase in ["rollout", "reward", "buffer", "train", "record", "weight_sync"]:
        assert f"perf/{phase}_time" in cols, phase
    assert "perf/prompts_time" not in cols
    assert np.all(m["steps/perf/reward_score_time"][:3] > 0)
    assert np.all(m["steps/perf/rollout_time"][:3] >= m["steps/perf/reward_score_time"][:3])
    tail = m["steps/perf/rollout_tail_time"][:3]  # the rounds' last 10% of groups: within the rollout
    assert np.all(tail >= 0) and np.all(tail <= m["steps/perf/rollout_time"][:3]), tail
print(f"rl_math: short batches logged ({short}), phases ok")
PY
echo "rl_math: OK"
