#!/usr/bin/python3
"""Broken torch_dist checkpoints, made from a good one with torch's own classes (run with torch
2.x): each case is a copy of the checkpoint directory with one thing wrong, and a file `expect`
holding a piece of the one-line error ckptfs must give for it.

  bad_torch_dist.py GOOD_CKPT_DIR OUT_DIR
GOOD_CKPT_DIR holds metadata.json, common.pt, .metadata and the .distcp files (an iter_* dir).
Writes OUT_DIR/<case>/{...checkpoint..., expect}.
"""
import copy
import io
import os
import pickle
import shutil
import sys
import zipfile

import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata


def load_md(d):
    with open(os.path.join(d, ".metadata"), "rb") as f:
        return pickle.load(f)


def save_md(d, md):
    with open(os.path.join(d, ".metadata"), "wb") as f:
        pickle.dump(md, f)


def storage_of(md, fqn, offsets):
    for k, v in md.storage_data.items():
        if k.fqn == fqn and tuple(k.offset or ()) == tuple(offsets):
            return k, v
    raise KeyError((fqn, offsets))


QKV = "decoder.layers.self_attention.linear_qkv.weight"
FC2 = "decoder.layers.mlp.linear_fc2.weight"


def case_truncated_metadata(d):
    p = os.path.join(d, ".metadata")
    data = open(p, "rb").read()
    open(p, "wb").write(data[: len(data) // 2])
    return ".metadata"


def case_deep_nesting(d):
    open(os.path.join(d, ".metadata"), "wb").write(b"\x80\x04" + b"(" * 100000 + b".")
    return "nesting deeper"


def case_unknown_opcode(d):
    open(os.path.join(d, ".metadata"), "wb").write(b"\x80\x04\xff.")
    return "opcode 0xff"


def case_huge_length(d):
    open(os.path.join(d, ".metadata"), "wb").write(b"\x80\x04X\xff\xff\xff\x7fabc.")
    return ".metadata"


def case_not_metadata(d):
    save_md(d, {"state_dict_metadata": {}})
    return "not a torch.distributed.checkpoint Metadata"


def case_missing_distcp(d):
    name = sorted(f for f in os.listdir(d) if f.endswith(".distcp"))[-1]
    os.remove(os.path.join(d, name))
    return f"{name}: missing"


def case_item_past_end(d):
    md = load_md(d)
    _, info = storage_of(md, FC2, md.state_dict_metadata[FC2].chunks[0].offsets)
    p = os.path.join(d, info.relative_path)
    os.truncate(p, info.offset + info.length // 2)
    return "runs past the end"


def case_chunk_hole(d):
    md = load_md(d)
    md.state_dict_metadata[QKV].chunks.pop(1)
    save_md(d, md)
    return "self_attn"


def case_chunk_overlap(d):
    md = load_md(d)
    chunks = md.state_dict_metadata[QKV].chunks
    c = next(c for c in chunks if c.offsets[1] > 0)
    # a copy of that chunk one row up also claims the row above it
    off = list(c.offsets)
    off[1] -= 1
    chunks.append(ChunkStorageMetadata(offsets=torch.Size(off), sizes=c.sizes))
    k, info = storage_of(md, QKV, c.offsets)
    md.storage_data[type(k)(fqn=QKV, offset=torch.Size(off))] = info
    save_md(d, md)
    return "overlap"


def case_archives_overlap(d):
    md = load_md(d)
    chunks = md.state_dict_metadata[QKV].chunks
    a, b = chunks[0], next(c for c in chunks[1:] if c.sizes == chunks[0].sizes)
    _, info_a = storage_of(md, QKV, a.offsets)
    kb, _ = storage_of(md, QKV, b.offsets)
    md.storage_data[kb] = copy.copy(info_a)
    save_md(d, md)
    return "overlap"


def case_shape_mismatch(d):
    md = load_md(d)
    tsm = md.state_dict_metadata[FC2]
    size = list(tsm.size)
    size[2] += 8
    tsm.size = torch.Size(size)
    save_md(d, md)
    return "has shape"


def case_compressed_entry(d):
    md = load_md(d)
    k, info = storage_of(md, FC2, md.state_dict_metadata[FC2].chunks[0].offsets)
    with open(os.path.join(d, info.relative_path), "rb") as f:
        f.seek(info.offset)
        item = f.read(info.length)
    src = zipfile.ZipFile(io.BytesIO(item))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for n in src.namelist():
            z.writestr(n, src.read(n))
    name = "__99_0.distcp"
    open(os.path.join(d, name), "wb").write(out.getvalue())
    info.relative_path, info.offset, info.length = name, 0, len(out.getvalue())
    save_md(d, md)
    return "compress"


def case_path_escape(d):
    md = load_md(d)
    _, info = storage_of(md, FC2, md.state_dict_metadata[FC2].chunks[0].offsets)
    info.relative_path = "../../etc/passwd"
    save_md(d, md)
    return "not a file name"


def case_unexpected_key(d):
    md = load_md(d)
    md.state_dict_metadata["decoder.layers.mlp.router.weight"] = copy.deepcopy(md.state_dict_metadata[FC2])
    save_md(d, md)
    return "unexpected entries"


def case_wrong_backend(d):
    open(os.path.join(d, "metadata.json"), "w").write('{"sharded_backend": "zarr", "sharded_backend_version": 1}')
    return "zarr"


def case_dtype_mismatch(d):
    md = load_md(d)
    md.state_dict_metadata[FC2].properties.dtype = torch.float32
    save_md(d, md)
    return "BF16"


def case_vocab_rows(d):
    # One more padded row than args.padded_vocab_size, and no chunk holding it.
    md = load_md(d)
    tsm = md.state_dict_metadata["embedding.word_embeddings.weight"]
    size = list(tsm.size)
    size[0] += 1
    tsm.size = torch.Size(size)
    save_md(d, md)
    return "'embedding.word_embeddings.weight' has shape [%d, %d]; the model's args imply [%d, %d]" % (
        size[0], size[1], size[0] - 1, size[1])


def case_storage_length_zero(d):
    md = load_md(d)
    c = md.state_dict_metadata[QKV].chunks[0]
    k, info = storage_of(md, QKV, c.offsets)
    info = copy.copy(info)
    info.length = 0
    md.storage_data[k] = info
    save_md(d, md)
    return "its storage_data length is not a positive integer"


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    good, out = sys.argv[1], sys.argv[2]
    for name, fn in CASES.items():
        d = os.path.join(out, name)
        shutil.copytree(good, d)
        expect = fn(d)
        open(os.path.join(d, "expect"), "w").write(expect)
    print(" ".join(CASES))


if __name__ == "__main__":
    main()
