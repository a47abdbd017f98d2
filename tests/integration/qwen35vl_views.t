#!/usr/bin/env bash
# Qwen3.5's releases' VLM form (Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration;
# docs/vlm.md): tiny models built and saved by transformers 5.12.1 (the sid root), the tensors
# under the module names (model.language_model.*, model.visual.*, lm_head.*). Each is read as one
# model: the hybrid language model from text_config (its interleaved mrope), the tower from
# vision_config by Qwen3-VL's rows, without the deepstack list. mbridge keeps that tower as
# transformers' own module, which no rules hold yet: hf/ alone is served (bytes, and
# transformers' logits on an image + text input), the Megatron views left out with the reason by
# name. Qwen3-VL's deepstack_visual_indexes in its vision_config is named.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/qwen35vl.py"
models=$WORK/models

sid_python "$WORK" "$script" build "$models" > "$WORK/build.out" 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves a tiny Qwen3.5 VLM, dense and MoE" ||
  { tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2; done_testing; exit; }

# qwen35vl.py's TEXT and VISION sizes
for form in dense moe; do
  src=$models/$form
  class=Qwen3_5ForConditionalGeneration
  [[ $form == moe ]] && class=Qwen3_5MoeForConditionalGeneration
  "$CKPTFS" inspect "$src" > "$WORK/inspect-$form" 2>&1
  grep -q "^architecture: $class (model_type qwen3_5" "$WORK/inspect-$form" &&
    grep -q '^model: .*num_hidden_layers=4 hidden_size=64 num_attention_heads=4 num_key_value_heads=2 intermediate_size=128 vocab_size=256' "$WORK/inspect-$form"
  ok $? "$form: inspect reads the architecture and the language model from the config's text part" ||
    sed 's/^/# /' "$WORK/inspect-$form" >&2
  grep -q "^megatron: .*$class: its vision tower and merger (\"vision_config\": 2 blocks of width 32, 2 heads, ffn 48, merged 2x2 into 64) have no Megatron rules yet; hf/ serves the whole model" "$WORK/inspect-$form"
  ok $? "$form: inspect reads the tower by Qwen3-VL's rows and says why the Megatron views are missing" ||
    sed 's/^/# /' "$WORK/inspect-$form" >&2

  mnt=$WORK/mnt-$form
  fg_mount "$CKPTFS" "$src" "$mnt" "$WORK/log-$form"
  check "$form: hf/ holds the source's files, byte for byte" same_trees "$src" "$mnt/hf" .
  listing=$(ls "$mnt" | tr '\n' ' ')
  ok $([[ $listing == "hf " ]]; echo $?) "$form: the root lists hf/ only (got: $listing)"
  ls "$mnt/tp2pp2" > /dev/null 2>&1
  grep -q "no Megatron views: config.json: $class: its vision tower and merger .* have no Megatron rules yet" "$WORK/log-$form"
  ok $? "$form: the mount log says why tp2pp2/ is missing" || sed 's/^/# /' "$WORK/log-$form" >&2
  sid_python "$WORK" "$script" logits "$src" "$mnt/hf" > "$WORK/logits-$form" 2> "$WORK/logits-$form.err"
  grep -q "^PASS $mnt/hf: transformers' logits on an image + text input equal" "$WORK/logits-$form"
  ok $? "$form: hf/ gives the original's logits on an image + text input" ||
    { cat "$WORK/logits-$form"; tail -n 20 "$WORK/logits-$form.err"; } | sed 's/^/# /' >&2
  fg_unmount "$mnt"
done

# Qwen3-VL's deepstack list is no field of Qwen3.5's tower: named, hf/ served.
"$CKPTFS" inspect "$models/deepstack" > "$WORK/inspect-bad" 2>&1
grep -q '^megatron: .*vision_config.deepstack_visual_indexes is not understood' "$WORK/inspect-bad"
ok $? "deepstack: inspect names the vision field no rule reads" || grep '^megatron' "$WORK/inspect-bad" | sed 's/^/# /' >&2
fg_mount "$CKPTFS" "$models/deepstack" "$WORK/mnt-bad" "$WORK/log-bad"
check "deepstack: hf/ holds the source's files, byte for byte" same_trees "$models/deepstack" "$WORK/mnt-bad/hf" .
fg_unmount "$WORK/mnt-bad"

# A Megatron checkpoint said to be Qwen3.5's VLM is a VLM's, not read back yet: refused by name.
"$CKPTFS" inspect "$TESTDATA/megatron-core-0.17.1/llama-tp2pp2-torch" -o hf_arch=qwen3_5 > "$WORK/inspect-meg" 2>&1
grep -q 'a Megatron checkpoint of Qwen3_5ForConditionalGeneration (a vision-language model) is not read as a source yet' "$WORK/inspect-meg"
ok $? "hf_arch=qwen3_5 on a Megatron checkpoint is refused by name" || sed 's/^/# /' "$WORK/inspect-meg" >&2
done_testing
