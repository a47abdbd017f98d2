#!/usr/bin/env bash
# DeepSpeed ZeRO checkpoints (stages 1, 2 and 3; 2 and 3 ranks, so the partitions are padded) as
# sources. DeepSpeed itself does not run here (its imports need packages the test roots lack):
# tests/lib/deepspeed_zero.py writes checkpoint-10/ (config.json, latest, global_step10/) the way
# its save code does, step by step, from tiny Llamas built by transformers 5 in the sid root,
# with frozen parameters (stages 2, 3), a head tied to the embedding (shared_params) and one
# saved inside an OpenRLHF-style Actor (names under "model.", served without it). hf/ is
# checked against a reference merge (zero_to_fp32's reconstruction, written again in plain
# torch from its code) and transformers' logits of the original model, bf16 and fp32;
# tp2pp2/ and mcore/ are byte for byte those of the model saved by save_pretrained; broken
# copies are refused naming the file and the problem.
source "$(dirname "$0")/../lib/common.sh"
source "$(dirname "$0")/../lib/trainer_checks.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/deepspeed_zero.py"
models=$WORK/models
mkdir -p "$models"

sid_python "$WORK" "$script" build "$models" > "$WORK/built" 2> "$WORK/build.err"
ok $? "the checkpoints are written as DeepSpeed saves them" || tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2

merges=()
while read -r state name; do
  [[ $state == built ]] && merges+=("$models/$name/checkpoint-10" "$models/$name-merged.safetensors")
done < "$WORK/built"
sid_python "$WORK" "$script" merge "${merges[@]}" 2> "$WORK/merge.err"
ok $? "the reference merges ran ($((${#merges[@]} / 2)) checkpoints)" || tail -n 5 "$WORK/merge.err" | sed 's/^/# /' >&2

checks=()
while read -r state name; do
  [[ $state == built ]] || continue
  src=$models/$name/checkpoint-10 ref=$models/$name-ref
  stage=${name:1:1} world=${name:4:1}
  [[ -f $models/$name-merged.safetensors ]]
  ok $? "$name: the reference merge wrote its tensors"
  "$CKPTFS" inspect "$src" > "$WORK/inspect" 2>&1
  grep -q "^found: *DeepSpeed ZeRO stage $stage checkpoint global_step10 (named by latest): saved by $world ranks (\(bf16_\)\?zero_pp_rank_\*), [0-9]* param groups; fp32 master weights of [0-9]* tensors ([0-9]* elements) stored as F32" "$WORK/inspect"
  ok $? "$name: inspect names the trainer, the stage, the world size and the stored type" || sed 's/^/# /' "$WORK/inspect" >&2
  if [[ $name == *-actor ]]; then
    grep -q "names under a wrapper's \"model.\" served without it" "$WORK/inspect"
    ok $? "$name: inspect says the wrapper's \"model.\" is taken off the names" || sed 's/^/# /' "$WORK/inspect" >&2
  fi
  for dtype in bf16 fp32; do
    mnt=$WORK/mnt-$name-$dtype refmnt=$WORK/ref-$name-$dtype
    opts=()
    [[ $dtype == fp32 ]] && opts=(-o dtype=fp32)
    views_match "$name" "$src" "$ref" "$mnt" "$refmnt" "$dtype" "tp2pp2 mcore" -- "${opts[@]}" || continue
    checks+=("$models/$name-merged.safetensors" "$mnt/hf" "$dtype" "$ref")
  done
done < "$WORK/built"

if ((${#checks[@]})); then
  report_checks "$script" 4 "weights and logits" "${checks[@]}"
fi

# global_step10/ given itself: the same weights (config.json from the directory above).
if grep -qx "built z3-w3" "$WORK/built"; then
  src=$models/z3-w3/checkpoint-10
  a=$("$CKPTFS" ls "$src" hf 2>&1) b=$("$CKPTFS" ls "$src/global_step10" hf 2>&1)
  [[ -n $a && $a == "$b" ]]
  ok $? "global_step10/ given itself serves the hf/ of checkpoint-10/ ($(tr '\n' ' ' <<< "$b"))"
fi

# Broken copies: refused at mount, naming the file and the problem.
bad=$models/bad
sid_python "$WORK" "$script" hostile "$models" > /dev/null 2> "$WORK/hostile.err"
ok $? "the broken copies are written" || tail -n 20 "$WORK/hostile.err" | sed 's/^/# /' >&2
g=checkpoint-10/global_step10
while IFS='|' read -r what expect; do
  out=$("$CKPTFS" inspect "$bad/$what/checkpoint-10" 2>&1)
  status=$?
  [[ $status -ne 0 ]] && grep -qF -- "$expect" <<< "$out"
  ok $? "$what: refused: $expect" || echo "# got ($status): ${out:0:400}" >&2
done <<EOF2
missing-rank|$bad/missing-rank/$g/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt: missing (
extra-rank|$bad/extra-rank/$g/zero_pp_rank_2_mp_rank_00_optim_states.pt: rank 2 of a world of 2
partition-sizes|$bad/partition-sizes/$g/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt: single_partition_of_fp32_groups[0] holds
z3-partition-sizes|$bad/z3-partition-sizes/$g/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt: fp32_flat_groups[0] holds
padding-lies|$bad/padding-lies/$g/mp_rank_00_model_states.pt: param group 0: param_shapes take
z3-shapes-lie|$bad/z3-shapes-lie/$g/zero_pp_rank_0_mp_rank_00_model_states.pt: param_shapes need more than
world-disagrees|$bad/world-disagrees/$g/mp_rank_00_model_states.pt: dp_world_size 4 disagrees with partition_count 2
z3-missing-model-states|$bad/z3-missing-model-states/$g/zero_pp_rank_2_mp_rank_00_model_states.pt: missing
latest-names-nothing|$bad/latest-names-nothing/checkpoint-10/global_step99: missing (the tag directory
latest-not-a-name|$bad/latest-not-a-name/checkpoint-10/latest: '../elsewhere' is not the name of a tag directory beside it
latest-too-big|$bad/latest-too-big/checkpoint-10/latest: unreadable or over 4096 bytes
EOF2
done_testing
