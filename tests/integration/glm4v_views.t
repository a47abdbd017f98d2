#!/usr/bin/env bash
# GLM-4.1V (Glm4vForConditionalGeneration, docs/vlm.md) and GLM-4.5V: tiny models built and saved by
# transformers 5 itself (in the sid root), its tensors under the module names
# (model.language_model.*, model.visual.*). It is read as one model: the language model from
# text_config, the vision tower from vision_config by GLM-4.1V's own rows. Its tower has no
# Megatron rules yet, so hf/ alone is served (bytes and transformers' logits on an image + text
# input) and the Megatron views are left out with the reason by name; a vision_config field no
# rule reads is named instead.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/vlm.py"
models=$WORK/models

sid_python "$WORK" "$script" glm4v-build "$models" > "$WORK/build.out" 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves a tiny GLM-4.1V and GLM-4.5V" ||
  { tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2; done_testing; exit; }

src=$models/glm4v mnt=$WORK/mnt
"$CKPTFS" inspect "$src" > "$WORK/inspect" 2>&1
# vlm.py's GLM4V_TEXT sizes
grep -q '^model: .*num_hidden_layers=2 hidden_size=64 num_attention_heads=4 num_key_value_heads=2 intermediate_size=128 vocab_size=256' "$WORK/inspect"
ok $? "inspect reads the language model from the config's text part" || sed 's/^/# /' "$WORK/inspect" >&2
# vlm.py's GLM4V_VISION sizes, read by GLM-4.1V's rows (Qwen2.5-VL's would refuse image_size)
grep -q '^megatron: .*Glm4vForConditionalGeneration: its vision tower and merger ("vision_config": 2 blocks of width 32, 2 heads, ffn 48, merged 2x2 into 64) have no Megatron rules yet; hf/ serves the whole model' "$WORK/inspect"
ok $? "inspect reads the vision tower by GLM-4.1V's rows and says why the Megatron views are missing" ||
  sed 's/^/# /' "$WORK/inspect" >&2

fg_mount "$CKPTFS" "$src" "$mnt" "$WORK/log"
check "hf/ holds the source's files, byte for byte" same_trees "$src" "$mnt/hf" .
listing=$(ls "$mnt" | tr '\n' ' ')
ok $([[ $listing == "hf " ]]; echo $?) "the root lists hf/ only (got: $listing)"
ls "$mnt/tp2pp2" > /dev/null 2>&1
grep -q 'no Megatron views: config.json: Glm4vForConditionalGeneration: its vision tower and merger .* have no Megatron rules yet' "$WORK/log"
ok $? "the mount log says why tp2pp2/ is missing" || sed 's/^/# /' "$WORK/log" >&2

sid_python "$WORK" "$script" glm4v-logits Glm4vForConditionalGeneration "$src" "$mnt/hf" > "$WORK/logits" 2> "$WORK/logits.err"
ok $? "transformers loads the original and hf/" || tail -n 20 "$WORK/logits.err" | sed 's/^/# /' >&2
grep -q "^PASS $mnt/hf: transformers' logits on an image + text input equal" "$WORK/logits"
ok $? "hf/ gives the original's logits on an image + text input" || sed 's/^/# /' "$WORK/logits" >&2
fg_unmount "$mnt"

# A vision field no rule reads: named, hf/ served.
"$CKPTFS" inspect "$models/glm4v-badvision" > "$WORK/inspect-bad" 2>&1
grep -q '^megatron: .*vision_config.use_rope_2d is not understood' "$WORK/inspect-bad"
ok $? "badvision: inspect names the vision field no rule reads" || grep '^megatron' "$WORK/inspect-bad" | sed 's/^/# /' >&2
fg_mount "$CKPTFS" "$models/glm4v-badvision" "$WORK/mnt-bad" "$WORK/log-bad"
check "badvision: hf/ holds the source's files, byte for byte" same_trees "$models/glm4v-badvision" "$WORK/mnt-bad/hf" .
fg_unmount "$WORK/mnt-bad"

# GLM-4.5V: the same tower's rows (Glm4vMoeVisionConfig is Glm4vVisionConfig's), hf/ only.
src=$models/glm4v_moe mnt=$WORK/mnt-moe
"$CKPTFS" inspect "$src" > "$WORK/inspect-moe" 2>&1
grep -q '^megatron: .*Glm4vMoeForConditionalGeneration: its vision tower and merger ("vision_config": 2 blocks of width 32, 2 heads, ffn 48, merged 2x2 into 64) have no Megatron rules yet' "$WORK/inspect-moe"
ok $? "glm4v_moe: inspect reads the tower by GLM-4.1V's rows and says why the Megatron views are missing" ||
  sed 's/^/# /' "$WORK/inspect-moe" >&2
fg_mount "$CKPTFS" "$src" "$mnt" "$WORK/log-moe"
check "glm4v_moe: hf/ holds the source's files, byte for byte" same_trees "$src" "$mnt/hf" .
listing=$(ls "$mnt" | tr '\n' ' ')
ok $([[ $listing == "hf " ]]; echo $?) "glm4v_moe: the root lists hf/ only (got: $listing)"
sid_python "$WORK" "$script" glm4v-logits Glm4vMoeForConditionalGeneration "$src" "$mnt/hf" > "$WORK/logits-moe" 2> "$WORK/logits-moe.err"
grep -q "^PASS $mnt/hf: transformers' logits on an image + text input equal" "$WORK/logits-moe"
ok $? "glm4v_moe: hf/ gives the original's logits on an image + text input" ||
  { cat "$WORK/logits-moe"; tail -n 20 "$WORK/logits-moe.err"; } | sed 's/^/# /' >&2
fg_unmount "$mnt"

# A Megatron checkpoint said to be GLM-4.1V is a VLM's, not read back yet: refused by name.
"$CKPTFS" inspect "$TESTDATA/megatron-core-0.17.1/llama-tp2pp2-torch" -o hf_arch=glm4v > "$WORK/inspect-meg" 2>&1
grep -q 'a Megatron checkpoint of Glm4vForConditionalGeneration (a vision-language model) is not read as a source yet' "$WORK/inspect-meg"
ok $? "hf_arch=glm4v on a Megatron checkpoint is refused by name" || sed 's/^/# /' "$WORK/inspect-meg" >&2
done_testing
