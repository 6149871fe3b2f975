#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs the whole ctest suite,
# as many tests at once as there are cores (the tests never depend on timing; the real-Slurm
# test runs alone). Extra arguments go to ctest (a later -j wins).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
cd "${BUILD_DIR:-$root/build}"
ctest --output-on-failure --timeout 600 -j "$(nproc)" "$@"
