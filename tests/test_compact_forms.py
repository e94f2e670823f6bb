"""The building blocks of the compact exact forms (hurray_interop.conversions.gguf_compact;
docs/conversion-rules.md § 11), checked against independent arithmetic: the packing by hand
(format-notes § 2.4), the flip's float32 values against ggml's ``s·q + (±0)`` exhaustively over
every positive float16 scale, the planes' sum against ``s·q``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hurray_interop.conversions import gguf_compact as C
from hurray_interop.core.descriptor import validate_descriptor
from hurray_interop.core.model import RowMajor, Strided


def _nibbles_by_hand(q: np.ndarray) -> np.ndarray:
    q = q.astype(np.uint8)
    return (q[0::2] | (q[1::2] << 4)).astype(np.uint8)


def _crumbs_by_hand(q: np.ndarray) -> np.ndarray:
    q = (q.astype(np.int16) & 3).astype(np.uint8).reshape(-1, 4)
    return (q[:, 0] | q[:, 1] << 2 | q[:, 2] << 4 | q[:, 3] << 6).astype(np.uint8)


@pytest.mark.parametrize("signed_hi", [False, True])
def test_planes_split_into_uint4_and_a_two_bit_plane(signed_hi: bool) -> None:
    q = np.random.default_rng(5).integers(0, 32, 4096).astype(np.uint8)
    q[:32] = np.arange(32)
    lo, hi = C.split_planes(q, signed_hi=signed_hi)
    assert np.array_equal(lo, _nibbles_by_hand(q & 15))
    want_hi = (q >> 4).astype(np.int16) - (1 if signed_hi else 0)  # int2 two's complement: −1 = 0b11
    assert np.array_equal(hi, _crumbs_by_hand(want_hi))
    assert np.array_equal(C.join_planes(lo, hi, q.size, signed_hi=signed_hi), q)


def _positive_f16() -> np.ndarray:
    bits = np.arange(1, 0x7C00, dtype=np.uint16)  # every positive finite float16, subnormals included
    return bits.view(np.float16).astype(np.float32)


@pytest.mark.parametrize("qmax", [3, 15, 31])
def test_a_flipped_block_gives_ggmls_values_for_every_positive_f16_scale(qmax: int) -> None:
    """(−s)·(qmax − q) + qmax·s against ggml's s·q + m with m = +0 and m = −0, as float32
    bits: every positive float16 s (Q4_1/Q5_1 d, the stand-in 1 included), every code."""
    s = _positive_f16()[:, None]
    q = np.arange(qmax + 1, dtype=np.float32)[None, :]
    corr = (np.float32(qmax) * s).astype(np.float32)  # exact: ≤ 16 significant bits
    ours = ((-s) * (np.float32(qmax) - q)).astype(np.float32) + corr
    for m in (np.float32(0.0), np.float32(-0.0)):
        ggml = (s * q).astype(np.float32) + m
        assert np.array_equal(ours.view(np.uint32), ggml.view(np.uint32))


def test_a_flipped_k_quant_sub_block_is_exact_for_products_of_d_and_sc() -> None:
    """K-quants: s = float32(d)·sc (d float16 > 0, sc 1..63), qmax 3/15/31."""
    rng = np.random.default_rng(7)
    d = _positive_f16()[rng.integers(0, 0x7BFF, 4000)]
    s = (d[:, None] * np.arange(1, 64, dtype=np.float32)[None, :]).reshape(-1, 1).astype(np.float32)
    for qmax in (3, 15, 31):
        q = np.arange(qmax + 1, dtype=np.float32)[None, :]
        ours = ((-s) * (np.float32(qmax) - q)).astype(np.float32) + (np.float32(qmax) * s).astype(np.float32)
        ggml = (s * q).astype(np.float32) - np.float32(0.0)  # d1·q − (dmin·0)
        assert np.array_equal(ours.view(np.uint32), ggml.view(np.uint32))


def test_a_negative_scale_cannot_be_flipped() -> None:
    """For s < 0 ggml's zero at q = 0 is −0 when the minimum is −0; the flip gives +0."""
    s, m = np.float32(-0.5), np.float32(-0.0)
    ggml = s * np.float32(0) + m
    ours = (-s) * np.float32(15) + np.float32(15) * s
    assert np.signbit(ggml) and not np.signbit(ours)
    assert not C.flip_mask(np.array([s, np.float32(-0.0), np.float32(0.0)]), np.array([True, True, True])).any()
    assert C.flip_mask(np.array([np.float32(0.5)]), np.array([True])).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_flipped_blocks_are_recognised_by_their_scales(dtype: type) -> None:
    b = np.array([-0.5, -0.5, 0.5, -0.25, -1.0], dtype=dtype)
    v = np.array([7.5, 7.0, -7.5, 3.75, 15.0], dtype=dtype)
    assert C.flipped(b, v, 15).tolist() == [True, False, False, True, True]


def test_flip_codes_xors_the_marked_blocks_only() -> None:
    packed = np.arange(12, dtype=np.uint8).reshape(3, 4)
    want = packed.copy()
    want[1] ^= 0xFF
    C.flip_codes(packed, np.array([False, True, False]), 0xFF)
    assert np.array_equal(packed, want)
    q = np.array([0, 7, 15, 3], np.uint8)
    flipped = _nibbles_by_hand(q) ^ np.uint8(0xFF)
    assert np.array_equal(flipped, _nibbles_by_hand(15 - q))


def test_a_broadcast_member_is_one_code_byte_and_a_scale_per_block() -> None:
    d = C.broadcast_member((4, 64), 32, "float16")
    validate_descriptor(d)
    assert isinstance(d.layout, Strided) and d.layout.strides == (0, 0)
    assert [b.byte_size for b in d.buffers] == [1, 8 * 2]
    assert C.is_broadcast(d)
    assert C.broadcast_code().tobytes() == b"\x01"

    assert not C.is_broadcast(dataclasses.replace(d, layout=Strided((0, 1))))
    assert not C.is_broadcast(dataclasses.replace(d, layout=RowMajor()))
