#!/usr/bin/python3
"""Hugging Face Trainer / Accelerate FSDP checkpoints written by torch itself (run in the sid
root: torch 2.14, transformers 5), and the checks of what ckptfs serves from them.

  trainer_dcp.py build OUT
      for each family (a tiny Llama, a tiny Qwen3-MoE): OUT/FAMILY-ref, the model saved by
      save_pretrained in fp32; OUT/FAMILY-fsdp2/checkpoint-10/, the same model wrapped in FSDP2
      (fully_shard per decoder layer and at the root) across 2 gloo ranks on the CPU and saved
      as Accelerate's save_fsdp_model does with SHARDED_STATE_DICT: dcp.save({"model":
      get_model_state_dict(model)}) into pytorch_model_fsdp_0/, with config.json beside it (as
      the Trainer writes) and an optimizer_0/ saved the same way. For Llama also
      OUT/llama-fsdp1/checkpoint-10/ (FSDP1, SHARDED_STATE_DICT, model.state_dict()) when FSDP1
      runs on the CPU, and OUT/llama-bare/, a DCP save of the plain state dict with config.json;
      the same of a Llama with tied embeddings: OUT/llamatied-ref, OUT/llamatied-bare.
      Prints "built NAME" or "unbuilt NAME: why" lines.
  trainer_dcp.py hostile SRC MOE_SRC OUT
      copies of the FSDP2 checkpoints SRC (Llama) and MOE_SRC (Qwen3-MoE) with one thing broken
      each (their names say what).
  trainer_dcp.py bench OUT WORLD
      OUT/checkpoint-10/: a Llama of 1.11 GB in fp32 (hidden 1024, 18 layers, vocab 32000) in
      FSDP2 across WORLD gloo ranks, saved as Accelerate's save_fsdp_model does (the model
      only: no optimizer_0/), for bench/trainer_bench.sh. Built on the meta device and filled
      shard by shard, so no rank holds the whole model.
  trainer_dcp.py merge CKPT_DIR OUT_FILE
      the reference merge: what `accelerate merge-weights CKPT_DIR/pytorch_model_fsdp_0 OUT`
      does (Accelerate 1.x's _distributed_checkpoint_to_merged_weights: the whole state dict
      loaded through torch DCP without a process group, the one top-level key unwrapped, one
      safetensors file written).
  trainer_dcp.py check REF HF_DIR DTYPE [REF HF_DIR DTYPE ...]
      REF (save_pretrained's copy) loaded as DTYPE and HF_DIR, both loaded by transformers, have
      the same weights and give the same logits (torch.equal). Prints "PASS what" or "FAIL what: why" lines.
"""
import os
import pickle
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import transformers

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
            tie_word_embeddings=False)
# vocab 255: FSDP's row shards of the embedding are uneven (128 + 127)
FAMILIES = {
    "llama": ("LlamaConfig", dict(vocab_size=255)),
    # the head tied to the embedding: the state dict has both, save_pretrained writes one
    "llamatied": ("LlamaConfig", dict(vocab_size=255, tie_word_embeddings=True)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(vocab_size=256, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=32, decoder_sparse_step=1, head_dim=16,
                                         norm_topk_prob=False)),
}
WORLD = 2


def make_model(family):
    cls, fields = FAMILIES[family]
    torch.manual_seed(0)
    cfg = getattr(transformers, cls)(**{**BASE, **fields})
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # random values where transformers puts constants (norms 1)
        for p in model.parameters():
            p.normal_(0, 0.3 if p.dim() == 1 else 0.05)
    return model


