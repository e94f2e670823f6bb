"""``edit`` for ``.hrry``: the KV section rewritten, everything else kept byte for byte.

A .hrry is ``header | tensors | KV section | pad to 8 | index | trailer`` (core/hrry.py); the
new file is the old one up to its KV section (where the index began, for a file without
one) copied by the kernel, the new section (keys in file order, an untouched entry's bytes
as they were: the encoding is canonical), zero padding to 8, the old index and what followed
it copied, and the trailer with the new offsets (the index is unchanged, so is its CRC).  A
file whose KV section lies anywhere else is refused.  ``hurray_interop.*`` keys are the
tool's records and are refused; a caller that maintains records about the other keys
(the GGUF value types of an import from GGUF) passes ``records``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from ..errors import UnsupportedError
from ..files.atomic import AtomicOutput
from ..files.positional import PositionalWriter
from .edits import Edit, EditResult, Entry, ValueKind, apply_edits, int_kinds, write_edited
from .hrry import FLAG_HAS_KV_METADATA, FileHeader, HrryFile, Trailer, TRAILER_SIZE
from .kv import KVValue, encode_kv

__all__ = ["edit_hrry", "HRRY_CODEC", "RECORD_PREFIX"]

#: the prefix of the tool's own records (refused)
RECORD_PREFIX = "hurray_interop."

_KINDS = [ValueKind("string", "string"), *int_kinds([("int64", 64, True), ("uint64", 64, False)]),
          ValueKind("float64", "float", bits=64), ValueKind("bool", "bool"), ValueKind("bytes", "bytes")]


class HrryCodec:
    """The .hrry KV types for :mod:`.edits` (pyhurray's mapping: bool -> bool, int -> int64
    (uint64 above it), float -> float64, str -> string)."""

    kinds = {k.name.upper(): k for k in _KINDS}
    strings_only = False

    def owned(self, key: str) -> str | None:
        return "hurray_interop.* keys are this tool's own records" if key.startswith(RECORD_PREFIX) else None

    def infer(self, value: Any) -> ValueKind:
        if isinstance(value, bool):
            return self.kinds["BOOL"]
        if isinstance(value, int):
            return self.kinds["INT64" if value <= self.kinds["INT64"].hi else "UINT64"]
        return self.kinds["FLOAT64" if isinstance(value, float) else "STRING"]

    def kind_of(self, value: KVValue) -> tuple[ValueKind, bool] | None:
        if value.type == "array":
            return self.kinds[str(value.element_type).upper()], True
        return self.kinds[value.type.upper()], False

    def make(self, kind: ValueKind, value: Any, array: bool) -> KVValue:
        return KVValue.array(kind.name, value) if array else KVValue(kind.name, value)

    def show(self, value: KVValue) -> str:
        if value.type == "bytes":
            return f"bytes x {len(value.view())}"
        if value.type == "array":
            items = list(value.value)
            head = ", ".join(_short(x) for x in items[:4]) + (", ..." if len(items) > 4 else "")
            return f"[{value.element_type}] x {len(items)} [{head}]"
        return f"{value.type} {_short(value.value)}"

    def same(self, a: KVValue, b: KVValue) -> bool:
        return a == b


def _short(x: Any, width: int = 60) -> str:
    text = repr(x) if isinstance(x, (str, bytes)) else str(x).lower() if isinstance(x, bool) else str(x)
    return text if len(text) <= width else text[: width - 3] + "..."


HRRY_CODEC = HrryCodec()

#: ``records(old_kv, entries, path) -> entries``: the tool's records brought in step with an edit
Records = Callable[[dict[str, KVValue], list[Entry], str], list[Entry]]


def _cut(hf: HrryFile) -> int:
    """Where the new KV section goes: the old one's offset, or the index's when there is none."""
    t = hf.trailer
    if not t.kv_offset:
        return t.index_offset
    if -(-(t.kv_offset + t.kv_length) // 8) * 8 != t.index_offset:
        raise UnsupportedError("the KV section does not lie just before the index; edit cannot rewrite this layout",
                               path=hf.path, field="kv_offset", offset=hf.size - TRAILER_SIZE + 16)
    return t.kv_offset


def _write(hf: HrryFile, out: AtomicOutput, kv: bytes, fd: int) -> None:
    t, cut = hf.trailer, _cut(hf)
    ioff = cut + len(kv) + (-len(kv) % 8) if kv else cut
    rest = hf.size - TRAILER_SIZE - t.index_offset  # the index and anything before the trailer
    pw = PositionalWriter(out, ioff + rest + TRAILER_SIZE)
    pw.copy(fd, 0, cut, 0)
    if kv:
        pw.pwrite(kv, cut)
    pw.copy(fd, t.index_offset, rest, ioff)
    trailer = Trailer(ioff, t.index_length, cut if kv else 0, len(kv), t.index_crc32c)
    pw.pwrite(trailer.encode(), ioff + rest)
    h = hf.header
    if not kv and h.flags & FLAG_HAS_KV_METADATA:  # no section left: the flag may not claim one
        flags = h.flags & ~FLAG_HAS_KV_METADATA
        pw.pwrite(FileHeader(h.version_major, h.version_minor, flags, h.alignment, h.first_descriptor_offset,
                             h.tensor_count_hint).encode(), 0)


def edit_hrry(src: str, dst: str | None, edits: Sequence[Edit], *, force: bool = False, dry_run: bool = False,
              records: Records | None = None) -> EditResult:
    """Apply ``edits`` to the KV section of ``src`` into ``dst`` (None: in place)."""
    with HrryFile(src) as hf:
        old = hf.kv
        entries, changes = apply_edits(list(old.items()), edits, HRRY_CODEC, path=src)
        if records is not None:
            entries = records(old, entries, src)
        kv = encode_kv({e.key: e.value for e in entries}) if entries else b""
        _cut(hf)
        target = write_edited(src, dst, lambda out, fd: _write(hf, out, kv, fd), force=force, dry_run=dry_run)
    return EditResult(os.fspath(src), "hurray", (os.fspath(target),), tuple(changes), dry_run)
