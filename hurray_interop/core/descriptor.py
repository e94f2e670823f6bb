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

import math
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
from .elements import ELEMENT_TYPES_BY_TAG, ElementType, buffer_size, e8m0_reserved, is_private_tag
from .model import (
    DYNAMIC,
    as_u8,
    LAYOUT_NAMES,
    SCHEME_NAMES,
    MXFP,
    NF4,
    BlockPaged,
    BufferHandle,
    ColumnMajor,
    CompositeHead,
    CompositeMember,
    Coo,
    Csc,
    Csf,
    Csr,
    Descriptor,
    ExtensionType,
    Hilbert,
    Morton,
    PerBlockAffine,
    PerChannelAffine,
    PerTensorAffine,
    PrivateLayout,
    Quantization,
    RowMajor,
    Shard,
    Statistics,
    Strided,
    Tiled,
)

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
MAX_TILED_DEPTH = 8
NONE_U32 = 0xFFFFFFFF

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
_COO = struct.Struct("<QB7s")
_CSR = struct.Struct("<Q8s")
_BLOCK_PAGED = struct.Struct("<IQIIBIB6s")  # 32 bytes
_COMPOSITE = struct.Struct("<BB2sI")  # 8 bytes
_HILBERT = struct.Struct("<II")
_PRIVATE_LAYOUT = struct.Struct("<QI")
_TILED_MODES = struct.Struct("<BB2s")

_Q_HEAD = struct.Struct("<BBH")
_Q_PER_TENSOR = struct.Struct("<BBHfi4s")  # 16
_Q_PER_CHANNEL = struct.Struct("<BBHIIIB3s")  # 20
_Q_PER_BLOCK = struct.Struct("<BBHIIIIB3s")  # 24
_Q_AXIS_BLOCK = struct.Struct("<BBHIII")  # 16 (NF4, MXFP)
_Q_LEN = {0x01: 16, 0x02: 20, 0x03: 24, 0x04: 16, 0x05: 16}

_STRUCT_CACHE: dict[tuple[str, int], struct.Struct] = {}


def _vec(code: str, n: int) -> struct.Struct:
    st = _STRUCT_CACHE.get((code, n))
    if st is None:
        st = _STRUCT_CACHE[(code, n)] = struct.Struct(f"<{n}{code}" if len(code) == 1 else "<" + code * n)
    return st


# ---------------------------------------------------------------------------
# tables (buffer-protocol.md, quantization/*.md)

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

_AFFINE_STORAGE = frozenset({0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x48, 0x49, 0x4A, 0x4B})
_PER_BLOCK_STORAGE = frozenset({0x10, 0x11, 0x48, 0x49, 0x4A, 0x4B})
_NF4_STORAGE = frozenset({0x49})
_MXFP_STORAGE = frozenset({0x40, 0x41, 0x43, 0x44, 0x45, 0x10, 0x48})
_PER_BLOCK_SCALE_TYPES = frozenset({0x01, 0x02, 0x03})

_DENSE_LAYOUTS = frozenset({0x01, 0x02, 0x03, 0x04, 0x05, 0x40})


def _pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


def _storage_range(et: ElementType) -> tuple[int, int]:
    if et.kind == "uint":
        return 0, (1 << et.bits) - 1
    return -(1 << (et.bits - 1)), (1 << (et.bits - 1)) - 1


def private_element_type(tag: int, ext: ExtensionType | None) -> ElementType:
    """The ``ElementType`` row standing for private tag ``tag`` (0xF0-0xFE)."""
    bits = ext.bit_width if ext is not None else 0
    return ElementType(
        name=f"private_{tag:#04x}", tag=tag, tier=0, bits=bits, kind="private", numpy="", packed=0 < bits < 8
    )


# ---------------------------------------------------------------------------
# error plumbing


class _Ctx:
    """Where errors point: path, tensor, absolute offsets of the wire sections."""

    __slots__ = ("path", "tensor", "base", "shape", "byte_offset", "layout", "buffers", "quant", "shard", "stats", "ext", "member")

    def __init__(self, path: str | None, tensor: str | None, base: int) -> None:
        self.path = path
        self.tensor = tensor
        self.base = base

    def err(self, cls: type[HurrayInteropError], message: str, field: str, at: int | None) -> HurrayInteropError:
        return cls(message, path=self.path, tensor=self.tensor, field=field, offset=None if at is None else self.base + at)


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
        pos += 4 + _Q_LEN.get(getattr(desc.quantization, "scheme_tag", 0), 0) + len(desc.quantization_padding)
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
    if isinstance(layout, (RowMajor, ColumnMajor)):
        return b""
    if isinstance(layout, Strided):
        return _vec("q", len(layout.strides)).pack(*layout.strides)
    if isinstance(layout, Tiled):
        return _encode_tiled(layout)
    if isinstance(layout, Morton):
        return _vec("I", len(layout.bits)).pack(*layout.bits)
    if isinstance(layout, Coo):
        return _COO.pack(layout.nnz, 1 if layout.is_sorted else 0, bytes(7))
    if isinstance(layout, (Csr, Csc)):
        return _CSR.pack(layout.nnz, bytes(8))
    if isinstance(layout, Csf):
        return _U64.pack(layout.nnz) + _vec("I", len(layout.mode_order)).pack(*layout.mode_order) + bytes(8)
    if isinstance(layout, BlockPaged):
        return _BLOCK_PAGED.pack(
            layout.page_size, layout.num_pages, layout.paged_axis, layout.num_seqs, layout.kv_role,
            layout.layer_index, layout.block_table_index_type, bytes(6),
        )
    if isinstance(layout, CompositeHead):
        return _COMPOSITE.pack(layout.composition_rule, layout.combine_op, bytes(2), layout.member_count)
    if isinstance(layout, Hilbert):
        return _HILBERT.pack(layout.order, layout.rank)
    if isinstance(layout, PrivateLayout):
        return _PRIVATE_LAYOUT.pack(layout.extension_layout_id, len(layout.data)) + bytes(layout.data)
    raise TypeError(f"not a layout: {layout!r}")


