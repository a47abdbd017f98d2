#!/usr/bin/env bash
# mount(8) and /etc/fstab through mount-helpers/mount.ckptfs. Runs in a private mount namespace
# where /usr/sbin gains mount.fuse.ckptfs through a read-only overlay and /etc/fstab is a test
# file: nothing of the machine's own is touched, and no mount outlives the test.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
if [[ $(id -u) -ne 0 ]] || ! command -v unshare >/dev/null; then
  echo "1..0 # skip needs root and unshare to stand in for /usr/sbin and /etc/fstab"
  exit 0
fi
$PY "$TESTS_TOP/tests/lib/models.py" write llama "$WORK/src" --tokenizer
mkdir -p "$WORK/sbin" "$WORK/mnt" "$WORK/mnt2"
# As installed: the helper in sbin, found by mount(8); ckptfs beside it (it looks there first).
cp "$TESTS_TOP/mount-helpers/mount.ckptfs" "$WORK/sbin/mount.fuse.ckptfs"
ln -s "$CKPTFS" "$WORK/sbin/ckptfs"
echo "$WORK/src $WORK/mnt2 fuse.ckptfs ro,noauto,nofail,noexec,nosuid,nodev,hf_shard_size=64K 0 0" > "$WORK/fstab"

sbin=$(readlink -f /usr/sbin)
unshare --mount --propagation private bash -s "$WORK" "$sbin" "$TESTS_TOP" <<'INNER'
set -u
work=$1 sbin=$2 top=$3
n=0 failed=0
ok() { n=$((n + 1)); if [[ $1 -eq 0 ]]; then echo "ok $n - $2"; else echo "not ok $n - $2"; echo "#   Failed test $n - $2" >&2; failed=1; fi; }
if ! mount -t overlay overlay -o "lowerdir=$work/sbin:$sbin" "$sbin" 2>"$work/err"; then
  echo "1..0 # skip no overlayfs to add the helper to $sbin: $(cat "$work/err")"
  exit 0
fi
mount --bind "$work/fstab" /etc/fstab
trap 'umount "$work/mnt" "$work/mnt2" 2>/dev/null' EXIT

mount -t fuse.ckptfs "$work/src" "$work/mnt" -o ro,allow_other 2>"$work/err"
ok $? "mount -t fuse.ckptfs SRC MNT -o ro,allow_other ($(head -c 200 "$work/err"))"
cmp -s "$work/src/model.safetensors" "$work/mnt/hf/model.safetensors"; ok $? "hf/ through the mount(8) mount is byte-identical"
grep -q " $work/mnt fuse.ckptfs ro," /proc/mounts; ok $? "listed as fuse.ckptfs, read-only"
umount "$work/mnt"; ok $? "umount works"

mount "$work/mnt2" 2>"$work/err"; ok $? "mount MNT from the fstab line ($(head -c 200 "$work/err"))"
ls "$work/mnt2/hf" | grep -q "model-00001-of-"; ok $? "the fstab options reach ckptfs (re-sharded hf/)"
grep " $work/mnt2 " /proc/mounts | grep -q "noexec"; ok $? "noexec, nosuid, nodev from fstab become mount flags"
umount "$work/mnt2"; ok $? "umount the fstab mount"

mount -t fuse.ckptfs "$work/nowhere" "$work/mnt" 2>"$work/err" && rc=0 || rc=1
[[ $rc -eq 1 ]] && grep -q nowhere "$work/err"; ok $? "a bad source fails through mount(8) with ckptfs's message"
grep -q " $work/mnt " /proc/mounts && rc=1 || rc=0; ok $rc "and nothing is mounted"
mount -t fuse.ckptfs "$work/src" "$work/mnt" -o spec=bogus 2>"$work/err" && rc=0 || rc=1
[[ $rc -eq 1 ]] && grep -q "spec" "$work/err"; ok $? "a bad ckptfs option fails through mount(8)"
"$top/mount-helpers/mount.ckptfs" "$work/src" "$work/mnt" -f -v -o ro,hf_shard_size=1M 2>"$work/err"
grep -q "mount -o ro,hf_shard_size=1M $work/src $work/mnt" "$work/err"; ok $? "-f -v: prints the command, mounts nothing"
echo "1..$n"
exit $failed
INNER
rc=$?
grep -q " $WORK/mnt" /proc/mounts && leaked=1 || leaked=0
[[ $leaked -eq 0 ]] || echo "# a mount leaked out of the namespace"
exit $((rc | leaked))
