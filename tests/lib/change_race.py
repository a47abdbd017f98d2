"""Readers race a writer that changes a source file under a mount: every read must give the
view's old bytes or fail (EIO), never new bytes or old and new mixed.

    change_race.py MOUNT REFERENCE SHARD MODE SEED FILE...

FILE...: view files (relative paths) read under MOUNT by 4 reader threads at random offsets and
sizes, each compared with the same range of the file under REFERENCE (a mount of an untouched
copy of the source). Once they have made 20 reads, the writer changes SHARD (a source file of
MOUNT's source):

    inplace      64 KiB of random bytes written at random offsets, 40 times, 10 ms apart
    keep_mtime   the same, each write's mtime and atime put back (only ctime tells)
    overwrite    every data byte flipped, in one write right after the open
    rename       a copy with every data byte flipped renamed over SHARD
    truncate     cut to half its size, then grown back to its size with zeros

The readers go on 0.7 s past the last change. Prints one line of counts; exits non-zero on a
read that differs from the reference (the bytes a short read gave before an error included) or
fails before the change, or when the race did not happen (no read before the change, no error
after it).
"""
import os
import random
import struct
import sys
import threading
import time

SIZES = [1, 100, 4095, 4096, 8191, 65536, 1 << 20, (1 << 20) + 4097, 3 << 20]


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.ok_before = self.ok_after = self.errors = self.opens_refused = 0
        self.wrong = []


def read_on(fd, n, off):
    """Reads N bytes at OFF as a buffered reader does, going on after a short read until N bytes, the
    end of the file (a read of 0) or an error. A read split into several FUSE requests returns
    the bytes before a request that failed; the next read then fails. Returns (bytes, failed)."""
    got = b""
    while len(got) < n:
        try:
            part = os.pread(fd, n - len(got), off + len(got))
        except OSError:
            return got, True
        if not part:
            break
        got += part
    return got, False


def reader(mount, refs, seed, changed, stop, counts):
    rng = random.Random(seed)
    fds = {}
    while not stop.is_set():
        name = rng.choice(list(refs))
        ref = refs[name]
        # Each file opened once: an open after a change fails at once (checked by the caller),
        # where reads through descriptors opened before it test the check of each read.
        if name not in fds:
            try:
                fds[name] = os.open(os.path.join(mount, name), os.O_RDONLY)
            except OSError:
                with counts.lock:
                    counts.opens_refused += 1
                fds[name] = None
                continue
        if fds[name] is None:
            continue
        off = rng.randrange(len(ref) + 4096)
        if rng.random() < 0.5:
            off &= ~4095
        n = rng.choice(SIZES)
        was_changed = changed.is_set()
        want = ref[off:off + n]
        got, failed = read_on(fds[name], n, off)
        failed_unchanged = failed and not changed.is_set()
        if failed:
            # The bytes before the error must still be the right ones.
            want = want[:len(got)]
            with counts.lock:
                counts.errors += 1
        with counts.lock:
            if failed_unchanged:
                counts.wrong.append(f"{name}: {n} bytes at {off}: failed before any change")
            elif got != want:
                first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                counts.wrong.append(f"{name}: {n} bytes at {off}: {len(got)} read, {len(want)} expected, "
                                    f"first difference at +{first}")
            elif failed:
                pass
            elif was_changed:
                counts.ok_after += 1
            else:
                counts.ok_before += 1
    for fd in fds.values():
        if fd is not None:
            os.close(fd)


def data_start(path):
    """Where the tensors start: past a safetensors header; past the first 64 bytes of a packed
    file (ckptfs pack), whose frames are then what changes."""
    with open(path, "rb") as f:
        head = f.read(8)
    return 64 if head.startswith(b"CKPTFSZ") else 8 + struct.unpack("<Q", head)[0]


def change(shard, mode, rng):
    size = os.path.getsize(shard)
    start = data_start(shard)
    if mode in ("inplace", "keep_mtime"):
        st = os.stat(shard)
        fd = os.open(shard, os.O_WRONLY)
        for _ in range(40):
            os.pwrite(fd, rng.randbytes(65536), rng.randrange(start, size - 65536))
            if mode == "keep_mtime":
                os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
            time.sleep(0.01)
        os.close(fd)
    elif mode == "overwrite":
        with open(shard, "rb") as f:
            data = f.read()
        fd = os.open(shard, os.O_WRONLY)
        os.pwrite(fd, data[start:].translate(bytes(range(255, -1, -1))), start)
        os.close(fd)
    elif mode == "rename":
        with open(shard, "rb") as f:
            data = f.read()
        data = data[:start] + data[start:].translate(bytes(range(255, -1, -1)))
        tmp = shard + ".new"
        with open(tmp, "wb") as f:
            f.write(data)
        os.rename(tmp, shard)
    elif mode == "truncate":
        os.truncate(shard, size // 2)
        time.sleep(0.05)
        os.truncate(shard, size)
    else:
        sys.exit(f"unknown mode {mode}")


def main():
    mount, reference, shard, mode, seed = sys.argv[1:6]
    names = sys.argv[6:]
    refs = {}
    for name in names:
        with open(os.path.join(reference, name), "rb") as f:
            refs[name] = f.read()
    counts = Counts()
    changed, stop = threading.Event(), threading.Event()
    threads = [threading.Thread(target=reader, args=(mount, refs, int(seed) * 10 + i, changed, stop, counts))
               for i in range(4)]
    for t in threads:
        t.start()
    # Readers under way first: 20 reads (a few seconds at most), so that on a mount that keeps
    # the page cache most of the files still come from the daemon after the change.
    deadline = time.monotonic() + 10
    while counts.ok_before < 20 and not counts.wrong and time.monotonic() < deadline:
        time.sleep(0.01)
    changed.set()  # before the change: a read that started earlier may still count as after it
    change(shard, mode, random.Random(int(seed)))
    time.sleep(0.7)
    stop.set()
    for t in threads:
        t.join()
    print(f"{mode}: {counts.ok_before} reads equal before the change, {counts.ok_after} after it, "
          f"{counts.errors} failed, {counts.opens_refused} opens refused, {len(counts.wrong)} wrong")
    for w in counts.wrong[:10]:
        print("wrong:", w)
    if counts.wrong:
        sys.exit(1)
    if counts.ok_before == 0 or counts.errors + counts.opens_refused == 0:
        sys.exit("the race did not happen: no read before the change, or no error after it")


if __name__ == "__main__":
    main()
