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

# ran STATUS DESCRIPTION ERRFILE: ok, with the end of ERRFILE on stderr on failure.
ran() {
  ok "$1" "$2"
  [[ $1 -eq 0 ]] || tail -n 20 "$3" | sed 's/^/# /' >&2
}

# known RESULT: why ckptfs fails a check today, exactly as it fails it (empty: it must pass).
# Shown by prove as TODO tests until ckptfs is fixed; any other failure of the same check fails.
known() {
  case $1 in
    phi3-*:\ logits:\ transformers\ 5\ cannot\ load*Padding_idx\ must\ be\ within\ num_embeddings)
      echo "hf/config.json of a Phi-3 Megatron source has no pad_token_id: transformers takes Phi-3's 32000, outside this vocabulary" ;;
  esac
}

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
  while read -r state what; do
    reason=$(known "$what")
    if [[ $state == FAIL && -n $reason ]]; then
      _tap_n=$((_tap_n + 1))
      echo "not ok $_tap_n - $what # TODO $reason"
    elif [[ $state == PASS || $state == FAIL ]]; then
      ok "$([[ $state == PASS ]]; echo $?)" "$what"
    fi
  done < "$WORK/checked"
  checked=$(grep -c '^PASS\|^FAIL' "$WORK/checked")
  ok $((checked == ${#triples[@]} / 3 * 2 ? 0 : 1)) "two checks for each of the $((${#triples[@]} / 3)) copies (got $checked)"
fi
done_testing
