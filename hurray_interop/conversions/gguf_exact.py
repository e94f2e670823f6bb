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
* The restore record, KV ``hurray_interop.gguf.derived.<name>`` (bytes): the
  :class:`~.gguf_expanded.DerivedRecord` of the whole tensor -- the headers of the blocks
  whose header :func:`~.gguf_expanded.derive_header` does not factor back out of the stored
  scales (on ggml's output: almost none), then the exception blocks, each entry after its
  block index (``DerivedRecord.to_bytes``). Files of earlier versions hold the full
  :class:`~.gguf_expanded.Record` (every header) under ``hurray_interop.gguf.expanded.<name>``
  instead; the export reads either. Records are never held whole: the import's executor spools them,
  chunk by chunk, to a scratch file of the writer and streams them into the KV section
  (:class:`~hurray_interop.core.kv.StreamedBytes`); the export reads them from the mapped
  file in windows (:meth:`~hurray_interop.core.kv.KVValue.view`).

Both directions run on the one pass of :mod:`.gguf_pass`: the import's :func:`plan` (which
writes nothing) gives the executor a chunk function that expands each chunk of blocks once
on the worker threads -- its codes, scales (zero points) and correction as named buffers,
which the executor writes (``pwrite``) at their final offsets in the ranges
:meth:`HrryWriter.reserve` left, and the record's parts, which it spools in block order --
and a record collector.  The zero patches (rare) change the layout, so a tensor found to
have some is taken back (:meth:`HrryWriter.rewind`, the plan's ``relayout``) and written
again with them; a dry run only scans (:func:`~.gguf_expanded.expand_scales`).

The export rebuilds the GGML blocks chunk by chunk with :func:`~.gguf_expanded.rebuild` (a
:class:`~.gguf_sources.ChunkedBlocks`: the workers ``pwrite`` them where
``GGUFWriterStream.skip_tensor_data`` left room), which proves the stored codes, scales,
corrections and patches are those of the rebuilt blocks; any mismatch is a
:class:`~hurray_interop.errors.FormatError` naming the tensor, the block and the field
(nothing is written: the output is atomic).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np

from ..core.elements import buffer_size, element_type, sign_extend, unpack
from ..core import model as M
from ..core.model import Descriptor, Tensor
from ..errors import FormatError
from ..tables import load_table
from . import gguf_expanded as X
from .gguf_pass import Entry, Piece, Plan, Refuse, Slot
from .gguf_sources import ChunkedBlocks

__all__ = ["RECORD_PREFIX", "DERIVED_PREFIX", "record_key", "derived_key", "has_record", "stored_record_bytes",
           "record_bytes", "has_form", "plan", "export"]

#: the full record (every block's header; written by earlier versions, still read)
RECORD_PREFIX = "hurray_interop.gguf.expanded."
#: the derived record (:class:`~.gguf_expanded.DerivedRecord`), what the import writes
DERIVED_PREFIX = "hurray_interop.gguf.derived."
#: GGML blocks per chunk (2 Mi elements of 256-element blocks: bounded temporaries)
CHUNK_BLOCKS = 1 << 13
_ZP = np.dtype("<i4")
_CORRECTION = "uint2"
_ONES = 0x55  # four uint2 codes 1


def record_key(tensor: str) -> str:
    return RECORD_PREFIX + tensor


def derived_key(tensor: str) -> str:
    return DERIVED_PREFIX + tensor


def _record_of(kv: dict[str, Any], tensor: str) -> tuple[str, Any] | None:
    """``(key, value)`` of the tensor's restore record, derived or full; None: it has none."""
    for key in (derived_key(tensor), record_key(tensor)):
        if key in kv:
            return key, kv[key]
    return None


def has_record(kv: dict[str, Any], tensor: str) -> bool:
    """Does ``tensor`` have a restore record (derived, or full from an earlier version)?"""
    return _record_of(kv, tensor) is not None


def stored_record_bytes(kv: dict[str, Any], tensor: str) -> int:
    """The size of the tensor's restore record as stored (0 without one): what an export's
    report counts with the tensor, as the import counted it."""
    rec = _record_of(kv, tensor)
    return 0 if rec is None or rec[1].type != "bytes" else rec[1].view().nbytes


def record_bytes(ggml_type: str, nbytes: int) -> int:
    """The full record's header part of a ``ggml_type`` tensor of ``nbytes`` GGML bytes (every
    block's header): what the derived record saves, and its worst case but for the index words."""
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


_Patches = tuple[np.ndarray, np.ndarray]  # zero patches: absolute sub-block indices, patterns


class _Keep(NamedTuple):
    """A chunk's keep: its zero patches and the bytes of its part of the derived record."""

    patches: _Patches
    record: int


def _no_patches(ggml_type: str) -> _Patches:
    return np.zeros(0, np.int64), np.zeros((0, X.form(ggml_type).sub_block), np.float32)


def _gather(ggml_type: str, keeps: Iterable[_Keep]) -> _Patches:
    """The zero patches of the chunks (each already absolute), in order."""
    found = [k.patches for k in keeps if k.patches[0].size]
    if not found:
        return _no_patches(ggml_type)
    return np.concatenate([i for i, _ in found]), np.concatenate([p for _, p in found])


def _patches_of(ggml_type: str, x: X.Expanded, start: int) -> _Patches:
    """A chunk's zero patches (block ``start`` first), their sub-block indices absolute."""
    per = X._specs()[ggml_type].elements // X.form(ggml_type).sub_block
    return x.zero_patch_index + start * per, x.zero_patch


def _expanded(name: str, expand: Callable[..., Any], ggml_type: str, rows: np.ndarray, start: int) -> Any:
    """``expand(ggml_type, rows, start)``; a non-finite super-block scale is a refusal."""
    try:
        return expand(ggml_type, rows, start)
    except X.NonFiniteScale as e:
        raise Refuse(f"{e.message} (tensor {name!r})") from None


def _derived(ggml_type: str, x: X.Expanded, packed: np.ndarray, start: int) -> X.DerivedRecord:
    """The chunk's derived record (:class:`~.gguf_expanded.DerivedRecord`)."""
    per_block = buffer_size(X.form(ggml_type).storage, X._specs()[ggml_type].elements)
    zero = X.stand_ins(ggml_type, x.scales, packed=packed.reshape(-1, per_block))
    return X.DerivedRecord.of(x, zero, start)


def _scan_chunk(name: str, ggml_type: str, rows: np.ndarray, start: int) -> Piece:
    """A dry run's chunk: the zero patches and the size of the derived record, from the
    expansion the import makes (nothing kept but those)."""
    x, packed = _expanded(name, X.expand_packed, ggml_type, rows, start)
    rec = _derived(ggml_type, x, packed, start)
    return Piece(_Keep(_patches_of(ggml_type, x, start), sum(len(p) for p in rec.parts())))


def _chunk(name: str, ggml_type: str, rows: np.ndarray, start: int) -> Piece:
    """Expand the blocks once: their codes, scales (zero points) and correction as named
    buffers, the derived record's parts (headers the factorization misses, exception
    blocks) and the zero patches."""
    f = X.form(ggml_type)
    x, packed = _expanded(name, X.expand_packed, ggml_type, rows, start)
    scales = np.ascontiguousarray(x.scales).reshape(-1)
    bufs = {"codes": packed, "scales": scales}
    if f.zero_point is not None:
        bufs["zero_points"] = np.full(scales.size, f.zero_point, dtype=_ZP)
    if f.overlay:
        assert x.correction_codes is not None and x.correction is not None
        bufs["corr_codes"] = _correction_bytes(x.correction_codes.reshape(-1), buffer_size(_CORRECTION, f.sub_block))
        bufs["corr_scales"] = np.ascontiguousarray(x.correction, dtype="<f4").reshape(-1)
    parts = _derived(ggml_type, x, packed, start).parts()
    return Piece(_Keep(_patches_of(ggml_type, x, start), sum(len(p) for p in parts)), bufs, parts)


def _slots(ggml_type: str, base: int) -> dict[str, Slot]:
    """The named buffers of :func:`_chunk`: the base member (entry ``base``), then the correction."""
    f = X.form(ggml_type)
    per = X._specs()[ggml_type].elements // f.sub_block
    slots = {"codes": Slot(base, 0, buffer_size(f.storage, X._specs()[ggml_type].elements)),
             "scales": Slot(base, 1, per * element_type(f.scale).bits // 8)}
    if f.zero_point is not None:
        slots["zero_points"] = Slot(base, 2, per * _ZP.itemsize)
    if f.overlay:
        slots["corr_codes"] = Slot(base + 1, 0, per * buffer_size(_CORRECTION, f.sub_block))
        slots["corr_scales"] = Slot(base + 1, 1, per * 4)
    return slots


def _finish(ggml_type: str, why: str, keeps: list[_Keep], elements: int, report: Any) -> list[Any]:
    """The collector of an expanded tensor: the report's form, size (the derived record's
    real size on top, summed over the chunks: a dry run computes it as the import does) and
    reason; the record itself is spooled by the executor."""
    n_patches = int(_gather(ggml_type, keeps)[0].size)
    rec = sum(k.record for k in keeps)
    report.mapping = X.form(ggml_type).describe() + (
        f", {n_patches} zero patch{'es' if n_patches > 1 else ''}" if n_patches else "")
    report.bytes_out += rec
    n = max(elements, 1)
    report.reason = (f"--fallback exact: {8 * report.bytes_in / n:.4g} → {8 * report.bytes_out / n:.4g} bits per "
                     f"weight (record {8 * rec / n:.2g}); no native mapping: {why}")
    return []


def plan(name: str, ggml_type: str, shape: tuple[int, ...], blocks: np.ndarray, why: str,
         patches: _Patches | None = None) -> Plan:
    """The plan of ``name`` (``blocks``: its ``(n, block_bytes)`` GGML blocks) in its expanded
    form, laid out for ``patches`` (default: none).  Written, each chunk is expanded once on
    the workers; a tensor found to have zero patches is laid out again with them
    (:attr:`~.gguf_pass.Plan.relayout`).  ``why``: why it has no native mapping."""
    f = X.form(ggml_type)
    found = _no_patches(ggml_type) if patches is None else patches
    composite, head, members = _layout(name, ggml_type, shape, found[0])
    reserved = 1 + f.overlay
    entries = [Entry(name, head, ())] if composite else []
    entries += [Entry(mn, md) for mn, md in members[:reserved]]
    entries += [Entry(mn, md, [[p.astype("<f4").reshape(-1)]]) for (mn, md), p in zip(members[reserved:], found[1])]
    again = None if patches is not None else functools.partial(_relayout, name, ggml_type, shape, blocks, why)
    return Plan(tuple(entries), blocks, CHUNK_BLOCKS, _slots(ggml_type, int(composite)),
                functools.partial(_chunk, name, ggml_type), functools.partial(_scan_chunk, name, ggml_type),
                _collector(ggml_type, why, int(np.prod(shape, dtype=np.int64))), spool=(derived_key(name), 2), relayout=again)


def _collector(ggml_type: str, why: str, elements: int) -> Callable[[list[Any], Any], list[Any]]:
    return lambda keeps, report: _finish(ggml_type, why, keeps, elements, report)


def _relayout(name: str, ggml_type: str, shape: tuple[int, ...], blocks: np.ndarray, why: str,
              keeps: list[_Keep]) -> Plan | None:
    """The plan laid out with the zero patches the blocks have (None: they have none)."""
    found = _gather(ggml_type, keeps)
    return plan(name, ggml_type, shape, blocks, why, found) if found[0].size else None


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
    record = _read_record(kv, t.name, ggml_type, nb)
    data = _Stored(f, spec.elements, per, base, corr, patch_index, patch, record)
    if f.zero_point is not None:
        zp = base.data[2].view(_ZP)
        if np.any(zp != f.zero_point):
            b = int(np.argmax(zp != f.zero_point)) // per
            raise _bad(f"block {b}: zero point is not {f.zero_point}", t.name, "zero_point")
    return _Rebuilt(t.name, data, nb, spec.block_bytes)


def _read_record(kv: dict[str, Any], name: str, ggml_type: str, nb: int) -> "X.Record | X.DerivedRecord":
    """The tensor's record: derived, else (an earlier version's file) full; checked."""
    found = _record_of(kv, name)
    assert found is not None  # (the caller asked has_record)
    key, raw = found
    if raw.type != "bytes":
        raise _bad("the record is not bytes", name, key)
    kind = X.DerivedRecord if key == derived_key(name) else X.Record
    try:
        return kind.from_bytes(ggml_type, raw.view(), nb)  # mapped, read in windows
    except FormatError as e:
        raise _bad(f"record: {e.message}", name, key) from None


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
    record: "X.Record | X.DerivedRecord"

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
        scales = scales.reshape(nb, self.per).astype(f.scale_dtype, copy=False)  # (views: read only)
        x = X.Expanded(f.type, codes, scales, corr, ccodes,  # type: ignore[arg-type]
                       self.patch_index[lo:hi] - s0, self.patch[lo:hi], None)  # type: ignore[arg-type]
        x.record = self._record(sl, x, packed)
        return x, packed

    def _record(self, sl: slice, x: X.Expanded, packed: np.ndarray | None) -> X.Record:
        """The full record of the chunk ``sl``: a derived record's headers come from the stored
        values ``x`` (codes or ``packed``), a full record's are sliced."""
        r = self.record
        if isinstance(r, X.DerivedRecord):
            return r.chunk(sl, x, X.stand_ins(r.type, x.scales, x.codes, packed))
        e0, e1 = np.searchsorted(r.exception_index, [sl.start, sl.stop])
        return X.Record(r.type, r.header[sl], r.exception_index[e0:e1], r.exception_blocks[e0:e1])
