#!/usr/bin/env bash
# ckptfs MXFP4 benchmark: a whole bf16 copy of a GPT-OSS checkpoint, served by hf/ with
# -o dtype=bf16, against an offline converter doing the same dequantisation in torch. One run,
# both sides interleaved, figures side by side; nothing fails on a slow figure.
#
# Source: a real MXFP4 checkpoint of GPT-OSS-20B's widths at reduced depth (bench/gen_deepseek_fp8.py
# --model gpt-oss: hidden 2880, expert ffn 2880, 64 heads, 8 KV heads, LAYERS layers of EXPERTS
# experts, vocab 16384; the release's names, config.json (quantization_config mxfp4) and shard
# names; random valid MXFP4 blocks, E8M0 scales 2^-9 .. 2^-2, the rest random bf16). Defaults
# (3 layers, 32 experts): 1.62 GB in 3 shards, 5.1 GB once dequantised. Kept in the page cache
# (read before every timed step). REPEAT runs of each side, interleaved (the first side alternates):
#   (i)  fresh `ckptfs mount -o dtype=bf16` + `cp -r MNT/hf DEST` + sync -f
#   (ii) bench/mxfp4_dequant_bf16.py in torch 2.6 on the CPU (load_file per shard, each expert's
#        FP4 codes looked up and times 2^(scale - 127), transposed to transformers' [E, in, out]
#        bf16, save_file, new index and config.json), process start to exit + sync -f
# Printed: seconds and GB/s of bf16 output (median, and every run), the ratio of the medians
# (ii)/(i), peak RSS (the daemon's VmHWM, which counts the mapped source pages it read, its
# RssAnon at the end and cp's max RSS; the converter's max RSS, /usr/bin/time -v), and the check
# (untimed, run 1's outputs, bench/same_tensors.py): the same tensor names, and per tensor dtype,
# shape and bytes; and whether both config.json hold the same fields.
#
# Usage:
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2
#   bench/mxfp4_copy_bench.sh            # REPEAT=3
#   bench/mxfp4_copy_bench.sh --quick    # REPEAT=1
#
# Needs /dev/fuse, fusermount3, GNU /usr/bin/time, Debian's /usr/bin/python3 with numpy (the
# generator and the check), and for (ii) root, unshare, chroot and the tests' Debian 13 root with
# torch 2.6 + safetensors (built by tests/run-all.sh; without it (ii) says "not available").
# Disk: the source is kept in BENCH_DIR (1.6 GB); while it runs, two bf16 copies (2 x 5.1 GB) in
# OUT_DIR, removed at the end.
#
# Environment:
#   CKPTFS_BIN   the binary (default: <repo>/build/ckptfs)
#   BENCH_DIR    work dir; keeps gpt-oss-mxfp4-l<L>e<E>/ (default /tmp/ckptfs-bench)
#   OUT_DIR      where the copies go (default /dev/shm when it is tmpfs with room, else BENCH_DIR)
#   PYTHON       python with numpy (default /usr/bin/python3)
#   REPEAT       runs of each side (default 3; --quick 1); medians shown
#   LAYERS, EXPERTS   size of the source (default 3 and 32; ~0.42 GB of MXFP4 a layer at 32)
#   CKPTFS_TORCH2_ROOT  Debian 13 root with torch 2.6 (default /var/cache/ckptfs-tests/trixie-root)
#   CP_TIMEOUT, CONV_TIMEOUT  seconds allowed per cp / converter run
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
QUICK=0
for a in "$@"; do
    case $a in
    --quick) QUICK=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "mxfp4_copy_bench: unknown argument $a (only --quick)" >&2; exit 2 ;;
    esac
done
BIN=${CKPTFS_BIN:-$REPO/build/ckptfs}
BENCH_DIR=${BENCH_DIR:-/tmp/ckptfs-bench}
PYTHON=${PYTHON:-/usr/bin/python3}
if ((QUICK)); then REPEAT=${REPEAT:-1}; fi
REPEAT=${REPEAT:-3}
LAYERS=${LAYERS:-3}
EXPERTS=${EXPERTS:-32}
ROOT=${CKPTFS_TORCH2_ROOT:-/var/cache/ckptfs-tests/trixie-root}
CP_TIMEOUT=${CP_TIMEOUT:-600}
CONV_TIMEOUT=${CONV_TIMEOUT:-1800}

BENCH_NAME=mxfp4_copy_bench BENCH_NOTE_TIME=1
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"

