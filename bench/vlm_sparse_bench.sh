#!/usr/bin/env bash
# Mount time, listing and daemon memory of huge sources (issue 32's targets for the VLMs: mount
# < 1 s, `ls -lR` of a big layout < 2 s, RSS < 128 MiB; issue 33's for the sparse real-config
# sources: mount < 1.5 s, `ls -lR` < 3 s, RSS < 256 MiB), on sparse checkpoints with the
# releases' configs and names (data areas are holes, so only metadata is read):
#   qwen2_5_vl-72b   Qwen2.5-VL-72B (1353 tensors, 147 GB; gen_vlm_sparse.py), layout tp8pp4/
#   qwen3_vl-235b    Qwen3-VL-235B-A22B (1388 tensors, experts fused on disk, 471 GB;
#                    gen_vlm_sparse.py --qwen3-vl-235b), layout tp8pp2ep8/ (94 layers: pp 4 does
#                    not divide them)
#   qwen3_5-397b     Qwen3.5-397B-A17B (2924 tensors, 512 experts fused on disk, the tower and the
#                    MTP block, 807 GB; gen_deepseek_sparse.py --model qwen3.5-397b), `-o mtp=on`,
#                    hf/ listed: the release's text_config has no intermediate_size, so ckptfs
#                    offers no Megatron views of it
#   qwen3_5-397b-pe  the same with the experts per expert (--per-expert: save_pretrained's form,
#                    94,964 tensors in 94 shards)
#   qwen3_5-397b-ffn the fused form with text_config.intermediate_size 1024 added (--intermediate-size:
#                    not in the release, what ckptfs's Megatron views need), layout tp4pp4ep16/
#   gpt-oss-120b     GPT-OSS-120B (687 tensors, MXFP4 experts, 65 GB; gen_deepseek_sparse.py
#                    --model gpt-oss-120b), layout tp4pp4ep16/ (`-o layouts=tp4pp4ep16`)
#   qwen3-235b       the text Qwen3-235B-A22B (36,945 tensors, experts per expert, 470 GB;
#                    gen_checkpoint.py --sparse-qwen3-235b), layout tp8pp2ep8/
# SOURCES picks some of them (default all seven, in that order). For each, REPEAT runs (default
# 3) of: a fresh mount, timed until `ls MNT/hf` answers; `ls -lR` of the layout (every rank file
# planned for its size); the daemon's VmRSS after it; the first MiB of the layout's first rank
# file read (its plan built again on open: first_ms); the daemon's VmHWM after that. Medians and the runs are printed, and the load
# average before and after each source. Work dir: $BENCH_DIR (the sources are kept there and
# reused).
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

printf 'ckptfs sparse-source benchmark: %s; %s runs\n' "$BIN" "$repeat"
printf '%-16s %-12s %9s %9s %9s %9s %9s   %s\n' source layout mount_s ls_lR_s rss_MiB first_ms hwm_MiB \
  "runs (mount / ls -lR / first read), load average"
# name|generator and its flags|layout listed|mount options
specs=("qwen2_5_vl-72b|gen_vlm_sparse.py|tp8pp4|" "qwen3_vl-235b|gen_vlm_sparse.py --qwen3-vl-235b|tp8pp2ep8|"
       "qwen3_5-397b|gen_deepseek_sparse.py --model qwen3.5-397b|hf|mtp=on"
       "qwen3_5-397b-pe|gen_deepseek_sparse.py --model qwen3.5-397b --per-expert --shards 94|hf|mtp=on"
       "qwen3_5-397b-ffn|gen_deepseek_sparse.py --model qwen3.5-397b --intermediate-size 1024|tp4pp4ep16|mtp=on,layouts=tp4pp4ep16"
       "gpt-oss-120b|gen_deepseek_sparse.py --model gpt-oss-120b|tp4pp4ep16|layouts=tp4pp4ep16"
       "qwen3-235b|gen_checkpoint.py --sparse-qwen3-235b|tp8pp2ep8|")
for spec in "${specs[@]}"; do
  IFS='|' read -r name gen layout opts <<< "$spec"
  [[ " ${SOURCES:-$name} " == *" $name "* ]] || continue
  src=$work/$name
  read -ra gen <<< "$gen"
  [[ -d $src ]] || /usr/bin/python3 "$top/bench/${gen[0]}" "${gen[@]:1}" "$src" >&2
  mounts=() lists=() rss=() firsts=() hwm=()
  load_before=$(cut -d' ' -f1 /proc/loadavg)
  for _ in $(seq "$repeat"); do
    s=$(now_us)
    "$BIN" mount ${opts:+-o "$opts"} "$src" "$MNT"
    ls "$MNT/hf" > /dev/null
    m=$(now_us)
    DAEMON_PID=$(find_daemon) || die "no daemon for $MNT"
    [[ -d $MNT/$layout ]] || die "$src: no $layout/ (views: $(ls "$MNT" | tr '\n' ' '))"
    ls -lR "$MNT/$layout" > "$RUN_DIR/ls"
    e=$(now_us)
    files=$(grep -c '^-' "$RUN_DIR/ls")
    mounts+=("$((m - s))") lists+=("$((e - m))")
    rss+=("$(status_kib "$DAEMON_PID" VmRSS)")
    first=$(find "$MNT/$layout/" -name model_optim_rng.pt -print -quit)
    if [[ -n $first ]]; then
      s=$(now_us)
      head -c 1048576 "$first" > /dev/null
      firsts+=("$(($(now_us) - s))")
    else
      firsts+=(0)
    fi
    hwm+=("$(status_kib "$DAEMON_PID" VmHWM)")
    unmount
  done
  printf '%-16s %-12s %9s %9s %9s %9s %9s   %s / %s / %s (%s files), load %s -> %s\n' "$name" "$layout/" \
    "$(secs "$(median --low "${mounts[@]}")")" "$(secs "$(median --low "${lists[@]}")")" \
    "$(mib "$(median --low "${rss[@]}")")" "$(($(median --low "${firsts[@]}") / 1000))" "$(mib "$(max "${hwm[@]}")")" \
    "$(list_s "${mounts[@]}")" "$(list_s "${lists[@]}")" "$(list_s "${firsts[@]}")" "$files" "$load_before" \
    "$(cut -d' ' -f1 /proc/loadavg)"
done
echo "targets: issue 32 (the VLMs): mount < 1 s, ls -lR < 2 s, daemon RSS < 128 MiB;" \
  "issue 33 (qwen3_5-397b*, gpt-oss-120b): mount < 1.5 s, ls -lR < 3 s, RSS < 256 MiB"
