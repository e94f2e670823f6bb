"""Split GGUF sets (llama.cpp's ``gguf-split`` shards): find, check, describe, plan, write.

Large models ship as sets of GGUF files named ``PREFIX-00001-of-00003.gguf``
(``%s-%05d-of-%05d.gguf``, 1-based in the name).  Each shard is a complete
GGUF file holding whole tensors; three keys tie them together
(docs/conversion-rules.md § 10):

``split.no``             UINT16, 0-based index of the shard
``split.count``          UINT16, number of shards (``gguf-split --merge`` writes 0)
``split.tensors.count``  INT32, tensors in the whole set

What the two writers put where (read in llama.cpp's ``tools/gguf-split`` and
gguf-py 0.19.0's ``GGUFWriter``):

* the first shard carries all the model metadata followed by the split keys;
  every other shard carries the three split keys and nothing else;
* ``gguf-split`` sets ``split.count`` twice (a placeholder, then the real
  value) and ggml's ``gguf_set_*`` moves a key to the end when it is set
  again, so its key order is ``no, tensors.count, count``; gguf-py writes
  ``no, count, tensors.count``.  Both are accepted and reproduced;
* ``gguf-split --no-tensor-first-split`` and gguf-py's ``small_first_shard``
  write a first shard without tensors;
* ``gguf-split --merge`` copies the first shard's metadata, sets
  ``split.count = 0`` (moving it to the end), keeps ``split.no`` and
  ``split.tensors.count``, and lays every tensor out again in set order
  (version 3, data padded to the alignment after every tensor).  A file with
  ``split.count = 0`` is therefore a whole model, not a shard.

This module knows only GGUF (it reads and writes through :mod:`.gguf`).  A
*layout* (:class:`SplitLayout`, JSON-serialisable with :meth:`SplitLayout.to_json`)
describes every shard except the model metadata values and the tensor bytes:
version, alignment, tail padding, metadata key order (model keys and where the
split keys go) and tensor rows ``[name, GGML type, ne, offset]``.  Model
metadata values come from the first shard (:meth:`SplitSet.model_kv`); the
split key values follow from the shard's place in the set.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

from ..errors import FormatError, SplitSetError, UnsupportedError, UsageError
from ..files.atomic import AtomicOutputSet, missing_directory
from ..files.positional import PositionalWriter
from . import gguf as G

__all__ = [
    "KEY_NO",
    "KEY_COUNT",
    "KEY_TENSORS_COUNT",
    "SPLIT_KEYS",
    "MAX_SHARDS",
    "ShardName",
    "parse_shard_name",
    "borrowed_set",
    "shard_suffix",
    "shard_name",
    "set_paths",
    "shards_in_the_way",
    "split_entries",
    "parse_split_size",
    "plan_split",
    "TensorRow",
    "tensor_row",
    "ShardLayout",
    "SplitLayout",
    "new_split_layout",
    "merged_layout",
    "SplitSet",
    "SplitModel",
    "open_split_set",
    "open_model",
    "split_set_of",
    "shard_kv",
    "write_shard",
    "write_set",
]

#: the split keys in the order llama.cpp's gguf-split leaves them (see the module docstring)
SPLIT_KEYS = G.SPLIT_KEYS
KEY_NO, KEY_TENSORS_COUNT, KEY_COUNT = SPLIT_KEYS
#: their GGUF types, as both writers write them and llama.cpp's loader requires them
SPLIT_KEY_TYPES = {KEY_NO: G.ValueType.UINT16, KEY_COUNT: G.ValueType.UINT16, KEY_TENSORS_COUNT: G.ValueType.INT32}
#: split.count is a UINT16
MAX_SHARDS = 0xFFFF
LAYOUT_FORMAT = "gguf-split"

_SHARD_RE = re.compile(r"(?P<prefix>.+)-(?P<no>[0-9]{5})-of-(?P<count>[0-9]{5})\.gguf", re.DOTALL)
_SIZE_RE = re.compile(r"(?P<n>[0-9]+)(?P<unit>[MG])")
_SIZE_UNITS = {"M": 1000 * 1000, "G": 1000 * 1000 * 1000}  # gguf-split: decimal megabytes and gigabytes


# --------------------------------------------------------------------------
# names
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardName:
    """A file name of the form ``PREFIX-0000N-of-0000M.gguf`` (``number`` is 1-based)."""

    prefix: str
    number: int
    count: int


def parse_shard_name(name: str) -> ShardName | None:
    """The parts of a shard file name (a base name), or None when it is not one."""
    m = _SHARD_RE.fullmatch(name)
    if m is None:
        return None
    return ShardName(m["prefix"], int(m["no"]), int(m["count"]))


def shard_suffix(index: int, count: int) -> str:
    """``-0000N-of-0000M.gguf`` for the 0-based shard ``index`` of ``count``."""
    return f"-{index + 1:05d}-of-{count:05d}.gguf"


def shard_name(prefix: str, index: int, count: int) -> str:
    """The file name gguf-split gives the 0-based shard ``index`` of ``count``."""
    return prefix + shard_suffix(index, count)


def set_paths(dst: "str | os.PathLike[str]", count: int) -> list[Path]:
    """The paths of a set of ``count`` shards written to ``dst``.

    ``dst`` may name the first shard (``PREFIX-00001-of-0000M.gguf``, M = count),
    a file ``PREFIX.gguf`` (gguf-py's naming) or a bare prefix (gguf-split's
    ``GGUF_OUT``); the shards are written beside it.
    """
    if not 1 <= count <= MAX_SHARDS:
        raise UsageError(f"a split GGUF set has 1 to {MAX_SHARDS} shards, not {count}", path=dst)
    p = Path(os.fspath(dst))
    sn = parse_shard_name(p.name)
    if sn is not None:
        if (sn.number, sn.count) != (1, count):
            raise UsageError(
                f"names shard {sn.number} of {sn.count}; give the first shard's name "
                f"({shard_name(sn.prefix, 0, count)}) for a set of {count}",
                path=p,
            )
    prefix = _prefix_of(p)
    if not prefix or prefix in (".", ".."):
        raise UsageError("output path has no file name to build shard names from", path=p)
    return [p.with_name(shard_name(prefix, i, count)) for i in range(count)]


def _prefix_of(dst: Path) -> str:
    """The shard name prefix of a set written to ``dst`` (see :func:`set_paths`)."""
    sn = parse_shard_name(dst.name)
    if sn is not None:
        return sn.prefix
    return dst.name[: -len(".gguf")] if dst.name.endswith(".gguf") else dst.name


def shards_in_the_way(dst: "str | os.PathLike[str]") -> list[Path]:
    """The files beside ``dst`` named as shards of a set written to ``dst``, of any count
    (what a new set of a size not known yet would replace, or refuse to mix with)."""
    p = Path(os.fspath(dst))
    if not p.parent.is_dir():
        return []
    return [q for _, q in _shards_beside(p.parent, _prefix_of(p))]


def _shards_beside(folder: Path, prefix: str) -> list[tuple[ShardName, Path]]:
    """Every file in ``folder`` named like a shard with this prefix (sorted by name)."""
    try:
        entries = sorted(os.listdir(folder))
    except OSError as e:
        raise UsageError(f"cannot list the folder: {e.strerror or e}", path=folder) from None
    out = []
    for entry in entries:
        sn = parse_shard_name(entry)
        if sn is not None and sn.prefix == prefix:
            out.append((sn, folder / entry))
    return out


# --------------------------------------------------------------------------
# split keys and plans
# --------------------------------------------------------------------------


def split_entries(no: int, count: int, tensors_count: int) -> list[tuple[str, G.GGUFValue]]:
    """The ``split.*`` metadata of shard ``no`` (0-based), in gguf-split's order."""
    values = {KEY_NO: no, KEY_COUNT: count, KEY_TENSORS_COUNT: tensors_count}
    return [(k, G.GGUFValue.of(SPLIT_KEY_TYPES[k], values[k])) for k in SPLIT_KEYS]


