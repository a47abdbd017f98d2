#!/usr/bin/python3
"""A tiny Qwen2.5-VL built and saved by transformers 5 itself (run in the sid root), and the checks
of ckptfs's views of it.

  vlm.py build OUT
      OUT/v5: Qwen2_5_VLForConditionalGeneration with tiny text and vision configs, saved by
      save_pretrained in bf16 (config.json with nested text_config and vision_config; tensors
      under the release's names, model.* / visual.* / lm_head.*); OUT/modules: the same with
      the tensors under transformers >= 4.52's module names (model.language_model.*,
      model.visual.*); OUT/v4: v5's tensors with the release's config.json (the language
      model's fields at the top level); OUT/badvision: v5 with a vision field no rule reads.
  vlm.py logits ORIG HF_DIR...
      ORIG and each HF_DIR loaded by transformers 5 give the same logits (torch.equal) on an
      image + text input (which another image changes). Prints "PASS what" or "FAIL what: why".
"""
import json
import os
import shutil
import sys

import torch

TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            rms_norm_eps=1e-6, tie_word_embeddings=False,
            rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
# Two blocks, the second with full attention (fullatt_block_indexes), windows of 2x2 merged
# patches (window_size 56 = 2 merge units of 2 patches of 14 pixels).
VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
              patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
              fullatt_block_indexes=[1], in_chans=3)
TOKENS = dict(image_token_id=250, video_token_id=251, vision_start_token_id=252,
              vision_end_token_id=253)
# The image: 8x8 patches of 14 pixels (a 112x112 picture), one frame pair
GRID = (1, 8, 8)


def save_st(tensors, path):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})


def module_name(name):
    """The release's name (what save_pretrained writes, and transformers < 4.52 loads) -> the
    module name transformers >= 4.52 holds it under (what Qwen3-VL's releases are saved with)."""
    if name.startswith("model."):
        return "model.language_model." + name[len("model."):]
    if name.startswith("visual."):
        return "model." + name
    return name


def build(out):
    from safetensors.torch import load_file
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    torch.manual_seed(0)
    cfg = Qwen2_5_VLConfig(text_config=dict(TEXT), vision_config=dict(VISION), **TOKENS)
    model = Qwen2_5_VLForConditionalGeneration(cfg).to(torch.bfloat16)
    # Random norms so a norm served from the wrong tensor shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model.save_pretrained(f"{out}/v5")
    tensors = load_file(f"{out}/v5/model.safetensors")
    if not any(k.startswith("visual.") for k in tensors):
        sys.exit("save_pretrained did not write the release's names (visual.*)")
    # The module names of transformers >= 4.52.
    os.makedirs(f"{out}/modules")
    save_st({module_name(k): v for k, v in tensors.items()}, f"{out}/modules/model.safetensors")
    shutil.copy(f"{out}/v5/config.json", f"{out}/modules/config.json")
    # The release's config.json (Qwen's upload of Qwen2.5-VL-3B): the language model's fields
    # at the top level.
    os.makedirs(f"{out}/v4")
    shutil.copy(f"{out}/v5/model.safetensors", f"{out}/v4/model.safetensors")
    with open(f"{out}/v5/config.json") as f:
        v5 = json.load(f)
    text = dict(v5["text_config"])
    rope = text.pop("rope_parameters")
    v4 = {k: v for k, v in v5.items() if k not in ("text_config", "dtype", "transformers_version")}
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
              "rms_norm_eps", "hidden_act", "sliding_window", "use_sliding_window",
              "max_window_layers", "attention_dropout", "bos_token_id", "eos_token_id"):
        if k in text:
            v4[k] = text[k]
    v4["rope_theta"] = rope["rope_theta"]
    v4["rope_scaling"] = {"type": "mrope", "mrope_section": rope["mrope_section"]}
    v4["torch_dtype"] = "bfloat16"
    v4["transformers_version"] = "4.41.2"
    v4["vision_config"] = {k: v for k, v in v5["vision_config"].items() if k != "in_channels"}
    with open(f"{out}/v4/config.json", "w") as f:
        json.dump(v4, f, indent=2)
    # A vision tower with a field that changes its math and no rule reads.
    shutil.copytree(f"{out}/v5", f"{out}/badvision")
    v5["vision_config"]["window_attention_kind"] = "shifted"
    with open(f"{out}/badvision/config.json", "w") as f:
        json.dump(v5, f, indent=2)


def inputs():
    """Text around one image: <|vision_start|><|image_pad|> x 16 <|vision_end|>, then text."""
    g = torch.Generator().manual_seed(1)
    t, h, w = GRID
    merged = t * h * w // (VISION["spatial_merge_size"] ** 2)
    ids = ([5, 17, 42, TOKENS["vision_start_token_id"]] + [TOKENS["image_token_id"]] * merged +
           [TOKENS["vision_end_token_id"], 7, 99, 123, 200, 3])
    patch = 3 * VISION["temporal_patch_size"] * VISION["patch_size"] ** 2
    pixels = torch.randn(t * h * w, patch, generator=g)
    return (torch.tensor([ids]), pixels, torch.tensor([list(GRID)]))


def logits_of(path, pixel_shift=0.0):
    from transformers import Qwen2_5_VLForConditionalGeneration
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(path, dtype=torch.bfloat16)
    model.eval()
    ids, pixels, grid = inputs()
    with torch.no_grad():
        return model(input_ids=ids, pixel_values=(pixels + pixel_shift).to(torch.bfloat16),
                     image_grid_thw=grid).logits.float()


def logits(orig, hf_dirs):
    want = logits_of(orig)
    # The input's image matters: another picture gives other logits.
    if torch.equal(want, logits_of(orig, pixel_shift=0.5)):
        print(f"FAIL {orig}: the image does not change the logits")
        return
    for hf_dir in hf_dirs:
        got = logits_of(hf_dir)
        if torch.equal(want, got):
            print(f"PASS {hf_dir}: transformers' logits on an image + text input equal {orig}'s")
        else:
            print(f"FAIL {hf_dir}: logits differ from {orig}'s by {(want - got).abs().max().item()}")


if __name__ == "__main__":
    {"build": lambda: build(sys.argv[2]),
     "logits": lambda: logits(sys.argv[2], sys.argv[3:])}[sys.argv[1]]()
