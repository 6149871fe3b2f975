#!/usr/bin/env bash
# Unmodified agent programs over the OpenAI API (rollout.environment = "agent", docs/agents.md):
#  * conformance with the real `openai` Python client (tests/fixtures/agents/probe_agent.py:
#    three turns, every other one streamed, a tool declared; at np 2 the first two through the
#    Responses API, whose logprobs are the engine's rollout_log_probs of the tokens the client
#    received, bit for bit) at np 2 (split), np 3 (an engine of 2 tensor-parallel ranks, one
#    endpoint), np 4 (split, two
#    engines) and np 1 (colocated): every trajectory, token by token, is what the agent sent and
#    received (also np 4 with 1 prefill and 2 decode engines, rollout.prefill_ranks: np 4's
#    episodes token for token, the context openings' KV moved): the prompt is the first
#    request's messages with the tools written in as Qwen's
#    templates write them, each model turn's tokens decode to the content the client received,
#    each observation is the template's render of the messages the agent added; the trainer's
#    log-probs equal the engine's; the reward is the agent's (its stdout line, or POSTed);
#  * an agent that compacts its history (a request that does not extend the session's) opens a
#    new context with the whole conversation, recorded in context_starts;
#  * under data.chat_template = chatml, SLIMPI_PROMPT is the record's prompt as the file holds it;
#  * a parent agent and its sub-agent in one session (tests/fixtures/agents/threads_probe.py):
#    each request continues the thread it extends, the parent's return resumes its context;
#    each sample holds the two threads once, every turn the tokens the agent received, and
#    the trainer's log-probs of the joined threads equal the engine's; the same with two
#    sub-agents calling at once (their requests answered in turn, none refused);
#  * agents that crash, hang, are killed (-9) or exit without a reward fail their own episode (env_failed, infra),
#    the job goes on; an episode stopped at its turn limit (404) or token budget (413) is
#    truncated with the reward its agent gives after that answer;
#  * 64 agents at once on one rollout rank (rollout.agent_max_sessions), the 65th and later
#    waiting for a slot: every agent counts the agents alive, and none saw more than 64;
#  * full async and one step off, each in two job steps: episodes across weight updates and a restart;
#  * the coding agent (inputs/agents/coding_agent.py) in GRPO runs at np 2 synchronous and np 4
#    full async over two job steps (a random policy: the plumbing; its tools and sandbox are
#    test_coding_agent's, its learning jobs/coding_agent.sh's);
#  * a rollout rank killed (-9) while its agents are mid-session: the job ends, the agents die
#    with the rank, and the run resumes from its last checkpoint to the end;
#  * refused with the reason: an agent environment without rollout.agent_command, agent keys
#    without it; an agent command that cannot be run ends the job naming it.
# Usage: agent_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
py=${SLIMPI_AGENT_CLIENTS_VENV:-/opt/slimpi/agent-clients}/bin/python  # the openai client's venv (scripts/install_deps.sh)
[ -x "$py" ] || { echo "FAIL: $py missing: run scripts/install_deps.sh"; exit 1; }
probe="$py $root/tests/fixtures/agents/probe_agent.py"
tiny="python3 $root/tests/fixtures/agents/tiny_agent.py"
base=(run inputs/smoke_rl.toml --set model.max_seq_len=768 --set rollout.environment=agent --set reward.style=environment
      --set rollout.max_new_tokens=8 --set rollout.env_max_total_tokens=200 --set rollout.rollout_batch_size=2
      --set train.global_batch_size=8 --set eval.path=)

echo "== conformance with the openai client: np 2 (Responses API too), np 4 (history edited), np 1 colocated (reward POSTed), np 3 (an engine of 2 tensor-parallel ranks)"
args=("${base[@]}")
run 2 np2 --set run.n_steps=2 --set "rollout.agent_command=$probe --api mixed --log $out/np2.agentlog"
run 4 np4 --set run.n_steps=1 --set model.max_seq_len=1600 --set rollout.kv_cache_tokens=16384 --set rollout.env_max_total_tokens=1000 --set "rollout.agent_command=$probe --edit-history --log $out/np4.agentlog"
run 1 np1 --set run.n_steps=1 --set parallel.placement=colocate \
  --set "rollout.agent_command=$probe --post-reward --log $out/np1.agentlog"
