#!/usr/bin/python3
"""An offline MXFP4 -> bf16 converter for GPT-OSS checkpoints: the baseline of
bench/mxfp4_copy_bench.sh (what users run today to get a bf16 copy of gpt-oss-20b/120b).

  mxfp4_dequant_bf16.py SRC DEST      convert SRC (a GPT-OSS release with MXFP4 experts) into DEST
  mxfp4_dequant_bf16.py --against-transformers SRC...
                                      compare dequantise() with transformers' own
                                      convert_moe_packed_tensors on every expert tensor of SRC

Runs under torch 2.x with safetensors (the tests' Debian 13 root: torch 2.6; the check needs
transformers 5: the sid root). Written from the format (OCP MX: 32 FP4 E2M1 codes a group, two a
byte, low nibble first, times the group's E8M0 scale 2^(scale - 127)): for each shard in sorted
order, load it (safetensors `load_file`), replace every `<name>_blocks` U8 [E, R, C/32, 16] and its
`<name>_scales` U8 [E, R, C/32] (looked up through the index, in this or another shard; the two
most recently loaded shards are kept) by `<name>` bf16 [E, C, R] (the stored [R, C] of each
expert transposed: transformers' GptOssExperts parameter, as ckptfs's hf/ with -o dtype=bf16
serves it), keep the other tensors, `save_file` the shard under its own name; then the index
with the new names (when SRC has one: a lone model.safetensors needs none) and config.json without
quantization_config, torch_dtype bfloat16 (generation_config.json copied).
Experts are dequantised one at a time (float32 products, rounded to bf16), so memory stays at a
shard plus its bf16 copy.
"""
import json
import os
import shutil
import sys
from glob import glob

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

FP4_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def dequantise(blocks, scales):
    """bf16 [E, C, R] of MXFP4 BLOCKS U8 [E, R, C/32, 16] with SCALES U8 [E, R, C/32]."""
    e_count, rows, groups, width = blocks.shape
    if width != 16 or tuple(scales.shape) != (e_count, rows, groups):
        raise ValueError(f"blocks {list(blocks.shape)} and scales {list(scales.shape)} are not MXFP4")
    lut = torch.tensor(FP4_E2M1, dtype=torch.float32)
    out = torch.empty(e_count, groups * 32, rows, dtype=torch.bfloat16)
    for e in range(e_count):
        b = blocks[e]
        codes = torch.stack((b & 0x0F, b >> 4), dim=-1).reshape(rows, groups, 32)  # low nibble first
        values = lut[codes.long()]
        # 2^(scale - 127) in two halves: 2^128 (scale 255) is no float32, yet 0 x 2^128 is 0.
        exponent = scales[e].to(torch.int32) - 127
        half = torch.div(exponent, 2, rounding_mode="floor")
        values.mul_(torch.exp2(half.float()).unsqueeze(-1)).mul_(torch.exp2((exponent - half).float()).unsqueeze(-1))
        out[e] = values.reshape(rows, groups * 32).t()
    return out


def convert(src, dest):
    index = os.path.join(src, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
    else:  # one model.safetensors, no index
        with safe_open(os.path.join(src, "model.safetensors"), "pt") as f:
            weight_map = {name: "model.safetensors" for name in f.keys()}
    os.makedirs(dest, exist_ok=True)
    loaded = {}

    def tensor(name):
        shard = weight_map[name]
        if shard not in loaded:
            loaded[shard] = load_file(os.path.join(src, shard))
        return loaded[shard][name]

    new_map, total, converted = {}, 0, 0
    files = sorted(glob(os.path.join(src, "*.safetensors")))
    for path in files:
        shard = os.path.basename(path)
        loaded[shard] = load_file(path)
        out = {}
        for name, t in loaded[shard].items():
            if name.endswith("_scales"):
                continue
            if name.endswith("_blocks"):
                base = name[: -len("_blocks")]
                out[base] = dequantise(t, tensor(base + "_scales"))
                converted += 1
            else:
                out[name] = t
        save_file(out, os.path.join(dest, shard), metadata={"format": "pt"})
        for name, t in out.items():
            new_map[name] = shard
            total += t.numel() * t.element_size()
        del out
        while len(loaded) > 2:  # keep the two most recently loaded shards
            del loaded[next(iter(loaded))]
    if os.path.exists(index):
        with open(os.path.join(dest, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(new_map.items()))}, f, indent=2)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config.pop("quantization_config", None)
    config["torch_dtype"] = "bfloat16"  # what the weights now are
    with open(os.path.join(dest, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if os.path.exists(os.path.join(src, "generation_config.json")):
        shutil.copyfile(os.path.join(src, "generation_config.json"), os.path.join(dest, "generation_config.json"))
    print(f"mxfp4_dequant_bf16: {len(files)} shards, {converted} MXFP4 tensors dequantised, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads", file=sys.stderr)


def against_transformers(*srcs):
    """PASS when dequantise() equals transformers' convert_moe_packed_tensors bit for bit."""
    for src in srcs:
        if not against_transformers_one(src):
            return
    print(f"PASS {' '.join(srcs)}: every expert tensor bit-identical to transformers' convert_moe_packed_tensors")


def against_transformers_one(src):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    tensors = {}
    for path in sorted(glob(os.path.join(src, "*.safetensors"))):
        tensors.update(load_file(path))
    checked = 0
    for name in sorted(tensors):
        if not name.endswith("_blocks"):
            continue
        base = name[: -len("_blocks")]
        ours = dequantise(tensors[name], tensors[base + "_scales"])
        theirs = convert_moe_packed_tensors(tensors[name], tensors[base + "_scales"])
        if ours.dtype != theirs.dtype or ours.shape != theirs.shape or \
                not torch.equal(ours.view(torch.int16), theirs.view(torch.int16)):
            print(f"FAIL {src}: {base}: {ours.dtype} {list(ours.shape)} against transformers' {theirs.dtype} "
                  f"{list(theirs.shape)}")
            return False
        checked += 1
    if not checked:
        print(f"FAIL {src}: no MXFP4 blocks")
    return checked > 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--against-transformers":
        against_transformers(*sys.argv[2:])
    elif len(sys.argv) == 3 and not sys.argv[1].startswith("-"):
        convert(sys.argv[1], sys.argv[2])
    else:
        sys.exit(__doc__.split("\n\n")[1])
