"""One error rule for every fallback (hurray_interop.conversions.fallback).

A fallback stores a tensor dequantized as a float type the user chose.  Whatever path
does it (GGUF import and export, safetensors import and export, in-memory MX), the report
must say the same thing about the same values: overflow to ±inf and NaN against a number
are lossy with max abs error ``inf``; equal infinities and NaN against NaN cost nothing;
and no numpy RuntimeWarning reaches the terminal.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from gguf_factory import write_gguf_raw
from test_export_gguf import pb

from hurray_interop.cli import main
from hurray_interop.conversions import fallback as FB
from hurray_interop.conversions import mx
from hurray_interop.core.hrry import HrryWriter
from hurray_interop import report

#: int8 codes 127 × scale 1024 = 130048: beyond float16's largest finite value (65504)
BIG = 127 * 1024.0


def big_int8_hrry(path: Path) -> Path:
    """A per-block int8 tensor with float32 scales (no GGML or safetensors form, so every
    export falls back) whose values overflow float16."""
    with HrryWriter(path) as w:
        w.write("big", pb((2, 64), "int8", scale="float32"),
                [np.full(128, 127, np.int8).tobytes(), np.full(4, 1024, np.float32).tobytes()])
        w.finish()
    return path


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, str]:
    """The CLI in-process with every warning an error; returns (status, JSON report, stderr)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        status = main(argv + ["--json"])
    cap = capsys.readouterr()
    return status, (json.loads(cap.out) if cap.out.strip() else {}), cap.err


@pytest.mark.parametrize("dst", ["out.gguf", "out.safetensors"])
def test_overflowing_export_fallback_is_lossy_inf(tmp_path: Path, capsys: pytest.CaptureFixture[str], dst: str) -> None:
    """Regression: GGUF export said "value-exact, max abs error 0" for values it wrote as +inf,
    and numpy's overflow warning leaked to stderr.  Both exports must say lossy / inf."""
    src = big_int8_hrry(tmp_path / "big.hrry")
    status, rep, err = run_json(["convert", str(src), str(tmp_path / dst), "--fallback", "float16"], capsys)
    assert status == 0, err
    (t,) = rep["tensors"]
    assert (t["status"], t["max_abs_error"]) == ("lossy", math.inf)
    assert "Warning" not in err
    if dst.endswith(".gguf"):
        import gguf

        (g,) = gguf.GGUFReader(str(tmp_path / dst)).tensors
        assert np.all(np.asarray(g.data) == np.inf)  # what was written, and what the report now admits


@pytest.mark.parametrize("dst", ["out.gguf", "out.safetensors"])
def test_exact_export_fallback_is_value_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str], dst: str) -> None:
    src = big_int8_hrry(tmp_path / "big.hrry")
    status, rep, err = run_json(["convert", str(src), str(tmp_path / dst), "--fallback", "float32"], capsys)
    assert status == 0, err
    (t,) = rep["tensors"]
    assert (t["status"], t["max_abs_error"]) == ("value-exact", 0.0)


def q6_k_overflowing(path: Path) -> Path:
    """Two Q6_K blocks (no exact Hurray form) whose values overflow float16 in block 0 only."""
    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 256, (2, 210), dtype=np.uint8)
    blocks[:, 192:208] = 100  # int8 sub-block scales
    blocks[0, 208:210] = np.float16(1000).reshape(1).view(np.uint8)  # d: 1000·100·q overflows f16
    blocks[1, 208:210] = np.float16(0.001).reshape(1).view(np.uint8)
    return write_gguf_raw(path, [("k", "Q6_K", (1, 512), blocks)])


