#!/usr/bin/env bash
# GLM-4.1V (Glm4vForConditionalGeneration, docs/vlm.md): a tiny model built and saved by
# transformers 5 itself (in the sid root), its tensors under the module names
# (model.language_model.*, model.visual.*). It is read as one model: the language model from
# text_config, the vision tower from vision_config by GLM's own rows. Its rope (interleaved pairs,
# the mrope sections by frequency) has no Megatron-core args, so hf/ alone is served (bytes and
# transformers' logits on an image + text input) and the Megatron views are left out with the
# reason by name; a vision_config field no rule reads is named instead. GLM-4.5V: glm45v_views.t.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/vlm.py"
models=$WORK/models

sid_python "$WORK" "$script" glm4v-build "$models" > "$WORK/build.out" 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves a tiny GLM-4.1V" ||
  { tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2; done_testing; exit; }

src=$models/glm4v mnt=$WORK/mnt
"$CKPTFS" inspect "$src" > "$WORK/inspect" 2>&1
# vlm.py's GLM4V_TEXT sizes
grep -q '^model: .*num_hidden_layers=2 hidden_size=64 num_attention_heads=4 num_key_value_heads=2 intermediate_size=128 vocab_size=256' "$WORK/inspect"
ok $? "inspect reads the language model from the config's text part" || sed 's/^/# /' "$WORK/inspect" >&2
# the tower is read by GLM's rows (the badvision check below), then the rope refused
grep -q '^megatron: .*config.json: Glm4vForConditionalGeneration rotates interleaved pairs with its mrope sections taken by frequency' "$WORK/inspect"
ok $? "inspect says why the Megatron views are missing: the rope" ||
  sed 's/^/# /' "$WORK/inspect" >&2

fg_mount "$CKPTFS" "$src" "$mnt" "$WORK/log"
check "hf/ holds the source's files, byte for byte" same_trees "$src" "$mnt/hf" .
listing=$(ls "$mnt" | tr '\n' ' ')
ok $([[ $listing == "hf " ]]; echo $?) "the root lists hf/ only (got: $listing)"
ls "$mnt/tp2pp2" > /dev/null 2>&1
grep -q 'no Megatron views: config.json: Glm4vForConditionalGeneration rotates interleaved pairs' "$WORK/log"
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

# A Megatron checkpoint said to be GLM-4.1V: refused by name (a text model's args have no mrope).
"$CKPTFS" inspect "$TESTDATA/megatron-core-0.17.1/llama-tp2pp2-torch" -o hf_arch=glm4v > "$WORK/inspect-meg" 2>&1
grep -q "args.position_embedding_type is not mrope with a mrope_section of three positive sections: Glm4vForConditionalGeneration's rotary embedding is multimodal" "$WORK/inspect-meg"
ok $? "hf_arch=glm4v on a Megatron checkpoint is refused by name" || sed 's/^/# /' "$WORK/inspect-meg" >&2
done_testing
