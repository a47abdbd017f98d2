#!/usr/bin/env bash
# A checkpoint in an object store: a tiny model uploaded through the S3 API (rclone copy) into a
# local S3 emulator (s3rver on 127.0.0.1), mounted by rclone, mounted by ckptfs: hf/ and the
# tp2pp1 rank files are byte-identical to a ckptfs mount of the local copy; reading one rank file
# fetches a bounded number of bytes from the server (counted in the server process); a missing
# object and a stopped server give I/O errors, never wrong bytes, never a hang. The same views
# through s3fs, where it is installed.
# Needs node, rclone (apt) and s3rver 3.x (npm): scripts/install-deps.sh --tests installs them,
# s3rver into /opt/ckptfs-test/s3rver; S3RVER=PREFIX points at another npm prefix holding it.
source "$(dirname "$0")/../lib/common.sh"
require_fuse
models="$TESTS_TOP/tests/lib/models.py"
S3RVER=${S3RVER:-/opt/ckptfs-test/s3rver}
for c in node rclone; do
  command -v "$c" > /dev/null || { echo "1..0 # skip $c missing (scripts/install-deps.sh --tests installs it)"; exit 0; }
done
if [[ ! -e $S3RVER/node_modules/s3rver/package.json ]]; then
  echo "1..0 # skip no s3rver in $S3RVER (scripts/install-deps.sh --tests installs it with npm; or set S3RVER=PREFIX)"
  exit 0
fi

# s3rver inside a wrapper that logs every response (User-Agent, Range, status, body bytes written).
cat > "$WORK/s3acct.js" <<'EOF'
'use strict';
const http = require('http');
const fs = require('fs');
const [prefix, dir, logPath, portFile] = process.argv.slice(2);
const S3rver = require(require.resolve('s3rver', { paths: [prefix + '/node_modules'] }));
const app = new S3rver({ directory: dir, address: '127.0.0.1', port: 0, silent: true });
const log = fs.openSync(logPath, 'a');
const server = http.createServer();
server.on('request', (req, res) => {
  let written = 0, done = false;
  const w = res.write, e = res.end;
  const add = (c) => { if (c && typeof c !== 'function') written += Buffer.byteLength(c); };
  res.write = function (c, ...a) { add(c); return w.call(this, c, ...a); };
  res.end = function (c, ...a) { add(c); return e.call(this, c, ...a); };
  const fin = () => {
    if (done) return;
    done = true;
    fs.writeSync(log, JSON.stringify({ m: req.method, u: req.url, ua: req.headers['user-agent'] || '',
      range: req.headers.range || null, st: res.statusCode, body: written - (res.writableLength || 0) }) + '\n');
  };
  res.on('finish', fin);
  res.on('close', fin);
});
server.on('request', app.callback());
app.configureBuckets().then(() => server.listen(0, '127.0.0.1', () => fs.writeFileSync(portFile, String(server.address().port))));
process.on('SIGTERM', () => process.exit(0));
EOF
mkdir -p "$WORK/store"
node "$WORK/s3acct.js" "$S3RVER" "$WORK/store" "$WORK/acct.log" "$WORK/port" > "$WORK/s3rver.log" 2>&1 &
srv=$!
rclone_pids=()
# Unmount ckptfs first, then rclone (whose files ckptfs holds open), then stop the server.
s3_cleanup() {
  local m p
  for m in $(awk -v w="$WORK/" '$3 == "fuse.ckptfs" && index($2, w) == 1 {print $2}' /proc/mounts); do
    fusermount3 -u "$m" 2> /dev/null || fusermount3 -uz "$m" 2> /dev/null || true
  done
  # The daemons close their files of the clients' mounts on the way out.
  for _ in $(seq 100); do pgrep -f -- " $WORK/m-[^ ]+\$" > /dev/null || break; sleep 0.1; done
  for m in $(awk -v w="$WORK/" '($3 == "fuse.rclone" || $3 == "fuse.s3fs") && index($2, w) == 1 {print $2}' /proc/mounts); do
    fusermount3 -u "$m" 2> /dev/null || fusermount3 -uz "$m" 2> /dev/null || true
  done
  pkill -f -- "^s3fs ckpt $WORK/" 2> /dev/null || true
  for p in "${rclone_pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
    kill "$p" 2> /dev/null || true
  done
  kill "$srv" 2> /dev/null || true
  wait 2> /dev/null
  _cleanup
}
trap s3_cleanup EXIT
for _ in $(seq 100); do [[ -s $WORK/port ]] && break; sleep 0.1; done
if [[ ! -s $WORK/port ]]; then
  echo "1..0 # skip s3rver did not start: $(tail -c 300 "$WORK/s3rver.log")"
  exit 0
