#!/usr/bin/env bash
# ckptfs read path at node scale: total read throughput of N concurrent readers through the
# views against direct reads of the source files, cold (drop_caches before) and cached (source
# in the page cache), each view on a fresh mount; the daemon's CPU time per GB; and, when torch
# sees a GPU, rank processes loading their tensor-parallel share onto it through the mount
# against the same shares read from the HF shards. See bench/README.md.
#
#   bench/node_bench.sh [--quick]
#
#   --quick      a ~1.4 GB model (SIZE=1.5G) instead of the whole one (15.2 GB)
#
# Environment:
#   CKPTFS_BIN   the binary (default: <repo>/build/ckptfs)
#   BENCH_DIR    work dir; the generated checkpoint is kept and reused (default /tmp/ckptfs-bench)
#   MODEL        qwen2-7b (default; TP 8 is not a valid split of its 28 heads) or llama3-8b
#                (Llama-3-8B's shapes: 32 heads / 8 KV heads, GPU_TP="4 8" both run)
#   SIZE         model size, decimal (e.g. 1.5G, 4G); default: the whole model (15.2 / 16.1 GB)
#   READERS      reader counts (default "1 4 8 16")
#   READ_SIZE    bytes each reader asks for per pread: 1M (default), 128K, 4M, ... (K/M: KiB/MiB)
#   REPEAT       rounds of the whole matrix (default 1); medians are shown, single runs under them
#   STAT         median (default) or best: the throughput shown is the rounds' best (the CPU
#                figures stay medians); on a machine others share, the best run is the one least
#                disturbed
#   VIEWS        views to measure beside the direct reads (default "hf tp4pp1 tp2pp2 mcore");
#                VIEW:OPTS mounts that one with OPTS added (e.g. "hf hf:passthrough")
#   MOUNT_OPTS   options for every mount (e.g. prefetch=0; default none)
#   CONDITIONS   "cold cached" (default), or one of them
#   TIMEOUT      seconds allowed per measurement (default 600; a hung mount fails the run)
#   PYTHON       python for the readers and the generator (numpy) (default /usr/bin/python3)
#   GPU          auto (default): the GPU comparison when torch sees CUDA; 0: skip it
#   GPU_TP       tensor-parallel degrees for it (default "4 8"; an invalid layout is skipped)
#   GPU_MODES    the loads compared: "torch slice" (default), or one of them (slice does not
#                touch the mount: a second run with other mount options may leave it out)
#   GPU_PYTHON   python with torch (+ safetensors) for it (default: PYTHON, then python3)
#   GPU_DEVICE   cuda (default); cpu runs the comparison on the CPU (tests the script, no GPU)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
HELPER=$HERE/node_bench.py

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

QUICK=0
for arg in "$@"; do
    case $arg in
    --quick) QUICK=1 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done

BIN=${CKPTFS_BIN:-$REPO/build/ckptfs}
BENCH_DIR=${BENCH_DIR:-/tmp/ckptfs-bench}
if [[ -z ${PYTHON:-} ]]; then
    PYTHON=/usr/bin/python3
    [[ -x $PYTHON ]] || PYTHON=$(command -v python3 || echo python3)
fi
READERS=${READERS:-1 4 8 16}
READ_SIZE=${READ_SIZE:-1M}
REPEAT=${REPEAT:-1}
STAT=${STAT:-median}
VIEWS=${VIEWS:-hf tp4pp1 tp2pp2 mcore}
MOUNT_OPTS=${MOUNT_OPTS:-}
TIMEOUT=${TIMEOUT:-600}
MODEL=${MODEL:-qwen2-7b}
SIZE=${SIZE:-}
((QUICK)) && SIZE=${SIZE:-1.5G}
GPU=${GPU:-auto}
GPU_TP=${GPU_TP:-4 8}
GPU_DEVICE=${GPU_DEVICE:-cuda}
GPU_MODES=${GPU_MODES:-torch slice}

BENCH_NAME=node_bench
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"

