"""Moving codes and scales between GGML blocks and Hurray buffers, vectorised.

Nothing here decodes a value: codes and scale bits are moved (contract § 1.2).
Every function works on a chunk of whole blocks, ``blocks`` being a
``(n_blocks, block_bytes)`` uint8 array (usually a strided view of the
memory-mapped GGUF), so callers can stream tensors of any size.

Nibble orders (contract § 2): GGML puts element ``j`` in the low nibble and
element ``j+16`` in the high nibble of byte ``j`` of a 32-element block; Hurray
packs element ``2k`` low and ``2k+1`` high in byte ``k``.  Viewing each pair of
GGML bytes ``(a, b) = (qs[2i], qs[2i+1])`` as one little-endian uint16 ``v``,
Hurray's byte ``i`` (elements 2i, 2i+1) is ``(a & 15) | (b & 15) << 4`` and
byte ``8+i`` (elements 16+2i, 17+2i) is ``a >> 4 | (b & 0xF0)``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "split_to_pairs",
    "pairs_to_split",
    "q5_codes",
    "q5_pack",
    "field_f16",
    "field_u8",
]


def split_to_pairs(qs: np.ndarray) -> np.ndarray:
    """``(n, 16)`` GGML split-half nibbles → ``(n, 16)`` Hurray LSB-first pairs."""
    v = np.ascontiguousarray(qs).view("<u2")  # (n, 8): a | b << 8
    out = np.empty((qs.shape[0], 16), dtype=np.uint8)
    out[:, :8] = (v & 0x000F) | ((v >> 4) & 0x00F0)
    out[:, 8:] = ((v >> 4) & 0x000F) | ((v >> 8) & 0x00F0)
    return out


def pairs_to_split(h: np.ndarray) -> np.ndarray:
    """Inverse of :func:`split_to_pairs`."""
    h = np.ascontiguousarray(h)
    a, b = h[:, :8], h[:, 8:]
    out = np.empty((h.shape[0], 16), dtype=np.uint8)
    out[:, 0::2] = (a & 0x0F) | (b << 4)
    out[:, 1::2] = (a >> 4) | (b & 0xF0)
    return out


def q5_codes(qs: np.ndarray, qh: np.ndarray) -> np.ndarray:
    """GGML Q5 block parts → ``(n, 32)`` codes 0..31 in element order."""
    high = np.ascontiguousarray(qh).view("<u4")  # (n, 1)
    bits = ((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # (n, 32)
    out = np.empty((qs.shape[0], 32), dtype=np.uint8)
    out[:, :16] = qs & 0x0F
    out[:, 16:] = qs >> 4
    out |= bits << 4
    return out


def q5_pack(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(n, 32)`` codes 0..31 → GGML ``(qs (n, 16), qh (n, 4))``."""
    c = codes.astype(np.uint8, copy=False)
    qs = (c[:, :16] & 0x0F) | ((c[:, 16:] & 0x0F) << 4)
    hb = ((c >> 4) & 1).astype(np.uint32)
    qh = (hb << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    return qs, qh.astype("<u4").reshape(-1, 1).view(np.uint8)


def field_f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The float16 field at ``offset`` of every block, as a contiguous ``<f2`` array."""
    return np.ascontiguousarray(blocks[:, offset : offset + 2]).view("<f2").reshape(-1)


def field_u8(blocks: np.ndarray, offset: int, size: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, offset : offset + size])
