#!/usr/bin/env bash
# ckptfs verl FSDP benchmark: a verl FSDP checkpoint (FSDP2, W=8, fp32 DTensor shards) as a ckptfs
# source, its hf/ view (bf16 safetensors, converted on read) against verl's offline merger. One
# run, figures side by side:
#  (1) a fresh `ckptfs mount ROLE_DIR MNT` + `cp -r MNT/hf` + sync vs bench/verl_merger.py (the
#      way verl's model_merger merges: torch.load of every shard, torch.cat, .bfloat16(),
#      safetensors save_file) + sync; runs interleaved, medians of REPEAT; ratio merger / ckptfs,
#      peak RSS of each (daemon VmHWM + cp's max RSS; the merger's max RSS).
#  (2) check (untimed, run 1's outputs): both hold the same tensors (names, dtype, shape, bytes),
#      and they are the generator's bf16 values (bench/gen_verl_fsdp.py --check).
#  (3) read throughput of hf/ (fp32 -> bf16 on read): dd bs=1M of every MNT/hf/*.safetensors, first
#      read on a fresh mount and second read on the same mount, in GB/s of output (bf16) bytes,
#      against dd of the same bytes from a plain copy (run 1's cp output); medians of REPEAT.
# The source is in the page cache for every measurement: its shard files are read once (cat to
# /dev/null) right before every timed step, on both sides.
#
# Needs root, /dev/fuse, fusermount3, unshare, chroot, /usr/bin/time (GNU), Debian's
# /usr/bin/python3 with numpy (the checks), and the tests' Debian 13 root with torch 2.6 +
# safetensors (built by tests/run-all.sh) for the generator and the merger. Builds nothing.
#
# Environment:
#   CKPTFS_BIN   the binary (default: $CKPTFS, else <repo>/build/ckptfs)
#   BENCH_DIR    work dir; keeps the generated checkpoint verl-w8/ between runs (default /tmp/ckptfs-bench)
#   REPEAT       runs of each side of (1) and of (3) (default 3; median shown)
#   MOUNT_OPTS   -o options for every mount (default none: hf/ in the source's bf16)
#   CHECK_GEN    1: (2) also checks the view's output against the generator's values (~30 s; default 1)
#   PYTHON       python with numpy for the checks (default /usr/bin/python3)
#   CKPTFS_TORCH2_ROOT  Debian 13 root with torch 2.6 (default /var/cache/ckptfs-tests/trixie-root)
#   CP_TIMEOUT, READ_TIMEOUT, MERGE_TIMEOUT  seconds allowed per cp -r / per file read / per merge
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
BIN=${CKPTFS_BIN:-${CKPTFS:-$REPO/build/ckptfs}}
BENCH_DIR=${BENCH_DIR:-/tmp/ckptfs-bench}
REPEAT=${REPEAT:-3}
MOUNT_OPTS=${MOUNT_OPTS:-}
CHECK_GEN=${CHECK_GEN:-1}
PYTHON=${PYTHON:-/usr/bin/python3}
ROOT=${CKPTFS_TORCH2_ROOT:-/var/cache/ckptfs-tests/trixie-root}
CP_TIMEOUT=${CP_TIMEOUT:-600}
READ_TIMEOUT=${READ_TIMEOUT:-300}
MERGE_TIMEOUT=${MERGE_TIMEOUT:-1800}

BENCH_NAME=verl_bench BENCH_NOTE_TIME=1
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"

[[ -x $BIN ]] || die "no ckptfs binary at $BIN (build it or set CKPTFS_BIN)"
BIN=$(readlink -f "$BIN")
[[ $(id -u) == 0 ]] || die "needs root (unshare and chroot for the torch 2.6 root)"
command -v fusermount3 >/dev/null || die "fusermount3 not found"
[[ -e /dev/fuse ]] || die "/dev/fuse missing"
for c in unshare chroot; do command -v "$c" >/dev/null || die "$c not found"; done
[[ -x /usr/bin/time ]] || die "/usr/bin/time (GNU time, for max RSS) not found"
[[ -x $ROOT/usr/bin/python3 ]] || die "no Debian 13 root with torch 2.6 at $ROOT (tests/run-all.sh builds it)"
"$PYTHON" -c 'import numpy' 2>/dev/null || die "$PYTHON lacks numpy"
((REPEAT >= 1)) || die "REPEAT must be >= 1"

mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd -P)
CKPT=$BENCH_DIR/verl-w8
ROLE=$CKPT/global_step_1/actor

# --- cleanup -------------------------------------------------------------------------------------

bench_stop() { rmdir "$ROOT$BENCH_DIR" "$ROOT$HERE" 2>/dev/null || true; } # made by the torch2 bind mounts
bench_start "$BENCH_DIR/verl-run.XXXXXX"

# --- helpers -------------------------------------------------------------------------------------



# mount_role: a fresh mount of $ROLE on $MNT; sets DAEMON_PID.
mount_role() {
    unmount
    "$BIN" mount ${MOUNT_OPTS:+-o "$MOUNT_OPTS"} "$ROLE" "$MNT" || die "ckptfs mount ${MOUNT_OPTS:+-o $MOUNT_OPTS }$ROLE failed"
    is_mounted "$MNT" || die "ckptfs mount returned but $MNT is not mounted"
    DAEMON_PID=$(find_daemon) || die "cannot find the ckptfs daemon for $MNT"
}

max() { printf '%s\n' "$@" | sort -g | tail -n 1; }
secs() { awk -v us="$1" 'BEGIN {printf "%.3f", us / 1e6}'; }
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
gbps() { awk -v b="$1" -v us="$2" 'BEGIN {printf "%.2f", b / us / 1e3}'; } # BYTES US -> GB/s
list_s() { local out="" x; for x in "$@"; do out+="${out:+ }$(awk -v us="$x" 'BEGIN {printf "%.2f", us / 1e6}')"; done; echo "$out"; }
list_mib() { local out="" x; for x in "$@"; do out+="${out:+ }$(mib "$x")"; done; echo "$out"; }
list_gbps() { local b=$1 out="" x; shift; for x in "$@"; do out+="${out:+ }$(gbps "$b" "$x")"; done; echo "$out"; }
maxrss_kib() { awk -F': ' '/Maximum resident set size/ {print $2}' "$1"; } # /usr/bin/time -v output
safetensors_in() { find "$1" -maxdepth 1 -type f -name '*.safetensors' | sort; }

OTHERS_START=$(others)
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
T_START=$(now_us)

# torch2 ARGS...: the root's python3 (torch 2.6), $BENCH_DIR (the checkpoint, this run's
# directory) and bench/ at the same paths. /usr/bin/time around TORCH2 measures python itself.
TORCH2=("$HERE/torch2.sh" "$ROOT" "$BENCH_DIR:$HERE")
torch2() { "${TORCH2[@]}" "$@"; }

# dd_all FILE...: reads every FILE with dd bs=1M to /dev/null, one after the other; prints the
# wall time in microseconds.
dd_all() {
    local t0 t1 f
    t0=$(now_us)
    for f in "$@"; do
        timeout "$READ_TIMEOUT" dd if="$f" of=/dev/null bs=1M status=none || die "reading $f failed or took over ${READ_TIMEOUT}s"
    done
    t1=$(now_us)
    echo $((t1 - t0))
}

# --- input ---------------------------------------------------------------------------------------

if [[ ! -e $CKPT ]]; then
    note "generating $CKPT (verl FSDP2 actor, W=8, fp32 shards of a ~1 GiB bf16 Llama-shaped model)"
    torch2 "$HERE/gen_verl_fsdp.py" "$CKPT" >"$RUN_DIR/gen.out" 2>"$RUN_DIR/gen.err" ||
        { grep -v 'UCX  ERROR' "$RUN_DIR/gen.err" >&2; die "gen_verl_fsdp.py failed"; }
    cat "$RUN_DIR/gen.out" >&2
