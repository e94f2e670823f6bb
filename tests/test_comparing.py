"""files/comparing.py: the output that compares instead of writing (verify's round trip):
every way a writer hands it bytes (sequential writes and seeks, positional writes from
threads, kernel copies), the first difference wherever it is, the sizes at their limits,
the cases that are not definitive; and verify's answers the same with it as without."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

import hurray_interop
import hurray_interop.files.comparing as CMP
from hurray_interop.errors import UsageError
from hurray_interop.files.atomic import AtomicOutput
from hurray_interop.files.positional import PositionalWriter

RNG = np.random.default_rng(20261202)


@pytest.fixture()
def ref(tmp_path: Path) -> tuple[Path, bytes]:
    data = RNG.integers(0, 256, 3 * (1 << 20) + 123, dtype=np.uint8).tobytes()
    p = tmp_path / "ref.bin"
    p.write_bytes(data)
    return p, data


def feed(sink: CMP.ComparingOutput, data: bytes, *, header: int = 1000, piece: int = 65536, threads: int = 4,
         skip: tuple[int, int] | None = None, twice: tuple[int, int] | None = None) -> None:
    """Write ``data`` as an export would: a sequential header, a seek over the body, the body
    in positional pieces from ``threads`` threads in reverse order; ``skip``: a range never
    written; ``twice``: a range written twice."""
    with sink as fh:
        fh.write(data[:header])
        fh.seek(len(data) - header, os.SEEK_CUR)
        pw = PositionalWriter(fh, None)
        ranges = [(o, min(o + piece, len(data))) for o in range(header, len(data), piece)][::-1]
        if twice:
            ranges.append(twice)

        def work(k: int) -> None:
            for a, b in ranges[k::threads]:
                if skip and not (b <= skip[0] or a >= skip[1]):  # the piece around the gap
                    if a < skip[0]:
                        pw.pwrite(data[a : skip[0]], a)
                    if b > skip[1]:
                        pw.pwrite(data[skip[1] : b], skip[1])
                    continue
                pw.pwrite(data[a:b], a)

        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        fh.commit()


def test_identical_bytes_from_every_writer(ref: tuple[Path, bytes], tmp_path: Path) -> None:
    p, data = ref
    sink = CMP.ComparingOutput(tmp_path / "out.gguf", p)
    feed(sink, data)
    assert sink.definitive and sink.difference() is None
    assert not (tmp_path / "out.gguf").exists()


@pytest.mark.parametrize("at", [0, 999, 1000, 1001, 65535 + 1000, 2 * (1 << 20), -1])
def test_the_first_difference_wherever_it_is(ref: tuple[Path, bytes], tmp_path: Path, at: int) -> None:
    p, data = ref
    at = at % len(data)
    bad = bytearray(data)
    bad[at] ^= 0x10
    later = min(at + 70000, len(data) - 1)  # a second difference after it, written earlier
    if later > at:
        bad[later] ^= 0x01
    sink = CMP.ComparingOutput(tmp_path / "out", p)
    feed(sink, bytes(bad))
    assert sink.definitive and sink.difference() == (at, len(data), len(data))


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_the_export_size_at_the_reference_size(ref: tuple[Path, bytes], tmp_path: Path, delta: int) -> None:
    p, data = ref
    out = data[: len(data) + delta] if delta <= 0 else data + b"\0"
    sink = CMP.ComparingOutput(tmp_path / "out", p)
    feed(sink, out)
    assert sink.definitive
    want = None if delta == 0 else (len(data) - 1, len(data) - 1, len(data)) if delta < 0 else (len(data), len(data) + 1, len(data))
    assert sink.difference() == want


def test_a_gap_or_a_range_written_twice_is_not_definitive(ref: tuple[Path, bytes], tmp_path: Path) -> None:
    p, data = ref
    gap = CMP.ComparingOutput(tmp_path / "a", p)
    feed(gap, data, skip=(5000, 5001))  # one byte never written: the real file would hold 0 there
    assert not gap.definitive
    twice = CMP.ComparingOutput(tmp_path / "b", p)
    feed(twice, data, twice=(2000, 3000))
    assert not twice.definitive


def test_kernel_copies_are_compared_from_the_source(ref: tuple[Path, bytes], tmp_path: Path) -> None:
    p, data = ref
    src = tmp_path / "src.bin"
    src.write_bytes(b"xyz" + data[100:])
    sink = CMP.ComparingOutput(tmp_path / "out", p)
    with sink as fh, open(src, "rb") as s:
        fh.write(data[:100])
        pw = PositionalWriter(fh, None)
        pw.copy(s.fileno(), 3, len(data) - 100, 100)
        fh.commit()
    assert sink.definitive and sink.difference() is None
    short = CMP.ComparingOutput(tmp_path / "out2", p)
    with short as fh, open(src, "rb") as s, pytest.raises(UsageError, match="the source ends before"):
        PositionalWriter(fh, None).copy(s.fileno(), 3, len(data), 100)


def test_an_empty_reference(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    sink = CMP.ComparingOutput(tmp_path / "out", empty)
    with sink as fh:
        fh.commit()
    assert sink.definitive and sink.difference() is None
    other = CMP.ComparingOutput(tmp_path / "out", empty)
    with other as fh:
        fh.write(b"a")
        fh.commit()
    assert other.difference() == (0, 1, 0)


def test_output_hands_out_the_comparer_once_and_only_for_its_path(ref: tuple[Path, bytes], tmp_path: Path) -> None:
    p, _ = ref
    assert isinstance(CMP.output(tmp_path / "x"), AtomicOutput)
    with CMP.comparing(tmp_path / "x", p) as sink:
        assert isinstance(CMP.output(tmp_path / "y"), AtomicOutput)
        got = CMP.output(tmp_path / "x")
        assert got is sink
        with got:
            assert isinstance(CMP.output(tmp_path / "x"), AtomicOutput)  # used: a second opener writes
    assert isinstance(CMP.output(tmp_path / "x"), AtomicOutput)


# ---------------------------------------------------------------------------
# verify with the comparer: the same answers as writing the export


def _flip_export_byte(monkeypatch: pytest.MonkeyPatch, at: int) -> None:
    """Every export writes byte ``at`` flipped (whether compared or written)."""
    orig = PositionalWriter.pwrite

    def pwrite(self: PositionalWriter, data, offset: int) -> None:  # type: ignore[no-untyped-def]
        mv = memoryview(data).cast("B")
        if offset <= at < offset + len(mv):
            b = bytearray(mv)
            b[at - offset] ^= 0x40
            mv = memoryview(bytes(b))
        orig(self, mv, offset)

    monkeypatch.setattr(PositionalWriter, "pwrite", pwrite)


def test_verify_locates_an_export_difference_with_and_without_the_comparer(
        fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = fixtures_dir / "tiny-llama.gguf"
    with hurray_interop.open(src) as g:
        t = next(t for t in g.tensors if t.ggml_type.name == "Q4_0")
        at = t.data_offset + 7
    ok = hurray_interop.verify(src)
    assert ok.ok and ok.file_bytes_equal
    _flip_export_byte(monkeypatch, at)
    with_sink = hurray_interop.verify(src)

    class NoSink:
        def __init__(self, *a, **k) -> None:  # type: ignore[no-untyped-def]
            self.definitive = False

        def __enter__(self):  # type: ignore[no-untyped-def]
            return self

        def __exit__(self, *exc) -> bool:  # type: ignore[no-untyped-def]
            return False

    import hurray_interop.verification.common as VC

    monkeypatch.setattr(VC, "comparing", lambda *a: NoSink())
    without = hurray_interop.verify(src)
    for r in (with_sink, without):  # without: the export written and the files compared
        assert not r.ok and r.file_bytes_equal is False
        assert any(p.startswith("re-exported GGUF differs from the source first at tensor ") for p in r.problems), r.problems
    assert with_sink.problems == without.problems
    assert [(c.name, c.bytes_equal, c.where) for c in with_sink.tensors] == [
        (c.name, c.bytes_equal, c.where) for c in without.tensors]


@pytest.mark.parametrize("at", [None, 0, 6, 7, (1 << 20) - 1, 1 << 20, (1 << 20) + 1])
def test_many_small_sequential_writes_are_gathered_and_compared(ref: tuple[Path, bytes], tmp_path: Path,
                                                                at: int | None) -> None:
    """A header is written field by field: the pieces are gathered (1 MiB) before comparing,
    a difference anywhere in them -- across a gathering boundary too -- is found."""
    p, data = ref
    bad = bytearray(data)
    if at is not None:
        bad[at] ^= 0x02
    sink = CMP.ComparingOutput(tmp_path / "out", p)
    with sink as fh:
        for i in range(0, len(bad), 7):
            fh.write(bytes(bad[i : i + 7]))
        fh.commit()
    assert sink.definitive
    assert sink.difference() == (None if at is None else (at, len(data), len(data)))
