"""An agent (standard library only: urllib over slimpi's OpenAI endpoint, docs/agents.md)
that gives exactly the episodes of perf/agents/turns_env.py: the prompt as its first user
message, "turn K" after the model's K-th answer, reward 0 after --turns answers. With
--sub-agent, a sub-agent's conversation (its own first message, two answers) comes between
the parent's first and second requests: the parent's return resumes its thread.
With --start-only it exits at once, having paid its start (the interpreter, these imports):
what perf/agents/turns_env.py --spawn-per-episode starts per episode, to time the endpoint with
the agents' process starts on both sides.
Usage: turns_agent.py [--turns 3] [--sub-agent] [--start-only]"""
import argparse
import json
import os
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--sub-agent", action="store_true")
    ap.add_argument("--start-only", action="store_true")
    a = ap.parse_args()
    if a.start_only:
        return
    url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
    headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}

    def answer(messages):
        body = json.dumps({"model": os.environ["SLIMPI_MODEL"], "messages": messages}).encode()
        return json.load(urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers)))["choices"][0]["message"]

    messages = [{"role": "user", "content": os.environ["SLIMPI_PROMPT"]}]
    for k in range(1, a.turns + 1):
        messages.append(answer(messages))
        if k == 1 and a.sub_agent:
            sub = [{"role": "user", "content": "sub-agent: " + os.environ["SLIMPI_PROMPT"]}]
            sub.append(answer(sub))
            sub.append({"role": "user", "content": "go on"})
            sub.append(answer(sub))
        if k < a.turns:
            messages.append({"role": "user", "content": f"turn {k}"})
    print(json.dumps({"reward": 0.0}))


if __name__ == "__main__":
    main()
