#!/usr/bin/python3
"""MiMo (MiMoForCausalLM, model_type mimo) checks, written from MiMo's published modeling_mimo.py
(MiMoMTPLayers: token_layernorm, hidden_layernorm, input_proj over
cat([hidden_layernorm(hidden), token_layernorm(embedding)]), a Qwen2 decoder layer, final_layernorm;
MiMoModel.mtp_layers), mbridge's models/mimo.py (the Megatron names of those tensors) and
Megatron-core 0.17.1's MultiTokenPredictionLayer (eh_proj, a column-parallel linear over
cat([enorm(embedding), hnorm(hidden)]), then mtp_model_layer and final_layernorm), not from
ckptfs's code.

  mimo_reference.py build OUT        (in the sid root: transformers 5.12.1)
      OUT/mimo: a tiny Qwen2ForCausalLM built by transformers, saved in bf16, plus MTP layers
      built as MiMoMTPLayers builds them (transformers' Qwen2Attention, Qwen2MLP, Qwen2RMSNorm,
      a Linear(2H, H)) and written under model.mtp_layers.N; config.json says MiMoForCausalLM.
  mimo_reference.py check SRC VIEW LAYOUT [--torch2] [--local]
      every rank file of VIEW (a Megatron view of SRC with -o mtp=on) loads; the MTP layers'
      entries are mbridge's names holding exactly the bytes of SRC's tensors (eh_proj =
      input_proj with its column halves exchanged, split by rows over TP; the transformer layer's
      entries as a decoder layer's), on the last stage only; and the MTP forward of Megatron over
      the rank files equals MiMo's over SRC's tensors.
  mimo_reference.py logits ORIG HF_DIR    (in the sid root)
      HF_DIR (a round trip's hf/) says MiMoForCausalLM, and its main model, loaded by
      transformers as Qwen2ForCausalLM, gives ORIG's logits exactly.
  mimo_reference.py same ORIG HF_DIR
      HF_DIR's tensors (the MTP layers' included) are ORIG's, bit for bit.
  mimo_reference.py bad SRC KIND
      breaks SRC: KIND drop-mtp (an MTP tensor left out), input-proj-shape ([H, H]);
      released-config rewrites its config.json in the released MiMo-7B's spelling (transformers
      4.40: rope_theta, torch_dtype, attention_bias, use_mrope, sliding_window, auto_map).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import st_write  # noqa: E402
from reference import (Model, attention_keys, dense_mlp_keys, f32, hf_attention, hf_swiglu,  # noqa: E402
                       load_rank_file, megatron_attention, megatron_dense_mlp, rms)

TOKENS = np.arange(1, 250, 7) % 256
MTP_LAYERS = 2  # MiMo-7B has one; two here so that layer 1's names are checked too
CONFIG = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=4, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-6,
              tie_word_embeddings=False)
THETA = 640000.0  # MiMo-7B's rope_theta
TOLERANCE = 1e-4


# --- build (sid root) ---

def build(out):
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers.models.qwen2 import modeling_qwen2 as q2
    torch.manual_seed(3)
    cfg = transformers.Qwen2Config(**CONFIG, rope_parameters={"rope_type": "default", "rope_theta": THETA})
    model = transformers.Qwen2ForCausalLM(cfg)
    # MiMoMTPLayers.__init__, module for module (modeling_mimo.py)
    mtp = torch.nn.ModuleList()
    for _ in range(MTP_LAYERS):
        layer = torch.nn.Module()
        for n in ("input_layernorm", "post_attention_layernorm", "token_layernorm", "hidden_layernorm",
                  "final_layernorm"):
            setattr(layer, n, q2.Qwen2RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps))
        layer.input_proj = torch.nn.Linear(cfg.hidden_size * 2, cfg.hidden_size, bias=False)
        layer.self_attn = q2.Qwen2Attention(cfg, layer_idx=0)
        layer.mlp = q2.Qwen2MLP(cfg)
        mtp.append(layer)
    with torch.no_grad():  # random where transformers puts constants (norms 1, biases 0)
        for p in list(model.parameters()) + list(mtp.parameters()):
            p.normal_(0, 0.3 if p.dim() == 1 else 0.08)
    d = f"{out}/mimo"
    model.to(torch.bfloat16).save_pretrained(d)
    path = f"{d}/model.safetensors"
    tensors = load_file(path)
    for k, v in mtp.to(torch.bfloat16).state_dict().items():
        tensors[f"model.mtp_layers.{k}"] = v.contiguous()
    save_file(tensors, path, metadata={"format": "pt"})
    c = json.load(open(f"{d}/config.json"))
    c.update(architectures=["MiMoForCausalLM"], model_type="mimo", num_nextn_predict_layers=MTP_LAYERS)
    json.dump(c, open(f"{d}/config.json", "w"), indent=2)
    print(f"built mimo ({len(tensors)} tensors)")


def qwen2_logits(d):
    """The main model of MiMo checkpoint D as transformers' Qwen2ForCausalLM (what MiMoForCausalLM
    is without its MTP layers), on TOKENS."""
    import torch
    import transformers
    from safetensors.torch import load_file
    c = json.load(open(f"{d}/config.json"))
    assert c["architectures"] == ["MiMoForCausalLM"], c["architectures"]
    fields = {k: v for k, v in c.items() if k not in ("architectures", "model_type", "num_nextn_predict_layers",
                                                       "transformers_version", "auto_map")}
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**fields)).to(torch.bfloat16).eval()
    sd = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            sd.update(load_file(f"{d}/{f}"))
    main = {k: v for k, v in sd.items() if not k.startswith("model.mtp_layers.")}
    assert len(main) < len(sd), "no MTP layers"
    model.load_state_dict(main, strict=True)
    with torch.no_grad():
        return model(torch.tensor(TOKENS)[None]).logits[0]


def logits(orig, hf_dir):
    import torch
    a, b = qwen2_logits(orig), qwen2_logits(hf_dir)
    if not torch.equal(a, b):
        sys.exit(f"logits differ: max abs {(a.float() - b.float()).abs().max().item():.3g}")
    print(f"main model logits equal transformers' Qwen2 logits of the original exactly ({tuple(a.shape)})")


# --- the views' MTP entries ---

class MimoModel(Model):
    """reference.Model of a MiMo checkpoint: q/k/v biases (Qwen2), layer ("mtp", j) the MTP layer
    j's tensors (model.mtp_layers.j.*)."""

    def __init__(self, src):
        super().__init__(src)
        self.bias, self.qk, self.theta = True, False, THETA
        rope = self.cfg.get("rope_parameters") or {}
        assert rope.get("rope_theta", self.cfg.get("rope_theta")) == THETA

    def layer(self, i, suffix):
        if isinstance(i, tuple):
            return self.bits(f"model.mtp_layers.{i[1]}.{suffix}")
        return super().layer(i, suffix)