def _encode_tiled(t: Tiled) -> bytes:
    parts = [_vec("Q", len(t.tile_shape)).pack(*t.tile_shape), _TILED_MODES.pack(t.outer_layout, t.inner_layout, bytes(2))]
    if t.outer_layout == 3:
        parts.append(_vec("q", len(t.outer_strides)).pack(*t.outer_strides))  # type: ignore[arg-type]
    if t.inner_layout == 3:
        parts.append(_vec("q", len(t.inner_strides)).pack(*t.inner_strides))  # type: ignore[arg-type]
    if t.inner_layout == 4:
        parts.append(_encode_tiled(t.inner))  # type: ignore[arg-type]
    return b"".join(parts)


def _encode_scheme(q: Quantization) -> bytes:
    if isinstance(q, PerTensorAffine):
        return _Q_PER_TENSOR.pack(0x01, 1, 0, q.scale, q.zero_point, bytes(4))
    if isinstance(q, PerChannelAffine):
        sym = q.zero_point_buffer_index is None
        zp = NONE_U32 if sym else q.zero_point_buffer_index
        return _Q_PER_CHANNEL.pack(0x02, 1, 1 if sym else 0, q.axis, q.scale_buffer_index, zp, q.scale_type.tag, bytes(3))
    if isinstance(q, PerBlockAffine):
        sym = q.zero_point_buffer_index is None
        zp = NONE_U32 if sym else q.zero_point_buffer_index
        return _Q_PER_BLOCK.pack(
            0x03, 1, 1 if sym else 0, q.axis, q.block_size, q.scale_buffer_index, zp, q.scale_type.tag, bytes(3)
        )
    if isinstance(q, (NF4, MXFP)):
        return _Q_AXIS_BLOCK.pack(q.scheme_tag, 1, 0, q.axis, q.block_size, q.scale_buffer_index)
    raise TypeError(f"not a quantization scheme: {q!r}")


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
    if tag == 0x01:
        return RowMajor()
    if tag == 0x02:
        return ColumnMajor()
    if tag == 0x03:
        return Strided(tuple(rd.unpack(_vec("q", rank), "strided.strides")) if rank else ())
    if tag == 0x04:
        return _decode_tiled(rd, rank, ctx, start, 1)
    if tag == 0x05:
        return Morton(tuple(rd.unpack(_vec("I", rank), "morton.bits")) if rank else ())
    if tag == 0x06:
        at = rd.pos
        nnz, srt, res = rd.unpack(_COO, "coo")
        if res != bytes(7):
            raise ctx.err(FormatError, "reserved bytes must be zero", "coo._reserved", at + 9 - start)
        if srt > 1:
            raise ctx.err(FormatError, f"is_sorted is {srt}, must be 0 or 1", "coo.is_sorted", at + 8 - start)
        return Coo(nnz, bool(srt))
    if tag in (0x07, 0x08):
        at = rd.pos
        nnz, res = rd.unpack(_CSR, "csr" if tag == 0x07 else "csc")
        if res != bytes(8):
            raise ctx.err(FormatError, "reserved bytes must be zero", ("csr" if tag == 0x07 else "csc") + "._reserved", at + 8 - start)
        return Csr(nnz) if tag == 0x07 else Csc(nnz)
    if tag == 0x09:
        nnz = rd.u64("csf.nnz")
        order = tuple(rd.unpack(_vec("I", rank), "csf.mode_order")) if rank else ()
        at = rd.pos
        if rd.bytes(8, "csf._reserved") != bytes(8):
            raise ctx.err(FormatError, "reserved bytes must be zero", "csf._reserved", at - start)
        return Csf(nnz, order)
    if tag == 0x0A:
        at = rd.pos
        v = rd.unpack(_BLOCK_PAGED, "block_paged")
        if v[7] != bytes(6):
            raise ctx.err(FormatError, "reserved bytes must be zero", "block_paged._reserved", at + 26 - start)
        return BlockPaged(*v[:7])
    if tag == 0x0B:
        at = rd.pos
        rule, op, res, count = rd.unpack(_COMPOSITE, "composite")
        if res != bytes(2):
            raise ctx.err(FormatError, "reserved bytes must be zero", "composite._reserved", at + 2 - start)
        return CompositeHead(rule, op, count)
    if tag == 0x40:
        order, hrank = rd.unpack(_HILBERT, "hilbert")
        return Hilbert(order, hrank)
    if is_private_tag(tag):
        ident, n = rd.unpack(_PRIVATE_LAYOUT, "private_layout")
        return PrivateLayout(tag, ident, rd.bytes(n, "private_layout.data"))
    raise ctx.err(FormatError, f"unknown or reserved layout_tag {tag:#04x}", "layout_tag", 15)


