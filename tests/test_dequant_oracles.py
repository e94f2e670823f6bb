"""The shared dequantizer against independent oracles, bit for bit.

* GGUF block types: gguf-py quantizes random floats (its own quantizer), the
  test moves codes and scales into Hurray tensors exactly as
  ``docs/conversion-rules.md`` § 2 / § 3a / § 4 prescribe (test-local helpers,
  not the project's converter), and ``dequantize`` must equal
  ``gguf.quants.dequantize`` bit for bit.
* MX elements: every code of every MXFP storage type × a spread of scale
  bytes against ml_dtypes (and torch where it has the dtype) times
  ``2^(e-127)`` computed independently in float64.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from hurray_interop.core.elements import element_type
from hurray_interop.core.model import (
    MXFP,
    OP_ADD,
    ROLE_BASE,
    ROLE_CORRECTION,
    RULE_OVERLAY,
    BufferHandle,
    CompositeHead,
    CompositeMember,
    Descriptor,
    PerBlockAffine,
    Shard,
    Tensor,
)
from hurray_interop.dequant import dequantize, iter_dequantize

F16_ONE = np.array([1.0], dtype=np.float16).view(np.uint8)
F16_MINUS_ONE = np.array([-1.0], dtype=np.float16).view(np.uint8)

# GGML block geometry: bytes per 32-element block
BLOCK_BYTES = {Q.Q8_0: 34, Q.Q4_0: 18, Q.Q4_1: 20, Q.Q5_0: 22, Q.Q5_1: 24, Q.MXFP4: 17}


# ---------------------------------------------------------------------------
# test-local packing and GGUF → Hurray moves (docs/conversion-rules.md § 2, § 3a, § 4)


def pack4(codes: np.ndarray) -> np.ndarray:
    """Hurray 4-bit packing: element 2k low nibble, 2k+1 high nibble (element-types.md)."""
    c = codes.reshape(-1).astype(np.uint8) & 0x0F
    if c.size % 2:
        c = np.append(c, np.uint8(0))
    return (c[0::2] | (c[1::2] << 4)).astype(np.uint8)


def pack2(codes: np.ndarray) -> np.ndarray:
    c = codes.reshape(-1).astype(np.uint8) & 0x03
    c = np.concatenate([c, np.zeros(-c.size % 4, np.uint8)]).reshape(-1, 4)
    return (c[:, 0] | (c[:, 1] << 2) | (c[:, 2] << 4) | (c[:, 3] << 6)).astype(np.uint8)


def pack6(codes: np.ndarray) -> np.ndarray:
    """B0 = e0 | (e1&3)<<6, B1 = e1>>2 | (e2&0xF)<<4, B2 = e2>>4 | e3<<2 (docs/format-notes.md § 2.4)."""
    c = codes.reshape(-1).astype(np.uint8) & 0x3F
    c = np.concatenate([c, np.zeros(-c.size % 4, np.uint8)]).reshape(-1, 4)
    out = np.empty((c.shape[0], 3), np.uint8)
    out[:, 0] = c[:, 0] | (c[:, 1] << 6)
    out[:, 1] = (c[:, 1] >> 2) | (c[:, 2] << 4)
    out[:, 2] = (c[:, 2] >> 4) | (c[:, 3] << 2)
    return out.reshape(-1)


def gguf_nibbles(qs: np.ndarray) -> np.ndarray:
    """(nblocks, 16) GGUF nibble bytes → (nblocks, 32) codes: byte j holds elements j and j+16."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def gguf_qh(qh4: np.ndarray) -> np.ndarray:
    """(nblocks, 4) little-endian qh bytes → (nblocks, 32) fifth bits (bit j = element j)."""
    qh = qh4.copy().view("<u4").reshape(-1, 1)
    return ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def dense(name, etype, shape, data, scales, scale_type="float16", *, k=32, shard=None, role=None):
    data = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    scales = np.ascontiguousarray(scales).reshape(-1).view(np.uint8)
    desc = Descriptor(
        element_type=element_type(etype),
        shape=tuple(shape),
        buffers=(BufferHandle.cpu(data.size), BufferHandle.cpu(scales.size)),
        quantization=PerBlockAffine(axis=len(shape) - 1, block_size=k, scale_buffer_index=1,
                                    scale_type=element_type(scale_type)),
        shard=shard,
        composite_member=None if role is None else CompositeMember(role),
    )
    return Tensor(name, desc, (data, scales))


