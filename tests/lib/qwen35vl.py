#!/usr/bin/python3
"""Qwen3.5's releases' VLM form (Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration),
tiny, built and saved by transformers 5 itself (run in the sid root), and the checks of ckptfs's views.

  qwen35vl.py build OUT
      OUT/dense: Qwen3_5ForConditionalGeneration (TEXT: 4 hybrid layers, every other one full
      attention, interleaved mrope over a quarter of each head; VISION: Qwen3-VL's tower without
      deepstack mergers) saved by save_pretrained in bf16; OUT/moe: the same tower with
      Qwen3_5MoeForConditionalGeneration's text model (4 experts and a gated shared one);
      OUT/deepstack: dense with Qwen3-VL's deepstack_visual_indexes in its vision_config (a field
      Qwen3_5VisionConfig does not have).
  qwen35vl.py logits ORIG HF_DIR...
      ORIG and each HF_DIR loaded by transformers 5 give the same logits (torch.equal) on an
      image + text input (which another image changes). Prints "PASS what" or "FAIL what: why".
"""
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vlm  # noqa: E402

# head_dim 32, a quarter rotated (8 dims): mrope's sections share out its 4 frequencies
TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, full_attention_interval=2, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
            max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                             "mrope_section": [2, 1, 1], "mrope_interleaved": True})
MOE = dict(TEXT, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
# vlm.py's image: 8x8 patches of 14 pixels, merged 2x2 into 16 tokens
VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=14,
              spatial_merge_size=2, temporal_patch_size=2, in_channels=3, num_position_embeddings=16)


def save(out, config_class, model_class, text):
    import transformers
    torch.manual_seed(0)
    cfg = getattr(transformers, config_class)(text_config=dict(text), vision_config=dict(VISION),
                                              tie_word_embeddings=False, **vlm.TOKENS)
    model = getattr(transformers, model_class)(cfg)
    with torch.no_grad():  # random norms and biases, so one served from the wrong tensor shows
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(1, 16)))
            elif p.dim() == 1:
                p.copy_(0.2 * torch.randn_like(p) + (1 if "visual" in name or "linear_attn.norm" in name else 0))
            else:
                p.normal_(0, 0.08)
    model.to(torch.bfloat16).save_pretrained(out)


def build(out):
    save(f"{out}/dense", "Qwen3_5Config", "Qwen3_5ForConditionalGeneration", TEXT)
    save(f"{out}/moe", "Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration", MOE)
    shutil.copytree(f"{out}/dense", f"{out}/deepstack")
    with open(f"{out}/dense/config.json") as f:
        config = json.load(f)
    config["vision_config"]["deepstack_visual_indexes"] = [0]
    with open(f"{out}/deepstack/config.json", "w") as f:
        json.dump(config, f, indent=2)


def inputs():
    """vlm.py's text around one image, with the image tokens' type its mrope's positions need."""
    ids, pixels, grid = vlm.inputs()
    return ids, pixels, grid, {"mm_token_type_ids": (ids == vlm.TOKENS["image_token_id"]).long()}


if __name__ == "__main__":
    {"build": lambda: build(sys.argv[2]),
     "logits": lambda: vlm.logits(sys.argv[2], sys.argv[3:], None, inputs)}[sys.argv[1]]()
