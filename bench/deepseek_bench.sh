#!/usr/bin/env bash
# ckptfs DeepSeek-V3 benchmark: block-FP8 checkpoints served as bf16 (-o dtype=bf16). One run,
# figures side by side, targets printed next to them; nothing fails on a missed target.
#
#  (a) Metadata at scale, on a sparse DeepSeek-V3-671B-shaped checkpoint (bench/gen_deepseek_sparse.py:
#      the release's config, 91,991 tensors with their real names, dtypes and shapes, 163 shards,
#      real headers, data areas as holes; ~688 GB apparent, ~20 MB on disk). One untimed warm-up
#      mount + listing, then MOUNT_RUNS fresh mounts with -o dtype=bf16,layouts=tp1pp16ep64,PP_OPTS:
#        * mount: from starting `ckptfs mount` until the mount point answers (stat MNT/hf)  < 1 s
#        * ls -lR MNT/hf (the bf16 view of the FP8 checkpoint)                              < 3 s
#        * ls -lR MNT/tp1pp16ep64 (1024 rank files; needs the DeepSeek model rules: when this
#          build refuses the layout or does not list it, "not served by this build")       < 3 s
#        * daemon VmRSS / VmHWM (/proc/PID/status) after each listing                       < 256 MiB
#      and, on the last mount, both listings once more (RSS growth of a second pass). Next to
#      them, for comparison, a quoted (not measured) figure: offline converters load the whole
#      model and need 1.5-2 TB of RAM for it.
#  (b) Dequantisation throughput, on a real block-FP8 checkpoint of DeepSeek-V3's shapes at
#      reduced depth (bench/gen_deepseek_fp8.py: FP8_LAYERS layers, the first dense, the others
#      with FP8_EXPERTS routed experts + 1 shared, vocab 16384; defaults: 2.07 GB of E4M3 weights
#      quantised amax/448 per 128x128 block, 2.54 GB in 5 shards, 4.6 GB as bf16). Source in the
#      page cache (read before every timed step). REPEAT runs of each side, interleaved:
#        (i)  fresh `ckptfs mount -o dtype=bf16` + `cp -r MNT/hf DEST` (+ sync -f)
#        (ii) bench/fp8_cast_bf16.py: DeepSeek's inference/fp8_cast_bf16.py on the CPU in torch 2.6
#             (load_file per shard, (w.float() * scale_inv per 128x128 block) -> bf16, save_file,
#             new index), process start to exit (+ sync -f)
#      seconds, GB/s of bf16 output, ratio (ii)/(i) (target >= 5), peak RSS of each (daemon VmHWM
#      + cp's max RSS; the converter's max RSS, /usr/bin/time -v). Check (untimed, run 1's
#      outputs): the same tensor names, and per tensor dtype, shape and bytes (differences are
#      reported, not fatal). Then the daemon's dequantising read throughput: on a fresh mount, one
#      `cat` of the largest MNT/hf shard to /dev/null (median of REPEAT), GB/s of output and GB/s
#      per second of daemon CPU (utime + stime: per busy daemon thread; target >= 1.5), next to
#      `ckptfs cat -o dtype=bf16` of the same file (the read engine alone, one thread, no FUSE).
#
# Usage:
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2
#   bench/deepseek_bench.sh            # MOUNT_RUNS=5, REPEAT=3: ~3.5 min on 2 CPUs (+ ~1 min the first time)
#   bench/deepseek_bench.sh --quick    # MOUNT_RUNS=2, REPEAT=1: ~1.5 min
#
# Needs /dev/fuse, fusermount3, GNU /usr/bin/time, Debian's /usr/bin/python3 with numpy (the
# generators and the check), and for (b)(ii) root, unshare, chroot and the tests' Debian 13 root
# with torch 2.6 + safetensors (built by tests/run-all.sh; without it (ii) says "not available").
# Disk: the inputs are kept in BENCH_DIR (the sparse one ~20 MB, the FP8 one 2.5 GB); while it
# runs, two bf16 copies (2 x 4.6 GB) in OUT_DIR, removed at the end.
#
# Environment:
#   CKPTFS_BIN   the binary (default: <repo>/build/ckptfs)
#   BENCH_DIR    work dir; keeps deepseek-v3-sparse/ and deepseek-fp8-l<L>e<E>/ (default /tmp/ckptfs-bench)
#   OUT_DIR      where (b) writes its copies (default /dev/shm when it is tmpfs with room, else BENCH_DIR)
#   PYTHON       python with numpy (default /usr/bin/python3)
#   MOUNT_RUNS   timed fresh mounts in (a) (default 5; --quick 2); medians shown
#   REPEAT       runs of each side of (b) and of the cat (default 3; --quick 1); medians shown
#   SPARSE_MODEL (a)'s checkpoint: deepseek-v3 (default), kimi-k2 (Kimi-K2-Instruct's config, 1.03 TB)
#                or glm-4.6 (GLM-4.6's, bf16, 714 GB), kept as BENCH_DIR/SPARSE_MODEL-sparse
#   LAYOUT       (a)'s layout (default tp1pp16ep64; glm-4.6: tp2pp4ep32)
#   PP_OPTS      mount options that make tp1pp16ep64 valid for 61 layers (default pp_first=3,pp_last=2:
#                stages of 3, 14 x 4, 2 layers; glm-4.6: mtp=on; set but empty: none)
#   FP8_LAYERS, FP8_EXPERTS   size of (b)'s checkpoint (default 4 and 6; ~0.5 GB of FP8 per MoE layer)
#   CKPTFS_TORCH2_ROOT  Debian 13 root with torch 2.6 (default /var/cache/ckptfs-tests/trixie-root)
#   LS_TIMEOUT, CP_TIMEOUT, CONV_TIMEOUT  seconds allowed per ls / cp / converter run
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
QUICK=0
for a in "$@"; do
    case $a in
    --quick) QUICK=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "deepseek_bench: unknown argument $a (only --quick)" >&2; exit 2 ;;
    esac
