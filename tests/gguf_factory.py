"""Build GGUF test files in a temporary folder (a test helper, not a test module).

Two writers, both independent of hurray_interop's GGUF code where possible:

* :func:`write_gguf_py` -- llama.cpp's own ``gguf.GGUFWriter``: tensors quantized
  by ``gguf.quants.quantize`` (random data with all-zero blocks), any alignment
  (``add_custom_alignment``), metadata given as ``(key, value, GGUFValueType[,
  sub_type])``.  gguf-py silently drops empty strings and refuses empty arrays.
* :func:`write_gguf_stream` -- ``hurray_interop.formats.gguf.GGUFWriterStream``
  with explicit :class:`GGUFValue` metadata, for what gguf-py cannot write
  (empty strings and arrays, nested arrays of any element type), GGUF v2, and
  files that end without padding.

Shapes are numpy order (outermost first; the last axis is GGUF's ``ne[0]`` and
must be a multiple of 32 for the block types).  :data:`BLOCK_TYPES` and
:data:`PLAIN_TYPES` list what :func:`tensor_bytes` can produce.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from gguf import quants

from hurray_interop.formats import gguf as G

#: GGML block types gguf-py can quantize and the converter maps exactly
BLOCK_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4")
#: float types gguf-py quantizes (``quants.quantize``) and integer/f64 types stored as is
FLOAT_TYPES = ("F32", "F16", "BF16")
INT_TYPES = {"I8": np.int8, "I16": np.int16, "I32": np.int32, "F64": np.float64}
PLAIN_TYPES = FLOAT_TYPES + tuple(INT_TYPES)
ALL_TYPES = PLAIN_TYPES + BLOCK_TYPES


@dataclass(frozen=True)
class TensorDef:
    """One tensor to write: ``name``, GGML type name, numpy-order ``shape``."""

    name: str
    type: str
    shape: tuple[int, ...]
    zero_blocks: bool = True


def random_values(rng: np.random.Generator, shape: Sequence[int], *, zero_blocks: bool = True) -> np.ndarray:
    """float32 weights (σ = 0.05); with ``zero_blocks`` the first row is all zero (every
    block scale 0) and one 32-element block in the middle of the data is all zero."""
    x = (rng.standard_normal(tuple(shape)) * 0.05).astype(np.float32)
    if zero_blocks and x.size:
        rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
        rows[0] = 0.0
        if rows.shape[1] >= 32:
            mid = rows.shape[0] // 2
            start = (rows.shape[1] // 64) * 32  # a block-aligned block in the middle row
            rows[mid, start : start + 32] = 0.0
    return x


def tensor_bytes(type_name: str, x: np.ndarray) -> np.ndarray:
    """The tensor as gguf-py stores it: a numpy array for ``GGUFWriter.add_tensor``
    (with ``raw_dtype`` for the quantized types).  Integer types take ``x`` scaled."""
    if type_name in INT_TYPES:
        dt = INT_TYPES[type_name]
        if dt == np.float64:
            return x.astype(np.float64)
        info = np.iinfo(dt)
        scale = min(info.max, 1 << 20) * 20.0
        return np.clip(np.rint(x.astype(np.float64) * scale), info.min, info.max).astype(dt)
    if type_name == "F32":
        return x.astype(np.float32)
    if type_name == "F16":
        return x.astype(np.float16)
    return quants.quantize(x, Q[type_name])


def raw_dtype(type_name: str) -> Q | None:
    return None if type_name in INT_TYPES or type_name in ("F32", "F16") else Q[type_name]


def make_tensors(defs: Iterable[TensorDef], seed: int = 0) -> list[tuple[TensorDef, np.ndarray]]:
    """Each definition with its stored bytes (deterministic for a seed)."""
    rng = np.random.default_rng(seed)
    return [(d, tensor_bytes(d.type, random_values(rng, d.shape, zero_blocks=d.zero_blocks))) for d in defs]


def all_types_defs(shapes: Sequence[tuple[int, ...]] = ((64,), (3, 64), (2, 3, 32), (2, 2, 2, 96))) -> list[TensorDef]:
    """Every supported type in every shape (1-D..4-D by default), with zero blocks."""
    return [TensorDef(f"t.{t.lower()}.{len(s)}d", t, s) for t in ALL_TYPES for s in shapes]


# ---------------------------------------------------------------------------
# metadata


def every_kv_gguf_py() -> list[tuple[Any, ...]]:
    """Metadata entries ``(key, value, type[, sub_type])`` covering every GGUF value type
    gguf-py can write: each integer width at both extremes, f32/f64 specials, bools,
    strings (non-ASCII), an array of each element type, nested arrays."""
    out: list[tuple[Any, ...]] = []
    widths = {V.UINT8: np.uint8, V.INT8: np.int8, V.UINT16: np.uint16, V.INT16: np.int16,
              V.UINT32: np.uint32, V.INT32: np.int32, V.UINT64: np.uint64, V.INT64: np.int64}
    for vt, dt in widths.items():
        info = np.iinfo(dt)
        out.append((f"test.{vt.name.lower()}.min", int(info.min), vt))
        out.append((f"test.{vt.name.lower()}.max", int(info.max), vt))
        out.append((f"test.array.{vt.name.lower()}", [int(info.min), 0, int(info.max)], V.ARRAY, vt))
    out += [
        ("test.f32", 0.1, V.FLOAT32),
        ("test.f32.negzero", -0.0, V.FLOAT32),
        ("test.f32.inf", float("-inf"), V.FLOAT32),
        ("test.f32.subnormal", float(np.finfo(np.float32).smallest_subnormal), V.FLOAT32),
        ("test.f64", 1 / 3, V.FLOAT64),
        ("test.f64.nan", float("nan"), V.FLOAT64),
        ("test.bool.true", True, V.BOOL),
        ("test.bool.false", False, V.BOOL),
        ("test.string", "Hurray → GGUF: über 日本 🙂", V.STRING),
        ("test.array.f32", [0.5, -0.0, float("inf"), 1e-40], V.ARRAY, V.FLOAT32),
        ("test.array.f64", [1 / 3, -2.5], V.ARRAY, V.FLOAT64),
        ("test.array.bool", [True, False, True], V.ARRAY, V.BOOL),
        ("test.array.string", ["a", "ü", "日本"], V.ARRAY, V.STRING),
        ("test.array.one", [7], V.ARRAY, V.UINT16),
        ("test.array.nested.i32", [[1, 2], [3], [-4, 5, 6]], V.ARRAY),
        ("test.array.nested.str", [["x", "yz"], ["w"]], V.ARRAY),
    ]
    return out


def every_kv_values() -> list[tuple[str, G.GGUFValue]]:
    """Exact :class:`GGUFValue` metadata with what gguf-py cannot write: empty strings,
    empty arrays of several element types, nested arrays (of u8, strings, f32, an empty
    one, two levels deep), strings that are not UTF-8, BOOL bytes other than 0/1, NaN
    payloads (f32 and f64), and every scalar type at both integer extremes."""
    A, of = V.ARRAY, G.GGUFValue.of
    VT = G.ValueType
    out: list[tuple[str, G.GGUFValue]] = [("general.architecture", of(VT.STRING, "test"))]
    widths = {VT.UINT8: np.uint8, VT.INT8: np.int8, VT.UINT16: np.uint16, VT.INT16: np.int16,
              VT.UINT32: np.uint32, VT.INT32: np.int32, VT.UINT64: np.uint64, VT.INT64: np.int64}
    for vt, dt in widths.items():
        lo, hi = int(np.iinfo(dt).min), int(np.iinfo(dt).max)
        out.append((f"s.{vt.name.lower()}", of(vt, hi)))
        out.append((f"s.{vt.name.lower()}.min", of(vt, lo)))
        out.append((f"a.{vt.name.lower()}", of(A, np.array([lo, hi, 0], dtype=dt), vt)))
        out.append((f"e.{vt.name.lower()}", of(A, [], vt)))
    out += [
        ("s.f32", of(VT.FLOAT32, np.float32(-0.0))),
        ("s.f32.nan", of(VT.FLOAT32, np.frombuffer(b"\x01\x00\xc0\x7f", np.float32)[0])),  # a NaN payload
        ("s.f64", of(VT.FLOAT64, 2.0**-1074)),
        ("s.bool", of(VT.BOOL, True)),
        ("s.bool.false", of(VT.BOOL, False)),
        ("s.string", of(VT.STRING, "grüße")),
        ("s.string.empty", of(VT.STRING, b"")),
        ("s.string.not_utf8", of(VT.STRING, b"\xff\xfe bad \xc3")),
        ("a.f32", of(A, np.array([1.5, -0.0, np.inf], np.float32), VT.FLOAT32)),
        ("a.f64", of(A, np.array([np.pi, -1e300], np.float64), VT.FLOAT64)),
        ("a.bool", of(A, [True, False], VT.BOOL)),
        ("a.string", of(A, [b"x", b"", "ß".encode()], VT.STRING)),
        ("a.string.not_utf8", of(A, [b"ok", b"\x80"], VT.STRING)),
        ("e.string", of(A, [], VT.STRING)),
        ("e.f32", of(A, [], VT.FLOAT32)),
        ("e.bool", of(A, [], VT.BOOL)),
        ("e.array", of(A, [], VT.ARRAY)),
        ("n.u8", of(A, [of(A, [1, 2, 3], VT.UINT8), of(A, [], VT.UINT8)], VT.ARRAY)),
        ("n.string", of(A, [of(A, [b"a", b""], VT.STRING), of(A, [b"b"], VT.STRING)], VT.ARRAY)),
        ("n.f32", of(A, [of(A, [0.25], VT.FLOAT32)], VT.ARRAY)),
        ("n.deep", of(A, [of(A, [of(A, [-1, 1], VT.INT64)], VT.ARRAY)], VT.ARRAY)),
        ("s.bool.two", of(VT.BOOL, 2)),  # a BOOL byte other than 0/1
        ("a.bool.raw", of(A, np.uint8([0, 1, 255]), VT.BOOL)),
        ("a.f32.nan", of(A, np.frombuffer(b"\x01\x00\xc0\x7f\x00\x00\x80\xff", np.float32), VT.FLOAT32)),
        ("s.f64.nan", of(VT.FLOAT64, np.frombuffer(b"\x01\x00\x00\x00\x00\x00\xf8\x7f", np.float64)[0])),
        ("a.f64.nan", of(A, np.frombuffer(b"\x00\x00\x00\x00\x00\x00\xf8\xff", np.float64), VT.FLOAT64)),
        ("s.last", of(VT.UINT32, 7)),
    ]
    return out


# ---------------------------------------------------------------------------
# writers


def _add_kv(w: gguf.GGUFWriter, entry: tuple[Any, ...]) -> None:
    key, val, vt, *sub = entry
    if key == "general.alignment":
        w.add_custom_alignment(int(val))
    else:
        w.add_key_value(key, val, vt, sub_type=sub[0] if sub else None)


def write_gguf_py(
    path: Path,
    defs: Iterable[TensorDef] = (),
    *,
    kv: Iterable[tuple[Any, ...]] = (),
    alignment: int | None = None,
    arch: str = "llama",
    seed: int = 0,
    split_max_tensors: int = 0,
    split_max_size: int = 0,
    small_first_shard: bool = False,
) -> Path:
    """Write a GGUF with gguf-py's ``GGUFWriter`` (llama.cpp's layout: v3, padded end).

    With ``split_max_tensors`` / ``split_max_size`` / ``small_first_shard`` gguf-py writes
    a split set named ``{path.stem}-0000N-of-0000M.gguf`` beside ``path`` instead."""
    w = gguf.GGUFWriter(
        str(path), arch, split_max_tensors=split_max_tensors, split_max_size=split_max_size,
        small_first_shard=small_first_shard,
    )
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for entry in kv:
        _add_kv(w, entry)
    for d, data in make_tensors(defs, seed):
        rd = raw_dtype(d.type)
        if rd is None:
            w.add_tensor(d.name, data)
        else:
            w.add_tensor(d.name, data, raw_dtype=rd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def write_gguf_stream(
    path: Path,
    defs: Iterable[TensorDef] = (),
    *,
    kv: Sequence[tuple[str, G.GGUFValue]] = (),
    alignment: int = 32,
    version: int = 3,
    pad_end: bool | int = True,
    seed: int = 0,
) -> Path:
    """Write a GGUF with ``GGUFWriterStream`` and exact :class:`GGUFValue` metadata
    (``general.alignment`` is added as UINT32 when ``alignment`` is not 32)."""
    kv = list(kv)
    if alignment != 32 and not any(k == "general.alignment" for k, _ in kv):
        kv.append(("general.alignment", G.GGUFValue.of(G.ValueType.UINT32, alignment)))
    tensors = make_tensors(defs, seed)
    specs = [G.TensorSpec(d.name, int(Q[d.type]), tuple(reversed(d.shape))) for d, _ in tensors]
    data = {d.name: np.ascontiguousarray(b) for d, b in tensors}
    with G.GGUFWriterStream(path, version=version, alignment=alignment, kv=kv, tensors=specs, pad_end=pad_end) as w:
        for spec in w.tensors_in_file_order:
            w.write_tensor_data(data[spec.name].view(np.uint8).reshape(-1))
    return Path(path)


def tensor_data_offsets(path: Path) -> dict[str, tuple[int, int, str]]:
    """``{name: (absolute data offset, nbytes, type name)}`` read with gguf-py's GGUFReader."""
    r = gguf.GGUFReader(str(path))
    out = {t.name: (int(t.data_offset), int(t.n_bytes), t.tensor_type.name) for t in r.tensors}
    del r
    return out


