#!/usr/bin/env bash
# -o passthrough (on by default where it can work; passthrough=off refuses it): hf/ files that are
# source files unchanged are read by the kernel itself (FUSE passthrough). ckptfs is built in the Debian 13 root against libfuse 3.17 and run on this
# machine's kernel. Checked: bytes, the daemon reading none of them (its /proc/PID/io), mmap,
# concurrent and repeated opens, synthesized files beside them (mapped shared too), re-sharded
# and packed sources (served by the daemon), a source replaced or rewritten under the mount, a
# daemon without CAP_SYS_ADMIN (refused, logged, served by the daemon), and a build without
# passthrough.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
models="$TESTS_TOP/tests/lib/models.py"
check_hf="$TESTS_TOP/tests/lib/check_hf.py"

skip_all() { echo "1..0 # skip $*"; exit 0; }
[[ $(id -u) -eq 0 ]] || skip_all "not root: FUSE passthrough needs a daemon with CAP_SYS_ADMIN"
if [[ -r /proc/config.gz ]]; then
  zgrep -q '^CONFIG_FUSE_PASSTHROUGH=y' /proc/config.gz ||
    skip_all "kernel $(uname -r) is built without CONFIG_FUSE_PASSTHROUGH"
else
  IFS=. read -r kmaj kmin _ <<< "$(uname -r)"
  ((kmaj > 6 || (kmaj == 6 && ${kmin%%[!0-9]*} >= 9))) || skip_all "kernel $(uname -r) < 6.9: no FUSE passthrough"
fi
trixie_build_deps_ensure || skip_all "$TRIXIE_WHY"

# The same build type as the binary under test (the ASan run builds with sanitizers there too).
build_args=()
grep -q '^CKPTFS_SANITIZE:BOOL=ON' "$(dirname "$CKPTFS")/CMakeCache.txt" 2>/dev/null &&
  build_args=(-DCMAKE_BUILD_TYPE=Debug -DCKPTFS_SANITIZE=ON)
trixie_ckptfs "$WORK/trixie" "${build_args[@]}"
built=$?
PT=$WORK/trixie/bin/ckptfs

src=$WORK/llama
$PY "$models" write llama "$src" --shards 3 --tokenizer > /dev/null
mapfile -t names < <(cd "$src" && ls)
hf_bytes=$(cd "$src" && cat -- "${names[@]}" | wc -c)

# What the daemon served (its replies to /dev/fuse): with passthrough the kernel reads the source
# itself and the daemon writes nothing; rchar would miss replies written from mapped source files.
served() { daemon_io wchar "$1"; }
# read_all MNT/VIEW: every file of the view, through one cat (nothing cached before: fresh mount)
read_all() { (cd "$1" && cat -- * > /dev/null); }
same_as_source() {
  local n bad=0
  for n in "${names[@]}"; do cmp -s "$src/$n" "$1/$n" || { echo "differs: $n"; bad=1; }; done
  return $bad
}

# A kernel that does not offer passthrough (6.9+ without CONFIG_FUSE_PASSTHROUGH, where no
# /proc/config.gz tells): the daemon says so at INIT.
if [[ $built -eq 0 ]] && MOUNT_OPTS=passthrough fg_mount "$PT" "$src" "$WORK/mnt-probe" "$WORK/probe.log"; then
  cat "$WORK/mnt-probe/hf/config.json" > /dev/null
  fg_unmount "$WORK/mnt-probe"
  grep -q "does not offer FUSE passthrough" "$WORK/probe.log" && skip_all "$(uname -r): $(cat "$WORK/probe.log")"
