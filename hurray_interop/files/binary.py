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
    are themselves embedded at a known position in a larger file.
    """

    __slots__ = ("buf", "pos", "end", "base", "path")

    def __init__(
        self,
        buf: "bytes | bytearray | memoryview | np.ndarray",
        pos: int = 0,
        end: int | None = None,
        *,
        base: int = 0,
        path: str | None = None,
    ) -> None:
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
