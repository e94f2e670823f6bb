"""Hurray tensor-descriptor codec with strict validation.

Wire format: metadata.md, buffer-protocol.md, quantization/*.md and the
project's seeds, as digested (with errata) in ``docs/format-notes.md``
§§ 2.1–2.6, 2.11.  Everything here is byte-compatible with the upstream reference
(``pyhurray``) and strictly *stricter* than it on read: every rule the spec
says a reader MUST reject is enforced (docs/format-notes.md § 2.2), including
the quantization semantics the reference leaves unchecked.

Public API
----------

``encode_descriptor(desc) -> bytes``
    Validate, then emit the wire bytes (sections in WIRE order: quantization,
    shard, statistics, extension type, composite member).
``decode_descriptor(buf, offset=0, *, path=None, tensor=None, base=0) -> Descriptor``
    Parse and validate one descriptor; never reads past ``descriptor_length``
    nor past ``buf``.  Error offsets are absolute: ``base + offset in buf``.
``validate_descriptor(desc, *, path=None, tensor=None, base=0)``
    The semantic checks on an in-memory descriptor.  Offsets in its errors
    are the wire offsets the offending field has (or would have) in the
    encoded descriptor, plus ``base``.
``validate_parameter_values(desc, data, *, path=None, tensor=None, data_offsets=None)``
    Checks that need quantization-parameter buffer *contents*.
``encode_quantization(q) -> bytes`` / ``decode_quantization(buf, offset=0, *, length=None, rank=None, ...)``
    The scheme bytes alone (no ``u32 quantization_length`` prefix).
``dense_byte_size(desc)``, ``padded_byte_size(desc)``, ``addressed_byte_range(desc)``,
``blocks_per_axis(desc)``, ``num_blocks(desc)``
    Size arithmetic shared with the dequantizer and the converters.
``validate_addressed_range(desc, *, path=None, tensor=None)``
    Every element of a strided tensor lies inside buffer 0 (not part of ``validate_descriptor``).
``check_buffer_sizes(desc, data, *, path=None, tensor=None)``
    The buffer contents of an in-memory tensor agree with its buffer table.

The descriptor's frame (header, shape, buffer table, the optional sections) is here; each
layout's payload and rules are one class in :mod:`hurray_interop.core.layouts`, each
quantization scheme's one class in :mod:`hurray_interop.core.schemes` (registered under
their tags); this module looks the class up and asks it.

Decisions (see docs/conversion-rules.md § 6 and docs/format-notes.md § 2.11):

* ``version_major`` 0 and > 1 are rejected (UnsupportedError); minor 0 requires
  the parsed length to equal ``descriptor_length``, minor > 0 ignores trailing bytes.
* A descriptor that claims more bytes than the buffer holds is truncated.
* Per-block / per-channel: SYMMETRIC iff ``zero_point_buffer_index == 0xFFFFFFFF``
  (errata A6: both mismatches rejected).
* Parameter buffers may not be any of the layout's own buffers (the values
  buffer of a dense tensor, the values/index buffers of sparse layouts,
  buffers 0-2 of block-paged).
* Dense data-buffer size (row-/column-major, ``byte_offset == 0``): exactly the
  contiguous size; for per-block/NF4 partial trailing blocks the seed's padded
  size ``(N/S)·ceil(S/K)·K`` elements is accepted too.  With ``byte_offset > 0``
  the buffer must hold ``byte_offset`` plus the contiguous size.
* Parameter-buffer sizes are checked for dense layouts and block-paged; for
  sparse and private layouts the specification does not define them.
* Private element types (0xF0-0xFE) are represented by an ``ElementType`` row
  built from the extension-type section (kind ``"private"``).

Hand-written rather than a library: no maintained Python package implements
Hurray descriptors; ``pyhurray`` (the reference binding) is used as the
byte oracle in the tests, and it is laxer than the spec (see the tests).
"""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

from ..errors import (
    BadMagicError,
    FormatError,
    HurrayInteropError,
    InconsistentError,
    TruncatedError,
    UnsupportedError,
    UsageError,
)
from ..files.binary import Reader
from .elements import ELEMENT_TYPES_BY_TAG, ElementType, buffer_size, is_private_tag
from .layouts import MAX_TILED_DEPTH, layout_rule, rule_of as layout_of  # noqa: F401 (MAX_TILED_DEPTH: re-exported)
from .model import (
    DYNAMIC,
    as_u8,
    LAYOUT_NAMES,
    BufferHandle,
    CompositeMember,
    Descriptor,
    ExtensionType,
    Quantization,
    Shard,
    Statistics,
)
from .schemes import rule_of as scheme_of, scheme_models, scheme_rule
from .wire import NONE_U32, Ctx as _Ctx, check_int as _int, pow2 as _pow2, vec as _vec

__all__ = [
    "MAGIC",
    "encode_descriptor",
    "decode_descriptor",
    "validate_descriptor",
    "validate_parameter_values",
    "encode_quantization",
    "decode_quantization",
    "dense_byte_size",
    "padded_byte_size",
    "addressed_byte_range",
    "validate_addressed_range",
    "check_buffer_sizes",
    "blocks_per_axis",
    "num_blocks",
    "private_element_type",
]

MAGIC = b"HRRY"
MAX_RANK = 64

F_QUANT = 0x01
F_SHARD = 0x02
F_EXT = 0x04
F_STATS = 0x08
F_MEMBER = 0x10
F_RESERVED = ~0x1F & 0xFFFFFFFF

_HEADER = struct.Struct("<4sBBIIBBI")  # 20 bytes
_VERSION_LENGTH = struct.Struct("<BBI")
_FLAGS_TAGS_RANK = struct.Struct("<IBBI")
_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HANDLE = struct.Struct("<QIBBBB")  # 16 bytes
_STATS = struct.Struct("<IIQddddddBBBB4s")  # 72 bytes
_EXT = struct.Struct("<IBBBBBB2sIBB2s")  # 20 bytes
_MEMBER = struct.Struct("<B15s")  # 16 bytes
#: the head every scheme descriptor starts with: scheme_tag, scheme_version, flags
_Q_HEAD = struct.Struct("<BBH")


# ---------------------------------------------------------------------------
# tables (buffer-protocol.md)