fi
ok $built "ckptfs builds against the Debian 13 root's libfuse 3.17 ${build_args[*]} ${TRIXIE_WHY:+($TRIXIE_WHY)}"
[[ -x $PT ]] || { done_testing; exit; }
check "that build runs here, on the host's kernel" "$PT" --version
# Self-contained: its loader is the bundle's, and that loader finds every library in lib/.
interp=$(readelf -l "$PT" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
[[ $interp == "$WORK/trixie/lib/ld-linux-x86-64.so.2" ]]
ok $? "its loader is the bundle's own ($interp)"
"$WORK/trixie/lib/ld-linux-x86-64.so.2" --list "$PT" > "$WORK/libs.out" 2>&1
outside=$(grep -v -e "=> $WORK/trixie/lib/" -e "linux-vdso" -e "^[[:space:]]*$WORK/trixie/lib/ld-linux" "$WORK/libs.out")
[[ -z $outside && $(grep -c "=> $WORK/trixie/lib/" "$WORK/libs.out") -ge 10 ]]
ok $? "every library comes from its lib/ ($(grep -c . "$WORK/libs.out") lines${outside:+; outside: $outside})"


# --- passthrough on a plain Hugging Face source
mnt=$WORK/mnt-pt
MOUNT_OPTS=passthrough fg_mount "$PT" "$src" "$mnt" "$WORK/pt.log"
ok $? "-o passthrough: mounts"
pid=$FG_PID
before=$(served "$pid")
check "every hf/ file is byte-identical to the source" same_as_source "$mnt/hf"
grew=$(($(served "$pid") - before))
diag "daemon's wchar grew by $grew bytes while $hf_bytes bytes of hf/ were read"
[[ $grew -lt 65536 ]]
ok $? "the kernel read the hf/ files itself: the daemon served $grew bytes (< 64 KiB) of their $hf_bytes"
check "tensors read back equal (independent safetensors reader)" $PY "$check_hf" compare "$src" "$mnt/hf"
shard=model-00002-of-00003.safetensors
check "mmap of a passthrough file equals the source file" $PY -c '
import mmap, sys
with open(sys.argv[1], "rb") as a, open(sys.argv[2], "rb") as b:
    m = mmap.mmap(a.fileno(), 0, prot=mmap.PROT_READ)
    assert m[:] == b.read(), "mmap bytes differ"' "$mnt/hf/$shard" "$src/$shard"
before=$(served "$pid")
check "two opens of one file at once, then a fresh open after both closed: same bytes" $PY -c '
import sys
view, source = sys.argv[1], open(sys.argv[2], "rb").read()
a, b = open(view, "rb"), open(view, "rb")
assert a.read(1000) == source[:1000] and b.read() == source and a.read() == source[1000:]
a.close(); b.close()
assert open(view, "rb").read() == source' "$mnt/hf/$shard" "$src/$shard"
grew=$(($(served "$pid") - before))
[[ $grew -lt 65536 ]]
ok $? "those opens were passthrough too (the daemon served $grew bytes)"

# Synthesized files are still the daemon's: the counter sees them (so the checks above can fail).
ref=$WORK/mnt-ref
check "a mount by the build under test, for reference" mount_ckptfs "$src" "$ref"
before=$(served "$pid")
check "tp2pp1 rank files on the passthrough mount equal the reference's" \
  diff -r "$ref/tp2pp1" "$mnt/tp2pp1"
grew=$(($(served "$pid") - before))
[[ $grew -gt $((hf_bytes / 2)) ]]
ok $? "the daemon served the rank files itself ($grew bytes)"
check "a rank file (direct I/O) beside passthrough files maps shared and equals the reference" \
  $PY - "$mnt/tp2pp1/release/mp_rank_00/model_optim_rng.pt" "$ref/tp2pp1/release/mp_rank_00/model_optim_rng.pt" <<'PY'
import mmap, sys
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    assert m[:] == open(sys.argv[2], "rb").read()
PY
grep -qi "passthrough" "$WORK/pt.log"
ok $((1 - $?)) "nothing about passthrough in the log ($(head -c 300 "$WORK/pt.log" | tr '\n' ' '))"
fg_unmount "$mnt"
ok $? "unmounts"

# --- without the option: passthrough by default (auto), quietly
mnt=$WORK/mnt-default
fg_mount "$PT" "$src" "$mnt" "$WORK/default.log"
ok $? "without the option: mounts"
before=$(served "$FG_PID")
check "hf/ byte-identical" same_as_source "$mnt/hf"
grew=$(($(served "$FG_PID") - before))
[[ $grew -lt 65536 ]]
ok $? "passthrough by default: the daemon served $grew bytes (< 64 KiB) of $hf_bytes"
fg_unmount "$mnt"
! grep -qi "passthrough" "$WORK/default.log"
ok $? "nothing about passthrough in the log"

# --- passthrough=off: the same build serves hf/ through the daemon
mnt=$WORK/mnt-nopt
MOUNT_OPTS=passthrough=off fg_mount "$PT" "$src" "$mnt" "$WORK/nopt.log"
ok $? "-o passthrough=off: mounts"
before=$(served "$FG_PID")
check "hf/ byte-identical" same_as_source "$mnt/hf"
grew=$(($(served "$FG_PID") - before))
[[ $grew -ge $hf_bytes ]]
ok $? "the daemon served every byte itself ($grew of $hf_bytes)"
# Rank files are read with direct I/O (direct_io.t); a libfuse 3.17 build also lets them be
# mapped shared (FUSE_CAP_DIRECT_IO_ALLOW_MMAP), where a 3.14 build gets ENODEV.
check "a shared mapping of a direct-I/O rank file works with this build and equals the file" \
  $PY - "$mnt/tp2pp1/release/mp_rank_01/model_optim_rng.pt" <<'PY'
import mmap, sys
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    assert m[:] == open(sys.argv[1], "rb").read()
PY
fg_unmount "$mnt"

# --- files that are not a source file whole: served by the daemon, correct
mnt=$WORK/mnt-shard
MOUNT_OPTS=passthrough,hf_shard_size=64K fg_mount "$PT" "$src" "$mnt" "$WORK/shard.log"
ok $? "-o passthrough,hf_shard_size=64K: mounts"
check "re-sharded hf/ follows the rules" $PY "$check_hf" compare "$src" "$mnt/hf" --shard-size 65536
check "config.json and tokenizer.json (source files whole) are identical" \
  cmp "$src/config.json" "$mnt/hf/config.json"
fg_unmount "$mnt"

packed=$WORK/llama-packed
if "$PT" pack "$src" "$packed" > /dev/null 2>&1; then
  mnt=$WORK/mnt-packed
  MOUNT_OPTS=passthrough fg_mount "$PT" "$packed" "$mnt" "$WORK/packed.log"
  ok $? "-o passthrough over a packed source: mounts"
  before=$(served "$FG_PID")
  check "hf/ of the packed source is byte-identical to the original" same_as_source "$mnt/hf"
  grew=$(($(served "$FG_PID") - before))
  [[ $grew -gt $((hf_bytes / 3)) ]]
  ok $? "packed files are decoded by the daemon, not passed through ($grew bytes served)"
  fg_unmount "$mnt"
else
  ok 1 "pack of the test model"
fi

# --- an inode open in cached mode stays so until its last open is released: a source file the
# daemon could not open for passthrough (descriptors run out) is served through the daemon, and
# an open of the same file meanwhile must not ask for passthrough (the kernel would refuse it: EIO)
mnt=$WORK/mnt-mix
MOUNT_OPTS=passthrough fg_mount "$PT" "$src" "$mnt" "$WORK/mix.log"
ok $? "-o passthrough: mounts (mixed modes)"
before=$(served "$FG_PID")
$PY - "$mnt/hf/$shard" "$src/$shard" "$FG_PID" > "$WORK/mix.out" 2>&1 <<'PY'
import os, resource, subprocess, sys
view, source, pid = sys.argv[1], open(sys.argv[2], "rb").read(), int(sys.argv[3])
os.stat(view)  # looked up while the daemon may still open files
soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
used = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
lowest_free = min(set(range(len(used) + 1)) - used)  # what the daemon's next open(2) would get
resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest_free, hard))
try:
    a = open(view, "rb")
