"""The one pass of GGUF ⇄ Hurray: per chunk, check, convert and write in place.

An import reads each tensor once (docs/benchmarks.md, "One pass").  The planners of
:mod:`.gguf` and :mod:`.gguf_exact` write nothing: each returns a :class:`Plan` -- the
Hurray tensors it makes (:class:`Entry`, in file order), the named buffers a chunk
fills (:class:`Slot`), two pure chunk functions (block rows in; the written one also
gives the named buffers, the scanned one only what the report needs) and a record
collector.  The executor here runs them: :meth:`Output.run` reserves the ranges
(:meth:`HrryWriter.reserve`), runs the chunk function on the worker threads
(:func:`hurray_interop.parallel.pmap`, one ordered map), which classify their scales
(:func:`hurray_interop.kernels.scale_class`), refuse forbidden ones, substitute the
scales of all-zero blocks and repack the codes into buffers each thread reuses, and
``pwrite`` every named buffer at its final offset in the temporary output (written back
as it lands); the main thread spools the streamed record parts in block order.  A dry
run (:class:`DryRun`, also what an import turns into after a refusal) runs the scan
functions and drops the output, so a refusal still names every refused tensor.

The executor takes back what it wrote of a tensor in two cases only, both inherent to
reading the data once: a refusal found after the first chunks landed (a fallback then
writes its own form in its place), and a tensor whose zero patches change its layout
(:attr:`Plan.relayout`: it is written again, laid out with them).

An export uses the same executor: its block sources (:mod:`.gguf_sources`) hand their
pure chunk functions to :func:`write_blocks` (the workers join GGML blocks into reused
buffers and ``pwrite`` them where ``GGUFWriterStream.skip_tensor_data`` left room), a
``--fallback`` stream to :func:`write_stream`; plain tensors of either direction are
copied by the kernel (:func:`copy_bytes`).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence, TypeVar

import numpy as np

from .. import kernels as K
from ..parallel import pmap, prefetch_chunks
from .gguf_codec import BlockCodec

if TYPE_CHECKING:
    from ..core.hrry import HrryWriter
    from ..core.kv import KVValue, StreamedBytes
    from ..core.model import Descriptor
    from ..files.positional import PositionalWriter

__all__ = ["Refuse", "Entry", "Slot", "Piece", "Plan", "Done", "Output", "DryRun", "buffer", "checked",
           "zero_blocks", "refuse_bad", "run", "write_blocks", "write_stream", "copy_bytes", "open_source",
           "Copies", "COPY_BYTES"]

T = TypeVar("T")

#: bytes per worker item of a plain tensor's copy
COPY_BYTES = 32 << 20

#: the writer's scratch files of streamed records (:class:`_Spool`), one per part
SPOOL_SCRATCH = "hurray_interop.spool."
#: a tensor's KV records: (key, value)
Records = list[tuple[str, "KVValue | StreamedBytes"]]


class Refuse(Exception):
    """A tensor cannot be stored as planned (``reason`` says why)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


