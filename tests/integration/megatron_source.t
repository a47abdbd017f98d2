#!/usr/bin/env bash
# Megatron legacy checkpoints as a source: hf/ out of rank files that Megatron-LM wrote is
# bit-identical to the Hugging Face model they came from; other splits (vpp, tp4, pp4vpp2) of
# it equal the same views made from that model; round trips through exported views; broken
# checkpoints fail with one line naming the file.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
ref="$TESTS_TOP/tests/lib/reference.py"
check_hf="$TESTS_TOP/tests/lib/check_hf.py"
models="$TESTS_TOP/tests/lib/models.py"

real=$TESTDATA/megatron-core-0.17.1
mnt=$WORK/mnt-real
check "mount Megatron's own tp2pp2 legacy checkpoint" mount_ckptfs "$real/llama-tp2pp2-torch" "$mnt"
check "its hf/ tensors are bit-identical to hf-llama" $PY "$check_hf" compare "$real/hf-llama" "$mnt/hf"
check "its config.json describes the same model" $PY -c "
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
keys = ['hidden_size', 'num_attention_heads', 'num_key_value_heads', 'num_hidden_layers',
        'intermediate_size', 'vocab_size', 'tie_word_embeddings', 'rms_norm_eps', 'max_position_embeddings']
bad = [k for k in keys if a.get(k) != b.get(k)]
sys.exit(f'differ: {bad}' if bad else 0)" "$real/hf-llama/config.json" "$mnt/hf/config.json"
check "vpp2 is tp2pp2vpp2" test "$(readlink "$mnt/vpp2")" = tp2pp2vpp2
mnt2=$WORK/mnt-real-extra
check "mount with -o hf_extra=hf-llama,iteration=10" \
  mount_ckptfs "$real/llama-tp2pp2-torch" "$mnt2" -o "hf_extra=$real/hf-llama,iteration=10"
check "hf_extra: config.json, tokenizer.json, generation_config.json passed through" bash -c \
  "cmp '$real/hf-llama/config.json' '$mnt2/hf/config.json' && cmp '$real/hf-llama/tokenizer.json' '$mnt2/hf/tokenizer.json' && cmp '$real/hf-llama/generation_config.json' '$mnt2/hf/generation_config.json'"
check "hf_extra: tensors still bit-identical" $PY "$check_hf" compare "$real/hf-llama" "$mnt2/hf"
check "hf_arch=mistral: config.json says MistralForCausalLM" bash -c \
  "'$CKPTFS' cat '$real/llama-tp2pp2-torch' hf/config.json -o hf_arch=mistral | grep -q MistralForCausalLM"
"$CKPTFS" inspect "$real/llama-tp2pp2-torch" -o iteration=5 > /dev/null 2> "$WORK/err" && rc=0 || rc=1
[[ $rc -eq 1 ]] && grep -q iter_0000005 "$WORK/err"; ok $? "iteration=5 (absent) fails naming iter_0000005"
for l in tp1pp4vpp2 tp2pp2vpp2 tp4pp1 tp1pp1; do
  check "its $l/ equals the reference split of hf-llama; forward matches HF" \
    $PY "$ref" check "$real/hf-llama" "$mnt/$l" "$l"
done

# Round trips: HF -> exported layout -> mounted as a source -> hf/ and other layouts.
for a in llama qwen2 qwen3; do $PY "$models" write $a "$WORK/$a"; done
for case in "llama tp2pp2 crc32=compute" "llama tp2pp2vpp2 " "qwen2 tp4pp1 " "qwen3 tp2pp2 spec=local" \
            "llama tp1pp3 pp_first=2,pp_last=2"; do
  read -r a layout opts <<< "$case"
  exp=$WORK/exp-$a-$layout
  check "$a: export $layout ${opts}" "$CKPTFS" export "$WORK/$a" "$layout" "$exp" ${opts:+-o "$opts"}
  mnt=$WORK/mnt-$a-$layout
  check "$a $layout: the export mounts as a source" mount_ckptfs "$exp" "$mnt"
  check "$a $layout: its hf/ tensors are bit-identical to the original" \
    $PY "$check_hf" compare "$WORK/$a" "$mnt/hf"
  for l in tp1pp4vpp2 tp4pp1; do
    check "$a $layout -> $l: equals the reference split of the original; forward matches" \
      $PY "$ref" check "$WORK/$a" "$mnt/$l" "$l"
  done
