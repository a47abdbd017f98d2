#!/usr/bin/python3
"""Checks torch_dist (Megatron-core distributed) checkpoints with torch's own
torch.distributed.checkpoint (DCP) code, against an independent numpy expectation built from a
Hugging Face model (DESIGN section 4). Run with torch 2.x (the Debian 13 root).

  dcp_check.py load CKPT_DIR HF_DIR [--keys K1,K2,...] [--vocab-divisible-by 128] [--ckptfs-view]
    CKPT_DIR is an iter_* dir (metadata.json, common.pt, .metadata, *.distcp). Checks the key
    set of .metadata (every stacked Megatron key of the model, nothing unexpected; optimizer.*,
    rng_state* and _extra_state/shard_l_L byte entries are allowed), global shapes and dtypes,
    loads every tensor (or only --keys) with dcp.load into tensors pre-filled with 0xFF bytes
    and compares it bit for bit with the expected stacked tensor, loads each layer's
    local-spec _extra_state entries, and checks metadata.json and common.pt. --ckptfs-view: common.pt must load with weights_only=True
    allowing only argparse.Namespace, and args must say no_save_optim / no_save_rng; without it
    (Megatron's own files) globals that cannot be imported (Megatron enums) are stubbed.

  dcp_check.py share CKPT_DIR --tp T [--bound 1.25] [--vocab-divisible-by 128] [--hf HF_DIR]
    Read amplification of a TP-T loader: for each rank, the stored chunks its Megatron share
    overlaps (found with torch's create_read_items_for_chunk_list) are read whole; ratio =
    payload bytes of those chunks / payload bytes of the share. Fails when the largest ratio
    exceeds --bound; also fails when the stored chunks do not cover a share. The true
    vocabulary comes from --hf's config or common.pt args.vocab_size.

  dcp_check.py make-source HF_DIR OUT_DIR [--ranks N] [--irregular]
    Writes OUT_DIR/{latest_checkpointed_iteration.txt, iter_0000007/} with torch's own
    dcp.save (no state-dict flattening, like Megatron) from N gloo processes, each saving
    ShardedTensors. Default layout: Megatron's at TP=N, PP=1 (one chunk per layer and TP rank,
    fc1 as gate/up halves; args say TP N). --irregular: uneven row, column and layer blocks
    (some crossing the vocabulary padding and the gate/up boundary) spread over the ranks
    (args say TP 1). Besides the model: every local-spec _extra_state entry ([None]), one
    rng_state entry and optimizer.state.exp_avg.* fp32 tensors for two keys; args leave
    no_save_optim / no_save_rng unset, as a Megatron save that kept them does.

Exit status 0 = pass; otherwise one line on stderr says why. Informative lines start with '# '.
"""
import argparse
import datetime
import importlib
import io
import itertools
import json
import os
import random
import sys
import time
import traceback
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mcore_expect import LP, HFModel, expected_tensors  # noqa: E402

ST_TORCH = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
EXTRA_MODULES = ("self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1",
                 "mlp.linear_fc2")
IGNORED_PREFIXES = ("optimizer.", "rng_state")
ITERATION = 7
RANK_TIMEOUT = 120  # seconds for a gloo collective in make-source
METADATA_JSON = {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                 "common_backend": "torch", "common_backend_version": 1}

# DCP warns on every load/save without a process group; that is the intended use here.
warnings.filterwarnings("ignore", message="torch.distributed is unavailable or uninitialized")
# dcp.save's writer calls tensor.storage(), which warns in torch 2.x.
warnings.filterwarnings("ignore", message="TypedStorage is deprecated")


class Fail(Exception):
    pass


def info(msg):
    print(f"# {msg}")


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def expected_torch(m, vpad):
    """The expectation with torch dtypes."""
    return {k: (a, ST_TORCH[dt]) for k, (a, dt) in expected_tensors(m, vpad).items()}


