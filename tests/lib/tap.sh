# Tiny TAP helpers for the ckptfs integration tests. Source it from bash:
#   . "$(dirname "$0")/../lib/tap.sh"
#   tap_require_fuse            # "1..0 # skip" when /dev/fuse is missing
#   tap_workdir                 # sets $WORK (mktemp -d under /tmp, removed at exit)
#   ckptfs_mount [-o OPTS] SRC MNT   # mounts; unmounted at exit
#   tap_ok / tap_not_ok / tap_check / tap_is / tap_skip / tap_diag ...
#   tap_done                    # prints the plan (1..N) and sets the exit status
# The binary is $CKPTFS_BIN (default: <repo>/build/ckptfs).

set -u

TESTS_LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$TESTS_LIB/../.." && pwd)
CKPTFS_BIN=${CKPTFS_BIN:-$REPO_ROOT/build/ckptfs}
# numpy/torch 1.13 live in Debian's interpreter; the python3 on PATH may be another one.
PY=/usr/bin/python3
GEN=("$PY" "$TESTS_LIB/ckpt_gen.py")
STCHECK=("$PY" "$TESTS_LIB/st_check.py")
: "${CKPTFS_TIMEOUT:=60}"

_TAP_N=0
_TAP_FAILED=0
_TAP_PLANNED=""
_CKPTFS_MOUNTS=()
_TAP_TMPDIRS=()
_TAP_PIDS=()
WORK=""

tap_plan() { _TAP_PLANNED=$1; echo "1..$1"; }

tap_diag() {
    local line
    for line in "$@"; do
        printf '%s\n' "$line" | sed 's/^/# /'
    done
}

# tap_diag_file FILE [MAXLINES]: print (the tail of) a file as diagnostics.
tap_diag_file() {
    [ -s "$1" ] || return 0
    tail -n "${2:-25}" "$1" | sed 's/^/#   /'
}

tap_ok() {
    _TAP_N=$((_TAP_N + 1))
    echo "ok $_TAP_N - $*"
}

