"""Descriptor codec: every MUST-reject rule (exact class, field, absolute offset),
round trips for every layout / scheme / section, and parameter-value checks.

Valid wire bytes are assembled here by ``wire()``, a deliberately tiny packer
written straight from metadata.md (not from our encoder), so round trips are
checked against an independent byte source.
"""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest

from hurray_interop.core.descriptor import (
    blocks_per_axis,
    decode_descriptor,
    decode_quantization,
    dense_byte_size,
    encode_descriptor,
    encode_quantization,
    num_blocks,
    private_element_type,
    validate_descriptor,
    validate_parameter_values,
)
from hurray_interop.core.elements import element_type
from hurray_interop.core.model import (
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
    Shard,
    Statistics,
    Strided,
    Tiled,
)
from hurray_interop.errors import BadMagicError, FormatError, InconsistentError, TruncatedError, UnsupportedError, UsageError

ET = element_type
F32 = ET("float32")

# ---------------------------------------------------------------------------
# independent wire builder (metadata.md § Binary Layout)


def handle(size, align=64, dev=0, sync=0, cls=0, res=0):
    return struct.pack("<QIBBBB", size, align, dev, sync, cls, res)


def wire(type_tag=0x03, layout_tag=0x01, shape=(3, 4), byte_offset=0, payload=b"", buffers=None,
         quant=None, shard=None, stats=None, ext=None, member=None, flags=0, major=1, minor=0,
         length=None, trailing=b""):
    if buffers is None:
        buffers = [handle(48)]
    body = struct.pack(f"<{len(shape)}Q", *shape) + struct.pack("<Q", byte_offset) + payload
    body += bytes([len(buffers)]) + b"".join(buffers)
    if quant is not None:
        flags |= 1
        body += struct.pack("<I", len(quant)) + quant
    if shard is not None:
        flags |= 2
        body += shard
    if stats is not None:
        flags |= 8
        body += stats
    if ext is not None:
        flags |= 4
        body += ext
    if member is not None:
        flags |= 0x10
        body += member
    body += trailing
    n = 20 + len(body) if length is None else length
    return struct.pack("<4sBBIIBBI", b"HRRY", major, minor, n, flags, type_tag, layout_tag, len(shape)) + body


def pb(axis=1, k=32, si=1, zi=0xFFFFFFFF, st=0x01, flags=None, ver=1, res=b"\0\0\0"):
    if flags is None:
        flags = 1 if zi == 0xFFFFFFFF else 0
    return struct.pack("<BBHIIIIB", 3, ver, flags, axis, k, si, zi, st) + res


def pc(axis=0, si=1, zi=0xFFFFFFFF, st=0x03, flags=None):
    if flags is None:
        flags = 1 if zi == 0xFFFFFFFF else 0
    return struct.pack("<BBHIIIB3s", 2, 1, flags, axis, si, zi, st, b"\0\0\0")


def pt(scale=0.5, zp=0, res=b"\0" * 4):
    return struct.pack("<BBHfi", 1, 1, 0, scale, zp) + res


def ab(tag, axis=0, k=32, si=1):
    return struct.pack("<BBHIII", tag, 1, 0, axis, k, si)


def stats_bytes(mask=1, nnz=7, res=0, res2=b"\0" * 4):
    return struct.pack("<IIQ6dBBBB", mask, res, nnz, 0.5, -1.0, 2.0, 2.0, 0.25, 1.0, 2, 4, 1, 0) + res2


def ext_bytes(bw=4, pf=2, res=b"\0\0", res2=b"\0\0"):
    return struct.pack("<IBBBBBB", bw, pf, 1, 0, 1, 2, 1) + res + struct.pack("<IBB", 1, 0, 0) + res2


def reject(raw, cls, field, offset, match, base=0):
    with pytest.raises(cls, match=match) as ei:
        decode_descriptor(raw, base=base)
    assert type(ei.value) is cls
    assert ei.value.field == field
    assert ei.value.offset == offset
    return ei.value


# per-block int8 [2,64] K=32 f16: count at 44, handles 45/61, qlen 77, scheme at 81
def pb_desc(**kw):
    q = pb(**{k: v for k, v in kw.items() if k in ("axis", "k", "si", "zi", "st", "flags", "ver", "res")})
    bufs = kw.get("buffers", [handle(128), handle(8)])
    return wire(type_tag=kw.get("type_tag", 0x10), shape=kw.get("shape", (2, 64)), buffers=bufs, quant=q)


# ---------------------------------------------------------------------------
# fixed header


def test_valid_builders_decode():
    # sanity: every base descriptor used below is valid as built
    for raw in (wire(), pb_desc(), wire(type_tag=0x10, shape=(4, 4), buffers=[handle(16), handle(16)], quant=pc())):
        assert encode_descriptor(decode_descriptor(raw)) == raw


def test_bad_magic():
    reject(b"HRRX" + wire()[4:], BadMagicError, "magic", 100, "bad magic", base=100)


@pytest.mark.parametrize("major", [0, 2, 255])
def test_unsupported_major(major):
    reject(wire(major=major), UnsupportedError, "version_major", 4, f"version {major}.0 is not supported")


def test_descriptor_length_below_header():
    reject(wire(length=19), FormatError, "descriptor_length", 6, "less than the 20-byte header")


def test_descriptor_length_beyond_buffer():
    reject(wire(length=62), TruncatedError, "descriptor_length", 6, "exceeds the 61 bytes available")


def test_minor0_requires_exact_length():
    raw = wire(trailing=b"\0\0\0")
    reject(raw, InconsistentError, "descriptor_length", 6, "exact length")


def test_minor1_ignores_trailing_bytes():
    raw = wire(minor=1, trailing=b"future")
    d = decode_descriptor(raw)
    assert d.version_minor == 1 and d.shape == (3, 4)


def test_reserved_flag_bits():
    reject(wire(flags=0x20), FormatError, "flags", 10, "reserved flag bits")
    reject(wire(flags=0x80000000), FormatError, "flags", 10, "reserved flag bits")


@pytest.mark.parametrize("tag", [0x00, 0xFF, 0x47, 0x80, 0xEF, 0x05, 0x21, 0x4C, 0x52])
def test_invalid_type_tags(tag):
    reject(wire(type_tag=tag), FormatError, "type_tag", 14, f"type_tag {tag:#04x}")


@pytest.mark.parametrize("tag", [0x00, 0xFF, 0x0C, 0x3F, 0x41, 0x7F, 0x80, 0xEF])
def test_invalid_layout_tags(tag):
    reject(wire(layout_tag=tag), FormatError, "layout_tag", 15, f"layout_tag {tag:#04x}")


def test_extension_flag_must_match_private_type():
    reject(wire(ext=ext_bytes(bw=32, pf=1)), InconsistentError, "flags", 10, "HAS_EXTENSION_TYPE set for standard type float32")
    reject(wire(type_tag=0xF3), InconsistentError, "flags", 10, "private type_tag 0xf3 without")


def test_rank_above_64():
    raw = wire(shape=(1,) * 65, buffers=[handle(4)])
    reject(raw, FormatError, "rank", 16, "rank 65 exceeds")


def test_rank_64_accepted():
    d = decode_descriptor(wire(shape=(1,) * 64, buffers=[handle(4)]))
    assert d.rank == 64


# ---------------------------------------------------------------------------
# buffer table


def test_zero_buffers_on_data_layout():
    reject(wire(buffers=[]), FormatError, "buffer_count", 44, "buffer_count is 0")


def test_handle_reserved_byte():
    reject(wire(buffers=[handle(48, res=1)]), FormatError, "buffer[0]._reserved", 60, "must be 0")


@pytest.mark.parametrize("dev", [0x09, 0x42, 0xEF, 0xFF])
def test_reserved_device(dev):
    reject(wire(buffers=[handle(48, dev=dev)]), FormatError, "buffer[0].device", 57, "device_tag")


def test_sync_mode_rules():
    reject(wire(buffers=[handle(48, sync=3)]), FormatError, "buffer[0].sync_mode", 58, "invalid sync_mode")
    reject(wire(buffers=[handle(48, sync=1)]), InconsistentError, "buffer[0].sync_mode", 58, "CPU buffer must use sync_mode 0")
    assert decode_descriptor(wire(buffers=[handle(48, dev=1, sync=2)])).buffers[0].sync_mode == 2


