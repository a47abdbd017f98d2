#!/usr/bin/python3
"""Loads a torch_dist checkpoint (mcore/) with Debian's torch 1.13, which has no
torch.distributed.checkpoint: `.metadata` is unpickled with inert stand-ins for torch's DCP
classes, each chunk's archive is torch.load'ed from its bytes in its .distcp file, the global
tensors are assembled and compared bit for bit with mcore_expect (numpy, from the HF model).

  dcp_host.py CKPT_DIR HF_DIR
Exit 0 when every tensor key matches, the _extra_state objects load and common.pt loads.
"""
import io
import os
import pickle
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mcore_expect import HFModel, expected_tensors  # noqa: E402

RAW = {torch.bfloat16: (np.uint16, torch.int16), torch.float16: (np.uint16, torch.int16),
       torch.float32: (np.uint32, torch.int32)}


class Inert:
    """A DCP dataclass: keeps its constructor arguments and its state, runs nothing."""

    def __init__(self, *args):
        self.args = args
        self.state = None

    def __setstate__(self, state):
        self.state = state


class MetadataUnpickler(pickle.Unpickler):
    classes = {}

    def find_class(self, module, name):
        if (module, name) == ("torch", "Size"):
            return tuple
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) == ("torch.serialization", "_get_layout"):
            return str
        if module.startswith("torch.distributed.checkpoint."):
            return self.classes.setdefault(name, type(name, (Inert,), {}))
        raise pickle.UnpicklingError(f"unexpected global {module}.{name}")


def kind(obj):
    return type(obj).__name__


def main():
    ckpt, hf = sys.argv[1], sys.argv[2]
    with open(os.path.join(ckpt, ".metadata"), "rb") as f:
        md = MetadataUnpickler(f).load()
    if kind(md) != "Metadata":
        sys.exit(f".metadata holds a {kind(md)}, not a Metadata")
    sdm, storage = md.state["state_dict_metadata"], md.state["storage_data"]
    where = {(k.state["fqn"], tuple(k.state.get("offset") or ())): v.state for k, v in storage.items()}

    def item(fqn, offsets):
        s = where[(fqn, tuple(offsets))]
        with open(os.path.join(ckpt, s["relative_path"]), "rb") as f:
            f.seek(s["offset"])
            return torch.load(io.BytesIO(f.read(s["length"])), map_location="cpu")

    m = HFModel(hf)
    emb = sdm["embedding.word_embeddings.weight"].state["size"]
    expected = expected_tensors(m, emb[0])
    tensor_keys = [k for k, v in sdm.items() if kind(v) == "TensorStorageMetadata"]
    if sorted(tensor_keys) != sorted(expected):
        sys.exit(f"keys differ: {sorted(set(tensor_keys) ^ set(expected))}")
    for key in tensor_keys:
        st = sdm[key].state
        dtype = st["properties"].state[0]
        np_raw, torch_raw = RAW[dtype]
        got = np.full(st["size"], np.iinfo(np_raw).max, np_raw)  # no chunk left unfilled passes
        for c in st["chunks"]:
            off, size = c.state["offsets"], c.state["sizes"]
            t = item(key, off)
            if tuple(t.shape) != tuple(size) or t.dtype != dtype:
                sys.exit(f"{key} chunk at {off}: {tuple(t.shape)} {t.dtype}, .metadata says {size} {dtype}")
            box = tuple(slice(o, o + n) for o, n in zip(off, size))
            got[box] = t.view(torch_raw).numpy().view(np_raw)
        want = expected[key][0]
        if got.shape != want.shape or not np.array_equal(got, want.view(np_raw)):
            sys.exit(f"{key}: differs from the expectation")
    objects = [k for k, v in sdm.items() if kind(v) == "BytesStorageMetadata"]
    values = {repr(item(k, ())) for k in objects}
    common = torch.load(os.path.join(ckpt, "common.pt"), map_location="cpu")
    if common["args"].num_layers != m.L or common["checkpoint_version"] != 3.0:
        sys.exit("common.pt: wrong args or checkpoint_version")
    print(f"# torch {torch.__version__}: {len(tensor_keys)} tensors bit-identical, "
          f"{len(objects)} objects ({', '.join(sorted(values))}), common.pt loads")


if __name__ == "__main__":
    main()
