#!/usr/bin/env python3
"""Real Megatron-core (a Megatron-LM checkout in $MEGATRON_LM) builds the tiny Qwen3.5 text model
(gated delta-net hybrid) on CPU; its state_dict() is compared (keys, shapes, order) with a ckptfs
tp1pp1/ rank file and loaded from it with load_state_dict(strict=True).

usage: MEGATRON_LM=/path mcore_gdn_check.py SRC_DIR RANK_FILE [MCORE_RELEASE_DIR] [--tp2 TP2PP1_VIEW]
(torch 2: the sid root). With MCORE_RELEASE_DIR, sharded_state_dict()'s keys and global shapes
against mcore/'s .metadata; with --tp2, two gloo ranks at TP 2, each against its rank file.

What this machine lacks is stood in for, and only that:
- fla (flash-linear-attention): modules fla.modules.l2norm and fla.ops.gated_delta_rule with
  functions that raise if called (GatedDeltaNet refuses to construct without them; nothing here
  runs a forward);
- torch.cuda.current_device: returns "cpu" (GatedDeltaNet allocates conv1d, dt_bias, A_log on it);
- Transformer Engine: Megatron-core's hybrid spec asserts TE; the delta-net spec itself
  (get_gated_delta_net_module_spec) is called with a local backend whose fused
  norm+column-parallel linear is Megatron-core's ColumnParallelLinear plus a layer_norm_weight
  (TE's TELayerNormColumnParallelLinear's name). The attention and MLP are the local spec's with
  linear_qkv and linear_fc1 given the same stand-in, so the norms carry TE's fused names.
TE modules' _extra_state entries have no CPU counterpart: they are listed and left out of the
strict load."""
import json
import os
import sys
import types

import torch


def stub_missing_kernels():
    def unavailable(*_a, **_k):
        raise RuntimeError("flash-linear-attention kernel stubbed: not available on this machine")
    mods = {}
    for name in ("fla", "fla.modules", "fla.modules.l2norm", "fla.ops", "fla.ops.gated_delta_rule"):
        mods[name] = types.ModuleType(name)
    mods["fla.modules.l2norm"].l2norm = unavailable
    mods["fla.ops.gated_delta_rule"].chunk_gated_delta_rule = unavailable
    sys.modules.update(mods)
    torch.cuda.current_device = lambda: "cpu"
    return sorted(mods) + ["torch.cuda.current_device"]


def build_model(cfg_json, padded_vocab):
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_gated_delta_net_module_spec, get_linear_attention_pattern)
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import ColumnParallelLinear
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
    from megatron.core.transformer.transformer_config import TransformerConfig
    import copy

    class NormColumnParallelLinear(ColumnParallelLinear):
        """TE's fused RMSNorm + column-parallel linear, by name only (the norm is not applied)."""
        def __init__(self, input_size, *args, **kwargs):
            super().__init__(input_size, *args, **kwargs)
            self.layer_norm_weight = torch.nn.Parameter(torch.ones(input_size))
            # TE's LayerNormLinear registers its norm before its weight
            self._parameters = {"layer_norm_weight": self._parameters.pop("layer_norm_weight"),
                                **self._parameters}

    class FusedNormLocalBackend(LocalSpecProvider):
        def fuse_layernorm_and_linear(self):
            return True

        def column_parallel_layer_norm_linear(self):
            return NormColumnParallelLinear

    c = cfg_json
    layers = c["num_hidden_layers"]
    pattern = [0 if t == "full_attention" else 1 for t in c["layer_types"]]
    config = TransformerConfig(
        num_layers=layers, hidden_size=c["hidden_size"], ffn_hidden_size=c["intermediate_size"],
        num_attention_heads=c["num_attention_heads"], num_query_groups=c["num_key_value_heads"],
        kv_channels=c["head_dim"], normalization="RMSNorm", layernorm_epsilon=c["rms_norm_eps"],
        layernorm_zero_centered_gamma=False, qk_layernorm=True, attention_output_gate=True,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False,
        experimental_attention_variant="gated_delta_net", linear_attention_freq=pattern,
        linear_conv_kernel_dim=c["linear_conv_kernel_dim"], linear_key_head_dim=c["linear_key_head_dim"],
        linear_value_head_dim=c["linear_value_head_dim"], linear_num_key_heads=c["linear_num_key_heads"],
        linear_num_value_heads=c["linear_num_value_heads"], use_cpu_initialization=True,
        perform_initialization=False,  # values come from the rank file; no CUDA RNG tracker here
        params_dtype=torch.float32, transformer_impl="local")
    assert get_linear_attention_pattern(config) == pattern

    backend = FusedNormLocalBackend()
    local = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    attention_layer = copy.deepcopy(local)
    attention_layer.submodules.input_layernorm = IdentityOp
    attention_layer.submodules.self_attention.submodules.linear_qkv = NormColumnParallelLinear
    attention_layer.submodules.pre_mlp_layernorm = IdentityOp
    attention_layer.submodules.mlp.submodules.linear_fc1 = NormColumnParallelLinear
    gdn_layer = copy.deepcopy(attention_layer)
    gdn_layer.submodules.self_attention = get_gated_delta_net_module_spec(config, backend=backend)
    block = TransformerBlockSubmodules(
        layer_specs=[gdn_layer if p else attention_layer for p in pattern],
        layer_norm=backend.layer_norm(rms_norm=True))
    return GPTModel(config=config, transformer_layer_spec=block, vocab_size=padded_vocab,
                    max_sequence_length=c["max_position_embeddings"], position_embedding_type="rope",
                    rotary_percent=c.get("partial_rotary_factor", 1.0),
                    share_embeddings_and_output_weights=c.get("tie_word_embeddings", False))


