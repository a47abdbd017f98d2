#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (coverage, ASan, UBSan) and runs each for a short,
# bounded time on a copy of its seed corpus. CKPTFS_FUZZ_SECONDS sets the time (default 30).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
secs=${CKPTFS_FUZZ_SECONDS:-30}
if ! command -v clang >/dev/null; then
  echo "1..0 # skip clang is not installed"
  exit 0
fi
build=$top/build-fuzz
if ! CC=clang cmake -S "$top" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DCKPTFS_FUZZ=ON -DCKPTFS_TESTS=OFF > "$build.log" 2>&1 ||
   ! cmake --build "$build" -j"$(nproc)" >> "$build.log" 2>&1; then
  echo "1..1"
  echo "not ok 1 - fuzz targets build"
  sed 's/^/# /' "$build.log" | tail -30 >&2
  exit 1
fi
n=0
fail=0
targets=("$build"/fuzz/fuzz_*)
echo "1..${#targets[@]}"
for t in "${targets[@]}"; do
  name=$(basename "$t")
  n=$((n + 1))
  corpus=$(mktemp -d)
  cp "$top/tests/fuzz/corpus/${name#fuzz_}"/* "$corpus"/ 2>/dev/null
  if "$t" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$build/" "$corpus" > "$corpus.log" 2>&1; then
    runs=$(grep -o 'Done [0-9]* runs' "$corpus.log" | tail -1)
    echo "ok $n - $name ran ${secs}s without a crash ($runs)"
  else
    echo "not ok $n - $name"
    grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$corpus.log" | head -20 | sed 's/^/# /' >&2
    fail=1
  fi
  rm -rf "$corpus" "$corpus.log"
done
exit $fail
