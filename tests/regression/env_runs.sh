#!/usr/bin/env bash
# Multi-turn environments end to end (rollout.environment, docs/environments.md):
#  * protocol conformance against a real environment process (tests/fixtures/envs/probe_env.py:
#    three model turns per episode, whatever the model writes) at np 1 (colocated), 2 (split),
#    4 (split, two engines) and 4 (colocated): every trained trajectory, token by token, is the
#    environment's log of what it received (the model's turns, loss_mask 1) and sent (its
#    observations, loss_mask 0); the trainer's log-probs equal the engine's on the model's
#    tokens; the first step's episodes are the same tokens in every layout; the environment's
#    metrics are each episode's sums (rollouts.h5 env_metrics) and their means (metrics.h5);
#  * the environment's own first observation (reset with messages);
#  * an environment that opens a new context (new_context) splits each trajectory in two:
#    recorded (context_starts), and the trainer's log-probs equal the engine's;
#  * the in-process calculator and inputs/envs/calculator.py give the same run, bit for bit;
#  * environments that crash, hang, write garbage, flood, lie (a token id past the vocabulary),
#    answer an over-long observation, give up (an error reply) or close their stdout end only their episode, with
#    its status and error class in rollouts.h5, and the job goes on; with rollout.env_fail_job
#    the job ends naming the episode;
#  * a process that crashes under an environment that takes snapshots: its episodes are
#    brought back (restored from their snapshots, their nonces kept, or reset again), every
#    one completes, the culprit too (it crashes once);
#  * a chat template that rewrites history (qwen3 without thinking) ends the job, said so;
#  * one step off, kill -9 inside a checkpoint's write and resumed from the one before: the same run as straight
#    through, every episode trained once, and no environment process outlives its rank;
#  * threads (probe_env.py --threads: a new context, then the first resumed) under full async
#    over two job steps with snapshots: episodes restored past their first turn resume and
#    join their left context; every three-turn episode holds its two threads once;
#  * full async (np 3: 1 trainer + 2 engines): episodes in flight across weight updates and
#    checkpoints; kill -9 inside checkpoint 4's write and resumed from checkpoint 2: every
#    episode drawn is trained or held exactly once (check_full_async.py), and every episode
#    under way in checkpoint 2 (some past their first turns) ends as a trajectory that begins
#    with the checkpointed tokens, log-probs and loss mask bit for bit: with a deterministic
#    environment replayed into a fresh process (the environment's log shows its model turns
#    sent again unchanged); with one that is not and takes snapshots (probe_env.py
#    --snapshots) restored from the checkpoint's snapshot (one restore each, only a turn
#    waiting for its reply sent again, the nonce its reset drew kept);
#    a group with an episode its environment failed is recorded, not trained; an environment
#    that fails every episode leaves short batches, not a stalled run;
#  * slimpi generate runs episodes; postprocess/transcript.py shows one;
#  * refused with the reason: an environment without reward.style = "environment" and the
#    reverse, full async with rollout.partial other than continue, ReMax, command keys without the command environment, a command
#    that never says hello.
# Usage: env_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
compare="/usr/bin/python3 $root/tests/regression/compare_runs.py"
probe="python3 $root/tests/fixtures/envs/probe_env.py"
base=(run inputs/smoke_rl.toml --set model.max_seq_len=96 --set rollout.environment=command
      --set reward.style=environment --set rollout.env_max_turns=3 --set rollout.env_max_total_tokens=64
      --set eval.path=)

echo "== conformance: np 1, 2, 4 split and 4 colocated"
args=("${base[@]}" --set run.n_steps=2)
run 1 np1 --set parallel.placement=colocate --set "rollout.env_command=$probe --log $out/np1.envlog"
run 2 np2 --set "rollout.env_command=$probe --log $out/np2.envlog"
run 4 np4 --set "rollout.env_command=$probe --log $out/np4.envlog"
run 4 np4c --set parallel.placement=colocate --set "rollout.env_command=$probe --log $out/np4c.envlog"
# The environment's hello is logged once, by the router, in split placement too (it was not).
for name in np2 np4 np4c; do
  n=$(grep -cF "rollout.environment = \"command\" ('$probe --log $out/$name.envlog'): 'probe' (protocol 1, 64 concurrent episodes a process, deterministic, no snapshots)" "$out/$name.log" || true)
  [ "$n" = 1 ] || { cat "$out/$name.log"; echo "FAIL: $name: the environment's hello was logged $n times"; exit 1; }
