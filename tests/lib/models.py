#!/usr/bin/python3
"""Tiny Hugging Face checkpoints for the tests (numpy only, fixed seeds), and an independent
reference: safetensors reading, the Megatron split of DESIGN section 4, and forward passes.

  models.py write ARCH DIR [--shards N] [--tokenizer] [--layers L] [--set KEY=N ...]
      (--set: an integer config field over ARCH's, e.g. hidden_size=512)
    ARCH: llama (GQA, untied), qwen2 (qkv bias, tied), qwen3 (q/k norm, head_dim 16 != 64/8),
          mistral (GQA, untied), phi3 (GQA, untied, fused self_attn.qkv_proj = [q; k; v] and
          mlp.gate_up_proj = [gate; up] as Phi-3's checkpoints hold them),
          mixed (dtypes F32/F16/BF16/I64, scalar and 3-D tensors)
  models.py write-huge-vocab DIR
    a one-layer Llama whose embedding and lm_head are 4.5 GB each (vocab 1,100,000 x 2048 bf16):
    a sparse file of 9 GB with data only in the first and last embedding rows (1.0 and 3.0)
"""
import json
import os
import struct
import sys

import numpy as np

import st_write  # noqa: E402  (the safetensors writer, beside this file)

ST_DTYPES = {"BF16": (np.uint16, 2), "F16": (np.float16, 2), "F32": (np.float32, 4),
             "I64": (np.int64, 8), "I32": (np.int32, 4), "U8": (np.uint8, 1)}

ARCHS = {
    "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama", num_key_value_heads=2,
                  tie_word_embeddings=False),
    "mistral": dict(architectures=["MistralForCausalLM"], model_type="mistral",
                    num_key_value_heads=2, tie_word_embeddings=False),
    "qwen2": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", num_key_value_heads=2,
                  tie_word_embeddings=True),
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_key_value_heads=2,
                  tie_word_embeddings=False, head_dim=16),
    # The fields of Phi-3-mini-4k-instruct's config.json (Phi-3-medium has GQA: 40 heads, 10 KV
    # heads); sliding_window null (Megatron has no such argument), rope_scaling null. The ffn
    # size (112) differs from the qkv rows ((8 + 2 * 2) * 8 = 96), so no size mix-up fits.
    "phi3": dict(architectures=["Phi3ForCausalLM"], model_type="phi3", num_key_value_heads=2,
                 intermediate_size=112,
                 tie_word_embeddings=False, rms_norm_eps=1e-5, attention_bias=False,
                 attention_dropout=0.0, embd_pdrop=0.0, resid_pdrop=0.0, initializer_range=0.02,
                 original_max_position_embeddings=512, rope_scaling=None, sliding_window=None,
                 bos_token_id=1, eos_token_id=32, pad_token_id=32, use_cache=True,
                 transformers_version="4.40.2"),
    # Mixture of experts. Mixtral: intermediate_size is the expert ffn; every layer is MoE.
    "mixtral": dict(architectures=["MixtralForCausalLM"], model_type="mixtral",
                    num_key_value_heads=2, tie_word_embeddings=False, intermediate_size=32,
                    num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
                    output_router_logits=False, sliding_window=None, attention_dropout=0.0),
    # Qwen2-MoE: q/k/v biases always; intermediate_size is the dense layers' ffn,
    # moe_intermediate_size the experts', plus one shared expert with a sigmoid gate.
    "qwen2_moe": dict(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe",
                      num_key_value_heads=2, tie_word_embeddings=False, intermediate_size=96,
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, decoder_sparse_step=1,
                      mlp_only_layers=[1], norm_topk_prob=False, router_aux_loss_coef=0.001,
                      output_router_logits=False, use_sliding_window=False),
    "qwen3_moe": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                      num_key_value_heads=2, tie_word_embeddings=False, head_dim=8,
                      attention_bias=False, intermediate_size=96, num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1,
                      mlp_only_layers=[0], norm_topk_prob=True, router_aux_loss_coef=0.001,
                      output_router_logits=False, use_sliding_window=False),
}

# Families whose Hugging Face checkpoints hold fused projections (rows stacked: [q; k; v] and
# [gate; up]).
FUSED = {"phi3"}
MOE = {"mixtral", "qwen2_moe", "qwen3_moe"}


