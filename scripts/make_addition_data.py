#!/usr/bin/env python3
"""Writes the small arithmetic SFT set shipped in inputs/data (fixed seed, stdlib only).

Task: a+b with 1-3 digit operands; the answer is written with its digits reversed
(least significant first), which a small causal model learns far more easily.
  {"prompt": "57+468=", "response": "525", "label": "525"}   # 57 + 468 = 525 -> reversed "525"
"response" is the SFT target, "label" what the RL reward (exact_match) compares with.
Usage: scripts/make_addition_data.py OUT.jsonl N SEED
"""
import json
import random
import sys


def main() -> None:
    out, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    with open(out, "w") as f:
        for _ in range(n):
            a = rng.randint(0, 10 ** rng.randint(1, 3) - 1)
            b = rng.randint(0, 10 ** rng.randint(1, 3) - 1)
            answer = str(a + b)[::-1]
            f.write(json.dumps({"prompt": f"{a}+{b}=", "response": answer, "label": answer}) + "\n")


if __name__ == "__main__":
    main()
