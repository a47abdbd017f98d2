#!/usr/bin/env bash
# Megatron views benchmark, one run, figures side by side (medians of REPEAT runs):
#  (a) first read of every file of tp4pp1/ and tp2pp2/ through a fresh mount, vs
#  (b) first read of hf/ (the same bytes passed through) through a fresh mount: ratio (a)/(b)
#  (c) cp -r MNT/tp2pp2 DEST, vs (d) an offline Python/torch conversion to tp2pp2: ratio (d)/(c)
#  (e) time from a fresh mount to the first tensor of a tp2pp2 rank file loaded by torch.load
# The source is in the page cache for every run (read once before). Work dir: $BENCH_DIR.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
ckptfs=${CKPTFS_BIN:-$top/build/ckptfs}
work=${BENCH_DIR:-/tmp/ckptfs-bench}
repeat=${REPEAT:-3}
src=$work/llama-1g
mnt=$work/mbench-mnt
mkdir -p "$work" "$mnt"
[[ -d $src ]] || /usr/bin/python3 "$top/bench/gen_checkpoint.py" "$src"
cleanup() { fusermount3 -u "$mnt" 2>/dev/null || true; rm -rf "$work/mbench-out"; }
trap cleanup EXIT

now() { date +%s.%N; }
# shellcheck source=bench/daemon.sh
source "$top/bench/daemon.sh"
fresh_mount() { fusermount3 -u "$mnt" 2>/dev/null || true; "$ckptfs" mount "$src" "$mnt"; }

cat "$src"/*.safetensors > /dev/null

declare -A t
for view in tp4pp1 tp2pp2 hf; do
  for _ in $(seq "$repeat"); do
    fresh_mount
    s=$(now); read_all "$mnt/$view"; e=$(now)
    echo "$e - $s" | bc
  done > "$work/times.$view"
  t[$view]=$(median --low - < "$work/times.$view")
done
fresh_mount
b_hf=$(bytes_of "$mnt/hf"); b_tp4=$(bytes_of "$mnt/tp4pp1"); b_tp2=$(bytes_of "$mnt/tp2pp2")

for _ in $(seq "$repeat"); do
  fresh_mount; rm -rf "$work/mbench-out"
  s=$(now); cp -r "$mnt/tp2pp2" "$work/mbench-out"; sync -f "$work"; e=$(now)
  echo "$e - $s" | bc
done > "$work/times.cp"
t_cp=$(median --low - < "$work/times.cp")
for _ in $(seq "$repeat"); do
  rm -rf "$work/mbench-out"
  s=$(now); /usr/bin/python3 "$top/bench/offline_convert.py" "$src" "$work/mbench-out" --tp 2 --pp 2
  sync -f "$work"; e=$(now)
  echo "$e - $s" | bc
done > "$work/times.convert"
t_conv=$(median --low - < "$work/times.convert")

for _ in $(seq "$repeat"); do
  fusermount3 -u "$mnt" 2>/dev/null || true
  /usr/bin/python3 - "$ckptfs" "$src" "$mnt" <<'PY'
import subprocess, sys, time
ckptfs, src, mnt = sys.argv[1:]
s = time.time()
subprocess.run([ckptfs, "mount", src, mnt], check=True)
import torch
sd = torch.load(f"{mnt}/tp2pp2/release/mp_rank_00_000/model_optim_rng.pt", map_location="cpu")
t = sd["model"]["embedding.word_embeddings.weight"]
float(t[0, 0])
print(time.time() - s)
PY
done > "$work/times.first"
t_first=$(median --low - < "$work/times.first")

gbs() { echo "scale=2; $1 / $2 / 1000000000" | bc; }
printf '\nckptfs Megatron views benchmark (median of %s runs; source in page cache)\n' "$repeat"
printf '%-44s %8s %10s %8s\n' "measurement" "seconds" "GB/s" "ratio"
printf '%-44s %8.3f %10s %8s\n' "(b) hf/ first read, fresh mount" "${t[hf]}" "$(gbs "$b_hf" "${t[hf]}")" "1.00"
printf '%-44s %8.3f %10s %8.2f\n' "(a) tp4pp1/ first read, fresh mount" "${t[tp4pp1]}" "$(gbs "$b_tp4" "${t[tp4pp1]}")" "$(echo "scale=4; ($b_tp4 / ${t[tp4pp1]}) / ($b_hf / ${t[hf]})" | bc)"
printf '%-44s %8.3f %10s %8.2f\n' "(a) tp2pp2/ first read, fresh mount" "${t[tp2pp2]}" "$(gbs "$b_tp2" "${t[tp2pp2]}")" "$(echo "scale=4; ($b_tp2 / ${t[tp2pp2]}) / ($b_hf / ${t[hf]})" | bc)"
printf '%-44s %8.3f\n' "(d) offline Python/torch conversion to tp2pp2" "$t_conv"
printf '%-44s %8.3f %10s %8.2f\n' "(c) cp -r MNT/tp2pp2 (ratio = d/c)" "$t_cp" "" "$(echo "scale=4; $t_conv / $t_cp" | bc)"
printf '%-44s %8.3f\n' "(e) mount to first tensor via torch.load" "$t_first"
printf 'targets: (a)/(b) >= 0.9 (throughput ratio); (d)/(c) >= 3\n'
