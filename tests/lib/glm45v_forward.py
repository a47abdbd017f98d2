#!/usr/bin/python3
"""GLM-4.5V's forward with Megatron semantics over the rank files of a layout, against
transformers' own forward of the source model (run in the sid root: transformers 5.12.1). Written
from mbridge's glm4v_moe bridge (mbridge/models/glm4_vl: Glm4VLModel.forward, VLMixin's
get_rope_index, get_image_features and merge_image_or_video) and Megatron-core 0.17.1
(MultimodalRotaryEmbedding with rotary_percent, the GPT model's TP/PP/VPP/EP semantics through
reference.py, moe_reference.py and glm_reference.py), not from ckptfs's code.

  glm45v_forward.py check ORIG VIEW LAYOUT [VIEW LAYOUT ...]
      for each VIEW (a copy of ORIG's LAYOUT: tp{T}pp{P}[vpp{V}][ep{E}]): the tower on every
      first-stage rank file the same bytes; the VLM forward over the rank files (the tower as
      mbridge runs it, the image rows put into the vocab-parallel word embeddings, mbridge's 3-D
      positions, the language model over TP ranks, stages, virtual chunks and EP files) equals
      transformers' float32 logits of ORIG on vlm.glm4v_inputs, with every expert of every MoE
      layer given some token; and the same forward over views with one plausible mistake (the
      tower's heads exchanged, the args' mrope sections reordered, TP shares exchanged, experts
      from the wrong EP file, chunks out of Megatron's order, the image rows or the 3-D
      positions left out) does not.
Prints "PASS what" or "FAIL what: why".
"""
import argparse
import itertools
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402
import vlm  # noqa: E402
from glm_reference import MegatronGLM, model_of_args  # noqa: E402
from moe_reference import file_name, parse_moe_layout  # noqa: E402

# Max relative logit error against transformers in float32 (both sides float32 on the same bf16
# weights: what is left is the order of float32 sums, ~1e-6).
TOLERANCE = 1e-4
TOWER = "vision_model."
LM = "language_model."


def tower_tensors(files, layout):
    """The tower's tensors of the first stage's first chunk (mbridge: Glm4VLModel builds it when
    pre_process, replicated on every TP and EP rank), and the files whose copy differs."""
    import torch
    tp, pp, vpp, ep, etp = layout
    first = sorted({file_name(t, 0, e, pp, ep) for t in range(tp) for e in range(ep)} & set(files))
    sds = {n: files[n][reference.chunk_key(0, vpp)] for n in first}
    ref = {k: v for k, v in sds[first[0]].items() if k.startswith(TOWER)}
    same = lambda a, b: a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))  # noqa: E731
    differ = [n for n, sd in sds.items()
              if {k for k in sd if k.startswith(TOWER)} != set(ref) or not all(same(sd[k], v) for k, v in ref.items())]
    later = [n for n in files for c in range(vpp) if (n not in first or c > 0)
             and any(k.startswith(TOWER) for k in files[n][reference.chunk_key(c, vpp)])]
    return ref, differ, sorted(set(later))


def image_embeds(orig, tensors, pixels, grid):
    """mbridge's get_image_features: transformers' Glm4vMoeVisionModel (the module mbridge keeps
    whole as vision_model) loaded from the rank file's vision_model.* tensors, run in float32
    on the pixels. transformers 5 returns the merger's output as pooler_output (mbridge, written
    for transformers 4, takes the module's return value: the same tensor)."""
    import torch
    import transformers
    cfg = transformers.AutoConfig.from_pretrained(orig)
    tower = transformers.Glm4vMoeVisionModel._from_config(cfg.vision_config)
    tower.load_state_dict({k[len(TOWER):]: v for k, v in tensors.items()}, strict=True)
    tower = tower.float().eval()
    with torch.no_grad():
        out = tower(pixels.float(), grid_thw=grid)
    return (out.pooler_output if hasattr(out, "pooler_output") else out).numpy()


