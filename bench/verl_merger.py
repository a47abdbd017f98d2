#!/usr/bin/python3
"""The baseline ckptfs's verl FSDP source is measured against: an offline merge of a verl FSDP
checkpoint into a bf16 Hugging Face model, done the way verl's model merger does it
(`python -m verl.model_merger merge --backend fsdp --local_dir ROLE_DIR --target_dir OUT`:
verl/model_merger/fsdp_model_merger.py and base_model_merger.py), without transformers:

  1. the world size W from ROLE_DIR/fsdp_config.json;
  2. rank 0's shard loaded with torch.load(map_location="cpu", weights_only=False), and the device
     mesh (mesh tensor, mesh_dim_names) taken from its alphabetically first key's DTensor
     (("fsdp",) or ("ddp", "fsdp") only); the shards to read are ranks 0 .. mesh.shape[-1]-1;
     verl keeps this first copy of rank 0 until the merge ends, so this does too;
  3. every shard loaded again the same way, by a ThreadPoolExecutor of min(32, CPUs) threads;
  4. per key, each rank's local tensor (DTensor._local_tensor, or the plain tensor) converted
     with .bfloat16(), then the shards concatenated with torch.cat along the Shard placement's
     dim (.contiguous()); Replicate: rank 0's; a ddp mesh dim's placement dropped; plain tensors
     torch.cat on dim 0 (as verl);
  5. lm_head.weight dropped when config.json ties the word embeddings (verl's
     drop_tied_target_keys);
  6. saved as transformers' save_pretrained(state_dict=...) saves: safetensors files written by
     the safetensors library's save_file with metadata {"format": "pt"}, split greedily in state
     dict order into shards of at most 5 GB (decimal, save_pretrained's max_shard_size="5GB"):
     one model.safetensors, or model-0000K-of-0000N.safetensors + model.safetensors.index.json;
     the state dict is in rank 0's key order (verl iterates a set of the keys: some order);
  7. config.json and the other files of ROLE_DIR/huggingface/ (generation config, tokenizer)
     copied (verl saves config, generation config and tokenizer through transformers).

Prints the time and the peak RSS (getrusage ru_maxrss) at the end. Run it with the python3 of
the tests' Debian 13 root (torch 2.6 + safetensors), as bench/verl_bench.sh does.

Usage: verl_merger.py ROLE_DIR TARGET_DIR [--max-shard-size BYTES]
"""

import argparse
import json
import os
import resource
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor


def world_size_of(local_dir):
    path = Path(local_dir) / "fsdp_config.json"
    if not path.exists():
        sys.exit(f"verl_merger: {path} does not exist")
    with open(path) as f:
        ws = json.load(f).get("world_size")
    if ws is None:
        sys.exit(f"verl_merger: no world_size in {path}")
    return ws


def load_shard(local_dir, world_size, rank):
    return torch.load(Path(local_dir) / f"model_world_size_{world_size}_rank_{rank}.pt",
                      map_location="cpu", weights_only=False)


def mesh_info(state_dict, world_size):
    weight = state_dict[sorted(state_dict.keys())[0]]
    if isinstance(weight, DTensor):
        return tuple(weight.device_mesh.mesh.shape), weight.device_mesh.mesh_dim_names
    return (world_size,), ("fsdp",)


def merge_by_placement(tensors, placement):
    if placement.is_replicate():
        return tensors[0]
    if placement.is_partial():
        raise NotImplementedError("Partial placement is not supported")
    if placement.is_shard():
        return torch.cat(tensors, dim=placement.dim).contiguous()
    raise NotImplementedError(f"Unsupported placement: {placement}")


