"""safetensors checkpoints with OCP MX tensors: strict reader, streaming writer, MX pairs.

Why a hand-written reader/writer rather than the ``safetensors`` package: we need
zero-copy views of a memory-mapped file (``safetensors.numpy`` copies every tensor and
knows neither ``F8_E8M0`` nor ``F4`` in numpy), the exact header bytes and tensor order
for byte-identical round trips, a streaming writer, and typed errors that name the
tensor and byte offset.  The format is tiny (8-byte little-endian header length, a JSON
header padded with spaces to a multiple of 8, then the data); tests/test_safetensors_mx.py
checks both directions against the ``safetensors`` package.

MX checkpoint conventions (``mappings/mx_types.toml`` ``[conventions.*]``, docs/format-notes.md § 3.7):

* ``gpt-oss``: ``<base>_blocks`` U8 ``[..., G, 16]`` + ``<base>_scales`` U8 ``[..., G]`` ->
  one Hurray MXFP tensor ``<base>``, float4_e2m1, logical shape ``[..., G*32]``, block 32,
  axis = last; data = the blocks bytes, scales = the scales bytes (both unchanged).
* ``mxfp8`` (compressed-tensors ``mxfp8-quantized``, NVIDIA ModelOpt MXFP8):
  ``<m>.weight`` F8_E4M3/F8_E5M2 ``[..., 32G]`` + ``<m>.weight_scale`` U8/F8_E8M0
  ``[..., G]`` -> Hurray ``<m>.weight`` (float8, block 32, last axis).  A ``.weight``
  without such a scale (plain, or per-tensor/per-channel FP8 with float scales) stays plain.
* ``compressed-tensors``: ``<m>.weight_packed`` U8 ``[..., 16G]`` (MXFP4) or ``[..., 24G]``
  (MXFP6 E2M3) + ``<m>.weight_scale`` U8/F8_E8M0 ``[..., G]`` -> Hurray ``<m>.weight``,
  ``[..., 32G]``, block 32, axis = last.  A ``<m>.weight_global_scale`` or a non-E8M0
  ``weight_scale`` means NVFP4 (not MX): those tensors stay plain.  Old (before
  compressed-tensors PR #538) MXFP4 checkpoints stored scales with bias 125; the file
  does not say so and the bytes are carried unchanged.

Malformed pairs (a data tensor without its scales, a ``*_scales`` without ``*_blocks``,
wrong dtypes, mismatched shapes) raise :class:`~hurray_interop.errors.FormatError`
naming the tensor.  A ``*_scales`` tensor without ``*_blocks`` is an ordinary plain tensor.
"""

from __future__ import annotations

import functools
import json
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..files.atomic import AtomicOutput
from ..files.positional import PositionalWriter
from ..core.elements import ElementType, element_type
from ..errors import (
    FormatError,
    HurrayInteropError,
    InconsistentError,
    TruncatedError,
    UnsupportedError,
    UsageError,
)
from ..tables import load_table

__all__ = [
    "STEntry",
    "STTensor",
    "SafetensorsFile",
    "MXPair",
    "CONVENTIONS",
    "DTYPES",
    "dtype_bits",
    "dtype_nbytes",
    "hurray_type_for",
    "safetensors_dtype_for",
    "detect_pairs",
    "pair_names",
    "pair_shapes",
    "pair_data_dtype",
    "convention_for",
    "build_header",
    "FileRange",
    "write_safetensors",
]

#: safetensors refuses headers above 100 MB; so do we (a corrupt length must not allocate GBs)
MAX_HEADER = 100_000_000

DTYPES: Mapping[str, Mapping[str, Any]] = load_table("mx_types")["safetensors_dtypes"]
CONVENTIONS: Mapping[str, Mapping[str, Any]] = load_table("mx_types")["conventions"]


def dtype_bits(dtype: str, *, tensor: str | None = None) -> int:
    try:
        return int(DTYPES[dtype]["bits"])
    except KeyError:
        raise UnsupportedError(f"safetensors dtype {dtype!r} is not supported", tensor=tensor) from None


