#!/usr/bin/env bash
# Packed checkpoints (ckptfs pack): for every source kind, the packed copy mounts and serves
# every view byte for byte as the original does (both codecs, odd frame sizes, random reads
# across frame boundaries); corrupt or hostile containers give EIO or a refusal naming the file,
# never wrong bytes; inspect shows the codec and ratios; pack refuses what it must.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
pc="$TESTS_TOP/tests/lib/pack_check.py"
models="$TESTS_TOP/tests/lib/models.py"
if ! $PY -c 'import xxhash' 2>/dev/null; then
  echo "1..0 # skip python3-xxhash missing (scripts/install-deps.sh --tests installs it)"
  exit 0
fi

$PY "$models" write llama "$WORK/llama" --shards 2 > /dev/null
$PY "$TESTS_TOP/tests/lib/deepseek_reference.py" write "$WORK/ds-fp8" --variant v3 --fp8 --shards 2 > /dev/null

# same_views RAW PACKED VIEW...: every file of each view of the two mounts is byte-identical.
same_views() {
  local raw=$1 packed=$2 v f n=0 bad=0
  shift 2
  for v in "$@"; do
    while IFS= read -r f; do
      n=$((n + 1))
      cmp -s "$raw/$v/$f" "$packed/$v/$f" || { echo "differs: $v/$f"; bad=1; }
    done < <(cd "$raw/$v" && find . -type f | sort)
  done
  echo "# $n files compared"
  [[ $n -gt 0 && $bad -eq 0 ]]
}

# packed_case NAME SRC "PACK OPTIONS" "MOUNT OPTIONS" VIEW...
packed_case() {
  local name=$1 src=$2 popts=$3 mopts=$4 dest=$WORK/packed-$1
  shift 4
  if ! "$CKPTFS" pack "$src" "$dest" ${popts:+-o "$popts"} --verify 2> "$WORK/pack-$name.log"; then
    ok 1 "$name: pack --verify ($(tail -1 "$WORK/pack-$name.log"))"
    return
  fi
  ok 0 "$name: pack ${popts:-(defaults)} --verify ($(tail -1 "$WORK/pack-$name.log"))"
  check "$name: DEST mirrors SRC: packed files are containers of the original size, others identical" \
    $PY "$pc" check-dir "$src" "$dest"
  if ! mount_ckptfs "$src" "$WORK/raw-$name" ${mopts:+-o "$mopts"} ||
    ! mount_ckptfs "$dest" "$WORK/mnt-$name" ${mopts:+-o "$mopts"}; then
    ok 1 "$name: mounts"
    return
  fi
  check "$name: views $* byte-identical to the unpacked source's" \
    same_views "$WORK/raw-$name" "$WORK/mnt-$name" "$@"
}

real=$TESTDATA
packed_case llama-zstd "$WORK/llama" "" "" hf tp2pp1 tp1pp2vpp2 mcore
packed_case llama-lz4 "$WORK/llama" "codec=lz4,frame=69632" "" hf tp2pp2 mcore
packed_case llama-zstd9-small "$WORK/llama" "codec=zstd,level=9,frame=65536" "" hf tp4pp1
packed_case ds-fp8 "$WORK/ds-fp8" "frame=131072" "" hf tp2pp1ep4 mcore
packed_case ds-fp8-bf16 "$WORK/ds-fp8" "codec=lz4" "dtype=bf16" hf tp1pp2ep2
mc=$real/megatron-core-0.17.1
packed_case megatron-legacy "$mc/llama-tp2pp2-torch" "frame=65536" "" hf tp1pp1 tp2pp2
packed_case megatron-torch_dist "$mc/llama-tp2pp2-torch_dist" "" "" hf tp2pp1 mcore
packed_case moe-torch_dist "$mc/mixtral-tp1pp2ep2-torch_dist" "codec=lz4" "" hf tp1pp1ep2
packed_case moe-legacy "$mc/mixtral-tp2pp1ep2-torch" "frame=1M" "" hf tp1pp2ep2
packed_case qwen2_moe-legacy "$mc/qwen2_moe-tp1pp1ep2-torch-noopt" "codec=lz4,frame=65536" "" hf tp2pp1ep2
packed_case hf-mixtral "$mc/hf-mixtral" "" "" hf tp2pp1ep2 mcore
packed_case verl-fsdp2 "$real/verl-fsdp/fsdp2/llama-w4/global_step_1/actor" "frame=65536" "" hf tp2pp1
packed_case verl-fsdp1-hsdp "$real/verl-fsdp/fsdp1/llama-w4-hsdp2/global_step_1/actor" "codec=lz4" "dtype=fp32" hf

