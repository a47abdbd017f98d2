#!/usr/bin/python3
"""Generate tiny Hugging Face style checkpoints (and broken ones) for ckptfs tests.

Run with /usr/bin/python3 (needs numpy only). Everything is deterministic (fixed seeds).

  ckpt_gen.py llama-tiny DIR [--shards N] [--dtype bf16|f32|f16] [--tokenizer] [--layers L]
  ckpt_gen.py mixed DIR [--shards N] [--tokenizer] [--empty]
  ckpt_gen.py bad KIND DIR          (prints one JSON line: what an error message must name)
  ckpt_gen.py bad-kinds             (lists KINDs, one per line)

safetensors files are written the way the Rust `safetensors` library (used by
save_pretrained) writes them: u64 little-endian header length, compact JSON
header with "__metadata__" first, padded with spaces so that 8 + len is a
multiple of 8, then the tensor bytes back to back.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}


# ----------------------------------------------------------------------------
# safetensors writing
# ----------------------------------------------------------------------------

def to_bf16_bits(a):
    """float array -> uint16 bit patterns of bfloat16 (upper half of float32)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    return (a.view(np.uint32) >> 16).astype(np.uint16)


def encode(arr, dtype):
    """Return the raw little-endian bytes of `arr` stored as safetensors `dtype`."""
    if dtype == "BF16":
        return to_bf16_bits(arr).astype("<u2").tobytes()
    np_dtype = {
        "F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4",
        "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?",
    }[dtype]
    return np.ascontiguousarray(arr).astype(np_dtype).tobytes()


class T:
    """One tensor: name, safetensors dtype, shape, raw bytes."""

    def __init__(self, name, dtype, shape, data):
        self.name, self.dtype, self.shape, self.data = name, dtype, list(shape), data
        n = 1
        for d in self.shape:
            n *= d
        assert len(data) == n * ITEMSIZE[dtype], (name, len(data), shape, dtype)


