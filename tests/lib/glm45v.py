#!/usr/bin/python3
"""GLM-4.5V (Glm4vMoeForConditionalGeneration), tiny, built and saved by transformers 5 itself (run
in the sid root), and the checks of ckptfs's Megatron views of it, written from mbridge's glm4v_moe
bridge (mbridge/models/glm4_vl: Glm4VLModel builds transformers' Glm4vMoeVisionModel under
vision_model. on the first pipeline stage, and a GPTModel under language_model. with mrope; its
_DIRECT_MAPPING, _ATTENTION_MAPPING, _MLP_MAPPING and _weight_to_hf_format) and Megatron-core
0.17.1's TP and EP splits, not from ckptfs's code.

  glm45v.py build OUT
      OUT/glm45v: GLM-4.5V's language model (4 layers: one dense, then 4 routed experts and a
      shared one; q/k/v biases; half of each head rotated, mrope sections 1/1/2) with GLM's tower
      (vlm.py's GLM4V_VISION, no qkv bias); OUT/glm45v-bias: the same without the language
      model's q/k/v biases, with the tower's (vision attention_bias), routed in 2 groups with
      weights scaled by 2.5. Every norm, bias and the experts' score correction random, so one
      served from the wrong tensor shows; the input's tokens spread over every expert.
  glm45v.py check ORIG VIEW LAYOUT OUT [VIEW LAYOUT OUT ...] [--mcore RELEASE] [--hf HF_DIR ...]
      every rank file of VIEW (ORIG's LAYOUT: tp{T}pp{P}[vpp{V}][ep{E}]; "bridge:LAYOUT": with
      Megatron-Bridge's names, the tower under visual., from glm_45v_bridge.py) loads with
      weights_only=True and holds exactly mbridge's names: on the first stage the tower's, in
      the order of transformers' module's state dict, then the language model's; its args say
      mrope with ORIG's sections, half the head rotated and the MoE as the bridge sets it. Then
      ORIG rebuilt from those rank files the way mbridge exports (TP and EP shares gathered, q/k/v
      and fc1 split back, the tower copied, a replicated tensor the same on every rank) holds
      ORIG's tensors byte for byte, and saved into OUT with ORIG's config.json gives
      transformers' logits on an image + text input exactly; and a forward with Megatron
      semantics over VIEW's rank files equals transformers' float32 logits of ORIG on that input
      (glm45v_forward.py). --mcore: as the mcore command; --hf: each HF_DIR holds ORIG's tensors
      byte for byte (vlm.py samehf) and gives its logits.
  glm45v.py notower MEGATRON_DIR OUT
      OUT: a copy of MEGATRON_DIR (a tp2pp2/ copy) without vision_model.blocks.1.attn.qkv.weight in
      its first rank file.
  glm45v.py mcore ORIG RELEASE
      RELEASE (mcore/'s release directory) read by torch.distributed.checkpoint: the tower a key
      per tensor (vision_model.NAME, transformers' module's global shape and ORIG's bytes), the
      language model under language_model.
Prints "PASS what" or "FAIL what: why".
"""
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glm45v_forward  # noqa: E402
import qwen35vl  # noqa: E402
import vlm  # noqa: E402
from moe_reference import file_name, parse_moe_layout, rank_grid  # noqa: E402
from reference import chunk_key, chunk_layers  # noqa: E402

TEXT = dict(vlm.GLM4V_TEXT, num_hidden_layers=4, moe_intermediate_size=32, n_routed_experts=4,
            num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1)
VARIANTS = {"glm45v": (TEXT, {}),
            "glm45v-bias": (dict(TEXT, attention_bias=False, n_group=2, topk_group=1, routed_scaling_factor=2.5),
                            {"attention_bias": True})}


