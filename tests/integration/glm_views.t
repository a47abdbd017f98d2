#!/usr/bin/env bash
# GLM-4.5/4.6 (Glm4MoeForCausalLM): tiny models built and saved by transformers 5.12.1 (the sid
# root) with and without attention biases and q/k norms, partial rotary (0.5 and 0.25),
# dense-first layers, expert groups, an MTP layer. Every rank file of TP, PP+VPP and EP layouts
# loads in torch 1.13 and 2.6, carries the args Megatron-Bridge's and mbridge's GLM bridges set
# and their key names, and a Megatron-core-semantics forward over it (glm_reference.py, not
# ckptfs's code) equals transformers' logits; a Megatron view mounted as a source gives back the
# same tensors and, loaded by transformers, the same logits; what Megatron cannot route the
# same way is refused by name.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
torch2_available && have2=1 || have2=0
ref="$TESTS_TOP/tests/lib/glm_reference.py"
models=$WORK/models
mkdir -p "$models"

sid_python "$WORK" "$ref" build "$models" > "$WORK/built" 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves the GLM-4.5 models" || tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2

# check_layouts NAME "OPTIONS" "CHECK ARGS" LAYOUT...
check_layouts() {
  local name=$1 opts=$2 cargs=$3 mnt
  shift 3
  mnt=$WORK/mnt-$name-$(echo "$opts" | tr ',=' '__')
  if ! mount_ckptfs "$models/$name" "$mnt" -o "layouts=$(echo "$@" | tr ' ' ':')${opts:+,$opts}" 2> "$WORK/err"; then
    ok 1 "$name ${opts:-default}: mount ($(head -c 300 "$WORK/err"))"
    return
  fi
  for l in "$@"; do
    # shellcheck disable=SC2086
    check "$name $l ${opts:-default}: torch 1.13 loads every rank file; bridge args and names; Megatron forward = transformers" \
      $PY "$ref" check "$models/$name" "$mnt/$l" "$l" $cargs
    if ((have2)); then
      # shellcheck disable=SC2086
      check "$name $l ${opts:-default}: torch 2.6 (weights_only) loads every rank file, same checks" \
        torch2_python "$WORK" "$ref" check "$models/$name" "$mnt/$l" "$l" $cargs --torch2
    fi
  done
}
check_layouts glm-a "" "" tp1pp1 tp2pp1 tp1pp2vpp2ep2 tp2pp2ep4 tp2pp1ep4etp1
check_layouts glm-b "" "" tp2pp1 tp1pp2vpp2ep2 tp2pp2ep2
check_layouts glm-mtp "mtp=on" "--mtp" tp1pp1 tp2pp1ep2 tp1pp2ep2
check_layouts glm-mtp "" "" tp2pp1ep2

