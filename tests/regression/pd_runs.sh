#!/usr/bin/env bash
# Prefill/decode disaggregation (rollout.prefill_ranks) end to end:
#  * `slimpi generate`: np 3 (1 prefill + 2 decode engines) and np 4 (2 + 2) write the
#    rollouts.h5 of one plain engine (tokens, statuses, log-probs), and log the KV moved
#    (every prompt position but the last, 4096 bytes each: fp32 K and V of the policy's
#    4 layers x 4 kv heads x 32) and each pool's busy fraction;
#  * RL runs, split placement, 1 trainer rank: np 3 (1 prefill + 1 decode) and np 4
#    (1 prefill + 2 decode, also with one_step_off) generate the tokens of the plain runs
#    with the same trainer and log the same metrics (but the prefix-cache counters: other
#    engines compute the prompts);
#  * episodes (tests/fixtures/envs/probe_env.py: three turns each), np 4 with 1 trainer, 1
#    prefill and 2 decode engines, synchronous (each episode split in two contexts) and
#    one_step_off (two threads, the first resumed): the tokens and metrics of the plain
#    runs; the decode engines took in exactly the context openings' positions but their
#    last, and the KV moved covers them (each sequence of a step at least once, each opening
#    at most once);
#  * layouts and combinations it cannot run are refused with their keys.
# Usage: pd_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"

echo "== slimpi generate: plain np 1 vs prefill 1 of np 3 and 2 of np 4"
head -40 inputs/data/addition_eval.jsonl >"$out/prompts.jsonl"
gen() {  # NP NAME [--set ...]
  local np=$1 name=$2; shift 2
  $mpirun -np "$np" "$slimpi" generate inputs/generate_addition.toml --set model.init_from= \
    --set data.path="$out/prompts.jsonl" --set run.dir="$out/$name" --set rollout.max_running=16 \
    --set rollout.max_batch_tokens=128 "$@" >"$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
}
gen 1 plain
gen 3 pd_np3 --set rollout.prefill_ranks=1
gen 4 pd_np4 --set rollout.prefill_ranks=2
grep -q "generate: 2 prefill engine(s) sent" "$out/pd_np4.log" || { cat "$out/pd_np4.log"; exit 1; }
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
def load(name):
    with h5py.File(f"{out}/{name}/rollouts.h5") as f:
        g = f["samples"]
        return {k: g[k][:] for k in ["group_index", "index", "status", "response_length", "prompt_length"]} | {
            "tokens": g["tokens/values"][:], "offsets": g["tokens/offsets"][:], "logp": g["rollout_log_probs/values"][:]}
a = load("plain")
assert len(a["group_index"]) == 320
for name in ("pd_np3", "pd_np4"):
    b = load(name)
    for k in ["group_index", "index", "status", "response_length", "tokens", "offsets"]:
        assert np.array_equal(a[k], b[k]), (name, k)
    np.testing.assert_allclose(a["logp"], b["logp"], atol=1e-5)
    with h5py.File(f"{out}/{name}/metrics.h5") as f:
        m = {c: f["steps/" + c][0] for c in f["steps"].attrs["columns"].decode().split()}
    handed = int(a["prompt_length"][::8].astype(np.int64).sum() - 40)  # each prompt once, all but its last token
    assert m["perf/kv_transfer_tokens"] == handed, (name, m["perf/kv_transfer_tokens"], handed)
    assert 0 < m["rollout/pd_prefill_busy"] <= 1 and 0 < m["rollout/pd_decode_busy"] <= 1, m
    # the addition policy's K and V rows: 4 layers x 4 kv heads x 32 dims x 2 x fp32 = 4096 bytes a position
    assert m["perf/kv_transfer_bytes"] == 4096 * handed, m["perf/kv_transfer_bytes"]
    print(f"pd_runs: {name}: 320 samples equal to one plain engine's; {handed} positions, "
          f"{m['perf/kv_transfer_bytes'] / handed:.0f} bytes each; busy prefill {m['rollout/pd_prefill_busy']:.2f} "
          f"decode {m['rollout/pd_decode_busy']:.2f}")
PY

echo "== RL runs, 1 trainer rank: prefill engines vs plain engines"
args=(run inputs/smoke_rl.toml --set run.n_steps=3 --set parallel.trainer_ranks=1 --set model.init_std=0.2
      --set reward.style=command --set "reward.command=/usr/bin/python3 $root/tests/regression/ascii_reward.py")