def _decode_tiled(rd: Reader, rank: int, ctx: _Ctx, start: int, depth: int) -> Tiled:
    if depth > MAX_TILED_DEPTH:
        raise ctx.err(FormatError, f"tiled nesting deeper than {MAX_TILED_DEPTH}", "tiled.inner_layout", rd.pos - start - 3)
    tile = tuple(rd.unpack(_vec("Q", rank), "tiled.tile_shape")) if rank else ()
    at = rd.pos
    outer, inner, res = rd.unpack(_TILED_MODES, "tiled.layouts")
    if res != bytes(2):
        raise ctx.err(FormatError, "reserved bytes must be zero", "tiled._reserved", at + 2 - start)
    if outer not in (1, 2, 3):
        raise ctx.err(FormatError, f"outer_layout {outer} is not 1, 2 or 3", "tiled.outer_layout", at - start)
    if inner not in (1, 2, 3, 4):
        raise ctx.err(FormatError, f"inner_layout {inner} is not 1, 2, 3 or 4", "tiled.inner_layout", at + 1 - start)
    os_ = tuple(rd.unpack(_vec("q", rank), "tiled.outer_strides")) if outer == 3 and rank else (() if outer == 3 else None)
    is_ = tuple(rd.unpack(_vec("q", rank), "tiled.inner_strides")) if inner == 3 and rank else (() if inner == 3 else None)
    nested = _decode_tiled(rd, rank, ctx, start, depth + 1) if inner == 4 else None
    return Tiled(tile, outer, inner, os_, is_, nested)


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
        if rank is not None and not isinstance(q, PerTensorAffine) and q.axis >= rank:
            raise ctx.err(FormatError, f"axis {q.axis} is not less than rank {rank}", "quantization.axis", 4)
    except HurrayInteropError as exc:
        raise exc.located(path=path, tensor=tensor) from None
    return q


def _decode_scheme(buf: memoryview, pos: int, n: int, ctx: _Ctx) -> tuple[Quantization, int]:
    """Parse the scheme at ``buf[pos:pos+n]``; ``ctx.base`` is the absolute scheme start."""
    if n < 4:
        raise ctx.err(TruncatedError, f"quantization_length {n} is shorter than the 4-byte scheme header", "quantization_length", -4)
    tag, version, flags = _Q_HEAD.unpack_from(buf, pos)
    if tag not in _Q_LEN:
        kind = "invalid" if tag in (0x00, 0xFF) else "private" if is_private_tag(tag) else "unknown or reserved"
        raise ctx.err(FormatError, f"{kind} quantization scheme_tag {tag:#04x}", "quantization.scheme_tag", 0)
    name = SCHEME_NAMES[tag]
    if version == 0:
        raise ctx.err(FormatError, f"{name} scheme_version 0 is invalid (must be 1)", "quantization.scheme_version", 1)
    if version > 1:
        raise ctx.err(UnsupportedError, f"{name} scheme_version {version} is not supported (must be 1)", "quantization.scheme_version", 1)
    need = _Q_LEN[tag]
    if n < need:
        raise ctx.err(TruncatedError, f"quantization_length {n} is shorter than the {need}-byte {name} descriptor", "quantization_length", -4)
    allowed = 0x0001 if tag in (0x02, 0x03) else 0
    if flags & ~allowed:
        raise ctx.err(FormatError, f"reserved {name} flag bits set (flags {flags:#06x})", "quantization.flags", 2)
    q: Quantization
    if tag == 0x01:
        _, _, _, scale, zp, res = _Q_PER_TENSOR.unpack_from(buf, pos)
        if res != bytes(4):
            raise ctx.err(FormatError, "reserved bytes must be zero", "quantization._reserved", 12)
        q = PerTensorAffine(scale, zp)
    elif tag == 0x02:
        _, _, _, axis, si, zi, stt, res = _Q_PER_CHANNEL.unpack_from(buf, pos)
        if res != bytes(3):
            raise ctx.err(FormatError, "reserved bytes must be zero", "quantization._reserved", 17)
        _check_symmetric(flags, zi, ctx, 12)
        if stt != 0x03:
            raise ctx.err(FormatError, f"per-channel scale_type_tag {stt:#04x} is not float32 (0x03)", "quantization.scale_type", 16)
        q = PerChannelAffine(axis, si, None if flags & 1 else zi, ELEMENT_TYPES_BY_TAG[0x03])
    elif tag == 0x03:
        _, _, _, axis, k, si, zi, stt, res = _Q_PER_BLOCK.unpack_from(buf, pos)
        if res != bytes(3):
            raise ctx.err(FormatError, "reserved bytes must be zero", "quantization._reserved", 21)
        _check_symmetric(flags, zi, ctx, 16)
        if stt not in _PER_BLOCK_SCALE_TYPES:
            raise ctx.err(FormatError, f"per-block scale_type_tag {stt:#04x} is not float16, bfloat16 or float32", "quantization.scale_type", 20)
        q = PerBlockAffine(axis, k, si, None if flags & 1 else zi, ELEMENT_TYPES_BY_TAG[stt])
    else:
        _, _, _, axis, k, si = _Q_AXIS_BLOCK.unpack_from(buf, pos)
        q = NF4(axis, k, si) if tag == 0x04 else MXFP(axis, k, si)
    _check_scheme(q, ctx, 0)
    return q, need


def _check_symmetric(flags: int, zi: int, ctx: _Ctx, at: int) -> None:
    if flags & 1 and zi != NONE_U32:
        raise ctx.err(InconsistentError, f"SYMMETRIC is set but zero_point_buffer_index is {zi} (must be 0xFFFFFFFF)", "quantization.zero_point_buffer_index", at)
    if not flags & 1 and zi == NONE_U32:
        raise ctx.err(InconsistentError, "zero_point_buffer_index is 0xFFFFFFFF but SYMMETRIC is not set", "quantization.zero_point_buffer_index", at)


