#!/usr/bin/python3
"""Checks a torch_dist checkpoint of a mixture-of-experts model (ckptfs's mcore/) against an
independent numpy expectation built from the Hugging Face files, and against a checkpoint
Megatron-core wrote itself. The expectation is written from Megatron-core's sharded_state_dict
as DESIGN section 4/7 and research/moe-real-megatron.md describe it, not from ckptfs:

- every layer an MoE layer (Mixtral), or none: layer keys stacked with a leading layer axis,
  `decoder.layers.mlp.experts.experts.linear_fc1.weight` [L, E, 2F, H] (rows: the expert's gate
  then up), `...linear_fc2.weight` [L, E, H, F], router `decoder.layers.mlp.router.weight`
  [L, E, H], shared expert `decoder.layers.mlp.shared_experts.{linear_fc1 [L, 2S, H],
  linear_fc2 [L, H, S], gate_weight [L, 1, H]}`;
- dense layers among MoE layers (Qwen's mlp_only_layers, decoder_sparse_step): every layer key
  is that layer's, `decoder.layers.{l}.<name>`, with no layer axis (experts [E, 2F, H]);
- the MoE pre-MLP norm: `mlp.linear_fc1.layer_norm_weight` (local spec) or
  `pre_mlp_layernorm.weight` (TE spec); a dense layer's is `mlp.linear_fc1.layer_norm_weight`;
- `_extra_state` objects: stacked `decoder.layers.X._extra_state/shard_{l}_{L}`, experts
  `.../shard_{l}.{e}_{L}.{E}`; per layer `decoder.layers.{l}.X._extra_state/shard_0_1`,
  experts `.../shard_{e}_{E}`.

  moe_dcp_check.py load CKPT_DIR HF_DIR [--spec te|local] [--keys K1,K2] [--megatron]  (torch 2.x)
    .metadata's key set (model tensors exactly; every _extra_state a local-spec Megatron model
    requests, plus at most the TE-spec ones), global shapes and dtypes; dcp.load of every tensor
    (or --keys) into 0xFF-filled tensors, compared bit for bit; each _extra_state object loads;
    common.pt (weights_only, argparse.Namespace only) carries the MoE args and says no optimizer
    or RNG state. --megatron: a checkpoint Megatron wrote (its globals stubbed, optimizer and RNG
    state kept).
  moe_dcp_check.py share CKPT_DIR --loaders TxEP[xETP],... [--bound 1.25] [--hf HF_DIR]
    Read amplification of each (TP rank, EP rank) of each loader: TP T, EP EP, expert TP ETP
    (Megatron's default: T). Dense keys as dcp_check.py share; expert keys: the rank's experts
    [k*E/EP, (k+1)*E/EP) and its expert-TP share (expert-TP rank = TP rank mod ETP). Ratio =
    payload of the stored chunks its share overlaps / payload of its share. One line per loader
    `RESULT tp T ep EP etp X: max ratio R (bound B) ok|over`; fails when a loader is over the
    bound or a share is not covered.
  moe_dcp_check.py compare-real CKPT_DIR REAL_DIR
    Against a torch_dist checkpoint Megatron wrote: the same model tensor keys and dtypes, the
    same global shapes (the vocabulary's rows may be padded differently), each chunk of CKPT
    inside one chunk of REAL (the same boxes or finer), REAL's _extra_state objects all present.
  moe_dcp_check.py host CKPT_DIR HF_DIR [--spec te|local]                     (torch 1.13)
    Without torch.distributed.checkpoint: .metadata unpickled with inert classes, every chunk
    torch.load'ed from its bytes, the tensors assembled and compared with the expectation.

Exit status 0 = pass; otherwise one line on stderr says why. Informative lines start with '# '.
"""
import argparse
import io
import json
import os
import sys
import traceback
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import as_array, read_checkpoint  # noqa: E402

LP = "decoder.layers."
VOCAB_KEYS = ("embedding.word_embeddings.weight", "output_layer.weight")
IGNORED_PREFIXES = ("optimizer.", "rng_state")

warnings.filterwarnings("ignore", message="torch.distributed is unavailable or uninitialized")


