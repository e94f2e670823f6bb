"""files/positional.py: positional writes and kernel copies from threads give the bytes a
plain sequential writer gives, with every fallback (no copy_file_range, no pwrite/preadv,
no writeback call), and a failure leaves no file."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from hurray_interop.errors import UsageError
from hurray_interop.files import positional as P
from hurray_interop.files.atomic import AtomicOutput

RNG = np.random.default_rng(7)
SOURCE = RNG.integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
#: (offset in the output, bytes): written with pwrite, and ranges copied from SOURCE
PIECES = [(16, RNG.integers(0, 256, 1_500_000, dtype=np.uint8).tobytes()), (1_600_000, b"header"), (1_600_100, b"")]
COPIES = [(100, 1_200_000, 1_700_000), (2_000_000, 5, 2_900_000)]  # (source offset, length, output offset)
SIZE = 4_000_000  # the tail past the last piece stays zero


def _expected() -> bytes:
    out = bytearray(SIZE)
    for off, data in PIECES:
        out[off : off + len(data)] = data
    for so, n, off in COPIES:
        out[off : off + n] = SOURCE[so : so + n]
    return bytes(out)


def _write(dest: Path, src: Path, *, writeback: str = "auto") -> None:
    with AtomicOutput(dest) as out, open(src, "rb") as f:
        out.write(b"\x01" * 16)  # buffered bytes before the positional writer: flushed, kept
        w = P.PositionalWriter(out, SIZE, writeback=writeback)
        jobs = [lambda o=o, d=d: w.pwrite(d, o) for o, d in PIECES]
        jobs += [lambda so=so, n=n, o=o: w.copy(f.fileno(), so, n, o) for so, n, o in COPIES]
        with ThreadPoolExecutor(2) as pool:
            for fut in [pool.submit(j) for j in jobs]:
                fut.result()
        out.commit()


@pytest.fixture
def src(tmp_path: Path) -> Path:
    p = tmp_path / "source.bin"
    p.write_bytes(SOURCE)
    return p


def _expected_with_prefix() -> bytes:
    return b"\x01" * 16 + _expected()[16:]


@pytest.mark.parametrize("writeback", ["auto", "fadvise", "sync_file_range", "none"])
def test_positional_output_equals_a_sequential_writer(tmp_path: Path, src: Path, writeback: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(P, "WRITEBACK_SPAN", 1 << 16)  # so every strategy is exercised on these ranges
    if P.writeback_function(writeback) is None and writeback != "none":
        pytest.skip(f"{writeback} not available here")
    _write(tmp_path / "out.bin", src, writeback=writeback)
    assert (tmp_path / "out.bin").read_bytes() == _expected_with_prefix()


def test_every_fallback_gives_the_same_bytes(tmp_path: Path, src: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """No copy_file_range, no pwrite/preadv (Windows), no sync_file_range nor posix_fadvise
    (macOS): the seek-and-write fallbacks and a final fsync, same bytes."""
    for name in ("copy_file_range", "pwrite", "preadv", "posix_fadvise"):
        monkeypatch.delattr(os, name, raising=False)
    monkeypatch.setattr(P, "_sync_file_range", lambda: None)
    monkeypatch.setattr(P, "COPY_CHUNK", 1 << 16)  # the reused buffer is smaller than a copy
    assert P.writeback_function("auto") is None
    _write(tmp_path / "out.bin", src)
    assert (tmp_path / "out.bin").read_bytes() == _expected_with_prefix()


def test_copy_file_range_refused_falls_back_mid_copy(tmp_path: Path, src: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The kernel copies the first chunk, then refuses (EXDEV): the rest goes through the buffer."""
    import errno

    real = os.copy_file_range
    calls: list[int] = []

    def once(*a):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) > 1:
            raise OSError(errno.EXDEV, "cross-device")
        return real(*a)

    monkeypatch.setattr(os, "copy_file_range", once)
    monkeypatch.setattr(P, "COPY_CHUNK", 1 << 16)
    _write(tmp_path / "out.bin", src)
    assert (tmp_path / "out.bin").read_bytes() == _expected_with_prefix()
    assert len(calls) in (2, 3)  # one success, then a refusal -- one per thread if both were mid-copy