fi
port=$(cat "$WORK/port")
ok 0 "s3rver $(node -p "require('$S3RVER/node_modules/s3rver/package.json').version") listens on 127.0.0.1:$port"

export RCLONE_CONFIG=$WORK/rclone.conf
: > "$RCLONE_CONFIG"
export RCLONE_CONFIG_S3_TYPE=s3 RCLONE_CONFIG_S3_PROVIDER=Other RCLONE_CONFIG_S3_ENV_AUTH=false \
  RCLONE_CONFIG_S3_ACCESS_KEY_ID=S3RVER RCLONE_CONFIG_S3_SECRET_ACCESS_KEY=S3RVER \
  RCLONE_CONFIG_S3_ENDPOINT=http://127.0.0.1:$port RCLONE_CONFIG_S3_FORCE_PATH_STYLE=true
unset AWS_CA_BUNDLE # rclone 1.60 refuses a custom CA bundle with its own transport; plain http here

src=$WORK/src
$PY "$models" write llama "$src" --shards 2 > /dev/null
check "rclone mkdir + copy the model into the bucket" bash -c 'rclone mkdir s3:ckpt && rclone copy "$1" s3:ckpt' _ "$src"
rclone lsl s3:ckpt > "$WORK/listing" 2>&1
check "the bucket lists the source's files with their sizes" \
  cmp <(awk '{print $4, $1}' "$WORK/listing" | sort) <(cd "$src" && stat -c '%n %s' * | sort)

# rclone_mount NAME [FLAGS...]: a read-only rclone mount at $WORK/c-NAME, requests marked with the
# User-Agent "t-NAME". (ckptfs mounts are named m-*: unmounted before the c-* they read.)
rclone_mount() {
  local name=$1 mnt=$WORK/c-$1
  shift
  mkdir -p "$mnt"
  rclone mount s3:ckpt "$mnt" --read-only --vfs-cache-mode off --dir-cache-time 1h --attr-timeout 1h \
    --user-agent "t-$name" --log-file "$WORK/rclone-$name.log" "$@" < /dev/null > /dev/null 2>&1 &
  rclone_pids+=($!)
  for _ in $(seq 100); do
    awk -v m="$mnt" '$2 == m && $3 == "fuse.rclone" {f = 1} END {exit !f}' /proc/mounts && return 0
    sleep 0.1
  done
  echo "# rclone mount $name did not come up: $(tail -3 "$WORK/rclone-$name.log")"
  return 1
}
# fetched UA: body bytes the server sent for object GETs of User-Agent UA.
fetched() {
  $PY -c '
import json, sys
ua = sys.argv[1]
rs = [json.loads(l) for l in sys.stdin]
rs = [r for r in rs if r["ua"].split(" ")[0] == ua and r["m"] == "GET" and "/" in r["u"].split("?")[0].strip("/")]
print(sum(r["body"] for r in rs), len(rs))' "$1" < "$WORK/acct.log"
}

