#!/usr/bin/python3
"""Rewrites every rank file of a Megatron legacy checkpoint with torch.save (the running torch:
1.13 writes records without alignment), adding what real training runs carry: an optimizer with
param_groups and state tensors, rng_state with numpy arrays and Python's random state, TE
_extra_state entries as BytesIO and as uint8 tensors, tensors that share a larger storage
(at offset 0 and beyond) and non-contiguous ones (a matrix that is a column slice of a wider
one, a vector of every other element).

Usage: resave_megatron.py ITER_DIR [--transposed]
  --transposed: also store one matrix as a transposed view (column-major), which ckptfs refuses.
"""
import io
import os
import random
import sys

import numpy as np
import torch


def main():
    root = sys.argv[1]
    transposed = "--transposed" in sys.argv[2:]
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
        # Non-contiguous: rows of a wider matrix (row stride > columns), every other element.
        c = next(k for k in keys[3:] if model[k].dim() == 2)
        rows, cols = model[c].shape
        wide = torch.cat([model[c], torch.full((rows, 3), 7, dtype=model[c].dtype)], dim=1)
        model[c] = wide[:, :cols]
        d = next(k for k in keys[3:] if model[k].dim() == 1)
        pairs = torch.stack([model[d], torch.full_like(model[d], 9)], dim=1)
        model[d] = pairs.reshape(-1)[::2]
        assert not model[c].is_contiguous() and not model[d].is_contiguous()
        if transposed:
            e = next(k for k in keys[3:] if model[k].dim() == 2 and k != c)
            model[e] = model[e].t().contiguous().t()
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
