# Sourced after common.sh by the tests of trainers' checkpoints as sources (trainer_dcp.t,
# titan_dcp.t, deepspeed.t): the checks each makes of a source against the Hugging Face model
# it holds, saved by save_pretrained.

# views_match LABEL SRC REF MNT REFMNT DTYPE "VIEW..." [-- MOUNT-OPTION...]: mounts SRC at MNT
# (with the options) and REF at REFMNT with -o dtype=DTYPE; checks that hf/ holds config.json and
# the weights only, and that each VIEW of the two is byte for byte the same. False, said as one
# failed check, only when a mount fails.
views_match() {
  local label=$1 src=$2 ref=$3 mnt=$4 refmnt=$5 dtype=$6 views=$7 view
  shift 7
  [[ ${1:-} == -- ]] && shift
  if ! mount_ckptfs "$src" "$mnt" "$@" 2> "$WORK/err" ||
     ! mount_ckptfs "$ref" "$refmnt" -o dtype="$dtype" 2>> "$WORK/err"; then
    ok 1 "$label ($dtype): mount: $(head -c 300 "$WORK/err")"
    return 1
  fi
  [[ $(ls "$mnt/hf" | tr '\n' ' ') == "config.json model.safetensors " ]]
  ok $? "$label ($dtype): hf/ holds config.json and the weights, nothing else ($(ls "$mnt/hf" | tr '\n' ' '))"
  for view in $views; do
    diff -r "$refmnt/$view" "$mnt/$view" > "$WORK/diff" 2>&1
    ok $? "$label ($dtype): $view/ is byte for byte that of the model saved by save_pretrained" ||
      head -n 5 "$WORK/diff" | sed 's/^/# /' >&2
  done
  return 0
}

# report_checks SCRIPT PER WHAT ARG...: runs SCRIPT's check over ARGs (PER of them a mount) in
# the sid root, makes a check of each PASS or FAIL line it prints, and checks there is one a
# mount. WHAT names the checks ("logits", "weights and logits").
report_checks() {
  local script=$1 per=$2 what=$3 n
  shift 3
  sid_python "$WORK" "$script" check "$@" > "$WORK/checked" 2> "$WORK/check.err"
  ok $? "the $what checks ran" || tail -n 20 "$WORK/check.err" | sed 's/^/# /' >&2
  passes "$WORK/checked"
  n=$(grep -c '^PASS\|^FAIL' "$WORK/checked")
  ok $((n == $# / per ? 0 : 1)) "one $what check for each of the $(($# / per)) mounts (got $n)"
}
