"""The GGUF container: a fast, strict reader and a byte-exact streaming writer.

This module knows only GGUF (llama.cpp's model file): header, key/value
metadata, tensor infos, aligned tensor data.  It does not interpret tensors
(quantized blocks stay opaque bytes) and knows nothing of Hurray.

Why we parse GGUF ourselves instead of using gguf-py's ``GGUFReader``
-----------------------------------------------------------------------
gguf-py (``pip install gguf``) stays the *test oracle* and the source of the
reference quantizers, but it is not fit to be the production reader:

* **speed** -- ``GGUFReader`` builds several numpy objects per array element;
  opening a file with a 262k-token vocabulary takes 10-23 s.  Here numeric
  arrays are one ``np.frombuffer`` each and string arrays are a single tight
  walk over the u64 length prefixes, kept as a lazily decoded
  :class:`StringArray` over the memory map.
* **strictness** -- gguf-py 0.19.0 has no bounds checks (lengths and counts
  are trusted, ``np.prod`` of uint64 dims wraps), does not check tensor
  overlap or alignment, and raises ``ValueError``/``KeyError``/
  ``UnicodeDecodeError`` without locations.  Every defect here raises a
  :mod:`hurray_interop.errors` ``FormatError`` subclass naming the field or
  tensor and the absolute byte offset, and every count is checked against
  the bytes remaining *before* anything is allocated.
* **exact types** -- gguf-py forgets the element type of empty arrays,
  flattens nested arrays, decodes strings as strict UTF-8 and has a wrong
  Q8_1 block size (40, really 36) and no Q2_0.  Here every value keeps its
  exact GGUF type, element type, raw bytes and bit pattern, so a read →
  write round trip reproduces the file byte for byte (version 2 or 3,
  n_dims with trailing 1s, offsets, non-padded file ends).
* **writing** -- ``GGUFWriter`` always writes version 3, always pads the end,
  cannot write empty arrays, silently drops empty strings and infers array
  element types.  :class:`GGUFWriterStream` writes exactly what it is given,
  streaming tensor data chunk by chunk into a path or an open binary file.

GGML type facts (ids, block sizes) come from ``mappings/ggml_types.toml``.

Layout (all little-endian; big-endian GGUF is refused)::

    "GGUF" u32 version  u64 n_tensors  u64 n_kv
    n_kv × (string key, u32 type, value)
    n_tensors × (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset)
    zero padding to `alignment`                     -> data_offset
    tensor data at data_offset + offset (aligned), zero padding between tensors
    [zero padding after the last tensor -- absent in some files]

where ``string`` is ``u64 length, bytes`` and an array value is
``u32 element_type, u64 count, elements``.
"""

from __future__ import annotations

import bisect
import enum
import functools
import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..errors import (
    BadMagicError,
    FormatError,
    InconsistentError,
    TruncatedError,
    UnsupportedError,
    UsageError,
)
from ..files.binary import Reader
from ..parallel import prefetch_chunks
from ..tables import load_table

__all__ = [
    "MAGIC",
    "DEFAULT_ALIGNMENT",
    "MAX_DIMS",
    "MAX_ARRAY_DEPTH",
    "ValueType",
    "GGMLType",
    "ggml_type",
    "ggml_types",
    "tensor_nbytes",
    "StringArray",
    "GGUFValue",
    "ModelMetadata",
    "encode_value",
    "decode_value",
    "GGUFTensorInfo",
    "TensorSpec",
    "GGUFFile",
    "read_gguf",
    "layout_offsets",
    "GGUFWriterStream",
]

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
#: nesting bound for arrays of arrays (llama.cpp itself refuses any nesting)
MAX_ARRAY_DEPTH = 8
SUPPORTED_VERSIONS = (2, 3)

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")
_ARRAY_HEAD = struct.Struct("<IQ")
#: a tensor's dims, by their count (n_dims is at most MAX_DIMS)
_NE = tuple(struct.Struct(f"<{n}Q") for n in range(MAX_DIMS + 1))
_I64_MAX = (1 << 63) - 1

# minimum encoded sizes, used to bound counts before allocating anything
_MIN_KV = 8 + 4 + 1  # empty key, type, one-byte scalar
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8  # empty name, n_dims=0, type, offset


