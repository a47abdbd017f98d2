#!/usr/bin/env bash
# GLM-4.5V (Glm4vMoeForConditionalGeneration; docs/vlm.md): tiny models built and saved by
# transformers 5.12.1 (the sid root), with and without the language model's q/k/v biases and the
# tower's qkv bias, routed with and without groups, the experts as SequentialMLP's and (mbridge's
# moe_grouped_gemm) TEGroupedMLP's. The Megatron views hold mbridge's glm4v_moe
# model: transformers' tower whole under vision_model. on the first stage, the GLM-4.5 language
# model under language_model. with mrope over half of each head. glm45v.py checks each rank file of
# TP, PP with VPP and EP layouts against mbridge's names and args, rebuilds the original from them as
# mbridge exports (bytes), and runs transformers on the rebuilt copy (logits on an image + text
# input, exactly); glm45v_forward.py runs the VLM forward with Megatron semantics over each
# layout's rank files (transformers' tower as mbridge keeps it, mbridge's 3-D positions, TP
# shares, stages, virtual chunks, EP files) to transformers' float32 logits of the source, and
# rejects views with a share, an expert file or a chunk order wrong; mcore/ through
# torch.distributed.checkpoint. Copies of tp2pp2/ and mcore/
# mounted as sources give the same views and hf/ (bytes, logits), as does verl's save of mcore/
# without args (config.json beside); a copy without a tower tensor, and
# a config whose patch size the tensors do not have, are refused by name.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/glm45v.py"
models=$WORK/models

sid_python "$WORK" "$script" build "$models" > "$WORK/build.out" 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves two tiny GLM-4.5V" ||
  { tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2; done_testing; exit; }

