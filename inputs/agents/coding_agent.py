"""A coding agent written against the OpenAI Python client, as slimpi runs agents
(rollout.environment = "agent", docs/agents.md): slimpi starts it once per episode with the
endpoint in OPENAI_BASE_URL/OPENAI_API_KEY, the task in SLIMPI_PROMPT and the test cases in
SLIMPI_LABEL, {"visible": [[x, y] or [x, y, "expected as test.py writes it"], ...], "hidden":
[[x, y], ...]}, each case meaning f(x) == y.

The episode has a sandbox directory (sandbox.py) holding test.py, one `assert f(x)==y` line
per visible case (y as the label writes it); the model writes sol.py there. The conversation
starts with the task as the only message (no system message). Each model turn's tool calls
are run and answered with one tool message each; a turn without tool calls ends the episode,
as does --max-turns. Tools (passed to the API only with --declare-tools: a small model learns
them from supervised traces made to match these outputs exactly):

  read_file {"path"}             the file's text; `error: no file {path}` / `error: {why}`
  write_file {"path", "content"} `wrote {path}`; `error: {why}`
  run_tests {}                   `{passed}/{total} passed` when all pass, else
                                 `{passed}/{total} passed; first failure: f(0) == 4 (got 3)`,
                                 or `error: no sol.py`, `error: SyntaxError: ... (line N)` ...
  any other name / arguments     `error: unknown tool {name}` / `error: bad arguments for {name}: {why}`

Reward: the fraction of the hidden cases sol.py passes at the end (0 when it is missing or
does not import) if the model submitted, printed as the last stdout line, {"reward": r}. The
model submits by ending the episode with a turn of no tool calls whose text is `done` (as the
supervised traces end; an explicit submit, as mini-swe-agent's). An episode that ends otherwise
scores 0: at --max-turns, stopped by slimpi at a limit (404 or 413 on a request; the exit status
is still 0), or with a last turn of anything else, such as a tool call the endpoint could not
parse. Without that rule GRPO rewards episodes whose sol.py is right and whose later turns are
broken, and learns to break them (perf/results/2026-12-07.md, session 14).

Usage: coding_agent.py [--max-turns 6] [--declare-tools] [--log DIR] [--verbose]
"""
import argparse
import json
import os
import sys

import openai

from sandbox import Sandbox


def function(name, description, properties):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {k: {"type": "string"} for k in properties}, "required": properties}}}


TOOLS = [function("read_file", "Reads a file of the working directory.", ["path"]),
         function("write_file", "Writes a file of the working directory.", ["path", "content"]),
         function("run_tests", "Runs the tests of test.py against sol.py.", [])]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"]["required"] for t in TOOLS}


def parse_arguments(name, text):
    """The call's arguments as a dict, or the reason they are not right for the tool."""
    try:
        args = json.loads(text or "{}")  # a call without arguments may come as ""
    except ValueError:
        return None, "not JSON"
    if not isinstance(args, dict):
        return None, "not a JSON object"
    for key in PARAMETERS[name]:
        if key not in args:
            return None, f"missing {key}"
        if not isinstance(args[key], str):
            return None, f"{key} must be a string"
    extra = sorted(set(args) - set(PARAMETERS[name]))
    return (None, f"unexpected {extra[0]}") if extra else (args, "")


def test_file(visible):
    """test.py: one assert line per visible case [x, y] or [x, y, expected]: the expected
    value as written in the line (an expression such as `2*3+5`), else y's repr."""
    return "".join(f"assert f({c[0]!r})=={c[2] if len(c) > 2 else repr(c[1])}\n" for c in visible)


def cases(visible):
    """The [x, y] pairs of the visible cases (what run_tests checks)."""
    return [c[:2] for c in visible]


def test_report(r):
    if r["error"]:
        return f"error: {r['error']}"
    if r["passed"] == r["total"]:
        return f"{r['passed']}/{r['total']} passed"
    return f"{r['passed']}/{r['total']} passed; first failure: {r['first_failure']}"