class ValueType(enum.IntEnum):
    """GGUF metadata value types (``enum gguf_type``)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_VALUE_TYPE_IDS = frozenset(int(t) for t in ValueType)

#: how the writer's refusal of a misplaced ``padding`` override starts
PADDING_MISPLACED = "padding override at"

#: exact little-endian dtype of each fixed-size value type; BOOL keeps its raw byte
_SCALAR_DTYPE: dict[ValueType, np.dtype] = {
    ValueType.UINT8: np.dtype("<u1"),
    ValueType.INT8: np.dtype("<i1"),
    ValueType.UINT16: np.dtype("<u2"),
    ValueType.INT16: np.dtype("<i2"),
    ValueType.UINT32: np.dtype("<u4"),
    ValueType.INT32: np.dtype("<i4"),
    ValueType.FLOAT32: np.dtype("<f4"),
    ValueType.BOOL: np.dtype("<u1"),
    ValueType.UINT64: np.dtype("<u8"),
    ValueType.INT64: np.dtype("<i8"),
    ValueType.FLOAT64: np.dtype("<f8"),
}


# --------------------------------------------------------------------------
# GGML type table
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class GGMLType:
    """One row of ``mappings/ggml_types.toml``."""

    name: str
    id: int
    block_elements: int
    block_bytes: int
    family: str
    numpy: str = ""
    note: str = ""

    @property
    def removed(self) -> bool:
        return self.block_elements == 0

    def dtype(self) -> np.dtype | None:
        """numpy dtype of one element for plain (unblocked) types, else None."""
        if not self.numpy:
            return None
        if self.numpy == "bfloat16":
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(self.numpy)


@functools.cache
def _type_index() -> tuple[dict[int, GGMLType], dict[str, GGMLType]]:
    by_id: dict[int, GGMLType] = {}
    by_name: dict[str, GGMLType] = {}
    for name, row in load_table("ggml_types").items():
        t = GGMLType(name=name, **dict(row))
        if t.id in by_id:  # pragma: no cover - table defect
            raise RuntimeError(f"ggml_types.toml: duplicate id {t.id}")
        by_id[t.id] = t
        by_name[name] = t
    return by_id, by_name


def ggml_types() -> list[GGMLType]:
    """Every GGML type of the table, in id order (removed ids included)."""
    return sorted(_type_index()[0].values(), key=lambda t: t.id)


def ggml_type(key: int | str) -> GGMLType:
    """Look a GGML type up by id or name; unknown → :class:`UnsupportedError`."""
    by_id, by_name = _type_index()
    t = by_name.get(key) if isinstance(key, str) else by_id.get(int(key))
    if t is None:
        raise UnsupportedError(f"unknown GGML type {key!r}")
    return t


def tensor_nbytes(type_id: int | str | GGMLType, ne: Sequence[int]) -> int:
    """Bytes of a tensor of this type and ``ne`` shape (ne[0] must be whole blocks)."""
    t = type_id if isinstance(type_id, GGMLType) else ggml_type(type_id)
    if t.removed:
        raise UnsupportedError(f"GGML type {t.name} (id {t.id}) was removed from ggml")
    n = 1
    for d in ne:
        n *= int(d)
    ne0 = int(ne[0]) if len(ne) else 1
    if ne0 % t.block_elements:
        raise UsageError(f"ne[0]={ne0} is not a multiple of the {t.name} block size {t.block_elements}")
    return n // t.block_elements * t.block_bytes


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def layout_offsets(nbytes: Iterable[int], alignment: int = DEFAULT_ALIGNMENT) -> list[int]:
    """Relative tensor offsets as llama.cpp and gguf-py lay them out: each tensor
    starts at the previous offset plus its size padded to ``alignment``."""
    out, off = [], 0
    for n in nbytes:
        out.append(off)
        off += _align(int(n), alignment)
    return out


# --------------------------------------------------------------------------
# values
# --------------------------------------------------------------------------


def _decode_name(raw: bytes) -> str:
    # surrogateescape: never fails, and .encode("utf-8", "surrogateescape") gives the raw bytes back
    return raw.decode("utf-8", "surrogateescape")


def _encode_name(name: str | bytes) -> bytes:
    return name if isinstance(name, bytes) else name.encode("utf-8", "surrogateescape")


class StringArray(Sequence[bytes]):
    """A GGUF array of strings kept in its serialized form (zero-copy, lazily decoded).

    ``raw`` is the exact serialized element bytes (``u64 len, bytes`` repeated),
    which the writer copies verbatim.  Items are ``bytes``; :meth:`decode`
    gives ``str``.
    """

    __slots__ = ("_buf", "_starts", "_base", "_end")

    def __init__(self, buf: Any, starts: np.ndarray, base: int, end: int) -> None:
        self._buf = buf  # anything supporting the buffer protocol
        self._starts = starts  # int64 absolute start of each string's bytes
        self._base = base  # absolute start of the first length prefix
        self._end = end  # absolute end of the last string

    @classmethod
    def from_list(cls, items: Iterable[bytes | str]) -> "StringArray":
        parts: list[bytes] = []
        starts: list[int] = []
        pos = 0
        for it in items:
            b = it.encode("utf-8") if isinstance(it, str) else bytes(it)
            parts.append(_U64.pack(len(b)))
            parts.append(b)
            starts.append(pos + 8)
            pos += 8 + len(b)
        return cls(b"".join(parts), np.asarray(starts, dtype=np.int64), 0, pos)

    def __len__(self) -> int:
        return len(self._starts)

    def _span(self, i: int) -> tuple[int, int]:
        s = int(self._starts[i])
        e = int(self._starts[i + 1]) - 8 if i + 1 < len(self._starts) else self._end
        return s, e

    def __getitem__(self, i: Any) -> Any:  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("StringArray index out of range")
        s, e = self._span(i)
        return bytes(memoryview(self._buf)[s:e])

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.tolist())

    def tolist(self) -> list[bytes]:
        if not len(self):
            return []
        raw = bytes(memoryview(self._buf)[self._base : self._end])
        b = self._base
        st = (self._starts - b).tolist()
        ends = [s - 8 for s in st[1:]]
        ends.append(self._end - b)
        return [raw[s:e] for s, e in zip(st, ends)]

    def decode(self, errors: str = "strict") -> list[str]:
        return [x.decode("utf-8", errors) for x in self.tolist()]

    @property
    def raw(self) -> memoryview:
        return memoryview(self._buf)[self._base : self._end]

    @property
    def nbytes(self) -> int:
        return self._end - self._base

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return len(self) == len(other) and bytes(self.raw) == bytes(other.raw)
        if isinstance(other, (list, tuple)):
            return self.tolist() == [o.encode("utf-8") if isinstance(o, str) else o for o in other]
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = self[:3] if len(self) else []
        return f"StringArray(len={len(self)}, head={head!r})"


@dataclass(frozen=True, eq=False)
class GGUFValue:
    """One metadata value with its exact GGUF representation.

    ``value`` is, by ``type``:

    * numbers and BOOL: a numpy scalar of the exact little-endian dtype
      (float32 bit-exact; BOOL is its raw byte as ``uint8``);
    * STRING: the raw ``bytes`` (not necessarily UTF-8);
    * ARRAY of numbers/BOOL: a 1-D numpy array (a read-only view when read);
    * ARRAY of STRING: a :class:`StringArray`;
    * ARRAY of ARRAY: a tuple of ARRAY :class:`GGUFValue`.

    ``element_type`` is the declared element type of an array (kept for empty arrays too).
    """

    type: ValueType
    value: Any
    element_type: ValueType | None = None

    # -- construction ------------------------------------------------------

    @classmethod
    def of(cls, vtype: ValueType | int, value: Any, element_type: ValueType | int | None = None, *,
           exact: bool = False) -> "GGUFValue":
        """Build a value of an explicit type from Python or numpy input (range-checked).

        Integers must lie in the type's range and finite floats must stay finite at its
        width; floats are rounded to FLOAT32 unless ``exact``, which holds them to the
        exact rule of :func:`_check_floats` (a value recorded as FLOAT32 must be one).
        """
        vtype = ValueType(vtype)
        if vtype == ValueType.ARRAY:
            if element_type is None:
                raise UsageError("an ARRAY value needs an element_type")
            et = ValueType(element_type)
            if et == ValueType.STRING:
                arr = value if isinstance(value, StringArray) else StringArray.from_list(value)
                return cls(vtype, arr, et)
            if et == ValueType.ARRAY:
                items = tuple(v if isinstance(v, GGUFValue) else None for v in value)
                if any(v is None or v.type != ValueType.ARRAY for v in items):
                    raise UsageError("elements of an array of arrays must be ARRAY GGUFValues")
                return cls(vtype, items, et)
            return cls(vtype, _exact_array(value, et, exact), et)
        if element_type is not None:
            raise UsageError(f"element_type given for scalar type {vtype.name}")
        if vtype == ValueType.STRING:
            if isinstance(value, str):
                value = value.encode("utf-8")
            return cls(vtype, bytes(value))
        arr = _exact_array([value], vtype, exact)
        return cls(vtype, arr[0])

    # -- convenience -------------------------------------------------------

    def to_python(self, errors: str = "strict") -> Any:
        """Plain Python value: int, float, bool, str (UTF-8 decoded) or list."""
        t = self.type
        if t == ValueType.STRING:
            return self.value.decode("utf-8", errors)
        if t == ValueType.BOOL:
            return bool(self.value)
        if t != ValueType.ARRAY:
            return self.value.item()
        et = self.element_type
        if et == ValueType.STRING:
            return self.value.decode(errors)
        if et == ValueType.ARRAY:
            return [v.to_python(errors) for v in self.value]
        if et == ValueType.BOOL:
            return [bool(x) for x in self.value.tolist()]
        return self.value.tolist()

    def __len__(self) -> int:
        if self.type != ValueType.ARRAY:
            raise TypeError(f"{self.type.name} value has no length")
        return len(self.value)

    def __eq__(self, other: object) -> bool:
        """Exact equality: same types and the same encoded bytes."""
        if not isinstance(other, GGUFValue):
            return NotImplemented
        if self.type != other.type or self.element_type != other.element_type:
            return False
        return _encode_value_bytes(self) == _encode_value_bytes(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        if self.type == ValueType.ARRAY:
            et = self.element_type.name if self.element_type is not None else "?"
            return f"GGUFValue(ARRAY[{et}] x {len(self.value)})"
        return f"GGUFValue({self.type.name}, {self.value!r})"


def _check_floats(src: np.ndarray, out: np.ndarray, et: ValueType, exact: bool) -> None:
    """The float twin of the integer range rule: a finite value must stay finite at the
    type's width, and with ``exact`` it must come back bit for bit when widened again
    (0.1 is refused as FLOAT32; ±0, subnormals and ±inf are kept, a NaN only when its
    payload survives the narrowing; docs/conversion-rules.md § 7)."""
    if src.dtype.kind == "f" and src.dtype.itemsize > out.dtype.itemsize:
        lost = np.isinf(out) & np.isfinite(src)
        if exact:
            u = f"u{src.dtype.itemsize}"
            lost |= out.astype(src.dtype).view(u) != src.view(u)
        bad = np.flatnonzero(lost)
        first = int(bad[0]) if bad.size else None
    elif exact and src.dtype.kind != "f":  # integers (or Python objects) for a float type
        pairs = enumerate(zip(src.tolist(), out.tolist()))
        first = next((i for i, (a, b) in pairs if not math.isfinite(b) or a != b), None)
    else:
        return
    if first is not None:
        v, w = src[first].item(), float(out[first])
        what = "is out of range for" if math.isinf(w) and not math.isinf(v) else "is not exactly representable as"
        at = f"element {first}: " if src.size > 1 else ""
        raise UsageError(f"{at}value {v!r} {what} {et.name}")


def _exact_array(values: Any, et: ValueType, exact: bool = False) -> np.ndarray:
    dt = _SCALAR_DTYPE.get(et)
    if dt is None:
        raise UsageError(f"{et.name} is not a fixed-size value type")
    if isinstance(values, np.ndarray) and values.dtype == dt:
        return values.reshape(-1)
    if isinstance(values, np.ndarray) and values.dtype.kind == dt.kind and values.dtype.itemsize == dt.itemsize:
        return values.reshape(-1).view(dt)  # e.g. native-endian equivalents
    if et == ValueType.BOOL:
        values = [int(v) for v in values]
    try:
        if dt.kind in "iu" and isinstance(values, (list, tuple)) and values and all(isinstance(v, (int, np.integer)) for v in values):
            # Python ints, range-checked as such: numpy turns [0, 2**63] into float64 (losing
            # the exact value), which the checks below would then call non-integers
            ints = [int(v) for v in values]
            info = np.iinfo(dt)
            if min(ints) < info.min or max(ints) > info.max:
                raise UsageError(f"value out of range for {et.name}")
            return np.array(ints, dtype=dt)
        src = np.asarray(values)
        if dt.kind in "iu" and src.size and src.dtype.kind not in "iub":
            raise UsageError(f"{et.name} values must be integers")
        if dt.kind in "iu" and src.size:
            info = np.iinfo(dt)
            if int(src.min()) < info.min or int(src.max()) > info.max:
                raise UsageError(f"value out of range for {et.name}")
        if dt.kind != "f":
            return np.asarray(src, dtype=dt).reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below, not warned
            out = np.asarray(src, dtype=dt).reshape(-1)
    except (TypeError, ValueError, OverflowError) as e:
        raise UsageError(f"cannot encode {values!r} as {et.name}: {e}") from None
    _check_floats(src.reshape(-1), out, et, exact)
    return out


# --------------------------------------------------------------------------
# tensors
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """What the writer needs about one tensor. ``offset`` None → computed like gguf-py."""

    name: str | bytes
    type_id: int
    ne: tuple[int, ...]
    offset: int | None = None


@dataclass(frozen=True, eq=False)
class GGUFTensorInfo:
    """One tensor info as stored, with a zero-copy view of its bytes."""

    name: str
    type_id: int
    ne: tuple[int, ...]  # exactly as stored, ggml order (ne[0] = innermost), n_dims = len(ne)
    offset: int  # relative to the data section
    data_offset: int  # absolute
    nbytes: int
    info_offset: int  # absolute offset of this tensor-info record
    data: np.ndarray  # uint8 view of the tensor bytes (read-only)

    @property
    def ggml_type(self) -> GGMLType:
        return ggml_type(self.type_id)

    @property
    def type_name(self) -> str:
        return self.ggml_type.name

    @property
    def n_dims(self) -> int:
        return len(self.ne)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy (row-major) shape: ``ne`` reversed."""
        return tuple(reversed(self.ne))

    @property
    def raw_name(self) -> bytes:
        return _encode_name(self.name)

    def array(self) -> np.ndarray:
        """Typed zero-copy view: element dtype for plain types (shape = ``shape``),
        uint8 "byte shape" ``(*shape[:-1], ne[0]/block*block_bytes)`` for block types."""
        t = self.ggml_type
        dt = t.dtype()
        if dt is not None:
            return self.data.view(dt).reshape(self.shape)
        if not self.ne:
            return self.data
        row = self.ne[0] // t.block_elements * t.block_bytes
        return self.data.reshape(tuple(reversed(self.ne[1:])) + (row,))


