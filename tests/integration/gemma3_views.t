#!/usr/bin/env bash
# Gemma 3's text model (docs/families.md): a tiny Gemma3ForCausalLM built and saved by transformers
# 5 itself (in the sid root: five sliding layers and a full one, a head_dim of its own, two rope
# bases, query_pre_attn_scalar, tied embeddings, random norms). hf/ serves it byte for byte;
# tp2pp2/ and tp2pp1/ hold, rank by rank, the names, shapes and bytes of Megatron-Bridge's Gemma 3
# GPTModel (post-norms as linear_proj's and linear_fc2's post_layernorm; checked against the
# bridge's table written in tests/lib/gemma3.py) with the args Gemma 3 needs, and rebuilt into
# Hugging Face tensors as the bridge exports give transformers' logits back exactly; mcore/ read
# by torch.distributed.checkpoint holds the bridge's keys, shapes and bytes. Soft-capping,
# bidirectional attention and a layer pattern Megatron cannot say are refused by name (hf/
# still served); spec=local is refused (the post-norms exist in TE's linears only).
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/gemma3.py"
models=$WORK/models

sid_python "$WORK" "$script" build "$models" > "$WORK/build.out" 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves a tiny Gemma3ForCausalLM" ||
  { tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2; done_testing; exit; }

# ran STATUS DESCRIPTION ERRFILE: ok, with the end of ERRFILE on stderr on failure.
ran() {
  ok "$1" "$2"
  [[ $1 -eq 0 ]] || tail -n 20 "$3" | sed 's/^/# /' >&2
}
# passes FILE: one TAP line per PASS/FAIL line of FILE.
passes() {
  while read -r state what; do
    [[ $state == PASS || $state == FAIL ]] && ok "$([[ $state == PASS ]]; echo $?)" "$what"
  done < "$1"
}

src=$models/text mnt=$WORK/mnt
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

# A Megatron copy of Gemma 3 is not read back yet: refused by name, not misread.
"$CKPTFS" inspect "$WORK/meg-tp2pp1" > "$WORK/inspect-meg" 2>&1
grep -q 'model_optim_rng.pt: args.swiglu is not true and args.quick_geglu is not true' "$WORK/inspect-meg"
ok $? "tp2pp1/'s copy as a source is refused by name" || sed 's/^/# /' "$WORK/inspect-meg" >&2

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
wait
done_testing