def header_bytes(header_obj):
    """Compact JSON, padded with spaces so that 8 + len is a multiple of 8."""
    hb = json.dumps(header_obj, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    return hb


def build_header(tensors, metadata=None, key_order="name"):
    """Header dict with tensors laid out in list order (data order).

    key_order="name" puts the JSON keys in name order (so header key order,
    data order and name order generally differ, which is what tests want).
    """
    meta = {"format": "pt"} if metadata is None else metadata
    layout = []
    off = 0
    for t in tensors:
        layout.append((t.name, {"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + len(t.data)]}))
        off += len(t.data)
    if key_order == "name":
        layout.sort(key=lambda kv: kv[0])
    hdr = {}
    if meta is not False:
        hdr["__metadata__"] = meta
    for k, v in layout:
        hdr[k] = v
    return hdr


def write_safetensors(path, tensors, metadata=None):
    hb = header_bytes(build_header(tensors, metadata))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for t in tensors:
            f.write(t.data)


def write_raw(path, header_payload, data=b""):
    """Write a (possibly broken) file: given header bytes used verbatim."""
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_payload)))
        f.write(header_payload)
        f.write(data)


def split_contiguous(tensors, n):
    """Split the tensor list into n contiguous, non-empty groups of roughly equal bytes."""
    n = max(1, min(n, len(tensors)))
    total = sum(len(t.data) for t in tensors)
    groups = [[] for _ in range(n)]
    acc = 0
    g = 0
    for i, t in enumerate(tensors):
        remaining_tensors = len(tensors) - i
        remaining_groups = n - g
        # advance when this group has reached its share, or when the rest
        # of the tensors are needed to keep every later group non-empty
        if groups[g] and g < n - 1 and (acc >= total * (g + 1) / n or remaining_tensors < remaining_groups):
            g += 1
        groups[g].append(t)
        acc += len(t.data)
    return groups


def shard_name(k, n):
    return "model-%05d-of-%05d.safetensors" % (k, n)


def index_text(weight_map, total_size):
    return json.dumps({"metadata": {"total_size": total_size}, "weight_map": weight_map},
                      indent=2, sort_keys=True) + "\n"


def write_checkpoint(d, tensors, shards=1):
    """Write tensors (in data order) as HF's save_pretrained would."""
    os.makedirs(d, exist_ok=True)
    if shards <= 1:
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        return
    groups = split_contiguous(tensors, shards)
    n = len(groups)
    weight_map = {}
    for k, g in enumerate(groups, 1):
        name = shard_name(k, n)
        write_safetensors(os.path.join(d, name), g)
        for t in g:
            weight_map[t.name] = name
    total = sum(len(t.data) for t in tensors)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        f.write(index_text(weight_map, total))


def write_json(path, obj, indent=2):
    with open(path, "w") as f:
        f.write(json.dumps(obj, indent=indent, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------
# model definitions
# ----------------------------------------------------------------------------

LLAMA = dict(hidden=64, layers=4, heads=8, kv_heads=2, ffn=160, vocab=300)


def llama_tensors(dtype="bf16", layers=None, seed=1234):
    c = dict(LLAMA)
    if layers is not None:
        c["layers"] = layers
    st_dtype = {"bf16": "BF16", "f32": "F32", "f16": "F16"}[dtype]
    rng = np.random.default_rng(seed)
    h, f, v = c["hidden"], c["ffn"], c["vocab"]
    hd = h // c["heads"]
    kvd = hd * c["kv_heads"]

    def mk(name, shape, norm=False):
        if norm:
            a = 1.0 + 0.01 * rng.standard_normal(shape).astype(np.float32)
        else:
            a = (0.02 * rng.standard_normal(shape)).astype(np.float32)
        return T(name, st_dtype, shape, encode(a, st_dtype))

    out = [mk("model.embed_tokens.weight", (v, h))]
    for i in range(c["layers"]):
        p = "model.layers.%d." % i
        out.append(mk(p + "input_layernorm.weight", (h,), norm=True))
        out.append(mk(p + "self_attn.q_proj.weight", (h, h)))
        out.append(mk(p + "self_attn.k_proj.weight", (kvd, h)))
        out.append(mk(p + "self_attn.v_proj.weight", (kvd, h)))
        out.append(mk(p + "self_attn.o_proj.weight", (h, h)))
        out.append(mk(p + "post_attention_layernorm.weight", (h,), norm=True))
        out.append(mk(p + "mlp.gate_proj.weight", (f, h)))
        out.append(mk(p + "mlp.up_proj.weight", (f, h)))
        out.append(mk(p + "mlp.down_proj.weight", (h, f)))
    out.append(mk("model.norm.weight", (h,), norm=True))
    out.append(mk("lm_head.weight", (v, h)))
    return out, c


def llama_config(c, dtype):
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": c["hidden"] // c["heads"],
        "hidden_act": "silu",
        "hidden_size": c["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": c["ffn"],
        "max_position_embeddings": 256,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": c["heads"],
        "num_hidden_layers": c["layers"],
        "num_key_value_heads": c["kv_heads"],
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": {"bf16": "bfloat16", "f32": "float32", "f16": "float16"}[dtype],
        "transformers_version": "4.44.2",
        "use_cache": True,
        "vocab_size": c["vocab"],
    }


def write_tokenizer(d, vocab=300):
    specials = ["<unk>", "<s>", "</s>"]
    vocab_map = {tok: i for i, tok in enumerate(specials)}
    for i in range(len(specials), vocab):
        vocab_map["tok%03d" % i] = i
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for i, s in enumerate(specials)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab_map, "unk_token": "<unk>"},
    }
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f, indent=2, ensure_ascii=False)  # no trailing newline, like HF
    write_json(os.path.join(d, "tokenizer_config.json"), {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 256, "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
    })
    write_json(os.path.join(d, "generation_config.json"), {
        "_from_model_config": True, "bos_token_id": 1, "eos_token_id": 2,
        "transformers_version": "4.44.2",
    })


def mixed_tensors(empty=False, seed=99):
    """Mixed dtypes and ranks. Data order = itemsize descending, so that any
    contiguous concatenation in source order keeps every tensor aligned."""
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    out = [
        T("stats.step", "I64", [], encode(np.array(123456789012, dtype=np.int64), "I64")),
        T("stats.f64_vec", "F64", [5], encode(rng.standard_normal(5), "F64")),
        T("buffers.position_ids", "I64", [1, 7], encode(np.arange(7, dtype=np.int64)[None, :], "I64")),
        T("encoder.conv.weight", "F32", [6, 3, 5], encode(f(6, 3, 5), "F32")),
        T("encoder.scale", "F32", [], encode(np.array(0.5, dtype=np.float32), "F32")),
        T("encoder.proj.weight", "F32", [17, 9], encode(f(17, 9), "F32")),
        T("decoder.counts", "I32", [11], encode(rng.integers(-1000, 1000, 11), "I32")),
        T("decoder.w_bf16", "BF16", [13, 7], encode(f(13, 7), "BF16")),
        T("decoder.bias_bf16", "BF16", [3], encode(f(3), "BF16")),
        T("decoder.w_f16", "F16", [5, 2, 3], encode(f(5, 2, 3), "F16")),
        T("decoder.i16", "I16", [9], encode(rng.integers(-30000, 30000, 9), "I16")),
        T("quant.q8", "I8", [4, 9], encode(rng.integers(-128, 128, (4, 9)), "I8")),
        T("quant.u8_scalar", "U8", [], encode(np.array(200, dtype=np.uint8), "U8")),
        T("mask.bool", "BOOL", [3, 5], encode(rng.integers(0, 2, (3, 5)).astype(bool), "BOOL")),
        T("quant.u8", "U8", [31], encode(rng.integers(0, 256, 31), "U8")),
    ]
    if empty:
        out.insert(4, T("encoder.empty", "F32", [0, 4], b""))
    return out


