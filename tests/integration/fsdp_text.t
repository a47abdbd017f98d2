#!/usr/bin/env bash
# verl FSDP2 shards of text MoE models saved with transformers 5: a tiny Qwen3-MoE, DeepSeek-V3,
# GLM-4.5 and Mixtral built by transformers 5 in the sid root, wrapped by torch 2.14's fully_shard on 2 gloo ranks and
# saved as verl saves an actor (fsdp_text.py), their routed experts fused as the model holds them
# (mlp.experts.gate_up_proj, down_proj). hf/ holds the tensors save_pretrained wrote for the same
# model, the experts one by one (mlp.experts.{e}.gate_proj.weight, up_proj, down_proj; Mixtral's
# router and experts renamed back to block_sparse_moe.gate and experts.{e}.w1, w3, w2), bit for
# bit, and transformers gives its weights and logits from it; the root lists the Hugging Face
# source's views and its Megatron views are byte-identical to the source's; a config the Megatron
# views refuse still gets the experts one by one in hf/.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script=$TESTS_TOP/tests/lib/fsdp_text.py
models=$WORK/models
mkdir -p "$models"
if ! sid_python "$WORK" "$script" build "$models" > "$WORK/build.out" 2> "$WORK/build.err"; then
  ok 1 "fsdp_text.py build: two gloo ranks save the text MoE models as FSDP2 shards ($(tail -c 300 "$WORK/build.err"))"
  done_testing
  exit
fi
ok 0 "fsdp_text.py build: two gloo ranks save the text MoE models as FSDP2 shards, the experts fused"

names=(qwen3_moe deepseek_v3 glm4_moe mixtral)
pairs=()
for name in "${names[@]}"; do
  role=$models/$name/actor
  src=$models/$name/hf
  "$CKPTFS" inspect "$role" > "$WORK/inspect" 2>&1
  check "$name: inspect says verl FSDP2, world size 2" grep -qF 'verl FSDP2 shards: world size 2, mesh [2] (fsdp)' "$WORK/inspect"
  check "  inspect says the fused experts are served one by one, as save_pretrained writes them" \
    grep -qF 'served one by one, as save_pretrained writes them' "$WORK/inspect"
  mnt=$WORK/mnt-$name srcmnt=$WORK/src-$name
  if ! mount_ckptfs "$role" "$mnt" 2> "$WORK/err" || ! mount_ckptfs "$src" "$srcmnt" 2>> "$WORK/err"; then
    ok 1 "$name: the role directory and its Hugging Face source mount ($(head -c 300 "$WORK/err"))"
    continue
  fi
  check "  the root lists the Hugging Face source's views ($(ls "$srcmnt" | tr '\n' ' '))" diff <(ls "$mnt") <(ls "$srcmnt")
  for v in tp2pp2 mcore; do
    [[ -d $srcmnt/$v ]] && check "  $v/ is byte-identical to $v/ of the Hugging Face source" diff -r "$mnt/$v" "$srcmnt/$v"
  done
  pairs+=("$src" "$mnt/hf")
done
# The transformers checks in one process of the sid root (a start costs seconds).
sid_python "$WORK" "$script" check "${pairs[@]}" > "$WORK/same.out" 2>&1
passes "$WORK/same.out"
check "the transformers checks gave 8 verdicts" test "$(grep -cE '^(PASS|FAIL) ' "$WORK/same.out")" -eq 8
[[ $(grep -cE '^(PASS|FAIL) ' "$WORK/same.out") -eq 8 ]] || fail_diag "$(tail -c 600 "$WORK/same.out")"
for name in "${names[@]}"; do unmount_ckptfs "$WORK/mnt-$name"; unmount_ckptfs "$WORK/src-$name"; done

# A config the Megatron views refuse (DeepSeek-V3 with fewer key/value heads than heads): hf/ is
# still served, its experts one by one as save_pretrained writes them.
bad=$WORK/fewkv
cp -r "$models/deepseek_v3/actor" "$bad"
$PY -c "
import json
p = '$bad/huggingface/config.json'
c = json.load(open(p))
c['num_key_value_heads'] = 2
json.dump(c, open(p, 'w'), indent=2)"
"$CKPTFS" inspect "$bad" > "$WORK/inspect" 2>&1
check "a config the Megatron views refuse: inspect names why" \
  grep -qF 'no Megatron views: config.json: num_key_value_heads 2 differs from num_attention_heads 4' "$WORK/inspect"
check "  and still serves the fused experts one by one" \
  grep -qF 'served one by one, as save_pretrained writes them' "$WORK/inspect"
mnt=$WORK/mnt-fewkv
if mount_ckptfs "$bad" "$mnt" 2> "$WORK/err"; then
  check "  hf/ holds save_pretrained's tensor names" $PY -c "
import json, struct, sys
def names(path):
    with open(path, 'rb') as f:
        header = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
    return sorted(k for k in header if k != '__metadata__')
sys.exit(names('$mnt/hf/model.safetensors') != names('$models/deepseek_v3/hf/model.safetensors'))"
  unmount_ckptfs "$mnt"
else
  ok 1 "the role directory with fewer key/value heads mounts ($(head -c 300 "$WORK/err"))"
fi
done_testing