done
run 2 resetmsg --set "rollout.env_command=$probe --reset-messages --log $out/resetmsg.envlog"

/usr/bin/python3 - "$out" <<'PY'
import json, sys
import h5py, numpy as np
out = sys.argv[1]

def episodes_in_log(name):
    """episode -> [("model", ids), ("env", bytes), ...] from the environment's own log."""
    eps, resets = {}, {}
    steps_text.clear()
    for rec in map(json.loads, open(f"{out}/{name}.envlog")):
        msg = json.loads(rec["line"])
        if rec["dir"] == "in" and msg["type"] == "reset":
            eps[msg["episode"]] = []
        elif rec["dir"] == "out" and msg.get("type") == "observation" and msg["episode"] in eps and "messages" in msg \
                and eps[msg["episode"]]:  # a step's observation (not the reset's)
            text = "".join(m["content"] + "\n" for m in msg["messages"])  # data.chat_template = none
            eps[msg["episode"]].append(("env", list(text.encode())))
        elif rec["dir"] == "in" and msg["type"] == "step":
            eps[msg["episode"]].append(("model", msg["action"]["token_ids"]))
            steps_text.setdefault(msg["episode"], []).append(rec["line"])
    return eps

steps_text = {}  # episode -> the step lines the environment received (of the run read last)

def rows(name):
    with h5py.File(f"{out}/{name}/rollouts.h5") as f:
        g = f["samples"]
        col = lambda k, i: g[k + "/values"][g[k + "/offsets"][i]:g[k + "/offsets"][i + 1]]
        for i in range(g["step"].shape[0]):
            yield dict(step=int(g["step"][i]), group=int(g["group_index"][i]), index=int(g["index"][i]),
                       status=int(g["status"][i]), turns=int(g["env_turns"][i]), p=int(g["prompt_length"][i]),
                       tokens=col("tokens", i), mask=col("loss_mask", i), logp=col("rollout_log_probs", i),
                       metrics=json.loads(bytes(col("env_metrics", i)) or b"{}"))

first_step = {}
for name in ["np1", "np2", "np4", "np4c", "resetmsg"]:
    eps = episodes_in_log(name)
    n = 0
    for r in rows(name):
        assert r["status"] == 1 and r["turns"] == 3, (name, r["status"], r["turns"])
        want_tokens, want_mask = [], []
        for kind, ids in eps[f"{r['step']}/{r['group']}/{r['index']}"]:
            want_tokens += ids
            want_mask += [1.0 if kind == "model" else 0.0] * len(ids)
        resp = r["tokens"][r["p"]:]
        assert list(resp) == want_tokens, (name, r["step"], r["group"], r["index"], list(resp), want_tokens)
        assert list(r["mask"]) == want_mask, (name, list(r["mask"]), want_mask)
        assert np.all(r["logp"][r["mask"] == 0] == 0) and np.all(r["logp"][r["mask"] == 1] < 0)
        # the probe's metric "bytes" (each turn's text), summed over the episode's steps
        texts = sum(len(json.loads(l)["action"]["text"].encode()) for l in steps_text[f"{r['step']}/{r['group']}/{r['index']}"])
        assert r["metrics"] == {"bytes": texts}, (name, r["metrics"], texts)
        if r["step"] == 0:
            first_step.setdefault(name, {})[(r["group"], r["index"])] = list(r["tokens"])
        n += 1
    with h5py.File(f"{out}/{name}/metrics.h5") as f:
        diff = f["steps/train/train_rollout_logprob_abs_diff"][:2]
        turns = f["steps/rollout/env_turns/mean"][:2]
        assert np.all(f["steps/rollout/env_metrics/bytes"][:2] > 0), name
        frac = f["steps/rollout/env_model_token_fraction"][:2]
    assert np.all(diff < 1e-5), (name, diff)
    assert np.all(turns == 3) and np.all((frac > 0) & (frac < 1)), (turns, frac)
    print(f"env_runs: {name}: {n} trajectories equal the environment's log token by token; "
          f"train/rollout log-prob diff {diff.max():.1e}")
