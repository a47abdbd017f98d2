#!/usr/bin/python3
"""Two directories of safetensors files, tensor by tensor: the benches' check of a view's copy
against an offline converter's output (bench/deepseek_bench.sh, bench/mxfp4_copy_bench.sh).

  same_tensors.py VIEW_DIR OTHER_DIR OTHER_NAME

Per tensor name (whatever file of its directory holds it): dtype, shape and data bytes. Prints
"N of M tensors byte-identical (BYTES bytes)", then up to 6 lines "DIFF ..." (a shape, dtype or
bytes that differ, names only on one side; a bf16 tensor of the view that is OTHER's F32 one
rounded to bf16 is said so). OTHER_NAME names the other side in them ("fp8_cast_bf16's").
Exit status 0 whatever it finds (differences are reported, not fatal); numpy only.
"""
import json
import os
import struct
import sys

import numpy as np


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
                    a, b = v["data_offsets"]
                    out[k] = (p, v["dtype"], v["shape"], 8 + n + a, b - a)
    return out


def bf16_of_f32(raw):  # round to nearest even, as torch
    u = np.frombuffer(raw, dtype=np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def main(view_dir, other_dir, other):
    view, conv = tensors(view_dir), tensors(other_dir)
    fds = {}

    def data(t):
        p, _, _, off, n = t
        if p not in fds:
            fds[p] = os.open(p, os.O_RDONLY)
        return os.pread(fds[p], n, off)

    same, nbytes, diffs = 0, 0, []
    for k in sorted(set(view) & set(conv)):
        (_, dv, sv, _, lv), (_, dc, sc, _, lc) = view[k], conv[k]
        if sv != sc:
            diffs.append(f"{k}: shape {sv} in the view, {sc} in {other}")
        elif dv != dc:
            why = ""
            if (dv, dc) == ("BF16", "F32") and data(view[k]) == bf16_of_f32(data(conv[k])):
                why = " (the view's values are the F32 ones rounded to bf16)"
            diffs.append(f"{k}: {dv} in the view, {dc} in {other}{why}")
        elif data(view[k]) != data(conv[k]):
            diffs.append(f"{k}: {dv} {sv}: bytes differ")
        else:
            same += 1
            nbytes += lv
    only_v, only_c = sorted(set(view) - set(conv)), sorted(set(conv) - set(view))
    if only_v:
        diffs.append(f"only in the view: {len(only_v)} ({', '.join(only_v[:3])})")
    if only_c:
        diffs.append(f"only in {other}: {len(only_c)} ({', '.join(only_c[:3])})")
    print(f"{same} of {len(set(view) | set(conv))} tensors byte-identical ({nbytes} bytes)")
    for d in diffs[:6]:
        print(f"DIFF {d}")
    if len(diffs) > 6:
        print(f"DIFF ... {len(diffs) - 6} more")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("\n\n")[1])
    main(*sys.argv[1:])
