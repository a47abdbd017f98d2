#!/usr/bin/env bash
# -o io_uring=auto|on|off: FUSE over io_uring with a ckptfs built against libfuse 3.18
# (scripts/libfuse318.sh; tests/run-all.sh builds build-fuse318/, else this test builds one).
# /sys/module/fuse/parameters/enable_uring is set for the checks and put back after. Checked:
# on refused cleanly while the kernel has it off, auto falling back with one line, off; with it
# on: rank files (mapped reads on and off), mcore/ and hf/ equal a /dev/fuse mount's, replies
# through the ring (not written to /dev/fuse); and FUSE passthrough on by default for hf/ files,
# passthrough=off refusing it.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
models="$TESTS_TOP/tests/lib/models.py"
knob=/sys/module/fuse/parameters/enable_uring

skip_all() { echo "1..0 # skip $*"; exit 0; }
[[ $(id -u) -eq 0 ]] || skip_all "not root: FUSE over io_uring is switched on by root"
[[ -w $knob ]] || skip_all "kernel $(uname -r) has no FUSE over io_uring ($knob missing: Linux 6.14+ with CONFIG_FUSE_IO_URING)"

# The binary: the one under test where it has io_uring, else build-fuse318/ beside it (same build
# type), else one built here.
U=""
if "$CKPTFS" --version | grep -q "io_uring: yes"; then
  U=$CKPTFS
elif grep -q '^CKPTFS_SANITIZE:BOOL=ON' "$(dirname "$CKPTFS")/CMakeCache.txt" 2> /dev/null; then
  out=$("$TESTS_TOP/scripts/libfuse318.sh" --ckptfs "$WORK/fuse318" -DCMAKE_BUILD_TYPE=Debug -DCKPTFS_SANITIZE=ON 2>&1) &&
    U=$WORK/fuse318/ckptfs
elif [[ -x $TESTS_TOP/build-fuse318/ckptfs ]]; then
  U=$TESTS_TOP/build-fuse318/ckptfs
else
  out=$("$TESTS_TOP/scripts/libfuse318.sh" --ckptfs "$WORK/fuse318" 2>&1) && U=$WORK/fuse318/ckptfs
fi
[[ -n $U ]] || skip_all "no ckptfs with libfuse 3.18 and io_uring: $(echo "$out" | tail -n 2 | tr '\n' ' ')"

# One user of the kernel's switch at a time (bench/transport_bench.sh takes the same lock).
exec {knob_lock}> /tmp/ckptfs-enable_uring.lock
flock -w 900 "$knob_lock" || skip_all "another test or benchmark held $knob for 15 minutes"
old_knob=$(cat "$knob")
trap 'echo "$old_knob" > "$knob"; _cleanup' EXIT
check "--version says the build speaks FUSE over io_uring" bash -c "'$U' --version | grep -q 'FUSE over io_uring: yes'"

src=$WORK/llama
$PY "$models" write llama "$src" --shards 2 --tokenizer > /dev/null
shard=$(cd "$src" && ls -- *.safetensors | head -1)
ref=$WORK/ref
check "a reference mount by the build under test, through /dev/fuse" mount_ckptfs "$src" "$ref" -o io_uring=off

# --- the kernel has it switched off
echo N > "$knob"
mkdir -p "$WORK/refused"
"$U" mount -o io_uring=on "$src" "$WORK/refused" > "$WORK/refused.out" 2>&1
rc=$?
! mountpoint -q "$WORK/refused" && [[ $rc -ne 0 ]]
ok $? "io_uring=on while $knob is N: the mount is refused (exit $rc)"
grep -q "io_uring=on: FUSE over io_uring is not available: the kernel has it switched off (as root: echo Y > $knob)" "$WORK/refused.out"
ok $? "with a message that says how to switch it on ($(cat "$WORK/refused.out"))"