tap_not_ok() {
    _TAP_N=$((_TAP_N + 1))
    _TAP_FAILED=$((_TAP_FAILED + 1))
    echo "not ok $_TAP_N - $1"
    shift
    [ $# -gt 0 ] && tap_diag "$@"
    return 0
}

# tap_result STATUS DESC [DIAG...]: ok when STATUS is 0.
tap_result() {
    local st=$1
    shift
    if [ "$st" -eq 0 ]; then tap_ok "$1"; else tap_not_ok "$@"; fi
}

# tap_check DESC CMD...: run CMD, ok when it exits 0; on failure show its output.
tap_check() {
    local desc=$1 out st
    shift
    out=$(mktemp /tmp/ckptfs-hf-out.XXXXXX)
    "$@" >"$out" 2>&1
    st=$?
    if [ $st -eq 0 ]; then
        tap_ok "$desc"
    else
        tap_not_ok "$desc" "command failed (exit $st): $*"
        tap_diag_file "$out" 30
    fi
    rm -f "$out"
    return $st
}

# tap_is GOT WANT DESC
tap_is() {
    if [ "$1" == "$2" ]; then
        tap_ok "$3"
    else
        tap_not_ok "$3" "got:  '$1'" "want: '$2'"
    fi
}

# tap_like GOT REGEX DESC (grep -E)
tap_like() {
    if printf '%s' "$1" | grep -Eq -- "$2"; then
        tap_ok "$3"
    else
        tap_not_ok "$3" "got: '$1'" "does not match: $2"
    fi
}

tap_skip() {
    _TAP_N=$((_TAP_N + 1))
    echo "ok $_TAP_N # skip $*"
}

tap_bail() { echo "Bail out! $*"; exit 255; }

tap_done() {
    if [ -z "$_TAP_PLANNED" ]; then
        echo "1..$_TAP_N"
    elif [ "$_TAP_PLANNED" != "$_TAP_N" ]; then
        tap_diag "planned $_TAP_PLANNED tests but ran $_TAP_N"
    fi
    [ "$_TAP_FAILED" -gt 0 ] && tap_diag "$_TAP_FAILED of $_TAP_N tests failed"
    [ "$_TAP_FAILED" -eq 0 ] && exit 0
    exit 1
}

tap_require_fuse() {
    if [ ! -c /dev/fuse ]; then
        echo "1..0 # skip /dev/fuse missing"
        exit 0
    fi
    if ! command -v fusermount3 >/dev/null 2>&1; then
        echo "1..0 # skip fusermount3 missing"
        exit 0
    fi
    tap_require_bin
}

tap_require_bin() {
    [ -x "$CKPTFS_BIN" ] || tap_bail "ckptfs binary not found at $CKPTFS_BIN (build it, or set CKPTFS_BIN)"
    [ -x "$PY" ] || tap_bail "$PY missing"
    "$PY" -c 'import numpy' 2>/dev/null || tap_bail "$PY has no numpy"
}

# tap_workdir: create $WORK (removed at exit, after every mount is gone).
tap_workdir() {
    WORK=$(mktemp -d /tmp/ckptfs-hf.XXXXXX) || tap_bail "mktemp failed"
    _TAP_TMPDIRS+=("$WORK")
}

# Register a background pid to kill at exit.
tap_track_pid() { _TAP_PIDS+=("$1"); }

# ck ARGS...: run the ckptfs binary with a timeout so a hang cannot stall the suite.
ck() { timeout -k 5 "$CKPTFS_TIMEOUT" "$CKPTFS_BIN" "$@"; }

# is_mounted PATH: PATH is a mount point in /proc/mounts.
is_mounted() {
    local p
    p=$(realpath -m -- "$1")
    awk -v m="$p" '$2 == m { found = 1 } END { exit !found }' /proc/mounts
}

# ckptfs_mount [ARGS...] SRC MNT: mount; registered for unmount at exit.
# Returns ckptfs's exit status (1 if it said 0 but nothing is mounted).
ckptfs_mount() {
    local mnt="${!#}" st
    ck mount "$@"
    st=$?
    if [ $st -eq 0 ]; then
        _CKPTFS_MOUNTS+=("$mnt")
        if ! is_mounted "$mnt"; then
            echo "ckptfs_mount: 'ckptfs mount' exited 0 but $mnt is not in /proc/mounts" >&2
            return 1
        fi
    elif is_mounted "$mnt"; then
        # failed but mounted anyway: still clean it up at exit
        _CKPTFS_MOUNTS+=("$mnt")
    fi
    return $st
}

# ckptfs_umount MNT: unmount now (lazy fallback); 0 when it is gone.
ckptfs_umount() {
    local mnt=$1 i
    is_mounted "$mnt" || return 0
    for i in 1 2 3 4 5; do
        fusermount3 -u "$mnt" 2>/dev/null && break
        sleep 0.2
    done
    if is_mounted "$mnt"; then
        fusermount3 -uz "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null
    fi
    ! is_mounted "$mnt"
}

# Pids of ckptfs daemons whose command line mentions PATH (processes this test started).
_ckptfs_pids_for() {
    local d pid exe
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        exe=$(readlink "$d/exe" 2>/dev/null) || continue
        [ "$exe" = "$(readlink -f "$CKPTFS_BIN")" ] || continue
        tr '\0' ' ' <"$d/cmdline" 2>/dev/null | grep -qF -- "$1" && echo "$pid"
    done
}

_tap_cleanup() {
    local st=$? m d pid i
    trap - EXIT INT TERM
    for pid in "${_TAP_PIDS[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${_TAP_PIDS[@]}"; do
        wait "$pid" 2>/dev/null
    done
    for m in "${_CKPTFS_MOUNTS[@]}"; do
        ckptfs_umount "$m" || echo "# cleanup: could not unmount $m" >&2
    done
    for d in "${_TAP_TMPDIRS[@]}"; do
        [ -d "$d" ] || continue
        # daemons of this test exit after the unmount; end stragglers by pid
        for i in 1 2 3 4 5 6 7 8 9 10; do
            [ -z "$(_ckptfs_pids_for "$d")" ] && break
            sleep 0.2
        done
        for pid in $(_ckptfs_pids_for "$d"); do
            echo "# cleanup: ckptfs pid $pid still running after unmount; killing it" >&2
            kill "$pid" 2>/dev/null
        done
        if awk -v p="$d/" 'index($2, p) == 1 { found = 1 } END { exit !found }' /proc/mounts; then
            echo "# cleanup: something is still mounted under $d; not removing it" >&2
            continue
        fi
        rm -rf --one-file-system -- "$d"
    done
    exit $st
}
trap _tap_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# stderr_lines FILE: number of lines (a last line without newline counts).
stderr_lines() { awk 'END { print NR }' "$1"; }

# files_in DIR: sorted names of the top-level regular files.
files_in() { find -L "$1" -mindepth 1 -maxdepth 1 -type f -printf '%f\n' | LC_ALL=C sort; }
