#!/usr/bin/env bash
# The nonzero_std dynamic filter with over-sampling, end to end at np 3 (1 trainer + 2
# engines), rewarded by an external `command` (1 when the decoded response has an
# even number of characters, else 0: mixed rewards within groups of a random model).
# Every group that reaches rollouts.h5 must have rewards that differ; drops are
# counted; a bad prompt line stops every rank cleanly.
# Usage: dynamic_filter.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
slimpi=$1; root=$2; mpirun=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
cd "$root"
cat >"$out/parity.py" <<'PY'
import json
import sys
for line in sys.stdin:
    print(len(json.loads(line)["response"]) % 2 == 0 and 1 or 0)
PY
cat >"$out/filter.toml" <<EOF2
include = ["$root/inputs/smoke_rl.toml"]
[run]
n_steps = 3
[parallel]
trainer_ranks = 1
[rollout]
rollout_batch_size = 6
over_sampling_batch_size = 8
dynamic_filter = "nonzero_std"
temperature = 1.5
[reward]
style = "command"
command = "/usr/bin/python3 $out/parity.py"
[train]
global_batch_size = 24
EOF2
$mpirun -np 3 "$slimpi" run "$out/filter.toml" --set run.dir="$out/run" >"$out/run.log" 2>&1 \
  || { cat "$out/run.log"; exit 1; }
/usr/bin/python3 - "$out/run" <<'PY'
import sys
import h5py
import numpy as np
run = sys.argv[1]
with h5py.File(f"{run}/rollouts.h5") as f:
    g = f["samples"]
    step, group, raw = g["step"][:], g["group_index"][:], g["raw_reward"][:]
for s in range(3):
    groups = sorted(set(group[step == s]))
    assert len(groups) == 6, (s, groups)  # the batch was filled
    for gi in groups:
        r = raw[(step == s) & (group == gi)]
        assert len(r) == 4 and r.std() > 0, (s, gi, r)
with h5py.File(f"{run}/metrics.h5") as f:
    dropped = f["steps/rollout/dynamic_filter/drop_zero_std"][:3]
    generated = f["steps/rollout/groups_generated"][:3]
    assert np.all(generated >= 6 + dropped), (generated, dropped)
print("dynamic_filter: groups dropped per step", list(dropped), "generated", list(generated))
PY
# A malformed prompt line is an error naming file:line on every rank.
head -3 inputs/data/addition_sft.jsonl >"$out/bad.jsonl"
echo '{"prompt": "1+1="}' >>"$out/bad.jsonl"
if timeout 120 $mpirun -np 3 "$slimpi" run "$out/filter.toml" --set data.path="$out/bad.jsonl" \
     --set run.dir="$out/bad" >"$out/bad.log" 2>&1; then
  echo "accepted a bad prompt line"; exit 1
fi
[ "$(grep -c "bad.jsonl:4: missing key 'label'" "$out/bad.log")" = 1 ] || { cat "$out/bad.log"; exit 1; }
echo "dynamic_filter: ok"
