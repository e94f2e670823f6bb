"""The one pass of GGUF ⇄ Hurray: per chunk, check, convert and write in place.

An import reads each tensor once (docs/benchmarks.md, "One pass"): worker threads
(:func:`hurray_interop.parallel.pmap`, one ordered map) take a chunk of blocks each,
classify its scales (:func:`hurray_interop.kernels.scale_class`), refuse forbidden ones,
substitute the scales of all-zero blocks (returning what a record needs), repack the
codes into a buffer the thread reuses, and ``pwrite`` every part at its final offset in
the temporary output (:class:`Output`: the ranges :meth:`HrryWriter.reserve` handed out,
written back as they land).  Without an output (a dry run, or after a refusal) the
same workers only check, so a refusal still names every refused tensor.  An export
uses the same pieces: the workers join GGML blocks into reused buffers and ``pwrite``
them where ``GGUFWriterStream.skip_tensor_data`` left room; plain tensors of either
direction are copied by the kernel (:func:`copy_bytes`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

import numpy as np

from .. import kernels as K
from ..parallel import pmap
from .gguf_codec import BlockCodec

if TYPE_CHECKING:
    from ..core.hrry import HrryWriter
    from ..files.positional import PositionalWriter

__all__ = ["Refuse", "Output", "buffer", "checked", "zero_blocks", "refuse_bad", "run", "copy_bytes"]

T = TypeVar("T")

#: bytes per worker item of a plain tensor's copy
COPY_BYTES = 32 << 20


class Refuse(Exception):
    """A tensor cannot be stored as planned (``reason`` says why)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


@dataclass
class Output:
    """Where an import puts its bytes: the .hrry writer, the positional writer, and the
    source file's descriptor for kernel copies (None: copy through ``pwrite``).  An export
    writes through :class:`.gguf_sources.Target`."""

    w: "HrryWriter"
    pw: "PositionalWriter"
    fd: int | None = None
    #: a .hrry source: the file offsets of a tensor's buffers
    source_offsets: Callable[[str], list[int]] | None = None


class Copies(Protocol):
    """What :func:`copy_bytes` writes through: an :class:`Output` or an export's target."""

    pw: "PositionalWriter"
    fd: int | None


#: a per-thread buffer for a key, grown when needed, reused from chunk to chunk
buffer = K.thread_buffer


def refuse_bad(values: np.ndarray, start: int, c: BlockCodec, what: str) -> None:
    """Refuse the first block whose scale-typed field ``what`` holds a forbidden value."""
    assert c.scale is not None
    bad = c.scale.bad(values)
    if bad.any():
        b = int(np.argmax(bad))
        raise Refuse(f"block {b + start}: " + c.scale.bad_text.format(what=what, value=values[b]))


def checked(chunk: np.ndarray, start: int, c: BlockCodec, field: str, what: str,
            values: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The scale-typed ``field`` of every block of ``chunk`` (blocks ``start``…), checked:
    refuses forbidden values (``what`` names the field).  Returns the values (in a
    reused buffer; only when ``values`` or when some are not plain) and the mask of the
    zero-like ones (None when there are none)."""
    assert c.scale is not None
    cls = K.scale_class(chunk, c.fields[field], c.scale.kernel)
    odd = bool(cls.any())
    if not (values or odd):
        return None, None
    v = c.field_into(chunk, field, buffer("field:" + field, (chunk.shape[0],), c.scale.view))
    if not odd:
        return v, None
    refuse_bad(v, start, c, what)
    return v, cls == K.SCALE_ZERO


def zero_blocks(chunk: np.ndarray, start: int, zero: np.ndarray, c: BlockCodec) -> np.ndarray:
    """Indices (in the chunk) of the blocks with a zero-like scale; refuses unless each
    of those blocks' codes decode to zero (docs/conversion-rules.md § 4)."""
    assert c.scale is not None
    where = np.flatnonzero(zero)
    ok = K.all_zero(c.codes(chunk[where]), c.zero_mask)
    if not ok.all():
        b = int(where[np.argmin(ok)]) + start
        what = c.scale.zero_text.format(what=f"scale {c.scale.field}")
        raise Refuse(f"block {b}: {what} on a block with non-zero codes is not representable")
    return where


def run(work: Callable[[slice], T], n: int, step: int) -> list[T]:
    """``work`` over the chunks of ``n`` items on the worker threads; results in order.
    Every worker has stopped when this returns or raises (no write lands later)."""
    return list(pmap(work, n, step))


def copy_bytes(out: Copies, data: np.ndarray, offset: int, source_offset: int | None) -> None:
    """A plain tensor's bytes to ``offset`` of the output, by the kernel where it can
    (``copy_file_range`` from ``source_offset`` of the source file), else ``pwrite``
    from the memory map ``data``."""

    def work(sl: slice) -> None:
        if out.fd is not None and source_offset is not None:
            out.pw.copy(out.fd, source_offset + sl.start, sl.stop - sl.start, offset + sl.start)
        else:
            out.pw.pwrite(data[sl], offset + sl.start)

    run(work, data.size, COPY_BYTES)


def open_source(path: str | None) -> int | None:
    """A read-only descriptor of the source file for kernel copies (None if it cannot be opened)."""
    if path is None:
        return None
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