_DEVICES = frozenset(range(0x00, 0x09))
_MEMORY_CLASSES = frozenset(range(0x00, 0x04))
#: allowed memory classes per standard device (buffer-protocol.md)
_DEVICE_CLASSES = {
    0x00: {0, 1, 2},  # CPU
    0x01: {0, 1, 2, 3},  # CUDA
    0x02: {0, 1, 2, 3},  # ROCm
    0x03: {0, 1, 2},  # Metal
    0x04: {0, 1, 2, 3},  # Vulkan
    0x05: {0},  # WebGPU
    0x06: {0, 1, 2},  # Hexagon
    0x07: {0, 1, 2, 3},  # Level Zero
    0x08: {0, 1, 2},  # OpenCL
}
_DEVICE_NAMES = {0: "CPU", 1: "CUDA", 2: "ROCm", 3: "Metal", 4: "Vulkan", 5: "WebGPU", 6: "Hexagon", 7: "Level Zero", 8: "OpenCL"}
_CLASS_NAMES = {0: "STANDARD", 1: "HOST_PINNED", 2: "UNIFIED", 3: "PEER"}

def private_element_type(tag: int, ext: ExtensionType | None) -> ElementType:
    """The ``ElementType`` row standing for private tag ``tag`` (0xF0-0xFE)."""
    bits = ext.bit_width if ext is not None else 0
    return ElementType(
        name=f"private_{tag:#04x}", tag=tag, tier=0, bits=bits, kind="private", numpy="", packed=0 < bits < 8
    )


# ---------------------------------------------------------------------------
# error plumbing (wire.Ctx)


def _locate(desc: Descriptor, ctx: _Ctx, layout_len: int | None = None) -> _Ctx:
    """Fill the (relative) wire offsets of every section of ``desc``."""
    r = len(desc.shape)
    ctx.shape = 20
    ctx.byte_offset = 20 + 8 * r
    ctx.layout = ctx.byte_offset + 8
    if layout_len is None:
        try:
            layout_len = len(_encode_layout(desc.layout, r))
        except (struct.error, OverflowError, TypeError, ValueError, AttributeError):
            layout_len = 0
    ctx.buffers = ctx.layout + layout_len
    pos = ctx.buffers + 1 + 16 * len(desc.buffers)
    ctx.quant = pos
    if desc.quantization is not None:
        rule = scheme_of(desc.quantization)
        pos += 4 + (rule.struct.size if rule is not None else 0) + len(desc.quantization_padding)
    ctx.shard = pos
    if desc.shard is not None:
        pos += 16 * r
    ctx.stats = pos
    if desc.statistics is not None:
        pos += 72
    ctx.ext = pos
    if desc.extension_type is not None:
        pos += 20
    ctx.member = pos
    return ctx


# ---------------------------------------------------------------------------
# encoding


def _encode_layout(layout: object, rank: int) -> bytes:
    rule = layout_of(layout)
    if rule is None:
        raise TypeError(f"not a layout: {layout!r}")
    return rule.encode(layout, rank)


def _encode_scheme(q: Quantization) -> bytes:
    rule = scheme_of(q)
    if rule is None:
        raise TypeError(f"not a quantization scheme: {q!r}")
    return rule.encode(q)


def encode_quantization(q: Quantization) -> bytes:
    """The scheme bytes of ``q`` (its fixed-length descriptor, no length prefix).

    Context-free checks (block_size ranges, scale types, per-tensor scale) run first.
    """
    ctx = _Ctx(None, None, 0)
    _check_scheme(q, ctx, 0)
    return _safe(lambda: _encode_scheme(q), ctx, "quantization")


def _safe(fn, ctx: _Ctx, field: str):  # type: ignore[no-untyped-def]
    try:
        return fn()
    except (struct.error, OverflowError, TypeError, AttributeError) as exc:
        raise ctx.err(FormatError, f"value does not fit its wire field ({exc})", field, None) from None


def encode_descriptor(desc: Descriptor) -> bytes:
    """Validate ``desc`` and return its wire bytes (``descriptor_length`` computed)."""
    validate_descriptor(desc)
    ctx = _Ctx(None, None, 0)
    return _safe(lambda: _encode(desc), ctx, "descriptor")


def _encode(desc: Descriptor) -> bytes:
    r = len(desc.shape)
    flags = 0
    tail: list[bytes] = []
    if desc.quantization is not None:
        flags |= F_QUANT
        scheme = _encode_scheme(desc.quantization) + bytes(desc.quantization_padding)
        tail.append(_U32.pack(len(scheme)))
        tail.append(scheme)
    if desc.shard is not None:
        flags |= F_SHARD
        tail.append(_vec("Q", r).pack(*desc.shard.parent_shape))
        tail.append(_vec("Q", r).pack(*desc.shard.offset))
    if desc.statistics is not None:
        flags |= F_STATS
        s = desc.statistics
        tail.append(
            _STATS.pack(
                s.computed_mask, 0, s.nnz, s.sparsity_ratio, s.value_min, s.value_max, s.value_abs_max,
                s.value_mean, s.value_stddev, s.nm_n, s.nm_m, s.has_nan, s.has_inf, bytes(4),
            )
        )
    if desc.extension_type is not None:
        flags |= F_EXT
        e = desc.extension_type
        tail.append(
            _EXT.pack(
                e.bit_width, e.packing_factor, e.is_float, e.is_signed, e.sign_bits, e.exponent_bits,
                e.mantissa_bits, bytes(2), e.exponent_bias, e.has_nan, e.has_inf, bytes(2),
            )
        )
    if desc.composite_member is not None:
        flags |= F_MEMBER
        tail.append(_MEMBER.pack(desc.composite_member.role, bytes(15)))
    shape = tuple(DYNAMIC if d is None else d for d in desc.shape)
    body = [
        _vec("Q", r).pack(*shape),
        _U64.pack(desc.byte_offset),
        _encode_layout(desc.layout, r),
        _U8.pack(len(desc.buffers)),
    ]
    for h in desc.buffers:
        body.append(_HANDLE.pack(h.byte_size, h.alignment, h.device, h.sync_mode, h.memory_class, 0))
    length = 20 + sum(map(len, body)) + sum(map(len, tail))
    head = _HEADER.pack(
        MAGIC, desc.version_major, desc.version_minor, length, flags, desc.element_type.tag, desc.layout.tag, r
    )
    return b"".join([head, *body, *tail])


# ---------------------------------------------------------------------------
# decoding


def decode_descriptor(
    buf: "bytes | bytearray | memoryview | np.ndarray",
    offset: int = 0,
    *,
    path: str | None = None,
    tensor: str | None = None,
    base: int = 0,
) -> Descriptor:
    """Decode and validate the descriptor starting at ``buf[offset]``.

    Bytes after ``descriptor_length`` are ignored.  Errors carry absolute
    offsets (``base`` + position in ``buf``).
    """
    if offset < 0:
        raise UsageError(f"negative descriptor offset {offset}", path=path, tensor=tensor, field="offset")
    try:
        return _decode(buf, offset, path, tensor, base)
    except HurrayInteropError as exc:
        raise exc.located(path=path, tensor=tensor) from None


