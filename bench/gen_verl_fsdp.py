#!/usr/bin/python3
"""Generate a verl FSDP checkpoint (an actor saved with FSDP2, fp32 DTensor shards) for the ckptfs
benchmarks, and check a bf16 Hugging Face model against the values it holds.

  gen_verl_fsdp.py OUT              write the ~1 GiB (as bf16) Llama-shaped checkpoint into OUT
  gen_verl_fsdp.py --tiny OUT       the same with tiny shapes whose shards are uneven and empty
  gen_verl_fsdp.py --check OUT HF   check every tensor of the safetensors files in HF against
                                    the values of OUT (names, BF16, shapes, bytes)

Writing needs torch >= 2.4 (DTensor, init_device_mesh): run it with the python3 of the tests'
Debian 13 root (torch 2.6), as bench/verl_bench.sh does. --check needs numpy only (Debian's
/usr/bin/python3 on the host is enough).

What it writes is what verl (verl/utils/checkpoint/fsdp_checkpoint_manager.py) and torch 2.6
FSDP2 write for an actor, made the same way: W processes (default 8) form a gloo process group
(CPU, a file:// rendezvous), build the 1-D device mesh `init_device_mesh("cpu", (W,),
mesh_dim_names=("fsdp",))`, and each rank builds only its own shard of every parameter. A shard
follows FSDP2's rule (torch.chunk on dim 0): ceil(n/W) rows per rank, the last ranks short or
empty, every rank's storage padded with zeros to ceil(n/W) rows and the local tensor a view of its
first rows (as FSDP2's padded sharded parameters; torch.save writes the whole storage). Each
parameter becomes `DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=...,
stride=...)`; the state dict is an OrderedDict in the parameter order of transformers'
LlamaForCausalLM, with the `_metadata` (module prefixes, version 1) that `Module.state_dict()`
attaches; the specs and the mesh are hashed once, so their cached `_hash` is saved as in the
files of a trained model; then `torch.save(state_dict, "model_world_size_W_rank_R.pt")`:

  OUT/latest_checkpointed_iteration.txt       "1"
  OUT/global_step_1/actor/model_world_size_W_rank_R.pt
  OUT/global_step_1/actor/fsdp_config.json    {"FSDP_version": 2, "world_size": W}
  OUT/global_step_1/actor/huggingface/        config.json (LlamaForCausalLM, torch_dtype bfloat16,
                                              untied lm_head), generation_config.json,
                                              tokenizer.json (a placeholder)

No optimizer or extra_state files (verl writes them too; a reader of the weights ignores them).

Values: every element is a bf16 number (sign, exponent 117..126 and 7 mantissa bits taken from a
splitmix64 hash of (seed, tensor name, flat index); |x| in [2^-10, 1); norms positive) stored as
fp32, so fp32 -> bf16 (round to nearest even) is exact and gives the generated bf16 values back.
They depend on the global index only, not on W, and --check recomputes them with numpy.

Shapes (--tiny: hidden 64, 2 layers, 8 heads / 2 KV heads, ffn 20, vocab 250: with W=8 the
embedding's last rank is short (26 of 32 rows) and the ffn projections leave rank 7 empty):

  default: hidden 1536, 16 layers, 12 heads / 4 KV heads (head_dim 128), ffn 4608, vocab 32000,
           untied lm_head: 147 tensors, 538,756,608 parameters = 1,077,513,216 bytes in bf16
           (1.00 GiB); every shard even (no padding) at W=8; 8 shard files of 269,472,058
           bytes (2,155,026,432 bytes of fp32 data). 30-45 s on 2 CPUs, ~670 MiB peak RSS
           per rank process (~3.6 GB for all 8).

Options: --world-size W (default 8), --seed N (default 0; --check needs the same), --force.
Writes OUT.tmp-PID first and renames it to OUT at the end, so an existing OUT is complete. OUT
must not exist (--force replaces it).
"""

import argparse
import hashlib
import json
import math
import os
import resource
import shutil
import struct
import sys
import time
from collections import OrderedDict

import numpy as np

LLAMA_1G = dict(
    hidden_size=1536,
    num_hidden_layers=16,
    num_attention_heads=12,
    num_key_value_heads=4,
    intermediate_size=4608,
    vocab_size=32000,
    tie_word_embeddings=False,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    rms_norm_eps=1e-05,
    bos_token_id=1,
    eos_token_id=2,
)

LLAMA_TINY = dict(LLAMA_1G, hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=2, intermediate_size=20, vocab_size=250,
                  max_position_embeddings=512)

STEP = 1
ROLE = "actor"


