"""Building blocks of the compact exact forms (docs/conversion-rules.md § 11), shared by the
native ``d·q + m`` types (:mod:`.gguf`: Q4_1, Q5_1, Q5_0) and the expanded forms
(:mod:`.gguf_exact`: Q2_K, Q4_K, Q5_K).

* **Broadcast minimum.** An overlay's minimum member holds one value per block. Stored as
  per-block affine of storage uint8 with a *strided layout whose strides are all 0*
  (hurray-spec/layouts/strided.md: a zero stride is a broadcast dimension, data is not
  replicated, a conforming reader must support it), its code buffer is ONE byte, the code
  :data:`BROADCAST_CODE` = 1, and its scale buffer one scale per block as before: per-block
  affine takes the block index from the logical position, so every element of block ``b``
  is ``scale_b · 1``.  uint8 rather than a sub-byte storage: the spec prefers contiguous
  layouts for sub-byte data, and one byte is the whole buffer either way.
* **Flipped blocks.** A broadcast scale cannot be ±0 (Hurray forbids zero scales), so a block
  whose minimum is ±0 is written *flipped*: base codes ``qmax − q`` with scale ``−s`` and the
  broadcast scale ``qmax·s``.  For ``s > 0`` every value is exact and equals ggml's
  ``s·q + (±0)`` bit for bit: ``−s·(qmax − q)`` and ``qmax·s`` are exact (a float16 or a
  float32 product of a few significant bits times a small integer), their sum ``s·q`` is
  representable, so the IEEE addition is exact; at ``q = 0`` it is ``x + (−x) = +0``, which is
  what ggml gives for ``s > 0`` whatever the sign of the zero minimum (``+0 + ±0 = +0``).  For
  ``s < 0`` (or ``s = −0``) ggml's zero at ``q = 0`` can be −0: such a block is not flipped
  and the tensor keeps the per-element minimum of § 3a / § 9.  On packed codes the flip is an
  XOR (``qmax − q = q ^ qmax`` for ``qmax = 2^b − 1``): :func:`flip_codes`.
* **Bit planes.** A 5-bit code ``q = lo + 16·hi`` is stored as a uint4 base member of ``lo``
  (scale ``s``) and a correction member of ``hi`` (uint2, scale ``16·s``; Q5_0's
  ``q − 16`` as int2 ``hi − 1``): an add-overlay evaluates the base, then the corrections in
  emission order (hurray-spec/layouts/composite.md), and ``s·lo + 16s·hi = s·q`` exactly
  (both products exact, the sum representable).  :func:`split_planes` / :func:`join_planes`.
"""

from __future__ import annotations

import numpy as np

from ..core import model as M
from ..core.elements import element_type, pack, unpack
from ..core.model import Descriptor

__all__ = [
    "LO_STORAGE",
    "BROADCAST_STORAGE",
    "BROADCAST_CODE",
    "HI_STORAGE",
    "broadcast_member",
    "broadcast_code",
    "is_broadcast",
    "split_planes",
    "join_planes",
    "flip_mask",
    "flip_codes",
    "flipped",
    "exact_multiple",
    "plane_from_bits",
    "bits_from_plane",
    "bad_plane_rows",
]

#: the storage of a compact form's base: the low 4 bits of the codes
LO_STORAGE = "uint4"
#: the broadcast minimum's storage and its one stored code
BROADCAST_STORAGE = "uint8"
BROADCAST_CODE = 1
#: the high-bit plane's storage (Q5_0: int2 holding ``hi − 1``)
HI_STORAGE = {False: "uint2", True: "int2"}


