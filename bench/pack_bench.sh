#!/usr/bin/env bash
# ckptfs pack benchmark: what `ckptfs pack` saves, what it costs to write, what reading a packed
# checkpoint costs, and what it gains on slow storage. One run, figures side by side:
#  (1) size: packed/original of a ~1 GiB Llama-shaped checkpoint with normal(0, 0.02) weights
#      (bench/gen_normal.py) as bf16, as fp32 holding the bf16 values, as true fp32 values; for
#      zstd levels 1 and 3 and lz4 (frame 2M); and of the Megatron-LM test checkpoints (legacy
#      llama-tp2pp2-torch with its optimizer state, torch_dist llama-tp2pp2-torch_dist) for zstd
#      and lz4. Target: bf16 <= 0.72 with zstd.
#  (2) pack cost: GB/s of input (wall, and per CPU second) and peak RSS (/usr/bin/time -v) of every
#      pack of (1), all with PACK_THREADS threads, plus the bf16 zstd-1 pack with frame=8M: memory
#      follows the frame (about 5 x frame x threads), not the file size.
#  (3) reads of the packed bf16 checkpoint as pack writes it by default (zstd level 1, frame 2M:
#      "zstd-1"), and of the lz4 pack ("lz4"), against the raw one ("raw"): one reader,
#      `cat MNT/hf/*.safetensors > /dev/null`, on a fresh mount (source files in the page cache,
#      the daemon's frame cache empty): GB/s of output (wall, and per second of daemon CPU, all its
#      threads) and the daemon's VmHWM. The packed ones twice: with the default -o prefetch=auto
#      (decoder threads decode the frames 16 MiB ahead of the sequential reader) and with
#      -o prefetch=0 ("zstd-1/sync", "lz4/sync": each frame decoded on the FUSE thread that reads
#      it). Then the same without FUSE for raw, zstd-1 and lz4: `ckptfs cat SRC hf/SHARD >
#      /dev/null` per shard (the engine alone, one thread, no prefetch; its max RSS).
#  (3b) one decoder thread, stage by stage: bench/frame_bench (FRAME_BENCH) over the packed
#      *.safetensors of zstd-1 and of lz4, in the page cache, best of 5 rounds (--quick 3): GB/s of
#      original bytes per second of one thread for reading the stored bytes, decompressing, undoing
#      the byte planes, the checksum, and all of them (ckptfs_frame_decode with its read). Targets,
#      on that "all" figure (bytes out, per thread): >= 1 GB/s zstd, >= 2 GB/s lz4. The lines under
#      (3) give it with the context: the codec alone (perf, (5)), the engine and FUSE per CPU second.
#      Without the binary the rows say "not measured" and the rest runs.
#  (4) throttled storage: `cp -r MNT/tp2pp2 DEST` on a fresh mount, source warm (page cache),
#      cold (its files evicted), and cold with the daemon's reads of the source's block device
#      limited to each of THROTTLE_BPS (cgroup v1 blkio.throttle.read_bps_device; the daemon, found with
#      find_daemon, is moved into a blkio cgroup the script creates); seconds raw vs packed and the
#      speedup. Bytes the daemon read from the device come from the cgroup's io_service_bytes;
#      "io s" = those bytes / the limit. One untimed copy first (the VM's first touch of memory).
#      The runs go mode by mode, raw / zstd-1 / lz4 / zstd-1/sync (prefetch=0) in turn: zstd-1 vs
#      zstd-1/sync is what decoding ahead gives on slow storage.
#  (5) where the daemon's CPU goes on the packed reads of (3), zstd-1 and lz4 with the default
#      prefetch (perf record -e cpu-clock, an extra read), grouped: codec, unshuffle, checksum
#      (XXH3), memcpy, page faults, kernel copies; if perf is installed and PERF=1.
# A summary table of every ratio ends the output.
#
#   bench/pack_bench.sh [--quick]
#
# --quick: READ_RUNS=3 and CP_RUNS=1 unless set (about 2.5 minutes on 2 CPUs once the inputs exist;
# the first run generates them: ~40 s, 5.5 GB in $DATA_DIR, kept).
#
# Needs root (drop/evict caches, blkio cgroup), /dev/fuse, fusermount3, GNU /usr/bin/time, dd,
# fincore, /usr/bin/python3 with numpy (the generator). Builds nothing: frame_bench comes with the
# CMake build (tests enabled, the default) as <builddir>/bench/frame_bench.
#
# Environment:
#   CKPTFS_BIN    the binary (default: <repo>/build/ckptfs)
#   FRAME_BENCH   the frame_bench binary of (3b) (default: $(dirname CKPTFS_BIN)/bench/frame_bench)
#   BENCH_DIR     work dir (default /tmp/ckptfs-bench); the run uses pack-run.XXXXXX/ below it
#   DATA_DIR      the generated inputs bf16/, fp32/, fp32-true/ (default $BENCH_DIR/pack-normal)
#   MEGATRON_DIR  Megatron-LM-written checkpoints (default <repo>/tests/data/megatron-core-0.17.1)
#   PACK_THREADS  pack's threads= (default 2)
#   READ_RUNS     runs of each read of (3) (default 5, --quick 3; median shown)
#   CP_RUNS       runs of each cp of (4) (default 3, --quick 1; median shown)
#   THROTTLE_BPS  read limits of (4) in bytes/s, space-separated (default "500000000 250000000")
#   EVICT         how (4) makes the source cold: "files" (default: POSIX_FADV_DONTNEED on the
#                 source's files with dd iflag=nocache, checked with fincore; other sessions'
#                 page cache is left alone) or "drop_caches" (echo 3 > /proc/sys/vm/drop_caches)
#   CP_DEST_DIR   where (4) copies to (default: the run directory, on $BENCH_DIR's disk)
#   PERF          1: run (5) when perf is installed (default 1)
#   PYTHON        python with numpy (default /usr/bin/python3)
#   READ_TIMEOUT, CP_TIMEOUT, PACK_TIMEOUT  seconds allowed per read / cp / pack
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
QUICK=0
for a in "$@"; do
    case $a in
    --quick) QUICK=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
    esac
