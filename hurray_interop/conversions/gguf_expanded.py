"""The exact expanded Hurray forms of the two-level GGML types (docs/conversion-rules.md § 9).

K-quants, IQ4, the ternary types, NVFP4 and the IQ2/IQ3/IQ1 lattice types store a super-block
scale ``d`` times small sub-block scales. Hurray's per-block affine cannot say "two levels",
but every product ggml forms while dequantizing (``d·sc``, ``dmin·m``, ``d·(s6 − 32)``,
``d·(0.5 + s)·0.25``, …) is exact in float32, so
each type has a single-level form whose float32 values equal gguf-py's ``dequantize`` bit for
bit (docs/conversion-rules.md § 9, "Measured forms"; the form of each type is the data table
``mappings/gguf_expanded.toml``):

* **Q3_K, Q6_K, IQ4_XS** -- per-block affine SYMMETRIC, codes int4 ``q ∈ −4..3`` (Q3_K),
  int8 ``q − 32`` (Q6_K) or the int8 IQ4_NL codebook value (IQ4_XS); K = 16/16/32; float32
  scales ``float32(d)·float32(sc')`` with ``sc' = s6 − 32`` / int8 ``sc`` / ``ls − 32``.
* **Q2_K, Q4_K, Q5_K** -- the add-overlay of docs/conversion-rules.md § 3a: base codes uint2
  / uint4 / uint8 (``q``), K = 16/32/32, float32 scale ``d·sc``; correction member storage
  uint2, every code 1, float32 scale ``−(dmin·m)``. ``d·sc·q + (−dmin·m)`` is the IEEE
  operation ggml performs (``a − b ≡ a + (−b)``). A correction that is ±0 is written as
  codes 0 with scale ±1 (the sign of the scale carries the sign of the zero, § 3a).
* **IQ4_NL** -- int8 codebook values, K = 32, float16 scale ``d`` (single level).
* **TQ1_0, TQ2_0** -- storage uint2 codes ``q``, int32 zero point 1, K = 256, float16 ``d``
  (not int2 with −d: that turns +0 weights into −0).
* **NVFP4** -- int8 codes = E2M1 value × 2 (−12..12), K = 16, float16 scale = UE4M3 × ½
  (exact in f16; bytes 0x00 and 0x7F decode to 0).
* **IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S** -- int8 codes = ± the grid value of ggml's
  lattice (the grid row of each 8 or 4 elements, the sign from the 7-bit ksigns index or an
  explicit bit), K = 32/16/16/32/32, float32 scale = the sub-block product, e.g.
  ``d·(0.5 + s)·0.25``. Grid rows are unique and ksigns is a bijection onto the even-parity
  sign bytes, so the codes give the indices back.
* **IQ1_S, IQ1_M** -- int8 codes ``8·g ± 1`` (grid value ``g ∈ −1..1`` with the ±1/8 delta
  folded in), K = 32/16, float32 scale ``d·(2s + 1)/8`` (exact: a power-of-two step).
  (§ 9's smaller IQ1_S overlay, int2 + uint2 at 6 bpw, is not implemented.)

**Zero scales** (docs/conversion-rules.md §§ 4, 9). Hurray forbids a zero scale. A sub-block
whose scale ``s0`` is ±0 decodes in ggml to zeros of sign ``sign(s0) ⊕ (code < 0)``. Its codes
become the zero point (value 0) and its scale ±1, the sign chosen so that the zeros come out
right. Where the signs are mixed one scale cannot do it: the scale is −1 and a *zero patch*
(``Expanded.zero_patch``: a K-element float32 ±0 pattern, an overlay correction over that
sub-block) is added, since ``(−0) + (+0) = +0`` and ``(−0) + (−0) = −0``.

**The restore record** (docs/conversion-rules.md § 9). ``d·sc`` does not factor back into
``d`` and ``sc``, and zero-scale sub-blocks lose their codes, so :class:`Record` keeps the raw
super-block header bytes of every block (d, dmin, packed sub-block scales; ``record_bytes``
per block in the table) and, verbatim, every *exception block*: a block that packing its
codes and header back would not reproduce (zero-scale sub-blocks with stale codes, NVFP4's
−0 code 8, TQ1_0 bytes that are not ggml's canonical base-3 encoding). Zero-scale sub-blocks
are packed with the code ggml's quantizer writes into all-zero blocks (``_Spec.zero_code``),
so ggml's all-zero rows need no exception block. :func:`rebuild` packs
the codes with the header, puts the exception blocks back, and proves consistency by
expanding the result again: codes, scales (as bits), corrections and zero patches must all
equal the ones given, else a :class:`~hurray_interop.errors.FormatError` names the block.
Where packing valid codes with a header decodes back to them (:func:`_reversible`: Q2_K..Q6_K,
TQ2_0), only the codes of the exception blocks and of the blocks with a zero-scale sub-block
are decoded and compared: elsewhere they are the given codes by construction.

Speed: the scales of the K-quants and IQ4_XS are computed in one compiled pass
(:func:`~.gguf_kernels.dsc_scales`, which also flags the blocks with a zero scale),
Q6_K's codes are moved by :func:`~.gguf_kernels.q6k_codes` /
:func:`~.gguf_kernels.q6k_pack`, and Q4_K's by the split-half nibble movers (both
ways: :func:`rebuild` takes the stored uint4 bytes, ``packed``); numpy twins give the same bytes.

Non-finite ``d``/``dmin`` are refused (:class:`NonFiniteScale`, naming the block).

All functions work on chunks of whole GGML blocks, a ``(n_blocks, block_bytes)`` uint8 array;
``first_block`` (the chunk's first block index in its tensor) only locates errors and the
record's exception indices.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import kernels as K
from . import gguf_kernels as GK
from ..core.elements import element_type, pack, unpack
from ..errors import ConversionRefused, FormatError
from ..tables import load_table

__all__ = [
    "EXPANDED_TYPES",
    "Form",
    "form",
    "Record",
    "Expanded",
    "NonFiniteScale",
    "expand",
    "expand_scales",
    "expand_packed",
    "rebuild",
    "rebuilds_packed",
]



class NonFiniteScale(ConversionRefused):
    """A super-block scale (``d`` or ``dmin``) is NaN or infinite: not representable
    (docs/conversion-rules.md §§ 4, 9). ``block`` is the block index in the tensor."""

    def __init__(self, message: str, *, block: int, field: str, **kw: object) -> None:
        self.block = block
        super().__init__(message, field=field, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Form:
    """One row of ``mappings/gguf_expanded.toml``: the Hurray form of a GGML type."""

    type: str
    storage: str
    sub_block: int
    scale: str
    zero_point: int | None
    overlay: bool
    ggml_bpw: float
    record_bytes: int
    codes: str

    @property
    def code_dtype(self) -> np.dtype:
        """The numpy dtype holding one code of the storage type (element_types.toml; codes
        of at most 8 bits, one per byte, signed for an ``int`` type)."""
        return np.dtype(np.int8 if element_type(self.storage).kind == "int" else np.uint8)

    @property
    def scale_dtype(self) -> np.dtype:
        """The numpy dtype of one scale (element_types.toml)."""
        return element_type(self.scale).dtype

    @property
    def hurray_bpw(self) -> float:
        """Bits per weight of the Hurray form: codes, scales, zero points, and for an
        overlay the correction's uint2 codes and float32 scales."""
        bits = element_type(self.storage).bits + element_type(self.scale).bits / self.sub_block
        if self.zero_point is not None:
            bits += 32 / self.sub_block
        if self.overlay:
            bits += 2 + 32 / self.sub_block
        return bits

    @property
    def record_bpw(self) -> float:
        """Bits per weight of the record's header part (exception blocks come on top)."""
        return self.record_bytes * 8 / _specs()[self.type].elements

    def describe(self) -> str:
        """E.g. "overlay uint4+uint2, K=32, f32 scales, expanded from Q4_K"."""
        kind = f"overlay {self.storage}+uint2" if self.overlay else self.storage
        zp = f", zero point {self.zero_point}" if self.zero_point is not None else ""
        return f"{kind}, K={self.sub_block}, f{self.scale[5:]} scales{zp}, expanded from {self.type}"


@functools.cache
def _forms() -> dict[str, Form]:
    rows = load_table("gguf_expanded")["types"]
    return {
        name: Form(
            type=name,
            storage=r["storage"],
            sub_block=r["sub_block"],
            scale=r["scale"],
            zero_point=r.get("zero_point"),
            overlay=r["overlay"],
            ggml_bpw=r["ggml_bpw"],
            record_bytes=r["record_bytes"],
            codes=r["codes"],
        )
        for name, r in rows.items()
    }


