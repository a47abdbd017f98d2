#!/usr/bin/env bash
# Qwen3-Next (Qwen3NextForCausalLM: gated delta-net layers among gated attention layers, MoE with
# a gated shared expert), Qwen3.5's text model (Qwen3_5ForCausalLM: the delta-net's input
# projections split, a dense MLP) and its MoE form (Qwen3_5MoeForCausalLM: the split projections,
# Qwen3-Next's experts, saved per expert by transformers): tiny models built and saved by transformers 5.12.1 (the sid
# root), one Qwen3-Next with layer_types, one with full_attention_interval alone and a dense
# first layer. Every rank
# file of TP, PP+VPP and EP layouts loads in torch 1.13 (and 2.6), holds the keys Megatron-core
# 0.17.1's experimental attention variant spec names, in its module order, with the bytes the
# bridges make of the source (in_proj and conv1d split by TP section, the gated linear_qkv,
# out_norm as weight - 1), the args Megatron-Bridge's provider sets; a Megatron-semantics
# forward over the rank files alone (gdn_reference.py: the delta rule as a loop over tokens)
# equals transformers' logits. Layer patterns that disagree with the layer count are refused by
# name, as is spec=local (for mcore/ too). mcore/ read by torch.distributed.checkpoint (torch 2.14)
# holds Megatron-core's sharded_state_dict keys (one layer's each; in_proj and conv1d a key per
# section) with the bridges' tensors. A view mounted as a source gives back the same tensors, and
# transformers the same logits.
# The releases' MTP block (mtp.*, added to a Qwen3-Next and a Qwen3.5 copy from transformers' own
# modules) with -o mtp=on: Megatron-core's MultiTokenPredictionLayer on the last stage with the
# bridges' names and bytes, its Megatron forward equal to the block's, the same mtp.* back through
# hf/ of tp/pp and mcore/ views; without mtp=on the views are the model's alone; a missing or
# misshapen MTP tensor, or more than one MTP layer, refused by name. A Qwen3.5-MoE and a
# Qwen3-Next whose experts, the MTP layer's included, are fused on disk: the same views as per
# expert, hf/ as saved, a fused MTP tensor of the wrong expert count refused by name.
# Megatron-core's GatedDeltaNet needs flash-linear-attention (and a CUDA device at construction),
# which this machine lacks: its names, shapes and TP splits are taken from its source
# (gated_delta_net.py) and the bridges, and with MEGATRON_LM set (a Megatron-LM checkout) it is
# built on CPU with those kernels stood in (mcore_gdn_check.py) and compared with tp1pp1/ and mcore/.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
torch2_available && have2=1 || have2=0
ref="$TESTS_TOP/tests/lib/gdn_reference.py"
models=$WORK/models
mkdir -p "$models"

sid_python "$WORK" "$ref" build "$models" > "$WORK/built" 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves the Qwen3-Next models" || tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2

# check_layouts NAME LAYOUT...: torch 1.13 checks every layout; torch 2.6 the first
check_layouts() {
  local name=$1 mnt=$WORK/mnt-$1 first=1
  shift
  if ! mount_ckptfs "$models/$name" "$mnt" -o "layouts=$(echo "$@" | tr ' ' ':')" 2> "$WORK/err"; then
    ok 1 "$name: mount ($(head -c 300 "$WORK/err"))"
    return
  fi
  for l in "$@"; do
    check "$name $l: torch 1.13 loads every rank file; Megatron-core's names, order and bytes; bridge args; Megatron forward = transformers" \
      $PY "$ref" check "$models/$name" "$mnt/$l" "$l"
    if ((first && have2)); then
      check "$name $l: torch 2.6 (weights_only, mmap) loads every rank file, same checks" \
        torch2_python "$WORK" "$ref" check "$models/$name" "$mnt/$l" "$l" --torch2
    fi
    first=0
  done
  [[ $(ls "$mnt") == *mcore* ]] && cp -r "$mnt/mcore" "$WORK/mcore-$name"
  ok $? "$name: mcore/ listed and copied out"
  mcores+=("$models/$name" "$WORK/mcore-$name/release")
}
mcores=()
check_layouts q3n-a tp1pp1 tp2pp1 tp1pp2vpp2 tp2pp1ep2 tp2pp2ep2
check_layouts q3n-b tp2pp1 tp1pp3vpp2ep2 tp2pp2ep4
check_layouts q35 tp2pp1 tp1pp2vpp2
check_layouts q35moe tp2pp1ep2 tp1pp2vpp2ep4
check "mcore/ of each: torch.distributed.checkpoint loads Megatron-core's keys (a key per in_proj and conv1d section, one layer's each), the bridges' tensors bit for bit" \
  sid_python "$WORK" "$ref" mcore "${mcores[@]}"