[[ -x $BIN ]] || die "no ckptfs binary at $BIN (build it or set CKPTFS_BIN)"
BIN=$(readlink -f "$BIN")
command -v fusermount3 >/dev/null || die "fusermount3 not found"
[[ -e /dev/fuse ]] || die "/dev/fuse missing"
"$PYTHON" -c 'import os; os.preadv' 2>/dev/null || die "$PYTHON cannot run the readers (python >= 3.7 on Linux)"
[[ $TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "TIMEOUT must be a positive number of seconds"
[[ $MODEL == qwen2-7b || $MODEL == llama3-8b ]] || die "MODEL must be qwen2-7b or llama3-8b, not '$MODEL'"
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "REPEAT must be a positive integer"
[[ $STAT == median || $STAT == best ]] || die "STAT must be median or best, not '$STAT'"
[[ $READ_SIZE =~ ^([1-9][0-9]{0,6})([KkMm]?)$ ]] ||
    die "READ_SIZE must be a number of bytes, KiB (K) or MiB (M), e.g. 128K, 1M, 4M; not '$READ_SIZE'"
case ${BASH_REMATCH[2]} in
[Kk]) READ_BYTES=$((BASH_REMATCH[1] * 1024)) ;;
[Mm]) READ_BYTES=$((BASH_REMATCH[1] * 1048576)) ;;
*) READ_BYTES=${BASH_REMATCH[1]} ;;
esac
((READ_BYTES % 4096 == 0)) || die "READ_SIZE must be a multiple of 4096 bytes, not '$READ_SIZE'"
read -ra NS <<<"$READERS"
((${#NS[@]} > 0)) || die "READERS is empty"
for n in "${NS[@]}"; do [[ $n =~ ^[1-9][0-9]*$ ]] || die "READERS: '$n' is not a positive integer"; done
read -ra VIEW_LIST <<<"$VIEWS"
for v in "${VIEW_LIST[@]}"; do [[ $v =~ ^[A-Za-z0-9_]+(:[A-Za-z0-9_=,.]+)?$ ]] || die "VIEWS: '$v' is not VIEW or VIEW:OPTIONS"; done
WHATS=(direct "${VIEW_LIST[@]}")
CAN_DROP=0
[[ $(id -u) == 0 && -w /proc/sys/vm/drop_caches ]] && CAN_DROP=1
read -ra CONDS <<<"${CONDITIONS:-cold cached}"
for c in "${CONDS[@]}"; do [[ $c == cold || $c == cached ]] || die "CONDITIONS: '$c' is not cold or cached"; done
for m in $GPU_MODES; do [[ $m == torch || $m == slice ]] || die "GPU_MODES: '$m' is not torch or slice"; done

# --- cleanup -------------------------------------------------------------------------------------

mkdir -p "$BENCH_DIR"
JOB_PID=""

# A measurement still running (readers, rank processes): TERM to `timeout`, which passes it on
# to its process group.
stop_job() {
    [[ -n $JOB_PID ]] || return 0
    kill -TERM "$JOB_PID" 2>/dev/null || true
    wait_gone "$JOB_PID" 10 || kill -KILL "$JOB_PID" 2>/dev/null || true
    wait "$JOB_PID" 2>/dev/null || true
    JOB_PID=""
}

bench_stop() { stop_job; }
bench_start "$BENCH_DIR/node-run.XXXXXX"

# --- helpers -------------------------------------------------------------------------------------

# run_job OUT ERR CMD...: CMD under `timeout` in the background (so a signal to this script
# is handled at once), stdout to OUT, stderr to ERR; returns its status.
run_job() {
    local out=$1 err=$2 rc=0
    shift 2
    timeout --kill-after=10 "$TIMEOUT" "$@" >"$out" 2>"$err" &
    JOB_PID=$!
    wait "$JOB_PID" || rc=$?
    JOB_PID=""
    return "$rc"
}

# do_mount [OPTS]: a fresh mount of $SRC on $MNT with $MOUNT_OPTS and OPTS; sets DAEMON_PID.
do_mount() {
    local opts=${MOUNT_OPTS}${MOUNT_OPTS:+${1:+,}}${1:-}
    unmount
    timeout "$TIMEOUT" "$BIN" mount ${opts:+-o "$opts"} "$SRC" "$MNT" || {
        DAEMON_PID=$(find_daemon "$BIN" || true)
        die "ckptfs mount ${opts:+-o $opts }$SRC failed or hung"
    }
    is_mounted "$MNT" || die "ckptfs mount returned but $MNT is not mounted"
    DAEMON_PID=$(find_daemon "$BIN") || die "cannot find the ckptfs daemon for $MNT"
}

# The files a reader of VIEW reads, in order (on the mount): the weights of hf/, the rank files
# of a Megatron layout, the .distcp files of mcore/, every file of anything else.
view_files() {
    local dir=$MNT/$1/
    case $1 in
    hf) timeout "$TIMEOUT" find "$dir" -maxdepth 1 -name '*.safetensors' | sort ;;
    tp* | pp*) timeout "$TIMEOUT" find "$dir" -name model_optim_rng.pt | sort ;;
    mcore) timeout "$TIMEOUT" find "$dir" -name '*.distcp' | sort -V ;;
    *) timeout "$TIMEOUT" find "$dir" -type f | sort -V ;;
    esac
}

