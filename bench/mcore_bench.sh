#!/usr/bin/env bash
# The mcore/ view (Megatron-core torch_dist), one run, figures side by side (medians of REPEAT):
#  (1) cp -r MNT/mcore DEST (fresh mount, sync) vs an offline Python/torch converter writing
#      torch_dist with dcp.save (bench/mcore_convert.py): ratio offline/cp, target >= 3;
#  (2) fresh mount + one TP-2 rank's share loaded with torch.distributed.checkpoint from
#      MNT/mcore vs the offline conversion + the same load from its output: ratio;
#  (3) read amplification per TP degree: bytes of the stored items a rank's share overlaps /
#      the share's bytes, the max over ranks, computed from .metadata (bench/mcore_share.py);
#      plus, measured once for that rank, the bytes the daemon served and the loader read.
# Checks once (untimed) that the share loader returns the slices of a full dcp.load and that the
# converted checkpoint is bit-identical to the view.
# MODEL=llama (default): the ~1 GiB Llama of bench/gen_checkpoint.py, (1) to (3).
# MODEL=qwen2_5_vl_3b: a Qwen2.5-VL-3B-shaped VLM (7.5 GB, bench/gen_vlm_sparse.py --3b; the
#   converter builds mbridge's Qwen2_5VLModel state dict), (1) and the check only.
# torch 2.6 runs in the Debian 13 root ($CKPTFS_TORCH2_ROOT), chrooted in a private mount
# namespace. The source is in the page cache for every run. Work dir: $BENCH_DIR.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
ckptfs=${CKPTFS_BIN:-$top/build/ckptfs}
work=${BENCH_DIR:-/tmp/ckptfs-bench}
repeat=${REPEAT:-3}
root=${CKPTFS_TORCH2_ROOT:-/var/cache/ckptfs-tests/trixie-root}
model=${MODEL:-llama}
[[ -x $root/usr/bin/python3 ]] || { echo "mcore_bench: no Debian 13 root with torch at $root (tests/run-all.sh builds it)" >&2; exit 1; }
mkdir -p "$work"
work=$(cd "$work" && pwd -P)
case $model in
  llama) src=$work/llama-1g; shares=1
    [[ -d $src ]] || /usr/bin/python3 "$top/bench/gen_checkpoint.py" "$src" ;;
  qwen2_5_vl_3b) src=$work/qwen2_5_vl-3b; shares=0
    [[ -d $src ]] || /usr/bin/python3 "$top/bench/gen_vlm_sparse.py" --3b "$src" ;;
  *) echo "mcore_bench: MODEL=$model: llama or qwen2_5_vl_3b" >&2; exit 1 ;;
esac
run=$(mktemp -d "$work/mcore-run.XXXXXX")
mnt=$run/mnt
mkdir -p "$mnt" "$run/template"