@pytest.mark.parametrize("cls", [0x04, 0xEF, 0xFF])
def test_reserved_memory_class(cls):
    reject(wire(buffers=[handle(48, cls=cls)]), FormatError, "buffer[0].memory_class", 59, "memory_class")


def test_private_memory_class_needs_private_device():
    reject(wire(buffers=[handle(48, cls=0xF0)]), InconsistentError, "buffer[0].memory_class", 59, "needs a private device_tag")
    assert decode_descriptor(wire(buffers=[handle(48, dev=0xF0, cls=0xF0)])).buffers[0].memory_class == 0xF0


@pytest.mark.parametrize("dev,cls,name", [(0, 3, "PEER is not allowed on device CPU"), (5, 1, "HOST_PINNED is not allowed on device WebGPU"),
                                          (3, 3, "PEER is not allowed on device Metal"), (8, 3, "on device OpenCL")])
def test_invalid_device_class_pairs(dev, cls, name):
    reject(wire(buffers=[handle(48, dev=dev, cls=cls)]), InconsistentError, "buffer[0].memory_class", 59, name)


def test_valid_device_class_pairs():
    for dev, cls in [(0, 2), (1, 3), (2, 3), (4, 3), (7, 3), (5, 0), (6, 2)]:
        assert decode_descriptor(wire(buffers=[handle(48, dev=dev, cls=cls)])).buffers[0].device == dev


def test_alignment_rules():
    reject(wire(buffers=[handle(48, align=48)]), FormatError, "buffer[0].alignment", 53, "not a power of two")
    reject(wire(buffers=[handle(48, align=32)]), FormatError, "buffer[0].alignment", 53, "below 64")
    reject(wire(buffers=[handle(48, align=0)]), FormatError, "buffer[0].alignment", 53, "not a power of two")
    # empty buffers: any power of two, including 1
    assert decode_descriptor(wire(shape=(0, 4), buffers=[handle(0, align=1)])).buffers[0].alignment == 1


def test_colocation_device_and_memory_class():
    q = pc(axis=0)
    base = dict(type_tag=0x10, shape=(4, 4), quant=q)
    reject(wire(buffers=[handle(16, dev=1), handle(16, dev=2)], **base), InconsistentError, "buffer[1].device", 73, "colocated")
    reject(wire(buffers=[handle(16, dev=1), handle(16, dev=1, cls=1)], **base), InconsistentError, "buffer[1].memory_class", 75, "colocated")


def test_dense_buffer_counts():
    reject(wire(buffers=[handle(48), handle(4)]), InconsistentError, "buffer_count", 44, "buffer_count 2, but a row-major tensor has 1")
    # quantized: 1 + parameter buffers (asymmetric per-channel needs 3)
    raw = wire(type_tag=0x10, shape=(4, 4), buffers=[handle(16), handle(16), handle(16), handle(16)], quant=pc(axis=0, zi=2))
    reject(raw, InconsistentError, "buffer_count", 44, r"has 1 \+ 2 quantization parameter buffer")


def test_sparse_buffer_counts():
    csr = struct.pack("<Q8x", 2)
    reject(wire(layout_tag=0x07, shape=(3, 3), payload=csr, buffers=[handle(8), handle(16)]),
           InconsistentError, "buffer_count", 60, "buffer_count 2, but a csr tensor has 3")
    coo = struct.pack("<QB7x", 2, 0)
    reject(wire(layout_tag=0x06, shape=(3, 3), payload=coo, buffers=[handle(8), handle(48), handle(8)]),
           InconsistentError, "buffer_count", 60, "buffer_count 3, but a coo tensor has 2")


def test_sparse_buffer_sizes():
    csr = struct.pack("<Q8x", 2)
    reject(wire(layout_tag=0x07, shape=(3, 3), payload=csr, buffers=[handle(8), handle(16), handle(24)]),
           InconsistentError, "buffer[2].byte_size", 61 + 32, "pointers buffer 2 holds 24 bytes, needs 32")
    reject(wire(layout_tag=0x07, shape=(3, 3), payload=struct.pack("<Q8x", 10), buffers=[handle(40), handle(80), handle(32)]),
           InconsistentError, "nnz", 44, "nnz 10 exceeds the 9 elements")


def test_byte_offset_rules():
    reject(wire(byte_offset=49, buffers=[handle(96)]), InconsistentError, "buffer[0].byte_size", 45, r"byte_offset 49 \+ 48 needed")
    reject(wire(byte_offset=49), InconsistentError, "byte_offset", 36, "exceeds buffer 0's byte_size 48")
    assert decode_descriptor(wire(byte_offset=16, buffers=[handle(64)])).byte_offset == 16
    coo = struct.pack("<QB7x", 2, 0)
    reject(wire(layout_tag=0x06, shape=(3, 3), byte_offset=8, payload=coo, buffers=[handle(16), handle(32)]),
           InconsistentError, "byte_offset", 36, "must be 0 for a coo layout")


def test_scalar_must_be_row_major():
    reject(wire(layout_tag=0x02, shape=(), buffers=[handle(4)]), FormatError, "layout_tag", 15, "rank-0 tensor must be row-major")
    reject(wire(layout_tag=0x03, shape=(), buffers=[handle(4)]), FormatError, "layout_tag", 15, "rank-0 tensor must be row-major")


def test_dense_byte_size_rules():
    reject(wire(buffers=[handle(47)]), InconsistentError, "buffer[0].byte_size", 45, r"float32 \[3, 4\] needs 48")
    # 6-bit: ceil(N/4)*3 (errata A3): 5 elements -> 6 bytes, not ceil(30/8) = 4
    reject(wire(type_tag=0x44, shape=(5,), buffers=[handle(4)]), InconsistentError, "buffer[0].byte_size", 37, "needs 6")
    assert decode_descriptor(wire(type_tag=0x44, shape=(5,), buffers=[handle(6)])).buffers[0].byte_size == 6
    # sub-byte: int4 [3,3] -> 5 bytes; bool [10] -> 2
    assert decode_descriptor(wire(type_tag=0x48, shape=(3, 3), buffers=[handle(5)])).shape == (3, 3)
    reject(wire(type_tag=0x20, shape=(10,), buffers=[handle(1)]), InconsistentError, "buffer[0].byte_size", 37, "needs 2")
    # column-major has the same size; Morton holds 2^sum(bits) elements
    reject(wire(layout_tag=0x02, buffers=[handle(44)]), InconsistentError, "buffer[0].byte_size", 45, "needs 48")
    reject(wire(layout_tag=0x05, payload=struct.pack("<2I", 2, 2), buffers=[handle(48)]), InconsistentError, "buffer[0].byte_size", 53, "needs 64")


# ---------------------------------------------------------------------------
# optional sections


def test_shard_rules():
    sh = struct.pack("<4Q", 8, 8, 6, 4)  # parent [8,8], offset [6,4]
    reject(wire(shard=sh), InconsistentError, "shard.offset[0]", 61 + 16, r"offset 6 \+ shape 3 exceeds parent_shape 8")
    sh = struct.pack("<4Q", 8, 8, 0, 0xFFFFFFFFFFFFFFFF)
    reject(wire(shard=sh), FormatError, "shard.offset[1]", 61 + 24, "dynamic sentinel")
    sh = struct.pack("<4Q", 0xFFFFFFFFFFFFFFFF, 8, 0, 0)
    reject(wire(shard=sh), FormatError, "shard.parent_shape[0]", 61, "dynamic sentinel")
    csf = struct.pack("<Q3I8x", 1, 0, 1, 2)
    bufs = [handle(4)] + [handle(8)] * 6
    sh = struct.pack("<6Q", 2, 2, 2, 0, 0, 0)
    reject(wire(layout_tag=0x09, shape=(2, 2, 2), payload=csf, buffers=bufs, shard=sh), InconsistentError, "flags", 10, "forbidden on a csf")


