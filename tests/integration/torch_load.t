#!/usr/bin/env bash
# Load hf/ views with real consumers:
#  - torch 2.6 + safetensors 0.4 (Debian 13 root, see tests/lib/torch2_root.sh):
#    safe_open(path, "pt") (mmaps the file) + get_tensor/get_slice, and
#    safetensors.torch.load_file, on every safetensors file of MNT/hf;
#  - host torch 1.13 (no safetensors package): mmap + torch.frombuffer.
# Both produce a manifest {name: [dtype, shape, sha256(raw bytes)]} which
# st_check compares with the source files read by numpy.
. "$(dirname "$0")/../lib/tap.sh"
. "$TESTS_LIB/torch2_root.sh"
tap_require_fuse
tap_workdir

"${GEN[@]}" llama-tiny "$WORK/src-llama" --shards 2 --dtype bf16 --tokenizer || tap_bail "ckpt_gen failed"
"${GEN[@]}" mixed "$WORK/src-mixed" --empty || tap_bail "ckpt_gen failed"

cat >"$WORK/torch2_load.py" <<'EOF'
# runs in the Debian 13 root: torch 2.6, safetensors 0.4
import hashlib, json, os, sys, warnings
import torch
from safetensors import safe_open
from safetensors.torch import load_file

d, out = sys.argv[1], sys.argv[2]
DT = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
      torch.uint8: "U8", torch.bool: "BOOL"}

def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()

errors = []
idx_path = os.path.join(d, "model.safetensors.index.json")
if os.path.exists(idx_path):
    with open(idx_path) as f:
        wm = json.load(f)["weight_map"]
    files = sorted(set(wm.values()))
else:
    wm = None
    files = ["model.safetensors"]
on_disk = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
if on_disk != files:
    errors.append("safetensors files %s != files named by the index %s" % (on_disk, files))

man = {}
for fn in files:
    p = os.path.join(d, fn)
    with safe_open(p, framework="pt") as f:
        if f.metadata() != {"format": "pt"}:
            errors.append("%s: metadata %r" % (fn, f.metadata()))
        for k in f.keys():
            t = f.get_tensor(k)
            if k in man:
                errors.append("%s: %s appears twice" % (fn, k))
            if wm is not None and wm.get(k) != fn:
                errors.append("%s: %s but weight_map says %s" % (fn, k, wm.get(k)))
            man[k] = [DT[t.dtype], list(t.shape), hashlib.sha256(raw(t)).hexdigest()]
            if t.dim() >= 1 and t.shape[0] > 1:
                sl = f.get_slice(k)
                part = sl[1:2]
                if not torch.equal(part.view(torch.uint8) if part.dtype == torch.bool else part,
                                   t[1:2].view(torch.uint8) if t.dtype == torch.bool else t[1:2]):
                    errors.append("%s: get_slice(%s)[1:2] differs from get_tensor" % (fn, k))
    lf = load_file(p)
    for k, t in lf.items():
        if man.get(k) != [DT[t.dtype], list(t.shape), hashlib.sha256(raw(t)).hexdigest()]:
            errors.append("%s: load_file(%s) differs from safe_open" % (fn, k))
    # bf16/f16/f32 values are finite and the float view works (catches garbage)
    for k, t in lf.items():
        if t.is_floating_point() and t.numel() and not torch.isfinite(t.float()).all():
            errors.append("%s: %s has non-finite values" % (fn, k))
if wm is not None and set(wm) != set(man):
    errors.append("weight_map names %d tensors, files hold %d" % (len(wm), len(man)))
with open(out, "w") as f:
    json.dump(man, f)
for e in errors:
    print("torch2_load: " + e, file=sys.stderr)
print("torch %s: %d tensors from %d files" % (torch.__version__, len(man), len(files)))
sys.exit(1 if errors else 0)
EOF

cat >"$WORK/torch1_load.py" <<'EOF'
# host /usr/bin/python3: torch 1.13, no safetensors package; mmap + frombuffer
import hashlib, json, mmap, os, struct, sys, warnings
import torch
warnings.filterwarnings("ignore")
d, out = sys.argv[1], sys.argv[2]
DT = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
      "U8": torch.uint8, "BOOL": torch.bool}
