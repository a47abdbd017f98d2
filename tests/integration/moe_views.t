#!/usr/bin/env bash
# Mixture-of-experts views of Hugging Face sources: expert-parallel rank files equal to the ones
# Megatron-LM itself wrote (Mixtral and Qwen2-MoE, local spec, EP 2); layout names, the writer
# grid (ETP < TP gives a partial TP x EP grid), inspect, and invalid layouts refused with why.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
torch2_available && have2=1 || have2=0
models="$TESTS_TOP/tests/lib/models.py"
ref="$TESTS_TOP/tests/lib/moe_reference.py"

check "the MoE reference agrees with itself and with Megatron's own files (selftest)" \
  $PY "$ref" selftest --megatron-data "$TESTDATA/megatron-core-0.17.1"

# Tiny models of each family: 4 experts, top-2; Qwen2-MoE and Qwen3-MoE with a dense layer.
for a in mixtral qwen2_moe qwen3_moe; do $PY "$models" write $a "$WORK/$a" --shards 2; done
$PY "$models" write qwen3_moe "$WORK/qwen3_moe-all" --all-moe

# check_layouts SRC "OPTIONS" "REFERENCE ARGS" LAYOUT...: every rank file of each layout loaded
# by torch 1.13 and torch 2.6 (weights_only), tensor by tensor = the reference, forward = HF.
check_layouts() {
  local src=$1 opts=$2 rargs=$3 mnt
  shift 3
  mnt=$WORK/mnt-$(basename "$src")-$(echo "$opts" | tr ',=' '__')
  if ! mount_ckptfs "$WORK/$src" "$mnt" ${opts:+-o "$opts"}; then
    ok 1 "$src -o $opts: mount"
    return
  fi
  for l in "$@"; do
    # shellcheck disable=SC2086
    check "$src $l ${opts:-default}: torch 1.13 loads, tensors = reference, MoE forward = HF" \
      $PY "$ref" check "$WORK/$src" "$mnt/$l" "$l" $rargs
    if ((have2)); then
      # shellcheck disable=SC2086
      check "$src $l ${opts:-default}: torch 2.6 weights_only+mmap loads, same checks" \
        torch2_python "$WORK" "$ref" check "$WORK/$src" "$mnt/$l" "$l" $rargs --torch2
    fi
  done
}
check_layouts mixtral "" "" tp1pp1ep2 tp2pp1ep2 tp1pp2ep2 tp2pp1ep4etp1 tp1pp2vpp2ep2
check_layouts mixtral "spec=local" "--spec local" tp2pp1ep2 tp1pp2vpp2ep2 tp4pp1ep2etp1
check_layouts mixtral "moe_grouped_gemm=on" "--grouped" tp2pp1ep2 tp1pp2ep4
check_layouts qwen2_moe "" "" tp1pp1ep2 tp2pp1ep2 tp1pp2ep2 tp2pp1ep4etp1 tp1pp2vpp2ep2
check_layouts qwen2_moe "spec=local" "--spec local" tp2pp2ep2 tp2pp1ep2etp1
check_layouts qwen3_moe "" "" tp1pp1ep2 tp2pp1ep2 tp1pp2ep2 tp2pp1ep4etp1 tp1pp2vpp2ep2
check_layouts qwen3_moe "spec=local,pp_first=1,pp_last=3" "--spec local --pp-first 1 --pp-last 3" tp1pp2ep4
check_layouts qwen3_moe-all "moe_grouped_gemm=on" "--grouped" tp2pp2ep2 tp1pp4ep4etp1
# A shared expert in the weights that config.json says is not there: refused, not dropped.
for how in zero missing; do
  cp -r "$WORK/qwen2_moe" "$WORK/qwen2_moe-$how"
  $PY -c "import json, sys
p = sys.argv[1] + '/config.json'; c = json.load(open(p))
if sys.argv[2] == 'zero': c['shared_expert_intermediate_size'] = 0
else: del c['shared_expert_intermediate_size']
json.dump(c, open(p, 'w'))" "$WORK/qwen2_moe-$how" "$how"
  check "a shared expert the config says is not there ($how): the Megatron views say why" bash -c \
    "'$CKPTFS' inspect '$WORK/qwen2_moe-$how' | grep -q \"no Megatron views: tensor 'model.layers.0.mlp.shared_expert.*' is a shared expert's, but config.json's .shared_expert_intermediate_size. says the model has none\""