ref = first_step["np1"]
for name in ["np2", "np4", "np4c"]:
    assert first_step[name] == ref, f"{name}: step 0's episodes differ from np 1's"
with h5py.File(f"{out}/resetmsg/rollouts.h5") as f:
    toks = f["samples/tokens/values"][f["samples/tokens/offsets"][0]:f["samples/tokens/offsets"][1]]
    p = f["samples/prompt_length"][0]
    assert bytes(int(t) for t in toks[:p] if t < 256).startswith(b"probe\n"), toks[:p]
print("env_runs: step 0's episodes are the same tokens at np 1, 2, 4 and colocated; the reset's messages open the episode")
PY

"$slimpi" check "$out/np2/deck.resolved.toml" --np 2 >"$out/check.log" 2>&1 || { cat "$out/check.log"; exit 1; }

echo "== a trajectory in two contexts: the trainer scores each as the engine ran it"
run 2 split --set run.n_steps=2 --set "rollout.env_command=$probe --new-context-at 1"
/usr/bin/python3 - "$out/split" <<'PY'
import sys
import h5py, numpy as np
run = sys.argv[1]
with h5py.File(run + "/rollouts.h5") as f:
    g = f["samples"]
    col = lambda k, i: g[k + "/values"][g[k + "/offsets"][i]:g[k + "/offsets"][i + 1]]
    n = g["step"].shape[0]
    for i in range(n):
        starts, p = col("context_starts", i), int(g["prompt_length"][i])
        resp, mask = col("tokens", i)[p:], col("loss_mask", i)
        assert int(g["status"][i]) == 1 and int(g["env_turns"][i]) == 3 and len(starts) == 1, (i, starts)
        c = int(starts[0])
        text = bytes(int(t) for t in resp[c:] if t < 256)
        assert b"new context\n" in text[:16] and mask[c] == 0, (i, text[:20], mask[c])
        assert b"turn 2:" in text and b"turn" not in bytes(int(t) for t in resp[:c] if t < 256), i
        runs = np.diff(np.concatenate([[0], mask[c:], [0]]))  # the second context holds two model turns
        assert (runs == 1).sum() == 2, (i, mask[c:])
with h5py.File(run + "/metrics.h5") as f:
    diff = f["steps/train/train_rollout_logprob_abs_diff"][:2]
assert np.all(diff < 1e-5), diff
print(f"env_runs: split: {n} episodes in two contexts each; train/rollout log-prob diff {diff.max():.1e}")
PY

echo "== the calculator: in process and as a program, the same run"
args=(run inputs/smoke_rl.toml --set model.max_seq_len=64 --set reward.style=environment --set run.n_steps=2
      --set eval.path=inputs/data/addition_eval.jsonl@[0:8])
run 2 calc_native --set rollout.environment=calculator
run 2 calc_python --set rollout.environment=command --set "rollout.env_command=python3 inputs/envs/calculator.py"
$compare "$out/calc_native" "$out/calc_python" --engine-scheduling-varies 1e-5  # replies arrive at other times

echo "== environments that fail end only their episode"
# Healthy replies get 20 s (a loaded machine must not fail them); the hang case 4 s.
args=("${base[@]}" --set run.n_steps=1 --set rollout.env_processes=2)
for fault in crash hang garbage flood lie overlong error close-stdout; do
  timeout_s=20; [ $fault = hang ] && timeout_s=4
  run 2 "fault_$fault" --set "rollout.env_command=$probe --fault $fault --max-concurrent 1" \
    --set rollout.env_timeout_s=$timeout_s
done
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py, numpy as np
out = sys.argv[1]
# fault -> (status, error class) of each faulty episode (sample 0 of groups 1, 5) and its group's others
expect = {"crash": (8, 3, 5), "hang": (8, 3, 5), "garbage": (8, 3, 5), "flood": (8, 3, 5), "lie": (8, 3, 5),
          "overlong": (2, 4, 1), "error": (1, 2, 1), "close-stdout": (8, 3, 5)}
