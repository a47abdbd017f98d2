#!/usr/bin/env bash
# The ckptfs demo on a fresh Debian 12 machine (as root): install what is needed, build, make a
# small Hugging Face checkpoint, mount it, show the views, load files from the mount with torch,
# unmount. Work files go to ${DEMO_DIR:-/tmp/ckptfs-demo}.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
work=${DEMO_DIR:-/tmp/ckptfs-demo}
ckptfs="$top/build/ckptfs"

"$top/scripts/install-deps.sh"
"$top/scripts/build.sh" build

rm -rf "$work"
mkdir -p "$work/mnt"
/usr/bin/python3 "$top/scripts/make_demo_checkpoint.py" "$work/llama"

echo; echo "== ckptfs inspect $work/llama"
"$ckptfs" inspect "$work/llama"

"$ckptfs" mount "$work/llama" "$work/mnt"
trap 'fusermount3 -u "$work/mnt" 2>/dev/null || true' EXIT

echo; echo "== ls $work/mnt  (every view is synthesized on read; nothing is written)"
ls "$work/mnt"
echo; echo "== ls -l $work/mnt/hf"
ls -l "$work/mnt/hf"
echo; echo "== find $work/mnt/tp2pp2 -type f"
find "$work/mnt/tp2pp2" -type f -printf '%10s  %p\n'

echo; echo "== torch.load of a Megatron rank file and a tensor of hf/, straight from the mount"
/usr/bin/python3 - "$work/mnt" <<'PY'
import json, struct, sys
import numpy as np
import torch
mnt = sys.argv[1]
sd = torch.load(f"{mnt}/tp2pp2/release/mp_rank_01_000/model_optim_rng.pt", map_location="cpu")
a = sd["args"]
print(f"tp2pp2 rank (tp 1, pp 0): checkpoint_version {sd['checkpoint_version']}, "
      f"tp={a.tensor_model_parallel_size} pp={a.pipeline_model_parallel_size}, "
      f"{len(sd['model'])} model entries")
qkv = sd["model"]["decoder.layers.0.self_attention.linear_qkv.weight"]
print("  decoder.layers.0.self_attention.linear_qkv.weight:", tuple(qkv.shape), qkv.dtype)
# The same rows straight from hf/: rank 1 of tp2 holds query groups 2-3 of layer 0.
index = json.load(open(f"{mnt}/hf/model.safetensors.index.json"))
def hf_tensor(name):
    path = f"{mnt}/hf/{index['weight_map'][name]}"
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        meta = json.loads(f.read(n))[name]
        f.seek(8 + n + meta["data_offsets"][0])
        raw = f.read(meta["data_offsets"][1] - meta["data_offsets"][0])
    return torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).reshape(meta["shape"])
q, k, v = (hf_tensor(f"model.layers.0.self_attn.{p}_proj.weight") for p in "qkv")
d, hpg = 32, 2  # head dim, heads per query group
groups = [torch.cat([q[g*hpg*d:(g+1)*hpg*d], k[g*d:(g+1)*d], v[g*d:(g+1)*d]]) for g in (2, 3)]
print("  equals groups 2-3 of [q;k;v] from hf/:", torch.equal(qkv, torch.cat(groups)))
PY

echo; echo "== ls -lA $work/mnt/mcore/release  (torch_dist: Megatron --ckpt-format torch_dist, verl)"
ls -lA "$work/mnt/mcore/release"
echo "(tests/lib/dcp_host.py loads it chunk by chunk with this torch; torch 2.x: torch.distributed.checkpoint.load)"
/usr/bin/python3 "$top/tests/lib/dcp_host.py" "$work/mnt/mcore/release" "$work/llama"
echo; echo "== unmount: fusermount3 -u $work/mnt"
