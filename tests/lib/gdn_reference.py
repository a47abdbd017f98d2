#!/usr/bin/python3
"""Qwen3-Next (Qwen3NextForCausalLM) and Qwen3.5's text model (Qwen3_5ForCausalLM), gated
delta-net hybrids: checks written from transformers 5.12.1's modeling_qwen3_next.py
(fix_query_key_value_ordering, Qwen3NextRMSNorm's 1 + w, Qwen3NextRMSNormGated's plain w) and
modeling_qwen3_5.py (in_proj_qkv = [q; k; v], in_proj_z, in_proj_b, in_proj_a), Megatron-core 0.17.1's megatron/core/ssm/gated_delta_net.py
(in_proj = [q; k; v; z; beta; alpha] and conv1d = [q; k; v], each section split over TP on its
own; dt_bias and A_log split by head; the module's own parameters before its submodules'),
mbridge's qwen3_5 bridge (the gated linear_qkv per query group [q; gate; k; v], out_norm = w - 1)
and Megatron-Bridge's qwen3_next_bridge.py (names, layernorm_zero_centered_gamma,
attention_output_gate, experimental_attention_variant), not from ckptfs's code.

  gdn_reference.py build OUT          (in the sid root: transformers 5.12.1)
      OUT/NAME for each variant, built and saved by transformers in bf16, its norms drawn
      around their neutral value; OUT/NAME.logits.json: transformers' logits on TOKENS;
      OUT/q35moe-fused: the same model with its experts fused as transformers holds them;
      OUT/q3n-a-mtp, OUT/q35-mtp, OUT/q35moe-mtp: those models with the releases' MTP block
      (mtp.*) and its logits (NAME.mtp_logits.json) from transformers' own modules;
      OUT/q3n-a-mtp-fused, OUT/q35moe-mtp-fused: q3n-a-mtp and q35moe-mtp with every layer's
      experts fused, the MTP layer's too.
  gdn_reference.py check SRC VIEW LAYOUT [--torch2] [--mtp]
      every rank file of VIEW loads (torch 2.6 with weights_only and mmap with --torch2); the
      file set is Megatron's for LAYOUT; every chunk's keys, in order, and tensors, bit for bit,
      are what the bridges make of SRC's tensors; the args say the layer pattern, the delta-net
      sizes, the gated attention and the zero-centred norms; a Megatron-semantics forward over
      the rank files alone (the delta rule as a loop over tokens) equals transformers' logits.
      --mtp (a view mounted with -o mtp=on): the last stage also holds Megatron-core's
      MultiTokenPredictionLayer as the bridges fill it from mtp.*, and its forward over the
      rank files equals the MTP block's of transformers' modules.
  gdn_reference.py mcore SRC RELEASE_DIR [SRC RELEASE_DIR ...]     (in the sid root: torch 2.14)
      each RELEASE_DIR (an mcore/ release directory) read by torch.distributed.checkpoint: its tensor
      keys are Megatron-core's sharded_state_dict of the model (one layer's keys each, the layers
      not of one kind; in_proj and conv1d a key per section, "in_proj.weight.query", ...), with
      their global shapes and, bit for bit, the bridges' tensors; every other entry is an
      _extra_state object; a TP-2 loader's share of every section is whole chunks.
  gdn_reference.py same ORIG HF_DIR
      HF_DIR's tensors are ORIG's, bit for bit.
  gdn_reference.py logits HF_DIR ORIG [HF_DIR ORIG ...]      (in the sid root)
      transformers loads each HF_DIR (config.json included) and gives its ORIG's logits, bit for
      bit.
  gdn_reference.py bad SRC KIND
      edits SRC's config.json: short (layer_types of the wrong length), interval (a
      full_attention_interval that disagrees with layer_types), kind (an unknown layer kind),
      mtp-two (mtp_num_hidden_layers 2); or an MTP block's tensors: drop-mtp (one left out),
      fc-shape (mtp.fc.weight [H, H]), mtp-experts-dim (a fused MTP gate_up_proj one expert short).
"""
import argparse
import json
import math
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import bf16_to_f32, read_checkpoint  # noqa: E402
from moe_reference import file_name, parse_moe_layout, rank_grid  # noqa: E402
from reference import chunk_layers, load_rank_file  # noqa: E402

TOKENS = [int(t) for t in np.arange(3, 250, 7) % 128]  # 36 tokens
TOLERANCE = 2e-3  # max logit error relative to the largest logit (bf16 weights, fp32 math)
BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, max_position_embeddings=256, rms_norm_eps=1e-6,
            tie_word_embeddings=False)
VARIANTS = {
    # every other layer full attention (layer_types as transformers writes them), a value head per
    # key head pair, every layer MoE
    "q3n-a": dict(num_hidden_layers=4, full_attention_interval=2, linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=8, linear_value_head_dim=8, decoder_sparse_step=1, mtp_copy=True,
                  mtp_fused=True),
    # every third layer full, given as full_attention_interval only (layer_types removed), three
    # value heads per key head, the first layer dense
    "q3n-b": dict(num_hidden_layers=6, full_attention_interval=3, linear_num_key_heads=2, linear_num_value_heads=6,
                  linear_key_head_dim=8, linear_value_head_dim=4, decoder_sparse_step=1, mlp_only_layers=[0],
                  only_interval=True),
    # Qwen3.5's text model: dense, the delta-net's projections split
    "q35": dict(num_hidden_layers=4, full_attention_interval=2, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=8, linear_value_head_dim=8, qwen3_5=True, mtp_copy=True),
    # Qwen3.5's MoE text model: the split projections, every layer MoE with a gated shared expert
    "q35moe": dict(num_hidden_layers=4, full_attention_interval=4, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_key_head_dim=8, linear_value_head_dim=8, qwen3_5_moe=True, fused_copy=True, mtp_copy=True,
                   mtp_fused=True),
}
MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")


