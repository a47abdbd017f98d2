#!/usr/bin/python3
"""Writes the seed corpus of the safetensors fuzz target (valid and broken files).
Usage: make_corpus.py DIR"""
import json
import os
import struct
import sys


def st(header, data=b"", pad=True, length=None):
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    f32 = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    seeds = {
        "valid_one": st({"__metadata__": {"format": "pt"}, "w": f32}, b"\0" * 16),
        "valid_many": st({"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
                          "b": {"dtype": "I64", "shape": [], "data_offsets": [6, 14]},
                          "c": {"dtype": "U8", "shape": [0, 4], "data_offsets": [14, 14]},
                          "d\"q\\u00e9": {"dtype": "F16", "shape": [1, 1, 1], "data_offsets": [14, 16]}},
                         b"\1" * 16),
        "unknown_dtype": st({"w": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, b"\0"),
        "overlap": st({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                       "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, b"\0" * 6),
        "hole": st({"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}, b"\0" * 4),
        "past_end": st({"w": f32}, b"\0" * 8),
        "huge_shape": st({"w": {"dtype": "F64", "shape": [2**62, 2**62], "data_offsets": [0, 8]}}, b"\0" * 8),
        "bad_json": struct.pack("<Q", 8) + b"{\"a\":[1,",
        "absurd_length": st({"w": f32}, b"\0" * 16, length=2**63),
        "metadata_not_str": st({"__metadata__": {"k": 1}}),
    }
    for name, blob in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    main()