def extra_state_keys(L):
    return [f"{LP}{mod}._extra_state/shard_{l}_{L}" for l in range(L) for mod in EXTRA_MODULES]


def is_extra_state_key(key):
    base, _, shard = key.rpartition("/shard_")
    parts = shard.split("_")
    return (base.endswith("._extra_state") and len(parts) == 2
            and all(p.isdigit() for p in parts))


def raw_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy()


def torch_from_raw(a, dtype):
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


# --- common.pt ---

def resolve_global(name):
    """The object a pickle GLOBAL names, or None when its module cannot be imported."""
    module, _, qual = name.rpartition(".")
    while module:
        try:
            obj = importlib.import_module(module)
            for part in qual.split("."):
                obj = getattr(obj, part)
            return obj
        except (ImportError, AttributeError):
            module, _, head = module.rpartition(".")
            qual = f"{head}.{qual}"
    return None


class Stub:
    """Stands in for a class of a module that is not installed (Megatron's enums)."""

    def __init__(self, *args):
        self.args = args


def load_common(path, ckptfs_view):
    """torch.load(weights_only=True) allowing the globals the file needs (unimportable ones
    stubbed); returns the dict and the names of those globals, stubbed ones marked."""
    needed = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    if ckptfs_view:
        extra = [n for n in needed if n != "argparse.Namespace"]
        check(not extra, f"common.pt needs globals beyond argparse.Namespace: {extra}")
        allow = [(argparse.Namespace, n) for n in needed]
    else:
        allow = [(resolve_global(n) or Stub, n) for n in needed]
    with torch.serialization.safe_globals(allow):
        common = torch.load(path, map_location="cpu", weights_only=True)
    return common, [n + (" (stubbed)" if obj is Stub else "") for obj, n in allow]


def check_common(ckpt, m, ckptfs_view):
    common, needed = load_common(os.path.join(ckpt, "common.pt"), ckptfs_view)
    info(f"common.pt: keys {sorted(common)}; globals beyond torch's defaults: {needed or 'none'}")
    check(isinstance(common, dict) and "args" in common, "common.pt holds no 'args'")
    a = common["args"]
    want = {"num_layers": m.L, "hidden_size": m.H, "num_attention_heads": m.nh,
            "ffn_hidden_size": m.F}
    for k, v in want.items():
        check(getattr(a, k, None) == v, f"common.pt args.{k} = {getattr(a, k, None)!r}, expected {v}")
    for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
        v = getattr(a, k, None)
        check(isinstance(v, int) and v >= 1, f"common.pt args.{k} = {v!r}")
    if getattr(a, "vocab_size", None) is not None:
        check(a.vocab_size == m.vocab, f"common.pt args.vocab_size = {a.vocab_size}, expected {m.vocab}")
    check(common.get("checkpoint_version") == 3.0,
          f"common.pt checkpoint_version = {common.get('checkpoint_version')!r}, expected 3.0")
    check(isinstance(common.get("iteration"), int), f"common.pt iteration = {common.get('iteration')!r}")
    if ckptfs_view:
        for k in ("no_save_optim", "no_save_rng"):
            check(getattr(a, k, None) is True, f"common.pt args.{k} = {getattr(a, k, None)!r}, expected True")
    info(f"common.pt: iteration {common['iteration']}, tp {a.tensor_model_parallel_size} "
         f"pp {a.pipeline_model_parallel_size}")


def check_metadata_json(ckpt):
    try:
        meta = json.load(open(os.path.join(ckpt, "metadata.json")))
    except (OSError, ValueError) as e:
        raise Fail(f"metadata.json: {e}")
    check(meta.get("sharded_backend") == "torch_dist",
          f"metadata.json sharded_backend = {meta.get('sharded_backend')!r}")


# --- load ---

