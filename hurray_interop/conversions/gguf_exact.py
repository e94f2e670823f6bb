"""``--fallback exact``: GGUF tensors without a native mapping, stored in their exact expanded
form and restored byte for byte (docs/conversion-rules.md § 9).

:mod:`.gguf_expanded` computes the forms; this module lays them out as Hurray tensors and
records, for the generic converter :mod:`.gguf` (which calls :func:`plan` on import and
:func:`export` on export, per tensor, and never names a GGML type):

* ``<name>``: per-block affine along the last axis, codes of the form's storage, block size
  K (the GGML sub-block), the form's scale type (float32 ``d·sc`` or float16 ``d``), an
  int32 zero point per block where the form has one (TQ1_0, TQ2_0).
* Where the form is an overlay (Q2_K, Q4_K, Q5_K) or the tensor has *zero patches*
  (sub-blocks whose ±0 values are mixed, docs/conversion-rules.md § 9), ``<name>`` is a
  float32 overlay-add composite instead: ``<name>.base`` (the above, a shard spanning the
  tensor, role base), ``<name>.min`` (overlay types: uint2 codes 1 or 0, K, float32 scale
  ``−dmin·m``, role correction), then one ``<name>.zero.<i>`` per zero patch: a float32
  shard of shape ``(1, …, 1, K)`` over its sub-block holding the ±0 pattern (role correction).
* The restore record, KV ``hurray_interop.gguf.expanded.<name>`` (bytes): the
  :class:`~.gguf_expanded.Record` of the whole tensor -- every block's header bytes, then the
  exception blocks with their absolute block indices (``Record.to_bytes``). The records
  take ~10 % of a K-quant model, so they are never held whole: the import spools them,
  chunk by chunk, to a scratch file of the writer and streams them into the KV section
  (:class:`~hurray_interop.core.kv.StreamedBytes`); the export reads them from the mapped
  file in windows (:meth:`~hurray_interop.core.kv.KVValue.view`).

Both directions run on the one pass of :mod:`.gguf_pass`: the import expands each chunk of
blocks once on the worker threads, which ``pwrite`` its codes, scales (zero points) and
correction at their final offsets in the ranges :meth:`HrryWriter.reserve` left; the main
thread spools the chunks' records in block order and collects the zero patches.  The zero
patches (rare) change the layout, so a tensor found to have some is taken back
(:meth:`HrryWriter.rewind`) and written again with them; a dry run only scans.

The export rebuilds the GGML blocks chunk by chunk with :func:`~.gguf_expanded.rebuild` (a
:class:`~.gguf_sources.ChunkedBlocks`: the workers ``pwrite`` them where
``GGUFWriterStream.skip_tensor_data`` left room), which proves the stored codes, scales,
corrections and patches are those of the rebuilt blocks; any mismatch is a
:class:`~hurray_interop.errors.FormatError` naming the tensor, the block and the field
(nothing is written: the output is atomic).
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterable

import numpy as np

from ..core.elements import buffer_size, element_type, sign_extend, unpack
from ..core.kv import KVValue, StreamedBytes
from ..core import model as M
from ..core.model import Descriptor, Tensor
from ..errors import FormatError
from ..parallel import pmap
from ..tables import load_table
from . import gguf_expanded as X
from .gguf_sources import ChunkedBlocks

if TYPE_CHECKING:
    from ..core.hrry import HrryWriter
    from ..files.positional import PositionalWriter

__all__ = ["RECORD_PREFIX", "record_key", "record_bytes", "has_form", "ExactPlan", "plan", "export"]

RECORD_PREFIX = "hurray_interop.gguf.expanded."
#: GGML blocks per chunk (2 Mi elements of 256-element blocks: bounded temporaries)
CHUNK_BLOCKS = 1 << 13
_ZP = np.dtype("<i4")
_CORRECTION = "uint2"
_ONES = 0x55  # four uint2 codes 1


def record_key(tensor: str) -> str:
    return RECORD_PREFIX + tensor


def record_bytes(ggml_type: str, nbytes: int) -> int:
    """The header part of the restore record of a ``ggml_type`` tensor of ``nbytes`` GGML bytes:
    what the report counts with the tensor's expanded form, on import and on export alike."""
    return nbytes // X._specs()[ggml_type].block_bytes * X.form(ggml_type).record_bytes