done
BIN=${CKPTFS_BIN:-$REPO/build/ckptfs}
BENCH_DIR=${BENCH_DIR:-/tmp/ckptfs-bench}
PYTHON=${PYTHON:-/usr/bin/python3}
if ((QUICK)); then MOUNT_RUNS=${MOUNT_RUNS:-2} REPEAT=${REPEAT:-1}; fi
MOUNT_RUNS=${MOUNT_RUNS:-5}
REPEAT=${REPEAT:-3}
SPARSE_MODEL=${SPARSE_MODEL:-deepseek-v3}
case $SPARSE_MODEL in
deepseek-v3 | kimi-k2) LAYOUT=${LAYOUT:-tp1pp16ep64} PP_OPTS=${PP_OPTS-pp_first=3,pp_last=2} ;;
glm-4.6) LAYOUT=${LAYOUT:-tp2pp4ep32} PP_OPTS=${PP_OPTS-mtp=on} ;;
*) echo "deepseek_bench: SPARSE_MODEL $SPARSE_MODEL: deepseek-v3, kimi-k2 or glm-4.6" >&2; exit 2 ;;
esac
FP8_LAYERS=${FP8_LAYERS:-4}
FP8_EXPERTS=${FP8_EXPERTS:-6}
ROOT=${CKPTFS_TORCH2_ROOT:-/var/cache/ckptfs-tests/trixie-root}
LS_TIMEOUT=${LS_TIMEOUT:-120}
CP_TIMEOUT=${CP_TIMEOUT:-600}
CONV_TIMEOUT=${CONV_TIMEOUT:-1800}


# Targets.
TARGET_MOUNT_MS=1000
TARGET_LS_MS=3000
TARGET_RSS_KIB=$((256 * 1024))
TARGET_RATIO=5
TARGET_THREAD_GBPS=1.5

BENCH_NAME=deepseek_bench BENCH_NOTE_TIME=1
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"

[[ -x $BIN ]] || die "no ckptfs binary at $BIN (build it or set CKPTFS_BIN)"
BIN=$(readlink -f "$BIN")
command -v fusermount3 >/dev/null || die "fusermount3 not found"
[[ -e /dev/fuse ]] || die "/dev/fuse missing"
[[ -x /usr/bin/time ]] || die "/usr/bin/time (GNU time, for max RSS) not found"
"$PYTHON" -c 'import numpy' 2>/dev/null || die "$PYTHON lacks numpy"
((MOUNT_RUNS >= 1 && REPEAT >= 1)) || die "MOUNT_RUNS and REPEAT must be >= 1"

mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd -P)
SPARSE=$BENCH_DIR/$SPARSE_MODEL-sparse
FP8=$BENCH_DIR/deepseek-fp8-l${FP8_LAYERS}e${FP8_EXPERTS}

TORCH2_NOTE=""
if [[ ! -x $ROOT/usr/bin/python3 ]]; then
    TORCH2_NOTE="not available: no Debian 13 root with torch 2.6 at $ROOT (tests/run-all.sh builds it)"
elif ! command -v unshare >/dev/null || ! command -v chroot >/dev/null || [[ $(id -u) != 0 ]]; then
    TORCH2_NOTE="not available: needs root, unshare and chroot for the torch 2.6 root"
fi

# --- cleanup -------------------------------------------------------------------------------------

