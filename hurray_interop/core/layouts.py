"""One class per Hurray layout (metadata.md, layouts/*.md): its tag, its model class, the
wire payload it adds to a descriptor (encode / decode), the checks of an in-memory payload
(structure: lengths and wire widths) and of its meaning (semantics), and the buffers it owns.

Each class registers itself under its tag when it is defined (``__init_subclass__``);
:func:`layout_rule` finds the rule of a wire tag, :func:`rule_of` the rule of a layout
object.  :mod:`hurray_interop.core.descriptor` frames the descriptor around them and the
dequantizer and ``inspect`` ask them.  Adding a layout is one class here (and its model
class in :mod:`hurray_interop.core.model`).

Offsets ``at`` passed to the checks are relative to the descriptor start; ``start`` passed
to ``decode`` is the descriptor's position in the reader's buffer.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import FormatError, InconsistentError
from .elements import buffer_size, is_private_tag
from .model import (
    LAYOUT_NAMES, BlockPaged, ColumnMajor, CompositeHead, Coo, Csc, Csf, Csr, Hilbert, Morton, PrivateLayout,
    RowMajor, Strided, Tiled,
)
from .wire import NONE_U32, Ctx, check_int, rule_by_class, vec

if TYPE_CHECKING:  # pragma: no cover
    from ..files.binary import Reader
    from .model import Descriptor

__all__ = ["LayoutRule", "MAX_TILED_DEPTH", "layout_rule", "rule_of", "layout_models"]

MAX_TILED_DEPTH = 8

_BY_TAG: dict[int, "LayoutRule"] = {}
_BY_MODEL: dict[type, "LayoutRule"] = {}


def layout_rule(tag: int) -> "LayoutRule | None":
    """The rule of wire ``layout_tag`` (the private-layout rule for 0xF0-0xFE); None when unknown."""
    rule = _BY_TAG.get(tag)
    if rule is None and is_private_tag(tag):
        return _BY_MODEL[PrivateLayout]
    return rule


def rule_of(layout: object) -> "LayoutRule | None":
    """The rule of an in-memory layout object (None: not a layout)."""
    return rule_by_class(_BY_MODEL, layout)


def layout_models() -> tuple[type, ...]:
    """Every layout model class."""
    return tuple(_BY_MODEL)


def _vector(ctx: Ctx, name: str, v: object, r: int, bits: int, at: int, signed: bool = False, width: int = 8) -> None:
    """An in-memory per-dimension vector: a tuple of ``r`` ints fitting ``bits``."""
    if not isinstance(v, tuple) or len(v) != r:
        raise ctx.err(InconsistentError, f"{name} must be a tuple of {r} values (one per dimension)", name, at)
    for k, x in enumerate(v):
        check_int(x, bits, ctx, f"{name}[{k}]", at + width * k, signed)


def _reserved(ctx: Ctx, res: bytes, n: int, field: str, at: int) -> None:
    if res != bytes(n):
        raise ctx.err(FormatError, "reserved bytes must be zero", field, at)


class LayoutRule:
    """A layout's rules.  The defaults are a dense, payload-free layout owning buffer 0."""

    #: wire ``layout_tag`` (None: the private range, registered by model only)
    tag: ClassVar[int | None] = None
    model: ClassVar[type]
    #: buffers the layout itself owns (None: not fixed)
    own_buffers: ClassVar[int | None] = 1
    #: the specification defines the quantization parameter-buffer sizes
    sized_params: ClassVar[bool] = True
    #: ``byte_offset`` may be non-zero
    offset_allowed: ClassVar[bool] = True
    #: a shard section is allowed
    shardable: ClassVar[bool] = True
    #: buffer 0 holds ``prod(shape)`` contiguous elements
    contiguous: ClassVar[bool] = False
    #: the seed's padded partial trailing blocks apply
    paddable: ClassVar[bool] = False
    #: scales are per page slot (block-paged)
    paged: ClassVar[bool] = False
    #: the names of the layout's own buffers (sparse layouts)
    roles: ClassVar[tuple[str, ...]] = ()
    #: the dequantizer evaluates it (an element-strided dense layout: :meth:`element_strides`)
    evaluable: ClassVar[bool] = False

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "model" in cls.__dict__:
            rule = cls()
            _BY_MODEL[cls.model] = rule
            if cls.tag is not None:
                _BY_TAG[cls.tag] = rule
                if "name" in cls.__dict__:  # a new layout's name, where reports and inspect read names
                    LAYOUT_NAMES.setdefault(cls.tag, cls.__dict__["name"])

    @property
    def name(self) -> str:
        """The layout's name in messages and reports (``LAYOUT_NAMES``; a new layout class may
        set it as a class attribute)."""
        return LAYOUT_NAMES.get(self.tag, f"private 0x{self.tag:02x}" if self.tag is not None else "private")  # type: ignore[arg-type]

    def encode(self, layout: Any, rank: int) -> bytes:
        return b""

    def decode(self, rd: "Reader", tag: int, rank: int, ctx: Ctx, start: int) -> Any:
        return self.model()

    def check_types(self, layout: Any) -> tuple[str, str, object] | None:
        """The Python types of an in-memory payload: ``(field, what it must be, value)`` of
        the first wrong one (a caller bug), None when right."""
        return None

    def check_structure(self, layout: Any, r: int, ctx: Ctx, at: int) -> None:
        """Lengths and wire widths of an in-memory payload starting at ``at``."""

    def check_semantics(self, layout: Any, desc: "Descriptor", ctx: Ctx, at: int) -> None:
        """What the payload means, with the descriptor's shape."""

    def buffer_count(self, desc: "Descriptor") -> int | None:
        return self.own_buffers

    def data_size(self, desc: "Descriptor") -> int | None:
        """Bytes of buffer 0 (standard element types), None when not fixed."""
        if not self.contiguous:
            return None
        n = desc.size
        return None if n is None else buffer_size(desc.element_type, n)

    def layout_sizes(self, desc: "Descriptor") -> list[int] | None:
        """Sizes of the buffers named by :attr:`roles` (sparse layouts; None otherwise)."""
        return None

    def free_strides(self, layout: Any) -> tuple[int, ...] | None:
        """The layout's own element strides when they may address bytes outside the buffer
        (strided: ``validate_addressed_range`` checks them), else None."""
        return None

    def element_strides(self, layout: Any, shape: tuple[int, ...], storage: tuple[int, ...]) -> tuple[tuple[int, ...], bool]:
        """An evaluable layout's strides in elements over the ``storage`` shape (``shape``
        with padded partial blocks), and whether its elements lie in row-major order."""
        raise NotImplementedError(f"{self.name} has no element strides")


