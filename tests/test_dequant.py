"""The shared dequantizer: schemes, axes, layouts, composites, chunking, errors.

Expected values come from a plain numpy reference written here from the spec
formulas (block index ``b = outer·nb + i_axis // K``, ``s·float32(q − z)``),
evaluated on the *logical* code array — never from the module under test.
Buffers are packed with test-local packers following element-types.md.
"""

from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest

from hurray_interop.core.elements import element_type
from hurray_interop.core.model import (
    MXFP,
    NF4,
    OP_ADD,
    OP_REPLACE,
    RULE_GROUP,
    RULE_OVERLAY,
    RULE_PARTITION,
    ROLE_BASE,
    ROLE_CORRECTION,
    BufferHandle,
    ColumnMajor,
    CompositeHead,
    CompositeMember,
    Coo,
    Descriptor,
    Morton,
    PerBlockAffine,
    PerChannelAffine,
    PerTensorAffine,
    RowMajor,
    Shard,
    Strided,
    Tensor,
    Tiled,
)
from hurray_interop.dequant import NF4_LUT, dequantize, iter_dequantize
from hurray_interop.errors import FormatError, InconsistentError, UnsupportedError, UsageError

RNG = np.random.default_rng(20261129)


# ---------------------------------------------------------------------------
# test-local packing (element-types.md § packing, LSB-first)


def pack(codes, bits: int) -> np.ndarray:
    """Pack integer codes (flattened) into Hurray bytes for a ``bits``-wide element."""
    c = np.asarray(codes).reshape(-1)
    if bits >= 8:
        raise AssertionError("byte types are passed as their own bytes")
    c = (c.astype(np.int64) & ((1 << bits) - 1)).astype(np.uint8)
    if bits == 6:
        c = np.concatenate([c, np.zeros(-c.size % 4, np.uint8)]).reshape(-1, 4)
        w = c[:, 0].astype(np.uint32) | (c[:, 1].astype(np.uint32) << 6) | (c[:, 2].astype(np.uint32) << 12) \
            | (c[:, 3].astype(np.uint32) << 18)
        return np.stack([w & 0xFF, (w >> 8) & 0xFF, w >> 16], axis=1).astype(np.uint8).reshape(-1)
    per = 8 // bits
    c = np.concatenate([c, np.zeros(-c.size % per, np.uint8)]).reshape(-1, per)
    out = np.zeros(c.shape[0], np.uint8)
    for j in range(per):
        out |= c[:, j] << (bits * j)
    return out


def storage_bytes(codes: np.ndarray, etype: str) -> np.ndarray:
    et = element_type(etype)
    if et.packed:
        return pack(codes, et.bits)
    return np.ascontiguousarray(np.asarray(codes).astype(et.dtype)).view(np.uint8).reshape(-1)


def make(name, etype, shape, data, params=(), *, quant=None, layout=None, byte_offset=0, shard=None, role=None):
    bufs = (np.ascontiguousarray(data).view(np.uint8).reshape(-1),) + tuple(
        np.ascontiguousarray(p).view(np.uint8).reshape(-1) for p in params
    )
    desc = Descriptor(
        element_type=element_type(etype),
        shape=tuple(shape),
        buffers=tuple(BufferHandle.cpu(b.size) for b in bufs),
        layout=layout if layout is not None else RowMajor(),
        byte_offset=byte_offset,
        quantization=quant,
        shard=shard,
        composite_member=None if role is None else CompositeMember(role),
    )
    return Tensor(name, desc, bufs)


def rand_codes(etype: str, shape) -> np.ndarray:
    et = element_type(etype)
    if et.kind == "int":
        lo, hi = -(1 << (et.bits - 1)), (1 << (et.bits - 1))
    else:
        lo, hi = 0, 1 << et.bits
    return RNG.integers(lo, hi, size=shape, dtype=np.int64)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a = np.asarray(a)
    b = np.asarray(b)
    return a.dtype == b.dtype == np.float32 and a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


# ---------------------------------------------------------------------------
# the reference: spec formulas on the logical array


def block_index(shape, axis, K):
    """b = outer * nb + i_axis // K, outer = row-major index over the other dimensions."""
    idx = np.indices(shape)
    other = [n for k, n in enumerate(shape) if k != axis]
    outer = np.zeros(shape, np.int64)
    for k, n in enumerate(shape):
        if k != axis:
            outer = outer * n + idx[k]
    nb = -(-shape[axis] // K)
    return outer * nb + idx[axis] // K, nb * int(np.prod(other, dtype=np.int64))


def ref_affine(q, scale_f32, zero=None):
    """np.float32(s) * np.float32(q - z), q - z exact in int64."""
    diff = q.astype(np.int64) - (0 if zero is None else zero.astype(np.int64))
    return (np.float32(1) * scale_f32).astype(np.float32) * diff.astype(np.float32)


# ---------------------------------------------------------------------------
# plain element types


@pytest.mark.parametrize("etype", ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16",
                                   "uint16", "int32", "uint32", "int64", "uint64"])
