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
  codes 0 with scale ±1 (the sign of the scale carries the sign of the zero, § 3a). That is
  the logical form (:class:`Expanded`); the import stores it compactly where it can (a
  broadcast minimum, flipped sub-blocks, Q5_K's bit planes: § 11, :mod:`.gguf_exact`), the
  planes moved straight from the blocks (:func:`expand_planes`).
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
so ggml's all-zero rows need no exception block.

**The derived record** (what the import writes): :func:`derive_header` factors the stored
scales back into the header ggml's quantizer would have written -- per block the largest
sub-scale takes the field's top multiplier first (Q4_K: 63, 62, …; Q3_K/IQ4_XS: −32, …;
Q6_K: −128, …), ``d`` must come out an f16 exactly and every other scale an in-range
multiple, checked as bits through the scale rule -- so :class:`DerivedRecord` keeps only the
headers where that does not give the real bytes, and the exception blocks.  The export
derives the others (:meth:`DerivedRecord.chunk`) and rebuilds as below. :func:`rebuild` packs
the codes with the header, puts the exception blocks back, and proves consistency by
expanding the result again: codes, scales (as bits), corrections and zero patches must all
equal the ones given, else a :class:`~hurray_interop.errors.FormatError` names the block.
Where packing valid codes with a header decodes back to them (:func:`_reversible`: Q2_K..Q6_K,
TQ2_0), only the codes of the exception blocks and of the blocks with a zero-scale sub-block
are decoded and compared: elsewhere they are the given codes by construction.

