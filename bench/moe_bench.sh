#!/usr/bin/env bash
# ckptfs mixture-of-experts (MoE) benchmark, one run, figures side by side. See bench/README.md.
#  (1) Qwen3-235B-A22B-shaped sparse checkpoint (real config and shard layout, data as holes):
#      `ckptfs mount` and `ls -lR MNT/tp4pp8ep8` times (medians of MOUNT_RUNS fresh mounts),
#      then on one more mount `ls -laR MNT/mcore` and the daemon's VmRSS/VmHWM after every file
#      of tp4pp8ep8/ and mcore/ was stat'ed.
#  (2) ~1 GiB random Mixtral-shaped checkpoint (8 experts): fresh mount + `cp -r MNT/tp2pp1ep2`
#      + sync vs the offline Python/torch converter bench/moe_offline_convert.py (+ sync), runs
#      interleaved, medians of REPEAT; peak RSS of each. The first converter output is checked
#      (untimed) against the view: one rank file of each holds the same tensors.
#  (3) mcore/ read amplification per (TP, EP) rank, computed from .metadata with torch's DCP
#      planner helpers (torch 2.6 of the tests' Debian 13 root; "not available" without it or
#      when mcore/ of the model is not a consistent MoE torch_dist checkpoint), for both models.
# Targets are printed next to the measured values; nothing fails on a missed target.
#
# Environment:
#   CKPTFS_BIN   the binary (default: <repo>/build/ckptfs)
#   BENCH_DIR    work dir, keeps the generated checkpoints between runs (default /tmp/ckptfs-bench)
#   PYTHON       python with torch (1.13 is enough) and numpy (default /usr/bin/python3)
#   MOUNT_RUNS   fresh mounts timed in (1) (default 5; median shown)
#   MCORE_RUNS   mounts in (1) that also list mcore/ (default 1: ~1 min each for this model)
#   REPEAT       runs of each side of (2) (default 3; median shown)
#   PP_OPTS      mount options that make tp4pp8ep8 valid for 94 layers (default pp_first=11,pp_last=11)
#   AMP_BIG      1: (3) also for the 235B-shaped checkpoint, on (1)'s mcore/ mount (default 1)
#   CKPTFS_TORCH2_ROOT  Debian 13 root with torch 2.6 for (3) (default /var/cache/ckptfs-tests/trixie-root)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
BIN=${CKPTFS_BIN:-$REPO/build/ckptfs}
BENCH_DIR=${BENCH_DIR:-/tmp/ckptfs-bench}
PYTHON=${PYTHON:-/usr/bin/python3}
MOUNT_RUNS=${MOUNT_RUNS:-5}
MCORE_RUNS=${MCORE_RUNS:-1}
REPEAT=${REPEAT:-3}
PP_OPTS=${PP_OPTS:-pp_first=11,pp_last=11}
AMP_BIG=${AMP_BIG:-1}
ROOT=${CKPTFS_TORCH2_ROOT:-/var/cache/ckptfs-tests/trixie-root}
LS_TIMEOUT=${LS_TIMEOUT:-600}
CP_TIMEOUT=${CP_TIMEOUT:-600}

BIG_LAYOUT=tp4pp8ep8
SMALL_LAYOUT=tp2pp1ep2
SMALL_ARGS=(--tp 2 --pp 1 --ep 2)
CHECK_RANK=mp_rank_01_001 # (2)'s check: TP rank 1, EP rank 1 (nothing in it is a prefix)
AMP_PAIRS="1,2 2,2 1,4 2,4"

# Targets.
TARGET_MOUNT_MS=500
TARGET_LS_MS=2000
TARGET_RSS_KIB=$((128 * 1024))
TARGET_CP_RATIO=3
TARGET_AMP=1.25

BENCH_NAME=moe_bench
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"

