"""The one exception tree of hurray-interop.

Every error the library raises on purpose is a :class:`HurrayInteropError`.
Each carries structured location fields (``path``, ``tensor``, ``field``,
``offset``) and renders them into a one-line message that says *where*::

    model.gguf: tensor 'blk.0.attn_q.weight': data at offset 4096: range exceeds file size 8000

Base classes mirror the upstream Hurray Python binding (``ValueError`` for bad
data, ``NotImplementedError`` for unsupported features) so callers can catch
either family.

Exit status used by the command line (see :mod:`hurray_interop.cli`):

* :class:`FormatError`, :class:`UsageError`, :class:`UnsupportedError` → 2
* :class:`ConversionRefused` → 1 (so does a failed verification, reported, not raised)
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, TypeVar

__all__ = [
    "HurrayInteropError",
    "FormatError",
    "TruncatedError",
    "BadMagicError",
    "InconsistentError",
    "SplitSetError",
    "ChecksumError",
    "UnsupportedError",
    "ConversionRefused",
    "UsageError",
    "OutputExistsError",
    "errors_name_source",
]


class HurrayInteropError(Exception):
    """Root of every error raised by hurray-interop. Never raised directly."""

    #: exit status the command line uses for this family
    exit_status = 2

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        tensor: str | None = None,
        field: str | None = None,
        offset: int | None = None,
        **details: Any,
    ) -> None:
        self.message = message
        self.path = os.fspath(path) if path is not None else None
        self.tensor = tensor
        self.field = field
        self.offset = offset
        self.details = details
        super().__init__(self._render())

    def _render(self) -> str:
        parts: list[str] = []
        if self.path is not None:
            parts.append(self.path)
        if self.tensor is not None:
            parts.append(f"tensor {self.tensor!r}")
        where = ""
        if self.field is not None:
            where = self.field
        if self.offset is not None:
            where = f"{where} at offset {self.offset}" if where else f"at offset {self.offset}"
        if where:
            parts.append(where)
        parts.append(self.message)
        return ": ".join(parts)

    def located(
        self,
        *,
        path: str | os.PathLike[str] | None = None,
        tensor: str | None = None,
        offset_base: int = 0,
    ) -> "HurrayInteropError":
        """Return this error with missing location fields filled in.

        Parsers of embedded structures (a descriptor inside a file) raise with
        offsets relative to the structure; the enclosing reader adds the
        structure's own offset and the file and tensor names.
        """
        if path is not None and self.path is None:
            self.path = os.fspath(path)
        if tensor is not None and self.tensor is None:
            self.tensor = tensor
        if offset_base and self.offset is not None:
            self.offset += offset_base
        self.args = (self._render(),)
        return self

    def __str__(self) -> str:  # keep str() in step with located()
        return self._render()


class FormatError(HurrayInteropError, ValueError):
    """The input is malformed: it breaks a rule of its format."""


class TruncatedError(FormatError):
    """A read would go past the end of the data."""


class BadMagicError(FormatError):
    """The data does not start (or end) with the format's magic bytes."""


class InconsistentError(FormatError):
    """Fields disagree: overlapping ranges, sizes that do not match shapes, duplicates."""


class SplitSetError(InconsistentError):
    """The shards of a split GGUF set do not form one complete set (missing,
    duplicated, extra or mixed shards, counts that disagree, misplaced metadata)."""


class ChecksumError(FormatError):
    """A stored checksum does not match the data."""


class UnsupportedError(HurrayInteropError, NotImplementedError):
    """Well-formed input that this library cannot handle (names what and why)."""


class ConversionRefused(HurrayInteropError):
    """A conversion would not be exact and no fallback was chosen.

    ``reasons`` lists ``(tensor, source_type, reason)`` for every offending tensor.
    """

    exit_status = 1

    def __init__(self, message: str, *, reasons: list[tuple[str, str, str]] | None = None, **kw: Any) -> None:
        self.reasons = list(reasons or [])
        super().__init__(message, **kw)


class UsageError(HurrayInteropError, ValueError):
    """The caller asked for something impossible (bad flags, same input and output)."""


class OutputExistsError(UsageError):
    """The output exists and overwriting was not requested."""


_F = TypeVar("_F", bound=Callable[..., Any])


def errors_name_source(func: _F) -> _F:
    """Decorate a function whose first argument is an input file: a :class:`FormatError`
    raised inside without a file name gets that file's name (records and buffers read
    deep inside are input too)."""

    @functools.wraps(func)
    def wrapper(src: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(src, *args, **kwargs)
        except FormatError as e:
            raise e.located(path=src)

    return wrapper  # type: ignore[return-value]
