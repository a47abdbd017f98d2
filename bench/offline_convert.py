#!/usr/bin/python3
"""The baseline ckptfs is measured against: an offline HF -> Megatron-core conversion the way
today's converters work. It loads every Hugging Face tensor into memory, builds each rank's
state dict (QKV interleave, fc1 [gate; up], TP splits, vocab padding, pipeline stages) and writes
it with torch.save, as Megatron's tools/checkpoint saver does.

Usage: offline_convert.py HF_DIR OUT_DIR --tp T --pp P
"""
import argparse
import json
import os
import struct

import numpy as np
import torch

NP_OF = {"BF16": np.int16, "F16": np.float16, "F32": np.float32}
TORCH_OF = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def load_hf(d):
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    out = {}
    for name in files:
        with open(os.path.join(d, name), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            data = f.read()
        for k, m in header.items():
            if k == "__metadata__":
                continue
            b, e = m["data_offsets"]
            a = np.frombuffer(data[b:e], dtype=NP_OF[m["dtype"]]).reshape(m["shape"]).copy()
            out[k] = torch.from_numpy(a).view(TORCH_OF[m["dtype"]])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf")
    ap.add_argument("out")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    args = ap.parse_args()
    cfg = json.load(open(os.path.join(args.hf, "config.json")))
    w = load_hf(args.hf)
    T, P = args.tp, args.pp
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    ng = cfg.get("num_key_value_heads", nh)
    d = cfg.get("head_dim", H // nh)
    vocab = cfg["vocab_size"]
    mult = 128 * T
    padded = (vocab + mult - 1) // mult * mult

    def pad_vocab(t):
        return torch.cat([t, torch.zeros(padded - vocab, t.shape[1], dtype=t.dtype)])

    emb = pad_vocab(w["model.embed_tokens.weight"])
    head = pad_vocab(w.get("lm_head.weight", w["model.embed_tokens.weight"]))
    per_stage = L // P
    os.makedirs(args.out)
    with open(os.path.join(args.out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("release")
    for p in range(P):
        for r in range(T):
            sd = {}
            if p == 0:
                sd["embedding.word_embeddings.weight"] = emb.chunk(T)[r].clone()
            for li in range(per_stage):
                g = p * per_stage + li
                pre = f"model.layers.{g}."
                q = w[pre + "self_attn.q_proj.weight"].view(ng, nh // ng * d, H)
                k = w[pre + "self_attn.k_proj.weight"].view(ng, d, H)
                v = w[pre + "self_attn.v_proj.weight"].view(ng, d, H)
                qkv = torch.cat([q, k, v], dim=1).reshape(-1, H)
                fc1 = torch.cat([w[pre + "mlp.gate_proj.weight"].chunk(T)[r],
                                 w[pre + "mlp.up_proj.weight"].chunk(T)[r]])
                m = f"decoder.layers.{li}."
                sd[m + "self_attention.core_attention._extra_state"] = None
                sd[m + "self_attention.linear_proj.weight"] = \
                    w[pre + "self_attn.o_proj.weight"].chunk(T, dim=1)[r].clone()
                sd[m + "self_attention.linear_proj._extra_state"] = None
                sd[m + "self_attention.linear_qkv.layer_norm_weight"] = w[pre + "input_layernorm.weight"]
                sd[m + "self_attention.linear_qkv.weight"] = qkv.chunk(T)[r].clone()
                sd[m + "self_attention.linear_qkv._extra_state"] = None
                sd[m + "mlp.linear_fc1.layer_norm_weight"] = w[pre + "post_attention_layernorm.weight"]
                sd[m + "mlp.linear_fc1.weight"] = fc1
                sd[m + "mlp.linear_fc1._extra_state"] = None
                sd[m + "mlp.linear_fc2.weight"] = \
                    w[pre + "mlp.down_proj.weight"].chunk(T, dim=1)[r].clone()
                sd[m + "mlp.linear_fc2._extra_state"] = None
            if p == P - 1:
                sd["decoder.final_layernorm.weight"] = w["model.norm.weight"]
                sd["decoder.final_layernorm._extra_state"] = None
                sd["output_layer.weight"] = head.chunk(T)[r].clone()
                sd["output_layer._extra_state"] = None
            name = f"mp_rank_{r:02d}" if P == 1 else f"mp_rank_{r:02d}_{p:03d}"
            os.makedirs(os.path.join(args.out, "release", name))
            torch.save({"checkpoint_version": 3.0, "iteration": 0, "model": sd},
                       os.path.join(args.out, "release", name, "model_optim_rng.pt"))


if __name__ == "__main__":
    main()
