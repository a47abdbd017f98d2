#!/usr/bin/env bash
# verl FSDP2 shards of vision-language models: a tiny Qwen2.5-VL (untied), Qwen3-VL (tied),
# Gemma 3 VLM (tied), Qwen3-VL-MoE and GLM-4.5V (untied) built by transformers 5 in the sid root,
# wrapped by torch 2.14's fully_shard on 2 gloo ranks and saved as verl saves an actor
# (fsdp_vlm.py). hf/ holds the tensors save_pretrained wrote for the same model (Qwen2.5-VL's
# under the release's names, Qwen3-VL's under the module names, Gemma 3's under
# language_model.model.*; tied heads left out; Qwen3-VL-MoE's experts fused, GLM-4.5V's one by one
# as its save writes the experts it holds fused), bit for bit, and gives its logits; the root lists
# the Hugging Face source's views and its Megatron views are byte-identical to the source's; a
# missing rank file, fused experts not of config.json's count and an unknown vision field are
# refused by name.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script=$TESTS_TOP/tests/lib/fsdp_vlm.py
models=$WORK/models
mkdir -p "$models"
if ! sid_python "$WORK" "$script" build "$models" > "$WORK/build.out" 2> "$WORK/build.err"; then
  ok 1 "fsdp_vlm.py build: two gloo ranks save the VLMs as FSDP2 shards ($(tail -c 300 "$WORK/build.err"))"
  done_testing
  exit
fi
ok 0 "fsdp_vlm.py build: two gloo ranks save the VLMs as FSDP2 shards (torch 2.14: a layout and rank map pickled for the mesh)"

names=(qwen2_5_vl qwen3_vl gemma3 qwen3_vl_moe glm4v_moe)
pairs=()
for name in "${names[@]}"; do
  role=$models/$name/actor
  src=$models/$name/hf
  check "$name: inspect says verl FSDP2, world size 2" bash -c \
    "'$CKPTFS' inspect '$role' | grep -qF 'verl FSDP2 shards: world size 2, mesh [2] (fsdp)'"
  mnt=$WORK/mnt-$name srcmnt=$WORK/src-$name
  if ! mount_ckptfs "$role" "$mnt" 2> "$WORK/err" || ! mount_ckptfs "$src" "$srcmnt" 2>> "$WORK/err"; then
    ok 1 "$name: the role directory and its Hugging Face source mount ($(head -c 300 "$WORK/err"))"
    continue
  fi
  # bf16 served from fp32 shards: ckptfs writes torch_dtype beside transformers 5's dtype.
  check "  config.json of hf/ is the saved model's, with torch_dtype bfloat16" $PY -c "
import json, sys
got, want = json.load(open('$mnt/hf/config.json')), json.load(open('$src/config.json'))
sys.exit(got.pop('torch_dtype') != 'bfloat16' or got != want)"
  check "  the root lists the Hugging Face source's views ($(ls "$srcmnt" | tr '\n' ' '))" diff <(ls "$mnt") <(ls "$srcmnt")
  for v in tp2pp2 mcore; do
    [[ -d $srcmnt/$v ]] && check "  $v/ is byte-identical to $v/ of the Hugging Face source" diff -r "$mnt/$v" "$srcmnt/$v"
  done
  pairs+=("$src" "$mnt/hf")
done
# The transformers checks in one process of the sid root (a start costs seconds): per model
# save_pretrained's tensors bit for bit and the logits, Gemma 3's also changed by another image.
sid_python "$WORK" "$script" check "${pairs[@]}" > "$WORK/same.out" 2>&1
passes "$WORK/same.out"
check "the transformers checks gave 11 verdicts" test "$(grep -cE '^(PASS|FAIL) ' "$WORK/same.out")" -eq 11
[[ $(grep -cE '^(PASS|FAIL) ' "$WORK/same.out") -eq 11 ]] || fail_diag "$(tail -c 600 "$WORK/same.out")"
for name in "${names[@]}"; do unmount_ckptfs "$WORK/mnt-$name"; unmount_ckptfs "$WORK/src-$name"; done

# A rank file missing: named.
bad=$WORK/norank
cp -r "$models/qwen2_5_vl/actor" "$bad"
rm "$bad/model_world_size_2_rank_1.pt"
"$CKPTFS" inspect "$bad" > /dev/null 2> "$WORK/err" && rc=0 || rc=$?
ok $([[ $rc -eq 1 ]] && grep -qF 'model_world_size_2_rank_1.pt' "$WORK/err"; echo $?) \
  "a missing rank file is refused by name ($(head -c 300 "$WORK/err"))"
# torch 2.14's mesh layout reaching past its rank map: named.
"$CKPTFS" inspect "$models/badmesh" > /dev/null 2> "$WORK/err" && rc=0 || rc=$?
ok $([[ $rc -eq 1 ]] && grep -qF "model_world_size_2_rank_0.pt: 'model.visual.patch_embed.proj.weight': its device mesh's layout reaches past its rank map of 1" "$WORK/err"; echo $?) \
  "a device mesh whose layout reaches past its rank map is refused by name ($(head -c 300 "$WORK/err"))"
# GLM-4.5V's fused experts whose first dimension is not config.json's expert count: named.
bad=$WORK/badexperts
cp -r "$models/glm4v_moe/actor" "$bad"
$PY -c "
import json
p = '$bad/huggingface/config.json'
c = json.load(open(p))
c['text_config']['n_routed_experts'] = 2
json.dump(c, open(p, 'w'), indent=2)"
"$CKPTFS" inspect "$bad" > /dev/null 2> "$WORK/err" && rc=0 || rc=$?
ok $([[ $rc -eq 1 ]] && grep -qF "fused expert tensor 'model.language_model.layers.1.mlp.experts.gate_up_proj' is [4, 64, 64]: it must be 3-dimensional, its first dimension the 2 experts config.json gives" "$WORK/err"; echo $?) \
  "fused experts not of config.json's count are refused by name ($(head -c 300 "$WORK/err"))"
# A vision field no rule reads: named for the Megatron views, hf/ still served.
bad=$WORK/badvision
cp -r "$models/qwen2_5_vl/actor" "$bad"
$PY -c "
import json
p = '$bad/huggingface/config.json'
c = json.load(open(p))
c['vision_config']['window_attention_kind'] = 'shifted'
json.dump(c, open(p, 'w'), indent=2)"
check "an unknown vision field is named by inspect" bash -c \
  "'$CKPTFS' inspect '$bad' | grep -qF 'vision_config.window_attention_kind is not understood'"
mnt=$WORK/mnt-badvision
if mount_ckptfs "$bad" "$mnt" 2> "$WORK/err"; then
  check "  its root lists hf/ alone" diff <(ls "$mnt") <(echo hf)
  check "  hf/ still serves the weights" test -s "$mnt/hf/model.safetensors"
  unmount_ckptfs "$mnt"
else
  ok 1 "the role directory with an unknown vision field mounts ($(head -c 300 "$WORK/err"))"
fi
done_testing