def rank_main(rank, family, version, ckpt, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    model = make_model(family)
    if version == 2:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (WORLD,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
        optim = torch.optim.AdamW(model.parameters())
        optim_state = get_optimizer_state_dict(model, optim)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import StateDictType
        model = FSDP(model, device_id=torch.device("cpu"), use_orig_params=True)
        with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
            state = model.state_dict()
        optim_state = None
    dcp.save({"model": state}, storage_writer=dcp.FileSystemWriter(f"{ckpt}/pytorch_model_fsdp_0"))
    if optim_state is not None:
        dcp.save({"optimizer": optim_state}, storage_writer=dcp.FileSystemWriter(f"{ckpt}/optimizer_0"))
    dist.barrier()
    dist.destroy_process_group()


def save_sharded(family, version, ckpt):
    os.makedirs(ckpt)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(family, version, ckpt, f"{tmp}/init"), nprocs=WORLD, join=True)
    make_model(family).config.save_pretrained(ckpt)
    with open(f"{ckpt}/trainer_state.json", "w") as f:
        f.write('{"global_step": 10}\n')


def build(out):
    for family in FAMILIES:
        jobs = [(f"{family}-ref", lambda: make_model(family).save_pretrained(f"{out}/{family}-ref"))]
        if family != "llamatied":
            jobs.append((f"{family}-fsdp2", lambda: save_sharded(family, 2, f"{out}/{family}-fsdp2/checkpoint-10")))
        if family == "llama":
            jobs.append(("llama-fsdp1", lambda: save_sharded(family, 1, f"{out}/llama-fsdp1/checkpoint-10")))
        if family.startswith("llama"):
            jobs.append((f"{family}-bare", lambda: bare(family, f"{out}/{family}-bare")))
        for name, job in jobs:
            try:
                job()
                print(f"built {name}", flush=True)
            except Exception as e:  # reported, not fatal: the test says which could not be built
                print(f"unbuilt {name}: {type(e).__name__}: {e}".splitlines()[0], flush=True)


def bare(family, out):
    model = make_model(family)
    dcp.save(model.state_dict(), storage_writer=dcp.FileSystemWriter(out), no_dist=True)
    model.config.save_pretrained(out)


BENCH_SHAPE = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=18, num_attention_heads=16,
                   num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096)


def bench_rank(rank, world, ckpt, init_file):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    cfg = transformers.LlamaConfig(**{**BASE, **BENCH_SHAPE})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    torch.manual_seed(rank)
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().normal_(0, 0.3 if p.dim() == 1 else 0.05)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
    dcp.save({"model": state}, storage_writer=dcp.FileSystemWriter(f"{ckpt}/pytorch_model_fsdp_0"))
    dist.barrier()
    dist.destroy_process_group()


def bench(out, world):
    ckpt = f"{out}/checkpoint-10"
    os.makedirs(ckpt)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(bench_rank, args=(world, ckpt, f"{tmp}/init"), nprocs=world, join=True)
    cfg = transformers.LlamaConfig(**{**BASE, **BENCH_SHAPE})
    cfg.save_pretrained(ckpt)
    with open(f"{ckpt}/trainer_state.json", "w") as f:
        f.write('{"global_step": 10}\n')
    with torch.device("meta"):
        n = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(cfg).parameters())
    print(f"built a Llama of {n} parameters ({n * 4} bytes in fp32), FSDP2 over {world} ranks")


def merge(ckpt, out):
    import torch.distributed.checkpoint.format_utils as fmt
    from safetensors.torch import save_file
    state = {}
    fmt._load_state_dict(state, storage_reader=dcp.FileSystemReader(f"{ckpt}/pytorch_model_fsdp_0"),
                         planner=fmt._EmptyStateDictLoadPlanner(), no_dist=True)
    if len(state) == 1:
        state = state[next(iter(state))]
    save_file(state, out, metadata={"format": "pt"})


def rewrite_metadata(path, change):
    with open(path, "rb") as f:
        md = pickle.load(f)
    change(md)
    with open(path, "wb") as f:
        pickle.dump(md, f)


