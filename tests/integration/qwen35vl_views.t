#!/usr/bin/env bash
# Qwen3.5's releases' VLM form (Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration;
# docs/vlm.md): tiny models built and saved by transformers 5.12.1 (the sid root), the tensors
# under the module names (model.language_model.*, model.visual.*, lm_head.*). Each is read as one
# model: the hybrid language model from text_config (its interleaved mrope), the tower from
# vision_config by Qwen3-VL's rows, without the deepstack list. hf/ is served as saved (bytes, and
# transformers' logits on an image + text input). tp2pp2/ and mcore/ hold mbridge's qwen3_5 model:
# the tower as transformers' own module under vision_model., whole on every rank of the first
# stage, the language model under language_model. with mrope's sections in the args
# (qwen35vl.py views: transformers' vision module's state dict and gdn_reference.py's bridge
# tables, not ckptfs's rules). Copies of those views mounted as sources (the tower read back by
# its own names, blocks.N.) give the original's tensors in hf/ and the HF source's views; a copy
# without a tower tensor is refused by name, as are Qwen3-VL's deepstack_visual_indexes in the
# tower's config and spec=local.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/qwen35vl.py"
models=$WORK/models

sid_python "$WORK" "$script" build "$models" > "$WORK/build.out" 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves a tiny Qwen3.5 VLM, dense and MoE" ||
  { tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2; done_testing; exit; }

check_args=()
declare -A daemon # each mount's daemon, for fg_unmount to wait for
for form in dense moe; do
  src=$models/$form
  class=Qwen3_5ForConditionalGeneration
  [[ $form == moe ]] && class=Qwen3_5MoeForConditionalGeneration
  "$CKPTFS" inspect "$src" > "$WORK/inspect-$form" 2>&1
  # qwen35vl.py's TEXT and VISION sizes
  grep -q "^architecture: $class (model_type qwen3_5" "$WORK/inspect-$form" &&
    grep -q '^model: .*num_hidden_layers=4 hidden_size=64 num_attention_heads=4 num_key_value_heads=2 intermediate_size=128 vocab_size=256' "$WORK/inspect-$form" &&
    grep -q '^layers: *LALA ' "$WORK/inspect-$form"
  ok $? "$form: inspect reads the architecture and the hybrid language model from the config's text part" ||
    sed 's/^/# /' "$WORK/inspect-$form" >&2
  grep -q '^vision: *2 blocks of width 32, 2 heads, ffn 48, merger 2x2 into 64, mrope sections 2/1/1: vision_model.\* on the first pipeline stage' "$WORK/inspect-$form"
  ok $? "$form: inspect reads the tower by Qwen3-VL's rows and the mrope sections" ||
    sed 's/^/# /' "$WORK/inspect-$form" >&2

  mnt=$WORK/mnt-$form
  fg_mount "$CKPTFS" "$src" "$mnt" "$WORK/log-$form"
  daemon[mnt-$form]=$FG_PID
  check "$form: hf/ holds the source's files, byte for byte" same_trees "$src" "$mnt/hf" .
  listing=$(ls "$mnt" | tr '\n' ' ')
  [[ $listing == "hf mcore tp1pp1 "* && $listing == *" tp2pp2 "* && $listing != *tp4* ]]
  ok $? "$form: the root lists hf/, mcore/ and the layouts whose TP splits the delta-net heads (got: $listing)"
  cp -r "$mnt/tp2pp2" "$WORK/$form-tp2pp2" && cp -r "$mnt/mcore" "$WORK/$form-mcore"
  ok $? "$form: tp2pp2/ and mcore/ copy out"
  # the copies mounted as sources: their views are the HF source's, file for file
  for kind in tp2pp2 mcore; do
    fg_mount "$CKPTFS" "$WORK/$form-$kind" "$WORK/src-$kind-$form" "$WORK/log-src-$kind-$form"
    daemon[src-$kind-$form]=$FG_PID
    for view in tp2pp2 mcore; do
      check "$form: the $kind copy's $view/ as a source is the HF source's, file for file" \
        same_trees "$mnt" "$WORK/src-$kind-$form" "$view"
    done
  done
  check_args+=("$src" "$mnt/hf" "$WORK/$form-tp2pp2" "$WORK/$form-mcore/release" "$WORK/lm-$form"
               "$WORK/src-tp2pp2-$form/hf" "$WORK/src-mcore-$form/hf" "$WORK/$form-notower")
done