def test_a_failure_leaves_no_file(tmp_path: Path, src: Path) -> None:
    dest = tmp_path / "out.bin"
    with pytest.raises(UsageError, match="outside the"):
        with AtomicOutput(dest) as out:
            w = P.PositionalWriter(out, 100)
            w.pwrite(b"x" * 50, 0)
            w.pwrite(b"x" * 51, 50)  # past the declared size
    with pytest.raises(UsageError, match="source ends"):
        with AtomicOutput(dest) as out, open(src, "rb") as f:
            P.PositionalWriter(out, SIZE).copy(f.fileno(), len(SOURCE) - 10, 20, 0)
    assert os.listdir(tmp_path) == ["source.bin"]


def test_a_failing_writeback_call_costs_nothing(tmp_path: Path, src: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def broken(fd: int, off: int, n: int) -> None:
        raise OSError(5, "writeback refused")

    monkeypatch.setattr(P, "writeback_function", lambda strategy="auto": broken)
    monkeypatch.setattr(P, "WRITEBACK_SPAN", 1)
    _write(tmp_path / "out.bin", src)
    assert (tmp_path / "out.bin").read_bytes() == _expected_with_prefix()


def test_atomic_output_starts_writeback_as_it_writes(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Sequential writers (the .hrry, GGUF and safetensors writers) get incremental
    writeback through AtomicOutput.write: ranges in order, covering what was written."""
    import hurray_interop.files.atomic as A

    ranges: list[tuple[int, int]] = []
    monkeypatch.setattr(A, "writeback_function", lambda strategy="auto": lambda fd, off, n: ranges.append((off, n)))
    monkeypatch.setattr(A, "WRITEBACK_STEP", 1000)
    data = RNG.integers(0, 256, 5500, dtype=np.uint8).tobytes()
    with AtomicOutput(tmp_path / "out.bin") as out:
        for i in range(0, len(data), 700):
            out.write(data[i : i + 700])
        out.commit()
    assert (tmp_path / "out.bin").read_bytes() == data
    assert ranges == [(0, 1400), (1400, 1400), (2800, 1400), (4200, 1300)]  # the last 1300 bytes: 1000 or more


def test_a_long_write_goes_out_in_pieces(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """pwrite hands the kernel at most WRITE_PIECE bytes per call (see its comment), and the
    pieces land where the whole would have."""
    sizes: list[int] = []
    real = os.pwrite

    def counting(fd, data, offset):  # type: ignore[no-untyped-def]
        sizes.append(len(data))
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", counting)
    data = os.urandom(3 * P.WRITE_PIECE + 5)
    with AtomicOutput(tmp_path / "out.bin") as out:
        w = P.PositionalWriter(out, len(data) + 7)
        w.pwrite(b"x" * 7, 0)
        w.pwrite(data, 7)
        out.commit()
    assert (tmp_path / "out.bin").read_bytes() == b"x" * 7 + data
    assert max(sizes) <= P.WRITE_PIECE and sum(sizes) == len(data) + 7


def test_writeback_of_the_whole_file_every_span(tmp_path: Path, src: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every WRITEBACK_SPAN bytes written, from any thread and in any order (pwrite and kernel
    copies alike), the whole file's writeback is started once: (0, 0) is "from the start to
    the end"; a transient output starts none."""
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(P, "writeback_function", lambda strategy="auto": lambda fd, off, n: calls.append((fd, off, n)))
    monkeypatch.setattr(P, "WRITEBACK_SPAN", 1 << 20)
    _write(tmp_path / "out.bin", src)
    assert (tmp_path / "out.bin").read_bytes() == _expected_with_prefix()
    # 1,500,000 and 1,200,000 bytes each complete a span, in whichever order the threads
    # finish; the 11 bytes of the small writes do not
    assert len(calls) == 2
    assert {(off, n) for _, off, n in calls} == {(0, 0)}

    from hurray_interop.files.atomic import transient

    calls.clear()
    with transient():
        _write(tmp_path / "t.bin", src)
    assert calls == [] and (tmp_path / "t.bin").read_bytes() == _expected_with_prefix()
