#!/usr/bin/python3
"""Independent reference for the Megatron views of mixture-of-experts (MoE) models (Mixtral,
Qwen2-MoE, Qwen3-MoE), written from DESIGN section 4, research/moe-real-megatron.md and
Megatron-LM core_v0.17.1's own source and files, not from ckptfs's code. Reuses reference.py for
everything a dense model has (attention, embedding, output layer, dense layers).

  moe_reference.py check SRC VIEW_DIR LAYOUT [--spec te|local] [--grouped]
                   [--pp-first N --pp-last N] [--vocab-pad zero|last] [--no-args] [--torch2]
    LAYOUT: tp{T}pp{P}[vpp{V}][ep{E}][etp{X}] (expert TP defaults to T). Loads every rank file
    of VIEW_DIR (torch 2.6 with --torch2: weights_only=True, mmap=True), compares the file set,
    keys in order, every tensor bit for bit, the args (dense and MoE fields), and the logits of
    a Hugging Face MoE forward with those of a Megatron-semantics forward over the rank files.
    --grouped: the view was made with -o moe_grouped_gemm=on.
  moe_reference.py selftest [--megatron-data DIR]
    Validates this reference: the forward over the expected files of many layouts equals the HF
    forward (and stops equalling it when an expert, a split or the routing is wrong), and the
    expected files of tp2pp1ep2 (Mixtral) and tp1pp1ep2 (Qwen2-MoE), local spec, equal the ones
    Megatron itself wrote (DIR: tests/data/megatron-core-0.17.1 by default).

Rules (Megatron-LM core_v0.17.1):
- Rank grid of one pipeline stage (parallel_state: dense grid tp-cp-ep-dp-pp, expert grid
  etp-ep-edp-pp): world W = lcm(T, X*E); rank g has TP rank g % T, dense DP rank g // T, expert
  TP rank g % X, EP rank (g // X) % E, expert DP rank g // (X*E). A rank writes when its dense
  DP rank or its expert DP rank is 0 (Megatron's checkpointing.py:596 writes on expert DP rank 0
  only; the two agree whenever T <= X*E, and where they differ Megatron's own file set lacks the
  dense shards of TP ranks >= X*E). Its file, mp_rank_{t:02d}[_{p:03d}][_{e:03d}], holds the
  dense weights of TP rank t and EP rank e's experts split by its expert TP rank; of two writers
  with one name the first is kept.
- Loading (the Megatron forward below): rank g reads the file named by its TP and EP ranks and
  takes its experts as expert TP share g % X.
- MoE layer keys (module order of TransformerLayer / MoELayer / SharedExpertMLP): pre_mlp_layernorm
  (a separate norm in both specs; in the TE spec a te.pytorch.RMSNorm, which carries
  _extra_state like every TE norm), mlp.router.weight, the experts, then the shared expert with
  its gate_weight (a parameter, so before its child modules' keys). Experts: SequentialMLP
  `mlp.experts.local_experts.{j}.linear_fc{1,2}.{weight,_extra_state}`; TEGroupedMLP
  (TE spec with moe_grouped_gemm) `mlp.experts.linear_fc1.weight{j}`..., `linear_fc1._extra_state`,
  then fc2 the same. The local spec builds SequentialMLP whatever moe_grouped_gemm says
  (LocalSpecProvider.grouped_mlp_modules), so its names do not change with --grouped.
"""
import argparse
import math
import os
import pickle
import re
import sys
import tempfile
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
from reference import (Model, check_flags, chunk_layers,  # noqa: E402
                       compare_model, compare_view, dense_args, dense_mlp_keys, f32, hf_forward,
                       hf_swiglu, megatron_dense_mlp, megatron_forward, megatron_swiglu,
                       padded_vocab, rank_file, rms, row_split, silu, swiglu_fc1)
from models import bf16_to_f32  # noqa: E402

TOLERANCE = 1e-4  # max relative logit error, as reference.py's dense check
# 36 tokens: on the tiny models of models.py (and Megatron's test models) they reach every
# expert of every layer, so the forward comparison covers every expert.
MOE_TOKENS = np.arange(1, 250, 7)


