#!/usr/bin/env bash
# Megatron legacy checkpoint as a source, one run, medians of REPEAT:
#  mount time of a tp2pp2 checkpoint (exported from the 1 GiB bf16 model);
#  (a) reading its rank files directly, vs first reads through fresh mounts of (b) hf/ and
#      (c) vpp2/ (tp2pp2vpp2): throughput ratios b/a and c/a (target >= 0.6);
#  (e) cp -r MNT/hf vs (d) an offline Python/torch merger writing safetensors: ratio d/e (>= 3).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
ckptfs=${CKPTFS_BIN:-$top/build/ckptfs}
work=${BENCH_DIR:-/tmp/ckptfs-bench}
repeat=${REPEAT:-3}
hf=$work/llama-1g
src=$work/llama-1g-tp2pp2
mnt=$work/msrc-mnt
mkdir -p "$work" "$mnt"
[[ -d $hf ]] || /usr/bin/python3 "$top/bench/gen_checkpoint.py" "$hf"
[[ -d $src ]] || "$ckptfs" export "$hf" tp2pp2 "$src"
cleanup() { fusermount3 -u "$mnt" 2>/dev/null || true; rm -rf "$work/msrc-out"; }
trap cleanup EXIT
now() { date +%s.%N; }
# shellcheck source=bench/daemon.sh
source "$top/bench/daemon.sh"
ratio() { echo "scale=2; ($1 / $2) / ($3 / $4)" | bc; }

read_all "$src"
for _ in $(seq "$repeat"); do
  fusermount3 -u "$mnt" 2>/dev/null || true
  s=$(now); "$ckptfs" mount "$src" "$mnt"; e=$(now); echo "($e - $s) * 1000" | bc
done > "$work/t.mount"
for _ in $(seq "$repeat"); do s=$(now); read_all "$src/release"; e=$(now); echo "$e - $s" | bc; done > "$work/t.direct"
for view in hf vpp2; do
  for _ in $(seq "$repeat"); do
    fusermount3 -u "$mnt" 2>/dev/null || true
    "$ckptfs" mount "$src" "$mnt"
    s=$(now); read_all "$mnt/$view/"; e=$(now); echo "$e - $s" | bc
  done > "$work/t.$view"
done
b_src=$(bytes_of "$src/release"); b_hf=$(bytes_of "$mnt/hf/"); b_vpp=$(bytes_of "$mnt/vpp2/")
for _ in $(seq "$repeat"); do
  fusermount3 -u "$mnt" 2>/dev/null || true
  "$ckptfs" mount "$src" "$mnt"; rm -rf "$work/msrc-out"
  s=$(now); cp -r "$mnt/hf" "$work/msrc-out"; sync -f "$work"; e=$(now); echo "$e - $s" | bc
done > "$work/t.cp"
for _ in $(seq "$repeat"); do
  rm -rf "$work/msrc-out"
  s=$(now); /usr/bin/python3 "$top/bench/offline_merge.py" "$src/release" "$work/msrc-out"; sync -f "$work"; e=$(now)
  echo "$e - $s" | bc
done > "$work/t.merge"
t_mount=$(median --low - < "$work/t.mount"); t_src=$(median --low - < "$work/t.direct")
t_hf=$(median --low - < "$work/t.hf"); t_vpp=$(median --low - < "$work/t.vpp2")
t_cp=$(median --low - < "$work/t.cp"); t_merge=$(median --low - < "$work/t.merge")
printf '\nckptfs Megatron-source benchmark: tp2pp2 legacy checkpoint of %s bytes (median of %s)\n' "$b_src" "$repeat"
printf '%-46s %9s %8s\n' measurement seconds ratio
printf '%-46s %9.3f\n' "mount (ms)" "$t_mount"
printf '%-46s %9.3f %8s\n' "(a) rank files read directly" "$t_src" "1.00"
printf '%-46s %9.3f %8s\n' "(b) hf/ first read, fresh mount (b/a)" "$t_hf" "$(ratio "$b_hf" "$t_hf" "$b_src" "$t_src")"
printf '%-46s %9.3f %8s\n' "(c) vpp2/ first read, fresh mount (c/a)" "$t_vpp" "$(ratio "$b_vpp" "$t_vpp" "$b_src" "$t_src")"
printf '%-46s %9.3f\n' "(d) offline Python/torch merger to safetensors" "$t_merge"
printf '%-46s %9.3f %8s\n' "(e) cp -r MNT/hf (d/e)" "$t_cp" "$(echo "scale=2; $t_merge / $t_cp" | bc)"
printf 'targets: b/a and c/a >= 0.6 (throughput); d/e >= 3\n'
