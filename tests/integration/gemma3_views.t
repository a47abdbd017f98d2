#!/usr/bin/env bash
# Gemma 3's text model (docs/families.md): a tiny Gemma3ForCausalLM built and saved by transformers
# 5 itself (in the sid root: five sliding layers and a full one, a head_dim of its own, two rope
# bases, query_pre_attn_scalar, tied embeddings, random norms). hf/ serves it byte for byte;
# tp2pp2/ and tp2pp1/ hold, rank by rank, the names, shapes and bytes of Megatron-Bridge's Gemma 3
# GPTModel (post-norms as linear_proj's and linear_fc2's post_layernorm; checked against the
# bridge's table written in tests/lib/gemma3.py) with the args Gemma 3 needs, and rebuilt into
# Hugging Face tensors as the bridge exports give transformers' logits back exactly; mcore/ read
# by torch.distributed.checkpoint holds the bridge's keys, shapes and bytes. tp2pp2/, tp2pp1/ and
# tp1pp2/ run with Megatron semantics rank by rank (gemma3_forward.py) give transformers' float32
# logits, and a copy with two TP shares exchanged does not. Soft-capping, bidirectional attention
# and a layer pattern Megatron cannot say are refused by name (hf/ still served); spec=local is
# refused (the post-norms exist in TE's linears only).
# Gemma 3's VLM (Gemma3ForConditionalGeneration, docs/vlm.md): a tiny one saved by transformers 5 is
# read as one model (text_config, the SigLIP tower's rows); hf/ serves it (bytes, logits on an
# image + text input); tp2pp2/ holds, rank by rank, mbridge's Gemma3Model (checked against its
# gemma3 bridge's tables written in tests/lib/gemma3.py), rebuilt as mbridge exports it gives the
# logits back, mcore/ read by torch.distributed.checkpoint holds its keys, shapes and bytes;
# tp2pp2/, tp2pp1/ and tp1pp2/ run with Megatron semantics rank by rank (the tower and projector on
# the first stage, each image seen whole by its own tokens) give transformers' float32 logits on an
# image + text input, and a copy with the tower's first qkv shares exchanged does not; the
# releases' tensor names give the same rank files; vpp is refused (mbridge builds none); vision
# fields no rule reads or whose math the rules cannot say are named.
# Megatron sources: copies of both models' tp2pp2/ and mcore/ (and the VLM's rank files without
# args, its config.json given) mount and serve the HF source's views file for file; their hf/
# holds the original's tensors (the VLM's under the releases' names) and gives transformers'
# logits exactly; args without rope_local_base_freq are refused by name.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/gemma3.py"
models=$WORK/models

sid_python "$WORK" "$script" build "$models" > "$WORK/build.out" 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves a tiny Gemma3ForCausalLM" ||
  { tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2; done_testing; exit; }


src=$models/text mnt=$WORK/mnt src_text=$models/text
"$CKPTFS" inspect "$src" > "$WORK/inspect" 2>&1
grep -q '^math: .*activation=gelu_pytorch_tanh .*sliding_window=4 (one full-attention layer in 6) .*rope_local_theta=5000 query_pre_attn_scalar=20' "$WORK/inspect"
ok $? "inspect reads Gemma 3's activation, window pattern, local rope base and query scalar" ||
  sed 's/^/# /' "$WORK/inspect" >&2
fg_mount "$CKPTFS" "$src" "$mnt" "$WORK/log"
check "hf/ holds the source's files, byte for byte" same_trees "$src" "$mnt/hf" .
listing=$(ls "$mnt" | tr '\n' ' ')
ok $([[ $listing == "hf mcore tp1pp1 tp1pp2 tp2pp1 tp2pp2 tp4pp1 tp4pp2 " ]]; echo $?) \
  "the root lists hf/, mcore/ and the layouts (got: $listing)"
check "tp2pp2/ copied out" cp -r "$mnt/tp2pp2" "$WORK/meg-tp2pp2"
check "tp2pp1/ copied out" cp -r "$mnt/tp2pp1" "$WORK/meg-tp2pp1"
check "tp1pp2/ copied out" cp -r "$mnt/tp1pp2" "$WORK/meg-tp1pp2"
check "mcore/ copied out" cp -r "$mnt/mcore" "$WORK/mcore"

