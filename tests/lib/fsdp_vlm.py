#!/usr/bin/python3
"""verl FSDP2 saves of tiny vision-language models (run in the sid root: transformers 5, torch 2.x).

  fsdp_vlm.py build OUT
      OUT/NAME/hf: the model saved by transformers' save_pretrained in bf16; OUT/NAME/actor: the
      same model, upcast to fp32 as verl trains it, wrapped by FSDP2's fully_shard on a ("fsdp",)
      mesh of 2 gloo ranks on the CPU and saved as verl's FSDPCheckpointManager saves an actor:
      each rank's model.state_dict() (DTensor shards under the module names the model holds in
      memory: model.language_model.*, model.visual.*) in model_world_size_2_rank_R.pt,
      fsdp_config.json, and huggingface/ with the model's config.json. NAME is qwen2_5_vl (untied
      embeddings, the tensors saved under the release's names), qwen3_vl (tied embeddings, saved
      under the module names) and gemma3 (Gemma 3's VLM, tied, saved under language_model.model.,
      vision_tower., multi_modal_projector.). OUT/badmesh: qwen2_5_vl's actor whose rank 0 file's
      device mesh has a rank map of one rank under its layout of two. Also qwen3_vl_moe
      (Qwen3-VL-MoE: its experts fused in memory and as saved) and glm4v_moe (GLM-4.5V: its
      experts fused in memory, saved one by one; its router bias kept fp32 as from_pretrained
      keeps it), both untied.
  fsdp_vlm.py check ORIG HF_DIR [ORIG HF_DIR ...]
      in one process, for each pair: HF_DIR holds ORIG's tensors bit for bit (vlm.py samehf) and
      gives its logits on an image + text input (vlm.py logits; GLM-4.5V's with glm4v_inputs,
      Gemma 3's as gemma3.py vlm-logits). Prints "PASS what" or "FAIL what: why".
"""
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemma3  # noqa: E402  (the tiny models' sizes)
import vlm  # noqa: E402

WORLD = 2
NAMES = ("qwen2_5_vl", "qwen3_vl", "gemma3", "qwen3_vl_moe", "glm4v_moe")
# GLM-4.5V's language model: GLM-4.1V's heads and rope, one dense layer, then 4 routed experts and
# a shared one
GLM4V_MOE_TEXT = dict(vlm.GLM4V_TEXT, num_hidden_layers=2, moe_intermediate_size=32, n_routed_experts=4,
                      num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1)


def make(name):
    from transformers import (Gemma3Config, Gemma3ForConditionalGeneration, Glm4vMoeConfig,
                              Glm4vMoeForConditionalGeneration, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                              Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLMoeConfig,
                              Qwen3VLMoeForConditionalGeneration)
    torch.manual_seed(0)
    if name == "gemma3":
        model = Gemma3ForConditionalGeneration(Gemma3Config(text_config=dict(gemma3.TEXT),
                                                            vision_config=dict(gemma3.VISION), **gemma3.VLM))
    elif name == "qwen2_5_vl":
        cfg = Qwen2_5_VLConfig(text_config=dict(vlm.TEXT), vision_config=dict(vlm.VISION), **vlm.TOKENS)
        model = Qwen2_5_VLForConditionalGeneration(cfg)
    elif name == "qwen3_vl":  # Qwen3-VL's small releases tie the head to the embedding
        cfg = Qwen3VLConfig(text_config=dict(vlm.QWEN3_TEXT), vision_config=dict(vlm.QWEN3_VISION),
                            tie_word_embeddings=True, **vlm.TOKENS)
        model = Qwen3VLForConditionalGeneration(cfg)
    elif name == "qwen3_vl_moe":  # experts fused in memory and on disk
        cfg = Qwen3VLMoeConfig(text_config=dict(vlm.QWEN3_MOE), vision_config=dict(vlm.QWEN3_VISION),
                               tie_word_embeddings=False, **vlm.TOKENS)
        model = Qwen3VLMoeForConditionalGeneration(cfg)
    else:  # GLM-4.5V: experts fused in memory, saved one by one
        cfg = Glm4vMoeConfig(text_config=dict(GLM4V_MOE_TEXT), vision_config=dict(vlm.GLM4V_VISION),
                             **vlm.GLM4V_TOKENS)
        model = Glm4vMoeForConditionalGeneration(cfg)
    return randomized(model)