# inspect names the layer pattern; what cannot be served is refused by name
out=$("$CKPTFS_BIN" inspect "$models/q3n-b" 2>&1)
grep -q '^layers: *LLALLA (L: gated delta-net, 2 key / 6 value heads of 8 / 4, conv 4; A: gated attention)' <<< "$out"
ok $? "inspect: the layer pattern from full_attention_interval 3 and the delta-net's sizes" || fail_diag "$out"
expect_refused() { # DESCRIPTION PATTERN COMMAND...
  local what=$1 pattern=$2 out
  shift 2
  out=$("$@" 2>&1)
  grep -q -- "$pattern" <<< "$out"
  ok $? "$what" || fail_diag "$out"
}
expect_refused "spec=local refused by name (Megatron-core builds the delta-net with TE only)" \
  "spec=local: Megatron-core builds Qwen3NextForCausalLM's gated delta-net layers with Transformer Engine only" \
  "$CKPTFS_BIN" inspect "$models/q3n-a" -o spec=local --layout tp1pp1
expect_refused "a TP degree that does not divide the delta-net's heads refused by name" \
  "tp 4 does not divide linear_num_key_heads 2" "$CKPTFS_BIN" inspect "$models/q3n-a" --layout tp4pp1
expect_refused "mcore/ with spec=local refused by name" \
  "spec=local: Megatron-core builds Qwen3NextForCausalLM's gated delta-net layers with Transformer Engine only" \
  "$CKPTFS_BIN" inspect "$models/q3n-a" -o spec=local --layout mcore
