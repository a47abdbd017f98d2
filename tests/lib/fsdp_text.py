#!/usr/bin/python3
"""verl FSDP2 saves of tiny text MoE models (run in the sid root: transformers 5, torch 2.x).

  fsdp_text.py build OUT
      OUT/NAME/hf: the model saved by transformers' save_pretrained in bf16 (its routed experts,
      held fused in memory, written one by one: mlp.experts.{e}.gate_proj.weight, up_proj,
      down_proj); OUT/NAME/actor: the same model saved as verl saves an actor (fsdp_vlm.py's
      save_actor: each rank's model.state_dict(), the experts fused). NAME is qwen3_moe
      (Qwen3MoeForCausalLM), deepseek_v3 (DeepseekV3ForCausalLM: one dense layer, a shared
      expert, its router bias kept fp32 as from_pretrained keeps it) and glm4_moe
      (Glm4MoeForCausalLM: DeepSeek-V3's MoE under GLM's attention) and mixtral
      (MixtralForCausalLM: saved under block_sparse_moe., the experts as w1, w3, w2).
  fsdp_text.py check ORIG HF_DIR [ORIG HF_DIR ...]
      in one process, for each pair: HF_DIR holds ORIG's tensors bit for bit (vlm.py samehf) and
      transformers gives ORIG's weights and logits from it (trainer_dcp.py check). Prints "PASS
      what" or "FAIL what: why".
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fsdp_vlm  # noqa: E402
import trainer_dcp  # noqa: E402
import vlm  # noqa: E402

# vocab 256: trainer_dcp.py's check feeds token ids up to 250
BASE = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, tie_word_embeddings=False, num_experts_per_tok=2,
            moe_intermediate_size=32)
MODELS = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(intermediate_size=96, num_experts=4, head_dim=16, decoder_sparse_step=1)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    # multi-latent attention: a key and value per head
                    dict(intermediate_size=96, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
                         first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                         qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1)),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                 dict(intermediate_size=96, head_dim=16, n_routed_experts=4, n_shared_experts=1,
                      first_k_dense_replace=1, n_group=1, topk_group=1)),
    # held as mlp.gate + mlp.experts.gate_up_proj/down_proj, saved under block_sparse_moe. with
    # the experts as w1/w3/w2; the experts' width is intermediate_size (None: a field left out)
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(intermediate_size=32, num_local_experts=4, moe_intermediate_size=None)),
}


def make(name):
    import transformers
    config, model_class, fields = MODELS[name]
    torch.manual_seed(0)
    fields = {k: v for k, v in {**BASE, **fields}.items() if v is not None}
    model = getattr(transformers, model_class)(getattr(transformers, config)(**fields))
    return fsdp_vlm.randomized(model)


def build(out):
    for name in MODELS:
        keys = fsdp_vlm.save_actor(make(name), f"{out}/{name}/hf", f"{out}/{name}/actor", "AutoModelForCausalLM")
        if not any(k.endswith("mlp.experts.gate_up_proj") for k in keys):
            sys.exit(f"{name}: the FSDP state dict does not hold the experts fused (mlp.experts.gate_up_proj)")
        print(f"{name}: {len(keys)} keys")


def check(pairs):
    for orig, hf_dir in pairs:
        vlm.samehf(orig, [hf_dir])
        trainer_dcp.check([orig, hf_dir, "bf16"])


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"] and len(sys.argv) == 3:
        build(sys.argv[2])
    elif sys.argv[1:2] == ["check"] and len(sys.argv) % 2 == 0:
        check(zip(sys.argv[2::2], sys.argv[3::2]))
    else:
        sys.exit(__doc__)
