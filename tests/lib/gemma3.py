#!/usr/bin/python3
"""A tiny Gemma 3 text model (Gemma3ForCausalLM) built and saved by transformers 5 itself (run in
the sid root), and the checks of ckptfs's views of it.

  gemma3.py build OUT
      OUT/text: Gemma3ForCausalLM with a tiny config (six layers: five sliding, one full, as
      transformers' layer_types has them; its own head_dim, query_pre_attn_scalar and two rope
      bases), saved by save_pretrained in bf16, norms random; OUT/release: its tensors with the
      1B release's spelling of config.json (top-level rope_local_base_freq and
      sliding_window_pattern, tie_word_embeddings left out); OUT/softcap, OUT/pattern,
      OUT/bidirectional: the same with final_logit_softcapping set, a layer_types Megatron's
      window_attn_skip_freq cannot say, use_bidirectional_attention true.
  gemma3.py check ORIG MCORE_DIR HF_DIR[,HF_DIR...] MEGATRON_DIR:TP:PP OUT [...]
      three checks in one run (torch and transformers load once). Each rank file of
      MEGATRON_DIR (tpTPppPP/ of ORIG) loads with weights_only and holds the names, shapes and
      bytes of Megatron-Bridge's Gemma 3 GPTModel on that rank (written here from
      Megatron-Bridge's gemma3 bridge table and Megatron-core's TP splits) and the args Gemma 3
      needs; ORIG is rebuilt from those rank files the way the bridge exports, into OUT. ORIG,
      each HF_DIR and each OUT loaded by transformers 5 give the same logits (torch.equal) on a text
      longer than the window. MCORE_DIR (mcore/release) read by torch.distributed.checkpoint
      holds the keys, global shapes and bytes of Megatron-core's sharded_state_dict of that
      GPTModel. Prints "PASS what" or "FAIL what: why".
  gemma3.py build-vlm OUT
      OUT/vlm: a tiny Gemma3ForConditionalGeneration (the text model above under text_config, a
      SigLIP tower of 2 blocks on 32x32 images in 8x8 patches, pooled to 4 image tokens) saved by
      save_pretrained in bf16, norms and biases random; OUT/vlm-release: its tensors under the
      releases' names (vision_tower.vision_model.*); OUT/vlm-badvision, OUT/vlm-badtokens,
      OUT/vlm-badact: the same with a vision_config member no rule reads, 9 image tokens (3x3,
      which does not divide 4x4 patches), a vision hidden_act of plain gelu.
  gemma3.py vlm-logits ORIG HF_DIR
      ORIG and HF_DIR loaded by transformers 5 give the same logits (torch.equal) on text around
      an image, and another image changes them (the tower is in the sum). Prints PASS/FAIL lines.
  gemma3.py bridge-check ORIG MEGATRON_DIR MCORE_DIR
      tp2pp2/ (MEGATRON_DIR) and mcore/'s release (MCORE_DIR) served with -o megatron_names=bridge
      against Megatron-Bridge's gemma3_vl bridge tables (bridge_check).
  gemma3.py source-check TEXT_ORIG TEXT_HF[,...] VLM_ORIG VLM_RELEASE VLM_HF[,...] MEGATRON_DIR OUT
      hf/ of Megatron copies of the views mounted as sources: each TEXT_HF holds TEXT_ORIG's
      tensors (names, dtypes, bytes) and gives its logits; each VLM_HF holds VLM_RELEASE's (the
      releases' names) and gives VLM_ORIG's logits on an image + text input. OUT: a copy of
      MEGATRON_DIR whose rank files' args lack rope_local_base_freq.
  gemma3.py vlm-check ORIG HF_DIR MEGATRON_DIR:TP:PP OUT MCORE_DIR
      the VLM's views in one run: HF_DIR's logits as vlm-logits; each rank file of MEGATRON_DIR
      holds the names, shapes and bytes of mbridge's Gemma3Model on that rank (written here from
      mbridge's gemma3 bridge tables and Megatron-core's TP splits) and args with a plain rope;
      the rank files rebuilt as mbridge exports (into OUT) give ORIG's logits; MCORE_DIR read by
      torch.distributed.checkpoint holds that model's keys, global shapes and bytes.
  gemma3.py forward TEXT_ORIG DIR:TP:PP[,...] VLM_ORIG DIR:TP:PP[,...]
      for each layout copy: the forward with Megatron semantics (gemma3_forward.py: every TP
      rank's slice from its own rank file, the stages in order, the VLM's tower and projector on
      the first stage) gives transformers' float32 logits of the source (the text model's on
      TEXT_IDS, the VLM's on its image + text input) to FORWARD_TOL; then each model's first
      TP 2 layout with two TP shares exchanged must no longer match (the negative control).
"""
import json
import math
import os
import shutil
import sys

import torch

from vlm import chunks_of, compare_mcore, gather, load_rank, rank_file, save_st, split_qkv, tp_share

TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, head_dim=24, max_position_embeddings=512,
            rms_norm_eps=1e-6, query_pre_attn_scalar=20, sliding_window=4,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0}},
            tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1)


