#!/usr/bin/env bash
# postprocess/ on real run files: a 4-step RL run at np 2 (colocated) and np 4 (split)
# with evaluation; summary.py prints the table and the eval gain line, plot_run.py and
# compare_runs.py write non-empty PNGs, scaling.py tabulates the runs (2 and 4 ranks, and
# np 2 at tensor parallel 2: the layout axis of jobs/scaling.sh), and a directory that is
# not a run gets a clear message.
# Usage: postprocess.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"
py=/usr/bin/python3
$mpirun -np 2 "$slimpi" run inputs/smoke_rl.toml --set run.n_steps=4 --set eval.interval=2 \
  --set parallel.placement=colocate --set run.dir="$out/np2" >"$out/np2.log" 2>&1 || { cat "$out/np2.log"; exit 1; }
$mpirun -np 4 "$slimpi" run inputs/smoke_rl.toml --set run.n_steps=4 --set eval.interval=2 \
  --set run.dir="$out/np4" >"$out/np4.log" 2>&1 || { cat "$out/np4.log"; exit 1; }
$mpirun -np 2 "$slimpi" run inputs/smoke_rl.toml --set run.n_steps=4 --set eval.interval=2 \
  --set parallel.placement=colocate --set parallel.tensor_parallel=2 --set run.dir="$out/np2_tp2" \
  >"$out/np2_tp2.log" 2>&1 || { cat "$out/np2_tp2.log"; exit 1; }

$py postprocess/summary.py "$out/np4" | tee "$out/summary.txt"
grep -q "5 metric rows (steps 0..4), 4 rank(s), 128 samples in rollouts.h5" "$out/summary.txt"
grep -q "^eval/pass@1: .* at step 0 -> .* at step 4" "$out/summary.txt"
grep -qE "^ +3 +[0-9]" "$out/summary.txt"   # per-rank phase table has rank 3

$py postprocess/plot_run.py "$out/np4"
$py postprocess/compare_runs.py "$out/np2" "$out/np4" --out "$out/compare.png"
$py postprocess/scaling.py "$out/np2" "$out/np4" "$out/np2_tp2" --png "$out/scaling.png" | tee "$out/scaling.txt"
grep -qE "^ +2 +1 .* $out/np2$" "$out/scaling.txt" && grep -qE "^ +4 +1 .* $out/np4$" "$out/scaling.txt"
grep -qE "^ +2 +2 .* $out/np2_tp2$" "$out/scaling.txt"
for png in "$out/np4/plot.png" "$out/compare.png" "$out/scaling.png"; do
  [ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || { echo "FAIL: $png is not a PNG"; exit 1; }
  [ "$(stat -c %s "$png")" -gt 10000 ] || { echo "FAIL: $png is nearly empty"; exit 1; }
done
mkdir "$out/empty"
if $py postprocess/summary.py "$out/empty" >"$out/bad.txt" 2>&1; then echo "FAIL: summary of a non-run"; exit 1; fi
grep -q "metrics.h5: no such file (is $out/empty a slimpi run directory?)" "$out/bad.txt"
echo "postprocess: OK"
