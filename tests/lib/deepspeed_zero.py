#!/usr/bin/python3
"""DeepSpeed ZeRO checkpoints for tests (run in the sid root: torch 2.14, transformers 5).

DeepSpeed itself does not run here (its imports need packages the roots lack), so the files
are written the way its save code writes them, step by step: the engine's
_save_checkpoint / _common_checkpoint_state (the model states), _save_zero_checkpoint (the
optimizer file of each rank: {"optimizer_state_dict": the ZeRO optimizer's state_dict(),
"ds_config", "ds_version"}), stage_1_and_2.py (each param group flattened, padded to a multiple
of 2 x world size, cut in equal partitions; a rank's fp32 partition saved with its padding
removed, _get_groups_without_padding) and stage3.py (each parameter cut in ceil(numel / world)
elements per rank, the last zero-padded; a rank's fp32_flat_groups its parts one after
another). DeepSpeed's classes the pickles name (ZeroStageEnum, LossScaler) are stand-ins of the
same module and name, so the pickles name the same globals.

  deepspeed_zero.py build OUT
      OUT/CASE-ref: the model saved by save_pretrained (fp32); OUT/CASE/checkpoint-10/ with
      config.json, `latest` and global_step10/ for each case of CASES. Prints "built CASE".
  deepspeed_zero.py bench OUT STAGE WORLD
      OUT/checkpoint-10: a Llama of about 1.1 GB in fp32 (18 layers, hidden 1024, vocab 32000)
      saved by WORLD ranks with ZeRO STAGE (bf16), for bench/trainer_bench.sh.
  deepspeed_zero.py hostile OUT
      broken copies (their names say what), from the same models: OUT/bad/NAME/checkpoint-10.
  deepspeed_zero.py merge CKPT OUT.safetensors [CKPT OUT.safetensors ...]
      the reference merge: zero_to_fp32's reconstruction (get_fp32_state_dict_from_zero_checkpoint,
      written again here in plain torch from its code) of each checkpoint directory CKPT.
  deepspeed_zero.py check REF_ST HF_DIR DTYPE MODEL_REF [...]
      HF_DIR's tensors are REF_ST's (the reference merge) as DTYPE, save_pretrained's tied head
      left out; transformers loads HF_DIR and gives MODEL_REF's logits (loaded as DTYPE). Prints
      "PASS what" / "FAIL what: why".
"""
import collections
import enum
import math
import os
import shutil
import sys
import types

import torch
import transformers
from safetensors.torch import load_file, save_file

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
            vocab_size=255, tie_word_embeddings=False)
FAMILIES = {"llama": {}, "llamatied": dict(tie_word_embeddings=True)}
# case: family, stage, world, bf16 (the optimizer files' bf16_ prefix), frozen parameters
CASES = {
    "z1-w3": ("llama", 1, 3, True, ()),
    "z2-w2": ("llama", 2, 2, False, ("model.embed_tokens.weight",)),
    "z2-w3": ("llama", 2, 3, True, ()),
    "z3-w2": ("llama", 3, 2, True, ()),
    "z3-w3": ("llama", 3, 3, True, ("model.layers.0.mlp.up_proj.weight", "model.norm.weight")),
    "z3-w2-tied": ("llamatied", 3, 2, True, ()),
    "z2-w3-tied": ("llamatied", 2, 3, True, ()),
    "z2-w2-actor": ("llama", 2, 2, True, ()),
}
# saved as OpenRLHF saves its actor: the engine's module holds the Hugging Face model as .model
WRAPPED = {"z2-w2-actor"}
TAG = "global_step10"


