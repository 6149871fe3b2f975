#!/usr/bin/env bash
# Unmodified agent programs over the OpenAI API (rollout.environment = "agent", docs/agents.md):
#  * conformance with the real `openai` Python client (tests/fixtures/agents/probe_agent.py:
#    three turns, every other one streamed, a tool declared) at np 2 (split), np 4 (split, two
#    engines) and np 1 (colocated): every trajectory, token by token, is what the agent sent and
#    received: the prompt is the first request's messages with the tools written in as Qwen's
#    templates write them, each model turn's tokens decode to the content the client received,
#    each observation is the template's render of the messages the agent added; the trainer's
#    log-probs equal the engine's; the reward is the agent's (its stdout line, or POSTed);
#  * an agent that compacts its history (a request that does not extend the session's) opens a
#    new context with the whole conversation, recorded in context_starts;
#  * agents that crash, hang or exit without a reward fail their own episode (env_failed, infra),
#    the job goes on; an episode stopped at its turn limit (404) or token budget (413) is
#    truncated with the reward its agent gives after that answer;
#  * 64 agents at once on one rollout rank (rollout.agent_max_sessions), the 65th and later
#    waiting for a slot: every agent counts the agents alive, and none saw more than 64;
#  * full async and one step off, each in two job steps: episodes across weight updates and a restart;
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

echo "== conformance with the openai client: np 2, np 4 (history edited), np 1 colocated (reward POSTed)"
args=("${base[@]}")
run 2 np2 --set run.n_steps=2 --set "rollout.agent_command=$probe --log $out/np2.agentlog"
run 4 np4 --set run.n_steps=1 --set model.max_seq_len=1600 --set rollout.kv_cache_tokens=16384 --set rollout.env_max_total_tokens=1000 --set "rollout.agent_command=$probe --edit-history --log $out/np4.agentlog"
run 1 np1 --set run.n_steps=1 --set parallel.placement=colocate \
  --set "rollout.agent_command=$probe --post-reward --log $out/np1.agentlog"
grep -qF "agent endpoint: http://127.0.0.1:" "$out/np2.log" || { cat "$out/np2.log"; echo "FAIL: no endpoint line"; exit 1; }
[ "$(stat -c %a "$out/np2/agent_token")" = 600 ] || { echo "FAIL: agent_token is not mode 0600"; exit 1; }

/usr/bin/python3 - "$out" <<'PY'
import json, sys
import h5py, numpy as np
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

def text(ids):  # data.chat_template = none over the byte tokenizer: ids < 256 are bytes
    return bytes(int(t) for t in ids if t < 256)

def runs(mask):  # [(start, end, mask value)] of equal loss-mask values
    out, s = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[s]:
            out.append((s, i, mask[s])); s = i
    return out