def substitute_zero_scales(d: np.ndarray, codes_zero: np.ndarray) -> np.ndarray:
    """docs/conversion-rules.md § 4: a block whose codes are all zero gets scale f16 ±1.0 instead of d = ±0.

    The sign must follow d: gguf-py's Q4_0 writes d = -0.0 for an all-zero block
    (d = max / -8), whose values are -0.0; a +1.0 scale would turn them into +0.0.
    """
    d = d.copy()
    df = d.view(np.float16).reshape(-1)
    z = df == 0
    assert np.all(codes_zero[z]), "a d = 0 block with non-zero codes is not representable"
    d.reshape(-1, 2)[z & ~np.signbit(df)] = F16_ONE
    d.reshape(-1, 2)[z & np.signbit(df)] = F16_MINUS_ONE
    return d


def overlay_q41(name, shape, d, m, codes, base_type):
    """docs/conversion-rules.md § 3a: head float32 overlay add; base = d·q, correction = uint2 1 × m."""
    shape = tuple(shape)
    d = substitute_zero_scales(d, np.all(codes == 0, axis=1))
    mf = m.view(np.float16).reshape(-1)
    corr_codes = np.ones((mf.size, 32), np.uint8)
    corr_scale = m.copy().reshape(-1, 2)
    zero_m = mf == 0
    corr_codes[zero_m] = 0
    corr_scale[zero_m & ~np.signbit(mf)] = F16_ONE
    corr_scale[zero_m & np.signbit(mf)] = F16_MINUS_ONE
    shard = Shard(parent_shape=shape, offset=(0,) * len(shape))
    base_data = pack4(codes) if base_type == "uint4" else codes.reshape(-1)
    base = dense(f"{name}.base", base_type, shape, base_data, d, shard=shard, role=ROLE_BASE)
    corr = dense(f"{name}.min", "uint2", shape, pack2(corr_codes), corr_scale, shard=shard, role=ROLE_CORRECTION)
    head = Descriptor(element_type=element_type("float32"), shape=shape, buffers=(),
                      layout=CompositeHead(composition_rule=RULE_OVERLAY, combine_op=OP_ADD, member_count=2))
    return Tensor(name, head, members=(base, corr))


