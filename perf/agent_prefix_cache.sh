#!/usr/bin/env bash
# How much of an agent session's prefill the engine's prefix cache saves (docs/agents.md):
# `slimpi generate` of the smoke model at np 2, P prompts x 4 samples, agents over the
# OpenAI endpoint (perf/agents/turns_agent.py: 3 requests of T-token turns; with
# --sub-agent a sub-agent's two requests come between the parent's first two, so the
# parent's return resumes its thread in a new context). Each case runs with
# rollout.prefix_cache on (slimpi's sessions are affine: every request of a session goes
# to the engine that holds its conversation) and off (every turn computes its whole
# context again: what a request routed to an engine that never saw its session costs).
# Prints the prefill tokens each computed (the engine's count, summed over the engines)
# and the share the cache saved. The KV cache holds every episode at once (no eviction).
# Usage: perf/agent_prefix_cache.sh [T [P]]   (defaults: 32 tokens per turn, 64 prompts)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
t=${1:-32}
p=${2:-64}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags="--oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
for agent in plain sub-agent; do
  for cache in true false; do
    args=()
    [ $agent = sub-agent ] && args=(--sub-agent)
    start=$(date +%s.%N)
    mpirun $flags -np 2 -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=PASSIVE build/slimpi generate inputs/smoke_rl.toml \
      --set model.max_seq_len=512 --set rollout.n_samples_per_prompt=4 --set rollout.block_size=16 \
      --set rollout.kv_cache_tokens=262144 --set "data.path=inputs/data/addition_eval.jsonl@[0:$p]" \
      --set reward.style=environment --set rollout.max_new_tokens="$t" --set rollout.stop_strings=[] \
      --set rollout.env_max_turns=8 --set rollout.env_max_total_tokens=480 --set rollout.environment=agent \
      --set "rollout.agent_command=/usr/bin/python3 $root/perf/agents/turns_agent.py ${args[*]}" \
      --set rollout.prefix_cache=$cache --set run.dir="$out/$agent-$cache" >"$out/$agent-$cache.log" 2>&1 ||
      { cat "$out/$agent-$cache.log"; exit 1; }
    wall=$(echo "$(date +%s.%N) - $start" | bc)
    /usr/bin/python3 - "$out/$agent-$cache" "$agent" "$cache" "$wall" <<'PY'
import sys
import h5py
run, agent, cache, wall = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
with h5py.File(f"{run}/metrics.h5") as f:
    computed = int(f["steps/rollout/prefill_tokens_computed"][0])
with h5py.File(f"{run}/rollouts.h5") as f:
    g = f["samples"]
    ok = int((g["status"][:] == 1).sum())
    n = g["status"].shape[0]
    contexts = sum(int(g["context_starts/offsets"][i + 1] - g["context_starts/offsets"][i]) + 1 for i in range(n))
print(f"{agent:9s} prefix_cache={cache:5s}  {ok}/{n} episodes completed, {contexts} contexts kept, "
      f"prefill computed {computed} tokens, {wall:.1f} s")
PY
  done
done
