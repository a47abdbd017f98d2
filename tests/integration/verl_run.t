#!/usr/bin/env bash
# verl run directories: global_step_N/ROLE/ checkpoints mounted together (steps and roles as
# directories, latest/ naming the tracker's step, each role holding its views), a step saved
# while mounted appearing in the next listing, -o step=/role= mounting one role's views at the
# root, a step directory given directly, and what is refused (a step or role not there, the
# options on a directory that is not a run, a broken role among good ones).
source "$(dirname "$0")/../lib/common.sh"
require_fuse
check_hf="$TESTS_TOP/tests/lib/check_hf.py"
data=$TESTDATA/verl-fsdp

# A run of two saved steps with an actor (FSDP2 W=4 Llama, then FSDP1 W=2 Llama) and a critic.
run=$WORK/run
mkdir -p "$run/global_step_1" "$run/global_step_2"
cp -r "$data/fsdp2/llama-w4/global_step_1/actor" "$run/global_step_1/actor"
cp -r "$data/fsdp2/qwen2-critic-w2/global_step_1/actor" "$run/global_step_1/critic"
cp -r "$data/fsdp1/llama-w2/global_step_1/actor" "$run/global_step_2/actor"
cp -r "$data/fsdp2/qwen2-critic-w2/global_step_1/actor" "$run/global_step_2/critic"
echo 2 > "$run/latest_checkpointed_iteration.txt"
mkdir -p "$run/global_step_2/data_unrelated" # not a role: no checkpoint inside
(cd "$run" && find . -type f -exec sha256sum {} + | sort) > "$WORK/sums.before"

mnt=$WORK/mnt-run
check "a verl run directory mounts" mount_ckptfs "$run" "$mnt"
check "  its root lists the steps and latest" diff <(ls "$mnt") <(printf 'global_step_1\nglobal_step_2\nlatest\n')
check "  latest points at the tracker's step" test "$(readlink "$mnt/latest")" = global_step_2
check "  a step lists its roles (and nothing else)" diff <(ls "$mnt/global_step_1") <(printf 'actor\ncritic\n')
check "  global_step_2 lists actor and critic, not a directory without a checkpoint" \
  diff <(ls "$mnt/global_step_2") <(printf 'actor\ncritic\n')
check "  step 1's actor hf/ is bit-identical to the bf16 Llama it was trained from" \
  $PY "$check_hf" compare "$data/src/llama" "$mnt/global_step_1/actor/hf"
check "  step 2's actor (FSDP1, through latest/) likewise" \
  $PY "$check_hf" compare "$data/src/llama" "$mnt/latest/actor/hf"
check "  the critic's hf/ is the Qwen2 value model" \
  $PY "$check_hf" compare "$data/src/qwen2-critic" "$mnt/global_step_1/critic/hf"
check "  the actor has Megatron views" test -d "$mnt/global_step_1/actor/tp2pp2/release"
check "  a layout looked up by name inside a role" test -d "$mnt/global_step_2/actor/tp2pp2vpp2/release"
check "  tp2pp2/ of step 1 and step 2 (same weights, other FSDP versions) are byte-identical" \
  diff -r "$mnt/global_step_1/actor/tp2pp2" "$mnt/global_step_2/actor/tp2pp2"

# A step saved while mounted: listed by the next ls, and its views served.
mkdir -p "$run/global_step_3"
cp -r "$data/fsdp1/llama-w4-hsdp2/global_step_1/actor" "$run/global_step_3/actor"
check "  a step saved after the mount appears in the next listing" \
  diff <(ls "$mnt") <(printf 'global_step_1\nglobal_step_2\nglobal_step_3\nlatest\n')
check "  its actor's hf/ (HSDP shards) is bit-identical to the Llama" \
  $PY "$check_hf" compare "$data/src/llama" "$mnt/global_step_3/actor/hf"
mkdir -p "$run/global_step_4"
cp -r "$data/fsdp1/llama-w1/global_step_1/actor" "$run/global_step_4/actor"
check "  a step looked up by name before any listing shows it" \
  $PY "$check_hf" compare "$data/src/llama" "$mnt/global_step_4/actor/hf"
check "  a name that is no step is not found" bash -c "! ls '$mnt/global_step_99' 2>/dev/null"

