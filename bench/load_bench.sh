#!/usr/bin/env bash
# Rank processes loading their files through a view, started together, under several mount
# settings side by side: the time from the start to the last rank done, median of REPEAT rounds,
# and its ratio to the first setting's. Source in the page cache; a fresh mount for every load.
#   torch: REPLICAS processes per rank file of LAYOUT each torch.load it (torch 1.13, map_location=cpu)
#   dcp:   DCP_TP processes each dcp.load their tensor-parallel share of mcore/ (torch 2.6 in the
#          Debian 13 root, bench/mcore_share.py); skipped where that root is absent
# Imports happen before the start (each rank waits at a barrier), so only the loads are timed.
#
#   bench/load_bench.sh SRC
#
#   SRC          a Hugging Face checkpoint directory (node_bench.sh --quick makes one under
#                /tmp/ckptfs-bench)
# Environment:
#   CKPTFS_BIN   the binary (default: <repo>/build/ckptfs)
#   SETTINGS     mount option sets to compare, the first is the baseline; "-" for no options
#                (default "direct_io=on direct_io=off")
#   LAYOUT       the layout whose rank files torch loads (default tp4pp1)
#   DCP_TP       tensor-parallel degree of the dcp loads (default 2; 0 skips them)
#   REPLICAS     processes loading each rank file (default 1; data-parallel replicas on a node)
#   REPEAT       rounds (default 5); even rounds go through SETTINGS in reverse order
#   PYTHON       python with torch for the torch loads (default /usr/bin/python3)
#   TORCH2_ROOT  the Debian 13 root with torch 2.6 (default /var/cache/ckptfs-tests/trixie-root)
#   DCP_PYTHON   a python with torch 2.x to run the dcp loads instead of the root's (a GPU node's)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
BIN=${CKPTFS_BIN:-$REPO/build/ckptfs}
SETTINGS=${SETTINGS:-direct_io=on direct_io=off}
LAYOUT=${LAYOUT:-tp4pp1}
DCP_TP=${DCP_TP:-2}
REPEAT=${REPEAT:-5}
REPLICAS=${REPLICAS:-1}
PYTHON=${PYTHON:-/usr/bin/python3}
TORCH2_ROOT=${TORCH2_ROOT:-/var/cache/ckptfs-tests/trixie-root}
DCP_PYTHON=${DCP_PYTHON:-}