run 3 tp2 --set run.n_steps=1 --set parallel.trainer_ranks=1 --set rollout.tensor_parallel=2 \
  --set "rollout.agent_command=$probe --log $out/tp2.agentlog"
run 4 pd4 --set run.n_steps=1 --set parallel.trainer_ranks=1 --set rollout.prefill_ranks=1 --set model.max_seq_len=1600 \
  --set rollout.kv_cache_tokens=16384 --set rollout.env_max_total_tokens=1000 \
  --set "rollout.agent_command=$probe --edit-history --log $out/pd4.agentlog"
[ "$(grep -c "agent endpoint: " "$out/pd4.log")" = 2 ] || { cat "$out/pd4.log"; echo "FAIL: two decode engines serve two endpoints, the prefill engine none"; exit 1; }
[ "$(grep -c "agent endpoint: " "$out/tp2.log")" = 1 ] || { cat "$out/tp2.log"; echo "FAIL: a tensor-parallel engine serves one endpoint"; exit 1; }
grep -qF "agent endpoint: http://127.0.0.1:" "$out/np2.log" || { cat "$out/np2.log"; echo "FAIL: no endpoint line"; exit 1; }
[ "$(stat -c %a "$out/np2/agent_token")" = 600 ] || { echo "FAIL: agent_token is not mode 0600"; exit 1; }

PYTHONPATH="$root/tests/regression" /usr/bin/python3 - "$out" <<'PY'
import json, sys
import numpy as np
from trajectory_views import logprob_diffs, prefill_bounds, rows, runs, text
out = sys.argv[1]
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Evaluates an expression.",
          "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}]
# Qwen2.5's and Qwen3's "# Tools" block (json.dumps of each tool: their templates' tojson)
tools_block = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
               "function signatures within <tools></tools> XML tags:\n<tools>" +
               "".join("\n" + json.dumps(t, ensure_ascii=False) for t in TOOLS) +
               "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
               "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>")

logprob_turns = 0
for name, edited in [("np2", False), ("np4", True), ("np1", False), ("tp2", False), ("pd4", True)]:
    log = {}
    for line in open(f"{out}/{name}.agentlog"):
        r = json.loads(line)
        log.setdefault(r["episode"], []).append(r)
    n = 0
    for row in rows(f"{out}/{name}"):
        ep = row.episode
        turns = sorted(log[ep], key=lambda r: r["turn"])
        assert [t["turn"] for t in turns] == [0, 1, 2] and any(t["stream"] for t in turns), (name, ep)
        assert row["status"] == 1 and row["env_turns"] == 3, (name, ep, row["status"], row["env_turns"])
        toks, p, mask = row.col("tokens"), int(row["prompt_length"]), row.col("loss_mask")
        first = turns[0]["sent"]
        assert text(toks[:p]).decode() == f"probe agent\n\n{tools_block}\n{first[1]['content']}\n", (name, ep)
        resp = toks[p:]
        segments = runs(mask)
        model = [s for s in segments if s[2] == 1]
        assert len(model) == 3, (name, ep, segments)
        logp = row.col("rollout_log_probs")
        for k, (a, b, _) in enumerate(model):  # what the client received, decoded from the sampled tokens
            assert text(resp[a:b]).decode("utf-8", "replace") == turns[k]["content"], \
                (name, ep, k, text(resp[a:b]), turns[k]["content"])
            if turns[k]["logprobs"] is not None:  # the Responses API's logprobs: the sampled tokens' own
                lp = turns[k]["logprobs"]
                assert len(lp) in (b - a, b - a - 1) and b"".join(bytes(t[1]) for t in lp) == text(resp[a:b]), (name, ep, k)
                assert np.array_equal(np.float32([t[0] for t in lp]), logp[a:a + len(lp)]), (name, ep, k)
                logprob_turns += 1
        env = [s for s in segments if s[2] == 0]
        starts = list(row.col("context_starts"))
        if edited:  # turn 3's request dropped the first exchange: a new context, the whole conversation rendered
            assert starts == [env[1][0]], (name, ep, starts, segments)
            c = turns[1]["content"]
            want = f"probe agent\n\n{tools_block}\n{first[1]['content']}\n{c}\nturn 2\n"
            assert text(resp[env[1][0]:env[1][1]]).decode() == want, (name, ep, text(resp[env[1][0]:env[1][1]]))
            assert text(resp[env[0][0]:env[0][1]]) == b"turn 1\n"
        else:
            assert starts == [], (name, ep, starts)
            assert [text(resp[a:b]) for a, b, _ in env] == [b"turn 1\n", b"turn 2\n"], (name, ep)
        assert len(logp) == len(mask) and np.all(logp[mask == 0] == 0) and np.all(logp[mask == 1] < 0), (name, ep)
        want_reward = float(sum(len(t["content"].encode()) for t in turns) % 2)
        assert row["raw_reward"] == want_reward, (name, ep, row["raw_reward"], want_reward)
        n += 1
    diff = logprob_diffs(f"{out}/{name}")
    assert n > 0 and np.all(diff < 1e-5), (name, n, diff)
    assert name != "np2" or logprob_turns == n, (logprob_turns, n)
    print(f"agent_runs: {name}: {n} trajectories are the agents' requests and answers token by token"
          f"{' (a compacted history opens a new context)' if edited else ''}; train/rollout log-prob diff {diff.max():.1e}")