# A step listed while verl is still saving it: the actor first, the critic later; a role whose
# huggingface/ (rank 0 writes it last) is not there yet is refused until it is.
mkdir -p "$run/global_step_6"
check "  a step listed while still empty" bash -c "ls -l '$mnt' > /dev/null && test -z \"\$(ls '$mnt/global_step_6')\""
cp -r "$data/fsdp2/llama-w4/global_step_1/actor" "$run/global_step_6/actor.partial"
rm -r "$run/global_step_6/actor.partial/huggingface"
mv "$run/global_step_6/actor.partial" "$run/global_step_6/actor"
check "  its actor appears in the next listing of the step" diff <(ls "$mnt/global_step_6") <(echo actor)
check "  an actor without huggingface/ yet is refused (still being saved)" \
  bash -c "! ls '$mnt/global_step_6/actor' > /dev/null 2>&1"
cp -r "$data/fsdp2/llama-w4/global_step_1/actor/huggingface" "$run/global_step_6/actor/"
check "  once huggingface/ is written it serves, with its config" \
  $PY "$check_hf" compare "$data/src/llama" "$mnt/global_step_6/actor/hf"
check "  (and its Megatron views)" test -d "$mnt/global_step_6/actor/tp2pp2/release"
cp -r "$data/fsdp2/qwen2-critic-w2/global_step_1/actor" "$run/global_step_6/critic"
check "  a critic saved after the step was listed is found by name" \
  $PY "$check_hf" compare "$data/src/qwen2-critic" "$mnt/global_step_6/critic/hf"
check "  and listed" diff <(ls "$mnt/global_step_6") <(printf 'actor\ncritic\n')
unmount_ckptfs "$mnt"
rm -rf "$run/global_step_6"

# One role's views at the root.
mnt=$WORK/mnt-step1-critic
check "-o step=1,role=critic mounts the critic's views at the root" \
  mount_ckptfs "$run" "$mnt" -o step=1,role=critic
check "  hf/ is the critic" $PY "$check_hf" compare "$data/src/qwen2-critic" "$mnt/hf"
check "  a value model has no Megatron views (hf/ only)" diff <(ls "$mnt") <(echo hf)
unmount_ckptfs "$mnt"
mnt=$WORK/mnt-latest
check "-o step=latest (the tracker's step 2; actor when a step has several roles)" \
  mount_ckptfs "$run" "$mnt" -o step=latest
check "  hf/ is step 2's actor" $PY "$check_hf" compare "$data/src/llama" "$mnt/hf"
check "  ckptfs inspect of the same says FSDP1, world size 2" bash -c \
  "'$CKPTFS' inspect -o step=latest '$run' | grep -q 'FSDP1.*world size 2'"
unmount_ckptfs "$mnt"
mnt=$WORK/mnt-stepdir
check "a step directory given directly mounts with its roles at the root" \
  mount_ckptfs "$run/global_step_1" "$mnt"
check "  it lists actor and critic" diff <(ls "$mnt") <(printf 'actor\ncritic\n')
check "  actor/hf is the Llama" $PY "$check_hf" compare "$data/src/llama" "$mnt/actor/hf"
unmount_ckptfs "$mnt"

check "-o layouts= that a role cannot have: that role is refused, naming the option" bash -c "
  '$CKPTFS' inspect -o layouts=tp3pp1 '$run' | grep -q 'global_step_1/actor: cannot be read: .*option layouts: '"
check "ckptfs inspect of the run lists every step and role" bash -c "
  out=\$('$CKPTFS' inspect '$run') &&
  grep -q 'verl run (4 steps; latest: global_step_2)' <<<\"\$out\" &&
  grep -q '^global_step_1/critic: verl-fsdp' <<<\"\$out\" &&
  grep -q '^global_step_3/actor: verl-fsdp.*mesh \[2, 2\]' <<<\"\$out\""