def check_key_set(md, expected, L):
    sdm = md.state_dict_metadata
    tensors = {k for k, v in sdm.items() if isinstance(v, TensorStorageMetadata)}
    byte_entries = {k for k, v in sdm.items() if isinstance(v, BytesStorageMetadata)}
    missing = sorted(set(expected) - tensors)
    check(not missing, f"missing tensor keys: {missing}")
    ignored = {k for k in sdm if k.startswith(IGNORED_PREFIXES)}
    unexpected = sorted(tensors - set(expected) - ignored)
    check(not unexpected, f"unexpected tensor keys: {unexpected}")
    odd_bytes = sorted(k for k in byte_entries - ignored if not is_extra_state_key(k))
    check(not odd_bytes, f"unexpected byte entries: {odd_bytes}")
    missing_extra = [k for k in extra_state_keys(L) if k not in byte_entries]
    check(not missing_extra, f"missing _extra_state entries: {missing_extra[:4]}"
                             f"{' ...' if len(missing_extra) > 4 else ''}")
    info(f".metadata: {len(tensors)} tensor keys ({len(expected)} model, "
         f"{len(tensors & ignored)} ignored), {len(byte_entries)} byte entries")


def check_shapes(md, expected):
    for key, (a, dt) in expected.items():
        tmd = md.state_dict_metadata[key]
        check(tmd.properties.dtype == dt, f"{key}: dtype {tmd.properties.dtype}, expected {dt}")
        check(tuple(tmd.size) == a.shape, f"{key}: shape {tuple(tmd.size)}, expected {a.shape}")


def padded_vocab(md, vocab, divisible_by):
    rows = md.state_dict_metadata["embedding.word_embeddings.weight"].size[0]
    check(rows >= vocab, f"embedding has {rows} rows, fewer than the vocabulary {vocab}")
    check(rows % divisible_by == 0, f"embedding has {rows} rows, not a multiple of {divisible_by}")
    info(f"vocabulary {vocab}, padded to {rows} rows")
    return rows


def load_and_compare(ckpt, md, expected, keys):
    """dcp.load into tensors of the global shapes, pre-filled with 0xFF bytes (not zeros, so a
    region that no stored chunk covers cannot pass for vocabulary padding)."""
    sd = {}
    for k in keys:
        tmd = md.state_dict_metadata[k]
        sd[k] = torch.empty(tuple(tmd.size), dtype=tmd.properties.dtype)
        sd[k].view(torch.uint8).fill_(0xFF)
    dcp.load(sd, storage_reader=FileSystemReader(ckpt))
    for k in keys:
        got, want = raw_bytes(sd[k]), np.frombuffer(expected[k][0].tobytes(), np.uint8)
        if not np.array_equal(got, want):
            bad = np.flatnonzero(got != want)
            raise Fail(f"{k}: {len(bad)} of {len(want)} bytes differ (first at byte {bad[0]})")
    info(f"dcp.load: {len(keys)} tensors bit-identical to the expectation")


def load_extra_states(ckpt, keys):
    sd = {k: io.BytesIO() for k in keys}
    dcp.load(sd, storage_reader=FileSystemReader(ckpt))
    kinds = set()
    for k in keys:
        v = sd[k]
        ok = (v is None or isinstance(v, (torch.Tensor, io.BytesIO))
              or (isinstance(v, list) and all(x is None for x in v)))
        check(ok, f"{k}: loads as {type(v).__name__} {v!r:.60}, not an extra state")
        kinds.add(repr(v) if not isinstance(v, torch.Tensor) else f"tensor{tuple(v.shape)}")
    info(f"dcp.load: {len(keys)} _extra_state entries, values {sorted(kinds)}")


