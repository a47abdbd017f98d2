#!/usr/bin/env bash
# Megatron-core views of Hugging Face sources: every rank file of many layouts loaded with
# torch 1.13 (host) and torch 2.6 (weights_only=True, mmap=True), checked key by key and tensor
# by tensor against an independent reference split, plus forward equivalence of the per-rank
# files against a Hugging Face forward pass; and equality with files Megatron-LM itself wrote.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
models="$TESTS_TOP/tests/lib/models.py"
ref="$TESTS_TOP/tests/lib/reference.py"
for a in llama qwen2 qwen3 mistral; do $PY "$models" write $a "$WORK/$a" --shards 2; done
torch2_available && have2=1 || have2=0

# check_layouts ARCH "OPTIONS" "REFERENCE ARGS" LAYOUT...
check_layouts() {
  local arch=$1 opts=$2 rargs=$3 mnt
  shift 3
  mnt=$WORK/mnt-$arch-$(echo "$opts" | tr ',=' '__')
  if ! mount_ckptfs "$WORK/$arch" "$mnt" ${opts:+-o "$opts"}; then
    ok 1 "$arch -o $opts: mount"
    return
  fi
  for l in "$@"; do
    # shellcheck disable=SC2086
    check "$arch $l ${opts:-default}: torch 1.13 loads, tensors = reference, forward = HF" \
      $PY "$ref" check "$WORK/$arch" "$mnt/$l" "$l" $rargs
    if ((have2)); then
      # shellcheck disable=SC2086
      check "$arch $l ${opts:-default}: torch 2.6 weights_only+mmap loads, same checks" \
        torch2_python "$WORK" "$ref" check "$WORK/$arch" "$mnt/$l" "$l" $rargs --torch2
    fi
  done
}

check_layouts llama "" "" tp1pp1 tp2pp1 tp4pp1 tp1pp2 tp2pp2 tp1pp4vpp2 tp2pp2vpp2 tp8pp1
check_layouts llama "spec=local" "--spec local" tp2pp2 tp1pp4vpp2
check_layouts llama "pp_first=2,pp_last=2" "--pp-first 2 --pp-last 2" tp2pp3 tp1pp3vpp2 tp1pp4
check_layouts llama "megatron_args=off" "--no-args" tp2pp1
check_layouts qwen2 "" "" tp2pp1 tp1pp2 tp2pp2vpp2
check_layouts qwen2 "spec=local" "--spec local" tp2pp1
check_layouts qwen3 "" "" tp2pp2 tp4pp1
check_layouts qwen3 "spec=local" "--spec local" tp1pp4vpp2
check_layouts mistral "vocab_pad=last" "--vocab-pad last" tp2pp1 tp2pp2

# The same rank files Megatron-LM wrote for the same model (Megatron-core 0.17.1, local spec).
real=$TESTDATA/megatron-core-0.17.1
if ((!have2)); then
  skip "Megatron-written checkpoints need torch 2.6: $TORCH2_WHY"
else
  mnt=$WORK/mnt-real
  mount_ckptfs "$real/hf-llama" "$mnt" -o spec=local
  check "tp2pp2 spec=local equals Megatron's own save_checkpoint output, key order included" \
    torch2_python "$WORK:$real" "$TESTS_TOP/tests/lib/compare_megatron.py" \
    "$real/llama-tp2pp2-torch/iter_0000010" "$mnt/tp2pp2/release"
fi

# Names, files, tools.
mnt=$WORK/mnt-llama-
check "tp2 is a link to tp2pp1" test "$(readlink "$mnt/tp2")" = tp2pp1
check "files through tp2/ equal tp2pp1/" diff -r "$mnt/tp2/" "$mnt/tp2pp1/"
check "an unlisted layout opens by name (tp2pp4vpp2)" test -f "$mnt/tp2pp4vpp2/release/mp_rank_01_003/model_optim_rng.pt"
ls "$mnt/tp3pp1" > /dev/null 2>&1 && rc=0 || rc=1
ok $((1 - rc)) "tp3pp1 (8 heads, 2 KV heads) does not exist"
"$CKPTFS" inspect "$WORK/llama" --layout tp3pp1 > /dev/null 2> "$WORK/err" && rc=0 || rc=1
ok $((1 - rc)) "inspect --layout tp3pp1 fails"
check "and says why" grep -q "tp 3 neither divides nor is a multiple of the 2 query groups" "$WORK/err"
check "export of tp2pp2 equals cp -r of the mounted view" bash -c \
  "'$CKPTFS' export '$WORK/llama' tp2pp2 '$WORK/exp' && cp -r '$mnt/tp2pp2' '$WORK/cp' && diff -r '$WORK/exp' '$WORK/cp'"