def c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major element strides of ``shape``."""
    st = []
    acc = 1
    for n in reversed(shape):
        st.append(acc)
        acc *= int(n)
    return tuple(reversed(st))


def f_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Column-major element strides of ``shape``."""
    st = []
    acc = 1
    for n in shape:
        st.append(acc)
        acc *= int(n)
    return tuple(st)


class _RowMajor(LayoutRule):
    tag, model = 0x01, RowMajor
    contiguous = paddable = evaluable = True

    def element_strides(self, layout: Any, shape: tuple[int, ...], storage: tuple[int, ...]) -> tuple[tuple[int, ...], bool]:
        return c_strides(storage), True


class _ColumnMajor(LayoutRule):
    tag, model = 0x02, ColumnMajor
    contiguous = paddable = evaluable = True

    def element_strides(self, layout: Any, shape: tuple[int, ...], storage: tuple[int, ...]) -> tuple[tuple[int, ...], bool]:
        n = 1
        for d in shape:
            n *= d
        return f_strides(storage), len(shape) == 1 or n <= 1


class _Strided(LayoutRule):
    """Any i64 stride (negative and zero allowed); rank 0 is rejected by the descriptor."""

    tag, model = 0x03, Strided
    evaluable = True

    def free_strides(self, layout: Any) -> tuple[int, ...] | None:
        return tuple(layout.strides)

    def element_strides(self, layout: Any, shape: tuple[int, ...], storage: tuple[int, ...]) -> tuple[tuple[int, ...], bool]:
        """Every addressed byte is checked by the descriptor's ``validate_addressed_range``."""
        strides = tuple(int(s) for s in layout.strides) or (1,)
        return strides, strides == c_strides(shape)

    def encode(self, layout: Any, rank: int) -> bytes:
        return vec("q", len(layout.strides)).pack(*layout.strides)

    def decode(self, rd: "Reader", tag: int, rank: int, ctx: Ctx, start: int) -> Any:
        return Strided(tuple(rd.unpack(vec("q", rank), "strided.strides")) if rank else ())

    def check_structure(self, layout: Any, r: int, ctx: Ctx, at: int) -> None:
        _vector(ctx, "strided.strides", layout.strides, r, 64, at, True)


