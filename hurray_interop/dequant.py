"""The one shared dequantizer: any dense or composite Hurray tensor → float32 values.

Every verification path calls this module.  It knows only the core model
(:mod:`hurray_interop.core`) and computes, bit for bit, what the Hurray
specification (with the seeds and the project's errata decisions in
``docs/conversion-rules.md``) says a tensor's values are:

* plain types: float16/bfloat16/float32/float64, integers and bool are cast to
  float32 (float64 and integers wider than 24 bits round to nearest-even);
  bfloat16 widens bit for bit (the high half of a float32); float8_e4m3, float8_e5m2,
  float8_e8m0 (``2^(e-127)``), float6_e2m3/e3m2 and float4_e2m1 decode through the OCP
  value maps (computed from the formats by
  :func:`~hurray_interop.core.elements.code_values` and tabulated once per type -- ml_dtypes'
  casts are the tests' oracle, and its 0.6 s import stays out of the dequantizer; codes are
  masked to the type's width so stray bits in a packed byte cannot leak in);
* per-tensor / per-channel / per-block affine: ``float32(s) * float32(q - z)``,
  ``q - z`` exact in integers, then one float32 rounding, then one float32
  multiply (f16/bf16 scales widen losslessly) — identical to numpy's
  ``np.float32(s) * np.float32(q - z)`` per element;
* NF4: ``float32(absmax) * LUT[q]`` with the specification's LUT verbatim;
* MXFP: ``2^(e-127) * value(q)`` in float32 (exact, subnormal results kept);
* layouts row-major, column-major and strided (strides in logical elements,
  ``byte_offset``, sub-byte types addressed per element, 6-bit types per
  3-byte group); along zero-stride (broadcast) axes each stored code is fetched
  and decoded once and its value broadcast, and a member whose strides are all 0
  (the compact forms' broadcast minimum, docs/conversion-rules.md § 11) is one
  value per block, added straight into an add-overlay's accumulator;
* composites: partition (members tile the head by their shard offsets) and
  sealed overlay (``replace``: later wins; ``add``: base + corrections),
  evaluated in the head's element type (float16/bfloat16 heads round after
  every step; float32 is the working type), nested up to depth 8.

Per-block affine partial trailing blocks are read as the seed describes (each
outer row stores ``ceil(S/K)·K`` elements along the axis, padding ignored) when
the data buffer is that large (also when both sizes round to the same bytes),
otherwise as the contiguous ``shape``-sized buffer (``docs/conversion-rules.md`` § 6).

Large tensors are evaluated on up to two threads by default (``threads=``):
disjoint regions of the output, numpy releasing the GIL inside the gathers and
ufuncs that do the work; the result is identical for any thread count.

Work proceeds in *regions*: contiguous runs of the logical row-major order of
the form ``tensor[i0, …, i(d-1), a:b, :, …, :]``.  :func:`iter_dequantize`
yields such regions of at most ``max_elements`` values each (so a 10 GB tensor
needs only a few chunks of RAM); each region is itself evaluated in
cache-sized pieces with reused work buffers.  4-bit float codes (float4_e2m1,
NF4) decode through a 256-entry byte → two-float32 table, 2-bit codes through a
byte → four-float32 table, 4-bit integer codes through the core's unpacking
(:func:`~hurray_interop.core.elements.unpack`, faster than any gather numpy offers).

Validation is the core's, before any data is touched: the descriptor rules
(:func:`~hurray_interop.core.descriptor.validate_descriptor`: storage types per
scheme, block sizes, axes, parameter-buffer indices and sizes, the data size),
every byte a strided layout addresses (``validate_addressed_range``), the buffer
contents against the buffer table, the composite rules
(:func:`~hurray_interop.core.composite.validate_composite`) and, when strict (the
default), the parameter values
(:func:`~hurray_interop.core.descriptor.validate_parameter_values`: scales finite
and non-zero, NF4 absmax finite and ≥ 0, MXFP scale bytes never 0x00/0xFF,
per-channel zero points within the storage range).  ``strict=False`` skips only
the parameter values and the float8_e8m0 data bytes 0x00/0xFF.

The forms every GGML type imports to -- per-block affine and MXFP along the last axis,
rows of whole blocks, codes of 1/2/4/8 bits stored row-major (or one broadcast code), and
the sealed overlays ``add`` of such members evaluated in float32 -- run on the compiled path
where the optional kernel is loaded (``hk_dequant`` in ``_kernel.c``, through
:func:`hurray_interop.kernels.dequant_window`; plain float16/bfloat16 tensors too, a
:class:`~hurray_interop.kernels.HalvesPlan`): every member of an overlay in one pass,
block by block, with numpy's operations in numpy's order (NaN payloads included), so the
numpy evaluation below is its byte-identical twin (tests/test_dequant_kernel.py).
:func:`windows` evaluates a tensor window by window into buffers the caller reuses (what
``verify``'s value check runs on every core).

Hand-written on numpy: no library evaluates Hurray
descriptors, and the per-format decoders that exist (gguf-py, torchao) cover one
layout each — they serve as the independent oracles in the tests instead.

Anything that cannot be evaluated raises the project's errors naming the
tensor: :class:`~hurray_interop.errors.UnsupportedError` for sparse, tiled,
Morton, block-paged, Hilbert, private layouts, group composites, complex and
float128 values and dynamic dimensions; :class:`~hurray_interop.errors.FormatError`
(or a subclass) for descriptors or buffers that break the specification.
"""

from __future__ import annotations

import bisect
import functools
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from . import kernels, parallel
from .core.composite import check_nesting, validate_composite
from .core.descriptor import (
    blocks_per_axis,
    check_buffer_sizes,
    padded_byte_size,
    validate_addressed_range,
    validate_descriptor,
    validate_parameter_values,
)
from .core.elements import code_values, e8m0_reserved, element_type, sign_extend, unpack, unpack_at
from .core.model import (
    OP_ADD,
    RULE_GROUP,
    RULE_OVERLAY,
    CompositeHead,
    Descriptor,
    Tensor,
    as_u8,
)
from .core.layouts import rule_of as layout_of
from .core.schemes import code_books, rule_of as scheme_of
from .errors import FormatError, UnsupportedError, UsageError

__all__ = ["dequantize", "iter_dequantize", "windows", "Windows", "NF4_LUT", "DEFAULT_MAX_ELEMENTS"]

#: Default upper bound on the values :func:`iter_dequantize` yields per chunk (64 MiB of float32).
DEFAULT_MAX_ELEMENTS = 1 << 24
#: Values evaluated per inner step: 256 Ki float32 = 1 MiB, so temporaries stay in L2.
_PIECE = 1 << 18
#: Values per parallel job; tensors below two jobs' worth run on the calling thread.
_PARALLEL_GRAIN = 1 << 21