declare -A layouts=([glm45v]="tp2pp2 tp1pp2vpp2 tp2pp1ep2" [glm45v-bias]="tp2pp2 tp1pp1ep4")
for form in glm45v glm45v-bias; do
  src=$models/$form mnt=$WORK/mnt-$form
  "$CKPTFS" inspect "$src" > "$WORK/inspect-$form" 2>&1
  # glm45v.py's TEXT and vlm.py's GLM4V_VISION sizes
  grep -q '^megatron: *glm4v_moe rules: 4 layers, hidden 64, 4 heads / 2 query groups, head dim 16' "$WORK/inspect-$form" &&
    grep -q '^vision: *2 blocks of width 32, 2 heads, ffn 48, merger 2x2 into 64, mrope sections 1/1/2: vision_model.\* on the first pipeline stage' "$WORK/inspect-$form"
  ok $? "$form: inspect reads the language model and the tower, and places the tower" ||
    sed 's/^/# /' "$WORK/inspect-$form" >&2
  # shellcheck disable=SC2086
  opts="layouts=$(echo ${layouts[$form]} | tr ' ' ':')"
  [[ $form == glm45v-bias ]] && opts+=",moe_grouped_gemm=on" # the experts as mbridge's bridge builds them
  MOUNT_OPTS=$opts fg_mount "$CKPTFS" "$src" "$mnt" "$WORK/log-$form"
  check "$form: hf/ holds the source's files, byte for byte" same_trees "$src" "$mnt/hf" .
  listing=$(ls "$mnt" | tr '\n' ' ')
  [[ $listing == "hf mcore "* && $listing == *" tp2pp2 "* && $listing == *" tp2pp1ep2 "* ]]
  ok $? "$form: the root lists hf/, mcore/ and the layouts (got: $listing)"
  # copies of tp2pp2/ and mcore/ mounted as sources: the same views and the original's hf/
  cp -r "$mnt/tp2pp2" "$WORK/$form-tp2pp2" && cp -r "$mnt/mcore" "$WORK/$form-mcore"
  ok $? "$form: tp2pp2/ and mcore/ copy out"
  main_pid=$FG_PID copy_pids=()
  for kind in tp2pp2 mcore; do
    copy=$WORK/src-$kind-$form
    MOUNT_OPTS="${opts/${layouts[$form]// /:}/tp2pp2}" fg_mount "$CKPTFS" "$WORK/$form-$kind" "$copy" "$WORK/log-src-$kind-$form"
    copy_pids+=("$FG_PID")
    for view in tp2pp2 mcore; do
      check "$form: the $kind copy's $view/ as a source is the HF source's, file for file" \
        same_trees "$mnt" "$copy" "$view"
    done
  done

  # one process for the form's checks (transformers' import is most of their time)
  args=()
  for l in ${layouts[$form]}; do args+=("$mnt/$l" "$l" "$WORK/rebuilt-$form-$l"); done
  hf_dirs=("$WORK/src-tp2pp2-$form/hf" "$WORK/src-mcore-$form/hf")
  if [[ $form == glm45v ]]; then
    # Megatron-Bridge's tree (-o megatron_names=bridge), and a copy of it as a source
    MOUNT_OPTS="megatron_names=bridge" fg_mount "$CKPTFS" "$src" "$WORK/bridge" "$WORK/log-bridge"
    copy_pids+=("$FG_PID")
    cp -r "$WORK/bridge/tp2pp2" "$WORK/bridge-tp2pp2"
    MOUNT_OPTS="megatron_names=bridge" fg_mount "$CKPTFS" "$WORK/bridge-tp2pp2" "$WORK/src-bridge" "$WORK/log-src-bridge"
    copy_pids+=("$FG_PID")
    args+=("$WORK/bridge/tp2pp2" bridge:tp2pp2 "$WORK/rebuilt-bridge" --mcore "$mnt/mcore/release")
    hf_dirs+=("$WORK/src-bridge/hf")
    # verl's Megatron save, without args: mcore/'s torch_dist in dist_ckpt/, huggingface/config.json
    # beside (the tower and the mrope sections come from it)
    mkdir -p "$WORK/verl/huggingface" && cp "$src/config.json" "$WORK/verl/huggingface/" &&
      $PY "$TESTS_TOP/tests/lib/verl_megatron_data.py" torch-dist "$WORK/$form-mcore/release" "$WORK/verl/dist_ckpt" &&
      MOUNT_OPTS=layouts=tp2pp2 fg_mount "$CKPTFS" "$WORK/verl" "$WORK/src-verl" "$WORK/log-src-verl"
    ok $? "$form: verl's save without args (torch_dist in dist_ckpt/) mounts" || sed 's/^/# /' "$WORK/log-src-verl" >&2
    copy_pids+=("$FG_PID")
    hf_dirs+=("$WORK/src-verl/hf")
  fi
  args+=(--hf "${hf_dirs[@]}")
  sid_python "$WORK" "$script" check "$src" "${args[@]}" > "$WORK/check-$form" 2> "$WORK/check-$form.err"
  for l in ${layouts[$form]}; do
    grep -q "^PASS $mnt/$l $l: .* rank files with mbridge's names and args; ORIG's .* tensors rebuilt from them byte for byte" "$WORK/check-$form"
    ok $? "$form $l: every rank file holds mbridge's names (the tower first, whole) and args; the original rebuilt from them, byte for byte" ||
      { grep " $l" "$WORK/check-$form"; tail -n 5 "$WORK/check-$form.err"; } | sed 's/^/# /' >&2
    grep -q "^PASS $WORK/rebuilt-$form-$l: transformers' logits on an image + text input equal" "$WORK/check-$form"
    ok $? "$form $l: the rebuilt copy gives transformers' logits on an image + text input exactly" ||
      { grep "rebuilt-$form-$l" "$WORK/check-$form"; tail -n 5 "$WORK/check-$form.err"; } | sed 's/^/# /' >&2
    fwd=$(grep "^[A-Z]* $mnt/$l $l: Megatron-semantics VLM forward" "$WORK/check-$form")
    [[ $fwd == "PASS "* ]]
    ok $? "$form $l: ${fwd#*: }" || { echo "${fwd:-no forward verdict}"; tail -n 5 "$WORK/check-$form.err"; } | sed 's/^/# /' >&2
  done
  if [[ $form == glm45v ]]; then
    grep -q "^PASS $mnt/mcore/release: the tower's 27 tensors a key each" "$WORK/check-$form"
    ok $? "$form: mcore/ holds the tower a key per tensor (transformers' shapes, the original's bytes) and the language model" ||
      grep "mcore/release" "$WORK/check-$form" | sed 's/^/# /' >&2
    # torch 1.13 (the host's) loads every rank file of tp2pp2/
    $PY -c 'import sys, torch