def stand_ins():
    """DeepSpeed's pickled classes under their own module names."""
    def module(name):
        m = sys.modules.get(name) or types.ModuleType(name)
        sys.modules[name] = m
        return m
    for name in ("deepspeed", "deepspeed.runtime", "deepspeed.runtime.zero", "deepspeed.runtime.fp16"):
        module(name)
    config = module("deepspeed.runtime.zero.config")

    class ZeroStageEnum(int, enum.Enum):
        disabled = 0
        optimizer_states = 1
        gradients = 2
        weights = 3
    ZeroStageEnum.__module__ = config.__name__
    ZeroStageEnum.__qualname__ = "ZeroStageEnum"
    config.ZeroStageEnum = ZeroStageEnum
    scaler = module("deepspeed.runtime.fp16.loss_scaler")

    class LossScaler:
        def __init__(self, scale=1):
            self.cur_scale = scale
            self.dynamic = False
    LossScaler.__module__ = scaler.__name__
    LossScaler.__qualname__ = "LossScaler"
    scaler.LossScaler = LossScaler
    return ZeroStageEnum, LossScaler


ZeroStageEnum, LossScaler = stand_ins()


def make_model(family):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**{**BASE, **FAMILIES[family]})
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3 if p.dim() == 1 else 0.05)
    return model


