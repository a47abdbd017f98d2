#!/usr/bin/env bash
# -o direct_io (on by default): the Megatron views' rank files and mcore/'s files are served
# without the mount's page cache, every read answered by the daemon straight into the reader's
# buffer; hf/ files stay cached (loaders map them shared). Checked through the daemon's own
# /proc/PID/io: what a second read of a file costs it, with the option on and off. Bytes equal
# between the two, at odd offsets and past the end too; torch 1.13 and torch 2.6 (mmap=True,
# weights_only) load rank files; a shared mapping fails cleanly or works as the build allows.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
models="$TESTS_TOP/tests/lib/models.py"
torch2_available && have2=1 || have2=0

src=$WORK/llama
$PY "$models" write llama "$src" --shards 2 > /dev/null
on=$WORK/mnt-on
off=$WORK/mnt-off
rank=tp2pp1/release/mp_rank_00/model_optim_rng.pt
# readahead=off: readahead=auto (the default) would read a lone reader through the page cache on
# a machine of 8 cores or more (readahead.t); this is about direct I/O itself.
MOUNT_OPTS=layouts=tp2pp1,readahead=off fg_mount "$CKPTFS" "$src" "$on" "$WORK/on.log"
ok $? "mount with the default direct_io=on"
pid_on=$FG_PID
mount_ckptfs "$src" "$off" -o layouts=tp2pp1,direct_io=off
ok $? "mount with direct_io=off"
distcp=$(cd "$on/mcore/release" && ls -- *.distcp | head -1)
shard=$(cd "$src" && ls -- *.safetensors | head -1)

# served_twice FILE: bytes the daemon wrote (its replies) while FILE was read twice, over
# FILE's size, as a percentage.
served_twice() {
  local f=$1 before after size
  size=$(stat -c %s "$f")
  before=$(daemon_io wchar "$pid_on")
  cat "$f" > /dev/null && cat "$f" > /dev/null
  after=$(daemon_io wchar "$pid_on")
  echo $(((after - before) * 100 / size))
}
for f in "$rank" "mcore/release/$distcp" "mcore/release/common.pt" "mcore/release/.metadata"; do
  pct=$(served_twice "$on/$f")
  [[ $pct -ge 200 ]]
  ok $? "$f read twice: the daemon served both reads ($pct% of its size; the page cache would serve the second)"
done
pct=$(served_twice "$on/hf/$shard")
[[ $pct -ge 100 && $pct -lt 150 ]]
ok $? "hf/$shard read twice: served once, the second read from the page cache ($pct%)"

# With the option off, the rank file is cached as before: one fresh mount in the foreground.
fusermount3 -u "$off"
MOUNT_OPTS=layouts=tp2pp1,direct_io=off fg_mount "$CKPTFS" "$src" "$off" "$WORK/off.log"
pid_off=$FG_PID
before=$(daemon_io wchar "$pid_off")
cat "$off/$rank" > /dev/null && cat "$off/$rank" > /dev/null
pct=$((($(daemon_io wchar "$pid_off") - before) * 100 / $(stat -c %s "$off/$rank")))
[[ $pct -ge 100 && $pct -lt 150 ]]
ok $? "direct_io=off: the rank file read twice is served once ($pct%)"

check "every file of tp2pp1/ and mcore/ is the same with direct_io on and off" \
  same_trees "$on" "$off" tp2pp1 mcore
check "reads at odd offsets and sizes, and past the end, equal the cached file's" \
  $PY "$TESTS_TOP/tests/lib/same_reads.py" "$on/$rank" "$off/$rank"

check "torch 1.13 loads the rank file (direct I/O) as the cached one" $PY - "$on/$rank" "$off/$rank" <<'PY'
import sys, torch
a, b = (torch.load(p, map_location="cpu")["model"] for p in sys.argv[1:3])
assert list(a) == list(b)
for k in a:
    if torch.is_tensor(a[k]):
        assert torch.equal(a[k], b[k]), k
PY
if ((have2)); then
  check "torch 2.6 loads it with mmap=True, weights_only=True (a private mapping)" \
    torch2_python "$WORK" - "$on/$rank" "$off/$rank" <<'PY'
import argparse, sys, torch
torch.serialization.add_safe_globals([argparse.Namespace])  # the args in rank files, as Megatron does
a = torch.load(sys.argv[1], map_location="cpu", mmap=True, weights_only=True)["model"]
b = torch.load(sys.argv[2], map_location="cpu", weights_only=True)["model"]
assert list(a) == list(b)
for k in a:
    if torch.is_tensor(a[k]):
        assert torch.equal(a[k], b[k]), k
PY
else
  skip "torch 2.6 mmap=True load: $TORCH2_WHY"
fi

# A private mapping (torch.load(mmap=True)) goes through the page cache; another open of the
# file must not drop those pages (the files never change under a mount).
check "a private mapping's pages survive another open of the file (the daemon serves them once)" \
  $PY - "$on/$rank" "$pid_on" <<'PY'
import mmap, os, sys
path, pid = sys.argv[1], sys.argv[2]
wchar = lambda: int(next(l.split()[1] for l in open(f"/proc/{pid}/io") if l.startswith("wchar:")))
f = open(path, "rb")
m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
first = bytes(m[::4096])
before = wchar()
os.close(os.open(path, os.O_RDONLY))
again = bytes(m[::4096])
grew = wchar() - before
assert first == again
assert grew < len(m) // 10, f"the daemon served {grew} bytes again for a {len(m)}-byte mapping"
print(f"served again: {grew} of {len(m)}")
PY

# A shared mapping: libfuse 3.17 builds ask the kernel to allow it (through the page cache);
# older ones get ENODEV from the kernel, a clean error, never wrong bytes.
libfuse=$("$CKPTFS" --version | sed -n 's/.*(libfuse \([0-9]*\.[0-9]*\)).*/\1/p')
IFS=. read -r fmaj fmin <<< "${libfuse:-0.0}"
if ((fmaj > 3 || (fmaj == 3 && fmin >= 17))); then want=mapped; else want=ENODEV; fi
check "a shared mapping of a direct-I/O rank file: $want with libfuse ${libfuse:-?}" \
  $PY - "$on/$rank" "$off/$rank" "$want" <<'PY'
import errno, mmap, sys
with open(sys.argv[1], "rb") as f:
    try:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        got = "mapped"
        assert m[:] == open(sys.argv[2], "rb").read()
    except OSError as e:
        assert e.errno == errno.ENODEV, e
        got = "ENODEV"
assert got == sys.argv[3], (got, sys.argv[3])
PY

out=$("$CKPTFS" mount -o direct_io=maybe "$src" "$WORK/mnt-bad" 2>&1)
[[ $? -ne 0 && $out == *"direct_io"*"off|on"* ]]
ok $? "direct_io=maybe is refused, naming the option and its values ($out)"
check "direct_io alone means on (as libfuse's own flag is written)" mount_ckptfs "$src" "$WORK/mnt-bare" -o direct_io
unmount_ckptfs "$WORK/mnt-bare"

fg_unmount "$off"
ok $? "the direct_io=off mount unmounted"
FG_PID=$pid_on fg_unmount "$on"
ok $? "the default mount unmounted"
done_testing
