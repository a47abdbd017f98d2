#!/usr/bin/python3
"""Role directories as verl's Megatron engine saves them, made from what ckptfs serves for a
Hugging Face model (no real verl output here; torch 1.13 is enough).

  verl_megatron_data.py ranks LEGACY ROLE      LEGACY: a tpXppY[vppV]/ legacy checkpoint; writes
        ROLE/model/mp_rank_TT[_PPP]/model.pt as verl wrote them in 2025 (torch.save of a list
        with one state dict per virtual chunk: Megatron-core names, local layer indices, TE
        _extra_state entries, no args, no optimizer)
  verl_megatron_data.py torch-dist MCORE DEST  MCORE: an mcore/release torch_dist checkpoint;
        DEST gets a copy whose common.pt holds no args (verl saves none)
  verl_megatron_data.py manifest ROLE MODEL_PATH MODEL_FORMAT   ckpt_contents.json (2026 layout)
  verl_megatron_data.py bad-root FILE           rewrites a model.pt with a dict root, as Megatron's
        own rank files have ({"model": ...})
  verl_megatron_data.py early-names FILE        rewrites a model.pt with verl's March 2025 names
        (model.layers.N.self_attn.qkv_proj.weight ...)
"""
import collections
import io
import json
import os
import shutil
import sys

import torch


def chunk_dicts(sd):
    """The model state dicts of a Megatron rank file, in virtual chunk order."""
    if "model" in sd:
        return [sd["model"]]
    return [sd[f"model{v}"] for v in range(len([k for k in sd if k.startswith("model")]))]


def as_module_state_dict(model, salt):
    """A state dict as nn.Module.state_dict() gives it: an OrderedDict with _metadata, and
    Transformer Engine's extra state as TE writes it (a BytesIO in older TE, a uint8 tensor in
    newer TE) instead of None."""
    out = collections.OrderedDict()
    for n, (k, v) in enumerate(model.items()):
        if k.endswith("._extra_state"):
            blob = f"te-extra-state {salt} {n}".encode()
            v = io.BytesIO(blob) if n % 2 else torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        out[k] = v
    out._metadata = collections.OrderedDict([("", {"version": 1}), ("decoder", {"version": 1})])
    return out


def ranks(legacy, role):
    release = os.path.join(legacy, "release")
    for name in sorted(os.listdir(release)):
        sd = torch.load(os.path.join(release, name, "model_optim_rng.pt"), map_location="cpu")
        chunks = [as_module_state_dict(c, f"{name}/{v}") for v, c in enumerate(chunk_dicts(sd))]
        dest = os.path.join(role, "model", name)
        os.makedirs(dest, exist_ok=True)
        torch.save(chunks, os.path.join(dest, "model.pt"))


def torch_dist(mcore, dest):
    shutil.copytree(mcore, dest)
    torch.save({"content_metadata": {"singleton_local_shards": False}}, os.path.join(dest, "common.pt"))


def manifest(role, model_path, model_format):
    contents = {
        "model": {"path": model_path, "format": model_format},
        "optimizer": {"path": "optimizer/dist_ckpt", "format": "megatron_dist_checkpoint"},
        "transformer_config": {"path": "transformer_config.json", "format": "json"},
        "hf_config": {"path": "model/huggingface", "format": "huggingface"},
        "tokenizer": {"path": "model/huggingface", "format": "huggingface"},
    }
    m = {"schema_version": 2, "framework": "megatron", "role": "actor", "arch": "LlamaForCausalLM",
         "global_step": 1, "world_size": 4,
         "backend": {"has_bridge": model_format == "huggingface",
                     "use_dist_checkpointing": model_format != "huggingface", "peft": False},
         "save_contents": ["model", "optimizer", "extra"], "contents": contents, "saved_any_dist_ckpt": True}
    with open(os.path.join(role, "ckpt_contents.json"), "w") as f:
        json.dump(m, f, indent=2)


def bad_root(path):
    chunks = torch.load(path)
    torch.save({"model": chunks[0]}, path)


def early_names(path):
    chunks = torch.load(path)
    renamed = []
    for c in chunks:
        d = collections.OrderedDict()
        for k, v in c.items():
            k = k.replace("embedding.word_embeddings", "model.embed_tokens").replace("decoder.layers", "model.layers")
            d[k.replace("self_attention.linear_qkv", "self_attn.qkv_proj")] = v
        renamed.append(d)
    torch.save(renamed, path)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"ranks": ranks, "torch-dist": torch_dist, "manifest": manifest, "bad-root": bad_root,
     "early-names": early_names}[cmd](*args)
