#!/usr/bin/env bash
# -o readahead=auto (the default: a lone reader of a rank or mcore/ file gets its chunks pushed
# into the mount's page cache, on 8 cores or more) against the old default (readahead=off) on a
# GPU node, in under 5 minutes, with bench/node_bench.sh on a cached Llama-3-8B-shaped checkpoint
# (MODEL=llama3-8b, SIZE=4G: 3.85 GB):
#
#   1. check: what inspect says auto does here; one rank file read alone and two read at once
#      through a foreground mount of the default, equal to `ckptfs cat`; the daemon's log lines
#      (the policy, and at unmount the chunks pushed and the opens pushed or not).
#   2. tp4pp1/ with readahead=off (the old default) and readahead=auto, 1/4/8 cached readers,
#      median of REPEAT rounds (report-matrix.txt; at most MATRIX_S seconds, 110).
#   3. the GPU loads (TP-4, TP-8) of torch.load of the rank files through a mount with
#      readahead=off (report-gpu-off.txt), 4. the same through the default mount, auto
#      (report-gpu-auto.txt), 5. safe_open + get_slice of the HF shards, which do not touch the
#      mount (report-gpu-slice.txt), as time allows. Each also reads tp4pp1/ with one reader.
#   Each step is a node_bench.sh run of its own, so that one cut short by the time left loses
#   only its own report.
#
#   bench/node_readahead.sh OUT [--quick]
#
#   OUT      a directory for the results: the reports above, check.txt, env.txt, progress.log
#   --quick  SIZE=1.5G and one round: to try the script on a build host (with CKPTFS_BIN set to a
#            local build, and GPU_DEVICE=cpu for the loads where there is no GPU)
#
# The binary: the bundle of `scripts/bundle.sh --io-uring --root ROOT /tmp/ckptfs-node`, copied
# to build-node/ in the repository (put back at /tmp/ckptfs-node, the path it was built for), or
# CKPTFS_BIN. Environment: SIZE (4G), REPEAT (2), READERS ("1 4 8"), GPU_TP ("4 8"), GPU_DEVICE
# (cuda), NODE_BUNDLE (/tmp/ckptfs-node), PYTHON (python3 with numpy; torch for the loads, or
# GPU_PYTHON), BENCH_DIR (/tmp/ckptfs-bench), BUDGET (seconds for the whole run, 290), AUTO_OPTS
# (options added to every mount of the default: none; readahead_cores=16 turns auto on on a
# machine of fewer than 8 cores, to try the script there).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
OUT=""
QUICK=0
for arg in "$@"; do
  case $arg in
  --quick) QUICK=1 ;;
  -*) echo "usage: bench/node_readahead.sh OUT [--quick]" >&2; exit 2 ;;
  *) OUT=$arg ;;
  esac