def test_plain_casts(etype):
    et = element_type(etype)
    if et.kind == "float":
        logical = (RNG.standard_normal((3, 5)) * 1000).astype(et.dtype)
        logical.reshape(-1)[:3] = np.array([np.inf, -0.0, np.nan]).astype(et.dtype)
    else:
        info = np.iinfo(et.dtype)
        logical = RNG.integers(info.min, info.max, size=(3, 5), dtype=et.dtype, endpoint=True)
    t = make("p", etype, logical.shape, storage_bytes(logical, etype))
    expected = logical.astype(np.float32)
    got = dequantize(t)
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), expected[~nan].view(np.uint32))


@pytest.mark.parametrize("etype,bits", [("int4", 4), ("uint4", 4), ("int2", 2), ("uint2", 2), ("bool", 1)])
def test_plain_sub_byte(etype, bits):
    codes = rand_codes(etype, (3, 7))  # odd rows start mid-byte
    t = make("s", etype, codes.shape, pack(codes, bits))
    assert same_bits(dequantize(t), codes.astype(np.float32))


def test_scalar_and_empty():
    t = make("scalar", "float16", (), np.array([1.5], np.float16))
    out = dequantize(t)
    assert out.shape == () and out == np.float32(1.5)
    assert list(iter_dequantize(t)) and list(iter_dequantize(t))[0][1].shape == ()
    e = make("empty", "int4", (0, 32), np.zeros(0, np.uint8), (np.zeros(0, np.float16),),
             quant=PerBlockAffine(axis=1, block_size=32, scale_buffer_index=1))
    assert dequantize(e).shape == (0, 32)
    assert list(iter_dequantize(e)) == []


# ---------------------------------------------------------------------------
# per-tensor and per-channel affine


@pytest.mark.parametrize("etype,zp", [("int8", 0), ("int8", -3), ("uint8", 128), ("int4", 2), ("uint2", 1),
                                      ("int16", -1000), ("uint16", 40000), ("int32", -(1 << 31)),
                                      ("uint32", 0)])
def test_per_tensor(etype, zp):
    codes = rand_codes(etype, (4, 9))
    if etype == "uint32":
        codes[0, 0] = (1 << 32) - 1  # q - z needs more than int32 and rounds to float32
    scale = 0.0372
    t = make("pt", etype, codes.shape, storage_bytes(codes, etype), quant=PerTensorAffine(scale=scale, zero_point=zp))
    expected = np.float32(scale) * (codes.astype(np.int64) - zp).astype(np.float32)
    assert same_bits(dequantize(t), expected)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_per_channel(symmetric, axis):
    shape = (3, 4, 5)
    etype = "int8" if symmetric else "uint8"
    codes = rand_codes(etype, shape)
    scales = RNG.uniform(0.01, 2, shape[axis]).astype(np.float32)
    zeros = RNG.integers(0, 256, shape[axis]).astype(np.int32)
    params = (scales,) if symmetric else (scales, zeros)
    quant = PerChannelAffine(axis=axis, scale_buffer_index=1, zero_point_buffer_index=None if symmetric else 2)
    t = make("pc", etype, shape, storage_bytes(codes, etype), params, quant=quant)
    bshape = [1, 1, 1]
    bshape[axis] = -1
    s = np.broadcast_to(scales.reshape(bshape), shape)
    z = None if symmetric else np.broadcast_to(zeros.reshape(bshape), shape)
    assert same_bits(dequantize(t), ref_affine(codes, s, z))


# ---------------------------------------------------------------------------
# per-block affine


