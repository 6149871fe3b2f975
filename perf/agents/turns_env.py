"""A JSON-lines environment (docs/environments.md) that gives exactly the episodes of
perf/agents/turns_agent.py: the prompt as the first user message, "turn K" after the model's
K-th turn, done with reward 0 after --turns model turns. One process serves every episode
of its rank. Usage: turns_env.py [--turns 3]"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=3)
    a = ap.parse_args()
    turns = {}
    for line in sys.stdin:
        msg = json.loads(line)
        t = msg["type"]
        if t == "hello":
            out = {"type": "hello", "protocol_version": 1, "name": "turns", "max_concurrent_episodes": 4096}
        elif t == "reset":
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


if __name__ == "__main__":
    main()
