"""``.hrry`` files: a memory-mapped strict reader and a one-pass streaming writer.

File layout (file-format.md; byte behaviour of the reference writer, which is
what ``pyhurray`` and the conformance vector ``basic.hrry`` follow)::

    [header 64 B][pad to first_descriptor_offset]
    per tensor: descriptor | pad to A | buf0 | pad to A | buf1 … | last buf | pad to 8
    [KV section][pad to 8][index][trailer 40 B]

where ``A`` is ``data_buffer_alignment``.  The reference deviates from the
spec's writer prose in two places and we follow the reference bytes (see
docs/format-notes.md § 2.7): there is no ``A`` padding after a tensor's last buffer
(F1), and a composite head (no buffers) is still padded to ``A`` (F2).  The
header flag ``HAS_KV_METADATA`` is left clear even when a KV section exists
(F3); the reader accepts the flag or non-zero trailer fields.

Reader (:class:`HrryFile`): opening validates the header, the trailer, the
index (CRC-32C, names, flags, alignment and non-overlap of every range) and
nothing else — its cost is proportional to the index.  Descriptors are
decoded on first use (``descriptor``/``tensor``) and their consistency with the
index is checked then; :meth:`HrryFile.validate` checks everything.  Buffers
are zero-copy read-only ``uint8`` views of the memory map.

Writer (:class:`HrryWriter`): forward only, one tensor at a time, buffers may
be iterables of chunks; output goes through :class:`~.atomic.AtomicOutput`
so that a failure leaves nothing behind.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence, Union

import google_crc32c as _crc32c
import numpy as np

from ..errors import (
    BadMagicError,
    ChecksumError,
    FormatError,
    HurrayInteropError,
    InconsistentError,
    TruncatedError,
    UnsupportedError,
    UsageError,
)
from ..files.binary import Reader
from ..parallel import prefetch_chunks
from ..files.atomic import AtomicOutput
from ..files.positional import PositionalWriter
from .composite import check_nesting, validate_composite
from .descriptor import decode_descriptor, encode_descriptor, validate_parameter_values
from .kv import KVValue, StreamedBytes, decode_kv, encode_kv_parts
from .model import Descriptor, Tensor

__all__ = [
    "FILE_MAGIC",
    "TRAILER_MAGIC",
    "HEADER_SIZE",
    "TRAILER_SIZE",
    "FLAG_HAS_KV_METADATA",
    "FLAG_SORTED_INDEX",
    "FLAG_HAS_INDEX_CRC32C",
    "COUNT_UNKNOWN",
    "FileHeader",
    "Trailer",
    "IndexEntry",
    "HrryFile",
    "open_hrry",
    "HrryWriter",
    "save",
    "load",
]

FILE_MAGIC = b"HRRYFILE"
TRAILER_MAGIC = b"HRRY"
HEADER_SIZE = 64
TRAILER_SIZE = 40
INDEX_ENTRY_FIXED = 2 + 8 + 4 + 8 + 8 + 4  # everything but the name bytes
FLAG_HAS_KV_METADATA = 0x1
FLAG_SORTED_INDEX = 0x2
FLAG_HAS_INDEX_CRC32C = 0x4
_KNOWN_FLAGS = FLAG_HAS_KV_METADATA | FLAG_SORTED_INDEX | FLAG_HAS_INDEX_CRC32C
COUNT_UNKNOWN = 0xFFFFFFFFFFFFFFFF
MIN_ALIGNMENT = 4096
MAX_ALIGNMENT = 2 * 1024 * 1024
#: the writer copies buffers in slices of at most this many bytes
CHUNK = 64 * 1024 * 1024

_HEADER = struct.Struct("<8sBB2sIIQQ28s")
_TRAILER = struct.Struct("<QQQII4s4s")
_ENTRY_TAIL = struct.Struct("<QIQQI")
_ZEROS = bytes(MAX_ALIGNMENT)

BytesLike = Union[bytes, bytearray, memoryview, np.ndarray]
BufferSource = Union[BytesLike, Iterable[BytesLike]]


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def crc32c(data: "bytes | memoryview") -> int:
    """CRC-32C (Castagnoli), via Google's ``google-crc32c`` package (hardware accelerated;
    it takes ``bytes`` only, and the index it checks is small)."""
    return _crc32c.value(data if isinstance(data, bytes) else bytes(data))


@dataclass(frozen=True)
class FileHeader:
    version_major: int
    version_minor: int
    flags: int
    alignment: int  # data_buffer_alignment
    first_descriptor_offset: int
    tensor_count_hint: int  # COUNT_UNKNOWN if unknown

    @property
    def sorted_index(self) -> bool:
        return bool(self.flags & FLAG_SORTED_INDEX)

    @property
    def has_index_crc32c(self) -> bool:
        return bool(self.flags & FLAG_HAS_INDEX_CRC32C)

    def encode(self) -> bytes:
        return _HEADER.pack(
            FILE_MAGIC,
            self.version_major,
            self.version_minor,
            b"\0\0",
            self.flags,
            self.alignment,
            self.first_descriptor_offset,
            self.tensor_count_hint,
            bytes(28),
        )


@dataclass(frozen=True)
class Trailer:
    index_offset: int
    index_length: int
    kv_offset: int
    kv_length: int
    index_crc32c: int

    def encode(self) -> bytes:
        return _TRAILER.pack(
            self.index_offset, self.index_length, self.kv_offset, self.kv_length, self.index_crc32c, bytes(4), TRAILER_MAGIC
        )


@dataclass(frozen=True)
class IndexEntry:
    name: str
    descriptor_offset: int
    descriptor_length: int
    data_offset: int
    data_length: int
    flags: int = 0
    #: absolute file offset of this entry (for error messages); -1 when not from a file
    entry_offset: int = -1

    def encode(self) -> bytes:
        nb = self.name.encode("utf-8")
        return struct.pack("<H", len(nb)) + nb + _ENTRY_TAIL.pack(
            self.descriptor_offset, self.descriptor_length, self.data_offset, self.data_length, self.flags
        )


# ---------------------------------------------------------------------------
# reader


class HrryFile:
    """A ``.hrry`` file opened for reading (memory-mapped, read-only).

    Use as a context manager, or call :meth:`close`.  Iteration yields tensor
    names in index order; ``name in f`` and ``len(f)`` work; ``f[name]`` is
    :meth:`tensor`.
    """

    def __init__(self, path: "str | os.PathLike[str]") -> None:
        self.path = Path(os.fspath(path))
        self._p = os.fspath(self.path)
        self._closed = True
        self._descriptors: dict[str, Descriptor] = {}
        self._kv: dict[str, KVValue] | None = None
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            raise UsageError("no such file", path=self._p) from None
        except IsADirectoryError:
            raise UsageError("is a directory, not a .hrry file", path=self._p) from None
        except PermissionError:
            raise UsageError("cannot read: permission denied", path=self._p) from None
        except OSError as e:
            raise UsageError(f"cannot open: {e.strerror or e}", path=self._p) from None
        with f:
            self.size = os.fstat(f.fileno()).st_size
            if self.size == 0:
                raise TruncatedError("empty file", path=self._p, field="file header", offset=0)
            try:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:
                raise UsageError(f"cannot memory-map: {e}", path=self._p) from None
        self._closed = False
        try:
            self._mv = memoryview(self._mm)
            self._u8 = np.frombuffer(self._mm, dtype=np.uint8)
            self._open()
        except BaseException:
            self.close()
            raise

    # -- opening -------------------------------------------------------------

    def _err(self, cls: type[FormatError], msg: str, field: str, offset: int, tensor: str | None = None) -> FormatError:
        return cls(msg, path=self._p, field=field, offset=offset, tensor=tensor)

    def _open(self) -> None:
        size = self.size
        magic = bytes(self._mv[:8])
        if magic != FILE_MAGIC[: len(magic)]:
            raise self._err(BadMagicError, f"not a Hurray file (magic {magic!r}, expected b'HRRYFILE')", "file magic", 0)
        r = Reader(self._mv, 0, HEADER_SIZE, path=self._p)
        minimum = HEADER_SIZE + 8 + TRAILER_SIZE
        if size < minimum:
            raise self._err(
                TruncatedError, f"file of {size} bytes is shorter than the minimum {minimum}", "file", size
            )
        (_, major, minor, res, flags, align, first, hint, res2) = r.unpack(_HEADER, "file header")
        if major == 0:
            raise self._err(FormatError, "container_version_major 0 is invalid", "container_version_major", 8)
        if major > 1:
            raise UnsupportedError(
                f"container version {major}.{minor} is newer than the supported 1.x",
                path=self._p,
                field="container_version_major",
                offset=8,
            )
        if any(res):
            raise self._err(FormatError, "reserved bytes must be zero", "header _reserved", 10)
        if flags & ~_KNOWN_FLAGS:
            raise self._err(FormatError, f"reserved file flag bits set (0x{flags:08X})", "file_flags", 12)
        if align & (align - 1) or not MIN_ALIGNMENT <= align <= MAX_ALIGNMENT:
            raise self._err(
                FormatError,
                f"{align} is not a power of two between {MIN_ALIGNMENT} and {MAX_ALIGNMENT}",
                "data_buffer_alignment",
                16,
            )
        if first < HEADER_SIZE or first % 8:
            raise self._err(FormatError, f"{first} is not an 8-aligned offset >= 64", "first_descriptor_offset", 20)
        if any(res2):
            raise self._err(FormatError, "reserved bytes must be zero", "header _reserved_header", 36)
        self.header = FileHeader(major, minor, flags, align, first, hint)

        # trailer
        t0 = size - TRAILER_SIZE
        tr = Reader(self._mv, t0, size, path=self._p)
        raw = tr.unpack(_TRAILER, "trailer")
        (ioff, ilen, kvoff, kvlen, crc, tres, tmagic) = raw
        if tmagic != TRAILER_MAGIC:
            raise self._err(BadMagicError, f"trailer magic is {tmagic!r}, expected b'HRRY': the file looks truncated or "
                            "incomplete (a .hrry ends with its trailer)", "trailer_magic", t0 + 36)
        if any(tres):
            raise self._err(FormatError, "reserved bytes must be zero", "trailer _reserved", t0 + 32)
        end_of_body = t0
        if ioff + ilen > end_of_body:
            raise self._err(
                TruncatedError, f"index [{ioff}, {ioff + ilen}) runs into the trailer at {t0}", "index_length", t0 + 8
            )
        if ioff % 8:
            raise self._err(FormatError, f"index offset {ioff} is not 8-aligned", "index_offset", t0)
        if ioff < first:
            raise self._err(InconsistentError, f"index offset {ioff} lies inside the file header", "index_offset", t0)
        if ilen < 8:
            raise self._err(TruncatedError, f"index of {ilen} bytes cannot hold its entry count", "index_length", t0 + 8)
        has_kv_fields = kvoff != 0 or kvlen != 0
        if has_kv_fields and (kvoff == 0 or kvlen == 0):
            raise self._err(
                InconsistentError, f"kv_offset {kvoff} and kv_length {kvlen} must be both zero or both non-zero", "kv_offset", t0 + 16
            )
        if flags & FLAG_HAS_KV_METADATA and not has_kv_fields:
            raise self._err(
                InconsistentError, "HAS_KV_METADATA is set but the trailer locates no KV section", "kv_offset", t0 + 16
            )
        if has_kv_fields:
            if kvoff % 8:
                raise self._err(FormatError, f"KV offset {kvoff} is not 8-aligned", "kv_offset", t0 + 16)
            if kvoff < first or kvoff + kvlen > end_of_body:
                raise self._err(
                    TruncatedError if kvoff + kvlen > end_of_body else InconsistentError,
                    f"KV section [{kvoff}, {kvoff + kvlen}) is outside the body [{first}, {end_of_body})",
                    "kv_offset",
                    t0 + 16,
                )
        if flags & FLAG_HAS_INDEX_CRC32C:
            actual = crc32c(self._mv[ioff : ioff + ilen])
            if actual != crc:
                raise self._err(
                    ChecksumError, f"index CRC-32C is 0x{actual:08X}, trailer says 0x{crc:08X}", "index_crc32c", t0 + 28
                )
        elif crc != 0:
            raise self._err(
                FormatError, f"index_crc32c is 0x{crc:08X} but HAS_INDEX_CRC32C is clear (must be 0)", "index_crc32c", t0 + 28
            )
        self.trailer = Trailer(ioff, ilen, kvoff, kvlen, crc)
        self._parse_index()

    def _parse_index(self) -> None:
        h, t = self.header, self.trailer
        ioff, ilen = t.index_offset, t.index_length
        r = Reader(self._mv, ioff, ioff + ilen, path=self._p)
        count = r.u64("index_entry_count")
        if count * (INDEX_ENTRY_FIXED + 1) > r.remaining:
            raise self._err(
                TruncatedError,
                f"index_entry_count {count} cannot fit in the {r.remaining} index bytes that follow",
                "index_entry_count",
                ioff,
            )
        entries: list[IndexEntry] = []
        by_name: dict[str, int] = {}
        align = h.alignment
        for i in range(count):
            at = r.pos
            nlen = r.u16(f"index entry {i} name_length")
            if nlen == 0:
                raise self._err(FormatError, "name_length must be at least 1", f"index entry {i} name_length", at)
            raw = r.view(nlen, f"index entry {i} name")
            try:
                name = str(raw, "utf-8")
            except UnicodeDecodeError as e:
                raise self._err(
                    FormatError, f"tensor name is not valid UTF-8 ({e.reason})", f"index entry {i} name", at + 2 + e.start
                ) from None
            if name in by_name:
                raise self._err(InconsistentError, f"duplicate tensor name {name!r}", f"index entry {i} name", at + 2)
            tail = r.pos
            doff, dlen, daoff, dalen, eflags = r.unpack(_ENTRY_TAIL, f"index entry {i}")
            if eflags:
                raise self._err(FormatError, f"index entry flags must be 0, got 0x{eflags:08X}", "index entry flags", tail + 28, name)
            if doff % 8:
                raise self._err(FormatError, f"descriptor offset {doff} is not 8-aligned", "descriptor_offset", tail, name)
            if dlen < 20:
                raise self._err(FormatError, f"descriptor_length {dlen} is below the minimum 20", "descriptor_length", tail + 8, name)
            if dalen and daoff % align:
                raise self._err(
                    FormatError, f"data offset {daoff} is not a multiple of data_buffer_alignment {align}", "data_offset", tail + 12, name
                )
            by_name[name] = i
            entries.append(IndexEntry(name, doff, dlen, daoff, dalen, eflags, at))
        if r.remaining:
            raise self._err(
                InconsistentError, f"{r.remaining} unused bytes after the last index entry", "index", r.pos
            )
        if h.sorted_index:
            for a, b in zip(entries, entries[1:]):
                if a.name.encode("utf-8") >= b.name.encode("utf-8"):
                    raise self._err(
                        InconsistentError, f"SORTED_INDEX is set but {b.name!r} follows {a.name!r}", "index", b.entry_offset
                    )
        self.entries: tuple[IndexEntry, ...] = tuple(entries)
        self._by_name = by_name
        self._check_ranges()
        order = sorted(range(len(entries)), key=lambda k: entries[k].descriptor_offset)
        self._order = order  # entry numbers by ascending descriptor_offset
        self._rank = {entries[k].name: pos for pos, k in enumerate(order)}

    def _check_ranges(self) -> None:
        """Every range inside the file body; no two non-empty ranges overlap."""
        h, t = self.header, self.trailer
        body_end = self.size - TRAILER_SIZE
        spans: list[tuple[int, int, str, str | None, str, int]] = [
            (0, h.first_descriptor_offset, "file header", None, "first_descriptor_offset", 20),
            (t.index_offset, t.index_offset + t.index_length, "index", None, "index_offset", body_end),
        ]
        if t.kv_offset:
            spans.append((t.kv_offset, t.kv_offset + t.kv_length, "KV section", None, "kv_offset", body_end + 16))
        for e in self.entries:
            tail = e.entry_offset + 2 + len(e.name.encode("utf-8"))
            for start, length, what, fo in (
                (e.descriptor_offset, e.descriptor_length, "descriptor", tail),
                (e.data_offset, e.data_length, "data", tail + 12),
            ):
                end = start + length
                if end > body_end:
                    raise self._err(
                        TruncatedError,
                        f"{what} range [{start}, {end}) extends past the tensor data (file body ends at {body_end})",
                        f"{what}_offset",
                        fo,
                        e.name,
                    )
                if start < h.first_descriptor_offset:
                    raise self._err(
                        InconsistentError,
                        f"{what} offset {start} lies before first_descriptor_offset {h.first_descriptor_offset}",
                        f"{what}_offset",
                        fo,
                        e.name,
                    )
                if length:
                    spans.append((start, end, what, e.name, f"{what}_offset", fo))
        spans.sort(key=lambda s: (s[0], s[1]))
        for a, b in zip(spans, spans[1:]):
            if b[0] < a[1]:
                def label(s: tuple[Any, ...]) -> str:
                    return f"{s[2]} of tensor {s[3]!r}" if s[3] is not None else s[2]

                raise self._err(
                    InconsistentError,
                    f"{label(b)} [{b[0]}, {b[1]}) overlaps {label(a)} [{a[0]}, {a[1]})",
                    b[4],
                    b[5],
                    b[3],
                )

    # -- basic protocol --------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("file is closed", path=self._p)

    @property
    def names(self) -> tuple[str, ...]:
        """Tensor names in index order."""
        return tuple(e.name for e in self.entries)

    @property
    def alignment(self) -> int:
        return self.header.alignment

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._by_name:
            raise KeyError(name)
        return self.tensor(name)

    def entry(self, name: str) -> IndexEntry:
        try:
            return self.entries[self._by_name[name]]
        except KeyError:
            raise UsageError(f"no tensor named {name!r}", path=self._p) from None

    def __enter__(self) -> "HrryFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Release the mapping (it stays alive while tensors returned from it do)."""
        if self._closed:
            return
        self._closed = True
        for attr in ("_u8", "_mv"):
            obj = self.__dict__.pop(attr, None)
            if isinstance(obj, memoryview):
                try:
                    obj.release()
                except BufferError:
                    pass
        mm = self.__dict__.pop("_mm", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # tensors still reference it; freed with them
                pass

    def release_pages(self) -> None:
        """Unmap the pages read so far from this process (``MADV_DONTNEED``); the
        mapping is read-only, so a later access faults them in again from the page
        cache.  Streaming readers call it after each tensor to keep their resident
        memory bounded."""
        mm = self.__dict__.get("_mm")
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if mm is None or advice is None or self._closed:
            return
        try:
            mm.madvise(advice)
        except (OSError, ValueError):  # only a memory optimisation
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self.entries)} tensors"
        return f"<HrryFile {self._p!r} ({state})>"

    # -- KV --------------------------------------------------------------------

    @property
    def kv(self) -> dict[str, KVValue]:
        """The KV section in file order (decoded on first access; empty if absent)."""
        if self._kv is None:
            self._check_open()
            t = self.trailer
            self._kv = (
                decode_kv(self._mv[t.kv_offset : t.kv_offset + t.kv_length], path=self._p, base=t.kv_offset)
                if t.kv_offset
                else {}
            )
        return dict(self._kv)

    # -- descriptors and tensors -------------------------------------------------

    def descriptor(self, name: str) -> Descriptor:
        """The decoded descriptor of ``name`` (decoded once, then cached)."""
        d = self._descriptors.get(name)
        if d is not None:
            return d
        self._check_open()
        e = self.entry(name)
        do, dl = e.descriptor_offset, e.descriptor_length
        view = self._mv[do : do + dl]
        # the index duplicates the descriptor's own length field; they must agree
        if bytes(view[:4]) == b"HRRY":
            (own,) = struct.unpack_from("<I", view, 6)
            if own != dl:
                raise self._err(
                    InconsistentError,
                    f"descriptor says its length is {own}, the index says {dl}",
                    "descriptor_length",
                    do + 6,
                    name,
                )
        try:
            d = decode_descriptor(view, 0, path=self._p, tensor=name, base=do)
        except HurrayInteropError as err:
            raise err.located(path=self._p, tensor=name) from None
        self._check_data_length(e, d)
        self._descriptors[name] = d
        return d

    def _buffer_offsets(self, e: IndexEntry, d: Descriptor) -> list[int]:
        offs: list[int] = []
        p = e.data_offset
        n = len(d.buffers)
        for i, h in enumerate(d.buffers):
            offs.append(p)
            p += h.byte_size
            if i < n - 1:
                p = _align(p, self.header.alignment)
        return offs + [p]

    def buffer_offsets(self, name: str) -> list[int]:
        """The file offset of each buffer of tensor ``name`` (for copies by the kernel)."""
        return self._buffer_offsets(self.entry(name), self.descriptor(name))[:-1]

    def _check_data_length(self, e: IndexEntry, d: Descriptor) -> None:
        offs = self._buffer_offsets(e, d)
        expected = offs[-1] - e.data_offset
        if expected != e.data_length:
            tail = e.entry_offset + 2 + len(e.name.encode("utf-8"))
            raise self._err(
                InconsistentError,
                f"index data_length is {e.data_length} but the buffer table needs {expected} "
                f"({len(d.buffers)} buffers of {[h.byte_size for h in d.buffers]} bytes, aligned to {self.header.alignment})",
                "data_length",
                tail + 20,
                e.name,
            )

    def buffers(self, name: str) -> tuple[np.ndarray, ...]:
        """Zero-copy read-only uint8 views of each buffer of ``name`` (no value checks)."""
        d = self.descriptor(name)
        e = self.entry(name)
        offs = self._buffer_offsets(e, d)
        return tuple(self._u8[o : o + h.byte_size] for o, h in zip(offs, d.buffers))

    def tensor(self, name: str) -> Tensor:
        """The tensor ``name``: descriptor plus zero-copy buffer views.

        Quantization parameter values are validated.  A composite head gets its
        ``members`` (the tensors that follow it in descriptor order), and the
        composite's cross-member rules are checked.
        """
        return self._tensor(name, 0)

    def _tensor(self, name: str, depth: int) -> Tensor:
        d = self.descriptor(name)
        e = self.entry(name)
        data = self.buffers(name)
        offs = self._buffer_offsets(e, d)[:-1]
        try:
            validate_parameter_values(d, data, path=self._p, tensor=name, data_offsets=offs)
        except HurrayInteropError as err:
            raise err.located(path=self._p, tensor=name) from None
        members: tuple[Tensor, ...] = ()
        if d.is_composite:
            check_nesting(depth, path=self._p, tensor=name, offset=e.descriptor_offset)
            names = self.member_names(name)
            members = tuple(self._tensor(m, depth + 1) for m in names)
            validate_composite(name, d, [(m.name, m.descriptor) for m in members], path=self._p,
                               offset_of=lambda n: self.entry(n).descriptor_offset)
        return Tensor(name, d, data, members)

    def _subtree_end(self, pos: int, depth: int = 0) -> int:
        """Position (in descriptor order) just past the tensor at ``pos`` and its members."""
        name = self.entries[self._order[pos]].name
        d = self.descriptor(name)
        if not d.is_composite:
            return pos + 1
        check_nesting(depth, path=self._p, tensor=name, offset=self.entry(name).descriptor_offset)
        n = d.layout.member_count  # type: ignore[union-attr]
        p = pos + 1
        for k in range(n):
            if p >= len(self._order):
                raise self._torn(name, n, k)
            p = self._subtree_end(p, depth + 1)
        return p

    def _torn(self, name: str, n: int, k: int) -> FormatError:
        e = self.entry(name)
        return self._err(
            InconsistentError,
            f"torn composite: member_count is {n} but only {k} members follow the head",
            "member_count",
            e.descriptor_offset,
            name,
        )

    def member_names(self, name: str) -> tuple[str, ...]:
        """Names of the direct members of composite head ``name`` (empty for other tensors)."""
        d = self.descriptor(name)
        if not d.is_composite:
            return ()
        pos = self._rank[name]
        n = d.layout.member_count  # type: ignore[union-attr]
        if n > len(self._order) - pos - 1:  # cheap early answer for a huge claimed count
            raise self._torn(name, n, len(self._order) - pos - 1)
        out = []
        p = pos + 1
        for k in range(n):
            if p >= len(self._order):
                raise self._torn(name, n, k)
            out.append(self.entries[self._order[p]].name)
            p = self._subtree_end(p, 1)
        return tuple(out)

    def top_level_names(self) -> tuple[str, ...]:
        """Names (index order) of tensors that are not members of a composite."""
        members: set[int] = set()
        p = 0
        while p < len(self._order):
            end = self._subtree_end(p)
            members.update(range(p + 1, end))
            p = end
        member_names = {self.entries[self._order[q]].name for q in members}
        return tuple(n for n in self.names if n not in member_names)

    def descriptor_order(self) -> tuple[str, ...]:
        """Tensor names by ascending descriptor offset (write order)."""
        return tuple(self.entries[k].name for k in self._order)

    def validate(self) -> None:
        """Check everything: KV, every descriptor, parameter values, every composite."""
        self.kv
        for name in self.top_level_names():
            self.tensor(name)


