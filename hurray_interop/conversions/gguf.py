"""GGUF ⇄ Hurray, exact (docs/conversion-rules.md §§ 2–5, 7).

Import (:func:`gguf_to_hurray`) moves every code and scale bit of each GGUF
tensor into a Hurray tensor, following ``mappings/gguf_hurray.toml``; what
Hurray cannot hold exactly is refused (or stored by an explicit fallback,
:mod:`.fallback`).  Export (:func:`hurray_to_gguf`) recognises the same forms and
writes the GGML blocks back; together with the records below a GGUF → Hurray →
GGUF round trip reproduces the source file byte for byte.  Both directions are
generic over the block codecs of :mod:`.gguf_codec` (one per GGML type, from the
tables): the code here branches on a codec's mapping kind, never on a type name.

Records kept in the .hrry KV section (all keys start with ``hurray_interop.``;
GGUF's own keys are stored first, under their own names, in file order):

``hurray_interop.source_format``      string ``"gguf"``
``hurray_interop.gguf.version``       uint64: the GGUF version (2 or 3)
``hurray_interop.gguf.alignment``     uint64: the data alignment
``hurray_interop.gguf.tail_bytes``    uint64: zero bytes after the last tensor (0 for
                                      files that end unpadded)
``hurray_interop.gguf.kv_types``      array of strings, one per GGUF key in order:
                                      its exact GGUF type (``UINT32``, ``ARRAY[INT32]``,
                                      …), prefixed ``RAW:`` when the Hurray value is
                                      the GGUF-encoded payload as ``bytes`` (nested
                                      arrays, strings that are not UTF-8, float32 NaNs,
                                      bools other than 0/1)
``hurray_interop.gguf.tensors``       string (JSON): per tensor, in GGUF order,
                                      ``[name, ggml type, ne, offset]``
``hurray_interop.gguf.split_layout``  string (JSON), only for a split set (gguf-split
                                      shards): the :class:`~..formats.gguf_split.SplitLayout`
                                      (tensors per shard, each shard's key order, version,
                                      alignment, padding); the metadata and ``tensors``
                                      records above then describe the whole set (the
                                      first shard's keys without ``split.*``, every tensor
                                      in set order), docs/conversion-rules.md § 10
``hurray_interop.gguf.padding``       bytes, only when the source has them: the bytes that are
                                      not zero in its padding and in gaps between tensors
                                      (per region, from its first to its last non-zero
                                      byte; shard, absolute offset and bytes, see
                                      :func:`~hurray_interop.core.records.encode_byte_runs`),
                                      at most :data:`MAX_PADDING_BYTES`; an export of the
                                      recorded layout writes them back, one to a new layout
                                      says it does not (docs/conversion-rules.md § 7)
``hurray_interop.scale_substitutions.<tensor>``  see :mod:`hurray_interop.core.records`
``hurray_interop.gguf.derived.<tensor>``          ``--fallback exact``: the restore record
                                      of an expanded tensor, see :mod:`.gguf_exact`
``hurray_interop.gguf.expanded.<tensor>``         the same in full, as earlier versions wrote it

GGUF values map to Hurray KV types naturally: unsigned integers → uint64,
signed → int64, FLOAT32/FLOAT64 → float64 (float32 widened exactly), BOOL →
bool, STRING → string, arrays of those → arrays.

Q4_1/Q5_1/Q5_0 tensors become the compact exact overlays (docs/conversion-rules.md § 11): a
composite head ``<name>`` (float32, overlay, add) with members ``<name>.base`` (uint4 low code
bits), ``<name>.hi`` (the 5th-bit plane; Q5_x) and ``<name>.min`` (the broadcast minimum;
Q4_1/Q5_1), whose flipped blocks are recorded under the member's scale-substitution key; or,
where a block needs it, the per-element forms (§ 3a's minimum overlay, Q5_0 as int8), which
the export also reads (files of earlier versions).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from ..core.elements import buffer_size, element_type, sign_extend, unpack
from ..core.kv import KVValue
from ..core.model import (
    MXFP,
    OP_ADD,
    ROLE_BASE,
    ROLE_CORRECTION,
    RULE_OVERLAY,
    BufferHandle,
    CompositeHead,
    CompositeMember,
    Descriptor,
    PerBlockAffine,
    RowMajor,
    Shard,
    Tensor,
)
from ..core.records import decode_byte_runs, decode_scale_record, encode_byte_runs, encode_scale_record, restore_scales, scale_record_key
from ..errors import ConversionRefused, FormatError, UnsupportedError, UsageError, errors_name_source
from ..formats import gguf as G
from ..parallel import use_jobs
from ..report import EXACT, EXACT_FORM_HINT, LOSSY, REFUSED, VALUE_EXACT, ConversionReport, TensorPlan, fallback_hint
from ..tables import load_table
from .. import kernels as K
from . import fallback as fallbacks
from . import gguf_compact as C
from . import gguf_metadata
from . import gguf_pass as P
from .gguf_codec import BlockCodec, Parts, codec, codecs, minimum_of, zero_point_misses
from .gguf_sources import BlockSource, ChunkedBlocks, PlainBytes, StreamedBytes, Target

if TYPE_CHECKING:  # the .hrry container, the split sets and --fallback exact are imported
    from ..files.positional import PositionalWriter  # when used, so that planning (inspect, --dry-run) starts fast
    from ..formats import gguf_split as S

__all__ = ["gguf_to_hurray", "hurray_to_gguf", "plan_gguf", "dequantize_gguf", "KEY_PREFIX"]

KEY_PREFIX = "hurray_interop."
K_SOURCE = "hurray_interop.source_format"
K_VERSION = "hurray_interop.gguf.version"
K_ALIGN = "hurray_interop.gguf.alignment"
K_TAIL = "hurray_interop.gguf.tail_bytes"
K_TYPES = "hurray_interop.gguf.kv_types"
K_TENSORS = "hurray_interop.gguf.tensors"
K_SPLIT = "hurray_interop.gguf.split_layout"
K_PADDING = "hurray_interop.gguf.padding"

#: most bytes of non-zero padding and gaps between tensors an import records (beyond: refused)
MAX_PADDING_BYTES = 1 << 20
#: how the note of an export that cannot write the recorded non-zero padding back starts (after the count)
PADDING_LOST = "recorded non-zero padding byte(s) not restored"

#: blocks processed per chunk (≈ 8 Mi elements): bounds memory for any tensor size
CHUNK_BLOCKS = 1 << 18

Progress = Callable[[int, int], None] | None
VT = G.ValueType
_UNSIGNED = {VT.UINT8, VT.UINT16, VT.UINT32, VT.UINT64}
_SIGNED = {VT.INT8, VT.INT16, VT.INT32, VT.INT64}
_FLOATS = {VT.FLOAT32, VT.FLOAT64}


def _table() -> Any:
    return load_table("gguf_hurray")


# ===========================================================================
# metadata


def _natural_kind(vt: "G.ValueType") -> str | None:
    if vt in _UNSIGNED:
        return "uint64"
    if vt in _SIGNED:
        return "int64"
    if vt in _FLOATS:
        return "float64"
    if vt == VT.BOOL:
        return "bool"
    if vt == VT.STRING:
        return "string"
    return None


def _natural(v: "G.GGUFValue") -> KVValue | None:
    """The faithful plain Hurray value of a GGUF value, or None when only raw bytes are exact."""
    t = v.type
    if t == VT.ARRAY:
        et = v.element_type
        kind = _natural_kind(et) if et is not None else None
        if kind is None:
            return None  # nested arrays
        if et == VT.STRING:
            try:
                items = v.value.decode("strict")
            except UnicodeDecodeError:
                return None
            return KVValue("array", items, "string")
        arr = np.asarray(v.value)
        if et == VT.BOOL:
            if arr.size and int(arr.max()) > 1:
                return None
            return KVValue("array", [bool(x) for x in arr.tolist()], "bool")
        if et == VT.FLOAT32 and np.isnan(arr).any():
            return None
        return KVValue("array", arr.tolist(), kind)
    kind = _natural_kind(t)
    if t == VT.STRING:
        try:
            return KVValue("string", bytes(v.value).decode("utf-8"))
        except UnicodeDecodeError:
            return None
    if t == VT.BOOL:
        b = int(v.value)
        return KVValue("bool", bool(b)) if b in (0, 1) else None
    if t == VT.FLOAT32 and np.isnan(v.value):
        return None
    return KVValue(kind, v.value.item())  # type: ignore[arg-type]


def _type_string(v: "G.GGUFValue") -> str:
    if v.type == VT.ARRAY:
        return f"ARRAY[{v.element_type.name}]" if v.element_type is not None else "ARRAY"
    return v.type.name


def _raw_payload(v: "G.GGUFValue") -> bytes:
    """The GGUF encoding of a value (without its type tag), for values kept as raw bytes."""
    return G.encode_value(v)


def _decode_raw_payload(vt: "G.ValueType", raw: bytes, key: str, path: str) -> "G.GGUFValue":
    return G.decode_value(vt, raw, what=key, path=path)


def _check_reserved_keys(src: "G.GGUFFile") -> None:
    """Keys Hurray's KV section cannot hold, or that collide with our records, are refused."""
    for key in src.kv:
        try:
            ok = bool(key) and "\x00" not in key and len(key.encode("utf-8")) <= 0xFFFF
        except UnicodeEncodeError:
            ok = False
        if not ok:
            raise UnsupportedError(
                f"GGUF metadata key {key!r} is not a valid Hurray key (non-empty UTF-8 without NUL, at most 65535 bytes)",
                path=src.path,
                offset=src.kv_offsets.get(key),
            )
        if key.startswith(KEY_PREFIX):
            raise UnsupportedError(
                f"GGUF metadata key {key!r} uses the prefix {KEY_PREFIX!r} reserved for conversion records",
                path=src.path,
                offset=src.kv_offsets.get(key),
            )


def _kv_to_hurray(src: "G.GGUFFile") -> tuple[list[tuple[str, KVValue]], list[str]]:
    _check_reserved_keys(src)
    return kv_to_hurray(src.kv.items())


def kv_to_hurray(values: Iterable[tuple[str, "G.GGUFValue"]]) -> tuple[list[tuple[str, KVValue]], list[str]]:
    """GGUF metadata as the .hrry holds it: the Hurray KV entries (natural types, or the
    GGUF encoding as bytes) and the :data:`K_TYPES` record of their exact GGUF types.
    The keys must be valid Hurray keys outside the records' prefix (the caller checks)."""
    items: list[tuple[str, KVValue]] = []
    types: list[str] = []
    for key, v in values:
        nat = _natural(v)
        if nat is None:
            items.append((key, KVValue("bytes", _raw_payload(v))))
            types.append("RAW:" + _type_string(v))
        else:
            items.append((key, nat))
            types.append(_type_string(v))
    return items, types


def _parse_type_string(s: str) -> tuple[bool, "G.ValueType", "G.ValueType | None"]:
    raw = s.startswith("RAW:")
    body = s[4:] if raw else s
    if body.startswith("ARRAY[") and body.endswith("]"):
        return raw, VT.ARRAY, VT[body[6:-1]]
    return raw, VT[body], None


def _gguf_value_from_record(key: str, value: KVValue, type_str: str, path: str) -> "G.GGUFValue":
    try:
        return _gguf_value_from_record_unchecked(key, value, type_str, path)
    except (UsageError, TypeError, ValueError, OverflowError, AttributeError) as e:
        msg = e.message if isinstance(e, UsageError) else str(e)
        raise FormatError(
            f"metadata value does not fit the GGUF type {type_str} recorded in {K_TYPES} ({msg})", path=path, field=key
        ) from None


def _gguf_value_from_record_unchecked(key: str, value: KVValue, type_str: str, path: str) -> "G.GGUFValue":
    raw, vt, et = _parse_type_string(type_str)  # checked by _records
    if raw:
        expected: tuple[str, str | None] = ("bytes", None)
    elif vt == VT.ARRAY:
        expected = ("array", _natural_kind(et) if et is not None else None)
    else:
        expected = (_natural_kind(vt) or "?", None)
    ints = ("int64", "uint64")  # either integer kind holds any GGUF integer (range-checked below)
    if (value.type, value.element_type) != expected and not (
        (value.type in ints and expected[0] in ints and expected[1] is None)
        or (value.type == "array" and value.element_type in ints and expected[1] in ints)
    ):
        got = value.type + (f"[{value.element_type}]" if value.element_type else "")
        want = expected[0] + (f"[{expected[1]}]" if expected[1] else "")
        raise FormatError(
            f"stored as {got}, but {K_TYPES} records {type_str} (expected {want})", path=path, field=key
        )
    if raw:
        return _decode_raw_payload(vt, value.value, key, path)
    if vt == VT.ARRAY:
        items = list(value.value)
        if et == VT.STRING:
            return G.GGUFValue.of(VT.ARRAY, [s.encode("utf-8") for s in items], VT.STRING)
        return G.GGUFValue.of(VT.ARRAY, _wide_array(items, et), et, exact=True)  # type: ignore[arg-type]
    v = value.value
    if vt == VT.STRING:
        v = v.encode("utf-8")
    return G.GGUFValue.of(vt, v, exact=True)  # a recorded FLOAT32 must be one (ints: in range)


def _wide_array(items: list[Any], et: "G.ValueType") -> np.ndarray:
    """Python numbers as the widest numpy array of their kind (the GGUF writer narrows, range-checked)."""
    dt = np.uint64 if et in _UNSIGNED else np.int64 if et in _SIGNED else np.float64 if et in _FLOATS else np.uint8
    return np.array(items, dtype=dt)


_KV_TO_GGUF = {
    "string": VT.STRING,
    "int64": VT.INT64,
    "uint64": VT.UINT64,
    "float64": VT.FLOAT64,
    "bool": VT.BOOL,
}


def _gguf_value_from_plain(value: KVValue) -> "G.GGUFValue":
    """Hurray KV → GGUF for files that did not come from GGUF (documented in the README)."""
    if value.type == "bytes":
        return G.GGUFValue.of(VT.ARRAY, np.frombuffer(value.value, dtype=np.uint8), VT.UINT8)
    if value.type == "array":
        et = value.element_type
        if et == "bytes":
            return G.GGUFValue.of(
                VT.ARRAY, [G.GGUFValue.of(VT.ARRAY, np.frombuffer(b, dtype=np.uint8), VT.UINT8) for b in value.value], VT.ARRAY
            )
        items = list(value.value)
        gt = _KV_TO_GGUF[et]  # type: ignore[index]
        if et == "string":
            return G.GGUFValue.of(VT.ARRAY, [s.encode("utf-8") for s in items], gt)
        return G.GGUFValue.of(VT.ARRAY, _wide_array(items, gt), gt)
    v = value.value.encode("utf-8") if value.type == "string" else value.value
    return G.GGUFValue.of(_KV_TO_GGUF[value.type], v)


