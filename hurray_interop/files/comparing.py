"""An output that compares instead of writing: ``verify``'s round trip without a second copy.

A round trip exports the Hurray copy back and proves it is the source byte for byte.
Writing that export into a transient file and then reading both files again costs a copy
of the model through the page cache and a second pass over both; :class:`ComparingOutput`
takes the export's bytes where an :class:`~hurray_interop.files.atomic.AtomicOutput` would
(sequential ``write``/``seek``/``tell``, and through
:class:`~hurray_interop.files.positional.PositionalWriter` the workers' positional writes and
kernel copies) and compares each piece, as it arrives, with the reference file's bytes at
the same offsets (a read-only memory map, pages dropped after each piece).  It keeps the
first differing offset, the bytes covered and the end written.

Its answer is definitive only when the pieces covered every byte up to the end written,
once each (:meth:`ComparingOutput.difference`); otherwise -- or when it saw a difference,
whose details need the real file -- the caller writes the export for real and compares the
files as before.  :func:`comparing` installs one for a destination path in the current
context; :func:`output` is what a writer opens instead of ``AtomicOutput`` to be compared.
"""

from __future__ import annotations

import mmap
import os
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

import numpy as np

from ..errors import UsageError
from ..kernels import first_diff_bytes
from .atomic import AtomicOutput
from .positional import _pread_function

__all__ = ["ComparingOutput", "comparing", "output"]

#: bytes read per step of a compared kernel copy
_READ_STEP = 1 << 22
#: sequential bytes gathered before they are compared
_GATHER = 1 << 20

_SINK: ContextVar["ComparingOutput | None"] = ContextVar("hurray_interop_comparing", default=None)


class ComparingOutput:
    """Compares what is written for ``path`` with the file ``reference``: positional pieces
    (:meth:`compare_at`, :meth:`copy_at`) from any thread, sequential writes from the one
    thread that owns the output (as with a file)."""

    def __init__(self, path: "str | os.PathLike[str]", reference: "str | os.PathLike[str]") -> None:
        self.path = os.fspath(path)
        self.reference = os.fspath(reference)
        self.durable = False  # never sent to a disk (PositionalWriter asks)
        self.used = False
        self.committed = False
        self._pos = 0
        self._lock = threading.Lock()
        self._first: int | None = None
        self._covered = 0
        self._end = 0
        self._local = threading.local()
        self._pread = _pread_function()  # os.preadv, or a seek and read under a lock
        self._fh: Any = None
        self._pending = bytearray()  # sequential bytes not compared yet, from _pending_at
        self._pending_at = 0
        self._map: mmap.mmap | None = None
        self._ref = np.zeros(0, np.uint8)
        self.reference_size = os.path.getsize(self.reference)

    # -- the AtomicOutput side -------------------------------------------------------

    def __enter__(self) -> "ComparingOutput":
        self.used = True
        self._fh = open(self.reference, "rb")
        if self.reference_size:
            self._map = mmap.mmap(self._fh.fileno(), self.reference_size, access=mmap.ACCESS_READ)
            self._ref = np.frombuffer(self._map, np.uint8)
        return self

    def __exit__(self, *exc: Any) -> bool:
        self._ref = np.zeros(0, np.uint8)  # no view may outlive the map
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        return False

    def write(self, data: Any) -> int:
        """A sequential write at the current position: small pieces (a header's many fields)
        are gathered and compared :data:`_GATHER` bytes at a time."""
        mv = memoryview(data).cast("B")
        n = len(mv)
        if self._pending_at + len(self._pending) != self._pos:
            self.flush()
        if not self._pending:
            self._pending_at = self._pos
        self._pending += mv
        self._pos += n
        if len(self._pending) >= _GATHER:
            self.flush()
        return n

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.flush()
        self._pos = offset if whence == os.SEEK_SET else self._pos + offset if whence == os.SEEK_CUR else self._end + offset
        return self._pos

    def flush(self) -> None:
        """Compare the gathered sequential bytes."""
        if self._pending:
            self.compare_at(self._pending, self._pending_at)
            self._pending = bytearray()

    def commit(self) -> str:
        self.flush()
        self.committed = True
        return self.path

    def abort(self) -> None:
        pass

    # -- the PositionalWriter side ------------------------------------------------------

    def compare_at(self, data: Any, offset: int) -> None:
        """Compare the bytes ``data`` written at ``offset`` with the reference's there."""
        mv = memoryview(data).cast("B")
        n = len(mv)
        if n == 0:
            return
        got = np.frombuffer(mv, np.uint8)
        stop = min(offset + n, self.reference_size)
        first: int | None = None
        if offset < stop:
            i = first_diff_bytes(got[: stop - offset], self._ref[offset:stop])
            if i >= 0:
                first = offset + i
            self._drop(offset, stop - offset)
        if first is None and offset + n > self.reference_size:
            first = max(offset, self.reference_size)  # past the reference's end
        with self._lock:
            self._covered += n
            self._end = max(self._end, offset + n)
            if first is not None and (self._first is None or first < self._first):
                self._first = first

    def copy_at(self, src_fd: int, src_offset: int, length: int, offset: int) -> None:
        """Compare ``length`` bytes of the file ``src_fd`` from ``src_offset``, copied to
        ``offset``, with the reference's there (read through a buffer kept per thread)."""
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = bytearray(_READ_STEP)
        mv = memoryview(buf)
        done = 0
        while done < length:
            k = min(len(buf), length - done)
            try:
                got = self._pread(src_fd, mv[:k], src_offset + done)
            except OSError as e:
                raise UsageError(f"cannot read the source: {e.strerror or e}", path=self.path) from None
            if got == 0:
                raise UsageError(f"the source ends before offset {src_offset + length}", path=self.path)
            self.compare_at(mv[:got], offset + done)
            done += got

    def _drop(self, offset: int, length: int) -> None:
        """Drop the reference's pages of a compared range from this process (bounded RSS)."""
        if self._map is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = offset - offset % mmap.PAGESIZE
        end = min(offset + length, self.reference_size)
        end -= end % mmap.PAGESIZE  # whole pages only: a neighbour may still be comparing the rest
        if end > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)

    # -- the answer ------------------------------------------------------------------------

    @property
    def definitive(self) -> bool:
        """Whether every byte up to the end written was compared exactly once (then the
        export, had it been written, would be these bytes and no others)."""
        return self.used and self.committed and self._covered == self._end

    def difference(self) -> tuple[int, int, int] | None:
        """``(offset, export size, reference size)`` of the first differing byte, None when the
        export is the reference byte for byte (only meaningful when :attr:`definitive`)."""
        if self._first is not None:
            return self._first, self._end, self.reference_size
        if self._end != self.reference_size:
            return min(self._end, self.reference_size), self._end, self.reference_size
        return None


@contextmanager
def comparing(path: "str | os.PathLike[str]", reference: "str | os.PathLike[str]") -> Iterator[ComparingOutput]:
    """In this context, :func:`output` of ``path`` compares with ``reference`` instead of
    writing (see the module documentation); yields the comparer."""
    sink = ComparingOutput(path, reference)
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)


def output(path: "str | os.PathLike[str]", **options: Any) -> "AtomicOutput | ComparingOutput":
    """An :class:`~hurray_interop.files.atomic.AtomicOutput` of ``path`` (``options``: its
    keywords), or the comparer :func:`comparing` installed for that path."""
    sink = _SINK.get()
    if sink is not None and not sink.used and os.fspath(path) == sink.path:
        return sink
    return AtomicOutput(path, **options)