done

# -o hf_arch naming an architecture without what the checkpoint has: refused by name, not
# served by a model that would compute without it.
for case in "qwen2 tp4pp1 llama add_qkv_bias" "qwen3 tp2pp2 mistral qk_layernorm" "qwen3 tp2pp2 phi3 qk_layernorm"; do
  read -r a layout arch arg <<< "$case"
  "$CKPTFS" inspect "$WORK/exp-$a-$layout" -o hf_arch=$arch > "$WORK/out" 2> "$WORK/err" && rc=0 || rc=1
  [[ $rc -eq 1 ]] && grep -q "option hf_arch: $arch has no .*args.$arg is true" "$WORK/err"
  ok $? "$a $layout with -o hf_arch=$arch: refused naming args.$arg ($(head -c 200 "$WORK/err"))"
done

# Phi-3 round trips: the rank files hold the Llama keys (linear_qkv, linear_fc1); hf/ of the
# export must give back the fused self_attn.qkv_proj / mlp.gate_up_proj, bit-identical.
a=phi3
$PY "$models" write $a "$WORK/$a"
for case in "tp2pp2 " "tp2pp2vpp2 spec=local"; do
  read -r layout opts <<< "$case"
  exp=$WORK/exp-$a-$layout
  check "$a: export $layout ${opts}" "$CKPTFS" export "$WORK/$a" "$layout" "$exp" ${opts:+-o "$opts"}
  mnt=$WORK/mnt-$a-$layout
  check "$a $layout: the export mounts as a source" mount_ckptfs "$exp" "$mnt"
  check "$a $layout: its hf/ tensors are bit-identical to the original (fused names)" \
    $PY "$check_hf" compare "$WORK/$a" "$mnt/hf"
  check "$a $layout: its hf/config.json names Phi3ForCausalLM" \
    grep -q '"Phi3ForCausalLM"' "$mnt/hf/config.json"
  for l in tp1pp4vpp2 tp4pp1; do
    check "$a $layout -> $l: equals the reference split of the original; forward matches" \
      $PY "$ref" check "$WORK/$a" "$mnt/$l" "$l"
  done
done
# Rank files without args (megatron_args=off): the architecture comes from the config given.
exp=$WORK/exp-$a-noargs
check "$a: export tp2pp1 with megatron_args=off" "$CKPTFS" export "$WORK/$a" tp2pp1 "$exp" -o megatron_args=off
check "$a: with -o hf_extra=<the HF dir> it mounts" mount_ckptfs "$exp" "$WORK/mnt-$a-noargs" -o "hf_extra=$WORK/$a"
check "$a: its hf/ tensors are bit-identical to the original (fused names)" \
  $PY "$check_hf" compare "$WORK/$a" "$WORK/mnt-$a-noargs/hf"
# Megatron's own rank files carry no hf_architecture in args (ckptfs's views add it): a
# Megatron-trained Phi-3 gets its fused Hugging Face names with -o hf_arch=phi3.
exp=$WORK/exp-$a-megatron-args
cp -r "$WORK/exp-$a-tp2pp2" "$exp"
check "$a: drop args.hf_architecture from the tp2pp2 rank files (torch.save)" $PY - "$exp/release" <<'PY'
import os, sys, torch
for rank in sorted(os.listdir(sys.argv[1])):
    path = os.path.join(sys.argv[1], rank, "model_optim_rng.pt")
    sd = torch.load(path, map_location="cpu")
    del sd["args"].hf_architecture
    torch.save(sd, path)
PY
mkdir -p "$WORK/mnt-$a-megatron-args"
check "$a: they mount with -o hf_arch=phi3" mount_ckptfs "$exp" "$WORK/mnt-$a-megatron-args" -o hf_arch=phi3
check "$a: its hf/ tensors are bit-identical to the original (fused names)" \
  $PY "$check_hf" compare "$WORK/$a" "$WORK/mnt-$a-megatron-args/hf"
mkdir -p "$WORK/mnt-$a-megatron-extra"
check "$a: or with -o hf_extra=<the HF dir> (its config.json names the architecture)" \
  mount_ckptfs "$exp" "$WORK/mnt-$a-megatron-extra" -o "hf_extra=$WORK/$a"
