#!/usr/bin/python3
"""Independent reference for the views of DeepSeek-V3 and DeepSeek-V2 checkpoints (multi-latent
attention, sigmoid routing with expert bias and group-limited top-k, shared experts, dense-first
layers, multi-token prediction, block-FP8 weights), written from Megatron-LM core_v0.17.1's source,
DeepSeek's own modeling code (modeling_deepseek.py, fp8_cast_bf16.py) and transformers'
modeling_deepseek_v3.py, not from ckptfs's code. Reuses reference.py (dense rank files, vocab
split, loading) and moe_reference.py (rank grid, file names, expert keys).

  deepseek_reference.py write OUT --variant v3|v2lite [--fp8] [--shards N] [--yarn] [--seed S]
    A tiny Hugging Face DeepSeek checkpoint (numpy, fixed seed). v3: DeepseekV3ForCausalLM, q LoRA,
    sigmoid/noaux_tc routing, 2 expert groups, e_score_correction_bias (F32), 2 dense layers then
    MoE, one MTP layer (model.layers.4.*). v2lite: DeepseekV2ForCausalLM, q_proj, softmax/greedy
    routing, 2 shared experts, 1 dense layer, no MTP. --fp8: linear projections as F8_E4M3 codes
    with F32 `_scale_inv` per 128x128 block (hidden 160 cuts blocks). --yarn: rope_scaling yarn.
  deepseek_reference.py dequant SRC OUT
    SRC with every FP8 weight dequantised to bf16 by the definition below, scales dropped,
    quantization_config dropped (what DeepSeek's fp8_cast_bf16.py makes): the bf16 twin.
  deepseek_reference.py check-hf SRC VIEW
    VIEW (the hf/ of FP8 SRC mounted with -o dtype=bf16) holds exactly SRC dequantised: each FP8
    weight bf16_rne(float32(e4m3(code)) * scale_inv[i // 128][j // 128]), every other tensor
    byte for byte with its dtype (F32 bias stays F32), no `_scale_inv`, an index listing every
    tensor (or a single model.safetensors), config.json without quantization_config, torch_dtype
    bfloat16, otherwise SRC's.
  deepseek_reference.py check SRC VIEW_DIR LAYOUT [--spec te|local] [--mtp] [--grouped]
                        [--pp-first N --pp-last N] [--vocab-pad zero|last] [--no-args] [--torch2]
    LAYOUT: tp{T}pp{P}[vpp{V}][ep{E}][etp{X}]. Loads every rank file of VIEW_DIR (torch 2.6 with
    --torch2: weights_only=True, mmap=True), compares the file set, keys in order, each tensor bit
    for bit with its dtype, the args, then the logits (and with --mtp the MTP head's logits) of a
    Hugging Face-semantics forward over SRC with a Megatron-semantics forward over the rank files.
  deepseek_reference.py selftest
    Validates this reference (both variants, FP8, YaRN): the Megatron forward over the expected
    files of many layouts equals the HF forward, and stops equalling it under plausible mistakes.
  deepseek_reference.py bad DIR KIND
    Damages a written checkpoint for refusal tests. KIND: scale-shape, scale-dtype, no-scale,
    method, block (FP8 only); bias-shape (v3 only), no-kv-norm, group, topk-method.

Rules (Megatron-LM core_v0.17.1; file:line at that tag):
- Layer order in a state dict is module registration order: TransformerLayer (transformer_layer.py
  :307-395) input_layernorm, self_attention, pre_mlp_layernorm, mlp. MLA (attention.py Attention
  builds core_attention, linear_proj first; multi_latent_attention.py:406-523 then adds)
  linear_q_proj | linear_q_down_proj + linear_q_up_proj, linear_kv_down_proj, linear_kv_up_proj,
  q_layernorm (only with q_lora_rank), kv_layernorm.
- TE spec (gpt_layer_specs.py:287-306, qk_layernorm on): input_layernorm is a TENorm
  (weight, _extra_state); core_attention carries _extra_state; the down projections are TELinear
  with parallel_mode "duplicated" (whole on every TP rank); linear_q_up_proj / linear_kv_up_proj
  are TELayerNormColumnParallelLinear whose layer_norm_weight is q_a_layernorm / kv_a_layernorm;
  q_layernorm and kv_layernorm are IdentityOp. A dense layer (spec built with num_experts=None,
  :561) has pre_mlp_layernorm IdentityOp and the norm in mlp.linear_fc1.layer_norm_weight; an MoE
  layer a TENorm pre_mlp_layernorm.
- Local spec (gpt_layer_specs.py:405-427): every MLA linear is a ColumnParallelLinear, so the down
  projections too are row-split over TP (their output gathered, multi_latent_attention.py:540, 625);
  q_layernorm / kv_layernorm are separate norms after the linears; no norm carries _extra_state,
  every linear does (None).
- Column-parallel weights (q_up, q_proj, kv_up, eh_proj) are split by rows in T contiguous parts
  (whole heads for q/kv up); linear_proj (row-parallel) by columns. HF and Megatron both lay out q
  per head as [nope | rope], kv_a as [kv_lora | rope], kv_b per head as [k_nope | v]: tensors are
  copied. MoE: router.weight [E, H] (params_dtype), then the persistent buffer
  router.expert_bias [E] float32 (router.py:172-193, only with moe_router_enable_expert_bias),
  experts (moe_reference), shared_experts.linear_fc1 ([gate; up] halves split by dense TP), fc2.
- MTP (mtp_num_layers 1): on the last pipeline stage's last virtual chunk (multi_token_prediction
  .py:505, :559) GPTModel registers embedding (also there: gpt_model.py:149 builds it when
  mtp_process, so a stage other than the first holds embedding.word_embeddings.weight first),
  decoder (whose final_layernorm lives with the last decoder layer, transformer_block.py:386),
  mtp, output_layer. mtp.layers.0. = enorm, hnorm, eh_proj ([H, 2H] column-parallel, input
  [enorm(embedding of token i+1) | hnorm(decoder output i)], multi_token_prediction.py:780-905;
  the last position's rolled token is 0, :163), mtp_model_layer (the last decoder layer's spec:
  an MoE layer; HF model.layers.{L}.*), final_layernorm (HF shared_head.norm). The MTP logits
  come from the shared output_layer; the decoder output it receives is already normed by
  decoder.final_layernorm (gpt_model.py:615). HF's model.layers.{L}.embed_tokens and
  shared_head.head are copies of the main ones in the release and have no Megatron key.
- Routing (moe_utils.py:671-822): sigmoid: scores = sigmoid(logits), top-k of scores + expert_bias
  (group-limited: group score = sum of the top topk // group_topk scores, groups kept by
  group_topk, others -inf), probs = the scores (without bias) / (sum + 1e-20) when topk > 1;
  softmax: pre_softmax = softmax then top-k, else top-k of the logits then softmax over them;
  then times moe_router_topk_scaling_factor when set.
- Softmax scale: mscale^2 / sqrt(qk_head_dim + qk_pos_emb_head_dim) with mscale =
  _yarn_get_mscale(rotary_scaling_factor, mscale_all_dim) (multi_latent_attention.py:139-140),
  whatever rope_type. rope_type None in args means MLATransformerConfig's default "yarn"
  (arguments.py:1697); YaRN's original_max_position_embeddings, beta_fast and beta_slow have no
  Megatron argument (MLATransformerConfig defaults 4096, 32, 1, transformer_config.py:2297-2303),
  so --yarn writes DeepSeek-V3's own 4096 (and max_position_embeddings 40 x 4096).
- MLA rope (rope_utils.py:92-125, _apply_rotary_pos_emb_bshd with multi_latent_attention): x =
  [x[0::2] | x[1::2]], then rotate-half with cos/sin of cat(freqs, freqs) times mscale. HF
  (modeling_deepseek.py / transformers apply_rotary_pos_emb_interleave): view(d/2, 2).transpose,
  then rotate_half; cos/sin times the yarn attention factor.
- Block FP8 (DeepSeek-V3 release, fp8_cast_bf16.py): weight (i, j) = float32(code) *
  scale_inv[i // 128][j // 128], the product in fp32, cast to bf16 round-to-nearest-even. The
  writer quantises as the release: s = amax / 448 per block, code = E4M3 RNE of w / s in fp32
  (equal to torch's float8_e4m3fn cast for every code of the written models).
"""
import argparse
import json
import math
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import reference  # noqa: E402
from fp8_check import bf16_bits as bf16_rne, e4m3_values  # noqa: E402
from models import as_array, bf16_bits, bf16_to_f32, read_safetensors, write_safetensors  # noqa: E402
from moe_reference import (file_name, moe_mlp_keys, parse_moe_layout, rank_grid,  # noqa: E402
                           softmax, topk_mask, writer_files)
from reference import (Model, check_flags, chunk_layers, dense_args, hf_swiglu,  # noqa: E402
                       megatron_dense_mlp, megatron_swiglu, padded_vocab, rms,
                       row_split, silu, vocab_split)

models.ST_DTYPES.setdefault("F8_E4M3", (np.uint8, 1))

TOLERANCE = 1e-4  # max relative logit error, as reference.py / moe_reference.py
TOKENS = np.arange(1, 300, 7)  # 43 tokens: every expert of every MoE layer gets some (selftest asserts)
BLOCK = 128
E4M3 = e4m3_values()  # float64 value of each of the 256 codes (0x7F, 0xFF: NaN)

# Weight scales of the written models: N(0, STD) for linears; the embedding and the routers a
# little wider so that 43 tokens reach all 8 experts of every MoE layer (as models.py does).
STD, WIDE, NORM_NOISE, BIAS_STD = 0.02, 0.1, 0.05, 0.05


# --- the Hugging Face checkpoints ---