RUN_DIR=$(mktemp -d "$BENCH_DIR/deepseek-run.XXXXXX")
MNT=$RUN_DIR/mnt
mkdir "$MNT"
DAEMON_PID=""
OUT_RUN=""
ROOT_DIRS=() # directories the torch2 bind mounts create inside the root (removed at exit)


cleanup() {
    local rc=$? d
    trap - EXIT INT TERM HUP
    unmount
    rm -rf --one-file-system "$RUN_DIR"
    [[ -n $OUT_RUN ]] && rm -rf --one-file-system "$OUT_RUN"
    for d in "${ROOT_DIRS[@]}"; do rmdir "$d" 2>/dev/null || true; done
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

# --- helpers -------------------------------------------------------------------------------------

# do_mount SRC OPTS: a fresh mount on $MNT (OPTS may be empty); sets DAEMON_PID. Returns non-zero
# (with the error in $RUN_DIR/mount.err) if ckptfs refuses it. With TIME_MOUNT=1 in its
# environment, the command's user + system time goes to $RUN_DIR/mount.time: the source is read
# and the model built before the daemon forks, so that is the mount's own work, whatever the load.
do_mount() {
    local timer=()
    [[ ${TIME_MOUNT:-0} == 1 ]] && timer=(/usr/bin/time -f '%U %S' -o "$RUN_DIR/mount.time")
    unmount
    "${timer[@]}" "$BIN" mount ${2:+-o "$2"} "$1" "$MNT" 2>"$RUN_DIR/mount.err" || return 1
    is_mounted "$MNT" || die "ckptfs mount returned but $MNT is not mounted"
    DAEMON_PID=$(find_daemon) || die "cannot find the ckptfs daemon for $MNT"
}

cpu_us() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.0f", ($14 + $15) * 1e6 / hz}' "/proc/$1/stat"; }
max() { printf '%s\n' "$@" | sort -g | tail -n 1; }
ms() { awk -v us="$1" 'BEGIN {printf "%.0f", us / 1000}'; }
secs() { awk -v us="$1" 'BEGIN {printf "%.2f", us / 1e6}'; }
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
gbps() { awk -v b="$1" -v us="$2" 'BEGIN {printf "%.2f", b / us / 1e3}'; } # BYTES US -> GB/s
met() { if [[ $1 == 1 ]]; then echo "met"; else echo "NOT met"; fi; }
lt() { awk -v x="$1" -v t="$2" 'BEGIN {print (x < t) ? 1 : 0}'; }
ge() { awk -v x="$1" -v t="$2" 'BEGIN {print (x >= t) ? 1 : 0}'; }
list_ms() { local out="" x; for x in "$@"; do out+="${out:+ }$(ms "$x")"; done; echo "$out"; }
list_s() { local out="" x; for x in "$@"; do out+="${out:+ }$(secs "$x")"; done; echo "$out"; }
list_mib() { local out="" x; for x in "$@"; do out+="${out:+ }$(mib "$x")"; done; echo "$out"; }
maxrss_kib() { awk -F': ' '/Maximum resident set size/ {print $2}' "$1"; } # /usr/bin/time -v output
safetensors_in() { find "$1" -maxdepth 1 -type f -name '*.safetensors' | sort; }

OTHERS_START=$(others)
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
T_START=$(now_us)

# TORCH2 (an array, set by torch2_prep once $OUT_RUN exists): the root's python3 (torch 2.6) in a
# private mount namespace, with $BENCH_DIR, bench/ and $OUT_RUN bind-mounted at the same paths (as
# torch2_python in tests/lib/common.sh); run as "${TORCH2[@]}" SCRIPT ARGS. Nothing it mounts
# outlives it. The namespace's process execs python, so /usr/bin/time around it measures python.
TORCH2=()
torch2_prep() {
    local d
    for d in "$BENCH_DIR" "$HERE" "$OUT_RUN"; do # remember what mkdir -p will create, deepest first
        while [[ $d != / && ! -e $ROOT$d ]]; do
            ROOT_DIRS+=("$ROOT$d")
            d=$(dirname "$d")
        done
    done
    # shellcheck disable=SC2016 # expanded by the inner bash
    TORCH2=(unshare --mount --propagation private bash -c '
        root=$1; shift
        mount -t proc proc "$root/proc" || exit 1
        while [[ $1 != -- ]]; do
            mkdir -p "$root$1" && mount --rbind "$1" "$root$1" || exit 1
            shift
        done
        shift
        exec chroot "$root" /usr/bin/python3 "$@"' _ "$ROOT" "$BENCH_DIR" "$HERE" "$OUT_RUN" --)
}

# --- inputs --------------------------------------------------------------------------------------

if [[ ! -f $SPARSE/model.safetensors.index.json ]]; then
    note "generating $SPARSE (sparse $SPARSE_MODEL shapes)"
    "$PYTHON" "$HERE/gen_deepseek_sparse.py" --model "$SPARSE_MODEL" "$SPARSE" >&2
fi
if [[ ! -f $FP8/model.safetensors.index.json ]]; then
    note "generating $FP8 (block-FP8, $FP8_LAYERS layers x $FP8_EXPERTS experts; ~1 min)"
    "$PYTHON" "$HERE/gen_deepseek_fp8.py" --layers "$FP8_LAYERS" --experts "$FP8_EXPERTS" "$FP8" >&2
fi
rm -rf "$HERE/__pycache__"

# --- (a) metadata at scale: sparse DeepSeek-V3 ---------------------------------------------------

# a_round: a fresh mount of $SPARSE with $A_OPTS; sets T_MOUNT (to the command's return), T_ANSWER
# (until stat MNT/hf answers), T_HF, RSS_HF/HWM_HF, and with the layout T_TP, RSS_TP/HWM_TP.
# Leaves the mount in place.
a_round() {
    local t0 t1 t2 t3 t4 i
    unmount
    t0=$(now_us)
    TIME_MOUNT=1 do_mount "$SPARSE" "$A_OPTS" || die "ckptfs mount -o $A_OPTS $SPARSE failed: $(cat "$RUN_DIR/mount.err")"
    t1=$(now_us)
    C_MOUNT=$(awk '{printf "%.0f", ($1 + $2) * 1e6}' "$RUN_DIR/mount.time")
    for ((i = 0; i < 6000; i++)); do
        stat "$MNT/hf" >/dev/null 2>&1 && break
        sleep 0.01
    done
    t2=$(now_us)
    ((i < 6000)) || die "$MNT/hf did not answer within 60 s of the mount"
    timeout "$LS_TIMEOUT" ls -lR "$MNT/hf" >"$RUN_DIR/ls.hf" || die "ls -lR $MNT/hf failed or took over ${LS_TIMEOUT}s"
    t3=$(now_us)
    RSS_HF=$(status_kib "$DAEMON_PID" VmRSS) HWM_HF=$(status_kib "$DAEMON_PID" VmHWM)
    T_MOUNT=$((t1 - t0)) T_ANSWER=$((t2 - t0)) T_HF=$((t3 - t2))
    if ((TP_SERVED)); then
        timeout "$LS_TIMEOUT" ls -lR "$MNT/$LAYOUT" >"$RUN_DIR/ls.tp" || die "ls -lR $MNT/$LAYOUT failed or took over ${LS_TIMEOUT}s"
        t4=$(now_us)
        T_TP=$((t4 - t3))
        RSS_TP=$(status_kib "$DAEMON_PID" VmRSS) HWM_TP=$(status_kib "$DAEMON_PID" VmHWM)
    fi
}

# Is the layout served? The mount refuses a layout it cannot build; a build without the DeepSeek
# rules may also mount and not list it.
TP_SERVED=1 TP_WHY=""
A_OPTS="dtype=bf16,layouts=$LAYOUT${PP_OPTS:+,$PP_OPTS}"
if ! do_mount "$SPARSE" "$A_OPTS"; then
    TP_SERVED=0 TP_WHY="mount -o $A_OPTS refused: $(paste -sd ' ' "$RUN_DIR/mount.err")"
    A_OPTS="dtype=bf16"
elif [[ ! -d $MNT/$LAYOUT ]]; then
    TP_SERVED=0 TP_WHY="no $LAYOUT/ at the root of the mount (root: $(find "$MNT" -mindepth 1 -maxdepth 1 -printf "%f\n" | sort | paste -sd " "))"
fi
unmount

note "(a) $SPARSE: one untimed mount + listings, then $MOUNT_RUNS timed (-o $A_OPTS)"
a_round
HF_FILES=$(grep -c '\.safetensors$' "$RUN_DIR/ls.hf" || true)
HF_BYTES=$(bytes_of "$MNT/hf")
if ((TP_SERVED)); then
    TP_FILES=$(find "$MNT/$LAYOUT" -type f | wc -l) TP_BYTES=$(bytes_of "$MNT/$LAYOUT")
    TP_RANKS=$(find "$MNT/$LAYOUT" -type f -name model_optim_rng.pt | wc -l)
fi
mapfile -t SPARSE_SRC < <(safetensors_in "$SPARSE")
SPARSE_BYTES=$(bytes_of "${SPARSE_SRC[@]}")
SPARSE_TENSORS=$("$PYTHON" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["weight_map"]))' "$SPARSE/model.safetensors.index.json")
A_MOUNT=() A_CMOUNT=() A_ANSWER=() A_HF=() A_TP=() A_RSS_HF=() A_HWM_HF=() A_RSS_TP=() A_HWM_TP=()
for ((r = 0; r < MOUNT_RUNS; r++)); do
    a_round
    A_MOUNT+=("$T_MOUNT") A_CMOUNT+=("$C_MOUNT") A_ANSWER+=("$T_ANSWER") A_HF+=("$T_HF") A_RSS_HF+=("$RSS_HF") A_HWM_HF+=("$HWM_HF")
    if ((TP_SERVED)); then A_TP+=("$T_TP") A_RSS_TP+=("$RSS_TP") A_HWM_TP+=("$HWM_TP"); fi
done
# Second pass on the last mount: what a listing that has been done once costs, and whether the
# daemon grows with it.
note "(a) second listing on the same mount"
t0=$(now_us)
timeout "$LS_TIMEOUT" ls -lR "$MNT/hf" >/dev/null || die "second ls -lR $MNT/hf failed"
((TP_SERVED)) && { timeout "$LS_TIMEOUT" ls -lR "$MNT/$LAYOUT" >/dev/null || die "second ls -lR $MNT/$LAYOUT failed"; }
T_AGAIN=$(($(now_us) - t0))
RSS_AGAIN=$(status_kib "$DAEMON_PID" VmRSS) HWM_AGAIN=$(status_kib "$DAEMON_PID" VmHWM)
THREADS_A=$(status_kib "$DAEMON_PID" Threads)
unmount

# --- (b) dequantisation throughput: cp -r MNT/hf vs fp8_cast_bf16.py ------------------------------

mapfile -t FP8_SRC < <(safetensors_in "$FP8")
FP8_BYTES=$(bytes_of "${FP8_SRC[@]}")
keep_hot() { cat "${FP8_SRC[@]}" >/dev/null; }
note "(b) reading the source once ($FP8_BYTES bytes), so it is in the page cache for both sides"
keep_hot

# Output bytes (bf16) from the view's listing, for OUT_DIR's room.
do_mount "$FP8" dtype=bf16 || die "ckptfs mount -o dtype=bf16 $FP8 failed: $(cat "$RUN_DIR/mount.err")"
VIEW_BYTES=$(bytes_of "$MNT/hf")
mapfile -t VIEW_SHARDS < <(cd "$MNT/hf" && ls -S -- *.safetensors)
BIG_SHARD=${VIEW_SHARDS[0]}
BIG_SHARD_BYTES=$(stat -c %s "$MNT/hf/$BIG_SHARD")
unmount
if [[ -z ${OUT_DIR:-} ]]; then
    OUT_DIR=$BENCH_DIR
    if [[ $(stat -f -c %T /dev/shm 2>/dev/null) == tmpfs ]] &&
        (($(df -P -B1 /dev/shm | awk 'NR == 2 {print $4}') > VIEW_BYTES * 5 / 2)); then
        OUT_DIR=/dev/shm
    fi
fi
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd -P)
OUT_RUN=$(mktemp -d "$OUT_DIR/ckptfs-deepseek.XXXXXX")
OUT_FS=$(stat -f -c %T "$OUT_RUN")
[[ -n $TORCH2_NOTE ]] || torch2_prep