@dataclass(frozen=True)
class Entry:
    """One Hurray tensor a plan makes: its buffers left to the chunk function's named
    buffers (``data`` None), or given whole (a composite head: ``()``; a zero patch).
    ``given``: of an entry whose buffers are left to the chunk function, the buffers given
    whole instead (index → bytes; a broadcast member's one code byte), written once."""

    name: str
    desc: "Descriptor"
    data: Sequence[Any] | None = None
    given: Mapping[int, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Slot:
    """Where a named buffer of the chunk function goes: buffer ``buffer`` of entry
    ``entry``, ``row_bytes`` bytes per source row (a chunk starting at row ``r`` lands
    ``r · row_bytes`` into it)."""

    entry: int
    buffer: int
    row_bytes: int


@dataclass
class Piece:
    """What a chunk function gives for one chunk: ``keep`` (small, for the record
    collector and the report; never a per-thread buffer), the named ``buffers`` (the
    written chunk function only; they may be per-thread buffers, written before the
    thread takes its next chunk) and ``spool``: the chunk's parts of the plan's streamed
    record (:attr:`Plan.spool`), one bytes-like per part."""

    keep: Any = None
    buffers: Mapping[str, np.ndarray] = field(default_factory=dict)
    spool: tuple[Any, ...] = ()


Chunk = Callable[[np.ndarray, int], Piece]


def _nothing(keeps: list[Any], report: Any) -> Records:
    return []


@dataclass
class Plan:
    """One tensor's conversion, planned (nothing written): what it makes and how.

    ``chunk(rows, start)`` (pure: rows ``start``… of ``rows`` in, a :class:`Piece` out;
    checks and refusals -- :class:`Refuse` -- inside) runs when writing, ``scan`` (the
    same checks and ``keep``, no buffers; None: nothing to check) on a dry run.
    ``finish(keeps, report)`` is the record collector: the chunks' keeps, in order, to
    the tensor's KV records and the report's figures.  ``copy``: a plain tensor, its
    bytes (and their offset in the source file) copied whole into entry 0.  ``spool``:
    the key and part count of a record streamed chunk by chunk into scratch files (the
    parts joined in order).  ``relayout(keeps)``: the plan to write instead, when the
    data asks for another layout (None: this one stands)."""

    entries: tuple[Entry, ...]
    rows: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), np.uint8))
    step: int = 1
    slots: Mapping[str, Slot] = field(default_factory=dict)
    chunk: Chunk | None = None
    scan: Chunk | None = None
    finish: Callable[[list[Any], Any], Records] = _nothing
    copy: tuple[np.ndarray, int | None] | None = None
    spool: tuple[str, int] | None = None
    relayout: Callable[[list[Any]], "Plan | None"] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries)

    @property
    def bytes_out(self) -> int:
        return sum(h.byte_size for e in self.entries for h in e.desc.buffers)


@dataclass
class Done:
    """A plan carried out (or scanned): the plan that stands, the chunks' keeps in order
    and the streamed record, if any."""

    plan: Plan
    keeps: list[Any]
    streamed: Records


class DryRun:
    """The executor without an output: every plan is only scanned."""

    def execute(self, plan: Plan) -> Done:
        keeps = _scan(plan)
        again = plan.relayout(keeps) if plan.relayout is not None else None
        return Done(plan if again is None else again, keeps, [])

    def dropped(self) -> "DryRun":
        return self


def _scan(plan: Plan) -> list[Any]:
    scan = plan.scan
    if scan is None:
        return []
    return run(lambda sl: scan(plan.rows[sl], sl.start).keep, plan.rows.shape[0], plan.step)


