"""``edit`` for GGUF: the header and metadata rewritten, everything else kept byte for byte.

The new file is the old header with the new metadata count, the metadata in file order
(an entry left alone keeps its exact bytes, a renamed one its value's bytes), the tensor
infos as they were, zero padding to ``general.alignment`` (the old padding bytes when the
metadata's length did not change) and the old data region -- tensor data, the padding
between tensors and the file's tail -- copied by the kernel
(:meth:`~hurray_interop.files.positional.PositionalWriter.copy`).  Tensor offsets are
relative to the data region, so they stay valid.  The version is kept.

A split set (docs/commands.md, ``edit``): any shard names the set; the model metadata is
the first shard's.  Into DST every shard is written (the first rewritten, the others
copied whole by the kernel) under DST's shard names, all or none (AtomicOutputSet);
in place only the first shard is replaced, the others are left as they are.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Sequence

from ..core.edits import Edit, EditResult, Entry, ValueKind, apply_edits, int_kinds
from ..errors import InconsistentError
from ..files.atomic import AtomicOutputSet, check_output_path
from ..files.positional import PositionalWriter
from . import gguf as G
from . import gguf_split as S

__all__ = ["edit_gguf", "GGUF_CODEC"]

_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
T = G.ValueType

_KINDS = [
    *int_kinds([("UINT8", 8, False), ("INT8", 8, True), ("UINT16", 16, False), ("INT16", 16, True),
                ("UINT32", 32, False), ("INT32", 32, True), ("UINT64", 64, False), ("INT64", 64, True)]),
    ValueKind("FLOAT32", "float", bits=32), ValueKind("FLOAT64", "float", bits=64),
    ValueKind("BOOL", "bool"), ValueKind("STRING", "string"),
]


class GGUFCodec:
    """GGUF's value types for :mod:`hurray_interop.core.edits` (gguf-py's inference:
    bool -> BOOL, int -> INT32 (INT64, then UINT64, when it does not fit), float -> FLOAT32,
    str -> STRING)."""

    kinds = {k.name: k for k in _KINDS}
    strings_only = False

    def owned(self, key: str) -> str | None:
        if key.startswith("split."):
            return "split.* keys describe the split set (gguf-split writes them; convert --merge or --split-max-* change it)"
        if key == "general.alignment":
            return "it places the tensor data, which edit copies as it is (convert lays the data out anew)"
        if key.startswith("hurray_interop."):
            return "hurray_interop.* keys are this tool's own records"
        return None

    def infer(self, value: Any) -> ValueKind:
        if isinstance(value, bool):
            return self.kinds["BOOL"]
        if isinstance(value, int):
            return next((self.kinds[n] for n in ("INT32", "INT64", "UINT64")
                         if self.kinds[n].lo <= value <= self.kinds[n].hi), self.kinds["INT32"])
        return self.kinds["FLOAT32" if isinstance(value, float) else "STRING"]

    def kind_of(self, value: G.GGUFValue) -> tuple[ValueKind, bool] | None:
        if value.type != T.ARRAY:
            return self.kinds[value.type.name], False
        et = value.element_type
        return None if et is None or et == T.ARRAY else (self.kinds[et.name], True)

    def make(self, kind: ValueKind, value: Any, array: bool) -> G.GGUFValue:
        if array:
            return G.GGUFValue.of(T.ARRAY, value, T[kind.name])
        return G.GGUFValue.of(T[kind.name], value)

    def show(self, value: G.GGUFValue) -> str:
        if value.type == T.ARRAY:
            et = value.element_type.name if value.element_type is not None else "?"
            items = value.to_python("replace") if value.element_type != T.ARRAY else []
            head = ", ".join(_short(x) for x in items[:4]) + (", ..." if len(items) > 4 else "")
            return f"[{et}] x {len(value)} [{head}]"
        return f"{value.type.name} {_short(value.to_python('replace'))}"

    def same(self, a: G.GGUFValue, b: G.GGUFValue) -> bool:
        return a == b


def _short(x: Any, width: int = 60) -> str:
    text = repr(x) if isinstance(x, str) else str(x).lower() if isinstance(x, bool) else str(x)
    return text if len(text) <= width else text[: width - 3] + "..."


GGUF_CODEC = GGUFCodec()


def _raw_records(gf: G.GGUFFile) -> list[memoryview]:
    """Each metadata record's exact bytes (key, type, value), in file order."""
    mv = memoryview(gf._buf)
    starts = list(gf.kv_offsets.values()) + [gf.tensor_infos_offset]
    return [mv[a:b] for a, b in zip(starts, starts[1:])]


