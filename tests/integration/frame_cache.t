#!/usr/bin/env bash
# -o frame_cache below one frame of a packed source: the cache would keep no frame between two
# reads of it, every read decoding its frame again (docs/compression.md). Refused by mount,
# inspect, ls, cat and export with one line naming the option, the file with the largest frame
# and the size needed; that size itself works; a source that is not packed ignores the option.
source "$(dirname "$0")/../lib/common.sh"
require_fuse

src=$WORK/llama
$PY "$TESTS_TOP/tests/lib/models.py" write llama "$src" --layers 2 > /dev/null
frame=65536
check "pack -o frame=$frame" "$CKPTFS" pack -o frame=$frame "$src" "$WORK/packed"

# refused DESCRIPTION ARGS...: fails (not by a signal) with one line naming the option, a packed
# file and the frame size.
refused() {
  local desc=$1
  shift
  timeout 60 "$CKPTFS" "$@" > /dev/null 2> "$WORK/err" && rc=0 || rc=$?
  [[ $rc -ne 0 && $rc -ne 124 && $rc -lt 128 && $(wc -l < "$WORK/err") -eq 1 ]] &&
    grep -qF "option frame_cache" "$WORK/err" && grep -qF "$WORK/packed/" "$WORK/err" &&
    grep -qF "frame_cache=$frame" "$WORK/err"
  ok $? "$desc (rc $rc: $(head -c 250 "$WORK/err"))"
}
for small in 4096 $((frame - 1)); do
  refused "inspect -o frame_cache=$small: refused" inspect -o frame_cache=$small "$WORK/packed"
  mkdir -p "$WORK/mnt-$small"
  refused "mount -o frame_cache=$small: refused" mount -o frame_cache=$small "$WORK/packed" "$WORK/mnt-$small"
  check "  nothing mounted" bash -c "! mountpoint -q '$WORK/mnt-$small'"
done
refused "ls -o frame_cache=4096: refused" ls -o frame_cache=4096 "$WORK/packed" hf
refused "cat -o frame_cache=4096: refused" cat -o frame_cache=4096 "$WORK/packed" hf/model.safetensors
refused "export -o frame_cache=4096: refused" export -o frame_cache=4096 "$WORK/packed" tp1pp1 "$WORK/export"
check "  export wrote nothing" test ! -e "$WORK/export"

check "mount -o frame_cache=$frame (one frame) works" mount_ckptfs "$WORK/packed" "$WORK/mnt" -o frame_cache=$frame
check "  and serves the original bytes" cmp "$src/model.safetensors" "$WORK/mnt/hf/model.safetensors"
check "an unpacked source ignores -o frame_cache=4096" "$CKPTFS" inspect -o frame_cache=4096 "$src"
done_testing
