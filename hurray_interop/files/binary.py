"""Bounds-checked little-endian reading over bytes, memoryviews and memory maps.

Every parser in the project reads through :class:`Reader` so that a short or
lying input raises :class:`~hurray_interop.errors.TruncatedError` naming the
field and absolute byte offset, never ``IndexError`` or ``struct.error``.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..errors import FormatError, TruncatedError
from ..kernels import string_starts

__all__ = ["Reader"]

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")


class Reader:
    """A cursor over ``buf[start:end]`` whose offsets are absolute (relative to ``buf``).

    ``base`` is added to every offset reported in errors, for structures that
    are themselves embedded at a known position in a larger file.  ``obj`` is the
    object given, for values that keep a reference to it (not to the view).
    """

    __slots__ = ("buf", "obj", "pos", "end", "base", "path")

    def __init__(
        self,
        buf: "bytes | bytearray | memoryview | np.ndarray",
        pos: int = 0,
        end: int | None = None,
        *,
        base: int = 0,
        path: str | None = None,
    ) -> None:
        self.obj = buf
        if isinstance(buf, np.ndarray):
            buf = memoryview(buf.reshape(-1).view(np.uint8))
        elif not isinstance(buf, memoryview):
            buf = memoryview(buf)
        self.buf = buf.cast("B") if buf.format != "B" or buf.ndim != 1 else buf
        self.pos = pos
        self.end = len(self.buf) if end is None else min(end, len(self.buf))
        self.base = base
        self.path = path

    # -- helpers -----------------------------------------------------------

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.end:
            raise TruncatedError(
                f"needs {n} bytes, only {max(self.end - self.pos, 0)} available",
                path=self.path,
                field=what,
                offset=self.base + self.pos,
            )

    def error(self, message: str, what: str, at: int | None = None, cls: type[FormatError] = FormatError) -> FormatError:
        """Build (not raise) a located error at ``at`` (default: the current position)."""
        return cls(message, path=self.path, field=what, offset=self.base + (self.pos if at is None else at))

    def _unpack(self, st: struct.Struct, what: str) -> Any:
        self.need(st.size, what)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v

    # -- scalars -----------------------------------------------------------

    def u8(self, what: str) -> int:
        return self._unpack(_U8, what)

    def u16(self, what: str) -> int:
        return self._unpack(_U16, what)

    def u32(self, what: str) -> int:
        return self._unpack(_U32, what)

    def u64(self, what: str) -> int:
        return self._unpack(_U64, what)

    def i32(self, what: str) -> int:
        return self._unpack(_I32, what)

    def i64(self, what: str) -> int:
        return self._unpack(_I64, what)

    def f32(self, what: str) -> float:
        return self._unpack(_F32, what)

    def f64(self, what: str) -> float:
        return self._unpack(_F64, what)

    def scalar(self, dtype: np.dtype, what: str) -> Any:
        """One little-endian item of ``dtype`` as a numpy scalar (its exact type and bits)."""
        return self.array(dtype, 1, what)[0]

    def unpack(self, st: struct.Struct, what: str) -> tuple[Any, ...]:
        self.need(st.size, what)
        v = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v

    # -- bulk ----------------------------------------------------------------

    def bytes(self, n: int, what: str) -> bytes:
        self.need(n, what)
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def string(self, what: str) -> bytes:
        """A string as GGUF stores it: a u64 length, then that many bytes."""
        n = self.u64(f"{what} length")
        if n > self.end - self.pos:
            raise self._long_string(n, what)
        return self.bytes(n, what)

    def _long_string(self, n: int, what: str) -> TruncatedError:
        """The error for a string whose length ``n`` (the prefix just read) runs past the end."""
        return TruncatedError(
            f"string length {n} exceeds the {self.end - self.pos} bytes left in the file",
            path=self.path,
            field=f"{what} length",
            offset=self.base + self.pos - 8,
        )

    def string_starts(self, count: int, what: str) -> np.ndarray:
        """Skip ``count`` strings as :meth:`string` reads them, in one walk (no Python step
        per string: ``kernels.string_starts``, C or numpy a window at a time): the int64
        offsets (relative to ``buf``) of their bytes. A string that
        runs past the end raises the error :meth:`string` would, named ``what[i]``."""
        starts, stop = string_starts(self.buf, self.pos, count, self.end)
        self.pos = stop
        if len(starts) < count:
            item = f"{what}[{len(starts)}]"
            raise self._long_string(self.u64(f"{item} length"), item)
        return starts

    def view(self, n: int, what: str) -> memoryview:
        """Zero-copy view of the next ``n`` bytes."""
        self.need(n, what)
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def array(self, dtype: "np.dtype | str", count: int, what: str) -> np.ndarray:
        """Zero-copy numpy view of ``count`` little-endian items of ``dtype``."""
        dt = np.dtype(dtype)
        if count < 0:
            raise self.error(f"negative count {count}", what)
        nbytes = dt.itemsize * count
        self.need(nbytes, what)
        out = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos)
        self.pos += nbytes
        return out

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.pos += n

    def zeros(self, n: int, what: str) -> None:
        """Consume ``n`` reserved bytes that must all be zero."""
        at = self.pos
        raw = self.view(n, what)
        if any(raw):
            raise self.error("reserved bytes must be zero", what, at=at)
