#!/usr/bin/env bash
# hf/ over Hugging Face sources: pass-through byte identity, re-sharding at several sizes
# (checked by an independent reader against the rules), cat/export/cp equality, ls, concurrent
# random reads, read-only behaviour, a source changed after the mount, and loading with torch
# 2.6 + the real safetensors library.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
models="$TESTS_TOP/tests/lib/models.py"
check_hf="$TESTS_TOP/tests/lib/check_hf.py"

$PY "$models" write llama "$WORK/sharded" --shards 3 --tokenizer
$PY "$models" write qwen2 "$WORK/single"
$PY "$models" write mixed "$WORK/mixed" --shards 2
(cd "$WORK" && find sharded single mixed -type f -exec sha256sum {} + | sort) > "$WORK/sums.before"

for src in sharded single mixed; do
  mnt=$WORK/mnt-$src
  check "$src: mounts" mount_ckptfs "$WORK/$src" "$mnt"
  check "$src: hf/ lists exactly the source's files" \
    diff <(ls "$WORK/$src") <(ls "$mnt/hf")
  same=0
  for f in "$WORK/$src"/*; do cmp -s "$f" "$mnt/hf/$(basename "$f")" || same=1; done
  ok $same "$src: every hf/ file is byte-identical to the source"
  check "$src: tensors read back equal (independent reader)" $PY "$check_hf" compare "$WORK/$src" "$mnt/hf"
  check "$src: ckptfs ls sizes match stat" diff \
    <("$CKPTFS" ls "$WORK/$src" hf | sort -k2) \
    <(cd "$mnt/hf" && stat -c '%s	%n' * | sort -k2)
done

# Re-sharding: every tensor alone, a middle size, everything in one model.safetensors.
for size in 1 64K 40000 100M; do
  bytes=$($PY -c "import sys; s=sys.argv[1]; print(int(s[:-1])*1024 if s.endswith('K') else int(s[:-1])*1024**2 if s.endswith('M') else int(s))" $size)
  for src in sharded mixed; do
    mnt=$WORK/mnt-$src-$size
    check "$src hf_shard_size=$size: mounts" mount_ckptfs "$WORK/$src" "$mnt" -o hf_shard_size=$size
    check "$src hf_shard_size=$size: shards, headers, index and tensors follow the rules" \
      $PY "$check_hf" compare "$WORK/$src" "$mnt/hf" --shard-size "$bytes"
    for f in tokenizer.json config.json; do
      [[ -e $WORK/$src/$f ]] || continue
      check "$src hf_shard_size=$size: $f passes through" cmp "$WORK/$src/$f" "$mnt/hf/$f"
    done
  done
done

# cat, export and cp -r agree with reads through the mount.
mnt=$WORK/mnt-sharded-64K
check "export writes the re-sharded view" "$CKPTFS" export "$WORK/sharded" hf "$WORK/export" -o hf_shard_size=64K
check "cp -r of the mount equals the export" diff -r "$mnt/hf" "$WORK/export"
f=$(ls "$mnt/hf" | grep safetensors | head -1)
check "cat equals the mounted file" cmp <("$CKPTFS" cat "$WORK/sharded" "hf/$f" -o hf_shard_size=64K) "$mnt/hf/$f"
"$CKPTFS" export "$WORK/sharded" hf "$WORK/export" -o hf_shard_size=64K 2>"$WORK/err" && rc=0 || rc=1
ok $((1 - rc)) "export refuses to overwrite existing files"
check "its message names the file" grep -q "$f\|exists" "$WORK/err"

# Four concurrent readers with random offsets and lengths, some past the end.
pids=()
for i in 1 2 3 4; do
  for g in "$mnt/hf/"*.safetensors; do
    $PY "$check_hf" random-reads "$g" "$WORK/export/$(basename "$g")" 150 &
    pids+=($!)
  done
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
ok $rc "4 concurrent readers x every shard: random reads equal the exported bytes"

# Read-only: the kernel refuses every change to a read-only mount before it reaches ckptfs.
set_xattr() { $PY -c "import os, sys; os.setxattr(sys.argv[1], 'user.x', b'1')" "$1"; }
mnt=$WORK/mnt-sharded
for cmd in "touch $mnt/hf/new" "rm $mnt/hf/config.json" "mkdir $mnt/hf/d" \
           "mv $mnt/hf/config.json $mnt/hf/c2" "truncate -s 0 $mnt/hf/config.json" \
           "chmod 600 $mnt/hf/config.json" "ln $mnt/hf/config.json $mnt/hf/hard" \
           "ln -s config.json $mnt/hf/soft" "mkfifo $mnt/hf/fifo" "rmdir $mnt/hf" \
           "set_xattr $mnt/hf/config.json" \
           "chown nobody $mnt/hf/config.json" \
           "fallocate -l 4096 $mnt/hf/config.json"; do
  out=$($cmd 2>&1) && rc=0 || rc=1
  [[ $rc -eq 1 && $out == *"Read-only file system"* ]]; ok $? "EROFS: $cmd"
done
out=$( (echo x >> "$mnt/hf/config.json") 2>&1) && rc=0 || rc=1
[[ $rc -eq 1 && $out == *"Read-only file system"* ]]; ok $? "EROFS: append to a file"
(cd "$WORK" && find sharded single mixed -type f -exec sha256sum {} + | sort) > "$WORK/sums.after"
check "the source directories are unchanged" diff "$WORK/sums.before" "$WORK/sums.after"

# A source file changed after the mount: EIO, never mixed data.
cp -r "$WORK/single" "$WORK/changing"
check "mount a source that will change" mount_ckptfs "$WORK/changing" "$WORK/mnt-changing"
printf 'x' >> "$WORK/changing/model.safetensors"
cat "$WORK/mnt-changing/hf/model.safetensors" > /dev/null 2>"$WORK/err" && rc=0 || rc=1
ok $((1 - rc)) "reading a view file whose source changed fails"
check "with EIO" grep -q "Input/output error" "$WORK/err"

# torch 2.6 and the real safetensors library, in the Debian 13 root.
if torch2_available; then
  for v in sharded mixed sharded-64K sharded-1 mixed-1; do
    src=${v%%-*}
    check "torch 2.6: safe_open/load_file over mnt-$v/hf" \
      torch2_python "$WORK" "$check_hf" safe-open "$WORK/$src" "$WORK/mnt-$v/hf"
  done
else
  skip "torch 2.6 loads: $TORCH2_WHY"
fi
done_testing
