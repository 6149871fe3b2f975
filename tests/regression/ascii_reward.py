# A command reward (reward.style = "command") for the parallel-layout regression runs: the
# share of ASCII characters in each response, which varies within every group from the
# first step, so that advantages, gradients and the next steps' tokens depend on it.
import json, sys
for line in sys.stdin:
    r = json.loads(line)["response"]
    print(sum(c.isascii() for c in r) / max(len(r), 1), flush=True)
