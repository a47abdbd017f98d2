#!/usr/bin/env bash
# DeepSeek-V3 and V2(-Lite) checkpoints (multi-head latent attention, dense-first layers, shared
# experts, sigmoid routing with an expert bias and expert groups, a multi-token prediction
# layer), bf16 and block-FP8: every rank file of several layouts equals an independent
# expectation (deepseek_reference.py, from Megatron-LM's own modules), loads in torch 1.13 and
# 2.6, and a Megatron-semantics forward over it equals the Hugging Face forward; the bf16 hf/ of
# an FP8 release equals an independent dequantisation; broken inputs are refused with why.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
torch2_available && have2=1 || have2=0
ref="$TESTS_TOP/tests/lib/deepseek_reference.py"

check "the DeepSeek reference agrees with itself and catches wrong splits and routing (selftest)" \
  $PY "$ref" selftest

$PY "$ref" write "$WORK/v3" --variant v3
$PY "$ref" write "$WORK/v3-fp8" --variant v3 --fp8 --shards 3
$PY "$ref" write "$WORK/v2lite" --variant v2lite --shards 2
# Kimi-K2's config (kimi_k2 model type on DeepSeek-V3's architecture, one expert group, YaRN with
# beta_fast 1), block-FP8 as released.
$PY "$ref" write "$WORK/kimi-fp8" --variant kimi --fp8 --shards 2

# check_layouts SRC "OPTIONS" "REFERENCE ARGS" LAYOUT...: each layout's rank files, torch 1.13
# and 2.6 (weights_only), tensor by tensor = the reference, forward = HF.
check_layouts() {
  local src=$1 opts=$2 rargs=$3 mnt
  shift 3
  mnt=$WORK/mnt-$src-$(echo "$opts" | tr ',=' '__')
  local layouts
  layouts=$(echo "$@" | tr ' ' ':')
  if ! mount_ckptfs "$WORK/$src" "$mnt" -o "layouts=$layouts${opts:+,$opts}"; then
    ok 1 "$src -o $opts: mount"
    return
  fi
  for l in "$@"; do
    # shellcheck disable=SC2086
    check "$src $l ${opts:-default}: torch 1.13 loads, tensors = reference, MLA+MoE forward = HF" \
      $PY "$ref" check "$WORK/$src" "$mnt/$l" "$l" $rargs
    if ((have2)); then
      # shellcheck disable=SC2086
      check "$src $l ${opts:-default}: torch 2.6 weights_only loads, same checks" \
        torch2_python "$WORK" "$ref" check "$WORK/$src" "$mnt/$l" "$l" $rargs --torch2
    fi
  done
}
check_layouts v3 "" "" tp1pp1 tp2pp1ep4 tp1pp2ep2 tp4pp1ep8etp1 tp1pp2vpp2ep2
check_layouts v3 "spec=local" "--spec local" tp2pp1ep2 tp4pp1ep2etp1
check_layouts v3 "mtp=on" "--mtp" tp2pp2ep4 tp1pp1ep2
check_layouts v3 "mtp=on,spec=local" "--mtp --spec local" tp2pp1ep2
check_layouts v3 "moe_grouped_gemm=on" "--grouped" tp2pp1ep4
check_layouts v2lite "" "" tp1pp1ep2 tp2pp2ep2 tp4pp1ep4etp1
check_layouts v2lite "spec=local" "--spec local" tp2pp1ep2
# An FP8 release mounted as it is: hf/ passes FP8 through, the Megatron views are bf16.
check_layouts v3-fp8 "" "" tp2pp1ep4 tp1pp2ep2
check_layouts v3-fp8 "mtp=on" "--mtp" tp2pp2ep2
check_layouts kimi-fp8 "" "" tp2pp1ep4 tp1pp2vpp2ep8 tp2pp2ep2etp1
check_layouts kimi-fp8 "spec=local" "--spec local" tp2pp1ep2

