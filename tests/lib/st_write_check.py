"""st_write_check.py write FILE | resave FILE OUT: the first (host python3, numpy, no torch)
writes tensors of several dtypes with tests/lib/st_write.py; the second (the torch root) loads
FILE with safetensors itself, prints its float32 tensor and saves it all again with
safetensors' own writer, for the test to compare byte for byte."""
import sys

if sys.argv[1] == "write":
    import numpy as np
    import st_write
    # In safetensors' own order (dtype alignment descending, then name), as its writer lays out.
    named = {"c.i64": ("I64", np.arange(-4, 5, dtype=np.int64)),
             "a.f32": ("F32", np.array([[1.5, -2.0, 0.25], [3.0, 1e-3, -7.5]], dtype=np.float32)),
             "b.scalar": ("F32", np.array(3.5, dtype=np.float32)),
             "d.bf16": ("BF16", np.array([0x3f80, 0xc000, 0x0000, 0x7f80], dtype=np.uint16).reshape(2, 2)),
             "e.empty": ("F16", np.zeros((0, 4), dtype=np.float16)),
             "f.u8": ("U8", np.arange(7, dtype=np.uint8))}
    st_write.write(sys.argv[2], named)
    print("torch imported" if "torch" in sys.modules else "no torch")
else:
    from safetensors.torch import load_file, save_file
    tensors = load_file(sys.argv[2])
    print(tensors["a.f32"].tolist(), tensors["d.bf16"].float().tolist())
    save_file(tensors, sys.argv[3], metadata={"format": "pt"})