@dataclass
class Output:
    """Where an import puts its bytes: the .hrry writer, the positional writer, and the
    source file's descriptor for kernel copies (None: copy through ``pwrite``).  An export
    writes through :class:`.gguf_sources.Target`."""

    w: "HrryWriter"
    pw: "PositionalWriter"
    fd: int | None = None

    def execute(self, plan: Plan) -> Done:
        """Write ``plan`` (the .hrry import): reserved ranges filled by the workers.  A
        refusal takes back what was written of the tensor (the data is read once, so it
        can come after the first chunks landed); a plan the data relays out is taken
        back and written again in its new layout."""
        mark = self.w.mark()
        spool = _Spool(self.w, plan.spool) if plan.spool is not None else None
        try:
            done = self._write(plan, spool)
            again = plan.relayout(done.keeps) if plan.relayout is not None else None
            if again is not None:
                self.w.rewind(mark)
                if spool is not None:
                    spool.reset()
                done = self._write(again, spool)
        except Refuse:
            self.w.rewind(mark)
            if spool is not None:
                spool.reset()
            raise
        return done

    def dropped(self) -> DryRun:
        """The output deleted: the rest of the pass only scans."""
        self.w.abort()
        return DryRun()

    def _write(self, plan: Plan, spool: "_Spool | None") -> Done:
        offs: list[list[int]] = []
        for e in plan.entries:
            if e.data is None:
                offs.append(self.w.reserve(e.name, e.desc))
                for i, data in e.given.items():
                    self.pw.pwrite(data, offs[-1][i])
            else:
                self.w.write(e.name, e.desc, e.data)
                offs.append([])
        if plan.copy is not None:
            copy_bytes(self, plan.copy[0], offs[0][0], plan.copy[1])
        if plan.chunk is None:
            return Done(plan, [], [])
        at = {k: offs[s.entry][s.buffer] for k, s in plan.slots.items()}
        keeps = []
        with contextlib.closing(pmap(lambda sl: self._chunk(plan, at, sl), plan.rows.shape[0], plan.step)) as it:
            for keep, parts in it:  # in block order, while the workers go on
                keeps.append(keep)
                if spool is not None:
                    spool.add(parts)
        return Done(plan, keeps, spool.records() if spool is not None else [])

    def _chunk(self, plan: Plan, at: Mapping[str, int], sl: slice) -> tuple[Any, tuple[Any, ...]]:
        assert plan.chunk is not None
        piece = plan.chunk(plan.rows[sl], sl.start)
        if piece.buffers.keys() != plan.slots.keys():
            raise AssertionError(f"chunk gave buffers {sorted(piece.buffers)}, the plan has {sorted(plan.slots)}")
        for k, data in piece.buffers.items():
            row = plan.slots[k].row_bytes
            if memoryview(data).nbytes != (sl.stop - sl.start) * row:  # a planner's bug, never the data's
                raise AssertionError(f"buffer {k!r}: {memoryview(data).nbytes} bytes for {sl.stop - sl.start} rows of {row}")
            self.pw.pwrite(data, at[k] + sl.start * row)
        return piece.keep, piece.spool


class _Spool:
    """A record streamed chunk by chunk while the tensor is written: part 0 to the end of
    a scratch file shared by the tensors, the other parts to scratch files of their own
    (emptied first), copied after part 0 by :meth:`records`; the KV section streams it
    from there (:class:`~hurray_interop.core.kv.StreamedBytes`), so it is never held whole."""

    def __init__(self, w: "HrryWriter", spec: tuple[str, int]) -> None:
        self.key, n = spec
        self.files = [w.scratch(f"{SPOOL_SCRATCH}{i}") for i in range(n)]
        self.start = self.files[0].seek(0, 2)
        self.reset()

    def reset(self) -> None:
        """Forget what was spooled (the tensor is written again)."""
        self.files[0].seek(self.start)
        self.files[0].truncate()
        for f in self.files[1:]:
            f.seek(0)
            f.truncate()

    def add(self, parts: Sequence[Any]) -> None:
        for f, p in zip(self.files, parts):
            if memoryview(p).nbytes:
                f.write(p)

    def records(self) -> Records:
        import shutil  # only when writing: inspect and --dry-run start without it

        from ..core.kv import StreamedBytes

        head = self.files[0]
        for f in self.files[1:]:
            f.seek(0)
            head.seek(0, 2)
            shutil.copyfileobj(f, head, 1 << 20)
        head.seek(0, 2)
        return [(self.key, StreamedBytes(head, self.start, head.tell() - self.start))]


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


def write_blocks(pw: "PositionalWriter", chunk: Callable[[slice], np.ndarray], n: int, step: int,
                 block_bytes: int, offset: int) -> None:
    """An export's ``n`` GGML blocks of ``block_bytes`` each at ``offset``: the pure chunk
    function (blocks ``sl`` in, their bytes out) on the worker threads, each chunk
    ``pwrite`` at its final place as it is made."""

    def work(sl: slice) -> None:
        pw.pwrite(chunk(sl), offset + sl.start * block_bytes)

    run(work, n, step)


def write_stream(pw: "PositionalWriter", chunks: Iterable[np.ndarray], offset: int) -> None:
    """Byte chunks of a sequential stream at ``offset``, in order (the next one is made in a
    worker while this one is written)."""
    for c in prefetch_chunks(chunks):
        pw.pwrite(c, offset)
        offset += c.nbytes


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