def parse_split_size(text: str) -> int:
    """Bytes of a gguf-split ``--split-max-size`` value: ``500M`` = 500·10⁶, ``2G`` = 2·10⁹."""
    m = _SIZE_RE.fullmatch(text.strip())
    if m is None or int(m["n"]) <= 0:
        raise UsageError(
            f"split size {text!r}: expected a positive whole number followed by M (10^6 bytes) "
            "or G (10^9 bytes), as gguf-split takes them, e.g. 500M or 2G"
        )
    return int(m["n"]) * _SIZE_UNITS[m["unit"]]


def plan_split(
    tensor_sizes: Sequence[int],
    *,
    max_tensors: int | None = None,
    max_size: int | None = None,
    no_tensor_first_split: bool = False,
) -> list[list[int]]:
    """Which tensors (indices into ``tensor_sizes``, bytes each) go into which shard.

    gguf-split's rules: ``max_tensors`` N starts a new shard at every tensor
    index that is a positive multiple of N; ``max_size`` starts one when the
    shard's tensors, each padded to 32 bytes, would exceed it.  A tensor
    larger than ``max_size`` gets a shard of its own (gguf-split refuses one
    as the very first tensor, gguf-py keeps it alone).  ``no_tensor_first_split``
    leaves the first shard without tensors.
    """
    if (max_tensors is None) == (max_size is None):
        raise UsageError("give exactly one of max_tensors (--split-max-tensors) and max_size (--split-max-size)")
    if max_tensors is not None and (isinstance(max_tensors, bool) or int(max_tensors) < 1):
        raise UsageError(f"--split-max-tensors must be at least 1, not {max_tensors}")
    if max_size is not None and (isinstance(max_size, bool) or int(max_size) < 1):
        raise UsageError(f"--split-max-size must be at least 1 byte, not {max_size}")
    shards: list[list[int]] = [[]]
    if no_tensor_first_split:
        shards.append([])
    used = 0
    for i, size in enumerate(tensor_sizes):
        padded = -(-int(size) // G.DEFAULT_ALIGNMENT) * G.DEFAULT_ALIGNMENT  # GGML_PAD(nbytes, 32)
        if max_tensors is not None:
            new = i > 0 and i % max_tensors == 0
        else:
            new = bool(shards[-1]) and used + padded > max_size  # type: ignore[operator]
        if new:
            shards.append([])
            used = 0
        shards[-1].append(i)
        used += padded
    if len(shards) > MAX_SHARDS:
        raise UsageError(f"the plan needs {len(shards)} shards; split.count holds at most {MAX_SHARDS}")
    return shards


# --------------------------------------------------------------------------
# layout records
# --------------------------------------------------------------------------


class TensorRow(NamedTuple):
    """One tensor info of a shard: ``[name, GGML type name, ne, offset]`` in JSON."""

    name: str
    type: str
    ne: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return G.tensor_nbytes(self.type, self.ne)

    def spec(self, offset: int | None = None) -> G.TensorSpec:
        return G.TensorSpec(self.name, G.ggml_type(self.type).id, self.ne, self.offset if offset is None else offset)


def tensor_row(row: Any, *, min_dims: int = 0) -> TensorRow:
    """Parse one JSON tensor row ``[name, GGML type name, ne, offset]`` (the form the
    layout and the .hrry conversion records use); :class:`ValueError` says what is wrong."""
    ok = (
        isinstance(row, list)
        and len(row) == 4
        and isinstance(row[0], str)
        and isinstance(row[1], str)
        and isinstance(row[2], list)
        and min_dims <= len(row[2]) <= G.MAX_DIMS
        and all(_is_int(x) for x in row[2])
        and _is_int(row[3])
    )
    if not ok:
        raise ValueError(f"a tensor is not [name, GGML type, ne ({min_dims}-{G.MAX_DIMS} sizes), offset]")
    r = TensorRow(row[0], row[1], tuple(row[2]), row[3])
    try:
        r.nbytes  # a known type, whole blocks
    except (UnsupportedError, UsageError) as e:
        raise ValueError(e.message) from None
    return r


def _is_int(x: Any, lo: int = 0, hi: int = (1 << 62) - 1) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi


@dataclass(frozen=True)
class ShardLayout:
    """Everything about one GGUF file of a set but the model metadata values and tensor bytes.

    ``no``, ``count`` and ``tensors_count`` are the values its split keys get
    (``count`` 0 for a merged file); ``kv`` is the metadata key order, split
    keys included; ``tail_bytes`` None pads the end to the alignment (what
    gguf-split and gguf-py write).
    """

    no: int
    count: int
    tensors_count: int
    version: int
    alignment: int
    tail_bytes: int | None
    kv: tuple[str, ...]
    tensors: tuple[TensorRow, ...]

    @property
    def suffix(self) -> str:
        return shard_suffix(self.no, self.count)

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data (without padding)."""
        return sum(r.nbytes for r in self.tensors)

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.suffix,
            "version": self.version,
            "alignment": self.alignment,
            "tail_bytes": self.tail_bytes,
            "kv": list(self.kv),
            "tensors": [[r.name, r.type, list(r.ne), r.offset] for r in self.tensors],
        }


@dataclass(frozen=True)
class SplitLayout:
    """The layout of a whole set; ``prefix`` is the source's name prefix (informative)."""

    prefix: str
    shards: tuple[ShardLayout, ...]

    @property
    def count(self) -> int:
        return len(self.shards)

    @property
    def tensors_count(self) -> int:
        return self.shards[0].tensors_count

    @property
    def tensor_rows(self) -> list[TensorRow]:
        """Every tensor in set order."""
        return [r for s in self.shards for r in s.tensors]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": LAYOUT_FORMAT,
            "prefix": self.prefix,
            "count": self.count,
            "tensors_count": self.tensors_count,
            "shards": [s.to_json() for s in self.shards],
        }

    def dumps(self) -> str:
        """Compact JSON text of :meth:`to_json`."""
        return json.dumps(self.to_json(), separators=(",", ":"))

    def with_tensor_types(self, types: Mapping[str, tuple[str, Sequence[int]]]) -> "SplitLayout":
        """The same set with some tensors stored as other GGML types (``{name: (type, ne)}``),
        as an exporter writes it when a tensor cannot come back in its recorded type: shard
        assignment and metadata order stay; a shard whose tensor sizes changed is laid out
        again back to back and padded at the end."""
        unknown = set(types) - {r.name for r in self.tensor_rows}
        if unknown:
            raise UsageError(f"no tensor named {sorted(unknown)[0]!r} in the layout")
        shards = []
        for s in self.shards:
            rows = [r._replace(type=types[r.name][0], ne=tuple(types[r.name][1])) if r.name in types else r for r in s.tensors]
            if any(a.nbytes != b.nbytes for a, b in zip(rows, s.tensors)):
                offs = G.layout_offsets((r.nbytes for r in rows), s.alignment)
                s = replace(s, tensors=tuple(r._replace(offset=o) for r, o in zip(rows, offs)), tail_bytes=None)
            else:
                s = replace(s, tensors=tuple(rows))
            shards.append(s)
        return SplitLayout(self.prefix, tuple(shards))

    @classmethod
    def from_json(cls, obj: Any, *, path: "str | os.PathLike[str] | None" = None, field: str | None = None) -> "SplitLayout":
        """Parse and check a layout record (it is input: a bad one raises a located
        :class:`FormatError`).  ``obj`` may be the JSON text or the decoded object."""
        return _LayoutParser(path, field).layout(obj)