# one process for both models' checks (transformers' import is most of its time)
sid_python "$WORK" "$script" check "${check_args[@]}" > "$WORK/views" 2> "$WORK/views.err"
for form in dense moe; do
  for mnt in mnt-$form src-tp2pp2-$form src-mcore-$form; do
    FG_PID=${daemon[$mnt]}
    fg_unmount "$WORK/$mnt"
  done
  grep -q "^PASS $WORK/mnt-$form/hf: transformers' logits on an image + text input equal" "$WORK/views"
  ok $? "$form: hf/ gives the original's logits on an image + text input" ||
    { cat "$WORK/views"; tail -n 20 "$WORK/views.err"; } | sed 's/^/# /' >&2
  grep -q "^PASS $WORK/$form-tp2pp2: .* entries of the tower and the language model as mbridge's qwen3_5 bridge has them" "$WORK/views"
  ok $? "$form: each tp2pp2/ rank file holds mbridge's names, in order, with the bridge's bytes, and mrope's args" ||
    { cat "$WORK/views"; tail -n 20 "$WORK/views.err"; } | sed 's/^/# /' >&2
  grep -q "^PASS $WORK/$form-mcore/release: the .* tensor keys of mbridge's qwen3_5 model" "$WORK/views"
  ok $? "$form: mcore/ holds mbridge's keys (the tower a key per tensor), global shapes and bytes" ||
    grep "$form-mcore" "$WORK/views" | sed 's/^/# /' >&2
  [[ $(grep -c "^PASS $WORK/src-\(tp2pp2\|mcore\)-$form/hf: the .* tensors of $models/$form under the release's names, byte for byte" "$WORK/views") == 2 ]]
  ok $? "$form: hf/ of the tp2pp2/ and mcore/ copies as sources holds the original's tensors, byte for byte" ||
    grep "src-.*-$form" "$WORK/views" | sed 's/^/# /' >&2
  grep -q "^PASS $WORK/src-tp2pp2-$form/hf: transformers' logits on an image + text input equal" "$WORK/views"
  ok $? "$form: transformers loads hf/ of the tp2pp2/ copy as a source (its config synthesized) to the original's logits" ||
    grep "src-.*-$form" "$WORK/views" | sed 's/^/# /' >&2
  "$CKPTFS" inspect "$WORK/$form-notower" > "$WORK/inspect-copy" 2>&1
  grep -q "mp_rank_00_000/model_optim_rng.pt: 'vision_model.blocks.1.attn.qkv.weight' is missing or not a tensor" "$WORK/inspect-copy"
  ok $? "$form: a tp2pp2/ copy without a tower tensor is refused by name" ||
    sed 's/^/# /' "$WORK/inspect-copy" >&2
done

# The MoE's experts fused on disk, as the releases and transformers hold them: the same views.
fg_mount "$CKPTFS" "$models/moe-fused" "$WORK/mnt-fused" "$WORK/log-fused"
check "moe-fused: tp2pp2/ is the per-expert source's, byte for byte" same_trees "$WORK/moe-tp2pp2" "$WORK/mnt-fused/tp2pp2" .
check "moe-fused: mcore/ is the per-expert source's, byte for byte" same_trees "$WORK/moe-mcore" "$WORK/mnt-fused/mcore" .
fg_unmount "$WORK/mnt-fused"

# Qwen3-VL's deepstack list is no field of Qwen3.5's tower: named, hf/ served.
"$CKPTFS" inspect "$models/deepstack" > "$WORK/inspect-bad" 2>&1
grep -q '^megatron: .*vision_config.deepstack_visual_indexes is not understood' "$WORK/inspect-bad"
ok $? "deepstack: inspect names the vision field no rule reads" || grep '^megatron' "$WORK/inspect-bad" | sed 's/^/# /' >&2
fg_mount "$CKPTFS" "$models/deepstack" "$WORK/mnt-bad" "$WORK/log-bad"
check "deepstack: hf/ holds the source's files, byte for byte" same_trees "$models/deepstack" "$WORK/mnt-bad/hf" .
listing=$(ls "$WORK/mnt-bad" | tr '\n' ' ')
ok $([[ $listing == "hf " ]]; echo $?) "deepstack: the root lists hf/ only (got: $listing)"
fg_unmount "$WORK/mnt-bad"

"$CKPTFS" ls "$models/dense" tp2pp2 -o spec=local > "$WORK/ls-local" 2>&1
grep -q "spec=local: Qwen3_5ForConditionalGeneration's vision tower has Megatron names for the TE spec only" "$WORK/ls-local"
ok $? "spec=local is refused by name" || sed 's/^/# /' "$WORK/ls-local" >&2

# A text model's Megatron checkpoint said to be Qwen3.5's VLM: refused by name (no delta-net layers).
"$CKPTFS" inspect "$TESTDATA/megatron-core-0.17.1/llama-tp2pp2-torch" -o hf_arch=qwen3_5 > "$WORK/inspect-meg" 2>&1
grep -q 'option hf_arch: architecture Qwen3_5ForConditionalGeneration has gated delta-net layers but the checkpoint does not' "$WORK/inspect-meg"
ok $? "hf_arch=qwen3_5 on a text model's Megatron checkpoint is refused by name" || sed 's/^/# /' "$WORK/inspect-meg" >&2
done_testing
