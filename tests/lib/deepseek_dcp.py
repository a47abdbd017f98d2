#!/usr/bin/python3
"""Checks the torch_dist checkpoint (mcore/) of a DeepSeek (or GLM-4.5, GPT-OSS) model against the legacy rank file of
the same mount's tp1pp1 (or tp1pp1ep1) view, which deepseek_reference.py checks against an
independent expectation. Names follow Megatron-core's sharded_state_dict (core_v0.17.1):

- a model whose layers are all of one kind (GPT-OSS) stacks them in a leading layer axis,
  `decoder.layers.<name>` [L, ...] ([L, E, ...] for experts);
- DeepSeek's layers are not all of one kind (dense first): every layer key is per layer,
  `decoder.layers.{l}.<name>` with no layer axis; routed experts stacked in an expert axis,
  `decoder.layers.{l}.mlp.experts.experts.linear_fc1.weight` [E, 2F, H], whose expert e is the
  legacy `decoder.layers.{l}.mlp.experts.local_experts.{e}.linear_fc1.weight`;
- the vocabulary padded (rows beyond the legacy file's are zero);
- a multi-token prediction layer: `mtp.layers.{j}.transformer_layer.<name>` (the name
  MultiTokenPredictionLayer.sharded_state_dict keeps for checkpoints) for the legacy
  `mtp.layers.{j}.mtp_model_layer.<name>`, and `mtp.layers.{j}.{enorm,hnorm,eh_proj,
  final_layernorm}.weight` as they are;
- `_extra_state` objects load (None); common.pt's args say multi_latent_attention as the legacy
  file's do (DeepSeek: true, GLM-4.5: false).

  deepseek_dcp.py check MCORE_DIR LEGACY_FILE      (torch 2.x: torch.distributed.checkpoint)
"""
import io
import re
import sys
import warnings

warnings.filterwarnings("ignore", message="torch.distributed is unavailable or uninitialized")


def fail(msg):
    sys.exit(f"deepseek_dcp: {msg}")


def legacy_name(key):
    """The legacy (tp1pp1) entry holding mcore KEY, and for stacked experts the entry pattern."""
    key = re.sub(r"^mtp\.layers\.(\d+)\.transformer_layer\.", r"mtp.layers.\1.mtp_model_layer.", key)
    if ".mlp.experts.experts." in key:
        return key.replace(".mlp.experts.experts.", ".mlp.experts.local_experts.{e}."), True
    return key, False


def main(argv):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    if len(argv) != 3 or argv[0] != "check":
        sys.exit(__doc__)
    ckpt, legacy_file = argv[1], argv[2]
    import argparse
    torch.serialization.add_safe_globals([argparse.Namespace])
    legacy_top = torch.load(legacy_file, map_location="cpu", weights_only=True)
    legacy = legacy_top["model"]
    legacy_tensors = {k: v for k, v in legacy.items() if isinstance(v, torch.Tensor)}
    md = FileSystemReader(ckpt).read_metadata()
    sdm = md.state_dict_metadata
    tensors = {k: m for k, m in sdm.items() if not isinstance(m, BytesStorageMetadata)}
    objects = [k for k, m in sdm.items() if isinstance(m, BytesStorageMetadata)]
    sd = {}
    for k, m in tensors.items():
        sd[k] = torch.empty(tuple(m.size), dtype=m.properties.dtype)
        sd[k].view(torch.uint8).fill_(0xFF)
    dcp.load(sd, storage_reader=FileSystemReader(ckpt))
    covered = set()
    def legacy_of(k, name, stacked, experts):
        if stacked:
            parts = []
            for e in range(experts):
                n = name.format(e=e)
                if n not in legacy_tensors:
                    fail(f"{k}: expert {e}: no legacy '{n}'")
                parts.append(legacy_tensors[n])
                covered.add(n)
            return torch.stack(parts)
        if name not in legacy_tensors:
            fail(f"{k}: no legacy entry '{name}'")
        covered.add(name)
        return legacy_tensors[name]

    for k, got in sd.items():
        name, stacked = legacy_name(k)
        if re.match(r"decoder\.layers\.[a-z]", name):  # every layer of one kind: a layer axis first
            want = torch.stack([legacy_of(k, name.replace("decoder.layers.", f"decoder.layers.{l}.", 1), stacked,
                                          got.shape[1] if stacked else 0) for l in range(got.shape[0])])
        else:
            want = legacy_of(k, name, stacked, got.shape[0])
        if got.dtype != want.dtype:
            fail(f"{k}: dtype {got.dtype}, legacy {want.dtype}")
        if name in ("embedding.word_embeddings.weight", "output_layer.weight") and got.shape[0] >= want.shape[0]:
            pad = got[want.shape[0]:]
            if pad.numel() and bool((pad.view(torch.uint8) != 0).any()):
                fail(f"{k}: vocabulary padding rows are not zero")
            got = got[:want.shape[0]]
        if tuple(got.shape) != tuple(want.shape):
            fail(f"{k}: shape {tuple(got.shape)}, legacy {tuple(want.shape)}")
        if not torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8)):
            fail(f"{k}: differs from the legacy file's '{name}'")
    left = sorted(set(legacy_tensors) - covered)
    if left:
        fail(f"legacy tensors no mcore key holds: {left[:5]}")
    osd = {k: io.BytesIO() for k in objects}
    dcp.load(osd, storage_reader=FileSystemReader(ckpt))
    kinds = {repr(v) for v in osd.values()}
    if not kinds <= {"[None]", "None"}:
        fail(f"_extra_state values {sorted(kinds)}")
    common = torch.load(f"{ckpt}/common.pt", map_location="cpu", weights_only=False)
    args = common.get("args")
    mla = getattr(legacy_top["args"], "multi_latent_attention", False)
    if args is None or getattr(args, "multi_latent_attention", None) != mla:
        fail(f"common.pt: args.multi_latent_attention is not {mla} as in the legacy file")
    mtp = sum(1 for k in sd if k.startswith("mtp.layers."))
    print(f"# {len(sd)} tensor keys ({mtp} of MTP layers) equal the legacy file's {len(covered)} tensors; "
          f"{len(objects)} _extra_state objects load")


if __name__ == "__main__":
    main(sys.argv[1:])
