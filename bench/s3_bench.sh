#!/usr/bin/env bash
# ckptfs on a checkpoint kept in an object store: 8 simulated nodes mount one Llama-3-70B-shaped
# checkpoint that lies in a local S3 emulator (s3rver, on 127.0.0.1), each through its own
# `rclone mount` of the bucket and its own ckptfs mount of that; node n reads only its share (PP
# stage n of tp8pp8/: its 8 TP rank files, 8 concurrent readers; then the same stage from
# mcore/, DCP-style: only the .distcp byte ranges its 8 ranks' chunks need). Reported per node,
# from the server's own accounting: bytes the server sent, the node's share, the ratio, GET
# requests, mean bytes per request, wall time; per rclone setting (read chunk size, read-ahead
# buffer). See bench/README.md.
#
#   bench/s3_bench.sh [--quick]
#
#   --quick      nodes 0 and 4 only (NODES="0 4"), each rank reading the first 64 MiB of its share
#                (LIMIT_MB=64), rclone's default setting and one small-chunk setting
#                (SETTINGS="default chunk4M"), mcore/ for the same nodes and limit
#
# The source: bench/gen_checkpoint.py --sparse-70b (real headers, 141 GB of holes), placed into
# s3rver's store directly (sparse copies + the metadata files s3rver keeps next to an object, the
# layout it writes for an upload through the API): uploading 141 GB over HTTP would take hours.
#
# Bytes are counted in the server process: s3rver runs inside a small node wrapper that hooks
# its HTTP server's 'request' event and, per response, logs method, URL, Range header, status,
# Content-Length (what the client asked for) and the body bytes written to the socket before the
# response finished or the client hung up (what was sent). s3rver's own log line per request
# only has the Content-Length, rounded ("206 5ms 16.8mb"), and no range: kept beside, not used.
#
# Environment:
#   CKPTFS_BIN       the binary (default: <repo>/build/ckptfs)
#   BENCH_DIR        work dir (default /tmp/ckptfs-bench); everything goes to BENCH_DIR/s3:
#                    the generated checkpoint (reused), the s3rver install, the store, run dirs
#   S3RVER_PREFIX    an npm prefix holding s3rver 3.x (default BENCH_DIR/s3/s3rver, installed
#                    there with `npm install --prefix` when missing)
#   NODES            the simulated nodes = PP stages to read (default "0 1 2 3 4 5 6 7")
#   SETTINGS         rclone settings for the tp8pp8 part (default "default chunk16M chunk4M"):
#                      default      --vfs-read-chunk-size 128M, doubling without limit, --buffer-size 16M
#                      chunk16M     --vfs-read-chunk-size 16M --vfs-read-chunk-size-limit 16M
#                      chunk4M      --vfs-read-chunk-size 4M --vfs-read-chunk-size-limit 4M --buffer-size 0
#                      prefetch32M  rclone's default, ckptfs -o prefetch=32M
#                      cache4M      --vfs-cache-mode full (rclone keeps what it fetched in a sparse
#                                   file per object, under the node's own --cache-dir), 4M chunks,
#                                   no read-ahead: concurrent readers of one file share a cache
#                                   instead of one HTTP stream; cacheN (cache512K, cache1M,
#                                   cache16M, ...): the same with chunks of N
#                      s3fs         s3fs (Debian's) instead of rclone, its default options (no
#                                   use_cache: ranges it fetches live in a temporary file per open)
#                      s3fs5M       s3fs with its smallest part size and one part at a time
#                                   (multipart_size=5,parallel_count=1)
#                      s3fscache    s3fs with use_cache (a cache directory per node)
#   LIMIT_MB         read only the first LIMIT_MB MiB of each rank file (default: all); share is
#                    then the bytes the readers read (the rank files are their tensor bytes plus
#                    a few KB of pickle and zip records)
#   MCORE            1 (default): the mcore/ part (needs the torch 2.6 root); 0: skip it
#   MCORE_SETTING    the rclone setting of the mcore/ part (one of SETTINGS' names; default "default")
#   MOUNT_OPTS       extra ckptfs mount options for every mount (default none)
#   TIMEOUT          seconds allowed per node read (default 1800; a hung mount fails the run)
#   PYTHON           python3 for the helpers (default /usr/bin/python3)
#   CKPTFS_TORCH2_ROOT  the Debian 13 root with torch 2.6 (default /var/cache/ckptfs-tests/trixie-root)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

QUICK=0
for arg in "$@"; do
    case $arg in
    --quick) QUICK=1 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done