cp_round() { # DEST: sets T (us), D_HWM, C_RSS (KiB); leaves DEST in place
    local t0 t1
    rm -rf "$1"
    keep_hot
    unmount
    t0=$(now_us)
    do_mount "$FP8" dtype=bf16 || die "ckptfs mount -o dtype=bf16 $FP8 failed: $(cat "$RUN_DIR/mount.err")"
    timeout "$CP_TIMEOUT" /usr/bin/time -v -o "$RUN_DIR/cp.time" cp -r "$MNT/hf" "$1" ||
        die "cp -r $MNT/hf failed or took over ${CP_TIMEOUT}s"
    sync -f "$1"
    t1=$(now_us)
    T=$((t1 - t0)) D_HWM=$(status_kib "$DAEMON_PID" VmHWM) C_RSS=$(maxrss_kib "$RUN_DIR/cp.time")
    unmount
}

conv_round() { # DEST: sets T (us), V_RSS (KiB); leaves DEST in place
    local t0 t1
    rm -rf "$1"
    keep_hot
    t0=$(now_us)
    timeout "$CONV_TIMEOUT" /usr/bin/time -v -o "$RUN_DIR/conv.time" "${TORCH2[@]}" "$HERE/fp8_cast_bf16.py" \
        --input-fp8-hf-path "$FP8" --output-bf16-hf-path "$1" >"$RUN_DIR/conv.out" 2>"$RUN_DIR/conv.err" ||
        { grep -v 'UCX  ERROR' "$RUN_DIR/conv.err" >&2; die "fp8_cast_bf16.py failed or took over ${CONV_TIMEOUT}s"; }
    sync -f "$1"
    t1=$(now_us)
    T=$((t1 - t0)) V_RSS=$(maxrss_kib "$RUN_DIR/conv.time")
}

