#!/usr/bin/python3
"""GLM-4.5/4.6 (Glm4MoeForCausalLM) checks, written from transformers 5.12.1's
modeling_glm4_moe.py, Megatron-Bridge's GLM-4.5 bridge (models/glm/glm45_bridge.py), mbridge's
models/glm4moe.py and Megatron-core 0.17.1 (moe_utils.topk_routing_with_score_function: sigmoid
scores, expert bias for the choice, group-limited top-k, normalised and scaled weights;
RotaryEmbedding of kv_channels x rotary_percent), not from ckptfs's code.

  glm_reference.py build OUT          (in the sid root: transformers 5.12.1)
      OUT/NAME for each variant: a tiny model built and saved by transformers in float32, and
      OUT/NAME-bf16 the same model saved in bf16; OUT/NAME.logits.json: transformers' logits
      on TOKENS. glm-mtp also holds one multi-token prediction layer (model.layers.L.*: enorm,
      hnorm, eh_proj, shared_head.norm, an MoE decoder layer, copies of the embedding and head),
      as the releases do, which transformers does not build.
  glm_reference.py check SRC VIEW LAYOUT [--mtp] [--torch2]
      every rank file of VIEW (a Megatron view of SRC) loads (torch 1.13; torch 2.6 with
      weights_only and mmap with --torch2); the file set is Megatron's for LAYOUT; the args are
      what the bridges set from SRC's config.json; every chunk's weights are the bridges' names
      for its layers (and the MTP layer's with --mtp); a Megatron-semantics forward over the
      rank files (args and tensors only) equals transformers' logits.
  glm_reference.py same ORIG HF_DIR
      HF_DIR's tensors are ORIG's, bit for bit.
  glm_reference.py bad SRC KIND
      edits SRC's config.json into a GLM config that Megatron cannot express (KIND: no-norm,
      groups).
"""
import argparse
import json
import os
import sys
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
from moe_reference import MegatronMoE, file_name, parse_moe_layout, rank_grid, topk_mask  # noqa: E402
from reference import chunk_layers, f32, load_rank_file  # noqa: E402

TOKENS = np.arange(1, 250, 7) % 256  # 36 tokens
TOLERANCE = 1e-4  # max relative logit error, as the other references
BASE = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
            moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1, norm_topk_prob=True,
            num_hidden_layers=4)
VARIANTS = {
    # biases, q/k norms, a head wider than hidden / heads (GLM-4.5's 128 of 5120 / 96), groups,
    # one dense layer, transformers' default partial rotary (0.5)
    "glm-a": dict(attention_bias=True, use_qk_norm=True, head_dim=24, n_group=2, topk_group=1,
                  num_experts_per_tok=2, first_k_dense_replace=1, routed_scaling_factor=2.5,
                  num_nextn_predict_layers=0),
    # neither, no groups, two dense layers, a quarter of the head rotated, no scaling
    "glm-b": dict(attention_bias=False, use_qk_norm=False, n_group=1, topk_group=1, num_experts_per_tok=3,
                  first_k_dense_replace=2, routed_scaling_factor=1.0, partial_rotary_factor=0.25,
                  num_nextn_predict_layers=0),
    # glm-a with an MTP layer
    "glm-mtp": dict(attention_bias=True, use_qk_norm=True, head_dim=24, n_group=2, topk_group=1,
                    num_experts_per_tok=2, first_k_dense_replace=1, routed_scaling_factor=2.5,
                    num_nextn_predict_layers=1),
}


# --- build (sid root) ---

