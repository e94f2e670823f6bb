"""Broadcast (zero-stride) members in the dequantizer, against an independent numpy decoder.

A strided member whose strides are 0 along some axes stores each code once along them
(hurray-spec/layouts/strided.md: a broadcast dimension); per-block affine still takes the
block index from the logical position.  The dequantizer fetches such codes over the reduced
grid only and, for strides all 0 (the compact forms' broadcast minimum), computes one value
per block and adds it straight into an overlay's accumulator (docs/conversion-rules.md § 11).

The expected values are computed here: the test packs codes LSB-first itself, unpacks every
stored element itself, reads them through numpy's ``as_strided`` at the element strides, and
applies ``float32(s_b) · float32(q − z_b)`` with the scales repeated per block -- never through
the module under test.  Composites are the compact forms' overlays (a row-major uint4 base,
a broadcast uint8 minimum, a uint2 bit plane), their expected values summed in emission order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from test_dequant import pack  # the test-local packer (element-types.md, LSB-first)

import hurray_interop.dequant as dq
import hurray_interop.kernels as kernels
from hurray_interop.core.elements import element_type
from hurray_interop.core.hrry import HrryFile, HrryWriter
from hurray_interop.core.model import (
    OP_ADD,
    ROLE_BASE,
    ROLE_CORRECTION,
    RULE_OVERLAY,
    BufferHandle,
    CompositeHead,
    CompositeMember,
    Descriptor,
    PerBlockAffine,
    PerChannelAffine,
    PerTensorAffine,
    RowMajor,
    Shard,
    Strided,
    Tensor,
)
from hurray_interop.dequant import dequantize, iter_dequantize
from hurray_interop.errors import TruncatedError

RNG = np.random.default_rng(20261202)
STORAGES = ("int2", "uint2", "int4", "uint4", "int8", "uint8")


# ---------------------------------------------------------------------------
# test-local packing and the independent decoder


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (any ints, flattened) as Hurray bytes: byte types as themselves, sub-byte ones by
    test_dequant's test-local packer (LSB-first)."""
    if bits < 8:
        return pack(codes, bits)
    return (np.asarray(codes).reshape(-1).astype(np.int64) & 0xFF).astype(np.uint8)


def _unpacked(buf: np.ndarray, storage: str) -> np.ndarray:
    """Every element the bytes hold, as int64 (signed types sign-extended)."""
    bits = int(storage.lstrip("uint"))
    per = 8 // bits
    raw = np.stack([(buf >> (bits * j)) & ((1 << bits) - 1) for j in range(per)], axis=1).reshape(-1).astype(np.int64)
    if storage.startswith("int"):
        raw = np.where(raw >= 1 << (bits - 1), raw - (1 << bits), raw)
    return raw


