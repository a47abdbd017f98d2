#!/usr/bin/python3
"""What a torch_dist (mcore/) checkpoint of a Hugging Face mixture-of-experts model holds, with
numpy only, from research/moe-real-megatron.md section 3 and Megatron-LM core_v0.17.1
(TransformerBlock.sharded_state_dict, SequentialMLP / TEGroupedMLP.sharded_state_dict), not from
ckptfs's code. The dense parts are mcore_expect's (q/k/v interleaved per query group, fc1 =
[gate; up], vocabulary padded with zero rows).

- Every layer MoE (moe_layer_freq 1): one key per weight with a leading layer axis [L, ...]:
  decoder.layers.mlp.router.weight [L, E, H], decoder.layers.mlp.experts.experts.linear_fc1.weight
  [L, E, 2F, H] (rows gate then up), ...linear_fc2.weight [L, E, H, F], shared expert
  decoder.layers.mlp.shared_experts.{linear_fc1.weight [L, 2S, H], linear_fc2.weight [L, H, S],
  gate_weight [L, 1, H]}; the experts' key and shape are the same with and without grouped GEMM.
- Some layers dense (moe_layer_freq a list): TransformerBlock saves every layer under its own
  prefix, decoder.layers.{l}.<name>, with no layer axis (expert keys [E, ...]).
- The pre-MLP norm of an MoE layer: local spec mlp.linear_fc1.layer_norm_weight (the local
  spec's keys map renames pre_mlp_layernorm. so; seen in Megatron's files), TE spec
  pre_mlp_layernorm.weight (its keys map leaves it; from the source only). Dense layers:
  mlp.linear_fc1.layer_norm_weight in both.

  mcore_moe_expect.py check CKPT_DIR HF_DIR [--spec te|local]
    CKPT_DIR: an iter_*/release dir of a torch_dist checkpoint. With torch 1.13 (dcp_host's
    reader): the model tensor keys (optimizer.*, rng_state and _extra_state objects aside) equal
    the expectation's, and every tensor, assembled from its chunks, equals it bit for bit.
  mcore_moe_expect.py selftest [--megatron-data DIR]
    check on mixtral-tp1pp2ep2-torch_dist, which Megatron itself wrote (local spec; DIR:
    tests/data/megatron-core-0.17.1 by default).
"""
import argparse
import io
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mcore_expect import LP, qkv_interleave  # noqa: E402
from moe_reference import MoEModel  # noqa: E402


def layer_tensors(m, i, spec):
    """name (after the layer prefix) -> bf16 bits of global layer i."""
    g = lambda s: m.layer(i, s)  # noqa: E731
    out = {"self_attention.linear_qkv.layer_norm_weight": g("input_layernorm.weight"),
           "self_attention.linear_qkv.weight": qkv_interleave(m, *(g(f"self_attn.{p}_proj.weight") for p in "qkv")),
           "self_attention.linear_proj.weight": g("self_attn.o_proj.weight")}
    if m.bias:
        out["self_attention.linear_qkv.bias"] = qkv_interleave(m, *(g(f"self_attn.{p}_proj.bias") for p in "qkv"))
    if m.qk:
        out["self_attention.q_layernorm.weight"] = g("self_attn.q_norm.weight")
        out["self_attention.k_layernorm.weight"] = g("self_attn.k_norm.weight")
    norm2 = g("post_attention_layernorm.weight")
    if not m.moe[i]:
        out["mlp.linear_fc1.layer_norm_weight"] = norm2
        out["mlp.linear_fc1.weight"] = np.concatenate([g("mlp.gate_proj.weight"), g("mlp.up_proj.weight")])
        out["mlp.linear_fc2.weight"] = g("mlp.down_proj.weight")
        return out
    out["pre_mlp_layernorm.weight" if spec == "te" else "mlp.linear_fc1.layer_norm_weight"] = norm2
    out["mlp.router.weight"] = g(m.router_name)
    experts = [m.expert(i, n) for n in range(m.N)]
    out["mlp.experts.experts.linear_fc1.weight"] = np.stack([np.concatenate([gate, up]) for gate, up, _ in experts])
    out["mlp.experts.experts.linear_fc2.weight"] = np.stack([down for _, _, down in experts])
    if m.S is not None:
        gate, up, down = (g(f"mlp.shared_expert.{w}_proj.weight") for w in ("gate", "up", "down"))
        out["mlp.shared_experts.linear_fc1.weight"] = np.concatenate([gate, up])
        out["mlp.shared_experts.linear_fc2.weight"] = down
        if m.shared_gate:
            out["mlp.shared_experts.gate_weight"] = g("mlp.shared_expert_gate.weight")
    return out


