"""Independent oracles for the MX path: torch / ml_dtypes decoding and torchao ``to_mx``.

* Exhaustive element tables: every code of every MX element type under a spread of scale
  bytes, put into a Hurray MXFP tensor by :func:`conversions.mx.from_codes`, decodes through
  the shared dequantizer exactly (bitwise, NaN == NaN) as torch (FP8, E8M0) and ml_dtypes
  (FP6, FP4, INT4) decode the source codes.
* The quantizer agrees bit for bit with torchao ``to_mx`` (FLOOR) for e4m3, e5m2, fp6
  e2m3/e3m2 and fp4, including ties, saturation, all-zero and subnormal blocks.
* torchao ``MXTensor`` round trips (plain, transposed, swizzled scales).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hurray_interop.conversions import mx

torch = pytest.importorskip("torch")

SCALES = [1, 2, 20, 64, 100, 120, 126, 127, 128, 129, 150, 200, 250, 253, 254]


def _dequantize():
    try:
        from hurray_interop.dequant import dequantize
    except ImportError as e:  # pragma: no cover - until the shared dequantizer lands
        pytest.skip(f"hurray_interop.dequant not importable yet: {e}")
    return dequantize


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float32).reshape(-1)
    b = np.asarray(b, np.float32).reshape(-1)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def _torch_scale(sbytes: np.ndarray) -> np.ndarray:
    return torch.from_numpy(sbytes.astype(np.uint8)).view(torch.float8_e8m0fnu).float().numpy()


def _all_codes(name: str) -> np.ndarray:
    el = mx.MX_ELEMENTS[name]
    n = 1 << el.bits
    codes = np.arange(n, dtype=np.uint16).astype(np.uint8)
    reps = max(1, 32 // n)
    return np.tile(codes, reps)  # a multiple of 32 codes per row


def _torch_values(name: str, codes: np.ndarray) -> np.ndarray:
    """float32 values of the codes as the source ecosystem decodes them."""
    el = mx.MX_ELEMENTS[name]
    if el.torch and not el.torch_packed and not el.is_int:
        return torch.from_numpy(codes.copy()).view(getattr(torch, el.torch)).float().numpy()
    if name == "int8":
        return torch.from_numpy(codes.copy()).view(torch.int8).float().numpy()
    return codes.view(el.np_dtype).astype(np.float32)  # ml_dtypes: fp6, fp4, int4


@pytest.mark.parametrize("name", list(mx.MX_ELEMENTS))
def test_exhaustive_codes_decode_like_torch_and_ml_dtypes(name):
    dequantize = _dequantize()
    el = mx.MX_ELEMENTS[name]
    row = _all_codes(name)
    codes = np.tile(row, (len(SCALES), 1))  # [n_scales, C]
    nb = codes.shape[1] // 32
    sc = np.repeat(np.array(SCALES, np.uint8)[:, None], nb, axis=1)
    # int8 as Hurray-native s*int8 (int8="hurray"); the OCP Q1.6 view is tested below
    imp = mx.from_codes(codes, sc, element=el, block_size=32, axis=1, name=name, int8="hurray")
    ours = dequantize(imp.tensor)
    with np.errstate(over="ignore"):
        ref = (_torch_values(name, codes).astype(np.float32) * np.repeat(_torch_scale(sc), 32, axis=1)).astype(np.float32)
    ok = _same(ours, ref)
    assert ok.all(), f"{(~ok).sum()} mismatches, first at {np.flatnonzero(~ok)[0]}"
    # and our own source decoder (used by verify) agrees with torch, 0x00 and 0xFF scales included
    sc2 = sc.copy()
    sc2[0, :] = 0x00
    sc2[-1, :] = 0xFF
    with np.errstate(over="ignore", invalid="ignore"):
        ref2 = (_torch_values(name, codes) * np.repeat(_torch_scale(sc2), 32, axis=1)).astype(np.float32)
    assert _same(mx.source_values(codes.view(el.np_dtype), sc2, el, 32, 1, int8="hurray"), ref2).all()


def test_exhaustive_mxint8_ocp_values_through_the_scale_shift():
    dequantize = _dequantize()
    codes = np.tile(np.arange(256, dtype=np.uint16).astype(np.uint8), (5, 1)).view(np.int8)
    sc = np.repeat(np.array([7, 64, 127, 200, 254], np.uint8)[:, None], 8, axis=1)
    imp = mx.from_codes(codes, sc, name="q")  # OCP MXINT8 (Q1.6)
    with np.errstate(over="ignore"):
        ocp = torch.from_numpy(codes.copy()).float().numpy() / 64.0 * np.repeat(_torch_scale(sc), 32, axis=1)
    assert _same(dequantize(imp.tensor), ocp).all()


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_block_order_on_every_axis_matches_ml_dtypes(axis):
    dequantize = _dequantize()
    rng = np.random.default_rng(axis)
    shape = [2, 3, 5]
    shape[axis] = 64
    codes = rng.integers(0, 256, size=shape).astype(np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # no NaNs: compare plain values
    sshape = list(shape)
    sshape[axis] //= 32
    sc = rng.integers(100, 150, size=sshape).astype(np.uint8)
    t = mx.from_codes(codes.view(ml_dtypes.float8_e4m3fn), sc, axis=axis).tensor
    ref = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.repeat(
        sc.view(ml_dtypes.float8_e8m0fnu).astype(np.float32), 32, axis=axis
    )
    assert np.array_equal(dequantize(t).reshape(-1), ref.reshape(-1))


# ---------------------------------------------------------------------------
# torchao to_mx (FLOOR), bit for bit


def _torchao():
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.mx_tensor import MXTensor, to_mx

    return MXTensor, to_mx


TORCHAO_ELEMS = {
    "float8_e4m3": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
    "float6_e2m3": "fp6_e2m3",
    "float6_e3m2": "fp6_e3m2",
    "float4_e2m1": "float4_e2m1fn_x2",
}


def _elem(name):
    s = TORCHAO_ELEMS[name]
    return getattr(torch, s) if not s.startswith("fp6") else s


def _hard_input(rng) -> np.ndarray:
    x = (rng.standard_normal((12, 256)) * 2.0 ** rng.integers(-40, 40, (12, 1))).astype(np.float32)
    x[0, :32] = 0.0
    x[0, 32:64] = -0.0
    x[1, :32] = np.float32(2.0**-140)  # subnormal amax
    x[1, 32:64] = rng.standard_normal(32).astype(np.float32) * np.float32(2.0**-120)
    # exact ties and saturation points of every element grid
    grid = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 6.5, 7.75, 0.0625, 0.1875, 448, 480, 57344, 61440, 30, 29])
    x[2, : grid.size] = grid
    x[2, 32 : 32 + grid.size] = -grid
    x[3, :] = np.float32(2.0**100) * np.sign(rng.standard_normal(256)).astype(np.float32)
    x[4, :] = rng.uniform(-1, 1, 256).astype(np.float32) * np.float32(3.4e38)
    return x


@pytest.mark.parametrize("name", list(TORCHAO_ELEMS))
@pytest.mark.parametrize("bf16", [False, True])
def test_quantize_matches_torchao_to_mx_floor(name, bf16):
    _, to_mx = _torchao()
    rng = np.random.default_rng(7)
    x = _hard_input(rng)
    xt = torch.from_numpy(x)
    if bf16:
        xt = xt.to(torch.bfloat16)
        x = xt.float().numpy()
    for shape in [(12, 256), (3, 4, 256), (3072,)]:
        xs = xt.reshape(shape)
        scale, q = to_mx(xs, _elem(name), 32)
        ours = mx.quantize_ocp(x.reshape(shape), name)
        assert bytes(ours.scales.view(np.uint8)) == bytes(scale.view(torch.uint8).numpy())
        qb = q.view(torch.uint8).numpy().reshape(-1)
        mine = ours.codes.view(np.uint8).reshape(-1)
        if name == "float4_e2m1":
            mine = mine[0::2] | (mine[1::2] << 4)
        assert bytes(mine) == bytes(qb)
        # the Hurray quantizer: same codes; scales equal except the documented 0x00 cases
        t = mx.quantize(x.reshape(shape), name)
        hs = np.asarray(t.data[1])
        os_ = scale.view(torch.uint8).numpy().reshape(-1)
        zero_blocks = np.abs(x.reshape(-1, 32)).max(axis=1) == 0
        assert np.array_equal(hs[zero_blocks], np.full(zero_blocks.sum(), 0x7F, np.uint8))
        tiny = (os_ == 0) & ~zero_blocks
        assert np.array_equal(hs[tiny], np.full(tiny.sum(), 1, np.uint8))
        rest = ~zero_blocks & ~tiny
        assert np.array_equal(hs[rest], os_[rest])
        back = mx.to_numpy(t).codes.view(np.uint8).reshape(-1)
        assert bytes(back) == bytes(ours.codes.view(np.uint8).reshape(-1))


def test_quantize_along_axis0_equals_torchao_on_the_transpose():
    _, to_mx = _torchao()
    x = np.random.default_rng(9).standard_normal((64, 8)).astype(np.float32)
    scale, q = to_mx(torch.from_numpy(np.ascontiguousarray(x.T)), torch.float8_e4m3fn, 32)
    ours = mx.quantize_ocp(x, "e4m3", axis=0)
    assert np.array_equal(ours.codes.view(np.uint8).T, q.view(torch.uint8).numpy())
    assert np.array_equal(ours.scales.view(np.uint8).T, scale.view(torch.uint8).numpy())


# ---------------------------------------------------------------------------
# torch tensors and torchao MXTensor in and out


def test_torch_fp8_and_fp4x2_in_and_out():
    rng = np.random.default_rng(4)
    c8 = torch.from_numpy(rng.integers(0, 256, (4, 64)).astype(np.uint8)).view(torch.float8_e5m2)
    s = torch.from_numpy(rng.integers(1, 255, (4, 2)).astype(np.uint8)).view(torch.float8_e8m0fnu)
    imp = mx.from_codes(c8, s, name="a")
    assert imp.tensor.descriptor.element_type.name == "float8_e5m2"
    out = mx.to_torch(imp.tensor)
    assert out.codes.dtype == torch.float8_e5m2 and out.scales.dtype == torch.float8_e8m0fnu
    assert torch.equal(out.codes.view(torch.uint8), c8.view(torch.uint8))
    assert torch.equal(out.scales.view(torch.uint8), s.view(torch.uint8))
    p4 = torch.from_numpy(rng.integers(0, 256, (4, 32)).astype(np.uint8)).view(torch.float4_e2m1fn_x2)
    imp4 = mx.from_codes(p4, s, name="b")
    assert imp4.tensor.shape == (4, 64)
    assert bytes(imp4.tensor.data[0]) == bytes(p4.view(torch.uint8).numpy())  # same LSB-first packing
    o4 = mx.to_torch(imp4.tensor)
    assert o4.codes.dtype == torch.float4_e2m1fn_x2 and torch.equal(o4.codes.view(torch.uint8), p4.view(torch.uint8))
    i8 = torch.from_numpy(rng.integers(-128, 128, (4, 64)).astype(np.int8))
    s8 = torch.from_numpy(rng.integers(7, 255, (4, 2)).astype(np.uint8))
    o8 = mx.to_torch(mx.from_codes(i8, s8).tensor)
    assert torch.equal(o8.codes, i8) and torch.equal(o8.scales.view(torch.uint8), s8)


@pytest.mark.parametrize("name", list(TORCHAO_ELEMS))
def test_torchao_mxtensor_round_trip_and_dequantize(name):
    MXTensor, _ = _torchao()
    dequantize = _dequantize()
    x = torch.from_numpy(_hard_input(np.random.default_rng(11))[2:, :])  # no 0x00 blocks
    m = MXTensor.to_mx(x, _elem(name), 32)
    imp = mx.from_torchao(m, name="w")
    assert imp.substituted_blocks.size == 0
    ours = dequantize(imp.tensor)
    theirs = m.dequantize(torch.float32).numpy()
    assert _same(ours, theirs).all()
    back = mx.to_torchao(imp.tensor)
    assert back.elem_dtype == m.elem_dtype and back.block_size == 32
    assert torch.equal(back.qdata.view(torch.uint8), m.qdata.view(torch.uint8))
    assert torch.equal(back.scale.view(torch.uint8), m.scale.view(torch.uint8))
    assert _same(back.dequantize(torch.float32).numpy(), theirs).all()


def test_torchao_transposed_and_swizzled():
    MXTensor, _ = _torchao()
    dequantize = _dequantize()
    x = torch.randn(128, 64, generator=torch.Generator().manual_seed(0))
    m = MXTensor.to_mx(x, torch.float8_e4m3fn, 32)
    mt = m.t()
    imp = mx.from_torchao(mt, name="t")
    q = imp.tensor.descriptor.quantization
    assert q.axis == 0 and imp.tensor.shape == (64, 128)
    assert _same(dequantize(imp.tensor), m.dequantize(torch.float32).numpy().T).all()
    ms = MXTensor.to_mx(x, torch.float4_e2m1fn_x2, 32, is_swizzled_scales=True)
    plain = MXTensor.to_mx(x, torch.float4_e2m1fn_x2, 32)
    a = mx.from_torchao(ms, name="s").tensor
    b = mx.from_torchao(plain, name="s").tensor
    assert bytes(a.data[1]) == bytes(b.data[1]) and bytes(a.data[0]) == bytes(b.data[0])


def test_torchao_zero_blocks_are_substituted():
    MXTensor, _ = _torchao()
    x = torch.zeros(2, 64)
    x[1] = torch.randn(64)
    imp = mx.from_torchao(MXTensor.to_mx(x, torch.float8_e4m3fn, 32), name="z")
    assert list(imp.substituted_blocks) == [0, 1]
    assert np.asarray(imp.tensor.data[1])[:2].tolist() == [0x7F, 0x7F]
    back = mx.to_torchao(imp.tensor, record=imp.record)
    assert back.scale.view(torch.uint8)[0].tolist() == [0, 0]
