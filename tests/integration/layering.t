#!/usr/bin/env bash
# The stages of core/ (base, io, format, model, source, view, pack: docs/design.md) depend only on
# earlier ones: every header of include/ckptfs/ and every .c file of core/ includes only headers
# of its own or an earlier stage. A header belongs to the stage of its .c file. And the tests
# read nothing outside the repository.
source "$(dirname "$0")/../lib/common.sh"
cd "$TESTS_TOP" || exit 1
stages=(base io format model source view pack)
rank_of_stage() { local i; for i in "${!stages[@]}"; do [[ ${stages[$i]} == "$1" ]] && echo "$i"; done; }
# Headers with no .c of their own.
declare -A header_stage=([error]=base [limits]=base [checked]=base [views]=view)
stage_of_header() {
  local name=$1 c
  [[ -n ${header_stage[$name]:-} ]] && { echo "${header_stage[$name]}"; return; }
  c=$(ls core/*/"$name".c 2>/dev/null | head -1)
  [[ -n $c ]] && basename "$(dirname "$c")"
}
for h in include/ckptfs/*.h; do
  name=$(basename "$h" .h)
  st=$(stage_of_header "$name")
  [[ -n $st ]]; ok $? "include/ckptfs/$name.h belongs to a stage (${st:-none})"
done
check_file() { # FILE STAGE
  local f=$1 st=$2 bad="" inc ist
  for inc in $(grep -o '#include "ckptfs/[a-z_]*\.h"' "$f" | sed 's/.*ckptfs\///; s/\.h"//'); do
    ist=$(stage_of_header "$inc")
    [[ -n $ist && $(rank_of_stage "$ist") -le $(rank_of_stage "$st") ]] || bad+=" $inc.h($ist)"
  done
  [[ -z $bad ]]; ok $? "$f ($st) includes only its own or earlier stages${bad:+: not$bad}"
}
for h in include/ckptfs/*.h; do check_file "$h" "$(stage_of_header "$(basename "$h" .h)")"; done
for f in core/*/*.c; do check_file "$f" "$(basename "$(dirname "$f")")"; done

# Their checkpoints are tests/data/ (TESTDATA of tests/lib/common.sh), so that a fresh clone runs
# every test: no path above the repository (../shared, TESTS_TOP/.., tests/lib's ../../..), and
# no absolute one into a checkout.
outside=$(grep -rnE '\.\./shared|shared/testdata|TESTS_TOP/\.\.|"\.\.", "\.\.", "\.\."|/work/' \
  tests bench scripts CMakeLists.txt --exclude-dir=data --exclude=layering.t)
[[ -z $outside ]]; ok $? "tests, benchmarks and scripts read no data outside the repository${outside:+: $(head -3 <<< "$outside" | tr '\n' ' ')}"
done_testing
