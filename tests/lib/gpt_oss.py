#!/usr/bin/python3
"""A tiny GPT-OSS built by transformers 5 (run in the sid root), saved bf16 by save_pretrained,
and MXFP4 copies written the way the release is (gpt-oss-20b/120b: mlp.experts.gate_up_proj_blocks
uint8 [E, 2F, H/32, 16], gate_up_proj_scales uint8 [E, 2F, H/32], down_proj_blocks [E, H, F/32, 16],
down_proj_scales [E, H, F/32], the biases bf16, config.json's quantization_config
{"quant_method": "mxfp4", ...}).

  gpt_oss.py build OUT
      OUT/bf16: save_pretrained's checkpoint.
      OUT/mxfp4: the same model with random MXFP4 experts (scales 2^-9 .. 2^-2).
      OUT/edges: the MXFP4 copy with scales at the ends of E8M0 (0, 1, 254, 255) in layer 0.
      OUT/bad-blocks: layer 0's gate_up_proj_blocks with 8 bytes a group.
      OUT/bad-scales: layer 0's down_proj_scales one group short.
      OUT/no-scales: layer 1's down_proj_scales missing.
  gpt_oss.py dequant SRC HF
      Every expert tensor of HF (ckptfs's hf/ with -o dtype=bf16) equals transformers'
      convert_moe_packed_tensors of SRC's blocks and scales bit for bit; HF has no blocks, scales
      or quantization_config. "PASS ..." or "FAIL ..." on stdout.
  gpt_oss.py logits SRC HF
      transformers 5 loads SRC (MXFP4, dequantised as it does on CPU) and HF: equal logits.
"""
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

E, H, F, LAYERS = 4, 64, 96, 2  # 2F != H, H and F multiples of 32
QUANT = {"quant_method": "mxfp4",
         "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                    "lm_head"]}


def write(out, tensors, config):
    os.makedirs(out)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def build(out):
    torch.manual_seed(0)
    cfg = transformers.GptOssConfig(
        hidden_size=H, intermediate_size=F, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=256, num_local_experts=E, num_experts_per_tok=2, sliding_window=8)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3 if p.dim() == 1 else 0.05)
    model = model.to(torch.bfloat16)
    model.save_pretrained(f"{out}/bf16")
    saved = load_file(f"{out}/bf16/model.safetensors")
    with open(f"{out}/bf16/config.json") as f:
        config = json.load(f)
    gen = torch.Generator().manual_seed(1)
    mx = {}
    for k, v in saved.items():
        if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            e, rows_in, cols_out = v.shape  # [E, H, 2F] / [E, F, H]: stored [E, out, in/32, 16]
            mx[k + "_blocks"] = torch.randint(0, 256, (e, cols_out, rows_in // 32, 16), generator=gen,
                                              dtype=torch.uint8)
            mx[k + "_scales"] = torch.randint(118, 126, (e, cols_out, rows_in // 32), generator=gen,
                                              dtype=torch.uint8)
        else:
            mx[k] = v
    config_mx = dict(config, quantization_config=QUANT)
    write(f"{out}/mxfp4", mx, config_mx)
    edges = dict(mx)
    s = edges["model.layers.0.mlp.experts.gate_up_proj_scales"].clone()
    s.view(-1)[:8] = torch.tensor([0, 1, 254, 255, 0, 255, 1, 254], dtype=torch.uint8)
    edges["model.layers.0.mlp.experts.gate_up_proj_scales"] = s
    write(f"{out}/edges", edges, config_mx)
    bad = dict(mx)
    b = bad["model.layers.0.mlp.experts.gate_up_proj_blocks"]
    bad["model.layers.0.mlp.experts.gate_up_proj_blocks"] = b[..., :8].contiguous()
    write(f"{out}/bad-blocks", bad, config_mx)
    bad = dict(mx)
    bad["model.layers.0.mlp.experts.down_proj_scales"] = mx["model.layers.0.mlp.experts.down_proj_scales"][..., :-1]
    write(f"{out}/bad-scales", bad, config_mx)
    bad = {k: v for k, v in mx.items() if k != "model.layers.1.mlp.experts.down_proj_scales"}
    write(f"{out}/no-scales", bad, config_mx)
    for k, v in mx.items():
        if "experts" in k:
            print(k, list(v.shape), str(v.dtype).replace("torch.", ""))


def dequant(src, hf):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    with open(os.path.join(hf, "config.json")) as f:
        if "quantization_config" in json.load(f):
            print(f"FAIL {hf}/config.json keeps quantization_config")
            return
    got = load_file(os.path.join(hf, "model.safetensors"))
    packed = load_file(os.path.join(src, "model.safetensors"))
    left = [k for k in got if k.endswith(("_blocks", "_scales"))]
    if left:
        print(f"FAIL {hf} serves {left}")
        return
    checked = 0
    for k in packed:
        if not k.endswith("_blocks"):
            continue
        name = k[: -len("_blocks")]
        want = convert_moe_packed_tensors(packed[k], packed[name + "_scales"])
        have = got.get(name)
        if have is None or have.dtype != want.dtype or have.shape != want.shape or \
                not torch.equal(have.view(torch.int16), want.view(torch.int16)):
            print(f"FAIL {name}: {None if have is None else (have.dtype, list(have.shape))} against transformers' "
                  f"{want.dtype} {list(want.shape)}")
            return
        checked += 1
    print(f"PASS {hf}: {checked} expert tensors bit-identical to transformers' dequantisation "
          f"(e.g. gate_up_proj {list(got['model.layers.0.mlp.experts.gate_up_proj'].shape)})")


def logits(src, hf):
    ids = torch.arange(3, 3 + 2 * 24).reshape(2, 24) * 37 % 256
    got = []
    for p, kw in ((src, {"quantization_config": transformers.Mxfp4Config(dequantize=True)}), (hf, {})):
        model = transformers.AutoModelForCausalLM.from_pretrained(p, dtype=torch.bfloat16, **kw)
        model.eval()
        with torch.no_grad():
            got.append(model(ids).logits)
    want, have = got
    if have.dtype == want.dtype and torch.equal(have, want):
        print(f"PASS {hf}: transformers 5 loads it, logits equal the MXFP4 source's ({want.dtype} {list(want.shape)})")
    else:
        print(f"FAIL {hf}: max difference {(have.float() - want.float()).abs().max().item()}")


if __name__ == "__main__":
    {"build": build, "dequant": dequant, "logits": logits}[sys.argv[1]](*sys.argv[2:])
