#!/usr/bin/python3
"""Helpers of node_bench.sh (see bench/README.md).

  node_bench.py gen [--model qwen2-7b|llama3-8b] [--size SIZE] BENCH_DIR
      A bf16 Hugging Face checkpoint with random weights under BENCH_DIR, shaped as the model
      (generated once, reused); prints its directory. qwen2-7b (default): 28 layers, hidden
      3584, 28 heads / 4 KV heads, ffn 18944, q/k/v biases, vocab 152064, 15.2 GB in 4 shards
      (TP 8 is not a valid split: 28 heads). llama3-8b: 32 layers, hidden 4096, 32 heads / 8 KV
      heads, ffn 14336, vocab 128256, 16.1 GB (TP 2, 4 and 8 are). With --size (decimal: 1.5G,
      800M, bytes): the same widths with the layer count (even, >= 2) that comes closest; below
      the embeddings and 4 layers the vocabulary is cut to 32768 too. Needs numpy
      (bench/gen_checkpoint.py writes the data) when it generates, and for llama3-8b always (its
      shapes and config come from there).

  node_bench.py read [--chunk BYTES] N FILE...
      N concurrent reader processes over the bytes of FILE... (in order, cut into N equal
      ranges at chunk boundaries: 4 equal files and N=4 is one file per reader, N=16 four parts
      of each). Each reader preads a chunk (default 1 MiB, a multiple of 4096) at a time into
      one page-aligned buffer. They start together (after
      fork); prints "BYTES WALL_S READERS_CPU_S" (wall: from the start to the last reader's
      end; CPU: user + system of all readers). Standard library only.

  node_bench.py gpu --mode torch|slice --tp T --device DEV TARGET...
      T rank processes, each loading its tensor-parallel share onto DEV (cuda, or cpu to test the
      code without a GPU), started together once every rank has imported torch and set up its
      device. torch: TARGET is the T rank files, rank r does torch.load(file r,
      map_location=DEV). slice: TARGET is the HF directory, rank r does safe_open +
      get_slice of every tensor's Megatron TP share (the rows / columns the tpTpp1 view gives
      rank r) and .to(DEV). Prints "WALL_S BYTES HWM_MIB READY_MIB RANK_S,..." (wall: start
      to the last rank's end; bytes: tensor bytes on the device, all ranks; the largest VmHWM
      of a rank at its end and VmRSS once ready; each rank's own seconds), and a JSON line
      with the same on stderr.
"""

import json
import math
import mmap
import os
import sys
import time

CHUNK = 1 << 20

# --- gen ------------------------------------------------------------------------------------------

# Qwen/Qwen2-7B config.json.
QWEN2_7B = dict(
    hidden_size=3584,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    intermediate_size=18944,
    vocab_size=152064,
    tie_word_embeddings=False,
    max_position_embeddings=131072,
    rope_theta=1000000.0,
    rms_norm_eps=1e-06,
    bos_token_id=151643,
    eos_token_id=151643,
)
SMALL_VOCAB = 32768
BF16 = 2


