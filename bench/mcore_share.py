#!/usr/bin/python3
"""Loads one tensor-parallel rank's share of a torch_dist (Megatron-core) checkpoint with torch's
own torch.distributed.checkpoint machinery, without a process group; and what that costs.
Run with torch 2.x (the Debian 13 root).

A rank's share (Megatron's TP split of the stacked GPTModel keys; T = TP degree, r = rank):
  linear_qkv.weight/.bias      rows [r R/T, (r+1) R/T) of dim 1 (R = (heads + 2 groups) head_dim)
  linear_fc1.weight            rows [r F/T, (r+1) F/T) and [F + r F/T, F + (r+1) F/T) (F = ffn)
  linear_proj/linear_fc2       columns [r C/T, (r+1) C/T) of the last dim
  embedding / output_layer     rows [r Vt/T, (r+1) Vt/T), Vt = vocab padded to a multiple of 128 T
  norms (layer_norm_weight, final_layernorm, q/k_layernorm)   whole
  _extra_state/shard_l_L       every one (byte entries, loaded with torch.load)
The load plan is torch's: create_read_items_for_chunk_list(fqn, metadata, [box]) for every box,
a DefaultLoadPlanner subclass that resolves each ReadItem to a narrow view of a preallocated share
tensor, run by dcp.load(..., storage_reader=FileSystemReader(dir)). So FileSystemReader reads
exactly the stored items a real loader reads (each overlapping item whole: torch.load, then
narrow).

  mcore_share.py load DIR --tp T --rank R [--barrier PREFIX]
      loads the share; prints one line `RESULT load_s=.. rchar=.. share_bytes=.. items=.. end=..`
      (load_s: dcp.load only, after imports and common.pt; rchar: bytes this process read with
      read(2) during dcp.load, from /proc/self/io; end: wall-clock time it ended). With
      --barrier, it creates PREFIX.ready.R once ready to load and waits for PREFIX.go, so that
      several ranks start together (bench/load_bench.sh).
  mcore_share.py amp DIR [--tps 1,2,4,8]
      per TP degree, from .metadata alone: for each rank, the storage lengths of the items its
      boxes overlap (one per ReadItem, as FileSystemReader reads them) / the share's tensor bytes;
      prints `AMP tp=T max=.. rank=.. read=.. share=.. megatron_ok=0|1` (the rank with the
      largest ratio; megatron_ok=0: TP above the query groups, which needs Megatron-core >= 0.16).
  mcore_share.py verify DIR [--converted DIR2] [--tps 2,4]
      sanity check: a full dcp.load of DIR; every rank's share of each TP degree of --tps equals
      the corresponding slices; the byte entries load as [None]. With --converted: DIR2 has the
      same keys, shapes and dtypes in .metadata and every tensor is bit-identical to DIR's
      (compared one at a time), and with TP 2 in --tps its TP-2 rank-0 share is too. --tps ''
      checks no shares and loads neither checkpoint whole. Exit 0 = pass.
"""
import argparse
import os
import sys
import time
import warnings
from argparse import Namespace

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   MetadataIndex)
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.planner_helpers import (_create_read_item_for_byteio,
                                                          create_read_items_for_chunk_list)
from torch.distributed._shard._utils import narrow_tensor_by_index

warnings.filterwarnings("ignore", message="torch.distributed is unavailable or uninitialized")


def model_args(d):
    with torch.serialization.safe_globals([Namespace]):
        return torch.load(os.path.join(d, "common.pt"), map_location="cpu", weights_only=True)["args"]


def padded(vocab, mult):
    return (vocab + mult - 1) // mult * mult


def boxes_of(fqn, size, T, r, vocab):
    """[(offsets, sizes)] of rank r's share of the stored tensor fqn (global size `size`)."""
    n = len(size)
    full = [0] * n, list(size)
    if fqn.endswith("layer_norm_weight") or "layernorm" in fqn:
        return [full]

    def cut(dim, lo, cnt):
        off, sz = [0] * n, list(size)
        off[dim], sz[dim] = lo, cnt
        return off, sz

    if fqn in ("embedding.word_embeddings.weight", "output_layer.weight"):
        part = padded(vocab, 128 * T) // T
        return [cut(0, r * part, part)]
    if fqn.endswith("linear_qkv.weight") or fqn.endswith("linear_qkv.bias"):
        part = size[1] // T
        return [cut(1, r * part, part)]
    if fqn.endswith("linear_fc1.weight") or fqn.endswith("linear_fc1.bias"):
        F = size[1] // 2
        part = F // T
        return [cut(1, r * part, part), cut(1, F + r * part, part)]
    if fqn.endswith("linear_proj.weight") or fqn.endswith("linear_fc2.weight"):
        part = size[-1] // T
        return [cut(n - 1, r * part, part)]
    raise SystemExit(f"mcore_share: no TP rule for {fqn}")