def config_for(variant, fp8=False, yarn=False):
    c = dict(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", hidden_size=160,
             num_attention_heads=4, num_key_value_heads=4, q_lora_rank=96, kv_lora_rank=64,
             qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, intermediate_size=288,
             moe_intermediate_size=80, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
             n_group=2, topk_group=1, first_k_dense_replace=2, moe_layer_freq=1, num_hidden_layers=4,
             num_nextn_predict_layers=1, scoring_func="sigmoid", topk_method="noaux_tc",
             norm_topk_prob=True, routed_scaling_factor=2.5, vocab_size=300, tie_word_embeddings=False,
             rms_norm_eps=1e-6, rope_theta=10000, max_position_embeddings=256, hidden_act="silu",
             attention_bias=False, attention_dropout=0.0, initializer_range=0.02, ep_size=1,
             rope_scaling=None, bos_token_id=0, eos_token_id=1, use_cache=True, torch_dtype="bfloat16")
    if variant == "v2lite":
        c.update(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", q_lora_rank=None,
                 n_shared_experts=2, scoring_func="softmax", topk_method="greedy", norm_topk_prob=False,
                 n_group=1, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=1.0,
                 num_nextn_predict_layers=0)
    elif variant == "kimi":
        # Kimi-K2-Instruct's config.json (DeepSeek-V3's architecture) at a small scale: model_type
        # kimi_k2, more experts in one group (n_group 1, topk_group 1), no MTP layer, its YaRN
        # (factor 32 of 4096, beta_fast 1, beta_slow 1, mscale 1 and 1), rope_theta 50000,
        # routed_scaling_factor 2.827, block-FP8 weights.
        c.update(model_type="kimi_k2", n_routed_experts=16, n_group=1, topk_group=1, first_k_dense_replace=1,
                 num_nextn_predict_layers=0, routed_scaling_factor=2.827, rope_theta=50000)
        c["rope_scaling"] = {"type": "yarn", "factor": 32.0, "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0,
                             "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}
        c["max_position_embeddings"] = 32 * 4096
    elif variant != "v3":
        raise ValueError(f"variant {variant}: v3, v2lite or kimi")
    if yarn:
        # DeepSeek-V3's own rope_scaling, with its original_max_position_embeddings 4096 (which is
        # what Megatron uses: it has no argument for it) and max_position_embeddings = factor x
        # that, so transformers' factor = max / original agrees with `factor`.
        c["rope_scaling"] = {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                             "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}
        c["max_position_embeddings"] = 40 * 4096
    if fp8:
        c["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                    "weight_block_size": [BLOCK, BLOCK]}
    return c


def is_moe_layer(c, i):
    """DeepseekV3DecoderLayer / DeepseekV2DecoderLayer: MoE from first_k_dense_replace on, every
    moe_layer_freq-th layer (the MTP layer at index num_hidden_layers included)."""
    return bool(c.get("n_routed_experts")) and i >= c["first_k_dense_replace"] and i % c.get("moe_layer_freq", 1) == 0


def hf_shapes(c):
    """[(name, shape, kind)] in the release's module order; kind: norm, linear (FP8 when quantised),
    bf16 (never quantised), bias (F32), embed."""
    H, nh, V = c["hidden_size"], c["num_attention_heads"], c["vocab_size"]
    nope, rope, vd, kvl = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    dq = nope + rope
    ql, E, Fe = c.get("q_lora_rank"), c["n_routed_experts"], c["moe_intermediate_size"]
    out = [("model.embed_tokens.weight", (V, H), "embed")]

    def mlp(p, f):
        return [(p + "gate_proj.weight", (f, H), "linear"), (p + "up_proj.weight", (f, H), "linear"),
                (p + "down_proj.weight", (H, f), "linear")]

    L = c["num_hidden_layers"]
    for i in range(L + c.get("num_nextn_predict_layers", 0)):
        p = f"model.layers.{i}."
        if i >= L:  # DeepSeek-V3's MTP layer: its own copies of the embedding and the head
            out += [(p + "embed_tokens.weight", (V, H), "embed"), (p + "enorm.weight", (H,), "norm"),
                    (p + "hnorm.weight", (H,), "norm"), (p + "eh_proj.weight", (H, 2 * H), "bf16")]
        out.append((p + "input_layernorm.weight", (H,), "norm"))
        a = p + "self_attn."
        if ql:
            out += [(a + "q_a_proj.weight", (ql, H), "linear"), (a + "q_a_layernorm.weight", (ql,), "norm"),
                    (a + "q_b_proj.weight", (nh * dq, ql), "linear")]
        else:
            out.append((a + "q_proj.weight", (nh * dq, H), "linear"))
        out += [(a + "kv_a_proj_with_mqa.weight", (kvl + rope, H), "linear"),
                (a + "kv_a_layernorm.weight", (kvl,), "norm"),
                (a + "kv_b_proj.weight", (nh * (c["qk_nope_head_dim"] + vd), kvl), "linear"),
                (a + "o_proj.weight", (H, nh * vd), "linear"),
                (p + "post_attention_layernorm.weight", (H,), "norm")]
        if is_moe_layer(c, i):
            out.append((p + "mlp.gate.weight", (E, H), "router"))
            if c.get("topk_method") == "noaux_tc":
                out.append((p + "mlp.gate.e_score_correction_bias", (E,), "bias"))
            for e in range(E):
                out += mlp(p + f"mlp.experts.{e}.", Fe)
            out += mlp(p + "mlp.shared_experts.", c["n_shared_experts"] * Fe)
        else:
            out += mlp(p + "mlp.", c["intermediate_size"])
        if i >= L:
            out += [(p + "shared_head.norm.weight", (H,), "norm"), (p + "shared_head.head.weight", (V, H), "head")]
    out += [("model.norm.weight", (H,), "norm"), ("lm_head.weight", (V, H), "head")]
    return out


def e4m3_rne(q):
    """float64 array -> E4M3 ("fn") codes: round to nearest, ties to the even code, saturating at
    448 (what torch's float8_e4m3fn cast does with finite inputs)."""
    a = np.minimum(np.abs(q), 448.0)
    vals = E4M3[:0x7F]  # codes 0x00..0x7E, ascending 0 .. 448
    idx = np.clip(np.searchsorted(vals, a), 1, 0x7E)
    lo, hi = idx - 1, idx
    dlo, dhi = a - vals[lo], vals[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (pick | np.where(np.signbit(q), 0x80, 0)).astype(np.uint8)


def quantise(w, br=BLOCK, bc=BLOCK):
    """DeepSeek's block FP8 of a float32 [R, C] weight: per block s = amax / 448 and w / s in fp32,
    code = E4M3 of that, round to nearest even (equal to torch's float8_e4m3fn cast). Returns
    (codes uint8 [R, C], scale_inv float32 [ceil(R/br), ceil(C/bc)])."""
    R, C = w.shape
    scale = np.zeros((-(-R // br), -(-C // bc)), dtype=np.float32)
    codes = np.zeros(w.shape, dtype=np.uint8)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            blk = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            s = np.float32(max(float(np.abs(blk).max()), 1e-12)) / np.float32(448.0)
            scale[i, j] = s
            q = blk.astype(np.float32) / s  # the quotient in fp32, as DeepSeek's quantiser (and torch) do
            codes[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = e4m3_rne(q.astype(np.float64))
    return codes, scale


def dequantise(codes, scale, br=BLOCK, bc=BLOCK):
    """bf16 bits of float32(e4m3(code)) * scale_inv[i // br][j // bc] (fp32 product, RNE)."""
    R, C = codes.shape
    full = np.repeat(np.repeat(scale, br, axis=0), bc, axis=1)[:R, :C]
    return bf16_rne(E4M3.astype(np.float32)[codes] * full)


def model_tensors(c, seed):
    """name -> (safetensors dtype, array) in the release's order, FP8-quantised (weight then its
    `_scale_inv`) when c has a quantization_config. The MTP layer's embed_tokens and
    shared_head.head are copies of the main ones, as in the DeepSeek-V3 release."""
    rng = np.random.default_rng(seed)
    q = c.get("quantization_config")
    br, bc = q["weight_block_size"] if q else (BLOCK, BLOCK)
    L = c["num_hidden_layers"]
    out, copies = {}, {}
    for name, shape, kind in hf_shapes(c):
        if name.startswith(f"model.layers.{L}.") and kind in ("embed", "head"):
            out[name] = None
            copies[name] = "model.embed_tokens.weight" if kind == "embed" else "lm_head.weight"
        elif kind == "bias":
            out[name] = ("F32", (rng.standard_normal(shape) * BIAS_STD).astype(np.float32))
        else:
            if kind == "norm":
                w = 1.0 + rng.standard_normal(shape) * NORM_NOISE
            else:
                w = rng.standard_normal(shape) * (WIDE if kind in ("embed", "router") else STD)
            bits = bf16_bits(w)
            if q and kind == "linear":
                codes, scale = quantise(bf16_to_f32(bits), br, bc)
                out[name] = ("F8_E4M3", codes)
                out[name + "_scale_inv"] = ("F32", scale)
            else:
                out[name] = ("BF16", bits)
    for name, orig in copies.items():
        out[name] = out[orig]
    return out


def write_model(out, variant, fp8=False, yarn=False, shards=1, seed=None):
    c = config_for(variant, fp8, yarn)
    named = model_tensors(c, {"v3": 3, "v2lite": 2, "kimi": 5}[variant] if seed is None else seed)
    models.write_checkpoint(out, named, c, shards)
    return c


def write(argv):
    ap = argparse.ArgumentParser(prog="deepseek_reference.py write")
    ap.add_argument("out")
    ap.add_argument("--variant", required=True, choices=["v3", "v2lite", "kimi"])
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--yarn", action="store_true")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args(argv)
    write_model(a.out, a.variant, a.fp8, a.yarn, a.shards, a.seed)


# --- reading (and dequantising) a checkpoint ---

def block_size(cfg):
    q = cfg.get("quantization_config")
    if not q:
        return None
    assert q.get("quant_method") == "fp8" and q.get("fmt", "e4m3") == "e4m3", f"quantization_config {q}"
    br, bc = q["weight_block_size"]
    assert br > 0 and bc > 0, f"weight_block_size {q['weight_block_size']}"
    return br, bc


def dequantised(cfg, raw):
    """raw (name -> (dtype, shape, bytes), as models.read_checkpoint gives) with every F8_E4M3
    weight replaced by its bf16 dequantisation and the `_scale_inv` tensors gone; the names of the
    dequantised weights as a second result."""
    bs = block_size(cfg)
    out, done = {}, set()
    for name, (dt, shape, data) in raw.items():
        if name.endswith("_scale_inv"):
            assert name[:-len("_scale_inv")] in raw, f"{name} without its weight"
            continue
        if dt == "F8_E4M3":
            assert bs, f"{name}: FP8 without quantization_config"
            sdt, sshape, sdata = raw[name + "_scale_inv"]
            want = (-(-shape[0] // bs[0]), -(-shape[1] // bs[1]))
            assert sdt == "F32" and tuple(sshape) == want, f"{name}_scale_inv: {sdt} {sshape}, want F32 {want}"
            codes = np.frombuffer(data, dtype=np.uint8).reshape(shape)
            scale = np.frombuffer(sdata, dtype=np.float32).reshape(sshape)
            out[name] = ("BF16", tuple(shape), dequantise(codes, scale, *bs).tobytes())
            done.add(name)
        else:
            out[name] = (dt, tuple(shape), data)
    return out, done


class DeepSeekModel(Model):
    """A Hugging Face DeepSeek-V3 / V2 checkpoint (FP8 weights dequantised to bf16)."""

    def __init__(self, src):
        super().__init__(src)
        c = self.cfg
        assert c["model_type"] in ("deepseek_v3", "deepseek_v2", "kimi_k2"), f"{src}: model_type {c['model_type']}"
        self.raw, self.fp8_names = dequantised(c, self.raw)
        self.ql, self.kvl = c.get("q_lora_rank"), c["kv_lora_rank"]
        self.nope, self.rope_d, self.vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.dq = self.nope + self.rope_d
        self.N, self.topk, self.Fe = c["n_routed_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
        self.S = c["n_shared_experts"] * self.Fe if c.get("n_shared_experts") else None
        self.nextn = c.get("num_nextn_predict_layers") or 0
        self.moe = [is_moe_layer(c, i) for i in range(self.L + self.nextn)]
        self.scoring, self.topk_method = c.get("scoring_func", "softmax"), c.get("topk_method", "greedy")
        self.n_group, self.topk_group = c.get("n_group") or 1, c.get("topk_group") or 1
        self.norm_topk, self.rsf = bool(c.get("norm_topk_prob")), c.get("routed_scaling_factor", 1.0)
        self.router_name, self.shared_gate = "mlp.gate.weight", False
        for i in range(self.L + self.nextn):
            has = f"model.layers.{i}.mlp.gate.weight" in self.raw
            assert has == self.moe[i], f"layer {i}: router {'present' if has else 'missing'}, MoE={self.moe[i]}"

    def f(self, name):
        """A tensor as float32 (bf16 widened, F32 as is)."""
        a = as_array(self.raw[name])
        return bf16_to_f32(a) if a.dtype == np.uint16 else a.astype(np.float32)

    def g(self, i, suffix):
        return self.f(f"model.layers.{i}.{suffix}")

    def has_expert_bias(self, i):
        return f"model.layers.{i}.mlp.gate.e_score_correction_bias" in self.raw

    def expert_bias(self, i):
        """e_score_correction_bias of layer i: float32 [E]."""
        dt, shape, data = self.raw[f"model.layers.{i}.mlp.gate.e_score_correction_bias"]
        assert dt == "F32", f"layer {i}: e_score_correction_bias is {dt}"
        return np.frombuffer(data, dtype=np.float32).reshape(shape).copy()

    def expert(self, i, n):
        """(gate [Fe, H], up [Fe, H], down [H, Fe]) of routed expert n of layer i (bf16 bits)."""
        return tuple(self.layer(i, f"mlp.experts.{n}.{w}_proj.weight") for w in ("gate", "up", "down"))


def dequant(argv):
    """dequant SRC OUT: the bf16 twin of an FP8 checkpoint (DeepSeek's fp8_cast_bf16.py)."""
    src, out = argv
    cfg = json.load(open(os.path.join(src, "config.json")))
    raw, _ = dequantised(cfg, models.read_checkpoint(src))
    named = {n: (dt, np.frombuffer(data, dtype=models.ST_DTYPES[dt][0]).reshape(shape))
             for n, (dt, shape, data) in raw.items()}
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "bfloat16"
    shards = 2 if os.path.exists(os.path.join(src, "model.safetensors.index.json")) else 1
    models.write_checkpoint(out, named, cfg, shards)


def hf_errors(src, view):
    """check-hf: the differences of VIEW from SRC dequantised (empty list when equal)."""
    bad = []
    scfg = json.load(open(os.path.join(src, "config.json")))
    vcfg = json.load(open(os.path.join(view, "config.json")))
    bs = block_size(scfg)
    if not bs:
        return [f"{src}: no quantization_config (not an FP8 checkpoint)"], 0, 0, 0
    a = models.read_checkpoint(src)
    try:
        b = models.read_checkpoint(view)  # asserts: index and shards agree, each tensor once
    except AssertionError as e:
        return [f"{view}: {e}"], 0, 0, 0
    shards = sorted(f for f in os.listdir(view) if f.endswith(".safetensors"))
    if not os.path.exists(os.path.join(view, "model.safetensors.index.json")) and shards != ["model.safetensors"]:
        bad.append(f"no model.safetensors.index.json for the weight files {shards}")
    want = [n for n in a if not n.endswith("_scale_inv")]
    if set(b) != set(want):
        extra, missing = sorted(set(b) - set(want)), sorted(set(want) - set(b))
        bad.append(f"tensor names differ: extra {extra[:4]}, missing {missing[:4]}")
    fp8 = 0
    for name in want:
        if name not in b:
            continue
        dt, shape, data = a[name]
        vdt, vshape, vdata = b[name]
        if dt == "F8_E4M3":
            sdt, sshape, sdata = a[name + "_scale_inv"]
            codes = np.frombuffer(data, dtype=np.uint8).reshape(shape)
            scale = np.frombuffer(sdata, dtype=np.float32).reshape(sshape)
            exp, edt = dequantise(codes, scale, *bs).tobytes(), "BF16"
            fp8 += 1
        else:
            exp, edt = data, dt
        if vdt != edt or tuple(vshape) != tuple(shape):
            bad.append(f"{name}: {vdt} {list(vshape)}, want {edt} {list(shape)}")
        elif vdata != exp:
            e = np.frombuffer(exp, dtype=np.uint8)
            g = np.frombuffer(vdata, dtype=np.uint8)
            first = int(np.nonzero(e != g)[0][0])
            bad.append(f"{name}: bytes differ (first at byte {first}: {g[first]:#04x}, want {e[first]:#04x})")
    wcfg = {k: v for k, v in scfg.items() if k != "quantization_config"}
    wcfg["torch_dtype"] = "bfloat16"
    if "quantization_config" in vcfg:
        bad.append("config.json still has quantization_config")
    for k in sorted(set(wcfg) | set(vcfg)):
        if k != "quantization_config" and wcfg.get(k, "<absent>") != vcfg.get(k, "<absent>"):
            bad.append(f"config.json {k}: {vcfg.get(k, '<absent>')!r}, want {wcfg.get(k, '<absent>')!r}")
    return bad, fp8, len(want), len(a) - len(want)


def check_hf(argv):
    bad, fp8, n, scales = hf_errors(*argv)
    if bad:
        print("\n".join(bad[:20]), file=sys.stderr)
        sys.exit(1)
    print(f"{fp8} FP8 weights dequantised bit for bit, {n - fp8} other tensors unchanged (dtypes kept), "
          f"{scales} scales gone; config.json and index as expected")


# --- the rank files ---

def rows(w, r, n):
    """Column-parallel share r of n: rows of an [out, in] weight, in n contiguous parts."""
    k = w.shape[0] // n
    return w[r * k:(r + 1) * k]


def mla_keys(m, sd, pre, i, r, tp, te):
    """HF layer i's input norm and multi-latent attention as TP rank r's entries under pre."""
    L = lambda s: m.layer(i, s)  # noqa: E731
    a = pre + "self_attention."
    sd[pre + "input_layernorm.weight"] = L("input_layernorm.weight")
    if te:
        sd[pre + "input_layernorm._extra_state"] = None
        sd[a + "core_attention._extra_state"] = None
    sd[a + "linear_proj.weight"] = row_split(L("self_attn.o_proj.weight"), r, tp)
    sd[a + "linear_proj._extra_state"] = None
    if m.ql:
        qa = L("self_attn.q_a_proj.weight")
        sd[a + "linear_q_down_proj.weight"] = qa if te else rows(qa, r, tp)  # TELinear duplicated
        sd[a + "linear_q_down_proj._extra_state"] = None
        if te:
            sd[a + "linear_q_up_proj.layer_norm_weight"] = L("self_attn.q_a_layernorm.weight")
        sd[a + "linear_q_up_proj.weight"] = rows(L("self_attn.q_b_proj.weight"), r, tp)
        sd[a + "linear_q_up_proj._extra_state"] = None
    else:
        sd[a + "linear_q_proj.weight"] = rows(L("self_attn.q_proj.weight"), r, tp)
        sd[a + "linear_q_proj._extra_state"] = None
    kva = L("self_attn.kv_a_proj_with_mqa.weight")
    sd[a + "linear_kv_down_proj.weight"] = kva if te else rows(kva, r, tp)
    sd[a + "linear_kv_down_proj._extra_state"] = None
    if te:
        sd[a + "linear_kv_up_proj.layer_norm_weight"] = L("self_attn.kv_a_layernorm.weight")
    sd[a + "linear_kv_up_proj.weight"] = rows(L("self_attn.kv_b_proj.weight"), r, tp)
    sd[a + "linear_kv_up_proj._extra_state"] = None
    if not te:
        if m.ql:
            sd[a + "q_layernorm.weight"] = L("self_attn.q_a_layernorm.weight")
        sd[a + "kv_layernorm.weight"] = L("self_attn.kv_a_layernorm.weight")


class _QwenNames:
    """moe_reference.moe_mlp_keys reads Qwen2-MoE's shared-expert names (mlp.shared_expert.*);
    DeepSeek's are mlp.shared_experts.*. Everything else it reads is named alike."""

    def __init__(self, m):
        self.m, self.moe, self.N, self.S = m, m.moe, m.N, m.S
        self.router_name, self.shared_gate = "mlp.gate.weight", False

    def layer(self, i, suffix):
        return self.m.layer(i, suffix.replace("mlp.shared_expert.", "mlp.shared_experts."))

    def expert(self, i, n):
        return self.m.expert(i, n)


def mlp_keys(m, e, x, ep, etp, grouped):
    """keys(sd, pre, i, r, tp, te): HF layer i's pre-MLP norm and MLP (dense, or router, expert
    bias, EP rank e's experts split by expert-TP rank x, shared experts) under pre."""
    inner, names = moe_mlp_keys(e, x, ep, etp, grouped), _QwenNames(m)

    def keys(sd, pre, i, r, tp, te):
        part = {}
        inner(names, part, pre, i, r, tp, te)
        for k, v in part.items():
            sd[k] = v
            if k == pre + "mlp.router.weight" and m.has_expert_bias(i):
                sd[pre + "mlp.router.expert_bias"] = m.expert_bias(i)  # float32 buffer after the weight
    return keys


def rank_file(m, tp, pp, vpp, p, t, e, x, ep, etp, spec, grouped, mtp, first, last, vocab_pad, padded):
    """{"model" or "model{v}": state dict} of the file of TP rank t, EP rank e (experts split by
    expert-TP rank x) on stage p."""
    te = spec == "te"
    mlp = mlp_keys(m, e, x, ep, etp, grouped)
    chunks = {}
    for v in range(vpp):
        sd = {}
        last_chunk = p == pp - 1 and v == vpp - 1
        if (p == 0 and v == 0) or (mtp and last_chunk):
            sd["embedding.word_embeddings.weight"] = vocab_split(m, m.bits("model.embed_tokens.weight"), t, tp,
                                                                 padded, vocab_pad)
        start, count = chunk_layers(m.L, pp, vpp, p, v, first, last)
        for li in range(count):
            mla_keys(m, sd, f"decoder.layers.{li}.", start + li, t, tp, te)
            mlp(sd, f"decoder.layers.{li}.", start + li, t, tp, te)
        if last_chunk:
            sd["decoder.final_layernorm.weight"] = m.bits("model.norm.weight")
            if te:
                sd["decoder.final_layernorm._extra_state"] = None
            if mtp:
                j, q = m.L, "mtp.layers.0."
                for norm in ("enorm", "hnorm"):
                    sd[q + norm + ".weight"] = m.layer(j, norm + ".weight")
                    if te:
                        sd[q + norm + "._extra_state"] = None
                sd[q + "eh_proj.weight"] = rows(m.layer(j, "eh_proj.weight"), t, tp)
                sd[q + "eh_proj._extra_state"] = None
                mla_keys(m, sd, q + "mtp_model_layer.", j, t, tp, te)
                mlp(sd, q + "mtp_model_layer.", j, t, tp, te)
                sd[q + "final_layernorm.weight"] = m.layer(j, "shared_head.norm.weight")
                if te:
                    sd[q + "final_layernorm._extra_state"] = None
            sd["output_layer.weight"] = vocab_split(m, m.bits("lm_head.weight"), t, tp, padded, vocab_pad)
            sd["output_layer._extra_state"] = None
        chunks["model" if vpp == 1 else f"model{v}"] = sd
    return chunks


def expected_files(m, layout, spec="te", grouped=False, mtp=False, first=0, last=0, vocab_pad="zero"):
    """({rank dir: {model key: name -> uint16 bf16 bits, float32 array or None}}, padded vocab)."""
    tp, pp, vpp, ep, etp = layout
    assert not mtp or m.nextn >= 1, "--mtp: the checkpoint has no MTP layer"
    padded = padded_vocab(m, tp)
    return {name: rank_file(m, tp, pp, vpp, p, t, e, x, ep, etp, spec, grouped, mtp, first, last, vocab_pad, padded)
            for name, (p, t, e, x) in writer_files(tp, pp, ep, etp).items()}, padded


class OneOf(tuple):
    """An args field that may take any of these values."""


def concrete(args):
    """Expected args as a forward reads them: each OneOf as its first value."""
    return {k: v[0] if isinstance(v, OneOf) else v for k, v in args.items()}


def expected_args(m, layout, padded, grouped, mtp, torch, first=0, last=0):
    """The args fields the files must carry (name -> value or OneOf)."""
    tp, pp, vpp, ep, etp = layout
    want = dense_args(m, tp, pp, vpp, padded, torch, first, last)
    for k in ("kv_channels", "num_query_groups"):  # MLA uses neither
        want.pop(k)
    c, v3 = m.cfg, m.scoring == "sigmoid"
    rs = c.get("rope_scaling") or None
    want.update(
        qk_layernorm=True, add_qkv_bias=False, multi_latent_attention=True, q_lora_rank=m.ql,
        kv_lora_rank=m.kvl, qk_head_dim=m.nope, qk_pos_emb_head_dim=m.rope_d, v_head_dim=m.vd,
        group_query_attention=False, num_experts=m.N, moe_router_topk=m.topk, moe_ffn_hidden_size=m.Fe,
        moe_shared_expert_intermediate_size=m.S, moe_shared_expert_gate=False,
        moe_router_score_function=m.scoring, moe_router_enable_expert_bias=m.has_expert_bias(m.moe.index(True)),
        moe_router_dtype="fp32", moe_layer_freq=[int(x) for x in m.moe[:m.L]],
        expert_model_parallel_size=ep, expert_tensor_parallel_size=etp, moe_grouped_gemm=grouped,
        mtp_num_layers=1 if mtp else None, rope_type="yarn" if rs else "rope")
    if m.topk_method == "noaux_tc" and m.n_group > 1:
        want.update(moe_router_num_groups=m.n_group, moe_router_group_topk=m.topk_group)
    else:
        want.update(moe_router_num_groups=None, moe_router_group_topk=None)
    want["moe_router_topk_scaling_factor"] = m.rsf if m.rsf != 1.0 else OneOf((None, 1.0))
    # Megatron's sigmoid path ignores pre_softmax; DeepSeek-V2's unnormalised top-k = softmax first.
    want["moe_router_pre_softmax"] = OneOf((True, False)) if v3 else (not m.norm_topk)
    if rs:
        want.update(rotary_scaling_factor=float(rs["factor"]), mscale=float(rs.get("mscale", 1.0)),
                    mscale_all_dim=float(rs.get("mscale_all_dim", 0.0)),
                    # MLATransformerConfig's fields of these names (Kimi-K2's are 1 and 1)
                    beta_fast=float(rs.get("beta_fast", 32)), beta_slow=float(rs.get("beta_slow", 1)))
    return want


# --- forward passes (float32) ---

def causal_attention(q, k, v, scale):
    """q, k [heads, T, dk], v [heads, T, dv]; scaled, causal, softmax in fp32."""
    s = (q @ k.transpose(0, 2, 1)) * np.float32(scale)
    s = s + np.triu(np.full(s.shape[-2:], -np.inf, dtype=np.float32), 1)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def yarn_mscale(scale, mscale=1.0):  # modeling_deepseek.yarn_get_mscale = Megatron _yarn_get_mscale
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(dim, base, factor, original, beta_fast, beta_slow):
    """YaRN's blend of extrapolated and interpolated frequencies (modeling_deepseek.py
    DeepseekV3YarnRotaryEmbedding; Megatron YarnRotaryEmbedding.get_emb, round_to_int)."""
    def corr_dim(rot):
        return dim * math.log(original / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(math.floor(corr_dim(beta_fast)), 0), min(math.ceil(corr_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    mask = 1.0 - ramp
    pos = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    return (1.0 / (factor * pos)) * (1 - mask) + (1.0 / pos) * mask


def hf_rope(m, T):
    """(cos, sin [T, rope_d], softmax scale) of DeepSeek's attention: plain rope with rope_theta,
    or YaRN from rope_scaling (cos/sin times mscale / mscale_all_dim's attention factor; softmax
    scale times yarn_mscale(factor, mscale_all_dim)^2)."""
    d, base, rs = m.rope_d, float(m.theta), m.cfg.get("rope_scaling")
    scale, att = m.dq ** -0.5, 1.0
    if rs:
        assert rs.get("type", rs.get("rope_type")) == "yarn", f"rope_scaling {rs}"
        f = rs["factor"]
        inv = yarn_inv_freq(d, base, f, rs["original_max_position_embeddings"], rs.get("beta_fast", 32),
                            rs.get("beta_slow", 1))
        att = yarn_mscale(f, rs.get("mscale", 1)) / yarn_mscale(f, rs.get("mscale_all_dim", 0))
        if rs.get("mscale_all_dim"):
            scale *= yarn_mscale(f, rs["mscale_all_dim"]) ** 2
    else:
        inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    emb = np.outer(np.arange(T), inv)
    emb = np.concatenate([emb, emb], -1)
    return (np.cos(emb) * att).astype(np.float32), (np.sin(emb) * att).astype(np.float32), scale


def hf_rope_apply(x, cos, sin):
    """apply_rotary_pos_emb_interleave: x.view(..., d/2, 2).transpose(-1, -2), then rotate_half."""
    *lead, T, d = x.shape
    x = x.reshape(*lead, T, d // 2, 2).swapaxes(-1, -2).reshape(*lead, T, d)
    return x * cos + np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


def hf_attention(m, i, x):
    """x plus layer i's DeepseekV3Attention / DeepseekV2Attention (no cache)."""
    g = lambda s: m.g(i, "self_attn." + s)  # noqa: E731
    T, nh = x.shape[0], m.nh
    h = rms(x, m.g(i, "input_layernorm.weight"), m.eps)
    if m.ql:
        q = rms(h @ g("q_a_proj.weight").T, g("q_a_layernorm.weight"), m.eps) @ g("q_b_proj.weight").T
    else:
        q = h @ g("q_proj.weight").T
    q = q.reshape(T, nh, m.dq).transpose(1, 0, 2)
    q_pass, q_rot = q[..., :m.nope], q[..., m.nope:]
    ckv = h @ g("kv_a_proj_with_mqa.weight").T
    k_pass, k_rot = ckv[:, :m.kvl], ckv[:, m.kvl:]
    kv = (rms(k_pass, g("kv_a_layernorm.weight"), m.eps) @ g("kv_b_proj.weight").T)
    kv = kv.reshape(T, nh, m.nope + m.vd).transpose(1, 0, 2)
    k_pass, v = kv[..., :m.nope], kv[..., m.nope:]
    cos, sin, scale = hf_rope(m, T)
    q_rot, k_rot = hf_rope_apply(q_rot, cos, sin), hf_rope_apply(k_rot[None], cos, sin)
    q = np.concatenate([q_pass, q_rot], -1)
    k = np.concatenate([k_pass, np.broadcast_to(k_rot, (nh, T, m.rope_d))], -1)
    a = causal_attention(q, k, v, scale).transpose(1, 0, 2).reshape(T, nh * m.vd)
    return x + a @ g("o_proj.weight").T


def hf_route(m, i, logits):
    """(mask [T, E], weights [T, E]) of DeepseekV3MoE.route_tokens_to_experts (noaux_tc) or
    DeepSeek-V2's MoEGate (greedy)."""
    if m.scoring == "sigmoid":
        scores = sigmoid(logits)
    elif m.scoring == "softmax":
        scores = softmax(logits)
    else:
        raise ValueError(f"scoring_func {m.scoring}")
    if m.topk_method == "noaux_tc":
        T, E = scores.shape
        choice = scores + m.expert_bias(i)
        group = np.sort(choice.reshape(T, m.n_group, E // m.n_group), -1)[..., -2:].sum(-1)
        keep = np.repeat(topk_mask(group, m.topk_group), E // m.n_group, axis=1)
        mask = topk_mask(np.where(keep, choice, 0.0), m.topk)
    elif m.topk_method == "greedy":
        mask = topk_mask(scores, m.topk)
    else:
        raise ValueError(f"topk_method {m.topk_method}")
    w = np.where(mask, scores, 0)
    normed = m.topk > 1 and m.norm_topk
    if normed:
        w = w / (w.sum(-1, keepdims=True) + 1e-20)
    # V3 (and Kimi-K2, model_type kimi_k2 on the V3 class) scales always; V2's MoEGate only
    # when it does not renormalise.
    if m.cfg["architectures"][0] == "DeepseekV3ForCausalLM" or not normed:
        w = w * m.rsf
    return mask, w


def hf_mlp(m, i, h, routed=None):
    """Layer i's MLP on the normed input h: dense SwiGLU, or the routed experts weighted by
    hf_route plus the shared experts. routed[i] receives how many tokens each expert got."""
    if not m.moe[i]:
        return hf_swiglu(m, i, h)
    mask, w = hf_route(m, i, h @ m.g(i, "mlp.gate.weight").T)
    if routed is not None:
        routed[i] = mask.sum(0)
    out = 0
    for n in range(m.N):
        gate, up, down = (bf16_to_f32(a) for a in m.expert(i, n))
        out = out + w[:, n:n + 1] * ((silu(h @ gate.T) * (h @ up.T)) @ down.T)
    return out + hf_swiglu(m, i, h, "mlp.shared_experts.")


def hf_layer(m, i, x, routed=None):
    x = hf_attention(m, i, x)
    return x + hf_mlp(m, i, rms(x, m.g(i, "post_attention_layernorm.weight"), m.eps), routed)


def hf_forward(m, tokens, mtp=False, routed=None):
    """(logits [T, V], MTP logits [T-1, V] or None): Hugging Face semantics over the source. The
    MTP layer (DeepSeek-V3 report; vLLM deepseek_mtp.py): at position i, eh_proj([enorm(embedding
    of token i+1) | hnorm(the main model's final-normed output at i)]), the layer, then
    shared_head.head(shared_head.norm(.)), with the MTP layer's own embed_tokens and head."""
    x = m.f("model.embed_tokens.weight")[tokens]
    for i in range(m.L):
        x = hf_layer(m, i, x, routed)
    hn = rms(x, m.f("model.norm.weight"), m.eps)
    logits = hn @ m.f("lm_head.weight").T
    if not mtp:
        return logits, None
    j = m.L
    e = m.g(j, "embed_tokens.weight")[tokens[1:]]
    z = np.concatenate([rms(e, m.g(j, "enorm.weight"), m.eps), rms(hn[:-1], m.g(j, "hnorm.weight"), m.eps)], -1)
    z = hf_layer(m, j, z @ m.g(j, "eh_proj.weight").T, routed)
    return logits, rms(z, m.g(j, "shared_head.norm.weight"), m.eps) @ m.g(j, "shared_head.head.weight").T


def val(t):
    """A rank file's tensor as float32 numpy: torch bf16/fp32, uint16 bf16 bits, float32 array."""
    if hasattr(t, "float"):
        return t.float().numpy()
    return bf16_to_f32(t) if t.dtype == np.uint16 else np.asarray(t, dtype=np.float32)


# Megatron's argparse defaults (arguments.py, core_v0.17.1) for the fields the forward reads.
YARN_ONLY = ("original_max_position_embeddings", "beta_fast", "beta_slow")
ARG_DEFAULTS = dict(q_lora_rank=None, kv_lora_rank=32, qk_head_dim=128, qk_pos_emb_head_dim=64,
                    v_head_dim=128, rotary_scaling_factor=1.0, mscale=1.0, mscale_all_dim=0.0,
                    rope_type=None, rotary_base=10000, layernorm_epsilon=1e-5,
                    moe_router_score_function="softmax", moe_router_pre_softmax=False,
                    moe_router_num_groups=None, moe_router_group_topk=None,
                    moe_router_topk_scaling_factor=None, moe_router_enable_expert_bias=False,
                    moe_shared_expert_intermediate_size=None, moe_layer_freq=1, mtp_num_layers=None,
                    # MLATransformerConfig fields without an argument: its defaults.
                    original_max_position_embeddings=4096, beta_fast=32, beta_slow=1)


class MegatronDeepSeek:
    """Megatron's GPTModel with MLA, MoE and MTP over the rank files of a view: files {rank dir:
    {chunk key: state dict}}; layout = (tp, pp, vpp, ep, etp); args = the files' args (Namespace
    or dict). Every TP rank computes its own share from its own file; column-parallel outputs are
    gathered, row-parallel partial sums added."""

    def __init__(self, m, files, layout, args, first=0, last=0):
        self.m, self.files, self.first, self.last = m, files, first, last
        self.tp, self.pp, self.vpp, self.ep, self.etp = layout

        def get(k):
            v = args.get(k) if isinstance(args, dict) else getattr(args, k, None)
            # A missing field reads as Megatron's default; so does None for the YaRN fields that
            # only MLATransformerConfig has.
            return ARG_DEFAULTS.get(k) if v is None and (k in YARN_ONLY or not has(k)) else v

        def has(k):
            return k in args if isinstance(args, dict) else hasattr(args, k)
        self.get = get
        self.nh, self.eps = get("num_attention_heads"), get("layernorm_epsilon")
        self.ql, self.kvl = get("q_lora_rank"), get("kv_lora_rank")
        self.nope, self.rope_d, self.vd = get("qk_head_dim"), get("qk_pos_emb_head_dim"), get("v_head_dim")
        self.N, self.topk = get("num_experts"), get("moe_router_topk")
        freq = get("moe_layer_freq")
        self.moe = freq if isinstance(freq, list) else [int(i % freq == 0) for i in range(get("num_layers"))]
        self.mtp = bool(get("mtp_num_layers"))
        grid = rank_grid(self.tp, self.ep, self.etp)
        self.stages = [[files[file_name(t, p, next(e for tt, e, _, _ in grid if tt == t), self.pp, self.ep)]
                        for t in range(self.tp)] for p in range(self.pp)]

    def ck(self, v):
        return "model" if self.vpp == 1 else f"model{v}"

    def rope(self, T):
        """(cos, sin [T, rope_d], softmax scale): RotaryEmbedding or YarnRotaryEmbedding of the
        config that core_transformer_config_from_args makes of these args."""
        get, d = self.get, self.rope_d
        base, factor = float(get("rotary_base")), get("rotary_scaling_factor")
        rope_type = get("rope_type") or "yarn"  # None: MLATransformerConfig's default
        conc = 1.0
        if rope_type == "rope":
            inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
        else:
            inv = yarn_inv_freq(d, base, factor, get("original_max_position_embeddings"), get("beta_fast"),
                                get("beta_slow"))
            ms, msa = get("mscale"), get("mscale_all_dim")
            conc = yarn_mscale(factor) if ms is None or msa is None else \
                yarn_mscale(factor, ms) / yarn_mscale(factor, msa)
        emb = np.outer(np.arange(T), inv)
        emb = np.concatenate([emb, emb], -1)
        mscale = yarn_mscale(factor, get("mscale_all_dim"))
        scale = mscale * mscale / math.sqrt(self.nope + d)
        return (np.cos(emb) * conc).astype(np.float32), (np.sin(emb) * conc).astype(np.float32), scale

    @staticmethod
    def rope_apply(t, cos, sin):
        """_apply_rotary_pos_emb_bshd with multi_latent_attention: de-interleave, rotate half."""
        t = np.concatenate([t[..., 0::2], t[..., 1::2]], -1)
        d = t.shape[-1]
        return t * cos + np.concatenate([-t[..., d // 2:], t[..., :d // 2]], -1) * sin

    def attention(self, sds, pre, x, te):
        """x plus MLASelfAttention of layer prefix pre (input norm included)."""
        a = pre + "self_attention."
        T, tp = x.shape[0], len(sds)
        nh = self.nh // tp
        h = [rms(x, val(sd[pre + "input_layernorm.weight"]), self.eps) for sd in sds]

        gathered = {}

        def down(name, r):
            # TE: TELinear duplicated, whole on each rank; local: ColumnParallelLinear, gathered.
            if te:
                return h[r] @ val(sds[r][a + name]).T
            if name not in gathered:
                gathered[name] = np.concatenate([h[s] @ val(sd[a + name]).T for s, sd in enumerate(sds)], -1)
            return gathered[name]

        cos, sin, scale = self.rope(T)
        out = 0
        for r, sd in enumerate(sds):
            if self.ql:
                qn = val(sd[a + ("linear_q_up_proj.layer_norm_weight" if te else "q_layernorm.weight")])
                q = rms(down("linear_q_down_proj.weight", r), qn, self.eps) @ val(sd[a + "linear_q_up_proj.weight"]).T
            else:
                q = h[r] @ val(sd[a + "linear_q_proj.weight"]).T
            kvc = down("linear_kv_down_proj.weight", r)
            kv_c, k_pe = kvc[:, :self.kvl], kvc[:, self.kvl:]
            kn = val(sd[a + ("linear_kv_up_proj.layer_norm_weight" if te else "kv_layernorm.weight")])
            kv = rms(kv_c, kn, self.eps) @ val(sd[a + "linear_kv_up_proj.weight"]).T
            q = q.reshape(T, nh, self.nope + self.rope_d).transpose(1, 0, 2)
            kv = kv.reshape(T, nh, self.nope + self.vd).transpose(1, 0, 2)
            q_no_pe, q_pe = q[..., :self.nope], q[..., self.nope:]
            k_no_pe, v = kv[..., :self.nope], kv[..., self.nope:]
            q_pe = self.rope_apply(q_pe, cos, sin)
            k_pe = self.rope_apply(k_pe[None], cos, sin)
            query = np.concatenate([q_no_pe, q_pe], -1)
            key = np.concatenate([k_no_pe, np.broadcast_to(k_pe, (nh, T, self.rope_d))], -1)
            o = causal_attention(query, key, v, scale).transpose(1, 0, 2).reshape(T, nh * self.vd)
            out = out + o @ val(sd[a + "linear_proj.weight"]).T
        return x + out

    def route(self, logits, bias):
        """(mask, probs) of topk_routing_with_score_function (unfused, no replay)."""
        get, k = self.get, self.topk
        groups, gk = get("moe_router_num_groups"), get("moe_router_group_topk")

        def topk(scores):
            if gk:  # group_limited_topk
                T, E = scores.shape
                gs = np.sort(scores.reshape(T, groups, E // groups), -1)[..., -(k // gk):].sum(-1)
                keep = np.repeat(topk_mask(gs, gk), E // groups, axis=1)
                return topk_mask(np.where(keep, scores, -np.inf), k)
            return topk_mask(scores, k)

        fn = get("moe_router_score_function")
        if fn == "softmax":
            if get("moe_router_pre_softmax"):
                scores = softmax(logits)
                mask = topk(scores)
                probs = np.where(mask, scores, 0)
            else:
                mask = topk(logits)
                probs = np.where(mask, softmax(np.where(mask, logits, -np.inf)), 0)
        elif fn == "sigmoid":
            scores = sigmoid(logits)
            mask = topk(scores + bias if bias is not None else scores)
            probs = np.where(mask, scores, 0)
            if k > 1:
                probs = probs / (probs.sum(-1, keepdims=True) + 1e-20)
        else:
            raise ValueError(f"moe_router_score_function {fn}")
        if get("moe_router_topk_scaling_factor"):
            probs = probs * get("moe_router_topk_scaling_factor")
        return mask, probs

    def expert_file(self, p, v, e, x):
        g = x + self.etp * e  # the first rank with EP rank e and expert-TP rank x
        return self.files[file_name(g % self.tp, p, e, self.pp, self.ep)][self.ck(v)]

    def mlp(self, p, v, sds, pre, x, te, moe, routed=None, tag=None):
        """The pre-MLP norm and MLP of layer prefix pre: dense, or MoELayer (router, experts over
        EP and expert TP, shared experts over TP)."""
        if not moe:
            return megatron_dense_mlp(self, sds, pre, x, te)
        h = rms(x, val(sds[0][pre + "pre_mlp_layernorm.weight"]), self.eps)
        logits = h @ val(sds[0][pre + "mlp.router.weight"]).T  # moe_router_dtype fp32
        bias = val(sds[0][pre + "mlp.router.expert_bias"]) if self.get("moe_router_enable_expert_bias") else None
        mask, probs = self.route(logits, bias)
        if routed is not None:
            routed[tag] = mask.sum(0)
        local, out = self.N // self.ep, np.zeros_like(h)
        for n in range(self.N):
            e, j = divmod(n, local)
            got = np.nonzero(mask[:, n])[0]  # the token dispatcher sends an expert its tokens only
            if not len(got):
                continue
            shards = []
            for xr in range(self.etp):
                sd = self.expert_file(p, v, e, xr)
                if pre + f"mlp.experts.linear_fc1.weight{j}" in sd:  # TEGroupedMLP
                    shards.append((sd[pre + f"mlp.experts.linear_fc1.weight{j}"],
                                   sd[pre + f"mlp.experts.linear_fc2.weight{j}"]))
                else:
                    q = pre + f"mlp.experts.local_experts.{j}."
                    shards.append((sd[q + "linear_fc1.weight"], sd[q + "linear_fc2.weight"]))
            out[got] += probs[got, n:n + 1] * megatron_swiglu(shards, h[got])
        if self.get("moe_shared_expert_intermediate_size"):
            q = pre + "mlp.shared_experts."
            out = out + megatron_swiglu([(sd[q + "linear_fc1.weight"], sd[q + "linear_fc2.weight"]) for sd in sds], h)
        return out

    def layer(self, p, v, sds, pre, x, te, moe, routed=None, tag=None):
        x = self.attention(sds, pre, x, te)
        return x + self.mlp(p, v, sds, pre, x, te, moe, routed, tag)

    def embed(self, sds, tokens):
        emb = [val(sd["embedding.word_embeddings.weight"]) for sd in sds]
        rows_ = emb[0].shape[0]
        return np.stack([emb[t // rows_][t % rows_] for t in tokens])

    def forward(self, spec, tokens, routed=None):
        """(logits [T, V], MTP logits [T-1, V] or None) from the rank files alone."""
        te, m = spec == "te", self.m
        x = self.embed([rk[self.ck(0)] for rk in self.stages[0]], tokens)
        for v in range(self.vpp):
            for p, files in enumerate(self.stages):
                sds = [rk[self.ck(v)] for rk in files]
                start, _ = chunk_layers(m.L, self.pp, self.vpp, p, v, self.first, self.last)
                n = len({k.split(".")[2] for k in sds[0] if k.startswith("decoder.layers.")})
                for li in range(n):
                    x = self.layer(p, v, sds, f"decoder.layers.{li}.", x, te, self.moe[start + li], routed, start + li)
        p, v = self.pp - 1, self.vpp - 1
        sds = [rk[self.ck(v)] for rk in self.stages[-1]]
        hn = rms(x, val(sds[0]["decoder.final_layernorm.weight"]), self.eps)

        def head(z):
            return np.concatenate([z @ val(sd["output_layer.weight"]).T for sd in sds], 1)[:, :m.vocab]
        logits = head(hn)
        if not self.mtp:
            return logits, None
        # MultiTokenPredictionLayer: input ids rolled by -1 (last zeroed), the stage's own
        # embedding, enorm / hnorm, eh_proj (column-parallel, gathered), the layer, final norm,
        # then the shared output layer.
        q = "mtp.layers.0."
        rolled = np.concatenate([tokens[1:], [0]])
        e = rms(self.embed(sds, rolled), val(sds[0][q + "enorm.weight"]), self.eps)
        hh = rms(hn, val(sds[0][q + "hnorm.weight"]), self.eps)
        z = np.concatenate([np.concatenate([e, hh], -1) @ val(sd[q + "eh_proj.weight"]).T for sd in sds], -1)
        z = self.layer(p, v, sds, q + "mtp_model_layer.", z, te, self.moe[-1], routed, "mtp")
        z = rms(z, val(sds[0][q + "final_layernorm.weight"]), self.eps)
        return logits, head(z)[:-1]


def logits_error(m, megatron, spec, mtp, tokens=TOKENS):
    """(max relative error of the Megatron logits against the HF ones, main and MTP heads together;
    the fewest tokens any expert of any MoE layer got in the HF forward)."""
    # The HF logits are kept on the model itself: a cache keyed by id(m) handed a later model the
    # logits of a freed one whose id it reused.
    cache = m.__dict__.setdefault("hf_logits_cache", {})
    key = (mtp, tokens.tobytes())
    if key not in cache:
        routed = {}
        ref, ref_mtp = hf_forward(m, tokens, mtp, routed)
        cache[key] = ref, ref_mtp, min(int(c.min()) for c in routed.values())
    ref, ref_mtp, fewest = cache[key]
    got, got_mtp = megatron.forward(spec, tokens)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    if mtp:
        if got_mtp is None:
            return float("inf"), fewest
        err = max(err, float(np.abs(got_mtp - ref_mtp).max() / np.abs(ref_mtp).max()))
    return err, fewest


# --- check a mounted view ---

def compare_chunk(name, got, exp, errors, torch):
    """One chunk's state dict against the expectation: keys in order, None entries, dtype (bf16,
    or float32 for expert_bias), shape and bits."""
    if list(got) != list(exp):
        g, e = list(got), list(exp)
        i = next((i for i, (x, y) in enumerate(zip(g, e)) if x != y), min(len(g), len(e)))
        errors.append(f"{name}: keys differ at #{i}: got {g[i] if i < len(g) else '<end>'!r}, "
                      f"want {e[i] if i < len(e) else '<end>'!r}; missing {sorted(set(e) - set(g))[:3]}, "
                      f"extra {sorted(set(g) - set(e))[:3]}")
        return
    for k, v in exp.items():
        t = got[k]
        if v is None:
            if t is not None:
                errors.append(f"{name}/{k}: {type(t).__name__}, want None")
            continue
        f32 = v.dtype == np.float32
        dt = torch.float32 if f32 else torch.bfloat16
        if t is None or not hasattr(t, "dtype") or t.dtype != dt or tuple(t.shape) != v.shape:
            have = None if t is None else (getattr(t, "dtype", type(t)), tuple(getattr(t, "shape", ())))
            errors.append(f"{name}/{k}: {have} != {dt} {v.shape}")
            continue
        bits = (t.contiguous().numpy().view(np.uint32), v.view(np.uint32)) if f32 else \
            (t.contiguous().view(torch.int16).numpy().view(np.uint16), v)
        if not np.array_equal(*bits):
            diff = np.argwhere(bits[0] != bits[1])
            errors.append(f"{name}/{k}: {len(diff)} values differ, first at {tuple(int(i) for i in diff[0])}")


def args_errors(name, args, want):
    out = []
    for k, w in want.items():
        got = getattr(args, k, "<missing>")

        def same(g, x):  # booleans and None by identity (1 is not True), the rest by value
            return g is x if isinstance(x, bool) or x is None else (g is not None and g == x)
        if not (any(same(got, x) for x in w) if isinstance(w, OneOf) else same(got, w)):
            want_s = "one of " + repr(tuple(w)) if isinstance(w, OneOf) else repr(w)
            out.append(f"{name}: args.{k} = {got!r}, want {want_s}")
    return out


def compare_view(a, want, expect_args, torch):
    """reference.compare_view with DeepSeek's args rules (OneOf) and chunk comparison."""
    return reference.compare_view(a, want, expect_args, torch, args_errors=args_errors, compare=compare_chunk)


def check(argv):
    ap = argparse.ArgumentParser(prog="deepseek_reference.py check")
    check_flags(ap)
    ap.add_argument("--mtp", action="store_true")
    ap.add_argument("--grouped", action="store_true")
    a = ap.parse_args(argv)
    import torch
    layout = parse_moe_layout(a.layout)
    m = DeepSeekModel(a.src)
    want, padded = expected_files(m, layout, a.spec, a.grouped, a.mtp, a.pp_first, a.pp_last, a.vocab_pad)
    expect = expected_args(m, layout, padded, a.grouped, a.mtp, torch, a.pp_first, a.pp_last)
    errors, loaded = compare_view(a, want, expect, torch)
    if errors:
        print("\n".join(errors[:20]) + (f"\n... {len(errors) - 20} more" if len(errors) > 20 else ""), file=sys.stderr)
        sys.exit(1)
    files = {k: {c: loaded[k][c] for c in want[k]} for k in want}
    args = concrete(expect) if a.no_args else next(iter(loaded.values()))["args"]
    err, fewest = logits_error(m, MegatronDeepSeek(m, files, layout, args, a.pp_first, a.pp_last), a.spec, a.mtp)
    if not err < TOLERANCE:
        print(f"logits differ: max relative error {err:.3g}" + (" (main or MTP head)" if a.mtp else ""),
              file=sys.stderr)
        sys.exit(1)
    print(f"{a.layout} {a.spec}{' grouped' if a.grouped else ''}{' mtp' if a.mtp else ''}: {len(want)} files, "
          f"every tensor equal; logits max rel err {err:.2g}" + ("" if fewest else " (some expert got no token)"))


# --- damaged checkpoints for refusal tests ---

def _index(d):
    p = os.path.join(d, "model.safetensors.index.json")
    return (p, json.load(open(p))) if os.path.exists(p) else (None, None)


def _where(d, name):
    p, idx = _index(d)
    return idx["weight_map"][name] if idx else "model.safetensors"


def _rewrite(d, fname, edit):
    """Reads shard fname, lets edit(named) change {name: (dtype, array)}, writes it back and keeps
    the index (weight_map, total_size) consistent."""
    path = os.path.join(d, fname)
    tensors, header = read_safetensors(path)
    named = {n: (dt, np.frombuffer(raw, dtype=models.ST_DTYPES[dt][0]).reshape(shape))
             for n, (dt, shape, raw) in tensors.items()}
    edit(named)
    write_safetensors(path, named, header.get("__metadata__"))
    p, idx = _index(d)
    if idx:
        wm = {n: f for n, f in idx["weight_map"].items() if f != fname}
        wm.update({n: fname for n in named})
        total = 0
        for f in sorted(set(wm.values())):
            total += sum(len(raw) for _, _, raw in read_safetensors(os.path.join(d, f))[0].values())
        with open(p, "w") as fh:
            fh.write(json.dumps({"metadata": {"total_size": total}, "weight_map": wm}, indent=2, sort_keys=True) + "\n")


def _config(d, edit):
    p = os.path.join(d, "config.json")
    c = json.load(open(p))
    edit(c)
    with open(p, "w") as fh:
        json.dump(c, fh, indent=2)


def bad(argv):
    d, kind = argv
    names = list(models.read_checkpoint(d))
    scale = next((n for n in names if n.endswith("_scale_inv")), None)
    if kind in ("scale-shape", "scale-dtype", "no-scale", "method", "block") and not scale:
        sys.exit(f"{kind}: {d} is not an FP8 checkpoint")
    if kind in ("scale-shape", "scale-dtype", "no-scale"):
        def edit(named):
            dt, s = named[scale]
            if kind == "scale-shape":
                named[scale] = (dt, np.concatenate([s, s[-1:]]))  # one block row too many
            elif kind == "scale-dtype":
                named[scale] = ("BF16", bf16_bits(s))
            else:
                del named[scale]
        _rewrite(d, _where(d, scale), edit)
    elif kind == "method":
        _config(d, lambda c: c["quantization_config"].update(quant_method="awq"))
    elif kind == "block":
        _config(d, lambda c: c["quantization_config"].update(weight_block_size=[128, 0]))
    elif kind == "bias-shape":
        name = next((n for n in names if n.endswith("e_score_correction_bias")), None)
        if not name:
            sys.exit(f"bias-shape: {d} has no e_score_correction_bias")
        _rewrite(d, _where(d, name), lambda named: named.update(
            {name: ("F32", np.concatenate([named[name][1], np.zeros(1, np.float32)]))}))
    elif kind == "no-kv-norm":
        name = "model.layers.0.self_attn.kv_a_layernorm.weight"
        _rewrite(d, _where(d, name), lambda named: named.pop(name))
    elif kind == "group":
        _config(d, lambda c: c.update(n_group=3))
    elif kind == "topk-method":
        _config(d, lambda c: c.update(topk_method="group_limited_greedy"))
    else:
        sys.exit(f"bad: unknown KIND {kind}")
    print(f"{d}: {kind}" + (f" ({scale})" if kind in ("scale-shape", "scale-dtype", "no-scale") else ""))


# --- self-test ---

SELFTEST_LAYOUTS = [  # (layout, pp_first, pp_last)
    ("tp1pp1", 0, 0), ("tp2pp1ep4", 0, 0), ("tp4pp1ep2etp1", 0, 0), ("tp1pp2ep2", 0, 0),
    ("tp2pp2vpp2ep2etp1", 0, 0), ("tp2pp1ep8etp1", 0, 0), ("tp4pp1etp2", 0, 0), ("tp2pp2ep2", 3, 1),
    ("tp1pp4ep2", 0, 0),
]
# Layouts whose wrong views are tried (where a model has MTP, without it only in the first).
MUTATED = ["tp2pp1ep4", "tp2pp2vpp2ep2etp1", "tp4pp1ep2etp1"]

# The keys of one MoE layer as Megatron's module order gives them (TransformerLayer,
# MLASelfAttention, MoELayer, TopKRouter, SequentialMLP, SharedExpertMLP), written out by hand.
V3_MOE_LAYER_KEYS = {
    "te": ["input_layernorm.weight", "input_layernorm._extra_state",
           "self_attention.core_attention._extra_state", "self_attention.linear_proj.weight",
           "self_attention.linear_proj._extra_state", "self_attention.linear_q_down_proj.weight",
           "self_attention.linear_q_down_proj._extra_state", "self_attention.linear_q_up_proj.layer_norm_weight",
           "self_attention.linear_q_up_proj.weight", "self_attention.linear_q_up_proj._extra_state",
           "self_attention.linear_kv_down_proj.weight", "self_attention.linear_kv_down_proj._extra_state",
           "self_attention.linear_kv_up_proj.layer_norm_weight", "self_attention.linear_kv_up_proj.weight",
           "self_attention.linear_kv_up_proj._extra_state", "pre_mlp_layernorm.weight",
           "pre_mlp_layernorm._extra_state", "mlp.router.weight", "mlp.router.expert_bias"],
    "local": ["input_layernorm.weight", "self_attention.linear_proj.weight",
              "self_attention.linear_proj._extra_state", "self_attention.linear_q_down_proj.weight",
              "self_attention.linear_q_down_proj._extra_state", "self_attention.linear_q_up_proj.weight",
              "self_attention.linear_q_up_proj._extra_state", "self_attention.linear_kv_down_proj.weight",
              "self_attention.linear_kv_down_proj._extra_state", "self_attention.linear_kv_up_proj.weight",
              "self_attention.linear_kv_up_proj._extra_state", "self_attention.q_layernorm.weight",
              "self_attention.kv_layernorm.weight", "pre_mlp_layernorm.weight", "mlp.router.weight",
              "mlp.router.expert_bias"],
}
V3_EXPERT_TAIL = [f"mlp.experts.local_experts.{{j}}.{fc}.{x}" for fc in ("linear_fc1", "linear_fc2")
                  for x in ("weight", "_extra_state")]
V3_SHARED_TAIL = ["mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts.linear_fc1._extra_state",
                  "mlp.shared_experts.linear_fc2.weight", "mlp.shared_experts.linear_fc2._extra_state"]
V3_MTP_HEAD = {"te": ["enorm.weight", "enorm._extra_state", "hnorm.weight", "hnorm._extra_state", "eh_proj.weight",
                      "eh_proj._extra_state"],
               "local": ["enorm.weight", "hnorm.weight", "eh_proj.weight", "eh_proj._extra_state"]}


def copy_files(files):
    return {n: {c: dict(sd) for c, sd in f.items()} for n, f in files.items()}


def per_rank(files, owners, key):
    """{TP rank: the value of key (the first file of that TP rank holding it)}."""
    out = {}
    for n in sorted(files):
        for sd in files[n].values():
            if key in sd:
                out.setdefault(owners[n][1], sd[key])
    return out


def replaced(files, owners, key, fn):
    """files with every occurrence of key replaced by fn(value, TP rank of its file)."""
    bad = copy_files(files)
    hit = 0
    for n, f in bad.items():
        for sd in f.values():
            if key in sd:
                sd[key], hit = fn(sd[key], owners[n][1]), hit + 1
    assert hit, f"no {key} in the expected files"
    return bad


def head_swap(w, first, head):
    """Each head's [first rows | rest] as [rest | first rows] (rows of an [heads*head, in] weight)."""
    x = w.reshape(-1, head, w.shape[1])
    return np.concatenate([x[:, first:], x[:, :first]], 1).reshape(w.shape)


def mutations(m, files, owners, layout, spec, mtp, args):
    """Wrong views that a careless converter could make, each (what, files, args); the forward
    must tell every one from the right view."""
    tp, te = layout[0], spec == "te"
    a = "decoder.layers.0.self_attention."
    qn = a + ("linear_q_up_proj.weight" if m.ql else "linear_q_proj.weight")
    out = []
    if tp > 1:
        q = per_rank(files, owners, qn)
        out.append(("q up-projection shards of TP ranks 0 and 1 exchanged",
                    replaced(files, owners, qn, lambda w, t: q[1 - t] if t < 2 else w), args))
        full = np.concatenate([per_rank(files, owners, a + "linear_kv_up_proj.weight")[t] for t in range(tp)])
        out.append(("kv up-projection rows dealt round-robin over TP instead of in blocks",
                    replaced(files, owners, a + "linear_kv_up_proj.weight", lambda w, t: full[t::tp]), args))
    out.append(("q per head [rope | nope] instead of [nope | rope]",
                replaced(files, owners, qn, lambda w, t: head_swap(w, m.nope, m.dq)), args))
    out.append(("kv up-projection per head [v | k_nope] instead of [k_nope | v]",
                replaced(files, owners, a + "linear_kv_up_proj.weight",
                         lambda w, t: head_swap(w, m.nope, m.nope + m.vd)),
                args))
    kvd = a + "linear_kv_down_proj.weight"
    kfull = np.concatenate([per_rank(files, owners, kvd)[t] for t in range(1 if te else tp)])
    kswap = np.concatenate([kfull[m.kvl:], kfull[:m.kvl]])
    out.append(("kv down-projection [rope | kv_lora] instead of [kv_lora | rope]",
                replaced(files, owners, kvd, lambda w, t: kswap if te else rows(kswap, t, tp)), args))
    if m.ql:
        qd = a + "linear_q_down_proj.weight"
        out.append(("q down-projection rows reversed", replaced(files, owners, qd, lambda w, t: w[::-1]), args))
    # The first MoE layer present in the files.
    moe = next(k[:-len("mlp.router.weight")] for n in sorted(files) for sd in files[n].values() for k in sd
               if k.endswith("mlp.router.weight"))
    if m.has_expert_bias(m.moe.index(True)):
        out.append(("expert_bias zeroed", replaced(files, owners, moe + "mlp.router.expert_bias",
                                                   lambda w, t: np.zeros_like(w)), args))
        nobias = copy_files(files)
        for f in nobias.values():
            for sd in f.values():
                sd.pop(moe + "mlp.router.expert_bias", None)
        out.append(("expert_bias dropped", nobias, args))
    swapped = copy_files(files)
    for f in swapped.values():
        for sd in f.values():
            for fc in ("linear_fc1", "linear_fc2"):
                for k0, k1 in ((moe + f"mlp.experts.local_experts.0.{fc}.weight",
                                moe + f"mlp.experts.local_experts.1.{fc}.weight"),
                               (moe + f"mlp.experts.{fc}.weight0", moe + f"mlp.experts.{fc}.weight1")):
                    if k0 in sd and k1 in sd:
                        sd[k0], sd[k1] = sd[k1], sd[k0]
    out.append(("two experts swapped", swapped, args))
    out.append(("shared expert fc1 [up; gate] instead of [gate; up]",
                replaced(files, owners, moe + "mlp.shared_experts.linear_fc1.weight",
                         lambda w, t: np.concatenate([w[w.shape[0] // 2:], w[:w.shape[0] // 2]])), args))
    out.append(("shared expert dropped", files, dict(args, moe_shared_expert_intermediate_size=None)))
    if m.scoring == "sigmoid":
        out.append(("softmax routing instead of sigmoid", files, dict(args, moe_router_score_function="softmax")))
        out.append(("routed_scaling_factor ignored", files, dict(args, moe_router_topk_scaling_factor=None)))
        out.append(("expert bias not enabled", files, dict(args, moe_router_enable_expert_bias=False)))
        if m.n_group > 1:
            out.append(("group-limited top-k disabled", files,
                        dict(args, moe_router_num_groups=None, moe_router_group_topk=None)))
    else:
        out.append(("sigmoid routing instead of softmax", files, dict(args, moe_router_score_function="sigmoid")))
        out.append(("top-k before softmax (pre_softmax off)", files, dict(args, moe_router_pre_softmax=False)))
    if m.cfg.get("rope_scaling"):
        out.append(("YaRN mscale_all_dim dropped", files, dict(args, mscale_all_dim=0.0)))
        out.append(("plain rope instead of YaRN", files, dict(args, rope_type="rope")))
    else:
        out.append(("rope_type left unset (Megatron's MLA default: yarn) with a YaRN factor", files,
                    dict(args, rope_type=None, rotary_scaling_factor=40.0)))
    if mtp:
        q = "mtp.layers.0."
        norms = copy_files(files)
        for f in norms.values():
            for sd in f.values():
                if q + "enorm.weight" in sd:
                    sd[q + "enorm.weight"], sd[q + "hnorm.weight"] = sd[q + "hnorm.weight"], sd[q + "enorm.weight"]
        out.append(("MTP enorm and hnorm exchanged", norms, args))
        out.append(("MTP eh_proj [hidden | embedding] instead of [embedding | hidden]",
                    replaced(files, owners, q + "eh_proj.weight",
                             lambda w, t: np.concatenate([w[:, w.shape[1] // 2:], w[:, :w.shape[1] // 2]], 1)), args))
        out.append(("MTP final_layernorm = the decoder's", replaced(files, owners, q + "final_layernorm.weight",
                                                                  lambda w, t: m.bits("model.norm.weight")), args))
    return out


def selftest_model(tag, src, layouts, failures, mtps=(False,)):
    import torch
    m = DeepSeekModel(src)
    worst, n, tried, before = 0.0, 0, 0, len(failures)
    for layout_name, first, last in layouts:
        layout = parse_moe_layout(layout_name)
        tp, pp, vpp, ep, etp = layout
        owners = writer_files(tp, pp, ep, etp)
        for spec, grouped in (("te", False), ("te", True), ("local", False)):
            for mtp in mtps:
                files, padded = expected_files(m, layout, spec, grouped, mtp, first, last)
                args = concrete(expected_args(m, layout, padded, grouped, mtp, torch))
                what = f"{tag} {layout_name}{f' first {first} last {last}' if first else ''} {spec}" \
                       f"{' grouped' if grouped else ''}{' mtp' if mtp else ''}"
                err, fewest = logits_error(m, MegatronDeepSeek(m, files, layout, args, first, last), spec, mtp)
                worst, n = max(worst, err), n + 1
                if not err < TOLERANCE:
                    failures.append(f"{what}: logits max rel err {err:.3g}")
                if fewest == 0:
                    failures.append(f"{what}: some expert got no token; the forward does not cover it")
                if layout_name not in MUTATED or grouped or (len(mtps) > 1 and not mtp and layout_name != MUTATED[0]):
                    continue
                for wrong, bad, bargs in mutations(m, files, owners, layout, spec, mtp, args):
                    tried += 1
                    try:
                        e, _ = logits_error(m, MegatronDeepSeek(m, bad, layout, bargs, first, last), spec, mtp)
                    except (KeyError, ValueError, IndexError, AssertionError):
                        continue  # the forward cannot even run on it: caught
                    if e < TOLERANCE:
                        failures.append(f"{what}: {wrong}: not detected by the forward (max rel err {e:.2g})")
    print(f"# {tag}: {n} layout/spec/MTP combinations, Megatron forward vs HF forward max rel err {worst:.2g}; "
          f"{tried} wrong views tried" + ("" if len(failures) == before else f"; {len(failures) - before} FAILURES"))
    return m


def selftest_keys(m, failures):
    """The hand-written key order of one MoE layer and the MTP head (tp1pp1, TE and local)."""
    for spec in ("te", "local"):
        files, _ = expected_files(m, (1, 1, 1, 1, 1), spec, False, True)
        sd = files["mp_rank_00"]["model"]
        layer = [k[len("decoder.layers.2."):] for k in sd if k.startswith("decoder.layers.2.")]
        want = V3_MOE_LAYER_KEYS[spec] + [k.format(j=j) for j in range(m.N) for k in V3_EXPERT_TAIL] + V3_SHARED_TAIL
        if layer != want:
            failures.append(f"{spec}: MoE layer keys {layer[:20]} != {want[:20]}")
        top = [k for k in sd if not k.startswith(("decoder.layers.", "mtp.layers.0.mtp_model_layer."))]
        head = [k[len("mtp.layers.0."):] for k in top if k.startswith("mtp.layers.0.")]
        want_top = (["embedding.word_embeddings.weight", "decoder.final_layernorm.weight"]
                    + (["decoder.final_layernorm._extra_state"] if spec == "te" else [])
                    + [f"mtp.layers.0.{k}" for k in V3_MTP_HEAD[spec]]
                    + ["mtp.layers.0.final_layernorm.weight"]
                    + (["mtp.layers.0.final_layernorm._extra_state"] if spec == "te" else [])
                    + ["output_layer.weight", "output_layer._extra_state"])
        if top != want_top or head[:len(V3_MTP_HEAD[spec])] != V3_MTP_HEAD[spec]:
            failures.append(f"{spec}: model-level keys {top} != {want_top}")
        inner = [k for k in sd if k.startswith("mtp.layers.0.mtp_model_layer.")]
        i0, i1 = list(sd).index(inner[0]), list(sd).index(inner[-1])
        order = list(sd)
        if not (order.index("mtp.layers.0.eh_proj._extra_state") < i0 < i1
                < order.index("mtp.layers.0.final_layernorm.weight")):
            failures.append(f"{spec}: the MTP layer's keys are not between eh_proj and final_layernorm")
    # pp2 with MTP: the last stage holds the embedding too (gpt_model.py:149), first.
    files, _ = expected_files(m, (1, 2, 1, 1, 1), "te", False, True)
    if next(iter(files["mp_rank_00_001"]["model"])) != "embedding.word_embeddings.weight":
        failures.append("pp2 mtp: the last stage does not start with embedding.word_embeddings.weight")
    files, _ = expected_files(m, (1, 2, 1, 1, 1), "te", False, False)
    if "embedding.word_embeddings.weight" in files["mp_rank_00_001"]["model"]:
        failures.append("pp2 without mtp: the last stage holds an embedding")


def selftest_fp8(tmp, failures):
    """The FP8 writer, dequantiser and check-hf against each other."""
    # E4M3 rounding: exact codes stay, ties go to the even code, saturation at 448.
    vals = E4M3[:0x7F]
    mid = (vals[1:] + vals[:-1]) / 2
    got = e4m3_rne(mid)
    if not (np.array_equal(e4m3_rne(vals), np.arange(0x7F)) and np.all(got % 2 == 0)
            and e4m3_rne(np.array([1e9]))[0] == 0x7E and e4m3_rne(np.array([-1.0]))[0] == 0xB8):
        failures.append("e4m3_rne: exact values, ties to even, saturation or sign wrong")
    src, twin = os.path.join(tmp, "v3-fp8"), os.path.join(tmp, "v3-fp8-twin")
    write_model(src, "v3", fp8=True, shards=3)
    ref = DeepSeekModel(os.path.join(tmp, "v3"))  # the same seed in bf16
    m = DeepSeekModel(src)
    worst = 0.0
    for name in m.fp8_names:
        w, d = ref.f(name), m.f(name)
        worst = max(worst, float(np.abs(w - d).max() / np.abs(w).max()))
    if not 0 < worst < 1 / 8 or len(m.fp8_names) == 0:
        failures.append(f"FP8 round trip: worst relative error {worst:.3g} over {len(m.fp8_names)} weights")
    dequant([src, twin])
    if hf_errors(src, twin)[0]:
        failures.append(f"check-hf rejects the dequantised twin: {hf_errors(src, twin)[0][:3]}")
    twin_m = DeepSeekModel(twin)
    if {k: v for k, v in twin_m.raw.items()} != {k: v for k, v in m.raw.items()}:
        failures.append("the FP8 model's dequantised tensors differ from its twin's")
    # check-hf must reject: one byte changed; a scale left in; the F32 bias as bf16; a tensor gone.
    for what, damage in (("one byte of an FP8 weight changed", "byte"), ("a _scale_inv left in", "scale"),
                         ("the F32 expert bias as BF16", "bias"), ("a tensor missing", "missing"),
                         ("quantization_config kept", "config")):
        bad_twin = os.path.join(tmp, "twin-" + damage)
        dequant([src, bad_twin])
        name = sorted(m.fp8_names)[0]
        if damage == "config":
            _config(bad_twin, lambda c: c.update(quantization_config={"quant_method": "fp8"}))
        else:
            def edit(named, damage=damage, name=name):
                if damage == "byte":
                    dt, a = named[name]
                    a = a.copy()
                    a.flat[7] ^= 1
                    named[name] = (dt, a)
                elif damage == "scale":
                    named[name + "_scale_inv"] = ("F32", np.ones((1, 2), np.float32))
                elif damage == "bias":
                    b = next(n for n in named if n.endswith("e_score_correction_bias"))
                    named[b] = ("BF16", bf16_bits(named[b][1]))
                else:
                    named.pop(name)
            shard = _where(bad_twin, name) if damage != "bias" else _where(
                bad_twin, "model.layers.2.mlp.gate.e_score_correction_bias")
            _rewrite(bad_twin, shard, edit)
        if not hf_errors(src, bad_twin)[0]:
            failures.append(f"check-hf accepts a view with {what}")
    print(f"# FP8: {len(m.fp8_names)} weights, worst relative dequantisation error {worst:.3g}; twin accepted, "
          f"5 damaged twins rejected")
    return m


def selftest_bad(tmp, failures):
    """Each damage of `bad` leaves a checkpoint that DeepSeekModel refuses or that differs as said."""
    import shutil
    for kind, base in (("scale-shape", "v3-fp8"), ("scale-dtype", "v3-fp8"), ("no-scale", "v3-fp8"),
                       ("method", "v3-fp8"), ("block", "v3-fp8"), ("bias-shape", "v3"),
                       ("no-kv-norm", "v2lite"), ("group", "v3"), ("topk-method", "v3")):
        d = os.path.join(tmp, f"bad-{kind}")
        shutil.copytree(os.path.join(tmp, base), d)
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):
            bad([d, kind])
        models.read_checkpoint(d)  # index and shards still agree
        if not damaged(d, kind):
            failures.append(f"bad {kind}: the damage is not there")


def damaged(d, kind):
    """Whether checkpoint d shows the damage `bad` was asked for."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    if kind == "group":
        return cfg["n_routed_experts"] % cfg["n_group"] != 0
    try:
        m = DeepSeekModel(d)  # refuses wrong scales, methods and block sizes
        if kind == "bias-shape":
            return m.expert_bias(m.moe.index(True)).shape != (m.N,)
        if kind == "no-kv-norm":
            m.layer(0, "self_attn.kv_a_layernorm.weight")
        elif kind == "topk-method":
            hf_route(m, m.moe.index(True), np.zeros((1, m.N), np.float32))
        return False
    except (AssertionError, KeyError, ValueError):
        return True


def selftest(argv):
    ap = argparse.ArgumentParser(prog="deepseek_reference.py selftest")
    ap.parse_args(argv)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in ("v3", "v2lite"):
            write_model(os.path.join(tmp, variant), variant, shards=2)
        m3 = selftest_model("v3", os.path.join(tmp, "v3"), SELFTEST_LAYOUTS, failures, (False, True))
        selftest_model("v2lite", os.path.join(tmp, "v2lite"), SELFTEST_LAYOUTS, failures)
        write_model(os.path.join(tmp, "v3-yarn"), "v3", yarn=True)
        selftest_model("v3 yarn", os.path.join(tmp, "v3-yarn"), SELFTEST_LAYOUTS[:3], failures, (True,))
        selftest_keys(m3, failures)
        selftest_fp8(tmp, failures)
        selftest_model("v3 fp8", os.path.join(tmp, "v3-fp8"), SELFTEST_LAYOUTS[1:2], failures, (True,))
        selftest_bad(tmp, failures)
    if failures:
        print("\n".join(failures[:40]), file=sys.stderr)
        sys.exit(1)
    print("selftest passed")


if __name__ == "__main__":
    cmds = {"write": write, "dequant": dequant, "check-hf": check_hf, "check": check, "selftest": selftest,
            "bad": bad}
    if sys.argv[1:2] and sys.argv[1] in cmds:
        cmds[sys.argv[1]](sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