def _decode(buf, offset: int, path, tensor, base: int) -> Descriptor:  # type: ignore[no-untyped-def]
    rd = Reader(buf, offset, base=base, path=path)
    start = offset
    ctx = _Ctx(path, tensor, base + start)  # offsets relative to the descriptor start
    magic = rd.bytes(4, "magic")
    if magic != MAGIC:
        raise ctx.err(BadMagicError, f"bad magic {magic!r} (expected {MAGIC!r})", "magic", 0)
    major, minor, length = rd.unpack(_VERSION_LENGTH, "version / descriptor_length")
    if major != 1:
        raise ctx.err(UnsupportedError, f"descriptor version {major}.{minor} is not supported (major must be 1)", "version_major", 4)
    if length < 20:
        raise ctx.err(FormatError, f"descriptor_length {length} is less than the 20-byte header", "descriptor_length", 6)
    avail = rd.end - start
    if length > avail:
        raise ctx.err(TruncatedError, f"descriptor_length {length} exceeds the {avail} bytes available", "descriptor_length", 6)
    rd.end = start + length
    flags, type_tag, layout_tag, rank = rd.unpack(_FLAGS_TAGS_RANK, "header")
    if flags & F_RESERVED:
        raise ctx.err(FormatError, f"reserved flag bits set (flags {flags:#010x})", "flags", 10)
    if rank > MAX_RANK:
        raise ctx.err(FormatError, f"rank {rank} exceeds the maximum {MAX_RANK}", "rank", 16)
    # element type (private types resolved once the extension section is read)
    et: ElementType | None = None
    if is_private_tag(type_tag):
        if not flags & F_EXT:
            raise ctx.err(InconsistentError, f"private type_tag {type_tag:#04x} without the extension-type section", "flags", 10)
    else:
        et = ELEMENT_TYPES_BY_TAG.get(type_tag)
        if et is None:
            raise ctx.err(FormatError, f"unknown or reserved type_tag {type_tag:#04x}", "type_tag", 14)
        if flags & F_EXT:
            raise ctx.err(InconsistentError, f"HAS_EXTENSION_TYPE set for standard type {et.name}", "flags", 10)
    shape_raw = rd.unpack(_vec("Q", rank), "shape") if rank else ()
    shape = tuple(None if d == DYNAMIC else d for d in shape_raw)
    byte_offset = rd.u64("byte_offset")
    layout_at = rd.pos
    layout = _decode_layout(rd, layout_tag, rank, ctx, start)
    layout_len = rd.pos - layout_at
    buffers = _decode_buffer_table(rd, ctx, start)
    quant, qpad, shard, stats, ext, member = _decode_sections(rd, flags, rank, ctx, start, path, tensor, base)
    if minor == 0 and rd.pos != rd.end:
        raise ctx.err(
            InconsistentError,
            f"descriptor_length {length} but the fields end after {rd.pos - start} bytes (version 1.0 requires an exact length)",
            "descriptor_length", 6,
        )
    if et is None:
        et = private_element_type(type_tag, ext)
    desc = Descriptor(
        element_type=et, shape=shape, buffers=tuple(buffers), layout=layout, byte_offset=byte_offset,
        quantization=quant, quantization_padding=qpad, shard=shard, statistics=stats, extension_type=ext,
        composite_member=member, version_major=major, version_minor=minor,
    )
    _validate(desc, _locate(desc, ctx, layout_len), structural=False)
    return desc


def _decode_buffer_table(rd: Reader, ctx: "_Ctx", start: int) -> list[BufferHandle]:
    """``buffer_count`` and the 16-byte buffer handles (reserved byte zero)."""
    count_at = rd.pos
    nbuf = rd.u8("buffer_count")
    raw = rd.unpack(_vec("QIBBBB", nbuf), "buffer table") if nbuf else ()
    buffers = []
    for i in range(nbuf):
        size, align, dev, sync, mclass, res = raw[6 * i : 6 * i + 6]
        if res:
            raise ctx.err(FormatError, f"reserved byte is {res:#04x}, must be 0", f"buffer[{i}]._reserved", count_at + 1 + 16 * i + 15 - start)
        buffers.append(BufferHandle(size, align, dev, sync, mclass))
    return buffers


def _decode_sections(rd: Reader, flags: int, rank: int, ctx: "_Ctx", start: int, path, tensor, base: int):  # type: ignore[no-untyped-def]
    """The optional sections the flags announce, in wire order: quantization (and its
    padding), shard, statistics, extension type, composite member (None when absent)."""
    quant = None
    qpad = b""
    if flags & F_QUANT:
        qlen_at = rd.pos
        qlen = rd.u32("quantization_length")
        if qlen > rd.end - rd.pos:
            raise ctx.err(TruncatedError, f"quantization_length {qlen} exceeds the {rd.end - rd.pos} bytes left in the descriptor", "quantization_length", qlen_at - start)
        qctx = _Ctx(path, tensor, base + qlen_at + 4)
        quant, used = _decode_scheme(rd.buf, rd.pos, qlen, qctx)
        qpad = bytes(rd.buf[rd.pos + used : rd.pos + qlen])
        rd.pos += qlen
    shard = None
    if flags & F_SHARD:
        st = _vec("Q", rank)
        parent = rd.unpack(st, "shard.parent_shape") if rank else ()
        off = rd.unpack(st, "shard.offset") if rank else ()
        shard = Shard(tuple(parent), tuple(off))
    stats = None
    if flags & F_STATS:
        at = rd.pos
        v = rd.unpack(_STATS, "statistics")
        if v[1] or v[13] != bytes(4):
            raise ctx.err(FormatError, "reserved statistics bytes must be zero", "statistics._reserved", (at + (4 if v[1] else 68)) - start)
        stats = Statistics(v[0], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12])
    ext = None
    if flags & F_EXT:
        at = rd.pos
        v = rd.unpack(_EXT, "extension_type")
        if v[7] != bytes(2) or v[11] != bytes(2):
            raise ctx.err(FormatError, "reserved extension-type bytes must be zero", "extension_type._reserved", (at + (10 if v[7] != bytes(2) else 18)) - start)
        ext = ExtensionType(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[8], v[9], v[10])
    member = None
    if flags & F_MEMBER:
        at = rd.pos
        role, res = rd.unpack(_MEMBER, "composite_member")
        if res != bytes(15):
            raise ctx.err(FormatError, "reserved composite-member bytes must be zero", "composite_member._reserved", at + 1 - start)
        member = CompositeMember(role)
    return quant, qpad, shard, stats, ext, member


