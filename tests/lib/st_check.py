#!/usr/bin/python3
"""Independent safetensors reader / checker for ckptfs tests (numpy only, no ckptfs code).

  st_check.py compare-dir SRC_DIR VIEW_DIR [--shard-size SIZE] [--passthrough]
      Every tensor of SRC (via its index or model.safetensors) must equal the
      tensor of the same name in VIEW (names, dtypes, shapes, bytes), and the
      VIEW files must be well-formed (8-aligned header padded with spaces,
      __metadata__ {"format":"pt"}, contiguous offsets, consistent index,
      HF shard names).
      --shard-size SIZE: VIEW is a re-sharded view; check the shard assignment
        rule, file set, and the exact bytes of model.safetensors.index.json.
      --passthrough: VIEW's file set equals SRC's top-level regular files and
        every file is byte-identical.
  st_check.py manifest DIR              JSON {name: [dtype, shape, sha256]} of a checkpoint
  st_check.py compare-manifest SRC_DIR MANIFEST.json [--what TEXT]
  st_check.py expected-shards SRC_DIR SIZE   prints the expected shard layout (JSON)
  st_check.py boundary-size SRC_DIR K  prints the sum of the byte sizes of the first K tensors
  st_check.py parse-size SIZE          prints SIZE in bytes
Exit status 0 = ok; 1 = mismatch (message on stderr).
"""
import hashlib
import json
import os
import re
import struct
import sys

ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
SHARD_RE = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")


class Mismatch(Exception):
    pass


def fail(msg):
    raise Mismatch(msg)


def parse_size(text):
    m = re.fullmatch(r"(\d+)([A-Za-z]*)", text.strip())
    if not m:
        fail("bad size %r" % text)
    n = int(m.group(1))
    unit = m.group(2).upper()
    mult = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40,
            "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
            "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12}.get(unit)
    if mult is None:
        fail("bad size unit %r" % text)
    return n * mult


class STFile:
    """A parsed safetensors file. tensors: name -> dict(dtype, shape, begin, end)."""

    def __init__(self, path, strict=False):
        self.path = path
        with open(path, "rb") as f:
            self.raw = f.read()
        raw = self.raw
        if len(raw) < 8:
            fail("%s: shorter than 8 bytes" % path)
        (n,) = struct.unpack("<Q", raw[:8])
        if 8 + n > len(raw):
            fail("%s: header length %d larger than file (%d bytes)" % (path, n, len(raw)))
        hb = raw[8:8 + n]
        self.header_len = n
        try:
            text = hb.decode("utf-8")
            hdr = json.loads(text)
        except Exception as e:
            fail("%s: header is not JSON: %s" % (path, e))
        if not isinstance(hdr, dict):
            fail("%s: header is not a JSON object" % path)
        self.metadata = hdr.pop("__metadata__", None)
        self.header_keys = list(hdr.keys())
        self.data_start = 8 + n
        data_len = len(raw) - self.data_start
        self.tensors = {}
        for name, info in hdr.items():
            dt = info.get("dtype")
            if dt not in ITEMSIZE:
                fail("%s: tensor %s: unknown dtype %r" % (path, name, dt))
            shape = info.get("shape")
            b, e = info.get("data_offsets")
            cnt = 1
            for d in shape:
                cnt *= d
            if e - b != cnt * ITEMSIZE[dt] or b < 0 or e > data_len:
                fail("%s: tensor %s: offsets [%d,%d] do not fit shape %s dtype %s / data %d" %
                     (path, name, b, e, shape, dt, data_len))
            self.tensors[name] = dict(dtype=dt, shape=list(shape), begin=b, end=e)
        if strict:
            if (8 + n) % 8:
                fail("%s: 8 + header length (%d) is not a multiple of 8" % (path, 8 + n))
            stripped = text.rstrip(" ")
            if not stripped.endswith("}"):
                fail("%s: header padding is not spaces after the JSON object" % path)
            if text[:1] != "{":
                fail("%s: header does not start with '{'" % path)
            if self.metadata != {"format": "pt"}:
                fail("%s: __metadata__ is %r, want {'format': 'pt'}" % (path, self.metadata))
            order = self.data_order()
            pos = 0
            for name in order:
                t = self.tensors[name]
                if t["begin"] != pos:
                    fail("%s: tensor %s begins at %d, want %d (offsets not contiguous)" %
                         (path, name, t["begin"], pos))
                pos = t["end"]
            if pos != data_len:
                fail("%s: tensors end at %d but data region is %d bytes" % (path, pos, data_len))

    def data_order(self):
        # zero-size tensors sort by begin then by position in the header
        keys = {n: i for i, n in enumerate(self.header_keys)}
        return sorted(self.tensors, key=lambda n: (self.tensors[n]["begin"], self.tensors[n]["end"], keys[n]))

    def data(self, name):
        t = self.tensors[name]
        return self.raw[self.data_start + t["begin"]:self.data_start + t["end"]]


