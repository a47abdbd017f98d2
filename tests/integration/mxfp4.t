#!/usr/bin/env bash
# MXFP4 experts (GPT-OSS's releases: mlp.experts.*_blocks uint8 [E, R, C/32, 16] and *_scales
# E8M0 [E, R, C/32]) dequantised to bf16 on read. A tiny GPT-OSS built by transformers 5 (in the
# sid root) with MXFP4 experts written the way the release is: without options hf/ passes it
# through; with -o dtype=bf16 every expert tensor of hf/ is bit for bit transformers' own
# dequantisation (convert_moe_packed_tensors, its CPU path), scales at the ends of E8M0 included,
# reads at any offset equal the whole file, transformers 5 loads hf/ with the logits it gets from
# the MXFP4 source; blocks or scales of the wrong shape, or scales missing, are refused by name.
# (The decoding itself is checked against the format definition in tests/unit/test_mxfp4.c.)
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/gpt_oss.py"
dtype_check="$TESTS_TOP/tests/lib/dtype_check.py"
m=$WORK/m

sid_python "$WORK" "$script" build "$m" > "$WORK/built" 2> "$WORK/build.err"
ok $? "transformers 5 builds a GPT-OSS; its MXFP4 copy written as the release is" ||
  { tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2; done_testing; exit; }
check "the MXFP4 copy holds gate_up_proj_blocks [E, 2F, H/32, 16] and its scales" \
  grep -q 'model.layers.0.mlp.experts.gate_up_proj_blocks \[4, 192, 2, 16\] uint8' "$WORK/built"

pass=$WORK/mnt-pass
check "the MXFP4 copy mounts as it is without -o dtype" mount_ckptfs "$m/mxfp4" "$pass"
check "  hf/ passes every file through byte-identical" diff -r "$m/mxfp4" "$pass/hf"
check "  inspect says the experts are MXFP4 in 4 tensors, dequantised with -o dtype=bf16" \
  bash -c "'$CKPTFS' inspect '$m/mxfp4' | grep -q '^found: .*MXFP4 experts in 4 tensors: hf/ serves their blocks and scales, -o dtype=bf16 them dequantised'"

bf16=$WORK/mnt-bf16
check "-o dtype=bf16 mounts it dequantised" mount_ckptfs "$m/mxfp4" "$bf16" -o dtype=bf16
sid_python "$WORK" "$script" dequant "$m/mxfp4" "$bf16/hf" > "$WORK/dequant" 2>&1
check "  every expert tensor bit-identical to transformers' convert_moe_packed_tensors; no blocks, scales or quantization_config" \
  grep -q '^PASS' "$WORK/dequant"
diag "$(tail -n 3 "$WORK/dequant")"
check "  400 random reads (odd offsets and lengths) equal the whole file" \
  $PY "$dtype_check" reads "$bf16/hf/model.safetensors" 400
copied=$WORK/mnt-copied
check "  -o mapped_reads=off mounts it too (the codes copied first, stored columns decoded in bands)" \
  mount_ckptfs "$m/mxfp4" "$copied" -o dtype=bf16,mapped_reads=off
check "  its hf/ is the same bytes as the mapped mount's (stored columns decoded where they lie)" \
  cmp "$bf16/hf/model.safetensors" "$copied/hf/model.safetensors"
check "  inspect says 4 tensors are converted on read from U8" bash -c \
  "'$CKPTFS' inspect -o dtype=bf16 '$m/mxfp4' | grep -q '^converted: *4 tensors converted on read; stored as U8 x 4'"
sid_python "$WORK" "$script" logits "$m/mxfp4" "$bf16/hf" > "$WORK/logits" 2> "$WORK/logits.err"
check "  transformers 5 loads hf/ with the logits it gets from the MXFP4 source" grep -q '^PASS' "$WORK/logits"
[[ -s $WORK/logits ]] && diag "$(cat "$WORK/logits")" || tail -n 5 "$WORK/logits.err" | sed 's/^/# /' >&2

edges=$WORK/mnt-edges
check "scales 0, 1, 254 and 255 (2^-127 .. infinity): mounts with -o dtype=bf16" \
  mount_ckptfs "$m/edges" "$edges" -o dtype=bf16
