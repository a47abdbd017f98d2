# Shared helpers for the bash integration tests: TAP output, mounts that are always unmounted,
# the Debian 13 root with torch 2.6 + safetensors and the sid root with transformers 5. Source
# it; it sets `set -u` and traps.
set -u
TESTS_TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CKPTFS=${CKPTFS_BIN:-$TESTS_TOP/build/ckptfs}
# Checkpoints Megatron-LM and torch wrote (tests/data/README.md): the tests read nothing outside
# the repository.
TESTDATA=$TESTS_TOP/tests/data
PY=/usr/bin/python3
TORCH2_ROOT=${CKPTFS_TORCH2_ROOT:-/var/cache/ckptfs-tests/trixie-root}
SID_ROOT=${CKPTFS_SID_ROOT:-/var/cache/ckptfs-tests/sid-root}
_tap_n=0
_tap_failed=0
WORK=$(mktemp -d /tmp/ckptfs-test.XXXXXX)

# Every mount below $WORK is unmounted, whichever subshell made it; then $WORK goes.
_cleanup() {
  local m
  for m in $(awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r); do
    fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  rm -rf --one-file-system "$WORK"
  # The empty mount points root_python and trixie_ckptfs made for $WORK's directories in the roots.
  local root
  for root in "$TORCH2_ROOT" "$SID_ROOT"; do
    [[ -d $root$WORK ]] && find "$root$WORK" -depth -type d -empty -delete 2> /dev/null
  done
  return 0
}
trap _cleanup EXIT

ok() { # ok CONDITION-STATUS DESCRIPTION
  _tap_n=$((_tap_n + 1))
  if [[ $1 -eq 0 ]]; then echo "ok $_tap_n - $2"; return 0; fi
  echo "not ok $_tap_n - $2"
  _tap_failed=$((_tap_failed + 1))
  # On stderr, so that prove shows it without -v (CI logs keep only what prove prints).
  echo "#   Failed test $_tap_n - $2 (${0##*/})" >&2
}
check() { # check DESCRIPTION COMMAND...: ok when the command succeeds (its output, on stderr, on failure)
  local desc=$1 out rc
  shift
  out=$("$@" 2>&1); rc=$?
  ok $rc "$desc"
  [[ $rc -eq 0 ]] || printf '%s\n' "$out" | sed 's/^/# /' | head -40 >&2
  return 0
}
skip() { _tap_n=$((_tap_n + 1)); echo "ok $_tap_n # skip $1"; }
diag() { echo "# $*"; }           # a note, on stdout (prove -v shows it)
fail_diag() { echo "# $*" >&2; }  # why something failed, on stderr (prove always shows it)
done_testing() { echo "1..$_tap_n"; [[ $_tap_failed -eq 0 ]]; }

require_fuse() {
  if [[ ! -e /dev/fuse ]] || ! command -v fusermount3 >/dev/null; then
    echo "1..0 # skip /dev/fuse or fusermount3 missing: mounting tests cannot run here"
    exit 0
  fi
}

# mount_ckptfs SRC MNT [OPTIONS]: mounts (registering the unmount) or returns non-zero.
mount_ckptfs() {
  local src=$1 mnt=$2
  shift 2
  mkdir -p "$mnt"
  "$CKPTFS" mount "$@" "$src" "$mnt"
}
unmount_ckptfs() { fusermount3 -u "$1"; }

# fg_mount BIN SRC MNT LOG [ARGS...]: a daemon in the foreground (options from $MOUNT_OPTS),
# logging to LOG, run under ARGS (a wrapper such as prlimit) if given; sets FG_PID.
fg_mount() {
  local bin=$1 from=$2 mnt=$3 log=$4
  shift 4
  mkdir -p "$mnt"
  "$@" "$bin" mount -f ${MOUNT_OPTS:+-o "$MOUNT_OPTS"} "$from" "$mnt" 2> "$log" &
  FG_PID=$!
  for _ in $(seq 100); do
    mountpoint -q "$mnt" && return 0
    kill -0 "$FG_PID" 2> /dev/null || return 1
    sleep 0.1
  done
  return 1
}
fg_unmount() { # MNT: unmounts and waits for the daemon
  local rc=0
  fusermount3 -u "$1" || rc=$?
  wait "$FG_PID" 2> /dev/null
  return $rc
}
# ran STATUS DESCRIPTION ERRFILE: ok, with the end of ERRFILE on stderr on failure.
ran() {
  ok "$1" "$2"
  [[ $1 -eq 0 ]] || tail -n 20 "$3" | sed 's/^/# /' >&2
}
# passes FILE: one TAP line per PASS/FAIL line of FILE (the scratch directory left out of the text).
passes() {
  local state what
  while read -r state what; do
    [[ $state == PASS || $state == FAIL ]] && ok "$([[ $state == PASS ]]; echo $?)" "${what//$WORK\//}"
  done < "$1"
}
# same_trees A B DIR...: every file under DIR... of B equals A's (printing the ones that differ);
# B's DIRs (links to a view followed) must exist and hold files, so that a missing mount or view
# never passes.
same_trees() {
  local a=$1 b=$2 f bad=0 files
  shift 2
  files=$(cd "$b" && find -H "$@" -type f) || { echo "cannot list $*/ under $b"; return 1; }
  [[ -n $files ]] || { echo "no files under $b/$*"; return 1; }
  for f in $files; do
    cmp -s "$a/$f" "$b/$f" || { echo "differs: $f"; bad=1; }
  done
  return $bad
}
# daemon_io FIELD PID: a counter of /proc/PID/io (rchar: bytes it read; wchar: bytes it wrote,
# its replies to /dev/fuse among them).
daemon_io() { awk -v f="$1:" '$1 == f {print $2}' "/proc/$2/io"; }