# The 1B release's spelling of config.json (no tie_word_embeddings: transformers ties by default)
# is the same model: the same rank files, and transformers' logits below.
fg_mount "$CKPTFS" "$models/release" "$WORK/mnt-release" "$WORK/log-release"
check "release spelling: tp2pp1/ is byte for byte the v5 spelling's" cmp "$WORK/mnt-release/tp2pp1/release/mp_rank_00/model_optim_rng.pt" "$WORK/meg-tp2pp1/release/mp_rank_00/model_optim_rng.pt"
fg_unmount "$WORK/mnt-release"

sid_python "$WORK" "$script" check "$src" "$WORK/mcore/release" "$mnt/hf,$models/release" "$WORK/meg-tp2pp2:2:2" \
  "$WORK/back-tp2pp2" "$WORK/meg-tp2pp1:2:1" "$WORK/back-tp2pp1" > "$WORK/check" 2> "$WORK/check.err"
ran $? "the checks ran: rank files, each rebuilt as the bridge exports, logits, mcore/" "$WORK/check.err"
passes "$WORK/check"
n=$(grep -c '^PASS\|^FAIL' "$WORK/check")
# 4 rank files of tp2pp2, 2 of tp2pp1; logits of hf/, the release spelling and the 2 rebuilt
# copies; 2 of mcore/
ok $((n == 12 ? 0 : 1)) "12 checks: each rank file, 4 logits, 2 of mcore/ (got $n)"
fg_unmount "$mnt"

# spec=local: Megatron-Bridge's Gemma 3 layers exist with Transformer Engine only.
MOUNT_OPTS=spec=local fg_mount "$CKPTFS" "$src" "$WORK/mnt-local" "$WORK/log-local"
listing=$(ls "$WORK/mnt-local" | tr '\n' ' ')
ls "$WORK/mnt-local/tp2pp1" > /dev/null 2>&1
ok $([[ $? -ne 0 && $listing == "hf " ]] &&
     grep -q "spec=local: Gemma3ForCausalLM's Megatron layers exist with Transformer Engine only" "$WORK/log-local"; echo $?) \
  "spec=local: the root lists hf/ only (got: $listing), and tp2pp1/'s lookup logs why" || sed 's/^/# /' "$WORK/log-local" >&2
fg_unmount "$WORK/mnt-local"

