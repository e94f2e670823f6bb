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
