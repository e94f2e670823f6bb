"""Positional output for worker threads: bytes written at their final offsets.

A :class:`PositionalWriter` wraps an open :class:`~hurray_interop.files.atomic.AtomicOutput`
(so a failure anywhere still deletes the temporary file, and ``commit`` still does the
final ``fsync`` and the rename).  Any number of threads may call, concurrently:

* :meth:`PositionalWriter.pwrite` -- ``os.pwrite`` of a buffer at its final offset;
* :meth:`PositionalWriter.copy` -- bytes of another file copied by the kernel
  (``os.copy_file_range``: no pass through Python buffers, and on file systems that
  share extents no copy at all), falling back to ``os.pread``/``os.pwrite`` through a
  buffer reused per thread.

After every :data:`WRITEBACK_SPAN` bytes written (by any thread, in any order) the
writer starts the kernel's writeback of the whole file's dirty pages (incremental
writeback), so dirty pages do not pile up for the final ``fsync``:
``sync_file_range(SYNC_FILE_RANGE_WRITE)`` through ctypes where the C library has it
(Linux), else ``posix_fadvise(POSIX_FADV_DONTNEED)``, which on Linux also starts
writeback of the dirty pages.  Where neither exists (macOS, Windows) nothing is started
and the final ``fsync`` writes everything: the same bytes, only slower.  Gaps never
written read as zeros (the file is sized up front).
"""

from __future__ import annotations

import errno
import functools
import os
import threading
from typing import Any, Callable

from ..errors import UsageError

__all__ = ["PositionalWriter", "WRITEBACK_SPAN", "COPY_CHUNK", "WRITE_PIECE", "writeback_function"]

#: bytes written between two starts of the whole file's writeback.  The kernel then sends
#: the dirty pages in file order, small ranges (scales) included, so the final fsync finds
#: almost nothing: on the 4 GB model 120 calls and a 0.01 s fsync, where starting each
#: written range of 1 MiB or more on its own made 2,277 calls, left the scales to a 0.24 s
#: fsync, and the import took 3.35 s against 2.92 s now (medians of 7 alternated rounds;
#: docs/benchmarks.md).  8 and 32 MiB measured alike, 128 MiB slower.
WRITEBACK_SPAN = 32 << 20

#: bytes per ``copy_file_range`` call, and the size of the fallback's reused buffer
COPY_CHUNK = 8 << 20

#: bytes per ``pwrite`` call: a chunk is written in pieces of this size.  Writes that exactly
#: cover large, aligned ranges of a new file make the kernel allocate large page-cache
#: folios, which on a VM with fragmented memory cost 2.5x the time of the same bytes written
#: in 128 KiB pieces (docs/benchmarks.md); the extra system calls cost nothing measurable.
WRITE_PIECE = 128 << 10

#: errors after which ``copy_file_range`` is given up for the read/write fallback
_NO_COPY_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.ETXTBSY}


@functools.cache
def _sync_file_range() -> Callable[[int, int, int], None] | None:
    """``sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE)`` from the C library, or None.
    Looked up once, among the symbols the process already has (``CDLL(None)``: the C library
    the interpreter links; ``ctypes.util.find_library`` would run ``ldconfig`` each time)."""
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError, ImportError, TypeError):  # TypeError: no CDLL(None) (Windows)
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int

    def start(fd: int, offset: int, length: int) -> None:
        if fn(fd, offset, length, 2) != 0:  # SYNC_FILE_RANGE_WRITE
            raise OSError(ctypes.get_errno(), "sync_file_range failed")

    return start


def _fadvise_dontneed() -> Callable[[int, int, int], None] | None:
    advise = getattr(os, "posix_fadvise", None)
    flag = getattr(os, "POSIX_FADV_DONTNEED", None)
    if advise is None or flag is None:
        return None
    return lambda fd, offset, length: advise(fd, offset, length, flag)


_SEEK_LOCK = threading.Lock()  # positions shared by the seek-and-write fallbacks


def _pwrite_function() -> Callable[[int, memoryview, int], int]:
    """``os.pwrite``, or (Windows) a seek and a write under a lock."""
    pwrite = getattr(os, "pwrite", None)
    if pwrite is not None:
        return pwrite

    def seek_write(fd: int, data: memoryview, offset: int) -> int:
        with _SEEK_LOCK:  # the file position is put back, as pwrite leaves it (a sequential writer shares it)
            here = os.lseek(fd, 0, os.SEEK_CUR)
            os.lseek(fd, offset, os.SEEK_SET)
            try:
                return os.write(fd, data)
            finally:
                os.lseek(fd, here, os.SEEK_SET)

    return seek_write


def _pread_function() -> Callable[[int, memoryview, int], int]:
    """Read into a buffer at an offset: ``os.preadv``, or a seek and a read under a lock."""
    preadv = getattr(os, "preadv", None)
    if preadv is not None:
        return lambda fd, into, offset: preadv(fd, [into], offset)

    def seek_read(fd: int, into: memoryview, offset: int) -> int:
        with _SEEK_LOCK:
            here = os.lseek(fd, 0, os.SEEK_CUR)
            os.lseek(fd, offset, os.SEEK_SET)
            try:
                got = os.read(fd, len(into))
            finally:
                os.lseek(fd, here, os.SEEK_SET)
        into[: len(got)] = got
        return len(got)

    return seek_read


