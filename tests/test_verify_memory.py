"""``verify`` compares in bounded, cache-sized windows (docs/benchmarks.md, issue 13 item 3):
the reference decoder is called on at most one chunk of elements whatever a row's length,
Python allocations while comparing stay under a bound independent of the tensor's size,
and the round trip's export runs while the values are compared."""

from __future__ import annotations

import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import hurray_interop
from hurray_interop.core.hrry import HrryFile
from hurray_interop.formats import gguf as G
from hurray_interop.parallel import in_background
from hurray_interop.verification import common as C
from hurray_interop.verification import gguf as VG
from gguf_factory import q8_0_blocks, write_gguf_raw


def _q8_0(path: Path, shape: tuple[int, ...], seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) // 32
    d = rng.uniform(0.01, 0.1, n).astype(np.float16)
    codes = rng.integers(-127, 128, (n, 32), dtype=np.int8)
    return write_gguf_raw(path, [("w", "Q8_0", shape, q8_0_blocks(d, codes))])


def _peak_of_checks(tmp_path: Path, shape: tuple[int, ...], tag: str) -> int:
    """Peak traced allocations of the value and byte checks of one converted tensor
    (bytes compared chunk by chunk: the files are not known identical)."""
    src = _q8_0(tmp_path / f"{tag}.gguf", shape)
    mid = tmp_path / f"{tag}.hrry"
    hurray_interop.convert(src, mid)
    with G.read_gguf(str(src)) as gf, G.read_gguf(str(src)) as again, HrryFile(str(mid)) as hf:
        result = C.VerifyResult(kind="pair", source=str(src))
        tracemalloc.start()
        try:
            checked = VG.VERIFIER.values(gf, hf)
            VG.VERIFIER.finish(gf, checked, result, again, files_equal=False, hurray_label="x")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert result.ok and result.tensors[0].values_equal and result.tensors[0].bytes_equal
    return peak


def test_comparison_memory_does_not_grow_with_the_tensor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(C, "CHUNK_ROWS_ELEMENTS", 1 << 16)
    monkeypatch.setattr(C, "CHUNK_BYTES", 1 << 16)
    small = _peak_of_checks(tmp_path, (256, 4096), "small")  # 1 Mi values: 16 chunks
    large = _peak_of_checks(tmp_path, (2048, 4096), "large")  # 8 Mi values (32 MiB as float32)
    window = (1 << 16) * 4
    assert large < 32 * window  # a few chunk buffers a side (8 MiB), not the 32 MiB tensor
    # the reference decodes on parallel.jobs() threads with up to 2 * jobs chunks in flight,
    # so the peak moves by a few chunk windows with the threads' timing; a peak that
    # followed the tensor would grow by ~28 MiB (112 windows)
    assert large < small + 8 * window


def test_a_long_row_is_decoded_one_chunk_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1-D tensor of 2 Mi values (one row) reaches either oracle's decoder in chunk-sized pieces."""
    monkeypatch.setattr(C, "CHUNK_ROWS_ELEMENTS", 1 << 16)
    seen: list[int] = []
    real = VG.reference_dequantizer

    def counting(t):  # type: ignore[no-untyped-def]
        decode = real(t)
        return None if decode is None else (lambda raw: (seen.append(raw.size // 34 * 32), decode(raw))[1])

    monkeypatch.setattr(VG, "reference_dequantizer", counting)
    real_c = VG.ggml.decode_blocks

    def counting_c(type_id, k, nbytes, blocks, out=None):  # type: ignore[no-untyped-def]
        seen_c.append(blocks.shape[0] * k)
        return real_c(type_id, k, nbytes, blocks, out)

    seen_c: list[int] = []
    monkeypatch.setattr(VG.ggml, "decode_blocks", counting_c)
    src = _q8_0(tmp_path / "row.gguf", (1 << 21,))
    res = hurray_interop.verify(src, oracle="gguf-py")
    assert res.ok and res.tensors[0].values_equal and res.oracle == "gguf-py"
    assert sum(seen) == 1 << 21 and max(seen) <= 1 << 16 and not seen_c
    if VG.ggml.available():  # ggml's decoder is given the same chunks
        import hurray_interop.kernels as K

        seen.clear()
        real_d = K.dequant_diff_decoded
        seen_d: list[int] = []

        def counting_d(plan, g0, n, decode, blocks, k, zero_equal=False):  # type: ignore[no-untyped-def]
            seen_d.append(n)
            return real_d(plan, g0, n, decode, blocks, k, zero_equal)

        monkeypatch.setattr(K, "dequant_diff_decoded", counting_d)
        res = hurray_interop.verify(src, oracle="ggml")
        assert res.ok and res.tensors[0].values_equal and res.oracle == "ggml"
        if K.KERNEL == "c":  # run by our kernel beside ours, window by window (4096 values at a time inside)
            assert sum(seen_d) == 1 << 21 and max(seen_d) <= 1 << 16 and not seen_c and not seen
        else:  # into a window
            assert sum(seen_c) == 1 << 21 and max(seen_c) <= 1 << 16 and not seen and not seen_d


def test_a_difference_past_the_first_byte_chunk_is_located(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(C, "CHUNK_BYTES", 1 << 10)
    a = np.zeros(5000, np.uint8)
    b = a.copy()
    b[4321] = 1
    ea = C.RawEntry("U8", ("U8", 5000), a, 0, lambda rel: f"byte {rel}")
    eb = C.RawEntry("U8", ("U8", 5000), b, 0, lambda rel: f"byte {rel}")
    assert C.compare_entries(ea, eb) == (False, "byte 4321")
    assert C.compare_entries(ea, ea) == (True, "")


def test_the_export_runs_while_values_are_compared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The round trip's export waits for the value comparison to start: without the
    overlap it would wait forever (bounded by the event's timeout) and the check fails."""
    from hurray_interop.registry import detect_format

    src = _q8_0(tmp_path / "m.gguf", (64, 256))
    fmt = detect_format(str(src))
    comparing = threading.Event()
    saw: list[bool] = []
    real_compare, real_export = C.compare_values, fmt.from_hurray

    def compare(*a, **k):  # type: ignore[no-untyped-def]
        comparing.set()
        return real_compare(*a, **k)

    def export(a: str, b: str):  # type: ignore[no-untyped-def]
        saw.append(comparing.wait(timeout=60))
        return real_export(a, b)

    monkeypatch.setattr(C, "compare_values", compare)
    result = C.VerifyResult(kind="round-trip", source=str(src))

    class Fmt:
        to_hurray = staticmethod(fmt.to_hurray)
        from_hurray = staticmethod(export)
        extensions = fmt.extensions

    VG.VERIFIER.roundtrip(str(src), result, Fmt)
    assert saw == [True] and result.ok and result.file_bytes_equal


def test_in_background_returns_or_raises_and_always_waits() -> None:
    with in_background(lambda: 41 + 1) as got:
        assert got() == 42
    done = threading.Event()

    def fail() -> None:
        done.wait(timeout=60)
        raise ValueError("from the worker")

    with pytest.raises(ValueError, match="from the worker"):
        with in_background(fail) as got:
            done.set()
            got()
    finished: list[int] = []
    with pytest.raises(KeyError):
        with in_background(lambda: finished.append(1)):
            raise KeyError("body")
    assert finished == [1]  # the worker was waited for