def dtype_nbytes(dtype: str, shape: Sequence[int], *, tensor: str | None = None) -> int:
    bits = dtype_bits(dtype, tensor=tensor) * math.prod(int(d) for d in shape)  # exact: no int64 wrap-around
    if bits % 8:
        raise InconsistentError(f"{dtype} tensor of shape {list(shape)} is not a whole number of bytes", tensor=tensor)
    return bits // 8


def hurray_type_for(dtype: str, *, tensor: str | None = None) -> tuple[ElementType, bool]:
    """(Hurray element type, exact?) for a plain safetensors dtype; not exact means the
    bytes travel as 1-D uint8 and the dtype must be recorded."""
    dtype_bits(dtype, tensor=tensor)
    row = DTYPES[dtype]
    return element_type(str(row["hurray"])), bool(row.get("exact_type", True))


def safetensors_dtype_for(et: ElementType, *, tensor: str | None = None) -> str:
    for name, row in DTYPES.items():
        if row["hurray"] == et.name and row.get("exact_type", True):
            return name
    raise UnsupportedError(f"Hurray element type {et.name} has no safetensors dtype", tensor=tensor)


# ---------------------------------------------------------------------------
# reader


@dataclass(frozen=True)
class STEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # relative to the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class STTensor:
    """One tensor as :meth:`SafetensorsFile.tensor` gives it: its header entry, a zero-copy
    read-only view of its bytes, and the file it is in (an MX pair's other half is there)."""

    entry: STEntry
    data: np.ndarray
    file: "SafetensorsFile"

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def dtype(self) -> str:
        return self.entry.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.entry.shape


