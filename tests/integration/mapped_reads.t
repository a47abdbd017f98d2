#!/usr/bin/env bash
# -o mapped_reads (on by default): the daemon takes read leases on the source files it maps and
# writes replies straight from the mappings, so a cached source byte is not read into the daemon
# first. Checked through /proc/locks (the daemon's leases) and the daemon's /proc/PID/io rchar;
# every view file equal to a mount with mapped_reads=off, at odd offsets too; a writer opening a
# shard goes on at once and the file is read with pread afterwards; a shard then changed in place
# gives EIO.
source "$(dirname "$0")/../lib/common.sh"
require_fuse

src=$WORK/llama
check "a 2-layer model with 512-wide rows written" $PY "$TESTS_TOP/tests/lib/models.py" write llama "$src" --layers 2 \
  --shards 2 --set hidden_size=512 --set intermediate_size=1024 --set vocab_size=4096
on=$WORK/mnt-on
off=$WORK/mnt-off
rank=tp2pp1/release/mp_rank_00/model_optim_rng.pt
# readahead=off: on 8 cores or more readahead=auto (the default) would push a lone reader's
# chunks, read from the source into the daemon; this is about the replies' own reads.
MOUNT_OPTS=layouts=tp2pp1,readahead=off fg_mount "$CKPTFS" "$src" "$on" "$WORK/on.log"
ok $? "mount with the default mapped_reads=on"
pid_on=$FG_PID
MOUNT_OPTS=layouts=tp2pp1,mapped_reads=off fg_mount "$CKPTFS" "$src" "$off" "$WORK/off.log"
ok $? "mount with mapped_reads=off"
pid_off=$FG_PID
shard=$(cd "$src" && ls -- *.safetensors | head -1)

leases_of() { grep -c "LEASE .* READ *$1 " /proc/locks; }
# read_cost PID FILE: what the daemon read (rchar) while FILE was read, over FILE's size, in %.
read_cost() {
  local before size
  size=$(stat -c %s "$2")
  before=$(daemon_io rchar "$1")
  cat "$2" > /dev/null
  echo $((($(daemon_io rchar "$1") - before) * 100 / size))
}
cat "$src"/*.safetensors > /dev/null # cached: mapped reads need the pages in memory
cost_off=$(read_cost "$pid_off" "$off/$rank")
[[ $cost_off -ge 100 ]]
ok $? "mapped_reads=off: the daemon read the rank file's bytes from the source ($cost_off% of its size)"
cost_on=$(read_cost "$pid_on" "$on/$rank")
held=$(leases_of "$pid_on")
if [[ $held -eq 0 ]]; then
  fs=$(stat -f -c %T "$src")
  for i in 1 2 3 4 5 6 7 8; do skip "no read lease on $src ($fs; leases are taken on ext4, xfs, btrfs, tmpfs and f2fs)"; done
else
  [[ $held -eq 2 ]]
  ok $? "the daemon holds a read lease on each of the 2 shards ($held)"
  # Pieces under 4 KiB (this model's row-parallel column slices) are still read and copied.
  [[ $((cost_on * 2)) -lt $cost_off ]]
  ok $? "mapped_reads=on: the daemon read $cost_on% of the rank file's size (the rest came from the mappings)"

  check "every file of hf/, tp2pp1/ and mcore/ is the same with mapped_reads on and off" \
    same_trees "$on" "$off" hf tp2pp1 mcore
  check "reads at odd offsets and sizes, and past the end, equal mapped_reads=off's" \
    $PY "$TESTS_TOP/tests/lib/same_reads.py" "$on/$rank" "$off/$rank" 5

  # A writer that only opens: it waits for the lease to be given back (milliseconds, not the
  # kernel's 45 s lease-break time), and the file stays readable, now through pread.
  start=$(date +%s%N)
  timeout 30 $PY -c 'import sys; open(sys.argv[1], "r+b").close()' "$src/$shard"
  rc=$?
  ms=$((($(date +%s%N) - start) / 1000000))
  [[ $rc -eq 0 && $ms -lt 5000 ]]
  ok $? "a writer opening a leased shard goes on at once (${ms} ms)"
  [[ $(leases_of "$pid_on") -eq 1 ]]
  ok $? "its lease was given back; the other shard's is kept ($(leases_of "$pid_on") held)"
  check "after the writer, every tp2pp1/ file is still the same, read through pread" \
    same_trees "$on" "$off" tp2pp1

  # Changed in place: EIO, as without mapped reads.
  $PY - "$src/$shard" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
os.pwrite(fd, b"\x00", os.path.getsize(sys.argv[1]) - 1)
os.close(fd)
PY
  ! cat "$on/$rank" > /dev/null 2>&1
  ok $? "a rank file of a shard changed in place gives an error"
fi

# The kernel gives a lease up after fs.lease-break-time: too short, and mapped reads are refused.
lbt=/proc/sys/fs/lease-break-time
if [[ -w $lbt ]]; then
  saved_lbt=$(cat "$lbt")
  trap 'echo "$saved_lbt" > "$lbt"; _cleanup' EXIT
  echo 1 > "$lbt"
  MOUNT_OPTS=layouts=tp2pp1 fg_mount "$CKPTFS" "$src" "$WORK/mnt-lbt" "$WORK/lbt.log"
  pid_lbt=$FG_PID
  cat "$WORK/mnt-lbt/hf/$shard" > /dev/null
  held=$(leases_of "$pid_lbt")
  echo "$saved_lbt" > "$lbt"
  FG_PID=$pid_lbt fg_unmount "$WORK/mnt-lbt"
  grep -q "fs.lease-break-time is 1 s.*mapped reads are off" "$WORK/lbt.log"
  ok $? "lease-break-time 1 s: the log says mapped reads are off ($(head -c 200 "$WORK/lbt.log"))"
  [[ $held -eq 0 ]]
  ok $? "and the daemon took no lease ($held)"
else
  skip "$lbt is not writable here"
  skip "$lbt is not writable here"
fi

out=$("$CKPTFS" mount -o mapped_reads=sometimes "$src" "$WORK/mnt-bad" 2>&1)
[[ $? -ne 0 && $out == *mapped_reads* ]]
ok $? "a bad mapped_reads value is refused: $out"

FG_PID=$pid_on fg_unmount "$on"
ok $? "the default mount unmounted"
FG_PID=$pid_off fg_unmount "$off"
ok $? "the mapped_reads=off mount unmounted"
done_testing
