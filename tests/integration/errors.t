#!/usr/bin/env bash
# Bad input: every broken source fails `ckptfs mount` (and inspect) with a non-zero exit and one
# line naming the file, the tensor and the problem, and leaves no mount behind; sources with a
# missing/broken config or unknown architecture mount with hf/ only and say why; bad mount
# points and options fail cleanly.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
$PY "$TESTS_TOP/tests/lib/bad_inputs.py" "$WORK/bad" > "$WORK/cases"

mounted_under() { grep -c " $1 " /proc/mounts; }

while IFS=$'\t' read -r kind expect; do
  mnt=$WORK/mnt-$kind
  mkdir -p "$mnt"
  "$CKPTFS" mount "$WORK/bad/$kind" "$mnt" 2> "$WORK/err" && rc=0 || rc=$?
  lines=$(wc -l < "$WORK/err")
  named=0
  IFS=$'\t' read -ra parts <<< "$expect"
  for s in "${parts[@]}"; do grep -qF -- "$s" "$WORK/err" || named=1; done
  [[ $rc -ne 0 && $lines -eq 1 && $named -eq 0 && $(mounted_under "$mnt") -eq 0 ]]
  ok $? "$kind: mount fails with one line naming ${parts[*]} ($(head -c 200 "$WORK/err"))"
  "$CKPTFS" inspect "$WORK/bad/$kind" > /dev/null 2> "$WORK/err" && rc=0 || rc=$?
  [[ $rc -ne 0 && $(wc -l < "$WORK/err") -eq 1 ]]
  ok $? "$kind: inspect fails with one line"
done < "$WORK/cases"

mkdir -p "$WORK/empty"
"$CKPTFS" mount "$WORK/does-not-exist" "$WORK/empty" 2> "$WORK/err" && rc=0 || rc=$?
[[ $rc -ne 0 ]] && grep -q "does-not-exist" "$WORK/err"; ok $? "missing source: fails naming it"
"$CKPTFS" mount "$WORK/bad/overlap/model.safetensors" "$WORK/empty" 2> "$WORK/err" && rc=0 || rc=$?
[[ $rc -ne 0 ]] && grep -q "not a directory" "$WORK/err"; ok $? "source is a file: fails"
src=$WORK/bad/soft/no-config
"$CKPTFS" mount "$src" "$WORK/no-such-mnt" 2> "$WORK/err" && rc=0 || rc=$?
[[ $rc -ne 0 ]] && grep -q "no-such-mnt" "$WORK/err"; ok $? "missing mount point: fails naming it"
"$CKPTFS" mount "$src" "$src/model.safetensors" 2> "$WORK/err" && rc=0 || rc=$?
[[ $rc -ne 0 ]] && grep -q "not a directory" "$WORK/err"; ok $? "mount point is a file: fails"
mkdir -p "$WORK/m"
for opt in hf_shard_size=banana hf_shard_size=0 spec=megatron vocab_pad=maybe pp_first=x rw; do
  "$CKPTFS" mount -o "$opt" "$src" "$WORK/m" 2> "$WORK/err" && rc=0 || rc=$?
  [[ $rc -ne 0 && $(wc -l < "$WORK/err") -eq 1 && $(mounted_under "$WORK/m") -eq 0 ]]
  ok $? "-o $opt: refused with one line ($(head -c 150 "$WORK/err"))"
done
"$CKPTFS" mount -o no_such_option "$src" "$WORK/m" 2> /dev/null && rc=0 || rc=$?
[[ $rc -ne 0 && $(mounted_under "$WORK/m") -eq 0 ]]; ok $? "-o no_such_option: refused, nothing mounted"

# Sources that mount with hf/ only.
for kind in no-config broken-config unknown-arch missing-layers wrong-shape; do
  src=$WORK/bad/soft/$kind
  mnt=$WORK/mnt-soft-$kind
  check "$kind: mounts" mount_ckptfs "$src" "$mnt"
  check "$kind: the root shows hf/ only" test "$(ls "$mnt")" = hf
  check "$kind: hf/ serves the weights" cmp "$src/model.safetensors" "$mnt/hf/model.safetensors"
  "$CKPTFS" inspect "$src" > "$WORK/out" 2>&1
  case $kind in
    no-config) want="config.json is missing" ;;
    broken-config) want="not valid JSON" ;;
    unknown-arch) want="GPT2LMHeadModel" ;;
    missing-layers) want="num_hidden_layers" ;;
    wrong-shape) want="model.layers.0.mlp.gate_proj.weight' has shape [96, 64]; config.json implies [128, 64]" ;;
  esac
  check "$kind: inspect says why ($want)" grep -qF -- "$want" "$WORK/out"
  "$CKPTFS" ls "$src" mcore > /dev/null 2> "$WORK/err" && rc=0 || rc=$?
  [[ $rc -ne 0 ]] && grep -qF "no Megatron views" "$WORK/err" && grep -qF -- "$want" "$WORK/err"
  ok $? "$kind: ls mcore says why, not that there is no such view ($(head -c 200 "$WORK/err"))"
  ls "$mnt/tp1pp1" > /dev/null 2>&1 && rc=0 || rc=1
  ok $((1 - rc)) "$kind: tp1pp1 does not exist"
done
# "--" ends the options: a source or mount point whose name starts with "-".
cp -r "$src" "$WORK/-dash-src" && mkdir -p "$WORK/-dash-mnt"
(cd "$WORK" && "$CKPTFS" inspect -- -dash-src > /dev/null); ok $? "inspect -- -dash-src works"
(cd "$WORK" && "$CKPTFS" mount -- -dash-src -dash-mnt) && ls "$WORK/-dash-mnt/hf" > /dev/null
ok $? "mount -- -dash-src -dash-mnt works"
(cd "$WORK" && "$CKPTFS" inspect -dash-src 2> /dev/null); [[ $? -ne 0 ]]; ok $? "without --, -dash-src is an unknown option"
done_testing