# Under prefill/decode disaggregation: the episodes of plain engines, each request that opens a
# context (a session's first, the compacted history) prefilled by the prefill engine.
import h5py
def episodes(name):
    return [(r.episode, r.col("tokens")[:], r.col("loss_mask")[:]) for r in rows(f"{out}/{name}")]
plain, pd = episodes("np4"), episodes("pd4")
assert [e[0] for e in plain] == [e[0] for e in pd], "pd4 ran other episodes than np4"
for a, b in zip(plain, pd):
    assert np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2]), a[0]
with h5py.File(f"{out}/pd4/metrics.h5") as f:
    moved, taken = int(f["steps/perf/kv_transfer_tokens"][0]), int(f["steps/perf/kv_taken_tokens"][0])
fewest, most = prefill_bounds(f"{out}/pd4")
assert taken == most and fewest <= moved <= most, (taken, moved, fewest, most)
print(f"agent_runs: pd4: {len(pd)} episodes (1 prefill, 2 decode engines) token for token as np4's; {moved} "
      f"positions of their context openings prefilled ({fewest} distinct, {most} without sharing)")
PY

echo "== under a chat template, an agent's SLIMPI_PROMPT is the record's prompt, not its rendering"
args=("${base[@]}")
run 2 chatml --set run.n_steps=1 --set data.chat_template=chatml --set "rollout.agent_command=$probe --log $out/chatml.agentlog"
/usr/bin/python3 - "$out" "$root" <<'PY'
import json, sys
out, root = sys.argv[1], sys.argv[2]
prompts = {json.loads(l)["prompt"] for l in open(f"{root}/inputs/data/addition_sft.jsonl")}
firsts = [r["sent"][1]["content"] for r in map(json.loads, open(f"{out}/chatml.agentlog")) if r["turn"] == 0]
assert firsts and all(p in prompts for p in firsts), [p for p in firsts if p not in prompts][:3]
print(f"agent_runs: chatml: {len(firsts)} agents got their record's prompt as the data file holds it")
PY

echo "== a parent agent and its sub-agent in one session: two threads, each kept once; two sub-agents calling at once"
args=("${base[@]}")
run 2 threads --set run.n_steps=1 --set rollout.env_max_total_tokens=400 \
  --set "rollout.agent_command=$py $root/tests/fixtures/agents/threads_probe.py --log $out/threads.agentlog"
run 2 threads_par --set run.n_steps=1 --set rollout.env_max_total_tokens=600 \
  --set "rollout.agent_command=$py $root/tests/fixtures/agents/threads_probe.py --parallel --log $out/threads_par.agentlog"
