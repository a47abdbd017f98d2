#!/usr/bin/python3
"""Writes one broken verl FSDP role directory per kind under OUT/, each a copy of BASE (a real
W=4 FSDP2 role directory) with one thing broken, and prints per kind what the one-line error of
`ckptfs inspect` must name: KIND<TAB>substring<TAB>substring... (DIR in a substring stands for
the kind's directory). Pickles are edited as opcode streams (pickletools; no torch, nothing
unpickled) and archives rewritten with zipfile, entries STORED.

  bad_verl.py OUT BASE MARKER

MARKER: a path the hostile pickles would create if anything executed them.
"""
import os
import pickletools
import shutil
import struct
import sys
import zipfile

W = 4


def rank_file(d, r, w=W):
    return os.path.join(d, f"model_world_size_{w}_rank_{r}.pt")


def rewrite_pickle(path, change):
    """Replaces data.pkl of the torch.save archive PATH by change(old bytes)."""
    with zipfile.ZipFile(path) as z:
        entries = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for name, data in entries:
            z.writestr(name, change(data) if name.endswith("/data.pkl") else data)
    os.replace(tmp, path)


def ops(data):
    """(opcode name, argument, start, end) of every opcode."""
    found = list(pickletools.genops(data))
    return [(op.name, arg, pos, found[i + 1][2] if i + 1 < len(found) else len(data))
            for i, (op, arg, pos) in enumerate(found)]


def patch_ops(data, change):
    """The pickle with each opcode replaced by change(name, arg, following ops) when that
    returns bytes (the memo is by index, so lengths may change)."""
    out, listed = [], ops(data)
    for i, (name, arg, start, end) in enumerate(listed):
        new = change(name, arg, listed[i + 1:])
        out.append(data[start:end] if new is None else new)
    return b"".join(out)


