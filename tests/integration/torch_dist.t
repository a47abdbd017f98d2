#!/usr/bin/env bash
# torch_dist both ways. mcore/ (a torch_dist checkpoint synthesized on read) loads with torch
# 2.6's own torch.distributed.checkpoint into exactly the source weights, and a TP-2/4 loader
# reads at most 1.25x its share; torch_dist checkpoints (Megatron's own, and ones torch 2.6's
# dcp.save writes here with several files and irregular chunks) mount as a source whose hf/ is
# bit-identical to the model they came from; round trips; broken checkpoints fail with one line.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
check_hf="$TESTS_TOP/tests/lib/check_hf.py"
ref="$TESTS_TOP/tests/lib/reference.py"
models="$TESTS_TOP/tests/lib/models.py"
dcp="$TESTS_TOP/tests/lib/dcp_check.py"  # torch 2.6 (the Debian 13 root)
torch2_available && have2=1 || have2=0
[[ $have2 -eq 1 ]] || diag "torch 2.6 checks skipped: $TORCH2_WHY"

real=$TESTDATA/megatron-core-0.17.1

# --- mcore/ over Hugging Face sources ---
for a in llama qwen2 qwen3; do
  $PY "$models" write $a "$WORK/$a" --shards 2
  mnt=$WORK/mnt-$a
  check "$a: mount" mount_ckptfs "$WORK/$a" "$mnt"
  check "$a: mcore/ has the tracker and release/ with metadata.json, common.pt, .metadata, .distcp" bash -c \
    "[[ \$(cat '$mnt/mcore/latest_checkpointed_iteration.txt') == release ]] && cd '$mnt/mcore/release' && ls -A | grep -qx .metadata && ls | grep -qx common.pt && ls | grep -qx metadata.json && ls | grep -q '^__0_0.distcp$'"
  check "$a: torch 1.13 (host) loads every chunk of mcore/; assembled tensors are the stacked weights" \
    $PY "$TESTS_TOP/tests/lib/dcp_host.py" "$mnt/mcore/release" "$WORK/$a"
  if [[ $have2 -eq 1 ]]; then
    check "$a: dcp.load of mcore/ (torch 2.6, no process group) gives the stacked source weights" \
      torch2_python "$WORK" "$dcp" load "$mnt/mcore/release" "$WORK/$a" --ckptfs-view
    check "$a: loading only some keys works" \
      torch2_python "$WORK" "$dcp" load "$mnt/mcore/release" "$WORK/$a" --ckptfs-view \
      --keys decoder.layers.mlp.linear_fc1.weight,decoder.final_layernorm.weight
    for tp in 2 4; do
      check "$a: a TP-$tp loader reads at most 1.25x its share" \
        torch2_python "$WORK" "$dcp" share "$mnt/mcore/release" --tp $tp --bound 1.25
    done
  else
    skip "$a: torch 2.6 loads ($TORCH2_WHY)"
  fi
  check "$a: cp -r mcore equals ckptfs export mcore" bash -c \
    "cp -r '$mnt/mcore' '$WORK/cp-$a' && '$CKPTFS' export '$WORK/$a' mcore '$WORK/exp-$a' >/dev/null && diff -r '$WORK/cp-$a' '$WORK/exp-$a'"
  # Round trip: the exported mcore/ as a source.
  mnt2=$WORK/mnt-rt-$a
  check "$a: the exported mcore/ mounts as a source" mount_ckptfs "$WORK/exp-$a" "$mnt2"
  check "$a: its hf/ tensors are bit-identical to the original" $PY "$check_hf" compare "$WORK/$a" "$mnt2/hf"
  check "$a: its tp2pp2 equals the reference split of the original; forward matches" \
    $PY "$ref" check "$WORK/$a" "$mnt2/tp2pp2" tp2pp2
  check "$a: its mcore/ is byte-identical to the original's" diff -r -x common.pt "$mnt/mcore" "$mnt2/mcore"
done

# The legacy tp2pp2 export -> mounted -> its mcore/ holds the same bytes as the HF-made one.
check "llama: export tp2pp2 (legacy)" "$CKPTFS" export "$WORK/llama" tp2pp2 "$WORK/leg-llama"
check "llama tp2pp2 legacy export mounts" mount_ckptfs "$WORK/leg-llama" "$WORK/mnt-leg"
check "its mcore/ is byte-identical to the one made from HF" diff -r -x common.pt "$WORK/mnt-llama/mcore" "$WORK/mnt-leg/mcore"

# --- torch_dist as a source: written by Megatron itself ---
td=$real/llama-tp2pp2-torch_dist
mnt=$WORK/mnt-real
check "mount Megatron's own tp2pp2 torch_dist checkpoint" mount_ckptfs "$td" "$mnt"
check "its hf/ tensors are bit-identical to hf-llama" $PY "$check_hf" compare "$real/hf-llama" "$mnt/hf"
check "its tp1pp4vpp2/ equals the reference split of hf-llama; forward matches" \
  $PY "$ref" check "$real/hf-llama" "$mnt/tp1pp4vpp2" tp1pp4vpp2