def hostile(src, moe_src, out):
    """Each copy broken in one way; the name says how."""
    key = "model.model.embed_tokens.weight"

    def copy(name, source=src):
        dst = f"{out}/{name}"
        shutil.copytree(source, dst)
        return dst, f"{dst}/pytorch_model_fsdp_0/.metadata"

    dst, _ = copy("missing-rank")
    os.remove(f"{dst}/pytorch_model_fsdp_0/__1_0.distcp")

    _, md = copy("missing-chunk")
    rewrite_metadata(md, lambda m: m.state_dict_metadata[key].chunks.pop())

    def overlap(m):
        chunks = m.state_dict_metadata[key].chunks
        chunks[1] = chunks[0]
    _, md = copy("overlapping-chunks")
    rewrite_metadata(md, overlap)

    def outside(m):
        for index, info in m.storage_data.items():
            if index.fqn == key:
                info.offset += 1 << 40
    _, md = copy("chunk-outside-file")
    rewrite_metadata(md, outside)

    # a chunk of the fused experts [E, 2F, H] that cuts the second dim (FSDP cuts the first)
    def cut(m):
        fused = "model.model.layers.0.mlp.experts.gate_up_proj"
        chunk = m.state_dict_metadata[fused].chunks[1]
        chunk.offsets = torch.Size([0, 32, 0])
        chunk.sizes = torch.Size([2, 32, chunk.sizes[2]])
    _, md = copy("chunk-cuts-dim-1", moe_src)
    rewrite_metadata(md, cut)

    # a value DCP stores as pickled bytes where a weight belongs
    dst = f"{out}/bytes-entry"
    state = make_model("llama").state_dict()
    state["model.norm.weight"] = "not a tensor"
    dcp.save(state, storage_writer=dcp.FileSystemWriter(dst), no_dist=True)
    shutil.copy(f"{src}/config.json", dst)


def safetensors_names(directory):
    from safetensors import safe_open
    names = set()
    for f in os.listdir(directory):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(directory, f), "pt") as st:
                names.update(st.keys())
    return names


def check(triples):
    ids = torch.tensor([[1, 5, 9, 42, 100, 7, 3, 250]])
    for i in range(0, len(triples), 3):
        ref, hf, dtype = triples[i:i + 3]
        what = f"{hf} ({dtype}): transformers gives the weights and logits of {os.path.basename(ref)} loaded as {dtype}"
        try:
            want_dtype = getattr(torch, {"bf16": "bfloat16", "fp32": "float32"}[dtype])
            # cast as transformers casts at load (a model cast after loading keeps its rotary
            # buffers in fp32: its bf16 logits differ from a bf16 load's)
            a = transformers.AutoModelForCausalLM.from_pretrained(ref, dtype=want_dtype)
            b = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype="auto")
            if b.dtype != want_dtype:
                raise AssertionError(f"hf/ loads as {b.dtype}")
            # a tied head: save_pretrained leaves lm_head.weight out, and so must hf/
            heads = ["lm_head.weight" in safetensors_names(d) for d in (ref, hf)]
            if heads[0] != heads[1]:
                raise AssertionError(f"lm_head.weight in save_pretrained's copy: {heads[0]}, in hf/: {heads[1]}")
            sa, sb = a.state_dict(), b.state_dict()
            differ = [k for k in sa if k not in sb or not torch.equal(sa[k], sb[k])]
            if differ or len(sa) != len(sb):
                raise AssertionError(f"weights differ: {differ[:3]} ({len(sa)} and {len(sb)} tensors)")
            with torch.no_grad():
                la, lb = a(ids).logits, b(ids).logits
            if not torch.equal(la, lb):
                raise AssertionError(f"max difference {(la.float() - lb.float()).abs().max().item()}")
            print(f"PASS {what}", flush=True)
        except Exception as e:
            print(f"FAIL {what}: {type(e).__name__}: {e}".splitlines()[0], flush=True)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "build":
        build(sys.argv[2])
    elif cmd == "hostile":
        hostile(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "bench":
        bench(sys.argv[2], int(sys.argv[3]))
    elif cmd == "merge":
        merge(sys.argv[2], sys.argv[3])
    else:
        check(sys.argv[2:])