BIN=${CKPTFS_BIN:-$REPO/build/ckptfs}
BENCH_DIR=${BENCH_DIR:-/tmp/ckptfs-bench}
S3DIR=$BENCH_DIR/s3
S3RVER_PREFIX=${S3RVER_PREFIX:-$S3DIR/s3rver}
PYTHON=${PYTHON:-/usr/bin/python3}
TORCH2_ROOT=${CKPTFS_TORCH2_ROOT:-/var/cache/ckptfs-tests/trixie-root}
MCORE=${MCORE:-1}
MCORE_SETTING=${MCORE_SETTING:-default}
MOUNT_OPTS=${MOUNT_OPTS:-}
TIMEOUT=${TIMEOUT:-1800}
LIMIT_MB=${LIMIT_MB:-}
[[ -z $LIMIT_MB || $LIMIT_MB =~ ^[1-9][0-9]*$ ]] || { echo "s3_bench: LIMIT_MB must be a positive number" >&2; exit 1; }
if ((QUICK)); then
    NODES=${NODES:-0 4}
    SETTINGS=${SETTINGS:-default chunk4M}
    LIMIT_MB=${LIMIT_MB:-64}
else
    NODES=${NODES:-0 1 2 3 4 5 6 7}
    SETTINGS=${SETTINGS:-default chunk16M chunk4M}
fi
PP=8 TP=8
BUCKET=ckpt

BENCH_NAME=s3_bench
# shellcheck source=bench/daemon.sh
source "$HERE/daemon.sh"

[[ -x $BIN ]] || die "no ckptfs binary at $BIN (build it or set CKPTFS_BIN)"
BIN=$(readlink -f "$BIN")
command -v fusermount3 >/dev/null || die "fusermount3 not found"
[[ -e /dev/fuse ]] || die "/dev/fuse missing"
command -v node >/dev/null || die "node not found (apt-get install nodejs npm)"
command -v rclone >/dev/null || die "rclone not found (apt-get install rclone)"
[[ $TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "TIMEOUT must be a positive number of seconds"
read -ra NODE_LIST <<<"$NODES"
for n in "${NODE_LIST[@]}"; do [[ $n =~ ^[0-7]$ ]] || die "NODES: '$n' is not a stage 0-7"; done
read -ra SETTING_LIST <<<"$SETTINGS"
rclone_args() { # the rclone mount flags of a setting (s3fs settings: their s3fs -o options)
    case $1 in
    s3fs) echo "" ;;
    s3fs5M) echo "multipart_size=5,parallel_count=1" ;;
    s3fscache) echo "use_cache=CACHE_DIR" ;;
    default | prefetch32M) echo "--vfs-read-chunk-size 128M --vfs-read-chunk-size-limit off --buffer-size 16M" ;;
    chunk16M) echo "--vfs-read-chunk-size 16M --vfs-read-chunk-size-limit 16M --buffer-size 16M" ;;
    chunk4M) echo "--vfs-read-chunk-size 4M --vfs-read-chunk-size-limit 4M --buffer-size 0" ;;
    cache[0-9]*[KM]) # the full cache mode with chunks of that size (cache512K, cache1M, cache4M, ...)
        local c=${1#cache}
        echo "--vfs-cache-mode full --vfs-read-chunk-size $c --vfs-read-chunk-size-limit $c --buffer-size 0 --vfs-read-ahead 0" ;;
    *) return 1 ;;
    esac
}
ckptfs_opts() { # the ckptfs mount options of a setting (tp8pp8 part)
    local o=layouts=tp8pp8
    [[ $1 == prefetch32M ]] && o+=,prefetch=32M
    [[ -n $MOUNT_OPTS ]] && o+=,$MOUNT_OPTS
    echo "$o"
}
for s in "${SETTING_LIST[@]}"; do rclone_args "$s" >/dev/null || die "SETTINGS: unknown setting '$s'"; done
uses_s3fs() { [[ " ${SETTING_LIST[*]} $MCORE_SETTING " == *" s3fs"* ]]; }
uses_s3fs && ! command -v s3fs >/dev/null && die "s3fs not found (apt-get install s3fs)"
rclone_args "$MCORE_SETTING" >/dev/null || die "MCORE_SETTING: unknown setting '$MCORE_SETTING'"

mkdir -p "$S3DIR"
RUN=$(mktemp -d "$S3DIR/run.XXXXXX")
SRV_PID=
RCLONE_PIDS=()

