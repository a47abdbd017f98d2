#!/usr/bin/env bash
# Mixture-of-experts torch_dist checkpoints as a source. Megatron's own (Mixtral, tp1pp2ep2:
# experts stacked [L, E, 2F, H], the local spec's pre-MLP norm name) mounts with hf/
# bit-identical to the model it came from, and its tp2pp1ep2 view equals the rank files Megatron
# wrote; checkpoints written here with torch 2.6's DCP classes (moe_dist_source.py, read back
# by dcp.load) cover what Megatron's files here do not: per-layer keys of a Qwen2-MoE whose
# layer 1 is dense (moe_layer_freq [1,0,1,1]), TE's pre_mlp_layernorm name, chunks spanning
# several layers and experts and the gate/up boundary, the shared expert; broken checkpoints
# fail with one line naming the file and the problem.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
check_hf="$TESTS_TOP/tests/lib/check_hf.py"
models="$TESTS_TOP/tests/lib/models.py"
writer="$TESTS_TOP/tests/lib/moe_dist_source.py"       # torch 2.6
bad="$TESTS_TOP/tests/lib/bad_moe_torch_dist.py"       # torch 2.6
compare="$TESTS_TOP/tests/lib/compare_megatron.py"     # torch 2.6
same_views="$TESTS_TOP/tests/lib/same_views.py"
torch2_available && have2=1 || have2=0
[[ $have2 -eq 1 ]] || diag "torch 2.6 checks skipped: $TORCH2_WHY"

real=$TESTDATA/megatron-core-0.17.1

# bad_cases GOOD_ITER_DIR OUT [--per-layer]: each broken copy fails to mount with one line
# holding its `expect`, and leaves no mount.
bad_cases() {
  local good=$1 out=$2 cases c m expect rc
  shift 2
  mkdir -p "$out"
  cases=$(torch2_python "$WORK:$(dirname "$good")" "$bad" "$good" "$out" "$@") || { ok 1 "bad_moe_torch_dist.py $*"; return; }
  for c in $cases; do
    expect=$(cat "$out/$c/expect")
    m=$WORK/mnt-bad-$c
    mkdir -p "$m"
    "$CKPTFS" mount "$out/$c" "$m" 2> "$WORK/err" && rc=0 || rc=$?
    [[ $rc -ne 0 && $(wc -l < "$WORK/err") -eq 1 ]] && grep -qF -- "$out/$c/" "$WORK/err" &&
      grep -qF -- "$expect" "$WORK/err" && ! grep -q " $m " /proc/mounts
    ok $? "$c: mount fails with one line naming the file and '$expect' ($(head -c 200 "$WORK/err"))"
  done
}

# --- (a) Megatron's own: mixtral tp1pp2ep2 torch_dist ---
td=$real/mixtral-tp1pp2ep2-torch_dist
mnt=$WORK/mnt-mixtral
check "mount Megatron's own mixtral tp1pp2ep2 torch_dist (spec=local)" mount_ckptfs "$td" "$mnt" -o spec=local
check "its hf/ tensors are bit-identical to hf-mixtral" $PY "$check_hf" compare "$real/hf-mixtral" "$mnt/hf"
check "its hf/config.json is Mixtral's with the experts (4 local, top-2, ffn 32)" $PY -c "
import json, sys
c = json.load(open(sys.argv[1]))
want = dict(architectures=['MixtralForCausalLM'], model_type='mixtral', num_local_experts=4,
            num_experts_per_tok=2, intermediate_size=32, num_hidden_layers=4, hidden_size=64)
bad = {k: c.get(k) for k, v in want.items() if c.get(k) != v}
sys.exit(f'differs: {bad}' if bad else 0)" "$mnt/hf/config.json"
check "inspect: saved as tp1pp2ep2, stacked keys, expert _extra_state objects left unread" bash -c \
  "'$CKPTFS' inspect '$td' > '$WORK/insp' && grep -q 'megatron-torch_dist.*saved as tp1pp2ep2' '$WORK/insp' &&
   grep -q '10 model keys in 71 chunks over 4 .distcp files; 40 _extra_state objects' '$WORK/insp'"