def expected_mtp(m, j, r, tp, te):
    """TP rank r's entries of MTP layer j (legacy names of the TE or local spec): mbridge's mimo map, and
    eh_proj = input_proj with its halves exchanged (mbridge's _weight_to_mcore_format), rows split."""
    pre, H = f"mtp.layers.{j}.", m.H
    sd = {pre + "enorm.weight": m.layer(("mtp", j), "token_layernorm.weight"),
          pre + "hnorm.weight": m.layer(("mtp", j), "hidden_layernorm.weight"),
          pre + "final_layernorm.weight": m.layer(("mtp", j), "final_layernorm.weight")}
    w = m.layer(("mtp", j), "input_proj.weight")
    eh = np.concatenate([w[:, H:], w[:, :H]], 1)
    sd[pre + "eh_proj.weight"] = eh[r * H // tp:(r + 1) * H // tp]
    attention_keys(m, sd, pre + "mtp_model_layer.", ("mtp", j), r, tp, te)
    dense_mlp_keys(m, sd, pre + "mtp_model_layer.", ("mtp", j), r, tp, te)
    return {k: v for k, v in sd.items() if v is not None}


def mimo_mtp(m, j, e, h):
    """MiMoMTPLayers.forward over SRC's tensors: e the token embeddings, h the hidden states."""
    g = lambda s: models.bf16_to_f32(m.layer(("mtp", j), s))  # noqa: E731
    x = np.concatenate([rms(h, g("hidden_layernorm.weight"), m.eps), rms(e, g("token_layernorm.weight"), m.eps)], 1)
    x = x @ g("input_proj.weight").T
    x = hf_attention(m, ("mtp", j), x)
    x = x + hf_swiglu(m, ("mtp", j), rms(x, g("post_attention_layernorm.weight"), m.eps))
    return rms(x, g("final_layernorm.weight"), m.eps)


def megatron_mtp(m, sds, j, e, h, te):
    """Megatron-core's MultiTokenPredictionLayer over the TP ranks' state dicts: eh_proj column-
    parallel (each rank its rows of the output, gathered), then the layer and the final norm."""
    pre = f"mtp.layers.{j}."
    x = np.concatenate([rms(e, f32(sds[0][pre + "enorm.weight"]), m.eps),
                        rms(h, f32(sds[0][pre + "hnorm.weight"]), m.eps)], 1)
    x = np.concatenate([x @ f32(sd[pre + "eh_proj.weight"]).T for sd in sds], 1)
    x = megatron_attention(m, sds, pre + "mtp_model_layer.", x, te)
    x = x + megatron_dense_mlp(m, sds, pre + "mtp_model_layer.", x, te)
    return rms(x, f32(sds[0][pre + "final_layernorm.weight"]), m.eps)


def check(argv):
    ap = argparse.ArgumentParser(prog="mimo_reference.py check")
    ap.add_argument("src")
    ap.add_argument("view")
    ap.add_argument("layout")
    ap.add_argument("--torch2", action="store_true")
    ap.add_argument("--local", action="store_true", help="a view mounted with spec=local")
    a = ap.parse_args(argv)
    import torch
    te = not a.local
    tp, pp = (int(x) for x in a.layout[2:].split("pp"))
    m = MimoModel(a.src)
    names = sorted(os.listdir(os.path.join(a.view, "release")))
    want_names = sorted(f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "") for t in range(tp) for p in range(pp))
    errors = [] if names == want_names else [f"rank dirs {names} != {want_names}"]
    files = {n: load_rank_file(torch, os.path.join(a.view, "release", n, "model_optim_rng.pt"), a.torch2, True)
             for n in names}
    if getattr(files[names[0]]["args"], "mtp_num_layers", None) != MTP_LAYERS:
        errors.append(f"args.mtp_num_layers = {getattr(files[names[0]]['args'], 'mtp_num_layers', None)!r}")
    last = []
    for n in names:
        p = int(n.split("_")[3]) if pp > 1 else 0
        sd = files[n]["model"]
        got = {k: v for k, v in sd.items() if k.startswith("mtp.") and not k.endswith("_extra_state")}
        if p != pp - 1:
            if got:
                errors.append(f"{n}: MTP entries on stage {p}, not the last")
            continue
        r = int(n.split("_")[2])
        last.append(sd)
        want = {k: v for j in range(MTP_LAYERS) for k, v in expected_mtp(m, j, r, tp, te).items()}
        if set(got) != set(want):
            errors.append(f"{n}: MTP keys extra {sorted(set(got) - set(want))[:4]}, missing {sorted(set(want) - set(got))[:4]}")
            continue
        for k, v in want.items():
            t = got[k]
            bits = t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else None
            if bits is None or bits.shape != v.shape or not np.array_equal(bits, v):
                errors.append(f"{n}: {k}: not the bytes of SRC's tensor ({t.dtype}, {tuple(t.shape)} vs {v.shape})")
    if errors:
        print("\n".join(errors[:20]), file=sys.stderr)
        sys.exit(1)
    rng = np.random.default_rng(5)
    e = models.bf16_to_f32(m.bits("model.embed_tokens.weight"))[TOKENS]
    h = rng.standard_normal((len(TOKENS), m.H)).astype(np.float32)
    worst = 0.0
    for j in range(MTP_LAYERS):
        want, got = mimo_mtp(m, j, e, h), megatron_mtp(m, last, j, e, h, te)
        worst = max(worst, np.abs(got - want).max() / np.abs(want).max())
    if not worst < TOLERANCE:
        sys.exit(f"Megatron's MTP forward differs from MiMo's: max relative error {worst:.3g}")
    print(f"{a.layout}: {len(names)} files loaded (torch {torch.__version__}); {MTP_LAYERS} MTP layers hold "
          f"SRC's bytes under mbridge's names (eh_proj halves exchanged); Megatron MTP = MiMo MTP "
          f"(max rel err {worst:.2g})")


