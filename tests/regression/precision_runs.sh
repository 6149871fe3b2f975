#!/usr/bin/env bash
# bf16 end to end: train.precision / rollout.precision on a task a policy learns from
# scratch in 40 steps (tests/regression/digit_reward.py: the share of 7s in the
# response). At np 2 colocated (bf16/bf16) and np 4 split (bf16/bf16, bf16/fp32,
# fp32/fp32): the reward rises; a bf16 engine computes what bf16 training computes
# (train/rollout log-prob mismatch ~0) while an fp32 engine beside bf16 training shows
# a real mismatch; the bf16 weight sync moves half the bytes of the fp32 one. Delta sync
# (rollout.weight_sync = "delta", anchors every 5) gives the bf16 split run bit for bit
# (every rollout token and log-prob); at this learning rate most elements change, so its
# buckets go whole (at most a header more than a full sync); a job step resumed from a
# checkpoint starts with an anchor. FP8 rollout (rollout.precision = "fp8", bf16 training):
# the reward rises, the mismatch is larger than bf16's and visible, the sync moves the
# bytes the fp8 image holds (e4m3 projections + fp32 block scales + bf16 rest), delta
# sync over fp8 gives the same rollouts bit for bit, and a resumed job equals a straight
# one (its engine's first weights through FP8 from the checkpoint's masters); with an
# e4m3 KV cache too (rollout.kv_cache_dtype = "fp8_e4m3") the reward still rises.
# Usage: precision_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"

run() {  # name np placement train_precision rollout_precision [--set ...]
  local name=$1 np=$2 placement=$3 tp=$4 rp=$5; shift 5
  $mpirun -np "$np" "$slimpi" run inputs/smoke_rl.toml --set run.dir="$out/$name" --set parallel.placement="$placement" \
    --set train.precision="$tp" --set rollout.precision="$rp" --set run.n_steps=40 --set eval.interval=0 \
    --set reward.style=command --set "reward.command=/usr/bin/python3 $root/tests/regression/digit_reward.py" \
    --set train.lr=3e-3 --set rollout.rollout_batch_size=16 --set rollout.n_samples_per_prompt=8 \
    --set train.global_batch_size=128 "$@" >"$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
}
run colo_bf16 2 colocate bf16 bf16
run split_bf16 4 split bf16 bf16
run split_mixed 4 split bf16 fp32
run split_fp32 4 split fp32 fp32
run split_bf16_delta 4 split bf16 bf16 --set rollout.weight_sync=delta --set rollout.delta_anchor_interval=5
delta_resume=(--set rollout.weight_sync=delta --set rollout.delta_anchor_interval=5 --set run.n_steps=6 --set run.job_steps=3)
run delta_resume 2 split bf16 bf16 "${delta_resume[@]}"
run delta_resume 2 split bf16 bf16 "${delta_resume[@]}"
run split_fp8 4 split bf16 fp8
run split_fp8_delta 4 split bf16 fp8 --set rollout.weight_sync=delta --set run.n_steps=10
run split_fp8_kv 4 split bf16 fp8 --set rollout.kv_cache_dtype=fp8_e4m3
run fp8_straight 2 split bf16 fp8 --set run.n_steps=6
run fp8_resume 2 split bf16 fp8 --set run.n_steps=6 --set run.job_steps=3
run fp8_resume 2 split bf16 fp8 --set run.n_steps=6 --set run.job_steps=3
/usr/bin/python3 "$root/tests/regression/compare_runs.py" "$out/fp8_straight" "$out/fp8_resume"

/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
def steps(name):
    f = h5py.File(f"{out}/{name}/metrics.h5")
    s = f["steps"]
    n = 40
    return {k: s[k][:n] for k in ("rollout/raw_reward", "train/train_rollout_logprob_abs_diff")} | (
        {"bytes": s["perf/weight_sync_bytes"][:n]} if "weight_sync_bytes" in s["perf"] else {})
runs = {name: steps(name) for name in ("colo_bf16", "split_bf16", "split_mixed", "split_fp32", "split_fp8",
                                     "split_fp8_kv")}
for name, m in runs.items():
    r = m["rollout/raw_reward"]
    first, last = r[:5].mean(), r[-5:].mean()
    mismatch = np.nanmax(m["train/train_rollout_logprob_abs_diff"])
    print(f"{name}: reward {first:.4f} -> {last:.4f}, max train/rollout log-prob |diff| {mismatch:.3g}")
    assert last > 0.1 and last > 5 * first, f"{name}: the reward did not rise"
