#!/usr/bin/env bash
# ckptfs hf/ benchmark: read throughput of MNT/hf against the source files, and mount time +
# daemon memory on a sparse Llama-3-70B-shaped checkpoint. See bench/README.md.
#
#   bench/hf_bench.sh            one run; prints a table
#
# Environment:
#   CKPTFS_BIN   the binary (default: <repo>/build/ckptfs)
#   BENCH_DIR    work dir, keeps the generated checkpoints between runs (default /tmp/ckptfs-bench)
#   PYTHON       python with numpy for gen_checkpoint.py (default /usr/bin/python3)
#   READ_RUNS    repetitions of the read measurements (default 3; the median is shown)
#   MOUNT_RUNS   repetitions of the mount+ls measurement (default 5; the median is shown)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
BIN=${CKPTFS_BIN:-$REPO/build/ckptfs}
BENCH_DIR=${BENCH_DIR:-/tmp/ckptfs-bench}
PYTHON=${PYTHON:-/usr/bin/python3}
READ_RUNS=${READ_RUNS:-3}
MOUNT_RUNS=${MOUNT_RUNS:-5}
READ_TIMEOUT=${READ_TIMEOUT:-300} # seconds per file read; a hung mount fails the run
LS_TIMEOUT=${LS_TIMEOUT:-60}

SMALL=$BENCH_DIR/llama-1g
BIG=$BENCH_DIR/llama3-70b-sparse

# Targets.
TARGET_B_RATIO=0.5
TARGET_MOUNT_MS=300
TARGET_RSS_KIB=$((64 * 1024))

BENCH_NAME=hf_bench
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"

[[ -x $BIN ]] || die "no ckptfs binary at $BIN (build it or set CKPTFS_BIN)"
BIN=$(readlink -f "$BIN")
command -v fusermount3 >/dev/null || die "fusermount3 not found"
[[ -e /dev/fuse ]] || die "/dev/fuse missing"

# --- cleanup -------------------------------------------------------------------------------------

mkdir -p "$BENCH_DIR"
bench_start "$BENCH_DIR/run.XXXXXX"

# --- helpers -------------------------------------------------------------------------------------



# mount SRC [OPTS]: a fresh mount of SRC on $MNT; sets DAEMON_PID.
do_mount() {
    local src=$1 opts=${2:-}
    unmount
    if [[ -n $opts ]]; then
        "$BIN" mount -o "$opts" "$src" "$MNT" || die "ckptfs mount -o $opts $src failed"
    else
        "$BIN" mount "$src" "$MNT" || die "ckptfs mount $src failed"
    fi
    is_mounted "$MNT" || die "ckptfs mount returned but $MNT is not mounted"
    DAEMON_PID=$(find_daemon) || die "cannot find the ckptfs daemon for $MNT"
}

# Weight files (*.safetensors) directly under DIR, sorted.
weight_files() { find "$1" -maxdepth 1 -name '*.safetensors' \( -type f -o -type l \) | sort; }

sum_sizes() { local s=0 f; for f in "$@"; do s=$((s + $(stat -L -c %s "$f"))); done; echo "$s"; }

# read_all FILE...: dd every file to /dev/null with bs=1M; prints the elapsed microseconds.
read_all() {
    local t0 t1 f
    t0=$(now_us)
    for f in "$@"; do
        timeout "$READ_TIMEOUT" dd if="$f" of=/dev/null bs=1M status=none ||
            die "reading $f failed or took over ${READ_TIMEOUT}s (hung daemon?)"
    done
    t1=$(now_us)
    echo $((t1 - t0))
}

max() { printf '%s\n' "$@" | sort -g | tail -n 1; }
gbps() { awk -v b="$1" -v us="$2" 'BEGIN {printf "%.2f", b / (us / 1e6) / 1e9}'; }
fmt_list() { local out="" x; for x in "$@"; do out+="${out:+ }$x"; done; echo "$out"; }
ms() { awk -v us="$1" 'BEGIN {printf "%.0f", us / 1000}'; }
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
pass() { if [[ $1 == 1 ]]; then echo PASS; else echo FAIL; fi; }

rss_anon_kib() { awk '/^RssAnon:/ {print $2}' "/proc/$1/status"; }

# Anything else that could disturb the timings: other ckptfs mounts, load.
OTHERS_START=$(others)
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)

# --- inputs --------------------------------------------------------------------------------------

if [[ ! -f $SMALL/model.safetensors.index.json ]]; then
    note "generating $SMALL (~1 GiB, random bf16)"
    "$PYTHON" "$HERE/gen_checkpoint.py" "$SMALL" >&2
fi
if [[ ! -f $BIG/model.safetensors.index.json ]]; then
    note "generating $BIG (sparse Llama-3-70B shapes)"
    "$PYTHON" "$HERE/gen_checkpoint.py" --sparse-70b "$BIG" >&2
fi

