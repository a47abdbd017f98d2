#!/usr/bin/python3
"""Packed checkpoints (`ckptfs pack`, docs/compression.md): read and damage containers, and
compare files read at random offsets. Written from the format description, not from ckptfs's
code (the index checksum is XXH3-64 of the index bytes, low 32 bits: python3-xxhash).

  pack_check.py frames FILE                print the container's frame table (one line a frame)
  pack_check.py check-dir SRC DEST         every file of SRC is in DEST: packed ones are containers
                                           whose trailer says SRC's size, the others identical
  pack_check.py damage FILE KIND           KIND: flip (one byte of a frame's stored bytes),
                                           truncate (the file cut inside its index), index-sum
                                           (an index byte changed, checksum kept), overlap
                                           (frame 1's stored bytes moved onto frame 0's), past-eof
                                           (frame 0's stored length past the index), longer /
                                           shorter (a middle frame claims 4096 bytes more / fewer
                                           of the original, the next one moved along), codec (codec
                                           9), trailer (the trailer's magic changed); index lies
                                           get a correct index checksum
  pack_check.py random A B N [SEED]        N reads at random offsets and lengths (many across
                                           frame boundaries) of files A and B give the same bytes
"""
import os
import random
import struct
import sys

MAGIC = b"CKPTFSZ\x01"
ENTRY = struct.Struct("<QIIQBBHI")  # uoffset, ulength, clength, coffset, codec, planes, 0, checksum
TRAILER = struct.Struct("<QQQIIB7s8s")  # size, nframes, index_offset, frame_size, index_checksum, codec, 0, magic


def xxh3_low32(data):
    import xxhash
    return xxhash.xxh3_64_intdigest(data) & 0xFFFFFFFF


def read_container(path):
    data = bytearray(open(path, "rb").read())
    assert data[:8] == MAGIC, f"{path}: not a container"
    size, nframes, index_offset, frame_size, index_sum, codec, _, magic = TRAILER.unpack_from(data, len(data) - TRAILER.size)
    assert magic == MAGIC, f"{path}: no trailer"
    frames = [list(ENTRY.unpack_from(data, index_offset + i * ENTRY.size)) for i in range(nframes)]
    return data, dict(size=size, nframes=nframes, index_offset=index_offset, frame_size=frame_size,
                      index_sum=index_sum, codec=codec), frames


def write_index(path, data, t, frames, fix_sum=True):
    for i, f in enumerate(frames):
        ENTRY.pack_into(data, t["index_offset"] + i * ENTRY.size, *f)
    index = bytes(data[t["index_offset"]:t["index_offset"] + len(frames) * ENTRY.size])
    if fix_sum:
        t["index_sum"] = xxh3_low32(index)
    TRAILER.pack_into(data, len(data) - TRAILER.size, t["size"], t["nframes"], t["index_offset"],
                      t["frame_size"], t["index_sum"], t["codec"], bytes(7), MAGIC)
    open(path, "wb").write(data)


def cmd_frames(path):
    _, t, frames = read_container(path)
    print(f"# size {t['size']} frames {t['nframes']} frame_size {t['frame_size']} codec {t['codec']}")
    for f in frames:
        print(" ".join(str(x) for x in f))


def cmd_check_dir(src, dest):
    packed = copied = 0
    for root, _, names in os.walk(src):
        for n in names:
            a = os.path.join(root, n)
            b = os.path.join(dest, os.path.relpath(a, src))
            assert os.path.isfile(b), f"{b} missing"
            head = open(b, "rb").read(8)
            if head == MAGIC and open(a, "rb").read(8) != MAGIC:
                _, t, frames = read_container(b)
                assert t["size"] == os.path.getsize(a), f"{b}: trailer says {t['size']} bytes, {a} has {os.path.getsize(a)}"
                packed += 1
            else:
                assert open(a, "rb").read() == open(b, "rb").read(), f"{b} differs from {a}"
                copied += 1
    assert packed > 0, "no file was packed"
    print(f"# {packed} files packed, {copied} copied as they are")


def cmd_damage(path, kind):
    data, t, frames = read_container(path)
    assert len(frames) >= 2 or kind in ("flip", "truncate", "index-sum", "codec", "trailer", "past-eof"), \
        f"{path}: {len(frames)} frames; {kind} needs two"
    if kind == "flip":
        f = frames[len(frames) // 2]
        at = f[3] + f[2] // 2
        data[at] ^= 0x40
        open(path, "wb").write(data)
    elif kind == "truncate":
        open(path, "wb").write(data[:t["index_offset"] + ENTRY.size // 2])
    elif kind == "index-sum":
        data[t["index_offset"] + 30] ^= 1  # a checksum byte of frame 0's entry
        open(path, "wb").write(data)
    elif kind == "trailer":
        data[-1] ^= 0xFF
        open(path, "wb").write(data)
    else:
        if kind == "overlap":
            frames[1][3] = frames[0][3] + 1
        elif kind == "past-eof":
            frames[0][2] = t["index_offset"] - frames[0][3] + 4096
        elif kind in ("longer", "shorter"):
            # two middle frames (frame 0 holds the file's header, which the source reads at mount)
            d = 4096 if kind == "longer" else -4096
            i = next(i for i in range(len(frames) // 2, len(frames) - 1)
                     if frames[i][1] > 8192 and frames[i + 1][1] > 8192)
            frames[i][1] += d
            frames[i + 1][0] += d
            frames[i + 1][1] -= d
        elif kind == "codec":
            frames[0][4] = 9
        else:
            sys.exit(f"unknown damage {kind}")
        write_index(path, data, t, frames)
    print(f"# {path}: {kind}")


def cmd_random(a, b, n, seed=0):
    rng = random.Random(seed)
    size = os.path.getsize(a)
    assert size == os.path.getsize(b), f"sizes differ: {size} vs {os.path.getsize(b)}"
    fa, fb = os.open(a, os.O_RDONLY), os.open(b, os.O_RDONLY)
    for i in range(n):
        length = rng.choice([1, 3, 4095, 65536, 1 << 20, 3 << 20]) + rng.randrange(0, 17)
        off = rng.randrange(0, max(size, 1))
        x, y = os.pread(fa, length, off), os.pread(fb, length, off)
        if x != y:
            sys.exit(f"read {i}: {length} bytes at {off} differ")
    print(f"# {n} random reads of {size} bytes equal")


def main(argv):
    if not argv:
        sys.exit(__doc__)
    cmd, args = argv[0], argv[1:]
    if cmd == "frames":
        cmd_frames(*args)
    elif cmd == "check-dir":
        cmd_check_dir(*args)
    elif cmd == "damage":
        cmd_damage(*args)
    elif cmd == "random":
        cmd_random(args[0], args[1], int(args[2]), int(args[3]) if len(args) > 3 else 0)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
