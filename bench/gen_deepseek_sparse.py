#!/usr/bin/python3
"""Generate a sparse DeepSeek-V3-671B-shaped block-FP8 Hugging Face checkpoint for the ckptfs
benchmarks: every tensor of the release with its real name, dtype and shape, real headers, and
data areas that are holes (each shard's header is written, then the file is truncated to its full
size), so ~688 GB of apparent size take a few MB of disk. With --model kimi-k2, the same for
Kimi-K2-Instruct (its config.json: DeepSeek-V3's architecture with 384 routed experts in one
group, 64 heads, one dense layer, no MTP layer, YaRN with beta_fast 1; 61 shards, ~1.03 TB);
with --model glm-4.6, GLM-4.6 (Glm4MoeForCausalLM, bf16: 92 layers + 1 MTP layer, 160 experts,
q/k/v biases and norms, 3 dense layers; 92 shards, ~714 GB); with --model qwen3.5-397b,
Qwen3.5-397B-A17B's VLM release (Qwen3_5MoeForConditionalGeneration, bf16: model.language_model.*
with 45 gated delta-net and 15 gated attention layers, 512 experts fused on disk, model.visual.*,
the MTP block mtp.*; 92 shards, ~807 GB; --per-expert: each expert's tensors, as transformers 5
saves them; --intermediate-size N adds a field the release lacks); with --model gpt-oss-120b,
GPT-OSS-120B (36 layers, 128 experts in MXFP4 blocks and scales, bf16 rest, attention sinks; the
release's 15 shards counted from 0, ~65 GB).

  gen_deepseek_sparse.py OUT [--model deepseek-v3|kimi-k2|glm-4.6|qwen3.5-397b|gpt-oss-120b]
                         [--shards N] [--per-expert] [--intermediate-size N] [--force]

Run with Debian's /usr/bin/python3 (standard library only). Writes into OUT.tmp-PID and renames it
to OUT at the end, so an existing OUT is always complete; OUT must not exist (--force replaces it).

What is written (deepseek-ai/DeepSeek-V3 as released):

* config.json: the release's (DeepseekV3ForCausalLM, 61 layers + 1 MTP layer, MLA, 256 routed
  experts + 1 shared, first 3 layers dense, quantization_config fp8 e4m3 [128, 128]);
  generation_config.json.
* 91,991 tensors: layers 0-60 and the MTP layer 61 (enorm, hnorm, eh_proj, shared_head.norm,
  shared_head.head, embed_tokens + a full MoE decoder layer), model.embed_tokens, model.norm,
  lm_head. The linear weights of attention (q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj,
  o_proj) and of the MLPs (dense, routed experts, shared experts) are F8_E4M3, each followed by
  `<name>_scale_inv` F32 [ceil(rows / 128), ceil(cols / 128)]; norms, embeddings, lm_head,
  mlp.gate.weight and eh_proj are BF16; mlp.gate.e_score_correction_bias is F32.
* SHARDS files `model-000KK-of-000NNN.safetensors` (the release's odd 5/6-digit names) in model
  order: embed_tokens, layers 0-60 (in each: self_attn, mlp [experts 0-255 gate/up/down, gate,
  shared_experts], input_layernorm, post_attention_layernorm), model.norm, lm_head, layer 61 (its
  decoder layer first, then eh_proj, enorm, hnorm, embed_tokens, shared_head). The release has
  layers 0-2 in its first shard, lm_head and model.norm in shard 160, layer 61's extras in shard
  163; here they land in shards 1, 159 and 162-163. Split greedily (transformers' rule) with the smallest shard size limit that
  gives SHARDS files: the 163 shards hold ~4.2 GB each (3.2-4.24 GB), as the release's.
* Inside each file, safetensors' own layout (what the Rust `serialize` writes): tensors sorted by
  dtype alignment, largest first (F32, BF16, F8_E4M3), then by name; data_offsets contiguous from
  0; the JSON header lists `__metadata__` ({"format": "pt"}) first, then the tensors in data
  order, and is padded with spaces to a multiple of 8 bytes.
* model.safetensors.index.json: {"metadata": {"total_size": ...}, "weight_map": sorted by name}.

Prints the tensor count and the apparent size.
"""
import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
import st_write  # noqa: E402  (the project's one safetensors writer)