# check_outputs (untimed, run 1's outputs, which it then removes: later runs have the memory
# back): per tensor name, dtype, shape and bytes of the two outputs; sets VIEW_FILES,
# CONV_FILES, CHECK.
check_outputs() {
    VIEW_FILES=$(safetensors_in "$OUT_RUN/view.0" | xargs -r -n1 basename | paste -sd ' ')
    CONV_FILES="-"
    [[ -d $OUT_RUN/conv.0 ]] && CONV_FILES="$(safetensors_in "$OUT_RUN/conv.0" | wc -l) files $(
        safetensors_in "$OUT_RUN/conv.0" | head -n 1 | xargs -r basename) ..."

    CHECK="not run ($TORCH2_NOTE)"
    if [[ -d $OUT_RUN/conv.0 ]]; then
        note "(b) check: the tensors of the view's copy against fp8_cast_bf16.py's output"
        CHECK=$("$PYTHON" "$HERE/same_tensors.py" "$OUT_RUN/view.0" "$OUT_RUN/conv.0" "fp8_cast_bf16's") ||
            CHECK="the check itself failed"
    fi
    rm -rf "$OUT_RUN"/view.* "$OUT_RUN"/conv.*
}

T_CP=() T_CONV=() CP_DHWM=() CP_RSS=() CONV_RSS=()
CONV_BYTES="" CP_BYTES="" CONV_LINE="" VIEW_FILES="" CONV_FILES="" CHECK=""
for ((r = 0; r < REPEAT; r++)); do
    # Alternate which side goes first, so neither always follows the other.
    for side in $( ((r % 2 == 0)) && echo "cp conv" || echo "conv cp"); do
        if [[ $side == conv && -n $TORCH2_NOTE ]]; then continue; fi
        note "(b) run $((r + 1)) of $REPEAT: $side"
        if [[ $side == cp ]]; then
            cp_round "$OUT_RUN/view.$r"
            T_CP+=("$T") CP_DHWM+=("$D_HWM") CP_RSS+=("$C_RSS")
            [[ -n $CP_BYTES ]] || CP_BYTES=$(bytes_of "$OUT_RUN/view.$r")
            ((r == 0)) || rm -rf "$OUT_RUN/view.$r"
        else
            conv_round "$OUT_RUN/conv.$r"
            T_CONV+=("$T") CONV_RSS+=("$V_RSS")
            [[ -n $CONV_BYTES ]] || CONV_BYTES=$(bytes_of "$OUT_RUN/conv.$r")
            [[ -n $CONV_LINE ]] || CONV_LINE=$(sed -n 's/^fp8_cast_bf16: //p' "$RUN_DIR/conv.err")
            ((r == 0)) || rm -rf "$OUT_RUN/conv.$r"
        fi
    done
    if ((r == 0)); then check_outputs; fi