class Ckpt:
    """A checkpoint directory: files and tensors in source order."""

    def __init__(self, d, strict=False):
        self.dir = d
        self.files = {}
        ip = os.path.join(d, INDEX)
        self.has_index = os.path.exists(ip)
        if self.has_index:
            self.index_raw = open(ip, "rb").read()
            try:
                idx = json.loads(self.index_raw)
            except Exception as e:
                fail("%s: not JSON: %s" % (ip, e))
            wm = idx.get("weight_map")
            if not isinstance(wm, dict):
                fail("%s: no weight_map object" % ip)
            self.index = idx
            fnames = sorted(set(wm.values()))
        elif os.path.exists(os.path.join(d, SINGLE)):
            self.index = None
            fnames = [SINGLE]
        else:
            fail("%s: neither %s nor %s" % (d, INDEX, SINGLE))
        for fn in fnames:
            if "/" in fn or fn in (".", ".."):
                fail("%s: bad file name %r in index" % (d, fn))
            p = os.path.join(d, fn)
            if not os.path.isfile(p):
                fail("%s: index names missing file %s" % (d, fn))
            self.files[fn] = STFile(p, strict=strict)
        self.order = []  # (name, file)
        self.where = {}
        for fn in fnames:
            for name in self.files[fn].data_order():
                if name in self.where:
                    fail("%s: tensor %s in both %s and %s" % (d, name, self.where[name], fn))
                self.where[name] = fn
                self.order.append(name)
        if self.has_index:
            wm = self.index["weight_map"]
            for name, fn in self.where.items():
                if wm.get(name) != fn:
                    fail("%s: weight_map[%s] = %r but the tensor is in %s" % (ip, name, wm.get(name), fn))
            extra = set(wm) - set(self.where)
            if extra:
                fail("%s: weight_map names tensors not in any file: %s" % (ip, sorted(extra)[:5]))
            if strict:
                md = self.index.get("metadata", {})
                total = sum(self.nbytes(n) for n in self.order)
                if md.get("total_size") != total:
                    fail("%s: total_size %r, want %d" % (ip, md.get("total_size"), total))
        if strict:
            check_shard_names(d, list(self.files), self.has_index)

    def info(self, name):
        return self.files[self.where[name]].tensors[name]

    def nbytes(self, name):
        t = self.info(name)
        return t["end"] - t["begin"]

    def data(self, name):
        return self.files[self.where[name]].data(name)


def check_shard_names(d, fnames, has_index):
    if not has_index:
        if fnames != [SINGLE]:
            fail("%s: no index but weight files %s" % (d, fnames))
        return
    ks = []
    ns = set()
    for fn in fnames:
        m = SHARD_RE.match(fn)
        if not m:
            fail("%s: shard name %r is not model-KKKKK-of-NNNNN.safetensors" % (d, fn))
        ks.append(int(m.group(1)))
        ns.add(int(m.group(2)))
    if len(ns) != 1:
        fail("%s: shards disagree on the shard count: %s" % (d, sorted(fnames)))
    n = ns.pop()
    if sorted(ks) != list(range(1, n + 1)):
        fail("%s: shard numbers %s, want 1..%d" % (d, sorted(ks), n))


def top_files(d):
    """Top-level regular files (symlinks to regular files count, as stat() sees them)."""
    return sorted(f for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))


def is_weight_file(fn):
    return fn.endswith(".safetensors") or fn == INDEX


def expected_shards(src, size):
    """The re-sharding rule, computed independently: list of lists of tensor names."""
    shards = []
    cur, cur_bytes = [], 0
    for name in src.order:
        nb = src.nbytes(name)
        if cur and cur_bytes + nb > size:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(name)
        cur_bytes += nb
    if cur or not shards:
        shards.append(cur)
    return shards


def compare_tensors(src, view, what):
    if set(src.order) != set(view.order):
        missing = sorted(set(src.order) - set(view.order))
        extra = sorted(set(view.order) - set(src.order))
        fail("%s: tensor names differ: missing %s extra %s" % (what, missing[:5], extra[:5]))
    for name in src.order:
        a, b = src.info(name), view.info(name)
        if a["dtype"] != b["dtype"]:
            fail("%s: %s dtype %s != %s" % (what, name, b["dtype"], a["dtype"]))
        if a["shape"] != b["shape"]:
            fail("%s: %s shape %s != %s" % (what, name, b["shape"], a["shape"]))
        if src.data(name) != view.data(name):
            da, db = src.data(name), view.data(name)
            i = next((i for i in range(min(len(da), len(db))) if da[i] != db[i]), min(len(da), len(db)))
            fail("%s: %s bytes differ (first difference at byte %d of %d)" % (what, name, i, len(da)))