finally:
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
print("first open, no descriptors left:", "right bytes" if a.read() == source else "WRONG BYTES")
try:
    with open(view, "rb") as b:
        print("second open while the first is held:", "right bytes" if b.read() == source else "WRONG BYTES")
except OSError as e:
    print("second open while the first is held:", e.strerror)
a.close()
PY
sed 's/^/# /' "$WORK/mix.out"
grep -q "first open, no descriptors left: right bytes" "$WORK/mix.out"
ok $? "a file the daemon could not open for passthrough is served through it"
grep -q "second open while the first is held: right bytes" "$WORK/mix.out"
ok $? "a second open of it meanwhile is served the same way (not refused by the kernel)"
grew=$(($(served "$FG_PID") - before))
[[ $grew -ge $(stat -c %s "$src/$shard") ]]
ok $? "both through the daemon ($grew bytes served)"
grep -q "passthrough: .*Too many open files.*read through the daemon while it is open" "$WORK/mix.log"
ok $? "the log says why ($(grep -m1 'passthrough' "$WORK/mix.log"))"
sleep 0.2 # the releases reach the daemon after close returns
before=$(served "$FG_PID")
check "once both are closed, a fresh open reads the right bytes" cmp "$src/$shard" "$mnt/hf/$shard"
grew=$(($(served "$FG_PID") - before))
[[ $grew -lt 65536 ]]
ok $? "and is passthrough again ($grew bytes served by the daemon)"
# Many threads opening, reading and closing the same files at once.
check "8 threads x 300 opens of the shards at random offsets: right bytes, no errors" $PY - "$mnt/hf" "$src" <<'PY'
import os, random, sys, threading
view, source = sys.argv[1], sys.argv[2]
names = sorted(n for n in os.listdir(source) if n.endswith(".safetensors"))
data = {n: open(os.path.join(source, n), "rb").read() for n in names}
errors = []
def worker(seed):
    rng = random.Random(seed)
    for _ in range(300):
        n = rng.choice(names)
        off = rng.randrange(len(data[n]))
        try:
            with open(os.path.join(view, n), "rb") as f:
                f.seek(off)
                if f.read(4096) != data[n][off:off + 4096]:
                    errors.append(f"{n} at {off}: wrong bytes")
        except OSError as e:
            errors.append(f"{n}: {e}")
threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print("\n".join(errors[:5]))
sys.exit(1 if errors else 0)
PY
fg_unmount "$mnt"

# --- the source changing under a passthrough mount
live=$WORK/live
cp -r "$src" "$live"
mnt=$WORK/mnt-live
MOUNT_OPTS=passthrough fg_mount "$PT" "$live" "$mnt" "$WORK/live.log"
ok $? "-o passthrough on a copy that will change: mounts"
before=$(served "$FG_PID")
$PY - "$mnt/hf" "$live" "$shard" model-00003-of-00003.safetensors > "$WORK/live.out" 2>&1 <<'PY'
import os, sys
view, source, replaced, rewritten = sys.argv[1:]
old = open(os.path.join(source, replaced), "rb").read()
held = open(os.path.join(view, replaced), "rb")
held.read(100)
# Replaced by rename: a descriptor opened before keeps the file it opened.
tmp = os.path.join(source, "new.tmp")
with open(tmp, "wb") as f:
    f.write(bytes(b ^ 0xFF for b in old))
os.rename(tmp, os.path.join(source, replaced))
print("held descriptor after rename:", "old bytes" if old[100:] == held.read() else "OTHER BYTES")
try:
    open(os.path.join(view, replaced), "rb").read()
    print("fresh open after rename: read")
except OSError as e:
    print("fresh open after rename:", e.strerror)