_TILED_MODES = struct.Struct("<BB2s")


class _Tiled(LayoutRule):
    """Tile shape, outer and inner modes, their strides, a nested tiled layout (depth <= 8)."""

    tag, model = 0x04, Tiled

    def encode(self, t: Any, rank: int) -> bytes:
        parts = [vec("Q", len(t.tile_shape)).pack(*t.tile_shape), _TILED_MODES.pack(t.outer_layout, t.inner_layout, bytes(2))]
        if t.outer_layout == 3:
            parts.append(vec("q", len(t.outer_strides)).pack(*t.outer_strides))
        if t.inner_layout == 3:
            parts.append(vec("q", len(t.inner_strides)).pack(*t.inner_strides))
        if t.inner_layout == 4:
            parts.append(self.encode(t.inner, rank))
        return b"".join(parts)

    def decode(self, rd: "Reader", tag: int, rank: int, ctx: Ctx, start: int, depth: int = 1) -> Any:
        if depth > MAX_TILED_DEPTH:
            raise ctx.err(FormatError, f"tiled nesting deeper than {MAX_TILED_DEPTH}", "tiled.inner_layout", rd.pos - start - 3)
        tile = tuple(rd.unpack(vec("Q", rank), "tiled.tile_shape")) if rank else ()
        at = rd.pos
        outer, inner, res = rd.unpack(_TILED_MODES, "tiled.layouts")
        _reserved(ctx, res, 2, "tiled._reserved", at + 2 - start)
        if outer not in (1, 2, 3):
            raise ctx.err(FormatError, f"outer_layout {outer} is not 1, 2 or 3", "tiled.outer_layout", at - start)
        if inner not in (1, 2, 3, 4):
            raise ctx.err(FormatError, f"inner_layout {inner} is not 1, 2, 3 or 4", "tiled.inner_layout", at + 1 - start)
        os_ = tuple(rd.unpack(vec("q", rank), "tiled.outer_strides")) if outer == 3 and rank else (() if outer == 3 else None)
        is_ = tuple(rd.unpack(vec("q", rank), "tiled.inner_strides")) if inner == 3 and rank else (() if inner == 3 else None)
        nested = self.decode(rd, tag, rank, ctx, start, depth + 1) if inner == 4 else None
        return Tiled(tile, outer, inner, os_, is_, nested)

    def check_types(self, layout: Any) -> tuple[str, str, object] | None:
        t = layout
        while t is not None:
            if not isinstance(t.inner, (Tiled, type(None))):
                return "tiled.inner", "a Tiled layout or None", t.inner
            t = t.inner
        return None

    @staticmethod
    def _next(t: Any, r: int, at: int) -> int:
        """Where the nested tiled payload after ``t``'s starts."""
        return at + 8 * r + 4 + (8 * r if t.outer_layout == 3 else 0) + (8 * r if t.inner_layout == 3 else 0)

    def check_structure(self, layout: Any, r: int, ctx: Ctx, at: int) -> None:
        t, depth = layout, 1
        while t is not None:
            if depth > MAX_TILED_DEPTH:
                raise ctx.err(FormatError, f"tiled nesting deeper than {MAX_TILED_DEPTH}", "tiled.inner_layout", at)
            _vector(ctx, "tiled.tile_shape", t.tile_shape, r, 64, at)
            if t.outer_layout not in (1, 2, 3):
                raise ctx.err(FormatError, f"outer_layout {t.outer_layout} is not 1, 2 or 3", "tiled.outer_layout", at + 8 * r)
            if t.inner_layout not in (1, 2, 3, 4):
                raise ctx.err(FormatError, f"inner_layout {t.inner_layout} is not 1, 2, 3 or 4", "tiled.inner_layout", at + 8 * r + 1)
            if (t.outer_strides is not None) != (t.outer_layout == 3):
                raise ctx.err(InconsistentError, "outer_strides must be given iff outer_layout is 3 (strided)", "tiled.outer_strides", at + 8 * r + 4)
            if t.outer_strides is not None:
                _vector(ctx, "tiled.outer_strides", t.outer_strides, r, 64, at, True)
            if (t.inner_strides is not None) != (t.inner_layout == 3):
                raise ctx.err(InconsistentError, "inner_strides must be given iff inner_layout is 3 (strided)", "tiled.inner_strides", at + 8 * r + 4)
            if t.inner_strides is not None:
                _vector(ctx, "tiled.inner_strides", t.inner_strides, r, 64, at, True)
            if (t.inner is not None) != (t.inner_layout == 4):
                raise ctx.err(InconsistentError, "inner must be given iff inner_layout is 4 (tiled)", "tiled.inner_layout", at + 8 * r + 1)
            at = self._next(t, r, at)
            t, depth = t.inner, depth + 1

    def check_semantics(self, layout: Any, desc: "Descriptor", ctx: Ctx, at: int) -> None:
        r = len(desc.shape)
        t = layout
        while t is not None:
            for k, v in enumerate(t.tile_shape):
                if v == 0:
                    raise ctx.err(FormatError, "tile extent must be > 0", f"tiled.tile_shape[{k}]", at + 8 * k)
            at = self._next(t, r, at)
            t = t.inner