check "  --json too" bash -c "'$CKPTFS' inspect --json '$run' | $PY -c '
import json, sys
j = json.load(sys.stdin)
steps = {s[\"step\"]: [r[\"role\"] for r in s[\"roles\"]] for s in j[\"steps\"]}
sys.exit(not (j[\"latest\"] == 2 and steps == {1: [\"actor\", \"critic\"], 2: [\"actor\", \"critic\"], 3: [\"actor\"], 4: [\"actor\"]}))'"

# Refusals, each one line naming what exists.
refused() { # refused DESCRIPTION PATTERN ARGS...: inspect fails, its message matches PATTERN
  local what=$1 pattern=$2
  shift 2
  "$CKPTFS" inspect "$@" 2>"$WORK/err" >/dev/null && { ok 1 "$what (accepted)"; return; }
  check "$what" grep -q -- "$pattern" "$WORK/err"
}
refused "a step that is not there is refused, naming the steps" "no step 9 (steps: 1, 2, 3, 4)" -o step=9 "$run"
refused "a role that is not there is refused, naming the roles" "no role 'ref'.*roles: actor, critic" \
  -o step=1,role=ref "$run"
refused "step/role on a directory that is not a run is refused" "not one" \
  -o step=1 "$run/global_step_1/actor"
refused "a bad step value is refused" "latest\" or a step number" -o step=-3 "$run"

# A broken role among good ones: the mount works, that role's directory fails with EIO (its
# reason in the daemon's log), the others serve.
mkdir -p "$run/global_step_5"
cp -r "$data/fsdp2/llama-w4/global_step_1/actor" "$run/global_step_5/actor"
cp -r "$data/fsdp2/qwen2-critic-w2/global_step_1/actor" "$run/global_step_5/critic"
rm "$run/global_step_5/actor/model_world_size_4_rank_2.pt"
mnt=$WORK/mnt-broken
check "a run with a broken role still mounts" mount_ckptfs "$run" "$mnt"
check "  the broken role's directory fails to list" bash -c "! ls '$mnt/global_step_5/actor' 2>/dev/null"
check "  the other role of that step serves" \
  $PY "$check_hf" compare "$data/src/qwen2-critic" "$mnt/global_step_5/critic/hf"
cp "$data/fsdp2/llama-w4/global_step_1/actor/model_world_size_4_rank_2.pt" "$run/global_step_5/actor/"
check "  once the missing rank file is there, the role serves (retried at the next lookup)" \
  $PY "$check_hf" compare "$data/src/llama" "$mnt/global_step_5/actor/hf"
rm -r "$run/global_step_5/actor/huggingface"
check "  inspect of the run shows a role's warnings (a role dir without huggingface/)" bash -c \
  "'$CKPTFS' inspect '$run' | grep -q '^global_step_5/actor: warning: .*huggingface: missing'"
cp -r "$data/fsdp2/llama-w4/global_step_1/actor/huggingface" "$run/global_step_5/actor/"
check "  inspect of the run names the problem of a broken role" bash -c \
  "rm '$run/global_step_5/critic/model_world_size_2_rank_1.pt'; '$CKPTFS' inspect '$run' | grep -q 'global_step_5/critic: cannot be read: .*rank'"
unmount_ckptfs "$mnt"
rm -rf "$run/global_step_5" "$run/global_step_3" "$run/global_step_4"
check "nothing was written into the run directory" diff "$WORK/sums.before" \
  <(cd "$run" && find . -type f -exec sha256sum {} + | sort)

# A step deleted while mounted (verl's max_ckpt_to_keep): once the root is listed again, the
# daemon holds none of its files open or mapped, so their space is freed.
del=$WORK/run-del
mkdir -p "$del/global_step_1" "$del/global_step_2"
cp -r "$data/fsdp2/llama-w4/global_step_1/actor" "$del/global_step_1/actor"
cp -r "$data/fsdp1/llama-w2/global_step_1/actor" "$del/global_step_2/actor"
held_of() { # files of DIR the daemon PID holds open or mapped
  { ls -l "/proc/$1/fd" 2> /dev/null; cat "/proc/$1/maps" 2> /dev/null; } | grep -c "$2"
}
if fg_mount "$CKPTFS" "$del" "$WORK/mnt-del" "$WORK/del.log"; then
  pid=$FG_PID
  cat "$WORK/mnt-del/global_step_1/actor/hf/"*.safetensors "$WORK/mnt-del/global_step_2/actor/tp2pp1/release/"*/* > /dev/null
  before=$(held_of "$pid" "$del/global_step_1/")
  rm -r "$del/global_step_1"
  ls "$WORK/mnt-del" > /dev/null
  after=$(held_of "$pid" "$del/global_step_1/")
  [[ $before -gt 0 && $after -eq 0 ]]
  ok $? "a deleted step's files let go at the next listing of the root (held before: $before, after: $after)"
  ! cat "$WORK/mnt-del/global_step_1/actor/hf/model.safetensors" > /dev/null 2>&1
  ok $? "  its files fail"
  check "  the other step still serves" \
    $PY "$check_hf" compare "$data/src/llama" "$WORK/mnt-del/global_step_2/actor/hf"
  fg_unmount "$WORK/mnt-del"
  ok $? "  unmounted"
else
  ok 1 "a run to delete a step of mounts"
fi
echo 7 > "$del/latest_checkpointed_iteration.txt"
check "inspect says why latest is not the tracker's step" bash -c \
  "'$CKPTFS' inspect '$del' | grep -q 'names step 7, which is not there .*latest is the highest step, global_step_2'"
done_testing