def cmd_load(args):
    m = HFModel(args.hf_dir)
    check_metadata_json(args.ckpt)
    md = FileSystemReader(args.ckpt).read_metadata()
    check("embedding.word_embeddings.weight" in md.state_dict_metadata,
          "no embedding.word_embeddings.weight in .metadata")
    expected = expected_torch(m, padded_vocab(md, m.vocab, args.vocab_divisible_by))
    check_key_set(md, expected, m.L)
    check_shapes(md, expected)
    check_common(args.ckpt, m, args.ckptfs_view)
    if args.keys:
        keys = args.keys.split(",")
        unknown = [k for k in keys if k not in expected and not is_extra_state_key(k)]
        check(not unknown, f"--keys: not model keys: {unknown}")
        tensor_keys = [k for k in keys if k in expected]
        extra = [k for k in keys if is_extra_state_key(k)]
    else:
        tensor_keys, extra = list(expected), extra_state_keys(m.L)
    if tensor_keys:
        load_and_compare(args.ckpt, md, expected, tensor_keys)
    if extra:
        load_extra_states(args.ckpt, extra)
    info("load: pass")


# --- share ---

def rank_boxes(key, size, T, r, vt):
    """The boxes (offsets, sizes) of key's global tensor that TP rank r of T loads."""
    n = len(size)

    def rows(axis, lo, hi):
        axis %= n
        lo, hi = min(lo, size[axis]), min(hi, size[axis])
        if lo >= hi:
            return None
        off = [0] * n
        sz = list(size)
        off[axis], sz[axis] = lo, hi - lo
        return off, sz

    def part(axis, total, base=0):
        return rows(axis, base + r * total // T, base + (r + 1) * total // T)

    if key.endswith("linear_qkv.weight"):
        boxes = [part(-2, size[-2])]
    elif key.endswith("linear_qkv.bias"):
        boxes = [part(-1, size[-1])]
    elif key.endswith(("linear_fc1.weight", "linear_fc1.bias")):
        axis = -2 if key.endswith("weight") else -1
        f = size[axis] // 2
        boxes = [part(axis, f), part(axis, f, f)]
    elif key.endswith(("linear_proj.weight", "linear_fc2.weight")):
        boxes = [part(-1, size[-1])]
    elif key in ("embedding.word_embeddings.weight", "output_layer.weight"):
        boxes = [part(0, vt)]
    elif key.endswith(("layer_norm_weight", "layernorm.weight", "linear_proj.bias",
                       "linear_fc2.bias")):
        boxes = [([0] * n, list(size))]
    else:
        raise Fail(f"no TP rule for {key}")
    return [b for b in boxes if b is not None]


def true_vocab(args):
    if args.hf:
        return json.load(open(os.path.join(args.hf, "config.json")))["vocab_size"]
    common, _ = load_common(os.path.join(args.ckpt, "common.pt"), ckptfs_view=False)
    v = getattr(common.get("args"), "vocab_size", None)
    check(isinstance(v, int), "no args.vocab_size in common.pt; pass --hf")
    return v


def cmd_share(args):
    md = FileSystemReader(args.ckpt).read_metadata()
    T, D = args.tp, args.vocab_divisible_by
    vocab = true_vocab(args)
    vt = -(-vocab // (D * T)) * D * T
    lengths = {(i.fqn, tuple(i.offset or ())): s.length for i, s in md.storage_data.items()}
    keys = [k for k, v in md.state_dict_metadata.items()
            if isinstance(v, TensorStorageMetadata) and not k.startswith(IGNORED_PREFIXES)]
    info(f"share: {len(keys)} model tensor keys, vocab {vocab}, loader vocab rows {vt}")
    mib, worst = 1 << 20, 0.0
    for r in range(T):
        share = chunks = items = 0
        worst_key = (1.0, None)
        for k in keys:
            tmd = md.state_dict_metadata[k]
            el = tmd.properties.dtype.itemsize
            boxes = rank_boxes(k, list(tmd.size), T, r, vt)
            want = [ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s)) for o, s in boxes]
            reads = create_read_items_for_chunk_list(k, tmd, want)
            stored = {ri.storage_index.index for ri in reads}
            k_share = sum(int(np.prod(s)) for _, s in boxes) * el
            covered = sum(int(np.prod(ri.lengths)) for ri in reads) * el
            check(covered == k_share, f"tp {T} rank {r}: stored chunks of {k} cover {covered} of "
                                      f"its {k_share} share bytes")
            k_chunks = sum(int(np.prod(tmd.chunks[i].sizes)) for i in stored) * el
            share += k_share
            chunks += k_chunks
            items += sum(lengths[(k, tuple(tmd.chunks[i].offsets))] for i in stored)
            if k_share and k_chunks / k_share > worst_key[0]:
                worst_key = (k_chunks / k_share, k)
        ratio = chunks / share
        worst = max(worst, ratio)
        print(f"# tp {T} rank {r}: share {share / mib:.3f} MiB, chunks read {chunks / mib:.3f} MiB "
              f"(ratio {ratio:.3f}), items read {items / mib:.3f} MiB"
              + (f"; worst key {worst_key[1]} ({worst_key[0]:.3f})" if worst_key[1] else ""))
    info(f"tp {T}: max ratio {worst:.3f} (bound {args.bound})")
    check(worst <= args.bound, f"tp {T}: read amplification {worst:.3f} > bound {args.bound}")


