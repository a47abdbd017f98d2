#!/usr/bin/python3
"""Hostile sizes, offsets, strides and counts: sources whose numbers overflow 64-bit arithmetic
or ask the daemon to hold too much, and torch.save archives whose ZIP64 end records contradict
the classic ones. Runs with /usr/bin/python3 (torch 1.13, numpy); everything is made from good
checkpoints ckptfs exported, at the pickle and zip level (torch 1.13 has no
torch.distributed.checkpoint: its classes are stand-ins with the same names).

  hostile_sizes.py cases HF LEGACY MCORE OUT
      HF: a Hugging Face checkpoint (models.py write llama); LEGACY: `ckptfs export HF tp1pp1`;
      MCORE: `ckptfs export HF mcore`. Writes OUT/<case>/ (a source directory) and prints one
      line per case: CASE<TAB>substring<TAB>substring... (what the one-line error must hold).
  hostile_sizes.py zip-torch DIR
      For each zip-* case under DIR: whether torch.load refuses its rank file (CASE refused|accepted).
  hostile_sizes.py big-metadata MCORE OUT MB
      A torch_dist checkpoint whose .metadata is about MB megabytes of real-looking entries
      (optimizer keys, which ckptfs reads and skips): for measuring the pickle reader's memory.
"""
import copy
import copyreg
import io
import json
import os
import pickle
import shutil
import struct
import sys
import types
import zipfile
import zlib

import torch

U64_MAX = (1 << 64) - 1


# --- pickles of torch.save archives, rewritten without running anything but stand-ins ---

class Pid:
    """A persistent id (a storage reference), kept as it was read."""

    def __init__(self, pid):
        self.pid = pid


class TensorStub:
    """torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...), arguments editable."""

    def __init__(self, args):
        self.args = list(args)

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, tuple(self.args))


class Stub:
    """Any class torch 1.13 lacks (torch.distributed.checkpoint's): arguments and state kept."""
    _args = None
    _state = None

    def __init__(self, *args):
        self._args = args

    def __setstate__(self, state):
        self._state = state

    def __reduce__(self):
        if self._args is not None:
            return (type(self), self._args) + ((self._state,) if self._state is not None else ())
        return (copyreg.__newobj__, (type(self),), self._state)


def stub_class(module, name):
    mod = sys.modules.get(module)
    if mod is None:
        mod = sys.modules[module] = types.ModuleType(module)
    cls = getattr(mod, name, None)
    if cls is None:
        cls = type(name, (Stub,), {"__module__": module, "__qualname__": name})
        setattr(mod, name, cls)
    return cls


class Reader(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda *a: TensorStub(a)
        if module.startswith("torch.distributed.checkpoint"):
            return stub_class(module, name)
        return super().find_class(module, name)

    def persistent_load(self, pid):
        return Pid(pid)


class Writer(pickle.Pickler):
    def persistent_id(self, obj):
        return obj.pid if isinstance(obj, Pid) else None


def loads(data):
    return Reader(io.BytesIO(data)).load()


def dumps(obj):
    out = io.BytesIO()
    Writer(out, protocol=2).dump(obj)
    return out.getvalue()


def long1(v):
    """A pickle LONG1 opcode for V (any size, signed)."""
    n = (v.bit_length() + 8) // 8
    return b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True)


# --- zip archives as torch.save writes them (STORED), read and rewritten ---

