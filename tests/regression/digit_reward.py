#!/usr/bin/env python3
"""A `command` reward that a policy learns from scratch in a few dozen steps: the
fraction of the response's characters that are the digit 7 (reads JSON lines
{prompt, response, label}, writes one number per line)."""
import json
import sys

for line in sys.stdin:
    response = json.loads(line)["response"]
    print(response.count("7") / max(len(response), 1), flush=True)