for fault, (status, error, others) in expect.items():
    with h5py.File(f"{out}/fault_{fault}/rollouts.h5") as f:
        g = f["samples"]
        st, err, grp, idx = g["status"][:], g["env_error"][:], g["group_index"][:], g["index"][:]
    faulty = (grp % 4 == 1) & (idx == 0)
    assert faulty.sum() == 2 and np.all(st[faulty] == status) and np.all(err[faulty] == error), (fault, st, err)
    same_group = (grp % 4 == 1) & (idx != 0)
    assert np.all(st[same_group] == others), (fault, st[same_group])
    rest = grp % 4 != 1
    assert np.all(st[rest] == 1) and np.all(err[rest] == 0), (fault, st[rest], err[rest])
    print(f"env_runs: {fault}: the faulty episodes end with status {status}, error class {error}; "
          f"{rest.sum()} others completed")
PY
grep -q "exited (exit status 3); it is killed and restarted" "$out/fault_crash.log"
# The short batch says why its groups were left out (the filter is off here; steps count from 1).
grep -q "step 1: 6 of 8 groups to train after 1 round(s) of 8 (0 dropped by the dynamic filter, which is off, 2 with an episode the environment failed)" \
  "$out/fault_crash.log" || { cat "$out/fault_crash.log"; echo "FAIL: the short batch's reasons"; exit 1; }
grep -q "has written nothing for rollout.env_timeout_s = 4 s" "$out/fault_hang.log"
grep -q "token id 1000000000 is not in the vocabulary" "$out/fault_lie.log"
# A process that closes its stdout is noticed by the EOF, not after rollout.env_timeout_s.
grep -q "closed its stdout (it is still running, but can no longer reply); it is killed and restarted" \
  "$out/fault_close-stdout.log" || { cat "$out/fault_close-stdout.log"; echo "FAIL: close-stdout"; exit 1; }
refused fail_job 'rollout.env_fail_job = true ends the job' 2 --set rollout.env_fail_job=true \
  --set "rollout.env_command=$probe --fault crash --max-concurrent 1"
grep -q "episode 0/1/0 (group 1, sample 0)" "$out/fail_job.log"

echo "== a crashed process's episodes, with snapshots: brought back, not failed"
# Four episodes a process: one crashes it at its first step (once in the job); the others
# on it are mid-episode or waiting. Each is restored from its latest snapshot (its reset's
# nonce kept) or reset again before its first observation, its request in flight sent again.
run 2 crash_snap --set model.max_seq_len=160 --set rollout.env_max_total_tokens=128 \
  --set "rollout.env_command=$probe --snapshots --fault crash-once --max-concurrent 4 --log $out/crash_snap.envlog"
grep -q "exited (exit status 3); it is killed and restarted" "$out/crash_snap.log" \
  || { cat "$out/crash_snap.log"; echo "FAIL: no crash"; exit 1; }
grep -q "episode(s) of the restarted process brought back" "$out/crash_snap.log" \
  || { cat "$out/crash_snap.log"; echo "FAIL: nothing brought back"; exit 1; }
/usr/bin/python3 - "$out/crash_snap" "$out/crash_snap.envlog" <<'PY'
import json, re, sys
import h5py, numpy as np
run, envlog = sys.argv[1], sys.argv[2]
received = [json.loads(json.loads(l)["line"]) for l in open(envlog) if json.loads(l)["dir"] == "in"]
restores = sum(1 for m in received if m["type"] == "restore")
with h5py.File(run + "/rollouts.h5") as f:
    g = f["samples"]
    status, turns = g["status"][:], g["env_turns"][:]
    toks, offs = g["tokens/values"][:], g["tokens/offsets"][:]
assert np.all(status == 1) and np.all(turns == 3), (status, turns)  # every episode completed, the culprit too
for i in range(len(status)):
    text = bytes(int(t) for t in toks[offs[i]:offs[i + 1]] if t < 256).decode("utf-8", "replace")
    nonces = set(re.findall(r"nonce ([0-9a-f]{4})", text))
    assert len(nonces) == 1, (i, nonces)  # one state through the crash: restored, not drawn again
print(f"env_runs: crash with snapshots: {len(status)} episodes completed, {restores} restored into the new process")
assert restores >= 1
PY

echo "== a chat template that rewrites history"
refused rewrite "the qwen3 chat template rewrites the conversation's history" 2 \
  --set data.chat_template=qwen3 --set data.enable_thinking=false --set "rollout.env_command=$probe"

