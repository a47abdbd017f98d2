#!/usr/bin/env bash
# NeMo 2 checkpoints as sources. NeMo cannot run here: tests/lib/nemo2.py writes the checkpoint
# directory as NeMo's save code does (weights/: Megatron-core's torch_dist save of the model's
# sharded state dict under MegatronParallel's "module." prefix, with common.pt and metadata.json;
# context/io.json: fiddle's serialization of the TrainerContext, the config holding what NeMo's
# HF importer gives it). The tensors are those of ckptfs's mcore/ view of a tiny Hugging Face
# Llama and Qwen2, read back and saved again by torch 2.14's own dcp.save (in the sid root).
# hf/ loaded by transformers 5 gives that model's weights and logits exactly; tp2pp2/ and mcore/
# are byte for byte those of its save_pretrained copy; broken context and weights are refused by
# name.
source "$(dirname "$0")/../lib/common.sh"
source "$(dirname "$0")/../lib/trainer_checks.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/nemo2.py"
models=$WORK/models bad=$WORK/bad
ckpt_name="default--val_loss=2.31-step=10-consumed_samples=80.0"
mkdir -p "$models" "$bad"

sid_python "$WORK" "$script" build "$models" > /dev/null 2> "$WORK/build.err"
ok $? "transformers 5 builds and saves a Llama, Qwen2, Qwen3-MoE, Mixtral and Llama 3.1" || tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2

declare -A classes=([llama]="LlamaModel (LlamaConfig)" [qwen2]="Qwen2Model (Qwen2Config)"
                   [qwen3_moe]="Qwen3Model (Qwen3MoEConfig)" [mixtral]="MixtralModel (MixtralConfig8x7B)"
                   [llama31]="LlamaModel (Llama31Config)")
families="llama qwen2 qwen3_moe mixtral llama31"
# The NeMo checkpoints from the mcore/ views of the Hugging Face models, and the broken copies of
# the Llama's, written by one run of torch.
saves=()
for family in $families; do
  if mount_ckptfs "$models/$family-ref" "$WORK/src-$family" 2> "$WORK/err"; then
    saves+=("$WORK/src-$family/mcore/release" "$models/$family-ref" "$models/$family-nemo/$ckpt_name")
  else
    ok 1 "$family: mount of the Hugging Face model: $(head -c 300 "$WORK/err")"
  fi
done
sid_python "$WORK" "$script" save "$bad" "${saves[@]}" > /dev/null 2> "$WORK/save.err"
ok $? "torch 2.14 saves the NeMo 2 checkpoints and their broken copies" ||
  tail -n 20 "$WORK/save.err" | sed 's/^/# /' >&2
for family in $families; do
  [[ -d $WORK/src-$family/mcore ]] && unmount_ckptfs "$WORK/src-$family"
done

checks=()
for family in $families; do
  ref=$models/$family-ref ckpt=$models/$family-nemo/$ckpt_name
  for dir in "$ckpt" "$ckpt/weights"; do
    "$CKPTFS" inspect "$dir" > "$WORK/inspect" 2>&1
    grep -q "^found: *NeMo 2 checkpoint, step 10: model ${classes[$family]} from context/io.json; weights/: [0-9]* model keys in [0-9]* chunks" "$WORK/inspect"
    ok $? "$family: inspect ${dir#$models/} names NeMo 2, the step, the model and config classes and io.json" ||
      sed 's/^/# /' "$WORK/inspect" >&2
  done
  # io.json names no tokenizer ids (NeMo keeps them in context/nemo_tokenizer/), which the
  # Megatron views' args carry: the views are compared with the model's config.json given
  views_match "$family" "$ckpt" "$ref" "$WORK/mnt-$family" "$WORK/ref-$family" bf16 "tp2pp2 mcore" \
    -- -o hf_config="$ref/config.json" || continue
  # hf/ as the checkpoint alone makes it: its config.json from io.json
  if mount_ckptfs "$ckpt" "$WORK/alone-$family" 2> "$WORK/err"; then
    checks+=("$ref" "$WORK/alone-$family/hf" bf16)
  else
    ok 1 "$family: mount: $(head -c 300 "$WORK/err")"
  fi
done

if ((${#checks[@]})); then
  report_checks "$script" 3 "logits" "${checks[@]}"
fi

# Broken context and weights: refused at mount, naming the file, the field or the key.
while IFS='|' read -r what expect; do
  dir=$bad/$what/$ckpt_name
  out=$("$CKPTFS" inspect "$dir" 2>&1)
  status=$?
  [[ $status -ne 0 ]] && grep -qF -- "$expect" <<< "$out"
  ok $? "$what: refused: $expect" || echo "# got ($status): ${out:0:400}" >&2
done <<EOF2
unknown-field|context/io.json: model.config.apply_query_key_layer_scaling (LlamaConfig) is not a field ckptfs understands
layernorm|model.config.normalization is LayerNorm; ckptfs's views compute RMSNorm only
no-num-layers|model.config (LlamaConfig) gives no num_layers
subclass-defaults|model.config (Llama3Config8B) gives no rotary_percent (it changes the math
llama4|model.config is Llama4Config, whose class applies Llama 4's experts and chunked attention
rope-field-elsewhere|model.config.scale_factor (LlamaConfig): a field of Llama 3.1's config classes, whose rope scaling LlamaConfig does not apply
llama31-low-freq|model.config.low_freq_factor is 2.0; ckptfs's views compute 1 only
moe-subclass-defaults|model.config (Qwen3Config30B_A3B) gives no kv_channels (it changes the math
moe-class-experts|weights/.metadata: 'module.decoder.layers.mlp.router.weight' has shape [2, 4, 64]; the model's args imply [2, 128, 64] (num_experts 128
unknown-model|model class nemo.collections.llm.gpt.model.mistral.MistralModel is not one ckptfs reads (LlamaModel, Qwen2Model, Qwen3Model, MixtralModel)
wrong-vocab|'module.embedding.word_embeddings.weight' has shape [255, 64]; the model's args imply [250, 64]
dangling-ref|context/io.json: model: a reference to 'missing_model_1', which "objects" does not hold
truncated-json|context/io.json
no-prefix|weights/.metadata: 9 unexpected entries: 'embedding.word_embeddings.weight', 'decoder.layers.self_attention.linear_qkv.layer_norm_weight', 'decoder.layers.self_attention.linear_qkv.weight', 'decoder.layers.self_attention.linear_proj.weight', 'decoder.layers.mlp.linear_fc1.layer_norm_weight', ... (the model's keys are expected under 'module.')
missing-tensor|no 'module.decoder.layers.mlp.linear_fc2.weight' (the model's args imply it)
EOF2
done_testing