def randomized(model):
    """MODEL in bf16, its norms random, its fp32-kept buffers (a router bias) random fp32."""
    model = model.to(torch.bfloat16)
    for key, buf in model.named_buffers():  # GLM-4.5V's router bias: fp32, as from_pretrained keeps it
        if any(key.endswith(k) for k in getattr(model, "_keep_in_fp32_modules_strict", None) or ()):
            buf.data = (0.1 * torch.randn(buf.shape)).float()
    with torch.no_grad():  # random norms, so a norm served from the wrong tensor shows
        for key, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif key.endswith("mm_input_projection_weight"):  # zero at first: no image in the logits
                p.copy_(0.2 * torch.randn_like(p))
    return model


def worker(rank, hf, role, auto_class):
    import torch.distributed as dist
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{role}/.rdv", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("fsdp",))
    model = getattr(transformers, auto_class).from_pretrained(hf, dtype=torch.float32)
    fully_shard(model, mesh=mesh)
    torch.save(model.state_dict(), os.path.join(role, f"model_world_size_{WORLD}_rank_{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def save_actor(model, hf, role, auto_class):
    """MODEL saved by save_pretrained in HF, and as verl saves an actor in ROLE: loaded from HF in
    fp32 by transformers' AUTO_CLASS on each of 2 gloo ranks, wrapped by fully_shard. Returns the
    names of rank 0's state dict."""
    import torch.multiprocessing as mp
    model.save_pretrained(hf)
    os.makedirs(f"{role}/huggingface")
    mp.start_processes(worker, args=(hf, role, auto_class), nprocs=WORLD, join=True, start_method="fork")
    os.remove(f"{role}/.rdv")
    for f in ("config.json", "generation_config.json"):
        shutil.copy(f"{hf}/{f}", f"{role}/huggingface/{f}")
    with open(f"{role}/fsdp_config.json", "w") as f:
        json.dump({"FSDP_version": 2, "world_size": WORLD}, f, indent=4)
    return torch.load(f"{role}/model_world_size_{WORLD}_rank_0.pt", weights_only=False).keys()


def build(out):
    for name in NAMES:
        keys = save_actor(make(name), f"{out}/{name}/hf", f"{out}/{name}/actor", "AutoModelForImageTextToText")
        if not any(k.startswith("model.language_model.") for k in keys):
            sys.exit(f"{name}: the FSDP state dict is not under the module names (model.language_model.*)")
        print(f"{name}: {len(keys)} keys, e.g. {sorted(keys)[0]}")
    shutil.copytree(f"{out}/qwen2_5_vl/actor", f"{out}/badmesh")
    path = f"{out}/badmesh/model_world_size_{WORLD}_rank_0.pt"
    state = torch.load(path, weights_only=False)
    next(iter(state.values()))._spec.mesh._rank_map = torch.tensor([0], dtype=torch.int32)  # shared by all
    torch.save(state, path)


def check(pairs):
    for orig, hf_dir in pairs:
        vlm.samehf(orig, [hf_dir])
        with open(f"{orig}/config.json") as f:
            arch = json.load(f)["architectures"][0]
        if arch == "Gemma3ForConditionalGeneration":
            gemma3.vlm_logits(orig, hf_dir)
        elif arch.startswith("Glm4v"):
            vlm.logits(orig, [hf_dir], arch, vlm.glm4v_inputs)
        else:
            vlm.logits(orig, [hf_dir])


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"] and len(sys.argv) == 3:
        build(sys.argv[2])
    elif sys.argv[1:2] == ["check"] and len(sys.argv) % 2 == 0:
        check(zip(sys.argv[2::2], sys.argv[3::2]))
    else:
        sys.exit(__doc__)
