#!/usr/bin/python3
"""Generate Hugging Face-style Llama checkpoints for the ckptfs benchmark.

Run with Debian's /usr/bin/python3 (needs numpy; 1.24 is enough).

  gen_checkpoint.py DIR               ~1 GiB bf16 Llama-shaped checkpoint with random weights
                                      (hidden 2048, 12 layers, 16 heads / 4 KV heads, ffn 4096,
                                      vocab 32000, untied lm_head; 4 shards + index + config)
  gen_checkpoint.py --sparse-70b DIR  Llama-3-70B-shaped checkpoint (30 shards, real headers,
                                      ~141 GB logical) whose data areas are holes: takes a few
                                      MB of disk and well under a second

Both write into DIR.tmp-PID first and rename it to DIR at the end, so an existing DIR is always
complete. DIR must not exist (use --force to replace it).

The tensor order, the per-shard layout and the sharding follow what transformers'
save_pretrained does: tensors in state-dict order, a new shard whenever the next tensor would
push the current one past max_shard_size (decimal, "5GB" = 5e9), and inside each file
safetensors' own layout (tensors sorted by name, header padded with spaces to 8 bytes,
"__metadata__": {"format": "pt"}).
"""

import argparse
import json
import os
import shutil
import struct
import sys
import time

import numpy as np

BF16 = 2  # bytes per element

# Llama-3-70B (meta-llama/Meta-Llama-3-70B config.json).
LLAMA3_70B = dict(
    hidden_size=8192,
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
    intermediate_size=28672,
    vocab_size=128256,
    tie_word_embeddings=False,
    max_position_embeddings=8192,
    rope_theta=500000.0,
    rms_norm_eps=1e-05,
    bos_token_id=128000,
    eos_token_id=128001,
)

# The ~1 GiB model used for the throughput runs: 1,115,701,248 bytes of weights.
SMALL = dict(
    hidden_size=2048,
    num_hidden_layers=12,
    num_attention_heads=16,
    num_key_value_heads=4,
    intermediate_size=4096,
    vocab_size=32000,
    tie_word_embeddings=False,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    rms_norm_eps=1e-05,
    bos_token_id=1,
    eos_token_id=2,
)


def llama_tensors(cfg):
    """(name, shape) in the state-dict order of transformers' LlamaForCausalLM."""
    h = cfg["hidden_size"]
    ffn = cfg["intermediate_size"]
    head_dim = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head_dim
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "mlp.gate_proj.weight", (ffn, h)),
            (p + "mlp.up_proj.weight", (ffn, h)),
            (p + "mlp.down_proj.weight", (h, ffn)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    out.append(("model.norm.weight", (h,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (cfg["vocab_size"], h)))
    return out


def nbytes(shape):
    n = BF16
    for d in shape:
        n *= d
    return n


def shard(tensors, max_shard_size):
    """transformers' greedy split: a new shard when the next tensor would overflow this one."""
    shards, cur, cur_size = [], [], 0
    for name, shape in tensors:
        size = nbytes(shape)
        if cur and cur_size + size > max_shard_size:
            shards.append(cur)
            cur, cur_size = [], 0
        cur.append((name, shape))
        cur_size += size
    if cur:
        shards.append(cur)
    return shards


def header_bytes(tensors):
    """safetensors header (8-byte length + JSON padded to 8) and the data size, for TENSORS."""
    meta = {"__metadata__": {"format": "pt"}}
    off = 0
    layout = []
    for name, shape in sorted(tensors):
        size = nbytes(shape)
        meta[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + size]}
        layout.append((name, size))
        off += size
    js = json.dumps(meta, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js, layout, off


def config_json(cfg):
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": cfg["bos_token_id"],
        "eos_token_id": cfg["eos_token_id"],
        "hidden_act": "silu",
        "hidden_size": cfg["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": cfg["intermediate_size"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "model_type": "llama",
        "num_attention_heads": cfg["num_attention_heads"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "pretraining_tp": 1,
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": cfg["rope_theta"],
        "tie_word_embeddings": cfg["tie_word_embeddings"],
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.0",
        "use_cache": True,
        "vocab_size": cfg["vocab_size"],
    }


CHUNK = 64 << 20


def write_random(f, size, rng):
    """SIZE bytes of random bf16 values with |x| < 2 (no NaN/Inf: top exponent bit cleared)."""
    left = size
    while left > 0:
        n = min(CHUNK, left)
        a = rng.integers(0, 1 << 16, size=n // 2, dtype=np.uint16)
        a &= np.uint16(0xBFFF)
        f.write(a.tobytes())
        left -= n


def generate(dest, cfg, max_shard_size, sparse, seed=0):
    tensors = llama_tensors(cfg)
    shards = shard(tensors, max_shard_size)
    n = len(shards)
    tmp = f"{dest}.tmp-{os.getpid()}"
    os.makedirs(tmp)
    rng = np.random.default_rng(seed)
    weight_map = {}
    total = 0
    try:
        for k, group in enumerate(shards, 1):
            fname = f"model-{k:05d}-of-{n:05d}.safetensors"
            head, layout, data_size = header_bytes(group)
            with open(os.path.join(tmp, fname), "wb") as f:
                f.write(head)
                if sparse:
                    f.truncate(len(head) + data_size)
                else:
                    for _, size in layout:
                        write_random(f, size, rng)
            for name, _ in group:
                weight_map[name] = fname
            total += data_size
        index = {"metadata": {"total_size": total},
                 "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config_json(cfg), f, indent=2)
            f.write("\n")
        with open(os.path.join(tmp, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
                       "transformers_version": "4.40.0"}, f, indent=2)
            f.write("\n")
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return n, len(tensors), total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", help="write the ~1 GiB random checkpoint here")
    ap.add_argument("--sparse-70b", metavar="DIR",
                    help="write the sparse Llama-3-70B-shaped checkpoint here")
    ap.add_argument("--max-shard-size", type=float, default=None,
                    help="decimal bytes per shard (default 300e6 for the small model, "
                         "5e9 for --sparse-70b)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="replace DIR if it exists")
    args = ap.parse_args()
    if (args.dir is None) == (args.sparse_70b is None):
        ap.error("give exactly one of DIR or --sparse-70b DIR")

    sparse = args.sparse_70b is not None
    dest = os.path.abspath(args.sparse_70b if sparse else args.dir)
    cfg = LLAMA3_70B if sparse else SMALL
    max_shard = int(args.max_shard_size or (5e9 if sparse else 300e6))
    if os.path.exists(dest):
        if not args.force:
            sys.exit(f"gen_checkpoint: {dest} exists (use --force to replace it)")
        shutil.rmtree(dest)
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    t0 = time.monotonic()
    n, ntensors, total = generate(dest, cfg, max_shard, sparse, args.seed)
    dt = time.monotonic() - t0
    print(f"gen_checkpoint: {dest}: {n} shards, {ntensors} tensors, {total} bytes of weights"
          f" ({total / 2**30:.2f} GiB{', sparse' if sparse else ''}) in {dt:.1f} s")


if __name__ == "__main__":
    main()
