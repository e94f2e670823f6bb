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
  tensor, role base), then for a type whose row has ``minimum = "broadcast"`` the compact
  form of § 11 -- where ``planes``, ``<name>.hi`` (uint2 high bit, float32 scale ``16·s``),
  then ``<name>.min`` a broadcast member (:func:`~.gguf_compact.broadcast_member`: one code
  byte 1, float32 scale ``−dmin·m`` per sub-block; a sub-block whose minimum is ±0 flipped:
  codes ``qmax − q`` by an XOR, scales ``−s`` (``−16s``), broadcast scale ``qmax·s``) -- or
  the per-element form (``<name>.min``: uint2 codes 1 or 0, K, float32 scale ``−dmin·m``),
  then one ``<name>.zero.<i>`` per zero patch: a float32 shard of shape ``(1, …, 1, K)`` over
  its sub-block holding the ±0 pattern (role correction).  The chunks say whether the
  compact form holds (:func:`_flips`); where it does not, the tensor is laid out again in
  the per-element form.  :class:`~.gguf_expanded.Expanded` stays the logical form: the
  compaction is this module's storage layer (:func:`_compact_buffers`, :class:`_Stored`).
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
have some, or found to need the per-element form, is taken back (:meth:`HrryWriter.rewind`,
the plan's ``relayout``) and written again so; a dry run only scans
(:func:`~.gguf_expanded.expand_scales`), which tells both.

The export rebuilds the GGML blocks chunk by chunk with :func:`~.gguf_expanded.rebuild` (a
:class:`~.gguf_sources.ChunkedBlocks`: the workers ``pwrite`` them where
``GGUFWriterStream.skip_tensor_data`` left room), which proves the stored codes, scales,
corrections and patches are those of the rebuilt blocks (both forms, told apart by their
members' structure, :func:`_parts`; a compact one read back un-flipped, its flipped
sub-blocks marked :attr:`~.gguf_expanded.Expanded.unsigned_zero`); any mismatch is a
:class:`~hurray_interop.errors.FormatError` naming the tensor, the block and the field
(nothing is written: the output is atomic).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np

from .. import kernels as K
from ..core.elements import buffer_size, element_type, sign_extend, unpack
from ..core import model as M
from ..core.model import Descriptor, Tensor
from ..errors import FormatError
from ..tables import load_table
from . import gguf_compact as C
from . import gguf_expanded as X
from . import gguf_kernels as GK
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
    return ggml_type in X.EXPANDED_TYPES or ggml_type in X.GGML_ONLY_TYPES


def missing_decoder(t: Any) -> str:
    """What the expanded form of GGML type ``t`` (a :class:`~hurray_interop.formats.gguf.GGMLType`)
    lacks to be proven, or "": a type only ggml decodes (``decoder = "ggml"``) needs ggml's
    own decoder loaded, since no other decoder could hold verify's value check."""
    if X.form(t.name).decoder != "ggml":
        return ""
    from ..formats import gguf_ggml

    if gguf_ggml.has_decoder(t.id, t.block_elements, t.block_bytes):
        return ""
    why = gguf_ggml.unavailable_reason() if not gguf_ggml.available() else f"this libggml-python has no {t.name} decoder"
    return (f"ggml's own decoder, the only one of {t.name} ({why}; pip install 'hurray-interop[ggml]', "
            "CPython 3.11 on x86-64 Linux)")


@functools.cache
def _names() -> dict[str, str]:
    overlay = load_table("gguf_hurray")["overlay"]
    names = load_table("gguf_expanded")["names"]
    return {"base": overlay["base_suffix"], "min": overlay["correction_suffix"], "hi": names["hi_suffix"],
            "zero": names["zero_patch_suffix"]}


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
    """A chunk's keep: its zero patches, whether it needs the per-element form, and the bytes
    of its part of the derived record."""

    patches: _Patches
    old: bool
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


def _flips(f: X.Form, x: X.Expanded) -> tuple[np.ndarray, bool]:
    """The sub-blocks (flat indices) the compact form writes flipped (a ±0 minimum, a scale
    > 0: docs/conversion-rules.md § 11), and whether the chunk needs the per-element form: a
    ±0 minimum whose (stand-in) scale is not > 0, or an unflipped sub-block the export would
    read as flipped (:func:`~.gguf_compact.flipped`).  Only the few sub-blocks with a ±0
    minimum or a negative scale are looked at twice."""
    assert x.correction_codes is not None and x.correction is not None
    s, cc = x.scales.reshape(-1), x.correction_codes.reshape(-1)
    zero = np.flatnonzero(cc == 0) if not cc.all() else np.zeros(0, np.int64)
    flip = zero[C.flip_mask(s[zero], np.ones(zero.size, bool))]
    old = flip.size != zero.size
    neg = np.flatnonzero(s < 0)
    if neg.size and not old:
        old = bool((C.flipped(s[neg], x.correction.reshape(-1)[neg], f.qmax) & (cc[neg] != 0)).any())
    return flip, old


def _derived(ggml_type: str, x: X.Expanded, start: int, packed: np.ndarray, hi: np.ndarray | None) -> X.DerivedRecord:
    """The chunk's derived record (:class:`~.gguf_expanded.DerivedRecord`), from the logical
    ``x`` and its codes as stored before any flip (``packed``; the compact planes: ``packed``
    the low plane, ``hi`` the high one) -- what the export will see: a flipped sub-block's
    minimum is a ±0 whose sign is not kept, and the factorization does not read that sign."""
    f = X.form(ggml_type)
    per_block = buffer_size(f.storage if hi is None else f.base_storage, X._specs()[ggml_type].elements)
    lo = packed.reshape(-1, per_block)
    zero = X.stand_ins(ggml_type, x.scales, packed=lo, hi=None if hi is None else hi.reshape(lo.shape[0], -1))
    return X.DerivedRecord.of(x, zero, start)


def _scan_chunk(name: str, ggml_type: str, compact: bool, rows: np.ndarray, start: int) -> Piece:
    """A dry run's chunk: what the import's chunk keeps (zero patches, whether the compact
    form stands, the derived record's size), computed as the import does; nothing written."""
    return Piece(_chunk(name, ggml_type, compact, rows, start).keep)


def _chunk(name: str, ggml_type: str, compact: bool, rows: np.ndarray, start: int) -> Piece:
    """Expand the blocks once: their codes, scales (zero points) and correction as named
    buffers (``compact``: the form of § 11), the derived record's parts (headers the
    factorization misses, exception blocks), the zero patches and whether the chunk needs
    the per-element form."""
    f = X.form(ggml_type)
    hi = None
    if compact and f.planes:
        x, packed, hi = _expanded(name, X.expand_planes, ggml_type, rows, start)
    else:
        x, packed = _expanded(name, X.expand_packed, ggml_type, rows, start)
    parts = _derived(ggml_type, x, start, packed, hi).parts()  # (before the flips change packed)
    scales = np.ascontiguousarray(x.scales).reshape(-1)
    bufs = {"codes": packed, "scales": scales}
    if compact and f.planes:
        bufs["hi_codes"] = hi
    if f.zero_point is not None:
        bufs["zero_points"] = np.full(scales.size, f.zero_point, dtype=_ZP)
    old = False
    if f.overlay and compact:
        old = _compact_buffers(f, x, packed, bufs)
    elif f.overlay:
        assert x.correction_codes is not None and x.correction is not None
        bufs["corr_codes"] = _correction_bytes(x.correction_codes.reshape(-1), buffer_size(_CORRECTION, f.sub_block))
        bufs["corr_scales"] = np.ascontiguousarray(x.correction, dtype="<f4").reshape(-1)
    return Piece(_Keep(_patches_of(ggml_type, x, start), old, sum(len(p) for p in parts)), bufs, parts)


def _compact_buffers(f: X.Form, x: X.Expanded, packed: np.ndarray, bufs: dict[str, np.ndarray]) -> bool:
    """Fill ``bufs`` with the compact form's codes and scales (flipped sub-blocks: codes
    ``qmax − q`` by an XOR, scale −s, broadcast scale ``qmax·s``; planes split); True when
    the chunk needs the per-element form instead (what is filled is then never kept)."""
    assert x.correction is not None
    flip, old = _flips(f, x)
    s = bufs["scales"]
    bcast = x.correction.reshape(-1)
    if flip.size:  # (the planes are the expansion's own arrays)
        subs = s.size
        C.flip_codes(packed.reshape(subs, -1), flip, 0xFF)
        if f.planes:
            C.flip_codes(bufs["hi_codes"].reshape(subs, -1), flip, 0x55)
        bcast, s = bcast.copy(), s.copy()
        bcast[flip] = np.float32(f.qmax) * s[flip]
        s[flip] = -s[flip]
    if f.planes:
        bufs["hi_scales"] = (np.float32(1 << element_type(f.base_storage).bits) * s).astype("<f4")
    bufs["scales"] = np.ascontiguousarray(s, dtype="<f4")
    bufs["corr_scales"] = np.ascontiguousarray(bcast, dtype="<f4")
    return old


def _slots(ggml_type: str, base: int, compact: bool) -> dict[str, Slot]:
    """The named buffers of :func:`_chunk`: the base member (entry ``base``), the high-bit
    plane (compact planes), then the correction (compact: the broadcast member's scales)."""
    f = X.form(ggml_type)
    per = X._specs()[ggml_type].elements // f.sub_block
    storage = f.base_storage if compact else f.storage
    slots = {"codes": Slot(base, 0, buffer_size(storage, X._specs()[ggml_type].elements)),
             "scales": Slot(base, 1, per * element_type(f.scale).bits // 8)}
    if f.zero_point is not None:
        slots["zero_points"] = Slot(base, 2, per * _ZP.itemsize)
    planes = int(compact and f.planes)
    if planes:
        slots["hi_codes"] = Slot(base + 1, 0, per * buffer_size(C.HI_STORAGE[False], f.sub_block))
        slots["hi_scales"] = Slot(base + 1, 1, per * 4)
    if f.overlay and not compact:
        slots["corr_codes"] = Slot(base + 1, 0, per * buffer_size(_CORRECTION, f.sub_block))
    if f.overlay:
        slots["corr_scales"] = Slot(base + 1 + planes, 1, per * 4)
    return slots


def _finish(ggml_type: str, compact: bool, why: str, elements: int, keeps: list[_Keep], report: Any) -> list[Any]:
    """The collector of an expanded tensor: the report's form, size (the derived record's
    real size on top, summed over the chunks: a dry run computes it as the import does) and
    reason; the record itself is spooled by the executor."""
    f = X.form(ggml_type)
    n_patches = int(_gather(ggml_type, keeps)[0].size)
    rec = sum(k.record for k in keeps)
    old = " (per-element form: a ±0 minimum that cannot be flipped)" if f.compact and not compact else ""
    report.mapping = f.describe(compact) + old + (
        f", {n_patches} zero patch{'es' if n_patches > 1 else ''}" if n_patches else "")
    report.bytes_out += rec
    n = max(elements, 1)
    report.reason = (f"--fallback exact: {8 * report.bytes_in / n:.4g} → {8 * report.bytes_out / n:.4g} bits per "
                     f"weight (data {f.hurray_bpw(compact):.4g}, record {8 * rec / n:.2g}); no native mapping: {why}")
    return []


def plan(name: str, ggml_type: str, shape: tuple[int, ...], blocks: np.ndarray, why: str,
         patches: _Patches | None = None, compact: bool | None = None) -> Plan:
    """The plan of ``name`` (``blocks``: its ``(n, block_bytes)`` GGML blocks) in its expanded
    form, laid out for ``patches`` (default: none) in the compact form of § 11 where the
    type has one (``compact``, default: the table's).  Written, each chunk is expanded once
    on the workers; a tensor found to have zero patches, or to need the per-element form, is
    laid out again (:attr:`~.gguf_pass.Plan.relayout`).  ``why``: why it has no native mapping."""
    f = X.form(ggml_type)
    compact = f.compact if compact is None else compact
    found = _no_patches(ggml_type) if patches is None else patches
    composite, head, members = _layout(name, ggml_type, shape, found[0], compact)
    reserved = 1 + f.overlay + int(compact and f.planes)
    entries = [Entry(name, head, ())] if composite else []
    entries += [Entry(mn, md, fixed={0: C.broadcast_code().tobytes()} if C.is_broadcast(md) else {}) for mn, md in members[:reserved]]
    entries += [Entry(mn, md, [[p.astype("<f4").reshape(-1)]]) for (mn, md), p in zip(members[reserved:], found[1])]
    again = None if patches is not None else functools.partial(_relayout, name, ggml_type, shape, blocks, why, compact)
    return Plan(tuple(entries), blocks, CHUNK_BLOCKS, _slots(ggml_type, int(composite), compact),
                functools.partial(_chunk, name, ggml_type, compact), functools.partial(_scan_chunk, name, ggml_type, compact),
                functools.partial(_finish, ggml_type, compact, why, int(np.prod(shape, dtype=np.int64))),
                spool=(derived_key(name), 2), relayout=again)


def _relayout(name: str, ggml_type: str, shape: tuple[int, ...], blocks: np.ndarray, why: str, compact: bool,
              keeps: list[_Keep]) -> Plan | None:
    """The plan laid out with the zero patches the blocks have, in the per-element form
    where a chunk needs it (None: this one stands)."""
    found = _gather(ggml_type, keeps)
    old = compact and any(k.old for k in keeps)
    return plan(name, ggml_type, shape, blocks, why, found, compact and not old) if found[0].size or old else None


def _layout(name: str, ggml_type: str, shape: tuple[int, ...], patch_index: np.ndarray,
            compact: bool = False) -> tuple[bool, Descriptor, list[tuple[str, Descriptor]]]:
    """Is the form a composite, its head, and its members (or the one plain tensor)."""
    f = X.form(ggml_type)
    composite = f.overlay or patch_index.size > 0
    sfx = _names()
    storage = f.base_storage if compact else f.storage
    base = _affine(shape, f, storage, f.scale, f.zero_point is not None, M.ROLE_BASE if composite else None)
    members: list[tuple[str, Descriptor]] = [(name + sfx["base"] if composite else name, base)]
    if compact and f.planes:
        members.append((name + sfx["hi"], _affine(shape, f, C.HI_STORAGE[False], "float32", False, M.ROLE_CORRECTION)))
    if f.overlay and compact:
        members.append((name + sfx["min"], C.broadcast_member(shape, f.sub_block, "float32")))
    elif f.overlay:
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


@dataclass
class _Members:
    """The members of an expanded tensor as stored: the base, the high-bit plane (compact
    planes), the minimum correction (``compact``: a broadcast member) and the zero patches."""

    base: Tensor
    hi: Tensor | None
    corr: Tensor | None
    patches: list[Tensor]
    compact: bool


def _parts(t: Tensor, f: X.Form) -> _Members:
    """The members of an expanded tensor, its form (per-element or compact, § 11) told by
    their structure; FormatError if it is not one."""
    d = t.descriptor
    if not d.is_composite:
        if f.overlay:
            raise _bad(f"{f.type} is stored as an overlay, found a plain tensor", t.name, "layout")
        return _Members(t, None, None, [], False)
    lay = d.layout
    assert isinstance(lay, M.CompositeHead)
    if lay.composition_rule != M.RULE_OVERLAY or lay.combine_op != M.OP_ADD or d.element_type.name != "float32":
        raise _bad("the head is not a float32 overlay (add)", t.name, "layout")
    members = list(t.members)
    base = members.pop(0)
    if not f.overlay:
        return _Members(base, None, None, members, False)
    hi = None
    if f.planes and len(members) > 1 and C.is_broadcast(members[1].descriptor) and not C.is_broadcast(members[0].descriptor):
        hi = members.pop(0)
    corr = members.pop(0) if members else None
    if corr is None:
        raise _bad("the overlay has no correction member", t.name, "member_count")
    return _Members(base, hi, corr, members, C.is_broadcast(corr.descriptor))


def _check_desc(m: Tensor, shape: tuple[int, ...], f: X.Form, storage: str, scale: str, zp: bool) -> None:
    want = _affine(shape, f, storage, scale, zp, None)
    d = m.descriptor
    if (d.element_type.name, tuple(d.shape), d.quantization, type(d.layout), d.byte_offset) != (
            storage, tuple(shape), want.quantization, M.RowMajor, 0) or (d.shard is not None and any(d.shard.offset)):
        raise _bad(f"member is not {storage} per-block affine K={f.sub_block} {scale} along the last axis "
                   f"over the whole tensor", m.name, "descriptor")


def _check_broadcast(m: Tensor, shape: tuple[int, ...], f: X.Form) -> None:
    """The compact form's minimum: :func:`~.gguf_compact.broadcast_member` over the tensor,
    float32 scales per sub-block, its one code :data:`~.gguf_compact.BROADCAST_CODE`."""
    want = C.broadcast_member(shape, f.sub_block, "float32")
    d = m.descriptor
    if (tuple(d.shape), d.quantization, d.layout) != (tuple(shape), want.quantization, want.layout) or \
            (d.shard is not None and any(d.shard.offset)):
        raise _bad(f"the broadcast minimum is not uint8 K={f.sub_block} float32 with strides all 0 over the "
                   f"whole tensor", m.name, "descriptor")
    code = np.frombuffer(memoryview(m.data[0]).cast("B")[:1], dtype=np.uint8)
    if code.size != 1 or int(code[0]) != C.BROADCAST_CODE:
        got = "no byte" if code.size == 0 else str(int(code[0]))
        raise _bad(f"the broadcast minimum's code is {got}, not {C.BROADCAST_CODE}", m.name, "codes")


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
    ms = _parts(t, f)
    base = ms.base
    _check_desc(base, shape, f, f.base_storage if ms.compact else f.storage, f.scale, f.zero_point is not None)
    if ms.hi is not None:
        _check_desc(ms.hi, shape, f, C.HI_STORAGE[False], "float32", False)
    if ms.corr is not None and ms.compact:
        _check_broadcast(ms.corr, shape, f)
    elif ms.corr is not None:
        _check_desc(ms.corr, shape, f, _CORRECTION, "float32", False)
    patch_index, patch = _patches(ms.patches, shape, f.sub_block)
    record = _read_record(kv, t.name, ggml_type, nb)
    data = _Stored(f, spec.elements, per, base, ms.corr, patch_index, patch, record, ms.hi, ms.compact)
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
    """An expanded tensor as stored, sliced into :class:`~.gguf_expanded.Expanded` chunks
    (``compact``: the form of § 11, flipped sub-blocks told by their scales and un-flipped;
    ``hi``: its high-bit plane)."""

    form: X.Form
    elements: int
    per: int
    base: Tensor
    corr: Tensor | None
    patch_index: np.ndarray
    patch: np.ndarray
    record: "X.Record | X.DerivedRecord"
    hi: Tensor | None = None
    compact: bool = False

    def expanded(self, sl: slice) -> tuple[X.Expanded, np.ndarray | None]:
        """The chunk ``sl`` of blocks, and its codes as stored where :func:`~.gguf_expanded.rebuild`
        takes them so (then the expansion's ``codes`` is None)."""
        f, nb = self.form, sl.stop - sl.start
        s0, s1 = sl.start * self.per, sl.stop * self.per
        scales = self.base.data[1].view(f.scale_dtype.newbyteorder("<"))[s0:s1]
        corr = ccodes = flip = None
        if self.corr is not None and self.compact:
            scales, corr, ccodes, flip = self._unflip(scales, s0, s1)
        elif self.corr is not None:
            width = buffer_size(_CORRECTION, f.sub_block)
            ccodes = _sub_block_codes(self.corr.data[0][s0 * width : s1 * width], width)
            corr = self.corr.data[1].view("<f4")[s0:s1].astype(np.float32, copy=False)
        codes, packed = self._codes(sl, flip)
        lo, hi = np.searchsorted(self.patch_index, [s0, s1])
        scales = scales.reshape(nb, self.per).astype(f.scale_dtype, copy=False)  # (views: read only)
        shaped = [a.reshape(nb, self.per) if a is not None else None for a in (corr, ccodes, flip)]
        x = X.Expanded(f.type, codes, scales, shaped[0], shaped[1],  # type: ignore[arg-type]
                       self.patch_index[lo:hi] - s0, self.patch[lo:hi], None, shaped[2])  # type: ignore[arg-type]
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

    def _unflip(self, b: np.ndarray, s0: int, s1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The compact form's sub-blocks ``s0:s1``: their logical scales, corrections and
        correction codes, and which were stored flipped (base scale ``b < 0``, broadcast
        scale ``qmax·(−b)``: there the logical scale is ``−b``, the correction a ±0 of
        unknown sign, stand-in −1 with code 0).  The high-bit plane's scales must be
        ``16·b`` exactly (FormatError naming the block)."""
        f = self.form
        assert self.corr is not None
        v = self.corr.data[1].view("<f4")[s0:s1]
        if self.hi is not None:
            h = self.hi.data[1].view("<f4")[s0:s1]
            want = (np.float32(1 << element_type(f.base_storage).bits) * b).astype(np.float32)
            bad = h.view(np.uint32) != want.view(np.uint32)
            if bad.any():
                i = int(np.argmax(bad)) + s0
                raise FormatError(f"--fallback exact form: block {i // self.per}: the high-bit plane's scale of "
                                  f"sub-block {i % self.per} is not 16× the base scale", tensor=self.hi.name, field="scales")
        neg = np.flatnonzero(b < 0)  # (a flipped base scale is < 0: ggml's scales almost never are)
        fi = neg[C.flipped(b[neg], v[neg], f.qmax)] if neg.size else neg
        flip = np.zeros(b.shape, dtype=bool)
        ccodes = np.ones(v.shape, np.uint8)
        if not fi.size:
            return b, v, ccodes, flip
        flip[fi] = True
        b, v = b.copy(), v.copy()
        b[fi], v[fi], ccodes[fi] = -b[fi], np.float32(-1), 0
        return b, v, ccodes, flip

    def _codes(self, sl: slice, flip: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``(codes, packed)`` of the chunk: packed where :func:`~.gguf_expanded.rebuild` takes
        them so, else the ``(n, elements)`` codes; flipped sub-blocks un-flipped, planes joined."""
        f, nb = self.form, sl.stop - sl.start
        storage = f.base_storage if self.compact else f.storage
        et = element_type(storage)
        raw = self._bytes(self.base, storage, sl, flip, 0xFF)
        if self.hi is not None:
            hi = self._bytes(self.hi, C.HI_STORAGE[False], sl, flip, 0x55)
            lo_w, hi_w = (buffer_size(s, self.elements) for s in (storage, C.HI_STORAGE[False]))
            if raw.size != nb * lo_w or hi.size != nb * hi_w:  # (the reader checks the sizes: unpack raises)
                return C.join_planes(raw, hi, nb * self.elements).reshape(nb, self.elements), None
            # q = lo + 16·hi (hi codes 2, 3 give codes out of range: rebuild says so)
            out = K.thread_buffer("gguf_exact.planes", (nb, self.elements), np.uint8)  # (used within the chunk)
            return GK.q5k_join(raw.reshape(nb, lo_w), hi.reshape(nb, hi_w), out=out), None
        per_block = buffer_size(et, self.elements)
        if X.rebuilds_packed(f.type) and raw.size == nb * per_block:
            return None, raw.reshape(nb, per_block)
        codes = unpack(raw, et, nb * self.elements)
        if et.packed and et.kind == "int":
            codes = sign_extend(codes, et.bits)
        return np.ascontiguousarray(codes).view(f.code_dtype).reshape(nb, self.elements), None

    def _bytes(self, m: Tensor, storage: str, sl: slice, flip: np.ndarray | None, xor: int) -> np.ndarray:
        """The code bytes of member ``m`` for the blocks ``sl`` (uint8), the sub-blocks
        ``flip`` XOR-ed with ``xor`` (on a copy)."""
        per_block = buffer_size(element_type(storage), self.elements)
        raw = m.data[0][sl.start * per_block : sl.stop * per_block]
        flat = raw.reshape(-1).view(np.uint8) if isinstance(raw, np.ndarray) else np.frombuffer(raw, dtype=np.uint8)
        if flip is None or flat.size != flip.size * (per_block // self.per):
            return flat
        fi = np.flatnonzero(flip)
        if fi.size:
            flat = flat.copy()
            C.flip_codes(flat.reshape(flip.size, -1), fi, xor)
        return flat