class _LayoutParser:
    """Checks a layout record field by field; every defect is one located FormatError."""

    def __init__(self, path: Any, field: str | None) -> None:
        self.path = path
        self.field = field

    def bad(self, message: str, tensor: str | None = None) -> FormatError:
        return FormatError(f"corrupt split layout record: {message}", path=self.path, field=self.field, tensor=tensor)

    def layout(self, obj: Any) -> SplitLayout:
        if isinstance(obj, (str, bytes)):
            try:
                obj = json.loads(obj)
            except (ValueError, RecursionError) as e:
                raise self.bad(f"not valid JSON ({type(e).__name__})") from None
        if not isinstance(obj, dict) or obj.get("format") != LAYOUT_FORMAT:
            raise self.bad(f"not an object with format {LAYOUT_FORMAT!r}")
        count, total, prefix, shards = (obj.get(k) for k in ("count", "tensors_count", "prefix", "shards"))
        if not _is_int(count, 1, MAX_SHARDS) or not isinstance(shards, list) or len(shards) != count:
            raise self.bad(f"count must be 1 to {MAX_SHARDS} and match the number of shards")
        if not _is_int(total, 0, 0x7FFFFFFF) or not isinstance(prefix, str):
            raise self.bad("tensors_count must be a non-negative INT32 and prefix a string")
        out = tuple(self.shard(s, i, count, total) for i, s in enumerate(shards))
        names: set[str] = set()
        for s in out:
            for r in s.tensors:
                if r.name in names:
                    raise self.bad("tensor recorded twice", tensor=r.name)
                names.add(r.name)
        if len(names) != total:
            raise self.bad(f"{len(names)} tensors recorded, tensors_count says {total}")
        return SplitLayout(prefix, out)

    def shard(self, obj: Any, i: int, count: int, total: int) -> ShardLayout:
        keys = {"file", "version", "alignment", "tail_bytes", "kv", "tensors"}
        if not isinstance(obj, dict) or set(obj) != keys:
            raise self.bad(f"shard {i + 1} must be an object with the keys {sorted(keys)}")
        if obj["file"] != shard_suffix(i, count):
            raise self.bad(f"shard {i + 1} is recorded as {obj['file']!r}, expected {shard_suffix(i, count)!r}")
        version, alignment, tail = obj["version"], obj["alignment"], obj["tail_bytes"]
        if version not in G.SUPPORTED_VERSIONS or isinstance(version, bool):
            raise self.bad(f"shard {i + 1}: GGUF version {version!r} (only 2 and 3 exist)")
        if not _is_int(alignment, 1, 1 << 30) or alignment & (alignment - 1):
            raise self.bad(f"shard {i + 1}: alignment {alignment!r} is not a power of two up to 2^30")
        if tail is not None and not _is_int(tail, 0, alignment - 1):
            raise self.bad(f"shard {i + 1}: {tail!r} trailing padding bytes for alignment {alignment}")
        kv = obj["kv"]
        if not isinstance(kv, list) or not all(isinstance(k, str) for k in kv) or len(set(kv)) != len(kv):
            raise self.bad(f"shard {i + 1}: kv must be a list of distinct key names")
        if not set(SPLIT_KEYS) <= set(kv) or (i > 0 and len(kv) != len(SPLIT_KEYS)):
            raise self.bad(f"shard {i + 1}: kv must hold the three split keys" + (" and nothing else" if i else ""))
        rows = obj["tensors"]
        if not isinstance(rows, list):
            raise self.bad(f"shard {i + 1}: tensors must be a list")
        parsed = tuple(self.row(r, i) for r in rows)
        self.offsets(parsed, alignment, i)
        return ShardLayout(i, count, total, version, alignment, tail, tuple(kv), parsed)

    def row(self, row: Any, i: int) -> TensorRow:
        try:
            return tensor_row(row)
        except ValueError as e:
            who = row[0] if isinstance(row, list) and row and isinstance(row[0], str) else None
            raise self.bad(f"shard {i + 1}: {e}", tensor=who) from None

    def offsets(self, rows: Sequence[TensorRow], alignment: int, i: int) -> None:
        """Aligned, disjoint, and gaps no larger than the data (a lying record must
        not make the writer produce an arbitrarily large file)."""
        end = reach = total = 0
        for r in sorted(rows, key=lambda r: r.offset):
            n = r.nbytes
            if r.offset % alignment or (n and r.offset < end):  # empty tensors occupy nothing
                raise self.bad(
                    f"shard {i + 1}: offset {r.offset} is unaligned or overlaps (previous data ends at {end})", tensor=r.name
                )
            end = r.offset + n if n else end
            reach = max(reach, r.offset + n)  # empty tensors still place the end of the data
            total += n
        if reach - total > max(total, 1 << 20) + len(rows) * alignment:
            raise self.bad(f"shard {i + 1}: offsets describe {reach - total} bytes of gaps for {total} bytes of data")


