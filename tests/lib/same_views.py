#!/usr/bin/python3
"""Two legacy Megatron views (e.g. tp2pp1ep2/ of a Hugging Face model and of a Megatron copy of
it) hold the same files, and in every rank file the same entries in the same order with
bit-identical tensors, and the same args but for hf_token_ids: the tokenizer ids a Hugging Face
source's config.json gives and the views carry, which a checkpoint Megatron saved has not.

  same_views.py VIEW_WITH_IDS VIEW_WITHOUT
Exit 0 when they agree; otherwise one line on stderr.
"""
import os
import sys

import torch


def walk(a, b, where):
    if type(a) is not type(b):
        sys.exit(f"{where}: {type(a).__name__} vs {type(b).__name__}")
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            sys.exit(f"{where}: tensors differ")
    elif isinstance(a, dict):
        if list(a) != list(b):
            sys.exit(f"{where}: keys differ: {list(a)[:5]}... vs {list(b)[:5]}...")
        for k in a:
            walk(a[k], b[k], f"{where}.{k}")
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        va, vb = dict(vars(a)), dict(vars(b))
        if "hf_token_ids" not in va or "hf_token_ids" in vb:
            sys.exit(f"{where}: hf_token_ids in the first ({'hf_token_ids' in va}) and not the second "
                     f"({'hf_token_ids' not in vb}) expected")
        del va["hf_token_ids"]
        walk(va, vb, where)
    elif a != b:
        sys.exit(f"{where}: {a!r} vs {b!r}")


def main():
    with_ids, without = sys.argv[1:3]
    files = [(d, sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs))
             for d in (with_ids, without)]
    if files[0][1] != files[1][1]:
        sys.exit(f"the views hold other files: {files[0][1][:4]} vs {files[1][1][:4]}")
    for name in files[0][1]:
        a, b = os.path.join(with_ids, name), os.path.join(without, name)
        if not name.endswith(".pt"):
            if open(a, "rb").read() != open(b, "rb").read():
                sys.exit(f"{name} differs")
            continue
        walk(torch.load(a, map_location="cpu", weights_only=False),
             torch.load(b, map_location="cpu", weights_only=False), name)


if __name__ == "__main__":
    main()