DTYPE_SIZE = {"U8": 1, "F8_E4M3": 1, "BF16": 2, "F32": 4}
# safetensors' Dtype enum order (the Rust serializer sorts by dtype descending, then by name).
DTYPE_RANK = {"BOOL": 0, "U8": 1, "I8": 2, "F8_E5M2": 3, "F8_E4M3": 4, "I16": 5, "U16": 6,
              "F16": 7, "BF16": 8, "I32": 9, "U32": 10, "F32": 11, "F64": 12, "I64": 13, "U64": 14}

DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_deepseek.DeepseekV3Config",
        "AutoModel": "modeling_deepseek.DeepseekV3Model",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
    },
    "aux_loss_alpha": 0.001,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "pretraining_tp": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 129280,
}

# moonshotai/Kimi-K2-Instruct's config.json.
KIMI_K2_CONFIG = dict(DEEPSEEK_V3_CONFIG, **{
    "bos_token_id": 163584,
    "eos_token_id": 163585,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 131072,
    "model_type": "kimi_k2",
    "n_group": 1,
    "n_routed_experts": 384,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "num_nextn_predict_layers": 0,
    "rope_scaling": {
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 50000.0,
    "routed_scaling_factor": 2.827,
    "topk_group": 1,
    "transformers_version": "4.48.3",
    "vocab_size": 163840,
})
# zai-org/GLM-4.6's config.json.
GLM_46_CONFIG = {
    "architectures": ["Glm4MoeForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "pad_token_id": 151329,
    "eos_token_id": [151329, 151336, 151338],
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "partial_rotary_factor": 0.5,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "max_position_embeddings": 202752,
    "model_type": "glm4_moe",
    "moe_intermediate_size": 1536,
    "norm_topk_prob": True,
    "num_attention_heads": 96,
    "n_group": 1,
    "topk_group": 1,
    "n_routed_experts": 160,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "num_hidden_layers": 92,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.54.0",
    "use_cache": True,
    "use_qk_norm": True,
    "vocab_size": 151552,
}
# Qwen/Qwen3.5-397B-A17B's config.json (a VLM release: the text model in text_config, 60 layers of
# three gated delta-net layers then one gated attention layer, 512 experts + a gated shared one,
# the MTP block; Qwen3-VL's tower without deepstack mergers).
QWEN35_397B_LAYERS = 60
QWEN35_397B_CONFIG = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "image_token_id": 248056,
    "video_token_id": 248057,
    "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
    "tie_word_embeddings": False,
    "transformers_version": "4.57.0.dev0",
    "text_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "dtype": "bfloat16",
        "eos_token_id": 248044,
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                        for i in range(QWEN35_397B_LAYERS)],
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 64,
        "linear_value_head_dim": 128,
        "max_position_embeddings": 262144,
        "model_type": "qwen3_5_moe_text",
        "moe_intermediate_size": 1024,
        "mtp_num_hidden_layers": 1,
        "num_attention_heads": 32,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "num_hidden_layers": QWEN35_397B_LAYERS,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": 1024,
        "use_cache": True,
        "vocab_size": 248320,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
                            "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    },
    "vision_config": {
        "depth": 27,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 4304,
        "model_type": "qwen3_5_moe",
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 4096,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}
# openai/gpt-oss-120b's config.json (MXFP4 experts, bf16 rest; sliding and full attention in turn).
GPT_OSS_120B_LAYERS = 36
GPT_OSS_120B_CONFIG = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(GPT_OSS_120B_LAYERS)],
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": GPT_OSS_120B_LAYERS,
    "num_key_value_heads": 8,
    "num_local_experts": 128,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "quantization_config": {
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "transformers_version": "4.55.0.dev0",
    "use_cache": True,
    "vocab_size": 201088,
}
MODELS = {"deepseek-v3": (DEEPSEEK_V3_CONFIG, 163), "kimi-k2": (KIMI_K2_CONFIG, 61), "glm-4.6": (GLM_46_CONFIG, 92),
          "qwen3.5-397b": (QWEN35_397B_CONFIG, 92), "gpt-oss-120b": (GPT_OSS_120B_CONFIG, 15)}

