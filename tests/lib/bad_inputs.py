#!/usr/bin/python3
"""Writes one broken checkpoint per kind under OUT/ and prints, per kind, what the one-line
error must name: KIND<TAB>substring<TAB>substring...

  bad_inputs.py OUT
"""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import config_for, model_tensors, write_checkpoint  # noqa: E402

ONE = {"w": ("F32", None)}


def raw_file(path, header_bytes, data=b"", length=None):
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes) if length is None else length) + header_bytes + data)


def header(entries):
    return json.dumps(entries, separators=(",", ":")).encode()


def main():
    out = sys.argv[1]
    cases = []

    def case(kind, expect, files):
        d = os.path.join(out, kind)
        os.makedirs(d)
        for name, writer in files.items():
            writer(os.path.join(d, name))
        cases.append((kind, [s.replace("DIR", d) for s in expect]))

    good = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    case("no-weights", ["DIR", "no safetensors weights"],
         {"config.json": lambda p: open(p, "w").write("{}")})
    case("header-longer-than-file", ["model.safetensors", "larger than the file"],
         {"model.safetensors": lambda p: raw_file(p, header(good), b"\0" * 16, length=1 << 20)})
    case("header-absurd", ["model.safetensors", "absurd"],
         {"model.safetensors": lambda p: raw_file(p, header(good), b"\0" * 16, length=1 << 60)})
    case("header-not-json", ["model.safetensors", "not valid JSON"],
         {"model.safetensors": lambda p: raw_file(p, b"{not json at all}      ")})
    case("header-not-object", ["model.safetensors", "not a JSON object"],
         {"model.safetensors": lambda p: raw_file(p, b"[1, 2, 3]")})
    case("unknown-dtype", ["model.safetensors", "'w'", "Q7"],
         {"model.safetensors": lambda p: raw_file(
             p, header({"w": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 2]}}), b"\0" * 2)})
    case("shape-mismatch", ["model.safetensors", "'w'", "need 16 bytes"],
         {"model.safetensors": lambda p: raw_file(
             p, header({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}), b"\0" * 12)})
    case("offsets-past-eof", ["model.safetensors", "'w'", "past the end"],
         {"model.safetensors": lambda p: raw_file(p, header(good), b"\0" * 8)})
    case("overlap", ["model.safetensors", "overlap"],
         {"model.safetensors": lambda p: raw_file(p, header({
             "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}), b"\0" * 12)})
    case("truncated", ["model.safetensors", "larger than the file"],
         {"model.safetensors": lambda p: open(p, "wb").write(
             struct.pack("<Q", 200) + header(good)[:20])})
    case("tiny-file", ["model.safetensors", "too short"],
         {"model.safetensors": lambda p: open(p, "wb").write(b"\1\2\3")})

    def index(wm):
        return lambda p: open(p, "w").write(json.dumps({"metadata": {}, "weight_map": wm}))
    st = lambda p: raw_file(p, header(good), b"\0" * 16)  # noqa: E731
    case("index-missing-shard", ["model-00002-of-00002.safetensors", "missing"],
         {"model.safetensors.index.json": index({"w": "model-00001-of-00002.safetensors",
                                                 "v": "model-00002-of-00002.safetensors"}),
          "model-00001-of-00002.safetensors": st})
    case("index-slash", ["model.safetensors.index.json", "sub/x.safetensors", "not a plain file name"],
         {"model.safetensors.index.json": index({"w": "sub/x.safetensors"})})
    case("index-dotdot", ["model.safetensors.index.json", "..", "not a plain file name"],
         {"model.safetensors.index.json": index({"w": "../x.safetensors"})})
    # w is in both shards; the index names both shards.
    two = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
           "x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [16, 32]}}
    case("tensor-twice", ["b.safetensors", "'w'", "listed twice"],
         {"model.safetensors.index.json": index({"w": "a.safetensors", "x": "b.safetensors"}),
          "a.safetensors": st,
          "b.safetensors": lambda p: raw_file(p, header(two), b"\0" * 32)})
    case("index-not-json", ["model.safetensors.index.json", "not valid JSON"],
         {"model.safetensors.index.json": lambda p: open(p, "w").write("{oops"), "a.safetensors": st})

    for kind, kind_expect in cases:
        print("\t".join([kind] + kind_expect))

    # Sources that mount (hf/ works) but have no Megatron views, and why.
    soft = os.path.join(out, "soft")
    os.makedirs(soft)
    cfg = config_for("llama", 2)
    tensors = model_tensors(cfg)
    write_checkpoint(os.path.join(soft, "no-config"), tensors, None)
    write_checkpoint(os.path.join(soft, "broken-config"), tensors, None)
    open(os.path.join(soft, "broken-config", "config.json"), "w").write("{\"hidden_size\": ")
    for name, mutate in {
        "unknown-arch": lambda c: c.update(architectures=["GPT2LMHeadModel"], model_type="gpt2"),
        "missing-layers": lambda c: c.pop("num_hidden_layers"),
        "wrong-shape": lambda c: c.update(intermediate_size=128),
    }.items():
        c = dict(cfg)
        mutate(c)
        write_checkpoint(os.path.join(soft, name), tensors, c)


if __name__ == "__main__":
    main()
