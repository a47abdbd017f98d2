#!/usr/bin/python3
"""Generate a Qwen2.5-VL-shaped Hugging Face checkpoint for the ckptfs benchmarks: every tensor
with the release's names (model.*, visual.*, lm_head) and bf16 shapes, real safetensors headers.
config.json has the release's spelling (the language model's fields at the top level,
vision_config, mrope).

  gen_vlm_sparse.py OUT            Qwen2.5-VL-72B's shapes; the data areas are holes (each shard's
                                   header written, then the file truncated to its full size):
                                   ~147 GB of apparent size in a few hundred KB of disk
  gen_vlm_sparse.py --qwen3-vl-235b OUT
                                   Qwen3-VL-235B-A22B's shapes and config.json (94 layers of 128
                                   experts fused on disk, a 27-block tower with 3 deepstack
                                   mergers), data areas as holes: ~471 GB apparent size
  gen_vlm_sparse.py --3b OUT       Qwen2.5-VL-3B's shapes (tied embeddings: no lm_head), ~7.5 GB
                                   of data written: random bf16 values of a normal distribution
                                   (one 64 MiB block, each tensor starting at another place in it)

Run with Debian's /usr/bin/python3 (standard library only for the sparse form; numpy for --3b);
OUT must not exist. Shards are filled greedily up to 4 GB in model order. Prints the tensor and
shard counts and the size.
"""
import json
import os
import struct
import sys



def qwen2_5_vl(small):
    """Qwen2.5-VL-72B's (or -3B's) tensors under the release's names, and its config.json."""
    if small:  # Qwen2.5-VL-3B (its config.json): the language model, then the vision tower and merger
        H, F, L, NH, KV, V, TIED = 2048, 11008, 36, 16, 2, 151936, True
        VH, VF, VD, VNH, VOUT = 1280, 3420, 32, 16, 2048
    else:  # Qwen2.5-VL-72B
        H, F, L, NH, KV, V, TIED = 8192, 29568, 80, 64, 8, 152064, False
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
    t += [("model.norm.weight", [H])] + ([] if TIED else [("lm_head.weight", [V, H])])
    t += [("visual.patch_embed.proj.weight", [VH, 3, 2, 14, 14])]
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
    cfg = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "attention_dropout": 0.0,
           "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
           "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu",
           "hidden_size": H, "initializer_range": 0.02, "intermediate_size": F, "max_position_embeddings": 128000,
           "max_window_layers": L, "num_attention_heads": NH, "num_hidden_layers": L, "num_key_value_heads": KV,
           "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": TIED,
           "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "use_cache": True, "use_sliding_window": False,
           "vision_config": {"depth": VD, "hidden_act": "silu", "hidden_size": VH, "intermediate_size": VF, "num_heads": VNH,
                             "in_chans": 3, "out_hidden_size": VOUT, "patch_size": 14, "spatial_merge_size": 2,
                             "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
                             "tokens_per_second": 2, "temporal_patch_size": 2},
           "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": V}
    return t, cfg