def per_block_case(etype, shape, axis, K, scale_type="float16", symmetric=True, zero_range=(-5, 20),
                   padded=False):
    codes = rand_codes(etype, shape)
    b, nblocks = block_index(shape, axis, K)
    st = element_type(scale_type).dtype
    scales = RNG.uniform(-3, 3, nblocks).astype(st)
    scales[scales == 0] = 1
    zeros = RNG.integers(*zero_range, nblocks).astype(np.int32)
    if padded:  # the seed's convention: each outer row stores ceil(S/K)*K elements, padding 0x00
        pshape = list(shape)
        pshape[axis] = -(-shape[axis] // K) * K
        stored = np.zeros(pshape, np.int64)
        stored[tuple(slice(0, n) for n in shape)] = codes
    else:
        stored = codes
    params = (scales,) if symmetric else (scales, zeros)
    quant = PerBlockAffine(axis=axis, block_size=K, scale_buffer_index=1,
                           zero_point_buffer_index=None if symmetric else 2,
                           scale_type=element_type(scale_type))
    t = make("pb", etype, shape, storage_bytes(stored, etype), params, quant=quant)
    expected = ref_affine(codes, scales.astype(np.float32)[b], None if symmetric else zeros[b])
    return t, expected


@pytest.mark.parametrize("etype", ["int8", "uint8", "int4", "uint4", "int2", "uint2"])
@pytest.mark.parametrize("scale_type", ["float16", "bfloat16", "float32"])
def test_per_block_storage_and_scale_types(etype, scale_type):
    t, expected = per_block_case(etype, (6, 64), axis=1, K=16, scale_type=scale_type)
    assert same_bits(dequantize(t), expected)


@pytest.mark.parametrize("etype", ["uint8", "uint4", "int2"])
@pytest.mark.parametrize("zero_range", [(-5, 20), (-(1 << 31), (1 << 31) - 1)])
def test_per_block_asymmetric(etype, zero_range):
    """Zero points as stored (int32), including ones where q - z leaves float32's exact range."""
    t, expected = per_block_case(etype, (5, 96), axis=1, K=32, symmetric=False, zero_range=zero_range)
    assert same_bits(dequantize(t), expected)


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("etype", ["int4", "int8"])
def test_per_block_any_axis(axis, etype):
    t, expected = per_block_case(etype, (8, 6, 16), axis=axis, K=2 if axis == 1 else 8, symmetric=False)
    assert same_bits(dequantize(t), expected)


@pytest.mark.parametrize("padded", [False, True], ids=["contiguous", "padded"])
@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("etype", ["int4", "uint8", "int2"])
def test_per_block_partial_trailing_block(padded, axis, etype):
    shape = (3, 100) if axis == 1 else (100, 3)
    t, expected = per_block_case(etype, shape, axis=axis, K=64, scale_type="bfloat16", symmetric=False,
                                 padded=padded)
    contiguous = storage_bytes(np.zeros(shape, np.int64), etype).size
    assert (t.data[0].size > contiguous) == padded  # the two buffer conventions really differ
    assert same_bits(dequantize(t), expected)
    got = np.empty(shape, np.float32)
    for index, values in iter_dequantize(t, max_elements=37):
        got[index] = values
    assert same_bits(got, expected)


def test_per_block_asymmetric_scale_times_difference_rounding():
    """s * float32(q - z) is not s*q - s*z: a case where the two differ in the last bit."""
    codes = np.array([[1, 3]], np.int64)
    scale = np.array([0.1], np.float32)
    zero = np.array([3], np.int32)
    t = make("r", "uint8", (1, 2), codes.astype(np.uint8), (scale, zero),
             quant=PerBlockAffine(axis=1, block_size=2, scale_buffer_index=1, zero_point_buffer_index=2,
                                  scale_type=element_type("float32")))
    got = dequantize(t)
    assert got[0, 0] == np.float32(0.1) * np.float32(-2) and got[0, 1] == 0
    assert np.float32(0.1) * np.float32(1) - np.float32(0.1) * np.float32(3) != got[0, 0]


# ---------------------------------------------------------------------------
# NF4 and MXFP specifics


def test_nf4_hand_checked():
    """Spec LUT (quantization/nf4.md) by hand: codes 0, 7, 15, 8, 13 with absmax 2.0 and 0.5."""
    assert NF4_LUT[0] == -1.0 and NF4_LUT[7] == 0.0 and NF4_LUT[15] == 1.0
    assert NF4_LUT[8] == np.float32(0.07958029955625534) and NF4_LUT[13] == np.float32(0.5626170039176941)
    codes = np.array([0, 7, 15, 8, 13, 1, 2, 3, 15, 15, 0, 0, 4, 5, 6, 9], np.int64)  # two blocks of 8
    absmax = np.array([2.0, 0.5], np.float32)
    t = make("nf4", "uint4", (16,), pack(codes, 4), (absmax,), quant=NF4(axis=0, block_size=8, scale_buffer_index=1))
    got = dequantize(t)
    assert got[0] == -2.0 and got[1] == 0.0 and got[2] == 2.0
    assert got[3] == np.float32(2.0) * np.float32(0.07958029955625534)
    assert got[4] == np.float32(2.0) * np.float32(0.5626170039176941)
    assert got[8] == 0.5 and got[10] == -0.5 and got[15] == np.float32(0.5) * np.float32(0.16093020141124725)


def test_mxfp_block_geometry_non_last_axis():
    """4-D MXINT8 with blocks along axis 1: every element gets 2^(e-127) of its own block."""
    shape = (2, 64, 3, 2)
    codes = rand_codes("int8", shape)
    b, nblocks = block_index(shape, 1, 32)
    e = RNG.integers(100, 150, nblocks).astype(np.uint8)
    t = make("mx", "int8", shape, codes.astype(np.int8), (e,), quant=MXFP(axis=1, block_size=32, scale_buffer_index=1))
    expected = (np.ldexp(1.0, e[b].astype(np.int64) - 127) * codes).astype(np.float32)
    assert same_bits(dequantize(t), expected)


# ---------------------------------------------------------------------------
# layouts


def strided_case(etype, shape, strides, buffer_elems, byte_offset_elems):
    """Element storage E (random codes); logical[i] = E[byte_offset + Σ i_k·stride_k]."""
    E = rand_codes(etype, (buffer_elems,)) if etype != "float16" else RNG.standard_normal(buffer_elems).astype(np.float16)
    idx = np.indices(shape)
    off = byte_offset_elems + sum(idx[k] * strides[k] for k in range(len(shape)))
    logical = E[off]
    et = element_type(etype)
    if et.bits == 6:
        assert byte_offset_elems % 4 == 0
        bo = byte_offset_elems // 4 * 3
    else:
        assert (byte_offset_elems * et.bits) % 8 == 0
        bo = byte_offset_elems * et.bits // 8
    data = storage_bytes(E, etype)
    return data, bo, logical


@pytest.mark.parametrize("etype", ["float16", "int4", "uint2", "float6_e2m3", "bool", "int8"])
@pytest.mark.parametrize("strides,bo", [((-5, 1), 16), ((1, 3), 0), ((0, 1), 0), ((2, -1), 8), ((7, 2), 8)])
def test_strided_layouts(etype, strides, bo):
    shape = (3, 4)
    data, byte_offset, logical = strided_case(etype, shape, strides, 40, bo)
    t = make("st", etype, shape, data, layout=Strided(strides=strides), byte_offset=byte_offset)
    et = element_type(etype)
    if etype == "float16":
        expected = logical.astype(np.float32)
    elif etype == "float6_e2m3":
        expected = logical.astype(np.uint8).view(ml_dtypes.float6_e2m3fn).astype(np.float32)
    else:
        expected = logical.astype(np.float32)
    assert et is element_type(etype)
    assert same_bits(dequantize(t), expected)


@pytest.mark.parametrize("etype", ["int4", "int8", "uint2"])
def test_column_major_per_block(etype):
    shape = (4, 6, 32)
    codes = rand_codes(etype, shape)
    b, nblocks = block_index(shape, 2, 16)
    scales = RNG.uniform(0.5, 2, nblocks).astype(np.float16)
    data = storage_bytes(codes.transpose().copy(), etype)  # F order = C order of the transpose
    t = make("cm", etype, shape, data, (scales,), layout=ColumnMajor(),
             quant=PerBlockAffine(axis=2, block_size=16, scale_buffer_index=1))
    assert same_bits(dequantize(t), ref_affine(codes, scales.astype(np.float32)[b]))


def test_strided_quantized_with_byte_offset():
    """Per-block int4 through reversed rows and a byte offset: blocks follow logical positions."""
    shape = (3, 32)
    data, bo, logical = strided_case("int4", shape, (-32, 1), 96, 64)
    b, nblocks = block_index(shape, 1, 16)
    scales = RNG.uniform(0.5, 2, nblocks).astype(np.float32)
    t = make("sq", "int4", shape, data, (scales,), layout=Strided(strides=(-32, 1)), byte_offset=bo,
             quant=PerBlockAffine(axis=1, block_size=16, scale_buffer_index=1, scale_type=element_type("float32")))
    assert same_bits(dequantize(t), ref_affine(logical, scales[b]))


# ---------------------------------------------------------------------------
# composites


def member(name, values_f16, offset, parent, role=None, etype="float32"):
    """float16-representable values stored as ``etype``, the head's element type (an unquantized
    member stores its head's type: composite.md § Members)."""
    v = np.asarray(values_f16, np.float16).astype(element_type(etype).dtype)
    return make(name, etype, v.shape, v, shard=Shard(parent_shape=parent, offset=offset), role=role)


def head(name, shape, rule, op, members, etype="float32"):
    desc = Descriptor(element_type=element_type(etype), shape=shape, buffers=(),
                      layout=CompositeHead(composition_rule=rule, combine_op=op, member_count=len(members)))
    return Tensor(name, desc, members=tuple(members))


def test_overlay_add_and_replace():
    parent = (6, 8)
    base = RNG.standard_normal(parent).astype(np.float16)
    c1 = RNG.standard_normal((2, 3)).astype(np.float16)
    c2 = RNG.standard_normal((3, 8)).astype(np.float16)
    members = (member("b", base, (0, 0), parent, ROLE_BASE), member("c1", c1, (1, 2), parent, ROLE_CORRECTION),
               member("c2", c2, (2, 0), parent, ROLE_CORRECTION))
    add = base.astype(np.float32)
    add[1:3, 2:5] += c1.astype(np.float32)
    add[2:5, :] += c2.astype(np.float32)
    assert same_bits(dequantize(head("add", parent, RULE_OVERLAY, OP_ADD, members)), add)
    rep = base.astype(np.float32)
    rep[1:3, 2:5] = c1
    rep[2:5, :] = c2  # later wins
    assert same_bits(dequantize(head("rep", parent, RULE_OVERLAY, OP_REPLACE, members)), rep)
    # chunked evaluation cuts through member boxes
    for mx in (1, 5, 13):
        got = np.empty(parent, np.float32)
        for index, values in iter_dequantize(head("add", parent, RULE_OVERLAY, OP_ADD, members), max_elements=mx):
            got[index] = values
        assert same_bits(got, add)


def test_overlay_add_in_float16_head_rounds_each_step():
    """The combine is evaluated in the head's type: float16 head → f16(f16(base) + f16(corr))."""
    parent = (4,)
    base = np.array([1.0, 2048.0, 0.1, -3.0], np.float16)
    corr = np.array([0.0004, 1.0, 0.2, 3.0], np.float16)
    members = (member("b", base, (0,), parent, ROLE_BASE, "float16"),
               member("c", corr, (0,), parent, ROLE_CORRECTION, "float16"))
    got = dequantize(head("h16", parent, RULE_OVERLAY, OP_ADD, members, etype="float16"))
    assert same_bits(got, (base + corr).astype(np.float32))  # numpy float16 add rounds per IEEE
    assert got[1] == 2048.0  # 2048 + 1 is not a float16
    members = (member("b", base, (0,), parent, ROLE_BASE), member("c", corr, (0,), parent, ROLE_CORRECTION))
    got32 = dequantize(head("h32", parent, RULE_OVERLAY, OP_ADD, members))
    assert got32[1] == 2049.0


def test_partition_with_quantized_members():
    parent = (5, 64)
    logical = np.empty(parent, np.float32)
    members = []
    boxes = [((0, 0), (5, 32)), ((0, 32), (2, 32)), ((2, 32), (3, 32))]
    for i, (off, shape) in enumerate(boxes):
        t, expected = per_block_case("int4", shape, axis=1, K=16)
        d = t.descriptor
        t = Tensor(f"m{i}", Descriptor(element_type=d.element_type, shape=d.shape, buffers=d.buffers,
                                       quantization=d.quantization, shard=Shard(parent_shape=parent, offset=off)),
                   t.data)
        logical[off[0]:off[0] + shape[0], off[1]:off[1] + shape[1]] = expected
        members.append(t)
    h = head("part", parent, RULE_PARTITION, 0, members)
    assert same_bits(dequantize(h), logical)
    for mx in (3, 40, 100):
        got = np.full(parent, np.nan, np.float32)
        for index, values in iter_dequantize(h, max_elements=mx):
            got[index] = values
        assert same_bits(got, logical)


def test_nested_composite():
    parent = (4, 4)
    left = head("inner", (4, 2), RULE_PARTITION, 0,
                [member("a", np.full((4, 1), 1.0), (0, 0), (4, 2)), member("b", np.full((4, 1), 2.0), (0, 1), (4, 2))])
    d = left.descriptor
    left = Tensor("inner", Descriptor(element_type=d.element_type, shape=d.shape, buffers=(), layout=d.layout,
                                      shard=Shard(parent_shape=parent, offset=(0, 0))), members=left.members)
    right = member("c", np.full((4, 2), 3.0), (0, 2), parent)
    got = dequantize(head("outer", parent, RULE_PARTITION, 0, [left, right]))
    assert same_bits(got, np.tile(np.array([1, 2, 3, 3], np.float32), (4, 1)))


def test_composite_nesting_limit():
    """composite.md § Binding: at most 8 levels of composites; 8 evaluate, 9 are rejected."""
    def nest(levels):
        t = member("leaf", [1.0, 2.0], (0,), (2,))
        for k in range(levels):
            h = head(f"h{k}", (2,), RULE_PARTITION, 0, [t])
            d = h.descriptor
            t = Tensor(h.name, Descriptor(element_type=d.element_type, shape=d.shape, buffers=(), layout=d.layout,
                                          shard=Shard(parent_shape=(2,), offset=(0,))), members=h.members)
        return Tensor(t.name, Descriptor(element_type=t.descriptor.element_type, shape=(2,), buffers=(),
                                         layout=t.descriptor.layout), members=t.members)

    assert same_bits(dequantize(nest(8)), np.array([1.0, 2.0], np.float32))
    with pytest.raises(FormatError, match="composite nesting deeper than 8"):
        dequantize(nest(9))


# ---------------------------------------------------------------------------
# chunked == whole


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("max_elements", [1, 7, 64, 1000])
def test_chunked_equals_whole(axis, max_elements):
    t, expected = per_block_case("int4", (5, 8, 16), axis=axis, K=4 if axis else 1 << 2, symmetric=False)
    got = np.full(expected.shape, np.nan, np.float32)
    seen = np.zeros(expected.shape, np.int64)
    for index, values in iter_dequantize(t, max_elements=max_elements):
        assert values.size <= max_elements and values.flags.c_contiguous
        got[index] = values
        seen[index] += 1
    assert np.all(seen == 1)
    assert same_bits(got, expected)
    assert same_bits(dequantize(t), expected)


def test_out_parameter():
    t, expected = per_block_case("int8", (4, 32), axis=1, K=32)
    out = np.empty((4, 32), np.float32)
    assert dequantize(t, out=out) is out and same_bits(out, expected)
    with pytest.raises(UsageError, match="out must be"):
        dequantize(t, out=np.empty((4, 32), np.float64))
    with pytest.raises(UsageError, match="out must be"):
        dequantize(t, out=np.empty((32, 4), np.float32).T)


# ---------------------------------------------------------------------------
# errors: always the project's types, naming the tensor


def test_unsupported_layouts_name_the_tensor():
    data = np.zeros(16, np.float32)
    for layout in (Coo(nnz=2), Morton(bits=(2, 2)), Tiled(tile_shape=(2, 2), outer_layout=1, inner_layout=1)):
        t = make("weird.weight", "float32", (4, 4), data, layout=layout)
        with pytest.raises(UnsupportedError, match=r"tensor 'weird.weight'.*layout"):
            dequantize(t)


def test_composite_head_with_data_rejected():
    h = head("hd", (2,), RULE_PARTITION, 0, [member("a", [1.0, 2.0], (0,), (2,))])
    d = h.descriptor
    bad = Tensor("hd", Descriptor(element_type=d.element_type, shape=d.shape, buffers=(BufferHandle.cpu(4),),
                                  layout=d.layout), (np.zeros(4, np.uint8),), h.members)
    with pytest.raises(FormatError, match="tensor 'hd'.*composite head must have buffer_count 0"):
        dequantize(bad)


def test_group_composite_unsupported():
    h = head("grp", (2,), RULE_GROUP, 0, [member("a", [1.0, 2.0], (0,), (2,))])
    with pytest.raises(UnsupportedError, match="tensor 'grp'.*group"):
        dequantize(h)


def test_partition_gap_and_overlap_rejected():
    parent = (2, 4)
    gap = head("gap", parent, RULE_PARTITION, 0, [member("a", np.ones((2, 2)), (0, 0), parent)])
    with pytest.raises(InconsistentError, match="tensor 'gap'.*cover 4 of 8"):
        dequantize(gap)
    overlap = head("ov", parent, RULE_PARTITION, 0, [member("a", np.ones((2, 3)), (0, 0), parent),
                                                      member("b", np.ones((2, 1)), (0, 2), parent)])
    with pytest.raises(InconsistentError, match="overlap"):
        dequantize(overlap)
    bad_base = head("bb", parent, RULE_OVERLAY, OP_ADD, [member("a", np.ones((2, 4)), (0, 0), parent,
                                                                ROLE_CORRECTION)])
    with pytest.raises(FormatError, match="must have role base"):
        dequantize(bad_base)


def test_truncated_data_buffer():
    t = make("short", "int4", (4, 32), np.zeros(63, np.uint8), (np.ones(4, np.float16),),
             quant=PerBlockAffine(axis=1, block_size=32, scale_buffer_index=1))
    with pytest.raises(InconsistentError, match="tensor 'short'.*buffer 0 holds 63"):
        dequantize(t)
    st = make("oob", "float32", (3, 4), np.zeros(8, np.float32), layout=Strided(strides=(-4, 1)), byte_offset=4)
    with pytest.raises(FormatError, match="before the start of buffer 0"):
        dequantize(st)


def test_buffers_must_match_their_handles():
    t = make("h", "float32", (4,), np.zeros(4, np.float32))
    short = Tensor("h", t.descriptor, (t.data[0][:8],))
    with pytest.raises(InconsistentError, match="tensor 'h'.*buffer 0 holds 8 bytes, its handle declares 16"):
        dequantize(short)
    with pytest.raises(InconsistentError, match="declares 1 buffers, the tensor carries 0"):
        dequantize(Tensor("h", t.descriptor, ()))


def test_forbidden_scales_strict_and_lenient():
    codes = np.zeros(32, np.int8)
    codes[0] = 3
    t = make("z", "int8", (32,), codes, (np.zeros(1, np.float16),),
             quant=PerBlockAffine(axis=0, block_size=32, scale_buffer_index=1))
    with pytest.raises(FormatError, match="tensor 'z'.*scale of block 0 is 0.0"):
        dequantize(t)
    assert same_bits(dequantize(t, strict=False), np.zeros(32, np.float32))
    for e in (0x00, 0xFF):
        mx = make("mx", "float4_e2m1", (32,), np.full(16, 0x22, np.uint8), (np.array([e], np.uint8),),
                  quant=MXFP(axis=0, block_size=32, scale_buffer_index=1))
        with pytest.raises(FormatError, match=f"MXFP scale byte of block 0 is {e:#04x}"):
            dequantize(mx)
    lenient = dequantize(mx, strict=False)
    assert np.all(np.isnan(lenient))
    mx0 = make("mx0", "float4_e2m1", (32,), np.full(16, 0x22, np.uint8), (np.array([0], np.uint8),),
               quant=MXFP(axis=0, block_size=32, scale_buffer_index=1))
    assert np.all(dequantize(mx0, strict=False) == np.float32(2.0 ** -127))


@pytest.mark.parametrize("etype,quant,match", [
    ("float32", PerBlockAffine(axis=0, block_size=32, scale_buffer_index=1), "not allowed with per-block"),
    ("int4", NF4(axis=0, block_size=32, scale_buffer_index=1), "not allowed with NF4"),
    ("uint8", MXFP(axis=0, block_size=32, scale_buffer_index=1), "not allowed with MXFP"),
    ("int8", PerBlockAffine(axis=1, block_size=32, scale_buffer_index=1), "axis 1 is not less than rank 1"),
    ("int8", PerBlockAffine(axis=0, block_size=24, scale_buffer_index=1), "power of two"),
    ("int8", PerBlockAffine(axis=0, block_size=32, scale_buffer_index=5), "not less than buffer_count"),
    ("int8", PerBlockAffine(axis=0, block_size=32, scale_buffer_index=0), "refers to the data buffer"),
    ("int8", MXFP(axis=0, block_size=8, scale_buffer_index=1), r"outside \[16, 2048\]"),
])
def test_bad_descriptors(etype, quant, match):
    t = make("bad", etype, (32,), np.zeros(32 * element_type(etype).bits // 8, np.uint8), (np.ones(1, np.float16),),
             quant=quant)
    with pytest.raises(FormatError, match=match):
        dequantize(t)


def test_scale_buffer_size_must_match():
    t = make("sz", "int8", (64,), np.zeros(64, np.uint8), (np.ones(1, np.float16),),
             quant=PerBlockAffine(axis=0, block_size=32, scale_buffer_index=1))
    with pytest.raises(InconsistentError, match="scale buffer 1 holds 2 bytes, per-block affine needs 4"):
        dequantize(t)


def test_iter_validates_eagerly():
    t = make("lazy", "float32", (4, 4), np.zeros(16, np.float32), layout=Coo(nnz=1))
    with pytest.raises(UnsupportedError, match="tensor 'lazy'"):
        iter_dequantize(t)  # no next() needed
    with pytest.raises(UsageError, match="max_elements must be positive"):
        iter_dequantize(make("ok", "float32", (1,), np.zeros(1, np.float32)), max_elements=0)
    with pytest.raises(UsageError, match="threads must be positive"):
        dequantize(make("ok", "float32", (1,), np.zeros(1, np.float32)), threads=0)


def test_empty_outer_dimension_per_channel():
    t = make("e", "uint8", (0, 3), np.zeros(0, np.uint8), (np.ones(3, np.float32), np.zeros(3, np.int32)),
             quant=PerChannelAffine(axis=1, scale_buffer_index=1, zero_point_buffer_index=2))
    assert dequantize(t).shape == (0, 3)
    bad = make("z", "uint8", (2, 3), np.zeros(6, np.uint8), (np.ones(3, np.float32), np.array([0, 256, 0], np.int32)),
               quant=PerChannelAffine(axis=1, scale_buffer_index=1, zero_point_buffer_index=2))
    with pytest.raises(FormatError, match="zero point of channel 1 is 256, outside the uint8 range"):
        dequantize(bad)


def test_dynamic_dimension_unsupported():
    t = make("dyn", "float32", (None, 4), np.zeros(16, np.float32))
    with pytest.raises(UnsupportedError, match="tensor 'dyn'.*dynamic"):
        dequantize(t)


def test_random_strided_descriptors_exact_or_typed_error():
    """Random strides / offsets / buffer sizes: exactly the addressed elements when every one lies
    inside the buffer, otherwise a project error — never IndexError or a numpy error."""
    from hurray_interop.errors import HurrayInteropError

    rng = np.random.default_rng(3)
    outcomes = {True: 0, False: 0}
    for _ in range(200):
        shape = tuple(int(x) for x in rng.integers(1, 5, 2))
        strides = tuple(int(x) for x in rng.integers(-6, 7, 2))
        etype = ["int4", "float16", "uint2", "float6_e3m2"][int(rng.integers(0, 4))]
        et = element_type(etype)
        E = rand_codes(etype, (64,)) if etype != "float16" else rng.standard_normal(64).astype(np.float16)
        packed = storage_bytes(E, etype)
        nbytes = int(rng.integers(0, 24))
        if et.bits == 6:
            bo = 3 * int(rng.integers(0, 5))
            bo_elems = bo // 3 * 4
        else:
            bo = int(rng.integers(0, 12)) // (et.bits // 8 or 1) * (et.bits // 8 or 1)  # whole elements
            bo_elems = bo * 8 // et.bits
        idx = np.indices(shape)
        G = bo_elems + sum(idx[k] * strides[k] for k in range(2))
        if et.bits == 6:
            need = 3 * (G // 4) + 3
        elif et.packed:
            need = G // (8 // et.bits) + 1
        else:
            need = (G + 1) * 2
        inside = bool(np.all(G >= 0) and np.all(need <= nbytes))
        t = make("fz", etype, shape, packed[:nbytes], layout=Strided(strides=strides), byte_offset=bo)
        if inside:
            expected = E[G].astype(np.float32) if etype != "float6_e3m2" else \
                E[G].astype(np.uint8).view(ml_dtypes.float6_e3m2fn).astype(np.float32)
            assert same_bits(dequantize(t), expected)
        else:
            with pytest.raises(HurrayInteropError):
                dequantize(t)
        outcomes[inside] += 1
    assert outcomes[True] > 30 and outcomes[False] > 30


# ---------------------------------------------------------------------------
# property: any per-block geometry, any chunking, equals the spec formula

from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def block_geometries(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    axis = draw(st.integers(0, rank - 1))
    S = draw(st.integers(2, 40))
    shape = shape[:axis] + (S,) + shape[axis + 1:]
    K = 1 << draw(st.integers(1, max(1, S.bit_length() - 1)))
    etype = draw(st.sampled_from(["int8", "uint8", "int4", "uint4", "int2", "uint2"]))
    return dict(etype=etype, shape=shape, axis=axis, K=min(K, S),
                scale_type=draw(st.sampled_from(["float16", "bfloat16", "float32"])),
                symmetric=draw(st.booleans()), padded=draw(st.booleans()),
                max_elements=draw(st.integers(1, 300)))


def _sizes_tie(etype, shape, axis, K) -> bool:
    """The contiguous and the padded data sizes round to the same whole bytes (sub-byte
    types), so the buffer is the size the spec requires and is read padded (§ 6)."""
    bits = element_type(etype).bits
    S = shape[axis]
    n = int(np.prod(shape))
    return -(-n * bits // 8) == -(-(n // S * -(-S // K) * K) * bits // 8)


@settings(max_examples=60, deadline=None)
@given(block_geometries())
@example(dict(etype="int2", shape=(2, 3), axis=1, K=2, scale_type="float16", symmetric=False, padded=False,
              max_elements=1))  # hypothesis's find: contiguous and padded sizes are both 2 bytes
def test_per_block_property(g):
    K = g["K"]
    if K & (K - 1):
        K = 1 << (K.bit_length() - 1)
    partial = g["shape"][g["axis"]] % K != 0
    padded = partial and (g["padded"] or _sizes_tie(g["etype"], g["shape"], g["axis"], K))
    t, expected = per_block_case(g["etype"], g["shape"], g["axis"], K, g["scale_type"], g["symmetric"],
                                 padded=padded)
    assert same_bits(dequantize(t), expected)
    got = np.full(expected.shape, np.nan, np.float32)
    for index, values in iter_dequantize(t, max_elements=g["max_elements"]):
        assert values.size <= g["max_elements"]
        got[index] = values
    assert same_bits(got, expected)


# ---------------------------------------------------------------------------
# a partial trailing block whose padded and contiguous sizes are equal


def _tie_case():
    """int2 [2, 3], K = 2 along axis 1, asymmetric: two blocks per row, the second partial.
    Stored as the spec's Padding rule says (quantization/per-block-affine.md § Padding):
    each row holds 4 storage elements, the 4th is padding 0.  2 bytes, which is also the
    contiguous size of 6 int2 codes -- the buffer cannot tell the two forms apart."""
    # row 0 codes 1, -2 | 0, pad  -> 0b00_00_10_01 ; row 1 codes -1, 1 | -2, pad -> 0b00_10_01_11
    data = np.array([0b00001001, 0b00100111], np.uint8)
    scales = np.array([1, 2, 0.5, 4], np.float16)  # block b = row * 2 + i // 2
    zeros = np.array([0, 1, -1, 1], np.int32)
    quant = PerBlockAffine(axis=1, block_size=2, scale_buffer_index=1, zero_point_buffer_index=2,
                           scale_type=element_type("float16"))
    # s·(q − z), by hand: row 0: 1·(1−0), 1·(−2−0), 2·(0−1); row 1: ½·(−1+1), ½·(1+1), 4·(−2−1)
    expected = np.array([[1, -2, -2], [0, 1, -12]], np.float32)
    return make("tie", "int2", (2, 3), data, (scales, zeros), quant=quant), expected


@pytest.mark.parametrize("max_elements", [1, 2, 3, 6])
def test_partial_block_sizes_tie_read_padded(max_elements):
    """Regression (hypothesis): when the padded and contiguous sizes tie, the buffer is
    the spec's padded form (docs/conversion-rules.md § 6); every chunking agrees."""
    t, expected = _tie_case()
    assert same_bits(dequantize(t), expected)
    got = np.full((2, 3), np.nan, np.float32)
    for index, values in iter_dequantize(t, max_elements=max_elements):
        assert values.size <= max_elements
        got[index] = values
    assert same_bits(got, expected)


def test_partial_block_sizes_tie_written_by_pyhurray(tmp_path):
    """The same tensor written by pyhurray (which accepts the 2-byte buffer) reads back the
    same values through the .hrry reader."""
    hurray = pytest.importorskip("hurray")
    from hurray_interop.core.hrry import load

    t, expected = _tie_case()
    q = hurray.PerBlockAffine.asymmetric(1, 2, 1, 2, hurray.float16)
    aux = [bytes(b) for b in t.data[1:]]
    ref = hurray.Tensor(bytes(t.data[0]), hurray.dtype.int2, [2, 3], quantization=q, aux_buffers=aux)
    hurray.save(str(tmp_path / "tie.hrry"), {"tie": ref})
    tensors, _ = load(tmp_path / "tie.hrry")
    assert same_bits(dequantize(tensors["tie"]), expected)


def test_bfloat16_values_match_ml_dtypes_on_every_pattern() -> None:
    import ml_dtypes

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    t = make("bf", "bfloat16", (256, 256), bits)
    ref = bits.view(ml_dtypes.bfloat16).astype(np.float32).reshape(256, 256)
    assert same_bits(dequantize(t), ref)


def test_dequantizing_small_floats_does_not_import_ml_dtypes(tmp_path) -> None:
    """ml_dtypes' extension takes 0.6 s to load: verify of an MXFP4, float8 or bfloat16 tensor
    never pays for it (the values are computed from the formats' table)."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from hurray_interop.core.model import Descriptor, BufferHandle, RowMajor, MXFP, Tensor\n"
        "from hurray_interop.core.elements import element_type\n"
        "from hurray_interop.dequant import dequantize\n"
        "def t(et, n, q=None, params=()):\n"
        "    bufs = (np.arange(n, dtype=np.uint8),) + params\n"
        "    d = Descriptor(element_type=element_type(et), shape=(2, 32), buffers=tuple(BufferHandle.cpu(b.size) for b in bufs),\n"
        "                   layout=RowMajor(), quantization=q)\n"
        "    return Tensor('x', d, bufs)\n"
        "mx = MXFP(axis=1, block_size=32, scale_buffer_index=1)\n"
        "dequantize(t('float4_e2m1', 32, mx, (np.full(2, 127, np.uint8),)))\n"
        "dequantize(t('float8_e4m3', 64, mx, (np.full(2, 127, np.uint8),)), strict=False)\n"
        "dequantize(t('bfloat16', 128))\n"
        "print('ml_dtypes' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
