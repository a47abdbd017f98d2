#!/usr/bin/python3
"""Rewrites every rank file of a Megatron legacy checkpoint with torch.save (the running torch:
1.13 writes records without alignment), adding what real training runs carry: an optimizer with
param_groups and state tensors, rng_state with numpy arrays and Python's random state, TE
_extra_state entries as BytesIO and as uint8 tensors, and tensors that share a larger storage
(at offset 0 and beyond).

Usage: resave_megatron.py ITER_DIR
"""
import io
import os
import random
import sys

import numpy as np
import torch


def main():
    root = sys.argv[1]
    for rank in sorted(os.listdir(root)):
        path = os.path.join(root, rank, "model_optim_rng.pt")
        sd = torch.load(path, map_location="cpu")
        model = sd.get("model") or sd["model0"]
        keys = [k for k, v in model.items() if v is not None]
        # Storage sharing: one tensor stored as a slice of a bigger one, one at an offset.
        a = keys[1]
        big = torch.cat([model[a].reshape(-1), torch.ones(7, dtype=model[a].dtype)])
        model[a] = big[: model[a].numel()].view(model[a].shape)
        b = keys[2]
        big = torch.cat([torch.zeros(5, dtype=model[b].dtype), model[b].reshape(-1)])
        model[b] = big[5:].view(model[b].shape)
        for chunk in [v for k, v in sd.items() if k.startswith("model")]:
            for i, k in enumerate([k for k in chunk if k.endswith("._extra_state")]):
                if i % 2:
                    buf = io.BytesIO()
                    torch.save({"fp8": None}, buf)
                    buf.seek(0)
                    chunk[k] = buf
                else:
                    chunk[k] = torch.empty(0, dtype=torch.uint8)
        sd["optimizer"] = {"optimizer": {"state": {0: {"exp_avg": torch.zeros(3), "step": torch.tensor(10.0)}},
                                         "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.95), "params": [0]}]},
                           "fp32_from_fp16_params": [[torch.randn(4)]]}
        sd["rng_state"] = [{"random_rng_state": random.getstate(),
                            "np_rng_state": np.random.get_state(),
                            "torch_rng_state": torch.get_rng_state()}]
        sd["opt_param_scheduler"] = {"max_lr": 1e-4, "num_steps": 10}
        sd["num_floating_point_operations_so_far"] = 12345
        sd["iteration"] = 10
        torch.save(sd, path)


if __name__ == "__main__":
    main()