# --------------------------------------------------------------------------
# reader
# --------------------------------------------------------------------------


def _value_type(r: Reader, what: str) -> ValueType:
    at = r.pos
    t = r.u32(what)
    if t not in _VALUE_TYPE_IDS:
        raise r.error(f"invalid GGUF value type {t}", what, at=at)
    return ValueType(t)


def _value(r: Reader, vtype: ValueType, what: str, depth: int = 0) -> GGUFValue:
    """The value of type ``vtype`` at the reader's position (which moves past it)."""
    dt = _SCALAR_DTYPE.get(vtype)
    if dt is not None:
        return GGUFValue(vtype, r.scalar(dt, what))
    if vtype == ValueType.STRING:
        return GGUFValue(vtype, r.string(what))
    # ARRAY
    at = r.pos
    et = _value_type(r, f"{what} element type")
    count = r.u64(f"{what} count")
    left = r.remaining
    dt = _SCALAR_DTYPE.get(et)
    min_size = dt.itemsize if dt is not None else (8 if et == ValueType.STRING else 12)
    if count > left // min_size:
        raise r.error(
            f"array of {count} {et.name} elements needs at least {count * min_size} bytes, only {left} left in the file",
            f"{what} count", at=at + 4, cls=TruncatedError,
        )
    if dt is not None:
        return GGUFValue(ValueType.ARRAY, r.array(dt, count, what), et)
    if et == ValueType.STRING:
        # Vocabularies: the offsets of all strings in one walk, nothing decoded --
        # StringArray decodes on access.
        base = r.pos
        starts = r.string_starts(count, what)
        return GGUFValue(ValueType.ARRAY, StringArray(r.obj, starts, base, r.pos), ValueType.STRING)
    if depth + 1 >= MAX_ARRAY_DEPTH:
        raise r.error(f"arrays nested deeper than {MAX_ARRAY_DEPTH} levels", what, at=at)
    # an element of an array of arrays is itself (element type, count, elements)
    items = tuple(_value(r, ValueType.ARRAY, f"{what}[{i}]", depth + 1) for i in range(count))
    return GGUFValue(ValueType.ARRAY, items, et)


