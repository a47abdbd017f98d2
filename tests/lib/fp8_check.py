#!/usr/bin/python3
"""Block-FP8 checkpoints (DeepSeek-V3's scheme) and the checks of their bf16 view.

  fp8_check.py write DIR [BR BC]  a tiny Llama whose linear weights are E4M3 codes with fp32
                                  `weight_scale_inv` per BRxBC block (default 16x24: the tensors'
                                  edges cut blocks), quantised as the releases are (amax / 448 per
                                  block), the other tensors bf16; quantization_config in config.json
  fp8_check.py check SRC VIEW     (numpy) VIEW's tensors are SRC dequantised by the definition:
                                  bf16(float(code) * scale), the product in fp32, round to nearest
                                  even; no _scale_inv tensors; config without quantization_config
  fp8_check.py torch SRC VIEW     (torch 2.x, safetensors) the same by torch's own float8 path:
                                  (w.float() * s.repeat_interleave(...)).bfloat16()
  fp8_check.py break DIR KIND     damage DIR: scale-shape, scale-dtype, no-scale, method, block
"""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def e4m3_values():
    import numpy as np
    v = np.zeros(256, dtype=np.float64)
    for c in range(256):
        sign = -1.0 if c & 0x80 else 1.0
        exp, mant = (c >> 3) & 15, c & 7
        if exp == 15 and mant == 7:
            v[c] = np.nan
        else:
            v[c] = sign * (np.ldexp(8 + mant, exp - 10) if exp else np.ldexp(mant, -9))
    return v