**The rows** (:func:`_specs`): per type its block struct of ggml-common.h field by field
(``_Q4_K = block_q4_K { d, dmin, scales[12], qs[128] }``), the header fields the record
keeps, the code fields (each item's bit parts ``_F(byte, shift, width, dst)`` from a named
function citing the struct field it reads) with their values, and the scale rule
``float32(d)·(sc·mul + add)·post`` (``m``: the overlay's minimum, correction ``−dmin·m``).

**The reference path** (:func:`reference_expand`) evaluates the rows block by block in
plain integers and float32 scalars, every block decoded and checked. The fast paths below
-- :func:`expand` (the fused scale pass; a dense type decodes and checks only its blocks
with a zero-scale sub-block), :func:`expand_scales`, :func:`expand_packed` and the expansion
inside :func:`rebuild` -- must give its bytes on both kernel paths
(``tests/test_gguf_expanded.py``).

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
from typing import Callable, NamedTuple

import numpy as np

from .. import kernels as K
from . import gguf_compact as C
from . import gguf_kernels as GK
from ..core.elements import element_type, pack, sign_extend, unpack
from ..errors import ConversionRefused, FormatError
from ..tables import load_table

__all__ = [
    "EXPANDED_TYPES",
    "GGML_ONLY_TYPES",
    "Form",
    "form",
    "Record",
    "DerivedRecord",
    "derive_header",
    "stand_ins",
    "Expanded",
    "NonFiniteScale",
    "expand",
    "expand_scales",
    "expand_packed",
    "expand_planes",
    "reference_expand",
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
    #: "broadcast": the import writes the minimum as a broadcast member (§ 11), else None
    minimum: str | None = None
    #: the 5-bit codes written as a uint4 base and a uint2 high-bit plane (§ 11)
    planes: bool = False
    #: "ggml": the only decoder of the type is ggml's own (libggml-python); the form is written
    #: only where it loads, so that verify can hold the values to it.  None: gguf-py decodes it
    decoder: str | None = None

    @property
    def compact(self) -> bool:
        """Does the import write this type's compact form (§ 11) where the data allows it?"""
        return self.minimum == "broadcast"

    @property
    def base_storage(self) -> str:
        """The storage of the compact form's base member: the low plane where ``planes``."""
        return C.LO_STORAGE if self.planes else self.storage

    @property
    def qmax(self) -> int:
        """The largest code (``2^bits − 1``; planes: ``15 + 16·1``): a flipped code is ``qmax − q``."""
        lo = (1 << element_type(self.base_storage).bits) - 1
        return lo + (lo + 1 if self.planes else 0)

    @property
    def code_dtype(self) -> np.dtype:
        """The numpy dtype holding one code of the storage type (element_types.toml; codes
        of at most 8 bits, one per byte, signed for an ``int`` type)."""
        return np.dtype(np.int8 if element_type(self.storage).kind == "int" else np.uint8)

    @property
    def scale_dtype(self) -> np.dtype:
        """The numpy dtype of one scale (element_types.toml)."""
        return element_type(self.scale).dtype

    def hurray_bpw(self, compact: bool | None = None) -> float:
        """Bits per weight of the Hurray form's data: codes, scales, zero points, and for an
        overlay the minimum -- a uint2 code per element and a float32 scale per sub-block,
        or (``compact``, default: :attr:`compact`) the broadcast member's scale and, where
        ``planes``, the uint2 high-bit plane with its scale (one code byte per tensor apart)."""
        compact = self.compact if compact is None else compact
        per_scale = element_type(self.scale).bits / self.sub_block
        bits = element_type(self.base_storage if compact else self.storage).bits + per_scale
        if self.zero_point is not None:
            bits += 32 / self.sub_block
        if self.overlay:
            bits += 32 / self.sub_block + (0 if compact else 2)
        if compact and self.planes:
            bits += element_type(C.HI_STORAGE[False]).bits + per_scale
        return bits

    @property
    def record_bpw(self) -> float:
        """Bits per weight of the record's header part (exception blocks come on top)."""
        return self.record_bytes * 8 / _specs()[self.type].elements

    def describe(self, compact: bool | None = None) -> str:
        """E.g. "overlay uint4 + broadcast minimum, K=32, f32 scales, expanded from Q4_K"
        (``compact``: the form of § 11, default :attr:`compact`; else "overlay uint4+uint2")."""
        compact = self.compact if compact is None else compact
        if compact and self.overlay:
            hi = f" + {C.HI_STORAGE[False]} high bit" if self.planes else ""
            kind = f"overlay {self.base_storage}{hi} + broadcast minimum"
        else:
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
            minimum=r.get("minimum"),
            planes=r.get("planes", False),
            decoder=r.get("decoder"),
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


def _items(block: bytes, b: _Bits) -> list[int]:
    """The reference path's reader: every item of the fields ``b`` in one block, part by
    part (``(byte >> shift) & mask``, placed at ``dst``), in plain integers."""
    values = [0] * b.n_items
    for p in b.unpack:
        for item, byte, shift, mask, dst in zip(*(a.tolist() for a in (p.items, p.byte, p.shift, p.mask, p.dst))):
            values[item] |= ((block[byte] >> shift) & mask) << dst
    return values


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


def _u16_field(runs: tuple[tuple[int, int, int, int, int, int], ...] | None) -> int | None:
    """The byte offset of a field that is one little-endian 16-bit item in two whole bytes
    (as :func:`_f16_field` makes them), else None: the generic run packer would take it
    apart byte by byte."""
    if runs is None or len(runs) != 2:
        return None
    at = runs[0][1]
    return at if runs == ((0, at, 1, 0, 255, 0), (0, at + 1, 1, 0, 255, 8)) else None


def _pack(values: np.ndarray, b: _Bits, out: np.ndarray) -> None:
    """OR the items ``values`` (``(n, items)``) into ``out`` (``(n, block_bytes)``, uint8)."""
    v = values.astype(b.dtype, copy=False)
    at = _u16_field(b.runs)
    if at is not None and v.shape[1] == 1:  # (an f16 d: its two bytes moved)
        out[:, at : at + 2] |= np.ascontiguousarray(v, dtype="<u2").view(np.uint8).reshape(-1, 2)
        return
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


# ---------------------------------------------------------------------------------------
# The block structs of ggml/src/ggml-common.h (ggml-org/llama.cpp), field by field, and the
# bit fields of each item (an element's code, a sub-block's scale) inside them: every
# offset below is ``STRUCT.at("field")`` of the struct the type's row names.


class _F(NamedTuple):
    """One part of an item: ``width`` bits of block byte ``byte`` from bit ``shift``,
    placed at bit ``dst`` of the item's value."""

    byte: int
    shift: int
    width: int
    dst: int = 0


_Parts = list[_F]


@dataclass(frozen=True)
class _Struct:
    """A ggml block struct: its C name and its fields in order with their sizes in bytes."""

    name: str
    fields: tuple[tuple[str, int], ...]

    def at(self, field: str) -> int:
        """The byte offset of ``field``."""
        offset = 0
        for name, size in self.fields:
            if name == field:
                return offset
            offset += size
        raise KeyError(f"{self.name} has no field {field}")

    @property
    def size(self) -> int:
        return sum(size for _, size in self.fields)

    def whole(self, *names: str) -> tuple[tuple[int, int], ...]:
        """The ``(byte, 0xFF)`` header entries of the fields ``names``, byte by byte."""
        sizes = dict(self.fields)
        return tuple((self.at(n) + k, 0xFF) for n in names for k in range(sizes[n]))


def _struct(name: str, *fields: tuple[str, int]) -> _Struct:
    return _Struct(name, fields)


QK_K = 256
#: ggml-common.h, with QK_K = 256 and K_SCALE_SIZE = 12 (ggml_half: 2 bytes)
_Q2_K = _struct("block_q2_K", ("scales", QK_K // 16), ("qs", QK_K // 4), ("d", 2), ("dmin", 2))
_Q3_K = _struct("block_q3_K", ("hmask", QK_K // 8), ("qs", QK_K // 4), ("scales", 12), ("d", 2))
_Q4_K = _struct("block_q4_K", ("d", 2), ("dmin", 2), ("scales", 12), ("qs", QK_K // 2))
_Q5_K = _struct("block_q5_K", ("d", 2), ("dmin", 2), ("scales", 12), ("qh", QK_K // 8), ("qs", QK_K // 2))
_Q6_K = _struct("block_q6_K", ("ql", QK_K // 2), ("qh", QK_K // 4), ("scales", QK_K // 16), ("d", 2))
_IQ4_NL = _struct("block_iq4_nl", ("d", 2), ("qs", 32 // 2))
_IQ4_XS = _struct("block_iq4_xs", ("d", 2), ("scales_h", 2), ("scales_l", QK_K // 64), ("qs", QK_K // 2))
_TQ1_0 = _struct("block_tq1_0", ("qs", (QK_K - 4 * QK_K // 64) // 5), ("qh", QK_K // 64), ("d", 2))
_TQ2_0 = _struct("block_tq2_0", ("qs", QK_K // 4), ("d", 2))
_Q1_0 = _struct("block_q1_0", ("d", 2), ("qs", 128 // 8))
_Q2_0 = _struct("block_q2_0", ("d", 2), ("qs", 64 // 4))
_NVFP4 = _struct("block_nvfp4", ("d", 64 // 16), ("qs", 64 // 2))
_IQ2_XXS = _struct("block_iq2_xxs", ("d", 2), ("qs", 2 * QK_K // 8))
_IQ2_XS = _struct("block_iq2_xs", ("d", 2), ("qs", 2 * QK_K // 8), ("scales", QK_K // 32))
_IQ2_S = _struct("block_iq2_s", ("d", 2), ("qs", QK_K // 4), ("qh", QK_K // 32), ("scales", QK_K // 32))
_IQ3_XXS = _struct("block_iq3_xxs", ("d", 2), ("qs", 3 * QK_K // 8))
_IQ3_S = _struct("block_iq3_s", ("d", 2), ("qs", QK_K // 4), ("qh", QK_K // 32), ("signs", QK_K // 8),
                 ("scales", QK_K // 64))
_IQ1_S = _struct("block_iq1_s", ("d", 2), ("qs", QK_K // 8), ("qh", 2 * QK_K // 32))
_IQ1_M = _struct("block_iq1_m", ("qs", QK_K // 8), ("qh", QK_K // 16), ("scales", QK_K // 32))


def _span(byte: int, bit: int, width: int, dst: int = 0) -> _Parts:
    """The parts of a ``width``-bit field starting at bit ``bit`` of the little-endian
    integer at ``byte`` (it may cross bytes)."""
    parts = []
    while width:
        b, s = byte + bit // 8, bit % 8
        w = min(width, 8 - s)
        parts.append(_F(b, s, w, dst))
        bit, width, dst = bit + w, width - w, dst + w
    return parts


def _f16_field(s: _Struct, field: str) -> "_Bits":
    """A little-endian ggml_half field."""
    return _bits(1, lambda _: _span(s.at(field), 0, 16))


def _nibbles(s: _Struct, field: str, run: int) -> Callable[[int], _Parts]:
    """``field`` as runs of ``2·run`` 4-bit codes: element j the low nibble of byte j of the
    run's ``run`` bytes, element j + run its high nibble (block_iq4_nl/iq4_xs/nvfp4.qs)."""
    qs = s.at(field)
    return lambda e: [_F(qs + run * (e // (2 * run)) + e % run, 4 * ((e % (2 * run)) // run), 4)]


def _crumbs(s: _Struct, field: str) -> Callable[[int], _Parts]:
    """``field`` as 2-bit codes, 128 elements per 32 bytes: element 32j + l at bits 2j of
    byte l (block_q2_K.qs, block_q3_K.qs, block_tq2_0.qs)."""
    qs = s.at(field)
    return lambda e: [_F(qs + 32 * (e // 128) + e % 32, 2 * ((e % 128) // 32), 2)]


def _lsb_fields(s: _Struct, field: str, width: int) -> Callable[[int], _Parts]:
    """``field`` as ``width``-bit codes packed LSB-first: element e at bit ``width·e`` (block_q1_0.qs,
    block_q2_0.qs -- the order of Hurray's own packing)."""
    qs, per = s.at(field), 8 // width
    return lambda e: [_F(qs + e // per, width * (e % per), width)]


def _q3k_code(e: int) -> _Parts:
    """block_q3_K: 2 low bits from qs, bit 2 from hmask (byte e % 32, bit e // 32)."""
    return _crumbs(_Q3_K, "qs")(e) + [_F(_Q3_K.at("hmask") + e % 32, e // 32, 1, 2)]


def _q5k_code(e: int) -> _Parts:
    """block_q5_K: the low nibble from qs (split halves of 32-element runs), bit 4 from qh
    (byte e % 32, bit e // 32)."""
    qs = _Q5_K.at("qs")
    return [_F(qs + 32 * (e // 64) + e % 32, 4 * ((e % 64) // 32), 4), _F(_Q5_K.at("qh") + e % 32, e // 32, 1, 4)]


def _q6k_code(e: int) -> _Parts:
    """block_q6_K: the low nibble from ql, bits 4-5 from qh (two 128-element halves)."""
    h, r = divmod(e, 128)
    return [_F(_Q6_K.at("ql") + 64 * h + r % 64, 4 * (r // 64), 4),
            _F(_Q6_K.at("qh") + 32 * h + r % 32, 2 * (r // 32), 2, 4)]


def _q2k_sc(i: int) -> _Parts:
    """block_q2_K.scales[i], low nibble: the scale of sub-block i."""
    return [_F(_Q2_K.at("scales") + i, 0, 4)]


def _q2k_m(i: int) -> _Parts:
    """block_q2_K.scales[i], high nibble: the minimum of sub-block i."""
    return [_F(_Q2_K.at("scales") + i, 4, 4)]


def _q3k_sc(i: int) -> _Parts:
    """block_q3_K.scales (12 bytes): 4 low bits from bytes 0..7, 2 high bits from bytes 8..11."""
    sc = _Q3_K.at("scales")
    return [_F(sc + i % 8, 4 * (i // 8), 4), _F(sc + 8 + i % 4, 2 * (i // 4), 2, 4)]


def _k4_sc(s: _Struct) -> Callable[[int], _Parts]:
    """get_scale_min_k4's scale j of block_q4_K/q5_K.scales: 6 bits of byte j (j < 4), else
    the low nibble of byte j + 4 and the top 2 bits of byte j − 4."""
    sc = s.at("scales")
    return lambda j: [_F(sc + j, 0, 6)] if j < 4 else [_F(sc + j + 4, 0, 4), _F(sc + j - 4, 6, 2, 4)]


def _k4_m(s: _Struct) -> Callable[[int], _Parts]:
    """get_scale_min_k4's minimum j: 6 bits of byte j + 4 (j < 4), else the high nibble of
    byte j + 4 and the top 2 bits of byte j."""
    sc = s.at("scales")
    return lambda j: [_F(sc + j + 4, 0, 6)] if j < 4 else [_F(sc + j + 4, 4, 4), _F(sc + j, 6, 2, 4)]


def _iq4xs_sc(i: int) -> _Parts:
    """block_iq4_xs: the nibble i of scales_l (low 4 bits), bits 2i..2i+1 of scales_h (high 2)."""
    return [_F(_IQ4_XS.at("scales_l") + i // 2, 4 * (i % 2), 4), _F(_IQ4_XS.at("scales_h") + (2 * i) // 8, (2 * i) % 8, 2, 4)]


def _each_byte(s: _Struct, field: str) -> Callable[[int], _Parts]:
    """Item i is byte i of ``field`` (block_q6_K.scales, int8)."""
    return lambda i: [_F(s.at(field) + i, 0, 8)]


def _each_nibble(s: _Struct, field: str, width: int = 4) -> Callable[[int], _Parts]:
    """Item i is the low (even i) or high (odd i) nibble of byte i // 2 of ``field``
    (block_iq2_xs/iq2_s/iq3_s.scales)."""
    return lambda i: [_F(s.at(field) + i // 2, 4 * (i % 2), width)]


def _aux32_scale(s: _Struct, at: int, stride: int) -> Callable[[int], _Parts]:
    """The 4-bit sub-block scale i, bits 28..31 of the little-endian uint32 at byte
    ``at + stride·i`` of qs (``aux32 >> 28`` of dequantize_row_iq2_xxs/iq3_xxs)."""
    return lambda i: _span(s.at("qs") + at + stride * i, 28, 4)


def _ksigns(s: _Struct, at: int, stride: int) -> Callable[[int], _Parts]:
    """The 7-bit ksigns_iq2xs index h: bits 7·(h % 4) of the uint32 at byte ``at +
    stride·(h // 4)`` of qs (block_iq2_xxs, block_iq3_xxs)."""
    return lambda h: _span(s.at("qs") + at + stride * (h // 4), 7 * (h % 4), 7)


def _sign_bits(s: _Struct, field: str, at: int = 0) -> Callable[[int], _Parts]:
    """One sign bit per element: bit e % 8 of byte ``at`` + e // 8 of ``field``
    (block_iq2_s.qs[32:], block_iq3_s.signs)."""
    return lambda e: [_F(s.at(field) + at + e // 8, e % 8, 1)]


def _iq2xxs_index(g: int) -> _Parts:
    """block_iq2_xxs.qs: grid index g is byte g % 4 of the first uint32 of each 8-byte group."""
    return [_F(_IQ2_XXS.at("qs") + 8 * (g // 4) + g % 4, 0, 8)]


def _iq2xs_index(g: int) -> _Parts:
    """block_iq2_xs.qs[g]: a uint16, the grid index in bits 0..8 (its signs in 9..15)."""
    return _span(_IQ2_XS.at("qs") + 2 * g, 0, 9)


def _iq2xs_sign(g: int) -> _Parts:
    return _span(_IQ2_XS.at("qs") + 2 * g, 9, 7)


def _iq2s_index(g: int) -> _Parts:
    """block_iq2_s: 8 bits from qs[g], bits 8-9 from qh[g // 4] (bits 2·(g % 4))."""
    return [_F(_IQ2_S.at("qs") + g, 0, 8), _F(_IQ2_S.at("qh") + g // 4, 2 * (g % 4), 2, 8)]


def _iq3xxs_index(g: int) -> _Parts:
    """block_iq3_xxs.qs[g] (the first 64 bytes): a grid index of 4 elements."""
    return [_F(_IQ3_XXS.at("qs") + g, 0, 8)]


def _iq3s_index(g: int) -> _Parts:
    """block_iq3_s: 8 bits from qs[g], bit 8 from qh[g // 8] (bit g % 8)."""
    return [_F(_IQ3_S.at("qs") + g, 0, 8), _F(_IQ3_S.at("qh") + g // 8, g % 8, 1, 8)]


def _iq1s_index(g: int) -> _Parts:
    """block_iq1_s: 8 bits from qs[g], bits 8-10 from the uint16 qh[g // 4] (bits 3·(g % 4))."""
    return [_F(_IQ1_S.at("qs") + g, 0, 8)] + _span(_IQ1_S.at("qh") + 2 * (g // 4), 3 * (g % 4), 3, 8)


def _iq1s_delta(i: int) -> _Parts:
    """block_iq1_s: bit 15 of the uint16 qh[i], the sign of the ±1/8 delta of its 32 elements."""
    return _span(_IQ1_S.at("qh") + 2 * i, 15, 1)


def _iq1s_sc(i: int) -> _Parts:
    """block_iq1_s: the 3-bit scale of sub-block i, bits 12..14 of the uint16 qh[i]."""
    return _span(_IQ1_S.at("qh") + 2 * i, 12, 3)


def _iq1m_index(g: int) -> _Parts:
    """block_iq1_m: 8 bits from qs[g], bits 8-10 from the nibble g % 2 of qh[g // 2]."""
    return [_F(_IQ1_M.at("qs") + g, 0, 8), _F(_IQ1_M.at("qh") + g // 2, 4 * (g % 2), 3, 8)]


def _iq1m_delta(g: int) -> _Parts:
    """block_iq1_m: the grid shift bit of group g, bit 3 of the nibble g % 2 of qh[g // 2]."""
    return [_F(_IQ1_M.at("qh") + g // 2, 4 * (g % 2) + 3, 1)]


def _iq1m_d(_: int) -> _Parts:
    """block_iq1_m's ggml_half d (iq1m_scale_t): the top nibbles of the four uint16 scales."""
    return [_F(_IQ1_M.at("scales") + 1 + 2 * k, 4, 4, 4 * k) for k in range(4)]


def _iq1m_sc(i: int) -> _Parts:
    """block_iq1_m.scales: 3-bit scale i, bits 3·(i % 4) of the uint16 i // 4."""
    return _span(_IQ1_M.at("scales") + 2 * (i // 4), 3 * (i % 4), 3)


#: kvalues_iq4nl (ggml-common.h): the IQ4_NL/IQ4_XS codebook
_IQ4NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
#: kvalues_mxfp4 (ggml-common.h, doubled E2M1 values): the NVFP4 codebook
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


def _tq1_reference(block: bytes) -> list[int]:
    """dequantize_row_tq1_0: digit l of qs byte j is ``((q·3^l) mod 256)·3 >> 8``; elements
    32l + j (qs[0:32], five digits), 160 + 16l + j (qs[32:48]), 240 + 4l + j (qh, four)."""
    codes = [0] * 256
    for start, first, count, digits in ((0, 0, 32, 5), (160, 32, 16, 5), (240, 48, 4, 4)):
        for j in range(count):
            for l in range(digits):
                codes[start + count * l + j] = ((block[first + j] * 3**l) & 0xFF) * 3 >> 8
    return codes


def _tq1_pack(trits: np.ndarray, out: np.ndarray) -> None:
    n = trits.shape[0]
    t = trits.astype(np.uint16)
    v0 = (t[:, :160].reshape(n, 5, 32) * _TQ1_WEIGHT5[None, :, None]).sum(axis=1)
    v1 = (t[:, 160:240].reshape(n, 5, 16) * _TQ1_WEIGHT5[None, :, None]).sum(axis=1)
    vh = (t[:, 240:].reshape(n, 4, 4) * _TQ1_WEIGHT4[None, :, None]).sum(axis=1)
    v = np.concatenate([v0, v1, vh], axis=1)
    out[:, :52] |= ((v * 256 + 242) // 243).astype(np.uint8)


# ---------------------------------------------------------------------------------------
# Codecs: GGML block bits <-> one Hurray code per element.


@dataclass(frozen=True)
class _Codec:
    decode: Callable[[np.ndarray], np.ndarray]  # blocks -> (n, elements) Hurray codes
    encode: Callable[[np.ndarray, np.ndarray], np.ndarray | None]  # (codes, zeroed blocks to OR into) -> valid (None: all)
    #: bijective codecs (every raw field value is one code, and back): the bits of each
    #: block byte the codes occupy (a bytes object), else None
    coverage: bytes | None = None
    #: the plain per-block decoder of the reference path: a block's bytes -> its codes, read
    #: field by field from the type's rows (:func:`reference_expand`)
    reference: Callable[[bytes], list[int]] | None = None


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


def _bit_lut(n: int, parts: Callable[[int], _Parts], *, values: tuple[int, ...], dtype: type, zp: int = 0) -> _Codec:
    """Codes that are ``values[raw]`` of the ``n`` per-element fields ``parts``."""
    b = _bits(n, parts)
    c = _lut_codec(values, dtype, zp, lambda blocks: _unpack(blocks, b), lambda raw, out: _pack(raw, b, out))
    return dataclasses.replace(c, coverage=_coverage(b, len(set(values))),
                               reference=lambda block: [values[raw] for raw in _items(block, b)])


def _split_pairs_codec(n: int, offset: int, groups: int, width: int) -> _Codec:
    """Codes 0..15 that are ``groups`` runs of GGML split-half nibbles (:func:`_split_pairs`):
    element j of a group is the low nibble of its byte j, element j + ``width`` the high
    nibble -- two bit-field runs per group, moved by the kernels' run movers (C when built)."""
    def field(e: int) -> _Parts:
        g, r = divmod(e, 2 * width)
        return [_F(offset + g * width + r % width, 4 * (r // width), 4)]

    return _bit_lut(n, field, values=_r(0, 16), dtype=_U8)


def _q6k_codec() -> _Codec:
    """Q6_K's int8 codes ``q − 32`` through the kernels' Q6_K movers (one pass over ql and qh;
    the fields of :func:`_q6k_code`, which give the coverage)."""
    def encode(codes: np.ndarray, out: np.ndarray) -> np.ndarray | None:
        if GK.q6k_pack(codes, out) == 0:
            return None  # every code valid
        c = codes.view(np.int8)
        return (c >= -32) & (c <= 31)

    fields = _bit_lut(256, _q6k_code, values=_r(-32, 32), dtype=_I8)
    return _Codec(GK.q6k_codes, encode, fields.coverage, fields.reference)


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
    return _Codec(functools.partial(_grid_decode, g), functools.partial(_grid_encode, g),
                  reference=functools.partial(_grid_reference, g))


def _grid_reference(g: _Grid, block: bytes) -> list[int]:
    """One block's codes, group by group: ± the grid row of each index (dequantize_row_iq*)."""
    grid = _grid_rows(g.quant)[0]
    index, sign = _items(block, g.index), _items(block, g.sign)
    codes = []
    for k, i in enumerate(index):
        for j, mag in enumerate(int(v) for v in grid[i]):
            e = k * g.group + j
            if g.signs == "delta":  # 8·g ± 1: the ±1/8 delta of the group's elements
                codes.append(8 * mag + (-1 if sign[e // g.delta] else 1))
                continue
            neg = (int(_KSIGNS[sign[e // 8]]) >> (e % 8)) & 1 if g.signs == "ksigns" else sign[e]
            codes.append(-mag if neg else mag)
    return codes


# ---------------------------------------------------------------------------------------
# The per-type table.


@dataclass(frozen=True)
class _Spec:
    type: str  # the GGML type
    struct: _Struct  # its block struct in ggml-common.h
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
    #: the header ggml's quantizer writes into an all-zero block, for the derived record
    #: (:func:`derive_header`): ``d`` (+0 or −0) and the sub-scales raw 0 (a memset) or, with
    #: ``zero_v``, the raw value of a zero sub-scale (IQ4_XS: d = −0, ls = 32)
    zero_d: float = 0.0
    zero_v: bool = False
    #: blocks -> their codes' storage bytes, where the code fields are those bytes moved
    direct: Callable[[np.ndarray], np.ndarray] | None = None
    #: the inverse: (storage bytes, zeroed blocks) -> the code fields written
    undirect: Callable[[np.ndarray, np.ndarray], None] | None = None
    #: 5-bit codes (:attr:`Form.planes`): blocks -> the uint4 low plane's and the uint2
    #: high plane's storage bytes, where the code fields are those bytes moved
    planes: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None

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


def _bit_plane(offset: int) -> Callable[[np.ndarray], np.ndarray]:
    """The uint2 plane (element order, four codes a byte) of block_q5_K.qh at ``offset``
    (element ``e``: bit ``e // 32`` of byte ``e % 32``; :func:`~.gguf_kernels.q5k_plane`)."""
    return lambda blocks: GK.q5k_plane(blocks, offset)


def _planes(lo: Callable[[np.ndarray], np.ndarray], hi: Callable[[np.ndarray], np.ndarray]
            ) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    return lambda blocks: (lo(blocks), hi(blocks))


_I8, _U8 = np.int8, np.uint8


def _r(a: int, b: int) -> tuple[int, ...]:
    return tuple(range(a, b))


def _grid(quant: str, *, group: int, index: Callable[[int], _Parts], signs: str, sign: "_Bits", delta: int = 0) -> _Codec:
    """An IQ lattice codec (:class:`_Grid`): ``256 // group`` grid indices of ``group``
    elements each, signs by ``signs`` from the items ``sign``."""
    return _grid_codec(_Grid(quant, group, _bits(256 // group, index), signs, sign, delta))


def _f16_or_none(s: _Struct, field: str) -> "_Bits | None":
    return _f16_field(s, field) if field in dict(s.fields) else None


def _row(ggml_type: str, struct: _Struct, *, header: tuple[str, ...], codes: _Codec, scale: str = "d_sc",
         masked: tuple[tuple[int, int], ...] = (), **rule: object) -> _Spec:
    """One row: the record keeps the struct's fields ``header`` whole and the ``masked``
    ``(byte, bits)``; ``d`` and ``dmin`` are the struct's ggml_half fields of those names
    unless ``rule`` says otherwise; ``rule``: the other :class:`_Spec` fields."""
    fields: dict[str, object] = dict(d=_f16_or_none(struct, "d"), dmin=_f16_or_none(struct, "dmin"))
    fields.update(rule)
    return _Spec(type=ggml_type, struct=struct, header=struct.whole(*header) + masked, codec=codes, scale=scale,
                 **fields)  # type: ignore[arg-type]


@functools.cache
def _specs() -> dict[str, _Spec]:
    """The rows: per type the ggml struct, the header fields kept raw in the record, the
    codes (their fields and values), and the scale: ``d`` (the float16 super-block scale),
    ``ue4m3`` or ``d_sc``: ``float32(d)·(sc·mul + add)·post`` of the sub-block scale
    fields ``sc`` (int8 where ``sc_int8``), and for the overlay types the minimum ``m`` of
    the correction ``−dmin·m``."""
    iq2 = dict(add=0.5, post=0.25)  # d·(0.5 + s)·0.25 (dequantize_row_iq2_*)
    iq1 = dict(mul=2.0, add=1.0, post=0.125)  # d·(2s + 1)/8 (dequantize_row_iq1_*; the delta is in the code)
    q4k_qs = _Q4_K.at("qs")
    specs = (
        _row("Q2_K", _Q2_K, header=("scales", "d", "dmin"),
             codes=_bit_lut(256, _crumbs(_Q2_K, "qs"), values=_r(0, 4), dtype=_U8),
             sc=_bits(16, _q2k_sc), m=_bits(16, _q2k_m)),
        _row("Q3_K", _Q3_K, header=("scales", "d"),
             codes=_bit_lut(256, _q3k_code, values=_r(-4, 4), dtype=_I8),
             sc=_bits(16, _q3k_sc), add=-32.0, zero_code=-4),
        _row("Q4_K", _Q4_K, header=("d", "dmin", "scales"),
             codes=_split_pairs_codec(256, q4k_qs, 4, 32),
             sc=_bits(8, _k4_sc(_Q4_K)), m=_bits(8, _k4_m(_Q4_K)),
             direct=_split_pairs(q4k_qs, 4, 32), undirect=_split_pairs_back(q4k_qs, 4, 32)),
        _row("Q5_K", _Q5_K, header=("d", "dmin", "scales"),
             codes=_bit_lut(256, _q5k_code, values=_r(0, 32), dtype=_U8),
             sc=_bits(8, _k4_sc(_Q5_K)), m=_bits(8, _k4_m(_Q5_K)),
             planes=_planes(_split_pairs(_Q5_K.at("qs"), 4, 32), _bit_plane(_Q5_K.at("qh")))),
        _row("Q6_K", _Q6_K, header=("scales", "d"),
             codes=_q6k_codec(),
             sc=_bits(16, _each_byte(_Q6_K, "scales")), sc_int8=True, zero_code=-32),
        _row("IQ4_NL", _IQ4_NL, header=("d",), scale="d",
             codes=_bit_lut(32, _nibbles(_IQ4_NL, "qs", 16), values=_IQ4NL_VALUES, dtype=_I8),
             zero_code=1),
        _row("IQ4_XS", _IQ4_XS, header=("d", "scales_h", "scales_l"),
             codes=_bit_lut(256, _nibbles(_IQ4_XS, "qs", 16), values=_IQ4NL_VALUES, dtype=_I8),
             sc=_bits(8, _iq4xs_sc), add=-32.0, zero_code=1, zero_d=-0.0, zero_v=True),
        _row("TQ1_0", _TQ1_0, header=("d",), scale="d",
             codes=dataclasses.replace(_lut_codec(_r(0, 3), _U8, 1, _tq1_unpack, _tq1_pack), reference=_tq1_reference)),
        _row("TQ2_0", _TQ2_0, header=("d",), scale="d",
             codes=_bit_lut(256, _crumbs(_TQ2_0, "qs"), values=_r(0, 4), dtype=_U8, zp=1)),
        _row("Q1_0", _Q1_0, header=("d",), scale="d", zero_code=1,
             codes=_bit_lut(128, _lsb_fields(_Q1_0, "qs", 1), values=(-1, 1), dtype=_I8)),
        _row("Q2_0", _Q2_0, header=("d",), scale="d", zero_code=1,
             codes=_bit_lut(64, _lsb_fields(_Q2_0, "qs", 2), values=_r(0, 4), dtype=_U8, zp=1)),
        _row("NVFP4", _NVFP4, header=("d",), scale="ue4m3", d=None,  # (d: four UE4M3 bytes, not a ggml_half)
             codes=_bit_lut(64, _nibbles(_NVFP4, "qs", 8), values=_FP4X2_VALUES, dtype=_I8)),
        _row("IQ2_XXS", _IQ2_XXS, header=("d",), masked=tuple((_IQ2_XXS.at("qs") + 8 * i + 7, 0xF0) for i in range(8)),
             codes=_grid("IQ2_XXS", group=8, index=_iq2xxs_index, signs="ksigns", sign=_bits(32, _ksigns(_IQ2_XXS, 4, 8))),
             sc=_bits(8, _aux32_scale(_IQ2_XXS, 4, 8)), **iq2),
        _row("IQ2_XS", _IQ2_XS, header=("d", "scales"),
             codes=_grid("IQ2_XS", group=8, index=_iq2xs_index, signs="ksigns", sign=_bits(32, _iq2xs_sign)),
             sc=_bits(16, _each_nibble(_IQ2_XS, "scales")), **iq2),
        _row("IQ2_S", _IQ2_S, header=("d", "scales"),
             codes=_grid("IQ2_S", group=8, index=_iq2s_index, signs="bits", sign=_bits(256, _sign_bits(_IQ2_S, "qs", 32))),
             sc=_bits(16, _each_nibble(_IQ2_S, "scales")), **iq2),
        _row("IQ3_XXS", _IQ3_XXS, header=("d",), masked=tuple((_IQ3_XXS.at("qs") + 64 + 4 * i + 3, 0xF0) for i in range(8)),
             codes=_grid("IQ3_XXS", group=4, index=_iq3xxs_index, signs="ksigns", sign=_bits(32, _ksigns(_IQ3_XXS, 64, 4))),
             sc=_bits(8, _aux32_scale(_IQ3_XXS, 64, 4)), add=0.5, post=0.5),
        _row("IQ3_S", _IQ3_S, header=("d", "scales"),
             codes=_grid("IQ3_S", group=4, index=_iq3s_index, signs="bits", sign=_bits(256, _sign_bits(_IQ3_S, "signs"))),
             sc=_bits(8, _each_nibble(_IQ3_S, "scales")), mul=2.0, add=1.0),
        _row("IQ1_S", _IQ1_S, header=("d",), masked=tuple((_IQ1_S.at("qh") + 2 * i + 1, 0x70) for i in range(8)),
             codes=_grid("IQ1_S", group=8, index=_iq1s_index, signs="delta", sign=_bits(8, _iq1s_delta), delta=32),
             sc=_bits(8, _iq1s_sc), **iq1),
        _row("IQ1_M", _IQ1_M, header=("scales",), d=_bits(1, _iq1m_d),
             codes=_grid("IQ1_M", group=8, index=_iq1m_index, signs="delta", sign=_bits(32, _iq1m_delta), delta=8),
             sc=_bits(16, _iq1m_sc), **iq1),
    )
    return {s.type: s for s in specs}


#: the GGML types this module expands, in the order of docs/conversion-rules.md § 9
EXPANDED_TYPES: tuple[str, ...] = (
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "NVFP4",
    "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
)  # fmt: skip
#: the types only ggml's own decoder knows (gguf_expanded.toml ``decoder = "ggml"``): their
#: forms are written only where it loads (tests/test_ggml_only_forms.py holds them to it)
GGML_ONLY_TYPES: tuple[str, ...] = ("Q1_0", "Q2_0")


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
def _fused_args(ggml_type: str) -> dict | None:
    return _fused_spec(_specs()[ggml_type])


def _fused(spec: _Spec) -> dict | None:
    """The arguments of :func:`~.gguf_kernels.dsc_scales` for a type whose scales it
    computes (``d·(sc + add)``, ``−dmin·m``: Q2_K..Q6_K, IQ4_XS), else None."""
    return _fused_args(spec.type)


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
    * ``unsigned_zero`` — read back from a compact form (docs/conversion-rules.md § 11):
      ``(n, subs)`` bool, the sub-blocks stored *flipped*, whose correction is a ±0 the
      storage does not keep the sign of (there ``correction`` is a stand-in −1 and code 0);
      :func:`rebuild` then asks only that the header gives a ±0 correction and a scale > 0.
      None: every correction's sign is known (an import's expansion, a per-element form).
    """

    type: str
    codes: np.ndarray
    scales: np.ndarray
    correction: np.ndarray | None
    correction_codes: np.ndarray | None
    zero_patch_index: np.ndarray
    zero_patch: np.ndarray
    record: Record
    unsigned_zero: np.ndarray | None = None


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


def _expand(ggml_type: str, blocks: np.ndarray, first_block: int, codes: np.ndarray, sp: _Pass | None = None) -> Expanded:
    """:func:`expand` given the codes of every block (the zero point substituted in place).
    ``sp``: the blocks' :func:`_scale_pass` when known. For a dense type (:func:`_dense`)
    only the blocks with a zero-scale sub-block are touched: the others can be neither
    substituted nor exception blocks."""
    spec = _specs()[ggml_type]
    sp = _scale_pass(spec, blocks, first_block) if sp is None else sp
    if not _dense(ggml_type):
        return _assemble(ggml_type, blocks, first_block, sp, codes, None, True)
    zb = np.flatnonzero(sp[2])
    x = _assemble(ggml_type, blocks, first_block, sp, codes[zb], zb, True)
    if zb.size:
        codes[zb] = x.codes
    return dataclasses.replace(x, codes=codes)


def _assemble(ggml_type: str, blocks: np.ndarray, first_block: int, sp: _Pass, codes: np.ndarray,
              rows: np.ndarray | None, record: bool) -> Expanded:
    """The form of the blocks from their :func:`_scale_pass` ``sp`` and the codes of the
    blocks ``rows`` (ascending, every block with a zero-scale sub-block among them; None:
    every block). ``codes`` of the result are those rows'; with ``rows`` the record is right
    only for a dense type (its exception blocks are among them); ``record=False``: empty."""
    spec, f = _specs()[ggml_type], form(ggml_type)
    scales, corr0, zero = sp
    scales = np.asarray(scales, dtype=f.scale_dtype)  # (a pass's own array: fixed in place)
    if rows is None:
        patch_index, patch = _fix_zeros(codes, scales, f.zero_point or 0, f.sub_block)
    else:
        sub, subs = scales[rows], scales.shape[1]
        patch_index, patch = _fix_zeros(codes, sub, f.zero_point or 0, f.sub_block)
        patch_index = rows[patch_index // subs] * subs + patch_index % subs
        scales[rows] = sub
    correction, correction_codes = _correction(corr0)
    if not record:
        exc = np.zeros(0, dtype=np.int64)
    elif rows is None:
        exc = _exceptions(spec, codes, blocks)
    else:
        zb = np.flatnonzero(zero)
        exc = zb[_exceptions(spec, codes[np.searchsorted(rows, zb)], blocks[zb])]
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
    return _assemble(ggml_type, blocks, first_block, sp, codes, zb, record), zb


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

def expand_planes(ggml_type: str, blocks: np.ndarray, first_block: int = 0) -> tuple[Expanded, np.ndarray, np.ndarray]:
    """:func:`expand_packed` for a type whose 5-bit codes are written as two planes
    (:attr:`Form.planes`): the expansion without the codes, and the uint4 low plane's and
    the uint2 high plane's bytes (uint8, block after block), moved straight from the blocks
    where the row has ``planes`` (codes decoded only in the blocks with a zero-scale
    sub-block), else split from the codes (:func:`~.gguf_compact.split_planes`)."""
    spec = _specs()[ggml_type]
    if spec.planes is None or not _dense(ggml_type):
        x = expand(ggml_type, blocks, first_block)
        lo, hi = C.split_planes(x.codes)
        return dataclasses.replace(x, codes=None), lo, hi
    _check_blocks(spec, ggml_type, blocks)
    x, zb = _zero_rows(ggml_type, blocks, first_block, True)
    lo, hi = spec.planes(blocks)
    if zb.size:
        zlo, zhi = C.split_planes(x.codes)
        lo[zb], hi[zb] = zlo.reshape(zb.size, -1), zhi.reshape(zb.size, -1)
    return dataclasses.replace(x, codes=None), lo.reshape(-1), hi.reshape(-1)


# ---------------------------------------------------------------------------------------
# The reference path: block by block, field by field, every block decoded and checked; no
# compiled kernel, no fused scale pass and no subset of rows in the decoding (packing back,
# to find the exception blocks, is the one encoder's, as in rebuild). The fast paths above
# must give its bytes (tests/test_gguf_expanded.py, every type, both kernel paths).


def reference_expand(ggml_type: str, blocks: np.ndarray, first_block: int = 0) -> Expanded:
    """:func:`expand` the plain way: each block's codes from the type's rows
    (:attr:`_Codec.reference`), its scales by the scale rule in float32 scalars, its zero
    sub-blocks substituted one by one; an exception block is one that packing its codes
    with its header does not give back."""
    spec, f = _specs()[ggml_type], form(ggml_type)
    _check_blocks(spec, ggml_type, blocks)
    assert spec.codec.reference is not None
    n, subs, k = blocks.shape[0], spec.elements // f.sub_block, f.sub_block
    codes = np.zeros((n, spec.elements), dtype=f.code_dtype)
    scales = np.zeros((n, subs), dtype=f.scale_dtype)
    corr = np.zeros((n, subs), dtype=np.float32) if f.overlay else None
    patch_index: list[int] = []
    patches: list[list[float]] = []
    for b in range(n):
        block = bytes(blocks[b])
        row, sc, minimum = spec.codec.reference(block), *_reference_scales(spec, block, first_block + b)
        for s in range(subs):
            if sc[s] == 0:  # ggml's zeros: sign(scale) ⊕ (code < 0); the scale ±1, the codes the zero point
                neg = [bool(np.signbit(sc[s])) != (c - (f.zero_point or 0) < 0) for c in row[s * k : (s + 1) * k]]
                sc[s] = sc[s].dtype.type(-1 if any(neg) else 1)
                row[s * k : (s + 1) * k] = [f.zero_point or 0] * k
                if any(neg) and not all(neg):
                    patch_index.append(b * subs + s)
                    patches.append([-0.0 if x else 0.0 for x in neg])
        codes[b], scales[b] = row, sc
        if corr is not None:
            corr[b] = minimum
    correction = correction_codes = None
    if corr is not None:
        correction_codes = (corr != 0).astype(np.uint8)  # ±0: code 0, scale ±1 keeping the sign
        correction = np.where(corr == 0, np.copysign(np.float32(1), corr), corr).astype(np.float32)
    header = np.array([[block[b] & m for b, m in spec.header] for block in blocks.tolist()], dtype=np.uint8)
    exc = _exceptions(spec, codes, blocks)
    rec = Record(ggml_type, header.reshape(n, len(spec.header)), (exc + first_block).astype(np.uint32),
                 np.ascontiguousarray(blocks[exc]))
    return Expanded(ggml_type, codes, scales, correction, correction_codes, np.array(patch_index, dtype=np.int64),
                    np.array(patches, dtype=np.float32).reshape(-1, k), rec)


def _reference_scales(spec: _Spec, block: bytes, index: int) -> tuple[list, list | None]:
    """One block's sub-block scales and (overlay types) ``−dmin·m``, as numpy scalars: the
    UE4M3 bytes × ½ (NVFP4), ``d`` (single level), or ``float32(d)·(sc·mul + add)·post``."""
    if spec.scale == "ue4m3":
        return [np.float16(_ue4m3(byte) * 0.5) for byte in block[:4]], None
    assert spec.d is not None
    d = _reference_half(block, spec.d, "d", index)
    if spec.scale == "d":
        return [d], None
    assert spec.sc is not None
    scales = []
    for sc in _items(block, spec.sc):
        v = np.float32(sc - 256 if spec.sc_int8 and sc >= 128 else sc)
        if spec.mul != 1.0:
            v = v * np.float32(spec.mul)
        if spec.add:
            v = np.float32(spec.add) + v
        v = np.float32(d) * v
        scales.append(v * np.float32(spec.post) if spec.post != 1.0 else v)
    if spec.dmin is None:
        return scales, None
    assert spec.m is not None
    dmin = np.float32(_reference_half(block, spec.dmin, "dmin", index))
    return scales, [-(dmin * np.float32(m)) for m in _items(block, spec.m)]


def _reference_half(block: bytes, field: _Bits, name: str, index: int) -> np.float16:
    """A float16 super-block scale; :class:`NonFiniteScale` if it is NaN or infinite."""
    x = np.array([_items(block, field)[0]], dtype=np.uint16).view(np.float16)
    _refuse_non_finite(x, name, index)
    return x[0]


def _ue4m3(byte: int) -> float:
    """ggml_ue4m3_to_fp32: 4 exponent bits (bias 7), 3 mantissa bits; 0x00 and 0x7F are 0."""
    e, m = (byte >> 3) & 15, byte & 7
    if byte in (0x00, 0x7F):
        return 0.0
    return m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)


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
    if x.unsigned_zero is not None:
        want.append(("unsigned_zero", x.unsigned_zero, (n, subs), np.bool_))
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
    x_corr, y_corr = _signed_corrections(x, y, first_block)
    pairs = [
        ("codes", x.codes, y.codes if rows is None else None, what),
        ("scales", x.scales, y.scales, "scale of sub-block {j} is not float32(d·sc) of the record"),
        ("correction", x_corr, y_corr, "correction of sub-block {j} is not −dmin·m of the record"),
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


def _signed_corrections(x: Expanded, y: Expanded, first_block: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The corrections of ``x`` and ``y`` to compare as bits: where ``x`` was stored flipped
    (:attr:`Expanded.unsigned_zero`) the header must give a ±0 correction and a scale > 0
    (FormatError otherwise), and the sign of that zero, which the storage does not keep, is
    not compared."""
    u = x.unsigned_zero
    if u is None or x.correction is None or y.correction is None or not u.any():
        return x.correction, y.correction
    assert y.correction_codes is not None
    _first_bad(u & (y.correction_codes != 0), first_block, "correction",
               "sub-block {j} is stored flipped (a ±0 minimum) but the record's header gives −dmin·m ≠ 0")
    _first_bad(u & ~(y.scales > 0), first_block, "scales",
               "sub-block {j} is stored flipped but the record's header gives a scale that is not > 0")
    return np.where(u, np.float32(0), x.correction), np.where(u, np.float32(0), y.correction)


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
            y = _assemble(x.type, blocks, first_block, sp, spec.codec.decode(blocks[rows]), rows, True)
    except NonFiniteScale as e:
        raise FormatError(e.message, field="record") from None
    x_codes = None
    if packed is not None:  # (rows is not None: the type is reversible)
        x_codes = unpack(packed[rows], f.storage, rows.size * spec.elements).reshape(rows.size, spec.elements)
    _compare(x, y, first_block, rows, x_codes)
    return blocks


# ---------------------------------------------------------------------------------------
# The derived record (docs/conversion-rules.md § 9): the header of a block factored back out
# of its stored (logical) scales, so that only the blocks where that does not give the real
# header bytes need recording.


@functools.cache
def _raw_values(ggml_type: str, field: str = "sc") -> tuple[np.ndarray, np.ndarray]:
    """``(raw values, their multiplier v)`` of the type's ``sc`` field (``v = raw·mul + add``)
    or ``m`` field (``v = raw``), in the canonical order ggml's quantizers give the block's
    largest scale: ``|v|`` descending, the negative one first (Q4_K: 63, 62, …; Q3_K/IQ4_XS:
    −32, 31, −31, …; Q6_K: −128, 127, …; IQ: the field's top value)."""
    spec = _specs()[ggml_type]
    b = spec.sc if field == "sc" else spec.m
    assert b is not None
    width = max(int(p.mask.max()).bit_length() + int(p.dst.max()) for p in b.unpack)
    signed = spec.sc_int8 and field == "sc"
    raw = np.arange(-128, 128) if signed else np.arange(1 << width)
    mul, add = (spec.mul, spec.add) if field == "sc" else (1.0, 0.0)
    v = np.float32(add) + raw.astype(np.float32) * np.float32(mul)
    order = np.lexsort((v, -np.abs(v)))
    return raw[order], v[order]


def stand_ins(ggml_type: str, scales: np.ndarray, codes: np.ndarray | None = None,
              packed: np.ndarray | None = None, hi: np.ndarray | None = None) -> np.ndarray:
    """``(n, subs)``: the sub-blocks whose stored scale is the ±1 stand-in of a ±0 scale --
    scale ±1 and every code the zero point, from the logical ``codes`` or the codes as
    stored (``packed``, ``(n, bytes per block)``; with ``hi``, ``(n, bytes per block)`` of
    the high-bit plane, ``packed`` is the low plane of the compact form; only the blocks with
    a ±1 scale are unpacked). Without either, every ±1 scale."""
    one = np.abs(scales.astype(np.float32)) == 1
    if codes is None and packed is None:
        return one
    f, spec = form(ggml_type), _specs()[ggml_type]
    rows = np.flatnonzero(one.any(axis=1))
    if not rows.size:
        return one
    if codes is not None:
        c = codes[rows]
    elif hi is not None:
        assert packed is not None
        c = C.join_planes(np.ascontiguousarray(packed[rows]), np.ascontiguousarray(hi[rows]), rows.size * spec.elements)
        c = c.view(f.code_dtype).reshape(rows.size, spec.elements)
    else:
        assert packed is not None
        c = unpack(np.ascontiguousarray(packed[rows]), f.storage, rows.size * spec.elements)
        if element_type(f.storage).packed and element_type(f.storage).kind == "int":
            c = sign_extend(c, element_type(f.storage).bits)
        c = np.ascontiguousarray(c).view(f.code_dtype).reshape(rows.size, spec.elements)
    at_zp = (c.reshape(rows.size, one.shape[1], -1) == np.asarray(f.zero_point or 0, dtype=f.code_dtype)).all(axis=2)
    one[rows] &= at_zp
    return one


#: the multipliers :func:`_factor` tries for a block's largest sub-scale, in canonical order:
#: the first for every block, then the next ones together (ggml's output takes the first, or
#: the second or third where a sign is ambiguous; a header that needs a smaller one, never
#: ggml's, is recorded instead -- this bounds the cost on arbitrary headers)
_CANDIDATES = 9


class _Field(NamedTuple):
    """A sub-scale field for :func:`_factor`: its raw values and multipliers ``v`` in
    canonical order, ``v = raw·mul + add``, the raw value of ``v = 0`` (None: there is none)."""

    raws: np.ndarray
    v: np.ndarray
    mul: np.float32
    add: np.float32
    zraw: int | None


@functools.cache
def _field_of(ggml_type: str, name: str) -> _Field:
    return _field(*_raw_values(ggml_type, name))


def _field(raws: np.ndarray, v: np.ndarray) -> _Field:
    mul, add = np.float32(v[raws == 1][0] - v[raws == 0][0]), np.float32(v[raws == 0][0])
    return _Field(raws, v, mul, add, int(raws[v == 0][0]) if (v == 0).any() else None)


def _first_compiled(t: np.ndarray, target: np.ndarray, zero: np.ndarray | None, ok: np.ndarray, field: _Field,
                    post: float, kernel: tuple[float, float] | None,
                    cands: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The first round of :func:`_factor` by the compiled kernel (:func:`~.gguf_kernels.factor_first`)
    where the rule is ``d·(add + raw·mul)·post`` with the field's own ``add``/``mul``
    (``kernel``); None: the numpy round runs."""
    if kernel is None or not cands.size or kernel != (float(field.add), float(field.mul)) or ok.all():
        return None
    return GK.factor_first(t, target, zero, ok, float(field.v[cands[0]]), kernel[0], kernel[1], post,
                           float(field.raws.min()), float(field.raws.max()), field.zraw)


def _all_first(target: np.ndarray, zero: np.ndarray, field: _Field, post: float, empty: tuple[float, int],
               kernel: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`_factor`'s result when every block factors at the first candidate (ggml's
    output), by one compiled pass (:func:`~.gguf_kernels.factor_rows`) where the first round
    would be compiled (:func:`_first_compiled`); None: a block does not, or no kernel, and
    the rounds run (they give these same bytes for such blocks)."""
    if kernel is None or kernel != (float(field.add), float(field.mul)) or not target.size:
        return None
    nz = field.v != 0
    if not nz.any():
        return None
    got = GK.factor_rows(target, zero, float(field.v[np.argmax(nz)]), kernel[0], kernel[1], post,
                         float(field.raws.min()), float(field.raws.max()), field.zraw, empty)
    return None if got is None else (got[0], got[1], np.ones(target.shape[0], dtype=bool))


def _factor(target: np.ndarray, zero: np.ndarray, field: _Field, post: float,
            rule: Callable[[np.ndarray, np.ndarray], np.ndarray],
            empty: tuple[float, int] = (0.0, 0),
            kernel: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Factor the stored ``target`` (``(n, subs)`` float32 ``rule(d, raw)``: ``float32(d)·v(raw)·post``;
    ``zero``: its ±1 stand-ins of ±0) into an f16 ``d`` per block and a raw field value per
    sub-block. The block's largest ``|target|`` (its anchor) takes the first candidate ``v``
    of the field's canonical order that works: ``d = target/(post·v)`` rounded to f16, every
    other raw value the nearest to ``target/(post·d)``, and ``rule(d, raw)`` giving back
    ``target`` as bits (the one test that decides; float32 quotients of exact products are
    exact). Zero sub-blocks take the raw value of ``v = 0`` (undefined if there is none); a
    block of zeros only is ``empty`` (``d``, raw: ggml's memset, +0 and 0, unless the row
    says otherwise). Returns ``(d, raw, defined)``. Vectorised: the first candidate for
    every block (on ggml's output it nearly always works), then the next ones of the
    first :data:`_CANDIDATES` at once for the blocks left, the anchor alone tested before
    the whole block; a block none of them factors is undefined (its header is recorded)."""
    fast = _all_first(target, zero, field, post, empty, kernel)
    if fast is not None:
        return fast
    n, subs = target.shape
    any_zero = bool(zero.any())
    ok = zero.all(axis=1) if any_zero else np.zeros(n, dtype=bool)
    d = np.zeros(n, dtype=np.float16)
    raw = np.zeros((n, subs), dtype=np.float32)
    if ok.any():
        d[ok], raw[ok] = empty
    t = target.astype(np.float32, copy=False) / np.float32(post) if post != 1 else target.astype(np.float32, copy=False)
    cands = np.flatnonzero(field.v != 0)
    parts = (cands[:1], cands[1:_CANDIDATES])
    first = _first_compiled(t, target, zero if any_zero else None, ok, field, post, kernel, cands)
    if first is not None:  # the first candidate compiled; the numpy round below is its twin
        fd, fraw, fok = first
        if fok.all():  # (ggml's output: every block at the first candidate)
            return fd, fraw.astype(np.int16), fok
        d[fok], raw[fok], ok[fok] = fd[fok], fraw[fok], True
        parts = parts[1:]
    anchor = None
    for part in parts:
        rows = np.flatnonzero(~ok)
        if not rows.size:
            break
        if anchor is None:  # (of every block: the rows left shrink only between the rounds)
            anchor = np.argmax(np.where(zero, np.float32(0), np.abs(t)) if any_zero else np.abs(t), axis=1)
        ta = t[rows, anchor[rows]]
        vc = field.v[part]
        with np.errstate(all="ignore"):
            dd = (ta[:, None] / vc[None, :]).astype(np.float16)
            pre = (dd.astype(np.float32) * vc[None, :] == ta[:, None]) & (dd != 0) & np.isfinite(dd)
        bi, ci = np.nonzero(pre)  # (per block, the candidates in order)
        if not bi.size:
            continue
        pd = dd[bi, ci]
        every = part.size == 1 and bi.size == n
        sel = slice(None) if every else rows[bi]
        rr, good = _trial(t[sel], target[sel], (zero[sel] if any_zero else None), pd, field, rule)
        pick = np.flatnonzero(good)
        if part.size > 1:
            pick = pick[np.unique(bi[pick], return_index=True)[1]]
        won = rows[bi[pick]]
        d[won], raw[won], ok[won] = pd[pick], rr[pick], True
    return d, raw.astype(np.int16), ok


def _trial(t: np.ndarray, target: np.ndarray, zero: np.ndarray | None, d: np.ndarray, field: _Field,
           rule: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One candidate ``d`` per row of ``t`` (``target / post``): the nearest raw values, and
    whether ``rule`` gives back ``target`` as bits with them (:func:`_factor`)."""
    with np.errstate(all="ignore"):
        q = t / d.astype(np.float32)[:, None]
        if field.add:
            q -= field.add
        if field.mul != 1:
            q /= field.mul
        rr = np.clip(np.rint(q, out=q), np.float32(field.raws.min()), np.float32(field.raws.max()), out=q)
        got = rule(d, rr)
    if zero is not None:
        rr[zero] = field.zraw or 0
        got[zero] = target[zero]  # (decided by the raw value of v = 0 alone)
    good = _rows_equal(got, target)
    if zero is not None and field.zraw is None:
        good &= ~zero.any(axis=1)
    return rr, good


def _rows_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row, are the rows of two same-shaped 2-D arrays equal byte for byte (compared as
    the widest unsigned words the row width allows)?"""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    width = a.shape[1] * a.itemsize
    word = next(w for w in (8, 4, 2, 1) if width % w == 0)
    if a.shape[0] == 0 or width == 0:
        return np.ones(a.shape[0], dtype=bool)
    wa, wb = a.view(f"<u{word}").reshape(a.shape[0], -1), b.view(f"<u{word}").reshape(a.shape[0], -1)
    return (wa == wb)[:, 0] if wa.shape[1] == 1 else (wa == wb).all(axis=1)


def _rule(spec: _Spec, d: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """The scale rule of :func:`_scales` on an f16 ``d`` and raw ``sc`` values, in float32."""
    f = raw.astype(np.float32, copy=False)
    if spec.mul != 1.0:
        f = f * np.float32(spec.mul)
    if spec.add:
        f = np.float32(spec.add) + f
    s = d.astype(np.float32)[:, None] * f
    return s * np.float32(spec.post) if spec.post != 1.0 else s


def _minimum(dmin: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The correction ``−(float32(dmin)·m)`` of :func:`_scales`."""
    return -(dmin.astype(np.float32)[:, None] * m.astype(np.float32, copy=False))


@functools.cache
def _ue4m3_inverse() -> np.ndarray:
    """float16 bits of UE4M3 × ½ -> the smallest UE4M3 byte giving it (−1: none)."""
    inv = np.full(1 << 16, -1, dtype=np.int16)
    halves = _ue4m3_half(np.arange(256, dtype=np.uint8)).view(np.uint16)
    for byte in range(255, -1, -1):
        inv[halves[byte]] = byte
    return inv


def _f16_bits(d: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(d.astype(np.float16)).view(np.uint16).reshape(-1, 1)


def derive_header(ggml_type: str, scales: np.ndarray, correction: np.ndarray | None = None,
                  correction_codes: np.ndarray | None = None,
                  zero: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The canonical header bytes (``(n, record_bytes)`` uint8, as :class:`Record` keeps them)
    of blocks with the given *logical* stored values (:class:`Expanded`: scales with their ±1
    stand-ins, marked by ``zero`` -- :func:`stand_ins` --, for overlay types the correction
    and its codes), and per block whether the
    factorization is defined. ``d·(sc·mul + add)·post`` factors by :func:`_factor`, and
    ``−dmin·m`` likewise (``m`` from the field's top value down; a code 0 is ``m = 0``); a
    float16 ``d`` is the stored scale; NVFP4's UE4M3 bytes invert ×½. The bits are packed
    with the row's own fields. Where ggml's quantizer made its usual choice these are the
    real header bytes; elsewhere :class:`DerivedRecord` keeps the real ones."""
    spec = _specs()[ggml_type]
    n = scales.shape[0]
    out = np.zeros((n, spec.block_bytes), dtype=np.uint8)
    zero = stand_ins(ggml_type, scales) if zero is None else zero
    if spec.scale == "ue4m3":
        b = _ue4m3_inverse()[np.ascontiguousarray(np.where(zero, np.float16(0), scales.astype(np.float16))).view(np.uint16)]
        out[:, :4] = np.maximum(b, 0).astype(np.uint8)
        return _header(spec, out), (b >= 0).all(axis=1)
    assert spec.d is not None
    if spec.scale == "d":
        _pack(_f16_bits(np.where(zero[:, 0], np.float16(0), scales[:, 0])), spec.d, out)
        return _header(spec, out), np.ones(n, dtype=bool)
    assert spec.sc is not None
    sc = _field_of(ggml_type, "sc")
    empty = (spec.zero_d, sc.zraw if spec.zero_v and sc.zraw is not None else 0)
    d, raw, ok = _factor(scales, zero, sc, spec.post, functools.partial(_rule, spec), empty, (spec.add, spec.mul))
    _pack(_f16_bits(d), spec.d, out)
    _pack(raw.astype(np.uint8) if spec.sc_int8 else raw, spec.sc, out)
    if spec.dmin is not None:
        assert spec.m is not None and correction is not None and correction_codes is not None
        dmin, m, mok = _factor(correction, correction_codes == 0, _field_of(ggml_type, "m"), -1.0, _minimum,
                               kernel=(0.0, 1.0))  # (−(dmin·m) = (dmin·m)·(−1), exactly)
        _pack(_f16_bits(dmin), spec.dmin, out)
        _pack(m, spec.m, out)
        ok &= mok
    return _header(spec, out), ok


#: bit 31 of an entry's index word: an exception block follows (else a header)
EXCEPTION_FLAG = 1 << 31


@dataclass
class DerivedRecord:
    """The derived restore record (docs/conversion-rules.md § 9): the blocks whose header
    :func:`derive_header` does not give back from the stored values -- ``index`` (absolute
    block indices, ascending, uint32) and their real ``header`` bytes (``(k, record_bytes)``)
    -- and the exception blocks verbatim, as in :class:`Record`.

    Serialised (:meth:`to_bytes`): the header entries, each a little-endian uint32 block
    index then the block's ``record_bytes`` header bytes; then the exception entries, each a
    uint32 ``index | 2**31`` then the block's bytes. The first index word with bit 31 set
    starts the exceptions (header entries have it clear: blocks < 2**31)."""

    type: str
    index: np.ndarray
    header: np.ndarray
    exception_index: np.ndarray
    exception_blocks: np.ndarray

    @classmethod
    def of(cls, x: Expanded, zero: np.ndarray, first_block: int = 0) -> "DerivedRecord":
        """The derived record of the chunk ``x`` (its :class:`Record` holding every header),
        ``zero`` its :func:`stand_ins`: the headers the factorization misses, the exceptions."""
        r = x.record
        derived, ok = derive_header(x.type, x.scales, x.correction, x.correction_codes, zero)
        miss = ~ok | ~_rows_equal(derived, r.header)
        miss[r.exception_index.astype(np.int64) - first_block] = False
        keep = np.flatnonzero(miss)
        return cls(x.type, (keep + first_block).astype(np.uint32), r.header[keep], r.exception_index,
                   r.exception_blocks)

    def parts(self) -> tuple[bytes, bytes]:
        """The serialised header entries and exception entries (concatenated: :meth:`to_bytes`)."""
        return (_entries(self.index, self.header, 0), _entries(self.exception_index, self.exception_blocks, EXCEPTION_FLAG))

    def to_bytes(self) -> bytes:
        return b"".join(self.parts())

    @classmethod
    def from_bytes(cls, ggml_type: str, data: bytes, n_blocks: int) -> "DerivedRecord":
        """Parse the derived record of a tensor of ``n_blocks`` blocks; a FormatError (field
        ``record``) if its length, an index, their order or a flag is wrong."""
        spec, h = _specs()[ggml_type], form(ggml_type).record_bytes
        raw = np.frombuffer(data, dtype=np.uint8)
        step, k = 4 + h, raw.size // (4 + h)
        words = np.ascontiguousarray(raw[: k * step].reshape(k, step)[:, :4]).view("<u4").reshape(-1)
        flagged = (words & np.uint32(EXCEPTION_FLAG)) != 0
        split = int(np.argmax(flagged)) if flagged.any() else k
        rest = raw.size - split * step
        if rest % (4 + spec.block_bytes) or (not flagged.any() and rest):
            raise FormatError(f"{raw.size} bytes: {split} header entries of {step} bytes, then {rest} bytes that are "
                              f"not whole exception entries of {4 + spec.block_bytes}", field="record")
        head = raw[: split * step].reshape(split, step)
        exc = raw[split * step :].reshape(-1, 4 + spec.block_bytes)
        ei = np.ascontiguousarray(exc[:, :4]).view("<u4").reshape(-1)
        if ((ei & np.uint32(EXCEPTION_FLAG)) == 0).any():
            raise FormatError("an exception entry's index word has bit 31 clear", field="record")
        rec = cls(ggml_type, words[:split].astype(np.uint32), head[:, 4:], (ei & np.uint32(EXCEPTION_FLAG - 1)).astype(np.uint32),
                  exc[:, 4:])
        rec.check(n_blocks)
        return rec

    def check(self, n_blocks: int) -> None:
        """Both index lists ascending and inside the tensor's ``n_blocks`` blocks."""
        for what, idx in (("header", self.index), ("exception block", self.exception_index)):
            i = idx.astype(np.int64)
            bad = i >= n_blocks
            bad[1:] |= np.diff(i) <= 0
            if bad.any():
                raise FormatError(f"{what} index {int(i[np.argmax(bad)])} out of order or outside blocks "
                                  f"0..{n_blocks - 1}", field="record")

    def chunk(self, sl: slice, x: Expanded, zero: np.ndarray) -> Record:
        """The full :class:`Record` of the blocks ``sl`` (``x``: their stored values, ``zero``
        their :func:`stand_ins`): every header derived, the recorded ones and the exception
        blocks' own put over them; a block with neither is a FormatError naming it."""
        spec = _specs()[self.type]
        header, ok = derive_header(self.type, x.scales, x.correction, x.correction_codes, zero)
        h0, h1 = np.searchsorted(self.index, [sl.start, sl.stop])
        e0, e1 = np.searchsorted(self.exception_index, [sl.start, sl.stop])
        at = self.index[h0:h1].astype(np.int64) - sl.start
        header[at], ok[at] = self.header[h0:h1], True
        exc = self.exception_index[e0:e1]
        if exc.size:
            header[exc.astype(np.int64) - sl.start] = _header(spec, np.ascontiguousarray(self.exception_blocks[e0:e1]))
            ok[exc.astype(np.int64) - sl.start] = True
        if not ok.all():
            b = sl.start + int(np.argmin(ok))
            raise FormatError(f"block {b}: the stored scales do not factor into a {self.type} header and the "
                              "record has none for it", field="record")
        return Record(self.type, header, exc, self.exception_blocks[e0:e1])


def _entries(index: np.ndarray, rows: np.ndarray, flag: int) -> bytes:
    """Entries ``uint32 (index | flag)`` + the row's bytes, one per index."""
    out = np.empty((len(index), 4 + rows.shape[1]), dtype=np.uint8)
    out[:, :4] = (index.astype(np.uint32) | np.uint32(flag)).astype("<u4").reshape(-1, 1).view(np.uint8)
    out[:, 4:] = rows
    return out.tobytes()
