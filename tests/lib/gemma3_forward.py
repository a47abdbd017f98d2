"""Gemma 3's forward with Megatron semantics over the rank files of a layout (numpy, float32),
written from mbridge's gemma3 model (ISEEKYAN/mbridge, mbridge/models/gemma3/: model.py
Gemma3Model, gpt_model.py Gemma3GPTModel and LanguageModelEmbeddingScale, transformer_layer.py
Gemma3TransformerLayer, projector.py Gemma3MultiModalProjector, transformer_config.py
get_vision_model_config; the attention mask of example/gemma3/load_model_and_forward.py
gen_attn_mask), Megatron-Bridge's Gemma 3 GPTModel for the text model (NVIDIA-NeMo/Megatron-Bridge,
models/gemma/gemma3_provider.py, models/common/te_layers.py TERowParallelLinearLayerNorm) and
Megatron-core (CLIPViTModel's siglip tower, TE's fused norms, column / row parallel linears,
is_layer_window_attention, RotaryEmbedding), not from ckptfs.

Every TP rank keeps its own copy of the residual stream and computes with its own tensors: the
fused norms of TELayerNormColumnParallelLinear from its copy, its rows of linear_qkv (whole query
groups: [q heads; k; v] per group) and linear_fc1 ([gate share; up share]), core attention on its
local heads, its columns of linear_proj / linear_fc2 as partial products summed (the all-reduce),
then the bias and post-norms (the text model's TERowParallelLinearLayerNorm, mbridge's
post_attention_layernorm / post_feedforward_layernorm) from its copy; the vocabulary-parallel
embedding and output layer as row blocks. Pipeline stages pass each rank's stream to the same
TP rank of the next stage. The language model's settings come from the rank files' args; the
tower's sizes from the source's vision_config (mbridge's get_vision_model_config hard-codes the
releases')."""
import math

import numpy as np

from reference import f32, gelu_erf, gelu_tanh, layer_norm, rms, rope


class Settings:
    """What the language model computes with, read from a rank file's args as Megatron-LM and the
    bridges configure it. VLM: mbridge's Gemma3Model (its MemoryEfficientAttention scales by
    query_pre_attn_scalar ** -0.5, its embedding by config.embed_scale); else Megatron-Bridge's
    (TEDotProductAttention's softmax_scale, the embedding by sqrt(hidden))."""

    def __init__(self, args, vlm):
        a = vars(args)
        self.vlm = vlm
        self.prefix = "language_model." if vlm else ""
        self.nh, self.ng, self.d = a["num_attention_heads"], a["num_query_groups"], a["kv_channels"]
        self.eps, self.vocab = a["layernorm_epsilon"], a["vocab_size"]
        self.zero_centred = a.get("layernorm_zero_centered_gamma", False)
        self.window = a["window_size"][0] + 1 if a.get("window_size") else None  # TE's (left, 0)
        self.skip = a.get("window_attn_skip_freq")
        self.theta, self.theta_local = a["rotary_base"], a["rope_local_base_freq"]
        # the full-attention layers' linear scaling (Megatron-Bridge's rope_scaling_factor; mbridge
        # fixes 8, the releases'), carried as Megatron-LM's seq_len_interpolation_factor
        self.interpolation = a.get("rotary_seq_len_interpolation_factor") or 1
        self.scale = a["query_pre_attn_scalar"] ** -0.5 if vlm else a["softmax_scale"]
        self.embed_scale = a["embed_scale"] if vlm else a["hidden_size"] ** 0.5
        # Megatron-LM's activation: openai_gelu (tanh), else torch's gelu
        self.act = gelu_tanh if a.get("openai_gelu") else gelu_erf
        self.post = ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight") if vlm else \
            ("self_attention.linear_proj.post_layernorm.weight", "mlp.linear_fc2.post_layernorm.weight")

    def norm(self, x, w):
        """TE's RMSNorm; zero-centred gamma: x / rms(x) * (1 + w)."""
        return rms(x, 1.0 + w if self.zero_centred else w, self.eps)

    def sliding(self, number):
        """Megatron-core's is_layer_window_attention of the layer numbered from 1 (mbridge's
        is_sliding: layer_number % sliding_window_pattern)."""
        return bool(self.window) and (self.skip is None or number % self.skip != 0)