PYTHONPATH="$root/tests/regression" /usr/bin/python3 - "$out" <<'PY'
import json, sys
import numpy as np
from trajectory_views import logprob_diffs, rows, runs, text
out = sys.argv[1]
for name in ("threads", "threads_par"):
    log = {r["episode"]: r for r in map(json.loads, open(f"{out}/{name}.agentlog"))}
    n = 0
    for row in rows(f"{out}/{name}"):
        ep = row.episode
        parent, subs = log[ep]["parent"], log[ep]["subs"]
        turns = sum(m["role"] == "assistant" for m in parent + [m for sub in subs for m in sub])
        assert row["status"] == 1 and row["env_turns"] == turns, (ep, row["status"], row["env_turns"], turns)
        toks, p, mask = row.col("tokens"), int(row["prompt_length"]), row.col("loss_mask")
        assert text(toks[:p]).decode() == f"parent\n{parent[1]['content']}\n", (ep, text(toks[:p]))
        # One context per thread: the parent's (with the prompt), then each sub-agent's in the
        # order their first requests were answered (which of two at once came first varies).
        bounds = [0] + [int(c) for c in row.col("context_starts")] + [len(toks) - p]
        assert len(bounds) == len(subs) + 2, (ep, bounds)
        resp, logp = toks[p:], row.col("rollout_log_probs")
        def thread(a, b, opening, turns, observations):
            segs = runs(mask[a:b])
            if opening is not None:
                assert segs[0][2] == 0 and text(resp[a:a + segs[0][1]]) == opening.encode(), (ep, text(resp[a:a + segs[0][1]]))
                segs = segs[1:]
            model = [s for s in segs if s[2] == 1]
            env = [s for s in segs if s[2] == 0]
            assert [text(resp[a + x:a + y]).decode("utf-8", "replace") for x, y, _ in model] == turns, (ep, segs)
            assert [text(resp[a + x:a + y]) for x, y, _ in env] == [o.encode() for o in observations], (ep, segs)
        thread(0, bounds[1], None, [parent[2]["content"], parent[4]["content"]], [parent[3]["content"] + "\n"])
        openings = {text(resp[a:a + runs(mask[a:b])[0][1]]).decode(): (a, b) for a, b in zip(bounds[1:-1], bounds[2:])}
        for sub in subs:
            a, b = openings.pop(f"sub\n{sub[1]['content']}\n")
            thread(a, b, f"sub\n{sub[1]['content']}\n", [m["content"] for m in sub if m["role"] == "assistant"],
                   [m["content"] + "\n" for m in sub[3:] if m["role"] == "user"])
        assert np.all(logp[mask == 0] == 0) and np.all(logp[mask == 1] < 0), ep  # every turn's own log-probs
        answers = [m["content"] for m in parent + [m for sub in subs for m in sub] if m["role"] == "assistant"]
        assert row["raw_reward"] == float(sum(len(t.encode()) for t in answers) % 2), ep
        n += 1
    diff = logprob_diffs(f"{out}/{name}")
    assert n > 0 and np.all(diff < 1e-5), (n, diff)
    print(f"agent_runs: {name}: {n} episodes of a parent and {len(subs)} sub-agent(s), each thread one context, "
          f"every turn the tokens its agent received; train/rollout log-prob diff {diff.max():.1e}")
PY

echo "== agents that crash, hang, are killed (-9) or give no reward fail their own episode"
args=("${base[@]}" --set run.n_steps=1 --set rollout.rollout_batch_size=1 --set rollout.n_samples_per_prompt=6 --set train.global_batch_size=6
      --set rollout.env_timeout_s=8)
run 2 failing --set "rollout.agent_command=$tiny --modes normal,crash,hang,noreward,post,kill9"
/usr/bin/python3 - "$out/failing" <<'PY'
import sys
import h5py
with h5py.File(sys.argv[1] + "/rollouts.h5") as f:
    g = f["samples"]
    by_mode = {}
    for i in range(g["step"].shape[0]):
        mode = ["normal", "crash", "hang", "noreward", "post", "kill9"][int(g["index"][i]) % 6]
        by_mode.setdefault(mode, set()).add((int(g["status"][i]), int(g["env_error"][i])))
# every group has a failed episode, so its completed ones are recorded as not trained (status 5, filtered)
assert by_mode["normal"] == {(5, 0)} and by_mode["post"] == {(5, 0)}, by_mode
for mode in ["crash", "hang", "noreward", "kill9"]:
    assert by_mode[mode] == {(8, 3)}, (mode, by_mode)  # env_failed, infra