def _decode_layout(rd: Reader, tag: int, rank: int, ctx: _Ctx, start: int) -> object:
    rule = layout_rule(tag)
    if rule is None:
        raise ctx.err(FormatError, f"unknown or reserved layout_tag {tag:#04x}", "layout_tag", 15)
    return rule.decode(rd, tag, rank, ctx, start)


def decode_quantization(
    buf: "bytes | bytearray | memoryview | np.ndarray",
    offset: int = 0,
    *,
    length: int | None = None,
    rank: int | None = None,
    base: int = 0,
    path: str | None = None,
    tensor: str | None = None,
) -> Quantization:
    """Decode the scheme bytes at ``buf[offset:offset+length]`` (no length prefix).

    ``length`` defaults to the rest of ``buf``; bytes after the scheme's fixed
    length are writer padding and ignored.  Checks everything decidable without
    the descriptor (tags, version, flags, reserved bytes, SYMMETRIC consistency,
    block_size ranges, scale types, per-tensor scale), plus ``axis < rank`` when
    ``rank`` is given.
    """
    if offset < 0 or (length is not None and length < 0):
        raise UsageError(f"negative offset {offset} or length {length}", path=path, tensor=tensor, field="offset")
    rd = Reader(buf, offset)
    n = rd.end - offset if length is None else length
    ctx = _Ctx(path, tensor, base + offset)
    try:
        if n > rd.end - offset:
            raise ctx.err(TruncatedError, f"quantization length {n} exceeds the {rd.end - offset} bytes available", "quantization_length", 0)
        q, _ = _decode_scheme(rd.buf, offset, n, ctx)
        if rank is not None and scheme_of(q).unit != "tensor" and q.axis >= rank:
            raise ctx.err(FormatError, f"axis {q.axis} is not less than rank {rank}", "quantization.axis", 4)
    except HurrayInteropError as exc:
        raise exc.located(path=path, tensor=tensor) from None
    return q


def _decode_scheme(buf: memoryview, pos: int, n: int, ctx: _Ctx) -> tuple[Quantization, int]:
    """Parse the scheme at ``buf[pos:pos+n]``; ``ctx.base`` is the absolute scheme start."""
    if n < 4:
        raise ctx.err(TruncatedError, f"quantization_length {n} is shorter than the 4-byte scheme header", "quantization_length", -4)
    tag, version, flags = _Q_HEAD.unpack_from(buf, pos)
    rule = scheme_rule(tag)
    if rule is None:
        kind = "invalid" if tag in (0x00, 0xFF) else "private" if is_private_tag(tag) else "unknown or reserved"
        raise ctx.err(FormatError, f"{kind} quantization scheme_tag {tag:#04x}", "quantization.scheme_tag", 0)
    name = rule.name
    if version == 0:
        raise ctx.err(FormatError, f"{name} scheme_version 0 is invalid (must be 1)", "quantization.scheme_version", 1)
    if version > 1:
        raise ctx.err(UnsupportedError, f"{name} scheme_version {version} is not supported (must be 1)", "quantization.scheme_version", 1)
    need = rule.struct.size
    if n < need:
        raise ctx.err(TruncatedError, f"quantization_length {n} is shorter than the {need}-byte {name} descriptor", "quantization_length", -4)
    if flags & ~rule.flag_bits:
        raise ctx.err(FormatError, f"reserved {name} flag bits set (flags {flags:#06x})", "quantization.flags", 2)
    q = rule.decode(buf, pos, flags, ctx)
    _check_scheme(q, ctx, 0)
    return q, need


# ---------------------------------------------------------------------------
# validation


def validate_descriptor(desc: Descriptor, *, path: str | None = None, tensor: str | None = None, base: int = 0) -> None:
    """Raise a FormatError subclass (or UnsupportedError) unless ``desc`` is valid.

    Offsets in errors are where the field sits in the encoded descriptor, plus ``base``.
    """
    ctx = _Ctx(path, tensor, base)
    _check_types(desc, ctx)
    _validate(desc, _locate(desc, ctx), structural=True)


def _check_types(desc: Descriptor, ctx: _Ctx) -> None:
    """Python types of an in-memory descriptor (a caller bug, hence UsageError)."""

    def bad(field: str, want: str, got: object) -> UsageError:
        return UsageError(f"{field} must be {want}, not {type(got).__name__}", path=ctx.path, tensor=ctx.tensor, field=field)

    if not isinstance(desc, Descriptor):
        raise bad("descriptor", "a Descriptor", desc)
    if not isinstance(desc.element_type, ElementType):
        raise bad("element_type", "an ElementType", desc.element_type)
    if not isinstance(desc.element_type.tag, int) or isinstance(desc.element_type.tag, bool):
        raise bad("element_type.tag", "an int", desc.element_type.tag)
    if not isinstance(desc.shape, tuple):
        raise bad("shape", "a tuple", desc.shape)
    if not isinstance(desc.buffers, tuple) or not all(isinstance(h, BufferHandle) for h in desc.buffers):
        raise bad("buffers", "a tuple of BufferHandle", desc.buffers)
    rule = layout_of(desc.layout)
    if rule is None:
        raise bad("layout", "a layout", desc.layout)
    wrong = rule.check_types(desc.layout)
    if wrong is not None:
        raise bad(*wrong)
    for name, typ, want in (
        ("quantization", scheme_models(), "a quantization scheme"),
        ("shard", Shard, "a Shard"),
        ("statistics", Statistics, "a Statistics"),
        ("extension_type", ExtensionType, "an ExtensionType"),
        ("composite_member", CompositeMember, "a CompositeMember"),
    ):
        v = getattr(desc, name)
        if v is not None and not isinstance(v, typ):
            raise bad(name, f"{want} or None", v)
    if not isinstance(desc.quantization_padding, (bytes, bytearray)):
        raise bad("quantization_padding", "bytes", desc.quantization_padding)
    if desc.shard is not None and not (isinstance(desc.shard.parent_shape, tuple) and isinstance(desc.shard.offset, tuple)):
        raise bad("shard", "tuples of ints", desc.shard.parent_shape)


