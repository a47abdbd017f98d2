#!/usr/bin/env bash
# MiMo (MiMoForCausalLM): a tiny model built by transformers 5.12.1 (the sid root) as Qwen2 plus
# two MTP layers built as MiMo's published modeling code builds them, under model.mtp_layers.N.
# With -o mtp=on every rank file of TP and PP layouts loads in torch 1.13 (and 2.6), holds the
# MTP layers under mbridge's names with exactly the source's bytes (eh_proj = input_proj with its
# column halves exchanged) on the last stage, and Megatron's MTP forward over them equals MiMo's
# (mimo_reference.py, not ckptfs's code). HF -> a Megatron view -> mounted as a source -> hf/
# gives the same tensors bit for bit, and transformers' Qwen2 logits exactly. A missing MTP
# tensor or one of the wrong shape is refused by name.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
torch2_available && have2=1 || have2=0
ref="$TESTS_TOP/tests/lib/mimo_reference.py"
models=$WORK/models
mkdir -p "$models"
src=$models/mimo

sid_python "$WORK" "$ref" build "$models" > "$WORK/built" 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves the MiMo model" || tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2

layouts="tp1pp1 tp2pp1 tp1pp2 tp2pp2"
mnt=$WORK/mnt
if mount_ckptfs "$src" "$mnt" -o "mtp=on,layouts=${layouts// /:}" 2> "$WORK/err"; then
  for l in $layouts; do
    check "$l: torch 1.13 loads every rank file; MTP entries = the source's bytes (halves exchanged); Megatron MTP = MiMo MTP" \
      $PY "$ref" check "$src" "$mnt/$l" "$l"
    if ((have2)); then
      check "$l: torch 2.6 (weights_only) loads every rank file, same checks" \
        torch2_python "$WORK" "$ref" check "$src" "$mnt/$l" "$l" --torch2
    fi
  done
else
  ok 1 "mount with mtp=on ($(head -c 300 "$WORK/err"))"
fi

# HF -> VIEW -> mounted as a source -> hf/: every tensor bit for bit, the main model's logits.
round_trip() { # VIEW
  local view=$1 m1=$WORK/rt-$1 m2=$WORK/rt-$1-back with="mtp=on"
  [[ $view == mcore ]] || with="layouts=$view,mtp=on"
  if ! mount_ckptfs "$src" "$m1" -o "$with" || ! mount_ckptfs "$m1/$view" "$m2"; then
    ok 1 "HF -> $view -> hf/: mounts"
    return
  fi
  check "HF -> $view -> hf/: the same tensors (MTP layers included), bit for bit" $PY "$ref" same "$src" "$m2/hf"
  check "HF -> $view -> hf/: transformers' Qwen2 logits of the main model, exactly" \
    sid_python "$WORK" "$ref" logits "$src" "$m2/hf"
}
round_trip tp2pp1
round_trip tp1pp2
round_trip mcore

# Megatron's local spec: the MTP layer's norms under their module names.
if mount_ckptfs "$src" "$WORK/mnt-local" -o "mtp=on,spec=local,layouts=tp2pp2"; then
  check "spec=local tp2pp2: local names, the same bytes and forward" $PY "$ref" check "$src" "$WORK/mnt-local/tp2pp2" tp2pp2 --local
else
  ok 1 "spec=local: mount"
fi

# The released MiMo-7B's config.json spelling (transformers 4.40) serves the same rank files.
rel=$WORK/released
cp -r "$src" "$rel"
$PY "$ref" bad "$rel" released-config
if mount_ckptfs "$rel" "$WORK/mnt-rel" -o "mtp=on,layouts=tp2pp2"; then
  check "released config.json spelling: tp2pp2 checks as above" $PY "$ref" check "$rel" "$WORK/mnt-rel/tp2pp2" tp2pp2
else
  ok 1 "released config.json spelling: mount"
fi

"$CKPTFS" inspect "$src" > "$WORK/inspect" 2>&1
check "inspect: mimo rules with q/k/v biases" grep -q "mimo rules: .*qkv bias" "$WORK/inspect"
check "inspect: the MTP layers under model.mtp_layers, left out unless -o mtp=on" \
  grep -q "2 multi-token prediction layers (model.mtp_layers.0...): left out of the Megatron views; -o mtp=on" "$WORK/inspect"

# refused KIND MESSAGE: a broken MTP layer keeps -o mtp=on from serving it, naming the tensor.
refused() {
  local d=$WORK/bad-$1
  rm -rf "$d"
  cp -r "$src" "$d"
  $PY "$ref" bad "$d" "$1"
  "$CKPTFS" inspect -o mtp=on "$d" > "$WORK/out" 2>&1 || true
  check "$1: refused, saying: $2" grep -qF -- "$2" "$WORK/out"
}
refused drop-mtp "tensor 'model.mtp_layers.1.hidden_layernorm.weight' is missing from the checkpoint"
refused input-proj-shape "tensor 'model.mtp_layers.0.input_proj.weight' has shape [64, 64]; config.json implies [64, 128]"
done_testing
