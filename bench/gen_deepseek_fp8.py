#!/usr/bin/python3
"""Generate a real (non-sparse) block-FP8 checkpoint of DeepSeek-V3's shapes at reduced depth and
expert count, for the ckptfs dequantisation benchmark (bench/deepseek_bench.sh); with --model
gpt-oss, a real MXFP4 checkpoint of GPT-OSS's shapes (bench/mxfp4_copy_bench.sh).

  gen_deepseek_fp8.py OUT [--model deepseek-v3|gpt-oss] [--layers N] [--experts N] [--vocab 16384]
                          [--shards N] [--seed 0] [--force]

Run with Debian's /usr/bin/python3 (numpy). Writes into OUT.tmp-PID and renames it to OUT at the
end, so an existing OUT is always complete; OUT must not exist (--force replaces it).

The model is DeepSeek-V3's (hidden 7168, MLA with q_lora_rank 1536 / kv_lora_rank 512, 128 heads,
dense ffn 18432, expert ffn 2048, one shared expert; the release's config.json with these
changes): LAYERS decoder layers, the first dense (first_k_dense_replace 1) and the others MoE
with EXPERTS routed experts (n_group = topk_group = 1, num_experts_per_tok min(8, EXPERTS)), no
MTP layer, VOCAB tokens. Tensor names, dtypes, order, sharding (SHARDS files, greedy in model
order) and the safetensors layout are gen_deepseek_sparse.py's. Defaults: 4 layers, 6 experts:
2.07 GB of F8_E4M3 weights (plus 0.47 GB of bf16 embedding / lm_head and 0.5 MB of scales),
2.54 GB in 5 shards, 4.61 GB once dequantised to bf16; ~50 s on 2 cores. Each further MoE layer
adds ~0.5 GB of FP8 (attention 0.19 GB + 7 experts x 44 MB at 6 experts).

Values: each FP8 weight is quantised as the release is, amax / 448 per 128 x 128 block: for every
block, random normal values scaled so the block's largest magnitude is exactly 448, rounded to
E4M3 (round to nearest even, as torch's float8_e4m3fn cast; no NaN codes), with the block's
`_scale_inv` drawn log-uniformly in [5e-5, 1e-3] (so code * scale_inv is a weight whose block
amax / 448 is that scale). Other tensors are random bf16 with |x| < 2 (no NaN or Inf); the
router's e_score_correction_bias random F32. Deterministic for a seed: each tensor's values come
from a generator seeded with (seed, tensor name), whatever shard it is written in.

--model gpt-oss: GPT-OSS-20B's widths (hidden 2880, expert ffn 2880, 64 heads of 64, 8 KV heads,
32 experts, 4 per token; gen_deepseek_sparse.py's gpt-oss-120b config.json, its
quantization_config mxfp4 included, with these changes): LAYERS layers (sliding and full
attention in turn), EXPERTS experts, VOCAB tokens; the release's names, dtypes and shapes
(gen_deepseek_sparse.py's gpt_oss_tensors_of: the experts' `*_blocks` U8 [E, rows, cols / 32, 16]
and `*_scales` U8 [E, rows, cols / 32], the rest bf16) and shard names (counted from 0). The
blocks are random bytes (every nibble is a valid FP4 E2M1 code), the E8M0 scales random in
118..125 (2^-9 .. 2^-2), the rest random bf16 as above. Defaults: 3 layers, 32 experts, 3 shards:
1.27 GB of MXFP4 experts, 1.62 GB in all, 5.1 GB once dequantised to bf16.
"""
import argparse
import copy
import hashlib
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_deepseek_sparse as ds  # noqa: E402

ROWS = 128  # block rows generated at a time


def config(layers, experts, vocab):
    cfg = copy.deepcopy(ds.DEEPSEEK_V3_CONFIG)
    cfg.update({"num_hidden_layers": layers, "first_k_dense_replace": 1,
                "n_routed_experts": experts, "num_experts_per_tok": min(8, experts),
                "n_group": 1, "topk_group": 1, "num_nextn_predict_layers": 0,
                "vocab_size": vocab})
    return cfg


def gpt_oss_config(layers, experts, vocab):
    cfg = copy.deepcopy(ds.GPT_OSS_120B_CONFIG)
    cfg.update({"num_hidden_layers": layers, "num_local_experts": experts,
                "num_experts_per_tok": min(4, experts), "experts_per_token": min(4, experts),
                "layer_types": cfg["layer_types"][:layers], "vocab_size": vocab})
    return cfg


# --model: (config, tensors, default layers, experts, shards)
MODELS = {"deepseek-v3": (config, ds.tensors_of, 4, 6, 5),
          "gpt-oss": (gpt_oss_config, ds.gpt_oss_tensors_of, 3, 32, 3)}


def rng_for(seed, name):
    h = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "little"))


def f32_to_e4m3(q):
    """E4M3 ("fn") codes of float32 Q (|Q| <= 448), rounded to nearest even."""
    bits = np.ascontiguousarray(q, dtype=np.float32).view(np.uint32)
    sign = (bits >> np.uint32(24)) & np.uint32(0x80)
    a = bits & np.uint32(0x7FFFFFFF)
    # Normal results: keep 3 mantissa bits (round to nearest even), rebias the exponent 127 -> 7.
    r = (a + np.uint32(0x7FFFF) + ((a >> np.uint32(20)) & np.uint32(1))) >> np.uint32(20)
    code = r - np.uint32((127 - 7) << 3)
    # Below 2^-6: subnormal codes m * 2^-9 (m = 8 is the smallest normal, code 8 again).
    small = a < np.uint32(0x3C800000)
    if small.any():
        m = np.rint(a[small].view(np.float32) * np.float32(512)).astype(np.uint32)
        code[small] = m
    return (code | sign).astype(np.uint8)