def to_hurray(qtype: Q, raw: np.ndarray, shape) -> Tensor:
    """Move a gguf-py quantized array (numpy shape (..., ncols/32*bytes)) into a Hurray tensor."""
    blocks = raw.reshape(-1, BLOCK_BYTES[qtype])
    if qtype == Q.Q8_0:
        d, q = blocks[:, :2], blocks[:, 2:]
        d = substitute_zero_scales(d, np.all(q == 0, axis=1))
        return dense("q8_0", "int8", shape, q, d)
    if qtype == Q.Q4_0:
        d, codes = blocks[:, :2], gguf_nibbles(blocks[:, 2:]) ^ 8  # int4 code of q-8 is q XOR 8
        d = substitute_zero_scales(d, np.all(codes == 0, axis=1))
        return dense("q4_0", "int4", shape, pack4(codes), d)
    if qtype == Q.Q5_0:
        d, qh, qs = blocks[:, :2], blocks[:, 2:6], blocks[:, 6:]
        q = (gguf_nibbles(qs) | (gguf_qh(qh) << 4)).astype(np.int16) - 16
        d = substitute_zero_scales(d, np.all(q == 0, axis=1))
        return dense("q5_0", "int8", shape, q.astype(np.int8).view(np.uint8), d)
    if qtype == Q.Q4_1:
        d, m, codes = blocks[:, :2], blocks[:, 2:4], gguf_nibbles(blocks[:, 4:])
        return overlay_q41("q4_1", shape, d, m, codes, "uint4")
    if qtype == Q.Q5_1:
        d, m, qh, qs = blocks[:, :2], blocks[:, 2:4], blocks[:, 4:8], blocks[:, 8:]
        codes = gguf_nibbles(qs) | (gguf_qh(qh) << 4)
        return overlay_q41("q5_1", shape, d, m, codes, "uint8")
    if qtype == Q.MXFP4:
        e, codes = blocks[:, 0].copy(), gguf_nibbles(blocks[:, 1:])
        zero_block = np.all((codes & 7) == 0, axis=1)
        assert np.all(zero_block[e == 0]), "e = 0 on a non-zero block is not representable"
        e[e == 0] = 0x7F  # docs/conversion-rules.md § 4
        desc = Descriptor(
            element_type=element_type("float4_e2m1"), shape=tuple(shape),
            buffers=(BufferHandle.cpu(codes.size // 2), BufferHandle.cpu(e.size)),
            quantization=MXFP(axis=len(shape) - 1, block_size=32, scale_buffer_index=1),
        )
        return Tensor("mxfp4", desc, (pack4(codes), e))
    raise AssertionError(qtype)


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype == np.float32 and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def sample(shape, seed, zero_blocks=True):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 30.0], size=shape[:-1] + (1,))).astype(np.float32)
    if zero_blocks:
        flat = x.reshape(-1, 32)
        flat[rng.random(flat.shape[0]) < 0.1] = 0.0  # all-zero blocks: d = 0 / e = 0 in gguf-py
        flat[1] = 0.0
        flat[2] = 0.75  # a constant block (Q4_1: d = 0, m = 0.75)
        flat[3] = np.abs(flat[3])  # a block whose minimum may be exactly representable
        flat[3, 0] = 0.0  # Q4_1 m = +0
    return x


GGUF_TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.MXFP4]
SHAPES = [(160,), (5, 96), (3, 4, 64), (2, 3, 2, 128)]


@pytest.mark.parametrize("qtype", GGUF_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gguf_block_types_bit_exact(qtype, shape):
    x = sample(shape, seed=len(shape) * 100 + int(qtype))
    raw = gguf_quantize(x, qtype)
    t = to_hurray(qtype, raw, shape)
    ref = gguf_dequantize(raw, qtype).reshape(shape)
    ours = dequantize(t)
    # the substituted zero blocks are really there (the test would be weaker without them)
    assert np.any(np.all(x.reshape(-1, 32) == 0, axis=1))
    assert bits_equal(ours, ref)


@pytest.mark.parametrize("qtype", GGUF_TYPES, ids=lambda t: t.name)
def test_gguf_block_types_chunked(qtype):
    shape = (6, 5, 64)
    raw = gguf_quantize(sample(shape, seed=7), qtype)
    t = to_hurray(qtype, raw, shape)
    ref = gguf_dequantize(raw, qtype).reshape(shape)
    got = np.full(shape, np.nan, np.float32)
    chunks = 0
    for index, values in iter_dequantize(t, max_elements=100):
        assert values.size <= 100 and values.dtype == np.float32
        got[index] = values
        chunks += 1
    assert chunks > 10
    assert bits_equal(got, ref)


def test_mxfp4_code_8_is_the_only_difference():
    """ggml decodes MXFP4 code 8 as +0, OCP (Hurray) as -0: equal in value, and nothing else differs."""
    shape = (8, 256)
    x = sample(shape, seed=11, zero_blocks=False)
    raw = gguf_quantize(x, Q.MXFP4).copy()
    blocks = raw.reshape(-1, 17)
    rng = np.random.default_rng(12)
    # gguf-py's argmin never picks code 8; plant it (other encoders do emit it) in both nibble halves
    pos = rng.choice(blocks.shape[0] * 16, size=40, replace=False)
    rows, cols = pos // 16, 1 + pos % 16
    hi = rng.random(40) < 0.5
    blocks[rows[hi], cols[hi]] = (blocks[rows[hi], cols[hi]] & 0x0F) | 0x80
    blocks[rows[~hi], cols[~hi]] = (blocks[rows[~hi], cols[~hi]] & 0xF0) | 0x08
    t = to_hurray(Q.MXFP4, raw, shape)
    ref = gguf_dequantize(raw, Q.MXFP4).reshape(shape)
    ours = dequantize(t)
    codes = gguf_nibbles(blocks[:, 1:]).reshape(shape)
    differ = ours.view(np.uint32) != ref.view(np.uint32)
    assert np.array_equal(differ, codes == 8)
    assert differ.sum() == 40
    assert np.all(ours[differ].view(np.uint32) == 0x80000000) and np.all(ref[differ].view(np.uint32) == 0)
    assert np.array_equal(ours, ref)  # equal as values (-0 == +0)


def test_gguf_large_tensor_bit_exact():
    """One tensor of tens of MB (16 Mi weights, 64 MiB of float32 output) through the chunked path."""
    shape = (4096, 4096)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape, dtype=np.float32)
    x[::97] = 0.0
    raw = gguf_quantize(x, Q.Q4_0)
    assert raw.nbytes > 9_000_000
    t = to_hurray(Q.Q4_0, raw, shape)
    ref = gguf_dequantize(raw, Q.Q4_0)
    assert bits_equal(dequantize(t, threads=2), ref)
    assert bits_equal(dequantize(t, threads=1), ref)