[[ -x $BIN ]] || die "no ckptfs binary at $BIN (build it or set CKPTFS_BIN)"
BIN=$(readlink -f "$BIN")
command -v fusermount3 >/dev/null || die "fusermount3 not found"
[[ -e /dev/fuse ]] || die "/dev/fuse missing"
[[ -x /usr/bin/time ]] || die "/usr/bin/time (GNU time, for CPU time and max RSS) not found"
"$PYTHON" -c 'import torch, numpy' 2>/dev/null || die "$PYTHON lacks torch or numpy"
((MOUNT_RUNS >= 1 && MCORE_RUNS >= 1 && REPEAT >= 1)) || die "MOUNT_RUNS, MCORE_RUNS and REPEAT must be >= 1"

mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd -P)
SMALL=$BENCH_DIR/mixtral-1g
BIG=$BENCH_DIR/qwen3-235b-sparse

# --- cleanup -------------------------------------------------------------------------------------

bench_stop() { rmdir "$ROOT$BENCH_DIR" 2>/dev/null || true; } # made by the torch2 bind mount
bench_start "$BENCH_DIR/moe-run.XXXXXX"

# --- helpers -------------------------------------------------------------------------------------



# do_mount SRC [OPTS]: a fresh mount of SRC on $MNT; sets DAEMON_PID.
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

# CPU time (user + system) of PID so far, in microseconds.
cpu_us() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.0f", ($14 + $15) * 1e6 / hz}' "/proc/$1/stat"; }
max() { printf '%s\n' "$@" | sort -g | tail -n 1; }
ms() { awk -v us="$1" 'BEGIN {printf "%.0f", us / 1000}'; }
secs() { awk -v us="$1" 'BEGIN {printf "%.3f", us / 1e6}'; }
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
met() { if [[ $1 == 1 ]]; then echo "met"; else echo "NOT met"; fi; }
lt() { awk -v x="$1" -v t="$2" 'BEGIN {print (x < t) ? 1 : 0}'; }
list_ms() { local out="" x; for x in "$@"; do out+="${out:+ }$(ms "$x")"; done; echo "$out"; }
list_s() { local out="" x; for x in "$@"; do out+="${out:+ }$(awk -v us="$x" 'BEGIN {printf "%.2f", us / 1e6}')"; done; echo "$out"; }
list_mib() { local out="" x; for x in "$@"; do out+="${out:+ }$(mib "$x")"; done; echo "$out"; }
count_of() { find "$1" -type f -name "$2" | wc -l; } # DIR NAME-PATTERN
maxrss_kib() { awk -F': ' '/Maximum resident set size/ {print $2}' "$1"; } # /usr/bin/time -v output

OTHERS_START=$(others)
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)
T_START=$(now_us)

# torch2 ARGS...: the root's python3 (torch 2.6), $BENCH_DIR (the checkpoints, this run's
# directory and mount point) at the same path.
torch2() { "$HERE/torch2.sh" "$ROOT" "$BENCH_DIR" "$@"; }

AMP_NOTE=""
if [[ ! -x $ROOT/usr/bin/python3 ]]; then
    AMP_NOTE="not available: no Debian 13 root with torch 2.6 at $ROOT (tests/run-all.sh builds it)"
elif ! command -v unshare >/dev/null || ! command -v chroot >/dev/null || [[ $(id -u) != 0 ]]; then
    AMP_NOTE="not available: needs root, unshare and chroot for the torch 2.6 root"
fi

# (3)'s computation: AMP_PY MCORE_RELEASE_DIR "T,E T,E ..." prints per (TP, EP) one line
#   AMP tp=T ep=E max=RATIO rank=t,e min=RATIO read=BYTES share=BYTES ranks=N worst_key=KEY:RATIO
# (the rank with the largest ratio), or one line `UNAVAILABLE why` when mcore/ is not a
# consistent checkpoint (chunks of another rank than their tensor, not tiling it, a key with no
# rule, a share the chunks do not cover).
AMP_PY=$RUN_DIR/moe_amp.py
cat >"$AMP_PY" <<'PY'
import os
import sys
import warnings
from argparse import Namespace

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

warnings.filterwarnings("ignore")
d, pairs = sys.argv[1], [tuple(map(int, p.split(","))) for p in sys.argv[2].split()]


class Unavailable(Exception):
    pass