def expected_moe_tensors(m, vpad, spec="local"):
    """Megatron key -> (bf16 bits, "BF16"), the vocabulary padded to vpad rows."""
    def vocab_rows(name):
        a = m.bits(name)
        return np.concatenate([a, np.zeros((vpad - a.shape[0],) + a.shape[1:], a.dtype)])

    out = {"embedding.word_embeddings.weight": vocab_rows("model.embed_tokens.weight")}
    if not m.tied:
        out["output_layer.weight"] = vocab_rows("lm_head.weight")
    out["decoder.final_layernorm.weight"] = m.bits("model.norm.weight")
    layers = [layer_tensors(m, i, spec) for i in range(m.L)]
    if all(m.moe):
        for name in layers[0]:
            out[LP + name] = np.stack([t[name] for t in layers])
    else:
        for i, t in enumerate(layers):
            out.update({f"{LP}{i}.{name}": a for name, a in t.items()})
    return {k: (a, "BF16") for k, a in out.items()}


def stored_tensors(ckpt):
    """{key: global array (raw bits)} of the tensors of a torch_dist checkpoint, read with
    dcp_host's inert .metadata unpickler and torch 1.13 (any torch loads the items)."""
    import torch
    from dcp_host import RAW, MetadataUnpickler, kind
    with open(os.path.join(ckpt, ".metadata"), "rb") as f:
        md = MetadataUnpickler(f).load()
    sdm, storage = md.state["state_dict_metadata"], md.state["storage_data"]
    where = {(k.state["fqn"], tuple(k.state.get("offset") or ())): v.state for k, v in storage.items()}
    out = {}
    for key, meta in sdm.items():
        if kind(meta) != "TensorStorageMetadata" or key.startswith("optimizer."):
            continue
        st = meta.state
        dtype = st["properties"].state[0]
        np_raw, torch_raw = RAW[dtype]
        got = np.full(st["size"], np.iinfo(np_raw).max, np_raw)  # no chunk left unfilled passes
        for c in st["chunks"]:
            off, size = c.state["offsets"], c.state["sizes"]
            s = where[(key, tuple(off))]
            with open(os.path.join(ckpt, s["relative_path"]), "rb") as f:
                f.seek(s["offset"])
                t = torch.load(io.BytesIO(f.read(s["length"])), map_location="cpu")
            assert tuple(t.shape) == tuple(size) and t.dtype == dtype, f"{key} chunk at {off}"
            got[tuple(slice(o, o + n) for o, n in zip(off, size))] = t.view(torch_raw).numpy().view(np_raw)
        out[key] = got
    return out


def compare(ckpt, m, spec):
    """Error lines (empty when the checkpoint holds exactly the expected tensors) and a count."""
    got = stored_tensors(ckpt)
    vpad = got["embedding.word_embeddings.weight"].shape[0]
    want = expected_moe_tensors(m, vpad, spec)
    errors = [f"unexpected key {k}" for k in sorted(set(got) - set(want))]
    errors += [f"missing key {k}" for k in sorted(set(want) - set(got))]
    for k in sorted(set(got) & set(want)):
        if got[k].shape != want[k][0].shape:
            errors.append(f"{k}: shape {got[k].shape}, expected {want[k][0].shape}")
        elif not np.array_equal(got[k], want[k][0]):
            errors.append(f"{k}: values differ")
    return errors, len(got)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("ckpt")
    c.add_argument("hf")
    c.add_argument("--spec", default="te")
    s = sub.add_parser("selftest")
    here = os.path.dirname(os.path.abspath(__file__))
    s.add_argument("--megatron-data", default=os.path.join(here, "..", "data", "megatron-core-0.17.1"))
    a = ap.parse_args()
    if a.cmd == "check":
        ckpt, m, spec = a.ckpt, MoEModel(a.hf), a.spec
    else:
        ckpt = os.path.join(a.megatron_data, "mixtral-tp1pp2ep2-torch_dist", "iter_0000010")
        m, spec = MoEModel(os.path.join(a.megatron_data, "hf-mixtral")), "local"
    errors, n = compare(ckpt, m, spec)
    if errors:
        print("\n".join(errors[:30]), file=sys.stderr)
        sys.exit(1)
    print(f"# {ckpt}: {n} model tensors, keys and every tensor equal to the expectation ({spec} spec)")


if __name__ == "__main__":
    main()