def _expected(buf, storage, shape, strides, start, axis, K, scales, zeros) -> np.ndarray:
    """numpy's strided view of the unpacked codes (start: the first element's index), times each
    block's scale after subtracting its zero point (float32 operations, as the spec states)."""
    flat = _unpacked(buf, storage)
    q = np.lib.stride_tricks.as_strided(flat[start:], shape=shape, strides=tuple(s * 8 for s in strides),
                                        writeable=False)
    def per_element(p: np.ndarray) -> np.ndarray:  # b = outer · blocks + i_axis // K (the seed)
        p = p.reshape((*shape[:axis], *shape[axis + 1 :], shape[axis] // K))
        return np.repeat(np.moveaxis(p, -1, axis), K, axis=axis)

    s = per_element(scales.astype(np.float32))
    if zeros is None:
        return q.astype(np.float32) * s
    return (q - per_element(zeros)).astype(np.float32) * s


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(np.asarray(a, np.float32).view(np.uint32),
                                                 np.asarray(b, np.float32).view(np.uint32))


def _reach(shape, strides, start: int) -> int:
    """Elements a strided view starting at element ``start`` needs (numpy's rule, here)."""
    hi = start + sum(max(0, (n - 1) * s) for n, s in zip(shape, strides))
    lo = start + sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
    assert lo >= 0
    return hi + 1


def _case(storage, scale_type, with_zero, shape, strides, axis=-1, K=32, negative_start=0):
    """A per-block affine strided tensor with random stored codes, and its independent values."""
    et = element_type(storage)
    axis %= len(shape)
    bits = et.bits
    per = 8 // bits
    start = -(-negative_start // per) * per  # a byte boundary: byte_offset is in bytes
    n_codes = _reach(shape, strides, start)
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if et.kind == "int" else (0, 1 << bits)
    codes = RNG.integers(lo, hi, n_codes)
    buf = _pack(codes, bits)
    blocks = int(np.prod(shape)) // K
    scales = RNG.standard_normal(blocks).astype(scale_type)
    scales[scales == 0] = 1
    bufs = [buf, scales.view(np.uint8)]
    zeros = None
    if with_zero:
        zeros = RNG.integers(lo, hi, blocks).astype(np.int32)
        bufs.append(zeros.view(np.uint8))
    q = PerBlockAffine(axis=axis, block_size=K, scale_buffer_index=1, scale_type=element_type(scale_type),
                       zero_point_buffer_index=2 if with_zero else None)
    desc = Descriptor(et, tuple(shape), tuple(BufferHandle.cpu(b.size) for b in bufs), layout=Strided(tuple(strides)),
                      byte_offset=start // per, quantization=q)
    want = _expected(buf, storage, tuple(shape), strides, start, axis, K, scales, zeros)
    return Tensor("t", desc, tuple(bufs)), want


# ---------------------------------------------------------------------------
# dense broadcast members

STRIDES = [
    ((4, 64), (0, 0), -1),  # the broadcast minimum: one code
    ((4, 64), (0, 1), -1),  # one row of codes for all rows
    ((4, 64), (1, 0), -1),  # one code per row
    ((64, 4), (0, 0), 0),  # blocks along axis 0
    ((3, 4, 64), (0, 64, 1), -1),  # one 4×64 plane for all three
    ((3, 4, 64), (0, 0, 0), 1),
]


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("scale_type", ["float16", "float32"])
@pytest.mark.parametrize("with_zero", [False, True])
@pytest.mark.parametrize("shape, strides, axis", STRIDES)
def test_zero_strides_against_an_independent_decoder(storage, scale_type, with_zero, shape, strides, axis) -> None:
    K = 4 if shape[axis] == 4 else 32
    t, want = _case(storage, scale_type, with_zero, shape, strides, axis, K)
    assert _same_bits(dequantize(t), want)
    got = np.empty(shape, np.float32)
    for mx in (5, 40, 100):  # pieces cutting through blocks and rows
        got[...] = np.nan
        for index, values in iter_dequantize(t, max_elements=mx):
            got[index] = values
        assert _same_bits(got, want)


@pytest.mark.parametrize("storage", STORAGES)
def test_negative_and_zero_strides_from_a_byte_offset(storage) -> None:
    """(0, −1): one row stored last to first, the first element 64 elements into the buffer."""
    t, want = _case(storage, "float32", True, (4, 64), (0, -1), K=32, negative_start=64)
    assert t.descriptor.byte_offset > 0
    assert _same_bits(dequantize(t), want)


def test_signed_zero_and_nan_keep_their_bits() -> None:
    """Code 0 times a negative scale is −0, a NaN scale (strict=False) gives NaN: as numpy."""
    t, _ = _case("int8", "float32", False, (2, 64), (0, 0))
    scales = np.array([-2.0, np.nan, 3.0, -0.5], np.float32)
    t = Tensor("t", t.descriptor, (np.zeros(1, np.uint8), scales.view(np.uint8)))
    got = dequantize(t, strict=False)
    want = np.repeat(scales.reshape(2, 2), 32, axis=1) * np.float32(0)
    assert _same_bits(got, want)
    assert np.signbit(got[0, :32]).all() and np.isnan(got[0, 32:]).all()


@pytest.mark.parametrize("strides", [(0, 0), (0, 1), (1, 0)])
def test_zero_strides_with_the_other_schemes(strides) -> None:
    """Unquantized (float16), per-tensor and per-channel affine over broadcast codes: each
    value from numpy's strided view of the stored codes, independently."""
    shape = (4, 64)
    start = 0
    n = _reach(shape, strides, start)
    halves = RNG.standard_normal(n).astype(np.float16)
    view = np.lib.stride_tricks.as_strided(halves, shape=shape, strides=tuple(s * 2 for s in strides), writeable=False)
    desc = Descriptor(element_type("float16"), shape, (BufferHandle.cpu(halves.nbytes),), layout=Strided(strides))
    assert _same_bits(dequantize(Tensor("f", desc, (halves.view(np.uint8),))), view.astype(np.float32))
    codes = RNG.integers(-8, 8, n).astype(np.int8)
    q8 = np.lib.stride_tricks.as_strided(codes, shape=shape, strides=strides, writeable=False).astype(np.int64)
    pt = Descriptor(element_type("int8"), shape, (BufferHandle.cpu(n),), layout=Strided(strides),
                    quantization=PerTensorAffine(scale=0.375, zero_point=3))
    want = (q8 - 3).astype(np.float32) * np.float32(0.375)
    assert _same_bits(dequantize(Tensor("pt", pt, (codes.view(np.uint8),))), want)
    scales = RNG.standard_normal(shape[0]).astype(np.float32)
    zeros = RNG.integers(-8, 8, shape[0]).astype(np.int32)
    pc = Descriptor(element_type("int8"), shape, (BufferHandle.cpu(n), BufferHandle.cpu(16), BufferHandle.cpu(16)),
                    layout=Strided(strides), quantization=PerChannelAffine(axis=0, scale_buffer_index=1,
                                                                         zero_point_buffer_index=2))
    want = (q8 - zeros[:, None]).astype(np.float32) * scales[:, None]
    got = dequantize(Tensor("pc", pc, (codes.view(np.uint8), scales.view(np.uint8), zeros.view(np.uint8))))
    assert _same_bits(got, want)


@pytest.mark.parametrize("code_bytes, ok", [(63, False), (64, True), (65, True)])
def test_one_row_of_codes_needs_the_whole_row(code_bytes: int, ok: bool) -> None:
    """Strides (0, 1) over 64 columns of uint8 address 64 bytes: 63 is refused with the
    addressed-range message, 64 and 65 evaluate."""
    scales = np.ones(8, np.float32)
    codes = np.arange(code_bytes, dtype=np.uint8)
    q = PerBlockAffine(axis=1, block_size=32, scale_buffer_index=1, scale_type=element_type("float32"))
    desc = Descriptor(element_type("uint8"), (4, 64), (BufferHandle.cpu(code_bytes), BufferHandle.cpu(32)),
                      layout=Strided((0, 1)), quantization=q)
    t = Tensor("m", desc, (codes, scales.view(np.uint8)))
    if not ok:
        with pytest.raises(TruncatedError, match=f"the layout addresses bytes up to 64, buffer 0 holds {code_bytes}"):
            dequantize(t)
        return
    assert _same_bits(dequantize(t), np.tile(codes[:64].astype(np.float32), (4, 1)))


# ---------------------------------------------------------------------------
# no element-sized gather for broadcast codes


def test_broadcast_codes_are_fetched_once(monkeypatch) -> None:
    """The offsets gathered are the reduced grid's (one code; one row), never one per element,
    and the element-offset builder is not called at all."""
    monkeypatch.setattr(kernels, "_lib", None)  # the numpy evaluation (the compiled path: test_dequant_kernel.py)
    seen: list[int] = []
    real = dq._Dense._gather_packed

    def gather(self, off):
        seen.append(off.size)
        return real(self, off)

    def no_offsets(self, *a):
        raise AssertionError("element offsets built for a broadcast member")

    monkeypatch.setattr(dq._Dense, "_gather_packed", gather)
    monkeypatch.setattr(dq._Dense, "_offsets", no_offsets)
    for strides, reduced in (((0, 0), 1), ((0, 1), 64)):
        seen.clear()
        t, want = _case("uint4", "float16", True, (64, 64), strides)
        assert _same_bits(dequantize(t), want)
        assert seen and set(seen) == {reduced}


# ---------------------------------------------------------------------------
# the compact forms' overlays: base + broadcast minimum + bit plane

ROWS, COLS, K = 8, 256, 32


def _member(name, storage, codes, scales, layout, role, code_bytes=None) -> tuple[str, Descriptor, list[np.ndarray]]:
    buf = _pack(codes, element_type(storage).bits) if code_bytes is None else code_bytes
    q = PerBlockAffine(axis=1, block_size=K, scale_buffer_index=1, scale_type=element_type(scales.dtype.name))
    desc = Descriptor(element_type(storage), (ROWS, COLS), (BufferHandle.cpu(buf.size), BufferHandle.cpu(scales.nbytes)),
                      layout=layout, quantization=q, shard=Shard(parent_shape=(ROWS, COLS), offset=(0, 0)),
                      composite_member=CompositeMember(role))
    return name, desc, [buf, scales.view(np.uint8)]


def _overlay(order: str, head_type: str):
    """Q5_1-like: ``d·lo + 16d·hi + m`` as members in ``order`` (b: base, p: plane, m: minimum),
    and the expected float32 values summed in that order (rounded per step for a float16 head)."""
    blocks = ROWS * COLS // K
    d = (RNG.random(blocks) * 0.01 + 1e-4).astype(np.float16)
    m = (RNG.standard_normal(blocks) * 0.05).astype(np.float16)
    m[m == 0] = np.float16(0.25)
    lo = RNG.integers(0, 16, (ROWS, COLS))
    hi = RNG.integers(0, 2, (ROWS, COLS))
    d16 = (d.astype(np.float32) * 16).astype(np.float16)
    parts = {
        "b": (_member("base", "uint4", lo, d, RowMajor(), ROLE_BASE), lo, d),
        "p": (_member("plane", "uint2", hi, d16, RowMajor(), ROLE_CORRECTION), hi, d16),
        "m": (_member("minimum", "uint8", None, m, Strided((0, 0)), ROLE_CORRECTION, np.array([1], np.uint8)),
              np.ones((ROWS, COLS), np.int64), m),
    }
    members = [parts[k][0] for k in order]
    acc = None
    for k in order:
        _, codes, s = parts[k]
        v = codes.astype(np.float32) * np.repeat(s.astype(np.float32).reshape(ROWS, -1), K, axis=1)
        if head_type == "float16":
            v = v.astype(np.float16).astype(np.float32)
        acc = v if acc is None else acc + v
        if head_type == "float16":
            acc = acc.astype(np.float16).astype(np.float32)
    head = Descriptor(element_type(head_type), (ROWS, COLS), (),
                      layout=CompositeHead(composition_rule=RULE_OVERLAY, combine_op=OP_ADD, member_count=len(order)))
    return head, members, acc


@pytest.mark.parametrize("order", ["bm", "bpm", "bmp"])
@pytest.mark.parametrize("head_type", ["float32", "float16"])
def test_compact_overlays_from_a_file(tmp_path: Path, order: str, head_type: str) -> None:
    head, members, want = _overlay(order, head_type)
    path = tmp_path / "o.hrry"
    with HrryWriter(path) as w:
        w.write_composite("w", head, members)
        w.finish({})
    with HrryFile(path) as f:
        t = f.tensor("w")
        assert [m.descriptor.buffers[0].byte_size for m in t.members if m.name == "minimum"] == [1]
        assert _same_bits(dequantize(t), want)
        got = np.empty((ROWS, COLS), np.float32)
        for index, values in iter_dequantize(t, max_elements=100):
            got[index] = values
        assert _same_bits(got, want)


def test_the_broadcast_minimum_is_added_in_place(monkeypatch, tmp_path: Path) -> None:
    """A float32 overlay adds the broadcast member into its accumulator: the composite asks for
    no work buffer of its own (the element-sized temporary of a correction member), while the
    plane member still takes one."""
    monkeypatch.setattr(kernels, "_lib", None)  # the numpy evaluation (the compiled path: test_dequant_kernel.py)
    asked: list[str] = []
    real = dq._Work.buffer

    def buffer(self, owner, n):
        if isinstance(owner, dq._Composite):
            asked.append("composite")
        return real(self, owner, n)

    monkeypatch.setattr(dq._Work, "buffer", buffer)
    for order, needs_tmp in (("bm", False), ("bpm", True)):
        asked.clear()
        head, members, want = _overlay(order, "float32")
        t = Tensor("w", head, members=tuple(Tensor(n, d, tuple(b)) for n, d, b in members))
        assert _same_bits(dequantize(t), want)
        assert bool(asked) == needs_tmp