def share_plan(md, T, r, vocab):
    """(tensor boxes {fqn: [(off, sz)]}, byte keys) of rank r."""
    boxes, byte_keys = {}, []
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, BytesStorageMetadata):
            if "_extra_state" in fqn:
                byte_keys.append(fqn)
            continue
        if fqn.startswith(("optimizer.", "rng_state")):
            continue
        boxes[fqn] = boxes_of(fqn, list(m.size), T, r, vocab)
    return boxes, byte_keys


def read_items(md, boxes):
    items = []
    for fqn, bx in boxes.items():
        chunks = [ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s)) for o, s in bx]
        items += create_read_items_for_chunk_list(fqn, md.state_dict_metadata[fqn], chunks)
    return items


class SharePlanner(DefaultLoadPlanner):
    """Plans reads for the boxes only; each ReadItem lands in a narrow view of its box's tensor."""

    def __init__(self, boxes, byte_keys):
        super().__init__()
        self.boxes, self.byte_keys = boxes, byte_keys
        self.shares, self.objects = {}, {}

    def create_local_plan(self):
        for fqn, bx in self.boxes.items():
            dtype = self.metadata.state_dict_metadata[fqn].properties.dtype
            self.shares[fqn] = [torch.empty(s, dtype=dtype) for _, s in bx]
        items = read_items(self.metadata, self.boxes)
        for fqn in self.byte_keys:
            items.append(_create_read_item_for_byteio(MetadataIndex(fqn), 0, MetadataIndex(fqn), 0, 0))
        return LoadPlan(items)

    def resolve_tensor(self, read_item):
        t = self.shares[read_item.dest_index.fqn][read_item.dest_index.index]
        return narrow_tensor_by_index(t, read_item.dest_offsets, read_item.lengths)

    def commit_tensor(self, read_item, tensor):
        pass

    def load_bytes(self, read_item, value):
        self.objects[read_item.dest_index.fqn] = torch.load(value, weights_only=False)


def rchar():
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def load_share(d, T, r, vocab):
    reader = FileSystemReader(d)
    md = reader.read_metadata()
    boxes, byte_keys = share_plan(md, T, r, vocab)
    planner = SharePlanner(boxes, byte_keys)
    dcp.load({}, storage_reader=FileSystemReader(d), planner=planner)
    return planner, md


def elem_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def share_bytes(md, boxes):
    tot = 0
    for fqn, bx in boxes.items():
        es = elem_size(md.state_dict_metadata[fqn].properties.dtype)
        for _, s in bx:
            n = 1
            for x in s:
                n *= x
            tot += n * es
    return tot


def barrier(prefix, rank):
    """Ready (imports done), then wait for the go of whoever starts the ranks together."""
    open(f"{prefix}.ready.{rank}", "w").close()
    while not os.path.exists(f"{prefix}.go"):
        time.sleep(0.002)


def cmd_load(a):
    args = model_args(a.dir)
    if a.barrier:
        barrier(a.barrier, a.rank)
    c0, t0 = rchar(), time.time()
    planner, md = load_share(a.dir, a.tp, a.rank, args.vocab_size)
    t1, c1 = time.time(), rchar()
    assert len(planner.objects) == len(planner.byte_keys)
    print(f"RESULT load_s={t1 - t0:.3f} rchar={c1 - c0} share_bytes={share_bytes(md, planner.boxes)} "
          f"items={len(read_items(md, planner.boxes))} end={t1:.6f}")


def megatron_ok(args, T):
    return (args.num_attention_heads % T == 0 and args.num_query_groups % T == 0
            and args.ffn_hidden_size % T == 0)


def view_ok(args, T):
    g = args.num_query_groups
    return (args.num_attention_heads % T == 0 and args.ffn_hidden_size % T == 0
            and (g % T == 0 or T % g == 0))