echo "== one step off: kill -9 inside checkpoint 3's write, resume from 2"
args=("${base[@]}" --set run.n_steps=4 --set train.async=one_step_off --set checkpoint.interval=1 --set "rollout.env_command=$probe")
run 4 straight
kill9_in_checkpoint 4 kill9 3
for _ in $(seq 100); do pgrep -f "probe_env.py" >/dev/null || break; sleep 0.1; done  # each dies with its rank
if pgrep -f "probe_env.py" >/dev/null; then
  pgrep -af probe_env.py; echo "FAIL: environment processes outlived their killed ranks by 10 s"; exit 1
fi
run 4 kill9
grep -q "resuming at step 2 from $out/kill9/ckpt/step_00000002" "$out/kill9.log"
$compare "$out/straight" "$out/kill9" --engine-scheduling-varies 1e-5  # replies arrive at other times
/usr/bin/python3 - "$out/kill9" <<'PY'
import sys, collections
import h5py
with h5py.File(sys.argv[1] + "/rollouts.h5") as f:
    g = f["samples"]
    trained = [(int(s), int(gr), int(i)) for s, gr, i, st in
               zip(g["step"][:], g["group_index"][:], g["index"][:], g["status"][:]) if st in (1, 2)]
dup = [k for k, c in collections.Counter(trained).items() if c > 1]
assert not dup and len(trained) == 4 * 8 * 4, (len(trained), dup[:5])
print(f"env_runs: after kill -9 and resume, {len(trained)} episodes trained, each once")
PY

echo "== full async: kill -9 inside checkpoint 4's write, resume from 2; episodes under way are replayed or restored"
# The environment thinks 20 ms a step: generation is slower than training, so the engines are
# mid-episode at every checkpoint (in a turn, or waiting for a reply). full_kill9: the probe is
# deterministic (replayed); snap_kill9: it is not, and takes snapshots (restored).
for name in full_kill9 snap_kill9; do
  snap=(); flag=""  # room for three turns with the nonce in the observations
  [ $name = snap_kill9 ] && snap=(--set model.max_seq_len=160 --set rollout.env_max_total_tokens=128) && flag=--snapshots
  args=("${base[@]}" "${snap[@]}" --set run.n_steps=6 --set train.async=full --set parallel.trainer_ranks=1
        --set checkpoint.interval=2 --set checkpoint.keep_last=10
        --set "rollout.env_command=$probe $flag --delay-ms 20 --log $out/$name.envlog")
  kill9_in_checkpoint 3 $name 4
  run 3 $name
  grep -q "resuming at step 2 from $out/$name/ckpt/step_00000002" "$out/$name.log"
  /usr/bin/python3 "$root/tests/regression/check_full_async.py" "$out/$name" 4 -1
done
grep -q "resuming episodes in flight: each is reset again and sent its recorded turns" "$out/full_kill9.log"
grep -q "resuming episodes in flight: each is restored from its environment's snapshot" "$out/snap_kill9.log"
/usr/bin/python3 - "$out" <<'PY'
import json, re, sys
import h5py, numpy as np
out = sys.argv[1]
def samples(path):
    with h5py.File(path) as f:
        g = f["samples"]
        col = lambda k, i: g[k + "/values"][g[k + "/offsets"][i]:g[k + "/offsets"][i + 1]]
        return {(int(g["group_index"][i]), int(g["index"][i])):
                dict(p=int(g["prompt_length"][i]), tokens=col("tokens", i), logp=col("rollout_log_probs", i),
                     mask=col("loss_mask", i), status=int(g["status"][i]), versions=col("weight_versions", i),
                     turns=int(g["env_turns"][i]))
                for i in range(g["step"].shape[0])}
