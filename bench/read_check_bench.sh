#!/usr/bin/env bash
# ckptfs per-read source check benchmark: two binaries side by side in one run, to show what
# a change to the source read path costs (e.g. the descriptor cache + fstat after every
# pread/preadv). For RUNS rounds, each binary twice per measurement and round, in the order
# base new new base / new base base new (alternating which binary goes first):
#  (a) first read of every file of MNT/hf/ on a fresh mount
#  (b) first read of every file of MNT/tp4pp1/ on a fresh mount
#  (c) without FUSE: `ckptfs cat SRC tp4pp1/release/mp_rank_0X/model_optim_rng.pt` of the 4
#      rank files (the read engine alone), CAT_REPEAT times in a row
# then syscall counts (strace -c -f) of one tp4pp1/ read through the daemon and of (c), per
# binary. The source is in the page cache for every timed read. See bench/README.md.
#
#   CKPTFS_BASE=/path/old/ckptfs CKPTFS_BIN=/path/new/ckptfs bench/read_check_bench.sh
#
# Environment:
#   CKPTFS_BASE   the baseline binary (required)
#   CKPTFS_BIN    the binary to compare with it (default: <repo>/build/ckptfs)
#   BENCH_DIR     work dir, keeps the generated checkpoint between runs (default /tmp/ckptfs-bench)
#   PYTHON        python with numpy for gen_checkpoint.py (default /usr/bin/python3)
#   RUNS          rounds (default 5; medians are shown)
#   CAT_REPEAT    timings of (c) per binary and place in a round (default 5; it takes ~0.15 s)
#   STRACE        1 (default) to count syscalls with strace -c -f, 0 to skip
#   READ_TIMEOUT  seconds allowed per file read / ckptfs cat (default 300)
#   MOUNT_TIMEOUT seconds allowed for a mount to come up (default 60)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
BASE=${CKPTFS_BASE:-}
NEW=${CKPTFS_BIN:-$REPO/build/ckptfs}
BENCH_DIR=${BENCH_DIR:-/tmp/ckptfs-bench}
PYTHON=${PYTHON:-/usr/bin/python3}
RUNS=${RUNS:-5}
CAT_REPEAT=${CAT_REPEAT:-5}
STRACE=${STRACE:-1}
READ_TIMEOUT=${READ_TIMEOUT:-300}
MOUNT_TIMEOUT=${MOUNT_TIMEOUT:-60}

SRC=$BENCH_DIR/llama-1g
RANKS=(release/mp_rank_00/model_optim_rng.pt release/mp_rank_01/model_optim_rng.pt
       release/mp_rank_02/model_optim_rng.pt release/mp_rank_03/model_optim_rng.pt)

BENCH_NAME=read_check_bench
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"

[[ -n $BASE ]] || die "set CKPTFS_BASE to the baseline binary (and CKPTFS_BIN to the new one)"
[[ -x $BASE ]] || die "no ckptfs binary at CKPTFS_BASE=$BASE"
[[ -x $NEW ]] || die "no ckptfs binary at CKPTFS_BIN=$NEW (build it or set CKPTFS_BIN)"
BASE=$(readlink -f "$BASE")
NEW=$(readlink -f "$NEW")
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "RUNS must be a positive integer"
[[ $CAT_REPEAT =~ ^[1-9][0-9]*$ ]] || die "CAT_REPEAT must be a positive integer"
command -v fusermount3 >/dev/null || die "fusermount3 not found"
[[ -e /dev/fuse ]] || die "/dev/fuse missing"
if [[ $STRACE == 1 ]] && ! command -v strace >/dev/null; then
    note "strace not found: no syscall counts"
    STRACE=0
fi

declare -A BINS=([base]=$BASE [new]=$NEW)

# --- cleanup -------------------------------------------------------------------------------------

mkdir -p "$BENCH_DIR"
STRACE_PID=""
bench_start "$BENCH_DIR/rcheck.XXXXXX"

# --- helpers -------------------------------------------------------------------------------------



# do_mount BIN: a fresh mount of $SRC on $MNT; sets DAEMON_PID.
do_mount() {
    local bin=$1
    unmount
    timeout "$MOUNT_TIMEOUT" "$bin" mount "$SRC" "$MNT" || {
        DAEMON_PID=$(find_daemon "$bin" || true)
        die "$bin mount $SRC $MNT failed or hung"
    }
    is_mounted "$MNT" || die "ckptfs mount returned but $MNT is not mounted"
    DAEMON_PID=$(find_daemon "$bin") || die "cannot find the ckptfs daemon for $MNT"
}