class Fail(Exception):
    pass


def info(msg):
    print(f"# {msg}")


def check(cond, msg):
    if not cond:
        raise Fail(msg)


# --- the expectation (numpy) ---

class MoEModel:
    """A Hugging Face Mixtral / Qwen2-MoE / Qwen3-MoE checkpoint, read with numpy."""

    def __init__(self, d):
        self.cfg = c = json.load(open(os.path.join(d, "config.json")))
        self.raw = read_checkpoint(d)
        self.mixtral = c["model_type"] == "mixtral"
        self.L, self.H = c["num_hidden_layers"], c["hidden_size"]
        self.nh = c["num_attention_heads"]
        self.ng = c.get("num_key_value_heads", self.nh)
        self.d = c.get("head_dim") or self.H // self.nh
        self.vocab = c["vocab_size"]
        self.tied = c.get("tie_word_embeddings", False)
        if self.mixtral:
            self.E, self.F, self.S = c["num_local_experts"], c["intermediate_size"], 0
            self.dense_F = None
        else:
            self.E, self.F = c["num_experts"], c["moe_intermediate_size"]
            self.S = c.get("shared_expert_intermediate_size") or 0
            self.dense_F = c["intermediate_size"]
        self.moe = [self.layer_is_moe(i) for i in range(self.L)]
        # Megatron stacks layers only when moe_layer_freq is 1 (every layer MoE).
        self.per_layer = not all(self.moe)
        self.mlp = "block_sparse_moe." if self.mixtral else "mlp."
        self.shared_gate = self.has("model.layers.%d.mlp.shared_expert_gate.weight" % self.moe.index(True)) \
            if any(self.moe) else False

    def layer_is_moe(self, i):
        """Transformers' rule: every Mixtral layer; a Qwen MoE layer unless it is listed in
        mlp_only_layers or off the decoder_sparse_step grid."""
        c = self.cfg
        if self.mixtral:
            return True
        step = c.get("decoder_sparse_step", 1)
        return (i not in c.get("mlp_only_layers", []) and self.E > 0 and step > 0
                and (i + 1) % step == 0)

    def has(self, name):
        return name in self.raw

    def get(self, name):
        check(name in self.raw, f"the Hugging Face checkpoint has no {name}")
        return as_array(self.raw[name])

    def dtype(self):
        return self.raw["model.norm.weight"][0]

    def qkv(self, i, what):
        """q/k/v of layer i interleaved per query group: for each group, its heads' q rows, its
        k rows, its v rows."""
        parts = [self.get(f"model.layers.{i}.self_attn.{p}_proj.{what}") for p in "qkv"]
        rest = parts[0].shape[1:]
        return np.concatenate([a.reshape(self.ng, -1, *rest) for a in parts], axis=1).reshape(-1, *rest)

    def layer_tensors(self, i, te_spec):
        """Megatron name (after decoder.layers.[i.]) -> raw numpy values of layer i."""
        p = f"model.layers.{i}."
        out = {"self_attention.linear_qkv.layer_norm_weight": self.get(p + "input_layernorm.weight"),
               "self_attention.linear_qkv.weight": self.qkv(i, "weight")}
        if self.has(p + "self_attn.q_proj.bias"):
            out["self_attention.linear_qkv.bias"] = self.qkv(i, "bias")
        if self.has(p + "self_attn.q_norm.weight"):
            out["self_attention.q_layernorm.weight"] = self.get(p + "self_attn.q_norm.weight")
            out["self_attention.k_layernorm.weight"] = self.get(p + "self_attn.k_norm.weight")
        out["self_attention.linear_proj.weight"] = self.get(p + "self_attn.o_proj.weight")
        norm = self.get(p + "post_attention_layernorm.weight")
        if not self.moe[i]:
            out["mlp.linear_fc1.layer_norm_weight"] = norm
            out["mlp.linear_fc1.weight"] = np.concatenate(
                [self.get(p + "mlp.gate_proj.weight"), self.get(p + "mlp.up_proj.weight")])
            out["mlp.linear_fc2.weight"] = self.get(p + "mlp.down_proj.weight")
            return out
        out["pre_mlp_layernorm.weight" if te_spec else "mlp.linear_fc1.layer_norm_weight"] = norm
        q = p + self.mlp
        out["mlp.router.weight"] = self.get(q + "gate.weight")
        if self.mixtral:
            names = [(f"experts.{e}.w1.weight", f"experts.{e}.w3.weight", f"experts.{e}.w2.weight")
                     for e in range(self.E)]
        else:
            names = [(f"experts.{e}.gate_proj.weight", f"experts.{e}.up_proj.weight",
                      f"experts.{e}.down_proj.weight") for e in range(self.E)]
        out["mlp.experts.experts.linear_fc1.weight"] = np.stack(
            [np.concatenate([self.get(q + g), self.get(q + u)]) for g, u, _ in names])
        out["mlp.experts.experts.linear_fc2.weight"] = np.stack([self.get(q + d) for _, _, d in names])
        if self.S:
            s = q + "shared_expert."
            if self.shared_gate:
                out["mlp.shared_experts.gate_weight"] = self.get(q + "shared_expert_gate.weight")
            out["mlp.shared_experts.linear_fc1.weight"] = np.concatenate(
                [self.get(s + "gate_proj.weight"), self.get(s + "up_proj.weight")])
            out["mlp.shared_experts.linear_fc2.weight"] = self.get(s + "down_proj.weight")
        return out

    def expected(self, vpad, te_spec):
        """torch_dist key -> raw numpy values, the vocabulary padded with zero rows to vpad."""
        def vocab_rows(name):
            a = self.get(name)
            return np.concatenate([a, np.zeros((vpad - a.shape[0],) + a.shape[1:], a.dtype)])

        out = {"embedding.word_embeddings.weight": vocab_rows("model.embed_tokens.weight")}
        layers = [self.layer_tensors(i, te_spec) for i in range(self.L)]
        if self.per_layer:
            for i, t in enumerate(layers):
                out.update({f"{LP}{i}.{k}": v for k, v in t.items()})
        else:
            for k in layers[0]:
                out[LP + k] = np.stack([t[k] for t in layers])
        out["decoder.final_layernorm.weight"] = self.get("model.norm.weight")
        if not self.tied:
            out["output_layer.weight"] = vocab_rows("lm_head.weight")
        return out

    def extra_states(self):
        """(required, allowed): the _extra_state objects a local-spec Megatron model requests,
        and those a TE-spec one adds (core attention, q/k norms, an MoE layer's pre-MLP norm)."""
        req, te = set(), set()
        for i in range(self.L):
            mods = ["self_attention.linear_qkv", "self_attention.linear_proj"]
            expert_mods = []
            if self.moe[i]:
                expert_mods = ["mlp.experts.experts.linear_fc1", "mlp.experts.experts.linear_fc2"]
                if self.S:
                    mods += ["mlp.shared_experts.linear_fc1", "mlp.shared_experts.linear_fc2"]
            else:
                mods += ["mlp.linear_fc1", "mlp.linear_fc2"]
            te_mods = ["self_attention.core_attention"]
            if self.moe[i]:  # TENorm before the MoE block (the dense layers' is fused into fc1)
                te_mods.append("pre_mlp_layernorm")
            if self.has(f"model.layers.{i}.self_attn.q_norm.weight"):
                te_mods += ["self_attention.q_layernorm", "self_attention.k_layernorm"]
            for group, mlist in ((req, mods), (te, te_mods)):
                for mod in mlist:
                    group.add(f"{LP}{i}.{mod}._extra_state/shard_0_1" if self.per_layer
                              else f"{LP}{mod}._extra_state/shard_{i}_{self.L}")
            for mod in expert_mods:
                for e in range(self.E):
                    req.add(f"{LP}{i}.{mod}._extra_state/shard_{e}_{self.E}" if self.per_layer
                            else f"{LP}{mod}._extra_state/shard_{i}.{e}_{self.L}.{self.E}")
        return req, req | te