def _validate_structural(desc: Descriptor, ctx: _Ctx) -> None:
    """The value-range checks a decoder gets for free from the wire widths (needed for
    in-memory descriptors)."""
    et = desc.element_type
    layout = desc.layout
    shape = desc.shape
    r = len(shape)
    tag = layout.tag
    if not isinstance(et, ElementType):
        raise ctx.err(FormatError, f"element_type {et!r} is not an ElementType", "type_tag", 14)
    if desc.version_major != 1:
        raise ctx.err(UnsupportedError, f"descriptor version {desc.version_major}.{desc.version_minor} is not supported (major must be 1)", "version_major", 4)
    _int(desc.version_minor, 8, ctx, "version_minor", 5)
    if r > MAX_RANK:
        raise ctx.err(FormatError, f"rank {r} exceeds the maximum {MAX_RANK}", "rank", 16)
    for k, d in enumerate(shape):
        if d is not None:
            _int(d, 64, ctx, f"shape[{k}]", ctx.shape + 8 * k)
            if d == DYNAMIC:
                raise ctx.err(FormatError, "use None for the dynamic dimension", f"shape[{k}]", ctx.shape + 8 * k)
    _int(desc.byte_offset, 64, ctx, "byte_offset", ctx.byte_offset)
    if not isinstance(desc.quantization_padding, (bytes, bytearray)):
        raise ctx.err(FormatError, "quantization_padding must be bytes", "quantization_length", ctx.quant)
    if desc.quantization is None and desc.quantization_padding:
        raise ctx.err(InconsistentError, "quantization_padding without a quantization scheme", "flags", 10)
    if len(desc.buffers) > 255:
        raise ctx.err(FormatError, f"{len(desc.buffers)} buffers exceed the maximum 255", "buffer_count", ctx.buffers)
    if is_private_tag(et.tag):
        if desc.extension_type is None:
            raise ctx.err(InconsistentError, f"private type_tag {et.tag:#04x} without the extension-type section", "flags", 10)
    else:
        if ELEMENT_TYPES_BY_TAG.get(et.tag) != et:
            raise ctx.err(FormatError, f"unknown or reserved type_tag {et.tag:#04x}", "type_tag", 14)
        if desc.extension_type is not None:
            raise ctx.err(InconsistentError, f"HAS_EXTENSION_TYPE set for standard type {et.name}", "flags", 10)
    rule = layout_of(layout)
    if rule is None or layout_rule(tag) is None:
        raise ctx.err(FormatError, f"unknown or reserved layout_tag {tag:#04x}", "layout_tag", 15)
    rule.check_structure(layout, r, ctx, ctx.layout)
    for i, h in enumerate(desc.buffers):
        at = ctx.buffers + 1 + 16 * i
        _int(h.byte_size, 64, ctx, f"buffer[{i}].byte_size", at)
        _int(h.alignment, 32, ctx, f"buffer[{i}].alignment", at + 8)
        _int(h.device, 8, ctx, f"buffer[{i}].device", at + 12)
        _int(h.sync_mode, 8, ctx, f"buffer[{i}].sync_mode", at + 13)
        _int(h.memory_class, 8, ctx, f"buffer[{i}].memory_class", at + 14)
    if desc.quantization is not None:
        _check_scheme(desc.quantization, ctx, ctx.quant + 4, structural=True)
    if desc.statistics is not None:
        s = desc.statistics
        at = ctx.stats
        _int(s.computed_mask, 32, ctx, "statistics.computed_mask", at)
        _int(s.nnz, 64, ctx, "statistics.nnz", at + 8)
        for j, name in enumerate(("nm_n", "nm_m", "has_nan", "has_inf")):
            _int(getattr(s, name), 8, ctx, f"statistics.{name}", at + 64 + j)
    if desc.extension_type is not None:
        e = desc.extension_type
        at = ctx.ext
        for name, bits, rel in (
            ("bit_width", 32, 0), ("packing_factor", 8, 4), ("is_float", 8, 5), ("is_signed", 8, 6),
            ("sign_bits", 8, 7), ("exponent_bits", 8, 8), ("mantissa_bits", 8, 9), ("exponent_bias", 32, 12),
            ("has_nan", 8, 16), ("has_inf", 8, 17),
        ):
            _int(getattr(e, name), bits, ctx, f"extension_type.{name}", at + rel)
    if desc.composite_member is not None:
        _int(desc.composite_member.role, 8, ctx, "composite_member.role", ctx.member)


