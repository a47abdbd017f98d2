#!/usr/bin/python3
"""Compares a ckptfs view with rank files written by Megatron-LM itself (run with torch 2.6).
Megatron's files hold numpy 2 arrays and Megatron enums in rng_state/args: they are read with
an unpickler that stands in a dummy class for modules that are not installed.

  compare_megatron.py REAL_ITER_DIR VIEW_RELEASE_DIR
"""
import argparse
import os
import pickle
import sys
import types

import torch


class _Dummy:
    def __init__(self, *a, **k):
        pass

    def __setstate__(self, state):
        pass


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            return type(name, (_Dummy,), {})


tolerant = types.ModuleType("tolerant_pickle")
tolerant.Unpickler = _Unpickler
tolerant.load = pickle.load
tolerant.__version__ = "0"


# What Megatron compares or needs to build the same experts and route as the HF model.
MOE_ARGS = ("moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
            "moe_shared_expert_gate", "moe_router_pre_softmax", "moe_router_score_function",
            "moe_layer_freq", "expert_model_parallel_size", "expert_tensor_parallel_size",
            "moe_router_dtype", "moe_router_load_balancing_type")


def main():
    real_dir, view_dir = sys.argv[1:3]
    torch.serialization.add_safe_globals([argparse.Namespace])
    ranks = sorted(os.listdir(real_dir))
    if ranks != sorted(os.listdir(view_dir)):
        sys.exit(f"rank dirs differ: {ranks} vs {sorted(os.listdir(view_dir))}")
    for r in ranks:
        real = torch.load(os.path.join(real_dir, r, "model_optim_rng.pt"), map_location="cpu",
                          weights_only=False, pickle_module=tolerant)
        ours = torch.load(os.path.join(view_dir, r, "model_optim_rng.pt"), map_location="cpu",
                          weights_only=True, mmap=True)
        for key in ("model",):
            a, b = real[key], ours[key]
            if list(a) != list(b):
                sys.exit(f"{r}: keys differ: first {next((x, y) for x, y in zip(a, b) if x != y)}")
            for k, v in a.items():
                w = b[k]
                if (v is None) != (w is None):
                    sys.exit(f"{r}: {k}: None mismatch")
                if v is not None and (v.dtype != w.dtype or v.shape != w.shape or not torch.equal(v, w)):
                    sys.exit(f"{r}: {k}: differs")
        for f in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "num_layers",
                  "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                  "kv_channels", "padded_vocab_size", "untie_embeddings_and_output_weights",
                  "add_qkv_bias", "normalization", "swiglu", "params_dtype", "rotary_base",
                  "num_experts") + MOE_ARGS * (getattr(real["args"], "num_experts", None) is not None):
            if getattr(real["args"], f) != getattr(ours["args"], f):
                sys.exit(f"{r}: args.{f}: Megatron {getattr(real['args'], f)!r}, ckptfs {getattr(ours['args'], f)!r}")
    print(f"{len(ranks)} rank files: keys, order and every tensor equal to Megatron's own; args agree")


if __name__ == "__main__":
    main()
