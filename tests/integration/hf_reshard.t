#!/usr/bin/env bash
# hf/ with -o hf_shard_size=SIZE: re-sharded safetensors. The expected shard
# layout, file names, index bytes and tensor bytes are computed independently
# by tests/lib/st_check.py from the source files.
. "$(dirname "$0")/../lib/tap.sh"
tap_require_fuse
tap_workdir

"${GEN[@]}" llama-tiny "$WORK/src-single" --dtype bf16 || tap_bail "ckpt_gen failed"
"${GEN[@]}" llama-tiny "$WORK/src-sharded" --shards 3 --dtype f32 --tokenizer || tap_bail "ckpt_gen failed"
"${GEN[@]}" mixed "$WORK/src-mixed" --shards 2 --empty --tokenizer || tap_bail "ckpt_gen failed"

nmount=0
# reshard_case SRCNAME SIZE
reshard_case() {
    local sname=$1 size=$2 src=$WORK/src-$1 mnt err exp nshards want got f
    nmount=$((nmount + 1))
    mnt=$WORK/mnt-$nmount
    err=$WORK/err-$nmount
    exp=$WORK/exp-$nmount
    local t="$sname @ hf_shard_size=$size"
    mkdir "$mnt"
    nshards=$("${STCHECK[@]}" expected-shards "$src" "$size" | "$PY" -c 'import json,sys; print(len(json.load(sys.stdin)))')
    if ! ckptfs_mount -o "hf_shard_size=$size" "$src" "$mnt" 2>"$err"; then
        tap_not_ok "$t: mount" "$(cat "$err")"
        return
    fi
    tap_ok "$t: mount (expect $nshards shard(s))"

    tap_check "$t: st_check compare-dir --shard-size (layout, names, index bytes, tensors)" \
        "${STCHECK[@]}" compare-dir "$src" "$mnt/hf" --shard-size "$size"

    if [ "$nshards" -eq 1 ]; then
        tap_ok "$t: single shard expected" # layout itself is checked by st_check
        if [ -e "$mnt/hf/model.safetensors" ] && [ ! -e "$mnt/hf/model.safetensors.index.json" ]; then
            tap_ok "$t: one model.safetensors and no index"
        else
            tap_not_ok "$t: one model.safetensors and no index" "$(ls "$mnt/hf" | tr '\n' ' ')"
        fi
    else
        want=$(printf 'model-%05d-of-%05d.safetensors\n' $(for k in $(seq 1 "$nshards"); do echo "$k $nshards"; done))
        got=$(ls "$mnt/hf" | grep '\.safetensors$')
        tap_is "$got" "$want" "$t: shard files model-0000K-of-0000$nshards"
        if [ -e "$mnt/hf/model.safetensors" ]; then
            tap_not_ok "$t: no model.safetensors next to the shards"
        else
            tap_ok "$t: no model.safetensors next to the shards"
        fi
    fi

    # non-weight files pass through unchanged
    local badnw=""
    for f in $(files_in "$src"); do
        case $f in *.safetensors | model.safetensors.index.json) continue ;; esac
        cmp -s "$src/$f" "$mnt/hf/$f" || badnw+=" $f"
    done
    tap_is "$badnw" "" "$t: config/tokenizer files byte-identical to the source"

    # stat size == bytes actually read
    local badsz=""
    for f in $(files_in "$mnt/hf"); do
        [ "$(stat -c %s "$mnt/hf/$f")" = "$(wc -c <"$mnt/hf/$f")" ] || badsz+=" $f"
    done
    tap_is "$badsz" "" "$t: stat size equals the number of bytes read"

    # export == cp -r MNT/hf
    if ck export "$src" hf "$exp" -o "hf_shard_size=$size" 2>"$err"; then
        cp -r "$mnt/hf" "$WORK/cp-$nmount"
        tap_check "$t: export == cp -r MNT/hf (diff -r)" diff -r "$exp" "$WORK/cp-$nmount"
        rm -rf "$WORK/cp-$nmount"
    else
        tap_not_ok "$t: ckptfs export -o hf_shard_size" "$(cat "$err")"
    fi

    # ckptfs ls sizes == sizes seen through the mount
    want=$(for f in $(files_in "$mnt/hf"); do printf '%s\t%s\n' "$(stat -c %s "$mnt/hf/$f")" "$f"; done)
    if ck ls "$src" hf -o "hf_shard_size=$size" >"$WORK/ls.out" 2>"$err"; then
        got=$(sed -E 's#\thf/#\t#' "$WORK/ls.out" | LC_ALL=C sort -t $'\t' -k2)
        tap_is "$got" "$want" "$t: ckptfs ls sizes equal the mounted sizes"
    else
        tap_not_ok "$t: ckptfs ls -o hf_shard_size" "$(cat "$err")"
    fi

    # ckptfs cat of the last shard and of the index == mounted bytes
    local badcat=""
    for f in $(files_in "$mnt/hf" | grep -E 'safetensors' | tail -n 2); do
        ck cat "$src" "hf/$f" -o "hf_shard_size=$size" >"$WORK/cat.out" 2>"$err" || { badcat+=" $f(exit)"; continue; }
        cmp -s "$WORK/cat.out" "$mnt/hf/$f" || badcat+=" $f"
    done
    tap_is "$badcat" "" "$t: ckptfs cat equals the mounted file"

    ckptfs_umount "$mnt" && tap_ok "$t: unmount" || tap_not_ok "$t: unmount"
    rm -rf "$exp"
}

