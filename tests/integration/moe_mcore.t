#!/usr/bin/env bash
# mcore/ of mixture-of-experts models: the torch_dist checkpoint Megatron-core's
# sharded_state_dict describes. Every layer MoE (Mixtral, and the Qwen2-MoE of the test data):
# layer keys stacked, experts on a second axis ([L, E, 2F, H]); dense layers among MoE layers
# (Qwen2-MoE / Qwen3-MoE with mlp_only_layers): per-layer keys with the global index and no
# layer axis. Checked against an independent numpy expectation (moe_dcp_check.py) with torch
# 2.6's torch.distributed.checkpoint and torch 1.13, against the checkpoint Megatron wrote
# itself (mixtral-tp1pp2ep2-torch_dist: same keys, shapes, chunks the same or finer), and for
# read amplification of (TP, EP) loaders.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
models="$TESTS_TOP/tests/lib/models.py"
moe="$TESTS_TOP/tests/lib/moe_dcp_check.py"
torch2_available && have2=1 || have2=0
[[ $have2 -eq 1 ]] || diag "torch 2.6 checks skipped: $TORCH2_WHY"

real=$TESTDATA/megatron-core-0.17.1

# Sources: name -> HF directory.
declare -A src
src[mixtral]=$real/hf-mixtral          # every layer MoE
src[qwen2_moe_all]=$real/hf-qwen2_moe  # every layer MoE, shared expert with a gate
order=(mixtral qwen2_moe_all)
# Dense layers among MoE layers: qwen2_moe layer 1 dense (shared expert), qwen3_moe layer 0
# dense (q/k norms).
for a in qwen2_moe qwen3_moe; do
  if $PY "$models" write $a "$WORK/$a" --shards 2 >/dev/null 2>&1 &&
     $PY -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1])).get("mlp_only_layers") else 1)' "$WORK/$a/config.json"; then
    src[$a]=$WORK/$a
    order+=($a)
  else
    skip "$a: models.py writes no $a with dense layers"
  fi
done

for a in "${order[@]}"; do
  hf=${src[$a]}
  for spec in te local; do
    mnt=$WORK/mnt-$a-$spec
    opts=()
    [[ $spec == local ]] && opts=(-o spec=local)
    check "$a ($spec spec): mount" mount_ckptfs "$hf" "$mnt" "${opts[@]}"
    rel=$mnt/mcore/release
    check "$a ($spec): mcore/ has the tracker and release/ with metadata.json, common.pt, .metadata, .distcp" bash -c \
      "[[ \$(cat '$mnt/mcore/latest_checkpointed_iteration.txt') == release ]] && cd '$rel' && ls -A | grep -qx .metadata && ls | grep -qx common.pt && ls | grep -qx metadata.json && ls | grep -q '^__0_0.distcp$'"
    check "$a ($spec): torch 1.13 (host) loads every chunk; the tensors are the expected MoE keys" \
      $PY "$moe" host "$rel" "$hf" --spec $spec
    if [[ $have2 -eq 1 ]]; then
      check "$a ($spec): dcp.load (torch 2.6) gives every expected key, shape and value; _extra_state objects; MoE args" \
        torch2_python "$WORK:$hf" "$moe" load "$rel" "$hf" --spec $spec
    else
      skip "$a ($spec): torch 2.6 load ($TORCH2_WHY)"
    fi
  done
  rel=$WORK/mnt-$a-te/mcore/release
  if [[ $have2 -eq 1 ]]; then
    # Loading the experts alone (stacked, or one layer's).
    key=decoder.layers.mlp.experts.experts.linear_fc1.weight
    [[ $a == qwen2_moe || $a == qwen3_moe ]] && key=decoder.layers.2.mlp.experts.experts.linear_fc1.weight
    [[ $a == qwen2_moe_all ]] ||
      check "$a: loading only $key works" torch2_python "$WORK:$hf" "$moe" load "$rel" "$hf" --keys $key
    # (TP, EP) loaders with Megatron's default expert TP (= TP), and TP 2 with expert TP 1.
    out=$(torch2_python "$WORK:$hf" "$moe" share "$rel" --loaders 1x2,2x2,1x4,2x4,2x2x1 --hf "$hf" --bound 1.25 2>&1)
    for l in "1 2 1" "2 2 2" "1 4 1" "2 4 2" "2 2 1"; do
      set -- $l
      line=$(grep "^RESULT tp $1 ep $2 etp $3:" <<< "$out")
      [[ $line == *" ok" ]]
      ok $? "$a: each rank of a TP-$1 EP-$2 (expert TP $3) loader reads at most 1.25x its share ($(sed -n 's/.*\(max ratio [0-9.]*\).*/\1/p' <<< "$line"))"
      [[ -n $line ]] || printf '%s\n' "$out" | tail -5 | sed 's/^/# /'
    done
  else
    skip "$a: torch 2.6 partial loads and read amplification ($TORCH2_WHY)"
  fi
  check "$a: cp -r mcore equals ckptfs export mcore" bash -c \
    "cp -r '$WORK/mnt-$a-te/mcore' '$WORK/cp-$a' && '$CKPTFS' export '$hf' mcore '$WORK/exp-$a' >/dev/null && diff -r '$WORK/cp-$a' '$WORK/exp-$a'"
  # Round trip: the exported mcore/ as a torch_dist source gives the HF model back.
  if mount_ckptfs "$WORK/exp-$a" "$WORK/mnt-$a-back" -o "hf_extra=$hf"; then
    check "$a: exported mcore/ mounted as a source: hf/ bit-identical to the HF model" \
      $PY "$TESTS_TOP/tests/lib/check_hf.py" compare "$hf" "$WORK/mnt-$a-back/hf"
  else
    ok 1 "$a: exported mcore/ mounts as a source"
  fi
done

# --- against the checkpoint Megatron-core wrote itself (local spec, tp1pp2ep2) ---
if [[ $have2 -eq 1 ]]; then
  td=$real/mixtral-tp1pp2ep2-torch_dist/iter_0000010
  check "the checker's expectation is what Megatron's own mixtral torch_dist holds (every tensor bit-identical, local spec)" \
    torch2_python "$WORK:$real" "$moe" load "$td" "$real/hf-mixtral" --spec local --megatron
  check "mixtral mcore/ -o spec=local: Megatron's key set, global shapes, chunks the same or finer, its _extra_state objects" \
    torch2_python "$WORK:$real" "$moe" compare-real "$WORK/mnt-mixtral-local/mcore/release" "$td"
  out=$(torch2_python "$WORK:$real" "$moe" compare-real "$WORK/mnt-mixtral-te/mcore/release" "$td" 2>&1)
  [[ $out == *"only here ['decoder.layers.pre_mlp_layernorm.weight'], only in the real one ['decoder.layers.mlp.linear_fc1.layer_norm_weight']"* ]]
  ok $? "mixtral mcore/ (TE spec) differs from the local-spec save only by the pre-MLP norm's name"
else
  skip "comparison with Megatron's own MoE torch_dist needs torch 2.6 ($TORCH2_WHY)"
fi

done_testing
