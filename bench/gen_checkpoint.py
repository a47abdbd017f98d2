#!/usr/bin/python3
"""Generate Hugging Face-style checkpoints (Llama; Mixtral and Qwen3-MoE mixtures of experts) for the
ckptfs benchmarks.

Run with Debian's /usr/bin/python3 (needs numpy; 1.24 is enough).

  gen_checkpoint.py DIR               ~1 GiB bf16 Llama-shaped checkpoint with random weights
                                      (hidden 2048, 12 layers, 16 heads / 4 KV heads, ffn 4096,
                                      vocab 32000, untied lm_head; 4 shards + index + config)
  gen_checkpoint.py --sparse-70b DIR  Llama-3-70B-shaped checkpoint (30 shards, real headers,
                                      ~141 GB logical) whose data areas are holes: takes a few
                                      MB of disk and well under a second
  gen_checkpoint.py --mixtral-1g DIR  ~1 GiB bf16 Mixtral-shaped mixture-of-experts checkpoint
                                      with random weights (hidden 1024, 12 layers, 16 heads / 4
                                      KV heads, 8 experts top-2 with ffn 1536, vocab 32000,
                                      untied lm_head; 4 shards + index + config)
  gen_checkpoint.py --sparse-qwen3-235b DIR
                                      Qwen3-235B-A22B's real config and shard layout (94 layers,
                                      128 experts, 118 shards of at most 4 GB, 36,945 tensors,
                                      ~470 GB logical), data areas as holes

Both write into DIR.tmp-PID first and rename it to DIR at the end, so an existing DIR is always
complete. DIR must not exist (use --force to replace it).

The tensor order, the per-shard layout and the sharding follow what transformers'
save_pretrained does: tensors in state-dict order, a new shard whenever the next tensor would
push the current one past max_shard_size (decimal, "5GB" = 5e9), and inside each file
safetensors' own layout (tensors sorted by name, header padded with spaces to 8 bytes,
"__metadata__": {"format": "pt"}).

Qwen3-235B-A22B: state-dict order of Qwen3MoeForCausalLM except that each layer's router
(mlp.gate.weight) comes after its 384 expert tensors, as in the published checkpoint: its first
shard, model-00001-of-00118.safetensors, holds the embedding, layer 0's attention (q/k/v/o, q/k
norms) and experts 0-68 and no router (214 tensors, 3,991,929,344 bytes); greedy splitting at
4e9 ("4GB") then gives its 118 shards and total_size 470,187,269,120.
"""

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
import st_write  # noqa: E402  (the project's one safetensors writer)

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


# Qwen/Qwen3-235B-A22B config.json.
QWEN3_235B = dict(
    family="qwen3_moe",
    hidden_size=4096,
    num_hidden_layers=94,
    num_attention_heads=64,
    num_key_value_heads=4,
    head_dim=128,
    intermediate_size=12288,
    moe_intermediate_size=1536,
    num_experts=128,
    num_experts_per_tok=8,
    vocab_size=151936,
    tie_word_embeddings=False,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-06,
    bos_token_id=151643,
    eos_token_id=151645,
)

# The ~1 GiB MoE model for the throughput runs: 1,100,204,032 bytes of weights.
MIXTRAL_1G = dict(
    family="mixtral",
    hidden_size=1024,
    num_hidden_layers=12,
    num_attention_heads=16,
    num_key_value_heads=4,
    intermediate_size=1536,
    num_local_experts=8,
    num_experts_per_tok=2,
    vocab_size=32000,
    tie_word_embeddings=False,
    max_position_embeddings=4096,
    rope_theta=1000000.0,
    rms_norm_eps=1e-05,
    bos_token_id=1,
    eos_token_id=2,
)


def tensors_of(cfg):
    fam = cfg.get("family", "llama")
    return {"llama": llama_tensors, "mixtral": mixtral_tensors,
            "qwen3_moe": qwen3_moe_tensors}[fam](cfg)


