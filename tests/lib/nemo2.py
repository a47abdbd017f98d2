#!/usr/bin/python3
"""NeMo 2 checkpoints written as NeMo writes them (run in the sid root: torch 2.14, transformers 5).

NeMo itself cannot run here (it wants Megatron-core, Transformer Engine and Lightning on a GPU),
so the files follow its save code (NeMo 2.x):
  - nemo/lightning/pytorch/strategies/megatron_strategy.py save_checkpoint and
    nemo/lightning/io/pl.py MegatronCheckpointIO.save_checkpoint: Megatron-core's
    dist_checkpointing.save of the checkpoint dict into CKPT/weights/ (torch_dist: .metadata and
    __*_*.distcp from torch's DCP, the non-sharded entries in common.pt, metadata.json naming the
    backends); the model's ShardedTensors under MegatronParallel's "module." prefix
    (megatron_parallel.py _module_sharded_state_dict);
  - nemo/lightning/io/mixin.py io_dump: CKPT/context/io.json, fiddle's dump_json of the
    TrainerContext's __io__ (fiddle/_src/experimental/serialization.py: "root", "objects",
    "refcounts", "version"; each fdl.Config an object whose "items" are [repr(Attr), value]
    pairs and whose "metadata" is the BuildableTraverserMetadata naming the class), the model's
    config holding the arguments NeMo's HF importer gives it (llama.py / qwen2.py
    HFLlamaImporter.config / HFQwen2Importer.config);
  - the directory name of ModelCheckpoint: NAME--val_loss=X-step=N-consumed_samples=M.
The tensors are the model's Megatron-core state dict as ckptfs's mcore/ view of the Hugging Face
model serves it (its torch_dist layout checked elsewhere against Megatron's), read back with
torch's DCP and saved again by torch's own dcp.save under "module." (one rank).

  nemo2.py build OUT              OUT/FAMILY-ref: the Hugging Face models (bf16, save_pretrained): a
                                  Llama, Qwen2, Qwen3-MoE, Mixtral, and a Llama with Llama 3.1's rope
  nemo2.py save BAD MCORE REF CKPT ...
      CKPT: the NeMo 2 checkpoint of REF's model from MCORE (its mcore/release); then broken
      copies of the first CKPT (a Llama's) under BAD/NAME/ (names say how)
  nemo2.py check REF HF_DIR DTYPE ...   as trainer_dcp.py's check
  nemo2.py bench OUT              OUT/CKPT: a NeMo 2 checkpoint of a Llama at trainer_dcp.py's
                                  BENCH_SHAPE (fp32, random), its Megatron-core tensors made here
  nemo2.py merge CKPT OUT         what NeMo's HF exporter does offline: the weights/ state loaded
                                  whole, converted to Hugging Face's names and layout, save_file
"""
import collections
import copy
import json
import os
import shutil
import sys

import torch
import torch.distributed.checkpoint as dcp
import transformers

from trainer_dcp import BENCH_SHAPE, check  # the bench's Llama shape, the logits check

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
FAMILIES = {
    # family: transformers config class and fields, NeMo model and config classes, module
    "llama": ("LlamaConfig", dict(vocab_size=255, rms_norm_eps=1e-5, rope_theta=10000.0),
              "LlamaModel", "LlamaConfig", "nemo.collections.llm.gpt.model.llama"),
    "qwen2": ("Qwen2Config", dict(vocab_size=256, rms_norm_eps=1e-6, rope_theta=1000000.0),
              "Qwen2Model", "Qwen2Config", "nemo.collections.llm.gpt.model.qwen2"),
    # Qwen3-MoE at Qwen3Config's head_dim (128) and seq_length (4096), which its importer leaves
    # to the class; routing renormalised as Qwen3MoEConfig's moe_router_pre_softmax False does
    "qwen3_moe": ("Qwen3MoeConfig", dict(vocab_size=256, rms_norm_eps=1e-6, rope_theta=1000000.0, head_dim=128,
                                         max_position_embeddings=4096, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=32, norm_topk_prob=True),
                  "Qwen3Model", "Qwen3MoEConfig", "nemo.collections.llm.gpt.model.qwen3"),
    "mixtral": ("MixtralConfig", dict(vocab_size=256, rms_norm_eps=1e-5, rope_theta=1000000.0, num_local_experts=4,
                                      num_experts_per_tok=2),
                "MixtralModel", "MixtralConfig8x7B", "nemo.collections.llm.gpt.model.mixtral"),
    # Llama 3.1's rope scaling (a factor other than the class's 8)
    "llama31": ("LlamaConfig", dict(vocab_size=255, rms_norm_eps=1e-5, rope_theta=10000.0,
                                    rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0,
                                                      high_freq_factor=4.0, original_max_position_embeddings=8192)),
                "LlamaModel", "Llama31Config", "nemo.collections.llm.gpt.model.llama"),
}
STEP = 10
CKPT_NAME = f"default--val_loss=2.31-step={STEP}-consumed_samples=80.0"