# Regular files under DIR, sorted (relative paths).
files_of() { (cd "$1" && find . -type f | sed 's|^\./||' | sort); }
sum_sizes() { local s=0 f; for f in "$@"; do s=$((s + $(stat -L -c %s "$f"))); done; echo "$s"; }

# read_all FILE...: dd bs=1M of every file to /dev/null; prints the elapsed microseconds.
read_all() {
    local t0 t1 f
    t0=$(now_us)
    for f in "$@"; do
        timeout "$READ_TIMEOUT" dd if="$f" of=/dev/null bs=1M status=none ||
            die "reading $f failed or took over ${READ_TIMEOUT}s (hung daemon?)"
    done
    t1=$(now_us)
    echo $((t1 - t0))
}

# cat_ranks BIN: `BIN cat SRC tp4pp1/RANK > /dev/null` for the 4 rank files; prints the elapsed
# microseconds and the CPU seconds (user + sys) of the 4 processes.
cat_ranks() {
    local bin=$1 t0 t1 i TIMEFORMAT='%U %S'
    t0=$(now_us)
    for i in "${!RANKS[@]}"; do
        { time timeout "$READ_TIMEOUT" "$bin" cat "$SRC" "tp4pp1/${RANKS[i]}" >/dev/null 2>"$RUN_DIR/cat.err"; } \
            2>"$RUN_DIR/cat.time.$i" || die "$bin cat $SRC tp4pp1/${RANKS[i]} failed or took over ${READ_TIMEOUT}s"
    done
    t1=$(now_us)
    echo "$((t1 - t0)) $(cat "$RUN_DIR"/cat.time.* | awk '{s += $1 + $2} END {printf "%.3f", s}')"
}

# CPU seconds (user + system) PID has used so far.
cpu_s() {
    awk -v hz="$(getconf CLK_TCK)" '{sub(/^.*\) /, ""); print ($12 + $13) / hz}' "/proc/$1/stat"
}