def qwen3_vl_moe_235b():
    """Qwen3-VL-235B-A22B's tensors under the release's names (model.language_model.*,
    model.visual.*; the experts fused on disk as [E, H, 2F] and [E, F, H]), and its config.json."""
    H, L, NH, KV, D, V, E, MF = 4096, 94, 64, 4, 128, 151936, 128, 1536
    VH, VF, VD, VNH, VOUT, VP, DEEP = 1152, 4304, 27, 16, 4096, 16, [8, 16, 24]
    lm = "model.language_model."
    t = [(lm + "embed_tokens.weight", [V, H])]
    for l in range(L):
        p = f"{lm}layers.{l}."
        t += [(p + "self_attn.q_proj.weight", [NH * D, H]), (p + "self_attn.k_proj.weight", [KV * D, H]),
              (p + "self_attn.v_proj.weight", [KV * D, H]), (p + "self_attn.o_proj.weight", [H, NH * D]),
              (p + "self_attn.q_norm.weight", [D]), (p + "self_attn.k_norm.weight", [D]),
              (p + "mlp.gate.weight", [E, H]), (p + "mlp.experts.gate_up_proj", [E, H, 2 * MF]),
              (p + "mlp.experts.down_proj", [E, MF, H]),
              (p + "input_layernorm.weight", [H]), (p + "post_attention_layernorm.weight", [H])]
    t += [(lm + "norm.weight", [H]), ("lm_head.weight", [V, H])]
    vp = "model.visual."
    t += [(vp + "patch_embed.proj.weight", [VH, 3, 2, VP, VP]), (vp + "patch_embed.proj.bias", [VH]),
          (vp + "pos_embed.weight", [2304, VH])]
    for b in range(VD):
        p = f"{vp}blocks.{b}."
        t += [(p + "norm1.weight", [VH]), (p + "norm1.bias", [VH]), (p + "norm2.weight", [VH]),
              (p + "norm2.bias", [VH]), (p + "attn.qkv.weight", [3 * VH, VH]), (p + "attn.qkv.bias", [3 * VH]),
              (p + "attn.proj.weight", [VH, VH]), (p + "attn.proj.bias", [VH]),
              (p + "mlp.linear_fc1.weight", [VF, VH]), (p + "mlp.linear_fc1.bias", [VF]),
              (p + "mlp.linear_fc2.weight", [VH, VF]), (p + "mlp.linear_fc2.bias", [VH])]
    merged = 4 * VH
    for p, norm in [(vp + "merger.", VH)] + [(f"{vp}deepstack_merger_list.{i}.", merged) for i in range(len(DEEP))]:
        t += [(p + "norm.weight", [norm]), (p + "norm.bias", [norm]),
              (p + "linear_fc1.weight", [merged, merged]), (p + "linear_fc1.bias", [merged]),
              (p + "linear_fc2.weight", [VOUT, merged]), (p + "linear_fc2.bias", [VOUT])]
    cfg = {"architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe",
           "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
           "vision_end_token_id": 151653, "tie_word_embeddings": False, "transformers_version": "4.57.0.dev0",
           "text_config": {"attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
                           "decoder_sparse_step": 1, "dtype": "bfloat16", "eos_token_id": 151645, "head_dim": D,
                           "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02,
                           "intermediate_size": 12288, "max_position_embeddings": 262144, "mlp_only_layers": [],
                           "model_type": "qwen3_vl_moe_text", "moe_intermediate_size": MF,
                           "norm_topk_prob": True, "num_attention_heads": NH, "num_experts": E,
                           "num_experts_per_tok": 8, "num_hidden_layers": L, "num_key_value_heads": KV,
                           "rms_norm_eps": 1e-06,
                           "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                                            "rope_type": "default"},
                           "rope_theta": 5000000, "use_cache": True, "vocab_size": V},
           "vision_config": {"deepstack_visual_indexes": DEEP, "depth": VD, "hidden_act": "gelu_pytorch_tanh",
                             "hidden_size": VH, "in_channels": 3, "initializer_range": 0.02,
                             "intermediate_size": VF, "model_type": "qwen3_vl_moe", "num_heads": VNH,
                             "num_position_embeddings": 2304, "out_hidden_size": VOUT, "patch_size": VP,
                             "spatial_merge_size": 2, "temporal_patch_size": 2}}
    return t, cfg


small = sys.argv[1] == "--3b"
out = sys.argv[-1]
t, cfg = qwen3_vl_moe_235b() if sys.argv[1] == "--qwen3-vl-235b" else qwen2_5_vl(small)
os.makedirs(out)
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
if small:
    import numpy as np
    # bf16 = the high half of fp32 (truncated): the values of a normal distribution, scaled as weights
    block = (np.random.default_rng(0).standard_normal(32 << 20, dtype=np.float32) * 0.02)
    block = (block.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    cursor = 0


def write_data(f, n):
    """n bytes of the block, from where the last tensor stopped (wrapping around)."""
    global cursor
    while n:
        step = min(n, len(block) - cursor)
        f.write(block[cursor:cursor + step])
        cursor, n = (cursor + step) % len(block), n - step


wm, total = {}, 0
for i, sh in enumerate(shards):
    fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in sh:
        hdr[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + size(shape)]}
        off += size(shape); wm[name] = fn
    h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
    with open(f"{out}/{fn}", "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h)
        if small:
            write_data(f, off)
        else:
            f.truncate(8 + len(h) + off)
    total += off
json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, open(f"{out}/model.safetensors.index.json", "w"))
json.dump(cfg, open(f"{out}/config.json", "w"), indent=2)
print(len(t), "tensors", len(shards), "shards", total, "bytes")
