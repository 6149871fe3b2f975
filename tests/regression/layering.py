#!/usr/bin/python3
"""docs/architecture.md's layout of src/ is true of the code: every folder it lists
exists and is listed, and a folder includes only folders listed below it.

Usage: layering.py ROOT
"""
import os
import re
import sys

root = sys.argv[1]
doc = open(os.path.join(root, "docs/architecture.md")).read()
block = doc[doc.index("<!-- src layout: keep in step with src/ -->"):]
block = block[block.index("```\n") + 4:]
block = block[:block.index("```")]
order = [line.split()[0].rstrip("/") for line in block.splitlines() if line and not line.startswith(" ")]
order = [o for o in order if o != "main.cpp"]
src = os.path.join(root, "src")
folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
assert sorted(order) == folders, f"docs/architecture.md lists {sorted(order)}, src/ has {folders}"
rank = {f: i for i, f in enumerate(order)}  # 0 = top
problems = []
for folder in folders:
    files = sorted(os.path.relpath(os.path.join(d, f), os.path.join(src, folder))
                   for d, _, fs in os.walk(os.path.join(src, folder)) for f in fs)
    for name in files:
        text = open(os.path.join(src, folder, name), errors="replace").read()
        for used in sorted(set(re.findall(r'#include "([a-z_]+)/', text))):
            if used != folder and used in rank and rank[used] < rank[folder]:
                problems.append(f"src/{folder}/{name} includes {used}/, which docs/architecture.md lists above {folder}/")
assert not problems, "\n".join(problems)
print(f"layering: {len(folders)} folders, every include points down the documented order")