def load_and_merge(local_dir, world_size, total_shards, mesh_dim_names):
    shards = [None] * total_shards

    def one(rank):
        shards[rank] = load_shard(local_dir, world_size, rank)

    with ThreadPoolExecutor(max_workers=min(32, os.cpu_count())) as ex:
        for fut in [ex.submit(one, r) for r in range(total_shards)]:
            fut.result()

    keys = list(shards[0].keys())
    state_dict, placements_of = {}, {}
    for key in keys:
        state_dict[key] = []
        for shard in shards:
            t = shard.pop(key)
            if isinstance(t, DTensor):
                state_dict[key].append(t._local_tensor.bfloat16())
                placements = tuple(t.placements)
                if mesh_dim_names[0] in ("dp", "ddp"):
                    placements = placements[1:]  # the replicated dp dim
                if key in placements_of:
                    assert placements_of[key] == placements, key
                else:
                    placements_of[key] = placements
            else:
                state_dict[key].append(t.bfloat16())
    del shards

    for key in sorted(state_dict):
        if key in placements_of:
            placements = placements_of[key]
            assert len(placements) == 1, f"{key}: FSDP + TP is not supported"
            state_dict[key] = merge_by_placement(state_dict[key], placements[0])
        else:
            state_dict[key] = torch.cat(state_dict[key], dim=0)
    return state_dict


def split_shards(state_dict, max_shard_size):
    """save_pretrained's greedy split: a new file when the next tensor would overflow this one."""
    groups, cur, size = [], {}, 0
    for k, t in state_dict.items():
        n = t.numel() * t.element_size()
        if cur and size + n > max_shard_size:
            groups.append(cur)
            cur, size = {}, 0
        cur[k] = t
        size += n
    if cur:
        groups.append(cur)
    return groups


def save_hf(state_dict, target_dir, max_shard_size):
    os.makedirs(target_dir, exist_ok=True)
    groups = split_shards(state_dict, max_shard_size)
    if len(groups) == 1:
        save_file(groups[0], os.path.join(target_dir, "model.safetensors"), metadata={"format": "pt"})
        return 1
    weight_map, total = {}, 0
    for i, g in enumerate(groups, 1):
        name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file(g, os.path.join(target_dir, name), metadata={"format": "pt"})
        for k, t in g.items():
            weight_map[k] = name
            total += t.numel() * t.element_size()
    with open(os.path.join(target_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                  f, indent=2, sort_keys=True)
        f.write("\n")
    return len(groups)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("local_dir", help="the role directory (global_step_N/actor)")
    ap.add_argument("target_dir")
    ap.add_argument("--max-shard-size", type=float, default=5e9,
                    help="bytes per safetensors file, decimal (default 5e9, as save_pretrained)")
    args = ap.parse_args()
    t0 = time.monotonic()

    world_size = world_size_of(args.local_dir)
    rank0 = load_shard(args.local_dir, world_size, 0)  # kept until the end, as verl does
    mesh_shape, mesh_dim_names = mesh_info(rank0, world_size)
    if mesh_dim_names not in (("fsdp",), ("ddp", "fsdp")):
        sys.exit(f"verl_merger: unsupported mesh_dim_names {mesh_dim_names}")
    total_shards = mesh_shape[-1]
    state_dict = load_and_merge(args.local_dir, world_size, total_shards, mesh_dim_names)

    hf = Path(args.local_dir) / "huggingface"
    with open(hf / "config.json") as f:
        config = json.load(f)
    if config.get("tie_word_embeddings") and "model.embed_tokens.weight" in state_dict:
        state_dict.pop("lm_head.weight", None)
    nbytes = sum(t.numel() * t.element_size() for t in state_dict.values())
    nfiles = save_hf(state_dict, args.target_dir, int(args.max_shard_size))
    ntensors = len(state_dict)
    del state_dict
    for p in sorted(hf.iterdir()):
        if p.is_file() and not p.name.endswith((".safetensors", ".safetensors.index.json")):
            shutil.copyfile(p, os.path.join(args.target_dir, p.name))
    del rank0

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"verl_merger: {args.local_dir}: W={world_size}, mesh {list(mesh_shape)} {mesh_dim_names}, "
          f"{total_shards} shards read -> {args.target_dir}: {ntensors} tensors, {nbytes} bytes bf16, "
          f"{nfiles} file(s); {time.monotonic() - t0:.2f} s, peak RSS {rss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
