#!/usr/bin/python3
"""Seed corpora of the pickle and zip fuzz targets, written with Debian's torch 1.13 and
Python's pickle. Usage: make_torch_corpus.py PICKLE_DIR ZIP_DIR

Also in the pickle corpus: dcp_metadata_p2.pkl, the `.metadata` of mcore/ for a one-layer
`models.py write llama --layers 1` (protocol 2, as ckptfs writes it), and dcp_metadata_p4.pkl,
the same Metadata loaded and dumped again by torch 2.6's Python (protocol 4: FRAME, MEMOIZE,
STACK_GLOBAL), as torch writes `.metadata` files."""
import argparse
import collections
import io
import os
import pickle
import sys
import zipfile

import torch


def main():
    pdir, zdir = sys.argv[1:3]
    os.makedirs(pdir, exist_ok=True)
    os.makedirs(zdir, exist_ok=True)
    base = torch.arange(24, dtype=torch.bfloat16).reshape(4, 6)
    objs = {
        "state_dict": collections.OrderedDict(
            [("w", base), ("t", base.t()), ("view", base[1:, 2:]), ("x._extra_state", None)]),
        "megatron_like": {"args": argparse.Namespace(tp=2, lr=1e-4, name="x", dtype=torch.float16),
                          "checkpoint_version": 3.0, "iteration": 7,
                          "model": {"a": torch.ones(3, dtype=torch.float32)},
                          "rng": [1, (2, 3), {4: 5}, b"bytes", -2**70, 2**40]},
    }
    for name, obj in objs.items():
        torch.save(obj, os.path.join(zdir, name + ".pt"))
        with zipfile.ZipFile(os.path.join(zdir, name + ".pt")) as z:
            pkl = [n for n in z.namelist() if n.endswith("data.pkl")][0]
            with open(os.path.join(pdir, name + ".pkl"), "wb") as f:
                f.write(z.read(pkl))
    plain = {"a": [1, 2.5, "s", None, True], "b": (1,), "c": {frozenset([1]), 3}}
    for proto in (2, 3, 4, 5):
        with open(os.path.join(pdir, f"plain_p{proto}.pkl"), "wb") as f:
            pickle.dump(plain, f, protocol=proto)
    with open(os.path.join(zdir, "not_a_zip"), "wb") as f:
        f.write(b"PK\x03\x04" + b"\0" * 60)


if __name__ == "__main__":
    main()