# Random reads across frame boundaries: the packed hf/ file (the original bytes, decoded frame
# by frame) against the source file itself.
shard=model-00001-of-00002.safetensors
for c in llama-lz4 llama-zstd9-small; do
  [[ -d $WORK/mnt-$c ]] || continue
  check "$c: 400 random reads of hf/$shard equal the source file" \
    $PY "$pc" random "$WORK/llama/$shard" "$WORK/mnt-$c/hf/$shard" 400 7
done

# Prefetch: the same bytes, read while the source ranges ahead are asked for (raw source) or
# decoded ahead on decoder threads (packed: on by default, off with prefetch=0, and a small frame
# cache that leaves room for fewer frames ahead), with many readers at once.
for v in llama:prefetch=32M packed-llama-zstd:prefetch=32M packed-llama-zstd:prefetch=0 \
  packed-llama-zstd:frame_cache=6M packed-llama-zstd:prefetch=auto llama:source_fds=reader \
  packed-llama-zstd:source_fds=reader llama:source_fds=reader,prefetch=32M; do
  src=${v%%:*} opt=${v#*:}
  m=$WORK/mnt-prefetch-$src-${opt//[=,]/-}
  if mount_ckptfs "$WORK/$src" "$m" -o "$opt,layouts=tp4pp1"; then
    check "$src -o $opt: tp4pp1 and hf/ read by 4 readers at once equal the raw mount's" bash -c '
      pids=(); for r in 0 1 2 3; do cmp "$1/tp4pp1/release/mp_rank_0$r/model_optim_rng.pt" "$2/tp4pp1/release/mp_rank_0$r/model_optim_rng.pt" & pids+=($!); done
      cmp "$1/hf/'"$shard"'" "$2/hf/'"$shard"'" || exit 1
      for p in "${pids[@]}"; do wait "$p" || exit 1; done' _ "$m" "$WORK/raw-llama-zstd"
  else
    ok 1 "$src -o $opt: mount"
  fi
done

mkdir -p "$WORK/mnt-bad-prefetch"
"$CKPTFS" mount -o prefetch=65G "$WORK/packed-llama-zstd" "$WORK/mnt-bad-prefetch" 2> "$WORK/err" && rc=0 || rc=$?
[[ $rc -ne 0 ]] && ! grep -q " $WORK/mnt-bad-prefetch " /proc/mounts && grep -q "prefetch=65G: at most 64G" "$WORK/err"
ok $? "-o prefetch=65G refused ($(head -c 100 "$WORK/err"))"

# A daemon started where sched_getattr(2) is denied (GLib then starts pool threads from a helper
# thread that a forked daemon would not have): decoding ahead still works in the background
# daemon, and the read finishes.
deny=$(dirname "$CKPTFS")/tests/lib/deny_sched_getattr
if [[ -x $deny && -d $WORK/packed-llama-zstd ]]; then
  m=$WORK/mnt-deny
  mkdir -p "$m"
  if timeout 60 "$deny" "$CKPTFS" mount "$WORK/packed-llama-zstd" "$m"; then
    pid=$(pgrep -n -f -- "mount $WORK/packed-llama-zstd $m")
    check "sched_getattr denied: a background daemon decodes ahead and serves hf/ (no hang)" \
      timeout 60 cmp "$m/hf/$shard" "$WORK/llama/$shard"
    fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m"
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true # a daemon hung in the read
  else
    ok 1 "sched_getattr denied: mount"
  fi
else
  skip "no $deny (built with the tests) or no packed-llama-zstd"
fi

"$CKPTFS" inspect "$WORK/packed-llama-zstd" > "$WORK/inspect" 2>&1
check "inspect: codec, ratio and the 2-byte (bf16) class" grep -qE "^packed: +2 files, zstd, .* 2-byte 0\.[0-9]+" "$WORK/inspect"
"$CKPTFS" inspect --json "$WORK/packed-llama-lz4" > "$WORK/inspect.json" 2>&1
check "inspect --json: codec lz4, ratio per file" $PY -c '
import json, sys
p = json.load(open(sys.argv[1]))["packed"]
assert p["codec"] == "lz4" and len(p["files"]) == 2 and 0 < p["ratio"] <= 1.01, p' "$WORK/inspect.json"
# The trailer's codec (informational) naming a codec this build does not know: inspect names it
# by its number (the frames, each of a known codec, still read).
cp -r "$WORK/packed-llama-lz4" "$WORK/codec-unknown"
for f in "$WORK"/codec-unknown/*.safetensors; do
  printf '\x07' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") - 16)) conv=notrunc status=none
done
"$CKPTFS" inspect "$WORK/codec-unknown" > "$WORK/inspect-unknown" 2>&1
"$CKPTFS" inspect --json "$WORK/codec-unknown" > "$WORK/inspect-unknown.json" 2>&1
check "inspect: a trailer's unknown codec 7 is 'codec 7'" grep -qE "^packed: +2 files, codec 7, " "$WORK/inspect-unknown"
check "inspect --json: the same" \
  $PY -c 'import json, sys; assert json.load(open(sys.argv[1]))["packed"]["codec"] == "codec 7"' "$WORK/inspect-unknown.json"

# Damaged containers: refused at mount (naming the file), or EIO on read with a log line naming
# file and frame; never wrong bytes.
for kind in flip truncate index-sum overlap past-eof longer shorter codec trailer; do
  d=$WORK/bad-$kind
  cp -r "$WORK/packed-llama-zstd9-small" "$d"
  $PY "$pc" damage "$d/$shard" "$kind" > /dev/null
  m=$WORK/mnt-bad-$kind
  mkdir -p "$m"
  "$CKPTFS" mount -f "$d" "$m" 2> "$WORK/bad-$kind.log" &
  for _ in $(seq 50); do mountpoint -q "$m" && break; kill -0 $! 2>/dev/null || break; sleep 0.1; done
  if ! mountpoint -q "$m"; then
    wait $! 2>/dev/null
    check "$kind: refused at mount, naming the file and the problem" \
      grep -q "$shard: packed container" "$WORK/bad-$kind.log"
    continue
  fi
  if cmp -s "$m/hf/$shard" "$WORK/llama/$shard" 2> /dev/null; then
    got=same
  elif cat "$m/hf/$shard" > /dev/null 2> "$WORK/bad-$kind.err"; then
    got=WRONG
  else
    got=eio
  fi
  fusermount3 -u "$m"
  wait
  if [[ $kind == flip || $kind == longer || $kind == shorter ]]; then
    ok $([[ $got == eio ]] && echo 0 || echo 1) "$kind: reading the damaged file fails ($got), never wrong bytes"
    check "$kind: the log names the file and the frame" grep -q "$shard: packed frame [0-9]* (original bytes" "$WORK/bad-$kind.log"
  else
    ok 1 "$kind: mounted although the container is inconsistent ($got)"
  fi
done

# pack refuses a non-empty destination and writes nothing into the source.
mkdir -p "$WORK/full" && touch "$WORK/full/x"
"$CKPTFS" pack "$WORK/llama" "$WORK/full" > /dev/null 2> "$WORK/err" && rc=0 || rc=1
ok $((1 - rc)) "pack into a non-empty directory is refused ($(head -1 "$WORK/err"))"
before=$(find "$WORK/llama" -type f | sort | xargs md5sum | md5sum)
"$CKPTFS" pack "$WORK/llama" "$WORK/again" -o codec=lz4 > /dev/null 2>&1
after=$(find "$WORK/llama" -type f | sort | xargs md5sum | md5sum)
ok $([[ $before == "$after" ]] && echo 0 || echo 1) "the source directory is unchanged by pack"
"$CKPTFS" pack "$WORK/llama" "$WORK/bad-codec" -o codec=brotli > /dev/null 2> "$WORK/err" && rc=0 || rc=1
ok $((1 - rc)) "an unknown codec is refused ($(head -1 "$WORK/err"))"

done_testing