# --- make-source ---

def cuts(n, points):
    """Block boundaries [0, p..., n] of a dimension of size n, keeping points inside (0, n)."""
    inner = sorted({p for p in points if 0 < p < n})
    return list(zip([0] + inner, inner + [n]))


def grid(size, per_dim):
    """Boxes (offsets, sizes) of the product of the per-dimension blocks."""
    blocks = [per_dim[i] if i in per_dim else [(0, n)] for i, n in enumerate(size)]
    return [([lo for lo, _ in b], [hi - lo for lo, hi in b]) for b in itertools.product(*blocks)]


def regular_boxes(key, size, N):
    """Megatron's chunks at TP=N, PP=1, owned by the TP rank; replicated chunks round robin."""
    def part(total, r, base=0):
        return (base + total * r // N, base + total * (r + 1) // N)

    if key in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return [(o, s, r) for r in range(N) for o, s in grid(size, {0: [part(size[0], r)]})]
    if not key.startswith(LP):
        return [([0] * len(size), list(size), 0)]
    out = []
    for l in range(size[0]):
        if key.endswith(("linear_qkv.weight", "linear_qkv.bias")):
            per_rank = [{1: [part(size[1], r)]} for r in range(N)]
        elif key.endswith("linear_fc1.weight"):
            f = size[1] // 2
            per_rank = [{1: [part(f, r), part(f, r, f)]} for r in range(N)]
        elif key.endswith(("linear_proj.weight", "linear_fc2.weight")):
            per_rank = [{2: [part(size[2], r)]} for r in range(N)]
        else:
            out += [(o, s, l % N) for o, s in grid(size, {0: [(l, l + 1)]})]
            continue
        out += [(o, s, r) for r, p in enumerate(per_rank) for o, s in grid(size, {0: [(l, l + 1)], **p})]
    return out


def irregular_boxes(key, size, N):
    """Uneven blocks; box i is owned by rank i % N."""
    L = size[0]
    layer_blocks = cuts(L, [1, 3])
    if key == "embedding.word_embeddings.weight":
        per_dim = {0: cuts(size[0], [3, 100])}
    elif key == "output_layer.weight":
        per_dim = {1: cuts(size[1], [size[1] // 4])}
    elif key.endswith("linear_qkv.weight"):
        per_dim = {0: layer_blocks, 1: cuts(size[1], [3, 10])}
    elif key.endswith("linear_qkv.bias"):
        per_dim = {1: cuts(size[1], [10])}
    elif key.endswith("linear_proj.weight"):
        per_dim = {2: cuts(size[2], [5])}
    elif key.endswith("linear_fc1.weight"):
        per_dim = {0: cuts(L, [2]), 1: cuts(size[1], [size[1] // 2 + 7])}
    elif key.endswith("linear_fc2.weight"):
        per_dim = {0: cuts(L, range(L))}
    elif key.endswith("layer_norm_weight"):
        per_dim = {0: cuts(L, [L - 1]), 1: cuts(size[1], [7])}
    else:
        per_dim = {}
    return [(o, s, i % N) for i, (o, s) in enumerate(grid(size, per_dim))]


def sharded(full, boxes, rank):
    """A ShardedTensor of full cut into boxes (offsets, sizes, owner rank); rank's shards local."""
    shards_md = [ShardMetadata(shard_offsets=o, shard_sizes=s, placement=f"rank:{owner}/cpu")
                 for o, s, owner in boxes]
    local = []
    for smd, (o, s, owner) in zip(shards_md, boxes):
        if owner == rank:
            idx = tuple(slice(a, a + b) for a, b in zip(o, s))
            local.append(Shard(tensor=full[idx].clone(), metadata=smd))
    gmd = ShardedTensorMetadata(shards_metadata=shards_md, size=full.shape,
                                tensor_properties=TensorProperties(dtype=full.dtype))
    return ShardedTensor._init_from_local_shards_and_global_metadata(local, gmd)


def source_args(m, vpad, tp):
    a = m.cfg
    return argparse.Namespace(
        num_layers=m.L, hidden_size=m.H, ffn_hidden_size=m.F, num_attention_heads=m.nh,
        group_query_attention=m.ng != m.nh, num_query_groups=m.ng, kv_channels=m.d,
        padded_vocab_size=vpad, vocab_size=m.vocab, tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=1, untie_embeddings_and_output_weights=not m.tied,
        add_qkv_bias=m.has("model.layers.0.self_attn.q_proj.bias"), add_bias_linear=False,
        qk_layernorm=m.has("model.layers.0.self_attn.q_norm.weight"), swiglu=True,
        normalization="RMSNorm", layernorm_epsilon=a.get("rms_norm_eps", 1e-6),
        rotary_base=a.get("rope_theta", 10000.0), position_embedding_type="rope",
        max_position_embeddings=a.get("max_position_embeddings", 4096),
        make_vocab_size_divisible_by=128, bf16=True, params_dtype=torch.bfloat16,
        ckpt_format="torch_dist", use_dist_ckpt=True, iteration=0,
        no_save_optim=None, no_save_rng=None)


def source_state_dict(m, vpad, rank, N, irregular):
    expected = expected_torch(m, vpad)
    layout = irregular_boxes if irregular else regular_boxes
    sd, boxes_of = {}, {}
    for key, (a, dt) in expected.items():
        full = torch_from_raw(a, dt)
        boxes_of[key] = layout(key, list(full.shape), N)
        sd[key] = sharded(full, boxes_of[key], rank)
    for key in ("embedding.word_embeddings.weight", LP + "self_attention.linear_qkv.weight"):
        g = torch.Generator().manual_seed(len(key))
        full = torch.randn(expected[key][0].shape, generator=g, dtype=torch.float32)
        sd["optimizer.state.exp_avg." + key] = sharded(full, boxes_of[key], rank)
    for i, key in enumerate(extra_state_keys(m.L)):
        if i % N == rank:
            sd[key] = [None]
    if rank == 0:
        sd["rng_state/shard_0.0_1.1"] = [{"random_rng_state": random.getstate(),
                                          "torch_rng_state": torch.get_rng_state()}]
    return sd


def make_source_rank(rank, args):
    N = args.ranks
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.FileStore(os.path.join(args.out_dir, ".store"), N)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=N,
                            timeout=datetime.timedelta(seconds=RANK_TIMEOUT))
    try:
        m = HFModel(args.hf_dir)
        vpad = -(-m.vocab // 128) * 128
        it_dir = os.path.join(args.out_dir, f"iter_{ITERATION:07d}")
        sd = source_state_dict(m, vpad, rank, N, args.irregular)
        # Like Megatron: no flattening, so every non-tensor value is one byte entry.
        dcp.save(sd, storage_writer=FileSystemWriter(it_dir, thread_count=1),
                 planner=DefaultSavePlanner(flatten_state_dict=False))
        if rank == 0:
            tp = 1 if args.irregular else N
            common = {"args": source_args(m, vpad, tp), "checkpoint_version": 3.0,
                      "iteration": ITERATION,
                      "content_metadata": {"singleton_local_shards": False,
                                           "chained_optim_avoid_prefix": True}}
            torch.save(common, os.path.join(it_dir, "common.pt"))
            with open(os.path.join(it_dir, "metadata.json"), "w") as f:
                json.dump(METADATA_JSON, f)
            with open(os.path.join(args.out_dir, "latest_checkpointed_iteration.txt"), "w") as f:
                f.write(str(ITERATION))
        dist.barrier()
    except BaseException:
        traceback.print_exc()
        raise
    # No destroy_process_group(): with gloo it can wait forever on peers that already left;
    # the process exits right after.


def cmd_make_source(args):
    check(args.ranks >= 1, "--ranks must be >= 1")
    os.makedirs(args.out_dir, exist_ok=True)
    store = os.path.join(args.out_dir, ".store")
    if os.path.exists(store):
        os.unlink(store)
    ranks = torch.multiprocessing.spawn(make_source_rank, args=(args,), nprocs=args.ranks, join=False)
    deadline = time.monotonic() + 2 * RANK_TIMEOUT
    while not ranks.join(timeout=1):  # a rank that hangs must fail the test, not stall it
        if time.monotonic() > deadline:
            for p in ranks.processes:
                p.kill()
            raise Fail(f"make-source: the {args.ranks} ranks did not finish within {2 * RANK_TIMEOUT} s")
    if os.path.exists(store):
        os.unlink(store)
    it_dir = os.path.join(args.out_dir, f"iter_{ITERATION:07d}")
    md = FileSystemReader(it_dir).read_metadata()
    files = sorted(f for f in os.listdir(it_dir) if f.endswith(".distcp"))
    nchunks = sum(len(v.chunks) for v in md.state_dict_metadata.values()
                  if isinstance(v, TensorStorageMetadata))
    info(f"make-source: {it_dir}: {len(md.state_dict_metadata)} keys, {nchunks} chunks, files {files}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("load")
    lp.add_argument("ckpt")
    lp.add_argument("hf_dir")
    lp.add_argument("--keys")
    lp.add_argument("--vocab-divisible-by", type=int, default=128)
    lp.add_argument("--ckptfs-view", action="store_true")
    sp = sub.add_parser("share")
    sp.add_argument("ckpt")
    sp.add_argument("--tp", type=int, required=True)
    sp.add_argument("--bound", type=float, default=1.25)
    sp.add_argument("--vocab-divisible-by", type=int, default=128)
    sp.add_argument("--hf")
    mp = sub.add_parser("make-source")
    mp.add_argument("hf_dir")
    mp.add_argument("out_dir")
    mp.add_argument("--irregular", action="store_true")
    mp.add_argument("--ranks", type=int, default=1)
    args = p.parse_args()
    try:
        {"load": cmd_load, "share": cmd_share, "make-source": cmd_make_source}[args.cmd](args)
    except Fail as e:
        print(f"dcp_check.py {args.cmd}: {e}", file=sys.stderr)
        sys.exit(1)
    except Exception as e:  # torch's own errors (missing key, size mismatch, bad pickle...)
        where = traceback.extract_tb(e.__traceback__)[-1]
        msg = " ".join(str(e).split())
        print(f"dcp_check.py {args.cmd}: {type(e).__name__}: {msg} "
              f"({os.path.basename(where.filename)}:{where.lineno})", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