mapfile -t SRC_FILES < <(weight_files "$SMALL")
((${#SRC_FILES[@]} > 0)) || die "no *.safetensors in $SMALL"
SRC_BYTES=$(sum_sizes "${SRC_FILES[@]}")
SRC_NAMES=()
for f in "${SRC_FILES[@]}"; do SRC_NAMES+=("$(basename "$f")"); done

# --- (a) source files, page cache warm -----------------------------------------------------------

note "(a) warm-up read of the source files, then $READ_RUNS timed reads"
read_all "${SRC_FILES[@]}" >/dev/null
A=()
for ((r = 0; r < READ_RUNS; r++)); do
    us=$(read_all "${SRC_FILES[@]}")
    A+=("$(gbps "$SRC_BYTES" "$us")")
done

# --- (b), (c) pass-through hf/: first read on a fresh mount, then a second read -------------------

note "(b)/(c) $READ_RUNS fresh mounts of hf/ (pass-through)"
B=()
C=()
VERIFIED=no
for ((r = 0; r < READ_RUNS; r++)); do
    read_all "${SRC_FILES[@]}" >/dev/null # keep the source hot
    do_mount "$SMALL"
    MNT_FILES=()
    for n in "${SRC_NAMES[@]}"; do MNT_FILES+=("$MNT/hf/$n"); done
    us=$(read_all "${MNT_FILES[@]}")
    B+=("$(gbps "$SRC_BYTES" "$us")")
    us=$(read_all "${MNT_FILES[@]}")
    C+=("$(gbps "$SRC_BYTES" "$us")")
    if [[ $VERIFIED == no ]]; then # once, untimed: hf/ must really be byte-identical
        for n in "${SRC_NAMES[@]}"; do
            cmp -s "$SMALL/$n" "$MNT/hf/$n" || die "$MNT/hf/$n differs from $SMALL/$n"
        done
        VERIFIED=yes
    fi
    unmount
done

# --- (d) re-sharded hf/ (hf_shard_size=256M): first read on a fresh mount ------------------------

note "(d) $READ_RUNS fresh mounts of hf/ with hf_shard_size=256M"
D=()
D_BYTES=0
D_COUNT=0
for ((r = 0; r < READ_RUNS; r++)); do
    read_all "${SRC_FILES[@]}" >/dev/null
    do_mount "$SMALL" hf_shard_size=256M
    timeout "$LS_TIMEOUT" ls -l "$MNT/hf" >/dev/null || die "ls -l $MNT/hf (hf_shard_size=256M) failed or hung"
    mapfile -t RS_FILES < <(weight_files "$MNT/hf")
    ((${#RS_FILES[@]} > 0)) || die "no *.safetensors in the re-sharded $MNT/hf"
    D_BYTES=$(sum_sizes "${RS_FILES[@]}")
    D_COUNT=${#RS_FILES[@]}
    us=$(read_all "${RS_FILES[@]}")
    D+=("$(gbps "$D_BYTES" "$us")")
    unmount
done

# --- mount + ls -lR on the sparse 70B checkpoint ------------------------------------------------

mapfile -t BIG_LIST < <(weight_files "$BIG")
BIG_BYTES=$(sum_sizes "${BIG_LIST[@]}")

# mount_runs OPTS: sets MT (total us), MO (mount-only us), RSS (KiB), NF (files in hf/).
mount_runs() {
    local opts=$1 r t0 t1 t2
    MT=()
    MO=()
    RSS=()
    # One untimed round so the shard headers and the binary are in the page cache.
    do_mount "$BIG" "$opts"
    timeout "$LS_TIMEOUT" ls -lR "$MNT" >/dev/null || die "ls -lR $MNT failed or hung"
    unmount
    for ((r = 0; r < MOUNT_RUNS; r++)); do
        t0=$(now_us)
        if [[ -n $opts ]]; then "$BIN" mount -o "$opts" "$BIG" "$MNT"; else "$BIN" mount "$BIG" "$MNT"; fi ||
            die "ckptfs mount $opts $BIG failed"
        t1=$(now_us)
        if ! timeout "$LS_TIMEOUT" ls -lR "$MNT" >/dev/null; then
            DAEMON_PID=$(find_daemon || true)
            die "ls -lR $MNT failed or hung"
        fi
        t2=$(now_us)
        DAEMON_PID=$(find_daemon) || die "cannot find the ckptfs daemon for $MNT"
        MT+=($((t2 - t0)))
        MO+=($((t1 - t0)))
        kib=$(rss_anon_kib "$DAEMON_PID")
        RSS+=("$kib")
        NF=$(find "$MNT/hf" -maxdepth 1 -name '*.safetensors' | wc -l)
        NE=$(find "$MNT" -mindepth 1 | wc -l)
        VIEWS=$(find "$MNT" -mindepth 1 -maxdepth 1 -printf '%f/ ' | tr ' ' '\n' | sort | tr '\n' ' ')
        unmount
    done
}

note "mount + ls -lR of the sparse 70B checkpoint, pass-through, $MOUNT_RUNS runs"
mount_runs ""
# shellcheck disable=SC2034 # read through namerefs in report_mount
P_MT=("${MT[@]}") P_MO=("${MO[@]}") P_RSS=("${RSS[@]}") P_NF=$NF P_NE=$NE
note "mount + ls -lR of the sparse 70B checkpoint, hf_shard_size=5G, $MOUNT_RUNS runs"
mount_runs hf_shard_size=5G
# shellcheck disable=SC2034
S_MT=("${MT[@]}") S_MO=("${MO[@]}") S_RSS=("${RSS[@]}") S_NF=$NF S_NE=$NE

# --- report --------------------------------------------------------------------------------------

A_MED=$(median "${A[@]}")
ratio() { awk -v x="$1" -v a="$A_MED" 'BEGIN {printf "%.2f", x / a}'; }
B_MED=$(median "${B[@]}")
C_MED=$(median "${C[@]}")
D_MED=$(median "${D[@]}")
B_OK=$(awk -v x="$(ratio "$B_MED")" -v t="$TARGET_B_RATIO" 'BEGIN {print (x >= t) ? 1 : 0}')

BUILD_TYPE=$(build_type "$BIN")

echo
echo "ckptfs hf/ benchmark   $(date '+%Y-%m-%d %H:%M')   $(uname -r), $(nproc) CPUs"
echo "binary: $BIN   (CMAKE_BUILD_TYPE: $BUILD_TYPE)"
OTHERS_END=$(others)
warn_others "$OTHERS_START" "$OTHERS_END"
echo "load average: $LOAD_START at start, $(cut -d' ' -f1 /proc/loadavg) at end"
echo
echo "Read throughput: $SMALL, ${#SRC_FILES[@]} weight files, $SRC_BYTES bytes."
echo "dd bs=1M of every *.safetensors to /dev/null; source already in the page cache (read once"
echo "before the runs and again before each mount). GB/s = 1e9 bytes/s; median of $READ_RUNS, runs listed."
printf '%-46s %7s %8s  %-12s %s\n' "" "GB/s" "vs (a)" "target" "runs (GB/s)"
printf '%-46s %7s %8s  %-12s %s\n' "(a) source files, direct" "$A_MED" "1.00" "" "$(fmt_list "${A[@]}")"
printf '%-46s %7s %8s  %-12s %s\n' "(b) MNT/hf first read, fresh mount" "$B_MED" "$(ratio "$B_MED")" \
    ">=0.50 $(pass "$B_OK")" "$(fmt_list "${B[@]}")"
printf '%-46s %7s %8s  %-12s %s\n' "(c) MNT/hf second read, same mount" "$C_MED" "$(ratio "$C_MED")" "" \
    "$(fmt_list "${C[@]}")"
printf '%-46s %7s %8s  %-12s %s\n' "(d) hf_shard_size=256M first read, fresh mount" "$D_MED" \
    "$(ratio "$D_MED")" "" "$(fmt_list "${D[@]}")"
echo "    (d) reads $D_COUNT re-sharded files, $D_BYTES bytes; (b) was checked byte-identical with cmp."
echo
echo "Mount time + daemon memory: $BIG"
echo "(${#BIG_LIST[@]} sparse shards, $BIG_BYTES bytes logical). Time from starting 'ckptfs mount' to the"
echo "end of 'ls -lR MNT'; median of $MOUNT_RUNS after one untimed warm-up; RssAnon of the daemon right"
echo "after ls -lR, largest of the $MOUNT_RUNS runs. entries = everything ls -lR lists; views:"
echo "  ${VIEWS% }"
printf '%-18s %8s %7s %12s %8s %11s  %-25s %s\n' "" "hf files" "entries" "mount+ls ms" "(mount)" "RssAnon MiB" \
    "target" "runs (ms)"
report_mount() {
    local label=$1 nf=$2 ne=$3 mt mo rss ok_t ok_r t out=""
    shift 3
    local -n _mt=$1 _mo=$2 _rss=$3
    mt=$(median "${_mt[@]}")
    mo=$(median "${_mo[@]}")
    rss=$(max "${_rss[@]}")
    ok_t=$(awk -v x="$mt" -v t="$TARGET_MOUNT_MS" 'BEGIN {print (x / 1000 < t) ? 1 : 0}')
    ok_r=$((rss < TARGET_RSS_KIB ? 1 : 0))
    for t in "${_mt[@]}"; do out+="${out:+ }$(ms "$t")"; done
    printf '%-18s %8s %7s %12s %8s %11s  %-25s %s\n' "$label" "$nf" "$ne" "$(ms "$mt")" "($(ms "$mo"))" \
        "$(mib "$rss")" "<300ms $(pass "$ok_t"), <64MiB $(pass "$ok_r")" "$out"
}
report_mount "pass-through" "$P_NF" "$P_NE" P_MT P_MO P_RSS
report_mount "hf_shard_size=5G" "$S_NF" "$S_NE" S_MT S_MO S_RSS
