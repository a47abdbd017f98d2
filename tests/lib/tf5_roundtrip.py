#!/usr/bin/python3
"""Tiny models of every supported family built and saved by transformers 5 itself (run in the
sid root), and the checks of their round trip through ckptfs's Megatron views.

  tf5_roundtrip.py build OUT
      for each family: OUT/FAMILY-v5, saved by save_pretrained in bf16 (transformers 5's
      config.json: rope_parameters, dtype, ...), and OUT/FAMILY-v4, the same model saved in
      fp32 with its config.json rewritten in transformers 4's spelling (rope_theta,
      rope_scaling, torch_dtype, head_dim and num_experts spelled out). Prints one line per
      family: "built FAMILY" or "unbuilt FAMILY: why".
  tf5_roundtrip.py check ORIG RANK_FILE HF_DIR [ORIG RANK_FILE HF_DIR ...]
      for each triple: the args of RANK_FILE (a Megatron copy of ORIG) against what Megatron's own import sets
      from ORIG's config as transformers 5 reads it; then ORIG and HF_DIR loaded by
      transformers 5 give the same logits (torch.equal), and the same token ids (bos, eos, pad).
      Prints "PASS what" or "FAIL what: why" lines.
  tf5_roundtrip.py strip MEGATRON_DIR OUT
      a copy of a Megatron checkpoint (release/) whose args carry no token ids, as a checkpoint
      Megatron saved itself has none.
  tf5_roundtrip.py unknown_ids ORIG HF_DIR
      HF_DIR (hf/ of such a copy) has bos/eos/pad_token_id null, transformers 5 loads it, and its
      logits are ORIG's.
"""
import argparse
import json
import os
import sys

import torch
import transformers

# Shared tiny sizes; a rotary base other than transformers' default, so a reader that misses
# the spelling serves 10000 and fails.
BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
            rms_norm_eps=1e-5, tie_word_embeddings=False)
THETA = 1e6
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False)

# family: (config class, its fields over BASE, rope_parameters over the default ones)
FAMILIES = {
    # Llama 3's scaling with the factors Megatron-core fixes (low 1, high 4, original 8192).
    "llama": ("LlamaConfig", {}, dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                      high_freq_factor=4.0, original_max_position_embeddings=8192)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True), {}),
    "qwen3": ("Qwen3Config", dict(head_dim=32), {}),
    "mistral": ("MistralConfig", dict(sliding_window=None), {}),
    "phi3": ("Phi3Config", dict(sliding_window=None, original_max_position_embeddings=256,
                                pad_token_id=0), {}),
    "mixtral": ("MixtralConfig", dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                                      sliding_window=None), {}),
    "qwen2_moe": ("Qwen2MoeConfig", dict(num_experts=4, shared_expert_intermediate_size=48,
                                         decoder_sparse_step=1, mlp_only_layers=[1], **MOE), {}),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_experts=4, decoder_sparse_step=1, head_dim=16, **MOE), {}),
    "deepseek_v3": ("DeepseekV3Config", dict(
        moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        first_k_dense_replace=1, n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=16,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, num_key_value_heads=4,
        norm_topk_prob=True, routed_scaling_factor=2.5), {}),
    # GLM-4.5: attention biases, q/k norms, half of each head rotated (Glm4MoeConfig's default),
    # DeepSeek-V3's experts and routing
    "glm4_moe": ("Glm4MoeConfig", dict(
        moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
        attention_bias=True, use_qk_norm=True), {}),
}


def build(out):
    for family, (cls, fields, rope) in FAMILIES.items():
        try:
            torch.manual_seed(0)
            rope_parameters = {"rope_type": "default", "rope_theta": THETA, **rope}
            cfg = getattr(transformers, cls)(**{**BASE, **fields, "rope_parameters": rope_parameters})
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
            # Random values where transformers initializes constants (norm weights 1, biases 0).
            with torch.no_grad():
                for p in model.parameters():
                    p.normal_(0, 0.3 if p.dim() == 1 else 0.05)
            model.save_pretrained(f"{out}/{family}-v4")
            v4_config(f"{out}/{family}-v4/config.json")
            model.to(torch.bfloat16).save_pretrained(f"{out}/{family}-v5")
            print(f"built {family}")
        except Exception as e:  # a family this transformers cannot build is reported, not fatal
            print(f"unbuilt {family}: {type(e).__name__}: {e}".splitlines()[0])


