#!/usr/bin/python3
"""Qwen3.5's releases' VLM form (Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration),
tiny, built and saved by transformers 5 itself (run in the sid root), and the checks of ckptfs's views.

  qwen35vl.py build OUT
      OUT/dense: Qwen3_5ForConditionalGeneration (TEXT: 4 hybrid layers, every other one full
      attention, interleaved mrope over a quarter of each head; VISION: Qwen3-VL's tower without
      deepstack mergers) saved by save_pretrained in bf16; OUT/moe: the same tower with
      Qwen3_5MoeForConditionalGeneration's text model (4 experts and a gated shared one), saved
      per expert; OUT/moe-fused: the same with its experts fused as transformers holds them and
      as the releases hold them (mlp.experts.gate_up_proj [E, 2F, H], down_proj [E, H, F]);
      OUT/deepstack: dense with Qwen3-VL's deepstack_visual_indexes in its vision_config (a field
      Qwen3_5VisionConfig does not have).
  qwen35vl.py check ORIG HF_DIR MEGATRON_DIR MCORE_DIR WORK MEG_HF MCORE_HF NOTOWER [...]
      ORIG and HF_DIR loaded by transformers 5 give the same logits (torch.equal) on an image +
      text input (which another image changes). ORIG's tp2pp2 copy MEGATRON_DIR against mbridge's qwen3_5 bridge: each rank file holds, in
      order and bit for bit, transformers' Qwen3_5VisionModel's state dict (the module mbridge
      builds, named vision_model.* as its tables map model.visual.*) whole on every rank of the
      first stage, then the language model as gdn_reference.py has the bridges make it, under
      language_model.; the args say mrope with ORIG's sections. MCORE_DIR (mcore/'s release)
      read by torch.distributed.checkpoint holds the same: the tower a key per tensor (Megatron's
      sharded_state_dict_default of a plain module), the language model's keys as
      gdn_reference.py's. WORK: a scratch directory. MEG_HF and MCORE_HF (hf/ of the copies
      mounted as sources) hold ORIG's tensors under the release's names, byte for byte. NOTOWER:
      MEGATRON_DIR copied with vision_model.blocks.1.attn.qkv.weight removed from its first rank
      file. Prints "PASS what" or "FAIL what: why".
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
    return model


def build(out):
    save(f"{out}/dense", "Qwen3_5Config", "Qwen3_5ForConditionalGeneration", TEXT)
    moe = save(f"{out}/moe", "Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration", MOE)
    from safetensors.torch import save_file
    os.makedirs(f"{out}/moe-fused")
    shutil.copy(f"{out}/moe/config.json", f"{out}/moe-fused")
    state = {k: t.contiguous() for k, t in moe.state_dict().items()}
    if not any(k.endswith("mlp.experts.gate_up_proj") for k in state):
        sys.exit("moe: transformers holds its experts otherwise than fused")
    save_file(state, f"{out}/moe-fused/model.safetensors", metadata={"format": "pt"})
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


class LanguageModel:
    """gdn_reference.py's Source of ORIG's language model: text_config, its tensors under
    model.language_model. (lm_head.weight as it is)."""

    def __new__(cls, orig, work):
        import gdn_reference as gdn

        os.makedirs(work, exist_ok=True)
        with open(f"{orig}/config.json") as f, open(f"{work}/config.json", "w") as out:
            json.dump(json.load(f)["text_config"], out)
        link = f"{work}/model.safetensors"
        if not os.path.exists(link):
            os.symlink(os.path.abspath(f"{orig}/model.safetensors"), link)
        source = gdn.Source(work)
        lm = "model.language_model."
        source.raw = {("model." + k[len(lm):] if k.startswith(lm) else k): v for k, v in source.raw.items()
                      if not k.startswith("model.visual.")}
        return source


def tower(orig):
    """[(name, bits)] of mbridge's vision_model: transformers' vision module built from ORIG's
    vision_config (as the bridge builds it: HfVisionClass._from_config), its state dict's names in
    order, each filled from model.visual.NAME (the bridge's tables)."""
    import numpy as np
    import transformers
    from gdn_reference import bits_of
    from safetensors.torch import load_file
    cfg = transformers.AutoConfig.from_pretrained(orig)
    cls = {"qwen3_5": transformers.Qwen3_5VisionModel, "qwen3_5_moe": transformers.Qwen3_5MoeVisionModel}
    names = list(cls[cfg.model_type]._from_config(cfg.vision_config).state_dict())
    hf = load_file(f"{orig}/model.safetensors")
    return [("vision_model." + n, np.ascontiguousarray(bits_of(torch, hf["model.visual." + n]))) for n in names]


def check_ranks(orig, meg, work):
    import numpy as np
    import gdn_reference as gdn
    from moe_reference import file_name, parse_moe_layout, rank_grid
    s = LanguageModel(orig, work)
    vision = tower(orig)
    tp, pp, vpp, ep, etp = parse_moe_layout("tp2pp2")
    sections = json.load(open(f"{orig}/config.json"))["text_config"]["rope_parameters"]["mrope_section"]
    bad, n = [], 0
    for p in range(pp):
        for t, e, x, writes in rank_grid(tp, ep, etp):
            if not writes:
                continue
            f = torch.load(f"{meg}/release/{file_name(t, p, e, pp, ep)}/model_optim_rng.pt", map_location="cpu",
                           weights_only=False)
            want = (vision if p == 0 else []) + [("language_model." + k, v) for k, v in
                                                  gdn.chunk_entries(s, tp, pp, vpp, p, 0, t, e, ep, x, etp)]
            got = list(f["model"].items())
            if [k for k, _ in got] != [k for k, _ in want]:
                extra = sorted(set(k for k, _ in got) ^ set(k for k, _ in want))
                bad.append(f"rank {t} stage {p}: the names or their order differ ({extra[:3]})")
                continue
            for (k, g), (_, w) in zip(got, want):
                if (w is None) != (g is None or not torch.is_tensor(g)) or \
                        (w is not None and not np.array_equal(gdn.bits_of(torch, g).reshape(w.shape), w)):
                    bad.append(f"rank {t} stage {p}: {k} differs")
                n += 1
            a = f["args"]
            if (a.position_embedding_type, list(a.mrope_section)) != ("mrope", sections):
                bad.append(f"rank {t} stage {p}: args {a.position_embedding_type} {a.mrope_section}")
    print(f"{'FAIL' if bad or not n else 'PASS'} {meg}: {n} entries of the tower and the language model as mbridge's "
          f"qwen3_5 bridge has them on each rank" + (f" ({bad[:3]})" if bad else ""))


def check_mcore(orig, release, work):
    import numpy as np
    import torch.distributed.checkpoint as dcp
    import gdn_reference as gdn
    s = LanguageModel(orig, work)
    want = {"language_model." + k: v for k, v in gdn.expected_mcore(s).items()}
    want.update(tower(orig))
    meta = dcp.FileSystemReader(release).read_metadata().state_dict_metadata
    tensors = {k for k, m in meta.items() if hasattr(m, "chunks")}
    for k in ("language_model.embedding.word_embeddings.weight", "language_model.output_layer.weight"):
        if k in meta:  # the vocabulary padded for the largest TP degree
            rows = meta[k].size[0]
            want[k] = np.concatenate([want[k], np.zeros((rows - s.vocab, s.H), np.uint16)])
    missing, extra = sorted(set(want) - tensors), sorted(tensors - set(want))
    shapes = [k for k in want if k in meta and tuple(meta[k].size) != want[k].shape]
    if missing or extra or shapes:
        print(f"FAIL {release}: keys missing {missing[:3]}, unexpected {extra[:3]}, shapes differ {shapes[:3]}")
        return
    got = {k: torch.empty(meta[k].size, dtype=torch.bfloat16) for k in want}
    dcp.load(got, checkpoint_id=release)
    bad = [k for k in want if not np.array_equal(gdn.bits_of(torch, got[k]), want[k])]
    print(f"{'FAIL' if bad else 'PASS'} {release}: the {len(want)} tensor keys of mbridge's qwen3_5 model "
          f"(the tower a key per tensor), global shapes and bytes" + (f" (differing {bad[:3]})" if bad else ""))


def notower(meg, out):
    """A copy of MEG (a tp2pp2/ copy) with a tower block's tensor removed from its first rank file."""
    first = "release/mp_rank_00_000/model_optim_rng.pt"
    shutil.copytree(meg, out)
    sd = torch.load(f"{meg}/{first}", map_location="cpu", weights_only=False)
    del sd["model"]["vision_model.blocks.1.attn.qkv.weight"]
    torch.save(sd, f"{out}/{first}")


def check(argv):
    """Groups of ORIG, HF, MEG, MCORE, WORK, then the hf/ of MEG's and MCORE's copies mounted as
    sources (both hold ORIG's tensors), then where to write MEG's copy without a tower tensor."""
    for orig, hf, meg, mcore, work, meg_hf, mcore_hf, notower_out in zip(*(argv[i::8] for i in range(8))):
        vlm.logits(orig, [hf, meg_hf], None, inputs)
        check_ranks(orig, meg, work)
        check_mcore(orig, mcore, work)
        vlm.samehf(orig, [meg_hf, mcore_hf])
        notower(meg, notower_out)


if __name__ == "__main__":
    {"build": lambda: build(sys.argv[2]),
     "check": lambda: check(sys.argv[2:])}[sys.argv[1]]()