def test_statistics_rules():
    reject(wire(stats=stats_bytes(mask=0x40)), FormatError, "statistics.computed_mask", 61, "reserved computed_mask bits")
    reject(wire(stats=stats_bytes(res=1)), FormatError, "statistics._reserved", 65, "reserved statistics bytes")
    reject(wire(stats=stats_bytes(res2=b"\0\0\x01\0")), FormatError, "statistics._reserved", 61 + 68, "reserved statistics bytes")


def test_extension_type_rules():
    reject(wire(type_tag=0xF3, shape=(8,), buffers=[handle(4)], ext=ext_bytes(bw=4, pf=1)),
           InconsistentError, "extension_type.packing_factor", 53 + 4, "packing_factor 1 must be 2")
    reject(wire(type_tag=0xF3, shape=(8,), buffers=[handle(4)], ext=ext_bytes(bw=3, pf=2)),
           FormatError, "extension_type.bit_width", 53, "sub-byte bit_width 3")
    reject(wire(type_tag=0xF3, shape=(8,), buffers=[handle(4)], ext=ext_bytes(bw=0, pf=1)),
           FormatError, "extension_type.bit_width", 53, "bit_width must be > 0")
    reject(wire(type_tag=0xF3, shape=(8,), buffers=[handle(4)], ext=ext_bytes(bw=16, pf=2)),
           InconsistentError, "extension_type.packing_factor", 57, "must be 1 for bit_width 16")
    reject(wire(type_tag=0xF3, shape=(8,), buffers=[handle(4)], ext=ext_bytes(res=b"\0\x01")),
           FormatError, "extension_type._reserved", 53 + 10, "reserved extension-type bytes")


def test_composite_member_rules():
    reject(wire(member=b"\x02" + bytes(15)), FormatError, "composite_member.role", 61, "member_role 0x02")
    reject(wire(member=b"\x01" + bytes(14) + b"\x01"), FormatError, "composite_member._reserved", 62, "reserved composite-member bytes")


def head(rule=1, op=0, res=b"\0\0", count=2, **kw):
    payload = struct.pack("<BB", rule, op) + res + struct.pack("<I", count)
    return wire(layout_tag=0x0B, shape=(8, 8), payload=payload, buffers=kw.pop("buffers", []), **kw)


def test_composite_head_rules():
    for rule in (0x00, 0x04, 0xEF, 0xF0, 0xFF):
        reject(head(rule=rule), FormatError, "composite.composition_rule", 44, f"composition_rule {rule:#04x}")
    reject(head(rule=2, op=0), FormatError, "composite.combine_op", 45, "overlay combine_op 0x00")
    reject(head(rule=2, op=3), FormatError, "composite.combine_op", 45, "overlay combine_op 0x03")
    reject(head(rule=1, op=1), FormatError, "composite.combine_op", 45, "must be 0 for a non-overlay")
    reject(head(rule=3, op=2), FormatError, "composite.combine_op", 45, "must be 0 for a non-overlay")
    reject(head(res=b"\0\x01"), FormatError, "composite._reserved", 46, "reserved bytes")
    reject(head(count=0xFFFFFFFF), FormatError, "composite.member_count", 48, "0xFFFFFFFF is reserved")
    reject(head(buffers=[handle(256)]), InconsistentError, "buffer_count", 52, "composite head must have buffer_count 0")
    reject(head(byte_offset=8), InconsistentError, "byte_offset", 36, "must be 0 for a composite")
    reject(head(quant=pt()), InconsistentError, "flags", 10, "must not carry quantization")
    reject(head(member=b"\x01" + bytes(15)), InconsistentError, "flags", 10, "must not carry a composite-member")
    d = decode_descriptor(head(rule=2, op=1, count=0, shard=struct.pack("<4Q", 16, 8, 8, 0)))
    assert d.layout == CompositeHead(2, 1, 0) and d.shard == Shard((16, 8), (8, 0))


# ---------------------------------------------------------------------------
# layouts


def test_tiled_rules():
    def tiled(tile=(2, 2), outer=1, inner=1, res=b"\0\0", extra=b""):
        return wire(layout_tag=0x04, payload=struct.pack("<2QBB", *tile, outer, inner) + res + extra)

    reject(tiled(tile=(2, 0)), FormatError, "tiled.tile_shape[1]", 52, "tile extent must be > 0")
    reject(tiled(outer=4), FormatError, "tiled.outer_layout", 60, "outer_layout 4")
    reject(tiled(inner=5), FormatError, "tiled.inner_layout", 61, "inner_layout 5")
    reject(tiled(res=b"\x01\0"), FormatError, "tiled._reserved", 62, "reserved bytes")
    # nesting: 8 levels are fine, 9 are rejected
    level = struct.pack("<2QBB2x", 1, 1, 1, 4)
    last = struct.pack("<2QBB2x", 1, 1, 1, 1)
    assert isinstance(decode_descriptor(wire(layout_tag=0x04, payload=level * 7 + last)).layout, Tiled)
    with pytest.raises(FormatError, match="tiled nesting deeper than 8") as ei:
        decode_descriptor(wire(layout_tag=0x04, payload=level * 8 + last))
    assert ei.value.field == "tiled.inner_layout"


def test_morton_and_hilbert_rules():
    reject(wire(layout_tag=0x05, payload=struct.pack("<2I", 0, 2), buffers=[handle(64)]), FormatError, "morton.bits[0]", 44, "morton_bits must be > 0")
    reject(wire(layout_tag=0x05, shape=(5, 4), payload=struct.pack("<2I", 2, 2), buffers=[handle(64)]),
           InconsistentError, "morton.bits[0]", 44, "shape.0. = 5 exceeds 2.2")
    h = lambda order, rank, shape=(4, 4): wire(layout_tag=0x40, shape=shape, payload=struct.pack("<2I", order, rank), buffers=[handle(64)])  # noqa: E731
    reject(h(0, 2), FormatError, "hilbert.order", 44, "hilbert_order must be > 0")
    reject(h(2, 3), InconsistentError, "hilbert.rank", 48, "hilbert_rank 3 must equal the rank 2")
    reject(h(2, 2, shape=(4, 3)), InconsistentError, "shape[1]", 28, "is not 2.2")


def test_sparse_layout_rules():
    reject(wire(layout_tag=0x07, shape=(2, 2, 2), payload=struct.pack("<Q8x", 1), buffers=[handle(4), handle(8), handle(24)]),
           InconsistentError, "rank", 16, "csr tensor must have rank 2")
    reject(wire(layout_tag=0x08, shape=(3, 3), payload=struct.pack("<Q7xB", 2, 1), buffers=[handle(8), handle(16), handle(32)]),
           FormatError, "csc._reserved", 44 + 8, "reserved")
    reject(wire(layout_tag=0x06, shape=(3, 3), payload=struct.pack("<QB7x", 2, 2), buffers=[handle(8), handle(32)]),
           FormatError, "coo.is_sorted", 52, "is_sorted is 2")
    csf = lambda order, shape=(2, 2, 2): wire(layout_tag=0x09, shape=shape, payload=struct.pack(f"<Q{len(order)}I8x", 1, *order),  # noqa: E731
                                              buffers=[handle(4)] + [handle(8)] * (2 * len(shape)))
    reject(csf((0, 0, 1)), FormatError, "csf.mode_order", 52 + 8, "not a permutation")
    reject(csf((0, 1), shape=(2, 2)), InconsistentError, "rank", 16, "rank >= 3")
    assert decode_descriptor(csf((2, 0, 1))).layout == Csf(1, (2, 0, 1))


def bp(page=16, pages=4, axis=0, seqs=1, role=1, layer=3, bti=0, res=b"\0" * 6):
    return struct.pack("<IQIIBIB", page, pages, axis, seqs, role, layer, bti) + res


