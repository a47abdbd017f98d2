#!/usr/bin/python3
"""Weights served in another element type (-o dtype): checked against torch's own casts.

  dtype_check.py write-fp32 DIR      a Llama in fp32 whose weights include the hard cases of a
                                     cast to bf16 (ties, values rounding to inf, subnormals,
                                     signed zeros, infinities, NaNs) and an int64 tensor
  dtype_check.py cast SRC VIEW DTYPE (torch 2.x with safetensors) every tensor of VIEW equals
                                     torch's SRC_tensor.to(DTYPE) bit for bit; integer tensors
                                     unchanged; config.json's torch_dtype says DTYPE
  dtype_check.py reads FILE N        N random (offset, length) reads equal the whole file's bytes
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def write_fp32(out):
    import numpy as np
    import models
    cfg = models.config_for("llama", layers=2)
    cfg["torch_dtype"] = "float32"
    named = {}
    for name, (dt, a) in models.model_tensors(cfg).items():
        named[name] = ("F32", models.bf16_to_f32(a) if dt == "BF16" else a.astype(np.float32))
    rng = np.random.default_rng(7)
    # Random fp32 values (not bf16-exact): every rounding decision is made.
    w = rng.standard_normal(named["model.layers.0.mlp.down_proj.weight"][1].shape).astype(np.float32)
    special = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000,
                        0x00000001, 0x807FFFFF, 0x00008000, 0x00018000, 0x80000000, 0x00000000,
                        0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0x3F80FFFF],
                       dtype=np.uint32).view(np.float32)
    w.reshape(-1)[:special.size] = special
    named["model.layers.0.mlp.down_proj.weight"] = ("F32", w)
    named["model.layers.0.extra_counter"] = ("I64", np.arange(-3, 9, dtype=np.int64))
    models.write_checkpoint(out, named, cfg, shards=2, tokenizer=True)


def cast(src, view, dtype):
    import torch
    from safetensors.torch import load_file

    def load_dir(d):
        out = {}
        for f in sorted(os.listdir(d)):
            if f.endswith(".safetensors"):
                out.update(load_file(os.path.join(d, f)))
        return out

    want_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    a, b = load_dir(src), load_dir(view)
    bad = []
    if sorted(a) != sorted(b):
        bad.append(f"names differ: {sorted(set(a) ^ set(b))}")
    for name in a:
        if name not in b:
            continue
        s, v = a[name], b[name]
        want = s.to(want_dtype) if s.is_floating_point() else s
        if v.dtype != want.dtype or v.shape != want.shape:
            bad.append(f"{name}: {v.dtype} {tuple(v.shape)}, want {want.dtype} {tuple(want.shape)}")
            continue
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[want.element_size()]
        if not torch.equal(v.view(bits), want.view(bits)):
            n = int((v.view(bits) != want.view(bits)).sum())
            bad.append(f"{name}: {n} elements differ from torch's cast")
    cfg = json.load(open(os.path.join(view, "config.json")))
    name = {"bf16": "bfloat16", "fp32": "float32"}[dtype]
    if cfg.get("torch_dtype") != name:
        bad.append(f"config.json torch_dtype is {cfg.get('torch_dtype')!r}, want {name!r}")
    if bad:
        sys.exit("; ".join(bad[:5]))
    print(f"{len(a)} tensors equal torch's .to({want_dtype})")


def reads(path, count):
    data = open(path, "rb").read()
    rng = random.Random(len(data))
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(count):
            off = rng.randrange(0, len(data) + 8)
            n = rng.choice([1, 2, 3, 5, rng.randrange(0, 70000)])
            got = os.pread(fd, n, off)
            if got != data[off:off + n]:
                sys.exit(f"{path}: read of {n} bytes at {off} differs from the whole file's bytes")
    finally:
        os.close(fd)


def main():
    a = sys.argv[1:]
    if a[:1] == ["write-fp32"] and len(a) == 2:
        write_fp32(a[1])
    elif a[:1] == ["cast"] and len(a) == 4:
        cast(a[1], a[2], a[3])
    elif a[:1] == ["reads"] and len(a) == 3:
        reads(a[1], int(a[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
