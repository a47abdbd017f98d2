#!/usr/bin/env bash
# Models of every supported family built and saved by transformers 5 itself (in the sid root),
# with its config.json and with transformers 4's spelling of it: the Megatron view's args are
# what Megatron's own import sets from the config as transformers 5 reads it, and the round trip
# HF -> tp2pp1/ (through the mount) -> that copy mounted as a source -> its hf/, loaded by
# transformers 5, gives the original's logits exactly.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/tf5_roundtrip.py"
models=$WORK/models
mkdir -p "$models"


sid_python "$WORK" "$script" build "$models" > "$WORK/built" 2> "$WORK/build.err"
ran $? "transformers 5 builds and saves the models" "$WORK/build.err"
triples=()
while read -r state family why; do
  if [[ $state != built ]]; then
    # DeepSeek-V3 is optional: this transformers may not build it on the CPU.
    if [[ $family == deepseek_v3: ]]; then skip "deepseek_v3: transformers 5 did not build it: $why"
    else ok 1 "$family transformers 5 builds it: $why"; fi
    continue
  fi
  for v in "$family-v5" "$family-v4"; do
    src=$models/$v mnt=$WORK/mnt-$v meg=$WORK/meg-$v
    if ! mount_ckptfs "$src" "$mnt" 2> "$WORK/err"; then
      ok 1 "$v: mount ($(head -c 300 "$WORK/err"))"
      continue
    fi
    if ! cp -r "$mnt/tp2pp1" "$meg" 2> "$WORK/err"; then
      ok 1 "$v: tp2pp1/ copied out of the mount: $(head -c 300 "$WORK/err") $("$CKPTFS" inspect "$src" 2>&1 | grep -i 'megatron' | head -c 300)"
      unmount_ckptfs "$mnt"
      continue
    fi
    unmount_ckptfs "$mnt"
    if ! mount_ckptfs "$meg" "$mnt-meg" 2> "$WORK/err"; then
      ok 1 "$v: the Megatron copy mounts as a source: $(head -c 300 "$WORK/err")"
      continue
    fi
    ok 0 "$v: tp2pp1/ copied out of the mount and mounted as a source"
    triples+=("$src" "$meg/release/mp_rank_00/model_optim_rng.pt" "$mnt-meg/hf")
  done
done < "$WORK/built"

if ((${#triples[@]})); then
  sid_python "$WORK" "$script" check "${triples[@]}" > "$WORK/checked" 2> "$WORK/check.err"
  ran $? "the checks ran" "$WORK/check.err"
  passes "$WORK/checked"
  checked=$(grep -c '^PASS\|^FAIL' "$WORK/checked")
  ok $((checked == ${#triples[@]} / 3 * 3 ? 0 : 1)) "three checks for each of the $((${#triples[@]} / 3)) copies (got $checked)"
fi

# A Megatron checkpoint whose args name no token ids (as Megatron's own saves): hf/config.json
# says null for them, not Phi-3's default pad_token_id 32000 outside this vocabulary.
if [[ -d $WORK/meg-phi3-v5 ]]; then
  sid_python "$WORK" "$script" strip "$WORK/meg-phi3-v5" "$WORK/meg-phi3-bare" 2> "$WORK/strip.err"
  ran $? "phi3-v5: a copy of tp2pp1/ without args.hf_token_ids" "$WORK/strip.err"
  if mount_ckptfs "$WORK/meg-phi3-bare" "$WORK/mnt-bare" 2> "$WORK/err"; then
    "$CKPTFS" inspect "$WORK/meg-phi3-bare" > "$WORK/inspect-bare" 2>&1
    grep -q '^token ids: .*pad_token_id=null ' "$WORK/inspect-bare" &&
      grep -q 'hf/config.json: bos_token_id, eos_token_id and pad_token_id are null' "$WORK/inspect-bare"
    ok $? "phi3-v5 without token ids: inspect says they are written null, and why" ||
      sed 's/^/# /' "$WORK/inspect-bare" >&2
    sid_python "$WORK" "$script" unknown_ids "$models/phi3-v5" "$WORK/mnt-bare/hf" > "$WORK/bare" 2> "$WORK/bare.err"
    grep -q '^PASS' "$WORK/bare"
    ok $? "$(cat "$WORK/bare" "$WORK/bare.err" | head -c 400)"
    unmount_ckptfs "$WORK/mnt-bare"
  else
    ok 1 "phi3-v5 without token ids mounts: $(head -c 300 "$WORK/err")"
  fi
fi
done_testing