def test_block_paged_rules():
    bufs = [handle(2048), handle(4), handle(8)]
    ok = wire(layout_tag=0x0A, shape=(64, 2, 4), payload=bp(), buffers=bufs)
    assert decode_descriptor(ok).layout == BlockPaged(16, 4, 0, 1, 1, 3, 0)
    rej = lambda cls, field, off, m, shape=(64, 2, 4), **kw: reject(  # noqa: E731
        wire(layout_tag=0x0A, shape=shape, payload=bp(**kw), buffers=bufs), cls, field, off, m)
    rej(FormatError, "block_paged.paged_axis", 52 + 12, "paged_axis 1 must be 0", axis=1)
    rej(FormatError, "block_paged.kv_role", 52 + 20, "kv_role 3", role=3)
    rej(FormatError, "block_paged.block_table_index_type", 52 + 25, "block_table_index_type 2", bti=2)
    rej(FormatError, "block_paged._reserved", 52 + 26, "reserved", res=b"\0\0\0\0\0\x01")
    rej(FormatError, "block_paged.page_size", 52, "page_size must be >= 1", page=0)
    reject(wire(layout_tag=0x0A, shape=(64, 8), payload=bp(), buffers=bufs), InconsistentError, "rank", 16, "rank 3, not 2")
    reject(wire(layout_tag=0x0A, shape=(64, 2, 4), payload=bp(), buffers=bufs[:2]), InconsistentError, "buffer_count", 84, "has 3")
    sh = struct.pack("<6Q", 64, 2, 4, 0, 0, 0)
    reject(wire(layout_tag=0x0A, shape=(64, 2, 4), payload=bp(), buffers=bufs, shard=sh), InconsistentError, "flags", 10, "forbidden on a block-paged")
    # quantized: per-block axis 0 with block_size == page_size; scales per page slot (num_pages * page_size)
    qbufs = [handle(512), handle(4), handle(8), handle(128)]
    raw = wire(type_tag=0x10, layout_tag=0x0A, shape=(64, 2, 4), payload=bp(), buffers=qbufs, quant=pb(axis=0, k=16, si=3))
    d = decode_descriptor(raw)
    assert num_blocks(d) == 64 and encode_descriptor(d) == raw
    reject(wire(type_tag=0x10, layout_tag=0x0A, shape=(64, 2, 4), payload=bp(), buffers=qbufs, quant=pb(axis=0, k=32, si=3)),
           InconsistentError, "quantization.block_size", 153 + 8, "block_size == page_size 16")
    reject(wire(type_tag=0x10, layout_tag=0x0A, shape=(64, 2, 4), payload=bp(), buffers=qbufs, quant=pb(axis=0, k=16, si=2)),
           InconsistentError, "quantization.scale_buffer_index", 153 + 12, "refers to layout buffer 2")


# ---------------------------------------------------------------------------
# quantization: framing


def test_quantization_framing():
    q = pb()
    # quantization_length shorter than the scheme
    raw = wire(type_tag=0x10, shape=(2, 64), buffers=[handle(128), handle(8)], quant=q[:20])
    reject(raw, TruncatedError, "quantization_length", 77, "shorter than the 24-byte per-block")
    raw = wire(type_tag=0x10, shape=(2, 64), buffers=[handle(128), handle(8)], quant=q[:3])
    reject(raw, TruncatedError, "quantization_length", 77, "shorter than the 4-byte scheme header")
    # quantization_length running past descriptor_length
    raw = bytearray(pb_desc())
    struct.pack_into("<I", raw, 77, 40)
    reject(bytes(raw), TruncatedError, "quantization_length", 77, "exceeds the 24 bytes left")
    # writer padding inside quantization_length is accepted and preserved
    raw = wire(type_tag=0x10, shape=(2, 64), buffers=[handle(128), handle(8)], quant=q + b"\0" * 8)
    d = decode_descriptor(raw)
    assert d.quantization_padding == b"\0" * 8 and encode_descriptor(d) == raw


@pytest.mark.parametrize("tag,match", [(0x00, "invalid"), (0xFF, "invalid"), (0x06, "unknown or reserved"),
                                       (0x60, "unknown or reserved"), (0xF0, "private")])
def test_scheme_tags(tag, match):
    raw = wire(type_tag=0x10, shape=(2, 64), buffers=[handle(128)], quant=bytes([tag]) + pb()[1:])
    reject(raw, FormatError, "quantization.scheme_tag", 65, match)


def test_scheme_version_and_flags():
    reject(pb_desc(ver=0), FormatError, "quantization.scheme_version", 82, "scheme_version 0 is invalid")
    reject(pb_desc(ver=2), UnsupportedError, "quantization.scheme_version", 82, "scheme_version 2 is not supported")
    reject(pb_desc(flags=3), FormatError, "quantization.flags", 83, "reserved per-block affine flag bits")
    reject(pb_desc(res=b"\0\x01\0"), FormatError, "quantization._reserved", 81 + 21, "reserved")
    raw = wire(type_tag=0x49, shape=(64,), buffers=[handle(32), handle(8)], quant=struct.pack("<BBHIII", 4, 1, 1, 0, 32, 1))
    reject(raw, FormatError, "quantization.flags", 83 - 8, "reserved NF4 flag bits")


# ---------------------------------------------------------------------------
# per-tensor (0x01)


def ptd(q, type_tag=0x11):
    return wire(type_tag=type_tag, shape=(4,), buffers=[handle(4)], quant=q)


def test_per_tensor_rules():
    # scheme starts at 20+8+8+1+16 + 4 = 57
    for bad in (0.0, -0.0, float("nan"), float("inf"), float("-inf")):
        reject(ptd(pt(scale=bad)), FormatError, "quantization.scale", 61, "must be finite and non-zero")
    reject(ptd(pt(zp=256)), InconsistentError, "quantization.zero_point", 65, r"zero_point 256 is outside the uint8 range \[0, 255\]")
    reject(ptd(pt(zp=-1)), InconsistentError, "quantization.zero_point", 65, "outside the uint8 range")
    reject(ptd(pt(zp=8), type_tag=0x48), InconsistentError, "quantization.zero_point", 65, r"int4 range \[-8, 7\]")
    reject(ptd(pt(res=b"\0\0\0\x01")), FormatError, "quantization._reserved", 69, "reserved")
    reject(ptd(pt(), type_tag=0x03), InconsistentError, "type_tag", 14, "float32 is not allowed with per-tensor affine")
    d = decode_descriptor(ptd(pt(scale=0.02, zp=128)))
    assert d.quantization == PerTensorAffine(float(np.float32(0.02)), 128)
    # pyhurray's documented bytes for PerTensorAffine(0.02, 128) (docs/format-notes.md § 2.6)
    assert encode_quantization(d.quantization).hex() == "010100000ad7a33c8000000000000000"


# ---------------------------------------------------------------------------
# per-channel (0x02): int8 [4,4], buffers at 45/61/77, scheme at 97


def pcd(q, bufs=None, type_tag=0x10, shape=(4, 4)):
    return wire(type_tag=type_tag, shape=shape, buffers=bufs or [handle(16), handle(16), handle(16)], quant=q)


def test_per_channel_rules():
    reject(pcd(pc(zi=2, flags=1)), InconsistentError, "quantization.zero_point_buffer_index", 97 + 12, "SYMMETRIC is set but zero_point_buffer_index is 2")
    reject(pcd(pc(flags=0), bufs=[handle(16), handle(16)]), InconsistentError, "quantization.zero_point_buffer_index", 81 + 12, "SYMMETRIC is not set")
    reject(pcd(pc(zi=2, st=0x01)), FormatError, "quantization.scale_type", 97 + 16, "per-channel scale_type_tag 0x01 is not float32")
    reject(pcd(pc(axis=2, zi=2)), InconsistentError, "quantization.axis", 97 + 4, "axis 2 is not less than rank 2")
    reject(pcd(pc(si=0, zi=2)), InconsistentError, "quantization.scale_buffer_index", 97 + 8, "refers to the data buffer")
    reject(pcd(pc(si=5, zi=2)), InconsistentError, "quantization.scale_buffer_index", 97 + 8, "5 is not less than buffer_count 3")
    reject(pcd(pc(si=1, zi=3)), InconsistentError, "quantization.zero_point_buffer_index", 97 + 12, "3 is not less than buffer_count 3")
    reject(pcd(pc(zi=2), bufs=[handle(16), handle(12), handle(16)]), InconsistentError, "buffer[1].byte_size", 61, "scale buffer 1 holds 12 bytes, per-channel affine needs 16")
    reject(pcd(pc(zi=2), bufs=[handle(16), handle(16), handle(8)]), InconsistentError, "buffer[2].byte_size", 77, "zero_point buffer 2 holds 8 bytes")
    reject(pcd(pc(zi=2), type_tag=0x01, bufs=[handle(32), handle(16), handle(16)]), InconsistentError, "type_tag", 14, "float16 is not allowed")
    # dynamic quantization axis
    reject(pcd(pc(axis=0, zi=2), shape=(0xFFFFFFFFFFFFFFFF, 4)), InconsistentError, "quantization.axis", 97 + 4, "is dynamic")
    # int32/uint16 storage are allowed for per-channel
    assert decode_descriptor(pcd(pc(zi=2), type_tag=0x14, bufs=[handle(64), handle(16), handle(16)])).element_type.name == "int32"