def _shard_layout_of(gf: G.GGUFFile, no: int, count: int, tensors_count: int) -> ShardLayout:
    rows = tuple(TensorRow(t.name, t.type_name, tuple(t.ne), t.offset) for t in gf.tensors)
    return ShardLayout(no, count, tensors_count, gf.version, gf.alignment, gf.tail_bytes, tuple(gf.kv), rows)


def new_split_layout(
    kv_keys: Iterable[str],
    tensors: Sequence[tuple[str, str, Sequence[int]]],
    assignments: Sequence[Sequence[int]],
    *,
    alignment: int = G.DEFAULT_ALIGNMENT,
    prefix: str = "",
) -> SplitLayout:
    """The layout gguf-split gives a model (metadata keys ``kv_keys``, tensors
    ``(name, GGML type, ne)``) split by ``assignments`` (see :func:`plan_split`).

    The first shard gets the model keys (any ``split.*`` among them dropped)
    followed by the split keys, and the model's ``alignment``; the others get
    only the split keys and so the default alignment.  Version 3, tensors laid
    out back to back, ends padded.
    """
    model = tuple(k for k in kv_keys if k not in SPLIT_KEYS)
    placed = sorted(i for a in assignments for i in a)
    if placed != list(range(len(tensors))):
        raise UsageError("the shard assignments must place every tensor exactly once")
    count = len(assignments)
    if not 1 <= count <= MAX_SHARDS:
        raise UsageError(f"a split GGUF set has 1 to {MAX_SHARDS} shards, not {count}")
    shards = []
    for no, idx in enumerate(assignments):
        align = alignment if no == 0 else G.DEFAULT_ALIGNMENT
        rows = [TensorRow(tensors[i][0], tensors[i][1], tuple(int(d) for d in tensors[i][2]), 0) for i in idx]
        offs = G.layout_offsets((r.nbytes for r in rows), align)
        rows = [r._replace(offset=o) for r, o in zip(rows, offs)]
        kv = (model if no == 0 else ()) + SPLIT_KEYS
        shards.append(ShardLayout(no, count, len(tensors), 3, align, None, kv, tuple(rows)))
    return SplitLayout(prefix, tuple(shards))


