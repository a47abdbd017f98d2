#!/usr/bin/env bash
# ckptfs mount-time benchmark: a new binary against an old one on a huge sparse source (real
# config and headers, data areas as holes: bench/gen_deepseek_sparse.py), side by side in one run.
#
#   * check (untimed, first): both binaries mount the source; `find MNT -type f` with sizes of hf/
#     and the layout must be identical, and so must the first CHECK_BYTES of CHECK_FILES files
#     spread over both views (and their last CHECK_BYTES: a rank file's zip directory), and
#     `ckptfs cat` of the small ones (config.json, the index): the
#     change may make it faster, never different. A difference fails the bench.
#   * callgrind (CALLGRIND=1, the default): instructions of `ckptfs inspect -o dtype=bf16` of the
#     source (the same source read and model checked as a mount does, without FUSE), old and new:
#     robust under load, unlike wall time. ~1-3 min per binary under valgrind.
#   * RUNS rounds, each a fresh mount of old and new in turn (the order alternating): mount until
#     MNT/hf answers, the mount command's CPU, `ls -lR MNT/LAYOUT`, the daemon's CPU for it, and
#     its VmRSS / VmHWM after. Medians, ranges, and new/old ratios (below 1: new is faster).
#
# Usage:
#   git worktree add /tmp/ckptfs-main main && /tmp/ckptfs-main/scripts/build.sh
#   OLD_BIN=/tmp/ckptfs-main/build/ckptfs bench/mount_bench.sh
#
# Environment:
#   CKPTFS_BIN    the new binary (default <repo>/build/ckptfs); OLD_BIN the old one (required)
#   BENCH_DIR     keeps SPARSE_MODEL-sparse/ (generated on first use; default /tmp/ckptfs-bench)
#   SPARSE_MODEL  kimi-k2 (default), glm-4.6 or deepseek-v3
#   LAYOUT        the layout listed (default tp1pp16ep64; glm-4.6: tp2pp4ep32)
#   OPTS          mount options (default dtype=bf16,layouts=LAYOUT,pp_first=3,pp_last=2; glm-4.6:
#                 layouts=LAYOUT,mtp=on)
#   RUNS          timed rounds (default 5); CALLGRIND 1 or 0; CHECK_FILES (default 6), CHECK_BYTES
#                 (default 4 MiB); LS_TIMEOUT seconds per ls (default 120)
#   PYTHON        Debian's /usr/bin/python3 (the generator needs the standard library only)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
BIN=${CKPTFS_BIN:-$REPO/build/ckptfs}
OLD_BIN=${OLD_BIN:-}
BENCH_DIR=${BENCH_DIR:-/tmp/ckptfs-bench}
PYTHON=${PYTHON:-/usr/bin/python3}
SPARSE_MODEL=${SPARSE_MODEL:-kimi-k2}
RUNS=${RUNS:-5}
CALLGRIND=${CALLGRIND:-1}
CHECK_FILES=${CHECK_FILES:-6}
CHECK_BYTES=${CHECK_BYTES:-4194304}
LS_TIMEOUT=${LS_TIMEOUT:-120}
case $SPARSE_MODEL in
deepseek-v3 | kimi-k2)
    LAYOUT=${LAYOUT:-tp1pp16ep64}
    OPTS=${OPTS:-dtype=bf16,layouts=$LAYOUT,pp_first=3,pp_last=2} ;;
glm-4.6)
    LAYOUT=${LAYOUT:-tp2pp4ep32}
    OPTS=${OPTS:-layouts=$LAYOUT,mtp=on} ;;
*) echo "mount_bench: SPARSE_MODEL is deepseek-v3, kimi-k2 or glm-4.6" >&2; exit 2 ;;
esac

BENCH_NAME=mount_bench BENCH_NOTE_TIME=1
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"