def init_parallel(store, rank=0, tp=1):
    """CPU ranks, gloo over a file store (no TCP store: the sid root's torch lacks libuv)."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=tp)
    parallel_state.initialize_model_parallel(tp, 1)


def compare_rank_file(cfg, rank_file):
    """Builds the model for this rank; 0 when the rank file matches it and loads strictly."""
    saved = torch.load(rank_file, map_location="cpu", weights_only=False)
    # Megatron builds GPTModel with the padded vocabulary (args.padded_vocab_size)
    model = build_model(cfg, saved["args"].padded_vocab_size)
    ours = model.state_dict()
    theirs = saved["model"]
    extra = [k for k in theirs if k.endswith("._extra_state")]
    theirs_w = {k: v for k, v in theirs.items() if not k.endswith("._extra_state")}
    ours_w = {k: v for k, v in ours.items() if not k.endswith("._extra_state")}
    problems = []
    only_mcore = [k for k in ours_w if k not in theirs_w]
    only_ckptfs = [k for k in theirs_w if k not in ours_w]
    problems += [f"only in Megatron-core: {k} {tuple(ours_w[k].shape)}" for k in only_mcore]
    problems += [f"only in the rank file: {k} {tuple(theirs_w[k].shape)}" for k in only_ckptfs]
    for k in ours_w:
        if k in theirs_w and tuple(ours_w[k].shape) != tuple(theirs_w[k].shape):
            problems.append(f"shape of {k}: Megatron-core {tuple(ours_w[k].shape)}, "
                            f"rank file {tuple(theirs_w[k].shape)}")
    common = [k for k in ours_w if k in theirs_w]
    if common != [k for k in theirs_w if k in ours_w]:
        problems.append("order differs: Megatron-core " + " ".join(common))
    extra_ours = [k for k in ours if k.endswith("._extra_state")]
    print("_extra_state only in the rank file (TE modules):", " ".join(sorted(set(extra) - set(extra_ours))))
    print("_extra_state only in Megatron-core (local modules):", " ".join(sorted(set(extra_ours) - set(extra))))
    print(f"{rank_file}: {len(ours_w)} Megatron-core tensors, {len(theirs_w)} in the rank file, "
          f"{len(extra)} TE _extra_state entries in the rank file (no CPU counterpart)")
    for p in problems:
        print("DIFF", p)
    if problems:
        return 1
    model.load_state_dict({k: v.float() for k, v in theirs_w.items()}, strict=True)
    got = model.state_dict()
    assert all(torch.equal(got[k], theirs_w[k].float()) for k in theirs_w)
    print("load_state_dict(strict=True) of the rank file's tensors: ok")
    return 0


def tp_rank(rank, src, view, store, tp):
    setup()
    init_parallel(store, rank, tp)
    cfg = json.load(open(os.path.join(src, "config.json")))
    sys.exit(compare_rank_file(cfg, os.path.join(view, "release", f"mp_rank_{rank:02d}", "model_optim_rng.pt")))


def setup():
    sys.path.insert(0, os.environ["MEGATRON_LM"])
    return stub_missing_kernels()


def main():
    import argparse
    import tempfile
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("rank_file", help="tp1pp1/'s release/mp_rank_00/model_optim_rng.pt")
    ap.add_argument("mcore_release", nargs="?", help="mcore/release: sharded_state_dict keys against it")
    ap.add_argument("--tp2", metavar="VIEW", help="a tp2pp1/ view: two gloo ranks, each against its rank file")
    a = ap.parse_args()
    print("stubbed:", ", ".join(setup()))
    tmp = tempfile.mkdtemp()
    init_parallel(os.path.join(tmp, "store1"))
    from megatron.core import package_info
    print("megatron-core", package_info.__version__)
    cfg = json.load(open(os.path.join(a.src, "config.json")))
    if compare_rank_file(cfg, a.rank_file):
        return 1
    if a.mcore_release and compare_sharded(cfg, a.mcore_release):
        return 1
    if a.tp2:
        import torch.multiprocessing as mp
        try:
            mp.spawn(tp_rank, args=(a.src, a.tp2, os.path.join(tmp, "store2"), 2), nprocs=2)
        except mp.ProcessExitedException as e:
            print("TP 2:", e)
            return 1
        print("TP 2: both ranks' rank files match and load strictly")
    return 0


def compare_sharded(cfg, release):
    """Megatron-core's sharded_state_dict() (factories applied: in_proj and conv1d a key per
    section) against the keys and global shapes of ckptfs's mcore/ .metadata."""
    import torch.distributed.checkpoint as dcp
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories
    meta = dcp.FileSystemReader(release).read_metadata().state_dict_metadata
    # mcore/ pads the vocabulary for any TP degree it may be loaded at
    model = build_model(cfg, meta["embedding.word_embeddings.weight"].size[0])
    sharded = model.sharded_state_dict()
    apply_factories(sharded)
    ours = {}
    for v in nested_values(sharded):
        if isinstance(v, ShardedTensor):
            ours[v.key] = tuple(v.global_shape)
    theirs = {k: tuple(m.size) for k, m in meta.items() if hasattr(m, "chunks") and "_extra_state" not in k}
    diffs = [f"only in Megatron-core's sharded_state_dict: {k} {ours[k]}" for k in ours if k not in theirs]
    diffs += [f"only in mcore/.metadata: {k} {theirs[k]}" for k in theirs if k not in ours]
    diffs += [f"global shape of {k}: Megatron-core {ours[k]}, mcore/ {theirs[k]}" for k in ours
              if k in theirs and ours[k] != theirs[k]]
    print(f"sharded_state_dict: {len(ours)} tensor keys; mcore/.metadata: {len(theirs)}")
    for d in diffs:
        print("DIFF", d)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