# Every mount below $run goes (only ours: the daemon exits with its unmount), then $run, then
# the empty directories the chroot bind mounts needed inside the root.
cleanup() {
  local m
  for m in $(awk -v w="$run/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r); do
    fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null || true
  done
  rm -rf --one-file-system "$run"
  rmdir "$root$work" "$root$top/bench" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM HUP

now() { date +%s.%N; }
# shellcheck source=bench/daemon.sh
source "$top/bench/daemon.sh"
fresh_mount() { fusermount3 -u "$mnt" 2>/dev/null || true; "$ckptfs" mount "$src" "$mnt"; }
# The daemon serving $mnt (checked against the binary and its last argument) and the bytes it
# has written to /dev/fuse so far (wchar: the replies, i.e. the file bytes it served).
daemon_pid() {
  local pid
  for pid in $(pgrep -f -- "$mnt" || true); do
    [[ $(readlink -f "/proc/$pid/exe" 2>/dev/null) == "$(readlink -f "$ckptfs")" ]] || continue
    [[ $(tr '\0' '\n' < "/proc/$pid/cmdline" | tail -n 1) == "$mnt" ]] && { echo "$pid"; return; }
  done
  echo "mcore_bench: no ckptfs daemon found for $mnt" >&2; return 1
}
served() { awk '/^wchar:/ {print $2}' "/proc/$(daemon_pid)/io"; }
col() { sed -n "s/.* $1=\\([^ ]*\\).*/\\1/p" "$2"; } # col NAME FILE: NAME=value of every line
# torch2 SCRIPT ARGS...: the root's python3 (torch 2.6) on SCRIPT, with $work (checkpoints, mount
# point, outputs) and bench/ at the same paths; mounts made before the call are visible inside.
torch2() { "$top/bench/torch2.sh" "$root" "$work:$top/bench" "$@"; }

others() { awk -v r="$run/" '$3 == "fuse.ckptfs" && index($2, r) != 1 {n++} END {print n + 0}' /proc/mounts; }
load_start=$(cut -d' ' -f1 /proc/loadavg); others_start=$(others)
cat "$src"/*.safetensors > /dev/null
fresh_mount
b_view=$(bytes_of "$mnt/mcore")
# The converter takes keys, shapes and the padded vocabulary from the view's .metadata (copied:
# it does not need a mount).
cp "$mnt/mcore/release/.metadata" "$run/template/.metadata"
if (( shares )); then
  echo "# (3) read amplification from $mnt/mcore/release/.metadata" >&2
  torch2 "$top/bench/mcore_share.py" amp "$mnt/mcore/release" > "$run/amp.view"
fi

# (1) cp -r of the view vs the offline conversion, both followed by sync.
for i in $(seq "$repeat"); do
  echo "# (1a) cp -r MNT/mcore, run $i" >&2
  fresh_mount; rm -rf "$run/cp-out"
  s=$(now); cp -r "$mnt/mcore" "$run/cp-out"; sync -f "$work"; e=$(now)
  echo "$e - $s" | bc
done > "$run/t.cp"
b_cp=$(bytes_of "$run/cp-out")
rm -rf "$run/cp-out"
fusermount3 -u "$mnt"
for i in $(seq "$repeat"); do
  echo "# (1b) offline conversion, run $i" >&2
  rm -rf "$run/conv-out"
  s=$(now); /usr/bin/time -v -o "$run/conv.time.$i" "$top/bench/torch2.sh" "$root" "$work:$top/bench" \
    "$top/bench/mcore_convert.py" "$src" "$run/conv-out" --like "$run/template"
  sync -f "$work"; e=$(now)
  echo "$e - $s" | bc
done > "$run/t.conv"
b_conv=$(bytes_of "$run/conv-out")

# Sanity, untimed: the share loader against a full dcp.load (view: TP 2 and TP 4, every rank;
# converted: TP 2 rank 0), and the converted checkpoint bit-identical to the view.
echo "# verify (untimed)" >&2
fresh_mount
tps=2,4; (( shares )) || tps=
torch2 "$top/bench/mcore_share.py" verify "$mnt/mcore/release" --converted "$run/conv-out/release" --tps "$tps" > "$run/verify"
grep -q '^VERIFY ok' "$run/verify" || { cat "$run/verify" >&2; echo "mcore_bench: verification failed" >&2; exit 1; }
# The report's head: sizes, the machine, and (1)
runs() { cut -d' ' -f1 "$1" | awk '{printf "%s%.2f", (NR > 1 ? " " : ""), $1}'; }
report_copy() {
  printf '\nckptfs mcore/ (torch_dist) benchmark: %s (median of %s runs; source in page cache)\n' "$src" "$repeat"
  printf 'mcore/ view %s bytes; cp output %s bytes; converted checkpoint %s bytes\n' "$b_view" "$b_cp" "$b_conv"
  printf 'binary %s; load average %s at start, %s at end; other ckptfs mounts: %s at start, %s at end\n' \
    "$ckptfs" "$load_start" "$(cut -d' ' -f1 /proc/loadavg)" "$others_start" "$(others)"
  printf '%-58s %8s %7s   %s\n' measurement seconds ratio runs
  printf '%-58s %8.3f %7s   %s\n' "(1a) cp -r MNT/mcore DEST + sync, fresh mount" "$t_cp" "1.00" "$(runs "$run/t.cp")"
  printf '%-58s %8.3f %7.2f   %s\n' "(1b) offline HF -> torch_dist converter + sync (1b/1a)" "$t_conv" "$(echo "scale=4; $t_conv / $t_cp" | bc)" "$(runs "$run/t.conv")"
}
if ! (( shares )); then
  fusermount3 -u "$mnt"; rm -rf "$run/conv-out"
  t_cp=$(median --low - < "$run/t.cp"); t_conv=$(median --low - < "$run/t.conv")
  report_copy
  printf 'converter peak RSS: %s MiB (largest of the runs; the daemon maps the source instead)\n' \
    "$(for f in "$run"/conv.time.*; do maxrss_kib "$f"; done | sort -n | tail -1 | awk '{printf "%.0f", $1 / 1024}')"
  echo "targets: (1b)/(1a) >= 5 (issue 32); the converted checkpoint is bit-identical to the view"
  exit 0
fi
torch2 "$top/bench/mcore_share.py" amp "$run/conv-out/release" --tps 2 > "$run/amp.conv"

# (2) fresh mount + TP-2 rank-0 share vs the same load from the converted checkpoint.
for i in $(seq "$repeat"); do
  echo "# (2a) mount + TP-2 rank-0 share from MNT/mcore, run $i" >&2
  fusermount3 -u "$mnt" 2>/dev/null || true
  s=$(now); "$ckptfs" mount "$src" "$mnt"
  r=$(torch2 "$top/bench/mcore_share.py" load "$mnt/mcore/release" --tp 2 --rank 0 | grep '^RESULT'); e=$(now)
  echo "$(echo "$e - $s" | bc) $r served=$(served)"
done > "$run/t.share.view"
# (3), measured once (untimed): for each TP degree, the rank with the largest .metadata ratio
# loads its share from a fresh mount; the bytes the daemon served and the loader read.
while read -r _ tp max rank _; do
  [[ $max == skip ]] && continue
  echo "# (3) measured: ${tp/=/ } ${rank/=/ }" >&2
  fresh_mount < /dev/null
  r=$(torch2 "$top/bench/mcore_share.py" load "$mnt/mcore/release" --${tp/=/ } --${rank/=/ } < /dev/null | grep '^RESULT')
  echo "${tp#tp=} $r served=$(served)"
done < "$run/amp.view" > "$run/amp.measured"
fusermount3 -u "$mnt"
for i in $(seq "$repeat"); do
  echo "# (2b) TP-2 rank-0 share from the converted checkpoint, run $i" >&2
  s=$(now); r=$(torch2 "$top/bench/mcore_share.py" load "$run/conv-out/release" --tp 2 --rank 0 | grep '^RESULT'); e=$(now)
  echo "$(echo "$e - $s" | bc) $r"
done > "$run/t.share.conv"
rm -rf "$run/conv-out"

t_cp=$(median --low - < "$run/t.cp"); t_conv=$(median --low - < "$run/t.conv")
t_sv=$(cut -d' ' -f1 "$run/t.share.view" | median --low -); t_sc=$(cut -d' ' -f1 "$run/t.share.conv" | median --low -)
l_sv=$(col load_s "$run/t.share.view" | median --low -); l_sc=$(col load_s "$run/t.share.conv" | median --low -)
rc_sv=$(col rchar "$run/t.share.view" | median --low -); rc_sc=$(col rchar "$run/t.share.conv" | median --low -)
sv_sv=$(col served "$run/t.share.view" | median --low -)
sb=$(col share_bytes "$run/t.share.view" | head -1)
t_off=$(echo "$t_conv + $t_sc" | bc)
mb() { echo "scale=1; $1 / 1048576" | bc; }

report_copy
printf '%-58s %8.3f %7s   %s\n' "(2a) mount + TP-2 rank-0 share via DCP from MNT/mcore" "$t_sv" "1.00" "$(runs "$run/t.share.view")"
printf '%-58s %8.3f\n' "     of which dcp.load" "$l_sv"
printf '     share %s MiB; the daemon served %s MiB, the loader read(2) %s MiB\n' "$(mb "$sb")" "$(mb "$sv_sv")" "$(mb "$rc_sv")"
printf '%-58s %8.3f %7.2f\n' "(2b) (1b) + the same load from the converted ckpt (2b/2a)" "$t_off" "$(echo "scale=4; $t_off / $t_sv" | bc)"
printf '%-58s %8.3f %7s   %s\n' "     the load alone (process start to share loaded)" "$t_sc" "" "$(runs "$run/t.share.conv")"
printf '%-58s %8.3f\n' "     of which dcp.load" "$l_sc"
printf '(3) read amplification = bytes read for one rank / its share of the tensors (max over ranks)\n'
printf '    %-4s %-5s %10s %10s %10s %10s\n' TP rank "share MiB" .metadata served read
while read -r _ tp max rank read share ok; do
  tp=${tp#tp=}
  [[ $max == skip ]] && { printf '    %-4s not a valid TP degree for this model\n' "$tp"; continue; }
  m=$(awk -v t="$tp" '$1 == t' "$run/amp.measured")
  sv=$(sed -n 's/.* served=\([0-9]*\).*/\1/p' <<< "$m"); rc=$(sed -n 's/.* rchar=\([0-9]*\).*/\1/p' <<< "$m")
  note=""; [[ ${ok#megatron_ok=} == 1 ]] || note="  (*)"
  printf '    %-4s %-5s %10s %10s %10.4f %10.4f%s\n' "$tp" "${rank#rank=}" "$(mb "${share#share=}")" "${max#max=}" \
    "$(echo "scale=6; $sv / ${share#share=}" | bc)" "$(echo "scale=6; $rc / ${share#share=}" | bc)" "$note"
done < "$run/amp.view"
read -r _ _ cmax _ _ _ _ < "$run/amp.conv"
printf '    converted ckpt, TP 2: .metadata %s, read %.4f (every stored tensor is one item, read whole)\n' \
  "${cmax#max=}" "$(echo "scale=6; $rc_sc / $sb" | bc)"
[[ -z $(awk '$NF == "megatron_ok=0"' "$run/amp.view") ]] ||
  printf '    (*) TP above the query groups: Megatron-core >= 0.16 sub-shards QKV; older versions refuse it\n'
cat <<'EOF'
targets: (1b)/(1a) >= 3
legend: (1a) fresh mount, cp -r of the whole view, sync; (1b) bench/mcore_convert.py (safetensors
  load, stacked Megatron state dict, dcp.save, common.pt), sync; both include the disk writes.
  (2a) from `ckptfs mount` to TP-2 rank 0's share loaded by dcp.load with a share-only plan
  (bench/mcore_share.py; python + torch import included); (2b) = median of (1b) + median of the
  same load from the converted checkpoint. (3) .metadata: sum of the storage lengths of the items
  a rank's boxes overlap (one per ReadItem, as FileSystemReader reads them) / the share's tensor
  bytes, max over ranks; computed, not measured. served / read: one measured load of that rank
  (fresh mount): bytes the daemon wrote to /dev/fuse (its wchar) and bytes the loader process
  read(2) during dcp.load (its rchar), / the share. They include the loader's buffered reads
  (st_blksize: 16 KiB for .distcp files) and the kernel's read-ahead, which .metadata does not see.
EOF
