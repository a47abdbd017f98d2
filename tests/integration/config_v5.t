#!/usr/bin/env bash
# config.json as transformers 5 writes it (rope_parameters, num_local_experts, dtype, head_dim
# null): the Megatron views' args carry what it says (the rotary base above all), a form with no
# Megatron equivalent is refused by name with hf/ still served, and hf/ of a Megatron copy
# writes transformers 4's spelling of the same model.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
models="$TESTS_TOP/tests/lib/models.py"
v5="$TESTS_TOP/tests/lib/config_v5.py"

# Mixtral with rope_theta 1e6 (transformers 5 writes it only in rope_parameters), Qwen3-MoE
# (num_local_experts), Llama 3 with its rope scaling.
$PY "$models" write mixtral "$WORK/mixtral"
$PY "$v5" v5 "$WORK/mixtral" --theta 1e6
$PY "$models" write qwen3_moe "$WORK/qwen3_moe"
$PY "$v5" v5 "$WORK/qwen3_moe" --theta 1e6
$PY "$models" write llama "$WORK/llama"
$PY "$v5" v5 "$WORK/llama" --theta 500000 --llama3 8,1,4,8192

for m in mixtral qwen3_moe llama; do
  mnt=$WORK/mnt-$m
  if ! mount_ckptfs "$WORK/$m" "$mnt"; then
    ok 1 "$m (transformers 5's config.json): mount"
    continue
  fi
  for l in tp1pp1 tp2pp2; do
    rank=$mnt/$l/release/mp_rank_00$([[ $l == tp2pp2 ]] && echo _000)/model_optim_rng.pt
    check "$m $l: args carry config.json's rope_parameters, eps, head width and experts" \
      $PY "$v5" args "$rank" "$WORK/$m/config.json"
  done
  theta=$($PY -c "import json, sys; print('%g' % json.load(open(sys.argv[1]))['rope_parameters']['rope_theta'])" "$WORK/$m/config.json")
  check "$m: inspect lists the rotary base it uses ($theta) with the other fields that change the math" \
    bash -c "'$CKPTFS' inspect '$WORK/$m' | grep '^math:' | grep -q ' rope_theta=$theta '"
  unmount_ckptfs "$mnt"
done

# refused NAME WANT ARGS...: a copy of the Llama with ARGS (config_v5.py v5's) has no Megatron
# views, inspect says WANT, and hf/ is still served.
refused() {
  local name=$1 want=$2
  shift 2
  $PY "$models" write llama "$WORK/$name"
  $PY "$v5" v5 "$WORK/$name" "$@"
  check "$name: no Megatron views; inspect says: $want" \
    bash -c "'$CKPTFS' inspect '$WORK/$name' | grep -F 'no Megatron views' | grep -qF \"$want\""
  check "$name: hf/ still served" bash -c "'$CKPTFS' ls '$WORK/$name' hf | grep -q '[[:space:]]config.json$'"
}
refused longrope "config.json: rope_parameters.rope_type 'longrope' has no Megatron equivalent" --rope-type longrope
refused linear "rope_parameters.rope_type 'linear' has no Megatron equivalent" --rope-type linear --set rope_parameters.factor=2.0
refused llama3-low "rope_parameters.low_freq_factor 2 has no Megatron equivalent" --llama3 8,2,4,8192
refused llama3-high "rope_parameters.high_freq_factor 2 has no Megatron equivalent" --llama3 8,1,2,8192
refused llama3-orig "rope_parameters.original_max_position_embeddings 4096 has no Megatron equivalent" --llama3 8,1,4,4096
refused disagree "rope_theta 10000 and rope_parameters.rope_theta 1e+06 disagree" --theta 1e6 --set rope_theta=10000.0
refused window "sliding_window 256" --set sliding_window=256

# Round trip: the Megatron copy of the Llama, mounted as a source: hf/config.json in
# transformers 4's spelling (which 5 reads too) of the same model.
"$CKPTFS" export "$WORK/llama" tp1pp1 "$WORK/llama-tp1pp1" > /dev/null 2>&1
ok $? "llama: tp1pp1 exported"
"$CKPTFS" cat "$WORK/llama-tp1pp1" hf/config.json > "$WORK/llama-back.json" 2> "$WORK/err"
ok $? "llama: hf/config.json of the Megatron copy ($(head -c 200 "$WORK/err"))"
check "llama: that config.json is transformers 4's spelling of the same model (rope_theta, llama3 factors)" \
  $PY "$v5" written "$WORK/llama-back.json" "$WORK/llama/config.json"
done_testing