def dense_tp_boxes(key, size, T, r, vt):
    """The boxes (offsets, sizes) of a dense (or shared-expert) key that TP rank r of T loads;
    offsets along the last axes, so stacked and per-layer keys alike."""
    n = len(size)

    def box(axis, lo, hi):
        axis %= n
        lo, hi = min(lo, size[axis]), min(hi, size[axis])
        if lo >= hi:
            return None
        off, sz = [0] * n, list(size)
        off[axis], sz[axis] = lo, hi - lo
        return off, sz

    def part(axis, total, base=0):
        return box(axis, base + r * total // T, base + (r + 1) * total // T)

    if key in VOCAB_KEYS:
        boxes = [part(0, vt)]
    elif key.endswith("linear_qkv.weight"):
        boxes = [part(-2, size[-2])]
    elif key.endswith("linear_qkv.bias"):
        boxes = [part(-1, size[-1])]
    elif key.endswith("linear_fc1.weight"):  # [gate; up]: the same rows of each half
        f = size[-2] // 2
        boxes = [part(-2, f), part(-2, f, f)]
    elif key.endswith(("linear_proj.weight", "linear_fc2.weight")):
        boxes = [part(-1, size[-1])]
    elif key.endswith(("layer_norm_weight", "layernorm.weight", "router.weight", "gate_weight")):
        boxes = [([0] * n, list(size))]  # replicated
    else:
        raise Fail(f"no TP rule for {key}")
    return [b for b in boxes if b is not None]


def rank_boxes(key, size, tp, etp, ep, tr, er, vt):
    """What the rank with dense TP rank tr and EP rank er loads of key: dense keys its TP share;
    expert keys (expert axis third from the end) its experts and its expert-TP share (expert-TP
    rank tr % etp)."""
    if ".experts.experts." not in key:
        return dense_tp_boxes(key, size, tp, tr, vt)
    E = size[-3]
    lo, hi = er * E // ep, (er + 1) * E // ep
    out = []
    for off, sz in dense_tp_boxes(key, size, etp, tr % etp, vt):
        off[-3], sz[-3] = lo, hi - lo
        out.append((off, sz))
    return out


# --- torch 2.x commands ---

def raw_bytes(t):
    import torch
    return t.contiguous().reshape(-1).view(torch.uint8).numpy()


def model_tensor_keys(md):
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    return [k for k, v in md.state_dict_metadata.items()
            if isinstance(v, TensorStorageMetadata) and not k.startswith(IGNORED_PREFIXES)]


def byte_keys(md):
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    return {k for k, v in md.state_dict_metadata.items()
            if isinstance(v, BytesStorageMetadata) and not k.startswith(IGNORED_PREFIXES)}


def padded_rows(sdm, m):
    rows = sdm["embedding.word_embeddings.weight"].size[0]
    check(rows >= m.vocab and rows % 128 == 0,
          f"embedding has {rows} rows: not the vocabulary {m.vocab} padded to a multiple of 128")
    return rows


def check_common_moe(ckpt, m, megatron):
    from dcp_check import load_common
    common, _ = load_common(os.path.join(ckpt, "common.pt"), ckptfs_view=not megatron)
    a = common["args"]
    want = {"num_layers": m.L, "hidden_size": m.H, "num_attention_heads": m.nh,
            "num_experts": m.E, "moe_ffn_hidden_size": m.F,
            "moe_layer_freq": [int(x) for x in m.moe] if m.per_layer else 1,
            "moe_shared_expert_intermediate_size": m.S or None,
            "moe_router_topk": m.cfg["num_experts_per_tok"]}
    if not megatron:  # a checkpoint of weights only: loaders ask for no optimizer or RNG state
        want.update(no_save_optim=True, no_save_rng=True)
    if m.dense_F is not None:
        want["ffn_hidden_size"] = m.dense_F
    for k, v in want.items():
        check(getattr(a, k, None) == v, f"common.pt args.{k} = {getattr(a, k, None)!r}, expected {v!r}")
    check(common.get("checkpoint_version") == 3.0, "common.pt checkpoint_version is not 3.0")
    info(f"common.pt: MoE args as expected (num_experts {m.E}, moe_ffn {m.F}, "
         f"moe_layer_freq {want['moe_layer_freq']})")


def cmd_load(args):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    st_torch = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    m = MoEModel(args.hf_dir)
    te = args.spec == "te"
    md = FileSystemReader(args.ckpt).read_metadata()
    sdm = md.state_dict_metadata
    check("embedding.word_embeddings.weight" in sdm, "no embedding.word_embeddings.weight")
    expected = m.expected(padded_rows(sdm, m), te)
    tensors = set(model_tensor_keys(md))
    missing, unexpected = sorted(set(expected) - tensors), sorted(tensors - set(expected))
    check(not missing, f"missing tensor keys: {missing[:6]}{' ...' if len(missing) > 6 else ''}")
    check(not unexpected, f"unexpected tensor keys: {unexpected[:6]}{' ...' if len(unexpected) > 6 else ''}")
    dt = st_torch[m.dtype()]
    for k, a in expected.items():
        check(sdm[k].properties.dtype == dt, f"{k}: dtype {sdm[k].properties.dtype}, expected {dt}")
        check(tuple(sdm[k].size) == a.shape, f"{k}: shape {tuple(sdm[k].size)}, expected {a.shape}")
    required, allowed = m.extra_states()
    objects = byte_keys(md)
    lacking, odd = sorted(required - objects), sorted(objects - allowed)
    check(not lacking, f"missing _extra_state objects: {lacking[:4]}{' ...' if len(lacking) > 4 else ''}")
    check(not odd, f"unexpected byte entries: {odd[:4]}{' ...' if len(odd) > 4 else ''}")
    info(f".metadata: {len(tensors)} tensor keys ({'per layer' if m.per_layer else 'stacked'}), "
         f"{len(objects)} _extra_state objects ({len(required)} required)")
    check_common_moe(args.ckpt, m, args.megatron)
    keys = args.keys.split(",") if args.keys else sorted(expected)
    check(all(k in expected for k in keys), f"--keys: not model keys: {[k for k in keys if k not in expected]}")
    sd = {}
    for k in keys:
        sd[k] = torch.empty(tuple(sdm[k].size), dtype=dt)
        sd[k].view(torch.uint8).fill_(0xFF)
    dcp.load(sd, storage_reader=FileSystemReader(args.ckpt))
    for k in keys:
        got, want = raw_bytes(sd[k]), np.frombuffer(expected[k].tobytes(), np.uint8)
        if not np.array_equal(got, want):
            bad = np.flatnonzero(got != want)
            raise Fail(f"{k}: {len(bad)} of {len(want)} bytes differ (first at byte {bad[0]})")
    info(f"dcp.load: {len(keys)} tensors bit-identical to the expectation")
    if not args.keys:
        osd = {k: io.BytesIO() for k in sorted(objects)}
        dcp.load(osd, storage_reader=FileSystemReader(args.ckpt))
        kinds = {repr(v) for v in osd.values()}
        check(kinds <= {"[None]", "None"}, f"_extra_state values {sorted(kinds)}")
        info(f"dcp.load: {len(osd)} _extra_state objects, values {sorted(kinds)}")
    info("load: pass")


def share_ratio(md, T, EP, ETP, vt):
    """The largest read amplification over the ranks of a (T, EP, ETP) loader."""
    import torch
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
    sdm = md.state_dict_metadata
    keys = model_tensor_keys(md)
    mib, worst = 1 << 20, 0.0
    for er in range(EP):
        for tr in range(T):
            share = chunks = 0
            worst_key = (1.0, None)
            for k in keys:
                tmd = sdm[k]
                el = tmd.properties.dtype.itemsize
                boxes = rank_boxes(k, list(tmd.size), T, ETP, EP, tr, er, vt)
                want = [ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s)) for o, s in boxes]
                reads = create_read_items_for_chunk_list(k, tmd, want)
                stored = {ri.storage_index.index for ri in reads}
                k_share = sum(int(np.prod(s)) for _, s in boxes) * el
                covered = sum(int(np.prod(ri.lengths)) for ri in reads) * el
                check(covered == k_share, f"tp {T} ep {EP} rank ({tr}, {er}): stored chunks of {k} "
                                          f"cover {covered} of its {k_share} share bytes")
                k_chunks = sum(int(np.prod(tmd.chunks[i].sizes)) for i in stored) * el
                share += k_share
                chunks += k_chunks
                if k_share and k_chunks / k_share > worst_key[0]:
                    worst_key = (k_chunks / k_share, k)
            ratio = chunks / share
            worst = max(worst, ratio)
            info(f"tp {T} ep {EP} etp {ETP} rank (tp {tr}, ep {er}): share {share / mib:.4f} MiB, "
                 f"chunks read {chunks / mib:.4f} MiB (ratio {ratio:.3f})"
                 + (f"; worst key {worst_key[1]} ({worst_key[0]:.3f})" if worst_key[1] else ""))
    return worst