[[ -x $BIN ]] || die "no ckptfs binary at $BIN (build it or set CKPTFS_BIN)"
[[ -n $OLD_BIN && -x $OLD_BIN ]] || die "set OLD_BIN to the old binary (built from main into a directory of its own)"
BIN=$(readlink -f "$BIN") OLD_BIN=$(readlink -f "$OLD_BIN")
command -v fusermount3 >/dev/null || die "fusermount3 not found"
[[ -x /usr/bin/time ]] || die "/usr/bin/time (GNU time) not found"
if ((CALLGRIND)); then command -v valgrind >/dev/null || die "valgrind not found (or CALLGRIND=0)"; fi

mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd -P)
SRC=$BENCH_DIR/$SPARSE_MODEL-sparse
if [[ ! -d $SRC ]]; then
    note "generating $SRC"
    "$PYTHON" "$HERE/gen_deepseek_sparse.py" "$SRC" --model "$SPARSE_MODEL" >&2
fi

bench_start "$BENCH_DIR/mount-run.XXXXXX"

# mount_with BIN: a fresh mount of $SRC; sets DAEMON_PID, T_ANSWER (us until MNT/hf answers) and
# C_MOUNT (us of the mount command's CPU: the source is read before the daemon forks).
mount_with() {
    local t0 t1 i
    unmount
    t0=$(now_us)
    /usr/bin/time -f '%U %S' -o "$RUN_DIR/mount.time" "$1" mount -o "$OPTS" "$SRC" "$MNT" 2>"$RUN_DIR/mount.err" ||
        die "$1 mount -o $OPTS $SRC failed: $(cat "$RUN_DIR/mount.err")"
    for ((i = 0; i < 6000; i++)); do
        stat "$MNT/hf" >/dev/null 2>&1 && break
        sleep 0.01
    done
    t1=$(now_us)
    ((i < 6000)) || die "$MNT/hf did not answer within 60 s"
    DAEMON_PID=$(find_daemon "$1") || die "cannot find the daemon of $1 for $MNT"
    T_ANSWER=$((t1 - t0))
    C_MOUNT=$(awk '{printf "%.0f", ($1 + $2) * 1e6}' "$RUN_DIR/mount.time")
}
cpu_us() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.0f", ($14 + $15) * 1e6 / hz}' "/proc/$1/stat"; }

# --- check: the same names, sizes and bytes -----------------------------------------------------

# tree_of BIN OUT: names and sizes of hf/ and the layout, and the sampled bytes' checksums.
tree_of() {
    mount_with "$1"
    (cd "$MNT" && find hf "$LAYOUT" -type f -printf '%p %s\n' | LC_ALL=C sort) >"$2.tree"
    : >"$2.bytes"
    local f
    for f in $(awk '{print $1}' "$2.tree" | awk -v n="$CHECK_FILES" '{a[NR] = $0} END {
            step = NR / n; for (i = 0; i < n; i++) print a[int(i * step) + 1]; print a[NR]}' | sort -u); do
        echo "$f $(head -c "$CHECK_BYTES" "$MNT/$f" | md5sum | cut -d' ' -f1) $(tail -c "$CHECK_BYTES" "$MNT/$f" | md5sum | cut -d' ' -f1)" >>"$2.bytes"
    done
    unmount
    for f in hf/config.json hf/model.safetensors.index.json; do
        echo "$f $("$1" cat -o "$OPTS" "$SRC" "$f" 2>&1 | md5sum | cut -d' ' -f1)" >>"$2.bytes"
    done
}
note "check: $SRC mounted by both (-o $OPTS)"
tree_of "$OLD_BIN" "$RUN_DIR/old"
tree_of "$BIN" "$RUN_DIR/new"
cmp -s "$RUN_DIR/old.tree" "$RUN_DIR/new.tree" || die "file names or sizes differ: $(diff "$RUN_DIR/old.tree" "$RUN_DIR/new.tree" | head -5)"
cmp -s "$RUN_DIR/old.bytes" "$RUN_DIR/new.bytes" || die "bytes differ: $(diff "$RUN_DIR/old.bytes" "$RUN_DIR/new.bytes" | head -5)"
note "check: $(wc -l <"$RUN_DIR/new.tree") files with the same names and sizes, $(wc -l <"$RUN_DIR/new.bytes") samples with the same bytes"

