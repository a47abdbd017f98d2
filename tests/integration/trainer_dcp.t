#!/usr/bin/env bash
# Hugging Face Trainer / Accelerate FSDP checkpoints as sources, written by torch 2.14 itself in
# the sid root: a tiny Llama and a tiny Qwen3-MoE wrapped in FSDP2 across two gloo ranks on the
# CPU and saved as Accelerate's save_fsdp_model does with SHARDED_STATE_DICT (checkpoint-10/
# with config.json, pytorch_model_fsdp_0/ and optimizer_0/), the Llama also with FSDP1 and as a
# bare DCP of its state dict (and one with its head tied to the embedding). hf/ loaded by
# transformers 5 gives the original model's weights and logits exactly (bf16 by default, fp32
# with -o dtype=fp32); tp2pp1/ and mcore/ are byte for byte those of the model saved by
# save_pretrained, and torch 1.13 loads the rank files; broken copies are refused naming the
# file and the problem.
source "$(dirname "$0")/../lib/common.sh"
source "$(dirname "$0")/../lib/trainer_checks.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/trainer_dcp.py"
models=$WORK/models
mkdir -p "$models"

sid_python "$WORK" "$script" build "$models" > "$WORK/built" 2> "$WORK/build.err"
ok $? "torch 2.14 saves the checkpoints" || tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2
while read -r state name why; do
  [[ $state == built ]] && continue
  # FSDP1 on the CPU is optional: torch may refuse it there.
  if [[ $name == llama-fsdp1: ]]; then skip "FSDP1 did not run on the CPU: $why"
  else ok 1 "$name saved: $why"; fi
done < "$WORK/built"

# source NAME: the directory a user gives for it.
source_dir() {
  case $1 in
    *-bare) echo "$models/$1" ;;
    *) echo "$models/$1/checkpoint-10" ;;
  esac
}

checks=()
for name in llama-fsdp2 llama-fsdp1 llama-bare llamatied-bare qwen3_moe-fsdp2; do
  grep -qx "built $name" "$WORK/built" || continue
  src=$(source_dir "$name") ref=$models/${name%%-*}-ref
  "$CKPTFS" inspect "$src" > "$WORK/inspect" 2>&1
  case $name in
    *-bare) trainer="torch DCP of a Hugging Face state dict" ;;
    *) trainer="Hugging Face Trainer / Accelerate FSDP checkpoint, step 10 (pytorch_model_fsdp_0/)" ;;
  esac
  grep -q "^found: *$trainer: saved by $([[ $name == *-bare ]] && echo "1 rank" || echo "2 ranks"), [0-9]* tensors in [0-9]* chunks over [0-9]* .distcp files, stored as F32" "$WORK/inspect"
  ok $? "$name: inspect names the trainer, the ranks and the stored type" || sed 's/^/# /' "$WORK/inspect" >&2
  for dtype in bf16 fp32; do
    mnt=$WORK/mnt-$name-$dtype refmnt=$WORK/ref-$name-$dtype
    opts=()
    [[ $dtype == fp32 ]] && opts=(-o dtype=fp32)
    views_match "$name" "$src" "$ref" "$mnt" "$refmnt" "$dtype" "tp2pp1 mcore" -- "${opts[@]}" || continue
    "$PY" - "$mnt/tp2pp1" > "$WORK/host" 2>&1 <<'PY'
import glob, sys, torch
files = sorted(glob.glob(sys.argv[1] + "/release/mp_rank_*/model_optim_rng.pt"))
assert len(files) == 2, files
for f in files:
    sd = torch.load(f, map_location="cpu")["model"]
    tensors = [v for v in sd.values() if torch.is_tensor(v)]
    assert tensors and all(torch.isfinite(t.float()).all() for t in tensors), f