def is_moe_layer(cfg, i):
    """Whether layer i of a Hugging Face config is a mixture-of-experts layer: every Mixtral
    layer; a Qwen2/Qwen3-MoE layer unless listed in mlp_only_layers or off the
    decoder_sparse_step grid (Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer)."""
    t = cfg.get("model_type")
    if t == "mixtral":
        return True
    if t in ("qwen2_moe", "qwen3_moe"):
        return (i not in cfg.get("mlp_only_layers", []) and cfg.get("num_experts", 0) > 0
                and (i + 1) % cfg.get("decoder_sparse_step", 1) == 0)
    return False


def moe_mlp_shapes(cfg, i, p, h):
    """The MLP tensors of layer i (prefix p) of an MoE family, in transformers' module order:
    MixtralSparseMoeBlock = gate, experts.{e}.{w1 (gate), w2 (down), w3 (up)};
    Qwen2MoeSparseMoeBlock = gate, experts.{e}.{gate,up,down}_proj, shared_expert.*,
    shared_expert_gate; a dense Qwen layer = mlp.{gate,up,down}_proj."""
    if cfg["model_type"] == "mixtral":
        n, f = cfg["num_local_experts"], cfg["intermediate_size"]
        out = [(p + "block_sparse_moe.gate.weight", (n, h))]
        for e in range(n):
            q = p + f"block_sparse_moe.experts.{e}."
            out += [(q + "w1.weight", (f, h)), (q + "w2.weight", (h, f)), (q + "w3.weight", (f, h))]
        return out

    def mlp(q, f):
        return [(q + "gate_proj.weight", (f, h)), (q + "up_proj.weight", (f, h)),
                (q + "down_proj.weight", (h, f))]

    if not is_moe_layer(cfg, i):
        return mlp(p + "mlp.", cfg["intermediate_size"])
    n, f = cfg["num_experts"], cfg["moe_intermediate_size"]
    out = [(p + "mlp.gate.weight", (n, h))]
    for e in range(n):
        out += mlp(p + f"mlp.experts.{e}.", f)
    if cfg.get("shared_expert_intermediate_size"):
        out += mlp(p + "mlp.shared_expert.", cfg["shared_expert_intermediate_size"])
        out.append((p + "mlp.shared_expert_gate.weight", (1, h)))
    return out