def merged_layout(layout: SplitLayout) -> ShardLayout:
    """The single file ``gguf-split --merge`` makes of a set: the first shard's
    metadata with ``split.count`` set to 0 (and moved to the end), every tensor in
    set order laid out again with the first shard's alignment, version 3, padded."""
    first = layout.shards[0]
    kv = tuple(k for k in first.kv if k != KEY_COUNT) + (KEY_COUNT,)
    rows = layout.tensor_rows
    offs = G.layout_offsets((r.nbytes for r in rows), first.alignment)
    tensors = tuple(r._replace(offset=o) for r, o in zip(rows, offs))
    return ShardLayout(0, 0, layout.tensors_count, 3, first.alignment, None, kv, tensors)


# --------------------------------------------------------------------------
# reading a set
# --------------------------------------------------------------------------


class SplitSet:
    """An opened, checked split GGUF set. Use as a context manager (closes every shard).

    ``paths`` and ``shards`` (:class:`~.gguf.GGUFFile`) are in shard order;
    ``tensors`` lists ``(shard index, GGUFTensorInfo)`` in set order.
    """

    def __init__(self, prefix: str, paths: list[Path], shards: list[G.GGUFFile]) -> None:
        self.prefix = prefix
        self.paths = paths
        self.shards = shards
        self.tensors_count = int(shards[0].kv[KEY_TENSORS_COUNT].value)
        self.tensors: list[tuple[int, G.GGUFTensorInfo]] = [(i, t) for i, gf in enumerate(shards) for t in gf.tensors]
        self._by_name = {t.name: (i, t) for i, t in self.tensors}

    @property
    def count(self) -> int:
        return len(self.shards)

    @property
    def total_tensors(self) -> int:
        return len(self.tensors)

    @property
    def nonzero_padding(self) -> list[Path]:
        """Shards whose padding is not all zero (a rewrite writes zeros there)."""
        return [p for p, gf in zip(self.paths, self.shards) if gf.nonzero_padding]

    def tensor(self, name: str) -> tuple[int, G.GGUFTensorInfo]:
        try:
            return self._by_name[name]
        except KeyError:
            raise UsageError(f"no tensor named {name!r} in the set", path=self.paths[0]) from None

    def model_kv(self) -> dict[str, G.GGUFValue]:
        """The model metadata: the first shard's keys without the split keys, in order."""
        return {k: v for k, v in self.shards[0].kv.items() if k not in SPLIT_KEYS}

    def split_layout(self) -> SplitLayout:
        return SplitLayout(
            self.prefix, tuple(_shard_layout_of(gf, i, self.count, self.tensors_count) for i, gf in enumerate(self.shards))
        )

    def layout(self) -> dict[str, Any]:
        """The JSON-serialisable layout record (see :class:`SplitLayout`)."""
        return self.split_layout().to_json()

    def tensor_data(self, name: str, chunk_bytes: int = 64 << 20) -> Iterator[Any]:
        """The bytes of a tensor as chunks of at most ``chunk_bytes`` (zero-copy views)."""
        data = self.tensor(name)[1].data
        return (data[i : i + chunk_bytes] for i in range(0, max(len(data), 1), chunk_bytes))

    def release_pages(self) -> None:
        for gf in self.shards:
            gf.release_pages()

    def close(self) -> None:
        for gf in self.shards:
            gf.close()

    def __enter__(self) -> "SplitSet":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SplitSet({os.fspath(self.paths[0])!r}, shards={self.count}, tensors={self.total_tensors})"