def build(out):
    for family, (cls, fields, *_) in FAMILIES.items():
        torch.manual_seed(0)
        cfg = getattr(transformers, cls)(**{**BASE, **fields})
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        with torch.no_grad():  # random values where transformers puts constants (norms 1, biases 0)
            for p in model.parameters():
                p.copy_(torch.randn_like(p) * 0.05 + (1.0 if p.dim() == 1 and p.shape[0] == 64 else 0.0))
        model.to(torch.bfloat16).save_pretrained(os.path.join(out, f"{family}-ref"))
        print(family)


class Fiddle:
    """fiddle's dump_json, for the few kinds of values a TrainerContext holds here: fdl.Config
    (Cfg), dicts, leaves and pyrefs."""

    def __init__(self):
        self.objects, self.refcounts, self.counts = {}, {}, collections.Counter()

    def name(self, hint):
        snake = "".join("_" + c.lower() if c.isupper() else c for c in hint).lstrip("_")
        self.counts[snake] += 1
        return f"{snake}_{self.counts[snake]}"

    def ref(self, key):
        self.refcounts[key] = self.refcounts.get(key, 0) + 1
        return {"type": "ref", "key": key}

    def pyref(self, module, name):
        return {"type": "pyref", "module": module, "name": name}

    def value(self, v, path, paths=True):
        if isinstance(v, Cfg):
            items = [[f"Attr(name='{k}')", self.value(x, f"{path}.{k}")] for k, x in v.kwargs.items()]
            meta_key = self.name("BuildableTraverserMetadata")
            names_key = self.name("tuple")
            self.objects[names_key] = {
                "type": self.pyref("builtins", "tuple"),
                "items": [[f"Index(index={i})", k] for i, k in enumerate(v.kwargs)], "metadata": None}
            tags_key = self.name("dict")
            self.objects[tags_key] = {"type": self.pyref("builtins", "dict"), "items": [], "metadata": []}
            hist_key = self.name("dict")
            self.objects[hist_key] = {"type": self.pyref("builtins", "dict"), "items": [], "metadata": []}
            self.objects[meta_key] = {
                "type": self.pyref("fiddle._src.config", "BuildableTraverserMetadata"),
                "items": [["Attr(name='fn_or_cls')", self.pyref(v.module, v.name)],
                          ["Attr(name='argument_names')", self.ref(names_key)],
                          ["Attr(name='argument_tags')", self.ref(tags_key)],
                          ["Attr(name='argument_history')", self.ref(hist_key)]],
                "metadata": self.pyref("fiddle._src.config", "BuildableTraverserMetadata")}
            key = self.name(v.name)
            self.objects[key] = {"type": self.pyref("fiddle._src.config", "Config"), "items": items,
                                 "metadata": self.ref(meta_key), "paths": [path]}
            return self.ref(key)
        if isinstance(v, dict):
            key = self.name("dict")
            self.objects[key] = {"type": self.pyref("builtins", "dict"),
                                 "items": [[f"Key(key={k!r})", self.value(x, f"{path}[{k!r}]")] for k, x in v.items()],
                                 "metadata": list(v), "paths": [path]}
            return self.ref(key)
        if isinstance(v, PyRef):
            return {**self.pyref(v.module, v.name), "paths": [path]}
        return {"type": "leaf", "value": v, "paths": [path]}

    def dump(self, root):
        top = self.value(root, "<root>")
        return json.dumps({"root": top, "objects": self.objects, "refcounts": self.refcounts, "version": "0.0.1"},
                          indent=2)