def bf16_bits(f32):
    import numpy as np
    u = np.ascontiguousarray(f32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[np.isnan(f32)] = 0xFFFF
    return r


def write(out, br=16, bc=24):
    import numpy as np
    import models
    cfg = models.config_for("llama", layers=2)
    vals = e4m3_values()
    finite = np.where(~np.isnan(vals))[0]
    order = finite[np.argsort(vals[finite], kind="stable")]
    sorted_vals = vals[order]
    named = {}
    for name, (dt, a) in models.model_tensors(cfg).items():
        w = models.bf16_to_f32(a) if dt == "BF16" else a.astype(np.float32)
        if w.ndim != 2 or "embed" in name or "lm_head" in name:
            named[name] = (dt, a)
            continue
        rows, cols = w.shape
        gr, gc = -(-rows // br), -(-cols // bc)
        scale = np.zeros((gr, gc), dtype=np.float32)
        codes = np.zeros(w.shape, dtype=np.uint8)
        for i in range(gr):
            for j in range(gc):
                blk = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
                s = np.float32(max(float(np.abs(blk).max()), 1e-12) / 448.0)
                scale[i, j] = s
                q = (blk / s).astype(np.float64)
                idx = np.clip(np.searchsorted(sorted_vals, q), 1, len(sorted_vals) - 1)
                lo, hi = sorted_vals[idx - 1], sorted_vals[idx]
                pick = np.where(np.abs(q - lo) <= np.abs(hi - q), idx - 1, idx)
                codes[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = order[pick]
        named[name] = ("F8_E4M3", codes)
        named[name + "_scale_inv"] = ("F32", scale)
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                  "weight_block_size": [br, bc]}
    models.ST_DTYPES.setdefault("F8_E4M3", (np.uint8, 1))
    models.write_checkpoint(out, named, cfg, shards=2, tokenizer=True)


def check(src, view):
    import numpy as np
    import models
    a, b = models.read_checkpoint(src), models.read_checkpoint(view)
    vals = e4m3_values().astype(np.float32)
    bad, n = [], 0
    want_names = {k for k in a if not k.endswith("_scale_inv")}
    if set(b) != want_names:
        bad.append(f"names differ: {sorted(set(b) ^ want_names)[:4]}")
    cfg = json.load(open(os.path.join(src, "config.json")))
    br, bc = cfg["quantization_config"]["weight_block_size"]
    for name in want_names & set(b):
        dt, shape, raw = a[name]
        vdt, vshape, vraw = b[name]
        if dt == "F8_E4M3":
            codes = np.frombuffer(raw, dtype=np.uint8).reshape(shape)
            s = np.frombuffer(a[name + "_scale_inv"][2], dtype=np.float32).reshape(a[name + "_scale_inv"][1])
            full = np.repeat(np.repeat(s, br, axis=0), bc, axis=1)[:shape[0], :shape[1]]
            want = bf16_bits(vals[codes] * full).tobytes()
            n += 1
        else:
            want = raw
        if vdt != "BF16" or tuple(vshape) != tuple(shape) or vraw != want:
            bad.append(f"{name}: {vdt} {vshape} differs from the dequantised source")
    vcfg = json.load(open(os.path.join(view, "config.json")))
    if "quantization_config" in vcfg or vcfg.get("torch_dtype") != "bfloat16":
        bad.append("config.json still has quantization_config or is not bfloat16")
    if bad:
        sys.exit("; ".join(bad[:5]))
    print(f"{n} FP8 weights dequantised, {len(want_names) - n} bf16 tensors unchanged")


def torch_check(src, view):
    import torch
    from safetensors.torch import load_file

    def load(d):
        out = {}
        for f in sorted(os.listdir(d)):
            if f.endswith(".safetensors"):
                out.update(load_file(os.path.join(d, f)))
        return out

    a, b = load(src), load(view)
    cfg = json.load(open(os.path.join(src, "config.json")))
    br, bc = cfg["quantization_config"]["weight_block_size"]
    bad = []
    for name, w in a.items():
        if name.endswith("_scale_inv"):
            continue
        if w.dtype == torch.float8_e4m3fn:
            s = a[name + "_scale_inv"]
            full = s.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:w.shape[0], :w.shape[1]]
            want = (w.float() * full).bfloat16()
        else:
            want = w
        if not torch.equal(b[name].view(torch.int16), want.view(torch.int16)):
            bad.append(name)
    if bad:
        sys.exit(f"differ from torch's float8 dequantisation: {bad[:4]}")
    print(f"{len(b)} tensors equal torch's (w.float() * s).bfloat16()")


def damage(d, kind):
    import models
    idx = os.path.join(d, "model.safetensors.index.json")
    wm = json.load(open(idx))["weight_map"]
    name = "model.layers.0.mlp.down_proj.weight"
    if kind in ("scale-shape", "scale-dtype", "no-scale"):
        f = os.path.join(d, wm[name + "_scale_inv"])
        data = open(f, "rb").read()
        n = struct.unpack("<Q", data[:8])[0]
        head = json.loads(data[8:8 + n])
        e = head[name + "_scale_inv"]
        if kind == "scale-shape":
            e["shape"] = [e["shape"][0] * e["shape"][1], 1]
        elif kind == "scale-dtype":
            e["dtype"] = "I32"
        else:
            head["model.layers.0.mlp.down_proj.weight_scale_gone"] = head.pop(name + "_scale_inv")
            wm["model.layers.0.mlp.down_proj.weight_scale_gone"] = wm.pop(name + "_scale_inv")
            json.dump({"metadata": {}, "weight_map": wm}, open(idx, "w"))
        text = json.dumps(head, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        open(f, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
    else:
        c = json.load(open(os.path.join(d, "config.json")))
        if kind == "method":
            c["quantization_config"]["quant_method"] = "awq"
        elif kind == "no-config":
            del c["quantization_config"]
        elif kind == "config-null":
            c["quantization_config"] = None
        elif kind == "config-list":
            c["quantization_config"] = [1]
        elif kind == "no-method":
            del c["quantization_config"]["quant_method"]
        else:
            c["quantization_config"]["weight_block_size"] = [0, 128]
        json.dump(c, open(os.path.join(d, "config.json"), "w"))


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[:1] == ["write"] and len(a) in (2, 4):
        write(a[1], *(int(x) for x in a[2:]))
    elif a[:1] == ["check"] and len(a) == 3:
        check(a[1], a[2])
    elif a[:1] == ["torch"] and len(a) == 3:
        torch_check(a[1], a[2])
    elif a[:1] == ["break"] and len(a) == 3:
        damage(a[1], a[2])
    else:
        sys.exit(__doc__)