print(torch.__version__, len(files))
PY
    ok $? "$name ($dtype): torch $("$PY" -c "import torch; print(torch.__version__)" 2>/dev/null) on the host loads the tp2pp1/ rank files" ||
      tail -n 5 "$WORK/host" | sed 's/^/# /' >&2
    checks+=("$ref" "$mnt/hf" "$dtype")
  done
done

if ((${#checks[@]})); then
  report_checks "$script" 3 "logits" "${checks[@]}"
fi

# -o hf_config: the given config.json is the one served, over the checkpoint's (fp32 and saying
# so: hf/ passes it through unchanged); without any config hf/ still serves the weights.
if grep -qx "built llama-fsdp2" "$WORK/built"; then
  src=$models/llama-fsdp2/checkpoint-10
  "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1])); c.update(torch_dtype="float32", dtype="float32", given_here=True); json.dump(c, open(sys.argv[2], "w"), indent=2)' \
    "$src/config.json" "$WORK/given.json"
  if mount_ckptfs "$src" "$WORK/mnt-given" -o dtype=fp32,hf_config="$WORK/given.json" 2> "$WORK/err"; then
    cmp "$WORK/given.json" "$WORK/mnt-given/hf/config.json"
    ok $? "-o hf_config: hf/config.json is the given file"
    unmount_ckptfs "$WORK/mnt-given"
  else
    ok 1 "-o hf_config: mount: $(head -c 300 "$WORK/err")"
  fi
  mkdir -p "$WORK/no-config"
  cp -r "$src/pytorch_model_fsdp_0" "$WORK/no-config/"
  out=$("$CKPTFS" ls "$WORK/no-config/pytorch_model_fsdp_0" hf 2>&1 | awk '{print $NF}')
  [[ $out == model.safetensors ]]
  ok $? "pytorch_model_fsdp_0/ alone, no config.json anywhere: hf/ serves the weights ($out)"
  "$CKPTFS" inspect "$WORK/no-config/pytorch_model_fsdp_0" 2>&1 | grep -q "config.json: missing (give -o hf_config=PATH)"
  ok $? "pytorch_model_fsdp_0/ alone: inspect says config.json is missing and how to give one"
fi

# Broken copies of the FSDP2 Llama and Qwen3-MoE: refused at mount, naming the file and the problem.
if grep -qx "built llama-fsdp2" "$WORK/built" && grep -qx "built qwen3_moe-fsdp2" "$WORK/built"; then
  bad=$WORK/bad
  mkdir -p "$bad"
  sid_python "$WORK" "$script" hostile "$models/llama-fsdp2/checkpoint-10" \
    "$models/qwen3_moe-fsdp2/checkpoint-10" "$bad" > /dev/null 2> "$WORK/hostile.err"
  ok $? "torch writes the broken copies" || tail -n 20 "$WORK/hostile.err" | sed 's/^/# /' >&2
  key="model.model.embed_tokens.weight"
  while IFS='|' read -r what expect; do
    out=$("$CKPTFS" inspect "$bad/$what" 2>&1)
    status=$?
    [[ $status -ne 0 ]] && grep -qF -- "$expect" <<< "$out"
    ok $? "$what: refused: $expect" || echo "# got ($status): ${out:0:400}" >&2
  done <<EOF2
missing-rank|$bad/missing-rank/pytorch_model_fsdp_0/__1_0.distcp
missing-chunk|$bad/missing-chunk/pytorch_model_fsdp_0/.metadata: '$key':
overlapping-chunks|$bad/overlapping-chunks/pytorch_model_fsdp_0/.metadata: '$key':
chunk-outside-file|$bad/chunk-outside-file/pytorch_model_fsdp_0/__
bytes-entry|'model.norm.weight' is stored as bytes (a pickled object), not a tensor
chunk-cuts-dim-1|$bad/chunk-cuts-dim-1/pytorch_model_fsdp_0/.metadata: 'model.model.layers.0.mlp.experts.gate_up_proj' chunk at [0, 32, 0] of size [2, 32, 64] cuts dim 1 of a 3-dim tensor
EOF2
fi
done_testing
