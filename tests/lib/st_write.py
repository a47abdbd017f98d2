"""The one safetensors writer of the tests, the benchmarks and the demo.

A file is an 8-byte little-endian header length, the JSON header (padded with spaces to a
multiple of 8, as safetensors' own serializer does) and the tensors' bytes in header order.
Needs only the standard library (numpy arrays are written through their buffer), so it runs
under any python3 the tests or benches use, with or without numpy or torch.

Import it with tests/lib on sys.path:
    sys.path.insert(0, os.path.join(TOP, "tests", "lib")); import st_write
"""

import json
import struct

PT_METADATA = {"format": "pt"}


def header_bytes(entries, metadata=PT_METADATA, compact=True):
    """The length-prefixed header for ENTRIES, (name, dtype, shape, nbytes) in file order, and
    the size of the data area. metadata=None leaves "__metadata__" out; compact=False keeps
    json's default separators (", ", ": "), as some fixtures were made."""
    header = {} if metadata is None else {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape, nbytes in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":") if compact else None).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, offset


def write(path, named, metadata=PT_METADATA):
    """Writes NAMED, {name: (dtype, array)} in file order, to PATH. An array is anything with
    .shape, .nbytes and .tobytes() (numpy); its bytes are written in C order."""
    head, _ = header_bytes(((name, dt, a.shape, a.nbytes) for name, (dt, a) in named.items()), metadata)
    with open(path, "wb") as f:
        f.write(head)
        for _, a in named.values():
            f.write(a.tobytes())