def has_form(ggml_type: str) -> bool:
    """Does ``ggml_type`` have an exact expanded form (a row of ``gguf_expanded.toml``)?"""
    return ggml_type in X.EXPANDED_TYPES


@functools.cache
def _names() -> dict[str, str]:
    overlay = load_table("gguf_hurray")["overlay"]
    return {"base": overlay["base_suffix"], "min": overlay["correction_suffix"],
            "zero": load_table("gguf_expanded")["names"]["zero_patch_suffix"]}


# ---------------------------------------------------------------------------
# descriptors


def _affine(shape: tuple[int, ...], f: X.Form, storage: str, scale: str, zp: bool, role: int | None) -> Descriptor:
    n = int(np.prod(shape, dtype=np.int64))
    nsub = n // f.sub_block
    bufs = [M.BufferHandle.cpu(buffer_size(storage, n)), M.BufferHandle.cpu(nsub * element_type(scale).bits // 8)]
    if zp:
        bufs.append(M.BufferHandle.cpu(nsub * _ZP.itemsize))
    return Descriptor(
        element_type=element_type(storage),
        shape=shape,
        buffers=tuple(bufs),
        layout=M.RowMajor(),
        quantization=M.PerBlockAffine(axis=len(shape) - 1, block_size=f.sub_block, scale_buffer_index=1,
                                    zero_point_buffer_index=2 if zp else None, scale_type=element_type(scale)),
        shard=M.Shard(parent_shape=shape, offset=(0,) * len(shape)) if role is not None else None,
        composite_member=M.CompositeMember(role) if role is not None else None,
    )


def _patch_offset(shape: tuple[int, ...], sub: int, k: int) -> tuple[int, ...]:
    return tuple(int(x) for x in np.unravel_index(sub * k, shape))


def _patch_desc(shape: tuple[int, ...], sub: int, k: int) -> Descriptor:
    box = (1,) * (len(shape) - 1) + (k,)
    return Descriptor(
        element_type=element_type("float32"), shape=box, buffers=(M.BufferHandle.cpu(4 * k),), layout=M.RowMajor(),
        shard=M.Shard(parent_shape=shape, offset=_patch_offset(shape, sub, k)),
        composite_member=M.CompositeMember(M.ROLE_CORRECTION),
    )


# ---------------------------------------------------------------------------
# import


@dataclass
class ExactPlan:
    """One tensor's expanded form: what the report says and how it is written."""

    type: str
    form: X.Form
    names: tuple[str, ...]
    bytes_out: int
    record_bytes: int  # the record's header part (exception blocks come on top)
    zero_patches: int

    def describe(self) -> str:
        n = self.zero_patches
        return self.form.describe() + (f", {n} zero patch{'es' if n > 1 else ''}" if n else "")


_Patches = tuple[np.ndarray, np.ndarray]  # zero patches: absolute sub-block indices, patterns
_Writer = tuple["HrryWriter", list[tuple[str, "KVValue | StreamedBytes"]]]


def _collect(ggml_type: str, chunks: Iterable[tuple[int, X.Expanded]],
             each: Callable[[X.Expanded], None] = lambda x: None) -> _Patches:
    """The zero patches of the ``(first block, expansion)`` chunks, in order (``each`` sees
    every chunk as it comes)."""
    f = X.form(ggml_type)
    per = X._specs()[ggml_type].elements // f.sub_block
    idx, pat = [], []
    for start, x in chunks:
        each(x)
        if x.zero_patch_index.size:
            idx.append(x.zero_patch_index + start * per)
            pat.append(x.zero_patch)
    if not idx:
        return np.zeros(0, np.int64), np.zeros((0, f.sub_block), np.float32)
    return np.concatenate(idx), np.concatenate(pat)


def _scan(ggml_type: str, blocks: np.ndarray) -> _Patches:
    """The tensor's zero patches; raises :class:`~.gguf_expanded.NonFiniteScale` for a
    non-finite ``d``/``dmin``."""
    work = lambda sl: (sl.start, X.expand_scales(ggml_type, blocks[sl], sl.start))  # noqa: E731
    return _collect(ggml_type, pmap(work, blocks.shape[0], CHUNK_BLOCKS))


def plan(name: str, ggml_type: str, shape: tuple[int, ...], blocks: np.ndarray,
         out: _Writer | None = None) -> ExactPlan:
    """Plan ``name`` (``blocks``: its ``(n, block_bytes)`` GGML blocks) in its expanded form;
    given ``out`` (the writer, the list its record goes to), write it in the same pass."""
    f = X.form(ggml_type)
    patch_index, _ = _scan(ggml_type, blocks) if out is None else _write(name, ggml_type, shape, blocks, *out)
    composite, _, members = _layout(name, ggml_type, shape, patch_index)
    size = sum(h.byte_size for _, d in members for h in d.buffers)
    names = ((name,) if composite else ()) + tuple(mn for mn, _ in members)
    return ExactPlan(ggml_type, f, names, size, record_bytes(ggml_type, blocks.size), int(patch_index.size))


def _layout(name: str, ggml_type: str, shape: tuple[int, ...],
            patch_index: np.ndarray) -> tuple[bool, Descriptor, list[tuple[str, Descriptor]]]:
    """Is the form a composite, its head, and its members (or the one plain tensor)."""
    f = X.form(ggml_type)
    composite = f.overlay or patch_index.size > 0
    sfx = _names()
    base = _affine(shape, f, f.storage, f.scale, f.zero_point is not None, M.ROLE_BASE if composite else None)
    members: list[tuple[str, Descriptor]] = [(name + sfx["base"] if composite else name, base)]
    if f.overlay:
        members.append((name + sfx["min"], _affine(shape, f, _CORRECTION, "float32", False, M.ROLE_CORRECTION)))
    k = f.sub_block
    members += [(f"{name}{sfx['zero']}.{i}", _patch_desc(shape, int(p), k)) for i, p in enumerate(patch_index)]
    head = Descriptor(element_type=element_type("float32"), shape=shape, buffers=(),
                      layout=M.CompositeHead(composition_rule=M.RULE_OVERLAY, combine_op=M.OP_ADD, member_count=len(members)))
    return composite, head, members


def _write(name: str, ggml_type: str, shape: tuple[int, ...], blocks: np.ndarray, w: "HrryWriter",
           records: list[tuple[str, KVValue | StreamedBytes]]) -> _Patches:
    """Write the tensor in one pass, laid out as if it had no zero patches; the rare tensor
    that has some is taken back and written again with them.  Returns its zero patches."""
    rec = _RecordSink(ggml_type, w.scratch(RECORD_PREFIX + "records"), w.scratch(RECORD_PREFIX + "exceptions"))
    mark = w.mark()
    found = _write_pass(name, ggml_type, shape, blocks, w, rec, _collect(ggml_type, ()))
    if found[0].size:
        w.rewind(mark)
        rec.reset()
        _write_pass(name, ggml_type, shape, blocks, w, rec, found)
    records.append((record_key(name), rec.value()))
    return found


def _write_pass(name: str, ggml_type: str, shape: tuple[int, ...], blocks: np.ndarray, w: "HrryWriter",
                rec: "_RecordSink", patches: _Patches) -> _Patches:
    """One pass: the layout for ``patches`` (holes for the base and correction, which the
    workers fill chunk by chunk at their final offsets; the patches written), the record
    spooled in block order.  Returns the zero patches the blocks have."""
    composite, head, members = _layout(name, ggml_type, shape, patches[0])
    f = X.form(ggml_type)
    if composite:
        w.write(name, head, ())
    offs = [w.reserve(mn, md) for mn, md in members[: 1 + f.overlay]]
    for (mn, md), p in zip(members[1 + f.overlay :], patches[1]):
        w.write(mn, md, [[p.astype("<f4").reshape(-1)]])
    pw = w.positional()

    def spool(x: X.Expanded) -> None:
        assert x.record is not None
        rec.add(x.record)  # in block order, while the workers go on

    work = lambda sl: (sl.start, _put_chunk(ggml_type, blocks, sl, offs, pw))  # noqa: E731
    return _collect(ggml_type, pmap(work, blocks.shape[0], CHUNK_BLOCKS), spool)


class _RecordSink:
    """The tensor's record (``Record.to_bytes``), spooled chunk by chunk while its codes are
    written: the headers to the end of ``spool``, the exception entries to ``exceptions``
    (emptied first), copied after the headers by :meth:`value`."""

    def __init__(self, ggml_type: str, spool: BinaryIO, exceptions: BinaryIO) -> None:
        self.type, self.spool, self.exceptions = ggml_type, spool, exceptions
        self.start = spool.seek(0, 2)
        self.reset()

    def reset(self) -> None:
        """Forget what was spooled (the tensor is written again)."""
        self.spool.seek(self.start)
        self.spool.truncate()
        self.exceptions.seek(0)
        self.exceptions.truncate()

    def add(self, r: X.Record) -> None:
        self.spool.write(np.ascontiguousarray(r.header).data)
        if r.exception_index.size:
            self.exceptions.write(dataclasses.replace(r, header=r.header[:0]).to_bytes())

    def value(self) -> StreamedBytes:
        """The whole record, streamed from the spool when the KV section is written."""
        self.exceptions.seek(0)
        self.spool.seek(0, 2)
        shutil.copyfileobj(self.exceptions, self.spool, 1 << 20)
        return StreamedBytes(self.spool, self.start, self.spool.tell() - self.start)


def _put_chunk(ggml_type: str, blocks: np.ndarray, sl: slice, offs: list[list[int]],
               pw: "PositionalWriter") -> X.Expanded:
    """Expand the blocks ``sl`` once and write their codes, scales (zero points) and
    correction at their final offsets (``offs``: the reserved buffers of base and
    correction); returns the chunk's expansion (record, zero patches)."""
    f = X.form(ggml_type)
    elements = X._specs()[ggml_type].elements
    s0 = sl.start * (elements // f.sub_block)
    x, packed = X.expand_packed(ggml_type, blocks[sl], sl.start)
    scales = np.ascontiguousarray(x.scales).reshape(-1)
    pw.pwrite(packed, offs[0][0] + buffer_size(f.storage, sl.start * elements))
    pw.pwrite(scales, offs[0][1] + s0 * scales.itemsize)
    if f.zero_point is not None:
        pw.pwrite(np.full(scales.size, f.zero_point, dtype=_ZP), offs[0][2] + s0 * _ZP.itemsize)
    if f.overlay:
        assert x.correction_codes is not None and x.correction is not None
        width = buffer_size(_CORRECTION, f.sub_block)
        pw.pwrite(_correction_bytes(x.correction_codes.reshape(-1), width), offs[1][0] + s0 * width)
        pw.pwrite(np.ascontiguousarray(x.correction, dtype="<f4").reshape(-1), offs[1][1] + s0 * 4)
    return x


def _correction_bytes(codes: np.ndarray, width: int) -> np.ndarray:
    """The uint2 correction member's bytes: ``width`` bytes per sub-block, every code 1
    (0x55 bytes) or 0 (``codes``: 1 or 0 per sub-block) -- one multiplication per sub-block
    where ``width`` is an integer size."""
    if width in (1, 2, 4, 8):
        ones = int.from_bytes(bytes([_ONES]) * width, "little")
        return (codes.astype(f"<u{width}") * np.asarray(ones, dtype=f"<u{width}")).view(np.uint8)
    return np.repeat((codes * _ONES).astype(np.uint8), width)


# ---------------------------------------------------------------------------
# export


def _bad(message: str, tensor: str, field: str) -> FormatError:
    return FormatError(f"--fallback exact form: {message}", tensor=tensor, field=field)


def _parts(t: Tensor, f: X.Form) -> tuple[Tensor, Tensor | None, list[Tensor]]:
    """``(base, correction, zero patches)`` of an expanded tensor; FormatError if it is not one."""
    d = t.descriptor
    if not d.is_composite:
        if f.overlay:
            raise _bad(f"{f.type} is stored as an overlay, found a plain tensor", t.name, "layout")
        return t, None, []
    lay = d.layout
    assert isinstance(lay, M.CompositeHead)
    if lay.composition_rule != M.RULE_OVERLAY or lay.combine_op != M.OP_ADD or d.element_type.name != "float32":
        raise _bad("the head is not a float32 overlay (add)", t.name, "layout")
    members = list(t.members)
    base = members.pop(0)
    corr = members.pop(0) if f.overlay and members else None
    if f.overlay and corr is None:
        raise _bad("the overlay has no correction member", t.name, "member_count")
    return base, corr, members


def _check_desc(m: Tensor, shape: tuple[int, ...], f: X.Form, storage: str, scale: str, zp: bool) -> None:
    want = _affine(shape, f, storage, scale, zp, None)
    d = m.descriptor
    if (d.element_type.name, tuple(d.shape), d.quantization, type(d.layout), d.byte_offset) != (
            storage, tuple(shape), want.quantization, M.RowMajor, 0) or (d.shard is not None and any(d.shard.offset)):
        raise _bad(f"member is not {storage} per-block affine K={f.sub_block} {scale} along the last axis "
                   f"over the whole tensor", m.name, "descriptor")


def _patches(ps: list[Tensor], shape: tuple[int, ...], k: int) -> tuple[np.ndarray, np.ndarray]:
    idx = np.zeros(len(ps), np.int64)
    pat = np.zeros((len(ps), k), np.float32)
    for i, p in enumerate(ps):
        d = p.descriptor
        box = (1,) * (len(shape) - 1) + (k,)
        off = d.shard.offset if d.shard is not None else None
        flat = int(np.ravel_multi_index(off, shape)) if off is not None and tuple(d.shape) == box else -1
        if d.element_type.name != "float32" or d.quantization is not None or flat < 0 or flat % k:
            raise _bad(f"zero patch is not a float32 (1, …, {k}) box on a sub-block", p.name, "descriptor")
        idx[i] = flat // k
        pat[i] = p.data[0].view("<f4")[:k]
    order = np.argsort(idx, kind="stable")
    return idx[order], pat[order]


def export(t: Tensor, kv: dict[str, Any], ggml_type: str) -> "_Rebuilt":
    """The GGML blocks of the expanded tensor ``t`` (recorded as ``ggml_type``), chunk by chunk.

    The structure and the record's length are checked here (FormatError); each chunk's
    consistency is checked by :func:`~.gguf_expanded.rebuild` as it is written."""
    f = X.form(ggml_type)
    spec = X._specs()[ggml_type]
    shape = tuple(int(x) for x in t.descriptor.shape)  # type: ignore[arg-type]
    n = int(np.prod(shape, dtype=np.int64))
    if not shape or shape[-1] % spec.elements:
        raise _bad(f"shape {list(shape)} is not whole {ggml_type} blocks along the last axis", t.name, "shape")
    nb, per = n // spec.elements, spec.elements // f.sub_block
    base, corr, patch_members = _parts(t, f)
    _check_desc(base, shape, f, f.storage, f.scale, f.zero_point is not None)
    if corr is not None:
        _check_desc(corr, shape, f, _CORRECTION, "float32", False)
    patch_index, patch = _patches(patch_members, shape, f.sub_block)
    raw = kv[record_key(t.name)]
    if raw.type != "bytes":
        raise _bad("the record is not bytes", t.name, record_key(t.name))
    try:
        record = X.Record.from_bytes(ggml_type, raw.view(), nb)  # mapped, read in windows
    except FormatError as e:
        raise _bad(f"record: {e.message}", t.name, record_key(t.name)) from None
    data = _Stored(f, spec.elements, per, base, corr, patch_index, patch, record)
    if f.zero_point is not None:
        zp = base.data[2].view(_ZP)
        if np.any(zp != f.zero_point):
            b = int(np.argmax(zp != f.zero_point)) // per
            raise _bad(f"block {b}: zero point is not {f.zero_point}", t.name, "zero_point")
    return _Rebuilt(t.name, data, nb, spec.block_bytes)


class _Rebuilt(ChunkedBlocks):
    """The rebuilt GGML blocks of an expanded tensor, chunk by chunk (the chunk function
    checks each chunk against the stored parts as it rebuilds it)."""

    def __init__(self, name: str, data: "_Stored", nb: int, block_bytes: int) -> None:
        super().__init__(nb, block_bytes, CHUNK_BLOCKS)
        self.name, self.data = name, data

    def chunk(self, sl: slice) -> np.ndarray:
        try:
            x, packed = self.data.expanded(sl)
            return X.rebuild(x, sl.start, packed)
        except FormatError as e:
            message = f"--fallback exact record mismatch: {e.message}"
            raise FormatError(message, tensor=self.name, field=e.field) from None

    def chunk_function(self) -> Callable[[slice], np.ndarray]:
        return self.chunk


def _sub_block_codes(raw: np.ndarray, width: int) -> np.ndarray:
    """Per sub-block of ``width`` bytes of uint2 correction codes: 1 (all ones), 0 (all
    zeros) or 2 (mixed: not a correction this form writes). Whole sub-blocks compared as
    one unsigned integer where ``width`` is one."""
    if width in (1, 2, 4, 8):
        w = np.ascontiguousarray(raw).view(f"<u{width}").reshape(-1)
        is_ones, is_zero = w == int.from_bytes(bytes([_ONES]) * width, "little"), w == 0
    else:
        cc = raw.reshape(-1, width)
        is_ones, is_zero = (cc == _ONES).all(axis=1), (cc == 0).all(axis=1)
    return np.where(is_ones, 1, np.where(is_zero, 0, 2)).astype(np.uint8)


@dataclass
class _Stored:
    """An expanded tensor as stored, sliced into :class:`~.gguf_expanded.Expanded` chunks."""

    form: X.Form
    elements: int
    per: int
    base: Tensor
    corr: Tensor | None
    patch_index: np.ndarray
    patch: np.ndarray
    record: X.Record

    def expanded(self, sl: slice) -> tuple[X.Expanded, np.ndarray | None]:
        """The chunk ``sl`` of blocks, and its codes as stored where :func:`~.gguf_expanded.rebuild`
        takes them so (then the expansion's ``codes`` is None)."""
        f, nb = self.form, sl.stop - sl.start
        et = element_type(f.storage)
        per_block = buffer_size(et, self.elements)
        raw = self.base.data[0][sl.start * per_block : sl.stop * per_block]
        packed = codes = None
        flat = raw.reshape(-1).view(np.uint8) if isinstance(raw, np.ndarray) else np.frombuffer(raw, dtype=np.uint8)
        if X.rebuilds_packed(f.type) and flat.size == nb * per_block:
            packed = flat.reshape(nb, per_block)
        else:
            codes = unpack(raw, et, nb * self.elements)
            if et.packed and et.kind == "int":
                codes = sign_extend(codes, et.bits)
            codes = np.ascontiguousarray(codes).view(f.code_dtype).reshape(nb, self.elements)
        s0, s1 = sl.start * self.per, sl.stop * self.per
        scales = self.base.data[1].view(f.scale_dtype.newbyteorder("<"))[s0:s1]
        corr = ccodes = None
        if self.corr is not None:
            width = buffer_size(_CORRECTION, f.sub_block)
            ccodes = _sub_block_codes(self.corr.data[0][s0 * width : s1 * width], width)
            corr = self.corr.data[1].view("<f4")[s0:s1].reshape(nb, self.per).astype(np.float32, copy=False)
            ccodes = ccodes.reshape(nb, self.per)
        lo, hi = np.searchsorted(self.patch_index, [s0, s1])
        r = self.record
        e0, e1 = np.searchsorted(r.exception_index, [sl.start, sl.stop])
        rec = X.Record(r.type, r.header[sl], r.exception_index[e0:e1], r.exception_blocks[e0:e1])
        scales = scales.reshape(nb, self.per).astype(f.scale_dtype, copy=False)  # (views: read only)
        x = X.Expanded(f.type, codes, scales, corr, ccodes,  # type: ignore[arg-type]
                       self.patch_index[lo:hi] - s0, self.patch[lo:hi], rec)
        return x, packed