print("agent_runs: crashed, hung, killed and reward-less agents failed their own episodes (env_failed, infra); the rest completed")
PY
for why in "its agent ended with exit status 3" "its agent ended with killed by signal 9" "neither sent its next request nor exited within rollout.env_timeout_s" \
           "exited (status 0) without a reward"; do
  grep -qF "$why" "$out/failing.log" || { cat "$out/failing.log"; echo "FAIL: no '$why'"; exit 1; }
done

echo "== an episode stopped at its limits gets its agent's reward"
args=("${base[@]}" --set run.n_steps=1 --set "rollout.agent_command=$tiny --modes loop")
run 2 turn_limit --set rollout.env_max_turns=2
run 2 token_limit --set rollout.env_max_total_tokens=20
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
for name, error, reward in [("turn_limit", 0, 4.04), ("token_limit", 4, 4.13)]:
    with h5py.File(f"{sys.argv[1]}/{name}/rollouts.h5") as f:
        g = f["samples"]
        got = {(int(s), int(e), round(float(r), 2)) for s, e, r in zip(g["status"][:], g["env_error"][:], g["raw_reward"][:])}
    assert got == {(2, error, reward)}, (name, got)  # truncated, with the reward the agent gave after its 404 / 413
print("agent_runs: stopped at the turn limit (404) and at the token budget (413), agents gave their rewards")
PY

echo "== 64 agents at once"
mkdir -p "$out/live"
args=("${base[@]}" --set run.n_steps=1 --set model.max_seq_len=96 --set rollout.env_max_total_tokens=64
      --set rollout.rollout_batch_size=17 --set train.global_batch_size=68)
run 2 many --set "rollout.agent_command=$tiny --live $out/live --wait-for 64"
/usr/bin/python3 - "$out" <<'PY'
import glob, sys
import h5py
out = sys.argv[1]
seen = [int(open(p).read()) for p in glob.glob(f"{out}/live/max_*")]
assert len(seen) == 68 and max(seen) == 64, (len(seen), sorted(seen))
with h5py.File(f"{out}/many/rollouts.h5") as f:
    assert list(f["samples/status"][:]) == [1] * 68
print("agent_runs: 68 episodes, at most 64 agents alive at once (all 64 at the peak), every episode completed")
PY

echo "== full async and one step off, each in two job steps"
for mode in full one_step_off; do
  args=("${base[@]}" --set parallel.placement=split --set train.async=$mode --set run.n_steps=2 --set run.job_steps=1
        --set checkpoint.interval=1 --set "rollout.agent_command=$tiny")
  run 2 $mode
  run 2 $mode
  steps_done "$out/$mode" 2
  echo "agent_runs: train.async = $mode: 2 steps in two jobs"
done

echo "== the coding agent (inputs/agents/coding_agent.py, a random policy): np 2 synchronous, np 4 full async in two job steps"
args=(run inputs/coding_grpo.toml --set model.init_from= --set run.n_steps=2 --set rollout.rollout_batch_size=2
      --set rollout.n_samples_per_prompt=4
      --set train.global_batch_size=8 --set rollout.dynamic_filter=none --set rollout.over_sampling_batch_size=2
      --set rollout.max_new_tokens=24 --set eval.path=
      --set "rollout.agent_command=$py $root/inputs/agents/coding_agent.py --log $out/coding_log")
run 2 coding_np2 --set parallel.placement=split
run 4 coding_np4 --set train.async=full --set parallel.trainer_ranks=2 --set run.job_steps=1 --set checkpoint.interval=1
run 4 coding_np4 --set train.async=full --set parallel.trainer_ranks=2
steps_done "$out/coding_np4" 2
/usr/bin/python3 - "$out" <<'PY'
import glob, json, sys
import h5py
out = sys.argv[1]
logs = {}
for p in glob.glob(f"{out}/coding_log/*.json"):
    logs[p.rsplit("/", 1)[1][:-5]] = json.load(open(p))