def mixtral_tensors(cfg):
    """(name, shape) in the state-dict order of transformers' MixtralForCausalLM: attention,
    block_sparse_moe.gate (router), experts.{e}.w1 (gate) / w2 (down) / w3 (up), norms."""
    h = cfg["hidden_size"]
    f = cfg["intermediate_size"]
    n = cfg["num_local_experts"]
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
            (p + "block_sparse_moe.gate.weight", (n, h)),
        ]
        for e in range(n):
            q = p + f"block_sparse_moe.experts.{e}."
            out += [(q + "w1.weight", (f, h)), (q + "w2.weight", (h, f)), (q + "w3.weight", (f, h))]
        out += [
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    out.append(("model.norm.weight", (h,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (cfg["vocab_size"], h)))
    return out


def qwen3_moe_tensors(cfg):
    """(name, shape) of Qwen3MoeForCausalLM (every layer MoE: mlp_only_layers [], sparse step
    1), in the order of the published Qwen3-235B-A22B checkpoint (router after the experts)."""
    h = cfg["hidden_size"]
    d = cfg["head_dim"]
    q_rows = cfg["num_attention_heads"] * d
    kv = cfg["num_key_value_heads"] * d
    f = cfg["moe_intermediate_size"]
    n = cfg["num_experts"]
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (q_rows, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q_rows)),
            (p + "self_attn.q_norm.weight", (d,)),
            (p + "self_attn.k_norm.weight", (d,)),
        ]
        for e in range(n):
            q = p + f"mlp.experts.{e}."
            out += [(q + "gate_proj.weight", (f, h)), (q + "up_proj.weight", (f, h)),
                    (q + "down_proj.weight", (h, f))]
        out += [
            (p + "mlp.gate.weight", (n, h)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    out.append(("model.norm.weight", (h,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (cfg["vocab_size"], h)))
    return out


def llama_tensors(cfg):
    """(name, shape) in the state-dict order of transformers' LlamaForCausalLM."""
    h = cfg["hidden_size"]
    ffn = cfg["intermediate_size"]
    head_dim = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q = cfg["num_attention_heads"] * head_dim
    kv = cfg["num_key_value_heads"] * head_dim
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
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
    entries = [(name, "BF16", shape, nbytes(shape)) for name, shape in sorted(tensors)]
    head, off = st_write.header_bytes(entries)
    return head, [(name, size) for name, _, _, size in entries], off


def config_json(cfg):
    fam = cfg.get("family", "llama")
    if fam == "mixtral":
        return mixtral_config_json(cfg)
    if fam == "qwen3_moe":
        return qwen3_moe_config_json(cfg)
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


def mixtral_config_json(cfg):
    """As mistralai/Mixtral-8x7B-v0.1's config.json, with this model's sizes."""
    return {
        "architectures": ["MixtralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": cfg["bos_token_id"],
        "eos_token_id": cfg["eos_token_id"],
        "hidden_act": "silu",
        "hidden_size": cfg["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": cfg["intermediate_size"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "model_type": "mixtral",
        "num_attention_heads": cfg["num_attention_heads"],
        "num_experts_per_tok": cfg["num_experts_per_tok"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "num_local_experts": cfg["num_local_experts"],
        "output_router_logits": False,
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": cfg["rope_theta"],
        "router_aux_loss_coef": 0.02,
        "sliding_window": None,
        "tie_word_embeddings": cfg["tie_word_embeddings"],
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.0",
        "use_cache": True,
        "vocab_size": cfg["vocab_size"],
    }


def qwen3_moe_config_json(cfg):
    """Qwen/Qwen3-235B-A22B's config.json (for its sizes)."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": cfg["bos_token_id"],
        "decoder_sparse_step": 1,
        "eos_token_id": cfg["eos_token_id"],
        "head_dim": cfg["head_dim"],
        "hidden_act": "silu",
        "hidden_size": cfg["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": cfg["intermediate_size"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "max_window_layers": cfg["num_hidden_layers"],
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": cfg["moe_intermediate_size"],
        "norm_topk_prob": True,
        "num_attention_heads": cfg["num_attention_heads"],
        "num_experts": cfg["num_experts"],
        "num_experts_per_tok": cfg["num_experts_per_tok"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "output_router_logits": False,
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": cfg["rope_theta"],
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": cfg["tie_word_embeddings"],
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
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
    tensors = tensors_of(cfg)
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
    ap.add_argument("--mixtral-1g", metavar="DIR",
                    help="write the ~1 GiB random Mixtral-shaped MoE checkpoint here")
    ap.add_argument("--sparse-qwen3-235b", metavar="DIR",
                    help="write the sparse Qwen3-235B-A22B-shaped checkpoint here")
    ap.add_argument("--max-shard-size", type=float, default=None,
                    help="decimal bytes per shard (default 300e6 for the small models, "
                         "5e9 for --sparse-70b, 4e9 for --sparse-qwen3-235b)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="replace DIR if it exists")
    args = ap.parse_args()
    # (destination, model, sparse, default max shard size) of each way to call this.
    choices = [(args.dir, SMALL, False, 300e6), (args.sparse_70b, LLAMA3_70B, True, 5e9),
               (args.mixtral_1g, MIXTRAL_1G, False, 300e6),
               (args.sparse_qwen3_235b, QWEN3_235B, True, 4e9)]
    given = [c for c in choices if c[0] is not None]
    if len(given) != 1:
        ap.error("give exactly one of DIR, --sparse-70b DIR, --mixtral-1g DIR, "
                 "--sparse-qwen3-235b DIR")
    dest, cfg, sparse, default_shard = given[0]
    dest = os.path.abspath(dest)
    max_shard = int(args.max_shard_size or default_shard)
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
