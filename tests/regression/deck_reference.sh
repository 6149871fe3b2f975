#!/usr/bin/env bash
# The deck reference and `slimpi check`:
#  * docs/deck_reference.md is exactly what `slimpi keys --markdown` prints (the schema
#    and the checked-in reference never drift apart);
#  * every deck in inputs/ passes `slimpi check` for the ranks it is run with, and
#    nothing is written;
#  * `slimpi check` refuses a cross-key mistake without a job: one message, non-zero exit.
# Usage: deck_reference.sh SLIMPI ROOT "MPIRUN FLAGS"
set -euo pipefail
source "$(dirname "$0")/run_helpers.sh"
regression_setup "$@"

"$slimpi" keys --markdown >"$out/deck_reference.md"
if ! diff -u docs/deck_reference.md "$out/deck_reference.md" >"$out/diff"; then
  echo "docs/deck_reference.md is not what the schema says; regenerate it:"
  echo "  build/slimpi keys --markdown > docs/deck_reference.md"
  head -40 "$out/diff"
  exit 1
fi

before=$(ls runs 2>/dev/null | wc -l || true)
for deck in quickstart_sft:4 quickstart_grpo:4 smoke_rl:4 sft_addition:2 generate_addition:1; do
  name=${deck%%:*} np=${deck##*:}
  "$slimpi" check "inputs/$name.toml" --np "$np" >"$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
  grep -q "holds for a job of $np rank" "$out/$name.log" || { cat "$out/$name.log"; exit 1; }
done
[ "$(ls runs 2>/dev/null | wc -l || true)" = "$before" ] || { echo "slimpi check created a run directory"; exit 1; }

# A rule between keys (not a single key's type or range): refused, once, at any np.
if $mpirun -np 2 "$slimpi" check inputs/smoke_rl.toml --np 4 --set train.async=one_step_off \
     --set parallel.placement=colocate >"$out/bad.log" 2>&1; then
  echo "slimpi check accepted train.async with a colocated placement"; cat "$out/bad.log"; exit 1
fi
[ "$(grep -c 'with parallel.placement = "colocate" (--set) the same ranks do both' "$out/bad.log")" = 1 ] \
  || { cat "$out/bad.log"; exit 1; }
# The layout for the given ranks: 3 ranks cannot split 2 + 2.
if "$slimpi" check inputs/smoke_rl.toml --np 3 --set parallel.trainer_ranks=2 --set parallel.rollout_ranks=2 \
     >"$out/np.log" 2>&1; then
  echo "slimpi check accepted 2 + 2 ranks at np 3"; cat "$out/np.log"; exit 1
fi
grep -q "parallel.trainer_ranks" "$out/np.log" || { cat "$out/np.log"; exit 1; }
echo "deck_reference: the reference matches the schema; every input deck checks; bad combinations refused"
