#!/usr/bin/env bash
# verl FSDP role directories as a source: for every FSDP1/FSDP2 run of the test data (1-D and
# HSDP meshes, plain W=1 tensors, uneven and empty shards, tied embeddings, a critic), hf/ with
# -o dtype=fp32 holds the starting model's bf16 tensors upcast exactly, under the same names
# (tied lm_head dropped), and by default is bit-identical to it in bf16 (what verl's merger
# writes); a Megatron view of it reads back as the same model; broken role directories fail
# with one line naming the file and the problem, and nothing in a hostile pickle runs.
source "$(dirname "$0")/../lib/common.sh"
data=$TESTDATA/verl-fsdp
verl_check="$TESTS_TOP/tests/lib/verl_check.py"
check_hf="$TESTS_TOP/tests/lib/check_hf.py"
fuse=1
if [[ ! -e /dev/fuse ]] || ! command -v fusermount3 > /dev/null; then
  fuse=0
  diag "/dev/fuse or fusermount3 missing: mounted checks skipped"
fi

# run : model it started from : FSDP version : world size
runs=(fsdp1/llama-w1:llama:1:1 fsdp1/llama-w2:llama:1:2 fsdp1/llama-w4-hsdp2:llama:1:4 fsdp1/qwen2-w4:qwen2:1:4
      fsdp2/llama-w4:llama:2:4 fsdp2/qwen2-w2:qwen2:2:2 fsdp2/qwen2-critic-w2:qwen2-critic:2:2)
for spec in "${runs[@]}"; do
  IFS=: read -r run model version w <<< "$spec"
  role=$data/$run/global_step_1/actor
  src=$data/src/$model
  name=${run//\//-}
  check "$run: inspect says verl FSDP$version, world size $w, step 1, role actor" bash -c \
    "'$CKPTFS' inspect '$role' | grep '^found:' | grep -F 'verl FSDP$version shards: world size $w,' | grep -qF 'step 1, role actor'"
  if [[ $fuse -eq 0 ]]; then
    skip "$run: mounted checks need FUSE"
    continue
  fi
  mnt=$WORK/fp32-$name
  if mount_ckptfs "$role" "$mnt" -o dtype=fp32 2> "$WORK/err"; then
    check "  -o dtype=fp32: hf/ tensors are src/$model's bf16 values upcast to fp32 exactly" \
      $PY "$verl_check" fp32 "$src" "$mnt/hf"
    check "  hf/ holds exactly src/$model's tensor names" $PY "$verl_check" names "$src" "$mnt/hf"
    check "  hf/ has config.json and tokenizer.json" test -s "$mnt/hf/config.json" -a -s "$mnt/hf/tokenizer.json"
    check "  config.json says float32, what the fp32 view serves" $PY -c \
      "import json,sys; sys.exit(json.load(open('$mnt/hf/config.json'))['torch_dtype'] != 'float32')"
    unmount_ckptfs "$mnt"
  else
    ok 1 "  mount -o dtype=fp32 ($(head -c 300 "$WORK/err"))"
  fi
  mnt=$WORK/bf16-$name
  if mount_ckptfs "$role" "$mnt" 2> "$WORK/err"; then
    check "  default dtype (bf16, as verl's merger writes): hf/ is bit-identical to src/$model" \
      $PY "$check_hf" compare "$src" "$mnt/hf"
    if [[ $model != qwen2-critic ]]; then
      # The same weights from the Hugging Face model they started as: every Megatron file equal.
      srcmnt=$WORK/src-$model
      [[ -d $srcmnt/hf ]] || mount_ckptfs "$src" "$srcmnt"
      for v in tp2pp2 mcore; do
        check "  $v/ is byte-identical to $v/ of src/$model" diff -r "$mnt/$v" "$srcmnt/$v"
      done
    fi
    unmount_ckptfs "$mnt"
  else
    ok 1 "  mount ($(head -c 300 "$WORK/err"))"
  fi
done

check "HSDP: inspect says only the mesh's first row is read" bash -c \
  "'$CKPTFS' inspect '$data/fsdp1/llama-w4-hsdp2/global_step_1/actor' | grep -qF 'mesh [2, 2] (ddp, fsdp), ranks of the first row read: 0 1'"

# Older runs have no fsdp_config.json: the world size comes from the file names.
old=$WORK/no-config
cp -r "$data/fsdp2/llama-w4/global_step_1/actor" "$old"
rm "$old/fsdp_config.json"
check "without fsdp_config.json: inspect infers world size 4 from the file names" bash -c \
  "'$CKPTFS' inspect '$old' | grep -qF 'verl FSDP (no fsdp_config.json) shards: world size 4,'"

# Megatron views of a verl source read back as the model (tied and untied).
if [[ $fuse -eq 1 ]]; then
  for spec in fsdp2/llama-w4:llama:tp2pp2 fsdp1/qwen2-w4:qwen2:tp2pp1; do
    IFS=: read -r run model layout <<< "$spec"
    name=${run//\//-}
    view=$WORK/view-$name
    exp=$WORK/exp-$name-$layout
    back=$WORK/back-$name-$layout
    if mount_ckptfs "$data/$run/global_step_1/actor" "$view" 2> "$WORK/err" &&
        cp -r "$view/$layout" "$exp" 2>> "$WORK/err" && mount_ckptfs "$exp" "$back" 2>> "$WORK/err"; then
      check "$run: $layout copied out of the mount reads back bit-identical to src/$model" \
        $PY "$check_hf" compare "$data/src/$model" "$back/hf"
      unmount_ckptfs "$back"
    else
      ok 1 "$run: $layout copied out and mounted ($(head -c 300 "$WORK/err"))"
    fi
    unmount_ckptfs "$view" 2> /dev/null
  done
else
  skip "Megatron views of a verl source need FUSE"
fi

# Broken role directories, each a copy of the W=4 FSDP2 run with one thing broken (bad_verl.py).
marker=$WORK/executed
mkdir -p "$WORK/bad"
if $PY "$TESTS_TOP/tests/lib/bad_verl.py" "$WORK/bad" "$data/fsdp2/llama-w4/global_step_1/actor" "$marker" \
    > "$WORK/cases" 2> "$WORK/err"; then
  while IFS=$'\t' read -r kind expect; do
    "$CKPTFS" inspect "$WORK/bad/$kind" > /dev/null 2> "$WORK/err" && rc=0 || rc=$?
    good=1
    [[ $rc -eq 1 && $(wc -l < "$WORK/err") -eq 1 ]] || good=0
    IFS=$'\t' read -ra subs <<< "$expect"
    for s in "${subs[@]}"; do grep -qF -- "$s" "$WORK/err" || good=0; done
    ok $((1 - good)) "$kind: inspect fails (status $rc) with one line naming the file and the problem ($(head -c 300 "$WORK/err"))"
    [[ $good -eq 1 ]] || fail_diag "wanted: $expect"
  done < "$WORK/cases"
  check "nothing in the hostile pickles ran" test ! -e "$marker"
else
  ok 1 "bad_verl.py writes the broken role directories ($(tail -c 300 "$WORK/err"))"
fi
done_testing
