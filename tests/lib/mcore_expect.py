#!/usr/bin/python3
"""What a torch_dist checkpoint of a Hugging Face model holds, from the HF files with numpy only
(DESIGN section 4, written independently of ckptfs): Megatron GPTModel's stacked keys, q/k/v
interleaved per query group, fc1 = [gate; up], the vocabulary padded with zero rows. Phi-3's
fused projections are split first (models.unfuse). Used by
dcp_check.py (torch 2.x) and dcp_host.py (torch 1.13)."""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import as_array, read_checkpoint, unfuse  # noqa: E402

LP = "decoder.layers."


class HFModel:
    def __init__(self, d):
        self.cfg = c = json.load(open(os.path.join(d, "config.json")))
        # Phi-3's fused qkv_proj / gate_up_proj cut into q/k/v and gate/up (models.unfuse):
        # the stacked keys below are defined over the separate tensors.
        self.raw = unfuse(c, read_checkpoint(d))[0]
        self.L, self.H = c["num_hidden_layers"], c["hidden_size"]
        self.nh = c["num_attention_heads"]
        self.ng = c.get("num_key_value_heads", self.nh)
        self.d = c.get("head_dim", self.H // self.nh)
        self.F, self.vocab = c["intermediate_size"], c["vocab_size"]
        self.tied = c.get("tie_word_embeddings", False)

    def has(self, name):
        return name in self.raw

    def get(self, name):
        """Raw values (bf16 as uint16 bits) and the safetensors dtype name."""
        return as_array(self.raw[name]), self.raw[name][0]


def qkv_interleave(m, q, k, v):
    """[q; k; v] (leading dim = rows) -> per group: q rows of its heads, k rows, v rows."""
    g, rest = m.ng, q.shape[1:]
    parts = [q.reshape(g, -1, *rest), k.reshape(g, -1, *rest), v.reshape(g, -1, *rest)]
    return np.concatenate(parts, axis=1).reshape(-1, *rest)


def expected_tensors(m, vpad):
    """Megatron key -> (numpy raw values, safetensors dtype), the vocabulary padded to vpad rows."""
    out = {}

    def vocab_rows(name):
        a, dt = m.get(name)
        pad = np.zeros((vpad - a.shape[0],) + a.shape[1:], a.dtype)
        return np.concatenate([a, pad]), dt

    out["embedding.word_embeddings.weight"] = vocab_rows("model.embed_tokens.weight")
    if not m.tied:
        out["output_layer.weight"] = vocab_rows("lm_head.weight")
    out["decoder.final_layernorm.weight"] = m.get("model.norm.weight")

    def layer(i, name):
        return m.get(f"model.layers.{i}.{name}")[0]

    per_layer = {
        "self_attention.linear_qkv.layer_norm_weight": lambda i: layer(i, "input_layernorm.weight"),
        "self_attention.linear_qkv.weight": lambda i: qkv_interleave(
            m, *(layer(i, f"self_attn.{p}_proj.weight") for p in "qkv")),
        "self_attention.linear_proj.weight": lambda i: layer(i, "self_attn.o_proj.weight"),
        "mlp.linear_fc1.layer_norm_weight": lambda i: layer(i, "post_attention_layernorm.weight"),
        "mlp.linear_fc1.weight": lambda i: np.concatenate(
            [layer(i, "mlp.gate_proj.weight"), layer(i, "mlp.up_proj.weight")]),
        "mlp.linear_fc2.weight": lambda i: layer(i, "mlp.down_proj.weight"),
    }
    if m.has("model.layers.0.self_attn.q_proj.bias"):
        per_layer["self_attention.linear_qkv.bias"] = lambda i: qkv_interleave(
            m, *(layer(i, f"self_attn.{p}_proj.bias") for p in "qkv"))
    if m.has("model.layers.0.self_attn.q_norm.weight"):
        per_layer["self_attention.q_layernorm.weight"] = lambda i: layer(i, "self_attn.q_norm.weight")
        per_layer["self_attention.k_layernorm.weight"] = lambda i: layer(i, "self_attn.k_norm.weight")
    dt = m.get("model.layers.0.input_layernorm.weight")[1]
    for name, fn in per_layer.items():
        out[LP + name] = (np.stack([fn(i) for i in range(m.L)]), dt)
    return out