man, errors = {}, []
for fn in sorted(f for f in os.listdir(d) if f.endswith(".safetensors")):
    p = os.path.join(d, fn)
    with open(p, "rb") as fh:
        plain = fh.read()
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    if mm[:] != plain:
        errors.append("%s: mmap contents differ from read()" % fn)
    n = struct.unpack("<Q", mm[:8])[0]
    hdr = json.loads(mm[8:8 + n])
    hdr.pop("__metadata__", None)
    for k, info in hdr.items():
        b, e = info["data_offsets"]
        dt = DT[info["dtype"]]
        count = (e - b) // torch.tensor([], dtype=dt).element_size()
        if count:
            t = torch.frombuffer(mm, dtype=dt, count=count, offset=8 + n + b).reshape(info["shape"])
        else:
            t = torch.empty(info["shape"], dtype=dt)
        rawb = t.reshape(-1).view(torch.uint8).numpy().tobytes() if count else b""
        if rawb != plain[8 + n + b:8 + n + e]:
            errors.append("%s: %s: torch bytes differ from file bytes" % (fn, k))
        man[k] = [info["dtype"], list(t.shape), hashlib.sha256(rawb).hexdigest()]
        del t
    mm.close()
with open(out, "w") as f:
    json.dump(man, f)
for e in errors:
    print("torch1_load: " + e, file=sys.stderr)
print("torch %s: %d tensors" % (torch.__version__, len(man)))
sys.exit(1 if errors else 0)
EOF

have_torch2=1
if ! torch2_root_ensure; then
    have_torch2=0
    reason=$TORCH2_SKIP_REASON
fi
have_torch1=1
"$PY" -c 'import torch' 2>/dev/null || have_torch1=0

n=0
# view_case SRCNAME OPTS(or -)
view_case() {
    local sname=$1 opts=$2 src=$WORK/src-$1 mnt t err
    n=$((n + 1))
    mnt=$WORK/mnt-$n
    err=$WORK/err-$n
    t="$sname ${opts/#-/pass-through}"
    mkdir "$mnt"
    local oargs=()
    [ "$opts" != "-" ] && oargs=(-o "$opts")
    if ! ckptfs_mount "${oargs[@]}" "$src" "$mnt" 2>"$err"; then
        tap_not_ok "$t: mount" "$(cat "$err")"
        return
    fi
    tap_ok "$t: mount"
    if [ $have_torch2 = 1 ]; then
        if torch2_run "$WORK" -- python3 "$WORK/torch2_load.py" "$mnt/hf" "$WORK/m2-$n.json" >"$WORK/o2-$n" 2>&1; then
            tap_ok "$t: torch 2.6 safe_open/get_slice/load_file over every file of hf/"
            tap_check "$t: torch 2.6 tensors equal the source (dtype, shape, bytes)" \
                "${STCHECK[@]}" compare-manifest "$src" "$WORK/m2-$n.json" --what "torch2 $t"
        else
            tap_not_ok "$t: torch 2.6 safe_open/get_slice/load_file over every file of hf/"
            tap_diag_file "$WORK/o2-$n" 20
            tap_skip "$t: torch 2.6 tensors equal the source (load failed)"
        fi
    else
        tap_skip "torch 2.6 root unavailable: $reason"
        tap_skip "torch 2.6 root unavailable: $reason"
    fi
    if [ $have_torch1 = 1 ]; then
        if "$PY" "$WORK/torch1_load.py" "$mnt/hf" "$WORK/m1-$n.json" >"$WORK/o1-$n" 2>&1; then
            tap_ok "$t: host torch 1.13 mmap + frombuffer over every file of hf/"
            tap_check "$t: host torch 1.13 tensors equal the source" \
                "${STCHECK[@]}" compare-manifest "$src" "$WORK/m1-$n.json" --what "torch1 $t"
        else
            tap_not_ok "$t: host torch 1.13 mmap + frombuffer over every file of hf/"
            tap_diag_file "$WORK/o1-$n" 20
            tap_skip "$t: host torch 1.13 tensors equal the source (load failed)"
        fi
    else
        tap_skip "host torch missing"
        tap_skip "host torch missing"
    fi
    ckptfs_umount "$mnt" && tap_ok "$t: unmount" || tap_not_ok "$t: unmount"
}

view_case llama -
view_case llama hf_shard_size=64K
view_case llama hf_shard_size=1G
view_case mixed -
view_case mixed hf_shard_size=512
view_case mixed hf_shard_size=1

# control: the comparison must notice a wrong tensor
if [ -s "$WORK/m1-1.json" ]; then
    "$PY" -c 'import json,sys; m=json.load(open(sys.argv[1])); k=sorted(m)[0]; m[k][2]="0"*64; json.dump(m,open(sys.argv[2],"w"))' \
        "$WORK/m1-1.json" "$WORK/m-bad.json"
    if "${STCHECK[@]}" compare-manifest "$WORK/src-llama" "$WORK/m-bad.json" >/dev/null 2>&1; then
        tap_not_ok "control: compare-manifest rejects a wrong hash"
    else
        tap_ok "control: compare-manifest rejects a wrong hash"
    fi
fi

tap_done