done

# Dequantising read throughput: one reader.
note "(b) read throughput: cat MNT/hf/$BIG_SHARD ($BIG_SHARD_BYTES bytes) on a fresh mount, and ckptfs cat"
R_CAT=() R_CPU=() R_ENGINE=() R_ECPU=()
for ((r = 0; r < REPEAT; r++)); do
    keep_hot
    do_mount "$FP8" dtype=bf16 || die "ckptfs mount -o dtype=bf16 $FP8 failed: $(cat "$RUN_DIR/mount.err")"
    c0=$(cpu_us "$DAEMON_PID")
    t0=$(now_us)
    timeout "$CP_TIMEOUT" cat "$MNT/hf/$BIG_SHARD" >/dev/null || die "cat $MNT/hf/$BIG_SHARD failed"
    t1=$(now_us)
    R_CAT+=($((t1 - t0))) R_CPU+=($(($(cpu_us "$DAEMON_PID") - c0)))
    THREADS_B=$(status_kib "$DAEMON_PID" Threads)
    unmount
    t0=$(now_us)
    /usr/bin/time -f '%U %S' -o "$RUN_DIR/engine.time" "$BIN" cat -o dtype=bf16 "$FP8" "hf/$BIG_SHARD" >/dev/null ||
        die "ckptfs cat -o dtype=bf16 $FP8 hf/$BIG_SHARD failed"
    t1=$(now_us)
    R_ENGINE+=($((t1 - t0))) R_ECPU+=("$(awk '{printf "%.0f", ($1 + $2) * 1e6}' "$RUN_DIR/engine.time")")
done

# --- report --------------------------------------------------------------------------------------

BUILD_TYPE=$(build_type "$BIN")
GIT=$(tree_state "$REPO")

