#!/usr/bin/env bash
# ckptfs benchmark of trainers' checkpoints as sources: a ~1.1 GB (fp32) Llama-shaped model saved
# by 8 ranks, against the offline merge each trainer's users run, in torch.
#   TRAINER=deepspeed: ZeRO stage STAGE (tests/lib/deepspeed_zero.py bench: written as
#     DeepSpeed's save code writes it, with the Adam moments); the merge is zero_to_fp32's
#     reconstruction (torch.load of every rank file, mapped, torch.cat, narrow, safetensors
#     save_file in fp32, as zero_to_fp32.py --safe_serialization writes).
#   TRAINER=accelerate: an HF Trainer / Accelerate FSDP2 checkpoint (tests/lib/trainer_dcp.py
#     bench: torch's own dcp.save from WORLD gloo ranks); the merge is what `accelerate
#     merge-weights` does (the state dict loaded whole through torch DCP, safetensors save_file).
#   TRAINER=nemo: a NeMo 2 checkpoint (tests/lib/nemo2.py bench: weights/ a Megatron-core
#     torch_dist save of the Llama under "module.", one writer; context/io.json); the merge is what
#     NeMo's HF exporter does (the dist checkpoint loaded whole, split into Hugging Face's tensors,
#     safetensors save_file), without building the model.
#  (1) a fresh `ckptfs mount -o dtype=fp32 CKPT MNT` + `cp -r MNT/hf` + sync vs the merge + sync;
#      runs interleaved, medians of REPEAT; ratio merge / ckptfs; peak RSS of each (daemon
#      VmHWM, cp's and the merge's max RSS). Also the default bf16 hf/ (mount + cp -r), once per run.
#  (2) check (untimed, run 1's outputs): the fp32 copy and the merge hold the same tensors.
# The source is in the page cache for every measurement (read once right before each step).
#
# Needs root, /dev/fuse, fusermount3, unshare, chroot, /usr/bin/time (GNU), and the tests' Debian
# sid root (torch 2.14, transformers 5, safetensors).
#
# Environment: TRAINER (deepspeed, accelerate or nemo; default deepspeed), CKPTFS_BIN (default
# <repo>/build/ckptfs), BENCH_DIR (default /tmp/ckptfs-bench; keeps the generated checkpoint),
# REPEAT (default 3), STAGE (default 3; DeepSpeed), WORLD (default 8),
# CKPTFS_SID_ROOT (default /var/cache/ckptfs-tests/sid-root).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
BIN=${CKPTFS_BIN:-${CKPTFS:-$REPO/build/ckptfs}}
BENCH_DIR=${BENCH_DIR:-/tmp/ckptfs-bench}
REPEAT=${REPEAT:-3}
TRAINER=${TRAINER:-deepspeed}
STAGE=${STAGE:-3}
WORLD=${WORLD:-8}
ROOT=${CKPTFS_SID_ROOT:-/var/cache/ckptfs-tests/sid-root}

BENCH_NAME=trainer_bench
BENCH_NOTE_TIME=1
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"

[[ -x $BIN ]] || die "no ckptfs binary at $BIN (build it or set CKPTFS_BIN)"
BIN=$(readlink -f "$BIN")
[[ $(id -u) == 0 ]] || die "needs root (unshare and chroot for the sid root)"
[[ -x /usr/bin/time ]] || die "/usr/bin/time (GNU time, for max RSS) not found"
[[ -x $ROOT/usr/bin/python3 ]] || die "no Debian sid root at $ROOT (tests/run-all.sh builds it)"

mkdir -p "$BENCH_DIR"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd -P)
case $TRAINER in
    deepspeed) SCRIPT=$REPO/tests/lib/deepspeed_zero.py GEN_ARGS=("$STAGE" "$WORLD")
        CKPT=$BENCH_DIR/deepspeed-z$STAGE-w$WORLD/checkpoint-10 WEIGHTS=global_step10 ENDS=.pt
        WHAT="DeepSpeed ZeRO stage $STAGE, $WORLD ranks" MERGE_NAME="zero_to_fp32-like merge" ;;
    accelerate) SCRIPT=$REPO/tests/lib/trainer_dcp.py GEN_ARGS=("$WORLD")
        CKPT=$BENCH_DIR/accelerate-fsdp2-w$WORLD/checkpoint-10 WEIGHTS=pytorch_model_fsdp_0 ENDS=''
        WHAT="Accelerate FSDP2, $WORLD ranks" MERGE_NAME="accelerate merge-weights-like merge" ;;
    nemo) SCRIPT=$REPO/tests/lib/nemo2.py GEN_ARGS=()
        CKPT="$BENCH_DIR/nemo2/llama-nemo/default--val_loss=2.31-step=10-consumed_samples=80.0" WEIGHTS=weights
        ENDS=.distcp GEN_OUT=$BENCH_DIR/nemo2 DONE=$CKPT/context/io.json
        WHAT="NeMo 2 (torch_dist, one writer)" MERGE_NAME="NeMo HF export-like merge" ;;
    *) die "TRAINER is deepspeed, accelerate or nemo, not '$TRAINER'" ;;
esac
GEN_OUT=${GEN_OUT:-$(dirname "$CKPT")} DONE=${DONE:-$CKPT/config.json}

bench_stop() { rmdir "$ROOT$BENCH_DIR" "$ROOT$REPO/tests/lib" 2>/dev/null || true; }
bench_start "$BENCH_DIR/$TRAINER-run.XXXXXX"

PY=("$HERE/torch2.sh" "$ROOT" "$BENCH_DIR:$REPO/tests/lib")