def form(ggml_type: str) -> Form:
    """The expanded form of ``ggml_type`` (KeyError for a type without one)."""
    return _forms()[ggml_type]


# ---------------------------------------------------------------------------------------
# Bit fields: each item (an element's code, a sub-block's scale) is gathered from a few
# (byte, shift, width, dst) parts of the block. Tables built from ggml's loops.


@dataclass(frozen=True)
class _Part:
    """One part of every item that has it: ``items`` (item indices) and per item the
    ``byte``, ``shift``, ``mask`` and ``dst``. Unpacking keeps item order (``full``: every
    item, so no scatter); packing sorts by byte, ``dest`` being the distinct bytes and
    ``starts`` where each byte's run of items begins, or ``run`` its length when all runs
    are equally long (OR-ing ``run`` strided slices is ~50× faster than ``reduceat``)."""

    items: np.ndarray
    byte: np.ndarray
    shift: np.ndarray
    mask: np.ndarray
    dst: np.ndarray
    full: bool = False
    dest: np.ndarray | slice | None = None  # a slice when the bytes are evenly spaced
    starts: np.ndarray | None = None
    run: int = 1


@dataclass(frozen=True)
class _Bits:
    n_items: int
    dtype: type  # uint8 when every field fits in 8 bits
    unpack: tuple[_Part, ...]
    pack: tuple[_Part, ...]
    #: the same fields as a few slice-to-slice moves, when they allow it (the K-quants: runs
    #: of 16..64 consecutive items in consecutive bytes): ``(item, byte, length, shift,
    #: mask, dst)`` each; else None (gathers by ``unpack``/``pack``)
    runs: tuple[tuple[int, int, int, int, int, int], ...] | None = None


#: at most this many runs make the slice moves cheaper than one gather
_MAX_RUNS = 48


def _runs(rows: list[list[tuple[int, int, int, int]]]) -> tuple[tuple[int, int, int, int, int, int], ...] | None:
    """The fields of ``rows`` (per item: ``(byte, shift, bits, dst)`` parts) as runs of
    consecutive items in consecutive bytes with one shift, mask and dst, or None."""
    flat = sorted((shift, bits, dst, i, byte) for i, r in enumerate(rows) for byte, shift, bits, dst in r)
    runs: list[list[int]] = []
    for shift, bits, dst, i, byte in flat:
        last = runs[-1] if runs else None
        if last and (last[3], last[4], last[5]) == (shift, (1 << bits) - 1, dst) and \
                (last[0] + last[2], last[1] + last[2]) == (i, byte):
            last[2] += 1
        else:
            runs.append([i, byte, 1, shift, (1 << bits) - 1, dst])
    return tuple(tuple(r) for r in runs) if len(runs) <= _MAX_RUNS else None  # type: ignore[misc]


def _bits(n_items: int, parts: Callable[[int], list[tuple[int, int, int, int]]]) -> _Bits:
    rows = [parts(i) for i in range(n_items)]
    widest = max(dst + bits for r in rows for _, _, bits, dst in r)
    dtype = np.uint8 if widest <= 8 else np.uint16
    unpack, pack = [], []
    for p in range(max(len(r) for r in rows)):
        t = np.array([(i, *r[p]) for i, r in enumerate(rows) if len(r) > p], dtype=np.int64)
        items, byte, shift, bits, dst = t.T
        fields = [a.astype(dtype) for a in (shift, (1 << bits) - 1, dst)]
        unpack.append(_Part(items, byte, *fields, full=len(items) == n_items))
        o = np.argsort(byte, kind="stable")
        first = np.r_[True, np.diff(byte[o]) != 0]
        starts = np.flatnonzero(first)
        lengths = np.diff(np.r_[starts, len(o)])
        run = int(lengths[0]) if np.all(lengths == lengths[0]) else 0
        dest = byte[o][first]
        step = int(dest[1] - dest[0]) if len(dest) > 1 else 1
        if step > 0 and np.array_equal(dest, dest[0] + step * np.arange(len(dest))):
            dest = slice(int(dest[0]), int(dest[-1]) + 1, step)
        pack.append(_Part(items[o], byte[o], *(f[o] for f in fields), dest=dest, starts=starts, run=run))
    return _Bits(n_items, dtype, tuple(unpack), tuple(pack), _runs(rows))


def _unpack(blocks: np.ndarray, b: _Bits) -> np.ndarray:
    """``(n, items)`` values (uint8 or uint16) of the fields ``b`` in every block."""
    if b.runs is not None:
        return K.unpack_runs(blocks, b.runs, b.n_items, b.dtype)
    out = None
    for p in b.unpack:
        v = np.take(blocks, p.byte, axis=1).astype(b.dtype, copy=False)
        v >>= p.shift
        v &= p.mask
        v <<= p.dst
        if out is None and p.full:
            out = v
        elif p.full:
            out |= v
        else:
            if out is None:
                out = np.zeros((blocks.shape[0], b.n_items), dtype=b.dtype)
            out[:, p.items] |= v
    assert out is not None
    return out


def _pack(values: np.ndarray, b: _Bits, out: np.ndarray) -> None:
    """OR the items ``values`` (``(n, items)``) into ``out`` (``(n, block_bytes)``, uint8)."""
    v = values.astype(b.dtype, copy=False)
    if b.runs is not None:
        K.pack_runs(v, b.runs, out)
        return
    for p in b.pack:
        x = np.take(v, p.items, axis=1)
        x >>= p.dst
        x &= p.mask
        x <<= p.shift
        if p.run == 0:
            x = np.bitwise_or.reduceat(x, p.starts, axis=1)
        elif p.run > 1:
            x = functools.reduce(np.bitwise_or, (x[:, k :: p.run] for k in range(p.run)))
        out[:, p.dest] |= x.astype(np.uint8, copy=False)