check "$a: its hf/ tensors are bit-identical to the original (fused names)" \
  $PY "$check_hf" compare "$WORK/$a" "$WORK/mnt-$a-megatron-extra/hf"
# Megatron-LM's linear rope interpolation is read for Gemma 3 only (its full-attention layers'
# scaling): elsewhere hf/ would lose it, so the source is refused naming the argument.
exp=$WORK/exp-$a-interpolated
cp -r "$WORK/exp-$a-tp2pp2" "$exp"
check "$a: set args.rotary_seq_len_interpolation_factor 4 in the tp2pp2 rank files (torch.save)" $PY - "$exp/release" <<'PY'
import os, sys, torch
for rank in sorted(os.listdir(sys.argv[1])):
    path = os.path.join(sys.argv[1], rank, "model_optim_rng.pt")
    sd = torch.load(path, map_location="cpu")
    sd["args"].rotary_seq_len_interpolation_factor = 4
    torch.save(sd, path)
PY
"$CKPTFS" inspect "$exp" > "$WORK/err" 2>&1
grep -q "args.rotary_seq_len_interpolation_factor 4: linear rope scaling is read for Gemma 3's full-attention layers only, not for Phi3ForCausalLM" "$WORK/err"
ok $? "$a: the interpolated copy is refused naming args.rotary_seq_len_interpolation_factor" || sed 's/^/# /' "$WORK/err" >&2

# An uneven source (pp3 with 2 layers on the first and last stages) keeps its stage sizes for
# layouts with 3 stages only: any other split of the 8 layers is even unless -o pp_first/pp_last.
mnt=$WORK/mnt-llama-tp1pp3
check "uneven pp3 source -> tp2pp2: even stages; equals the reference split" \
  $PY "$ref" check "$WORK/llama" "$mnt/tp2pp2" tp2pp2
check "uneven pp3 source -> tp2pp3: the source's own stages (2, 4, 2)" \
  $PY "$ref" check "$WORK/llama" "$mnt/tp2pp3" tp2pp3 --pp-first 2 --pp-last 2
mnt=$WORK/mnt-llama-tp1pp3-opts
check "with -o pp_first=1,pp_last=3 the options win" \
  mount_ckptfs "$WORK/exp-llama-tp1pp3" "$mnt" -o pp_first=1,pp_last=3
check "  tp1pp4 has stages 1, 2, 2, 3; equals the reference split" \
  $PY "$ref" check "$WORK/llama" "$mnt/tp1pp4" tp1pp4 --pp-first 1 --pp-last 3

# Rank files without args: sizes from the config given with -o hf_extra (or hf_config).
noargs=$WORK/exp-noargs
check "export tp2pp2vpp2 with megatron_args=off" "$CKPTFS" export "$WORK/qwen2" tp2pp2vpp2 "$noargs" -o megatron_args=off
"$CKPTFS" inspect "$noargs" > /dev/null 2> "$WORK/err" && rc=0 || rc=1
[[ $rc -eq 1 ]] && grep -q "hf_config" "$WORK/err"; ok $? "without args and no config: fails saying to give one"
mnt=$WORK/mnt-noargs
check "with -o hf_extra=<the HF dir> it mounts" mount_ckptfs "$noargs" "$mnt" -o "hf_extra=$WORK/qwen2"
check "its hf/ tensors are bit-identical to the original" $PY "$check_hf" compare "$WORK/qwen2" "$mnt/hf"
check "its tp2pp1/ equals the reference split; forward matches" $PY "$ref" check "$WORK/qwen2" "$mnt/tp2pp1" tp2pp1

# Rank files written by torch.save itself (torch 1.13: no record alignment), carrying
# optimizer, RNG state with numpy arrays, BytesIO and uint8 _extra_state, shared storages.
resaved=$WORK/resaved
cp -r "$WORK/exp-llama-tp2pp2vpp2" "$resaved"
check "resave the tp2pp2vpp2 export with torch.save and training state" \
  $PY "$TESTS_TOP/tests/lib/resave_megatron.py" "$resaved/release"
mnt=$WORK/mnt-resaved
check "the torch.save'd checkpoint mounts" mount_ckptfs "$resaved" "$mnt"
check "its hf/ tensors are bit-identical to the original" $PY "$check_hf" compare "$WORK/llama" "$mnt/hf"
check "its tp4pp1/ equals the reference split; forward matches" \
  $PY "$ref" check "$WORK/llama" "$mnt/tp4pp1" tp4pp1