check "vpp2 is tp2pp2vpp2 (the saved split)" test "$(readlink "$mnt/vpp2")" = tp2pp2vpp2
check "the iteration directory can be given directly" bash -c \
  "'$CKPTFS' inspect '$td/iter_0000010' | grep -q 'megatron-torch_dist'"
check "inspect names the format and the saved split" bash -c \
  "'$CKPTFS' inspect '$td' | grep -q 'megatron-torch_dist.*saved as tp2pp2'"
# verl's layout: model/dist_ckpt/ (no args in common.pt) beside model/huggingface/.
v=$WORK/verl/global_step_10/actor/model
mkdir -p "$v/huggingface"
cp -r "$td/iter_0000010" "$v/dist_ckpt" && rm "$v/dist_ckpt/common.pt"
cp "$real/hf-llama/config.json" "$real/hf-llama/tokenizer.json" "$v/huggingface/"
check "verl's model/dist_ckpt/ mounts, sizes from model/huggingface/config.json" mount_ckptfs "$v/dist_ckpt" "$WORK/mnt-verl"
check "its hf/ is bit-identical to hf-llama, with the tokenizer passed through" bash -c \
  "$PY '$check_hf' compare '$real/hf-llama' '$WORK/mnt-verl/hf' && cmp '$real/hf-llama/tokenizer.json' '$WORK/mnt-verl/hf/tokenizer.json'"
check "its mcore/ equals the mcore/ of hf-llama" bash -c \
  "mkdir -p '$WORK/mnt-hfl' && '$CKPTFS' mount '$real/hf-llama' '$WORK/mnt-hfl' && diff -r -x common.pt '$WORK/mnt-hfl/mcore' '$mnt/mcore'"
if [[ $have2 -eq 1 ]]; then
  check "the checker itself passes on Megatron's own torch_dist files" \
    torch2_python "$WORK:$real" "$dcp" load "$td/iter_0000010" "$real/hf-llama"
  # --- broken checkpoints, made from Megatron's own with torch's classes ---
  mkdir -p "$WORK/bad"
  cases=$(torch2_python "$WORK:$real" "$TESTS_TOP/tests/lib/bad_torch_dist.py" "$td/iter_0000010" "$WORK/bad")
  for c in $cases; do
    expect=$(cat "$WORK/bad/$c/expect")
    m=$WORK/mnt-bad-$c
    mkdir -p "$m"
    "$CKPTFS" mount "$WORK/bad/$c" "$m" 2> "$WORK/err" && rc=0 || rc=$?
    [[ $rc -ne 0 && $(wc -l < "$WORK/err") -eq 1 ]] && grep -qF -- "$expect" "$WORK/err" &&
      ! grep -q " $m " /proc/mounts
    ok $? "$c: mount fails with one line naming '$expect' ($(head -c 160 "$WORK/err"))"
  done
  mkdir -p "$WORK/mnt-it"
  "$CKPTFS" mount "$td" "$WORK/mnt-it" -o iteration=99 2> "$WORK/err" && rc=0 || rc=$?
  [[ $rc -ne 0 ]] && grep -q iter_0000099 "$WORK/err"; ok $? "iteration=99 (absent) fails naming iter_0000099"
else
  skip "checker and bad torch_dist inputs need torch 2.6 ($TORCH2_WHY)"
fi

# --- torch_dist written by torch 2.6's own dcp.save: several files, irregular chunks ---
if [[ $have2 -eq 1 ]]; then
  for a in llama qwen2; do
    out=$WORK/dcp-$a
    check "$a: dcp.save writes a torch_dist checkpoint (3 ranks, irregular chunks)" \
      torch2_python "$WORK" "$dcp" make-source "$WORK/$a" "$out" --ranks 3 --irregular
    m=$WORK/mnt-dcp-$a
    check "$a: it mounts as a source" mount_ckptfs "$out" "$m"
    check "$a: its hf/ tensors are bit-identical to the original" $PY "$check_hf" compare "$WORK/$a" "$m/hf"
    check "$a: its tp2pp2vpp2/ equals the reference split; forward matches" \
      $PY "$ref" check "$WORK/$a" "$m/tp2pp2vpp2" tp2pp2vpp2
    check "$a: its mcore/ (re-chunked) is byte-identical to the HF-made one" diff -r -x common.pt "$WORK/mnt-$a/mcore" "$m/mcore"
  done
else
  skip "dcp.save-written sources need torch 2.6 ($TORCH2_WHY)"
fi


# --- Phi-3: fused qkv_proj / gate_up_proj in the Hugging Face files ---
# mcore/'s stacked keys are the Llama ones (linear_qkv interleaved per query group, fc1 =
# [gate; up]); mcore_expect cuts the fused tensors itself (models.unfuse). Then round trips: the
# exported mcore/ as a source gives back hf/ with the fused names, bit-identical.
a=phi3
$PY "$models" write $a "$WORK/$a" --shards 2
mnt=$WORK/mnt-$a
check "$a: mount" mount_ckptfs "$WORK/$a" "$mnt"
check "$a: mcore/ has the tracker and release/ with metadata.json, common.pt, .metadata, .distcp" bash -c \
  "[[ \$(cat '$mnt/mcore/latest_checkpointed_iteration.txt') == release ]] && cd '$mnt/mcore/release' && ls -A | grep -qx .metadata && ls | grep -qx common.pt && ls | grep -qx metadata.json && ls | grep -q '^__0_0.distcp$'"