# ---------------------------------------------------------------------------
# per-block (0x03): int8 [2,64] K=32 f16, scheme at 81


def test_per_block_rules():
    reject(pb_desc(k=48), FormatError, "quantization.block_size", 89, "block_size 48 is not a power of two")
    reject(pb_desc(k=1), FormatError, "quantization.block_size", 89, "block_size 1 is less than 2")
    reject(pb_desc(k=0), FormatError, "quantization.block_size", 89, "block_size 0 is not a power of two")
    reject(pb_desc(k=128), InconsistentError, "quantization.block_size", 89, r"block_size 128 exceeds shape\[1\] = 64")
    reject(pb_desc(st=0x04), FormatError, "quantization.scale_type", 101, "scale_type_tag 0x04")
    reject(pb_desc(st=0x10), FormatError, "quantization.scale_type", 101, "scale_type_tag 0x10")
    reject(pb_desc(zi=2, flags=1, buffers=[handle(128), handle(8), handle(16)]), InconsistentError,
           "quantization.zero_point_buffer_index", 113, "SYMMETRIC is set")
    # errata A6: non-symmetric with 0xFFFFFFFF is rejected too
    reject(pb_desc(flags=0), InconsistentError, "quantization.zero_point_buffer_index", 97, "SYMMETRIC is not set")
    reject(pb_desc(axis=2), InconsistentError, "quantization.axis", 85, "axis 2 is not less than rank 2")
    reject(pb_desc(si=0), InconsistentError, "quantization.scale_buffer_index", 93, "refers to the data buffer")
    reject(pb_desc(si=2), InconsistentError, "quantization.scale_buffer_index", 93, "2 is not less than buffer_count 2")
    reject(pb_desc(buffers=[handle(128), handle(6)]), InconsistentError, "buffer[1].byte_size", 61, "holds 6 bytes, per-block affine needs 8")
    reject(pb_desc(st=0x03), InconsistentError, "buffer[1].byte_size", 61, "needs 16")
    reject(pb_desc(zi=2, buffers=[handle(128), handle(8), handle(12)]), InconsistentError, "buffer[2].byte_size", 77, "zero_point buffer 2 holds 12 bytes, per-block affine needs 16")
    for tag, name in ((0x12, "int16"), (0x13, "uint16"), (0x14, "int32"), (0x03, "float32"), (0x40, "float8_e4m3")):
        size = ET(name).bits // 8 * 128
        reject(pb_desc(type_tag=tag, buffers=[handle(size), handle(8)]), InconsistentError, "type_tag", 14, f"{name} is not allowed with per-block affine")
    reject(wire(type_tag=0x10, shape=(2, 0xFFFFFFFFFFFFFFFF), buffers=[handle(128), handle(8)], quant=pb()),
           InconsistentError, "quantization.axis", 85, "is dynamic")


def test_per_block_empty_axis():
    # ADR-007: shape[axis] = 0 waives the upper bound; num_blocks = 0 and the parameter buffers are empty
    raw = wire(type_tag=0x10, shape=(2, 0), buffers=[handle(0, align=1), handle(0, align=1)], quant=pb(k=256))
    d = decode_descriptor(raw)
    assert num_blocks(d) == 0 and encode_descriptor(d) == raw
    reject(wire(type_tag=0x10, shape=(2, 0), buffers=[handle(0, align=1), handle(2)], quant=pb(k=256)),
           InconsistentError, "buffer[1].byte_size", 61, "needs 0")
    reject(wire(type_tag=0x10, shape=(2, 0), buffers=[handle(0, align=1), handle(0)], quant=pb(k=96)),
           FormatError, "quantization.block_size", 89, "not a power of two")


def test_per_block_partial_trailing_block_sizes():
    # int4 [2,100], K=64: 2 blocks per row; contiguous 100 B and the seed's padded 2*128/2 = 128 B both accepted
    for size in (100, 128):
        raw = wire(type_tag=0x48, shape=(2, 100), buffers=[handle(size), handle(8)], quant=pb(k=64))
        d = decode_descriptor(raw)
        assert blocks_per_axis(d) == 2 and num_blocks(d) == 4 and encode_descriptor(d) == raw
    reject(wire(type_tag=0x48, shape=(2, 100), buffers=[handle(112), handle(8)], quant=pb(k=64)),
           InconsistentError, "buffer[0].byte_size", 45, r"needs 100 \(or 128 with padded partial blocks\)")
    # without a partial block only the contiguous size is valid
    reject(wire(type_tag=0x48, shape=(2, 128), buffers=[handle(130), handle(8)], quant=pb(k=64)),
           InconsistentError, "buffer[0].byte_size", 45, "needs 128$")


def test_per_block_block_equals_axis_and_bf16():
    raw = wire(type_tag=0x11, shape=(3, 64), buffers=[handle(192), handle(6), handle(12)], quant=pb(k=64, zi=2, st=0x02))
    d = decode_descriptor(raw)
    assert d.quantization == PerBlockAffine(1, 64, 1, 2, ET("bfloat16")) and num_blocks(d) == 3


# ---------------------------------------------------------------------------
# NF4 (0x04) and MXFP (0x05)


def nf4d(k=32, shape=(64,), type_tag=0x49, bufs=None):
    return wire(type_tag=type_tag, shape=shape, buffers=bufs or [handle(32), handle(8)], quant=ab(4, k=k))


def test_nf4_rules():
    assert decode_descriptor(nf4d()).quantization == NF4(0, 32, 1)
    reject(nf4d(k=4), FormatError, "quantization.block_size", 81, "NF4 block_size 4 is less than 8")
    reject(nf4d(k=24), FormatError, "quantization.block_size", 81, "NF4 block_size 24 is not a power of two")
    reject(nf4d(type_tag=0x48), InconsistentError, "type_tag", 14, "int4 is not allowed with NF4")
    reject(nf4d(type_tag=0x11, bufs=[handle(64), handle(8)]), InconsistentError, "type_tag", 14, "uint8 is not allowed with NF4")
    reject(nf4d(bufs=[handle(32), handle(4)]), InconsistentError, "buffer[1].byte_size", 53, "NF4 needs 8")
    reject(nf4d(k=128), InconsistentError, "quantization.block_size", 81, "exceeds shape")
    # partial block: 72 elements, K=64 -> 2 blocks
    d = decode_descriptor(nf4d(k=64, shape=(72,), bufs=[handle(36), handle(8)]))
    assert num_blocks(d) == 2


def mxd(k=32, shape=(2, 64), type_tag=0x40, bufs=None, axis=1):
    return wire(type_tag=type_tag, shape=shape, buffers=bufs or [handle(128), handle(4)], quant=ab(5, axis=axis, k=k))


def test_mxfp_rules():
    assert decode_descriptor(mxd()).quantization == MXFP(1, 32, 1)
    for k, why in ((8, "is outside"), (4096, "is outside"), (48, "is not a power of two"), (0, "is not a power of two")):
        reject(mxd(k=k), FormatError, "quantization.block_size", 89, f"MXFP block_size {k} {why}")
    reject(mxd(shape=(2, 48), bufs=[handle(96), handle(4)]), InconsistentError, "quantization.block_size", 89, r"shape\[1\] = 48 is not a positive multiple of block_size 32")
    reject(mxd(shape=(2, 0), bufs=[handle(0, align=1), handle(0, align=1)]), InconsistentError, "quantization.block_size", 89, "not a positive multiple")
    reject(mxd(type_tag=0x11), InconsistentError, "type_tag", 14, "uint8 is not allowed with MXFP")
    reject(mxd(type_tag=0x42), InconsistentError, "type_tag", 14, "float8_e8m0 is not allowed with MXFP")
    reject(mxd(bufs=[handle(128), handle(2)]), InconsistentError, "buffer[1].byte_size", 61, "MXFP needs 4")
    reject(mxd(axis=2), InconsistentError, "quantization.axis", 85, "axis 2 is not less than rank 2")
    # every MXFP storage type with its packed size (6-bit: ceil(N/4)*3)
    for tag, size in ((0x41, 128), (0x43, 64), (0x44, 96), (0x45, 96), (0x10, 128), (0x48, 64)):
        assert decode_descriptor(mxd(type_tag=tag, bufs=[handle(size), handle(4)])).element_type.tag == tag