def cmd_amp(a):
    args = model_args(a.dir)
    md = FileSystemReader(a.dir).read_metadata()
    for T in (int(x) for x in a.tps.split(",")):
        if not view_ok(args, T):
            print(f"AMP tp={T} skip")
            continue
        worst = None
        for r in range(T):
            boxes, _ = share_plan(md, T, r, args.vocab_size)
            read = sum(md.storage_data[ri.storage_index].length for ri in read_items(md, boxes))
            share = share_bytes(md, boxes)
            if worst is None or read / share > worst[0]:
                worst = (read / share, r, read, share)
        print(f"AMP tp={T} max={worst[0]:.4f} rank={worst[1]} read={worst[2]} share={worst[3]} "
              f"megatron_ok={int(megatron_ok(args, T))}")


def full_load(d):
    md = FileSystemReader(d).read_metadata()
    sd = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
          for k, m in md.state_dict_metadata.items() if not isinstance(m, BytesStorageMetadata)}
    dcp.load(sd, storage_reader=FileSystemReader(d))
    return md, sd


def same(a, b):
    """Bit-identical (same shape and dtype, same bytes)."""
    return (a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def check_share(d, full, T, r, vocab):
    planner, _ = load_share(d, T, r, vocab)
    for fqn, bx in planner.boxes.items():
        for (off, sz), got in zip(bx, planner.shares[fqn]):
            want = full[fqn]
            for dim, (o, s) in enumerate(zip(off, sz)):
                want = want.narrow(dim, o, s)
            if not same(got, want):
                raise SystemExit(f"verify: {d}: TP {T} rank {r}: {fqn} box {off}+{sz} differs")
    for fqn in planner.byte_keys:
        if planner.objects[fqn] != [None]:
            raise SystemExit(f"verify: {d}: {fqn} = {planner.objects[fqn]!r}, expected [None]")
    print(f"# verify: {d}: TP {T} rank {r}: {sum(len(b) for b in planner.boxes.values())} boxes "
          f"and {len(planner.byte_keys)} byte entries equal the full load's slices")


def load_keys(d, md, keys):
    """Only KEYS of the torch_dist checkpoint D (metadata MD), each its full tensor."""
    sd = {k: torch.empty(tuple(md.state_dict_metadata[k].size),
                         dtype=md.state_dict_metadata[k].properties.dtype) for k in keys}
    dcp.load(sd, storage_reader=FileSystemReader(d))
    return sd


def cmd_verify(a):
    args = model_args(a.dir)
    tps = [int(t) for t in a.tps.split(",") if t]
    md = FileSystemReader(a.dir).read_metadata()
    full = None
    if tps:
        md, full = full_load(a.dir)
        print(f"# verify: full dcp.load of {a.dir}: {len(full)} tensors, "
              f"{sum(t.numel() * t.element_size() for t in full.values())} bytes")
    for T in tps:
        if megatron_ok(args, T):
            for r in range(T):
                check_share(a.dir, full, T, r, args.vocab_size)
    if a.converted:
        md2 = FileSystemReader(a.converted).read_metadata()
        shape = lambda m: {k: (tuple(v.size), v.properties.dtype) if hasattr(v, "size") else "bytes"
                           for k, v in m.state_dict_metadata.items()}
        if shape(md) != shape(md2):
            raise SystemExit(f"verify: {a.converted}: keys/shapes/dtypes differ from {a.dir}")
        # One tensor at a time from each side: a model that fills half the RAM is compared too
        for k in sorted(k for k, v in md.state_dict_metadata.items() if hasattr(v, "size")):
            want = full[k] if full is not None else load_keys(a.dir, md, [k])[k]
            if not same(want, load_keys(a.converted, md2, [k])[k]):
                raise SystemExit(f"verify: {a.converted}: {k} differs from {a.dir}")
        print(f"# verify: {a.converted}: same {len(md2.state_dict_metadata)} keys, shapes and dtypes; "
              f"every tensor bit-identical")
        if 2 in tps:
            _, full2 = full_load(a.converted)
            check_share(a.converted, full2, 2, 0, model_args(a.converted).vocab_size)
    print("VERIFY ok")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("load")
    p.add_argument("dir")
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--barrier", metavar="PREFIX")
    p = sub.add_parser("amp")
    p.add_argument("dir")
    p.add_argument("--tps", default="1,2,4,8")
    p = sub.add_parser("verify")
    p.add_argument("dir")
    p.add_argument("--tps", default="2,4", help="TP degrees whose shares are checked ('': none)")
    p.add_argument("--converted")
    a = ap.parse_args()
    {"load": cmd_load, "amp": cmd_amp, "verify": cmd_verify}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
