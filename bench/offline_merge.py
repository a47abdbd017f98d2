#!/usr/bin/python3
"""The baseline for Megatron -> HF: an offline merger the way today's scripts work. It loads
every rank file with torch.load, merges the TP shards (QKV de-interleave per group, fc1 into gate
and up, row-parallel concatenation), walks the pipeline stages, cuts the vocabulary padding and
writes safetensors shards (with numpy; Debian 12 has no safetensors package).

Usage: offline_merge.py MEGATRON_ITER_DIR OUT_DIR
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
import st_write  # noqa: E402  (the project's one safetensors writer)


def save(path, tensors):
    st_write.write(path, {name: ("BF16", t.contiguous().view(torch.int16).numpy()) for name, t in tensors.items()})


def main():
    src, out = sys.argv[1:3]
    ranks = sorted(d for d in os.listdir(src) if d.startswith("mp_rank_"))
    T = len({r[8:10] for r in ranks})
    P = len(ranks) // T
    files = {}
    for r in ranks:
        t, p = int(r[8:10]), int(r[11:14]) if len(r) > 10 else 0
        files[(t, p)] = torch.load(os.path.join(src, r, "model_optim_rng.pt"), map_location="cpu")
    args = files[(0, 0)]["args"]
    nh, ng, d, H = args.num_attention_heads, args.num_query_groups, args.kv_channels, args.hidden_size
    hpg, vocab = nh // ng, args.vocab_size
    hf, layer0 = {}, 0
    for p in range(P):
        sds = [files[(t, p)]["model"] for t in range(T)]
        if p == 0:
            hf["model.embed_tokens.weight"] = torch.cat([s["embedding.word_embeddings.weight"] for s in sds])[:vocab]
        n = len({k.split(".")[2] for k in sds[0] if k.startswith("decoder.layers.")})
        for i in range(n):
            m, g = f"decoder.layers.{i}.", f"model.layers.{layer0 + i}."
            qkv = torch.cat([s[m + "self_attention.linear_qkv.weight"] for s in sds]).view(ng, hpg + 2, d, H)
            hf[g + "self_attn.q_proj.weight"] = qkv[:, :hpg].reshape(-1, H).clone()
            hf[g + "self_attn.k_proj.weight"] = qkv[:, hpg].reshape(-1, H).clone()
            hf[g + "self_attn.v_proj.weight"] = qkv[:, hpg + 1].reshape(-1, H).clone()
            hf[g + "self_attn.o_proj.weight"] = torch.cat([s[m + "self_attention.linear_proj.weight"] for s in sds], 1)
            fc1 = [s[m + "mlp.linear_fc1.weight"].chunk(2) for s in sds]
            hf[g + "mlp.gate_proj.weight"] = torch.cat([f[0] for f in fc1])
            hf[g + "mlp.up_proj.weight"] = torch.cat([f[1] for f in fc1])
            hf[g + "mlp.down_proj.weight"] = torch.cat([s[m + "mlp.linear_fc2.weight"] for s in sds], 1)
            hf[g + "input_layernorm.weight"] = sds[0][m + "self_attention.linear_qkv.layer_norm_weight"]
            hf[g + "post_attention_layernorm.weight"] = sds[0][m + "mlp.linear_fc1.layer_norm_weight"]
        layer0 += n
        if p == P - 1:
            hf["model.norm.weight"] = sds[0]["decoder.final_layernorm.weight"]
            if "output_layer.weight" in sds[0]:
                hf["lm_head.weight"] = torch.cat([s["output_layer.weight"] for s in sds])[:vocab]
    os.makedirs(out)
    names, shards, cur, size = list(hf), [], [], 0
    for nm in names:
        nbytes = hf[nm].numel() * 2
        if cur and size + nbytes > 5_000_000_000:
            shards.append(cur)
            cur, size = [], 0
        cur.append(nm)
        size += nbytes
    shards.append(cur)
    for k, group in enumerate(shards):
        save(os.path.join(out, f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"), {n: hf[n] for n in group})


if __name__ == "__main__":
    main()
