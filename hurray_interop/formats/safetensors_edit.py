"""``edit`` for safetensors: ``__metadata__`` (string -> string) rewritten, the tensor data
copied by the kernel.

The header is the file's JSON object with ``__metadata__`` replaced where it stood (a new one
goes first, where the safetensors package writes it; none is written when every key is
deleted), written compactly as the safetensors package writes it and padded with spaces to a
multiple of 8; the tensor entries keep their order and values (their offsets are relative to
the data, which does not move).  When the metadata does not change the header is kept byte
for byte, so an edit without changes writes a byte-identical file.  Every value is a string:
``--set`` takes the text verbatim, the only TYPE is ``STRING``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from ..core.edits import Edit, EditResult, ValueKind, apply_edits, write_edited
from ..files.atomic import AtomicOutput
from ..files.positional import PositionalWriter
from .safetensors import SafetensorsFile

__all__ = ["edit_safetensors", "ST_CODEC"]

META = "__metadata__"


class SafetensorsCodec:
    """safetensors ``__metadata__``: strings only."""

    kinds = {"STRING": ValueKind("STRING", "string")}
    strings_only = True

    def owned(self, key: str) -> str | None:
        return "hurray_interop.* keys are this tool's own records" if key.startswith("hurray_interop.") else None

    def infer(self, value: Any) -> ValueKind:
        return self.kinds["STRING"]

    def kind_of(self, value: str) -> tuple[ValueKind, bool] | None:
        return self.kinds["STRING"], False

    def make(self, kind: ValueKind, value: Any, array: bool) -> str:
        return value

    def show(self, value: str) -> str:
        return repr(value) if len(value) <= 60 else repr(value[:57]) + "..."

    def same(self, a: str, b: str) -> bool:
        return a == b


ST_CODEC = SafetensorsCodec()


def _header(st: SafetensorsFile, metadata: dict[str, str] | None) -> bytes:
    """The new JSON header (see the module docstring)."""
    if metadata == st.metadata and list(metadata or ()) == list(st.metadata or ()):
        return st.header_bytes
    obj = json.loads(st.header_bytes)
    new: dict[str, Any] = {META: metadata} if metadata and META not in obj else {}
    for k, v in obj.items():
        if k != META:
            new[k] = v
        elif metadata:
            new[k] = metadata
    h = json.dumps(new, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return h + b" " * (-len(h) % 8)


def _write(st: SafetensorsFile, out: AtomicOutput, header: bytes, fd: int, size: int) -> None:
    n = size - st.data_offset
    pw = PositionalWriter(out, 8 + len(header) + n)
    pw.pwrite(len(header).to_bytes(8, "little") + header, 0)
    if n:
        pw.copy(fd, st.data_offset, n, 8 + len(header))


def edit_safetensors(src: str, dst: str | None, edits: Sequence[Edit], *, force: bool = False,
                     dry_run: bool = False) -> EditResult:
    """Apply ``edits`` to the ``__metadata__`` of ``src`` into ``dst`` (None: in place)."""
    with SafetensorsFile(src) as st:
        entries, changes = apply_edits(list((st.metadata or {}).items()), edits, ST_CODEC, path=src)
        metadata = {e.key: e.value for e in entries}
        if not metadata and not st.metadata:
            metadata = st.metadata  # nothing before, nothing after: as it was (absent or {})
        header = _header(st, metadata)
        target = write_edited(src, dst, lambda out, fd: _write(st, out, header, fd, os.fstat(fd).st_size),
                              force=force, dry_run=dry_run)
    return EditResult(os.fspath(src), "safetensors", (os.fspath(target),), tuple(changes), dry_run)
