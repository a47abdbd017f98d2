#!/usr/bin/env bash
# What the tests, the benches and the demo share: the one safetensors writer
# (tests/lib/st_write.py), whose files safetensors itself reads and writes again byte for byte,
# and the benches' shell library (bench/daemon.sh), which no bench copies.
source "$(dirname "$0")/../lib/common.sh"
script=$TESTS_TOP/tests/lib/st_write_check.py

# --- the safetensors writer ---
out=$(cd "$TESTS_TOP/tests/lib" && $PY "$script" write "$WORK/w.safetensors" 2>&1)
ok $? "st_write writes a file under python3 with numpy: $out"
[[ $out == "no torch" ]]; ok $? "st_write needs no torch"
if torch2_available; then
  got=$(torch2_python "$WORK" "$script" resave "$WORK/w.safetensors" "$WORK/resaved.safetensors" 2>&1)
  ok $? "safetensors loads st_write's file and saves it again: $got"
  [[ $got == "[[1.5, -2.0, 0.25], [3.0, 0.0010000000474974513, -7.5]] [[1.0, -2.0], [0.0, inf]]" ]]
  ok $? "safetensors reads st_write's float32 and bf16 values as written"
  cmp "$WORK/w.safetensors" "$WORK/resaved.safetensors"
  ok $? "safetensors' own writer gives the same bytes"
else
  skip "$TORCH2_WHY"; skip "$TORCH2_WHY"; skip "$TORCH2_WHY"
fi

# --- bench/daemon.sh ---
lib() { bash -c 'source "$1/bench/daemon.sh"; shift; "$@"' _ "$TESTS_TOP" "$@"; }
[[ $(lib median 3 1 2) == 2 && $(lib median 10 4 1 2 3) == 3 ]]
ok $? "median of an odd count is the middle value"
[[ $(lib median 4 1 2 3) == 2.5 && $(lib median --even-format %.2f 1 2) == 1.50 ]]
ok $? "median of an even count is the mean of the middle two (with FMT when given)"
[[ $(lib median --low 4 1 2 3) == 2 && $(printf '9\n5\n' | lib median --low -) == 5 && $(printf '9\n5\n' | lib median -) == 7 ]]
ok $? "median --low takes the lower middle one; - reads the values from stdin"
mkdir "$WORK/b" && head -c 3000 /dev/zero > "$WORK/b/x" && head -c 72 /dev/zero > "$WORK/b/y"
[[ $(lib bytes_of "$WORK/b") == 3072 ]]
ok $? "bytes_of sums the file sizes"
msg=$(BENCH_NAME=somebench lib die "no such thing" 2>&1); rc=$?
[[ $rc -eq 1 && $msg == "somebench: no such thing" ]]
ok $? "die says what went wrong, prefixed with the bench's name, and exits 1"
copies=$(grep -lE '^\s*(die|note|median|bytes_of)\(\)' "$TESTS_TOP"/bench/*.sh | grep -v '/daemon.sh$')
[[ -z $copies ]]
ok $? "no bench defines its own die, note, median or bytes_of: ${copies//$'\n'/ }"
done_testing
