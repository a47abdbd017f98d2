#!/usr/bin/python3
"""Gemma 3's linear rope scaling (the 4B, 12B and 27B releases scale their full-attention layers'
rope by 8), run in the sid root (transformers 5).

  gemma3_rope.py build OUT
      OUT/text: gemma3.py's tiny Gemma3ForCausalLM with rope_parameters.full_attention linear,
      factor 8, saved by save_pretrained; OUT/release: its tensors with the releases' spelling
      (rope_scaling {"factor": 8.0, "rope_type": "linear"} at the top level beside rope_theta and
      rope_local_base_freq); OUT/unscaled: its tensors without the scaling; OUT/vlm: gemma3.py's
      tiny Gemma3ForConditionalGeneration whose text_config has the scaling; OUT/localscaled (the
      sliding layers' rope scaled too) and OUT/fractional (factor 2.5): configs to be refused.
  gemma3_rope.py check TEXT HF_DIR... -- VLM VLM_HF_DIR...
      transformers' logits of each HF_DIR equal TEXT's (those of VLM_HF_DIR equal VLM's, on an
      image + text input), and TEXT's differ from OUT/unscaled's (the factor is in the logits).
      Prints "PASS what" or "FAIL what: why".
"""
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemma3  # noqa: E402

FACTOR = 8.0
SCALED = {**gemma3.TEXT, "rope_parameters": {
    "full_attention": {"rope_type": "linear", "factor": FACTOR, "rope_theta": 1000000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0}}}


def build(out):
    gemma3.text_model(SCALED).save_pretrained(f"{out}/text")
    with open(f"{out}/text/config.json") as f:
        config = json.load(f)
    if config["rope_parameters"]["full_attention"].get("factor") != FACTOR:
        sys.exit(f"transformers wrote rope_parameters {config['rope_parameters']}")
    release = {k: v for k, v in config.items() if k not in ("rope_parameters", "layer_types", "dtype")}
    release.update(rope_theta=1000000.0, rope_local_base_freq=5000.0, sliding_window_pattern=6,
                   rope_scaling={"factor": FACTOR, "rope_type": "linear"}, torch_dtype="bfloat16")
    unscaled = {**config, "rope_parameters": gemma3.TEXT["rope_parameters"]}
    local = json.loads(json.dumps(config))
    local["rope_parameters"]["sliding_attention"].update(rope_type="linear", factor=FACTOR)
    fractional = json.loads(json.dumps(config))
    fractional["rope_parameters"]["full_attention"]["factor"] = 2.5
    for form, cfg in (("release", release), ("unscaled", unscaled), ("localscaled", local),
                      ("fractional", fractional)):
        os.makedirs(f"{out}/{form}")
        shutil.copy(f"{out}/text/model.safetensors", f"{out}/{form}/model.safetensors")
        with open(f"{out}/{form}/config.json", "w") as f:
            json.dump(cfg, f, indent=2)
    gemma3.vlm_model(SCALED).save_pretrained(f"{out}/vlm")


def check(argv):
    cut = argv.index("--")
    text, text_dirs, vlm, vlm_dirs = argv[0], argv[1:cut], argv[cut + 1], argv[cut + 2:]
    want = gemma3.logits_of(text)
    unscaled = gemma3.logits_of(os.path.join(os.path.dirname(text), "unscaled"))
    if torch.equal(want, unscaled):
        print(f"FAIL {text}: the factor does not change the logits (the check could not fail)")
    else:
        print(f"PASS {text}: the factor changes the logits (by up to {(want - unscaled).abs().max().item():.3g})")
    gemma3.logits(text, text_dirs)
    for d in vlm_dirs:
        gemma3.vlm_logits(vlm, d)


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"]:
        build(sys.argv[2])
    elif sys.argv[1:2] == ["check"]:
        check(sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
