#!/usr/bin/python3
"""DeepSeek's inference/fp8_cast_bf16.py on the CPU: the offline baseline of
bench/deepseek_bench.sh (block-FP8 checkpoint -> bf16 copy).

  fp8_cast_bf16.py --input-fp8-hf-path SRC --output-bf16-hf-path DEST

Runs under torch 2.x with safetensors (the tests' Debian 13 root: torch 2.6). Written as the
original works (DeepSeek-V3 repository, inference/fp8_cast_bf16.py), with the device "cuda"
replaced by "cpu" and its Triton kernel `weight_dequant(x, s)` by the same computation in torch:
each element's FP8 code as float32 times its 128 x 128 block's `scale_inv` (float32), the product
cast to the default dtype bfloat16 (round to nearest even), which is what the kernel's
`y = x.to(float32) * s` stored into a bf16 tensor gives. For each shard in sorted order: load it
(safetensors `load_file`), dequantise every 1-byte weight with its `<name>_scale_inv` (looked up
through the index, in this or another shard; the two most recently loaded shards are kept),
keep the other tensors, drop the `_scale_inv` tensors, `save_file` the shard under its own name;
then write `model.safetensors.index.json` without the scale entries (metadata {}). Like the
original, it writes only the weight files and the index (no config.json).
"""
import json
import os
import sys
from argparse import ArgumentParser
from glob import glob

import torch
from safetensors.torch import load_file, save_file


def weight_dequant(x, s, block_size=128):
    """The Triton kernel's result on the CPU: bf16(float32(x) * s[i // B, j // B])."""
    assert x.dim() == 2 and s.dim() == 2
    m, n = x.shape
    full = s.repeat_interleave(block_size, 0).repeat_interleave(block_size, 1)[:m, :n]
    y = torch.empty_like(x, dtype=torch.get_default_dtype())
    torch.mul(x.to(torch.float32), full, out=y)  # fp32 product, stored (rounded) as bf16
    return y


def main(fp8_path, bf16_path):
    torch.set_default_dtype(torch.bfloat16)
    os.makedirs(bf16_path, exist_ok=True)
    model_index_file = os.path.join(fp8_path, "model.safetensors.index.json")
    with open(model_index_file, "r") as f:
        model_index = json.load(f)
    weight_map = model_index["weight_map"]

    # Cache for loaded safetensor files
    loaded_files = {}
    fp8_weight_names = []

    # Helper function to get tensor from the correct file
    def get_tensor(tensor_name):
        file_name = weight_map[tensor_name]
        if file_name not in loaded_files:
            file_path = os.path.join(fp8_path, file_name)
            loaded_files[file_name] = load_file(file_path, device="cpu")
        return loaded_files[file_name][tensor_name]

    safetensor_files = list(glob(os.path.join(fp8_path, "*.safetensors")))
    safetensor_files.sort()
    for safetensor_file in safetensor_files:
        file_name = os.path.basename(safetensor_file)
        current_state_dict = load_file(safetensor_file, device="cpu")
        loaded_files[file_name] = current_state_dict

        new_state_dict = {}
        for weight_name, weight in current_state_dict.items():
            if weight_name.endswith("_scale_inv"):
                continue
            elif weight.element_size() == 1:  # FP8 weight
                scale_inv_name = f"{weight_name}_scale_inv"
                try:
                    # Get scale_inv from the correct file
                    scale_inv = get_tensor(scale_inv_name)
                    fp8_weight_names.append(weight_name)
                    new_state_dict[weight_name] = weight_dequant(weight, scale_inv)
                except KeyError:
                    print(f"Warning: Missing scale_inv tensor for {weight_name}, skipping conversion")
                    new_state_dict[weight_name] = weight
            else:
                new_state_dict[weight_name] = weight

        new_safetensor_file = os.path.join(bf16_path, file_name)
        save_file(new_state_dict, new_safetensor_file)

        # Memory management: keep only the 2 most recently used files
        if len(loaded_files) > 2:
            oldest_file = next(iter(loaded_files))
            del loaded_files[oldest_file]

    # Update model index
    new_model_index_file = os.path.join(bf16_path, "model.safetensors.index.json")
    for weight_name in fp8_weight_names:
        scale_inv_name = f"{weight_name}_scale_inv"
        if scale_inv_name in weight_map:
            weight_map.pop(scale_inv_name)
    with open(new_model_index_file, "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
    print(f"fp8_cast_bf16: {len(safetensor_files)} shards, {len(fp8_weight_names)} FP8 weights "
          f"dequantised, torch {torch.__version__}, {torch.get_num_threads()} threads",
          file=sys.stderr)


if __name__ == "__main__":
    parser = ArgumentParser()
    parser.add_argument("--input-fp8-hf-path", type=str, required=True)
    parser.add_argument("--output-bf16-hf-path", type=str, required=True)
    args = parser.parse_args()
    main(args.input_fp8_hf_path, args.output_bf16_hf_path)
