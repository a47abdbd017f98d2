#!/usr/bin/env bash
# Hostile small files. Every JSON file ckptfs reads (a Hugging Face config.json and
# model.safetensors.index.json, a torch_dist metadata.json, the file of -o hf_config and the
# config.json of -o hf_extra) made 100000 levels deep, larger than the cap (a sparse file), or
# with a key given twice at depth 2: `ckptfs inspect` and `ckptfs mount` fail with one line
# naming the file and the problem (config.json: the mount serves hf/ only and both say why),
# never crash, never hang. The same for the Megatron tracker as a FIFO, a symlink to /dev/zero,
# a directory or an oversized file, in torch_dist and legacy checkpoints; a missing tracker
# stays normal. Every command runs under `timeout 20`.
source "$(dirname "$0")/../lib/common.sh"
require_fuse

mounted_under() { grep -c " $1 " /proc/mounts; }

# run_ckptfs ARGS...: runs ckptfs under the timeout; rc in $rc, stderr in $WORK/err.
run_ckptfs() {
  timeout 20 "$CKPTFS" "$@" > "$WORK/out" 2> "$WORK/err" && rc=0 || rc=$?
}
# how_it_ended: why a command did not end normally, or nothing. 124 is the timeout, 128+ a
# signal (a crash), and a sanitizer report is a crash too.
how_it_ended() {
  if [[ $rc -eq 124 ]]; then echo "hung (killed after 20 s)"
  elif [[ $rc -ge 128 ]]; then echo "died of signal $((rc - 128))"
  elif grep -qE 'Sanitizer|runtime error|CRITICAL|WARNING \*\*' "$WORK/err"; then echo "crashed or warned: $(grep -m1 -E 'Sanitizer|runtime error|CRITICAL|WARNING' "$WORK/err")"
  fi
}
# fails_naming DESCRIPTION NEEDLE... -- ARGS...: ckptfs ARGS fails (not by a signal, not by the
# timeout) with exactly one line on stderr holding every NEEDLE; a mount leaves nothing mounted.
fails_naming() {
  local desc=$1 needles=() mnt=""
  shift
  while [[ $1 != -- ]]; do needles+=("$1"); shift; done
  shift
  [[ $1 == mount ]] && mnt=${!#}
  run_ckptfs "$@"
  local why named=0 s
  why=$(how_it_ended)
  for s in "${needles[@]}"; do grep -qF -- "$s" "$WORK/err" || named=1; done
  [[ -z $why && $rc -ne 0 && $(wc -l < "$WORK/err") -eq 1 && $named -eq 0 ]] &&
    { [[ -z $mnt ]] || [[ $(mounted_under "$mnt") -eq 0 ]]; }
  ok $? "$desc: $1 fails with one line naming ${needles[*]} (${why:-rc $rc}: $(head -c 240 "$WORK/err"))"
}

# --- the sources: a Hugging Face checkpoint (one file, and two shards with an index); from
# it, with ckptfs itself, a torch_dist checkpoint (tracker + release/metadata.json, common.pt,
# .metadata, .distcp) and a legacy Megatron one (tracker + release/mp_rank_00) ---
$PY "$TESTS_TOP/tests/lib/models.py" write llama "$WORK/hf" --layers 2 > /dev/null
$PY "$TESTS_TOP/tests/lib/models.py" write llama "$WORK/hf-index" --layers 2 --shards 2 > /dev/null
check "torch_dist source made (ckptfs export mcore)" "$CKPTFS" export "$WORK/hf" mcore "$WORK/td"
check "legacy Megatron source made (ckptfs export tp1pp1)" "$CKPTFS" export "$WORK/hf" tp1pp1 "$WORK/leg"
check "the index source has model.safetensors.index.json" test -f "$WORK/hf-index/model.safetensors.index.json"
check "the torch_dist source has release/metadata.json and a tracker" \
  test -f "$WORK/td/release/metadata.json" -a -f "$WORK/td/latest_checkpointed_iteration.txt"
check "the torch_dist source mounts as it is" mount_ckptfs "$WORK/td" "$WORK/mnt-td-good"
check "the legacy source mounts as it is" mount_ckptfs "$WORK/leg" "$WORK/mnt-leg-good"

# --- the payloads: KIND -> a file, and what the error must say ---
mkdir -p "$WORK/payload"
$PY -c 'import sys; sys.stdout.write("{\"a\":" * 100000)' > "$WORK/payload/deep"
truncate -s $((64 * 1024 * 1024 + 1)) "$WORK/payload/oversize" # sparse: made and refused at once
printf '{"hidden_size": 64, "a": {"k": 1, "k": 2}}' > "$WORK/payload/duplicate"
declare -A says=(
  [deep]="nesting deeper than 64 at byte 320"
  [oversize]="67108865 bytes, more than the 67108864 this file may have"
  [duplicate]="key 'k' is given twice in one object at byte 34"
)
kinds=(deep oversize duplicate)

# put_payload KIND PATH: PATH becomes the payload (a sparse copy stays sparse).
put_payload() { rm -rf "$2"; cp --sparse=always "$WORK/payload/$1" "$2"; }

for kind in "${kinds[@]}"; do
  want=${says[$kind]}

  # Hugging Face config.json: a soft failure, hf/ only, and both commands say why.
  src=$WORK/hf-config-$kind
  cp -r "$WORK/hf" "$src"
  put_payload "$kind" "$src/config.json"
  run_ckptfs inspect "$src"
  why=$(how_it_ended)
  [[ -z $why && $rc -eq 0 ]] && grep -qF -- "$src/config.json: $want" "$WORK/out"
  ok $? "config.json $kind: inspect works and says why ($want) (${why:-rc $rc}: $(grep -m1 config.json "$WORK/out" "$WORK/err" | head -c 200))"
  mnt=$WORK/mnt-config-$kind
  mkdir -p "$mnt"
  run_ckptfs mount "$src" "$mnt"
  why=$(how_it_ended)
  [[ -z $why && $rc -eq 0 && $(wc -l < "$WORK/err") -eq 1 ]] && grep -qF -- "$src/config.json: $want" "$WORK/err"
  ok $? "config.json $kind: mount works with one warning line naming the file (${why:-rc $rc}: $(head -c 200 "$WORK/err"))"
  [[ $(ls "$mnt" 2>/dev/null) == hf ]] && cmp -s "$src/model.safetensors" "$mnt/hf/model.safetensors"
  ok $? "config.json $kind: the mount serves hf/ only, with the weights"

  # model.safetensors.index.json: the source cannot be read.
  src=$WORK/hf-index-$kind
  cp -r "$WORK/hf-index" "$src"
  put_payload "$kind" "$src/model.safetensors.index.json"
  fails_naming "index.json $kind" "$src/model.safetensors.index.json: $want" -- inspect "$src"
  mkdir -p "$WORK/mnt-index-$kind"
  fails_naming "index.json $kind" "$src/model.safetensors.index.json: $want" -- mount "$src" "$WORK/mnt-index-$kind"

  # torch_dist metadata.json.
  src=$WORK/td-metadata-$kind
  cp -r "$WORK/td" "$src"
  put_payload "$kind" "$src/release/metadata.json"
  fails_naming "metadata.json $kind" "$src/release/metadata.json: $want" -- inspect "$src"
  mkdir -p "$WORK/mnt-metadata-$kind"
  fails_naming "metadata.json $kind" "$src/release/metadata.json: $want" -- mount "$src" "$WORK/mnt-metadata-$kind"

  # -o hf_config=FILE and -o hf_extra=DIR (its config.json), over the torch_dist source.
  given=$WORK/given-$kind.json
  put_payload "$kind" "$given"
  fails_naming "-o hf_config $kind" "$given: $want" -- inspect -o "hf_config=$given" "$WORK/td"
  mkdir -p "$WORK/mnt-given-$kind"
  fails_naming "-o hf_config $kind" "$given: $want" -- mount -o "hf_config=$given" "$WORK/td" "$WORK/mnt-given-$kind"
  extra=$WORK/extra-$kind
  mkdir -p "$extra"
  put_payload "$kind" "$extra/config.json"
  fails_naming "-o hf_extra $kind" "$extra/config.json: $want" -- inspect -o "hf_extra=$extra" "$WORK/leg"
  mkdir -p "$WORK/mnt-extra-$kind"
  fails_naming "-o hf_extra $kind" "$extra/config.json: $want" -- mount -o "hf_extra=$extra" "$WORK/leg" "$WORK/mnt-extra-$kind"
done

# A value of the wrong type where a string is read: refused, not a NULL dereference.
src=$WORK/td-backend-number
cp -r "$WORK/td" "$src"
printf '{"sharded_backend": 5}' > "$src/release/metadata.json"
fails_naming "metadata.json sharded_backend: 5" "$src/release/metadata.json: no \"sharded_backend\" string" -- inspect "$src"
printf '{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 8, "intermediate_size": 96, "vocab_size": 250, "num_key_value_heads": 2, "model_type": 5}' > "$WORK/given-type.json"
cp -r "$WORK/td" "$WORK/td-nocommon" && rm "$WORK/td-nocommon/release/common.pt"
run_ckptfs inspect -o "hf_config=$WORK/given-type.json" "$WORK/td-nocommon"
why=$(how_it_ended)
[[ -z $why && $rc -eq 0 ]]
ok $? "-o hf_config with \"model_type\": 5 over a source without args: read as no model type, no crash (${why:-rc $rc}: $(head -c 200 "$WORK/err"))"

# --- the tracker (latest_checkpointed_iteration.txt) ---
declare -A tracker_says=(
  [fifo]="not a regular file (a FIFO)"
  [devzero]="not a regular file (a character device)"
  [directory]="not a regular file (a directory)"
  [oversize]="1048576 bytes, more than the 4096 this file may have"
)
for base in td leg; do
  for kind in fifo devzero directory oversize; do
    src=$WORK/$base-tracker-$kind
    cp -r "$WORK/$base" "$src"
    tracker=$src/latest_checkpointed_iteration.txt
    rm -f "$tracker"
    case $kind in
      fifo) mkfifo "$tracker" ;;
      devzero) ln -s /dev/zero "$tracker" ;;
      directory) mkdir "$tracker" ;;
      oversize) truncate -s 1M "$tracker" ;;
    esac
    fails_naming "$base tracker $kind" "$tracker: ${tracker_says[$kind]}" -- inspect "$src"
    mkdir -p "$WORK/mnt-$base-tracker-$kind"
    fails_naming "$base tracker $kind" "$tracker: ${tracker_says[$kind]}" -- mount "$src" "$WORK/mnt-$base-tracker-$kind"
  done
  # A tracker with a newline inside: one line all the same.
  src=$WORK/$base-tracker-text
  cp -r "$WORK/$base" "$src"
  printf 'rel\nease\n' > "$src/latest_checkpointed_iteration.txt"
  fails_naming "$base tracker 'rel\\nease'" "$src/latest_checkpointed_iteration.txt: 'rel\\nease' is neither" -- inspect "$src"
  # No tracker: the iteration directory given itself is a checkpoint, as before.
  src=$WORK/$base-no-tracker
  cp -r "$WORK/$base" "$src"
  rm "$src/latest_checkpointed_iteration.txt"
  run_ckptfs inspect "$src/release"
  why=$(how_it_ended)
  [[ -z $why && $rc -eq 0 ]] && grep -q megatron "$WORK/out"
  ok $? "$base without a tracker: its release/ directory is inspected as a Megatron checkpoint (${why:-rc $rc})"
  check "$base without a tracker: its release/ directory mounts" mount_ckptfs "$src/release" "$WORK/mnt-$base-no-tracker"
done

done_testing
