#!/usr/bin/env bash
# A big Megatron rank file as a source: mounting it reads its zip directory, local headers and
# pickle, never its tensor data. A sparse Llama-shaped checkpoint (bench/gen_checkpoint.py's 1 GiB
# model cut to 4 layers, data as holes) is mounted, its tp1pp1/ copied out with
# `cp --sparse=always` (a 0.6 GB rank file), and the copy, dropped from the page cache, mounted as
# a source in the foreground: until hf/ answers the daemon reads (rchar) under 1% of the rank
# file; the copy's hf/ serves the source's tensors.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
src=$WORK/sparse
$PY - "$TESTS_TOP/bench" "$src" <<'PY' || { ok 1 "write the sparse checkpoint"; done_testing; exit; }
import sys
sys.path.insert(0, sys.argv[1])
import gen_checkpoint as g
g.generate(sys.argv[2], dict(g.SMALL, num_hidden_layers=4), 5e9, True)
PY
mnt=$WORK/mnt
mount_ckptfs "$src" "$mnt" || { ok 1 "mount the sparse checkpoint"; done_testing; exit; }
copy=$WORK/copy
cp -r --sparse=always "$mnt/tp1pp1" "$copy"
ok $? "cp --sparse=always its tp1pp1/"
rank=$copy/release/mp_rank_00/model_optim_rng.pt
size=$(stat -c %s "$rank")
dd if="$rank" iflag=nocache count=0 status=none # out of the page cache: reads cost what they say
back=$WORK/back
if fg_mount "$CKPTFS" "$copy" "$back" "$WORK/back.log"; then
  ls "$back/hf" > /dev/null
  read=$(daemon_io rchar "$FG_PID")
  diag "mount of a $size-byte rank file read $read bytes"
  ((read * 100 < size))
  ok $? "mounting the copy read under 1% of its rank file ($read of $size bytes)"
  $PY - "$mnt/hf" "$back/hf" > "$WORK/same.out" 2>&1 <<'PY'
import json, os, struct, sys
def tensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with open(os.path.join(d, f), "rb") as h:
                n = struct.unpack("<Q", h.read(8))[0]
                head = json.loads(h.read(n))
                for k, v in head.items():
                    if k != "__metadata__":
                        h.seek(8 + n + v["data_offsets"][0])
                        out[k] = (v["dtype"], v["shape"], h.read(min(1 << 16, v["data_offsets"][1] - v["data_offsets"][0])))
    return out
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
sys.exit(0 if a == b and len(a) > 0 else 1)
PY
  ran $? "the copy's hf/ has the source's tensors (names, types, shapes, first 64 KiB)" "$WORK/same.out"
  fg_unmount "$back"
else
  ok 1 "mount the copy as a source"
  sed 's/^/# /' "$WORK/back.log" >&2
fi
unmount_ckptfs "$mnt"
done_testing
