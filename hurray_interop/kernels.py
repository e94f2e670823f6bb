"""The generic block movers, compiled when possible: ``_kernel.c`` through ctypes, else numpy.

Same functions, same signatures and the same bytes as
their numpy twins below (``numpy_*``; tests/test_kernels.py compares
both paths byte for byte), plus keyword-only ``out=`` buffers so a caller can
write straight into a block or Hurray buffer it reuses: split-half nibbles to and from
LSB-first pairs, field gathers and scatters, bit-field runs, the per-block scans that
find zero and unusable scales, the walk of uint64-length-prefixed strings, and
:func:`thread_buffer`.  This module also loads the one C library for every mover: the
movers of ggml's own block structs (Q5 high bits, the K-quant scales, Q6_K) call it from
:mod:`hurray_interop.conversions.gguf_kernels`, beside their users.

``_kernel.so`` is compiled at ``pip install`` (``hatch_build.py``) when a C
compiler works; without it, or with ``HURRAY_INTEROP_KERNEL=numpy`` in the
environment, every function runs its numpy twin.  :data:`KERNEL` says which
(``"c"`` or ``"numpy"``).  ctypes releases the GIL during each call, so the
worker threads of :mod:`hurray_interop.parallel` run the C code in parallel.

Arrays are ``(n_blocks, bytes)`` with one-byte items; rows may be strided (a
view of the memory-mapped file), bytes within a row contiguous.  Anything else
(other shapes, dtypes or strides, an ``out`` that overlaps the input) takes the
numpy path, so the results never differ -- only the speed.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np


__all__ = [
    "KERNEL",
    "ENV_VAR",
    "SCALE_OK",
    "SCALE_ZERO",
    "SCALE_BAD",
    "split_to_pairs",
    "pairs_to_split",
    "field_f16",
    "field_u8",
    "scatter_field",
    "scale_class",
    "all_zero",
    "unpack_runs",
    "pack_runs",
    "string_starts",
    "first_diff_f32",
    "first_bad_scale",
    "compare_stats",
    "DequantMember",
    "dequant_plan",
    "dequant_window",
    "dequant_diff",
]

ENV_VAR = "HURRAY_INTEROP_KERNEL"
LIBRARY = Path(__file__).with_name("_kernel.dll" if os.name == "nt" else "_kernel.so")
_ABI_VERSION = 16  # hk_abi_version() in _kernel.c

#: scale classes returned by :func:`scale_class`, one byte per block
SCALE_OK, SCALE_ZERO, SCALE_BAD = 0, 1, 2

_P, _S, _N, _B = ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_size_t, ctypes.c_uint8
#: every C function of the library (the hk_q5_*, hk_q6k_* and hk_dsc_* ones are called from
#: conversions/gguf_kernels.py)
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "hk_split_to_pairs": (None, [_P, _S, _N, _N, _P, _S, _B]),
    "hk_pairs_to_split": (None, [_P, _S, _N, _N, _P, _S]),
    "hk_q5_codes": (None, [_P, _S, _P, _S, _N, _N, _P, _S]),
    "hk_q5_pack": (None, [_P, _S, _N, _N, _P, _S, _P, _S]),
    "hk_move": (None, [_P, _S, _N, _N, _P, _S]),
    "hk_class_f16": (_N, [_P, _S, _N, _P]),
    "hk_class_e8m0": (_N, [_P, _S, _N, _P]),
    "hk_all_zero": (_N, [_P, _S, _N, _N, _B, _P]),
    "hk_unpack_runs": (None, [_P, _S, _N, _P, _N, _N, _N, _P, _S]),
    "hk_pack_runs": (None, [_P, _S, _N, _P, _N, _N, _P, _S]),
    "hk_string_starts": (_N, [_P, _N, _N, _N, _P, _P]),
    "hk_q6k_codes": (None, [_P, _S, _N, _P, _S]),
    "hk_q6k_pack": (_N, [_P, _S, _N, _P, _S]),
    "hk_q5_k_plane": (None, [_P, _S, _N, _N, _P, _S]),
    "hk_q5_k_join": (None, [_P, _S, _P, _S, _N, _N, _P, _S]),
    "hk_factor_first": (None, [_P, _P, _P, _N, _N, ctypes.c_float, ctypes.c_float, ctypes.c_float, ctypes.c_float,
                                ctypes.c_float, ctypes.c_float, ctypes.c_float, ctypes.c_int, _P, _P, _P, _P]),
    "hk_factor_rows": (_N, [_P, _P, _N, _N, ctypes.c_float, ctypes.c_float, ctypes.c_float, ctypes.c_float,
                            ctypes.c_float, ctypes.c_float, ctypes.c_float, ctypes.c_int, ctypes.c_uint,
                            ctypes.c_int, _P, _P]),
    "hk_plan_window": (None, [_P, _N, _N, _P]),
    "hk_plan_diff": (_N, [_P, _N, _N, _P, _P, _P, _N, _N, ctypes.c_int]),
    "hk_dequant_avx2": (ctypes.c_int, [ctypes.c_int]),
    "hk_first_diff_f32": (_N, [_P, _P, _N, ctypes.c_int]),
    "hk_first_diff_u8": (_N, [_P, _P, _N]),
    "hk_first_bad_scale": (_N, [_P, _N, ctypes.c_int, ctypes.c_uint32]),
    "hk_compare_stats": (None, [_P, _P, _N, _P, _P]),
    "hk_dsc_scales": (_N, [_P, _S, _N, _N, _N, _P, _N, ctypes.c_int, ctypes.c_int, _S, _P, _N, _P, _P, _P]),
}


def _load() -> Any:
    """The compiled library, or None (not built, stale, or the numpy path forced)."""
    if os.environ.get(ENV_VAR, "").strip().lower() == "numpy" or not LIBRARY.is_file():
        return None
    try:
        lib = ctypes.CDLL(str(LIBRARY))
        if lib.hk_abi_version() != _ABI_VERSION:
            return None
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
    except (OSError, AttributeError):
        return None
    return lib


_lib = _load()
KERNEL = "c" if _lib is not None else "numpy"


# ---------------------------------------------------------------------------
# argument checks: which arrays the C code can take as they are


def _rows(a: Any, width: int | None = None) -> bool:
    """A 2-D array of one-byte integers, bytes within a row contiguous (``width`` of them)."""
    return (
        isinstance(a, np.ndarray)
        and a.ndim == 2
        and a.dtype.kind in "ui"
        and a.dtype.itemsize == 1
        and (width is None or a.shape[1] == width)
        and (a.strides[1] == 1 or a.shape[1] <= 1 or a.shape[0] == 0)
    )


def _target(out: Any, n: int, width: int, *inputs: np.ndarray) -> bool:
    """``out`` can be written by C: writable byte rows of shape (n, width), apart from the inputs."""
    return (
        _rows(out, width)
        and out.shape[0] == n
        and out.flags.writeable
        and not any(np.may_share_memory(out, a) for a in inputs)
    )


def _field(blocks: Any, offset: Any, size: Any) -> bool:
    return (
        _rows(blocks)
        and isinstance(offset, (int, np.integer))
        and isinstance(size, (int, np.integer))
        and 0 <= offset
        and 0 <= size
        and offset + size <= blocks.shape[1]
    )


def _at(a: np.ndarray, offset: int = 0) -> int:
    return a.__array_interface__["data"][0] + offset


def _into(out: np.ndarray | None, result: np.ndarray) -> np.ndarray:
    if out is None:
        return result
    out[...] = result
    return out


def _new(out: np.ndarray | None, n: int, width: int) -> np.ndarray:
    return np.empty((n, width), dtype=np.uint8) if out is None else out



# ---------------------------------------------------------------------------
# the numpy twins: the fallback, and what tests/test_kernels.py compares C with

#: blocks per internal step of the nibble twins: a whole chunk of the one pass (64 Ki
#: blocks), in buffers kept per thread (:func:`thread_buffer`).  Each numpy call holds the GIL
#: for its set-up, so many small steps make the two workers take turns instead of running
#: (the 4 GB import took as long with one worker as with two): on the numpy path it took
#: 4.46 s with 8 Ki-block steps, 3.51 s with 32 Ki, 3.32 s with 64 Ki (medians of 5
#: alternated rounds; docs/benchmarks.md).
_STEP = 65536
_LO4 = np.uint64(0x000F000F000F000F)
_HI4 = np.uint64(0x00F000F000F000F0)
_S4 = np.uint64(4)
_S8 = np.uint64(8)


def numpy_split_to_pairs(qs: np.ndarray, xor: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """``(n, w)`` GGML split-half nibbles → ``(n, w)`` Hurray LSB-first pairs (``w`` a
    multiple of 8; each output byte XOR ``xor``; ``out``: an ``(n, w)`` byte array to fill).

    Viewing each pair of GGML bytes ``(a, b) = (qs[2i], qs[2i+1])`` as one
    little-endian uint16, Hurray's byte ``i`` is ``(a & 15) | (b & 15) << 4`` and byte
    ``w/2 + i`` is ``a >> 4 | (b & 0xF0)``.  Works on 64-bit words, four pairs at a time,
    a chunk of :data:`_STEP` blocks per step, in buffers kept per thread; each half is
    narrowed into a contiguous buffer (one flat loop) before it is stored into the
    output's rows."""
    n, w = qs.shape
    h = w // 2
    out = np.empty((n, w), dtype=np.uint8) if out is None else out
    rows = min(n, _STEP)
    x_, y_, lo_, t_ = (thread_buffer("kernels." + k, (rows, w // 8), "<u8") for k in ("x", "y", "lo", "t"))
    half_ = thread_buffer("kernels.half", (rows, h), np.uint8)
    for i in range(0, n, _STEP):
        k = min(_STEP, n - i)
        x, y, lo, t, half = x_[:k], y_[:k], lo_[:k], t_[:k], half_[:k]
        _copy_rows(x.view(np.uint8), qs[i : i + k])  # four (a | b << 8) lanes per word
        np.right_shift(x, _S4, out=y)
        np.bitwise_and(x, _LO4, out=lo)
        np.bitwise_and(y, _HI4, out=t)
        lo |= t  # lane: (a & 15) | (b & 15) << 4
        o = out[i : i + k]
        np.copyto(half, lo.view("<u2"), casting="unsafe")  # the low byte of each lane
        _copy_rows(o[:, :h], half)
        np.right_shift(x, _S8, out=lo)
        lo &= _HI4
        y &= _LO4
        lo |= y  # lane: a >> 4 | (b & 0xF0)
        np.copyto(half, lo.view("<u2"), casting="unsafe")
        _copy_rows(o[:, h:], half)
        if xor:
            o ^= xor
    return out


_LOCAL = threading.local()


def thread_buffer(key: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A work buffer of the calling thread for ``key``, kept from call to call (grown when
    needed): the workers reuse their chunk buffers instead of allocating them per chunk --
    fresh megabyte buffers come from ``mmap`` and pay a page fault per 4 KiB page, which
    made a 64 Ki-block step of the nibble twins 3.5x slower than their arithmetic.  Keys
    are per caller (``"kernels.…"`` here); a buffer is valid until the same thread asks
    for the same key again."""
    dt = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    bufs = _LOCAL.__dict__.setdefault("bufs", {})
    b = bufs.get(key)
    if b is None or b.size < size:
        b = bufs[key] = np.empty(max(size, 1), dtype=np.uint8)
    return b[:size].view(dt).reshape(shape)


#: rows of at most this many words are copied a column at a time (see :func:`_copy_rows`);
#: each column is a pass over the whole array, so more columns cost more than the rows:
#: 65,536 rows of 16 bytes into rows of 18 took 197 µs as 8 uint16 columns against 310 µs
#: as one 2-D copy, rows of 32 bytes into rows of 34 740 µs as 16 columns against 312 µs
_COLUMNS = 8
_WORDS = tuple((size, np.dtype(f"<u{size}")) for size in (8, 4, 2))


def _copy_rows(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for ``(n, s)`` byte arrays, fast for short rows.

    numpy pays per row when rows are a few bytes long and strided: a ``(8192, 16)`` copy
    into rows of 18 bytes takes 36 µs, the same rows as 8 columns of aligned uint16 25 µs,
    as 2 columns of uint64 3 µs.  So rows are copied as the widest word that tiles them and
    that both arrays are aligned to, a column at a time when there are few (at most
    :data:`_COLUMNS`).  Same bytes."""
    n, s = src.shape
    if (n >= 64 and dst.shape == src.shape and dst.strides[1:] == (1,) and src.strides[1:] == (1,)
            and dst.dtype == src.dtype == np.uint8):
        for size, word in _WORDS:
            if s % size:
                continue
            d, r = dst.view(word), src.view(word)
            if not (d.flags.aligned and r.flags.aligned):  # numpy's test: address and strides
                continue
            if s // size <= _COLUMNS:
                for j in range(s // size):
                    np.copyto(d[:, j], r[:, j])
            else:
                np.copyto(d, r)
            return
    np.copyto(dst, src)


def numpy_pairs_to_split(hp: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Inverse of :func:`numpy_split_to_pairs` (without ``xor``; ``out``: an ``(n, w)`` byte
    array to fill): each Hurray byte is widened into a uint16 lane, then four lanes per
    64-bit word give GGML byte pairs.  Buffers kept per thread, rows moved by
    :func:`_copy_rows`, widening and arithmetic on contiguous buffers."""
    n, w = hp.shape
    h = w // 2
    out = np.empty((n, w), dtype=np.uint8) if out is None else out
    rows = min(n, _STEP)
    half_ = thread_buffer("kernels.half", (rows, h), np.uint8)
    a16, b16 = (thread_buffer("kernels." + k, (rows, h), "<u2") for k in ("a16", "b16"))
    lo_, t_ = (thread_buffer("kernels." + k, (rows, w // 8), "<u8") for k in ("lo", "t"))
    for i in range(0, n, _STEP):
        k = min(_STEP, n - i)
        half, lo, t = half_[:k], lo_[:k], t_[:k]
        a64, b64 = a16[:k].view("<u8"), b16[:k].view("<u8")
        _copy_rows(half, hp[i : i + k, :h])
        np.copyto(a16[:k], half)  # widen each byte into a u16 lane
        _copy_rows(half, hp[i : i + k, h:])
        np.copyto(b16[:k], half)
        np.bitwise_and(a64, _LO4, out=lo)
        np.left_shift(b64, _S4, out=t)
        t &= _HI4
        lo |= t  # (a & 15) | (b << 4)
        np.right_shift(a64, _S4, out=t)
        t &= _LO4
        b64 &= _HI4
        t |= b64  # a >> 4 | (b & 0xF0)
        t <<= _S8
        lo |= t
        _copy_rows(out[i : i + k], lo.view(np.uint8).reshape(k, w))
    return out


def numpy_field_f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The float16 field at ``offset`` of every block, as a contiguous ``<f2`` array."""
    return numpy_field_u8(blocks, offset, 2).view("<f2").reshape(-1)


def numpy_field_u8(blocks: np.ndarray, offset: int, size: int, out: np.ndarray | None = None) -> np.ndarray:
    """The ``size`` bytes at ``offset`` of every block, as a contiguous ``(n, size)`` array
    (``out``: an ``(n, size)`` byte array to fill)."""
    part = blocks[:, offset : offset + size]
    out = np.empty(part.shape, dtype=blocks.dtype) if out is None else out
    _copy_rows(out, part)  # a 2-byte scale: one uint16 per block, 14x faster than a row of 2 bytes
    return out


#: fields of at most this many items in more than 2 runs (the packed scales) are unpacked
#: from the transposed bytes: a long row per byte instead of many runs of a few bytes
_NARROW = 32

#: a bit-field run: ``(item, byte, length, shift, mask, dst)`` -- items ``item + j`` are
#: ``((block[byte + j] >> shift) & mask) << dst``, ORed over the runs
Run = tuple[int, int, int, int, int, int]


def numpy_unpack_runs(blocks: np.ndarray, runs: tuple[Run, ...], n_items: int, dtype: Any) -> np.ndarray:
    """``(n, n_items)`` values (``dtype``: uint8 or uint16) of the bit-field ``runs`` in every block."""
    n = blocks.shape[0]
    narrow = n_items <= _NARROW and len(runs) > 2
    lo = min(r[1] for r in runs) if narrow else 0
    src = np.ascontiguousarray(blocks[:, lo : max(r[1] + r[2] for r in runs)].T) if narrow else blocks
    res = np.zeros((n_items, n) if narrow else (n, n_items), dtype=dtype)
    for item, byte, length, shift, mask, dst in runs:
        v = src[byte - lo : byte - lo + length] if narrow else src[:, byte : byte + length]  # (views)
        if shift:
            v = v >> shift
        if shift + mask.bit_length() < 8:
            v = np.bitwise_and(v, mask, out=v if shift else None)
        if dst:
            v = v.astype(dtype) << dst
        if narrow:
            res[item : item + length] |= v
        else:
            res[:, item : item + length] |= v
    return np.ascontiguousarray(res.T) if narrow else res


def numpy_pack_runs(values: np.ndarray, runs: tuple[Run, ...], out: np.ndarray) -> None:
    """OR the items ``values`` (``(n, items)``, uint8 or uint16) into the bit-field ``runs`` of
    ``out`` (``(n, block_bytes)``, uint8)."""
    for item, byte, length, shift, mask, dst in runs:
        v = values[:, item : item + length]
        x = v >> dst if dst else v & mask
        if dst:
            x &= mask
        if shift:
            x <<= shift
        out[:, byte : byte + length] |= x.astype(np.uint8, copy=False)


#: bytes of a string array scanned per vectorised step (:func:`_short_string_heads`)
STRING_WINDOW = 1 << 22
_U64 = struct.Struct("<Q")


def _short_string_heads(buf: Any, pos: int, count: int, end: int) -> tuple[list[np.ndarray], int, int]:
    """Offsets of the length prefixes of up to ``count`` consecutive length-prefixed
    strings from ``pos``, found a window of :data:`STRING_WINDOW` bytes at a time without
    a Python step per string: every offset whose 8 bytes read as a length under 256 is a
    candidate, and the candidate after ``c`` is the next string exactly when
    ``c + 8 + length`` is that candidate -- so a run of short strings is taken at once,
    and the result is exact whatever the bytes (false candidates inside strings are
    never reached).  Returns ``(parts, next position, strings found)``; it stops early
    at ``end``, and when strings the candidates miss (256 bytes or longer, or a prefix
    at a window's edge: one unpack each) turn out common, leaving the rest to the
    caller's plain loop."""
    parts: list[np.ndarray] = []
    got = steps = 0
    while got < count and steps <= 64 + got // 64:
        if end - pos < 16:
            break
        width = min(STRING_WINDOW, end - pos)
        window = np.frombuffer(buf, np.uint8, width, pos)
        lengths = np.ndarray((width - 7,), "<u8", buffer=window, strides=(1,))
        cand = np.flatnonzero(lengths < 256)
        nxt = cand + 8 + lengths[cand].astype(np.int64)
        breaks = np.flatnonzero(nxt[:-1] != cand[1:])
        rel = 0
        while got < count and rel < width - 8 and steps <= 64 + got // 64:
            i = int(np.searchsorted(cand, rel))
            steps += 1
            if i == len(cand) or cand[i] != rel:  # not a short string: one step
                parts.append(np.array([pos + rel], dtype=np.int64))
                got += 1
                rel += 8 + int(lengths[rel])
                continue
            k = int(np.searchsorted(breaks, i))
            j = min(int(breaks[k]) if k < len(breaks) else len(cand) - 1, i + count - got - 1)
            parts.append(cand[i : j + 1] + pos)
            got += j + 1 - i
            rel = int(nxt[j])
        pos += rel
    return parts, pos, got


def numpy_string_starts(buf: Any, pos: int, count: int, end: int) -> tuple[np.ndarray, int]:
    """Walk ``count`` strings (a little-endian uint64 length, then the bytes) from ``pos``
    in ``buf[:end]``: ``(starts, stop)``, the int64 offsets of the strings' bytes and the
    offset after the last.  When a string's length prefix or bytes run past ``end``,
    ``starts`` holds only the strings before it and ``stop`` is its length prefix.

    Runs of short strings are found a window at a time (:func:`_short_string_heads`), the
    rest one string at a time -- one unpack and one append each, with no check in the
    loop: a prefix past the buffer makes ``unpack_from`` raise (``OverflowError`` past
    2**63), a string past the end is found after the loop, and only then located."""
    parts, pos, got = _short_string_heads(buf, pos, count, end)
    heads: list[int] = []
    add = heads.append
    unpack = _U64.unpack_from
    try:
        for _ in range(count - got):
            add(pos)
            pos += 8 + unpack(buf, pos)[0]
    except (struct.error, OverflowError):  # a prefix past the buffer, or past any offset
        pos = end + 1
    if pos > end:  # the first string that runs past the end (the heads after it may be any size)
        walked = [h for p in parts for h in p.tolist()] + heads
        for i, at in enumerate(walked):
            if end - at < 8 or unpack(buf, at)[0] > end - at - 8:
                return np.array(walked[:i], dtype=np.int64) + 8, at
    parts.append(np.array(heads, dtype=np.int64))
    starts = np.concatenate(parts)
    starts += 8
    return starts, pos


#: the numpy path of every mover, by the name of the dispatching function
_np = SimpleNamespace(
    split_to_pairs=numpy_split_to_pairs,
    pairs_to_split=numpy_pairs_to_split,
    field_f16=numpy_field_f16,
    field_u8=numpy_field_u8,
    unpack_runs=numpy_unpack_runs,
    pack_runs=numpy_pack_runs,
    string_starts=numpy_string_starts,
)


# ---------------------------------------------------------------------------
# the movers: C when the library is loaded, else their numpy twins


def _width(a: Any, multiple: int) -> int:
    """Bytes per row of ``a`` when the C movers take it (a positive multiple of ``multiple``), else -1."""
    return a.shape[1] if _rows(a) and a.shape[1] > 0 and a.shape[1] % multiple == 0 else -1


def split_to_pairs(qs: np.ndarray, xor: int = 0, *, out: np.ndarray | None = None) -> np.ndarray:
    """``(n, w)`` GGML split-half nibbles → ``(n, w)`` Hurray LSB-first pairs, each byte XOR ``xor``
    (C for ``w`` a multiple of 16)."""
    w = _width(qs, 16)
    if _lib is None or w < 0 or not 0 <= int(xor) <= 255 or not (out is None or _target(out, len(qs), w, qs)):
        return _np.split_to_pairs(qs, xor, out)
    dst = _new(out, len(qs), w)
    _lib.hk_split_to_pairs(_at(qs), qs.strides[0], len(qs), w, _at(dst), dst.strides[0], int(xor))
    return dst


def pairs_to_split(h: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """Inverse of :func:`split_to_pairs` (without ``xor``)."""
    w = _width(h, 16)
    if _lib is None or w < 0 or not (out is None or _target(out, len(h), w, h)):
        return _np.pairs_to_split(h, out)
    dst = _new(out, len(h), w)
    _lib.hk_pairs_to_split(_at(h), h.strides[0], len(h), w, _at(dst), dst.strides[0])
    return dst


def field_f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The float16 field at ``offset`` of every block, as a contiguous ``<f2`` array."""
    if _lib is None or not _field(blocks, offset, 2):
        return _np.field_f16(blocks, offset)
    out = np.empty(blocks.shape[0], dtype="<f2")
    _lib.hk_move(_at(blocks, offset), blocks.strides[0], blocks.shape[0], 2, _at(out), 2)
    return out


def field_u8(blocks: np.ndarray, offset: int, size: int, *, out: np.ndarray | None = None) -> np.ndarray:
    """The ``size`` bytes at ``offset`` of every block, as a contiguous ``(n, size)`` array
    (``out``: a reused ``(n, size)`` byte array to fill)."""
    n = blocks.shape[0] if isinstance(blocks, np.ndarray) and blocks.ndim == 2 else -1
    if _lib is None or not _field(blocks, offset, size) or not (out is None or _target(out, n, size, blocks)):
        return _np.field_u8(blocks, offset, size, out)
    dst = np.empty((n, size), dtype=blocks.dtype) if out is None else out
    _lib.hk_move(_at(blocks, offset), blocks.strides[0], n, size, _at(dst), dst.strides[0])
    return dst


# ---------------------------------------------------------------------------
# new movers and scans


def scatter_field(blocks: np.ndarray, offset: int, values: np.ndarray) -> None:
    """Write each block's field at ``offset``: row ``i`` of ``values`` (its bytes as they lie in
    memory, e.g. one ``<f2`` scale or 4 code bytes) into ``blocks[i, offset:]``."""
    n = blocks.shape[0]
    if n == 0:
        return
    v = np.ascontiguousarray(values).reshape(n, -1)
    v = v.view(np.uint8) if v.dtype.itemsize != 1 or v.dtype.kind not in "ui" else v
    size = v.shape[1]
    if _lib is None or not (_field(blocks, offset, size) and _target(blocks, n, blocks.shape[1], v)):
        _copy_rows(blocks[:, offset : offset + size], v)
        return
    _lib.hk_move(_at(v), v.strides[0], n, size, _at(blocks, offset), blocks.strides[0])


def _scale_class_numpy(blocks: np.ndarray, offset: int, kind: str) -> np.ndarray:
    if kind == "f16":
        m = _np.field_f16(blocks, offset).view("<u2")
        m &= 0x7FFF  # |value|: zero is 0, inf and NaN (exponent all ones) are >= 0x7C00
        bad = m >= 0x7C00
        out = (m == 0).view(np.uint8)  # SCALE_ZERO where zero, else SCALE_OK
    else:
        e = blocks[:, offset]
        bad = e == 0xFF
        out = (e == 0).view(np.uint8)
    if bad.any():
        out[bad] = SCALE_BAD
    return out


def scale_class(blocks: np.ndarray, offset: int, kind: str) -> np.ndarray:
    """One class per block of its scale at ``offset``: :data:`SCALE_OK`, :data:`SCALE_ZERO`
    (±0; E8M0 0x00) or :data:`SCALE_BAD` (inf or NaN; E8M0 0xFF).  ``kind``: ``"f16"`` or ``"e8m0"``."""
    if kind not in ("f16", "e8m0"):
        raise ValueError(f"scale kind {kind!r}: expected 'f16' or 'e8m0'")
    if _lib is None or not _field(blocks, offset, 2 if kind == "f16" else 1):
        return _scale_class_numpy(blocks, offset, kind)
    out = np.empty(blocks.shape[0], dtype=np.uint8)
    scan = _lib.hk_class_f16 if kind == "f16" else _lib.hk_class_e8m0
    scan(_at(blocks, offset), blocks.strides[0], blocks.shape[0], _at(out))
    return out


def all_zero(rows: np.ndarray, mask: int = 0xFF) -> np.ndarray:
    """Per row: is every byte AND ``mask`` zero (all codes decode to zero; 0x77 for MXFP's ±0)?"""
    if _lib is None or not _rows(rows) or not 0 <= int(mask) <= 255:
        return ~np.any(rows & mask, axis=1)
    out = np.empty(rows.shape[0], dtype=np.uint8)
    _lib.hk_all_zero(_at(rows), rows.strides[0], rows.shape[0], rows.shape[1], int(mask), _at(out))
    return out.view(np.bool_)


@functools.lru_cache(maxsize=256)
def _run_table(runs: tuple[Run, ...]) -> tuple[np.ndarray, int, int]:
    """``runs`` as the int32 table the C code reads, with the item and byte extents it touches."""
    t = np.ascontiguousarray(np.array(runs, dtype=np.int32).reshape(-1, 6))
    items = max((r[0] + r[2] for r in runs), default=0)
    nbytes = max((r[1] + r[2] for r in runs), default=0)
    short = sum(r[2] for r in runs) < _MIN_RUN * len(runs)
    return t, items, -1 if short else nbytes


#: runs shorter than this on average (scales of single items here and there) are moved
#: faster by numpy's whole-column slices than by the C loop per block
_MIN_RUN = 2


def _run_dtype(dtype: Any) -> int:
    d = np.dtype(dtype)
    return d.itemsize if d.kind == "u" and d.itemsize in (1, 2) and d.isnative else 0


def unpack_runs(blocks: np.ndarray, runs: tuple[Run, ...], n_items: int, dtype: Any) -> np.ndarray:
    """``(n, n_items)`` values (uint8 or uint16) of the bit-field ``runs`` (:data:`Run`) in every block."""
    table, items, nbytes = _run_table(runs)
    isize = _run_dtype(dtype)
    if (_lib is None or nbytes < 0 or not runs or not isize or not _rows(blocks) or blocks.dtype != np.uint8
            or nbytes > blocks.shape[1] or items > n_items):
        return _np.unpack_runs(blocks, runs, n_items, dtype)
    n = blocks.shape[0]
    out = np.empty((n, n_items), dtype=dtype)
    if n:
        _lib.hk_unpack_runs(_at(blocks), blocks.strides[0], n, _at(table), len(table), n_items, isize,
                            _at(out), out.strides[0])
    return out


def pack_runs(values: np.ndarray, runs: tuple[Run, ...], out: np.ndarray) -> None:
    """OR the items ``values`` (``(n, items)``, uint8 or uint16) into the bit-field ``runs`` of
    ``out`` (``(n, block_bytes)``, uint8), in place."""
    table, items, nbytes = _run_table(runs)
    n = out.shape[0] if isinstance(out, np.ndarray) and out.ndim == 2 else -1
    isize = _run_dtype(values.dtype) if isinstance(values, np.ndarray) else 0
    if (_lib is None or nbytes < 0 or not runs or not isize or values.ndim != 2 or len(values) != n or values.shape[1] < items
            or not _target(out, n, out.shape[1], values) or out.dtype != np.uint8 or nbytes > out.shape[1]):
        _np.pack_runs(values, runs, out)
        return
    v = np.ascontiguousarray(values)
    if n:
        _lib.hk_pack_runs(_at(v), v.strides[0], n, _at(table), len(table), isize, _at(out), out.strides[0])


def string_starts(buf: Any, pos: int, count: int, end: int) -> tuple[np.ndarray, int]:
    """Walk ``count`` length-prefixed strings (a little-endian uint64 length, then the bytes,
    as GGUF's string arrays lie) from ``pos`` in ``buf[:end]`` (a buffer: bytes, mmap, memoryview): returns
    ``(starts, stop)``, the int64 offsets of the strings' bytes and the offset after the
    last.  If a string's length prefix or bytes run past ``end``, ``starts`` holds the
    strings before it and ``stop`` is that string's length prefix (its index is
    ``len(starts)``).  No Python step per string on either path."""
    if not 0 <= pos <= end or count < 0:
        raise ValueError(f"string walk from {pos} in {end} bytes")
    if _lib is None or count == 0:
        return _np.string_starts(buf, pos, count, end)
    view = np.frombuffer(buf, np.uint8, end) if end else np.zeros(1, np.uint8)
    starts = np.empty(count, dtype=np.int64)
    stop = ctypes.c_size_t()
    n = _lib.hk_string_starts(_at(view), end, pos, count, _at(starts), ctypes.byref(stop))
    return starts[:n], int(stop.value)


# ---------------------------------------------------------------------------
# the shared dequantizer's compiled path (its numpy twin is hurray_interop/dequant.py's own
# evaluation; tests/test_dequant_kernel.py compares the two bit for bit)


class DequantMember(ctypes.Structure):
    """One per-block member of a compiled dequantization (``hk_dq_member`` in ``_kernel.c``)."""

    _fields_ = [("codes", _P), ("scale", _P), ("zero", _P), ("table", _P), ("stable", _P),
                ("block", ctypes.c_int64), ("bits", ctypes.c_int32), ("is_signed", ctypes.c_int32),
                ("scale_kind", ctypes.c_int32), ("constant", ctypes.c_int32)]


#: scale kinds of ``hk_dq_member``: float16 and float8_e8m0 through a value table
DQ_SCALE_KINDS = {"float16": 1, "bfloat16": 2, "float32": 3, "float8_e8m0": 4}


class _Plan(ctypes.Structure):
    """``hk_plan`` in ``_kernel.c``: a dequantization's members, or (members NULL) plain 16-bit floats."""

    _fields_ = [("members", _P), ("nm", _N), ("halves", _P), ("kind", ctypes.c_int32), ("table", _P)]


class DequantPlan:
    """The members of one compiled dequantization and every array they point into (kept
    alive with the plan).  Built by :func:`dequant_plan`; run by :func:`dequant_window`,
    :func:`dequant_diff` and :func:`dequant_diff_decoded`."""

    def __init__(self, members: list[dict[str, Any]], size: int) -> None:
        self.size = size
        self._keep = [a for m in members for a in m.values() if isinstance(a, np.ndarray)]
        arr = (DequantMember * len(members))()
        for slot, m in zip(arr, members):
            for key in ("codes", "scale", "zero", "table", "stable"):
                a = m.get(key)
                setattr(slot, key, _at(a) if a is not None else None)
            slot.block, slot.bits, slot.is_signed = int(m["block"]), int(m["bits"]), int(m["signed"])
            slot.scale_kind, slot.constant = DQ_SCALE_KINDS[m["scale_kind"]], int(m["constant"])
        self.members = arr
        self.c = _Plan(ctypes.cast(arr, ctypes.c_void_p).value, len(members), None, 0, None)


#: kinds of plain 16-bit floats (:class:`HalvesPlan`): float16 through its value table, bfloat16 by a shift
HALF_KINDS = {"float16": 1, "bfloat16": 2}


class HalvesPlan:
    """A plain float16/bfloat16 tensor's 16-bit patterns (and float16's value table: numpy's
    cast of every pattern, so numpy's bits by construction), run by the same functions as a
    :class:`DequantPlan`.  Built by :func:`halves_plan`."""

    def __init__(self, bits: np.ndarray, kind: str, table: np.ndarray | None) -> None:
        self.size = bits.size
        self._keep = (bits, table)
        self.c = _Plan(None, 0, _at(bits), HALF_KINDS[kind], _at(table) if table is not None else None)


def halves_plan(bits: np.ndarray, kind: str, table: np.ndarray | None) -> HalvesPlan | None:
    """A compiled plan for the plain 16-bit floats ``bits`` (1-D, C-contiguous, aligned ``<u2``)
    of ``kind`` (:data:`HALF_KINDS`; float16 with ``table``, its 65536 float32 values), or None
    where the library is not loaded or the arrays do not fit: the caller's numpy path."""
    if _lib is None or kind not in HALF_KINDS:
        return None
    if not (bits.dtype == np.dtype("<u2") and bits.ndim == 1 and bits.flags.c_contiguous and _at(bits) % 2 == 0):
        return None
    if kind == "float16" and not (isinstance(table, np.ndarray) and table.dtype == np.float32
                                  and table.size == 1 << 16 and table.flags.c_contiguous):
        return None
    return HalvesPlan(bits, kind, table if kind == "float16" else None)


Plan = DequantPlan | HalvesPlan


def _aligned(a: np.ndarray | None, itemsize: int) -> bool:
    return a is None or (a.flags.c_contiguous and _at(a) % itemsize == 0)


def dequant_plan(members: list[dict[str, Any]], size: int) -> DequantPlan | None:
    """A compiled plan for the ``size`` elements of ``members`` (dicts: ``codes`` uint8 array starting at element 0,
    ``scale`` the per-block scales as stored, ``scale_kind`` (:data:`DQ_SCALE_KINDS`),
    ``stable`` its value table for float16/float8_e8m0, ``zero`` int32 zero points or None,
    ``table`` float32 code values or None (integer codes), ``block``, ``bits`` (1/2/4/8),
    ``signed``, ``constant``), or None where the library is not loaded or an array does not
    fit (not C-contiguous, misaligned, a table of the wrong size): the caller's numpy path."""
    if _lib is None or not members:
        return None
    for m in members:
        bits, kind = int(m["bits"]), m["scale_kind"]
        table, stable, scale, zero = m.get("table"), m.get("stable"), m["scale"], m.get("zero")
        if bits not in (1, 2, 4, 8) or kind not in DQ_SCALE_KINDS or int(m["block"]) < 1:
            return None
        if m["codes"].dtype != np.uint8 or not m["codes"].flags.c_contiguous:
            return None
        if table is not None and (table.dtype != np.float32 or table.size != 1 << bits or zero is not None):
            return None
        need = {1: 1 << 16, 4: 256}.get(DQ_SCALE_KINDS[kind])
        if need is not None and (stable is None or stable.dtype != np.float32 or stable.size != need):
            return None
        if not (_aligned(scale, scale.dtype.itemsize) and _aligned(zero, 4) and _aligned(table, 4)
                and _aligned(stable, 4)):
            return None
        if zero is not None and zero.dtype != np.dtype("<i4"):
            return None
    return DequantPlan(members, size)


def dequant_diff(plan: Plan, g0: int, ref: np.ndarray, zero_equal: bool = False) -> int:
    """The index in ``ref`` (C-contiguous float32) of the first value that differs in its bits
    from element ``g0 + index`` as :func:`dequant_window` computes it (``zero_equal``: +0 and
    -0 alike), or -1: the comparison without the window ever written to memory."""
    if not (isinstance(ref, np.ndarray) and ref.dtype == np.float32 and ref.flags.c_contiguous and ref.ndim == 1):
        raise ValueError("dequant_diff compares with a 1-D C-contiguous float32 array")
    _inside(plan, g0, ref.size)
    i = int(_lib.hk_plan_diff(ctypes.byref(plan.c), int(g0), ref.size, _at(ref), None, None, 1, 0,
                              1 if zero_equal else 0))
    return -1 if i == ref.size else i


#: the largest block a reference decoder may have in :func:`dequant_diff_decoded` (HK_DQ_CHUNK)
DECODED_CHUNK = 4096


def dequant_diff_decoded(plan: Plan, g0: int, n: int, decode: int, blocks: np.ndarray, block_elements: int,
                         zero_equal: bool = False) -> int:
    """:func:`dequant_diff` of elements ``g0 .. g0 + n`` against a reference decoder run in C
    over ``blocks`` (C-contiguous uint8, one row per block of ``block_elements`` values, the
    first holding element ``g0``): ``decode`` is the address of a ggml ``to_float``
    (``void (const void *, float *, int64_t)``).  Both sides are computed 4096 values at a
    time and compared in L1.  Returns the index (from ``g0``) of the first value whose bits
    differ, or -1."""
    if not (isinstance(blocks, np.ndarray) and blocks.dtype == np.uint8 and blocks.ndim == 2
            and blocks.flags.c_contiguous):
        raise ValueError("the reference decoder reads C-contiguous uint8 blocks, one per row")
    if not 1 <= block_elements <= DECODED_CHUNK or blocks.shape[0] * block_elements != n:
        raise ValueError(f"{blocks.shape[0]} blocks of {block_elements} values are not the {n} values compared")
    if not decode:
        raise ValueError("no decoder")
    _inside(plan, g0, n)
    i = int(_lib.hk_plan_diff(ctypes.byref(plan.c), int(g0), n, None, decode, _at(blocks), block_elements,
                              blocks.shape[1], 1 if zero_equal else 0))
    return -1 if i == n else i


def _inside(plan: Plan, g0: int, n: int) -> None:
    if not 0 <= g0 <= plan.size - n:
        raise ValueError(f"elements {g0}..{g0 + n} are not inside the tensor's {plan.size}")


def dequant_window(plan: Plan, g0: int, out: np.ndarray) -> None:
    """``out`` (C-contiguous float32) = the values of elements ``g0 .. g0 + out.size`` (row-major),
    which must lie inside the plan's tensor (the C code reads codes and scales there)."""
    if not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.flags.c_contiguous
            and out.flags.writeable):
        raise ValueError("dequant_window writes a writeable C-contiguous float32 array")
    _inside(plan, g0, out.size)
    _lib.hk_plan_window(ctypes.byref(plan.c), int(g0), out.size, _at(out))


def loaded() -> bool:
    """Whether the compiled library is loaded now (the tests switch it off to run the twins)."""
    return _lib is not None


def dequant_avx2(enabled: bool | None = None) -> bool:
    """Whether :func:`dequant_window` and :func:`dequant_diff` run their AVX2 loops (eight
    lanes; the SSE2 loops otherwise, the same bits): on where the CPU has AVX2.  ``enabled``
    switches them off or back on (the tests run both); False without the library."""
    if _lib is None:
        return False
    return bool(_lib.hk_dequant_avx2(-1 if enabled is None else int(bool(enabled))))


def numpy_first_diff_f32(a: np.ndarray, b: np.ndarray, zero_equal: bool = False) -> int:
    """Index of the first element whose float32 bit patterns differ (``zero_equal``: +0 and
    -0 count as equal), or -1."""
    diff = a.view(np.uint32) != b.view(np.uint32)
    if zero_equal:
        diff &= ~((a == 0) & (b == 0))
    return int(np.argmax(diff)) if diff.any() else -1


def numpy_first_diff_bytes(a: np.ndarray, b: np.ndarray) -> int:
    """Index of the first differing item of two equal-length 1-D arrays, or -1."""
    return -1 if np.array_equal(a, b) else int(np.argmax(a != b))


def first_diff_bytes(a: np.ndarray, b: np.ndarray) -> int:
    """:func:`numpy_first_diff_bytes` of two equal-length 1-D uint8 arrays, in one C pass
    (``memcmp``, no temporaries) when both are C-contiguous."""
    if (_lib is None or a.dtype != np.uint8 or b.dtype != np.uint8 or a.ndim != 1 or a.shape != b.shape
            or not (a.flags.c_contiguous and b.flags.c_contiguous)):
        return numpy_first_diff_bytes(a, b)
    if a.size == 0:
        return -1
    i = int(_lib.hk_first_diff_u8(_at(a), _at(b), a.size))
    return -1 if i == a.size else i


def first_diff_f32(a: np.ndarray, b: np.ndarray, zero_equal: bool = False) -> int:
    """:func:`numpy_first_diff_f32` of two equal-length 1-D float32 arrays, in C when both are
    C-contiguous (one pass, no temporaries)."""
    if a.shape != b.shape or a.ndim != 1 or a.dtype != np.float32 or b.dtype != np.float32:
        raise ValueError("first_diff_f32 compares two 1-D float32 arrays of one length")
    if _lib is None or not (a.flags.c_contiguous and b.flags.c_contiguous):
        return numpy_first_diff_f32(a, b, zero_equal)
    i = int(_lib.hk_first_diff_f32(_at(a), _at(b), a.size, 1 if zero_equal else 0))
    return -1 if i == a.size else i


#: exponent masks of the 16-bit float scale types (bit patterns)
_EXP16 = {"float16": 0x7C00, "bfloat16": 0x7F80}


def numpy_first_bad_scale(bits: np.ndarray, kind: str) -> int:
    """Index of the first scale that is not finite or is ±0, or -1: ``bits`` are the scales'
    IEEE bit patterns (uint16 for ``kind`` float16/bfloat16, uint32 for float32)."""
    if kind in _EXP16:
        e = _EXP16[kind]
        bad = ((bits & e) == e) | ((bits & 0x7FFF) == 0)
    else:
        bad = ((bits & 0x7F800000) == 0x7F800000) | ((bits & 0x7FFFFFFF) == 0)
    return int(np.argmax(bad)) if bad.any() else -1


def first_bad_scale(bits: np.ndarray, kind: str) -> int:
    """:func:`numpy_first_bad_scale`, in one C pass when ``bits`` is a C-contiguous aligned
    1-D array of the kind's width."""
    width = 2 if kind in _EXP16 else 4
    if (_lib is None or bits.ndim != 1 or bits.dtype.itemsize != width or bits.dtype.kind != "u"
            or not bits.flags.c_contiguous or _at(bits) % width):
        return numpy_first_bad_scale(bits, kind)
    i = int(_lib.hk_first_bad_scale(_at(bits), bits.size, 8 * width, _EXP16.get(kind, 0)))
    return -1 if i == bits.size else i


def compare_stats(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float, float, float, int, int] | None:
    """``compare``'s sums of two equal-length 1-D C-contiguous float32 windows in one C pass:
    ``(Σd², Σa², Σb², Σab, max|d|, unequal pairs, first unequal index or -1)`` (the semantics of
    :mod:`hurray_interop.verification.compare`, whose ``window_stats_numpy`` is the twin: counts,
    index and max exact, the float64 sums to a relative 1e-12 -- another order of addition);
    None when the library is not loaded or the arrays are not such."""
    if (_lib is None or a.shape != b.shape or a.ndim != 1 or a.dtype != np.float32 or b.dtype != np.float32
            or not (a.flags.c_contiguous and b.flags.c_contiguous)):
        return None
    sums = np.empty(5, np.float64)
    counts = np.empty(2, np.uint64)
    _lib.hk_compare_stats(_at(a), _at(b), a.size, _at(sums), _at(counts))
    first = int(counts[1])
    return (float(sums[0]), float(sums[1]), float(sums[2]), float(sums[3]), float(sums[4]), int(counts[0]),
            -1 if first == a.size else first)