# --- callgrind -------------------------------------------------------------------------------------

instructions() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$1" inspect -o dtype=bf16 "$SRC" 2>&1 >/dev/null |
        awk '/Collected :|I *refs:/ {gsub(",", "", $NF); print $NF}' | tail -n 1
}
if ((CALLGRIND)); then
    note "callgrind: inspect -o dtype=bf16 (old, then new)"
    IR_OLD=$(instructions "$OLD_BIN") IR_NEW=$(instructions "$BIN")
fi

# --- timed rounds ----------------------------------------------------------------------------------

declare -A answer cpu ls lscpu rss hwm
round() { # NAME BIN
    local t0 c0
    mount_with "$2"
    answer[$1]+=" $T_ANSWER" cpu[$1]+=" $C_MOUNT"
    c0=$(cpu_us "$DAEMON_PID")
    t0=$(now_us)
    timeout "$LS_TIMEOUT" ls -lR "$MNT/$LAYOUT" >/dev/null || die "ls -lR $MNT/$LAYOUT failed or took over ${LS_TIMEOUT}s"
    ls[$1]+=" $(($(now_us) - t0))" lscpu[$1]+=" $(($(cpu_us "$DAEMON_PID") - c0))"
    rss[$1]+=" $(status_kib "$DAEMON_PID" VmRSS)" hwm[$1]+=" $(status_kib "$DAEMON_PID" VmHWM)"
    unmount
}
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
for ((r = 0; r < RUNS; r++)); do
    if ((r % 2)); then round new "$BIN"; round old "$OLD_BIN"; else round old "$OLD_BIN"; round new "$BIN"; fi
    note "round $((r + 1))/$RUNS done (load $(cut -d' ' -f1 /proc/loadavg))"
done
LOAD_END=$(cut -d' ' -f1 /proc/loadavg)

stat_of() { # ARRAY NAME SCALE UNIT: "median (min-max) UNIT"
    local -n a=$1
    local v
    v=$(printf '%s\n' ${a[$2]} | sort -g | awk -v s="$3" '{v[NR] = $1 / s} END {printf "%.0f-%.0f", v[1], v[NR]}')
    echo "$(median ${a[$2]} | awk -v s="$3" '{printf "%.0f", $1 / s}') ($v) $4"
}
ratio() { # ARRAY
    local -n a=$1
    awk -v n="$(median ${a[new]})" -v o="$(median ${a[old]})" 'BEGIN {printf "%.2f", (o > 0 ? n / o : 0)}'
}

echo
echo "mount_bench: $SRC ($(find "$SRC" -name '*.safetensors' | wc -l) shards), -o $OPTS"
echo "  new: $BIN"
echo "  old: $OLD_BIN"
echo "  $RUNS interleaved rounds; load average $LOAD_START at the start, $LOAD_END at the end, $(nproc) CPUs"
printf '  %-34s %-28s %-28s %s\n' "" "old" "new" "new/old"
row() { printf '  %-34s %-28s %-28s %s\n' "$1" "$(stat_of "$2" old "$3" "$4")" "$(stat_of "$2" new "$3" "$4")" "$(ratio "$2")"; }
row "mount, until MNT/hf answers" answer 1000 ms
row "mount command CPU" cpu 1000 ms
row "ls -lR MNT/$LAYOUT" ls 1000 ms
row "daemon CPU for that ls" lscpu 1000 ms
row "daemon VmRSS after" rss 1024 MiB
row "daemon VmHWM after" hwm 1024 MiB
if ((CALLGRIND)); then
    printf '  %-34s %-28s %-28s %s\n' "inspect, callgrind instructions" "$IR_OLD" "$IR_NEW" \
        "$(awk -v n="$IR_NEW" -v o="$IR_OLD" 'BEGIN {printf "%.2f", n / o}')"
fi