run 3 plain3
run 3 pd3 --set rollout.prefill_ranks=1
run 4 plain4
run 4 pd4 --set rollout.prefill_ranks=1
run 4 plain4_off --set train.async=one_step_off
run 4 pd4_off --set rollout.prefill_ranks=1 --set train.async=one_step_off
# Prefix-cache hits depend on which engine computes which prompts (the prefill pool's, not
# the plain engines'), so these two counters differ by design.
same() {
  /usr/bin/python3 tests/regression/same_tokens.py \
    --except=rollout/prefill_tokens_computed,rollout/prefix_cache_hit_rate "$tag" "$out/$1" "$out/$2"
}
same plain3 pd3
same plain4 pd4
same plain4_off pd4_off
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
with h5py.File(f"{sys.argv[1]}/pd4/metrics.h5") as f:
    cols = f["steps"].attrs["columns"].decode().split()
    for c in ("perf/kv_transfer_bytes", "perf/kv_transfer_send_s", "rollout/pd_prefill_busy", "rollout/pd_decode_busy"):
        assert c in cols, c
    moved = f["steps/perf/kv_transfer_bytes"][:]
    moved = moved[~np.isnan(moved)]  # (the final evaluation's row has no rollout)
    assert len(moved) == 3 and (moved > 0).all(), moved
PY

echo "== refused"
# (one refusal as a job: every rank stops; the deck's through `slimpi check`, one process)
refused two_prefill_of_two "leaves no decode engine" 3 --set rollout.prefill_ranks=2
check_refuses colocated 'parallel.placement = "colocate"' 2 --set rollout.prefill_ranks=1 --set parallel.placement=colocate \
  --set parallel.trainer_ranks=0
check_refuses full_async 'train.async = "full"' 4 --set rollout.prefill_ranks=1 --set train.async=full
check_refuses tp_engines "with rollout.tensor_parallel = 2" 5 --set rollout.prefill_ranks=1 --set rollout.tensor_parallel=2
if $mpirun -np 1 "$slimpi" generate inputs/generate_addition.toml --set model.init_from= \
  --set data.path="$out/prompts.jsonl" --set run.dir="$out/gen1" --set rollout.prefill_ranks=1 >"$out/gen1.log" 2>&1; then
  echo "FAIL: generate with every rank prefilling ran"; exit 1
fi
grep -q "leaves no decode engine among the job's 1 ranks" "$out/gen1.log" || { cat "$out/gen1.log"; exit 1; }
echo "== episodes (tests/fixtures/envs/probe_env.py: three turns), 1 trainer rank: prefill engines vs plain engines"
probe="python3 $root/tests/fixtures/envs/probe_env.py"
args=(run inputs/smoke_rl.toml --set run.n_steps=2 --set parallel.trainer_ranks=1 --set model.max_seq_len=96
      --set rollout.environment=command --set reward.style=environment --set rollout.env_max_turns=3
      --set rollout.env_max_total_tokens=64 --set eval.path=)
# synchronous: a new context after turn 1 (two context openings an episode); one step off:
# two threads (turn 2 in a second context, turn 3 back in the first: a resumed thread's turn
# runs on its decode engine, whose prefix cache holds it)
run 4 env_plain4 --set "rollout.env_command=$probe --new-context-at 1"
run 4 env_pd4 --set "rollout.env_command=$probe --new-context-at 1" --set rollout.prefill_ranks=1
run 4 env_plain4_off --set "rollout.env_command=$probe --threads" --set train.async=one_step_off
run 4 env_pd4_off --set "rollout.env_command=$probe --threads" --set rollout.prefill_ranks=1 --set train.async=one_step_off
same env_plain4 env_pd4
same env_plain4_off env_pd4_off
PYTHONPATH="$root/tests/regression" /usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
from trajectory_views import prefill_bounds, rows
for name in ("env_pd4", "env_pd4_off"):
    with h5py.File(f"{sys.argv[1]}/{name}/metrics.h5") as f:
        moved, taken = f["steps/perf/kv_transfer_tokens"][:], f["steps/perf/kv_taken_tokens"][:]
    fewest, most = prefill_bounds(f"{sys.argv[1]}/{name}")
    turns = np.mean([r["env_turns"] for r in rows(f"{sys.argv[1]}/{name}")])
    # the decode engines took in every context opening of every episode drawn (rollouts.h5
    # holds them all), nothing else; a sequence already away on its decode engine (a group's
    # resets) was not sent again
    assert len(moved) == 2 and int(taken.sum()) == most, (name, taken, most)
    assert fewest <= int(moved.sum()) <= most, (name, moved, fewest, most)
    print(f"pd_runs: {name}: {int(moved.sum())} positions of context openings prefilled ({fewest} distinct, "
          f"{most} without sharing); the episodes ({turns:.2f} turns each) as the plain engines ran them")
PY

echo "pd_runs: ok"