done
BIN=${CKPTFS_BIN:-$REPO/build/ckptfs}
BENCH_DIR=${BENCH_DIR:-/tmp/ckptfs-bench}
DATA_DIR=${DATA_DIR:-$BENCH_DIR/pack-normal}
MEGATRON_DIR=${MEGATRON_DIR:-$REPO/tests/data/megatron-core-0.17.1}
PACK_THREADS=${PACK_THREADS:-2}
READ_RUNS=${READ_RUNS:-$( ((QUICK)) && echo 3 || echo 5)}
CP_RUNS=${CP_RUNS:-$( ((QUICK)) && echo 1 || echo 3)}
THROTTLE_BPS=${THROTTLE_BPS:-500000000 250000000}
EVICT=${EVICT:-files}
PERF=${PERF:-1}
PYTHON=${PYTHON:-/usr/bin/python3}
READ_TIMEOUT=${READ_TIMEOUT:-300}
CP_TIMEOUT=${CP_TIMEOUT:-600}
PACK_TIMEOUT=${PACK_TIMEOUT:-900}

# Targets.
TARGET_BF16_ZSTD=0.72
TARGET_ZSTD_GBPS=1
TARGET_LZ4_GBPS=2

BENCH_NAME=pack_bench BENCH_NOTE_TIME=1
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"

[[ -x $BIN ]] || die "no ckptfs binary at $BIN (build it or set CKPTFS_BIN)"
BIN=$(readlink -f "$BIN")
FRAME_BENCH=${FRAME_BENCH:-$(dirname "$BIN")/bench/frame_bench}
FB_WHY="" # why (3b) was not measured
if [[ -x $FRAME_BENCH ]]; then
    FRAME_BENCH=$(readlink -f "$FRAME_BENCH")
else
    FB_WHY="no frame_bench at $FRAME_BENCH (built with the tests, the default; or set FRAME_BENCH)"
fi
FB_ROUNDS=$( ((QUICK)) && echo 3 || echo 5)
[[ $(id -u) == 0 ]] || die "needs root (evicting the page cache, the blkio cgroup)"
command -v fusermount3 >/dev/null || die "fusermount3 not found"
[[ -e /dev/fuse ]] || die "/dev/fuse missing"
[[ -x /usr/bin/time ]] || die "/usr/bin/time (GNU time, for max RSS) not found"
command -v fincore >/dev/null || die "fincore (util-linux) not found"
"$PYTHON" -c 'import numpy' 2>/dev/null || die "$PYTHON lacks numpy"
[[ $EVICT == files || $EVICT == drop_caches ]] || die "EVICT must be files or drop_caches"
((READ_RUNS >= 1 && CP_RUNS >= 1)) || die "READ_RUNS and CP_RUNS must be >= 1"
for s in llama-tp2pp2-torch llama-tp2pp2-torch_dist; do
    [[ -d $MEGATRON_DIR/$s ]] || die "no $MEGATRON_DIR/$s (set MEGATRON_DIR)"
done

mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd -P)

# --- cleanup -------------------------------------------------------------------------------------

RUN_DIR=$(mktemp -d "$BENCH_DIR/pack-run.XXXXXX")
MNT=$RUN_DIR/mnt
mkdir "$MNT"
CP_DEST_DIR=${CP_DEST_DIR:-$RUN_DIR}
DAEMON_PID=""
PERF_PID=""
CG_ROOT=/sys/fs/cgroup/blkio
CG_LIM=$CG_ROOT/ckptfs-pack-bench.$$.limited # .1, .2, ...: one per limit
CG_FREE=$CG_ROOT/ckptfs-pack-bench.$$.unlimited


