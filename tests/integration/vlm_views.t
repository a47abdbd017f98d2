#!/usr/bin/env bash
# Vision-language models (docs/vlm.md): a tiny Qwen2.5-VL built and saved by transformers 5 itself
# (in the sid root), in the three forms checkpoints of it come in: transformers 5's config.json
# (text_config nested) with the release's tensor names, the same tensors under transformers >=
# 4.52's module names (model.language_model.*, model.visual.*), and the release's config.json
# (the language model's fields at the top level). Each is read as one model: the language model
# from its text part, the vision tower from its vision part. hf/ serves it whole (bytes and
# transformers' logits on an image + text input); tp2pp2/ holds, rank by rank, the names, shapes
# and bytes of mbridge's Qwen2_5VLModel (checked against mbridge's bridge tables written in
# tests/lib/vlm.py), loads in torch 1.13 and with weights_only in 2.6 and 2.14, and rebuilt into
# Hugging Face tensors the way mbridge exports gives the original's logits; the forward computed
# with Megatron semantics from the rank files of tp2pp2/, tp1pp2vpp2/ and tp2pp1/ (every TP rank
# its own slice of the tower, projector and language model) gives transformers' float32 logits of
# the original, and a mutated copy does not (tests/lib/qwen_vl_forward.py). mcore/ read by
# torch.distributed.checkpoint holds the keys, global shapes and bytes of Megatron-core's
# sharded_state_dict of mbridge's model (the tower's blocks stacked); with -o megatron_names=bridge
# both hold Megatron-Bridge's tree instead (its qwen25_vl tables in vlm.py), and copies of them
# mount back as sources with the same option; verl's Megatron saves without args (torch_dist in
# dist_ckpt/, per-rank model.pt files), config.json beside, mount and their hf/ holds the original's
# tensors and logits; a vision_config with a
# field no rule reads leaves the Megatron views out, named, hf/ still served.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/vlm.py"
models=$WORK/models

sid_python "$WORK" "$script" build "$models" > "$WORK/build.out" 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves a tiny Qwen2.5-VL in three forms" ||
  { tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2; done_testing; exit; }


hf_dirs=()
for form in v5 modules v4; do
  src=$models/$form mnt=$WORK/mnt-$form
  "$CKPTFS" inspect "$src" > "$WORK/inspect-$form" 2>&1
  grep -q '^model: .*num_hidden_layers=4 hidden_size=64 num_attention_heads=4 num_key_value_heads=2 intermediate_size=128 vocab_size=256' "$WORK/inspect-$form"
  ok $? "$form: inspect reads the language model from the config's text part" ||
    sed 's/^/# /' "$WORK/inspect-$form" >&2
  # vlm.py's VISION sizes and mrope_section
  grep -q '^vision: *2 blocks of width 32, 2 heads, ffn 48, merger 2x2 into 64, mrope sections 2/3/3' "$WORK/inspect-$form"
  ok $? "$form: inspect reads the vision tower from the config's vision part" ||
    sed 's/^/# /' "$WORK/inspect-$form" >&2
  fg_mount "$CKPTFS" "$src" "$mnt" "$WORK/log-$form"
  check "$form: hf/ holds the source's files, byte for byte" same_trees "$src" "$mnt/hf" .
  listing=$(ls "$mnt" | tr '\n' ' ')
  # tp4: the tower's 2 heads do not split 4 ways
  ok $([[ $listing == "hf mcore tp1pp1 tp1pp2 tp1pp4 tp2pp1 tp2pp2 tp2pp4 " ]]; echo $?) \
    "$form: the root lists hf/, mcore/ and the layouts whose tp splits the tower (got: $listing)"
  check "$form: mcore/ copied out" cp -r "$mnt/mcore" "$WORK/mcore-$form"
  check "$form: tp2pp2/ copied out" cp -r "$mnt/tp2pp2" "$WORK/meg-$form"
  hf_dirs+=("$mnt/hf")
