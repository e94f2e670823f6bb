"""Float-fallback exports to safetensors stream (issue 20): the header is computed from
shapes and dtypes, each tensor is dequantized window by window by the shared
dequantizer and written at its offset, so memory does not grow with the tensor; the
bytes and the reported errors are those of dequantizing the whole tensor at once."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import hurray_interop
from hurray_interop.conversions import fallback as fallbacks
from hurray_interop.conversions import safetensors as CS
from hurray_interop.core.hrry import HrryFile
from hurray_interop.dequant import dequantize
from gguf_factory import q8_0_blocks, write_gguf_raw

safetensors = pytest.importorskip("safetensors")


def _q8_0_hrry(tmp_path: Path, shape: tuple[int, ...], tag: str, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) // 32
    d = rng.uniform(0.01, 0.1, n).astype(np.float16)
    codes = rng.integers(-127, 128, (n, 32), dtype=np.int8)
    src = write_gguf_raw(tmp_path / f"{tag}.gguf", [("w", "Q8_0", shape, q8_0_blocks(d, codes))])
    mid = tmp_path / f"{tag}.hrry"
    hurray_interop.convert(src, mid)
    return mid


def _peak_of_export(tmp_path: Path, shape: tuple[int, ...], tag: str) -> int:
    mid = _q8_0_hrry(tmp_path, shape, tag)
    tracemalloc.start()
    try:
        hurray_interop.convert(mid, tmp_path / f"{tag}.safetensors", fallback="bfloat16")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak


def test_export_memory_does_not_grow_with_the_tensor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CS, "WINDOW_ELEMENTS", 1 << 16, raising=False)
    small = _peak_of_export(tmp_path, (256, 4096), "small")  # 1 Mi values: 16 windows
    large = _peak_of_export(tmp_path, (2048, 4096), "large")  # 8 Mi values: 32 MiB as float32, 16 MiB as bfloat16
    window = (1 << 16) * 4
    # a window's float32 values, its cast and the error measure's float64 temporaries: a few
    # windows (the whole tensor at once was 32 MiB of float32 plus several float64 copies)
    assert large < 24 * window
    assert large < small + 8 * window


@pytest.mark.parametrize("fallback", ["bfloat16", "float16", "float32"])
def test_streamed_bytes_and_errors_are_those_of_the_whole_tensor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  fallback: str) -> None:
    monkeypatch.setattr(CS, "WINDOW_ELEMENTS", 1000, raising=False)  # windows that split rows
    mid = _q8_0_hrry(tmp_path, (64, 256), "m", seed=3)
    out = tmp_path / "m.safetensors"
    rep = hurray_interop.convert(mid, out, fallback=fallback)
    plan = rep.tensors[0]
    with HrryFile(str(mid)) as hf:
        want = dequantize(hf.tensor("w"))
    stored = fallbacks.cast(want, fallback)
    from safetensors.numpy import load_file

    got = load_file(str(out))["w"] if fallback != "bfloat16" else None
    raw = out.read_bytes()[-stored.nbytes:]
    assert raw == stored.tobytes()
    if got is not None:
        assert np.array_equal(got, stored)
    assert plan.max_abs_error == fallbacks.max_abs_error(want, stored)
    assert plan.status == fallbacks.status(plan.max_abs_error)
    dry = hurray_interop.convert(mid, tmp_path / "dry.safetensors", fallback=fallback, dry_run=True)
    assert dry.tensors[0].max_abs_error == plan.max_abs_error and dry.tensors[0].status == plan.status
    assert not (tmp_path / "dry.safetensors").exists()


def test_a_source_that_gives_the_wrong_byte_count_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    from hurray_interop.errors import InconsistentError
    from hurray_interop.formats.safetensors import write_safetensors

    out = tmp_path / "x.safetensors"
    for chunks in ([b"\0" * 7], [b"\0" * 8, b"\0"]):  # limit - 1, limit + 1 (8 bytes: F32 [2])
        with pytest.raises(InconsistentError, match=r"F32 \[2\] needs"):
            write_safetensors(out, [("a", "F32", (2,), chunks)])
        assert not out.exists() and not list(tmp_path.glob(".x.safetensors.*"))
    write_safetensors(out, [("a", "F32", (2,), [b"\0" * 4, b"\0" * 4])])  # the limit
    from safetensors.numpy import load_file

    assert np.array_equal(load_file(str(out))["a"], np.zeros(2, np.float32))


def _rss_file() -> int:
    """This process's resident pages of mapped files (Linux), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) << 10
    pytest.skip("no RssFile in /proc/self/status (not Linux)")