sum_sizes() { local s=0 f; for f in "$@"; do s=$((s + $(stat -L -c %s "$f"))); done; echo "$s"; }

CLK_TCK=$(getconf CLK_TCK)
cpu_s() { awk -v hz="$CLK_TCK" '{sub(/^.*\) /, ""); printf "%.2f\n", ($12 + $13) / hz}' "/proc/$1/stat"; }

# Bytes of FILE... in the page cache (fincore), or "" when fincore is missing.
cached_bytes() {
    command -v fincore >/dev/null || return 0
    fincore --bytes --noheadings --output RES "$@" 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'
}

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
warm_source() { cat "${SRC_FILES[@]}" >/dev/null; }

CACHE_WARN=()
# prepare COND: cold: drop the page cache (and check the source left it); cached: read the
# source into it (and check it stayed).
prepare() {
    local c
    if [[ $1 == cold ]]; then
        drop_caches
        c=$(cached_bytes "${SRC_FILES[@]}")
        if [[ -n $c ]] && ((c * 100 > SRC_BYTES)); then
            CACHE_WARN+=("cold run ($2): $c source bytes still cached after drop_caches")
        fi
    else
        warm_source
        c=$(cached_bytes "${SRC_FILES[@]}")
        if [[ -n $c ]] && ((c * 100 < SRC_BYTES * 99)); then
            CACHE_WARN+=("cached run ($2): only $c of $SRC_BYTES source bytes in the page cache (memory?)")
        fi
    fi
}

gbps() { awk -v b="$1" -v s="$2" 'BEGIN {printf "%.2f", b / s / 1e9}'; }
div2() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else printf "-"}'; }
gb() { awk -v b="$1" 'BEGIN {printf "%.2f", b / 1e9}'; }
err_tail() { tail -n 3 "$1" | sed 's/^/    /' >&2; }

OTHERS_START=$(others)
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
T_START=$(now_us)

# --- input ---------------------------------------------------------------------------------------