# --- cleanup: ckptfs mounts first, then the rclone mounts, then the server ----------------------
cleanup() {
    local m pid
    for m in $(awk -v r="$RUN/" '$3 == "fuse.ckptfs" && index($2, r) == 1 {print $2}' /proc/mounts); do
        fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null || true
    done
    for _ in $(seq 300); do pgrep -f -- " $RUN/mnt-ck-[^ ]+\$" >/dev/null || break; sleep 0.1; done
    for m in $(awk -v r="$RUN/" '($3 == "fuse.rclone" || $3 == "fuse.s3fs") && index($2, r) == 1 {print $2}' /proc/mounts); do
        fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null || true
    done
    for pid in "${RCLONE_PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill "$pid" 2>/dev/null || true
    done
    if [[ -n $SRV_PID ]]; then
        kill "$SRV_PID" 2>/dev/null || true
        wait "$SRV_PID" 2>/dev/null || true
    fi
    rm -rf --one-file-system "$RUN/store" "$RUN"/mnt-* "$RUN"/rclone-cache-* "$RUN"/s3fs-cache-* 2>/dev/null || true # the caches hold what cache4M fetched
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- s3rver ---------------------------------------------------------------------------------------
if [[ ! -e $S3RVER_PREFIX/node_modules/s3rver/package.json ]]; then
    command -v npm >/dev/null || die "npm not found (apt-get install npm) and no s3rver in $S3RVER_PREFIX"
    note "installing s3rver 3.x into $S3RVER_PREFIX"
    npm install --prefix "$S3RVER_PREFIX" --no-audit --no-fund s3rver@3 >"$RUN/npm.log" 2>&1 ||
        die "npm install s3rver failed: $(tail -3 "$RUN/npm.log")"
fi
S3RVER_VERSION=$(node -p "require('$S3RVER_PREFIX/node_modules/s3rver/package.json').version")

# The wrapper: s3rver's Koa app behind our own http server, whose first 'request' listener
# counts every response's body bytes (res.write/res.end, less what was still queued in node
# when the response ended) and logs one JSON line per response, with the client's User-Agent.
cat >"$RUN/s3acct.js" <<'EOF'
'use strict';
const http = require('http');
const fs = require('fs');
const [prefix, dir, port, logPath, portFile] = process.argv.slice(2);
const S3rver = require(require.resolve('s3rver', { paths: [prefix + '/node_modules'] }));
const app = new S3rver({ directory: dir, address: '127.0.0.1', port: +port, silent: false });
const log = fs.openSync(logPath, 'a');
const server = http.createServer();
server.keepAliveTimeout = 60000;
server.on('request', (req, res) => {
  let written = 0;
  const w = res.write, e = res.end;
  const add = (c) => { if (c && typeof c !== 'function') written += Buffer.byteLength(c); };
  res.write = function (c, ...a) { add(c); return w.call(this, c, ...a); };
  res.end = function (c, ...a) { add(c); return e.call(this, c, ...a); };
  let done = false;
  const fin = () => {
    if (done) return;
    done = true;
    fs.writeSync(log, JSON.stringify({ m: req.method, u: req.url, range: req.headers.range || null,
      ua: req.headers['user-agent'] || '', st: res.statusCode, cl: +(res.getHeader('content-length') || 0),
      body: written - (res.writableLength || 0), done: res.writableFinished }) + '\n');
  };
  res.on('finish', fin);
  res.on('close', fin);
});
server.on('request', app.callback());
app.configureBuckets().then(() => server.listen(+port, '127.0.0.1', () => {
  fs.writeFileSync(portFile, String(server.address().port));
}));
process.on('SIGTERM', () => process.exit(0));
EOF

# --- helpers (python) -----------------------------------------------------------------------------
# acct LOG FROM TO: per User-Agent, the responses logged in lines [FROM, TO) of LOG.
cat >"$RUN/acct.py" <<'EOF'
import collections, json, re, sys
log, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
agg = collections.defaultdict(lambda: collections.Counter())
with open(log) as f:
    for i, line in enumerate(f):
        if i < lo or i >= hi:
            continue
        r = json.loads(line)
        # rclone sends our User-Agent as it is; s3fs appends its instance name to its own.
        m = re.search(r"s3bench-[\w.-]+", r["ua"])
        a = agg[m.group(0) if m else (r["ua"].split() or ["-"])[0]]
        path = r["u"].split("?")[0].strip("/")
        if r["m"] == "GET" and "/" in path:           # an object's bytes
            a["gets"] += 1
            a["body"] += r["body"]
            a["asked"] += r["cl"]
            a["aborted"] += 0 if r["done"] else 1
        else:                                          # listings, HEADs
            a["other"] += 1
            a["other_body"] += r["body"]
for ua, a in sorted(agg.items()):
    print(ua, " ".join(f"{k}={a[k]}" for k in ("gets", "body", "asked", "aborted", "other", "other_body")))
EOF
# shares SRC PP: the source tensor bytes of each pipeline stage (Llama names; layers split evenly;
# embedding on stage 0, final norm and lm_head on the last), from the safetensors headers.
cat >"$RUN/shares.py" <<'EOF'
import json, os, re, struct, sys
src, pp = sys.argv[1], int(sys.argv[2])
L = json.load(open(os.path.join(src, "config.json")))["num_hidden_layers"]
assert L % pp == 0
share, total = [0] * pp, 0
for name in sorted(os.listdir(src)):
    if not name.endswith(".safetensors"):
        continue
    with open(os.path.join(src, name), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        b = v["data_offsets"][1] - v["data_offsets"][0]
        total += b
        m = re.match(r"model\.layers\.(\d+)\.", k)
        if m:
            share[int(m.group(1)) // (L // pp)] += b
        elif k.startswith("model.embed_tokens."):
            share[0] += b
        elif k.startswith(("model.norm.", "lm_head.")):
            share[pp - 1] += b
        else:
            sys.exit(f"shares: no stage for {k}")
print("total", total)
for s in range(pp):
    print("stage", s, share[s])
EOF
# mcore_plan.py (torch 2.6): for each stage n and TP rank t, the stored items of mcore/'s
# .distcp files that rank's DCP load reads: mcore_share.py's TP boxes restricted to the stage's
# layers (dim 0 of the stacked decoder.layers.* keys; the embedding on stage 0, output layer and
# final norm on the last), turned into ReadItems by torch's create_read_items_for_chunk_list,
# plus the stage's _extra_state byte entries; one line per item: stage rank file offset length.
cat >"$RUN/mcore_plan.py" <<'EOF'
import re, sys
sys.path.insert(0, sys.argv[1])
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex
import mcore_share as ms
d, T, PP, out = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
md = FileSystemReader(d).read_metadata()
vocab = ms.model_args(d).vocab_size
L = next(m.size[0] for k, m in md.state_dict_metadata.items() if k.startswith("decoder.layers.") and not isinstance(m, BytesStorageMetadata))
per = L // PP
with open(out, "w") as f:
    for n in range(PP):
        lo, hi = n * per, (n + 1) * per
        for t in range(T):
            boxes, byte_keys = ms.share_plan(md, T, t, vocab)
            mine = {}
            for fqn, bx in boxes.items():
                if fqn.startswith("decoder.layers."):
                    mine[fqn] = [([lo] + o[1:], [per] + s[1:]) for o, s in bx]
                elif fqn.startswith("embedding."):
                    if n == 0:
                        mine[fqn] = bx
                elif n == PP - 1:
                    mine[fqn] = bx
            items = [md.storage_data[ri.storage_index] for ri in ms.read_items(md, mine)]
            for k in byte_keys:
                m = re.search(r"/shard_(\d+)_\d+$", k)
                if m and lo <= int(m.group(1)) < hi:
                    items.append(md.storage_data[MetadataIndex(k)])
            seen = set()
            for s in sorted(items, key=lambda s: (s.relative_path, s.offset)):
                if (s.relative_path, s.offset) not in seen:
                    seen.add((s.relative_path, s.offset))
                    f.write(f"{n} {t} {s.relative_path} {s.offset} {s.length}\n")
EOF
# mcore_read.py PLAN DIR STAGE LIMIT: the stage's 8 ranks at once (one thread each), each reading its
# items in file/offset order as FileSystemReader does, every item whole (reads of <= 8 MiB).
cat >"$RUN/mcore_read.py" <<'EOF'
import os, sys, threading, collections
plan, d, stage, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
per = collections.defaultdict(list)
for line in open(plan):
    n, t, p, off, ln = line.split()
    if int(n) == stage:
        per[int(t)].append((p, int(off), int(ln)))
got, errs = collections.Counter(), []
def rank(t):
    try:
        fds = {}
        for p, off, ln in per[t]:
            fd = fds.get(p) or fds.setdefault(p, os.open(os.path.join(d, p), os.O_RDONLY))
            end = off + ln
            if limit and got[t] >= limit:
                break
            while off < end:
                b = os.pread(fd, min(8 << 20, end - off), off)
                if not b:
                    raise OSError(f"short read {p}@{off}")
                off += len(b)
                got[t] += len(b)
        for fd in fds.values():
            os.close(fd)
    except OSError as e:
        errs.append(f"rank {t}: {e}")
ths = [threading.Thread(target=rank, args=(t,)) for t in sorted(per)]
for th in ths: th.start()
for th in ths: th.join()
print("READ", sum(got.values()), "items", sum(len(v) for v in per.values()))
sys.exit("\n".join(errs) if errs else 0)
EOF

# --- the source and its placement into the store --------------------------------------------------
SRC=$S3DIR/llama3-70b-sparse
if [[ ! -e $SRC/model.safetensors.index.json ]]; then
    note "generating the sparse Llama-3-70B-shaped checkpoint in $SRC"
    "$PYTHON" "$HERE/gen_checkpoint.py" --sparse-70b "$SRC" >&2
fi
STORE=$RUN/store
mkdir -p "$STORE"
# Start the server once on the empty store, make the bucket through the API and upload
# config.json with rclone: the layout and metadata s3rver writes for an uploaded object
# (KEY._S3rver_object, KEY._S3rver_object.md5, KEY._S3rver_metadata.json), copied for the rest.
: >"$RUN/acct.log"
node "$RUN/s3acct.js" "$S3RVER_PREFIX" "$STORE" 0 "$RUN/acct.log" "$RUN/port" >"$RUN/s3rver.log" 2>&1 &
SRV_PID=$!
for _ in $(seq 100); do [[ -s $RUN/port ]] && break; sleep 0.1; done
[[ -s $RUN/port ]] || die "s3rver did not start: $(tail -5 "$RUN/s3rver.log")"
PORT=$(cat "$RUN/port")
export RCLONE_CONFIG=$RUN/rclone.conf
: >"$RCLONE_CONFIG"
export RCLONE_CONFIG_S3_TYPE=s3 RCLONE_CONFIG_S3_PROVIDER=Other RCLONE_CONFIG_S3_ENV_AUTH=false \
    RCLONE_CONFIG_S3_ACCESS_KEY_ID=S3RVER RCLONE_CONFIG_S3_SECRET_ACCESS_KEY=S3RVER \
    RCLONE_CONFIG_S3_ENDPOINT=http://127.0.0.1:$PORT RCLONE_CONFIG_S3_FORCE_PATH_STYLE=true
unset AWS_CA_BUNDLE # rclone 1.60 refuses any custom CA bundle with its own transport; plain http here
echo "S3RVER:S3RVER" >"$RUN/s3fs.passwd"
chmod 600 "$RUN/s3fs.passwd"
rclone mkdir "s3:$BUCKET" 2>"$RUN/rclone-put.log" || die "rclone mkdir: $(tail -3 "$RUN/rclone-put.log")"
rclone copyto "$SRC/config.json" "s3:$BUCKET/config.json" 2>>"$RUN/rclone-put.log" ||
    die "rclone copyto: $(tail -3 "$RUN/rclone-put.log")"
[[ -e $STORE/$BUCKET/config.json._S3rver_object && -e $STORE/$BUCKET/config.json._S3rver_metadata.json ]] ||
    die "s3rver's store layout is not KEY._S3rver_object + KEY._S3rver_metadata.json: $(ls "$STORE/$BUCKET")"
t0=$(date +%s.%N)
for f in "$SRC"/*; do
    name=$(basename "$f")
    [[ $name == config.json ]] && continue
    obj=$STORE/$BUCKET/$name._S3rver_object
    cp --sparse=always "$f" "$obj"
    cp "$STORE/$BUCKET/config.json._S3rver_metadata.json" "$STORE/$BUCKET/$name._S3rver_metadata.json"
    size=$(stat -c %s "$f")
    if ((size > 64 * 1024 * 1024)); then
        # An object this size is uploaded in parts: its ETag is multipart-style (digest-parts),
        # which no client takes for an MD5 of the content. Writing it spares s3rver reading the
        # whole object to compute one at the first request.
        printf '%s-%d' "$(printf '%s %s' "$name" "$size" | md5sum | cut -c1-32)" $(((size + 8388607) / 8388608)) >"$obj.md5"
    else
        md5sum <"$f" | cut -c1-32 | tr -d '\n' >"$obj.md5"
    fi
done
t1=$(date +%s.%N)
rclone lsl "s3:$BUCKET" >"$RUN/listing" 2>>"$RUN/rclone-put.log"
n_obj=$(wc -l <"$RUN/listing")
n_src=$(find "$SRC" -maxdepth 1 -type f | wc -l)
((n_obj == n_src)) || die "the bucket lists $n_obj objects, the source has $n_src files"
cmp <(awk '{print $4, $1}' "$RUN/listing" | sort) <(cd "$SRC" && stat -c '%n %s' * | sort) >/dev/null ||
    die "object sizes differ from the source's"

"$PYTHON" "$RUN/shares.py" "$SRC" "$PP" >"$RUN/shares"
MODEL_BYTES=$(awk '$1 == "total" {print $2}' "$RUN/shares")
share_of() { awk -v s="$1" '$1 == "stage" && $2 == s {print $3}' "$RUN/shares"; }

elapsed() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", b - a}'; }
loglines() { wc -l <"$RUN/acct.log"; }
# ua_sum FROM TO UA FIELD: FIELD of User-Agent UA in log lines [FROM, TO)
ua_sum() { "$PYTHON" "$RUN/acct.py" "$RUN/acct.log" "$1" "$2" | awk -v u="$3" -v k="$4" '$1 == u {for (i = 2; i <= NF; i++) {split($i, kv, "="); if (kv[1] == k) print kv[2]}}' | awk '{s += $1} END {printf "%.0f\n", s}'; }

# --- mounts ---------------------------------------------------------------------------------------
# client_mount NAME NODE SETTING: the setting's client (rclone, s3fs) mounting the bucket for one
# node, its requests marked with the User-Agent "s3bench-NAME-nNODE" (s3fs: in its instance name).
client_mount() {
    local name=$1 node=$2 setting=$3 mnt=$RUN/mnt-rc-$1-$2
    mkdir -p "$mnt"
    if [[ $setting == s3fs* ]]; then
        local opts
        opts=$(rclone_args "$setting")
        opts=${opts//CACHE_DIR/$RUN/s3fs-cache-$name-$node}
        s3fs "$BUCKET" "$mnt" -o "ro,umask=0222,url=http://127.0.0.1:$PORT,use_path_request_style,passwd_file=$RUN/s3fs.passwd" \
            -o "instance_name=s3bench-$name-n$node,stat_cache_expire=3600,logfile=$RUN/s3fs-$name-$node.log${opts:+,$opts}" \
            </dev/null >/dev/null 2>&1 || die "s3fs mount for $name node $node failed: $(tail -3 "$RUN/s3fs-$name-$node.log" 2>/dev/null)"
        return 0
    fi
    set -- $(rclone_args "$setting")
    # shellcheck disable=SC2068
    rclone mount "s3:$BUCKET" "$mnt" --read-only --vfs-cache-mode off --dir-cache-time 1h \
        --cache-dir "$RUN/rclone-cache-$name-$node" --attr-timeout 1h --user-agent "s3bench-$name-n$node" --log-file "$RUN/rclone-$name-$node.log" $@ </dev/null >/dev/null 2>&1 &
    RCLONE_PIDS+=($!)
    for _ in $(seq 100); do
        awk -v m="$mnt" '$2 == m && $3 == "fuse.rclone" {f = 1} END {exit !f}' /proc/mounts && return 0
        sleep 0.1
    done
    die "rclone mount for $name node $node did not come up: $(tail -3 "$RUN/rclone-$name-$node.log")"
}
# mount_nodes NAME SETTING OPTS DIR: for every node, the rclone mount of SETTING and a ckptfs mount
# of it with OPTS (none if empty), then DIR of the view listed; what each node fetched while
# mounting and listing goes into MOUNTB / MOUNTG (bytes / GETs).
declare -A MOUNTB=() MOUNTG=()
mount_nodes() {
    local name=$1 setting=$2 opts=$3 dir=$4 n a b
    # shellcheck disable=SC2046
    for n in "${NODE_LIST[@]}"; do client_mount "$name" "$n" "$setting"; done
    MOUNTB=() MOUNTG=()
    for n in "${NODE_LIST[@]}"; do
        a=$(loglines)
        mkdir -p "$RUN/mnt-ck-$name-$n"
        "$BIN" mount ${opts:+-o "$opts"} "$RUN/mnt-rc-$name-$n" "$RUN/mnt-ck-$name-$n"
        ls -lR "$RUN/mnt-ck-$name-$n/$dir" >/dev/null
        sleep 0.3
        b=$(loglines)
        MOUNTB[$n]=$(ua_sum "$a" "$b" "s3bench-$name-n$n" body)
        MOUNTG[$n]=$(ua_sum "$a" "$b" "s3bench-$name-n$n" gets)
    done
}
unmount_setting() {
    local name=$1 m
    for m in $(awk -v r="$RUN/mnt-ck-$name-" '$3 == "fuse.ckptfs" && index($2, r) == 1 {print $2}' /proc/mounts); do
        fusermount3 -u "$m"
    done
    # The daemons close their source files on the way out: the clients stay until they are gone.
    for _ in $(seq 600); do pgrep -f -- " $RUN/mnt-ck-$name-[0-9]+\$" >/dev/null || break; sleep 0.1; done
    for m in $(awk -v r="$RUN/mnt-rc-$name-" '($3 == "fuse.rclone" || $3 == "fuse.s3fs") && index($2, r) == 1 {print $2}' /proc/mounts); do
        fusermount3 -u "$m"
    done
    sleep 0.5
}

# --- header ---------------------------------------------------------------------------------------
echo "# s3_bench: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# ckptfs: $BIN ($(grep -s '^CMAKE_BUILD_TYPE' "$(dirname "$BIN")/CMakeCache.txt" | cut -d= -f2 || true))"
echo "# server: s3rver $S3RVER_VERSION (node $(node --version)) on 127.0.0.1:$PORT; client: $(rclone version | head -1)$(uses_s3fs && echo ", $(s3fs --version 2>&1 | head -1)")"
echo "# source: $SRC: $(find "$SRC" -maxdepth 1 -name "*.safetensors" | wc -l) shards, $MODEL_BYTES bytes of tensors, placed into the store"
echo "#   as sparse objects in $(elapsed "$t0" "$t1") s ($n_obj objects, sizes checked with rclone lsl)"
echo "# nodes: ${NODE_LIST[*]} (node n = PP stage n: tp8pp8/release/mp_rank_0T_00n, T = 0..7, 8 concurrent cat)"
echo "# bytes = body bytes the server wrote for GETs of objects, counted in the server process per"
echo "#   response, attributed by the client's User-Agent (one per setting"
echo "#   and node, mount included); share = source tensor bytes of the stage; mountMB = the part fetched"
echo "#   while the node's ckptfs mount read the headers (rclone reads ahead of them); GETs likewise"
[[ -n $LIMIT_MB ]] && echo "# LIMIT_MB=$LIMIT_MB: each reader reads the first $LIMIT_MB MiB of its rank file; share = 8 x that"
echo "# other ckptfs mounts active: $(awk '$3 == "fuse.ckptfs"' /proc/mounts | wc -l)"
echo

printf '%-12s %-6s %7s %15s %15s %7s %7s %7s %11s %6s %8s\n' setting node mountMB "bytes sent" share ratio GETs aborted "mean req" wall_s GB/s
ROWS=$RUN/rows
: >"$ROWS"
row() { # row SETTING NODE MOUNT_BYTES BYTES SHARE GETS ABORTED WALL
    local ratio mean gbs
    ratio=$(awk -v a="$4" -v b="$5" 'BEGIN {printf "%.3f", a / b}')
    mean=$(awk -v a="$4" -v n="$6" 'BEGIN {if (n) printf "%.2fM", a / n / 1048576; else print "-"}')
    gbs=$(awk -v a="$4" -v w="$8" 'BEGIN {printf "%.2f", a / w / 1e9}')
    printf '%-12s %-6s %7.1f %15s %15s %7s %7s %7s %11s %6.1f %8s\n' "$1" "$2" "$(awk -v b="$3" 'BEGIN {print b / 1048576}')" \
        "$4" "$5" "$ratio" "$6" "$7" "$mean" "$8" "$gbs"
    echo "$*" >>"$ROWS"
}
total_row() { # total_row SETTING: sums of the setting's rows
    awk -v s="$1" -v m="$MODEL_BYTES" -v nn="${#NODE_LIST[@]}" '$1 == s {mb += $3; b += $4; sh += $5; g += $6; ab += $7; w += $8}
        END {printf "%-12s %-6s %7.1f %15.0f %15.0f %7.3f %7d %7d %10.2fM %6.1f %8.2f\n", s, "total", mb / 1048576, b, sh, b / sh, g, ab, b / g / 1048576, w, b / w / 1e9
             if (nn == 8) printf "%-12s %-6s %7s %15s %15.0f %7.3f   (total bytes sent / the model'"'"'s tensor bytes)\n", s, "model", "", "", m, b / m}' "$ROWS"
}

# --- tp8pp8 ---------------------------------------------------------------------------------------
for s in "${SETTING_LIST[@]}"; do
    mount_nodes "$s" "$s" "$(ckptfs_opts "$s")" tp8pp8/release
    for n in "${NODE_LIST[@]}"; do
        a=$(loglines)
        files=()
        for t in $(seq 0 $((TP - 1))); do
            files+=("$RUN/mnt-ck-$s-$n/tp8pp8/release/$(printf 'mp_rank_%02d_%03d' "$t" "$n")/model_optim_rng.pt")
        done
        w0=$(date +%s.%N)
        pids=()
        if [[ -n $LIMIT_MB ]]; then
            for f in "${files[@]}"; do timeout "$TIMEOUT" head -c $((LIMIT_MB << 20)) "$f" >/dev/null & pids+=($!); done
        else
            for f in "${files[@]}"; do timeout "$TIMEOUT" cat "$f" >/dev/null & pids+=($!); done
        fi
        for p in "${pids[@]}"; do wait "$p" || die "$s node $n: a rank file read failed or timed out"; done
        w1=$(date +%s.%N)
        sleep 0.5 # responses the client abandoned are logged when their connection closes
        b=$(loglines)
        row "$s" "$n" "${MOUNTB[$n]}" "$((MOUNTB[$n] + $(ua_sum "$a" "$b" "s3bench-$s-n$n" body)))" \
            "$(if [[ -n $LIMIT_MB ]]; then echo $((TP * LIMIT_MB << 20)); else share_of "$n"; fi)" "$((MOUNTG[$n] + $(ua_sum "$a" "$b" "s3bench-$s-n$n" gets)))" "$(ua_sum 0 "$b" "s3bench-$s-n$n" aborted)" \
            "$(elapsed "$w0" "$w1")"
    done
    total_row "$s"
    unmount_setting "$s"
done

# --- mcore/ (DCP-style chunk reads) ---------------------------------------------------------------
if [[ $MCORE == 1 ]]; then
    if [[ ! -x $TORCH2_ROOT/usr/bin/python3 ]]; then
        echo "# mcore/: skipped: no torch 2.6 root at $TORCH2_ROOT (tests/run-all.sh builds it)"
    else
        # The plan from .metadata of a ckptfs mount of the local copy (.metadata depends on the
        # headers only: the same bytes as through the object store, without adding to its count).
        mkdir -p "$RUN/mnt-local"
        "$BIN" mount "$SRC" "$RUN/mnt-local"
        unshare --mount --propagation private bash -c '
            root=$1 run=$2 bench=$3; shift 3
            mount -t proc proc "$root/proc" || exit 1
            for d in "$run" "$bench"; do mkdir -p "$root$d" && mount --rbind "$d" "$root$d" || exit 1; done
            exec chroot "$root" /usr/bin/python3 "$@"' _ "$TORCH2_ROOT" "$RUN" "$HERE" \
            "$RUN/mcore_plan.py" "$HERE" "$RUN/mnt-local/mcore/release" "$TP" "$PP" "$RUN/mcore.plan" ||
            die "mcore plan failed"
        fusermount3 -u "$RUN/mnt-local"
        echo
        echo "# mcore/: node n's 8 TP ranks read the stored items of mcore/release/*.distcp that a DCP load of"
        echo "#   their share of stage n reads (torch 2.6's create_read_items_for_chunk_list on .metadata),"
        echo "#   each item whole, in file/offset order, 8 threads; rclone setting $MCORE_SETTING, ckptfs default options"
        s=mcore
        mount_nodes "$s" "$MCORE_SETTING" "$MOUNT_OPTS" mcore/release
        for n in "${NODE_LIST[@]}"; do
            a=$(loglines)
            w0=$(date +%s.%N)
            timeout "$TIMEOUT" "$PYTHON" "$RUN/mcore_read.py" "$RUN/mcore.plan" "$RUN/mnt-ck-$s-$n/mcore/release" "$n" $((${LIMIT_MB:-0} << 20)) \
                >"$RUN/mcore-$n.out" &
            wait $! || die "mcore node $n: read failed: $(tail -3 "$RUN/mcore-$n.out")"
            w1=$(date +%s.%N)
            sleep 0.5
            b=$(loglines)
            row "$s" "$n" "${MOUNTB[$n]}" "$((MOUNTB[$n] + $(ua_sum "$a" "$b" "s3bench-$s-n$n" body)))" \
                "$(if [[ -n $LIMIT_MB ]]; then awk '{print $2}' "$RUN/mcore-$n.out"; else share_of "$n"; fi)" \
                "$((MOUNTG[$n] + $(ua_sum "$a" "$b" "s3bench-$s-n$n" gets)))" "$(ua_sum 0 "$b" "s3bench-$s-n$n" aborted)" \
                "$(elapsed "$w0" "$w1")"
            echo "#   node $n: the plan's items: $(cut -d' ' -f3- "$RUN/mcore-$n.out") ($(awk -v n="$n" '$1 == n {s += $5} END {printf "%.0f", s}' "$RUN/mcore.plan") bytes in the stage's full plan)"
        done
        total_row "$s"
        unmount_setting "$s"
    fi
fi

echo
echo "# ratio = bytes sent / share (goal: <= 1.1 per node; the total <= 1.1 x the model with all 8 nodes)"
echo "# GETs = ranged GET requests for objects; aborted = responses the client closed before their end"
echo "#   (rclone asks for a read chunk and drops the connection on a seek: the bytes already sent count)"
echo "# settings:"
for s in "${SETTING_LIST[@]}"; do
    if [[ $s == s3fs* ]]; then
        echo "#   $s: s3fs -o ro,use_path_request_style,stat_cache_expire=3600$(rclone_args "$s" | sed 's/^./,&/;s/CACHE_DIR/DIR/'); ckptfs -o $(ckptfs_opts "$s")"
    else
        echo "#   $s: rclone $(rclone_args "$s"); ckptfs -o $(ckptfs_opts "$s")"
    fi
done
echo "#   all rclone settings: rclone mount --read-only --vfs-cache-mode off --dir-cache-time 1h --attr-timeout 1h"