# ===========================================================================
# import: per-tensor jobs

#: blocks per parallel work item (small enough that a tensor of 2^19 blocks is split
#: among the threads; the chunk boundaries do not show in the output)
PAR_BLOCKS = 1 << 16
#: values per parallel work item of a fallback (whole rows; at least one row)
FALLBACK_VALUES = 1 << 22
#: the storage of the minimum overlay's correction member (docs/conversion-rules.md § 3a):
#: every code 1 (one bit pattern per byte below), scaled by the block's minimum m
CORRECTION_STORAGE = "uint2"
_CORRECTION_ONES = 0x55
#: Hurray zero points are int32
_ZP = np.dtype("<i4")


@dataclass
class _Job:
    """One GGUF tensor on its way into Hurray: its report row, records and Hurray names."""

    info: "G.GGUFTensorInfo"
    plan: TensorPlan
    records: list[tuple[str, KVValue]] = field(default_factory=list)
    names: tuple[str, ...] = ()
    expanded: bool = False  # --fallback exact


def _blocks(info: "G.GGUFTensorInfo") -> np.ndarray:
    """The tensor's blocks as a ``(n_blocks, block_bytes)`` zero-copy view."""
    size = info.ggml_type.block_bytes
    return info.data.reshape(-1, size) if info.nbytes else np.zeros((0, size), dtype=np.uint8)


def _chunks(n: int, step: int = CHUNK_BLOCKS) -> Iterator[slice]:
    for i in range(0, n, step):
        yield slice(i, min(i + step, n))


def _shape(info: "G.GGUFTensorInfo") -> tuple[int, ...]:
    return tuple(int(x) for x in reversed(info.ne))


def _quantization(c: BlockCodec, rank: int, zero_points: bool) -> MXFP | PerBlockAffine:
    if c.mapping == "mxfp":
        return MXFP(axis=rank - 1, block_size=c.block_size, scale_buffer_index=1)
    return PerBlockAffine(
        axis=rank - 1,
        block_size=c.block_size,
        scale_buffer_index=1,
        zero_point_buffer_index=2 if zero_points else None,
        scale_type=element_type(c.scale.name),
    )


def _block_desc(shape: tuple[int, ...], c: BlockCodec, nblocks: int, *, storage: str | None = None,
                zero_points: bool = False, shard: bool = False, role: int | None = None) -> Descriptor:
    """The descriptor of a tensor (or overlay member) stored in ``c``'s blocks: codes of
    ``storage`` (default ``c.storage``), one scale per block, optionally zero points."""
    et = element_type(storage) if storage else c.storage
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    bufs = [BufferHandle.cpu(buffer_size(et, n)), BufferHandle.cpu(nblocks * np.dtype(c.scale.view).itemsize)]
    if zero_points:
        bufs.append(BufferHandle.cpu(nblocks * _ZP.itemsize))
    return Descriptor(
        element_type=et,
        shape=shape,
        buffers=tuple(bufs),
        layout=RowMajor(),
        quantization=_quantization(c, len(shape), zero_points),
        shard=Shard(parent_shape=shape, offset=(0,) * len(shape)) if shard else None,
        composite_member=CompositeMember(role) if role is not None else None,
    )


def _mapping_text(c: BlockCodec, kind: str) -> str:
    st, k, sc = c.storage.name, c.block_size, c.scale.abbrev
    bits = element_type(CORRECTION_STORAGE).bits
    return {
        "overlay": f"overlay(add): {st} per-block K={k} {sc} + {CORRECTION_STORAGE} minimum (exact, +{bits} bits/weight)",
        "asym": f"per-block affine {st} zero-point K={k} {sc}",
        "requant": f"per-block affine {st} zero-point K={k} {sc} (requantized)",
        "mxfp": f"MXFP {st} K={k} {sc}",
        "block": f"per-block affine {st} SYMMETRIC K={k} {sc}",
    }[kind]


_NO_BLOCKS = np.zeros(0, dtype=np.int64)
_Substituted = tuple[np.ndarray, np.ndarray | None]  # a chunk's substituted blocks: indices, original scales


@dataclass(frozen=True)
class _Planned:
    """A tensor's plan and its report's mapping text."""

    plan: P.Plan
    mapping: str


def _records_of(parts: Sequence[_Substituted], c: BlockCodec) -> tuple[np.ndarray, np.ndarray]:
    """The substituted blocks of a pass (per chunk: block indices, original scales), joined."""
    assert c.scale is not None
    idx = [i for i, _ in parts if i.size]
    if not idx:
        return _NO_BLOCKS, np.zeros(0, dtype=c.scale.view)
    return np.concatenate(idx), np.concatenate([o for i, o in parts if i.size])  # type: ignore[misc]


def _substitute(s: np.ndarray | None, zero: np.ndarray | None, chunk: np.ndarray, start: int,
                c: BlockCodec) -> _Substituted:
    """Blocks with a zero-like scale in ``s`` (refused unless their codes are zero) get the
    legal stand-in, in place; returns (their block indices, original scales)."""
    assert c.scale is not None
    if zero is None:
        return _NO_BLOCKS, None
    assert s is not None  # P.checked gives the values where some are zero-like
    where = P.zero_blocks(chunk, start, zero, c)
    orig = s[where].copy()
    s[where] = c.scale.one(orig)
    return where + start, orig


def _substitution_records(name: str, c: BlockCodec, keeps: Sequence[_Substituted],
                          report: TensorPlan) -> list[tuple[str, KVValue]]:
    """The record collector of the tensors whose zero-like scales are substituted: the
    substitution record of ``name`` (none when no block was), the count in the report."""
    idx, orig = _records_of(keeps, c)
    report.substituted_blocks = int(idx.size)
    return [(scale_record_key(name), KVValue("bytes", encode_scale_record(idx, orig)))] if idx.size else []


def _block_checks(rows: np.ndarray, start: int, c: BlockCodec, values: bool) -> tuple[np.ndarray | None, _Substituted]:
    """A chunk of one-scale blocks checked: its scales (when ``values``, or when some are
    zero-like), substituted; and the substitutions."""
    assert c.scale is not None
    s, zero = P.checked(rows, start, c, c.scale.field, f"scale {c.scale.field}", values)
    return s, _substitute(s, zero, rows, start, c)


def _block_scan(c: BlockCodec, rows: np.ndarray, start: int) -> P.Piece:
    return P.Piece(_block_checks(rows, start, c, False)[1])


def _block_chunk(c: BlockCodec, rows: np.ndarray, start: int) -> P.Piece:
    """One chunk of one-scale blocks: the codes and the (substituted) scales."""
    s, rec = _block_checks(rows, start, c, True)
    codes = c.codes_into(rows, P.buffer("codes", (rows.shape[0], c.code_bytes), np.uint8))
    return P.Piece(rec, {"codes": codes, "scales": s})  # type: ignore[dict-item]


def _scale_slots(c: BlockCodec, entry: int, zero_points: bool = False) -> dict[str, P.Slot]:
    """The named buffers of a tensor (entry ``entry`` of its plan) in ``c``'s blocks."""
    assert c.scale is not None
    slots = {"codes": P.Slot(entry, 0, c.code_bytes), "scales": P.Slot(entry, 1, np.dtype(c.scale.view).itemsize)}
    if zero_points:
        slots["zero_points"] = P.Slot(entry, 2, _ZP.itemsize)
    return slots


def _plan_block(info: "G.GGUFTensorInfo", c: BlockCodec, q4_1: str, compact: bool = True) -> _Planned:
    """One scale per block (mappings ``block`` and ``mxfp``): codes and scales move (the
    compact form of § 11 where the table says so and ``compact``)."""
    if compact and c.compact:
        return _plan_compact(info, c, q4_1)
    blocks = _blocks(info)
    desc = _block_desc(_shape(info), c, blocks.shape[0])
    plan = P.Plan((P.Entry(info.name, desc),), blocks, PAR_BLOCKS, _scale_slots(c, 0),
                  functools.partial(_block_chunk, c), functools.partial(_block_scan, c),
                  functools.partial(_substitution_records, info.name, c))
    return _Planned(plan, _mapping_text(c, c.mapping))


def _minimum_check(d: np.ndarray, m: np.ndarray, qmax: int) -> np.ndarray | None:
    """docs/conversion-rules.md § 2 (a): integer zero points z = −m/d reproducing d·q + m exactly for
    every code (:func:`~.gguf_codec.zero_point_misses`), with m recoverable as f16(−z·d)
    (:func:`~.gguf_codec.minimum_of`).  Returns z (int32) or None."""
    d32 = d.astype(np.float32)
    m32 = m.astype(np.float32)
    if not (np.isfinite(d32).all() and np.isfinite(m32).all()) or np.any(d32 == 0):
        return None
    zf = -m32.astype(np.float64) / d32.astype(np.float64)
    z = np.rint(zf)
    if np.any(z != zf) or np.any(np.abs(z) > 2**31 - 1):
        return None
    z32 = z.astype(np.int32)
    if zero_point_misses(d32, z32, m32, qmax).any():
        return None
    if not np.array_equal(minimum_of(z32, d32).view(np.uint16), m.view(np.uint16)):
        return None
    return z32


def _asym_exact(blocks: np.ndarray, c: BlockCodec) -> bool:
    """Is the plain asymmetric form exact for every block (integer zero points, § 2 (a))?
    The one pre-read of the import: only ``d`` and ``m``, stopping at the first chunk that
    is not (a small first chunk, so the usual answer, no, costs a few pages)."""
    nb, qmax = blocks.shape[0], c.code_range()[1]
    start = 0
    while start < nb:
        sl = slice(start, min(nb, start + (1024 if start == 0 else CHUNK_BLOCKS)))
        if _minimum_check(c.scales(blocks[sl]), c.minimums(blocks[sl]), qmax) is None:
            return False
        start = sl.stop
    return nb > 0