def test_dynamic_dims_round_trip_and_other_axis():
    # dynamic dimension on a non-quantized axis: accepted; sizes not computed
    raw = wire(type_tag=0x10, shape=(0xFFFFFFFFFFFFFFFF, 64), buffers=[handle(4096), handle(64)], quant=pb())
    d = decode_descriptor(raw)
    assert d.shape == (None, 64) and d.size is None and num_blocks(d) is None and dense_byte_size(d) is None
    assert encode_descriptor(d) == raw


# ---------------------------------------------------------------------------
# round trips against hand-built bytes


def rt(desc, raw):
    assert encode_descriptor(desc) == raw
    assert decode_descriptor(raw) == desc


def cpu(n, align=64):
    return BufferHandle(n, align)


def test_round_trip_every_layout():
    rt(Descriptor(F32, (3, 4), (cpu(48),)), wire())
    rt(Descriptor(F32, (3, 4), (cpu(48),), layout=ColumnMajor()), wire(layout_tag=0x02))
    rt(Descriptor(F32, (3, 4), (cpu(48),), layout=Strided((-4, 0))), wire(layout_tag=0x03, payload=struct.pack("<2q", -4, 0)))
    inner = Tiled((1, 2), 2, 3, inner_strides=(2, 1))
    t = Tiled((2, 2), 3, 4, outer_strides=(2, -1), inner=inner)
    payload = struct.pack("<2QBB2x2q", 2, 2, 3, 4, 2, -1) + struct.pack("<2QBB2x2q", 1, 2, 2, 3, 2, 1)
    rt(Descriptor(F32, (3, 4), (cpu(48),), layout=t), wire(layout_tag=0x04, payload=payload))
    rt(Descriptor(F32, (4, 4), (cpu(64),), layout=Morton((2, 2))), wire(layout_tag=0x05, shape=(4, 4), payload=struct.pack("<2I", 2, 2), buffers=[handle(64)]))
    rt(Descriptor(F32, (3, 3), (cpu(8), cpu(32)), layout=Coo(2, True)),
       wire(layout_tag=0x06, shape=(3, 3), payload=struct.pack("<QB7x", 2, 1), buffers=[handle(8), handle(32)]))
    rt(Descriptor(F32, (3, 3), (cpu(8), cpu(16), cpu(32)), layout=Csr(2)),
       wire(layout_tag=0x07, shape=(3, 3), payload=struct.pack("<Q8x", 2), buffers=[handle(8), handle(16), handle(32)]))
    rt(Descriptor(F32, (3, 5), (cpu(8), cpu(16), cpu(48)), layout=Csc(2)),
       wire(layout_tag=0x08, shape=(3, 5), payload=struct.pack("<Q8x", 2), buffers=[handle(8), handle(16), handle(48)]))
    rt(Descriptor(F32, (2, 2, 2), (cpu(4),) + (cpu(8),) * 6, layout=Csf(1, (1, 2, 0))),
       wire(layout_tag=0x09, shape=(2, 2, 2), payload=struct.pack("<Q3I8x", 1, 1, 2, 0), buffers=[handle(4)] + [handle(8)] * 6))
    rt(Descriptor(F32, (64, 2, 4), (cpu(2048), cpu(4), cpu(8)), layout=BlockPaged(16, 4, 0, 1, 2, 0xFFFFFFFF, 1)),
       wire(layout_tag=0x0A, shape=(64, 2, 4), payload=bp(role=2, layer=0xFFFFFFFF, bti=1), buffers=[handle(2048), handle(4), handle(8)]))
    rt(Descriptor(F32, (8, 8), (), layout=CompositeHead(3, 0, 5)), head(rule=3, count=5))
    rt(Descriptor(F32, (4, 4), (cpu(64),), layout=Hilbert(2, 2)), wire(layout_tag=0x40, shape=(4, 4), payload=struct.pack("<2I", 2, 2), buffers=[handle(64)]))
    rt(Descriptor(F32, (3, 4), (cpu(48),), layout=PrivateLayout(0xF7, 0x1234, b"xyz")),
       wire(layout_tag=0xF7, payload=struct.pack("<QI", 0x1234, 3) + b"xyz"))


def test_round_trip_every_scheme_and_section():
    i8 = ET("int8")
    rt(Descriptor(ET("uint8"), (4,), (cpu(4),), quantization=PerTensorAffine(0.5, 3)), ptd(pt(0.5, 3)))
    rt(Descriptor(i8, (4, 4), (cpu(16), cpu(16), cpu(16)), quantization=PerChannelAffine(0, 1, 2)), pcd(pc(zi=2)))
    rt(Descriptor(i8, (4, 4), (cpu(16), cpu(16)), quantization=PerChannelAffine(1, 1)), pcd(pc(axis=1), bufs=[handle(16), handle(16)]))
    rt(Descriptor(i8, (2, 64), (cpu(128), cpu(8)), quantization=PerBlockAffine(1, 32, 1)), pb_desc())
    rt(Descriptor(ET("uint4"), (64,), (cpu(32), cpu(8)), quantization=NF4(0, 32, 1)), nf4d())
    rt(Descriptor(ET("float8_e4m3"), (2, 64), (cpu(128), cpu(4)), quantization=MXFP(1, 32, 1)), mxd())
    stats = Statistics(1 | 2 | 4 | 8 | 16 | 32, 7, 0.5, -1.0, 2.0, 2.0, 0.25, 1.0, 2, 4, 1, 0)
    ext = ExtensionType(4, 2, 1, 0, 1, 2, 1, 1, 0, 0)
    sh = Shard((4, 4), (1, 0))
    # every section at once, in wire order: quantization, shard, statistics, extension, member
    raw = wire(type_tag=0xF5, shape=(3, 4), buffers=[handle(6)], shard=struct.pack("<4Q", 4, 4, 1, 0),
               stats=stats_bytes(mask=63), ext=ext_bytes(), member=b"\x00" + bytes(15))
    d = decode_descriptor(raw)
    assert d.statistics == stats and d.extension_type == ext and d.shard == sh and d.composite_member == CompositeMember(0)
    assert d.element_type == private_element_type(0xF5, ext) and d.element_type.kind == "private"
    assert encode_descriptor(d) == raw
    raw = wire(type_tag=0x10, shape=(3, 4), buffers=[handle(12)], quant=pt(0.25, 1), shard=struct.pack("<4Q", 4, 4, 1, 0),
               stats=stats_bytes(mask=63), member=b"\x01" + bytes(15))
    rt(Descriptor(i8, (3, 4), (cpu(12),), quantization=PerTensorAffine(0.25, 1), shard=sh, statistics=stats,
                  composite_member=CompositeMember(1)), raw)
    # a private element type cannot carry a standard quantization scheme
    raw = wire(type_tag=0xF5, shape=(3, 4), buffers=[handle(6)], quant=pt(0.25, 1), ext=ext_bytes())
    reject(raw, InconsistentError, "type_tag", 14, "private_0xf5 is not allowed with per-tensor affine")
    # scalar (rank 0) and the minimum 45-byte descriptor
    raw = wire(shape=(), buffers=[handle(4)])
    assert len(raw) == 45
    rt(Descriptor(F32, (), (cpu(4),)), raw)
    rt(Descriptor(F32, (), (cpu(4),), version_minor=3), wire(shape=(), buffers=[handle(4)], minor=3))