_F32 = np.dtype(np.float32)

@functools.cache
def _code_book(scheme: str) -> np.ndarray:
    """float32 value of each code of a code-book scheme (its class's ``code_book``)."""
    table = np.array(code_books()[scheme], dtype=np.float32)
    table.flags.writeable = False
    return table


#: The NF4 code book (quantization/nf4.md), as float32: the NF4 scheme class's ``code_book``.
NF4_LUT = _code_book("NF4")


# ---------------------------------------------------------------------------
# value tables


@functools.cache
def _code_values(name: str) -> np.ndarray:
    """float32 value of every code of an element type of at most 8 bits (index = code)."""
    et = element_type(name)
    n = 1 << et.bits
    codes = np.arange(n, dtype=np.uint8)
    if et.kind == "bool":
        table = codes.astype(np.float32)
    elif et.kind == "int":
        table = sign_extend(codes, et.bits).astype(np.float32)
    elif et.kind == "uint":
        table = codes.astype(np.float32)
    elif name == "float8_e8m0":
        # 2^(e-127) built from the float32 bit pattern; e = 0 is the subnormal 2^-127, 0xFF NaN.
        bits = np.where(codes == 0, np.uint32(1 << 22), codes.astype(np.uint32) << np.uint32(23))
        bits = np.where(codes == 0xFF, np.uint32(0x7FC00000), bits)
        table = bits.astype(np.uint32).view(np.float32)
    else:  # OCP small floats: their values computed from the format (no ml_dtypes import)
        table = code_values(et)
    table = np.ascontiguousarray(table, dtype=np.float32)
    table.flags.writeable = False
    return table


@functools.cache
def _byte_table(values_key: str) -> np.ndarray:
    """Byte → the values of all codes packed in it, LSB-first: shape (256, 8 // bits)."""
    values = _values_by_key(values_key)
    et = element_type({16: "uint4", 4: "uint2", 2: "bool"}[values.size])
    per = 8 // et.bits
    codes = unpack(np.arange(256, dtype=np.uint8), et, 256 * per).reshape(256, per)
    table = np.ascontiguousarray(values[codes.view(np.uint8)], dtype=np.float32)
    table.flags.writeable = False
    return table


def _values_by_key(key: str) -> np.ndarray:
    """The values of an element type's codes, or of a code-book scheme's (keyed by its name)."""
    return _code_book(key) if key in code_books() else _code_values(key)


# ---------------------------------------------------------------------------
# small helpers


def _prod(xs) -> int:
    return math.prod(int(x) for x in xs)


def _ravel(shape, index) -> int:
    """Row-major linear index of ``index`` (a prefix of full length) within ``shape``."""
    r = 0
    for n, i in zip(shape, index):
        r = r * int(n) + int(i)
    return r


def _linear(shape, d: int, prefix, a: int) -> int:
    """Row-major linear index of ``[*prefix, a, 0, …, 0]``."""
    return _ravel(shape[: d + 1], (*prefix, a)) * _prod(shape[d + 1 :])


@functools.cache
def _raw_dtype(name: str) -> np.dtype:
    """The dtype the codes of a byte-addressable element type are read as: its own where numpy
    has it, else (bfloat16, float8: ml_dtypes' types) the unsigned integer of its width -- the
    decoder reads their bits, and ml_dtypes' import (0.6 s) is never paid here."""
    et = element_type(name)
    try:
        return np.dtype(et.numpy)
    except TypeError:
        return np.dtype(f"<u{et.bits // 8}")


def _view_reshape(a: np.ndarray, shape) -> np.ndarray:
    return np.reshape(a, shape, copy=False)


