#!/usr/bin/env bash
# hf/ without options: every top-level regular file of SRC, byte-identical.
# Expectations come from the source files and tests/lib/st_check.py, never
# from ckptfs alone.
. "$(dirname "$0")/../lib/tap.sh"
tap_require_fuse
tap_workdir

# name|generator arguments
CASES=(
    "single-f32|llama-tiny --dtype f32"
    "sharded3-bf16-tok|llama-tiny --shards 3 --dtype bf16 --tokenizer"
    "sharded2-f16|llama-tiny --shards 2 --dtype f16"
    "mixed-single-empty|mixed --empty --tokenizer"
    "mixed-sharded2|mixed --shards 2"
)

for c in "${CASES[@]}"; do
    name=${c%%|*}
    read -r -a gargs <<<"${c#*|}"
    src=$WORK/src-$name
    mnt=$WORK/mnt-$name
    "${GEN[@]}" "${gargs[0]}" "$src" "${gargs[@]:1}" || tap_bail "ckpt_gen failed for $name"
    # a subdirectory is not a top-level regular file: it must not show in hf/
    if [ "$name" = "sharded3-bf16-tok" ]; then
        mkdir -p "$src/original" && echo "nested" >"$src/original/params.json"
    fi
    mkdir "$mnt"

    err=$WORK/err-$name
    if ! ckptfs_mount "$src" "$mnt" 2>"$err"; then
        tap_not_ok "$name: mount" "$(cat "$err")"
        continue
    fi
    tap_ok "$name: mount"

    # the file list of hf/ is exactly the top-level regular files of SRC
    want=$(files_in "$src")
    got=$(files_in "$mnt/hf")
    tap_is "$got" "$want" "$name: hf/ lists exactly the source's top-level regular files"
    got_all=$(ls -A "$mnt/hf" | LC_ALL=C sort)
    tap_is "$got_all" "$want" "$name: hf/ has no other entries (no subdirectories)"

    # byte-identical (cmp) and same sizes (stat and ls -l)
    bad=""
    badsize=""
    for f in $want; do
        cmp -s "$src/$f" "$mnt/hf/$f" || bad+=" $f"
        s1=$(stat -c %s "$src/$f")
        s2=$(stat -c %s "$mnt/hf/$f")
        s3=$(ls -l "$mnt/hf/$f" | awk '{print $5}')
        [ "$s1" = "$s2" ] && [ "$s1" = "$s3" ] || badsize+=" $f(src=$s1 stat=$s2 ls=$s3)"
    done
    tap_is "$bad" "" "$name: every hf/ file is byte-identical to the source (cmp)"
    tap_is "$badsize" "" "$name: stat and ls -l sizes equal the source sizes"

    # files are regular, read-only-looking, in a directory
    ftype=$(stat -c %F "$mnt/hf/config.json" 2>&1)
    tap_is "$ftype" "regular file" "$name: hf/config.json is a regular file"

    tap_check "$name: st_check compare-dir --passthrough (tensors + format)" \
        "${STCHECK[@]}" compare-dir "$src" "$mnt/hf" --passthrough

    # reads at odd offsets / sizes (dd with small blocks) equal the source
    big=$(ls -S "$src" | head -n 1)
    if cmp -s <(dd if="$mnt/hf/$big" bs=4093 skip=3 2>/dev/null) <(dd if="$src/$big" bs=4093 skip=3 2>/dev/null) &&
        cmp -s <(dd if="$mnt/hf/$big" bs=1 skip=5 count=777 2>/dev/null) <(dd if="$src/$big" bs=1 skip=5 count=777 2>/dev/null); then
        tap_ok "$name: partial reads of $big at odd offsets match"
    else
        tap_not_ok "$name: partial reads of $big at odd offsets match"
    fi

    # ckptfs ls SRC hf: SIZE<TAB>PATH for every file, sizes from the source
    want_ls=$(for f in $want; do printf '%s\t%s\n' "$(stat -c %s "$src/$f")" "$f"; done)
    if ck ls "$src" hf >"$WORK/ls-$name" 2>"$err"; then
        got_ls=$(sed -E 's#\thf/#\t#' "$WORK/ls-$name" | LC_ALL=C sort -t $'\t' -k2)
        tap_is "$got_ls" "$want_ls" "$name: ckptfs ls SRC hf lists every file with its size"
    else
        tap_not_ok "$name: ckptfs ls SRC hf lists every file with its size" "$(cat "$err")"
    fi

    # ckptfs cat SRC hf/FILE == source == read through the mount
    bad=""
    for f in $want; do
        if ! ck cat "$src" "hf/$f" >"$WORK/cat.out" 2>"$err"; then
            bad+=" $f(exit: $(head -c 200 "$err"))"
            continue
        fi
        cmp -s "$WORK/cat.out" "$src/$f" && cmp -s "$WORK/cat.out" "$mnt/hf/$f" || bad+=" $f"
    done
    tap_is "$bad" "" "$name: ckptfs cat hf/FILE equals the source file and the mounted file"

    # ckptfs export SRC hf DEST == cp -r MNT/hf == source files
    exp=$WORK/exp-$name
    if ck export "$src" hf "$exp" 2>"$err"; then
        cp -r "$mnt/hf" "$WORK/cp-$name"
        tap_check "$name: export == cp -r MNT/hf (diff -r)" diff -r "$exp" "$WORK/cp-$name"
        tap_is "$(files_in "$exp")" "$want" "$name: export holds exactly the source's top-level files"
        bad=""
        for f in $want; do cmp -s "$src/$f" "$exp/$f" || bad+=" $f"; done
        tap_is "$bad" "" "$name: exported files are byte-identical to the source"
    else
        tap_not_ok "$name: ckptfs export SRC hf DEST" "$(cat "$err")"
    fi

    if ckptfs_umount "$mnt"; then tap_ok "$name: unmount"; else tap_not_ok "$name: unmount"; fi
done

# export never overwrites: a DEST that already holds config.json is refused
# and that file keeps its content
src=$WORK/src-single-f32
mkdir "$WORK/exists"
echo keep >"$WORK/exists/config.json"
if ck export "$src" hf "$WORK/exists" 2>"$WORK/err-exists"; then
    tap_not_ok "export onto an existing config.json fails"
else
    tap_ok "export onto an existing config.json fails"
fi
tap_is "$(cat "$WORK/exists/config.json")" "keep" "export does not overwrite an existing file"
tap_is "$(stderr_lines "$WORK/err-exists")" "1" "export failure prints one line on stderr"
# export to a path whose parent does not exist fails cleanly
if ck export "$src" hf "$WORK/no/such/parent" 2>/dev/null; then
    tap_not_ok "export to DEST with a missing parent fails"
else
    tap_ok "export to DEST with a missing parent fails"
fi

tap_done