rclone_mount cmp; ok $? "rclone mount of the bucket (cmp)"
check "ckptfs mount of the rclone mount" mount_ckptfs "$WORK/c-cmp" "$WORK/m-s3" -o layouts=tp2pp1
check "ckptfs mount of the local copy" mount_ckptfs "$src" "$WORK/m-local" -o layouts=tp2pp1
same_files() { # same_files MNT VIEW: every file of VIEW is byte-identical on MNT and the local mount
  local f n=0 bad=0
  while IFS= read -r f; do
    n=$((n + 1))
    timeout 60 cmp "$WORK/m-local/$2/$f" "$1/$2/$f" || bad=1
  done < <(cd "$WORK/m-local/$2" && find . -type f | sort)
  echo "$n files"
  [[ $n -gt 0 && $bad -eq 0 ]]
}
check "hf/: every file byte-identical through the object store" same_files "$WORK/m-s3" hf
check "tp2pp1/: both rank files byte-identical through the object store" same_files "$WORK/m-s3" tp2pp1

# s3fs (its smallest part size, one part at a time: what bench/s3_bench.sh found to fetch least).
if command -v s3fs > /dev/null; then
  echo "S3RVER:S3RVER" > "$WORK/s3fs.passwd"
  chmod 600 "$WORK/s3fs.passwd"
  mkdir -p "$WORK/c-s3fs"
  check "s3fs mount of the bucket" s3fs ckpt "$WORK/c-s3fs" -o "ro,umask=0222,url=http://127.0.0.1:$port" \
    -o "use_path_request_style,passwd_file=$WORK/s3fs.passwd,multipart_size=5,parallel_count=1,logfile=$WORK/s3fs.log"
  check "ckptfs mount of the s3fs mount" mount_ckptfs "$WORK/c-s3fs" "$WORK/m-s3fs" -o layouts=tp2pp1
  check "hf/: every file byte-identical through s3fs" same_files "$WORK/m-s3fs" hf
  check "tp2pp1/: both rank files byte-identical through s3fs" same_files "$WORK/m-s3fs" tp2pp1
  # Unmounted while the server runs: s3fs asks the server again when ckptfs closes its files.
  fusermount3 -u "$WORK/m-s3fs"
  for _ in $(seq 100); do pgrep -f -- " $WORK/m-s3fs\$" > /dev/null || break; sleep 0.1; done
  fusermount3 -u "$WORK/c-s3fs"
  for _ in $(seq 100); do pgrep -f -- "^s3fs ckpt $WORK/" > /dev/null || break; sleep 0.1; done
  pgrep -f -- "^s3fs ckpt $WORK/" > /dev/null
  ok $((1 - $?)) "ckptfs, then s3fs, unmount and exit"
else
  skip "s3fs missing (scripts/install-deps.sh --tests installs it): no s3fs checks"
fi