fi
[[ -f $ROLE/fsdp_config.json ]] || die "$CKPT is not a complete checkpoint (no $ROLE/fsdp_config.json); remove it to regenerate"
mapfile -t SRC < <(find "$ROLE" -maxdepth 1 -name 'model_world_size_*_rank_*.pt' | sort -V)
((${#SRC[@]} > 0)) || die "no model_world_size_*_rank_*.pt in $ROLE"
SRC_BYTES=$(bytes_of "${SRC[@]}")
keep_hot() { cat "${SRC[@]}" >/dev/null; }
note "reading the source once ($SRC_BYTES bytes), so it is in the page cache for both sides"
keep_hot

# --- (1) cp -r MNT/hf vs the merger --------------------------------------------------------------

cp_round() { # DEST: sets T (us), D_HWM, C_RSS (KiB); leaves DEST in place
    local t0 t1
    rm -rf "$1"
    keep_hot
    unmount
    t0=$(now_us)
    mount_role
    timeout "$CP_TIMEOUT" /usr/bin/time -v -o "$RUN_DIR/cp.time" cp -r "$MNT/hf" "$1" ||
        die "cp -r $MNT/hf failed or took over ${CP_TIMEOUT}s"
    sync -f "$RUN_DIR"
    t1=$(now_us)
    T=$((t1 - t0)) D_HWM=$(status_kib "$DAEMON_PID" VmHWM) C_RSS=$(maxrss_kib "$RUN_DIR/cp.time")
    unmount
}

merge_round() { # DEST: sets T (us), M_RSS (KiB); leaves DEST in place
    local t0 t1
    rm -rf "$1"
    keep_hot
    t0=$(now_us)
    timeout "$MERGE_TIMEOUT" /usr/bin/time -v -o "$RUN_DIR/merge.time" "${TORCH2[@]}" \
        "$HERE/verl_merger.py" "$ROLE" "$1" >"$RUN_DIR/merge.out" 2>"$RUN_DIR/merge.err" ||
        { grep -v 'UCX  ERROR' "$RUN_DIR/merge.err" >&2; die "verl_merger.py failed"; }
    sync -f "$RUN_DIR"
    t1=$(now_us)
    T=$((t1 - t0)) M_RSS=$(maxrss_kib "$RUN_DIR/merge.time")
}

T_CP=() T_MERGE=() CP_DHWM=() CP_RSS=() MERGE_RSS=()
for ((r = 0; r < REPEAT; r++)); do
    # Alternate which side goes first, so neither always follows the other.
    for side in $( ((r % 2 == 0)) && echo "cp merge" || echo "merge cp"); do
        note "(1) run $((r + 1)) of $REPEAT: $side"
        if [[ $side == cp ]]; then
            cp_round "$RUN_DIR/cp-out.$r"
            T_CP+=("$T") CP_DHWM+=("$D_HWM") CP_RSS+=("$C_RSS")
            ((r == 0)) || rm -rf "$RUN_DIR/cp-out.$r"
        else
            merge_round "$RUN_DIR/merge-out.$r"
            T_MERGE+=("$T") MERGE_RSS+=("$M_RSS")
            ((r == 0)) && MERGE_LINE=$(sed -n 's/^verl_merger: //p' "$RUN_DIR/merge.out")
            ((r == 0)) || rm -rf "$RUN_DIR/merge-out.$r"
        fi
    done
done
VIEW_OUT=$RUN_DIR/cp-out.0 MERGE_OUT=$RUN_DIR/merge-out.0
names_of() { safetensors_in "$1" | xargs -r -n1 basename | paste -sd ' '; }
VIEW_FILES=$(names_of "$VIEW_OUT") MERGE_FILES=$(names_of "$MERGE_OUT")

# --- (2) check (untimed) -------------------------------------------------------------------------

note "(2) check: the tensors of hf/ (run 1's copy) against the merger's output"
"$PYTHON" - "$VIEW_OUT" "$MERGE_OUT" >"$RUN_DIR/check" <<'PY' ||
import json
import os
import struct
import sys


def tensors(d):
    out = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            p = os.path.join(d, fn)
            with open(p, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                head = json.loads(f.read(n))
            for k, v in head.items():
                if k != "__metadata__":
                    if k in out:
                        sys.exit(f"{k} is in two files of {d}")
                    a, b = v["data_offsets"]
                    out[k] = (p, v["dtype"], v["shape"], 8 + n + a, b - a)
    return out


view, merged = tensors(sys.argv[1]), tensors(sys.argv[2])
if set(view) != set(merged):
    sys.exit(f"tensor names differ: only in hf/ {sorted(set(view) - set(merged))[:4]}, "
             f"only in the merger's {sorted(set(merged) - set(view))[:4]}")
fds, nbytes, dtypes = {}, 0, set()
for k in sorted(view):
    (pa, da, sa, oa, la), (pb, db, sb, ob, lb) = view[k], merged[k]
    if (da, sa, la) != (db, sb, lb):
        sys.exit(f"{k}: hf/ {da} {sa} ({la} bytes), the merger's {db} {sb} ({lb} bytes)")
    for p in (pa, pb):
        if p not in fds:
            fds[p] = os.open(p, os.O_RDONLY)
    for off in range(0, la, 64 << 20):
        n = min(64 << 20, la - off)
        if os.pread(fds[pa], n, oa + off) != os.pread(fds[pb], n, ob + off):
            sys.exit(f"{k}: bytes differ (in [{off}, {off + n}) of its data)")
    nbytes += la
    dtypes.add(da)
print(f"ok: {len(view)} tensors, {nbytes} bytes ({', '.join(sorted(dtypes))}): same names, dtypes, "
      f"shapes and bytes")
PY
    { cat "$RUN_DIR/check" >&2; die "hf/ and the merger's output differ"; }
GEN_CHECK="not run (CHECK_GEN=$CHECK_GEN)"
if [[ $CHECK_GEN == 1 ]]; then
    note "(2) check: hf/ (run 1's copy) against the generator's values"
    GEN_CHECK=$("$PYTHON" "$HERE/gen_verl_fsdp.py" --check "$CKPT" "$VIEW_OUT") ||
        die "hf/ differs from the generated values: $GEN_CHECK"
    GEN_CHECK=${GEN_CHECK#*: }
fi
rm -rf "$MERGE_OUT"

# --- (3) read throughput: hf/ (converted on read) vs a plain copy --------------------------------

mapfile -t PLAIN < <(safetensors_in "$VIEW_OUT")
OUT_BYTES=$(bytes_of "${PLAIN[@]}")
cat "${PLAIN[@]}" >/dev/null
R_FIRST=() R_SECOND=() R_PLAIN=() R_SRC=()
for ((r = 0; r < REPEAT; r++)); do
    note "(3) run $((r + 1)) of $REPEAT"
    keep_hot
    mount_role
    mapfile -t VIEW < <(safetensors_in "$MNT/hf")
    ((${#VIEW[@]} > 0)) || die "no *.safetensors in $MNT/hf"
    R_FIRST+=("$(dd_all "${VIEW[@]}")")
    R_SECOND+=("$(dd_all "${VIEW[@]}")")
    unmount
    R_PLAIN+=("$(dd_all "${PLAIN[@]}")")
    R_SRC+=("$(dd_all "${SRC[@]}")")
done
rm -rf "$VIEW_OUT"

# --- report --------------------------------------------------------------------------------------

BUILD_TYPE=$(build_type "$BIN")
GIT=$(tree_state "$REPO")

echo
echo "ckptfs verl FSDP benchmark   $(date '+%Y-%m-%d %H:%M')   $(uname -r), $(nproc) CPUs, $(secs $(($(now_us) - T_START))) s"
echo "binary: $BIN   (CMAKE_BUILD_TYPE: $BUILD_TYPE; source tree at $GIT)"
OTHERS_END=$(others)
warn_others "$OTHERS_START" "$OTHERS_END"
echo "load average: $LOAD_START at start, $(cut -d' ' -f1 /proc/loadavg) at end"
echo "source: $ROLE"
echo "    ${#SRC[@]} fp32 DTensor shard files, $SRC_BYTES bytes (FSDP2, W=8); mount ${MOUNT_OPTS:+-o $MOUNT_OPTS }ROLE_DIR MNT."
echo "    The shard files are read once (cat) before every timed step: in the page cache for both sides."

echo
echo "(1) fresh mount + cp -r MNT/hf vs bench/verl_merger.py (verl's merge: torch.load every shard, cat,"
echo "    .bfloat16(), save_file), both writing to $BENCH_DIR, then sync -f; runs interleaved (cp"
echo "    first in odd runs); median of $REPEAT. Merger: chroot + python + import torch to exit."
printf '    %-44s %8s %7s  %s\n' "" seconds ratio "runs (s)"
MCP=$(median "${T_CP[@]}")
MMERGE=$(median "${T_MERGE[@]}")
RATIO=$(awk -v a="$MMERGE" -v b="$MCP" 'BEGIN {printf "%.2f", a / b}')
printf '    %-44s %8s %7s  %s\n' "(a) ckptfs mount + cp -r MNT/hf + sync" "$(secs "$MCP")" "1.00" "$(list_s "${T_CP[@]}")"
printf '    %-44s %8s %7s  %s\n' "(b) verl_merger.py + sync" "$(secs "$MMERGE")" "$RATIO" "$(list_s "${T_MERGE[@]}")"
echo "    merger_time / ckptfs_time = $RATIO"
D=$(max "${CP_DHWM[@]}") C=$(max "${CP_RSS[@]}") V=$(max "${MERGE_RSS[@]}")
echo "    peak RSS, largest of the runs: (a) daemon VmHWM $(mib "$D") MiB (runs: $(list_mib "${CP_DHWM[@]}")) + cp $(mib "$C") MiB;"
echo "    (b) merger $(mib "$V") MiB (max RSS, /usr/bin/time -v; runs: $(list_mib "${MERGE_RSS[@]}"))"
echo "    files: hf/ $VIEW_FILES; the merger's: $MERGE_FILES"
echo "    merger (run 1): ${MERGE_LINE:-?}"

echo
echo "(2) check (untimed, run 1's outputs):"
echo "    hf/ vs the merger: $(cat "$RUN_DIR/check")"
echo "    hf/ vs the generator: $GEN_CHECK"

echo
echo "(3) read throughput, dd bs=1M of every *.safetensors, $OUT_BYTES bytes of bf16 output (the view reads"
echo "    $SRC_BYTES bytes of fp32 shards); source in the page cache; median of $REPEAT."
printf '    %-52s %8s %6s %7s  %s\n' "" seconds GB/s "vs (a)" "runs (GB/s)"
MP=$(median "${R_PLAIN[@]}") M1=$(median "${R_FIRST[@]}") M2=$(median "${R_SECOND[@]}") MS=$(median "${R_SRC[@]}")
rowr() { # LABEL US BYTES LIST...
    local label=$1 us=$2 b=$3
    shift 3
    printf '    %-52s %8s %6s %7s  %s\n' "$label" "$(secs "$us")" "$(gbps "$b" "$us")" \
        "$(awk -v p="$MP" -v x="$us" -v b="$b" -v ob="$OUT_BYTES" 'BEGIN {printf "%.2f", (b / x) / (ob / p)}')" \
        "$(list_gbps "$b" "$@")"
}
rowr "(a) plain copy of the same bytes, direct" "$MP" "$OUT_BYTES" "${R_PLAIN[@]}"
rowr "(b) MNT/hf first read, fresh mount (fp32 -> bf16)" "$M1" "$OUT_BYTES" "${R_FIRST[@]}"
rowr "(c) MNT/hf second read, same mount" "$M2" "$OUT_BYTES" "${R_SECOND[@]}"
rowr "(d) the fp32 source shards, direct (their bytes)" "$MS" "$SRC_BYTES" "${R_SRC[@]}"