def _validate(desc: Descriptor, ctx: _Ctx, *, structural: bool) -> None:
    """All semantic rules.  ``structural`` adds the value-range checks a decoder
    gets for free from the wire widths (needed for in-memory descriptors)."""
    layout = desc.layout
    shape = desc.shape
    r = len(shape)
    tag = layout.tag
    if structural:
        _validate_structural(desc, ctx)

    # --- rank / scalars --------------------------------------------------
    if r == 0 and tag != 0x01:
        raise ctx.err(FormatError, f"a rank-0 tensor must be row-major, not {LAYOUT_NAMES.get(tag, hex(tag))}", "layout_tag", 15)

    layout_of(layout).check_semantics(layout, desc, ctx, ctx.layout)  # type: ignore[union-attr]

    # --- buffers ---------------------------------------------------------
    bufs = desc.buffers
    is_head = desc.is_composite
    if not is_head and not bufs:
        raise ctx.err(FormatError, "buffer_count is 0 (only a composite head has no buffers)", "buffer_count", ctx.buffers)
    for i, h in enumerate(bufs):
        at = ctx.buffers + 1 + 16 * i
        if not _pow2(h.alignment):
            raise ctx.err(FormatError, f"alignment {h.alignment} is not a power of two", f"buffer[{i}].alignment", at + 8)
        if h.byte_size > 0 and h.alignment < 64:
            raise ctx.err(FormatError, f"alignment {h.alignment} is below 64 for a non-empty buffer", f"buffer[{i}].alignment", at + 8)
        dev_private = is_private_tag(h.device)
        if h.device not in _DEVICES and not dev_private:
            raise ctx.err(FormatError, f"invalid or reserved device_tag {h.device:#04x}", f"buffer[{i}].device", at + 12)
        if h.sync_mode not in (0, 1, 2):
            raise ctx.err(FormatError, f"invalid sync_mode {h.sync_mode:#04x}", f"buffer[{i}].sync_mode", at + 13)
        if h.device == 0x00 and h.sync_mode != 0:
            raise ctx.err(InconsistentError, f"a CPU buffer must use sync_mode 0 (PRODUCER_SYNCED), not {h.sync_mode}", f"buffer[{i}].sync_mode", at + 13)
        mc = h.memory_class
        if is_private_tag(mc):
            if not dev_private:
                raise ctx.err(InconsistentError, f"private memory_class {mc:#04x} needs a private device_tag", f"buffer[{i}].memory_class", at + 14)
        elif mc not in _MEMORY_CLASSES:
            raise ctx.err(FormatError, f"invalid or reserved memory_class {mc:#04x}", f"buffer[{i}].memory_class", at + 14)
        elif not dev_private and mc not in _DEVICE_CLASSES[h.device]:
            raise ctx.err(
                InconsistentError,
                f"memory_class {_CLASS_NAMES[mc]} is not allowed on device {_DEVICE_NAMES[h.device]}",
                f"buffer[{i}].memory_class", at + 14,
            )
        if i and (h.device != bufs[0].device or h.memory_class != bufs[0].memory_class):
            raise ctx.err(
                InconsistentError,
                f"buffer {i} is on device {h.device:#04x}/class {mc:#04x} but buffer 0 on {bufs[0].device:#04x}/{bufs[0].memory_class:#04x} (buffers must be colocated)",
                f"buffer[{i}].device" if h.device != bufs[0].device else f"buffer[{i}].memory_class",
                at + (12 if h.device != bufs[0].device else 14),
            )

    # --- byte_offset -----------------------------------------------------
    if desc.byte_offset:
        if not layout_of(layout).offset_allowed:  # type: ignore[union-attr]
            raise ctx.err(InconsistentError, f"byte_offset must be 0 for a {layout_of(layout).name} layout, not {desc.byte_offset}", "byte_offset", ctx.byte_offset)
        if bufs and desc.byte_offset > bufs[0].byte_size:
            raise ctx.err(InconsistentError, f"byte_offset {desc.byte_offset} exceeds buffer 0's byte_size {bufs[0].byte_size}", "byte_offset", ctx.byte_offset)

    # --- composite head / member ------------------------------------------
    if is_head:
        if bufs:
            raise ctx.err(InconsistentError, f"a composite head must have buffer_count 0, not {len(bufs)}", "buffer_count", ctx.buffers)
        if desc.quantization is not None:
            raise ctx.err(InconsistentError, "a composite head must not carry quantization", "flags", 10)
        if desc.composite_member is not None:
            raise ctx.err(InconsistentError, "a composite head must not carry a composite-member section", "flags", 10)
    if desc.composite_member is not None and desc.composite_member.role not in (0, 1):
        raise ctx.err(FormatError, f"member_role {desc.composite_member.role:#04x} is not 0 (correction) or 1 (base)", "composite_member.role", ctx.member)

    # --- sections ----------------------------------------------------------
    if desc.shard is not None:
        _validate_shard(desc, ctx)
    if desc.statistics is not None and desc.statistics.computed_mask & ~0x3F:
        raise ctx.err(FormatError, f"reserved computed_mask bits set ({desc.statistics.computed_mask:#010x})", "statistics.computed_mask", ctx.stats)
    if desc.extension_type is not None:
        _validate_extension(desc.extension_type, ctx)

    # --- buffer counts, quantization, sizes --------------------------------
    nparams = 0
    if desc.quantization is not None:
        nparams = _validate_quantization(desc, ctx)
    if not is_head:
        _validate_buffer_count(desc, ctx, nparams)
        _validate_data_size(desc, ctx)


def _validate_shard(desc: Descriptor, ctx: _Ctx) -> None:
    s = desc.shard
    assert s is not None
    r = len(desc.shape)
    if not layout_of(desc.layout).shardable:  # type: ignore[union-attr]
        raise ctx.err(InconsistentError, f"a shard section is forbidden on a {layout_of(desc.layout).name} layout", "flags", 10)
    if len(s.parent_shape) != r or len(s.offset) != r:
        raise ctx.err(InconsistentError, f"shard vectors must have {r} entries", "shard.parent_shape", ctx.shard)
    for k in range(r):
        p, o, d = s.parent_shape[k], s.offset[k], desc.shape[k]
        _int(p, 64, ctx, f"shard.parent_shape[{k}]", ctx.shard + 8 * k)
        _int(o, 64, ctx, f"shard.offset[{k}]", ctx.shard + 8 * (r + k))
        if p == DYNAMIC:
            raise ctx.err(FormatError, "a shard must not use the dynamic sentinel", f"shard.parent_shape[{k}]", ctx.shard + 8 * k)
        if o == DYNAMIC:
            raise ctx.err(FormatError, "a shard must not use the dynamic sentinel", f"shard.offset[{k}]", ctx.shard + 8 * (r + k))
        if d is None:
            raise ctx.err(InconsistentError, "a sharded tensor must not have a dynamic dimension", f"shape[{k}]", ctx.shape + 8 * k)
        if o + d > p:
            raise ctx.err(InconsistentError, f"shard offset {o} + shape {d} exceeds parent_shape {p} on axis {k}", f"shard.offset[{k}]", ctx.shard + 8 * (r + k))


def _validate_extension(e: ExtensionType, ctx: _Ctx) -> None:
    at = ctx.ext
    if e.bit_width == 0:
        raise ctx.err(FormatError, "bit_width must be > 0", "extension_type.bit_width", at)
    if e.bit_width < 8:
        if e.bit_width not in (1, 2, 4):
            raise ctx.err(FormatError, f"sub-byte bit_width {e.bit_width} is not 1, 2 or 4", "extension_type.bit_width", at)
        if e.packing_factor != 8 // e.bit_width:
            raise ctx.err(InconsistentError, f"packing_factor {e.packing_factor} must be {8 // e.bit_width} for bit_width {e.bit_width}", "extension_type.packing_factor", at + 4)
    elif e.packing_factor != 1:
        raise ctx.err(InconsistentError, f"packing_factor {e.packing_factor} must be 1 for bit_width {e.bit_width}", "extension_type.packing_factor", at + 4)


def _check_scheme(q: object, ctx: _Ctx, at: int, structural: bool = False) -> None:
    """Context-free scheme rules; ``at`` is the (relative) offset of the scheme start."""
    rule = scheme_of(q)
    if rule is None:
        raise ctx.err(FormatError, f"{q!r} is not a quantization scheme", "quantization.scheme_tag", at)
    if structural:
        rule.check_structure(q, ctx, at)
    rule.check(q, ctx, at)


