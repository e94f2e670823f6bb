"""Sub-byte packing in the core (element-types.md § packing), against a per-element oracle.

The oracle reads one element at a time with Python integers, straight from the spec's
rule: LSB-first within a byte (element ``i`` of a ``b``-bit type sits at bits
``b·(i mod 8/b)`` of byte ``i div 8/b``); 6-bit elements four to a 24-bit little-endian
group.  The dequantizer decodes every sub-byte code through these functions.
"""

from __future__ import annotations

import numpy as np
import pytest

from hurray_interop.core.elements import e8m0_reserved, element_type, pack, sign_extend, unpack, unpack_at

SUB_BYTE = ["bool", "uint2", "int2", "uint4", "int4", "float4_e2m1", "float6_e2m3", "float6_e3m2"]


def oracle(data: bytes, bits: int, i: int) -> int:
    """Raw code of element ``i`` (``i`` counted from the start of ``data``)."""
    if bits == 6:
        g, j = divmod(i, 4)
        word = data[3 * g] | data[3 * g + 1] << 8 | data[3 * g + 2] << 16
        return (word >> (6 * j)) & 0x3F
    per = 8 // bits
    return (data[i // per] >> (bits * (i % per))) & ((1 << bits) - 1)


@pytest.mark.parametrize("name", SUB_BYTE)
def test_unpack_matches_the_spec_rule(name):
    et = element_type(name)
    rng = np.random.default_rng(et.tag)
    for count in (0, 1, 3, 5, 8, 33, 1001):
        data = rng.integers(0, 256, -(-count * et.bits // 8) + 3, dtype=np.uint8)
        got = unpack(data, et, count).view(np.uint8)
        want = [oracle(bytes(data), et.bits, i) for i in range(count)]
        assert got.tolist() == want
        assert np.array_equal(unpack(pack(got, et), et, count).view(np.uint8), got)  # pack inverts unpack


@pytest.mark.parametrize("name", SUB_BYTE)
def test_unpack_at_reads_any_positions_around_a_byte_offset(name):
    et = element_type(name)
    rng = np.random.default_rng(et.tag + 1)
    data = rng.integers(0, 256, 60, dtype=np.uint8)
    byte_offset = 24  # a multiple of 3: element offsets may reach before it
    per_byte = 8 / et.bits
    lo, hi = -int(byte_offset * per_byte), int((60 - byte_offset) * per_byte) - 1
    offsets = rng.integers(lo, hi, (7, 5))
    got = unpack_at(data, et, offsets, byte_offset)
    base = int(byte_offset * per_byte)
    want = [[oracle(bytes(data), et.bits, base + int(o)) for o in row] for row in offsets]
    assert got.shape == offsets.shape and got.tolist() == want


@pytest.mark.parametrize("bits", [1, 2, 4, 6, 8])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int64])
def test_sign_extend_is_twos_complement_of_the_low_bits(bits, dtype):
    codes = np.arange(256).astype(dtype)
    low = [c & ((1 << bits) - 1) for c in range(256)]
    want = [v - (1 << bits) if v >= 1 << (bits - 1) else v for v in low]
    got = sign_extend(codes, bits)
    assert got.dtype == np.int8 and got.tolist() == want


def test_e8m0_reserved_codes():
    codes = np.arange(256, dtype=np.uint8)
    assert np.flatnonzero(e8m0_reserved(codes)).tolist() == [0x00, 0xFF]


# ---------------------------------------------------------------------------
# the OCP small floats' values, computed from the table, against ml_dtypes


def test_code_values_of_every_minifloat_match_ml_dtypes() -> None:
    from hurray_interop.core.elements import ELEMENT_TYPES, code_values

    floats = [et for et in ELEMENT_TYPES.values() if et.minifloat is not None]
    assert {et.name for et in floats} == {"float8_e4m3", "float8_e5m2", "float4_e2m1", "float6_e2m3", "float6_e3m2"}
    for et in floats:
        ours = code_values(et)
        ref = np.arange(1 << et.bits, dtype=np.uint8).view(et.dtype).astype(np.float32)  # ml_dtypes' cast
        assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), et.name


def test_code_values_refuses_other_types() -> None:
    from hurray_interop.core.elements import code_values
    from hurray_interop.errors import UnsupportedError

    with pytest.raises(UnsupportedError):
        code_values(element_type("int8"))
