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
the scale buffer before writing it out.
"""

from __future__ import annotations

import struct

import numpy as np

from ..errors import FormatError

__all__ = ["SCALE_RECORD_PREFIX", "scale_record_key", "encode_scale_record", "decode_scale_record", "restore_scales"]

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


def restore_scales(scales: np.ndarray, raw_record: bytes, *, key: str = "") -> np.ndarray:
    """Return a copy of ``scales`` (a 1-D numeric array) with the recorded original bits put back."""
    blocks, orig = decode_scale_record(raw_record, key=key)
    out = np.array(scales, copy=True).reshape(-1)
    if orig.shape[1] != out.dtype.itemsize:
        raise FormatError(
            f"scale substitution record stores {orig.shape[1]}-byte scales, buffer has {out.dtype.itemsize}-byte scales",
            field=key or "scale record",
        )
    if blocks.size and int(blocks[-1]) >= out.size:  # ascending, so the last is the largest
        raise FormatError(
            f"scale substitution record names block {int(blocks[-1])}, tensor has {out.size} blocks",
            field=key or "scale record",
        )
    out.view(np.uint8).reshape(out.size, -1)[blocks.astype(np.intp)] = orig
    return out
