#!/usr/bin/env bash
# Mount time, listing and daemon memory of huge vision-language sources (issue targets: mount
# < 1 s, `ls -lR` of a big layout < 2 s, RSS < 128 MiB), on sparse checkpoints with the releases'
# configs and names (bench/gen_vlm_sparse.py: data areas are holes, so only metadata is read):
#   qwen2_5_vl-72b   Qwen2.5-VL-72B (1353 tensors, 147 GB), layout tp8pp4/
#   qwen3_vl-235b    Qwen3-VL-235B-A22B (1388 tensors, experts fused on disk, 471 GB),
#                    layout tp8pp2ep8/ (94 layers: pp 4 does not divide them)
# For each, REPEAT runs (default 3) of: a fresh mount, timed until `ls MNT/hf` answers; `ls -lR`
# of the layout (every rank file planned); the daemon's VmRSS and VmHWM after it. Medians and the
# runs are printed. Work dir: $BENCH_DIR (the sources are kept there and reused).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(readlink -f "${CKPTFS_BIN:-$top/build/ckptfs}")
work=${BENCH_DIR:-/tmp/ckptfs-bench}
repeat=${REPEAT:-3}
BENCH_NAME=vlm_sparse_bench
# shellcheck source=bench/daemon.sh
source "$top/bench/daemon.sh"
mkdir -p "$work"
bench_start "$work/vlm-sparse-run.XXXXXX"

printf 'ckptfs VLM sparse-source benchmark: %s; %s runs; load average %s at start\n' \
  "$BIN" "$repeat" "$(cut -d' ' -f1 /proc/loadavg)"
printf '%-15s %-11s %9s %9s %9s %9s   %s\n' source layout mount_s ls_lR_s rss_MiB hwm_MiB "runs (mount / ls -lR)"
for spec in "qwen2_5_vl-72b::tp8pp4" "qwen3_vl-235b:--qwen3-vl-235b:tp8pp2ep8"; do
  IFS=: read -r name flag layout <<< "$spec"
  src=$work/$name
  # shellcheck disable=SC2086 # no flag for the 72B
  [[ -d $src ]] || /usr/bin/python3 "$top/bench/gen_vlm_sparse.py" $flag "$src" >&2
  mounts=() lists=() rss=() hwm=()
  for _ in $(seq "$repeat"); do
    s=$(now_us)
    "$BIN" mount "$src" "$MNT"
    ls "$MNT/hf" > /dev/null
    m=$(now_us)
    DAEMON_PID=$(find_daemon) || die "no daemon for $MNT"
    [[ -d $MNT/$layout ]] || die "$src: no $layout/ (views: $(ls "$MNT" | tr '\n' ' '))"
    ls -lR "$MNT/$layout" > "$RUN_DIR/ls"
    e=$(now_us)
    files=$(grep -c '^-' "$RUN_DIR/ls")
    mounts+=("$((m - s))") lists+=("$((e - m))")
    rss+=("$(status_kib "$DAEMON_PID" VmRSS)") hwm+=("$(status_kib "$DAEMON_PID" VmHWM)")
    unmount
  done
  printf '%-15s %-11s %9s %9s %9s %9s   %s / %s (%s files)\n' "$name" "$layout/" \
    "$(secs "$(median --low "${mounts[@]}")")" "$(secs "$(median --low "${lists[@]}")")" \
    "$(mib "$(median --low "${rss[@]}")")" "$(mib "$(max "${hwm[@]}")")" \
    "$(list_s "${mounts[@]}")" "$(list_s "${lists[@]}")" "$files"
done
printf 'load average %s at end\n' "$(cut -d' ' -f1 /proc/loadavg)"
echo "targets: mount < 1 s, ls -lR < 2 s, daemon RSS < 128 MiB (issue 32)"
