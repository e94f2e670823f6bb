"""One block codec per GGML type, built from ``mappings/`` (docs/conversion-rules.md §§ 2–4).

A :class:`BlockCodec` joins a row of ``gguf_hurray.toml`` (what we do with the type)
with the type's row of ``ggml_types.toml`` (what GGUF stores): block bytes, elements
per block, field offsets, the code kind, the code offset, the Hurray storage and scale
types, the mapping kind and the export rule.  :func:`codec` looks one up by GGML type
name, :func:`codecs` lists them all; the converter (:mod:`.gguf`) is generic over them
and never names a GGML type.

Nothing here decodes a value: codes and scale bits are moved (docs/conversion-rules.md
§ 1.2).  Every function works on a chunk of whole blocks, ``blocks`` being a
``(n_blocks, block_bytes)`` uint8 array (usually a strided view of the memory-mapped
GGUF), so callers can stream tensors of any size.

Code kinds
----------
``code`` in a table row names a :class:`CodeKind` of :data:`CODE_KINDS`: how a block
holds its codes.  A kind has

* ``unpack(codec, blocks) -> codes``: the chunk's codes as Hurray storage bytes,
  ``(n, codec.code_bytes)``, the code offset already applied;
* ``pack(codec, codes, out)``: the reverse, writing the code fields of the
  ``(n, block_bytes)`` blocks ``out``;
* ``bits`` / ``signed``: the range of one GGML code (the export checks that the Hurray
  codes, minus the code offset, fall in it).

Kinds registered here: ``i8`` (one int8 code per byte), ``nibbles`` (GGML's split
halves: element ``j`` in the low nibble and element ``j + K/2`` in the high nibble of
byte ``j``, where Hurray packs elements ``2k``, ``2k+1`` into byte ``k``) and
``nibbles_qh`` (nibbles plus one 5th bit per element in the ``qh`` field).

Scales and minimums
-------------------
:meth:`BlockCodec.split` takes a chunk of blocks apart into :class:`Parts` -- codes,
scales ``(n,)`` and an optional additive correction (the minimum ``m`` of ``d·q + m``) --
and :meth:`BlockCodec.join` puts :class:`Parts` back together.  The fields do it: the
scale field named by the scale type (:data:`SCALE_TYPES`: ``d`` for float16, ``e`` for
E8M0), ``m`` for the minimum, the kind for the codes.  Adding a GGML type is one table
row, plus one code kind if its codes are laid out in a way no registered kind knows.

The types of ``mappings/gguf_expanded.toml`` (K-quants, IQ, TQ, NVFP4) have no codec:
they have no native mapping, stay refused by default, and ``--fallback exact`` stores
them per tensor through :mod:`.gguf_exact` (docs/conversion-rules.md § 9), whose forms --
several sub-block scales, overlay members, zero patches, a record of whole headers -- are
more than one codec row can say.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from ..core.elements import ElementType, buffer_size, element_type
from ..formats import gguf as G
from ..tables import load_table
from .. import kernels as K
from . import gguf_kernels as GK

__all__ = [
    "BlockCodec",
    "CodeKind",
    "CODE_KINDS",
    "Parts",
    "ScaleType",
    "SCALE_TYPES",
    "codec",
    "codecs",
    "minimum_of",
    "register_code_kind",
    "zero_point_misses",
]


# ===========================================================================
# field views (the byte movers themselves are hurray_interop.kernels: C when built, else numpy)

def _field(blocks: np.ndarray, offset: int, size: int) -> np.ndarray:
    return blocks[:, offset : offset + size]


def _offset_bytes(codes: np.ndarray, offset: int, signed: bool) -> np.ndarray:
    """One code per byte, plus ``offset``, as bytes (two's complement for signed storage)."""
    if not offset:
        return np.ascontiguousarray(codes)
    c = codes.view(np.int8 if signed else np.uint8).astype(np.int16) + offset
    return c.astype(np.int8 if signed else np.uint8).view(np.uint8)


# ===========================================================================
# code kinds


@dataclass(frozen=True)
class CodeKind:
    """How one family of GGML blocks holds its codes (see the module docstring)."""

    name: str
    bits: int
    signed: bool
    #: codes only (the codec reads and writes the scale and minimum fields itself)
    unpack: Callable[["BlockCodec", np.ndarray], np.ndarray]
    pack: Callable[["BlockCodec", np.ndarray, np.ndarray], None]
    #: ``unpack`` into a reused ``(n, code_bytes)`` array, or None when the kind cannot
    unpack_into: Callable[["BlockCodec", np.ndarray, np.ndarray], np.ndarray | None] | None = None


CODE_KINDS: dict[str, CodeKind] = {}


def register_code_kind(kind: CodeKind) -> CodeKind:
    """Add a code kind to :data:`CODE_KINDS` (table rows name it by ``kind.name``)."""
    if kind.name in CODE_KINDS:
        raise ValueError(f"code kind {kind.name!r} is registered twice")
    CODE_KINDS[kind.name] = kind
    return kind


def _i8_unpack(c: "BlockCodec", blocks: np.ndarray) -> np.ndarray:
    return _offset_bytes(_field(blocks, c.fields["qs"], c.block_size), c.code_offset, c.storage.signed)


def _i8_into(c: "BlockCodec", blocks: np.ndarray, out: np.ndarray) -> np.ndarray | None:
    return None if c.code_offset else K.field_u8(blocks, c.fields["qs"], c.block_size, out=out)


def _i8_pack(c: "BlockCodec", codes: np.ndarray, out: np.ndarray) -> None:
    K.scatter_field(out, c.fields["qs"], _offset_bytes(codes, -c.code_offset, c.storage.signed))


def _nibble_offset(pairs: np.ndarray, offset: int) -> np.ndarray:
    """Add ``offset`` to both nibbles of every byte, modulo 16 (8: an XOR, in place)."""
    offset %= 16
    if offset == 8:  # int4 two's complement of q − 8 is q XOR 8
        pairs ^= 0x88
        return pairs
    if offset:
        return ((pairs + offset) & 0x0F) | (((pairs >> 4) + offset) << 4)
    return pairs


def _nibbles_unpack(c: "BlockCodec", blocks: np.ndarray) -> np.ndarray:
    return _nibble_offset(K.split_to_pairs(_field(blocks, c.fields["qs"], c.block_size // 2)), c.code_offset)


def _nibbles_into(c: "BlockCodec", blocks: np.ndarray, out: np.ndarray) -> np.ndarray | None:
    offset = c.code_offset % 16  # 8: the XOR of _nibble_offset, done by the mover
    if offset not in (0, 8):
        return None
    return K.split_to_pairs(_field(blocks, c.fields["qs"], c.block_size // 2), 0x88 if offset else 0, out=out)


def _nibbles_pack(c: "BlockCodec", codes: np.ndarray, out: np.ndarray) -> None:
    if -c.code_offset % 16 == 8 and codes.dtype == np.uint8:  # _nibble_offset's XOR, into a reused buffer
        shifted = np.bitwise_xor(codes, np.uint8(0x88), out=K.thread_buffer("codec.xor", codes.shape, np.uint8))
    else:
        shifted = _nibble_offset(codes.copy(), -c.code_offset)
    K.pairs_to_split(shifted, out=_field(out, c.fields["qs"], c.block_size // 2))


def _qh_unpack(c: "BlockCodec", blocks: np.ndarray) -> np.ndarray:
    k = c.block_size
    codes = GK.q5_codes(_field(blocks, c.fields["qs"], k // 2), _field(blocks, c.fields["qh"], k // 8))
    return _offset_bytes(codes, c.code_offset, c.storage.signed)


def _qh_pack(c: "BlockCodec", codes: np.ndarray, out: np.ndarray) -> None:
    k = c.block_size
    q = _offset_bytes(codes, -c.code_offset, c.storage.signed)
    GK.q5_pack(q, qs_out=_field(out, c.fields["qs"], k // 2), qh_out=_field(out, c.fields["qh"], k // 8))


register_code_kind(CodeKind("i8", 8, True, _i8_unpack, _i8_pack, unpack_into=_i8_into))
register_code_kind(CodeKind("nibbles", 4, False, _nibbles_unpack, _nibbles_pack, unpack_into=_nibbles_into))
register_code_kind(CodeKind("nibbles_qh", 5, False, _qh_unpack, _qh_pack))


# ===========================================================================
# scale types


@dataclass(frozen=True)
class ScaleType:
    """How the converter treats one scale type: reading it from a block, which values
    Hurray forbids, and the legal stand-in for a forbidden scale on an all-zero block
    (docs/conversion-rules.md § 4)."""

    name: str  # the Hurray element type
    field: str  # the GGML block field holding it
    view: str  # numpy dtype the field's bytes are kept as
    abbrev: str  # in mapping texts
    #: values refused anywhere, and values allowed only on blocks whose codes are all zero
    bad: Callable[[np.ndarray], np.ndarray]
    zero: Callable[[np.ndarray], np.ndarray]
    #: the stand-ins for ``zero`` values (same sign, so even ±0 blocks decode unchanged)
    one: Callable[[np.ndarray], np.ndarray]
    bad_text: str  # "{what}" (e.g. "scale d") and "{value}" are filled in
    zero_text: str
    kernel: str  # the scan of kernels.scale_class that finds ``bad`` and ``zero`` values

    def stand_in(self, originals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rule of a scale-substitution record (core/records.py): which ``originals``
        the import replaces, and the stand-ins it stores for them."""
        return self.zero(originals), self.one(originals)


SCALE_TYPES: Mapping[str, ScaleType] = MappingProxyType({
    "float16": ScaleType(
        "float16", "d", "<f2", "f16",
        bad=lambda s: ~np.isfinite(s), zero=lambda s: s == 0,
        one=lambda s: np.copysign(np.float16(1.0), s).astype(np.float16),
        bad_text="{what} = {value} is not finite", zero_text="{what} = 0", kernel="f16",
    ),
    "float8_e8m0": ScaleType(
        "float8_e8m0", "e", "u1", "e8m0",
        bad=lambda s: s == 0xFF, zero=lambda s: s == 0,
        one=lambda s: np.full(s.shape, 0x7F, dtype=np.uint8),
        bad_text="E8M0 scale 0xFF (NaN) is not representable", zero_text="E8M0 scale 0x00", kernel="e8m0",
    ),
})


# ===========================================================================
# the codec


@dataclass
class Parts:
    """A chunk of ``n`` GGML blocks taken apart (see the module docstring)."""

    codes: np.ndarray  # (n, code_bytes) Hurray storage bytes
    scales: np.ndarray  # (n,) one scale per block
    minimum: np.ndarray | None = None  # the additive correction m of d·q + m


def _zero_mask(et: ElementType) -> int:
    """A byte mask: codes AND mask == 0 exactly when every code in the byte decodes to
    zero (integers: code 0; floats: ±0, the sign bits masked off)."""
    if et.kind != "float" or et.bits > 8:
        return 0xFF
    lane = (1 << (et.bits - 1)) - 1
    return sum(lane << s for s in range(0, 8, et.bits))


@dataclass(frozen=True)
class BlockCodec:
    """One GGML type as the converter sees it (a row of each table, joined)."""

    name: str
    mapping: str  # plain | block | block_min | mxfp
    storage: ElementType  # the Hurray element type of the codes (plain: of the values)
    block_size: int  # elements per block (1 for plain types)
    block_bytes: int
    export: str  # "inferred" or "recorded" (plain types: "inferred")
    fields: Mapping[str, int] = field(default_factory=dict)
    kind: CodeKind | None = None
    code_offset: int = 0
    scale: ScaleType | None = None
    compact: bool = False  # the import writes the compact form of docs/conversion-rules.md § 11
    hi_plane: ElementType | None = None  # its 5th-bit plane's storage (None: 4-bit codes)

    @property
    def code_bytes(self) -> int:
        """Hurray storage bytes of one block's codes."""
        return buffer_size(self.storage, self.block_size)

    @property
    def zero_mask(self) -> int:
        return _zero_mask(self.storage)

    def code_range(self) -> tuple[int, int]:
        """The Hurray codes a GGML block of this type can hold (GGML range + code offset)."""
        assert self.kind is not None
        lo = -(1 << (self.kind.bits - 1)) if self.kind.signed else 0
        return lo + self.code_offset, lo + (1 << self.kind.bits) - 1 + self.code_offset

    def codes(self, blocks: np.ndarray) -> np.ndarray:
        assert self.kind is not None
        return self.kind.unpack(self, blocks)

    def field_values(self, blocks: np.ndarray, name: str) -> np.ndarray:
        """The scale-typed field ``name`` (``d``, ``m``, ``e``) of every block, contiguous."""
        assert self.scale is not None
        view = np.dtype(self.scale.view)
        return K.field_u8(blocks, self.fields[name], view.itemsize).view(view).reshape(-1)

    def codes_into(self, blocks: np.ndarray, out: np.ndarray) -> np.ndarray:
        """:meth:`codes`, written into the reused ``(n, code_bytes)`` array ``out`` where the
        code kind can (returns the codes, ``out`` or a new array)."""
        assert self.kind is not None
        into = self.kind.unpack_into
        got = into(self, blocks, out) if into is not None else None
        return got if got is not None else self.codes(blocks)

    def field_into(self, blocks: np.ndarray, name: str, out: np.ndarray) -> np.ndarray:
        """:meth:`field_values` (a copy), written into the reused ``(n,)`` array ``out``."""
        assert self.scale is not None
        size = out.dtype.itemsize
        K.field_u8(blocks, self.fields[name], size, out=out.view(np.uint8).reshape(-1, size))
        return out

    def scales(self, blocks: np.ndarray) -> np.ndarray:
        assert self.scale is not None
        return self.field_values(blocks, self.scale.field)

    def minimums(self, blocks: np.ndarray) -> np.ndarray:
        return self.field_values(blocks, "m")

    def split(self, blocks: np.ndarray) -> Parts:
        return Parts(self.codes(blocks), self.scales(blocks), self.minimums(blocks) if "m" in self.fields else None)

    def join(self, parts: Parts, out: np.ndarray | None = None) -> np.ndarray:
        """``(n, block_bytes)`` GGML blocks from their parts (into ``out``, a reused
        ``(n, block_bytes)`` byte array, when given)."""
        assert self.kind is not None and self.scale is not None
        if out is None:
            out = np.zeros((parts.codes.shape[0], self.block_bytes), dtype=np.uint8)  # bytes no part covers: 0
        else:
            out[...] = 0
        K.scatter_field(out, self.fields[self.scale.field], parts.scales)
        if parts.minimum is not None:
            K.scatter_field(out, self.fields["m"], parts.minimum)
        self.kind.pack(self, parts.codes, out)
        return out


# ===========================================================================
# the minimum as a zero point (docs/conversion-rules.md § 2 (a)), both directions


def minimum_of(z: np.ndarray, d32: np.ndarray) -> np.ndarray:
    """The float16 minimum ``m = −z·d`` a zero point stands for (``0 − z·d``, so z = 0 gives +0)."""
    return (np.float32(0) - z.astype(np.float32) * d32).astype(np.float16)


def zero_point_misses(d32: np.ndarray, z: np.ndarray, m32: np.ndarray, qmax: int) -> np.ndarray:
    """The one statement of the proof that a block ``d·q + m`` is the affine block
    ``d·(q − z)``: per block, True where ``d·(q − z) ≡ d·q + m`` fails, bit for bit in
    float32, for some code q in 0…``qmax`` (``d32``, ``m32``: float32 scales and minimums;
    ``z``: integer zero points)."""
    q = np.arange(qmax + 1, dtype=np.float32)
    lhs = d32[:, None] * (q[None, :] - z.astype(np.float32)[:, None])
    rhs = d32[:, None] * q[None, :] + m32[:, None]
    return np.any(lhs.view(np.uint32) != rhs.view(np.uint32), axis=1)


def _build(name: str, row: Mapping[str, Any]) -> BlockCodec:
    g = G.ggml_type(name)
    if row["mapping"] == "plain":
        return BlockCodec(name, "plain", element_type(row["element"]), 1, g.block_bytes, "inferred")
    if row["block_size"] != g.block_elements:
        raise RuntimeError(f"mappings: {name} block_size {row['block_size']} is not ggml's {g.block_elements}")
    return BlockCodec(
        name=name,
        mapping=row["mapping"],
        storage=element_type(row["storage"]),
        block_size=int(row["block_size"]),
        block_bytes=g.block_bytes,
        export=row["export"],
        fields=MappingProxyType(dict(row["fields"])),
        kind=CODE_KINDS[row["code"]],
        code_offset=int(row["code_offset"]),
        scale=SCALE_TYPES[row["scale"]],
        compact=bool(row.get("compact", False)),
        hi_plane=element_type(row["hi_plane"]) if "hi_plane" in row else None,
    )


@functools.cache
def _codecs() -> Mapping[str, BlockCodec]:
    return MappingProxyType({name: _build(name, row) for name, row in load_table("gguf_hurray")["types"].items()})


def codecs() -> tuple[BlockCodec, ...]:
    """Every GGML type the converter maps, in table order."""
    return tuple(_codecs().values())


def codec(type_name: str) -> BlockCodec | None:
    """The codec of a GGML type, or ``None`` when the type has no exact mapping."""
    return _codecs().get(type_name)