MOUNT_OPTS=passthrough=off,io_uring=auto fg_mount "$U" "$src" "$WORK/auto-n" "$WORK/auto-n.log"
ok $? "io_uring=auto while it is N: mounts"
pid=$FG_PID
before=$(daemon_io wchar "$pid")
check "rank files equal the reference's" diff -r "$ref/tp2pp1" "$WORK/auto-n/tp2pp1"
grew=$(($(daemon_io wchar "$pid") - before))
[[ $grew -ge $(du -sb "$ref/tp2pp1" | cut -f1) ]]
ok $? "replies written to /dev/fuse ($grew bytes)"
fg_unmount "$WORK/auto-n"
grep -q "serving through /dev/fuse, not FUSE over io_uring: the kernel has it switched off" "$WORK/auto-n.log"
ok $? "the log says why ($(head -c 300 "$WORK/auto-n.log"))"
[[ $(grep -c "io_uring" "$WORK/auto-n.log") -eq 1 ]]
ok $? "in one line"

# --- switched on
echo Y > "$knob"
# mount_uring NAME OPTIONS: a foreground mount at $WORK/NAME, log $WORK/NAME.log, pid in FG_PID.
mount_uring() { MOUNT_OPTS=$2 fg_mount "$U" "$src" "$WORK/$1" "$WORK/$1.log"; }
rings() { grep -lx "fuse-ring-[0-9]*" /proc/"$1"/task/*/comm 2> /dev/null | wc -l; }

for mapped in on off; do
  mnt=$WORK/on-$mapped
  # readahead=off: on 8 cores or more readahead=auto (the default) would store a lone reader's
  # chunks with write(2) to /dev/fuse, which the byte count below takes for replies.
  mount_uring "on-$mapped" "io_uring=on,mapped_reads=$mapped,readahead=off"
  ok $? "io_uring=on,mapped_reads=$mapped: mounts"
  pid=$FG_PID
  [[ $(rings "$pid") -ge 1 ]]
  ok $? "the daemon serves io_uring queues ($(rings "$pid") ring threads)"
  before=$(daemon_io wchar "$pid")
  check "mapped_reads=$mapped: every tp2pp1/ rank file equals the reference's" diff -r "$ref/tp2pp1" "$mnt/tp2pp1"
  check "mapped_reads=$mapped: every mcore/ file equals the reference's" diff -r "$ref/mcore" "$mnt/mcore"
  check "mapped_reads=$mapped: reads at odd offsets and sizes equal the reference's" \
    $PY "$TESTS_TOP/tests/lib/same_reads.py" "$mnt/tp2pp1/release/mp_rank_01/model_optim_rng.pt" \
    "$ref/tp2pp1/release/mp_rank_01/model_optim_rng.pt"
  grew=$(($(daemon_io wchar "$pid") - before))
  [[ $grew -lt 65536 ]]
  ok $? "the replies went through the rings, not write(2) to /dev/fuse ($grew bytes written)"
  check "hf/ equals the source" same_trees "$src" "$mnt/hf" .
  fg_unmount "$mnt"
  grep -q "transport: FUSE over io_uring" "$WORK/on-$mapped.log"
  ok $? "the log says which transport served ($(head -c 300 "$WORK/on-$mapped.log"))"
done

mount_uring auto-y "io_uring=auto"
ok $? "io_uring=auto while it is Y: mounts"
check "rank files equal the reference's" diff -r "$ref/tp2pp1" "$WORK/auto-y/tp2pp1"
[[ $(rings "$FG_PID") -ge 1 ]]
ok $? "over io_uring"
fg_unmount "$WORK/auto-y"
grep -q "transport: FUSE over io_uring" "$WORK/auto-y.log" && ! grep -q "/dev/fuse" "$WORK/auto-y.log"
ok $? "the log says so, nothing about /dev/fuse"

mount_uring default ""
ok $? "no io_uring option while it is Y: mounts"
check "rank files equal the reference's" diff -r "$ref/tp2pp1" "$WORK/default/tp2pp1"
[[ $(rings "$FG_PID") -eq 0 ]]
ok $? "the default is /dev/fuse: no ring threads"
fg_unmount "$WORK/default"

mount_uring off "io_uring=off"
ok $? "io_uring=off while it is Y: mounts"
pid=$FG_PID
[[ $(rings "$pid") -eq 0 ]]
ok $? "no ring threads"
before=$(daemon_io wchar "$pid")
check "rank files equal the reference's" diff -r "$ref/tp2pp1" "$WORK/off/tp2pp1"
grew=$(($(daemon_io wchar "$pid") - before))
[[ $grew -ge $(du -sb "$ref/tp2pp1" | cut -f1) ]]
ok $? "replies written to /dev/fuse ($grew bytes)"
fg_unmount "$WORK/off"
! grep -q "io_uring" "$WORK/off.log"
ok $? "nothing about io_uring in the log"

"$U" mount -o io_uring=maybe "$src" "$WORK/refused" > "$WORK/bad.out" 2>&1
[[ $? -ne 0 ]] && grep -q "option io_uring=maybe: expected io_uring=auto, on or off" "$WORK/bad.out"
ok $? "a bad value is refused ($(cat "$WORK/bad.out"))"

# --- FUSE passthrough on by default (this build has libfuse 3.18; the kernel needs 6.9+):
# through /dev/fuse, where what the daemon writes is what it served.
if zgrep -q '^CONFIG_FUSE_PASSTHROUGH=y' /proc/config.gz 2> /dev/null; then
  hf_bytes=$(cd "$src" && cat -- * | wc -c)
  for opts in io_uring=off io_uring=off,passthrough io_uring=off,passthrough=off; do
    mount_uring pt "$opts"
    pid=$FG_PID
    before=$(daemon_io wchar "$pid")
    check "$opts: hf/ equals the source" same_trees "$src" "$WORK/pt/hf" .
    grew=$(($(daemon_io wchar "$pid") - before))
    fg_unmount "$WORK/pt"
    if [[ $opts == *passthrough=off ]]; then
      [[ $grew -ge $hf_bytes ]]
      ok $? "$opts: the daemon served the hf/ files itself ($grew of $hf_bytes bytes)"
    else
      [[ $grew -lt 65536 ]]
      ok $? "$opts: the kernel read the hf/ files from the source (passthrough): the daemon served $grew of $hf_bytes bytes"
    fi
    ! grep -q "passthrough" "$WORK/pt.log"
    ok $? "$opts: nothing about passthrough in the log"
  done
  # Not root in the kernel's eyes (a user namespace's root): auto falls back without a word.
  if unshare --user --map-root-user true 2> /dev/null; then
    mkdir -p "$WORK/nocap"
    unshare --user --map-root-user --mount --propagation private bash -c '
      "$1" mount -f -o io_uring=off "$2" "$3" 2> "$4" &
      pid=$!
      for _ in $(seq 100); do mountpoint -q "$3" && break; sleep 0.1; done
      cmp "$2/$5" "$3/hf/$5" && echo same
      umount "$3"; wait $pid' _ "$U" "$src" "$WORK/nocap" "$WORK/nocap.log" "$shard" > "$WORK/nocap.out" 2>&1
    grep -q "^same$" "$WORK/nocap.out" && ! grep -q "passthrough" "$WORK/nocap.log"
    ok $? "without CAP_SYS_ADMIN: hf/ served by the daemon, nothing logged ($(cat "$WORK/nocap.out" "$WORK/nocap.log" | head -c 300))"
  else
    skip "no user namespaces here: no check without CAP_SYS_ADMIN"
  fi
else
  skip "kernel $(uname -r) without CONFIG_FUSE_PASSTHROUGH (or no /proc/config.gz): passthrough by default not checked"
fi

unmount_ckptfs "$ref"
done_testing
