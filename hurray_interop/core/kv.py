"""The KV metadata section of a ``.hrry`` file (file-format.md § KV Metadata Section).

Values are typed so that what was read is written back byte for byte:
``int64`` and ``uint64`` stay distinct, a float keeps its exact bits (NaN
payloads and ``-0.0`` included: :class:`KVValue` compares by encoded bytes),
and arrays remember their element type even when empty.

Wire format::

    u32 kv_count
    repeat: u16 key_length (>= 1) | key (UTF-8) | u8 value_tag | payload

=====  =========  ==========================================================
tag    type       payload
=====  =========  ==========================================================
0x01   string     u32 length + UTF-8 bytes
0x02   int64      8 bytes
0x03   uint64     8 bytes
0x04   float64    8 bytes (IEEE 754 binary64)
0x05   bool       1 byte, 0x00 or 0x01
0x06   bytes      u32 length + bytes
0x07   array      u8 element tag (0x01-0x06) + u32 count + payloads
=====  =========  ==========================================================

Decisions (strict reader, byte-exact writer):

* **Empty arrays are allowed** on read and write.  The spec gives arrays a
  ``u32`` count and forbids nothing about zero; only the reference *writer*
  refuses them (``KV array must not be empty``).  GGUF metadata legitimately
  holds empty arrays, so dropping them would lose information.  Plain Python
  ``[]`` has no element type, so an empty array must be given explicitly as
  ``KVValue.array("string", [])`` (or any other element type).
* Keys: non-empty, at most 65535 bytes, valid UTF-8, no NUL byte, unique.
* Private tags 0xF0-0xFE carry no length, so they cannot be skipped: they are
  rejected like reserved tags (0x08-0xEF) and 0x00 / 0xFF.
* Every length and count is checked against the bytes that remain *before*
  anything is allocated, so a lying count of 2**32 costs nothing.
* Big values are never copied whole (so a section of records does not cost its size in
  memory twice): a ``bytes`` value of at least :data:`VIEW_BYTES` decoded from a read-only
  buffer (a memory-mapped file) refers to that buffer (:meth:`KVValue.view`; ``value``
  copies it on each access), and a writer can stream a ``bytes`` value of known length
  from a file (:class:`StreamedBytes`, :func:`encode_kv_parts`).
* Plain Python values map as ``pyhurray.save`` maps them: ``bool`` -> bool,
  ``int`` -> int64, ``float`` -> float64, ``str`` -> string, ``bytes`` ->
  bytes, homogeneous ``list``/``tuple`` -> array.  An ``int`` outside int64
  is refused (say ``KVValue.uint64(v)`` explicitly).
"""

from __future__ import annotations

import os
import struct
from typing import Any, BinaryIO, Iterable, Iterator, Mapping

import numpy as np

from ..errors import InconsistentError, TruncatedError, UsageError
from ..files.binary import Reader

__all__ = [
    "KVValue",
    "KV_TAGS",
    "VIEW_BYTES",
    "StreamedBytes",
    "encode_kv",
    "encode_kv_parts",
    "decode_kv",
    "as_kv_value",
]

#: wire tag of each value type
KV_TAGS: dict[str, int] = {
    "string": 0x01,
    "int64": 0x02,
    "uint64": 0x03,
    "float64": 0x04,
    "bool": 0x05,
    "bytes": 0x06,
    "array": 0x07,
}
_TAG_NAMES = {v: k for k, v in KV_TAGS.items()}
_SCALAR_TYPES = ("string", "int64", "uint64", "float64", "bool", "bytes")
#: smallest payload of one element (used to bound counts before allocating)
_MIN_PAYLOAD = {"string": 4, "int64": 8, "uint64": 8, "float64": 8, "bool": 1, "bytes": 4}
_FIXED_FMT = {"int64": "q", "uint64": "Q", "float64": "d"}

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")

_MAX_U32 = 0xFFFFFFFF
#: ``bytes`` values at least this long, decoded from a read-only buffer, are views of it
VIEW_BYTES = 1 << 16
#: bytes read at a time from the file of a :class:`StreamedBytes`
STREAM_CHUNK = 1 << 20


