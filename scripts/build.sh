#!/usr/bin/env bash
# Builds ckptfs. scripts/build.sh [DIR [extra cmake args...]]; default DIR=build (release, -Werror);
# a relative DIR is in the source tree.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-build}
shift || true
[[ $dir == /* ]] || dir=$top/$dir
cmake -S "$top" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCKPTFS_WERROR=ON "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
