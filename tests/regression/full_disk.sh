#!/usr/bin/env bash
# A disk that fills mid-run stops the job in seconds, on every rank, naming the file and
# "no space left on device" (not after parallel.timeout_s, not blaming a dead peer):
#  * run.dir on a 1 MB tmpfs 70% full, 40 smoke steps at np 2 (metrics.h5's collective
#    writes: the case that hung in H5Fflush), with parallel.timeout_s = 600;
#  * the same at np 4 (split 2 + 2) with checkpoints every step;
#  * a run that checkpointed, then ran out of space: after the space is freed the next
#    job resumes from the last finished checkpoint and ends as a straight run does, bit
#    for bit (metrics, rollouts.h5, weights);
#  * a run whose only checkpoint was cut short starts over, keeping its files aside;
#  * `slimpi generate` into a full disk says so and leaves no empty .slimpi.lock;
#  * `slimpi export` into a full disk says so and leaves no truncated model.safetensors
#    (nor any other file of the export), whole or in shards.
# Needs root (mount -t tmpfs); exits 77 (skipped) where mounting is not allowed.
# Usage: full_disk.sh SLIMPI ROOT "MPIRUN FLAGS"
set -uo pipefail
slimpi=$1; root=$2; mpirun=$3
out=$(mktemp -d)
disk="$out/disk"
mkdir -p "$disk"
cleanup() { umount "$disk" 2>/dev/null; [ -n "${KEEP_OUT:-}" ] || rm -rf "$out"; }
trap cleanup EXIT
mount_disk() {  # mount_disk SIZE: a fresh tmpfs at $disk
  umount "$disk" 2>/dev/null
  mount -t tmpfs -o size="$1" tmpfs "$disk" 2>/dev/null
}
mount_disk 1m || { echo "full_disk: cannot mount a tmpfs here (not root?): skipped"; exit 77; }
cd "$root"
compare="/usr/bin/python3 $root/tests/regression/compare_runs.py"
deck="inputs/smoke_rl.toml"

fill_to() {  # fill_to KIB_FREE: a filler file leaves about that much space
  local avail
  rm -f "$disk/filler"
  avail=$(df -k --output=avail "$disk" | tail -1)
  dd if=/dev/zero of="$disk/filler" bs=1k count=$((avail - $1)) 2>/dev/null
}
out_of_space() {  # out_of_space NAME NP ARGS...: ends non-zero within 90 s (start-up included), saying why
  local name=$1 np=$2; shift 2
  local start=$SECONDS
  timeout 120 $mpirun -np "$np" "$slimpi" run "$@" >"$out/$name.log" 2>&1
  local rc=$? took=$((SECONDS - start))
  [ $rc -ne 124 ] || { cat "$out/$name.log"; echo "FAIL: $name hung"; exit 1; }
  [ $rc -ne 0 ] || { cat "$out/$name.log"; echo "FAIL: $name exited 0 on a full disk"; exit 1; }
  [ $took -le 90 ] || { cat "$out/$name.log"; echo "FAIL: $name took $took s to stop"; exit 1; }
  # (slimpi's own words, or the C library's "No space left on device" after the file's name:
  # which rank's write fails first decides, and mpirun ends the others at once)
  grep -qi "no space left on device" "$out/$name.log" || { cat "$out/$name.log"; echo "FAIL: $name: no 'no space left on device'"; exit 1; }
  grep -iE "$disk/run/[^ ]+\.(h5|csv|json|toml).*no space left on device" "$out/$name.log" | grep -qv "^mca_" \
    || { cat "$out/$name.log"; echo "FAIL: $name names no file with the reason"; exit 1; }
  if grep -q "a peer rank is dead" "$out/$name.log"; then cat "$out/$name.log"; echo "FAIL: $name blames a dead peer"; exit 1; fi
  if grep -q "Segmentation fault" "$out/$name.log"; then cat "$out/$name.log"; echo "FAIL: $name crashed"; exit 1; fi
  if pgrep -f "run.dir=$disk/run" >/dev/null; then echo "FAIL: $name left ranks running"; exit 1; fi
  echo "full_disk: $name stopped in $took s (exit $rc): $(grep -m1 -io 'no space left on device[^(]*' "$out/$name.log")"
}

echo "== the issue's case: np 2, 1 MB tmpfs 70% full, 40 steps"
fill_to 300
out_of_space np2 2 $deck --set run.n_steps=40 --set run.dir="$disk/run"

echo "== np 4 (split 2 + 2), a checkpoint every step, a little more room"
mount_disk 4m
fill_to 900
out_of_space np4 4 $deck --set run.n_steps=40 --set checkpoint.interval=1 --set run.dir="$disk/run"

