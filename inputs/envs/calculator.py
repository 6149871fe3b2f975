#!/usr/bin/env python3
"""The calculator environment: slimpi's environment protocol, version 1
(docs/environments.md), written against the protocol alone, with no dependencies.

One tool, `calculator` {"expression": string}: integer + - * and parentheses. A model
turn with tool calls gets one tool message per call (the value, or "error: ...");
a turn without one is the final answer: reward 1 if it equals the label (both
stripped of whitespace), else 0, and the episode is done. The in-process environment
rollout.environment = "calculator" (src/env/calculator_environment.cpp) gives the same
replies, byte for byte.

Usage (a deck):  rollout.environment = "command"
                 rollout.env_command = "python3 inputs/envs/calculator.py"
Options: --log FILE   append every line received and sent, as {"dir": "in"|"out", "line": ...}
         --max-concurrent N   episodes this process takes at once (default 256)

A reset or step it cannot read (a wrong type, a missing field, a step of an episode it
was not reset with) gets an error reply of class infra naming its episode: that episode
fails, the process goes on. Any other bad line (not JSON, no episode, an unknown type) is
said on stderr and skipped: a reply that names no episode would have slimpi restart the
process.
"""
import json
import sys

LIMIT = 10 ** 18


class CalcError(Exception):
    pass


class Parser:
    """expr := term (+|- term)*, term := factor (* factor)*, factor := digits | ( expr ) | - factor"""

    def __init__(self, s):
        self.s, self.i = s.encode(), 0  # bytes: positions are byte offsets, as in slimpi's C++ twin

    def skip(self):
        while self.i < len(self.s) and self.s[self.i] == ord(" "):
            self.i += 1

    @staticmethod
    def checked(v):
        if v > LIMIT or v < -LIMIT:
            raise CalcError("overflow")
        return v

    def parse(self):
        v = self.expr()
        self.skip()
        if self.i < len(self.s):
            raise CalcError(f"unexpected character at {self.i}")
        return v

    def expr(self):
        v = self.term()
        self.skip()
        while self.i < len(self.s) and self.s[self.i] in b"+-":
            op = chr(self.s[self.i])
            self.i += 1
            w = self.term()
            v = self.checked(v + w if op == "+" else v - w)
            self.skip()
        return v

    def term(self):
        v = self.factor()
        self.skip()
        while self.i < len(self.s) and self.s[self.i] == ord("*"):
            self.i += 1
            v = self.checked(v * self.factor())
            self.skip()
        return v

    def factor(self):
        self.skip()
        if self.i >= len(self.s):
            raise CalcError("unexpected end")
        c = chr(self.s[self.i])
        if c == "-":
            self.i += 1
            return self.checked(-self.factor())
        if c == "(":
            self.i += 1
            v = self.expr()
            self.skip()
            if self.i >= len(self.s):
                raise CalcError("unexpected end")
            if self.s[self.i] != ord(")"):
                raise CalcError(f"unexpected character at {self.i}")
            self.i += 1
            return v
        if not ("0" <= c <= "9"):
            raise CalcError(f"unexpected character at {self.i}")
        v = 0
        while self.i < len(self.s) and ord("0") <= self.s[self.i] <= ord("9"):
            v = self.checked(v * 10 + self.s[self.i] - ord("0"))
            self.i += 1
        return v


def calculate(expression):
    if len(expression.encode()) > 200:
        return "error: longer than 200 characters"
    try:
        return str(Parser(expression).parse())
    except CalcError as e:
        return f"error: {e}"


def step_reply(episode, action, max_turns, label):
    reply = {"type": "observation", "episode": episode}
    calls = action.get("tool_calls", [])
    if not calls:
        reply.update(reward=1.0 if action["text"].strip(" \t\r\n") == label.strip(" \t\r\n") else 0.0, done=True)
        return reply
    messages = []
    for call in calls:
        if "error" in call:
            result = "error: " + call["error"]
        elif call.get("name") != "calculator":
            result = "error: unknown tool " + str(call.get("name"))
        else:
            args = call.get("arguments")
            if not isinstance(args, dict) or not isinstance(args.get("expression"), str):
                result = 'error: arguments need a string "expression"'
            else:
                result = calculate(args["expression"])
        if result.startswith("error: "):
            reply["error"] = {"class": "tool", "message": result}
        messages.append({"role": "tool", "content": result})
    reply.update(messages=messages, reward=0.0, done=False, truncated=action_turn(action) >= max_turns)
    return reply


def action_turn(action):
    return action.get("_turn", 0)


def main():
    # The protocol is UTF-8 whatever the locale (slimpi's C++ twin works on bytes).
    sys.stdin.reconfigure(encoding="utf-8", errors="replace")
    sys.stdout.reconfigure(encoding="utf-8")
    log = None
    max_concurrent = 256
    args = sys.argv[1:]
    while args:
        a = args.pop(0)
        if a == "--log":
            log = open(args.pop(0), "a")
        elif a == "--max-concurrent":
            max_concurrent = int(args.pop(0))
        else:
            sys.exit(f"calculator.py: unknown option {a}")
    tools = [{"type": "function", "function": {
        "name": "calculator", "description": "integer + - * and parentheses",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
    episodes = {}  # episode -> (label, max_turns)

    def send(obj):
        line = json.dumps(obj)
        if log:
            log.write(json.dumps({"dir": "out", "line": line}) + "\n")
            log.flush()
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        if log:
            log.write(json.dumps({"dir": "in", "line": line.rstrip("\n")}) + "\n")
            log.flush()
        msg = None
        try:
            msg = json.loads(line)
            kind = msg.get("type")
            if kind == "hello":
                send({"type": "hello", "protocol_version": 1, "name": "calculator", "tools": tools,
                      "max_concurrent_episodes": max_concurrent, "deterministic": True})
            elif kind == "reset":
                label, max_turns = msg["prompt"].get("label", ""), msg["limits"]["max_turns"]
                if not isinstance(label, str) or not isinstance(max_turns, int):
                    raise TypeError("prompt.label is not a string or limits.max_turns not an integer")
                episodes[msg["episode"]] = (label, max_turns)
                send({"type": "observation", "episode": msg["episode"]})
            elif kind == "step":
                label, max_turns = episodes[msg["episode"]]
                action = dict(msg["action"], _turn=msg["turn"])
                send(step_reply(msg["episode"], action, max_turns, label))
            elif kind == "close":
                episodes.pop(msg["episode"], None)
            else:
                raise ValueError(f"unknown type {kind!r}")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            why = f"calculator.py: cannot read {line.strip()[:200]!r}: {type(e).__name__}: {e}"
            episode = msg.get("episode") if isinstance(msg, dict) else None
            if isinstance(episode, str) and msg.get("type") in ("reset", "step"):
                send({"type": "error", "episode": episode, "class": "infra", "message": why})
            else:
                print(why, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