done
# Virtual pipeline stages: the tower in the first chunk of the first stage.
check "v5: tp1pp2vpp2/ copied out" cp -r "$WORK/mnt-v5/tp1pp2vpp2" "$WORK/meg-vpp"
check "v5: tp2pp1/ copied out" cp -r "$WORK/mnt-v5/tp2pp1" "$WORK/meg-tp2pp1"
ls "$WORK/mnt-v5/tp4pp1" > /dev/null 2>&1
ok $([[ $? -ne 0 ]] && grep -q 'tp 4 does not divide the vision num_heads 2' "$WORK/log-v5"; echo $?) \
  "tp4pp1/ is refused: tp 4 does not divide the tower's heads"

# Megatron sources: the copies of tp2pp2/ and tp1pp2vpp2/ (legacy rank files) and of mcore/
# (torch_dist) mounted back. Their hf/ holds the original's tensors under the release's names
# (byte for byte, below) and a config.json from their args that transformers loads to the
# original's logits (in the logits check); their Megatron views equal the HF source's.
for src in meg-v5 meg-vpp mcore-v5; do
  fg_mount "$CKPTFS" "$WORK/$src" "$WORK/mnt-$src" "$WORK/log-$src"
  ok $? "$src: the Megatron copy mounts as a source" || sed 's/^/# /' "$WORK/log-$src" >&2
  hf_dirs+=("$WORK/mnt-$src/hf")
done
# Megatron-Bridge's names (-o megatron_names=bridge): the tower as its qwen25_vl bridge keeps it,
# transformers' module under visual., whole on every rank, so it limits no TP degree. Its copies
# mount back with the same option (their hf/ checked with the others' below).
BRIDGE=megatron_names=bridge
MOUNT_OPTS=$BRIDGE fg_mount "$CKPTFS" "$models/v5" "$WORK/mnt-bridge" "$WORK/log-bridge"
listing=$(ls "$WORK/mnt-bridge" | tr '\n' ' ')
ok $([[ $listing == "hf mcore tp1pp1 tp1pp2 tp1pp4 tp2pp1 tp2pp2 tp2pp4 tp4pp1 tp4pp2 tp4pp4 " ]]; echo $?) \
  "bridge: the root lists tp4 too, the tower whole on every rank (got: $listing)" || sed 's/^/# /' "$WORK/log-bridge" >&2
check "bridge: tp2pp2/ copied out" cp -r "$WORK/mnt-bridge/tp2pp2" "$WORK/meg-bridge"
check "bridge: mcore/ copied out" cp -r "$WORK/mnt-bridge/mcore" "$WORK/mcore-bridge"
for src in meg-bridge mcore-bridge; do
  MOUNT_OPTS=$BRIDGE fg_mount "$CKPTFS" "$WORK/$src" "$WORK/mnt-$src" "$WORK/log-$src"
  ok $? "$src: the Megatron-Bridge copy mounts as a source with -o $BRIDGE" || sed 's/^/# /' "$WORK/log-$src" >&2
  hf_dirs+=("$WORK/mnt-$src/hf")
done
# verl's Megatron saves of the VLM carry no args: torch_dist in dist_ckpt/ beside huggingface/
# (2025-26), and per-rank model.pt files holding a list of chunk state dicts (2025; here of
# tp1pp2vpp2). The tower's sizes and the mrope sections come from the config.json saved beside.
data=$TESTS_TOP/tests/lib/verl_megatron_data.py
mkdir -p "$WORK/verl-dist/huggingface" "$WORK/verl-ranks/huggingface"
cp "$models/v5/config.json" "$WORK/verl-dist/huggingface/" && cp "$models/v5/config.json" "$WORK/verl-ranks/huggingface/"
check "verl-dist: torch_dist without args in dist_ckpt/ (verl_megatron_data.py)" \
  $PY "$data" torch-dist "$WORK/mcore-v5/release" "$WORK/verl-dist/dist_ckpt"