def fp8_block_rows(rng, rows, cols, br, bc):
    """Yields the E4M3 codes of a [ROWS, COLS] weight, BR rows at a time; every BR x BC block's
    largest magnitude is 448."""
    gc = -(-cols // bc)
    starts = np.arange(gc) * bc
    for r0 in range(0, rows, br):
        n = min(br, rows - r0)
        w = rng.standard_normal((n, cols), dtype=np.float32)
        amax = np.maximum.reduceat(np.abs(w).max(axis=0), starts)  # [gc]
        factor = np.repeat(np.float32(448) / amax, bc)[:cols]
        q = np.minimum(np.abs(w * factor), np.float32(448)) * np.sign(w)
        yield f32_to_e4m3(q)


def scales(rng, shape):
    return np.exp(rng.uniform(np.log(5e-5), np.log(1e-3), size=shape)).astype(np.float32)


def nbytes_of(shape):  # elements, i.e. bytes of a 1-byte dtype
    n = 1
    for d in shape:
        n *= d
    return n


def write_tensor(f, seed, name, dtype, shape, br=None, bc=None):
    rng = rng_for(seed, name)
    if dtype == "F8_E4M3":
        for codes in fp8_block_rows(rng, shape[0], shape[1], br, bc):
            f.write(codes.tobytes())
    elif dtype == "F32" and name.endswith("_scale_inv"):
        f.write(scales(rng_for(seed, name[:-len("_scale_inv")] + "#scale"), shape).tobytes())
    elif dtype == "F32":
        f.write((rng.standard_normal(shape, dtype=np.float32) * np.float32(0.01)).tobytes())
    elif dtype == "U8" and name.endswith("_blocks"):  # MXFP4: two FP4 codes a byte, all valid
        n = nbytes_of(shape)
        chunk = 32 << 20
        for off in range(0, n, chunk):
            f.write(rng.bytes(min(chunk, n - off)))
    elif dtype == "U8" and name.endswith("_scales"):  # E8M0 exponents, 2^-9 .. 2^-2
        f.write(rng.integers(118, 126, size=nbytes_of(shape), dtype=np.uint8).tobytes())
    elif dtype == "BF16":
        n = nbytes_of(shape)
        chunk = 32 << 20
        for off in range(0, n, chunk):
            a = rng.integers(0, 1 << 16, size=min(chunk, n - off), dtype=np.uint16)
            a &= np.uint16(0xBFFF)
            f.write(a.tobytes())
    else:
        raise ValueError(f"{name}: no generator for {dtype}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="directory to create")
    ap.add_argument("--model", choices=sorted(MODELS), default="deepseek-v3",
                    help="deepseek-v3 (block-FP8, the default) or gpt-oss (MXFP4 experts)")
    ap.add_argument("--layers", type=int, help="decoder layers (default 4, the first dense; gpt-oss 3)")
    ap.add_argument("--experts", type=int, help="routed experts per MoE layer (default 6; gpt-oss 32)")
    ap.add_argument("--vocab", type=int, default=16384, help="vocabulary (default 16384)")
    ap.add_argument("--shards", type=int, help="number of shards (default 5; gpt-oss 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="replace OUT if it exists")
    args = ap.parse_args()
    config_of, tensors_of, layers, experts, shards = MODELS[args.model]
    args.layers, args.experts, args.shards = args.layers or layers, args.experts or experts, args.shards or shards
    if args.layers < 1 or args.experts < 1 or args.vocab < 1 or args.shards < 1:
        ap.error("--layers, --experts, --vocab and --shards must be >= 1")
    dest = os.path.abspath(args.out)
    if os.path.exists(dest):
        if not args.force:
            sys.exit(f"gen_deepseek_fp8: {dest} exists (use --force to replace it)")
        shutil.rmtree(dest)
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    cfg = config_of(args.layers, args.experts, args.vocab)
    br, bc = cfg["quantization_config"].get("weight_block_size", (None, None))
    tensors = tensors_of(cfg)

    def write_data(f, ordered):
        for name, dt, shape in ordered:
            write_tensor(f, args.seed, name, dt, shape, br, bc)

    t0 = time.monotonic()
    n, ntensors, total, files = ds.write_checkpoint(dest, cfg, tensors, args.shards, write_data)
    by = {}
    for _, dt, s in tensors:
        by[dt] = by.get(dt, 0) + ds.nbytes(dt, s)
    fp8, u8 = by.get("F8_E4M3", 0), by.get("U8", 0)
    blocks = sum(ds.nbytes(dt, s) for nm, dt, s in tensors if nm.endswith("_blocks"))
    out_bytes = total + fp8 - by.get("F32", 0) + sum(  # bf16 after dequantisation
        ds.nbytes(dt, s) for nm, dt, s in tensors if dt == "F32" and not nm.endswith("_scale_inv"))
    out_bytes += 4 * blocks - u8  # MXFP4: a byte of blocks is 2 bf16 values; the scales go
    print(f"gen_deepseek_fp8: {dest}: {n} shards, {ntensors} tensors, {total} bytes "
          f"({fp8} F8_E4M3, {u8} U8, {by.get('BF16', 0)} BF16, {by.get('F32', 0)} F32); "
          f"~{out_bytes} bytes as bf16; {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
