#!/usr/bin/python3
"""A verl LoRA actor checkpoint, as verl's FSDP checkpoint manager saves one (torch >= 2.4: run
it with the python3 of the tests' Debian 13 root), and the checks of what ckptfs serves for it.

  verl_lora.py write SRC OUT [W]   OUT/global_step_1/actor/: the PEFT-wrapped model of the bf16
                                   Hugging Face model SRC (LoRA r=4, alpha=8 on q_proj and
                                   v_proj) saved by W (default 2) gloo ranks as FSDP2 fp32 DTensor
                                   shards under PEFT's names (base_model.model.…base_layer.weight,
                                   …lora_A.default.weight), with lora_train_meta.json,
                                   fsdp_config.json and huggingface/
  verl_lora.py check SRC HF [--safetensors]
                                   HF/lora_adapter/ holds the adapter as PEFT saves it: names
                                   without ".default", bf16 values equal to the ones written,
                                   adapter_config.json with r, lora_alpha, target_modules, task
                                   (--safetensors: read with the safetensors library)
"""
import json
import math
import os
import shutil
import sys
from collections import OrderedDict

import numpy as np

R, ALPHA, TARGETS = 4, 8, ("q_proj", "v_proj")


def lora_bits(name, shape):
    """bf16 bit patterns for a LoRA matrix, from its name (deterministic, any W)."""
    rng = np.random.default_rng(sum(map(ord, name)) * 7919 + len(name))
    x = rng.standard_normal(shape).astype(np.float32) * 0.02
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def peft_state(src):
    """[(peft key, kind, data)] in PEFT's parameter order: kind 'base' (bf16 bits of SRC) or
    'lora' (generated bf16 bits)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import models
    tensors = models.read_checkpoint(src)
    out = []
    for name, (dt, shape, raw) in tensors.items():
        bits = np.frombuffer(raw, dtype=np.uint16).reshape(shape)
        module = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
        if module in TARGETS:
            stem = "base_model.model." + name[: -len(".weight")]
            out.append((stem + ".base_layer.weight", "base", bits))
            a = lora_bits(stem + ".lora_A", (R, shape[1]))
            b = lora_bits(stem + ".lora_B", (shape[0], R))
            out.append((stem + ".lora_A.default.weight", "lora", a))
            out.append((stem + ".lora_B.default.weight", "lora", b))
        else:
            out.append(("base_model.model." + name, "base", bits))
    return out


def worker(rank, world, role, src):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{role}/.rdv", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    sd = OrderedDict()
    for key, _, bits in peft_state(src):
        full = torch.from_numpy(bits.astype(np.int16)).view(torch.bfloat16).float()
        per = -(-full.shape[0] // world)
        local = full[rank * per:(rank + 1) * per].clone()
        stride = tuple(math.prod(full.shape[i + 1:]) for i in range(full.dim()))
        sd[key] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=full.shape, stride=stride)
    torch.save(sd, os.path.join(role, f"model_world_size_{world}_rank_{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def write(src, out, world):
    import torch.multiprocessing as mp
    role = os.path.join(out, "global_step_1", "actor")
    os.makedirs(os.path.join(role, "huggingface"))
    mp.start_processes(worker, args=(world, role, src), nprocs=world, join=True, start_method="fork")
    if os.path.exists(os.path.join(role, ".rdv")):
        os.remove(os.path.join(role, ".rdv"))
    for f in ("config.json", "tokenizer.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(role, "huggingface", f))
    with open(os.path.join(role, "fsdp_config.json"), "w") as f:
        json.dump({"FSDP_version": 2, "world_size": world}, f, indent=4)
    with open(os.path.join(role, "lora_train_meta.json"), "w") as f:
        json.dump({"r": R, "lora_alpha": ALPHA, "task_type": "CAUSAL_LM"}, f)
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("1")


def check(src, hf, with_library=False):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import models
    adapter = os.path.join(hf, "lora_adapter")
    path = os.path.join(adapter, "adapter_model.safetensors")
    if with_library:
        # The safetensors library (torch 2.x): what PEFT itself loads adapters with.
        import torch
        from safetensors.torch import load_file
        got = {k: ("BF16" if v.dtype == torch.bfloat16 else str(v.dtype), tuple(v.shape),
                   v.contiguous().view(torch.int16).numpy().tobytes()) for k, v in load_file(path).items()}
    else:
        got, _ = models.read_safetensors(path)
    want = {k.replace(".default.weight", ".weight"): bits for k, kind, bits in peft_state(src) if kind == "lora"}
    bad = []
    if sorted(got) != sorted(want):
        bad.append(f"adapter names differ: {sorted(set(got) ^ set(want))[:4]}")
    for name, bits in want.items():
        if name not in got:
            continue
        dt, shape, raw = got[name]
        if dt != "BF16" or tuple(shape) != bits.shape or raw != bits.tobytes():
            bad.append(f"{name}: {dt} {shape} differs from the adapter written")
    cfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
    expect = {"peft_type": "LORA", "r": R, "lora_alpha": ALPHA, "task_type": "CAUSAL_LM"}
    for k, v in expect.items():
        if cfg.get(k) != v:
            bad.append(f"adapter_config.json {k} = {cfg.get(k)!r}, want {v!r}")
    if sorted(cfg.get("target_modules", [])) != sorted(TARGETS):
        bad.append(f"adapter_config.json target_modules = {cfg.get('target_modules')}")
    if bad:
        sys.exit("; ".join(bad[:6]))
    print(f"{len(want)} adapter tensors and adapter_config.json as PEFT saves them")


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[:1] == ["write"] and len(a) in (3, 4):
        write(a[1], a[2], int(a[3]) if len(a) == 4 else 2)
    elif a[:1] == ["check"] and len(a) in (3, 4):
        check(a[1], a[2], a[3:] == ["--safetensors"])
    else:
        sys.exit(__doc__)
