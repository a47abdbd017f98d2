#!/usr/bin/python3
"""The forward of a Qwen2.5-VL, Qwen3-VL or Qwen3-VL-MoE with Megatron semantics, computed from
the rank files of a layout (run in the sid root), against transformers' own forward of the source
model on vlm.py's image + text input. Written from mbridge's qwen2_5_vl and qwen3_vl models
(vision_model.py, model.py, rope_utils.py, utils.py, transformer_block.py) and Megatron-core's
TP/PP rules, not from ckptfs: every TP rank computes its slice of the tower (column-parallel
linear_qkv / linear_fc1 on its rows, attention on its own heads, row-parallel linear_proj /
linear_fc2 as partial products summed), the projector likewise, the image rows put into the word
embeddings at the image tokens, mrope positions from mbridge's get_rope_index, then the language
model through reference.py's megatron_forward (dense) or moe_reference.MegatronMoE (experts read
from the file of the EP rank holding them), Qwen3-VL's deepstack added after its first layers.

  qwen_vl_forward.py check ORIG VIEW_DIR:LAYOUT [VIEW_DIR:LAYOUT ...] [-- ORIG VIEW_DIR:LAYOUT ...]
      one line per layout: "PASS ..." when the logits and the tower's outputs (image rows,
      deepstack features) equal transformers' (float32, the bf16 weights upcast) within
      TOLERANCE and the logits of a mutated copy of the rank files (two TP shares of a tower qkv
      exchanged, or its two heads when TP is 1; for EP layouts also EP rank 1's experts read
      from EP rank 0's file) no longer do; "FAIL ..." otherwise.
"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from glm_reference import model_of_args  # noqa: E402
from moe_reference import MegatronMoE, file_name, parse_moe_layout  # noqa: E402
from reference import (chunk_key, f32, gelu_erf, gelu_tanh, language_model_files, layer_norm, load_release,  # noqa: E402
                       megatron_forward, mrope, rms, rotate_half, silu)
import vlm  # noqa: E402

# float32 on both sides: what is left is summation order (3.5e-7 measured). Tight, as the
# tiny tower's effect on the logits is small: its first qkv's TP shares exchanged moves them
# by ~1e-4 of their largest.
TOLERANCE = 1e-5


def norm_of(sd, pre, eps):
    """The norm named pre + "weight" (+ "bias": LayerNorm, else RMSNorm), as a function."""
    w = f32(sd[pre + "weight"])
    if pre + "bias" in sd:
        b = f32(sd[pre + "bias"])
        return lambda x: layer_norm(x, w, b, eps)
    return lambda x: rms(x, w, eps)


def segment_attention(q, k, v, cu):
    """Non-causal attention of q/k/v [heads, T, d] within each [cu[i], cu[i+1]) (Megatron's thd
    packed sequences: no token sees another segment's)."""
    out = np.zeros_like(q)
    for s, e in zip(cu[:-1], cu[1:]):
        if e <= s:
            continue
        sc = q[:, s:e] @ k[:, s:e].transpose(0, 2, 1) / np.sqrt(q.shape[-1])
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        out[:, s:e] = (sc / sc.sum(-1, keepdims=True)) @ v[:, s:e]
    return out


def column(sd, name, h):
    """A column-parallel linear on one rank: h @ its rows + its bias share."""
    out = h @ f32(sd[name + ".weight"]).T
    return out + f32(sd[name + ".bias"]) if name + ".bias" in sd else out


def row_parallel(sds, name, parts):
    """A row-parallel linear: each rank's partial product of its columns, summed (the
    all-reduce), the bias (whole on every rank) added once."""
    out = sum(p @ f32(sd[name + ".weight"]).T for p, sd in zip(parts, sds))
    return out + f32(sds[0][name + ".bias"]) if name + ".bias" in sds[0] else out


def vit_block(sds, pre, x, heads, eps, act, gated, rotate, cu):
    """One Megatron ViT TransformerLayer (TE spec: norms fused into linear_qkv / linear_fc1) over
    the TP ranks' state dicts sds: attention on each rank's heads ([q; k; v] rows per head),
    non-causal within the cu segments, rotate(q or k) the 2-D rope; then the MLP, gated
    ([gate share; up share] per rank) or not."""
    T, tp = x.shape[0], len(sds)
    h = norm_of(sds[0], pre + "self_attention.linear_qkv.layer_norm_", eps)(x)
    parts = []
    for sd in sds:
        qkv = column(sd, pre + "self_attention.linear_qkv", h).reshape(T, heads // tp, 3, -1)
        q, k, v = (qkv[:, :, i].transpose(1, 0, 2) for i in range(3))
        a = segment_attention(rotate(q), rotate(k), v, cu)
        parts.append(a.transpose(1, 0, 2).reshape(T, -1))
    x = x + row_parallel(sds, pre + "self_attention.linear_proj", parts)
    h = norm_of(sds[0], pre + "mlp.linear_fc1.layer_norm_", eps)(x)
    parts = []
    for sd in sds:
        a = column(sd, pre + "mlp.linear_fc1", h)
        if gated:
            g, u = np.split(a, 2, axis=1)
            a = act(g) * u
        else:
            a = act(a)
        parts.append(a)
    return x + row_parallel(sds, pre + "mlp.linear_fc2", parts)


def projector(sds, pre, x, act):
    """Megatron's MLP projector / patch merger body: linear_fc1 column-parallel, act,
    linear_fc2 row-parallel."""
    return row_parallel(sds, pre + "linear_fc2", [act(column(sd, pre + "linear_fc1", x)) for sd in sds])


def patch_embed(sd, pre, pixels):
    """Conv3d with stride = kernel over each patch: one matmul of the flattened patch."""
    w = f32(sd[pre + "proj.weight"])
    out = pixels.reshape(pixels.shape[0], -1) @ w.reshape(w.shape[0], -1).T
    return out + f32(sd[pre + "proj.bias"]) if pre + "proj.bias" in sd else out


def vision_rope(grid, head_dim, merge, theta=10000.0):
    """The tower's 2-D rotary angles [patches, head_dim] in merge-unit order (rot_pos_emb):
    VisionRotaryEmbedding(head_dim // 2) of the row and of the column, concatenated, then
    duplicated (repeat(1, 1, 1, 2)) for rotate_half."""
    dim = head_dim // 2
    inv = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
    rows, cols = [], []
    for t, h, w in grid:
        r = np.arange(h)[:, None].repeat(w, 1).reshape(h // merge, merge, w // merge, merge).transpose(0, 2, 1, 3)
        c = np.arange(w)[None, :].repeat(h, 0).reshape(h // merge, merge, w // merge, merge).transpose(0, 2, 1, 3)
        rows += list(r.reshape(-1)) * t
        cols += list(c.reshape(-1)) * t
    f = np.concatenate([np.outer(rows, inv), np.outer(cols, inv)], 1).astype(np.float32)
    return np.concatenate([f, f], 1)


def get_rope_index(ids, grid, merge, tokens):
    """mbridge's get_rope_index (qwen2_5_vl/rope_utils.py; Qwen3-VL's is the same for images)
    for one sequence of text and images: text positions count on from the last position;
    an image's tokens take (t, row, column) of its merged grid offset by the text before it.
    The token ids are the model's (mbridge's constants are the release's ids)."""
    ids = list(ids)
    pos, st, n = [], 0, 0
    for _ in range(sum(1 for i, x in enumerate(ids[:-1]) if x == tokens["vision_start_token_id"]
                       and ids[i + 1] == tokens["image_token_id"])):
        ed = ids.index(tokens["image_token_id"], st)
        t, h, w = grid[n]
        n += 1
        gh, gw = h // merge, w // merge
        base = pos[-1].max() + 1 if pos else 0
        pos.append(np.arange(ed - st)[None].repeat(3, 0) + base)
        ti = np.zeros((t, gh * gw), int).reshape(-1)  # images: second_per_grid_t 0
        hi = np.arange(gh)[None, :, None].repeat(t, 0).repeat(gw, 2).reshape(-1)
        wi = np.arange(gw)[None, None, :].repeat(t, 0).repeat(gh, 1).reshape(-1)
        pos.append(np.stack([ti, hi, wi]) + (ed - st) + base)
        st = ed + t * gh * gw
    if st < len(ids):
        base = pos[-1].max() + 1 if pos else 0
        pos.append(np.arange(len(ids) - st)[None].repeat(3, 0) + base)
    return np.concatenate(pos, 1)


# --- the towers ---

def qwen25_tower(sds, vc, eps, pixels, grid):
    """mbridge's Qwen2_5VisionModel.forward: patches reordered into windows of merge units
    (get_window_index), window attention except in fullatt_block_indexes (the whole image),
    the decoder's final RMSNorm, then the projector on groups of merge units; the order undone."""
    heads, width, merge = vc["num_heads"], vc["hidden_size"], vc["spatial_merge_size"]
    unit = merge * merge
    x = patch_embed(sds[0], "vision_model.patch_embed.", pixels)
    window = vc["window_size"] // merge // vc["patch_size"]
    index, cu = [], [0]
    offset = 0
    for t, h, w in grid:
        gh, gw = h // merge, w // merge
        idx = np.arange(t * gh * gw).reshape(t, gh, gw)
        ph, pw = window - gh % window, window - gw % window
        nh, nw = (gh + ph) // window, (gw + pw) // window
        padded = np.full((t, gh + ph, gw + pw), -100)
        padded[:, :gh, :gw] = idx
        padded = padded.reshape(t, nh, window, nw, window).transpose(0, 1, 3, 2, 4).reshape(t, nh * nw, window, window)
        seqlens = (padded != -100).sum((2, 3)).reshape(-1)
        flat = padded.reshape(-1)
        index.append(flat[flat != -100] + offset)
        cu += list(np.cumsum(seqlens) * unit + cu[-1])
        offset += t * gh * gw
    index = np.concatenate(index)
    cu_window = [c for i, c in enumerate(cu) if i == 0 or c != cu[i - 1]]  # unique_consecutive
    cu_full = [0] + list(np.cumsum([h * w for t, h, w in grid for _ in range(t)]))
    T = x.shape[0]
    x = x.reshape(T // unit, unit, -1)[index].reshape(T, -1)
    emb = vision_rope(grid, width // heads, merge)
    emb = emb.reshape(T // unit, unit, -1)[index].reshape(T, -1)
    rotate = lambda q: rotate_half(q, emb)  # noqa: E731
    depth = len({k.split(".")[3] for k in sds[0] if k.startswith("vision_model.decoder.layers.")})
    for i in range(depth):
        cu_i = cu_full if i in vc["fullatt_block_indexes"] else cu_window
        x = vit_block(sds, f"vision_model.decoder.layers.{i}.", x, heads, eps, silu, True, rotate, cu_i)
    x = rms(x, f32(sds[0]["vision_model.decoder.final_layernorm.weight"]), eps)
    out = projector(sds, "vision_model.projection.encoder.", x.reshape(T // unit, -1), gelu_erf)
    return out[np.argsort(index)], []


def qwen3_tower(sds, vc, eps, pixels, grid):
    """mbridge's Qwen3VLVisionModel.forward: patch embedding plus the learned positions
    interpolated bilinearly to the grid (fast_pos_embed_interpolate), LayerNorm blocks over the
    whole image, deepstack mergers (post-shuffle norm) on the outputs of the blocks in
    deepstack_visual_indexes, then the merger (norm before the shuffle). The mergers' GELU is
    transformers' (nn.GELU, erf): mbridge's Qwen3VLVisionPatchMerger takes the tower's
    activation_func (tanh GELU), which moves the tiny model's tower outputs by ~1e-4 of their
    largest, its logits by ~2e-5."""
    heads, width, merge = vc["num_heads"], vc["hidden_size"], vc["spatial_merge_size"]
    unit = merge * merge
    x = patch_embed(sds[0], "vision_model.patch_embed.", pixels)
    table = f32(sds[0]["vision_model.pos_embed.weight"])
    side = int(table.shape[0] ** 0.5)
    pos = []
    for t, h, w in grid:
        hi = np.linspace(0, side - 1, h, dtype=np.float32)
        wi = np.linspace(0, side - 1, w, dtype=np.float32)
        hf, wf = hi.astype(int), wi.astype(int)
        hc, wc = np.minimum(hf + 1, side - 1), np.minimum(wf + 1, side - 1)
        dh, dw = (hi - hf)[:, None], (wi - wf)[None, :]
        p = ((1 - dh) * (1 - dw))[..., None] * table[hf[:, None] * side + wf[None, :]] + \
            ((1 - dh) * dw)[..., None] * table[hf[:, None] * side + wc[None, :]] + \
            (dh * (1 - dw))[..., None] * table[hc[:, None] * side + wf[None, :]] + \
            (dh * dw)[..., None] * table[hc[:, None] * side + wc[None, :]]
        p = np.tile(p.reshape(1, h, w, -1), (t, 1, 1, 1))
        pos.append(p.reshape(t, h // merge, merge, w // merge, merge, -1).transpose(0, 1, 3, 2, 4, 5).reshape(-1, width))
    x = x + np.concatenate(pos)
    emb = vision_rope(grid, width // heads, merge)
    rotate = lambda q: rotate_half(q, emb)  # noqa: E731
    cu = [0] + list(np.cumsum([h * w for t, h, w in grid for _ in range(t)]))
    T = x.shape[0]
    depth = len({k.split(".")[3] for k in sds[0] if k.startswith("vision_model.decoder.layers.")})
    deep = []
    for i in range(depth):
        x = vit_block(sds, f"vision_model.decoder.layers.{i}.", x, heads, eps, gelu_tanh, False, rotate, cu)
        if i in vc["deepstack_visual_indexes"]:
            pre = f"vision_model.decoder.deepstack_merger_list.{vc['deepstack_visual_indexes'].index(i)}."
            y = norm_of(sds[0], pre + "patch_norm.", eps)(x.reshape(T // unit, -1))
            deep.append(projector(sds, pre, y, gelu_erf))
    y = norm_of(sds[0], "vision_model.merger.patch_norm.", eps)(x).reshape(T // unit, -1)
    return projector(sds, "vision_model.merger.", y, gelu_erf), deep


# --- loading, the forward, the comparison ---

def megatron_logits(files, layout, ids, pixels, grid):
    """(logits [T, vocab], the tower's outputs [image rows, each deepstack merger's]) of the
    rank files FILES ({rank dir: file}) of LAYOUT."""
    tp, pp, vpp, ep, etp = parse_moe_layout(layout)
    args = files[file_name(0, 0, 0, pp, ep)]["args"]
    vision = json.loads(args.hf_vision_config)
    # the special token ids: the args' when they carry them (Qwen2.5-VL's), else the ones vlm.py
    # built the model with
    vc, tokens = vision["vision_config"], {**vlm.TOKENS, **{k: v for k, v in vision.items() if k.endswith("_token_id")}}
    qwen3 = "deepstack_visual_indexes" in vc
    m = model_of_args(args, {"vocab_size": args.vocab_size})
    first = chunk_key(0, vpp)
    # the tower: on the first stage's first chunk, in the files of EP rank 0 (it has no experts)
    tower_sds = [files[file_name(t, 0, 0, pp, ep)][first] for t in range(tp)]
    image, deep = (qwen3_tower if qwen3 else qwen25_tower)(tower_sds, vc, m.eps, pixels, grid)
    mask = np.asarray(ids) == tokens["image_token_id"]
    positions = get_rope_index(ids, grid, vc["spatial_merge_size"], tokens)
    m.rotate = mrope(positions, m.theta, m.d, args.mrope_section, interleaved=qwen3)

    def embed(x):  # combined_embeddings[image_mask] = image_embeds
        x = x.copy()
        x[mask] = image
        return x

    # deepstack: merger n's rows added after global layer n. mbridge adds them on the first
    # stage only (and asserts they all sit there, which tp2pp2's 2 layers per stage do not
    # satisfy); by global layer is the model's own rule, transformers' too.
    def after_layer(n, x):
        if n < len(deep):
            x = x.copy()
            x[mask] += deep[n]
        return x

    lm = language_model_files(files)
    if getattr(args, "num_experts", None):
        logits = MegatronMoE(m, lm, (tp, pp, vpp, ep, etp), args).forward("te", ids, embed=embed, after_layer=after_layer)
    else:
        stages = [[lm[file_name(t, p, 0, pp, 1)] for t in range(tp)] for p in range(pp)]
        logits = megatron_forward(m, stages, vpp, "te", ids, embed=embed, after_layer=after_layer)
    return logits, [image] + deep


def hf_logits(orig):
    """transformers' own forward of ORIG in float32 (the bf16 weights upcast) on vlm.py's
    input, pixels rounded to bf16 as vlm.logits_of gives them; (logits, its tower's outputs
    [image rows, each deepstack merger's], ids, pixels, grid)."""
    import transformers
    with open(f"{orig}/config.json") as f:
        cls = json.load(f)["architectures"][0]
    model = getattr(transformers, cls).from_pretrained(orig, dtype=torch.float32).eval()
    ids, pixels, grid = vlm.inputs()
    pixels = pixels.to(torch.bfloat16).float()
    # the image tokens marked, as transformers 5's processor does: without them its forward
    # cannot build the multimodal positions and falls back to 1-D ones
    types = (ids == vlm.TOKENS["image_token_id"]).long()
    with torch.no_grad():
        out = model(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=types).logits[0].numpy()
        tower = model.model.visual(pixels, grid_thw=grid)
    towers = [tower.pooler_output] + list(getattr(tower, "deepstack_features", None) or [])
    return out, [t.numpy() for t in towers], ids[0].numpy(), pixels.numpy(), [tuple(int(v) for v in g) for g in grid]


def mutated(files, layout):
    """(what, a copy of FILES broken in one place the forward must notice)."""
    tp, pp, vpp, ep, etp = parse_moe_layout(layout)
    first = chunk_key(0, vpp)
    name = "vision_model.decoder.layers.0.self_attention.linear_qkv.weight"
    out = {k: {ck: (dict(v) if ck.startswith("model") else v) for ck, v in f.items()} for k, f in files.items()}
    a, b = file_name(0, 0, 0, pp, ep), file_name(tp - 1, 0, 0, pp, ep)
    if tp > 1:
        out[a][first][name], out[b][first][name] = files[b][first][name], files[a][first][name]
        yield "the tower's first qkv with its two TP shares exchanged", out
    else:
        w = files[a][first][name]
        out[a][first][name] = torch.cat(w.chunk(2)[::-1])
        yield "the tower's first qkv with its two heads exchanged", out
    if ep > 1:  # local expert 0 of EP rank 1 read from EP rank 0's file
        out = {k: {ck: (dict(v) if ck.startswith("model") else v) for ck, v in f.items()} for k, f in files.items()}
        last = chunk_key(vpp - 1, vpp)
        e0, e1 = file_name(0, pp - 1, 0, pp, ep), file_name(0, pp - 1, 1, pp, ep)
        for k in files[e1][last]:
            if ".mlp.experts." in k and not k.endswith("_extra_state") and k in files[e0][last]:
                out[e1][last][k] = files[e0][last][k]
        yield "EP rank 1's experts read from EP rank 0's file", out


def rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def check(orig, views):
    ref, ref_tower, ids, pixels, grid = hf_logits(orig)
    for spec in views:
        view, layout = spec.rsplit(":", 1)
        what = f"{os.path.basename(orig)} {layout}"
        try:
            files = load_release(view)
            got, tower = megatron_logits(files, layout, ids, pixels, grid)
        except Exception as e:  # noqa: BLE001
            print(f"FAIL {what}: the Megatron forward failed: {type(e).__name__}: {e}")
            continue
        err = rel(got, ref)
        # the tower's outputs too: its effect on the tiny model's logits is small
        tower_err = max(rel(a, b) for a, b in zip(tower, ref_tower)) if len(tower) == len(ref_tower) else math.inf
        controls = []
        for how, bad in mutated(files, layout):
            bad_got, _ = megatron_logits(bad, layout, ids, pixels, grid)
            controls.append((how, rel(bad_got, ref)))
        caught = all(e > TOLERANCE for _, e in controls)
        verdict = "PASS" if err < TOLERANCE and tower_err < TOLERANCE and caught else "FAIL"
        print(f"{verdict} {what}: the Megatron forward over the rank files gives transformers' float32 logits, "
              f"max relative error {err:.2g}, and its tower's {len(ref_tower)} outputs, {tower_err:.2g} "
              f"(tolerance {TOLERANCE:g}); mutated, the logits' error is " +
              ", ".join(f"{e:.2g} with {how}" for how, e in controls))


if __name__ == "__main__":
    if sys.argv[1:2] == ["check"] and len(sys.argv) > 3:
        group = []
        for arg in sys.argv[2:] + ["--"]:  # one process for several models: transformers loads once
            if arg == "--":
                check(group[0], group[1:])
                group = []
            else:
                group.append(arg)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
