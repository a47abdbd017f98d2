#!/usr/bin/python3
"""The baseline for the mcore/ view: an offline HF -> Megatron-core torch_dist conversion the way
today's scripts work (verl's converter_hf_to_mcore.py: load the HF weights, build the model's
sharded state dict in memory, save it with dist_checkpointing). Run with torch 2.x (the Debian 13
root, which has the safetensors library).

It loads every safetensors shard, builds Megatron GPTModel's stacked state dict in RAM
(torch.stack over layers; q/k/v interleaved per query group; fc1 = [gate; up]; embedding and
output layer padded with zero rows), saves it with torch.distributed.checkpoint.save (no process
group: one rank, one __0_0.distcp) and writes common.pt, metadata.json and the tracker file.
A Qwen2.5-VL (config.json with vision_config) is converted as mbridge's Qwen2_5VLModel holds it:
the language model under language_model., the tower under vision_model. (the fused attn.qkv
regrouped per head, fc1 = [gate; up], the patch merger as projection.encoder.*).

Usage: mcore_convert.py HF_DIR OUT_DIR --like CKPT_DIR
  CKPT_DIR holds a torch_dist .metadata (the view's, copied): the output gets its keys, global
  shapes and dtypes (the padded vocabulary and the _extra_state/shard_l_L byte entries come from
  it); the script fails if a tensor it builds has another shape.
"""
import argparse
import io
import json
import os
import warnings
from argparse import Namespace

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata
from torch.distributed.checkpoint.planner import WriteItemType

warnings.filterwarnings("ignore", message="torch.distributed is unavailable or uninitialized")
warnings.filterwarnings("ignore", message="TypedStorage is deprecated")  # inside dcp.save (torch 2.6)
METADATA_JSON = {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                 "common_backend": "torch", "common_backend_version": 1}


class BytesAsIsPlanner(DefaultSavePlanner):
    """Byte entries are already torch.save'd BytesIO objects (as Megatron's planner does)."""

    def transform_object(self, write_item, object):
        if write_item.type == WriteItemType.BYTE_IO and isinstance(object, io.BytesIO):
            return object
        return super().transform_object(write_item, object)


def load_hf(d):
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    w = {}
    for name in files:
        w.update(load_file(os.path.join(d, name)))
    return w