def test_statistics_come_before_extension_on_the_wire():
    ext = ExtensionType(8, 1, 0, 1, 0, 0, 0, 0, 0, 0)
    d = Descriptor(private_element_type(0xF0, ext), (2,), (cpu(2),), statistics=Statistics(1, nnz=9), extension_type=ext)
    raw = encode_descriptor(d)
    assert raw[53:57] == struct.pack("<I", 1) and raw[61:69] == struct.pack("<Q", 9)  # statistics at 53
    assert raw[125:129] == struct.pack("<I", 8)  # extension type at 53 + 72
    assert struct.unpack_from("<I", raw, 10)[0] == 0x0C


# ---------------------------------------------------------------------------
# the strict writer never emits what the strict reader rejects


@pytest.mark.parametrize("desc,cls,field,match", [
    (Descriptor(ET("int8"), (2, 64), (cpu(128), cpu(8)), quantization=PerBlockAffine(1, 48, 1)), FormatError, "quantization.block_size", "48 is not a power of two"),
    (Descriptor(ET("int16"), (2, 64), (cpu(256), cpu(8)), quantization=PerBlockAffine(1, 32, 1)), InconsistentError, "type_tag", "int16 is not allowed"),
    (Descriptor(F32, (3, 4), (cpu(47),)), InconsistentError, "buffer[0].byte_size", "needs 48"),
    (Descriptor(F32, (3, 4), (cpu(48),), statistics=Statistics(computed_mask=0x40)), FormatError, "statistics.computed_mask", "reserved"),
    (Descriptor(F32, (3, 4), (cpu(48),), shard=Shard((3, 4), (1, 0))), InconsistentError, "shard.offset[0]", "exceeds parent_shape"),
    (Descriptor(F32, (3, 4), (cpu(48),), version_major=2), UnsupportedError, "version_major", "major must be 1"),
    (Descriptor(F32, (3, 4), (BufferHandle(48, 63),)), FormatError, "buffer[0].alignment", "not a power of two"),
    (Descriptor(F32, (3, 4), (cpu(48),), layout=Strided((1,))), InconsistentError, "strided.strides", "tuple of 2"),
    (Descriptor(F32, (3, 4), (cpu(48),), layout=Strided((1, 2**63))), FormatError, "strided.strides[1]", "signed 64-bit"),
    (Descriptor(F32, (3, -4), (cpu(48),)), FormatError, "shape[1]", "unsigned 64-bit"),
    (Descriptor(ET("uint8"), (4,), (cpu(4),), quantization=PerTensorAffine(1e39, 0)), FormatError, "quantization.scale", "finite"),
    (Descriptor(ET("uint8"), (4,), (cpu(4),), quantization=PerTensorAffine(1e-50, 0)), FormatError, "quantization.scale", "non-zero"),
    (Descriptor(ET("int8"), (4, 4), (cpu(16), cpu(16)), quantization=PerChannelAffine(0, 1, scale_type=ET("float16"))), FormatError, "quantization.scale_type", "not float32"),
    (Descriptor(F32, (3, 4), (cpu(48),), composite_member=CompositeMember(7)), FormatError, "composite_member.role", "0x07"),
])
def test_encoder_validates(desc, cls, field, match):
    with pytest.raises(cls, match=match) as ei:
        encode_descriptor(desc)
    assert ei.value.field == field
    with pytest.raises(cls):
        validate_descriptor(desc)


def test_validate_offsets_match_wire_positions():
    d = Descriptor(ET("int8"), (2, 64), (cpu(128), cpu(6)), quantization=PerBlockAffine(1, 32, 1))
    with pytest.raises(InconsistentError) as ei:
        validate_descriptor(d, path="m.hrry", tensor="w", base=4096)
    assert ei.value.offset == 4096 + 61 and ei.value.tensor == "w" and str(ei.value).startswith("m.hrry: tensor 'w': buffer[1].byte_size at offset 4157")


def test_decode_errors_carry_path_tensor_and_absolute_offset():
    raw = pb_desc(k=48)
    with pytest.raises(FormatError) as ei:
        decode_descriptor(b"\0" * 10 + raw, 10, path="x.hrry", tensor="blk.0", base=1000)
    e = ei.value
    assert (e.path, e.tensor, e.field, e.offset) == ("x.hrry", "blk.0", "quantization.block_size", 1000 + 10 + 89)


def test_quantization_codec_standalone():
    q = PerBlockAffine(1, 32, 1, None, ET("float16"))
    # docs/format-notes.md § 2.6 example bytes: symmetric(1, 32, 1, float16)
    assert encode_quantization(q).hex() == "030101000100000020000000" "01000000ffffffff01000000"
    assert decode_quantization(encode_quantization(q) + b"pad") == q
    with pytest.raises(FormatError, match="axis 1 is not less than rank 1") as ei:
        decode_quantization(encode_quantization(q), rank=1, base=200)
    assert ei.value.offset == 204
    assert encode_quantization(MXFP(1, 32, 1)).hex() == "0501000001000000" "2000000001000000"
    with pytest.raises(FormatError, match="MXFP block_size 8"):
        encode_quantization(MXFP(1, 8, 1))


def test_decode_accepts_numpy_and_memoryview():
    raw = pb_desc()
    arr = np.frombuffer(b"\0" * 3 + raw, np.uint8)
    assert decode_descriptor(arr, 3) == decode_descriptor(memoryview(raw))
    with pytest.raises(TruncatedError, match="magic"):
        decode_descriptor(raw, len(raw) + 5)
    with pytest.raises(UsageError, match="negative"):
        decode_descriptor(raw, -1)


# ---------------------------------------------------------------------------
# parameter values


def pv(desc_raw, scale_bytes, zp=None, offsets=None):
    d = decode_descriptor(desc_raw)
    data = [np.zeros(d.buffers[0].byte_size, np.uint8), np.frombuffer(scale_bytes, np.uint8)]
    if zp is not None:
        data.append(np.frombuffer(zp, np.uint8))
    validate_parameter_values(d, data, data_offsets=offsets, tensor="t")


