#!/usr/bin/python3
"""Checks of an hf/ view made from verl FSDP shards (no ckptfs code involved).

  verl_check.py fp32 SRC VIEW    every tensor of VIEW is F32, and equals SRC's tensor (bf16 in the
                                 test data) upcast to fp32 exactly; same names and shapes
  verl_check.py names SRC VIEW   VIEW holds exactly SRC's tensor names (tied lm_head dropped)

SRC is the Hugging Face model the run started from: the shards hold its bf16 values as fp32.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import read_checkpoint  # noqa: E402


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


def same_names(want, got):
    if set(want) != set(got):
        fail(f"tensor names differ: missing {sorted(set(want) - set(got))[:5]} "
             f"extra {sorted(set(got) - set(want))[:5]}")


def as_fp32(dtype, raw):
    """The fp32 bytes of a tensor stored as DTYPE: bf16 is the top half of an fp32."""
    if dtype == "F32":
        return raw
    if dtype == "BF16":
        return (np.frombuffer(raw, dtype="<u2").astype("<u4") << 16).tobytes()
    fail(f"unexpected dtype {dtype} in the source model")


def fp32(src, view):
    want, got = read_checkpoint(src), read_checkpoint(view)
    same_names(want, got)
    for name, (dtype, shape, raw) in want.items():
        gdtype, gshape, graw = got[name]
        if gdtype != "F32" or gshape != shape:
            fail(f"{name}: {gdtype} {list(gshape)} in the view, want F32 {list(shape)}")
        if graw != as_fp32(dtype, raw):
            a = np.frombuffer(graw, dtype="<u4")
            b = np.frombuffer(as_fp32(dtype, raw), dtype="<u4")
            first = int(np.argmax(a != b))
            fail(f"{name}: element {first} is 0x{a[first]:08x}, want 0x{b[first]:08x} "
                 f"({int((a != b).sum())} of {a.size} differ)")


def names(src, view):
    same_names(read_checkpoint(src), read_checkpoint(view))


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("fp32", "names"):
        fail(__doc__)
    {"fp32": fp32, "names": names}[sys.argv[1]](sys.argv[2], sys.argv[3])


if __name__ == "__main__":
    main()
