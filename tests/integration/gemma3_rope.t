#!/usr/bin/env bash
# Gemma 3's linear rope scaling (docs/families.md): the 4B, 12B and 27B releases scale their
# full-attention layers' rope by 8 (rope_scaling in the releases' spelling; transformers 5 nests it
# under rope_parameters.full_attention). A tiny Gemma3ForCausalLM and Gemma3ForConditionalGeneration
# so scaled, built by transformers 5 in the sid root (tests/lib/gemma3_rope.py): inspect reads the
# factor in both spellings, the views' args carry it as Megatron's rotary_seq_len_interpolation_factor,
# the two spellings give the same rank files, and copies of tp2pp2/ and mcore/ mounted as sources give
# an hf/ whose logits in transformers are the original's (which the factor changes). The sliding
# layers' rope scaled, or a factor Megatron cannot hold (not an integer), is refused by name. The
# forward with Megatron semantics over the rank files of tp2pp2 and tp2pp1 (text) and tp2pp2 and
# tp1pp2 (VLM) gives transformers' logits.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script=$TESTS_TOP/tests/lib/gemma3_rope.py
models=$WORK/models
mkdir -p "$models"
sid_python "$WORK" "$script" build "$models" > "$WORK/build.out" 2> "$WORK/build.err"
ran $? "transformers 5 builds and saves a tiny Gemma 3 (text and VLM) with linear rope scaling" "$WORK/build.err" ||
  { done_testing; exit; }

for form in text release vlm; do
  "$CKPTFS" inspect "$models/$form" > "$WORK/inspect-$form" 2>&1
  grep -q '^math: .*rope_global_type=linear rope_local_type=default rope_linear_factor=8 ' "$WORK/inspect-$form"
  ok $? "$form: inspect reads the full-attention layers' linear factor 8" || grep '^m' "$WORK/inspect-$form" | sed 's/^/# /' >&2
done
for bad in "localscaled:rope_parameters.sliding_attention.factor is not understood" \
           "fractional:rope_parameters.full_attention.factor 2.5 has no Megatron equivalent: rotary_seq_len_interpolation_factor is an integer"; do
  form=${bad%%:*} why=${bad#*:}
  "$CKPTFS" inspect "$models/$form" > "$WORK/inspect-$form" 2>&1
  grep -qF "megatron:     no Megatron views: config.json: $why" "$WORK/inspect-$form"
  ok $? "$form: refused by name ($why)" || grep '^megatron' "$WORK/inspect-$form" | sed 's/^/# /' >&2
done

for m in text release vlm; do
  mount_ckptfs "$models/$m" "$WORK/mnt-$m" 2> "$WORK/log-$m" || { ok 1 "$m mounts"; sed 's/^/# /' "$WORK/log-$m" >&2; }
done
rank=release/mp_rank_01_001/model_optim_rng.pt
args=$("$PY" -c "
import torch, sys
a = torch.load(sys.argv[1], map_location='cpu', weights_only=False)['args']
print(repr(a.rotary_seq_len_interpolation_factor), a.use_rope_scaling)" "$WORK/mnt-text/tp2pp2/$rank" 2>&1)
ok $([[ $args == "8 False" ]]; echo $?) "tp2pp2/'s args carry rotary_seq_len_interpolation_factor 8, no Llama 3 scaling (got: $args)"
check "the releases' spelling gives tp2pp2/'s rank files byte for byte" cmp "$WORK/mnt-text/tp2pp2/$rank" "$WORK/mnt-release/tp2pp2/$rank"
check "tp2pp2/ copied out" cp -r "$WORK/mnt-text/tp2pp2" "$WORK/text-tp2pp2"
check "mcore/ copied out" cp -r "$WORK/mnt-text/mcore" "$WORK/text-mcore"
check "vlm: tp2pp2/ copied out" cp -r "$WORK/mnt-vlm/tp2pp2" "$WORK/vlm-tp2pp2"
check "tp2pp1/ copied out" cp -r "$WORK/mnt-text/tp2pp1" "$WORK/text-tp2pp1"
check "vlm: tp1pp2/ copied out" cp -r "$WORK/mnt-vlm/tp1pp2" "$WORK/vlm-tp1pp2"
for m in text release vlm; do unmount_ckptfs "$WORK/mnt-$m"; done

hf_dirs=()
for copy in text-tp2pp2 text-mcore vlm-tp2pp2; do
  if mount_ckptfs "$WORK/$copy" "$WORK/src-$copy" 2> "$WORK/log-src-$copy"; then
    ok 0 "$copy mounts as a Megatron source"
  else
    ok 1 "$copy mounts as a Megatron source"; sed 's/^/# /' "$WORK/log-src-$copy" >&2
  fi
  hf_dirs+=("$WORK/src-$copy/hf")
done
sid_python "$WORK" "$script" check "$models/text" "${hf_dirs[0]}" "${hf_dirs[1]}" -- "$models/vlm" "${hf_dirs[2]}" \
  > "$WORK/check" 2> "$WORK/check.err"
ran $? "the transformers checks ran" "$WORK/check.err"
passes "$WORK/check"
# the factor's effect, 2 text copies, the VLM copy and another image
check "5 verdicts" test "$(grep -c '^PASS\|^FAIL' "$WORK/check")" -eq 5
for copy in text-tp2pp2 text-mcore vlm-tp2pp2; do unmount_ckptfs "$WORK/src-$copy"; done

# The forward with Megatron semantics over the rank files (gemma3_forward.py: the full-attention
# layers' positions divided by the args' factor) gives transformers' float32 logits of the scaled
# models; each model's two TP shares of one tensor exchanged do not.
sid_python "$WORK" "$TESTS_TOP/tests/lib/gemma3.py" forward "$models/text" "$WORK/text-tp2pp2:2:2,$WORK/text-tp2pp1:2:1" \
  "$models/vlm" "$WORK/vlm-tp2pp2:2:2,$WORK/vlm-tp1pp2:1:2" > "$WORK/forward" 2> "$WORK/forward.err"
ran $? "the forward checks ran" "$WORK/forward.err"
passes "$WORK/forward"
check "6 forward verdicts" test "$(grep -c '^PASS\|^FAIL' "$WORK/forward")" -eq 6
done_testing