GENERATION_CONFIG = {"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 1,
                     "do_sample": True, "temperature": 0.6, "top_p": 0.95,
                     "transformers_version": "4.46.3"}


def nbytes(dtype, shape):
    n = DTYPE_SIZE[dtype]
    for d in shape:
        n *= d
    return n


def tensors_of(cfg):
    """[(name, dtype, shape)] of DeepseekV3ForCausalLM + its MTP layers, in model order."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    qk_head = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    br, bc = cfg["quantization_config"]["weight_block_size"]
    out = []

    def fp8(name, rows, cols):
        out.append((name, "F8_E4M3", [rows, cols]))
        out.append((name + "_scale_inv", "F32", [-(-rows // br), -(-cols // bc)]))

    def bf16(name, *shape):
        out.append((name, "BF16", list(shape)))

    def mlp(p, ffn):
        fp8(p + "gate_proj.weight", ffn, h)
        fp8(p + "up_proj.weight", ffn, h)
        fp8(p + "down_proj.weight", h, ffn)

    def decoder_layer(i):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        if cfg.get("q_lora_rank"):
            fp8(a + "q_a_proj.weight", cfg["q_lora_rank"], h)
            bf16(a + "q_a_layernorm.weight", cfg["q_lora_rank"])
            fp8(a + "q_b_proj.weight", heads * qk_head, cfg["q_lora_rank"])
        else:
            fp8(a + "q_proj.weight", heads * qk_head, h)
        fp8(a + "kv_a_proj_with_mqa.weight", cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], h)
        bf16(a + "kv_a_layernorm.weight", cfg["kv_lora_rank"])
        fp8(a + "kv_b_proj.weight", heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]),
            cfg["kv_lora_rank"])
        fp8(a + "o_proj.weight", h, heads * cfg["v_head_dim"])
        moe = (cfg["n_routed_experts"] and i >= cfg["first_k_dense_replace"]
               and i % cfg["moe_layer_freq"] == 0)
        if moe:
            for e in range(cfg["n_routed_experts"]):
                mlp(f"{p}mlp.experts.{e}.", cfg["moe_intermediate_size"])
            bf16(p + "mlp.gate.weight", cfg["n_routed_experts"], h)
            out.append((p + "mlp.gate.e_score_correction_bias", "F32", [cfg["n_routed_experts"]]))
            if cfg["n_shared_experts"]:
                mlp(p + "mlp.shared_experts.", cfg["moe_intermediate_size"] * cfg["n_shared_experts"])
        else:
            mlp(p + "mlp.", cfg["intermediate_size"])
        bf16(p + "input_layernorm.weight", h)
        bf16(p + "post_attention_layernorm.weight", h)

    n = cfg["num_hidden_layers"]
    bf16("model.embed_tokens.weight", v, h)
    for i in range(n):
        decoder_layer(i)
    bf16("model.norm.weight", h)
    bf16("lm_head.weight", v, h)
    for i in range(n, n + cfg.get("num_nextn_predict_layers", 0)):
        p = f"model.layers.{i}."
        decoder_layer(i)
        bf16(p + "eh_proj.weight", h, 2 * h)
        bf16(p + "enorm.weight", h)
        bf16(p + "hnorm.weight", h)
        bf16(p + "embed_tokens.weight", v, h)
        bf16(p + "shared_head.norm.weight", h)
        bf16(p + "shared_head.head.weight", v, h)
    return out


def glm_tensors_of(cfg):
    """[(name, dtype, shape)] of Glm4MoeForCausalLM (bf16) + its MTP layers, in model order."""
    h, v, d = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    out = []

    def bf16(name, *shape):
        out.append((name, "BF16", list(shape)))

    def mlp(p, ffn):
        bf16(p + "gate_proj.weight", ffn, h)
        bf16(p + "up_proj.weight", ffn, h)
        bf16(p + "down_proj.weight", h, ffn)

    def decoder_layer(i):
        p = f"model.layers.{i}."
        for proj, rows in (("q", q), ("k", kv), ("v", kv)):
            bf16(f"{p}self_attn.{proj}_proj.weight", rows, h)
            if cfg["attention_bias"]:
                bf16(f"{p}self_attn.{proj}_proj.bias", rows)
        bf16(p + "self_attn.o_proj.weight", h, q)
        if cfg["use_qk_norm"]:
            bf16(p + "self_attn.q_norm.weight", d)
            bf16(p + "self_attn.k_norm.weight", d)
        if i >= cfg["first_k_dense_replace"]:
            for e in range(cfg["n_routed_experts"]):
                mlp(f"{p}mlp.experts.{e}.", cfg["moe_intermediate_size"])
            bf16(p + "mlp.gate.weight", cfg["n_routed_experts"], h)
            out.append((p + "mlp.gate.e_score_correction_bias", "F32", [cfg["n_routed_experts"]]))
            mlp(p + "mlp.shared_experts.", cfg["moe_intermediate_size"] * cfg["n_shared_experts"])
        else:
            mlp(p + "mlp.", cfg["intermediate_size"])
        bf16(p + "input_layernorm.weight", h)
        bf16(p + "post_attention_layernorm.weight", h)

    n = cfg["num_hidden_layers"]
    bf16("model.embed_tokens.weight", v, h)
    for i in range(n):
        decoder_layer(i)
    bf16("model.norm.weight", h)
    bf16("lm_head.weight", v, h)
    for i in range(n, n + cfg["num_nextn_predict_layers"]):
        p = f"model.layers.{i}."
        decoder_layer(i)
        bf16(p + "eh_proj.weight", h, 2 * h)
        bf16(p + "enorm.weight", h)
        bf16(p + "hnorm.weight", h)
        bf16(p + "shared_head.norm.weight", h)
    return out


def qwen35_tensors_of(cfg, per_expert=False):
    """[(name, dtype, shape)] of Qwen3_5MoeForConditionalGeneration as the release holds it (bf16):
    model.language_model.* with the experts fused ([E, 2F, H] and [E, H, F]; PER_EXPERT: each
    expert's gate/up/down_proj, as transformers 5's save_pretrained writes them), lm_head,
    model.visual.*, then the MTP block mtp.* (its layer's experts per expert)."""
    t, vc = cfg["text_config"], cfg["vision_config"]
    h, v, d = t["hidden_size"], t["vocab_size"], t["head_dim"]
    e, f, sf = t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
    kd, vd = t["linear_key_head_dim"], t["linear_value_head_dim"]
    kh, vh = t["linear_num_key_heads"], t["linear_num_value_heads"]
    conv = 2 * kh * kd + vh * vd  # the depthwise convolution runs over [q; k; v]
    out = []

    def bf16(name, *shape):
        out.append((name, "BF16", list(shape)))

    def mlp(p, ffn):
        bf16(p + "gate_proj.weight", ffn, h)
        bf16(p + "up_proj.weight", ffn, h)
        bf16(p + "down_proj.weight", h, ffn)

    def attention(p):  # gated: q_proj gives each head's query and its output gate
        a = p + "self_attn."
        bf16(a + "q_proj.weight", 2 * t["num_attention_heads"] * d, h)
        bf16(a + "k_proj.weight", t["num_key_value_heads"] * d, h)
        bf16(a + "v_proj.weight", t["num_key_value_heads"] * d, h)
        bf16(a + "o_proj.weight", h, t["num_attention_heads"] * d)
        bf16(a + "q_norm.weight", d)
        bf16(a + "k_norm.weight", d)

    def moe(p, fused):
        if fused:
            bf16(p + "mlp.experts.gate_up_proj", e, 2 * f, h)
            bf16(p + "mlp.experts.down_proj", e, h, f)
        else:
            for x in range(e):
                mlp(f"{p}mlp.experts.{x}.", f)
        bf16(p + "mlp.gate.weight", e, h)
        mlp(p + "mlp.shared_expert.", sf)
        bf16(p + "mlp.shared_expert_gate.weight", 1, h)

    lm = "model.language_model."
    bf16(lm + "embed_tokens.weight", v, h)
    for i, kind in enumerate(t["layer_types"]):
        p = f"{lm}layers.{i}."
        if kind == "linear_attention":
            a = p + "linear_attn."
            bf16(a + "in_proj_qkv.weight", conv, h)
            bf16(a + "in_proj_z.weight", vh * vd, h)
            bf16(a + "in_proj_b.weight", vh, h)
            bf16(a + "in_proj_a.weight", vh, h)
            bf16(a + "conv1d.weight", conv, 1, t["linear_conv_kernel_dim"])
            bf16(a + "dt_bias", vh)
            bf16(a + "A_log", vh)
            bf16(a + "norm.weight", vd)
            bf16(a + "out_proj.weight", h, vh * vd)
        else:
            attention(p)
        moe(p, not per_expert)
        bf16(p + "input_layernorm.weight", h)
        bf16(p + "post_attention_layernorm.weight", h)
    bf16(lm + "norm.weight", h)
    bf16("lm_head.weight", v, h)
    vp, vh_, vf = "model.visual.", vc["hidden_size"], vc["intermediate_size"]
    ps, merged = vc["patch_size"], vc["hidden_size"] * vc["spatial_merge_size"] ** 2
    bf16(vp + "patch_embed.proj.weight", vh_, vc["in_channels"], vc["temporal_patch_size"], ps, ps)
    bf16(vp + "patch_embed.proj.bias", vh_)
    bf16(vp + "pos_embed.weight", vc["num_position_embeddings"], vh_)
    for b in range(vc["depth"]):
        p = f"{vp}blocks.{b}."
        for n in ("norm1", "norm2"):
            bf16(p + n + ".weight", vh_)
            bf16(p + n + ".bias", vh_)
        for n, rows, cols in (("attn.qkv", 3 * vh_, vh_), ("attn.proj", vh_, vh_),
                              ("mlp.linear_fc1", vf, vh_), ("mlp.linear_fc2", vh_, vf)):
            bf16(p + n + ".weight", rows, cols)
            bf16(p + n + ".bias", rows)
    p = vp + "merger."
    bf16(p + "norm.weight", vh_)
    bf16(p + "norm.bias", vh_)
    bf16(p + "linear_fc1.weight", merged, merged)
    bf16(p + "linear_fc1.bias", merged)
    bf16(p + "linear_fc2.weight", vc["out_hidden_size"], merged)
    bf16(p + "linear_fc2.bias", vc["out_hidden_size"])
    for j in range(t["mtp_num_hidden_layers"]):
        p = f"mtp.layers.{j}."
        attention(p)
        moe(p, False)
        bf16(p + "input_layernorm.weight", h)
        bf16(p + "post_attention_layernorm.weight", h)
    bf16("mtp.fc.weight", h, 2 * h)
    bf16("mtp.pre_fc_norm_embedding.weight", h)
    bf16("mtp.pre_fc_norm_hidden.weight", h)
    bf16("mtp.norm.weight", h)
    return out


def gpt_oss_tensors_of(cfg):
    """[(name, dtype, shape)] of GptOssForCausalLM as the release holds it: the experts in MXFP4
    (U8 `*_blocks` [E, rows, cols / 32, 16] and E8M0 `*_scales` [E, rows, cols / 32], bf16 biases),
    everything else bf16, the attention sinks one per head."""
    h, v, d = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    e, f = cfg["num_local_experts"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    out = []

    def bf16(name, *shape):
        out.append((name, "BF16", list(shape)))

    def mxfp4(name, rows, cols):
        out.append((name + "_blocks", "U8", [e, rows, cols // 32, 16]))
        out.append((name + "_scales", "U8", [e, rows, cols // 32]))
        bf16(name + "_bias", e, rows)

    bf16("model.embed_tokens.weight", v, h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for proj, rows, cols in (("q", q, h), ("k", kv, h), ("v", kv, h), ("o", h, q)):
            bf16(f"{p}self_attn.{proj}_proj.weight", rows, cols)
            bf16(f"{p}self_attn.{proj}_proj.bias", rows)
        bf16(p + "self_attn.sinks", cfg["num_attention_heads"])
        bf16(p + "mlp.router.weight", e, h)
        bf16(p + "mlp.router.bias", e)
        mxfp4(p + "mlp.experts.gate_up_proj", 2 * f, h)
        mxfp4(p + "mlp.experts.down_proj", h, f)
        bf16(p + "input_layernorm.weight", h)
        bf16(p + "post_attention_layernorm.weight", h)
    bf16("model.norm.weight", h)
    bf16("lm_head.weight", v, h)
    return out


TENSORS_OF = {"glm4_moe": glm_tensors_of, "qwen3_5_moe": qwen35_tensors_of, "gpt_oss": gpt_oss_tensors_of}


def greedy(tensors, limit):
    """transformers' split: a new shard when the next tensor would push this one past LIMIT."""
    groups, cur, size = [], [], 0
    for t in tensors:
        n = nbytes(t[1], t[2])
        if cur and size + n > limit:
            groups.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += n
    if cur:
        groups.append(cur)
    return groups


def split(tensors, nshards):
    """NSHARDS groups in model order: transformers' greedy split with the smallest shard size
    limit that gives at most NSHARDS shards (4,243,538,144 bytes for the release's 163)."""
    lo = max(nbytes(dt, s) for _, dt, s in tensors)  # a limit that works is in [lo, hi]
    hi = sum(nbytes(dt, s) for _, dt, s in tensors)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(greedy(tensors, mid)) <= nshards:
            hi = mid
        else:
            lo = mid + 1
    groups = greedy(tensors, lo)
    if len(groups) != nshards:
        sys.exit(f"gen_deepseek: cannot split into exactly {nshards} shards (the smallest limit "
                 f"gives {len(groups)})")
    return groups


def header_bytes(tensors):
    """safetensors header (8-byte length + JSON padded with spaces to 8) and the data size, laid
    out as safetensors' serializer does: dtype alignment descending, then name."""
    order = sorted(tensors, key=lambda t: (-DTYPE_RANK[t[1]], t[0]))
    return st_write.header_bytes((name, dt, shape, nbytes(dt, shape)) for name, dt, shape in order)


def shard_name(k, n, cfg=None):
    if cfg and cfg["model_type"] == "gpt_oss":  # gpt-oss-120b counts its shards from 0
        return f"model-{k - 1:05d}-of-{n - 1:05d}.safetensors"
    if cfg and cfg["model_type"] in ("qwen3_5_moe", "gpt_oss"):
        return f"model-{k:05d}-of-{n:05d}.safetensors"
    return f"model-{k:05d}-of-{n:06d}.safetensors"


def write_checkpoint(dest, cfg, tensors, nshards, write_data=None, generation_config=None):
    """Writes DEST (via DEST.tmp-PID): shards, index, config. WRITE_DATA(f, ordered_tensors) writes
    a shard's data after its header; None leaves the data area a hole (truncate).
    Returns (shards, tensors, total data bytes, bytes of all files)."""
    groups = split(tensors, nshards)
    tmp = f"{dest}.tmp-{os.getpid()}"
    os.makedirs(tmp)
    weight_map, total, files = {}, 0, 0
    try:
        for k, group in enumerate(groups, 1):
            fname = shard_name(k, nshards, cfg)
            head, data_size = header_bytes(group)
            path = os.path.join(tmp, fname)
            with open(path, "wb") as f:
                f.write(head)
                if write_data is None:
                    f.flush()
                    os.truncate(path, len(head) + data_size)
                else:
                    write_data(f, sorted(group, key=lambda t: (-DTYPE_RANK[t[1]], t[0])))
            if os.path.getsize(path) != len(head) + data_size:
                sys.exit(f"gen_deepseek: {fname} is {os.path.getsize(path)} bytes, "
                         f"expected {len(head) + data_size}")
            for name, _, _ in group:
                weight_map[name] = fname
            total += data_size
            files += len(head) + data_size
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        with open(os.path.join(tmp, "generation_config.json"), "w") as f:
            json.dump(generation_config or GENERATION_CONFIG, f, indent=2)
            f.write("\n")
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return len(groups), len(tensors), total, files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="directory to create")
    ap.add_argument("--model", choices=sorted(MODELS), default="deepseek-v3", help="whose config (default deepseek-v3)")
    ap.add_argument("--shards", type=int, default=None, help="number of shards (default the release's: 163, 61, 92, 92, 15)")
    ap.add_argument("--force", action="store_true", help="replace OUT if it exists")
    ap.add_argument("--per-expert", action="store_true",
                    help="qwen3.5-397b: the experts per expert (save_pretrained's form), not fused")
    ap.add_argument("--intermediate-size", type=int, default=None,
                    help="qwen3.5-397b: add text_config.intermediate_size (the release has none; "
                         "ckptfs's Megatron views need it)")
    args = ap.parse_args()
    dest = os.path.abspath(args.out)
    cfg, release_shards = MODELS[args.model]
    args.shards = args.shards or release_shards
    if args.shards < 1:
        ap.error("--shards must be >= 1")
    if os.path.exists(dest):
        if not args.force:
            sys.exit(f"gen_deepseek_sparse: {dest} exists (use --force to replace it)")
        shutil.rmtree(dest)
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    t0 = time.monotonic()
    if (args.per_expert or args.intermediate_size) and args.model != "qwen3.5-397b":
        ap.error("--per-expert and --intermediate-size are for --model qwen3.5-397b")
    if args.intermediate_size:
        cfg = dict(cfg, text_config=dict(cfg["text_config"], intermediate_size=args.intermediate_size))
    tensors = (qwen35_tensors_of(cfg, per_expert=True) if args.per_expert
               else TENSORS_OF.get(cfg["model_type"], tensors_of)(cfg))
    n, ntensors, total, files = write_checkpoint(dest, cfg, tensors, args.shards)
    counts = {}
    for _, dt, s in tensors:
        counts[dt] = counts.get(dt, 0) + 1
    disk = 0
    for fn in os.listdir(dest):
        disk += os.stat(os.path.join(dest, fn)).st_blocks * 512
    print(f"gen_deepseek_sparse: {dest}: {n} shards, {ntensors} tensors "
          f"({', '.join(f'{c} {dt}' for dt, c in sorted(counts.items()))}), "
          f"total_size {total} bytes; apparent size of the shards {files} bytes "
          f"({files / 1e9:.1f} GB, {files / 2**30:.1f} GiB); {disk / 2**20:.1f} MiB on disk; "
          f"{time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