BENCH_NAME=load_bench
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"
[[ $# -eq 1 && -d $1 ]] || { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2; }
SRC=$(readlink -f "$1")
[[ -x $BIN ]] || die "no ckptfs binary at $BIN (build it or set CKPTFS_BIN)"
BIN=$(readlink -f "$BIN")
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "REPEAT must be a positive integer"
[[ $DCP_TP =~ ^[0-9]+$ ]] || die "DCP_TP must be a number"
[[ $REPLICAS =~ ^[1-9][0-9]*$ ]] || die "REPLICAS must be a positive integer"
"$PYTHON" -c 'import torch' 2>/dev/null || die "$PYTHON has no torch"
read -ra SETS <<<"$SETTINGS"
((${#SETS[@]} > 0)) || die "SETTINGS is empty"
DCP=1
if ((DCP_TP == 0)); then
    DCP=0
elif [[ -n $DCP_PYTHON ]]; then
    "$DCP_PYTHON" -c 'import torch.distributed.checkpoint' 2>/dev/null ||
        die "DCP_PYTHON=$DCP_PYTHON cannot import torch.distributed.checkpoint"
elif [[ ! -x $TORCH2_ROOT/usr/bin/python3 ]]; then
    DCP=0
    note "no torch 2.6 root at $TORCH2_ROOT: dcp loads skipped"
fi

bench_stop() {
    stop_ranks
    # the directories torch2.sh's bind mounts made inside the root
    rmdir "$TORCH2_ROOT$RUN_DIR" 2>/dev/null || true
    rmdir "$TORCH2_ROOT$HERE" 2>/dev/null || true
}
bench_start /tmp/ckptfs-load-bench.XXXXXX

# One rank of the torch loads: imports, barrier, torch.load, its end time.
cat >"$RUN_DIR/torch_rank.py" <<'PY'
import os, sys, time
import torch
path, prefix, rank = sys.argv[1], sys.argv[2], sys.argv[3]
open(f"{prefix}.ready.{rank}", "w").close()
while not os.path.exists(f"{prefix}.go"):
    time.sleep(0.002)
sd = torch.load(path, map_location="cpu", weights_only=False)  # args: an argparse.Namespace
assert "model" in sd, path
print(f"RESULT end={time.time():.6f}")
PY

# torch2 ARGS...: DCP_PYTHON, or the root's python3 with $RUN_DIR and bench/ at the same paths.
torch2() {
    if [[ -n $DCP_PYTHON ]]; then
        "$DCP_PYTHON" "$@"
    else
        "$HERE/torch2.sh" "$TORCH2_ROOT" "$RUN_DIR:$HERE" "$@"
    fi
}

do_mount() { # SETTING
    local opts=$1
    [[ $opts == - ]] && opts=""
    unmount
    "$BIN" mount -o "layouts=$LAYOUT${opts:+,$opts}" "$SRC" "$MNT" || die "mount -o $opts failed"
    DAEMON_PID=$(find_daemon "$BIN") || die "no daemon for $MNT"
}

RANK_PIDS=()
# stop_ranks: ranks still running (a failed round, or a signal), by PID.
stop_ranks() {
    local pid
    for pid in "${RANK_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${RANK_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    RANK_PIDS=()
}

# start_together PREFIX: waits until every rank in RANK_PIDS is ready (failing if one exits
# first), then lets them go; sets T0 (seconds, wall clock).
start_together() {
    local prefix=$1 i pid
    for ((i = 0; i < 60000; i++)); do
        (($(compgen -G "$prefix.ready.*" | wc -l) >= ${#RANK_PIDS[@]})) && break
        for pid in "${RANK_PIDS[@]}"; do alive "$pid" || die "a rank exited before the start: $(tail -3 "$prefix".err.* 2>/dev/null)"; done
        sleep 0.01
    done
    (($(compgen -G "$prefix.ready.*" | wc -l) >= ${#RANK_PIDS[@]})) || die "ranks not ready after 600 s"
    T0=$(date +%s.%N)
    : >"$prefix.go"
}

# finish PREFIX WHAT: waits for the ranks; sets LOAD_T, the seconds from T0 to the last rank done.
finish() {
    local prefix=$1 what=$2 r
    for r in "${!RANK_PIDS[@]}"; do
        wait "${RANK_PIDS[$r]}" || { tail -5 "$prefix.err.$r" >&2; die "$what rank $r failed"; }
    done
    RANK_PIDS=()
    unmount
    LOAD_T=$(cat "$prefix".out.* | sed -n 's/.*end=\([0-9.]*\).*/\1/p' | sort -n | tail -1 | awk -v t="$T0" '{printf "%.3f\n", $1 - t}')
}

# load_torch SETTING ROUND: every rank file of $LAYOUT loaded by $REPLICAS processes.
load_torch() {
    local prefix=$RUN_DIR/b-torch-$2-${1//[^a-z0-9]/_} files f k n=0
    do_mount "$1"
    mapfile -t files < <(find "$MNT/$LAYOUT/release" -name model_optim_rng.pt | sort)
    ((${#files[@]} > 0)) || die "no rank files in $MNT/$LAYOUT"
    for f in "${files[@]}"; do
        for ((k = 0; k < REPLICAS; k++)); do
            "$PYTHON" "$RUN_DIR/torch_rank.py" "$f" "$prefix" "$n" >"$prefix.out.$n" 2>"$prefix.err.$n" &
            RANK_PIDS+=($!)
            n=$((n + 1))
        done
    done
    start_together "$prefix"
    finish "$prefix" torch
}

load_dcp() { # SETTING ROUND
    local prefix=$RUN_DIR/b-dcp-$2-${1//[^a-z0-9]/_} r
    do_mount "$1"
    for ((r = 0; r < DCP_TP; r++)); do
        torch2 "$HERE/mcore_share.py" load "$MNT/mcore/release" --tp "$DCP_TP" --rank "$r" --barrier "$prefix" \
            >"$prefix.out.$r" 2>"$prefix.err.$r" </dev/null &
        RANK_PIDS+=($!)
    done
    start_together "$prefix"
    finish "$prefix" dcp
}


cat "$SRC"/*.safetensors >/dev/null # the source in the page cache
LOADS=(torch)
((DCP)) && LOADS+=(dcp)
declare -A TIMES
for ((round = 1; round <= REPEAT; round++)); do
    order=("${SETS[@]}")
    if ((round % 2 == 0)); then
        order=()
        for ((i = ${#SETS[@]} - 1; i >= 0; i--)); do order+=("${SETS[$i]}"); done
    fi
    for s in "${order[@]}"; do
        for l in "${LOADS[@]}"; do
            "load_$l" "$s" "$round"
            TIMES[$l/$s]+="$LOAD_T "
            note "round $round/$REPEAT: $l $s: $LOAD_T s"
        done
    done
done

echo "ckptfs load_bench: $(nproc) CPUs, Linux $(uname -r), $("$BIN" --version)"
echo "source: $SRC ($(du -sb "$SRC" | cut -f1) bytes), in the page cache; a fresh mount per load"
echo "torch: $LAYOUT rank files, $REPLICAS torch.load of each (torch $("$PYTHON" -c 'import torch; print(torch.__version__)'))"
((DCP)) && echo "dcp: $DCP_TP ranks, dcp.load of each one's TP-$DCP_TP share of mcore/ (torch $(torch2 -c 'import torch; print(torch.__version__)'))"
echo "Seconds from the start to the last rank done, median of $REPEAT (single runs after);"
echo "ratio = the first setting's median / this one's (above 1: faster than the first)"
printf '%-6s %-28s %8s %7s   %s\n' load setting median ratio runs
for l in "${LOADS[@]}"; do
    base=""
    for s in "${SETS[@]}"; do
        m=$(tr ' ' '\n' <<<"${TIMES[$l/$s]}" | grep . | median -)
        [[ -z $base ]] && base=$m
        printf '%-6s %-28s %8.3f %7.2f   %s\n' "$l" "$s" "$m" "$(awk -v b="$base" -v m="$m" 'BEGIN {print b / m}')" "${TIMES[$l/$s]}"
    done
done
