#!/usr/bin/python3
"""Writes a small Llama-style Hugging Face checkpoint (random bf16 weights, fixed seed) for the
demo: two safetensors shards with an index, config.json and tokenizer files.
Usage: make_demo_checkpoint.py DIR"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
import st_write  # noqa: E402  (the project's one safetensors writer)

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 8,
    "intermediate_size": 688, "vocab_size": 1000, "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16", "hidden_act": "silu",
}


def bf16_bits(a):
    """float32 -> bfloat16 bit patterns (round to nearest even), as uint16."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def tensors(cfg, rng):
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * d
    out = {"model.embed_tokens.weight": (v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": (h,), p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, h), p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
        })
    out["model.norm.weight"] = (h,)
    out["lm_head.weight"] = (v, h)
    return {name: bf16_bits(rng.standard_normal(shape) * 0.05 + (1.0 if len(shape) == 1 else 0.0))
            for name, shape in out.items()}


def write_safetensors(path, named):
    st_write.write(path, {name: ("BF16", a) for name, a in named.items()})


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    named = tensors(CONFIG, np.random.default_rng(0))
    names = list(named)
    half = len(names) // 2
    shards = [names[:half], names[half:]]
    weight_map = {}
    for k, group in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(out, fname), {n: named[n] for n in group})
        weight_map.update({n: fname for n in group})
    total = sum(a.nbytes for a in named.values())
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                           indent=2, sort_keys=True) + "\n")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": 2048, "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    print(f"wrote {out}: {len(named)} tensors, {total} bytes")


if __name__ == "__main__":
    main()
