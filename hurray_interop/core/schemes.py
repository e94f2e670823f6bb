"""One class per Hurray quantization scheme (quantization/*.md): its tag and name, its
fixed-length wire struct (encode / decode), the storage element types it allows, its
context-free checks and those needing the descriptor, its parameter buffers (which fields
name them, their sizes, the checks of their contents), and what the dequantizer and
``inspect`` need to know of it (scale element type, code book, one scale per channel or
per block, the fields shown).

Each class registers itself under its tag when it is defined (``__init_subclass__``);
:func:`scheme_rule` finds the rule of a wire tag, :func:`rule_of` the rule of a scheme
object.  Storage and scale types are element-type *names*, looked up in
``mappings/element_types.toml``.  Adding a scheme is one class here (and its model class
in :mod:`hurray_interop.core.model`).

Offsets ``at`` are relative to the scheme start; ``Q`` (in :meth:`SchemeRule.check_in`)
is where the scheme starts relative to the descriptor.
"""

from __future__ import annotations

import math
import struct
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import numpy as np

from ..errors import FormatError, InconsistentError
from ..kernels import first_bad_scale
from .elements import ELEMENT_TYPES_BY_TAG, ElementType, e8m0_reserved, element_type
from .model import MXFP, NF4, SCHEME_NAMES, PerBlockAffine, PerChannelAffine, PerTensorAffine
from .wire import NONE_U32, Ctx, check_int, pow2, rule_by_class

if TYPE_CHECKING:  # pragma: no cover
    from .model import Descriptor

__all__ = ["SchemeRule", "scheme_rule", "rule_of", "scheme_models", "code_books", "storage_range"]

_BY_TAG: dict[int, "SchemeRule"] = {}
_BY_MODEL: dict[type, "SchemeRule"] = {}

#: ``view(buffer index, dtype, first entry) -> entries`` and
#: ``fail(buffer index, entry, entry bytes, what, value, start=0)`` of
#: :func:`~hurray_interop.core.descriptor.validate_parameter_values`
View = Callable[..., np.ndarray]
Fail = Callable[..., None]

_CHUNK = 1 << 24  # elements per vectorized pass


def scheme_rule(tag: int) -> "SchemeRule | None":
    """The rule of wire ``scheme_tag``; None when unknown, reserved or private."""
    return _BY_TAG.get(tag)


def rule_of(q: object) -> "SchemeRule | None":
    """The rule of an in-memory scheme object (None: not a scheme)."""
    return rule_by_class(_BY_MODEL, q)


def scheme_models() -> tuple[type, ...]:
    """Every scheme model class."""
    return tuple(_BY_MODEL)


def code_books() -> dict[str, tuple[float, ...]]:
    """Scheme name -> the float32 value of each code, for the schemes with a code book."""
    return {r.name: r.code_book for r in _BY_TAG.values() if r.code_book is not None}


def storage_range(et: ElementType) -> tuple[int, int]:
    """The integers an int / uint storage type holds."""
    if et.kind == "uint":
        return 0, (1 << et.bits) - 1
    return -(1 << (et.bits - 1)), (1 << (et.bits - 1)) - 1


def first_bad(arr: np.ndarray, bad_fn: Callable[[np.ndarray], np.ndarray]) -> int | None:
    """Index of the first entry ``bad_fn`` flags (vectorized, chunked), None when none is."""
    for lo in range(0, arr.size, _CHUNK):
        bad = bad_fn(arr[lo : lo + _CHUNK])
        if bad.any():
            return lo + int(np.argmax(bad))
    return None


def _tags(names: tuple[str, ...]) -> frozenset[int]:
    return frozenset(element_type(n).tag for n in names)