f=tp2pp2/release/mp_rank_01_001/model_optim_rng.pt
check "cat equals the mounted file" cmp <("$CKPTFS" cat "$WORK/llama" "$f") "$mnt/$f"
pids=()
for i in 1 2 3 4; do
  for r in 00_000 01_000 00_001 01_001; do
    $PY "$TESTS_TOP/tests/lib/check_hf.py" random-reads "$mnt/tp2pp2/release/mp_rank_$r/model_optim_rng.pt" \
      "$WORK/exp/release/mp_rank_$r/model_optim_rng.pt" 100 &
    pids+=($!)
  done
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
ok $rc "4 concurrent readers x every tp2pp2 rank file: random reads equal the export"

# crc32=compute gives archives that zipfile and unzip verify; the default CRC 0 does not.
mnt=$WORK/mnt-crc
mount_ckptfs "$WORK/qwen2" "$mnt" -o crc32=compute
check "crc32=compute: zipfile.testzip finds no bad CRC" $PY -c \
  "import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); sys.exit(z.testzip() is not None)" "$mnt/tp2pp2/release/mp_rank_00_001/model_optim_rng.pt"
check "crc32=compute: unzip -t passes" bash -c "command -v unzip >/dev/null || exit 0; unzip -tq '$mnt/tp2pp2/release/mp_rank_00_001/model_optim_rng.pt'"
check "crc32=compute: tensors unchanged" $PY "$ref" check "$WORK/qwen2" "$mnt/tp2pp2" tp2pp2
$PY -c "import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); sys.exit(z.testzip() is None)" \
  "$WORK/mnt-qwen2-/tp2pp2/release/mp_rank_00_001/model_optim_rng.pt"
ok $? "default CRC 0 is what zipfile flags (the check above can fail)"

# A record of 4 GiB and more (a tp1 embedding of a 1.1M vocabulary, 4.5 GB; the source is a
# sparse file): ZIP64 sizes and offsets in the directory, loaded lazily with torch 2.6 mmap.
$PY "$TESTS_TOP/tests/lib/models.py" write-huge-vocab "$WORK/huge"
mnt=$WORK/mnt-huge
mount_ckptfs "$WORK/huge" "$mnt"
f=$mnt/tp1pp1/release/mp_rank_00/model_optim_rng.pt
check "huge record: zipfile reads the ZIP64 directory (record 0 is 4.5 GB, record 1 beyond 4 GiB)" $PY -c "
import sys, zipfile
i = zipfile.ZipFile(sys.argv[1]).infolist()
d = {x.filename: x for x in i}
sys.exit(not (d['archive/data/0'].file_size == 1100032 * 2048 * 2 and d['archive/data/1'].header_offset > 2**32))" "$f"
if [[ $have2 -eq 1 ]]; then
  cat > "$WORK/huge_load.py" <<'PY'
import argparse, sys, torch
torch.serialization.add_safe_globals([argparse.Namespace])
sd = torch.load(sys.argv[1], mmap=True, weights_only=True, map_location="cpu")["model"]
e, q = sd["embedding.word_embeddings.weight"], sd["decoder.layers.0.self_attention.linear_qkv.weight"]
ok = (tuple(e.shape) == (1100032, 2048) and e[0].float().eq(1).all() and e[1099999].float().eq(3).all()
      and e[1100000:].float().eq(0).all() and e[1:4].float().eq(0).all() and tuple(q.shape) == (3072, 2048))
sys.exit(0 if ok else "wrong tensors")
PY
  check "huge record: torch 2.6 mmap load gives the right shape, first/last rows and zero padding" \
    torch2_python "$WORK" "$WORK/huge_load.py" "$f"
else
  skip "huge record load needs torch 2.6 ($TORCH2_WHY)"
fi