# Rewritten in place, mtime put back: caught at the next open (ctime).
path = os.path.join(source, rewritten)
st = os.stat(path)
with open(path, "r+b") as f:
    f.seek(st.st_size // 2)
    f.write(b"\xff" * 64)
os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
try:
    open(os.path.join(view, rewritten), "rb").read()
    print("fresh open after in-place rewrite: read")
except OSError as e:
    print("fresh open after in-place rewrite:", e.strerror)
PY
sed 's/^/# /' "$WORK/live.out"
grew=$(($(served "$FG_PID") - before))
[[ $grew -lt 65536 ]]
ok $? "the held file was read by the kernel, not the daemon ($grew bytes)"
grep -q "held descriptor after rename: old bytes" "$WORK/live.out"
ok $? "a file open before its source is replaced keeps reading the bytes it opened"
grep -q "fresh open after rename: Input/output error" "$WORK/live.out"
ok $? "a fresh open of a replaced source file fails with EIO"
grep -q "fresh open after in-place rewrite: Input/output error" "$WORK/live.out"
ok $? "a fresh open of a source file rewritten in place (mtime restored) fails with EIO"
grep -q "source file changed after the mount" "$WORK/live.log"
ok $? "the log names the change"
fg_unmount "$mnt"

# --- a daemon without CAP_SYS_ADMIN (root of a user namespace of its own, where FUSE mounts are
# allowed): the kernel refuses the backing files; ckptfs says so once and serves the files itself
if unshare --user --map-root-user true 2> /dev/null; then
  mnt=$WORK/mnt-nocap
  mkdir -p "$mnt"
  unshare --user --map-root-user --mount --propagation private bash -c '
    pt=$1 from=$2 mnt=$3 log=$4
    "$pt" mount -f -o passthrough "$from" "$mnt" 2> "$log" &
    pid=$!
    for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
    mountpoint -q "$mnt" || { echo "mount failed"; exit 1; }
    before=$(awk "/^wchar:/ {print \$2}" /proc/$pid/io)
    differs=0
    for f in "$from"/*; do cmp -s "$f" "$mnt/hf/${f##*/}" || differs=$((differs + 1)); done
    echo "differs=$differs served=$(($(awk "/^wchar:/ {print \$2}" /proc/$pid/io) - before))"
    umount "$mnt"
    wait $pid' _ "$PT" "$src" "$mnt" "$WORK/nocap.log" > "$WORK/nocap.out" 2>&1
  diag "$(cat "$WORK/nocap.out")"
  grep -q "^differs=0 " "$WORK/nocap.out"
  ok $? "in a user namespace: mounts, and every hf/ file is byte-identical"
  served_bytes=$(sed -n 's/.* served=\([0-9]*\)$/\1/p' "$WORK/nocap.out")
  [[ ${served_bytes:-0} -ge $hf_bytes ]]
  ok $? "served by the daemon (${served_bytes:-?} bytes)"
  grep -q "passthrough refused by the kernel (Operation not permitted: the daemon needs CAP_SYS_ADMIN)" "$WORK/nocap.log"
  ok $? "the log says why ($(grep -m1 'passthrough refused' "$WORK/nocap.log" || head -3 "$WORK/nocap.log"))"
  [[ $(grep -c "passthrough refused" "$WORK/nocap.log") -eq 1 ]]
  ok $? "one refusal line for ${#names[@]} files"
else
  skip "no user namespaces here: no check without CAP_SYS_ADMIN"
fi

# --- a build without passthrough (libfuse older than 3.17): a warning, and files served as always
if pkg-config --exists 'fuse3 < 3.17' 2> /dev/null; then
  mnt=$WORK/mnt-old
  mount_ckptfs "$src" "$mnt" -o passthrough 2> "$WORK/old.err"
  ok $? "libfuse $(pkg-config --modversion fuse3) build: -o passthrough mounts"
  grep -q "warning: passthrough: this ckptfs was built with libfuse 3.1[0-6] (3.17 or later needed)" "$WORK/old.err"
  ok $? "with a warning ($(cat "$WORK/old.err"))"
  check "and serves hf/ byte-identical" same_as_source "$mnt/hf"
  unmount_ckptfs "$mnt"
else
  skip "the build under test has libfuse $(pkg-config --modversion fuse3 2> /dev/null || echo '?'): no build without passthrough here"
fi

done_testing
