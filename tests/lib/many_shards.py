#!/usr/bin/python3
"""Writes a Hugging Face checkpoint of N safetensors shards (one small F32 tensor each, listed by
model.safetensors.index.json; no config.json, so only hf/ is served): a source with more files
than a low descriptor limit allows open at once.

  many_shards.py DIR N
"""
import json
import os
import struct
import sys

import st_write  # noqa: E402  (beside this file)


def main():
    out, n = sys.argv[1], int(sys.argv[2])
    os.makedirs(out, exist_ok=True)
    weight_map = {}
    for i in range(n):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        tensor = f"t.{i}"
        values = struct.pack("<4f", i, i + 0.25, i + 0.5, -i)
        header, _ = st_write.header_bytes([(tensor, "F32", [4], 16)], metadata=None, compact=False)
        with open(os.path.join(out, name), "wb") as f:
            f.write(header + values)
        weight_map[tensor] = name
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 16 * n}, "weight_map": weight_map}, f)


if __name__ == "__main__":
    main()