def vision_tower(w, vc):
    """Qwen2.5-VL's tower and patch merger as mbridge's Qwen2_5VLModel names them (stacked)."""
    heads, width = vc["num_heads"], vc["hidden_size"]

    def stack(fn):
        return torch.stack([fn(f"visual.blocks.{i}.") for i in range(vc["depth"])])

    def qkv(t):  # [q; k; v] -> per head [q_h; k_h; v_h]
        per = t.view(3, heads, width // heads, *t.shape[1:]).transpose(0, 1)
        return per.reshape(3 * width, *t.shape[1:])

    LP = "vision_model.decoder.layers."
    sd = {"vision_model.patch_embed.proj.weight": w["visual.patch_embed.proj.weight"],
          "vision_model.decoder.final_layernorm.weight": w["visual.merger.ln_q.weight"]}
    for i, hf in ((1, "0"), (2, "2")):
        for s in ("weight", "bias"):
            sd[f"vision_model.projection.encoder.linear_fc{i}.{s}"] = w[f"visual.merger.mlp.{hf}.{s}"]
    for s in ("weight", "bias"):
        sd[LP + "self_attention.linear_qkv." + s] = stack(lambda p: qkv(w[p + "attn.qkv." + s]))
        sd[LP + "self_attention.linear_proj." + s] = stack(lambda p: w[p + "attn.proj." + s])
        sd[LP + "mlp.linear_fc1." + s] = stack(lambda p: torch.cat([w[p + "mlp.gate_proj." + s],
                                                                    w[p + "mlp.up_proj." + s]]))
        sd[LP + "mlp.linear_fc2." + s] = stack(lambda p: w[p + "mlp.down_proj." + s])
    sd[LP + "self_attention.linear_qkv.layer_norm_weight"] = stack(lambda p: w[p + "norm1.weight"])
    sd[LP + "mlp.linear_fc1.layer_norm_weight"] = stack(lambda p: w[p + "norm2.weight"])
    return sd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf")
    ap.add_argument("out")
    ap.add_argument("--like", required=True)
    args = ap.parse_args()
    like = FileSystemReader(args.like).read_metadata().state_dict_metadata
    hf_cfg = json.load(open(os.path.join(args.hf, "config.json")))
    cfg = {**hf_cfg, **hf_cfg.get("text_config", {})}
    vision = hf_cfg.get("vision_config")
    # The language model's keys sit under language_model. in a VLM; transformers >= 4.52 saves
    # the release's model.* / visual.* as model.language_model.* / model.visual.*
    lm = "language_model." if vision else ""
    w = {k.replace("model.language_model.", "model.").replace("model.visual.", "visual."): t
         for k, t in load_hf(args.hf).items()}
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    ng = cfg.get("num_key_value_heads", nh)
    d = cfg.get("head_dim") or H // nh
    vocab = cfg["vocab_size"]
    padded = like[lm + "embedding.word_embeddings.weight"].size[0]

    def pad_vocab(t):
        return torch.cat([t, torch.zeros(padded - vocab, t.shape[1], dtype=t.dtype)])

    def stack(fn):
        return torch.stack([fn(f"model.layers.{i}.") for i in range(L)])

    def qkv(p, suffix):
        q = w[p + "self_attn.q_proj." + suffix].view(ng, nh // ng * d, -1)
        k = w[p + "self_attn.k_proj." + suffix].view(ng, d, -1)
        v = w[p + "self_attn.v_proj." + suffix].view(ng, d, -1)
        out = torch.cat([q, k, v], dim=1)
        return out.reshape(-1, out.shape[-1]) if suffix == "weight" else out.reshape(-1)

    LP = lm + "decoder.layers."
    sd = {
        lm + "embedding.word_embeddings.weight": pad_vocab(w["model.embed_tokens.weight"]),
        LP + "self_attention.linear_qkv.layer_norm_weight": stack(lambda p: w[p + "input_layernorm.weight"]),
        LP + "self_attention.linear_qkv.weight": stack(lambda p: qkv(p, "weight")),
        LP + "self_attention.linear_proj.weight": stack(lambda p: w[p + "self_attn.o_proj.weight"]),
        LP + "mlp.linear_fc1.layer_norm_weight": stack(lambda p: w[p + "post_attention_layernorm.weight"]),
        LP + "mlp.linear_fc1.weight": stack(lambda p: torch.cat([w[p + "mlp.gate_proj.weight"],
                                                                 w[p + "mlp.up_proj.weight"]])),
        LP + "mlp.linear_fc2.weight": stack(lambda p: w[p + "mlp.down_proj.weight"]),
        lm + "decoder.final_layernorm.weight": w["model.norm.weight"],
    }
    if "model.layers.0.self_attn.q_proj.bias" in w:
        sd[LP + "self_attention.linear_qkv.bias"] = stack(lambda p: qkv(p, "bias"))
    if "model.layers.0.self_attn.q_norm.weight" in w:
        sd[LP + "self_attention.q_layernorm.weight"] = stack(lambda p: w[p + "self_attn.q_norm.weight"])
        sd[LP + "self_attention.k_layernorm.weight"] = stack(lambda p: w[p + "self_attn.k_norm.weight"])
    if lm + "output_layer.weight" in like:
        sd[lm + "output_layer.weight"] = pad_vocab(w.get("lm_head.weight", w["model.embed_tokens.weight"]))
    if vision:
        sd.update(vision_tower(w, vision))
    del w
    extra = io.BytesIO()
    torch.save([None], extra)
    for k, m in like.items():
        if isinstance(m, BytesStorageMetadata):
            sd[k] = io.BytesIO(extra.getvalue())
        elif k not in sd:
            raise SystemExit(f"mcore_convert: the template has {k}, this converter does not build it")
        elif tuple(sd[k].shape) != tuple(m.size) or sd[k].dtype != m.properties.dtype:
            raise SystemExit(f"mcore_convert: {k}: built {tuple(sd[k].shape)} {sd[k].dtype}, "
                             f"template {tuple(m.size)} {m.properties.dtype}")
    extra_keys = set(sd) - set(like)
    if extra_keys:
        raise SystemExit(f"mcore_convert: not in the template: {sorted(extra_keys)}")

    release = os.path.join(args.out, "release")
    os.makedirs(release)
    with open(os.path.join(args.out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("release")
    dcp.save(sd, storage_writer=FileSystemWriter(release), planner=BytesAsIsPlanner())
    margs = Namespace(
        num_layers=L, encoder_num_layers=L, hidden_size=H, ffn_hidden_size=cfg["intermediate_size"],
        num_attention_heads=nh, num_query_groups=ng, group_query_attention=ng != nh, kv_channels=d,
        vocab_size=vocab, padded_vocab_size=padded, make_vocab_size_divisible_by=128,
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        seq_length=cfg.get("max_position_embeddings", 4096),
        position_embedding_type="mrope" if vision else "rope",
        rotary_base=cfg.get("rope_theta", 10000), rotary_percent=1.0, rotary_interleaved=False,
        normalization="RMSNorm", layernorm_epsilon=cfg.get("rms_norm_eps", 1e-5), swiglu=True,
        add_bias_linear=False, add_qkv_bias=LP + "self_attention.linear_qkv.bias" in sd,
        qk_layernorm=LP + "self_attention.q_layernorm.weight" in sd,
        untie_embeddings_and_output_weights=lm + "output_layer.weight" in sd, bf16=True, fp16=False,
        params_dtype=torch.bfloat16, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
        ckpt_format="torch_dist", use_legacy_models=False, transformer_impl="transformer_engine",
        no_save_optim=True, no_save_rng=True, iteration=0)
    torch.save({"args": margs, "checkpoint_version": 3.0, "iteration": 0,
                "content_metadata": {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}},
               os.path.join(release, "common.pt"))
    with open(os.path.join(release, "metadata.json"), "w") as f:
        json.dump(METADATA_JSON, f)


if __name__ == "__main__":
    main()
