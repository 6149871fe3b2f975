"""A JSON-lines environment (docs/environments.md) that gives exactly the episodes of
perf/agents/turns_agent.py: the prompt as the first user message, "turn K" after the model's
K-th turn, done with reward 0 after --turns model turns. One process serves every episode
of its rank. With --spawn-per-episode it also starts `turns_agent.py --start-only` at each
episode's reset (not waited for; reaped later), so that both sides pay one agent process
start per episode and the difference is the protocol.
Usage: turns_env.py [--turns 3] [--spawn-per-episode]"""
import argparse
import json
import os
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--spawn-per-episode", action="store_true")
    a = ap.parse_args()
    turns = {}
    agent = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "turns_agent.py"), "--start-only"]
    started = []  # the agent processes not yet reaped
    for line in sys.stdin:
        started = [p for p in started if p.poll() is None]
        msg = json.loads(line)
        t = msg["type"]
        if t == "hello":
            out = {"type": "hello", "protocol_version": 1, "name": "turns", "max_concurrent_episodes": 4096}
        elif t == "reset":
            if a.spawn_per_episode:
                started.append(subprocess.Popen(agent, stdin=subprocess.DEVNULL))
            turns[msg["episode"]] = 0
            out = {"type": "observation", "episode": msg["episode"],
                   "messages": [{"role": "user", "content": msg["prompt"]["text"]}]}
        elif t == "step":
            k = turns[msg["episode"]] = turns[msg["episode"]] + 1
            out = {"type": "observation", "episode": msg["episode"], "reward": 0.0, "done": k >= a.turns}
            if k < a.turns:
                out["messages"] = [{"role": "user", "content": f"turn {k}"}]
        else:
            turns.pop(msg.get("episode"), None)
            continue
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    for p in started:
        p.wait()


if __name__ == "__main__":
    main()
