#!/usr/bin/python3
"""torchtitan checkpoints written by torch itself (run in the sid root: torch 2.14, transformers 5).

torchtitan cannot run here (it wants a newer torch and its own data and model stack), so the
files follow its code: its model's parameter names (torchtitan/models/<model>/model/), its
state-dict adapter's from_hf (torchtitan/models/<model>/model/state_dict_adapter.py: Llama 3's
wq/wk rows reverse-permuted per head, Qwen3's and DeepSeek-V3's names as they are, the routed
experts stacked into [E, F, H] / [E, H, F] tensors), and its checkpointer's save
(torchtitan/components/checkpoint.py: dcp.save of the model's entries flattened to the top level
beside the optimizer, lr_scheduler, dataloader and train_state states, into
checkpoint/step-N/), each tensor a DTensor sharded on its first dim over 2 gloo ranks on the CPU,
as FSDP2 shards it.

  titan_dcp.py build OUT
      for each family (Llama 3, Qwen3, DeepSeek-V3): OUT/FAMILY-ref, the Hugging Face model
      saved by save_pretrained in fp32, and OUT/FAMILY-titan/checkpoint/step-10/ its torchtitan
      checkpoint; config.json beside step-10/ (in checkpoint/) except for Qwen3 (given with
      -o hf_config=OUT/qwen3-ref/config.json).
  titan_dcp.py hostile OUT
      broken single-rank saves of the Llama and Qwen3 states under OUT/bad/NAME/ (names say how).
  titan_dcp.py check REF HF_DIR DTYPE ...
      as trainer_dcp.py's check.
"""
import io
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import transformers

from trainer_dcp import check  # the logits check is the one of the Trainer checkpoints

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
            tie_word_embeddings=False)
FAMILIES = {
    # vocab 255: the shards of the embedding are uneven (128 + 127 rows)
    "llama": ("LlamaConfig", dict(vocab_size=255)),
    "qwen3": ("Qwen3Config", dict(vocab_size=256, head_dim=32)),
    "deepseek_v3": ("DeepseekV3Config", dict(
        vocab_size=256, num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4,
        n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, n_group=1, topk_group=1,
        q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        norm_topk_prob=True, routed_scaling_factor=2.5)),
}
WORLD = 2
STEP = 10


def make_model(family):
    cls, fields = FAMILIES[family]
    torch.manual_seed(0)
    cfg = getattr(transformers, cls)(**{**BASE, **fields})
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # random values where transformers puts constants (norms 1, biases 0)
        for p in model.parameters():
            p.normal_(0, 0.3 if p.dim() == 1 else 0.05)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.3)
    return model


def reverse_permute(w, heads):
    """torchtitan's Llama3StateDictAdapter._reverse_permute (Hugging Face's halves to its pairs)."""
    rows, cols = w.shape
    return w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def to_titan(family, model):
    """The adapters' from_hf: the model's state dict under torchtitan's names and shapes."""
    cfg = model.config
    sd = model.state_dict()
    out = {"tok_embeddings.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"],
           "output.weight": sd["lm_head.weight"]}
    for i in range(cfg.num_hidden_layers):
        hf, tt = f"model.layers.{i}.", f"layers.{i}."
        out[tt + "attention_norm.weight"] = sd[hf + "input_layernorm.weight"]
        out[tt + "ffn_norm.weight"] = sd[hf + "post_attention_layernorm.weight"]
        out[tt + "attention.wo.weight"] = sd[hf + "self_attn.o_proj.weight"]
        if family == "deepseek_v3":
            for t, h in [("wq_a", "q_a_proj"), ("q_norm", "q_a_layernorm"), ("wq_b", "q_b_proj"),
                         ("wkv_a", "kv_a_proj_with_mqa"), ("kv_norm", "kv_a_layernorm"), ("wkv_b", "kv_b_proj")]:
                out[f"{tt}attention.{t}.weight"] = sd[f"{hf}self_attn.{h}.weight"]
        else:
            q, k = sd[hf + "self_attn.q_proj.weight"], sd[hf + "self_attn.k_proj.weight"]
            if family == "llama":  # Llama 3's adapter only
                q, k = reverse_permute(q, cfg.num_attention_heads), reverse_permute(k, cfg.num_key_value_heads)
            out[tt + "attention.wq.weight"], out[tt + "attention.wk.weight"] = q, k
            out[tt + "attention.wv.weight"] = sd[hf + "self_attn.v_proj.weight"]
        if family == "qwen3":
            out[tt + "attention.q_norm.weight"] = sd[hf + "self_attn.q_norm.weight"]
            out[tt + "attention.k_norm.weight"] = sd[hf + "self_attn.k_norm.weight"]
        if hf + "mlp.gate.weight" in sd:  # DeepSeek-V3's MoE layers
            F = cfg.moe_intermediate_size
            if hf + "mlp.experts.gate_up_proj" in sd:  # transformers 5 holds them fused: [E, 2F, H]
                gate_up = sd[hf + "mlp.experts.gate_up_proj"]
                w1, w3, w2 = gate_up[:, :F], gate_up[:, F:], sd[hf + "mlp.experts.down_proj"]
            else:
                stack = lambda p: torch.stack([sd[f"{hf}mlp.experts.{e}.{p}.weight"] for e in range(cfg.n_routed_experts)])
                w1, w3, w2 = stack("gate_proj"), stack("up_proj"), stack("down_proj")
            out[tt + "moe.experts.w1"], out[tt + "moe.experts.w3"], out[tt + "moe.experts.w2"] = w1, w3, w2
            out[tt + "moe.router.gate.weight"] = sd[hf + "mlp.gate.weight"]
            out[tt + "moe.expert_bias"] = sd[hf + "mlp.gate.e_score_correction_bias"]
            for t, h in [("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")]:
                out[f"{tt}moe.shared_experts.{t}.weight"] = sd[f"{hf}mlp.shared_experts.{h}.weight"]
        else:
            for t, h in [("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")]:
                out[f"{tt}feed_forward.{t}.weight"] = sd[f"{hf}mlp.{h}.weight"]
    if family == "llama":  # torchtitan 0.1's Llama kept its rotary table, complex64, persistent
        head_dim = cfg.hidden_size // cfg.num_attention_heads
        freqs = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(2 * cfg.max_position_embeddings).float(), freqs)
        out["freqs_cis"] = torch.polar(torch.ones_like(angles), angles)
    return {k: v.contiguous().clone() for k, v in out.items()}