@pytest.mark.parametrize("bad,what", [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf"), (0.0, "0.0"), (-0.0, "-0.0")])
def test_f16_scales_finite_nonzero(bad, what):
    good = np.array([1.0, -2.0, 6e-8, 65504.0], np.float16)  # incl. a subnormal and the max
    pv(pb_desc(shape=(2, 64), buffers=[handle(128), handle(8)]), good.tobytes())
    s = good.copy()
    s[2] = bad
    with pytest.raises(FormatError, match=f"float16 scale of block 2 is {what}") as ei:
        pv(pb_desc(), s.tobytes(), offsets=[0, 10_000])
    assert ei.value.field == "buffer[1]" and ei.value.offset == 10_004 and ei.value.tensor == "t"


def test_bf16_and_f32_scales():
    s = np.array([1.0, 2.0, 3.0, np.nan], ml_dtypes.bfloat16)
    with pytest.raises(FormatError, match="bfloat16 scale of block 3 is nan") as ei:
        pv(pb_desc(st=0x02), s.tobytes())
    assert ei.value.offset is None and "byte 6 of the buffer" in str(ei.value)
    s = np.array([1.0, 2.0, 3.0, 4.0], ml_dtypes.bfloat16)
    s[1] = 0
    with pytest.raises(FormatError, match="bfloat16 scale of block 1 is 0.0"):
        pv(pb_desc(st=0x02), s.tobytes())
    # a bf16 bit pattern that is finite as bf16 but would be inf/NaN as f16 (0x7f00 ~ 1.7e38) is fine
    pv(pb_desc(st=0x02), np.array([1.7e38, 1, 1, 1], ml_dtypes.bfloat16).tobytes())
    f = np.array([1, 1, 1, 1], np.float32)
    pv(pb_desc(st=0x03, buffers=[handle(128), handle(16)]), f.tobytes())
    f[3] = np.float32("inf")
    with pytest.raises(FormatError, match="float32 scale of block 3 is inf"):
        pv(pb_desc(st=0x03, buffers=[handle(128), handle(16)]), f.tobytes())


def test_mxfp_scale_bytes():
    pv(mxd(), bytes([1, 127, 254, 200]))
    for bad in (0x00, 0xFF):
        with pytest.raises(FormatError, match=f"MXFP scale byte of block 2 is {bad:#04x}") as ei:
            pv(mxd(), bytes([1, 127, bad, 200]), offsets=[0, 777])
        assert ei.value.offset == 779


def test_nf4_scales():
    pv(nf4d(), np.array([0.0, 3.5], np.float32).tobytes())  # zero absmax is allowed (>= 0)
    pv(nf4d(), np.array([-0.0, 3.5], np.float32).tobytes())
    for bad in (-1.0, np.nan, np.inf):
        with pytest.raises(FormatError, match="NF4 absmax scale of block 1"):
            pv(nf4d(), np.array([1.0, bad], np.float32).tobytes())


def test_per_channel_zero_points_in_storage_range():
    raw = pcd(pc(zi=2), type_tag=0x11, bufs=[handle(16), handle(16), handle(16)])
    scales = np.ones(4, np.float32).tobytes()
    pv(raw, scales, np.array([0, 255, 128, 7], np.int32).tobytes())
    with pytest.raises(FormatError, match=r"zero point of channel 3 is 256, outside the uint8 range \[0, 255\]") as ei:
        pv(raw, scales, np.array([0, 255, 128, 256], np.int32).tobytes(), offsets=[0, 100, 200])
    assert ei.value.field == "buffer[2]" and ei.value.offset == 212
    with pytest.raises(FormatError, match="float32 scale of channel 0 is 0.0"):
        pv(raw, np.zeros(4, np.float32).tobytes(), np.zeros(4, np.int32).tobytes())


def test_shared_scale_and_zero_point_buffer():
    # quantization.md: one buffer entry may hold [scales | zero_points] end to end
    raw = pcd(pc(zi=1), type_tag=0x11, bufs=[handle(16), handle(32)])
    d = decode_descriptor(raw)
    assert d.quantization == PerChannelAffine(0, 1, 1)
    both = np.concatenate([np.ones(4, np.float32).view(np.int32), np.array([0, 1, 2, 300], np.int32)])
    with pytest.raises(FormatError, match="zero point of channel 3 is 300") as ei:
        validate_parameter_values(d, [np.zeros(16, np.uint8), both.view(np.uint8)], data_offsets=[0, 1000])
    assert ei.value.offset == 1000 + 16 + 12
    both[-1] = 255  # scales are not read as zero points and vice versa
    validate_parameter_values(d, [np.zeros(16, np.uint8), both.view(np.uint8)])
    # the shared buffer must hold both arrays
    reject(pcd(pc(zi=1), type_tag=0x11, bufs=[handle(16), handle(16)]), InconsistentError, "buffer[1].byte_size", 61, "needs 32")


def test_parameter_values_are_vectorized():
    # a per-element Python loop over 1M scales would run millions of Python lines; the
    # vectorized check runs a few hundred whatever the count
    from opcount import counting

    n = 1_000_000
    d = Descriptor(ET("int8"), (n, 32), (cpu(n * 32), cpu(2 * n)), quantization=PerBlockAffine(1, 32, 1))
    validate_descriptor(d)
    scales = np.full(n, 0x3C00, np.uint16)  # 1.0
    scales[-1] = 0x7E00  # NaN in the very last block
    with counting() as c:
        with pytest.raises(FormatError, match=f"block {n - 1} is nan"):
            validate_parameter_values(d, [np.zeros(1, np.uint8), scales.view(np.uint8)])
    assert c.lines < 10_000, c.lines


# ---------------------------------------------------------------------------
# robustness: every layout / scheme / section path under truncation and bit flips


def corpus():
    inner = struct.pack("<2QBB2x2q", 1, 2, 2, 3, 2, 1)
    return [
        wire(layout_tag=0x04, payload=struct.pack("<2QBB2x2q", 2, 2, 3, 4, 2, -1) + inner),
        wire(layout_tag=0x05, shape=(4, 4), payload=struct.pack("<2I", 2, 2), buffers=[handle(64)]),
        wire(layout_tag=0x06, shape=(3, 3), payload=struct.pack("<QB7x", 2, 1), buffers=[handle(8), handle(32)]),
        wire(layout_tag=0x08, shape=(3, 5), payload=struct.pack("<Q8x", 2), buffers=[handle(8), handle(16), handle(48)]),
        wire(layout_tag=0x09, shape=(2, 2, 2), payload=struct.pack("<Q3I8x", 1, 1, 2, 0), buffers=[handle(4)] + [handle(8)] * 6),
        wire(type_tag=0x10, layout_tag=0x0A, shape=(64, 2, 4), payload=bp(), buffers=[handle(512), handle(4), handle(8), handle(128)],
             quant=pb(axis=0, k=16, si=3)),
        head(rule=2, op=1, shard=struct.pack("<4Q", 16, 8, 8, 0)),
        wire(layout_tag=0x40, shape=(4, 4), payload=struct.pack("<2I", 2, 2), buffers=[handle(64)]),
        wire(layout_tag=0xF7, payload=struct.pack("<QI", 0x1234, 3) + b"xyz"),
        wire(type_tag=0xF5, shape=(3, 4), buffers=[handle(6)], shard=struct.pack("<4Q", 4, 4, 1, 0),
             stats=stats_bytes(mask=63), ext=ext_bytes(), member=b"\x00" + bytes(15)),
        ptd(pt(0.5, 3)),
        pcd(pc(zi=2)),
        pb_desc(zi=2, buffers=[handle(128), handle(8), handle(16)]),
        nf4d(),
        mxd(),
        wire(type_tag=0x10, shape=(0xFFFFFFFFFFFFFFFF, 64), buffers=[handle(4096), handle(64)], quant=pb()),
    ]


def test_corpus_truncation_and_bit_flips_raise_only_typed_errors():
    for raw in corpus():
        d = decode_descriptor(raw)
        assert encode_descriptor(d) == raw
        for n in range(len(raw)):
            with pytest.raises(TruncatedError):
                decode_descriptor(raw[:n])
        for bit in range(len(raw) * 8):
            mutated = bytearray(raw)
            mutated[bit // 8] ^= 1 << (bit % 8)
            try:
                d = decode_descriptor(bytes(mutated))
            except (FormatError, UnsupportedError) as exc:
                assert exc.field and exc.offset is not None and 0 <= exc.offset <= len(raw), (raw.hex(), bit, exc)
                continue
            assert encode_descriptor(d) == bytes(mutated)


# ---------------------------------------------------------------------------
# the writer never emits what the reader rejects: valid descriptors of every
# layout/scheme/section with one field replaced by a random value

import dataclasses  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_VALUES = st.one_of(
    st.sampled_from([0, 1, 2, 3, 4, 7, 8, 16, 32, 63, 64, 255, 256, 0xFFFFFFFF, -1, None, (), (1,), (2, 2), (0, 1, 2), 2**64]),
    st.integers(0, 300),
    st.builds(ET, st.sampled_from(["int8", "uint4", "float16", "bfloat16", "float32", "int16", "float8_e4m3"])),
)


def _mutate(obj, data, depth=0):
    """Replace one (possibly nested) dataclass field of ``obj`` with a random value."""
    fields = [f.name for f in dataclasses.fields(obj)]
    name = data.draw(st.sampled_from(fields))
    cur = getattr(obj, name)
    if dataclasses.is_dataclass(cur) and depth < 3 and data.draw(st.integers(0, 3)):
        new = _mutate(cur, data, depth + 1)
    elif isinstance(cur, tuple) and cur and dataclasses.is_dataclass(cur[0]) and data.draw(st.integers(0, 3)):
        j = data.draw(st.integers(0, len(cur) - 1))
        new = cur[:j] + (_mutate(cur[j], data, depth + 1),) + cur[j + 1 :]
    else:
        new = data.draw(_VALUES)
    return dataclasses.replace(obj, **{name: new})


_BASES: list = []


@settings(max_examples=200, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 15), st.data())
def test_encode_output_always_decodes_back(which, data):
    if not _BASES:
        _BASES.extend(decode_descriptor(raw) for raw in corpus())
    base = _BASES[which]
    try:
        desc = _mutate(base, data)
    except (TypeError, ValueError):
        return  # not constructible (frozen dataclass rejected the value)
    try:
        raw = encode_descriptor(desc)
    except (FormatError, UnsupportedError, UsageError) as exc:
        assert exc.field
        return
    assert decode_descriptor(raw) == desc