# ---------------------------------------------------------------------------------------------
# build (sid root)
def build(out):
    import torch
    from transformers import (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig,
                              Qwen3NextConfig, Qwen3NextForCausalLM)
    for name, v in VARIANTS.items():
        v = dict(v)
        only_interval = v.pop("only_interval", False)
        fused_copy = v.pop("fused_copy", False)
        mtp_copy = v.pop("mtp_copy", False)
        mtp_fused = v.pop("mtp_fused", False)
        dense = v.pop("qwen3_5", False)
        moe35 = v.pop("qwen3_5_moe", False)
        kind = (Qwen3_5TextConfig, Qwen3_5ForCausalLM) if dense else \
            (Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM) if moe35 else \
            (Qwen3NextConfig, Qwen3NextForCausalLM)
        torch.manual_seed(len(name) + sum(map(ord, name)))
        # Qwen3_5MoeTextConfig has no intermediate_size (its releases' config.json neither)
        base = {k: x for k, x in BASE.items()
                if not (dense and k in MOE_FIELDS) and not (moe35 and k == "intermediate_size")}
        cfg = kind[0](**base, **v)
        model = kind[1](cfg).eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight") and "linear_attn" in pname:
                    p.copy_(1 + 0.2 * torch.randn_like(p))  # plain w (RMSNormGated)
                elif pname.endswith("norm.weight") or "layernorm" in pname:
                    p.copy_(0.2 * torch.randn_like(p))  # zero-centred: 1 + w
                elif pname.endswith("A_log"):
                    p.copy_(torch.log(torch.empty_like(p).uniform_(1, 16)))
                elif pname.endswith("dt_bias"):
                    p.copy_(0.5 * torch.randn_like(p))
                else:
                    p.normal_(0, 0.08)
        model = model.to(torch.bfloat16)
        path = os.path.join(out, name)
        model.save_pretrained(path)
        if fused_copy:  # NAME-fused: the experts as transformers holds them ([E, 2F, H], [E, H, F])
            from safetensors.torch import save_file
            os.makedirs(path + "-fused")
            shutil.copy(os.path.join(path, "config.json"), path + "-fused")
            sd = {k: t.contiguous() for k, t in model.state_dict().items()}
            assert any(k.endswith("mlp.experts.gate_up_proj") for k in sd), sorted(sd)[:5]
            save_file(sd, os.path.join(path + "-fused", "model.safetensors"), metadata={"format": "pt"})
        if only_interval:
            cpath = os.path.join(path, "config.json")
            c = json.load(open(cpath))
            del c["layer_types"]
            c["full_attention_interval"] = v["full_attention_interval"]
            json.dump(c, open(cpath, "w"), indent=2)
        back = type(model).from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = back(torch.tensor([TOKENS])).logits[0]
        json.dump(logits.tolist(), open(path + ".logits.json", "w"))
        if mtp_copy:
            build_mtp(torch, model, back, path, mtp_fused)
        print(name)


