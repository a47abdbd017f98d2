#!/usr/bin/python3
"""Writes a mixture-of-experts torch_dist checkpoint of a tiny Hugging Face MoE model (Qwen2-MoE
or Mixtral naming) the way Megatron-core lays one out, with torch's own
torch.distributed.checkpoint classes (run with torch 2.x, the Debian 13 root; no process group):
the Megatron tensors are built here from the HF files with numpy (DESIGN section 4, written
independently of ckptfs), cut into chunks, each chunk one torch.save item in a .distcp file, and
`.metadata` is the pickled Metadata (TensorStorageMetadata + _StorageInfo) that dcp.save would
write for them. The result is then read back with dcp.load (no process group) and compared, so a
mistake here cannot pass as ckptfs' own.

  moe_dist_source.py HF_DIR OUT_DIR [--stacked] [--spec te|local]

Default (per layer): the naming Megatron uses when layers differ in kind (args.moe_layer_freq a
list: Qwen's mlp_only_layers): every layer key carries its global index and has no layer axis,
`decoder.layers.{l}.mlp.experts.experts.linear_fc1.weight` [E, 2F, H]; chunks as Megatron's at
TP 2, EP 2, ETP 2 (fc1 gate/up halves per rank), except that fc2 chunks span two experts.
--stacked (a model whose layers are all MoE): keys stacked over layers
`decoder.layers.mlp.experts.experts.linear_fc1.weight` [L, E, 2F, H] with irregular chunks that
span several layers and experts and cross the gate/up boundary. --spec: the name of an MoE
layer's pre-MLP norm, `pre_mlp_layernorm.weight` (te, default) or
`mlp.linear_fc1.layer_norm_weight` (local, as Megatron's local spec saves it).
Writes OUT_DIR/{latest_checkpointed_iteration.txt, iter_0000005/{metadata.json, common.pt,
.metadata, __0_0.distcp, __1_0.distcp}}. Exit 0 on success; otherwise one line on stderr.
"""
import argparse
import io
import itertools
import json
import os
import pickle
import sys
import warnings

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   Metadata, MetadataIndex, TensorProperties,
                                                   TensorStorageMetadata)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import as_array, read_checkpoint  # noqa: E402

warnings.filterwarnings("ignore", message="torch.distributed is unavailable or uninitialized")
ITERATION = 5
LP = "decoder.layers."
METADATA_JSON = {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                 "common_backend": "torch", "common_backend_version": 1}