def bf16_bits(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def config_for(arch, layers=8):
    cfg = dict(hidden_size=64, num_attention_heads=8, num_hidden_layers=layers,
               intermediate_size=96, vocab_size=250, rms_norm_eps=1e-6, rope_theta=10000.0,
               max_position_embeddings=512, hidden_act="silu", torch_dtype="bfloat16")
    cfg.update(ARCHS[arch])
    return cfg


def model_tensors(cfg, seed=0):
    """name -> (dtype, array) in Hugging Face state-dict order."""
    rng = np.random.default_rng(seed)
    h, f, v, nh = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_attention_heads"]
    d = cfg.get("head_dim", h // nh)
    kv = cfg["num_key_value_heads"] * d
    bias = cfg["model_type"] in ("qwen2", "qwen2_moe")
    qk = cfg["model_type"] in ("qwen3", "qwen3_moe")
    moe = cfg["model_type"] in MOE
    fused = cfg["model_type"] in FUSED
    shapes = [("model.embed_tokens.weight", (v, h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.append((p + "input_layernorm.weight", (h,)))
        if fused:  # Phi-3 (modeling_phi3.py): qkv_proj = [q; k; v], gate_up_proj = [gate; up]
            shapes += [(p + "self_attn.qkv_proj.weight", (nh * d + 2 * kv, h)),
                       (p + "self_attn.o_proj.weight", (h, nh * d)),
                       (p + "post_attention_layernorm.weight", (h,)),
                       (p + "mlp.gate_up_proj.weight", (2 * f, h)), (p + "mlp.down_proj.weight", (h, f))]
            continue
        shapes += [(p + "self_attn.q_proj.weight", (nh * d, h)),
                   (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.v_proj.weight", (kv, h))]
        if bias:
            shapes += [(p + "self_attn.q_proj.bias", (nh * d,)), (p + "self_attn.k_proj.bias", (kv,)),
                       (p + "self_attn.v_proj.bias", (kv,))]
        if qk:
            shapes += [(p + "self_attn.q_norm.weight", (d,)), (p + "self_attn.k_norm.weight", (d,))]
        shapes += [(p + "self_attn.o_proj.weight", (h, nh * d)),
                   (p + "post_attention_layernorm.weight", (h,))]
        if moe:
            shapes += moe_mlp_shapes(cfg, i, p, h)
            continue
        shapes += [(p + "mlp.gate_proj.weight", (f, h)), (p + "mlp.up_proj.weight", (f, h)),
                   (p + "mlp.down_proj.weight", (h, f))]
    shapes.append(("model.norm.weight", (h,)))
    if not cfg["tie_word_embeddings"]:
        shapes.append(("lm_head.weight", (v, h)))
    out = {}
    for name, shape in shapes:
        base = 1.0 if name.endswith("norm.weight") else 0.0
        # MoE models: embedding and routers (mlp.gate / block_sparse_moe.gate) 5x wider, as in
        # the checkpoints Megatron's MoE test files were made from, so that a few dozen tokens
        # reach every expert of every layer (with 0.1 deeper layers route nearly all tokens alike).
        wide = moe and (name == "model.embed_tokens.weight" or name.endswith(".gate.weight"))
        scale = 0.5 if wide else 0.1
        out[name] = ("BF16", bf16_bits(rng.standard_normal(shape) * scale + base))
    return out


def mixed_tensors(seed=0):
    rng = np.random.default_rng(seed)
    return {"a.f32": ("F32", rng.standard_normal((7, 5)).astype(np.float32)),
            "b.scalar": ("F32", np.array(3.5, dtype=np.float32)),
            "c.i64": ("I64", rng.integers(-2**40, 2**40, size=(9,), dtype=np.int64)),
            "d.f16.3d": ("F16", rng.standard_normal((2, 3, 4)).astype(np.float16)),
            "e.empty": ("BF16", np.zeros((0, 4), dtype=np.uint16)),
            "f.bf16": ("BF16", bf16_bits(rng.standard_normal((33, 17))))}


def write_safetensors(path, named, metadata=None):
    st_write.write(path, named, metadata or st_write.PT_METADATA)


def write_checkpoint(out, named, cfg, shards=1, tokenizer=False):
    os.makedirs(out, exist_ok=True)
    names = list(named)
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), named)
    else:
        per = -(-len(names) // shards)
        weight_map = {}
        for k in range(shards):
            fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            group = names[k * per:(k + 1) * per]
            write_safetensors(os.path.join(out, fname), {n: named[n] for n in group})
            weight_map.update({n: fname for n in group})
        total = sum(a.nbytes for _, a in named.values())
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            f.write(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                               indent=2, sort_keys=True) + "\n")
    if cfg is not None:
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
    if tokenizer:
        with open(os.path.join(out, "tokenizer.json"), "w") as f:
            json.dump({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}}, f)
        with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
            json.dump({"model_max_length": 512}, f)
        with open(os.path.join(out, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": 1, "eos_token_id": 2}, f)


# --- independent readers ---

def read_safetensors(path):
    """name -> (dtype, shape, raw bytes), plus the parsed header; checks the layout rules."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    assert (8 + n) % 8 == 0, f"{path}: data area not 8-byte aligned"
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, m in header.items():
        if name == "__metadata__":
            continue
        b, e = m["data_offsets"]
        out[name] = (m["dtype"], tuple(m["shape"]), body[b:e])
    return out, header


def read_checkpoint(d):
    """All tensors of an HF checkpoint dir (via its index or model.safetensors)."""
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        wm = json.load(open(index))["weight_map"]
        files = sorted(set(wm.values()))
    else:
        wm, files = None, ["model.safetensors"]
    out = {}
    for fname in files:
        tensors, _ = read_safetensors(os.path.join(d, fname))
        for name, t in tensors.items():
            assert name not in out, f"{name} twice"
            assert wm is None or wm[name] == fname, f"{name}: index says {wm.get(name)}, found in {fname}"
            out[name] = t
    if wm is not None:
        assert set(wm) == set(out), "index and shards disagree"
    return out


def as_array(t):
    dt, shape, raw = t
    np_dt = ST_DTYPES[dt][0]
    return np.frombuffer(raw, dtype=np_dt).reshape(shape)


def unfuse(cfg, raw):
    """Phi-3's fused projections cut into the separate tensors of a Llama checkpoint, from the
    definition of the fused layout (modeling_phi3.py slices the projection's output so):
    self_attn.qkv_proj rows [0, nh*d) are q_proj, the next ng*d rows k_proj, the last ng*d rows
    v_proj; mlp.gate_up_proj rows [0, F) are gate_proj, [F, 2F) up_proj. raw: name -> (dtype,
    shape, bytes) as read_checkpoint gives. Returns (the tensors with every fused one replaced by
    its parts, the fused ones as they were); other families come back unchanged."""
    if cfg.get("model_type") not in FUSED:
        return raw, {}
    nh, h = cfg["num_attention_heads"], cfg["hidden_size"]
    ng = cfg.get("num_key_value_heads", nh)
    d = cfg.get("head_dim", h // nh)
    f = cfg["intermediate_size"]
    out, fused = dict(raw), {}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for sep in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
                    "mlp.up_proj"):
            assert p + sep + ".weight" not in raw, f"{cfg['model_type']} with a separate {p}{sep}"
        cuts = {"self_attn.qkv_proj.weight": [("self_attn.q_proj.weight", 0, nh * d),
                                              ("self_attn.k_proj.weight", nh * d, (nh + ng) * d),
                                              ("self_attn.v_proj.weight", (nh + ng) * d, (nh + 2 * ng) * d)],
                "mlp.gate_up_proj.weight": [("mlp.gate_proj.weight", 0, f),
                                            ("mlp.up_proj.weight", f, 2 * f)]}
        for name, parts in cuts.items():
            dt, shape, data = fused[p + name] = out.pop(p + name)
            assert shape == (parts[-1][2], h), f"{p}{name}: shape {shape}, expected {(parts[-1][2], h)}"
            row = h * ST_DTYPES[dt][1]
            for part, lo, hi in parts:
                out[p + part] = (dt, (hi - lo, h), data[lo * row:hi * row])
    return out, fused


def write_huge_vocab(out, vocab=1100000, hidden=2048):
    """Records of 4 GiB and more without using the disk: the data area is a hole."""
    cfg = dict(config_for("llama", 1), vocab_size=vocab, hidden_size=hidden, intermediate_size=512,
               num_attention_heads=16, num_key_value_heads=4)
    cfg.pop("head_dim", None)
    d = hidden // 16
    shapes = [("model.embed_tokens.weight", [vocab, hidden])]
    p = "model.layers.0."
    shapes += [(p + "input_layernorm.weight", [hidden]), (p + "self_attn.q_proj.weight", [hidden, hidden]),
               (p + "self_attn.k_proj.weight", [4 * d, hidden]), (p + "self_attn.v_proj.weight", [4 * d, hidden]),
               (p + "self_attn.o_proj.weight", [hidden, hidden]), (p + "post_attention_layernorm.weight", [hidden]),
               (p + "mlp.gate_proj.weight", [512, hidden]), (p + "mlp.up_proj.weight", [512, hidden]),
               (p + "mlp.down_proj.weight", [hidden, 512]), ("model.norm.weight", [hidden]),
               ("lm_head.weight", [vocab, hidden])]
    blob, offset = st_write.header_bytes([(name, "BF16", shape, 2 * int(np.prod(shape))) for name, shape in shapes],
                                         metadata=None, compact=False)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(blob)
        base = f.tell()
        f.write(b"\x80\x3f" * hidden)                      # row 0: 1.0
        f.seek(base + (vocab - 1) * hidden * 2)
        f.write(b"\x40\x40" * hidden)                      # last row: 3.0
        f.truncate(base + offset)


def main():
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "write-huge-vocab":
        write_huge_vocab(args[1])
        return
    if len(args) >= 3 and args[0] == "write":
        arch, out = args[1], args[2]
        shards = int(args[args.index("--shards") + 1]) if "--shards" in args else 1
        layers = int(args[args.index("--layers") + 1]) if "--layers" in args else \
            4 if arch in MOE else 8
        if arch == "mixed":
            write_checkpoint(out, mixed_tensors(), None, shards, "--tokenizer" in args)
        else:
            cfg = config_for(arch, layers)
            for i, a in enumerate(args):
                if a == "--set":
                    key, value = args[i + 1].split("=", 1)
                    cfg[key] = int(value)
            if "--all-moe" in args:
                assert "mlp_only_layers" in cfg, f"--all-moe: {arch} has no dense layers"
                cfg["mlp_only_layers"] = []
            write_checkpoint(out, model_tensors(cfg), cfg, shards, "--tokenizer" in args)
        return
    print(__doc__, file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
