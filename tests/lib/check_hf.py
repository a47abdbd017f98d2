#!/usr/bin/python3
"""Independent checks of an hf/ view (no ckptfs code involved).

  check_hf.py compare SRC VIEW [--shard-size N]   tensors equal; with N, the re-shard rules
  check_hf.py random-reads FILE EXPECTED [N]      N random (offset, length) reads equal
  check_hf.py safe-open SRC VIEW                  (torch 2.6 root) safetensors.safe_open and
                                                  load_file of every view file equal the source
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import read_checkpoint, read_safetensors  # noqa: E402


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


def source_order(src):
    """Tensor names in source order: shards by file name, within a shard by data offset."""
    index = os.path.join(src, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    names = []
    for fname in files:
        _, header = read_safetensors(os.path.join(src, fname))
        entries = [(m["data_offsets"], n) for n, m in header.items() if n != "__metadata__"]
        names += [n for _, n in sorted(entries)]
    return names


def expected_shards(src, tensors, limit):
    shards, cur, used = [], [], 0
    for name in source_order(src):
        size = len(tensors[name][2])
        if cur and used + size > limit:
            shards.append(cur)
            cur, used = [], 0
        cur.append(name)
        used += size
    if cur:
        shards.append(cur)
    return shards


def compare(src, view, shard_size):
    want = read_checkpoint(src)
    got = read_checkpoint(view)
    if set(want) != set(got):
        fail(f"tensor sets differ: missing {sorted(set(want) - set(got))[:5]} extra {sorted(set(got) - set(want))[:5]}")
    for name, t in want.items():
        if got[name] != t:
            fail(f"tensor {name} differs (dtype/shape/bytes)")
    if shard_size is None:
        return
    shards = expected_shards(src, want, shard_size)
    n = len(shards)
    names = ["model.safetensors"] if n == 1 else [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
    present = sorted(f for f in os.listdir(view) if f.endswith(".safetensors"))
    if present != sorted(names):
        fail(f"shard files {present} != expected {names}")
    for fname, members in zip(names, shards):
        tensors, header = read_safetensors(os.path.join(view, fname))
        if header.get("__metadata__") != {"format": "pt"}:
            fail(f"{fname}: __metadata__ {header.get('__metadata__')}")
        order = [k for k in header if k != "__metadata__"]
        if order != members:
            fail(f"{fname}: holds {order[:3]}... expected {members[:3]}...")
        offs = [header[k]["data_offsets"] for k in order]
        if offs and (offs[0][0] != 0 or any(a[1] != b[0] for a, b in zip(offs, offs[1:]))):
            fail(f"{fname}: data offsets not contiguous")
        if list(header)[0] != "__metadata__":
            fail(f"{fname}: __metadata__ is not first")
    index = os.path.join(view, "model.safetensors.index.json")
    if n == 1:
        if os.path.exists(index):
            fail("single shard but an index exists")
        return
    text = open(index).read()
    wm = {name: fname for fname, members in zip(names, shards) for name in members}
    expect = json.dumps({"metadata": {"total_size": sum(len(t[2]) for t in want.values())},
                         "weight_map": wm}, indent=2, sort_keys=True) + "\n"
    if text != expect:
        fail("index differs from json.dumps(indent=2, sort_keys=True) of the expected index")


def random_reads(path, expected, count):
    data = open(expected, "rb").read()
    rng = random.Random(os.getpid())
    with open(path, "rb", buffering=0) as f:
        for _ in range(count):
            off = rng.randrange(0, len(data) + 4096)
            n = rng.choice([1, 7, 4096, 65536, 1 << 20, rng.randrange(1, 300000)])
            f.seek(off)
            got = f.read(n)
            if got != data[off:off + n]:
                fail(f"{path}: read at {off} len {n} differs")


def safe_open(src, view):
    import torch
    from safetensors import safe_open as st_open
    from safetensors.torch import load_file
    want = read_checkpoint(src)
    seen = set()
    for fname in sorted(os.listdir(view)):
        if not fname.endswith(".safetensors"):
            continue
        path = os.path.join(view, fname)
        whole = load_file(path)
        def raw_of(t):
            return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        with st_open(path, framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                dt, shape, raw = want[name]
                if tuple(t.shape) != shape or raw_of(t) != raw:
                    fail(f"{fname}: {name} differs through safe_open")
                if tuple(whole[name].shape) != shape or raw_of(whole[name]) != raw:
                    fail(f"{fname}: {name} differs through load_file")
                seen.add(name)
    if seen != set(want):
        fail(f"safe_open saw {len(seen)} of {len(want)} tensors")
    print(f"torch {torch.__version__}: {len(seen)} tensors equal through safe_open and load_file")


def main():
    a = sys.argv[1:]
    if a[:1] == ["compare"]:
        size = int(a[a.index("--shard-size") + 1]) if "--shard-size" in a else None
        compare(a[1], a[2], size)
    elif a[:1] == ["random-reads"]:
        random_reads(a[1], a[2], int(a[3]) if len(a) > 3 else 500)
    elif a[:1] == ["safe-open"]:
        safe_open(a[1], a[2])
    else:
        fail(__doc__)


if __name__ == "__main__":
    main()
