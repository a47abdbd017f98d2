# shellcheck shell=bash
# Shared by the scripts a GPU node runs from a bundle (node_uring.sh, node_readahead.sh): sourced,
# with HERE, REPO and OUT set and die() defined.
#
# node_python: PYTHON becomes a python with numpy (the generator needs it).
node_python() {
  local py
  for py in ${PYTHON:-} python3 /usr/bin/python3 /opt/conda/bin/python3 /usr/local/bin/python3; do
    if "$py" -c 'import numpy' 2> /dev/null; then PYTHON=$(command -v "$py"); return 0; fi
  done
  PYTHON=${PYTHON:-python3}
}

# node_bundle: BIN becomes the bundle's ckptfs at NODE_BUNDLE (default /tmp/ckptfs-node), the path
# scripts/bundle.sh built it for, copied there from build-node/ in the repository when missing;
# CKPTFS_BIN, when set, is used instead (a local build: how the scripts are tried on a build host).
node_bundle() {
  NODE_BUNDLE=${NODE_BUNDLE:-/tmp/ckptfs-node}
  if [[ -n ${CKPTFS_BIN:-} ]]; then
    BIN=$CKPTFS_BIN
  else
    if [[ ! -x $NODE_BUNDLE/bin/ckptfs ]]; then
      [[ -x $REPO/build-node/bin/ckptfs ]] || die "no bundle: neither $NODE_BUNDLE nor $REPO/build-node"
      mkdir -p "$NODE_BUNDLE"
      cp -a "$REPO/build-node/." "$NODE_BUNDLE/"
    fi
    BIN=$NODE_BUNDLE/bin/ckptfs
  fi
  "$BIN" --version > /dev/null || die "$BIN does not run here"
}

# Without fusermount3 (no FUSE package on the node), root unmounts with umount(8): the helpers of
# bench/daemon.sh call fusermount3 -u / -uz.
node_fusermount() {
  command -v fusermount3 > /dev/null && return 0
  # shellcheck disable=SC2317 # called by the helpers of bench/daemon.sh
  fusermount3() {
    case $1 in
    -u) umount "$2" ;;
    -uz) umount -l "$2" ;;
    *) return 1 ;;
    esac
  }
  export -f fusermount3
}

# node_env_lines: the machine, kernel and binary, one fact a line.
node_env_lines() {
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), host $(hostname)"
  echo "cores: $(nproc), CPU: $(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
  echo "memory: $(awk '/^MemTotal:/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo), kernel $(uname -r)"
  echo "fuse max_pages_limit: $(cat /proc/sys/fs/fuse/max_pages_limit 2> /dev/null || echo '?')"
  echo "binary: $BIN: $("$BIN" --version)"
  echo "python: $PYTHON $("$PYTHON" -c 'import numpy, platform; print(platform.python_version(), "numpy", numpy.__version__)' 2>&1)"
}