# The torch 2.6 root: built once with debootstrap (mirror from the machine's apt sources),
# reused after. torch2_available returns non-zero with the reason in TORCH2_WHY.
torch2_available() {
  TORCH2_WHY=""
  if [[ -x $TORCH2_ROOT/usr/bin/python3 ]]; then return 0; fi
  TORCH2_WHY="no Debian 13 root at $TORCH2_ROOT (tests/run-all.sh builds it)"
  return 1
}
torch2_root_ensure() {
  torch2_available && return 0
  debian_root_make "$TORCH2_ROOT" trixie 'torch, safetensors' \
    --include=python3-torch,python3-safetensors,python3-numpy
}
# The sid root: transformers 5 and the torch it goes with, to save models the way transformers 5
# does and load ckptfs's views back with it (tests/integration/tf5_roundtrip.t). Made like the
# torch 2.6 root, the packages then installed by the root's apt.
sid_available() {
  SID_WHY=""
  if [[ -x $SID_ROOT/usr/bin/python3 ]]; then return 0; fi
  SID_WHY="no Debian sid root at $SID_ROOT (tests/run-all.sh builds it)"
  return 1
}
sid_root_ensure() {
  sid_available && return 0
  debian_root_make "$SID_ROOT" sid 'torch, safetensors, transformers' -- \
    python3-transformers python3-torch python3-safetensors
}
# debian_root_make ROOT SUITE IMPORTS [DEBOOTSTRAP ARGS...] [-- APT PACKAGES...]: debootstraps
# SUITE into ROOT.tmp from the machine's Debian mirror, apt-installs the packages there, and
# renames it ROOT once python3 imports IMPORTS; a complete ROOT.tmp left by an interrupted
# run is kept.
debian_root_make() {
  local root=$1 suite=$2 imports=$3 url tmp=$1.tmp name=${1##*/}
  shift 3
  local boot=() apt=()
  while (($#)) && [[ $1 != -- ]]; do boot+=("$1"); shift; done
  (($#)) && shift && apt=("$@")
  url=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
  [[ -n $url ]] || url=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
  [[ -n $url ]] || { echo "$name: no Debian mirror configured" >&2; return 1; }
  command -v debootstrap >/dev/null || { echo "$name: debootstrap missing" >&2; return 1; }
  if [[ -x $tmp/usr/bin/python3 ]] && chroot "$tmp" /usr/bin/python3 -c "import $imports" 2>/dev/null; then
    mv "$tmp" "$root"
    return 0
  fi
  rm -rf "$tmp"
  mkdir -p "$(dirname "$root")"
  debootstrap --variant=minbase "${boot[@]}" "$suite" "$tmp" "$url" >&2 || return 1
  # sid's Release expires within days: a mirror that is a dated snapshot serves it expired.
  if ((${#apt[@]})); then
    chroot "$tmp" apt-get -o Acquire::Check-Valid-Until=false update >&2 &&
      chroot "$tmp" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "${apt[@]}" >&2 &&
      chroot "$tmp" apt-get clean || return 1
  fi
  mv "$tmp" "$root"
}
# What building ckptfs in the Debian 13 root needs (libfuse 3.17: FUSE passthrough), added to the
# root with its apt once (scripts/bundle.sh --prepare); non-zero with the reason in TRIXIE_WHY.
trixie_build_deps_ensure() {
  TRIXIE_WHY=""
  torch2_available || { TRIXIE_WHY=$TORCH2_WHY; return 1; }
  local out
  out=$("$TESTS_TOP/scripts/bundle.sh" --root "$TORCH2_ROOT" --prepare 2>&1) || { TRIXIE_WHY=$out; return 1; }
}

# trixie_ckptfs DIR [CMAKE ARGS...]: scripts/bundle.sh in the Debian 13 root: DIR/bin/ckptfs,
# built against libfuse 3.17 and run with the root's libraries copied to DIR/lib. Non-zero with
# the reason in TRIXIE_WHY.
trixie_ckptfs() {
  local dir=$1
  shift
  TRIXIE_WHY=""
  trixie_build_deps_ensure || return 1
  mkdir -p "$dir"
  "$TESTS_TOP/scripts/bundle.sh" --root "$TORCH2_ROOT" "$dir" "$@" > "$dir.log" 2>&1 ||
    { TRIXIE_WHY="scripts/bundle.sh failed: $(tail -n 3 "$dir.log" | tr '\n' ' ')"; return 1; }
}

# torch2_python DIRS SCRIPT ARGS...: runs python3 of the root on SCRIPT, with the directories
# in DIRS (colon-separated: mounts and files the script reads) and the tests' lib visible at the
# same paths; in a private mount namespace, so nothing leaks if the test dies; killed after
# TORCH2_TIMEOUT seconds (900), so a hung loader fails its check instead of stalling the run.
torch2_python() { root_python "$TORCH2_ROOT" "$@"; }
# sid_python DIRS SCRIPT ARGS...: the same in the sid root (transformers 5).
sid_python() { root_python "$SID_ROOT" "$@"; }
root_python() {
  local root=$1 dirs="$2:$TESTS_TOP/tests/lib"
  shift 2
  unshare --mount --propagation private bash -c '
    root=$1 dirs=$2; shift 2
    mount -t proc proc "$root/proc" || exit 1
    IFS=: read -ra list <<< "$dirs"
    for d in "${list[@]}"; do
      mkdir -p "$root$d" && mount --rbind "$d" "$root$d" || exit 1
    done
    exec timeout --kill-after=10 "${TORCH2_TIMEOUT:-900}" chroot "$root" /usr/bin/python3 "$@"' \
    _ "$root" "$dirs" "$@"
}