# ---------------------------------------------------------------------------
# MX element types: all codes × scale bytes against ml_dtypes / torch


SCALE_BYTES = np.array([1, 2, 100, 127, 128, 200, 254], dtype=np.uint8)
MX_TYPES = {
    # hurray name: (bits, ml_dtypes dtype, torch dtype or None)
    "float8_e4m3": (8, ml_dtypes.float8_e4m3fn, torch.float8_e4m3fn),
    "float8_e5m2": (8, ml_dtypes.float8_e5m2, torch.float8_e5m2),
    "float6_e2m3": (6, ml_dtypes.float6_e2m3fn, None),
    "float6_e3m2": (6, ml_dtypes.float6_e3m2fn, None),
    "float4_e2m1": (4, ml_dtypes.float4_e2m1fn, None),  # torch float4_e2m1fn_x2 is view-only
    "int8": (8, np.int8, torch.int8),
    "int4": (4, ml_dtypes.int4, None),
}
PACKERS = {8: lambda c: c.astype(np.uint8), 6: pack6, 4: pack4}


def element_oracle(name: str, codes: np.ndarray) -> np.ndarray:
    bits, mld, tdt = MX_TYPES[name]
    c = codes.astype(np.uint8)
    if name == "int4":  # ml_dtypes int4 from the two's complement nibble
        v = ((c.astype(np.int16) ^ 8) - 8).astype(mld)
    else:  # one code per byte: ml_dtypes' value map of the bit pattern
        v = c.view(mld)
    ref = v.astype(np.float64)
    if tdt is not None:  # torch agrees with ml_dtypes on every code (NaNs included)
        tv = torch.from_numpy(codes.astype(np.uint8)).view(tdt).to(torch.float64).numpy()
        assert np.array_equal(tv, ref, equal_nan=True)
    return ref