def parse_moe_layout(name):
    m = re.fullmatch(r"tp(\d+)pp(\d+)(?:vpp(\d+))?(?:ep(\d+))?(?:etp(\d+))?", name)
    if not m:
        raise ValueError(f"not a layout: {name}")
    tp, pp = int(m.group(1)), int(m.group(2))
    return tp, pp, int(m.group(3) or 1), int(m.group(4) or 1), int(m.group(5) or tp)


class MoEModel(Model):
    """A Hugging Face MoE checkpoint: reference.Model plus the experts."""

    def __init__(self, src):
        super().__init__(src)
        c = self.cfg
        self.family = c["model_type"]
        assert self.family in models.MOE, f"{src}: model_type {self.family} is not an MoE family"
        mix = self.family == "mixtral"
        self.N = c["num_local_experts"] if mix else c["num_experts"]
        self.topk = c["num_experts_per_tok"]
        self.Fe = c["intermediate_size"] if mix else c["moe_intermediate_size"]
        # Mixtral always renormalises the top-k probabilities; Qwen only with norm_topk_prob
        # (transformers' default for both Qwen configs: false).
        self.norm_topk = True if mix else bool(c.get("norm_topk_prob", False))
        self.moe = [models.is_moe_layer(c, i) for i in range(self.L)]
        self.S = (c.get("shared_expert_intermediate_size") or None) if self.family == "qwen2_moe" else None
        self.router_name = "block_sparse_moe.gate.weight" if mix else "mlp.gate.weight"
        for i in range(self.L):
            has = f"model.layers.{i}.{self.router_name}" in self.raw
            assert has == self.moe[i], \
                f"layer {i}: router {'present' if has else 'missing'}, config says MoE={self.moe[i]}"
        self.shared_gate = self.S is not None and any(
            f"model.layers.{i}.mlp.shared_expert_gate.weight" in self.raw for i in range(self.L))

    def expert(self, i, n):
        """(gate [Fe, H], up [Fe, H], down [H, Fe]) of global expert n, layer i (bf16 bits)."""
        if self.family == "mixtral":  # MixtralBlockSparseTop2MLP: w2(silu(w1 x) * w3 x)
            return tuple(self.layer(i, f"block_sparse_moe.experts.{n}.{w}.weight") for w in ("w1", "w3", "w2"))
        return tuple(self.layer(i, f"mlp.experts.{n}.{w}_proj.weight") for w in ("gate", "up", "down"))

    def moe_args(self, ep, etp, grouped):
        """The MoE fields of args that reproduce the HF routing in Megatron."""
        return dict(num_experts=self.N, moe_router_topk=self.topk, moe_ffn_hidden_size=self.Fe,
                    moe_shared_expert_intermediate_size=self.S, moe_shared_expert_gate=self.shared_gate,
                    moe_router_pre_softmax=not self.norm_topk, moe_router_score_function="softmax",
                    moe_router_dtype="fp32",
                    moe_layer_freq=1 if all(self.moe) else [int(x) for x in self.moe],
                    expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
                    moe_grouped_gemm=grouped)


# --- the rank files ---