# Phi-3: fused self_attn.qkv_proj = [q; k; v] and mlp.gate_up_proj = [gate; up] in the Hugging
# Face files, the same Megatron keys as Llama (linear_qkv interleaved per query group, fc1 =
# [gate; up] halves per TP rank). The reference cuts the fused tensors itself (models.unfuse)
# and its HF forward multiplies by the fused tensors as stored (modeling_phi3.py's slicing).
# 8 heads, 2 query groups: tp4/tp8 hold part of one group's block.
$PY "$models" write phi3 "$WORK/phi3" --shards 2
check "phi3: the checkpoint holds fused qkv_proj/gate_up_proj and no separate q/k/v/gate/up" $PY -c "
import sys; sys.path.insert(0, sys.argv[2])
from models import read_checkpoint
names = set(read_checkpoint(sys.argv[1]))
fused = all(f'model.layers.{i}.{n}' in names for i in range(8) for n in ('self_attn.qkv_proj.weight', 'mlp.gate_up_proj.weight'))
sep = [n for n in names if n.endswith(('.q_proj.weight', '.k_proj.weight', '.v_proj.weight', '.gate_proj.weight', '.up_proj.weight'))]
sys.exit(0 if fused and not sep else f'fused {fused}, separate {sep[:3]}')" "$WORK/phi3" "$TESTS_TOP/tests/lib"
check_layouts phi3 "" "" tp1pp1 tp2pp2 tp4pp1 tp2pp2vpp2 tp8pp1
check_layouts phi3 "spec=local" "--spec local" tp2pp1 tp1pp4vpp2
mnt=$WORK/mnt-phi3-
check "phi3: hf/ tensors are the source's, fused names included" $PY "$TESTS_TOP/tests/lib/check_hf.py" compare "$WORK/phi3" "$mnt/hf"
check "phi3: export tp2pp2 equals the mounted view" bash -c \
  "'$CKPTFS' export '$WORK/phi3' tp2pp2 '$WORK/exp-phi3' && diff -r '$WORK/exp-phi3' '$mnt/tp2pp2'"
# The reference tells q from k from v and gate from up: a checkpoint with k and v (or gate and
# up) exchanged inside the fused tensors must not pass against the views of the original.
$PY - "$WORK/phi3" "$WORK/phi3-swap" "$TESTS_TOP/tests/lib" <<'PY'
import json, os, shutil, sys
sys.path.insert(0, sys.argv[3])
from models import as_array, read_checkpoint, write_checkpoint
src, out = sys.argv[1], sys.argv[2]
cfg = json.load(open(os.path.join(src, "config.json")))
d = cfg["hidden_size"] // cfg["num_attention_heads"]
q, kv, f = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d, cfg["intermediate_size"]
for what in ("kv", "gateup"):
    t = {n: (dt, as_array((dt, shape, raw)).copy()) for n, (dt, shape, raw) in read_checkpoint(src).items()}
    for n, (dt, a) in t.items():
        if what == "kv" and n.endswith("qkv_proj.weight"):
            a[q:q + kv], a[q + kv:] = a[q + kv:].copy(), a[q:q + kv].copy()
        if what == "gateup" and n.endswith("gate_up_proj.weight"):
            a[:f], a[f:] = a[f:].copy(), a[:f].copy()
    write_checkpoint(f"{out}-{what}", t, cfg)
PY
# The command line takes the short names the mount shows as symbolic links (tp2 -> tp2pp1).
check "ls, cat and export follow a short layout name" bash -c \
  "'$CKPTFS' ls '$WORK/phi3' tp2 | grep -q 'release/mp_rank_01/model_optim_rng.pt' &&
   test \"\$('$CKPTFS' cat '$WORK/phi3' tp2/latest_checkpointed_iteration.txt)\" = release &&
   '$CKPTFS' export '$WORK/phi3' tp2 '$WORK/exp-phi3-tp2' && diff -r '$WORK/exp-phi3-tp2' '$mnt/tp2pp1'"
out=$("$CKPTFS" inspect -o pp_first=1 "$WORK/llama" --layout tp1pp2 2>&1)
[[ $out == *"first stage 1 layers, last stage $(($($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' "$WORK/llama/config.json") - 1)) layers"* ]]
ok $? "inspect --layout gives the stage sizes that follow from pp_first alone ($out)"
for what in kv gateup; do
  key=linear_qkv.weight; [[ $what == gateup ]] && key=linear_fc1.weight
  $PY "$ref" check "$WORK/phi3-swap-$what" "$mnt/tp2pp2" tp2pp2 > /dev/null 2> "$WORK/err" && rc=0 || rc=1
  [[ $rc -eq 1 ]] && grep -q "$key: values differ" "$WORK/err"
  ok $? "phi3: the reference of a $what-exchanged checkpoint rejects the original's tp2pp2 ($(head -c 120 "$WORK/err"))"
done
done_testing