def checkpointer_state(model_state, shard):
    """What torchtitan's CheckpointManager hands dcp.save: the model's entries flattened to the
    top level, the other states nested under their names. A buffer (Llama's rotary table of
    torchtitan 0.1) is not sharded: FSDP shards parameters only."""
    state = {k: v if k == "freqs_cis" else shard(v) for k, v in model_state.items()}
    first = next(iter(model_state))
    state["optimizer"] = {f"state.{first}.exp_avg": shard(torch.zeros_like(model_state[first])),
                          f"param_groups.{first}.lr": 3e-4}
    state["lr_scheduler"] = {"last_epoch": STEP, "_step_count": STEP + 1}
    state["dataloader"] = {"dp_rank_0": io.BytesIO(b"position 640")}
    state["train_state"] = {"step": torch.tensor(STEP, dtype=torch.int32), "ntokens_seen": torch.tensor(640)}
    return state


def rank_main(rank, out, init_file):
    """Every family's checkpoint, in one process group (starting one costs more than a save)."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (WORLD,))
    for family in FAMILIES:
        titan = to_titan(family, make_model(family))
        dcp.save(checkpointer_state(titan, lambda t: distribute_tensor(t, mesh, [Shard(0)])),
                 checkpoint_id=f"{out}/{family}-titan/checkpoint/step-{STEP}")
    dist.barrier()
    dist.destroy_process_group()


def build(out):
    for family in FAMILIES:
        make_model(family).save_pretrained(f"{out}/{family}-ref")
        folder = f"{out}/{family}-titan/checkpoint"
        os.makedirs(f"{folder}/step-{STEP}")
        if family != "qwen3":
            make_model(family).config.save_pretrained(folder)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(out, f"{tmp}/init"), nprocs=WORLD, join=True)


def save_bare(state, out, config_from):
    """One rank's save of STATE into OUT/checkpoint/step-10, config.json beside it."""
    step_dir = f"{out}/checkpoint/step-{STEP}"
    dcp.save(state, storage_writer=dcp.FileSystemWriter(step_dir), no_dist=True)
    make_model(config_from).config.save_pretrained(f"{out}/checkpoint")


def hostile(out):
    llama = to_titan("llama", make_model("llama"))
    qwen3 = to_titan("qwen3", make_model("qwen3"))
    same = lambda t: t

    state = dict(llama)
    del state["layers.1.ffn_norm.weight"]
    save_bare(checkpointer_state(state, same), f"{out}/missing-tensor", "llama")

    state = dict(llama)
    state["layers.0.attention.wq.weight"] = state["layers.0.attention.wq.weight"][:-1].clone()
    save_bare(checkpointer_state(state, same), f"{out}/odd-wq-rows", "llama")

    state = dict(llama)
    state["layers.0.attention_norm.weight"] = torch.ones(65)
    save_bare(checkpointer_state(state, same), f"{out}/wrong-norm-shape", "llama")

    state = dict(llama)  # a third layer of a 2-layer model
    state.update({k.replace("layers.1.", "layers.2."): v for k, v in llama.items() if k.startswith("layers.1.")})
    save_bare(checkpointer_state(state, same), f"{out}/extra-layer", "llama")

    state = dict(llama)
    state["layers.0.attention.wz.weight"] = torch.zeros(4, 4)
    save_bare(checkpointer_state(state, same), f"{out}/unknown-name", "llama")

    # torchtitan's MoE keeps a load-balancing bias it routes with; a Qwen3 router has none
    state = dict(qwen3)
    state["layers.0.moe.expert_bias"] = torch.zeros(4)
    save_bare(checkpointer_state(state, same), f"{out}/qwen3-expert-bias", "qwen3")

    # the config of a model torchtitan's names are not read for
    save_bare(checkpointer_state(dict(llama), same), f"{out}/unknown-model-type", "llama")
    path = f"{out}/unknown-model-type/checkpoint/config.json"
    import json
    cfg = json.load(open(path))
    cfg["model_type"] = "mistral"
    json.dump(cfg, open(path, "w"))

    # no config anywhere
    dcp.save(checkpointer_state(dict(llama), same), storage_writer=dcp.FileSystemWriter(f"{out}/no-config/step-{STEP}"),
             no_dist=True)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "build":
        build(sys.argv[2])
    elif cmd == "hostile":
        hostile(sys.argv[2])
    else:
        check(sys.argv[2:])
