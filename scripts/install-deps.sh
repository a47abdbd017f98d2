#!/usr/bin/env bash
# Installs the Debian packages ckptfs needs (run as root on Debian 12).
#   scripts/install-deps.sh          build + demo: compiler, libraries, FUSE, python3 torch/numpy
#   scripts/install-deps.sh --tests  also what the test suite uses (clang for fuzzing, debootstrap;
#                                    meson, ninja-build, liburing-dev, libnuma-dev and curl for
#                                    libfuse 3.18 with io_uring, scripts/libfuse318.sh;
#                                    rclone, s3fs, npm and s3rver for tests/integration/s3.t: s3rver with
#                                    npm into /opt/ckptfs-test/s3rver, a warning if that fails)
set -euo pipefail

packages=(build-essential cmake pkg-config libfuse3-dev fuse3 libglib2.0-dev libjson-glib-dev
          libzstd-dev liblz4-dev libxxhash-dev zlib1g-dev python3-numpy python3-torch)
if [[ "${1:-}" == "--tests" ]]; then
  packages+=(clang libclang-rt-dev debootstrap util-linux perl psmisc python3-xxhash rclone s3fs
             meson ninja-build liburing-dev libnuma-dev curl)
fi

# s3rver (an S3 emulator, from npm) for tests/integration/s3.t, in a fixed prefix; failing soft:
# without it that test skips and the rest of the suite runs.
s3rver_prefix=/opt/ckptfs-test/s3rver
install_s3rver() {
  [[ "${1:-}" == "--tests" ]] || return 0
  [[ -e $s3rver_prefix/node_modules/s3rver/package.json ]] && return 0
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: warning: s3rver not installed (needs root): tests/integration/s3.t will skip" >&2
    return 0
  fi
  # Debian's npm (and nodejs) only where no npm is there: a node from elsewhere brings its own,
  # and Debian's npm would conflict with it.
  if ! command -v npm > /dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends npm > /dev/null 2>&1 ||
      { echo "install-deps: warning: npm not installable: tests/integration/s3.t will skip" >&2; return 0; }
  fi
  echo "install-deps: installing s3rver 3.x with npm into $s3rver_prefix"
  mkdir -p "$s3rver_prefix"
  timeout 300 npm install --prefix "$s3rver_prefix" --no-audit --no-fund s3rver@3 > /dev/null 2>&1 ||
    echo "install-deps: warning: npm install s3rver failed: tests/integration/s3.t will skip" >&2
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  install_s3rver "${1:-}"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: missing packages (${missing[*]}); run as root" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
install_s3rver "${1:-}"
