#!/usr/bin/python3
"""config.json as transformers 5 writes it, and what Megatron's args must then say.

  config_v5.py v5 DIR [--theta X] [--llama3 FACTOR,LOW,HIGH,ORIG] [--rope-type NAME] [--set KEY=JSON ...]
      DIR/config.json rewritten in transformers 5's spelling: rope_parameters (rope_theta,
      rope_type and the scaling's factors) and no top-level rope_theta / rope_scaling, dtype for
      torch_dtype, head_dim null where it is hidden_size / num_attention_heads, num_local_experts
      for num_experts; --set then sets any member (a JSON value; "a.b" inside object a).
  config_v5.py args RANK_FILE CONFIG
      the args of a Megatron rank file (torch.load) against what CONFIG, read the way
      transformers 5 reads it, says: rotary base, rope scaling, norm epsilon, head width, experts.
  config_v5.py written CONFIG ORIGINAL
      CONFIG (hf/config.json of a Megatron copy) in transformers 4's spelling, for the same model
      as ORIGINAL (transformers 5's): top-level rope_theta, rope_scaling with the same factors.
"""
import json
import sys


def rope(cfg):
    """(theta, type, scaling dict) as transformers 5 reads a config of either spelling."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    factors = {k: v for k, v in (params or scaling).items() if k not in ("rope_type", "type", "rope_theta")}
    return theta, kind, factors


def v5(path, argv):
    p = path + "/config.json"
    cfg = json.load(open(p))
    theta = cfg.pop("rope_theta", 10000.0)
    cfg.pop("rope_scaling", None)
    params = {"rope_type": "default", "rope_theta": theta}
    i = 0
    sets = []
    while i < len(argv):
        if argv[i] == "--theta":
            params["rope_theta"] = float(argv[i + 1])
        elif argv[i] == "--llama3":
            f, low, high, orig = argv[i + 1].split(",")
            params.update(rope_type="llama3", factor=float(f), low_freq_factor=float(low),
                          high_freq_factor=float(high), original_max_position_embeddings=int(orig))
        elif argv[i] == "--rope-type":
            params["rope_type"] = argv[i + 1]
        elif argv[i] == "--set":
            sets.append(argv[i + 1])
        i += 2
    cfg["rope_parameters"] = params
    cfg["dtype"] = cfg.pop("torch_dtype", "bfloat16")
    if cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]) == \
            cfg["hidden_size"] // cfg["num_attention_heads"]:
        cfg["head_dim"] = None
    if "num_experts" in cfg:
        cfg["num_local_experts"] = cfg.pop("num_experts")
    for s in sets:
        key, value = s.split("=", 1)
        obj = cfg
        *parents, leaf = key.split(".")
        for k in parents:
            obj = obj.setdefault(k, {})
        obj[leaf] = json.loads(value)
    json.dump(cfg, open(p, "w"), indent=2)


def expect(cfg):
    theta, kind, factors = rope(cfg)
    heads = cfg["num_attention_heads"]
    want = {"rotary_base": int(theta), "layernorm_epsilon": cfg["rms_norm_eps"],
            "kv_channels": cfg.get("head_dim") or cfg["hidden_size"] // heads,
            "num_query_groups": cfg.get("num_key_value_heads", heads),
            "use_rope_scaling": kind == "llama3"}
    if kind == "llama3":
        want["rope_scaling_factor"] = factors["factor"]
    experts = cfg.get("num_local_experts", cfg.get("num_experts"))
    want["num_experts"] = experts
    return want


def args(rank_file, config):
    import torch
    a = torch.load(rank_file, map_location="cpu")["args"]
    cfg = json.load(open(config))
    bad = [f"args.{k} = {getattr(a, k, None)!r}, config.json says {v!r}"
           for k, v in expect(cfg).items() if getattr(a, k, None) != v]
    if bad:
        sys.exit("; ".join(bad))
    print(f"{rank_file}: args agree with {config}: {expect(cfg)}")


def written(config, original):
    got, orig = json.load(open(config)), json.load(open(original))
    problems = []
    if "rope_parameters" in got or "rope_theta" not in got:
        problems.append("not transformers 4's spelling (top-level rope_theta, no rope_parameters)")
    (t1, k1, f1), (t0, k0, f0) = rope(got), rope(orig)
    if (t1, k1) != (t0, k0) or (k0 != "default" and f1 != f0):
        problems.append(f"rope {t1} {k1} {f1} differs from the original's {t0} {k0} {f0}")
    for key in ("rms_norm_eps", "num_hidden_layers", "hidden_size", "num_attention_heads"):
        if got.get(key) != orig.get(key):
            problems.append(f"{key} {got.get(key)!r} differs from {orig.get(key)!r}")
    if problems:
        sys.exit("; ".join(problems))
    print(f"{config}: transformers 4's spelling, the same model as {original}")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "v5":
        v5(sys.argv[2], sys.argv[3:])
    elif cmd == "args":
        args(sys.argv[2], sys.argv[3])
    elif cmd == "written":
        written(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