class SchemeRule:
    """A quantization scheme's rules (the defaults are an axis scheme's)."""

    tag: ClassVar[int]
    model: ClassVar[type]
    #: the fixed-length scheme descriptor (its first fields: tag u8, version u8, flags u16)
    struct: ClassVar[struct.Struct]
    #: flag bits the scheme defines (bit 0: SYMMETRIC)
    flag_bits: ClassVar[int] = 0
    #: storage element types allowed (names in element_types.toml) and their tags
    storage: ClassVar[tuple[str, ...]]
    storage_tags: ClassVar[frozenset[int]]
    #: the tags of ``scale_types`` (affine schemes: the scale element types the descriptor may name)
    scale_tags: ClassVar[frozenset[int]]
    #: one scale per channel of the axis ("channel") or per block of it ("block")
    unit: ClassVar[str] = "block"
    #: the scheme has blocks along its axis (``block_size``)
    blocks: ClassVar[bool] = True
    #: the seed's padded partial trailing block is accepted (``ceil(S/K)`` blocks)
    padded: ClassVar[bool] = False
    #: relative offset of ``scale_buffer_index`` (then ``zero_point_buffer_index`` at +4)
    scale_index_at: ClassVar[int] = 12
    #: block sizes: power of two in [block_min, block_max]; messages' scheme label
    block_min: ClassVar[int] = 2
    block_max: ClassVar[int | None] = None
    label: ClassVar[str] = ""
    #: the value of each 4-bit code (a code-book scheme), else None
    code_book: ClassVar[tuple[float, ...] | None] = None
    #: fields ``inspect`` shows, in order
    shown: ClassVar[tuple[str, ...]] = ("axis", "block_size")

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "tag" in cls.__dict__:
            cls.storage_tags = _tags(cls.storage)
            cls.scale_tags = _tags(getattr(cls, "scale_types", ()))
            rule = cls()
            _BY_TAG[cls.tag] = _BY_MODEL[cls.model] = rule
            if "name" in cls.__dict__:  # a new scheme's name, where reports and inspect read names
                SCHEME_NAMES.setdefault(cls.tag, cls.__dict__["name"])

    @property
    def name(self) -> str:
        """The scheme's name in messages and reports (``SCHEME_NAMES``; a new scheme class may
        set it as a class attribute)."""
        return SCHEME_NAMES[self.tag]

    # -- wire ----------------------------------------------------------------------

    def encode(self, q: Any) -> bytes:
        return self.struct.pack(self.tag, 1, 0, q.axis, q.block_size, q.scale_buffer_index)

    def decode(self, buf: memoryview, pos: int, flags: int, ctx: Ctx) -> Any:
        _, _, _, axis, k, si = self.struct.unpack_from(buf, pos)
        return self.model(axis, k, si)

    # -- checks --------------------------------------------------------------------

    def check_structure(self, q: Any, ctx: Ctx, at: int) -> None:
        """Wire widths of an in-memory scheme."""
        check_int(q.axis, 32, ctx, "quantization.axis", at + 4)
        if self.blocks:
            check_int(q.block_size, 32, ctx, "quantization.block_size", at + 8)
        check_int(q.scale_buffer_index, 32, ctx, "quantization.scale_buffer_index", at + self.scale_index_at)

    def check(self, q: Any, ctx: Ctx, at: int) -> None:
        """Context-free rules (block size range)."""
        k = q.block_size
        if not pow2(k) or k < self.block_min or (self.block_max is not None and k > self.block_max):
            if not pow2(k):
                why = "is not a power of two"
            elif self.block_max is None:
                why = f"is less than {self.block_min}"
            else:
                why = f"is outside [{self.block_min}, {self.block_max}]"
            raise ctx.err(FormatError, f"{self.label}block_size {k} {why}", "quantization.block_size", at + 8)

    def check_in(self, desc: "Descriptor", q: Any, paged: bool, ctx: Ctx, Q: int) -> None:
        """Rules needing the descriptor (``paged``: a block-paged layout)."""
        r = len(desc.shape)
        if q.axis >= r:
            raise ctx.err(InconsistentError, f"axis {q.axis} is not less than rank {r}", "quantization.axis", Q + 4)
        S = desc.shape[q.axis]
        if S is None:
            raise ctx.err(InconsistentError, f"shape[{q.axis}] (the quantization axis) is dynamic", "quantization.axis", Q + 4)
        self.check_axis(desc, q, S, paged, ctx, Q)

    def check_axis(self, desc: "Descriptor", q: Any, S: int, paged: bool, ctx: Ctx, Q: int) -> None:
        """The axis length ``S`` against the block size (and the page size of a paged tensor)."""
        if not paged and S > 0 and q.block_size > S:
            raise ctx.err(InconsistentError, f"block_size {q.block_size} exceeds shape[{q.axis}] = {S}", "quantization.block_size", Q + 8)

    # -- parameter buffers -----------------------------------------------------------

    def scale_type(self, q: Any) -> ElementType:
        return element_type("float32")

    def params(self, q: Any) -> list[tuple[str, int, int]]:
        """(field name, buffer index, relative offset of the index field)."""
        out = [("scale_buffer_index", q.scale_buffer_index, self.scale_index_at)]
        zi = getattr(q, "zero_point_buffer_index", None)
        if zi is not None:
            out.append(("zero_point_buffer_index", zi, self.scale_index_at + 4))
        return out

    def count(self, desc: "Descriptor", q: Any, num_blocks: Callable[["Descriptor"], int | None]) -> int | None:
        """Entries of each parameter buffer: blocks (or channels)."""
        return num_blocks(desc)

    def param_sizes(self, desc: "Descriptor", q: Any, count: int | None) -> list[int] | None:
        """Byte sizes of the parameter buffers, in :meth:`params` order (zero points: i32)."""
        if count is None:
            return None
        return [count * (self.scale_type(q).bits // 8), 4 * count]

    def check_values(self, desc: "Descriptor", q: Any, view: View, fail: Fail, count: int | None) -> None:
        """Parameter-buffer contents (raise through ``fail``)."""

    # -- reports -------------------------------------------------------------------

    def describe(self, q: Any) -> dict[str, Any]:
        """What ``inspect`` shows of ``q``."""
        out: dict[str, Any] = {"scheme": self.name}
        for f in self.shown:
            out[f] = self.scale_type(q).name if f == "scale_type" else getattr(q, f)
        return out


_AFFINE_STORAGE = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int4", "uint4", "int2", "uint2")


class _PerTensor(SchemeRule):
    """``scale · (q − zero_point)`` with one float32 scale and an i32 zero point in the descriptor."""

    tag, model = 0x01, PerTensorAffine
    struct = struct.Struct("<BBHfi4s")  # 16
    storage = _AFFINE_STORAGE
    unit = "tensor"
    blocks = False
    shown = ("scale", "zero_point")

    def encode(self, q: Any) -> bytes:
        return self.struct.pack(self.tag, 1, 0, q.scale, q.zero_point, bytes(4))

    def decode(self, buf: memoryview, pos: int, flags: int, ctx: Ctx) -> Any:
        _, _, _, scale, zp, res = self.struct.unpack_from(buf, pos)
        if res != bytes(4):
            raise ctx.err(FormatError, "reserved bytes must be zero", "quantization._reserved", 12)
        return PerTensorAffine(scale, zp)

    def check_structure(self, q: Any, ctx: Ctx, at: int) -> None:
        check_int(q.zero_point, 32, ctx, "quantization.zero_point", at + 8, signed=True)

    def check(self, q: Any, ctx: Ctx, at: int) -> None:
        with np.errstate(over="ignore", under="ignore"):
            try:
                s32 = float(np.float32(q.scale))
            except (TypeError, ValueError):
                raise ctx.err(FormatError, f"scale {q.scale!r} is not a number", "quantization.scale", at + 4) from None
        if not math.isfinite(s32) or s32 == 0.0:
            raise ctx.err(FormatError, f"per-tensor scale {q.scale!r} (as float32: {s32!r}) must be finite and non-zero", "quantization.scale", at + 4)

    def check_in(self, desc: "Descriptor", q: Any, paged: bool, ctx: Ctx, Q: int) -> None:
        et = desc.element_type
        lo, hi = storage_range(et)
        if not lo <= q.zero_point <= hi:
            raise ctx.err(InconsistentError, f"zero_point {q.zero_point} is outside the {et.name} range [{lo}, {hi}]", "quantization.zero_point", Q + 8)

    def params(self, q: Any) -> list[tuple[str, int, int]]:
        return []


class _Affine(SchemeRule):
    """Per-channel and per-block affine: a SYMMETRIC flag, a zero-point buffer unless set,
    a scale element type in the descriptor."""

    flag_bits = 0x0001
    scale_types: ClassVar[tuple[str, ...]]
    scale_type_at: ClassVar[int]

    def _zero_index(self, flags: int, zi: int, ctx: Ctx) -> int | None:
        """SYMMETRIC iff the zero-point index is 0xFFFFFFFF (errata A6: both mismatches rejected)."""
        at = self.scale_index_at + 4
        if flags & 1 and zi != NONE_U32:
            raise ctx.err(InconsistentError, f"SYMMETRIC is set but zero_point_buffer_index is {zi} (must be 0xFFFFFFFF)", "quantization.zero_point_buffer_index", at)
        if not flags & 1 and zi == NONE_U32:
            raise ctx.err(InconsistentError, "zero_point_buffer_index is 0xFFFFFFFF but SYMMETRIC is not set", "quantization.zero_point_buffer_index", at)
        return None if flags & 1 else zi

    def _reserved(self, res: bytes, ctx: Ctx) -> None:
        if res != bytes(3):
            raise ctx.err(FormatError, "reserved bytes must be zero", "quantization._reserved", self.scale_type_at + 1)

    def check_structure(self, q: Any, ctx: Ctx, at: int) -> None:
        super().check_structure(q, ctx, at)
        si_at = at + self.scale_index_at
        zi = q.zero_point_buffer_index
        if zi is not None:
            check_int(zi, 32, ctx, "quantization.zero_point_buffer_index", si_at + 4)
            if zi == NONE_U32:
                raise ctx.err(InconsistentError, "use zero_point_buffer_index=None for SYMMETRIC", "quantization.zero_point_buffer_index", si_at + 4)
        if not isinstance(q.scale_type, ElementType):
            raise ctx.err(FormatError, f"scale_type {q.scale_type!r} is not an ElementType", "quantization.scale_type", si_at + 8)

    def scale_type(self, q: Any) -> ElementType:
        return q.scale_type  # type: ignore[no-any-return]

    def check_values(self, desc: "Descriptor", q: Any, view: View, fail: Fail, count: int | None) -> None:
        """Scales finite and non-zero (on the IEEE bit patterns)."""
        st = q.scale_type
        item = st.bits // 8
        a = view(q.scale_buffer_index, "<u2" if item == 2 else "<u4")
        i = first_bad_scale(a.reshape(-1), st.name)  # one pass in C where the kernel is built
        if i >= 0:
            value = float(a[i : i + 1].view(st.dtype)[0])
            fail(q.scale_buffer_index, i, item, f"{st.name} scale", f"{value!r} (must be finite and non-zero)")


class _PerChannel(_Affine):
    """One float32 scale (and zero point) per index of the axis."""

    tag, model = 0x02, PerChannelAffine
    struct = struct.Struct("<BBHIIIB3s")  # 20
    storage = _AFFINE_STORAGE
    scale_types = ("float32",)
    scale_type_at = 16
    unit = "channel"
    blocks = False
    scale_index_at = 8
    shown = ("axis", "symmetric", "scale_type")

    def encode(self, q: Any) -> bytes:
        sym = q.zero_point_buffer_index is None
        zp = NONE_U32 if sym else q.zero_point_buffer_index
        return self.struct.pack(self.tag, 1, 1 if sym else 0, q.axis, q.scale_buffer_index, zp, q.scale_type.tag, bytes(3))

    def decode(self, buf: memoryview, pos: int, flags: int, ctx: Ctx) -> Any:
        _, _, _, axis, si, zi, stt, res = self.struct.unpack_from(buf, pos)
        self._reserved(res, ctx)
        zero = self._zero_index(flags, zi, ctx)
        if stt not in self.scale_tags:
            raise ctx.err(FormatError, f"per-channel scale_type_tag {stt:#04x} is not float32 (0x03)", "quantization.scale_type", 16)
        return PerChannelAffine(axis, si, zero, ELEMENT_TYPES_BY_TAG[stt])

    def check(self, q: Any, ctx: Ctx, at: int) -> None:
        if q.scale_type.tag not in self.scale_tags:
            raise ctx.err(FormatError, f"per-channel scale_type {q.scale_type.name} is not float32", "quantization.scale_type", at + 16)

    def check_axis(self, desc: "Descriptor", q: Any, S: int, paged: bool, ctx: Ctx, Q: int) -> None:
        if paged and q.axis == 0:
            raise ctx.err(InconsistentError, "per-channel quantization must not use the paged axis 0", "quantization.axis", Q + 4)

    def count(self, desc: "Descriptor", q: Any, num_blocks: Callable[["Descriptor"], int | None]) -> int | None:
        return desc.shape[q.axis] if q.axis < len(desc.shape) else None

    def check_values(self, desc: "Descriptor", q: Any, view: View, fail: Fail, count: int | None) -> None:
        """Scales, then zero points within the storage type's range."""
        super().check_values(desc, q, view, fail, count)
        if q.zero_point_buffer_index is None:
            return
        # a zero-point array sharing the scale buffer follows the scales ([scales | zero_points])
        shared = q.zero_point_buffer_index == q.scale_buffer_index
        z = view(q.zero_point_buffer_index, "<i4", (count or 0) if shared else 0)
        lo, hi = storage_range(desc.element_type)
        j = first_bad(z, lambda c: (c < lo) | (c > hi))
        if j is not None:
            fail(q.zero_point_buffer_index, j, 4, "zero point", f"{int(z[j])}, outside the {desc.element_type.name} range [{lo}, {hi}]",
                 start=4 * (count or 0) if shared else 0)


class _PerBlock(_Affine):
    """One scale (float16 / bfloat16 / float32) and zero point per block of the axis."""

    tag, model = 0x03, PerBlockAffine
    struct = struct.Struct("<BBHIIIIB3s")  # 24
    storage = ("int8", "uint8", "int4", "uint4", "int2", "uint2")
    scale_types = ("float16", "bfloat16", "float32")
    scale_type_at = 20
    padded = True
    shown = ("axis", "block_size", "symmetric", "scale_type")

    def encode(self, q: Any) -> bytes:
        sym = q.zero_point_buffer_index is None
        zp = NONE_U32 if sym else q.zero_point_buffer_index
        return self.struct.pack(
            self.tag, 1, 1 if sym else 0, q.axis, q.block_size, q.scale_buffer_index, zp, q.scale_type.tag, bytes(3)
        )

    def decode(self, buf: memoryview, pos: int, flags: int, ctx: Ctx) -> Any:
        _, _, _, axis, k, si, zi, stt, res = self.struct.unpack_from(buf, pos)
        self._reserved(res, ctx)
        zero = self._zero_index(flags, zi, ctx)
        if stt not in self.scale_tags:
            raise ctx.err(FormatError, f"per-block scale_type_tag {stt:#04x} is not float16, bfloat16 or float32", "quantization.scale_type", 20)
        return PerBlockAffine(axis, k, si, zero, ELEMENT_TYPES_BY_TAG[stt])

    def check(self, q: Any, ctx: Ctx, at: int) -> None:
        st = q.scale_type
        if st.tag not in self.scale_tags or ELEMENT_TYPES_BY_TAG.get(st.tag) != st:
            raise ctx.err(FormatError, f"per-block scale_type {st.name} is not float16, bfloat16 or float32", "quantization.scale_type", at + 20)
        super().check(q, ctx, at)

    def check_axis(self, desc: "Descriptor", q: Any, S: int, paged: bool, ctx: Ctx, Q: int) -> None:
        layout = desc.layout
        if paged and (q.axis != 0 or q.block_size != layout.page_size):  # type: ignore[union-attr]
            raise ctx.err(InconsistentError, f"block-paged per-block quantization needs axis 0 and block_size == page_size {layout.page_size}", "quantization.block_size" if q.axis == 0 else "quantization.axis", Q + (8 if q.axis == 0 else 4))  # type: ignore[union-attr]
        super().check_axis(desc, q, S, paged, ctx, Q)


class _NF4(SchemeRule):
    """``float32(absmax) · code_book[q]`` over uint4 codes, one absmax per block."""

    tag, model = 0x04, NF4
    struct = struct.Struct("<BBHIII")  # 16
    storage = ("uint4",)
    padded = True
    block_min = 8
    label = "NF4 "
    #: the NF4 code book, verbatim from quantization/nf4.md (float32)
    code_book = (
        -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
        -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
        0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
        0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
    )

    def check_values(self, desc: "Descriptor", q: Any, view: View, fail: Fail, count: int | None) -> None:
        """absmax scales finite and >= 0."""
        a = view(q.scale_buffer_index, "<u4")
        i = first_bad(a, lambda c: ((c & 0x7F800000) == 0x7F800000) | ((c >> 31).astype(bool) & ((c & 0x7FFFFFFF) != 0)))
        if i is not None:
            fail(q.scale_buffer_index, i, 4, "NF4 absmax scale", f"{float(a[i:i + 1].view('<f4')[0])!r} (must be finite and >= 0)")


class _MXFP(SchemeRule):
    """``2^(e−127) · value(q)``: one float8_e8m0 scale per block; the axis a multiple of the block."""

    tag, model = 0x05, MXFP
    struct = struct.Struct("<BBHIII")  # 16
    storage = ("float8_e4m3", "float8_e5m2", "float4_e2m1", "float6_e2m3", "float6_e3m2", "int8", "int4")
    block_min = 16
    block_max = 2048
    label = "MXFP "
    shown = ("axis", "block_size", "scale_type")

    def check_axis(self, desc: "Descriptor", q: Any, S: int, paged: bool, ctx: Ctx, Q: int) -> None:
        if S == 0 or S % q.block_size:
            raise ctx.err(InconsistentError, f"shape[{q.axis}] = {S} is not a positive multiple of block_size {q.block_size}", "quantization.block_size", Q + 8)

    def scale_type(self, q: Any) -> ElementType:
        return element_type("float8_e8m0")

    def check_values(self, desc: "Descriptor", q: Any, view: View, fail: Fail, count: int | None) -> None:
        """Scale bytes never 0x00 or 0xFF."""
        a = view(q.scale_buffer_index, "u1")
        i = first_bad(a, e8m0_reserved)
        if i is not None:
            fail(q.scale_buffer_index, i, 1, "MXFP scale byte", f"{int(a[i]):#04x} (reserved in float8_e8m0)")