[[ -x $BIN ]] || die "no ckptfs binary at $BIN (build it or set CKPTFS_BIN)"
BIN=$(readlink -f "$BIN")
command -v fusermount3 >/dev/null || die "fusermount3 not found"
[[ -e /dev/fuse ]] || die "/dev/fuse missing"
[[ -x /usr/bin/time ]] || die "/usr/bin/time (GNU time, for max RSS) not found"
"$PYTHON" -c 'import numpy' 2>/dev/null || die "$PYTHON lacks numpy"
((REPEAT >= 1 && LAYERS >= 1 && EXPERTS >= 1)) || die "REPEAT, LAYERS and EXPERTS must be >= 1"

mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd -P)
SRC=$BENCH_DIR/gpt-oss-mxfp4-l${LAYERS}e${EXPERTS}

TORCH2_NOTE=""
if [[ ! -x $ROOT/usr/bin/python3 ]]; then
    TORCH2_NOTE="not available: no Debian 13 root with torch 2.6 at $ROOT (tests/run-all.sh builds it)"
elif ! command -v unshare >/dev/null || ! command -v chroot >/dev/null || [[ $(id -u) != 0 ]]; then
    TORCH2_NOTE="not available: needs root, unshare and chroot for the torch 2.6 root"
fi

# --- cleanup -------------------------------------------------------------------------------------

OUT_RUN=""
ROOT_DIRS=() # directories torch2.sh's bind mounts create inside the root (removed at exit)
bench_stop() {
    local d
    [[ -n $OUT_RUN ]] && rm -rf --one-file-system "$OUT_RUN"
    for d in "${ROOT_DIRS[@]}"; do rmdir "$d" 2>/dev/null || true; done
}
bench_start "$BENCH_DIR/mxfp4-run.XXXXXX"

# do_mount: a fresh mount of $SRC with -o dtype=bf16 on $MNT; sets DAEMON_PID.
do_mount() {
    unmount
    "$BIN" mount -o dtype=bf16 "$SRC" "$MNT" 2>"$RUN_DIR/mount.err" ||
        die "ckptfs mount -o dtype=bf16 $SRC failed: $(cat "$RUN_DIR/mount.err")"
    is_mounted "$MNT" || die "ckptfs mount returned but $MNT is not mounted"
    DAEMON_PID=$(find_daemon) || die "cannot find the ckptfs daemon for $MNT"
}
gbps() { awk -v b="$1" -v us="$2" 'BEGIN {printf "%.2f", b / us / 1e3}'; } # BYTES US -> GB/s
list_mib() { local out="" x; for x in "$@"; do out+="${out:+ }$(mib "$x")"; done; echo "$out"; }
safetensors_in() { find "$1" -maxdepth 1 -type f -name '*.safetensors' | sort; }

OTHERS_START=$(others)
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
T_START=$(now_us)

# --- input ---------------------------------------------------------------------------------------

if [[ ! -f $SRC/model.safetensors.index.json ]]; then
    note "generating $SRC (MXFP4 GPT-OSS, $LAYERS layers x $EXPERTS experts)"
    "$PYTHON" "$HERE/gen_deepseek_fp8.py" --model gpt-oss --layers "$LAYERS" --experts "$EXPERTS" "$SRC" >&2
    rm -rf "$HERE/__pycache__"
fi
mapfile -t SRC_FILES < <(safetensors_in "$SRC")
SRC_BYTES=$(bytes_of "${SRC_FILES[@]}")
keep_hot() { cat "${SRC_FILES[@]}" >/dev/null; }
note "reading the source once ($SRC_BYTES bytes), so it is in the page cache for both sides"
keep_hot

# Output bytes (bf16) from the view's listing, for OUT_DIR's room.
do_mount
VIEW_BYTES=$(bytes_of "$MNT/hf")
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
OUT_RUN=$(mktemp -d "$OUT_DIR/ckptfs-mxfp4.XXXXXX")
OUT_FS=$(stat -f -c %T "$OUT_RUN")

# torch2 ARGS...: the root's python3 (torch 2.6) with the source, bench/ and the outputs at
# their paths; the directories its bind mounts create in the root are remembered for bench_stop.
TORCH2_DIRS="$BENCH_DIR:$HERE:$OUT_RUN"
for d in "$BENCH_DIR" "$HERE" "$OUT_RUN"; do # deepest first
    while [[ $d != / && ! -e $ROOT$d ]]; do
        ROOT_DIRS+=("$ROOT$d")
        d=$(dirname "$d")
    done