def build(out):
    import transformers
    for name, (text, vision) in VARIANTS.items():
        torch.manual_seed(0)
        cfg = transformers.Glm4vMoeConfig(text_config=dict(text), vision_config=dict(vlm.GLM4V_VISION, **vision),
                                          **vlm.GLM4V_TOKENS)
        model = transformers.Glm4vMoeForConditionalGeneration(cfg)
        with torch.no_grad():
            for n, p in list(model.named_parameters()) + list(model.named_buffers()):
                if p.dim() == 1 and p.is_floating_point() and "inv_freq" not in n:
                    p.copy_(0.2 * torch.randn_like(p) + (1 if "norm" in n else 0))
            # The tower's weights at 1/sqrt(fan-in), not the init's 0.02, so that its blocks
            # shape the image's rows (at 0.02 their output is nearly the patch embedding's).
            for p in model.model.visual.parameters():
                if p.dim() > 1:
                    p.normal_(0, p[0].numel() ** -0.5)
            # Word embeddings of unit scale and router logits wider than the score correction:
            # a route that depends on the token (at the init's scales the biases set every
            # token's), so that every expert of every MoE layer gets some of the input's tokens
            # in glm45v_forward's check.
            model.model.language_model.embed_tokens.weight.normal_(0, 1.0)
            for layer in model.model.language_model.layers:
                # queries and keys at 1/sqrt(fan-in): attention scores of order 1, so that the
                # positions (mrope) change the output
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                    proj.weight.normal_(0, proj.weight.shape[1] ** -0.5)
                if hasattr(layer.mlp, "gate"):
                    layer.mlp.gate.weight.normal_(0, 1.0)
                    layer.mlp.gate.e_score_correction_bias.mul_(0.05)
        model.to(torch.bfloat16).save_pretrained(f"{out}/{name}")


def load_rank(path):
    import argparse
    torch.serialization.add_safe_globals([argparse.Namespace])  # the args, as Megatron's loader
    return torch.load(path, map_location="cpu", weights_only=True)


def tower_names(orig):
    """The state dict names of transformers' vision module built from ORIG's vision_config, in order
    (what mbridge's Glm4VLModel registers under vision_model.)."""
    import transformers
    cfg = transformers.AutoConfig.from_pretrained(orig)
    return list(transformers.Glm4vMoeVisionModel._from_config(cfg.vision_config).state_dict())