if [[ $have2 -eq 1 ]]; then
  check "its tp2pp1ep2/ equals Megatron's own mixtral-tp2pp1ep2-torch rank files, key order included" \
    torch2_python "$WORK:$real" "$compare" "$real/mixtral-tp2pp1ep2-torch/iter_0000010" "$mnt/tp2pp1ep2/release"
  # Qwen2-MoE (shared expert with its gate) stacked, the local spec's names, from the HF
  # model Megatron's qwen2_moe files were made of: its legacy view equals those files.
  out=$WORK/dist-qwen2_moe-real
  check "hf-qwen2_moe: a stacked torch_dist of it (local spec names, irregular chunks) is written" \
    torch2_python "$WORK:$real" "$writer" "$real/hf-qwen2_moe" "$out" --stacked --spec local
  m=$WORK/mnt-qwen2_moe-real
  check "it mounts (spec=local)" mount_ckptfs "$out" "$m" -o spec=local
  check "its hf/ tensors are bit-identical to hf-qwen2_moe" $PY "$check_hf" compare "$real/hf-qwen2_moe" "$m/hf"
  check "its tp1pp1ep2/ equals Megatron's own qwen2_moe-tp1pp1ep2-torch-noopt rank files" \
    torch2_python "$WORK:$real" "$compare" "$real/qwen2_moe-tp1pp1ep2-torch-noopt/iter_0000010" "$m/tp1pp1ep2/release"
  # --- (c) broken MoE checkpoints made from Megatron's own ---
  bad_cases "$td/iter_0000010" "$WORK/bad"
else
  skip "Megatron-written MoE checks need torch 2.6 ($TORCH2_WHY)"
fi

# --- (b) written here: Qwen2-MoE with a dense layer (per-layer keys), and all-MoE stacked ---
if [[ $have2 -eq 1 ]]; then
  hf=$WORK/qwen2_moe
  $PY "$models" write qwen2_moe "$hf"
  check "the Qwen2-MoE model has layer 1 dense (mlp_only_layers [1]) of 4" $PY -c "
import json, sys
c = json.load(open(sys.argv[1]))
sys.exit(0 if c['mlp_only_layers'] == [1] and c['num_hidden_layers'] == 4 else f'{c}')" "$hf/config.json"
  hfm=$WORK/mnt-qwen2_moe-hf
  check "the HF model mounts" mount_ckptfs "$hf" "$hfm"
  for spec in te local; do
    out=$WORK/dist-layers-$spec
    check "per-layer torch_dist ($spec names of the MoE pre-MLP norm, args.moe_layer_freq [1,0,1,1]) is written" \
      torch2_python "$WORK" "$writer" "$hf" "$out" --spec $spec
    m=$WORK/mnt-layers-$spec
    check "$spec: it mounts" mount_ckptfs "$out" "$m"
    check "$spec: its hf/ tensors are bit-identical to the HF model" $PY "$check_hf" compare "$hf" "$m/hf"
    check "$spec: its hf/config.json keeps layer 1 dense and the experts' sizes" $PY -c "
import json, sys
c = json.load(open(sys.argv[1]))
want = dict(architectures=['Qwen2MoeForCausalLM'], mlp_only_layers=[1], num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
            intermediate_size=96, norm_topk_prob=False)
bad = {k: c.get(k) for k, v in want.items() if c.get(k) != v}
sys.exit(f'differs: {bad}' if bad else 0)" "$m/hf/config.json"
    check "$spec: inspect says the keys are per layer (43 of them, layer 1 without experts)" bash -c \
      "'$CKPTFS' inspect '$out' | grep -q '43 model keys (per layer)'"
    # Byte for byte but for the tokenizer ids the HF model's views carry (args.hf_token_ids),
    # which the written checkpoint's args (as Megatron's) have not.
    for l in tp2pp1ep2 tp1pp2ep4; do
      check "$spec: its $l/ is the HF model's, bit for bit but the tokenizer ids in args" \
        $PY "$same_views" "$hfm/$l" "$m/$l"
    done
  done
  bad_cases "$WORK/dist-layers-te/iter_0000005" "$WORK/bad-layers" --per-layer

  hf=$WORK/qwen2_moe-all
  $PY "$models" write qwen2_moe "$hf" --all-moe
  out=$WORK/dist-stacked
  check "all-MoE stacked torch_dist with chunks over several layers and experts is written" \
    torch2_python "$WORK" "$writer" "$hf" "$out" --stacked
  m=$WORK/mnt-stacked
  check "it mounts" mount_ckptfs "$out" "$m"
  check "its hf/ tensors are bit-identical to the HF model" $PY "$check_hf" compare "$hf" "$m/hf"
  hfm=$WORK/mnt-qwen2_moe-all-hf
  check "the HF model mounts" mount_ckptfs "$hf" "$hfm"
  check "its tp2pp2ep2/ is the HF model's, bit for bit but the tokenizer ids in args" \
    $PY "$same_views" "$hfm/tp2pp2ep2" "$m/tp2pp2ep2"
else
  skip "torch_dist MoE sources written here need torch 2.6 ($TORCH2_WHY)"
fi

done_testing
