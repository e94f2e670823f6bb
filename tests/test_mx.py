"""In-memory OCP MX <-> Hurray MXFP: round trips, scale edge cases, MXINT8, quantizer rules.

Oracles: the Hurray spec's own packing examples, ml_dtypes decoding of the source codes,
hand-computed OCP facts (docs/format-notes.md § 3.1), and the shared dequantizer (tests/test_mx_oracles.py
cross-checks that against torch).
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

from hurray_interop.core.model import MXFP
from hurray_interop.core.records import decode_scale_record, scale_record_key
from hurray_interop.errors import ConversionRefused, FormatError, InconsistentError, UnsupportedError, UsageError
from hurray_interop.conversions import mx

ELEMENTS = list(mx.MX_ELEMENTS)


def _random_codes(el: mx.MXElement, shape, rng) -> np.ndarray:
    """Any valid code of the element (NaN codes included for FP8), one per byte."""
    return rng.integers(0, 1 << el.bits, size=shape, dtype=np.uint16).astype(np.uint8)


def _shape_for(rank: int, k: int, axis: int) -> tuple[int, ...]:
    base = [3, 2, 5, 2][:rank]
    base[axis] = k * (2 if k < 2048 else 1)
    return tuple(base)


@pytest.mark.parametrize("name", ELEMENTS)
@pytest.mark.parametrize("k", [16, 32, 64, 2048])
@pytest.mark.parametrize("rank,axis", [(1, 0), (2, 0), (2, 1), (3, 0), (3, 2), (4, 0), (4, 3), (3, 1)])
def test_round_trip_codes_and_scales(name, k, rank, axis):
    el = mx.MX_ELEMENTS[name]
    rng = np.random.default_rng(zlib.crc32(repr((name, k, rank, axis)).encode()))
    shape = _shape_for(rank, k, axis)
    codes = _random_codes(el, shape, rng)
    lo = 7 if el.ocp_exponent_shift else 1
    sshape = tuple(d // k if i == axis else d for i, d in enumerate(shape))
    scales = rng.integers(lo, 255, size=sshape, dtype=np.uint16).astype(np.uint8)
    imp = mx.from_codes(codes.view(el.np_dtype), scales.view(ml_dtypes.float8_e8m0fnu), block_size=k, axis=axis, name="t")
    t = imp.tensor
    assert imp.status == "exact" and imp.substituted_blocks.size == 0
    q = t.descriptor.quantization
    assert isinstance(q, MXFP) and (q.axis, q.block_size, q.scale_buffer_index) == (axis, k, 1)
    assert t.descriptor.element_type.name == el.hurray.name and t.shape == shape
    # Hurray block order: b = outer * (S/K) + i_axis // K, outer row-major over the other axes
    moved = np.moveaxis(scales, axis, -1).reshape(-1).astype(np.int16) + el.ocp_exponent_shift
    assert bytes(t.data[1]) == bytes(moved.astype(np.uint8))
    back = mx.to_numpy(t)
    assert back.codes.dtype == el.np_dtype and back.codes.shape == shape
    assert bytes(back.codes.view(np.uint8)) == bytes(codes)
    assert back.scales.shape == sshape and bytes(back.scales.view(np.uint8)) == bytes(scales)


def test_fp6_packing_matches_spec_example():
    # element-types.md worked example: [1, 2, 4, 8] -> 81 40 20 (then padded to a block)
    codes = np.zeros(32, np.uint8)
    codes[:4] = [1, 2, 4, 8]
    t = mx.from_codes(codes, np.array([127], np.uint8), element="float6_e2m3").tensor
    assert bytes(t.data[0][:3]) == b"\x81\x40\x20" and len(t.data[0]) == 24


def test_fp4_packing_low_nibble_first_and_packed_input_is_zero_copy():
    codes = np.arange(32, dtype=np.uint8) % 16
    t = mx.from_codes(codes, np.array([127], np.uint8), element="fp4").tensor
    assert bytes(t.data[0][:2]) == bytes([0x10, 0x32])
    packed = np.frombuffer(bytes(t.data[0]), np.uint8).reshape(1, 16)
    t2 = mx.from_codes(packed, np.array([[127]], np.uint8), element="fp4", packed=True).tensor
    assert t2.shape == (1, 32) and bytes(t2.data[0]) == bytes(t.data[0])
    assert np.shares_memory(t2.data[0], packed)


def test_negative_zero_codes_are_kept():
    c = np.zeros(32, np.uint8)
    c[::2] = 0x80  # e4m3 -0
    t = mx.from_codes(c.view(ml_dtypes.float8_e4m3fn), np.array([0x7F], np.uint8)).tensor
    assert bytes(t.data[0]) == bytes(c)
    c4 = np.full(32, 8, np.uint8)  # fp4 -0
    t4 = mx.from_codes(c4, np.array([0x7F], np.uint8), element="float4_e2m1").tensor
    assert bytes(t4.data[0]) == b"\x88" * 16


@pytest.mark.parametrize("name", ["float8_e4m3", "float4_e2m1", "float6_e3m2", "int4"])
def test_zero_scale_on_all_zero_block_is_substituted_recorded_and_restored(name):
    el = mx.MX_ELEMENTS[name]
    rng = np.random.default_rng(1)
    codes = rng.integers(1, 1 << (el.bits - 1), size=(4, 64)).astype(np.uint8)
    codes[1, 32:] = 0
    if not el.is_int:
        codes[2, :32] = 1 << (el.bits - 1)  # all negative zeros
    scales = np.full((4, 2), 120, np.uint8)
    scales[1, 1] = 0
    if not el.is_int:
        scales[2, 0] = 0
    imp = mx.from_codes(codes, scales, element=el, name="w")
    hs = np.asarray(imp.tensor.data[1])
    want_blocks = [3] if el.is_int else [3, 4]
    assert list(imp.substituted_blocks) == want_blocks
    assert all(hs[b] == 0x7F for b in want_blocks)
    (key, rec), = imp.kv.items()
    assert key == scale_record_key("w") == "hurray_interop.scale_substitutions.w"
    blocks, orig = decode_scale_record(rec)
    assert list(blocks) == want_blocks and orig.reshape(-1).tolist() == [0] * len(want_blocks)
    assert bytes(mx.to_numpy(imp.tensor, record=rec).scales.view(np.uint8)) == bytes(scales)
    # without the record the legal substitute stays (values are identical either way)
    assert mx.to_numpy(imp.tensor).scales.view(np.uint8)[1, 1] == 0x7F


def test_zero_scale_on_nonzero_block_is_refused_naming_tensor_and_block():
    codes = np.zeros((2, 64), np.uint8)
    codes[1, 40] = 0x38  # e4m3 1.0, block 3
    scales = np.full((2, 2), 127, np.uint8)
    scales[1, 1] = 0
    with pytest.raises(ConversionRefused, match=r"tensor 'w'.*0x00.*block 3") as ei:
        mx.from_codes(codes.view(ml_dtypes.float8_e4m3fn), scales, name="w")
    assert ei.value.reasons[0][0] == "w"


def test_nan_scale_is_refused_even_on_a_zero_block():
    codes = np.zeros((1, 64), np.uint8)
    scales = np.array([[127, 0xFF]], np.uint8)
    with pytest.raises(ConversionRefused, match=r"0xFF.*block 1"):
        mx.from_codes(codes, scales, element="fp4", name="w")


def test_fallback_float32_is_value_exact_and_float16_reports_its_error():
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 0x7F, size=(2, 32)).astype(np.uint8)
    codes[0, 0] = 0x01  # smallest subnormal, so a tiny scale underflows float16
    scales = np.array([[0x00], [0x60]], np.uint8)
    imp = mx.from_codes(codes.view(ml_dtypes.float8_e4m3fn), scales, name="w", fallback="float32")
    assert imp.status == "value-exact" and imp.max_abs_error == 0.0
    t = imp.tensor
    assert t.descriptor.quantization is None and t.descriptor.element_type.name == "float32"
    ref = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * np.array([[2.0**-127], [2.0**-31]])
    assert np.array_equal(np.asarray(t.data[0]).view(np.float32).reshape(2, 32), ref.astype(np.float32))
    imp16 = mx.from_codes(codes.view(ml_dtypes.float8_e4m3fn), scales, name="w", fallback="float16")
    assert imp16.status == "lossy" and imp16.max_abs_error > 0
    with pytest.raises(UsageError, match="fallback"):
        mx.from_codes(codes.view(ml_dtypes.float8_e4m3fn), scales, name="w", fallback="int8")


def test_fallback_for_nan_block_stores_nans():
    codes = np.full((1, 32), 2, np.uint8)
    imp = mx.from_codes(codes, np.array([[0xFF]], np.uint8), element="fp4", fallback="bfloat16")
    vals = np.asarray(imp.tensor.data[0]).view(ml_dtypes.bfloat16).astype(np.float32)
    assert np.isnan(vals).all() and imp.status == "value-exact"


# ---------------------------------------------------------------------------
# MXINT8: OCP Q1.6 vs Hurray s*int8


def test_mxint8_scale_shift_and_values():
    # OCP: 0x40 = 1.0, 0x7F = 1.984375, 0x80 = -2.0 at scale 2^0 (docs/format-notes.md § 3.1, gfloat)
    codes = np.zeros(32, np.int8)
    codes[:3] = [0x40, 0x7F, -128]
    imp = mx.from_codes(codes, np.array([127], np.uint8), name="q")
    assert np.asarray(imp.tensor.data[1]).tolist() == [121]  # e_hurray = e_ocp - 6
    s = 2.0 ** (int(imp.tensor.data[1][0]) - 127)
    assert [s * v for v in codes[:3].tolist()] == [1.0, 1.984375, -2.0]
    assert np.asarray(mx.to_numpy(imp.tensor).scales).view(np.uint8).tolist() == [127]
    # Hurray-native int8 codes: no shift
    assert np.asarray(mx.from_codes(codes, np.array([127], np.uint8), int8="hurray").tensor.data[1]).tolist() == [127]


def test_mxint8_low_scales_refused_or_substituted():
    codes = np.zeros((2, 32), np.int8)
    codes[0, 5] = 3
    with pytest.raises(ConversionRefused, match=r"MXINT8 scale byte 0x06 at block 0"):
        mx.from_codes(codes, np.array([[6], [127]], np.uint8), name="q")
    imp = mx.from_codes(codes, np.array([[7], [3]], np.uint8), name="q")
    assert np.asarray(imp.tensor.data[1]).tolist() == [1, 0x7F]
    rec = imp.record
    assert rec is not None
    assert np.asarray(mx.to_numpy(imp.tensor, record=rec).scales).view(np.uint8).reshape(-1).tolist() == [7, 3]


def test_mxint8_export_refuses_scales_above_ocp_range():
    codes = np.zeros(32, np.uint8)
    t = mx.mxfp_tensor("q", "int8", (32,), codes, np.array([249], np.uint8), 32, 0)
    with pytest.raises(ConversionRefused, match="above 2\\^127"):
        mx.to_numpy(t)
    assert np.asarray(mx.to_numpy(t, int8="hurray").scales).view(np.uint8).tolist() == [249]


# ---------------------------------------------------------------------------
# bad input


def test_bad_geometry_and_inputs_raise_typed_errors():
    c = np.zeros((2, 64), np.uint8).view(ml_dtypes.float8_e4m3fn)
    s = np.full((2, 2), 127, np.uint8)
    with pytest.raises(UsageError, match="block size 24"):
        mx.from_codes(c, s, block_size=24)
    with pytest.raises(UsageError, match="block size 4096"):
        mx.from_codes(c, s, block_size=4096)
    with pytest.raises(InconsistentError, match="positive multiple of the block size 32"):
        mx.from_codes(c, s, axis=0)
    with pytest.raises(InconsistentError, match=r"scales have shape \[2, 1\].*need \[2, 2\]"):
        mx.from_codes(c, s[:, :1])
    with pytest.raises(UsageError, match="uint8 codes need element"):
        mx.from_codes(np.zeros((2, 64), np.uint8), s)
    with pytest.raises(UsageError, match="not an MX code dtype"):
        mx.from_codes(np.zeros((2, 64), np.float32), s)
    with pytest.raises(FormatError, match="0x10 at element 3"):
        bad = np.zeros((2, 64), np.uint8)
        bad[0, 3] = 0x10
        mx.from_codes(bad, s, element="fp4")
    with pytest.raises(UsageError, match="but element=float8_e5m2"):
        mx.from_codes(c, s, element="e5m2")
    with pytest.raises(UnsupportedError, match="not an MX element type"):
        mx.mx_element("float32")
    with pytest.raises(UnsupportedError, match="not an MXFP"):
        from hurray_interop.core.model import BufferHandle, Descriptor, Tensor
        from hurray_interop.core.elements import element_type

        mx.to_numpy(Tensor("p", Descriptor(element_type("float32"), (4,), (BufferHandle.cpu(16),)), (np.zeros(16, np.uint8),)))


def test_corrupt_scale_buffer_size_is_caught_on_export():
    t = mx.mxfp_tensor("w", "fp4", (64,), np.zeros(32, np.uint8), np.array([127], np.uint8), 32, 0)
    with pytest.raises(InconsistentError, match="scale buffer holds 1 bytes, 2 blocks"):
        mx.to_numpy(t)


# ---------------------------------------------------------------------------
# quantizer rules that differ from (or are not covered by) torchao


def test_quantize_hurray_zero_block_and_tiny_block():
    x = np.zeros((2, 32), np.float32)
    x[1, :] = np.float32(2.0**-140)  # float32 subnormal amax: OCP byte would be 0x00
    ocp = mx.quantize_ocp(x, "e4m3")
    assert ocp.scales.view(np.uint8).reshape(-1).tolist() == [0, 0]
    t = mx.quantize(x, "e4m3")
    assert np.asarray(t.data[1]).tolist() == [0x7F, 0x01]
    # codes are the same as the OCP ones (torchao divides by 2^-126 for byte 0x00 anyway)
    assert bytes(t.data[0]) == bytes(ocp.codes.view(np.uint8))
    # 2^-140 / 2^-126 = 2^-14: e4m3 underflows (min subnormal 2^-9) -> +0
    assert not np.asarray(t.data[0]).any()


def test_quantize_refuses_non_finite():
    x = np.ones((1, 32), np.float32)
    x[0, 7] = np.inf
    with pytest.raises(ConversionRefused, match="block 0 holds a non-finite value"):
        mx.quantize(x, "fp4", name="x")
    x[0, 7] = np.nan
    assert mx.quantize_ocp(x, "fp4").scales.view(np.uint8).tolist() == [[0xFF]]


def test_quantize_int8_matches_ocp_definition():
    # amax 1.0 -> X = 2^0 (OCP byte 127), P = round(V * 64): 1.0 -> 0x40, 0.5 -> 0x20, 2^-7 -> 0.5 -> RNE 0
    x = np.zeros(32, np.float32)
    x[:4] = [1.0, 0.5, 2.0**-7, -1.0]
    ocp = mx.quantize_ocp(x, "mxint8")
    assert ocp.scales.view(np.uint8).tolist() == [127]
    assert ocp.codes[:4].tolist() == [64, 32, 0, -64]
    t = mx.quantize(x, "mxint8")
    assert np.asarray(t.data[1]).tolist() == [121]
    assert np.asarray(t.data[0]).view(np.int8)[:4].tolist() == [64, 32, 0, -64]


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_quantize_int_error_bound_and_saturation(name):
    el = mx.MX_ELEMENTS[name]
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((8, 64)) * 2.0 ** rng.integers(-30, 30, (8, 1))).astype(np.float32)
    t = mx.quantize(x, name)
    codes = mx.to_numpy(t, int8="hurray").codes
    vals = (codes.astype(np.int8) if name == "int8" else codes.astype(np.int8)).astype(np.float64)
    assert np.abs(vals).max() <= el.max_code
    s = 2.0 ** (np.asarray(t.data[1]).astype(np.float64) - 127)
    s = np.repeat(s.reshape(8, 2), 32, axis=1)
    err = np.abs(vals * s - x)
    # the shared exponent keeps amax below 2 * 2^emax * s: error <= s/2 unless saturated
    sat = np.abs(vals) == el.max_code
    assert np.all(err[~sat] <= s[~sat] / 2)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("axis", [0, 1])
def test_zero_block_detection_on_every_axis(axis, packed):
    # fp4 [64, 64]: block (row r, block 1) along axis 1, or (block 1, column c) along axis 0
    codes = np.full((64, 64), 3, np.uint8)
    if axis == 1:
        codes[5, 32:] = 8  # -0 codes
        zero_block = 5 * 2 + 1
    else:
        codes[32:, 7] = 0
        zero_block = 7 * 2 + 1  # b = outer * (S/K) + i // K with outer = column 7
    scales = np.full((2, 64) if axis == 0 else (64, 2), 127, np.uint8)
    if axis == 1:
        scales[5, 1] = 0
    else:
        scales[1, 7] = 0
    arr = (codes[:, 0::2] | (codes[:, 1::2] << 4)) if packed else codes
    imp = mx.from_codes(arr, scales, element="fp4", axis=axis, packed=packed)
    assert list(imp.substituted_blocks) == [zero_block]
    # a non-zero code in that block turns the substitution into a refusal
    codes2 = codes.copy()
    if axis == 1:
        codes2[5, 40] = 1
    else:
        codes2[40, 7] = 1
    arr2 = (codes2[:, 0::2] | (codes2[:, 1::2] << 4)) if packed else codes2
    with pytest.raises(ConversionRefused, match=f"block {zero_block}"):
        mx.from_codes(arr2, scales, element="fp4", axis=axis, packed=packed)


def test_torch_paths_without_torch_raise_unsupported(monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **kw):
        if name.split(".")[0] in ("torch", "torchao"):
            raise ImportError(f"no {name}")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", fake)
    t = mx.quantize(np.ones((1, 32), np.float32), "fp4")
    with pytest.raises(UnsupportedError, match=r"torch is not installed"):
        mx.to_torch(t)
    with pytest.raises(UnsupportedError, match=r"torch is not installed"):
        mx.to_torchao(t)
    assert bytes(mx.to_numpy(t).scales.view(np.uint8)) == bytes([127 - 2])  # amax 1 = 2^0, emax 2; numpy needs no torch
