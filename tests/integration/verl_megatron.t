#!/usr/bin/env bash
# verl's Megatron checkpoints as a source. Role directories in verl's three layouts (2026:
# model/huggingface with or without the weights, model/dist_ckpt; 2025-26: dist_ckpt +
# huggingface; 2025: model/mp_rank_*/model.pt lists of chunk state dicts, tp2pp2, tp1pp2vpp2,
# tp2pp1) are made from what ckptfs serves for a tiny Llama (mcore/, tpXppY/; verl_megatron_data.py)
# and each, mounted directly and inside a run directory, gives hf/ bit-identical to the Llama
# and tp2pp2/ byte-identical to the Llama's own; inspect names the layout; broken saves fail
# with one line naming the file.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
check_hf="$TESTS_TOP/tests/lib/check_hf.py"
models="$TESTS_TOP/tests/lib/models.py"
data="$TESTS_TOP/tests/lib/verl_megatron_data.py"

# The model, and its views the saves are made from (kept mounted: tp2pp2/ is the reference).
llama=$WORK/llama
$PY "$models" write llama "$llama" --tokenizer --shards 2 > /dev/null
ref=$WORK/mnt-llama
check "the Llama mounts" mount_ckptfs "$llama" "$ref"

# hf_files DIR: config.json and the tokenizer (what verl saves without the weights).
hf_files() {
  mkdir -p "$1"
  cp "$llama/config.json" "$llama/tokenizer.json" "$llama/tokenizer_config.json" "$1/"
}
# empty_dirs ROLE: what verl creates whatever it saves.
empty_dirs() { mkdir -p "$1/optimizer/dist_ckpt" "$1/extra/dist_ckpt"; echo '{"num_layers": 8}' > "$1/transformer_config.json"; }

roles=()
declare -A patterns
made() { # made NAME LAYOUT-PATTERN: a role directory is ready; inspect must match the pattern
  roles+=("$1")
  patterns[$1]=$2
}

# 2026 layout, Megatron-Bridge's HF weights in model/huggingface (verl's default); model/dist_ckpt
# exists but is empty, as verl leaves it.
r=$WORK/v2-hf
mkdir -p "$r/model/dist_ckpt" && cp -r "$llama" "$r/model/huggingface" && empty_dirs "$r" &&
  $PY "$data" manifest "$r" model/huggingface huggingface && made v2-hf \
  "verl Megatron save (2026 layout): Hugging Face weights in model/huggingface"
# 2026 layout, dist checkpointing on: torch_dist in model/dist_ckpt, config and tokenizer beside.
r=$WORK/v2-dist
mkdir -p "$r/model" && $PY "$data" torch-dist "$ref/mcore/release" "$r/model/dist_ckpt" &&
  hf_files "$r/model/huggingface" && empty_dirs "$r" &&
  $PY "$data" manifest "$r" model/dist_ckpt megatron_dist_checkpoint && made v2-dist \
  "verl Megatron save (2026 layout): torch_dist in model/dist_ckpt; .* model keys"
# 2025-26 layout: dist_ckpt/ and huggingface/ (config, tokenizer).
r=$WORK/v1
mkdir -p "$r" && $PY "$data" torch-dist "$ref/mcore/release" "$r/dist_ckpt" && hf_files "$r/huggingface" &&
  made v1 "verl Megatron save (2025-26 layout): torch_dist in dist_ckpt"
# 2025-26 layout with Megatron-Bridge: the weights in huggingface/, dist_ckpt/ without the model.
r=$WORK/v1-hf
mkdir -p "$r/dist_ckpt" && cp -r "$llama" "$r/huggingface" && made v1-hf \
  "verl Megatron save (2025-26 layout): Hugging Face weights in huggingface"
# 2025 per-rank layout: config.json in hf_config_and_tokenizer/ (from May 2025) or huggingface/.
for layout in tp2pp2 tp1pp2vpp2 tp2pp1; do
  r=$WORK/ranks-$layout
  hf=hf_config_and_tokenizer
  [[ $layout == tp2pp1 ]] && hf=huggingface
  $PY "$data" ranks "$ref/$layout" "$r" && hf_files "$r/$hf" && mkdir -p "$r/optim" "$r/rng_states" &&
    made ranks-$layout "verl Megatron save (2025 per-rank layout): per-rank model.pt files in model, saved as $layout"
