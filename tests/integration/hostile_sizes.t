#!/usr/bin/env bash
# Hostile sizes: sources whose offsets, strides, shapes and counts overflow 64-bit arithmetic
# (near 2^63 and 2^64), torch.save archives whose ZIP64 end records contradict the classic
# ones, and sources that ask the daemon to hold more than the documented caps (sparse files:
# fast, no real memory). Each is refused by `ckptfs inspect` (and `ckptfs mount`) with one line
# naming the file, the tensor and the problem, within 30 s, never by a signal; nothing is ever
# served from outside a record. Good sources and a big real-looking .metadata still work.
source "$(dirname "$0")/../lib/common.sh"
gen="$TESTS_TOP/tests/lib/hostile_sizes.py"

# Good sources of every kind: Hugging Face, a legacy rank file, torch_dist (exported by ckptfs).
$PY "$TESTS_TOP/tests/lib/models.py" write llama "$WORK/hf" --layers 2
check "export tp1pp1 (legacy rank file)" "$CKPTFS" export "$WORK/hf" tp1pp1 "$WORK/legacy"
check "export mcore (torch_dist)" "$CKPTFS" export "$WORK/hf" mcore "$WORK/mcore"
for kind in legacy mcore; do
  check "the good $kind source's hf/ equals the original" bash -c \
    "'$CKPTFS' export '$WORK/$kind' hf '$WORK/$kind-hf' > /dev/null && $PY '$TESTS_TOP/tests/lib/check_hf.py' compare '$WORK/hf' '$WORK/$kind-hf'"
done

$PY "$gen" cases "$WORK/hf" "$WORK/legacy" "$WORK/mcore" "$WORK/bad" > "$WORK/cases"
ok $? "hostile sources generated ($(wc -l < "$WORK/cases") cases)"

# refused CASE COMMAND...: fails within 30 s with an exit status (not a signal or the timeout)
# and one line holding every expected piece.
refused() {
  local case=$1 rc parts s named=0
  shift
  timeout 30 "$@" > /dev/null 2> "$WORK/err" && rc=0 || rc=$?
  IFS=$'\t' read -ra parts <<< "$expect"
  for s in "${parts[@]}"; do grep -qF -- "$s" "$WORK/err" || named=1; done
  [[ $rc -ne 0 && $rc -lt 124 && $(wc -l < "$WORK/err") -eq 1 && $named -eq 0 ]]
  ok $? "$case: $2 refused, rc $rc, one line naming ${parts[*]} ($(head -c 300 "$WORK/err"))"
}

while IFS=$'\t' read -r case expect; do
  refused "$case" "$CKPTFS" inspect "$WORK/bad/$case"
done < "$WORK/cases"

# torch.load (1.13, miniz) refuses every ZIP64 variant ckptfs refuses: the same archives.
$PY "$gen" zip-torch "$WORK/bad" > "$WORK/torch-zip"
n=$(grep -c . "$WORK/torch-zip")
[[ $n -ge 9 ]] && ! grep -qv ' refused$' "$WORK/torch-zip"
ok $? "torch.load refuses all $n ZIP64 variants ($(tr '\n' ' ' < "$WORK/torch-zip"))"

# The wrapped torch_dist storage offset used to put model.norm.weight before its record (zip
# headers and pickle bytes): now nothing at all is served.
timeout 30 "$CKPTFS" cat "$WORK/bad/td-offset-wraps" hf/model.safetensors > "$WORK/served" 2> /dev/null && rc=0 || rc=$?
[[ $rc -ne 0 && $rc -lt 124 && ! -s $WORK/served ]]
ok $? "td-offset-wraps: hf/model.safetensors is not served (rc $rc, $(grep -c PK "$WORK/served") lines with zip signatures)"

# Caps are checked before allocating: a 1.9 GB sparse .metadata, a 300 MB data.pkl record and
# a 262,145-tensor header cost no memory to refuse.
for case in td-metadata-too-big legacy-pickle-too-big st-too-many-tensors; do
  /usr/bin/time -o "$WORK/rss" -f %M "$CKPTFS" inspect "$WORK/bad/$case" > /dev/null 2>&1
  kb=$(tail -1 "$WORK/rss")
  [[ $kb =~ ^[0-9]+$ && $kb -lt 150000 ]]
  ok $? "$case: refused with $kb KB of maximum RSS (under 150 MB)"
done

# Mounts refuse them the same way, and leave nothing mounted.
if [[ -e /dev/fuse ]] && command -v fusermount3 > /dev/null; then
  for case in td-offset-wraps td-numel-wraps legacy-stride-wraps zip-z64-offset st-too-many-tensors; do
    expect=$(awk -F'\t' -v c="$case" '$1 == c {sub(/^[^\t]*\t/, ""); print}' "$WORK/cases")
    mkdir -p "$WORK/mnt-$case"
    refused "$case (mount)" "$CKPTFS" mount "$WORK/bad/$case" "$WORK/mnt-$case"
    ! grep -q " $WORK/mnt-$case " /proc/mounts
    ok $? "$case: nothing left mounted"
  done
else
  skip "mounts: /dev/fuse or fusermount3 missing"
fi

# Caps far above real checkpoints: a real-looking 50 MB .metadata (5.3 million pickle values,
# 3.2 million objects once None, small ints and () are shared; the old cap of 4,194,304
# objects refused it) is read, its optimizer entries skipped.
big=$($PY "$gen" big-metadata "$WORK/mcore" "$WORK/big-md" 60)
timeout 120 "$CKPTFS" inspect "$WORK/big-md" > "$WORK/out" 2> "$WORK/err" && rc=0 || rc=$?
[[ $rc -eq 0 ]] && grep -q "optimizer/RNG entries left unread" "$WORK/out"
ok $? "a $big-byte .metadata with optimizer entries is accepted (rc $rc $(head -c 200 "$WORK/err"))"
done_testing
