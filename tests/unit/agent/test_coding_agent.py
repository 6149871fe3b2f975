"""The coding agent's sandbox and tools (inputs/agents/coding_agent.py, sandbox.py;
docs/agents.md): sol.py tested case by case in a child process under limits (a wrong value,
an exception, a syntax error, a missing file, a busy loop killed at its CPU limit with nothing
left running, no network where unshare allows a namespace), file names kept inside the
sandbox, the expected values never in the child (a forged result line gains nothing; as
nobody, it cannot read the agent's environment), and the tools' outputs byte for byte as `slimpi make-data coding` writes them into
its supervised traces (each record's tool calls replayed through the agent's tools).
Usage: test_coding_agent.py SLIMPI (run with the openai venv's python)"""
import contextlib
import http.server
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "inputs", "agents"))
import coding_agent  # noqa: E402
from sandbox import Sandbox  # noqa: E402

SLIMPI = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(ROOT, "build", "slimpi")


def call(name, arguments):
    """A scripted model turn: one tool call."""
    return {"name": name, "arguments": json.dumps(arguments)}


@contextlib.contextmanager
def scripted_endpoint(turns):
    """A chat-completions endpoint on 127.0.0.1 that answers its requests with `turns` in
    order (a dict: a tool call; a string: the text of a turn without tool calls); yields its
    base URL."""
    script = iter(turns)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            turn = next(script)
            message = {"role": "assistant", "content": turn if isinstance(turn, str) else None}
            if isinstance(turn, dict):
                message["tool_calls"] = [{"id": "c", "type": "function", "function": turn}]
            body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                               "choices": [{"index": 0, "message": message,
                                            "finish_reason": "stop" if isinstance(turn, str) else "tool_calls"}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()
        server.server_close()


class SandboxTest(unittest.TestCase):
    def test_cases_pass_and_fail_one_by_one(self):
        with Sandbox() as sb:
            sb.write("sol.py", "def f(x):\n  return 3*x+4\n")
            self.assertEqual(sb.run_cases([[0, 4], [1, 7], [2, 10]]),
                             {"passed": 3, "total": 3, "first_failure": "", "error": ""})
            r = sb.run_cases([[0, 4], [1, 8], [2, 11]])
            self.assertEqual((r["passed"], r["first_failure"]), (1, "f(1) == 8 (got 7)"))
            sb.write("sol.py", "def f(x):\n  return 10//x\n")
            r = sb.run_cases([[0, 1], [5, 2]])
            self.assertEqual((r["passed"], r["first_failure"]), (1, "f(0) == 1 (ZeroDivisionError: integer division or modulo by zero)"))

    def test_broken_or_missing_solutions_are_errors(self):
        with Sandbox() as sb:
            self.assertEqual(sb.run_cases([[0, 1]])["error"], "no sol.py")
            sb.write("sol.py", "def f(x)\n  return x\n")
            r = sb.run_cases([[0, 0]])
            self.assertTrue(r["error"].startswith("SyntaxError: ") and r["error"].endswith("(line 1)"), r)
            self.assertEqual(r["passed"], 0)

    def test_a_busy_loop_is_killed_at_its_cpu_limit_with_its_children(self):
        with Sandbox() as sb, tempfile.TemporaryDirectory() as d:  # a child left sleeping, the solution spinning
            os.chmod(d, 0o777)  # (the child may run as nobody)
            marker = os.path.join(d, "child")
            sb.write("sol.py", f"import os, time\nif os.fork() == 0:\n  open({marker!r}, 'w').write(str(os.getpid()))\n"
                               "  time.sleep(60)\nwhile True:\n  pass\n")
            r = sb.run_cases([[0, 0]])
            self.assertIn(r["error"], ("killed: CPU limit", "timed out after 5 s"))
            with open(marker) as fh:
                child = int(fh.read())
            for _ in range(50):  # reaped by now, or a zombie: not running
                alive = os.path.exists(f"/proc/{child}") and Path(f"/proc/{child}/stat").read_text().split()[2] != "Z"
                if not alive:
                    break
                time.sleep(0.05)
            self.assertFalse(alive, "the solution's child outlived its run")

    def test_the_child_never_sees_the_expected_values(self):
        """A solution that forges the harness's result line gains nothing; as nobody (as root) it
        cannot read the agent's environment (which holds the hidden cases) either."""
        with Sandbox() as sb:
            sb.write("sol.py", "import sys, json\nsys.__stdout__.write(json.dumps({'values': [[True, 0, '0']], "
                               "'error': ''}) + '\\n')\nsys.__stdout__.flush()\nimport os\nos._exit(0)\n")
            self.assertEqual(sb.run_cases([[0, 7]])["passed"], 0)
            if "nobody" in sb.isolation:
                sb.write("sol.py", f"def f(x):\n  return open('/proc/{os.getpid()}/environ').read()[:5]\n")
                r = sb.run_cases([[0, "x"]])
                self.assertIn("PermissionError", r["first_failure"])

    def test_no_network_where_a_namespace_is_allowed(self):
        with Sandbox() as sb:
            if sb.isolation.startswith("none"):
                self.skipTest(sb.isolation)
            sb.write("sol.py", "import socket\ndef f(x):\n  try:\n    socket.create_connection(('127.0.0.1', 9), 1)\n"
                               "    return 'connected'\n  except OSError as e:\n    return 'refused' if e.errno == 111 else 'none'\n")
            # In a fresh namespace even the loopback is down: no route, not a refusal.
            self.assertEqual(sb.run_cases([[0, "none"]])["passed"], 1, sb.run_cases([[0, "none"]]))

    def test_file_names_stay_inside(self):
        with Sandbox() as sb:
            for bad in ["../x", "/etc/passwd", "..", ".hidden", ""]:
                with self.assertRaises(ValueError, msg=bad):
                    sb.write(bad, "x")
            with self.assertRaises(ValueError):
                sb.write("big.py", "x" * (64 * 1024 + 1))


class ToolsTest(unittest.TestCase):
    def test_tool_errors_are_outputs(self):
        with Sandbox() as sb:
            run = lambda name, args: coding_agent.run_tool(sb, [[0, 1]], name, args)
            self.assertEqual(run("shell", "{}"), "error: unknown tool shell")
            self.assertEqual(run("write_file", "{"), "error: bad arguments for write_file: not JSON")
            self.assertEqual(run("write_file", '{"path": "a.py"}'), "error: bad arguments for write_file: missing content")
            self.assertEqual(run("read_file", '{"path": "nope.py"}'), "error: no file nope.py")
            self.assertEqual(run("run_tests", ""), "error: no sol.py")

    def test_visible_cases_written_as_given(self):
        """A visible case [x, y, text] is written into test.py as text and checked as f(x) == y; a
        case [x, y] is written as y's repr."""
        visible = [[1, 8, "1*3+5"], [2, 11]]
        self.assertEqual(coding_agent.test_file(visible), "assert f(1)==1*3+5\nassert f(2)==11\n")
        self.assertEqual(coding_agent.cases(visible), [[1, 8], [2, 11]])
        with Sandbox() as sb:
            sb.write("sol.py", "def f(x):return x*3+5")
            self.assertEqual(coding_agent.run_tool(sb, visible, "run_tests", "{}"), "2/2 passed")
            sb.write("sol.py", "def f(x):return x*3+4")
            self.assertEqual(coding_agent.run_tool(sb, visible, "run_tests", "{}"),
                             "0/2 passed; first failure: f(1) == 8 (got 7)")

    def test_reward_needs_the_submit(self):
        """The real agent (the openai client) against a scripted endpoint: the hidden cases'
        fraction when the last turn is `done`, 0 when the episode ends any other way."""
        label = {"visible": [[1, 8, "1*3+5"], [2, 11, "2*3+5"]], "hidden": [[0, 5], [1, 8], [2, 11], [3, 14], [10, 35]]}
        read = call("read_file", {"path": "test.py"})
        good, wrong_a = call("write_file", {"path": "sol.py", "content": "def f(x):return x*3+5"}), \
            call("write_file", {"path": "sol.py", "content": "def f(x):return x*4+5"})
        tests = call("run_tests", {})
        cases = {
            "submitted": ([read, good, tests, "done"], 1.0, True),
            "submitted, one hidden case of five right": ([wrong_a, "\ndone\n"], 0.2, True),
            "a broken tool call after a right sol.py": ([read, good, '<tool_call>{"name":"run_tests","argun'], 0.0, False),
            "other text as the last turn": ([good, "all tests pass"], 0.0, False),
            "the turn limit (--max-turns 4)": ([read, good, tests, tests, "done"], 0.0, False),
        }
        for name, (turns, reward, has_submitted) in cases.items():
            with self.subTest(name), scripted_endpoint(turns) as url, tempfile.TemporaryDirectory() as log:
                env = dict(os.environ, OPENAI_BASE_URL=url, OPENAI_API_KEY="k", SLIMPI_MODEL="m",
                           SLIMPI_PROMPT="Make test.py pass.", SLIMPI_LABEL=json.dumps(label), SLIMPI_EPISODE="e")
                out = subprocess.run([sys.executable, os.path.join(ROOT, "inputs", "agents", "coding_agent.py"),
                                      "--max-turns", "4", "--log", log], env=env, capture_output=True, text=True,
                                     timeout=60)
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertEqual(json.loads(out.stdout.splitlines()[-1]), {"reward": reward})
                with open(os.path.join(log, "e.json")) as fh:
                    self.assertEqual(json.load(fh)["submitted"], has_submitted)

    def test_make_data_traces_are_the_tools_outputs(self):
        """Every tool call of `slimpi make-data coding` records, replayed through the agent's
        tools in a sandbox set up as the agent sets it up, answers with the trace's text."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "coding.jsonl")
            subprocess.run([SLIMPI, "make-data", "coding", "--out", path, "--n", "5", "--seed", "7"], check=True,
                           capture_output=True)
            with open(path) as fh:
                records = [json.loads(line) for line in fh]
        self.assertEqual(len(records), 5)
        for rec in records:
            label = json.loads(rec["label"])
            steps = re.findall(r"<tool_call>(.*?)</tool_call><tool_response>\n(.*?)\n</tool_response>\n", rec["response"],
                               re.S)
            self.assertEqual([json.loads(c)["name"] for c, _ in steps], ["read_file", "write_file", "run_tests"])
            self.assertTrue(rec["response"].startswith("\n") and rec["response"].endswith("</tool_response>\ndone"))
            with Sandbox() as sb:
                sb.write("test.py", coding_agent.test_file(label["visible"]))
                for call, output in steps:
                    c = json.loads(call)
                    self.assertEqual(coding_agent.run_tool(sb, label["visible"], c["name"], json.dumps(c["arguments"])),
                                     output, (rec["prompt"], call))
                hidden = sb.run_cases(label["hidden"])
                self.assertEqual((hidden["passed"], hidden["total"]), (5, 5))


if __name__ == "__main__":
    unittest.main()
