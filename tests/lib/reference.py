#!/usr/bin/python3
"""Independent reference for the Megatron views, written from DESIGN section 4 and Megatron's
own files (not from ckptfs's code): the expected rank files of a layout, and two forward passes,
one with Hugging Face semantics over the source weights and one with Megatron semantics over the
per-rank state dicts of a view (simulated TP ranks, pipeline stages and virtual chunks).

  reference.py check SRC VIEW_DIR LAYOUT [--spec te|local] [--pp-first N --pp-last N]
               [--vocab-pad zero|last] [--no-args] [--torch2]
Loads every rank file of VIEW_DIR with torch.load (torch 2.6 with --torch2: weights_only=True
and mmap=True), compares file set, keys in order, every tensor, args, and the logits of both
forward passes.
"""
import argparse
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import FUSED, as_array, bf16_to_f32, read_checkpoint, unfuse  # noqa: E402


def parse_layout(name):
    m = re.fullmatch(r"tp(\d+)pp(\d+)(?:vpp(\d+))?", name)
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)


def chunk_layers(L, P, V, p, v, first=0, last=0):
    """Megatron's get_transformer_layer_offset / layers per chunk, spelt out."""
    if P == 1:
        first = last = 0
    middle_stages = P - (1 if first else 0) - (1 if last else 0)
    middle = L - first - last
    per_mid = middle // (V * middle_stages) if middle_stages else 0
    rnd = L // V
    if p == 0 and first:
        return v * rnd, first // V
    start = v * rnd + (first // V) + (p - (1 if first else 0)) * per_mid
    count = last // V if (p == P - 1 and last) else per_mid
    return start, count


class Model:
    def __init__(self, src):
        self.cfg = json.load(open(os.path.join(src, "config.json")))
        self.raw = read_checkpoint(src)
        c = self.cfg
        self.L, self.H = c["num_hidden_layers"], c["hidden_size"]
        self.nh, self.ng = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
        self.d = c.get("head_dim", self.H // self.nh)
        self.F, self.vocab = c["intermediate_size"], c["vocab_size"]
        self.tied = c.get("tie_word_embeddings", False)
        self.bias = c["model_type"] in ("qwen2", "qwen2_moe") or c.get("attention_bias", False)
        self.qk = c["model_type"] in ("qwen3", "qwen3_moe")
        self.eps, self.theta = c.get("rms_norm_eps", 1e-6), c.get("rope_theta", 10000.0)
        # Phi-3 stores fused projections: self_attn.qkv_proj = [q; k; v] and
        # mlp.gate_up_proj = [gate; up], rows stacked (modeling_phi3.py slices its output so).
        # Only the split tensors stay in self.raw, so nothing below uses a fused one unsplit;
        # hf_forward alone reads the fused ones as stored (self.fused_raw).
        self.fused = c.get("model_type") in FUSED
        self.raw, self.fused_raw = unfuse(c, self.raw)

    def bits(self, name):  # uint16 bf16 bit patterns
        return as_array(self.raw[name])

    def layer(self, i, suffix):
        return self.bits(f"model.layers.{i}.{suffix}")


def padded_vocab(m, tp, divisible=128):
    mult = divisible * tp
    return (m.vocab + mult - 1) // mult * mult


def vocab_split(m, w, r, tp, padded, vocab_pad):
    rows = padded // tp
    pad_rows = [w[-1:]] * (padded - m.vocab) if vocab_pad == "last" else \
        [np.zeros((padded - m.vocab, w.shape[1]), dtype=w.dtype)]
    full = np.concatenate([w] + pad_rows)
    return full[r * rows:(r + 1) * rows]


def qkv_rows(m, i, r, tp, suffix):
    """TP rank r's rows of layer i's fused QKV (weight or bias), interleaved per query group."""
    q, k, v = (m.layer(i, f"self_attn.{x}_proj.{suffix}") for x in "qkv")
    hpg = m.nh // m.ng
    blocks = []
    for g in range(m.ng):
        blocks += [q[g * hpg * m.d:(g + 1) * hpg * m.d], k[g * m.d:(g + 1) * m.d], v[g * m.d:(g + 1) * m.d]]
    full = np.concatenate(blocks)
    R = full.shape[0]
    return full[r * R // tp:(r + 1) * R // tp]


def attention_keys(m, sd, pre, i, r, tp, te):
    """Layer i's entries from its start through the attention (and its q/k norms), TP rank r."""
    o = m.layer(i, "self_attn.o_proj.weight")
    if te:
        sd[pre + "self_attention.core_attention._extra_state"] = None
    else:
        sd[pre + "input_layernorm.weight"] = m.layer(i, "input_layernorm.weight")
    cols = o.shape[1] // tp
    sd[pre + "self_attention.linear_proj.weight"] = o[:, r * cols:(r + 1) * cols]
    sd[pre + "self_attention.linear_proj._extra_state"] = None
    if te:
        sd[pre + "self_attention.linear_qkv.layer_norm_weight"] = m.layer(i, "input_layernorm.weight")
    sd[pre + "self_attention.linear_qkv.weight"] = qkv_rows(m, i, r, tp, "weight")
    if m.bias:
        sd[pre + "self_attention.linear_qkv.bias"] = qkv_rows(m, i, r, tp, "bias")
    sd[pre + "self_attention.linear_qkv._extra_state"] = None
    if m.qk:
        sd[pre + "self_attention.q_layernorm.weight"] = m.layer(i, "self_attn.q_norm.weight")
        if te:
            sd[pre + "self_attention.q_layernorm._extra_state"] = None
        sd[pre + "self_attention.k_layernorm.weight"] = m.layer(i, "self_attn.k_norm.weight")
        if te:
            sd[pre + "self_attention.k_layernorm._extra_state"] = None


def swiglu_fc1(gate, up, r, n):
    """Column-parallel SwiGLU fc1 share r of n: [gate rows of the share; up rows of the share]."""
    f = gate.shape[0] // n
    return np.concatenate([gate[r * f:(r + 1) * f], up[r * f:(r + 1) * f]])


def row_split(w, r, n):
    """Row-parallel share r of n: columns of a [out, in] weight."""
    c = w.shape[1] // n
    return w[:, r * c:(r + 1) * c]


def dense_mlp_keys(m, sd, pre, i, r, tp, te, hf_prefix="mlp."):
    """Layer i's pre-MLP norm and dense SwiGLU MLP (HF {hf_prefix}{gate,up,down}_proj), TP rank r."""
    norm2 = m.layer(i, "post_attention_layernorm.weight")
    sd[pre + ("mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight")] = norm2
    gate, up = m.layer(i, hf_prefix + "gate_proj.weight"), m.layer(i, hf_prefix + "up_proj.weight")
    sd[pre + "mlp.linear_fc1.weight"] = swiglu_fc1(gate, up, r, tp)
    sd[pre + "mlp.linear_fc1._extra_state"] = None
    sd[pre + "mlp.linear_fc2.weight"] = row_split(m.layer(i, hf_prefix + "down_proj.weight"), r, tp)
    sd[pre + "mlp.linear_fc2._extra_state"] = None


def rank_file(m, tp, pp, vpp, p, r, spec, first, last, vocab_pad, padded, mlp_keys=dense_mlp_keys):
    """{"model" or "model{v}": state dict} of the file of TP rank r on stage p; mlp_keys(m, sd,
    pre, i, r, tp, te) adds global layer i's MLP part (norm included) under prefix pre."""
    te = spec == "te"
    chunks = {}
    for v in range(vpp):
        sd = {}
        if p == 0 and v == 0:
            sd["embedding.word_embeddings.weight"] = vocab_split(m, m.bits("model.embed_tokens.weight"), r, tp, padded, vocab_pad)
        start, count = chunk_layers(m.L, pp, vpp, p, v, first, last)
        for li in range(count):
            pre = f"decoder.layers.{li}."
            attention_keys(m, sd, pre, start + li, r, tp, te)
            mlp_keys(m, sd, pre, start + li, r, tp, te)
        if p == pp - 1 and v == vpp - 1:
            sd["decoder.final_layernorm.weight"] = m.bits("model.norm.weight")
            if te:
                sd["decoder.final_layernorm._extra_state"] = None
            if not m.tied:
                sd["output_layer.weight"] = vocab_split(m, m.bits("lm_head.weight"), r, tp, padded, vocab_pad)
            elif pp > 1:
                sd["output_layer.weight"] = vocab_split(m, m.bits("model.embed_tokens.weight"), r, tp, padded, vocab_pad)
            sd["output_layer._extra_state"] = None
        chunks["model" if vpp == 1 else f"model{v}"] = sd
    return chunks


def expected_files(m, tp, pp, vpp, spec, first=0, last=0, vocab_pad="zero", divisible=128):
    """{rank dir: {model key: OrderedDict name -> uint16 array or None}}"""
    padded = padded_vocab(m, tp, divisible)
    files = {}
    for p in range(pp):
        for r in range(tp):
            name = f"mp_rank_{r:02d}" if pp == 1 else f"mp_rank_{r:02d}_{p:03d}"
            files[name] = rank_file(m, tp, pp, vpp, p, r, spec, first, last, vocab_pad, padded)
    return files, padded


# --- forward passes (float32) ---

def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, theta, dim=None, interpolation=1.0):  # x [heads, T, d], HF rotate_half convention
    """Rotary embedding of the first DIM channels of each head (all by default), the rest passed
    through: partial rotary as Megatron's rotary_percent (RotaryEmbedding of kv_channels x
    rotary_percent, _apply_rotary_pos_emb_bshd's t_pass) and transformers' partial_rotary_factor.
    INTERPOLATION: Megatron's seq_len_interpolation_factor (positions divided by it: transformers'
    linear rope scaling)."""
    d = dim or x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = (np.arange(x.shape[1]) / interpolation)[:, None] * inv[None, :]
    return rotate_half(x, np.concatenate([ang, ang], -1))


def rotate_half(x, emb):
    """x [..., T, d] with its first emb.shape[-1] channels turned by the angles emb [T, dim]
    (rotate_half: channel c pairs with c + dim/2); the rest passed through."""
    d = emb.shape[-1]
    cos, sin = np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
    xr = x[..., :d]
    rot = np.concatenate([-xr[..., d // 2:], xr[..., :d // 2]], -1)
    return np.concatenate([xr * cos + rot * sin, x[..., d:]], -1)


def mrope(positions, theta, dim, sections, interleaved=False):
    """Megatron-core's MultimodalRotaryEmbedding for a VLM's language model, as a function of
    q or k [heads, T, d]: positions [3, T] (temporal, height, width); the frequencies of the
    first DIM channels of a head come from the three axes in mrope_section blocks (each block
    twice, as the frequencies are duplicated), or, interleaved (Qwen3-VL's
    apply_interleaved_mrope), frequency j from axis j % 3 within the axis' 3 x section."""
    inv = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    freqs = np.asarray(positions, dtype=np.float64)[:, :, None] * inv  # [3, T, dim/2]
    if interleaved:
        ang = freqs[0].copy()
        for axis in (1, 2):
            ang[:, axis:sections[axis] * 3:3] = freqs[axis][:, axis:sections[axis] * 3:3]
        emb = np.concatenate([ang, ang], -1)
    else:
        both = np.concatenate([freqs, freqs], -1)  # [3, T, dim]
        ends = np.cumsum(list(sections) * 2)[:-1]
        emb = np.concatenate([piece[i % 3] for i, piece in enumerate(np.split(both, ends, -1))], -1)
    return lambda x: rotate_half(x, emb)


def attention(q, k, v, nh, ng):  # q [nh, T, d], k/v [ng, T, d]
    rep = nh // ng
    k, v = np.repeat(k, rep, 0), np.repeat(v, rep, 0)
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    s += np.triu(np.full(s.shape[-2:], -np.inf, dtype=np.float32), 1)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def silu(x):
    return x / (1 + np.exp(-x))


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_tanh(x):
    """gelu(approximate="tanh"): Megatron's openai_gelu / fast_gelu."""
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def gelu_erf(x):
    """torch.nn.functional.gelu (erf), erf taken in float64."""
    import math
    return 0.5 * x * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2.0)).astype(x.dtype))


def hf_attention(m, i, x):
    """x plus layer i's attention block, Hugging Face semantics; for Phi-3 straight from the
    fused tensors as stored (not through models.unfuse), so a wrong split there shows as a
    forward mismatch."""
    g = lambda s: bf16_to_f32(m.layer(i, s))  # noqa: E731
    T = x.shape[0]
    h = rms(x, g("input_layernorm.weight"), m.eps)
    if m.fused:  # modeling_phi3.py: one matmul, its output sliced [q | k | v]
        qkv = h @ bf16_to_f32(as_array(m.fused_raw[f"model.layers.{i}.self_attn.qkv_proj.weight"])).T
        qe, ke = m.nh * m.d, m.nh * m.d + m.ng * m.d
        q, k, v = qkv[:, :qe], qkv[:, qe:ke], qkv[:, ke:]
    else:
        q, k, v = h @ g("self_attn.q_proj.weight").T, h @ g("self_attn.k_proj.weight").T, h @ g("self_attn.v_proj.weight").T
    if m.bias:
        q, k, v = q + g("self_attn.q_proj.bias"), k + g("self_attn.k_proj.bias"), v + g("self_attn.v_proj.bias")
    q = q.reshape(T, m.nh, m.d).transpose(1, 0, 2)
    k = k.reshape(T, m.ng, m.d).transpose(1, 0, 2)
    v = v.reshape(T, m.ng, m.d).transpose(1, 0, 2)
    if m.qk:
        q, k = rms(q, g("self_attn.q_norm.weight"), m.eps), rms(k, g("self_attn.k_norm.weight"), m.eps)
    a = attention(rope(q, m.theta), rope(k, m.theta), v, m.nh, m.ng)
    return x + a.transpose(1, 0, 2).reshape(T, -1) @ g("self_attn.o_proj.weight").T


def hf_swiglu(m, i, h, prefix="mlp."):
    """Layer i's dense SwiGLU MLP {prefix}{gate,up,down}_proj on the normed input h."""
    g = lambda s: bf16_to_f32(m.layer(i, prefix + s))  # noqa: E731
    if m.fused:  # modeling_phi3.py: gate, up = gate_up_proj(h).chunk(2); up * silu(gate)
        fused = bf16_to_f32(as_array(m.fused_raw[f"model.layers.{i}.mlp.gate_up_proj.weight"]))
        gate, up = np.split(h @ fused.T, 2, axis=1)
    else:
        gate, up = h @ g("gate_proj.weight").T, h @ g("up_proj.weight").T
    return (silu(gate) * up) @ g("down_proj.weight").T


def hf_forward(m, tokens, mlp=hf_swiglu):
    """Hugging Face semantics; mlp(m, i, h) is layer i's MLP on its normed input."""
    f = lambda n: bf16_to_f32(m.bits(n))  # noqa: E731
    x = f("model.embed_tokens.weight")[tokens]
    for i in range(m.L):
        x = hf_attention(m, i, x)
        x = x + mlp(m, i, rms(x, bf16_to_f32(m.layer(i, "post_attention_layernorm.weight")), m.eps))
    x = rms(x, f("model.norm.weight"), m.eps)
    return x @ f("model.embed_tokens.weight" if m.tied else "lm_head.weight").T


def chunk_key(v, vpp):
    """A rank file's key of virtual chunk v: "model", or "model{v}" with virtual stages."""
    return "model" if vpp == 1 else f"model{v}"


def load_release(view):
    """{rank dir: loaded rank file} of VIEW's release/ (weights_only, the args allowed as
    Megatron's loader allows them)."""
    import torch
    release = os.path.join(view, "release")
    return {n: load_rank_file(torch, os.path.join(release, n, "model_optim_rng.pt"), True, True)
            for n in sorted(os.listdir(release))}


def language_model_files(files, prefix="language_model."):
    """A VLM's rank files ({rank dir: file}) with each chunk cut to its language model, under
    the GPT model's names (embedding., decoder., output_layer.) that megatron_forward and
    moe_reference read."""
    return {name: {ck: {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
                   for ck, sd in f.items() if ck.startswith("model")}
            for name, f in files.items()}


def f32(t):
    """A rank file's tensor (torch bf16 or uint16 bits) as float32 numpy."""
    return t.float().numpy() if hasattr(t, "float") else bf16_to_f32(t)


def megatron_attention(m, sds, pre, x, te):
    """x plus the attention block of layer prefix pre, from the TP ranks' state dicts sds."""
    g = lambda sd, s: f32(sd[pre + s])  # noqa: E731
    T, tp, hpg = x.shape[0], len(sds), m.nh // m.ng
    norm1 = g(sds[0], "self_attention.linear_qkv.layer_norm_weight" if te else "input_layernorm.weight")
    h = rms(x, norm1, m.eps)
    # Column-parallel QKV: each rank's rows; gathered when a rank holds part of a group.
    parts = [h @ g(sd, "self_attention.linear_qkv.weight").T +
             (g(sd, "self_attention.linear_qkv.bias") if m.bias else 0) for sd in sds]
    qkv = np.concatenate(parts, 1).reshape(T, m.ng, hpg + 2, m.d)
    q = qkv[:, :, :hpg].reshape(T, m.nh, m.d).transpose(1, 0, 2)
    k = qkv[:, :, hpg].transpose(1, 0, 2)
    vv = qkv[:, :, hpg + 1].transpose(1, 0, 2)
    if m.qk:
        q = rms(q, g(sds[0], "self_attention.q_layernorm.weight"), m.eps)
        k = rms(k, g(sds[0], "self_attention.k_layernorm.weight"), m.eps)
    rotate = getattr(m, "rotate", None)  # a multimodal rope (a VLM's language model), else 1-D
    if rotate is None:
        rd = getattr(m, "rotary_dim", None)  # partial rotary (GLM-4.5)
        rotate = lambda t: rope(t, m.theta, rd)  # noqa: E731
    a = attention(rotate(q), rotate(k), vv, m.nh, m.ng).transpose(1, 0, 2).reshape(T, -1)
    # Row-parallel linear_proj: each rank multiplies its column slice; partials summed.
    cols = a.shape[1] // tp
    return x + sum(a[:, r * cols:(r + 1) * cols] @ g(sd, "self_attention.linear_proj.weight").T
                   for r, sd in enumerate(sds))


def megatron_swiglu(shards, h):
    """A SwiGLU MLP split over ranks: shards = [(fc1 [gate_r; up_r], fc2 columns r)], each rank
    computing its partial output; partials summed (row-parallel fc2)."""
    out = 0
    for fc1, fc2 in shards:
        a = h @ f32(fc1).T
        half = a.shape[1] // 2
        out = out + (silu(a[:, :half]) * a[:, half:]) @ f32(fc2).T
    return out


def megatron_dense_mlp(m, sds, pre, x, te):
    """The pre-MLP norm and dense MLP of layer prefix pre from the TP ranks' state dicts."""
    norm2 = f32(sds[0][pre + ("mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight")])
    return megatron_swiglu([(sd[pre + "mlp.linear_fc1.weight"], sd[pre + "mlp.linear_fc2.weight"])
                            for sd in sds], rms(x, norm2, m.eps))


def megatron_forward(m, stages, vpp, spec, tokens, mlp=None, embed=None, after_layer=None):
    """Uses only the rank state dicts; every TP rank computes its own slice. stages[p] = the
    files of stage p's TP ranks in rank order. mlp(m, p, v, sds, pre, x, te), when given,
    returns the MLP output (pre-MLP norm included) of layer prefix pre in chunk v of stage p,
    sds being the TP ranks' state dicts of that chunk; by default the dense MLP. A VLM's
    language model: embed(x) returns the word embeddings x with the image's rows put in;
    after_layer(n, x) returns the hidden states after the n-th layer of the model (deepstack)."""
    te = spec == "te"
    ck = lambda v: chunk_key(v, vpp)  # noqa: E731
    emb = [f32(rk[ck(0)]["embedding.word_embeddings.weight"]) for rk in stages[0]]
    rows = emb[0].shape[0]
    x = np.stack([emb[t // rows][t % rows] for t in tokens])
    if embed:
        x = embed(x)
    n = 0
    for v in range(vpp):
        for p, files in enumerate(stages):
            sds = [rk[ck(v)] for rk in files]
            n_layers = len({k.split(".")[2] for k in sds[0] if k.startswith("decoder.layers.")})
            for li in range(n_layers):
                pre = f"decoder.layers.{li}."
                x = megatron_attention(m, sds, pre, x, te)
                x = x + (mlp(m, p, v, sds, pre, x, te) if mlp else megatron_dense_mlp(m, sds, pre, x, te))
                x = after_layer(n, x) if after_layer else x
                n += 1
    last = [rk[ck(vpp - 1)] for rk in stages[-1]]
    x = rms(x, f32(last[0]["decoder.final_layernorm.weight"]), m.eps)
    if "output_layer.weight" in last[0]:
        logits = np.concatenate([x @ f32(sd["output_layer.weight"]).T for sd in last], 1)
    else:
        logits = np.concatenate([x @ e.T for e in emb], 1)
    return logits[:, :m.vocab]


def check_flags(ap):
    """The flags of `check` (moe_reference.py check takes the same ones and more)."""
    ap.add_argument("src")
    ap.add_argument("view")
    ap.add_argument("layout")
    ap.add_argument("--spec", default="te")
    ap.add_argument("--pp-first", type=int, default=0)
    ap.add_argument("--pp-last", type=int, default=0)
    ap.add_argument("--vocab-pad", default="zero")
    ap.add_argument("--no-args", action="store_true")
    ap.add_argument("--torch2", action="store_true")


def load_rank_file(torch, path, torch2, with_args):
    if torch2:
        # Megatron allowlists argparse.Namespace; files without args need no allowlist.
        if with_args:
            torch.serialization.add_safe_globals([argparse.Namespace])
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return torch.load(path, map_location="cpu")


def dense_args(m, tp, pp, vpp, padded, torch, first=0, last=0):
    """The args fields every view's files must carry (name -> value). The pipeline fields as
    Megatron's validate_args needs them: virtual chunks as layers per chunk for an even split,
    as chunks per stage (--num-virtual-stages-per-pipeline-rank) for an uneven one."""
    uneven = pp > 1 and bool(first or last)
    want = dict(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
                num_layers_per_virtual_pipeline_stage=m.L // (pp * vpp) if vpp > 1 and not uneven else None,
                num_virtual_stages_per_pipeline_rank=vpp if vpp > 1 and uneven else None,
                decoder_first_pipeline_num_layers=first if pp > 1 and first else None,
                decoder_last_pipeline_num_layers=last if pp > 1 and last else None,
                num_layers=m.L, hidden_size=m.H, ffn_hidden_size=m.F,
                num_attention_heads=m.nh, num_query_groups=m.ng, kv_channels=m.d,
                padded_vocab_size=padded, untie_embeddings_and_output_weights=not m.tied,
                add_qkv_bias=m.bias, qk_layernorm=m.qk, swiglu=True,
                normalization="RMSNorm", params_dtype=torch.bfloat16,
                vocab_size=m.vocab, layernorm_epsilon=m.eps,
                rotary_base=int(m.theta),
                max_position_embeddings=m.cfg.get("max_position_embeddings", 4096))
    if "architectures" in m.cfg:
        # What a Megatron source made of these files names in hf/config.json.
        want["hf_architecture"] = m.cfg["architectures"][0]
    return want


def compare_model(name, got, exp, errors, torch):
    """One chunk's state dict against the expectation: keys in order, None, bf16 bits."""
    if list(got) != list(exp):
        errors.append(f"{name}: keys differ; first: " +
                      str(next(((x, y) for x, y in zip(got, exp) if x != y), (len(got), len(exp)))))
        return
    for k, v in exp.items():
        t = got[k]
        if v is None:
            if t is not None:
                errors.append(f"{name}/{k}: expected None")
            continue
        if t is None or t.dtype != torch.bfloat16 or tuple(t.shape) != v.shape:
            errors.append(f"{name}/{k}: {None if t is None else (t.dtype, tuple(t.shape))} != bf16 {v.shape}")
        elif not np.array_equal(t.contiguous().view(torch.int16).numpy().view(np.uint16), v):
            errors.append(f"{name}/{k}: values differ")


def plain_args_errors(name, args, expect_args):
    """args fields that differ from expect_args (exact values)."""
    out = []
    for k, val in expect_args.items():
        got = getattr(args, k, "<missing>")
        if got != val:
            out.append(f"{name}: args.{k} = {got!r}, want {val!r}")
    return out


def compare_view(a, want, expect_args, torch, args_errors=plain_args_errors, compare=None):
    """Loads the rank files of view a.view and compares them with want ({rank dir: chunks});
    returns (errors, {rank dir: loaded file}). ARGS_ERRORS(name, args, expect_args) lists what
    differs in args; COMPARE(name, got, exp, errors, torch) compares a chunk (compare_model)."""
    compare = compare or compare_model
    errors = []
    tracker = open(os.path.join(a.view, "latest_checkpointed_iteration.txt")).read()
    if tracker != "release":
        errors.append(f"tracker says {tracker!r}")
    present = sorted(os.listdir(os.path.join(a.view, "release")))
    if present != sorted(want):
        errors.append(f"rank dirs {present} != {sorted(want)}")
    loaded = {}
    for name, chunks in want.items():
        path = os.path.join(a.view, "release", name, "model_optim_rng.pt")
        if not os.path.exists(path):
            continue
        sd = loaded[name] = load_rank_file(torch, path, a.torch2, not a.no_args)
        top = (["args"] if not a.no_args else []) + ["checkpoint_version", "iteration"] + list(chunks)
        if list(sd) != top:
            errors.append(f"{name}: top-level keys {list(sd)} != {top}")
            continue
        if sd["checkpoint_version"] != 3.0 or sd["iteration"] != 0:
            errors.append(f"{name}: checkpoint_version {sd['checkpoint_version']}, iteration {sd['iteration']}")
        if not a.no_args:
            errors += args_errors(name, sd["args"], expect_args)
        for ck, exp in chunks.items():
            compare(f"{name}/{ck}", sd[ck], exp, errors, torch)
    return errors, loaded


TOKENS = np.array([1, 17, 42, 99, 5, 200, 7, 249, 3, 64])


def check(argv):
    ap = argparse.ArgumentParser()
    check_flags(ap)
    a = ap.parse_args(argv)
    import torch
    tp, pp, vpp = parse_layout(a.layout)
    m = Model(a.src)
    want, padded = expected_files(m, tp, pp, vpp, a.spec, a.pp_first, a.pp_last, a.vocab_pad)
    errors, loaded = compare_view(a, want, dense_args(m, tp, pp, vpp, padded, torch, a.pp_first, a.pp_last),
                                  torch)
    if errors:
        print("\n".join(errors[:20]), file=sys.stderr)
        sys.exit(1)
    ref = hf_forward(m, TOKENS)
    stages = [[loaded[f"mp_rank_{r:02d}" if pp == 1 else f"mp_rank_{r:02d}_{p:03d}"] for r in range(tp)]
              for p in range(pp)]
    got = megatron_forward(m, stages, vpp, a.spec, TOKENS)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    if not err < 1e-4:
        print(f"logits differ: max relative error {err:.3g}", file=sys.stderr)
        sys.exit(1)
    print(f"{a.layout} {a.spec}: {len(want)} files, every tensor equal; logits max rel err {err:.2g}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["check"]:
        check(sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
