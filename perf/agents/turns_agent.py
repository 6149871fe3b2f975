"""An agent (standard library only: urllib over slimpi's OpenAI endpoint, docs/agents.md)
that gives exactly the episodes of perf/agents/turns_env.py: the prompt as its first user
message, "turn K" after the model's K-th answer, reward 0 after --turns answers.
Usage: turns_agent.py [--turns 3]"""
import argparse
import json
import os
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=3)
    a = ap.parse_args()
    url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
    headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
    messages = [{"role": "user", "content": os.environ["SLIMPI_PROMPT"]}]
    for k in range(1, a.turns + 1):
        body = json.dumps({"model": os.environ["SLIMPI_MODEL"], "messages": messages}).encode()
        answer = json.load(urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers)))
        messages.append(answer["choices"][0]["message"])
        if k < a.turns:
            messages.append({"role": "user", "content": f"turn {k}"})
    print(json.dumps({"reward": 0.0}))


if __name__ == "__main__":
    main()
