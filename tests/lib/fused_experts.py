#!/usr/bin/python3
"""A tiny Qwen3-MoE built by transformers 5 (run in the sid root), saved with its experts one
by one (as save_pretrained writes them) and fused (as transformers 5 holds them in memory, which
it loads as they are), and broken copies of the fused one.

  fused_experts.py build OUT
      OUT/per-expert: save_pretrained's checkpoint (bf16).
      OUT/fused: the same config.json, model.safetensors written from the model's own state
        dict: mlp.experts.gate_up_proj [E, 2F, H] (gate rows, then up) and mlp.experts.down_proj
        [E, H, F] in its MoE layers.
      OUT/transposed: the fused tensors transposed ([E, H, 2F], [E, F, H]: Qwen3-VL-MoE's
        releases' orientation, which Qwen3-MoE's transformers does not load).
      OUT/bad-experts: layer 0's fused tensors hold 3 of the 4 experts.
      OUT/bad-dims: layer 0's gate_up_proj holds only the gate rows ([E, F, H]).
      OUT/bad-both: the fused checkpoint plus layer 0's per-expert tensors.
      OUT/bad-half: layer 0 has gate_up_proj but no down_proj.
      Prints the fused keys of OUT/fused and their shapes.
  fused_experts.py logits ORIG DIR
      ORIG and DIR loaded by transformers 5 give the same logits (torch.equal): "PASS ..." or
      "FAIL ..." on stdout.
"""
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

E, H, F = 4, 64, 48  # 2F != H: the transposed copy has other shapes


def write(out, tensors, like):
    shutil.copytree(like, out)
    for name in os.listdir(out):
        if name.startswith("model") and name.endswith((".safetensors", ".json")):
            os.remove(os.path.join(out, name))
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})


def build(out):
    torch.manual_seed(0)
    cfg = transformers.Qwen3MoeConfig(
        hidden_size=H, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
        num_experts=E, num_experts_per_tok=2, moe_intermediate_size=F, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[1], rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3 if p.dim() == 1 else 0.05)
    model = model.to(torch.bfloat16)
    model.save_pretrained(f"{out}/per-expert")
    saved = load_file(f"{out}/per-expert/model.safetensors")
    assert any(".experts.0.gate_proj." in k for k in saved), "save_pretrained wrote no per-expert tensors"
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    fused = {k: v for k, v in state.items() if ".mlp.experts." in k}
    assert fused and all(k.endswith(("gate_up_proj", "down_proj")) for k in fused), sorted(fused)
    for k, v in sorted(fused.items()):
        print(k, list(v.shape))
    write(f"{out}/fused", state, f"{out}/per-expert")
    write(f"{out}/transposed", {k: (v.transpose(1, 2) if k in fused else v) for k, v in state.items()},
          f"{out}/per-expert")
    l0 = "model.layers.0.mlp.experts."
    write(f"{out}/bad-experts", {k: (v[:3] if k.startswith(l0) else v) for k, v in state.items()}, f"{out}/per-expert")
    write(f"{out}/bad-dims", {k: (v[:, :F] if k == l0 + "gate_up_proj" else v) for k, v in state.items()},
          f"{out}/per-expert")
    both = dict(state)
    both.update({k: v for k, v in saved.items() if k.startswith(l0)})
    write(f"{out}/bad-both", both, f"{out}/per-expert")
    write(f"{out}/bad-half", {k: v for k, v in state.items() if k != l0 + "down_proj"}, f"{out}/per-expert")


def logits(orig, path):
    ids = torch.arange(3, 3 + 2 * 24).reshape(2, 24) * 37 % 256
    got = []
    for p in (orig, path):
        model = transformers.AutoModelForCausalLM.from_pretrained(p)
        model.eval()
        with torch.no_grad():
            got.append(model(ids).logits)
    want, have = got
    if have.dtype == want.dtype and torch.equal(have, want):
        print(f"PASS {path}: transformers 5 loads it, logits equal {orig}'s ({want.dtype} {list(want.shape)})")
    else:
        print(f"FAIL {path}: logits {have.dtype} differ from {orig}'s {want.dtype}: max |diff| "
              f"{(have.float() - want.float()).abs().max().item():.3g}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "build":
        build(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "logits":
        logits(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