class Model:
    def __init__(self, d):
        self.cfg = c = json.load(open(os.path.join(d, "config.json")))
        self.raw = read_checkpoint(d)
        self.mixtral = c["model_type"] == "mixtral"
        self.L, self.H = c["num_hidden_layers"], c["hidden_size"]
        self.nh = c["num_attention_heads"]
        self.ng = c.get("num_key_value_heads", self.nh)
        self.d = c.get("head_dim", self.H // self.nh)
        self.vocab = c["vocab_size"]
        self.E = c["num_local_experts"] if self.mixtral else c["num_experts"]
        self.Fm = c["intermediate_size"] if self.mixtral else c["moe_intermediate_size"]
        self.F = c["intermediate_size"]
        self.S = 0 if self.mixtral else c.get("shared_expert_intermediate_size", 0)
        dense = set() if self.mixtral else set(c.get("mlp_only_layers", []))
        self.moe = [i not in dense for i in range(self.L)]

    def get(self, name):
        return as_array(self.raw[name])

    def has(self, name):
        return name in self.raw


def interleave(m, q, k, v):
    g, rest = m.ng, q.shape[1:]
    parts = [q.reshape(g, -1, *rest), k.reshape(g, -1, *rest), v.reshape(g, -1, *rest)]
    return np.concatenate(parts, axis=1).reshape(-1, *rest)


def layer_tensors(m, i, spec):
    """Megatron name (after "decoder.layers.N.") -> raw array, for layer i."""
    p = f"model.layers.{i}."
    out = {"self_attention.linear_qkv.layer_norm_weight": m.get(p + "input_layernorm.weight")}
    qkv = [m.get(p + f"self_attn.{x}_proj.weight") for x in "qkv"]
    out["self_attention.linear_qkv.weight"] = interleave(m, *qkv)
    if m.has(p + "self_attn.q_proj.bias"):
        out["self_attention.linear_qkv.bias"] = interleave(m, *[m.get(p + f"self_attn.{x}_proj.bias") for x in "qkv"])
    out["self_attention.linear_proj.weight"] = m.get(p + "self_attn.o_proj.weight")
    norm = m.get(p + "post_attention_layernorm.weight")
    if not m.moe[i]:
        out["mlp.linear_fc1.layer_norm_weight"] = norm
        out["mlp.linear_fc1.weight"] = np.concatenate([m.get(p + "mlp.gate_proj.weight"), m.get(p + "mlp.up_proj.weight")])
        out["mlp.linear_fc2.weight"] = m.get(p + "mlp.down_proj.weight")
        return out
    out["pre_mlp_layernorm.weight" if spec == "te" else "mlp.linear_fc1.layer_norm_weight"] = norm
    if m.mixtral:
        ex = p + "block_sparse_moe.experts.{}."
        gate, up, down = ex + "w1.weight", ex + "w3.weight", ex + "w2.weight"
        out["mlp.router.weight"] = m.get(p + "block_sparse_moe.gate.weight")
    else:
        ex = p + "mlp.experts.{}."
        gate, up, down = ex + "gate_proj.weight", ex + "up_proj.weight", ex + "down_proj.weight"
        out["mlp.router.weight"] = m.get(p + "mlp.gate.weight")
    out["mlp.experts.experts.linear_fc1.weight"] = np.stack(
        [np.concatenate([m.get(gate.format(e)), m.get(up.format(e))]) for e in range(m.E)])
    out["mlp.experts.experts.linear_fc2.weight"] = np.stack([m.get(down.format(e)) for e in range(m.E)])
    if m.S:
        out["mlp.shared_experts.gate_weight"] = m.get(p + "mlp.shared_expert_gate.weight")
        out["mlp.shared_experts.linear_fc1.weight"] = np.concatenate(
            [m.get(p + "mlp.shared_expert.gate_proj.weight"), m.get(p + "mlp.shared_expert.up_proj.weight")])
        out["mlp.shared_experts.linear_fc2.weight"] = m.get(p + "mlp.shared_expert.down_proj.weight")
    return out


def megatron_tensors(m, vpad, stacked, spec):
    """Key -> raw array (bf16 as uint16) of the whole checkpoint."""
    def padded(name):
        a = m.get(name)
        return np.concatenate([a, np.zeros((vpad - a.shape[0],) + a.shape[1:], a.dtype)])

    out = {"embedding.word_embeddings.weight": padded("model.embed_tokens.weight")}
    layers = [layer_tensors(m, i, spec) for i in range(m.L)]
    if stacked:
        assert all(m.moe), "--stacked: every layer must be MoE"
        for name in layers[0]:
            out[LP + name] = np.stack([t[name] for t in layers])
    else:
        for i, t in enumerate(layers):
            for name, a in t.items():
                out[f"{LP}{i}.{name}"] = a
    out["decoder.final_layernorm.weight"] = m.get("model.norm.weight")
    out["output_layer.weight"] = padded("lm_head.weight")
    return out


def cuts(n, points):
    inner = sorted({p for p in points if 0 < p < n})
    return list(zip([0] + inner, inner + [n]))


def grid(shape, per_dim):
    blocks = [per_dim.get(i, [(0, n)]) for i, n in enumerate(shape)]
    return [([lo for lo, _ in b], [hi - lo for lo, hi in b]) for b in itertools.product(*blocks)]


def boxes(key, shape, stacked):
    """Chunks (offsets, sizes) of a key."""
    tp = 2

    def halves(n):  # TP rank r's part of each half ([gate; up])
        h = n // 2
        return [(h * r // tp + b, h * (r + 1) // tp + b) for b in (0, h) for r in range(tp)]

    def even(n, k=tp):
        return [(n * r // k, n * (r + 1) // k) for r in range(k)]

    name = key.split(".", 3)[-1] if not stacked and key.startswith(LP) else key[len(LP):]
    if key in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return grid(shape, {0: even(shape[0])})
    if not key.startswith(LP):
        return grid(shape, {})
    if stacked:  # irregular: boxes over several layers and experts, across gate/up
        L = shape[0]
        if name == "mlp.experts.experts.linear_fc1.weight":
            return grid(shape, {0: cuts(L, [1, 3]), 1: cuts(shape[1], [1, 3]),
                                2: cuts(shape[2], [shape[2] // 2 + 7]), 3: cuts(shape[3], [shape[3] // 2])})
        if name == "mlp.experts.experts.linear_fc2.weight":
            return grid(shape, {0: cuts(L, [2]), 3: cuts(shape[3], [5])})
        if name == "mlp.router.weight":
            return grid(shape, {0: cuts(L, [1]), 1: cuts(shape[1], [3])})
        if name.endswith("linear_qkv.weight"):
            return grid(shape, {0: cuts(L, [2]), 1: cuts(shape[1], [3, 10])})
        return grid(shape, {0: cuts(L, range(L))})
    # per layer: Megatron's TP 2 / EP 2 / ETP 2 chunks
    if name == "mlp.experts.experts.linear_fc1.weight":
        return grid(shape, {0: cuts(shape[0], range(shape[0])), 1: halves(shape[1])})
    if name == "mlp.experts.experts.linear_fc2.weight":  # two experts per box
        return grid(shape, {0: even(shape[0]), 2: even(shape[2])})
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias")):
        return grid(shape, {0: even(shape[0])})
    if name.endswith(("mlp.linear_fc1.weight", "shared_experts.linear_fc1.weight")):
        return grid(shape, {0: halves(shape[0])})
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return grid(shape, {1: even(shape[1])})
    return grid(shape, {})


def to_torch(a):
    if a.dtype == np.uint16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def saved(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def extra_state_keys(m, stacked):
    mods = ["self_attention.linear_qkv", "self_attention.linear_proj"]
    out = []
    for i in range(m.L):
        ks = mods + (["mlp.shared_experts.linear_fc1", "mlp.shared_experts.linear_fc2"] if m.S else [])
        if not m.moe[i]:
            ks = mods + ["mlp.linear_fc1", "mlp.linear_fc2"]
        for mod in ks:
            out.append(f"{LP}{mod}._extra_state/shard_{i}_{m.L}" if stacked
                       else f"{LP}{i}.{mod}._extra_state/shard_0_1")
        if m.moe[i]:
            for lin, e in itertools.product(("linear_fc1", "linear_fc2"), range(m.E)):
                out.append(f"{LP}mlp.experts.experts.{lin}._extra_state/shard_{i}.{e}_{m.L}.{m.E}" if stacked
                           else f"{LP}{i}.mlp.experts.experts.{lin}._extra_state/shard_{e}_{m.E}")
    return list(dict.fromkeys(out))


def args_namespace(m, vpad, stacked):
    c = m.cfg
    return argparse.Namespace(
        num_layers=m.L, hidden_size=m.H, ffn_hidden_size=m.F, num_attention_heads=m.nh,
        group_query_attention=m.ng != m.nh, num_query_groups=m.ng, kv_channels=m.d,
        padded_vocab_size=vpad, vocab_size=m.vocab, tensor_model_parallel_size=2,
        pipeline_model_parallel_size=1, expert_model_parallel_size=2, expert_tensor_parallel_size=2,
        untie_embeddings_and_output_weights=True, add_qkv_bias=m.has("model.layers.0.self_attn.q_proj.bias"),
        add_bias_linear=False, qk_layernorm=False, swiglu=True, normalization="RMSNorm",
        layernorm_epsilon=c.get("rms_norm_eps", 1e-6), rotary_base=c.get("rope_theta", 10000.0),
        position_embedding_type="rope", max_position_embeddings=c.get("max_position_embeddings", 4096),
        make_vocab_size_divisible_by=128, bf16=True, params_dtype=torch.bfloat16,
        num_experts=m.E, moe_ffn_hidden_size=m.Fm, moe_router_topk=c["num_experts_per_tok"],
        moe_router_score_function="softmax", moe_router_load_balancing_type="none",
        moe_router_pre_softmax=not m.mixtral and not c.get("norm_topk_prob", False),
        moe_shared_expert_intermediate_size=m.S or None, moe_shared_expert_gate=bool(m.S),
        moe_router_topk_scaling_factor=None, moe_router_num_groups=None, moe_router_group_topk=None,
        moe_router_enable_expert_bias=False,
        moe_layer_freq=1 if stacked else [int(x) for x in m.moe],
        ckpt_format="torch_dist", use_dist_ckpt=True, iteration=0, no_save_optim=None, no_save_rng=None)


def write(m, out_dir, stacked, spec):
    vpad = -(-m.vocab // 128) * 128
    it = os.path.join(out_dir, f"iter_{ITERATION:07d}")
    os.makedirs(it, exist_ok=True)
    tensors = megatron_tensors(m, vpad, stacked, spec)
    items = []  # (fqn, offsets or None, bytes)
    sdm = {}
    for key in extra_state_keys(m, stacked):
        sdm[key] = BytesStorageMetadata()
        items.append((key, None, saved([None])))
    full = {}
    for key, a in tensors.items():
        t = to_torch(a)
        full[key] = t
        chunks = []
        for off, size in boxes(key, list(t.shape), stacked):
            chunks.append(ChunkStorageMetadata(offsets=torch.Size(off), sizes=torch.Size(size)))
            idx = tuple(slice(o, o + s) for o, s in zip(off, size))
            items.append((key, off, saved(t[idx].clone())))
        sdm[key] = TensorStorageMetadata(properties=TensorProperties(dtype=t.dtype), size=t.shape, chunks=chunks)
    # optimizer state, as a save that kept it holds (fp32, the key's chunking): never read
    router = next(k for k in tensors if k.endswith("mlp.router.weight"))
    opt = torch.ones(full[router].shape, dtype=torch.float32)
    sdm["optimizer.state.exp_avg." + router] = TensorStorageMetadata(
        properties=TensorProperties(dtype=torch.float32), size=opt.shape,
        chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * opt.dim()), sizes=opt.shape)])
    items.append(("optimizer.state.exp_avg." + router, [0] * opt.dim(), saved(opt)))
    storage = {}
    files = [bytearray(), bytearray()]
    for n, (key, off, data) in enumerate(items):
        f = n % 2
        index = MetadataIndex(fqn=key, offset=torch.Size(off) if off is not None else None)
        storage[index] = _StorageInfo(relative_path=f"__{f}_0.distcp", offset=len(files[f]), length=len(data))
        files[f] += data
    for f, data in enumerate(files):
        open(os.path.join(it, f"__{f}_0.distcp"), "wb").write(bytes(data))
    with open(os.path.join(it, ".metadata"), "wb") as f:
        pickle.dump(Metadata(state_dict_metadata=sdm, planner_data=None, storage_data=storage), f)
    common = {"args": args_namespace(m, vpad, stacked), "checkpoint_version": 3.0, "iteration": ITERATION,
              "content_metadata": {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}}
    torch.save(common, os.path.join(it, "common.pt"))
    json.dump(METADATA_JSON, open(os.path.join(it, "metadata.json"), "w"))
    open(os.path.join(out_dir, "latest_checkpointed_iteration.txt"), "w").write(str(ITERATION))
    # torch's own reader: every tensor comes back whole and equal
    back = {k: torch.full_like(v, float("nan")) for k, v in full.items()}
    dcp.load(back, storage_reader=FileSystemReader(it), planner=DefaultLoadPlanner())
    for k, v in full.items():
        if not torch.equal(back[k].view(torch.int16) if v.dtype == torch.bfloat16 else back[k],
                           v.view(torch.int16) if v.dtype == torch.bfloat16 else v):
            sys.exit(f"dcp.load of {k} differs from what was written")
    nchunks = sum(len(v.chunks) for v in sdm.values() if isinstance(v, TensorStorageMetadata))
    print(f"# {it}: {len(sdm)} entries ({len(tensors)} model keys, {nchunks} chunks); dcp.load reads them back equal")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("hf_dir")
    p.add_argument("out_dir")
    p.add_argument("--stacked", action="store_true")
    p.add_argument("--spec", choices=("te", "local"), default="te")
    a = p.parse_args()
    write(Model(a.hf_dir), a.out_dir, a.stacked, a.spec)


if __name__ == "__main__":
    main()