def _check_scalar(kind: str, v: Any, where: str) -> Any:
    """Validate and normalise one scalar of type ``kind`` (raises UsageError)."""
    if kind == "string":
        if not isinstance(v, str):
            raise UsageError(f"expected str for a string value, got {type(v).__name__}", field=where)
        try:
            n = len(v.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise UsageError(f"string is not encodable as UTF-8 ({e.reason})", field=where) from None
        if n > _MAX_U32:
            raise UsageError(f"string of {n} bytes exceeds the u32 length field", field=where)
        return v
    if kind == "bytes":
        if not isinstance(v, (bytes, bytearray, memoryview)):
            raise UsageError(f"expected bytes for a bytes value, got {type(v).__name__}", field=where)
        v = bytes(v)
        if len(v) > _MAX_U32:
            raise UsageError(f"byte sequence of {len(v)} bytes exceeds the u32 length field", field=where)
        return v
    if kind == "bool":
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
        raise UsageError(f"expected bool for a bool value, got {type(v).__name__}", field=where)
    if kind in ("int64", "uint64"):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise UsageError(f"expected int for an {kind} value, got {type(v).__name__}", field=where)
        v = int(v)
        lo, hi = (-(1 << 63), (1 << 63) - 1) if kind == "int64" else (0, (1 << 64) - 1)
        if not lo <= v <= hi:
            raise UsageError(f"{v} is out of range for {kind}", field=where)
        return v
    if kind == "float64":
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise UsageError(f"expected float for a float64 value, got {type(v).__name__}", field=where)
        return float(v)
    raise UsageError(f"unknown KV value type {kind!r}", field=where)


def _payload(kind: str, v: Any) -> bytes:
    if kind == "string":
        b = v.encode("utf-8")
        return _U32.pack(len(b)) + b
    if kind == "bytes":
        return _U32.pack(len(v)) + v
    if kind == "int64":
        return _I64.pack(v)
    if kind == "uint64":
        return _U64.pack(v)
    if kind == "float64":
        return _F64.pack(v)
    if kind == "bool":
        return b"\x01" if v else b"\x00"
    raise AssertionError(kind)  # pragma: no cover - _check_scalar rejects it first


class KVValue:
    """One typed KV value.

    ``type`` is one of ``string``, ``int64``, ``uint64``, ``float64``,
    ``bool``, ``bytes``, ``array``.  For arrays ``element_type`` names the
    element type (one of the first six) and ``value`` is a tuple.

    Two values are equal when their wire encodings are equal, so
    ``KVValue.float64(nan) == KVValue.float64(nan)`` and ``0.0 != -0.0``.
    Instances are immutable and hashable.  A big ``bytes`` value decoded from a
    mapped file refers to the file (see the module docstring): :meth:`view` reads
    it without a copy.
    """

    __slots__ = ("type", "_value", "element_type", "_payload")

    type: str
    value: Any
    element_type: str | None

    def __init__(self, type: str, value: Any, element_type: str | None = None) -> None:  # noqa: A002
        if type == "array":
            if element_type not in _SCALAR_TYPES:
                raise UsageError(
                    f"array element type must be one of {', '.join(_SCALAR_TYPES)}, got {element_type!r}"
                    + (" (nested arrays are not allowed)" if element_type == "array" else "")
                )
            if isinstance(value, (str, bytes, bytearray, memoryview)) or not isinstance(value, Iterable):
                raise UsageError(f"array value must be a sequence, got {type_name(value)}")
            items, body = _check_array(element_type, value)
            if len(items) > _MAX_U32:
                raise UsageError(f"array of {len(items)} elements exceeds the u32 count field")
            payload = bytes([KV_TAGS[element_type]]) + _U32.pack(len(items)) + body
            value = items
        elif type in _SCALAR_TYPES:
            if element_type is not None:
                raise UsageError(f"element_type is only meaningful for arrays, not {type}")
            value = _check_scalar(type, value, "value")
            payload = _payload(type, value)
        else:
            raise UsageError(f"unknown KV value type {type!r}; expected one of {', '.join(KV_TAGS)}")
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "element_type", element_type)
        object.__setattr__(self, "_payload", payload)

    # -- constructors ------------------------------------------------------

    @classmethod
    def string(cls, v: str) -> "KVValue":
        return cls("string", v)

    @classmethod
    def int64(cls, v: int) -> "KVValue":
        return cls("int64", v)

    @classmethod
    def uint64(cls, v: int) -> "KVValue":
        return cls("uint64", v)

    @classmethod
    def float64(cls, v: float) -> "KVValue":
        return cls("float64", v)

    @classmethod
    def bool(cls, v: bool) -> "KVValue":  # noqa: A003
        return cls("bool", v)

    @classmethod
    def bytes(cls, v: bytes) -> "KVValue":  # noqa: A003
        return cls("bytes", v)

    @classmethod
    def array(cls, element_type: str, values: Iterable[Any]) -> "KVValue":
        return cls("array", values, element_type)

    # -- behaviour ---------------------------------------------------------

    @property
    def value(self) -> Any:
        """The value (``bytes`` for a bytes value, a tuple for an array)."""
        v = self._value
        return bytes(v) if isinstance(v, memoryview) else v

    def view(self) -> memoryview:
        """A ``bytes`` value as a read-only memoryview: no copy where the value refers to
        the buffer it was decoded from (a memory-mapped file)."""
        if self.type != "bytes":
            raise UsageError(f"only a bytes value has a byte view, this is {self.type}")
        v = self._value
        return v if isinstance(v, memoryview) else memoryview(v)

    @property
    def tag(self) -> int:
        return KV_TAGS[self.type]

    def encode(self) -> bytes:
        """``value_tag`` followed by the payload (what follows the key on the wire)."""
        return bytes([self.tag]) + self._payload

    def to_python(self) -> Any:
        """The plain Python value (what ``hurray.load_kv`` returns): arrays become lists."""
        return list(self.value) if self.type == "array" else self.value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("KVValue is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KVValue):
            return NotImplemented
        return self.type == other.type and self._payload == other._payload

    def __hash__(self) -> int:
        return hash((self.type, self._payload))

    def __repr__(self) -> str:
        if self.type == "array":
            shown = list(self.value[:8])
            more = f", … {len(self.value)} total" if len(self.value) > 8 else ""
            return f"KVValue.array({self.element_type!r}, {shown!r}{more})"
        return f"KVValue.{self.type}({self.value!r})"

    def __reduce__(self) -> Any:
        return (KVValue, (self.type, self.value, self.element_type))


def type_name(v: Any) -> str:
    return type(v).__name__


def _check_array(kind: str, value: Iterable[Any]) -> tuple[tuple[Any, ...], bytes]:
    """Validate array elements and encode them (one pass; fast paths for large arrays)."""
    items = tuple(value)
    types = set(map(type, items))
    try:
        if kind == "string" and types <= {str}:
            enc = [x.encode("utf-8") for x in items]
            if enc and max(map(len, enc)) > _MAX_U32:
                raise UsageError("a string exceeds the u32 length field")
            lens = struct.pack(f"<{len(enc)}I", *map(len, enc))
            parts: list[bytes] = [b""] * (2 * len(enc))
            parts[0::2] = [lens[i : i + 4] for i in range(0, len(lens), 4)]
            parts[1::2] = enc
            return items, b"".join(parts)
        if kind in ("int64", "uint64") and types <= {int}:
            lo, hi = (-(1 << 63), (1 << 63) - 1) if kind == "int64" else (0, (1 << 64) - 1)
            if items and not (lo <= min(items) and max(items) <= hi):
                bad = next(x for x in items if not lo <= x <= hi)
                raise UsageError(f"{bad} is out of range for {kind}")
            return items, _array_payload(kind, items)
        if kind == "float64" and types <= {float}:
            return items, _array_payload(kind, items)
    except UnicodeEncodeError:
        pass  # fall through to the element-by-element path for a precise message
    items = tuple(_check_scalar(kind, x, f"element {i}") for i, x in enumerate(items))
    return items, _array_payload(kind, items)


def _array_payload(kind: str, items: tuple[Any, ...]) -> bytes:
    if kind in _FIXED_FMT:
        return struct.pack(f"<{len(items)}{_FIXED_FMT[kind]}", *items)
    if kind == "bool":
        return bytes(1 if x else 0 for x in items)
    return b"".join(_payload(kind, x) for x in items)


_EXACT_KIND = {bool: "bool", int: "int64", float: "float64", str: "string", bytes: "bytes"}


def _python_kind(v: Any) -> str | None:
    if isinstance(v, (bool, np.bool_)):
        return "bool"
    if isinstance(v, (int, np.integer)):
        return "int64"
    if isinstance(v, (float, np.floating)):
        return "float64"
    if isinstance(v, str):
        return "string"
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "bytes"
    return None


def as_kv_value(v: Any, *, key: str | None = None) -> KVValue:
    """A :class:`KVValue` as is, or a plain Python value mapped like ``pyhurray.save``."""
    where = key
    if isinstance(v, KVValue):
        return v
    kind = _python_kind(v)
    try:
        if kind is not None:
            if kind == "int64" and not -(1 << 63) <= int(v) < (1 << 63):
                raise UsageError(
                    f"int {int(v)} does not fit int64 (the type plain ints map to); use KVValue.uint64(...)"
                )
            return KVValue(kind, v)
        if isinstance(v, (list, tuple)):
            if not v:
                raise UsageError(
                    "an empty list has no element type; use KVValue.array('<element type>', [])"
                )
            exact = set(map(type, v))
            if len(exact) == 1 and next(iter(exact)) in _EXACT_KIND:
                return KVValue("array", v, _EXACT_KIND[next(iter(exact))])
            kinds = {_python_kind(x) for x in v}
            if None in kinds:
                bad = next(x for x in v if _python_kind(x) is None)
                raise UsageError(
                    f"array elements must be bool, int, float, str or bytes (no nested arrays), "
                    f"got {type_name(bad)}"
                )
            if len(kinds) != 1:
                raise UsageError(f"array elements must all have one type, got {sorted(kinds)}")
            return KVValue("array", v, kinds.pop())
    except UsageError as e:
        if where is None:
            raise
        raise UsageError(e.message, field=f"KV key {where!r}") from None
    raise UsageError(
        f"unsupported KV value of type {type_name(v)} (use bool, int, float, str, bytes, a list, or KVValue)",
        field=None if where is None else f"KV key {where!r}",
    )


def _check_key(key: Any) -> bytes:
    if not isinstance(key, str):
        raise UsageError(f"KV keys must be str, got {type_name(key)}")
    try:
        kb = key.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UsageError(f"KV key {key!r} is not encodable as UTF-8 ({e.reason})") from None
    if not kb:
        raise UsageError("KV keys must not be empty")
    if b"\x00" in kb:
        raise UsageError(f"KV key {key!r} contains a NUL byte")
    if len(kb) > 0xFFFF:
        raise UsageError(f"KV key of {len(kb)} bytes exceeds the u16 key_length field")
    return kb


class StreamedBytes:
    """A ``bytes`` KV value of known ``length`` that is never held whole: the writer reads it
    from ``file`` (a binary file object: ``seek``/``read``) at ``offset`` while it writes
    the section (:func:`encode_kv_parts`).  The file must hold those bytes until then."""

    __slots__ = ("file", "offset", "length")

    def __init__(self, file: BinaryIO, offset: int, length: int) -> None:
        if length > _MAX_U32:
            raise UsageError(f"byte sequence of {length} bytes exceeds the u32 length field")
        self.file, self.offset, self.length = file, offset, length

    def chunks(self) -> Iterator[bytes]:
        """The value in pieces of at most :data:`STREAM_CHUNK` bytes."""
        self.file.seek(self.offset)
        left = self.length
        while left:
            b = self.file.read(min(left, STREAM_CHUNK))
            if not b:
                raise UsageError(f"streamed KV value: its file ended {left} bytes short of {self.length}")
            left -= len(b)
            yield b


def encode_kv_parts(items: Mapping[str, Any]) -> tuple[int, list["bytes | StreamedBytes"]]:
    """``(length, parts)``: the KV section as :func:`encode_kv` encodes it, in parts whose
    concatenation is the section; a :class:`StreamedBytes` value stays a part of its own
    (read when written).  Raises what :func:`encode_kv` raises."""
    if len(items) > _MAX_U32:
        raise UsageError(f"{len(items)} KV entries exceed the u32 kv_count field")
    parts: list[bytes | StreamedBytes] = [_U32.pack(len(items))]
    seen: set[bytes] = set()
    total = 4
    for key, v in items.items():
        kb = _check_key(key)
        if kb in seen:  # only reachable with exotic mappings; a dict cannot hold duplicates
            raise UsageError(f"duplicate KV key {key!r}")
        seen.add(kb)
        if isinstance(v, StreamedBytes):
            head = _U16.pack(len(kb)) + kb + bytes([KV_TAGS["bytes"]]) + _U32.pack(v.length)
            parts += [head, v]
            total += len(head) + v.length
            continue
        enc = as_kv_value(v, key=key).encode()
        parts += [_U16.pack(len(kb)), kb, enc]
        total += 2 + len(kb) + len(enc)
    if total > _MAX_U32:
        raise UsageError(f"KV section of {total} bytes exceeds the trailer's u32 kv_length")
    return total, parts


def encode_kv(items: Mapping[str, Any]) -> bytes:
    """Encode a KV section (no trailing padding), keys in the mapping's order.

    Values are :class:`KVValue`, :class:`StreamedBytes` or plain Python values (see
    :func:`as_kv_value`).  Raises :class:`UsageError` for anything the format cannot
    hold, including a section larger than the trailer's u32 ``kv_length``.
    """
    _, parts = encode_kv_parts(items)
    return b"".join(b"".join(p.chunks()) if isinstance(p, StreamedBytes) else p for p in parts)


def _read_len_bytes(r: Reader, what: str) -> memoryview:
    n = r.u32(f"{what} length")
    return r.view(n, what)


def _utf8(r: Reader, raw: memoryview, what: str, at: int) -> str:
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError as e:
        raise r.error(f"invalid UTF-8 ({e.reason} at byte {e.start})", what, at=at + e.start) from None


def _read_scalar(r: Reader, kind: str, what: str) -> Any:
    if kind == "string":
        at = r.pos + 4
        return _utf8(r, _read_len_bytes(r, what), what, at)
    if kind == "bytes":
        return bytes(_read_len_bytes(r, what))
    if kind == "int64":
        return r.i64(what)
    if kind == "uint64":
        return r.u64(what)
    if kind == "float64":
        return r.f64(what)
    if kind == "bool":
        at = r.pos
        b = r.u8(what)
        if b > 1:
            raise r.error(f"bool byte must be 0x00 or 0x01, got 0x{b:02X}", what, at=at)
        return b == 1
    raise AssertionError(kind)  # pragma: no cover


def _read_strings(r: Reader, n: int, what: str) -> tuple[str, ...]:
    """``n`` length-prefixed UTF-8 strings (a tight loop: tokenizer vocabularies hold 10^5 of them)."""
    buf, pos, end = r.buf, r.pos, r.end
    unpack = _U32.unpack_from
    out: list[str] = []
    append = out.append
    for j in range(n):
        if pos + 4 > end:
            r.pos = pos
            r.need(4, f"{what} element {j} length")
        (ln,) = unpack(buf, pos)
        pos += 4
        if pos + ln > end:
            r.pos = pos
            r.need(ln, f"{what} element {j}")
        try:
            append(str(buf[pos : pos + ln], "utf-8"))
        except UnicodeDecodeError as e:
            raise r.error(f"invalid UTF-8 ({e.reason} at byte {e.start})", f"{what} element {j}", at=pos + e.start) from None
        pos += ln
    r.pos = pos
    return tuple(out)


def _tag_kind(r: Reader, tag: int, what: str, at: int, *, element: bool) -> str:
    kind = _TAG_NAMES.get(tag)
    if kind is None or (element and kind == "array"):
        if element and kind == "array":
            msg = "array element tag 0x07: nested arrays are not allowed"
        elif 0xF0 <= tag <= 0xFE:
            msg = f"private value tag 0x{tag:02X} cannot be read (its payload length is not defined)"
        elif tag in (0x00, 0xFF):
            msg = f"invalid value tag 0x{tag:02X}"
        else:
            msg = f"reserved value tag 0x{tag:02X}"
        raise r.error(msg, what, at=at)
    return kind


def _make(kind: str, value: Any, element_type: str | None, payload: bytes) -> KVValue:
    """Build a KVValue from decoded data and its exact wire payload (no re-encoding).

    The encoding is canonical (one byte string per value), so the payload read
    is the payload :class:`KVValue` would produce.
    """
    v = KVValue.__new__(KVValue)
    object.__setattr__(v, "type", kind)
    object.__setattr__(v, "_value", value)
    object.__setattr__(v, "element_type", element_type)
    object.__setattr__(v, "_payload", payload)
    return v


def decode_kv(
    buf: "bytes | bytearray | memoryview | np.ndarray",
    *,
    path: str | os.PathLike[str] | None = None,
    base: int = 0,
) -> dict[str, KVValue]:
    """Decode a KV section occupying all of ``buf``; keys in file order.

    ``base`` is the section's absolute offset, added to every offset in errors.
    Trailing bytes after the last entry are rejected (the section length is exact).
    """
    p = os.fspath(path) if path is not None else None
    r = Reader(buf, base=base, path=p)
    at = r.pos
    count = r.u32("kv_count")
    # every entry needs at least key_length(2) + 1 key byte + tag(1) + 1 payload byte
    if count * 5 > r.remaining:
        raise TruncatedError(
            f"kv_count {count} cannot fit in the {r.remaining} bytes that follow",
            path=p,
            field="kv_count",
            offset=base + at,
        )
    out: dict[str, KVValue] = {}
    for i in range(count):
        at = r.pos
        klen = r.u16(f"KV entry {i} key_length")
        if klen == 0:
            raise r.error("key_length must be at least 1", f"KV entry {i} key_length", at=at)
        kat = r.pos
        kraw = r.view(klen, f"KV entry {i} key")
        key = _utf8(r, kraw, f"KV entry {i} key", kat)
        if "\x00" in key:
            raise r.error(f"key {key!r} contains a NUL byte", f"KV entry {i} key", at=kat)
        if key in out:
            raise InconsistentError(f"duplicate KV key {key!r}", path=p, field=f"KV entry {i} key", offset=base + kat)
        what = f"KV {key!r}"
        tat = r.pos
        kind = _tag_kind(r, r.u8(f"{what} value_tag"), f"{what} value_tag", tat, element=False)
        pstart = r.pos
        if kind == "bytes" and r.buf.readonly and r.remaining >= 4 + VIEW_BYTES:
            raw = _read_len_bytes(r, what)
            if len(raw) >= VIEW_BYTES:  # not copied (the module docstring)
                out[key] = _make(kind, raw, None, r.buf[pstart : r.pos])
                continue
            r.pos = pstart
        if kind != "array":
            value = _read_scalar(r, kind, what)
            out[key] = _make(kind, value, None, bytes(r.buf[pstart : r.pos]))
            continue
        eat = r.pos
        ekind = _tag_kind(r, r.u8(f"{what} element tag"), f"{what} element tag", eat, element=True)
        cat = r.pos
        n = r.u32(f"{what} element count")
        if n * _MIN_PAYLOAD[ekind] > r.remaining:
            raise TruncatedError(
                f"array of {n} {ekind} elements cannot fit in the {r.remaining} bytes that follow",
                path=p,
                field=f"{what} element count",
                offset=base + cat,
            )
        if ekind in _FIXED_FMT:
            st = struct.Struct(f"<{n}{_FIXED_FMT[ekind]}")
            values: tuple[Any, ...] = r.unpack(st, f"{what} elements")
        elif ekind == "bool":
            vat = r.pos
            raw = r.bytes(n, f"{what} elements")
            bad = next((j for j, b in enumerate(raw) if b > 1), None)
            if bad is not None:
                raise r.error(
                    f"bool byte must be 0x00 or 0x01, got 0x{raw[bad]:02X}", f"{what} element {bad}", at=vat + bad
                )
            values = tuple(b == 1 for b in raw)
        elif ekind == "string":
            values = _read_strings(r, n, what)
        else:
            values = tuple(_read_scalar(r, ekind, f"{what} element {j}") for j in range(n))
        out[key] = _make("array", values, ekind, bytes(r.buf[pstart : r.pos]))
    if r.remaining:
        raise InconsistentError(
            f"{r.remaining} unused bytes after the last KV entry",
            path=p,
            field="KV section",
            offset=base + r.pos,
        )
    return out