echo "== out of space after a checkpoint: freed, the next job resumes as a straight run"
$mpirun -np 4 "$slimpi" run $deck --set run.n_steps=6 --set run.dir="$out/straight" >"$out/straight.log" 2>&1 \
  || { cat "$out/straight.log"; exit 1; }
mount_disk 8m
$mpirun -np 4 "$slimpi" run $deck --set run.n_steps=6 --set run.job_steps=2 --set run.dir="$disk/run" \
  >"$out/first.log" 2>&1 || { cat "$out/first.log"; exit 1; }
fill_to 40
out_of_space second 4 $deck --set run.n_steps=6 --set run.dir="$disk/run"
rm -f "$disk/filler"
$mpirun -np 4 "$slimpi" run $deck --set run.n_steps=6 --set run.dir="$disk/run" >"$out/third.log" 2>&1 \
  || { cat "$out/third.log"; exit 1; }
grep -q "resuming at step [0-9]" "$out/third.log" || { cat "$out/third.log"; echo "FAIL: no resume"; exit 1; }
$compare "$out/straight" "$disk/run" || { cat "$out/third.log"; echo "FAIL: the resumed run differs"; exit 1; }
echo "full_disk: $(grep -m1 -o 'resuming at step [0-9]*' "$out/third.log") after the space was freed; equal to the straight run"

echo "== the only checkpoint cut short by the full disk: the next job starts over, files kept aside"
mount_disk 8m
fill_to 1340  # room for step 1-2 (rollouts.h5 ~290 KiB with its chunks, metrics.h5 ~910), not for checkpoint 2 (~500)
out_of_space cut 2 $deck --set run.n_steps=40 --set checkpoint.interval=2 --set run.dir="$disk/run"
ls "$disk/run/ckpt" | grep -q step_ || { cat "$out/cut.log"; echo "FAIL: no checkpoint was begun; the case tests nothing"; exit 1; }
if ls "$disk"/run/ckpt/step_*/DONE >/dev/null 2>&1; then echo "FAIL: a checkpoint finished; the case tests nothing"; exit 1; fi
rm -f "$disk/filler"
$mpirun -np 2 "$slimpi" run $deck --set run.n_steps=2 --set run.dir="$disk/run" >"$out/over.log" 2>&1 \
  || { cat "$out/over.log"; exit 1; }
grep -q "starting over" "$out/over.log" && grep -q "were moved to $disk/run/previous_" "$out/over.log" \
  || { cat "$out/over.log"; echo "FAIL: no start-over with the earlier files kept"; exit 1; }
echo "== generate on a disk with no room: refused naming the file, no empty lock file left"
mount_disk 1m
fill_to 0
timeout 120 $mpirun -np 2 "$slimpi" generate inputs/generate_addition.toml --set model.init_from= \
  --set run.dir="$disk/gen" >"$out/gen.log" 2>&1 && { cat "$out/gen.log"; echo "FAIL: generate ran on a full disk"; exit 1; }
grep -q "No space left on device" "$out/gen.log" || { cat "$out/gen.log"; echo "FAIL: no reason given"; exit 1; }
test ! -e "$disk/gen/.slimpi.lock" || { echo "FAIL: an empty .slimpi.lock was left"; exit 1; }
echo "full_disk: generate: $(grep -m1 -o 'cannot [^:]*: No space left on device' "$out/gen.log")"
echo "== export into a disk with too little room: no truncated weights left behind"
for shard in 5GB 20KB; do
  mount_disk 1m
  fill_to 40  # room for config.json, not for the weights (~140 KiB)
  timeout 120 "$slimpi" export "$out/straight" "$disk/hf" --max-shard-size "$shard" >"$out/export.log" 2>&1 \
    && { cat "$out/export.log"; echo "FAIL: export into a full disk succeeded"; exit 1; }
  grep -q "No space left on device" "$out/export.log" || { cat "$out/export.log"; echo "FAIL: export: no reason given"; exit 1; }
  grep -q "holds no partial model" "$out/export.log" || { cat "$out/export.log"; echo "FAIL: export: no word of the clean-up"; exit 1; }
  left=$(find "$disk/hf" -type f 2>/dev/null)
  [ -z "$left" ] || { cat "$out/export.log"; echo "FAIL: export (shard $shard) left $left"; exit 1; }
done
echo "full_disk: export: $(grep -m1 -o 'cannot [^:]*: No space left on device' "$out/export.log")"
echo "full_disk: OK"
