#!/usr/bin/env bash
# Builds ckptfs. scripts/build.sh [DIR [extra cmake args...]]; default DIR=build (release, -Werror).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-build}
shift || true
cmake -S "$top" -B "$top/$dir" -DCMAKE_BUILD_TYPE=Release -DCKPTFS_WERROR=ON "$@" >/dev/null
cmake --build "$top/$dir" -j"$(nproc)"
