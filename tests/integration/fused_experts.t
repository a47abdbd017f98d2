#!/usr/bin/env bash
# Experts fused on disk as a source form: a tiny Qwen3-MoE built by transformers 5 (in the sid
# root), saved per expert by save_pretrained and with its experts fused as transformers 5 holds
# them in memory (written from its state dict). Every Megatron view of the fused copy is byte
# for byte the per-expert copy's; its hf/ is the source's own fused file, which transformers 5
# loads with the original's logits; fused tensors of the wrong shape, both forms in one layer,
# one projection fused without the other, and the transposed orientation Qwen3-MoE does not use
# are refused by name, hf/ still served. (The transposed and interleaved readers are checked
# against a naive transpose in tests/unit/test_fused.c and test_plan_transpose.c.)
source "$(dirname "$0")/../lib/common.sh"
require_fuse
sid_available || { echo "1..0 # skip $SID_WHY"; exit 0; }
script="$TESTS_TOP/tests/lib/fused_experts.py"
m=$WORK/m

sid_python "$WORK" "$script" build "$m" > "$WORK/built" 2> "$WORK/build.err"
ok $? "transformers 5 builds a Qwen3-MoE and saves it per expert and fused" ||
  { tail -n 20 "$WORK/build.err" | sed 's/^/# /' >&2; done_testing; exit; }
check "the fused copy holds [E, 2F, H] gate_up_proj and [E, H, F] down_proj" \
  grep -q 'model.layers.0.mlp.experts.gate_up_proj \[4, 96, 64\]' "$WORK/built"

per=$WORK/mnt-per fused=$WORK/mnt-fused
check "mount the per-expert copy" mount_ckptfs "$m/per-expert" "$per"
check "mount the fused copy" mount_ckptfs "$m/fused" "$fused"
check "  its views are the per-expert copy's" diff <(ls "$per") <(ls "$fused")
check "  inspect says the experts are fused in its 2 MoE layers" \
  bash -c "'$CKPTFS' inspect '$m/fused' | grep -q '^found: .*experts fused on disk in 2 layers'"
check "  hf/ keeps the fused form: model.safetensors is the source's file" \
  cmp "$fused/hf/model.safetensors" "$m/fused/model.safetensors"

# Every Megatron view the root lists, and splits it does not (pp 3, ep with pp).
views=$(ls "$per" | grep -v '^hf$')
for v in $views tp1pp3 tp2pp3ep2 tp1pp1ep4etp1; do
  check "$v: the same files" diff <(cd "$per/$v" && find . | sort) <(cd "$fused/$v" && find . | sort)
  check "$v: every file byte-identical to the per-expert copy's" same_trees "$per" "$fused" "$v"
done

# Served as fp32: the experts' strided pieces converted on read as the per-expert tensors are.
check "mount the per-expert copy with -o dtype=fp32" mount_ckptfs "$m/per-expert" "$per-32" -o dtype=fp32
check "mount the fused copy with -o dtype=fp32" mount_ckptfs "$m/fused" "$fused-32" -o dtype=fp32
check "  tp2pp1ep2/ byte-identical in fp32" same_trees "$per-32" "$fused-32" tp2pp1ep2

sid_python "$WORK" "$script" logits "$m/per-expert" "$fused/hf" > "$WORK/logits" 2> "$WORK/logits.err"
check "transformers 5 loads hf/ of the fused copy with the original's logits" grep -q '^PASS' "$WORK/logits"
[[ -s $WORK/logits ]] && diag "$(cat "$WORK/logits")" || tail -n 5 "$WORK/logits.err" | sed 's/^/# /' >&2

# Refused by name: the Megatron views are left out with the reason, hf/ is served.
refused() { # refused COPY TEXT...: inspect says why there are no Megatron views, naming TEXT
  local copy=$1 out
  shift
  out=$("$CKPTFS" inspect "$m/$copy" 2>&1 | grep '^megatron:')
  [[ $out == *"no Megatron views"* ]] || { echo "$out"; return 1; }
  for t in "$@"; do [[ $out == *"$t"* ]] || { echo "$out"; return 1; }; done
}
check "fused tensors of 3 experts in a 4-expert model: refused by name" \
  refused bad-experts "'model.layers.0.mlp.experts.gate_up_proj' is [3, 96, 64]" "the 4 experts"
check "gate_up_proj of the gate rows only: refused by name" \
  refused bad-dims "'model.layers.0.mlp.experts.gate_up_proj' [4, 48, 64]" "are not [E, 2F, H] and [E, H, F]"
check "a layer fused and per expert both: refused by name" \
  refused bad-both "layer 0 holds its experts both fused" "'model.layers.0.mlp.experts.0.gate_proj.weight'"
check "gate_up_proj without down_proj: refused by name" \
  refused bad-half "'model.layers.0.mlp.experts.gate_up_proj' but not 'model.layers.0.mlp.experts.down_proj'"
check "the transposed orientation, which Qwen3-MoE's transformers does not load: refused by name" \
  refused transposed "[4, 64, 96]" "are not [E, 2F, H] and [E, H, F]"
bad=$WORK/mnt-bad
check "a refused copy still mounts" mount_ckptfs "$m/bad-both" "$bad"
check "  with hf/ only, the source's file" bash -c "[[ \$(ls '$bad') == hf ]] && cmp '$bad/hf/model.safetensors' '$m/bad-both/model.safetensors'"
done_testing
