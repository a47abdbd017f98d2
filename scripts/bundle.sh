#!/usr/bin/env bash
# A ckptfs for machines whose libfuse is older than 3.17 (Debian 12, Ubuntu 22.04 and 24.04: no
# FUSE passthrough) or that have no libfuse at all (GPU nodes): built in a Debian 13 root against
# its libraries, and installed with those libraries and their loader under one directory.
#
#   scripts/bundle.sh [--root DIR] [--io-uring] DEST [CMAKE ARGS...]   build DEST/bin/ckptfs and DEST/lib/
#   scripts/bundle.sh [--root DIR] [--io-uring] --prepare              only make the root ready to build
#
#   DEST        the absolute path the bundle will have on every machine it runs on: the binary
#               finds its loader and libraries there (copy the directory to the same path)
#   --root DIR  the Debian 13 root to build in (default /var/cache/ckptfs-build/trixie-root):
#               made with debootstrap when missing (about 800 MB, a minute), the build packages added
#               with its apt when missing; needs root and a Debian mirror in the apt sources
#   --io-uring  against libfuse 3.18 built with FUSE over io_uring (scripts/libfuse318.sh, in the
#               root; its source fetched here), not the root's libfuse 3.17: -o io_uring on nodes
#               with Linux 6.14+ (docs/user-guide.md); the root then also gets meson, ninja-build,
#               liburing-dev and libnuma-dev
#   CMAKE ARGS  e.g. -DCMAKE_BUILD_TYPE=Debug -DCKPTFS_SANITIZE=ON (default: Release)
#
# Runs `DEST/bin/ckptfs --version` at the end. FUSE passthrough still needs Linux 6.9 or later
# and root on the machine that mounts (docs/user-guide.md).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
source "$top/scripts/debian_mirror.sh"

root=/var/cache/ckptfs-build/trixie-root
prepare_only=0
io_uring=0
while [[ $# -gt 0 ]]; do
  case $1 in
  --root) root=${2:?--root needs a directory}; shift 2 ;;
  --prepare) prepare_only=1; shift ;;
  --io-uring) io_uring=1; shift ;;
  -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  *) break ;;
  esac
done
die() { echo "bundle: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, chroot)"

packages=(gcc libc6-dev make cmake pkgconf libfuse3-dev libglib2.0-dev libjson-glib-dev zlib1g-dev
  libzstd-dev liblz4-dev libxxhash-dev)
((io_uring)) && packages+=(meson ninja-build liburing-dev libnuma-dev)

# The root: debootstrap when missing, the packages with its own apt when some are missing.
if [[ ! -x $root/usr/bin/apt-get ]]; then
  command -v debootstrap > /dev/null || die "debootstrap missing (apt-get install debootstrap)"
  url=$(debian_mirror)
  [[ -n $url ]] || die "no Debian mirror in this machine's apt sources"
  mkdir -p "$(dirname "$root")"
  rm -rf "$root.tmp"
  # The packages come after, from the root's apt: debootstrap's resolver cannot install them
  # (alternatives among their dependencies).
  debootstrap --variant=minbase trixie "$root.tmp" "$url" >&2 ||
    die "debootstrap of $root failed"
  mv "$root.tmp" "$root"
fi
root_lacks_packages() {
  [[ ! -e $root/usr/include/fuse3/fuse_lowlevel.h || ! -e $root/usr/include/xxhash.h || ! -x $root/usr/bin/cmake ]] && return 0
  ((io_uring)) && [[ ! -e $root/usr/include/liburing.h || ! -e $root/usr/include/numa.h || ! -x $root/usr/bin/meson ]]
}
if root_lacks_packages; then
  cp /etc/resolv.conf "$root/etc/resolv.conf" 2> /dev/null || true
  unshare --mount --propagation private bash -c '
    root=$1; shift
    mount -t proc proc "$root/proc" || exit 1
    chroot "$root" apt-get update -q && DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -q \
      --no-install-recommends "$@"' _ "$root" "${packages[@]}" > "$root.apt.log" 2>&1 ||
    die "installing the build packages into $root failed (see $root.apt.log)"
fi
((prepare_only)) && exit 0

dest=${1:?usage: scripts/bundle.sh [--root DIR] DEST [CMAKE ARGS...]}
shift
[[ $dest == /* ]] || die "DEST must be an absolute path (the binary is built for it): $dest"
lib=$dest/lib
mkdir -p "$dest/bin" "$lib"
build=$(mktemp -d /tmp/ckptfs-bundle.XXXXXX)
trap 'rm -rf "$build"; find "$root$build" -depth -type d -empty -delete 2> /dev/null || true' EXIT

# libfuse 3.18 with io_uring: its source fetched here (the root has no curl), built in the root into
# a prefix of its own (kept there and reused), found by pkg-config first.
fuse318=""
if ((io_uring)); then
  "$top/scripts/libfuse318.sh" --source "$build/fuse3.orig.tar.gz" || die "no libfuse 3.18 source"
  fuse318=/opt/ckptfs-libfuse-3.18
fi

# Built and linked in the root, for the loader and libraries at DEST/lib (RPATH, not RUNPATH:
# it applies to the libraries' own dependencies too). The root's loader lists what to copy.
unshare --mount --propagation private bash -c '
  root=$1 top=$2 build=$3 lib=$4 fuse318=$5; shift 5
  for d in "$top" "$build"; do mkdir -p "$root$d" && mount --bind "$d" "$root$d" || exit 1; done
  if [[ -n $fuse318 ]]; then
    chroot "$root" env CKPTFS_LIBFUSE_TARBALL="$build/fuse3.orig.tar.gz" "$top/scripts/libfuse318.sh" "$fuse318" &&
      export PKG_CONFIG_PATH=$fuse318/lib/pkgconfig LD_LIBRARY_PATH=$fuse318/lib || exit 1
  fi
  chroot "$root" cmake -S "$top" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_SKIP_BUILD_RPATH=ON "$@" \
    "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--dynamic-linker=$lib/ld-linux-x86-64.so.2 -Wl,--disable-new-dtags,-rpath,$lib" &&
  chroot "$root" cmake --build "$build" --target ckptfs -j "$(nproc)" &&
  chroot "$root" /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --list "$build/ckptfs" > "$build/libs" &&
  chroot "$root" pkg-config --modversion fuse3 > "$build/fuse"' _ "$root" "$top" "$build" "$lib" "$fuse318" "$@" > "$build/log" 2>&1 ||
  { tail -n 20 "$build/log" >&2; die "the build in $root failed"; }

install -m 0755 "$build/ckptfs" "$dest/bin/ckptfs"
# "NAME => /path (addr)" lines; the loader's is "DEST/lib/ld-linux-x86-64.so.2 => /path (addr)".
awk '$2 == "=>" && $3 ~ /^\// {n = split($1, p, "/"); print p[n], $3}' "$build/libs" |
  while read -r name path; do
    cp -L "$root$path" "$lib/$name" || die "cannot copy $path from $root"
  done
[[ -e $lib/ld-linux-x86-64.so.2 ]] || die "the loader was not among the libraries ldd listed"
"$dest/bin/ckptfs" --version > /dev/null || die "$dest/bin/ckptfs does not run here"
echo "bundle: $dest/bin/ckptfs and $(ls "$lib" | wc -l) libraries in $lib ($(du -sh "$dest" | cut -f1)), libfuse $(cat "$build/fuse")"
"$dest/bin/ckptfs" --version