class SplitModel(G.ModelMetadata):
    """A split set read as the one model it holds -- what :func:`hurray_interop.open`
    returns for a shard: the attributes of a :class:`~.gguf.GGUFFile` that describe a
    model (``path`` of the first shard, ``version``, ``alignment``, ``kv`` -- the model
    metadata, without the ``split.*`` keys --, ``tensors`` in set order, ``tensor(name)``,
    ``get(key)``, ``architecture``) plus the set itself (``set``, ``paths``, ``shards``,
    ``count``, ``shard_of(name)``).  A context manager; closing it closes every shard."""

    def __init__(self, s: SplitSet) -> None:
        first = s.shards[0]
        self.set = s
        self.path = os.fspath(s.paths[0])
        self.paths, self.shards = s.paths, s.shards
        self.version, self.alignment = first.version, first.alignment
        self.kv_offsets, self.tail_bytes = first.kv_offsets, first.tail_bytes
        self.nonzero_padding = bool(s.nonzero_padding)
        self.kv = s.model_kv()
        self.tensors = [t for _, t in s.tensors]

    @property
    def split_set(self) -> SplitSet:  # what ModelMetadata.split_set answers for one file (None)
        return self.set

    @property
    def count(self) -> int:
        return self.set.count

    def tensor(self, name: str) -> G.GGUFTensorInfo:
        return self.set.tensor(name)[1]

    def shard_of(self, name: str) -> Path:
        """The shard file that holds tensor ``name``."""
        return self.paths[self.set.tensor(name)[0]]

    def release_pages(self) -> None:
        self.set.release_pages()

    def describe(self) -> str:
        """The set in one line: its shards and the tensors in each."""
        per = ", ".join(f"{p.name} {len(gf.tensors)}" for p, gf in zip(self.paths, self.shards))
        return f"split GGUF set of {self.count} shards, {len(self.tensors)} tensors in all (tensors per shard: {per})"

    def close(self) -> None:
        self.set.close()

    def __enter__(self) -> "SplitModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SplitModel({self.path!r}, shards={self.count}, tensors={len(self.tensors)})"


def open_model(path: "str | os.PathLike[str]") -> "G.GGUFFile | SplitModel":
    """A GGUF model from one of its files: the file itself (a :class:`~.gguf.GGUFFile`),
    or, for a shard of a split set, the whole set (a :class:`SplitModel`, checked as
    :func:`open_split_set` checks it)."""
    gf = G.read_gguf(path)
    try:
        s = split_set_of(gf)
    except BaseException:
        gf.close()
        raise
    return gf if s is None else SplitModel(s)


def _split_keys(gf: G.GGUFFile) -> tuple[int, int, int] | None:
    """``(split.no, split.count, split.tensors.count)`` of a shard; None for a whole model
    (no split keys, or ``split.count = 0`` as ``gguf-split --merge`` leaves it)."""
    if not G.has_split_keys(gf):
        return None
    c = gf.kv.get(KEY_COUNT)
    if c is not None and c.type == SPLIT_KEY_TYPES[KEY_COUNT] and int(c.value) == 0:
        return None
    values = []
    for k in (KEY_NO, KEY_COUNT, KEY_TENSORS_COUNT):
        v = gf.kv.get(k)
        if v is None:
            raise SplitSetError(f"has split keys but no {k}", path=gf.path, field=k)
        if v.type != SPLIT_KEY_TYPES[k]:
            raise FormatError(
                f"{k} must be {SPLIT_KEY_TYPES[k].name}, found {v.type.name}",
                path=gf.path,
                field=k,
                offset=gf.kv_offsets[k],
            )
        values.append(int(v.value))
    no, count, total = values
    if no >= count:
        raise SplitSetError(f"split.no {no} is not below split.count {count}", path=gf.path, field=KEY_NO)
    if total < 0:
        raise SplitSetError(f"split.tensors.count {total} is negative", path=gf.path, field=KEY_TENSORS_COUNT)
    return no, count, total


def open_split_set(path: "str | os.PathLike[str]") -> SplitSet | None:
    """Open the whole set that the GGUF file ``path`` (any shard) belongs to.

    Returns None when the file is a whole model: no split keys, ``split.count = 0``
    (a merged file), or ``split.count = 1`` under a name that is not a shard name.
    Raises :class:`~hurray_interop.errors.SplitSetError` (or another located
    ``FormatError``) naming the shard when the set is incomplete or inconsistent.
    """
    m = open_model(path)
    if isinstance(m, SplitModel):
        return m.set
    m.close()
    return None


@contextlib.contextmanager
def borrowed_set(gf: G.GGUFFile) -> Iterator["SplitSet | None"]:
    """The split set the open file ``gf`` is a shard of (:func:`split_set_of`; None for a
    whole model), for the ``with`` block: the other shards it opened are closed on
    leaving, ``gf`` stays the caller's.  A file without split keys opens nothing."""
    s = split_set_of(gf)
    try:
        yield s
    finally:
        for shard in s.shards if s is not None else ():
            if shard is not gf:
                shard.close()