def qwen2_tensors(cfg):
    """(name, shape) in Qwen2ForCausalLM's state-dict order (q/k/v with biases)."""
    h = cfg["hidden_size"]
    ffn = cfg["intermediate_size"]
    d = h // cfg["num_attention_heads"]
    q = cfg["num_attention_heads"] * d
    kv = cfg["num_key_value_heads"] * d
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.q_proj.bias", (q,)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "mlp.gate_proj.weight", (ffn, h)),
            (p + "mlp.up_proj.weight", (ffn, h)),
            (p + "mlp.down_proj.weight", (h, ffn)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    out.append(("model.norm.weight", (h,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (cfg["vocab_size"], h)))
    return out


def qwen2_config_json(cfg):
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": cfg["bos_token_id"],
        "eos_token_id": cfg["eos_token_id"],
        "hidden_act": "silu",
        "hidden_size": cfg["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": cfg["intermediate_size"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "max_window_layers": cfg["num_hidden_layers"],
        "model_type": "qwen2",
        "num_attention_heads": cfg["num_attention_heads"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": cfg["rope_theta"],
        "sliding_window": cfg["max_position_embeddings"],
        "tie_word_embeddings": cfg["tie_word_embeddings"],
        "torch_dtype": "bfloat16",
        "transformers_version": "4.37.2",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": cfg["vocab_size"],
    }


def nbytes(shape):
    return BF16 * math.prod(shape)


def parse_size(s):
    units = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    t = s.strip().upper()
    t = t[:-1] if t.endswith("B") else t
    unit = t[-1] if t and t[-1] in units else ""
    try:
        v = float(t[:-1] if unit else t) * units[unit]
    except ValueError:
        sys.exit(f"node_bench: cannot read the size {s!r} (e.g. 1.5G, 800M, 15G)")
    if v <= 0:
        sys.exit(f"node_bench: size {s!r} must be positive")
    return int(v)


MODELS = ("qwen2-7b", "llama3-8b")


def gen_checkpoint():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import gen_checkpoint as g
    except ImportError as e:
        sys.exit(f"node_bench: cannot generate a checkpoint: {e} (gen_checkpoint.py needs numpy; "
                 f"set PYTHON to a python with numpy)")
    return g


def model_spec(model):
    """MODEL's whole config, its (name, shape) list and its config.json, as functions of a config."""
    if model == "qwen2-7b":
        return dict(QWEN2_7B), qwen2_tensors, qwen2_config_json
    g = gen_checkpoint()  # Llama-3-8B: Llama-3-70B's config but for these widths
    cfg = dict(g.LLAMA3_70B, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               intermediate_size=14336)
    return cfg, g.llama_tensors, g.config_json


def sized_config(model, size):
    """MODEL's widths with the layer count (and vocabulary) that come closest to SIZE bytes."""
    cfg, tensors, _ = model_spec(model)
    if size is None:
        return cfg
    one = dict(cfg, num_hidden_layers=1)
    per_layer = sum(nbytes(s) for n, s in tensors(one) if n.startswith("model.layers."))

    def embeds(vocab):
        return 2 * vocab * cfg["hidden_size"] * BF16 + cfg["hidden_size"] * BF16

    if size < embeds(cfg["vocab_size"]) + 4 * per_layer:
        cfg["vocab_size"] = SMALL_VOCAB
    layers = max(2, 2 * round((size - embeds(cfg["vocab_size"])) / per_layer / 2))
    cfg["num_hidden_layers"] = layers
    cfg["max_window_layers"] = layers
    return cfg


def cmd_gen(argv):
    import argparse

    ap = argparse.ArgumentParser(prog="node_bench.py gen")
    ap.add_argument("--model", default="qwen2-7b", choices=MODELS)
    ap.add_argument("--size", default=None)
    ap.add_argument("bench_dir")
    a = ap.parse_args(argv)
    size = parse_size(a.size) if a.size else None
    whole, tensors_of, config_json = model_spec(a.model)
    cfg = sized_config(a.model, size)
    full = cfg["num_hidden_layers"] == whole["num_hidden_layers"] and cfg["vocab_size"] == whole["vocab_size"]
    name = a.model if full else f"{a.model}-L{cfg['num_hidden_layers']}-V{cfg['vocab_size']}"
    dest = os.path.join(os.path.abspath(a.bench_dir), name)
    if not os.path.isfile(os.path.join(dest, "model.safetensors.index.json")):
        tensors = tensors_of(cfg)
        total = sum(nbytes(s) for _, s in tensors)
        biggest = max(nbytes(s) for _, s in tensors)
        # About 4 shards, at most 4 GB each (Qwen2-7B's own: 4 shards).
        max_shard = int(min(4e9, max(biggest, math.ceil(total / 4 * 1.05))))
        g = gen_checkpoint()
        g.tensors_of = tensors_of
        g.config_json = config_json
        if os.path.exists(dest):
            import shutil
            shutil.rmtree(dest)
        print(f"node_bench: generating {dest}: {a.model} widths, {cfg['num_hidden_layers']} layers, "
              f"vocab {cfg['vocab_size']}, {total / 1e9:.2f} GB, shards <= {max_shard / 1e9:.2f} GB",
              file=sys.stderr)
        t0 = time.monotonic()
        n, nt, total = g.generate(dest, cfg, max_shard, False)
        print(f"node_bench: {n} shards, {nt} tensors, {total} bytes in {time.monotonic() - t0:.1f} s",
              file=sys.stderr)
    print(dest)


# --- read -----------------------------------------------------------------------------------------

def plan_ranges(files, n, chunk):
    """N lists of (path, start, end): the files' bytes in order, cut into N equal ranges."""
    sizes = [os.stat(f).st_size for f in files]
    total = sum(sizes)
    cuts = [min(total, (total * i // n) // chunk * chunk) for i in range(n)] + [total]
    plans = []
    for i in range(n):
        lo, hi, base, segs = cuts[i], cuts[i + 1], 0, []
        for f, s in zip(files, sizes):
            a, b = max(lo, base), min(hi, base + s)
            if a < b:
                segs.append((f, a - base, b - base))
            base += s
        plans.append(segs)
    return plans, total


def reader(segs, gate, chunk):
    os.read(gate, 1)  # blocks until the parent closes its end: everybody starts together
    buf = mmap.mmap(-1, chunk)  # page-aligned, as dd's buffer
    mv = memoryview(buf)
    got = 0
    for path, start, end in segs:
        fd = os.open(path, os.O_RDONLY)
        try:
            off = start
            while off < end:
                k = os.preadv(fd, [mv[:min(chunk, end - off)]], off)
                if k <= 0:
                    print(f"node_bench: short read of {path} at {off} (file changed?)", file=sys.stderr)
                    return 1
                off += k
                got += k
        finally:
            os.close(fd)
    return 0 if got == sum(e - s for _, s, e in segs) else 1


def cmd_read(argv):
    chunk = CHUNK
    if argv[:1] == ["--chunk"] and len(argv) > 1:
        chunk = int(argv[1])
        argv = argv[2:]
    if len(argv) < 2 or int(argv[0]) < 1 or chunk < 4096 or chunk % 4096:
        sys.exit("usage: node_bench.py read [--chunk BYTES] N FILE... (BYTES a multiple of 4096)")
    n = int(argv[0])
    files = argv[1:]
    plans, total = plan_ranges(files, n, chunk)
    r, w = os.pipe()
    pids = []
    for segs in plans:
        pid = os.fork()
        if pid == 0:
            os.close(w)
            rc = 1
            try:
                rc = reader(segs, r, chunk)
            except BaseException as e:  # noqa: BLE001 - the child must never return into the parent's code
                print(f"node_bench: reader: {e}", file=sys.stderr)
            os._exit(rc)
        pids.append(pid)
    os.close(r)
    time.sleep(0.05)  # let every child reach its read of the gate
    c0 = os.times()
    t0 = time.monotonic()
    os.close(w)
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)
    t1 = time.monotonic()
    c1 = os.times()
    if failed:
        sys.exit(f"node_bench: {failed} of {n} readers failed")
    cpu = (c1.children_user + c1.children_system) - (c0.children_user + c0.children_system)
    print(f"{total} {t1 - t0:.6f} {cpu:.3f}")


# --- gpu ------------------------------------------------------------------------------------------

def status_mib(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return -1.0


def tensor_bytes(obj, dev, seen=None):
    """Bytes of every tensor in a nested dict/list (torch.load's result); checks their device."""
    import torch

    if seen is None:
        seen = set()
    if isinstance(obj, torch.Tensor):
        if id(obj) in seen:
            return 0
        seen.add(id(obj))
        if obj.device.type != dev.type:
            raise RuntimeError(f"a tensor landed on {obj.device}, not {dev}")
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, dev, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v, dev, seen) for v in obj)
    return 0


def share_of(name, shape, sl, f, r, t, cfg):
    """Rank r of t's Megatron tensor-parallel share of HF tensor NAME (as tp{t}pp1 gives it)."""
    def rows(n):
        return r * n // t, (r + 1) * n // t

    groups = cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    if name.endswith(("q_proj.weight", "q_proj.bias", "gate_proj.weight", "up_proj.weight")):
        a, b = rows(shape[0])
        return sl[a:b]
    if name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
        if t <= groups:
            a, b = rows(shape[0])
        else:  # a rank holds part of one group's heads: that group's k / v whole
            g = r * groups // t
            a, b = g * d, (g + 1) * d
        return sl[a:b]
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        a, b = rows(shape[1])
        return sl[:, a:b]
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        unit = 128 * t  # Megatron's --make-vocab-size-divisible-by 128, times TP
        padded = -(-shape[0] // unit) * unit
        a, b = rows(padded)
        b = min(b, shape[0])
        return sl[a:b] if a < b else None
    return f.get_tensor(name)  # norms: whole on every rank


def rank_main(argv):
    import argparse

    ap = argparse.ArgumentParser(prog="node_bench.py gpu-rank")
    ap.add_argument("--mode", choices=("torch", "slice"), required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("target")
    a = ap.parse_args(argv)

    import torch

    dev = torch.device(a.device)
    if dev.type == "cuda":
        idx = a.rank % torch.cuda.device_count()
        torch.cuda.set_device(idx)
        dev = torch.device("cuda", idx)
        torch.zeros(1, device=dev)  # the CUDA context, before the clock starts
        torch.cuda.synchronize(dev)
    if a.mode == "slice":
        from safetensors import safe_open  # noqa: F401 - imported before the clock starts
    print(f"ready {status_mib('VmRSS'):.1f}", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    t0 = time.monotonic()
    if a.mode == "torch":
        try:
            sd = torch.load(a.target, map_location=dev, weights_only=False)
        except TypeError:  # torch without weights_only
            sd = torch.load(a.target, map_location=dev)
        nb = tensor_bytes(sd, dev)
    else:
        src = a.target
        with open(os.path.join(src, "config.json")) as fh:
            cfg = json.load(fh)
        idx_path = os.path.join(src, "model.safetensors.index.json")
        if os.path.exists(idx_path):
            with open(idx_path) as fh:
                shards = sorted(set(json.load(fh)["weight_map"].values()))
        else:
            shards = ["model.safetensors"]
        kept = []
        nb = 0
        for shard in shards:
            with safe_open(os.path.join(src, shard), framework="pt", device="cpu") as f:
                for name in f.keys():
                    sl = f.get_slice(name)
                    x = share_of(name, list(sl.get_shape()), sl, f, a.rank, a.tp, cfg)
                    if x is None:
                        continue
                    # On a GPU .to copies; on the CPU (a test) copy too, or nothing is read.
                    x = x.to(dev) if dev.type != "cpu" else x.clone()
                    nb += x.numel() * x.element_size()
                    kept.append(x)
        sd = kept
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t1 = time.monotonic()
    print(json.dumps({"rank": a.rank, "start": t0, "end": t1, "bytes": nb,
                      "hwm_mib": status_mib("VmHWM")}), flush=True)
    del sd
    return 0


def cmd_gpu(argv):
    import argparse
    import subprocess

    ap = argparse.ArgumentParser(prog="node_bench.py gpu")
    ap.add_argument("--mode", choices=("torch", "slice"), required=True)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("target", nargs="+")
    a = ap.parse_args(argv)
    if a.mode == "torch" and len(a.target) != a.tp:
        sys.exit(f"node_bench: torch mode needs {a.tp} rank files, got {len(a.target)}")
    procs = []
    try:
        for r in range(a.tp):
            target = a.target[r] if a.mode == "torch" else a.target[0]
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "gpu-rank", "--mode", a.mode,
                 "--rank", str(r), "--tp", str(a.tp), "--device", a.device, target],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        ready = []
        for r, p in enumerate(procs):
            line = p.stdout.readline().split()
            if len(line) != 2 or line[0] != "ready":
                sys.exit(f"node_bench: rank {r} did not get ready (its stderr is above)")
            ready.append(float(line[1]))
        t0 = time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        res = []
        for r, p in enumerate(procs):
            line = p.stdout.readline()
            p.stdin.close()
            if p.wait() != 0 or not line.strip():
                sys.exit(f"node_bench: rank {r} failed (exit {p.returncode}; its stderr is above)")
            res.append(json.loads(line))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    out = {
        "wall_s": max(x["end"] for x in res) - t0,
        "rank_s": [round(x["end"] - x["start"], 3) for x in res],
        "bytes": sum(x["bytes"] for x in res),
        "rss_ready_mib": [round(v) for v in ready],
        "hwm_mib": [round(x["hwm_mib"]) for x in res],
    }
    print("node_bench: gpu " + json.dumps(out), file=sys.stderr)
    # For the shell: WALL_S BYTES MAX_HWM_MIB MAX_READY_MIB RANK_S,RANK_S,...
    print(f"{out['wall_s']:.3f} {out['bytes']} {max(out['hwm_mib'])} {max(out['rss_ready_mib'])} "
          + ",".join(f"{v:.2f}" for v in out["rank_s"]))


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, argv = sys.argv[1], sys.argv[2:]
    if cmd == "gen":
        return cmd_gen(argv)
    if cmd == "read":
        return cmd_read(argv)
    if cmd == "gpu":
        return cmd_gpu(argv)
    if cmd == "gpu-rank":
        return rank_main(argv)
    sys.exit(f"node_bench: unknown command {cmd!r} (gen, read, gpu)")


if __name__ == "__main__":
    sys.exit(main())