def run_tool(sandbox, visible, name, arguments):
    if name not in PARAMETERS:
        return f"error: unknown tool {name}"
    args, why = parse_arguments(name, arguments)
    if args is None:
        return f"error: bad arguments for {name}: {why}"
    if name == "run_tests":
        return test_report(sandbox.run_cases(cases(visible)))
    try:
        if name == "read_file":
            return sandbox.read(args["path"])
        sandbox.write(args["path"], args["content"])
        return f"wrote {args['path']}"
    except FileNotFoundError:
        return f"error: no file {args['path']}"
    except (ValueError, OSError) as e:  # a bad name, too big, a directory...
        return f"error: {e.strerror if isinstance(e, OSError) else e}"


SUBMIT = "done"


def submitted(final_text):
    """Whether the model's last turn (one without tool calls) is the submit."""
    return (final_text or "").strip() == SUBMIT


def episode_reward(hidden, has_submitted):
    """The fraction of the hidden cases passed ({passed, total, error} of run_cases), or 0 when
    the model did not submit or sol.py does not run."""
    if not has_submitted or hidden["error"] or not hidden["total"]:
        return 0.0
    return hidden["passed"] / hidden["total"]


def assistant_message(msg):
    """The model's turn as the API returned it, to send back in the history: slimpi checks that
    the next request starts with it (text, tool calls' names and arguments)."""
    m = {"role": "assistant", "content": msg.content}
    if msg.tool_calls:
        m["tool_calls"] = [{"id": c.id, "type": "function",
                            "function": {"name": c.function.name, "arguments": c.function.arguments}}
                           for c in msg.tool_calls]
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--declare-tools", action="store_true", help="pass the tools to the API (a # Tools block)")
    ap.add_argument("--log", metavar="DIR", help="write DIR/<episode>.json: the messages and the reward")
    ap.add_argument("--verbose", action="store_true", help="say the sandbox's isolation on stderr")
    a = ap.parse_args()
    label = json.loads(os.environ["SLIMPI_LABEL"])
    client = openai.OpenAI(max_retries=0, timeout=600)  # OPENAI_BASE_URL and OPENAI_API_KEY from slimpi
    messages = [{"role": "user", "content": os.environ["SLIMPI_PROMPT"]}]
    with Sandbox() as sandbox:
        if a.verbose:
            print(f"sandbox isolation: {sandbox.isolation}", file=sys.stderr)
        sandbox.write("test.py", test_file(label["visible"]))
        has_submitted = False
        for _ in range(a.max_turns):
            try:
                r = client.chat.completions.create(model=os.environ["SLIMPI_MODEL"], messages=messages,
                                                   **({"tools": TOOLS} if a.declare_tools else {}))
            except openai.APIStatusError as e:
                if e.status_code not in (404, 413):
                    raise
                if a.verbose:  # slimpi stopped the episode at a turn, time or token limit
                    print(f"stopped by slimpi: {e.message}", file=sys.stderr)
                break
            msg = r.choices[0].message
            messages.append(assistant_message(msg))
            if not msg.tool_calls:
                has_submitted = submitted(msg.content)
                break
            for call in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": run_tool(sandbox, label["visible"], call.function.name,
                                                     call.function.arguments)})
        hidden = sandbox.run_cases(label["hidden"])
        reward = episode_reward(hidden, has_submitted)
        isolation = sandbox.isolation
    if a.log:  # written whole or not at all: slimpi may kill an agent at any point (a job's end)
        os.makedirs(a.log, exist_ok=True)
        path = os.path.join(a.log, os.environ["SLIMPI_EPISODE"].replace("/", "_") + ".json")
        with open(path + ".part", "w") as f:
            json.dump({"messages": messages, "reward": reward, "submitted": has_submitted, "isolation": isolation}, f,
                      indent=1)
        os.replace(path + ".part", path)
    print(json.dumps({"reward": reward}))


if __name__ == "__main__":
    main()
