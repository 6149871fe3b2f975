#!/usr/bin/env bash
# A bad deck stops every rank cleanly: non-zero exit, the message printed once (by
# rank 0), no hang, no MPI_Abort. Usage: bad_deck.sh SLIMPI ROOT "MPIRUN FLAGS"
set -uo pipefail
slimpi=$1; root=$2; mpirun=$3
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT

expect_clean_failure() {  # NP LOG PATTERN ARGS...
  local np=$1 log=$2 pattern=$3; shift 3
  timeout 120 $mpirun -np "$np" "$slimpi" "$@" >"$log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then echo "expected a clean failure, got rc=$rc"; cat "$log"; exit 1; fi
  if [ "$(grep -c -- "$pattern" "$log")" != 1 ]; then echo "expected '$pattern' exactly once:"; cat "$log"; exit 1; fi
  if grep -q "MPI_ABORT" "$log"; then echo "a deck error must not abort:"; cat "$log"; exit 1; fi
}

printf '[run]\nn_stepz = 3\n[parallel]\nplacement = "split"\ntimeout_s = "soon"\n' >"$out/bad.toml"
expect_clean_failure 4 "$out/a.log" "did you mean run.n_steps?" run "$out/bad.toml"
grep -q "bad.toml:5: key 'parallel.timeout_s' must be a float, got string \"soon\"" "$out/a.log" \
  || { cat "$out/a.log"; exit 1; }

printf '[run]\nn_steps = 1\n' >"$out/ok.toml"
expect_clean_failure 1 "$out/b.log" "needs at least 2 ranks" run "$out/ok.toml"
expect_clean_failure 4 "$out/c.log" "parallel.trainer_ranks = 3 (--set)" run "$out/ok.toml" \
  --set parallel.trainer_ranks=3 --set parallel.rollout_ranks=3
expect_clean_failure 2 "$out/d.log" "cannot open deck file" run "$out/missing.toml"
expect_clean_failure 2 "$out/e.log" "run.device = \"cuda\" but" run "$out/ok.toml" --set run.device=cuda
expect_clean_failure 2 "$out/f.log" "no deck key starts with 'zzz'" keys zzz
# SFT: no data file named; a malformed dataset line (named by file:line and key).
printf '[parallel]\nplacement = "colocate"\n[train]\nmode = "sft"\n' >"$out/sft.toml"
expect_clean_failure 2 "$out/g.log" "needs a data file: set data.path" run "$out/sft.toml"
printf '{"prompt": "1+1=", "response": "2"}\n{"prompt": "2+2="}\n' >"$out/bad.jsonl"
expect_clean_failure 2 "$out/h.log" "bad.jsonl:2: missing key 'response'" run "$out/sft.toml" --set data.path="$out/bad.jsonl"
expect_clean_failure 4 "$out/h2.log" "bad.jsonl:2: missing key 'response'" run "$out/sft.toml" \
  --set data.path="$out/bad.jsonl" --set parallel.placement=split
expect_clean_failure 2 "$out/i.log" "model.n_heads = 4 must be a multiple of model.n_kv_heads = 3" run "$out/sft.toml" \
  --set data.path="$out/bad.jsonl" --set model.n_kv_heads=3
# slime's rules on the KL and the reinforce_plus_plus estimators, AdamW's ranges:
# each names the keys and where they were set.
cd "$root"
rl="inputs/smoke_rl.toml --set run.dir=$out/rules"
expect_clean_failure 4 "$out/k1.log" "train.kl_coef = 0.05 (--set) and train.kl_loss_coef = 0.1 (--set) are both non-zero" \
  run $rl --set train.advantage_estimator=reinforce_plus_plus --set train.normalize_advantages=true \
  --set train.kl_coef=0.05 --set train.use_kl_loss=true --set train.kl_loss_coef=0.1
expect_clean_failure 4 "$out/k2.log" "needs train.normalize_advantages = true, as in slime; it is false (default)" \
  run $rl --set train.advantage_estimator=reinforce_plus_plus_baseline
expect_clean_failure 4 "$out/k3.log" "train.kl_coef = 0.05 (--set) acts only on the reinforce_plus_plus and ppo estimators" \
  run $rl --set train.kl_coef=0.05
expect_clean_failure 4 "$out/k4.log" "train.kl_loss_coef = 0.1 (--set) would be ignored: train.use_kl_loss = false" \
  run $rl --set train.kl_loss_coef=0.1
expect_clean_failure 4 "$out/k5.log" "train.adam_beta1 = 1 (--set) and train.adam_beta2 = 0.999 (default) must each be in .0, 1)" \
  run $rl --set train.adam_beta1=1.0
