"""GGML's own block movers: the Q5 high bits, the K-quants' two-level scales, Q6_K's code fields.

Each dispatches like the generic movers of :mod:`hurray_interop.kernels` -- the compiled
``_kernel.c`` (loaded there, one library for every mover) when ``kernels._lib`` is loaded
and the arrays fit, else its numpy twin below (``numpy_*``); tests/test_kernels.py compares
both paths byte for byte.  They live beside their users (:mod:`.gguf_codec` for Q5_0/Q5_1,
:mod:`.gguf_expanded` for the K-quants) because their layouts are ggml's block structs.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import kernels as K

__all__ = [
    "q5_codes",
    "q5_pack",
    "DSC_ZERO",
    "DSC_BAD_D",
    "DSC_BAD_DMIN",
    "dsc_scales",
    "Q6K_BLOCK_BYTES",
    "q6k_codes",
    "q6k_pack",
    "q5k_plane",
    "q5k_join",
    "factor_first",
    "factor_rows",
]


# ---------------------------------------------------------------------------
# Q5_0 / Q5_1: four low bits split-half in qs, the fifth bit of element j as bit j of qh


def numpy_q5_codes(qs: np.ndarray, qh: np.ndarray) -> np.ndarray:
    """GGML Q5 block parts (``qs`` (n, k/2), ``qh`` (n, k/8), bit ``j`` of ``qh`` = bit 4 of
    element ``j``) → ``(n, k)`` codes 0..31 in element order."""
    k = 2 * qs.shape[1]
    high = np.unpackbits(np.ascontiguousarray(qh), axis=1, bitorder="little")
    out = np.empty((qs.shape[0], k), dtype=np.uint8)
    out[:, : k // 2] = qs & 0x0F
    out[:, k // 2 :] = qs >> 4
    out |= high << 4
    return out


def numpy_q5_pack(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(n, k)`` codes 0..31 → GGML ``(qs (n, k/2), qh (n, k/8))``."""
    c = codes.astype(np.uint8, copy=False)
    k = c.shape[1]
    qs = (c[:, : k // 2] & 0x0F) | ((c[:, k // 2 :] & 0x0F) << 4)
    return qs, np.packbits((c >> 4) & 1, axis=1, bitorder="little")


def q5_codes(qs: np.ndarray, qh: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """GGML Q5 block parts (``qs`` (n, k/2), ``qh`` (n, k/8)) → ``(n, k)`` codes 0..31 in element
    order (k = 32 for Q5_0/Q5_1; C for k a multiple of 16)."""
    k = 2 * K._width(qs, 8)
    if k > 0 and not (K._rows(qh, k // 8) and len(qh) == len(qs)):
        k = -1
    if K._lib is None or k < 0 or not (out is None or K._target(out, len(qs), k, qs, qh)):
        return K._into(out, numpy_q5_codes(qs, qh))
    dst = K._new(out, len(qs), k)
    K._lib.hk_q5_codes(K._at(qs), qs.strides[0], K._at(qh), qh.strides[0], len(qs), k,
                       K._at(dst), dst.strides[0])
    return dst


def q5_pack(
    codes: np.ndarray, *, qs_out: np.ndarray | None = None, qh_out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(n, k)`` codes 0..31 → GGML ``(qs (n, k/2), qh (n, k/8))``.  ``qs_out`` and ``qh_out`` may
    be two fields of the same blocks (they must not overlap each other)."""
    c = codes.astype(np.uint8, copy=False)
    k, n = K._width(c, 16), len(c)
    if (
        K._lib is None
        or k < 0
        or not (qs_out is None or K._target(qs_out, n, k // 2, c))
        or not (qh_out is None or K._target(qh_out, n, k // 8, c))
    ):
        qs, qh = numpy_q5_pack(c)
        return K._into(qs_out, qs), K._into(qh_out, qh)
    qs, qh = K._new(qs_out, n, k // 2), K._new(qh_out, n, k // 8)
    K._lib.hk_q5_pack(K._at(c), c.strides[0], n, k, K._at(qs), qs.strides[0], K._at(qh), qh.strides[0])
    return qs, qh


# ---------------------------------------------------------------------------
# the K-quants' two-level scales

#: :func:`dsc_scales` flags, one byte per block
DSC_ZERO, DSC_BAD_D, DSC_BAD_DMIN = 1, 2, 4


def _f16_bits(blocks: np.ndarray, offset: int) -> np.ndarray:
    return blocks[:, offset].astype(np.uint16) | blocks[:, offset + 1].astype(np.uint16) << np.uint16(8)


def numpy_dsc_scales(blocks: np.ndarray, d_off: int, sc: tuple[K.Run, ...], subs: int, sc_signed: bool, add: int,
                     dmin_off: int, m: tuple[K.Run, ...]) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """``(scales, corr, flags)``: per block ``float32(d)·float32(sc + add)`` (``(n, subs)``
    float32; ``sc`` the bit-field runs, read as int8 when ``sc_signed``), where ``dmin_off >= 0``
    ``−(float32(dmin)·float32(m))`` (else None), and the flags :data:`DSC_ZERO` (a scale is
    ±0), :data:`DSC_BAD_D` / :data:`DSC_BAD_DMIN` (not finite).  ``d``, ``dmin``: float16
    fields at ``d_off`` / ``dmin_off``."""
    with np.errstate(invalid="ignore"):  # (inf · 0: a non-finite d is flagged, and refused)
        return _dsc(blocks, d_off, sc, subs, sc_signed, add, dmin_off, m)


def _dsc(blocks: np.ndarray, d_off: int, sc: tuple[K.Run, ...], subs: int, sc_signed: bool, add: int,
         dmin_off: int, m: tuple[K.Run, ...]) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    hd = _f16_bits(blocks, d_off)
    raw = K.numpy_unpack_runs(blocks, sc, subs, np.uint8)
    f = (raw.view(np.int8) if sc_signed else raw).astype(np.float32)
    if add:
        f = np.float32(add) + f
    scales = hd.view(np.float16).astype(np.float32)[:, None] * f
    flags = (scales == 0).any(axis=1).astype(np.uint8)
    flags |= np.where((hd & 0x7C00) == 0x7C00, DSC_BAD_D, 0).astype(np.uint8)
    if dmin_off < 0:
        return scales, None, flags
    hm = _f16_bits(blocks, dmin_off)
    corr = -(hm.view(np.float16).astype(np.float32)[:, None] * K.numpy_unpack_runs(blocks, m, subs, np.uint8).astype(np.float32))
    flags |= np.where((hm & 0x7C00) == 0x7C00, DSC_BAD_DMIN, 0).astype(np.uint8)
    return scales, corr, flags


@functools.lru_cache(maxsize=64)
def _dsc_tables(width: int, d_off: int, sc: tuple[K.Run, ...], subs: int, dmin_off: int,
                m: tuple[K.Run, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """The run tables of :func:`dsc_scales` for blocks of ``width`` bytes, or None when the C
    code cannot take the fields (more than 64 sub-blocks, items wider than a byte, fields
    outside the block)."""
    runs = [sc] + ([m] if dmin_off >= 0 else [])
    for r in runs:
        if not r or K._run_table(r)[1] > subs or max(x[1] + x[2] for x in r) > width or max(x[4] << x[5] for x in r) > 255:
            return None
    if not 0 < subs <= 64 or any(not 0 <= o <= width - 2 for o in [d_off] + ([dmin_off] if dmin_off >= 0 else [])):
        return None
    return K._run_table(sc)[0], K._run_table(runs[-1])[0]


def dsc_scales(blocks: np.ndarray, d_off: int, sc: tuple[K.Run, ...], subs: int, sc_signed: bool = False, add: int = 0,
               dmin_off: int = -1, m: tuple[K.Run, ...] = ()) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """The K-quants' sub-block scales in one pass over the blocks (:func:`numpy_dsc_scales`)."""
    tables = (_dsc_tables(blocks.shape[1], d_off, sc, subs, dmin_off, m)
              if K._lib is not None and K._rows(blocks) and blocks.dtype == np.uint8 else None)
    if tables is None:
        return numpy_dsc_scales(blocks, d_off, sc, subs, sc_signed, add, dmin_off, m)
    n = blocks.shape[0]
    scales = np.empty((n, subs), dtype=np.float32)
    corr = np.empty((n, subs), dtype=np.float32) if dmin_off >= 0 else None
    flags = np.empty(n, dtype=np.uint8)
    if n:
        K._lib.hk_dsc_scales(K._at(blocks), blocks.strides[0], n, subs, d_off, K._at(tables[0]), len(sc), int(bool(sc_signed)),
                             int(add), dmin_off, K._at(tables[1]), len(m) if dmin_off >= 0 else 0, K._at(scales),
                             K._at(corr) if corr is not None else None, K._at(flags))
    return scales, corr, flags


# ---------------------------------------------------------------------------
# Q6_K's code fields (ql: bytes 0..127, qh: 128..191 of a 210-byte block)

Q6K_BLOCK_BYTES = 210


def _q6k_parts(h: int) -> tuple[slice, slice, slice]:
    return slice(64 * h, 64 * h + 32), slice(64 * h + 32, 64 * h + 64), slice(128 + 32 * h, 160 + 32 * h)


def numpy_q6k_codes(blocks: np.ndarray) -> np.ndarray:
    """``(n, 210)`` Q6_K blocks → ``(n, 256)`` int8 codes ``q − 32`` in element order (ggml's
    dequantize_row_q6_K: per half ``h`` and ``l < 32``, elements ``l``, ``l + 32``, ``l + 64``,
    ``l + 96`` from the nibbles of ``ql[l]``, ``ql[l + 32]`` and the 2-bit pairs of ``qh[l]``)."""
    out = np.empty((blocks.shape[0], 256), dtype=np.uint8)
    for h in (0, 1):
        a, b, q = (blocks[:, s] for s in _q6k_parts(h))
        o = out[:, 128 * h : 128 * h + 128]
        o[:, 0:32] = (a & 15) | (q & 3) << 4
        o[:, 32:64] = (b & 15) | (q >> 2 & 3) << 4
        o[:, 64:96] = (a >> 4) | (q >> 4 & 3) << 4
        o[:, 96:128] = (b >> 4) | (q >> 6) << 4
    out += np.uint8(0xE0)  # − 32, modulo 256
    return out.view(np.int8)


def numpy_q6k_pack(codes: np.ndarray, out: np.ndarray) -> int:
    """OR ``(n, 256)`` int8 codes (value ``(code + 32) & 63``) into the ql and qh fields of ``out``
    (``(n, 210)`` uint8 blocks); returns how many rows hold a code outside −32..31."""
    u = codes.view(np.uint8)
    raw = (u ^ np.uint8(0x20)) & np.uint8(0x3F)
    for h in (0, 1):
        r = [raw[:, 128 * h + 32 * k : 128 * h + 32 * k + 32] for k in range(4)]
        a, b, q = _q6k_parts(h)
        out[:, a] |= (r[0] & 15) | (r[2] & 15) << 4
        out[:, b] |= (r[1] & 15) | (r[3] & 15) << 4
        out[:, q] |= (r[0] >> 4) | (r[1] >> 4) << 2 | (r[2] >> 4) << 4 | (r[3] >> 4) << 6
    c = codes.view(np.int8)
    if c.size == 0 or (int(c.min()) >= -32 and int(c.max()) <= 31):
        return 0
    return int(((c < -32) | (c > 31)).any(axis=1).sum())


def q6k_codes(blocks: np.ndarray) -> np.ndarray:
    """Q6_K blocks → int8 codes (:func:`numpy_q6k_codes`)."""
    if K._lib is None or K._width(blocks, 1) != Q6K_BLOCK_BYTES or blocks.dtype != np.uint8:
        return numpy_q6k_codes(blocks)
    out = np.empty((blocks.shape[0], 256), dtype=np.uint8)
    if len(blocks):
        K._lib.hk_q6k_codes(K._at(blocks), blocks.strides[0], len(blocks), K._at(out), out.strides[0])
    return out.view(np.int8)


def q6k_pack(codes: np.ndarray, out: np.ndarray) -> int:
    """OR the codes into Q6_K blocks, in place (:func:`numpy_q6k_pack`)."""
    n = len(codes)
    if (K._lib is None or K._width(codes, 1) != 256 or not K._target(out, n, Q6K_BLOCK_BYTES, codes)
            or out.dtype != np.uint8):
        return numpy_q6k_pack(codes, out)
    if not n:
        return 0
    return int(K._lib.hk_q6k_pack(K._at(codes), codes.strides[0], n, K._at(out), out.strides[0]))


# ---------------------------------------------------------------------------
# Q5_K's compact form (docs/conversion-rules.md § 11): the high bits of block_q5_K.qh as a
# Hurray uint2 plane, and the 5-bit codes joined back from the two planes


def numpy_q5k_plane(blocks: np.ndarray, qh_off: int) -> np.ndarray:
    """``(n, block)`` Q5_K blocks → ``(n, 64)`` uint2 plane bytes of the high bits (element
    ``e``: bit ``e // 32`` of ``qh[e % 32]``; four elements a byte, LSB first): per bit ``j``
    and four bytes (a uint32 ``w``), ``x = (w >> j) & 0x01010101`` and the low byte of
    ``x | x >> 6 | x >> 12 | x >> 18`` holds their bits at 0, 2, 4, 6."""
    w = np.ascontiguousarray(blocks[:, qh_off : qh_off + 32]).view("<u4")  # (n, 8)
    x = (w[:, None, :] >> np.arange(8, dtype=np.uint32)[None, :, None]) & np.uint32(0x01010101)
    x |= (x >> 6) | (x >> 12) | (x >> 18)
    return x.astype(np.uint8).reshape(blocks.shape[0], 64)


def numpy_q5k_join(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``(n, k/2)`` uint4 and ``(n, k/4)`` uint2 plane bytes → ``(n, k)`` codes ``lo + 16·hi``."""
    n, k = lo.shape[0], 2 * lo.shape[1]
    out = np.empty((n, k), dtype=np.uint8)
    out[:, 0::2], out[:, 1::2] = lo & 15, lo >> 4
    h = np.empty((n, k), dtype=np.uint8)
    for t in range(4):
        h[:, t::4] = (hi >> (2 * t)) & 3
    out |= h << 4
    return out


def q5k_plane(blocks: np.ndarray, qh_off: int) -> np.ndarray:
    """The uint2 high-bit plane of Q5_K blocks (:func:`numpy_q5k_plane`)."""
    if K._lib is None or not K._rows(blocks) or blocks.dtype != np.uint8 or blocks.shape[1] < qh_off + 32:
        return numpy_q5k_plane(blocks, qh_off)
    out = np.empty((blocks.shape[0], 64), dtype=np.uint8)
    if len(blocks):
        K._lib.hk_q5_k_plane(K._at(blocks), blocks.strides[0], len(blocks), qh_off, K._at(out), out.strides[0])
    return out


def q5k_join(lo: np.ndarray, hi: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """``(n, k)`` codes from the two planes (:func:`numpy_q5k_join`; ``k`` a multiple of 4),
    into ``out`` (an ``(n, k)`` uint8 array with contiguous rows) when given."""
    k = 2 * K._width(lo, 2)
    if K._lib is None or k <= 0 or not (K._rows(hi, k // 4) and len(hi) == len(lo)) or \
            (out is not None and not K._target(out, len(lo), k, lo, hi)):
        codes = numpy_q5k_join(lo, hi)
        if out is None:
            return codes
        out[...] = codes
        return out
    out = np.empty((lo.shape[0], k), dtype=np.uint8) if out is None else out
    if len(lo):
        K._lib.hk_q5_k_join(K._at(lo), lo.strides[0], K._at(hi), hi.strides[0], len(lo), k, K._at(out), out.strides[0])
    return out


# ---------------------------------------------------------------------------
# The derived record's factorization, first candidate (gguf_expanded._factor; its numpy twin
# is _factor's own first round, gguf_expanded._first_round)


def factor_first(t: np.ndarray, target: np.ndarray, zero: np.ndarray | None, skip: np.ndarray, v0: float,
                 add: float, mul: float, post: float, rmin: float, rmax: float,
                 zraw: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The compiled first round of :func:`~.gguf_expanded._factor` over the rows not in ``skip``:
    ``(d as float16, raw values (float32), ok)``, only meaningful where ok; None without the
    compiled library (the caller runs the numpy round)."""
    if K._lib is None:
        return None
    n, subs = t.shape
    t, target = np.ascontiguousarray(t, dtype=np.float32), np.ascontiguousarray(target, dtype=np.float32)
    z = None if zero is None else np.ascontiguousarray(zero).view(np.uint8)  # (bool: one byte each)
    sk = np.ascontiguousarray(skip).view(np.uint8)
    d = np.empty(n, dtype=np.uint16)
    raw = np.empty((n, subs), dtype=np.float32)  # (written for every row the kernel does not skip)
    ok = np.zeros(n, dtype=np.uint8)
    if n and subs:
        K._lib.hk_factor_first(K._at(t), K._at(target), None if z is None else K._at(z), n, subs, v0, add, mul, post,
                               rmin, rmax, float(zraw or 0), int(zraw is not None), K._at(sk), K._at(d), K._at(raw),
                               K._at(ok))
    return d.view(np.float16), raw, ok.view(bool)


def factor_rows(target: np.ndarray, zero: np.ndarray, v0: float, add: float, mul: float, post: float, rmin: float,
                rmax: float, zraw: int | None, empty: tuple[float, int]) -> tuple[np.ndarray, np.ndarray] | None:
    """Every row of ``target`` (``(n, subs)`` float32) factored at the first candidate in one
    compiled pass (``hk_factor_rows``; ``t = target / post`` computed there), a row of ``zero``
    sub-blocks only ``empty`` (``d``, raw): ``(d as float16, raw values as int16)``; None
    without the compiled library, for more than 64 sub-blocks, or when a row does not factor
    so (the caller's rounds run)."""
    n, subs = target.shape
    if K._lib is None or not 0 < subs <= 64 or not n:
        return None
    target = np.ascontiguousarray(target, dtype=np.float32)
    z = np.ascontiguousarray(zero).view(np.uint8)  # (bool: one byte each)
    d = np.empty(n, dtype=np.uint16)
    raw = np.empty((n, subs), dtype=np.int16)
    stop = K._lib.hk_factor_rows(K._at(target), K._at(z), n, subs, v0, add, mul, post, rmin, rmax, float(zraw or 0),
                                 int(zraw is not None), int(np.float16(empty[0]).view(np.uint16)), int(empty[1]),
                                 K._at(d), K._at(raw))
    return (d.view(np.float16), raw) if stop == n else None