def _validate_quantization(desc: Descriptor, ctx: _Ctx) -> int:
    """Quantization rules needing the descriptor; returns the number of parameter buffers."""
    q = desc.quantization
    assert q is not None
    Q = ctx.quant + 4
    et = desc.element_type
    rule = scheme_of(q)
    name = rule.name  # type: ignore[union-attr]
    if et.tag not in rule.storage_tags:  # type: ignore[union-attr]
        raise ctx.err(InconsistentError, f"storage type {et.name} is not allowed with {name}", "type_tag", 14)
    layout = layout_of(desc.layout)
    rule.check_in(desc, q, layout.paged, ctx, Q)  # type: ignore[union-attr]
    # parameter buffers
    nbuf = len(desc.buffers)
    own = layout.buffer_count(desc)  # type: ignore[union-attr]
    params = rule.params(q)  # type: ignore[union-attr]
    if not params:
        return 0
    for fname, idx, rel in params:
        if idx >= nbuf:
            raise ctx.err(InconsistentError, f"{fname} {idx} is not less than buffer_count {nbuf}", f"quantization.{fname}", Q + rel)
        if own is not None and idx < own:
            what = "the data buffer" if idx == 0 else f"layout buffer {idx}"
            raise ctx.err(InconsistentError, f"{fname} {idx} refers to {what}", f"quantization.{fname}", Q + rel)
    # parameter sizes
    sizes = _param_sizes(desc)
    if sizes is not None:
        for (fname, idx, rel), want in zip(params, sizes):
            if len(params) == 2 and params[0][1] == params[1][1]:
                want = sizes[0] + sizes[1]
            got = desc.buffers[idx].byte_size
            if got != want:
                raise ctx.err(
                    InconsistentError,
                    f"{fname.replace('_buffer_index', '')} buffer {idx} holds {got} bytes, {name} needs {want}",
                    f"buffer[{idx}].byte_size", ctx.buffers + 1 + 16 * idx,
                )
    return len({idx for _, idx, _ in params})


def _param_sizes(desc: Descriptor) -> list[int] | None:
    """Expected byte sizes of the parameter buffers, in the scheme's ``params`` order
    (None where the specification leaves them open: sparse and private layouts)."""
    q = desc.quantization
    if not layout_of(desc.layout).sized_params:  # type: ignore[union-attr]
        return None
    rule = scheme_of(q)
    return rule.param_sizes(desc, q, rule.count(desc, q, num_blocks))  # type: ignore[union-attr]


def _validate_buffer_count(desc: Descriptor, ctx: _Ctx, nparams: int) -> None:
    own = layout_of(desc.layout).buffer_count(desc)  # type: ignore[union-attr]
    n = len(desc.buffers)
    if own is None:
        return
    want = own + nparams
    if n != want:
        lname = layout_of(desc.layout).name  # type: ignore[union-attr]
        quant = f" + {nparams} quantization parameter buffer(s)" if nparams else ""
        raise ctx.err(InconsistentError, f"buffer_count {n}, but a {lname} tensor has {own}{quant}", "buffer_count", ctx.buffers)


def _validate_data_size(desc: Descriptor, ctx: _Ctx) -> None:
    sparse = _sparse_byte_sizes(desc)
    if sparse is not None:
        layout = desc.layout
        size = desc.size
        if size is not None and layout.nnz > size:  # type: ignore[union-attr]
            raise ctx.err(InconsistentError, f"nnz {layout.nnz} exceeds the {size} elements of the shape", "nnz", ctx.layout)  # type: ignore[union-attr]
        for i, (role, want_i) in enumerate(zip(layout_of(layout).roles, sparse)):  # type: ignore[union-attr]
            got = desc.buffers[i].byte_size
            if got != want_i:
                raise ctx.err(
                    InconsistentError,
                    f"{layout_of(layout).name} {role} buffer {i} holds {got} bytes, needs {want_i}",
                    f"buffer[{i}].byte_size", ctx.buffers + 1 + 16 * i,
                )
        return
    want = dense_byte_size(desc)
    if want is None:
        return
    got = desc.buffers[0].byte_size
    at = ctx.buffers + 1
    if desc.byte_offset:
        if got < desc.byte_offset + want:
            raise ctx.err(InconsistentError, f"buffer 0 holds {got} bytes, byte_offset {desc.byte_offset} + {want} needed", "buffer[0].byte_size", at)
        return
    if got == want:
        return
    alt = padded_byte_size(desc)
    if alt is not None and got == alt:
        return
    also = f" (or {alt} with padded partial blocks)" if alt is not None else ""
    raise ctx.err(
        InconsistentError,
        f"buffer 0 holds {got} bytes, but {desc.element_type.name} {list(desc.shape)} needs {want}{also}",
        "buffer[0].byte_size", at,
    )


# ---------------------------------------------------------------------------
# size arithmetic


