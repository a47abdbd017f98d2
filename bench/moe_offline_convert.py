#!/usr/bin/python3
"""The baseline ckptfs's mixture-of-experts (MoE) views are measured against: an offline
HF -> Megatron-core legacy conversion of an MoE model the way today's converters work (Megatron's
tools/checkpoint loader_mixtral_hf / saver_mcore, or the per-model scripts in the wild). It loads
every Hugging Face tensor into memory with torch, builds each rank's state dict and writes it
with torch.save, one rank file after the other:

  dense part (TP rank t of T): as bench/offline_convert.py (QKV interleaved per query group,
      linear_proj columns, embedding / output layer rows of the vocabulary padded to a multiple
      of 128 T, norms whole), plus q/k_layernorm (Qwen3-MoE) and the QKV bias (Qwen2-MoE)
  MoE layer: pre_mlp_layernorm (the HF post_attention_layernorm), mlp.router.weight whole, the
      experts of EP rank e (global experts [e N/E, (e+1) N/E)) as SequentialMLP
      local_experts.{j} with expert TP = TP: linear_fc1 = [gate share t; up share t],
      linear_fc2 = columns share t of down; Qwen2-MoE's shared expert (TP-split as a dense MLP)
      and its gate_weight
  files: release/mp_rank_{t:02d}[_{p:03d}][_{e:03d}]/model_optim_rng.pt (pipeline part when
      P > 1, expert part when E > 1), {"checkpoint_version": 3.0, "iteration": 0, "model": sd}
      (no args), TE layer names (the view's default spec), _extra_state entries None

Families: mixtral, qwen2_moe, qwen3_moe (config.json model_type). Even pipeline stages only.

Usage: moe_offline_convert.py HF_DIR OUT_DIR --tp T --pp P --ep E
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from offline_convert import load_hf  # noqa: E402  (every tensor of every shard, into RAM)


def is_moe_layer(cfg, i):
    if cfg["model_type"] == "mixtral":
        return True
    step = cfg.get("decoder_sparse_step", 1) or 1
    return (i not in cfg.get("mlp_only_layers", []) and cfg.get("num_experts", 0) > 0
            and (i + 1) % step == 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf")
    ap.add_argument("out")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    args = ap.parse_args()
    cfg = json.load(open(os.path.join(args.hf, "config.json")))
    fam = cfg["model_type"]
    if fam not in ("mixtral", "qwen2_moe", "qwen3_moe"):
        sys.exit(f"moe_offline_convert: model_type {fam} is not an MoE family this script knows")
    w = load_hf(args.hf)
    T, P, E = args.tp, args.pp, args.ep
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    ng = cfg.get("num_key_value_heads", nh)
    d = cfg.get("head_dim") or H // nh
    vocab = cfg["vocab_size"]
    mix = fam == "mixtral"
    N = cfg["num_local_experts"] if mix else cfg["num_experts"]
    assert L % P == 0 and N % E == 0 and nh % T == 0 and ng % T == 0, "layout does not fit"
    local = N // E
    bias = fam == "qwen2_moe"
    qk_norm = fam == "qwen3_moe"
    shared = fam == "qwen2_moe" and cfg.get("shared_expert_intermediate_size")
    router = "block_sparse_moe.gate.weight" if mix else "mlp.gate.weight"
    mult = 128 * T
    padded = (vocab + mult - 1) // mult * mult

    def pad_vocab(t):
        return torch.cat([t, torch.zeros(padded - vocab, t.shape[1], dtype=t.dtype)])

    def qkv(pre, suffix):
        tail = (H,) if suffix == "weight" else ()
        q = w[pre + f"self_attn.q_proj.{suffix}"].view(ng, nh // ng * d, *tail)
        k = w[pre + f"self_attn.k_proj.{suffix}"].view(ng, d, *tail)
        v = w[pre + f"self_attn.v_proj.{suffix}"].view(ng, d, *tail)
        return torch.cat([q, k, v], dim=1).reshape(-1, *tail)

    def expert(pre, n):
        """(gate, up, down) of global expert n."""
        if mix:
            q = pre + f"block_sparse_moe.experts.{n}."
            return w[q + "w1.weight"], w[q + "w3.weight"], w[q + "w2.weight"]
        q = pre + f"mlp.experts.{n}."
        return w[q + "gate_proj.weight"], w[q + "up_proj.weight"], w[q + "down_proj.weight"]

    def swiglu(sd, m, gate, up, down, t):
        sd[m + "linear_fc1.weight"] = torch.cat([gate.chunk(T)[t], up.chunk(T)[t]])
        sd[m + "linear_fc1._extra_state"] = None
        sd[m + "linear_fc2.weight"] = down.chunk(T, dim=1)[t].clone()
        sd[m + "linear_fc2._extra_state"] = None

    emb = pad_vocab(w["model.embed_tokens.weight"])
    head = pad_vocab(w.get("lm_head.weight", w["model.embed_tokens.weight"]))
    per_stage = L // P
    os.makedirs(args.out)
    with open(os.path.join(args.out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("release")
    for p in range(P):
        for t in range(T):
            for e in range(E):
                sd = {}
                if p == 0:
                    sd["embedding.word_embeddings.weight"] = emb.chunk(T)[t].clone()
                for li in range(per_stage):
                    g = p * per_stage + li
                    pre = f"model.layers.{g}."
                    m = f"decoder.layers.{li}."
                    sd[m + "self_attention.core_attention._extra_state"] = None
                    sd[m + "self_attention.linear_proj.weight"] = \
                        w[pre + "self_attn.o_proj.weight"].chunk(T, dim=1)[t].clone()
                    sd[m + "self_attention.linear_proj._extra_state"] = None
                    sd[m + "self_attention.linear_qkv.layer_norm_weight"] = w[pre + "input_layernorm.weight"]
                    sd[m + "self_attention.linear_qkv.weight"] = qkv(pre, "weight").chunk(T)[t].clone()
                    if bias:
                        sd[m + "self_attention.linear_qkv.bias"] = qkv(pre, "bias").chunk(T)[t].clone()
                    sd[m + "self_attention.linear_qkv._extra_state"] = None
                    if qk_norm:
                        sd[m + "self_attention.q_layernorm.weight"] = w[pre + "self_attn.q_norm.weight"]
                        sd[m + "self_attention.q_layernorm._extra_state"] = None
                        sd[m + "self_attention.k_layernorm.weight"] = w[pre + "self_attn.k_norm.weight"]
                        sd[m + "self_attention.k_layernorm._extra_state"] = None
                    if not is_moe_layer(cfg, g):  # a dense layer among the MoE layers
                        sd[m + "mlp.linear_fc1.layer_norm_weight"] = w[pre + "post_attention_layernorm.weight"]
                        swiglu(sd, m + "mlp.", w[pre + "mlp.gate_proj.weight"], w[pre + "mlp.up_proj.weight"],
                               w[pre + "mlp.down_proj.weight"], t)
                        continue
                    sd[m + "pre_mlp_layernorm.weight"] = w[pre + "post_attention_layernorm.weight"]
                    sd[m + "pre_mlp_layernorm._extra_state"] = None
                    sd[m + "mlp.router.weight"] = w[pre + router]
                    for j in range(local):
                        swiglu(sd, m + f"mlp.experts.local_experts.{j}.", *expert(pre, e * local + j), t)
                    if shared:
                        q = pre + "mlp.shared_expert."
                        if pre + "mlp.shared_expert_gate.weight" in w:
                            sd[m + "mlp.shared_experts.gate_weight"] = w[pre + "mlp.shared_expert_gate.weight"]
                        swiglu(sd, m + "mlp.shared_experts.", w[q + "gate_proj.weight"], w[q + "up_proj.weight"],
                               w[q + "down_proj.weight"], t)
                if p == P - 1:
                    sd["decoder.final_layernorm.weight"] = w["model.norm.weight"]
                    sd["decoder.final_layernorm._extra_state"] = None
                    sd["output_layer.weight"] = head.chunk(T)[t].clone()
                    sd["output_layer._extra_state"] = None
                name = f"mp_rank_{t:02d}" + (f"_{p:03d}" if P > 1 else "") + (f"_{e:03d}" if E > 1 else "")
                os.makedirs(os.path.join(args.out, "release", name))
                torch.save({"checkpoint_version": 3.0, "iteration": 0, "model": sd},
                           os.path.join(args.out, "release", name, "model_optim_rng.pt"))


if __name__ == "__main__":
    main()