sid_python "$WORK" "$script" dequant "$m/edges" "$edges/hf" > "$WORK/edges" 2>&1
check "  bit-identical to transformers' dequantisation (2^-128 to infinity, as its ldexp makes them)" grep -q '^PASS' "$WORK/edges"
grep -q '^PASS' "$WORK/edges" || diag "$(tail -n 3 "$WORK/edges")"

# The offline baseline of bench/mxfp4_copy_bench.sh (bench/mxfp4_dequant_bf16.py, written from
# the format): transformers' dequantisation bit for bit, scales at the ends of E8M0 included, and
# its bf16 copy the same tensors as hf/ with -o dtype=bf16; the bench's generator writes an MXFP4
# GPT-OSS that mounts, and the converter in torch 2.6 (what the bench runs) agrees with it too.
bench=$TESTS_TOP/bench
same_tensors() { # VIEW COPY: every tensor of both byte-identical, none on one side only
  local out
  out=$($PY "$bench/same_tensors.py" "$1" "$2" "the converter's") || return 1
  [[ $out =~ ^([0-9]+)\ of\ ([0-9]+)\ tensors\ byte-identical && ${BASH_REMATCH[1]} == "${BASH_REMATCH[2]}" &&
    ${BASH_REMATCH[1]} -gt 0 && $out != *DIFF* ]] || { echo "$out"; return 1; }
}
sid_python "$WORK:$bench" "$bench/mxfp4_dequant_bf16.py" --against-transformers "$m/mxfp4" "$m/edges" > "$WORK/conv-tf" 2>&1
check "the bench's converter dequantises as transformers does, scales 0, 1, 254 and 255 too" grep -q '^PASS' "$WORK/conv-tf"
grep -q '^PASS' "$WORK/conv-tf" || diag "$(tail -n 3 "$WORK/conv-tf")"
sid_python "$WORK:$bench" "$bench/mxfp4_dequant_bf16.py" "$m/mxfp4" "$WORK/conv" > "$WORK/conv.out" 2>&1
check "  its bf16 copy holds hf/'s tensors byte for byte" same_tensors "$bf16/hf" "$WORK/conv"
if torch2_available; then
  PYTHONDONTWRITEBYTECODE=1 $PY "$bench/gen_deepseek_fp8.py" --model gpt-oss --layers 1 --experts 2 --vocab 64 \
    --shards 2 "$WORK/gen" > "$WORK/gen.out" 2>&1
  check "the bench's generator (--model gpt-oss) writes an MXFP4 GPT-OSS that mounts with -o dtype=bf16" \
    mount_ckptfs "$WORK/gen" "$WORK/mnt-gen" -o dtype=bf16
  torch2_python "$WORK:$bench" "$bench/mxfp4_dequant_bf16.py" "$WORK/gen" "$WORK/gen-conv" > "$WORK/gen-conv.out" 2>&1
  check "  the converter in torch 2.6 gives its hf/'s tensors byte for byte" same_tensors "$WORK/mnt-gen/hf" "$WORK/gen-conv"
else
  skip "$TORCH2_WHY"; skip "$TORCH2_WHY"
fi

# refused COPY TEXT...: -o dtype=bf16 fails naming TEXT; without it hf/ still passes it through.
refused() {
  local copy=$1 out mnt=$WORK/mnt-$1
  shift
  mkdir -p "$mnt-bad"
  out=$("$CKPTFS" mount -o dtype=bf16 "$m/$copy" "$mnt-bad" 2>&1) && { echo "mounted"; return 1; }
  for t in "$@"; do [[ $out == *"$t"* ]] || { echo "$out"; return 1; }; done
  mount_ckptfs "$m/$copy" "$mnt" && cmp "$mnt/hf/model.safetensors" "$m/$copy/model.safetensors"
}
check "blocks of 8 bytes a group: refused by name, passed through without -o dtype" \
  refused bad-blocks "'model.layers.0.mlp.experts.gate_up_proj_blocks'" "[4, 192, 2, 8]" "[E, R, C/32, 16]"
check "scales a group short: refused by name, passed through without -o dtype" \
  refused bad-scales "'model.layers.0.mlp.experts.down_proj_scales'" "[4, 64, 2]" "need U8 [4, 64, 3]"
check "blocks without their scales: refused by name, passed through without -o dtype" \
  refused no-scales "'model.layers.1.mlp.experts.down_proj_blocks' have no scales 'model.layers.1.mlp.experts.down_proj_scales'"
done_testing
