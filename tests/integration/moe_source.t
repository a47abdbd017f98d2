#!/usr/bin/env bash
# Mixture-of-experts Megatron legacy checkpoints as a source: hf/ out of the rank files that
# Megatron-LM wrote with expert parallelism is bit-identical to the Hugging Face model they came
# from; round trips through ckptfs's own MoE views (ep, etp below tp, pp and vpp, both specs,
# SequentialMLP and grouped expert keys, no args); broken checkpoints fail with one line naming
# the file and the problem.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
check_hf="$TESTS_TOP/tests/lib/check_hf.py"
models="$TESTS_TOP/tests/lib/models.py"

# check_config CONFIG KEY=JSON...: config.json's members equal the JSON values.
check_config() {
  $PY - "$@" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
bad = []
for kv in sys.argv[2:]:
    k, v = kv.split("=", 1)
    if c.get(k, "absent") != json.loads(v):
        bad.append(f"{k}: {c.get(k, 'absent')!r} != {v}")
sys.exit("; ".join(bad) if bad else 0)
PY
}

real=$TESTDATA/megatron-core-0.17.1
mnt=$WORK/mnt-real-mixtral
check "mount Megatron's own Mixtral tp2pp1ep2 legacy checkpoint" \
  mount_ckptfs "$real/mixtral-tp2pp1ep2-torch" "$mnt"
check "  its hf/ tensors are bit-identical to hf-mixtral" $PY "$check_hf" compare "$real/hf-mixtral" "$mnt/hf"
check "  its config.json has Mixtral's MoE fields" check_config "$mnt/hf/config.json" \
  'architectures=["MixtralForCausalLM"]' num_local_experts=4 num_experts_per_tok=2 intermediate_size=32 \
  num_hidden_layers=4 vocab_size=250
check "  inspect says it was saved as tp2pp1ep2" bash -c \
  "'$CKPTFS' inspect '$real/mixtral-tp2pp1ep2-torch' | grep -q 'saved as tp2pp1ep2'"
mnt=$WORK/mnt-real-qwen2_moe
check "mount Megatron's own Qwen2-MoE tp1pp1ep2 legacy checkpoint (no optimizer)" \
  mount_ckptfs "$real/qwen2_moe-tp1pp1ep2-torch-noopt" "$mnt"
check "  its hf/ tensors are bit-identical to hf-qwen2_moe" $PY "$check_hf" compare "$real/hf-qwen2_moe" "$mnt/hf"
check "  its config.json has Qwen2-MoE's MoE fields" check_config "$mnt/hf/config.json" \
  'architectures=["Qwen2MoeForCausalLM"]' num_experts=4 num_experts_per_tok=2 moe_intermediate_size=32 \
  intermediate_size=96 shared_expert_intermediate_size=48 norm_topk_prob=false 'mlp_only_layers=[]'

# Round trips: an HF MoE model -> a legacy view copied out of the mount -> mounted as a source
# -> hf/ bit-identical to the model.
hf_models=()
for a in mixtral qwen2_moe qwen3_moe; do
  if $PY "$models" write $a "$WORK/hf-$a" > /dev/null 2>&1; then hf_models+=("$WORK/hf-$a"); fi