def cmd_share(args):
    from torch.distributed.checkpoint import FileSystemReader
    md = FileSystemReader(args.ckpt).read_metadata()
    if args.hf:
        vocab = json.load(open(os.path.join(args.hf, "config.json")))["vocab_size"]
    else:
        from dcp_check import load_common
        vocab = load_common(os.path.join(args.ckpt, "common.pt"), ckptfs_view=True)[0]["args"].vocab_size
    pairs = [tuple(int(x) for x in p.split("x")) for p in args.loaders.split(",")]
    over = []
    for p in pairs:
        check(len(p) in (2, 3), f"--loaders: {p} is not TxEP or TxEPxETP")
        T, EP = p[0], p[1]
        ETP = p[2] if len(p) == 3 else T  # Megatron's default expert TP: the dense TP
        worst = share_ratio(md, T, EP, ETP, -(-vocab // (128 * T)) * 128 * T)
        verdict = "ok" if worst <= args.bound else "over"
        print(f"RESULT tp {T} ep {EP} etp {ETP}: max ratio {worst:.3f} (bound {args.bound}) {verdict}")
        if verdict == "over":
            over.append(f"tp {T} ep {EP} etp {ETP}: {worst:.3f}")
    check(not over, f"read amplification above {args.bound}: {'; '.join(over)}")


def cmd_compare_real(args):
    from torch.distributed.checkpoint import FileSystemReader
    ours = FileSystemReader(args.ckpt).read_metadata()
    real = FileSystemReader(args.real).read_metadata()
    ok_keys, rk = set(model_tensor_keys(ours)), set(model_tensor_keys(real))
    check(ok_keys == rk, f"model tensor keys differ: only here {sorted(ok_keys - rk)}, "
                         f"only in the real one {sorted(rk - ok_keys)}")
    finer = []
    for k in sorted(rk):
        a, b = ours.state_dict_metadata[k], real.state_dict_metadata[k]
        check(a.properties.dtype == b.properties.dtype, f"{k}: dtype {a.properties.dtype}, real {b.properties.dtype}")
        if k in VOCAB_KEYS:  # each padded for its own TP degree: only the columns must agree
            check(tuple(a.size[1:]) == tuple(b.size[1:]), f"{k}: shape {tuple(a.size)}, real {tuple(b.size)}")
            continue
        check(tuple(a.size) == tuple(b.size), f"{k}: shape {tuple(a.size)}, real {tuple(b.size)}")
        boxes = [(tuple(c.offsets), tuple(c.sizes)) for c in b.chunks]
        for c in a.chunks:
            o, s = tuple(c.offsets), tuple(c.sizes)
            inside = [ro for ro, rs in boxes
                      if all(r0 <= x and x + n <= r0 + rn for x, n, r0, rn in zip(o, s, ro, rs))]
            check(len(inside) == 1, f"{k}: chunk at {o} size {s} is inside {len(inside)} of the real chunks")
        finer.append(f"{k.replace(LP, '')} {len(a.chunks)}/{len(b.chunks)}")
    ro, oo = byte_keys(real), byte_keys(ours)
    check(ro <= oo, f"_extra_state objects of the real checkpoint missing: {sorted(ro - oo)[:4]}")
    info(f"{len(rk)} model tensor keys, dtypes and shapes as in the real checkpoint; chunks "
         f"(here/real) {', '.join(finer)}")
    info(f"all {len(ro)} _extra_state objects of the real checkpoint present "
         f"(here {len(oo)}: also {sorted({k.split('/')[0] for k in oo - ro})})")


# --- torch 1.13 (host) ---

def cmd_host(args):
    import torch
    from dcp_host import RAW, MetadataUnpickler, kind
    m = MoEModel(args.hf_dir)
    with open(os.path.join(args.ckpt, ".metadata"), "rb") as f:
        md = MetadataUnpickler(f).load()
    sdm, storage = md.state["state_dict_metadata"], md.state["storage_data"]
    where = {(k.state["fqn"], tuple(k.state.get("offset") or ())): v.state for k, v in storage.items()}

    def item(fqn, offsets):
        s = where[(fqn, tuple(offsets))]
        with open(os.path.join(args.ckpt, s["relative_path"]), "rb") as f:
            f.seek(s["offset"])
            return torch.load(io.BytesIO(f.read(s["length"])), map_location="cpu")

    expected = m.expected(sdm["embedding.word_embeddings.weight"].state["size"][0], args.spec == "te")
    tensor_keys = [k for k, v in sdm.items() if kind(v) == "TensorStorageMetadata"]
    check(sorted(tensor_keys) == sorted(expected), f"keys differ: {sorted(set(tensor_keys) ^ set(expected))[:6]}")
    nchunks = 0
    for key in tensor_keys:
        st = sdm[key].state
        dtype = st["properties"].state[0]
        np_raw, torch_raw = RAW[dtype]
        got = np.full(st["size"], np.iinfo(np_raw).max, np_raw)
        for c in st["chunks"]:
            off, size = c.state["offsets"], c.state["sizes"]
            t = item(key, off)
            check(tuple(t.shape) == tuple(size) and t.dtype == dtype,
                  f"{key} chunk at {off}: {tuple(t.shape)} {t.dtype}, .metadata says {size} {dtype}")
            got[tuple(slice(o, o + n) for o, n in zip(off, size))] = t.view(torch_raw).numpy().view(np_raw)
            nchunks += 1
        check(got.shape == expected[key].shape and np.array_equal(got, expected[key].view(np_raw)),
              f"{key}: differs from the expectation")
    objects = [k for k, v in sdm.items() if kind(v) == "BytesStorageMetadata"]
    required, allowed = m.extra_states()
    check(required <= set(objects) <= allowed, f"_extra_state objects: missing "
          f"{sorted(required - set(objects))[:3]}, unexpected {sorted(set(objects) - allowed)[:3]}")
    values = {repr(item(k, ())) for k in objects}
    info(f"torch {torch.__version__}: {len(tensor_keys)} tensors ({nchunks} chunks) bit-identical, "
         f"{len(objects)} objects ({', '.join(sorted(values))})")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("load", "host"):
        lp = sub.add_parser(name)
        lp.add_argument("ckpt")
        lp.add_argument("hf_dir")
        lp.add_argument("--spec", choices=("te", "local"), default="te")
        if name == "load":
            lp.add_argument("--keys")
            lp.add_argument("--megatron", action="store_true")
    sp = sub.add_parser("share")
    sp.add_argument("ckpt")
    sp.add_argument("--loaders", required=True)
    sp.add_argument("--bound", type=float, default=1.25)
    sp.add_argument("--hf")
    cp = sub.add_parser("compare-real")
    cp.add_argument("ckpt")
    cp.add_argument("real")
    args = p.parse_args()
    try:
        {"load": cmd_load, "share": cmd_share, "compare-real": cmd_compare_real,
         "host": cmd_host}[args.cmd](args)
    except Fail as e:
        print(f"moe_dcp_check.py {args.cmd}: {e}", file=sys.stderr)
        sys.exit(1)
    except Exception as e:  # torch's own errors (missing key, size mismatch, bad pickle...)
        where = traceback.extract_tb(e.__traceback__)[-1]
        msg = " ".join(str(e).split())
        print(f"moe_dcp_check.py {args.cmd}: {type(e).__name__}: {msg} "
              f"({os.path.basename(where.filename)}:{where.lineno})", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
