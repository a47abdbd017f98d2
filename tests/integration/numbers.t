#!/usr/bin/env bash
# Numbers given to ckptfs are digits only: a sign, a space, a unit where none belongs, or more
# than 64 bits is refused with one line naming the option (or the file) and the text, never read
# the way strtoul reads it ("-1" as 2^64 - 1: -o iteration=-1 looked for iter_18446744073709551615).
# Every number option of mount/inspect, of the FUSE session and of pack; the Megatron tracker.
source "$(dirname "$0")/../lib/common.sh"
require_fuse

src=$WORK/llama
$PY "$TESTS_TOP/tests/lib/models.py" write llama "$src" --layers 2 > /dev/null
bad_values=(-1 +1 " 1" "1 " 1x 0x10 18446744073709551616 99999999999999999999999)

# refused DESCRIPTION NEEDLE... -- ARGS...: ckptfs ARGS fails (not by a signal or the timeout)
# with one line on stderr holding every NEEDLE, and no 2^64 - 1 in it.
refused() {
  local desc=$1 needles=() s named=0
  shift
  while [[ $1 != -- ]]; do needles+=("$1"); shift; done
  shift
  timeout 20 "$CKPTFS" "$@" > /dev/null 2> "$WORK/err" && rc=0 || rc=$?
  for s in "${needles[@]}"; do grep -qF -- "$s" "$WORK/err" || named=1; done
  [[ $rc -ne 0 && $rc -ne 124 && $rc -lt 128 && $(wc -l < "$WORK/err") -eq 1 && $named -eq 0 ]] &&
    ! grep -q 18446744073709551615 "$WORK/err"
  ok $? "$desc (rc $rc: $(head -c 200 "$WORK/err"))"
}

for key in iteration step pp_first pp_last vocab_divisible_by; do
  for value in "${bad_values[@]}"; do
    refused "-o $key='$value' refused by name" "option $key" "'$value'" -- inspect -o "$key=$value" "$src"
  done
done
for key in hf_shard_size frame_cache prefetch; do
  for value in -1 +1 " 1"; do
    refused "-o $key='$value' refused by name" "option $key" "'$value'" -- inspect -o "$key=$value" "$src"
  done
done
mkdir -p "$WORK/mnt"
for key in max_threads max_idle_threads; do
  for value in -1 +1 0 257 18446744073709551616; do
    refused "mount -o $key=$value refused by name" "option $key=$value" -- mount -o "$key=$value" "$src" "$WORK/mnt"
  done
done
check "  and nothing was mounted" bash -c "! mountpoint -q '$WORK/mnt'"
for key in level threads; do
  for value in -1 +1 " 1" 18446744073709551616; do
    refused "pack -o $key='$value' refused by name" "$key: '$value'" -- pack -o "$key=$value" "$src" "$WORK/packed-$key"
  done
done

# A Megatron checkpoint whose tracker says -1, +1, " 1 " (spaces around the number are fine:
# trackers end in a newline) or a number past 64 bits.
check "legacy Megatron source made (ckptfs export tp1pp1)" "$CKPTFS" export "$src" tp1pp1 "$WORK/leg"
tracker=$WORK/leg/latest_checkpointed_iteration.txt
for text in -1 +1 18446744073709551616; do
  printf '%s\n' "$text" > "$tracker"
  refused "tracker '$text' refused by name" "$tracker: '$text' is neither" -- inspect "$WORK/leg"
done
mv "$WORK/leg/release" "$WORK/leg/iter_0000001"
printf ' 1 \n' > "$tracker"
check "tracker ' 1 ' names iter_0000001" bash -c "'$CKPTFS' inspect '$WORK/leg' | grep -q megatron"
done_testing