def writeback_function(strategy: str = "auto") -> Callable[[int, int, int], None] | None:
    """How ranges are handed to writeback: ``"sync_file_range"``, ``"fadvise"``, ``"none"``,
    or ``"auto"`` (the first of the two the platform has); None when there is none."""
    if strategy == "none":
        return None
    if strategy in ("auto", "sync_file_range"):
        fn = _sync_file_range()
        if fn is not None or strategy == "sync_file_range":
            return fn
    if strategy in ("auto", "fadvise"):
        return _fadvise_dontneed()
    raise UsageError(f"unknown writeback strategy {strategy!r}")


class PositionalWriter:
    """Thread-safe positional writes into an open :class:`AtomicOutput` of ``size`` bytes.

    ``out`` is flushed first (bytes it holds in its buffer land at their offsets) and
    truncated/extended to ``size`` (``None``: left as it is, for an owner that writes the
    rest sequentially around the ranges it hands out, e.g. :meth:`HrryWriter.reserve`).  ``writeback``: see :func:`writeback_function`.
    The final ``fsync`` is ``out.commit()``'s."""

    def __init__(self, out: Any, size: int | None, *, writeback: str = "auto") -> None:
        out.flush()
        #: a :class:`~hurray_interop.files.comparing.ComparingOutput` takes the bytes instead
        self._sink = out if hasattr(out, "compare_at") else None
        self.fd: int = -1 if self._sink is not None else out.fileno()
        self.path = getattr(out, "path", None)
        self.size = size  # None: the owner lays the file out itself (no truncation, no bound)
        # a transient output (files.atomic.transient) is never sent to the disk on purpose
        self._writeback = writeback_function(writeback) if getattr(out, "durable", True) else None
        self._copy_range = getattr(os, "copy_file_range", None)
        self._pwrite, self._pread = _pwrite_function(), _pread_function()
        self._local = threading.local()
        self._lock = threading.Lock()  # one write into the file at a time: see :meth:`pwrite`
        self._count_lock = threading.Lock()
        self._unstarted = 0  # bytes written since the last start of writeback
        if size is not None and self._sink is None:
            self._fail(os.ftruncate, self.fd, size)

    def _fail(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except OSError as e:
            raise UsageError(f"cannot write the output: {e.strerror or e}", path=self.path) from None

    def _check(self, offset: int, length: int) -> None:
        if offset < 0 or length < 0 or (self.size is not None and offset + length > self.size):
            raise UsageError(f"write of {length} bytes at offset {offset} is outside the {self.size}-byte output",
                             path=self.path)

    def pwrite(self, data: Any, offset: int) -> None:
        """Write all of ``data`` (any buffer) at ``offset``, then start its writeback.

        Writes into the file are serialised by a lock: a buffered write holds the
        inode's lock in the kernel anyway (ext4, XFS), and threads that meet there spin
        on it -- system CPU the other worker needs (about 0.4 s per 4 GB from two
        threads; docs/benchmarks.md, "Reading and writing the data").  The lock makes
        the waiting thread sleep instead; the writeback hint runs outside it."""
        mv = memoryview(data).cast("B")
        self._check(offset, len(mv))
        if self._sink is not None:
            self._sink.compare_at(mv, offset)
            return
        self._write_all(mv, offset)
        self._written(len(mv))

    def _write_all(self, mv: memoryview, offset: int) -> None:
        """All of ``mv`` at ``offset``, in :data:`WRITE_PIECE` pieces, under the write lock."""
        done = 0
        with self._lock:
            while done < len(mv):
                done += self._fail(self._pwrite, self.fd, mv[done : done + WRITE_PIECE], offset + done)

    def copy(self, src_fd: int, src_offset: int, length: int, offset: int) -> None:
        """Copy ``length`` bytes of the file ``src_fd`` from ``src_offset`` to ``offset``."""
        self._check(offset, length)
        if self._sink is not None:
            self._sink.copy_at(src_fd, src_offset, length, offset)
            return
        done = 0
        while done < length:
            copy_range = self._copy_range  # once: another thread may give it up meanwhile
            if copy_range is None:
                break
            try:
                with self._lock:  # as in pwrite
                    n = copy_range(src_fd, self.fd, min(COPY_CHUNK, length - done), src_offset + done, offset + done)
            except OSError as e:
                if e.errno not in _NO_COPY_RANGE:
                    raise UsageError(f"cannot write the output: {e.strerror or e}", path=self.path) from None
                self._copy_range = None  # this pair of files cannot: the fallback from here on
                break
            if n == 0:
                raise UsageError(f"the source ends before offset {src_offset + length}", path=self.path)
            done += n
        if done < length:
            self._copy_via_buffer(src_fd, src_offset + done, length - done, offset + done)
        self._written(length)

    def _copy_via_buffer(self, src_fd: int, src_offset: int, length: int, offset: int) -> None:
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = bytearray(COPY_CHUNK)
        mv = memoryview(buf)
        done = 0
        while done < length:
            k = min(len(buf), length - done)
            n = self._fail(self._pread, src_fd, mv[:k], src_offset + done)
            if n == 0:
                raise UsageError(f"the source ends before offset {src_offset + length}", path=self.path)
            self._write_all(mv[:n], offset + done)
            done += n

    def _written(self, length: int) -> None:
        """Count ``length`` bytes written; every :data:`WRITEBACK_SPAN` bytes, start the
        writeback of the whole file.  A failure only costs speed, never bytes."""
        if self._writeback is None:
            return
        with self._count_lock:
            self._unstarted += length
            if self._unstarted < WRITEBACK_SPAN:
                return
            self._unstarted = 0
        try:
            self._writeback(self.fd, 0, 0)  # offset 0, length 0: the whole file
        except OSError:
            self._writeback = None