def cmd_compare_dir(args):
    shard_size = None
    passthrough = False
    pos = []
    i = 0
    while i < len(args):
        if args[i] == "--shard-size":
            shard_size = parse_size(args[i + 1])
            i += 2
        elif args[i] == "--passthrough":
            passthrough = True
            i += 1
        else:
            pos.append(args[i])
            i += 1
    src_dir, view_dir = pos
    src = Ckpt(src_dir)
    view = Ckpt(view_dir, strict=True)
    compare_tensors(src, view, view_dir)
    nonweight = [f for f in top_files(src_dir) if not is_weight_file(f)]
    vfiles = top_files(view_dir)
    if passthrough:
        sfiles = top_files(src_dir)
        if vfiles != sfiles:
            fail("%s: files %s, want %s" % (view_dir, vfiles, sfiles))
        for f in sfiles:
            if open(os.path.join(src_dir, f), "rb").read() != open(os.path.join(view_dir, f), "rb").read():
                fail("%s/%s differs from the source file" % (view_dir, f))
        # the view's data order within each file must be the source's
        for fn, stf in src.files.items():
            if view.files[fn].data_order() != stf.data_order():
                fail("%s/%s: data order differs from source" % (view_dir, fn))
    if shard_size is not None:
        exp = expected_shards(src, shard_size)
        n = len(exp)
        if n == 1:
            names = [SINGLE]
        else:
            names = ["model-%05d-of-%05d.safetensors" % (k, n) for k in range(1, n + 1)]
        want_files = sorted(nonweight + names + ([INDEX] if n > 1 else []))
        if vfiles != want_files:
            fail("%s (shard size %d): files %s, want %s" % (view_dir, shard_size, vfiles, want_files))
        for fn, tensor_names in zip(names, exp):
            got = view.files[fn].data_order()
            if got != tensor_names:
                fail("%s/%s: tensors (data order) %s..., want %s..." % (view_dir, fn, got[:4], tensor_names[:4]))
        if n > 1:
            wm = {t: fn for fn, ts in zip(names, exp) for t in ts}
            total = sum(src.nbytes(t) for t in src.order)
            want = (json.dumps({"metadata": {"total_size": total}, "weight_map": wm},
                               indent=2, sort_keys=True) + "\n").encode()
            if view.index_raw != want:
                fail("%s/%s: bytes differ from json.dumps(indent=2, sort_keys=True) + newline\n got: %r\nwant: %r" %
                     (view_dir, INDEX, view.index_raw[:200], want[:200]))
        for f in nonweight:
            if open(os.path.join(src_dir, f), "rb").read() != open(os.path.join(view_dir, f), "rb").read():
                fail("%s/%s differs from the source file" % (view_dir, f))
    print("ok: %d tensors, %d weight files in %s" % (len(view.order), len(view.files), view_dir))


def manifest(ck):
    return {n: [ck.info(n)["dtype"], ck.info(n)["shape"], hashlib.sha256(ck.data(n)).hexdigest()]
            for n in ck.order}


def cmd_compare_manifest(args):
    what = "manifest"
    if "--what" in args:
        i = args.index("--what")
        what = args[i + 1]
        args = args[:i] + args[i + 2:]
    src_dir, mpath = args
    want = manifest(Ckpt(src_dir))
    got = json.load(open(mpath))
    if set(got) != set(want):
        fail("%s: tensor names differ: missing %s extra %s" %
             (what, sorted(set(want) - set(got))[:5], sorted(set(got) - set(want))[:5]))
    for n in sorted(want):
        if [got[n][0], list(got[n][1]), got[n][2]] != want[n]:
            fail("%s: tensor %s: got %s, want %s" % (what, n, got[n], want[n]))
    print("ok: %s: %d tensors match" % (what, len(want)))


def main(argv):
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[0], argv[1:]
    try:
        if cmd == "compare-dir":
            cmd_compare_dir(args)
        elif cmd == "manifest":
            json.dump(manifest(Ckpt(args[0])), sys.stdout, indent=1, sort_keys=True)
            print()
        elif cmd == "compare-manifest":
            cmd_compare_manifest(args)
        elif cmd == "expected-shards":
            src = Ckpt(args[0])
            print(json.dumps(expected_shards(src, parse_size(args[1]))))
        elif cmd == "boundary-size":
            src = Ckpt(args[0])
            print(sum(src.nbytes(n) for n in src.order[:int(args[1])]))
        elif cmd == "parse-size":
            print(parse_size(args[0]))
        elif cmd == "validate":
            Ckpt(args[0], strict=True)
            print("ok")
        else:
            print("unknown command %s" % cmd, file=sys.stderr)
            return 2
    except Mismatch as e:
        print("st_check: MISMATCH: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
