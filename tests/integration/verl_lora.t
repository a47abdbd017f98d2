#!/usr/bin/env bash
# verl LoRA runs: a PEFT-wrapped model saved by torch 2.6 FSDP2 ranks (base_model.model. names,
# .base_layer weights, lora_A/lora_B.default matrices, lora_train_meta.json). hf/ holds the base
# weights under their Hugging Face names (bit-identical to the model the run started from) and
# hf/lora_adapter/ the adapter as PEFT saves it; the Megatron views are the base model's; without
# lora_train_meta.json the adapter's alpha cannot be known and inspect says so.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
check_hf="$TESTS_TOP/tests/lib/check_hf.py"
lora="$TESTS_TOP/tests/lib/verl_lora.py"
if ! torch2_available; then
  echo "1..0 # skip writing a LoRA run needs torch 2.6 (DTensor): $TORCH2_WHY"
  exit 0
fi
src=$TESTDATA/verl-fsdp/src/llama  # the Llama the LoRA run starts from
check "torch 2.6: two gloo ranks save a LoRA actor as FSDP2 shards" \
  torch2_python "$WORK:$src" "$lora" write "$src" "$WORK/run" 2
role=$WORK/run/global_step_1/actor
check "inspect finds the adapter" bash -c "'$CKPTFS' inspect '$role' | grep -q 'LoRA: 16 adapter matrices in hf/lora_adapter/'"
mnt=$WORK/mnt
check "the LoRA role directory mounts" mount_ckptfs "$role" "$mnt"
check "  hf/ lists the base model's files and lora_adapter/" diff <(ls "$mnt/hf") \
  <(printf 'config.json\ngeneration_config.json\nlora_adapter\nmodel.safetensors\ntokenizer.json\n')
check "  hf/ base weights are bit-identical to the model the run started from (PEFT wrapping removed)" \
  $PY "$check_hf" compare "$src" "$mnt/hf"
check "  hf/lora_adapter/ holds adapter_config.json and adapter_model.safetensors as PEFT saves them" \
  $PY "$lora" check "$src" "$mnt/hf"
check "  the safetensors library (torch 2.6) reads the same adapter" \
  torch2_python "$WORK:$src:$mnt" "$lora" check "$src" "$mnt/hf" --safetensors
srcmnt=$WORK/src
mount_ckptfs "$src" "$srcmnt"
check "  tp2pp2/ is the base model's (byte-identical to tp2pp2/ of the model it started from)" \
  diff -r "$mnt/tp2pp2" "$srcmnt/tp2pp2"
unmount_ckptfs "$mnt"
check "-o dtype=fp32 mounts" mount_ckptfs "$role" "$mnt" -o dtype=fp32
check "  the adapter is served in fp32 too" $PY -c "
import json, struct, sys
f = open('$mnt/hf/lora_adapter/adapter_model.safetensors', 'rb')
h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
sys.exit(not all(v['dtype'] == 'F32' for k, v in h.items() if k != '__metadata__'))"
unmount_ckptfs "$mnt"

mnt=$WORK/mnt-run
check "a run directory with the LoRA step mounts" mount_ckptfs "$WORK/run" "$mnt"
check "  global_step_1/actor/hf/lora_adapter/adapter_config.json is there" \
  test -s "$mnt/global_step_1/actor/hf/lora_adapter/adapter_config.json"
unmount_ckptfs "$mnt"

rm "$role/lora_train_meta.json"
check "without lora_train_meta.json inspect warns that lora_alpha is set to r" bash -c \
  "'$CKPTFS' inspect '$role' | grep -q 'warning: .*lora_train_meta.json: missing: lora_adapter/adapter_config.json says lora_alpha = r = 4'"
fg=$WORK/mnt-fg
mkdir -p "$fg"
"$CKPTFS" mount -f "$WORK/run" "$fg" 2> "$WORK/daemon.log" &
daemon=$!
for _ in $(seq 100); do mountpoint -q "$fg" && break; sleep 0.1; done
ls "$fg/global_step_1/actor/hf" > /dev/null 2>&1
check "a run mounted in the foreground logs the warning of a role opened on lookup" \
  grep -q "global_step_1/actor: warning: .*lora_train_meta.json: missing" "$WORK/daemon.log"
unmount_ckptfs "$fg"
wait "$daemon"
echo '{"r": 0, "lora_alpha": 8}' > "$role/lora_train_meta.json"
"$CKPTFS" inspect "$role" > /dev/null 2> "$WORK/err" && rc=0 || rc=1
ok $((1 - rc)) "a lora_train_meta.json with r = 0 is refused"
check "  naming the file" grep -q "lora_train_meta.json: no whole \"r\"" "$WORK/err"
echo '{"r": 4, "lora_alpha": 16.0, "task_type": "CAUSAL_LM"}' > "$role/lora_train_meta.json"
check "a lora_alpha written as 16.0 (Python's float) is taken" bash -c \
  "'$CKPTFS' cat '$role' hf/lora_adapter/adapter_config.json | grep -q '\"lora_alpha\" : 16,'"
done_testing