def addressed_byte_range(desc: Descriptor) -> tuple[int, int] | None:
    """``(first, end)``: the bytes of buffer 0 a strided tensor's elements occupy,
    ``byte_offset`` included (``first < 0`` when a stride reaches before the buffer).
    Strides count logical elements; a sub-byte element occupies the byte (6-bit: the
    3-byte group) holding it.  None for other layouts, empty or dynamic shapes and
    private element types."""
    rule = layout_of(desc.layout)
    strides = rule.free_strides(desc.layout) if rule is not None else None
    et = desc.element_type
    if strides is None or et.kind == "private" or len(strides) != len(desc.shape):
        return None
    if any(n is None or n == 0 for n in desc.shape):
        return None
    lo = sum(min(0, s * (n - 1)) for s, n in zip(strides, desc.shape))  # type: ignore[operator]
    hi = sum(max(0, s * (n - 1)) for s, n in zip(strides, desc.shape))  # type: ignore[operator]
    bo = desc.byte_offset
    if et.bits == 6:
        return bo + 3 * (lo // 4), bo + 3 * (hi // 4) + 3
    if et.packed:
        per = 8 // et.bits
        return bo + lo // per, bo + hi // per + 1
    return bo + lo * (et.bits // 8), bo + (hi + 1) * (et.bits // 8)


def validate_addressed_range(desc: Descriptor, *, path: str | None = None, tensor: str | None = None) -> None:
    """strided.md: "the physical address of every valid element MUST lie within the buffer's
    bounds" (buffer 0 as its handle declares it).  Not part of :func:`validate_descriptor`:
    the reference binding accepts strides reaching outside the buffer, and so does the
    reader (such a tensor can be listed and copied, not evaluated); the dequantizer calls it."""
    span = addressed_byte_range(desc)
    if span is None:
        return
    first, end = span
    bo = desc.byte_offset
    if first < 0:
        raise FormatError(f"an element lies {-first} bytes before the start of buffer 0 (byte_offset {bo})",
                          path=path, tensor=tensor, field="byte_offset")
    have = desc.buffers[0].byte_size
    if end > have:
        raise TruncatedError(f"the layout addresses bytes up to {end}, buffer 0 holds {have}", path=path, tensor=tensor,
                             field="buffer[0].byte_size", offset=bo)


def check_buffer_sizes(
    desc: Descriptor,
    data: Sequence["np.ndarray | bytes"],
    *,
    indices: Sequence[int] | None = None,
    path: str | None = None,
    tensor: str | None = None,
) -> None:
    """Raise :class:`InconsistentError` unless buffer ``i`` of ``data`` holds exactly the
    ``byte_size`` its handle declares, for every ``i`` in ``indices`` (default: every buffer,
    and then ``data`` must have one entry per handle)."""
    if indices is None:
        if len(data) != len(desc.buffers):
            raise InconsistentError(f"the descriptor declares {len(desc.buffers)} buffers, the tensor carries {len(data)}",
                                    path=path, tensor=tensor, field="buffers")
        indices = range(len(desc.buffers))
    for i in indices:
        got = len(data[i]) if not isinstance(data[i], np.ndarray) else data[i].nbytes
        want = desc.buffers[i].byte_size if i < len(desc.buffers) else None
        if want is not None and got != want:
            raise InconsistentError(f"buffer {i} holds {got} bytes, its handle declares {want}", path=path, tensor=tensor,
                                    field=f"buffer[{i}]")


def dense_byte_size(desc: Descriptor) -> int | None:
    """Expected bytes of the data buffer of a dense tensor: the contiguous size of
    ``prod(shape)`` elements for row-major, column-major and Hilbert layouts,
    ``2^Σbits`` elements for Morton.  None when not computable: dynamic
    dimensions, strided/tiled/sparse/paged/private layouts, private element types."""
    if desc.element_type.kind == "private":
        return None
    return layout_of(desc.layout).data_size(desc)  # type: ignore[union-attr]


def _sparse_byte_sizes(desc: Descriptor) -> list[int] | None:
    """Expected sizes of the layout buffers of COO / CSR / CSC tensors
    (values, then u64 index arrays); None for other layouts or dynamic shapes."""
    return layout_of(desc.layout).layout_sizes(desc)  # type: ignore[union-attr]


def padded_byte_size(desc: Descriptor) -> int | None:
    """The seed's per-block/NF4 padded data size: each outer row of the axis holds
    ``ceil(S/K)·K`` storage elements (None when no partial block exists)."""
    q = desc.quantization
    rule = scheme_of(q)
    if rule is None or not rule.padded or not layout_of(desc.layout).paddable:  # type: ignore[union-attr]
        return None
    S = desc.shape[q.axis]
    n = desc.size
    if not S or n is None or S % q.block_size == 0:
        return None
    padded = -(-S // q.block_size) * q.block_size
    return buffer_size(desc.element_type, n // S * padded)


def blocks_per_axis(desc: Descriptor) -> int:
    """Blocks along the quantization axis: ``ceil(S/K)`` (per-block affine, NF4),
    ``S/K`` (MXFP).  Raises UsageError for schemes without blocks and
    FormatError for a dynamic axis."""
    q = desc.quantization
    rule = scheme_of(q)
    if rule is None or not rule.blocks:
        raise UsageError(f"{type(q).__name__} has no blocks")
    S = desc.shape[q.axis] if q.axis < len(desc.shape) else None
    if S is None:
        raise FormatError("quantization axis is dynamic or out of range", field="quantization.axis")
    return -(-S // q.block_size)


def num_blocks(desc: Descriptor) -> int | None:
    """Number of scale entries of a block scheme: ``blocks_per_axis · Π(other dims)``
    (block ``b = outer·blocks_per_axis + i_axis // K``); for a block-paged
    tensor ``num_pages · page_size`` (scales per page slot).  None when another
    dimension is dynamic."""
    q = desc.quantization
    rule = scheme_of(q)
    if layout_of(desc.layout).paged and rule is not None and rule.blocks:  # type: ignore[union-attr]
        return desc.layout.num_pages * desc.layout.page_size  # type: ignore[union-attr]
    per = blocks_per_axis(desc)
    outer = 1
    for j, d in enumerate(desc.shape):
        if j == q.axis:  # type: ignore[union-attr]
            continue
        if d is None:
            return None
        outer *= d
    return per * outer


# ---------------------------------------------------------------------------
# parameter-buffer contents

def validate_parameter_values(
    desc: Descriptor,
    data: Sequence[np.ndarray],
    *,
    path: str | None = None,
    tensor: str | None = None,
    data_offsets: Sequence[int] | None = None,
) -> None:
    """Check quantization parameter buffer contents (``data[i]`` = bytes of buffer i).

    * per-channel / per-block scales: finite and non-zero (f16/bf16/f32);
    * per-channel zero points: within the storage type's range;
    * NF4 scales: finite and >= 0;
    * MXFP scale bytes: never 0x00 or 0xFF.

    Checks are on the IEEE bit patterns (vectorized, chunked).  Errors name the
    buffer, the first offending block and its byte offset (absolute when
    ``data_offsets`` gives where each buffer starts).
    """
    q = desc.quantization
    rule = scheme_of(q)
    if rule is None or not rule.params(q):
        return
    count = rule.count(desc, q, num_blocks)

    def view(idx: int, dt: str, start: int = 0) -> np.ndarray:
        """Entries of ``dt`` in buffer ``idx`` from entry ``start`` (at most ``count``)."""
        if idx >= len(data):
            raise UsageError(f"buffer {idx} contents not supplied", path=path, tensor=tensor, field=f"buffer[{idx}]")
        check_buffer_sizes(desc, data, indices=(idx,), path=path, tensor=tensor)
        raw = as_u8(data[idx])
        item = np.dtype(dt).itemsize
        out = raw[: raw.size - raw.size % item].view(dt)[start:]
        return out if count is None else out[:count]

    unit = rule.unit

    def fail(idx: int, i: int, item: int, what: str, value: str, start: int = 0) -> None:
        rel = start + i * item
        off = (data_offsets[idx] + rel) if data_offsets is not None else None
        where = "" if off is not None else f" (byte {rel} of the buffer)"
        raise FormatError(f"{what} of {unit} {i} is {value}{where}", path=path, tensor=tensor, field=f"buffer[{idx}]", offset=off)

    rule.check_values(desc, q, view, fail, count)
