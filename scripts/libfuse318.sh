#!/usr/bin/env bash
# libfuse 3.18 with FUSE over io_uring, built from Debian's fuse3 source into a prefix (Debian 12
# ships 3.14, and Debian's 3.18 packages are built without io_uring), and ckptfs built against it.
#
#   scripts/libfuse318.sh [PREFIX]                   build libfuse into PREFIX (reused when there)
#   scripts/libfuse318.sh --ckptfs DIR [CMAKE ARGS]  also build ckptfs in DIR (scripts/build.sh)
#                                                    against it: DIR/ckptfs finds PREFIX/lib by RPATH
#   scripts/libfuse318.sh --source FILE              only fetch and check the source tarball
#
#   PREFIX   default /var/cache/ckptfs-tests/libfuse-3.18 (CKPTFS_LIBFUSE318 overrides it)
#   CKPTFS_LIBFUSE_TARBALL  a local copy of fuse3_VERSION.orig.tar.gz (checked against the same
#                           checksum) instead of the download from the Debian mirror of apt's sources
#
# Needs meson, ninja-build, liburing-dev and libnuma-dev (scripts/install-deps.sh --tests). The
# build fails when the library came out without io_uring (liburing too old: it needs SQE128).
# Prints the prefix on success. FUSE over io_uring also needs Linux 6.14 or later built with
# CONFIG_FUSE_IO_URING, switched on by root: echo Y > /sys/module/fuse/parameters/enable_uring.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
source "$top/scripts/debian_mirror.sh"

# The pinned source: the orig tarball of Debian's fuse3 3.18.3-1 (unstable), by its SHA-256.
version=3.18.3
debian_revision=1
sha256=bcd19582c5e30f7fe45dd86a5540e998590aa01903afc7ebcbeea6c8ac5421ee

die() { echo "libfuse318: $*" >&2; exit 1; }

# fetch_source FILE: the pinned tarball, from CKPTFS_LIBFUSE_TARBALL or the mirror, checked.
fetch_source() {
  local tarball=$1
  if [[ -n ${CKPTFS_LIBFUSE_TARBALL:-} ]]; then
    cp "$CKPTFS_LIBFUSE_TARBALL" "$tarball"
  else
    local mirror pool
    mirror=$(debian_mirror)
    [[ -n $mirror ]] || die "no Debian mirror in this machine's apt sources (or set CKPTFS_LIBFUSE_TARBALL)"
    pool=$mirror/pool/main/f/fuse3
    curl -fsS --retry 3 -o "$tarball.dsc" "$pool/fuse3_$version-$debian_revision.dsc" ||
      die "cannot fetch $pool/fuse3_$version-$debian_revision.dsc"
    # The source description must name the same tarball: a pin that no longer matches it is a
    # mistake here, not a file to trust.
    grep -q "^ $sha256 [0-9]* fuse3_$version.orig.tar.gz$" "$tarball.dsc" ||
      die "fuse3_$version-$debian_revision.dsc does not list the pinned checksum of the tarball"
    rm -f "$tarball.dsc"
    curl -fsS --retry 3 -o "$tarball" "$pool/fuse3_$version.orig.tar.gz" ||
      die "cannot fetch $pool/fuse3_$version.orig.tar.gz"
  fi
  echo "$sha256  $tarball" | sha256sum -c --quiet - > /dev/null 2>&1 ||
    die "fuse3_$version.orig.tar.gz: checksum mismatch (expected SHA-256 $sha256)"
}

if [[ ${1:-} == --source ]]; then
  fetch_source "${2:?--source needs a file name}"
  exit 0
fi
ckptfs_dir=""
if [[ ${1:-} == --ckptfs ]]; then
  ckptfs_dir=${2:?--ckptfs needs a build directory}
  shift 2
  prefix=${CKPTFS_LIBFUSE318:-/var/cache/ckptfs-tests/libfuse-3.18}
else
  [[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0; }
  prefix=${1:-${CKPTFS_LIBFUSE318:-/var/cache/ckptfs-tests/libfuse-3.18}}
  shift $(($# > 0 ? 1 : 0))
fi
[[ $prefix == /* ]] || die "the prefix must be an absolute path: $prefix"

# Built once: the marker is written last, after a build that has io_uring.
marker=$prefix/io_uring-$version
if [[ ! -e $marker ]]; then
  for tool in meson ninja; do
    command -v "$tool" > /dev/null || die "$tool missing (scripts/install-deps.sh --tests)"
  done
  for pc in liburing numa; do
    pkg-config --exists "$pc" || die "$pc development files missing (liburing-dev, libnuma-dev)"
  done
  work=$(mktemp -d /tmp/libfuse318.XXXXXX)
  trap 'rm -rf "$work"' EXIT
  tarball=$work/fuse3_$version.orig.tar.gz
  fetch_source "$tarball"
  tar -xzf "$tarball" -C "$work"
  src=$work/fuse-$version
  [[ -d $src ]] || die "the tarball has no fuse-$version/"
  # Only the library: fusermount3 is the system's (a setuid helper is nothing to install here).
  meson setup "$work/build" "$src" --prefix="$prefix.tmp" --libdir=lib --buildtype=release \
    -Denable-io-uring=true -Dutils=false -Dexamples=false -Dtests=false > "$work/meson.log" 2>&1 ||
    { tail -n 20 "$work/meson.log" >&2; die "meson setup failed"; }
  grep -q '^#define HAVE_URING' "$work/build/fuse_config.h" ||
    die "libfuse $version configured without io_uring (liburing with SQE128 and libnuma needed)"
  rm -rf "$prefix.tmp"
  ninja -C "$work/build" install > "$work/ninja.log" 2>&1 ||
    { tail -n 20 "$work/ninja.log" >&2; die "the libfuse build failed"; }
  # The pkg-config file names the final prefix.
  sed -i "s|$prefix.tmp|$prefix|g" "$prefix.tmp/lib/pkgconfig/fuse3.pc"
  rm -rf "$prefix"
  mv "$prefix.tmp" "$prefix"
  touch "$marker"
fi

if [[ -n $ckptfs_dir ]]; then
  # The library by its full path, with the build tree's RPATH to it (CMake adds one for a library
  # outside the system's directories).
  PKG_CONFIG_PATH=$prefix/lib/pkgconfig "$top/scripts/build.sh" "$ckptfs_dir" "$@" > /dev/null
  [[ $ckptfs_dir == /* ]] || ckptfs_dir=$top/$ckptfs_dir
  linked=$(ldd "$ckptfs_dir/ckptfs" 2>&1 | grep libfuse3 || true)
  [[ $linked == *"$prefix/lib/libfuse3"* ]] ||
    die "$ckptfs_dir/ckptfs is not linked against $prefix/lib/libfuse3 (ldd: ${linked:-no libfuse3})"
fi
echo "$prefix"
