#!/usr/bin/env bash
# Vision-language models (docs/vlm.md): a tiny Qwen2.5-VL built and saved by transformers 5 itself
# (in the sid root), in the three forms checkpoints of it come in: transformers 5's config.json
# (text_config nested) with the release's tensor names, the same tensors under transformers >=
# 4.52's module names (model.language_model.*, model.visual.*), and the release's config.json
# (the language model's fields at the top level). Each is read as one model, the language model
# from its text part, its vision tower from its vision part; hf/ serves it whole (bytes and
# transformers' logits on an image + text input); the Megatron views are left out and inspect
# and the mount log say why, by name. A copy whose vision_config has a field no rule reads is
# refused by that field's name, hf/ still served.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/vlm.py"
models=$WORK/models

sid_python "$WORK" "$script" build "$models" > "$WORK/build.out" 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves a tiny Qwen2.5-VL in three forms" ||
  { tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2; done_testing; exit; }

# Why each form has no Megatron views: the sizes are vlm.py's VISION; badvision's is its field.
declare -A why=(
  [v5]='its vision tower and merger ("vision_config": 2 blocks of width 32, 2 heads, ffn 48, merged 2x2 into 64) have no Megatron rules yet'
  [badvision]='vision_config.window_attention_kind is not understood'
)
why[modules]=${why[v5]} why[v4]=${why[v5]}
hf_dirs=()
for form in v5 modules v4 badvision; do
  src=$models/$form mnt=$WORK/mnt-$form
  "$CKPTFS" inspect "$src" > "$WORK/inspect-$form" 2>&1
  grep -q '^model: .*num_hidden_layers=4 hidden_size=64 num_attention_heads=4 num_key_value_heads=2 intermediate_size=128 vocab_size=256' "$WORK/inspect-$form"
  ok $? "$form: inspect reads the language model from the config's text part" ||
    sed 's/^/# /' "$WORK/inspect-$form" >&2
  grep -qF "${why[$form]}" <(grep '^megatron: ' "$WORK/inspect-$form")
  ok $? "$form: inspect says why the Megatron views are missing: ${why[$form]}" ||
    grep '^megatron' "$WORK/inspect-$form" | sed 's/^/# /' >&2
  fg_mount "$CKPTFS" "$src" "$mnt" "$WORK/log-$form"
  check "$form: hf/ holds the source's files, byte for byte" same_trees "$src" "$mnt/hf" .
  listing=$(ls "$mnt" | tr '\n' ' ')
  ok $([[ $listing == "hf " ]]; echo $?) "$form: the root lists hf/ only (got: $listing)"
  ls "$mnt/tp2pp2" > /dev/null 2>&1
  ok $([[ $? -ne 0 ]]; echo $?) "$form: tp2pp2/ is not there"
  grep -qF "no Megatron views: config.json: " <(grep -F "${why[$form]}" "$WORK/log-$form")
  ok $? "$form: the mount log says why the Megatron views are missing" || sed 's/^/# /' "$WORK/log-$form" >&2
  hf_dirs+=("$mnt/hf")
done

sid_python "$WORK" "$script" logits "$models/v5" "${hf_dirs[@]}" > "$WORK/logits" 2> "$WORK/logits.err"
ok $? "transformers loads the original and each hf/" || tail -n 20 "$WORK/logits.err" | sed 's/^/# /' >&2
while read -r state what; do
  [[ $state == PASS || $state == FAIL ]] && ok "$([[ $state == PASS ]]; echo $?)" "$what"
done < "$WORK/logits"
n=$(grep -c '^PASS\|^FAIL' "$WORK/logits")
ok $((n == ${#hf_dirs[@]} ? 0 : 1)) "a logits check for each of the ${#hf_dirs[@]} hf/ views (got $n)"

for form in v5 modules v4 badvision; do unmount_ckptfs "$WORK/mnt-$form"; done
wait
done_testing
