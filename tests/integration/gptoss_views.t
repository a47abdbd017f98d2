#!/usr/bin/env bash
# GPT-OSS (GptOssForCausalLM): a tiny model built and saved by transformers 5.12.1 (the sid root,
# bf16, experts fused on disk with gate and up interleaved, window 8 on every other layer, YaRN,
# attention sinks, biases on every linear). Every rank file of TP, PP+VPP and EP layouts loads
# in torch 1.13 and 2.6, carries the args Megatron-Bridge's gpt_oss provider sets and its key
# names, holds the bridge's conversion of the tensors bit for bit, and a Megatron-core-semantics
# forward over it (gptoss_reference.py: sinks as softmax offset, alternating window, clamped
# quick-GELU GLU, YaRN; not ckptfs's code) equals transformers' logits; a Megatron view mounted
# as a source gives hf/ back bit for bit (the experts fused and interleaved again), which
# transformers loads with the same logits; a copy too wide for a piece per expert column gives
# hf/ back too (its gate_up_proj torch's interleave of the rank files'); configs Megatron cannot
# express are refused by name.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
torch2_available && have2=1 || have2=0
ref="$TESTS_TOP/tests/lib/gptoss_reference.py"
models=$WORK/models
mkdir -p "$models"

sid_python "$WORK" "$ref" build "$models" > "$WORK/built" 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves a GPT-OSS" || { tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2; done_testing; exit; }
src=$models/bf16

layouts="tp2pp1 tp1pp2vpp2 tp1pp1ep4 tp2pp2ep2"
mnt=$WORK/mnt
if mount_ckptfs "$src" "$mnt" -o "layouts=$(echo $layouts tp1pp1 | tr ' ' ':')"; then
  for l in $layouts; do
    check "$l: torch 1.13 loads every rank file; bridge args, names and bytes; Megatron forward = transformers" \
      $PY "$ref" check "$src" "$mnt/$l" "$l"
    if ((have2)) && [[ $l == *pp2* ]]; then # PP+VPP and TP+PP+EP: torch 2.6's loader on both file sets
      check "$l: torch 2.6 (weights_only) loads every rank file, same checks" \
        torch2_python "$WORK" "$ref" check "$src" "$mnt/$l" "$l" --torch2
    fi
  done
  # mcore/ (torch_dist: every layer MoE, so keys stacked [L, ...], experts [L, E, ...]) loaded
  # with torch.distributed.checkpoint equals the tp1pp1 rank file, checked as the others.
  check "tp1pp1: torch 1.13 loads it; bridge args, names and bytes; Megatron forward = transformers" \
    $PY "$ref" check "$src" "$mnt/tp1pp1" tp1pp1
  if ((have2)); then
    check "mcore/: dcp.load of every key = the tp1pp1 rank file" torch2_python "$WORK" \
      "$TESTS_TOP/tests/lib/deepseek_dcp.py" check "$mnt/mcore/release" "$mnt/tp1pp1/release/mp_rank_00/model_optim_rng.pt"
  else
    skip "mcore/ DCP load: $TORCH2_WHY"
  fi
  back=$WORK/mcore-back
  if mount_ckptfs "$mnt/mcore" "$back"; then
    check "mcore/ -> hf/: every tensor bit-identical to the source's" $PY "$ref" same "$src" "$back/hf"
  else
    ok 1 "mcore/ mounted as a source"
  fi
  "$CKPTFS" inspect "$src" > "$WORK/inspect" 2>&1
  check "inspect: gpt_oss rules, sinks, clamped GLU, the window pattern, YaRN untruncated" \
    grep -q "sinks=learnable glu_clamp=7 .*sliding_window=8 (one full-attention layer in 2) rope_type=yarn .*yarn_truncate=false" "$WORK/inspect"
else
  ok 1 "mount the GPT-OSS with its layouts"
fi

# The MXFP4 copy (blocks and scales as the release holds them): the Megatron views dequantise
# the experts per expert; checked against the bridge's conversion of transformers' own
# dequantisation (mxfp4-ref) and its logits.
mx=$WORK/mnt-mxfp4
if mount_ckptfs "$models/mxfp4" "$mx" -o layouts=tp2pp1ep2:tp1pp2vpp2; then
  for l in tp2pp1ep2 tp1pp2vpp2; do
    check "mxfp4 $l: every expert = the bridge's of transformers' dequantisation, bit for bit; forward = transformers" \
      $PY "$ref" check "$models/mxfp4-ref" "$mx/$l" "$l"
  done
  check "mxfp4: hf/ still passes the blocks and scales through" cmp "$models/mxfp4/model.safetensors" "$mx/hf/model.safetensors"