cg_remove() { # DIR: moves what is left in it to the root cgroup, then removes it
    local pid
    [[ -d $1 ]] || return 0
    while read -r pid; do
        if [[ -n $pid ]]; then echo "$pid" >"$CG_ROOT/cgroup.procs" 2>/dev/null || true; fi
    done <"$1/cgroup.procs"
    rmdir "$1" 2>/dev/null || note "could not remove cgroup $1"
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    if [[ -n $PERF_PID ]] && alive "$PERF_PID"; then
        kill -INT "$PERF_PID" 2>/dev/null || true
        wait_gone "$PERF_PID" 10 || kill "$PERF_PID" 2>/dev/null || true
    fi
    unmount
    for cg in "$CG_LIM".*; do cg_remove "$cg"; done
    cg_remove "$CG_FREE"
    rm -rf --one-file-system "$RUN_DIR"
    [[ $CP_DEST_DIR == "$RUN_DIR" ]] || rm -rf --one-file-system "$CP_DEST_DIR"/pack-bench-cp.$$
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

# --- helpers -------------------------------------------------------------------------------------

max() { printf '%s\n' "$@" | sort -g | tail -n 1; }
secs() { awk -v us="$1" 'BEGIN {printf "%.2f", us / 1e6}'; }
gbps() { awk -v b="$1" -v us="$2" 'BEGIN {printf "%.2f", (us > 0) ? b / us / 1e3 : 0}'; } # BYTES US
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", (b > 0) ? a / b : 0}'; }
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
list_gbps() { local b=$1 out="" x; shift; for x in "$@"; do out+="${out:+ }$(gbps "$b" "$x")"; done; echo "$out"; }
list_s() { local out="" x; for x in "$@"; do out+="${out:+ }$(secs "$x")"; done; echo "$out"; }
shards_in() { find "$1" -maxdepth 1 -type f -name '*.safetensors' | sort; }
warm() { find "$1" -type f -exec cat {} + >/dev/null; } # DIR: every file into the page cache
CLK_TCK=$(getconf CLK_TCK)
cpu_us() { awk -v t="$CLK_TCK" '{printf "%.0f\n", ($14 + $15) * 1e6 / t}' "/proc/$1/stat"; } # PID: utime+stime

# evict DIR: the page cache of DIR's files goes (EVICT=files), or all of it (EVICT=drop_caches);
# fails if more than 1% of DIR's bytes are still cached.
evict() {
    local f cached total
    if [[ $EVICT == drop_caches ]]; then
        sync
        echo 3 >/proc/sys/vm/drop_caches
    else
        while IFS= read -r -d '' f; do
            dd if="$f" iflag=nocache count=0 status=none
        done < <(find "$1" -type f -print0)
    fi
    cached=$(find "$1" -type f -exec fincore --bytes --noheadings --output RES {} + | awk '{s+=$1} END {printf "%.0f\n", s}')
    total=$(bytes_of "$1")
    ((cached * 100 <= total)) || die "could not evict $1 from the page cache ($cached of $total bytes still cached)"
}

# mount_src SRC [OPTS]: a fresh mount of SRC on $MNT; sets DAEMON_PID.
mount_src() {
    unmount
    "$BIN" mount ${2:+-o "$2"} "$1" "$MNT" || die "ckptfs mount ${2:+-o $2 }$1 failed"
    is_mounted "$MNT" || die "ckptfs mount returned but $MNT is not mounted"
    DAEMON_PID=$(find_daemon) || die "cannot find the ckptfs daemon for $MNT"
}

OTHERS_START=$(others)
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
T_START=$(now_us)

# --- inputs --------------------------------------------------------------------------------------

if [[ ! -d $DATA_DIR/bf16 || ! -d $DATA_DIR/fp32 || ! -d $DATA_DIR/fp32-true ]]; then
    note "generating the inputs in $DATA_DIR (bench/gen_normal.py: 1.1 GB bf16 + 2 x 2.2 GB fp32, ~40 s)"
    mkdir -p "$DATA_DIR"
    gen=()
    for k in bf16 fp32 fp32-true; do [[ -d $DATA_DIR/$k ]] || gen+=("--$k" "$DATA_DIR/$k"); done
    "$PYTHON" "$HERE/gen_normal.py" "${gen[@]}" >&2 || die "gen_normal.py failed"
fi
BF16=$DATA_DIR/bf16
for k in bf16 fp32 fp32-true; do
    [[ -f $DATA_DIR/$k/model.safetensors.index.json ]] || die "$DATA_DIR/$k is incomplete; remove it to regenerate"
done
declare -A DATA_LABEL=(
    [bf16]="bf16 normal(0,0.02)"
    [fp32]="fp32 = bf16 values widened"
    [fp32-true]="fp32 true normal(0,0.02)"
    [mlegacy]="Megatron legacy tp2pp2 (+optim)"
    [mdist]="Megatron torch_dist tp2pp2"
)
declare -A DATA_SRC=([bf16]=$BF16 [fp32]=$DATA_DIR/fp32 [fp32-true]=$DATA_DIR/fp32-true
    [mlegacy]=$MEGATRON_DIR/llama-tp2pp2-torch [mdist]=$MEGATRON_DIR/llama-tp2pp2-torch_dist)
ENTROPY=$("$PYTHON" "$HERE/gen_normal.py" --entropy "$(shards_in "$BF16" | sed -n 2p)") || ENTROPY="?"
ENTROPY=${ENTROPY#entropy: }

# --- (1) + (2): pack ------------------------------------------------------------------------------

mkdir "$RUN_DIR/packed"
PACK_ROWS=()         # printed lines of the pack table
declare -A RATIO=()  # DATA/CODEC -> packed/original
declare -A PK_GBPS=() PK_RSS=()

# pack_one DATA CODEC LEVEL FRAME KEEP: packs DATA_SRC[DATA]; records the ratio, GB/s and RSS;
# keeps the output in $RUN_DIR/packed/DATA-CODEC-FRAME if KEEP is 1.
pack_one() {
    local data=$1 codec=$2 level=$3 frame=$4 keep=$5 src dest name tf in out wall user sys rss line classes
    src=${DATA_SRC[$data]}
    name=$codec
    [[ $codec != zstd ]] || name+="-$level"
    dest=$RUN_DIR/packed/$data-$name-$frame
    note "(1) pack $data $name frame=$frame"
    warm "$src"
    tf=$RUN_DIR/pack.time
    timeout "$PACK_TIMEOUT" /usr/bin/time -f '%e %U %S %M' -o "$tf" \
        "$BIN" pack -o "codec=$codec,level=$level,frame=$frame,threads=$PACK_THREADS" "$src" "$dest" \
        2>"$RUN_DIR/pack.err" || { cat "$RUN_DIR/pack.err" >&2; die "ckptfs pack $src failed or took over ${PACK_TIMEOUT}s"; }
    read -r wall user sys rss <"$tf"
    in=$(bytes_of "$src") out=$(bytes_of "$dest")
    line=$(grep '^pack: ' "$RUN_DIR/pack.err" | tail -n 1)
    classes=$(sed -n 's/.*ratio by class: //p' <<<"$line")
    RATIO[$data/$name/$frame]=$(ratio "$out" "$in")
    PK_GBPS[$data/$name/$frame]=$(awk -v b="$in" -v s="$wall" 'BEGIN {printf "%.2f", b / s / 1e9}')
    PK_RSS[$data/$name/$frame]=$rss
    PACK_ROWS+=("$(printf '    %-33s %-7s %5s %13s %13s %6s %6s %6s %6s %7s  %s' "${DATA_LABEL[$data]}" "$name" "$frame" \
        "$in" "$out" "${RATIO[$data/$name/$frame]}" "$wall" "${PK_GBPS[$data/$name/$frame]}" \
        "$(awk -v b="$in" -v c="$user" -v s="$sys" 'BEGIN {printf "%.2f", b / (c + s) / 1e9}')" "$(mib "$rss")" "$classes")")
    ((keep)) || rm -rf "$dest"
}

for data in bf16 fp32 fp32-true; do
    keep=0
    [[ $data != bf16 ]] || keep=1 # (3), (3b) and (4) read these
    pack_one "$data" zstd 1 2M "$keep"
    pack_one "$data" zstd 3 2M 0
    pack_one "$data" lz4 1 2M "$keep"
    [[ $data == bf16 ]] && pack_one bf16 zstd 1 8M 0
done
for data in mlegacy mdist; do
    pack_one "$data" zstd 3 2M 0
    pack_one "$data" lz4 1 2M 0
done
PK_Z1=$RUN_DIR/packed/bf16-zstd-1-2M
PK_LZ4=$RUN_DIR/packed/bf16-lz4-2M

# --- (3) reads: FUSE and the engine alone ---------------------------------------------------------

# The packed variants are read with the default prefetch (decoder threads decode frames ahead of
# a sequential reader) and as "V/sync" with -o prefetch=0 (each frame decoded on the FUSE thread
# that reads it). ckptfs cat (the engine alone) does not prefetch: ENGINE_VARIANTS only.
declare -A VSRC=([raw]=$BF16 [zstd-1]=$PK_Z1 [lz4]=$PK_LZ4 [zstd-1/sync]=$PK_Z1 [lz4/sync]=$PK_LZ4)
declare -A VOPT=([raw]="" [zstd-1]="" [lz4]="" [zstd-1/sync]="prefetch=0" [lz4/sync]="prefetch=0")
declare -A VLABEL=([raw]=raw [zstd-1]="zstd-1 (prefetch=auto)" [lz4]="lz4 (prefetch=auto)"
    [zstd-1/sync]="zstd-1/sync (prefetch=0)" [lz4/sync]="lz4/sync (prefetch=0)")
VARIANTS=(raw zstd-1 lz4 zstd-1/sync)
READ_VARIANTS=(raw zstd-1 lz4 zstd-1/sync lz4/sync)
ENGINE_VARIANTS=(raw zstd-1 lz4)
is_engine_variant() { [[ " ${ENGINE_VARIANTS[*]} " == *" $1 "* ]]; }
mapfile -t SHARDS < <(shards_in "$BF16")
SHARD_NAMES=("${SHARDS[@]##*/}")
READ_BYTES=$(bytes_of "${SHARDS[@]}")

note "(3) check (untimed): MNT/hf of the packed checkpoints equals the source"
for v in zstd-1 lz4; do
    warm "${VSRC[$v]}"
    mount_src "${VSRC[$v]}"
    for s in "${SHARD_NAMES[@]}"; do
        cmp "$MNT/hf/$s" "$BF16/$s" || die "$v: $MNT/hf/$s differs from $BF16/$s"
    done
    unmount
done

declare -A R_WALL=() R_CPU=() R_HWM=() E_WALL=() E_CPU=() E_RSS=()
for ((r = 0; r < READ_RUNS; r++)); do
    for v in "${READ_VARIANTS[@]}"; do
        note "(3) run $((r + 1)) of $READ_RUNS: ${VLABEL[$v]}"
        src=${VSRC[$v]} opt=${VOPT[$v]}
        warm "$src"
        mount_src "$src" "$opt"
        c0=$(cpu_us "$DAEMON_PID") t0=$(now_us)
        (cd "$MNT/hf" && timeout "$READ_TIMEOUT" cat "${SHARD_NAMES[@]}" >/dev/null) || die "reading $MNT/hf failed or took over ${READ_TIMEOUT}s"
        t1=$(now_us) c1=$(cpu_us "$DAEMON_PID")
        R_WALL[$v]+="$((t1 - t0)) " R_CPU[$v]+="$((c1 - c0)) " R_HWM[$v]+="$(status_kib "$DAEMON_PID" VmHWM) "
        unmount
        is_engine_variant "$v" || continue
        # The engine alone: ckptfs cat of each shard (process start and opening the source included).
        t0=$(now_us)
        timeout "$READ_TIMEOUT" /usr/bin/time -f '%U %S %M' -o "$RUN_DIR/cat.time" bash -c '
            bin=$1 src=$2; shift 2
            for s in "$@"; do "$bin" cat "$src" "hf/$s" >/dev/null || exit 1; done' _ "$BIN" "$src" "${SHARD_NAMES[@]}" ||
            die "ckptfs cat $src failed or took over ${READ_TIMEOUT}s"
        t1=$(now_us)
        E_WALL[$v]+="$((t1 - t0)) " E_CPU[$v]+="$(awk '{printf "%.0f", ($1 + $2) * 1e6}' "$RUN_DIR/cat.time") "
        E_RSS[$v]+="$(awk '{print $3}' "$RUN_DIR/cat.time") "
    done
done

# --- (3b) one decoder thread, stage by stage (frame_bench) ------------------------------------------

declare -A FB_ALL=() FB_CODEC=() # zstd-1 / lz4 -> GB/s (frame_bench "all (frame_decode)", "decompress")
FB_OUT=()
if [[ -z $FB_WHY ]]; then
    for v in zstd-1 lz4; do
        note "(3b) frame_bench --rounds $FB_ROUNDS on $v"
        warm "${VSRC[$v]}"
        mapfile -t files < <(shards_in "${VSRC[$v]}")
        if ! timeout "$READ_TIMEOUT" "$FRAME_BENCH" --rounds "$FB_ROUNDS" "${files[@]}" >"$RUN_DIR/fb.out" 2>"$RUN_DIR/fb.err"; then
            note "(3b) frame_bench failed on $v: $(tr '\n' ' ' <"$RUN_DIR/fb.err")"
            FB_OUT+=("$v: frame_bench failed or took over ${READ_TIMEOUT}s: $(tr '\n' ' ' <"$RUN_DIR/fb.err")")
            continue
        fi
        while IFS= read -r line; do # its title line ("frame_bench: GB/s of ...") is in (3b)'s own
            [[ $line == frame_bench:* ]] || FB_OUT+=("$(printf '%-7s %s' "$v:" "$line")")
        done <"$RUN_DIR/fb.out"
        codec=${v%%-*} # the line of this codec: "zstd ..." / "lz4 ..."
        line=$(awk -v c="$codec" '$1 == c' "$RUN_DIR/fb.out")
        FB_ALL[$v]=$(sed -n 's/.* all (frame_decode) \([0-9.]*\).*/\1/p' <<<"$line")
        FB_CODEC[$v]=$(sed -n 's/.* decompress \([0-9.]*\).*/\1/p' <<<"$line")
        [[ -n ${FB_ALL[$v]} ]] || { unset "FB_ALL[$v]"; FB_OUT+=("$v: no \"$codec\" line with an \"all (frame_decode)\" figure"); }
    done
else
    note "(3b) not measured: $FB_WHY"
fi

# --- (4) cp -r MNT/tp2pp2: warm, cold, cold + throttled -------------------------------------------

DEV_NUM=$(stat -c %d "$(shards_in "$BF16" | head -n 1)")
MAJMIN="$(((DEV_NUM >> 8) & 0xfff)):$(((DEV_NUM & 0xff) | ((DEV_NUM >> 12) & 0xfff00)))"
THROTTLE_WHY=""
if [[ ! -e /sys/dev/block/$MAJMIN ]]; then
    THROTTLE_WHY="the filesystem of $BF16 is on device $MAJMIN, which is not a block device (overlay, tmpfs, btrfs subvolume, network?): blkio cannot limit it"
elif [[ -e /sys/dev/block/$MAJMIN/partition ]]; then
    MAJMIN=$(cat "/sys/dev/block/$MAJMIN/../dev") # blk-throttle limits whole disks
fi
DEV_NAME=$(basename "$(readlink -f "/sys/dev/block/$MAJMIN" 2>/dev/null)" 2>/dev/null || echo "?")
if [[ -z $THROTTLE_WHY ]]; then
    if [[ ! -f $CG_ROOT/blkio.throttle.read_bps_device ]]; then
        THROTTLE_WHY="no cgroup v1 blkio controller with throttling at $CG_ROOT"
    elif ! mkdir "$CG_FREE" 2>/dev/null; then
        THROTTLE_WHY="cannot create a cgroup under $CG_ROOT"
    fi
fi
MODES=(warm cold)
declare -A MODE_CG=([warm]="" [cold]=$CG_FREE) MODE_LABEL=([warm]=warm [cold]=cold) MODE_BPS=()
if [[ -z $THROTTLE_WHY ]]; then
    i=0
    for bps in $THROTTLE_BPS; do
        i=$((i + 1))
        if ! mkdir "$CG_LIM.$i" 2>/dev/null; then
            THROTTLE_WHY="cannot create a cgroup under $CG_ROOT"
            break
        elif ! echo "$MAJMIN $bps" >"$CG_LIM.$i/blkio.throttle.read_bps_device" 2>/dev/null; then
            THROTTLE_WHY="the kernel refused read_bps_device $MAJMIN $bps"
            break
        fi
        MODES+=("thr$i")
        MODE_CG[thr$i]=$CG_LIM.$i
        MODE_LABEL[thr$i]=$(awk -v b="$bps" 'BEGIN {printf "%.2f GB/s", b / 1e9}')
        MODE_BPS[thr$i]=$bps
    done
fi
[[ -z $THROTTLE_WHY ]] || note "(4) no throttled runs: $THROTTLE_WHY"
dev_read() { awk -v d="$MAJMIN" '$1 == d && $2 == "Read" {print $3; f = 1} END {if (!f) print 0}' "$1/blkio.throttle.io_service_bytes"; }

declare -A C_WALL=() C_DEV=() C_CPU=()
CP_BYTES=""
CP_OUT=$CP_DEST_DIR/pack-bench-cp.$$
# One untimed copy first: on a VM the first write of 1.1 GB into fresh page cache is much slower
# (first touch of guest memory) than the later ones, which reuse the freed pages.
note "(4) untimed warm-up copy"
warm "$BF16"
mount_src "$BF16"
timeout "$CP_TIMEOUT" cp -r "$MNT/tp2pp2" "$CP_OUT" || die "cp -r $MNT/tp2pp2 failed or took over ${CP_TIMEOUT}s"
unmount
for ((r = 0; r < CP_RUNS; r++)); do
    for mode in "${MODES[@]}"; do
        for v in "${VARIANTS[@]}"; do
            note "(4) run $((r + 1)) of $CP_RUNS: ${MODE_LABEL[$mode]} $v"
            src=${VSRC[$v]}
            rm -rf "$CP_OUT"
            unmount
            if [[ $mode == warm ]]; then warm "$src"; else evict "$src"; fi
            mount_src "$src" "${VOPT[$v]}"
            cg=${MODE_CG[$mode]}
            [[ -d $cg ]] || cg=""
            d0=0
            if [[ -n $cg ]]; then
                echo "$DAEMON_PID" >"$cg/cgroup.procs" || die "cannot move the daemon $DAEMON_PID into $cg"
                d0=$(dev_read "$cg")
            fi
            c0=$(cpu_us "$DAEMON_PID") t0=$(now_us)
            timeout "$CP_TIMEOUT" cp -r "$MNT/tp2pp2" "$CP_OUT" || die "cp -r $MNT/tp2pp2 failed or took over ${CP_TIMEOUT}s"
            t1=$(now_us) c1=$(cpu_us "$DAEMON_PID")
            d1=0
            [[ -n $cg ]] && d1=$(dev_read "$cg")
            C_WALL[$mode/$v]+="$((t1 - t0)) " C_CPU[$mode/$v]+="$((c1 - c0)) " C_DEV[$mode/$v]+="$((d1 - d0)) "
            [[ -n $CP_BYTES ]] || CP_BYTES=$(bytes_of "$CP_OUT")
            unmount
        done
    done
done
rm -rf "$CP_OUT"

# --- (5) perf of the packed read ------------------------------------------------------------------

PERF_OUT=()
declare -A CODEC_GBPS=()
if [[ $PERF == 1 ]] && command -v perf >/dev/null; then
    for v in zstd-1 lz4; do
        note "(5) perf record of the daemon while reading $v"
        pf=$RUN_DIR/perf.${v//\//_} # no slash in a file name
        warm "${VSRC[$v]}"
        mount_src "${VSRC[$v]}" "${VOPT[$v]}"
        perf record -q -e cpu-clock -F 2000 -p "$DAEMON_PID" -o "$pf" >/dev/null 2>&1 &
        PERF_PID=$!
        sleep 0.5
        c0=$(cpu_us "$DAEMON_PID")
        (cd "$MNT/hf" && timeout "$READ_TIMEOUT" cat "${SHARD_NAMES[@]}" >/dev/null) || die "reading $MNT/hf failed"
        c1=$(cpu_us "$DAEMON_PID")
        kill -INT "$PERF_PID" 2>/dev/null || true
        wait "$PERF_PID" 2>/dev/null || true
        PERF_PID=""
        unmount
        # "percent<TAB>dso<TAB>[.]/[k]<TAB>symbol", largest first.
        perf report -i "$pf" --stdio --no-children --sort dso,sym 2>/dev/null |
            awk '/^ +[0-9.]+%/ {p = $1; sub(/%/, "", p); d = $2; k = $3; $1 = $2 = $3 = ""; sub(/^ +/, ""); print p "\t" d "\t" k "\t" $0}' |
            sort -t$'\t' -k1,1 -gr >"$pf.txt" || true
        [[ -s $pf.txt ]] || { PERF_OUT+=("$v: no samples (perf report failed)"); continue; }
        # Grouped: the codec (libzstd / liblz4), unshuffle (byte planes), checksum (libxxhash),
        # user-space memcpy (frame cache -> FUSE buffer), kernel page faults (fresh memory: the frame
        # cache's new frames, buffers), kernel copies (pread of the container, /dev/fuse), the rest.
        grouped=$(awk -F'\t' '
            { d = $2; k = ($3 == "[k]"); s = $4
              if (d ~ /libzstd|liblz4/) g = "codec"
              else if (s ~ /unshuffle/) g = "unshuffle"
              else if (d ~ /xxhash/ || s ~ /XXH/) g = "checksum"
              else if (!k && s ~ /mem(cpy|move)/) g = "memcpy"
              else if (k && s ~ /clear_page|page_fault|do_anonymous|handle_mm_fault|alloc_.*pages|get_page_from_freelist|__list_del_entry|memcg|charge|lruvec|lock_vma|unmap_page_range|free_.*page|zap_|pte|folio_add|rmqueue/) g = "faults"
              else if (k && s ~ /copy|memcpy|memmove|gup_|iov_iter/) g = "kcopy"
              else if (k) g = "kother"
              else g = "other"
              t[g] += $1 }
            END { n = split("codec unshuffle checksum memcpy faults kcopy kother other", o, " ")
                  split("codec;unshuffle;checksum;memcpy (user);page faults (kernel);copies (kernel: pread, /dev/fuse);kernel other;other", l, ";")
                  for (i = 1; i <= n; i++) printf "%s%s %.1f%%", (i > 1 ? ", " : ""), l[i], t[o[i]]
                  printf "\t%.4f\n", t["codec"] / 100 }' "$pf.txt")
        frac=${grouped##*$'\t'}
        # The codec's share applied to (3)'s median daemon CPU (perf itself slows the daemon down).
        read -r -a c <<<"${R_CPU[$v]}"
        cm=$(median "${c[@]}")
        CODEC_GBPS[$v]=$(awk -v b="$READ_BYTES" -v c="$cm" -v f="$frac" 'BEGIN {printf "%.2f", (c * f > 0) ? b / (c * f) / 1e3 : 0}')
        PERF_OUT+=("$v: daemon CPU $(secs $((c1 - c0))) s under perf ($(secs "$cm") s in (3)) for $READ_BYTES bytes:")
        PERF_OUT+=("    ${grouped%$'\t'*}")
        PERF_OUT+=("    the codec alone: ${CODEC_GBPS[$v]} GB/s per CPU second (its share x (3)'s daemon CPU); top symbols:")
        while IFS=$'\t' read -r p d k sym; do
            PERF_OUT+=("$(printf '    %6.1f%%  %-22s %s %s' "$p" "$d" "$k" "$sym")")
        done < <(head -n 10 "$pf.txt")
    done
fi

# --- report --------------------------------------------------------------------------------------

BUILD_TYPE=$(build_type "$BIN")
GIT=$(tree_state "$REPO")
CPU_MODEL=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)

echo
echo "ckptfs pack benchmark$( ((QUICK)) && echo " (--quick)")   $(date '+%Y-%m-%d %H:%M')   $(uname -r), $(nproc) CPUs ($CPU_MODEL), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $(secs $(($(now_us) - T_START))) s"
echo "binary: $BIN   (CMAKE_BUILD_TYPE: $BUILD_TYPE; source tree at $GIT)"
OTHERS_END=$(others)
warn_others "$OTHERS_START" "$OTHERS_END"
echo "load average: $LOAD_START at start, $(cut -d' ' -f1 /proc/loadavg) at end (wall-clock figures suffer from other load; the per-CPU-second ones much less)"
echo "inputs: $DATA_DIR/{bf16,fp32,fp32-true} (bench/gen_normal.py: gen_checkpoint.py's 1 GiB Llama, 4 shards, every"
echo "    element normal(0, 0.02), seed 0); Megatron-LM test checkpoints from $MEGATRON_DIR"
echo "    bf16 byte planes, order-0 entropy (low, high byte): $ENTROPY"

echo
echo "(1)+(2) ckptfs pack -o codec=C,level=L,frame=F,threads=$PACK_THREADS SRC DEST (source in the page cache; output"
echo "    fdatasync'd by pack). ratio = packed/original bytes of all files; GB/s = bytes in per second of wall,"
echo "    and per CPU second (user + sys); RSS = max RSS (/usr/bin/time). Right: pack's ratio per class of bytes."
printf '    %-33s %-7s %5s %13s %13s %6s %6s %6s %6s %7s  %s\n' data codec frame "bytes in" "bytes out" ratio s GB/s "GB/cpu" "RSS MiB" "by class"
printf '%s\n' "${PACK_ROWS[@]}"
echo "    memory: bf16 zstd-1 frame 2M $(mib "${PK_RSS[bf16/zstd-1/2M]}") MiB, frame 8M $(mib "${PK_RSS[bf16/zstd-1/8M]}") MiB" \
    "(docs: ~5 x frame x threads = $((5 * 2 * PACK_THREADS)) / $((5 * 8 * PACK_THREADS)) MiB);"
echo "    2.2 GB fp32-true zstd-1 frame 2M: $(mib "${PK_RSS[fp32-true/zstd-1/2M]}") MiB (twice the input, same memory: O(frame), not O(size))"

echo
echo "(3) one reader of the bf16 checkpoint's 4 shards, $READ_BYTES bytes of output; every source file in the page"
echo "    cache before each run; median of $READ_RUNS (runs right). zstd-1 = the default pack (zstd level 1, frame 2M)."
echo "    FUSE: a fresh mount; prefetch=auto (the default): decoder threads decode 16 MiB ahead of the reader;"
echo "    /sync = -o prefetch=0: each frame decoded on the FUSE thread that reads it. engine: ckptfs cat, one thread, no"
echo "    prefetch (raw, zstd-1, lz4 only). GB/s = output bytes / wall; GB/cpu = output bytes / CPU seconds of the daemon"
echo "    (all its threads: FUSE and decoder threads) or of ckptfs cat (engine: per thread)."
printf '    %-56s %6s %6s %7s %7s %7s  %s\n' "" s GB/s "cpu s" "GB/cpu" "MiB" "runs (GB/s)"
rrow() { # LABEL WALLS CPUS KIBS
    local walls cpus kibs mw mc
    read -r -a walls <<<"$2"
    read -r -a cpus <<<"$3"
    read -r -a kibs <<<"$4"
    mw=$(median "${walls[@]}") mc=$(median "${cpus[@]}")
    printf '    %-56s %6s %6s %7s %7s %7s  %s\n' "$1" "$(secs "$mw")" "$(gbps "$READ_BYTES" "$mw")" "$(secs "$mc")" \
        "$(gbps "$READ_BYTES" "$mc")" "$(mib "$(max "${kibs[@]}")")" "$(list_gbps "$READ_BYTES" "${walls[@]}")"
}
declare -A FUSE_GBPS=() FUSE_CPU_GBPS=() ENG_GBPS=() ENG_CPU_GBPS=()
for v in "${READ_VARIANTS[@]}"; do
    rrow "FUSE: cat MNT/hf/*, ${VLABEL[$v]}" "${R_WALL[$v]}" "${R_CPU[$v]}" "${R_HWM[$v]}"
    read -r -a w <<<"${R_WALL[$v]}"; read -r -a c <<<"${R_CPU[$v]}"
    FUSE_GBPS[$v]=$(gbps "$READ_BYTES" "$(median "${w[@]}")") FUSE_CPU_GBPS[$v]=$(gbps "$READ_BYTES" "$(median "${c[@]}")")
done
for v in "${ENGINE_VARIANTS[@]}"; do
    rrow "engine: ckptfs cat per shard, $v" "${E_WALL[$v]}" "${E_CPU[$v]}" "${E_RSS[$v]}"
    read -r -a w <<<"${E_WALL[$v]}"; read -r -a c <<<"${E_CPU[$v]}"
    ENG_GBPS[$v]=$(gbps "$READ_BYTES" "$(median "${w[@]}")") ENG_CPU_GBPS[$v]=$(gbps "$READ_BYTES" "$(median "${c[@]}")")
done
echo "    MiB: the daemon's VmHWM after the read (FUSE), the max RSS of ckptfs cat (engine); the largest of the runs."
echo "    Targets, per decoder thread (bytes out): judged on (3b)'s frame_bench \"all\" (read the stored bytes from the page"
echo "    cache, decompress, undo the byte planes, checksum: a decoder thread's whole work); for context, the codec alone"
echo "    (frame_bench's decompress stage; perf's share of the daemon's CPU, (5)) and the engine and FUSE per CPU second"
echo "    (FUSE sync = prefetch=0):"
for v in zstd-1 lz4; do
    t=$([[ $v == lz4 ]] && echo $TARGET_LZ4_GBPS || echo $TARGET_ZSTD_GBPS)
    cap=$(awk -v a="${FB_ALL[$v]:-}" -v d="${FB_CODEC[$v]:-}" -v c="${CODEC_GBPS[$v]:-}" -v e="${ENG_CPU_GBPS[$v]}" \
        -v f="${FUSE_CPU_GBPS[$v]}" -v fs="${FUSE_CPU_GBPS[$v/sync]:-}" -v raw="${FUSE_CPU_GBPS[raw]}" -v t="$t" '
        function fmt(x) { return (x == "" || x + 0 <= 0) ? "?" : sprintf("%.2f", x) }
        BEGIN {
        printf "decoder thread %s (decompress %s); codec in the daemon (perf) %s; engine %s; FUSE %s, sync %s, raw %.2f: ", \
            ((a == "") ? "not measured" : fmt(a)), fmt(d), fmt(c), e, f, fmt(fs), raw
        if (a == "") print "not measured (no frame_bench figure)"
        else if (a >= t) print "met"
        else if (d != "" && d < t) print "NOT met, the codec itself is below the target"
        else print "NOT met, the stages around the codec (reading the stored bytes, byte planes, checksum) are the cap" }')
    echo "      $v, target >= $t GB/s: $cap"
done

echo
echo "(3b) one decoder thread, stage by stage: $(basename "$FRAME_BENCH") --rounds $FB_ROUNDS over the packed *.safetensors (page cache);"
echo "    GB/s of original bytes per second of one thread, best of the rounds. \"all (frame_decode)\": the whole decode with its read."
if [[ -n $FB_WHY ]]; then
    echo "    NOT MEASURED: $FB_WHY"
else
    echo "    binary: $FRAME_BENCH"
    printf '    %s\n' "${FB_OUT[@]}"
fi

echo
CP_RUN_LINE="median of $CP_RUNS"
((CP_RUNS > 1)) || CP_RUN_LINE="one run (CP_RUNS=1)"
echo "(4) cp -r MNT/tp2pp2 DEST (a fresh mount; DEST on $(df --output=source,target "$CP_DEST_DIR" | tail -n 1 | awk '{print $1 " " $2}'), no sync), $CP_BYTES bytes,"
echo "    $CP_RUN_LINE. zstd-1, lz4: prefetch=auto (decoding ahead); zstd-1/sync: prefetch=0 (decoding on the reading"
echo "    FUSE thread). warm: source in the page cache; cold: its files evicted first ($EVICT); X GB/s: cold, and"
if [[ -z $THROTTLE_WHY ]]; then
    echo "    the daemon in a blkio cgroup with read_bps_device $MAJMIN ($DEV_NAME) X GB/s. dev MB = what the daemon read"
    echo "    from $DEV_NAME (the cgroup's io_service_bytes; cold runs use an unlimited cgroup to count). cpu s: the daemon's."
    echo "    io s: dev MB / the limit, the least time the reads take. A wall near io s + cpu s (not max of them) means the"
    echo "    daemon does not overlap reading the next frames with decoding."
else
    echo "    THROTTLED RUNS NOT MEASURED: $THROTTLE_WHY. The throttled figure is still open."
fi
printf '    %-13s %-12s %7s %8s %7s %7s %8s  %s\n' mode source s "vs raw" "dev MB" "io s" "cpu s" "runs (s)"
declare -A CP_MED=()
for mode in "${MODES[@]}"; do
    for v in "${VARIANTS[@]}"; do
        read -r -a w <<<"${C_WALL[$mode/$v]}"; read -r -a d <<<"${C_DEV[$mode/$v]}"; read -r -a c <<<"${C_CPU[$mode/$v]}"
        CP_MED[$mode/$v]=$(median "${w[@]}")
        dev=$(median "${d[@]}")
        printf '    %-13s %-12s %7s %8s %7s %7s %8s  %s\n' "${MODE_LABEL[$mode]}" "$v" "$(secs "${CP_MED[$mode/$v]}")" \
            "$(awk -v r="${CP_MED[$mode/raw]}" -v x="${CP_MED[$mode/$v]}" 'BEGIN {printf "%.2fx", r / x}')" \
            "$([[ $mode == warm ]] && echo - || awk -v b="$dev" 'BEGIN {printf "%.0f", b / 1e6}')" \
            "$([[ -n ${MODE_BPS[$mode]:-} ]] && awk -v b="$dev" -v l="${MODE_BPS[$mode]}" 'BEGIN {printf "%.2f", b / l}' || echo -)" \
            "$(secs "$(median "${c[@]}")")" "$(list_s "${w[@]}")"
    done
done
echo "    vs raw = raw seconds / this row's seconds (the speedup of reading the packed source)."

if ((${#PERF_OUT[@]} > 0)); then
    echo
    echo "(5) the daemon's CPU (all its threads) while one reader reads MNT/hf of the packed bf16 checkpoint, zstd-1 and"
    echo "    lz4 with prefetch=auto (perf record -e cpu-clock, an extra untimed read): samples grouped, then the top symbols."
    printf '    %s\n' "${PERF_OUT[@]}"
fi

echo
echo "summary"
printf '    %-64s %20s  %s\n' "" figure target
srow() { printf '    %-64s %20s  %s\n' "$1" "$2" "${3:-}"; }
for data in bf16 fp32 fp32-true; do
    for c in zstd-1 zstd-3 lz4; do
        t=""
        [[ $data == bf16 && $c == zstd* ]] && t="<= $TARGET_BF16_ZSTD $(awk -v x="${RATIO[$data/$c/2M]}" -v t=$TARGET_BF16_ZSTD 'BEGIN {print ((x <= t) ? "met" : "NOT met")}')"
        srow "size ratio, ${DATA_LABEL[$data]}, $c" "${RATIO[$data/$c/2M]}" "$t"
    done
done
for data in mlegacy mdist; do
    for c in zstd-3 lz4; do srow "size ratio, ${DATA_LABEL[$data]}, $c" "${RATIO[$data/$c/2M]}"; done
done
srow "pack GB/s in (wall), bf16 zstd-1 / zstd-3 / lz4, $PACK_THREADS threads" "${PK_GBPS[bf16/zstd-1/2M]} / ${PK_GBPS[bf16/zstd-3/2M]} / ${PK_GBPS[bf16/lz4/2M]}"
srow "pack RSS MiB, bf16 zstd-1 frame 8M / frame 2M" "$(mib "${PK_RSS[bf16/zstd-1/8M]}") / $(mib "${PK_RSS[bf16/zstd-1/2M]}")"
hwm() { local k; read -r -a k <<<"${R_HWM[$1]}"; mib "$(max "${k[@]}")"; } # VARIANT: the largest VmHWM, MiB
srow "daemon VmHWM MiB after the read, raw / zstd-1 / lz4" "$(hwm raw) / $(hwm zstd-1) / $(hwm lz4)"
srow "  same, prefetch=0: zstd-1/sync / lz4/sync" "$(hwm zstd-1/sync) / $(hwm lz4/sync)"
for v in zstd-1 lz4; do
    t=$([[ $v == lz4 ]] && echo $TARGET_LZ4_GBPS || echo $TARGET_ZSTD_GBPS)
    if [[ -n ${FB_ALL[$v]:-} ]]; then
        srow "decoder thread GB/s (frame_bench all), $v" "${FB_ALL[$v]}" \
            ">= $t $(awk -v x="${FB_ALL[$v]}" -v t="$t" 'BEGIN {print ((x >= t) ? "met" : "NOT met")}')"
        srow "  its decompress stage alone, $v" "${FB_CODEC[$v]:-?}"
    else
        srow "decoder thread GB/s (frame_bench all), $v" "not measured" ">= $t"
    fi
    srow "FUSE read GB/s, $v (raw: ${FUSE_GBPS[raw]}); packed/raw $(ratio "${FUSE_GBPS[$v]}" "${FUSE_GBPS[raw]}")" "${FUSE_GBPS[$v]}"
    srow "  per daemon CPU-s, $v (raw: ${FUSE_CPU_GBPS[raw]})" "${FUSE_CPU_GBPS[$v]}"
    srow "  FUSE read GB/s, $v/sync (prefetch=0)" "${FUSE_GBPS[$v/sync]}"
    srow "  per daemon CPU-s, $v/sync (prefetch=0)" "${FUSE_CPU_GBPS[$v/sync]}"
    srow "engine read GB/s, $v (raw: ${ENG_GBPS[raw]})" "${ENG_GBPS[$v]}"
    srow "  per CPU-s, $v (raw: ${ENG_CPU_GBPS[raw]})" "${ENG_CPU_GBPS[$v]}"
    [[ -z ${CODEC_GBPS[$v]:-} ]] || srow "  the codec alone (perf share of daemon CPU), $v" "${CODEC_GBPS[$v]}"
done
for mode in "${MODES[@]}"; do
    for v in "${VARIANTS[@]}"; do
        [[ $v != raw ]] || continue
        srow "cp -r tp2pp2 ${MODE_LABEL[$mode]}: raw $(secs "${CP_MED[$mode/raw]}") s, $v $(secs "${CP_MED[$mode/$v]}") s; speedup" \
            "$(awk -v r="${CP_MED[$mode/raw]}" -v x="${CP_MED[$mode/$v]}" 'BEGIN {printf "%.2fx", r / x}')"
    done
done
[[ -z $THROTTLE_WHY ]] || srow "cp -r tp2pp2 throttled" "open" "($THROTTLE_WHY)"
