#!/usr/bin/python3
"""Generate the inputs of bench/pack_bench.sh: the ~1 GiB Llama-shaped checkpoint of
bench/gen_checkpoint.py (hidden 2048, 12 layers, 16 heads / 4 KV heads, ffn 4096, vocab 32000,
untied lm_head; the same tensors, shards, headers, index and config) with weights drawn like
trained ones instead of uniform random bits: every element normal(0, 0.02), every tensor (the
norms too), and the same values in up to three encodings, written in one pass:

  gen_normal.py --bf16 DIR       BF16: the draws rounded to nearest even (1,115,701,248 bytes)
  gen_normal.py --fp32 DIR       F32: the same bf16 values widened (low 16 bits zero), what a
                                 trainer that keeps bf16 weights in fp32 storage writes
  gen_normal.py --fp32-true DIR  F32: the draws themselves (full 23-bit mantissas), as fp32
                                 master weights (verl FSDP's shards) hold them
  gen_normal.py --entropy FILE   order-0 entropy of each byte plane of FILE's tensor data (a
                                 safetensors file), from its first 64 MiB: the floor of any
                                 coder that codes each plane's bytes independently

Options can be combined (--bf16 A --fp32 B --fp32-true C). The F32 checkpoints have the same
shard files (the same tensors in each, twice the bytes) and the same index; config.json says
torch_dtype float32. Draws: numpy default_rng(seed) (default 0), standard_normal(float32) *
float32(0.02) in chunks of 8 Mi elements per tensor, tensors in file order; with seed 0 the BF16
output is byte-identical to what /tmp/bench/gen_normal.py (gen_checkpoint.py with a normal
write_random) wrote. Each DIR is written as DIR.tmp-PID and renamed at the end, so an existing
DIR is complete; an existing DIR is refused (--force replaces it).
"""

import argparse
import json
import os
import shutil
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_checkpoint as g  # noqa: E402  (tensor list, sharding, config of the 1 GiB model)
import st_write  # noqa: E402  (on sys.path through gen_checkpoint)

CHUNK = 8 << 20  # elements per draw (16 MiB of bf16), as /tmp/bench/gen_normal.py
STD = np.float32(0.02)


def bf16_round(x):
    """float32 array -> uint16 bf16 bits, round to nearest even (no NaN in normal draws)."""
    u = x.view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def header(tensors, dtype, esize):
    """safetensors header (length + JSON padded to 8 with spaces) for TENSORS sorted by name, the
    (name, elements) layout and the data size."""
    layout = [(name, int(np.prod(shape, dtype=np.int64))) for name, shape in sorted(tensors)]
    head, off = st_write.header_bytes((name, dtype, shape, n * esize)
                                      for (name, shape), (_, n) in zip(sorted(tensors), layout))
    return head, layout, off

def generate(outs, seed):
    """OUTS: {"bf16"|"fp32"|"fp32-true": DIR}. Returns (shards, tensors, elements)."""
    cfg = g.SMALL
    tensors = g.tensors_of(cfg)
    shards = g.shard(tensors, 300e6)  # the bf16 split of gen_checkpoint.py, kept for F32
    n = len(shards)
    tmp = {k: f"{d}.tmp-{os.getpid()}" for k, d in outs.items()}
    rng = np.random.default_rng(seed)
    weight_map, total_elems = {}, 0
    try:
        for d in tmp.values():
            os.makedirs(d)
        for k, group in enumerate(shards, 1):
            fname = f"model-{k:05d}-of-{n:05d}.safetensors"
            files = {}
            for key, d in tmp.items():
                dtype, esize = ("BF16", 2) if key == "bf16" else ("F32", 4)
                head, layout, _ = header(group, dtype, esize)
                files[key] = open(os.path.join(d, fname), "wb")
                files[key].write(head)
            for _, nelem in layout:  # the same order in every encoding
                left = nelem
                while left > 0:
                    m = min(CHUNK, left)
                    x = rng.standard_normal(m, dtype=np.float32) * STD
                    b = bf16_round(x)
                    if "bf16" in files:
                        files["bf16"].write(b.tobytes())
                    if "fp32" in files:
                        files["fp32"].write((b.astype(np.uint32) << np.uint32(16)).tobytes())
                    if "fp32-true" in files:
                        files["fp32-true"].write(x.tobytes())
                    left -= m
                total_elems += nelem
            for f in files.values():
                f.close()
            for name, _ in group:
                weight_map[name] = fname
        for key, d in tmp.items():
            esize = 2 if key == "bf16" else 4
            index = {"metadata": {"total_size": total_elems * esize},
                     "weight_map": dict(sorted(weight_map.items()))}
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
                json.dump(index, f, indent=2)
                f.write("\n")
            conf = g.config_json(cfg)
            if key != "bf16":
                conf["torch_dtype"] = "float32"
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(conf, f, indent=2)
                f.write("\n")
            with open(os.path.join(d, "generation_config.json"), "w") as f:
                json.dump({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
                           "transformers_version": "4.40.0"}, f, indent=2)
                f.write("\n")
        for key, d in outs.items():
            os.rename(tmp[key], d)
    except BaseException:
        for d in tmp.values():
            shutil.rmtree(d, ignore_errors=True)
        raise
    return n, len(tensors), total_elems


def entropy(path, limit=64 << 20):
    """Order-0 entropy (bits per byte) of each byte plane of the first LIMIT bytes of tensor data
    of safetensors file PATH (its first tensor's dtype decides the element size)."""
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        head = json.loads(f.read(hlen))
        dtypes = {v["dtype"] for k, v in head.items() if k != "__metadata__"}
        esize = {"BF16": 2, "F16": 2, "F32": 4}[sorted(dtypes)[0]]
        data = np.frombuffer(f.read(limit - limit % esize), dtype=np.uint8)
    data = data[: len(data) - len(data) % esize].reshape(-1, esize)
    out = []
    for p in range(esize):
        c = np.bincount(data[:, p], minlength=256).astype(np.float64)
        q = c[c > 0] / c.sum()
        out.append(max(0.0, float(-(q * np.log2(q)).sum())))
    return esize, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bf16", metavar="DIR")
    ap.add_argument("--fp32", metavar="DIR")
    ap.add_argument("--fp32-true", metavar="DIR", dest="fp32_true")
    ap.add_argument("--entropy", metavar="FILE")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="replace existing DIRs")
    a = ap.parse_args()
    if a.entropy:
        esize, h = entropy(a.entropy)
        # bound on the ratio of plane-wise order-0 coding: sum of plane entropies / (8 * esize)
        print("entropy: " + " ".join(f"{x:.3f}" for x in h) +
              f" bits/byte per plane (low to high); ratio floor {sum(h) / (8 * esize):.3f}")
        return
    outs = {k: os.path.abspath(d) for k, d in (("bf16", a.bf16), ("fp32", a.fp32), ("fp32-true", a.fp32_true))
            if d is not None}
    if not outs:
        ap.error("give at least one of --bf16, --fp32, --fp32-true, --entropy")
    for d in outs.values():
        if os.path.exists(d):
            if not a.force:
                sys.exit(f"gen_normal: {d} exists (use --force to replace it)")
            shutil.rmtree(d)
        os.makedirs(os.path.dirname(d) or ".", exist_ok=True)
    t0 = time.monotonic()
    n, nt, elems = generate(outs, a.seed)
    print(f"gen_normal: {nt} tensors, {elems} elements in {n} shards, normal(0, 0.02) seed {a.seed}: " +
          ", ".join(f"{k} {d}" for k, d in outs.items()) + f" ({time.monotonic() - t0:.1f} s)")


if __name__ == "__main__":
    main()