def v4_config(path):
    """config.json as transformers 4 wrote it, for the same model."""
    cfg = json.load(open(path))
    params = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = params if params.get("rope_type", "default") != "default" else None
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    if "head_dim" in cfg and cfg["head_dim"] is None:
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    if cfg["model_type"] in ("qwen2_moe", "qwen3_moe") and "num_local_experts" in cfg:
        cfg["num_experts"] = cfg.pop("num_local_experts")
    json.dump(cfg, open(path, "w"), indent=2)


def megatron_import(cfg):
    """The args Megatron's import of a Hugging Face model sets from its config (transformers'
    reading of config.json, of either spelling): rotary base, norm epsilon, head width, groups,
    experts, Llama 3's rope scaling."""
    rope = cfg.rope_parameters
    want = {"rotary_base": rope["rope_theta"], "layernorm_epsilon": cfg.rms_norm_eps,
            "num_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
            "num_attention_heads": cfg.num_attention_heads, "ffn_hidden_size": cfg.intermediate_size,
            "max_position_embeddings": cfg.max_position_embeddings,
            "untie_embeddings_and_output_weights": not cfg.tie_word_embeddings}
    if cfg.model_type != "deepseek_v3":  # MLA has its own head widths, below
        want["kv_channels"] = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        want["num_query_groups"] = cfg.num_key_value_heads
    experts = None
    for name in ("num_local_experts", "num_experts", "n_routed_experts"):
        experts = experts or getattr(cfg, name, None)
    want["num_experts"] = experts
    if experts:
        want["moe_router_topk"] = cfg.num_experts_per_tok
        want["moe_ffn_hidden_size"] = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    if cfg.model_type == "qwen2_moe":
        want["moe_shared_expert_intermediate_size"] = cfg.shared_expert_intermediate_size
    if cfg.model_type == "glm4_moe":  # Megatron-Bridge's GLM-4.5 bridge
        want.update(moe_shared_expert_intermediate_size=cfg.n_shared_experts * cfg.moe_intermediate_size,
                    rotary_percent=cfg.rope_parameters.get("partial_rotary_factor", 1.0),
                    add_qkv_bias=cfg.attention_bias, qk_layernorm=cfg.use_qk_norm)
    if cfg.model_type == "deepseek_v3":
        want["moe_shared_expert_intermediate_size"] = cfg.n_shared_experts * cfg.moe_intermediate_size
        want.update(q_lora_rank=cfg.q_lora_rank, kv_lora_rank=cfg.kv_lora_rank,
                    qk_head_dim=cfg.qk_nope_head_dim, qk_pos_emb_head_dim=cfg.qk_rope_head_dim,
                    v_head_dim=cfg.v_head_dim)
    if rope.get("rope_type") == "llama3":
        want["use_rope_scaling"] = True
        want["rope_scaling_factor"] = rope["factor"]
    elif cfg.model_type in ("llama",):
        want["use_rope_scaling"] = False
    return want


def logits(path, dtype="auto"):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.eval()
    ids = torch.arange(3, 3 + 2 * 24).reshape(2, 24) * 37 % model.config.vocab_size
    with torch.no_grad():
        return model(ids).logits, model


