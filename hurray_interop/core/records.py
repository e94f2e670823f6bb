"""Records kept in a .hrry file's KV section so that exports restore exact bytes.

Scale substitutions (docs/conversion-rules.md § 4): Hurray forbids a zero per-block
scale and the MXFP scale bytes 0x00/0xFF, but real files carry them on
all-zero blocks.  An importer replaces such a scale by a legal one (values are
unchanged because every code of the block decodes to zero) and records, per
tensor buffer, which blocks it changed and their original scale bits::

    key   = "hurray_interop.scale_substitutions." + <tensor name> [+ "#" + <buffer index>]
    value = bytes:  u32 itemsize | u64 count | count × u64 block index (ascending)
                    | count × itemsize original scale bytes

The buffer index suffix is omitted for buffer 1 (the scale buffer of every
dense tensor this project writes).  Exporters call :func:`restore_scales` on
the scale buffer before writing it out, with the importer's rule for the legal
stand-in (``stand_in``): a recorded block whose stored scale is not the stand-in
of its recorded original, or whose original is not a scale the rule replaces,
contradicts the record and is refused, located by tensor and block.

Byte runs (:func:`encode_byte_runs`): bytes of a source file outside every tensor
that are not zero (GGUF padding and gaps), by part and offset, written back on export.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Iterable

import numpy as np

from ..errors import FormatError, UsageError

__all__ = [
    "SCALE_RECORD_PREFIX", "scale_record_key", "encode_scale_record", "decode_scale_record", "check_stand_ins",
    "restore_scales", "encode_byte_runs", "decode_byte_runs",
]

#: the importer's rule, given original scales: (which of them it replaces, the stand-ins it stores)
StandIn = Callable[[np.ndarray], "tuple[np.ndarray, np.ndarray]"]

SCALE_RECORD_PREFIX = "hurray_interop.scale_substitutions."

_HEAD = struct.Struct("<IQ")


def scale_record_key(tensor: str, buffer_index: int = 1) -> str:
    return SCALE_RECORD_PREFIX + tensor + ("" if buffer_index == 1 else f"#{buffer_index}")


def encode_scale_record(blocks: np.ndarray, original: np.ndarray) -> bytes:
    """``blocks``: ascending block indices; ``original``: the original scale values (any dtype)."""
    blocks = np.ascontiguousarray(blocks, dtype="<u8").reshape(-1)
    orig = np.ascontiguousarray(original).reshape(-1)
    if blocks.size != orig.size:
        raise ValueError("one original scale per substituted block")
    itemsize = orig.dtype.itemsize
    return _HEAD.pack(itemsize, blocks.size) + blocks.tobytes() + orig.view(np.uint8).tobytes()


def decode_scale_record(raw: bytes, *, key: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Return ``(block indices as uint64, original scale bytes as uint8[count, itemsize])``."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):  # a KV value of another type
        raise FormatError(f"scale substitution record is stored as {type(raw).__name__}, expected bytes", field=key or "scale record")
    if len(raw) < _HEAD.size:
        raise FormatError("scale substitution record is truncated", field=key or "scale record")
    itemsize, count = _HEAD.unpack_from(raw, 0)
    if itemsize not in (1, 2, 4, 8):
        raise FormatError(f"scale substitution record has bad scale size {itemsize}", field=key or "scale record")
    expected = _HEAD.size + count * (8 + itemsize)
    if count > len(raw) or len(raw) != expected:
        raise FormatError(
            f"scale substitution record holds {len(raw)} bytes, {count} entries need {expected}",
            field=key or "scale record",
        )
    blocks = np.frombuffer(raw, dtype="<u8", count=count, offset=_HEAD.size)
    orig = np.frombuffer(raw, dtype=np.uint8, count=count * itemsize, offset=_HEAD.size + 8 * count)
    if count > 1 and not np.all(blocks[1:] > blocks[:-1]):  # compared as uint64: no wrap-around
        raise FormatError("scale substitution record block indices are not ascending", field=key or "scale record")
    return blocks, orig.reshape(count, itemsize)


def _checked_record(scales: np.ndarray, raw_record: bytes, key: str) -> tuple[np.ndarray, np.ndarray]:
    blocks, orig = decode_scale_record(raw_record, key=key)
    if orig.shape[1] != scales.dtype.itemsize:
        raise FormatError(
            f"scale substitution record stores {orig.shape[1]}-byte scales, buffer has {scales.dtype.itemsize}-byte scales",
            field=key or "scale record",
        )
    if blocks.size and int(blocks[-1]) >= scales.size:  # ascending, so the last is the largest
        raise FormatError(
            f"scale substitution record names block {int(blocks[-1])}, tensor has {scales.size} blocks",
            field=key or "scale record",
        )
    return blocks.astype(np.intp), orig


def _show(v: np.ndarray) -> str:
    return repr(float(v)) if v.dtype.kind == "f" else f"{int(v):#04x}"


def check_stand_ins(scales: np.ndarray, raw_record: bytes, rule: StandIn, *, key: str = "",
                    tensor: str | None = None) -> None:
    """The record must agree with the stored ``scales`` (1-D): every recorded original must be
    a scale the importer's ``rule`` replaces, and the stored scale of its block, bit for bit,
    the stand-in the rule writes for it.  One vectorized compare of the recorded blocks only."""
    s = np.asarray(scales).reshape(-1)
    blocks, orig = _checked_record(s, raw_record, key)
    _check_stand_ins(s, blocks, orig, rule, key, tensor)


def _check_stand_ins(s: np.ndarray, blocks: np.ndarray, orig: np.ndarray, rule: StandIn, key: str,
                     tensor: str | None) -> None:
    if not blocks.size:
        return
    originals = np.ascontiguousarray(orig).view(s.dtype).reshape(-1)
    replaced, want = rule(originals)
    field = key or "scale record"
    if not replaced.all():
        i = int(np.argmin(replaced))
        raise FormatError(f"block {int(blocks[i])}: the recorded original scale {_show(originals[i])} is not one "
                          "the import replaces", field=field, tensor=tensor)
    stored = s[blocks]
    u = f"u{s.dtype.itemsize}"
    diff = np.asarray(want, dtype=s.dtype).view(u) != stored.view(u)
    if diff.any():
        i = int(np.argmax(diff))
        raise FormatError(
            f"block {int(blocks[i])}: stored scale {_show(stored[i])} is not the stand-in {_show(np.asarray(want)[i])} the "
            f"import writes for the recorded original {_show(originals[i])} ({int(diff.sum())} such block(s)): "
            "the data contradicts the record",
            field=field, tensor=tensor,
        )


def restore_scales(scales: np.ndarray, raw_record: bytes, *, key: str = "", rule: StandIn | None = None,
                   tensor: str | None = None, into: np.ndarray | None = None) -> np.ndarray:
    """Return a copy of ``scales`` (a 1-D numeric array) with the recorded original bits put back;
    given the importer's ``rule``, after :func:`check_stand_ins` (every exporter passes it).
    ``into``: an array of the same size and item size (the export's own mapping of the stored
    scales) that receives the originals in place of the copy, and is returned; ``scales``,
    the stored ones, are what ``rule`` checks.  The record is decoded once."""
    s = np.asarray(scales).reshape(-1)
    blocks, orig = _checked_record(s, raw_record, key)
    if rule is not None:
        _check_stand_ins(s, blocks, orig, rule, key, tensor)
    out = np.array(s, copy=True) if into is None else into.reshape(-1)
    if out.size != s.size or out.dtype.itemsize != s.dtype.itemsize:
        raise UsageError(f"into holds {out.size} {out.dtype.itemsize}-byte scales, the stored scales are "
                         f"{s.size} of {s.dtype.itemsize} bytes")
    out.view(np.uint8).reshape(out.size, -1)[blocks] = orig
    return out


# ---------------------------------------------------------------------------
# byte runs: bytes of a source file that no tensor holds (GGUF padding and gaps that are
# not zero), kept so that an export writes them back::
#
#     value = bytes: entries of  u32 part | u64 offset | u64 length | length bytes
#
# ``part`` is the file of a set (a GGUF shard; 0 for one file), ``offset`` absolute in it;
# entries ascend by (part, offset) and never overlap or touch an empty run.

_RUN = struct.Struct("<IQQ")


def encode_byte_runs(runs: Iterable[tuple[int, int, Any]]) -> bytes:
    """``runs``: ``(part, offset, bytes-like)`` in ascending (part, offset) order."""
    out = bytearray()
    for part, offset, data in runs:
        mv = memoryview(data).cast("B")
        out += _RUN.pack(part, offset, mv.nbytes)
        out += mv
    return bytes(out)


def decode_byte_runs(raw: bytes, *, key: str = "") -> list[tuple[int, int, memoryview]]:
    """The runs of a record, checked: complete entries, non-empty, ascending, disjoint."""
    field = key or "byte runs record"
    mv = memoryview(raw).cast("B")
    runs: list[tuple[int, int, memoryview]] = []
    pos, prev = 0, (-1, -1)
    while pos < mv.nbytes:
        if mv.nbytes - pos < _RUN.size:
            raise FormatError(f"entry {len(runs)} at byte {pos} is truncated ({mv.nbytes - pos} of {_RUN.size} header bytes)",
                              field=field)
        part, offset, length = _RUN.unpack_from(mv, pos)
        pos += _RUN.size
        if length == 0 or length > mv.nbytes - pos:
            raise FormatError(f"entry {len(runs)} claims {length} bytes, {mv.nbytes - pos} remain", field=field)
        if (part, offset) < prev:
            raise FormatError(f"entry {len(runs)} (part {part}, offset {offset}) overlaps or precedes the one before",
                              field=field)
        runs.append((part, offset, mv[pos : pos + length]))
        pos += length
        prev = (part, offset + length)
    return runs