for f in sys.argv[1:]: torch.load(f, map_location="cpu")' "$mnt"/tp2pp2/release/*/model_optim_rng.pt 2> "$WORK/t113.err"
    ran $? "$form: torch 1.13 loads every tp2pp2/ rank file" "$WORK/t113.err"
    grep -q "^PASS $WORK/bridge/tp2pp2 tp2pp2: 4 rank files with Megatron-Bridge's names and args; ORIG's .* tensors rebuilt from them byte for byte" "$WORK/check-$form" &&
      grep -q "^PASS $WORK/rebuilt-bridge: transformers' logits on an image + text input equal" "$WORK/check-$form"
    ok $? "$form: megatron_names=bridge: tp2pp2/ with Megatron-Bridge's names (the tower under visual.), rebuilt to the original's bytes and logits" ||
      grep "bridge" "$WORK/check-$form" | sed 's/^/# /' >&2
    grep -q "^PASS $WORK/src-bridge/hf: the .* tensors of $src under the release's names, byte for byte" "$WORK/check-$form" &&
      grep -q "^PASS $WORK/src-bridge/hf: transformers' logits on an image + text input equal" "$WORK/check-$form"
    ok $? "$form: a copy of the bridge tree's tp2pp2/ mounted with megatron_names=bridge: hf/ byte for byte, the original's logits" ||
      grep "src-bridge" "$WORK/check-$form" | sed 's/^/# /' >&2
    "$CKPTFS" inspect "$WORK/bridge-tp2pp2" > "$WORK/inspect-bridge" 2>&1
    grep -q "'vision_model.embeddings.position_embedding.weight' is missing or not a tensor" "$WORK/inspect-bridge"
    ok $? "$form: the bridge tree's copy without the option is refused by name" || sed 's/^/# /' "$WORK/inspect-bridge" >&2
    grep -q "^PASS $WORK/src-verl/hf: the .* tensors of $src under the release's names, byte for byte" "$WORK/check-$form" &&
      grep -q "^PASS $WORK/src-verl/hf: transformers' logits on an image + text input equal" "$WORK/check-$form"
    ok $? "$form: hf/ of verl's save without args: the original's tensors byte for byte, its logits" ||
      grep "src-verl" "$WORK/check-$form" | sed 's/^/# /' >&2
  fi
  for kind in tp2pp2 mcore; do
    copy=$WORK/src-$kind-$form
    grep -q "^PASS $copy/hf: the .* tensors of $src under the release's names, byte for byte" "$WORK/check-$form"
    ok $? "$form: hf/ of the $kind copy holds the original's tensors, byte for byte" ||
      grep "$copy" "$WORK/check-$form" | sed 's/^/# /' >&2
    grep -q "^PASS $copy/hf: transformers' logits on an image + text input equal" "$WORK/check-$form"
    ok $? "$form: transformers loads hf/ of the $kind copy (its config synthesized) to the original's logits" ||
      grep "$copy" "$WORK/check-$form" | sed 's/^/# /' >&2
  done
  copy_mounts=("$WORK/src-tp2pp2-$form" "$WORK/src-mcore-$form")
  [[ $form == glm45v ]] && copy_mounts+=("$WORK/bridge" "$WORK/src-bridge" "$WORK/src-verl")
  for i in "${!copy_mounts[@]}"; do
    FG_PID=${copy_pids[$i]}
    fg_unmount "${copy_mounts[$i]}"
  done
  FG_PID=$main_pid
  fg_unmount "$mnt"
done

# A tp2pp2/ copy without a tower tensor: refused by name.
sid_python "$WORK" "$script" notower "$WORK/glm45v-tp2pp2" "$WORK/notower" > /dev/null 2> "$WORK/notower.err"
"$CKPTFS" inspect "$WORK/notower" > "$WORK/inspect-notower" 2>&1
grep -q "mp_rank_00_000/model_optim_rng.pt: 'vision_model.blocks.1.attn.qkv.weight' is missing or not a tensor" "$WORK/inspect-notower"
ok $? "a tp2pp2/ copy without a tower tensor is refused by name" || sed 's/^/# /' "$WORK/inspect-notower" >&2

# A patch size the tensors do not have: the Megatron views refused by name, hf/ served.
cp -r "$models/glm45v" "$WORK/patch16"
sed -i 's/"patch_size": 14/"patch_size": 16/' "$WORK/patch16/config.json"
"$CKPTFS" inspect "$WORK/patch16" > "$WORK/inspect-patch" 2>&1
grep -q "^megatron: *no Megatron views: tensor 'visual.embeddings.position_embedding.weight' has shape \[16, 32\]; config.json implies \[9, 32\]" "$WORK/inspect-patch"
ok $? "patch16: a patch size the tower's tensors do not have refuses the Megatron views by name" ||
  grep '^megatron' "$WORK/inspect-patch" | sed 's/^/# /' >&2
fg_mount "$CKPTFS" "$WORK/patch16" "$WORK/mnt-patch" "$WORK/log-patch"
check "patch16: hf/ holds the source's files, byte for byte" same_trees "$WORK/patch16" "$WORK/mnt-patch/hf" .
fg_unmount "$WORK/mnt-patch"
done_testing