#: the keys that make a GGUF file a shard of a split set (llama.cpp's gguf-split; the sets
#: themselves are :mod:`.gguf_split`'s), in the order gguf-split writes them
SPLIT_KEYS = ("split.no", "split.tensors.count", "split.count")


def has_split_keys(gf: "ModelMetadata") -> bool:
    """Does ``gf`` carry split keys (so it may be a shard: :func:`.gguf_split.split_set_of` decides)?"""
    return any(k in gf.kv for k in SPLIT_KEYS)


class ModelMetadata:
    """Metadata lookups a GGUF model reader offers (over its ``kv``)."""

    kv: dict[str, GGUFValue]
    #: the split set a whole-set model reads (:class:`.gguf_split.SplitModel`); None for one file
    split_set: Any = None

    def get(self, key: str, default: Any = None) -> Any:
        """Python value of a metadata key (strings decoded with errors='replace')."""
        v = self.kv.get(key)
        return default if v is None else v.to_python("replace")

    @property
    def architecture(self) -> str | None:
        return self.get("general.architecture")


class GGUFFile(ModelMetadata):
    """A parsed, memory-mapped GGUF file. Use :func:`read_gguf` or :meth:`open`.

    Attributes: ``path``, ``version``, ``alignment``, ``kv`` (ordered
    ``{key: GGUFValue}``), ``tensors`` (list of :class:`GGUFTensorInfo` in
    tensor-info order), ``tensor_infos_offset`` (where the tensor infos
    start), ``metadata_end`` (end of the tensor infos), ``data_offset``,
    ``kv_offsets`` (absolute offset of each metadata record),
    ``file_size``, ``tail_bytes`` (zero bytes after the end of the last
    tensor, or after the tensor infos when there are none), ``ends_padded``,
    ``canonical_layout`` (offsets exactly as llama.cpp lays them out and
    requires), ``nonzero_padding`` (``{absolute offset: bytes view}`` of
    padding regions that are not all zero -- empty for every sane file).
    """

    path: str | None
    version: int
    alignment: int
    kv: dict[str, GGUFValue]
    kv_offsets: dict[str, int]
    tensors: list[GGUFTensorInfo]
    tensor_infos_offset: int
    metadata_end: int
    data_offset: int
    file_size: int
    tail_bytes: int
    ends_padded: bool
    canonical_layout: bool
    nonzero_padding: dict[int, np.ndarray]

    def __init__(self, buf: Any, *, path: str | os.PathLike[str] | None = None, _mmap: mmap.mmap | None = None) -> None:
        self.path = os.fspath(path) if path is not None else None
        self._mmap = _mmap
        self._buf = buf
        self._by_name: dict[str, GGUFTensorInfo] | None = None
        self._parse(buf)

    # -- construction ------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> "GGUFFile":
        """Memory-map ``path`` read-only and parse it."""
        try:
            fh = open(path, "rb")
        except OSError as e:  # missing, a directory, unreadable: one located line, like the other readers
            reason = "permission denied" if isinstance(e, PermissionError) else (e.strerror or str(e))
            raise UsageError(f"cannot open: {reason}", path=path) from None
        with fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                return cls(b"", path=path)
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return cls(mm, path=path, _mmap=mm)
        except BaseException:
            _close_mmap(mm)
            raise

    def close(self) -> None:
        """Drop the mapping. Views handed out earlier stay valid (they keep it alive)."""
        mm, self._mmap = self._mmap, None
        if mm is not None:
            _close_mmap(mm)

    def release_pages(self) -> None:
        """Unmap the pages read so far from this process (``MADV_DONTNEED``).

        The file is read-only mapped, so nothing is lost: a later access faults
        the page in again from the page cache.  Streaming converters call this
        after each tensor so that their resident memory stays bounded instead of
        growing to the size of the file.  A no-op for in-memory images."""
        _release(self._mmap)

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- convenience -------------------------------------------------------

    def tensor(self, name: str) -> GGUFTensorInfo:
        if self._by_name is None:
            self._by_name = {t.name: t for t in self.tensors}
        try:
            return self._by_name[name]
        except KeyError:
            raise UsageError(f"no tensor named {name!r}", path=self.path) from None

    def __repr__(self) -> str:
        return (
            f"GGUFFile({self.path!r}, version={self.version}, kv={len(self.kv)}, "
            f"tensors={len(self.tensors)}, alignment={self.alignment})"
        )

    # -- parsing -------------------------------------------------------------

    def _err(self, cls: type[FormatError], msg: str, **kw: Any) -> FormatError:
        return cls(msg, path=self.path, **kw)

    def _parse(self, buf: Any) -> None:
        size = len(buf)
        self.file_size = size
        r = Reader(buf, path=self.path)
        n_tensors, n_kv = self._parse_header(r, buf, size)
        self._parse_kv(r, n_kv)
        self.tensor_infos_offset = r.pos
        self.alignment = self._alignment()
        by_id = _type_index()[0]
        raw_infos: list[tuple[str, int, tuple[int, ...], int, int, int, GGMLType]] = []
        names: set[str] = set()
        for i in range(n_tensors):
            raw_infos.append(self._parse_tensor_info(r, i, by_id, names))
        pos = self.metadata_end = r.pos
        self.data_offset = _align(pos, self.alignment)
        self.tensors = [self._place(buf, size, *info) for info in raw_infos]
        self._check_data_region(buf, size, pos)

    def _parse_header(self, r: Reader, buf: Any, size: int) -> tuple[int, int]:
        """Magic, version and the two counts (checked against the bytes left)."""
        if size < 4 or bytes(buf[:4]) != MAGIC:
            if size < 4 and MAGIC.startswith(bytes(buf[:size])):
                raise self._err(TruncatedError, f"file is {size} bytes, too short for the GGUF magic", field="magic", offset=0)
            raise self._err(BadMagicError, f"not a GGUF file: magic {bytes(buf[:4])!r}, expected b'GGUF'", field="magic", offset=0)
        r.pos = 4
        version = r.u32("version")
        if version & 0xFFFF == 0 and version != 0:
            raise self._err(
                UnsupportedError,  # type: ignore[arg-type]
                f"big-endian GGUF (version field reads 0x{version:08x} little-endian); only little-endian GGUF is supported",
                field="version",
                offset=4,
            )
        if version not in SUPPORTED_VERSIONS:
            if version in (0,):
                raise self._err(FormatError, "invalid GGUF version 0", field="version", offset=4)
            raise self._err(
                UnsupportedError,  # type: ignore[arg-type]
                f"GGUF version {version} is not supported (only versions 2 and 3)",
                field="version",
                offset=4,
            )
        self.version = version
        n_tensors = r.u64("tensor count")
        n_kv = r.u64("metadata kv count")
        left = size - 24
        if n_kv > left // _MIN_KV or n_tensors > left // _MIN_TENSOR_INFO or n_kv * _MIN_KV + n_tensors * _MIN_TENSOR_INFO > left:
            raise self._err(
                TruncatedError,
                f"{n_kv} metadata entries and {n_tensors} tensor infos cannot fit in the {left} bytes after the header",
                field="header counts",
                offset=8,
            )
        return n_tensors, n_kv

    def _parse_kv(self, r: Reader, n_kv: int) -> None:
        """The metadata section at the reader's position (sets ``kv``, ``kv_offsets``)."""
        kv: dict[str, GGUFValue] = {}
        kv_offsets: dict[str, int] = {}
        for i in range(n_kv):
            at = r.pos
            raw_key = r.string(f"metadata key #{i}")
            key = _decode_name(raw_key)
            if key in kv:
                raise self._err(InconsistentError, f"duplicate metadata key {key!r}", field=f"metadata key #{i}", offset=at)
            what = f"metadata {key!r}"
            kv[key] = _value(r, _value_type(r, f"{what} type"), what)
            kv_offsets[key] = at
        self.kv = kv
        self.kv_offsets = kv_offsets

    def _alignment(self) -> int:
        """``general.alignment`` (a UINT32 power of two) or the default."""
        align_v = self.kv.get("general.alignment")
        if align_v is None:
            return DEFAULT_ALIGNMENT
        if align_v.type != ValueType.UINT32:
            raise self._err(
                FormatError, f"general.alignment must be UINT32, found {align_v.type.name}",
                field="metadata 'general.alignment'",
                offset=self.kv_offsets["general.alignment"],
            )
        alignment = int(align_v.value)
        if alignment == 0 or alignment & (alignment - 1):
            raise self._err(
                FormatError, f"general.alignment {alignment} is not a power of two",
                field="metadata 'general.alignment'",
                offset=self.kv_offsets["general.alignment"],
            )
        return alignment

    def _parse_tensor_info(
        self, r: Reader, i: int, by_id: dict[int, GGMLType], names: set[str]
    ) -> tuple[str, int, tuple[int, ...], int, int, int, GGMLType]:
        """Tensor info #i at the reader's position: ``(name, type id, ne, offset, nbytes, info
        offset, type)`` (``names``: those seen so far; this one is added)."""
        at = r.pos
        raw_name = r.string(f"tensor info #{i} name")
        name = _decode_name(raw_name)
        if name in names:
            raise self._err(InconsistentError, "duplicate tensor name", tensor=name, field="tensor info", offset=at)
        names.add(name)
        n_dims_at = r.pos
        n_dims = r.u32(f"tensor info {name!r} n_dims")
        if n_dims > MAX_DIMS:
            raise self._err(FormatError, f"n_dims {n_dims} exceeds the maximum {MAX_DIMS}", tensor=name, field="n_dims", offset=n_dims_at)
        ne_at = r.pos
        ne = r.unpack(_NE[n_dims], f"tensor info {name!r} ne")
        type_at = r.pos
        type_id = r.u32(f"tensor info {name!r} type")
        offset = r.u64(f"tensor info {name!r} offset")
        for j, d in enumerate(ne):
            if d > _I64_MAX:
                raise self._err(FormatError, f"ne[{j}] = {d} is negative as int64", tensor=name, field=f"ne[{j}]", offset=ne_at + 8 * j)
        n_el = 1
        for d in ne:
            n_el *= d
        if n_el > _I64_MAX:
            raise self._err(FormatError, f"element count {n_el} of shape {list(ne)} overflows int64", tensor=name, field="ne", offset=ne_at)
        t = by_id.get(type_id)
        if t is None:
            raise self._err(FormatError, f"unknown GGML type id {type_id}", tensor=name, field="type", offset=type_at)
        if t.removed:
            raise self._err(
                FormatError, f"GGML type id {type_id} ({t.name}) was removed from ggml: {t.note}", tensor=name, field="type", offset=type_at
            )
        ne0 = ne[0] if ne else 1
        if ne0 % t.block_elements:
            raise self._err(FormatError, f"ne[0] = {ne0} is not a multiple of the {t.name} block size {t.block_elements}",
                            tensor=name, field="ne[0]", offset=ne_at)
        nbytes = n_el // t.block_elements * t.block_bytes
        return (name, type_id, tuple(ne), offset, nbytes, at, t)

    def _place(self, buf: Any, size: int, name: str, type_id: int, ne: tuple[int, ...], offset: int, nbytes: int,
               at: int, t: GGMLType) -> GGUFTensorInfo:
        """A tensor's data range: aligned, inside the file; a zero-copy view of it."""
        if offset % self.alignment:
            raise self._err(InconsistentError, f"data offset {offset} is not a multiple of the alignment {self.alignment}",
                            tensor=name, field="tensor info offset", offset=at)
        start = self.data_offset + offset
        if start + nbytes > size:
            raise self._err(
                TruncatedError,
                f"{t.name} data [{start}, {start + nbytes}) ({nbytes} bytes) extends past the end of the file ({size} bytes)",
                tensor=name,
                field="tensor data",
                offset=start,
            )
        view = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=start)
        return GGUFTensorInfo(name, type_id, ne, offset, start, nbytes, at, view)

    def _check_data_region(self, buf: Any, size: int, pos: int) -> None:
        """Overlaps (zero-size tensors occupy nothing), gaps and the tail after the tensor
        infos ending at ``pos``; records the padding facts."""
        tensors, alignment = self.tensors, self.alignment
        order = sorted((t for t in tensors if t.nbytes), key=lambda t: t.data_offset)
        nonzero: dict[int, np.ndarray] = {}
        cur = pos  # end of the tensor infos
        prev: GGUFTensorInfo | None = None
        for t in order:
            if prev is not None and t.data_offset < cur:
                raise self._err(
                    InconsistentError,
                    f"data [{t.data_offset}, {t.data_offset + t.nbytes}) overlaps tensor {prev.name!r} "
                    f"[{prev.data_offset}, {prev.data_offset + prev.nbytes})",
                    tensor=t.name,
                    field="tensor data",
                    offset=t.data_offset,
                )
            self._check_gap(buf, cur, t.data_offset, nonzero)
            cur = t.data_offset + t.nbytes
            prev = t
        # zero-size tensors occupy nothing but still place the end (as the writer does)
        data_end = max([self.data_offset] + [t.data_offset + t.nbytes for t in tensors]) if tensors else pos
        self._check_gap(buf, cur, data_end, nonzero)  # only all-empty tensors leave one
        tail = size - data_end
        pad = _align(data_end, alignment) - data_end
        if tail > pad:
            raise self._err(
                InconsistentError,
                f"{tail} bytes follow the end of the tensor data at {data_end} (at most {pad} bytes of padding "
                "are allowed; concatenated or corrupt file?)",
                field="trailing data",
                offset=data_end,
            )
        self._check_gap(buf, data_end, size, nonzero)
        self.tail_bytes = tail
        self.ends_padded = tail == pad
        self.nonzero_padding = nonzero
        canon = layout_offsets((t.nbytes for t in tensors), alignment)
        self.canonical_layout = all(t.offset == o for t, o in zip(tensors, canon))

    @staticmethod
    def _check_gap(buf: Any, start: int, end: int, nonzero: dict[int, np.ndarray]) -> None:
        if end > start:
            g = np.frombuffer(buf, dtype=np.uint8, count=end - start, offset=start)
            if g.any():
                nonzero[start] = g