def masks(T, window, blocks=()):
    """(global, sliding) allowed [T, T]: causal, and within the window for sliding layers; each
    image block [a, b) also sees itself whole (gen_attn_mask's token-type blocks)."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    causal = j <= i
    local = causal & (j > i - window) if window else causal
    same = np.zeros((T, T), dtype=bool)
    for a, b in blocks:
        same[a:b, a:b] = True
    return causal | same, local | same


def image_blocks(types):
    """The runs of token type 1 as [start, end) pairs."""
    out, start = [], None
    for i, t in enumerate(list(types) + [0]):
        if t == 1 and start is None:
            start = i
        elif t != 1 and start is not None:
            out.append((start, i))
            start = None
    return out


def core_attention(q, k, v, allowed, scale):
    """q [heads, T, d], k/v [groups, T, d]; softmax(q k^T * scale) over the allowed keys."""
    rep = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, rep, 0), np.repeat(v, rep, 0)
    s = np.where(allowed, q @ k.transpose(0, 2, 1) * np.float32(scale), -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def vocab_embedding(sds, key, tokens):
    """VocabParallelEmbedding: each rank looks up the tokens in its row block, zeros elsewhere;
    the partials summed."""
    out = 0
    lo = 0
    for sd in sds:
        w = f32(sd[key])
        inside = (tokens >= lo) & (tokens < lo + w.shape[0])
        part = np.zeros((len(tokens), w.shape[1]), dtype=np.float32)
        part[inside] = w[tokens[inside] - lo]
        out = out + part
        lo += w.shape[0]
    return out


def language_layer(c, sds, pre, xs, number, allowed):
    """Layer PRE (numbered NUMBER from 1) over the TP ranks' state dicts SDS and streams XS."""
    sliding = c.sliding(number)
    theta, allowed = (c.theta_local, allowed[1]) if sliding else (c.theta, allowed[0])
    interpolation = 1 if sliding else c.interpolation
    tp, hpg = len(sds), c.nh // c.ng
    if c.ng % tp:
        raise ValueError(f"{c.ng} query groups over {tp} ranks")
    groups = c.ng // tp
    partials = []
    for sd, x in zip(sds, xs):
        g = lambda s: f32(sd[pre + s])  # noqa: E731
        T = x.shape[0]
        h = c.norm(x, g("self_attention.linear_qkv.layer_norm_weight"))
        qkv = (h @ g("self_attention.linear_qkv.weight").T).reshape(T, groups, hpg + 2, c.d)
        q = qkv[:, :, :hpg].reshape(T, groups * hpg, c.d).transpose(1, 0, 2)
        k, v = qkv[:, :, hpg].transpose(1, 0, 2), qkv[:, :, hpg + 1].transpose(1, 0, 2)
        q = c.norm(q, g("self_attention.q_layernorm.weight"))
        k = c.norm(k, g("self_attention.k_layernorm.weight"))
        a = core_attention(rope(q, theta, None, interpolation), rope(k, theta, None, interpolation), v, allowed,
                           c.scale)
        partials.append(a.transpose(1, 0, 2).reshape(T, -1) @ g("self_attention.linear_proj.weight").T)
    reduced = sum(partials)
    xs = [x + c.norm(reduced, f32(sd[pre + c.post[0]])) for sd, x in zip(sds, xs)]
    partials = []
    for sd, x in zip(sds, xs):
        h = c.norm(x, f32(sd[pre + "mlp.linear_fc1.layer_norm_weight"]))
        a = h @ f32(sd[pre + "mlp.linear_fc1.weight"]).T
        gate, up = np.split(a, 2, axis=1)
        partials.append((c.act(gate) * up) @ f32(sd[pre + "mlp.linear_fc2.weight"]).T)
    reduced = sum(partials)
    return [x + c.norm(reduced, f32(sd[pre + c.post[1]])) for sd, x in zip(sds, xs)]