# mcore/ (torch_dist, per-layer keys, experts stacked, MTP as mtp.layers.0.transformer_layer)
# loaded with torch.distributed.checkpoint equals the checked tp1pp1 rank file.
for opts in "" "mtp=on" "mtp=on,spec=local"; do
  mnt=$WORK/mnt-mcore-$(echo "$opts" | tr ',=' '__')
  if ! mount_ckptfs "$WORK/v3" "$mnt" -o "layouts=tp1pp1${opts:+,$opts}"; then
    ok 1 "v3 mcore/ ${opts:-default}: mount"
    continue
  fi
  if ((have2)); then
    check "v3 mcore/ ${opts:-default}: dcp.load of every key = the tp1pp1 rank file (MTP, experts, padding)"       torch2_python "$WORK" "$TESTS_TOP/tests/lib/deepseek_dcp.py" check "$mnt/mcore/release"       "$mnt/tp1pp1/release/mp_rank_00/model_optim_rng.pt"
  else
    skip "v3 mcore/ DCP load: $TORCH2_WHY"
  fi
done

# Every tensor of the release is in some Megatron view (with mtp=on the MTP layer's embedding and
# head copies are the model's own): no warning of tensors left out, with or without mtp=on.
for opts in "" "mtp=on"; do
  "$CKPTFS" inspect ${opts:+-o "$opts"} "$WORK/v3" > "$WORK/out" 2>&1
  check "v3 ${opts:-default}: inspect warns of no tensor left out of the Megatron views" \
    bash -c "grep -q '^megatron:' '$WORK/out' && ! grep -q 'in no Megatron view' '$WORK/out'"
done

# Round trips through the Megatron sources: a view mounted as a source gives back the Hugging
# Face tensors bit for bit (the fp32 expert bias included; the MTP layer when it was served).
same_hf() { # ORIGINAL VIEW_HF [--no-mtp]
  $PY - "$@" <<'PYEOF'
import json, os, sys
sys.path.insert(0, os.path.join(os.environ["TESTS_TOP"], "tests/lib"))
import models
a, b = models.read_checkpoint(sys.argv[1]), models.read_checkpoint(sys.argv[2])
if "--no-mtp" in sys.argv:
    L = json.load(open(os.path.join(sys.argv[1], "config.json")))["num_hidden_layers"]
    a = {k: v for k, v in a.items() if not k.startswith(f"model.layers.{L}.")}
assert set(a) == set(b), (sorted(set(a) - set(b))[:3], sorted(set(b) - set(a))[:3])
bad = [k for k in a if a[k] != b[k]]
assert not bad, bad[:3]
print(f"# {len(a)} tensors equal")
PYEOF
}
export TESTS_TOP
round_trip() { # SRC OPTS VIEW [--no-mtp]
  local src=$1 opts=$2 view=$3 flag=${4:-} m1 m2
  m1=$WORK/rt1-$src-$view-$(echo "$opts" | tr ',=' '__')
  m2=$m1-back
  if ! mount_ckptfs "$WORK/$src" "$m1" ${opts:+-o "$opts"} || ! mount_ckptfs "$m1/$view" "$m2"; then
    ok 1 "$src -> $view ${opts:-default} -> hf/: mounts"
    return
  fi
  check "$src -> $view ${opts:-default} -> hf/: the same tensors, bit for bit" same_hf "$WORK/$src" "$m2/hf" $flag
}
round_trip v3 "mtp=on" tp2pp2ep4
round_trip v3 "mtp=on,spec=local" tp2pp1ep2
round_trip v3 "" tp1pp2ep2 --no-mtp
round_trip v3 "mtp=on" mcore
round_trip v3 "mtp=on,spec=local" mcore
round_trip v2lite "" tp2pp2ep2
round_trip v2lite "spec=local" mcore

# The bf16 hf/ of the FP8 release.
mnt=$WORK/mnt-fp8-bf16
if mount_ckptfs "$WORK/v3-fp8" "$mnt" -o dtype=bf16,layouts=tp2pp1ep4; then
  check "v3-fp8 -o dtype=bf16: hf/ = independent dequantisation, no scales, config without quantization_config" \
    $PY "$ref" check-hf "$WORK/v3-fp8" "$mnt/hf"
  check "v3-fp8 -o dtype=bf16: tp2pp1ep4 from the bf16 view = reference" \
    $PY "$ref" check "$WORK/v3-fp8" "$mnt/tp2pp1ep4" tp2pp1ep4
  if ((have2)); then
    check "v3-fp8 -o dtype=bf16: torch 2.6's own float8 path and the safetensors library agree" \
      torch2_python "$WORK" "$TESTS_TOP/tests/lib/fp8_check.py" torch "$WORK/v3-fp8" "$mnt/hf"
  else
    skip "torch 2.6 float8 check: $TORCH2_WHY"
  fi