class _Morton(LayoutRule):
    """Bits per dimension; buffer 0 holds ``2^Σbits`` elements."""

    tag, model = 0x05, Morton

    def encode(self, layout: Any, rank: int) -> bytes:
        return vec("I", len(layout.bits)).pack(*layout.bits)

    def decode(self, rd: "Reader", tag: int, rank: int, ctx: Ctx, start: int) -> Any:
        return Morton(tuple(rd.unpack(vec("I", rank), "morton.bits")) if rank else ())

    def check_structure(self, layout: Any, r: int, ctx: Ctx, at: int) -> None:
        _vector(ctx, "morton.bits", layout.bits, r, 32, at, width=4)

    def check_semantics(self, layout: Any, desc: "Descriptor", ctx: Ctx, at: int) -> None:
        for k, b in enumerate(layout.bits):
            if b == 0:
                raise ctx.err(FormatError, "morton_bits must be > 0", f"morton.bits[{k}]", at + 4 * k)
            d = desc.shape[k]
            if d is not None and b < 64 and d > (1 << b):
                raise ctx.err(InconsistentError, f"shape[{k}] = {d} exceeds 2^{b}", f"morton.bits[{k}]", at + 4 * k)

    def data_size(self, desc: "Descriptor") -> int | None:
        total = sum(desc.layout.bits)  # type: ignore[union-attr]
        return buffer_size(desc.element_type, 1 << total) if total < 64 else None


class _Sparse(LayoutRule):
    """COO, CSR, CSC: values, then u64 index arrays; byte_offset 0; sizes unspecified for parameters."""

    sized_params = False
    offset_allowed = False

    def check_structure(self, layout: Any, r: int, ctx: Ctx, at: int) -> None:
        check_int(layout.nnz, 64, ctx, "nnz", at)

    def layout_sizes(self, desc: "Descriptor") -> list[int] | None:
        if desc.element_type.kind == "private" or any(d is None for d in desc.shape):
            return None
        return [buffer_size(desc.element_type, desc.layout.nnz), *self._index_sizes(desc)]  # type: ignore[union-attr]

    def _index_sizes(self, desc: "Descriptor") -> list[int]:
        raise NotImplementedError


