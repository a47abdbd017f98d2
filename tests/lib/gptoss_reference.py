#!/usr/bin/python3
"""GPT-OSS (GptOssForCausalLM) Megatron checks, written from Megatron-Bridge's gpt_oss bridge
(models/gpt_oss/gpt_oss_bridge.py: names, q/k/v grouping, gate/up de-interleaved per expert,
down_proj transposed) and Megatron-core 0.17.1 (DotProductAttention's learnable softmax_offset,
window_size with window_attn_skip_freq, YarnRotaryEmbedding and its concentration factor,
TEGroupedMLP/SequentialMLP's clamped quick-GELU GLU with glu_linear_offset and the fc2 bias
weighted by the routing probabilities, TopKRouter with a bias and softmax after top-k), not from
ckptfs's code.

  gptoss_reference.py build OUT       (in the sid root: transformers 5.12.1)
      OUT/bf16: a tiny GPT-OSS (4 layers, window 8 on layers 0 and 2) saved bf16 by
      save_pretrained; OUT/mxfp4: the same with random MXFP4 experts written as the release
      holds them (gpt_oss.py's form); OUT/mxfp4-ref: that model with the experts dequantised by
      transformers (convert_moe_packed_tensors), in the bf16 form; OUT/NAME.logits.json:
      transformers' float32 logits on TOKENS of bf16 and mxfp4-ref.
  gptoss_reference.py check SRC VIEW LAYOUT [--torch2]
      every rank file of VIEW (a Megatron view of SRC) loads (torch 1.13; torch 2.6 with
      weights_only and mmap with --torch2); the file set is Megatron's for LAYOUT; the args are
      what the bridge's provider sets from SRC's config.json; each chunk holds exactly the
      bridge's names for its layers; the tensors gathered over the ranks as Megatron splits them
      equal the bridge's conversion of SRC's tensors bit for bit (replicated ones equal in every
      file); a Megatron-semantics forward over them equals transformers' logits.
  gptoss_reference.py same ORIG HF_DIR
      HF_DIR's tensors are ORIG's, bit for bit.
  gptoss_reference.py logits ORIG HF_DIR   (in the sid root)
      transformers 5 loads HF_DIR (config.json as written there) and gives ORIG's logits.
  gptoss_reference.py bad-megatron VIEW OUT KIND    (torch 1.13)
      a copy of a tp1pp1 view whose args disagree with GPT-OSS (KIND: as-mixtral, vanilla-softmax).
  gptoss_reference.py wide SRC OUT
      OUT: SRC's GPT-OSS made wide (hidden 16448, 1 layer of 32 experts of FFN 8, random bf16),
      so that its Megatron copy in tp2 joined back takes 2 x 16448 x 32 x 2 (2.1 M) per-column
      pieces: over the 2 M that once made hf/ serve the experts one by one.
  gptoss_reference.py interleave SRC VIEW LAYOUT HF_DIR
      HF_DIR's gate_up_proj and its bias (hf/ of Megatron view VIEW of SRC mounted as a source)
      equal torch's own interleave (stack on a new last dim) of the rank files' fc1 gate and up.
  gptoss_reference.py bad SRC OUT KIND
      a copy of SRC that ckptfs must refuse by name (KIND: layer-types, experts-dim, no-bias,
      mxfp4-scales).
"""
import argparse
import json
import math
import os
import re
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
from reference import chunk_layers, load_rank_file  # noqa: E402

TOKENS = np.arange(3, 3 + 7 * 20, 7) % 256  # 20 tokens: past the window of 8
TOLERANCE = 1e-4  # max logit error relative to the largest logit, as the other references
CONFIG = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, vocab_size=256, num_local_experts=4, num_experts_per_tok=2,
              sliding_window=8)