def open_hrry(path: "str | os.PathLike[str]") -> HrryFile:
    """Open a ``.hrry`` file for reading (see :class:`HrryFile`)."""
    return HrryFile(path)


# ---------------------------------------------------------------------------
# writer




def _is_bytes_like(b: Any) -> bool:
    return isinstance(b, (bytes, bytearray, memoryview, np.ndarray))


def _as_view(b: Any, where: str) -> memoryview:
    if isinstance(b, np.ndarray):
        if b.dtype.hasobject:
            raise UsageError("numpy arrays of Python objects cannot be written as bytes", field=where)
        if not b.flags.c_contiguous:
            b = np.ascontiguousarray(b)
        return memoryview(b.reshape(-1).view(np.uint8))
    if isinstance(b, (bytes, bytearray, memoryview)):
        mv = memoryview(b)
        if not mv.contiguous:
            mv = memoryview(mv.tobytes())
        return mv.cast("B") if (mv.format != "B" or mv.ndim != 1) else mv
    raise UsageError(f"buffer chunks must be bytes-like or numpy arrays, got {type(b).__name__}", field=where)


_HOLE = object()  # a buffer left to positional writes (HrryWriter.reserve)


class HrryWriter:
    """One-pass streaming writer of a ``.hrry`` file, byte-identical to the reference.

    ::

        with HrryWriter("out.hrry") as w:
            w.write("w", desc, [data])            # data: bytes-like, or an iterable of chunks
            w.finish(kv={"producer": "me"})

    Nothing appears at ``path`` until :meth:`finish` succeeds; leaving the
    ``with`` block without ``finish`` (an exception, or simply forgetting)
    discards the temporary file, and an existing file at ``path`` stays as it
    was.  ``tensor_count_hint`` (if given) is written to the header and must
    match the number of tensors written; ``count_at_finish`` writes the count of tensors
    actually written there instead, when :meth:`finish` knows it.  Besides streamed
    buffers, :meth:`reserve` leaves a tensor's buffers to positional writes from worker
    threads (:meth:`positional`), and :meth:`mark`/:meth:`rewind` take back the tensors
    written since a point (a conversion that changes its mind about a tensor).
    """

    def __init__(
        self,
        path: "str | os.PathLike[str]",
        *,
        alignment: int = 4096,
        tensor_count_hint: int | None = None,
        force: bool = False,
        sorted_index: bool = False,
        inputs: Iterable["str | os.PathLike[str]"] = (),
        count_at_finish: bool = False,
    ) -> None:
        if not isinstance(alignment, int) or alignment & (alignment - 1) or not MIN_ALIGNMENT <= alignment <= MAX_ALIGNMENT:
            raise UsageError(f"alignment must be a power of two between {MIN_ALIGNMENT} and {MAX_ALIGNMENT}, got {alignment!r}")
        if tensor_count_hint is not None and not (isinstance(tensor_count_hint, int) and 0 <= tensor_count_hint < COUNT_UNKNOWN):
            raise UsageError(f"tensor_count_hint must be a non-negative int, got {tensor_count_hint!r}")
        self.path = Path(os.fspath(path))
        self.alignment = alignment
        self.tensor_count_hint = tensor_count_hint
        self.sorted_index = sorted_index
        self.count_at_finish = count_at_finish  # the header's tensor count, written by finish()
        self._out = AtomicOutput(path, force=force, inputs=inputs)
        self._entries: list[IndexEntry] = []
        self._names: set[str] = set()
        self._pending: list[int] = []  # composite members still owed, innermost last
        self._pos = 0
        self._state = "new"  # new | open | failed | done
        self._scratch: dict[str, Any] = {}
        self._holes: list[int] = []
        self._positional: PositionalWriter | None = None

    # -- lifecycle ---------------------------------------------------------------

    def open(self) -> "HrryWriter":
        if self._state != "new":
            raise UsageError(f"writer is already {self._state}", path=self.path)
        self._out.open()
        self._state = "open"
        self._emit(self._header(self.tensor_count_hint))
        return self

    def _header(self, count: int | None) -> bytes:
        flags = FLAG_HAS_INDEX_CRC32C | (FLAG_SORTED_INDEX if self.sorted_index else 0)
        return FileHeader(1, 0, flags, self.alignment, HEADER_SIZE, COUNT_UNKNOWN if count is None else count).encode()

    def __enter__(self) -> "HrryWriter":
        return self.open()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self._state == "done":
            return False
        self.abort()
        if exc_type is None:
            raise UsageError("finish() was not called; nothing was written", path=self.path)
        return False

    def abort(self) -> None:
        """Discard everything written so far."""
        self._out.abort()
        if self._state != "done":
            self._state = "failed"

    def _require_open(self) -> None:
        if self._state == "new":
            self.open()
        elif self._state != "open":
            raise UsageError(f"writer is {self._state}", path=self.path)

    def scratch(self, key: str) -> Any:
        """The temporary file ``key`` (``w+b``, created on first use) beside the output,
        removed when the writer finishes or aborts: for data written before the KV section
        and streamed into it (:class:`~.kv.StreamedBytes`), so it is never held whole."""
        self._require_open()
        if key not in self._scratch:
            self._scratch[key] = self._out.scratch()
        return self._scratch[key]

    # -- low level ---------------------------------------------------------------

    def _emit(self, b: "bytes | memoryview") -> None:
        self._out.write(b)
        self._pos += len(b)

    def _emit_streamed(self, p: StreamedBytes) -> None:
        """A streamed KV value: copied from its file by the kernel (``copy_file_range``,
        through :meth:`positional`) when that file has a descriptor, else read in chunks."""
        try:
            p.file.flush()
            fd = p.file.fileno()
        except (AttributeError, OSError, ValueError):  # not a real file (io.BytesIO: UnsupportedOperation)
            for b in p.chunks():
                self._emit(b)
            return
        self._out.flush()
        self.positional().copy(fd, p.offset, p.length, self._pos)
        self._pos += p.length
        self._out.seek(self._pos)

    def _pad_to(self, a: int) -> None:
        n = _align(self._pos, a) - self._pos
        if n:
            self._emit(_ZEROS[:n])

    def _write_buffer(self, name: str, i: int, src: Any, size: int) -> None:
        where = f"buffer {i}"
        written = 0
        if src is _HOLE:  # reserve(): the bytes come later, by positional writes
            self._out.flush()
            self._out.seek(size, os.SEEK_CUR)
            self._holes.append(self._pos)
            self._pos += size
            return

        def put(mv: memoryview) -> None:
            nonlocal written
            if written + len(mv) > size:
                raise UsageError(
                    f"buffer {i} has more than the declared {size} bytes", path=self.path, tensor=name, field=where
                )
            for s in range(0, len(mv), CHUNK):
                self._emit(mv[s : s + CHUNK])
            written += len(mv)

        if _is_bytes_like(src):
            put(_as_view(src, where))
        else:
            try:
                it = iter(src)
            except TypeError:
                raise UsageError(
                    f"buffer {i} must be bytes-like, a numpy array or an iterable of chunks, got {type(src).__name__}",
                    path=self.path,
                    tensor=name,
                    field=where,
                ) from None
            for chunk in prefetch_chunks(it):
                try:
                    put(_as_view(chunk, where))
                except UsageError as e:
                    raise e.located(path=self.path, tensor=name)
        if written != size:
            raise UsageError(
                f"buffer {i} has {written} bytes, the descriptor declares {size}", path=self.path, tensor=name, field=where
            )

    # -- public ------------------------------------------------------------------

    def write(self, name: str, descriptor: Descriptor, buffers: Sequence[BufferSource] = ()) -> IndexEntry:
        """Append one tensor: its descriptor, then each buffer (checked against the declared sizes).

        A composite head (``buffers`` empty) must be followed by its
        ``member_count`` members (or use :meth:`write_composite`).
        """
        self._require_open()
        if not isinstance(name, str) or not name:
            raise UsageError(f"tensor names must be non-empty strings, got {name!r}", path=self.path)
        try:
            nb = name.encode("utf-8")
        except UnicodeEncodeError as e:
            raise UsageError(f"tensor name is not encodable as UTF-8 ({e.reason})", path=self.path, tensor=name) from None
        if len(nb) > 0xFFFF:
            raise UsageError(f"tensor name of {len(nb)} bytes exceeds the u16 name_length", path=self.path, tensor=name)
        if name in self._names:
            raise UsageError("duplicate tensor name", path=self.path, tensor=name)
        if not isinstance(descriptor, Descriptor):
            raise UsageError(f"expected a Descriptor, got {type(descriptor).__name__}", path=self.path, tensor=name)
        try:
            enc = encode_descriptor(descriptor)
        except HurrayInteropError as e:
            raise e.located(path=self.path, tensor=name) from None
        if isinstance(buffers, (bytes, bytearray, memoryview, np.ndarray)):
            raise UsageError("buffers must be a sequence with one entry per buffer", path=self.path, tensor=name)
        buffers = list(buffers)
        if len(buffers) != len(descriptor.buffers):
            raise UsageError(
                f"{len(buffers)} buffers given, the descriptor declares {len(descriptor.buffers)}",
                path=self.path,
                tensor=name,
            )
        # parameter values (scales, zero points) are checked when they are given whole;
        # parameter buffers are never buffer 0, which may be a stream of chunks
        if descriptor.quantization is not None and all(_is_bytes_like(b) for b in buffers[1:]):
            data = [
                np.frombuffer(_as_view(b, f"buffer {i}"), dtype=np.uint8) if _is_bytes_like(b) else np.empty(0, np.uint8)
                for i, b in enumerate(buffers)
            ]
            if all(len(a) == h.byte_size for a, h in zip(data[1:], descriptor.buffers[1:])):
                try:
                    validate_parameter_values(descriptor, data, tensor=name)
                except HurrayInteropError as e:
                    raise e.located(path=self.path, tensor=name) from None
        # from here on, a failure leaves a half-written tensor: the writer is unusable
        try:
            doff = self._pos
            self._emit(enc)
            self._pad_to(self.alignment)
            daoff = self._pos
            n = len(buffers)
            for i, (src, h) in enumerate(zip(buffers, descriptor.buffers)):
                self._write_buffer(name, i, src, h.byte_size)
                if i < n - 1:
                    self._pad_to(self.alignment)
            entry = IndexEntry(name, doff, len(enc), daoff, self._pos - daoff)
            self._pad_to(8)
        except BaseException:
            self.abort()
            raise
        self._entries.append(entry)
        self._names.add(name)
        # composite bookkeeping: this tensor fills one owed member slot
        if self._pending:
            self._pending[-1] -= 1
        if descriptor.is_composite:
            self._pending.append(descriptor.layout.member_count)  # type: ignore[union-attr]
        while self._pending and self._pending[-1] == 0:
            self._pending.pop()
        return entry

    def reserve(self, name: str, descriptor: Descriptor) -> list[int]:
        """Write ``descriptor`` like :meth:`write`, leaving its buffers' bytes to positional
        writes (:meth:`positional`, from any thread; they must fill every byte before
        :meth:`finish`).  Returns the file offset of each buffer."""
        self._holes = []
        self.write(name, descriptor, [_HOLE] * len(descriptor.buffers))
        return self._holes

    def positional(self) -> PositionalWriter:
        """A writer for the ranges :meth:`reserve` hands out (incremental writeback as each is written)."""
        self._require_open()
        if self._positional is None:
            self._positional = PositionalWriter(self._out, None)
        return self._positional

    def mark(self) -> tuple[int, int, list[int]]:
        """Where the file stands now, for :meth:`rewind`."""
        return self._pos, len(self._entries), list(self._pending)

    def rewind(self, mark: tuple[int, int, list[int]]) -> None:
        """Forget every tensor written since :meth:`mark` (their bytes are cut off the file;
        any positional writes into them must have ended)."""
        pos, count, pending = mark
        self._require_open()
        self._out.flush()
        os.ftruncate(self._out.fileno(), pos)
        self._out.seek(pos)
        self._pos = pos
        for e in self._entries[count:]:
            self._names.discard(e.name)
        del self._entries[count:]
        self._pending = pending

    def write_composite(
        self,
        name: str,
        head: Descriptor,
        members: Sequence[tuple[str, Descriptor, Sequence[BufferSource]]],
    ) -> None:
        """Write a composite head and its members (a nested head's members follow it, pre-order)."""
        if not head.is_composite:
            raise UsageError("write_composite needs a composite head descriptor", path=self.path, tensor=name)
        depth = len(self._pending)
        self.write(name, head, ())
        for mname, mdesc, mbufs in members:
            if len(self._pending) <= depth:
                self.abort()
                raise UsageError(
                    f"composite {name!r} got more members than its member_count {head.layout.member_count}",  # type: ignore[union-attr]
                    path=self.path,
                    tensor=mname,
                )
            self.write(mname, mdesc, mbufs)
        if len(self._pending) > depth:
            self.abort()
            raise UsageError(
                f"composite {name!r} is incomplete: {self._pending[-1]} more members are owed",
                path=self.path,
                tensor=name,
            )

    def write_tensor(self, t: Tensor, name: str | None = None) -> None:
        """Write a :class:`Tensor` (and, for a composite head, its members)."""
        self.write(name if name is not None else t.name, t.descriptor, t.data)
        for m in t.members:
            self.write_tensor(m)

    def finish(self, kv: Mapping[str, Any] | None = None) -> Path:
        """Write KV, index and trailer; fsync and move the file into place."""
        self._require_open()
        try:
            if self._pending:
                raise UsageError(
                    f"torn composite: {self._pending[-1]} members are still owed", path=self.path
                )
            if self.tensor_count_hint is not None and self.tensor_count_hint != len(self._entries):
                raise UsageError(
                    f"tensor_count_hint was {self.tensor_count_hint} but {len(self._entries)} tensors were written",
                    path=self.path,
                )
            kvoff = kvlen = 0
            if kv:
                try:
                    kvlen, parts = encode_kv_parts(kv)
                    kvoff = self._pos
                    for p in parts:  # a StreamedBytes value is read from its file only now
                        if isinstance(p, StreamedBytes):
                            self._emit_streamed(p)
                        else:
                            self._emit(p)
                except UsageError as e:
                    raise e.located(path=self.path) from None
                self._pad_to(8)
            entries = self._entries
            if self.sorted_index:
                entries = sorted(entries, key=lambda e: e.name.encode("utf-8"))
            index = struct.pack("<Q", len(entries)) + b"".join(e.encode() for e in entries)
            ioff = self._pos
            self._emit(index)
            self._emit(Trailer(ioff, len(index), kvoff, kvlen, crc32c(index)).encode())
            if self.count_at_finish:
                self.positional().pwrite(self._header(len(self._entries)), 0)
            self._out.commit()
        except BaseException:
            self.abort()
            raise
        self._state = "done"
        return self.path

    @property
    def entries(self) -> tuple[IndexEntry, ...]:
        return tuple(self._entries)


# ---------------------------------------------------------------------------
# convenience


def save(
    path: "str | os.PathLike[str]",
    tensors: "Mapping[str, Tensor] | Sequence[Tensor]",
    kv: Mapping[str, Any] | None = None,
    **writer_kw: Any,
) -> Path:
    """Write tensors (composites with their members) and KV to ``path``.

    ``tensors`` is a mapping name → :class:`Tensor` (the key names the tensor)
    or a sequence of tensors (their own names); order is kept.
    """
    items = list(tensors.items()) if isinstance(tensors, Mapping) else [(t.name, t) for t in tensors]
    with HrryWriter(path, **writer_kw) as w:
        for name, t in items:
            w.write_tensor(t, name)
        return w.finish(kv)


def load(path: "str | os.PathLike[str]") -> tuple[dict[str, Tensor], dict[str, KVValue]]:
    """Read and fully validate a file: top-level tensors in write order (composite
    heads carry their members) and the KV section.  Buffers stay memory-mapped."""
    with HrryFile(path) as f:
        kv = f.kv
        top = set(f.top_level_names())
        tensors = {n: f.tensor(n) for n in f.descriptor_order() if n in top}
    return tensors, kv
