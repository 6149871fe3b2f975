#!/usr/bin/env bash
# The nonzero_std dynamic filter with over-sampling, end to end at np 3 (1 trainer + 2
# engines), rewarded by an external `command` (1 when the decoded response has an
# even number of characters, else 0: mixed rewards within groups of a random model).
# Every trained group in rollouts.h5 has rewards that differ; every generated group
# is logged once (filtered ones with status 5, over-sampling surplus with status 3,
# after the step's trained rows); drops are counted; a bad prompt line stops every
# rank cleanly.
# Usage: dynamic_filter.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
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
    step, group, raw, status = g["step"][:], g["group_index"][:], g["raw_reward"][:], g["status"][:]
    adv_rows = np.diff(g["advantages/offsets"][:])
    reward, advantage = g["reward"][:], g["advantage"][:]
with h5py.File(f"{run}/metrics.h5") as f:
    dropped = f["steps/rollout/dynamic_filter/drop_zero_std"][:3]
    generated = f["steps/rollout/groups_generated"][:3]
    assert np.all(generated >= 6 + dropped), (generated, dropped)
trained = (status == 1) | (status == 2)
for s in range(3):
    here = step == s
    groups = sorted(set(group[here & trained]))
    assert len(groups) == 6, (s, groups)  # the batch was filled
    for gi in groups:
        r = raw[here & (group == gi)]
        assert len(r) == 4 and r.std() > 0, (s, gi, r)
    # Every generated group is in the file once: trained, filtered (5) or surplus (3).
    assert len(set(group[here])) == generated[s] and here.sum() == 4 * generated[s], (s, here.sum(), generated[s])
    filtered = sorted(set(group[here & (status == 5)]))
    assert len(filtered) == dropped[s], (s, filtered, dropped[s])
    for gi in filtered:
        r = raw[here & (group == gi)]
        assert r.std() == 0, (s, gi, r)
    first_unused = np.argmax(here & ~trained) if (here & ~trained).any() else None
    if first_unused is not None:  # trained rows first, then the unused ones
        assert not trained[first_unused:][step[first_unused:] == s].any()
assert (status == 5).any() and (status == 3).any(), np.unique(status)
assert np.all(reward[status == 5] == 0) and np.all(np.isnan(advantage[status == 3]))
assert np.all(adv_rows[~trained] == 0) and np.all(adv_rows[trained] > 0)
print("dynamic_filter: groups dropped per step", list(dropped), "generated", list(generated))
PY
# Replaying the recorded steps (filtered and surplus rows in the file) reproduces the
# train metrics exactly: the replay takes each step's trained rows only.
$mpirun -np 3 "$slimpi" run "$out/filter.toml" --set run.dir="$out/replay" --set debug.train_only=true \
  --set debug.load_rollouts="$out/run/rollouts.h5" >"$out/replay.log" 2>&1 || { cat "$out/replay.log"; exit 1; }
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
with h5py.File(f"{out}/run/metrics.h5") as a, h5py.File(f"{out}/replay/metrics.h5") as b:
    for c in ["train/loss", "train/pg_loss", "train/grad_norm", "train/entropy_loss"]:
        assert np.array_equal(a["steps/" + c][:], b["steps/" + c][:], equal_nan=True), c
print("dynamic_filter: replay reproduces the train metrics")
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