for name, edited in [("np2", False), ("np4", True), ("np1", False)]:
    log = {}
    for line in open(f"{out}/{name}.agentlog"):
        r = json.loads(line)
        log.setdefault(r["episode"], []).append(r)
    n = 0
    with h5py.File(f"{out}/{name}/rollouts.h5") as f:
        g = f["samples"]
        col = lambda k, i: g[k + "/values"][g[k + "/offsets"][i]:g[k + "/offsets"][i + 1]]
        for i in range(g["step"].shape[0]):
            ep = f"{g['step'][i]}/{g['group_index'][i]}/{g['index'][i]}"
            turns = sorted(log[ep], key=lambda r: r["turn"])
            assert [t["turn"] for t in turns] == [0, 1, 2] and any(t["stream"] for t in turns), (name, ep)
            assert g["status"][i] == 1 and g["env_turns"][i] == 3, (name, ep, g["status"][i], g["env_turns"][i])
            toks, p, mask = col("tokens", i), int(g["prompt_length"][i]), col("loss_mask", i)
            first = turns[0]["sent"]
            assert text(toks[:p]).decode() == f"probe agent\n\n{tools_block}\n{first[1]['content']}\n", (name, ep)
            resp = toks[p:]
            segments = runs(mask)
            model = [s for s in segments if s[2] == 1]
            assert len(model) == 3, (name, ep, segments)
            for k, (a, b, _) in enumerate(model):  # what the client received, decoded from the sampled tokens
                assert text(resp[a:b]).decode("utf-8", "replace") == turns[k]["content"], \
                    (name, ep, k, text(resp[a:b]), turns[k]["content"])
            env = [s for s in segments if s[2] == 0]
            starts = list(col("context_starts", i))
            if edited:  # turn 3's request dropped the first exchange: a new context, the whole conversation rendered
                assert starts == [env[1][0]], (name, ep, starts, segments)
                c = turns[1]["content"]
                want = f"probe agent\n\n{tools_block}\n{first[1]['content']}\n{c}\nturn 2\n"
                assert text(resp[env[1][0]:env[1][1]]).decode() == want, (name, ep, text(resp[env[1][0]:env[1][1]]))
                assert text(resp[env[0][0]:env[0][1]]) == b"turn 1\n"
            else:
                assert starts == [], (name, ep, starts)
                assert [text(resp[a:b]) for a, b, _ in env] == [b"turn 1\n", b"turn 2\n"], (name, ep)
            logp = col("rollout_log_probs", i)
            assert len(logp) == len(mask) and np.all(logp[mask == 0] == 0) and np.all(logp[mask == 1] < 0), (name, ep)
            want_reward = float(sum(len(t["content"].encode()) for t in turns) % 2)
            assert g["raw_reward"][i] == want_reward, (name, ep, g["raw_reward"][i], want_reward)
            n += 1
    with h5py.File(f"{out}/{name}/metrics.h5") as f:
        diff = f["steps/train/train_rollout_logprob_abs_diff"][:]
    assert n > 0 and np.all(diff < 1e-5), (name, n, diff)
    print(f"agent_runs: {name}: {n} trajectories are the agents' requests and answers token by token"
          f"{' (a compacted history opens a new context)' if edited else ''}; train/rollout log-prob diff {diff.max():.1e}")
PY

echo "== agents that crash, hang or give no reward fail their own episode"
args=("${base[@]}" --set run.n_steps=1 --set rollout.rollout_batch_size=1 --set rollout.n_samples_per_prompt=5 --set train.global_batch_size=5
      --set rollout.env_timeout_s=8)
run 2 failing --set "rollout.agent_command=$tiny --modes normal,crash,hang,noreward,post"
/usr/bin/python3 - "$out/failing" <<'PY'
import sys
import h5py
with h5py.File(sys.argv[1] + "/rollouts.h5") as f:
    g = f["samples"]
    by_mode = {}
    for i in range(g["step"].shape[0]):
        mode = ["normal", "crash", "hang", "noreward", "post"][int(g["index"][i]) % 5]
        by_mode.setdefault(mode, set()).add((int(g["status"][i]), int(g["env_error"][i])))
# every group has a failed episode, so its completed ones are recorded as not trained (status 5, filtered)
assert by_mode["normal"] == {(5, 0)} and by_mode["post"] == {(5, 0)}, by_mode
for mode in ["crash", "hang", "noreward"]:
    assert by_mode[mode] == {(8, 3)}, (mode, by_mode)  # env_failed, infra
print("agent_runs: crashed, hung and reward-less agents failed their own episodes (env_failed, infra); the rest completed")
PY
for why in "its agent ended with exit status 3" "neither sent its next request nor exited within rollout.env_timeout_s" \
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

echo "== refusals"
args=("${base[@]}")
refused typo "rollout.agent_command 'pyhton3 agent.py' cannot be run" 2 --set run.n_steps=1 \
  --set "rollout.agent_command=pyhton3 agent.py"
check_refuses port_without_agent 'rollout.agent_port' 2 --set rollout.environment=calculator --set rollout.agent_port=9999
check_refuses no_command 'rollout.environment = "agent"' 2 --set rollout.agent_command=
check_refuses no_style 'set reward.style = "environment"' 2 --set reward.style=exact_match --set rollout.agent_command=x
echo "agent_runs: all passed"
