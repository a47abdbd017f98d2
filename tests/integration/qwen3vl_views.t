#!/usr/bin/env bash
# Qwen3-VL (docs/vlm.md): a tiny Qwen3VLForConditionalGeneration and a tiny
# Qwen3VLMoeForConditionalGeneration (its experts fused on disk) built and saved by transformers 5
# itself (in the sid root), under the module names its releases use. Each is read as one model:
# the language model from text_config, the tower (learned positions, deepstack mergers) from
# vision_config by its own rows. hf/ serves the whole model (bytes, and transformers' logits on an
# image + text input). tp2pp2/ holds, rank by rank, what mbridge's qwen3_vl bridge tables give
# (vlm.py's reference: the tower with its deepstack mergers on the first stage, the experts per
# expert), its rank files gathered back give the original's logits, and mcore/ read by
# torch.distributed.checkpoint holds the same tensors stacked. The forward computed with Megatron
# semantics from the rank files (tests/lib/qwen_vl_forward.py) of tp2pp2/, tp1pp2vpp2/ and tp2pp1/
# (dense) or tp2pp1ep2/ (MoE) gives transformers' float32 logits, and a mutated copy does not.
# Copies of tp2pp2/ and mcore/ mount back as sources, as do verl's saves of them without args
# (torch_dist in dist_ckpt/, per-rank model.pt files; config.json beside). A vision field no rule reads and
# deepstack blocks out of order are refused by name, hf/ still served.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/vlm.py"
models=$WORK/models

sid_python "$WORK" "$script" build_qwen3 "$models" > "$WORK/build.out" 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves a tiny Qwen3-VL and Qwen3-VL-MoE" ||
  { tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2; done_testing; exit; }

# vlm.py's QWEN3_TEXT and QWEN3_VISION sizes
tower_line='3 blocks of width 32, 2 heads, ffn 48, merger 2x2 into 64, mrope sections 2/3/3: vision_model.* on the first pipeline stage'
declare -A class=([dense]=Qwen3VLForConditionalGeneration [moe]=Qwen3VLMoeForConditionalGeneration)
for form in dense moe; do
  src=$models/$form mnt=$WORK/mnt-$form
  "$CKPTFS" inspect "$src" > "$WORK/inspect-$form" 2>&1
  grep -q "^architecture: ${class[$form]} (model_type qwen3_vl" "$WORK/inspect-$form" &&
    grep -qF "vision:       $tower_line" "$WORK/inspect-$form"
  ok $? "$form: inspect reads the tower from the config's vision part" || sed 's/^/# /' "$WORK/inspect-$form" >&2
  fg_mount "$CKPTFS" "$src" "$mnt" "$WORK/log-$form"
  check "$form: hf/ holds the source's files, byte for byte" same_trees "$src" "$mnt/hf" .
  # the layouts whose TP splits the tower's 2 heads: no tp4
  listing=$(ls "$mnt" | grep -v ep | tr '\n' ' ')
  ok $([[ $listing == "hf mcore tp1pp1 tp1pp2 tp1pp4 tp2pp1 tp2pp2 tp2pp4 " ]]; echo $?) \
    "$form: the root lists hf/, mcore/ and the layouts that split the tower (got: $listing)" || sed 's/^/# /' "$WORK/log-$form" >&2
  cp -r "$mnt/tp2pp2" "$WORK/meg-$form" && cp -r "$mnt/mcore" "$WORK/mcore-$form"
  ok $? "$form: tp2pp2/ and mcore/ copy out"
done
# For the forward check: a virtual pipeline layout of each, TP alone (dense), TP with EP (MoE).
declare -A extra=([dense]="tp1pp2vpp2 tp2pp1" [moe]="tp1pp2vpp2 tp2pp1ep2")
for form in dense moe; do
  for layout in ${extra[$form]}; do
    check "$form: $layout/ copied out" cp -r "$WORK/mnt-$form/$layout" "$WORK/fwd-$form-$layout"
  done
