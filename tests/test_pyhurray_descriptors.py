"""Cross-implementation tests against pyhurray (the upstream Rust reference binding).

Every descriptor is built twice, independently: once as our model object, once
through pyhurray's public constructors.  Our encoder must produce pyhurray's
bytes, our decoder must turn pyhurray's bytes into the equal model object, and
pyhurray must decode our bytes back to themselves.

The last part documents where pyhurray is laxer than the specification: it
accepts the input, we reject it, and the comment cites the rule.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hurray_interop.core.descriptor import (
    decode_descriptor,
    encode_descriptor,
    encode_quantization,
    validate_parameter_values,
)
from hurray_interop.core.elements import ELEMENT_TYPES, buffer_size, element_type
from hurray_interop.core.model import (
    MXFP,
    NF4,
    BufferHandle,
    ColumnMajor,
    CompositeHead,
    CompositeMember,
    Coo,
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
from hurray_interop.errors import FormatError, InconsistentError, UnsupportedError

hurray = pytest.importorskip("hurray")

SETTINGS = settings(max_examples=120, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))

AFFINE = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int4", "uint4", "int2", "uint2"]
PER_BLOCK = ["int8", "uint8", "int4", "uint4", "int2", "uint2"]
MXFP_STORAGE = ["float8_e4m3", "float8_e5m2", "float4_e2m1", "float6_e2m3", "float6_e3m2", "int8", "int4"]


def h_dtype(name: str):
    return getattr(hurray.dtype, name)


def cpu(n: int) -> BufferHandle:
    return BufferHandle.cpu(n)


def storage_range(name: str) -> tuple[int, int]:
    et = element_type(name)
    if et.kind == "uint":
        return 0, min((1 << et.bits) - 1, 2**31 - 1)
    return -(1 << (et.bits - 1)), (1 << (et.bits - 1)) - 1


def check_pair(ours: Descriptor, theirs_bytes: bytes) -> None:
    """The three-way agreement every case must satisfy."""
    mine = encode_descriptor(ours)
    assert mine == theirs_bytes
    assert decode_descriptor(theirs_bytes) == ours
    assert hurray.Descriptor.decode(mine).encode() == mine


# ---------------------------------------------------------------------------
# random cases


@st.composite
def shapes(draw, min_rank=0, max_rank=4, max_dim=6):
    r = draw(st.integers(min_rank, max_rank))
    return tuple(draw(st.integers(0, max_dim)) for _ in range(r))


@st.composite
def statistics(draw):
    """(our Statistics, pyhurray kwargs) with whole groups present or absent."""
    kw: dict = {}
    mask = 0
    vals: dict = {}
    f = st.floats(allow_nan=False, width=64)
    if draw(st.booleans()):
        kw["nnz"] = vals["nnz"] = draw(st.integers(0, 2**64 - 1))
        mask |= 1
    if draw(st.booleans()):
        kw["sparsity_ratio"] = vals["sparsity_ratio"] = draw(st.floats(0, 1))
        mask |= 2
    if draw(st.booleans()):
        for k in ("value_min", "value_max", "value_abs_max"):
            kw[k] = vals[k] = draw(f)
        mask |= 4
    if draw(st.booleans()):
        for k in ("value_mean", "value_stddev"):
            kw[k] = vals[k] = draw(f)
        mask |= 8
    if draw(st.booleans()):
        kw["nm_n"] = vals["nm_n"] = draw(st.integers(0, 255))
        kw["nm_m"] = vals["nm_m"] = draw(st.integers(0, 255))
        mask |= 16
    if draw(st.booleans()):
        kw["has_nan"] = draw(st.booleans())
        kw["has_inf"] = draw(st.booleans())
        vals["has_nan"], vals["has_inf"] = int(kw["has_nan"]), int(kw["has_inf"])
        mask |= 32
    return Statistics(computed_mask=mask, **vals), kw


@st.composite
def shard_for(draw, shape):
    extra = [draw(st.integers(0, 5)) for _ in shape]
    off = tuple(draw(st.integers(0, e)) for e in extra)
    parent = tuple(d + e for d, e in zip(shape, extra))
    return Shard(parent, off), hurray.Shard(list(parent), list(off))


@st.composite
def quantized(draw):
    """(dtype name, shape, our quantization, pyhurray quantization, aux buffer sizes)."""
    scheme = draw(st.sampled_from(["tensor", "channel", "block", "nf4", "mxfp"]))
    if scheme == "tensor":
        name = draw(st.sampled_from(AFFINE))
        shape = draw(shapes())
        scale = draw(st.floats(width=32, allow_nan=False, allow_infinity=False).filter(lambda x: x != 0))
        lo, hi = storage_range(name)
        zp = draw(st.integers(lo, hi))
        return name, shape, PerTensorAffine(scale, zp), hurray.PerTensorAffine(scale, zp), []
    if scheme == "channel":
        name = draw(st.sampled_from(AFFINE))
        shape = draw(shapes(min_rank=1))
        axis = draw(st.integers(0, len(shape) - 1))
        n = 4 * shape[axis]
        if draw(st.booleans()):
            return name, shape, PerChannelAffine(axis, 1), hurray.PerChannelAffine.symmetric(axis, 1), [n]
        return name, shape, PerChannelAffine(axis, 1, 2), hurray.PerChannelAffine.asymmetric(axis, 1, 2), [n, n]
    if scheme in ("block", "nf4"):
        name = "uint4" if scheme == "nf4" else draw(st.sampled_from(PER_BLOCK))
        kmin = 8 if scheme == "nf4" else 2
        shape = list(draw(shapes(min_rank=1, max_dim=5)))
        axis = draw(st.integers(0, len(shape) - 1))
        shape[axis] = draw(st.sampled_from([0, kmin, kmin + 1, 2 * kmin, 3 * kmin + 1]))
        S = shape[axis]
        kmax = max(kmin, S)
        k = draw(st.sampled_from([2**j for j in range(1, 8) if kmin <= 2**j <= kmax]))
        outer = int(np.prod([d for j, d in enumerate(shape) if j != axis], dtype=np.int64))
        nb = -(-S // k) * outer
        if scheme == "nf4":
            return name, tuple(shape), NF4(axis, k, 1), hurray.NF4(axis, k, 1), [4 * nb]
        stn = draw(st.sampled_from(["float16", "bfloat16", "float32"]))
        sz = element_type(stn).bits // 8
        if draw(st.booleans()):
            return (name, tuple(shape), PerBlockAffine(axis, k, 1, None, element_type(stn)),
                    hurray.PerBlockAffine.symmetric(axis, k, 1, h_dtype(stn)), [sz * nb])
        return (name, tuple(shape), PerBlockAffine(axis, k, 1, 2, element_type(stn)),
                hurray.PerBlockAffine.asymmetric(axis, k, 1, 2, h_dtype(stn)), [sz * nb, 4 * nb])
    name = draw(st.sampled_from(MXFP_STORAGE))
    shape = list(draw(shapes(min_rank=1, max_rank=3, max_dim=3)))
    axis = draw(st.integers(0, len(shape) - 1))
    k = draw(st.sampled_from([16, 32, 64]))
    shape[axis] = k * draw(st.integers(1, 3))
    outer = int(np.prod([d for j, d in enumerate(shape) if j != axis], dtype=np.int64))
    return name, tuple(shape), MXFP(axis, k, 1), hurray.MXFP(axis, k, 1), [shape[axis] // k * outer]


@st.composite
def cases(draw):
    """(our Descriptor, pyhurray Tensor)."""
    if draw(st.booleans()):
        name, shape, q, hq, aux = draw(quantized())
    else:
        name = draw(st.sampled_from(sorted(ELEMENT_TYPES)))
        shape, q, hq, aux = draw(shapes()), None, None, []
    n = int(np.prod(shape, dtype=np.int64))
    data = buffer_size(name, n)
    stats, skw = draw(statistics()) if draw(st.booleans()) else (None, None)
    shard, hshard = draw(shard_for(shape)) if shape and draw(st.booleans()) else (None, None)
    ours = Descriptor(
        element_type=element_type(name),
        shape=shape,
        buffers=tuple(cpu(s) for s in [data, *aux]),
        quantization=q,
        shard=shard,
        statistics=stats,
    )
    if isinstance(q, PerTensorAffine):  # the wire holds float32: compare with the rounded value
        ours = Descriptor(**{**ours.__dict__, "quantization": PerTensorAffine(float(np.float32(q.scale)), q.zero_point)})
    t = hurray.Tensor(
        bytes(data), h_dtype(name), list(shape),
        aux_buffers=[bytes(s) for s in aux] or None,
        quantization=hq,
        statistics=hurray.Statistics(**skw) if skw is not None else None,
        shard=hshard,
    )
    return ours, t


@SETTINGS
@given(cases())
def test_random_descriptors_agree_with_pyhurray(case):
    ours, t = case
    check_pair(ours, t.descriptor.encode())


@settings(max_examples=60, derandomize=True, deadline=None)
@given(quantized())
def test_quantization_scheme_bytes_agree_with_pyhurray(case):
    _, _, q, hq, _ = case
    if isinstance(q, PerTensorAffine):
        q = PerTensorAffine(float(np.float32(q.scale)), q.zero_point)
    assert encode_quantization(q) == hq.encode()
    assert hurray.decode_quantization(encode_quantization(q)) == hq


# ---------------------------------------------------------------------------
# layouts, sections and composites pyhurray can build


F32 = element_type("float32")


def layout_cases():
    return [
        (Descriptor(F32, (3, 4), (cpu(48),), layout=ColumnMajor()),
         hurray.Tensor(bytes(48), hurray.float32, [3, 4], layout=hurray.ColMajorLayout())),
        (Descriptor(F32, (3, 4), (cpu(48),), layout=Strided((1, -3))),
         hurray.Tensor(bytes(48), hurray.float32, [3, 4], layout=hurray.StridedLayout([1, -3]))),
        (Descriptor(F32, (3, 4), (cpu(48),), layout=Tiled((2, 2), 1, 4, inner=Tiled((1, 1), 3, 1, outer_strides=(2, 1)))),
         hurray.Tensor(bytes(48), hurray.float32, [3, 4], layout=hurray.TiledLayout(
             [2, 2], inner_layout="tiled", inner_tiled=hurray.TiledLayout([1, 1], outer_layout="strided", outer_strides=[2, 1])))),
        (Descriptor(F32, (4, 4), (cpu(64),), layout=Tiled((2, 2), 2, 3, inner_strides=(1, 2))),
         hurray.Tensor(bytes(64), hurray.float32, [4, 4], layout=hurray.TiledLayout(
             [2, 2], outer_layout="col_major", inner_layout="strided", inner_strides=[1, 2]))),
        (Descriptor(F32, (3, 4), (cpu(64),), layout=Morton((2, 2))),
         hurray.Tensor(bytes(64), hurray.float32, [3, 4], layout=hurray.MortonLayout([2, 2]))),
        (Descriptor(F32, (4, 4), (cpu(64),), layout=Hilbert(2, 2)),
         hurray.Tensor(bytes(64), hurray.float32, [4, 4], layout=hurray.HilbertLayout(2, 2))),
        (Descriptor(F32, (3, 3), (cpu(8), cpu(16), cpu(32)), layout=Csr(2)),
         hurray.Tensor(bytes(8), hurray.float32, [3, 3], aux_buffers=[bytes(16), bytes(32)], layout=hurray.CsrLayout(2))),
        (Descriptor(F32, (3, 3), (cpu(8), cpu(32)), layout=Coo(2, True)),
         hurray.Tensor(bytes(8), hurray.float32, [3, 3], aux_buffers=[bytes(32)], layout=hurray.CooLayout(2, True))),
        (Descriptor(F32, (4, 4), (cpu(64),), layout=PrivateLayout(0xF1, 77, b"abc")),
         hurray.Tensor(bytes(64), hurray.float32, [4, 4], layout=hurray.PrivateExtensionLayout(0xF1, 77, b"abc"))),
        (Descriptor(element_type("int8"), (), (cpu(1),), statistics=Statistics(computed_mask=1, nnz=1)),
         hurray.Tensor(bytes(1), hurray.int8, [], statistics=hurray.Statistics(nnz=1))),
    ]


@pytest.mark.parametrize("i", range(10))
def test_layouts_agree_with_pyhurray(i):
    ours, t = layout_cases()[i]
    check_pair(ours, t.descriptor.encode())


def test_extension_type_agrees_with_pyhurray():
    from hurray_interop.core.descriptor import private_element_type

    ext = ExtensionType(4, 2, 1, 0, 1, 2, 1, 1, 0, 0)
    ours = Descriptor(private_element_type(0xF3, ext), (8,), (cpu(4),), extension_type=ext)
    e = hurray.ExtensionType(4, is_float=True, sign_bits=1, exponent_bits=2, mantissa_bits=1, exponent_bias=1)
    t = hurray.Tensor(bytes(4), hurray.Dtype.from_tag(0xF3), [8], extension_type=e)
    check_pair(ours, t.descriptor.encode())


def test_composites_agree_with_pyhurray(tmp_path):
    members = [
        hurray.Tensor(bytes(128), hurray.float32, [8, 4], shard=hurray.Shard([8, 8], [0, 0])),
        hurray.Tensor(bytes(128), hurray.float32, [8, 4], shard=hurray.Shard([8, 8], [0, 4])),
    ]
    c = hurray.Composite("partition", shape=[8, 8], dtype=hurray.float32, members=members)
    check_pair(Descriptor(F32, (8, 8), (), layout=CompositeHead(1, 0, 2)), c.descriptor.encode())
    for off, m in zip([(0, 0), (0, 4)], c.members):
        check_pair(Descriptor(F32, (8, 4), (cpu(128),), shard=Shard((8, 8), off)), m.descriptor.encode())

    base = hurray.Tensor(bytes(256), hurray.float32, [8, 8], shard=hurray.Shard([8, 8], [0, 0]))
    fix = hurray.Tensor(bytes(16), hurray.float32, [2, 2], shard=hurray.Shard([8, 8], [3, 3]))
    ov = hurray.Composite("overlay", shape=[8, 8], dtype=hurray.float32, members=[base, fix], combine_op="add")
    check_pair(Descriptor(F32, (8, 8), (), layout=CompositeHead(2, 2, 2)), ov.descriptor.encode())
    roles = [CompositeMember(1), CompositeMember(0)]
    shards = [Shard((8, 8), (0, 0)), Shard((8, 8), (3, 3))]
    # pyhurray adds the 16-byte member section when it writes the overlay into a file:
    # our member descriptors must appear verbatim in that file, and decode back
    hurray.save(str(tmp_path / "ov.hrry"), {"ov": ov})
    blob = (tmp_path / "ov.hrry").read_bytes()
    for role, sh, shape, size in zip(roles, shards, [(8, 8), (2, 2)], [256, 16]):
        ours = Descriptor(F32, shape, (cpu(size),), shard=sh, composite_member=role)
        mine = encode_descriptor(ours)
        at = blob.find(mine)
        assert at > 0
        assert decode_descriptor(blob, at) == ours
    assert blob.find(encode_descriptor(Descriptor(F32, (8, 8), (), layout=CompositeHead(2, 2, 2)))) > 0


# ---------------------------------------------------------------------------
# where pyhurray is laxer than the specification


def _patch(b: bytes, at: int, fmt: str, value) -> bytes:
    out = bytearray(b)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


F32_3x4 = hurray.Tensor(bytes(48), hurray.float32, [3, 4]).descriptor.encode()  # 61 bytes, handle at 45


def _both(raw: bytes, cls, field: str, match: str):
    hurray.Descriptor.decode(raw)  # the reference accepts it ...
    with pytest.raises(cls, match=match) as ei:  # ... the spec says reject
        decode_descriptor(raw)
    assert ei.value.field == field
    return ei.value


def test_lax_version_major_zero():
    # versioning.md: a reader MUST reject a major version it does not support (docs/format-notes.md § 2.1)
    e = _both(_patch(F32_3x4, 4, "<B", 0), UnsupportedError, "version_major", "major must be 1")
    assert e.offset == 4


def test_lax_byte_size_inconsistent_with_shape():
    # docs/format-notes.md § 2.2: byte_size must match dtype × shape (47 bytes for float32 [3,4])
    e = _both(_patch(F32_3x4, 45, "<Q", 47), InconsistentError, "buffer[0].byte_size", "needs 48")
    assert e.offset == 45


def test_lax_byte_offset_beyond_buffer():
    # metadata.md: byte_offset MUST be <= buffers[0].byte_size
    e = _both(_patch(F32_3x4, 36, "<Q", 49), InconsistentError, "byte_offset", "exceeds buffer 0")
    assert e.offset == 36


def test_lax_cpu_peer_memory_class():
    # buffer-protocol.md: PEER is not a valid memory class for a CPU buffer
    e = _both(_patch(F32_3x4, 59, "<B", 3), InconsistentError, "buffer[0].memory_class", "PEER is not allowed on device CPU")
    assert e.offset == 59


def test_lax_rank0_strided():
    # data-model.md: a scalar (rank 0) is row-major only
    raw = hurray.Tensor(bytes(4), hurray.float32, []).descriptor.encode()
    _both(_patch(raw, 15, "<B", 3), FormatError, "layout_tag", "rank-0 tensor must be row-major")


def test_lax_unquantized_two_buffers():
    # metadata.md: a dense unquantized tensor has exactly one buffer
    t = hurray.Tensor(bytes(8), hurray.float32, [2], aux_buffers=[bytes(4)])
    _both(t.descriptor.encode(), InconsistentError, "buffer_count", "buffer_count 2, but a row-major tensor has 1")


def test_lax_per_block_int16_storage():
    # seed 000 § Valid Storage Types: int16 MUST be rejected for per-block affine
    t = hurray.Tensor(bytes(64), hurray.int16, [1, 32], aux_buffers=[bytes(2)],
                      quantization=hurray.PerBlockAffine.symmetric(1, 32, 1, hurray.float16))
    _both(t.descriptor.encode(), InconsistentError, "type_tag", "int16 is not allowed with per-block affine")


def test_lax_mxfp_uint8_storage():
    # seed 004 § Valid Storage Types: uint8 is not an MXFP storage type
    t = hurray.Tensor(bytes(32), hurray.uint8, [32], aux_buffers=[bytes([127])], quantization=hurray.MXFP(0, 32, 1))
    _both(t.descriptor.encode(), InconsistentError, "type_tag", "uint8 is not allowed with MXFP")


def test_lax_nf4_int4_storage():
    # nf4.md: storage MUST be uint4
    t = hurray.Tensor(bytes(8), hurray.dtype.int4, [16], aux_buffers=[bytes(4)], quantization=hurray.NF4(0, 16, 1))
    _both(t.descriptor.encode(), InconsistentError, "type_tag", "int4 is not allowed with NF4")


def test_lax_scale_buffer_too_small():
    # seed 000 § Referenced Buffers: scale buffer byte size MUST be num_blocks × sizeof(scale)
    t = hurray.Tensor(bytes(64), hurray.int8, [2, 32], aux_buffers=[bytes(2)],
                      quantization=hurray.PerBlockAffine.symmetric(1, 32, 1, hurray.float16))
    e = _both(t.descriptor.encode(), InconsistentError, "buffer[1].byte_size", "holds 2 bytes, per-block affine needs 4")
    assert e.offset == 61


def test_lax_axis_out_of_range_and_block_too_large():
    good = hurray.Tensor(bytes(8192), hurray.dtype.int4, [128, 128], aux_buffers=[bytes(256)],
                         quantization=hurray.PerBlockAffine.symmetric(1, 128, 1, hurray.float16)).descriptor.encode()
    # seed 000: axis MUST be < rank (axis field at 81 + 4)
    e = _both(_patch(good, 85, "<I", 2), InconsistentError, "quantization.axis", "axis 2 is not less than rank 2")
    assert e.offset == 85
    # seed 000: a reader MUST reject block_size > non-zero shape[axis]
    e = _both(_patch(good, 89, "<I", 256), InconsistentError, "quantization.block_size", "block_size 256 exceeds shape")
    assert e.offset == 89


def test_lax_per_block_asymmetric_with_none_zero_point():
    # errata A6 (docs/format-notes.md § 2.11, docs/conversion-rules.md § 6): reject both SYMMETRIC mismatches;
    # the reference accepts non-symmetric with zero_point_buffer_index 0xFFFFFFFF
    good = hurray.Tensor(bytes(8192), hurray.dtype.int4, [128, 128], aux_buffers=[bytes(256)],
                         quantization=hurray.PerBlockAffine.symmetric(1, 128, 1, hurray.float16)).descriptor.encode()
    e = _both(_patch(good, 83, "<H", 0), InconsistentError, "quantization.zero_point_buffer_index", "SYMMETRIC is not set")
    assert e.offset == 97


def test_lax_mxfp_zero_scale_byte_accepted_by_pyhurray_tensor():
    # seed 004: a 0x00 or 0xFF scale byte makes the descriptor invalid; pyhurray builds the tensor anyway
    t = hurray.Tensor(bytes(64), hurray.dtype.float8_e4m3, [2, 32], aux_buffers=[bytes([127, 0])], quantization=hurray.MXFP(1, 32, 1))
    d = decode_descriptor(t.descriptor.encode())
    data = [np.zeros(64, np.uint8), np.array([127, 0], np.uint8)]
    with pytest.raises(FormatError, match="MXFP scale byte of block 1 is 0x00") as ei:
        validate_parameter_values(d, data, data_offsets=[4096, 8192])
    assert ei.value.field == "buffer[1]" and ei.value.offset == 8193


# ---------------------------------------------------------------------------
# strictness ordering: whatever the reference rejects, we reject too


@settings(max_examples=80, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(cases(), st.data())
def test_we_reject_everything_pyhurray_rejects(case, data):
    _, t = case
    raw = bytearray(t.descriptor.encode())
    for _ in range(data.draw(st.integers(1, 3))):
        bit = data.draw(st.integers(0, len(raw) * 8 - 1))
        raw[bit // 8] ^= 1 << (bit % 8)
    raw = bytes(raw)
    try:
        theirs = hurray.Descriptor.decode(raw)
    except (ValueError, NotImplementedError):
        theirs = None
    try:
        ours = decode_descriptor(raw)
    except (FormatError, UnsupportedError):
        return  # stricter or equal
    assert theirs is not None, "pyhurray rejected a descriptor we accepted"
    assert encode_descriptor(ours) == raw == theirs.encode()


def _int4_vector() -> bytes:
    # the bytes of conformance vector quant_per_block_int4_128x128.bin, built by pyhurray
    return hurray.Tensor(bytes(8192), hurray.dtype.int4, [128, 128], aux_buffers=[bytes(256)],
                         quantization=hurray.PerBlockAffine.symmetric(1, 128, 1, hurray.float16)).descriptor.encode()


def test_lax_mixed_devices():
    # buffer-protocol.md: all buffers of one descriptor share device_tag and memory_class (colocation)
    e = _both(_patch(_int4_vector(), 73, "<B", 1), InconsistentError, "buffer[1].device", "must be colocated")
    assert e.offset == 73
    e = _both(_patch(_int4_vector(), 75, "<B", 1), InconsistentError, "buffer[1].memory_class", "must be colocated")
    assert e.offset == 75


def test_lax_scheme_version_zero():
    # per-block-affine.md Binary Encoding: scheme_version MUST be 0x01
    e = _both(_patch(_int4_vector(), 82, "<B", 0), FormatError, "quantization.scheme_version", "scheme_version 0 is invalid")
    assert e.offset == 82