def _regions(shape, budget: int, d: int = 0, prefix=(), lo: int = 0, hi: int | None = None,
             align_dim: int = -1, align: int = 1) -> Iterator[tuple[int, tuple[int, ...], int, int]]:
    """Split ``tensor[*prefix, lo:hi, …]`` into regions ``(d, prefix, a, b)`` of at most
    ``budget`` values (one row of the last dimension is split if it must be).  Steps along
    ``align_dim`` are multiples of ``align`` (block boundaries)."""
    if hi is None:
        hi = shape[d]
    inner = _prod(shape[d + 1 :])
    if hi <= lo or inner == 0:
        return
    if inner <= budget or d == len(shape) - 1:
        step = max(1, budget // max(inner, 1))
        if d == align_dim and align > 1 and step >= align:
            step = step // align * align  # whole blocks per step when the budget allows
        for a in range(lo, hi, step):
            yield d, prefix, a, min(hi, a + step)
    else:
        for i in range(lo, hi):
            yield from _regions(shape, budget, d + 1, (*prefix, i), 0, None, align_dim, align)


def _box3(shape, axis: int, d: int, prefix, a: int, b: int) -> tuple[int, int, int, int, int, int]:
    """The region as a box ``(p0, p1, s0, s1, q0, q1)`` of the tensor viewed as
    ``(prod(shape[:axis]), shape[axis], prod(shape[axis+1:]))``; its row-major order
    equals the region's."""
    if axis > d:
        p0 = _linear(shape[:axis], d, prefix, a)
        return p0, p0 + (b - a) * _prod(shape[d + 1 : axis]), 0, shape[axis], 0, _prod(shape[axis + 1 :])
    if axis == d:
        p0 = _ravel(shape[:d], prefix)
        return p0, p0 + 1, a, b, 0, _prod(shape[d + 1 :])
    p0 = _ravel(shape[:axis], prefix[:axis])
    s0 = prefix[axis]
    q0 = _linear(shape[axis + 1 :], d - axis - 1, prefix[axis + 1 :], a)
    return p0, p0 + 1, s0, s0 + 1, q0, q0 + (b - a) * _prod(shape[d + 1 :])


@dataclass(frozen=True)
class _ParamPlane:
    """A per-block (or per-channel) parameter array viewed as ``(P, Q, nb)``."""

    raw: np.ndarray  # (P, Q, nb) zero-copy view of the parameter buffer
    convert: Callable[[np.ndarray], np.ndarray]

    def get(self, p0: int, p1: int, q0: int, q1: int, b0: int, b1: int) -> np.ndarray:
        """Values for blocks ``b0:b1`` of the box, shaped ``(P, nblk, Q)``."""
        return self.convert(self.raw[p0:p1, q0:q1, b0:b1]).transpose(0, 2, 1)


# ---------------------------------------------------------------------------
# dense tensors


class _Dense:
    """Evaluates one dense (row-major / column-major / strided) tensor region by region.
    The tensor has passed :func:`_validate`."""

    def __init__(self, t: Tensor, strict: bool) -> None:
        self.name = t.name
        desc = t.descriptor
        self.desc = desc
        self.strict = strict
        self.logical_shape: tuple[int, ...] = tuple(int(n) for n in desc.shape)  # type: ignore[arg-type]
        self.shape = self.logical_shape or (1,)
        self.size = _prod(self.shape)
        self.et = desc.element_type
        self.q = desc.quantization
        self.bufs = tuple(as_u8(b) for b in t.data)
        self.byte_offset = int(desc.byte_offset)
        # ---- the scheme: value table, axis geometry, parameter planes
        self.values_key = self.et.name
        self.axis = -1
        self.block = 1
        self.scale: _ParamPlane | None = None
        self.zero: _ParamPlane | None = None
        if self.q is not None:
            self._prepare_scheme(self.q)
        # ---- storage geometry and addressing
        self._prepare_layout(desc.layout)
        # ---- the compiled path (kernels.dequant_window) where the tensor fits it
        self.spec = self._compiled_spec()

    @functools.cached_property
    def plan(self) -> "kernels.Plan | None":
        """The compiled plan of this tensor alone (its spec's, or a plain float16/bfloat16
        tensor's), built when first asked for: an overlay's members are evaluated through the
        overlay's plan (their specs) and never need theirs."""
        if self.spec is not None:
            return kernels.dequant_plan([self.spec], self.size)
        return self._halves_plan()

    # -- scheme ------------------------------------------------------------------

    def _prepare_scheme(self, q) -> None:
        """What the scheme's class says: one scale for the tensor, per channel or per block;
        the scales' element type; a code book replacing the storage type's values."""
        rule = scheme_of(q)
        self.unit = rule.unit
        if rule.unit == "tensor":
            self.pt_scale = np.float32(q.scale)
            self.pt_zero = int(q.zero_point)
            return
        if getattr(q, "zero_point_buffer_index", None) == q.scale_buffer_index:
            raise UnsupportedError("scale and zero point sharing one buffer is not supported "
                                   "(the specification contradicts itself on its layout)",
                                   tensor=self.name, field="quantization.zero_point_buffer_index")
        shape = self.shape
        axis = self.axis = int(q.axis)
        S = shape[axis]
        P, Q = _prod(shape[:axis]), _prod(shape[axis + 1 :])
        st = rule.scale_type(q)
        if st.bits == 8:  # float8_e8m0: a value table
            sraw, convert = self.bufs[q.scale_buffer_index], functools.partial(_table_scales, st.name)
        else:
            sraw, convert = self.bufs[q.scale_buffer_index].view(_raw_dtype(st.name).newbyteorder("<")), _to_f32
        if rule.unit == "channel":
            shape3 = (P, Q, S)
            self.scale = _ParamPlane(np.lib.stride_tricks.as_strided(sraw, shape3, (0, 0, sraw.strides[0])), convert)
        else:
            self.block = int(q.block_size)
            shape3 = (P, Q, blocks_per_axis(self.desc))
            self.scale = _ParamPlane(sraw.reshape(shape3), convert)
        if rule.code_book is not None:
            self.values_key = rule.name
        if getattr(q, "zero_point_buffer_index", None) is not None:
            self._zero_plane(q, shape3, broadcast=rule.unit == "channel")

    def _zero_plane(self, q, shape3, broadcast: bool) -> None:
        zraw = self.bufs[q.zero_point_buffer_index].view("<i4")
        if broadcast:
            zraw = np.lib.stride_tricks.as_strided(zraw, shape3, (0, 0, zraw.strides[0]))
        else:
            zraw = zraw.reshape(shape3)
        self.zero = _ParamPlane(zraw, lambda z: z.astype(np.int64))

    # -- layout ----------------------------------------------------------------

    def _prepare_layout(self, layout) -> None:
        et = self.et
        shape = self.shape
        # the storage shape: the seed's padded partial trailing block when the buffer has room
        ss = shape
        padded = padded_byte_size(self.desc)
        if padded is not None and self.bufs[0].size - self.byte_offset >= padded:
            ss = tuple(-(-n // self.block) * self.block if k == self.axis else n for k, n in enumerate(shape))
        self.storage_shape = ss
        strides, self.row_major = layout_of(layout).element_strides(layout, shape, ss)
        self.strides = strides
        # broadcast (zero-stride) axes: codes are fetched once along them, then broadcast
        self.broadcast = not self.row_major and any(st == 0 for st in strides)
        self.constant = not self.row_major and all(st == 0 for st in strides)
        if self.size == 0:
            return
        if not et.packed and not self.row_major:
            isz = et.bits // 8
            self.full_view = np.ndarray(shape=shape, dtype=_raw_dtype(et.name), buffer=self.bufs[0], offset=self.byte_offset,
                                        strides=tuple(s * isz for s in strides))
        if et.name == "float8_e8m0" and self.strict and self.q is None:
            self._check_e8m0_data()

    def _check_e8m0_data(self) -> None:
        for d, prefix, a, b in _regions(self.shape, DEFAULT_MAX_ELEMENTS):
            raw = self._raw(d, prefix, a, b)
            raw = raw.view(np.uint8)
            if e8m0_reserved(raw).any():
                raise FormatError("float8_e8m0 data holds 0x00 or 0xFF (reserved)", tensor=self.name, field="data")

    def _compiled_spec(self) -> dict | None:
        """This tensor as one member of a compiled dequantization (kernels.dequant_plan), or
        None: per-block schemes along the last axis, rows of whole blocks, codes of 1/2/4/8
        bits stored row-major (or one code: strides all 0), integer codes or a value table
        (float codes, code books) without a zero point, scales float16/bfloat16/float32/
        float8_e8m0.  Anything else stays on the numpy path below -- the compiled path's twin."""
        q, et = self.q, self.et
        if (kernels.KERNEL != "c" or q is None or self.unit != "block" or self.size == 0
                or self.axis != len(self.shape) - 1 or self.shape[self.axis] % self.block
                or et.bits not in (1, 2, 4, 8) or not (et.packed or et.bits == 8)
                or not (self.constant or (self.row_major and self.storage_shape == self.shape))):
            return None
        st = scheme_of(q).scale_type(q)
        if st.name not in kernels.DQ_SCALE_KINDS:
            return None
        integer = et.kind in ("int", "uint", "bool") and self.values_key == et.name
        raw = self.bufs[q.scale_buffer_index]
        scale = raw if st.bits == 8 else raw.view({16: "<u2", 32: "<f4"}[st.bits])
        zbi = getattr(q, "zero_point_buffer_index", None)
        stables = {"float16": _f16_table, "float8_e8m0": lambda: _code_values("float8_e8m0")}
        return {"codes": self.bufs[0][self.byte_offset :], "scale": scale, "scale_kind": st.name,
                "stable": stables[st.name]() if st.name in stables else None,
                "zero": self.bufs[zbi].view("<i4") if zbi is not None else None,
                "table": None if integer else _values_by_key(self.values_key),
                "block": self.block, "bits": et.bits, "signed": et.kind == "int", "constant": self.constant}

    def _halves_plan(self) -> "kernels.HalvesPlan | None":
        """The compiled plan of a row-major float16/bfloat16 tensor without a scheme (its
        16-bit patterns from element 0; the same values as :meth:`_decode`'s cast and shift),
        or None."""
        et = self.et
        if (not kernels.loaded() or self.q is not None or et.name not in kernels.HALF_KINDS or not self.row_major
                or self.size == 0 or self.storage_shape != self.shape):
            return None
        raw = self.bufs[0][self.byte_offset : self.byte_offset + 2 * self.size]
        if raw.size != 2 * self.size or raw.ctypes.data % 2:
            return None
        return kernels.halves_plan(raw.view("<u2"), et.name, _f16_table() if et.name == "float16" else None)

    # -- fetching codes ----------------------------------------------------------

    def _offsets(self, d: int, prefix, a: int, b: int) -> np.ndarray:
        """Element offsets (relative to byte_offset) of the region, int64, flat."""
        st = self.strides
        base = sum(int(i) * s for i, s in zip(prefix, st))
        off = np.arange(a, b, dtype=np.int64) * st[d] + base
        for k in range(d + 1, len(self.shape)):
            off = off[..., None] + np.arange(self.shape[k], dtype=np.int64) * st[k]
        return off.reshape(-1)

    def _region_grid(self, d: int, a: int, b: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The region's shape ``(b - a, *shape[d+1:])`` and that shape with every zero-stride
        axis cut to 1 (the codes it really stores)."""
        full = (b - a, *self.shape[d + 1 :])
        return full, tuple(1 if st == 0 else n for n, st in zip(full, self.strides[d:]))

    def _reduced_codes(self, d: int, prefix, a: int, b: int) -> np.ndarray:
        """Raw codes of the region over its reduced grid (:meth:`_region_grid`): each stored
        code once, without an element-sized offset array or gather."""
        full, small = self._region_grid(d, a, b)
        if not self.et.packed:
            view = self.full_view[(*prefix, slice(a, b))]
            return view[tuple(slice(0, k) for k in small)]
        st = self.strides
        off = np.int64(sum(int(i) * s for i, s in zip(prefix, st)) + a * st[d])
        grid = np.zeros(small, dtype=np.int64) + off
        for k, (n, s) in enumerate(zip(small, st[d:])):
            if n > 1:
                grid += (np.arange(n, dtype=np.int64) * s).reshape((n,) + (1,) * (len(small) - k - 1))
        return self._gather_packed(grid)

    def _broadcast_flat(self, small: np.ndarray, full: tuple[int, ...], dst: np.ndarray | None) -> np.ndarray:
        """``small`` broadcast to the region, flat: a zero-stride view when every axis is a
        broadcast, else copied once (into ``dst`` when given)."""
        n = _prod(full)
        if small.size == 1:
            return np.broadcast_to(small.reshape(1), (n,))
        if dst is None:
            return np.ascontiguousarray(np.broadcast_to(small, full)).reshape(-1)
        np.copyto(_view_reshape(dst[:n], full), small, casting="unsafe")
        return dst[:n]

    def _raw(self, d: int, prefix, a: int, b: int) -> np.ndarray:
        """Raw codes of the region, flat: uint8 codes for sub-byte types, else the element dtype."""
        et = self.et
        if self.broadcast:
            return self._broadcast_flat(self._reduced_codes(d, prefix, a, b), self._region_grid(d, a, b)[0], None)
        n = (b - a) * _prod(self.shape[d + 1 :])
        buf = self.bufs[0]
        bo = self.byte_offset
        if not et.packed:
            if not self.row_major:
                return np.ascontiguousarray(self.full_view[(*prefix, slice(a, b))]).reshape(-1)
            isz = et.bits // 8
            if self.storage_shape == self.shape or self.axis <= d:
                L0 = _linear(self.storage_shape, d, prefix, a)
                return buf[bo + L0 * isz : bo + (L0 + n) * isz].view(_raw_dtype(et.name))
            return self._padded_rows(d, prefix, a, b)
        if self.row_major:
            if self.storage_shape != self.shape and self.axis > d:
                return self._padded_rows(d, prefix, a, b)
            L0 = _linear(self.storage_shape, d, prefix, a)
            return self._unpack_range(L0, n)
        return self._gather_packed(self._offsets(d, prefix, a, b))

    def _padded_rows(self, d: int, prefix, a: int, b: int) -> np.ndarray:
        """Rows of a padded-block buffer: fetch storage rows, drop the padding along the axis."""
        ss = self.storage_shape
        et = self.et
        L0 = _linear(ss, d, prefix, a)
        n = (b - a) * _prod(ss[d + 1 :])
        if et.packed:
            codes = self._unpack_range(L0, n)
        else:
            isz = et.bits // 8
            bo = self.byte_offset
            codes = self.bufs[0][bo + L0 * isz : bo + (L0 + n) * isz].view(_raw_dtype(et.name))
        codes = codes.reshape((b - a, *ss[d + 1 :]))
        index = [slice(None)] * codes.ndim
        index[self.axis - d] = slice(0, self.shape[self.axis])
        return np.ascontiguousarray(codes[tuple(index)]).reshape(-1)

    def _unpack_range(self, L0: int, n: int) -> np.ndarray:
        """uint8 codes of contiguous elements ``L0 .. L0+n`` (row-major storage order)."""
        et = self.et
        per, step = (4, 3) if et.bits == 6 else (8 // et.bits, 1)  # elements, bytes per packing unit
        k0 = L0 // per
        phase = L0 - per * k0
        k1 = -(-(L0 + n) // per)
        bo = self.byte_offset
        codes = unpack(self.bufs[0][bo + step * k0 : bo + step * k1], et, phase + n)
        return codes.view(np.uint8)[phase:]

    def _gather_packed(self, off: np.ndarray) -> np.ndarray:
        """uint8 codes of sub-byte elements at arbitrary element offsets."""
        return unpack_at(self.bufs[0], self.et, off, self.byte_offset)

    def _values(self, d: int, prefix, a: int, b: int, dst: np.ndarray) -> np.ndarray:
        """float32 values of the stored codes (before any scale), flat; written to ``dst``
        when possible (``dst`` has room for the region plus 8 values)."""
        et = self.et
        n = (b - a) * _prod(self.shape[d + 1 :])
        if (et.bits in (2, 4) and self.row_major
                and (self.storage_shape == self.shape or self.axis <= d)):
            # byte → 2 / 4 values table: one gather per byte
            L0 = _linear(self.storage_shape, d, prefix, a)
            per = 8 // et.bits
            k0 = L0 // per
            phase = L0 - per * k0
            k1 = -(-(L0 + n) // per)
            bo = self.byte_offset
            b8 = self.bufs[0][bo + k0 : bo + k1]
            if et.bits == 4 and et.kind in ("int", "uint") and self.values_key == et.name:
                codes = unpack(b8, et, phase + n)[phase:]  # 4-bit integers: faster than a table gather
                np.copyto(dst[:n], sign_extend(codes, 4) if et.kind == "int" else codes, casting="unsafe")
                return dst[:n]
            table = _byte_table(self.values_key)
            if phase == 0 and dst.flags.c_contiguous and dst.size >= b8.size * per:
                target = _view_reshape(dst[: b8.size * per], (b8.size, per))
                np.take(table, b8, axis=0, out=target, mode="clip")
                return dst[:n]
            return np.take(table, b8, axis=0, mode="clip").reshape(-1)[phase : phase + n]
        if self.broadcast:  # decode each stored code once, then broadcast the values
            small = self._reduced_codes(d, prefix, a, b)
            values = self._decode(small, np.empty(small.shape, dtype=np.float32))
            return self._broadcast_flat(values, self._region_grid(d, a, b)[0], dst)
        return self._decode(self._raw(d, prefix, a, b), dst[:n])

    def _decode(self, raw: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """float32 values of the raw codes ``raw`` written to ``dst`` (its shape)."""
        et = self.et
        if et.packed or et.bits == 8 and et.kind not in ("int", "uint"):
            table = _values_by_key(self.values_key)
            np.take(table, raw if raw.dtype == np.uint8 else raw.view(np.uint8), out=dst, mode="clip")
        elif et.kind == "float" and raw.dtype.kind == "u":  # bfloat16: the high half of a float32
            bits = dst.view(np.uint32)
            np.copyto(bits, raw, casting="unsafe")
            np.left_shift(bits, np.uint32(16), out=bits)
        else:
            np.copyto(dst, raw, casting="unsafe")
        return dst

    def _ints(self, d: int, prefix, a: int, b: int) -> np.ndarray:
        """Integer codes of the region as int64 (affine storage only)."""
        raw = self._reduced_codes(d, prefix, a, b) if self.broadcast else self._raw(d, prefix, a, b)
        if self.et.packed and self.et.kind == "int":
            raw = sign_extend(raw, self.et.bits)
        raw = raw.astype(np.int64)
        if self.broadcast:
            return self._broadcast_flat(raw, self._region_grid(d, a, b)[0], None)
        return raw

    # -- evaluation --------------------------------------------------------------

    @property
    def align(self) -> tuple[int, int]:
        return (self.axis, self.block) if self.block > 1 else (-1, 1)

    @property
    def accumulates(self) -> bool:
        """Whether an overlay may add this member straight into its accumulator
        (``fill(..., accumulate=True)``): a constant member (strides all 0) without a scheme or
        per-block affine, whose window is one value per block repeated, never materialized."""
        return self.constant and (self.q is None or self.unit == "block")

    def fill(self, d: int, prefix, a: int, b: int, out: np.ndarray, work: "_Work", accumulate: bool = False) -> None:
        """Write the region's float32 values into the flat contiguous ``out`` (``accumulate``:
        add them to what ``out`` holds; only where :attr:`accumulates`)."""
        assert not accumulate or self.accumulates
        inner = _prod(self.shape[d + 1 :])
        if self.plan is not None and not accumulate:
            kernels.dequant_window(self.plan, _linear(self.shape, d, prefix, a), out[: (b - a) * inner])
            return
        pos = 0
        ad, al = self.align
        for rd, rp, ra, rb in _regions(self.shape, _PIECE, d, prefix, a, b, ad, al):
            n = (rb - ra) * _prod(self.shape[rd + 1 :])
            scratch = work.buffer(self, n + 8)
            with np.errstate(over="ignore", invalid="ignore", under="ignore"):  # inf/NaN results are values
                self._piece(rd, rp, ra, rb, out[pos : pos + n], scratch, accumulate)
            pos += n
        assert pos == (b - a) * inner

    def _piece(self, d: int, prefix, a: int, b: int, out: np.ndarray, scratch: np.ndarray,
               accumulate: bool = False) -> None:
        q = self.q
        if q is None:
            v = self._values(d, prefix, a, b, scratch if accumulate else out)
            if accumulate:
                np.add(out, v, out=out)
            elif not _same(v, out):
                out[...] = v
            return
        if self.unit == "tensor":
            z = self.pt_zero
            if self.et.bits <= 16 and abs(z) <= (1 << 24) - (1 << 16):
                v = self._values(d, prefix, a, b, scratch)
                if z:
                    np.subtract(v, np.float32(z), out=out)
                    np.multiply(out, self.pt_scale, out=out)
                else:
                    np.multiply(v, self.pt_scale, out=out)
            else:
                diff = self._ints(d, prefix, a, b) - z
                np.multiply(diff.astype(np.float32), self.pt_scale, out=out)
            return
        box = _box3(self.shape, self.axis, d, prefix, a, b)
        p0, p1, s0, s1, q0, q1 = box
        use_int = False
        if self.zero is not None:
            zmax_ok = self.et.bits <= 16
            if zmax_ok:
                zr = self.zero.raw[p0:p1, q0:q1, s0 // self.block : -(-s1 // self.block)]
                if zr.size and int(np.abs(zr.astype(np.int64)).max()) > (1 << 24) - (1 << 16):
                    zmax_ok = False
            use_int = not zmax_ok
        v = self._ints(d, prefix, a, b) if use_int else self._values(d, prefix, a, b, scratch)
        self._blocks(v, out, box, use_int, accumulate)

    def _blocks(self, v: np.ndarray, out: np.ndarray, box, use_int: bool, accumulate: bool) -> None:
        """``out`` = per-block ``s·(v − z)`` over the box (``accumulate``: added to ``out``).  A
        constant member's window is computed once per block, ``(P, blocks, 1, Q)``, and
        broadcast over the block's K elements of the output window."""
        p0, p1, s0, s1, q0, q1 = box
        P, n, Q = p1 - p0, s1 - s0, q1 - q0
        v3 = v.reshape(P, n, Q)
        o3 = _view_reshape(out, (P, n, Q))
        K = self.block
        x = s0
        while x < s1:
            if x % K == 0 and s1 - x >= K:
                g = x + (s1 - x) // K * K
                m = (g - x) // K
                vv = np.reshape(v3[:, x - s0 : g - s0, :], (P, m, K, Q))
                oo = _view_reshape(o3[:, x - s0 : g - s0, :], (P, m, K, Q))
                b0, b1 = x // K, g // K
                expand = True
            else:
                g = min(s1, (x // K + 1) * K)
                vv = v3[:, x - s0 : g - s0, :]
                oo = o3[:, x - s0 : g - s0, :]
                b0, b1 = x // K, x // K + 1
                expand = False
            s = self.scale.get(p0, p1, q0, q1, b0, b1)  # type: ignore[union-attr]
            z = self.zero.get(p0, p1, q0, q1, b0, b1) if self.zero is not None else None
            if expand:
                s = s[:, :, None, :]
                z = z[:, :, None, :] if z is not None else None
            if self.constant:  # one code: one value per block (same float32 operations)
                vv = vv[:, :, :1] if expand else vv[:, :1]
                w = _affine(vv, s, z, use_int)
                if accumulate:
                    np.add(oo, w, out=oo)
                else:
                    np.copyto(oo, w)
            elif z is None:
                np.multiply(vv, s, out=oo)
            elif use_int:
                np.multiply((vv - z).astype(np.float32), s, out=oo)
            else:
                np.subtract(vv, z.astype(np.float32), out=oo)
                np.multiply(oo, s, out=oo)
            x = g


def _affine(v: np.ndarray, s: np.ndarray, z: np.ndarray | None, use_int: bool) -> np.ndarray:
    """``s·(v − z)`` with the float32 operations of :meth:`_Dense._blocks`' element path."""
    if z is None:
        return np.multiply(v, s)
    if use_int:
        return np.multiply((v - z).astype(np.float32), s)
    return np.multiply(np.subtract(v, z.astype(np.float32)), s)


@functools.cache
def _f16_table() -> np.ndarray:
    """float32 value of every float16 bit pattern (numpy's own cast, tabulated: a gather is
    ~3x faster than numpy's float16 → float32 conversion loop)."""
    t = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    t.flags.writeable = False
    return t


def _table_scales(name: str, raw: np.ndarray) -> np.ndarray:
    """float32 values of 8-bit scale codes of element type ``name`` (float8_e8m0)."""
    return np.take(_code_values(name), raw, mode="clip")


def _to_f32(raw: np.ndarray) -> np.ndarray:
    """Widen float16 / bfloat16 / float32 scales to float32, losslessly."""
    if raw.dtype.itemsize == 2 and raw.dtype.kind == "f":  # float16
        return np.take(_f16_table(), raw.view(np.uint16), mode="clip")
    if raw.dtype.itemsize == 2:  # bfloat16: the high half of a float32
        return (raw.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return raw.astype(np.float32, copy=False)


class _Work:
    """Reusable float32 work buffers for one dequantization call, private to each thread
    and decoder (fresh 1 MiB allocations would page-fault on every piece).  Dropped with
    the call, so nothing outlives it."""

    def __init__(self) -> None:
        self._local = threading.local()

    def buffer(self, owner: "_Dense | _Composite", n: int) -> np.ndarray:
        """The calling thread's buffer of ``owner`` (a decoder: the pool holds the decoder
        itself, compared by identity, so a key can never name a decoder that is gone)."""
        pool = getattr(self._local, "pool", None)
        if pool is None:
            pool = self._local.pool = {}
        buf = pool.get(owner)
        if buf is None or buf.size < n:
            buf = pool[owner] = np.empty(max(n, _PIECE + 8), dtype=np.float32)
        return buf


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return (a.size == b.size and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.strides == b.strides)


# ---------------------------------------------------------------------------
# composites


@dataclass(frozen=True)
class _Member:
    decoder: "_Dense | _Composite"
    offset: tuple[int, ...]
    shape: tuple[int, ...]


class _Composite:
    """Partition and sealed-overlay composites, evaluated region by region.  The head and
    its members have passed :func:`_validate`."""

    def __init__(self, t: Tensor, strict: bool, depth: int) -> None:
        self.name = t.name
        desc = t.descriptor
        head = desc.layout
        assert isinstance(head, CompositeHead)
        check_nesting(depth, tensor=self.name)
        self.logical_shape = tuple(int(n) for n in desc.shape)  # type: ignore[arg-type]
        self.shape = self.logical_shape or (1,)
        self.size = _prod(self.shape)
        self.rule = head.composition_rule
        self.op = head.combine_op
        et = desc.element_type
        self.round: Callable[[np.ndarray], None] | None = None
        if et.kind == "float" and et.bits < 32 and et.numpy:
            hd = et.dtype

            def _round(a: np.ndarray, hd=hd) -> None:
                a[...] = a.astype(hd).astype(np.float32)

            self.round = _round
        elif et.kind in ("int", "uint", "bool") and self.rule == RULE_OVERLAY and self.op == OP_ADD:
            raise UnsupportedError(f"overlay add evaluated in {et.name} is not supported", tensor=self.name,
                                   field="type_tag")
        elif et.kind in ("complex", "scale") or not (et.numpy or et.packed):
            raise UnsupportedError(f"head element type {et.name} has no float32 value", tensor=self.name,
                                   field="type_tag")
        self.members = tuple(
            _Member(_make(m, strict, depth + 1), tuple(int(o) for o in m.descriptor.shard.offset) or (0,),  # type: ignore[union-attr]
                    tuple(int(n) for n in m.descriptor.shape) or (1,))  # type: ignore[arg-type]
            for m in t.members
        )
        # members by their first row, for finding the few a piece meets (see _candidates)
        self._by_row = sorted(range(len(self.members)), key=lambda i: self.members[i].offset[0])
        self._row_starts = [self.members[i].offset[0] for i in self._by_row]
        self._tallest = max((m.shape[0] for m in self.members), default=0)
        self.plan = self._compiled_plan()

    def _compiled_plan(self) -> "kernels.DequantPlan | None":
        """A sealed overlay ``add`` evaluated in float32 whose members all cover the head and
        fit the compiled path (:meth:`_Dense._compiled_spec`): one compiled pass over every
        member, element by element in the numpy path's order (base, then each member added)."""
        if (self.rule != RULE_OVERLAY or self.op != OP_ADD or self.round is not None
                or any(not isinstance(m.decoder, _Dense) or m.decoder.spec is None
                       or any(m.offset) or m.shape != self.shape for m in self.members)):
            return None
        return kernels.dequant_plan([m.decoder.spec for m in self.members], self.size)  # type: ignore[union-attr]

    def _candidates(self, lo: int, hi: int) -> list[int]:
        """Indices (in member order) of the members whose rows meet ``[lo, hi)`` along
        dimension 0: a bisection over the sorted first rows, so a piece costs the members
        it meets (plus log n), not all of them."""
        i0 = bisect.bisect_right(self._row_starts, lo - self._tallest)
        i1 = bisect.bisect_left(self._row_starts, hi)
        return sorted(k for k in self._by_row[i0:i1] if self.members[k].offset[0] + self.members[k].shape[0] > lo)

    align = (-1, 1)

    def fill(self, d: int, prefix, a: int, b: int, out: np.ndarray, work: "_Work") -> None:
        if self.plan is not None:
            kernels.dequant_window(self.plan, _linear(self.shape, d, prefix, a),
                                   out[: (b - a) * _prod(self.shape[d + 1 :])])
            return
        pos = 0
        for rd, rp, ra, rb in _regions(self.shape, _PIECE, d, prefix, a, b):
            n = (rb - ra) * _prod(self.shape[rd + 1 :])
            with np.errstate(over="ignore", invalid="ignore", under="ignore"):
                self._piece(rd, rp, ra, rb, out[pos : pos + n], work)
            pos += n

    def _piece(self, d: int, prefix, a: int, b: int, out: np.ndarray, work: "_Work") -> None:
        o = out.reshape((b - a, *self.shape[d + 1 :]))
        lo, hi = (prefix[0], prefix[0] + 1) if d else (a, b)
        for idx in self._candidates(lo, hi):
            m = self.members[idx]
            off, ms = m.offset, m.shape
            if any(not off[k] <= prefix[k] < off[k] + ms[k] for k in range(d)):
                continue
            a2, b2 = max(a, off[d]), min(b, off[d] + ms[d])
            count = (b2 - a2) * _prod(ms[d + 1 :])
            if a2 >= b2 or count == 0:
                continue
            mprefix = tuple(prefix[k] - off[k] for k in range(d))
            dst = o[(slice(a2 - a, b2 - a), *(slice(off[k], off[k] + ms[k]) for k in range(d + 1, len(ms))))]
            add = self.rule == RULE_OVERLAY and self.op == OP_ADD and idx > 0
            if add and self.round is None and dst.flags.c_contiguous and getattr(m.decoder, "accumulates", False):
                # a broadcast member: its per-block values added straight into the accumulator
                m.decoder.fill(d, mprefix, a2 - off[d], b2 - off[d], _view_reshape(dst, (count,)), work,
                               accumulate=True)
                continue
            if not add and dst.flags.c_contiguous:
                flat = _view_reshape(dst, (count,))
                m.decoder.fill(d, mprefix, a2 - off[d], b2 - off[d], flat, work)
                if self.round is not None:
                    self.round(flat)
                continue
            tmp = work.buffer(self, count)[:count]  # one member at a time
            m.decoder.fill(d, mprefix, a2 - off[d], b2 - off[d], tmp, work)
            if self.round is not None:
                self.round(tmp)
            tmp = tmp.reshape(dst.shape)
            if add:
                np.add(dst, tmp, out=dst)
                if self.round is not None:
                    self.round(dst)
            else:
                dst[...] = tmp


def _make(t: Tensor, strict: bool, depth: int = 0) -> "_Dense | _Composite":
    """Validate ``t`` (see :func:`_validate`) and build its evaluator."""
    _validate(t, strict)
    if isinstance(t.descriptor.layout, CompositeHead):
        return _Composite(t, strict, depth)
    return _Dense(t, strict)


def _validate(t: Tensor, strict: bool) -> None:
    """What this module cannot evaluate first (UnsupportedError), then the core's rules for
    the descriptor, the buffer contents, the composite membership and (strict) the
    parameter values -- one home for each rule, the same checks the ``.hrry`` reader runs."""
    if not isinstance(t, Tensor) or not isinstance(t.descriptor, Descriptor):
        raise UsageError(f"expected a hurray_interop Tensor, got {type(t).__name__}")
    desc = t.descriptor
    layout = desc.layout
    if any(n is None for n in desc.shape):
        raise UnsupportedError("a dynamic dimension has no values to read", tensor=t.name, field="shape")
    if isinstance(layout, CompositeHead):
        if layout.composition_rule == RULE_GROUP:
            raise UnsupportedError("a group composite has no single value view to dequantize", tensor=t.name,
                                   field="composition_rule")
    else:
        et = desc.element_type
        if et.kind in ("complex", "private") or (not et.numpy and not et.packed):
            raise UnsupportedError(f"element type {et.name} has no float32 value", tensor=t.name, field="type_tag")
        rule = layout_of(layout)
        if rule is None or not rule.evaluable:
            raise UnsupportedError(f"layout {type(layout).__name__} (tag {layout.tag:#04x}) cannot be dequantized; "
                                   "only row-major, column-major and strided layouts are supported",
                                   tensor=t.name, field="layout_tag")
    validate_descriptor(desc, tensor=t.name)
    validate_addressed_range(desc, tensor=t.name)
    check_buffer_sizes(desc, t.data, tensor=t.name)
    if isinstance(layout, CompositeHead):
        validate_composite(t.name, desc, [(m.name, m.descriptor) for m in t.members])
    elif strict:
        validate_parameter_values(desc, t.data, tensor=t.name)


# ---------------------------------------------------------------------------
# public API


def iter_dequantize(
    tensor: Tensor, *, max_elements: int = DEFAULT_MAX_ELEMENTS, strict: bool = True, threads: int | None = None
) -> Iterator[tuple[tuple[slice, ...], np.ndarray]]:
    """Dequantize ``tensor`` in chunks of at most ``max_elements`` values.

    Yields ``(index, values)`` pairs: ``index`` is a tuple of one ``slice`` per
    dimension and ``values`` a fresh C-contiguous float32 array of exactly the
    shape ``full[index]`` has, so ``full[index] = values`` assembles the result.
    Chunks are runs of whole outer rows (``[i0, …, i(d-1), a:b, :, …]``) in
    row-major order; a single row longer than ``max_elements`` is split along
    the last dimension.  A rank-0 tensor yields ``((), array(shape=()))``.

    The descriptor and all parameter buffers are validated before the first
    chunk is produced; with ``strict=False`` the parameter-value rules (finite
    non-zero scales, MXFP scale bytes 0x00/0xFF, per-channel zero-point ranges) and
    the float8_e8m0 data bytes are not enforced and such values decode
    arithmetically (0x00 → 2^-127, 0xFF → NaN); the per-tensor scale and zero
    point are descriptor fields and always checked.  ``threads``
    parallelizes the evaluation of each chunk (see :func:`dequantize`).
    """
    if max_elements < 1:
        raise UsageError(f"max_elements must be positive, not {max_elements}", tensor=tensor.name)
    dec = _make(tensor, strict)  # validate now, not at the first next()
    return _iter(dec, max_elements, threads)


class Windows:
    """A validated tensor's values window by window, in any order, on any thread: what
    :func:`iter_dequantize` yields, into buffers the caller reuses (see :func:`windows`)."""

    def __init__(self, dec: "_Dense | _Composite", max_elements: int) -> None:
        self._dec = dec
        self.max_elements = max_elements
        #: the number of values
        self.size = dec.size

    def spans(self) -> Iterator[tuple[int, int, tuple]]:
        """``(start, count, region)`` of every window in row-major order: the flat index of its
        first value, its number of values, and the key :meth:`fill` takes."""
        dec = self._dec
        ad, al = dec.align
        pos = 0
        for d, prefix, a, b in _regions(dec.shape, self.max_elements, align_dim=ad, align=al):
            n = (b - a) * _prod(dec.shape[d + 1 :])
            yield pos, n, (d, prefix, a, b)
            pos += n

    def fill(self, region: tuple, out: np.ndarray) -> np.ndarray:
        """The window's values written into ``out`` (C-contiguous float32 of exactly its count),
        on the calling thread; returns ``out``."""
        d, prefix, a, b = region
        n = (b - a) * _prod(self._dec.shape[d + 1 :])
        if not (isinstance(out, np.ndarray) and out.dtype == _F32 and out.size == n and out.flags.c_contiguous
                and out.flags.writeable):
            raise UsageError(f"a window of {n} values needs a writeable C-contiguous float32 array of that size",
                             tensor=self._dec.name)
        _fill_all(self._dec, out.reshape(-1), 1, d, prefix, a, b)
        return out


    def first_diff(self, region: tuple, ref: np.ndarray, zero_equal: bool = False) -> int | None:
        """Where the window's values first differ in their bits from ``ref`` (C-contiguous
        float32, its count; ``zero_equal``: +0 and -0 alike): an index, -1 when they are all
        equal -- computed and compared chunk by chunk in the compiled path (a per-block plan, or
        a plain float16/bfloat16 tensor), the values never written out -- or None when the
        tensor is not on the compiled path (then :meth:`fill` and compare)."""
        at = self._compiled(region)
        if at is None:
            return None
        if ref.size != at[1]:
            raise UsageError(f"the reference window holds {ref.size} values, the window {at[1]}", tensor=self._dec.name)
        return kernels.dequant_diff(self._dec.plan, at[0], ref, zero_equal)

    def first_diff_decoded(self, region: tuple, decode: int, blocks: np.ndarray, block_elements: int,
                           zero_equal: bool = False) -> int | None:
        """:meth:`first_diff` against a reference decoder run in C over the window's source
        blocks (``decode``: a ggml ``to_float``'s address; ``blocks``: one row per block of
        ``block_elements`` values, the window's first value first): both sides computed and
        compared 4096 values at a time, no reference window at all
        (kernels.dequant_diff_decoded).  None when the tensor is not on the compiled path."""
        at = self._compiled(region)
        if at is None:
            return None
        return kernels.dequant_diff_decoded(self._dec.plan, at[0], at[1], decode, blocks, block_elements, zero_equal)

    def _compiled(self, region: tuple) -> tuple[int, int] | None:
        """``(flat index of the first value, count)`` of a window on the compiled path, else None."""
        if getattr(self._dec, "plan", None) is None:
            return None
        d, prefix, a, b = region
        return _linear(self._dec.shape, d, prefix, a), (b - a) * _prod(self._dec.shape[d + 1 :])


def windows(tensor: Tensor, *, max_elements: int = DEFAULT_MAX_ELEMENTS, strict: bool = True) -> Windows:
    """``tensor`` validated (as :func:`iter_dequantize` does) and ready to be evaluated window
    by window: :meth:`Windows.spans` lists the windows (the chunks :func:`iter_dequantize`
    yields), :meth:`Windows.fill` evaluates one into a caller's buffer.  Windows are
    independent: worker threads may fill different ones at once (each with its own buffer),
    and nothing is allocated per window."""
    if max_elements < 1:
        raise UsageError(f"max_elements must be positive, not {max_elements}", tensor=tensor.name)
    return Windows(_make(tensor, strict), max_elements)


def _iter(dec, max_elements: int, threads: int | None):
    shape = dec.shape
    rank = len(dec.logical_shape)
    ad, al = dec.align
    for d, prefix, a, b in _regions(shape, max_elements, align_dim=ad, align=al):
        n = (b - a) * _prod(shape[d + 1 :])
        values = np.empty(n, dtype=np.float32)
        _fill_all(dec, values, _workers(threads, n), d, prefix, a, b)
        if rank == 0:
            yield (), values.reshape(())
            continue
        index = (*(slice(i, i + 1) for i in prefix), slice(a, b), *(slice(None) for _ in shape[d + 1 :]))
        yield index, values.reshape((1,) * d + (b - a, *shape[d + 1 :]))


def dequantize(tensor: Tensor, *, out: np.ndarray | None = None, strict: bool = True,
               threads: int | None = None) -> np.ndarray:
    """The float32 values of ``tensor`` (numpy order, shape ``tensor.shape``).

    ``out``, if given, must be a writeable C-contiguous float32 array of that
    shape; it is filled and returned.  See the module documentation for the
    exact arithmetic and :func:`iter_dequantize` for ``strict`` and for chunked use.
    ``threads`` (default: up to 2, never more than the CPUs) evaluates disjoint regions
    in parallel for tensors of more than a few million values; results are identical.
    """
    dec = _make(tensor, strict)
    shape = dec.logical_shape
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif (not isinstance(out, np.ndarray) or out.dtype != _F32 or out.shape != shape
          or not out.flags.c_contiguous or not out.flags.writeable):
        got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
        raise UsageError(f"out must be a writeable C-contiguous float32 array of shape {shape}, got {got}",
                         tensor=tensor.name)
    _fill_all(dec, out.reshape(-1), _workers(threads, dec.size))
    return out


def _workers(threads: int | None, size: int) -> int:
    return max(1, min(parallel.jobs(threads, "threads"), size // _PARALLEL_GRAIN))


def _fill_all(dec, flat: np.ndarray, workers: int, d: int = 0, prefix=(), lo: int = 0, hi: int | None = None) -> None:
    """Fill ``flat`` with the region ``dec[*prefix, lo:hi, ...]``; with ``workers > 1`` the
    sub-regions (disjoint slices of ``flat``) run on a thread pool — numpy releases the GIL
    in the ufuncs and gathers that do the work, and decoders hold no mutable state."""
    ad, al = dec.align
    work = _Work()
    grain = _PARALLEL_GRAIN if workers > 1 else DEFAULT_MAX_ELEMENTS
    jobs = []
    pos = 0
    for rd, rp, ra, rb in _regions(dec.shape, grain, d, prefix, lo, hi, ad, al):
        n = (rb - ra) * _prod(dec.shape[rd + 1 :])
        jobs.append((rd, rp, ra, rb, pos, n))
        pos += n
    if workers <= 1 or len(jobs) < 2:
        for rd, rp, ra, rb, p, n in jobs:
            dec.fill(rd, rp, ra, rb, flat[p : p + n], work)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hurray-dequant") as pool:
        futures = [pool.submit(dec.fill, rd, rp, ra, rb, flat[p : p + n], work) for rd, rp, ra, rb, p, n in jobs]
        for f in futures:
            f.result()  # re-raises the first error in order
