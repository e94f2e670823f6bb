"""Hurray element types: the table, buffer sizes, and LSB-first sub-byte packing.

The rows come from ``mappings/element_types.toml``.  Packing follows
element-types.md (checked against its worked examples in the tests):

* bool: element ``i`` is bit ``i % 8`` of byte ``i // 8``;
* 4-bit: element ``2k`` in the low nibble of byte ``k``, ``2k+1`` in the high nibble;
* 2-bit: element ``4k+j`` in bits ``2j+1:2j`` of byte ``k``;
* 6-bit: four elements ``e0..e3`` in three bytes, LSB-first across the 24-bit
  little-endian word ``e0 | e1<<6 | e2<<12 | e3<<18``.

Unused trailing bits are zero.  Everything here is vectorised numpy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

import numpy as np

from ..errors import FormatError, UnsupportedError
from ..tables import load_table

__all__ = [
    "ElementType",
    "element_type",
    "ELEMENT_TYPES",
    "ELEMENT_TYPES_BY_TAG",
    "buffer_size",
    "pack",
    "unpack",
    "unpack_at",
    "sign_extend",
    "e8m0_reserved",
    "is_private_tag",
    "code_values",
]


@dataclass(frozen=True)
class ElementType:
    """One row of the Hurray element-type table."""

    name: str
    tag: int
    tier: int
    bits: int
    kind: str  # float | int | uint | bool | complex | scale
    numpy: str  # numpy/ml_dtypes name of one unpacked element ("" if none)
    packed: bool = False
    #: OCP small float formats: (exponent bits, mantissa bits, bias, specials) -- see the table
    minifloat: tuple[int, int, int, str] | None = None

    @property
    def itemsize(self) -> int | None:
        """Bytes per element for byte-addressable types, ``None`` for sub-byte types."""
        return None if self.packed else self.bits // 8

    @property
    def signed(self) -> bool:
        return self.kind in ("int", "float", "complex")

    @property
    def dtype(self) -> np.dtype:
        """numpy dtype of one unpacked element (``UnsupportedError`` if numpy has none)."""
        if not self.numpy:
            raise UnsupportedError(f"element type {self.name} has no numpy representation")
        return _np_dtype(self.numpy)

    def __str__(self) -> str:
        return self.name


@functools.cache
def _np_dtype(name: str) -> np.dtype:
    try:  # numpy's own codes ("<f2", "u1"; ml_dtypes' names too once ml_dtypes is imported)
        return np.dtype(name)
    except TypeError:
        pass
    import ml_dtypes  # on first use of its types: most conversions never need it (start-up time)

    return np.dtype(getattr(ml_dtypes, name))


def _build() -> tuple[Mapping[str, ElementType], Mapping[int, ElementType]]:
    by_name: dict[str, ElementType] = {}
    by_tag: dict[int, ElementType] = {}
    for name, row in load_table("element_types").items():
        et = ElementType(
            name=name,
            tag=int(row["tag"]),
            tier=int(row["tier"]),
            bits=int(row["bits"]),
            kind=str(row["kind"]),
            numpy=str(row["numpy"]),
            packed=bool(row.get("packed", False)),
            minifloat=tuple(row["minifloat"]) if "minifloat" in row else None,  # type: ignore[arg-type]
        )
        if et.tag in by_tag:
            raise RuntimeError(f"mappings/element_types.toml: duplicate tag {et.tag:#04x}")
        by_name[name] = et
        by_tag[et.tag] = et
    return MappingProxyType(by_name), MappingProxyType(by_tag)


ELEMENT_TYPES, ELEMENT_TYPES_BY_TAG = _build()
_LITTLE = np.little_endian


def code_values(et: ElementType) -> np.ndarray:
    """float32 value of every code of an OCP small float type (index = code), from its
    ``minifloat`` row: ``(-1)^s · 2^(e − bias) · (1 + m / 2^M)``, subnormals
    ``(-1)^s · 2^(1 − bias) · m / 2^M``, the specials of the format; NaN codes give the quiet
    NaN of their sign (what ml_dtypes' casts give).  Computed rather than read from ml_dtypes:
    its extension takes 0.6 s to load, and the tests then hold ml_dtypes up as an independent
    decoder."""
    if et.minifloat is None:
        raise UnsupportedError(f"element type {et.name} is not an OCP small float")
    E, M, bias, specials = et.minifloat
    codes = np.arange(1 << et.bits, dtype=np.int64)
    sign = codes >> (E + M) & 1
    e = codes >> M & ((1 << E) - 1)
    m = codes & ((1 << M) - 1)
    mag = np.where(e == 0, np.ldexp(m.astype(np.float64), 1 - bias - M),
                   np.ldexp((m + (1 << M)).astype(np.float64), e - bias - M))
    top = e == (1 << E) - 1
    if specials == "ieee":
        mag = np.where(top & (m == 0), np.inf, mag)
        mag = np.where(top & (m != 0), np.nan, mag)
    elif specials == "nan_all_ones":
        mag = np.where(top & (m == (1 << M) - 1), np.nan, mag)
    elif specials != "finite":
        raise RuntimeError(f"mappings/element_types.toml: {et.name}: unknown minifloat specials {specials!r}")
    bits = mag.astype(np.float32).view(np.uint32)
    bits = np.where(np.isnan(mag), np.uint32(0x7FC00000), bits) | (sign.astype(np.uint32) << np.uint32(31))
    return bits.astype(np.uint32).view(np.float32)


def is_private_tag(tag: int) -> bool:
    return 0xF0 <= tag <= 0xFE


def element_type(key: "str | int | ElementType") -> ElementType:
    """Look an element type up by name, tag or (identity) instance.

    Raises ``FormatError`` for an unknown tag and ``KeyError``-like
    ``UnsupportedError`` for an unknown name.
    """
    if isinstance(key, ElementType):
        return key
    if isinstance(key, str):
        try:
            return ELEMENT_TYPES[key]
        except KeyError:
            raise UnsupportedError(f"unknown element type name {key!r}") from None
    try:
        return ELEMENT_TYPES_BY_TAG[int(key)]
    except KeyError:
        raise FormatError(f"unknown element type tag {int(key):#04x}", field="type_tag") from None


# ---------------------------------------------------------------------------
# sizes


def buffer_size(et: ElementType | str | int, count: int) -> int:
    """Bytes needed to store ``count`` contiguous elements (6-bit: ``ceil(N/4)*3``)."""
    et = element_type(et)
    if count < 0:
        raise ValueError("negative element count")
    if et.bits == 6:
        return -(-count // 4) * 3
    if et.packed:
        return -(-count * et.bits // 8)
    return count * (et.bits // 8)


# ---------------------------------------------------------------------------
# packing


def pack(codes: np.ndarray, et: ElementType | str | int) -> np.ndarray:
    """Pack unpacked element codes (any integer/bool array, flattened in C order)
    into the Hurray byte stream for ``et``.  Returns a 1-D uint8 array.

    For byte-addressable types the codes are returned as their little-endian bytes.
    For sub-byte types only the low ``bits`` of each code are used.
    """
    et = element_type(et)
    flat = np.ascontiguousarray(codes).reshape(-1)
    if not et.packed:
        return flat.astype(et.dtype, copy=False).view(np.uint8).reshape(-1)
    bits = et.bits
    if bits == 1:
        return np.packbits(flat.astype(bool, copy=False), bitorder="little")
    mask = (1 << bits) - 1
    if bits == 4 and flat.dtype.itemsize == 1 and flat.size % 2 == 0:  # pairs as uint16 lanes: 3x faster
        v = flat.view("<u2") & np.uint16(0x0F0F)
        v |= v >> np.uint16(4)
        return v.astype(np.uint8)
    c = flat.view(np.uint8) if flat.dtype.itemsize == 1 else flat.astype(np.int64, copy=False)
    c = (c & mask).astype(np.uint8, copy=False)
    n = c.size
    if bits == 6:
        groups = -(-n // 4)
        padded = np.zeros(groups * 4, dtype=np.uint8)
        padded[:n] = c
        q = padded.reshape(-1, 4)
        out = np.empty((groups, 3), dtype=np.uint8)
        out[:, 0] = q[:, 0] | (q[:, 1] << 6)
        out[:, 1] = (q[:, 1] >> 2) | (q[:, 2] << 4)
        out[:, 2] = (q[:, 2] >> 4) | (q[:, 3] << 2)
        return out.reshape(-1)
    per = 8 // bits
    nbytes = -(-n // per)
    if n % per:
        padded = np.zeros(nbytes * per, dtype=np.uint8)
        padded[:n] = c
        c = padded
    q = c.reshape(nbytes, per)
    out = q[:, 0].copy()
    for j in range(1, per):
        out |= q[:, j] << (bits * j)
    return out


def unpack(data: "np.ndarray | bytes | memoryview", et: ElementType | str | int, count: int) -> np.ndarray:
    """Unpack ``count`` element codes of type ``et`` from packed bytes.

    Sub-byte types come back as uint8 *raw codes* (not sign-extended; see
    :func:`sign_extend`), bool as numpy bool.  Byte-addressable types come
    back as a zero-copy view with the element's numpy dtype.
    """
    et = element_type(et)
    raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    need = buffer_size(et, count)
    if raw.size < need:
        raise FormatError(f"{et.name} data holds {raw.size} bytes, {count} elements need {need}")
    if not et.packed:
        return raw[:need].view(et.dtype)
    bits = et.bits
    if bits == 1:
        return np.unpackbits(raw[:need], bitorder="little", count=count).astype(bool)
    if bits == 6:
        groups = -(-count // 4)
        b = raw[: groups * 3].reshape(groups, 3)
        out = np.empty((groups, 4), dtype=np.uint8)
        out[:, 0] = b[:, 0] & 0x3F
        out[:, 1] = (b[:, 0] >> 6) | ((b[:, 1] & 0x0F) << 2)
        out[:, 2] = (b[:, 1] >> 4) | ((b[:, 2] & 0x03) << 4)
        out[:, 3] = b[:, 2] >> 2
        return out.reshape(-1)[:count]
    b = raw[:need]
    if bits == 4 and _LITTLE:
        # each byte widened to a uint16 whose two little-endian bytes are its two codes:
        # a few whole-array passes, about twice as fast as one masked pass per code
        w = b.astype(np.uint16)
        hi = np.left_shift(w, 4)
        np.bitwise_and(hi, 0x0F00, out=hi)
        np.bitwise_and(w, 0x000F, out=w)
        np.bitwise_or(w, hi, out=w)
        return w.view(np.uint8)[:count]
    per = 8 // bits
    mask = (1 << bits) - 1
    out = np.empty((need, per), dtype=np.uint8)
    for j in range(per):
        out[:, j] = (b >> (bits * j)) & mask
    return out.reshape(-1)[:count]


def unpack_at(data: np.ndarray, et: ElementType | str | int, offsets: np.ndarray, byte_offset: int = 0) -> np.ndarray:
    """Raw uint8 codes of the sub-byte elements at element ``offsets`` (int64, any shape,
    counted from byte ``byte_offset``; negative ones lie before it) of the packed uint8
    array ``data`` -- :func:`unpack` for arbitrary positions (strided views).  The caller
    keeps every addressed byte inside ``data``."""
    et = element_type(et)
    if et.bits == 6:
        g = offsets // 4
        j = (offsets - 4 * g).astype(np.uint32)
        at = byte_offset + 3 * g
        w = data[at].astype(np.uint32) | (data[at + 1].astype(np.uint32) << 8) | (data[at + 2].astype(np.uint32) << 16)
        return ((w >> (6 * j)) & 0x3F).astype(np.uint8)
    per = 8 // et.bits
    byte = offsets // per
    bit = ((offsets - per * byte) * et.bits).astype(np.uint8)
    return (data[byte_offset + byte] >> bit) & np.uint8((1 << et.bits) - 1)


def sign_extend(codes: np.ndarray, bits: int) -> np.ndarray:
    """Interpret raw ``bits``-wide two's complement codes as int8 values."""
    c = codes.view(np.uint8) if codes.dtype.itemsize == 1 else codes.astype(np.uint8)  # low 8 bits
    if bits == 8:
        return c.view(np.int8).copy()
    half = 1 << (bits - 1)
    out = np.bitwise_and(c, np.uint8((1 << bits) - 1))  # (c ^ half) - half
    np.bitwise_xor(out, np.uint8(half), out=out)
    out = out.view(np.int8)
    np.subtract(out, np.int8(half), out=out)
    return out


def e8m0_reserved(codes: np.ndarray) -> np.ndarray:
    """Mask of the float8_e8m0 codes a Hurray tensor must not hold: 0x00 and 0xFF
    (quantization/mxfp.md for scale bytes; the dequantizer applies it to float8_e8m0 data too)."""
    return (codes == 0x00) | (codes == 0xFF)