done
# Megatron-Bridge's qwen3_vl bridges name the same tree as mbridge's (docs/vlm.md): under
# -o megatron_names=bridge the views are the same files, byte for byte.
for form in dense moe; do
  MOUNT_OPTS=megatron_names=bridge fg_mount "$CKPTFS" "$models/$form" "$WORK/mnt-bridge-$form" "$WORK/log-bridge-$form"
  check "$form: with -o megatron_names=bridge, tp2pp2/ and mcore/ are mbridge's tree, byte for byte" \
    same_trees "$WORK/mnt-bridge-$form" "$WORK/mnt-$form" tp2pp2 mcore
  fg_unmount "$WORK/mnt-bridge-$form"
done
# The text model read from text_config: vlm.py's sizes, not the defaults. The MoE's text part has
# tie_word_embeddings true under a top-level false (transformers 5 saves it so): the top level's.
for form in dense moe; do
  grep -q '^model: .*num_hidden_layers=4 hidden_size=64 num_attention_heads=4 num_key_value_heads=2 intermediate_size=128 vocab_size=256' "$WORK/inspect-$form"
  ok $? "$form: inspect reads the language model from the config's text part" || grep '^model' "$WORK/inspect-$form" | sed 's/^/# /' >&2
done

sid_python "$WORK" "$script" logits_pairs "$models/dense" "$WORK/mnt-dense/hf" "$models/moe" "$WORK/mnt-moe/hf" \
  > "$WORK/logits" 2> "$WORK/logits.err"
ran $? "transformers loads each original and its hf/" "$WORK/logits.err"
for form in dense moe; do
  grep -q "^PASS $WORK/mnt-$form/hf: " "$WORK/logits" && ! grep -q '^FAIL' "$WORK/logits"
  ok $? "$form: hf/ gives the original's logits on an image + text input, which another image changes" ||
    sed 's/^/# /' "$WORK/logits" >&2
done

# The Megatron views against mbridge's tables (vlm.py q3_views), both models in one process.
sid_python "$WORK" "$script" q3_views "$models/dense" "$WORK/meg-dense" "$WORK/back-dense" "$WORK/mcore-dense/release" \
  "$models/moe" "$WORK/meg-moe" "$WORK/back-moe" "$WORK/mcore-moe/release" > "$WORK/views" 2> "$WORK/views.err"
ran $? "vlm.py checks both models' tp2pp2/ and mcore/" "$WORK/views.err"
for form in dense moe; do
  [[ $(grep -c "^PASS $form tp2pp2 rank ([01], [01]): .* mbridge's names, shapes and bytes; args rope ('mrope', \[2, 3, 3\])" "$WORK/views") == 4 ]]
  ok $? "$form: each rank file of tp2pp2/ holds mbridge's names, shapes and bytes (tower, deepstack mergers, experts), args with mrope" ||
    sed 's/^/# /' "$WORK/views" >&2
  grep -q "^PASS $WORK/back-$form: transformers' logits" "$WORK/views"
  ok $? "$form: tp2pp2/'s rank files gathered back as mbridge exports give the original's logits" || sed 's/^/# /' "$WORK/views" >&2
  grep -q "^PASS $form mcore: the .* tensor keys of mbridge's model, dcp.load gives its tensors bit for bit" "$WORK/views"
  ok $? "$form: mcore/ read by torch.distributed.checkpoint holds mbridge's keys, shapes and tensors" ||
    sed 's/^/# /' "$WORK/views" >&2
done

# The forward with Megatron semantics from the rank files themselves (tests/lib/qwen_vl_forward.py:
# each TP rank's slice of the tower, deepstack mergers and merger, mrope, deepstack added after
# the first layers, the experts from the file of the EP rank holding them) against transformers'
# float32 forward of the original; both models in one process.
sid_python "$WORK" "$TESTS_TOP/tests/lib/qwen_vl_forward.py" check \
  "$models/dense" "$WORK/meg-dense:tp2pp2" "$WORK/fwd-dense-tp1pp2vpp2:tp1pp2vpp2" "$WORK/fwd-dense-tp2pp1:tp2pp1" -- \
  "$models/moe" "$WORK/meg-moe:tp2pp2" "$WORK/fwd-moe-tp1pp2vpp2:tp1pp2vpp2" "$WORK/fwd-moe-tp2pp1ep2:tp2pp1ep2" \
  > "$WORK/forward" 2> "$WORK/forward.err"
