#!/usr/bin/env bash
# Configures and builds slimpi into build/ (Release, ccache and lld when present).
# Usage: scripts/build.sh [extra cmake args...]. BUILD_DIR and BUILD_TYPE override.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=$(nproc)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@" >/dev/null
cmake --build "$build" -j "$jobs"