for name in ("colo_bf16", "split_bf16", "split_fp32"):
    assert np.nanmax(runs[name]["train/train_rollout_logprob_abs_diff"]) < 1e-6, f"{name}: engine and trainer differ"
assert np.nanmin(runs["split_mixed"]["train/train_rollout_logprob_abs_diff"]) > 1e-5, "bf16 vs fp32 left no trace"
b16, b32 = runs["split_bf16"]["bytes"][0], runs["split_fp32"]["bytes"][0]
print(f"weight sync bytes: bf16 {b16:.0f}, fp32 {b32:.0f}")
assert b16 * 2 == b32, "the bf16 sync does not send half the bytes"
# Delta sync: the same rollouts bit for bit; anchors at syncs 0, 5, 10, ...; fewer bytes.
with h5py.File(f"{out}/split_bf16/rollouts.h5") as a, h5py.File(f"{out}/split_bf16_delta/rollouts.h5") as b:
    for k in ("tokens/values", "rollout_log_probs/values", "weight_versions/values"):
        assert np.array_equal(a["samples/" + k][:], b["samples/" + k][:]), f"delta sync changed {k}"
with h5py.File(f"{out}/split_bf16_delta/metrics.h5") as f:
    s = f["steps"]
    anchor, density, nbytes = s["perf/weight_sync_anchor"][:40], s["perf/weight_sync_density"][:40], s["perf/weight_sync_bytes"][:40]
    assert np.array_equal(anchor, (np.arange(40) % 5 == 0).astype(float)), anchor
    assert np.all(density[anchor == 0] < 1) and np.all(s["perf/weight_sync_resent"][:40] == 0)
    # At this learning rate (3e-3) most bf16 elements change every step: each bucket goes raw
    # (its bytes and a 24-byte header); the sparse form's savings are test_rollout_mpi's.
    assert np.all(nbytes[anchor == 1] == b16) and np.all(nbytes[anchor == 0] <= b16 + 24), nbytes
with h5py.File(f"{out}/delta_resume/metrics.h5") as f:  # a resumed job's first sync is an anchor
    resumed = f["steps/perf/weight_sync_anchor"][:6]
    assert np.array_equal(resumed, [1, 0, 0, 1, 0, 0]), resumed
print(f"delta sync: the same rollouts; deltas {np.median(nbytes[anchor == 0]):.0f} bytes (median) against "
      f"{b16:.0f} whole, density {np.median(density[anchor == 0]):.3f} (median)")
# FP8: a mismatch larger than bf16's, and the fp8 image's bytes: for smoke_rl's model (vocabulary 260,
# d 32, 2 layers, 4 heads over 2 kv heads, MLP 64, untied) the projections are 2 x (32*32*2 + 2*16*32 + 3*32*64)
# = 18432 e4m3 bytes with one block scale each (14 x 4 bytes), the embedding, head and norms 2*260*32 + 5*32
# = 16800 bf16 elements.
fp8 = runs["split_fp8"]
fp8_mismatch = np.nanmean(fp8["train/train_rollout_logprob_abs_diff"])
bf16_mismatch = np.nanmean(runs["split_bf16"]["train/train_rollout_logprob_abs_diff"])
print(f"fp8: mean train/rollout log-prob |diff| {fp8_mismatch:.3g} (bf16 {bf16_mismatch:.3g}); sync bytes "
      f"{fp8['bytes'][0]:.0f} (bf16 {b16:.0f}, {fp8['bytes'][0] / b16:.3f}x)")
assert fp8_mismatch > 1e-4, "FP8 left no trace"  # bf16 engines beside bf16 training: ~5e-8
assert fp8["bytes"][0] == 18432 + 14 * 4 + 2 * 16800, fp8["bytes"][0]
with h5py.File(f"{out}/split_fp8/rollouts.h5") as a, h5py.File(f"{out}/split_fp8_delta/rollouts.h5") as b:
    n = len(b["samples/tokens/offsets"]) - 1
    for k in ("tokens/offsets", "rollout_log_probs/offsets"):
        assert np.array_equal(a["samples/" + k][:n + 1], b["samples/" + k][:]), f"fp8 delta sync changed {k}"
    for k in ("tokens/values", "rollout_log_probs/values"):
        m = b["samples/" + k].shape[0]
        assert np.array_equal(a["samples/" + k][:m], b["samples/" + k][:]), f"fp8 delta sync changed {k}"
print("precision_runs: ok")
PY