def split_set_of(gf: G.GGUFFile) -> SplitSet | None:
    """:func:`open_split_set` for a GGUF file already open (parsed once).

    On success the returned set owns ``gf``; on None or an error the caller still does.
    Names and counts are checked before any other shard is opened, and each shard
    is checked as soon as it is opened.
    """
    keys = _split_keys(gf)
    if keys is None:
        return None
    no, count, total = keys
    if gf.path is None:
        raise UsageError("a shard of a split GGUF set must be a file (its siblings are found by name)")
    path = Path(gf.path)
    sn = parse_shard_name(path.name)
    if sn is None:
        if count == 1:
            return None  # llama.cpp loads a one-shard "set" under any name as a whole model
        raise SplitSetError(
            f"split.no = {no} and split.count = {count} make it shard {no + 1} of {count}, but its name "
            f"does not end in -0000N-of-0000M.gguf, so the other shards cannot be found",
            path=path,
        )
    if (sn.number, sn.count) != (no + 1, count):
        raise SplitSetError(
            f"its name says shard {sn.number} of {sn.count}, but split.no = {no} and split.count = {count} "
            f"make it shard {no + 1} of {count}",
            path=path,
        )
    paths = _locate(path, sn)
    shards: list[G.GGUFFile] = []
    try:
        for i, p in enumerate(paths):
            shards.append(gf if i == no else G.read_gguf(p))
            _check_shard(shards[i], i, keys, paths, path)
        _check_tensors(shards, total, paths)
    except BaseException:
        for i, s in enumerate(shards):
            if i != no:
                s.close()
        raise
    return SplitSet(sn.prefix, paths, shards)


def _locate(path: Path, sn: ShardName) -> list[Path]:
    """The paths of every shard of ``path``'s set, from the folder listing alone."""
    folder = path.parent
    found: dict[int, Path] = {}
    for other, p in _shards_beside(folder, sn.prefix):
        if other.count != sn.count:
            raise SplitSetError(
                f"shards of two different sets share the prefix {sn.prefix!r} in this folder: this one says "
                f"{other.count} shards, {path.name} says {sn.count}",
                path=p,
            )
        if not 1 <= other.number <= sn.count:
            raise SplitSetError(f"extra shard: number {other.number} is outside 1..{sn.count} of the set of {path.name}", path=p)
        found[other.number] = p
    for n in range(1, sn.count + 1):
        if n not in found:
            missing = folder / shard_name(sn.prefix, n - 1, sn.count)
            raise SplitSetError(f"missing shard {n} of {sn.count} (the set of {path.name})", path=missing)
    return [found[n] for n in range(1, sn.count + 1)]


def _check_shard(gf: G.GGUFFile, i: int, keys: tuple[int, int, int], paths: list[Path], given: Path) -> None:
    """Shard ``i`` agrees with the set (``keys`` are the split values of ``given``, the shard opened first)."""
    _, count, total = keys
    mine = _split_keys(gf)
    if mine is None:
        raise SplitSetError(f"has no split keys (or split.count = 0): it is not shard {i + 1} of {count}", path=gf.path)
    no, c, t = mine
    if c != count:
        raise SplitSetError(f"inconsistent split.count: {c}, but {given.name} says {count}", path=gf.path, field=KEY_COUNT)
    if no != i:
        raise SplitSetError(
            f"duplicated shard: split.no = {no} claims the place of {paths[no].name}, but its name makes it shard {i + 1}",
            path=gf.path,
            field=KEY_NO,
        )
    if t != total:
        raise SplitSetError(
            f"inconsistent split.tensors.count: {t}, but {given.name} says {total}",
            path=gf.path,
            field=KEY_TENSORS_COUNT,
        )
    if i > 0:
        extra = [k for k in gf.kv if k not in SPLIT_KEYS]
        if extra:
            raise SplitSetError(
                f"metadata {extra[0]!r} in shard {i + 1}: llama.cpp keeps the model metadata in the first shard only",
                path=gf.path,
                field=extra[0],
                offset=gf.kv_offsets[extra[0]],
            )


def _check_tensors(shards: list[G.GGUFFile], total: int, paths: list[Path]) -> None:
    seen: dict[str, int] = {}
    for i, gf in enumerate(shards):
        for t in gf.tensors:
            j = seen.setdefault(t.name, i)
            if j != i:
                raise SplitSetError(f"duplicate tensor name: {t.name!r} is also in {paths[j].name}", path=paths[i], tensor=t.name)
    if len(seen) != total:
        raise SplitSetError(
            f"the {len(shards)} shards hold {len(seen)} tensors, but split.tensors.count says {total}",
            path=paths[0],
            field=KEY_TENSORS_COUNT,
        )


# --------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------

#: ``data_for(name)`` gives a tensor's bytes: a bytes-like object or numpy array, or an iterable of them
DataFor = Callable[[str], Any]
#: ``write_at(name, out, offset)`` writes tensor ``name``'s bytes itself at ``offset`` of an open output
#: file through ``out``, the file's one positional writer (positional writes, from worker threads)
WriteAt = Callable[[str, PositionalWriter, int], None]
Progress = Callable[[int, int], None] | None


def _as_layout(layout: "SplitLayout | Mapping[str, Any] | str") -> SplitLayout:
    return layout if isinstance(layout, SplitLayout) else SplitLayout.from_json(layout)