n = 0
for name in ["coding_np2", "coding_np4"]:
    with h5py.File(f"{out}/{name}/rollouts.h5") as f:
        g = f["samples"]
        for i in range(g["step"].shape[0]):
            assert g["status"][i] in (1, 2), (name, i, g["status"][i])  # completed or truncated: the agent ran
            r = float(g["raw_reward"][i])
            assert 0 <= r <= 1 and abs(r * 5 - round(r * 5)) < 1e-5, (name, i, r)  # a fraction of the 5 hidden cases
            n += 1
assert n >= 16 + 16 and logs and all(l["messages"][0] == {"role": "user", "content": "Make test.py pass."} for l in logs.values())
print(f"agent_runs: the coding agent: {n} episodes at np 2 and np 4 (full async, two jobs), each rewarded by its hidden tests")
PY

echo "== a rollout rank killed mid-session: the job ends, its agents die with it, the run resumes"
mkdir -p "$out/live_kill"
args=("${base[@]}" --set run.n_steps=4 --set checkpoint.interval=1
      --set "rollout.agent_command=$tiny --modes slow --live $out/live_kill")
$mpirun -np 2 "$slimpi" "${args[@]}" --set run.dir="$out/rank_kill" >"$out/rank_kill.log" 2>&1 &
job=$!
victim=""  # rank 1: the rollout rank (by its MPI rank, not its pid), once step 2 is done
for _ in $(seq 1200); do  # (and an agent of step 3 between its requests: each sleeps 1 s there)
  kill -0 "$job" 2>/dev/null || break
  if grep -qF "step 2/4" "$out/rank_kill.log" 2>/dev/null && ls "$out/live_kill"/live_* >/dev/null 2>&1; then
    for pid in $(pgrep -f "^[^ ]*slimpi run .*run.dir=$out/rank_kill( |$)"); do
      # (no pipe: under pipefail, grep -q leaving early would fail the producer with SIGPIPE)
      grep -qzx "OMPI_COMM_WORLD_RANK=1" /proc/$pid/environ 2>/dev/null && victim=$pid
    done
    [ -n "$victim" ] && break
  fi
  sleep 0.1
done
[ -n "$victim" ] && ls "$out/live_kill"/live_* >/dev/null 2>&1 || { cat "$out/rank_kill.log"; echo "FAIL: no session to interrupt"; exit 1; }
kill -9 "$victim"
ended=0
for _ in $(seq 600); do kill -0 "$job" 2>/dev/null || { ended=1; break; }; sleep 0.1; done
[ $ended = 1 ] || { kill -9 "$job"; cat "$out/rank_kill.log"; echo "FAIL: the job outlived its killed rollout rank by 60 s"; exit 1; }
if wait "$job"; then cat "$out/rank_kill.log"; echo "FAIL: exit 0 after a rank was killed"; exit 1; fi
for _ in $(seq 100); do pgrep -f "live_kill" >/dev/null || break; sleep 0.1; done
if pgrep -f "live_kill" >/dev/null; then pgrep -af live_kill; echo "FAIL: agents outlived their killed rank by 10 s"; exit 1; fi
rm -f "$out/live_kill"/live_*  # (the killed agents' markers)
run 2 rank_kill
grep -qE "resuming at step [12] from $out/rank_kill/ckpt/step_0000000[12]" "$out/rank_kill.log" \
  || { cat "$out/rank_kill.log"; echo "FAIL: no resume"; exit 1; }
steps_done "$out/rank_kill" 4
echo "agent_runs: a rollout rank killed mid-session ended the job, its agents with it; $(grep -oE 'resuming at step [12]' "$out/rank_kill.log"), all 4 steps done"

echo "== refusals"
args=("${base[@]}")
refused typo "rollout.agent_command 'pyhton3 agent.py' cannot be run" 2 --set run.n_steps=1 \
  --set "rollout.agent_command=pyhton3 agent.py"
check_refuses port_without_agent 'rollout.agent_port' 2 --set rollout.environment=calculator --set rollout.agent_port=9999
check_refuses no_command 'rollout.environment = "agent"' 2 --set rollout.agent_command=
check_refuses no_style 'set reward.style = "environment"' 2 --set reward.style=exact_match --set rollout.agent_command=x
echo "agent_runs: all passed"
