#!/usr/bin/env bash
# -o readahead=SIZE: the chunks ahead of a sequential reader of a file read through the mount's page
# cache (here rank files and .distcp files with direct_io=off) are built on worker threads and
# stored in that cache. Sequential reads, seeks and odd reads give the bytes `ckptfs cat` gives;
# the daemon's log says chunks were pushed and never more than SIZE ahead of its readers, with four
# readers at once; a source changed under a reader gives errors, never other bytes (source_change.t
# races it too); unmounting or aborting the connection while chunks are being built ends the daemon
# cleanly (the ASan build reports nothing). readahead=auto (the default; on from 8 cores, here
# forced with readahead_cores=16): a lone reader of a rank file, cp -r and torch.load are pushed,
# two readers at once are not (the second with direct I/O), readahead=off pushes nothing.
source "$(dirname "$0")/../lib/common.sh"
require_fuse

src=$WORK/llama
check "a 4-layer model with 1024-wide rows written" $PY "$TESTS_TOP/tests/lib/models.py" write llama "$src" --layers 4 \
  --shards 2 --set hidden_size=1024 --set intermediate_size=2048 --set vocab_size=8192
cat "$src"/*.safetensors > /dev/null
rank0=tp2pp1/release/mp_rank_00/model_optim_rng.pt
rank1=tp2pp1/release/mp_rank_01/model_optim_rng.pt
files=("$rank0" "$rank1" mcore/release/__0_0.distcp)
mkdir -p "$WORK/ref"
for f in "${files[@]}"; do
  "$CKPTFS" cat -o layouts=tp2pp1 "$src" "$f" > "$WORK/ref/${f//\//_}" || ok 1 "ckptfs cat $f"
done
size0=$(stat -c %s "$WORK/ref/${rank0//\//_}")
[[ $size0 -gt $((24 << 20)) ]]
ok $? "a rank file of $size0 bytes: a dozen chunks or more"

cap=$((4 << 20))
mnt=$WORK/mnt log=$WORK/mnt.log
MOUNT_OPTS=layouts=tp2pp1,direct_io=off,readahead=4M fg_mount "$CKPTFS" "$src" "$mnt" "$log"
ok $? "mounted with direct_io=off,readahead=4M"
pid=$FG_PID

# A sequential reader in 1 MiB reads, and the daemon's writes to /dev/fuse: the chunks it stored
# are written once more than the reader asked for, and most of the file comes that way.
before=$(daemon_io wchar "$pid")
dd if="$mnt/$rank0" of="$WORK/seq" bs=1M status=none
served=$(($(daemon_io wchar "$pid") - before))
cmp -s "$WORK/seq" "$WORK/ref/${rank0//\//_}"
ok $? "a sequential read of the rank file equals ckptfs cat's"
[[ $served -ge $size0 && $served -lt $((size0 * 3 / 2)) ]]
ok $? "the daemon wrote the file about once, stores and replies together ($served bytes for $size0)"

check "reads at odd offsets and sizes, and past the end, equal ckptfs cat's (the other rank file)" \
  $PY "$TESTS_TOP/tests/lib/same_reads.py" "$mnt/$rank1" "$WORK/ref/${rank1//\//_}"
# A reader that streams, seeks back and forth, stops and goes on: every byte as ckptfs cat's.
check "a reader that streams, seeks and streams again gets ckptfs cat's bytes" $PY - "$mnt/${files[2]}" "$WORK/ref/${files[2]//\//_}" <<'PY'
import os, sys
a, b = (os.open(p, os.O_RDONLY) for p in sys.argv[1:3])
size = os.fstat(b).st_size
M = 1 << 20
plan = [(0, 9), (size // 2, 5), (3 * M, 4), (size - 3 * M, 4), (M + 17, 6), (size // 3 + 4095, 7)]
for start, n in plan:
    off = start
    for _ in range(n):
        x, y = os.pread(a, M, off), os.pread(b, M, off)
        assert x == y, f"differ at {off}"
        off += len(y)
print(f"{len(plan)} runs equal")
PY

# Four readers at once, two of them of the same file: the cap is shared, and every file is right.
pids=()
for i in 0 1 2 3; do
  f=${files[i % 3]}
  cat "$mnt/$f" > "$WORK/par$i" &
  pids+=($!)
done
bad=0
for p in "${pids[@]}"; do wait "$p" || bad=1; done
for i in 0 1 2 3; do f=${files[i % 3]}; cmp -s "$WORK/par$i" "$WORK/ref/${f//\//_}" || bad=1; done
ok $bad "four readers at once read three files as ckptfs cat gives them"

fg_unmount "$mnt"
ok $? "unmounted"
line=$(grep -m1 "readahead:" "$log")
pushed=$(sed -n 's/.*readahead: \([0-9]*\) chunks pushed.*/\1/p' <<< "$line")
ahead=$(sed -n 's/.* at most \([0-9]*\) bytes ahead.*/\1/p' <<< "$line")
[[ ${pushed:-0} -gt 0 ]]
ok $? "the log counts the chunks pushed ($line)"
[[ -n $ahead && $ahead -le $cap && $ahead -gt 0 ]]
ok $? "never more than the cap ahead of the readers (${ahead:-?} of $cap bytes)"
! grep -q "Sanitizer" "$log"
ok $? "the daemon's log has no sanitizer report"