def shard_kv(shard: ShardLayout, model_kv: Mapping[str, G.GGUFValue]) -> list[tuple[str, G.GGUFValue]]:
    """The metadata of one shard in its recorded order: split keys from the layout,
    every other key from ``model_kv``."""
    split = dict(split_entries(shard.no, shard.count, shard.tensors_count))
    out = []
    for k in shard.kv:
        v = split.get(k) if k in split else model_kv.get(k)
        if v is None:
            raise UsageError(f"the layout of shard {shard.no + 1} places metadata {k!r}, which the model does not have")
        out.append((k, v))
    return out


def _check_model_kv(first: ShardLayout, model_kv: Mapping[str, G.GGUFValue]) -> None:
    placed = set(first.kv)
    for k in model_kv:
        if k in SPLIT_KEYS:
            raise UsageError(f"model metadata must not hold {k!r}: the layout supplies the split keys")
        if k not in placed:
            raise UsageError(f"model metadata {k!r} has no place in the recorded layout")


def write_shard(
    dst: Any,
    shard: ShardLayout,
    model_kv: Mapping[str, G.GGUFValue],
    data_for: DataFor | None = None,
    *,
    write_at: WriteAt | None = None,
    on_tensor: Callable[[int], None] | None = None,
    padding: Mapping[int, Any] | None = None,
) -> int:
    """Write one GGUF file exactly as ``shard`` describes (``dst``: a path or an open
    binary file); the tensors' bytes from ``data_for``, or written in place by
    ``write_at`` (``dst`` an open file; exactly one of the two); ``on_tensor(nbytes)``
    after each tensor; ``padding``: the writer's overrides of zero padding.  Returns the
    bytes written."""
    if (data_for is None) == (write_at is None) or (write_at is not None and isinstance(dst, (str, os.PathLike))):
        raise UsageError("write_shard takes data_for, or write_at with an open output file")
    w = G.GGUFWriterStream(
        dst,
        version=shard.version,
        alignment=shard.alignment,
        kv=shard_kv(shard, model_kv),
        tensors=[r.spec() for r in shard.tensors],
        pad_end=True if shard.tail_bytes is None else shard.tail_bytes,
        padding=padding,
    )
    positional: PositionalWriter | None = None  # this file's one, made at its first tensor
    with w:
        for spec in w.tensors_in_file_order:
            name = str(spec.name)
            if write_at is not None:
                at = w.skip_tensor_data(name=name)
                if positional is None:
                    positional = PositionalWriter(dst, None)
                write_at(name, positional, at)
            else:
                w.write_tensor_data(data_for(name), name=name)  # type: ignore[misc]  # (one of the two is given)
            if on_tensor is not None:
                on_tensor(G.tensor_nbytes(spec.type_id, spec.ne))
    return w.bytes_written


def _progress_counter(total: int, progress: Progress) -> Callable[[int], None] | None:
    if progress is None:
        return None
    done = [0]

    def step(n: int) -> None:
        done[0] += n
        progress(done[0], total)

    return step


def write_set(
    dst: "str | os.PathLike[str]",
    layout: "SplitLayout | Mapping[str, Any] | str",
    model_kv: Mapping[str, G.GGUFValue],
    data_for: DataFor | None = None,
    *,
    write_at: WriteAt | None = None,
    merge: bool = False,
    force: bool = False,
    inputs: Iterable["str | os.PathLike[str]"] = (),
    progress: Progress = None,
    padding: Mapping[int, Mapping[int, Any]] | None = None,
) -> list[Path]:
    """Write the set ``layout`` describes; returns the paths written.  The tensors' bytes
    come from ``data_for`` or are written in place by ``write_at`` (see :func:`write_shard`).
    ``padding``: per shard number (0-based), the writer's ``padding`` overrides (ignored
    with ``merge``).

    Without ``merge``: every shard, named as gguf-split names them (see
    :func:`set_paths`), all or nothing
    (:class:`~hurray_interop.files.atomic.AtomicOutputSet`); shards of another
    set under the same prefix in that folder are refused (even with ``force``):
    the folder would hold two sets at once.  With ``merge``: one file ``dst``
    holding every tensor, as ``gguf-split --merge`` writes it (:func:`merged_layout`).
    ``progress(done, total)`` counts tensor bytes over the whole output.
    """
    lay = _as_layout(layout)
    _check_model_kv(lay.shards[0], model_kv)
    if merge:
        shards: Sequence[ShardLayout] = (merged_layout(lay),)
        paths = [Path(os.fspath(dst))]
    else:
        shards = lay.shards
        paths = set_paths(dst, lay.count)
        _refuse_other_sets(paths[0], lay.count)
    step = _progress_counter(sum(s.nbytes for s in shards), progress)
    with AtomicOutputSet(paths, force=force, inputs=inputs) as outs:
        for i, shard in enumerate(shards):
            pad = None if merge or padding is None else padding.get(i)
            write_shard(outs.open(i), shard, model_kv, data_for, write_at=write_at, on_tensor=step, padding=pad)
            outs.close(i)
        return outs.commit()


def _refuse_other_sets(first: Path, count: int) -> None:
    if not first.parent.is_dir():  # the message every output gives (AtomicOutputSet checks the rest)
        raise missing_directory(first.parent)
    prefix = _prefix_of(first)
    for other, p in _shards_beside(first.parent, prefix):
        if other.count != count:
            raise UsageError(
                f"belongs to another set with the same prefix; writing {first.name} would mix two sets in one folder", path=p
            )