done
check "the role directories are written (${#roles[@]} of 7)" test ${#roles[@]} -eq 7

for name in "${roles[@]}"; do
  r=$WORK/$name
  mnt=$WORK/mnt-$name
  check "$name: ckptfs inspect names the layout" bash -c \
    "'$CKPTFS' inspect '$r' > '$WORK/out' && grep -q '^format: *verl-megatron' '$WORK/out' && grep -q '^found: *${patterns[$name]}' '$WORK/out'"
  if ! mount_ckptfs "$r" "$mnt" 2> "$WORK/err"; then
    ok 1 "$name: mounts ($(head -c 300 "$WORK/err"))"
    continue
  fi
  check "$name: hf/ tensors are bit-identical to the Llama" $PY "$check_hf" compare "$llama" "$mnt/hf"
  check "$name: hf/ passes config.json and the tokenizer through" bash -c \
    "cmp '$llama/config.json' '$mnt/hf/config.json' && cmp '$llama/tokenizer.json' '$mnt/hf/tokenizer.json'"
  check "$name: tp2pp2/ is byte-identical to the Llama's own" diff -r "$ref/tp2pp2" "$mnt/tp2pp2"
  unmount_ckptfs "$mnt"
done
check "v2-hf: hf/ holds Megatron-Bridge's files unchanged (byte-identical)" bash -c \
  "m=$WORK/mnt-v2-hf-again; mkdir -p \$m && '$CKPTFS' mount '$WORK/v2-hf' \$m && diff -r '$llama' \$m/hf; rc=\$?; fusermount3 -u \$m; exit \$rc"
check "ranks-tp1pp2vpp2: saved as tp1pp2vpp2, so a bare vpp2/ is its own split" bash -c \
  "'$CKPTFS' inspect '$WORK/ranks-tp1pp2vpp2' | grep -q 'saved as tp1pp2vpp2'"

# A tied model (Qwen2: the last stage holds the embedding's copy as output_layer) from rank files.
qwen2=$WORK/qwen2
$PY "$models" write qwen2 "$qwen2" > /dev/null && mount_ckptfs "$qwen2" "$WORK/mnt-qwen2"
r=$WORK/ranks-qwen2
$PY "$data" ranks "$WORK/mnt-qwen2/tp2pp2" "$r" && mkdir -p "$r/hf_config_and_tokenizer" &&
  cp "$qwen2/config.json" "$r/hf_config_and_tokenizer/"
check "qwen2 (tied) tp2pp2 model.pt files mount" mount_ckptfs "$r" "$WORK/mnt-ranks-qwen2"
check "  hf/ is bit-identical to the Qwen2" $PY "$check_hf" compare "$qwen2" "$WORK/mnt-ranks-qwen2/hf"
check "  tp2pp2/ is byte-identical to the Qwen2's own" diff -r "$WORK/mnt-qwen2/tp2pp2" "$WORK/mnt-ranks-qwen2/tp2pp2"
unmount_ckptfs "$WORK/mnt-ranks-qwen2"
unmount_ckptfs "$WORK/mnt-qwen2"

# A run: one step per layout, each an actor (and a critic-less step list).
run=$WORK/run
step=0
for name in "${roles[@]}"; do
  step=$((step + 1))
  mkdir -p "$run/global_step_$step" && cp -r "$WORK/$name" "$run/global_step_$step/actor"
done
echo "$step" > "$run/latest_checkpointed_iteration.txt"
mnt=$WORK/mnt-run
check "a run of ${#roles[@]} Megatron saves mounts" mount_ckptfs "$run" "$mnt"
step=0
for name in "${roles[@]}"; do
  step=$((step + 1))
  check "  global_step_$step ($name) lists its actor" diff <(ls "$mnt/global_step_$step") <(echo actor)
  check "  global_step_$step/actor/hf is bit-identical to the Llama" \
    $PY "$check_hf" compare "$llama" "$mnt/global_step_$step/actor/hf"
  check "  global_step_$step/actor/tp2pp2 is byte-identical to the Llama's own" \
    diff -r "$ref/tp2pp2" "$mnt/global_step_$step/actor/tp2pp2"
done
unmount_ckptfs "$mnt"
check "ckptfs inspect of the run names each step's layout" bash -c "
  out=\$('$CKPTFS' inspect '$run') &&
  grep -q '^global_step_1/actor: verl-megatron (verl Megatron save (2026 layout): Hugging Face' <<<\"\$out\" &&
  grep -q '^global_step_5/actor: verl-megatron (verl Megatron save (2025 per-rank layout).*tp2pp2' <<<\"\$out\""
mnt=$WORK/mnt-step
check "-o step=6,role=actor mounts the tp1pp2vpp2 save's views at the root" mount_ckptfs "$run" "$mnt" -o step=6,role=actor
check "  hf/ is the Llama" $PY "$check_hf" compare "$llama" "$mnt/hf"
unmount_ckptfs "$mnt"

# A 2026 save without ckpt_contents.json (verl writes it last): read, with a warning.
r=$WORK/v2-nomanifest
cp -r "$WORK/v2-dist" "$r" && rm "$r/ckpt_contents.json"
check "a 2026 save without ckpt_contents.json is read, with a warning that it may be incomplete" bash -c \
  "'$CKPTFS' inspect '$r' | grep -q '^warning: .*ckpt_contents.json: missing; verl writes it last'"
# The config.json given with -o hf_config when the save has none (verl before May 2025 kept only
# the tokenizer).
r=$WORK/ranks-tokenizer-only
cp -r "$WORK/ranks-tp2pp2" "$r" && rm "$r/hf_config_and_tokenizer/config.json" &&
  mv "$r/hf_config_and_tokenizer" "$r/huggingface"
mnt=$WORK/mnt-tokenizer-only
check "rank files without config.json mount with -o hf_config" mount_ckptfs "$r" "$mnt" -o "hf_config=$llama/config.json"
check "  hf/ is the Llama, with the save's tokenizer" bash -c \
  "$PY '$check_hf' compare '$llama' '$mnt/hf' && cmp '$llama/tokenizer.json' '$mnt/hf/tokenizer.json'"
unmount_ckptfs "$mnt"

# Broken saves: inspect fails with one line naming the file and the problem.
refused() { # refused DESCRIPTION DIR SUBSTRING...
  local what=$1 dir=$2 good=1 s
  shift 2
  if "$CKPTFS" inspect "$dir" > /dev/null 2> "$WORK/err"; then
    ok 1 "$what (accepted)"
    return
  fi
  [[ $(wc -l < "$WORK/err") -eq 1 ]] || good=0
  for s in "$@"; do grep -qF -- "$s" "$WORK/err" || good=0; done
  ok $((1 - good)) "$what ($(head -c 300 "$WORK/err"))"
}
bad() { rm -rf "$WORK/bad-$1"; cp -r "$WORK/$2" "$WORK/bad-$1"; echo "$WORK/bad-$1"; }

r=$(bad dict-root ranks-tp2pp2)
$PY "$data" bad-root "$r/model/mp_rank_01_001/model.pt"
refused "a model.pt whose root is a dict is refused" "$r" "$r/model/mp_rank_01_001/model.pt" "not a list of state dicts"
r=$(bad first-dict-root ranks-tp2pp2)
$PY "$data" bad-root "$r/model/mp_rank_00_000/model.pt"
refused "  the first rank's too" "$r" "$r/model/mp_rank_00_000/model.pt" "not a list of state dicts"
r=$(bad no-file ranks-tp2pp2)
rm "$r/model/mp_rank_01_001/model.pt"
refused "a missing model.pt is refused" "$r" "$r/model/mp_rank_01_001/model.pt"
r=$(bad no-rank ranks-tp2pp2)
rm -r "$r/model/mp_rank_01_001"
refused "a missing rank directory is refused" "$r" "$r/model/mp_rank_01_001/model.pt: missing"
r=$(bad chunks ranks-tp1pp2vpp2)
cp "$WORK/ranks-tp2pp1/model/mp_rank_00/model.pt" "$r/model/mp_rank_00_001/model.pt"
refused "rank files with different numbers of chunks are refused" "$r" "$r/model/mp_rank_00_001/model.pt" \
  "holds 1 chunk state dicts"
r=$(bad ranks-no-config ranks-tp2pp2)
rm "$r/hf_config_and_tokenizer/config.json"
refused "rank files without config.json are refused, naming where it was looked for" "$r" \
  "$r/hf_config_and_tokenizer/config.json and $r/huggingface/config.json: missing" "-o hf_config=PATH"
r=$(bad dist-no-config v2-dist)
rm "$r/model/huggingface/config.json"
refused "model/dist_ckpt without config.json is refused" "$r" "$r/model/huggingface/config.json: missing" \
  "$r/model/dist_ckpt are saved without args"
r=$(bad v1-no-hf v1)
rm -r "$r/huggingface"
refused "dist_ckpt/ without huggingface/ is refused" "$r" "$r/huggingface/config.json: missing"
r=$(bad early ranks-tp2pp2)
for f in "$r"/model/mp_rank_*/model.pt; do $PY "$data" early-names "$f"; done
refused "verl's March 2025 names are refused as a layout not read" "$r" "$r/model/mp_rank_00_000/model.pt" \
  "early-2025" "not read"
r=$(bad lora v2-dist)
rm -r "$r/model/huggingface" && mkdir -p "$r/model/huggingface/adapter" && hf_files "$r/model/huggingface"
refused "a LoRA save (adapters only) is refused" "$r" "$r/model/huggingface/adapter" "LoRA" "base model"
r=$(bad no-model v2-hf)
rm -r "$r/model/huggingface"/*.safetensors "$r/model/huggingface/model.safetensors.index.json"
refused "a 2026 save without model weights is refused" "$r" "$r: a verl Megatron save without model weights"
check "-o iteration is refused on a verl save (it has no iterations)" bash -c \
  "! '$CKPTFS' inspect -o iteration=1 '$WORK/v1' > /dev/null 2> '$WORK/err' && grep -q 'has no iterations' '$WORK/err'"
unmount_ckptfs "$ref"
done_testing