# -o readahead=auto, the default: on from 8 cores, as counted by the machine or readahead_cores.
# A lone reader of a rank file goes through the page cache with chunks pushed; two readers at once
# are not pushed, the second with direct I/O; cp -r reads one file at a time, each pushed. Bytes
# always those of ckptfs cat. The policy's line comes first in the log, its counts at unmount.
auto_line() { sed -n 's/.*readahead: \([0-9]*\) chunks pushed.*auto: \([0-9]*\) opens pushed, \([0-9]*\) opens among others not, \([0-9]*\) reads.*/\1 \2 \3 \4/p' "$1"; }
# served FILE: what the daemon wrote (its replies and stores) while FILE was read, in % of its
# size: 100 or more where nothing of it was cached, little where the page cache held it.
served() {
  local before
  before=$(daemon_io wchar "$FG_PID")
  cat "$1" > /dev/null
  echo $((($(daemon_io wchar "$FG_PID") - before) * 100 / $(stat -c %s "$1")))
}
cores=$(nproc)
mnt=$WORK/mnt-default log=$WORK/default.log
MOUNT_OPTS=layouts=tp2pp1 fg_mount "$CKPTFS" "$src" "$mnt" "$log"
ok $? "mounted with the defaults"
cat "$mnt/$rank0" > "$WORK/default0"
cmp -s "$WORK/default0" "$WORK/ref/${rank0//\//_}"
ok $? "a lone reader of the default mount reads ckptfs cat's bytes"
again=$(served "$mnt/$rank0")
fg_unmount "$mnt"
if ((cores >= 8)); then
  grep -q "readahead=auto: on: $cores cores, 8 needed" "$log" && [[ $again -lt 50 ]]
  ok $? "on $cores cores the default reads a lone reader through the page cache (read again: $again% served)"
else
  grep -q "readahead=auto: off: $cores cores, 8 needed" "$log" && [[ $again -ge 100 ]] && ! grep -q "chunks pushed" "$log"
  ok $? "on $cores cores the default is off, the rank file read with direct I/O (read again: $again% served; $(head -c 100 "$log"))"
fi
"$CKPTFS" inspect "$src" | grep -q "^read-ahead: *auto: o[nf]*: $cores cores"
ok $? "inspect says what auto does on $cores cores"

forced=layouts=tp2pp1,readahead_cores=16
mnt=$WORK/mnt-lone log=$WORK/lone.log
MOUNT_OPTS=$forced fg_mount "$CKPTFS" "$src" "$mnt" "$log"
ok $? "mounted with readahead_cores=16 (auto on here)"
grep -q "readahead=auto: on: 16 cores (-o readahead_cores), 8 needed; .* at most 1 such" "$log"
ok $? "the log says auto is on for 16 cores counted, one file at a time ($(head -c 90 "$log"))"
dd if="$mnt/$rank0" of="$WORK/lone0" bs=1M status=none
cmp -s "$WORK/lone0" "$WORK/ref/${rank0//\//_}"
ok $? "a lone reader reads ckptfs cat's bytes"
fg_unmount "$mnt"
read -r pushed opened among crowded <<< "$(auto_line "$log")"
[[ ${pushed:-0} -ge $((size0 / (2 << 20) - 2)) && $opened == 1 && $among == 0 ]]
ok $? "the lone reader was pushed: ${pushed:-?} chunks of its $((size0 >> 20)) MiB, ${opened:-?} open pushed"

