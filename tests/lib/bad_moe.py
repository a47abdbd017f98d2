#!/usr/bin/python3
"""Writes one broken mixture-of-experts legacy checkpoint per kind under OUT/ and prints, per
kind, what the one-line mount error must name: KIND<TAB>substring<TAB>substring...
(DIR in a substring stands for the kind's iteration directory).

  bad_moe.py OUT SEQ GROUPED ETP1

SEQ: a tp2pp1ep2 export (SequentialMLP keys, local_experts.J), GROUPED: the same with
-o moe_grouped_gemm=on (linear_fc1.weightJ), ETP1: a tp2pp1ep2etp1 export (only mp_rank_00_000
and mp_rank_01_001). Each of 4 experts, 2 per EP rank. Every change is made the way a user
could: torch.load a copied rank file (torch 1.13), edit its `model` dict or `args`, torch.save.
"""
import os
import shutil
import sys

import torch

LAYER = "decoder.layers.0."
SEQ = LAYER + "mlp.experts.local_experts.{j}.linear_fc{n}.weight"
GROUPED = LAYER + "mlp.experts.linear_fc{n}.weight{j}"


def edit(path, change):
    sd = torch.load(path, map_location="cpu")
    change(sd)
    torch.save(sd, path)


def main():
    out, seq, grouped, etp1 = sys.argv[1:5]
    cases = []

    def case(kind, base, expect, change=None, rank=None, every=False):
        d = os.path.join(out, kind)
        shutil.copytree(base, d)
        it = os.path.join(d, "release")
        ranks = sorted(os.listdir(it))
        for r in ranks if every else [rank] if rank else []:
            edit(os.path.join(it, r, "model_optim_rng.pt"), change)
        cases.append((kind, [s.replace("DIR", it) for s in expect]))
        return it

    def set_args(**kw):
        def change(sd):
            for k, v in kw.items():
                setattr(sd["args"], k, v)
        return change

    # EP that does not divide the experts: args say 3 EP ranks for 4 experts.
    case("ep-not-dividing", seq, ["DIR/mp_rank_00_000/model_optim_rng.pt", "ep 3 does not divide the 4 experts"],
         set_args(expert_model_parallel_size=3), every=True)
    # A file missing an expert: local expert 1 of layer 0 (fc1 and fc2) gone.
    def drop(sd, names):
        for n in names:
            del sd["model"][n]
    case("missing-expert", seq,
         ["DIR/mp_rank_01_001/model_optim_rng.pt",
          f"'{SEQ.format(j=1, n=1)}' is missing"],
         lambda sd: drop(sd, [SEQ.format(j=1, n=1), SEQ.format(j=1, n=2)]), "mp_rank_01_001")
    case("missing-expert-grouped", grouped,
         ["DIR/mp_rank_00_001/model_optim_rng.pt", f"'{GROUPED.format(j=1, n=2)}' is missing"],
         lambda sd: drop(sd, [GROUPED.format(j=1, n=2)]), "mp_rank_00_001")

    # One expert more than N/E = 2: local index 2 (a copy of 1), reported as unexpected.
    def add_third(sd, pattern):
        for n in (1, 2):
            sd["model"][pattern.format(j=2, n=n)] = sd["model"][pattern.format(j=1, n=n)].clone()
    case("extra-expert", seq,
         ["DIR/mp_rank_00_001/model_optim_rng.pt", "unexpected model entries",
          f"'{SEQ.format(j=2, n=1)}'"], lambda sd: add_third(sd, SEQ), "mp_rank_00_001")
    case("extra-expert-grouped", grouped,
         ["DIR/mp_rank_01_000/model_optim_rng.pt", "unexpected model entries",
          f"'{GROUPED.format(j=2, n=1)}'"], lambda sd: add_third(sd, GROUPED), "mp_rank_01_000")

    # Expert shapes that disagree with args: one fc1 with 8 rows more; args' expert ffn doubled.
    fc1 = torch.load(os.path.join(seq, "release", "mp_rank_00_000", "model_optim_rng.pt"))["model"][
        SEQ.format(j=0, n=1)]
    rows, cols = fc1.shape

    def grow(sd):
        sd["model"][SEQ.format(j=1, n=1)] = torch.zeros(rows + 8, cols, dtype=fc1.dtype)
    case("expert-shape", seq,
         ["DIR/mp_rank_01_000/model_optim_rng.pt",
          f"'{SEQ.format(j=1, n=1)}' has shape [{rows + 8}, {cols}]; the args imply [{rows}, {cols}]"],
         grow, "mp_rank_01_000")
    ffn = torch.load(os.path.join(seq, "release", "mp_rank_00_000", "model_optim_rng.pt"))[
        "args"].moe_ffn_hidden_size
    case("args-expert-ffn", seq,
         ["DIR/mp_rank_00_000/model_optim_rng.pt",
          f"'{SEQ.format(j=0, n=1)}' has shape [{rows}, {cols}]; the args imply [{2 * rows}, {cols}]"],
         set_args(moe_ffn_hidden_size=2 * ffn), every=True)

    # Expert indices beyond N: a file for EP rank 2 of 2.
    it = case("ep-rank-beyond", seq, ["DIR/mp_rank_00_002", "unexpected rank directory", "tp2pp1ep2"])
    shutil.copytree(os.path.join(it, "mp_rank_00_001"), os.path.join(it, "mp_rank_00_002"))

    # The partial TP x EP grid of etp 1: a file it does not have, and one missing.
    it = case("etp1-extra-file", etp1, ["DIR/mp_rank_01_000", "unexpected rank directory", "tp2pp1ep2etp1"])
    shutil.copytree(os.path.join(it, "mp_rank_00_000"), os.path.join(it, "mp_rank_01_000"))
    it = case("etp1-missing-file", etp1, ["DIR/mp_rank_01_001/model_optim_rng.pt", "missing"])
    shutil.rmtree(os.path.join(it, "mp_rank_01_001"))

    # Inconsistent dtypes: one expert's fc2 in float32.
    def to_f32(sd):
        sd["model"][SEQ.format(j=1, n=2)] = sd["model"][SEQ.format(j=1, n=2)].float()
    case("expert-dtype", seq,
         ["DIR/mp_rank_00_001/model_optim_rng.pt", f"'{SEQ.format(j=1, n=2)}' is F32, other tensors are BF16"],
         to_f32, "mp_rank_00_001")

    # Files whose args disagree on the experts.
    case("args-disagree", seq, ["DIR/mp_rank_01_001/model_optim_rng.pt", "args.num_experts is 8",
                                "mp_rank_00_000/model_optim_rng.pt says 4"],
         set_args(num_experts=8), "mp_rank_01_001")

    for kind, expect in cases:
        print("\t".join([kind] + expect))


if __name__ == "__main__":
    main()