if [[ ! -f $DONE ]]; then
    note "generating $CKPT ($WHAT)"
    rm -rf "$GEN_OUT"
    "${PY[@]}" "$SCRIPT" bench "$GEN_OUT" "${GEN_ARGS[@]}" >&2 || die "the generator failed"
fi
mapfile -t SRC < <(find "$CKPT/$WEIGHTS" -type f -name "*$ENDS" | sort -V)
SRC_BYTES=$(bytes_of "${SRC[@]}")
keep_hot() { cat "${SRC[@]}" >/dev/null; }
note "the source: ${#SRC[@]} files, $SRC_BYTES bytes"

cp_round() { # DEST OPTS: sets T (us), D_HWM, D_ANON, C_RSS (KiB)
    local t0 t1
    rm -rf "$1"
    keep_hot
    unmount
    t0=$(now_us)
    "$BIN" mount ${2:+-o "$2"} "$CKPT" "$MNT" || die "ckptfs mount failed"
    DAEMON_PID=$(find_daemon) || die "cannot find the ckptfs daemon for $MNT"
    /usr/bin/time -v -o "$RUN_DIR/cp.time" cp -r "$MNT/hf" "$1" || die "cp -r $MNT/hf failed"
    sync -f "$RUN_DIR"
    t1=$(now_us)
    # VmHWM counts the source pages the daemon maps (page cache); RssAnon is its own memory.
    T=$((t1 - t0)) D_HWM=$(status_kib "$DAEMON_PID" VmHWM) D_ANON=$(status_kib "$DAEMON_PID" RssAnon)
    C_RSS=$(maxrss_kib "$RUN_DIR/cp.time")
    unmount
}

merge_round() { # DEST: sets T (us), M_RSS (KiB)
    local t0 t1
    rm -rf "$1"
    mkdir -p "$1"
    keep_hot
    t0=$(now_us)
    /usr/bin/time -v -o "$RUN_DIR/merge.time" "${PY[@]}" "$SCRIPT" merge "$CKPT" "$1/model.safetensors" \
        2>"$RUN_DIR/merge.err" || { cat "$RUN_DIR/merge.err" >&2; die "the merge failed"; }
    sync -f "$RUN_DIR"
    t1=$(now_us)
    T=$((t1 - t0)) M_RSS=$(maxrss_kib "$RUN_DIR/merge.time")
}

T_CP=() T_MERGE=() T_BF16=() CP_DHWM=() CP_ANON=() CP_RSS=() MERGE_RSS=() BF16_DHWM=() BF16_ANON=()
for ((r = 0; r < REPEAT; r++)); do
    for side in $( ((r % 2 == 0)) && echo "cp merge bf16" || echo "merge cp bf16"); do
        note "run $((r + 1)) of $REPEAT: $side"
        case $side in
            cp) cp_round "$RUN_DIR/cp-out.$r" dtype=fp32
                T_CP+=("$T") CP_DHWM+=("$D_HWM") CP_ANON+=("$D_ANON") CP_RSS+=("$C_RSS") ;;
            bf16) cp_round "$RUN_DIR/bf16-out" ""
                T_BF16+=("$T") BF16_DHWM+=("$D_HWM") BF16_ANON+=("$D_ANON")
                rm -rf "$RUN_DIR/bf16-out" ;;
            merge) merge_round "$RUN_DIR/merge-out.$r"
                T_MERGE+=("$T") MERGE_RSS+=("$M_RSS") ;;
        esac
        ((r == 0)) || rm -rf "$RUN_DIR/cp-out.$r" "$RUN_DIR/merge-out.$r"
    done
done

note "check: run 1's hf/ copy against the merge"
"${PY[@]}" - "$RUN_DIR/cp-out.0" "$RUN_DIR/merge-out.0" >"$RUN_DIR/check" 2>&1 <<'PY' || { cat "$RUN_DIR/check" >&2; die "check failed"; }
import os, sys, torch
from safetensors.torch import load_file
def load(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(d, f)))
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))[:5]
bad = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
assert not bad, bad[:5]
print(f"same {len(a)} tensors, {sum(t.numel() * t.element_size() for t in a.values())} bytes")
PY

cp_s=$(median "${T_CP[@]}") merge_s=$(median "${T_MERGE[@]}")
echo "$WHAT: ${#SRC[@]} files, $SRC_BYTES bytes; load $(cut -d' ' -f1 /proc/loadavg)"
echo "(1) mount -o dtype=fp32 + cp -r hf/ + sync: $(secs "$cp_s") s (runs $(list_s "${T_CP[@]}")); daemon VmHWM $(mib "$(max "${CP_DHWM[@]}")") MiB (RssAnon $(mib "$(max "${CP_ANON[@]}")") MiB, the rest mapped source pages), cp max RSS $(mib "$(max "${CP_RSS[@]}")") MiB"
echo "    $MERGE_NAME + sync: $(secs "$merge_s") s (runs $(list_s "${T_MERGE[@]}")); max RSS $(mib "$(max "${MERGE_RSS[@]}")") MiB"
echo "    ratio merge / ckptfs: $(awk -v a="$merge_s" -v b="$cp_s" 'BEGIN {printf "%.2f", a / b}')"
echo "    mount (bf16, the default) + cp -r hf/ + sync: $(secs "$(median "${T_BF16[@]}")") s (runs $(list_s "${T_BF16[@]}")); daemon VmHWM $(mib "$(max "${BF16_DHWM[@]}")") MiB (RssAnon $(mib "$(max "${BF16_ANON[@]}")") MiB)"
echo "(2) $(cat "$RUN_DIR/check")"