def rope_index(ids, grid, cfg):
    """mbridge's VLMixin.get_rope_index for one sequence without padding: [3, T] positions; a
    text run counts on from the last maximum + 1 on all three axes, an image's merged patches
    get (t, h, w) on the merged grid, offset by the same start. (Videos are not in the input.)"""
    merge = cfg["vision_config"]["spatial_merge_size"]
    types, in_video = [], False
    for tok in ids:
        if tok == cfg["video_start_token_id"]:
            in_video = True
        elif tok == cfg["video_end_token_id"]:
            in_video = False
        types.append("image" if tok == cfg["image_token_id"] and not in_video else
                     "video" if tok == cfg["image_token_id"] else "text")
    parts, image = [], 0
    for kind, run in itertools.groupby(types):
        n = len(list(run))
        start = parts[-1].max() + 1 if parts else 0
        if kind == "image":
            t, h, w = (int(x) for x in grid[image])
            h, w = h // merge, w // merge
            parts.append(np.stack([np.repeat(np.arange(t), h * w), np.tile(np.repeat(np.arange(h), w), t),
                                   np.tile(np.arange(w), t * h)]) + start)
            assert parts[-1].shape[1] == n, "image tokens and the grid disagree"
            image += 1
        elif kind == "text":
            parts.append(np.tile(np.arange(n), (3, 1)) + start)
        else:
            raise ValueError("videos are not part of this input")
    return np.concatenate(parts, 1)


def megatron_logits(cfg, files, layout, embeds, positions, ids, image_rows=True):
    """The language model of mbridge's Glm4VLModel over FILES: embedding (vocab-parallel rows),
    the image's rows scattered in at the image token positions (merge_image_or_video), then
    decoder and output layer with Megatron's multimodal rope of rotary_percent x kv_channels
    channels."""
    tp, pp, vpp, ep, etp = layout
    args = next(iter(files.values()))["args"]
    m = model_of_args(args, cfg["text_config"])
    m.rotate = reference.mrope(positions, m.theta, m.rotary_dim, list(args.mrope_section))
    mask = np.asarray(ids) == cfg["image_token_id"]

    def embed(x):
        x = x.copy()
        x[mask] = embeds
        return x
    model = MegatronGLM(m, reference.language_model_files(files, LM), layout, args)
    routed = []  # the tokens each expert of each MoE layer got, so that none goes unchecked
    route = model.route

    def counted(*a):
        w = route(*a)
        routed.append((w != 0).sum(0))
        return w
    model.route = counted
    logits = model.forward("te", np.asarray(ids), embed=embed if image_rows else None)
    return logits, int(np.min(routed)) if routed else 0


def hf_logits(orig, inputs):
    """transformers' own forward of ORIG in float32 (its bf16 weights upcast)."""
    import torch
    import transformers
    model = transformers.Glm4vMoeForConditionalGeneration.from_pretrained(orig, dtype=torch.float32).eval()
    ids, pixels, grid, extra = inputs
    with torch.no_grad():
        return model(input_ids=ids, pixel_values=pixels.float(), image_grid_thw=grid, **extra).logits[0].numpy()


def copy_files(files):
    return {n: {k: (dict(v) if k.startswith("model") else v) for k, v in f.items()} for n, f in files.items()}


def mutations(files, layout, vision):
    """[(what, files)]: views with one plausible mistake each, for the layout's parallelism."""
    tp, pp, vpp, ep, etp = layout
    out = []
    first = reference.chunk_key(0, vpp)
    # the tower (whole on every first-stage file): block 0's first two heads' queries exchanged
    bad = copy_files(files)
    k, d = TOWER + "blocks.0.attn.qkv.weight", vision["hidden_size"] // vision["num_heads"]
    for n in {file_name(t, 0, e, pp, ep) for t in range(tp) for e in range(ep)} & set(files):
        w = files[n][first][k]
        bad[n][first][k] = w[list(range(d, 2 * d)) + list(range(d)) + list(range(2 * d, w.shape[0]))]
    out.append(("the tower's query heads exchanged", bad))
    # the args' mrope sections in another order (temporal, height and width frequencies mixed up)
    bad = copy_files(files)
    for n, f in bad.items():
        f["args"] = argparse.Namespace(**vars(files[n]["args"]))
        f["args"].mrope_section = list(f["args"].mrope_section)[::-1]
    out.append(("mrope sections reversed in the args", bad))
    if tp > 1:  # layer 0's column-parallel qkv shares of TP ranks 0 and 1 exchanged
        bad = copy_files(files)
        a, b = file_name(0, 0, 0, pp, ep), file_name(1, 0, 0, pp, ep)
        k = LM + "decoder.layers.0.self_attention.linear_qkv.weight"
        bad[a][first][k], bad[b][first][k] = files[b][first][k], files[a][first][k]
        out.append(("linear_qkv TP shares exchanged", bad))
    if ep > 1:  # EP rank 0's file holding EP rank 1's experts
        bad = copy_files(files)
        a, b = file_name(0, 0, 0, pp, ep), file_name(0, 0, 1, pp, ep)
        for c in range(vpp):
            ck = reference.chunk_key(c, vpp)
            bad[a][ck].update({k: v for k, v in files[b][ck].items() if ".mlp.experts." in k})
        out.append(("experts from another EP rank's file", bad))
    if vpp > 1:  # stage 0's chunk 1 and stage 1's chunk 0 exchanged: layers out of Megatron's order
        bad = copy_files(files)
        a, b = file_name(0, 0, 0, pp, ep), file_name(0, pp - 1, 0, pp, ep)
        lm = lambda sd: {k: v for k, v in sd.items() if k.startswith(LM + "decoder.")}  # noqa: E731
        for n, ck, src in ((a, "model1", lm(files[b]["model0"])), (b, "model0", lm(files[a]["model1"]))):
            bad[n][ck] = {k: v for k, v in bad[n][ck].items() if not k.startswith(LM + "decoder.")}
            bad[n][ck].update(src)
        out.append(("chunks out of Megatron's order", bad))
    return out