# ---------------------------------------------------------------------------
# validation


def validate_descriptor(desc: Descriptor, *, path: str | None = None, tensor: str | None = None, base: int = 0) -> None:
    """Raise a FormatError subclass (or UnsupportedError) unless ``desc`` is valid.

    Offsets in errors are where the field sits in the encoded descriptor, plus ``base``.
    """
    ctx = _Ctx(path, tensor, base)
    _check_types(desc, ctx)
    _validate(desc, _locate(desc, ctx), structural=True)


_LAYOUT_TYPES = (RowMajor, ColumnMajor, Strided, Tiled, Morton, Coo, Csr, Csc, Csf, BlockPaged, CompositeHead, Hilbert, PrivateLayout)
_SCHEME_TYPES = (PerTensorAffine, PerChannelAffine, PerBlockAffine, NF4, MXFP)


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
    if not isinstance(desc.layout, _LAYOUT_TYPES):
        raise bad("layout", "a layout", desc.layout)
    t = desc.layout
    while isinstance(t, Tiled):
        if t.inner is not None and not isinstance(t.inner, Tiled):
            raise bad("tiled.inner", "a Tiled layout or None", t.inner)
        t = t.inner
    for name, typ, want in (
        ("quantization", _SCHEME_TYPES, "a quantization scheme"),
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


def _int(v: object, bits: int, ctx: _Ctx, field: str, at: int | None, signed: bool = False) -> None:
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise ctx.err(FormatError, f"{v!r} is not a {'signed' if signed else 'unsigned'} {bits}-bit integer", field, at)


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
    if not (tag in LAYOUT_NAMES or (isinstance(layout, PrivateLayout) and is_private_tag(tag))):
        raise ctx.err(FormatError, f"unknown or reserved layout_tag {tag:#04x}", "layout_tag", 15)
    if isinstance(layout, Coo) and layout.is_sorted not in (0, 1):
        raise ctx.err(FormatError, f"is_sorted {layout.is_sorted!r} is not a bool", "coo.is_sorted", ctx.layout + 8)
    _validate_layout_structure(desc, ctx)
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

    _validate_layout_semantics(desc, ctx)

    # --- buffers ---------------------------------------------------------
    bufs = desc.buffers
    is_head = isinstance(layout, CompositeHead)
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
        if tag in (0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B):
            raise ctx.err(InconsistentError, f"byte_offset must be 0 for a {LAYOUT_NAMES[tag]} layout, not {desc.byte_offset}", "byte_offset", ctx.byte_offset)
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


def _validate_layout_structure(desc: Descriptor, ctx: _Ctx) -> None:
    """Lengths and wire widths of the layout payload of an in-memory descriptor."""
    layout = desc.layout
    r = len(desc.shape)
    L = ctx.layout

    def vec(name: str, v: object, bits: int, signed: bool = False, width: int = 8) -> None:
        if not isinstance(v, tuple) or len(v) != r:
            raise ctx.err(InconsistentError, f"{name} must be a tuple of {r} values (one per dimension)", name, L)
        for k, x in enumerate(v):
            _int(x, bits, ctx, f"{name}[{k}]", L + width * k, signed)

    if isinstance(layout, Strided):
        vec("strided.strides", layout.strides, 64, True)
    elif isinstance(layout, Tiled):
        t, depth = layout, 1
        while t is not None:
            if depth > MAX_TILED_DEPTH:
                raise ctx.err(FormatError, f"tiled nesting deeper than {MAX_TILED_DEPTH}", "tiled.inner_layout", L)
            vec("tiled.tile_shape", t.tile_shape, 64)
            if t.outer_layout not in (1, 2, 3):
                raise ctx.err(FormatError, f"outer_layout {t.outer_layout} is not 1, 2 or 3", "tiled.outer_layout", L + 8 * r)
            if t.inner_layout not in (1, 2, 3, 4):
                raise ctx.err(FormatError, f"inner_layout {t.inner_layout} is not 1, 2, 3 or 4", "tiled.inner_layout", L + 8 * r + 1)
            if (t.outer_strides is not None) != (t.outer_layout == 3):
                raise ctx.err(InconsistentError, "outer_strides must be given iff outer_layout is 3 (strided)", "tiled.outer_strides", L + 8 * r + 4)
            if t.outer_strides is not None:
                vec("tiled.outer_strides", t.outer_strides, 64, True)
            if (t.inner_strides is not None) != (t.inner_layout == 3):
                raise ctx.err(InconsistentError, "inner_strides must be given iff inner_layout is 3 (strided)", "tiled.inner_strides", L + 8 * r + 4)
            if t.inner_strides is not None:
                vec("tiled.inner_strides", t.inner_strides, 64, True)
            if (t.inner is not None) != (t.inner_layout == 4):
                raise ctx.err(InconsistentError, "inner must be given iff inner_layout is 4 (tiled)", "tiled.inner_layout", L + 8 * r + 1)
            L = L + 8 * r + 4 + (8 * r if t.outer_layout == 3 else 0) + (8 * r if t.inner_layout == 3 else 0)
            t, depth = t.inner, depth + 1
    elif isinstance(layout, Morton):
        vec("morton.bits", layout.bits, 32, width=4)
    elif isinstance(layout, (Coo, Csr, Csc)):
        _int(layout.nnz, 64, ctx, "nnz", L)
    elif isinstance(layout, Csf):
        _int(layout.nnz, 64, ctx, "csf.nnz", L)
        L += 8
        vec("csf.mode_order", layout.mode_order, 32, width=4)
    elif isinstance(layout, BlockPaged):
        for name, bits, rel in (
            ("page_size", 32, 0), ("num_pages", 64, 4), ("paged_axis", 32, 12), ("num_seqs", 32, 16),
            ("kv_role", 8, 20), ("layer_index", 32, 21), ("block_table_index_type", 8, 25),
        ):
            _int(getattr(layout, name), bits, ctx, f"block_paged.{name}", L + rel)
    elif isinstance(layout, CompositeHead):
        _int(layout.composition_rule, 8, ctx, "composite.composition_rule", L)
        _int(layout.combine_op, 8, ctx, "composite.combine_op", L + 1)
        _int(layout.member_count, 32, ctx, "composite.member_count", L + 4)
    elif isinstance(layout, Hilbert):
        _int(layout.order, 32, ctx, "hilbert.order", L)
        _int(layout.rank, 32, ctx, "hilbert.rank", L + 4)
    elif isinstance(layout, PrivateLayout):
        _int(layout.extension_layout_id, 64, ctx, "private_layout.extension_layout_id", L)
        if not isinstance(layout.data, (bytes, bytearray)) or len(layout.data) > NONE_U32:
            raise ctx.err(FormatError, "private layout data must be bytes shorter than 4 GiB", "private_layout.data", L + 12)


def _validate_layout_semantics(desc: Descriptor, ctx: _Ctx) -> None:
    layout = desc.layout
    shape = desc.shape
    r = len(shape)
    L = ctx.layout
    if isinstance(layout, Strided):
        pass  # any i64 stride (negative and zero allowed); rank 0 rejected above
    elif isinstance(layout, Tiled):
        t = layout
        while t is not None:
            for k, v in enumerate(t.tile_shape):
                if v == 0:
                    raise ctx.err(FormatError, "tile extent must be > 0", f"tiled.tile_shape[{k}]", L + 8 * k)
            L = L + 8 * r + 4 + (8 * r if t.outer_layout == 3 else 0) + (8 * r if t.inner_layout == 3 else 0)
            t = t.inner
    elif isinstance(layout, Morton):
        for k, b in enumerate(layout.bits):
            if b == 0:
                raise ctx.err(FormatError, "morton_bits must be > 0", f"morton.bits[{k}]", L + 4 * k)
            d = shape[k]
            if d is not None and b < 64 and d > (1 << b):
                raise ctx.err(InconsistentError, f"shape[{k}] = {d} exceeds 2^{b}", f"morton.bits[{k}]", L + 4 * k)
    elif isinstance(layout, (Csr, Csc)):
        if r != 2:
            raise ctx.err(InconsistentError, f"a {LAYOUT_NAMES[layout.tag]} tensor must have rank 2, not {r}", "rank", 16)
    elif isinstance(layout, Csf):
        if r < 3:
            raise ctx.err(InconsistentError, f"a CSF tensor must have rank >= 3, not {r}", "rank", 16)
        if sorted(layout.mode_order) != list(range(r)):
            raise ctx.err(FormatError, f"mode_order {list(layout.mode_order)} is not a permutation of 0..{r - 1}", "csf.mode_order", L + 8)
    elif isinstance(layout, BlockPaged):
        if r != 3:
            raise ctx.err(InconsistentError, f"a block-paged tensor must have rank 3, not {r}", "rank", 16)
        if layout.page_size < 1:
            raise ctx.err(FormatError, "page_size must be >= 1", "block_paged.page_size", L)
        if layout.paged_axis != 0:
            raise ctx.err(FormatError, f"paged_axis {layout.paged_axis} must be 0", "block_paged.paged_axis", L + 12)
        if layout.kv_role not in (0, 1, 2):
            raise ctx.err(FormatError, f"kv_role {layout.kv_role} is not 0, 1 or 2", "block_paged.kv_role", L + 20)
        if layout.block_table_index_type not in (0, 1):
            raise ctx.err(FormatError, f"block_table_index_type {layout.block_table_index_type} is not 0 or 1", "block_paged.block_table_index_type", L + 25)
    elif isinstance(layout, CompositeHead):
        rule, op = layout.composition_rule, layout.combine_op
        if rule not in (1, 2, 3):
            raise ctx.err(FormatError, f"composition_rule {rule:#04x} is not partition (1), overlay (2) or group (3)", "composite.composition_rule", L)
        if rule == 2 and op not in (1, 2):
            raise ctx.err(FormatError, f"overlay combine_op {op:#04x} is not replace (1) or add (2)", "composite.combine_op", L + 1)
        if rule != 2 and op != 0:
            raise ctx.err(FormatError, f"combine_op must be 0 for a non-overlay composite, not {op:#04x}", "composite.combine_op", L + 1)
        if layout.member_count == NONE_U32:
            raise ctx.err(FormatError, "member_count 0xFFFFFFFF is reserved", "composite.member_count", L + 4)
    elif isinstance(layout, Hilbert):
        if layout.order == 0:
            raise ctx.err(FormatError, "hilbert_order must be > 0", "hilbert.order", L)
        if layout.rank != r or r < 2:
            raise ctx.err(InconsistentError, f"hilbert_rank {layout.rank} must equal the rank {r} and be >= 2", "hilbert.rank", L + 4)
        for k, d in enumerate(shape):
            if d is None or layout.order >= 64 or d != (1 << layout.order):
                raise ctx.err(InconsistentError, f"shape[{k}] = {d} is not 2^{layout.order}", f"shape[{k}]", ctx.shape + 8 * k)


def _validate_shard(desc: Descriptor, ctx: _Ctx) -> None:
    s = desc.shard
    assert s is not None
    r = len(desc.shape)
    if isinstance(desc.layout, (BlockPaged, Csf)):
        raise ctx.err(InconsistentError, f"a shard section is forbidden on a {LAYOUT_NAMES[desc.layout.tag]} layout", "flags", 10)
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
    if not isinstance(q, (PerTensorAffine, PerChannelAffine, PerBlockAffine, NF4, MXFP)):
        raise ctx.err(FormatError, f"{q!r} is not a quantization scheme", "quantization.scheme_tag", at)
    if structural:
        if isinstance(q, PerTensorAffine):
            _int(q.zero_point, 32, ctx, "quantization.zero_point", at + 8, signed=True)
        else:
            _int(q.axis, 32, ctx, "quantization.axis", at + 4)
            if not isinstance(q, PerChannelAffine):
                _int(q.block_size, 32, ctx, "quantization.block_size", at + 8)
            si_at = at + (8 if isinstance(q, PerChannelAffine) else 12)
            _int(q.scale_buffer_index, 32, ctx, "quantization.scale_buffer_index", si_at)
            if isinstance(q, (PerChannelAffine, PerBlockAffine)):
                zi = q.zero_point_buffer_index
                if zi is not None:
                    _int(zi, 32, ctx, "quantization.zero_point_buffer_index", si_at + 4)
                    if zi == NONE_U32:
                        raise ctx.err(InconsistentError, "use zero_point_buffer_index=None for SYMMETRIC", "quantization.zero_point_buffer_index", si_at + 4)
                if not isinstance(q.scale_type, ElementType):
                    raise ctx.err(FormatError, f"scale_type {q.scale_type!r} is not an ElementType", "quantization.scale_type", si_at + 8)
    if isinstance(q, PerTensorAffine):
        with np.errstate(over="ignore", under="ignore"):
            try:
                s32 = float(np.float32(q.scale))
            except (TypeError, ValueError):
                raise ctx.err(FormatError, f"scale {q.scale!r} is not a number", "quantization.scale", at + 4) from None
        if not math.isfinite(s32) or s32 == 0.0:
            raise ctx.err(FormatError, f"per-tensor scale {q.scale!r} (as float32: {s32!r}) must be finite and non-zero", "quantization.scale", at + 4)
    elif isinstance(q, PerChannelAffine):
        if q.scale_type.tag != 0x03:
            raise ctx.err(FormatError, f"per-channel scale_type {q.scale_type.name} is not float32", "quantization.scale_type", at + 16)
    elif isinstance(q, PerBlockAffine):
        if q.scale_type.tag not in _PER_BLOCK_SCALE_TYPES or ELEMENT_TYPES_BY_TAG.get(q.scale_type.tag) != q.scale_type:
            raise ctx.err(FormatError, f"per-block scale_type {q.scale_type.name} is not float16, bfloat16 or float32", "quantization.scale_type", at + 20)
        if not _pow2(q.block_size) or q.block_size < 2:
            why = "is not a power of two" if not _pow2(q.block_size) else "is less than 2"
            raise ctx.err(FormatError, f"block_size {q.block_size} {why}", "quantization.block_size", at + 8)
    elif isinstance(q, NF4):
        if not _pow2(q.block_size) or q.block_size < 8:
            why = "is not a power of two" if not _pow2(q.block_size) else "is less than 8"
            raise ctx.err(FormatError, f"NF4 block_size {q.block_size} {why}", "quantization.block_size", at + 8)
    elif isinstance(q, MXFP):
        if not _pow2(q.block_size) or not 16 <= q.block_size <= 2048:
            why = "is not a power of two" if not _pow2(q.block_size) else "is outside [16, 2048]"
            raise ctx.err(FormatError, f"MXFP block_size {q.block_size} {why}", "quantization.block_size", at + 8)


def _param_indices(q: Quantization) -> list[tuple[str, int, int]]:
    """(field name, buffer index, relative offset of the index field)."""
    if isinstance(q, PerTensorAffine):
        return []
    if isinstance(q, PerChannelAffine):
        out = [("scale_buffer_index", q.scale_buffer_index, 8)]
        if q.zero_point_buffer_index is not None:
            out.append(("zero_point_buffer_index", q.zero_point_buffer_index, 12))
        return out
    out = [("scale_buffer_index", q.scale_buffer_index, 12)]
    if isinstance(q, PerBlockAffine) and q.zero_point_buffer_index is not None:
        out.append(("zero_point_buffer_index", q.zero_point_buffer_index, 16))
    return out


def _layout_buffer_count(desc: Descriptor) -> int | None:
    """Buffers the layout itself owns (None: not fixed)."""
    t = desc.layout.tag
    if t in _DENSE_LAYOUTS:
        return 1
    if t == 0x06:
        return 2
    if t in (0x07, 0x08):
        return 3
    if t == 0x09:
        return 2 * len(desc.shape) + 1
    if t == 0x0A:
        return 3
    return None  # private layouts


def _validate_quantization(desc: Descriptor, ctx: _Ctx) -> int:
    """Quantization rules needing the descriptor; returns the number of parameter buffers."""
    q = desc.quantization
    assert q is not None
    Q = ctx.quant + 4
    et = desc.element_type
    shape = desc.shape
    r = len(shape)
    name = SCHEME_NAMES[q.scheme_tag]
    storage = {0x01: _AFFINE_STORAGE, 0x02: _AFFINE_STORAGE, 0x03: _PER_BLOCK_STORAGE, 0x04: _NF4_STORAGE, 0x05: _MXFP_STORAGE}[q.scheme_tag]
    if et.tag not in storage:
        raise ctx.err(InconsistentError, f"storage type {et.name} is not allowed with {name}", "type_tag", 14)
    if isinstance(q, PerTensorAffine):
        lo, hi = _storage_range(et)
        if not lo <= q.zero_point <= hi:
            raise ctx.err(InconsistentError, f"zero_point {q.zero_point} is outside the {et.name} range [{lo}, {hi}]", "quantization.zero_point", Q + 8)
        return 0
    if q.axis >= r:
        raise ctx.err(InconsistentError, f"axis {q.axis} is not less than rank {r}", "quantization.axis", Q + 4)
    S = shape[q.axis]
    if S is None:
        raise ctx.err(InconsistentError, f"shape[{q.axis}] (the quantization axis) is dynamic", "quantization.axis", Q + 4)
    layout = desc.layout
    paged = isinstance(layout, BlockPaged)
    if paged:
        if isinstance(q, PerBlockAffine) and (q.axis != 0 or q.block_size != layout.page_size):
            raise ctx.err(InconsistentError, f"block-paged per-block quantization needs axis 0 and block_size == page_size {layout.page_size}", "quantization.block_size" if q.axis == 0 else "quantization.axis", Q + (8 if q.axis == 0 else 4))
        if isinstance(q, PerChannelAffine) and q.axis == 0:
            raise ctx.err(InconsistentError, "per-channel quantization must not use the paged axis 0", "quantization.axis", Q + 4)
    if isinstance(q, (PerBlockAffine, NF4)) and not paged:
        if S > 0 and q.block_size > S:
            raise ctx.err(InconsistentError, f"block_size {q.block_size} exceeds shape[{q.axis}] = {S}", "quantization.block_size", Q + 8)
    if isinstance(q, MXFP):
        if S == 0 or S % q.block_size:
            raise ctx.err(InconsistentError, f"shape[{q.axis}] = {S} is not a positive multiple of block_size {q.block_size}", "quantization.block_size", Q + 8)
    # parameter buffers
    nbuf = len(desc.buffers)
    own = _layout_buffer_count(desc)
    params = _param_indices(q)
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
    """Expected byte sizes of the parameter buffers, in _param_indices order."""
    q = desc.quantization
    if desc.layout.tag not in _DENSE_LAYOUTS and not isinstance(desc.layout, BlockPaged):
        return None
    if isinstance(q, PerChannelAffine):
        n = desc.shape[q.axis]
        assert n is not None
        return [4 * n, 4 * n]
    nb = num_blocks(desc)
    if nb is None:
        return None
    if isinstance(q, PerBlockAffine):
        return [nb * (q.scale_type.bits // 8), 4 * nb]
    if isinstance(q, NF4):
        return [4 * nb]
    if isinstance(q, MXFP):
        return [nb]
    return None


def _validate_buffer_count(desc: Descriptor, ctx: _Ctx, nparams: int) -> None:
    own = _layout_buffer_count(desc)
    n = len(desc.buffers)
    if own is None:
        return
    want = own + nparams
    if n != want:
        lname = LAYOUT_NAMES[desc.layout.tag]
        quant = f" + {nparams} quantization parameter buffer(s)" if nparams else ""
        raise ctx.err(InconsistentError, f"buffer_count {n}, but a {lname} tensor has {own}{quant}", "buffer_count", ctx.buffers)


def _validate_data_size(desc: Descriptor, ctx: _Ctx) -> None:
    sparse = _sparse_byte_sizes(desc)
    if sparse is not None:
        layout = desc.layout
        size = desc.size
        if size is not None and layout.nnz > size:  # type: ignore[union-attr]
            raise ctx.err(InconsistentError, f"nnz {layout.nnz} exceeds the {size} elements of the shape", "nnz", ctx.layout)  # type: ignore[union-attr]
        roles = ("values", "indices") if isinstance(layout, Coo) else ("values", "indices", "pointers")
        for i, (role, want_i) in enumerate(zip(roles, sparse)):
            got = desc.buffers[i].byte_size
            if got != want_i:
                raise ctx.err(
                    InconsistentError,
                    f"{LAYOUT_NAMES[layout.tag]} {role} buffer {i} holds {got} bytes, needs {want_i}",
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
    layout = desc.layout
    et = desc.element_type
    if not isinstance(layout, Strided) or et.kind == "private" or len(layout.strides) != len(desc.shape):
        return None
    if any(n is None or n == 0 for n in desc.shape):
        return None
    lo = sum(min(0, s * (n - 1)) for s, n in zip(layout.strides, desc.shape))  # type: ignore[operator]
    hi = sum(max(0, s * (n - 1)) for s, n in zip(layout.strides, desc.shape))  # type: ignore[operator]
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
    layout = desc.layout
    if desc.element_type.kind == "private":
        return None
    if isinstance(layout, Morton):
        total = sum(layout.bits)
        return buffer_size(desc.element_type, 1 << total) if total < 64 else None
    if layout.tag not in (0x01, 0x02, 0x40):
        return None
    n = desc.size
    if n is None:
        return None
    return buffer_size(desc.element_type, n)


def _sparse_byte_sizes(desc: Descriptor) -> list[int] | None:
    """Expected sizes of the layout buffers of COO / CSR / CSC tensors
    (values, then u64 index arrays); None for other layouts or dynamic shapes."""
    layout = desc.layout
    if not isinstance(layout, (Coo, Csr, Csc)) or desc.element_type.kind == "private":
        return None
    if any(d is None for d in desc.shape):
        return None
    values = buffer_size(desc.element_type, layout.nnz)
    if isinstance(layout, Coo):
        return [values, 8 * layout.nnz * len(desc.shape)]
    ptr_dim = desc.shape[0] if isinstance(layout, Csr) else desc.shape[1]
    return [values, 8 * layout.nnz, 8 * (ptr_dim + 1)]  # type: ignore[operator]


def padded_byte_size(desc: Descriptor) -> int | None:
    """The seed's per-block/NF4 padded data size: each outer row of the axis holds
    ``ceil(S/K)·K`` storage elements (None when no partial block exists)."""
    q = desc.quantization
    if not isinstance(q, (PerBlockAffine, NF4)) or desc.layout.tag not in (0x01, 0x02):
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
    if not isinstance(q, (PerBlockAffine, NF4, MXFP)):
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
    if isinstance(desc.layout, BlockPaged) and isinstance(q, (PerBlockAffine, NF4, MXFP)):
        return desc.layout.num_pages * desc.layout.page_size
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

_CHUNK = 1 << 24  # elements per vectorized pass


def _first_bad(arr: np.ndarray, bad_fn) -> int | None:  # type: ignore[no-untyped-def]
    for lo in range(0, arr.size, _CHUNK):
        bad = bad_fn(arr[lo : lo + _CHUNK])
        if bad.any():
            return lo + int(np.argmax(bad))
    return None


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
    if q is None or isinstance(q, PerTensorAffine):
        return

    if isinstance(q, PerChannelAffine):
        count = desc.shape[q.axis] if q.axis < len(desc.shape) else None
    else:
        count = num_blocks(desc)

    def view(idx: int, dt: str, start: int = 0) -> np.ndarray:
        """Entries of ``dt`` in buffer ``idx`` from entry ``start`` (at most ``count``)."""
        if idx >= len(data):
            raise UsageError(f"buffer {idx} contents not supplied", path=path, tensor=tensor, field=f"buffer[{idx}]")
        check_buffer_sizes(desc, data, indices=(idx,), path=path, tensor=tensor)
        raw = as_u8(data[idx])
        item = np.dtype(dt).itemsize
        out = raw[: raw.size - raw.size % item].view(dt)[start:]
        return out if count is None else out[:count]

    unit = "channel" if isinstance(q, PerChannelAffine) else "block"

    def fail(idx: int, i: int, item: int, what: str, value: str, start: int = 0) -> None:
        rel = start + i * item
        off = (data_offsets[idx] + rel) if data_offsets is not None else None
        where = "" if off is not None else f" (byte {rel} of the buffer)"
        raise FormatError(f"{what} of {unit} {i} is {value}{where}", path=path, tensor=tensor, field=f"buffer[{idx}]", offset=off)

    if isinstance(q, MXFP):
        a = view(q.scale_buffer_index, "u1")
        i = _first_bad(a, e8m0_reserved)
        if i is not None:
            fail(q.scale_buffer_index, i, 1, "MXFP scale byte", f"{int(a[i]):#04x} (reserved in float8_e8m0)")
        return
    if isinstance(q, NF4):
        a = view(q.scale_buffer_index, "<u4")
        i = _first_bad(a, lambda c: ((c & 0x7F800000) == 0x7F800000) | ((c >> 31).astype(bool) & ((c & 0x7FFFFFFF) != 0)))
        if i is not None:
            fail(q.scale_buffer_index, i, 4, "NF4 absmax scale", f"{float(a[i:i + 1].view('<f4')[0])!r} (must be finite and >= 0)")
        return
    st = q.scale_type  # PerChannelAffine / PerBlockAffine
    if st.bits == 16:
        a = view(q.scale_buffer_index, "<u2")
        expm = 0x7C00 if st.tag == 0x01 else 0x7F80
        fn = lambda c: ((c & expm) == expm) | ((c & 0x7FFF) == 0)  # noqa: E731
        item = 2
    else:
        a = view(q.scale_buffer_index, "<u4")
        fn = lambda c: ((c & 0x7F800000) == 0x7F800000) | ((c & 0x7FFFFFFF) == 0)  # noqa: E731
        item = 4
    i = _first_bad(a, fn)
    if i is not None:
        value = float(a[i : i + 1].view(st.dtype)[0])
        fail(q.scale_buffer_index, i, item, f"{st.name} scale", f"{value!r} (must be finite and non-zero)")
    if isinstance(q, PerChannelAffine) and q.zero_point_buffer_index is not None:
        # a zero-point array sharing the scale buffer follows the scales ([scales | zero_points])
        shared = q.zero_point_buffer_index == q.scale_buffer_index
        z = view(q.zero_point_buffer_index, "<i4", (count or 0) if shared else 0)
        lo, hi = _storage_range(desc.element_type)
        j = _first_bad(z, lambda c: (c < lo) | (c > hi))
        if j is not None:
            fail(q.zero_point_buffer_index, j, 4, "zero point", f"{int(z[j])}, outside the {desc.element_type.name} range [{lo}, {hi}]",
                 start=4 * (count or 0) if shared else 0)