def _record(e: Entry, raw: list[memoryview], old_keys: list[str]) -> list[Any]:
    """The bytes of one metadata record of the new file."""
    kb = G._encode_name(e.key)
    if e.source is not None:
        r = raw[e.source]
        if e.key == old_keys[e.source]:
            return [r]
        return [_U64.pack(len(kb)), kb, r[8 + len(G._encode_name(old_keys[e.source])):]]
    return [_U64.pack(len(kb)), kb, _U32.pack(int(e.value.type)), G.encode_value(e.value)]


def _padding(gf: G.GGUFFile, end: int) -> Any:
    """The bytes between the new tensor infos (ending at ``end``) and the data region: the
    old ones when the length did not change (a no-op edit is byte-identical), else zeros to
    the alignment -- none for a file without data that ended unpadded (a vocabulary file)."""
    old_end = min(gf.data_offset, gf.file_size)
    if end == gf.metadata_end:
        return memoryview(gf._buf)[gf.metadata_end : old_end]
    if gf.data_offset >= gf.file_size and not gf.ends_padded:
        return b""
    return bytes(-end % gf.alignment)


def _new_head(gf: G.GGUFFile, entries: Sequence[Entry]) -> list[Any]:
    """The new file's bytes up to its data region (header, metadata, tensor infos, padding)."""
    raw, keys = _raw_records(gf), list(gf.kv)
    parts: list[Any] = [struct.pack("<4sIQQ", G.MAGIC, gf.version, len(gf.tensors), len(entries))]
    for e in entries:
        parts += _record(e, raw, keys)
    parts.append(memoryview(gf._buf)[gf.tensor_infos_offset : gf.metadata_end])
    parts.append(_padding(gf, sum(len(p) for p in parts)))
    return parts


def _write_first(out: Any, gf: G.GGUFFile, entries: Sequence[Entry], src_fd: int) -> None:
    parts = _new_head(gf, entries)
    for p in parts:
        out.write(p)
    data_offset = sum(len(p) for p in parts)
    n = max(0, gf.file_size - gf.data_offset)  # tensor data, the padding between, the tail
    pw = PositionalWriter(out, data_offset + n)
    if n:
        pw.copy(src_fd, gf.data_offset, n, data_offset)


def _copy_whole(out: Any, size: int, src_fd: int) -> None:
    pw = PositionalWriter(out, size)
    if size:
        pw.copy(src_fd, 0, size, 0)


def _open_fd(path: str, size: int) -> int:
    """The source opened again for the kernel's copy; it must still be the size it was parsed at."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    if os.fstat(fd).st_size != size:
        os.close(fd)
        raise InconsistentError(f"changed size while being edited (was {size} bytes)", path=path)
    return fd


def _outputs(shards: list[G.GGUFFile], paths: list[str], dst: str | None) -> list[str]:
    """Where the shards go: in place only the first shard; into DST every shard, under
    DST's shard names."""
    if dst is None:
        return [paths[0]]
    if len(shards) == 1:
        return [dst]
    return [os.fspath(p) for p in S.set_paths(dst, len(shards))]


def _write(shards: list[G.GGUFFile], paths: list[str], targets: list[str], entries: list[Entry],
           *, force: bool, in_place: bool) -> None:
    mode = os.stat(targets[0]).st_mode & 0o7777 if in_place else None  # in place: the file's own
    with AtomicOutputSet(targets, force=force or in_place, inputs=() if in_place else paths, mode=mode) as outs:
        for i, (gf, p) in enumerate(zip(shards[: len(targets)], paths)):
            fd = _open_fd(p, gf.file_size)
            try:
                out = outs.open(i)
                if i == 0:
                    _write_first(out, gf, entries, fd)
                else:
                    _copy_whole(out, gf.file_size, fd)
                outs.close(i)
            finally:
                os.close(fd)
        outs.commit()


def _model(src: str) -> tuple[list[G.GGUFFile], list[str], Any]:
    model = S.open_model(src)
    s = model.split_set
    if s is None:
        return [model], [os.fspath(src)], model
    return list(s.shards), [os.fspath(p) for p in s.paths], s


def edit_gguf(src: str, dst: str | None, edits: Sequence[Edit], *, force: bool = False,
              dry_run: bool = False) -> EditResult:
    """Apply ``edits`` to the model metadata of the GGUF file or split set ``src``, into
    ``dst`` (None: in place); see the module docstring."""
    shards, paths, owner = _model(src)
    try:
        entries, changes = apply_edits(list(shards[0].kv.items()), edits, GGUF_CODEC, path=paths[0])
        targets = _outputs(shards, paths, dst)
        if dry_run:
            for t in targets:
                check_output_path(t, force=force or dst is None, inputs=() if dst is None else paths)
        else:
            _write(shards, paths, targets, entries, force=force, in_place=dst is None)
        return EditResult(os.fspath(src), "gguf", tuple(targets), tuple(changes), dry_run)
    finally:
        owner.close()
