"""The derived record's factorization: the compiled first candidate (``hk_factor_first``,
conversions/gguf_kernels.factor_first) against its numpy twin (gguf_expanded._factor's own
first round), on the scales of every expanded type with sub-scales: ggml's quantizer output
(the committed fixture) and random headers whose quotients land on every kind of float16
rounding (ties, subnormals, overflow to inf, zero)."""

from __future__ import annotations

import functools
from pathlib import Path

import gguf
import numpy as np
import pytest

from hurray_interop import kernels as K
from hurray_interop.conversions import gguf_expanded as X
from hurray_interop.conversions import gguf_kernels as GK

needs_c = pytest.mark.skipif(K._lib is None, reason="the compiled kernel is not built (numpy path only)")
TYPES = [t for t in X.EXPANDED_TYPES if X._specs()[t].sc is not None]


def _both(ggml_type: str, scales: np.ndarray, zero: np.ndarray, correction=None, ccodes=None):
    spec = X._specs()[ggml_type]
    sc = X._field_of(ggml_type, "sc")
    rule = functools.partial(X._rule, spec)
    out = [X._factor(scales, zero, sc, spec.post, rule, (0.0, 0), k) for k in ((spec.add, spec.mul), None)]
    if correction is not None:
        m = X._field_of(ggml_type, "m")
        out += [X._factor(correction, ccodes == 0, m, -1.0, X._minimum, (0.0, 0), k) for k in ((0.0, 1.0), None)]
    return out


def _same(a, b) -> None:
    (da, ra, oa), (db, rb, ob) = a, b
    assert np.array_equal(oa, ob)
    assert np.array_equal(da[oa].view(np.uint16), db[ob].view(np.uint16))
    assert np.array_equal(ra[oa], rb[ob])


@needs_c
@pytest.mark.parametrize("ggml_type", TYPES)
def test_compiled_first_candidate_equals_numpy_on_ggml_output(fixtures_dir: Path, ggml_type: str) -> None:
    r = gguf.GGUFReader(fixtures_dir / "ggml-quantized-types.gguf")
    t = next(t for t in r.tensors if t.name == f"q.{ggml_type}")
    x = X.expand(ggml_type, np.asarray(t.data).reshape(-1, X._specs()[ggml_type].block_bytes))
    zero = X.stand_ins(ggml_type, x.scales, x.codes)
    out = _both(ggml_type, x.scales, zero, x.correction, x.correction_codes)
    _same(out[0], out[1])
    if len(out) > 2:
        _same(out[2], out[3])
    assert out[0][2].mean() > 0.5  # (most blocks factor: the comparison is not of empty results)