# Element -> code bits, one builder per layout (docs/conversion-rules.md § 9; docs/format-notes.md § 1.4).
def _q2k(e: int) -> list[tuple[int, int, int, int]]:  # qs[16:80]: 2 bits, shift 2j
    return [(16 + 32 * (e // 128) + e % 32, 2 * ((e % 128) // 32), 2, 0)]


def _q3k(e: int) -> list[tuple[int, int, int, int]]:  # qs[32:96] 2 bits + hmask[0:32] bit → bit 2
    return [(32 + 32 * (e // 128) + e % 32, 2 * ((e % 128) // 32), 2, 0), (e % 32, e // 32, 1, 2)]


def _q45k(qs: int, e: int) -> tuple[int, int, int, int]:  # nibble of qs[qs + 32c + l], high for odd 32-run
    return (qs + 32 * (e // 64) + e % 32, 4 * ((e % 64) // 32), 4, 0)


def _q5k(e: int) -> list[tuple[int, int, int, int]]:  # + qh[16:48] bit (e // 32) → bit 4
    return [_q45k(48, e), (16 + e % 32, e // 32, 1, 4)]


def _q6k(e: int) -> list[tuple[int, int, int, int]]:  # ql[0:128] nibble + qh[128:192] 2 bits → bits 4-5
    h, r = divmod(e, 128)
    return [(64 * h + r % 64, 4 * (r // 64), 4, 0), (128 + 32 * h + r % 32, 2 * (r // 32), 2, 4)]


def _nibbles(qs: int, run: int) -> Callable[[int], list[tuple[int, int, int, int]]]:
    """Runs of ``2·run`` elements: element j low nibble, j + run high nibble of byte j."""
    return lambda e: [(qs + run * (e // (2 * run)) + e % run, 4 * ((e % (2 * run)) // run), 4, 0)]


def _tq2(e: int) -> list[tuple[int, int, int, int]]:  # qs[0:64]: 2 bits, shift 2l
    return [(32 * (e // 128) + e % 32, 2 * ((e % 128) // 32), 2, 0)]


# Sub-block scale fields of the header.
def _q3k_scale(i: int) -> list[tuple[int, int, int, int]]:  # 4 low bits + 2 high bits
    return [(96 + i % 8, 4 * (i // 8), 4, 0), (104 + i % 4, 2 * (i // 4), 2, 4)]


def _q4k_sc(i: int) -> list[tuple[int, int, int, int]]:  # get_scale_min_k4, scales at 4..15
    return [(4 + i, 0, 6, 0)] if i < 4 else [(4 + i + 4, 0, 4, 0), (4 + i - 4, 6, 2, 4)]


def _q4k_m(i: int) -> list[tuple[int, int, int, int]]:
    return [(4 + i + 4, 0, 6, 0)] if i < 4 else [(4 + i + 4, 4, 4, 0), (4 + i, 6, 2, 4)]


def _iq4xs_scale(i: int) -> list[tuple[int, int, int, int]]:  # scales_l[4:8] nibble + scales_h[2:4] 2 bits
    return [(4 + i // 2, 4 * (i % 2), 4, 0), (2 + (2 * i) // 8, (2 * i) % 8, 2, 4)]


def _byte(offset: int, width: int = 8) -> Callable[[int], list[tuple[int, int, int, int]]]:
    return lambda i: [(offset + i, 0, width, 0)]


_IQ4NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
_FP4X2_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


# ---------------------------------------------------------------------------------------
# TQ1_0: five (four) base-3 digits per byte, most significant first (docs/format-notes.md § 1.7).

_TQ1_POW = np.array([1, 3, 9, 27, 81], dtype=np.uint8)
_TQ1_WEIGHT5 = np.array([81, 27, 9, 3, 1], dtype=np.uint16)
_TQ1_WEIGHT4 = np.array([81, 27, 9, 3], dtype=np.uint16)


def _tq1_unpack(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    parts = (
        (blocks[:, 0:32, None] * _TQ1_POW[None, None, :]).transpose(0, 2, 1).reshape(n, 160),
        (blocks[:, 32:48, None] * _TQ1_POW[None, None, :]).transpose(0, 2, 1).reshape(n, 80),
        (blocks[:, 48:52, None] * _TQ1_POW[None, None, :4]).transpose(0, 2, 1).reshape(n, 16),
    )
    return (np.concatenate(parts, axis=1).astype(np.uint16) * 3) >> 8


def _tq1_pack(trits: np.ndarray, out: np.ndarray) -> None:
    n = trits.shape[0]
    t = trits.astype(np.uint16)
    v0 = (t[:, :160].reshape(n, 5, 32) * _TQ1_WEIGHT5[None, :, None]).sum(axis=1)
    v1 = (t[:, 160:240].reshape(n, 5, 16) * _TQ1_WEIGHT5[None, :, None]).sum(axis=1)
    vh = (t[:, 240:].reshape(n, 4, 4) * _TQ1_WEIGHT4[None, :, None]).sum(axis=1)
    v = np.concatenate([v0, v1, vh], axis=1)
    out[:, :52] |= ((v * 256 + 242) // 243).astype(np.uint8)


def _span(byte: int, bit: int, width: int, dst: int = 0) -> list[tuple[int, int, int, int]]:
    """The parts of a ``width``-bit field starting at bit ``bit`` of the little-endian
    integer at ``byte`` (it may cross bytes)."""
    parts = []
    while width:
        b, s = byte + bit // 8, bit % 8
        w = min(width, 8 - s)
        parts.append((b, s, w, dst))
        bit, width, dst = bit + w, width - w, dst + w
    return parts


# ---------------------------------------------------------------------------------------
# Codecs: GGML block bits <-> one Hurray code per element.


@dataclass(frozen=True)
class _Codec:
    decode: Callable[[np.ndarray], np.ndarray]  # blocks -> (n, elements) Hurray codes
    encode: Callable[[np.ndarray, np.ndarray], np.ndarray | None]  # (codes, zeroed blocks to OR into) -> valid (None: all)
    #: bijective codecs (every raw field value is one code, and back): the bits of each
    #: block byte the codes occupy (a bytes object), else None
    coverage: bytes | None = None


def _lut_codec(values: tuple[int, ...], dtype: type, zp: int, unpack: Callable, pack: Callable) -> _Codec:
    """Codes that are a table lookup of a raw per-element field (``values[raw]``). A code
    no raw value gives is invalid, except the zero point (substituted in zero-scale
    sub-blocks), packed as raw 0."""
    vals = np.array(values, dtype=np.int16).astype(dtype)
    inverse = np.full(256, -1, dtype=np.int16)
    for raw in reversed(range(len(vals))):  # the smallest raw value wins
        inverse[int(vals[raw : raw + 1].view(np.uint8)[0])] = raw
    packable = np.maximum(inverse, 0).astype(np.uint8)
    valid = (inverse >= 0) | (np.arange(256) == (zp & 0xFF))
    shift = int(vals.astype(np.int16)[0])
    offset = np.array_equal(vals.astype(np.int16), shift + np.arange(len(vals)))  # code = raw + shift
    span = np.sort(np.arange(256, dtype=np.uint8).view(dtype)[valid]).astype(np.int16)  # the valid codes
    lo, hi = (int(span[0]), int(span[-1])) if len(span) == int(span[-1]) - int(span[0]) + 1 else (None, None)

    def encode(codes: np.ndarray, out: np.ndarray) -> np.ndarray:
        u = codes.view(np.uint8)
        # (an invalid code packs as garbage bits: ``valid`` says so, and the fields are masked)
        pack((u - np.uint8(shift & 0xFF) if shift else u) if offset else np.take(packable, u), out)
        c = codes.view(dtype)
        if lo is not None and (c.size == 0 or (int(c.min()) >= lo and int(c.max()) <= hi)):
            return None  # every code valid: two reductions are cheaper
        return np.take(valid, u)

    if offset:  # no lookup
        def decode(blocks: np.ndarray) -> np.ndarray:
            raw = unpack(blocks).astype(np.uint8, copy=False)
            if shift:
                raw += np.uint8(shift & 0xFF)  # modulo 256: two's complement of raw + shift
            return raw.view(dtype)

        return _Codec(decode, encode)
    return _Codec(lambda blocks: vals[unpack(blocks)], encode)


def _bit_lut(n: int, parts: Callable, values: tuple[int, ...], dtype: type, zp: int = 0) -> _Codec:
    b = _bits(n, parts)
    c = _lut_codec(values, dtype, zp, lambda blocks: _unpack(blocks, b), lambda raw, out: _pack(raw, b, out))
    return dataclasses.replace(c, coverage=_coverage(b, len(set(values))))


def _split_pairs_codec(n: int, offset: int, groups: int, width: int) -> _Codec:
    """Codes 0..15 that are ``groups`` runs of GGML split-half nibbles (:func:`_split_pairs`):
    element j of a group is the low nibble of its byte j, element j + ``width`` the high
    nibble -- two bit-field runs per group, moved by the kernels' run movers (C when built)."""
    def field(e: int) -> list[tuple[int, int, int, int]]:
        g, r = divmod(e, 2 * width)
        return [(offset + g * width + r % width, 4 * (r // width), 4, 0)]

    return _bit_lut(n, field, _r(0, 16), _U8)


def _q6k_codec() -> _Codec:
    """Q6_K's int8 codes ``q − 32`` through the kernels' Q6_K movers (one pass over ql and qh;
    the fields of :func:`_q6k`, which give the coverage)."""
    def encode(codes: np.ndarray, out: np.ndarray) -> np.ndarray | None:
        if GK.q6k_pack(codes, out) == 0:
            return None  # every code valid
        c = codes.view(np.int8)
        return (c >= -32) & (c <= 31)

    coverage = _bit_lut(256, _q6k, _r(-32, 32), _I8).coverage
    return _Codec(GK.q6k_codes, encode, coverage)


def _coverage(b: _Bits, n_values: int) -> bytes | None:
    """The bits per block byte of the fields ``b`` when each item is a field of ``w`` bits and
    the code table has ``2**w`` distinct values (a bijection), else None."""
    cov = np.zeros(1 + max(int(p.byte.max()) for p in b.unpack), dtype=np.int64)
    width = np.zeros(b.n_items, dtype=np.int64)
    for p in b.unpack:
        m = p.mask.astype(np.int64)
        np.bitwise_or.at(cov, p.byte, (m << p.shift.astype(np.int64)) & 0xFF)
        np.add.at(width, p.items, [bin(int(x)).count("1") for x in m])
    return cov.astype(np.uint8).tobytes() if np.all(width == width[0]) and 1 << int(width[0]) == n_values else None


#: ggml's ksigns_iq2xs: 7-bit index -> 8 sign bits of even parity (bit 7 = parity of the rest)
_KSIGNS = np.array([i | (bin(i).count("1") & 1) << 7 for i in range(128)], dtype=np.uint8)


@dataclass(frozen=True)
class _Grid:
    """An IQ layout: each ``group`` of elements is one row of gguf-py's grid of ``quant``
    (indexed by ``index``), with signs either from ksigns (``sign`` a 7-bit index per 8
    elements), explicit (``sign`` one bit per element), or — IQ1 — a ±1/8 delta folded into
    the code ``8·g ± 1`` (``sign`` one bit per ``delta`` elements, set: −)."""

    quant: str
    group: int
    index: _Bits
    signs: str  # "ksigns" | "bits" | "delta"
    sign: _Bits
    delta: int = 0


@functools.cache
def _grid_rows(quant: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(grid (rows, group) int16, sorted row keys, row of each sorted key)``."""
    import gguf.quants as gq  # the grids as gguf-py (the oracle's source: ggml's tables) holds them

    cls = getattr(gq, quant)
    cls.init_grid()
    grid = np.asarray(cls.grid).reshape(cls.grid_shape).astype(np.int16)
    keys = _row_keys(grid[None])[0]
    order = np.argsort(keys, kind="stable")
    assert len(np.unique(keys)) == len(keys), quant  # grid rows are unique (§ 9)
    return grid, keys[order], order


def _row_keys(rows: np.ndarray) -> np.ndarray:
    """``(..., group)`` small ints -> one uint64 key per row (its bytes, little-endian)."""
    b = np.ascontiguousarray(rows.astype(np.int8))
    return b.view(f"<u{rows.shape[-1]}")[..., 0].astype(np.uint64)


def _grid_decode(g: _Grid, blocks: np.ndarray) -> np.ndarray:
    grid = _grid_rows(g.quant)[0]
    n = blocks.shape[0]
    mags = grid[_unpack(blocks, g.index)].reshape(n, -1)
    if g.signs == "delta":
        delta = np.where(_unpack(blocks, g.sign) != 0, -1, 1).astype(np.int16)
        return (8 * mags + np.repeat(delta, g.delta, axis=1)).astype(np.int8)
    if g.signs == "ksigns":
        neg = np.unpackbits(_KSIGNS[_unpack(blocks, g.sign)][..., None], axis=2, bitorder="little").reshape(n, -1)
    else:
        neg = _unpack(blocks, g.sign) != 0
    return np.where(neg, -mags, mags).astype(np.int8)


def _grid_encode(g: _Grid, codes: np.ndarray, out: np.ndarray) -> np.ndarray:
    grid, keys, order = _grid_rows(g.quant)
    n = codes.shape[0]
    c = codes.astype(np.int16)
    if g.signs == "delta":
        mags = (c + 4) // 8
        step = (c - 8 * mags).reshape(n, -1, g.delta)
        ok = (np.abs(step) == 1).all(axis=2) & (step == step[:, :, :1]).all(axis=2)
        sign = step[:, :, 0] < 0
        ok = np.repeat(ok, g.delta, axis=1)
    else:
        mags, neg = np.abs(c), c < 0
        ok = np.ones(c.shape, dtype=bool)
        if g.signs == "ksigns":
            sign = np.packbits(neg.reshape(n, -1, 8), axis=2, bitorder="little")[:, :, 0]
            ok = np.repeat(_KSIGNS[sign & 0x7F] == sign, 8, axis=1)
            sign &= 0x7F
        else:
            sign = neg
    key = _row_keys(mags.reshape(n, -1, g.group))
    pos = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
    found = keys[pos] == key
    zero = (c.reshape(n, -1, g.group) == 0).all(axis=2)  # substituted: packed as index 0, as ggml writes
    _pack(np.where(found & ~zero, order[pos], 0), g.index, out)
    _pack(sign, g.sign, out)
    return np.repeat(found | zero, g.group, axis=1) & (ok | np.repeat(zero, g.group, axis=1))


def _grid_codec(g: _Grid) -> _Codec:
    return _Codec(functools.partial(_grid_decode, g), functools.partial(_grid_encode, g))


# ---------------------------------------------------------------------------------------
# The per-type table.


@dataclass(frozen=True)
class _Spec:
    type: str  # the GGML type
    header: tuple[tuple[int, int], ...]  # (byte, bit mask) recorded raw: d, dmin, sub-block scales
    codec: _Codec
    scale: str  # "d_sc": (float32(d)·(sc·mul + add))·post | "d": the f16 d | "ue4m3"
    d: _Bits | None = None  # the f16 bits of d
    dmin: _Bits | None = None
    sc: _Bits | None = None
    sc_int8: bool = False
    mul: float = 1.0
    add: float = 0.0
    post: float = 1.0
    m: _Bits | None = None  # overlay types: the minimum's multiplier (correction −dmin·m)
    zero_code: int | None = None  # the code ggml's quantizer leaves in all-zero blocks, packed
    # in zero-scale sub-blocks instead of the zero point (fewer exception blocks)
    #: blocks -> their codes' storage bytes, where the code fields are those bytes moved
    direct: Callable[[np.ndarray], np.ndarray] | None = None
    #: the inverse: (storage bytes, zeroed blocks) -> the code fields written
    undirect: Callable[[np.ndarray, np.ndarray], None] | None = None

    @property
    def elements(self) -> int:
        """Elements per GGML block (mappings/ggml_types.toml)."""
        return load_table("ggml_types")[self.type]["block_elements"]

    @property
    def block_bytes(self) -> int:
        """Bytes per GGML block (mappings/ggml_types.toml)."""
        return load_table("ggml_types")[self.type]["block_bytes"]


def _split_pairs(offset: int, groups: int, width: int) -> Callable[[np.ndarray], np.ndarray]:
    """Codes in ``groups`` runs of ``width`` bytes from ``offset``, each GGML split-half
    nibbles (element j: low nibble of byte j, element j + width: its high nibble), as
    Hurray uint4 bytes (:func:`~hurray_interop.kernels.split_to_pairs`)."""
    def direct(blocks: np.ndarray) -> np.ndarray:
        out = np.empty((blocks.shape[0], groups * width), dtype=np.uint8)
        for g in range(groups):
            a = offset + g * width
            K.split_to_pairs(blocks[:, a : a + width], out=out[:, g * width : (g + 1) * width])
        return out

    return direct


def _split_pairs_back(offset: int, groups: int, width: int) -> Callable[[np.ndarray, np.ndarray], None]:
    """The inverse of :func:`_split_pairs` (:func:`~hurray_interop.kernels.pairs_to_split`)."""
    def undirect(packed: np.ndarray, out: np.ndarray) -> None:
        for g in range(groups):
            a = offset + g * width
            K.pairs_to_split(packed[:, g * width : (g + 1) * width], out=out[:, a : a + width])

    return undirect


def _hdr(*ranges: tuple[int, int], masked: tuple[tuple[int, int], ...] = ()) -> tuple[tuple[int, int], ...]:
    return tuple((b, 0xFF) for a, z in ranges for b in range(a, z)) + masked


def _f16_at(offset: int) -> _Bits:
    return _bits(1, lambda i: _span(offset, 0, 16))


def _grid_type(quant: str, group: int, index: Callable, signs: str, sign: tuple[int, Callable], delta: int = 0) -> _Codec:
    return _grid_codec(_Grid(quant, group, _bits(256 // group, index), signs, _bits(*sign), delta))


_I8, _U8 = np.int8, np.uint8


def _r(a: int, b: int) -> tuple[int, ...]:
    return tuple(range(a, b))


@functools.cache
def _specs() -> dict[str, _Spec]:
    q45 = dict(d=_f16_at(0), dmin=_f16_at(2), sc=_bits(8, _q4k_sc), m=_bits(8, _q4k_m))
    iq2 = dict(d=_f16_at(0), add=0.5, post=0.25)
    iq1 = dict(mul=2.0, add=1.0, post=0.125)
    specs = (
        _Spec("Q2_K", _hdr((0, 16), (80, 84)), _bit_lut(256, _q2k, _r(0, 4), _U8), "d_sc",
              d=_f16_at(80), dmin=_f16_at(82), sc=_bits(16, _byte(0, 4)), m=_bits(16, lambda i: [(i, 4, 4, 0)])),
        _Spec("Q3_K", _hdr((96, 110)), _bit_lut(256, _q3k, (-4, -3, -2, -1, 0, 1, 2, 3), _I8), "d_sc",
              d=_f16_at(108), sc=_bits(16, _q3k_scale), add=-32.0, zero_code=-4),
        _Spec("Q4_K", _hdr((0, 16)), _split_pairs_codec(256, 16, 4, 32), "d_sc", **q45,
              direct=_split_pairs(16, 4, 32), undirect=_split_pairs_back(16, 4, 32)),
        _Spec("Q5_K", _hdr((0, 16)), _bit_lut(256, _q5k, _r(0, 32), _U8), "d_sc", **q45),
        _Spec("Q6_K", _hdr((192, 210)), _q6k_codec(), "d_sc",
              d=_f16_at(208), sc=_bits(16, _byte(192)), sc_int8=True, zero_code=-32),
        _Spec("IQ4_NL", _hdr((0, 2)), _bit_lut(32, _nibbles(2, 16), _IQ4NL_VALUES, _I8), "d", d=_f16_at(0),
              zero_code=1),
        _Spec("IQ4_XS", _hdr((0, 8)), _bit_lut(256, _nibbles(8, 16), _IQ4NL_VALUES, _I8), "d_sc",
              d=_f16_at(0), sc=_bits(8, _iq4xs_scale), add=-32.0, zero_code=1),
        _Spec("TQ1_0", _hdr((52, 54)), _lut_codec(_r(0, 3), _U8, 1, _tq1_unpack, _tq1_pack), "d", d=_f16_at(52)),
        _Spec("TQ2_0", _hdr((64, 66)), _bit_lut(256, _tq2, _r(0, 4), _U8, 1), "d", d=_f16_at(64)),
        _Spec("NVFP4", _hdr((0, 4)), _bit_lut(64, _nibbles(4, 8), _FP4X2_VALUES, _I8), "ue4m3"),
        _Spec("IQ2_XXS", _hdr((0, 2), masked=tuple((9 + 8 * i, 0xF0) for i in range(8))),
              _grid_type("IQ2_XXS", 8, lambda g: [(2 + 8 * (g // 4) + g % 4, 0, 8, 0)], "ksigns",
                         (32, lambda h: _span(6 + 8 * (h // 4), 7 * (h % 4), 7))),
              "d_sc", sc=_bits(8, lambda i: _span(6 + 8 * i, 28, 4)), **iq2),
        _Spec("IQ2_XS", _hdr((0, 2), (66, 74)),
              _grid_type("IQ2_XS", 8, lambda g: _span(2 + 2 * g, 0, 9), "ksigns", (32, lambda g: _span(2 + 2 * g, 9, 7))),
              "d_sc", sc=_bits(16, lambda i: [(66 + i // 2, 4 * (i % 2), 4, 0)]), **iq2),
        _Spec("IQ2_S", _hdr((0, 2), (74, 82)),
              _grid_type("IQ2_S", 8, lambda g: [(2 + g, 0, 8, 0), (66 + g // 4, 2 * (g % 4), 2, 8)], "bits",
                         (256, lambda e: [(34 + e // 8, e % 8, 1, 0)])),
              "d_sc", sc=_bits(16, lambda i: [(74 + i // 2, 4 * (i % 2), 4, 0)]), **iq2),
        _Spec("IQ3_XXS", _hdr((0, 2), masked=tuple((69 + 4 * i, 0xF0) for i in range(8))),
              _grid_type("IQ3_XXS", 4, lambda g: [(2 + g, 0, 8, 0)], "ksigns",
                         (32, lambda h: _span(66 + 4 * (h // 4), 7 * (h % 4), 7))),
              "d_sc", d=_f16_at(0), sc=_bits(8, lambda i: _span(66 + 4 * i, 28, 4)), add=0.5, post=0.5),
        _Spec("IQ3_S", _hdr((0, 2), (106, 110)),
              _grid_type("IQ3_S", 4, lambda g: [(2 + g, 0, 8, 0), (66 + g // 8, g % 8, 1, 8)], "bits",
                         (256, lambda e: [(74 + e // 8, e % 8, 1, 0)])),
              "d_sc", d=_f16_at(0), sc=_bits(8, lambda i: [(106 + i // 2, 4 * (i % 2), 4, 0)]), mul=2.0, add=1.0),
        _Spec("IQ1_S", _hdr((0, 2), masked=tuple((35 + 2 * i, 0x70) for i in range(8))),
              _grid_type("IQ1_S", 8, lambda g: [(2 + g, 0, 8, 0)] + _span(34 + 2 * (g // 4), 3 * (g % 4), 3, 8),
                         "delta", (8, lambda i: _span(34 + 2 * i, 15, 1)), delta=32),
              "d_sc", d=_f16_at(0), sc=_bits(8, lambda i: _span(34 + 2 * i, 12, 3)), **iq1),
        _Spec("IQ1_M", _hdr((48, 56)),
              _grid_type("IQ1_M", 8, lambda g: [(g, 0, 8, 0), (32 + g // 2, 4 * (g % 2), 3, 8)],
                         "delta", (32, lambda g: [(32 + g // 2, 4 * (g % 2) + 3, 1, 0)]), delta=8),
              "d_sc", d=_bits(1, lambda i: [(49 + 2 * k, 4, 4, 4 * k) for k in range(4)]),
              sc=_bits(16, lambda i: _span(48 + 2 * (i // 4), 3 * (i % 4), 3)), **iq1),
    )
    return {s.type: s for s in specs}


#: the GGML types this module expands, in the order of docs/conversion-rules.md § 9
EXPANDED_TYPES: tuple[str, ...] = (
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "NVFP4",
    "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
)  # fmt: skip


# ---------------------------------------------------------------------------------------
# Scales.


def _half(blocks: np.ndarray, b: _Bits) -> np.ndarray:
    return np.ascontiguousarray(_unpack(blocks, b)[:, 0]).view(np.float16)


def _refuse_non_finite(x: np.ndarray, name: str, first_block: int) -> None:
    bad = ~np.isfinite(x)
    if bad.any():
        i = int(np.argmax(bad))
        bits = int(x[i : i + 1].view(np.uint16)[0])
        raise NonFiniteScale(
            f"block {first_block + i}: super-block scale {name} is not finite (0x{bits:04x})",
            block=first_block + i,
            field=name,
        )


def _ue4m3_half(b: np.ndarray) -> np.ndarray:
    """UE4M3 byte → float16 of value × ½ (ggml_ue4m3_to_fp32; 0x00 and 0x7F give 0)."""
    e = ((b >> 3) & 15).astype(np.int32)
    man = (b & 7).astype(np.float64)
    v = np.where(e == 0, man * 2.0**-9, (1 + man / 8) * np.exp2(e - 7.0)) * 0.5
    return np.where((b == 0) | (b == 0x7F), 0.0, v).astype(np.float16)


def _f16_offset(b: _Bits | None) -> int | None:
    """The byte offset of a plain little-endian float16 field, or None."""
    r = b.runs if b is not None else None
    if r is None or len(r) != 2 or r[0][:5] != (0, r[0][1], 1, 0, 255) or r[1] != (0, r[0][1] + 1, 1, 0, 255, 8) or r[0][5]:
        return None
    return r[0][1]


@functools.cache
def _fused_args() -> dict[int, dict | None]:
    return {id(spec): _fused_spec(spec) for spec in _specs().values()}


def _fused(spec: _Spec) -> dict | None:
    """The arguments of :func:`~.gguf_kernels.dsc_scales` for a type whose scales it
    computes (``d·(sc + add)``, ``−dmin·m``: Q2_K..Q6_K, IQ4_XS), else None."""
    return _fused_args().get(id(spec))


def _fused_spec(spec: _Spec) -> dict | None:
    d, dmin = _f16_offset(spec.d), _f16_offset(spec.dmin)
    if (spec.scale != "d_sc" or spec.mul != 1.0 or spec.post != 1.0 or spec.add != int(spec.add) or d is None
            or spec.sc is None or spec.sc.runs is None or spec.sc.dtype is not np.uint8):
        return None
    args = dict(d_off=d, sc=spec.sc.runs, subs=spec.sc.n_items, sc_signed=spec.sc_int8, add=int(spec.add))
    if spec.dmin is None:
        return args
    if dmin is None or spec.m is None or spec.m.runs is None or spec.m.dtype is not np.uint8:
        return None
    return {**args, "dmin_off": dmin, "m": spec.m.runs}


def _refuse_flagged(blocks: np.ndarray, flags: np.ndarray, args: dict, first_block: int) -> None:
    """:func:`_refuse_non_finite` for ``d``, then ``dmin``, from the fused kernel's flags."""
    for bit, name, off in ((GK.DSC_BAD_D, "d", args["d_off"]), (GK.DSC_BAD_DMIN, "dmin", args.get("dmin_off"))):
        bad = (flags & bit) != 0
        if off is not None and bad.any():
            i = int(np.argmax(bad))
            _refuse_non_finite(np.ascontiguousarray(blocks[i : i + 1, off : off + 2]).view("<f2").reshape(-1), name, first_block + i)


def _scale_pass(spec: _Spec, blocks: np.ndarray, first_block: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """:func:`_scales` and, per block, whether one of its scales is ±0."""
    args = _fused(spec)
    if args is None:
        scales, corr = _scales(spec, blocks, first_block)
        return scales, corr, (scales == 0).any(axis=1)
    scales, corr, flags = GK.dsc_scales(blocks, **args)
    if (flags & (GK.DSC_BAD_D | GK.DSC_BAD_DMIN)).any():
        _refuse_flagged(blocks, flags, args, first_block)
    return scales, corr, (flags & GK.DSC_ZERO) != 0


def _scales(spec: _Spec, blocks: np.ndarray, first_block: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``(scales, correction)``: the exact ggml sub-block scales (``(n, subs)``, float32 or
    float16) and, for overlay types, ``−(dmin·m)`` (float32), both possibly ±0. The float32
    operations are gguf-py's, in its order."""
    if _fused(spec) is not None:
        return _scale_pass(spec, blocks, first_block)[:2]
    if spec.scale == "ue4m3":
        return _ue4m3_half(blocks[:, :4]), None
    assert spec.d is not None
    d = _half(blocks, spec.d)
    _refuse_non_finite(d, "d", first_block)
    if spec.scale == "d":
        return d[:, None].copy(), None
    assert spec.sc is not None
    sc = _unpack(blocks, spec.sc)
    f = (sc.astype(np.uint8).view(np.int8) if spec.sc_int8 else sc).astype(np.float32)
    if spec.mul != 1.0:
        f = f * np.float32(spec.mul)
    if spec.add:
        f = np.float32(spec.add) + f
    scales = d.astype(np.float32)[:, None] * f
    if spec.post != 1.0:
        scales = scales * np.float32(spec.post)
    if spec.dmin is None:
        return scales, None
    dmin = _half(blocks, spec.dmin)
    _refuse_non_finite(dmin, "dmin", first_block)
    assert spec.m is not None
    return scales, -(dmin.astype(np.float32)[:, None] * _unpack(blocks, spec.m).astype(np.float32))


def _one_like(x: np.ndarray) -> np.ndarray:
    """±1 carrying the sign of each (zero) element of ``x``, same dtype."""
    return np.copysign(np.ones_like(x), x)


# ---------------------------------------------------------------------------------------
# The expanded tensor chunk and its record.


@dataclass
class Record:
    """What restores the GGUF bytes (docs/conversion-rules.md § 9): ``header`` — the raw
    header bytes of every block, ``(n, record_bytes)`` uint8 — and the exception blocks,
    stored verbatim: ``exception_index`` (absolute block indices, ascending, uint32) and
    ``exception_blocks`` (``(m, block_bytes)`` uint8).

    Serialised (:meth:`to_bytes`): the header bytes, then per exception a little-endian
    uint32 block index followed by the block's bytes."""

    type: str
    header: np.ndarray
    exception_index: np.ndarray
    exception_blocks: np.ndarray

    def to_bytes(self) -> bytes:
        spec = _specs()[self.type]
        exc = np.empty((len(self.exception_index), 4 + spec.block_bytes), dtype=np.uint8)
        exc[:, :4] = self.exception_index.astype("<u4").reshape(-1, 1).view(np.uint8)
        exc[:, 4:] = self.exception_blocks
        return self.header.tobytes() + exc.tobytes()

    @classmethod
    def from_bytes(cls, ggml_type: str, data: bytes, n_blocks: int, first_block: int = 0) -> "Record":
        """Parse a record of ``n_blocks`` blocks; a FormatError (field ``record``) if its
        length or its exception indices are wrong."""
        spec, h = _specs()[ggml_type], form(ggml_type).record_bytes
        rest = len(data) - n_blocks * h
        if rest < 0 or rest % (4 + spec.block_bytes):
            raise FormatError(
                f"{len(data)} bytes for {n_blocks} {ggml_type} blocks: expected {n_blocks * h} + a multiple "
                f"of {4 + spec.block_bytes}",
                field="record",
            )
        raw = np.frombuffer(data, dtype=np.uint8)
        exc = raw[n_blocks * h :].reshape(-1, 4 + spec.block_bytes)
        index = np.ascontiguousarray(exc[:, :4]).view("<u4").reshape(-1).astype(np.uint32)
        rec = cls(ggml_type, raw[: n_blocks * h].reshape(n_blocks, h), index, exc[:, 4:])
        rec.check(n_blocks, first_block)
        return rec

    def check(self, n_blocks: int, first_block: int = 0) -> None:
        """Shapes and exception indices (ascending, inside the chunk)."""
        spec, h = _specs()[self.type], form(self.type).record_bytes
        if self.header.shape != (n_blocks, h):
            raise FormatError(f"header is {self.header.shape}, expected ({n_blocks}, {h})", field="record")
        idx = self.exception_index.astype(np.int64)
        if self.exception_blocks.shape != (len(idx), spec.block_bytes):
            raise FormatError(f"exception blocks are {self.exception_blocks.shape}", field="record")
        bad = (idx < first_block) | (idx >= first_block + n_blocks)
        bad[1:] |= np.diff(idx) <= 0
        if bad.any():
            raise FormatError(
                f"exception block index {int(idx[np.argmax(bad)])} out of order or outside blocks "
                f"{first_block}..{first_block + n_blocks - 1}",
                field="record",
            )


@dataclass
class Expanded:
    """One chunk of a tensor in its expanded Hurray form (docs/conversion-rules.md § 9).

    * ``codes`` — ``(n, elements)`` int8/uint8, one stored code per element in GGUF element
      order (Hurray storage per :func:`form`; the value is ``scale · (code − zero_point)``).
    * ``scales`` — ``(n, subs)`` float32 or float16, never zero, one per K-element sub-block.
    * ``correction`` / ``correction_codes`` — overlay types: ``(n, subs)`` float32 scale and
      uint8 code (1, or 0 where the correction is ±0) of the uint2 correction member; its
      every element in the sub-block has that code. ``None`` otherwise.
    * ``zero_patch_index`` / ``zero_patch`` — sub-blocks (flat ``block·subs + sub`` index in
      the chunk) whose ±0 values are mixed, and their ``(m, K)`` float32 ±0 patterns (added).
    * ``record`` — the :class:`Record` that restores the GGUF bytes.
    """

    type: str
    codes: np.ndarray
    scales: np.ndarray
    correction: np.ndarray | None
    correction_codes: np.ndarray | None
    zero_patch_index: np.ndarray
    zero_patch: np.ndarray
    record: Record


# ---------------------------------------------------------------------------------------
# expand / rebuild


def _check_blocks(spec: _Spec, ggml_type: str, blocks: np.ndarray) -> None:
    if blocks.dtype != np.uint8 or blocks.ndim != 2 or blocks.shape[1] != spec.block_bytes:
        raise FormatError(
            f"expected (n, {spec.block_bytes}) uint8 {ggml_type} blocks, got {blocks.shape} {blocks.dtype}",
            field="blocks",
        )


def _fix_zeros(codes: np.ndarray, scales: np.ndarray, zp: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Substitute ±1 for every ±0 scale (in place) and the zero point for its codes; return
    the zero patches of sub-blocks whose ±0 values are mixed (module docstring)."""
    n, subs = scales.shape
    nb, sb = np.nonzero(scales == 0)
    if len(nb) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros((0, k), dtype=np.float32)
    sub_codes = codes.reshape(n, subs, k)
    c = sub_codes[nb, sb].astype(np.int16) - zp
    neg = np.signbit(scales[nb, sb])[:, None] ^ (c < 0)  # ggml's zero is −0 here
    mixed = neg.any(axis=1) & ~neg.all(axis=1)
    scales[nb, sb] = np.where(neg.any(axis=1), -1, 1)
    sub_codes[nb, sb] = zp
    patch = np.where(neg[mixed], np.float32(-0.0), np.float32(0.0)).astype(np.float32)
    return (nb * subs + sb)[mixed].astype(np.int64), patch


def _header_span(spec: _Spec) -> tuple[int, int] | None:
    """``(first byte, length)`` when the header is one run of whole bytes, else None."""
    cols = [b for b, _ in spec.header]
    whole = all(m == 0xFF for _, m in spec.header)
    return (cols[0], len(cols)) if whole and cols == list(range(cols[0], cols[0] + len(cols))) else None


def _header(spec: _Spec, blocks: np.ndarray) -> np.ndarray:
    span = _header_span(spec)
    if span is not None:
        return K.field_u8(blocks, *span)
    cols = [b for b, _ in spec.header]
    return blocks[:, cols] & np.array([m for _, m in spec.header], dtype=np.uint8)


_Pass = tuple[np.ndarray, "np.ndarray | None", np.ndarray]  # :func:`_scale_pass`: scales, correction, zero rows


def _pack_blocks(spec: _Spec, codes: np.ndarray | None, header: np.ndarray, first_block: int,
                 packed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None, _Pass | None]:
    """``(blocks, valid, pass)``: the codes packed with the header bits, which codes were
    valid (``None``: all), and for types with a ``zero_code`` the :func:`_scale_pass` of the
    header bits alone (else None).  ``packed`` (a type with ``undirect`` and no ``zero_code``):
    the codes as stored, moved into the blocks, every one valid."""
    out = np.zeros((header.shape[0], spec.block_bytes), dtype=np.uint8)
    span = _header_span(spec)
    if span is not None:
        K.scatter_field(out, span[0], header)
    else:
        out[:, [b for b, _ in spec.header]] = header
    if packed is not None:
        assert spec.undirect is not None and spec.zero_code is None
        spec.undirect(packed, out)
        return out, None, None
    assert codes is not None
    sp = None
    if spec.zero_code is not None:  # (a code that is not the zero point there fails _compare)
        sp = _scale_pass(spec, out, first_block)
        rows = np.flatnonzero(sp[2])
        if rows.size:
            zero = np.repeat(sp[0][rows] == 0, codes.shape[1] // sp[0].shape[1], axis=1)
            codes = codes.copy()
            codes[rows] = np.where(zero, np.asarray(spec.zero_code, dtype=codes.dtype), codes[rows])
    return out, spec.codec.encode(codes, out), sp


@functools.cache
def _dense(ggml_type: str) -> bool:
    """Is every bit of a block a recorded header bit or a bit of a bijective code field? Then
    packing the codes with the header restores every block whose codes were not substituted,
    and only blocks with a zero-scale sub-block can be exception blocks."""
    spec = _specs()[ggml_type]
    if spec.codec.coverage is None:
        return False
    bits = np.zeros(spec.block_bytes, dtype=np.uint8)
    cov = np.frombuffer(spec.codec.coverage, dtype=np.uint8)
    bits[: len(cov)] |= cov
    for byte, mask in spec.header:
        bits[byte] |= mask
    return bool(np.all(bits == 0xFF))


@functools.cache
def _reversible(ggml_type: str) -> bool:
    """Do valid codes packed with a block's header decode back to themselves, outside the
    zero-scale sub-blocks (where the zero code is packed) and the exception blocks? Yes
    for a dense type whose code bits and header bits are disjoint and whose zero point
    packs back to itself (so every valid code is a value of the bijection)."""
    if not _dense(ggml_type):
        return False
    spec, f = _specs()[ggml_type], form(ggml_type)
    cov, hdr = np.zeros(spec.block_bytes, dtype=np.uint8), np.zeros(spec.block_bytes, dtype=np.uint8)
    c = np.frombuffer(spec.codec.coverage or b"", dtype=np.uint8)
    cov[: len(c)] = c
    for byte, mask in spec.header:
        hdr[byte] |= mask
    zp = np.full((1, spec.elements), f.zero_point or 0, dtype=f.code_dtype)
    out = np.zeros((1, spec.block_bytes), dtype=np.uint8)
    spec.codec.encode(zp, out)
    return not np.any(cov & hdr) and bool(np.array_equal(spec.codec.decode(out), zp))


def _exceptions(spec: _Spec, codes: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """The blocks that packing their (substituted) codes with their header would not restore."""
    if not blocks.shape[0]:
        return np.zeros(0, dtype=np.int64)
    packed = _pack_blocks(spec, codes, _header(spec, blocks), 0)[0]
    return np.flatnonzero((packed != blocks).any(axis=1))


def expand(ggml_type: str, blocks: np.ndarray, first_block: int = 0, codes: np.ndarray | None = None) -> Expanded:
    """The expanded form of a chunk of whole ``ggml_type`` blocks (``(n, block_bytes)`` uint8).
    ``codes``: their decoded codes when already known (changed in place).

    Raises :class:`NonFiniteScale` for a NaN/inf ``d`` or ``dmin``."""
    spec = _specs()[ggml_type]
    _check_blocks(spec, ggml_type, blocks)
    return _expand(ggml_type, blocks, first_block, spec.codec.decode(blocks) if codes is None else codes)


def _expand(ggml_type: str, blocks: np.ndarray, first_block: int, codes: np.ndarray, sp: _Pass | None = None,
            rows: np.ndarray | None = None, record: bool = True) -> Expanded:
    """:func:`expand` given the codes of every block, or with ``rows`` (ascending, every block
    with a zero-scale sub-block among them) the codes of those blocks only -- then ``codes``
    of the result are theirs, and the record is right only for a dense type (:func:`_dense`;
    ``record=False``: an empty record).  ``sp``: the blocks' :func:`_scale_pass` when known."""
    spec, f = _specs()[ggml_type], form(ggml_type)
    scales, corr0, zero = _scale_pass(spec, blocks, first_block) if sp is None else sp
    scales = np.asarray(scales, dtype=f.scale_dtype)  # (a pass's own array: fixed in place)
    zb = np.flatnonzero(zero)
    dense = _dense(ggml_type)
    r = zb if rows is None and dense else rows  # the rows whose codes are fixed (None: all)
    sub_codes = codes[r] if rows is None and r is not None else codes
    if r is None:
        patch_index, patch = _fix_zeros(codes, scales, f.zero_point or 0, f.sub_block)
    else:
        sub, subs = scales[r], scales.shape[1]
        patch_index, patch = _fix_zeros(sub_codes, sub, f.zero_point or 0, f.sub_block)
        patch_index = r[patch_index // subs] * subs + patch_index % subs
        scales[r] = sub
        if rows is None and zb.size:
            codes[r] = sub_codes
    correction, correction_codes = _correction(corr0)
    if not record:
        exc = np.zeros(0, dtype=np.int64)
    elif dense:
        zc = sub_codes if rows is None else sub_codes[np.searchsorted(rows, zb)]
        exc = zb[_exceptions(spec, zc, blocks[zb])]
    else:
        exc = _exceptions(spec, codes, blocks)
    rec = Record(ggml_type, _header(spec, blocks) if record else np.zeros((0, f.record_bytes), np.uint8),
                 (exc + first_block).astype(np.uint32), np.ascontiguousarray(blocks[exc]))
    return Expanded(ggml_type, codes, scales, correction, correction_codes, patch_index, patch, rec)


def _correction(corr0: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The overlay correction's ``(scales, codes)``: ``−dmin·m`` with code 1, or ±1 with code
    0 where it is ±0 (the sign of the zero kept); ``(None, None)`` for other types."""
    if corr0 is None:
        return None, None
    zero = corr0 == 0
    if not zero.any():
        return np.asarray(corr0, dtype=np.float32), np.ones(corr0.shape, dtype=np.uint8)
    return np.where(zero, _one_like(corr0), corr0).astype(np.float32), (~zero).astype(np.uint8)


def _zero_rows(ggml_type: str, blocks: np.ndarray, first_block: int, record: bool) -> tuple[Expanded, np.ndarray]:
    """The expansion without the codes but of the blocks that have a zero-scale sub-block
    (the only ones decoded; ``codes`` of the result are theirs, the zero point substituted)
    and those blocks."""
    spec = _specs()[ggml_type]
    sp = _scale_pass(spec, blocks, first_block)
    zb = np.flatnonzero(sp[2])
    f = form(ggml_type)
    codes = spec.codec.decode(blocks[zb]) if zb.size else np.zeros((0, spec.elements), dtype=f.code_dtype)
    return _expand(ggml_type, blocks, first_block, codes, sp, zb, record), zb


def expand_scales(ggml_type: str, blocks: np.ndarray, first_block: int = 0) -> Expanded:
    """What :func:`expand` gives for the scales, corrections and zero patches, without the
    codes (``codes`` is ``None``) and the record: cheap, for planning and for writing the
    scale buffers. Codes are decoded only in blocks that have a zero-scale sub-block."""
    spec = _specs()[ggml_type]
    _check_blocks(spec, ggml_type, blocks)
    return dataclasses.replace(_zero_rows(ggml_type, blocks, first_block, False)[0], codes=None)


def expand_packed(ggml_type: str, blocks: np.ndarray, first_block: int = 0) -> tuple[Expanded, np.ndarray]:
    """:func:`expand` without the codes (``codes`` is ``None``), and the codes packed in the
    form's storage (uint8, block after block). A dense type whose code bits are the storage
    bytes moved (``_Spec.direct``) is packed straight from the blocks: codes are decoded
    only in the blocks with a zero-scale sub-block, the only possible exception blocks."""
    spec, f = _specs()[ggml_type], form(ggml_type)
    if spec.direct is None or not _dense(ggml_type):
        x = expand(ggml_type, blocks, first_block)
        return dataclasses.replace(x, codes=None), pack(x.codes, f.storage)
    _check_blocks(spec, ggml_type, blocks)
    x, zb = _zero_rows(ggml_type, blocks, first_block, True)
    packed = spec.direct(blocks)
    if zb.size:
        packed[zb] = pack(x.codes, f.storage).reshape(zb.size, -1)
    return dataclasses.replace(x, codes=None), packed.reshape(-1)


def _shape_checks(x: Expanded, spec: _Spec, f: Form, packed: np.ndarray | None = None) -> int:
    """The number of blocks of ``x``; a FormatError naming the field whose shape or type is wrong."""
    codes = x.codes if packed is None else packed
    n = codes.shape[0] if codes is not None and codes.ndim == 2 else -1
    subs = spec.elements // f.sub_block
    width = element_type(f.storage).bits * spec.elements // 8
    want = [
        ("codes", x.codes, (n, spec.elements), f.code_dtype) if packed is None else ("codes", packed, (n, width), np.uint8),
        ("scales", x.scales, (n, subs), f.scale_dtype),
        ("zero_patch", x.zero_patch, (len(x.zero_patch_index), f.sub_block), np.float32),
    ]
    if f.overlay:
        want += [("correction", x.correction, (n, subs), np.float32), ("correction_codes", x.correction_codes, (n, subs), np.uint8)]
    elif x.correction is not None or x.correction_codes is not None:
        raise FormatError(f"{x.type} has no correction member", field="correction")
    for name, arr, shape, dtype in want:
        if arr is None or arr.shape != shape or arr.dtype != dtype:
            got = "missing" if arr is None else f"{arr.shape} {arr.dtype}"
            raise FormatError(f"expected {shape} {np.dtype(dtype)}, got {got}", field=name)
    return n


def _first_bad(bad: np.ndarray, first_block: int, field: str, what: str) -> None:
    if bad.any():
        flat = int(np.argmax(bad.reshape(-1)))
        b, j = divmod(flat, bad.shape[1]) if bad.ndim == 2 else (flat, 0)
        raise FormatError(f"block {first_block + b}: {what.format(j=j)}", field=field)


def _bits_of(a: np.ndarray) -> np.ndarray:
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize]) if a.dtype.kind == "f" else a


def _compare_rows(a: np.ndarray, b: np.ndarray, rows: np.ndarray, first_block: int, field: str, what: str) -> None:
    """:func:`_first_bad` of the rows ``rows`` of two arrays, given as ``a`` and ``b`` (the other rows equal)."""
    if rows.size and not np.array_equal(a, b):
        bad = a != b
        i, j = divmod(int(np.argmax(bad.reshape(-1))), bad.shape[1])
        raise FormatError(f"block {first_block + int(rows[i])}: {what.format(j=j)}", field=field)


def _compare(x: Expanded, y: Expanded, first_block: int, rows: np.ndarray | None = None,
             x_codes: np.ndarray | None = None) -> None:
    """FormatError at the first block where the given form ``x`` differs from ``y``, the
    expansion of the blocks rebuilt from ``x``'s codes and record (``rows``: ``y.codes`` are
    those of these rows only, the others known equal to ``x``'s; ``x_codes``: ``x``'s codes of
    these rows when ``x.codes`` is None)."""
    subs = x.scales.shape[1]
    what = "code of element {j} differs from the record's block"
    if rows is not None:
        _compare_rows(x.codes[rows] if x_codes is None else x_codes, y.codes, rows, first_block, "codes", what)
    pairs = [
        ("codes", x.codes, y.codes if rows is None else None, what),
        ("scales", x.scales, y.scales, "scale of sub-block {j} is not float32(d·sc) of the record"),
        ("correction", x.correction, y.correction, "correction of sub-block {j} is not −dmin·m of the record"),
        ("correction_codes", x.correction_codes, y.correction_codes, "correction code of sub-block {j} is wrong"),
    ]
    for field, a, b, what in pairs:
        if a is not None and b is not None and not np.array_equal(_bits_of(a), _bits_of(b)):
            _first_bad(_bits_of(a) != _bits_of(b), first_block, field, what)
    n = x.scales.shape[0]
    ox, oy = np.argsort(x.zero_patch_index, kind="stable"), np.argsort(y.zero_patch_index, kind="stable")
    xs, ys = x.zero_patch_index[ox], y.zero_patch_index[oy]
    xp, yp = x.zero_patch[ox].view(np.uint32), y.zero_patch[oy].view(np.uint32)
    if not (np.array_equal(xs, ys) and np.array_equal(xp, yp)):  # (sparse: patches are rare)
        bad = np.zeros(n * subs, dtype=bool)
        bad[np.setxor1d(xs, ys)] = True
        common, ix, iy = np.intersect1d(xs, ys, return_indices=True)
        bad[common[(xp[ix] != yp[iy]).any(axis=1)]] = True
        _first_bad(bad.reshape(n, subs), first_block, "zero_patch", "±0 pattern of sub-block {j} is wrong")
    if not np.array_equal(x.record.header, y.record.header):
        _first_bad(x.record.header != y.record.header, first_block, "record", "header byte {j} differs from the rebuilt block")
    exc = np.zeros((2, n), dtype=bool)
    exc[0, x.record.exception_index.astype(np.int64) - first_block] = True
    exc[1, y.record.exception_index.astype(np.int64) - first_block] = True
    _first_bad(exc[0] != exc[1], first_block, "record", "exception block listed wrongly")


def _rebuilt_rows(x: Expanded, sp: _Pass, exc: np.ndarray) -> np.ndarray | None:
    """The rows of the rebuilt blocks whose codes may differ from ``x.codes`` where
    :func:`_reversible` says the others are ``x.codes``: the exception blocks and the blocks
    with a zero-scale sub-block (ascending); None: every row must be decoded."""
    if not _reversible(x.type):
        return None
    rows = sp[2].copy()
    rows[exc] = True
    return np.flatnonzero(rows)


def rebuilds_packed(ggml_type: str) -> bool:
    """Does :func:`rebuild` take the codes ``packed`` as the form stores them (moved straight
    into the blocks: Q4_K)?"""
    spec = _specs()[ggml_type]
    return spec.undirect is not None and spec.zero_code is None and _reversible(ggml_type)


def rebuild(x: Expanded, first_block: int = 0, packed: np.ndarray | None = None) -> np.ndarray:
    """The original ``(n, block_bytes)`` GGML blocks of ``x``, byte for byte.

    ``packed``: where :func:`rebuilds_packed`, the codes as the form stores them, ``(n, bytes
    per block)`` uint8, instead of ``x.codes`` (then None): unpacked only where blocks are
    decoded to be compared.

    Checked: shapes, codes in range, the record's length and indices, and consistency —
    the rebuilt blocks must expand to exactly ``x`` (codes, scale bits, corrections, zero
    patches, exceptions); else a :class:`FormatError` naming the block and the field."""
    spec, f = _specs()[x.type], form(x.type)
    if packed is not None and not rebuilds_packed(x.type):
        raise ValueError(f"{x.type}: rebuild takes its codes unpacked")
    n = _shape_checks(x, spec, f, packed)
    x.record.check(n, first_block)
    try:
        blocks, valid, sp = _pack_blocks(spec, x.codes, x.record.header, first_block, packed)
        if valid is not None:
            _first_bad(~valid, first_block, "codes", f"code of element {{j}} is out of range for {x.type}")
        exc = x.record.exception_index.astype(np.int64) - first_block
        blocks[exc] = x.record.exception_blocks
        if sp is None or not _reversible(x.type):  # (else the header's pass holds but in exception blocks)
            sp = _scale_pass(spec, blocks, first_block)
        elif exc.size:
            try:
                e = _scale_pass(spec, blocks[exc], first_block)
            except NonFiniteScale:
                _scale_pass(spec, blocks, first_block)  # raises, naming the block in the chunk
                raise
            for whole, part in zip(sp, e):
                if whole is not None:
                    whole[exc] = part
        rows = _rebuilt_rows(x, sp, exc)
        if rows is None:
            y = _expand(x.type, blocks, first_block, spec.codec.decode(blocks), sp)
        else:
            y = _expand(x.type, blocks, first_block, spec.codec.decode(blocks[rows]), sp, rows)
    except NonFiniteScale as e:
        raise FormatError(e.message, field="record") from None
    x_codes = None
    if packed is not None:  # (rows is not None: the type is reversible)
        x_codes = unpack(packed[rows], f.storage, rows.size * spec.elements).reshape(rows.size, spec.elements)
    _compare(x, y, first_block, rows, x_codes)
    return blocks
