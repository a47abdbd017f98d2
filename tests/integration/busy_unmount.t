#!/usr/bin/env bash
# A mount that ends while its files are being read: unmounted lazily (fusermount3 -uz) or stopped
# by SIGTERM, with 8 readers busy. The kernel sends no release for the files still open, so the
# daemon frees their handles itself when its session ends: it exits within 30 s, and with the
# AddressSanitizer build LeakSanitizer reports nothing (it reported each open file's handle,
# 56 bytes from op_open, before).
source "$(dirname "$0")/../lib/common.sh"
require_fuse

asan=0
if grep -q '^CKPTFS_SANITIZE:BOOL=ON' "$(dirname "$CKPTFS")/CMakeCache.txt" 2> /dev/null; then
  asan=1
  export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1
fi

src=$WORK/llama
$PY "$TESTS_TOP/tests/lib/models.py" write llama "$src" --layers 8 --set hidden_size=512 > /dev/null
for mode in lazy term; do
  mnt=$WORK/mnt-$mode log=$WORK/$mode.log
  if ! fg_mount "$CKPTFS" "$src" "$mnt" "$log"; then
    ok 1 "$mode: mounts ($(head -c 200 "$log"))"
    continue
  fi
  readers=()
  for i in 1 2 3 4 5 6 7 8; do
    f=$mnt/hf/model.safetensors
    ((i <= 4)) && f=$mnt/tp2pp1/release/mp_rank_0$((i % 2))/model_optim_rng.pt
    # Holds the file open and reads it over and over, until it fails (for 60 s at most).
    $PY -c 'import sys, time
f, end = open(sys.argv[1], "rb"), time.time() + 60
while time.time() < end:
    f.seek(0)
    while f.read(1 << 20):
        pass' "$f" 2> /dev/null &
    readers+=($!)
  done
  for _ in $(seq 100); do # until every reader has its file open
    open=$(for r in "${readers[@]}"; do ls -l "/proc/$r/fd" 2> /dev/null; done | grep -c "$mnt/")
    ((open >= 8)) && break
    sleep 0.1
  done
  # Lazily unmounted, the mount lives on until the readers close their files (the last releases
  # race the end of the connection); stopped, it ends under them.
  case $mode in
    lazy) fusermount3 -uz "$mnt"; sleep 0.5; kill "${readers[@]}" 2> /dev/null ;;
    term) kill -TERM "$FG_PID" ;;
  esac
  ended=1
  for _ in $(seq 300); do kill -0 "$FG_PID" 2> /dev/null || { ended=0; break; }; sleep 0.1; done
  kill "${readers[@]}" 2> /dev/null
  wait "${readers[@]}" 2> /dev/null
  ok $ended "$mode with $open files open: the daemon ends"
  ((ended == 0)) || { kill -KILL "$FG_PID"; mountpoint -q "$mnt" && fusermount3 -uz "$mnt"; }
  wait "$FG_PID" 2> /dev/null
  if ((asan)); then
    ! grep -qE 'Sanitizer|runtime error' "$log"
    ok $? "$mode: no sanitizer report ($(grep -m1 -A3 -E 'Sanitizer|runtime error' "$log" | tr '\n' ' ' | head -c 300))"
  else
    skip "$mode: the leak check needs the AddressSanitizer build"
  fi
done
done_testing