# mcore/ (torch_dist: per-layer keys, experts stacked, MTP as mtp.layers.0.transformer_layer)
# loaded with torch.distributed.checkpoint equals the checked tp1pp1 rank file.
for v in "glm-a:" "glm-mtp:mtp=on"; do
  name=${v%%:*} opts=${v#*:} mnt=$WORK/mnt-dcp-${v//[:=]/_}
  if ! mount_ckptfs "$models/$name" "$mnt" -o "layouts=tp1pp1${opts:+,$opts}"; then
    ok 1 "$name mcore/ ${opts:-default}: mount"
  elif ((have2)); then
    check "$name mcore/ ${opts:-default}: dcp.load of every key = the tp1pp1 rank file" \
      torch2_python "$WORK" "$TESTS_TOP/tests/lib/deepseek_dcp.py" check "$mnt/mcore/release" \
      "$mnt/tp1pp1/release/mp_rank_00/model_optim_rng.pt"
  else
    skip "$name mcore/ DCP load: $TORCH2_WHY"
  fi
done

# HF -> Megatron view -> mounted as a source -> hf/: the same tensors bit for bit, and loaded by
# transformers 5 the same logits (tf5_roundtrip.py's check: also the args its import sets).
export TESTS_TOP
triples=()
round_trip() { # NAME OPTS VIEW
  local name=$1 opts=$2 view=$3 m1 m2
  m1=$WORK/rt-$name-$view-$(echo "$opts" | tr ',=' '__')
  m2=$m1-back
  local with=$opts
  [[ $view == mcore ]] || with="layouts=$view${opts:+,$opts}"
  if ! mount_ckptfs "$models/$name" "$m1" ${with:+-o "$with"} || ! mount_ckptfs "$m1/$view" "$m2"; then
    ok 1 "$name -> $view ${opts:-default} -> hf/: mounts"
    return
  fi
  check "$name -> $view ${opts:-default} -> hf/: the same tensors, bit for bit" $PY "$ref" same "$models/$name" "$m2/hf"
  [[ $view == mcore ]] || triples+=("$models/$name" "$m1/$view/release/mp_rank_00$([[ $view == *pp2* ]] && echo _000)$([[ $view == *ep* ]] && echo _000)/model_optim_rng.pt" "$m2/hf")
}
round_trip glm-a-bf16 "" tp2pp2ep2
round_trip glm-b-bf16 "" tp1pp2vpp2ep2
round_trip glm-a "" tp2pp1ep4etp1
round_trip glm-mtp-bf16 "mtp=on" tp2pp1ep2
round_trip glm-mtp "mtp=on" mcore
round_trip glm-b "" mcore
sid_python "$WORK" "$TESTS_TOP/tests/lib/tf5_roundtrip.py" check "${triples[@]}" > "$WORK/checked" 2> "$WORK/check.err"
ok $? "transformers 5 ran the logit checks" || tail -n 20 "$WORK/check.err" | sed 's/^/# /' >&2
passes "$WORK/checked"
ok $(($(grep -c '^PASS' "$WORK/checked") == ${#triples[@]} / 3 * 3 ? 0 : 1)) "args, logits and token ids passed for each of the $((${#triples[@]} / 3)) copies"

# inspect: the layer pattern, routing, partial rotary and the MTP layer.
"$CKPTFS" inspect "$models/glm-mtp" > "$WORK/inspect" 2>&1
check "inspect: glm4_moe rules with biases and q/k norms" grep -q "glm4_moe rules: .*qkv bias, q/k norm" "$WORK/inspect"
check "inspect: partial rotary 0.5" grep -q "rotary_percent=0.5" "$WORK/inspect"
check "inspect: sigmoid routing, bias, groups, scaling" \
  grep -q "sigmoid scores + expert bias for the choice, top-2 of the best 1 of 2 groups, weights x 2.5" "$WORK/inspect"
check "inspect: the MTP layer left out unless -o mtp=on" grep -q "left out of the Megatron views; -o mtp=on" "$WORK/inspect"

# refused NAME KIND MESSAGE: a GLM config Megatron would route otherwise leaves the Megatron views out, saying why.
refused() {
  local d=$WORK/bad-$2
  rm -rf "$d"
  cp -r "$models/$1" "$d"
  $PY "$ref" bad "$d" "$2"
  "$CKPTFS" inspect "$d" > "$WORK/out" 2>&1 || true
  check "$2: refused, saying: $3" grep -qF -- "$3" "$WORK/out"
}
refused glm-a no-norm "norm_topk_prob is false: Megatron always normalises the top-k of sigmoid scores"
refused glm-a groups "num_experts_per_tok 3 is not 2 x topk_group 1"
# A Megatron GLM checkpoint read as an architecture that rotates whole heads: glm-b (rotary_percent
# 0.25, no biases: glm-a's q/k/v biases would be refused first, Qwen3-MoE having none).
mnt=$WORK/mnt-arch
if mount_ckptfs "$models/glm-b" "$mnt" -o layouts=tp2pp1; then
  "$CKPTFS" inspect -o hf_arch=Qwen3MoeForCausalLM "$mnt/tp2pp1" > "$WORK/out" 2>&1 || true
  check "partial rotary read as Qwen3-MoE: refused by name" grep -qF "rotary_percent 0.25: Qwen3MoeForCausalLM rotates the whole head" "$WORK/out"
else
  ok 1 "glm-b: mount for the hf_arch refusal"
fi
done_testing