for name in ["full_kill9", "snap_kill9"]:
    ckpt = f"{out}/{name}/ckpt/step_00000002"
    held = samples(f"{ckpt}/async_work.h5")
    turns = json.load(open(f"{ckpt}/async_state.json"))["episode_turns"]
    rows = samples(f"{out}/{name}/rollouts.h5")
    under_way = {k: v for k, v in held.items() if k[1] >= 0 and len(v["tokens"]) > v["p"]}
    assert under_way, f"{name}: no episode was under way in checkpoint 2"
    past_first = sum(1 for t in turns if t and len(t["ends"]) >= 1)
    assert past_first > 0, f"{name}: no episode in checkpoint 2 had finished a turn"
    # Snapshots: every episode past its reset holds its environment's state in the checkpoint.
    assert all(("env_snapshot" in t) == (name == "snap_kill9") for t in turns if t), name
    for k, h in under_way.items():
        r = rows[k]
        n, rn = len(h["tokens"]), len(h["tokens"]) - h["p"]
        assert r["p"] == h["p"] and np.array_equal(r["tokens"][:n], h["tokens"]), (name, k, r["tokens"], h["tokens"])
        assert np.array_equal(r["logp"][:rn], h["logp"]) and np.array_equal(r["versions"][:rn], h["versions"]), (name, k)
        assert np.array_equal(r["mask"][:rn], h["mask"]), (name, k, r["mask"], h["mask"])
    # The environment's log (both runs): each episode's steps, and its restores.
    with h5py.File(f"{ckpt}/async_work.h5") as f:
        order = list(zip(f["samples/group_index"][:].tolist(), f["samples/index"][:].tolist()))
    sent, restores = {}, {}
    for rec in map(json.loads, open(f"{out}/{name}.envlog")):
        msg = json.loads(rec["line"])
        if rec["dir"] == "in" and msg["type"] == "step":
            sent.setdefault((msg["episode"], msg["turn"]), []).append(msg["action"]["token_ids"])
        if rec["dir"] == "in" and msg["type"] == "restore":
            restores[msg["episode"]] = msg
    again = 0
    for (g, i), t in zip(order, turns):
        if not t:
            continue
        ep = f"{2 ** 41}/{g}/{i}"
        if name == "full_kill9":  # replayed: every turn it had taken was sent again, unchanged
            for turn in range(1, len(t["ends"]) + 1):
                ids = sent[(ep, turn)]
                assert len(ids) >= 2 and all(x == ids[0] for x in ids), (g, i, turn, ids)
                again += 1
        else:  # restored once from the checkpoint's snapshot: only a turn waiting for its reply is sent again
            assert ep in restores and restores[ep]["snapshot"] == t["env_snapshot"], (ep, restores.get(ep), t)
            assert restores[ep]["turns"] == len(t["ends"]) - (t["open_turn"] < 0), (ep, restores[ep]["turns"], t)
            for turn in range(1, len(t["ends"]) + 1):
                ids = sent[(ep, turn)]
                waiting = turn == len(t["ends"]) and t["open_turn"] < 0
                assert len(ids) == (2 if waiting else 1) and all(x == ids[0] for x in ids), (ep, turn, ids, t)
                again += waiting
    if name == "full_kill9":
        assert again > 0, "no model turn was sent again"
        print(f"env_runs: full async kill -9: {len(under_way)} episodes under way in checkpoint 2 ({past_first} past "
              f"a turn) continue bit for bit; {again} model turns replayed unchanged")
        continue
    # Each episode keeps the nonce its reset drew: the observations after the resume come from
    # the restored state (a fresh reset would draw another).
    snapshot_of = {k: t["env_snapshot"] for k, t in zip(order, turns) if t}
    nonces = 0
    for k, r in rows.items():
        resp = r["tokens"][r["p"]:]
        text = bytes(int(x) for x, m in zip(resp, r["mask"]) if m == 0 and x < 256).decode("latin-1")
        found = re.findall(r"nonce ([0-9a-f]{4})", text)
        assert len(set(found)) <= 1, (k, found)
        if k in under_way and k in snapshot_of and found:
            assert found[0] == snapshot_of[k]["nonce"], (k, found, snapshot_of[k])
            nonces += len(found) > 1 or snapshot_of[k]["turn"] == 0  # one seen after the resume
    assert nonces > 0, "no restored episode shows its checkpointed nonce after the resume"
    # One clock rule: a restored episode's env_time_s and episode_time_s both hold its time
    # before the checkpoint plus its time since (env time was kept, episode time restarted).
    with h5py.File(f"{out}/{name}/rollouts.h5") as f:
        env_s, episode_s = f["samples/env_time_s"][:], f["samples/episode_time_s"][:]
    assert np.all(env_s <= episode_s + 1e-3), [(a, b) for a, b in zip(env_s, episode_s) if a > b + 1e-3]
    three = sum(1 for k in snapshot_of if rows[k]["turns"] == 3 and rows[k]["status"] == 1)
    assert three > 0, "no restored episode ran to its third turn"
    print(f"env_runs: full async kill -9 with snapshots: {len(restores)} episodes restored (none replayed), "
          f"{len(under_way)} under way in checkpoint 2 continue bit for bit, {again} waiting turns sent again, "
          f"{nonces} show their checkpointed nonce after it, {three} ran to their third turn")