def unicode(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def rename_key(old, new):
    def change(name, arg, rest):
        return unicode(new) if name == "BINUNICODE" and arg == old else None
    return lambda data: patch_ops(data, change)


def global_size(key, rows):
    """The DTensor of KEY claims ROWS rows: the first BININT1 after its name, in the wrapper's
    (DTensor, dtype, size, ...) arguments (the dtype a GLOBAL or, after the first key, a BINGET)."""
    def change(data):
        listed, state = ops(data), 0
        out = bytearray(data)
        for name, arg, start, end in listed:
            if state == 0 and name == "BINUNICODE" and arg == key:
                state = 1
            elif state == 1 and name == "BININT1":
                out[start + 1] = rows
                return bytes(out)
        raise SystemExit(f"no global size of {key}")
    return change


def local_offset(new):
    """The storage offset of the first local tensor (the BININT1 after its BINPERSID) made NEW."""
    def change(data):
        listed = ops(data)
        for (name, _, _, end), (next_name, _, start, next_end) in zip(listed, listed[1:]):
            if name == "BINPERSID" and next_name == "BININT1":
                return data[:start] + new + data[next_end:]
        raise SystemExit("no local tensor found")
    return change


def mesh_3d(data):
    """The mesh tensor (after GLOBAL torch IntStorage) made [1, 1, 4] with strides [4, 4, 1]."""
    state = 0

    def change(name, arg, rest):
        nonlocal state
        if name == "GLOBAL" and arg == "torch IntStorage" and state == 0:
            state = 1
        elif name == "BINPERSID" and state == 1:
            state = 2
        elif name == "BININT1" and state == 2:  # the storage offset
            state = 3
        elif name == "BININT1" and state == 3 and rest[0][0] == "TUPLE1":
            state = 4
            return b"K\x01K\x01K\x04"
        elif name == "TUPLE1" and state in (4, 6):
            state += 1
            return b"\x87"
        elif name == "BININT1" and state == 5 and arg == 1:
            state = 6
            return b"K\x04K\x04K\x01"
        return None
    out = patch_ops(data, change)
    if state != 7:
        raise SystemExit("no mesh tensor found")
    return out


def storage_numel(new):
    """The element count the first storage's persistent id gives (the embedding's, a BININT2 after
    GLOBAL torch FloatStorage) made NEW."""
    def change(data):
        listed, state = ops(data), 0
        for name, arg, start, end in listed:
            if name == "GLOBAL" and arg == "torch FloatStorage":
                state = 1
            elif state == 1 and name == "BININT2":
                return data[:start] + b"M" + struct.pack("<H", new) + data[end:]
        raise SystemExit("no storage numel found")
    return change


def tensor_meta_rows(rows):
    """The first DTensorSpec's TensorMeta (the embedding's) says ROWS rows: the first BININT1
    after GLOBAL ...TensorMeta."""
    def change(data):
        listed, state = ops(data), 0
        out = bytearray(data)
        for name, arg, start, end in listed:
            if name == "GLOBAL" and arg.endswith(" TensorMeta"):
                state = 1
            elif state == 1 and name == "BININT1":
                out[start + 1] = rows
                return bytes(out)
        raise SystemExit("no TensorMeta found")
    return change


def rename_global(old, new):
    def change(name, arg, rest):
        module, attr = new.split(" ")
        return b"c" + module.encode() + b"\n" + attr.encode() + b"\n" if name == "GLOBAL" and arg == old else None
    return lambda data: patch_ops(data, change)


def main():
    out, base, marker = sys.argv[1:4]
    cases = []

    def case(kind, expect, change=None, ranks=()):
        d = os.path.join(out, kind)
        shutil.copytree(base, d)
        for r in ranks:
            rewrite_pickle(rank_file(d, r), change)
        cases.append((kind, [s.replace("DIR", d) for s in expect]))
        return d

    d = case("missing-rank", ["DIR/model_world_size_4_rank_2.pt: missing", "rank 2"])
    os.remove(rank_file(d, 2))
    d = case("two-world-sizes", ["DIR/model_world_size_8_rank_0.pt", "two different world sizes"])
    os.rename(rank_file(d, 0), rank_file(d, 0, 8))
    d = case("truncated", ["DIR/model_world_size_4_rank_1.pt"])
    size = os.path.getsize(rank_file(d, 1))
    with open(rank_file(d, 1), "r+b") as f:
        f.truncate(size // 2)
    d = case("config-world-size", ["DIR/fsdp_config.json", "world_size 8"])
    with open(os.path.join(d, "fsdp_config.json"), "w") as f:
        f.write('{"FSDP_version": 2, "world_size": 8}\n')
    d = case("config-world-size-text", ["DIR/fsdp_config.json", "world_size", "whole number", '(it is "4")'])
    with open(os.path.join(d, "fsdp_config.json"), "w") as f:
        f.write('{"FSDP_version": 2, "world_size": "4"}\n')
    # A tensor's local zip header with a longer padding field: torch.load (no CRC check) would
    # read its data 64 bytes further on, from the bytes after it.
    d = case("local-header-moved", ["DIR/model_world_size_4_rank_1.pt", "data/0", "the archive is damaged"])
    with zipfile.ZipFile(rank_file(d, 1)) as z:
        at = next(i.header_offset for i in z.infolist() if i.filename.endswith("/data/0"))
    with open(rank_file(d, 1), "r+b") as f:
        f.seek(at)
        h = f.read(30)
        name_len, extra_len = struct.unpack("<HH", h[26:30])
        f.seek(at + 30 + name_len)
        field_id, field_len = struct.unpack("<HH", f.read(4))
        assert field_id == 0x4246 and field_len + 4 == extra_len, "torch pads with one FB field"
        f.seek(at + 28)
        f.write(struct.pack("<H", extra_len + 64))
        f.seek(at + 30 + name_len + 2)
        f.write(struct.pack("<H", field_len + 64))
    # Every rank claims 251 rows of a 250-row embedding (its DTensor and its spec's TensorMeta,
    # which the untied lm_head shares: its DTensor too): the shards do not tile it.
    rows_251 = lambda data: tensor_meta_rows(251)(global_size("lm_head.weight", 251)(
        global_size("model.embed_tokens.weight", 251)(data)))
    case("untiled-shape", ["DIR/model_world_size_4_rank_0.pt", "'model.embed_tokens.weight' has global shape "
                           "[251, 64]", "do not tile"], rows_251, range(W))
    # One rank disagrees with the others on a global shape.
    case("shape-differs", ["DIR/model_world_size_4_rank_1.pt", "'model.embed_tokens.weight' has global shape "
                           "[251, 64]", "[250, 64]"], rows_251, [1])
    # A key renamed in one rank: the others' key is missing there.
    case("key-missing", ["DIR/model_world_size_4_rank_2.pt", "'model.norm.weighX'"],
         rename_key("model.norm.weight", "model.norm.weighX"), [2])
    # Hostile pickles: os.system called by REDUCE, as the whole pickle and as a value.
    cmd = f"touch {marker}".encode()
    system = b"cos\nsystem\nX" + struct.pack("<I", len(cmd)) + cmd + b"\x85R"
    case("hostile-root", ["DIR/model_world_size_4_rank_0.pt", "no state dict"],
         lambda data: b"\x80\x02" + system + b".", [0])
    case("hostile-value", ["DIR/model_world_size_4_rank_0.pt", "'model.embed_tokens.weight'", "os.system"],
         lambda data: b"\x80\x02ccollections\nOrderedDict\n)R" + unicode("model.embed_tokens.weight") + system +
         b"s.", [0])
    # A local tensor's storage offset beyond its record, and so far that the byte offset wraps.
    case("outside-record", ["DIR/model_world_size_4_rank_3.pt", "'model.embed_tokens.weight'", "storage record"],
         local_offset(b"J" + struct.pack("<i", 2**31 - 1)), [3])
    case("offset-overflow", ["DIR/model_world_size_4_rank_3.pt", "'model.embed_tokens.weight'", "overflow"],
         local_offset(b"\x8a\x08" + struct.pack("<q", 2**62)), [3])
    # Rank 3's embedding shard (61 of the 250 rows, in a storage padded to 63) in a storage the
    # pickle says holds 3903 elements, one short: the bytes served lie inside the record, but
    # torch.load refuses the file ("Trying to resize storage that is not resizable").
    case("storage-short", ["DIR/model_world_size_4_rank_3.pt", "'model.embed_tokens.weight'",
                           "reaches element 3904", "which the pickle says holds 3903"], storage_numel(3903), [3])
    # A storage the pickle says is larger than its record (torch.load takes it), the local tensor
    # within that size but beyond the record's bytes.
    case("beyond-record", ["DIR/model_world_size_4_rank_3.pt", "'model.embed_tokens.weight'",
                           "its local tensor reaches byte", "storage record"],
         lambda data: local_offset(b"M" + struct.pack("<H", 60000))(storage_numel(65535)(data)), [3])
    # Rank 2's DTensorSpec says the embedding has 251 rows, its DTensor 250.
    case("tensor-meta", ["DIR/model_world_size_4_rank_2.pt", "'model.embed_tokens.weight'",
                         "tensor_meta says shape [251, 64]", "the DTensor is [250, 64]"], tensor_meta_rows(251), [2])
    # Stray rank-file names beside the four good ones: numbers beyond any world size are counted
    # and refused by name, as a file of another world size is, not passed over.
    for kind, name in (("huge-world-size", "model_world_size_1000000000_rank_999999999.pt"),
                       ("huge-rank", "model_world_size_4_rank_99999999999999999999999.pt")):
        d = case(kind, [f"DIR/{name}", "out of range"])
        shutil.copy(rank_file(d, 0), os.path.join(d, name))
    case("mesh-3d", ["DIR/model_world_size_4_rank_0.pt", "3-D device mesh"], mesh_3d, range(W))
    case("mesh-names", ["DIR/model_world_size_4_rank_0.pt", "dims named (dp_shard)"],
         rename_key("fsdp", "dp_shard"), range(W))
    case("strided-shard", ["DIR/model_world_size_4_rank_0.pt", "_StridedShard is not read"],
         rename_global("torch.distributed.tensor.placement_types Shard",
                       "torch.distributed.tensor.placement_types _StridedShard"), range(W))
    # A LoRA run (a lora_ key) where two keys become one name once PEFT's wrapping is removed.
    lora = rename_key("model.layers.0.self_attn.q_proj.weight",
                      "model.layers.0.self_attn.q_proj.lora_A.default.weight")
    clash = rename_key("model.layers.0.self_attn.k_proj.weight",
                       "model.layers.0.self_attn.v_proj.base_layer.weight")
    case("lora-clash", ["DIR/model_world_size_4_rank_0.pt", "'model.layers.0.self_attn.v_proj.weight' is given twice"],
         lambda data: clash(lora(data)), range(W))
    for kind, expect in cases:
        print("\t".join([kind] + expect))


if __name__ == "__main__":
    main()