class SafetensorsFile:
    """A memory-mapped, strictly validated safetensors file.

    ``entries`` are in header order; ``raw(name)`` is a zero-copy read-only uint8 view;
    ``tensor(name)`` the :class:`STTensor` that ``hurray_interop.dequantize`` takes.
    """

    def __init__(self, path: "str | os.PathLike[str]") -> None:
        self.path = Path(os.fspath(path))
        p = self.path
        try:
            self._fh = open(p, "rb")
        except OSError as e:
            raise UsageError(f"cannot open: {e.strerror or e}", path=p) from None
        try:
            size = os.fstat(self._fh.fileno()).st_size
            if size < 8:
                raise TruncatedError(f"file holds {size} bytes, the header length needs 8", path=p, field="header length", offset=0)
            self._mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ)  # size >= 8 here
            buf = memoryview(self._mm)  # type: ignore[arg-type]
            (n,) = struct.unpack_from("<Q", buf, 0)
            if n > MAX_HEADER:
                raise FormatError(f"header length {n} exceeds the {MAX_HEADER}-byte limit", path=p, field="header length", offset=0)
            if 8 + n > size:
                raise TruncatedError(f"header of {n} bytes runs past the end of the {size}-byte file", path=p, field="header", offset=8)
            self.header_bytes = bytes(buf[8 : 8 + n])
            self.data_offset = 8 + n
            self.metadata, self.entries = _parse_header(self.header_bytes, size - self.data_offset, p)
            self._buf = np.frombuffer(self._mm, dtype=np.uint8)  # type: ignore[arg-type]
            del buf
        except BaseException:
            self.close()
            raise
        self._by_name = {e.name: e for e in self.entries}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries)

    def entry(self, name: str) -> STEntry:
        try:
            return self._by_name[name]
        except KeyError:
            raise UsageError(f"no tensor named {name!r}", path=self.path) from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def raw(self, name: str) -> np.ndarray:
        e = self.entry(name)
        v = self._buf[self.data_offset + e.begin : self.data_offset + e.end]
        v.flags.writeable = False
        return v

    def tensor(self, name: str) -> STTensor:
        """The tensor ``name`` (its entry and bytes); :class:`UsageError` for an unknown name."""
        return STTensor(self.entry(name), self.raw(name), self)

    def array(self, name: str) -> np.ndarray:
        """The tensor as a numpy array (ml_dtypes for BF16/F8; raw uint8 bytes for F4/F6)."""
        e = self.entry(name)
        et, exact = hurray_type_for(e.dtype, tensor=name)
        raw = self.raw(name)
        if not exact or et.packed:
            return raw
        return raw.view(et.dtype).reshape(e.shape)

    @functools.cached_property
    def mx_pairs(self) -> "tuple[tuple[MXPair, ...], frozenset[str]]":
        """:func:`detect_pairs` of this file, found once per reader (the file is read-only)."""
        pairs, used = _find_pairs(self)
        return tuple(pairs), frozenset(used)

    @functools.cached_property
    def pairs_by_name(self) -> "dict[str, MXPair]":
        """The MX pair each half of a pair (data and scale tensor) belongs to, by tensor name."""
        return {name: p for p in self.mx_pairs[0] for name in (p.data.name, p.scale.name)}

    def close(self) -> None:
        self._buf = None  # type: ignore[assignment]
        mm = getattr(self, "_mm", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # views still alive: the map closes when they go
                pass
        fh = getattr(self, "_fh", None)
        if fh is not None:
            fh.close()

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _no_dupes(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise InconsistentError(f"duplicate key {k!r} in the JSON header", field="header", key=k)
        out[k] = v
    return out


def _entry_offset(text: str, name: str) -> int:
    """Absolute file offset of the tensor's key in the header (8 if it cannot be found)."""
    for key in (json.dumps(name, ensure_ascii=False), json.dumps(name)):
        pos = text.find(key)
        if pos >= 0:
            return 8 + len(text[:pos].encode("utf-8"))
    return 8


def _is_unicode(s: str) -> bool:
    """False for a string JSON escapes gave a lone surrogate (``"\\ud800"``): no UTF-8 text
    holds one, and the safetensors package refuses such a header."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _parse_header(raw: bytes, data_size: int, path: Path) -> tuple[dict[str, str] | None, list[STEntry]]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(f"header is not UTF-8 (byte {e.start})", path=path, field="header", offset=8 + e.start) from None
    if not text.startswith("{"):
        raise FormatError("header does not start with '{'", path=path, field="header", offset=8)
    try:
        obj = json.loads(text, object_pairs_hook=_no_dupes)
    except InconsistentError as e:
        key = json.dumps(str(e.details.get("key", "")), ensure_ascii=False)
        first = text.find(key)
        second = text.find(key, first + 1) if first >= 0 else -1
        pos = second if second >= 0 else max(first, 0)
        e.offset = 8 + len(text[:pos].encode("utf-8"))
        raise e.located(path=path)
    except (json.JSONDecodeError, RecursionError) as e:
        pos = getattr(e, "pos", 0)
        raise FormatError(f"header is not valid JSON: {getattr(e, 'msg', e)}", path=path, field="header", offset=8 + pos) from None
    except ValueError as e:  # e.g. an integer literal beyond Python's digit limit
        raise FormatError(f"header is not valid JSON: {e}", path=path, field="header", offset=8) from None
    if not isinstance(obj, dict):
        raise FormatError("header is not a JSON object", path=path, field="header", offset=8)
    metadata = None
    entries: list[STEntry] = []
    for name, info in obj.items():

        def at(n: str = name) -> int:  # located only when raising: the scan costs O(header)
            return _entry_offset(text, n)

        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise FormatError("__metadata__ must map strings to strings", path=path, field="__metadata__", offset=at())
            bad = next((x for kv in info.items() for x in kv if not _is_unicode(x)), None)
            if bad is not None:
                raise FormatError(f"__metadata__ string {bad!r} is not valid Unicode (a lone surrogate escape)",
                                  path=path, field="__metadata__", offset=at())
            metadata = dict(info)
            continue
        if not _is_unicode(name):
            raise FormatError(f"tensor name {name!r} is not valid Unicode (a lone surrogate escape)",
                              path=path, tensor=name, field="header", offset=at())
        if not isinstance(info, dict) or set(info) - {"dtype", "shape", "data_offsets"} or len(info) != 3:
            raise FormatError("entry must have exactly dtype, shape and data_offsets", path=path, tensor=name, field="header", offset=at())
        dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise UnsupportedError(f"dtype {dtype!r} is not supported", path=path, tensor=name, field="dtype", offset=at())
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise FormatError(f"shape {shape!r} is not a list of non-negative integers", path=path, tensor=name, field="shape", offset=at())
        if (
            not isinstance(offs, list)
            or len(offs) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
            or not 0 <= offs[0] <= offs[1]
        ):
            raise FormatError(
                f"data_offsets {offs!r} are not [begin, end] with 0 <= begin <= end",
                path=path, tensor=name, field="data_offsets", offset=at(),
            )
        try:
            need = dtype_nbytes(dtype, shape, tensor=name)
        except HurrayInteropError as e:
            e.offset = at() if e.offset is None else e.offset
            raise e.located(path=path)
        if offs[1] - offs[0] != need:
            raise InconsistentError(
                f"data_offsets {offs} hold {offs[1] - offs[0]} bytes, {dtype} {shape} needs {need}",
                path=path, tensor=name, field="data_offsets", offset=at(),
            )
        if offs[1] > data_size:
            raise TruncatedError(
                f"data_offsets {offs} run past the {data_size}-byte data section",
                path=path, tensor=name, field="data_offsets", offset=at(),
            )
        entries.append(STEntry(name, dtype, tuple(shape), offs[0], offs[1]))
    # the data section must be covered exactly once (as the safetensors package requires)
    pos = 0
    for e in sorted(entries, key=lambda e: (e.begin, e.end)):
        if e.begin != pos:
            what = "overlaps the previous tensor" if e.begin < pos else f"leaves a gap of {e.begin - pos} bytes"
            raise InconsistentError(
                f"data_offsets [{e.begin}, {e.end}] {what}", path=path, tensor=e.name, field="data_offsets", offset=_entry_offset(text, e.name)
            )
        pos = e.end
    if pos != data_size:
        raise InconsistentError(
            f"tensors cover {pos} bytes of the {data_size}-byte data section", path=path, field="data section",
            offset=8 + len(raw) + pos,
        )
    return metadata, entries


# ---------------------------------------------------------------------------
# MX pairs


@dataclass(frozen=True)
class MXPair:
    """One MX tensor of a checkpoint (a data tensor plus its scale tensor)."""

    hurray_name: str
    convention: str
    data: STEntry
    scale: STEntry
    element: str  # Hurray element type name
    shape: tuple[int, ...]  # logical shape
    block_size: int

    @property
    def axis(self) -> int:
        return len(self.shape) - 1


def pair_names(hurray_name: str, convention: str) -> tuple[str, str]:
    """(data tensor name, scale tensor name) of a Hurray MXFP tensor in ``convention``.

    compressed-tensors: ``<m>.weight`` -> ``<m>.weight_packed`` / ``<m>.weight_scale``; a
    name without the ``.weight`` suffix (e.g. a gpt-oss ``experts.down_proj``) gets
    ``.weight_packed`` / ``.weight_scale`` appended (and re-imports as ``X.weight``)."""
    c = _convention(convention)
    base = hurray_name
    suf = str(c["hurray_suffix"])
    if suf and base.endswith(suf):
        # "<m>.weight" -> "<m>.weight_packed"; any other name X -> "X.weight_packed"
        base = base[: -len(suf)]
    return base + str(c["data_suffix"]), base + str(c["scale_suffix"])


def _per_block(c: Mapping[str, Any]) -> dict[str, tuple[int, str]]:
    """element -> (data bytes per 32-element block, data dtype) for a convention."""
    out = {str(v): (int(k), str(c["data_dtype"])) for k, v in c["elements"].items()}
    for dt, el in c.get("data_elements", {}).items():
        out[str(el)] = (int(c["block_size"]) * element_type(str(el)).bits // 8, str(dt))
    return out


def pair_shapes(shape: Sequence[int], element: str, block_size: int, convention: str, *, tensor: str = "") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(data shape, scale shape) of an MXFP tensor written in ``convention``."""
    c = _convention(convention)
    if block_size != int(c["block_size"]):
        raise UnsupportedError(f"{convention} stores block size {c['block_size']}, not {block_size}", tensor=tensor)
    per_block = _per_block(c)
    if element not in per_block:
        raise UnsupportedError(f"{convention} has no {element} tensors", tensor=tensor)
    g = shape[-1] // block_size
    prefix = tuple(shape[:-1])
    if c["blocks_dim"]:
        return prefix + (g, per_block[element][0]), prefix + (g,)
    return prefix + (g * per_block[element][0],), prefix + (g,)


def convention_for(element: str, convention: str) -> str:
    """``convention`` if it stores ``element``, else a convention of the same family that
    does (compressed-tensors MXFP8 uses the ``mxfp8`` naming), else ``convention``."""
    c = _convention(convention)
    if element in _per_block(c):
        return convention
    for name, other in CONVENTIONS.items():
        if other.get("family") == c.get("family") and element in _per_block(other):
            return name
    return convention


def pair_data_dtype(element: str, convention: str) -> str:
    """safetensors dtype of the data tensor of an ``element`` pair in ``convention``."""
    c = _convention(convention)
    per_block = _per_block(c)
    if element not in per_block:
        raise UnsupportedError(f"{convention} has no {element} tensors")
    return per_block[element][1]


def _convention(name: str) -> Mapping[str, Any]:
    try:
        return CONVENTIONS[name]
    except KeyError:
        raise UsageError(f"unknown checkpoint convention {name!r} (one of: {', '.join(CONVENTIONS)})") from None


def detect_pairs(st: SafetensorsFile) -> tuple[list[MXPair], set[str]]:
    """Find the MX pairs of a checkpoint; returns (pairs in data-tensor header order,
    names of all tensors that belong to a pair).  Found once per reader
    (:attr:`SafetensorsFile.mx_pairs`)."""
    pairs, used = st.mx_pairs
    return list(pairs), set(used)


def _find_pairs(st: SafetensorsFile) -> tuple[list[MXPair], set[str]]:
    """:func:`detect_pairs`, computed."""
    pairs: list[MXPair] = []
    used: set[str] = set()
    names = set(st.names)
    for conv, c in CONVENTIONS.items():
        dsuf, ssuf, hsuf = str(c["data_suffix"]), str(c["scale_suffix"]), str(c["hurray_suffix"])
        strict = bool(c["strict"])  # a data tensor without a valid partner is an error
        blocks_dim = bool(c["blocks_dim"])  # gpt-oss: every mismatch is an error
        data_elements = dict(c.get("data_elements", {}))
        for e in st.entries:
            if not e.name.endswith(dsuf) or e.name in used:
                continue
            base = e.name[: -len(dsuf)]
            sname = base + ssuf
            if sname not in names:
                if not strict:
                    continue
                raise FormatError(f"MX data tensor has no scale tensor {sname!r}", path=st.path, tensor=e.name, offset=st.data_offset + e.begin)
            s = st.entry(sname)
            data_ok = e.dtype in data_elements if data_elements else e.dtype == c["data_dtype"]
            if not blocks_dim:
                # compressed-tensors / ModelOpt: only E8M0 scales without a global scale are MX
                # (int4 pack-quantized, NVFP4 and per-channel FP8 share the names)
                if not data_ok or s.dtype not in c["scale_dtypes"] or base + ".weight_global_scale" in names:
                    continue
            else:
                if not data_ok:
                    raise FormatError(f"MX blocks must be {c['data_dtype']}, not {e.dtype}", path=st.path, tensor=e.name, offset=st.data_offset + e.begin)
                if s.dtype not in c["scale_dtypes"]:
                    raise FormatError(f"MX scales must be {'/'.join(c['scale_dtypes'])}, not {s.dtype}", path=st.path, tensor=sname, offset=st.data_offset + s.begin)
            k = int(c["block_size"])
            if blocks_dim:
                if len(e.shape) < 2 or str(e.shape[-1]) not in c["elements"] or s.shape != e.shape[:-1]:
                    raise InconsistentError(
                        f"blocks shape {list(e.shape)} and scales shape {list(s.shape)} do not form "
                        f"[..., G, 16] / [..., G]",
                        path=st.path, tensor=e.name, offset=st.data_offset + e.begin,
                    )
                el = str(c["elements"][str(e.shape[-1])])
                g = e.shape[-2]
                shape = e.shape[:-2] + (g * k,)
            else:
                ok = len(e.shape) >= 1 and len(s.shape) == len(e.shape) and s.shape[:-1] == e.shape[:-1] and s.shape[-1] > 0
                per = e.shape[-1] // s.shape[-1] if ok else 0
                if data_elements:
                    el = str(data_elements[e.dtype])
                    good = ok and e.shape[-1] == k * s.shape[-1]
                else:
                    el = str(c["elements"].get(str(per), ""))
                    good = ok and not e.shape[-1] % s.shape[-1] and bool(el)
                if not good:
                    if not strict:
                        continue
                    raise InconsistentError(
                        f"packed shape {list(e.shape)} and scale shape {list(s.shape)} do not form "
                        f"[..., 16G] (MXFP4) or [..., 24G] (MXFP6) / [..., G]",
                        path=st.path, tensor=e.name, offset=st.data_offset + e.begin,
                    )
                g = s.shape[-1]
                shape = e.shape[:-1] + (g * k,)
            if g == 0 or any(d == 0 for d in shape):
                raise UnsupportedError("empty MX tensor (Hurray MXFP needs whole, non-empty blocks)", path=st.path, tensor=e.name, offset=st.data_offset + e.begin)
            pairs.append(MXPair(base + hsuf, conv, e, s, el, shape, k))
            used.update((e.name, sname))
    hnames = [p.hurray_name for p in pairs]
    plain = [n for n in st.names if n not in used]
    clash = set(hnames) & set(plain)
    if clash or len(set(hnames)) != len(hnames):
        n = sorted(clash)[0] if clash else next(h for h in hnames if hnames.count(h) > 1)
        raise InconsistentError(f"MX tensor name {n!r} collides with another tensor", path=st.path, tensor=n)
    order = {n: i for i, n in enumerate(st.names)}
    pairs.sort(key=lambda p: order[p.data.name])
    return pairs, used


# ---------------------------------------------------------------------------
# writer


def build_header(entries: Sequence[tuple[str, str, Sequence[int]]], metadata: Mapping[str, str] | None) -> tuple[bytes, list[tuple[int, int]]]:
    """The JSON header (compact, as the safetensors package writes it, padded with spaces to a
    multiple of 8) for tensors laid out in the given order; returns (header, offsets)."""
    obj: dict[str, Any] = {}
    if metadata is not None:
        obj["__metadata__"] = dict(metadata)
    offsets = []
    pos = 0
    for name, dtype, shape in entries:
        if name == "__metadata__" or name in obj:
            raise UsageError(f"duplicate or reserved tensor name {name!r}", tensor=name)
        n = dtype_nbytes(dtype, shape, tensor=name)
        obj[name] = {"dtype": dtype, "shape": [int(d) for d in shape], "data_offsets": [pos, pos + n]}
        offsets.append((pos, pos + n))
        pos += n
    h = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    h += b" " * (-len(h) % 8)
    return h, offsets


def _header_matches(raw: bytes, entries: Sequence[tuple[str, str, Sequence[int]]], metadata: Mapping[str, str] | None) -> bool:
    """Does a recorded header describe exactly these tensors (any order) and metadata?"""
    try:
        total = sum(dtype_nbytes(d, s) for _, d, s in entries)
        md, parsed = _parse_header(raw, total, Path("<recorded header>"))
    except (FormatError, UnsupportedError):
        return False
    if (md or None) != (dict(metadata) if metadata else None) or (md is None) != (metadata is None):
        return False
    if [e.name for e in sorted(parsed, key=lambda e: e.begin)] != [n for n, _, _ in entries]:
        return False
    want = {n: (d, tuple(int(x) for x in s)) for n, d, s in entries}
    return all(want.get(e.name) == (e.dtype, e.shape) for e in parsed)


@dataclass(frozen=True)
class FileRange:
    """``length`` bytes at ``offset`` of the open file ``fd``: a tensor source that
    :func:`write_safetensors` copies by the kernel, never through this process's memory."""

    fd: int
    offset: int
    length: int


def _chunks(src: Any) -> Iterator[Any]:
    if callable(src):
        src = src()
    if isinstance(src, (bytes, bytearray, memoryview, np.ndarray)):
        yield src
    else:
        yield from src


def _as_bytes(chunk: Any) -> memoryview:
    if isinstance(chunk, np.ndarray):
        return memoryview(np.ascontiguousarray(chunk).reshape(-1).view(np.uint8))
    return memoryview(chunk).cast("B")


def _write_tensor(pw: PositionalWriter, src: Any, offset: int, size: int, name: str, what: str) -> None:
    """One tensor's bytes at ``offset``: a :class:`FileRange` by the kernel, anything else
    chunk by chunk as it is produced; the byte count must be ``size``."""
    if isinstance(src, FileRange):
        if src.length != size:
            raise InconsistentError(f"source holds {src.length} bytes, {what} needs {size}", tensor=name)
        pw.copy(src.fd, src.offset, size, offset)
        return
    written = 0
    for chunk in _chunks(src):
        mv = _as_bytes(chunk)
        if written + mv.nbytes > size:
            raise InconsistentError(f"source gives more than the {size} bytes {what} needs", tensor=name)
        pw.pwrite(mv, offset + written)
        written += mv.nbytes
    if written != size:
        raise InconsistentError(f"source gave {written} bytes, {what} needs {size}", tensor=name)


def write_safetensors(
    path: "str | os.PathLike[str]",
    tensors: Sequence[tuple[str, str, Sequence[int], Any]],
    metadata: Mapping[str, str] | None = None,
    *,
    force: bool = False,
    header: bytes | None = None,
    inputs: Iterable["str | os.PathLike[str]"] = (),
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Stream a safetensors file atomically, in bounded memory.  ``tensors``: ``(name,
    dtype, shape, source)`` in data order; ``source`` is bytes-like, an iterable of
    chunks, a callable returning either, or a :class:`FileRange`.  ``header``: recorded
    header bytes to reuse verbatim when they describe exactly these tensors
    (byte-identical round trips).  The header is computed first, from the names, dtypes
    and shapes alone; each tensor is then written at its final offset
    (:class:`~hurray_interop.files.positional.PositionalWriter`) as its source yields it.
    ``progress(done_bytes, total_bytes)`` is called after each tensor.  Returns the file size."""
    entries = [(n, d, tuple(s)) for n, d, s, _ in tensors]
    h, offsets = build_header(entries, metadata)
    if header is not None and header != h and _header_matches(header, entries, metadata):
        h = header
        # recorded offsets follow the recorded order, which equals ours (checked above)
    base = 8 + len(h)
    total = offsets[-1][1] if offsets else 0
    with AtomicOutput(path, force=force, inputs=inputs) as out:
        out.write(struct.pack("<Q", len(h)))
        out.write(h)
        pw = PositionalWriter(out, base + total)
        for (name, dtype, shape, src), (b, e) in zip(tensors, offsets):
            _write_tensor(pw, src, base + b, e - b, name, f"{dtype} {list(shape)}")
            if progress:
                progress(e, total)
        out.commit()
    return base + total