PY

echo "== full async, two job steps: threads (a new context, then the first resumed) restored from snapshots"
args=("${base[@]}" --set model.max_seq_len=192 --set rollout.env_max_total_tokens=160 --set run.n_steps=4
      --set train.async=full --set parallel.trainer_ranks=1 --set run.job_steps=2 --set checkpoint.interval=2
      --set "rollout.env_command=$probe --snapshots --threads --delay-ms 20 --log $out/threads.envlog")
run 3 threads
run 3 threads
steps_done "$out/threads" 4
/usr/bin/python3 - "$out" <<'PY'
import json, sys
import h5py, numpy as np
out = sys.argv[1]
restored = [json.loads(r["line"]) for r in map(json.loads, open(f"{out}/threads.envlog"))
            if r["dir"] == "in" and json.loads(r["line"])["type"] == "restore"]
left = [m for m in restored if m["turns"] >= 1]  # restored with a context left behind, to resume or joined
assert restored, "no episode was restored"
# (how many were past their first turn at the checkpoint depends on the machine's timing:
# the unit test ThreadsSurviveAReplayAndARestore stops episodes at fixed points)
with h5py.File(f"{out}/threads/rollouts.h5") as f:
    g = f["samples"]
    status = g["status"][:]
    assert not np.any(status == 8), "an episode failed"
    n = 0
    for i in range(len(status)):
        if g["env_turns"][i] != 3:
            continue
        starts = g["context_starts/values"][g["context_starts/offsets"][i]:g["context_starts/offsets"][i + 1]]
        assert len(starts) == 1, (i, starts)  # thread A (turns 1 and 3), thread B (turn 2): joined
        n += 1
assert n > 0
print(f"env_runs: threads under full async: {n} three-turn episodes hold their two threads once, none failed; "
      f"{len(left)} of {len(restored)} restored episodes were past their first turn (a context left behind)")
PY

echo "== full async: a group with an episode its environment failed is not trained"
args=("${base[@]}" --set run.n_steps=2 --set train.async=full --set parallel.trainer_ranks=1
      --set "rollout.env_command=$probe --fault lie")
run 3 full_fault
/usr/bin/python3 - "$out/full_fault" <<'PY'
import sys, collections
import h5py, numpy as np
with h5py.File(sys.argv[1] + "/rollouts.h5") as f:
    g = f["samples"]
    groups = collections.defaultdict(list)
    for gi, st, rw in zip(g["group_index"][:], g["status"][:], g["reward"][:]):
        groups[int(gi)].append((int(st), float(rw)))
failed = {k: v for k, v in groups.items() if any(st == 8 for st, _ in v)}
assert failed, "no episode failed"
for k, v in failed.items():
    assert all(st in (5, 8) for st, _ in v), (k, v)  # the others recorded as filtered, never trained
    assert all(np.isnan(rw) for st, rw in v if st == 8), (k, v)
print(f"env_runs: full async: {len(failed)} groups with a failed episode, none trained")
PY

echo "== full async: an environment that fails every episode does not stall the run"
run 3 full_all_fail --set run.n_steps=2 --set "rollout.env_command=$probe --fault error-all" \
  --set "eval.path=inputs/data/addition_eval.jsonl@[0:4]"
grep -q "0 of 8 groups to train: .*(0 dropped by the dynamic filter, [0-9]* with an episode the environment failed)" \
  "$out/full_all_fail.log" || { cat "$out/full_all_fail.log"; echo "FAIL: no short-batch warning"; exit 1; }
grep -q "evaluation: all 4 episodes failed in their environment" "$out/full_all_fail.log" \
  || { cat "$out/full_all_fail.log"; echo "FAIL: no warning that every evaluation episode failed"; exit 1; }