check "verl-ranks: per-rank model.pt files of tp1pp2vpp2 without args" $PY "$data" ranks "$WORK/meg-vpp" "$WORK/verl-ranks"
for src in verl-dist verl-ranks; do
  "$CKPTFS" inspect "$WORK/$src" > "$WORK/inspect-$src" 2>&1
  grep -q '^format: *verl-megatron' "$WORK/inspect-$src" && grep -q '^vision: .* mrope sections 2/3/3' "$WORK/inspect-$src"
  ok $? "$src: inspect reads verl's save, the tower and the mrope sections from huggingface/config.json" ||
    sed 's/^/# /' "$WORK/inspect-$src" >&2
  fg_mount "$CKPTFS" "$WORK/$src" "$WORK/mnt-$src" "$WORK/log-$src"
  ok $? "$src: mounts as a source" || sed 's/^/# /' "$WORK/log-$src" >&2
  hf_dirs+=("$WORK/mnt-$src/hf")
done
sid_python "$WORK" "$script" bridge_views "$models/v5" "$WORK/meg-bridge" "$WORK/mcore-bridge/release" \
  > "$WORK/bridge" 2> "$WORK/bridge.err"
ran $? "the checks of tp2pp2/ and mcore/ against Megatron-Bridge's qwen25_vl tables ran" "$WORK/bridge.err"
passes "$WORK/bridge"
n=$(grep -c '^PASS\|^FAIL' "$WORK/bridge")
ok $((n == 6 ? 0 : 1)) "a check for each of the 4 rank files and two of mcore/ (got $n)"
"$CKPTFS" inspect "$WORK/meg-bridge" > "$WORK/inspect-meg-bridge" 2>&1
ok $([[ $? -ne 0 ]] && grep -q "'vision_model.patch_embed.proj.weight' is missing" "$WORK/inspect-meg-bridge"; echo $?) \
  "meg-bridge: without the option the copy is read by mbridge's names and refused, the tensor named"

sid_python "$WORK" "$script" samehf "$models/v5" "$WORK"/mnt-{meg-v5,meg-vpp,mcore-v5,meg-bridge,mcore-bridge,verl-dist,verl-ranks}/hf > "$WORK/samehf" 2> "$WORK/samehf.err"
ran $? "the hf/ checks of the Megatron sources ran" "$WORK/samehf.err"
passes "$WORK/samehf"
n=$(grep -c '^PASS\|^FAIL' "$WORK/samehf")
ok $((n == 7 ? 0 : 1)) "an hf/ check for each Megatron source (got $n)"
# same_view A B VIEW: B's VIEW holds A's files (some), each byte for byte.
same_view() {
  local want got
  want=$(cd "$1/$3" && find . -type f | sort) got=$(cd "$2/$3" 2> /dev/null && find . -type f | sort)
  [[ -n $want && $want == "$got" ]] || { echo "files differ: $want / $got"; return 1; }
  same_trees "$1" "$2" "$3"
}
for src in meg-v5 mcore-v5; do
  for view in tp2pp2 tp1pp2vpp2 mcore; do
    check "$src: $view/ equals the HF source's, file for file" same_view "$WORK/mnt-v5" "$WORK/mnt-$src" "$view"
  done
done
for src in meg-bridge mcore-bridge; do
  for view in tp2pp2 mcore; do
    check "$src: $view/ equals the HF source's with -o $BRIDGE, file for file" same_view "$WORK/mnt-bridge" "$WORK/mnt-$src" "$view"
  done
done

# The rank files against mbridge's names, shapes and bytes; rebuilt as mbridge exports them.
pairs=()
for form in v5 modules v4; do pairs+=("$WORK/meg-$form:2:2:1" "$WORK/back-$form"); done
pairs+=("$WORK/meg-vpp:1:2:2" "$WORK/back-vpp")
sid_python "$WORK" "$script" megatron "$models/v5" "${pairs[@]}" > "$WORK/megatron" 2> "$WORK/megatron.err"
ran $? "the tp2pp2 and tp1pp2vpp2 checks ran, and rebuilt each copy into Hugging Face tensors as mbridge exports" "$WORK/megatron.err"
passes "$WORK/megatron"
n=$(grep -c '^PASS\|^FAIL' "$WORK/megatron")
ok $((n == 14 ? 0 : 1)) "a check for each rank file: 4 of each tp2pp2 copy, 2 of tp1pp2vpp2 (got $n)"
for form in v5 modules v4 vpp; do [[ -d $WORK/back-$form ]] && hf_dirs+=("$WORK/back-$form"); done