class Actor(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model


def param_groups(model, frozen):
    """The HF Trainer's two groups: weights with decay, then biases and norms without; the
    frozen parameters in neither (the optimizer never sees them)."""
    names = {p: n for n, p in model.named_parameters()}  # tied: the first name only
    decay, no_decay = [], []
    for p, n in names.items():
        if n in frozen:
            continue
        (decay if p.dim() >= 2 else no_decay).append((n, p))
    return [decay, no_decay]


def save_case(hf_model, family, stage, world, bf16, frozen, out, tweak=None, wrap=False):
    """Writes OUT/checkpoint-10 as the engine does for ZeRO STAGE over WORLD ranks (its module
    HF_MODEL, or an Actor around it with WRAP). TWEAK(kind, rank, dict) may break a dict before
    it is saved."""
    tweak = tweak or (lambda kind, rank, d: None)
    model = Actor(hf_model) if wrap else hf_model
    wrapper = "model." if wrap else ""
    frozen = tuple(wrapper + n for n in frozen)
    half = torch.bfloat16 if bf16 else torch.float16
    ckpt = os.path.join(out, "checkpoint-10")
    tag_dir = os.path.join(ckpt, TAG)
    os.makedirs(tag_dir, exist_ok=True)
    hf_model.config.save_pretrained(ckpt)
    with open(os.path.join(ckpt, "latest"), "w") as f:
        f.write(TAG)
    with open(os.path.join(ckpt, "trainer_state.json"), "w") as f:
        f.write('{"global_step": 10}\n')
    groups = param_groups(model, frozen)
    params = dict(model.named_parameters())
    param_shapes = [collections.OrderedDict((n, p.shape) for n, p in g) for g in groups]
    # _get_shared_params: a state-dict name whose parameter is another's
    shared = {}
    if hf_model.config.tie_word_embeddings:
        shared[wrapper + "lm_head.weight"] = wrapper + "model.embed_tokens.weight"
    ds_config = {"zero_optimization": {"stage": stage}, "bf16": {"enabled": bf16},
                 "fp16": {"enabled": not bf16}, "train_micro_batch_size_per_gpu": 1}
    module_sd = {n: t.detach().to(half) for n, t in model.state_dict().items()}
    fp32_groups = [[] for _ in range(world)]
    frozen_fragments = [collections.OrderedDict() for _ in range(world)]
    if stage <= 2:
        for g in groups:
            flat = torch.cat([p.detach().reshape(-1) for _, p in g])
            orig = flat.numel()
            align = 2 * world
            aligned = int(math.ceil(orig / align)) * align
            flat = torch.cat([flat, flat.new_zeros(aligned - orig)])
            size = aligned // world
            for r in range(world):
                left = r * size
                if orig <= left:
                    padding = size
                elif orig < left + size:
                    padding = left + size - orig
                else:
                    padding = 0
                fp32_groups[r].append(flat[left:left + size - padding].clone())
        for n in frozen:
            frozen_fragments[0][n] = params[n].detach().to(half).clone()
    else:
        for g in groups:
            parts = [[] for _ in range(world)]
            for _, p in g:
                numel = p.numel()
                share = int(math.ceil(numel / world))
                flat = torch.cat([p.detach().reshape(-1), p.new_zeros(share * world - numel)])
                for r in range(world):
                    parts[r].append(flat[r * share:(r + 1) * share])
            for r in range(world):
                fp32_groups[r].append(torch.cat(parts[r]).clone())
        for n in frozen:
            numel = params[n].numel()
            share = int(math.ceil(numel / world))
            flat = torch.cat([params[n].detach().to(half).reshape(-1),
                              torch.zeros(share * world - numel, dtype=half)])
            for r in range(world):
                frozen_fragments[r][n] = flat[r * share:(r + 1) * share].clone()
        # ZeRO-3's module: partitioned parameters are empty placeholders, buffers whole
        module_sd = {n: torch.empty(0, dtype=half) for n in module_sd}
    model_files = ["mp_rank_00_model_states.pt"] if stage <= 2 else \
        [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(world)]
    save_frozen = stage >= 2
    for r, name in enumerate(model_files):
        state = dict(module=module_sd, buffer_names=[], optimizer=None, param_shapes=param_shapes,
                     frozen_param_shapes=collections.OrderedDict((n, params[n].shape) for n in frozen)
                     if save_frozen else None,
                     shared_params=shared,
                     frozen_param_fragments=frozen_fragments[r] if save_frozen else None,
                     lr_scheduler=None, data_sampler=None, random_ltd=None, sparse_tensor_module_names=set(),
                     skipped_steps=0, global_steps=10, global_samples=80, dp_world_size=world, mp_world_size=1,
                     ds_config=ds_config, ds_version="0.18.3")
        tweak("model", r, state)
        torch.save(state, os.path.join(tag_dir, name))
    prefix = "bf16_" if bf16 else ""
    for r in range(world):
        moments = {i: {"exp_avg": torch.zeros_like(t), "exp_avg_sq": torch.zeros_like(t), "step": torch.tensor(10.)}
                   for i, t in enumerate(fp32_groups[r])}
        base = {"state": moments, "param_groups": [{"lr": 1e-5, "params": [i]} for i in range(len(fp32_groups[r]))]}
        if stage <= 2:
            osd = {"loss_scaler": LossScaler(1), "dynamic_loss_scale": False, "overflow": False, "clip_grad": 1.0,
                   "base_optimizer_state": base, "single_partition_of_fp32_groups": fp32_groups[r],
                   "zero_stage": ZeroStageEnum.gradients if stage == 2 else ZeroStageEnum.optimizer_states,
                   "group_paddings": [0] * len(groups), "partition_count": [world] * len(groups),
                   "ds_version": "0.18.3", "param_slice_mappings": [{} for _ in groups]}
        else:
            osd = {"zero_stage": ZeroStageEnum.weights, "loss_scaler": LossScaler(1), "dynamic_loss_scale": False,
                   "overflow": False, "partition_count": world, "optimizer_state_dict": base,
                   "fp32_flat_groups": fp32_groups[r]}
        sd = {"optimizer_state_dict": osd, "ds_config": ds_config, "ds_version": "0.18.3"}
        tweak("optim", r, sd)
        torch.save(sd, os.path.join(tag_dir, f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))


def prepared_model(family, frozen, bf16):
    """The model, its frozen parameters' values rounded to the half type they are kept in."""
    model = make_model(family)
    half = torch.bfloat16 if bf16 else torch.float16
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in frozen:
                p.copy_(p.to(half).float())
    return model


def build(out):
    for case, (family, stage, world, bf16, frozen) in CASES.items():
        model = prepared_model(family, frozen, bf16)
        model.save_pretrained(os.path.join(out, f"{case}-ref"))
        save_case(model, family, stage, world, bf16, frozen, os.path.join(out, case), wrap=case in WRAPPED)
        print("built", case)


def bench(out, stage, world):
    global BASE
    BASE = dict(BASE, hidden_size=1024, intermediate_size=2816, num_hidden_layers=18, num_attention_heads=16,
                num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096)
    model = make_model("llama")
    save_case(model, "llama", stage, world, True, (), out)
    n = sum(p.numel() for p in model.parameters())
    print(f"built a Llama of {n} parameters ({n * 4} bytes in fp32), ZeRO stage {stage} over {world} ranks")


def hostile(out):
    def tw(kind_want, rank_want, fn):
        def tweak(kind, rank, d):
            if kind == kind_want and rank == rank_want:
                fn(d)
        return tweak

    def shorter_partition(d):
        g = d["optimizer_state_dict"]["single_partition_of_fp32_groups"]
        g[0] = g[0][:-4].clone()

    def shorter_z3(d):
        g = d["optimizer_state_dict"]["fp32_flat_groups"]
        g[0] = g[0][:-1].clone()

    def padding_lie(d):
        shapes = d["param_shapes"][0]
        last = list(shapes)[-1]
        shapes[last] = torch.Size([shapes[last][0] - 1] + list(shapes[last][1:]))

    def world_lie(d):
        d["dp_world_size"] = 4

    def z3_shape_lie(d):
        shapes = d["param_shapes"][1]
        last = list(shapes)[-1]
        shapes[last] = torch.Size([shapes[last][0] + 8])

    bad = {
        "missing-rank": ("z2-w3", None, lambda c: os.remove(f"{c}/{TAG}/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")),
        "extra-rank": ("z2-w2", None, lambda c: shutil.copy(f"{c}/{TAG}/zero_pp_rank_1_mp_rank_00_optim_states.pt",
                                                           f"{c}/{TAG}/zero_pp_rank_2_mp_rank_00_optim_states.pt")),
        "partition-sizes": ("z2-w3", tw("optim", 0, shorter_partition), None),
        "z3-partition-sizes": ("z3-w3", tw("optim", 1, shorter_z3), None),
        "padding-lies": ("z2-w3", tw("model", 0, padding_lie), None),
        "z3-shapes-lie": ("z3-w2", tw("model", 0, z3_shape_lie), None),
        "world-disagrees": ("z2-w2", tw("model", 0, world_lie), None),
        "z3-missing-model-states": ("z3-w3", None,
                                    lambda c: os.remove(f"{c}/{TAG}/zero_pp_rank_2_mp_rank_00_model_states.pt")),
        "latest-names-nothing": ("z1-w3", None, lambda c: open(f"{c}/latest", "w").write("global_step99")),
        "latest-not-a-name": ("z1-w3", None, lambda c: open(f"{c}/latest", "w").write("../elsewhere")),
        "latest-too-big": ("z1-w3", None, lambda c: open(f"{c}/latest", "w").write("global_step10" + " " * 8192)),
    }
    for name, (case, tweak, after) in bad.items():
        family, stage, world, bf16, frozen = CASES[case]
        dest = os.path.join(out, "bad", name)
        save_case(prepared_model(family, frozen, bf16), family, stage, world, bf16, frozen, dest, tweak)
        if after:
            after(os.path.join(dest, "checkpoint-10"))
        print("built", name)


# --- the reference merge: zero_to_fp32's reconstruction, in plain torch ---

def merge(ckpt, out):
    with open(os.path.join(ckpt, "latest")) as f:
        tag_dir = os.path.join(ckpt, f.read().strip())
    files = sorted(os.listdir(tag_dir), key=lambda s: [int(c) if c.isdigit() else c for c in __import__("re").split(r"(\d+)", s)])
    model_files = [os.path.join(tag_dir, f) for f in files if f.endswith("_model_states.pt")]
    optim_files = [os.path.join(tag_dir, f) for f in files if f.endswith("_optim_states.pt")]
    states = [torch.load(f, map_location="cpu", weights_only=False) for f in model_files]
    # as zero_to_fp32's parse_optim_states: mapped, the moments never read
    optims = [torch.load(f, map_location="cpu", mmap=True, weights_only=False)["optimizer_state_dict"]
              for f in optim_files]
    stage = int(optims[0]["zero_stage"])
    world = optims[0]["partition_count"]
    world = max(world) if isinstance(world, list) else world
    assert world == len(optims), (world, len(optims))
    sd = collections.OrderedDict()
    buffers = states[0]["buffer_names"]
    sd.update({k: v.float() for k, v in states[0]["module"].items() if k in buffers})
    shapes0 = states[0]["frozen_param_shapes"] or {}
    for name, shape in shapes0.items():
        if stage <= 2:
            sd[name] = states[0]["frozen_param_fragments"][name]
        else:
            frags = [s["frozen_param_fragments"][name] for s in states]
            sd[name] = torch.cat(frags, 0).narrow(0, 0, shape.numel()).view(shape)
    if stage <= 2:
        groups = [torch.cat([o["single_partition_of_fp32_groups"][i] for o in optims], 0)
                  for i in range(len(optims[0]["single_partition_of_fp32_groups"]))]
        for shapes, full in zip(states[0]["param_shapes"], groups):
            offset = 0
            for name, shape in shapes.items():
                sd[name] = full.narrow(0, offset, shape.numel()).view(shape)
                offset += shape.numel()
            align = 2 * world
            assert align * math.ceil(offset / align) == align * math.ceil(full.numel() / align)
    else:
        flats = [torch.cat(o["fp32_flat_groups"], 0) for o in optims]
        shapes = {k: v for d in states[0]["param_shapes"] for k, v in d.items()}
        offset = 0
        for name, shape in shapes.items():
            share = math.ceil(shape.numel() / world)
            sd[name] = torch.cat([f[offset:offset + share] for f in flats], 0)[:shape.numel()].view(shape)
            offset += share
        assert offset == flats[0].numel()
    for name, to in states[0]["shared_params"].items():
        if to in sd:
            sd[name] = sd[to]
    save_file({k: v.contiguous().clone() for k, v in sd.items()}, out)


def check(args):
    for ref_st, hf_dir, dtype, model_ref in zip(args[0::4], args[1::4], args[2::4], args[3::4]):
        what = f"{hf_dir} ({dtype})"
        try:
            want_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
            ref = load_file(ref_st)
            got = {}
            for f in sorted(os.listdir(hf_dir)):
                if f.endswith(".safetensors"):
                    got.update(load_file(os.path.join(hf_dir, f)))
            if not set(ref) & set(got):  # an Actor's merge: its names carry the attribute
                ref = {k[len("model."):]: v for k, v in ref.items()}
            cfg = transformers.AutoConfig.from_pretrained(hf_dir)
            if cfg.tie_word_embeddings:
                ref.pop("lm_head.weight", None)
            assert sorted(ref) == sorted(got), f"names differ: {sorted(set(ref) ^ set(got))[:5]}"
            bad = [n for n in ref if got[n].dtype != want_dtype or not torch.equal(got[n], ref[n].to(want_dtype))]
            assert not bad, f"{len(bad)} tensors differ from the reference merge: {bad[:3]}"
            model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=want_dtype)
            orig = transformers.AutoModelForCausalLM.from_pretrained(model_ref, dtype=want_dtype)
            ids = torch.arange(3, 40).reshape(1, -1)
            with torch.no_grad():
                a, b = model(ids).logits, orig(ids).logits
            assert torch.equal(a, b), f"logits differ by {(a.float() - b.float()).abs().max().item()}"
            print(f"PASS {what}: the reference merge's {len(ref)} tensors and the original model's logits exactly")
        except Exception as e:  # one line per mount
            print(f"FAIL {what}: {e!r}"[:400])


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "build":
        build(sys.argv[2])
    elif cmd == "bench":
        bench(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "hostile":
        hostile(sys.argv[2])
    elif cmd == "merge":
        for ckpt, out in zip(sys.argv[2::2], sys.argv[3::2]):
            merge(ckpt, out)
    elif cmd == "check":
        check(sys.argv[2:])