def text_model(text):
    """A tiny Gemma3ForCausalLM of config fields TEXT in bf16, its norms random so a norm served
    from the wrong tensor shows."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(Gemma3TextConfig(**text)).to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))
    return model


def build(out):
    text_model(TEXT).save_pretrained(f"{out}/text")
    with open(f"{out}/text/config.json") as f:
        config = json.load(f)
    if config.get("layer_types") != ["sliding_attention"] * 5 + ["full_attention"]:
        sys.exit(f"transformers wrote layer_types {config.get('layer_types')}")
    # The 1B release's spelling (transformers 4.50): the two rope bases and the pattern at the top
    # level, no layer_types, tie_word_embeddings left out (transformers ties by default).
    release = {k: v for k, v in config.items() if k not in ("rope_parameters", "layer_types", "tie_word_embeddings",
                                                            "_sliding_window_pattern", "dtype")}
    release.update(rope_theta=TEXT["rope_parameters"]["full_attention"]["rope_theta"],
                   rope_local_base_freq=TEXT["rope_parameters"]["sliding_attention"]["rope_theta"],
                   rope_scaling=None, sliding_window_pattern=6, torch_dtype="bfloat16",
                   transformers_version="4.50.0.dev0")
    os.makedirs(f"{out}/release")
    shutil.copy(f"{out}/text/model.safetensors", f"{out}/release/model.safetensors")
    with open(f"{out}/release/config.json", "w") as f:
        json.dump(release, f, indent=2)
    for form, change in (("softcap", {"final_logit_softcapping": 30.0}),
                         ("pattern", {"layer_types": ["sliding_attention"] * 4 + ["full_attention"] * 2}),
                         ("bidirectional", {"use_bidirectional_attention": True})):
        shutil.copytree(f"{out}/text", f"{out}/{form}")
        with open(f"{out}/{form}/config.json", "w") as f:
            json.dump({**config, **change}, f, indent=2)


# SiglipVisionConfig's fields, tiny: 16 patches an image, pooled 2x2 into 4 tokens; no
# attention-pooling head, as the releases' vision_config says
VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
              num_channels=3, image_size=32, patch_size=8, layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh",
              vision_use_head=False)
VLM = dict(mm_tokens_per_image=4, image_token_index=250, boi_token_index=248, eoi_token_index=249)


def vlm_model(text):
    """A tiny Gemma3ForConditionalGeneration (language model of config fields TEXT, VISION's
    tower) in bf16."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    torch.manual_seed(0)
    config = Gemma3Config(text_config=text, vision_config=VISION, **VLM)
    model = Gemma3ForConditionalGeneration(config).to(torch.bfloat16)
    # Random norms and biases so one served from the wrong tensor shows; the projection starts at
    # zero, which would leave the image out of the logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))
            elif name.endswith("mm_input_projection_weight"):
                p.copy_(0.2 * torch.randn_like(p))
    return model


def build_vlm(out):
    vlm_model(TEXT).save_pretrained(f"{out}/vlm")
    with open(f"{out}/vlm/config.json") as f:
        config = json.load(f)
    if config["vision_config"].get("vision_use_head") is not False:
        sys.exit(f"transformers wrote vision_config {config['vision_config']}")
    from safetensors.torch import load_file
    os.makedirs(f"{out}/vlm-release")
    save_st({name.replace("vision_tower.", "vision_tower.vision_model.", 1): t
             for name, t in load_file(f"{out}/vlm/model.safetensors").items()}, f"{out}/vlm-release/model.safetensors")
    shutil.copy(f"{out}/vlm/config.json", f"{out}/vlm-release/config.json")
    for form, change in (("badvision", {"vision_config": {**config["vision_config"], "position_embedding_type": "rope"}}),
                         ("badtokens", {"mm_tokens_per_image": 9}),
                         ("badact", {"vision_config": {**config["vision_config"], "hidden_act": "gelu"}})):
        shutil.copytree(f"{out}/vlm", f"{out}/vlm-{form}")
        with open(f"{out}/vlm-{form}/config.json", "w") as f:
            json.dump({**config, **change}, f, indent=2)


VLM_IDS = [2, 5, 17, VLM["boi_token_index"]] + [VLM["image_token_index"]] * VLM["mm_tokens_per_image"] + \
    [VLM["eoi_token_index"], 42, 7, 99, 123, 3]
VLM_TYPES = [1 if i == VLM["image_token_index"] else 0 for i in VLM_IDS]


def vlm_logits_of(path, pixels, dtype=torch.bfloat16):
    from transformers import Gemma3ForConditionalGeneration
    model = Gemma3ForConditionalGeneration.from_pretrained(path, dtype=dtype)
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([VLM_IDS]), pixel_values=pixels.to(dtype),
                     token_type_ids=torch.tensor([VLM_TYPES])).logits.float()


def vlm_logits(orig, hf_dir, more_dirs=()):
    g = torch.Generator().manual_seed(1)
    size = VISION["image_size"]
    image, other = torch.randn(1, 3, size, size, generator=g), torch.randn(1, 3, size, size, generator=g)
    want = vlm_logits_of(orig, image)
    for d in (hf_dir,) + tuple(more_dirs):
        got = vlm_logits_of(d, image)
        if torch.equal(want, got):
            print(f"PASS {d}: transformers' logits on an image + text input equal {orig}'s")
        else:
            print(f"FAIL {d}: logits differ from {orig}'s by {(want - got).abs().max().item()}")
    if torch.equal(want, vlm_logits_of(orig, other)):
        print(f"FAIL {orig}: another image gives the same logits (the tower is not in them)")
    else:
        print(f"PASS {orig}: another image gives other logits")


TEXT_IDS = [2, 5, 17, 42, 7, 99, 123, 200, 3, 64, 31, 250]  # 12 tokens, window 4


def logits_of(path, dtype=torch.bfloat16):
    from transformers import Gemma3ForCausalLM
    model = Gemma3ForCausalLM.from_pretrained(path, dtype=dtype)
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([TEXT_IDS])).logits.float()


def logits(orig, hf_dirs):
    want = logits_of(orig)
    for hf_dir in hf_dirs:
        got = logits_of(hf_dir)
        if torch.equal(want, got):
            print(f"PASS {hf_dir}: transformers' logits equal {orig}'s")
        else:
            print(f"FAIL {hf_dir}: logits differ from {orig}'s by {(want - got).abs().max().item()}")


# --- Megatron layouts, written from Megatron-Bridge's gemma3 bridge (NVIDIA-NeMo/Megatron-Bridge,
# src/megatron/bridge/models/gemma/gemma3_bridge.py: mapping_registry, QKVMapping,
# GatedMLPMapping; gemma3_provider.py: TERowParallelLinearLayerNorm's post_layernorm) and
# Megatron-core's TP splits, not from ckptfs ---

