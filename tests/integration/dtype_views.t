#!/usr/bin/env bash
# -o dtype: weights served in another element type, converted on read. An fp32 model (with the
# hard cases of rounding: ties, overflow to inf, subnormals, NaNs) served as bf16 equals torch's
# own .to(torch.bfloat16) bit for bit; a bf16 model served as fp32 equals .float(); integer
# tensors are never converted; config.json says the served type; reads at any offset and length
# (a read starting on the second byte of a bf16 value) equal the whole file; the Megatron views
# of the converted source equal those of the same weights stored in bf16.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
dtype_check="$TESTS_TOP/tests/lib/dtype_check.py"
models="$TESTS_TOP/tests/lib/models.py"

$PY "$dtype_check" write-fp32 "$WORK/fp32"
$PY "$models" write llama "$WORK/bf16" --shards 2 --tokenizer

mnt=$WORK/mnt-fp32-as-bf16
check "an fp32 model mounts with -o dtype=bf16" mount_ckptfs "$WORK/fp32" "$mnt" -o dtype=bf16
check "  hf/ lists the tokenizer, config and new safetensors files" bash -c \
  "ls '$mnt/hf' | grep -qx tokenizer.json && ls '$mnt/hf' | grep -q '^model.*safetensors$'"
check "  tokenizer.json passes through" cmp "$WORK/fp32/tokenizer.json" "$mnt/hf/tokenizer.json"
check "  hf/ holds half the bytes of the fp32 weights" $PY - "$WORK/fp32" "$mnt/hf" <<'PY'
import os, sys
size = lambda d: sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".safetensors"))
a, b = size(sys.argv[1]), size(sys.argv[2])
sys.exit(0 if 0.45 * a < b < 0.55 * a else f"{b} bytes served for {a} stored")
PY
for f in "$mnt/hf/"*.safetensors; do
  check "  $(basename "$f"): 400 random reads (odd offsets and lengths) equal the whole file" \
    $PY "$dtype_check" reads "$f" 400
done
check "  ckptfs inspect says 21 tensors are converted from F32" bash -c \
  "'$CKPTFS' inspect -o dtype=bf16 '$WORK/fp32' | grep -q '^converted: *21 tensors converted on read; stored as F32 x 21 I64 x 1'"

if torch2_available; then
  check "  torch 2.6: every tensor equals torch's .to(bfloat16) (ties, inf, NaN, subnormals); int64 untouched" \
    torch2_python "$WORK:$mnt" "$dtype_check" cast "$WORK/fp32" "$mnt/hf" bf16
else
  skip "torch 2.6 checks of the bf16 cast: $TORCH2_WHY"
fi

# Megatron views of the converted source = those of the same weights stored as bf16.
cp -r "$mnt/hf" "$WORK/as-bf16"
mnt2=$WORK/mnt-as-bf16
check "the bf16 copy of hf/ mounts as a plain source" mount_ckptfs "$WORK/as-bf16" "$mnt2"
for v in tp2pp1 tp1pp2 mcore; do
  check "  $v/ of the converted source is byte-identical to $v/ of the bf16 copy" diff -r "$mnt/$v" "$mnt2/$v"
done
unmount_ckptfs "$mnt2"
unmount_ckptfs "$mnt"

mnt=$WORK/mnt-bf16-as-fp32
check "a bf16 model mounts with -o dtype=fp32" mount_ckptfs "$WORK/bf16" "$mnt" -o dtype=fp32
check "  config.json says float32" $PY -c \
  "import json,sys; sys.exit(json.load(open('$mnt/hf/config.json'))['torch_dtype'] != 'float32')"
check "  tp2pp1/ rank files say params_dtype float32" $PY -c "
import torch, sys
sd = torch.load('$mnt/tp2pp1/release/mp_rank_01/model_optim_rng.pt', map_location='cpu')
t = sd['model']['decoder.layers.0.self_attention.linear_qkv.weight']
sys.exit(not (t.dtype == torch.float32 and sd['args'].params_dtype == torch.float32))"
if torch2_available; then
  check "  torch 2.6: every tensor equals torch's .float()" \
    torch2_python "$WORK:$mnt" "$dtype_check" cast "$WORK/bf16" "$mnt/hf" fp32
else
  skip "torch 2.6 checks of the fp32 cast: $TORCH2_WHY"
fi
unmount_ckptfs "$mnt"

for opt in dtype=auto dtype=bf16; do
  mnt=$WORK/mnt-bf16-$opt
  check "-o $opt: a bf16 model is served as stored" mount_ckptfs "$WORK/bf16" "$mnt" -o $opt
  check "  every hf/ file passes through byte-identical" diff -r "$WORK/bf16" "$mnt/hf"
  unmount_ckptfs "$mnt"
done
mnt=$WORK/mnt-fp32-auto
check "without -o dtype an fp32 Hugging Face model is served as stored" mount_ckptfs "$WORK/fp32" "$mnt"
check "  every hf/ file passes through byte-identical" diff -r "$WORK/fp32" "$mnt/hf"
unmount_ckptfs "$mnt"
"$CKPTFS" inspect -o dtype=fp16 "$WORK/bf16" 2>"$WORK/err" && rc=0 || rc=1
ok $((1 - rc)) "an unknown dtype is refused"
check "  the message lists the choices" grep -q "auto|bf16|fp32" "$WORK/err"
done_testing