def test_planning_leaves_no_scale_pages_resident(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning validates every fallback tensor (all of its scales are read) before the
    first byte is written; the pages read are let go tensor by tensor, so resident memory
    does not grow with the model (a 1 GB Q4_K_M model's expanded forms: 537 MiB peak
    before, 186 MiB after)."""
    rng = np.random.default_rng(0)
    tensors = []
    for i in range(8):  # 8 Mi values each: 0.5 MiB of f16 scales per tensor, 4 MiB in all
        n = (1 << 23) // 32
        d = rng.uniform(0.01, 0.1, n).astype(np.float16)
        tensors.append((f"w{i}", "Q8_0", (1024, 8192), q8_0_blocks(d, rng.integers(-127, 128, (n, 32), dtype=np.int8))))
    src = write_gguf_raw(tmp_path / "m.gguf", tensors)
    mid = tmp_path / "m.hrry"
    hurray_interop.convert(src, mid)
    hurray_interop.convert(mid, tmp_path / "warm.safetensors", fallback="bfloat16")  # every module loaded
    seen: list[int] = []
    real = CS.write_safetensors

    def write(*a, **k):  # type: ignore[no-untyped-def]
        seen.append(_rss_file() - before)  # planning is over, nothing written yet
        return real(*a, **k)

    monkeypatch.setattr(CS, "write_safetensors", write)
    before = _rss_file()
    hurray_interop.convert(mid, tmp_path / "m.safetensors", fallback="bfloat16")
    assert len(seen) == 1 and seen[0] < 1 << 20, f"{seen[0] >> 10} KiB of file pages stayed resident"


def test_gguf_to_safetensors_notes_are_about_the_output(fixtures_dir: Path, tmp_path: Path) -> None:
    """GGUF -> safetensors goes through a temporary .hrry in exact expanded forms: the report says
    nothing of those forms (the user asked for a dtype fallback and gets floats)."""
    rep = hurray_interop.convert(fixtures_dir / "tiny-llama-kquant.gguf", tmp_path / "k.safetensors", fallback="bfloat16")
    notes = rep.notes + rep.form_notes
    assert not any("expanded form" in n or "minimum overlay" in n for n in notes), notes
    assert any(n.startswith("converted through a temporary Hurray file") for n in notes), notes
    direct = hurray_interop.convert(fixtures_dir / "tiny-llama-kquant.gguf", tmp_path / "k.hrry", fallback="exact")
    assert any("expanded form" in n for n in direct.form_notes)  # the .hrry's own report keeps them


def _q4_k(path: Path, shape: tuple[int, int], seed: int = 0) -> Path:
    """A Q4_K tensor of random super-blocks with finite d and dmin (gguf-py's block layout:
    f16 d, f16 dmin, 12 bytes of 6-bit scales and minimums, 128 bytes of nibbles)."""
    rng = np.random.default_rng(seed)
    n = shape[0] * shape[1] // 256
    blocks = rng.integers(0, 256, (n, 144), dtype=np.uint8)
    blocks[:, 0:2] = np.frombuffer(rng.uniform(0.001, 0.01, n).astype(np.float16).tobytes(), np.uint8).reshape(n, 2)
    blocks[:, 2:4] = np.frombuffer(rng.uniform(0.001, 0.01, n).astype(np.float16).tobytes(), np.uint8).reshape(n, 2)
    return write_gguf_raw(path, [("w", "Q4_K", shape, blocks)])


def _peak_of_gguf_export(tmp_path: Path, shape: tuple[int, int], tag: str) -> int:
    src = _q4_k(tmp_path / f"{tag}.gguf", shape)
    tracemalloc.start()
    try:
        rep = hurray_interop.convert(src, tmp_path / f"{tag}.safetensors", fallback="bfloat16")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [t.status for t in rep.tensors] == ["lossy"] and rep.tensors[0].source_type == "Q4_K"
    return peak


def test_gguf_kquant_to_safetensors_memory_does_not_grow_with_the_tensor(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The case issue 20 measured (a Q4_K_M GGUF to safetensors with a float fallback peaked at
    6.7 GB): the import into the temporary .hrry and the export both stream."""
    monkeypatch.setattr(CS, "WINDOW_ELEMENTS", 1 << 16, raising=False)
    # (both at least a full chunk of the import on each worker: the derived record's factorization
    # works on whole chunks, so a tensor smaller than that peaks lower)
    small = _peak_of_gguf_export(tmp_path, (2048, 4096), "small")  # 8 Mi values
    large = _peak_of_gguf_export(tmp_path, (8192, 4096), "large")  # 32 Mi values: 128 MiB as float32
    assert large < small + (8 << 20), (small >> 20, large >> 20)  # the whole tensor as float32 alone is 128 MiB
