#!/usr/bin/env bash
# `slimpi generate` end to end: the same deck at np 1, 2 and 3 writes identical
# rollouts.h5 contents (seeded sampling does not depend on the number of engines or
# on which engine served a group); every group appears once, in order; a group's
# prompt is prefilled once (8 samples per prompt: prefill ~ 1/8 of prompt tokens served).
# Usage: generate_run.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
head -40 inputs/data/addition_eval.jsonl >"$out/prompts.jsonl"
for np in 1 2 3; do
  $mpirun -np $np "$slimpi" generate inputs/generate_addition.toml --set model.init_from= \
    --set data.path="$out/prompts.jsonl" --set run.dir="$out/np$np" --set rollout.max_running=16 \
    --set rollout.max_batch_tokens=128 >"$out/np$np.log" 2>&1 || { cat "$out/np$np.log"; exit 1; }
done
# data.path slices work as in `slimpi run`; an impossible bound is a clean error.
$mpirun -np 2 "$slimpi" generate inputs/generate_addition.toml --set model.init_from= \
  --set data.path="$out/prompts.jsonl@[10:20]" --set run.dir="$out/slice" >"$out/slice.log" 2>&1 \
  || { cat "$out/slice.log"; exit 1; }
if $mpirun -np 2 "$slimpi" generate inputs/generate_addition.toml --set model.init_from= \
  --set data.path="$out/prompts.jsonl@[99999999999999999999:]" --set run.dir="$out/huge" >"$out/huge.log" 2>&1; then
  echo "FAIL: a slice bound past 64 bits was accepted"; exit 1
fi
grep -q "slice bound 99999999999999999999 is out of the 64-bit range" "$out/huge.log" || { cat "$out/huge.log"; exit 1; }
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
def load(np_):
    with h5py.File(f"{out}/np{np_}/rollouts.h5") as f:
        g = f["samples"]
        return {k: g[k][:] for k in ["group_index", "index", "status", "response_length"]} | {
            "tokens": g["tokens/values"][:], "offsets": g["tokens/offsets"][:],
            "logp": g["rollout_log_probs/values"][:]}
a = load(1)
assert len(a["group_index"]) == 320
assert list(a["group_index"]) == [i // 8 for i in range(320)]
assert list(a["index"]) == [i % 8 for i in range(320)]
assert set(a["status"]) <= {1, 2}
for np_ in (2, 3):
    b = load(np_)
    for k in ["group_index", "index", "status", "response_length", "tokens", "offsets"]:
        assert np.array_equal(a[k], b[k]), (np_, k)
    np.testing.assert_allclose(a["logp"], b["logp"], atol=1e-5)
with h5py.File(f"{out}/np2/metrics.h5") as f:
    served = f["steps/rollout/prompt_tokens_served"][0]
    computed = f["steps/rollout/prefill_tokens_computed"][0]
    assert abs(computed / served - 1 / 8) < 1e-9, (computed, served)
with h5py.File(f"{out}/slice/rollouts.h5") as f:  # the slice's prompts are records 10..19
    g = f["samples"]
    off, tok, plen = g["tokens/offsets"][:], g["tokens/values"][:], g["prompt_length"][:]
    assert g["group_index"].shape[0] == 80
    for i in range(0, 80, 8):
        j = 8 * (10 + i // 8)
        assert np.array_equal(tok[off[i]:off[i] + plen[i]], a["tokens"][a["offsets"][j]:a["offsets"][j] + plen[i]])
print("generate_run: 320 samples identical at np 1, 2, 3; prefill", computed, "of", served)
PY
echo "generate_run: ok"