class Cfg:
    def __init__(self, module, name, **kwargs):
        self.module, self.name, self.kwargs = module, name, kwargs


class PyRef:
    def __init__(self, module, name):
        self.module, self.name = module, name


def context_of(ref, family, config_class=None, model_class=None, model_module=None, **changes):
    """The TrainerContext NeMo's import and fine-tune would hold: the model's config with the
    arguments its HF importer gives (CHANGES replace or, as None, remove some)."""
    hf = json.load(open(os.path.join(ref, "config.json")))
    _, _, nemo_model, nemo_config, module = FAMILIES[family]
    kwargs = dict(num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
                  ffn_hidden_size=hf["intermediate_size"], num_attention_heads=hf["num_attention_heads"],
                  init_method_std=0.02, layernorm_epsilon=hf["rms_norm_eps"],
                  num_query_groups=hf["num_key_value_heads"], seq_length=hf["max_position_embeddings"],
                  rotary_base=hf.get("rope_theta", hf.get("rope_parameters", {}).get("rope_theta")),
                  gated_linear_unit=True, make_vocab_size_divisible_by=1,
                  share_embeddings_and_output_weights=hf["tie_word_embeddings"], fp16=False, bf16=True,
                  params_dtype=PyRef("torch", "bfloat16"), generation_config=None, vocab_size=hf["vocab_size"])
    if family in ("llama", "llama31", "mixtral"):
        kwargs["kv_channels"] = hf["hidden_size"] // hf["num_attention_heads"]
    if family == "llama31":  # HFLlamaImporter: partial(Llama31Config, scale_factor=rope_scaling's factor)
        kwargs["scale_factor"] = hf.get("rope_scaling", hf.get("rope_parameters"))["factor"]
    if family == "qwen3_moe":  # HFQwen3Importer: no kv_channels nor seq_length; the experts' width
        kwargs.pop("seq_length")
        kwargs.update(make_vocab_size_divisible_by=1187, moe_ffn_hidden_size=hf["moe_intermediate_size"])
        # the importer leaves the experts to Qwen3MoEConfig's 128, top 8 (Qwen3-30B-A3B's and
        # 235B-A22B's): a run of a smaller one gives them
        kwargs.update(num_moe_experts=hf.get("num_experts", hf.get("num_local_experts")),
                      moe_router_topk=hf["num_experts_per_tok"])
    if family == "mixtral":  # HFMixtralImporter's arguments
        kwargs.update(num_moe_experts=hf["num_local_experts"], moe_router_topk=hf["num_experts_per_tok"],
                      moe_router_pre_softmax=False, max_position_embeddings=hf["max_position_embeddings"],
                      normalization="RMSNorm", position_embedding_type="rope",
                      activation_func=PyRef("torch.nn.functional", "silu"), use_cpu_initialization=True,
                      perform_initialization=False, make_vocab_size_divisible_by=128)
    for k, v in changes.items():
        if v is None:
            kwargs.pop(k, None)
        else:
            kwargs[k] = v
    config = Cfg(module, config_class or nemo_config, **kwargs)
    tokenizer = Cfg("nemo.collections.common.tokenizers.huggingface.auto_tokenizer", "AutoTokenizer",
                    pretrained_model_name="nemo_tokenizer")
    model = Cfg(model_module or module, model_class or nemo_model, config=config, tokenizer=tokenizer)
    strategy = Cfg("nemo.lightning.pytorch.strategies.megatron_strategy", "MegatronStrategy",
                   tensor_model_parallel_size=1, pipeline_model_parallel_size=1, ckpt_async_save=False)
    trainer = Cfg("nemo.lightning.pytorch.trainer", "Trainer", devices=1, max_steps=STEP, strategy=strategy)
    return Cfg("nemo.lightning.io.pl", "TrainerContext", model=model, trainer=trainer, extra={})


