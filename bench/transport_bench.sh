#!/usr/bin/env bash
# One stream through the views, transport by transport: N readers (pread, 1 MiB by default) of
# the cached source files directly, and of hf/, tp4pp1/ rank files and mcore/ .distcp files
# through three transports of the same commit, side by side in one run: the default build's
# /dev/fuse (libfuse 3.14 on Debian 12), and a libfuse 3.18 build with -o io_uring=off and on.
# Each cell on a fresh mount, rounds alternating in order, best of ROUNDS; throughput, its ratio
# to direct reads, and the daemon's CPU seconds per GB (utime + stime of /proc/PID/stat, its
# io_uring queue threads included). Needs root (enable_uring is set to Y for the run and put back).
#
#   bench/transport_bench.sh
#
# Environment:
#   CKPTFS_BIN        the /dev/fuse build (default <repo>/build/ckptfs)
#   CKPTFS_URING_BIN  the libfuse 3.18 build (default <repo>/build-fuse318/ckptfs, built with
#                     scripts/libfuse318.sh --ckptfs build-fuse318 when missing)
#   BENCH_DIR         work dir; the generated checkpoint is kept (default /tmp/ckptfs-bench)
#   SIZE              model size (default 1.5G; node_bench.py gen)
#   READERS           reader counts (default "1 4")
#   READ_SIZE         bytes per pread (default 1M)
#   ROUNDS            rounds; the best of them is shown (default 5)
#   CELLS             what to measure: direct and VIEW@TRANSPORT[:OPTS], TRANSPORT dev (the
#                     /dev/fuse build), off or on (the 3.18 build with io_uring=off/on); default
#                     below (hf/ with passthrough where the 3.18 build can, and without)
#   PYTHON            python3 for the readers (default /usr/bin/python3)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
HELPER=$HERE/node_bench.py
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0; }

BIN=$(readlink -f "${CKPTFS_BIN:-$REPO/build/ckptfs}")
UBIN=${CKPTFS_URING_BIN:-$REPO/build-fuse318/ckptfs}
BENCH_DIR=${BENCH_DIR:-/tmp/ckptfs-bench}
SIZE=${SIZE:-1.5G}
READERS=${READERS:-1 4}
READ_SIZE=${READ_SIZE:-1M}
ROUNDS=${ROUNDS:-5}
PYTHON=${PYTHON:-/usr/bin/python3}
CELLS=${CELLS:-direct hf@dev hf@off:passthrough=off hf@on:passthrough=off hf@off hf@on \
tp4pp1@dev tp4pp1@off tp4pp1@on tp4pp1@dev:mapped_reads=off tp4pp1@on:mapped_reads=off mcore@dev mcore@off mcore@on}
KNOB=/sys/module/fuse/parameters/enable_uring

BENCH_NAME=transport_bench
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"
[[ $(id -u) -eq 0 ]] || die "needs root (enable_uring, passthrough)"
[[ -w $KNOB ]] || die "this kernel has no FUSE over io_uring ($KNOB)"
[[ -x $BIN ]] || die "no ckptfs at $BIN"
if [[ ! -x $UBIN ]]; then
  note "building $UBIN against libfuse 3.18 (scripts/libfuse318.sh)"
  "$REPO/scripts/libfuse318.sh" --ckptfs "$(dirname "$UBIN")" > /dev/null || die "no libfuse 3.18 build"
fi
UBIN=$(readlink -f "$UBIN")
"$UBIN" --version | grep -q "io_uring: yes" || die "$UBIN has no FUSE over io_uring: $("$UBIN" --version)"
case $READ_SIZE in *M) CHUNK=$((${READ_SIZE%M} << 20)) ;; *K) CHUNK=$((${READ_SIZE%K} << 10)) ;; *) CHUNK=$READ_SIZE ;; esac

mkdir -p "$BENCH_DIR"
# One user of the kernel's switch at a time (tests/integration/io_uring.t takes the same lock).
exec {knob_lock}> /tmp/ckptfs-enable_uring.lock
flock -w 900 "$knob_lock" || die "another test or benchmark held $KNOB for 15 minutes"
OLD_KNOB=$(cat "$KNOB")
bench_stop() { echo "$OLD_KNOB" > "$KNOB"; }
bench_start "$BENCH_DIR/transport-run.XXXXXX"
echo Y > "$KNOB"

SRC=$("$PYTHON" "$HELPER" gen --model qwen2-7b --size "$SIZE" "$BENCH_DIR") || die "no checkpoint"
mapfile -t SRC_FILES < <(find "$SRC" -maxdepth 1 -name '*.safetensors' | sort)

CLK_TCK=$(getconf CLK_TCK)
cpu_s() { awk -v hz="$CLK_TCK" '{sub(/^.*\) /, ""); printf "%.3f\n", ($12 + $13) / hz}' "/proc/$1/stat"; }