_COO = struct.Struct("<QB7s")


class _Coo(_Sparse):
    tag, model = 0x06, Coo
    own_buffers = 2
    roles = ("values", "indices")

    def encode(self, layout: Any, rank: int) -> bytes:
        return _COO.pack(layout.nnz, 1 if layout.is_sorted else 0, bytes(7))

    def decode(self, rd: "Reader", tag: int, rank: int, ctx: Ctx, start: int) -> Any:
        at = rd.pos
        nnz, srt, res = rd.unpack(_COO, "coo")
        _reserved(ctx, res, 7, "coo._reserved", at + 9 - start)
        if srt > 1:
            raise ctx.err(FormatError, f"is_sorted is {srt}, must be 0 or 1", "coo.is_sorted", at + 8 - start)
        return Coo(nnz, bool(srt))

    def check_structure(self, layout: Any, r: int, ctx: Ctx, at: int) -> None:
        if layout.is_sorted not in (0, 1):
            raise ctx.err(FormatError, f"is_sorted {layout.is_sorted!r} is not a bool", "coo.is_sorted", at + 8)
        super().check_structure(layout, r, ctx, at)

    def _index_sizes(self, desc: "Descriptor") -> list[int]:
        return [8 * desc.layout.nnz * len(desc.shape)]  # type: ignore[union-attr]


_CSR = struct.Struct("<Q8s")


class _Compressed(_Sparse):
    """CSR / CSC: rank 2, pointers along ``ptr_axis``."""

    own_buffers = 3
    roles = ("values", "indices", "pointers")
    ptr_axis: ClassVar[int]

    def encode(self, layout: Any, rank: int) -> bytes:
        return _CSR.pack(layout.nnz, bytes(8))

    def decode(self, rd: "Reader", tag: int, rank: int, ctx: Ctx, start: int) -> Any:
        at = rd.pos
        nnz, res = rd.unpack(_CSR, self.name)
        _reserved(ctx, res, 8, self.name + "._reserved", at + 8 - start)
        return self.model(nnz)

    def check_semantics(self, layout: Any, desc: "Descriptor", ctx: Ctx, at: int) -> None:
        r = len(desc.shape)
        if r != 2:
            raise ctx.err(InconsistentError, f"a {self.name} tensor must have rank 2, not {r}", "rank", 16)

    def _index_sizes(self, desc: "Descriptor") -> list[int]:
        return [8 * desc.layout.nnz, 8 * (desc.shape[self.ptr_axis] + 1)]  # type: ignore[union-attr, operator]


class _Csr(_Compressed):
    tag, model, ptr_axis = 0x07, Csr, 0


class _Csc(_Compressed):
    tag, model, ptr_axis = 0x08, Csc, 1


class _Csf(LayoutRule):
    """nnz, a mode order (a permutation), 8 reserved bytes; rank >= 3, 2·rank + 1 buffers."""

    tag, model = 0x09, Csf
    sized_params = False
    offset_allowed = False
    shardable = False

    def encode(self, layout: Any, rank: int) -> bytes:
        return struct.pack("<Q", layout.nnz) + vec("I", len(layout.mode_order)).pack(*layout.mode_order) + bytes(8)

    def decode(self, rd: "Reader", tag: int, rank: int, ctx: Ctx, start: int) -> Any:
        nnz = rd.u64("csf.nnz")
        order = tuple(rd.unpack(vec("I", rank), "csf.mode_order")) if rank else ()
        at = rd.pos
        _reserved(ctx, rd.bytes(8, "csf._reserved"), 8, "csf._reserved", at - start)
        return Csf(nnz, order)

    def check_structure(self, layout: Any, r: int, ctx: Ctx, at: int) -> None:
        check_int(layout.nnz, 64, ctx, "csf.nnz", at)
        _vector(ctx, "csf.mode_order", layout.mode_order, r, 32, at + 8, width=4)

    def check_semantics(self, layout: Any, desc: "Descriptor", ctx: Ctx, at: int) -> None:
        r = len(desc.shape)
        if r < 3:
            raise ctx.err(InconsistentError, f"a CSF tensor must have rank >= 3, not {r}", "rank", 16)
        if sorted(layout.mode_order) != list(range(r)):
            raise ctx.err(FormatError, f"mode_order {list(layout.mode_order)} is not a permutation of 0..{r - 1}", "csf.mode_order", at + 8)

    def buffer_count(self, desc: "Descriptor") -> int | None:
        return 2 * len(desc.shape) + 1