SRC=$("$PYTHON" "$HELPER" gen --model "$MODEL" ${SIZE:+--size "$SIZE"} "$BENCH_DIR") || die "no checkpoint (see above)"
[[ -f $SRC/model.safetensors.index.json ]] || die "no checkpoint at $SRC"
mapfile -t SRC_FILES < <(find "$SRC" -maxdepth 1 -name '*.safetensors' | sort)
((${#SRC_FILES[@]} > 0)) || die "no *.safetensors in $SRC"
SRC_BYTES=$(sum_sizes "${SRC_FILES[@]}")
MODEL_DESC=$("$PYTHON" -c 'import json, sys
c = json.load(open(sys.argv[1]))
print("{}, hidden {}, {} layers, {} heads / {} KV heads, ffn {}, vocab {}, bf16".format(
    c["architectures"][0], c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
    c["num_key_value_heads"], c["intermediate_size"], c["vocab_size"]))' "$SRC/config.json")

# Python reader check (untimed in the matrix): one reader of the cached source, python vs dd.
note "reader check: one reader of the cached source, node_bench.py read vs dd bs=1M"
warm_source
run_job "$RUN_DIR/check.out" "$RUN_DIR/check.err" "$PYTHON" "$HELPER" read 1 "${SRC_FILES[@]}" ||
    { err_tail "$RUN_DIR/check.err"; die "the python reader failed"; }
read -r _ CHECK_PY_S CHECK_PY_CPU <"$RUN_DIR/check.out"
t0=$(now_us)
for f in "${SRC_FILES[@]}"; do
    timeout "$TIMEOUT" dd if="$f" of=/dev/null bs=1M status=none || die "dd of $f failed"
done
CHECK_DD_S=$(awk -v us="$(($(now_us) - t0))" 'BEGIN {printf "%.6f", us / 1e6}')

# --- the matrix ----------------------------------------------------------------------------------

# RUNS[METRIC.WHAT.COND.N]: the single runs; VAL[...]: their median. METRIC: gbps, ratio (to
# direct, of the medians), dcpu (daemon CPU s/GB), dcores (daemon CPU s / wall s), rcpu (readers'
# CPU s/GB).
declare -A RUNS VAL BYTES NFILES SKIP
# measure WHAT COND N: N readers of WHAT (direct: the source files; else MNT/WHAT on a fresh mount).
measure() {
    local what=$1 cond=$2 n=$3 files=() c0=0 c1=0 bytes wall rcpu key=$1.$2.$3
    local view=${1%%:*} extra=""
    [[ $what == *:* ]] && extra=${what#*:}
    if [[ $what == direct ]]; then
        files=("${SRC_FILES[@]}")
    else
        do_mount "$extra"
        if ! timeout "$TIMEOUT" test -d "$MNT/$view/"; then
            SKIP[$what]="not served by this mount (invalid layout for the model? 'ckptfs inspect SRC --layout $what' says why)"
            unmount
            return 0
        fi
        mapfile -t files < <(view_files "$view")
        if ((${#files[@]} == 0)); then
            SKIP[$what]="no files to read in $view/"
            unmount
            return 0
        fi
    fi
    NFILES[$what]=${#files[@]}
    prepare "$cond" "$what, $n readers"
    [[ -n $DAEMON_PID ]] && c0=$(cpu_s "$DAEMON_PID")
    run_job "$RUN_DIR/read.out" "$RUN_DIR/read.err" "$PYTHON" "$HELPER" read --chunk "$READ_BYTES" "$n" "${files[@]}" ||
        { err_tail "$RUN_DIR/read.err"; die "$n readers of $what ($cond) failed or took over ${TIMEOUT}s"; }
    [[ -n $DAEMON_PID ]] && c1=$(cpu_s "$DAEMON_PID")
    read -r bytes wall rcpu <"$RUN_DIR/read.out"
    BYTES[$what]=$bytes
    local g
    g=$(gbps "$bytes" "$wall")
    RUNS[gbps.$key]+=" $g"
    RUNS[rcpu.$key]+=" $(awk -v c="$rcpu" -v b="$bytes" 'BEGIN {printf "%.2f", c / (b / 1e9)}')"
    if [[ $what != direct ]]; then
        RUNS[dcpu.$key]+=" $(awk -v a="$c0" -v b="$c1" -v by="$bytes" 'BEGIN {printf "%.2f", (b - a) / (by / 1e9)}')"
        RUNS[dcores.$key]+=" $(awk -v a="$c0" -v b="$c1" -v w="$wall" 'BEGIN {printf "%.2f", (b - a) / w}')"
        unmount
    fi
    note "$(printf 'round %s/%s: %-8s %-6s %2s readers: %6s GB/s' "$ROUND" "$REPEAT" "$what" "$cond" "$n" "$g")"
}


((CAN_DROP)) || note "cold runs skipped: dropping the page cache needs root"
# Every round measures every cell once; odd rounds go through the views in reverse order, so that
# no view always follows the same one.
for ((ROUND = 1; ROUND <= REPEAT; ROUND++)); do
    order=("${WHATS[@]}")
    if ((ROUND % 2 == 0)); then
        order=()
        for ((i = ${#WHATS[@]} - 1; i >= 0; i--)); do order+=("${WHATS[i]}"); done
    fi
    for cond in "${CONDS[@]}"; do
        [[ $cond == cold ]] && ((!CAN_DROP)) && continue
        for n in "${NS[@]}"; do
            for what in "${order[@]}"; do
                [[ -n ${SKIP[$what]:-} ]] && continue
                measure "$what" "$cond" "$n"
            done
        done
    done
done
for k in "${!RUNS[@]}"; do
    read -ra runs <<<"${RUNS[$k]}"
    if [[ $STAT == best && $k == gbps.* ]]; then
        VAL[$k]=$(printf '%s\n' "${runs[@]}" | sort -g | tail -n 1)
    else
        VAL[$k]=$(median --even-format %.2f "${runs[@]}")
    fi
done

# --- GPU load comparison -------------------------------------------------------------------------

GPU_LINES=()
GPU_ROWS=()
gpu_section() {
    local py="" cand t layout why cond files r mode label
    if [[ $GPU == 0 ]]; then
        GPU_LINES+=("GPU load comparison: skipped (GPU=0)")
        return 0
    fi
    local probe='import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'
    [[ $GPU_DEVICE == cpu ]] && probe='import torch'
    for cand in ${GPU_PYTHON:-} "$PYTHON" python3; do
        if timeout 120 "$cand" -c "$probe" >/dev/null 2>&1; then py=$cand; break; fi
    done
    if [[ -z $py ]]; then
        GPU_LINES+=("GPU load comparison: skipped (no GPU: torch.cuda.is_available() is not true for ${GPU_PYTHON:-$PYTHON} or python3)")
        return 0
    fi
    local has_st=1
    timeout 120 "$py" -c 'import safetensors' >/dev/null 2>&1 || has_st=0
    local info
    info=$(timeout 120 "$py" -c 'import sys, torch
d = "cpu (GPU_DEVICE=cpu: a test of the script, not a GPU figure)"
if sys.argv[1] != "cpu":
    n = torch.cuda.device_count()
    d = f"{n} x {torch.cuda.get_device_name(0)}"
print(f"torch {torch.__version__}, {d}")' "$GPU_DEVICE" 2>/dev/null || echo "torch ?")
    GPU_LINES+=("GPU load comparison: $info; $py")
    GPU_LINES+=("T rank processes (rank r on device r mod count), started together once each has imported")
    GPU_LINES+=("torch and set up its device; wall = start to the last rank's end. torch.load: each rank loads")
    GPU_LINES+=("its tp{T}pp1 rank file through a fresh mount, map_location=$GPU_DEVICE. get_slice: safe_open of")
    GPU_LINES+=("every HF shard, get_slice of the rank's Megatron TP share of each tensor, .to($GPU_DEVICE). Peak")
    GPU_LINES+=("RSS: the largest VmHWM of a rank at its end (in brackets: its VmRSS once ready, before loading).")
    ((has_st)) || GPU_LINES+=("safetensors is not importable by $py: the get_slice rows are skipped")
    ((CAN_DROP)) || GPU_LINES+=("not root: no cold runs")
    for t in $GPU_TP; do
        [[ $t =~ ^[1-9][0-9]*$ ]] || { GPU_LINES+=("GPU_TP: '$t' skipped (not a number)"); continue; }
        layout=tp${t}pp1
        if ! why=$("$BIN" inspect "$SRC" --layout "$layout" ${MOUNT_OPTS:+-o "$MOUNT_OPTS"} 2>&1 >/dev/null); then
            GPU_LINES+=("$layout: skipped: ${why:-not a valid layout for this model}")
            continue
        fi
        for mode in $GPU_MODES; do
            [[ $mode == slice ]] && ((!has_st)) && continue
            if [[ $mode == torch ]]; then label="tp$t torch.load(MNT/$layout rank file)"; else label="tp$t safe_open+get_slice (HF shards)"; fi
            local row
            row=$(printf '%-40s' "$label")
            local hwm_all=() rdy_all=() gbytes=""
            for cond in "${CONDS[@]}"; do
                if [[ $cond == cold ]] && ((!CAN_DROP)); then row+=$(printf ' %9s' "-"); continue; fi
                files=()
                if [[ $mode == torch ]]; then
                    do_mount
                    for ((r = 0; r < t; r++)); do
                        files+=("$MNT/$layout/release/$(printf 'mp_rank_%02d' "$r")/model_optim_rng.pt")
                    done
                    timeout "$TIMEOUT" stat -L "${files[@]}" >/dev/null ||
                        { GPU_LINES+=("$label: rank files missing on the mount"); unmount; row+=$(printf ' %9s' "failed"); continue; }
                else
                    files=("$SRC")
                fi
                prepare "$cond" "GPU $label"
                note "GPU: $label, $cond"
                if run_job "$RUN_DIR/gpu.out" "$RUN_DIR/gpu.err" "$py" "$HELPER" gpu --mode "$mode" --tp "$t" \
                    --device "$GPU_DEVICE" "${files[@]}"; then
                    local wall by hwm rdy
                    read -r wall by hwm rdy _ <"$RUN_DIR/gpu.out"
                    row+=$(printf ' %9s' "$wall")
                    gbytes=$(gb "$by")
                    hwm_all+=("$hwm") rdy_all+=("$rdy")
                else
                    row+=$(printf ' %9s' "failed")
                    GPU_LINES+=("$label, $cond: failed or took over ${TIMEOUT}s: $(tail -n 1 "$RUN_DIR/gpu.err")")
                fi
                [[ $mode == torch ]] && unmount
            done
            local hwm_max rdy_max
            hwm_max=$(printf '%s\n' "${hwm_all[@]}" | sort -g | tail -n 1)
            rdy_max=$(printf '%s\n' "${rdy_all[@]}" | sort -g | tail -n 1)
            row+=$(printf ' %10s %18s' "${gbytes:--}" "${hwm_max:--} (${rdy_max:--})")
            GPU_ROWS+=("$row")
        done
    done
}
gpu_section

# --- report --------------------------------------------------------------------------------------

BUILD_TYPE="?"
CACHE=$(dirname "$BIN")/CMakeCache.txt
SRC_DIR=""
if [[ -f $CACHE ]]; then
    BUILD_TYPE=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$CACHE")
    SRC_DIR=$(sed -n 's/^CMAKE_HOME_DIRECTORY:[A-Z]*=//p' "$CACHE")
fi
COMMIT=""
if [[ -n $SRC_DIR ]] && git -C "$SRC_DIR" rev-parse --git-dir >/dev/null 2>&1; then
    COMMIT=$(git -C "$SRC_DIR" rev-parse --short HEAD 2>/dev/null || true)
    git -C "$SRC_DIR" diff --quiet HEAD -- 2>/dev/null || COMMIT+=" + uncommitted changes"
    COMMIT="built $(date -r "$BIN" '+%Y-%m-%d %H:%M') from $SRC_DIR, which is now at $COMMIT"
fi
MEM=$(awk '/^MemTotal:/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)
CPU_MODEL=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)
MAX_PAGES=$(cat /proc/sys/fs/fuse/max_pages_limit 2>/dev/null || echo "n/a (no /proc/sys/fs/fuse/max_pages_limit)")
STORE=$(findmnt -n -o SOURCE,FSTYPE -T "$SRC" 2>/dev/null | awk '{print $1 " (" $2 ")"}')
WALL_MIN=$(awk -v us="$(($(now_us) - T_START))" 'BEGIN {printf "%.1f", us / 6e7}')

echo
echo "ckptfs read path at node scale   $(date '+%Y-%m-%d %H:%M')   $(hostname)"
echo "cores: $(nproc) (nproc), CPU: ${CPU_MODEL:-?}, memory: $MEM, kernel $(uname -r)"
if ((CAN_DROP)); then
    best=0 bestn=""
    for n in "${NS[@]}"; do
        v=${VAL[gbps.direct.cold.$n]:-0}
        if awk -v a="$v" -v b="$best" 'BEGIN {exit !(a > b)}'; then best=$v bestn=$n; fi
    done
    echo "storage: $SRC on ${STORE:-?}; direct cold reads ${VAL[gbps.direct.cold.${NS[0]}]:-?} GB/s (N=${NS[0]}), best $best GB/s (N=$bestn)"
else
    echo "storage: $SRC on ${STORE:-?}; direct cold speed not measured (not root: no drop_caches)"
fi
echo "fuse: max_pages_limit $MAX_PAGES"
echo "ckptfs: $BIN ($("$BIN" --version 2>/dev/null | head -n 1 || echo '?'), CMAKE_BUILD_TYPE ${BUILD_TYPE:-(empty)}${COMMIT:+, $COMMIT})"
echo "mount options: ${MOUNT_OPTS:-(none: the defaults, prefetch=auto: 16M of frames decoded ahead for packed sources, 32M of raw ones on a local disk, none elsewhere)}"
echo "model: $MODEL_DESC; ${#SRC_FILES[@]} shards, $SRC_BYTES bytes"
echo "readers: node_bench.py read, $("$PYTHON" -c 'import platform; print("python", platform.python_version())'), one process each, pread $READ_SIZE ($READ_BYTES bytes) into one page-aligned buffer."
echo "  check, 1 reader, source cached: python $(gbps "$SRC_BYTES" "$CHECK_PY_S") GB/s" \
    "($(awk -v c="$CHECK_PY_CPU" -v b="$SRC_BYTES" 'BEGIN {printf "%.2f", c / (b / 1e9)}') CPU s/GB), dd bs=1M $(gbps "$SRC_BYTES" "$CHECK_DD_S") GB/s"
OTHERS_END=$(others)
warn_others "$OTHERS_START" "$OTHERS_END"
echo "load average: $LOAD_START at start, $(cut -d' ' -f1 /proc/loadavg) at end; $WALL_MIN min"
echo
echo "N readers share the bytes of a view's files (in order, cut into N equal ranges at $READ_SIZE:"
echo "4 rank files and 4 readers is one file each; 16 readers, 4 ranges of each). direct: the"
echo "source shards. Each view on a fresh mount. cold: sync + drop_caches before the read; cached:"
echo "the source read into the page cache before (the view's own cache is empty: fresh mount)."
((CAN_DROP)) || echo "cold: not measured (dropping the page cache needs root)"
echo

cols=()
for cond in "${CONDS[@]}"; do for n in "${NS[@]}"; do cols+=("$n $cond"); done; done
header() {
    local line c
    line=$(printf '%-*s %7s %3s |' "$LABEL_W" "$1" "$2" "$3")
    for c in "${cols[@]}"; do
        line+=$(printf ' %9s' "$c")
        [[ $c == "${NS[-1]} cold" ]] && line+=" |"
    done
    echo "$line"
}
row() { # LABEL BYTES_COL FILES_COL METRIC WHAT
    local line cond n v
    line=$(printf '%-*s %7s %3s |' "$LABEL_W" "$1" "$2" "$3")
    for cond in "${CONDS[@]}"; do
        for n in "${NS[@]}"; do
            v=${VAL[$4.$5.$cond.$n]:--}
            line+=$(printf ' %9s' "$v")
        done
        [[ $cond == cold ]] && line+=" |"
    done
    echo "$line"
}
for what in "${WHATS[@]}"; do
    for cond in "${CONDS[@]}"; do
        for n in "${NS[@]}"; do
            [[ -n ${VAL[gbps.$what.$cond.$n]:-} && -n ${VAL[gbps.direct.$cond.$n]:-} ]] || continue
            VAL[ratio.$what.$cond.$n]=$(div2 "${VAL[gbps.$what.$cond.$n]}" "${VAL[gbps.direct.$cond.$n]}")
        done
    done
done
label_of() { if [[ $1 == direct ]]; then echo direct; elif [[ $1 == *:* ]]; then echo "${1%%:*}/ ${1#*:}"; else echo "$1/"; fi; }
LABEL_W=8
for what in "${WHATS[@]}"; do l=$(label_of "$what"); ((${#l} > LABEL_W)) && LABEL_W=${#l}; done

if ((REPEAT > 1)); then
    echo "Total read throughput, GB/s (1e9 bytes/s) of N concurrent readers, $STAT of $REPEAT rounds:"
else
    echo "Total read throughput, GB/s (1e9 bytes/s) of N concurrent readers, one round:"
fi
header what GB files
for what in "${WHATS[@]}"; do
    [[ -n ${SKIP[$what]:-} ]] && continue
    row "$(label_of "$what")" "$(gb "${BYTES[$what]:-0}")" "${NFILES[$what]:-?}" gbps "$what"
done
if ((REPEAT > 1)); then
    echo "single runs, GB/s, in round order:"
    for what in "${WHATS[@]}"; do
        [[ -n ${SKIP[$what]:-} ]] && continue
        for cond in "${CONDS[@]}"; do
            line=""
            for n in "${NS[@]}"; do
                [[ -n ${RUNS[gbps.$what.$cond.$n]:-} ]] && line+="${line:+;  }N=$n:${RUNS[gbps.$what.$cond.$n]}"
            done
            [[ -n $line ]] && printf '  %-*s %-6s %s\n' "$LABEL_W" "$(label_of "$what")" "$cond" "$line"
        done
    done
fi
echo
echo "Ratio to direct in the same condition:"
header what "" ""
for what in "${VIEW_LIST[@]}"; do
    [[ -n ${SKIP[$what]:-} ]] && continue
    row "$(label_of "$what")" "" "" ratio "$what"
done
echo
echo "Daemon CPU seconds per GB read (utime + stime of the daemon from /proc/PID/stat, during the read):"
header what "" ""
for what in "${VIEW_LIST[@]}"; do
    [[ -n ${SKIP[$what]:-} ]] && continue
    row "$(label_of "$what")" "" "" dcpu "$what"
done
echo
echo "Daemon CPU cores busy (its CPU seconds / wall seconds of the read; $(nproc) cores):"
header what "" ""
for what in "${VIEW_LIST[@]}"; do
    [[ -n ${SKIP[$what]:-} ]] && continue
    row "$(label_of "$what")" "" "" dcores "$what"
done
echo
echo "Readers' CPU seconds per GB (all N python readers together):"
header what "" ""
for what in "${WHATS[@]}"; do
    [[ -n ${SKIP[$what]:-} ]] && continue
    row "$(label_of "$what")" "" "" rcpu "$what"
done
for what in "${VIEW_LIST[@]}"; do
    [[ -n ${SKIP[$what]:-} ]] && echo "$what/: skipped: ${SKIP[$what]}"
done
for w in "${CACHE_WARN[@]}"; do echo "WARNING: $w"; done

echo
printf '%s\n' "${GPU_LINES[@]}"
if ((${#GPU_ROWS[@]} > 0)); then
    head=$(printf '%-40s' "")
    for cond in "${CONDS[@]}"; do head+=$(printf ' %9s' "$cond s"); done # a column per condition run
    printf '%s %10s %18s\n' "$head" "GB loaded" "peak RSS/rank MiB"
    printf '%s\n' "${GPU_ROWS[@]}"
fi
