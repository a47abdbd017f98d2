#!/usr/bin/python3
"""Broken mixture-of-experts torch_dist checkpoints, made from a good one (Megatron's own
mixtral-tp1pp2ep2-torch_dist: experts stacked as [L, E, ...], one chunk per expert and half of
fc1) with torch's own classes (run with torch 2.x): each case is a copy of the checkpoint
directory with one thing wrong, and a file `expect` holding a piece of the one-line error ckptfs
must give for it (see bad_torch_dist.py for the dense cases).

  bad_moe_torch_dist.py GOOD_CKPT_DIR OUT_DIR [--per-layer]
GOOD_CKPT_DIR holds metadata.json, common.pt, .metadata and the .distcp files (an iter_* dir).
Writes OUT_DIR/<case>/{...checkpoint..., expect}; prints the case names. --per-layer: cases for
a checkpoint with per-layer keys (moe_dist_source.py's default: Qwen2-MoE, layer 1 dense) instead.
"""
import copy
import os
import pickle
import re
import shutil
import sys

import torch

FC1 = "decoder.layers.mlp.experts.experts.linear_fc1.weight"
FC2 = "decoder.layers.mlp.experts.experts.linear_fc2.weight"
ROUTER = "decoder.layers.mlp.router.weight"


def load_md(d):
    with open(os.path.join(d, ".metadata"), "rb") as f:
        return pickle.load(f)


def save_md(d, md):
    with open(os.path.join(d, ".metadata"), "wb") as f:
        pickle.dump(md, f)


def drop_chunks(md, key, keep):
    chunks = md.state_dict_metadata[key].chunks
    left = [c for c in chunks if keep(list(c.offsets))]
    assert 0 < len(left) < len(chunks), (key, len(left), len(chunks))
    md.state_dict_metadata[key].chunks = left


def case_expert_missing(d):
    """No chunk of layer 1's expert 3 in fc2 (one chunk per expert)."""
    md = load_md(d)
    drop_chunks(md, FC2, lambda o: o[:2] != [1, 3])
    save_md(d, md)
    return (f"chunks of '{FC2}' leave a hole: they hold 0 of the 2048 elements of "
            "'model.layers.1.block_sparse_moe.experts.3.w2.weight' (a chunk is missing)")


def case_expert_half_missing(d):
    """fc1 of layer 2's expert 0 without its up half (rows 32..63): w3 has no piece."""
    md = load_md(d)
    drop_chunks(md, FC1, lambda o: not (o[:2] == [2, 0] and o[2] >= 32))
    save_md(d, md)
    return (f"chunks of '{FC1}' leave a hole: they hold 0 of the 2048 elements of "
            "'model.layers.2.block_sparse_moe.experts.0.w3.weight'")


def case_expert_twice(d):
    """Two chunks holding layer 0's expert 1 in fc2 (the same box listed twice)."""
    md = load_md(d)
    chunks = md.state_dict_metadata[FC2].chunks
    chunks.append(copy.deepcopy(next(c for c in chunks if list(c.offsets[:2]) == [0, 1])))
    save_md(d, md)
    return (f"chunks of '{FC2}' overlap: they hold parts of "
            "'model.layers.0.block_sparse_moe.experts.1.w2.weight' more than once")


def resize(d, key, dim, size):
    md = load_md(d)
    s = list(md.state_dict_metadata[key].size)
    s[dim] = size
    md.state_dict_metadata[key].size = torch.Size(s)
    save_md(d, md)
    return s


def case_experts_count_wrong(d):
    """fc1's expert axis says 3 experts; args say 4."""
    s = resize(d, FC1, 1, 3)
    return f"'{FC1}' has shape [{', '.join(map(str, s))}]; the model's args imply [4, 4, 64, 64] (num_experts 4"


def case_expert_ffn_wrong(d):
    """fc2's expert ffn says 48; args.moe_ffn_hidden_size says 32."""
    s = resize(d, FC2, 3, 48)
    return (f"'{FC2}' has shape [{', '.join(map(str, s))}]; the model's args imply [4, 4, 64, 32] "
            "(num_experts 4, moe_ffn_hidden_size 32)")


def case_args_num_experts(d):
    """common.pt's args.num_experts 8 (the pickle's BININT1 4 patched; torch checks no CRC)."""
    p = os.path.join(d, "common.pt")
    data = open(p, "rb").read()
    pat = re.compile(rb"(X\x0b\x00\x00\x00num_experts(?:q.|r....)?K)\x04", re.S)
    assert len(pat.findall(data)) == 1
    open(p, "wb").write(pat.sub(lambda m: m.group(1) + b"\x08", data))
    return f"'{ROUTER}' has shape [4, 4, 64]; the model's args imply [4, 8, 64] (num_experts 8"