def read_mcore(mcore):
    """The tensors of a torch_dist checkpoint, read with torch's DCP (the _extra_state objects
    left out, as Transformer Engine's are optional to a load)."""
    reader = dcp.FileSystemReader(mcore)
    meta = reader.read_metadata()
    state = {k: torch.empty(m.size, dtype=m.properties.dtype)
             for k, m in meta.state_dict_metadata.items() if hasattr(m, "size")}
    dcp.load(state, storage_reader=reader)
    return state


def save(mcore, ref, ckpt):
    family = os.path.basename(ref)[:-len("-ref")]
    vocab = json.load(open(os.path.join(ref, "config.json")))["vocab_size"]
    state = read_mcore(mcore)
    # NeMo uses the vocab_size the importer gives as it is: the vocabulary keys hold its rows
    for k in ("embedding.word_embeddings.weight", "output_layer.weight"):
        if k in state:
            state[k] = state[k][:vocab].clone()
    write_checkpoint(state, ref, family, ckpt)


def write_checkpoint(state, ref, family, ckpt, prefix="module."):
    """CKPT: weights/ holding STATE (Megatron-core's names) under PREFIX, context/ of REF's model."""
    weights = os.path.join(ckpt, "weights")
    os.makedirs(weights, exist_ok=True)
    dcp.save({prefix + k: v for k, v in state.items()}, storage_writer=dcp.FileSystemWriter(weights))
    # dist_checkpointing.save: what is not sharded goes to common.pt, the backends to metadata.json
    common = {"epoch": 0, "global_step": STEP, "pytorch-lightning_version": "2.5.1",
              "state_dict": collections.OrderedDict(),
              "loops": {"fit_loop": {"state_dict": {}, "epoch_loop.state_dict": {"_batches_that_stepped": STEP}}},
              "callbacks": {}, "optimizer_states": {}, "lr_schedulers": []}
    torch.save(common, os.path.join(weights, "common.pt"))
    with open(os.path.join(weights, "metadata.json"), "w") as f:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                   "common_backend": "torch", "common_backend_version": 1}, f)
    context = os.path.join(ckpt, "context")
    os.makedirs(os.path.join(context, "nemo_tokenizer"), exist_ok=True)
    with open(os.path.join(context, "io.json"), "w") as f:
        f.write(Fiddle().dump(context_of(ref, family)))
    with open(os.path.join(context, "model.yaml"), "w") as f:
        f.write(f"_target_: {FAMILIES[family][4]}.{FAMILIES[family][2]}\n")


# Megatron-core's stacked names of a Llama's layer tensors (the TE spec: norms fused into the
# linear layers that follow them)
LAYER_KEYS = ("self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.weight",
              "self_attention.linear_proj.weight", "mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.weight",
              "mlp.linear_fc2.weight")