def broadcast_member(shape: tuple[int, ...], block_size: int, scale_type: str, *,
                     role: int = M.ROLE_CORRECTION) -> Descriptor:
    """The descriptor of a broadcast minimum over the whole tensor ``shape``: per-block affine
    along the last axis, block ``block_size``, scales of ``scale_type`` (one per block), storage
    uint8, strides all 0, a one-byte code buffer; an overlay member of ``role``."""
    n = int(np.prod(shape, dtype=np.int64))
    scale = element_type(scale_type)
    return Descriptor(
        element_type=element_type(BROADCAST_STORAGE),
        shape=shape,
        buffers=(M.BufferHandle.cpu(1), M.BufferHandle.cpu(n // block_size * scale.bits // 8)),
        layout=M.Strided((0,) * len(shape)),
        quantization=M.PerBlockAffine(axis=len(shape) - 1, block_size=block_size, scale_buffer_index=1,
                                      scale_type=scale),
        shard=M.Shard(parent_shape=shape, offset=(0,) * len(shape)),
        composite_member=M.CompositeMember(role),
    )


def broadcast_code() -> np.ndarray:
    """The broadcast member's code buffer: one byte, :data:`BROADCAST_CODE`."""
    return np.array([BROADCAST_CODE], dtype=np.uint8)


def is_broadcast(desc: Descriptor) -> bool:
    """Is ``desc`` laid out as :func:`broadcast_member` writes it (storage uint8, strides all 0,
    symmetric per-block affine along the last axis, no byte offset)?  The scale type, block
    size and coverage are the caller's to check; the stored code is checked by the reader of
    its buffer (it must be :data:`BROADCAST_CODE`)."""
    lay, q = desc.layout, desc.quantization
    return (desc.element_type.name == BROADCAST_STORAGE and isinstance(lay, M.Strided)
            and not any(lay.strides) and isinstance(q, M.PerBlockAffine) and q.zero_point_buffer_index is None
            and q.axis == len(desc.shape) - 1 and desc.byte_offset == 0)


def split_planes(codes: np.ndarray, *, signed_hi: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """5-bit codes (uint8, ``0..31``, element order) → ``(lo, hi)``: the uint4 bytes of
    ``q & 15`` and the :data:`HI_STORAGE` bytes of ``q >> 4`` (``signed_hi``: int2 ``(q >> 4) − 1``)."""
    q = np.asarray(codes, dtype=np.uint8).reshape(-1)
    hi = q >> 4
    if signed_hi:
        hi = (hi.astype(np.int8) - 1).astype(np.int8)
    return pack(q & 15, "uint4"), pack(hi, HI_STORAGE[signed_hi])


def join_planes(lo: np.ndarray, hi: np.ndarray, count: int, *, signed_hi: bool = False) -> np.ndarray:
    """The inverse of :func:`split_planes`: ``count`` uint8 codes ``lo + 16·hi``.  A plane too
    short for ``count`` codes is the caller's error to report (``unpack`` raises)."""
    lo_codes = unpack(lo, "uint4", count).astype(np.uint8)
    hi_codes = unpack(hi, HI_STORAGE[signed_hi], count).astype(np.uint8)  # int2 0b11 (−1) → 3
    if signed_hi:
        hi_codes = (hi_codes + 1) & 3  # hi − 1 ∈ {−1, 0} → hi ∈ {0, 1}; 1 and −2 give 2 and 3 (not a plane code)
    return lo_codes | (hi_codes << 4)


def flip_mask(s: np.ndarray, minimum_is_zero: np.ndarray) -> np.ndarray:
    """Which blocks are written flipped: the minimum is ±0 and the (possibly stand-in) base
    scale ``s`` is > 0 (module docstring; for ``s ≤ 0`` the block cannot be flipped)."""
    return minimum_is_zero & (s > 0)


def flip_codes(packed: np.ndarray, which: np.ndarray, xor: int) -> None:
    """Flip, in place, the codes of the blocks ``which`` (a mask, or block indices: few blocks
    are flipped) of ``packed`` (``(blocks, bytes)`` uint8, each block's codes in whole bytes):
    ``byte ^ xor`` (0xFF for uint4/uint2 codes ``qmax − q``; 0x55 for a uint2 plane of bits
    ``1 − hi``; 0x1F for uint8 5-bit codes)."""
    if which.size and (which.dtype != bool or which.any()):
        packed[which] ^= np.uint8(xor)


def flipped(base_scale: np.ndarray, broadcast_scale: np.ndarray, qmax: int) -> np.ndarray:
    """Which blocks of a broadcast form were written flipped: base scale ``b < 0`` and the
    broadcast scale ``qmax·(−b)`` exactly (in the scales' own type).  The import writes a
    broadcast form only where no unflipped block satisfies this (else the per-element form)."""
    b, v = np.asarray(base_scale), np.asarray(broadcast_scale)
    out = b < 0
    at = np.flatnonzero(out)  # few blocks: the products only there
    with np.errstate(over="ignore"):  # an overflow is inf: no finite broadcast scale equals it
        want = (np.negative(b[at]) * b.dtype.type(qmax)).astype(b.dtype)
    out[at] = v[at].view(_uint(b.dtype)) == want.view(_uint(b.dtype))
    return out


def _uint(dt: np.dtype) -> np.dtype:
    return np.dtype(f"<u{np.dtype(dt).itemsize}")


def exact_multiple(s: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``k·s`` in the scales' own type (float16) and where it is exact: finite and equal, as
    float32, to the exact product (``16·s`` is exact unless it overflows, ``|s| ≥ 4096``;
    ``qmax·s`` of a flip needs ``s``'s significand times ``qmax`` to fit in 11 bits)."""
    s = np.asarray(s)
    if s.dtype == np.float16 and k & (k - 1) == 0:
        return _times_power_of_two(s, k.bit_length() - 1)
    wide = s.astype(np.float32) * np.float32(k)  # exact: ≤ 11 + 5 significant bits
    with np.errstate(over="ignore"):  # an overflow is inf: not exact
        v = wide.astype(s.dtype)
    return v, np.isfinite(v) & (v.astype(np.float32) == wide)


def _times_power_of_two(s: np.ndarray, e: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`exact_multiple` for ``k = 2^e`` on float16: a normal ``s`` gets ``e`` added to its
    exponent field (exact unless the exponent overflows: then ±inf, not exact); the few others
    (subnormal, zero, not finite) are multiplied."""
    u = s.view(np.uint16)
    mag = u & np.uint16(0x7FFF)
    normal = (mag >= 0x0400) & (mag < 0x7C00)
    over = normal & (mag >= np.uint16((31 - e) << 10))
    v = (u + np.uint16(e << 10)).view(np.float16)
    v[over] = np.copysign(np.float16(np.inf), s[over])
    ok = normal & ~over
    rest = np.flatnonzero(~normal)
    if rest.size:
        wide = s[rest].astype(np.float32) * np.float32(1 << e)
        with np.errstate(over="ignore", invalid="ignore"):
            vr = wide.astype(np.float16)
        v[rest] = vr
        ok[rest] = np.isfinite(vr) & (vr.astype(np.float32) == wide)
    return v, ok


def _spread() -> np.ndarray:
    """Byte → the two crumb bytes (as one little-endian uint16) of its 8 bits: bit ``i`` in
    crumb ``i`` (bits ``2i``, ``2i + 1``) with the value of the bit."""
    b = np.arange(256, dtype=np.uint16)
    return sum((((b >> i) & 1) << (2 * i)) for i in range(8)).astype("<u2")


_SPREAD = _spread()
#: plane byte (4 crumbs) → its 4 bits; and which plane bytes hold only the codes of hi ∈ {0, 1}
_GATHER = {False: np.zeros(256, np.uint8), True: np.zeros(256, np.uint8)}
_VALID = {False: np.zeros(256, bool), True: np.zeros(256, bool)}
for _n in range(16):
    _GATHER[False][_SPREAD[_n]] = _n
    _VALID[False][_SPREAD[_n]] = True
    _GATHER[True][3 * _SPREAD[_n ^ 15]] = _n
    _VALID[True][3 * _SPREAD[_n ^ 15]] = True


def plane_from_bits(qh: np.ndarray, *, signed_hi: bool = False) -> np.ndarray:
    """GGML's 5th bits (``(n, K/8)`` bytes, bit ``j`` of the little-endian bit string is
    element ``j``'s) → the high-bit plane ``(n, K/4)`` bytes of :data:`HI_STORAGE`: crumb ``j``
    is ``hi`` (uint2) or ``hi − 1`` (int2: 0b11 for hi = 0, 0b00 for hi = 1)."""
    bits = np.asarray(qh, dtype=np.uint8)
    crumbs = _SPREAD[bits ^ np.uint8(0xFF)] * np.uint16(3) if signed_hi else _SPREAD[bits]
    return crumbs.astype("<u2").view(np.uint8).reshape(bits.shape[0], -1)


def bad_plane_rows(plane: np.ndarray, *, signed_hi: bool = False) -> np.ndarray:
    """Per row of a high-bit plane ``(n, K/4)``: does it hold a crumb that is no plane code
    (uint2 2 or 3; int2 1 or −2)?"""
    p = np.asarray(plane, dtype=np.uint8)
    if p.ndim == 2 and p.shape[1] % 8 == 0 and p.flags.c_contiguous:  # 32 crumbs at a time
        x = p.view("<u8")
        odd = (x ^ (x >> np.uint64(1))) & np.uint64(0x5555555555555555) if signed_hi else x & np.uint64(0xAAAAAAAAAAAAAAAA)
        return odd.any(axis=1)
    return ~np.all(_VALID[signed_hi][p], axis=1)


def bits_from_plane(plane: np.ndarray, *, signed_hi: bool = False) -> np.ndarray:
    """The inverse of :func:`plane_from_bits` (rows :func:`bad_plane_rows` flags are the
    caller's to refuse first): ``(n, K/4)`` plane bytes → ``(n, K/8)`` bytes of 5th bits."""
    g = _GATHER[signed_hi][np.asarray(plane, dtype=np.uint8)]
    return (g[:, 0::2] | (g[:, 1::2] << 4)).astype(np.uint8)