# The forward with Megatron semantics from the rank files themselves (tests/lib/qwen_vl_forward.py:
# each TP rank's slice of the tower and projector, the image rows in the embeddings, mrope, the
# stages and chunks in Megatron's order) against transformers' float32 forward of the original.
sid_python "$WORK" "$TESTS_TOP/tests/lib/qwen_vl_forward.py" check "$models/v5" \
  "$WORK/meg-v5:tp2pp2" "$WORK/meg-vpp:tp1pp2vpp2" "$WORK/meg-tp2pp1:tp2pp1" > "$WORK/forward" 2> "$WORK/forward.err"
ran $? "the Megatron-semantics forward over tp2pp2/, tp1pp2vpp2/ and tp2pp1/ ran" "$WORK/forward.err"
passes "$WORK/forward"
n=$(grep -c '^PASS\|^FAIL' "$WORK/forward")
ok $((n == 3 ? 0 : 1)) "a forward check for each of the 3 layouts (got $n)"

sid_python "$WORK" "$script" logits "$models/v5" "${hf_dirs[@]}" > "$WORK/logits" 2> "$WORK/logits.err"
ran $? "transformers loads the original, each hf/ and each rebuilt copy" "$WORK/logits.err"
passes "$WORK/logits"
n=$(grep -c '^PASS\|^FAIL' "$WORK/logits")
ok $((n == ${#hf_dirs[@]} ? 0 : 1)) "a logits check for each of the ${#hf_dirs[@]} copies (got $n)"

# mcore/ of each form read by torch.distributed.checkpoint (torch 2.14) against mbridge's
# tensors stacked as Megatron-core's sharded_state_dict keys them.
mcores=()
for form in v5 modules v4; do mcores+=("$form=$WORK/mcore-$form/release"); done
sid_python "$WORK" "$script" mcore "$models/v5" "${mcores[@]}" > "$WORK/mcore" 2> "$WORK/mcore.err"
ran $? "the mcore/ checks ran" "$WORK/mcore.err"
passes "$WORK/mcore"
n=$(grep -c '^PASS\|^FAIL' "$WORK/mcore")
ok $((n == 6 ? 0 : 1)) "two mcore/ checks for each form (got $n)"

# torch 1.13 here (without weights_only: its restricted unpickler has no float opcode, which
# checkpoint_version 3.0 needs in every Megatron rank file), torch 2.6 in the Debian 13 root with
# weights_only=True (allowing the args Namespace, as Megatron does); 2.14 did above.
cat > "$WORK/load.py" <<'PY'
import argparse, sys, torch
restricted = hasattr(torch.serialization, "add_safe_globals")
if restricted:
    torch.serialization.add_safe_globals([argparse.Namespace])
for path in sys.argv[1:]:
    sd = torch.load(path, map_location="cpu", weights_only=restricted)
    assert any(k.startswith("vision_model.") for k in sd["model"]) == ("_000/" in path), path
print("loaded", len(sys.argv) - 1, "weights_only" if restricted else "")
PY
out=$($PY "$WORK/load.py" "$WORK"/meg-v4/release/*/model_optim_rng.pt 2>&1)
ok $([[ $out == "loaded 4 " ]]; echo $?) "torch $($PY -c 'import torch; print(torch.__version__)' 2>/dev/null) loads every rank file of tp2pp2/, the tower on the first stage only ($out)"
if torch2_available; then
  out=$(torch2_python "$WORK" "$WORK/load.py" "$WORK"/meg-v5/release/*/model_optim_rng.pt 2>&1)
  ok $([[ $out == "loaded 4 weights_only" ]]; echo $?) "torch 2.6 loads every rank file of tp2pp2/ with weights_only=True, the tower on the first stage only ($out)"
else
  skip "torch 2.6: $TORCH2_WHY"
fi

# Broken Megatron copies: refused by name, not misread.
sid_python "$WORK" "$script" broken "$WORK/meg-v5" "$WORK/broken" > /dev/null 2> "$WORK/broken.err"
ran $? "vlm.py writes the broken copies" "$WORK/broken.err"
refused() { # NAME PATTERN WHAT
  "$CKPTFS" inspect "$WORK/broken/$1" > "$WORK/inspect-$1" 2>&1
  ok $([[ $? -ne 0 ]] && grep -q "$2" "$WORK/inspect-$1"; echo $?) "$1: $3" || sed 's/^/# /' "$WORK/inspect-$1" >&2
}
refused notower "mp_rank_00_000/model_optim_rng.pt: 'vision_model.decoder.layers.1.mlp.linear_fc2.weight' is missing" \
  "a rank file without a tower tensor is refused, the tensor named"
refused whole "'vision_model.decoder.layers.0.self_attention.linear_qkv.weight' has shape \[96, 32\]; the args imply \[48, 32\]" \
  "a tower tensor not split as the args say is refused, with both shapes"
refused noargs "args.hf_vision_config is missing: Megatron's args hold no vision tower" \
  "args without the vision tower's fields are refused by name"
MOUNT_OPTS=hf_config=$models/v5/config.json fg_mount "$CKPTFS" "$WORK/broken/noargs" "$WORK/mnt-noargs" "$WORK/log-noargs"
check "noargs: with -o hf_config, hf/ holds the same tensors as with the vision fields in args" \
  cmp "$WORK/mnt-meg-v5/hf/model.safetensors" "$WORK/mnt-noargs/hf/model.safetensors"
fg_unmount "$WORK/mnt-noargs"

# spec=local: the tower has no local names, so mcore/ is left out like the rank files, and says why.
MOUNT_OPTS=spec=local fg_mount "$CKPTFS" "$models/v5" "$WORK/mnt-local" "$WORK/log-local"
listing=$(ls "$WORK/mnt-local" | tr '\n' ' ')
ls "$WORK/mnt-local/mcore" > /dev/null 2>&1
ok $([[ $? -ne 0 && $listing == "hf " ]] &&
     grep -q "spec=local: Qwen2_5_VLForConditionalGeneration's vision tower has Megatron names for the TE spec only" "$WORK/log-local"; echo $?) \
  "spec=local: the root lists hf/ only (got: $listing), and mcore/'s lookup logs why" || sed 's/^/# /' "$WORK/log-local" >&2
fg_unmount "$WORK/mnt-local"

# A vision field no rule reads: named, the Megatron views left out, hf/ served.
"$CKPTFS" inspect "$models/badvision" > "$WORK/inspect-bad" 2>&1
grep -q '^megatron: .*vision_config.window_attention_kind is not understood' "$WORK/inspect-bad"
ok $? "badvision: inspect names the vision field no rule reads" || grep '^megatron' "$WORK/inspect-bad" | sed 's/^/# /' >&2
fg_mount "$CKPTFS" "$models/badvision" "$WORK/mnt-bad" "$WORK/log-bad"
check "badvision: hf/ holds the source's files, byte for byte" same_trees "$models/badvision" "$WORK/mnt-bad/hf" .
listing=$(ls "$WORK/mnt-bad" | tr '\n' ' ')
ok $([[ $listing == "hf " ]]; echo $?) "badvision: the root lists hf/ only (got: $listing)"
ls "$WORK/mnt-bad/tp2pp2" > /dev/null 2>&1
grep -q 'no Megatron views: config.json: vision_config.window_attention_kind is not understood' "$WORK/log-bad"
ok $? "badvision: the mount log says why tp2pp2/ is missing" || sed 's/^/# /' "$WORK/log-bad" >&2
fg_unmount "$WORK/mnt-bad"

for form in v5 modules v4 meg-v5 meg-vpp mcore-v5 bridge meg-bridge mcore-bridge verl-dist verl-ranks; do
  unmount_ckptfs "$WORK/mnt-$form"
done
wait
done_testing