def same(orig, hf_dir):
    a, b = models.read_checkpoint(orig), models.read_checkpoint(hf_dir)
    assert set(a) == set(b), (sorted(set(a) - set(b))[:3], sorted(set(b) - set(a))[:3])
    bad = [k for k in a if a[k] != b[k]]
    assert not bad, bad[:3]
    n = sum(k.startswith("model.mtp_layers.") for k in a)
    print(f"{len(a)} tensors equal ({n} of the MTP layers)")


def bad(src, kind):
    path = os.path.join(src, "model.safetensors")
    tensors = models.read_checkpoint(src)
    H = json.load(open(os.path.join(src, "config.json")))["hidden_size"]
    if kind == "released-config":
        c = json.load(open(os.path.join(src, "config.json")))
        keep = {k: c[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                  "num_hidden_layers", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                                  "tie_word_embeddings", "num_nextn_predict_layers")}
        released = dict(architectures=["MiMoForCausalLM"], model_type="mimo", attention_bias=True,
                        attention_dropout=0.0, hidden_act="silu", initializer_range=0.02, max_window_layers=36,
                        rope_scaling=None, rope_theta=THETA, sliding_window=32768, torch_dtype="bfloat16",
                        transformers_version="4.40.1", use_cache=True, use_mrope=False, use_sliding_window=False,
                        auto_map={"AutoConfig": "configuration_mimo.MiMoConfig",
                                  "AutoModelForCausalLM": "modeling_mimo.MiMoForCausalLM"})
        json.dump({**released, **keep}, open(os.path.join(src, "config.json"), "w"), indent=2)
        return
    if kind == "drop-mtp":
        del tensors["model.mtp_layers.1.hidden_layernorm.weight"]
    elif kind == "input-proj-shape":
        dt, shape, raw = tensors["model.mtp_layers.0.input_proj.weight"]
        tensors["model.mtp_layers.0.input_proj.weight"] = (dt, (H, H), raw[:len(raw) // 2])
    else:
        sys.exit(f"bad: unknown kind {kind}")
    h, _ = st_write.header_bytes([(k, dt, shape, len(raw)) for k, (dt, shape, raw) in tensors.items()],
                                 metadata=None, compact=False)
    with open(path, "wb") as f:
        f.write(h + b"".join(raw for _, _, raw in tensors.values()))


if __name__ == "__main__":
    cmd = sys.argv[1:2]
    if cmd == ["build"] and len(sys.argv) == 3:
        build(sys.argv[2])
    elif cmd == ["check"]:
        check(sys.argv[2:])
    elif cmd == ["logits"] and len(sys.argv) == 4:
        logits(*sys.argv[2:])
    elif cmd == ["same"] and len(sys.argv) == 4:
        same(*sys.argv[2:])
    elif cmd == ["bad"] and len(sys.argv) == 4:
        bad(*sys.argv[2:])
    else:
        sys.exit(__doc__)