echo
echo "ckptfs DeepSeek-V3 benchmark$( ((QUICK)) && echo " (--quick)")   $(date '+%Y-%m-%d %H:%M')   $(uname -r), $(nproc) CPUs, $(secs $(($(now_us) - T_START))) s"
echo "binary: $BIN   (CMAKE_BUILD_TYPE: $BUILD_TYPE; source tree at $GIT)"
OTHERS_END=$(others)
warn_others "$OTHERS_START" "$OTHERS_END"
echo "load average: $LOAD_START at start, $(cut -d' ' -f1 /proc/loadavg) at end"

echo
echo "(a) metadata at scale: $SPARSE"
echo "    $SPARSE_MODEL shapes, ${#SPARSE_SRC[@]} shards, $SPARSE_TENSORS tensors, $SPARSE_BYTES bytes apparent"
echo "    ($(du -sm "$SPARSE" | cut -f1) MB on disk: data areas are holes). Mounted -o $A_OPTS;"
echo "    one untimed warm-up mount, then $MOUNT_RUNS fresh mounts; medians (single runs on the right)."
printf '    %-46s %19s  %-11s %-8s %s\n' "" measured target "" runs
row() { printf '    %-46s %19s  %-11s %-8s %s\n' "$@"; }
MA=$(median "${A_ANSWER[@]}") MM=$(median "${A_MOUNT[@]}") MH=$(median "${A_HF[@]}")
row "mount, until MNT/hf answers" "$(ms "$MA") ms" "< $TARGET_MOUNT_MS ms" "$(met "$(lt "$MA" $((TARGET_MOUNT_MS * 1000)))")" "$(list_ms "${A_ANSWER[@]}")"
row "  of which ckptfs mount (returns when ready)" "$(ms "$MM") ms" "" "" "$(list_ms "${A_MOUNT[@]}")"
row "  its CPU (user + sys: parsing the headers)" "$(ms "$(median "${A_CMOUNT[@]}")") ms" "" "" "$(list_ms "${A_CMOUNT[@]}")"
row "ls -lR MNT/hf ($HF_FILES bf16 shards)" "$(ms "$MH") ms" "< $TARGET_LS_MS ms" "$(met "$(lt "$MH" $((TARGET_LS_MS * 1000)))")" "$(list_ms "${A_HF[@]}")"
HH=$(max "${A_HWM_HF[@]}")
row "  daemon VmRSS / VmHWM after it (largest)" "$(mib "$(max "${A_RSS_HF[@]}")") / $(mib "$HH") MiB" "< $((TARGET_RSS_KIB / 1024)) MiB" "$(met "$(lt "$HH" $TARGET_RSS_KIB)")" "$(list_mib "${A_HWM_HF[@]}") (VmHWM)"
if ((TP_SERVED)); then
    MT=$(median "${A_TP[@]}")
    HT=$(max "${A_HWM_TP[@]}")
    row "then ls -lR MNT/$LAYOUT ($TP_RANKS rank files)" "$(ms "$MT") ms" "< $TARGET_LS_MS ms" "$(met "$(lt "$MT" $((TARGET_LS_MS * 1000)))")" "$(list_ms "${A_TP[@]}")"
    row "  daemon VmRSS / VmHWM after both (largest)" "$(mib "$(max "${A_RSS_TP[@]}")") / $(mib "$HT") MiB" "< $((TARGET_RSS_KIB / 1024)) MiB" "$(met "$(lt "$HT" $TARGET_RSS_KIB)")" "$(list_mib "${A_HWM_TP[@]}") (VmHWM)"
else
    echo "    $LAYOUT: not served by this build ($TP_WHY)"
fi
row "$( ((TP_SERVED)) && echo "both listings" || echo "the listing") again, same mount" "$(ms "$T_AGAIN") ms" "" "" ""
row "  daemon VmRSS / VmHWM then" "$(mib "$RSS_AGAIN") / $(mib "$HWM_AGAIN") MiB" "" "" "($THREADS_A threads)"
echo "    hf/: $HF_FILES safetensors, $HF_BYTES bytes as bf16$( ((TP_SERVED)) && echo "; $LAYOUT/: $TP_FILES files, $TP_BYTES bytes")"
echo "    For comparison (quoted, not measured): offline converters load the whole model into RAM and"
echo "    are reported to need 1.5-2 TB of it for this model."