/usr/bin/python3 - "$out/full_all_fail" <<'PY'
import sys
import h5py, numpy as np
with h5py.File(sys.argv[1] + "/metrics.h5") as f:
    failed, p1 = f["steps/eval/env_failed"][:], f["steps/eval/pass@1"][:]
evals = ~np.isnan(p1)
assert evals.sum() >= 2 and np.all(failed[evals] == 4) and np.all(p1[evals] == 0), (failed, p1)
PY
echo "env_runs: full async: every episode failed, the run went on with short batches; eval/env_failed counts the failed evaluation episodes"

echo "== slimpi generate runs episodes; transcript.py shows one"
$mpirun -np 2 "$slimpi" generate inputs/smoke_rl.toml --set model.max_seq_len=96 --set rollout.environment=command \
  --set reward.style=environment --set rollout.env_max_turns=3 --set rollout.env_max_total_tokens=64 --set "rollout.env_command=$probe" \
  --set "data.path=inputs/data/addition_eval.jsonl@[0:4]" --set run.dir="$out/gen" >"$out/gen.log" 2>&1 \
  || { cat "$out/gen.log"; exit 1; }
/usr/bin/python3 -c "
import h5py, sys
with h5py.File(sys.argv[1]) as f:
    t = f['samples/env_turns'][:]
assert len(t) == 16 and (t == 3).all(), t
" "$out/gen/rollouts.h5"
/usr/bin/python3 postprocess/transcript.py "$out/np2" 1 2:3 | tee "$out/transcript.txt"
grep -aq "3 turns" "$out/transcript.txt"
[ "$(grep -ac '^--- model' "$out/transcript.txt")" = 3 ] && [ "$(grep -ac '^--- environment' "$out/transcript.txt")" = 2 ]
grep -aq "^turn 2: " "$out/transcript.txt"

echo "== refused"
args=(run inputs/smoke_rl.toml)
# (one refusal as a job: every rank stops; the deck's through `slimpi check`, one process)
refused no_style 'set reward.style = "environment"' 2 --set rollout.environment=calculator
check_refuses no_env 'reward.style = "environment" (--set) is the reward of a multi-turn episode' 2 --set reward.style=environment
check_refuses full_async_requeue 'episodes in flight at a weight update continue there; use rollout.partial = "continue"' 3 \
  --set rollout.environment=calculator --set reward.style=environment --set train.async=full --set rollout.partial=requeue
check_refuses stray_key 'rollout.env_processes (--set) applies to rollout.environment = "command" only' 2 \
  --set rollout.environment=calculator --set reward.style=environment --set rollout.env_processes=2
check_refuses remax "ReMax's greedy baseline episodes are not implemented" 2 --set rollout.environment=calculator \
  --set reward.style=environment --set train.advantage_estimator=remax
check_refuses no_command 'needs rollout.env_command' 2 --set rollout.environment=command --set reward.style=environment
refused no_hello 'did not start: it exited before its hello (exit status 5)' 2 --set rollout.environment=command \
  --set reward.style=environment --set 'rollout.env_command=exit 5'
check_refuses slow_env 'rollout.env_timeout_s = 60 (default) must be below parallel.timeout_s = 30 (--set)' 2 \
  --set rollout.environment=command --set reward.style=environment --set "rollout.env_command=$probe" \
  --set parallel.timeout_s=30
check_refuses slow_episode 'rollout.env_episode_wall_s = 50 (--set) must be below parallel.timeout_s = 40 (--set)' 2 \
  --set rollout.environment=command --set reward.style=environment --set "rollout.env_command=$probe" \
  --set parallel.timeout_s=40 --set rollout.env_timeout_s=20 --set rollout.env_episode_wall_s=50
# slimpi check says it too, without a job.
if "$slimpi" check inputs/smoke_rl.toml --np 2 --set rollout.environment=command --set reward.style=environment \
     --set "rollout.env_command=$probe" --set parallel.timeout_s=30 >"$out/check_slow_env.log" 2>&1; then
  cat "$out/check_slow_env.log"; echo "FAIL: check passed an environment slower than the watchdog"; exit 1
fi
grep -qF 'rollout.env_timeout_s = 60 (default) must be below parallel.timeout_s = 30' "$out/check_slow_env.log" \
  || { cat "$out/check_slow_env.log"; echo "FAIL: check did not say why"; exit 1; }
echo "env_runs: OK"