done
# A layer past num_hidden_layers: served by hf/, in no Megatron view, and the warning says so.
cp -r "$WORK/mixtral" "$WORK/mixtral-fewer"
layers=$($PY -c "import json, sys
p = sys.argv[1] + '/config.json'; c = json.load(open(p)); c['num_hidden_layers'] -= 1
json.dump(c, open(p, 'w')); print(c['num_hidden_layers'])" "$WORK/mixtral-fewer")
"$CKPTFS" inspect "$WORK/mixtral-fewer" > "$WORK/out" 2>&1
check "a layer config.json does not count: inspect warns that its tensors are in no Megatron view" \
  grep -q "^warning: .* tensors are in no Megatron view (config.json does not describe them): 'model.layers.$layers\." "$WORK/out"
check "  and the Megatron views are still there" grep -q "^megatron: .*rules: $layers layers" "$WORK/out"
"$CKPTFS" inspect "$WORK/mixtral" > "$WORK/out" 2>&1
check "  (the unchanged model: no such warning)" bash -c "! grep -q 'in no Megatron view' '$WORK/out'"
"$CKPTFS" inspect -o spec=local,moe_grouped_gemm=on "$WORK/mixtral" > /dev/null 2> "$WORK/err" && rc=0 || rc=1
ok $((1 - rc)) "moe_grouped_gemm=on with spec=local is refused"
check "and says why" grep -q "needs spec=te" "$WORK/err"

real=$TESTDATA/megatron-core-0.17.1

for model in mixtral qwen2_moe; do
  check "$model: mount (-o spec=local)" mount_ckptfs "$real/hf-$model" "$WORK/mnt-$model" -o spec=local
done
if ((!have2)); then
  skip "Megatron-written MoE checkpoints need torch 2.6: $TORCH2_WHY"
else
  check "mixtral tp2pp1ep2 equals Megatron's own files (keys, order, experts, _extra_state)" \
    torch2_python "$WORK:$real" "$TESTS_TOP/tests/lib/compare_megatron.py" \
    "$real/mixtral-tp2pp1ep2-torch/iter_0000010" "$WORK/mnt-mixtral/tp2pp1ep2/release"
  check "qwen2_moe tp1pp1ep2 equals Megatron's own files (shared expert and its gate included)" \
    torch2_python "$WORK:$real" "$TESTS_TOP/tests/lib/compare_megatron.py" \
    "$real/qwen2_moe-tp1pp1ep2-torch-noopt/iter_0000010" "$WORK/mnt-qwen2_moe/tp1pp1ep2/release"
fi

mnt=$WORK/mnt-mixtral
check "the root lists expert-parallel layouts" test -d "$mnt/tp2pp1ep2" -a -d "$mnt/tp1pp1ep4"
check "tp2 ep2 etp1: only mp_rank_00_000 and mp_rank_01_001, as Megatron's writer grid gives" \
  test "$(ls "$mnt/tp2pp1ep2etp1/release" | tr '\n' ' ')" = "mp_rank_00_000 mp_rank_01_001 "
check "tp1pp2ep2: mp_rank_TT_PPP_EEE" \
  test "$(ls "$mnt/tp1pp2ep2/release" | tr '\n' ' ')" = "mp_rank_00_000_000 mp_rank_00_000_001 mp_rank_00_001_000 mp_rank_00_001_001 "
check "tp4pp1ep8etp1 is refused for 4 experts" bash -c "! ls '$mnt/tp4pp1ep8etp1' 2>/dev/null"
"$CKPTFS" inspect "$real/hf-mixtral" --layout tp2pp1ep8 > /dev/null 2> "$WORK/err" && rc=0 || rc=1
ok $((1 - rc)) "inspect --layout tp2pp1ep8 fails"
check "and says why" grep -q "ep 8 does not divide the 4 experts" "$WORK/err"
"$CKPTFS" inspect "$real/hf-mixtral" --layout tp2pp1etp3 > /dev/null 2> "$WORK/err" && rc=0 || rc=1
ok $((1 - rc)) "inspect --layout tp2pp1etp3 fails"
check "and says why" grep -q "etp 3 does not divide the experts' ffn size 32" "$WORK/err"
"$CKPTFS" inspect "$real/hf-llama" --layout tp2pp1ep2 > /dev/null 2> "$WORK/err" && rc=0 || rc=1
ok $((1 - rc)) "ep on a dense model fails"
check "and says why" grep -q "the model has no experts" "$WORK/err"
check "inspect shows the experts" bash -c \
  "'$CKPTFS' inspect '$real/hf-qwen2_moe' | grep -q 'experts:      4 routed (top-2, ffn 32, weights not renormalised) in 4 of 4 layers; a gated shared expert'"
check "inspect --json has the experts" bash -c \
  "'$CKPTFS' inspect --json '$real/hf-mixtral' | $PY -c 'import json,sys; e=json.load(sys.stdin)[\"experts\"]; sys.exit(not (e[\"routed\"] == 4 and e[\"top_k\"] == 2 and e[\"renormalize\"]))'"
check "inspect --layout tp2pp1ep2etp1 counts 2 rank files" bash -c \
  "'$CKPTFS' inspect '$real/hf-mixtral' --layout tp2pp1ep2etp1 | grep -q 'ep 2 (2 experts per rank), etp 1; 2 rank files per stage'"
check "export of tp2pp1ep2 equals cp -r of the mounted view" bash -c \
  "'$CKPTFS' export -o spec=local '$real/hf-mixtral' tp2pp1ep2 '$WORK/exp' && cp -r '$mnt/tp2pp1ep2' '$WORK/cp' && diff -r '$WORK/exp' '$WORK/cp'"
# A rank file's plan is dropped when no reader holds it (a big layout's `ls -l` would keep them
# all) and built again on open: the bytes are those read while all were held, and ckptfs cat's.
check "tp2pp1ep2's rank files read again after their plans were dropped: the same bytes, and ckptfs cat's" \
  $PY - "$mnt" "$real/hf-mixtral" "$CKPTFS" <<'PY'
import os, subprocess, sys
mnt, src, ckptfs = sys.argv[1:4]
rel = sorted(os.path.relpath(os.path.join(d, f), mnt) for d, _, fs in os.walk(mnt + "/tp2pp1ep2")
             for f in fs if f == "model_optim_rng.pt")
held = [open(os.path.join(mnt, r), "rb") for r in rel]
first = [h.read() for h in held]
for h in held:
    h.close()
sizes = [os.stat(os.path.join(mnt, r)).st_size for r in rel]
again = []
for r in rel:
    with open(os.path.join(mnt, r), "rb") as f:
        again.append(f.read())
cat = [subprocess.run([ckptfs, "cat", "-o", "spec=local", src, r], capture_output=True, check=True).stdout
       for r in rel]
assert len(rel) == 4 and all(len(b) > 0 for b in first), rel
assert sizes == [len(b) for b in first], (sizes, [len(b) for b in first])
assert first == again, "read again after the drop: other bytes"
assert first == cat, "ckptfs cat: other bytes"
PY
done_testing