# single-file source: tiny (every tensor its own shard), medium, decimal, huge
for size in 1 64K 100KB 1M 5G; do reshard_case single "$size"; done
# exact boundary: the first 3 tensors fill a shard exactly (== SIZE fits)
b3=$("${STCHECK[@]}" boundary-size "$WORK/src-single" 3)
reshard_case single "$b3"
reshard_case single "$((b3 - 1))"
# sharded source (3 shards, f32, tokenizer files)
for size in 1 200K 300KB 1G; do reshard_case sharded "$size"; done
# mixed dtypes, scalars, 3-D, zero-element tensor
for size in 1 512 2K 1T; do reshard_case mixed "$size"; done

# a file tensor bigger than SIZE gets its own shard: with 4K, the embedding (38400 B)
# must be alone; checked by st_check's rule above, here spelled out once more
mnt=$WORK/mnt-own
mkdir "$mnt"
if ckptfs_mount -o hf_shard_size=4K "$WORK/src-single" "$mnt" 2>"$WORK/err-own"; then
    first=$(ls "$mnt/hf" | grep -m1 '^model-')
    names=$("$PY" - "$mnt/hf/$first" <<'EOF'
import json, struct, sys
f = open(sys.argv[1], "rb")
n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n))
h.pop("__metadata__", None)
print(" ".join(sorted(h)))
EOF
)
    tap_is "$names" "model.embed_tokens.weight" "4K: first shard holds only the 38400-byte embedding"
    ckptfs_umount "$mnt"
else
    tap_not_ok "4K mount" "$(cat "$WORK/err-own")"
fi

# negative controls: the checker must reject a wrong layout and a flipped byte,
# otherwise the passes above mean nothing
ctl=$WORK/ctl
if ck export "$WORK/src-single" hf "$ctl" -o hf_shard_size=64K 2>/dev/null; then
    if "${STCHECK[@]}" compare-dir "$WORK/src-single" "$ctl" --shard-size 100KB >/dev/null 2>&1; then
        tap_not_ok "control: st_check rejects a 64K layout checked as 100KB"
    else
        tap_ok "control: st_check rejects a 64K layout checked as 100KB"
    fi
    f=$ctl/model-00003-of-00007.safetensors
    "$PY" -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(-3, 2); b = f.read(1); f.seek(-3, 2); f.write(bytes([b[0] ^ 0xFF]))' "$f"
    if "${STCHECK[@]}" compare-dir "$WORK/src-single" "$ctl" --shard-size 64K >/dev/null 2>&1; then
        tap_not_ok "control: st_check rejects a flipped tensor byte"
    else
        tap_ok "control: st_check rejects a flipped tensor byte"
    fi
else
    tap_not_ok "control: export -o hf_shard_size=64K"
fi

tap_done