echo
echo "(b) dequantisation: $FP8"
echo "    $FP8_LAYERS layers (1 dense, $((FP8_LAYERS - 1)) MoE x $FP8_EXPERTS experts) of DeepSeek-V3's shapes, ${#FP8_SRC[@]} shards,"
echo "    $FP8_BYTES bytes (block-FP8 E4M3, 128x128 scales); $VIEW_BYTES bytes as bf16 (hf/). Source in the page"
echo "    cache for every run; output to $OUT_DIR ($OUT_FS) + sync -f; median of $REPEAT, runs interleaved."
printf '    %-52s %8s %6s %7s  %s\n' "" seconds GB/s ratio "runs (s)"
MCP=$(median "${T_CP[@]}")
printf '    %-52s %8s %6s %7s  %s\n' "(i) ckptfs mount -o dtype=bf16 + cp -r MNT/hf" "$(secs "$MCP")" "$(gbps "$CP_BYTES" "$MCP")" "1.00" "$(list_s "${T_CP[@]}")"
if ((${#T_CONV[@]})); then
    MCONV=$(median "${T_CONV[@]}")
    RATIO=$(awk -v a="$MCONV" -v b="$MCP" 'BEGIN {printf "%.2f", a / b}')
    printf '    %-52s %8s %6s %7s  %s\n' "(ii) fp8_cast_bf16.py (torch 2.6, CPU)" "$(secs "$MCONV")" "$(gbps "$CONV_BYTES" "$MCONV")" "$RATIO" "$(list_s "${T_CONV[@]}")"
    echo "    (ii)/(i) = $RATIO   target >= $TARGET_RATIO: $(met "$(ge "$RATIO" $TARGET_RATIO)")"
    BCP=$(printf '%s\n' "${T_CP[@]}" | sort -g | head -n 1) BCONV=$(printf '%s\n' "${T_CONV[@]}" | sort -g | head -n 1)
    echo "    fastest runs: (i) $(secs "$BCP") s, (ii) $(secs "$BCONV") s, ratio $(awk -v a="$BCONV" -v b="$BCP" 'BEGIN {printf "%.2f", a / b}')"
    echo "    peak RSS, largest of the runs: (i) daemon VmHWM $(mib "$(max "${CP_DHWM[@]}")") MiB + cp $(mib "$(max "${CP_RSS[@]}")") MiB;"
    echo "    (ii) $(mib "$(max "${CONV_RSS[@]}")") MiB (max RSS, /usr/bin/time -v; runs: $(list_mib "${CONV_RSS[@]}"))"
    echo "    (ii) includes chroot, python start and import torch (~2 s); ${CONV_LINE:-?}"
else
    echo "    (ii) fp8_cast_bf16.py: $TORCH2_NOTE"
    echo "    peak RSS: (i) daemon VmHWM $(mib "$(max "${CP_DHWM[@]}")") MiB + cp $(mib "$(max "${CP_RSS[@]}")") MiB"
fi
echo "    outputs: (i) $CP_BYTES bytes: $VIEW_FILES (+ config.json, generation_config.json); (ii) ${CONV_BYTES:-?} bytes: $CONV_FILES"
echo "    check (untimed, run 1): $(head -n 1 <<<"$CHECK")"
tail -n +2 <<<"$CHECK" | sed 's/^DIFF /        /'

echo
echo "    dequantising read, one reader, $BIG_SHARD ($BIG_SHARD_BYTES bytes of bf16); median of $REPEAT:"
printf '    %-52s %8s %6s %13s  %s\n' "" seconds GB/s "GB/s per CPU" "runs (GB/s)"
MC=$(median "${R_CAT[@]}") MCPU=$(median "${R_CPU[@]}") ME=$(median "${R_ENGINE[@]}") MECPU=$(median "${R_ECPU[@]}")
list_gbps() { local b=$1 out="" x; shift; for x in "$@"; do out+="${out:+ }$(gbps "$b" "$x")"; done; echo "$out"; }
printf '    %-52s %8s %6s %13s  %s\n' "cat MNT/hf/$BIG_SHARD > /dev/null, fresh mount" "$(secs "$MC")" "$(gbps "$BIG_SHARD_BYTES" "$MC")" "$(gbps "$BIG_SHARD_BYTES" "$MCPU")" "$(list_gbps "$BIG_SHARD_BYTES" "${R_CAT[@]}")"
printf '    %-52s %8s %6s %13s  %s\n' "ckptfs cat -o dtype=bf16 (engine, 1 thread, no FUSE)" "$(secs "$ME")" "$(gbps "$BIG_SHARD_BYTES" "$ME")" "$(gbps "$BIG_SHARD_BYTES" "$MECPU")" "$(list_gbps "$BIG_SHARD_BYTES" "${R_ENGINE[@]}")"
echo "    GB/s per CPU: output bytes / the daemon's CPU seconds (utime + stime) during the read, i.e. per"
echo "    busy daemon thread; target >= $TARGET_THREAD_GBPS: $(met "$(ge "$(gbps "$BIG_SHARD_BYTES" "$MCPU")" $TARGET_THREAD_GBPS)"). The daemon had ${THREADS_B:-?} threads;"
echo "    the machine has $(nproc) CPUs."
