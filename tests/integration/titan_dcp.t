#!/usr/bin/env bash
# torchtitan checkpoints as sources, written by torch 2.14's own DCP in the sid root (gloo on the
# CPU, 2 ranks). torchtitan itself cannot run here: tests/lib/titan_dcp.py writes what its
# checkpointer saves (checkpoint/step-10/: the model's entries at the top level beside the
# optimizer, lr_scheduler, dataloader and train_state states), under its parameter names and
# shapes as its state-dict adapters' from_hf makes them from a Hugging Face model (Llama 3's
# wq/wk rows permuted per head, with the rotary table freqs_cis its 0.1 release saved;
# DeepSeek-V3's experts stacked in 3-D tensors), each parameter a DTensor sharded on its first
# dim. hf/ loaded by transformers 5 gives that Hugging Face model's
# weights and logits exactly (bf16 by default, fp32 with -o dtype=fp32); tp2pp2/ and mcore/ are
# byte for byte those of the model's save_pretrained copy; broken saves are refused by name.
source "$(dirname "$0")/../lib/common.sh"
source "$(dirname "$0")/../lib/trainer_checks.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/titan_dcp.py"
models=$WORK/models bad=$WORK/bad
mkdir -p "$models" "$bad"

sid_python "$WORK" "$script" build "$models" > /dev/null 2> "$WORK/build.err"
ok $? "torch 2.14 saves the torchtitan checkpoints of a Llama 3, a Qwen3 and a DeepSeek-V3" ||
  tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2

declare -A names=([llama]="Llama 3" [qwen3]="Qwen3" [deepseek_v3]="DeepSeek-V3")
checks=()
for family in llama qwen3 deepseek_v3; do
  src=$models/$family-titan/checkpoint/step-10 ref=$models/$family-ref
  given=()
  # Qwen3's config.json is given; the others' is beside step-10/, in checkpoint/
  [[ $family == qwen3 ]] && given=(-o hf_config="$ref/config.json")
  [[ -f $src/.metadata ]] || { ok 1 "$family: no checkpoint was saved"; continue; }
  "$CKPTFS" inspect "$src" "${given[@]}" > "$WORK/inspect" 2>&1
  grep -q "^found: *torchtitan checkpoint, step 10 (${names[$family]} names): saved by 2 ranks, [0-9]* tensors in [0-9]* chunks over 2 .distcp files, stored as F32, served as [0-9]* Hugging Face tensors; $([[ $family == llama ]] && echo 8 || echo 7) other entries left unread" "$WORK/inspect"
  ok $? "$family: inspect names torchtitan, the step, the model's names, the ranks and the stored type" ||
    sed 's/^/# /' "$WORK/inspect" >&2
  for dtype in bf16 fp32; do
    mnt=$WORK/mnt-$family-$dtype refmnt=$WORK/ref-$family-$dtype
    opts=("${given[@]}")
    [[ $dtype == fp32 ]] && opts+=(-o dtype=fp32)
    views_match "$family" "$src" "$ref" "$mnt" "$refmnt" "$dtype" "tp2pp2 mcore" -- "${opts[@]}" || continue
    checks+=("$ref" "$mnt/hf" "$dtype")
  done
done

if ((${#checks[@]})); then
  report_checks "$script" 3 "logits" "${checks[@]}"
fi

# Broken saves: refused at mount, naming the file or tensor and the problem.
sid_python "$WORK" "$script" hostile "$bad" > /dev/null 2> "$WORK/hostile.err"
ok $? "torch writes the broken saves" || tail -n 20 "$WORK/hostile.err" | sed 's/^/# /' >&2
while IFS='|' read -r what expect; do
  dir=$bad/$what/checkpoint/step-10
  [[ $what == no-config ]] && dir=$bad/$what/step-10
  out=$("$CKPTFS" inspect "$dir" 2>&1)
  status=$?
  [[ $status -ne 0 ]] && grep -qF -- "$expect" <<< "$out"
  ok $? "$what: refused: $expect" || echo "# got ($status): ${out:0:400}" >&2
done <<EOF
missing-tensor|$bad/missing-tensor/checkpoint/step-10/.metadata: tensor 'model.layers.1.post_attention_layernorm.weight' is missing
odd-wq-rows|'model.layers.0.self_attn.q_proj.weight': 63 rows are not 4 heads of an even size
wrong-norm-shape|$bad/wrong-norm-shape/checkpoint/step-10/.metadata: tensor 'model.layers.0.input_layernorm.weight' has shape [65]; config.json implies [64]
extra-layer|$bad/extra-layer/checkpoint/step-10/.metadata: 'model.layers.2.
unknown-name|$bad/unknown-name/checkpoint/step-10/.metadata: 'layers.0.attention.wz.weight' is not a parameter of torchtitan's Llama 3 that ckptfs knows
qwen3-expert-bias|'layers.0.moe.expert_bias': torchtitan's load-balancing expert bias changes which experts each token is routed to
unknown-model-type|config.json's model_type 'mistral': ckptfs reads torchtitan checkpoints of llama, qwen3, qwen3_moe, deepseek_v3
no-config|$bad/no-config/step-10: a torchtitan checkpoint names no model: $bad/no-config/step-10/config.json: missing (give -o hf_config=PATH)
EOF
done_testing