# Megatron name -> (HF names, how TP splits it), as vlm.py's tables.
FIRST = {"embedding.word_embeddings.weight": (["model.embed_tokens.weight"], "vocab")}
LAST = {"decoder.final_layernorm.weight": (["model.norm.weight"], "whole")}
# tied embeddings: a later stage's copy of the embedding (Megatron's shared output layer)
LAST_COPY = {"output_layer.weight": (["model.embed_tokens.weight"], "vocab")}
LAYER = {
    "self_attention.linear_qkv.layer_norm_weight": (["input_layernorm.weight"], "whole"),
    "self_attention.q_layernorm.weight": (["self_attn.q_norm.weight"], "whole"),
    "self_attention.k_layernorm.weight": (["self_attn.k_norm.weight"], "whole"),
    "self_attention.linear_proj.weight": (["self_attn.o_proj.weight"], "cols"),
    "self_attention.linear_proj.post_layernorm.weight": (["post_attention_layernorm.weight"], "whole"),
    "mlp.linear_fc1.layer_norm_weight": (["pre_feedforward_layernorm.weight"], "whole"),
    "mlp.linear_fc2.weight": (["mlp.down_proj.weight"], "cols"),
    "mlp.linear_fc2.post_layernorm.weight": (["post_feedforward_layernorm.weight"], "whole"),
    "self_attention.linear_qkv.weight": (["self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                          "self_attn.v_proj.weight"], "rows"),
    "mlp.linear_fc1.weight": (["mlp.gate_proj.weight", "mlp.up_proj.weight"], "halves"),
}


# A legacy TE rank file's order within a layer: torch's state_dict walks a module's own parameters,
# then its _extra_state (TE modules), then its children in registration order. Megatron-core's
# TransformerLayer registers self_attention (Attention: core_attention, linear_proj; SelfAttention:
# linear_qkv, q_layernorm, k_layernorm), then mlp (linear_fc1, linear_fc2); the bridge's
# TERowParallelLinearLayerNorm registers post_layernorm as a child of the linear.
LAYER_ORDER = [
    "self_attention.core_attention._extra_state",
    "self_attention.linear_proj.weight", "self_attention.linear_proj._extra_state",
    "self_attention.linear_proj.post_layernorm.weight", "self_attention.linear_proj.post_layernorm._extra_state",
    "self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.weight",
    "self_attention.linear_qkv._extra_state",
    "self_attention.q_layernorm.weight", "self_attention.q_layernorm._extra_state",
    "self_attention.k_layernorm.weight", "self_attention.k_layernorm._extra_state",
    "mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.weight", "mlp.linear_fc1._extra_state",
    "mlp.linear_fc2.weight", "mlp.linear_fc2._extra_state",
    "mlp.linear_fc2.post_layernorm.weight", "mlp.linear_fc2.post_layernorm._extra_state",
]


def expected_order(p, pp):
    """The keys of stage P's rank file in order (GPTModel: embedding, decoder, output_layer)."""
    out = ["embedding.word_embeddings.weight"] if p == 0 else []
    out += [f"decoder.layers.{local}.{k}" for local in range(len(stage_layers(p, pp))) for k in LAYER_ORDER]
    if p == pp - 1:
        out += ["decoder.final_layernorm.weight", "decoder.final_layernorm._extra_state"]
        out += ["output_layer.weight", "output_layer._extra_state"] if pp > 1 else ["output_layer._extra_state"]
    return out


def to_mcore(name, hf):
    """QKVMapping / GatedMLPMapping: the full Megatron tensor of NAME (q/k/v per query group)."""
    if name.endswith("linear_qkv.weight"):
        groups, heads, d = TEXT["num_key_value_heads"], TEXT["num_attention_heads"], TEXT["head_dim"]
        q, k, v = hf
        parts = [q.reshape(groups, heads // groups * d, -1), k.reshape(groups, d, -1), v.reshape(groups, d, -1)]
        return torch.cat(parts, dim=1).reshape(-1, TEXT["hidden_size"])
    return torch.cat(hf, dim=0) if len(hf) == 2 else hf[0]


def stage_layers(p, pp):
    per = TEXT["num_hidden_layers"] // pp
    return range(p * per, (p + 1) * per)


def entries_of(p, pp):
    """(Megatron name, HF names, split) on pipeline stage P."""
    out = []
    if p == 0:
        out += [(k, v[0], v[1]) for k, v in FIRST.items()]
    for local, g in enumerate(stage_layers(p, pp)):
        out += [(f"decoder.layers.{local}.{k}", [f"model.layers.{g}.{n}" for n in v[0]], v[1]) for k, v in LAYER.items()]
    if p == pp - 1:
        out += [(k, v[0], v[1]) for k, v in LAST.items()]
        if pp > 1:
            out += [(k, v[0], v[1]) for k, v in LAST_COPY.items()]
    return out


def hf_tensors(orig):
    from safetensors.torch import load_file
    return load_file(f"{orig}/model.safetensors")


def vocab_padded(tp):
    divisible = 128 * tp  # Megatron's make_vocab_size_divisible_by x TP
    return (TEXT["vocab_size"] + divisible - 1) // divisible * divisible


# Megatron-core's TransformerConfig fields and Megatron-Bridge's / mbridge's Gemma 3 ones the rank
# files' args must hold (window_size as Megatron-core takes it: (W - 1, 0))
def expected_args():
    rope = TEXT["rope_parameters"]
    return {"window_size": (TEXT["sliding_window"] - 1, 0), "window_attn_skip_freq": 6,
            "rotary_base": int(rope["full_attention"]["rope_theta"]),
            "rope_local_base_freq": rope["sliding_attention"]["rope_theta"],
            "softmax_scale": 1.0 / math.sqrt(TEXT["query_pre_attn_scalar"]),
            "layernorm_zero_centered_gamma": True, "qk_layernorm": True, "swiglu": False,
            "gated_linear_unit": True, "openai_gelu": True, "kv_channels": TEXT["head_dim"],
            "untie_embeddings_and_output_weights": False, "add_bias_linear": False,
            "embed_scale": math.sqrt(TEXT["hidden_size"])}


def megatron(orig, meg, tp, pp):
    hf = hf_tensors(orig)
    what = f"{os.path.basename(meg)} tp{tp}pp{pp}"
    for p in range(pp):
        for r in range(tp):
            want = {f"model/{name}": tp_share(to_mcore(name, [hf[n] for n in names]), split, tp, r, vocab_padded(tp))
                    for name, names, split in entries_of(p, pp)}
            try:
                ckpt = load_rank(rank_file(meg, p, r, pp))
            except Exception as e:  # noqa: BLE001
                print(f"FAIL {what} rank ({p}, {r}): torch.load(weights_only=True): {e}")
                continue
            got = {k: v for k, v in chunks_of(ckpt, 1).items() if not k.endswith("_extra_state")}
            order = list(ckpt["model"]) == expected_order(p, pp)
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            bad = [k for k in want if k in got and not (got[k].shape == want[k].shape and torch.equal(got[k], want[k]))]
            args = vars(ckpt["args"])
            wrong = {k: args.get(k) for k, v in expected_args().items()
                     if not (args.get(k) == v or (isinstance(v, float) and isinstance(args.get(k), float)
                                                  and math.isclose(args[k], v, rel_tol=1e-12)))}
            if missing or extra or bad or wrong or not order:
                print(f"FAIL {what} rank ({p}, {r}): missing {missing[:3]}, unexpected {extra[:3]}, "
                      f"differing {bad[:3]}, args {wrong}, in Megatron's order {order} {list(ckpt['model'])[:12]}")
            else:
                print(f"PASS {what} rank ({p}, {r}): {len(want)} tensors with Megatron-Bridge's names, shapes "
                      f"and bytes, in Megatron's order; args {sorted(expected_args())}")


def to_hf(orig, meg, tp, pp, out):
    """ORIG rebuilt from MEG's rank files as the bridge exports (TP shares gathered, q/k/v and fc1
    split back), saved with ORIG's config.json."""
    ranks = {(p, r): chunks_of(load_rank(rank_file(meg, p, r, pp)), 1) for p in range(pp) for r in range(tp)}
    hf = {}
    for p in range(pp):
        for name, names, split in entries_of(p, pp):
            if name in LAST_COPY:
                continue
            full = gather([ranks[(p, r)][f"model/{name}"] for r in range(tp)], split, TEXT["vocab_size"])
            if name.endswith("linear_qkv.weight"):
                hf.update(zip(names, split_qkv(full, TEXT["num_key_value_heads"], TEXT["num_attention_heads"],
                                               TEXT["head_dim"])))
            elif len(names) == 2:
                hf[names[0]], hf[names[1]] = full.chunk(2, dim=0)
            else:
                hf[names[0]] = full
    os.makedirs(out)
    save_st(hf, f"{out}/model.safetensors")
    shutil.copy(f"{orig}/config.json", f"{out}/config.json")


def mcore(orig, ckpt):
    """mcore/ read by torch.distributed.checkpoint: each layer weight stacked on a leading axis
    under "decoder.layers.", the vocabulary unpadded; no output layer (tied)."""
    hf = hf_tensors(orig)
    want = {k: to_mcore(k, [hf[n] for n in v[0]]) for k, v in {**FIRST, **LAST}.items()}
    # padded for the largest TP the model allows (its 4 heads), as docs/torch-dist.md says
    embedding = torch.zeros(vocab_padded(4), TEXT["hidden_size"], dtype=hf["model.embed_tokens.weight"].dtype)
    embedding[: TEXT["vocab_size"]] = want["embedding.word_embeddings.weight"]
    want["embedding.word_embeddings.weight"] = embedding
    for k, (names, _) in LAYER.items():
        want[f"decoder.layers.{k}"] = torch.stack(
            [to_mcore(k, [hf[f"model.layers.{g}.{n}"] for n in names]) for g in range(TEXT["num_hidden_layers"])])
    compare_mcore(want, ckpt, "", "Megatron-Bridge's")


def check(orig, mcore_dir, hf_dirs, specs):
    """All of the above in one run (transformers and torch load once): megatron() and to_hf() of
    each DIR:TP:PP of SPECS (pairs with an OUT), logits() of HF_DIRS (comma-separated) and each
    OUT, mcore()."""
    outs = []
    for spec, out in zip(specs[0::2], specs[1::2]):
        meg, tp, pp = spec.rsplit(":", 2)
        megatron(orig, meg, int(tp), int(pp))
        to_hf(orig, meg, int(tp), int(pp), out)
        outs.append(out)
    logits(orig, hf_dirs.split(",") + outs)
    mcore(orig, mcore_dir)


# --- Gemma 3's VLM as mbridge builds it, written from mbridge's gemma3 bridge (ISEEKYAN/mbridge,
# mbridge/models/gemma3/__init__.py: _DIRECT_MAPPING, _ATTENTION_MAPPING, _MLP_MAPPING,
# _OTHER_MAPPING, _weight_to_mcore_format; model.py: Gemma3Model registers language_model, then
# vision_model (CLIPViTModel, siglip), then vision_projection; projector.py: mm_input_projection a
# TELayerNormColumnParallelLinear) and Megatron-core's TP splits, not from ckptfs. HF names are
# mbridge's (the release's); transformers 5 saves the tower without "vision_model.". ---

V_FIRST = {  # mbridge name -> (HF names, TP split)
    "vision_model.position_embeddings.weight": (["vision_tower.vision_model.embeddings.position_embedding.weight"], "whole"),
    "vision_model.conv1.weight": (["vision_tower.vision_model.embeddings.patch_embedding.weight"], "whole"),
    "vision_model.conv1.bias": (["vision_tower.vision_model.embeddings.patch_embedding.bias"], "whole"),
    "vision_model.ln_post.weight": (["vision_tower.vision_model.post_layernorm.weight"], "whole"),
    "vision_model.ln_post.bias": (["vision_tower.vision_model.post_layernorm.bias"], "whole"),
    "vision_projection.mm_input_projection.layer_norm_weight": (["multi_modal_projector.mm_soft_emb_norm.weight"], "whole"),
    # ColumnParallel over the language model's width: rows of the transposed weight
    "vision_projection.mm_input_projection.weight": (["multi_modal_projector.mm_input_projection_weight"], "rows"),
}
V_LAYER = {  # after "vision_model.decoder.layers.N." / "vision_tower.vision_model.encoder.layers.N."
    "self_attention.linear_qkv.weight": (["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"], "rows"),
    "self_attention.linear_qkv.bias": (["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"], "rows"),
    "self_attention.linear_proj.weight": (["self_attn.out_proj.weight"], "cols"),
    "self_attention.linear_proj.bias": (["self_attn.out_proj.bias"], "whole"),
    "self_attention.linear_qkv.layer_norm_weight": (["layer_norm1.weight"], "whole"),
    "self_attention.linear_qkv.layer_norm_bias": (["layer_norm1.bias"], "whole"),
    "mlp.linear_fc2.weight": (["mlp.fc2.weight"], "cols"),
    "mlp.linear_fc2.bias": (["mlp.fc2.bias"], "whole"),
    "mlp.linear_fc1.weight": (["mlp.fc1.weight"], "rows"),
    "mlp.linear_fc1.bias": (["mlp.fc1.bias"], "rows"),
    "mlp.linear_fc1.layer_norm_weight": (["layer_norm2.weight"], "whole"),
    "mlp.linear_fc1.layer_norm_bias": (["layer_norm2.bias"], "whole"),
}
L_FIRST = {"language_model.embedding.word_embeddings.weight": (["language_model.model.embed_tokens.weight"], "vocab")}
L_LAST = {"language_model.decoder.final_layernorm.weight": (["language_model.model.norm.weight"], "whole")}
L_LAST_COPY = {"language_model.output_layer.weight": (["language_model.model.embed_tokens.weight"], "vocab")}
L_LAYER = {  # after "language_model.decoder.layers.N." / "language_model.model.layers.N."
    "self_attention.linear_qkv.weight": (["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"], "rows"),
    "self_attention.linear_proj.weight": (["self_attn.o_proj.weight"], "cols"),
    "self_attention.linear_qkv.layer_norm_weight": (["input_layernorm.weight"], "whole"),
    "self_attention.q_layernorm.weight": (["self_attn.q_norm.weight"], "whole"),
    "self_attention.k_layernorm.weight": (["self_attn.k_norm.weight"], "whole"),
    "mlp.linear_fc1.weight": (["mlp.gate_proj.weight", "mlp.up_proj.weight"], "halves"),
    "mlp.linear_fc2.weight": (["mlp.down_proj.weight"], "cols"),
    "mlp.linear_fc1.layer_norm_weight": (["pre_feedforward_layernorm.weight"], "whole"),
    "post_attention_layernorm.weight": (["post_attention_layernorm.weight"], "whole"),
    "post_feedforward_layernorm.weight": (["post_feedforward_layernorm.weight"], "whole"),
}


def saved(name):
    """mbridge's HF name as transformers 5 saves it."""
    return name.replace("vision_tower.vision_model.", "vision_tower.", 1)


def vlm_to_mcore(name, hf):
    """_weight_to_mcore_format: q/k/v per key/value head (the tower's: one per head), fc1 = [gate;
    up], the projection transposed."""
    if name == "vision_projection.mm_input_projection.weight":
        return hf[0].T.contiguous()
    if "linear_qkv." in name and "layer_norm" not in name:
        cfg = TEXT if name.startswith("language_model.") else VISION
        heads = cfg["num_attention_heads"]
        groups = cfg.get("num_key_value_heads", heads)
        d = cfg.get("head_dim", cfg["hidden_size"] // heads)
        q, k, v = hf
        rest = tuple(q.shape[1:])
        return torch.cat([q.reshape((groups, heads // groups * d) + rest), k.reshape((groups, d) + rest),
                          v.reshape((groups, d) + rest)], dim=1).reshape((-1,) + rest)
    return torch.cat(hf, dim=0) if len(hf) == 2 else hf[0]


def vlm_entries(p, pp):
    """(mbridge name, HF names, split) on pipeline stage P: the language model's stage, then on the
    first stage the tower and the projector (add_encoder = pre_process)."""
    out = [(k, *v) for k, v in L_FIRST.items()] if p == 0 else []
    per = TEXT["num_hidden_layers"] // pp
    for local, g in enumerate(range(p * per, (p + 1) * per)):
        out += [(f"language_model.decoder.layers.{local}.{k}", [f"language_model.model.layers.{g}.{n}" for n in v[0]], v[1])
                for k, v in L_LAYER.items()]
    if p == pp - 1:
        out += [(k, *v) for k, v in L_LAST.items()] + ([(k, *v) for k, v in L_LAST_COPY.items()] if pp > 1 else [])
    if p == 0:
        out += [(k, *v) for k, v in V_FIRST.items()]
        for b in range(VISION["num_hidden_layers"]):
            out += [(f"vision_model.decoder.layers.{b}.{k}",
                     [f"vision_tower.vision_model.encoder.layers.{b}.{n}" for n in v[0]], v[1]) for k, v in V_LAYER.items()]
    return out


def vlm_megatron(orig, meg, tp, pp):
    hf = {n: t for n, t in hf_tensors(orig).items()}
    what = f"{os.path.basename(meg)} tp{tp}pp{pp}"
    for p in range(pp):
        for r in range(tp):
            want = {f"model/{name}": tp_share(vlm_to_mcore(name, [hf[saved(n)] for n in names]), split, tp, r,
                                              vocab_padded(tp))
                    for name, names, split in vlm_entries(p, pp)}
            try:
                ckpt = load_rank(rank_file(meg, p, r, pp))
            except Exception as e:  # noqa: BLE001
                print(f"FAIL {what} rank ({p}, {r}): torch.load(weights_only=True): {e}")
                continue
            got = {k: v for k, v in chunks_of(ckpt, 1).items() if not k.endswith("_extra_state")}
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            bad = [k for k in want if k in got and not (got[k].shape == want[k].shape and torch.equal(got[k], want[k]))]
            # the modules in Gemma3Model's registration order
            modules = list(dict.fromkeys(k.split(".")[0] for k in ckpt["model"]))
            order = modules == (["language_model", "vision_model", "vision_projection"] if p == 0 else ["language_model"])
            args = vars(ckpt["args"])
            rope = args.get("position_embedding_type") == "rope" and "mrope_section" not in args
            if missing or extra or bad or not order or not rope:
                print(f"FAIL {what} rank ({p}, {r}): missing {missing[:3]}, unexpected {extra[:3]}, differing "
                      f"{bad[:3]}, modules {modules}, position_embedding_type {args.get('position_embedding_type')}")
            else:
                print(f"PASS {what} rank ({p}, {r}): {len(want)} tensors with mbridge's names, shapes and bytes, "
                      f"modules in Gemma3Model's order, a plain rope")


def vlm_to_hf(orig, meg, tp, pp, out):
    """ORIG rebuilt from MEG's rank files as mbridge exports (_weight_to_hf_format: TP shares
    gathered, q/k/v split per head group, fc1 halves, the projection transposed back)."""
    ranks = {(p, r): chunks_of(load_rank(rank_file(meg, p, r, pp)), 1) for p in range(pp) for r in range(tp)}
    hf = {}
    for p in range(pp):
        for name, names, split in vlm_entries(p, pp):
            if name in L_LAST_COPY:
                continue
            full = gather([ranks[(p, r)][f"model/{name}"] for r in range(tp)], split, TEXT["vocab_size"])
            names = [saved(n) for n in names]
            if name == "vision_projection.mm_input_projection.weight":
                hf[names[0]] = full.T.contiguous()
            elif len(names) == 3:
                cfg = TEXT if name.startswith("language_model.") else VISION
                heads = cfg["num_attention_heads"]
                hf.update(zip(names, split_qkv(full, cfg.get("num_key_value_heads", heads), heads,
                                               cfg.get("head_dim", cfg["hidden_size"] // heads))))
            elif len(names) == 2:
                hf[names[0]], hf[names[1]] = full.chunk(2, dim=0)
            else:
                hf[names[0]] = full
    os.makedirs(out)
    save_st(hf, f"{out}/model.safetensors")
    shutil.copy(f"{orig}/config.json", f"{out}/config.json")


def vlm_mcore(orig, ckpt):
    """mcore/: each module's layer weights stacked under "decoder.layers.", the vocabulary padded for
    the largest TP of 1, 2, 4, 8 that splits the tower (its 2 heads: 2)."""
    hf = hf_tensors(orig)
    want = {k: vlm_to_mcore(k, [hf[saved(n)] for n in v[0]]) for k, v in {**L_FIRST, **L_LAST, **V_FIRST}.items()}
    embedding = torch.zeros(vocab_padded(2), TEXT["hidden_size"], dtype=hf["language_model.model.embed_tokens.weight"].dtype)
    embedding[: TEXT["vocab_size"]] = want["language_model.embedding.word_embeddings.weight"]
    want["language_model.embedding.word_embeddings.weight"] = embedding
    for prefix, hf_prefix, table, count in (
            ("language_model.decoder.layers.", "language_model.model.layers.", L_LAYER, TEXT["num_hidden_layers"]),
            ("vision_model.decoder.layers.", "vision_tower.vision_model.encoder.layers.", V_LAYER, VISION["num_hidden_layers"])):
        for k, (names, _) in table.items():
            want[prefix + k] = torch.stack(
                [vlm_to_mcore(prefix + k, [hf[saved(f"{hf_prefix}{g}.{n}")] for n in names]) for g in range(count)])
    compare_mcore(want, ckpt, "vlm ", "mbridge's Gemma3Model")


# --- Gemma 3's VLM as Megatron-Bridge builds it (-o megatron_names=bridge), written from its gemma3_vl
# bridge (NVIDIA-NeMo/Megatron-Bridge, src/megatron/bridge/models/gemma_vl/gemma3_vl_bridge.py:
# Gemma3VLBridge.mapping_registry; modeling_gemma3_vl.py: Gemma3VLModel registers vision_tower
# (transformers' SigLIP vision_model, vision_use_head False), multi_modal_projector
# (Gemma3VLMultimodalProjector: mm_soft_embed_norm, then proj, a ColumnParallelLinear), then
# language_model) and Megatron-core's TP splits, not from ckptfs. HF names as transformers 5 saves
# them. ---
B_TEXT = {  # the bridge's param_mappings, QKVMapping and GatedMLPMapping: Megatron -> (HF, split); "*" a layer
    "language_model.embedding.word_embeddings.weight": (["language_model.model.embed_tokens.weight"], "vocab"),
    "language_model.decoder.layers.*.self_attention.linear_qkv.layer_norm_weight": (["language_model.model.layers.*.input_layernorm.weight"], "whole"),
    "language_model.decoder.layers.*.self_attention.q_layernorm.weight": (["language_model.model.layers.*.self_attn.q_norm.weight"], "whole"),
    "language_model.decoder.layers.*.self_attention.k_layernorm.weight": (["language_model.model.layers.*.self_attn.k_norm.weight"], "whole"),
    "language_model.decoder.layers.*.self_attention.linear_proj.weight": (["language_model.model.layers.*.self_attn.o_proj.weight"], "cols"),
    "language_model.decoder.layers.*.self_attention.linear_proj.post_layernorm.weight": (["language_model.model.layers.*.post_attention_layernorm.weight"], "whole"),
    "language_model.decoder.layers.*.mlp.linear_fc1.layer_norm_weight": (["language_model.model.layers.*.pre_feedforward_layernorm.weight"], "whole"),
    "language_model.decoder.layers.*.mlp.linear_fc2.weight": (["language_model.model.layers.*.mlp.down_proj.weight"], "cols"),
    "language_model.decoder.layers.*.mlp.linear_fc2.post_layernorm.weight": (["language_model.model.layers.*.post_feedforward_layernorm.weight"], "whole"),
    "language_model.decoder.final_layernorm.weight": (["language_model.model.norm.weight"], "whole"),
    "language_model.decoder.layers.*.self_attention.linear_qkv.weight": (
        ["language_model.model.layers.*.self_attn.q_proj.weight", "language_model.model.layers.*.self_attn.k_proj.weight",
         "language_model.model.layers.*.self_attn.v_proj.weight"], "rows"),
    "language_model.decoder.layers.*.mlp.linear_fc1.weight": (
        ["language_model.model.layers.*.mlp.gate_proj.weight", "language_model.model.layers.*.mlp.up_proj.weight"], "halves"),
}
B_PROJECTOR = {  # AutoMapping of the norm; proj.weight = mm_input_projection_weight permuted (1, 0)
    "multi_modal_projector.mm_soft_embed_norm.weight": (["multi_modal_projector.mm_soft_emb_norm.weight"], "whole"),
    "multi_modal_projector.proj.weight": (["multi_modal_projector.mm_input_projection_weight"], "rows"),
}


def bridge_tower(orig):
    """vision_tower's names in its order: transformers' SigLIP built from ORIG's vision_config as
    Gemma3VLModel builds it (AutoModel.from_config, its vision_model, no head)."""
    from transformers import AutoModel, Gemma3Config
    vc = Gemma3Config.from_pretrained(orig).vision_config
    vc.vision_use_head = False
    raw = AutoModel.from_config(vc)
    return ["vision_tower." + k for k in getattr(raw, "vision_model", raw).state_dict()]


def bridge_to_mcore(name, hf):
    if name == "multi_modal_projector.proj.weight":
        return hf[0].T.contiguous()
    return to_mcore(name, hf)


def bridge_check(orig, meg, ckpt):
    """MEG (tp2pp2/ under -o megatron_names=bridge) and CKPT (its mcore/ release) against
    Megatron-Bridge's Gemma3VLModel: each rank file's names, shapes and bytes, its modules in that
    order (the tower's tensors in the SigLIP module's); mcore/'s keys (the tower's one each),
    global shapes and bytes."""
    hf = hf_tensors(orig)
    tower = bridge_tower(orig)
    tp, pp = 2, 2
    per = TEXT["num_hidden_layers"] // pp
    for p in range(pp):
        entries = [(n, [n], "whole") for n in tower] + [(k, *v) for k, v in B_PROJECTOR.items()] if p == 0 else []
        for k, (names, split) in B_TEXT.items():
            if "*" in k:
                entries += [(k.replace("*", str(g - p * per)), [n.replace("*", str(g)) for n in names], split)
                            for g in range(p * per, (p + 1) * per)]
            elif "embedding" in k and p == 0 or "final_layernorm" in k and p == pp - 1:
                entries.append((k, names, split))
        if p == pp - 1:  # tied: Megatron's output layer on the last stage, a copy of the embedding
            entries.append(("language_model.output_layer.weight", ["language_model.model.embed_tokens.weight"], "vocab"))
        for r in range(tp):
            want = {k: tp_share(bridge_to_mcore(k, [hf[n] for n in names]), split, tp, r, vocab_padded(tp))
                    for k, names, split in entries}
            ckpt_r = load_rank(rank_file(meg, p, r, pp))["model"]
            got = {k: v for k, v in ckpt_r.items() if not k.endswith("_extra_state")}
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            bad = [k for k in want if k in got and not (got[k].shape == want[k].shape and torch.equal(got[k], want[k]))]
            modules = list(dict.fromkeys(k.split(".")[0] for k in ckpt_r))
            order = (modules == ["vision_tower", "multi_modal_projector", "language_model"] and list(got)[:len(tower)] == tower
                     if p == 0 else modules == ["language_model"])
            label = f"bridge tp2pp2 rank ({p}, {r})"
            if missing or extra or bad or not order:
                print(f"FAIL {label}: missing {missing[:3]}, unexpected {extra[:3]}, differing {bad[:3]}, modules {modules}")
            else:
                print(f"PASS {label}: {len(want)} tensors with Megatron-Bridge's names, shapes and bytes"
                      + (", modules in Gemma3VLModel's order" if p == 0 else ""))
    want = {n: hf[n] for n in tower}
    want.update({k: bridge_to_mcore(k, [hf[n] for n in v[0]]) for k, v in B_PROJECTOR.items()})
    for k, (names, _) in B_TEXT.items():
        if "*" in k:
            want[k.replace("*.", "")] = torch.stack([to_mcore(k, [hf[n.replace("*", str(g))] for n in names])
                                                     for g in range(TEXT["num_hidden_layers"])])
        else:
            want[k] = to_mcore(k, [hf[n] for n in names])
    # padded for the largest TP the model allows (its 4 heads; the tower splits nothing)
    k = "language_model.embedding.word_embeddings.weight"
    want[k] = tp_share(want[k], "vocab", 1, 0, vocab_padded(4))
    compare_mcore(want, ckpt, "bridge ", "Megatron-Bridge's")


def vlm_check(orig, hf_dir, spec, out, mcore_dir):
    meg, tp, pp = spec.rsplit(":", 2)
    vlm_megatron(orig, meg, int(tp), int(pp))
    vlm_to_hf(orig, meg, int(tp), int(pp), out)
    vlm_logits(orig, hf_dir, (out,))
    vlm_mcore(orig, mcore_dir)


# --- The forward with Megatron semantics (gemma3_forward.py) over every rank file of a layout,
# against transformers' own forward of the source in float32 (its bf16 weights upcast) ---
# Both sides float32: what is left is the order of the sums (about 1e-6); torch's erf gelu in
# place of the tanh one is 4e-5 off.
FORWARD_TOL = 1e-5


def forward_check(orig, specs, vlm):
    """For each DIR:TP:PP of SPECS: gemma3_forward.forward over every rank file of DIR equals
    transformers' float32 logits of ORIG (the VLM's on its image + text input). Then a negative
    control: the first TP 2 layout again with two TP shares exchanged (the tower's first qkv, or
    the text model's first linear_fc1) must no longer match."""
    import numpy as np
    from gemma3_forward import Settings, forward
    if vlm:
        with open(f"{orig}/config.json") as f:
            config = json.load(f)
        size = config["vision_config"]["image_size"]
        # bf16 pixels, as vlm_logits gives them, seen in float32 by both sides
        image = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).float()
        want = vlm_logits_of(orig, image, torch.float32)[0].numpy()
        inputs = dict(tokens=VLM_IDS, types=VLM_TYPES, vision=config["vision_config"], pixels=image[0].numpy(),
                      image_token=config["image_token_index"], mm_tokens=config["mm_tokens_per_image"])
        what, control_key = "an image + text input", "vision_model.decoder.layers.0.self_attention.linear_qkv.weight"
    else:
        want = logits_of(orig, torch.float32)[0].numpy()
        inputs = dict(tokens=TEXT_IDS)
        what, control_key = "a text longer than the window", "decoder.layers.0.mlp.linear_fc1.weight"
    err = lambda got: float(np.abs(got - want).max() / np.abs(want).max())  # noqa: E731
    control = None
    for spec in specs:
        meg, tp, pp = spec.rsplit(":", 2)
        tp, pp = int(tp), int(pp)
        files = [[load_rank(rank_file(meg, p, r, pp)) for r in range(tp)] for p in range(pp)]
        settings = Settings(files[0][0]["args"], vlm)
        stages = [[f["model"] for f in stage] for stage in files]
        e = err(forward(stages, settings, **inputs))
        label = f"{os.path.basename(meg)} tp{tp}pp{pp}: the forward with Megatron semantics over its {tp * pp} rank files"
        print(f"{'PASS' if e < FORWARD_TOL else 'FAIL'} {label} gives transformers' float32 logits of "
              f"{os.path.basename(orig)} on {what} (max relative error {e:.2g}, tolerance {FORWARD_TOL:g})")
        if control is None and tp == 2:
            control = (os.path.basename(meg), stages, settings)
    if control is None:
        raise ValueError("the negative control needs a TP 2 layout")
    name, stages, settings = control
    broken = [dict(sd) for sd in stages[0]]
    broken[0][control_key], broken[1][control_key] = broken[1][control_key], broken[0][control_key]
    e = err(forward([broken] + stages[1:], settings, **inputs))
    print(f"{'FAIL' if e < FORWARD_TOL else 'PASS'} {name}: with the two TP shares of {control_key} exchanged "
          f"the forward no longer gives transformers' logits (max relative error {e:.2g})")


def forward_both(text_orig, text_specs, vlm_orig, vlm_specs):
    """forward_check of the text model's layouts, then of the VLM's (comma-separated DIR:TP:PP),
    in one process."""
    forward_check(text_orig, text_specs.split(","), False)
    forward_check(vlm_orig, vlm_specs.split(","), True)


# --- Megatron checkpoints of Gemma 3 as sources: hf/ of a copy of the views ---

def same_tensors(want_dir, got_dir):
    want, got = hf_tensors(want_dir), hf_tensors(got_dir)
    differ = sorted(set(want) ^ set(got)) or \
        [n for n in want if want[n].dtype != got[n].dtype or not torch.equal(want[n], got[n])]
    if differ:
        print(f"FAIL {got_dir}: tensors differ from {want_dir}'s: {differ[:3]}")
    else:
        print(f"PASS {got_dir}: the {len(got)} tensors of {want_dir}, names, dtypes and bytes")


def drop_arg(meg, out, key):
    """A copy of the rank files of MEG in OUT whose args lack KEY."""
    shutil.copytree(meg, out)
    for root, _, files in os.walk(out):
        for f in files:
            if f.endswith(".pt"):
                sd = torch.load(f"{root}/{f}", map_location="cpu", weights_only=False)
                delattr(sd["args"], key)
                torch.save(sd, f"{root}/{f}")


def source_check(text_orig, text_hf, vlm_orig, vlm_release, vlm_hf, meg, out):
    """hf/ of Megatron sources in one run: each of TEXT_HF (comma-separated) holds TEXT_ORIG's
    tensors and gives its logits; each of VLM_HF holds VLM_RELEASE's (the releases' names) and
    gives VLM_ORIG's logits on an image + text input. OUT: MEG's rank files without
    args.rope_local_base_freq."""
    text_dirs, vlm_dirs = text_hf.split(","), vlm_hf.split(",")
    for d in text_dirs:
        same_tensors(text_orig, d)
    logits(text_orig, text_dirs)
    image = torch.randn(1, 3, VISION["image_size"], VISION["image_size"], generator=torch.Generator().manual_seed(1))
    want = vlm_logits_of(vlm_orig, image)
    for d in vlm_dirs:
        same_tensors(vlm_release, d)
        got = vlm_logits_of(d, image)
        print(f"PASS {d}: transformers' logits on an image + text input equal {vlm_orig}'s" if torch.equal(want, got)
              else f"FAIL {d}: logits differ from {vlm_orig}'s by {(want - got).abs().max().item()}")
    drop_arg(meg, out, "rope_local_base_freq")


if __name__ == "__main__":
    {"build": lambda: build(sys.argv[2]),
     "build-vlm": lambda: build_vlm(sys.argv[2]),
     "vlm-logits": lambda: vlm_logits(sys.argv[2], sys.argv[3]),
     "vlm-check": lambda: vlm_check(*sys.argv[2:7]),
     "bridge-check": lambda: bridge_check(*sys.argv[2:5]),
     "check": lambda: check(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]),
     "source-check": lambda: source_check(*sys.argv[2:9]),
     "forward": lambda: forward_both(*sys.argv[2:6])}[sys.argv[1]]()