# Fields that change the math and have no Megatron equivalent: named, hf/ still served.
for bad in "softcap:final_logit_softcapping 30 has no Megatron equivalent" \
           "pattern:layer_types entry 4 is 'full_attention': Megatron's window_attn_skip_freq 6 has sliding_attention there" \
           "bidirectional:use_bidirectional_attention true has no Megatron equivalent"; do
  form=${bad%%:*} why=${bad#*:}
  "$CKPTFS" inspect "$models/$form" > "$WORK/inspect-$form" 2>&1
  grep -qF "megatron:     no Megatron views: config.json: $why" "$WORK/inspect-$form"
  ok $? "$form: inspect names the field ($why)" || grep '^megatron' "$WORK/inspect-$form" | sed 's/^/# /' >&2
done
fg_mount "$CKPTFS" "$models/softcap" "$WORK/mnt-bad" "$WORK/log-bad"
check "softcap: hf/ holds the source's files, byte for byte" same_trees "$models/softcap" "$WORK/mnt-bad/hf" .
listing=$(ls "$WORK/mnt-bad" | tr '\n' ' ')
ok $([[ $listing == "hf " ]]; echo $?) "softcap: the root lists hf/ only (got: $listing)"
fg_unmount "$WORK/mnt-bad"

# Gemma 3's VLM: read as one model; its Megatron views hold mbridge's Gemma3Model.
sid_python "$WORK" "$script" build-vlm "$models" > "$WORK/build-vlm.out" 2> "$WORK/build-vlm.err"
ran $? "transformers 5 builds and saves a tiny Gemma3ForConditionalGeneration" "$WORK/build-vlm.err"
src=$models/vlm mnt=$WORK/mnt-vlm
"$CKPTFS" inspect "$src" > "$WORK/inspect-vlm" 2>&1
# gemma3.py's TEXT sizes, from text_config
grep -q '^model: .*num_hidden_layers=6 hidden_size=64 num_attention_heads=4 num_key_value_heads=2 intermediate_size=96 vocab_size=256' "$WORK/inspect-vlm"
ok $? "vlm: inspect reads the language model from the config's text part" || sed 's/^/# /' "$WORK/inspect-vlm" >&2
# gemma3.py's VISION and VLM sizes, read by the SigLIP rows
grep -qF 'vision:       2 blocks of width 32, 2 heads, ffn 48, 32x32 images in patches of 8, pooled to 4 tokens: vision_model.* on the first pipeline stage, after language_model.*' "$WORK/inspect-vlm"
ok $? "vlm: inspect reads the SigLIP tower's rows" || sed 's/^/# /' "$WORK/inspect-vlm" >&2
fg_mount "$CKPTFS" "$src" "$mnt" "$WORK/log-vlm"
check "vlm: hf/ holds the source's files, byte for byte" same_trees "$src" "$mnt/hf" .
listing=$(ls "$mnt" | tr '\n' ' ')
# the tower's 2 heads allow tp 1 and 2
ok $([[ $listing == "hf mcore tp1pp1 tp1pp2 tp2pp1 tp2pp2 " ]]; echo $?) "vlm: the root lists hf/, mcore/ and the layouts that split the tower (got: $listing)"
check "vlm: tp2pp2/ copied out" cp -r "$mnt/tp2pp2" "$WORK/vlm-tp2pp2"
check "vlm: tp2pp1/ copied out" cp -r "$mnt/tp2pp1" "$WORK/vlm-tp2pp1"
check "vlm: tp1pp2/ copied out" cp -r "$mnt/tp1pp2" "$WORK/vlm-tp1pp2"
check "vlm: mcore/ copied out" cp -r "$mnt/mcore" "$WORK/vlm-mcore"
# mbridge's gemma3 provider asserts vp_stage is None: no virtual pipeline
ls "$mnt/tp1pp2vpp3" > /dev/null 2>&1
ok $([[ $? -ne 0 ]] && grep -q 'vpp 3: mbridge builds Gemma3ForConditionalGeneration without virtual pipeline stages' "$WORK/log-vlm"; echo $?) \
  "vlm: tp1pp2vpp3/ is refused, and its lookup logs why" || sed 's/^/# /' "$WORK/log-vlm" >&2
sid_python "$WORK" "$script" vlm-check "$src" "$mnt/hf" "$WORK/vlm-tp2pp2:2:2" "$WORK/vlm-back" "$WORK/vlm-mcore/release" \
  > "$WORK/check-vlm" 2> "$WORK/check-vlm.err"
ran $? "vlm: the checks ran: rank files, rebuilt as mbridge exports, logits, mcore/" "$WORK/check-vlm.err"
passes "$WORK/check-vlm"
n=$(grep -c '^PASS\|^FAIL' "$WORK/check-vlm")
# 4 rank files; logits of hf/ and of the rebuilt copy, another image's; 2 of mcore/
ok $((n == 9 ? 0 : 1)) "vlm: 9 checks: each rank file, 3 logits, 2 of mcore/ (got $n)"
fg_unmount "$mnt"
# The forward with Megatron semantics over each copy's rank files (gemma3_forward.py) against
# transformers' float32 forward of the source; no vpp layout exists to check (mbridge builds none).
sid_python "$WORK" "$script" forward "$src_text" "$WORK/meg-tp2pp2:2:2,$WORK/meg-tp2pp1:2:1,$WORK/meg-tp1pp2:1:2" \
  "$src" "$WORK/vlm-tp2pp2:2:2,$WORK/vlm-tp2pp1:2:1,$WORK/vlm-tp1pp2:1:2" > "$WORK/check-forward" 2> "$WORK/check-forward.err"
ran $? "forward: the Megatron-semantics forwards of the text model and the VLM ran" "$WORK/check-forward.err"
passes "$WORK/check-forward"
n=$(grep -c '^PASS\|^FAIL' "$WORK/check-forward")
# 3 layouts of each model and each one's negative control
ok $((n == 8 ? 0 : 1)) "forward: 8 checks: 3 layouts of each model, 2 negative controls (got $n)"
# Megatron-Bridge's tree (-o megatron_names=bridge): its gemma3_vl bridge keeps transformers' SigLIP
# module whole as vision_tower, then its projector, then the language model under the text gemma3
# names; checked against its tables written in gemma3.py. The tower splits nothing, so tp4 is listed.
"$CKPTFS" inspect "$src" -o megatron_names=bridge > "$WORK/inspect-vlm-bridge" 2>&1
grep -q '^megatron: *gemma3 rules' "$WORK/inspect-vlm-bridge" &&
  grep -qF 'vision_tower.* on the first pipeline stage, before language_model.*' "$WORK/inspect-vlm-bridge"
ok $? "vlm bridge: inspect names the text gemma3 rules and the tower under vision_tower. first" ||
  sed 's/^/# /' "$WORK/inspect-vlm-bridge" >&2
MOUNT_OPTS=megatron_names=bridge fg_mount "$CKPTFS" "$src" "$WORK/mnt-vlm-bridge" "$WORK/log-vlm-bridge"
listing=$(ls "$WORK/mnt-vlm-bridge" | tr '\n' ' ')
ok $([[ $listing == "hf mcore tp1pp1 tp1pp2 tp2pp1 tp2pp2 tp4pp1 tp4pp2 " ]]; echo $?) \
  "vlm bridge: the root lists tp4 too, the tower whole on every rank (got: $listing)" || sed 's/^/# /' "$WORK/log-vlm-bridge" >&2
check "vlm bridge: tp2pp2/ copied out" cp -r "$WORK/mnt-vlm-bridge/tp2pp2" "$WORK/vlm-bridge-tp2pp2"
check "vlm bridge: mcore/ copied out" cp -r "$WORK/mnt-vlm-bridge/mcore" "$WORK/vlm-bridge-mcore"
fg_unmount "$WORK/mnt-vlm-bridge"
sid_python "$WORK" "$script" bridge-check "$src" "$WORK/vlm-bridge-tp2pp2" "$WORK/vlm-bridge-mcore/release" \
  > "$WORK/check-vlm-bridge" 2> "$WORK/check-vlm-bridge.err"
ran $? "vlm bridge: the checks against Megatron-Bridge's gemma3_vl tables ran" "$WORK/check-vlm-bridge.err"
passes "$WORK/check-vlm-bridge"
n=$(grep -c '^PASS\|^FAIL' "$WORK/check-vlm-bridge")
ok $((n == 6 ? 0 : 1)) "vlm bridge: a check for each of the 4 rank files and two of mcore/ (got $n)"
# The bridge tree's copy mounts back with the option: its tp2pp2/ served again is the copy, file for file.
MOUNT_OPTS=megatron_names=bridge fg_mount "$CKPTFS" "$WORK/vlm-bridge-tp2pp2" "$WORK/src-vlm-bridge" "$WORK/log-src-vlm-bridge"
check "vlm bridge: its tp2pp2/ copy as a source (-o megatron_names=bridge) serves tp2pp2/ again, file for file" \
  same_trees "$WORK/vlm-bridge-tp2pp2" "$WORK/src-vlm-bridge/tp2pp2" .
fg_unmount "$WORK/src-vlm-bridge"

# The releases' names (vision_tower.vision_model.*) are the same model.
fg_mount "$CKPTFS" "$models/vlm-release" "$WORK/mnt-vlm-release" "$WORK/log-vlm-release"
check "vlm-release: tp2pp2/'s first rank file is byte for byte transformers 5's naming's" \
  cmp "$WORK/mnt-vlm-release/tp2pp2/release/mp_rank_00_000/model_optim_rng.pt" "$WORK/vlm-tp2pp2/release/mp_rank_00_000/model_optim_rng.pt"
fg_unmount "$WORK/mnt-vlm-release"

# Vision fields the rules cannot say: named, hf/ still served.
for bad in "badvision:vision_config.position_embedding_type is not understood" \
           "badtokens:mm_tokens_per_image 9 is not the square of a side that divides the 4 patches a side of the image" \
           "badact:vision_config.hidden_act 'gelu' is not understood"; do
  form=${bad%%:*} why=${bad#*:}
  "$CKPTFS" inspect "$models/vlm-$form" > "$WORK/inspect-vlm-$form" 2>&1
  grep -qF "megatron:     no Megatron views: config.json: $why" "$WORK/inspect-vlm-$form"
  ok $? "vlm-$form: inspect names the field ($why)" || grep '^megatron' "$WORK/inspect-vlm-$form" | sed 's/^/# /' >&2
done
fg_mount "$CKPTFS" "$models/vlm-badvision" "$WORK/mnt-vlm-bad" "$WORK/log-vlm-bad"
check "vlm-badvision: hf/ holds the source's files, byte for byte" same_trees "$models/vlm-badvision" "$WORK/mnt-vlm-bad/hf" .
fg_unmount "$WORK/mnt-vlm-bad"

# A Llama checkpoint said to be Gemma 3's VLM: no window in its args, refused by name.
"$CKPTFS" inspect "$TESTDATA/megatron-core-0.17.1/llama-tp2pp2-torch" -o hf_arch=gemma3 > "$WORK/inspect-meg-vlm" 2>&1
grep -q "option hf_arch: args.window_size / window_attn_skip_freq: a full-attention layer every 0 (0: no window), but Gemma3ForConditionalGeneration has one every 6" "$WORK/inspect-meg-vlm"
ok $? "hf_arch=gemma3 on a Llama Megatron checkpoint is refused, naming the window's args" || sed 's/^/# /' "$WORK/inspect-meg-vlm" >&2

# Megatron copies of the views as sources (docs/vlm.md "Megatron sources"): their views are the
# HF source's, file for file; hf/ is checked with transformers below.
for s in "text:meg-tp2pp2:tp2pp1=meg-tp2pp1 mcore=mcore" "text:mcore/release:tp2pp2=meg-tp2pp2" \
         "vlm:vlm-tp2pp2:mcore=vlm-mcore" "vlm:vlm-mcore/release:tp2pp2=vlm-tp2pp2"; do
  IFS=: read -r kind copy views <<< "$s"
  mnt=$WORK/src-${copy%%/*}
  check "$kind: $copy as a source mounts" mount_ckptfs "$WORK/$copy" "$mnt"
  for v in $views; do
    check "$kind: $copy as a source: $v/ is the HF source's ${v#*=}/, file for file" \
      same_trees "$WORK/${v#*=}" "$mnt/${v%%=*}" .
  done
done
# Rank files without args (verl's layout gives config.json beside them): the VLM's config.json read
# for its text_config and vision_config; the text model's rank files with it: no language_model.*
"$CKPTFS" export "$models/vlm" tp2pp1 "$WORK/vlm-noargs" -o megatron_args=off > /dev/null 2>&1
mount_ckptfs "$WORK/vlm-noargs" "$WORK/src-vlm-noargs" -o "hf_config=$models/vlm/config.json"
check "vlm: rank files without args and the VLM's config.json: tp2pp2/ is the HF source's" \
  same_trees "$WORK/vlm-tp2pp2" "$WORK/src-vlm-noargs/tp2pp2" .
unmount_ckptfs "$WORK/src-vlm-noargs"
"$CKPTFS" export "$models/text" tp2pp1 "$WORK/meg-noargs" -o megatron_args=off > /dev/null 2>&1
"$CKPTFS" inspect "$WORK/meg-noargs" -o "hf_config=$models/vlm/config.json" > "$WORK/inspect-noargs-vlm" 2>&1
grep -q 'mp_rank_00/model_optim_rng.pt: no language_model.embedding.word_embeddings.weight matrix' "$WORK/inspect-noargs-vlm"
ok $? "text rank files without args and the VLM's config.json: refused by name" || sed 's/^/# /' "$WORK/inspect-noargs-vlm" >&2
# hf/ of each: the original's tensors (the VLM's under the releases' names), transformers' logits
sid_python "$WORK" "$script" source-check "$src_text" "$WORK/src-meg-tp2pp2/hf,$WORK/src-mcore/hf" "$models/vlm" \
  "$models/vlm-release" "$WORK/src-vlm-tp2pp2/hf,$WORK/src-vlm-mcore/hf" "$WORK/meg-tp2pp1" "$WORK/meg-nolocal" \
  > "$WORK/check-src" 2> "$WORK/check-src.err"
ran $? "sources: the checks ran: hf/'s tensors and logits of each" "$WORK/check-src.err"
passes "$WORK/check-src"
n=$(grep -c '^PASS\|^FAIL' "$WORK/check-src")
# tensors and logits of 2 text and 2 VLM copies
ok $((n == 8 ? 0 : 1)) "sources: 8 checks, tensors and logits of 4 hf/ (got $n)"
for m in src-meg-tp2pp2 src-mcore src-vlm-tp2pp2 src-vlm-mcore; do unmount_ckptfs "$WORK/$m"; done
# What Megatron cannot default: a copy whose args lack the local rope base, refused by name.
"$CKPTFS" inspect "$WORK/meg-nolocal" > "$WORK/inspect-nolocal" 2>&1
grep -q "mp_rank_00/model_optim_rng.pt: args.rope_local_base_freq is missing: Gemma3ForCausalLM computes with it" "$WORK/inspect-nolocal"
ok $? "a copy whose args lack rope_local_base_freq is refused by name" || sed 's/^/# /' "$WORK/inspect-nolocal" >&2
wait
done_testing