def check(orig, rank_file, hf_dir):
    name = os.path.basename(orig)
    torch.serialization.add_safe_globals([argparse.Namespace])
    args = torch.load(rank_file, map_location="cpu", weights_only=True)["args"]
    cfg = transformers.AutoConfig.from_pretrained(orig)
    bad = [f"args.{k} = {getattr(args, k, None)!r}, Megatron's import sets {v!r}"
           for k, v in megatron_import(cfg).items() if getattr(args, k, None) != v]
    if bad:
        print(f"FAIL {name}: Megatron args: " + "; ".join(bad))
    else:
        print(f"PASS {name}: Megatron args as Megatron's import sets them: "
              f"{ {k: v for k, v in megatron_import(cfg).items() if v not in (None, False)} }")
    want, orig_model = logits(orig)
    try:
        got, back = logits(hf_dir)
    except Exception as e:
        print(f"FAIL {name}: logits: transformers 5 cannot load hf/ of the Megatron copy: {type(e).__name__}: {e}".splitlines()[0])
        return
    dtypes = {p.dtype for p in orig_model.parameters()}, {p.dtype for p in back.parameters()}
    if got.shape != want.shape or got.dtype != want.dtype or dtypes[0] != dtypes[1]:
        # Whether only config.json's dtype is wrong: the weights loaded as the original's.
        again = logits(hf_dir, want.dtype)[0]
        diff = (again.float() - want.float()).abs().max().item() if again.shape == want.shape else "-"
        print(f"FAIL {name}: logits: {got.dtype} {list(got.shape)} (weights {dtypes[1]}), "
              f"original {want.dtype} {list(want.shape)} (weights {dtypes[0]}); hf/ loaded as "
              f"{want.dtype}: max |diff| {diff}")
    elif not torch.equal(got, want):
        print(f"FAIL {name}: logits differ: max |diff| {(got.float() - want.float()).abs().max().item():.3g}")
    else:
        print(f"PASS {name}: logits of hf/ of the Megatron copy equal the original's "
              f"({want.dtype}, max |diff| {(got.float() - want.float()).abs().max().item():g})")
    ids = {k: (getattr(orig_model.config, k, None), getattr(back.config, k, None)) for k in TOKEN_IDS}
    differ = {k: v for k, v in ids.items() if v[0] != v[1]}
    if differ:
        print(f"FAIL {name}: token ids of hf/ of the Megatron copy (original, copy): {differ}")
    else:
        print(f"PASS {name}: token ids of hf/ of the Megatron copy are the original's: "
              f"{ {k: v[0] for k, v in ids.items()} }")


TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def strip(megatron_dir, out):
    torch.serialization.add_safe_globals([argparse.Namespace])
    for rank in sorted(os.listdir(f"{megatron_dir}/release")):
        state = torch.load(f"{megatron_dir}/release/{rank}/model_optim_rng.pt", map_location="cpu",
                           weights_only=True)
        if not hasattr(state["args"], "hf_token_ids"):
            sys.exit(f"{megatron_dir}: args.hf_token_ids is missing from {rank}")
        del state["args"].hf_token_ids
        os.makedirs(f"{out}/release/{rank}")
        torch.save(state, f"{out}/release/{rank}/model_optim_rng.pt")
    with open(f"{out}/latest_checkpointed_iteration.txt", "w") as f:
        f.write("release")


def unknown_ids(orig, hf_dir):
    name = os.path.basename(orig)
    written = json.load(open(f"{hf_dir}/config.json"))
    bad = {k: written.get(k, "absent") for k in TOKEN_IDS if written.get(k, "absent") is not None}
    if bad:
        print(f"FAIL {name}: hf/config.json of a copy without token ids in its args: not null: {bad}")
        return
    want = logits(orig)[0]
    try:
        got, back = logits(hf_dir)
    except Exception as e:
        print(f"FAIL {name}: transformers 5 cannot load hf/ of a copy without token ids in its args: "
              f"{type(e).__name__}: {e}".splitlines()[0])
        return
    ok = torch.equal(got, want) and all(getattr(back.config, k, None) is None for k in TOKEN_IDS)
    print(f"{'PASS' if ok else 'FAIL'} {name}: hf/ of a copy without token ids in its args: ids null, "
          f"loaded by transformers 5, logits {'equal' if torch.equal(got, want) else 'differ'}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "build":
        build(sys.argv[2])
    elif len(sys.argv) > 2 and (len(sys.argv) - 2) % 3 == 0 and sys.argv[1] == "check":
        for i in range(2, len(sys.argv), 3):
            check(*sys.argv[i:i + 3])
    elif len(sys.argv) == 4 and sys.argv[1] == "strip":
        strip(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "unknown_ids":
        unknown_ids(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