done
[[ -n $OUT ]] || { echo "usage: bench/node_readahead.sh OUT [--quick]" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
T0=$SECONDS
BUDGET=${BUDGET:-290}
if ((QUICK)); then SIZE=${SIZE:-1.5G} REPEAT=${REPEAT:-1}; fi
SIZE=${SIZE:-4G}
REPEAT=${REPEAT:-2}
READERS=${READERS:-1 4 8}
GPU_TP=${GPU_TP:-4 8}
BENCH_DIR=${BENCH_DIR:-/tmp/ckptfs-bench}
AUTO_OPTS=${AUTO_OPTS:-}

BENCH_NAME=node_readahead BENCH_LOG=$OUT/progress.log
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"
# shellcheck source=bench/node_env.sh
source "$HERE/node_env.sh"
node_python
node_bundle
node_fusermount
node_env_lines > "$OUT/env.txt"

SRC=$("$PYTHON" "$HERE/node_bench.py" gen --model llama3-8b --size "$SIZE" "$BENCH_DIR" 2>> "$OUT/progress.log") ||
  die "no checkpoint (python with numpy needed)"
{
  echo "checkpoint: $SRC ($(du -sh "$SRC" | cut -f1)), ready after $((SECONDS - T0)) s"
  echo "inspect, the default${AUTO_OPTS:+ with $AUTO_OPTS}: $("$BIN" inspect ${AUTO_OPTS:+-o "$AUTO_OPTS"} "$SRC" | grep '^read-ahead:')"
  echo "inspect, readahead=off: $("$BIN" inspect -o readahead=off "$SRC" | grep '^read-ahead:')"
} >> "$OUT/env.txt"
cat "$OUT/env.txt"

# 1. The default mount in the foreground: bytes, and what the daemon says it did.
check() {
  local mnt log pid rc=0 f0=tp4pp1/release/mp_rank_00/model_optim_rng.pt f1=tp4pp1/release/mp_rank_01/model_optim_rng.pt
  mnt=$(mktemp -d /tmp/node-readahead.XXXXXX)
  log=$OUT/check-daemon.log
  "$BIN" mount -f ${AUTO_OPTS:+-o "$AUTO_OPTS"} "$SRC" "$mnt" 2> "$log" &
  pid=$!
  for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
  mountpoint -q "$mnt" || { kill "$pid" 2> /dev/null; rmdir "$mnt"; echo "the default mount failed: $(cat "$log")"; return 1; }
  if timeout 120 "$BIN" cat "$SRC" "$f0" | cmp - "$mnt/$f0"; then echo "one reader: $f0 equals ckptfs cat"; else echo "one reader: $f0 DIFFERS"; rc=1; fi
  timeout 120 cat "$mnt/$f0" > /dev/null & # two at once
  if timeout 120 "$BIN" cat "$SRC" "$f1" | cmp - "$mnt/$f1"; then echo "two readers: $f1 equals ckptfs cat"; else echo "two readers: $f1 DIFFERS"; rc=1; fi
  wait $! || rc=1
  fusermount3 -u "$mnt" || umount -l "$mnt" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  rmdir "$mnt"
  echo "the daemon's log:"
  sed 's/^/  /' "$log"
  return $rc
}
check > "$OUT/check.txt" 2>&1 || note "the check found a problem (check.txt)"
cat "$OUT/check.txt"

bench() { # REPORT SECONDS VAR=VALUE...: node_bench.sh, cached, with the settings given, at most SECONDS
  local report=$1 left=$2
  shift 2
  ((left <= BUDGET - (SECONDS - T0))) || left=$((BUDGET - (SECONDS - T0)))
  ((left > 20)) || { note "no time left for $report"; return 0; }
  env CKPTFS_BIN="$BIN" BENCH_DIR="$BENCH_DIR" MODEL=llama3-8b SIZE="$SIZE" READ_SIZE=1M CONDITIONS=cached \
    TIMEOUT=120 PYTHON="$PYTHON" GPU_TP="$GPU_TP" "$@" \
    timeout --kill-after=10 "$left" "$HERE/node_bench.sh" > "$OUT/$report" 2>> "$OUT/progress.log" ||
    note "node_bench.sh for $report ended with $? (see progress.log)"
  cat "$OUT/$report"
}
# 2. The old default beside auto.
bench report-matrix.txt "${MATRIX_S:-110}" GPU=0 REPEAT="$REPEAT" READERS="$READERS" \
  VIEWS="tp4pp1:readahead=off tp4pp1:readahead=auto${AUTO_OPTS:+,$AUTO_OPTS}"
# 3-5. The GPU loads: the old default, auto, then the baseline that does not touch the mount.
gpu_run() { bench "$1" "$2" REPEAT=1 READERS=1 VIEWS="tp4pp1:${3:-readahead=auto}" MOUNT_OPTS="$3" GPU_MODES="$4"; }
gpu_run report-gpu-off.txt 90 readahead=off torch
gpu_run report-gpu-auto.txt 90 "$AUTO_OPTS" torch
gpu_run report-gpu-slice.txt 90 "" slice
note "$((SECONDS - T0)) s in all"