done
torch2() { "$HERE/torch2.sh" "$ROOT" "$TORCH2_DIRS" "$@"; }

# --- the runs ------------------------------------------------------------------------------------

cp_round() { # DEST: sets T (us), D_HWM, D_ANON, C_RSS (KiB); leaves DEST in place
    local t0 t1
    rm -rf "$1"
    keep_hot
    t0=$(now_us)
    do_mount
    timeout "$CP_TIMEOUT" /usr/bin/time -v -o "$RUN_DIR/cp.time" cp -r "$MNT/hf" "$1" ||
        die "cp -r $MNT/hf failed or took over ${CP_TIMEOUT}s"
    sync -f "$1"
    t1=$(now_us)
    T=$((t1 - t0)) D_HWM=$(status_kib "$DAEMON_PID" VmHWM) D_ANON=$(status_kib "$DAEMON_PID" RssAnon)
    C_RSS=$(maxrss_kib "$RUN_DIR/cp.time")
    unmount
}

conv_round() { # DEST: sets T (us), V_RSS (KiB); leaves DEST in place
    local t0 t1
    rm -rf "$1"
    keep_hot
    t0=$(now_us)
    timeout "$CONV_TIMEOUT" /usr/bin/time -v -o "$RUN_DIR/conv.time" "$HERE/torch2.sh" "$ROOT" "$TORCH2_DIRS" \
        "$HERE/mxfp4_dequant_bf16.py" "$SRC" "$1" >"$RUN_DIR/conv.out" 2>"$RUN_DIR/conv.err" ||
        { grep -v 'UCX  ERROR' "$RUN_DIR/conv.err" >&2; die "mxfp4_dequant_bf16.py failed or took over ${CONV_TIMEOUT}s"; }
    sync -f "$1"
    t1=$(now_us)
    T=$((t1 - t0)) V_RSS=$(maxrss_kib "$RUN_DIR/conv.time")
}

# check_outputs (untimed, run 1's outputs, which it then removes): sets VIEW_FILES, CONV_FILES,
# CHECK, CONFIG_CHECK.
check_outputs() {
    VIEW_FILES=$(safetensors_in "$OUT_RUN/view.0" | xargs -r -n1 basename | paste -sd ' ')
    CONV_FILES="-" CHECK="not run ($TORCH2_NOTE)" CONFIG_CHECK=""
    if [[ -d $OUT_RUN/conv.0 ]]; then
        CONV_FILES=$(safetensors_in "$OUT_RUN/conv.0" | xargs -r -n1 basename | paste -sd ' ')
        note "check: the tensors of the view's copy against mxfp4_dequant_bf16.py's output"
        CHECK=$("$PYTHON" "$HERE/same_tensors.py" "$OUT_RUN/view.0" "$OUT_RUN/conv.0" "the converter's") ||
            CHECK="the check itself failed"
        CONFIG_CHECK=$("$PYTHON" -c 'import json, sys
a, b = (json.load(open(p + "/config.json")) for p in sys.argv[1:3])
print("the same fields and values" if a == b else "differ: " + ", ".join(sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))))
' "$OUT_RUN/view.0" "$OUT_RUN/conv.0") || CONFIG_CHECK="the check itself failed"
    fi
    rm -rf "$OUT_RUN"/view.* "$OUT_RUN"/conv.*
}

T_CP=() T_CONV=() CP_DHWM=() CP_DANON=() CP_RSS=() CONV_RSS=()
CONV_BYTES="" CP_BYTES="" CONV_LINE="" VIEW_FILES="" CONV_FILES="" CHECK="" CONFIG_CHECK=""
for ((r = 0; r < REPEAT; r++)); do
    # Alternate which side goes first, so neither always follows the other.
    for side in $( ((r % 2 == 0)) && echo "cp conv" || echo "conv cp"); do
        if [[ $side == conv && -n $TORCH2_NOTE ]]; then continue; fi
        note "run $((r + 1)) of $REPEAT: $side"
        if [[ $side == cp ]]; then
            cp_round "$OUT_RUN/view.$r"
            T_CP+=("$T") CP_DHWM+=("$D_HWM") CP_DANON+=("$D_ANON") CP_RSS+=("$C_RSS")
            [[ -n $CP_BYTES ]] || CP_BYTES=$(bytes_of "$OUT_RUN/view.$r")
            ((r == 0)) || rm -rf "$OUT_RUN/view.$r"
        else
            conv_round "$OUT_RUN/conv.$r"
            T_CONV+=("$T") CONV_RSS+=("$V_RSS")
            [[ -n $CONV_BYTES ]] || CONV_BYTES=$(bytes_of "$OUT_RUN/conv.$r")
            [[ -n $CONV_LINE ]] || CONV_LINE=$(sed -n 's/^mxfp4_dequant_bf16: //p' "$RUN_DIR/conv.err")
            ((r == 0)) || rm -rf "$OUT_RUN/conv.$r"
        fi
    done
    if ((r == 0)); then check_outputs; fi
