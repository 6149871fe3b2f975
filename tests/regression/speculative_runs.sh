#!/usr/bin/env bash
# Multi-token prediction and speculative decoding end to end, on the smoke policy with
# one MTP depth (model.mtp_num_layers = 1, trained beside it: train.mtp_loss_coef 0.2):
#  * np 2 split with rollout.speculative = "mtp": the MTP loss and the draft's acceptance
#    are logged every step, rollouts.h5 holds each sample's drafted / accepted / verify
#    passes, and the greedy evaluation (eval/pass@1) equals the run without speculation
#    (greedy speculative decoding is greedy decoding);
#  * the run is reproducible (the counter-based draws), and job steps 2 + 2 equal the
#    straight 4 bit for bit (drafts leave no state across a checkpoint);
#  * a bf16 engine and fully asynchronous RL (partial rollouts) run with speculation;
#  * `slimpi generate` with speculation reports the acceptance;
#  * impossible combinations are refused with their keys.
# Usage: speculative_runs.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
args=(run inputs/smoke_rl.toml --set run.n_steps=4 --set model.mtp_num_layers=1 --set rollout.max_new_tokens=12
      --set rollout.temperature=1.0 --set model.max_seq_len=48 --set eval.interval=2)
spec=(--set rollout.speculative=mtp --set rollout.spec_num_steps=3)

run 2 plain
run 2 spec "${spec[@]}"
run 2 spec_again "${spec[@]}"
/usr/bin/python3 tests/regression/compare_runs.py "$out/spec" "$out/spec_again"
run 2 spec_chunked "${spec[@]}" --set run.job_steps=2
run 2 spec_chunked "${spec[@]}" --set run.job_steps=2
/usr/bin/python3 tests/regression/compare_runs.py "$out/spec" "$out/spec_chunked"
grep -q "speculative decoding: chains of 3 tokens drafted by the policy's first MTP depth" "$out/spec.log"

/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
with h5py.File(f"{out}/spec/metrics.h5") as f, h5py.File(f"{out}/plain/metrics.h5") as g:
    s, p = f["steps"], g["steps"]
    for k in ["rollout/spec_accept_rate", "rollout/spec_accept_length", "rollout/spec_accept_rate_step1",
              "train/mtp_loss", "train/mtp_1_loss", "train/mtp_grad_norm"]:
        assert k in s, k
    steps = s["step"][:] < 4  # the last row is the final evaluation's
    rate = s["rollout/spec_accept_rate"][:][steps]
    assert np.all((rate >= 0) & (rate <= 1)), rate
    length = s["rollout/spec_accept_length"][:][steps]
    assert np.all(length >= 1), length
    assert "rollout/spec_accept_rate" not in p  # no speculation, no acceptance
    # greedy evaluation: the same with and without speculation (steps 0, 2, 4)
    a, b = s["eval/pass@1"][:], p["eval/pass@1"][:]
    assert np.array_equal(a, b, equal_nan=True), (a, b)
with h5py.File(f"{out}/spec/rollouts.h5") as f:
    smp = f["samples"]
    drafted, accepted, passes = smp["spec_drafted"][:], smp["spec_accepted"][:], smp["spec_verify_passes"][:]
    assert drafted.sum() > 0 and 0 <= accepted.sum() <= drafted.sum() and passes.sum() > 0, (drafted.sum(), accepted.sum())
    assert np.all(accepted <= drafted) and np.all(drafted <= 3 * passes)
print(f"speculative_runs: {drafted.sum()} drafted, {accepted.sum()} accepted in {passes.sum()} verify passes; "
      f"eval/pass@1 equal with and without speculation")
PY

# A bf16 engine, and fully asynchronous RL (partial rollouts carried across weight
# updates, their drafts dropped and the draft's cache rebuilt where they resume), speculating.
run 2 spec_bf16 "${spec[@]}" --set rollout.precision=bf16
steps_done "$out/spec_bf16" 4
run 2 spec_async "${spec[@]}" --set train.async=full --set rollout.partial=continue
steps_done "$out/spec_async" 4

head -8 inputs/data/addition_eval.jsonl >"$out/prompts.jsonl"
$mpirun -np 1 "$slimpi" generate inputs/smoke_rl.toml --set model.mtp_num_layers=1 --set rollout.speculative=mtp \
  --set data.path="$out/prompts.jsonl" --set run.dir="$out/gen" >"$out/gen.log" 2>&1 || { cat "$out/gen.log"; exit 1; }
/usr/bin/python3 - "$out/gen/metrics.h5" <<'PY'
import sys
import h5py
with h5py.File(sys.argv[1]) as f:
    assert "rollout/spec_accept_rate" in f["steps"], list(f["steps"])
PY

echo "== refusals"
# (one refusal as a job: every rank stops; the deck's through `slimpi check`, one process)
refused no_mtp "rollout.speculative = \"mtp\" (--set) drafts with the policy's multi-token-prediction layers, but model.mtp_num_layers = 0" \
  2 --set rollout.speculative=mtp --set model.mtp_num_layers=0
check_refuses mtp_coef_without_layers "train.mtp_loss_coef (--set) trains multi-token-prediction layers, but model.mtp_num_layers = 0" \
  2 --set train.mtp_loss_coef=0.5 --set model.mtp_num_layers=0
check_refuses top_k_without_distill "train.mtp_distill_top_k (--set) applies to train.mtp_loss = \"distill\" only" \
  2 --set train.mtp_distill_top_k=4
check_refuses draft_tokens "rollout.spec_num_draft_tokens = 5 (--set) must be rollout.spec_num_steps + 1 = 4" \
  2 "${spec[@]}" --set rollout.spec_num_draft_tokens=5
check_refuses tp_engine "speculative decoding in tensor-parallel engines is not implemented" \
  4 "${spec[@]}" --set rollout.tensor_parallel=2 --set parallel.trainer_ranks=2
echo "speculative_runs: OK"