# ----------------------------------------------------------------------------
# bad inputs
# ----------------------------------------------------------------------------

def _good_small(d, shards=1):
    ts = mixed_tensors()[:6]
    write_checkpoint(d, ts, shards)
    return ts


def _hdr_entries(entries):
    """entries: list of (name, dtype, shape, [b, e]) -> compact padded header bytes."""
    hdr = {"__metadata__": {"format": "pt"}}
    for name, dtype, shape, offs in entries:
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": offs}
    return header_bytes(hdr)


def bad(kind, d):
    """Create bad input KIND in d. Returns what the error message must name:
    files: message must contain at least one of these strings (basenames);
    tensors: if non-empty, message must contain at least one of these."""
    os.makedirs(d, exist_ok=True)
    cfg = {"model_type": "llama", "hidden_size": 64}
    write_json(os.path.join(d, "config.json"), cfg)
    ms = "model.safetensors"
    p = os.path.join(d, ms)
    if kind == "no-safetensors":
        with open(os.path.join(d, "README.md"), "w") as f:
            f.write("no weights here\n")
        return {"files": [os.path.basename(os.path.abspath(d)), os.path.abspath(d)], "tensors": []}
    if kind == "header-len-too-big":
        hb = _hdr_entries([("a", "F32", [2], [0, 8])])
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(hb) + 4096))  # claims more than the file holds
            f.write(hb)
            f.write(b"\0" * 8)
        return {"files": [ms], "tensors": []}
    if kind == "header-len-absurd":
        hb = _hdr_entries([("a", "F32", [2], [0, 8])])
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", 1 << 60))
            f.write(hb)
            f.write(b"\0" * 8)
        return {"files": [ms], "tensors": []}
    if kind == "header-not-json":
        hb = b'{"__metadata__":{"format":"pt"},"a":{"dtype":"F32" this is not json'
        hb += b" " * ((8 - len(hb) % 8) % 8)
        write_raw(p, hb, b"\0" * 8)
        return {"files": [ms], "tensors": []}
    if kind == "header-not-object":
        write_raw(p, b'[1,2,3] ', b"\0" * 8)
        return {"files": [ms], "tensors": []}
    if kind == "unknown-dtype":
        hb = _hdr_entries([("good.weight", "F32", [2], [0, 8]), ("weird.weight", "Q7", [4], [8, 12])])
        write_raw(p, hb, b"\0" * 12)
        return {"files": [ms], "tensors": ["weird.weight"]}
    if kind == "shape-mismatch":
        # 4x4 F32 = 64 bytes, but offsets span 60
        hb = _hdr_entries([("good.weight", "F32", [2], [0, 8]), ("mis.weight", "F32", [4, 4], [8, 68])])
        write_raw(p, hb, b"\0" * 68)
        return {"files": [ms], "tensors": ["mis.weight"]}
    if kind == "offsets-past-eof":
        hb = _hdr_entries([("good.weight", "F32", [2], [0, 8]), ("far.weight", "F32", [16], [8, 72])])
        write_raw(p, hb, b"\0" * 40)  # data region holds 40 bytes, tensor ends at 72
        return {"files": [ms], "tensors": ["far.weight"]}
    if kind == "overlap":
        hb = _hdr_entries([("first.weight", "F32", [4], [0, 16]), ("second.weight", "F32", [4], [8, 24])])
        write_raw(p, hb, b"\0" * 24)
        return {"files": [ms], "tensors": ["first.weight", "second.weight"]}
    if kind == "index-missing-shard":
        ts = _good_small(d, shards=2)
        ip = os.path.join(d, "model.safetensors.index.json")
        idx = json.load(open(ip))
        idx["weight_map"]["ghost.weight"] = "model-00003-of-00003.safetensors"
        with open(ip, "w") as f:
            f.write(json.dumps(idx, indent=2, sort_keys=True) + "\n")
        return {"files": ["model-00003-of-00003.safetensors"], "tensors": []}
    if kind == "index-slash":
        _good_small(d, shards=2)
        ip = os.path.join(d, "model.safetensors.index.json")
        idx = json.load(open(ip))
        sub = os.path.join(d, "sub")
        os.makedirs(sub)
        # the file exists, so the only problem is the '/' in the name
        os.rename(os.path.join(d, shard_name(2, 2)), os.path.join(sub, shard_name(2, 2)))
        for k, v in list(idx["weight_map"].items()):
            if v == shard_name(2, 2):
                idx["weight_map"][k] = "sub/" + v
        with open(ip, "w") as f:
            f.write(json.dumps(idx, indent=2, sort_keys=True) + "\n")
        return {"files": ["sub/" + shard_name(2, 2), "model.safetensors.index.json"], "tensors": []}
    if kind == "index-dotdot":
        ts = _good_small(d, shards=2)
        ip = os.path.join(d, "model.safetensors.index.json")
        idx = json.load(open(ip))
        first = sorted(idx["weight_map"])[0]
        idx["weight_map"][first] = ".."
        with open(ip, "w") as f:
            f.write(json.dumps(idx, indent=2, sort_keys=True) + "\n")
        return {"files": ["model.safetensors.index.json"], "tensors": []}
    if kind == "duplicate-tensor":
        ts = mixed_tensors()[:4]
        dup = T("dup.weight", "F32", [3], encode(np.arange(3, dtype=np.float32), "F32"))
        g1 = [ts[0], ts[1], dup]
        g2 = [ts[2], ts[3], T("dup.weight", "F32", [3], encode(np.arange(3, 6, dtype=np.float32), "F32"))]
        write_safetensors(os.path.join(d, shard_name(1, 2)), g1)
        write_safetensors(os.path.join(d, shard_name(2, 2)), g2)
        wm = {t.name: shard_name(1, 2) for t in g1}
        wm.update({t.name: shard_name(2, 2) for t in g2[:2]})
        wm["dup.weight"] = shard_name(1, 2)
        total = sum(len(t.data) for t in g1 + g2[:2])
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            f.write(index_text(wm, total))
        return {"files": [shard_name(1, 2), shard_name(2, 2)], "tensors": ["dup.weight"]}
    if kind == "config-missing":
        os.unlink(os.path.join(d, "config.json"))
        _good_small(d)
        return {"files": ["config.json"], "tensors": [], "mountable": True}
    if kind == "config-broken":
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write('{"model_type": "llama", "hidden_size": 64,\n')
        _good_small(d)
        return {"files": ["config.json"], "tensors": [], "mountable": True}
    if kind == "truncated":
        ts = mixed_tensors()[:6]
        hb = header_bytes(build_header(ts))
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb[: len(hb) // 2])  # header cut in the middle, no data
        return {"files": [ms], "tensors": []}
    raise SystemExit("unknown bad kind: %s" % kind)


BAD_KINDS = [
    "no-safetensors", "header-len-too-big", "header-len-absurd", "header-not-json",
    "header-not-object", "unknown-dtype", "shape-mismatch", "offsets-past-eof", "overlap",
    "index-missing-shard", "index-slash", "index-dotdot", "duplicate-tensor",
    "config-missing", "config-broken", "truncated",
]


def main(argv):
    ap = argparse.ArgumentParser(prog="ckpt_gen.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("llama-tiny")
    a.add_argument("dir")
    a.add_argument("--shards", type=int, default=1)
    a.add_argument("--dtype", choices=["bf16", "f32", "f16"], default="bf16")
    a.add_argument("--tokenizer", action="store_true")
    a.add_argument("--layers", type=int, default=None)
    m = sub.add_parser("mixed")
    m.add_argument("dir")
    m.add_argument("--shards", type=int, default=1)
    m.add_argument("--tokenizer", action="store_true")
    m.add_argument("--empty", action="store_true", help="also a zero-element tensor")
    b = sub.add_parser("bad")
    b.add_argument("kind", choices=BAD_KINDS)
    b.add_argument("dir")
    sub.add_parser("bad-kinds")
    args = ap.parse_args(argv)

    if args.cmd == "bad-kinds":
        print("\n".join(BAD_KINDS))
        return 0
    if args.cmd == "bad":
        print(json.dumps(bad(args.kind, args.dir)))
        return 0
    if os.path.exists(args.dir) and os.listdir(args.dir):
        raise SystemExit("ckpt_gen: %s exists and is not empty" % args.dir)
    os.makedirs(args.dir, exist_ok=True)
    if args.cmd == "llama-tiny":
        ts, c = llama_tensors(args.dtype, args.layers)
        write_checkpoint(args.dir, ts, args.shards)
        write_json(os.path.join(args.dir, "config.json"), llama_config(c, args.dtype))
        if args.tokenizer:
            write_tokenizer(args.dir, c["vocab"])
    elif args.cmd == "mixed":
        ts = mixed_tensors(empty=args.empty)
        write_checkpoint(args.dir, ts, args.shards)
        write_json(os.path.join(args.dir, "config.json"), {"model_type": "mixed-test", "note": "coverage"})
        if args.tokenizer:
            write_tokenizer(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