_BLOCK_PAGED = struct.Struct("<IQIIBIB6s")  # 32 bytes
#: (field, bits, offset in the payload) of the block-paged payload
_BLOCK_PAGED_FIELDS = (
    ("page_size", 32, 0), ("num_pages", 64, 4), ("paged_axis", 32, 12), ("num_seqs", 32, 16),
    ("kv_role", 8, 20), ("layer_index", 32, 21), ("block_table_index_type", 8, 25),
)


class _BlockPaged(LayoutRule):
    """Pages of a rank-3 KV tensor: three own buffers, scales per page slot."""

    tag, model = 0x0A, BlockPaged
    own_buffers = 3
    offset_allowed = False
    shardable = False
    paged = True

    def encode(self, layout: Any, rank: int) -> bytes:
        return _BLOCK_PAGED.pack(*(getattr(layout, name) for name, _, _ in _BLOCK_PAGED_FIELDS), bytes(6))

    def decode(self, rd: "Reader", tag: int, rank: int, ctx: Ctx, start: int) -> Any:
        at = rd.pos
        v = rd.unpack(_BLOCK_PAGED, "block_paged")
        _reserved(ctx, v[7], 6, "block_paged._reserved", at + 26 - start)
        return BlockPaged(*v[:7])

    def check_structure(self, layout: Any, r: int, ctx: Ctx, at: int) -> None:
        for name, bits, rel in _BLOCK_PAGED_FIELDS:
            check_int(getattr(layout, name), bits, ctx, f"block_paged.{name}", at + rel)

    def check_semantics(self, layout: Any, desc: "Descriptor", ctx: Ctx, at: int) -> None:
        r = len(desc.shape)
        if r != 3:
            raise ctx.err(InconsistentError, f"a block-paged tensor must have rank 3, not {r}", "rank", 16)
        if layout.page_size < 1:
            raise ctx.err(FormatError, "page_size must be >= 1", "block_paged.page_size", at)
        if layout.paged_axis != 0:
            raise ctx.err(FormatError, f"paged_axis {layout.paged_axis} must be 0", "block_paged.paged_axis", at + 12)
        if layout.kv_role not in (0, 1, 2):
            raise ctx.err(FormatError, f"kv_role {layout.kv_role} is not 0, 1 or 2", "block_paged.kv_role", at + 20)
        if layout.block_table_index_type not in (0, 1):
            raise ctx.err(FormatError, f"block_table_index_type {layout.block_table_index_type} is not 0 or 1", "block_paged.block_table_index_type", at + 25)


_COMPOSITE = struct.Struct("<BB2sI")  # 8 bytes


