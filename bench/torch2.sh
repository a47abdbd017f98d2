#!/usr/bin/env bash
# torch2.sh ROOT DIRS ARGS...: python3 of the Debian 13 root ROOT (torch 2.6, as the tests build
# it) on ARGS, in a private mount namespace with the directories DIRS (colon-separated) bind-
# mounted at the same paths inside (as torch2_python in tests/lib/common.sh). Nothing it mounts
# outlives it, and every step execs the next, so a timer around it measures python itself.
set -u
root=$1 dirs=$2
shift 2
# shellcheck disable=SC2016 # expanded by the inner bash
exec unshare --mount --propagation private bash -c '
    root=$1 dirs=$2; shift 2
    mount -t proc proc "$root/proc" || exit 1
    IFS=: read -ra list <<< "$dirs"
    for d in "${list[@]}"; do mkdir -p "$root$d" && mount --rbind "$d" "$root$d" || exit 1; done
    exec chroot "$root" /usr/bin/python3 "$@"' _ "$root" "$dirs" "$@"