@needs_c
@pytest.mark.parametrize("ggml_type", TYPES)
def test_compiled_first_candidate_equals_numpy_on_random_headers(ggml_type: str) -> None:
    spec, sc = X._specs()[ggml_type], X._field_of(ggml_type, "sc")
    rng = np.random.default_rng(11)
    n, subs = 4096, X._specs()[ggml_type].elements // X.form(ggml_type).sub_block
    bits = rng.integers(0, 0x7C00, n).astype(np.uint16)
    bits[:64] = np.arange(64)  # float16 subnormals and zero
    bits[64:128] = 0x7BFF - np.arange(64)  # near the float16 maximum
    d = bits.view(np.float16) * np.where(rng.random(n) < 0.3, -1, 1).astype(np.float16)
    raw = rng.choice(sc.raws, (n, subs)).astype(np.float32)
    first = sc.raws[np.flatnonzero(sc.v != 0)[0]]  # the raw value of the first candidate (the top |v|)
    raw[np.arange(0, n, 2), rng.integers(0, subs, n // 2)] = first  # half the rows: ggml's usual anchor
    scales = X._rule(spec, d, raw).astype(np.float32)
    scales += np.where(rng.random((n, subs)) < 0.05, np.float32(1e-3), np.float32(0)) * scales  # some do not factor
    zero = rng.random((n, subs)) < 0.02
    zero[:8] = True
    out = _both(ggml_type, scales, zero)
    _same(out[0], out[1])
    ok = out[0][2][8:]  # (the first 8 rows are all zero: "empty", defined without any factorization)
    assert 0.05 < ok.mean() < 0.95, ok.mean()  # both outcomes compared, many of each


# ---------------------------------------------------------------------------
# the fused pass over every block (hk_factor_rows, gguf_kernels.factor_rows, gguf_expanded._all_first):
# derive_header's bytes with the compiled library and with the numpy path forced, chunk-wide
# (one block that does not factor at the first candidate sends the chunk to the rounds) and one
# block at a time (each block that factors takes the fused pass alone)


def _derive(ggml_type: str, x, zero, numpy_path: bool, monkeypatch: pytest.MonkeyPatch):
    with monkeypatch.context() as m:
        if numpy_path:
            m.setattr(K, "_lib", None)
        return X.derive_header(ggml_type, x.scales, x.correction, x.correction_codes, zero)


def _assert_derive_paths_agree(ggml_type: str, x, zero, monkeypatch: pytest.MonkeyPatch, single: int = 0) -> np.ndarray:
    hn, okn = _derive(ggml_type, x, zero, True, monkeypatch)
    hc, okc = _derive(ggml_type, x, zero, False, monkeypatch)
    assert np.array_equal(okc, okn) and np.array_equal(hc, hn)
    fused: list[bool] = []
    real = GK.factor_rows
    monkeypatch.setattr(GK, "factor_rows", lambda *a: fused.append(real(*a) is not None) or real(*a))
    for i in range(min(single, len(okn))):  # (one block a call: the fused pass whenever it factors)
        h1, ok1 = X.derive_header(ggml_type, x.scales[i : i + 1], None if x.correction is None else x.correction[i : i + 1],
                                  None if x.correction_codes is None else x.correction_codes[i : i + 1], zero[i : i + 1])
        assert ok1[0] == okn[i] and np.array_equal(h1[0], hn[i]), (ggml_type, i)
    monkeypatch.setattr(GK, "factor_rows", real)
    return float(np.mean(fused)) if fused else 0.0  # (how often the fused pass decided)


@needs_c
@pytest.mark.parametrize("ggml_type", TYPES)
def test_fused_derive_equals_numpy_on_ggml_output(fixtures_dir: Path, ggml_type: str, monkeypatch: pytest.MonkeyPatch) -> None:
    r = gguf.GGUFReader(fixtures_dir / "ggml-quantized-types.gguf")
    t = next(t for t in r.tensors if t.name == f"q.{ggml_type}")
    x = X.expand(ggml_type, np.asarray(t.data).reshape(-1, X._specs()[ggml_type].block_bytes))
    zero = X.stand_ins(ggml_type, x.scales, x.codes)
    assert _assert_derive_paths_agree(ggml_type, x, zero, monkeypatch, single=256) > 0.5


def _canonical_blocks(ggml_type: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks whose headers are mostly ggml's usual choice (the anchor at the first
    candidate), with every kind of edge: float16 d/dmin subnormal, zero, ±, near the maximum;
    raw fields at their extremes (min, min+1, max−1, max); zero sub-scales; all-zero blocks;
    blocks that do not factor (a random anchor)."""
    spec = X._specs()[ggml_type]
    blocks = rng.integers(0, 256, (n, spec.block_bytes), dtype=np.uint8)
    for byte, mask in spec.header:
        blocks[:, byte] &= np.uint8(~mask & 0xFF)
    bits = rng.integers(0, 0x7C00, n).astype(np.uint16) | np.where(rng.random(n) < 0.3, 0x8000, 0).astype(np.uint16)
    bits[:32] = np.arange(32) | (np.arange(32) % 2 * 0x8000)  # subnormals, ±0
    bits[32:48] = 0x7BFF - np.arange(16)  # near the float16 maximum
    X._pack(bits.reshape(-1, 1), spec.d, blocks)
    for name, b in (("sc", spec.sc), ("m", spec.m)):
        if b is None:
            continue
        f = X._field_of(ggml_type, name)
        lo, hi = int(f.raws.min()), int(f.raws.max())
        raw = rng.integers(lo, hi + 1, (n, b.n_items))
        raw[: n // 2, 0] = f.raws[np.flatnonzero(f.v != 0)[0]]  # ggml's usual anchor
        raw[48:64] = np.array([lo, lo + 1, hi - 1, hi])[np.arange(16 * b.n_items).reshape(16, -1) % 4]
        if f.zraw is not None:
            raw[rng.random((n, b.n_items)) < 0.05] = f.zraw  # zero sub-scales (±0 stand-ins)
            raw[64:72] = f.zraw  # all-zero blocks
        raw[72 : 72 + n // 8] //= 2  # (no sub-scale at the top: not ggml's header, or none)
        X._pack((raw.astype(np.uint8) if spec.sc_int8 and name == "sc" else raw).astype(b.dtype), b, blocks)
    if spec.dmin is not None:
        X._pack(bits[::-1].copy().reshape(-1, 1), spec.dmin, blocks)
    return blocks


@needs_c
@pytest.mark.parametrize("ggml_type", TYPES)
def test_fused_derive_equals_numpy_on_edge_headers(ggml_type: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = X.expand(ggml_type, _canonical_blocks(ggml_type, 1024, np.random.default_rng(23)))
    zero = X.stand_ins(ggml_type, x.scales, x.codes)
    fused = _assert_derive_paths_agree(ggml_type, x, zero, monkeypatch, single=1024)
    assert 0.05 < fused < 0.95, fused  # (both paths, many blocks each)


@needs_c
@pytest.mark.parametrize("subs", [63, 64, 65])
def test_fused_pass_takes_at_most_64_sub_blocks(subs: int) -> None:
    f = X._field_of("Q4_K", "sc")
    target = np.full((3, subs), 63 * 0.5, dtype=np.float32)  # (d = 0.5, every raw value 63)
    got = GK.factor_rows(target, np.zeros((3, subs), dtype=bool), 63.0, 0.0, 1.0, 1.0, 0.0, 63.0, f.zraw, (0.0, 0))
    if subs > 64:
        assert got is None
    else:
        assert got is not None and np.all(got[0] == np.float16(0.5)) and np.all(got[1] == 63)
