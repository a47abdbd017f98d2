#!/usr/bin/env bash
# A source file changed while readers are reading: four reader threads read hf/, tp2pp1/ and
# mcore/ files at random offsets while a writer rewrites a shard in place (with its mtime put back
# or not), renames a new one over it, or truncates and regrows it. Every read must return the
# bytes of a mount of an untouched copy, or fail: never new bytes, never old and new mixed.
# Afterwards the files that read the shard fail, the log names it, and the other shard's hf/ file
# still reads. With the defaults (mapped reads under a lease, direct I/O), without mapped reads,
# through the mount's page cache, through it with chunks pushed ahead of the readers (readahead),
# with readahead=auto on (readahead_cores=16: a file opened alone through the page cache and
# pushed, the others with direct I/O), and from a packed copy (frames decoded on read). FUSE passthrough
# (on by default where the build and kernel have it) is off: a file the kernel reads from the source
# itself is checked at open only (passthrough.t).
source "$(dirname "$0")/../lib/common.sh"
require_fuse

orig=$WORK/orig
check "a 2-layer model in 2 shards written" $PY "$TESTS_TOP/tests/lib/models.py" write llama "$orig" --layers 2 \
  --shards 2 --set hidden_size=512 --set intermediate_size=1024 --set vocab_size=4096
shards=($(cd "$orig" && ls -- *.safetensors))
ref=$WORK/ref
MOUNT_OPTS=layouts=tp2pp1,mapped_reads=off fg_mount "$CKPTFS" "$orig" "$ref" "$WORK/ref.log"
ok $? "reference mount of the untouched model"
ref_pid=$FG_PID
files=(hf/"${shards[0]}" hf/"${shards[1]}" tp2pp1/release/mp_rank_00/model_optim_rng.pt
       tp2pp1/release/mp_rank_01/model_optim_rng.pt mcore/release/__0_0.distcp)
# The files that read the changed shard through the daemon, without the mount's page cache.
uncached=(tp2pp1/release/mp_rank_00/model_optim_rng.pt mcore/release/__0_0.distcp)

# The same model packed (zstd frames decoded on read, ahead of the reader on decoder threads).
packed=$WORK/packed
check "the model packed" "$CKPTFS" pack "$orig" "$packed"

n=0
for setting in "" mapped_reads=off direct_io=off direct_io=off,readahead=4M readahead_cores=16 packed; do
  from=$orig opts=$setting
  [[ $setting == packed ]] && from=$packed opts=
  for mode in ${MODES:-inplace keep_mtime overwrite rename truncate}; do
    n=$((n + 1))
    what="${setting:-defaults}, $mode"
    src=$WORK/src$n mnt=$WORK/mnt$n log=$WORK/mnt$n.log
    cp -r "$from" "$src"
    cat "$src"/*.safetensors > /dev/null # cached, so that mapped reads are used
    sleep 0.05 # the mount's first look at the files one clock tick past their writing
    if ! MOUNT_OPTS=layouts=tp2pp1,passthrough=off${opts:+,$opts} fg_mount "$CKPTFS" "$src" "$mnt" "$log"; then
      ok 1 "$what: mounted"; sed 's/^/# /' "$log" >&2
      continue
    fi
    pid=$FG_PID
    out=$($PY "$TESTS_TOP/tests/lib/change_race.py" "$mnt" "$ref" "$src/${shards[0]}" "$mode" "$n" "${files[@]}" 2>&1)
    ok $? "$what: every read gave the untouched bytes or failed (${out%%$'\n'*})"
    [[ $out == *$'\n'* ]] && printf '%s\n' "${out#*$'\n'}" | sed 's/^/# /' | head -20 >&2
    bad=0
    for f in "${uncached[@]}"; do
      if cat "$mnt/$f" > /dev/null 2>&1; then bad=1; fail_diag "$f still reads"; fi
    done
    ok $bad "$what: the rank file and the .distcp fail afterwards"
    grep -q "${shards[0]}" "$log"
    ok $? "$what: the log names the changed shard ($(grep -m1 "${shards[0]}" "$log" | head -c 160))"
    cmp -s "$mnt/hf/${shards[1]}" "$ref/hf/${shards[1]}"
    ok $? "$what: the other shard's hf/ file still reads, unchanged"
    FG_PID=$pid fg_unmount "$mnt"
    ok $? "$what: unmounted"
    if [[ $setting == *readahead=* ]]; then # chunks were stored ahead of the readers during the race
      grep -q "readahead: [1-9][0-9]* chunks pushed" "$log"
      ok $? "$what: chunks were pushed ($(grep -m1 'readahead:' "$log" | head -c 120))"
    fi
    rm -rf "$src"
  done
done
# A shard deleted (verl's max_ckpt_to_keep removing an old step): the log says so.
src=$WORK/src-rm mnt=$WORK/mnt-rm
cp -r "$orig" "$src"
sleep 0.05
if MOUNT_OPTS=layouts=tp2pp1,passthrough=off fg_mount "$CKPTFS" "$src" "$mnt" "$WORK/rm.log"; then
  pid=$FG_PID
  exec 7< "$mnt/${files[2]}"
  rm "$src/${shards[0]}"
  ! cat <&7 > /dev/null 2>&1
  ok $? "a rank file open before its shard was deleted fails"
  exec 7<&-
  grep -q "${shards[0]}: source file removed after the mount" "$WORK/rm.log"
  ok $? "the log says the shard was removed ($(grep -m1 removed "$WORK/rm.log" | head -c 160))"
  FG_PID=$pid fg_unmount "$mnt"
  ok $? "unmounted"
else
  ok 1 "mount for the deleted shard"
fi
FG_PID=$ref_pid fg_unmount "$ref"
ok $? "reference mount unmounted"
done_testing
