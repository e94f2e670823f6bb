"""The block sources of an export (Hurray → GGUF): what each tensor's GGML bytes are made of.

The export's planner (:func:`hurray_interop.conversions.gguf._export_match`) gives every
tensor it can write one :class:`BlockSource`: the tensor's GGML bytes, computed only
when they are written.  Each source writes itself at its tensor's offset of a
:class:`Target` (the output GGUF file, one of a split set or the only one):

* :class:`ChunkedBlocks` -- blocks made by a pure chunk function (blocks ``sl`` of the
  Hurray buffers in, GGML blocks out, in a buffer each thread reuses; any consistency
  check inside it, so the data is read once), which the one executor
  (:func:`.gguf_pass.write_blocks`) runs on the worker threads and writes at their final
  offsets (the joined blocks of :mod:`.gguf`, the rebuilt ones of :mod:`.gguf_exact`);
* :class:`PlainBytes` -- a plain tensor's bytes, copied by the kernel where it can;
* :class:`StreamedBytes` -- bytes of a sequential stream (the dequantized values of
  ``--fallback``), produced one chunk ahead and written in order.

A dry run never asks a source for its bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from . import gguf_pass as P

if TYPE_CHECKING:
    from ..files.positional import PositionalWriter

__all__ = ["Target", "BlockSource", "ChunkedBlocks", "PlainBytes", "StreamedBytes"]


@dataclass
class Target:
    """Where an export writes one GGUF file: its positional writer, and for kernel copies
    the source .hrry's descriptor (None: copy through ``pwrite``) and its buffers' offsets."""

    pw: "PositionalWriter"
    fd: int | None = None
    #: the file offsets of a tensor's buffers in the source .hrry
    source_offsets: Callable[[str], list[int]] | None = None


class BlockSource(ABC):
    """A tensor's GGML bytes, written at their final offset of the output."""

    @abstractmethod
    def write(self, out: Target, offset: int) -> None:
        """Write every byte of the tensor at ``offset`` of ``out`` (all written when this returns)."""


class ChunkedBlocks(BlockSource):
    """``n`` GGML blocks of ``block_bytes`` each, made ``step`` blocks at a time by the pure
    chunk function that :meth:`chunk_function` gives."""

    def __init__(self, n: int, block_bytes: int, step: int) -> None:
        self.n, self.block_bytes, self.step = n, block_bytes, step

    @abstractmethod
    def chunk_function(self) -> Callable[[slice], np.ndarray]:
        """The chunk function of one write (made once: it holds what every chunk shares, such
        as the restored scales): blocks ``sl`` → ``(sl.stop - sl.start, block_bytes)`` uint8,
        in a buffer the calling thread reuses (:func:`~.gguf_pass.buffer`) where it can; it
        raises on any inconsistency it finds (the output is atomic: nothing is kept)."""

    def write(self, out: Target, offset: int) -> None:
        P.write_blocks(out.pw, self.chunk_function(), self.n, self.step, self.block_bytes, offset)


class PlainBytes(BlockSource):
    """The bytes of buffer 0 of the source tensor ``name``, as they are (a plain GGML type)."""

    def __init__(self, name: str, data: np.ndarray) -> None:
        self.name, self.data = name, data

    def write(self, out: Target, offset: int) -> None:
        at = out.source_offsets(self.name)[0] if out.source_offsets is not None else None
        P.copy_bytes(out, self.data, offset, at)


class StreamedBytes(BlockSource):
    """Bytes of a sequential stream of byte chunks (made one chunk ahead in a worker), in order."""

    def __init__(self, chunks: Callable[[], Iterable[np.ndarray]]) -> None:
        self.chunks = chunks

    def write(self, out: Target, offset: int) -> None:
        P.write_stream(out.pw, self.chunks(), offset)