def bench(out):
    """A Llama at BENCH_SHAPE as NeMo saves it: its Hugging Face tensors (random) in Megatron-core's
    layout (q, k, v rows interleaved per query group; gate and up stacked), layers stacked."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**{**BASE, **BENCH_SHAPE})
    ref = os.path.join(out, "llama-ref")
    cfg.save_pretrained(ref)
    heads, groups = cfg.num_attention_heads, cfg.num_key_value_heads
    dim = cfg.hidden_size // heads
    layers = cfg.num_hidden_layers

    def rand(*shape):
        return torch.randn(*shape) * (0.3 if len(shape) == 1 else 0.05)

    stacked = {k: [] for k in LAYER_KEYS}
    for _ in range(layers):
        q, k, v = (rand(n * dim, cfg.hidden_size) for n in (heads, groups, groups))
        per = heads // groups
        qkv = torch.cat([q.view(groups, per * dim, -1), k.view(groups, dim, -1), v.view(groups, dim, -1)],
                        dim=1).reshape(-1, cfg.hidden_size)
        stacked["self_attention.linear_qkv.layer_norm_weight"].append(rand(cfg.hidden_size))
        stacked["self_attention.linear_qkv.weight"].append(qkv)
        stacked["self_attention.linear_proj.weight"].append(rand(cfg.hidden_size, heads * dim))
        stacked["mlp.linear_fc1.layer_norm_weight"].append(rand(cfg.hidden_size))
        stacked["mlp.linear_fc1.weight"].append(rand(2 * cfg.intermediate_size, cfg.hidden_size))
        stacked["mlp.linear_fc2.weight"].append(rand(cfg.hidden_size, cfg.intermediate_size))
    state = {f"decoder.layers.{k}": torch.stack(v) for k, v in stacked.items()}
    state.update({"embedding.word_embeddings.weight": rand(cfg.vocab_size, cfg.hidden_size),
                  "decoder.final_layernorm.weight": rand(cfg.hidden_size),
                  "output_layer.weight": rand(cfg.vocab_size, cfg.hidden_size)})
    ckpt = os.path.join(out, "llama-nemo", CKPT_NAME)
    write_checkpoint(state, ref, "llama", ckpt)
    n = sum(t.numel() for t in state.values())
    print(f"built a Llama of {n} parameters ({n * 4} bytes in fp32) as a NeMo 2 checkpoint at {ckpt}")


def merge(ckpt, out):
    """NeMo's HF export offline: the dist checkpoint loaded whole (torch DCP), each Megatron-core
    tensor split back into Hugging Face's, save_file."""
    import torch.distributed.checkpoint.format_utils as fmt
    from safetensors.torch import save_file
    state = {}
    fmt._load_state_dict(state, storage_reader=dcp.FileSystemReader(os.path.join(ckpt, "weights")),
                         planner=fmt._EmptyStateDictLoadPlanner(), no_dist=True)
    state = {k[len("module."):]: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    io = json.load(open(os.path.join(ckpt, "context", "io.json")))
    config = next(o for o in io["objects"].values() if o.get("paths") == ["<root>.model.config"])
    sizes = {item[0][len("Attr(name='"):-2]: item[1]["value"] for item in config["items"]
             if isinstance(item[1], dict) and item[1].get("type") == "leaf"}
    heads, groups, dim = sizes["num_attention_heads"], sizes["num_query_groups"], sizes["kv_channels"]
    per = heads // groups
    hf = {"model.embed_tokens.weight": state["embedding.word_embeddings.weight"],
          "model.norm.weight": state["decoder.final_layernorm.weight"], "lm_head.weight": state["output_layer.weight"]}
    for i in range(sizes["num_layers"]):
        layer = {k: state[f"decoder.layers.{k}"][i] for k in LAYER_KEYS}
        qkv = layer["self_attention.linear_qkv.weight"].reshape(groups, (per + 2) * dim, -1)
        gate, up = layer["mlp.linear_fc1.weight"].chunk(2)
        name = f"model.layers.{i}."
        hf.update({name + "input_layernorm.weight": layer["self_attention.linear_qkv.layer_norm_weight"],
                   name + "self_attn.q_proj.weight": qkv[:, :per * dim].reshape(heads * dim, -1),
                   name + "self_attn.k_proj.weight": qkv[:, per * dim:(per + 1) * dim].reshape(groups * dim, -1),
                   name + "self_attn.v_proj.weight": qkv[:, (per + 1) * dim:].reshape(groups * dim, -1),
                   name + "self_attn.o_proj.weight": layer["self_attention.linear_proj.weight"],
                   name + "post_attention_layernorm.weight": layer["mlp.linear_fc1.layer_norm_weight"],
                   name + "mlp.gate_proj.weight": gate, name + "mlp.up_proj.weight": up,
                   name + "mlp.down_proj.weight": layer["mlp.linear_fc2.weight"]})
    save_file({k: v.contiguous() for k, v in hf.items()}, out, metadata={"format": "pt"})


def hostile(ckpt, bad):
    ref = os.path.join(os.path.dirname(os.path.dirname(ckpt)), "llama-ref")

    def variant(name, context=None, text=None, weights=None):
        d = os.path.join(bad, name, CKPT_NAME)
        os.makedirs(os.path.join(d, "context"))
        if weights is None:
            os.symlink(os.path.join(ckpt, "weights"), os.path.join(d, "weights"))
        else:
            weights(os.path.join(d, "weights"))
        with open(os.path.join(d, "context", "io.json"), "w") as f:
            f.write(text if text is not None else Fiddle().dump(context))

    variant("unknown-field", context_of(ref, "llama", apply_query_key_layer_scaling=True))
    variant("layernorm", context_of(ref, "llama", normalization="LayerNorm"))
    variant("no-num-layers", context_of(ref, "llama", num_layers=None))
    variant("subclass-defaults", context_of(ref, "llama", config_class="Llama3Config8B"))
    variant("llama4", context_of(ref, "llama", config_class="Llama4Config"))
    variant("rope-field-elsewhere", context_of(ref, "llama", scale_factor=8.0))
    variant("llama31-low-freq", context_of(ref, "llama", config_class="Llama31Config", scale_factor=8.0,
                                           low_freq_factor=2.0))
    moe_ref = os.path.join(os.path.dirname(ref), "qwen3_moe-ref")
    variant("moe-subclass-defaults", context_of(moe_ref, "qwen3_moe", config_class="Qwen3Config30B_A3B"))
    moe_weights = os.path.join(os.path.dirname(os.path.dirname(ckpt)), "qwen3_moe-nemo", CKPT_NAME, "weights")
    variant("moe-class-experts", context_of(moe_ref, "qwen3_moe", num_moe_experts=None, moe_router_topk=None),
            weights=lambda w: os.symlink(moe_weights, w))
    variant("unknown-model", context_of(ref, "llama", model_class="MistralModel",
                                        model_module="nemo.collections.llm.gpt.model.mistral"))
    variant("wrong-vocab", context_of(ref, "llama", vocab_size=250))
    good = json.loads(Fiddle().dump(context_of(ref, "llama")))
    root = good["objects"][good["root"]["key"]]
    for pair in root["items"]:
        if pair[0] == "Attr(name='model')":
            pair[1]["key"] = "missing_model_1"
    variant("dangling-ref", text=json.dumps(good))
    variant("truncated-json", text=Fiddle().dump(context_of(ref, "llama"))[:200])
    # weights saved without MegatronParallel's prefix, and with one tensor gone
    state = read_mcore(os.path.join(ckpt, "weights"))
    bare = {k[len("module."):]: v for k, v in state.items()}

    def unprefixed(w):
        shutil.copytree(os.path.join(ckpt, "weights"), w, ignore=shutil.ignore_patterns("*.distcp", ".metadata"))
        dcp.save(bare, storage_writer=dcp.FileSystemWriter(w))

    def missing(w):
        shutil.copytree(os.path.join(ckpt, "weights"), w, ignore=shutil.ignore_patterns("*.distcp", ".metadata"))
        dcp.save({k: v for k, v in state.items() if not k.endswith("mlp.linear_fc2.weight")},
                 storage_writer=dcp.FileSystemWriter(w))

    variant("no-prefix", context_of(ref, "llama"), weights=unprefixed)
    variant("missing-tensor", context_of(ref, "llama"), weights=missing)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "build":
        build(sys.argv[2])
    elif cmd == "save":
        triples = sys.argv[3:]
        for i in range(0, len(triples), 3):
            save(*triples[i:i + 3])
        hostile(triples[2], sys.argv[2])
    elif cmd == "bench":
        bench(sys.argv[2])
    elif cmd == "merge":
        merge(sys.argv[2], sys.argv[3])
    else:
        check(sys.argv[2:])