def layer_keys(text, g, e, ep, grouped):
    """mbridge's names of language layer G's entries in the file of EP rank E (without the
    language_model.decoder.layers.N. prefix); GROUPED: the experts as TEGroupedMLP's weights (the
    bridge's moe_grouped_gemm), else SequentialMLP's local_experts."""
    keys = ["self_attention.linear_proj.weight", "self_attention.linear_qkv.layer_norm_weight",
            "self_attention.linear_qkv.weight"]
    keys += ["self_attention.linear_qkv.bias"] if text.get("attention_bias", True) else []
    if g < text["first_k_dense_replace"]:
        return keys + ["mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"]
    keys += ["pre_mlp_layernorm.weight", "mlp.router.weight", "mlp.router.expert_bias",
             "mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts.linear_fc2.weight"]
    local = range(text["n_routed_experts"] // ep)
    if grouped:
        return keys + [f"mlp.experts.linear_fc{n}.weight{j}" for n in (1, 2) for j in local]
    for j in local:
        keys += [f"mlp.experts.local_experts.{j}.linear_fc1.weight", f"mlp.experts.local_experts.{j}.linear_fc2.weight"]
    return keys


def args_errors(args, text, sections, layout):
    tp, pp, vpp, ep, etp = parse_moe_layout(layout)
    moe_layers = [0 if i < text["first_k_dense_replace"] else 1 for i in range(text["num_hidden_layers"])]
    want = {"position_embedding_type": "mrope", "mrope_section": sections, "rotary_percent": 0.5,
            "rotary_base": 10000, "add_qkv_bias": text.get("attention_bias", True),
            "num_layers": text["num_hidden_layers"], "hidden_size": text["hidden_size"],
            "num_attention_heads": text["num_attention_heads"], "num_query_groups": text["num_key_value_heads"],
            "num_experts": text["n_routed_experts"], "moe_ffn_hidden_size": text["moe_intermediate_size"],
            "moe_shared_expert_intermediate_size": text["moe_intermediate_size"] * text["n_shared_experts"],
            "moe_router_topk": text["num_experts_per_tok"], "moe_router_score_function": "sigmoid",
            "moe_router_enable_expert_bias": True, "moe_layer_freq": moe_layers,
            "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp, "expert_model_parallel_size": ep}
    if text.get("routed_scaling_factor", 1.0) != 1.0:
        want["moe_router_topk_scaling_factor"] = text["routed_scaling_factor"]
    if text.get("n_group", 1) > 1:
        want["moe_router_num_groups"], want["moe_router_group_topk"] = text["n_group"], text["topk_group"]
    got = {k: getattr(args, k, None) for k in want}
    got["mrope_section"] = list(got["mrope_section"] or [])
    got["moe_layer_freq"] = list(got["moe_layer_freq"]) if isinstance(got["moe_layer_freq"], (list, tuple)) \
        else got["moe_layer_freq"]
    return [f"args.{k} {got[k]!r} (want {want[k]!r})" for k in want if got[k] != want[k]]


class Rebuilt:
    """ORIG's HF tensors gathered from rank-file entries as mbridge's export does."""

    def __init__(self, text):
        self.text, self.shares, self.whole, self.errors = text, {}, {}, []

    def put_whole(self, hf, t, where):
        kept = self.whole.get(hf)
        if kept is not None and (kept.shape != t.shape or not torch.equal(kept.view(torch.uint8), t.view(torch.uint8))):
            self.errors.append(f"{where}: differs from another rank's copy")
        self.whole.setdefault(hf, t)

    def put(self, hf, split, index, t):
        self.shares.setdefault((hf, split), {})[index] = t

    def tensors(self):
        c = self.text
        out = dict(self.whole)
        heads, groups = c["num_attention_heads"], c["num_key_value_heads"]
        d = c["hidden_size"] // heads
        for (hf, split), parts in self.shares.items():
            full = vlm.gather([parts[i] for i in sorted(parts)], split if split != "qkv" else "rows", c["vocab_size"])
            if split == "qkv":  # per query group: its queries, a key, a value
                names = [hf.replace("{p}", p) for p in ("q_proj", "k_proj", "v_proj")]
                out.update(zip(names, vlm.split_qkv(full, groups, heads, d)))
            elif split == "halves":
                out[hf.replace("{p}", "gate_proj")], out[hf.replace("{p}", "up_proj")] = full.chunk(2, dim=0)
            else:
                out[hf] = full
        return out


def add_file(rb, sd, layout, p, c, t, e, x, text, tower_prefix):
    """The entries of chunk C of the file of (TP t, stage p, EP e, expert TP x) into RB."""
    tp, pp, vpp, ep, etp = parse_moe_layout(layout)
    start, _ = chunk_layers(text["num_hidden_layers"], pp, vpp, p, c)
    lm = "model.language_model."
    direct = {"language_model.embedding.word_embeddings.weight": (lm + "embed_tokens.weight", "vocab"),
              "language_model.output_layer.weight": ("lm_head.weight", "vocab"),
              "language_model.decoder.final_layernorm.weight": (lm + "norm.weight", "whole")}
    layer = {"self_attention.linear_proj.weight": ("self_attn.o_proj.weight", "cols"),
             "self_attention.linear_qkv.layer_norm_weight": ("input_layernorm.weight", "whole"),
             "self_attention.linear_qkv.weight": ("self_attn.{p}.weight", "qkv"),
             "self_attention.linear_qkv.bias": ("self_attn.{p}.bias", "qkv"),
             "mlp.linear_fc1.layer_norm_weight": ("post_attention_layernorm.weight", "whole"),
             "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight", "whole"),
             "mlp.linear_fc1.weight": ("mlp.{p}.weight", "halves"),
             "mlp.linear_fc2.weight": ("mlp.down_proj.weight", "cols"),
             "mlp.router.weight": ("mlp.gate.weight", "whole"),
             "mlp.router.expert_bias": ("mlp.gate.e_score_correction_bias", "whole"),
             "mlp.shared_experts.linear_fc1.weight": ("mlp.shared_experts.{p}.weight", "halves"),
             "mlp.shared_experts.linear_fc2.weight": ("mlp.shared_experts.down_proj.weight", "cols")}
    expert = {"linear_fc1.weight": ("{p}.weight", "halves"), "linear_fc2.weight": ("down_proj.weight", "cols")}
    for k, v in sd.items():
        where = f"{layout} file ({t}, {p}, {e}) {k}"
        if k.endswith("_extra_state"):
            continue
        if k.startswith(tower_prefix):
            rb.put_whole("model.visual." + k[len(tower_prefix):], v, where)
        elif k in direct:
            hf, split = direct[k]
            rb.put_whole(hf, v, where) if split == "whole" else rb.put(hf, split, t, v)
        elif k.startswith("language_model.decoder.layers."):
            local, rest = k[len("language_model.decoder.layers."):].split(".", 1)
            g = start + int(local)
            if rest.startswith("mlp.experts.local_experts.") or rest.startswith("mlp.experts.linear_fc"):
                if rest.startswith("mlp.experts.local_experts."):
                    j, name = rest[len("mlp.experts.local_experts."):].split(".", 1)
                else:  # TEGroupedMLP: linear_fcN.weightJ
                    name, j = rest[len("mlp.experts."):].split(".weight")
                    name += ".weight"
                hf, split = expert[name]
                n = e * (text["n_routed_experts"] // ep) + int(j)
                rb.put(f"{lm}layers.{g}.mlp.experts.{n}.{hf}", split, x, v)
            elif rest in layer:
                hf, split = layer[rest]
                rb.put_whole(f"{lm}layers.{g}.{hf}", v, where) if split == "whole" else \
                    rb.put(f"{lm}layers.{g}.{hf}", split, t, v)
            else:
                rb.errors.append(f"{where}: not one of mbridge's names")
        else:
            rb.errors.append(f"{where}: not one of mbridge's names")


def check_layout(orig, view, layout, out):
    """LAYOUT "bridge:tpT..." : Megatron-Bridge's tree (glm_45v_bridge.py: the tower as
    transformers' module under visual.), else mbridge's (vision_model.)."""
    bridge, layout = layout.startswith("bridge:"), layout.removeprefix("bridge:")
    tower_prefix = "visual." if bridge else "vision_model."
    config = json.load(open(f"{orig}/config.json"))
    text = dict(config["text_config"])
    text.setdefault("attention_bias", True)
    sections = text["rope_parameters"]["mrope_section"]
    tp, pp, vpp, ep, etp = parse_moe_layout(layout)
    tower = [tower_prefix + n for n in tower_names(orig)]
    rb, bad, files = Rebuilt(text), [], 0
    for p in range(pp):
        for t, e, x, writes in rank_grid(tp, ep, etp):
            if not writes:
                continue
            path = f"{view}/release/{file_name(t, p, e, pp, ep)}/model_optim_rng.pt"
            try:
                ckpt = load_rank(path)
            except Exception as err:  # noqa: BLE001
                bad.append(f"{path}: torch.load(weights_only=True): {err}")
                continue
            files += 1
            bad += [f"{path}: {m}" for m in args_errors(ckpt["args"], text, sections, layout)]
            for c in range(vpp):
                sd = ckpt[chunk_key(c, vpp)]
                start, count = chunk_layers(text["num_hidden_layers"], pp, vpp, p, c)
                want = list(tower) if p == 0 and c == 0 else []
                want += ["language_model.embedding.word_embeddings.weight"] if p == 0 and c == 0 else []
                for local in range(count):
                    want += [f"language_model.decoder.layers.{local}.{k}"
                             for k in layer_keys(text, start + local, e, ep, bool(ckpt["args"].moe_grouped_gemm))]
                if p == pp - 1 and c == vpp - 1:
                    want += ["language_model.decoder.final_layernorm.weight", "language_model.output_layer.weight"]
                got = [k for k in sd if not k.endswith("_extra_state")]
                if set(got) != set(want):
                    bad.append(f"{path} chunk {c}: missing {sorted(set(want) - set(got))[:3]}, "
                               f"unexpected {sorted(set(got) - set(want))[:3]}")
                elif p == 0 and c == 0 and got[:len(tower)] != tower:
                    bad.append(f"{path}: the tower's entries are not first in its module's order")
                add_file(rb, sd, layout, p, c, t, e, x, text, tower_prefix)
    hf = rb.tensors()
    orig_tensors = vlm.st_tensors(orig)
    bad += rb.errors
    bad += [f"rebuilt: {k} missing" for k in sorted(set(orig_tensors) - set(hf))][:3]
    bad += [f"rebuilt: {k} unexpected" for k in sorted(set(hf) - set(orig_tensors))][:3]
    bad += [f"rebuilt: {k} differs" for k in sorted(set(hf) & set(orig_tensors))
            if hf[k].shape != orig_tensors[k].shape or not torch.equal(hf[k].view(torch.uint8),
                                                                        orig_tensors[k].view(torch.uint8))][:3]
    whose = "Megatron-Bridge's" if bridge else "mbridge's"
    print(f"{'FAIL' if bad or not files else 'PASS'} {view} {layout}: {files} rank files with {whose} names and args; "
          f"ORIG's {len(orig_tensors)} tensors rebuilt from them byte for byte" + (f" ({bad[:4]})" if bad else ""))
    if not bad:
        os.makedirs(out)
        vlm.save_st(hf, f"{out}/model.safetensors")
        shutil.copy(f"{orig}/config.json", f"{out}/config.json")


def check(argv):
    """ORIG, then VIEW LAYOUT OUT triples, then optionally --mcore RELEASE and --hf HF_DIR...: one
    process for all (transformers' import is most of its time)."""
    orig, rest, flags, into = argv[0], [], {}, None
    for a in argv[1:]:
        if a in ("--hf", "--mcore"):
            into = flags.setdefault(a, [])
        else:
            (rest if into is None else into).append(a)
    outs = []
    for view, layout, out in zip(rest[0::3], rest[1::3], rest[2::3]):
        check_layout(orig, view, layout, out)
        outs += [out] if os.path.isdir(out) else []
    # the forward with Megatron semantics over each mbridge layout's rank files
    glm45v_forward.check(orig, [(view, layout) for view, layout in zip(rest[0::3], rest[1::3])
                                if not layout.startswith("bridge:")])
    for release in flags.get("--mcore", []):
        mcore(orig, release)
    if flags.get("--hf"):
        vlm.samehf(orig, flags["--hf"])
    if outs or flags.get("--hf"):
        vlm.logits(orig, outs + flags.get("--hf", []), "Glm4vMoeForConditionalGeneration", vlm.glm4v_inputs)


def mcore(orig, release):
    import torch.distributed.checkpoint as dcp
    meta = dcp.FileSystemReader(release).read_metadata().state_dict_metadata
    tensors = vlm.st_tensors(orig)
    want = {"vision_model." + n: tensors["model.visual." + n] for n in tower_names(orig)}
    keys = {k for k, m in meta.items() if hasattr(m, "chunks")}
    tower_keys = {k for k in keys if k.startswith("vision_model.")}
    others = sorted(k for k in keys - tower_keys if not k.startswith("language_model."))
    shapes = [k for k in want if k in meta and tuple(meta[k].size) != tuple(want[k].shape)]
    if tower_keys != set(want) or others or shapes:
        print(f"FAIL {release}: tower keys missing {sorted(set(want) - tower_keys)[:3]}, unexpected "
              f"{sorted(tower_keys - set(want))[:3]}, other keys {others[:3]}, shapes differ {shapes[:3]}")
        return
    got = {k: torch.empty(tuple(meta[k].size), dtype=want[k].dtype) for k in want}
    dcp.load(got, checkpoint_id=release)
    bad = [k for k in want if not torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8))]
    print(f"{'FAIL' if bad else 'PASS'} {release}: the tower's {len(want)} tensors a key each, with transformers' "
          f"shapes and ORIG's bytes; {len(keys) - len(want)} language_model keys" + (f" (differing {bad[:3]})" if bad else ""))


if __name__ == "__main__":
    {"build": lambda: build(sys.argv[2]),
     "check": lambda: check(sys.argv[2:]),
     "notower": lambda: qwen35vl.notower(sys.argv[2], sys.argv[3]),  # the same tower block's qkv
     "mcore": lambda: mcore(sys.argv[2], sys.argv[3])}[sys.argv[1]]()
