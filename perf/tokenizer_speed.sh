#!/usr/bin/env bash
# Tokenizer encoding speed, slimpi vs the Python `tokenizers` library (Rust), same text,
# same tokenizer.json, one thread each, one line at a time; prints MB/s and the ratio.
# The text: ~8 MB of mixed lines (code, prose, CJK, emoji, numbers) cut from the
# tokenizer fixtures' strings at random. Needs a Python with `tokenizers`
# (tests/fixtures/hf/README.md: /opt/slimpi/hf-dev).
# Usage: perf/tokenizer_speed.sh [TOKENIZER_DIR] [PYTHON]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tok=${1:-$root/tests/fixtures/tokenizers/qwen2_style}
py=${2:-/opt/slimpi/hf-dev/bin/python}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
RAYON_RS_NUM_CPUS=1 TOKENIZERS_PARALLELISM=true "$py" - "$tok" "$out/text.txt" "$root" <<'PY'
import json, random, sys, time
from tokenizers import Tokenizer
tok_dir, text_path, root = sys.argv[1], sys.argv[2], sys.argv[3]
cases = [c["text"] for c in json.load(open(f"{root}/tests/fixtures/tokenizers/qwen2_style/cases.json"))["cases"]]
rng = random.Random(5)
lines, size = [], 0
while size < 8_000_000:
    line = " ".join(rng.choice(cases) for _ in range(4)).replace("\n", " ")
    lines.append(line)
    size += len(line.encode())
open(text_path, "w").write("\n".join(lines) + "\n")
tok = Tokenizer.from_file(f"{tok_dir}/tokenizer.json")
best = 1e30
for _ in range(3):
    t0 = time.perf_counter()
    for line in lines:
        tok.encode(line, add_special_tokens=False)
    best = min(best, time.perf_counter() - t0)
print(f"tokenizers_MB_per_s {size / best / 1e6:.2f} (encode per line)")
best = 1e30
for _ in range(3):  # the whole list in one call: no per-line Python overhead (one thread: RAYON_RS_NUM_CPUS=1)
    t0 = time.perf_counter()
    tok.encode_batch(lines, add_special_tokens=False)
    best = min(best, time.perf_counter() - t0)
print(f"tokenizers_MB_per_s {size / best / 1e6:.2f} (encode_batch, one thread)")
PY
SLIMPI_TOKENIZER="$tok" SLIMPI_TOKENIZER_TEXT="$out/text.txt" "$root/build/perf/bench_tokenizer" 2>/dev/null | grep BM_
