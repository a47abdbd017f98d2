#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine (as root) and runs every test: C unit tests (under CTest,
# then again with the rest under prove), integration tests through real FUSE mounts (loaded
# with torch 1.13 on the host, torch 2.6 + safetensors in a Debian 13 root, transformers 5 in
# a Debian sid root), the fuzz smoke run, then the unit and integration tests again with the
# AddressSanitizer/UBSan build, and the unit tests and the concurrency-heavy integration tests
# with the ThreadSanitizer build.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

scripts/install-deps.sh --tests
scripts/build.sh build
scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=Debug -DCKPTFS_SANITIZE=ON
scripts/build.sh build-tsan -DCKPTFS_TSAN=ON

# The Debian 13 root with torch 2.6 and safetensors (built once, then reused).
bash -c 'source tests/lib/common.sh; torch2_root_ensure' ||
  echo "# torch 2.6 root unavailable: its checks will be skipped"
# The sid root with transformers 5 (built once, then reused): models saved by transformers 5.
bash -c 'source tests/lib/common.sh; sid_root_ensure' ||
  echo "# sid root unavailable: tests/integration/tf5_roundtrip.t will skip"
# And what building ckptfs there needs: libfuse 3.17, for the FUSE passthrough tests.
bash -c 'source tests/lib/common.sh; trixie_build_deps_ensure || { echo "# $TRIXIE_WHY"; false; }' ||
  echo "# no libfuse 3.17 build: tests/integration/passthrough.t will skip"
# And one against libfuse 3.18 built with FUSE over io_uring, for tests/integration/io_uring.t.
scripts/libfuse318.sh --ckptfs build-fuse318 > /dev/null ||
  echo "# no libfuse 3.18 build: tests/integration/io_uring.t builds its own or skips"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

integration=(tests/integration/*.t)
fuzz=()
[[ -e tests/fuzz/fuzz.t ]] && fuzz=(tests/fuzz/fuzz.t)

echo "== release build: unit tests under CTest (no root or FUSE needed)"
ctest --test-dir build --output-on-failure

echo "== release build"
CKPTFS_BIN="$top/build/ckptfs" prove --timer build/tests/test_* "${integration[@]}" "${fuzz[@]}"

echo "== ASan + UBSan build"
CKPTFS_BIN="$top/build-asan/ckptfs" prove --timer build-asan/tests/test_* "${integration[@]}"

# Every report (from a test program or a mount's daemon, wherever its stderr goes) is a file
# under tsan_logs: any file there fails the run, after the tests say what else failed.
echo "== ThreadSanitizer build: the tests that run threads"
tsan_logs=$(mktemp -d)
# The unit tests that start threads (one thread alone cannot race), and the integration tests
# that read from many threads.
threaded=(build-tsan/tests/test_{framecache,mxfp4,pack,plan,readahead,srcfd,srcfiles,srcmap,tree})
concurrent=(tests/integration/source_change.t tests/integration/mapped_reads.t tests/integration/pack.t
            tests/integration/shared_nodes.t)
tsan_options="halt_on_error=1 exitcode=66 second_deadlock_stack=1 log_path=$tsan_logs/report"
tsan_options+=" suppressions=$top/tests/tsan/suppressions.txt"
# GLib's slice allocator hands memory between threads under locks the sanitizer cannot see:
# plain malloc instead.
G_SLICE=always-malloc TSAN_OPTIONS=$tsan_options CKPTFS_BIN="$top/build-tsan/ckptfs" \
  prove --timer "${threaded[@]}" "${concurrent[@]}" || tsan_failed=1
if compgen -G "$tsan_logs/report*" > /dev/null; then
  cat "$tsan_logs"/report*
  tsan_failed=1
fi
rm -rf "$tsan_logs"
[[ -z ${tsan_failed:-} ]]