def _requantized(chunk: np.ndarray, c: BlockCodec, d16: np.ndarray, zero: np.ndarray | None,
                 m16: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """--q4-1 requantize of a chunk: (scales, nearest integer zero points, max abs error)."""
    assert c.scale is not None
    zero = np.zeros(d16.shape, bool) if zero is None else zero
    d, m = d16.astype(np.float32), m16.astype(np.float32)
    safe_d = np.where(zero, np.float32(1.0), d)
    z = np.clip(np.rint(-m.astype(np.float64) / safe_d), -(2**31), 2**31 - 1).astype(np.int32)
    q = unpack(c.codes(chunk), c.storage, chunk.shape[0] * c.block_size).reshape(-1, c.block_size).astype(np.float32)
    exact = d[:, None] * q + m[:, None]
    approx = safe_d[:, None] * (q - z[:, None].astype(np.float32))
    err = float(np.max(np.abs(approx - exact))) if approx.size else 0.0
    d16[zero] = c.scale.one(np.abs(d16[zero]))  # +1: the zero point carries the minimum
    return d16, z, err


@dataclass
class _MinChunk:
    """A chunk of ``d·q + m`` blocks checked: scales ``d`` (substituted or requantized),
    minimums ``m`` and their zero-like mask, requantized zero points, what the collector keeps."""

    d: np.ndarray
    m: np.ndarray
    mzero: np.ndarray | None
    z: np.ndarray | None
    keep: tuple[np.ndarray, np.ndarray | None, float]


def _block_min_checks(rows: np.ndarray, start: int, c: BlockCodec, mode: str) -> _MinChunk:
    """One chunk of ``d·q + m`` blocks in ``mode`` (overlay, asym, requant), checked:
    refusals raised, zero-like scales substituted (requant: the nearest zero points)."""
    assert c.scale is not None
    d, dzero = P.checked(rows, start, c, c.scale.field, f"scale {c.scale.field}", True)
    m, mzero = P.checked(rows, start, c, "m", "minimum m", True)
    assert d is not None and m is not None
    if mode != "requant":
        i, o = _substitute(d, dzero, rows, start, c)
        return _MinChunk(d, m, mzero, None, (i, o, 0.0))
    if dzero is not None:
        P.zero_blocks(rows, start, dzero, c)
    d, z, err = _requantized(rows, c, d, dzero, m)
    return _MinChunk(d, m, mzero, z, (_NO_BLOCKS, None, err))


def _block_min_scan(c: BlockCodec, mode: str, rows: np.ndarray, start: int) -> P.Piece:
    return P.Piece(_block_min_checks(rows, start, c, mode).keep)


def _block_min_chunk(c: BlockCodec, mode: str, rows: np.ndarray, start: int) -> P.Piece:
    """One chunk of ``d·q + m`` blocks in ``mode``: codes, scales, and the zero points
    (asym, requant) or the correction's codes and scales (overlay: codes 1, scale m)."""
    x = _block_min_checks(rows, start, c, mode)
    n = rows.shape[0]
    bufs = {"codes": c.codes_into(rows, P.buffer("codes", (n, c.code_bytes), np.uint8)), "scales": x.d}
    if mode == "overlay":
        assert c.scale is not None
        corr = P.buffer("corr", (n, buffer_size(CORRECTION_STORAGE, c.block_size)), np.uint8)
        corr[...] = _CORRECTION_ONES
        if x.mzero is not None:
            corr[x.mzero] = 0
            x.m[x.mzero] = c.scale.one(x.m[x.mzero])
        bufs.update(corr_codes=corr, corr_scales=x.m)
        return P.Piece(x.keep, bufs)
    z = _minimum_check(x.d, x.m, c.code_range()[1]) if mode == "asym" else x.z  # asym: _asym_exact said so
    assert z is not None
    bufs["zero_points"] = z.astype(_ZP)
    return P.Piece(x.keep, bufs)


def _requant_finish(keeps: Sequence[tuple[np.ndarray, np.ndarray | None, float]], report: TensorPlan) -> list[Any]:
    """The collector of ``--q4-1 requantize``: no record, the error in the report."""
    err = max((e for _, _, e in keeps), default=0.0)
    report.status = VALUE_EXACT if err == 0 else LOSSY
    report.max_abs_error = err
    report.reason = "--q4-1 requantize: nearest integer zero points"
    return []


def _block_min_finish(name: str, c: BlockCodec, keeps: Sequence[tuple[np.ndarray, np.ndarray | None, float]],
                      report: TensorPlan) -> list[tuple[str, KVValue]]:
    return _substitution_records(name, c, [(i, o) for i, o, _ in keeps], report)


def _plan_block_min(info: "G.GGUFTensorInfo", c: BlockCodec, q4_1: str, compact: bool = True) -> _Planned:
    """``d·q + m`` blocks: plain asymmetric per-block affine when exact, else the compact
    form of § 11 (where the table says so and ``compact``) or the exact minimum overlay of
    § 3a; ``--q4-1 requantize``: nearest zero points (lossy)."""
    blocks = _blocks(info)
    mode = "requant" if q4_1 == "requantize" else "asym" if _asym_exact(blocks, c) else "overlay"
    if mode == "overlay" and compact and c.compact:
        return _plan_compact(info, c, q4_1)
    if mode == "overlay":  # head, base (the scales d: substituted), correction
        entries = _overlay_layout(info, c, blocks.shape[0])
        slots = _scale_slots(c, 1)
        slots.update(corr_codes=P.Slot(2, 0, buffer_size(CORRECTION_STORAGE, c.block_size)),
                     corr_scales=P.Slot(2, 1, slots["scales"].row_bytes))
        scaled = entries[1].name
    else:
        entries = (P.Entry(info.name, _block_desc(_shape(info), c, blocks.shape[0], zero_points=True)),)
        slots = _scale_slots(c, 0, zero_points=True)
        scaled = info.name
    finish = _requant_finish if mode == "requant" else functools.partial(_block_min_finish, scaled, c)
    plan = P.Plan(entries, blocks, PAR_BLOCKS, slots, functools.partial(_block_min_chunk, c, mode),
                  functools.partial(_block_min_scan, c, mode), finish)
    return _Planned(plan, _mapping_text(c, mode))


def _overlay_layout(info: "G.GGUFTensorInfo", c: BlockCodec, nb: int) -> tuple[P.Entry, ...]:
    """The exact minimum overlay (docs/conversion-rules.md § 3a): head ``name`` (float32,
    overlay, add), members ``name.base`` (the codes, scale d) and ``name.min`` (codes 1,
    scale m), in file order."""
    name = info.name
    shape = _shape(info)
    table = _table()["overlay"]
    head = Descriptor(
        element_type=element_type("float32"),
        shape=shape,
        buffers=(),
        layout=CompositeHead(composition_rule=RULE_OVERLAY, combine_op=OP_ADD, member_count=2),
    )
    base = _block_desc(shape, c, nb, shard=True, role=ROLE_BASE)
    corr = _block_desc(shape, c, nb, storage=CORRECTION_STORAGE, shard=True, role=ROLE_CORRECTION)
    return (P.Entry(name, head, ()), P.Entry(name + table["base_suffix"], base),
            P.Entry(name + table["correction_suffix"], corr))


def _overlay_note() -> str:
    """How much the overlay costs: e.g. "Q4_1/Q5_1 stored as the exact minimum overlay:
    7 (Q5_1: 11) bits per weight against 5 (6)", from the codecs."""
    cost = []
    for c in codecs():
        if c.mapping == "block_min" and c.scale is not None:
            scale_bits = 2 * 8 * np.dtype(c.scale.view).itemsize  # d of the base, m of the correction
            ours = c.storage.bits + element_type(CORRECTION_STORAGE).bits + scale_bits / c.block_size
            cost.append((c.name, f"{ours:g}", f"{c.block_bytes * 8 / c.block_size:g}"))
    (_, ours0, theirs0), rest = cost[0], cost[1:]
    return (f"{'/'.join(n for n, _, _ in cost)} stored as the exact minimum overlay: {ours0}"
            + "".join(f" ({n}: {o})" for n, o, _ in rest) + f" bits per weight against {theirs0}"
            + "".join(f" ({t})" for _, _, t in rest))


# ---------------------------------------------------------------------------
# the compact exact forms (docs/conversion-rules.md § 11): Q4_1, Q5_1, Q5_0

#: how the mapping text of a tensor in its compact form starts (the form note looks for it)
COMPACT_TEXT = "compact overlay(add)"


class _CompactKeep(NamedTuple):
    """What one chunk of a compact form keeps: the substituted scales d (block indices,
    originals), the flipped blocks and their original minimums, and the first block whose
    compact form is not exact (with why), if any."""

    sub: np.ndarray
    sub_orig: np.ndarray | None
    flips: np.ndarray
    flip_orig: np.ndarray | None
    bad: tuple[int, str] | None


@dataclass
class _CompactChunk:
    """A chunk of blocks in the compact form: the base scales (flipped blocks negated), the
    plane's scales ``16·s``, the broadcast minimum's scales, the flipped blocks' mask."""

    s: np.ndarray
    hs: np.ndarray | None
    ms: np.ndarray | None
    flip: np.ndarray | None
    keep: _CompactKeep


def _first_bad(start: int, masks: Sequence[tuple[np.ndarray, str]]) -> tuple[int, str] | None:
    """The first block (index from ``start``) flagged by one of ``masks``, with its reason."""
    hits = [(int(np.argmax(m)), why) for m, why in masks if m.any()]
    return (start + min(hits)[0], min(hits)[1]) if hits else None


def _compact_minimum(rows: np.ndarray, start: int, c: BlockCodec, s: np.ndarray,
                     masks: list[tuple[np.ndarray, str]]) -> tuple[np.ndarray, np.ndarray, _Substituted]:
    """The broadcast minimum of a chunk: its scales (``m``; ``qmax·s`` on flipped blocks),
    the flipped blocks' mask and (indices, original minimums); ``masks`` gets the blocks
    the form cannot hold."""
    m, mzero = P.checked(rows, start, c, "m", "minimum m", True)
    assert m is not None
    qmax = c.code_range()[1]
    mz = np.zeros(m.shape, bool) if mzero is None else mzero
    at = np.flatnonzero(mz)  # the blocks with a minimum ±0 (few): qmax·s only there
    v, exact = C.exact_multiple(s[at], qmax)
    flip = np.zeros(m.shape, bool)
    flip[at] = C.flip_mask(s[at], mz[at]) & exact
    inexact = np.zeros(m.shape, bool)
    inexact[at] = (s[at] > 0) & ~exact
    masks.append((mz & ~(s > 0), "minimum ±0 with a scale that is not > 0"))
    masks.append((inexact, f"minimum ±0 and {qmax}·d is not exact in float16"))
    masks.append((~mz & C.flipped(s, m, qmax), f"d < 0 and m = {qmax}·(−d): reads as a flipped block"))
    where = np.flatnonzero(flip)
    orig = m[where].copy()
    m[where] = v[flip[at]]
    neg = np.signbit(orig)  # (the record keeps only the −0 minimums: a flipped block's is +0 otherwise)
    return m, flip, (where[neg] + start, orig[neg])


def _compact_checks(rows: np.ndarray, start: int, c: BlockCodec) -> _CompactChunk:
    """One chunk of a compact form checked: refusals raised (as the per-element form
    does), zero scales substituted, ±0 minimums flipped; the blocks the compact form cannot
    hold exactly are kept (the pass then writes the tensor in its per-element form)."""
    assert c.scale is not None
    s, dzero = P.checked(rows, start, c, c.scale.field, f"scale {c.scale.field}", True)
    assert s is not None
    sub = _substitute(s, dzero, rows, start, c)
    masks: list[tuple[np.ndarray, str]] = []
    hs = None
    if c.hi_plane is not None:
        hs, exact = C.exact_multiple(s, 16)
        masks.append((~exact, "16·d overflows float16"))
    ms, flip, flips = (None, None, (_NO_BLOCKS, None))
    if c.mapping == "block_min":
        ms, flip, flips = _compact_minimum(rows, start, c, s, masks)
        s[flip] = -s[flip]
        if hs is not None:
            hs[flip] = -hs[flip]
    return _CompactChunk(s, hs, ms, flip, _CompactKeep(*sub, *flips, _first_bad(start, masks)))


def _compact_scan(c: BlockCodec, rows: np.ndarray, start: int) -> P.Piece:
    return P.Piece(_compact_checks(rows, start, c).keep)


def _compact_chunk(c: BlockCodec, rows: np.ndarray, start: int) -> P.Piece:
    """One chunk in the compact form: the uint4 plane of the low bits (flipped blocks XOR
    0xFF), the high-bit plane (flipped: XOR 0x55), the scales of each member."""
    x = _compact_checks(rows, start, c)
    n, k = rows.shape[0], c.block_size
    qs = c.fields["qs"]
    lo = K.split_to_pairs(rows[:, qs : qs + k // 2], 0, out=P.buffer("codes", (n, k // 2), np.uint8))
    bufs = {"codes": lo, "scales": x.s}
    if c.hi_plane is not None:
        assert x.hs is not None
        hi = C.plane_from_bits(rows[:, c.fields["qh"] : c.fields["qh"] + k // 8], signed_hi=bool(c.code_offset))
        if x.flip is not None:
            C.flip_codes(hi, x.flip, 0x55)
        bufs.update(hi_codes=hi, hi_scales=x.hs)
    if x.flip is not None:
        C.flip_codes(lo, x.flip, 0xFF)
        bufs["min_scales"] = x.ms  # type: ignore[assignment]
    return P.Piece(x.keep, bufs)


def _compact_layout(info: "G.GGUFTensorInfo", c: BlockCodec, nb: int) -> tuple[P.Entry, ...]:
    """Head ``name`` (float32, overlay, add), then ``name.base`` (uint4 low bits, scale d),
    ``name.hi`` (the 5th-bit plane, scale 16·d; 5-bit types) and ``name.min`` (the broadcast
    minimum; ``d·q + m`` types), in emission order."""
    assert c.scale is not None
    name, shape, sfx = info.name, _shape(info), _table()["overlay"]
    members = [P.Entry(name + sfx["base_suffix"], _block_desc(shape, c, nb, storage=C.LO_STORAGE, shard=True,
                                                              role=ROLE_BASE))]
    if c.hi_plane is not None:
        members.append(P.Entry(name + sfx["hi_suffix"], _block_desc(shape, c, nb, storage=c.hi_plane.name, shard=True,
                                                                    role=ROLE_CORRECTION)))
    if c.mapping == "block_min":
        members.append(P.Entry(name + sfx["correction_suffix"], C.broadcast_member(shape, c.block_size, c.scale.name),
                               fixed={0: C.broadcast_code().tobytes()}))
    head = Descriptor(element_type=element_type("float32"), shape=shape, buffers=(),
                      layout=CompositeHead(composition_rule=RULE_OVERLAY, combine_op=OP_ADD, member_count=len(members)))
    return (P.Entry(name, head, ()), *members)


def _compact_slots(c: BlockCodec, entries: tuple[P.Entry, ...]) -> dict[str, P.Slot]:
    k, sb = c.block_size, _scale_slots(c, 1)["scales"].row_bytes
    slots = {"codes": P.Slot(1, 0, k // 2), "scales": P.Slot(1, 1, sb)}
    if c.hi_plane is not None:
        slots.update(hi_codes=P.Slot(2, 0, buffer_size(c.hi_plane, k)), hi_scales=P.Slot(2, 1, sb))
    if c.mapping == "block_min":
        slots["min_scales"] = P.Slot(len(entries) - 1, 1, sb)
    return slots


def _compact_text(c: BlockCodec, bits_in: float, bits_out: float) -> str:
    """E.g. "compact overlay(add): uint4 + uint2 hi (16·d) + broadcast f16 minimum, K=32 f16
    (exact; GGUF 6 → 7.5 bits/weight)"."""
    assert c.scale is not None
    parts = [C.LO_STORAGE]
    if c.hi_plane is not None:
        parts.append(f"{c.hi_plane.name} hi{' − 1' if c.code_offset else ''} (16·d)")
    if c.mapping == "block_min":
        parts.append(f"broadcast {c.scale.abbrev} minimum")
    return (f"{COMPACT_TEXT}: {' + '.join(parts)}, K={c.block_size} {c.scale.abbrev} "
            f"(exact; GGUF {bits_in:.4g} → {bits_out:.4g} bits/weight)")


def _compact_finish(names: tuple[str, ...], c: BlockCodec, elements: int, keeps: Sequence[_CompactKeep],
                    report: TensorPlan) -> list[tuple[str, KVValue]]:
    """The records of a compact form: the base's substituted scales d, the broadcast
    minimum's flipped blocks (their stand-in scales ``qmax·s`` for the original ±0 minimums,
    the same encoding); the mapping text with the bits per weight."""
    recs = _substitution_records(names[1], c, [(k.sub, k.sub_orig) for k in keeps], report)
    idx, orig = _records_of([(k.flips, k.flip_orig) for k in keeps], c)
    if idx.size:
        recs.append((scale_record_key(names[-1]), KVValue("bytes", encode_scale_record(idx, orig))))
    n = max(elements, 1)
    report.mapping = _compact_text(c, 8 * report.bytes_in / n, 8 * report.bytes_out / n)
    return recs


def _per_element(info: "G.GGUFTensorInfo", c: BlockCodec, q4_1: str, keeps: Sequence[_CompactKeep]) -> P.Plan | None:
    """The relayout of a compact plan: the per-element form (§§ 2, 3a) when a block is
    not exact in the compact form (None: the compact form stands)."""
    bad = next((k.bad for k in keeps if k.bad is not None), None)
    if bad is None:
        return None
    old = _PLANNERS[c.mapping](info, c, q4_1, False).plan
    note = f" (compact form not exact: block {bad[0]}: {bad[1]})"

    def finish(keeps: list[Any], report: TensorPlan) -> list[Any]:
        report.mapping += note
        return old.finish(keeps, report)

    return dataclasses.replace(old, finish=finish)


def _compact_note(jobs: Sequence[_Job]) -> str:
    """What the compact forms cost, per GGML type present: e.g. "Q4_1, Q5_1 in the compact
    exact forms (docs/conversion-rules.md § 11): Q4_1 5 → 5, Q5_1 6 → 7.5 bits per weight
    (GGUF → Hurray; the per-element forms: 7, 11)"."""
    types = list(dict.fromkeys(j.plan.source_type for j in jobs))
    cost, old = [], []
    for t in types:
        c = codec(t)
        assert c is not None and c.scale is not None
        sb = 8 * np.dtype(c.scale.view).itemsize / c.block_size  # one scale per block and member
        members = [C.LO_STORAGE] + ([c.hi_plane.name] if c.hi_plane is not None else [])
        ours = sum(element_type(m).bits + sb for m in members) + (sb if c.mapping == "block_min" else 0)
        legacy = c.storage.bits + sb + (element_type(CORRECTION_STORAGE).bits + sb if c.mapping == "block_min" else 0)
        cost.append(f"{t} {c.block_bytes * 8 / c.block_size:g} → {ours:g}")
        old.append(f"{legacy:g}")
    return (f"{', '.join(types)} in the compact exact forms (docs/conversion-rules.md § 11): {', '.join(cost)} "
            f"bits per weight (GGUF → Hurray; the per-element forms: {', '.join(old)})")


def _plan_compact(info: "G.GGUFTensorInfo", c: BlockCodec, q4_1: str) -> _Planned:
    """The compact form of docs/conversion-rules.md § 11, written in the one pass; the
    per-element form instead where a block needs it (:func:`_per_element`).  The report's
    mapping text is the per-element form's until the compact form's collector says otherwise."""
    blocks = _blocks(info)
    entries = _compact_layout(info, c, blocks.shape[0])
    n = int(np.prod(_shape(info), dtype=np.int64))
    plan = P.Plan(entries, blocks, PAR_BLOCKS, _compact_slots(c, entries), functools.partial(_compact_chunk, c),
                  functools.partial(_compact_scan, c),
                  functools.partial(_compact_finish, tuple(e.name for e in entries), c, n),
                  relayout=functools.partial(_per_element, info, c, q4_1))
    return _Planned(plan, _mapping_text(c, "overlay" if c.mapping == "block_min" else c.mapping))


def _plan_plain(info: "G.GGUFTensorInfo", c: BlockCodec, q4_1: str, compact: bool = True) -> _Planned:
    """A plain type: the bytes copied as they are (by the kernel where it can)."""
    desc = Descriptor(element_type=c.storage, shape=_shape(info), buffers=(BufferHandle.cpu(info.nbytes),))
    return _Planned(P.Plan((P.Entry(info.name, desc),), copy=(info.data, info.data_offset)), c.storage.name)


#: how each mapping kind of the table is planned
_PLANNERS: dict[str, Callable[["G.GGUFTensorInfo", BlockCodec, str, bool], _Planned]] = {
    "plain": _plan_plain,
    "block": _plan_block,
    "mxfp": _plan_block,
    "block_min": _plan_block_min,
}



def _check_options(fallback: str | None, q4_1: str = "overlay") -> None:
    fallbacks.check(fallback)
    if q4_1 not in ("overlay", "requantize"):
        raise UsageError(f"unknown --q4-1 mode {q4_1!r} (overlay or requantize)")
    if fallback == fallbacks.EXACT and q4_1 == "requantize":
        raise UsageError("--fallback exact keeps every value exact: it cannot be combined with --q4-1 requantize")


@functools.cache
def reference_dequantizer(t: "G.GGMLType") -> Callable[[np.ndarray], np.ndarray] | None:
    """gguf-py's reference dequantizer for a GGML type (``None`` when it has none): the
    oracle of ``verify`` and the decoder of import fallbacks.  Probed once per type."""
    if t.family == "removed" or t.name in _table()["fallback"]["no_reference_dequantizer"]:
        return None  # gguf-py lacks them, or has their block size wrong (docs/format-notes.md § 1.3)
    try:
        from gguf import GGMLQuantizationType
        from gguf import quants as gq
    except ImportError:  # pragma: no cover - gguf is a dependency
        return None
    try:
        qt = GGMLQuantizationType[t.name]
        gq.dequantize(np.zeros((1, t.block_bytes), dtype=np.uint8), qt)  # probe: raises if unsupported
    except (KeyError, NotImplementedError, ValueError):
        return None
    return lambda raw: gq.dequantize(raw, qt)


def dequantize_gguf(info: "G.GGUFTensorInfo", *, out: np.ndarray | None = None, strict: bool = True,
                    threads: int | None = None) -> np.ndarray:
    """The float32 values of a GGUF tensor (numpy order, shape ``info.shape``) as gguf-py decodes
    them: its reference dequantizer for block types (the oracle ``verify`` holds the shared
    dequantizer to, bit for bit, for every exactly mapped type), numpy's cast for plain
    types.  ``out`` as for :func:`hurray_interop.dequant.dequantize`; ``strict`` and ``threads``
    change nothing here (every GGUF value is defined; gguf-py decodes in this thread).
    :class:`UnsupportedError` for a type gguf-py has no decoder for."""
    t, shape = info.ggml_type, _shape(info)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif (not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != shape
          or not out.flags.c_contiguous or not out.flags.writeable):
        got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
        raise UsageError(f"out must be a writeable C-contiguous float32 array of shape {shape}, got {got}", tensor=info.name)
    flat = out.reshape(-1)
    if t.dtype() is not None:
        flat[...] = info.data.view(t.dtype())
        return out
    decode = reference_dequantizer(t)
    if decode is None:
        raise UnsupportedError(f"gguf-py has no decoder for {t.name}: its values cannot be given", tensor=info.name)
    blocks = _blocks(info)
    per = t.block_elements
    for sl in _chunks(blocks.shape[0], 1 << 14):  # bounded temporaries for any tensor size
        flat[sl.start * per : sl.stop * per] = decode(blocks[sl].reshape(1, -1)).reshape(-1)
    return out


def _fallback_values(deq: Callable[[np.ndarray], np.ndarray], fallback: str, lossless: bool,
                     rows: np.ndarray) -> tuple[np.ndarray, float]:
    """A chunk of rows decoded by gguf-py and cast to ``fallback``; the error measured
    (not when ``lossless``)."""
    vals = np.asarray(deq(rows), dtype=np.float32)
    stored = fallbacks.cast(vals, fallback)
    meter = fallbacks.ErrorMeter()
    if not lossless:
        meter.add(vals, stored)
    return stored, meter.error


def _fallback_chunk(deq: Callable[[np.ndarray], np.ndarray], fallback: str, lossless: bool,
                    rows: np.ndarray, start: int) -> P.Piece:
    stored, err = _fallback_values(deq, fallback, lossless, rows)
    return P.Piece(err, {"values": stored.reshape(-1).view(np.uint8)})


def _fallback_scan(deq: Callable[[np.ndarray], np.ndarray], fallback: str, rows: np.ndarray, start: int) -> P.Piece:
    return P.Piece(_fallback_values(deq, fallback, False, rows)[1])


def _fallback_finish(fallback: str, reason: str, keeps: Sequence[float], report: TensorPlan) -> list[Any]:
    """The collector of a fallback: no record; the error (the max of the chunks' maxima)
    and the reason in the report."""
    err = max(keeps, default=0.0)
    report.status = fallbacks.status(err)
    report.max_abs_error = err
    report.reason = f"{reason}; stored dequantized by gguf-py's reference dequantizer"
    return []


def _plan_fallback(info: "G.GGUFTensorInfo", fallback: str, reason: str,
                   deq: Callable[[np.ndarray], np.ndarray]) -> _Planned:
    """``--fallback DTYPE``: the values gguf-py decodes, rows at a time, cast to DTYPE
    (the error measured as they are written; a dry run only measures, and not at all
    when the cast is lossless)."""
    t = info.ggml_type
    shape = _shape(info)
    row_bytes = info.ne[0] // t.block_elements * t.block_bytes if info.ne else info.nbytes
    nrows = info.nbytes // row_bytes if row_bytes else 0
    out_dt = fallbacks.dtype(fallback)
    rows_per = max(1, FALLBACK_VALUES // max(info.ne[0], 1))
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    desc = Descriptor(element_type=element_type(fallback), shape=shape, buffers=(BufferHandle.cpu(n * out_dt.itemsize),))
    raw = info.data.reshape(nrows, row_bytes) if nrows else info.data.reshape(0, max(row_bytes, 1))
    lossless = fallbacks.lossless(np.float32, fallback)  # gguf-py decodes to float32
    per_row = (n // nrows if nrows else 0) * out_dt.itemsize
    plan = P.Plan((P.Entry(info.name, desc),), raw, rows_per, {"values": P.Slot(0, 0, per_row)},
                  functools.partial(_fallback_chunk, deq, fallback, lossless),
                  None if lossless else functools.partial(_fallback_scan, deq, fallback),
                  functools.partial(_fallback_finish, fallback, reason))
    return _Planned(plan, f"{fallback} (fallback)")


def _exact_note(jobs: Sequence[_Job]) -> str:
    """What ``--fallback exact`` cost: e.g. "--fallback exact: 3 tensor(s) in their exact
    expanded form; 1,234 → 2,345 bytes of tensor data (+90.0 %)"."""
    ex = [j.plan for j in jobs if j.expanded]
    a, b = sum(j.plan.bytes_in for j in jobs), sum(j.plan.bytes_out for j in jobs)
    return (f"--fallback exact: {len(ex)} tensor(s) in their exact expanded form; {a:,} → {b:,} bytes of "
            f"tensor data ({100 * (b - a) / max(a, 1):+.1f} %)")


def _refusal_reason(type_name: str, family: str) -> str:
    r = _table()["refusals"]
    return r["by_type"].get(type_name) or r["by_family"].get(family) or r["by_family"]["default"]


def _plan_only(report: ConversionReport, src: str, refusal: str, dst: Any, dry_run: bool) -> bool:
    """After planning: raise if anything is refused (unless dry run); True when nothing is to be written."""
    if report.refused:
        from . import gguf_exact

        exact = any(gguf_exact.has_form(t.source_type) for t in report.refused)
        report.hint = fallback_hint(exact, fallbacks.DTYPE_CHOICES)
    if report.refused and not dry_run:
        raise ConversionRefused(
            f"{len(report.refused)} tensor(s) {refusal}; nothing was written ({report.hint})",
            path=src,
            reasons=[(t.name, t.source_type, t.reason) for t in report.refused],
            report=report,
        )
    return dry_run or dst is None


_Executor = P.Output | P.DryRun


def _fresh(info: "G.GGUFTensorInfo") -> _Job:
    t = info.ggml_type
    return _Job(info, TensorPlan(name=info.name, source_type=t.name, mapping="", status=EXACT, bytes_in=info.nbytes))


def _carry_out(job: _Job, planned: _Planned, out: _Executor) -> None:
    """``planned`` written to (or, on a dry run, scanned for) ``out``; the report row, the
    Hurray names and the records from the plan that stands and its collector."""
    job.plan.mapping = planned.mapping
    done = out.execute(planned.plan)
    job.names = done.plan.names
    job.plan.bytes_out = done.plan.bytes_out
    job.records = [*done.plan.finish(done.keeps, job.plan), *done.streamed]


def _refused(job: _Job, reason: str, mapping: str, hint: str = "") -> None:
    job.plan.status, job.plan.reason, job.plan.mapping, job.plan.hint = REFUSED, reason, mapping, hint


def _import_tensor(info: "G.GGUFTensorInfo", out: _Executor, *, fallback: str | None, q4_1: str) -> _Job:
    """One tensor planned and carried out on ``out``.  A refusal found on the way (the
    executor takes back what was written of the tensor) hands it to the fallback, if
    any, which writes its own form in its place."""
    t = info.ggml_type
    job = _fresh(info)
    try:
        c = codec(t.name)
        if c is None:
            raise P.Refuse(_refusal_reason(t.name, t.family))
        _carry_out(job, _PLANNERS[c.mapping](info, c, q4_1), out)
        return job
    except P.Refuse as r:
        reason = r.reason
    job = _fresh(info)
    if fallback == fallbacks.EXACT:
        _import_exact(job, reason, out)
    elif fallback:
        deq = reference_dequantizer(t)
        if deq is None:
            _refused(job, reason + "; no reference dequantizer for a fallback", "")
        else:
            _carry_out(job, _plan_fallback(info, fallback, reason, deq), out)
    else:
        from . import gguf_exact

        _refused(job, reason, "-", EXACT_FORM_HINT if gguf_exact.has_form(t.name) else "")
    return job


def _import_exact(job: _Job, reason: str, out: _Executor) -> None:
    """``--fallback exact``: the tensor's exact expanded form (docs/conversion-rules.md § 9), or
    refused when its type has none or a super-block scale is not finite."""
    from . import gguf_exact

    info = job.info
    try:
        if not gguf_exact.has_form(info.ggml_type.name):
            raise P.Refuse(reason + "; no exact expanded form (--fallback exact)")
        missing = gguf_exact.missing_decoder(info.ggml_type)
        if missing:
            raise P.Refuse(f"{reason}; its exact form (--fallback exact) needs {missing}")
        plan = gguf_exact.plan(info.name, info.ggml_type.name, _shape(info), _blocks(info), reason)
        _carry_out(job, _Planned(plan, ""), out)
    except P.Refuse as r:
        _refused(job, r.reason, "-")
        return
    job.expanded = True


# ===========================================================================
# import: driver


def _progress_total(tensors: Sequence["G.GGUFTensorInfo"]) -> int:
    return sum(t.nbytes for t in tensors)


@contextlib.contextmanager
def _whole_model(src: "G.GGUFFile | S.SplitSet") -> Iterator[Any]:
    """The model ``src`` belongs to: the file itself, or its whole split set (checked; bad
    sets raise a located SplitSetError).  Shards opened here are closed on leaving;
    ``src`` stays the caller's.  A file without split keys never loads the split module."""
    if isinstance(src, G.GGUFFile) and not G.has_split_keys(src):
        yield src
        return
    from ..formats import gguf_split as S

    if isinstance(src, S.SplitSet):
        yield S.SplitModel(src)
        return
    with S.borrowed_set(src) as s:
        yield src if s is None else S.SplitModel(s)


def _input_paths(gf: Any, src: str) -> tuple[str, ...]:
    return tuple(os.fspath(p) for p in gf.split_set.paths) if gf.split_set is not None else (src,)


def gguf_to_hurray(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str] | None,
    *,
    fallback: str | None = None,
    q4_1: str = "overlay",
    dry_run: bool = False,
    force: bool = False,
    progress: Progress = None,
    jobs: int | None = None,
) -> ConversionReport:
    """Convert a GGUF file into a .hrry file (exact, or refused; see the module docstring).

    Raises :class:`ConversionRefused` (with the report in ``details['report']``)
    when any tensor is not exactly representable and no ``fallback`` was chosen;
    nothing is written then.  With ``dry_run`` the plan is returned instead and
    nothing is written.  ``jobs``: threads converting chunks (default: :func:`hurray_interop.parallel.jobs`).
    """
    _check_options(fallback, q4_1)
    src = os.fspath(src)
    with use_jobs(jobs), G.read_gguf(src) as f, _whole_model(f) as gf:
        return _gguf_to_hurray_open(gf, src, dst, fallback=fallback, q4_1=q4_1, dry_run=dry_run, force=force,
                                    progress=progress)


def _import_pass(gf: Any, out: _Executor, *, fallback: str | None, q4_1: str, progress: Progress) -> list[_Job]:
    """Every tensor planned and carried out on ``out`` (written in the same pass, or on a
    dry run only scanned).  The first refusal (or overlay name collision) deletes the
    temporary output; the remaining tensors are then only scanned, so the report names
    every refused tensor."""
    sources = {info.name for info in gf.tensors}
    seen: set[str] = set()
    total, done = _progress_total(gf.tensors), 0
    planned: list[_Job] = []
    for info in gf.tensors:
        job = _import_tensor(info, out, fallback=fallback, q4_1=q4_1)
        planned.append(job)
        gf.release_pages()  # bounded resident memory: see GGUFFile.release_pages
        clash = any(n in seen or (n != info.name and n in sources) for n in job.names)
        seen.update(job.names)
        if clash or job.plan.status == REFUSED:
            out, progress = out.dropped(), None
        if progress:
            done += info.nbytes
            progress(done, total)
    return planned


def _import_report(report: ConversionReport, gf: Any, planned: list[_Job], src: str, dst: Any, dry_run: bool) -> bool:
    """The report of an import pass; raises on name collisions and (unless a dry run)
    refusals.  True when nothing is to be written."""
    report.tensors = [j.plan for j in planned]
    names = [n for j in planned for n in j.names]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise UnsupportedError(
            f"overlay member names collide with existing tensor names: {', '.join(dup[:5])}", path=src
        )
    if any(j.plan.status == LOSSY for j in planned):
        report.notes.append("lossy tensors were stored as chosen; see max abs error per tensor")
    if any(j.plan.mapping.startswith("overlay") and not j.expanded for j in planned):
        report.form_notes.append(_overlay_note())
    compact = [j for j in planned if j.plan.mapping.startswith(COMPACT_TEXT)]
    if compact:
        report.form_notes.append(_compact_note(compact))
    if any(j.expanded for j in planned):
        report.form_notes.append(_exact_note(planned))
    if gf.split_set is not None:
        report.notes.append(gf.describe())
    return _plan_only(report, src, "cannot be converted exactly", dst, dry_run)


def _nonzero_span(g: np.ndarray, step: int = 1 << 20) -> tuple[int, int]:
    """First and one-past-last non-zero byte of ``g`` (which has one), scanned in windows."""
    first = next(i + int(np.argmax(g[i : i + step] != 0)) for i in range(0, g.size, step) if g[i : i + step].any())
    for j in range((g.size - 1) // step * step, -1, -step):
        w = g[j : j + step]
        if w.any():
            return first, j + w.size - int(np.argmax(w[::-1] != 0))
    raise AssertionError("unreachable: g has a non-zero byte")


def _padding_runs(gf: Any) -> list[tuple[int, int, np.ndarray]]:
    """The bytes that are not zero outside the tensor data of every file of ``gf`` (padding
    and gaps between tensors), per region from its first to its last non-zero byte:
    ``(shard, absolute offset, bytes)``.  Refused beyond :data:`MAX_PADDING_BYTES`."""
    files = gf.shards if gf.split_set is not None else [gf]
    runs = []
    for part, f in enumerate(files):
        for start, g in sorted(f.nonzero_padding.items()):
            a, b = _nonzero_span(g)
            runs.append((part, start + a, g[a:b]))
    total = sum(r[2].size for r in runs)
    if total > MAX_PADDING_BYTES:
        # name the file and the region where the count passes the limit (in a split set: its shard)
        part, at, _ = runs[int(np.searchsorted(np.cumsum([r[2].size for r in runs]), MAX_PADDING_BYTES, "right"))]
        raise ConversionRefused(
            f"{total} bytes of padding and gaps between tensors are not zero (the limit is passed in the region at "
            f"offset {at}): more than the "
            f"{MAX_PADDING_BYTES} bytes an import records, so an export could not write them back; nothing was written",
            path=files[part].path,
        )
    return runs


def _import_kv(gf: Any, planned: list[_Job], padding: list[tuple[int, int, np.ndarray]] = ()) -> dict[str, KVValue]:
    """The .hrry KV section of an import: GGUF's metadata, then the records."""
    kv_items, kv_types = _kv_to_hurray(gf)
    tensors = json.dumps([[t.name, t.type_name, list(t.ne), t.offset] for t in gf.tensors], separators=(",", ":"))
    records: list[tuple[str, KVValue]] = [
        (K_SOURCE, KVValue("string", "gguf")),
        (K_VERSION, KVValue("uint64", gf.version)),
        (K_ALIGN, KVValue("uint64", gf.alignment)),
        (K_TAIL, KVValue("uint64", gf.tail_bytes)),
        (K_TYPES, KVValue("array", kv_types, "string")),
        (K_TENSORS, KVValue("string", tensors)),
    ]
    if gf.split_set is not None:
        records.append((K_SPLIT, KVValue("string", gf.split_set.split_layout().dumps())))
    if padding:
        records.append((K_PADDING, KVValue("bytes", encode_byte_runs(padding))))
    for j in planned:
        records.extend(j.records)
    return dict(kv_items + records)


def _gguf_to_hurray_open(gf: "G.GGUFFile", src: str, dst: str | os.PathLike[str] | None, *, fallback: str | None,
                         q4_1: str, dry_run: bool, force: bool, progress: Progress) -> ConversionReport:
    report = ConversionReport(
        source=src,
        destination=None if dst is None else os.fspath(dst),
        source_format="gguf",
        destination_format="hurray",
        dry_run=dry_run,
    )
    _check_reserved_keys(gf)  # the metadata itself is converted only when writing (vocabularies are big)
    if dry_run or dst is None:
        planned = _import_pass(gf, P.DryRun(), fallback=fallback, q4_1=q4_1, progress=None)
        _import_report(report, gf, planned, src, dst, dry_run)
        try:
            _padding_note(report, _padding_runs(gf) if gf.nonzero_padding else [])
        except ConversionRefused as e:
            report.refusal = e.message
        return report
    from ..core.hrry import HrryWriter

    padding = _padding_runs(gf) if gf.nonzero_padding else []  # refused before anything is written
    fd = None if gf.split_set is not None else P.open_source(gf.path)
    with _closing_fd(fd), HrryWriter(dst, count_at_finish=True, force=force, inputs=_input_paths(gf, src)) as w:
        out = P.Output(w, w.positional(), fd)
        planned = _import_pass(gf, out, fallback=fallback, q4_1=q4_1, progress=progress)
        _import_report(report, gf, planned, src, dst, dry_run)
        _padding_note(report, padding)
        w.finish(_import_kv(gf, planned, padding))
    return report


def _padding_note(report: ConversionReport, padding: list[tuple[int, int, np.ndarray]]) -> None:
    if padding:
        report.notes.append(f"{sum(r[2].size for r in padding)} non-zero byte(s) of padding and gaps between tensors "
                            f"recorded ({K_PADDING}); an export of the recorded layout writes them back")


def plan_gguf(src: str | os.PathLike[str], *, fallback: str | None = None, q4_1: str = "overlay") -> ConversionReport:
    """The per-tensor plan of a GGUF → Hurray conversion (what ``--dry-run`` shows)."""
    return gguf_to_hurray(src, None, fallback=fallback, q4_1=q4_1, dry_run=True)


def plan_gguf_open(gf: "G.GGUFFile | S.SplitSet", *, fallback: str | None = None, q4_1: str = "overlay") -> ConversionReport:
    """:func:`plan_gguf` of a GGUF file (or split set) already open (``inspect`` parses a file once)."""
    _check_options(fallback, q4_1)
    src = (gf.path or "<memory>") if isinstance(gf, G.GGUFFile) else os.fspath(gf.paths[0])  # a file, or a SplitSet
    with _whole_model(gf) as model:
        return _gguf_to_hurray_open(model, src, None, fallback=fallback, q4_1=q4_1, dry_run=True, force=False,
                                    progress=None)


# ===========================================================================
# export


@dataclass
class _Export:
    """The typed plan of one .hrry tensor's export: the GGUF tensor it becomes (GGML type and
    ``ne``), the import's record of it (None: the file has none), what the report says, and
    the source of its bytes (None: refused)."""

    name: str
    plan: TensorPlan
    type_name: str = ""
    ne: tuple[int, ...] = ()
    recorded: "S.TensorRow | None" = None
    source: BlockSource | None = None

    @property
    def offset(self) -> int | None:
        """The recorded offset of the tensor (None: laid out anew)."""
        return None if self.recorded is None else self.recorded.offset


class _Match(NamedTuple):
    """What a matcher found: the GGML type a Hurray tensor is exported as, and its blocks."""

    type_name: str
    source: BlockSource


def _scales_of(t: Tensor, kv: dict[str, KVValue], c: BlockCodec, buffer_index: int = 1) -> np.ndarray:
    """The scales of ``t`` as ``c`` stores them, with recorded substitutions undone."""
    s = t.data[buffer_index].view(c.scale.view)
    key = scale_record_key(t.name, buffer_index)
    rec = kv.get(key)
    return restore_scales(s, rec.value, key=key, rule=c.scale.stand_in, tensor=t.name) if rec is not None else s


def _fits(d: Descriptor, c: BlockCodec, *, storage: str | None = None, symmetric: bool | None = None) -> bool:
    """Does ``d`` hold exactly the blocks of ``c`` (codes of ``storage``, default ``c.storage``),
    row-major, blocked along the last axis?"""
    q = d.quantization
    if not isinstance(q, (MXFP, PerBlockAffine)) or c.scale is None:
        return False
    if isinstance(q, PerBlockAffine) and (q.scale_type.name != c.scale.name or q.symmetric != symmetric):
        return False
    return (
        isinstance(q, MXFP) == (c.mapping == "mxfp")
        and d.element_type.name == (storage or c.storage.name)
        and isinstance(d.layout, RowMajor)
        and d.byte_offset == 0
        and d.rank >= 1
        and q.axis == d.rank - 1
        and q.block_size == c.block_size
        and all(x is not None for x in d.shape)
        and (d.shape[-1] or 0) % c.block_size == 0
    )


def _choose(d: Descriptor, mapping: str, recorded: str | None, **kw: Any) -> BlockCodec | None:
    """The codec of this mapping kind that ``d`` fits: the recorded source type if it is one
    of them, else the one exported without a record (``export = "inferred"``)."""
    fit = [c for c in codecs() if c.mapping == mapping and _fits(d, c, **kw)]
    return next((c for c in fit if c.name == recorded), None) or next((c for c in fit if c.export == "inferred"), None)


def _nblocks(d: Descriptor, c: BlockCodec) -> int:
    n = int(np.prod(d.shape, dtype=np.int64)) if d.shape else 1
    return n // c.block_size


def _check_codes_fit(c: BlockCodec, data: np.ndarray, count: int) -> None:
    """Refuses (:class:`~.gguf_pass.Refuse`) when the Hurray codes ``data`` do not fit ``c``'s GGML codes."""
    st = c.storage
    lo, hi = c.code_range()
    top = 1 << (st.bits - 1) if st.kind == "int" else 1 << st.bits
    slo = -top if st.kind == "int" else 0
    if lo <= slo and top - 1 <= hi:
        return  # every code of the storage fits
    v = unpack(data, st, count)
    if st.packed and st.kind == "int":
        v = sign_extend(v, st.bits)
    if v.size and (int(v.min()) < lo or int(v.max()) > hi):
        raise P.Refuse(f"{st.name} codes outside {c.name}'s range")


def _rows_all(rows: np.ndarray, byte: int) -> np.ndarray:
    """Per row of ``rows`` (uint8): is every byte ``byte``?  Rows of 8 contiguous bytes (the
    correction codes of a 32-weight block) are compared as one uint64 each."""
    if rows.shape[1] == 8 and rows.strides[1] == 1:
        return rows.view("<u8")[:, 0] == np.uint64(byte * 0x0101010101010101)
    return np.all(rows == byte, axis=1)


class _Blocks(ChunkedBlocks):
    """GGML blocks of ``c`` joined from Hurray codes ``(nb, code_bytes)``, scales (read once
    per write by ``scales``) and minimums (computed per chunk by ``mins``, so nothing of
    the size of a tensor is held)."""

    def __init__(self, c: BlockCodec, codes: np.ndarray, scales: Callable[[], np.ndarray], nb: int,
                 mins: Callable[[slice], np.ndarray] | None = None) -> None:
        super().__init__(nb, c.block_bytes, PAR_BLOCKS)
        self.c, self.codes, self.scales, self.mins = c, codes, scales, mins

    def chunk_function(self) -> Callable[[slice], np.ndarray]:
        s = self.scales()

        def chunk(sl: slice) -> np.ndarray:
            into = P.buffer("blocks", (sl.stop - sl.start, self.block_bytes), np.uint8)
            return self.c.join(Parts(self.codes[sl], s[sl], None if self.mins is None else self.mins(sl)), out=into)

        return chunk


def _export_match(t: Tensor, kv: dict[str, KVValue], recorded: str | None) -> _Match:
    """The GGML type this Hurray tensor matches exactly, and its blocks; :class:`~.gguf_pass.Refuse`
    says why there is none."""
    d = t.descriptor
    if recorded is not None and all(c.name != recorded for c in codecs()):  # not a native type
        from . import gguf_exact

        if gguf_exact.has_form(recorded) and gguf_exact.has_record(kv, t.name):
            return _Match(recorded, gguf_exact.export(t, kv, recorded))  # --fallback exact: rebuilt from the record
    if d.is_composite:
        return _export_compact(t, kv, recorded) if _is_compact(t) else _export_overlay(t, kv, recorded)
    if d.shard is not None:
        raise P.Refuse(f"a shard (offset {list(d.shard.offset)} of a {list(d.shard.parent_shape)} parent) "
                       "has no GGUF equivalent")
    q = d.quantization
    if q is None:
        return _export_plain(t)
    c = _block_codec(d, recorded)
    nb = _nblocks(d, c)
    _check_codes_fit(c, t.data[0], nb * c.block_size)
    codes = t.data[0].reshape(nb, c.code_bytes)
    if isinstance(q, PerBlockAffine) and not q.symmetric:
        return _asym_match(t, kv, c, codes)
    return _Match(c.name, _Blocks(c, codes, lambda: _scales_of(t, kv, c), nb))


def _export_plain(t: Tensor) -> _Match:
    d = t.descriptor
    if not isinstance(d.layout, RowMajor) or d.byte_offset != 0:
        raise P.Refuse(f"{_layout_name(d)} layout with byte offset {d.byte_offset} has no GGML equivalent")
    c = next((c for c in codecs() if c.mapping == "plain" and c.storage.name == d.element_type.name), None)
    if c is None:
        raise P.Refuse(f"element type {d.element_type.name} has no GGML equivalent")
    return _Match(c.name, PlainBytes(t.name, t.data[0]))


def _block_codec(d: Descriptor, recorded: str | None) -> BlockCodec:
    """The block codec of the quantized ``d`` (refused when none matches exactly)."""
    q = d.quantization
    c: BlockCodec | None = None
    if isinstance(q, MXFP):
        c = _choose(d, "mxfp", recorded)
        if c is None:
            forms = ", ".join(f"{c.storage.name}, block {c.block_size}" for c in codecs() if c.mapping == "mxfp")
            raise P.Refuse(f"MXFP other than {forms} along the last axis has no GGML equivalent")
    elif isinstance(q, PerBlockAffine):
        c = _choose(d, "block" if q.symmetric else "block_min", recorded, symmetric=q.symmetric)
    if c is None:
        raise P.Refuse("no GGML type matches this layout, scheme, block size or scale type exactly")
    return c


def _record_bytes(kv: dict[str, KVValue], name: str, gtype: str | None, nbytes: int) -> int:
    """The restore record of an exact expanded form rebuilt as ``gtype`` (``nbytes`` GGML bytes):
    counted with the tensor's data, as the import counted it (0 for any other tensor)."""
    from . import gguf_exact

    if gtype is None or not gguf_exact.has_form(gtype):
        return 0
    return gguf_exact.stored_record_bytes(kv, name)


def _layout_name(d: Descriptor) -> str:
    return {RowMajor: "row-major"}.get(type(d.layout), type(d.layout).__name__)


def _asym_match(t: Tensor, kv: dict[str, KVValue], c: BlockCodec, codes: np.ndarray) -> _Match:
    """Codes with integer zero points → ``d·q + m`` blocks when m = −z·d is exact in the scale type."""
    nb = codes.shape[0]
    scales = _scales_of(t, kv, c)
    zp = t.data[t.descriptor.quantization.zero_point_buffer_index].view(_ZP)  # type: ignore[union-attr]
    bad = _first_inexact_minimum(scales, zp, nb, c.code_range()[1])
    if bad is not None:
        raise P.Refuse(f"block {bad}: zero point × scale is not an f16-exact minimum")
    return _Match(c.name, _Blocks(c, codes, lambda: scales, nb, lambda sl: minimum_of(zp[sl], scales[sl].astype(np.float32))))


def _first_inexact_minimum(scales: np.ndarray, zp: np.ndarray, nb: int, qmax: int) -> int | None:
    """The first of the ``nb`` blocks whose zero point is not a minimum m = f16(−z·d) in the
    sense of :func:`~.gguf_codec.zero_point_misses` (the one statement of the proof), or None."""
    for sl in _chunks(nb):
        d32 = scales[sl].astype(np.float32)
        differs = zero_point_misses(d32, zp[sl], minimum_of(zp[sl], d32).astype(np.float32), qmax)
        if differs.any():
            return sl.start + int(np.argmax(differs))
    return None


def _overlay_members(t: Tensor) -> tuple[Tensor, Tensor]:
    """The base and correction members of an exact minimum overlay (refused when ``t`` is none)."""
    head = t.descriptor
    lay = head.layout
    assert isinstance(lay, CompositeHead)
    if lay.composition_rule != RULE_OVERLAY or lay.combine_op != OP_ADD or len(t.members) != 2:
        raise P.Refuse("only the exact minimum overlay (overlay, add, two members) has a GGML equivalent")
    by_role = {m.descriptor.composite_member.role: m for m in t.members if m.descriptor.composite_member}
    base, corr = by_role.get(ROLE_BASE), by_role.get(ROLE_CORRECTION)
    if base is None or corr is None:
        raise P.Refuse("overlay without one base and one correction member")
    for m in (base, corr):
        sh = m.descriptor.shard
        if m.descriptor.shape != head.shape or (sh is not None and any(sh.offset)):
            raise P.Refuse(f"overlay member {m.name!r} does not cover the whole tensor")
    if head.element_type.name != "float32":
        raise P.Refuse("overlay head is not float32")
    return base, corr


def _check_zero_minimum(cs: np.ndarray, zero: np.ndarray, start: int, name: str) -> None:
    """A minimum m = ±0 is stored as correction codes 0 with the scale ±1 (the sign of m,
    docs/conversion-rules.md § 3a): any other scale on such a block contradicts the form."""
    if not zero.any():
        return
    s = cs[zero]
    bad = np.abs(s) != 1
    if bad.any():
        b = start + int(np.flatnonzero(zero)[int(np.argmax(bad))])
        raise FormatError(f"block {b}: overlay correction with codes 0 (minimum ±0) has the scale {float(s[bad][0])!r}, "
                          "not the ±1 the import writes", tensor=name, field="correction scale")


def _export_overlay(t: Tensor, kv: dict[str, KVValue], recorded: str | None) -> _Match:
    base, corr = _overlay_members(t)
    c = _choose(base.descriptor, "block_min", recorded, symmetric=True)
    if c is None or c.scale is None:
        forms = " or ".join(f"{c.storage.name} per-block affine K={c.block_size} {c.scale.abbrev}"  # type: ignore[union-attr]
                            for c in codecs() if c.mapping == "block_min")
        raise P.Refuse(f"overlay base is not {forms} along the last axis")
    if not _fits(corr.descriptor, c, storage=CORRECTION_STORAGE, symmetric=True):
        raise P.Refuse(f"overlay correction is not {CORRECTION_STORAGE} per-block affine K={c.block_size} "
                       f"{c.scale.abbrev} along the last axis")
    nb = _nblocks(base.descriptor, c)
    _check_codes_fit(c, base.data[0], nb * c.block_size)
    ccodes = corr.data[0].reshape(nb, buffer_size(CORRECTION_STORAGE, c.block_size))
    cs = corr.data[1].view(c.scale.view)
    for sl in _chunks(nb):  # the one pre-scan of an export: what decides the GGML type (the header comes first)
        zero = _rows_all(ccodes[sl], 0x00)
        const = _rows_all(ccodes[sl], _CORRECTION_ONES) | zero
        if not const.all():
            raise P.Refuse(f"block {sl.start + int(np.argmin(const))}: overlay correction is not a constant minimum")
        _check_zero_minimum(cs[sl], zero, sl.start, corr.name)

    def mins(sl: slice) -> np.ndarray:
        ones = _rows_all(ccodes[sl], _CORRECTION_ONES)
        return np.where(ones, cs[sl], np.copysign(np.zeros(1, cs.dtype), cs[sl])).astype(cs.dtype)

    codes = base.data[0].reshape(nb, c.code_bytes)
    return _Match(c.name, _Blocks(c, codes, lambda: _scales_of(base, kv, c), nb, mins))


def _is_compact(t: Tensor) -> bool:
    """Is the composite ``t`` in a compact form (a high-bit plane member or a broadcast
    minimum) rather than the per-element minimum overlay of § 3a?"""
    hi = t.name + _table()["overlay"]["hi_suffix"]
    return any(m.name == hi or C.is_broadcast(m.descriptor) for m in t.members)


def _compact_members(t: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The members of a compact form (docs/conversion-rules.md § 11) in emission order: the
    base, the high-bit plane (or None), the broadcast minimum (or None), told apart by the
    suffixes of ``mappings/gguf_hurray.toml``; refused when ``t`` is no such overlay."""
    head, sfx = t.descriptor, _table()["overlay"]
    lay = head.layout
    assert isinstance(lay, CompositeHead)
    if lay.composition_rule != RULE_OVERLAY or lay.combine_op != OP_ADD or head.element_type.name != "float32":
        raise P.Refuse("only a float32 overlay (add) of the compact forms has a GGML equivalent")
    want = {t.name + sfx["base_suffix"]: ROLE_BASE, t.name + sfx["hi_suffix"]: ROLE_CORRECTION,
            t.name + sfx["correction_suffix"]: ROLE_CORRECTION}
    names = [m.name for m in t.members]
    if not names or names != [n for n in want if n in names] or names[0] != t.name + sfx["base_suffix"]:
        raise P.Refuse(f"compact overlay members {names}: expected {list(want)[0]!r}, then {list(want)[1]!r} "
                       f"and/or {list(want)[2]!r}, in this order")
    for m in t.members:
        cm, sh = m.descriptor.composite_member, m.descriptor.shard
        if cm is None or cm.role != want[m.name]:
            raise P.Refuse(f"overlay member {m.name!r} has the wrong role")
        if m.descriptor.shape != head.shape or sh is None or any(sh.offset) or tuple(sh.parent_shape) != head.shape:
            raise P.Refuse(f"overlay member {m.name!r} does not cover the whole tensor")
    by = {m.name: m for m in t.members}
    return by[names[0]], by.get(t.name + sfx["hi_suffix"]), by.get(t.name + sfx["correction_suffix"])


def _compact_codec(base: Tensor, hi: Tensor | None, mn: Tensor | None, recorded: str | None) -> BlockCodec:
    """The GGML type of a compact form: the one whose planes and minimum the members are."""
    def fits(c: BlockCodec) -> bool:
        return (c.compact and (c.mapping == "block_min") == (mn is not None)
                and (None if c.hi_plane is None else c.hi_plane.name) == (None if hi is None else hi.descriptor.element_type.name)
                and _fits(base.descriptor, c, storage=C.LO_STORAGE, symmetric=True)
                and (hi is None or _fits(hi.descriptor, c, storage=hi.descriptor.element_type.name, symmetric=True)))

    fit = [c for c in codecs() if fits(c)]
    c = next((c for c in fit if c.name == recorded), None) or next((c for c in fit if c.export == "inferred"), None)
    mine = codec(recorded) if recorded is not None else None
    if c is not None and mine is not None and mine.compact and c.name != recorded:
        raise P.Refuse(f"the import recorded {recorded}, whose compact form these members are not "
                       f"(a plane or the minimum missing?); they would be {c.name}")
    if c is None:
        forms = "; ".join(_compact_text(c, 0, 0).split(": ", 1)[1].split(" (", 1)[0] + f" ({c.name})"
                          for c in codecs() if c.compact)
        raise P.Refuse(f"compact overlay is none of: {forms}" + (" (a recorded type)" if fit else ""))
    return c


def _broadcast_scales(mn: Tensor, c: BlockCodec, nb: int) -> np.ndarray:
    """The broadcast minimum's one scale per block, its layout and its code byte checked."""
    assert c.scale is not None
    d, q = mn.descriptor, mn.descriptor.quantization
    if not (C.is_broadcast(d) and isinstance(q, PerBlockAffine) and q.block_size == c.block_size
            and q.scale_type.name == c.scale.name and q.scale_buffer_index == 1 and len(mn.data) == 2):
        raise P.Refuse(f"overlay member {mn.name!r} is not the broadcast {c.scale.abbrev} minimum of block {c.block_size}")
    code = np.asarray(mn.data[0]).view(np.uint8).reshape(-1)
    if code.size < 1 or code[0] != C.BROADCAST_CODE:
        got = "no byte" if not code.size else f"the code {int(code[0])}"
        raise FormatError(f"broadcast minimum holds {got}, not the code {C.BROADCAST_CODE} the import writes",
                          tensor=mn.name, field="buffer 0")
    s = np.asarray(mn.data[1]).view(np.uint8).reshape(-1)
    width = np.dtype(c.scale.view).itemsize
    if s.size != nb * width:
        raise FormatError(f"broadcast minimum's scale buffer holds {s.size} bytes, {nb} blocks need {nb * width}",
                          tensor=mn.name, field="buffer 1")
    return s.view(c.scale.view)


def _check_plane(hi: Tensor, c: BlockCodec, bs: np.ndarray, nb: int) -> np.ndarray:
    """The high-bit plane's codes ``(nb, K/4)``, checked: every scale exactly ``16·d`` (the
    stored base scale), every code a plane code."""
    hs = hi.data[1].view(c.scale.view)  # type: ignore[union-attr]
    codes = np.asarray(hi.data[0]).reshape(nb, buffer_size(c.hi_plane, c.block_size))  # type: ignore[arg-type]
    for sl in _chunks(nb):
        want, _ = C.exact_multiple(bs[sl], 16)
        wrong = want.view(np.uint16) != hs[sl].view(np.uint16)
        if wrong.any():
            b = int(np.argmax(wrong))
            raise FormatError(f"block {sl.start + b}: plane scale {float(hs[sl][b])!r} is not 16·d = {float(want[b])!r}",
                              tensor=hi.name, field="buffer 1")
        bad = C.bad_plane_rows(codes[sl], signed_hi=bool(c.code_offset))
        if bad.any():
            raise FormatError(f"block {sl.start + int(np.argmax(bad))}: a high-bit code that is not "
                              f"{'−1 or 0' if c.code_offset else '0 or 1'}", tensor=hi.name, field="buffer 0")
    return codes


def _flips(mn: Tensor, kv: dict[str, KVValue], bs: np.ndarray, v: np.ndarray, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """The flipped blocks (mask: those whose scales read as flipped, :func:`~.gguf_compact.flipped`)
    and their original minimums: +0, or −0 where the broadcast minimum's record names the block
    (it may name only flipped blocks)."""
    key = scale_record_key(mn.name)
    rec = kv.get(key)
    idx, orig = decode_scale_record(rec.value, key=key) if rec is not None else (_NO_BLOCKS, np.zeros((0, 2), np.uint8))
    if orig.shape[1] != v.dtype.itemsize or (idx.size and int(idx[-1]) >= v.size):
        raise FormatError("the record does not fit the broadcast minimum's scales", tensor=mn.name, field=key)
    m0 = np.ascontiguousarray(orig).view(v.dtype).reshape(-1)
    if (m0 != 0).any():
        raise FormatError(f"block {int(idx[np.argmax(m0 != 0)])}: recorded minimum {float(m0[m0 != 0][0])!r} is not ±0",
                          tensor=mn.name, field=key)
    mask = np.zeros(v.size, bool)
    for sl in _chunks(v.size):
        mask[sl] = C.flipped(bs[sl], v[sl], qmax)
    if idx.size and not mask[idx.astype(np.intp)].all():
        b = int(idx[np.argmin(mask[idx.astype(np.intp)])])
        raise FormatError(f"block {b}: is recorded as flipped but its scales are not (base scale {float(bs[b])!r}, "
                          f"minimum scale {float(v[b])!r}): the data contradicts the record", tensor=mn.name, field=key)
    if (~np.signbit(m0)).any():
        b = int(idx[np.argmax(~np.signbit(m0))])
        raise FormatError(f"block {b}: recorded minimum is +0 (the record keeps only −0 minimums)", tensor=mn.name, field=key)
    zeros = np.zeros(int(mask.sum()), dtype=v.dtype)
    flipped_at = np.flatnonzero(mask)
    zeros[np.searchsorted(flipped_at, idx.astype(np.intp))] = m0
    return mask, zeros


def _check_zero_codes(t: Tensor, codes: np.ndarray, blocks: np.ndarray, flip: np.ndarray | None, xor: int) -> None:
    """Blocks whose scale d was substituted must hold zero codes once unflipped (§ 4)."""
    if not blocks.size:
        return
    rows = codes[blocks] ^ (np.uint8(xor) * flip[blocks, None]).astype(np.uint8) if flip is not None else codes[blocks]
    bad = rows.any(axis=1)
    if bad.any():
        raise FormatError(f"block {int(blocks[np.argmax(bad)])}: a substituted scale d on a block whose codes are not zero",
                          tensor=t.name, field="buffer 0")


def _export_compact(t: Tensor, kv: dict[str, KVValue], recorded: str | None) -> _Match:
    """A compact form back to its GGML blocks: planes joined, flipped blocks unflipped (the
    minimum's record), substituted scales restored (the base's record), every part checked."""
    base, hi, mn = _compact_members(t)
    c = _compact_codec(base, hi, mn, recorded)
    assert c.scale is not None
    nb = _nblocks(base.descriptor, c)
    bs = base.data[1].view(c.scale.view)
    lo = np.asarray(base.data[0]).reshape(nb, c.block_size // 2)
    flip = m = None
    if mn is not None:
        v = _broadcast_scales(mn, c, nb)
        flip, m0 = _flips(mn, kv, bs, v, c.code_range()[1])
        m = v.copy()
        m[flip] = m0
    d = bs.copy()
    if flip is not None:
        d[flip] = -d[flip]
    key = scale_record_key(base.name)
    subs = _NO_BLOCKS
    if key in kv:
        subs = decode_scale_record(kv[key].value, key=key)[0].astype(np.intp)
        d = restore_scales(d, kv[key].value, key=key, rule=c.scale.stand_in, tensor=base.name)
    plane = _check_plane(hi, c, bs, nb) if hi is not None else None
    _check_zero_codes(base, lo, subs, flip, 0xFF)
    if plane is not None:
        _check_zero_codes(hi, plane, subs, flip, 0x55)  # type: ignore[arg-type]
    return _Match(c.name, _CompactBlocks(c, lo, plane, d, m, flip))


class _CompactBlocks(ChunkedBlocks):
    """GGML blocks of ``c`` from a compact form's parts: the low-bit plane ``(nb, K/2)``, the
    high-bit plane ``(nb, K/4)`` or None, the scales d and minimums m (restored, one per
    block) and the flipped blocks' mask."""

    def __init__(self, c: BlockCodec, lo: np.ndarray, plane: np.ndarray | None, d: np.ndarray,
                 m: np.ndarray | None, flip: np.ndarray | None) -> None:
        super().__init__(lo.shape[0], c.block_bytes, PAR_BLOCKS)
        self.c, self.lo, self.plane, self.d, self.m, self.flip = c, lo, plane, d, m, flip

    def chunk_function(self) -> Callable[[slice], np.ndarray]:
        c, k = self.c, self.c.block_size
        assert c.scale is not None

        def chunk(sl: slice) -> np.ndarray:
            out = P.buffer("blocks", (sl.stop - sl.start, self.block_bytes), np.uint8)
            out[...] = 0
            K.scatter_field(out, c.fields[c.scale.field], self.d[sl])
            if self.m is not None:
                K.scatter_field(out, c.fields["m"], self.m[sl])
            flip = None if self.flip is None or not self.flip[sl].any() else self.flip[sl, None].astype(np.uint8)
            lo = self.lo[sl] if flip is None else self.lo[sl] ^ (flip * np.uint8(0xFF))
            K.pairs_to_split(np.ascontiguousarray(lo), out=out[:, c.fields["qs"] : c.fields["qs"] + k // 2])
            if self.plane is not None:
                p = self.plane[sl] if flip is None else self.plane[sl] ^ (flip * np.uint8(0x55))
                out[:, c.fields["qh"] : c.fields["qh"] + k // 8] = C.bits_from_plane(p, signed_hi=bool(c.code_offset))
            return out

        return chunk


@dataclass
class _Records:
    """The GGUF conversion records of a .hrry file, validated (they are input too)."""

    version: int
    alignment: int
    tail: int
    types: list[str]
    tensors: list["S.TensorRow"]
    #: per shard (0: the one file), ``{absolute offset: bytes}`` of non-zero padding to write back
    padding: dict[int, dict[int, memoryview]] = field(default_factory=dict)


def _rec_error(path: str, field: str, message: str, tensor: str | None = None) -> FormatError:
    return FormatError(f"corrupt GGUF conversion record: {message}", path=path, field=field, tensor=tensor)


def _rec_uint(kv: dict[str, KVValue], key: str, path: str) -> int:
    v = kv.get(key)
    if v is None or v.type not in ("uint64", "int64"):
        raise _rec_error(path, key, "missing" if v is None else f"stored as {v.type}, expected an integer")
    return int(v.value)


def _types_record(kv: dict[str, KVValue], path: str) -> list[str]:
    """The :data:`K_TYPES` record, checked: an array of known GGUF type strings."""
    tv = kv.get(K_TYPES)
    if tv is None or tv.type != "array" or tv.element_type != "string":
        raise _rec_error(path, K_TYPES, "missing or not an array of strings")
    types = list(tv.value)
    for ts in types:
        try:
            _parse_type_string(ts)
        except KeyError:
            raise _rec_error(path, K_TYPES, f"unknown GGUF value type {ts!r}") from None
    return types


def _records(kv: dict[str, KVValue], path: str) -> _Records | None:
    """Read and check the records an import left; ``None`` for files that did not come from GGUF."""
    from ..formats import gguf_split as S

    src = kv.get(K_SOURCE)
    if src is None or src.type != "string" or src.value != "gguf":
        return None
    version = _rec_uint(kv, K_VERSION, path)
    if version not in G.SUPPORTED_VERSIONS:
        raise _rec_error(path, K_VERSION, f"GGUF version {version} (only 2 and 3 exist)")
    alignment = _rec_uint(kv, K_ALIGN, path)
    if alignment < 1 or alignment & (alignment - 1) or alignment > 1 << 30:
        raise _rec_error(path, K_ALIGN, f"alignment {alignment} is not a power of two up to 2^30")
    tail = _rec_uint(kv, K_TAIL, path)
    if tail >= max(alignment, 1):
        raise _rec_error(path, K_TAIL, f"{tail} trailing padding bytes for alignment {alignment}")
    types = _types_record(kv, path)
    jv = kv.get(K_TENSORS)
    if jv is None or jv.type != "string":
        raise _rec_error(path, K_TENSORS, "missing or not a string")
    try:
        rows = json.loads(jv.value)
    except (ValueError, RecursionError) as e:
        raise _rec_error(path, K_TENSORS, f"not valid JSON ({type(e).__name__})") from None
    if not isinstance(rows, list):
        raise _rec_error(path, K_TENSORS, "not a JSON list of tensors")
    tensors: list[S.TensorRow] = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        try:
            r = S.tensor_row(row, min_dims=1)
        except ValueError as e:
            who = row[0] if isinstance(row, list) and row and isinstance(row[0], str) else None
            raise _rec_error(path, K_TENSORS, f"entry {i}: {e}", tensor=who) from None
        if r.name in seen:
            raise _rec_error(path, K_TENSORS, "recorded twice", tensor=r.name)
        seen.add(r.name)
        tensors.append(r)
    return _Records(version, alignment, tail, types, tensors, _padding_record(kv, path))


def _padding_record(kv: dict[str, KVValue], path: str) -> dict[int, dict[int, memoryview]]:
    v = kv.get(K_PADDING)
    if v is None:
        return {}
    if v.type != "bytes":
        raise _rec_error(path, K_PADDING, f"stored as {v.type}, expected bytes")
    try:
        runs = decode_byte_runs(v.value, key=K_PADDING)
    except FormatError as e:
        raise _rec_error(path, K_PADDING, e.message) from None
    if sum(r[2].nbytes for r in runs) > MAX_PADDING_BYTES:
        raise _rec_error(path, K_PADDING, f"more than the {MAX_PADDING_BYTES} bytes an import records")
    if runs and runs[-1][0] and K_SPLIT not in kv:
        raise _rec_error(path, K_PADDING, f"names shard {runs[-1][0] + 1}, but the file records no split set")
    out: dict[int, dict[int, memoryview]] = {}
    for part, offset, data in runs:
        out.setdefault(part, {})[offset] = data
    return out


def _check_offsets(rec: _Records, sizes: dict[str, int], path: str) -> bool:
    """Recorded offsets are used only if they are aligned, disjoint and pad modestly.

    Returns False when they do not fit the tensors being written (sizes changed),
    in which case the standard layout is computed; raises when they are corrupt.
    """
    if any(sizes[r.name] != r.nbytes for r in rec.tensors):
        return False
    end = 0
    total = 0
    for r in sorted(rec.tensors, key=lambda r: r.offset):
        if r.offset % rec.alignment:
            raise _rec_error(path, K_TENSORS, f"offset {r.offset} is not a multiple of the alignment {rec.alignment}",
                             tensor=r.name)
        if r.offset < end:
            raise _rec_error(path, K_TENSORS, f"offset {r.offset} overlaps the previous tensor (ends at {end})",
                             tensor=r.name)
        end = r.offset + sizes[r.name]
        total += sizes[r.name]
    # gaps beyond alignment padding are legal in GGUF but never worth more than the data itself:
    # a record claiming otherwise would make us write an arbitrarily large file
    if end - total > max(total, 1 << 20) + len(rec.tensors) * rec.alignment:
        raise _rec_error(path, K_TENSORS, f"offsets describe {end - total} bytes of gaps for {total} bytes of data")
    return True


def gguf_metadata_records(kv: dict[str, KVValue], path: str) -> list[tuple[str, str, KVValue]] | None:
    """``(key, recorded GGUF type, stored value)`` of every GGUF metadata key of a .hrry
    whose :data:`K_TYPES` record gives its keys' exact GGUF types (an import from GGUF, or
    from safetensors ``gguf.*`` metadata), in order; None without the record.  The values
    are checked against their types by :func:`gguf_value`."""
    if K_TYPES not in kv:
        return None
    types = _types_record(kv, path)
    plain = [(k, v) for k, v in kv.items() if not k.startswith(KEY_PREFIX)]
    if len(types) != len(plain):
        raise _rec_error(path, K_TYPES, f"{len(types)} GGUF value types recorded for {len(plain)} metadata keys")
    return [(k, ts, v) for (k, v), ts in zip(plain, types)]


#: a stored value as the GGUF value of its recorded type (FormatError naming the key when it does not fit)
gguf_value = _gguf_value_from_record


def _edited_type(key: str, value: KVValue, recorded: str | None, path: str) -> str:
    """The GGUF type of an edited value: the one recorded for the key when the value fits it,
    else the plain mapping's (:func:`_gguf_value_from_plain`)."""
    if recorded is not None:
        try:
            gguf_value(key, value, recorded, path)
            return recorded
        except FormatError:
            pass
    return _type_string(_gguf_value_from_plain(value))


def edited_gguf_records(old: dict[str, KVValue], entries: list[Any], path: str) -> list[Any]:
    """``edit`` of a .hrry imported from GGUF: the :data:`K_TYPES` record in step with the
    edited keys (a kept value keeps its type, a new one takes the type recorded for its key
    when it fits, else the plain mapping's); ``entries``: :class:`~..core.edits.Entry` in order."""
    recorded = gguf_metadata_records(old, path)
    if recorded is None:
        return entries
    plain_index = [i for i, k in enumerate(old) if not k.startswith(KEY_PREFIX)]
    by_index = {i: ts for i, (_, ts, _) in zip(plain_index, recorded)}
    by_key = {k: ts for k, ts, _ in recorded}
    types = [by_index[e.source] if e.source is not None else _edited_type(e.key, e.value, by_key.get(e.key), path)
             for e in entries if not e.key.startswith(KEY_PREFIX)]
    record = KVValue("array", types, "string")
    return [type(e)(e.key, record, None) if e.key == K_TYPES else e for e in entries]


def _export_kv(kv: dict[str, KVValue], rec: _Records | None, path: str, alignment: int) -> list[tuple[str, "G.GGUFValue"]]:
    recorded = gguf_metadata_records(kv, path)
    if recorded is not None:
        return [(k, gguf_value(k, v, ts, path)) for k, ts, v in recorded]
    plain = [(k, v) for k, v in kv.items() if not k.startswith(KEY_PREFIX)]
    out = []
    for k, v in plain:
        if k == "general.alignment":  # GGUF requires this one key to be a UINT32
            out.append((k, G.GGUFValue.of(VT.UINT32, alignment)))
        else:
            out.append((k, _gguf_value_from_plain(v)))
    if alignment != G.DEFAULT_ALIGNMENT and "general.alignment" not in kv:
        out.append(("general.alignment", G.GGUFValue.of(VT.UINT32, alignment)))
    return out


@errors_name_source  # records and buffers are input: errors say which file
def hurray_to_gguf(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str] | None,
    *,
    fallback: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    progress: Progress = None,
    jobs: int | None = None,
    merge: bool = False,
    split_max_tensors: int | None = None,
    split_max_size: int | str | None = None,
) -> ConversionReport:
    """Convert a .hrry file into GGUF (exact, or refused; see the module docstring).
    ``jobs``: threads converting chunks (default: :func:`hurray_interop.parallel.jobs`).

    The output shape (docs/conversion-rules.md § 10): a .hrry imported from a split
    set exports to that set again (``dst`` names the first shard, ``PREFIX.gguf`` or
    a bare prefix; see :func:`~..formats.gguf_split.set_paths`) unless ``merge``
    (one file, as ``gguf-split --merge`` writes it); ``split_max_tensors`` /
    ``split_max_size`` (bytes, or gguf-split's ``500M`` / ``2G``) write a new set
    from any .hrry; otherwise one file."""
    _check_options(fallback)
    fallback = fallbacks.dtype_choice(fallback)  # exact: the records restore, nothing is dequantized
    request = split_request(merge, split_max_tensors, split_max_size)
    with use_jobs(jobs):
        return _hurray_to_gguf(os.fspath(src), dst, fallback=fallback, dry_run=dry_run, force=force, progress=progress,
                               request=request)


@dataclass(frozen=True)
class SplitRequest:
    """How the output of an export was asked to be split (``gguf-split``'s options)."""

    merge: bool = False
    max_tensors: int | None = None
    max_size: int | None = None

    @property
    def split(self) -> bool:
        return self.max_tensors is not None or self.max_size is not None


def split_request(merge: bool, max_tensors: int | None, max_size: int | str | None) -> SplitRequest:
    """The export's (and the GGUF -> GGUF relayout's) split options, checked (:class:`UsageError`)."""
    from ..formats import gguf_split as S

    if isinstance(max_size, str):
        max_size = S.parse_split_size(max_size)
    request = SplitRequest(bool(merge), max_tensors, max_size)
    if request.merge and request.split:
        raise UsageError("--merge writes one file; it excludes --split-max-tensors and --split-max-size")
    if request.split:
        S.plan_split([], max_tensors=max_tensors, max_size=max_size)  # checks the values (one of them, positive)
    return request


def _hurray_to_gguf(
    src: str, dst: str | os.PathLike[str] | None, *, fallback: str | None, dry_run: bool, force: bool, progress: Progress,
    request: SplitRequest = SplitRequest(),
) -> ConversionReport:
    report = ConversionReport(
        source=src, destination=None if dst is None else os.fspath(dst), source_format="hurray",
        destination_format="gguf", dry_run=dry_run,
    )
    from ..core.hrry import HrryFile

    with HrryFile(src) as hf:
        kv = dict(hf.kv)
        records = _records(kv, src)
        alignment = _alignment(kv, records, src)
        exports = _plan_exports(hf, kv, records, src, fallback)
        report.tensors = [e.plan for e in exports]
        report.notes.extend(gguf_metadata.unwritten_note(kv))
        split = None if report.refused else _set_layout(kv, records, src, exports, alignment, request)
        if not report.refused:
            report.notes.extend(_padding_lost_note(records, exports, split is not None, request))
        if split is not None:
            report.notes.append(set_note(split, dst, request.merge, dry_run))
        elif request.merge and not report.refused:
            report.notes.append("--merge: the file records no split GGUF set; it exports to one file, as without --merge")
        if _plan_only(report, src, "have no exact GGML equivalent", dst, dry_run):
            return report
        gkv = _export_kv(kv, records, src, alignment)
        if split is not None:
            # the recorded padding belongs to the recorded layout: not to a new split, nor to changed tensor sizes
            padding = records.padding if records and _why_padding_lost(records, exports, True, request) is None else {}
            _write_set(hf, src, dst, exports, split, gkv, request.merge, force, progress, padding)
        else:
            _write_single(hf, src, dst, exports, records, gkv, alignment, force, progress)
    return report


def _alignment(kv: dict[str, KVValue], records: _Records | None, src: str) -> int:
    """The data alignment of the GGUF an export writes: the recorded one, else ``general.alignment``."""
    if records is not None:
        return records.alignment
    a = kv.get("general.alignment")
    if a is None:
        return G.DEFAULT_ALIGNMENT
    if a.type not in ("int64", "uint64") or not 0 < int(a.value) <= 1 << 30 or int(a.value) & (int(a.value) - 1):
        raise FormatError("general.alignment must be a power-of-two integer", path=src, field="general.alignment")
    return int(a.value)


def _plan_exports(hf: Any, kv: dict[str, KVValue], records: _Records | None, src: str,
                  fallback: str | None) -> list[_Export]:
    """Every tensor's export plan, in the order the GGUF lists them (the recorded one, else the file's)."""
    recorded = {r.name: r for r in records.tensors} if records is not None else {}
    exports = []
    for name in recorded if records is not None else hf.top_level_names():
        if name not in hf:
            raise FormatError(f"tensor {name!r} is recorded but missing from the file", path=src, field=K_TENSORS)
        exports.append(_plan_export(hf.tensor(name), kv, recorded.get(name), src, fallback))
        hf.release_pages()  # planning reads codes (overlay checks): keep resident memory bounded
    return exports


def _plan_export(t: Tensor, kv: dict[str, KVValue], rec: "S.TensorRow | None", src: str,
                 fallback: str | None) -> _Export:
    """One tensor's export plan: its GGML type and block source, or why it is refused."""
    shape = t.descriptor.shape
    plan = TensorPlan(name=t.name, source_type=t.describe(), mapping="", status=EXACT, bytes_in=t.nbytes)
    ex = _Export(name=t.name, plan=plan)
    exportable_shape = all(x is not None for x in shape) and t.descriptor.rank <= G.MAX_DIMS
    if rec is not None and (not exportable_shape or tuple(reversed(rec.ne)) != shape):
        raise _rec_error(src, K_TENSORS, f"recorded ne {list(rec.ne)} does not match the shape {list(shape)}", tensor=t.name)
    if not exportable_shape:
        plan.status, plan.mapping = REFUSED, "-"
        plan.reason = f"shape {['?' if x is None else x for x in shape]} has no GGUF equivalent (dynamic or rank > 4)"
        return ex
    ex.recorded = rec
    ex.ne = tuple(rec.ne) if rec is not None else tuple(int(x) for x in reversed(shape)) or (1,)  # type: ignore[arg-type]
    try:
        m = _export_match(t, kv, rec.type if rec else None)
    except P.Refuse as r:
        if not fallback:
            plan.status, plan.reason, plan.mapping = REFUSED, r.reason, "-"
            return ex
        m = _export_fallback(t, plan, fallback, r.reason)
    else:
        plan.mapping = m.type_name
        if rec is not None and rec.type != m.type_name:
            plan.status = VALUE_EXACT
            plan.reason = f"imported from {rec.type}, exported as {m.type_name}"
    ex.type_name, ex.source = m
    plan.bytes_out = G.tensor_nbytes(ex.type_name, ex.ne)
    plan.bytes_in += _record_bytes(kv, t.name, ex.type_name, plan.bytes_out)
    return ex


def _why_padding_lost(records: _Records | None, exports: list[_Export], is_set: bool,
                      request: SplitRequest) -> str | None:
    """None when the export writes the recorded layout, so the recorded non-zero padding
    goes back where it was; else why it does not (the export writes zeros there)."""
    if records is None or not records.padding:
        return "no padding recorded"
    if request.merge and is_set:
        return "--merge writes a new layout"
    if request.split:
        return "--split-max-* writes a new layout"
    if is_set and any(e.recorded is None or e.type_name != e.recorded.type for e in exports):
        return "the tensors' GGML types differ from the recorded ones, so the layout is new"
    if any(e.recorded is None or G.tensor_nbytes(e.type_name, e.ne) != e.recorded.nbytes for e in exports):
        return "the tensors' sizes differ from the recorded ones, so the layout is new"
    return None


def _padding_lost_note(records: _Records | None, exports: list[_Export], is_set: bool,
                       request: SplitRequest) -> list[str]:
    """The note of an export that cannot write the recorded non-zero padding back."""
    why = _why_padding_lost(records, exports, is_set, request)
    if why is None or records is None or not records.padding:
        return []
    n = sum(b.nbytes for runs in records.padding.values() for b in runs.values())
    return [f"{n} {PADDING_LOST} ({K_PADDING}): {why}; zeros are written there, "
            "so the output is not byte-identical to the imported GGUF"]


def _write_single(hf: Any, src: str, dst: Any, exports: list[_Export], records: _Records | None,
                  gkv: list[tuple[str, "G.GGUFValue"]], alignment: int, force: bool, progress: Progress) -> None:
    """Write one GGUF file (the recorded layout when the tensor sizes still fit it)."""
    from ..files.comparing import output
    from ..files.positional import PositionalWriter

    sizes_ok = records is not None and _check_offsets(
        records, {e.name: G.tensor_nbytes(e.type_name, e.ne) for e in exports}, src
    )
    specs = [G.TensorSpec(e.name, G.ggml_type(e.type_name).id, e.ne, e.offset if sizes_ok else None) for e in exports]
    by_name = {e.name: e for e in exports}
    total = sum(e.plan.bytes_out for e in exports)
    done = 0
    fd = P.open_source(src)
    # an AtomicOutput, or the comparer of verify's round trip (files.comparing)
    with _closing_fd(fd), output(dst, force=force, inputs=(src,)) as fh:  # fd closed if dst is refused
        try:
            w = G.GGUFWriterStream(
                fh,
                version=records.version if records else 3,
                alignment=alignment,
                kv=gkv,
                tensors=specs,
                pad_end=records.tail if records and sizes_ok else True,
                padding=records.padding.get(0) if records and sizes_ok else None,
            )
        except UsageError as e:  # the layout the file's records or metadata describe is impossible
            where = KEY_PREFIX + "gguf" if records else "metadata"
            raise FormatError(f"cannot lay out the GGUF this file describes: {e.message}", path=src, field=where) from None
        out = Target(PositionalWriter(fh, None), fd, hf.buffer_offsets)
        with w:
            for spec in w.tensors_in_file_order:
                e = by_name[spec.name]
                assert e.source is not None  # planning refused none of the tensors written
                e.source.write(out, w.skip_tensor_data(name=e.name))  # the workers write the blocks in place
                hf.release_pages()  # bounded resident memory: see HrryFile.release_pages
                done += e.plan.bytes_out
                if progress:
                    progress(done, total)
        fh.commit()


@contextlib.contextmanager
def _closing_fd(fd: int | None) -> Iterator[None]:
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _set_layout(kv: dict[str, KVValue], records: _Records | None, src: str, exports: list[_Export], alignment: int,
                request: SplitRequest) -> "S.SplitLayout | None":
    """The split set an export writes (docs/conversion-rules.md § 10): a new one
    (``--split-max-*``), the recorded one (with the GGML types the export chose), or
    None for one plain file."""
    from ..formats import gguf_split as S

    if request.split:
        sizes = [G.tensor_nbytes(e.type_name, e.ne) for e in exports]
        plan = S.plan_split(sizes, max_tensors=request.max_tensors, max_size=request.max_size)
        keys = [k for k in kv if not k.startswith(KEY_PREFIX)]
        if records is None and alignment != G.DEFAULT_ALIGNMENT and "general.alignment" not in kv:
            keys.append("general.alignment")  # as _export_kv adds it
        return S.new_split_layout(keys, [(e.name, e.type_name, e.ne) for e in exports], plan, alignment=alignment)
    v = kv.get(K_SPLIT) if records is not None else None
    if v is None:
        return None
    if v.type != "string":
        raise _rec_error(src, K_SPLIT, f"stored as {v.type}, expected a string")
    layout = S.SplitLayout.from_json(v.value, path=src, field=K_SPLIT)
    rows = {r.name: r for r in layout.tensor_rows}
    if list(rows) != [e.name for e in exports]:
        raise _rec_error(src, K_SPLIT, f"the tensors of the split layout are not those of {K_TENSORS} (in set order)")
    placed = [k for k in layout.shards[0].kv if k not in S.SPLIT_KEYS]
    if placed != [k for k in kv if not k.startswith(KEY_PREFIX)]:
        raise _rec_error(src, K_SPLIT, "the first shard's metadata keys are not the file's metadata keys (in order)")
    changed = {e.name: (e.type_name, e.ne) for e in exports if (rows[e.name].type, rows[e.name].ne) != (e.type_name, e.ne)}
    return layout.with_tensor_types(changed) if changed else layout


def set_note(layout: "S.SplitLayout", dst: Any, merge: bool, dry_run: bool) -> str:
    """What the export writes: the set's files and the tensors in each (or one merged file)."""
    from ..formats import gguf_split as S

    verb = "would write" if dry_run else "wrote"
    if merge:
        return f"{verb} one merged GGUF of the {layout.count}-shard set ({layout.tensors_count} tensors), as gguf-split --merge"
    names = [p.name for p in S.set_paths(dst, layout.count)] if dst is not None else [s.suffix for s in layout.shards]
    per = ", ".join(f"{n} {len(s.tensors)}" for n, s in zip(names, layout.shards))
    return f"{verb} a split GGUF set of {layout.count} shards (tensors per shard: {per})"


def _write_set(hf: Any, src: str, dst: Any, exports: list[_Export], layout: "S.SplitLayout",
               gkv: list[tuple[str, "G.GGUFValue"]], merge: bool, force: bool, progress: Progress,
               padding: dict[int, dict[int, memoryview]]) -> None:
    """Write every shard of ``layout`` (or their merge), all or nothing; ``padding``: the
    recorded non-zero padding per shard (the recorded layout only)."""
    from ..formats import gguf_split as S

    by_name = {e.name: e for e in exports}
    if padding and max(padding) >= layout.count:
        raise _rec_error(src, K_PADDING, f"names shard {max(padding) + 1} of a {layout.count}-shard set")
    fd = P.open_source(src)

    def write_at(name: str, pw: "PositionalWriter", offset: int) -> None:  # the workers write in place
        hf.release_pages()  # bounded resident memory: see HrryFile.release_pages
        source = by_name[name].source
        assert source is not None  # planning refused none of the tensors written
        source.write(Target(pw, fd, hf.buffer_offsets), offset)

    with _closing_fd(fd):
        try:
            S.write_set(dst, layout, dict(gkv), write_at=write_at, merge=merge, force=force, inputs=(src,),
                        progress=progress, padding=padding)
        except UsageError as e:
            if padding and e.message.startswith(G.PADDING_MISPLACED):
                raise _rec_error(src, K_PADDING, e.message) from None
            raise


def _export_fallback(t: Tensor, plan: TensorPlan, fallback: str, reason: str) -> _Match:
    """``--fallback DTYPE``: the dequantized values of ``t`` as the plain GGML type of ``fallback``."""
    from ..dequant import iter_dequantize

    gtype = next(c.name for c in codecs() if c.mapping == "plain" and c.storage.name == fallback)
    plan.mapping = f"{gtype} (fallback)"
    plan.reason = reason + "; stored dequantized"

    def gen() -> Iterator[np.ndarray]:
        for _, vals in iter_dequantize(t):
            yield fallbacks.cast(vals, fallback).reshape(-1).view(np.uint8)

    meter = fallbacks.ErrorMeter()
    if not fallbacks.lossless(np.float32, fallback):  # the dequantizer's values are float32
        for _, vals in iter_dequantize(t):
            meter.add(vals, fallbacks.cast(vals, fallback))
    plan.max_abs_error = meter.error
    plan.status = fallbacks.status(meter.error)
    return _Match(gtype, StreamedBytes(gen))