def tower(vc, sds, pixels):
    """mbridge's CLIPViTModel (siglip) on each rank of the first stage: conv1 as a matmul on the
    patches, the learned position embedding, TE layers (LayerNorm with bias, q/k/v per head with
    bias, no mask, Megatron's fast_gelu), ln_post; returns each rank's [patches, width]."""
    P, C, S = vc["patch_size"], vc.get("num_channels", 3), vc["image_size"]
    n, heads, eps = S // P, vc["num_attention_heads"], vc["layer_norm_eps"]
    dv = vc["hidden_size"] // heads
    patches = pixels.reshape(C, n, P, n, P).transpose(1, 3, 0, 2, 4).reshape(n * n, C * P * P)
    xs = []
    for sd in sds:
        w = f32(sd["vision_model.conv1.weight"])
        xs.append(patches @ w.reshape(w.shape[0], -1).T + f32(sd["vision_model.conv1.bias"])
                  + f32(sd["vision_model.position_embeddings.weight"]))
    local = heads // len(sds)
    for b in range(vc["num_hidden_layers"]):
        pre = f"vision_model.decoder.layers.{b}."
        g = lambda sd, s: f32(sd[pre + s])  # noqa: E731
        partials = []
        for sd, x in zip(sds, xs):
            h = layer_norm(x, g(sd, "self_attention.linear_qkv.layer_norm_weight"),
                           g(sd, "self_attention.linear_qkv.layer_norm_bias"), eps)
            qkv = h @ g(sd, "self_attention.linear_qkv.weight").T + g(sd, "self_attention.linear_qkv.bias")
            qkv = qkv.reshape(len(x), local, 3, dv).transpose(2, 1, 0, 3)  # [q|k|v, heads, T, dv]
            a = core_attention(qkv[0], qkv[1], qkv[2], True, dv ** -0.5)
            partials.append(a.transpose(1, 0, 2).reshape(len(x), -1) @ g(sd, "self_attention.linear_proj.weight").T)
        reduced = sum(partials)
        xs = [x + reduced + g(sd, "self_attention.linear_proj.bias") for sd, x in zip(sds, xs)]
        partials = []
        for sd, x in zip(sds, xs):
            h = layer_norm(x, g(sd, "mlp.linear_fc1.layer_norm_weight"), g(sd, "mlp.linear_fc1.layer_norm_bias"), eps)
            a = gelu_tanh(h @ g(sd, "mlp.linear_fc1.weight").T + g(sd, "mlp.linear_fc1.bias"))
            partials.append(a @ g(sd, "mlp.linear_fc2.weight").T)
        reduced = sum(partials)
        xs = [x + reduced + g(sd, "mlp.linear_fc2.bias") for sd, x in zip(sds, xs)]
    return [layer_norm(x, f32(sd["vision_model.ln_post.weight"]), f32(sd["vision_model.ln_post.bias"]), eps)
            for sd, x in zip(sds, xs)]


def projector(c, vc, tokens, sds, xs):
    """Gemma3MultiModalProjector on each rank: the patches average-pooled to TOKENS (a square),
    the zero-centred RMSNorm fused into mm_input_projection, the rank's rows of that
    column-parallel linear, the outputs gathered along the width."""
    n = vc["image_size"] // vc["patch_size"]
    side = math.isqrt(tokens)
    k = n // side
    parts = []
    for sd, x in zip(sds, xs):
        pooled = x.reshape(side, k, side, k, -1).mean(axis=(1, 3)).reshape(tokens, -1)
        h = c.norm(pooled, f32(sd["vision_projection.mm_input_projection.layer_norm_weight"]))
        parts.append(h @ f32(sd["vision_projection.mm_input_projection.weight"]).T)
    return np.concatenate(parts, 1)


def forward(stages, c, tokens, types=None, vision=None, pixels=None, image_token=None, mm_tokens=None):
    """Logits [T, vocab]. stages[p] = the state dicts ("model") of stage p's TP ranks in rank
    order; with VISION (the source's vision_config) the tower and projector run on the first
    stage and their rows replace the image tokens' embeddings (Gemma3Model._preprocess_data)."""
    tokens = np.asarray(tokens)
    pre = c.prefix
    first = stages[0]
    x = vocab_embedding(first, pre + "embedding.word_embeddings.weight", tokens) * np.float32(c.embed_scale)
    blocks = ()
    if vision is not None:
        image = projector(c, vision, mm_tokens, first, tower(vision, first, pixels))
        x[tokens == image_token] = image
        blocks = image_blocks(types)
    xs = [x] * len(first)
    allowed = masks(len(tokens), c.window, blocks)
    number = 0
    for sds in stages:
        n_layers = len({k[len(pre):].split(".")[2] for k in sds[0] if k.startswith(pre + "decoder.layers.")})
        for li in range(n_layers):
            number += 1
            xs = language_layer(c, sds, f"{pre}decoder.layers.{li}.", xs, number, allowed)
    last = stages[-1]
    xs = [c.norm(x, f32(sd[pre + "decoder.final_layernorm.weight"])) for sd, x in zip(last, xs)]
    # tied: the last stage's copy of the embedding, or with one stage the embedding itself
    key = pre + "output_layer.weight"
    key = key if key in last[0] else pre + "embedding.word_embeddings.weight"
    logits = np.concatenate([x @ f32(sd[key]).T for sd, x in zip(last, xs)], 1)
    return logits[:, :c.vocab]
