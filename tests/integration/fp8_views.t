#!/usr/bin/env bash
# Block-FP8 checkpoints (DeepSeek-V3's weight_scale_inv scheme) served as bf16 with -o dtype=bf16:
# every FP8 weight dequantised on read equals an independent numpy dequantisation and torch 2.6's
# own float8 path, blocks cut by the tensors' edges included; reads at any offset and length equal
# the whole file; the scale tensors and quantization_config are gone; Megatron views of it equal
# those of the same bf16 weights stored plainly; without the option the checkpoint passes through;
# broken scales and unknown quantisations are refused by name.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
fp8="$TESTS_TOP/tests/lib/fp8_check.py"
dtype_check="$TESTS_TOP/tests/lib/dtype_check.py"

$PY "$fp8" write "$WORK/fp8"
mnt=$WORK/mnt-pass
check "an FP8 checkpoint mounts as it is without -o dtype" mount_ckptfs "$WORK/fp8" "$mnt"
check "  hf/ passes every file through byte-identical" diff -r "$WORK/fp8" "$mnt/hf"
unmount_ckptfs "$mnt"

mnt=$WORK/mnt-bf16
check "-o dtype=bf16 mounts it dequantised" mount_ckptfs "$WORK/fp8" "$mnt" -o dtype=bf16
check "  every weight = bf16(code x block scale) by an independent numpy dequantisation; no _scale_inv; config without quantization_config" \
  $PY "$fp8" check "$WORK/fp8" "$mnt/hf"
if torch2_available; then
  check "  torch 2.6: every tensor equals (w.float() * s).bfloat16() with torch.float8_e4m3fn" \
    torch2_python "$WORK:$mnt" "$fp8" torch "$WORK/fp8" "$mnt/hf"
else
  skip "torch 2.6 float8 check: $TORCH2_WHY"
fi
for f in "$mnt/hf/"*.safetensors; do
  check "  $(basename "$f"): 400 random reads (odd offsets, inside block rows) equal the whole file" \
    $PY "$dtype_check" reads "$f" 400
done
check "  inspect says 14 weights are dequantised from F8_E4M3" bash -c \
  "'$CKPTFS' inspect -o dtype=bf16 '$WORK/fp8' | grep -q '^converted: *14 tensors converted on read; stored as F8_E4M3 x 14 BF16 x 7'"
cp -r "$mnt/hf" "$WORK/as-bf16"
mnt2=$WORK/mnt-as-bf16
check "the bf16 copy mounts as a plain source" mount_ckptfs "$WORK/as-bf16" "$mnt2"
for v in tp2pp1 mcore; do
  check "  $v/ of the dequantised source is byte-identical to $v/ of the copy" diff -r "$mnt/$v" "$mnt2/$v"
done
unmount_ckptfs "$mnt2"
unmount_ckptfs "$mnt"

# Blocks of 128 x 128 as the releases use: tiny tensors are one partial block each.
$PY "$fp8" write "$WORK/fp8-128" 128 128
mnt=$WORK/mnt-128
check "128x128 blocks (every tensor one partial block) dequantise too" bash -c \
  "mkdir -p '$mnt' && '$CKPTFS' mount -o dtype=bf16 '$WORK/fp8-128' '$mnt' && $PY '$fp8' check '$WORK/fp8-128' '$mnt/hf'"
unmount_ckptfs "$mnt"

refused() { # refused KIND PATTERN
  local d=$WORK/bad-$1
  cp -r "$WORK/fp8" "$d"
  $PY "$fp8" break "$d" "$1"
  "$CKPTFS" inspect -o dtype=bf16 "$d" > /dev/null 2> "$WORK/err" && { ok 1 "$1: accepted"; return; }
  check "$1: refused: $(head -c 150 "$WORK/err")" grep -q -- "$2" "$WORK/err"
}
refused scale-shape "its scales 'model.layers.0.mlp.down_proj.weight_scale_inv' are F32"
refused scale-dtype "'model.layers.0.mlp.down_proj.weight_scale_inv' are I32"
refused no-scale "FP8 tensor 'model.layers.0.mlp.down_proj.weight' has no 'model.layers.0.mlp.down_proj.weight_scale_inv'"
refused method "quant_method 'awq' is not dequantised"
refused block "weight_block_size is not two block sizes"
refused config-null "has block scales .* but config.json has no quantization_config"
refused config-list "quantization_config: not an object"
refused no-method "quantization_config: no \"quant_method\" string"
# Scales without the block size to apply them: a plain cast would leave the weights FP8 and
# round the scales to bf16.
refused no-config "FP8 tensor '.*' has block scales '.*_scale_inv' but config.json has no quantization_config"
check "  without -o dtype=bf16 it passes through, and inspect says why the Megatron views are missing" bash -c \
  "'$CKPTFS' inspect '$WORK/bad-no-config' | grep -q 'no quantization_config with their weight_block_size'"
check "  without -o dtype=bf16 an unknown quantisation passes through" "$CKPTFS" inspect "$WORK/bad-method"
done_testing