warm_source() { cat "$SRC"/*.safetensors >/dev/null; }

two() { awk -v x="$1" 'BEGIN {printf "%.2f", x}'; }
gbps() { awk -v b="$1" -v us="$2" 'BEGIN {printf "%.2f", b / (us / 1e6) / 1e9}'; }
secs() { awk -v us="$1" 'BEGIN {printf "%.3f", us / 1e6}'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
fmt_list() { local out="" x; for x in "$@"; do out+="${out:+ }$x"; done; echo "$out"; }

OTHERS_START=$(others)
LOAD_START=$(cut -d' ' -f1 /proc/loadavg)

# --- input ---------------------------------------------------------------------------------------

if [[ ! -f $SRC/model.safetensors.index.json ]]; then
    note "generating $SRC (~1 GiB, random bf16)"
    "$PYTHON" "$HERE/gen_checkpoint.py" "$SRC" >&2
fi
warm_source

# Both binaries must serve the same view; sizes from one fresh mount each; content checked once
# (untimed): hf/ against the source, tp4pp1/ rank 0 base against new.
do_mount "$BASE"
mapfile -t HF_REL < <(files_of "$MNT/hf")
mapfile -t TP_REL < <(files_of "$MNT/tp4pp1")
((${#HF_REL[@]} > 0 && ${#TP_REL[@]} > 0)) || die "empty hf/ or tp4pp1/ view"
HF_BYTES=$(cd "$MNT/hf" && sum_sizes "${HF_REL[@]}")
TP_BYTES=$(cd "$MNT/tp4pp1" && sum_sizes "${TP_REL[@]}")
timeout "$READ_TIMEOUT" cat "$MNT/tp4pp1/${RANKS[0]}" >"$RUN_DIR/rank0.base" || die "reading ${RANKS[0]} (base) failed"
unmount
do_mount "$NEW"
[[ $(files_of "$MNT/hf") == "$(printf '%s\n' "${HF_REL[@]}")" ]] || die "hf/ lists other files with the new binary"
[[ $(files_of "$MNT/tp4pp1") == "$(printf '%s\n' "${TP_REL[@]}")" ]] || die "tp4pp1/ lists other files with the new binary"
for f in "$SRC"/*.safetensors; do
    timeout "$READ_TIMEOUT" cmp -s "$f" "$MNT/hf/$(basename "$f")" || die "MNT/hf/$(basename "$f") differs from the source"
done
timeout "$READ_TIMEOUT" cmp -s "$RUN_DIR/rank0.base" "$MNT/tp4pp1/${RANKS[0]}" || die "tp4pp1 rank 0 differs between base and new"
rm -f "$RUN_DIR/rank0.base"
unmount
CAT_BYTES=$("$NEW" ls "$SRC" tp4pp1 | awk '/model_optim_rng.pt$/ {s += $1} END {print s + 0}')
((CAT_BYTES > 0)) || die "cannot size the tp4pp1 rank files"

# --- timed rounds --------------------------------------------------------------------------------

declare -A T CPU # T[label.measure] / CPU[label.measure]: space-separated per-run values
for label in base new; do for m in hf tp cat; do T[$label.$m]=""; CPU[$label.$m]=""; done; done

# fuse_read BIN VIEW: a fresh mount, a first read of every file of VIEW, unmount; prints the
# elapsed microseconds and the daemon's CPU seconds during the read.
fuse_read() {
    local bin=$1 view=$2 c0 c1 us
    local -n _files=$3
    do_mount "$bin"
    c0=$(cpu_s "$DAEMON_PID")
    us=$(cd "$MNT/$view" && read_all "${_files[@]}")
    c1=$(cpu_s "$DAEMON_PID")
    unmount
    echo "$us $(awk -v a="$c0" -v b="$c1" 'BEGIN {printf "%.2f", b - a}')"
}

# Each round measures each binary twice per measurement, in the order base new new base (new
# base base new in the next round), so that neither is favoured by its place in the sequence.
# Before the timed FUSE reads of a measurement, one untimed mount + read: on this VM the first
# fresh mount after a pause is often much slower (freed memory is handed back to the host and
# faulted in again).
declare -A POS # POS[measure.place]: times at that place in the round, both binaries
note "$RUNS rounds of hf/ + tp4pp1/ first reads and ckptfs cat, base and new interleaved"
for ((r = 0; r < RUNS; r++)); do
    if ((r % 2 == 0)); then order=(base new new base); else order=(new base base new); fi
    for m in hf tp cat; do
        case $m in
        hf) view=hf files=HF_REL ;;
        tp) view=tp4pp1 files=TP_REL ;;
        cat) view="" ;;
        esac
        if [[ -n $view ]]; then
            warm_source
            fuse_read "${BINS[${order[0]}]}" "$view" "$files" >/dev/null # untimed
        fi
        place=0
        for label in "${order[@]}"; do
            bin=${BINS[$label]}
            place=$((place + 1))
            warm_source # keep the source hot
            if [[ $m == cat ]]; then
                for ((k = 0; k < CAT_REPEAT; k++)); do
                    us="" cpu=""
                    read -r us cpu < <(cat_ranks "$bin")
                    [[ -n $us && -n $cpu ]] || die "ckptfs cat of the rank files failed"
                    T[$label.$m]+=" $us"
                    CPU[$label.$m]+=" $cpu"
                    POS[$m.$place]+=" $us"
                done
                continue
            fi
            us="" cpu=""
            read -r us cpu < <(fuse_read "$bin" "$view" "$files")
            [[ -n $us && -n $cpu ]] || die "the first read of $view/ failed"
            T[$label.$m]+=" $us"
            CPU[$label.$m]+=" $cpu"
            POS[$m.$place]+=" $us"
        done
    done
    note "round $((r + 1))/$RUNS done (first: ${order[0]})"
done

# --- syscall counts ------------------------------------------------------------------------------

# strace_counts FILE: "name calls" lines of a strace -c summary, plus "total N".
strace_counts() {
    awk '/^-/ {next} $1 ~ /^[0-9.]+$/ && NF >= 5 {print $NF, $4}' "$1"
}

if [[ $STRACE == 1 ]]; then
    note "strace -c -f: one tp4pp1/ read through the daemon, and ckptfs cat of the 4 rank files"
    for label in base new; do
        bin=${BINS[$label]}
        warm_source
        unmount
        strace -f -c -o "$RUN_DIR/strace.daemon.$label" -- "$bin" mount -f "$SRC" "$MNT" \
            >"$RUN_DIR/strace.daemon.$label.out" 2>&1 &
        STRACE_PID=$!
        for ((i = 0; i < MOUNT_TIMEOUT * 100; i++)); do
            is_mounted "$MNT" && break
            alive "$STRACE_PID" || break
            sleep 0.01
        done
        is_mounted "$MNT" || die "strace'd mount of $bin did not come up"
        DAEMON_PID=$(find_daemon "$bin") || die "cannot find the strace'd daemon for $MNT"
        (cd "$MNT/tp4pp1" && read_all "${TP_REL[@]}") >/dev/null
        unmount # fusermount3 -u; the foreground daemon exits, strace writes its summary
        strace_counts "$RUN_DIR/strace.daemon.$label" >"$RUN_DIR/counts.daemon.$label"

        : >"$RUN_DIR/counts.cat.$label.raw"
        for rk in "${RANKS[@]}"; do
            timeout "$READ_TIMEOUT" strace -f -c -o "$RUN_DIR/strace.cat" -- "$bin" cat "$SRC" "tp4pp1/$rk" >/dev/null ||
                die "strace $bin cat tp4pp1/$rk failed"
            strace_counts "$RUN_DIR/strace.cat" >>"$RUN_DIR/counts.cat.$label.raw"
        done
        awk '{s[$1] += $2} END {for (k in s) print k, s[k]}' "$RUN_DIR/counts.cat.$label.raw" \
            >"$RUN_DIR/counts.cat.$label"
    done
fi

# --- report --------------------------------------------------------------------------------------

BUILD_TYPE() {
    local cache t="?"
    cache=$(dirname "$1")/CMakeCache.txt
    [[ -f $cache ]] && t=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$cache")
    echo "${t:-(empty)}"
}

echo
echo "ckptfs per-read source check benchmark   $(date '+%Y-%m-%d %H:%M')   $(uname -r), $(nproc) CPUs"
echo "base: $BASE   (CMAKE_BUILD_TYPE: $(BUILD_TYPE "$BASE"))"
echo "new:  $NEW   (CMAKE_BUILD_TYPE: $(BUILD_TYPE "$NEW"))"
OTHERS_END=$(others)
warn_others "$OTHERS_START" "$OTHERS_END"
echo "load average: $LOAD_START at start, $(cut -d' ' -f1 /proc/loadavg) at end"
echo
echo "Source $SRC in the page cache (read before every run). $RUNS rounds, each measuring both"
echo "binaries twice: base new new base, then new base base new, ... ($((2 * RUNS)) runs each)."
echo "GB/s = 1e9 bytes/s. median: of the runs; ratio: new/base of the medians; paired: base time /"
echo "new time within each round, the median of the rounds base starts and that of the rounds new"
echo "starts, geometric mean of the two; best: fastest run, and its ratio."
echo "(a), (b): dd bs=1M of every file of the view, each on a fresh mount, after one untimed one."
echo "  (a) hf/: ${#HF_REL[@]} files, $HF_BYTES bytes   (b) tp4pp1/: ${#TP_REL[@]} files, $TP_BYTES bytes"
echo "  (c) ckptfs cat of the 4 tp4pp1 rank files, no FUSE: $CAT_BYTES bytes; $CAT_REPEAT timings in"
echo "      a row in each place, so $((2 * RUNS * CAT_REPEAT)) runs each"
echo
printf '%-26s  %-29s  %s\n' "" "median GB/s" "best GB/s"
printf '%-26s %7s %6s %6s %7s %7s %6s %6s\n' "" "base" "new" "ratio" "paired" "base" "new" "ratio"
report() { # NAME MEASURE BYTES RUNS_PER_BINARY_AND_ROUND
    local name=$1 m=$2 bytes=$3 per=$4 b n bb bn ratio paired bratio i j t sb sn
    local -a tb tn gb gn pr rb rn
    read -ra tb <<<"${T[base.$m]}"
    read -ra tn <<<"${T[new.$m]}"
    gb=() gn=() rb=() rn=() pr=()
    for t in "${tb[@]}"; do gb+=("$(gbps "$bytes" "$t")") rb+=("$(secs "$t")"); done
    for t in "${tn[@]}"; do gn+=("$(gbps "$bytes" "$t")") rn+=("$(secs "$t")"); done
    b=$(two "$(median "${gb[@]}")")
    n=$(two "$(median "${gn[@]}")")
    bb=$(printf '%s\n' "${gb[@]}" | sort -g | tail -n 1)
    bn=$(printf '%s\n' "${gn[@]}" | sort -g | tail -n 1)
    for ((i = 0; i + per <= ${#tb[@]}; i += per)); do
        sb=0 sn=0
        for ((j = i; j < i + per; j++)); do sb=$((sb + tb[j])) sn=$((sn + tn[j])); done
        pr+=("$(div "$sb" "$sn")")
    done
    ratio=$(awk -v a="$n" -v b="$b" 'BEGIN {printf "%.2f", a / b}')
    # Rounds that start with base and rounds that start with new, each as a median, combined
    # with a geometric mean: what one binary gains from its places cancels out.
    local -a pe=() po=()
    for ((i = 0; i < ${#pr[@]}; i++)); do
        if ((i % 2 == 0)); then pe+=("${pr[i]}"); else po+=("${pr[i]}"); fi
    done
    if ((${#po[@]} > 0)); then
        paired=$(awk -v e="$(median "${pe[@]}")" -v o="$(median "${po[@]}")" 'BEGIN {printf "%.2f", sqrt(e * o)}')
    else
        paired=$(two "${pe[0]}")
    fi
    bratio=$(awk -v a="$bn" -v b="$bb" 'BEGIN {printf "%.2f", a / b}')
    printf '%-26s %7s %6s %6s %7s %7s %6s %6s\n' "$name" "$b" "$n" "$ratio" "$paired" "$bb" "$bn" "$bratio"
    RUNLINES+=("$name, seconds per run, base: $(fmt_list "${rb[@]}")")
    RUNLINES+=("$name, seconds per run, new:  $(fmt_list "${rn[@]}")")
    RUNLINES+=("$name, per-round base/new time ratios: $(fmt_list "${pr[@]}")")
    local -a pm=()
    for ((i = 1; i <= 4; i++)); do
        read -ra g <<<"${POS[$m.$i]}"
        pm+=("$(secs "$(median "${g[@]}")")")
    done
    RUNLINES+=("$name, median seconds by place in the round (1-4, either binary): $(fmt_list "${pm[@]}")")
    SUMMARY+=("$name: base $b GB/s, new $n GB/s, ratio $ratio (paired $paired; best $bb vs $bn GB/s, ratio $bratio)")
}
SUMMARY=()
RUNLINES=()
report "(a) hf/ first read" hf "$HF_BYTES" 2
report "(b) tp4pp1/ first read" tp "$TP_BYTES" 2
report "(c) ckptfs cat tp4pp1 x4" cat "$CAT_BYTES" $((2 * CAT_REPEAT))
echo
printf '%s\n' "${RUNLINES[@]}"
echo
echo "CPU seconds (user + sys), median [single runs]: (a), (b) the daemon's during the read (from"
echo "/proc/PID/stat, 1/$(getconf CLK_TCK) s ticks); (c) the 4 ckptfs cat processes (bash's time)."
for m in hf tp cat; do
    read -ra cpub <<<"${CPU[base.$m]}"
    read -ra cpun <<<"${CPU[new.$m]}"
    mb=$(median "${cpub[@]}")
    mn=$(median "${cpun[@]}")
    printf '  %-4s base %s  new %s  ratio new/base %s\n' "$m" "$mb" "$mn" \
        "$(awk -v a="$mn" -v b="$mb" 'BEGIN {printf "%.2f", (b > 0) ? a / b : 0}')"
    printf '       base [%s]\n       new  [%s]\n' "$(fmt_list "${cpub[@]}")" "$(fmt_list "${cpun[@]}")"
done
echo
printf '%s\n' "${SUMMARY[@]}"

if [[ $STRACE == 1 ]]; then
    echo
    echo "Syscalls (strace -c -f, one run each; strace slows everything, only the counts matter):"
    for what in daemon cat; do
        if [[ $what == daemon ]]; then
            bytes=$TP_BYTES
            echo "  daemon: mount -f, one read of tp4pp1/ ($TP_BYTES bytes), unmount; calls, and per GB"
        else
            bytes=$CAT_BYTES
            echo "  ckptfs cat of the 4 tp4pp1 rank files ($CAT_BYTES bytes); calls, and per GB"
        fi
        fb=$RUN_DIR/counts.$what.base
        fn=$RUN_DIR/counts.$what.new
        printf '    %-16s %10s %10s %10s %10s\n' syscall base new "base/GB" "new/GB"
        # The syscalls with the most calls in either run, total last.
        names=$(cat "$fb" "$fn" | awk '$1 != "total" {if ($2 > m[$1]) m[$1] = $2} END {for (k in m) print m[k], k}' |
            sort -rn | head -n 8 | awk '{print $2}')
        for s in $names total; do
            cb=$(awk -v s="$s" '$1 == s {print $2}' "$fb"); cb=${cb:-0}
            cn=$(awk -v s="$s" '$1 == s {print $2}' "$fn"); cn=${cn:-0}
            printf '    %-16s %10s %10s %10.0f %10.0f\n' "$s" "$cb" "$cn" \
                "$(awk -v c="$cb" -v b="$bytes" 'BEGIN {print c / (b / 1e9)}')" \
                "$(awk -v c="$cn" -v b="$bytes" 'BEGIN {print c / (b / 1e9)}')"
        done
    done
fi
