"""Reads two files at the same odd offsets and sizes (past the end too) and fails on the first
difference: a view file read one way against the same file read another way.

    same_reads.py FILE_A FILE_B [SEED]
"""
import os
import random
import sys


def main():
    a, b = (os.open(p, os.O_RDONLY) for p in sys.argv[1:3])
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 7)
    size = os.fstat(b).st_size
    cases = [(0, 1), (size - 1, 1), (size - 10, 100), (size, 10), (size + 4096, 4096), (1, 3 << 20)]
    sizes = [1, 511, 4095, 4097, 65537, 1 << 20, 3 << 20]
    cases += [(rng.randrange(size), rng.choice(sizes)) for _ in range(300)]
    for off, n in cases:
        x, y = os.pread(a, n, max(off, 0)), os.pread(b, n, max(off, 0))
        if x != y:
            sys.exit(f"differ at offset {off}, {n} bytes asked: {len(x)} and {len(y)} bytes read")
    print(f"{len(cases)} reads equal")


if __name__ == "__main__":
    main()