# mount_cell TRANSPORT OPTS: a fresh mount; BIN_USED and DAEMON_PID set.
mount_cell() {
  local opts=$2
  case $1 in
  dev) BIN_USED=$BIN ;;
  off | on) BIN_USED=$UBIN opts=io_uring=$1${opts:+,$opts} ;;
  *) die "transport '$1': dev, off or on" ;;
  esac
  unmount
  "$BIN_USED" mount ${opts:+-o "$opts"} "$SRC" "$MNT" 2> "$RUN_DIR/mount.err" ||
    die "mount -o $opts failed: $(cat "$RUN_DIR/mount.err")"
  DAEMON_PID=$(find_daemon "$BIN_USED") || die "no daemon for $MNT"
}
view_files() {
  case $1 in
  hf) find "$MNT/hf/" -maxdepth 1 -name '*.safetensors' | sort ;;
  mcore) find "$MNT/mcore/" -name '*.distcp' | sort -V ;;
  *) find "$MNT/$1/" -name model_optim_rng.pt | sort ;;
  esac
}

declare -A BEST CPU BYTES
# measure CELL N: one read of CELL by N readers, the source cached.
measure() {
  local cell=$1 n=$2 files c0=0 c1=0 bytes wall rcpu view transport opts=""
  if [[ $cell == direct ]]; then
    files=("${SRC_FILES[@]}")
    DAEMON_PID=""
  else
    view=${cell%%@*} transport=${cell#*@}
    [[ $transport == *:* ]] && opts=${transport#*:} transport=${transport%%:*}
    mount_cell "$transport" "$opts"
    mapfile -t files < <(view_files "$view")
    ((${#files[@]} > 0)) || die "no files in $view/"
  fi
  cat "${SRC_FILES[@]}" > /dev/null
  [[ -n $DAEMON_PID ]] && c0=$(cpu_s "$DAEMON_PID")
  read -r bytes wall rcpu < <("$PYTHON" "$HELPER" read --chunk "$CHUNK" "$n" "${files[@]}") ||
    die "$n readers of $cell failed"
  [[ -n $DAEMON_PID ]] && c1=$(cpu_s "$DAEMON_PID")
  [[ $cell == direct ]] || unmount
  local g key=$cell.$n
  g=$(awk -v b="$bytes" -v s="$wall" 'BEGIN {printf "%.2f", b / s / 1e9}')
  BYTES[$cell]=$bytes
  if [[ -z ${BEST[$key]:-} ]] || awk -v a="$g" -v b="${BEST[$key]}" 'BEGIN {exit !(a > b)}'; then
    BEST[$key]=$g
  fi
  CPU[$key]+=" $(awk -v a="$c0" -v b="$c1" -v by="$bytes" 'BEGIN {printf "%.2f", (b - a) / (by / 1e9)}')"
  note "$(printf 'round %s/%s  %-28s N=%s  %6s GB/s' "$ROUND" "$ROUNDS" "$cell" "$n" "$g")"
}

read -ra CELL_LIST <<< "$CELLS"
read -ra NS <<< "$READERS"
T0=$(now_us)
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
  order=("${CELL_LIST[@]}")
  if ((ROUND % 2 == 0)); then
    order=()
    for ((i = ${#CELL_LIST[@]} - 1; i >= 0; i--)); do order+=("${CELL_LIST[i]}"); done
  fi
  for n in "${NS[@]}"; do
    for cell in "${order[@]}"; do measure "$cell" "$n"; done
  done
done

label() {
  case $1 in
  direct) echo "direct (source files)" ;;
  *) local v=${1%%@*} t=${1#*@} o=""
     [[ $t == *:* ]] && o=" ${t#*:}" t=${t%%:*}
     case $t in dev) t="/dev/fuse, libfuse 3.14" ;; off) t="/dev/fuse, libfuse 3.18" ;; on) t="io_uring, libfuse 3.18" ;; esac
     echo "$v/ ($t)$o" ;;
  esac
}
echo
echo "transport_bench $(date '+%Y-%m-%d %H:%M') $(hostname): $(nproc) cores, kernel $(uname -r)"
echo "  $BIN: $("$BIN" --version)"
echo "  $UBIN: $("$UBIN" --version)"
echo "  source: $SRC (${#SRC_FILES[@]} shards, cached), $READ_SIZE preads, best of $ROUNDS rounds, $(awk -v us="$(($(now_us) - T0))" 'BEGIN {printf "%.1f", us / 6e7}') min"
printf '%-52s %6s' "" "GB"
for n in "${NS[@]}"; do printf ' | %5s %5s %7s' "N=$n" "ratio" "cpu s/GB"; done
echo
for cell in "${CELL_LIST[@]}"; do
  printf '%-52s %6.2f' "$(label "$cell")" "$(awk -v b="${BYTES[$cell]}" 'BEGIN {print b / 1e9}')"
  for n in "${NS[@]}"; do
    g=${BEST[$cell.$n]} d=${BEST[direct.$n]}
    read -ra cpus <<< "${CPU[$cell.$n]}"
    c=$([[ $cell == direct ]] && echo - || median "${cpus[@]}")
    printf ' | %5s %5s %7s' "$g" "$(awk -v a="$g" -v b="$d" 'BEGIN {printf "%.2f", a / b}')" "$c"
  done
  echo
done
echo "(GB/s: best of $ROUNDS; ratio: to the best direct read of the same N; cpu: the daemon's, median)"