class _Composite(LayoutRule):
    """A composite head: rule, combine op, member count; no buffers of its own."""

    tag, model = 0x0B, CompositeHead
    own_buffers = None
    sized_params = False
    offset_allowed = False

    def encode(self, layout: Any, rank: int) -> bytes:
        return _COMPOSITE.pack(layout.composition_rule, layout.combine_op, bytes(2), layout.member_count)

    def decode(self, rd: "Reader", tag: int, rank: int, ctx: Ctx, start: int) -> Any:
        at = rd.pos
        rule, op, res, count = rd.unpack(_COMPOSITE, "composite")
        _reserved(ctx, res, 2, "composite._reserved", at + 2 - start)
        return CompositeHead(rule, op, count)

    def check_structure(self, layout: Any, r: int, ctx: Ctx, at: int) -> None:
        check_int(layout.composition_rule, 8, ctx, "composite.composition_rule", at)
        check_int(layout.combine_op, 8, ctx, "composite.combine_op", at + 1)
        check_int(layout.member_count, 32, ctx, "composite.member_count", at + 4)

    def check_semantics(self, layout: Any, desc: "Descriptor", ctx: Ctx, at: int) -> None:
        rule, op = layout.composition_rule, layout.combine_op
        if rule not in (1, 2, 3):
            raise ctx.err(FormatError, f"composition_rule {rule:#04x} is not partition (1), overlay (2) or group (3)", "composite.composition_rule", at)
        if rule == 2 and op not in (1, 2):
            raise ctx.err(FormatError, f"overlay combine_op {op:#04x} is not replace (1) or add (2)", "composite.combine_op", at + 1)
        if rule != 2 and op != 0:
            raise ctx.err(FormatError, f"combine_op must be 0 for a non-overlay composite, not {op:#04x}", "composite.combine_op", at + 1)
        if layout.member_count == NONE_U32:
            raise ctx.err(FormatError, "member_count 0xFFFFFFFF is reserved", "composite.member_count", at + 4)


_HILBERT = struct.Struct("<II")


class _Hilbert(LayoutRule):
    """Order and rank of a Hilbert curve over a 2^order hypercube."""

    tag, model = 0x40, Hilbert
    contiguous = True

    def encode(self, layout: Any, rank: int) -> bytes:
        return _HILBERT.pack(layout.order, layout.rank)

    def decode(self, rd: "Reader", tag: int, rank: int, ctx: Ctx, start: int) -> Any:
        order, hrank = rd.unpack(_HILBERT, "hilbert")
        return Hilbert(order, hrank)

    def check_structure(self, layout: Any, r: int, ctx: Ctx, at: int) -> None:
        check_int(layout.order, 32, ctx, "hilbert.order", at)
        check_int(layout.rank, 32, ctx, "hilbert.rank", at + 4)

    def check_semantics(self, layout: Any, desc: "Descriptor", ctx: Ctx, at: int) -> None:
        r = len(desc.shape)
        if layout.order == 0:
            raise ctx.err(FormatError, "hilbert_order must be > 0", "hilbert.order", at)
        if layout.rank != r or r < 2:
            raise ctx.err(InconsistentError, f"hilbert_rank {layout.rank} must equal the rank {r} and be >= 2", "hilbert.rank", at + 4)
        for k, d in enumerate(desc.shape):
            if d is None or layout.order >= 64 or d != (1 << layout.order):
                raise ctx.err(InconsistentError, f"shape[{k}] = {d} is not 2^{layout.order}", f"shape[{k}]", ctx.shape + 8 * k)


_PRIVATE_LAYOUT = struct.Struct("<QI")


class _Private(LayoutRule):
    """A private layout (tags 0xF0-0xFE): an extension id and opaque bytes."""

    model = PrivateLayout
    own_buffers = None
    sized_params = False

    def encode(self, layout: Any, rank: int) -> bytes:
        return _PRIVATE_LAYOUT.pack(layout.extension_layout_id, len(layout.data)) + bytes(layout.data)

    def decode(self, rd: "Reader", tag: int, rank: int, ctx: Ctx, start: int) -> Any:
        ident, n = rd.unpack(_PRIVATE_LAYOUT, "private_layout")
        return PrivateLayout(tag, ident, rd.bytes(n, "private_layout.data"))

    def check_structure(self, layout: Any, r: int, ctx: Ctx, at: int) -> None:
        check_int(layout.extension_layout_id, 64, ctx, "private_layout.extension_layout_id", at)
        if not isinstance(layout.data, (bytes, bytearray)) or len(layout.data) > NONE_U32:
            raise ctx.err(FormatError, "private layout data must be bytes shorter than 4 GiB", "private_layout.data", at + 12)
