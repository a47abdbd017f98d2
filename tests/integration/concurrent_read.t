#!/usr/bin/env bash
# 4 concurrent reader processes x ~2000 random (offset, length) preads on hf/
# files (pass-through and re-sharded mounts at the same time), some crossing
# or starting past the end of file, each compared with the expected bytes:
# the source file for pass-through, and for the re-sharded view an exported
# copy that st_check has validated against the source independently.
. "$(dirname "$0")/../lib/tap.sh"
tap_require_fuse
tap_workdir

src=$WORK/src
"${GEN[@]}" llama-tiny "$src" --shards 2 --dtype f32 --tokenizer || tap_bail "ckpt_gen failed"
SIZE=100K

mkdir "$WORK/mnt-pass" "$WORK/mnt-re"
if ckptfs_mount "$src" "$WORK/mnt-pass" 2>"$WORK/err1"; then
    tap_ok "mount pass-through"
else
    tap_not_ok "mount pass-through" "$(cat "$WORK/err1")"
    tap_done
fi
if ckptfs_mount -o "hf_shard_size=$SIZE" "$src" "$WORK/mnt-re" 2>"$WORK/err2"; then
    tap_ok "mount hf_shard_size=$SIZE"
else
    tap_not_ok "mount hf_shard_size=$SIZE" "$(cat "$WORK/err2")"
    tap_done
fi

# expected bytes of the re-sharded view: an export, checked independently
if ck export "$src" hf "$WORK/expected-re" -o "hf_shard_size=$SIZE" 2>"$WORK/err3"; then
    tap_check "exported re-sharded view passes st_check --shard-size $SIZE" \
        "${STCHECK[@]}" compare-dir "$src" "$WORK/expected-re" --shard-size "$SIZE"
else
    tap_not_ok "export hf_shard_size=$SIZE" "$(cat "$WORK/err3")"
    tap_done
fi

# pairs: mounted file <TAB> expected file
pairs=$WORK/pairs
: >"$pairs"
for f in $(files_in "$src"); do
    printf '%s\t%s\n' "$WORK/mnt-pass/hf/$f" "$src/$f" >>"$pairs"
done
for f in $(files_in "$WORK/expected-re"); do
    printf '%s\t%s\n' "$WORK/mnt-re/hf/$f" "$WORK/expected-re/$f" >>"$pairs"
done
tap_diag "$(wc -l <"$pairs") files under test"

cat >"$WORK/reader.py" <<'EOF'
import os, random, sys
seed, n, pairs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = random.Random(seed)
files = []
for line in open(pairs):
    got, want = line.rstrip("\n").split("\t")
    files.append((got, open(want, "rb").read()))
fds = {}
bad = 0
for i in range(n):
    path, exp = rng.choice(files)
    size = len(exp)
    r = rng.random()
    if r < 0.1:      # crossing the end of file
        off = max(0, size - rng.randint(1, 4096))
        ln = rng.randint(1, 16384)
    elif r < 0.15:   # at or past the end of file
        off = size + rng.randint(0, 3)
        ln = rng.randint(1, 100)
    elif r < 0.3:    # big reads
        off = rng.randint(0, max(0, size - 1))
        ln = rng.randint(65536, 300000)
    else:
        off = rng.randint(0, max(0, size - 1))
        ln = rng.randint(1, 9000)
    if path not in fds or rng.random() < 0.02:   # sometimes reopen
        if path in fds:
            os.close(fds[path])
        fds[path] = os.open(path, os.O_RDONLY)
    data = os.pread(fds[path], ln, off)
    if data != exp[off:off + ln]:
        bad += 1
        if bad <= 5:
            print("reader %d: %s off=%d len=%d: got %d bytes, want %d%s" % (
                seed, path, off, ln, len(data), len(exp[off:off + ln]),
                "" if len(data) != len(exp[off:off + ln]) else " (contents differ)"), file=sys.stderr)
for fd in fds.values():
    os.close(fd)
print("reader %d: %d reads, %d bad" % (seed, n, bad))
sys.exit(1 if bad else 0)
EOF

pids=()
for i in 1 2 3 4; do
    timeout -k 5 120 "$PY" "$WORK/reader.py" "$i" 2000 "$pairs" >"$WORK/reader-$i.out" 2>&1 &
    pids+=($!)
    tap_track_pid $!
done
for i in 1 2 3 4; do
    wait "${pids[$((i - 1))]}"
    st=$?
    if [ $st -eq 0 ]; then
        tap_ok "reader $i: 2000 random reads equal the expected bytes ($(tail -n 1 "$WORK/reader-$i.out"))"
    else
        tap_not_ok "reader $i: 2000 random reads equal the expected bytes (exit $st)"
        tap_diag_file "$WORK/reader-$i.out" 8
    fi
done
_TAP_PIDS=()

# afterwards the mounts still answer and still match
bad=""
while IFS=$'\t' read -r got want; do
    cmp -s "$got" "$want" || bad+=" $got"
done <"$pairs"
tap_is "$bad" "" "after the concurrent readers, every file still compares equal"

for m in "$WORK/mnt-pass" "$WORK/mnt-re"; do
    ckptfs_umount "$m" && tap_ok "unmount $(basename "$m")" || tap_not_ok "unmount $(basename "$m")"
done

tap_done