def check(orig, pairs):
    """PAIRS: [(view, layout)]. One transformers run for all."""
    cfg = json.load(open(os.path.join(orig, "config.json")))
    inputs = vlm.glm4v_inputs()
    ids, pixels, grid, _ = inputs
    want = hf_logits(orig, inputs)
    positions = rope_index(ids[0].tolist(), grid.tolist(), cfg)
    for view, name in pairs:
        layout = parse_moe_layout(name)
        files = reference.load_release(view)
        tensors, differ, later = tower_tensors(files, layout)
        bad = [f"tower differs on {differ}"] if differ else []
        bad += [f"tower outside the first stage's first chunk in {later}"] if later else []
        bad += [] if tensors else ["no vision_model.* tensors on the first stage"]
        if bad:
            print(f"FAIL {view} {name}: {bad}")
            continue
        embeds = image_embeds(orig, tensors, pixels, grid)
        err = lambda got: float(np.abs(got - want).max() / np.abs(want).max())  # noqa: E731
        got, fewest = megatron_logits(cfg, files, layout, embeds, positions, ids[0].tolist())
        e = err(got)
        wrong = []
        for what, bad_files in mutations(files, layout, cfg["vision_config"]):
            bad_tower = tower_tensors(bad_files, layout)[0]
            bad_embeds = embeds if all(bad_tower[k] is v for k, v in tensors.items()) else \
                image_embeds(orig, bad_tower, pixels, grid)
            wrong.append((what, megatron_logits(cfg, bad_files, layout, bad_embeds, positions, ids[0].tolist())[0]))
        wrong.append(("the image's rows left out", megatron_logits(cfg, files, layout, embeds, positions,
                                                                   ids[0].tolist(), image_rows=False)[0]))
        flat = np.tile(np.arange(len(ids[0])), (3, 1))
        wrong.append(("1-D positions", megatron_logits(cfg, files, layout, embeds, flat, ids[0].tolist())[0]))
        missed = [what for what, off in wrong if err(off) < TOLERANCE]
        least = min(err(off) for _, off in wrong)
        ok = e < TOLERANCE and not missed and fewest > 0
        print(f"{'PASS' if ok else 'FAIL'} {view} {name}: Megatron-semantics VLM forward over its {len(files)} rank "
              f"files equals transformers' float32 logits on an image + text input (max rel err {e:.2g}); "
              f"{len(wrong) - len(missed)} of {len(wrong)} wrong views rejected (the least off by {least:.2g})"
              + (f" (not rejected: {missed})" if missed else "") + ("" if e < TOLERANCE else " (over tolerance)")
              + ("" if fewest else " (some expert got no token)"))


if __name__ == "__main__":
    if sys.argv[1:2] == ["check"] and len(sys.argv) >= 5:
        check(sys.argv[2], list(zip(sys.argv[3::2], sys.argv[4::2])))
    else:
        sys.exit(__doc__)