check "$a: torch 1.13 (host) loads every chunk of mcore/; assembled tensors are the stacked weights" \
  $PY "$TESTS_TOP/tests/lib/dcp_host.py" "$mnt/mcore/release" "$WORK/$a"
if [[ $have2 -eq 1 ]]; then
  check "$a: dcp.load of mcore/ (torch 2.6, no process group) gives the stacked source weights" \
    torch2_python "$WORK" "$dcp" load "$mnt/mcore/release" "$WORK/$a" --ckptfs-view
  check "$a: loading only linear_qkv and linear_fc1 works" \
    torch2_python "$WORK" "$dcp" load "$mnt/mcore/release" "$WORK/$a" --ckptfs-view \
    --keys decoder.layers.self_attention.linear_qkv.weight,decoder.layers.mlp.linear_fc1.weight
  for tp in 2 4; do
    check "$a: a TP-$tp loader reads at most 1.25x its share" \
      torch2_python "$WORK" "$dcp" share "$mnt/mcore/release" --tp $tp --bound 1.25
  done
else
  skip "$a: torch 2.6 loads ($TORCH2_WHY)"
fi
check "$a: cp -r mcore equals ckptfs export mcore" bash -c \
  "cp -r '$mnt/mcore' '$WORK/cp-$a' && '$CKPTFS' export '$WORK/$a' mcore '$WORK/exp-$a' >/dev/null && diff -r '$WORK/cp-$a' '$WORK/exp-$a'"
mnt2=$WORK/mnt-rt-$a
check "$a: the exported mcore/ mounts as a source" mount_ckptfs "$WORK/exp-$a" "$mnt2"
check "$a: its hf/ tensors are bit-identical to the original (fused names)" $PY "$check_hf" compare "$WORK/$a" "$mnt2/hf"
check "$a: its hf/config.json names Phi3ForCausalLM, model_type phi3" $PY -c "
import json, sys
c = json.load(open(sys.argv[1]))
sys.exit(0 if c.get('architectures') == ['Phi3ForCausalLM'] and c.get('model_type') == 'phi3' else f'{c.get(\"architectures\")} {c.get(\"model_type\")}')" "$mnt2/hf/config.json"
check "$a: its tp2pp2 equals the reference split of the original; forward matches" \
  $PY "$ref" check "$WORK/$a" "$mnt2/tp2pp2" tp2pp2
check "$a: its mcore/ is byte-identical to the original's" diff -r -x common.pt "$mnt/mcore" "$mnt2/mcore"
check "$a: export tp2pp2 (legacy)" "$CKPTFS" export "$WORK/$a" tp2pp2 "$WORK/leg-$a"
check "$a: the tp2pp2 legacy export mounts" mount_ckptfs "$WORK/leg-$a" "$WORK/mnt-leg-$a"
check "$a: its mcore/ is byte-identical to the one made from HF" diff -r -x common.pt "$mnt/mcore" "$WORK/mnt-leg-$a/mcore"
if [[ $have2 -eq 1 ]]; then
  # verl's layout (model/dist_ckpt/ without args, model/huggingface/config.json beside it), as
  # a Phi-3 run with the Megatron backend writes it: the architecture comes from the config.
  out=$WORK/dcp-$a
  check "$a: dcp.save writes a torch_dist checkpoint (3 ranks, irregular chunks)" \
    torch2_python "$WORK" "$dcp" make-source "$WORK/$a" "$out" --ranks 3 --irregular
  v=$WORK/verl-$a/global_step_1/actor/model
  mkdir -p "$v/huggingface"
  cp -r "$out/iter_0000007" "$v/dist_ckpt" && rm "$v/dist_ckpt/common.pt"
  cp "$WORK/$a/config.json" "$v/huggingface/"
  check "$a: verl's model/dist_ckpt/ of it mounts" mount_ckptfs "$v/dist_ckpt" "$WORK/mnt-verl-$a"
  check "$a: its hf/ is bit-identical to the original (fused names)" $PY "$check_hf" compare "$WORK/$a" "$WORK/mnt-verl-$a/hf"
  check "$a: its tp2pp2vpp2/ equals the reference split; forward matches" \
    $PY "$ref" check "$WORK/$a" "$WORK/mnt-verl-$a/tp2pp2vpp2" tp2pp2vpp2
  check "$a: its mcore/ (re-chunked) is byte-identical to the HF-made one" diff -r -x common.pt "$mnt/mcore" "$WORK/mnt-verl-$a/mcore"
else
  skip "$a: dcp.save-written source needs torch 2.6 ($TORCH2_WHY)"
fi

done_testing
