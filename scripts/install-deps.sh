#!/usr/bin/env bash
# Installs the Debian packages ckptfs needs (run as root on Debian 12).
#   scripts/install-deps.sh          build + demo: compiler, libraries, FUSE, python3 torch/numpy
#   scripts/install-deps.sh --tests  also what the test suite uses (clang for fuzzing, debootstrap)
set -euo pipefail

packages=(build-essential cmake pkg-config libfuse3-dev fuse3 libglib2.0-dev libjson-glib-dev
          libzstd-dev liblz4-dev libxxhash-dev zlib1g-dev python3-numpy python3-torch)
if [[ "${1:-}" == "--tests" ]]; then
  packages+=(clang libclang-rt-dev debootstrap util-linux perl psmisc python3-xxhash)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
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