def case_unknown_moe_key(d):
    """A router expert bias (DeepSeek-V3 style routing) that the args do not announce."""
    md = load_md(d)
    md.state_dict_metadata["decoder.layers.mlp.router.expert_bias"] = copy.deepcopy(md.state_dict_metadata[ROUTER])
    save_md(d, md)
    return "1 unexpected entries: 'decoder.layers.mlp.router.expert_bias'"


def case_expert_key_missing(d):
    md = load_md(d)
    del md.state_dict_metadata[FC2]
    save_md(d, md)
    return f"no '{FC2}' (the model's args imply it)"


def case_pre_mlp_norm_missing(d):
    """Neither name of an MoE layer's pre-MLP norm (TE's, the local spec's) is there."""
    md = load_md(d)
    del md.state_dict_metadata["decoder.layers.mlp.linear_fc1.layer_norm_weight"]
    save_md(d, md)
    return ("neither 'decoder.layers.pre_mlp_layernorm.weight' nor "
            "'decoder.layers.mlp.linear_fc1.layer_norm_weight' is there")


def case_expert_chunk_outside(d):
    """A chunk of fc2 at expert 4 of 4."""
    md = load_md(d)
    c = next(c for c in md.state_dict_metadata[FC2].chunks if list(c.offsets[:2]) == [3, 3])
    off = list(c.offsets)
    off[1] = 4
    c.offsets = torch.Size(off)
    save_md(d, md)
    return f"'{FC2}' chunk at [3, 4, 0, 0] of size [1, 1, 64, 32] lies outside [4, 4, 64, 32]"


# --- per-layer keys (layers of two kinds): decoder.layers.{l}.<name>, no layer axis ---
L_FC1 = "decoder.layers.{}.mlp.experts.experts.linear_fc1.weight"


def layer_case_layer_key_missing(d):
    """Layer 2 (MoE) without its experts' fc1."""
    md = load_md(d)
    del md.state_dict_metadata[L_FC1.format(2)]
    save_md(d, md)
    return f"no '{L_FC1.format(2)}' (the model's args imply it)"


def layer_case_dense_layer_with_router(d):
    """Layer 1 is dense (args.moe_layer_freq) but has a router."""
    md = load_md(d)
    md.state_dict_metadata["decoder.layers.1.mlp.router.weight"] = copy.deepcopy(
        md.state_dict_metadata["decoder.layers.0.mlp.router.weight"])
    save_md(d, md)
    return "1 unexpected entries: 'decoder.layers.1.mlp.router.weight'"


def layer_case_expert_missing(d):
    """No chunk of layer 3's expert 1 in fc1 ([E, 2F, H]: offsets start with the expert)."""
    md = load_md(d)
    drop_chunks(md, L_FC1.format(3), lambda o: o[0] != 1)
    save_md(d, md)
    return (f"chunks of '{L_FC1.format(3)}' leave a hole: they hold 0 of the 2048 elements of "
            "'model.layers.3.mlp.experts.1.gate_proj.weight'")


def layer_case_stacked_keys(d):
    """Stacked expert keys where the layers are of two kinds: Megatron names such models per layer."""
    md = load_md(d)
    md.state_dict_metadata = {k: v for k, v in md.state_dict_metadata.items()
                              if not k.startswith("decoder.layers.")}
    md.state_dict_metadata[FC1] = copy.deepcopy(md.state_dict_metadata["output_layer.weight"])
    save_md(d, md)
    return "the keys stack every layer, but the model has dense layers among its MoE layers"


def layer_case_experts_count_wrong(d):
    """Layer 0's fc2 with 3 experts."""
    s = resize(d, "decoder.layers.0.mlp.experts.experts.linear_fc2.weight", 0, 3)
    return ("'decoder.layers.0.mlp.experts.experts.linear_fc2.weight' has shape "
            f"[{', '.join(map(str, s))}]; the model's args imply [4, 64, 32] (num_experts 4")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}
LAYER_CASES = {name[len("layer_case_"):]: fn for name, fn in globals().items() if name.startswith("layer_case_")}


def main():
    good, out = sys.argv[1], sys.argv[2]
    cases = LAYER_CASES if "--per-layer" in sys.argv[3:] else CASES
    for name, fn in cases.items():
        d = os.path.join(out, name)
        shutil.copytree(good, d)
        expect = fn(d)
        open(os.path.join(d, "expect"), "w").write(expect)
    print(" ".join(cases))


if __name__ == "__main__":
    main()