expect_clean_failure 4 "$out/k6.log" "train.adam_eps = 0 (--set) must be > 0" run $rl --set train.adam_eps=0.0
expect_clean_failure 4 "$out/m1.log" 'train.mis_mode (--set) configures train.tis_function = "mis", but it is "vanilla"' \
  run $rl --set train.use_tis=true --set train.mis_mode=mask
expect_clean_failure 4 "$out/m2.log" "train.tis_function (--set) is the correction of train.use_tis, which is false" \
  run $rl --set train.tis_function=icepop
expect_clean_failure 4 "$out/m3.log" 'train.mis_level = "geometric" (--set) has no such mean in slime' \
  run $rl --set train.use_tis=true --set train.tis_function=mis --set train.mis_level=geometric \
  --set train.mis_batch_normalize=true
expect_clean_failure 4 "$out/m4.log" "train.mis_rs_veto (--set) configures rejection sampling, but train.mis_rs = false" \
  run $rl --set train.use_tis=true --set train.tis_function=mis --set train.mis_rs_veto=0.001
expect_clean_failure 4 "$out/kv1.log" "rollout.kv_cache_memory_gb = 0.001 (--set) and rollout.kv_cache_tokens = 4096 (inputs/smoke_rl.toml:33) both size the KV cache" \
  run $rl --set rollout.kv_cache_memory_gb=0.001
# The KV cache sized in memory: the tokens it holds, from the model's shape (smoke: 2
# layers x 2 kv heads x head dim 8 x K and V x fp32 = 256 bytes a token).
grep -v "^kv_cache_tokens" inputs/smoke_rl.toml >"$out/no_kv_tokens.toml"
"$slimpi" check "$out/no_kv_tokens.toml" --np 4 --set rollout.kv_cache_memory_gb=0.001 >"$out/kv2.log" 2>&1 \
  || { cat "$out/kv2.log"; exit 1; }
grep -q "rollout.kv_cache_memory_gb = 0.001: 4192 tokens per engine (256 bytes a token" "$out/kv2.log" \
  || { cat "$out/kv2.log"; exit 1; }
# An e4m3 cache: a quarter of fp32's bytes a token, twice bf16's tokens.
"$slimpi" check "$out/no_kv_tokens.toml" --np 4 --set rollout.kv_cache_memory_gb=0.001 \
  --set rollout.kv_cache_dtype=fp8_e4m3 >"$out/kv4.log" 2>&1 || { cat "$out/kv4.log"; exit 1; }
grep -q "rollout.kv_cache_memory_gb = 0.001: 16776 tokens per engine (64 bytes a token" "$out/kv4.log" \
  || { cat "$out/kv4.log"; exit 1; }
"$slimpi" check "$out/no_kv_tokens.toml" --np 4 --set rollout.kv_cache_memory_gb=0.001 \
  --set rollout.kv_cache_dtype=bf16 >"$out/kv5.log" 2>&1 || { cat "$out/kv5.log"; exit 1; }
grep -q "rollout.kv_cache_memory_gb = 0.001: 8388 tokens per engine (128 bytes a token" "$out/kv5.log" \
  || { cat "$out/kv5.log"; exit 1; }
expect_clean_failure 4 "$out/kv3.log" "rollout.kv_cache_tokens = 4 (default; from rollout.kv_cache_memory_gb) holds 1 blocks" \
  run "$out/no_kv_tokens.toml" --set run.dir="$out/rules" --set rollout.kv_cache_memory_gb=0.000001
"$slimpi" keys train.kl_loss_type | grep -q 'default "k1"' || { "$slimpi" keys train.kl_loss_type; exit 1; }
# ReMax's greedy baselines are not made by the streaming rollout of full async.
expect_clean_failure 4 "$out/remax.log" "the greedy baseline responses are not generated by the streaming rollout" \
  run inputs/smoke_rl.toml --set train.advantage_estimator=remax --set train.async=full
expect_clean_failure 4 "$out/remax2.log" "the greedy response's reward is the estimator's baseline" \
  run inputs/smoke_rl.toml --set train.advantage_estimator=remax --set train.disable_rewards_normalization=true
# Delta weight sync: its key without it.
expect_clean_failure 2 "$out/delta1.log" 'rollout.delta_anchor_interval (--set) applies to rollout.weight_sync = "delta" only' \
  run inputs/smoke_rl.toml --set rollout.delta_anchor_interval=3
echo "bad_deck: ok"
