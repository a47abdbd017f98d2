# A Debian 13 (trixie) root with torch 2.6 + safetensors, for loading ckptfs
# views with the real HF stack. Source this file, then:
#   torch2_root_ensure || skip "torch 2.6 root unavailable: $TORCH2_SKIP_REASON"
#   torch2_run DIR -- python3 script.py args...
# The root is ${CKPTFS_TORCH2_ROOT:-/var/cache/ckptfs-tests/trixie-root}. It is
# built into ROOT.tmp by debootstrap and renamed when complete. The mirror URL
# is read at run time from the first "URIs:" line of the apt sources.

TORCH2_ROOT=${CKPTFS_TORCH2_ROOT:-/var/cache/ckptfs-tests/trixie-root}
TORCH2_SKIP_REASON=""
TORCH2_SOURCES=${CKPTFS_TORCH2_SOURCES:-/etc/apt/sources.list.d/debian.sources}

# _torch2_py_ok ROOT: torch and safetensors import in ROOT (run with /proc mounted,
# inside a private mount namespace so nothing stays mounted).
_torch2_py_ok() {
    local root=$1
    [ -x "$root/usr/bin/python3" ] || return 1
    unshare --mount --propagation private -- /bin/sh -c '
        root=$1
        mount -t proc proc "$root/proc" || exit 125
        exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
            chroot "$root" /usr/bin/python3 -c "import torch, safetensors, safetensors.torch, numpy" 
    ' sh "$root" >/dev/null 2>&1
}

# _torch2_mounts_under DIR: is anything mounted at or below DIR?
_torch2_mounts_under() {
    awk -v p="$1" '$2 == p || index($2, p "/") == 1 { f = 1 } END { exit !f }' /proc/mounts
}

_torch2_mirror_url() {
    [ -r "$TORCH2_SOURCES" ] || return 1
    awk '/^[[:space:]]*URIs:/ { print $2; exit }' "$TORCH2_SOURCES"
}

torch2_root_ensure() {
    local root=$TORCH2_ROOT tmp="$TORCH2_ROOT.tmp" url lock st
    TORCH2_SKIP_REASON=""
    if ! command -v unshare >/dev/null 2>&1; then
        TORCH2_SKIP_REASON="unshare missing"
        return 1
    fi
    if [ "$(id -u)" != 0 ]; then
        TORCH2_SKIP_REASON="needs root (chroot, mount namespaces)"
        return 1
    fi
    [ -d "$root" ] && _torch2_py_ok "$root" && return 0
    mkdir -p "$(dirname "$root")" || {
        TORCH2_SKIP_REASON="cannot create $(dirname "$root")"
        return 1
    }
    lock="$root.lock"
    # one builder at a time (prove -j); others wait for it
    exec {_torch2_lock_fd}>"$lock" || {
        TORCH2_SKIP_REASON="cannot open $lock"
        return 1
    }
    if ! flock -w 3600 "$_torch2_lock_fd"; then
        TORCH2_SKIP_REASON="timed out waiting for $lock"
        exec {_torch2_lock_fd}>&-
        return 1
    fi
    st=0
    _torch2_build "$root" "$tmp" || st=1
    exec {_torch2_lock_fd}>&-
    return $st
}

# _torch2_build ROOT TMP (called with the lock held)
_torch2_build() {
    local root=$1 tmp=$2 url log
    # somebody else may have finished it while we waited
    [ -d "$root" ] && _torch2_py_ok "$root" && return 0
    if [ -e "$root" ]; then
        TORCH2_SKIP_REASON="$root exists but has no working torch+safetensors (remove it to rebuild)"
        return 1
    fi
    if [ -d "$tmp" ] && _torch2_py_ok "$tmp"; then
        # a complete build that was never renamed: adopt it
        _torch2_mounts_under "$tmp" && {
            TORCH2_SKIP_REASON="$tmp has mounts below it"
            return 1
        }
        mv -T -- "$tmp" "$root" && return 0
        TORCH2_SKIP_REASON="cannot rename $tmp to $root"
        return 1
    fi
    if [ -n "${CKPTFS_TORCH2_NO_BUILD:-}" ]; then
        TORCH2_SKIP_REASON="no root at $root and CKPTFS_TORCH2_NO_BUILD is set"
        return 1
    fi
    url=$(_torch2_mirror_url)
    if [ -z "$url" ]; then
        TORCH2_SKIP_REASON="no URIs: line in $TORCH2_SOURCES"
        return 1
    fi
    if ! command -v debootstrap >/dev/null 2>&1; then
        if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null 2>&1 ||
                { apt-get update -q >/dev/null 2>&1 &&
                  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null 2>&1; }; }; then
            TORCH2_SKIP_REASON="debootstrap missing and apt-get install debootstrap failed"
            return 1
        fi
    fi
    if [ -e "$tmp" ]; then
        if _torch2_mounts_under "$tmp"; then
            TORCH2_SKIP_REASON="$tmp is incomplete and has mounts below it"
            return 1
        fi
        rm -rf --one-file-system -- "$tmp"
    fi
    log="$root.debootstrap.log"
    echo "# building torch 2.6 root in $tmp (debootstrap trixie, this takes a while; log: $log)" >&2
    # private mount namespace: debootstrap's /proc and /sys mounts vanish with it
    if ! unshare --mount --propagation private -- \
        debootstrap --variant=minbase --include=python3-torch,python3-safetensors,python3-numpy \
        trixie "$tmp" "$url" >"$log" 2>&1; then
        TORCH2_SKIP_REASON="debootstrap failed ($(tail -n 1 "$log" 2>/dev/null | tr -d '\n' | cut -c1-160))"
        return 1
    fi
    if ! _torch2_py_ok "$tmp"; then
        TORCH2_SKIP_REASON="debootstrap finished but 'import torch, safetensors' fails in $tmp"
        return 1
    fi
    mv -T -- "$tmp" "$root" || {
        TORCH2_SKIP_REASON="cannot rename $tmp to $root"
        return 1
    }
}

# torch2_run DIR -- python3 ARGS...
# Runs /usr/bin/python3 of the root with /proc mounted and DIR bind-mounted at
# the same absolute path, all inside a private mount namespace (nothing leaks).
torch2_run() {
    local dir root=$TORCH2_ROOT
    dir=$(realpath -- "$1") || return 125
    shift
    [ "${1:-}" = "--" ] && shift
    case "${1:-}" in
    python3 | /usr/bin/python3) shift ;;
    esac
    unshare --mount --propagation private -- /bin/sh -c '
        root=$1 dir=$2
        shift 2
        mount -t proc proc "$root/proc" || exit 125
        # a private /tmp, so the mount point for DIR need not be created on disk
        mount -t tmpfs -o mode=1777 tmpfs "$root/tmp" || exit 125
        mkdir -p "$root$dir" || exit 125
        mount --rbind "$dir" "$root$dir" || exit 125
        cd "$dir" || exit 125
        exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
            OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 \
            chroot "$root" /bin/sh -c "cd \"\$0\" && exec /usr/bin/python3 \"\$@\"" "$dir" "$@"
    ' sh "$root" "$dir" "$@"
}
