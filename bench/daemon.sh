# The benchmarks' shell library: messages, medians and timing, whether a path is mounted, whether
# a process still runs, and stopping the daemon a benchmark started (only that one, by PID).
# The caller sets BENCH_NAME (the prefix of its messages) before using die/note, and MNT, BIN and
# DAEMON_PID (and STRACE_PID when a strace wraps the daemon) for the mount helpers.
# BENCH_NOTE_TIME=1 puts the time of day in notes; BENCH_LOG, when set, also gets every message.

bench_say() {
    if [[ -n ${BENCH_LOG:-} ]]; then
        echo "$BENCH_NAME: $*" | tee -a "$BENCH_LOG" >&2
    else
        echo "$BENCH_NAME: $*" >&2
    fi
}
die() { bench_say "$@"; exit 1; }
note() {
    if [[ -n ${BENCH_NOTE_TIME:-} ]]; then bench_say "$(date +%T) $*"; else bench_say "$@"; fi
}

# median [--low] [--even-format FMT] VALUES... (or - : one value a line on stdin): the middle
# value; of an even count the mean of the two middle ones (printed with FMT when given), or with
# --low the lower of them.
median() {
    local low=0 fmt=""
    while [[ ${1:-} == --* ]]; do
        case $1 in
        --low) low=1; shift ;;
        --even-format) fmt=$2; shift 2 ;;
        *) break ;;
        esac
    done
    { if [[ ${1:-} == - ]]; then cat; else printf '%s\n' "$@"; fi; } | sort -g |
        awk -v low="$low" -v f="$fmt" '{v[NR] = $1}
            END {
                if (NR % 2 || low) print v[int((NR + 1) / 2)]
                else if (f != "") printf f "\n", (v[NR / 2] + v[NR / 2 + 1]) / 2
                else print (v[NR / 2] + v[NR / 2 + 1]) / 2
            }'
}

now_us() { local t=${EPOCHREALTIME/./}; echo "$((10#$t))"; }

# Bytes of the files under PATHs (printf: mawk's print turns sums past 2^31 into 1.2e+11).
bytes_of() { find "$@" -type f -printf '%s\n' | awk '{s+=$1} END {printf "%.0f\n", s}'; }
# Reads every file under PATHs once (into the page cache, or through a mount).
read_all() { find "$@" -type f -print0 | xargs -0 cat >/dev/null; }

# The daemon of binary BIN (default $BIN) serving $MNT: its last argument is the mount point.
find_daemon() {
    local bin=${1:-$BIN} pid last
    for pid in $(pgrep -f -- "$MNT" || true); do
        [[ $(readlink -f "/proc/$pid/exe" 2>/dev/null) == "$bin" ]] || continue
        last=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | tail -n 1)
        [[ $last == "$MNT" ]] && { echo "$pid"; return 0; }
    done
    return 1
}

status_kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; } # PID FIELD

is_mounted() { awk -v m="$1" '$2 == m {f = 1} END {exit !f}' /proc/self/mounts; }

# True while PID runs (a zombie counts as gone: the detached daemon's parent is init, which may
# reap it late).
alive() {
    local state
    state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $state && $state != Z ]]
}

wait_gone() { # PID SECONDS
    local i
    for ((i = 0; i < $2 * 100; i++)); do
        alive "$1" || return 0
        sleep 0.01
    done
    return 1
}

# Stops PID, politely first: a daemon holding GBs takes seconds to exit on a loaded machine.
stop_pid() {
    [[ -n $1 ]] || return 0
    wait_gone "$1" 30 && return 0
    note "process $1 still running 30 s after unmount; killing it"
    kill "$1" 2>/dev/null || true
    wait_gone "$1" 5 || kill -9 "$1" 2>/dev/null || true
    wait_gone "$1" 5 || true
}

# Unmounts $MNT and waits for its daemon (and a strace around it) to exit, so runs never overlap.
unmount() {
    if is_mounted "$MNT"; then
        fusermount3 -u "$MNT" 2>/dev/null || true
    fi
    stop_pid "${DAEMON_PID:-}"
    stop_pid "${STRACE_PID:-}"
    if is_mounted "$MNT"; then
        fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -uz "$MNT" 2>/dev/null || true
    fi
    DAEMON_PID=""
    STRACE_PID=""
}

# bench_start TEMPLATE: this run's directory RUN_DIR (mktemp -d TEMPLATE) and the mount point MNT
# in it. On exit or a signal: the bench's bench_stop (if it defines one), then $MNT unmounted
# (waiting for the daemon) and RUN_DIR removed.
bench_start() {
    RUN_DIR=$(mktemp -d "$1")
    MNT=$RUN_DIR/mnt
    mkdir "$MNT"
    DAEMON_PID=""
    trap bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM HUP
}
bench_cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    if declare -F bench_stop >/dev/null; then bench_stop; fi
    unmount
    rm -rf --one-file-system "$RUN_DIR"
    exit "$rc"
}

# The report's header: other ckptfs mounts than the bench's own ($MNT) while it ran, the build
# type of BIN (from its build directory's cache) and the state of REPO's tree.
others() { awk -v mnt="$MNT" '$3 == "fuse.ckptfs" && $2 != mnt {n++} END {print n + 0}' /proc/mounts; }
warn_others() { # START END: the others() counts at the start and end
    if (($1 + $2 > 0)); then
        echo "WARNING: other ckptfs mounts were active (start: $1, end: $2); timings may be disturbed"
    fi
}
build_type() { # BIN
    local cache type="?"
    cache=$(dirname "$1")/CMakeCache.txt
    [[ -f $cache ]] && type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$cache")
    echo "${type:-(empty: RelWithDebInfo default)}"
}
tree_state() { # REPO: its commit, and whether tracked files differ from it
    local state
    state=$(git -C "$1" log -1 --format=%h 2>/dev/null || echo "?")
    [[ -n $(git -C "$1" status --porcelain --untracked-files=no 2>/dev/null) ]] && state+=" + uncommitted changes"
    echo "$state"
}

# More figures: the largest value, and microseconds, KiB and lists of microseconds as text.
max() { printf '%s\n' "$@" | sort -g | tail -n 1; }
secs() { awk -v us="$1" 'BEGIN {printf "%.3f", us / 1e6}'; }
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
list_s() { local out="" x; for x in "$@"; do out+="${out:+ }$(awk -v us="$x" 'BEGIN {printf "%.2f", us / 1e6}')"; done; echo "$out"; }
maxrss_kib() { awk -F': ' '/Maximum resident set size/ {print $2}' "$1"; } # /usr/bin/time -v output