def kv_type_offset(path: Path, key: str) -> int:
    """Absolute offset of the u32 value-type tag of metadata ``key`` (found with gguf-py)."""
    r = gguf.GGUFReader(str(path))
    f = r.fields[key]
    # parts: [key length, key bytes, value type, ...]; the offset is of the first part
    off = int(f.offset) + f.parts[0].nbytes + f.parts[1].nbytes
    del r
    return off


def write_gguf_raw(path: Path, tensors: Sequence[tuple[str, str, tuple[int, ...], np.ndarray]], *,
                   arch: str = "test", alignment: int | None = None) -> Path:
    """Write hand-made tensor bytes with gguf-py: ``(name, GGML type, numpy-order shape, raw)``;
    ``raw`` holds the GGML blocks (or plain elements) in order, any dtype."""
    w = gguf.GGUFWriter(str(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for name, type_name, shape, raw in tensors:
        data = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
        qt = Q[type_name]
        if qt in (Q.F32, Q.F16) or type_name in INT_TYPES:
            dt = {"F32": np.float32, "F16": np.float16, **INT_TYPES}[type_name]
            w.add_tensor(name, data.view(dt).reshape(shape))
        else:
            block, size = gguf.GGML_QUANT_SIZES[qt]
            w.add_tensor(name, data.reshape(*shape[:-1], shape[-1] // block * size), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def q4_1_blocks(d: Sequence[float], m: Sequence[float], codes: np.ndarray) -> np.ndarray:
    """Q4_1 blocks from f16 ``d``, ``m`` and 32 codes (0..15) per block: d, m, 16 bytes of
    nibbles (element j low nibble, element j+16 high nibble of byte j) — ggml's layout."""
    codes = np.asarray(codes, np.uint8).reshape(-1, 32)
    out = np.zeros((codes.shape[0], 20), np.uint8)
    out[:, 0:2] = np.asarray(d, np.float16).reshape(-1, 1).view(np.uint8)
    out[:, 2:4] = np.asarray(m, np.float16).reshape(-1, 1).view(np.uint8)
    out[:, 4:] = codes[:, :16] | (codes[:, 16:] << 4)
    return out


def q8_0_blocks(d: Sequence[float], codes: np.ndarray) -> np.ndarray:
    """Q8_0 blocks from f16 ``d`` and 32 int8 codes per block."""
    codes = np.asarray(codes, np.int8).reshape(-1, 32)
    out = np.zeros((codes.shape[0], 34), np.uint8)
    out[:, 0:2] = np.asarray(d, np.float16).reshape(-1, 1).view(np.uint8)
    out[:, 2:] = codes.view(np.uint8)
    return out