done
[[ ${#hf_models[@]} -gt 0 ]] || diag "tests/lib/models.py writes no MoE models: round trips of the test data only"
hf_models+=("$real/hf-mixtral" "$real/hf-qwen2_moe")
for model in "${hf_models[@]}"; do
  name=$(basename "$model")
  [[ $model == "$real"/* ]] && name=real-$name
  for opts in "" spec=local moe_grouped_gemm=on; do
    view=$WORK/view-$name-${opts:-te}
    check "$name: mount ${opts:+-o $opts}" mount_ckptfs "$model" "$view" ${opts:+-o "$opts"}
    for layout in tp2pp1ep2 tp1pp2ep2 tp2pp1ep2etp1 tp1pp2vpp2ep2; do
      exp=$WORK/exp-$name-$layout-${opts:-te}
      if ! cp -r "$view/$layout" "$exp" 2> "$WORK/err"; then
        ok 1 "$name $layout ${opts:-te}: cp -r from the mount ($(head -c 200 "$WORK/err"))"
        continue
      fi
      mnt=$WORK/mnt-$name-$layout-${opts:-te}
      if mount_ckptfs "$exp" "$mnt" 2> "$WORK/err"; then
        check "$name $layout ${opts:-te}: mounted as a source, hf/ is bit-identical to the model" \
          $PY "$check_hf" compare "$model" "$mnt/hf"
        unmount_ckptfs "$mnt"
      else
        ok 1 "$name $layout ${opts:-te}: mount as a source ($(head -c 300 "$WORK/err"))"
      fi
    done
    unmount_ckptfs "$view"
  done
done

if [[ ${#hf_models[@]} -gt 0 ]]; then
  model=${hf_models[0]}
  name=$(basename "$model")
  # Layouts read back without args (sizes from -o hf_extra, the split from names and shapes): a
  # name mp_rank_00_001 is an EP rank when the first file has the final norm, else a stage.
  for layout in tp1pp1ep2 tp1pp2 tp2pp2ep2etp1 tp2pp1etp1; do
    exp=$WORK/noargs-$name-$layout
    check "$name: export $layout without args" "$CKPTFS" export "$model" "$layout" "$exp" -o megatron_args=off
    mnt=$WORK/mnt-noargs-$name-$layout
    mkdir -p "$mnt"
    check "  mounted with -o hf_extra, hf/ is bit-identical to the model" bash -c \
      "'$CKPTFS' mount -o 'hf_extra=$model' '$exp' '$mnt' && $PY '$check_hf' compare '$model' '$mnt/hf'"
    check "  inspect says it was saved as $layout" bash -c \
      "'$CKPTFS' inspect -o 'hf_extra=$model' '$exp' | grep -qF 'saved as $layout)'"
    unmount_ckptfs "$mnt"
  done
fi

# Tied embeddings with pp > 1: the last stage's output_layer is the embedding's copy.
tied=$WORK/hf-qwen3_moe-tied
if $PY - "$tied" <<PY 2> /dev/null
import sys
sys.path.insert(0, "$TESTS_TOP/tests/lib")
from models import config_for, model_tensors, write_checkpoint
cfg = config_for("qwen3_moe", 4)
cfg["tie_word_embeddings"] = True
write_checkpoint(sys.argv[1], model_tensors(cfg), cfg)
PY
then
  check "tied qwen3_moe: export tp1pp2ep2" "$CKPTFS" export "$tied" tp1pp2ep2 "$WORK/exp-tied"
  mnt=$WORK/mnt-tied
  mkdir -p "$mnt"
  check "  mounted as a source, hf/ is bit-identical to the model" bash -c \
    "'$CKPTFS' mount '$WORK/exp-tied' '$mnt' && $PY '$check_hf' compare '$tied' '$mnt/hf'"
  unmount_ckptfs "$mnt" 2> /dev/null
else
  skip "tests/lib/models.py writes no qwen3_moe model"
fi

# Broken checkpoints, each made from a copy with torch.load / torch.save (bad_moe.py).
if [[ ${#hf_models[@]} -gt 0 ]]; then
  model=${hf_models[0]}
  base=$WORK/bad-base
  check "export the bases of the broken checkpoints" bash -c "
    '$CKPTFS' export '$model' tp2pp1ep2 '$base-seq' -o spec=local &&
    '$CKPTFS' export '$model' tp2pp1ep2 '$base-grouped' -o moe_grouped_gemm=on &&
    '$CKPTFS' export '$model' tp2pp1ep2etp1 '$base-etp1' -o spec=local"
  mkdir -p "$WORK/bad"
  if $PY "$TESTS_TOP/tests/lib/bad_moe.py" "$WORK/bad" "$base-seq" "$base-grouped" "$base-etp1" \
      > "$WORK/cases" 2> "$WORK/err"; then
    while IFS=$'\t' read -r kind expect; do
      mkdir -p "$WORK/m-$kind"
      "$CKPTFS" mount "$WORK/bad/$kind" "$WORK/m-$kind" 2> "$WORK/err" && rc=0 || rc=$?
      good=1
      [[ $rc -ne 0 && $(wc -l < "$WORK/err") -eq 1 ]] || good=0
      IFS=$'\t' read -ra subs <<< "$expect"
      for s in "${subs[@]}"; do grep -qF -- "$s" "$WORK/err" || good=0; done
      ok $((1 - good)) "$kind: mount fails with one line naming the file and the problem ($(head -c 300 "$WORK/err"))"
      [[ $good -eq 1 ]] || fail_diag "wanted: $expect"
      [[ $rc -eq 0 ]] && unmount_ckptfs "$WORK/m-$kind"
    done < "$WORK/cases"
  else
    ok 1 "bad_moe.py writes the broken checkpoints ($(tail -c 300 "$WORK/err"))"
  fi
else
  skip "no HF MoE model to make broken checkpoints from"
fi
done_testing