def build_mtp(torch, model, back, path, fused=False):
    """PATH-mtp: PATH with the releases' MTP block (config.json's mtp_num_hidden_layers 1; mtp.fc,
    mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.layers.0 a full-attention decoder layer
    of the family's MLP, mtp.norm: the names Megatron-Bridge's qwen3_next and qwen35 bridges map),
    made of transformers' own modules; PATH-mtp.mtp_logits.json: the block's logits (Megatron's MTP depth 1: the next tokens'
    embedding, the model's last hidden state after its norm, the shared head). FUSED:
    PATH-mtp-fused too, the same tensors with every layer's experts fused as transformers holds
    them, the MTP layer's included (mtp.layers.0.mlp.experts.gate_up_proj [E, 2F, H], down_proj
    [E, H, F]: Qwen3.6's releases' form, which Megatron-Bridge's qwen35 bridge reads packed)."""
    from safetensors.torch import load_file, save_file
    modeling = sys.modules[type(model).__module__]
    layer_cls = next(c for n, c in vars(modeling).items() if n.endswith("DecoderLayer"))
    norm_cls = next(c for n, c in vars(modeling).items() if n.endswith("RMSNorm") and "Gated" not in n)
    cfg, H = model.config, model.config.hidden_size
    full = cfg.layer_types.index("full_attention")
    torch.manual_seed(7)
    block = torch.nn.ModuleDict(dict(fc=torch.nn.Linear(2 * H, H, bias=False), pre_fc_norm_embedding=norm_cls(H),
                                     pre_fc_norm_hidden=norm_cls(H), norm=norm_cls(H),
                                     layers=torch.nn.ModuleList([layer_cls(cfg, full)])))
    assert block.layers[0].layer_type == "full_attention"
    with torch.no_grad():
        for pname, p in block.named_parameters():
            p.copy_(0.2 * torch.randn_like(p) if "norm" in pname else 0.08 * torch.randn_like(p))
    block = block.to(torch.bfloat16)
    out = path + "-mtp"
    shutil.copytree(path, out)
    sd = load_file(os.path.join(path, "model.safetensors"))
    for k, t in block.state_dict().items():
        if k.endswith("mlp.experts.gate_up_proj"):  # per expert, as the releases and the main layers are saved
            for e, w in enumerate(t):
                sd[f"mtp.{k[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = w[:len(w) // 2].contiguous()
                sd[f"mtp.{k[:-len('gate_up_proj')]}{e}.up_proj.weight"] = w[len(w) // 2:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            for e, w in enumerate(t):
                sd[f"mtp.{k[:-len('down_proj')]}{e}.down_proj.weight"] = w.contiguous()
        else:
            sd["mtp." + k] = t.contiguous()
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cpath = os.path.join(out, "config.json")
    c = json.load(open(cpath))
    c["mtp_num_hidden_layers"] = 1
    json.dump(c, open(cpath, "w"), indent=2)
    if fused:
        sd = {k: t.contiguous() for k, t in model.state_dict().items()}
        sd.update({"mtp." + k: t.contiguous() for k, t in block.state_dict().items()})
        assert "mtp.layers.0.mlp.experts.gate_up_proj" in sd, sorted(sd)[-5:]
        os.makedirs(out + "-fused")
        shutil.copy(cpath, out + "-fused")
        save_file(sd, os.path.join(out + "-fused", "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(path + ".logits.json", out + ".logits.json")
    block = block.float()
    ids = torch.tensor([TOKENS])
    with torch.no_grad():
        hidden = back.model(ids).last_hidden_state
        nxt = torch.tensor([TOKENS[1:] + [0]])  # Megatron's roll_tensor: shifted left, 0 at the end
        x = block.fc(torch.cat([block.pre_fc_norm_embedding(back.model.embed_tokens(nxt)),
                                block.pre_fc_norm_hidden(hidden)], -1))
        pos = torch.arange(len(TOKENS))[None]
        x = block.layers[0](x, position_embeddings=back.model.rotary_emb(x, pos), position_ids=pos)
        x = x[0] if isinstance(x, tuple) else x
        mtp_logits = back.lm_head(block.norm(x))[0]
    json.dump(mtp_logits.tolist(), open(out + ".mtp_logits.json", "w"))
    print(os.path.basename(out))


# ---------------------------------------------------------------------------------------------
# the source, as the bridges read it
class Source:
    def __init__(self, src):
        self.cfg = c = json.load(open(os.path.join(src, "config.json")))
        self.raw = read_checkpoint(src)
        self.L, self.H, self.vocab = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
        self.nh, self.ng, self.d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.nk, self.nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        self.dk, self.dv, self.K = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
        self.E, self.topk = c.get("num_experts", 0), c.get("num_experts_per_tok", 0)
        self.eps, self.theta = c["rms_norm_eps"], c.get("rope_parameters", {}).get("rope_theta", 10000.0)
        self.rotary_dim = int(self.d * c.get("partial_rotary_factor", 0.25))
        types = c.get("layer_types") or ["full_attention" if (i + 1) % c["full_attention_interval"] == 0
                                         else "linear_attention" for i in range(self.L)]
        self.linear = [t == "linear_attention" for t in types]
        only = set(c.get("mlp_only_layers") or [])
        step = c.get("decoder_sparse_step", 1)
        self.moe = [self.E > 0 and i not in only and (i + 1) % step == 0 for i in range(self.L)]
        # the MTP block's layer as layer L (mtp.layers.0.): full attention, the family's MLP
        self.mtp = c.get("mtp_num_hidden_layers", 0)
        self.linear.append(False)
        self.moe.append(self.E > 0)

    def bits(self, name):
        dt, shape, raw = self.raw[name]
        assert dt == "BF16", name
        return np.frombuffer(raw, dtype=np.uint16).reshape(shape)

    def layer(self, i, s):
        return self.bits(f"mtp.layers.0.{s}" if i == self.L else f"model.layers.{i}.{s}")


def chunk(w, r, n, axis=0):
    size = w.shape[axis] // n
    return np.take(w, range(r * size, (r + 1) * size), axis=axis)


def less_one(bits):
    """torch's `w - 1` on a bf16 tensor (mbridge's out_norm import), as bits."""
    import torch
    t = torch.from_numpy(bits.astype(np.int16)).view(torch.bfloat16)
    return (t - 1).view(torch.int16).numpy().astype(np.uint16)


def in_proj_sections(s, i):
    """Megatron's [q, k, v, z, beta, alpha] from Qwen3-Next's per-key-head-group in_proj_qkvz
    ([q_g; k_g; v_g; z_g]) and in_proj_ba ([b_g; a_g]), as fix_query_key_value_ordering reads them."""
    if f"model.layers.{i}.linear_attn.in_proj_qkv.weight" in s.raw:  # Qwen3.5: [q; k; v], z, b, a
        qk = s.nk * s.dk
        qkv = s.layer(i, "linear_attn.in_proj_qkv.weight")
        return [qkv[:qk], qkv[qk:2 * qk], qkv[2 * qk:]] + [s.layer(i, f"linear_attn.in_proj_{p}.weight")
                                                         for p in "zba"]
    vg, hg = s.nv // s.nk * s.dv, s.nv // s.nk
    qkvz = s.layer(i, "linear_attn.in_proj_qkvz.weight").reshape(s.nk, 2 * s.dk + 2 * vg, s.H)
    ba = s.layer(i, "linear_attn.in_proj_ba.weight").reshape(s.nk, 2 * hg, s.H)
    cuts = [0, s.dk, 2 * s.dk, 2 * s.dk + vg, 2 * s.dk + 2 * vg]
    q, k, v, z = (qkvz[:, a:b].reshape(-1, s.H) for a, b in zip(cuts, cuts[1:]))
    return [q, k, v, z, ba[:, :hg].reshape(-1, s.H), ba[:, hg:].reshape(-1, s.H)]


def gated_qkv(s, i):
    """[ng, (2 hpg + 2) d, H]: per query group its queries, their gates, key, value (mbridge)."""
    hpg = s.nh // s.ng
    qg = s.layer(i, "self_attn.q_proj.weight").reshape(s.nh, 2 * s.d, s.H)
    q, g = qg[:, :s.d].reshape(s.ng, hpg * s.d, s.H), qg[:, s.d:].reshape(s.ng, hpg * s.d, s.H)
    k = s.layer(i, "self_attn.k_proj.weight").reshape(s.ng, s.d, s.H)
    v = s.layer(i, "self_attn.v_proj.weight").reshape(s.ng, s.d, s.H)
    return np.concatenate([q, g, k, v], 1)


def layer_entries(s, i, r, tp, e, ep, x, etp):
    """(name, tensor bits or None for _extra_state) of layer i in the file of TP rank r, EP rank e,
    expert TP rank x, in Megatron-core's module order (Transformer Engine spec)."""
    out = []
    add = lambda n, t: out.append((n, t))  # noqa: E731
    if s.linear[i]:
        a = "self_attention."
        add(a + "dt_bias", chunk(s.layer(i, "linear_attn.dt_bias"), r, tp))
        add(a + "A_log", chunk(s.layer(i, "linear_attn.A_log"), r, tp))
        add(a + "in_proj.layer_norm_weight", s.layer(i, "input_layernorm.weight"))
        add(a + "in_proj.weight", np.concatenate([chunk(p, r, tp) for p in in_proj_sections(s, i)]))
        add(a + "in_proj._extra_state", None)
        conv = s.layer(i, "linear_attn.conv1d.weight")
        qk = s.nk * s.dk
        add(a + "conv1d.weight", np.concatenate([chunk(p, r, tp) for p in (conv[:qk], conv[qk:2 * qk], conv[2 * qk:])]))
        add(a + "out_norm.weight", less_one(s.layer(i, "linear_attn.norm.weight")))
        add(a + "out_norm._extra_state", None)
        add(a + "out_proj.weight", chunk(s.layer(i, "linear_attn.out_proj.weight"), r, tp, 1))
        add(a + "out_proj._extra_state", None)
    else:
        a = "self_attention."
        add(a + "core_attention._extra_state", None)
        add(a + "linear_proj.weight", chunk(s.layer(i, "self_attn.o_proj.weight"), r, tp, 1))
        add(a + "linear_proj._extra_state", None)
        add(a + "linear_qkv.layer_norm_weight", s.layer(i, "input_layernorm.weight"))
        add(a + "linear_qkv.weight", chunk(gated_qkv(s, i), r, tp).reshape(-1, s.H))
        add(a + "linear_qkv._extra_state", None)
        add(a + "q_layernorm.weight", s.layer(i, "self_attn.q_norm.weight"))
        add(a + "q_layernorm._extra_state", None)
        add(a + "k_layernorm.weight", s.layer(i, "self_attn.k_norm.weight"))
        add(a + "k_layernorm._extra_state", None)
    fc1 = lambda p, rr, n: np.concatenate([chunk(s.layer(i, p + "gate_proj.weight"), rr, n),  # noqa: E731
                                           chunk(s.layer(i, p + "up_proj.weight"), rr, n)])
    if not s.moe[i]:
        add("mlp.linear_fc1.layer_norm_weight", s.layer(i, "post_attention_layernorm.weight"))
        add("mlp.linear_fc1.weight", fc1("mlp.", r, tp))
        add("mlp.linear_fc1._extra_state", None)
        add("mlp.linear_fc2.weight", chunk(s.layer(i, "mlp.down_proj.weight"), r, tp, 1))
        add("mlp.linear_fc2._extra_state", None)
        return out
    add("pre_mlp_layernorm.weight", s.layer(i, "post_attention_layernorm.weight"))
    add("pre_mlp_layernorm._extra_state", None)
    add("mlp.router.weight", s.layer(i, "mlp.gate.weight"))
    per = s.E // ep
    for j in range(per):
        p = f"mlp.experts.{e * per + j}."
        add(f"mlp.experts.local_experts.{j}.linear_fc1.weight", fc1(p, x, etp))
        add(f"mlp.experts.local_experts.{j}.linear_fc1._extra_state", None)
        add(f"mlp.experts.local_experts.{j}.linear_fc2.weight", chunk(s.layer(i, p + "down_proj.weight"), x, etp, 1))
        add(f"mlp.experts.local_experts.{j}.linear_fc2._extra_state", None)
    add("mlp.shared_experts.gate_weight", s.layer(i, "mlp.shared_expert_gate.weight"))
    add("mlp.shared_experts.linear_fc1.weight", fc1("mlp.shared_expert.", r, tp))
    add("mlp.shared_experts.linear_fc1._extra_state", None)
    add("mlp.shared_experts.linear_fc2.weight", chunk(s.layer(i, "mlp.shared_expert.down_proj.weight"), r, tp, 1))
    add("mlp.shared_experts.linear_fc2._extra_state", None)
    return out


def mtp_entries(s, r, tp, e, ep, x, etp):
    """Megatron-core's MultiTokenPredictionLayer 0 as the bridges fill it: enorm, hnorm, eh_proj
    (column-parallel, [embedding; hidden] as mtp.fc reads them), mtp_model_layer, final_layernorm."""
    pre = "mtp.layers.0."
    return [(pre + "enorm.weight", s.bits("mtp.pre_fc_norm_embedding.weight")), (pre + "enorm._extra_state", None),
            (pre + "hnorm.weight", s.bits("mtp.pre_fc_norm_hidden.weight")), (pre + "hnorm._extra_state", None),
            (pre + "eh_proj.weight", chunk(s.bits("mtp.fc.weight"), r, tp)), (pre + "eh_proj._extra_state", None)] + \
        [(pre + "mtp_model_layer." + n, t) for n, t in layer_entries(s, s.L, r, tp, e, ep, x, etp)] + \
        [(pre + "final_layernorm.weight", s.bits("mtp.norm.weight")), (pre + "final_layernorm._extra_state", None)]


def chunk_entries(s, tp, pp, vpp, p, v, r, e, ep, x, etp, mtp=False):
    out = []
    mult = 128 * tp
    padded = (s.vocab + mult - 1) // mult * mult
    pad = lambda w: np.concatenate([w, np.zeros((padded - s.vocab, s.H), np.uint16)])  # noqa: E731
    last = p == pp - 1 and v == vpp - 1
    if (p == 0 and v == 0) or (last and mtp):  # the MTP layer's stage embeds the next tokens
        out.append(("embedding.word_embeddings.weight", chunk(pad(s.bits("model.embed_tokens.weight")), r, tp)))
    first, count = chunk_layers(s.L, pp, vpp, p, v)
    for li in range(count):
        out += [(f"decoder.layers.{li}.{n}", t) for n, t in layer_entries(s, first + li, r, tp, e, ep, x, etp)]
    if last:
        out += [("decoder.final_layernorm.weight", s.bits("model.norm.weight")),
                ("decoder.final_layernorm._extra_state", None)]
        out += mtp_entries(s, r, tp, e, ep, x, etp) if mtp else []
        out += [("output_layer.weight", chunk(pad(s.bits("lm_head.weight")), r, tp)),
                ("output_layer._extra_state", None)]
    return out


def bits_of(torch, t):
    assert t.dtype == torch.bfloat16, t.dtype
    return t.contiguous().view(torch.int16).numpy().astype(np.uint16)


# ---------------------------------------------------------------------------------------------
# a forward with Megatron-core's semantics over the rank files (fp32)
def rms(x, w, eps, zero_centred):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * ((1 + w) if zero_centred else w)


def silu(x):
    return x / (1 + np.exp(-x))


def softplus(x):
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


def rope(x, theta, rd):  # x [heads, T, d]: the first rd channels rotated the half-split way
    T = x.shape[1]
    inv = 1.0 / theta ** (np.arange(0, rd, 2) / rd)
    ang = np.outer(np.arange(T), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))
    r, rest = x[..., :rd], x[..., rd:]
    half = np.concatenate([-r[..., rd // 2:], r[..., :rd // 2]], -1)
    return np.concatenate([r * cos + half * sin, rest], -1)


def f32(torch, t):
    return t.float().numpy()


def of_tp(files, t):
    """A file of dense TP rank t (any EP and expert TP rank: they hold the same dense weights)."""
    return next(f for (tt, _, _), f in sorted(files.items()) if tt == t)


class MegatronForward:
    def __init__(self, s, torch):
        self.s, self.torch = s, torch

    def g(self, sd, k):
        return f32(self.torch, sd[k])

    def gdn(self, sds, pre, x):
        """GatedDeltaNet.forward per TP rank (its heads), out_proj partials summed."""
        s, T, tp = self.s, x.shape[0], len(sds)
        h = rms(x, self.g(sds[0], pre + "in_proj.layer_norm_weight"), s.eps, True)
        out = 0
        nk, nv = s.nk // tp, s.nv // tp
        for sd in sds:
            qkvzba = h @ self.g(sd, pre + "in_proj.weight").T
            qk, vd = nk * s.dk, nv * s.dv
            qkv, z = qkvzba[:, :2 * qk + vd], qkvzba[:, 2 * qk + vd:2 * qk + 2 * vd]
            beta, alpha = qkvzba[:, 2 * qk + 2 * vd:2 * qk + 2 * vd + nv], qkvzba[:, 2 * qk + 2 * vd + nv:]
            w = self.g(sd, pre + "conv1d.weight")[:, 0, :]  # [C, K]: causal depthwise conv
            K = w.shape[1]
            padded = np.concatenate([np.zeros((K - 1, qkv.shape[1]), np.float32), qkv])
            conv = silu(sum(padded[j:j + T] * w[:, j] for j in range(K)))
            q, k, v = conv[:, :qk], conv[:, qk:2 * qk], conv[:, 2 * qk:]
            q = q.reshape(T, nk, s.dk)
            k = k.reshape(T, nk, s.dk)
            v = v.reshape(T, nv, s.dv)
            q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
            k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
            rep = nv // nk
            q, k = np.repeat(q, rep, 1), np.repeat(k, rep, 1)
            gdecay = -np.exp(self.g(sd, pre + "A_log")) * softplus(alpha + self.g(sd, pre + "dt_bias"))
            b = 1 / (1 + np.exp(-beta))
            state = np.zeros((nv, s.dk, s.dv), np.float32)
            o = np.zeros((T, nv, s.dv), np.float32)
            q = q / math.sqrt(s.dk)
            for t in range(T):  # the gated delta rule, token by token
                state = state * np.exp(gdecay[t])[:, None, None]
                kv = np.einsum("hk,hkv->hv", k[t], state)
                delta = (v[t] - kv) * b[t][:, None]
                state = state + np.einsum("hk,hv->hkv", k[t], delta)
                o[t] = np.einsum("hk,hkv->hv", q[t], state)
            y = rms(o, self.g(sd, pre + "out_norm.weight"), s.eps, True) * silu(z.reshape(T, nv, s.dv))
            out = out + y.reshape(T, -1) @ self.g(sd, pre + "out_proj.weight").T
        return x + out

    def attention(self, sds, pre, x):
        s, T, tp = self.s, x.shape[0], len(sds)
        hpg = s.nh // s.ng
        h = rms(x, self.g(sds[0], pre + "linear_qkv.layer_norm_weight"), s.eps, True)
        qkv = np.concatenate([h @ self.g(sd, pre + "linear_qkv.weight").T for sd in sds], 1)
        qkv = qkv.reshape(T, s.ng, 2 * hpg + 2, s.d)
        q = qkv[:, :, :hpg].reshape(T, s.nh, s.d).transpose(1, 0, 2)
        gate = qkv[:, :, hpg:2 * hpg].reshape(T, s.nh * s.d)
        k = qkv[:, :, 2 * hpg].transpose(1, 0, 2)
        v = qkv[:, :, 2 * hpg + 1].transpose(1, 0, 2)
        q = rms(q, self.g(sds[0], pre + "q_layernorm.weight"), s.eps, True)
        k = rms(k, self.g(sds[0], pre + "k_layernorm.weight"), s.eps, True)
        q, k = rope(q, s.theta, s.rotary_dim), rope(k, s.theta, s.rotary_dim)
        k, v = np.repeat(k, hpg, 0), np.repeat(v, hpg, 0)
        sc = q @ k.transpose(0, 2, 1) / math.sqrt(s.d) + np.triu(np.full((T, T), -np.inf), 1)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        a = ((p / p.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(T, -1)
        a = a * (1 / (1 + np.exp(-gate)))
        cols = a.shape[1] // tp
        return x + sum(a[:, r * cols:(r + 1) * cols] @ self.g(sd, pre + "linear_proj.weight").T
                       for r, sd in enumerate(sds))

    def mlp(self, files, pre, x, ep, etp):
        """files: {(t, e, xr): state dict} of one chunk; dense or MoE (softmax top-k, renormalised,
        the shared expert gated by a sigmoid)."""
        s = self.s
        swiglu = lambda a: silu(a[:, :a.shape[1] // 2]) * a[:, a.shape[1] // 2:]  # noqa: E731
        tp = len({t for t, _, _ in files})
        dense_tp = [of_tp(files, t) for t in range(tp)]
        sd0 = dense_tp[0]
        if pre + "mlp.router.weight" not in sd0:
            h = rms(x, self.g(sd0, pre + "mlp.linear_fc1.layer_norm_weight"), s.eps, True)
            return x + sum(swiglu(h @ self.g(sd, pre + "mlp.linear_fc1.weight").T) @
                           self.g(sd, pre + "mlp.linear_fc2.weight").T for sd in dense_tp)
        h = rms(x, self.g(sd0, pre + "pre_mlp_layernorm.weight"), s.eps, True)
        logits = h @ self.g(sd0, pre + "mlp.router.weight").T
        prob = np.exp(logits - logits.max(-1, keepdims=True))
        prob /= prob.sum(-1, keepdims=True)
        top = np.argsort(-prob, -1, kind="stable")[:, :s.topk]
        out = np.zeros_like(x)
        per = s.E // ep
        for tok in range(x.shape[0]):
            w = prob[tok, top[tok]] / prob[tok, top[tok]].sum()
            for j, ex in enumerate(top[tok]):
                e, local = divmod(int(ex), per)
                for xr in range(etp):
                    sd = next(f for (t, ee, xx), f in files.items() if ee == e and xx == xr)
                    k = f"{pre}mlp.experts.local_experts.{local}."
                    a = swiglu(h[tok:tok + 1] @ self.g(sd, k + "linear_fc1.weight").T)
                    out[tok] += w[j] * (a @ self.g(sd, k + "linear_fc2.weight").T)[0]
        shared = sum(swiglu(h @ self.g(sd, pre + "mlp.shared_experts.linear_fc1.weight").T) @
                     self.g(sd, pre + "mlp.shared_experts.linear_fc2.weight").T for sd in dense_tp)
        gate = 1 / (1 + np.exp(-(h @ self.g(sd0, pre + "mlp.shared_experts.gate_weight").T)))
        return x + out + gate * shared

    def run(self, stages, vpp, ep, etp):
        """stages[p] = {(t, e, x): rank file dict}."""
        s = self.s
        ck = lambda v: "model" if vpp == 1 else f"model{v}"  # noqa: E731
        tp = len({t for t, _, _ in stages[0]})
        emb = np.concatenate([self.g(of_tp(stages[0], t)[ck(0)], "embedding.word_embeddings.weight")
                              for t in range(tp)])
        x = emb[TOKENS]
        for v in range(vpp):
            for files in stages:
                sds = {key: f[ck(v)] for key, f in files.items()}
                tp_sds = [of_tp(sds, t) for t in range(tp)]
                n = len({k.split(".")[2] for k in tp_sds[0] if k.startswith("decoder.layers.")})
                for li in range(n):
                    pre = f"decoder.layers.{li}."
                    if pre + "self_attention.in_proj.weight" in tp_sds[0]:
                        x = self.gdn(tp_sds, pre + "self_attention.", x)
                    else:
                        x = self.attention(tp_sds, pre + "self_attention.", x)
                    x = self.mlp(sds, pre, x, ep, etp)
        last = [of_tp(stages[-1], t)[ck(vpp - 1)] for t in range(tp)]
        x = rms(x, self.g(last[0], "decoder.final_layernorm.weight"), s.eps, True)
        self.hidden = x
        return np.concatenate([x @ self.g(sd, "output_layer.weight").T for sd in last], 1)[:, :s.vocab]

    def run_mtp(self, stages, vpp, ep, etp):
        """MultiTokenPredictionLayer 0 over the last stage's files alone, after run(): its copy of
        the embedding of the next tokens, eh_proj over [enorm(embedding); hnorm(hidden)] (TP rows
        gathered), the layer, final_layernorm, the output layer."""
        s, ck = self.s, ("model" if vpp == 1 else f"model{vpp - 1}")
        files = {key: f[ck] for key, f in stages[-1].items()}
        tp = len({t for t, _, _ in files})
        last = [of_tp(files, t) for t in range(tp)]
        pre = "mtp.layers.0."
        emb = np.concatenate([self.g(sd, "embedding.word_embeddings.weight") for sd in last])
        e = rms(emb[TOKENS[1:] + [0]], self.g(last[0], pre + "enorm.weight"), s.eps, True)
        h = rms(self.hidden, self.g(last[0], pre + "hnorm.weight"), s.eps, True)
        x = np.concatenate([np.concatenate([e, h], 1) @ self.g(sd, pre + "eh_proj.weight").T for sd in last], 1)
        x = self.attention(last, pre + "mtp_model_layer.self_attention.", x)
        x = self.mlp(files, pre + "mtp_model_layer.", x, ep, etp)
        x = rms(x, self.g(last[0], pre + "final_layernorm.weight"), s.eps, True)
        return np.concatenate([x @ self.g(sd, "output_layer.weight").T for sd in last], 1)[:, :s.vocab]


# ---------------------------------------------------------------------------------------------
def check(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("view")
    ap.add_argument("layout")
    ap.add_argument("--torch2", action="store_true")
    ap.add_argument("--mtp", action="store_true", help="the view is mounted with -o mtp=on")
    a = ap.parse_args(argv)
    import torch
    s = Source(a.src)
    tp, pp, vpp, ep, etp = parse_moe_layout(a.layout)
    release = os.path.join(a.view, "release")
    grid = [(t, e, x) for t, e, x, writes in rank_grid(tp, ep, etp) if writes]
    want_files = sorted({file_name(t, p, e, pp, ep) for p in range(pp) for t, e, _ in grid})
    errors = []
    got_files = sorted(os.listdir(release))
    if got_files != want_files:
        errors.append(f"files {got_files}, expected {want_files}")
    stages = []
    for p in range(pp):
        files = {}
        for t, e, x in grid:
            path = os.path.join(release, file_name(t, p, e, pp, ep), "model_optim_rng.pt")
            f = load_rank_file(torch, path, a.torch2, True)
            files[(t, e, x)] = f
            args = f["args"]
            want_args = dict(experimental_attention_variant="gated_delta_net",
                             linear_attention_freq=[int(lin) for lin in s.linear[:s.L]], attention_output_gate=True,
                             layernorm_zero_centered_gamma=True, linear_num_key_heads=s.nk,
                             linear_num_value_heads=s.nv, linear_key_head_dim=s.dk, linear_value_head_dim=s.dv,
                             linear_conv_kernel_dim=s.K, qk_layernorm=True, rotary_percent=s.rotary_dim / s.d,
                             tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                             expert_model_parallel_size=ep, transformer_impl="transformer_engine")
            # the dense MLP's size; Qwen3.5-MoE's release config has none: mbridge's qwen3_5 MoE
            # bridge sets ffn_hidden_size from moe_intermediate_size
            want_args.update(ffn_hidden_size=s.cfg.get("intermediate_size", s.cfg.get("moe_intermediate_size")))
            if s.E:
                want_args.update(num_experts=s.E, moe_shared_expert_gate=True,
                                 moe_layer_freq=1 if all(s.moe[:s.L]) else [int(m) for m in s.moe[:s.L]])
            else:
                want_args.update(num_experts=None)
            want_args.update(mtp_num_layers=1 if a.mtp else None)
            for k, want in want_args.items():
                if getattr(args, k, "<missing>") != want:
                    errors.append(f"{path}: args.{k} = {getattr(args, k, '<missing>')!r}, expected {want!r}")
            for v in range(vpp):
                ck = "model" if vpp == 1 else f"model{v}"
                want = chunk_entries(s, tp, pp, vpp, p, v, t, e, ep, x, etp, a.mtp)
                got = f[ck]
                if list(got) != [n for n, _ in want]:
                    errors.append(f"{path} {ck}: keys\n  {list(got)}\nexpected\n  {[n for n, _ in want]}")
                    continue
                for n, w in want:
                    if w is None:
                        if got[n] is not None:
                            errors.append(f"{path} {ck} {n}: not None")
                    elif tuple(got[n].shape) != w.shape or not np.array_equal(bits_of(torch, got[n]), w):
                        errors.append(f"{path} {ck} {n}: {tuple(got[n].shape)} differs from expected {w.shape}")
        stages.append(files)
    fwd = MegatronForward(s, torch)
    if not errors:
        logits = fwd.run(stages, vpp, ep, etp)
        ref = np.array(json.load(open(a.src.rstrip("/") + ".logits.json")), np.float32)
        err = np.abs(logits - ref).max() / np.abs(ref).max()
        print(f"{a.layout}: Megatron forward vs transformers: max relative error {err:.2e}")
        if not err < TOLERANCE:
            errors.append(f"logits differ: {err:.3e} >= {TOLERANCE}")
    if not errors and a.mtp:
        got = fwd.run_mtp(stages, vpp, ep, etp)
        ref = np.array(json.load(open(a.src.rstrip("/") + ".mtp_logits.json")), np.float32)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        print(f"{a.layout}: Megatron MTP forward vs transformers' modules: max relative error {err:.2e}")
        if not err < TOLERANCE:
            errors.append(f"MTP logits differ: {err:.3e} >= {TOLERANCE}")
    for e in errors[:20]:
        print(e, file=sys.stderr)
    return 1 if errors else 0


# ---------------------------------------------------------------------------------------------
# mcore/ (torch_dist), as Megatron-core's sharded_state_dict names it

def expected_mcore(s):
    """{key: bits} of the model's sharded_state_dict at TP 1: the legacy names of chunk_entries
    with TransformerBlock's per-layer keys (linear_attention_freq is a list), GatedDeltaNet's
    _split_tensor_factory sections and TEGroupedMLP's experts stacked on a leading axis."""
    qk, v = s.nk * s.dk, s.nv * s.dv
    splits = {"self_attention.in_proj.weight": ([qk, qk, v, v, s.nv, s.nv],
                                                ["query", "key", "value", "z", "beta", "alpha"]),
              "self_attention.conv1d.weight": ([qk, qk, v], ["query", "key", "value"])}
    out, experts = {}, {}
    for name, bits in chunk_entries(s, 1, 1, 1, 0, 0, 0, 0, 1, 0, 1):
        if bits is None:
            continue
        layer_key = name.split(".", 3)[3] if name.startswith("decoder.layers.") else None
        if layer_key in splits:
            at = 0
            for n, section in zip(*splits[layer_key]):
                out[f"{name}.{section}"] = bits[at:at + n]
                at += n
        elif layer_key and layer_key.startswith("mlp.experts.local_experts."):
            j, rest = layer_key[len("mlp.experts.local_experts."):].split(".", 1)
            experts.setdefault(name.rsplit(".local_experts.", 1)[0] + ".experts." + rest, []).append(bits)
        else:
            out[name] = bits
    out.update({k: np.stack(v) for k, v in experts.items()})
    return out


def mcore(src, release):
    import torch
    import torch.distributed.checkpoint as dcp
    s = Source(src)
    want = expected_mcore(s)
    meta = dcp.FileSystemReader(release).read_metadata().state_dict_metadata
    tensors = {k for k, m in meta.items() if hasattr(m, "chunks")}
    others = sorted(k for k in set(meta) - tensors if "_extra_state" not in k)
    padded = {k: tuple(meta[k].size)[0] for k in ("embedding.word_embeddings.weight", "output_layer.weight")
              if k in meta}
    for k, rows in padded.items():  # the vocabulary padded for the largest TP degree
        if rows % 128 or rows < s.vocab:
            print(f"{k}: {rows} rows is not a padding of {s.vocab}", file=sys.stderr)
            return 1
        want[k] = np.concatenate([want[k], np.zeros((rows - s.vocab, s.H), np.uint16)])
    missing, extra = sorted(set(want) - tensors), sorted(tensors - set(want))
    shapes = [k for k in want if k in meta and tuple(meta[k].size) != want[k].shape]
    if missing or extra or others or shapes:
        print(f"keys: missing {missing[:4]}, unexpected {extra[:4]} {others[:4]}, shapes differ "
              f"{[(k, tuple(meta[k].size), want[k].shape) for k in shapes[:3]]}", file=sys.stderr)
        return 1
    split = [k for k in tensors if k.rsplit(".", 1)[1] in ("query", "key", "value", "z", "beta", "alpha")]
    uncut = [k for k in split if meta[k].size[0] // 2 not in {c.offsets[0] for c in meta[k].chunks}]
    if len(split) != 9 * sum(s.linear) or uncut:
        print(f"{len(split)} section keys for {sum(s.linear)} delta-net layers; not cut for TP 2: {uncut[:3]}",
              file=sys.stderr)
        return 1
    got = {k: torch.empty(meta[k].size, dtype=torch.bfloat16) for k in want}
    dcp.load(got, checkpoint_id=release)
    bad = [k for k in want if not np.array_equal(got[k].view(torch.int16).numpy().view(np.uint16), want[k])]
    for k in bad[:5]:
        print(f"{k}: differs", file=sys.stderr)
    return 1 if bad else 0


def same(orig, hf_dir):
    a, b = read_checkpoint(orig), read_checkpoint(hf_dir)
    bad = [n for n in a if n not in b or a[n] != b[n]] + [n for n in b if n not in a]
    for n in bad[:10]:
        print(f"{n}: differs", file=sys.stderr)
    return 1 if bad else 0


def logits(pairs):
    import torch
    from transformers import AutoModelForCausalLM
    failed = 0
    for hf_dir, orig in zip(pairs[::2], pairs[1::2]):
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
        cls = type(model).__name__
        assert cls == json.load(open(os.path.join(orig, "config.json")))["architectures"][0], cls
        with torch.no_grad():
            got = model(torch.tensor([TOKENS])).logits[0].numpy()
        want = np.array(json.load(open(orig.rstrip("/") + ".logits.json")), np.float32)
        if not np.array_equal(got, want):
            print(f"{hf_dir}: logits differ: max {np.abs(got - want).max():.3e}", file=sys.stderr)
            failed = 1
    return failed


def bad(src, kind):
    path = os.path.join(src, "config.json")
    c = json.load(open(path))
    if kind == "short":
        c["layer_types"] = c["layer_types"][:-1]
    elif kind == "interval":
        c["full_attention_interval"] = 3
    elif kind == "kind":
        c["layer_types"][0] = "sliding_attention"
    elif kind == "mtp-two":
        c["mtp_num_hidden_layers"] = 2
    elif kind in ("drop-mtp", "fc-shape", "mtp-experts-dim"):
        return bad_mtp_tensor(src, kind)
    json.dump(c, open(path, "w"), indent=2)
    return 0


def bad_mtp_tensor(src, kind):
    """drop-mtp: mtp.pre_fc_norm_hidden.weight left out; fc-shape: mtp.fc.weight [H, H];
    mtp-experts-dim: the fused mtp.layers.0.mlp.experts.gate_up_proj one expert short [E - 1, 2F, H]."""
    import st_write
    tensors = read_checkpoint(src)
    if kind == "drop-mtp":
        del tensors["mtp.pre_fc_norm_hidden.weight"]
    elif kind == "mtp-experts-dim":
        dt, shape, raw = tensors["mtp.layers.0.mlp.experts.gate_up_proj"]
        tensors["mtp.layers.0.mlp.experts.gate_up_proj"] = (dt, (shape[0] - 1,) + tuple(shape[1:]),
                                                           raw[:len(raw) // shape[0] * (shape[0] - 1)])
    else:
        dt, shape, raw = tensors["mtp.fc.weight"]
        tensors["mtp.fc.weight"] = (dt, (shape[0], shape[0]), raw[:len(raw) // 2])
    h, _ = st_write.header_bytes([(k, dt, shape, len(raw)) for k, (dt, shape, raw) in tensors.items()],
                                 metadata=None, compact=False)
    with open(os.path.join(src, "model.safetensors"), "wb") as f:
        f.write(h + b"".join(raw for _, _, raw in tensors.values()))
    return 0


def main():
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "build":
        return build(rest[0]) or 0
    if cmd == "check":
        return check(rest)
    if cmd == "same":
        return same(*rest)
    if cmd == "mcore":  # SRC RELEASE_DIR pairs
        return max(mcore(src, release) for src, release in zip(rest[::2], rest[1::2]))
    if cmd == "logits":
        return logits(rest)
    if cmd == "bad":
        return bad(*rest)
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main())