def _release(mm: mmap.mmap | None) -> None:
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if mm is None or advice is None:
        return
    try:
        mm.madvise(advice)
    except (OSError, ValueError):  # closed, or the platform refuses: only a memory optimisation
        pass


def _close_mmap(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass  # numpy views are still alive; they keep the mapping until they go


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open and parse a GGUF file (memory-mapped, read-only). Use as a context manager."""
    return GGUFFile.open(path)


# --------------------------------------------------------------------------
# encoding
# --------------------------------------------------------------------------


def _encode_value(v: GGUFValue, out: list[Any]) -> None:
    """Append the encoded value (without its type tag) to ``out`` as buffers."""
    t = v.type
    dt = _SCALAR_DTYPE.get(t)
    if dt is not None:
        out.append(np.asarray(v.value, dtype=dt).tobytes())
        return
    if t == ValueType.STRING:
        b = v.value
        out.append(_U64.pack(len(b)))
        out.append(b)
        return
    if t != ValueType.ARRAY:  # pragma: no cover - ValueType is closed
        raise UsageError(f"cannot encode value type {t!r}")
    et = v.element_type
    if et is None:
        raise UsageError("ARRAY value without element_type")
    val = v.value
    out.append(_ARRAY_HEAD.pack(int(et), len(val)))
    edt = _SCALAR_DTYPE.get(et)
    if edt is not None:
        arr = np.ascontiguousarray(val, dtype=edt)
        out.append(memoryview(arr).cast("B"))
    elif et == ValueType.STRING:
        out.append(val.raw)
    else:
        for item in val:
            if item.type != ValueType.ARRAY:
                raise UsageError("elements of an array of arrays must be ARRAY values")
            _encode_value(item, out)


def encode_value(v: GGUFValue) -> bytes:
    """The exact GGUF encoding of a value, without its u32 type tag."""
    out: list[Any] = []
    _encode_value(v, out)
    return b"".join(bytes(x) if not isinstance(x, bytes) else x for x in out)


_encode_value_bytes = encode_value  # former private name


def decode_value(
    vtype: ValueType | int, raw: bytes | bytearray | memoryview, *, what: str = "value", path: str | None = None
) -> GGUFValue:
    """Parse one value of type ``vtype`` that fills ``raw`` exactly (inverse of :func:`encode_value`).

    Malformed or short data raises a :class:`FormatError` subclass with offsets relative to
    ``raw``; bytes left over raise :class:`InconsistentError`.
    """
    if int(vtype) not in _VALUE_TYPE_IDS:
        raise FormatError(f"invalid GGUF value type {int(vtype)}", path=path, field=what)
    r = Reader(raw, path=path)
    v = _value(r, ValueType(vtype), what)
    end = r.pos
    if end != len(raw):
        raise InconsistentError(f"{len(raw) - end} stray bytes after the value", path=path, field=what, offset=end)
    return v


def _kv_items(kv: Mapping[Any, GGUFValue] | Iterable[tuple[Any, GGUFValue]]) -> list[tuple[bytes, GGUFValue]]:
    items = kv.items() if isinstance(kv, Mapping) else kv
    out = []
    for k, v in items:
        if not isinstance(v, GGUFValue):
            raise UsageError(f"metadata {k!r}: values must be GGUFValue (use GGUFValue.of)")
        out.append((_encode_name(k), v))
    return out


# --------------------------------------------------------------------------
# writer
# --------------------------------------------------------------------------


def _check_writer_kv(items: list[tuple[bytes, GGUFValue]], alignment: int) -> None:
    """Unique keys; ``general.alignment`` (if given) a UINT32 equal to ``alignment``."""
    keys = [k for k, _ in items]
    if len(set(keys)) != len(keys):
        raise UsageError("duplicate metadata keys")
    align_v = dict(items).get(b"general.alignment")
    if align_v is not None:
        if align_v.type != ValueType.UINT32 or int(align_v.value) != alignment:
            raise UsageError(f"general.alignment {align_v!r} disagrees with alignment={alignment}")
    elif alignment != DEFAULT_ALIGNMENT:
        raise UsageError(f"alignment {alignment} needs a UINT32 general.alignment entry in kv")


def _writer_specs(tensors: Sequence[Any], alignment: int) -> list[tuple[bytes, int, tuple[int, ...], int, int]]:
    """``(raw name, type id, ne, offset, nbytes)`` per tensor; offsets laid out like
    llama.cpp when none is given, else all given and aligned."""
    specs: list[tuple[bytes, int, tuple[int, ...], Any, int]] = []
    seen: set[bytes] = set()
    for t in tensors:
        name = _encode_name(getattr(t, "raw_name", None) or t.name)
        if name in seen:
            raise UsageError(f"duplicate tensor name {_decode_name(name)!r}")
        seen.add(name)
        ne = tuple(int(d) for d in t.ne)
        if len(ne) > MAX_DIMS or any(d < 0 or d > _I64_MAX for d in ne):
            raise UsageError(f"tensor {_decode_name(name)!r}: invalid ne {ne}")
        try:
            nbytes = tensor_nbytes(int(t.type_id), ne)
        except UnsupportedError as e:
            raise UsageError(f"tensor {_decode_name(name)!r}: {e.message}") from None
        specs.append((name, int(t.type_id), ne, getattr(t, "offset", None), nbytes))
    given = [s[3] is not None for s in specs]
    if any(given) and not all(given):
        raise UsageError("give every tensor offset or none")
    if specs and not all(given):
        offs = layout_offsets((s[4] for s in specs), alignment)
        specs = [(n, ty, ne, o, nb) for (n, ty, ne, _, nb), o in zip(specs, offs)]
    for n, _, _, o, _ in specs:
        if o < 0 or o % alignment:
            raise UsageError(f"tensor {_decode_name(n)!r}: offset {o} is not a multiple of the alignment {alignment}")
    return specs


def _head_parts(version: int, items: list[tuple[bytes, GGUFValue]],
                specs: list[tuple[bytes, int, tuple[int, ...], int, int]]) -> list[Any]:
    """Header, metadata and tensor infos, as the byte strings to write."""
    out: list[Any] = [_HEADER.pack(MAGIC, version, len(specs), len(items))]
    for k, v in items:
        out.append(_U64.pack(len(k)))
        out.append(k)
        out.append(_U32.pack(int(v.type)))
        _encode_value(v, out)
    for name, type_id, ne, off, _ in specs:
        out.append(_U64.pack(len(name)))
        out.append(name)
        out.append(struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, type_id, off))
    return out


class GGUFWriterStream:
    """Write a GGUF file exactly as described, streaming the tensor data.

    ::

        with GGUFWriterStream(out, version=3, alignment=32, kv=kv, tensors=specs) as w:
            for spec in w.tensors_in_file_order:
                w.write_tensor_data(chunks_of(spec))

    * ``dst`` -- a path (created/truncated, closed by :meth:`close`) or an open
      binary file object (written from its current position, flushed, never closed).
    * ``kv`` -- ``{key: GGUFValue}`` or ``[(key, GGUFValue)]`` written in order,
      with exact types.  If ``general.alignment`` is present it must be a UINT32
      equal to ``alignment``; without it ``alignment`` must be 32.
    * ``tensors`` -- objects with ``name``, ``type_id``, ``ne`` and ``offset``
      (:class:`TensorSpec`, or :class:`GGUFTensorInfo` for an exact copy).  All
      offsets None → laid out like llama.cpp/gguf-py; otherwise all must be
      given, aligned and non-overlapping.
    * ``pad_end`` -- True: zero padding to ``alignment`` after the last tensor
      (or after the tensor infos when there are none), as gguf-py and
      llama.cpp write; False: none; an int: exactly that many zero bytes.
    * ``padding`` -- ``{absolute offset: bytes}`` to write instead of zeros for
      padding regions starting there (:attr:`GGUFFile.nonzero_padding`).

    Header, metadata and tensor infos are written by the constructor; then
    :meth:`write_tensor_data` once per tensor in file (offset) order, then
    :meth:`close`.
    """

    def __init__(
        self,
        dst: str | os.PathLike[str] | BinaryIO,
        *,
        version: int = 3,
        alignment: int = DEFAULT_ALIGNMENT,
        kv: Mapping[Any, GGUFValue] | Iterable[tuple[Any, GGUFValue]] = (),
        tensors: Sequence[Any] = (),
        pad_end: bool | int = True,
        padding: Mapping[int, Any] | None = None,
    ) -> None:
        if version not in SUPPORTED_VERSIONS:
            raise UsageError(f"cannot write GGUF version {version} (only 2 and 3)")
        if alignment <= 0 or alignment & (alignment - 1):
            raise UsageError(f"alignment {alignment} is not a power of two")
        items = _kv_items(kv)
        _check_writer_kv(items, alignment)
        self.version = version
        self.alignment = alignment
        self._padding = {int(k): memoryview(v).cast("B") for k, v in (padding or {}).items()}
        specs = self._specs = _writer_specs(tensors, alignment)
        out = _head_parts(version, items, specs)
        meta_len = sum(len(x) if isinstance(x, bytes) else memoryview(x).nbytes for x in out)
        self.metadata_end = meta_len
        self.data_offset = _align(meta_len, alignment)
        self._order = self._file_order()
        data_end = max((self.data_offset + s[3] + s[4] for s in specs), default=meta_len)
        if specs:
            data_end = max(data_end, self.data_offset)
        pad = _align(data_end, alignment) - data_end
        if pad_end is True:
            tail = pad
        elif pad_end is False:
            tail = 0
        else:
            tail = int(pad_end)
            if not 0 <= tail <= pad:
                raise UsageError(f"pad_end={pad_end}: must be between 0 and {pad}")
        self._data_end = data_end
        self._tail = tail
        self._pad_at = self._check_padding()

        if isinstance(dst, (str, os.PathLike)):
            self._fh: BinaryIO = open(dst, "wb")
            self._own = True
        else:
            self._fh = dst
            self._own = False
        self._pos = 0
        self._next = 0
        self._closed = False
        try:
            for x in out:
                self._write(x)
        except BaseException:
            self.abort()
            raise

    def _check_padding(self) -> list[int]:
        """The padding overrides, sorted: each must lie inside one padding region of this
        layout (before the first tensor, between two, or in the end padding)."""
        starts = sorted(self._padding)
        regions, pos = [], self.metadata_end
        for i in self._order:
            _, _, _, off, nb = self._specs[i]
            if nb:
                regions.append((pos, self.data_offset + off))
                pos = self.data_offset + off + nb
        regions.append((pos, self._data_end + self._tail))
        ends = [b for _, b in regions]
        prev = -1
        for o in starts:
            n = len(self._padding[o])
            r = bisect.bisect_right(ends, o)
            if not n or o < prev or r == len(regions) or not regions[r][0] <= o or o + n > regions[r][1]:
                raise UsageError(f"{PADDING_MISPLACED} {o} ({n} bytes) is not inside the padding of this layout")
            prev = o + n
        return starts

    def _file_order(self) -> list[int]:
        """Tensor indices by offset; data ranges must not overlap (empty tensors occupy nothing)."""
        specs = self._specs
        order = sorted(range(len(specs)), key=lambda i: specs[i][3])
        prev_end = self.data_offset
        for i in order:
            n, _, _, off, nb = specs[i]
            if nb and self.data_offset + off < prev_end:
                raise UsageError(f"tensor {_decode_name(n)!r}: data at offset {off} overlaps the previous tensor")
            if nb:
                prev_end = self.data_offset + off + nb
        return order

    # -- properties ------------------------------------------------------------

    @property
    def tensors_in_file_order(self) -> list[TensorSpec]:
        """Tensor specs (with offsets) in the order :meth:`write_tensor_data` expects them."""
        return [TensorSpec(_decode_name(n), ty, ne, off) for n, ty, ne, off, _ in (self._specs[i] for i in self._order)]

    @property
    def bytes_written(self) -> int:
        return self._pos

    # -- writing ---------------------------------------------------------------

    def _write(self, b: Any) -> None:
        n = self._fh.write(b)
        size = len(b) if isinstance(b, bytes) else memoryview(b).nbytes
        if n is not None and n != size:
            raise OSError(f"short write: {n} of {size} bytes")
        self._pos += size

    def _pad_to(self, target: int) -> None:
        while self._pos < target:
            start = self._pos
            override = self._padding.get(start)
            if override is not None:
                if start + len(override) > target:
                    raise UsageError(f"padding override at {start} ({len(override)} bytes) runs past {target}")
                self._write(override)
                continue
            i = bisect.bisect_right(self._pad_at, start)
            nxt = min(self._pad_at[i], target) if i < len(self._pad_at) else target
            n = nxt - start
            while n:
                k = min(n, 1 << 20)
                self._write(bytes(k))
                n -= k

    def _start_tensor(self, name: str | None) -> tuple[bytes, int]:
        """Pad up to the next tensor's data; returns its (raw) name and size."""
        if self._closed:
            raise UsageError("writer is closed")
        if self._next >= len(self._order):
            raise UsageError("all tensors have been written")
        tname, _, _, off, nbytes = self._specs[self._order[self._next]]
        if name is not None and _encode_name(name) != tname:
            raise UsageError(f"expected data for tensor {_decode_name(tname)!r}, got {name!r}")
        self._pad_to(self.data_offset + off)
        return tname, nbytes

    def skip_tensor_data(self, *, name: str | None = None) -> int:
        """Leave the next tensor's bytes to positional writes (the caller must write every
        one of them before the file is used); returns their absolute offset."""
        _, nbytes = self._start_tensor(name)
        at = self._pos
        self._fh.flush()
        self._fh.seek(nbytes, os.SEEK_CUR)
        self._pos += nbytes
        self._next += 1
        return at

    def write_tensor_data(self, data: Any, *, name: str | None = None) -> None:
        """Write the next tensor's bytes: a bytes-like/numpy array or an iterable of them."""
        tname, nbytes = self._start_tensor(name)
        # chunks of an iterable are produced one ahead in a worker thread (see prefetch_chunks)
        chunks = [data] if isinstance(data, (bytes, bytearray, memoryview, np.ndarray)) else prefetch_chunks(data)
        written = 0
        for c in chunks:
            if isinstance(c, np.ndarray):
                mv = memoryview(np.ascontiguousarray(c)).cast("B")
            else:
                mv = memoryview(c).cast("B")
            if written + mv.nbytes > nbytes:
                raise UsageError(f"tensor {_decode_name(tname)!r}: more than {nbytes} bytes of data")
            self._write(mv)
            written += mv.nbytes
        if written != nbytes:
            raise UsageError(f"tensor {_decode_name(tname)!r}: got {written} bytes of data, expected {nbytes}")
        self._next += 1

    def close(self) -> None:
        """Check that every tensor was written, write the end padding, flush."""
        if self._closed:
            return
        if self._next != len(self._order):
            missing = _decode_name(self._specs[self._order[self._next]][0])
            self.abort()
            raise UsageError(f"closed before the data of tensor {missing!r} was written")
        try:
            self._pad_to(self._data_end + self._tail)
            self._fh.flush()
        finally:
            self._closed = True
            if self._own:
                self._fh.close()

    def abort(self) -> None:
        """Stop without finishing (the output is incomplete); closes an owned file."""
        if not self._closed:
            self._closed = True
            if self._own:
                self._fh.close()

    def __enter__(self) -> "GGUFWriterStream":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