done

# --- report --------------------------------------------------------------------------------------

BUILD_TYPE=$(build_type "$BIN")
GIT=$(tree_state "$REPO")

echo
echo "ckptfs MXFP4 copy benchmark$( ((QUICK)) && echo " (--quick)")   $(date '+%Y-%m-%d %H:%M')   $(uname -r), $(nproc) CPUs, $(secs $(($(now_us) - T_START))) s"
echo "binary: $BIN   (CMAKE_BUILD_TYPE: $BUILD_TYPE; source tree at $GIT)"
OTHERS_END=$(others)
warn_others "$OTHERS_START" "$OTHERS_END"
echo "load average: $LOAD_START at start, $(cut -d' ' -f1 /proc/loadavg) at end"
echo
echo "$SRC"
echo "    GPT-OSS-20B's widths, layers: $LAYERS, experts: $EXPERTS (MXFP4), ${#SRC_FILES[@]} shards, $SRC_BYTES bytes; $VIEW_BYTES bytes"
echo "    as bf16 (hf/). Source in the page cache for every run; output to $OUT_DIR ($OUT_FS) + sync -f;"
echo "    median of $REPEAT, runs interleaved."
printf '    %-52s %8s %6s %7s  %s\n' "" seconds GB/s ratio "runs (s)"
MCP=$(median "${T_CP[@]}")
printf '    %-52s %8s %6s %7s  %s\n' "(i) ckptfs mount -o dtype=bf16 + cp -r MNT/hf" "$(secs "$MCP")" "$(gbps "$CP_BYTES" "$MCP")" "1.00" "$(list_s "${T_CP[@]}")"
if ((${#T_CONV[@]})); then
    MCONV=$(median "${T_CONV[@]}")
    RATIO=$(awk -v a="$MCONV" -v b="$MCP" 'BEGIN {printf "%.2f", a / b}')
    printf '    %-52s %8s %6s %7s  %s\n' "(ii) mxfp4_dequant_bf16.py (torch 2.6, CPU)" "$(secs "$MCONV")" "$(gbps "$CONV_BYTES" "$MCONV")" "$RATIO" "$(list_s "${T_CONV[@]}")"
    echo "    (ii)/(i), ratio of the medians = $RATIO"
    echo "    peak RSS, largest of the runs: (i) daemon VmHWM $(mib "$(max "${CP_DHWM[@]}")") MiB (mapped source pages"
    echo "    count; its RssAnon at the end $(mib "$(max "${CP_DANON[@]}")") MiB) + cp $(mib "$(max "${CP_RSS[@]}")") MiB;"
    echo "    (ii) $(mib "$(max "${CONV_RSS[@]}")") MiB (max RSS, /usr/bin/time -v; runs: $(list_mib "${CONV_RSS[@]}"))"
    echo "    (ii) includes chroot, python start and import torch; ${CONV_LINE:-?}"
else
    echo "    (ii) mxfp4_dequant_bf16.py: $TORCH2_NOTE"
    echo "    peak RSS: (i) daemon VmHWM $(mib "$(max "${CP_DHWM[@]}")") MiB (RssAnon $(mib "$(max "${CP_DANON[@]}")") MiB) + cp $(mib "$(max "${CP_RSS[@]}")") MiB"
fi
echo "    outputs: (i) $CP_BYTES bytes: $VIEW_FILES (+ config.json, generation_config.json);"
echo "    (ii) ${CONV_BYTES:-?} bytes: $CONV_FILES (+ index, config.json, generation_config.json)"
echo "    check (untimed, run 1): $(head -n 1 <<<"$CHECK")${CONFIG_CHECK:+; config.json: $CONFIG_CHECK}"
tail -n +2 <<<"$CHECK" | sed 's/^DIFF /        /'
