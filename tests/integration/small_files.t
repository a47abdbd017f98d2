#!/usr/bin/env bash
# Small files a source holds (trackers, config.json, index files, metadata.json, fsdp_config.json,
# the files options name) are read through one reader, ckptfs_read_small_file: regular files
# only, opened without blocking, at most a cap. The rule, checked on the code: no other call of
# the C library or GLib that opens or reads a file by name, except the few listed below that
# are not source files. And the file that slipped past it, a verl run's tracker: a FIFO, a
# symlink to /dev/zero or /dev/urandom, a directory or an oversized file there neither hangs
# `ckptfs inspect RUN` and `ckptfs mount RUN MNT` nor grows them; latest falls back to the highest
# step and both say why. Every command runs under a timeout (and a memory cap).
source "$(dirname "$0")/../lib/common.sh"
cd "$TESTS_TOP" || exit 1

# --- the rule ---
# FILE<TAB>TEXT ON THE LINE<TAB>why it is no source file. Reads of a literal /proc or /sys path
# are kernel settings and allowed without an entry.
allowed="core/io/readfile.c	open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)	the reader itself
core/io/srcfiles.c	g_file_get_contents(disk, &text, NULL, NULL) && !g_file_get_contents(part,	sysfs: the source device's read_ahead_kb
fs/fuse_ops.c	ctx->read_ahead_knob	sysfs: the mount's own read_ahead_kb
fs/transport.c	ENABLE_URING_KNOB	the kernel's FUSE io_uring switch
cli/commands.c	O_WRONLY | O_CREAT | O_EXCL	export writes a new file of DEST"
calls='\b(g_file_get_contents|g_file_load_contents|g_mapped_file_new|g_key_file_load_from_file|json_parser_load_from_file|fopen|fdopen|freopen)\s*\(|(^|[^_a-zA-Z0-9.>])(open|open64|openat|creat)\s*\('
others=""
while IFS= read -r hit; do
  file=${hit%%:*} text=${hit#*:*:}
  code=$(sed -E 's|/\*.*\*/||g; s|//.*||; s|^[[:space:]]*(/\*\|\*).*||' <<< "$text") # comments are no calls
  [[ $code =~ $calls ]] || continue
  [[ $text =~ \"/(proc|sys)/ ]] && continue
  ok_here=1
  while IFS=$'\t' read -r afile atext _; do
    [[ $file == "$afile" && $text == *"$atext"* ]] && { ok_here=0; break; }
  done <<< "$allowed"
  [[ $ok_here -eq 0 ]] || others+="${hit%%:*}:$(cut -d: -f2 <<< "$hit") "
done < <(grep -rnE "$calls" core cli fs --include='*.c' --include='*.h')
[[ -z $others ]]
ok $? "every file ckptfs reads by name goes through ckptfs_read_small_file or the source-file reader${others:+; not: $others}"
grep -q 'ckptfs_read_small_file(path, CKPTFS_MAX_TRACKER_BYTES' core/source/verl_run.c
ok $? "the verl run's tracker is read with ckptfs_read_small_file, capped as Megatron's tracker is"

require_fuse
# run_ckptfs ARGS...: ckptfs under a timeout and a memory cap (AddressSanitizer reserves
# terabytes of address space: its own RSS limit instead); rc in $rc, stdout $WORK/out, stderr
# $WORK/err. 124 is the timeout, 128+ a signal.
if grep -q '^CKPTFS_SANITIZE:BOOL=ON' "$(dirname "$CKPTFS")/CMakeCache.txt" 2> /dev/null; then
  export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}hard_rss_limit_mb=1024
  capped=(timeout 20)
else
  capped=(timeout 20 prlimit --as=$((1 << 30)))
fi
run_ckptfs() { "${capped[@]}" "$CKPTFS" "$@" > "$WORK/out" 2> "$WORK/err" && rc=0 || rc=$?; }

# A verl run of two steps, each an actor saved by verl's Megatron engine with Hugging Face
# weights (model/huggingface/), made here: no test data needed.
run=$WORK/run
for step in 1 2; do
  $PY "$TESTS_TOP/tests/lib/models.py" write llama "$run/global_step_$step/actor/model/huggingface" --layers 2 > /dev/null
done
check "the run's steps are roles ckptfs reads" "$CKPTFS" inspect "$run/global_step_1/actor"
tracker=$run/latest_checkpointed_iteration.txt
declare -A says=(
  [fifo]="not a regular file (a FIFO)"
  [devzero]="not a regular file (a character device)"
  [urandom]="not a regular file (a character device)"
  [directory]="not a regular file (a directory)"
  [oversize]="1048576 bytes, more than the 4096 this file may have"
)
for kind in fifo devzero urandom directory oversize; do
  rm -rf "$tracker"
  case $kind in
    fifo) mkfifo "$tracker" ;;
    devzero) ln -s /dev/zero "$tracker" ;;
    urandom) ln -s /dev/urandom "$tracker" ;;
    directory) mkdir "$tracker" ;;
    oversize) truncate -s 1M "$tracker" ;;
  esac
  want="$tracker: ${says[$kind]}: latest is the highest step, global_step_2"
  run_ckptfs inspect "$run"
  [[ $rc -eq 0 ]] && grep -qF "warning:      $want" "$WORK/out" && grep -qF "latest: global_step_2" "$WORK/out"
  ok $? "tracker $kind: inspect ends, latest is the highest step and it says why (rc $rc: $(head -c 200 "$WORK/err"))"
  mnt=$WORK/mnt-$kind
  mkdir -p "$mnt"
  run_ckptfs mount "$run" "$mnt"
  [[ $rc -eq 0 && $(readlink "$mnt/latest" 2> /dev/null) == global_step_2 ]]
  ok $? "tracker $kind: mount ends, latest -> global_step_2 (rc $rc: $(head -c 200 "$WORK/err"))"
  mountpoint -q "$mnt" && fusermount3 -u "$mnt"
  # Without the fix a reader would still wait on the FIFO: a writer that opens and closes it
  # lets it go, so that nothing is left behind.
  [[ $kind == fifo ]] && timeout 2 bash -c ": > '$tracker'" 2> /dev/null
done
rm -rf "$tracker"
echo 1 > "$tracker"
run_ckptfs inspect "$run"
[[ $rc -eq 0 ]] && grep -qF "latest: global_step_1" "$WORK/out" && ! grep -q "^warning:" "$WORK/out"
ok $? "a tracker naming step 1 is followed, with no warning (rc $rc)"

# -o hf_config names a file the user gives: a FIFO or a device there is refused at once.
mkfifo "$WORK/config-fifo"
for config in "$WORK/config-fifo" /dev/zero; do
  run_ckptfs inspect -o hf_config="$config" "$run/global_step_1/actor"
  [[ $rc -ne 0 && $rc -ne 124 && $rc -lt 128 ]] && grep -qF "option hf_config" "$WORK/err"
  ok $? "-o hf_config=$config: refused, naming the option (rc $rc: $(head -c 200 "$WORK/err"))"
done
done_testing
