#!/usr/bin/env bash
# The agent endpoint's cost (docs/agents.md): the same episodes through the OpenAI endpoint
# (perf/agents/turns_agent.py: one agent process per episode, urllib, three requests) and
# through the JSON-lines environment protocol (perf/agents/turns_env.py: one process per
# rollout rank serving every episode). `slimpi generate` of the smoke model at np 2, P
# prompts x 4 samples, 3 turns of T tokens: the two runs give the same tokens (checked), so
# the ratio of their wall times is the endpoint's overhead, process starts included.
# Timed by farm-bench (paired, alternating); tokens/s from each run's metrics. With WIDTH and
# LAYERS the model is that wide and deep instead (random weights, 4 heads, an MLP 8/3 as
# wide, a KV cache of 65536 tokens that holds every episode): a policy whose episodes take longer to generate, against the same agent costs.
# With SPAWN=1 the environment also starts one `turns_agent.py --start-only` per episode (the
# agent's interpreter and imports, then exit), so both sides pay an agent process start per
# episode and the ratio is the protocol's: HTTP, the client's and the endpoint's JSON.
# Usage: [PAIRS=5] [SPAWN=1] perf/agent_overhead.sh [T [P [WIDTH LAYERS]]]   (defaults: 32 tokens per turn, 64 prompts, the smoke model; 5 timed pairs)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
t=${1:-32}
p=${2:-64}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags="--oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
common="--set model.max_seq_len=256 --set rollout.n_samples_per_prompt=4 --set rollout.block_size=16"
common="$common --set data.path=inputs/data/addition_eval.jsonl@[0:$p] --set reward.style=environment"
common="$common --set rollout.max_new_tokens=$t --set rollout.stop_strings=[] --set rollout.env_max_turns=3"
common="$common --set rollout.env_max_total_tokens=200"
if [ $# -ge 4 ]; then
  common="$common --set model.hidden_size=$3 --set model.n_layers=$4 --set model.n_heads=4 --set model.n_kv_heads=4"
  common="$common --set model.intermediate_size=$(( $3 * 8 / 3 )) --set rollout.kv_cache_tokens=65536"
fi
gen() {  # gen DIR ARGS...: the command line of one `slimpi generate`
  echo "mpirun $flags -np 2 -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=PASSIVE build/slimpi generate inputs/smoke_rl.toml $common --set run.dir=$1 ${*:2}"
}
agent=$(gen "$out/agent" --set rollout.environment=agent \
  "--set rollout.agent_command=/usr/bin/python3\\ $root/perf/agents/turns_agent.py")
spawn=""
[ "${SPAWN:-0}" = 1 ] && spawn="\\ --spawn-per-episode"
env=$(gen "$out/env" --set rollout.environment=command "--set rollout.env_command=/usr/bin/python3\\ $root/perf/agents/turns_env.py$spawn")
# one run of each to check that they give the same episodes
sh -c "$agent" >"$out/agent.log" 2>&1 || { cat "$out/agent.log"; exit 1; }
sh -c "$env" >"$out/env.log" 2>&1 || { cat "$out/env.log"; exit 1; }
/usr/bin/python3 - "$out" <<'PY'
import sys
import h5py
out = sys.argv[1]
rows = {}
for name in ("agent", "env"):
    with h5py.File(f"{out}/{name}/rollouts.h5") as f:
        g = f["samples"]
        o = g["tokens/offsets"][:]
        v = g["tokens/values"][:]
        rows[name] = {(int(g["group_index"][i]), int(g["index"][i])): v[o[i]:o[i + 1]].tolist() for i in range(len(o) - 1)}
        m = g["loss_mask/values"][:]
        rows[name + "_model"] = int(m.sum())
assert rows["agent"] == rows["env"], "the agent's episodes differ from the environment's"
print(f"same episodes: {len(rows['agent'])} trajectories, {rows['agent_model']} model tokens")
PY
farm-bench -n "${PAIRS:-5}" --timeout 1800 --vs "sh -c '$env >/dev/null 2>&1'" -- sh -c "$agent >/dev/null 2>&1" 2>&1 | tail -14
