#!/usr/bin/env bash
# FUSE over io_uring against /dev/fuse on a GPU node, in under 8 minutes: a ~4 GB generated
# checkpoint (bench/node_bench.py gen, cached), read directly and through tp4pp1/ rank files and
# mcore/ .distcp files with -o io_uring=on and io_uring=off (the same binary: the bundle's, built
# against libfuse 3.18 with io_uring), by 1/4/8/16 readers, 1 MiB preads, median of 3 rounds
# (bench/node_bench.sh: ratios to direct, daemon CPU s/GB). Run as root: it switches FUSE over
# io_uring on (/sys/module/fuse/parameters/enable_uring) and puts the old value back.
#
#   bench/node_uring.sh OUT
#
#   OUT   a directory for the results: report.txt (node_bench.sh's tables), progress.log,
#         env.txt (machine, kernel, binary), check.txt (bytes through both transports compared)
#
# The bundle: scripts/bundle.sh --io-uring /tmp/ckptfs-node, then that directory copied to
# build-node/ in the repository (the binary runs from /tmp/ckptfs-node, where this script copies
# it back). The node needs no libfuse and no fusermount3 (root mounts and unmounts itself).
# Environment: SIZE (4G), REPEAT (3), READERS ("1 4 8 16"), NODE_BUNDLE (/tmp/ckptfs-node),
# PYTHON (python3 with numpy, for the generator).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
OUT=${1:?usage: bench/node_uring.sh OUT}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
KNOB=/sys/module/fuse/parameters/enable_uring
T0=$SECONDS

BENCH_NAME=node_uring BENCH_LOG=$OUT/progress.log
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"
[[ $(id -u) -eq 0 ]] || die "needs root"
# shellcheck source=bench/node_env.sh
source "$HERE/node_env.sh"
node_python
unset CKPTFS_BIN # always the bundle: it is the build with io_uring
node_bundle
node_fusermount

old_knob=""
exec {knob_lock}> /tmp/ckptfs-enable_uring.lock
flock -w 60 "$knob_lock" || die "another run holds $KNOB"
if [[ -e $KNOB ]]; then
  old_knob=$(cat "$KNOB")
  trap 'echo "$old_knob" > "$KNOB"' EXIT
  echo Y > "$KNOB"
fi

{
  node_env_lines
  echo "enable_uring: ${old_knob:-missing (no CONFIG_FUSE_IO_URING)} before, $(cat "$KNOB" 2> /dev/null || echo -) during the run"
  echo "io_uring_disabled: $(cat /proc/sys/kernel/io_uring_disabled 2> /dev/null || echo '?')"
} > "$OUT/env.txt"
cat "$OUT/env.txt"

# The checkpoint, and a check that both transports serve the same bytes (one rank file and the
# first .distcp, cmp against `ckptfs cat`).
BENCH_DIR=${BENCH_DIR:-/tmp/ckptfs-bench}
SRC=$("$PYTHON" "$HERE/node_bench.py" gen --model qwen2-7b --size "${SIZE:-4G}" "$BENCH_DIR" 2>> "$OUT/progress.log") ||
  die "no checkpoint (python with numpy needed)"
echo "checkpoint: $SRC ($(du -sh "$SRC" | cut -f1)), $((SECONDS - T0)) s" | tee -a "$OUT/env.txt"
check_mnt=$(mktemp -d /tmp/node-uring-check.XXXXXX)
{
  for mode in on off; do
    mkdir -p "$check_mnt/$mode"
    if ! "$BIN" mount -o "io_uring=$mode" "$SRC" "$check_mnt/$mode" 2>&1; then
      echo "io_uring=$mode: mount refused"
      continue
    fi
    for f in tp4pp1/release/mp_rank_01/model_optim_rng.pt mcore/release/__0_0.distcp; do
      if timeout 120 "$BIN" cat "$SRC" "$f" | cmp - "$check_mnt/$mode/$f"; then
        echo "io_uring=$mode: $f equals ckptfs cat"
      else
        echo "io_uring=$mode: $f DIFFERS"
      fi
    done
    fusermount3 -u "$check_mnt/$mode"
  done
} > "$OUT/check.txt" 2>&1 || true
rm -rf --one-file-system "$check_mnt"
cat "$OUT/check.txt"

# The matrix, bounded so that the whole script stays under 8 minutes.
left=$((470 - (SECONDS - T0)))
((left > 60)) || die "no time left for the matrix"
CKPTFS_BIN=$BIN BENCH_DIR=$BENCH_DIR SIZE=${SIZE:-4G} REPEAT=${REPEAT:-3} READERS=${READERS:-1 4 8 16} \
  READ_SIZE=1M CONDITIONS=cached GPU=0 TIMEOUT=120 PYTHON=$PYTHON \
  VIEWS="tp4pp1:io_uring=off tp4pp1:io_uring=on mcore:io_uring=off mcore:io_uring=on" \
  timeout --kill-after=10 "$left" "$HERE/node_bench.sh" > "$OUT/report.txt" 2>> "$OUT/progress.log" ||
  echo "node_uring: node_bench.sh ended with $? (see progress.log)" | tee -a "$OUT/progress.log"
cat "$OUT/report.txt"
echo "node_uring: $((SECONDS - T0)) s in all" | tee -a "$OUT/progress.log"