# Bytes fetched for one rank file: everything the fresh mounts below fetched (ckptfs reads the
# headers when it mounts, and rclone reads ahead of those reads: that counts too). The rank file
# needs its TP share of every tensor (norms whole): about half the model. rclone asks for read
# chunks of 128 MiB (more than these 0.3 MB shards) and buffers 16 MiB ahead, so a GET returns
# the rest of an object from where it starts, and a jump of the reader elsewhere in a shard can
# make rclone reopen there. Bound: the share, plus one whole pass over the source files (each
# object sent at most once more than needed) and 64 KiB per GET in flight when rclone dropped a
# connection. A GET per small read (each re-sending the rest of an object) breaks it.
rank=tp2pp1/release/mp_rank_00/model_optim_rng.pt
rclone_mount rank; ok $? "fresh rclone mount (rank)"
check "fresh ckptfs mount of it" mount_ckptfs "$WORK/c-rank" "$WORK/m-rank" -o layouts=tp2pp1
check "read one tp2pp1 rank file through the object store" timeout 60 cmp "$WORK/m-local/$rank" "$WORK/m-rank/$rank"
sleep 0.5
read -r got gets < <(fetched t-rank)
share=$($PY - "$src" <<'PY'
import json, os, struct, sys
tot = 0
for n in os.listdir(sys.argv[1]):
    if n.endswith(".safetensors"):
        f = open(os.path.join(sys.argv[1], n), "rb")
        h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        for k, v in h.items():
            if k != "__metadata__":
                b = v["data_offsets"][1] - v["data_offsets"][0]
                tot += b if "norm" in k else b // 2
print(tot)
PY
)
srcbytes=$(cat "$src"/*.safetensors | wc -c)
bound=$((share + srcbytes + gets * 65536))
[[ $got -ge $share && $got -le $bound ]]
ok $? "mount + one rank file fetched $got bytes in $gets GETs (share $share, source files $srcbytes; bound $bound)"
diag "their ranges: $(grep '"ua":"t-rank' "$WORK/acct.log" | grep '"m":"GET"' | grep -o 'bytes=[0-9-]*' | tr '\n' ' ')"

# Below, rclone fetches 64 KiB at a time and keeps nothing ahead: the mount's header reads leave
# most of each shard unfetched, so the reads after the failure need the server.
small=(--vfs-read-chunk-size 64k --vfs-read-chunk-size-limit 64k --buffer-size 0 --low-level-retries 1 --retries 1)
# A missing object: deleted behind the mounts' back (rclone's directory cache still lists it).
rclone_mount gone "${small[@]}"; ok $? "fresh rclone mount (gone)"
check "fresh ckptfs mount of it" mount_ckptfs "$WORK/c-gone" "$WORK/m-gone" -o layouts=tp2pp1
ls -l "$WORK/m-gone/tp2pp1/release/mp_rank_01/" > /dev/null
check "delete model-00002-of-00002.safetensors from the bucket" rclone deletefile s3:ckpt/model-00002-of-00002.safetensors
rank1=tp2pp1/release/mp_rank_01/model_optim_rng.pt
timeout 60 cat "$WORK/m-gone/$rank1" > "$WORK/partial" 2> "$WORK/err" && rc=0 || rc=$?
[[ $rc -ne 0 && $rc -ne 124 ]] && grep -q "Input/output error" "$WORK/err"
ok $? "reading a rank file that needs the missing object fails with EIO (rc $rc: $(head -c 200 "$WORK/err"))"
check "  the bytes delivered before the error are the right ones" cmp -n "$(stat -c %s "$WORK/partial")" "$WORK/partial" "$WORK/m-local/$rank1"
timeout 60 cat "$WORK/m-gone/hf/model-00002-of-00002.safetensors" > /dev/null 2> "$WORK/err" && rc=0 || rc=$?
[[ $rc -ne 0 && $rc -ne 124 ]] && grep -q "Input/output error" "$WORK/err"
ok $? "hf/ of the missing object: EIO (rc $rc)"

# A stopped server: connection refused under every read that is not cached yet.
check "upload the object again" rclone copyto "$src/model-00002-of-00002.safetensors" s3:ckpt/model-00002-of-00002.safetensors
rclone_mount down "${small[@]}" --contimeout 5s --timeout 10s; ok $? "fresh rclone mount (down)"
check "fresh ckptfs mount of it" mount_ckptfs "$WORK/c-down" "$WORK/m-down" -o layouts=tp2pp1
ls -l "$WORK/m-down/tp2pp1/release/mp_rank_00/" > /dev/null
kill "$srv"
wait "$srv" 2> /dev/null
t0=$SECONDS
timeout 60 cat "$WORK/m-down/$rank" > "$WORK/partial" 2> "$WORK/err" && rc=0 || rc=$?
[[ $rc -ne 0 && $rc -ne 124 ]] && grep -q "Input/output error" "$WORK/err"
ok $? "with the server stopped, a rank file read fails with EIO in $((SECONDS - t0)) s (rc $rc: $(head -c 200 "$WORK/err"))"
check "  the bytes delivered before the error are the right ones" cmp -n "$(stat -c %s "$WORK/partial")" "$WORK/partial" "$WORK/m-local/$rank"
done_testing