for kind in short:'"layer_types" lists 3 layers but num_hidden_layers is 4' \
  interval:'"layer_types" entry 1 (full_attention) disagrees with full_attention_interval 3' \
  kind:'"layer_types" entry 0 is not "full_attention" or "linear_attention"'; do
  name=${kind%%:*} want=${kind#*:}
  cp -r "$models/q3n-a" "$WORK/bad-$name"
  $PY "$ref" bad "$WORK/bad-$name" "$name"
  expect_refused "layer pattern '$name': Megatron views refused by name" "no Megatron views: config.json: $want" \
    "$CKPTFS_BIN" inspect "$WORK/bad-$name"
done

# HF -> Megatron view (legacy or mcore/) -> mounted as a source -> hf/: the same tensors bit for
# bit (out_norm read back plus one), and transformers 5 loads it (its config.json too) with the
# same logits
round_trip() { # NAME VIEW
  local name=$1 view=$2 m1=$WORK/rt-$1-$2 opts=(-o "layouts=$2")
  [[ $view == mcore ]] && opts=() # listed always
  if ! mount_ckptfs "$models/$name" "$m1" "${opts[@]}" || ! mount_ckptfs "$m1/$view" "$m1-back"; then
    ok 1 "$name -> $view -> hf/: mounts"
    return
  fi
  check "$name -> $view -> hf/: the same tensors, bit for bit" $PY "$ref" same "$models/$name" "$m1-back/hf"
  pairs+=("$m1-back/hf" "$models/$name")
}
pairs=()
round_trip q3n-a tp2pp1
round_trip q3n-a tp1pp2vpp2ep2
round_trip q3n-b tp2pp2ep4
round_trip q35 tp2pp2
round_trip q35moe tp2pp1ep2
round_trip q3n-b mcore
round_trip q35moe mcore
# Qwen3.5-MoE's config has no intermediate_size (Qwen3_5MoeTextConfig has none): its views above
# take moe_intermediate_size, and hf/ of a view of it adds none
no_ffn=0
for c in "$models/q35moe/config.json" "$WORK/rt-q35moe-tp2pp1ep2-back/hf/config.json"; do
  grep -q '"moe_intermediate_size"' "$c" && ! grep -q '"intermediate_size"' "$c" || no_ffn=1
done
ok $no_ffn "q35moe: neither its config.json nor hf/config.json of its tp2pp1ep2/ mounted as a source has an intermediate_size"
# Qwen3.5-MoE with its experts fused on disk (as transformers holds them): the same views, byte for byte
if mount_ckptfs "$models/q35moe-fused" "$WORK/fused" -o layouts=tp2pp1ep2 && mount_ckptfs "$models/q35moe" "$WORK/per-expert" -o layouts=tp2pp1ep2; then
  check "q35moe with fused experts: tp2pp1ep2/ and mcore/ the same bytes as per expert" \
    bash -c 'diff -r "$1/tp2pp1ep2" "$2/tp2pp1ep2" && diff -r "$1/mcore" "$2/mcore"' _ "$WORK/fused" "$WORK/per-expert"
else
  ok 1 "q35moe with fused experts: mounts"
fi
check "each hf/ of the seven: transformers loads it (its config.json too), the same logits bit for bit" \
  sid_python "$WORK" "$ref" logits "${pairs[@]}"

# The MTP block (the releases' mtp.*: fc, pre_fc_norm_embedding/hidden, a gated attention layer
# with the family's MLP, norm) with -o mtp=on: on the last stage as Megatron-core's
# MultiTokenPredictionLayer 0, the bridges' names and bytes, its Megatron forward equal to the
# block's of transformers' modules; back to the same mtp.* through hf/ of the view
mtp_views() { # NAME CHECKED_LAYOUT [LAYOUT...]: each layout and mcore/ back to hf/
  local name=$1 checked=$2 mnt=$WORK/mtp-$1
  shift
  if ! mount_ckptfs "$models/$name" "$mnt" -o "mtp=on,layouts=$(echo "$@" | tr ' ' ':')" 2> "$WORK/err"; then
    ok 1 "$name: mount with mtp=on ($(head -c 300 "$WORK/err"))"
    return
  fi
  check "$name $checked with mtp=on: the last stage's MTP layer, the bridges' names and bytes; Megatron MTP forward = transformers' modules" \
    $PY "$ref" check "$models/$name" "$mnt/$checked" "$checked" --mtp
  for view in "$@" mcore; do
    if mount_ckptfs "$mnt/$view" "$mnt-$view-back"; then
      check "$name -> $view (mtp=on) -> hf/: the same tensors, mtp.* included, bit for bit" \
        $PY "$ref" same "$models/$name" "$mnt-$view-back/hf"
    else
      ok 1 "$name -> $view (mtp=on) -> hf/: mounts"
    fi
  done
}
mtp_views q3n-a-mtp tp2pp2 tp1pp2vpp2ep2
mtp_views q35-mtp tp2pp1
mtp_views q35moe-mtp tp1pp2ep2
# Qwen3.5-MoE's and Qwen3-Next's MTP layer with its experts fused on disk as transformers holds
# them (mtp.layers.0.mlp.experts.gate_up_proj [E, 2F, H], down_proj [E, H, F]; the decoder's
# fused too: Qwen3.6's releases' form): with mtp=on the same rank files and mcore/ as the
# per-expert copy's (split by the builder, checked against the bridges above), hf/ the tensors
# as saved, and back through the view hf/ gives them per expert (the Qwen3.5 and Qwen3-Next
# releases' MTP form)
mtp_fused() { # NAME LAYOUT: NAME-fused against NAME's mtp=on mount
  local name=$1 layout=$2 fm=$WORK/mtp-$1-fused
  if ! mount_ckptfs "$models/$name-fused" "$fm" -o "mtp=on,layouts=$layout" 2> "$WORK/err"; then
    ok 1 "$name-fused: mount with mtp=on ($(head -c 300 "$WORK/err"))"
    return
  fi
  check "$name-fused with mtp=on: $layout/ and mcore/ the same bytes as per expert, MTP layer included" \
    bash -c 'diff -r "$1/$3" "$2/$3" && diff -r "$1/mcore" "$2/mcore"' _ "$fm" "$WORK/mtp-$name" "$layout"
  check "$name-fused: hf/ keeps every layer's experts fused as saved, bit for bit" \
    $PY "$ref" same "$models/$name-fused" "$fm/hf"
  if mount_ckptfs "$fm/$layout" "$fm-back"; then
    check "$name-fused -> $layout (mtp=on) -> hf/: the tensors per expert, mtp.* included, bit for bit" \
      $PY "$ref" same "$models/$name" "$fm-back/hf"
  else
    ok 1 "$name-fused -> $layout (mtp=on) -> hf/: mounts"
  fi
}
mtp_fused q35moe-mtp tp1pp2ep2
mtp_fused q3n-a-mtp tp2pp2
if mount_ckptfs "$models/q35moe-mtp-fused" "$WORK/mtp-off-fused" -o layouts=tp2pp1ep2; then
  check "q35moe-mtp-fused without mtp=on: tp2pp1ep2/ the same bytes as q35moe-fused's (the MTP layer left as saved)" \
    diff -r "$WORK/mtp-off-fused/tp2pp1ep2" "$WORK/fused/tp2pp1ep2"
else
  ok 1 "q35moe-mtp-fused without mtp=on: mounts"
fi
cp -r "$models/q35moe-mtp-fused" "$WORK/bad-mtp-experts-dim"
$PY "$ref" bad "$WORK/bad-mtp-experts-dim" mtp-experts-dim
expect_refused "fused MTP experts one short: mtp=on refused by name" \
  "fused expert tensor 'mtp.layers.0.mlp.experts.gate_up_proj' is \\[3, 64, 64\\]: it must be 3-dimensional, its first dimension the 4 experts config.json gives" \
  "$CKPTFS_BIN" inspect -o mtp=on "$WORK/bad-mtp-experts-dim"
if mount_ckptfs "$models/q35-mtp" "$WORK/mtp-off" -o layouts=tp2pp1; then
  check "q35-mtp without mtp=on: tp2pp1/ the same bytes as q35's" diff -r "$WORK/mtp-off/tp2pp1" "$WORK/mnt-q35/tp2pp1"
else
  ok 1 "q35-mtp without mtp=on: mounts"
fi
for kind in drop-mtp:"tensor 'mtp.pre_fc_norm_hidden.weight' is missing from the checkpoint" \
  fc-shape:"tensor 'mtp.fc.weight' has shape \\[64, 64\\]; config.json implies \\[64, 128\\]" \
  mtp-two:"2 multi-token prediction layers (mtp_num_hidden_layers) share one mtp.fc"; do
  name=${kind%%:*} want=${kind#*:}
  cp -r "$models/q3n-a-mtp" "$WORK/bad-$name"
  $PY "$ref" bad "$WORK/bad-$name" "$name"
  expect_refused "MTP block '$name': mtp=on refused by name" "$want" \
    "$CKPTFS_BIN" inspect -o mtp=on "$WORK/bad-$name"
done

# Optional: a Megatron-LM checkout in MEGATRON_LM (0.17.1, commit 266f1c97): real Megatron-core
# builds the Qwen3.5 model's GPTModel on CPU (flash-linear-attention and TE's fused norm+linear
# stood in, see mcore_gdn_check.py); its state_dict() keys, shapes and order equal tp1pp1/'s rank
# file (and at TP 2, two gloo ranks, tp2pp1/'s), which it loads with strict=True, and its
# sharded_state_dict() keys and shapes mcore/'s
if [[ -d ${MEGATRON_LM:-} ]]; then
  export MEGATRON_LM=$(cd "$MEGATRON_LM" && pwd)
  if mount_ckptfs "$models/q35" "$WORK/mlm-q35" -o layouts=tp1pp1:tp2pp1; then
    check "q35: Megatron-core's GPTModel (gated delta-net spec) state_dict = tp1pp1/'s rank file and, at TP 2, tp2pp1/'s, strict loads; sharded_state_dict keys = mcore/'s" \
      sid_python "$WORK:$MEGATRON_LM" "$TESTS_TOP/tests/lib/mcore_gdn_check.py" "$models/q35" \
      "$WORK/mlm-q35/tp1pp1/release/mp_rank_00/model_optim_rng.pt" "$WORK/mcore-q35/release" \
      --tp2 "$WORK/mlm-q35/tp2pp1"
  else
    ok 1 "q35: mount for Megatron-core"
  fi
else
  skip "MEGATRON_LM unset: no Megatron-LM checkout to build GPTModel from"
fi

done_testing
