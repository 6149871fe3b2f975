#!/usr/bin/env bash
# A private single-node Slurm for tests (Debian's munge + slurm-wlm, as root, no
# systemd): `source local_slurm.sh DIR` starts munged, slurmctld and slurmd with their
# config, sockets, state and logs under DIR, exports SLURM_CONF, and defines
# stop_local_slurm, which stops exactly the daemons it started (by PID).
# The node is this host with CPUs=$(nproc --all) (plain nproc obeys OMP_NUM_THREADS); ports from the shell's PID unless SLURM_TEST_PORT.
set -euo pipefail
slurm_dir=${1:?usage: source local_slurm.sh DIR}
mkdir -p "$slurm_dir"/{state,spool,munge}
chmod 700 "$slurm_dir/munge"
host=$(hostname -s)
port=${SLURM_TEST_PORT:-$((20000 + ($$ % 20000) * 2))}  # per test: no clash with leftovers

dd if=/dev/urandom of="$slurm_dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$slurm_dir/munge/munge.key"
munged --force --key-file="$slurm_dir/munge/munge.key" --socket="$slurm_dir/munge/munge.sock" \
  --pid-file="$slurm_dir/munge/munged.pid" --log-file="$slurm_dir/munge/munged.log" \
  --seed-file="$slurm_dir/munge/munged.seed"

cat >"$slurm_dir/slurm.conf" <<CONF
ClusterName=slimpitest
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$slurm_dir/munge/munge.sock,cred_expire=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$slurm_dir/state
SlurmdSpoolDir=$slurm_dir/spool
SlurmctldPidFile=$slurm_dir/slurmctld.pid
SlurmdPidFile=$slurm_dir/slurmd.pid
SlurmctldLogFile=$slurm_dir/slurmctld.log
SlurmdLogFile=$slurm_dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
MpiDefault=none
ReturnToService=2
KillWait=10
MinJobAge=300
NodeName=$host CPUs=$(nproc --all) State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF=$slurm_dir/slurm.conf
slurmctld -i -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N "$host"
for _ in $(seq 100); do
  sinfo -h -o %T 2>/dev/null | grep -qE "^idle" && break
  sleep 0.2
done
sinfo -h -o "%P %T %D %c" | grep -q idle || { cat "$slurm_dir"/*.log; echo "local_slurm: the node never became idle"; return 1; }
echo "local_slurm: slurmctld $(cat "$slurm_dir/slurmctld.pid"), slurmd $(cat "$slurm_dir/slurmd.pid"), munged $(cat "$slurm_dir/munge/munged.pid") (SLURM_CONF=$SLURM_CONF)"

stop_local_slurm() {
  local f pid
  # Jobs first: their slurmstepd processes outlive slurmd.
  scancel --quiet --full --user=root 2>/dev/null || true
  for _ in $(seq 100); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
  for f in "$slurm_dir/slurmd.pid" "$slurm_dir/slurmctld.pid" "$slurm_dir/munge/munged.pid"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
}
