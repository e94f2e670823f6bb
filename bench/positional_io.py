"""Durable-write strategies on this machine (run by hand; docs/benchmarks.md, "Positional output").

    python bench/positional_io.py DIR [--size 1GB] [--rounds 3]

Writes a file of ``--size`` bytes in DIR per strategy, interleaved over rounds, and prints
the median seconds of the whole write and of its final fsync:

* ``write+fsync``        buffered sequential writes, then fsync (AtomicOutput before this work)
* ``write/AtomicOutput wb`` the same with AtomicOutput's incremental writeback (every 8 MiB)
* ``pwrite/<writeback>`` PositionalWriter.pwrite of 8 MiB chunks from two threads, with
  writeback started per chunk by ``sync_file_range``, ``fadvise`` (DONTNEED) or ``none``
* ``copy/<how>``         a source file copied with ``copy_file_range`` or read/pwrite, then fsync
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hurray_interop.files import positional as P  # noqa: E402
from hurray_interop.files.atomic import AtomicOutput  # noqa: E402

CHUNK = 8 << 20


def _plain(path: Path, size: int, data: bytes, writeback: bool = False) -> float:
    with AtomicOutput(path, force=True, writeback=writeback) as out:
        for off in range(0, size, CHUNK):
            out.write(memoryview(data)[: min(CHUNK, size - off)])
        out.flush()
        t = time.perf_counter()
        out.commit()
    return time.perf_counter() - t


def _positional(path: Path, size: int, data: bytes, writeback: str) -> float:
    with AtomicOutput(path, force=True) as out:
        w = P.PositionalWriter(out, size, writeback=writeback)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda off: w.pwrite(memoryview(data)[: min(CHUNK, size - off)], off), range(0, size, CHUNK)))
        t = time.perf_counter()
        out.commit()
    return time.perf_counter() - t


def _copy(path: Path, src: Path, size: int, kernel: bool) -> float:
    with AtomicOutput(path, force=True) as out, open(src, "rb") as f:
        w = P.PositionalWriter(out, size)
        if not kernel:
            w._copy_range = None
        w.copy(f.fileno(), 0, size, 0)
        t = time.perf_counter()
        out.commit()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--size", default="1GB")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    size = int(float(a.size.upper().removesuffix("GB")) * 10**9) if a.size.upper().endswith("GB") else int(a.size)
    d = Path(a.dir)
    data = np.random.default_rng(0).integers(0, 256, CHUNK, dtype=np.uint8).tobytes()
    src = d / "positional-src.bin"
    _plain(src, size, data)
    out = d / "positional-out.bin"
    cases = {
        "write+fsync": lambda: _plain(out, size, data),
        "write/AtomicOutput wb": lambda: _plain(out, size, data, True),
        "pwrite/sync_file_range": lambda: _positional(out, size, data, "sync_file_range"),
        "pwrite/fadvise": lambda: _positional(out, size, data, "fadvise"),
        "pwrite/none": lambda: _positional(out, size, data, "none"),
        "copy/copy_file_range": lambda: _copy(out, src, size, True),
        "copy/read+pwrite": lambda: _copy(out, src, size, False),
    }
    res: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    try:
        for _ in range(a.rounds):
            for k, fn in cases.items():
                t = time.perf_counter()
                sync = fn()
                res[k].append((time.perf_counter() - t, sync))
                os.unlink(out)
    finally:
        src.unlink(missing_ok=True)
        out.unlink(missing_ok=True)
    for k, v in res.items():
        total, sync = statistics.median(x for x, _ in v), statistics.median(y for _, y in v)
        print(f"{k:24s} total {total:6.2f} s  final fsync {sync:5.2f} s  ({size / total / 1e6:5.0f} MB/s)")


if __name__ == "__main__":
    main()