def rank_grid(tp, ep, etp):
    """[(TP rank, EP rank, expert TP rank, writes)] of the ranks g = 0, 1, ... of one pipeline
    stage (the smallest world that tiles both grids; larger ones only add non-writers)."""
    out = []
    for g in range(math.lcm(tp, etp * ep)):
        dp, edp = g // tp, g // (etp * ep)
        out.append((g % tp, (g // etp) % ep, g % etp, dp == 0 or edp == 0))
    return out


def file_name(t, p, e, pp, ep):
    return f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "") + (f"_{e:03d}" if ep > 1 else "")


def moe_mlp_keys(e, x, ep, etp, grouped):
    """A reference.rank_file mlp_keys function for the file of EP rank e, expert TP rank x."""

    def keys(m, sd, pre, i, r, tp, te):
        if not m.moe[i]:
            dense_mlp_keys(m, sd, pre, i, r, tp, te)
            return
        sd[pre + "pre_mlp_layernorm.weight"] = m.layer(i, "post_attention_layernorm.weight")
        if te:
            sd[pre + "pre_mlp_layernorm._extra_state"] = None
        sd[pre + "mlp.router.weight"] = m.layer(i, m.router_name)
        local = m.N // ep
        shards = []
        for j in range(local):
            gate, up, down = m.expert(i, e * local + j)
            shards.append((swiglu_fc1(gate, up, x, etp), row_split(down, x, etp)))
        if grouped and te:
            for fc in (0, 1):
                for j in range(local):
                    sd[pre + f"mlp.experts.linear_fc{fc + 1}.weight{j}"] = shards[j][fc]
                sd[pre + f"mlp.experts.linear_fc{fc + 1}._extra_state"] = None
        else:
            for j, (fc1, fc2) in enumerate(shards):
                q = pre + f"mlp.experts.local_experts.{j}."
                sd[q + "linear_fc1.weight"], sd[q + "linear_fc1._extra_state"] = fc1, None
                sd[q + "linear_fc2.weight"], sd[q + "linear_fc2._extra_state"] = fc2, None
        if m.S is not None:
            q = pre + "mlp.shared_experts."
            if m.shared_gate:
                sd[q + "gate_weight"] = m.layer(i, "mlp.shared_expert_gate.weight")
            gate, up, down = (m.layer(i, f"mlp.shared_expert.{w}_proj.weight") for w in ("gate", "up", "down"))
            sd[q + "linear_fc1.weight"], sd[q + "linear_fc1._extra_state"] = swiglu_fc1(gate, up, r, tp), None
            sd[q + "linear_fc2.weight"], sd[q + "linear_fc2._extra_state"] = row_split(down, r, tp), None

    return keys


def writer_files(tp, pp, ep, etp):
    """{rank dir: (pp rank, TP rank, EP rank, expert TP rank)}: the files of a layout, each
    from the first rank that writes it."""
    out = {}
    for p in range(pp):
        for t, e, x, writes in rank_grid(tp, ep, etp):
            name = file_name(t, p, e, pp, ep)
            if writes and name not in out:
                out[name] = (p, t, e, x)
    return out


def expected_moe_files(m, tp, pp, vpp, ep, etp, spec, grouped, first=0, last=0, vocab_pad="zero"):
    """({rank dir: {model key: name -> uint16 array or None}}, padded vocab)."""
    padded = padded_vocab(m, tp)
    return {name: rank_file(m, tp, pp, vpp, p, t, spec, first, last, vocab_pad, padded,
                            moe_mlp_keys(e, x, ep, etp, grouped))
            for name, (p, t, e, x) in writer_files(tp, pp, ep, etp).items()}, padded


# --- forward passes (float32) ---

def softmax(z):
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def topk_mask(scores, k):
    """Boolean [T, N]: each row's k largest entries."""
    idx = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
    mask = np.zeros(scores.shape, bool)
    np.put_along_axis(mask, idx, True, -1)
    return mask


def hf_moe_mlp(m, i, h, routed=None):
    """MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock on the normed
    input h, float32 math: softmax over the router logits, top-k, renormalised when the family
    does so, the experts' SwiGLU outputs weighted and summed; Qwen2-MoE adds
    sigmoid(shared_expert_gate(h)) * shared_expert(h). Dense layers: the plain MLP.
    routed: a dict that receives, per MoE layer, how many tokens each expert got."""
    if not m.moe[i]:
        return hf_swiglu(m, i, h)
    probs = softmax(h @ bf16_to_f32(m.layer(i, m.router_name)).T)
    mask = topk_mask(probs, m.topk)
    if routed is not None:
        routed[i] = mask.sum(0)
    w = np.where(mask, probs, 0)
    if m.norm_topk:
        w = w / w.sum(-1, keepdims=True)
    out = 0
    for n in range(m.N):
        gate, up, down = (bf16_to_f32(a) for a in m.expert(i, n))
        out = out + w[:, n:n + 1] * ((silu(h @ gate.T) * (h @ up.T)) @ down.T)
    if m.S is not None:
        shared = hf_swiglu(m, i, h, "mlp.shared_expert.")
        if m.shared_gate:
            z = h @ bf16_to_f32(m.layer(i, "mlp.shared_expert_gate.weight")).T
            shared = shared / (1 + np.exp(-z))
        out = out + shared
    return out


class MegatronMoE:
    """Megatron's MoE layer over the rank files of a view: files {rank dir: loaded file};
    layout = the loader's tp, pp, vpp, ep, etp; args = the files' args (Namespace or dict)."""

    def __init__(self, m, files, layout, args, first=0, last=0):
        self.m, self.files, self.first, self.last = m, files, first, last
        self.tp, self.pp, self.vpp, self.ep, self.etp = layout
        get = args.get if isinstance(args, dict) else lambda k: getattr(args, k)
        self.N, self.topk = get("num_experts"), get("moe_router_topk")
        self.pre_softmax, self.shared_gate = get("moe_router_pre_softmax"), get("moe_shared_expert_gate")
        self.score_function = get("moe_router_score_function")
        freq = get("moe_layer_freq")
        # moe_layer_freq: an int k = every k-th layer (layer i is MoE when i % k == 0), or a list.
        self.moe = freq if isinstance(freq, list) else [int(i % freq == 0) for i in range(m.L)]
        grid = rank_grid(self.tp, self.ep, self.etp)
        # stages[p] = the files of TP ranks 0..T-1 (for each, the first rank with that TP rank);
        # the expert shard (e, x) is read by rank x + X*e (the first with EP rank e, ETP rank x).
        self.stages = [[files[file_name(t, p, next(e for tt, e, _, _ in grid if tt == t), self.pp, self.ep)]
                        for t in range(self.tp)] for p in range(self.pp)]

    def ck(self, v):
        return "model" if self.vpp == 1 else f"model{v}"

    def expert_file(self, p, v, e, x):
        g = x + self.etp * e
        return self.files[file_name(g % self.tp, p, e, self.pp, self.ep)][self.ck(v)]

    def mlp(self, m, p, v, sds, pre, x, te):
        start, _ = chunk_layers(m.L, self.pp, self.vpp, p, v, self.first, self.last)
        if not self.moe[start + int(pre.split(".")[2])]:
            return megatron_dense_mlp(m, sds, pre, x, te)
        h = rms(x, f32(sds[0][pre + "pre_mlp_layernorm.weight"]), m.eps)
        logits = h @ f32(sds[0][pre + "mlp.router.weight"]).T  # fp32 router
        w = self.route(logits, sds, pre)
        local = self.N // self.ep
        out = 0
        for n in range(self.N):
            e, j = divmod(n, local)
            shards = []
            for xr in range(self.etp):
                sd = self.expert_file(p, v, e, xr)
                if pre + f"mlp.experts.linear_fc1.weight{j}" in sd:  # TEGroupedMLP
                    shards.append((sd[pre + f"mlp.experts.linear_fc1.weight{j}"],
                                   sd[pre + f"mlp.experts.linear_fc2.weight{j}"]))
                else:
                    q = pre + f"mlp.experts.local_experts.{j}."
                    shards.append((sd[q + "linear_fc1.weight"], sd[q + "linear_fc2.weight"]))
            out = out + w[:, n:n + 1] * megatron_swiglu(shards, h)
        q = pre + "mlp.shared_experts."
        if q + "linear_fc1.weight" in sds[0]:  # shared expert: TP-split like a dense MLP
            shared = megatron_swiglu([(sd[q + "linear_fc1.weight"], sd[q + "linear_fc2.weight"]) for sd in sds], h)
            if self.shared_gate:
                shared = shared / (1 + np.exp(-(h @ f32(sds[0][q + "gate_weight"]).T)))
            out = out + shared
        return out

    def route(self, logits, sds, pre):
        """The routing weights [T, N] of the router's logits (softmax scores; a subclass
        routes otherwise)."""
        assert self.score_function == "softmax"
        if self.pre_softmax:  # softmax over all experts, then top-k, no renormalisation
            scores = softmax(logits)
            return np.where(topk_mask(scores, self.topk), scores, 0)
        mask = topk_mask(logits, self.topk)  # top-k of the logits, softmax over those k
        return np.where(mask, softmax(np.where(mask, logits, -np.inf)), 0)

    def forward(self, spec, tokens, **hooks):
        """hooks: megatron_forward's embed and after_layer (a VLM's language model)."""
        return megatron_forward(self.m, self.stages, self.vpp, spec, tokens, self.mlp, **hooks)


def logits_error(m, megatron, spec, tokens=MOE_TOKENS):
    """(max relative error of the Megatron logits against the HF ones, the fewest tokens any
    expert of any MoE layer got in the HF forward)."""
    routed = {}
    ref = hf_forward(m, tokens, lambda m, i, h: hf_moe_mlp(m, i, h, routed))
    got = megatron.forward(spec, tokens)
    return float(np.abs(got - ref).max() / np.abs(ref).max()), min(int(c.min()) for c in routed.values())


# --- check a mounted view ---

def check(argv):
    ap = argparse.ArgumentParser(prog="moe_reference.py check")
    check_flags(ap)
    ap.add_argument("--grouped", action="store_true")
    a = ap.parse_args(argv)
    import torch
    layout = parse_moe_layout(a.layout)
    tp, pp, vpp, ep, etp = layout
    m = MoEModel(a.src)
    want, padded = expected_moe_files(m, tp, pp, vpp, ep, etp, a.spec, a.grouped, a.pp_first,
                                      a.pp_last, a.vocab_pad)
    margs = m.moe_args(ep, etp, a.grouped)
    errors, loaded = compare_view(a, want, {**dense_args(m, tp, pp, vpp, padded, torch, a.pp_first, a.pp_last),
                                            **margs}, torch)
    if errors:
        print("\n".join(errors[:20]), file=sys.stderr)
        sys.exit(1)
    files = {k: {c: loaded[k][c] for c in want[k]} for k in want}
    args = margs if a.no_args else next(iter(loaded.values()))["args"]
    err, fewest = logits_error(m, MegatronMoE(m, files, layout, args, a.pp_first, a.pp_last), a.spec)
    if not err < TOLERANCE:
        print(f"logits differ: max relative error {err:.3g}", file=sys.stderr)
        sys.exit(1)
    print(f"{a.layout} {a.spec}{' grouped' if a.grouped else ''}: {len(want)} files, every tensor equal; "
          f"logits max rel err {err:.2g}" + ("" if fewest else " (some expert got no token)"))


# --- self-test ---

SELFTEST_LAYOUTS = [  # (layout, pp_first, pp_last)
    ("tp1pp1ep2", 0, 0), ("tp2pp1ep2", 0, 0), ("tp1pp2ep2", 0, 0), ("tp2pp1ep4etp1", 0, 0),
    ("tp1pp2vpp2ep2", 0, 0), ("tp2pp1ep2etp1", 0, 0), ("tp4pp1ep2etp1", 0, 0), ("tp4pp1etp2", 0, 0),
    ("tp1pp1ep4", 0, 0), ("tp2pp2ep2etp1", 0, 0), ("tp2pp2ep2", 3, 1), ("tp2pp2vpp2ep4etp1", 0, 0),
    ("tp1pp1", 0, 0),
]
FILE_SETS = {  # layout -> its rank dirs, worked out by hand from the rank grid
    "tp2pp1ep2etp1": ["mp_rank_00_000", "mp_rank_01_001"],
    "tp4pp1ep2etp1": ["mp_rank_00_000", "mp_rank_01_001", "mp_rank_02_000", "mp_rank_03_001"],
    "tp2pp1ep2": ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"],
    "tp2pp1ep4etp1": ["mp_rank_00_000", "mp_rank_00_002", "mp_rank_01_001", "mp_rank_01_003"],
    "tp4pp1etp2": ["mp_rank_00", "mp_rank_01", "mp_rank_02", "mp_rank_03"],
    "tp1pp2ep2": ["mp_rank_00_000_000", "mp_rank_00_000_001", "mp_rank_00_001_000", "mp_rank_00_001_001"],
    "tp1pp1": ["mp_rank_00"],
}


def mutations(files, owners):
    """Views with a plausible mistake, which the forward must reject: [(what, files)]. Each
    changes the experts of the first chunk (in file order) that has any."""
    name, ck = next((n, c) for n in sorted(files) for c in files[n]
                    if any(".experts." in k for k in files[n][c]))
    sd = files[name][ck]
    fc1 = [k for k in sd if ".experts." in k and "linear_fc1.weight" in k]
    experts = [k for k in sd if ".experts." in k and not k.endswith("_extra_state")]
    p, _, e, x = owners[name]

    def changed(edit):
        bad = {n: {c: dict(s) for c, s in f.items()} for n, f in files.items()}
        edit(bad)
        return bad

    def halves(bad):
        a = sd[fc1[0]]
        bad[name][ck][fc1[0]] = np.concatenate([a[a.shape[0] // 2:], a[:a.shape[0] // 2]])
    out = [("gate and up halves of an expert's fc1 swapped", changed(halves))]
    for other, (p2, _, e2, x2) in owners.items():
        if p2 == p and e2 != e and x2 == x:
            out.append(("a file holding another EP rank's experts",
                        changed(lambda bad: bad[other][ck].update({k: sd[k] for k in experts}))))
            break
    for other, (p2, _, e2, x2) in owners.items():
        if p2 == p and e2 == e and x2 != x:
            def exchange(bad):
                for k in fc1:
                    bad[name][ck][k], bad[other][ck][k] = files[other][ck][k], sd[k]
            out.append(("expert fc1 shards of two expert-TP ranks exchanged", changed(exchange)))
            break
    return out


def selftest_family(arch, all_moe, tmp, failures):
    src = os.path.join(tmp, arch + ("-all-moe" if all_moe else ""))
    cfg = models.config_for(arch, 4)
    if all_moe:
        cfg["mlp_only_layers"] = []
    models.write_checkpoint(src, models.model_tensors(cfg), cfg, shards=2)
    m = MoEModel(src)
    worst, n, tried, bad_before = 0.0, 0, 0, len(failures)
    for layout_name, first, last in SELFTEST_LAYOUTS:
        layout = parse_moe_layout(layout_name)
        tp, pp, vpp, ep, etp = layout
        for spec in ("te", "local"):
            for grouped in (False, True):
                files, _ = expected_moe_files(m, tp, pp, vpp, ep, etp, spec, grouped, first, last)
                tag = f"{os.path.basename(src)} {layout_name} {spec}{' grouped' if grouped else ''}"
                if layout_name in FILE_SETS and sorted(files) != FILE_SETS[layout_name]:
                    failures.append(f"{tag}: files {sorted(files)} != {FILE_SETS[layout_name]}")
                margs = m.moe_args(ep, etp, grouped)
                err, fewest = logits_error(m, MegatronMoE(m, files, layout, margs, first, last), spec)
                worst, n = max(worst, err), n + 1
                if not err < TOLERANCE:
                    failures.append(f"{tag}: logits max rel err {err:.3g}")
                if fewest == 0:
                    failures.append(f"{tag}: some expert got no token; the forward does not cover it")
                if grouped and spec == "local":
                    continue
                # Wrong views must be caught: in the weights by the forward; in the routing
                # semantics (args) by the forward as well.
                wrong = mutations(files, writer_files(tp, pp, ep, etp))
                wrong = [(what, bad, margs) for what, bad in wrong]
                wrong.append(("moe_router_pre_softmax flipped", files,
                              dict(margs, moe_router_pre_softmax=not margs["moe_router_pre_softmax"])))
                if m.shared_gate:
                    wrong.append(("shared expert gate ignored", files, dict(margs, moe_shared_expert_gate=False)))
                for what, bad, args in wrong:
                    if logits_error(m, MegatronMoE(m, bad, layout, args, first, last), spec)[0] < TOLERANCE:
                        failures.append(f"{tag}: {what}: not detected by the forward")
                    tried += 1
    print(f"# {os.path.basename(src)} (MoE layers {m.moe}): {n} layout/spec/scheme combinations, "
          f"Megatron forward vs HF forward max rel err {worst:.2g}; {tried} wrong views rejected"
          + ("" if len(failures) == bad_before else f"; {len(failures) - bad_before} FAILURES"))


def load_megatron_file(torch, path):
    """A file Megatron wrote: its args and rng_state hold Megatron enums and numpy 2 objects,
    unpickled as inert stand-ins (compare_megatron._Unpickler). Debian's torch 1.13 ignores
    pickle_module unless weights_only, so there its module-level pickle is swapped for the call."""
    from compare_megatron import _Unpickler
    tolerant = types.ModuleType("tolerant_pickle")
    tolerant.__dict__.update(pickle.__dict__)
    tolerant.Unpickler = _Unpickler
    if int(torch.__version__.split(".")[0]) >= 2:
        return torch.load(path, map_location="cpu", weights_only=False, pickle_module=tolerant)
    saved, torch.serialization.pickle = torch.serialization.pickle, tolerant
    try:
        return torch.load(path, map_location="cpu")
    finally:
        torch.serialization.pickle = saved


# Fields that Megatron's own args must share with a view's (hf_architecture, vocab_size and
# the like are ckptfs's own or tokenizer-dependent).
REAL_ARGS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "num_layers", "hidden_size",
             "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
             "padded_vocab_size", "untie_embeddings_and_output_weights", "add_qkv_bias", "qk_layernorm",
             "swiglu", "normalization", "params_dtype", "rotary_base")


def selftest_real(data, failures):
    import torch
    for real, hf, layout_name in (("mixtral-tp2pp1ep2-torch", "hf-mixtral", "tp2pp1ep2"),
                                  ("qwen2_moe-tp1pp1ep2-torch-noopt", "hf-qwen2_moe", "tp1pp1ep2")):
        it = os.path.join(data, real, "iter_0000010")
        m = MoEModel(os.path.join(data, hf))
        layout = parse_moe_layout(layout_name)
        tp, pp, vpp, ep, etp = layout
        want, padded = expected_moe_files(m, tp, pp, vpp, ep, etp, "local", False)
        present = sorted(os.listdir(it))
        if present != sorted(want):
            failures.append(f"{real}: rank dirs {present} != expected {sorted(want)}")
            continue
        errors, loaded = [], {}
        expect_args = {**dense_args(m, tp, pp, vpp, padded, torch), **m.moe_args(ep, etp, False)}
        for name in want:
            sd = loaded[name] = load_megatron_file(torch, os.path.join(it, name, "model_optim_rng.pt"))
            compare_model(f"{real}/{name}/model", sd["model"], want[name]["model"], errors, torch)
            for k in REAL_ARGS + tuple(m.moe_args(ep, etp, False)):
                if getattr(sd["args"], k) != expect_args[k]:
                    errors.append(f"{real}/{name}: Megatron's args.{k} = {getattr(sd['args'], k)!r}, "
                                  f"expected {expect_args[k]!r}")
        failures += errors
        files = {k: {"model": v["model"]} for k, v in loaded.items()}
        err, fewest = logits_error(m, MegatronMoE(m, files, layout, next(iter(loaded.values()))["args"]), "local")
        if not err < TOLERANCE or fewest == 0:
            failures.append(f"{real}: forward over Megatron's files: max rel err {err:.3g}, "
                            f"fewest tokens of an expert {fewest}")
        n = sum(len(v["model"]) for v in want.values())
        print(f"# {real}: {len(want)} rank files, {n} entries: keys, order, tensors and args "
              f"{'equal to the expectation' if not errors else 'DIFFER'}; forward over Megatron's "
              f"files vs HF: max rel err {err:.2g} (torch {torch.__version__})")


def selftest(argv):
    ap = argparse.ArgumentParser(prog="moe_reference.py selftest")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--megatron-data", default=os.path.join(here, "..", "data", "megatron-core-0.17.1"))
    a = ap.parse_args(argv)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch, all_moe in (("mixtral", False), ("qwen2_moe", False), ("qwen2_moe", True),
                              ("qwen3_moe", False), ("qwen3_moe", True)):
            selftest_family(arch, all_moe, tmp, failures)
    if os.path.isdir(a.megatron_data):
        selftest_real(a.megatron_data, failures)
    else:
        failures.append(f"no Megatron test data at {a.megatron_data}")
    if failures:
        print("\n".join(failures[:40]), file=sys.stderr)
        sys.exit(1)
    print("selftest passed")


if __name__ == "__main__":
    cmds = {"check": check, "selftest": selftest}
    if sys.argv[1:2] and sys.argv[1] in cmds:
        cmds[sys.argv[1]](sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