else
  ok 1 "v3-fp8 -o dtype=bf16: mount"
fi
mnt=$WORK/mnt-kimi-bf16
if mount_ckptfs "$WORK/kimi-fp8" "$mnt" -o dtype=bf16; then
  check "kimi-fp8 -o dtype=bf16: hf/ = independent dequantisation" $PY "$ref" check-hf "$WORK/kimi-fp8" "$mnt/hf"
  m2=$WORK/mnt-kimi-back
  if mount_ckptfs "$mnt/tp2pp1ep2" "$m2"; then
    check "kimi-fp8 bf16 -> tp2pp1ep2 -> hf/: the bf16 view's tensors, bit for bit" same_hf "$mnt/hf" "$m2/hf"
  else
    ok 1 "kimi-fp8: tp2pp1ep2 mounts as a source"
  fi
else
  ok 1 "kimi-fp8 -o dtype=bf16: mount"
fi
mnt=$WORK/mnt-fp8-raw
if mount_ckptfs "$WORK/v3-fp8" "$mnt"; then
  check "v3-fp8 as it is: hf/ files are the source's, byte for byte" \
    cmp "$WORK/v3-fp8/model-00002-of-00003.safetensors" "$mnt/hf/model-00002-of-00003.safetensors"
else
  ok 1 "v3-fp8: mount"
fi

# inspect says what the model is and what the views leave out.
"$CKPTFS" inspect "$WORK/v3" > "$WORK/inspect" 2>&1
check "inspect: multi-head latent attention sizes" grep -q "q_lora_rank 96, kv_lora_rank 64" "$WORK/inspect"
check "inspect: sigmoid routing with expert bias and groups" \
  grep -q "sigmoid scores + expert bias for the choice, top-2 of the best 1 of 2 groups, weights x 2.5" "$WORK/inspect"
check "inspect: the MTP layer is left out unless -o mtp=on" grep -q "left out of the Megatron views; -o mtp=on" "$WORK/inspect"
"$CKPTFS" inspect --json "$WORK/v2lite" > "$WORK/inspect.json" 2>&1
check "inspect --json: V2-Lite has no compressed query, softmax scores" \
  $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["mla"]["q_lora_rank"] == 0 and d["experts"]["score"] == "softmax" and not d["experts"]["expert_bias"], d' "$WORK/inspect.json"
"$CKPTFS" inspect -o mtp=on "$WORK/v2lite" > /dev/null 2> "$WORK/err" && rc=0 || rc=1
ok $((1 - rc)) "-o mtp=on on a model without MTP layers is refused"
check "and says why" grep -q "no multi-token prediction layers" "$WORK/err"

# refused SRC KIND "OPTIONS" "MESSAGE": a damaged copy's Megatron views (or with -o dtype=bf16
# the whole mount) are refused, saying MESSAGE.
refused() {
  local src=$1 kind=$2 opts=$3 msg=$4 d=$WORK/bad-$2
  rm -rf "$d"
  cp -r "$WORK/$src" "$d"
  $PY "$ref" bad "$d" "$kind"
  "$CKPTFS" inspect ${opts:+-o "$opts"} "$d" > "$WORK/out" 2>&1 || true
  check "$kind${opts:+ ($opts)}: refused, saying: $msg" grep -qF -- "$msg" "$WORK/out"
}
refused v3-fp8 scale-shape "dtype=bf16" "need F32 ["
refused v3-fp8 scale-shape "" "no Megatron views"
refused v3-fp8 scale-dtype "dtype=bf16" "are BF16 ["
refused v3-fp8 no-scale "dtype=bf16" "_scale_inv'"
refused v3-fp8 method "dtype=bf16" "quant_method 'awq' is not dequantised"
refused v3-fp8 block "dtype=bf16" "weight_block_size is not two block sizes"
refused v3 bias-shape "" "e_score_correction_bias' has shape [9]"
refused v3 no-kv-norm "" "kv_a_layernorm.weight' is missing"
refused v3 group "" "does not divide the 8 routed experts into groups"
refused v3 topk-method "" "topk_method \"group_limited_greedy\" is not supported"

done_testing