else
  ok 1 "mount the MXFP4 GPT-OSS with its layouts"
fi

# HF -> tp2pp1ep2 -> mounted as a source -> hf/: the same tensors bit for bit (the experts fused
# and interleaved again), and transformers 5 loads it with the same logits.
m1=$WORK/rt m2=$WORK/rt-back
if mount_ckptfs "$src" "$m1" -o layouts=tp2pp1ep2:tp1pp1 && mount_ckptfs "$m1/tp2pp1ep2" "$m2"; then
  check "tp2pp1ep2 -> hf/: every tensor bit-identical to the source's" $PY "$ref" same "$src" "$m2/hf"
  check "tp2pp1ep2 -> hf/: transformers 5 loads it with the source's logits" \
    sid_python "$WORK" "$ref" logits "$src" "$m2/hf"
  # A Megatron GPT-OSS read as another architecture, or args without the sinks: refused by name.
  for k in "as-mixtral:args.add_bias_linear disagrees with MixtralForCausalLM, which has none of GPT-OSS's" \
           "vanilla-softmax:args.softmax_type disagrees with GptOssForCausalLM, which has all of GPT-OSS's"; do
    $PY "$ref" bad-megatron "$m1/tp1pp1" "$WORK/meg-${k%%:*}" "${k%%:*}"
    "$CKPTFS" inspect "$WORK/meg-${k%%:*}" > "$WORK/out" 2>&1 || true
    check "Megatron ${k%%:*}: refused, saying: ${k#*:}" grep -qF -- "${k#*:}" "$WORK/out"
  done
else
  ok 1 "tp2pp1ep2 mounted as a source"
fi

# A Megatron copy whose join once took a piece per expert input column (hidden 16448, a layer
# of 32 experts, TP 2: 2.1 M, over the 2 M at which hf/ served the experts one by one) is two
# pieces per expert and shard now: hf/'s gate_up_proj and its bias are torch's own interleave of
# the rank files' fc1 gate and up, and every tensor the wide source's.
wide=$WORK/wide w1=$WORK/wide-meg w2=$WORK/wide-back
if $PY "$ref" wide "$src" "$wide" && mount_ckptfs "$wide" "$w1" -o layouts=tp2pp1 && mount_ckptfs "$w1/tp2pp1" "$w2"
then
  check "wide tp2pp1 -> hf/: gate_up_proj and its bias = torch's interleave of the rank files' fc1 gate and up" \
    $PY "$ref" interleave "$wide" "$w1/tp2pp1" tp2pp1 "$w2/hf"
  check "wide tp2pp1 -> hf/: every tensor bit-identical to the wide source's" $PY "$ref" same "$wide" "$w2/hf"
else
  ok 1 "the wide GPT-OSS's Megatron copy mounted as a source"
fi

# refused KIND MESSAGE: a GPT-OSS config Megatron cannot express leaves the Megatron views out,
# saying why.
refused() {
  local d=$WORK/bad-$1
  rm -rf "$d"
  $PY "$ref" bad "$src" "$d" "$1"
  "$CKPTFS" inspect "$d" > "$WORK/out" 2>&1 || true
  check "$1: refused, saying: $2" grep -qF -- "$2" "$WORK/out"
}
refused layer-types "layer_types entry 0 is 'full_attention': Megatron's window_attn_skip_freq 2 has sliding_attention there"
refused no-bias "attention_bias is false: GptOssForCausalLM's Megatron form (add_bias_linear)"
src=$models/mxfp4 refused mxfp4-scales "MXFP4 scales 'model.layers.1.mlp.experts.down_proj_scales' are U8 [4, 64, 2]: blocks 'model.layers.1.mlp.experts.down_proj_blocks' [4, 64, 3, 16] need U8 [4, 64, 3]"
refused experts-dim "fused expert tensor 'model.layers.0.mlp.experts.gate_up_proj' is [4, 64, 192]: it must be 3-dimensional, its first dimension the 2 experts config.json gives"
done_testing