# Broken checkpoints.
good=$WORK/exp-llama-tp2pp2
bad=$WORK/bad
cp -r "$good" "$bad-hole"; rm -r "$bad-hole/release/mp_rank_01_001"
cp -r "$good" "$bad-tracker"; printf 42 > "$bad-tracker/latest_checkpointed_iteration.txt"
cp -r "$good" "$bad-trunc"; f=$bad-trunc/release/mp_rank_00_001/model_optim_rng.pt; truncate -s 1000 "$f"
cp -r "$good" "$bad-notzip"; head -c 4096 /dev/urandom > "$bad-notzip/release/mp_rank_01_000/model_optim_rng.pt"
cp -r "$good" "$bad-shape"
$PY - "$bad-shape/release/mp_rank_00_000/model_optim_rng.pt" <<'PY'
import sys, torch
sd = torch.load(sys.argv[1])
sd["model"]["decoder.layers.1.mlp.linear_fc2.weight"] = torch.zeros(64, 40, dtype=torch.bfloat16)
sd["model"]["decoder.layers.0.mlp.surprise.weight"] = torch.zeros(2, dtype=torch.bfloat16)
torch.save(sd, sys.argv[1])
PY
cp -r "$good" "$bad-extra"
$PY - "$bad-extra/release/mp_rank_00_000/model_optim_rng.pt" <<'PY'
import sys, torch
sd = torch.load(sys.argv[1])
sd["model"]["decoder.layers.0.mlp.surprise.weight"] = torch.zeros(2, dtype=torch.bfloat16)
torch.save(sd, sys.argv[1])
PY
cp -r "$WORK/exp-llama-tp2pp2vpp2" "$bad-transposed"
$PY "$TESTS_TOP/tests/lib/resave_megatron.py" "$bad-transposed/release" --transposed
cp -r "$good" "$bad-deflate"
$PY - "$bad-deflate/release/mp_rank_01_001/model_optim_rng.pt" <<'PY'
import sys, zipfile
path = sys.argv[1]
with zipfile.ZipFile(path) as z:
    items = [(i.filename, z.read(i.filename)) for i in z.infolist()]
with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
    for name, data in items:
        z.writestr(name, data)
PY
cp -r "$good" "$bad-dupkey"
$PY - "$bad-dupkey/release/mp_rank_00_000/model_optim_rng.pt" <<'PY'
import pickle, sys, zipfile
path = sys.argv[1]
with zipfile.ZipFile(path) as z:
    items = [(i.filename, z.read(i.filename)) for i in z.infolist()]
name, pkl = next((n, d) for n, d in items if n.endswith("data.pkl"))
key = b"embedding.word_embeddings.weight"
# Repeat the first model entry: BINUNICODE key ... is followed by its value; duplicate the key
# with a None value right after the model's MARK.
at = pkl.index(pickle.BINUNICODE + len(key).to_bytes(4, "little") + key)
pkl = pkl[:at] + pickle.BINUNICODE + len(key).to_bytes(4, "little") + key + pickle.NONE + pkl[at:]
with zipfile.ZipFile(path, "w") as z:
    for n, d in items:
        z.writestr(n, pkl if n == name else d)
PY
for case in "deflate|mp_rank_01_001|compressed" "dupkey|embedding.word_embeddings.weight|twice" \
            "hole|mp_rank_01_001|missing" "tracker|iter_0000042|does not exist" \
            "trunc|mp_rank_00_001|zip" "notzip|mp_rank_01_000|not a zip" \
            "shape|linear_fc2.weight|shape" "extra|surprise.weight|unexpected" \
            "transposed|model_optim_rng.pt|not row-major"; do
  IFS='|' read -r kind w1 w2 <<< "$case"
  mkdir -p "$WORK/m-$kind"
  "$CKPTFS" mount "$bad-$kind" "$WORK/m-$kind" 2> "$WORK/err" && rc=0 || rc=$?
  [[ $rc -ne 0 && $(wc -l < "$WORK/err") -eq 1 ]] && grep -qF -- "$w1" "$WORK/err" && grep -qF -- "$w2" "$WORK/err"
  ok $? "$kind: mount fails with one line naming $w1 ($(head -c 220 "$WORK/err"))"
done
done_testing