try:
    md = FileSystemReader(d).read_metadata()
    with torch.serialization.safe_globals([Namespace]):
        args = torch.load(os.path.join(d, "common.pt"), map_location="cpu", weights_only=True)["args"]
except Exception as e:  # noqa: BLE001  (a broken view is a finding, not a crash)
    print(f"UNAVAILABLE cannot read .metadata / common.pt: {type(e).__name__}: {e}")
    sys.exit(0)
vocab, N = args.vocab_size, getattr(args, "num_experts", None) or 0
keys = {k: m for k, m in md.state_dict_metadata.items()
        if isinstance(m, TensorStorageMetadata) and not k.startswith(("optimizer.", "rng_state"))}


def vol(s):
    n = 1
    for x in s:
        n *= x
    return n


def consistent():
    """Every chunk has the tensor's rank, lies inside it, and the chunks' volumes add up."""
    for k, m in keys.items():
        size = list(m.size)
        tot = 0
        for c in m.chunks:
            if len(c.offsets) != len(size) or len(c.sizes) != len(size):
                return (f"{k} {size}: chunk at {list(c.offsets)} has {len(c.sizes)} dims, "
                        f"the tensor {len(size)}")
            if any(o + s > z for o, s, z in zip(c.offsets, c.sizes, size)):
                return f"{k} {size}: chunk {list(c.offsets)}+{list(c.sizes)} lies outside"
            tot += vol(c.sizes)
        if tot != vol(size):
            return f"{k} {size}: chunks hold {tot} of {vol(size)} elements"
    return None