ran $? "the Megatron-semantics forward over 3 layouts of each model ran" "$WORK/forward.err"
passes "$WORK/forward"
n=$(grep -c '^PASS\|^FAIL' "$WORK/forward")
ok $((n == 6 ? 0 : 1)) "a forward check for each of the 6 layouts (got $n)"

# Refused by name, hf/ still served: a field of Qwen2.5-VL's tower, deepstack blocks out of order.
declare -A why=([badvision]='vision_config.window_size is not understood'
                [badorder]='vision_config.deepstack_visual_indexes entry 1 (0) does not follow 1')
for bad in badvision badorder; do
  "$CKPTFS" inspect "$models/$bad" > "$WORK/inspect-$bad" 2>&1
  grep -qF "megatron:     no Megatron views: config.json: ${why[$bad]}" "$WORK/inspect-$bad"
  ok $? "$bad: inspect says ${why[$bad]}" || grep '^megatron' "$WORK/inspect-$bad" | sed 's/^/# /' >&2
  fg_mount "$CKPTFS" "$models/$bad" "$WORK/mnt-$bad" "$WORK/log-$bad"
  check "$bad: hf/ holds the source's files, byte for byte" same_trees "$models/$bad" "$WORK/mnt-$bad/hf" .
  fg_unmount "$WORK/mnt-$bad"
done

# A text model's Megatron source named a Qwen3-VL is refused by name (its args have no mrope), not
# read as the VLM's language model alone.
"$CKPTFS" inspect "$TESTDATA/megatron-core-0.17.1/llama-tp2pp2-torch" -o hf_arch=qwen3_vl > "$WORK/inspect-meg" 2>&1
grep -q "args.position_embedding_type is not mrope .*: Qwen3VLForConditionalGeneration's rotary embedding is multimodal" "$WORK/inspect-meg"
ok $? "a text model's Megatron source with -o hf_arch=qwen3_vl is refused by name" || sed 's/^/# /' "$WORK/inspect-meg" >&2

# Megatron sources (docs/vlm.md "Megatron sources"): the copies of tp2pp2/ and mcore/ mounted back,
# their deepstack mergers read back from the module list (rank files) and its axis (torch_dist).
# hf/ holds the original's tensors under the release's names, byte for byte, and transformers
# loads it to the original's logits; their tp2pp2/ and mcore/ are the HF source's, file for file.
for form in dense moe; do
  for kind in meg mcore; do
    fg_mount "$CKPTFS" "$WORK/$kind-$form" "$WORK/src-$kind-$form" "$WORK/log-src-$kind-$form"
    for view in tp2pp2 mcore; do
      check "$form: the $kind source's $view/ is the HF source's, file for file" \
        same_trees "$WORK/mnt-$form" "$WORK/src-$kind-$form" "$view"
    done
  done
done
sid_python "$WORK" "$script" q3_sources "$models/dense" "$WORK/src-meg-dense/hf" "$WORK/src-mcore-dense/hf" \
  "$models/moe" "$WORK/src-mcore-moe/hf" "$WORK/src-meg-moe/hf" > "$WORK/sources" 2> "$WORK/sources.err"