def e8m0_oracle(e: np.ndarray) -> np.ndarray:
    s = e.astype(np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    ts = torch.from_numpy(e.astype(np.uint8)).view(torch.float8_e8m0fnu).to(torch.float64).numpy()
    assert np.array_equal(s, ts)
    assert np.array_equal(s, np.ldexp(1.0, e.astype(np.int64) - 127))
    return s


def mx_expected(name: str, codes: np.ndarray, scale_bytes: np.ndarray) -> np.ndarray:
    """float64 product, checked exactly representable in float32 (or overflowing), then float32."""
    prod = element_oracle(name, codes) * e8m0_oracle(scale_bytes)
    with np.errstate(over="ignore"):
        f32 = prod.astype(np.float32)
    finite = np.isfinite(f32)
    assert np.array_equal(f32[finite].astype(np.float64), prod[finite]), "product not exact in float32"
    assert np.all(np.isinf(f32[np.isfinite(prod) & ~finite]))
    return f32


def assert_same_values(ours: np.ndarray, expected: np.ndarray) -> None:
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(ours), nan)
    assert np.array_equal(ours[~nan].view(np.uint32), expected[~nan].view(np.uint32))


@pytest.mark.parametrize("name", list(MX_TYPES))
@pytest.mark.parametrize("axis", [1, 0])
def test_mx_elements_exhaustive(name, axis):
    bits = MX_TYPES[name][0]
    ncodes = 1 << bits
    K = 16
    per_row = max(ncodes, 32)  # a multiple of K holding every code
    codes = np.tile(np.arange(ncodes, dtype=np.uint8), per_row // ncodes)
    grid = np.tile(codes, (SCALE_BYTES.size, 1))  # (7, per_row): row r uses scale byte r
    scales = np.repeat(SCALE_BYTES, per_row // K)  # blocks of row r, row-major
    if axis == 0:  # the same values transposed: blocks now run down the columns
        grid = grid.T.copy()
        scales = np.repeat(SCALE_BYTES[None, :], per_row // K, axis=0).reshape(-1)  # (nb, 7) row-major over outer
        # block index b = outer * nb + i_axis // K with outer = column: reorder to (7, nb)
        scales = scales.reshape(per_row // K, SCALE_BYTES.size).T.reshape(-1)
    data = PACKERS[bits](grid.reshape(-1))
    desc = Descriptor(
        element_type=element_type(name), shape=grid.shape,
        buffers=(BufferHandle.cpu(data.size), BufferHandle.cpu(scales.size)),
        quantization=MXFP(axis=axis, block_size=K, scale_buffer_index=1),
    )
    ours = dequantize(Tensor(f"mx_{name}", desc, (data, scales)))
    scale_per_elem = SCALE_BYTES[:, None] if axis == 1 else SCALE_BYTES[None, :]
    expected = mx_expected(name, grid, np.broadcast_to(scale_per_elem, grid.shape))
    assert_same_values(ours, expected)
    # subnormal float32 results are kept, not flushed (e.g. 2^-126 · 0.5 for e = 1)
    if name in ("float4_e2m1", "float6_e2m3", "float8_e4m3", "float8_e5m2"):
        tiny = (expected != 0) & (np.abs(expected) < np.finfo(np.float32).tiny)
        assert tiny.any() and np.all(ours[tiny] == expected[tiny])


@pytest.mark.parametrize("name", ["float8_e4m3", "float8_e5m2", "float6_e2m3", "float6_e3m2", "float4_e2m1"])
def test_plain_mx_element_tensors(name):
    """Unquantized OCP element tensors decode through the same value maps (scale 1)."""
    bits = MX_TYPES[name][0]
    codes = np.arange(1 << bits, dtype=np.uint8)
    data = PACKERS[bits](codes)
    desc = Descriptor(element_type=element_type(name), shape=(codes.size,), buffers=(BufferHandle.cpu(data.size),))
    ours = dequantize(Tensor("plain", desc, (data,)))
    assert_same_values(ours, element_oracle(name, codes).astype(np.float32))


def test_plain_e8m0_tensor():
    e = np.arange(1, 255, dtype=np.uint8)
    desc = Descriptor(element_type=element_type("float8_e8m0"), shape=(e.size,), buffers=(BufferHandle.cpu(e.size),))
    ours = dequantize(Tensor("e8m0", desc, (e,)))
    exp = e8m0_oracle(e).astype(np.float32)
    assert np.array_equal(ours.view(np.uint32), exp.view(np.uint32))