def llama_tensors(cfg):
    """(name, shape) in the parameter order of transformers' LlamaForCausalLM."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gen_checkpoint
    return gen_checkpoint.llama_tensors(cfg)


def module_prefixes(cfg):
    """The prefixes Module.state_dict() records in `_metadata`, in module order."""
    out = ["", "model", "model.embed_tokens", "model.layers"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += [p, p + ".self_attn"] + [f"{p}.self_attn.{x}_proj" for x in "qkvo"]
        out += [p + ".mlp"] + [f"{p}.mlp.{x}_proj" for x in ("gate", "up", "down")]
        out += [p + ".mlp.act_fn", p + ".input_layernorm", p + ".post_attention_layernorm"]
    out += ["model.norm", "model.rotary_emb", "lm_head"]
    return out


def config_json(cfg):
    h = cfg["hidden_size"]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": cfg["bos_token_id"],
        "eos_token_id": cfg["eos_token_id"],
        "head_dim": h // cfg["num_attention_heads"],
        "hidden_act": "silu",
        "hidden_size": h,
        "initializer_range": 0.02,
        "intermediate_size": cfg["intermediate_size"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "mlp_bias": False,
        "num_attention_heads": cfg["num_attention_heads"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "pretraining_tp": 1,
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": cfg["rope_theta"],
        "tie_word_embeddings": cfg["tie_word_embeddings"],
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": cfg["vocab_size"],
    }


def cfg_from_config_json(c):
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "vocab_size", "tie_word_embeddings")
    cfg = {k: c[k] for k in keys}
    if c.get("head_dim"):
        cfg["head_dim"] = c["head_dim"]
    return cfg


# --- values --------------------------------------------------------------------------------------

M64 = (1 << 64) - 1


def tensor_key(seed, name):
    return int.from_bytes(hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest(), "little")


def bf16_bits(seed, name, start, count):
    """The bf16 bit patterns (uint16) of elements [start, start+count) of tensor NAME."""
    with np.errstate(over="ignore"):
        x = np.arange(start, start + count, dtype=np.uint64)
        x += np.uint64((tensor_key(seed, name) + 0x9E3779B97F4A7C15) & M64)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    mant = (x & np.uint64(0x7F)).astype(np.uint16)
    exp = (np.uint64(117) + (x >> np.uint64(8)) % np.uint64(10)).astype(np.uint16)
    bits = mant | (exp << np.uint16(7))
    if not name.endswith("norm.weight"):
        bits |= ((x >> np.uint64(63)).astype(np.uint16) << np.uint16(15))
    return bits


# --- writing (torch) -----------------------------------------------------------------------------

def shard_rows(n, world, rank):
    """FSDP2's dim-0 shard of N rows (torch.chunk): (first row, rows, padded rows)."""
    per = -(-n // world)
    start = min(rank * per, n)
    return start, min(per, n - start), per


def worker(rank, world, tmp, cfg, seed, init_file):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    role = os.path.join(tmp, f"global_step_{STEP}", ROLE)
    sd = OrderedDict()
    for name, shape in llama_tensors(cfg):
        start, rows, per = shard_rows(shape[0], world, rank)
        row = math.prod(shape[1:])
        padded = torch.zeros((per,) + tuple(shape[1:]), dtype=torch.float32)
        if rows > 0:
            bits = bf16_bits(seed, name, start * row, rows * row)
            vals = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float()
            padded[:rows].copy_(vals.view((rows,) + tuple(shape[1:])))
        local = padded[:rows]
        stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        sd[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                      shape=torch.Size(shape), stride=stride)
        # A trained model's specs have been hashed (sharding propagation caches them), and
        # so has the mesh: their cached `_hash` is in every real shard file.
        hash(sd[name]._spec)
    sd._metadata = OrderedDict((p, {"version": 1}) for p in module_prefixes(cfg))
    torch.save(sd, os.path.join(role, f"model_world_size_{world}_rank_{rank}.pt"))
    with open(os.path.join(tmp, f".maxrss.{rank}"), "w") as f:
        f.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    dist.barrier()
    dist.destroy_process_group()


def generate(dest, cfg, world, seed):
    # Imported once here, not in every rank: DTensor's first operations import torch._dynamo
    # (sympy...), ~3 s of CPU per process.
    import torch._dynamo  # noqa: F401
    import torch.distributed.device_mesh  # noqa: F401
    import torch.distributed.tensor  # noqa: F401
    import torch.multiprocessing as mp

    tmp = f"{dest}.tmp-{os.getpid()}"
    os.makedirs(tmp)
    try:
        role = os.path.join(tmp, f"global_step_{STEP}", ROLE)
        os.makedirs(os.path.join(role, "huggingface"))
        init_file = os.path.join(tmp, ".rendezvous")
        # fork: the ranks share the parent's imported modules.
        mp.start_processes(worker, args=(world, tmp, cfg, seed, init_file), nprocs=world,
                           join=True, start_method="fork")
        rss = []
        for r in range(world):
            p = os.path.join(tmp, f".maxrss.{r}")
            with open(p) as f:
                rss.append(int(f.read()))
            os.remove(p)
        if os.path.exists(init_file):
            os.remove(init_file)
        # As verl: fsdp_config.json and huggingface/ from rank 0, the tracker from the trainer.
        with open(os.path.join(role, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": 2, "world_size": world}, f, indent=4)
        hf = os.path.join(role, "huggingface")
        with open(os.path.join(hf, "config.json"), "w") as f:
            json.dump(config_json(cfg), f, indent=2)
            f.write("\n")
        with open(os.path.join(hf, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}, f,
                      indent=2)
            f.write("\n")
        with open(os.path.join(hf, "tokenizer.json"), "w") as f:
            json.dump({"version": "1.0", "model": {"type": "BPE"}}, f)
        with open(os.path.join(tmp, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(STEP))
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return rss


# --- checking (numpy) ----------------------------------------------------------------------------

def read_safetensors_dir(d):
    """{name: (path, dtype, shape, data start, data end)} of every *.safetensors file in D."""
    out = {}
    for fn in sorted(os.listdir(d)):
        if not fn.endswith(".safetensors"):
            continue
        p = os.path.join(d, fn)
        with open(p, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            head = json.loads(f.read(n))
        for k, v in head.items():
            if k == "__metadata__":
                continue
            if k in out:
                sys.exit(f"gen_verl_fsdp: {k} is in two files of {d}")
            a, b = v["data_offsets"]
            out[k] = (p, v["dtype"], tuple(v["shape"]), 8 + n + a, 8 + n + b)
    return out


def check(out, hf, seed):
    role = os.path.join(out, f"global_step_{STEP}", ROLE)
    with open(os.path.join(role, "huggingface", "config.json")) as f:
        cfg = cfg_from_config_json(json.load(f))
    want = llama_tensors(cfg)
    have = read_safetensors_dir(hf)
    names = {n for n, _ in want}
    if set(have) != names:
        sys.exit(f"gen_verl_fsdp: tensor names differ: missing {sorted(names - set(have))[:4]}, "
                 f"extra {sorted(set(have) - names)[:4]}")
    fds = {}
    total = 0
    try:
        for name, shape in want:
            p, dtype, got_shape, a, b = have[name]
            if dtype != "BF16" or got_shape != tuple(shape):
                sys.exit(f"gen_verl_fsdp: {name}: {dtype} {list(got_shape)}, want BF16 {list(shape)}")
            if p not in fds:
                fds[p] = os.open(p, os.O_RDONLY)
            n = math.prod(shape)
            data = os.pread(fds[p], b - a, a)
            if b - a != 2 * n or len(data) != b - a or not np.array_equal(
                    np.frombuffer(data, dtype="<u2"), bf16_bits(seed, name, 0, n)):
                sys.exit(f"gen_verl_fsdp: {name}: values differ from the generated ones")
            total += b - a
    finally:
        for fd in fds.values():
            os.close(fd)
    return len(want), total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the run directory to write (or, with --check, to check against)")
    ap.add_argument("hf", nargs="?", help="with --check: the directory of bf16 safetensors files")
    ap.add_argument("--check", action="store_true",
                    help="check HF's tensors against OUT's values instead of writing")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (uneven and empty shards)")
    ap.add_argument("--world-size", type=int, default=8, help="FSDP ranks (default 8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="replace OUT if it exists")
    args = ap.parse_args()
    t0 = time.monotonic()
    if args.check:
        if not args.hf:
            ap.error("--check needs OUT and HF")
        n, total = check(args.out, args.hf, args.seed)
        print(f"gen_verl_fsdp: {args.hf}: {n} tensors, {total} bytes: names, BF16, shapes and values "
              f"equal to {args.out}'s ({time.monotonic() - t0:.1f} s)")
        return
    if args.hf:
        ap.error("HF is only for --check")
    if args.world_size < 1:
        ap.error("--world-size must be >= 1")
    cfg = LLAMA_TINY if args.tiny else LLAMA_1G
    dest = os.path.abspath(args.out)
    if os.path.exists(dest):
        if not args.force:
            sys.exit(f"gen_verl_fsdp: {dest} exists (use --force to replace it)")
        shutil.rmtree(dest)
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    rss = generate(dest, cfg, args.world_size, args.seed)
    dt = time.monotonic() - t0
    tensors = llama_tensors(cfg)
    params = sum(math.prod(s) for _, s in tensors)
    role = os.path.join(dest, f"global_step_{STEP}", ROLE)
    disk = sum(os.path.getsize(os.path.join(role, f"model_world_size_{args.world_size}_rank_{r}.pt"))
               for r in range(args.world_size))
    print(f"gen_verl_fsdp: {role}: FSDP2, W={args.world_size}, {len(tensors)} tensors, {params} "
          f"parameters ({2 * params} bytes = {2 * params / 2**30:.2f} GiB as bf16), shard files "
          f"{disk} bytes; {dt:.1f} s; peak RSS per rank {min(rss) / 1024:.0f}-{max(rss) / 1024:.0f} "
          f"MiB")


if __name__ == "__main__":
    main()
