#!/usr/bin/env bash
# One job across two "nodes": two network namespaces on this machine joined by a veth
# pair, each with a hostname of its own (a UTS namespace), Open MPI's launcher entering
# them (plm_rsh_agent: a script that runs `ip netns exec`), TCP between the nodes and
# shared memory within each. So that nothing assumes one host (local ranks, device
# choice, the run-dir lock, paths, hostnames in checkpoints):
#  * colocated TP 2 x DP 2 with the tensor groups inside a node and data parallelism
#    across the two, in job steps 2 + 1 (a checkpoint written, the next job resuming it),
#    generates the tokens and logs the metrics of the same run on one host;
#  * split placement with the trainer's tensor group on one node and a tensor-parallel
#    engine (rollout.tensor_parallel = 2) on the other: the sliced weight sync crosses
#    the veth pair; the same tokens as on one host;
#  * the rank table names both hosts.
# Needs root (ip netns, veth); exits 77 (skipped) where network namespaces cannot be made.
# Usage: two_nodes.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
ns_a=slimpi_a_$$ ns_b=slimpi_b_$$ net=10.231.$(( $$ % 250 )).
cleanup() {
  pkill -9 -f "$out" 2>/dev/null || true
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT
if ! ip netns add "$ns_a" 2>/dev/null; then
  echo "two_nodes: cannot make network namespaces here (not root, or no ip netns): skipped"
  exit 77
fi
ip netns add "$ns_b"
ip link add "va$$" type veth peer name "vb$$"
ip link set "va$$" netns "$ns_a"
ip link set "vb$$" netns "$ns_b"
ip -n "$ns_a" addr add "${net}1/24" dev "va$$"
ip -n "$ns_b" addr add "${net}2/24" dev "vb$$"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "va$$" up
ip -n "$ns_b" link set "vb$$" up

# The launcher's remote shell: host (an address) -> its namespace and hostname.
cat >"$out/agent.sh" <<EOF
#!/bin/bash
host=\$1; shift
case "\$host" in
  ${net}1) ns=$ns_a; name=node-a ;;
  ${net}2) ns=$ns_b; name=node-b ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c "hostname \$name; \$*"
EOF
chmod +x "$out/agent.sh"
base=(run inputs/smoke_rl.toml --set run.n_steps=3 --set eval.path= --set model.qk_norm=true --set model.init_std=0.2
      --set train.global_batch_size=32 --set reward.style=command
      --set "reward.command=/usr/bin/python3 $root/tests/regression/ascii_reward.py")
# Two ranks a node; mpirun itself on node a (it launches its own node's ranks directly).
two_nodes() {  # two_nodes NAME [--set ...]: one job step over the two nodes
  local name=$1; shift
  timeout 240 ip netns exec "$ns_a" unshare --uts /bin/sh -c "hostname node-a; exec mpirun --allow-run-as-root \
    --host ${net}1:2,${net}2:2 -np 4 --bind-to none --mca plm_rsh_agent $out/agent.sh --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include ${net}0/24 --mca btl tcp,vader,self --mca btl_tcp_if_include ${net}0/24 \
    -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=PASSIVE \"\$0\" \"\$@\"" \
    "$slimpi" "${base[@]}" --set run.dir="$out/$name" "$@" >>"$out/$name.log" 2>&1 \
    || { cat "$out/$name.log"; echo "FAIL: $name"; exit 1; }
}
one_host() {  # one_host NAME [--set ...]
  local name=$1; shift
  $mpirun -np 4 "$slimpi" "${base[@]}" --set run.dir="$out/$name" "$@" >"$out/$name.log" 2>&1 \
    || { cat "$out/$name.log"; echo "FAIL: $name"; exit 1; }
}
echo "== colocated TP 2 x DP 2: tensor groups inside a node, data parallel across; job steps 2 + 1"
co=(--set parallel.placement=colocate --set parallel.tensor_parallel=2)
two_nodes co_2nodes "${co[@]}" --set run.job_steps=2
two_nodes co_2nodes "${co[@]}"
grep -q "resuming at step 2 from $out/co_2nodes/ckpt/step_00000002" "$out/co_2nodes.log"
for host in node-a node-b; do
  grep -Eq "^ +[0-9]+  $host +trainer\+rollout" "$out/co_2nodes.log" || { cat "$out/co_2nodes.log"; exit 1; }
done
one_host co_1host "${co[@]}"
close co_1host co_2nodes

echo "== split: trainer TP 2 on node a, an engine of 2 ranks on node b (the sliced weight sync crosses the nodes)"
sp=(--set parallel.tensor_parallel=2 --set rollout.tensor_parallel=2 --set rollout.check_weight_update=true
    --set run.n_steps=2)
two_nodes split_2nodes "${sp[@]}"
grep -q "weight sync: sliced" "$out/split_2nodes.log"
one_host split_1host "${sp[@]}"
close split_1host split_2nodes
echo "two_nodes: OK"