mnt=$WORK/mnt-two log=$WORK/two.log
MOUNT_OPTS=$forced fg_mount "$CKPTFS" "$src" "$mnt" "$log"
# Then, both still open, each read again: what the daemon serves for it (in % of its size) says
# whether the first read left it in the page cache.
out=$($PY - "$mnt/$rank0" "$mnt/$rank1" "$WORK/ref/${rank0//\//_}" "$WORK/ref/${rank1//\//_}" "$FG_PID" <<'PY'
import os, sys
fds = [os.open(p, os.O_RDONLY) for p in sys.argv[1:3]]
refs = [open(p, "rb").read() for p in sys.argv[3:5]]
off = [0, 0]
while any(off[i] < len(refs[i]) for i in range(2)):
    for i in range(2):
        got = os.pread(fds[i], 1 << 20, off[i])
        assert got == refs[i][off[i]:off[i] + len(got)], f"file {i} differs at {off[i]}"
        off[i] += len(got)
def wchar():
    return int(next(l for l in open(f"/proc/{sys.argv[5]}/io") if l.startswith("wchar:")).split()[1])
again = []
for i in range(2):
    before, off = wchar(), 0
    while off < len(refs[i]):
        off += len(os.pread(fds[i], 1 << 20, off))
    again.append((wchar() - before) * 100 // len(refs[i]))
print(*again)
PY
)
ok $? "two readers at once, reading in turns, read ckptfs cat's bytes"
read -r again0 again1 <<< "$out"
fg_unmount "$mnt"
read -r pushed opened among crowded <<< "$(auto_line "$log")"
[[ $pushed == 0 && $opened -ge 1 && $among == 1 && $crowded -gt 0 ]]
ok $? "two readers at once: none pushed (${pushed:-?} chunks; ${opened:-?} opened alone, ${among:-?} among others, ${crowded:-?} reads paused)"
[[ $again0 -lt 50 && $again1 -ge 100 ]]
ok $? "the first went through the page cache, the second, opened beside it, with direct I/O (read again: $again0% and $again1% served)"

mnt=$WORK/mnt-cp log=$WORK/cp.log
MOUNT_OPTS=$forced fg_mount "$CKPTFS" "$src" "$mnt" "$log"
mkdir -p "$WORK/copy" "$WORK/export"
cp -r "$mnt/tp2pp1" "$mnt/mcore" "$WORK/copy"
fg_unmount "$mnt"
"$CKPTFS" export -o layouts=tp2pp1 "$src" tp2pp1 "$WORK/export/tp2pp1" &&
  "$CKPTFS" export -o layouts=tp2pp1 "$src" mcore "$WORK/export/mcore" && diff -r "$WORK/export" "$WORK/copy"
ok $? "cp -r of tp2pp1/ and mcore/ equals ckptfs export's"
files_copied=$(find "$WORK/copy" -type f ! -name '*.txt' ! -name '*.json' | wc -l) # the streamed ones
read -r pushed opened among crowded <<< "$(auto_line "$log")"
[[ $opened == "$files_copied" && $among == 0 && $pushed -gt 0 ]]
ok $? "cp -r: each of its $files_copied files read alone and pushed (${opened:-?} opens pushed, ${among:-?} not; ${pushed:-?} chunks)"

mnt=$WORK/mnt-torch log=$WORK/torch.log
MOUNT_OPTS=$forced fg_mount "$CKPTFS" "$src" "$mnt" "$log"
check "torch 1.13 loads the rank file, read alone with pushes, as ckptfs cat's copy" \
  $PY - "$mnt/$rank1" "$WORK/ref/${rank1//\//_}" <<'PY'
import sys, torch
a, b = (torch.load(p, map_location="cpu")["model"] for p in sys.argv[1:3])
assert list(a) == list(b)
for k in a:
    if torch.is_tensor(a[k]):
        assert torch.equal(a[k], b[k]), k
print(len(a), "entries equal")
PY
fg_unmount "$mnt"
read -r pushed opened among crowded <<< "$(auto_line "$log")"
[[ ${pushed:-0} -gt 0 ]]
ok $? "torch.load (the zip's end first, then its records in order) was pushed (${pushed:-?} chunks)"

mnt=$WORK/mnt-off log=$WORK/off.log
MOUNT_OPTS=$forced,readahead=off fg_mount "$CKPTFS" "$src" "$mnt" "$log"
cat "$mnt/$rank0" > /dev/null
again=$(served "$mnt/$rank0")
fg_unmount "$mnt"
grep -q "^ckptfs: readahead=off$" "$log" && ! grep -q "chunks pushed" "$log" && [[ $again -ge 100 ]]
ok $? "readahead=off: nothing pushed, the rank file read with direct I/O whatever the cores counted (read again: $again% served)"
! grep -l "Sanitizer" "$WORK"/{default,lone,two,cp,torch,off}.log
ok $? "the readahead=auto mounts' logs have no sanitizer report"

# A source changed under a reader: what it reads after is an error, never the new bytes.
# On a fresh mount, so that the file's pages are not all cached already.
shard=$(cd "$src" && ls -- *.safetensors | head -1)
mnt=$WORK/mnt-change
MOUNT_OPTS=layouts=tp2pp1,direct_io=off,readahead=4M fg_mount "$CKPTFS" "$src" "$mnt" "$WORK/change.log"
pid=$FG_PID
check "a reader mid-file when the shard is rewritten gets the old bytes or an error, and then errors" \
  $PY - "$mnt/$rank0" "$WORK/ref/${rank0//\//_}" "$src/$shard" <<'PY'
import os, sys
path, ref_path, shard = sys.argv[1:4]
ref = open(ref_path, "rb").read()
fd = os.open(path, os.O_RDONLY)
M = 1 << 20
off = 0
for _ in range(6):
    got = os.pread(fd, M, off)
    assert got == ref[off:off + M], f"differ at {off} before the change"
    off += M
with open(shard, "r+b") as w:  # every byte after the header flipped, in place
    w.seek(4096)
    data = w.read()
    w.seek(4096)
    w.write(bytes(255 - c for c in data))
errors = 0
while off < len(ref):
    try:
        got = os.pread(fd, M, off)
    except OSError:
        errors += 1
        off += M
        continue
    assert got == ref[off:off + len(got)], f"new bytes at {off} after the change"
    off += M
assert errors > 0, "no read failed after the change"
print(f"{errors} reads failed after the change, none gave other bytes")
PY
fg_unmount "$mnt"
ok $? "unmounted after the change"

restore_src() { $PY "$TESTS_TOP/tests/lib/models.py" write llama "$src" --layers 4 --shards 2 \
  --set hidden_size=1024 --set intermediate_size=2048 --set vocab_size=8192 > /dev/null; }
restore_src
# Unmounting while chunks are being built: a lazy unmount under a reader, and the connection
# aborted under another; the daemon ends either way, at once.
for how in lazy abort; do
  mnt=$WORK/mnt-$how log=$WORK/$how.log
  MOUNT_OPTS=layouts=tp2pp1,direct_io=off,readahead=64M fg_mount "$CKPTFS" "$src" "$mnt" "$log"
  pid=$FG_PID
  dev=$(stat -c %d "$mnt")
  $PY -c '
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
off = 0
try:
    while True:
        b = os.pread(fd, 1 << 20, off)
        if not b:
            off = 0
        off += len(b)
        time.sleep(0.002)
except OSError:
    pass
' "$mnt/$rank0" &
  reader=$!
  sleep 1
  if [[ $how == lazy ]]; then
    fusermount3 -uz "$mnt"
    sleep 0.3
    kill "$reader" 2> /dev/null
  else
    # The connection's abort file, from fusectl mounted in a mount namespace of its own.
    unshare -m sh -c "mount -t fusectl none /sys/fs/fuse/connections 2> /dev/null; echo 1 > /sys/fs/fuse/connections/$dev/abort" ||
      fail_diag "no fusectl abort file for device $dev"
    sleep 0.3
    kill "$reader" 2> /dev/null
    fusermount3 -uz "$mnt" 2> /dev/null
  fi
  wait "$reader" 2> /dev/null
  for _ in $(seq 100); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
  ! kill -0 "$pid" 2> /dev/null
  ok $? "$how: the daemon ended within 10 s of the unmount, chunks being built"
  if kill -0 "$pid" 2> /dev/null; then kill "$pid"; fi
  wait "$pid" 2> /dev/null
  ! grep -q "Sanitizer" "$log"
  ok $? "$how: no sanitizer report ($(grep -m1 'readahead:' "$log" | head -c 120))"
  grep -A12 "Sanitizer" "$log" | head -30 | sed 's/^/# /' >&2
done
done_testing
