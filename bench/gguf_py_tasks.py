"""The gguf-py side of the benchmark, run as a fresh process per measurement.

    python3 bench/gguf_py_tasks.py rewrite SRC DST   # GGUFReader -> GGUFWriter, like gguf_new_metadata.py
    python3 bench/gguf_py_tasks.py dequantize SRC    # gguf.quants.dequantize of every tensor, row-chunked
    python3 bench/gguf_py_tasks.py read SRC          # GGUFReader(SRC) only (what an inspect needs)
"""

from __future__ import annotations

import sys


import gguf


def rewrite(src: str, dst: str) -> None:
    # The loop of gguf-py's own scripts/gguf_new_metadata.py (copy_with_new_metadata), minus tqdm.
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    align = reader.fields.get(gguf.Keys.General.ALIGNMENT)
    if align is not None:
        writer.data_alignment = int(align.contents())
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vt = field.types[0]
        sub = field.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vt, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()


def dequantize(src: str, chunk_bytes: int = 32 << 20) -> None:
    reader = gguf.GGUFReader(src)
    for t in reader.tensors:
        data = t.data
        if data.ndim < 2:
            gguf.quants.dequantize(data, t.tensor_type)
            continue
        rows = data.reshape(-1, data.shape[-1])
        step = max(1, chunk_bytes // max(1, rows.strides[0]))
        for i in range(0, rows.shape[0], step):
            gguf.quants.dequantize(rows[i : i + step], t.tensor_type)


def read(src: str) -> None:
    r = gguf.GGUFReader(src)
    assert len(r.fields) and r.tensors is not None


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"rewrite": rewrite, "dequantize": dequantize, "read": read}[cmd](*args)