def test_overflowing_import_fallback_is_lossy_inf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: the GGUF import fallback took the max over finite differences only."""
    src = q6_k_overflowing(tmp_path / "k.gguf")
    status, rep, err = run_json(["convert", str(src), str(tmp_path / "k.hrry"), "--fallback", "float16"], capsys)
    assert status == 0, err
    (t,) = rep["tensors"]
    assert (t["status"], t["max_abs_error"]) == ("lossy", math.inf)
    assert "Warning" not in err
    status, rep, err = run_json(["convert", str(src), str(tmp_path / "k32.hrry"), "--fallback", "float32"], capsys)
    assert (status, rep["tensors"][0]["status"], rep["tensors"][0]["max_abs_error"]) == (0, "value-exact", 0.0)


def test_mx_import_fallback_same_rule() -> None:
    """In-memory MX: float8_e5m2 57344 × 2^16 overflows float16 (lossy, inf); a NaN block
    (scale 0xFF) stays NaN and costs nothing."""
    codes = np.zeros((2, 32), np.uint8)
    codes[0] = 0x7B  # e5m2 57344
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        imp = mx.from_codes(codes, np.uint8([[127 + 16], [0xFF]]), element="float8_e5m2", block_size=32,
                            name="t", fallback="float16")
    assert (imp.status, imp.max_abs_error) == (report.LOSSY, math.inf)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        imp = mx.from_codes(codes, np.uint8([[127], [0xFF]]), element="float8_e5m2", block_size=32,
                            name="t", fallback="float16")
    assert (imp.status, imp.max_abs_error) == (report.VALUE_EXACT, 0.0)  # 57344 fits f16; NaN vs NaN


# ---------------------------------------------------------------------------
# the rule itself, on hand-picked values (the oracle is the rule's statement)


@pytest.mark.parametrize(
    ("reference", "stored", "want"),
    [
        ([1.0, 2.0], [1.0, 2.0], 0.0),
        ([np.inf, -np.inf], [np.inf, -np.inf], 0.0),  # equal infinities
        ([np.nan, 1.0], [np.nan, 1.0], 0.0),  # NaN vs NaN
        ([0.0], [-0.0], 0.0),
        ([BIG], [np.inf], np.inf),  # overflow
        ([-BIG], [-np.inf], np.inf),
        ([np.nan], [0.0], np.inf),  # NaN vs a number, both ways
        ([0.0], [np.nan], np.inf),
        ([np.inf], [-np.inf], np.inf),
        ([1.0, 3.0], [1.5, 3.0], 0.5),
    ],
)
def test_max_abs_error_rule(reference: list[float], stored: list[float], want: float) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert FB.max_abs_error(np.float64(reference), np.float32(stored)) == want
        meter = FB.ErrorMeter()
        for r, s in zip(reference, stored):
            meter.add(np.float64([r]), np.float32([s]))
        assert meter.error == want


def test_cast_never_warns_and_matches_numpy() -> None:
    v = np.float32([BIG, -BIG, np.nan, 1e-9, 3.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name, dt in (("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16), ("float32", np.float32)):
            got = FB.cast(v, name)
            with np.errstate(all="ignore"):
                want = v.astype(dt)
            assert got.dtype == np.dtype(dt) and got.tobytes() == want.tobytes()


def test_cli_fallback_choices_come_from_the_module(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "a.gguf", "b.hrry", "--fallback", "int3"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'int3'" in err and all(repr(c) in err for c in FB.CHOICES)
    assert set(FB.DTYPE_CHOICES) <= set(FB.CHOICES)


@pytest.mark.parametrize("fallback", ["float16", "bfloat16"])
def test_the_float32_measure_of_a_cast_is_the_float64_one(fallback: str) -> None:
    """ErrorMeter.add_cast (float32 arithmetic, for stored = cast(values)) gives add's
    maximum: random values over many binades, subnormals, values that overflow or round
    to the largest finite, ±0, infinities and NaNs; per piece and over a whole tensor."""
    import numpy as np

    from hurray_interop.conversions import fallback as F

    rng = np.random.default_rng(7)
    bits = rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.0, 65520.0, -65520.0, 1e-45, 6e-8, 3e-8,
                        2.0**-24, 2.0**-25, 3.4e38, np.finfo(np.float32).max, 1.0 + 2.0**-9, 1.0 + 2.0**-8],
                       dtype=np.float32)
    for values in (bits, special, rng.standard_normal(1 << 16).astype(np.float32) * 1e-3):
        stored = F.cast(values, fallback)
        one, two = F.ErrorMeter(), F.ErrorMeter()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # signalling NaNs among the random bits: no RuntimeWarning
            one.add(values, stored)
            two.add_cast(values, stored)
        assert one.error == two.error
        for v in values[:64]:  # value by value, against max_abs_error itself
            m = F.ErrorMeter()
            m.add_cast(np.array([v]), F.cast(np.array([v]), fallback))
            assert m.error == F.max_abs_error(np.array([v]), F.cast(np.array([v]), fallback)), v
