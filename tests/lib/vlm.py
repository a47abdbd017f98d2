#!/usr/bin/python3
"""A tiny Qwen2.5-VL (and Qwen3-VL) built and saved by transformers 5 itself (run in the sid root), and the checks
of ckptfs's views of it.

  vlm.py build OUT
      OUT/v5: Qwen2_5_VLForConditionalGeneration with tiny text and vision configs, saved by
      save_pretrained in bf16 (config.json with nested text_config and vision_config; tensors
      under the release's names, model.* / visual.* / lm_head.*); OUT/modules: the same with
      the tensors under transformers >= 4.52's module names (model.language_model.*,
      model.visual.*); OUT/v4: v5's tensors with the release's config.json (the language
      model's fields at the top level); OUT/badvision: v5 with a vision field no rule reads.
  vlm.py megatron ORIG MEGATRON_DIR:TP:PP:VPP OUT [MEGATRON_DIR:TP:PP:VPP OUT ...]
      each rank file of MEGATRON_DIR (tpTPppPP[vppVPP]/ of ORIG) loads with weights_only and holds the
      names, shapes and bytes mbridge's Qwen2_5VLModel has on that rank (written here from
      mbridge's bridge tables and Megatron-core's TP splits), and args with its mrope; then
      ORIG rebuilt from those rank files the way mbridge exports (TP shares gathered, q/k/v
      and fc1 split back) into OUT, under the release's names with ORIG's config.json.
  vlm.py glm4v-build OUT
      OUT/glm4v: a tiny GLM-4.1V saved by transformers 5 (glm4v_build); OUT/glm4v-badvision:
      the same with a vision field no rule reads. (GLM-4.5V's: glm45v.py.)
  vlm.py glm4v-logits CLASS ORIG HF_DIR...
      as logits, for CLASS (Glm4vForConditionalGeneration, Glm4vMoeForConditionalGeneration)
      on an image + text input with its mm_token_type_ids.
  vlm.py build_qwen3 OUT
      OUT/dense: Qwen3VLForConditionalGeneration (QWEN3_TEXT, QWEN3_VISION: a learned position
      embedding, two deepstack mergers) saved by save_pretrained in bf16; OUT/moe: the same
      tower with Qwen3VLMoeForConditionalGeneration's text model (QWEN3_MOE), its experts fused
      on disk; OUT/badvision: dense with a vision field no rule reads; OUT/badorder: dense with
      deepstack_visual_indexes out of order.
  vlm.py q3_views ORIG MEGATRON_DIR OUT MCORE_DIR [ORIG MEGATRON_DIR OUT MCORE_DIR ...]
      the tiny Qwen3-VL (or Qwen3-VL-MoE) ORIG's tp2pp2 copy MEGATRON_DIR against mbridge's qwen3_vl tables (each rank
      file's names, shapes, bytes and mrope args); ORIG rebuilt from it as mbridge exports into OUT
      and compared by transformers' logits; MCORE_DIR (mcore/'s release) read by
      torch.distributed.checkpoint against the same tables.
  vlm.py logits_pairs ORIG HF_DIR [ORIG HF_DIR ...]
      the same for each pair, in one process.
  vlm.py bridge_views ORIG MEGATRON_DIR MCORE_DIR
      ORIG's tp2pp2 copy MEGATRON_DIR and mcore/ release MCORE_DIR, both served with
      -o megatron_names=bridge, against Megatron-Bridge's qwen25_vl bridge tables (bridge_views).
  vlm.py samehf ORIG HF_DIR...
      each HF_DIR's safetensors files hold exactly ORIG's tensors: the release's names, dtypes,
      shapes and bytes. Prints "PASS what" or "FAIL what: why".
  vlm.py samehf_pairs ORIG HF_DIR [ORIG HF_DIR ...]
      the same for each pair, in one process.
  vlm.py broken MEGATRON_DIR OUT
      three copies of a tp2pp2 copy (MEGATRON_DIR), each broken in its first rank file: OUT/notower
      without a tower block's fc2 weight, OUT/whole with the tower's first qkv weight unsplit
      (tp 1's, where the args say tp 2), OUT/noargs with args that carry no hf_vision_config.
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


# Qwen3-VL: Qwen3's language model (q/k norms, head_dim 16, interleaved mrope over 2/3/3 of its 8
# frequencies); a tower of 3 LayerNorm blocks with a learned position embedding (a 4x4 grid,
# interpolated to the image's) whose blocks 0 and 1 feed deepstack mergers.
QWEN3_TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=512, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 5e5,
                                   "mrope_section": [2, 3, 3], "mrope_interleaved": True})
QWEN3_MOE = dict(QWEN3_TEXT, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                 decoder_sparse_step=1)
QWEN3_VISION = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
                    num_position_embeddings=16, deepstack_visual_indexes=[0, 1])


def build_qwen3(out):
    from safetensors.torch import load_file
    from transformers import (Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLMoeConfig,
                              Qwen3VLMoeForConditionalGeneration)
    for form, config_class, model_class, text in (
            ("dense", Qwen3VLConfig, Qwen3VLForConditionalGeneration, QWEN3_TEXT),
            ("moe", Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration, QWEN3_MOE)):
        torch.manual_seed(0)
        cfg = config_class(text_config=dict(text), vision_config=dict(QWEN3_VISION),
                           tie_word_embeddings=False, **TOKENS)
        model = model_class(cfg).to(torch.bfloat16)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 1:
                    p.copy_(1 + 0.1 * torch.randn_like(p))
        model.save_pretrained(f"{out}/{form}")
        names = load_file(f"{out}/{form}/model.safetensors").keys()
        if not any(k.startswith("model.visual.deepstack_merger_list.1.") for k in names):
            sys.exit(f"{form}: save_pretrained wrote no second deepstack merger")
    with open(f"{out}/dense/config.json") as f:
        dense = json.load(f)
    for bad, change in (("badvision", ("window_size", 112)),
                        ("badorder", ("deepstack_visual_indexes", [1, 0]))):
        shutil.copytree(f"{out}/dense", f"{out}/{bad}")
        config = json.loads(json.dumps(dense))
        config["vision_config"][change[0]] = change[1]
        with open(f"{out}/{bad}/config.json", "w") as f:
            json.dump(config, f, indent=2)


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


def logits_of(path, pixel_shift=0.0, model_class=None, make_inputs=inputs):
    import transformers
    if model_class is None:  # the class the checkpoint's config names
        with open(f"{path}/config.json") as f:
            model_class = json.load(f)["architectures"][0]
    model = getattr(transformers, model_class).from_pretrained(path, dtype=torch.bfloat16)
    model.eval()
    ids, pixels, grid, *extra = make_inputs()
    extra = dict(extra[0]) if extra else {}
    if model_class.startswith(("Qwen3VL", "Qwen2_5_VL")):
        # their mrope needs the image tokens marked (without, transformers 5.12.1's Qwen2.5-VL
        # quietly takes 1-D positions)
        extra["mm_token_type_ids"] = (ids == TOKENS["image_token_id"]).long()
    with torch.no_grad():
        return model(input_ids=ids, pixel_values=(pixels + pixel_shift).to(torch.bfloat16),
                     image_grid_thw=grid, **extra).logits.float()


def logits(orig, hf_dirs, model_class=None, make_inputs=inputs):
    want = logits_of(orig, 0.0, model_class, make_inputs)
    # The input's image matters: another picture gives other logits.
    if torch.equal(want, logits_of(orig, 0.5, model_class, make_inputs)):
        print(f"FAIL {orig}: the image does not change the logits")
        return
    for hf_dir in hf_dirs:
        got = logits_of(hf_dir, 0.0, model_class, make_inputs)
        if torch.equal(want, got):
            print(f"PASS {hf_dir}: transformers' logits on an image + text input equal {orig}'s")
        else:
            print(f"FAIL {hf_dir}: logits differ from {orig}'s by {(want - got).abs().max().item()}")


def st_tensors(path):
    """Every tensor of the safetensors files of PATH, by name."""
    from safetensors.torch import load_file
    out = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, name)))
    return out


def samehf(orig, hf_dirs):
    want = st_tensors(orig)
    for hf_dir in hf_dirs:
        got = st_tensors(hf_dir)
        bad = sorted(set(want) ^ set(got))
        bad += [k for k in want if k in got and (got[k].dtype != want[k].dtype or got[k].shape != want[k].shape
                                                or not torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8)))]
        print(f"{'FAIL' if bad else 'PASS'} {hf_dir}: the {len(want)} tensors of {orig} under the release's names, "
              f"byte for byte" + (f" (differing {bad[:3]})" if bad else ""))


def broken(meg, out):
    first = "release/mp_rank_00_000/model_optim_rng.pt"
    for kind in ("notower", "whole", "noargs"):
        shutil.copytree(meg, f"{out}/{kind}")
        sd = torch.load(f"{meg}/{first}", map_location="cpu", weights_only=False)
        if kind == "notower":
            del sd["model"]["vision_model.decoder.layers.1.mlp.linear_fc2.weight"]
        elif kind == "whole":
            name = "vision_model.decoder.layers.0.self_attention.linear_qkv.weight"
            other = torch.load(f"{meg}/release/mp_rank_01_000/model_optim_rng.pt", map_location="cpu",
                               weights_only=False)
            sd["model"][name] = torch.cat([sd["model"][name], other["model"][name]])
        else:
            vars(sd["args"]).pop("hf_vision_config", None)
        torch.save(sd, f"{out}/{kind}/{first}")


# --- Megatron layouts, written from mbridge's qwen2_5_vl bridge (ISEEKYAN/mbridge,
# mbridge/models/qwen2_5_vl/__init__.py: _DIRECT_MAPPING, _ATTENTION_MAPPING, _MLP_MAPPING,
# _weight_to_mcore_format) and Megatron-core's TP splits, not from ckptfs ---

# Megatron name -> (HF names (release), how TP splits it). "{i}": a layer or block.
# Splits: rows (column-parallel), cols (row-parallel), halves (gated fc1: each half by rows),
# vocab (rows, padded), whole (replicated).
VISION_TABLE = {
    "vision_model.patch_embed.proj.weight": (["visual.patch_embed.proj.weight"], "whole"),
    "vision_model.decoder.final_layernorm.weight": (["visual.merger.ln_q.weight"], "whole"),
    "vision_model.projection.encoder.linear_fc1.weight": (["visual.merger.mlp.0.weight"], "rows"),
    "vision_model.projection.encoder.linear_fc1.bias": (["visual.merger.mlp.0.bias"], "rows"),
    "vision_model.projection.encoder.linear_fc2.weight": (["visual.merger.mlp.2.weight"], "cols"),
    "vision_model.projection.encoder.linear_fc2.bias": (["visual.merger.mlp.2.bias"], "whole"),
    "vision_model.decoder.layers.{i}.self_attention.linear_proj.weight": (["visual.blocks.{i}.attn.proj.weight"], "cols"),
    "vision_model.decoder.layers.{i}.self_attention.linear_proj.bias": (["visual.blocks.{i}.attn.proj.bias"], "whole"),
    "vision_model.decoder.layers.{i}.self_attention.linear_qkv.weight": (["visual.blocks.{i}.attn.qkv.weight"], "rows"),
    "vision_model.decoder.layers.{i}.self_attention.linear_qkv.bias": (["visual.blocks.{i}.attn.qkv.bias"], "rows"),
    "vision_model.decoder.layers.{i}.self_attention.linear_qkv.layer_norm_weight": (["visual.blocks.{i}.norm1.weight"], "whole"),
    "vision_model.decoder.layers.{i}.mlp.linear_fc1.weight": (["visual.blocks.{i}.mlp.gate_proj.weight", "visual.blocks.{i}.mlp.up_proj.weight"], "halves"),
    "vision_model.decoder.layers.{i}.mlp.linear_fc1.bias": (["visual.blocks.{i}.mlp.gate_proj.bias", "visual.blocks.{i}.mlp.up_proj.bias"], "halves"),
    "vision_model.decoder.layers.{i}.mlp.linear_fc2.weight": (["visual.blocks.{i}.mlp.down_proj.weight"], "cols"),
    "vision_model.decoder.layers.{i}.mlp.linear_fc2.bias": (["visual.blocks.{i}.mlp.down_proj.bias"], "whole"),
    "vision_model.decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight": (["visual.blocks.{i}.norm2.weight"], "whole"),
}
LANGUAGE_FIRST = {"language_model.embedding.word_embeddings.weight": (["model.embed_tokens.weight"], "vocab")}
LANGUAGE_LAST = {"language_model.decoder.final_layernorm.weight": (["model.norm.weight"], "whole"),
                 "language_model.output_layer.weight": (["lm_head.weight"], "vocab")}
LANGUAGE_LAYER = {
    "self_attention.linear_qkv.weight": (["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"], "rows"),
    "self_attention.linear_qkv.bias": (["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"], "rows"),
    "self_attention.linear_proj.weight": (["self_attn.o_proj.weight"], "cols"),
    "self_attention.linear_qkv.layer_norm_weight": (["input_layernorm.weight"], "whole"),
    "mlp.linear_fc1.weight": (["mlp.gate_proj.weight", "mlp.up_proj.weight"], "halves"),
    "mlp.linear_fc2.weight": (["mlp.down_proj.weight"], "cols"),
    "mlp.linear_fc1.layer_norm_weight": (["post_attention_layernorm.weight"], "whole"),
}


def to_mcore(name, hf, text=TEXT, vision=VISION):
    """mbridge's _weight_to_mcore_format: the full (unsplit) Megatron tensor of NAME."""
    if "linear_qkv" in name and "layer_norm" not in name:
        if len(hf) == 1:  # the vision tower's fused [q; k; v] -> per head [q_h; k_h; v_h]
            heads, width = vision["num_heads"], vision["hidden_size"]
            d = width // heads
            shape = [3, heads, -1, d, width] if name.endswith("weight") else [3, heads, -1]
            q, k, v = hf[0].view(*shape)
            out = [-1, width] if name.endswith("weight") else [-1]
            return torch.cat([x.reshape(heads, d, -1) for x in (q, k, v)], dim=1).reshape(*out)
        groups, heads = text["num_key_value_heads"], text["num_attention_heads"]
        d = text.get("head_dim", text["hidden_size"] // heads)
        q, k, v = hf
        q = q.reshape(groups, heads // groups * d, -1)
        k = k.reshape(groups, d, -1)
        v = v.reshape(groups, d, -1)
        out = [-1, text["hidden_size"]] if name.endswith("weight") else [-1]
        return torch.cat([q, k, v], dim=1).reshape(*out)
    if len(hf) == 2:
        return torch.cat(hf, dim=0)
    return hf[0]


def tp_share(full, split, tp, r, vocab_pad):
    if split == "whole":
        return full
    if split == "vocab":
        padded = torch.zeros((vocab_pad,) + tuple(full.shape[1:]), dtype=full.dtype)
        padded[: full.shape[0]] = full
        return padded.chunk(tp, dim=0)[r]
    if split == "rows":
        return full.chunk(tp, dim=0)[r]
    if split == "cols":
        return full.chunk(tp, dim=1)[r]
    gate, up = full.chunk(2, dim=0)  # halves
    return torch.cat([gate.chunk(tp, dim=0)[r], up.chunk(tp, dim=0)[r]], dim=0)


def chunk_layers(p, c, pp, vpp):
    """The global layers of virtual chunk C on pipeline stage P (Megatron's interleaving: chunk
    C of stage P is model chunk C * PP + P of PP * VPP equal ones)."""
    per_chunk = TEXT["num_hidden_layers"] // (pp * vpp)
    first = (c * pp + p) * per_chunk
    return range(first, first + per_chunk)


def expected_ranks(orig, tp, pp, vpp):
    """{(pp rank, tp rank): {"modelC/" + name: tensor}} of mbridge's Qwen2_5VLModel split by
    Megatron-core: the tower in the first chunk of the first stage, before the language model."""
    from safetensors.torch import load_file
    hf = load_file(f"{orig}/model.safetensors")
    vocab = TEXT["vocab_size"]
    divisible = 128 * tp  # Megatron's make_vocab_size_divisible_by x TP
    vocab_pad = (vocab + divisible - 1) // divisible * divisible
    out = {}
    for p in range(pp):
        for r in range(tp):
            sd = {}
            for c in range(vpp):
                chunk = f"model{c}/" if vpp > 1 else "model/"
                entries = []
                if p == 0 and c == 0:
                    for i in range(VISION["depth"]):
                        entries += [(k.replace("{i}", str(i)), [n.replace("{i}", str(i)) for n in v[0]], v[1])
                                    for k, v in VISION_TABLE.items()]
                    entries += [(k, v[0], v[1]) for k, v in LANGUAGE_FIRST.items()]
                for local, g in enumerate(chunk_layers(p, c, pp, vpp)):
                    entries += [(f"language_model.decoder.layers.{local}.{k}", [f"model.layers.{g}.{n}" for n in v[0]], v[1])
                                for k, v in LANGUAGE_LAYER.items()]
                if p == pp - 1 and c == vpp - 1:
                    entries += [(k, v[0], v[1]) for k, v in LANGUAGE_LAST.items()]
                for name, hf_names, split in entries:
                    sd[chunk + name] = tp_share(to_mcore(name, [hf[n] for n in hf_names]), split, tp, r, vocab_pad)
            out[(p, r)] = sd
    return out


def chunks_of(ckpt, vpp):
    """A rank file's state dicts as one {"modelC/" + name: value}."""
    names = [f"model{c}" for c in range(vpp)] if vpp > 1 else ["model"]
    return {f"{n}/{k}": v for n in names for k, v in ckpt[n].items()}


def rank_file(meg, p, r, pp):
    d = f"mp_rank_{r:02d}" + (f"_{p:03d}" if pp > 1 else "")
    return f"{meg}/release/{d}/model_optim_rng.pt"


def load_rank(path):
    import argparse
    torch.serialization.add_safe_globals([argparse.Namespace])  # the args, as Megatron's loader
    return torch.load(path, map_location="cpu", weights_only=True)


def megatron(orig, meg, tp, pp, vpp):
    """The rank files of MEG (tpTPppPP[vppVPP] of ORIG): the names and tensors mbridge's model has
    on each rank (extra states aside), bit for bit, and the args' rope."""
    want = expected_ranks(orig, tp, pp, vpp)
    layout = f"tp{tp}pp{pp}" + (f"vpp{vpp}" if vpp > 1 else "")
    what = f"{os.path.basename(meg)} {layout}"
    for (p, r), sd in want.items():
        path = rank_file(meg, p, r, pp)
        try:
            ckpt = load_rank(path)
        except Exception as e:  # noqa: BLE001
            print(f"FAIL {what} rank ({p}, {r}): torch.load(weights_only=True): {e}")
            continue
        got = {k: v for k, v in chunks_of(ckpt, vpp).items() if not k.endswith("_extra_state")}
        missing, extra = sorted(set(sd) - set(got)), sorted(set(got) - set(sd))
        bad = [k for k in sd if k in got and not (got[k].shape == sd[k].shape and torch.equal(got[k], sd[k]))]
        args = ckpt["args"]
        rope = (getattr(args, "position_embedding_type", None), getattr(args, "mrope_section", None))
        want_rope = ("mrope", TEXT["rope_scaling"]["mrope_section"])
        if missing or extra or bad or rope != want_rope:
            print(f"FAIL {what} rank ({p}, {r}): missing {missing[:3]}, unexpected {extra[:3]}, "
                  f"differing {bad[:3]}, rope {rope} (want {want_rope})")
        else:
            print(f"PASS {what} rank ({p}, {r}): {len(sd)} tensors with mbridge's names, shapes and bytes; "
                  f"args rope {rope}")


def to_hf(orig, meg, tp, pp, vpp, out):
    """ORIG's checkpoint rebuilt from MEG's rank files the way mbridge exports (gather the TP
    shares, _weight_to_hf_format), saved with the release's names and ORIG's config.json."""
    ranks = {(p, r): chunks_of(load_rank(rank_file(meg, p, r, pp)), vpp) for p in range(pp) for r in range(tp)}
    first = "model0/" if vpp > 1 else "model/"
    tables = []
    for i in range(VISION["depth"]):
        tables += [(0, first + k.replace("{i}", str(i)), [n.replace("{i}", str(i)) for n in v[0]], v[1])
                   for k, v in VISION_TABLE.items()]
    tables += [(0, first + k, v[0], v[1]) for k, v in LANGUAGE_FIRST.items()]
    for p in range(pp):
        for c in range(vpp):
            chunk = f"model{c}/" if vpp > 1 else "model/"
            for local, g in enumerate(chunk_layers(p, c, pp, vpp)):
                tables += [(p, f"{chunk}language_model.decoder.layers.{local}.{k}",
                            [f"model.layers.{g}.{n}" for n in v[0]], v[1]) for k, v in LANGUAGE_LAYER.items()]
    last = f"model{vpp - 1}/" if vpp > 1 else "model/"
    tables += [(pp - 1, last + k, v[0], v[1]) for k, v in LANGUAGE_LAST.items()]
    hf = {}
    for p, name, hf_names, split in tables:
        full = gather([ranks[(p, r)][name] for r in range(tp)], split, TEXT["vocab_size"])
        if "linear_qkv" in name and "layer_norm" not in name:
            if "/vision_model." in name:
                hf[hf_names[0]] = vision_qkv(full, VISION["num_heads"], VISION["hidden_size"])
            else:
                heads = TEXT["num_attention_heads"]
                qkv = split_qkv(full, TEXT["num_key_value_heads"], heads, TEXT["hidden_size"] // heads)
                hf.update(zip(hf_names, qkv))
        elif len(hf_names) == 2:
            hf[hf_names[0]], hf[hf_names[1]] = full.chunk(2, dim=0)
        else:
            hf[hf_names[0]] = full
    os.makedirs(out)
    save_st(hf, f"{out}/model.safetensors")
    shutil.copy(f"{orig}/config.json", f"{out}/config.json")


def expected_mcore(orig):
    """{key: global tensor} of Megatron-core's sharded_state_dict of mbridge's Qwen2_5VLModel (the
    keys torch_dist saves): each module's layers stacked on a leading axis under
    "decoder.layers.", the patch kernel whole, the vocabulary unpadded (256 rows divide by 128 x
    the TP degrees the tower allows)."""
    from safetensors.torch import load_file
    hf = load_file(f"{orig}/model.safetensors")
    out = {}
    for k, (names, _) in VISION_TABLE.items():
        if "{i}" in k:
            out[k.replace(".{i}.", ".")] = torch.stack(
                [to_mcore(k, [hf[n.replace("{i}", str(i))] for n in names]) for i in range(VISION["depth"])])
        else:
            out[k] = to_mcore(k, [hf[n] for n in names])
    for k, (names, _) in {**LANGUAGE_FIRST, **LANGUAGE_LAST}.items():
        out[k] = to_mcore(k, [hf[n] for n in names])
    for k, (names, _) in LANGUAGE_LAYER.items():
        out[f"language_model.decoder.layers.{k}"] = torch.stack(
            [to_mcore(k, [hf[f"model.layers.{g}.{n}"] for n in names]) for g in range(TEXT["num_hidden_layers"])])
    return out


def mcore(orig, ckpt):
    """CKPT (an mcore/ release directory, "FORM=DIR") read by torch.distributed.checkpoint: every tensor key of
    mbridge's model with its global shape and bytes, nothing else but _extra_state objects."""
    form, ckpt = ckpt.split("=", 1)
    compare_mcore(expected_mcore(orig), ckpt, f"{form}: ", "mbridge's")


def gather(shares, split, vocab):
    """The whole tensor from its TP SHARES as Megatron splits it (SPLIT: "whole", "rows", "cols",
    "vocab": rows cut back to VOCAB, else "halves": each rank a slice of gate and of up)."""
    if split == "whole":
        return shares[0]
    if split in ("rows", "vocab"):
        full = torch.cat(shares, dim=0)
        return full[:vocab] if split == "vocab" else full
    if split == "cols":
        return torch.cat(shares, dim=1)
    halves = [s.chunk(2, dim=0) for s in shares]
    return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)


def split_qkv(full, groups, heads, d):
    """q, k and v from Megatron's fused linear_qkv (per query group: its queries, a key, a value)."""
    per = full.reshape(groups, (heads // groups + 2) * d, -1)
    return [x.reshape((-1,) + tuple(full.shape[1:])) for x in per.split([heads // groups * d, d, d], dim=1)]


def vision_qkv(full, heads, width):
    """A ViT's fused attn.qkv ([q; k; v]) from Megatron's, regrouped per head."""
    per = full.reshape(heads, 3, width // heads, -1)
    return per.transpose(0, 1).reshape((3 * width,) + tuple(full.shape[1:]))


def compare_mcore(want, ckpt, label, whose):
    """CKPT read by torch.distributed.checkpoint against WANT (key -> tensor of WHOSE model): the
    same tensor keys with their global shapes, nothing else but _extra_state objects, and the same
    bytes. Prints PASS/FAIL lines that start with LABEL."""
    import torch.distributed.checkpoint as dcp
    meta = dcp.FileSystemReader(ckpt).read_metadata().state_dict_metadata
    tensors = {k for k, m in meta.items() if hasattr(m, "chunks")}
    others = sorted(k for k in set(meta) - tensors if "_extra_state" not in k)
    missing, extra = sorted(set(want) - tensors), sorted(tensors - set(want))
    shapes = [k for k in want if k in meta and tuple(meta[k].size) != tuple(want[k].shape)]
    if missing or extra or others or shapes:
        print(f"FAIL {label}mcore keys: missing {missing[:3]}, unexpected {extra[:3]} {others[:3]}, shapes differ {shapes[:3]}")
        return
    print(f"PASS {label}mcore keys: the {len(want)} tensor keys of {whose} model with its global shapes")
    got = {k: torch.empty_like(v) for k, v in want.items()}
    dcp.load(got, checkpoint_id=ckpt)
    bad = [k for k in want if not torch.equal(got[k], want[k])]
    print(f"{'FAIL' if bad else 'PASS'} {label}mcore tensors: dcp.load gives {whose} tensors bit for bit"
          + (f" (differing {bad[:3]})" if bad else ""))


# --- Megatron-Bridge's names (-o megatron_names=bridge), written from its qwen25_vl bridge
# (NVIDIA-NeMo/Megatron-Bridge, src/megatron/bridge/models/qwen_vl/qwen25_vl_bridge.py,
# Qwen25VLBridge.mapping_registry; modeling_qwen25_vl.py, Qwen25VLModel), not from ckptfs: the
# language model by its param_mappings, QKVMapping and GatedMLPMapping ("*" a layer), each with
# the TP split of its Megatron-core module; the tower by ReplicatedMapping("visual.**",
# "visual.**"): transformers' own Qwen2_5_VisionTransformerPretrainedModel registered as
# Qwen25VLModel.visual (before language_model, on the first stage), every tensor under its own
# name, whole on every TP rank. ---
BRIDGE_TEXT = {
    "language_model.embedding.word_embeddings.weight": (["model.embed_tokens.weight"], "vocab"),
    "language_model.output_layer.weight": (["lm_head.weight"], "vocab"),
    "language_model.decoder.final_layernorm.weight": (["model.norm.weight"], "whole"),
    "language_model.decoder.layers.*.self_attention.linear_qkv.layer_norm_weight": (["model.layers.*.input_layernorm.weight"], "whole"),
    "language_model.decoder.layers.*.mlp.linear_fc1.layer_norm_weight": (["model.layers.*.post_attention_layernorm.weight"], "whole"),
    "language_model.decoder.layers.*.self_attention.linear_proj.weight": (["model.layers.*.self_attn.o_proj.weight"], "cols"),
    "language_model.decoder.layers.*.mlp.linear_fc2.weight": (["model.layers.*.mlp.down_proj.weight"], "cols"),
    "language_model.decoder.layers.*.self_attention.linear_qkv.weight": (
        ["model.layers.*.self_attn.q_proj.weight", "model.layers.*.self_attn.k_proj.weight", "model.layers.*.self_attn.v_proj.weight"], "rows"),
    "language_model.decoder.layers.*.self_attention.linear_qkv.bias": (
        ["model.layers.*.self_attn.q_proj.bias", "model.layers.*.self_attn.k_proj.bias", "model.layers.*.self_attn.v_proj.bias"], "rows"),
    "language_model.decoder.layers.*.mlp.linear_fc1.weight": (["model.layers.*.mlp.gate_proj.weight", "model.layers.*.mlp.up_proj.weight"], "halves"),
}


def bridge_tower(orig):
    """The tower's state dict names in Qwen25VLModel.visual's order: the module built from ORIG's
    vision_config, as the bridge's model builds it (_from_config)."""
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
    cfg = Qwen2_5_VLConfig.from_pretrained(orig)
    return ["visual." + k for k in Qwen2_5_VisionTransformerPretrainedModel._from_config(cfg.vision_config).state_dict()]


def bridge_entries(layers, local_of):
    """(Megatron name, HF names, split) of BRIDGE_TEXT's entries for global LAYERS, named by
    local_of(layer) in Megatron (the stage's own numbering, or the global one)."""
    out = []
    for k, (names, split) in BRIDGE_TEXT.items():
        if "*" in k:
            out += [(k.replace("*", str(local_of(g))), [n.replace("*", str(g)) for n in names], split) for g in layers]
    return out


def bridge_views(orig, meg, ckpt):
    """MEG (a tp2pp2 copy) and CKPT (mcore/'s release) of ORIG under -o megatron_names=bridge
    against Megatron-Bridge's Qwen25VLModel: each rank file's names (the tower's first, in its
    module's order), shapes and bytes; mcore/'s keys (the tower's a key per tensor, unstacked:
    transformers' module has no sharded_state_dict), global shapes and bytes."""
    from safetensors.torch import load_file
    hf = load_file(f"{orig}/model.safetensors")
    tower = bridge_tower(orig)
    tp, pp, vocab = 2, 2, TEXT["vocab_size"]
    vocab_pad = (vocab + 128 * tp - 1) // (128 * tp) * (128 * tp)
    per_stage = TEXT["num_hidden_layers"] // pp
    for p in range(pp):
        layers = range(p * per_stage, (p + 1) * per_stage)
        entries = [(n, [n], "whole") for n in tower] if p == 0 else []
        if p == 0:
            entries.append(("language_model.embedding.word_embeddings.weight", *BRIDGE_TEXT["language_model.embedding.word_embeddings.weight"]))
        entries += bridge_entries(layers, lambda g: g - p * per_stage)
        if p == pp - 1:
            entries += [(k, *BRIDGE_TEXT[k]) for k in ("language_model.decoder.final_layernorm.weight", "language_model.output_layer.weight")]
        for r in range(tp):
            want = {k: tp_share(to_mcore(k, [hf[n] for n in names]), split, tp, r, vocab_pad) for k, names, split in entries}
            ckpt_r = load_rank(rank_file(meg, p, r, pp))
            order = [k for k in ckpt_r["model"] if not k.endswith("_extra_state")]
            got = {k: ckpt_r["model"][k] for k in order}
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            bad = [k for k in want if k in got and not (got[k].shape == want[k].shape and torch.equal(got[k], want[k]))]
            first = order[:len(tower)] == tower if p == 0 else not any(k.startswith("visual.") for k in order)
            label = f"bridge tp2pp2 rank ({p}, {r})"
            if missing or extra or bad or not first:
                print(f"FAIL {label}: missing {missing[:3]}, unexpected {extra[:3]}, differing {bad[:3]}, tower first in its order: {first}")
            else:
                print(f"PASS {label}: {len(want)} tensors with Megatron-Bridge's names, shapes and bytes"
                      + (f", the tower's {len(tower)} first" if p == 0 else ""))
    want = {n: hf[n] for n in tower}
    for k, (names, _) in BRIDGE_TEXT.items():
        if "*" not in k:
            want[k] = to_mcore(k, [hf[n] for n in names])
        else:
            want[k.replace("*.", "")] = torch.stack([to_mcore(k, [hf[n.replace("*", str(g))] for n in names])
                                                     for g in range(TEXT["num_hidden_layers"])])
    # the vocabulary padded with zero rows for the largest TP the model allows (docs/torch-dist.md):
    # 4 (its 4 heads), the tower splitting nothing
    for k in ("language_model.embedding.word_embeddings.weight", "language_model.output_layer.weight"):
        want[k] = tp_share(want[k], "vocab", 1, 0, 128 * 4)
    compare_mcore(want, ckpt, "bridge: ", "Megatron-Bridge's")


# --- Qwen3-VL's Megatron views: mbridge's qwen3_vl bridge tables (mbridge/models/qwen3_vl/__init__.py),
# written out with the TP split of each module Megatron-core builds there: TEColumnParallelLinear /
# TELayerNormColumnParallelLinear "rows", TERowParallelLinear "cols" (bias whole), norms, nn.Conv3d
# and nn.Embedding "whole". Names under {i} are per block, {k} per deepstack merger. ---
Q3_VISION_FIRST = {
    "vision_model.patch_embed.proj.weight": (["model.visual.patch_embed.proj.weight"], "whole"),
    "vision_model.patch_embed.proj.bias": (["model.visual.patch_embed.proj.bias"], "whole"),
    "vision_model.pos_embed.weight": (["model.visual.pos_embed.weight"], "whole"),
}
Q3_VISION_BLOCK = {
    "self_attention.linear_proj.weight": (["attn.proj.weight"], "cols"),
    "self_attention.linear_proj.bias": (["attn.proj.bias"], "whole"),
    "self_attention.linear_qkv.layer_norm_weight": (["norm1.weight"], "whole"),
    "self_attention.linear_qkv.layer_norm_bias": (["norm1.bias"], "whole"),
    "self_attention.linear_qkv.weight": (["attn.qkv.weight"], "rows"),
    "self_attention.linear_qkv.bias": (["attn.qkv.bias"], "rows"),
    "mlp.linear_fc1.layer_norm_weight": (["norm2.weight"], "whole"),
    "mlp.linear_fc1.layer_norm_bias": (["norm2.bias"], "whole"),
    "mlp.linear_fc1.weight": (["mlp.linear_fc1.weight"], "rows"),
    "mlp.linear_fc1.bias": (["mlp.linear_fc1.bias"], "rows"),
    "mlp.linear_fc2.weight": (["mlp.linear_fc2.weight"], "cols"),
    "mlp.linear_fc2.bias": (["mlp.linear_fc2.bias"], "whole"),
}
Q3_MERGER = {  # a deepstack merger's, and the merger's (its HF norm is "norm")
    "patch_norm.weight": (["norm.weight"], "whole"),
    "patch_norm.bias": (["norm.bias"], "whole"),
    "linear_fc1.weight": (["linear_fc1.weight"], "rows"),
    "linear_fc1.bias": (["linear_fc1.bias"], "rows"),
    "linear_fc2.weight": (["linear_fc2.weight"], "cols"),
    "linear_fc2.bias": (["linear_fc2.bias"], "whole"),
}
Q3_TEXT_FIRST = {"language_model.embedding.word_embeddings.weight": (["model.language_model.embed_tokens.weight"], "vocab")}
Q3_TEXT_LAST = {"language_model.decoder.final_layernorm.weight": (["model.language_model.norm.weight"], "whole"),
                "language_model.output_layer.weight": (["lm_head.weight"], "vocab")}
Q3_TEXT_LAYER = {
    "self_attention.linear_proj.weight": (["self_attn.o_proj.weight"], "cols"),
    "self_attention.linear_qkv.layer_norm_weight": (["input_layernorm.weight"], "whole"),
    "self_attention.q_layernorm.weight": (["self_attn.q_norm.weight"], "whole"),
    "self_attention.k_layernorm.weight": (["self_attn.k_norm.weight"], "whole"),
    "self_attention.linear_qkv.weight": (["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"], "rows"),
    "mlp.linear_fc1.weight": (["mlp.gate_proj.weight", "mlp.up_proj.weight"], "halves"),
    "mlp.linear_fc1.layer_norm_weight": (["post_attention_layernorm.weight"], "whole"),
    "mlp.linear_fc2.weight": (["mlp.down_proj.weight"], "cols"),
}


# Qwen3-VL-MoE's layers (all MoE): Megatron-core's SequentialMLP per expert, from the fused tensors
# as transformers holds them in memory ([E, 2F, H] = [gate; up] per expert, [E, H, F]): expert e's
# fc1 is gate_up_proj[e] (mbridge transposes the release's [E, H, 2F] to the same), fc2 is
# down_proj[e]; the experts split by expert TP (here TP's degree) as dense fc1/fc2.
Q3_MOE_LAYER = {k: v for k, v in Q3_TEXT_LAYER.items() if not k.startswith("mlp.")}
Q3_MOE_LAYER.update({
    "pre_mlp_layernorm.weight": (["post_attention_layernorm.weight"], "whole"),
    "mlp.router.weight": (["mlp.gate.weight"], "whole"),
})
Q3_EXPERT = {"linear_fc1.weight": ("mlp.experts.gate_up_proj", "halves"),
             "linear_fc2.weight": ("mlp.experts.down_proj", "cols")}


def q3_tensors(orig):
    """ORIG's tensors as transformers 5 holds them (its module names; experts in its in-memory form)."""
    import transformers
    with open(f"{orig}/config.json") as f:
        model_class = json.load(f)["architectures"][0]
    model = getattr(transformers, model_class).from_pretrained(orig, dtype=torch.bfloat16)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, "Moe" in model_class


def q3_layers(p, pp):
    per = QWEN3_TEXT["num_hidden_layers"] // pp
    return range(p * per, (p + 1) * per)


def q3_entries(p, pp, moe=False):
    """(Megatron name, HF names, split) of pipeline stage P's state dict, as mbridge's Qwen3VLModel
    registers it: the tower whole on the first stage (blocks, deepstack mergers, merger), then the
    language model's share. An expert's entry has HF names (fused tensor, expert)."""
    entries = []
    if p == 0:
        entries += [(k, v[0], v[1]) for k, v in Q3_VISION_FIRST.items()]
        for i in range(QWEN3_VISION["depth"]):
            entries += [(f"vision_model.decoder.layers.{i}.{k}", [f"model.visual.blocks.{i}.{n}" for n in v[0]], v[1])
                        for k, v in Q3_VISION_BLOCK.items()]
        for j in range(len(QWEN3_VISION["deepstack_visual_indexes"])):
            entries += [(f"vision_model.decoder.deepstack_merger_list.{j}.{k}",
                         [f"model.visual.deepstack_merger_list.{j}.{n}" for n in v[0]], v[1]) for k, v in Q3_MERGER.items()]
        entries += [(f"vision_model.merger.{k}", [f"model.visual.merger.{n}" for n in v[0]], v[1]) for k, v in Q3_MERGER.items()]
        entries += [(k, v[0], v[1]) for k, v in Q3_TEXT_FIRST.items()]
    for local, g in enumerate(q3_layers(p, pp)):
        entries += [(f"language_model.decoder.layers.{local}.{k}", [f"model.language_model.layers.{g}.{n}" for n in v[0]], v[1])
                    for k, v in (Q3_MOE_LAYER if moe else Q3_TEXT_LAYER).items()]
        for e in range(QWEN3_MOE["num_experts"] if moe else 0):
            entries += [(f"language_model.decoder.layers.{local}.mlp.experts.local_experts.{e}.{k}",
                         [(f"model.language_model.layers.{g}.{fused}", e)], split) for k, (fused, split) in Q3_EXPERT.items()]
    if p == pp - 1:
        entries += [(k, v[0], v[1]) for k, v in Q3_TEXT_LAST.items()]
    return entries


def q3_hf(hf, name):
    """HF tensor NAME, or (fused name, expert): that expert's matrix."""
    return hf[name[0]][name[1]] if isinstance(name, tuple) else hf[name]


def q3_megatron(orig, meg, tp, pp):
    """Each rank file of MEG (tpTPppPP/ of the tiny Qwen3-VL ORIG): exactly the names, shapes and bytes
    of the reference above (extra states aside), and args with its mrope."""
    hf, moe = q3_tensors(orig)
    divisible = 128 * tp
    vocab_pad = (QWEN3_TEXT["vocab_size"] + divisible - 1) // divisible * divisible
    for p in range(pp):
        for r in range(tp):
            want = {name: tp_share(to_mcore(name, [q3_hf(hf, n) for n in names], QWEN3_TEXT, QWEN3_VISION), split, tp, r,
                                   vocab_pad)
                    for name, names, split in q3_entries(p, pp, moe)}
            ckpt = load_rank(rank_file(meg, p, r, pp))
            got = {k: v for k, v in ckpt["model"].items() if not k.endswith("_extra_state")}
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            bad = [k for k in want if k in got and not (got[k].shape == want[k].shape and torch.equal(got[k], want[k]))]
            args = ckpt["args"]
            rope = (getattr(args, "position_embedding_type", None), getattr(args, "mrope_section", None))
            want_rope = ("mrope", QWEN3_TEXT["rope_parameters"]["mrope_section"])
            what = f"{os.path.basename(orig)} tp{tp}pp{pp} rank ({p}, {r})"
            if missing or extra or bad or rope != want_rope:
                print(f"FAIL {what}: missing {missing[:3]}, unexpected {extra[:3]}, differing {bad[:3]}, rope {rope}")
            else:
                print(f"PASS {what}: {len(want)} tensors with mbridge's names, shapes and bytes; args rope {rope}")


def q3_to_hf(orig, meg, tp, pp, out):
    """ORIG rebuilt from MEG's rank files as mbridge exports them (TP shares gathered, q/k/v and
    fc1 split back), under the module names, with ORIG's config.json."""
    ranks = {(p, r): load_rank(rank_file(meg, p, r, pp))["model"] for p in range(pp) for r in range(tp)}
    moe = "Moe" in json.load(open(f"{orig}/config.json"))["architectures"][0]
    hf, experts = {}, {}
    for p in range(pp):
        for name, hf_names, split in q3_entries(p, pp, moe):
            full = gather([ranks[(p, r)][name] for r in range(tp)], split, QWEN3_TEXT["vocab_size"])
            if isinstance(hf_names[0], tuple):  # an expert's: restacked below
                experts.setdefault(hf_names[0][0], {})[hf_names[0][1]] = full
            elif "linear_qkv" in name and "layer_norm" not in name and name.startswith("vision_model."):
                hf[hf_names[0]] = vision_qkv(full, QWEN3_VISION["num_heads"], QWEN3_VISION["hidden_size"])
            elif "linear_qkv" in name and "layer_norm" not in name:
                hf.update(zip(hf_names, split_qkv(full, QWEN3_TEXT["num_key_value_heads"],
                                                  QWEN3_TEXT["num_attention_heads"], QWEN3_TEXT["head_dim"])))
            elif len(hf_names) == 2:
                hf[hf_names[0]], hf[hf_names[1]] = full.chunk(2, dim=0)
            else:
                hf[hf_names[0]] = full
    for fused, per in experts.items():  # transformers 5's in-memory form, as the original is saved
        hf[fused] = torch.stack([per[e] for e in sorted(per)])
    os.makedirs(out)
    save_st(hf, f"{out}/model.safetensors")
    shutil.copy(f"{orig}/config.json", f"{out}/config.json")


def q3_mcore(orig, ckpt):
    """CKPT (an mcore/ release directory) read by torch.distributed.checkpoint: the tensor keys of
    Megatron-core's sharded_state_dict of mbridge's model (blocks and layers stacked under
    "decoder.layers.", the deepstack mergers under "decoder.deepstack_merger_list." as
    Qwen3VLVisionTransformerBlock offsets them), with the global shapes and bytes."""
    import torch.distributed.checkpoint as dcp
    hf, moe = q3_tensors(orig)
    conv = lambda k, names: to_mcore(k, [hf[n] for n in names], QWEN3_TEXT, QWEN3_VISION)  # noqa: E731
    want = {k: conv(k, v[0]) for k, v in {**Q3_VISION_FIRST, **Q3_TEXT_FIRST, **Q3_TEXT_LAST}.items()}
    for k, (names, _) in Q3_VISION_BLOCK.items():
        want[f"vision_model.decoder.layers.{k}"] = torch.stack(
            [conv(k, [f"model.visual.blocks.{i}.{n}" for n in names]) for i in range(QWEN3_VISION["depth"])])
    for k, (names, _) in Q3_MERGER.items():
        want[f"vision_model.decoder.deepstack_merger_list.{k}"] = torch.stack(
            [conv(k, [f"model.visual.deepstack_merger_list.{j}.{n}" for n in names])
             for j in range(len(QWEN3_VISION["deepstack_visual_indexes"]))])
        want[f"vision_model.merger.{k}"] = conv(k, [f"model.visual.merger.{n}" for n in names])
    layers = range(QWEN3_TEXT["num_hidden_layers"])
    for k, (names, _) in (Q3_MOE_LAYER if moe else Q3_TEXT_LAYER).items():
        want[f"language_model.decoder.layers.{k}"] = torch.stack(
            [conv(k, [f"model.language_model.layers.{g}.{n}" for n in names]) for g in layers])
    for k, (fused, _) in Q3_EXPERT.items() if moe else ():  # [layers, experts, rows, cols]
        want[f"language_model.decoder.layers.mlp.experts.experts.{k}"] = torch.stack(
            [hf[f"model.language_model.layers.{g}.{fused}"] for g in layers])
    meta = dcp.FileSystemReader(ckpt).read_metadata().state_dict_metadata
    tensors = {k for k, m in meta.items() if hasattr(m, "chunks")}
    missing, extra = sorted(set(want) - tensors), sorted(tensors - set(want))
    shapes = [k for k in want if k in meta and tuple(meta[k].size) != tuple(want[k].shape)]
    if missing or extra or shapes:
        print(f"FAIL {os.path.basename(orig)} mcore keys: missing {missing[:3]}, unexpected {extra[:3]}, shapes differ {shapes[:3]}")
        return
    got = {k: torch.empty_like(v) for k, v in want.items()}
    dcp.load(got, checkpoint_id=ckpt)
    bad = [k for k in want if not torch.equal(got[k], want[k])]
    print(f"{'FAIL' if bad else 'PASS'} {os.path.basename(orig)} mcore: the {len(want)} tensor keys of mbridge's model, dcp.load gives its "
          f"tensors bit for bit" + (f" (differing {bad[:3]})" if bad else ""))


def q3_views(orig, meg, out, ckpt):
    q3_megatron(orig, meg, 2, 2)
    q3_to_hf(orig, meg, 2, 2, out)
    logits(orig, [out])
    q3_mcore(orig, ckpt)

def q3_sources(groups):
    """Megatron sources of a Qwen3-VL: groups of (original, hf/ of one source, hf/ of another):
    both hold the original's tensors; transformers loads the first to the original's logits."""
    for orig, first, second in groups:
        samehf(orig, [first, second])
        logits(orig, [first])


MERGERS = "vision_model.decoder.deepstack_merger_list."


def q3_broken(meg, ckpt, out):
    """Copies of a Qwen3-VL's tp2pp2/ (MEG) and mcore/ (CKPT) with their deepstack mergers
    wrong: merger 1 removed from the first rank file, a merger 2 added beside it, and mcore/'s
    stacked merger keys cut to the first merger."""
    first = "release/mp_rank_00_000/model_optim_rng.pt"
    for kind in ("nomerger", "extramerger"):
        shutil.copytree(meg, f"{out}/{kind}")
        sd = torch.load(f"{meg}/{first}", map_location="cpu", weights_only=False)
        model = sd["model"]
        for name in [k for k in model if k.startswith(MERGERS + "1.")]:
            if kind == "nomerger":
                del model[name]
            else:
                value = model[name]
                model[MERGERS + "2." + name[len(MERGERS + "1."):]] = value.clone() if torch.is_tensor(value) else value
        torch.save(sd, f"{out}/{kind}/{first}")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp
    shutil.copytree(ckpt, f"{out}/mcore-nomerger")
    dcp_to_torch_save(ckpt, f"{out}/whole.pt")
    sd = torch.load(f"{out}/whole.pt", map_location="cpu", weights_only=False)
    for name in [k for k in sd if k.startswith(MERGERS) and "_extra_state" not in k]:
        sd[name] = sd[name][:1].clone()
    for name in os.listdir(f"{out}/mcore-nomerger"):
        if name.endswith(".distcp") or name == ".metadata":
            os.remove(f"{out}/mcore-nomerger/{name}")
    torch.save(sd, f"{out}/whole.pt")
    torch_save_to_dcp(f"{out}/whole.pt", f"{out}/mcore-nomerger")

# --- GLM-4.1V (Glm4vForConditionalGeneration) ---

# GLM-4's language model: head_dim 16, half of it rotated (partial_rotary_factor 0.5), so the
# mrope sections cover 4 frequencies.
GLM4V_TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                   "partial_rotary_factor": 0.5, "mrope_section": [1, 1, 2]})
# Two blocks of width 32; the learned position embedding covers 56x56 pixels (4x4 patches),
# interpolated to the image's 8x8 patches; the blocks' MLP is out_hidden_size wide, the merger's
# intermediate_size.
GLM4V_VISION = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=48, out_hidden_size=64,
                    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, image_size=56,
                    in_channels=3)
GLM4V_TOKENS = dict(image_token_id=250, video_token_id=251, image_start_token_id=252,
                    image_end_token_id=253, video_start_token_id=254, video_end_token_id=255)


def glm4v_save(out, config_class, model_class, text):
    import transformers
    torch.manual_seed(0)
    cfg = getattr(transformers, config_class)(text_config=dict(text), vision_config=dict(GLM4V_VISION),
                                              **GLM4V_TOKENS)
    model = getattr(transformers, model_class)(cfg).to(torch.bfloat16)
    with torch.no_grad():  # random norms, so a norm served from the wrong tensor shows
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model.save_pretrained(out)


def glm4v_build(out):
    """OUT/glm4v: a tiny Glm4vForConditionalGeneration saved by save_pretrained in bf16;
    OUT/glm4v-badvision: the same with a vision field no rule reads."""
    glm4v_save(f"{out}/glm4v", "Glm4vConfig", "Glm4vForConditionalGeneration", GLM4V_TEXT)
    shutil.copytree(f"{out}/glm4v", f"{out}/glm4v-badvision")
    with open(f"{out}/glm4v/config.json") as f:
        config = json.load(f)
    config["vision_config"]["use_rope_2d"] = False
    with open(f"{out}/glm4v-badvision/config.json", "w") as f:
        json.dump(config, f, indent=2)


def glm4v_inputs():
    """Text around one image: <|begin_of_image|><|image|> x 16 <|end_of_image|>, then text, with
    the image tokens' type (1) the processor gives for mrope's positions."""
    g = torch.Generator().manual_seed(1)
    t, h, w = GRID
    merged = t * h * w // (GLM4V_VISION["spatial_merge_size"] ** 2)
    ids = ([5, 17, 42, GLM4V_TOKENS["image_start_token_id"]] + [GLM4V_TOKENS["image_token_id"]] * merged +
           [GLM4V_TOKENS["image_end_token_id"], 7, 99, 123, 200, 3])
    patch = 3 * GLM4V_VISION["temporal_patch_size"] * GLM4V_VISION["patch_size"] ** 2
    pixels = torch.randn(t * h * w, patch, generator=g)
    types = [1 if i == GLM4V_TOKENS["image_token_id"] else 0 for i in ids]
    return (torch.tensor([ids]), pixels, torch.tensor([list(GRID)]),
            {"mm_token_type_ids": torch.tensor([types])})


def megatron_all(orig, specs):
    """megatron() on each DIR:TP:PP:VPP of SPECS (pairs with an OUT), then to_hf() of it into OUT."""
    for spec, out in zip(specs[0::2], specs[1::2]):
        meg, tp, pp, vpp = spec.rsplit(":", 3)
        megatron(orig, meg, int(tp), int(pp), int(vpp))
        to_hf(orig, meg, int(tp), int(pp), int(vpp), out)


if __name__ == "__main__":
    {"build": lambda: build(sys.argv[2]),
     "build_qwen3": lambda: build_qwen3(sys.argv[2]),
     "logits": lambda: logits(sys.argv[2], sys.argv[3:]),
     "logits_pairs": lambda: [logits(o, [h]) for o, h in zip(sys.argv[2::2], sys.argv[3::2])],
     "samehf": lambda: samehf(sys.argv[2], sys.argv[3:]),
     "samehf_pairs": lambda: [samehf(o, [h]) for o, h in zip(sys.argv[2::2], sys.argv[3::2])],
     "broken": lambda: broken(sys.argv[2], sys.argv[3]),
     "megatron": lambda: megatron_all(sys.argv[2], sys.argv[3:]),
     "mcore": lambda: [mcore(sys.argv[2], c) for c in sys.argv[3:]],
     "bridge_views": lambda: bridge_views(*sys.argv[2:5]),
     "q3_sources": lambda: q3_sources(zip(sys.argv[2::3], sys.argv[3::3], sys.argv[4::3])),
     "q3_broken": lambda: q3_broken(sys.argv[2], sys.argv[3], sys.argv[4]),
     "q3_views": lambda: [q3_views(*sys.argv[i:i + 4]) for i in range(2, len(sys.argv), 4)],
     "glm4v-build": lambda: glm4v_build(sys.argv[2]),
     "glm4v-logits": lambda: logits(sys.argv[3], sys.argv[4:], sys.argv[2], glm4v_inputs)}[sys.argv[1]]()