def build(out):
    import torch
    import transformers
    torch.manual_seed(0)
    cfg = transformers.GptOssConfig(**CONFIG)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3 if p.dim() == 1 else 0.05)
    model.to(torch.bfloat16).save_pretrained(f"{out}/bf16")
    # The MXFP4 copy as the release holds it (gpt_oss.py's form), and its reference: the same
    # model with transformers' own dequantisation of the experts, in the bf16 form.
    from safetensors.torch import load_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    import gpt_oss
    saved = load_file(f"{out}/bf16/model.safetensors")
    config = json.load(open(f"{out}/bf16/config.json"))
    gen = torch.Generator().manual_seed(1)
    mx, ref = {}, {}
    for k, v in saved.items():
        if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            e, rows_in, cols_out = v.shape
            mx[k + "_blocks"] = torch.randint(0, 256, (e, cols_out, rows_in // 32, 16), generator=gen,
                                              dtype=torch.uint8)
            mx[k + "_scales"] = torch.randint(118, 126, (e, cols_out, rows_in // 32), generator=gen,
                                              dtype=torch.uint8)
            ref[k] = convert_moe_packed_tensors(mx[k + "_blocks"], mx[k + "_scales"]).to(torch.bfloat16)
        else:
            mx[k] = ref[k] = v
    gpt_oss.write(f"{out}/mxfp4", mx, dict(config, quantization_config=gpt_oss.QUANT))
    gpt_oss.write(f"{out}/mxfp4-ref", ref, config)
    for name in ("bf16", "mxfp4-ref"):
        back = transformers.AutoModelForCausalLM.from_pretrained(f"{out}/{name}", dtype=torch.float32,
                                                                attn_implementation="eager")
        back.eval()
        with torch.no_grad():
            logits = back(torch.tensor(TOKENS)[None]).logits[0]
        with open(f"{out}/{name}.logits.json", "w") as f:
            json.dump({"tokens": TOKENS.tolist(), "logits": logits.tolist()}, f)
    print("built", out)


def hf_bits(src):
    """name -> uint16 array (bf16 bits) of SRC's tensors."""
    out = {}
    for name, (dtype, shape, raw) in models.read_checkpoint(src).items():
        assert dtype == "BF16", f"{name}: {dtype}"
        out[name] = np.frombuffer(raw, dtype=np.uint16).reshape(shape)
    return out


def bridge_tensors(cfg, hf, padded):
    """The full Megatron tensors (global layer numbers, local-expert names) the bridge makes."""
    nh, ng, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    hpg = nh // ng

    def pad(w):
        return np.concatenate([w, np.zeros((padded - w.shape[0],) + w.shape[1:], w.dtype)])

    def qkv(q, k, v):  # QKVMapping: per query group its q heads, then k, then v
        parts = []
        for g in range(ng):
            parts += [q[g * hpg * d:(g + 1) * hpg * d], k[g * d:(g + 1) * d], v[g * d:(g + 1) * d]]
        return np.concatenate(parts)

    out = {"embedding.word_embeddings.weight": pad(hf["model.embed_tokens.weight"]),
           "decoder.final_layernorm.weight": hf["model.norm.weight"],
           "output_layer.weight": pad(hf["lm_head.weight"])}
    for i in range(cfg["num_hidden_layers"]):
        h, o = f"model.layers.{i}.", f"decoder.layers.{i}."
        a = h + "self_attn."
        out[o + "self_attention.linear_qkv.layer_norm_weight"] = hf[h + "input_layernorm.weight"]
        out[o + "self_attention.linear_qkv.weight"] = qkv(*(hf[a + p + "_proj.weight"] for p in "qkv"))
        out[o + "self_attention.linear_qkv.bias"] = qkv(*(hf[a + p + "_proj.bias"] for p in "qkv"))
        out[o + "self_attention.core_attention.softmax_offset"] = hf[a + "sinks"]
        out[o + "self_attention.linear_proj.weight"] = hf[a + "o_proj.weight"]
        out[o + "self_attention.linear_proj.bias"] = hf[a + "o_proj.bias"]
        out[o + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        out[o + "mlp.router.weight"] = hf[h + "mlp.router.weight"]
        out[o + "mlp.router.bias"] = hf[h + "mlp.router.bias"]
        gate_up, gate_up_bias = hf[h + "mlp.experts.gate_up_proj"], hf[h + "mlp.experts.gate_up_proj_bias"]
        down, down_bias = hf[h + "mlp.experts.down_proj"], hf[h + "mlp.experts.down_proj_bias"]
        for e in range(cfg["num_local_experts"]):
            x = f"{o}mlp.experts.local_experts.{e}."
            w = gate_up[e].T  # [2F, H], gate and up alternating
            out[x + "linear_fc1.weight"] = np.concatenate([w[0::2], w[1::2]])
            out[x + "linear_fc1.bias"] = np.concatenate([gate_up_bias[e][0::2], gate_up_bias[e][1::2]])
            out[x + "linear_fc2.weight"] = np.ascontiguousarray(down[e].T)  # [H, F]
            out[x + "linear_fc2.bias"] = down_bias[e]
    return out


def parse(layout):
    m = re.fullmatch(r"tp(\d+)pp(\d+)(?:vpp(\d+))?(?:ep(\d+))?(?:etp(\d+))?", layout)
    return tuple(int(m.group(i) or 1) for i in range(1, 5)) + (int(m.group(5)) if m.group(5) else None,)


def bits(t, torch):
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def f32(b):
    return models.bf16_to_f32(b).reshape(b.shape)


# How Megatron splits each name over TP (or expert TP): None replicated, 0 rows, 1 columns,
# "halves" the rows of each half ([gate; up]).
def split_of(name):
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias", "softmax_offset", "word_embeddings.weight",
                      "output_layer.weight")):
        return 0
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1
    if name.endswith(("linear_fc1.weight", "linear_fc1.bias")):
        return "halves"
    return None


def join(parts, how):
    if how is None:
        for p in parts[1:]:
            assert np.array_equal(p, parts[0]), "a replicated tensor differs between ranks"
        return parts[0]
    if how == "halves":
        halves = [np.split(p, 2) for p in parts]
        return np.concatenate([h[0] for h in halves] + [h[1] for h in halves])
    return np.concatenate(parts, axis=how)


def check_args(args, cfg, layout):
    tp, pp, vpp, ep, etp = layout
    rope = cfg["rope_parameters"]
    want = dict(num_layers=cfg["num_hidden_layers"], hidden_size=cfg["hidden_size"],
                num_attention_heads=cfg["num_attention_heads"], num_query_groups=cfg["num_key_value_heads"],
                kv_channels=cfg["head_dim"], num_experts=cfg["num_local_experts"],
                moe_ffn_hidden_size=cfg["intermediate_size"], moe_router_topk=cfg["num_experts_per_tok"],
                moe_router_pre_softmax=False, add_bias_linear=True, add_qkv_bias=True, swiglu=False,
                quick_geglu=True, glu_linear_offset=1.0, activation_func_clamp_value=7.0,
                softmax_type="learnable", window_size=(cfg["sliding_window"] - 1, 0), window_attn_skip_freq=2,
                position_embedding_type="yarn", rotary_base=int(rope["rope_theta"]),
                yarn_rotary_scaling_factor=rope["factor"],
                yarn_original_max_position_embeddings=rope["original_max_position_embeddings"],
                yarn_beta_fast=rope["beta_fast"], yarn_beta_slow=rope["beta_slow"],
                yarn_correction_range_round_to_int=rope["truncate"], normalization="RMSNorm",
                untie_embeddings_and_output_weights=True, tensor_model_parallel_size=tp,
                pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
                layernorm_epsilon=cfg["rms_norm_eps"])
    got = vars(args)
    bad = [f"{k}={got.get(k, 'missing')!r} (want {v!r})" for k, v in want.items()
           if got.get(k, "missing") != v and not (isinstance(v, tuple) and tuple(got.get(k) or ()) == v)]
    return bad


def gather(view, layout, cfg, torch, torch2):
    """The rank files' tensors joined as Megatron splits them (global names), and the errors."""
    tp, pp, vpp, ep, etp = layout
    L, E = cfg["num_hidden_layers"], cfg["num_local_experts"]
    rel = os.path.join(view, "release")
    files = sorted(os.listdir(rel))
    want_files = sorted(f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "") + (f"_{e:03d}" if ep > 1 else "")
                        for t in range(tp) for p in range(pp) for e in range(ep))
    errors = [] if files == want_files else [f"files {files}, want {want_files}"]
    shards, args = {}, None
    for f in files:
        nums = [int(x) for x in f.split("_")[2:]]
        t, p, e = nums[0], nums[1] if pp > 1 else 0, nums[-1] if ep > 1 else 0
        sd = load_rank_file(torch, os.path.join(rel, f, "model_optim_rng.pt"), torch2, True)
        args = sd["args"]
        x = t % (args.expert_tensor_parallel_size or 1)
        for v in range(vpp):
            chunk = sd["model" if vpp == 1 else f"model{v}"]
            start, count = chunk_layers(L, pp, vpp, p, v)
            want = set()
            if p == 0 and v == 0:
                want.add("embedding.word_embeddings.weight")
            if p == pp - 1 and v == vpp - 1:
                want |= {"decoder.final_layernorm.weight", "output_layer.weight"}
            for i in range(count):
                o = f"decoder.layers.{i}."
                want |= {o + n for n in ("self_attention.linear_qkv.layer_norm_weight",
                                         "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
                                         "self_attention.core_attention.softmax_offset",
                                         "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
                                         "pre_mlp_layernorm.weight", "mlp.router.weight", "mlp.router.bias")}
                for j in range(E // ep):
                    want |= {f"{o}mlp.experts.local_experts.{j}.linear_fc{k}.{w}" for k in (1, 2)
                             for w in ("weight", "bias")}
            have = {k for k in chunk if not k.endswith("_extra_state")}
            if have != want:
                errors.append(f"{f} chunk {v}: extra {sorted(have - want)[:4]}, missing {sorted(want - have)[:4]}")
            for k in have & want:
                name = k
                m = re.match(r"decoder\.layers\.(\d+)\.(.*)", k)
                if m:
                    rest = m.group(2)
                    ex = re.match(r"mlp\.experts\.local_experts\.(\d+)\.(.*)", rest)
                    if ex:  # local expert j of EP rank e is global expert e * E / ep + j
                        rest = f"mlp.experts.local_experts.{e * (E // ep) + int(ex.group(1))}.{ex.group(2)}"
                    name = f"decoder.layers.{start + int(m.group(1))}.{rest}"
                rank = x if ".experts." in name else t
                shards.setdefault(name, {}).setdefault(rank, []).append(bits(chunk[k], torch))
    full = {}
    for name, by_rank in shards.items():
        for copies in by_rank.values():  # the same shard in other files (dense over EP, experts over DP)
            for c in copies[1:]:
                if not np.array_equal(c, copies[0]):
                    errors.append(f"{name}: copies of one shard differ")
        ranks = [by_rank[r][0] for r in sorted(by_rank)]
        full[name] = join(ranks, split_of(name))
    return full, args, errors


def yarn_inv_freq(d, rope):
    """YarnRotaryEmbedding's inv_freq (Megatron-core 0.17.1)."""
    base, factor = rope["rope_theta"], rope["factor"]
    extra = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    inter = extra / factor

    def dim_of(rot):
        return d * math.log(rope["original_max_position_embeddings"] / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = dim_of(rope["beta_fast"]), dim_of(rope["beta_slow"])
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
    mask = 1.0 - ramp
    return inter * (1 - mask) + extra * mask


def megatron_forward(cfg, w):
    """Megatron-core's GPT forward (local spec semantics) over the gathered tensors, float32."""
    nh, ng, d, H = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["hidden_size"]
    E, k, eps = cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["rms_norm_eps"]
    rope, W = cfg["rope_parameters"], cfg["sliding_window"]
    hpg, T = nh // ng, len(TOKENS)
    g = {n: f32(b).astype(np.float32) for n, b in w.items()}
    x = g["embedding.word_embeddings.weight"][TOKENS]
    inv = yarn_inv_freq(d, rope)
    ang = np.arange(T)[:, None] * inv[None, :]
    mscale = 0.1 * math.log(rope["factor"]) + 1.0  # _yarn_get_concentration_factor, mscale(_all_dim) unset
    cos = (np.concatenate([np.cos(ang)] * 2, -1) * mscale).astype(np.float32)
    sin = (np.concatenate([np.sin(ang)] * 2, -1) * mscale).astype(np.float32)

    def rot(t):
        return t * cos + np.concatenate([-t[..., d // 2:], t[..., :d // 2]], -1) * sin

    def rms(t, wt):
        return t / np.sqrt((t * t).mean(-1, keepdims=True) + eps) * wt

    for i in range(cfg["num_hidden_layers"]):
        o = f"decoder.layers.{i}."
        h = rms(x, g[o + "self_attention.linear_qkv.layer_norm_weight"])
        qkv = h @ g[o + "self_attention.linear_qkv.weight"].T + g[o + "self_attention.linear_qkv.bias"]
        qkv = qkv.reshape(T, ng, hpg + 2, d)
        q = rot(qkv[:, :, :hpg].reshape(T, nh, d).transpose(1, 0, 2))
        kk = rot(qkv[:, :, hpg].transpose(1, 0, 2))
        v = qkv[:, :, hpg + 1].transpose(1, 0, 2)
        kk, v = np.repeat(kk, hpg, 0), np.repeat(v, hpg, 0)
        s = q @ kk.transpose(0, 2, 1) / np.sqrt(d)
        qi, ki = np.arange(T)[:, None], np.arange(T)[None, :]
        banned = ki > qi
        if (i + 1) % 2 != 0:  # window_attn_skip_freq 2: layer numbers 1, 3, ... are windowed
            banned |= qi - ki > W - 1  # window_size (W - 1, 0)
        s = np.where(banned, -np.inf, s)
        sink = np.broadcast_to(g[o + "self_attention.core_attention.softmax_offset"][:, None, None], (nh, T, 1))
        full = np.concatenate([s, sink], -1)
        p = np.exp(full - full.max(-1, keepdims=True))
        p = (p / p.sum(-1, keepdims=True))[..., :-1]  # the offset's share is dropped
        a = (p @ v).transpose(1, 0, 2).reshape(T, nh * d)
        x = x + a @ g[o + "self_attention.linear_proj.weight"].T + g[o + "self_attention.linear_proj.bias"]
        h = rms(x, g[o + "pre_mlp_layernorm.weight"])
        logits = h @ g[o + "mlp.router.weight"].T + g[o + "mlp.router.bias"]
        top = np.argsort(-logits, -1, kind="stable")[:, :k]
        vals = np.take_along_axis(logits, top, -1)
        probs = np.exp(vals - vals.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)  # softmax after top-k (moe_router_pre_softmax False)
        out = np.zeros_like(x)
        for e in range(E):
            x_ = f"{o}mlp.experts.local_experts.{e}."
            fc1 = h @ g[x_ + "linear_fc1.weight"].T + g[x_ + "linear_fc1.bias"]
            glu, lin = np.split(fc1, 2, -1)
            glu, lin = np.minimum(glu, 7.0), np.clip(lin, -7.0, 7.0)
            act = glu / (1 + np.exp(-1.702 * glu)) * (lin + 1.0)
            y = act @ g[x_ + "linear_fc2.weight"].T + g[x_ + "linear_fc2.bias"]
            weight = (probs * (top == e)).sum(-1, keepdims=True)
            out += weight * y
        x = x + out
    x = rms(x, g["decoder.final_layernorm.weight"])
    return x @ g["output_layer.weight"][:cfg["vocab_size"]].T


def check(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("view")
    ap.add_argument("layout")
    ap.add_argument("--torch2", action="store_true")
    a = ap.parse_args(argv)
    import torch
    cfg = json.load(open(os.path.join(a.src, "config.json")))
    layout = parse(a.layout)
    full, args, errors = gather(a.view, layout, cfg, torch, a.torch2)
    errors += check_args(args, cfg, layout)
    want = bridge_tensors(cfg, hf_bits(a.src), args.padded_vocab_size)
    for name in sorted(set(want) | set(full)):
        if name not in full or name not in want:
            errors.append(f"{name}: {'not in the view' if name not in full else 'not the bridge s'}")
        elif full[name].shape != want[name].shape or not np.array_equal(full[name], want[name]):
            errors.append(f"{name}: {full[name].shape} differs from the bridge's {want[name].shape}")
    ref = json.load(open(a.src.rstrip("/") + ".logits.json"))
    err = float("nan")
    if not errors:
        got = megatron_forward(cfg, full)
        hf = np.array(ref["logits"], dtype=np.float32)
        err = float(np.abs(got - hf).max() / np.abs(hf).max())
        if not err < TOLERANCE:
            errors.append(f"Megatron forward differs from transformers' logits: {err:.3g} relative")
    if errors:
        print("\n".join(errors[:20]))
        sys.exit(1)
    print(f"PASS {a.view}: {len(full)} tensors = the bridge's, forward error {err:.2g}")


def same(orig, hf_dir):
    a, b = models.read_checkpoint(orig), models.read_checkpoint(hf_dir)
    bad = sorted(set(a) ^ set(b)) + [n for n in a if n in b and a[n] != b[n]]
    if bad:
        print("differ:", bad[:10])
        sys.exit(1)
    print(f"PASS {len(a)} tensors bit-identical")


def logits(orig, hf_dir):
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                             attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        got = model(torch.tensor(TOKENS)[None]).logits[0].numpy()
    want = np.array(json.load(open(orig.rstrip("/") + ".logits.json"))["logits"], dtype=np.float32)
    diff = float(np.abs(got - want).max())
    print(f"{'PASS' if diff == 0 else 'FAIL'} {hf_dir}: transformers 5 loads it, logits differ by {diff}")
    sys.exit(0 if diff == 0 else 1)


def bad_megatron(view, out, kind):
    """A copy of Megatron view VIEW (one rank file) whose args disagree with GPT-OSS (KIND:
    as-mixtral names Mixtral, vanilla-softmax drops the sinks from the args)."""
    import torch
    shutil.copytree(view, out)
    path = os.path.join(out, "release", "mp_rank_00", "model_optim_rng.pt")
    sd = torch.load(path, map_location="cpu")
    if kind == "as-mixtral":
        sd["args"].hf_architecture = "MixtralForCausalLM"
    elif kind == "vanilla-softmax":
        sd["args"].softmax_type = "vanilla"
    torch.save(sd, path)


WIDE = dict(hidden_size=16448, num_hidden_layers=1, num_local_experts=32, intermediate_size=8)


def wide(src, out):
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.update(WIDE, layer_types=cfg["layer_types"][:WIDE["num_hidden_layers"]])
    h, e, f, v = cfg["hidden_size"], cfg["num_local_experts"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    shapes = {"embed_tokens.weight": [v, h], "lm_head.weight": [v, h], "norm.weight": [h],
              "layernorm.weight": [h], "q_proj.weight": [q, h], "q_proj.bias": [q], "k_proj.weight": [kv, h],
              "k_proj.bias": [kv], "v_proj.weight": [kv, h], "v_proj.bias": [kv], "o_proj.weight": [h, q],
              "o_proj.bias": [h], "sinks": [cfg["num_attention_heads"]], "router.weight": [e, h],
              "router.bias": [e], "gate_up_proj": [e, h, 2 * f], "gate_up_proj_bias": [e, 2 * f],
              "down_proj": [e, f, h], "down_proj_bias": [e, h]}
    rng = np.random.default_rng(5)
    named = {}
    for name in hf_bits(src):
        m = re.match(r"model\.layers\.(\d+)\.", name)
        if m and int(m.group(1)) >= cfg["num_hidden_layers"]:
            continue
        shape = next(sh for suffix, sh in shapes.items() if name.endswith(suffix))
        x = (rng.standard_normal(int(np.prod(shape)), dtype=np.float32) * 0.05).view(np.uint32)
        named[name] = ("BF16", (x >> 16).astype(np.uint16).reshape(shape))
    os.makedirs(out)
    models.write_safetensors(os.path.join(out, "model.safetensors"), named)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)


def interleave(src, view, layout, hf_dir):
    import torch
    cfg = json.load(open(os.path.join(src, "config.json")))
    full, _, errors = gather(view, parse(layout), cfg, torch, False)
    hf = hf_bits(hf_dir)
    checked = 0  # experts
    for layer in range(cfg["num_hidden_layers"]):
        h = f"model.layers.{layer}.mlp.experts."
        for e in range(cfg["num_local_experts"]):
            x = f"decoder.layers.{layer}.mlp.experts.local_experts.{e}.linear_fc1."
            w, b = (torch.from_numpy(full[x + k].view(np.int16)) for k in ("weight", "bias"))
            gate, up = w.chunk(2)  # [F, H] each
            want = torch.stack([gate.t(), up.t()], dim=-1).flatten(1)  # [H, 2F], gate and up alternating
            want_bias = torch.stack(b.chunk(2), dim=-1).flatten()
            for name, got, expect in ((h + "gate_up_proj", hf[h + "gate_up_proj"][e], want),
                                      (h + "gate_up_proj_bias", hf[h + "gate_up_proj_bias"][e], want_bias)):
                if not np.array_equal(got.view(np.int16), expect.numpy()):
                    errors.append(f"{name} expert {e} differs from the rank files' gate and up interleaved")
            checked += 1
    if errors:
        print("\n".join(errors[:10]))
        sys.exit(1)
    print(f"PASS {checked} experts' gate_up_proj and gate_up_proj_bias = torch's interleave of the rank files' fc1")


def bad(src, out, kind):
    shutil.copytree(src, out)
    cfg = json.load(open(os.path.join(out, "config.json")))
    if kind == "layer-types":
        cfg["layer_types"] = ["full_attention", "sliding_attention"] + cfg["layer_types"][2:]
    elif kind == "no-bias":
        cfg["attention_bias"] = False
    elif kind == "experts-dim":
        cfg["num_local_experts"] = cfg["num_local_experts"] // 2
    elif kind == "mxfp4-scales":  # layer 1's down_proj scales a group short
        path = os.path.join(out, "model.safetensors")
        tensors, _ = models.read_safetensors(path)
        named = {}
        for name, (dtype, shape, raw) in tensors.items():
            a = np.frombuffer(raw, dtype=np.uint16 if dtype == "BF16" else np.uint8).reshape(shape)
            if name == "model.layers.1.mlp.experts.down_proj_scales":
                a = a[..., :-1]
            named[name] = (dtype, a)
        models.write_safetensors(path, named)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "build":
        build(sys.argv[2])
    elif cmd == "check":
        check(sys.argv[2:])
    elif cmd == "same":
        same(*sys.argv[2:4])
    elif cmd == "logits":
        logits(*sys.argv[2:4])
    elif cmd == "bad":
        bad(*sys.argv[2:5])
    elif cmd == "wide":
        wide(*sys.argv[2:4])
    elif cmd == "interleave":
        interleave(*sys.argv[2:6])
    elif cmd == "bad-megatron":
        bad_megatron(*sys.argv[2:5])
