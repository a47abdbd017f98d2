#!/usr/bin/python3
"""Generate a sparse Qwen2.5-VL-72B-shaped Hugging Face checkpoint for the ckptfs benchmarks:
every tensor with the release's names (model.*, visual.*, lm_head) and bf16 shapes, real
safetensors headers, data areas that are holes (each shard's header written, then the file
truncated to its full size): ~147 GB of apparent size in a few hundred KB of disk. config.json has
the release's spelling (the language model's fields at the top level, vision_config, mrope).

  gen_vlm_sparse.py OUT

Run with Debian's /usr/bin/python3 (standard library only); OUT must not exist. Shards are filled
greedily up to 4 GB in model order. Prints the tensor and shard counts and the apparent size.
"""
import json
import os
import struct
import sys

out = sys.argv[1]
os.makedirs(out)
# Qwen2.5-VL-72B: the language model, then the vision tower and merger
H, F, L, NH, KV, V = 8192, 29568, 80, 64, 8, 152064
VH, VF, VD, VNH, VOUT = 1280, 3456, 32, 16, 8192
hd = H // NH
t = [("model.embed_tokens.weight", [V, H])]
for l in range(L):
    p = f"model.layers.{l}."
    t += [(p + "self_attn.q_proj.weight", [H, H]), (p + "self_attn.q_proj.bias", [H]),
          (p + "self_attn.k_proj.weight", [KV * hd, H]), (p + "self_attn.k_proj.bias", [KV * hd]),
          (p + "self_attn.v_proj.weight", [KV * hd, H]), (p + "self_attn.v_proj.bias", [KV * hd]),
          (p + "self_attn.o_proj.weight", [H, H]), (p + "mlp.gate_proj.weight", [F, H]),
          (p + "mlp.up_proj.weight", [F, H]), (p + "mlp.down_proj.weight", [H, F]),
          (p + "input_layernorm.weight", [H]), (p + "post_attention_layernorm.weight", [H])]
t += [("model.norm.weight", [H]), ("lm_head.weight", [V, H]), ("visual.patch_embed.proj.weight", [VH, 3, 2, 14, 14])]
for b in range(VD):
    p = f"visual.blocks.{b}."
    t += [(p + "norm1.weight", [VH]), (p + "norm2.weight", [VH]), (p + "attn.qkv.weight", [3 * VH, VH]),
          (p + "attn.qkv.bias", [3 * VH]), (p + "attn.proj.weight", [VH, VH]), (p + "attn.proj.bias", [VH]),
          (p + "mlp.gate_proj.weight", [VF, VH]), (p + "mlp.gate_proj.bias", [VF]),
          (p + "mlp.up_proj.weight", [VF, VH]), (p + "mlp.up_proj.bias", [VF]),
          (p + "mlp.down_proj.weight", [VH, VF]), (p + "mlp.down_proj.bias", [VH])]
t += [("visual.merger.ln_q.weight", [VH]), ("visual.merger.mlp.0.weight", [4 * VH, 4 * VH]),
      ("visual.merger.mlp.0.bias", [4 * VH]), ("visual.merger.mlp.2.weight", [VOUT, 4 * VH]),
      ("visual.merger.mlp.2.bias", [VOUT])]
def size(s):
    n = 2
    for d in s: n *= d
    return n
limit = 4 * 10**9
shards, cur, cs = [], [], 0
for name, shape in t:
    if cur and cs + size(shape) > limit:
        shards.append(cur); cur, cs = [], 0
    cur.append((name, shape)); cs += size(shape)
shards.append(cur)
wm, total = {}, 0
for i, sh in enumerate(shards):
    fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in sh:
        hdr[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + size(shape)]}
        off += size(shape); wm[name] = fn
    h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
    with open(f"{out}/{fn}", "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h); f.truncate(8 + len(h) + off)
    total += off
json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, open(f"{out}/model.safetensors.index.json", "w"))
cfg = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "attention_dropout": 0.0,
       "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
       "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu",
       "hidden_size": H, "initializer_range": 0.02, "intermediate_size": F, "max_position_embeddings": 128000,
       "max_window_layers": 80, "num_attention_heads": NH, "num_hidden_layers": L, "num_key_value_heads": KV,
       "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False,
       "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "use_cache": True, "use_sliding_window": False,
       "vision_config": {"depth": VD, "hidden_act": "silu", "hidden_size": VH, "intermediate_size": VF, "num_heads": VNH,
                         "in_chans": 3, "out_hidden_size": VOUT, "patch_size": 14, "spatial_merge_size": 2,
                         "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
                         "tokens_per_second": 2, "temporal_patch_size": 2},
       "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": V}
json.dump(cfg, open(f"{out}/config.json", "w"), indent=2)
print(len(t), "tensors", len(shards), "shards", total, "bytes")
