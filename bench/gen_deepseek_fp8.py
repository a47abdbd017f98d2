#!/usr/bin/python3
"""Generate a real (non-sparse) block-FP8 checkpoint of DeepSeek-V3's shapes at reduced depth and
expert count, for the ckptfs dequantisation benchmark (bench/deepseek_bench.sh).

  gen_deepseek_fp8.py OUT [--layers 4] [--experts 6] [--vocab 16384] [--shards 5] [--seed 0]
                          [--force]

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


def write_tensor(f, seed, name, dtype, shape, br, bc):
    rng = rng_for(seed, name)
    if dtype == "F8_E4M3":
        for codes in fp8_block_rows(rng, shape[0], shape[1], br, bc):
            f.write(codes.tobytes())
    elif dtype == "F32" and name.endswith("_scale_inv"):
        f.write(scales(rng_for(seed, name[:-len("_scale_inv")] + "#scale"), shape).tobytes())
    elif dtype == "F32":
        f.write((rng.standard_normal(shape, dtype=np.float32) * np.float32(0.01)).tobytes())
    elif dtype == "BF16":
        n = 1
        for d in shape:
            n *= d
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
    ap.add_argument("--layers", type=int, default=4, help="decoder layers, the first dense (default 4)")
    ap.add_argument("--experts", type=int, default=6, help="routed experts per MoE layer (default 6)")
    ap.add_argument("--vocab", type=int, default=16384, help="vocabulary (default 16384)")
    ap.add_argument("--shards", type=int, default=5, help="number of shards (default 5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="replace OUT if it exists")
    args = ap.parse_args()
    if args.layers < 1 or args.experts < 1 or args.vocab < 1 or args.shards < 1:
        ap.error("--layers, --experts, --vocab and --shards must be >= 1")
    dest = os.path.abspath(args.out)
    if os.path.exists(dest):
        if not args.force:
            sys.exit(f"gen_deepseek_fp8: {dest} exists (use --force to replace it)")
        shutil.rmtree(dest)
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    cfg = config(args.layers, args.experts, args.vocab)
    br, bc = cfg["quantization_config"]["weight_block_size"]
    tensors = ds.tensors_of(cfg)

    def write_data(f, ordered):
        for name, dt, shape in ordered:
            write_tensor(f, args.seed, name, dt, shape, br, bc)

    t0 = time.monotonic()
    n, ntensors, total, files = ds.write_checkpoint(dest, cfg, tensors, args.shards, write_data)
    by = {}
    for _, dt, s in tensors:
        by[dt] = by.get(dt, 0) + ds.nbytes(dt, s)
    fp8 = by.get("F8_E4M3", 0)
    out_bytes = total + fp8 - by.get("F32", 0) + sum(  # bf16 after dequantisation
        ds.nbytes(dt, s) for nm, dt, s in tensors if dt == "F32" and not nm.endswith("_scale_inv"))
    print(f"gen_deepseek_fp8: {dest}: {n} shards, {ntensors} tensors, {total} bytes "
          f"({fp8} F8_E4M3, {by.get('BF16', 0)} BF16, {by.get('F32', 0)} F32); "
          f"~{out_bytes} bytes as bf16; {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