def zip_entries(data):
    """(name, bytes) of each STORED entry, read raw: ckptfs writes CRC-32 0 by default, which
    zipfile would refuse to read back."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        out = []
        for i in z.infolist():
            name_len, extra_len = struct.unpack_from("<HH", data, i.header_offset + 26)
            at = i.header_offset + 30 + name_len + extra_len
            out.append((i.filename, data[at:at + i.compress_size]))
        return out


def zip_write(f, entries):
    """A STORED zip archive of ENTRIES (name, bytes or a size) written to file F: a size is an
    entry left as a hole (sparse, zeros, CRC-32 0), so tests can hold huge records for free."""
    start = f.tell()
    central = b""
    for name, body in entries:
        raw_name = name.encode()
        size = body if isinstance(body, int) else len(body)
        crc = 0 if isinstance(body, int) else zlib.crc32(body)
        at = f.tell() - start
        f.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0, crc, size, size,
                            len(raw_name), 0) + raw_name)
        if isinstance(body, int):
            f.seek(size, 1)
        else:
            f.write(body)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0, crc, size,
                               size, len(raw_name), 0, 0, 0, 0, 0, at) + raw_name
    cd_at = f.tell() - start
    f.write(central)
    f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central),
                        cd_at, 0))


def zip_build(entries):
    out = io.BytesIO()
    zip_write(out, entries)
    return out.getvalue()


def archive_edit_pickle(data, edit):
    """The archive DATA with its data.pkl loaded, passed to EDIT (which changes it in place or
    returns raw pickle bytes), and written back."""
    entries = zip_entries(data)
    out = []
    for name, body in entries:
        if name.endswith("/data.pkl"):
            obj = loads(body)
            raw = edit(obj)
            body = raw if isinstance(raw, bytes) else dumps(obj)
        out.append((name, body))
    return zip_build(out)


def rank_file(d):
    return os.path.join(d, "release", "mp_rank_00", "model_optim_rng.pt")


def copy_source(src, out, case):
    d = os.path.join(out, case)
    shutil.copytree(src, d)
    return d


# --- torch_dist: .metadata and the chunk archives in .distcp files ---

def md_load(d):
    with open(os.path.join(d, ".metadata"), "rb") as f:
        return loads(f.read())


def md_save(d, md):
    with open(os.path.join(d, ".metadata"), "wb") as f:
        f.write(dumps(md))


def st(obj):
    return obj._state


def storage_entry(md, fqn):
    """The first (MetadataIndex, _StorageInfo) of FQN."""
    for k, v in st(md)["storage_data"].items():
        if st(k)["fqn"] == fqn:
            return k, v
    raise KeyError(fqn)


def replace_archive(d, info, edit):
    """The chunk archive _StorageInfo INFO points to, its pickle edited, appended to its .distcp
    file; INFO then points to the new copy."""
    path = os.path.join(d, st(info)["relative_path"])
    with open(path, "rb") as f:
        f.seek(st(info)["offset"])
        archive = f.read(st(info)["length"])
    new = archive_edit_pickle(archive, edit)
    with open(path, "ab") as f:
        at = f.seek(0, 2)
        f.write(new)
    st(info)["offset"], st(info)["length"] = at, len(new)


def rel(mcore):
    return os.path.join(mcore, "release")


# --- the cases ---

def st_file(path, header, data=b""):
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


def st_raw(path, header_text, data=b""):
    raw = header_text.encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


def safetensors_cases(out, case):
    def one(name, header_text, data=b""):
        d = os.path.join(out, name)
        os.makedirs(d)
        st_raw(os.path.join(d, "model.safetensors"), header_text, data)
        return d

    # 2^64 - 1 does not fit in JSON's signed 64 bits (nor in an element count with any itemsize).
    case("st-shape-u64max", ["model.safetensors", "18446744073709551615"],
         one("st-shape-u64max", '{"w":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}}'))
    case("st-shape-negative", ["model.safetensors", "'w'", "shape[1] -4 is negative"],
         one("st-shape-negative", '{"w":{"dtype":"U8","shape":[2,-4],"data_offsets":[0,8]}}', b"\0" * 8))
    case("st-shape-float", ["model.safetensors", "'w'", "shape[0] is not an integer"],
         one("st-shape-float", '{"w":{"dtype":"U8","shape":[8.5],"data_offsets":[0,8]}}', b"\0" * 8))
    # [2^62, 8] elements: the product wraps to 0, as do data_offsets [0, 0].
    case("st-numel-wraps", ["model.safetensors", "'w'", "shape [4611686018427387904, 8]",
                            "overflows 64 bits"],
         one("st-numel-wraps", '{"w":{"dtype":"U8","shape":[4611686018427387904,8],"data_offsets":[0,0]}}'))
    # 2^62 F32 elements fit; their bytes (2^64) do not.
    case("st-bytes-wrap", ["model.safetensors", "'w'", "4611686018427387904 F32 elements",
                           "overflows 64 bits"],
         one("st-bytes-wrap", '{"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}}'))
    big = (1 << 63) - 1
    case("st-offsets-near-2^63", ["model.safetensors", "'w'", "past the end"],
         one("st-offsets-near-2^63",
             '{"w":{"dtype":"U8","shape":[4],"data_offsets":[%d,%d]}}' % (big - 4, big), b"\0" * 4))
    case("st-offset-u64max", ["model.safetensors", "18446744073709551615"],
         one("st-offset-u64max", '{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,18446744073709551615]}}'))

    # More tensors in one header than the cap: empty tensors, so the file is only its header.
    n = (1 << 18) + 1
    entry = '"t%07d":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}'
    case("st-too-many-tensors", ["model.safetensors", "262145 tensors", "limit 262144"],
         one("st-too-many-tensors", "{" + ",".join(entry % i for i in range(n)) + "}"))
    # An index naming more tensors than a source may hold.
    d = os.path.join(out, "hf-index-too-many-tensors")
    os.makedirs(d)
    n = (1 << 19) + 1
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {"t%07d" % i: "model-00001-of-00001.safetensors"
                                                   for i in range(n)}}, f, separators=(",", ":"))
    case("hf-index-too-many-tensors", ["model.safetensors.index.json", "524289 tensors",
                                       "limit 524288"], d)


def legacy_cases(legacy, out, case):
    # decoder.final_layernorm.weight: 64 bf16 elements. A stride that makes its last element
    # (7 + 63 * stride + 1) * 2 = 2^64 bytes wrap to 0, which passes `end <= record size`.
    stride = ((1 << 63) - 2) // 63
    offset = (1 << 63) - (63 * stride + 1)
    d = copy_source(legacy, out, "legacy-stride-wraps")
    key = "decoder.final_layernorm.weight"

    def wrap(obj):
        t = obj["model"][key]
        t.args[1], t.args[3] = offset, (stride,)

    path = rank_file(d)
    data = open(path, "rb").read()
    open(path, "wb").write(archive_edit_pickle(data, wrap))
    case("legacy-stride-wraps", ["model_optim_rng.pt", "'%s'" % key, "stride %d" % stride, "overflows"], d)

    # A storage offset near 2^63 elements: offset * 2 bytes wraps.
    d = copy_source(legacy, out, "legacy-offset-wraps")

    def far(obj):
        obj["model"][key].args[1] = (1 << 63) - 64

    path = rank_file(d)
    data = open(path, "rb").read()
    open(path, "wb").write(archive_edit_pickle(data, far))
    case("legacy-offset-wraps", ["model_optim_rng.pt", "'%s'" % key, "9223372036854775744"], d)

    # data.pkl bigger than a rank pickle may be: a sparse zip entry of 300 MB would be read whole.
    d = copy_source(legacy, out, "legacy-pickle-too-big")
    path = rank_file(d)
    entries = zip_entries(open(path, "rb").read())
    with open(path, "wb") as f:
        zip_write(f, [(name, 300 << 20 if name.endswith("/data.pkl") else body)
                      for name, body in entries])
    case("legacy-pickle-too-big", ["model_optim_rng.pt", "data.pkl", "limit"], d)


def zip_variants(legacy, out, case):
    """ZIP64 end records that contradict the classic end record (torch.load refuses each)."""
    good = open(rank_file(legacy), "rb").read()
    eocd = good.rfind(b"PK\x05\x06")
    loc = eocd - 20
    rec = loc - 56
    assert good[loc:loc + 4] == b"PK\x06\x07" and good[rec:rec + 4] == b"PK\x06\x06"
    count = struct.unpack_from("<Q", good, rec + 32)[0]
    cd_offset = struct.unpack_from("<Q", good, rec + 48)[0]

    def patched(*edits):
        d = bytearray(good)
        for off, fmt, v in edits:
            struct.pack_into(fmt, d, off, v)
        return bytes(d)

    variants = {
        # ZIP64 record: +24 entries on this disk, +32 entries, +40 directory size, +48 its offset.
        "zip-z64-count-fewer": (patched((rec + 24, "<Q", count - 1), (rec + 32, "<Q", count - 1)),
                                ["ZIP64 end record", "%d entries" % (count - 1), "%d" % count]),
        "zip-z64-count-more": (patched((rec + 24, "<Q", count + 1), (rec + 32, "<Q", count + 1)),
                               ["ZIP64 end record", "%d entries" % (count + 1)]),
        "zip-z64-offset": (patched((rec + 48, "<Q", cd_offset - 1)),
                           ["ZIP64 end record", "offset %d" % (cd_offset - 1)]),
        "zip-z64-disk-count": (patched((rec + 24, "<Q", count - 1)), ["ZIP64 end record", "disk"]),
        "zip-locator-outside": (patched((loc + 8, "<Q", len(good) + 100)),
                                ["ZIP64 locator", "outside"]),
        "zip-locator-disks": (patched((loc + 16, "<I", 2)), ["ZIP64 locator", "disks"]),
        "zip-z64-record-size": (patched((rec + 4, "<Q", 40)), ["ZIP64 end record", "size"]),
        # The locator points at something that is not a ZIP64 end record, and the classic
        # record's offset is saturated: no reader can find the directory.
        "zip-z64-bad-signature": (patched((rec, "<I", 0x06064B51), (eocd + 16, "<I", 0xFFFFFFFF)),
                                  ["no ZIP64 end record"]),
        # Saturated classic fields and no ZIP64 records at all.
        "zip-saturated-no-zip64": (patched((loc, "<I", 0), (eocd + 16, "<I", 0xFFFFFFFF)),
                                   ["ZIP64", "without a ZIP64 locator"]),
    }
    for name, (data, expect) in variants.items():
        d = copy_source(legacy, out, name)
        open(rank_file(d), "wb").write(data)
        case(name, ["model_optim_rng.pt"] + expect, d)


def torch_dist_cases(mcore, out, case):
    norm = "decoder.final_layernorm.weight"
    # The norm's chunk archive: its tensor's storage offset 2^63 - 64 elements (bf16, 64 of
    # them): (offset + numel) * 2 = 2^64 wraps to 0 and the bytes served came from before the
    # record (zip headers of the archive).
    d = copy_source(mcore, out, "td-offset-wraps")
    md = md_load(rel(d))
    _, info = storage_entry(md, norm)

    def far(obj):
        obj.args[1] = (1 << 63) - 64

    replace_archive(rel(d), info, far)
    md_save(rel(d), md)
    case("td-offset-wraps", ["__0_0.distcp", "'%s'" % norm, "9223372036854775744", "overflows"], d)

    # The embedding as [2^58, 64] in .metadata and in its one chunk's archive: 2^64 elements,
    # numel wraps to 0, and its rows were served from far past the record. The padded vocabulary
    # is args.padded_vocab_size now, so the row count is refused before the chunk is read (the
    # chunk's own overflow check stays behind it).
    emb = "embedding.word_embeddings.weight"
    d = copy_source(mcore, out, "td-numel-wraps")
    md = md_load(rel(d))
    tsm = st(md)["state_dict_metadata"][emb]
    hidden = st(tsm)["size"][1]
    rows = 1 << 58
    first = st(tsm)["chunks"][0]
    st(first)["offsets"], st(first)["sizes"] = torch.Size((0, 0)), torch.Size((rows, hidden))
    st(tsm)["chunks"] = [first]
    st(tsm)["size"] = torch.Size((rows, hidden))
    storage = st(md)["storage_data"]
    for k in [k for k in storage if st(k)["fqn"] == emb and tuple(st(k)["offset"]) != (0, 0)]:
        del storage[k]
    _, info = storage_entry(md, emb)

    def huge(obj):
        obj.args[2], obj.args[3] = (rows, hidden), (hidden, 1)

    replace_archive(rel(d), info, huge)
    md_save(rel(d), md)
    case("td-numel-wraps", ["'%s'" % emb, "[%d, %d]" % (rows, hidden), "the model's args imply"], d)

    # A .metadata of 1.9 GB (sparse): refused by its size, before reading it.
    d = copy_source(mcore, out, "td-metadata-too-big")
    with open(os.path.join(rel(d), ".metadata"), "r+b") as f:
        f.truncate(1900 << 20)
    case("td-metadata-too-big", [".metadata", "1992294400 bytes", "limit"], d)

    # A .metadata of 2^23 + 1 empty lists (17 MB): one object more than a pickle may make.
    d = copy_source(mcore, out, "td-pickle-objects")
    with open(os.path.join(rel(d), ".metadata"), "wb") as f:
        f.write(b"\x80\x02" + b"]0" * ((1 << 23) + 1) + b"N.")
    case("td-pickle-objects", [".metadata", "more than 8388608 objects", "limit"], d)

    # args.num_layers of a billion: a source of 12 billion tensors.
    d = copy_source(mcore, out, "td-layers-huge")
    common = os.path.join(rel(d), "common.pt")
    obj = torch.load(common)
    obj["args"].num_layers = 10 ** 9
    torch.save(obj, common)
    case("td-layers-huge", ["1000000000 layers", "limit"], d)


def cases(hf, legacy, mcore, out):
    os.makedirs(out, exist_ok=True)

    def case(name, expect, d):
        print("\t".join([name] + expect), flush=True)

    safetensors_cases(out, case)
    legacy_cases(legacy, out, case)
    zip_variants(legacy, out, case)
    torch_dist_cases(mcore, out, case)


def zip_torch(top):
    for name in sorted(os.listdir(top)):
        if not name.startswith("zip-"):
            continue
        try:
            torch.load(rank_file(os.path.join(top, name)))
            print(name, "accepted")
        except Exception:  # noqa: BLE001 - any refusal counts
            print(name, "refused")


def big_metadata(mcore, out, mb):
    """Copies MCORE's checkpoint with optimizer entries (copies of the model's, as Megatron saves
    exp_avg and exp_avg_sq) added to .metadata until it is about MB megabytes."""
    shutil.copytree(mcore, out)
    md = md_load(rel(out))
    sdm, storage = st(md)["state_dict_metadata"], st(md)["storage_data"]
    model = list(sdm.items())
    model_storage = list(storage.items())
    one = len(dumps(md))
    copies = max(1, int(mb * (1 << 20) / one))
    for c in range(copies):
        for key, value in model:
            sdm["optimizer.state.exp_avg.%d.%s" % (c, key)] = copy.deepcopy(value)
        for index, info in model_storage:
            i2, s2 = copy.deepcopy(index), copy.deepcopy(info)
            st(i2)["fqn"] = "optimizer.state.exp_avg.%d.%s" % (c, st(index)["fqn"])
            storage[i2] = s2
    md_save(rel(out), md)
    print(os.path.getsize(os.path.join(rel(out), ".metadata")))


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "cases":
        cases(*args)
    elif cmd == "zip-torch":
        zip_torch(*args)
    elif cmd == "big-metadata":
        big_metadata(args[0], args[1], float(args[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
