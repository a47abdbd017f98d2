#!/usr/bin/env bash
# ckptfs on shared training nodes: other users read only what the source lets them read
# (allow_other), a comma in the source path is not a mount option, mount points are not
# mounted over by accident, a source rewritten under a mount gives EIO (never mixed bytes),
# sources with thousands of files work under a low descriptor limit, and special files (FIFOs,
# directories, symlink loops) in a source fail cleanly, naming the file.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
models="$TESTS_TOP/tests/lib/models.py"
mounted_under() { grep -c " $1 " /proc/mounts; }
# Other users must reach the mount points below $WORK.
chmod 0711 "$WORK"
NOBODY=(setpriv --reuid=65534 --regid=65534 --clear-groups)
nobody_reads() { "${NOBODY[@]}" cat "$1" > /dev/null; }

# --- permissions with allow_other, read as another user
src=$WORK/perm-src
$PY "$models" write llama "$src" > /dev/null
chmod 0755 "$src"
echo '{"secret": 1}' > "$src/secret.json" && chmod 0600 "$src/secret.json"
echo '{"open": 1}' > "$src/tokenizer.json" && chmod 0644 "$src/tokenizer.json"
mkdir -p "$WORK/outside" && echo 'root:hash' > "$WORK/outside/shadow" && chmod 0600 "$WORK/outside/shadow"
ln -s "$WORK/outside/shadow" "$src/planted.json"
chmod 0644 "$src/model.safetensors" "$src/config.json"
mnt=$WORK/mnt-perm
check "mount with allow_other" mount_ckptfs "$src" "$mnt" -o allow_other
grep " $mnt " /proc/mounts | grep -q default_permissions; ok $? "default_permissions is on"
check "another user reads a 0644 source file through hf/" "${NOBODY[@]}" cat "$mnt/hf/tokenizer.json"
"${NOBODY[@]}" cat "$mnt/hf/secret.json" > /dev/null 2>&1 && rc=0 || rc=1
ok $((1 - rc)) "another user cannot read a 0600 source file through hf/"
"${NOBODY[@]}" cat "$mnt/hf/planted.json" > /dev/null 2>&1 && rc=0 || rc=1
ok $((1 - rc)) "nor a planted symlink to a 0600 file outside the source"
check "root still reads it (the symlink is followed)" cmp "$WORK/outside/shadow" "$mnt/hf/planted.json"
check "hf/secret.json is 0400, owned like its source" test "$(stat -c %a:%u "$mnt/hf/secret.json")" = "400:$(stat -c %u "$src/secret.json")"
check "hf/model.safetensors is 0444" test "$(stat -c %a "$mnt/hf/model.safetensors")" = 444
check "another user loads a rank file made of 0644 shards" nobody_reads "$mnt/tp2pp1/release/mp_rank_00/model_optim_rng.pt"
# A synthesized file is as restrictive as the files it reads: one 0600 shard closes the rank files.
src2=$WORK/perm-src2
$PY "$models" write llama "$src2" --shards 2 > /dev/null
chmod 0755 "$src2"; chmod 0644 "$src2"/*; chmod 0600 "$src2/model-00002-of-00002.safetensors"
mnt=$WORK/mnt-perm2
check "mount a source with one 0600 shard" mount_ckptfs "$src2" "$mnt" -o allow_other
check "tp1pp1's rank file reads both shards: 0400" test "$(stat -c %a "$mnt/tp1pp1/release/mp_rank_00/model_optim_rng.pt")" = 400
"${NOBODY[@]}" cat "$mnt/tp1pp1/release/mp_rank_00/model_optim_rng.pt" > /dev/null 2>&1 && rc=0 || rc=1
ok $((1 - rc)) "another user cannot read it"
check "the 0644 shard stays readable to others" nobody_reads "$mnt/hf/model-00001-of-00002.safetensors"

# --- a comma in the source path is part of the name, not a mount option
src=$WORK/src,allow_other
cp -r "$WORK/perm-src" "$src"; rm -f "$src/planted.json"
mnt=$WORK/mnt-comma
check "mount a source whose path holds ',allow_other'" mount_ckptfs "$src" "$mnt"
awk -v m="$mnt" '$2 == m {print $4}' /proc/mounts | grep -q allow_other && rc=1 || rc=0
ok $rc "the mount has no allow_other ($(grep " $mnt " /proc/mounts | cut -d' ' -f4))"
"${NOBODY[@]}" ls "$mnt" > /dev/null 2>&1 && rc=0 || rc=1
ok $((1 - rc)) "another user cannot enter it"
grep -q "^$WORK/src,allow_other $mnt " /proc/mounts; ok $? "fsname is the source path, comma included"

# --- mount points
mnt=$WORK/mnt-full
mkdir -p "$mnt" && touch "$mnt/file"
"$CKPTFS" mount "$WORK/perm-src" "$mnt" 2> "$WORK/err" && rc=0 || rc=$?
[[ $rc -ne 0 && $(mounted_under "$mnt") -eq 0 ]] && grep -q "not empty" "$WORK/err"
ok $? "a non-empty mount point is refused ($(cat "$WORK/err"))"
check "-o nonempty mounts over it" mount_ckptfs "$WORK/perm-src" "$mnt" -o nonempty
check "  and serves the views" test -d "$mnt/hf"
mnt=$WORK/mnt-perm
"$CKPTFS" mount "$WORK/perm-src" "$mnt" 2> "$WORK/err" && rc=0 || rc=$?
[[ $rc -ne 0 && $(mounted_under "$mnt") -eq 1 ]] && grep -q "already a ckptfs mount" "$WORK/err"
ok $? "mounting twice on one point is refused ($(cat "$WORK/err"))"

# --- a source changed under the mount: EIO from the first read after the change
live=$WORK/live
$PY "$models" write llama "$live" > /dev/null
big=$live/model.safetensors
mnt=$WORK/mnt-live
mkdir -p "$mnt"
"$CKPTFS" mount -f "$live" "$mnt" 2> "$WORK/live.log" &
for _ in $(seq 100); do [[ $(mounted_under "$mnt") -eq 1 ]] && break; sleep 0.1; done
ok $((1 - $(mounted_under "$mnt"))) "mount in the foreground, logging to a file"
size=$(stat -c %s "$big")
# One reader keeps a descriptor open across the change; another opens afterwards.
$PY - "$mnt/hf/model.safetensors" "$big" "$size" > "$WORK/live.out" 2>&1 <<'PY'
import os, subprocess, sys
view, source, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
fd = os.open(view, os.O_RDONLY)
before = os.pread(fd, 4096, 0)
old = open(source, "rb").read()
print("first read old:", before == old[:4096])
st = os.stat(source)
# Rewrite the middle in place with the same size, then put the mtime back.
with open(source, "r+b") as f:
    f.seek(size // 2)
    f.write(bytes(b ^ 0xFF for b in old[size // 2:size // 2 + 4096]))
os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
try:
    data = os.pread(fd, 4096, size // 2)
    print("read after change: got", "old" if data == old[size // 2:size // 2 + 4096] else "NEW OR MIXED")
except OSError as e:
    print("read after change:", e.strerror)
try:
    open(view, "rb").read()
    print("fresh open: read")
except OSError as e:
    print("fresh open:", e.strerror)
PY
cat "$WORK/live.out" | sed 's/^/# /'
grep -q "first read old: True" "$WORK/live.out"; ok $? "bytes read before the change are the old ones"
grep -q "read after change: Input/output error" "$WORK/live.out"; ok $? "an open descriptor gets EIO after an in-place rewrite with the mtime restored"
grep -q "fresh open: Input/output error" "$WORK/live.out"; ok $? "a fresh open gets EIO too"
grep -q "$big: source file changed" "$WORK/live.log"; ok $? "the log names the source file"
check "a view file of other sources still reads" cat "$mnt/hf/config.json"
fusermount3 -u "$mnt"; wait

# Grown in place (appended): the same.
$PY "$models" write llama "$live" > /dev/null
mnt=$WORK/mnt-live2
check "remount" mount_ckptfs "$live" "$mnt"
head -c 100 "$mnt/hf/model.safetensors" > /dev/null
printf 'x' >> "$big"
cat "$mnt/tp1pp1/release/mp_rank_00/model_optim_rng.pt" > /dev/null 2>&1 && rc=0 || rc=1
ok $((1 - rc)) "a rank file reading an appended-to shard gives EIO"

# --- many files, few descriptors
many=$WORK/many
$PY "$TESTS_TOP/tests/lib/many_shards.py" "$many" 5000
mnt=$WORK/mnt-many
mkdir -p "$mnt"
(ulimit -n 256 && "$CKPTFS" mount "$many" "$mnt") 2> "$WORK/err"
ok $? "a 5,000-file source mounts under ulimit -n 256 ($(head -c 200 "$WORK/err"))"
check "every one of its 5,000 shards reads back identical through hf/" $PY - "$many" "$mnt/hf" <<'PY'
import os, sys
src, view = sys.argv[1:]
names = sorted(n for n in os.listdir(src))
bad = [n for n in names if open(os.path.join(src, n), "rb").read() != open(os.path.join(view, n), "rb").read()]
sys.exit(f"{len(bad)} differ: {bad[:3]}" if bad else 0)
PY
pid=$(pgrep -f "ckptfs mount $many $mnt" | head -1)
n_fds=$(ls /proc/$pid/fd 2>/dev/null | wc -l)
[[ $n_fds -gt 0 && $n_fds -le 256 ]]; ok $? "the daemon holds $n_fds descriptors"
(ulimit -n 256 && timeout 120 "$CKPTFS" inspect "$many" > /dev/null) 2> "$WORK/err"
ok $? "inspect works under the same limit ($(head -c 200 "$WORK/err"))"

# --- special files in a source
spec=$WORK/special
$PY "$models" write llama "$spec/fifo-weights" > /dev/null
rm "$spec/fifo-weights/model.safetensors"; mkfifo "$spec/fifo-weights/model.safetensors"
$PY "$models" write llama "$spec/dir-weights" > /dev/null
rm "$spec/dir-weights/model.safetensors"; mkdir "$spec/dir-weights/model.safetensors"
$PY "$models" write llama "$spec/loop-weights" > /dev/null
rm "$spec/loop-weights/model.safetensors"; ln -s model.safetensors "$spec/loop-weights/model.safetensors"
"$CKPTFS" export "$spec/fifo-weights/../../perm-src" tp2pp1 "$spec/fifo-rank" > /dev/null 2>&1 ||
  "$CKPTFS" export "$WORK/perm-src" tp2pp1 "$spec/fifo-rank"
f=$spec/fifo-rank/release/mp_rank_01/model_optim_rng.pt
rm "$f"; mkfifo "$f"
for case in "fifo-weights|model.safetensors|a FIFO" "dir-weights|model.safetensors|a directory" \
            "loop-weights|model.safetensors|symlink loop" "fifo-rank|mp_rank_01/model_optim_rng.pt|a FIFO"; do
  IFS='|' read -r kind w1 w2 <<< "$case"
  timeout 20 "$CKPTFS" inspect "$spec/$kind" > /dev/null 2> "$WORK/err" && rc=0 || rc=$?
  [[ $rc -ne 0 && $rc -lt 124 && $(wc -l < "$WORK/err") -eq 1 ]] && grep -qF -- "$w1" "$WORK/err" && grep -qF -- "$w2" "$WORK/err"
  ok $? "$kind: inspect fails at once, naming $w1 as $w2 (rc $rc: $(head -c 200 "$WORK/err"))"
  mkdir -p "$WORK/m-$kind"
  timeout 20 "$CKPTFS" mount "$spec/$kind" "$WORK/m-$kind" > /dev/null 2> "$WORK/err" && rc=0 || rc=$?
  [[ $rc -ne 0 && $rc -lt 124 && $(mounted_under "$WORK/m-$kind") -eq 0 ]] && grep -qF -- "$w2" "$WORK/err"
  ok $? "$kind: mount fails at once (rc $rc)"
done

# --- the FUSE session loop's settings: a /dev/fuse queue per worker, fewer workers; bad values refused
src=$WORK/perm-src2
loop_mnt=$WORK/mnt-loop
ref_mnt=$WORK/mnt-loop-ref
if mount_ckptfs "$src" "$loop_mnt" -o clone_fd,max_threads=3,max_idle_threads=1 && mount_ckptfs "$src" "$ref_mnt"; then
  check "clone_fd,max_threads=3: 8 readers at once get the bytes of a default mount" bash -c '
    pids=(); for i in 1 2 3 4 5 6 7 8; do
      r=$(( i % 2 )); cmp "$1/tp2pp1/release/mp_rank_0$r/model_optim_rng.pt" "$2/tp2pp1/release/mp_rank_0$r/model_optim_rng.pt" & pids+=($!); done
    for p in "${pids[@]}"; do wait "$p" || exit 1; done' _ "$loop_mnt" "$ref_mnt"
else
  ok 1 "mount with clone_fd,max_threads=3,max_idle_threads=1"
fi
for bad in max_threads=0 max_threads=257 max_idle_threads=x; do
  mkdir -p "$WORK/mnt-bad-loop"
  "$CKPTFS" mount -o "$bad" "$src" "$WORK/mnt-bad-loop" 2> "$WORK/err" && rc=0 || rc=$?
  [[ $rc -ne 0 && $(mounted_under "$WORK/mnt-bad-loop") -eq 0 ]] && grep -qF "option $bad" "$WORK/err"
  ok $? "-o $bad refused, naming it ($(head -c 120 "$WORK/err"))"
done
done_testing