ran $? "vlm.py reads the Megatron sources' hf/" "$WORK/sources.err"
declare -A logits_of=([dense]=meg [moe]=mcore)
for form in dense moe; do
  [[ $(grep -c "^PASS $WORK/src-\(meg\|mcore\)-$form/hf: the 104 tensors of $models/$form under the release's names, byte for byte" "$WORK/sources") == 2 ]]
  ok $? "$form: hf/ of the tp2pp2/ and mcore/ sources holds the original's tensors under the release's names" ||
    sed 's/^/# /' "$WORK/sources" >&2
  grep -q "^PASS $WORK/src-${logits_of[$form]}-$form/hf: transformers' logits on an image + text input equal" "$WORK/sources"
  ok $? "$form: transformers loads the ${logits_of[$form]} source's hf/ to the original's logits" ||
    sed 's/^/# /' "$WORK/sources" >&2
done
for form in dense moe; do for kind in meg mcore; do unmount_ckptfs "$WORK/src-$kind-$form"; done; done

# verl's Megatron saves, without args: the dense model's mcore/ as torch_dist in dist_ckpt/, the
# MoE's tp2pp2/ as per-rank model.pt files, each with huggingface/config.json beside, which gives
# the tower, the deepstack mergers and the mrope sections. hf/ holds the original's tensors and
# gives its logits.
data=$TESTS_TOP/tests/lib/verl_megatron_data.py
declare -A verl_made=([dense]="torch-dist $WORK/mcore-dense/release $WORK/verl-dense/dist_ckpt"
                      [moe]="ranks $WORK/meg-moe $WORK/verl-moe")
pairs=()
for form in dense moe; do
  mkdir -p "$WORK/verl-$form/huggingface" && cp "$models/$form/config.json" "$WORK/verl-$form/huggingface/" &&
    $PY "$data" ${verl_made[$form]} && mount_ckptfs "$WORK/verl-$form" "$WORK/src-verl-$form" 2> "$WORK/err"
  ok $? "$form: verl's save without args (${verl_made[$form]%% *}) mounts" || sed 's/^/# /' "$WORK/err" >&2
  pairs+=("$models/$form" "$WORK/src-verl-$form/hf")
done
sid_python "$WORK" "$script" samehf_pairs "${pairs[@]}" > "$WORK/verl" 2> "$WORK/verl.err" &&
  sid_python "$WORK" "$script" logits_pairs "${pairs[@]}" >> "$WORK/verl" 2>> "$WORK/verl.err"
ran $? "vlm.py reads verl's saves' hf/" "$WORK/verl.err"
passes "$WORK/verl"
check "4 verdicts on verl's saves: tensors and logits of each" test "$(grep -c '^PASS\|^FAIL' "$WORK/verl")" -eq 4
for form in dense moe; do unmount_ckptfs "$WORK/src-verl-$form"; done

# Broken copies (vlm.py q3_broken, written with torch): a deepstack merger removed from a rank
# file, one too many (merger 2 of 2), and mcore/'s stacked mergers cut to one.
mkdir -p "$WORK/broken"
sid_python "$WORK" "$script" q3_broken "$WORK/meg-dense" "$WORK/mcore-dense/release" "$WORK/broken" \
  > "$WORK/broken.out" 2> "$WORK/broken.err"
ran $? "vlm.py writes the broken copies" "$WORK/broken.err"
declare -A refusal=(
  [nomerger]="mp_rank_00_000/model_optim_rng.pt: 'vision_model.decoder.deepstack_merger_list.1.patch_norm.weight' is missing or not a tensor"
  [extramerger]="mp_rank_00_000/model_optim_rng.pt: 6 unexpected model entries: 'vision_model.decoder.deepstack_merger_list.2.patch_norm.weight'"
  [mcore-nomerger]="/.metadata: 'vision_model.decoder.deepstack_merger_list.patch_norm.weight' has shape [1, 128]; the model's args imply [2, 128]")
for kind in nomerger extramerger mcore-nomerger; do
  "$CKPTFS" inspect "$WORK/broken/$kind" > "$WORK/inspect-$kind" 2>&1
  grep -qF "${refusal[$kind]}" "$WORK/inspect-$kind"
  ok $? "$kind: refused by name" || sed 's/^/# /' "$WORK/inspect-$kind" >&2
done

for form in dense moe; do unmount_ckptfs "$WORK/mnt-$form"; done
wait
done_testing