def build(out):
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    for name, fields in VARIANTS.items():
        torch.manual_seed(len(name))
        cfg = transformers.Glm4MoeConfig(**BASE, **fields,
                                         rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        with torch.no_grad():  # random where transformers puts constants (norms 1, biases 0)
            for p in model.parameters():
                p.normal_(0, 0.3 if p.dim() == 1 else 0.08)
            for layer in model.model.layers:
                if hasattr(layer.mlp, "gate"):  # the expert bias, a buffer
                    layer.mlp.gate.e_score_correction_bias.normal_(0, 0.05)
        model.eval()
        with torch.no_grad():
            logits = model(torch.tensor(TOKENS)[None]).logits[0]
        json.dump({"tokens": TOKENS.tolist(), "logits": logits.tolist()}, open(f"{out}/{name}.logits.json", "w"))
        model.save_pretrained(f"{out}/{name}")
        model.to(torch.bfloat16).save_pretrained(f"{out}/{name}-bf16")
        if fields["num_nextn_predict_layers"]:
            for d, dtype in ((name, torch.float32), (f"{name}-bf16", torch.bfloat16)):
                add_mtp_layer(f"{out}/{d}/model.safetensors", cfg, dtype, load_file, save_file, torch)
        print(f"built {name}")


def add_mtp_layer(path, cfg, dtype, load_file, save_file, torch):
    """The MTP layer GLM-4.5's releases hold after the decoder's (model.layers.L): its norms,
    eh_proj [H, 2H], shared_head.norm, a decoder layer like the last (MoE) one, and copies of
    the model's embedding and head (embed_tokens, shared_head.head)."""
    tensors = load_file(path)
    L, H = cfg.num_hidden_layers, cfg.hidden_size
    gen = torch.Generator().manual_seed(7)
    rnd = lambda *shape: (torch.randn(*shape, generator=gen) * (0.3 if len(shape) == 1 else 0.08)).to(dtype)  # noqa: E731
    for k in [k for k in tensors if k.startswith(f"model.layers.{L - 1}.")]:
        t = tensors[k]
        tensors[f"model.layers.{L}." + k[len(f"model.layers.{L - 1}."):]] = rnd(*t.shape).to(t.dtype)
    for k, shape in (("enorm.weight", (H,)), ("hnorm.weight", (H,)), ("eh_proj.weight", (H, 2 * H)),
                     ("shared_head.norm.weight", (H,))):
        tensors[f"model.layers.{L}.{k}"] = rnd(*shape)
    tensors[f"model.layers.{L}.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors[f"model.layers.{L}.shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, path, metadata={"format": "pt"})


# --- what the bridges set ---

class OneOf(tuple):
    """Any of these values is what the bridges mean (1 group = none, scaling 1.0 = none)."""


def hf_view(cfg):
    """The fields of config.json as Glm4MoeConfig reads them."""
    rope = cfg.get("rope_parameters") or {}
    prf = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.5))
    return dict(theta=rope.get("rope_theta", cfg.get("rope_theta")), prf=prf,
                head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def bridge_args(cfg, layout, mtp):
    """Megatron-Bridge's GLM45Bridge.provider_bridge / mbridge's GLM4MoEBridge._build_config for
    this config.json, as Megatron args."""
    tp, pp, vpp, ep, etp = layout
    v, L, k = hf_view(cfg), cfg["num_hidden_layers"], cfg["first_k_dense_replace"]
    one = lambda x: OneOf((None, 1)) if x == 1 else x  # noqa: E731
    return dict(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
        num_layers=L, hidden_size=cfg["hidden_size"], ffn_hidden_size=cfg["intermediate_size"],
        num_attention_heads=cfg["num_attention_heads"], num_query_groups=cfg["num_key_value_heads"],
        group_query_attention=cfg["num_key_value_heads"] != cfg["num_attention_heads"],
        kv_channels=v["head_dim"], add_qkv_bias=cfg["attention_bias"], qk_layernorm=cfg["use_qk_norm"],
        add_bias_linear=False, swiglu=True, normalization="RMSNorm", position_embedding_type="rope",
        rotary_percent=v["prf"], rotary_base=int(v["theta"]), rotary_interleaved=False,
        layernorm_epsilon=cfg["rms_norm_eps"], untie_embeddings_and_output_weights=True,
        num_experts=cfg["n_routed_experts"], moe_router_topk=cfg["num_experts_per_tok"],
        moe_ffn_hidden_size=cfg["moe_intermediate_size"],
        moe_shared_expert_intermediate_size=cfg["moe_intermediate_size"] * cfg["n_shared_experts"],
        moe_shared_expert_gate=False, moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True, moe_router_pre_softmax=False, moe_router_dtype="fp32",
        moe_layer_freq=[0] * k + [1] * (L - k),
        moe_router_topk_scaling_factor=OneOf((None, 1.0)) if cfg["routed_scaling_factor"] == 1.0
        else cfg["routed_scaling_factor"],
        moe_router_num_groups=one(cfg["n_group"]), moe_router_group_topk=one(cfg["topk_group"]),
        mtp_num_layers=cfg["num_nextn_predict_layers"] if mtp else None,
        multi_latent_attention=False)


def args_errors(args, want):
    out = []
    for k, val in want.items():
        got = getattr(args, k, "<missing>")
        if not (got in val if isinstance(val, OneOf) else got == val and type(got) is type(val)):
            out.append(f"args.{k} = {got!r}, the bridges set {val!r}")
    return out


def layer_keys(cfg, moe, experts_here):
    """The weights of one layer in a TE-spec legacy file: the bridges' Megatron names."""
    keys = {"self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.weight",
            "self_attention.linear_proj.weight"}
    if cfg["attention_bias"]:
        keys.add("self_attention.linear_qkv.bias")
    if cfg["use_qk_norm"]:
        keys |= {"self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"}
    if not moe:
        return keys | {"mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"}
    keys |= {"pre_mlp_layernorm.weight", "mlp.router.weight", "mlp.router.expert_bias",
             "mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts.linear_fc2.weight"}
    for j in range(experts_here):
        keys |= {f"mlp.experts.local_experts.{j}.linear_fc1.weight", f"mlp.experts.local_experts.{j}.linear_fc2.weight"}
    return keys


def key_errors(cfg, files, layout, mtp):
    tp, pp, vpp, ep, etp = layout
    L, k = cfg["num_hidden_layers"], cfg["first_k_dense_replace"]
    local, out, mtp_seen = cfg["n_routed_experts"] // ep, [], set()
    for name, sd in files.items():
        p = int(name.split("_")[3]) if pp > 1 else 0
        for v in range(vpp):
            chunk = sd["model" if vpp == 1 else f"model{v}"]
            start, count = chunk_layers(L, pp, vpp, p, v)
            got = {}
            for key in chunk:
                if key.endswith("_extra_state"):
                    continue
                if key.startswith("decoder.layers."):
                    i, rest = key[len("decoder.layers."):].split(".", 1)
                    got.setdefault(int(i), set()).add(rest)
                elif key.startswith("mtp.layers.0."):
                    mtp_seen.add((name, key[len("mtp.layers.0."):]))
            want = {i: layer_keys(cfg, start + i >= k, local) for i in range(count)}
            if got != want:
                bad = sorted(set(got) ^ set(want)) or [i for i in want if got[i] != want[i]]
                i = bad[0]
                out.append(f"{name} chunk {v}: layer {i} keys: extra {sorted(got.get(i, set()) - want.get(i, set()))[:4]}, "
                           f"missing {sorted(want.get(i, set()) - got.get(i, set()))[:4]}")
    if mtp:
        for f in {n for n, _ in mtp_seen}:
            names = {r for n, r in mtp_seen if n == f}
            own = {"enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight"}
            layer = {r.split(".", 1)[1] for r in names if r.startswith(("mtp_model_layer.", "transformer_layer."))}
            if not own <= names or layer != layer_keys(cfg, True, local):
                out.append(f"{f}: MTP layer keys {sorted(names)[:6]}")
        if not mtp_seen:
            out.append("no mtp.layers.0 keys in any file")
    elif mtp_seen:
        out.append("MTP keys without -o mtp=on")
    return out


# --- the Megatron forward ---

def sigmoid(z):
    return 1 / (1 + np.exp(-z))


class MegatronGLM(MegatronMoE):
    """moe_reference's Megatron MoE model (attention from reference.py with partial rotary,
    experts and shared experts over the rank files), routed as Megatron-core 0.17.1's sigmoid
    path: scores = sigmoid(logits); the top-k of scores + expert_bias, within the
    moe_router_group_topk best of moe_router_num_groups groups (a group ranked by the sum of its
    top topk / group_topk); weights = the chosen scores / their sum (+1e-20), times
    moe_router_topk_scaling_factor."""

    def __init__(self, m, files, layout, args):
        super().__init__(m, files, layout, args)
        self.scaling = args.moe_router_topk_scaling_factor
        self.groups, self.group_topk = args.moe_router_num_groups, args.moe_router_group_topk

    def route(self, logits, sds, pre):
        assert self.score_function == "sigmoid"
        scores = sigmoid(logits.astype(np.float32))
        choice = scores + f32(sds[0][pre + "mlp.router.expert_bias"]) if pre + "mlp.router.expert_bias" in sds[0] else scores
        if self.groups:
            T, G = choice.shape[0], self.groups
            per = np.sort(choice.reshape(T, G, -1), -1)[..., ::-1][..., :self.topk // self.group_topk].sum(-1)
            keep = np.repeat(topk_mask(per, self.group_topk), self.N // G, axis=1)
            choice = np.where(keep, choice, -np.inf)
        w = np.where(topk_mask(choice, self.topk), scores, 0)
        if self.topk > 1:
            w = w / (w.sum(-1, keepdims=True) + 1e-20)
        return w * self.scaling if self.scaling else w


def model_of_args(args, cfg):
    """What reference.py's attention and forward read, from the args alone (the vocabulary from
    config.json: args carry the padded one)."""
    d = args.kv_channels
    return types.SimpleNamespace(L=args.num_layers, H=args.hidden_size, nh=args.num_attention_heads,
                                 ng=args.num_query_groups if args.group_query_attention else args.num_attention_heads,
                                 d=d, bias=args.add_qkv_bias, qk=args.qk_layernorm, theta=float(args.rotary_base),
                                 rotary_dim=int(d * args.rotary_percent), eps=args.layernorm_epsilon,
                                 vocab=cfg["vocab_size"], tied=not args.untie_embeddings_and_output_weights)


def check(argv):
    ap = argparse.ArgumentParser(prog="glm_reference.py check")
    ap.add_argument("src")
    ap.add_argument("view")
    ap.add_argument("layout")
    ap.add_argument("--mtp", action="store_true")
    ap.add_argument("--torch2", action="store_true")
    a = ap.parse_args(argv)
    import torch
    layout = parse_moe_layout(a.layout)
    tp, pp, vpp, ep, etp = layout
    cfg = json.load(open(os.path.join(a.src, "config.json")))
    want_files = sorted({file_name(t, p, e, pp, ep) for t, e, _, w in rank_grid(tp, ep, etp) if w for p in range(pp)})
    present = sorted(os.listdir(os.path.join(a.view, "release")))
    errors = [] if present == want_files else [f"rank dirs {present} != Megatron's {want_files}"]
    files = {n: load_rank_file(torch, os.path.join(a.view, "release", n, "model_optim_rng.pt"), a.torch2, True)
             for n in present}
    args = files[present[0]]["args"]
    errors += args_errors(args, bridge_args(cfg, layout, a.mtp))
    errors += key_errors(cfg, files, layout, a.mtp)
    if errors:
        print("\n".join(errors[:20]), file=sys.stderr)
        sys.exit(1)
    want = np.array(json.load(open(os.path.join(os.path.dirname(a.src), os.path.basename(a.src.rstrip("/")) + ".logits.json")))["logits"],
                    dtype=np.float32)
    chunks = {n: {k: v for k, v in sd.items() if k.startswith("model")} for n, sd in files.items()}
    got = MegatronGLM(model_of_args(args, cfg), chunks, layout, args).forward("te", TOKENS)
    err = np.abs(got - want).max() / np.abs(want).max()
    if not err < TOLERANCE:
        print(f"logits differ from transformers': max relative error {err:.3g}", file=sys.stderr)
        sys.exit(1)
    print(f"{a.layout}: {len(present)} files loaded (torch {torch.__version__}), args as the bridges set, "
          f"keys the bridges' names; Megatron forward = transformers' logits (max rel err {err:.2g})")


def same(orig, hf_dir):
    a, b = models.read_checkpoint(orig), models.read_checkpoint(hf_dir)
    assert set(a) == set(b), (sorted(set(a) - set(b))[:3], sorted(set(b) - set(a))[:3])
    bad = [k for k in a if a[k] != b[k]]
    assert not bad, bad[:3]
    print(f"{len(a)} tensors equal")


def bad(src, kind):
    path = os.path.join(src, "config.json")
    cfg = json.load(open(path))
    if kind == "no-norm":  # unnormalised sigmoid weights: Megatron always normalises them
        cfg["norm_topk_prob"] = False
    elif kind == "groups":  # groups ranked by the sum of the top 3, not of the top 2 as here
        cfg.update(n_group=2, topk_group=1, num_experts_per_tok=3)
    else:
        sys.exit(f"bad: unknown kind {kind}")
    json.dump(cfg, open(path, "w"), indent=2)


if __name__ == "__main__":
    cmd = sys.argv[1:2]
    if cmd == ["build"] and len(sys.argv) == 3:
        build(sys.argv[2])
    elif cmd == ["check"]:
        check(sys.argv[2:])
    elif cmd == ["same"] and len(sys.argv) == 4:
        same(*sys.argv[2:])
    elif cmd == ["bad"] and len(sys.argv) == 4:
        bad(*sys.argv[2:])
    else:
        sys.exit(__doc__)