def boxes(k, size, T, t, E, e):
    """Rank (TP t of T, EP e of E; expert TP = TP)'s boxes [(offsets, sizes)] of stored key k."""
    n = len(size)

    def cut(*dims):  # (dim, lo, count) ...
        off, sz = [0] * n, list(size)
        for dim, lo, cnt in dims:
            off[dim], sz[dim] = lo, cnt
        return off, sz

    if "layernorm" in k or k.endswith(("layer_norm_weight", "router.weight", "router.expert_bias",
                                         "shared_experts.gate_weight")):
        return [cut()]
    if ".mlp.experts.experts." in k:  # [L, N, ...]: EP rank e's experts, split by expert TP
        if size[1] != N:
            raise Unavailable(f"{k} {size}: dim 1 is not the {N} experts")
        ex = (1, e * N // E, N // E)
        if k.endswith("linear_fc1.weight"):  # [L, N, 2F, H]
            F = size[2] // 2
            return [cut(ex, (2, t * F // T, F // T)), cut(ex, (2, F + t * F // T, F // T))]
        if k.endswith("linear_fc2.weight"):  # [L, N, H, F]
            return [cut(ex, (3, t * size[3] // T, size[3] // T))]
        raise Unavailable(f"no rule for {k}")
    if k in ("embedding.word_embeddings.weight", "output_layer.weight"):
        part = -(-vocab // (128 * T)) * 128  # rows per rank: vocab padded to 128 T, / T
        return [cut((0, t * part, part))]
    if k.endswith(("linear_qkv.weight", "linear_qkv.bias")):
        return [cut((1, t * size[1] // T, size[1] // T))]
    if k.endswith(("linear_fc1.weight", "linear_fc1.bias")):  # dense or shared expert
        F = size[1] // 2
        return [cut((1, t * F // T, F // T)), cut((1, F + t * F // T, F // T))]
    if k.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return [cut((n - 1, t * size[-1] // T, size[-1] // T))]
    raise Unavailable(f"no rule for {k}")


def rank(T, t, E, e):
    """(bytes of the items the rank's ReadItems name, one per ReadItem as FileSystemReader reads
    them; share bytes; the key with the largest ratio)."""
    read = share = 0
    worst = (0.0, "")
    for k, m in keys.items():
        es = m.properties.dtype.itemsize
        bx = boxes(k, list(m.size), T, t, E, e)
        want = [ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s)) for o, s in bx]
        items = create_read_items_for_chunk_list(k, m, want)
        k_share = sum(vol(s) for _, s in bx) * es
        if sum(vol(ri.lengths) for ri in items) * es != k_share:
            raise Unavailable(f"the stored chunks of {k} do not cover rank ({t}, {e})'s share")
        k_read = sum(md.storage_data[ri.storage_index].length for ri in items)
        read += k_read
        share += k_share
        if k_read / k_share > worst[0]:
            worst = (k_read / k_share, k)
    return read, share, worst


why = consistent()
if why:
    print(f"UNAVAILABLE mcore/.metadata is not a consistent torch_dist checkpoint: {why}")
    sys.exit(0)
print(f"INFO {len(keys)} tensor keys, {sum(len(m.chunks) for m in keys.values())} chunks, "
      f"{len(md.storage_data)} stored items")
try:
    for T, E in pairs:
        if N % E or args.num_attention_heads % T or args.num_query_groups % T:
            print(f"AMP tp={T} ep={E} skip")
            continue
        res = [(rank(T, t, E, e), t, e) for e in range(E) for t in range(T)]
        (read, share, worst), t, e = max(res, key=lambda x: x[0][0] / x[0][1])
        lo = min(r[0] / r[1] for r, _, _ in res)
        print(f"AMP tp={T} ep={E} max={read / share:.4f} rank={t},{e} min={lo:.4f} read={read} "
              f"share={share} ranks={len(res)} worst_key={worst[1]}:{worst[0]:.3f}")
except Unavailable as u:
    print(f"UNAVAILABLE {u}")
PY

# amp MCORE_RELEASE_DIR OUT: (3) for the checkpoint mounted at $MNT.
amp() {
    torch2 "$AMP_PY" "$1" "$AMP_PAIRS" >"$2" 2>"$2.err" ||
        { cat "$2.err" >&2; echo "UNAVAILABLE the amplification script failed (its errors are above)" >"$2"; }
}

# --- inputs --------------------------------------------------------------------------------------

if [[ ! -f $BIG/model.safetensors.index.json ]]; then
    note "generating $BIG (sparse Qwen3-235B-A22B shapes, 118 shards)"
    "$PYTHON" "$HERE/gen_checkpoint.py" --sparse-qwen3-235b "$BIG" >&2
fi
if [[ ! -f $SMALL/model.safetensors.index.json ]]; then
    note "generating $SMALL (~1 GiB random Mixtral-shaped MoE)"
    "$PYTHON" "$HERE/gen_checkpoint.py" --mixtral-1g "$SMALL" >&2
fi

# --- (1) mount, ls -lR MNT/tp4pp8ep8, mcore/, daemon memory: sparse Qwen3-235B-A22B ---------------

# One round: `ckptfs mount` (wall; its CPU, where the source is read), `ls -lR` of the layout
# (wall; the daemon's CPU), memory of the daemon; with `mcore`, then `ls -laR MNT/mcore` (every
# file, .metadata included) and memory again. Leaves the mount in place.
big_round() {
    local t0 t1 t2 t3 c1 c2
    unmount
    t0=$(now_us)
    /usr/bin/time -f '%U %S' -o "$RUN_DIR/mount.time" "$BIN" mount -o "$PP_OPTS" "$BIG" "$MNT" ||
        die "ckptfs mount -o $PP_OPTS $BIG failed"
    t1=$(now_us)
    DAEMON_PID=$(find_daemon) || die "cannot find the ckptfs daemon for $MNT"
    c1=$(cpu_us "$DAEMON_PID")
    timeout "$LS_TIMEOUT" ls -lR "$MNT/$BIG_LAYOUT" >/dev/null || die "ls -lR $MNT/$BIG_LAYOUT failed or hung"
    t2=$(now_us)
    c2=$(cpu_us "$DAEMON_PID")
    T_MOUNT=$((t1 - t0)) T_LS=$((t2 - t1)) C_LS=$((c2 - c1))
    C_MOUNT=$(awk '{printf "%.0f", ($1 + $2) * 1e6}' "$RUN_DIR/mount.time")
    RSS=$(status_kib "$DAEMON_PID" VmRSS) HWM=$(status_kib "$DAEMON_PID" VmHWM)
    if [[ ${1:-} == mcore ]]; then
        timeout "$LS_TIMEOUT" ls -laR "$MNT/mcore" >/dev/null || die "ls -laR $MNT/mcore failed or hung"
        t3=$(now_us)
        T_MCORE=$((t3 - t2)) C_MCORE=$(($(cpu_us "$DAEMON_PID") - c2))
        RSS2=$(status_kib "$DAEMON_PID" VmRSS) HWM2=$(status_kib "$DAEMON_PID" VmHWM)
    fi
}

note "(1) $BIG: one untimed mount + ls -lR $BIG_LAYOUT, then $MOUNT_RUNS timed"
big_round
BIG_FILES=$(count_of "$MNT/$BIG_LAYOUT" model_optim_rng.pt) BIG_VIEW_BYTES=$(bytes_of "$MNT/$BIG_LAYOUT")
mapfile -t BIG_SRC < <(find "$BIG" -maxdepth 1 -name '*.safetensors' | sort)
BIG_SRC_BYTES=$(bytes_of "${BIG_SRC[@]}")
M_MOUNT=() M_CMOUNT=() M_LS=() M_CLS=() M_RSS=() M_HWM=()
for ((r = 0; r < MOUNT_RUNS; r++)); do
    big_round
    M_MOUNT+=("$T_MOUNT") M_CMOUNT+=("$C_MOUNT") M_LS+=("$T_LS") M_CLS+=("$C_LS") M_RSS+=("$RSS") M_HWM+=("$HWM")
done
M_MCORE=() M_CMCORE=() M_RSS2=() M_HWM2=()
for ((r = 0; r < MCORE_RUNS; r++)); do
    note "(1) mount + ls -lR $BIG_LAYOUT + ls -laR mcore, run $((r + 1)) of $MCORE_RUNS"
    big_round mcore
    M_MCORE+=("$T_MCORE") M_CMCORE+=("$C_MCORE") M_RSS2+=("$RSS2") M_HWM2+=("$HWM2")
done
BIG_DISTCP=$(count_of "$MNT/mcore" '*.distcp') BIG_MCORE_BYTES=$(bytes_of "$MNT/mcore")
BIG_METADATA=$(stat -c %s "$MNT/mcore/release/.metadata")
if [[ -z $AMP_NOTE && $AMP_BIG == 1 ]]; then
    note "(3) read amplification from $(basename "$BIG")'s mcore/release/.metadata (same mount)"
    amp "$MNT/mcore/release" "$RUN_DIR/amp.$(basename "$BIG")"
fi
unmount

# --- (2) cp -r MNT/tp2pp1ep2 vs the offline converter: ~1 GiB Mixtral-shaped --------------------

mapfile -t SMALL_SRC < <(find "$SMALL" -maxdepth 1 -name '*.safetensors' | sort)
SMALL_SRC_BYTES=$(bytes_of "${SMALL_SRC[@]}")
keep_hot() { cat "${SMALL_SRC[@]}" >/dev/null; }

cp_round() { # sets T (us), D_HWM, C_RSS (KiB)
    local t0 t1
    rm -rf "$RUN_DIR/cp-out"
    keep_hot
    unmount
    t0=$(now_us)
    "$BIN" mount "$SMALL" "$MNT" || die "ckptfs mount $SMALL failed"
    timeout "$CP_TIMEOUT" /usr/bin/time -v -o "$RUN_DIR/cp.time" cp -r "$MNT/$SMALL_LAYOUT" "$RUN_DIR/cp-out" ||
        die "cp -r $MNT/$SMALL_LAYOUT failed or took over ${CP_TIMEOUT}s"
    sync -f "$RUN_DIR"
    t1=$(now_us)
    DAEMON_PID=$(find_daemon) || die "cannot find the ckptfs daemon for $MNT"
    T=$((t1 - t0)) D_HWM=$(status_kib "$DAEMON_PID" VmHWM) C_RSS=$(maxrss_kib "$RUN_DIR/cp.time")
    [[ -n ${VIEW_BYTES:-} ]] || VIEW_BYTES=$(bytes_of "$RUN_DIR/cp-out")
    unmount
    rm -rf "$RUN_DIR/cp-out"
}

conv_round() { # OUT: sets T (us), C_RSS (KiB); leaves OUT in place
    local t0 t1
    rm -rf "$1"
    keep_hot
    t0=$(now_us)
    /usr/bin/time -v -o "$RUN_DIR/conv.time" "$PYTHON" "$HERE/moe_offline_convert.py" "$SMALL" \
        "$1" "${SMALL_ARGS[@]}" || die "moe_offline_convert.py failed"
    sync -f "$RUN_DIR"
    t1=$(now_us)
    T=$((t1 - t0)) C_RSS=$(maxrss_kib "$RUN_DIR/conv.time")
}

# Untimed: the first converter output against the view. Same file set; one rank file of each
# loaded with torch: the same tensor keys in the same order, every tensor bit-identical.
check_conv() {
    local out=$1
    do_mount "$SMALL"
    [[ "$(cd "$MNT/$SMALL_LAYOUT" && find . -type f | sort)" == "$(cd "$out" && find . -type f | sort)" ]] ||
        die "the converter's file set differs from $SMALL_LAYOUT/'s"
    VIEW_FILES=$(count_of "$MNT/$SMALL_LAYOUT" model_optim_rng.pt)
    "$PYTHON" - "$MNT/$SMALL_LAYOUT/release/$CHECK_RANK/model_optim_rng.pt" \
        "$out/release/$CHECK_RANK/model_optim_rng.pt" >"$RUN_DIR/check" <<'PY' ||
import sys
import torch
view, conv = (torch.load(p, map_location="cpu")["model"] for p in sys.argv[1:3])
tv = [k for k, v in view.items() if v is not None]
tc = [k for k, v in conv.items() if v is not None]
if tv != tc:
    sys.exit(f"tensor keys differ: only in the view {sorted(set(tv) - set(tc))[:4]}, "
             f"only in the converter's {sorted(set(tc) - set(tv))[:4]} (or their order)")
nbytes = 0
for k in tv:
    a, b = view[k], conv[k]
    if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(
            a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)):
        sys.exit(f"{k} differs: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
    nbytes += a.numel() * a.element_size()
nv = {k for k, v in view.items() if v is None}
nc = {k for k, v in conv.items() if v is None}
extra = ""
for side, keys in (("only the view", nv - nc), ("only the converter", nc - nv)):
    if keys:
        kinds = sorted({k.split(".", 3)[-1] for k in keys})
        extra += f"; {len(keys)} None entries in {side} ({', '.join(kinds)})"
print(f"ok: {len(tv)} tensors ({nbytes} bytes) in the same order, bit-identical{extra}")
PY
        { cat "$RUN_DIR/check" >&2; die "the converter's $CHECK_RANK differs from the view's"; }
    unmount
}

T_CP=() T_CONV=() CP_DHWM=() CP_RSS=() CONV_RSS=()
for ((r = 0; r < REPEAT; r++)); do
    # Alternate which side goes first, so neither always follows the other.
    for side in $( ((r % 2 == 0)) && echo "cp conv" || echo "conv cp"); do
        note "(2) run $((r + 1)) of $REPEAT: $side"
        if [[ $side == cp ]]; then
            cp_round
            T_CP+=("$T") CP_DHWM+=("$D_HWM") CP_RSS+=("$C_RSS")
        else
            conv_round "$RUN_DIR/conv-out"
            T_CONV+=("$T") CONV_RSS+=("$C_RSS")
            if ((r == 0)); then
                note "(2) check (untimed): $SMALL_LAYOUT/$CHECK_RANK of the view vs this converter output"
                CONV_BYTES=$(bytes_of "$RUN_DIR/conv-out") CONV_FILES=$(count_of "$RUN_DIR/conv-out" model_optim_rng.pt)
                check_conv "$RUN_DIR/conv-out"
            fi
            rm -rf "$RUN_DIR/conv-out"
        fi
    done
done

# --- (3) mcore/ read amplification of the small model --------------------------------------------

if [[ -z $AMP_NOTE ]]; then
    note "(3) read amplification from $(basename "$SMALL")'s mcore/release/.metadata"
    do_mount "$SMALL"
    amp "$MNT/mcore/release" "$RUN_DIR/amp.$(basename "$SMALL")"
    unmount
fi
AMP_SRCS=("$SMALL")
[[ $AMP_BIG == 1 ]] && AMP_SRCS+=("$BIG")

# --- report --------------------------------------------------------------------------------------

BUILD_TYPE=$(build_type "$BIN")
GIT=$(tree_state "$REPO")

echo
echo "ckptfs MoE benchmark   $(date '+%Y-%m-%d %H:%M')   $(uname -r), $(nproc) CPUs, $(secs $(($(now_us) - T_START))) s"
echo "binary: $BIN   (CMAKE_BUILD_TYPE: $BUILD_TYPE; source tree at $GIT)"
OTHERS_END=$(others)
warn_others "$OTHERS_START" "$OTHERS_END"
echo "load average: $LOAD_START at start, $(cut -d' ' -f1 /proc/loadavg) at end"

echo
echo "(1) $(basename "$BIG"): Qwen3-235B-A22B shapes, ${#BIG_SRC[@]} sparse shards, $BIG_SRC_BYTES bytes logical."
echo "    mount -o $PP_OPTS (94 layers on 8 stages: 11 + 6 x 12 + 11). $BIG_LAYOUT/: $BIG_FILES rank files,"
echo "    $BIG_VIEW_BYTES bytes; mcore/release: $BIG_DISTCP .distcp files, $BIG_MCORE_BYTES bytes in all, .metadata $BIG_METADATA bytes."
echo "    Wall: median of $MOUNT_RUNS fresh mounts after one untimed one (the mcore/ line: of $MCORE_RUNS more). CPU: of"
echo "    'ckptfs mount' (user+sys; it reads the source before the daemon starts) / of the daemon during ls."
echo "    Memory of the daemon: largest of the runs."
printf '    %-40s %11s %9s  %-17s %s\n' "" "wall" "CPU" "target" "runs (wall)"
row() { # LABEL WALL_US CPU_US TARGET_MS RUNS...
    local label=$1 w=$2 c=$3 t=$4 tg=""
    shift 4
    [[ -n $t ]] && tg="< $t ms $(met "$(lt "$(ms "$w")" "$t")")"
    printf '    %-40s %8s ms %6s ms  %-17s %s\n' "$label" "$(ms "$w")" "$(ms "$c")" "$tg" "$(list_ms "$@")"
}
row "ckptfs mount" "$(median "${M_MOUNT[@]}")" "$(median "${M_CMOUNT[@]}")" "$TARGET_MOUNT_MS" "${M_MOUNT[@]}"
row "ls -lR MNT/$BIG_LAYOUT" "$(median "${M_LS[@]}")" "$(median "${M_CLS[@]}")" "$TARGET_LS_MS" "${M_LS[@]}"
row "then ls -laR MNT/mcore" "$(median "${M_MCORE[@]}")" "$(median "${M_CMCORE[@]}")" "" "${M_MCORE[@]}"
mem() { # LABEL RSS_LIST_NAME HWM_LIST_NAME TARGET?
    local -n _r=$2 _h=$3
    local r h tg=""
    r=$(max "${_r[@]}") h=$(max "${_h[@]}")
    [[ -n ${4:-} ]] && tg="< 128 MiB $(met $((r < TARGET_RSS_KIB && h < TARGET_RSS_KIB)))"
    printf '    %-40s %7s MiB %5s MiB  %-17s %s\n' "$1" "$(mib "$r")" "$(mib "$h")" "$tg" "$(list_mib "${_r[@]}")"
}
printf '    %-40s %11s %9s  %-17s %s\n' "daemon memory" "VmRSS" "VmHWM" "target" "runs (VmRSS)"
mem "  after ls -lR $BIG_LAYOUT" M_RSS M_HWM
mem "  after that + ls -laR mcore" M_RSS2 M_HWM2 target

echo
echo "(2) $(basename "$SMALL"): Mixtral shapes (8 experts, top-2), ${#SMALL_SRC[@]} shards, $SMALL_SRC_BYTES bytes; source in"
echo "    the page cache. $SMALL_LAYOUT/: $VIEW_FILES rank files, $VIEW_BYTES bytes; the converter's: $CONV_FILES, $CONV_BYTES bytes."
echo "    Both write to $BENCH_DIR, then sync -f; runs interleaved (cp first in odd runs); median of $REPEAT."
printf '    %-56s %8s %7s  %-12s %s\n' "" seconds ratio target "runs (s)"
MCP=$(median "${T_CP[@]}")
MCONV=$(median "${T_CONV[@]}")
RATIO=$(awk -v a="$MCONV" -v b="$MCP" 'BEGIN {printf "%.2f", a / b}')
printf '    %-56s %8s %7s  %-12s %s\n' "(a) ckptfs mount + cp -r MNT/$SMALL_LAYOUT + sync" "$(secs "$MCP")" "1.00" "" "$(list_s "${T_CP[@]}")"
printf '    %-56s %8s %7s  %-12s %s\n' "(b) moe_offline_convert.py ${SMALL_ARGS[*]} + sync" "$(secs "$MCONV")" "$RATIO" \
    ">= $TARGET_CP_RATIO $(met "$(awk -v x="$RATIO" -v t=$TARGET_CP_RATIO 'BEGIN {print (x >= t) ? 1 : 0}')")" "$(list_s "${T_CONV[@]}")"
D=$(max "${CP_DHWM[@]}") C=$(max "${CP_RSS[@]}") V=$(max "${CONV_RSS[@]}")
echo "    peak RSS, largest of the runs: (a) daemon VmHWM $(mib "$D") MiB + cp $(mib "$C") MiB = $(mib $((D + C))) MiB;"
echo "    (b) converter $(mib "$V") MiB (max RSS, /usr/bin/time -v)"
echo "    check (untimed, run 1's converter output): $SMALL_LAYOUT/release/$CHECK_RANK, view vs converter:"
echo "      $(cat "$RUN_DIR/check")"

echo
echo "(3) mcore/ read amplification per (TP, EP) rank: bytes of the .distcp items a loader of the rank"
echo "    reads (one per ReadItem of torch's create_read_items_for_chunk_list, whole, as FileSystemReader"
echo "    reads them) / the rank's share; computed from .metadata; expert TP = TP; max over the TP x EP"
echo "    ranks (rank t,e) and min. Target <= $TARGET_AMP."
if [[ -n $AMP_NOTE ]]; then
    echo "    $AMP_NOTE"
else
    for src in "${AMP_SRCS[@]}"; do
        f=$RUN_DIR/amp.$(basename "$src")
        if grep -q '^UNAVAILABLE' "$f"; then
            echo "    $(basename "$src"): not available: $(sed -n 's/^UNAVAILABLE //p' "$f" | head -n 1)"
            continue
        fi
        echo "    $(basename "$src"): .metadata: $(sed -n 's/^INFO //p' "$f")"
        printf '      %-3s %-3s %9s %-8s %8s %10s  %-14s %s\n' TP EP max "rank t,e" min "share MiB" target "worst key (its ratio)"
        while read -r _ tp ep mx rk mn _ sh _ wk; do
            [[ $mx == skip ]] && { printf '      %-3s %-3s not a valid layout for this model\n' "${tp#tp=}" "${ep#ep=}"; continue; }
            mx=${mx#max=}
            printf '      %-3s %-3s %9s %-8s %8s %10s  %-14s %s\n' "${tp#tp=}" "${ep#ep=}" "$mx" "${rk#rank=}" "${mn#min=}" \
                "$(awk -v b="${sh#share=}" 'BEGIN {printf "%.1f", b / 1048576}')" \
                "<= $TARGET_AMP $(met "$(awk -v x="$mx" -v t=$TARGET_AMP 'BEGIN {print (x <= t) ? 1 : 0}')")" "${wk#worst_key=}"
        done < <(grep '^AMP' "$f")
    done
fi
