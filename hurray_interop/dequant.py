"""The one shared dequantizer: any dense or composite Hurray tensor → float32 values.

Every verification path calls this module.  It knows only the core model
(:mod:`hurray_interop.core`) and computes, bit for bit, what the Hurray
specification (with the seeds and the project's errata decisions in
``docs/conversion-rules.md``) says a tensor's values are:

* plain types: float16/bfloat16/float32/float64, integers and bool are cast to
  float32 (float64 and integers wider than 24 bits round to nearest-even);
  float8_e4m3, float8_e5m2, float8_e8m0 (``2^(e-127)``), float6_e2m3/e3m2 and
  float4_e2m1 decode through the OCP value maps (the ml_dtypes casts, tabulated
  once per type; codes are masked to the type's width so stray bits in a packed
  byte cannot leak in);
* per-tensor / per-channel / per-block affine: ``float32(s) * float32(q - z)``,
  ``q - z`` exact in integers, then one float32 rounding, then one float32
  multiply (f16/bf16 scales widen losslessly) — identical to numpy's
  ``np.float32(s) * np.float32(q - z)`` per element;
* NF4: ``float32(absmax) * LUT[q]`` with the specification's LUT verbatim;
* MXFP: ``2^(e-127) * value(q)`` in float32 (exact, subnormal results kept);
* layouts row-major, column-major and strided (strides in logical elements,
  ``byte_offset``, sub-byte types addressed per element, 6-bit types per
  3-byte group);
* composites: partition (members tile the head by their shard offsets) and
  sealed overlay (``replace``: later wins; ``add``: base + corrections),
  evaluated in the head's element type (float16/bfloat16 heads round after
  every step; float32 is the working type), nested up to depth 8.

Per-block affine partial trailing blocks are read as the seed describes (each
outer row stores ``ceil(S/K)·K`` elements along the axis, padding ignored) when
the data buffer is that large, otherwise as the contiguous ``shape``-sized
buffer (``docs/conversion-rules.md`` § 6).

Large tensors are evaluated on up to two threads by default (``threads=``):
disjoint regions of the output, numpy releasing the GIL inside the gathers and
ufuncs that do the work; the result is identical for any thread count.

Work proceeds in *regions*: contiguous runs of the logical row-major order of
the form ``tensor[i0, …, i(d-1), a:b, :, …, :]``.  :func:`iter_dequantize`
yields such regions of at most ``max_elements`` values each (so a 10 GB tensor
needs only a few chunks of RAM); each region is itself evaluated in
cache-sized pieces with reused work buffers.  4-bit float codes (float4_e2m1,
NF4) decode through a 256-entry byte → two-float32 table, 2-bit codes through a
byte → four-float32 table, 4-bit integer codes by widening each byte to a uint16
whose two bytes are its codes (faster than any gather numpy offers).

Validation is strict by default (``strict=False`` relaxes only the *value*
rules): per-block scales finite and non-zero, NF4 absmax finite and ≥ 0, MXFP
scale bytes never 0x00/0xFF, zero points within the storage range where the
scheme demands it; buffer sizes, indices and every addressed byte are always
checked before any data is touched.

Hand-written on numpy (+ ml_dtypes value maps): no library evaluates Hurray
descriptors, and the per-format decoders that exist (gguf-py, torchao) cover one
layout each — they serve as the independent oracles in the tests instead.

Anything that cannot be evaluated raises the project's errors naming the
tensor: :class:`~hurray_interop.errors.UnsupportedError` for sparse, tiled,
Morton, block-paged, Hilbert, private layouts, group composites, complex and
float128 values and dynamic dimensions; :class:`~hurray_interop.errors.FormatError`
(or a subclass) for descriptors or buffers that break the specification.
"""

from __future__ import annotations

import functools
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from . import parallel
from .core.elements import ElementType, buffer_size, element_type
from .core.model import (
    MXFP,
    NF4,
    OP_ADD,
    OP_REPLACE,
    ROLE_BASE,
    ROLE_CORRECTION,
    RULE_OVERLAY,
    RULE_PARTITION,
    ColumnMajor,
    CompositeHead,
    PerBlockAffine,
    PerChannelAffine,
    PerTensorAffine,
    RowMajor,
    Strided,
    Tensor,
    as_u8,
)
from .errors import FormatError, InconsistentError, TruncatedError, UnsupportedError, UsageError

__all__ = ["dequantize", "iter_dequantize", "NF4_LUT", "DEFAULT_MAX_ELEMENTS"]

#: Default upper bound on the values :func:`iter_dequantize` yields per chunk (64 MiB of float32).
DEFAULT_MAX_ELEMENTS = 1 << 24
#: Values evaluated per inner step: 256 Ki float32 = 1 MiB, so temporaries stay in L2.
_PIECE = 1 << 18
#: Values per parallel job; tensors below two jobs' worth run on the calling thread.
_PARALLEL_GRAIN = 1 << 21
#: Composite nesting limit (composite.md § Binding).
_MAX_DEPTH = 8

_F32 = np.dtype(np.float32)

#: The NF4 code book, verbatim from quantization/nf4.md (float32).
NF4_LUT = np.array(
    [
        -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
        -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
        0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
        0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
    ],
    dtype=np.float32,
)
NF4_LUT.flags.writeable = False

_AFFINE_STORAGE = frozenset({"int8", "uint8", "int16", "uint16", "int32", "uint32", "int4", "uint4", "int2", "uint2"})
_BLOCK_STORAGE = frozenset({"int8", "uint8", "int4", "uint4", "int2", "uint2"})
_MXFP_STORAGE = frozenset({"float8_e4m3", "float8_e5m2", "float4_e2m1", "float6_e2m3", "float6_e3m2", "int8", "int4"})
_SCALE_TYPES = frozenset({"float16", "bfloat16", "float32"})


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
        table = ((codes.astype(np.int16) ^ (n >> 1)) - (n >> 1)).astype(np.float32)  # sign-extend `bits`
    elif et.kind == "uint":
        table = codes.astype(np.float32)
    elif name == "float8_e8m0":
        # 2^(e-127) built from the float32 bit pattern; e = 0 is the subnormal 2^-127, 0xFF NaN.
        bits = np.where(codes == 0, np.uint32(1 << 22), codes.astype(np.uint32) << np.uint32(23))
        bits = np.where(codes == 0xFF, np.uint32(0x7FC00000), bits)
        table = bits.astype(np.uint32).view(np.float32)
    else:  # OCP float formats: ml_dtypes' value maps, codes already masked to `bits`
        table = codes.view(et.dtype).astype(np.float32)
    table = np.ascontiguousarray(table, dtype=np.float32)
    table.flags.writeable = False
    return table


@functools.cache
def _byte_table(values_key: str) -> np.ndarray:
    """Byte → the values of all codes packed in it, LSB-first: shape (256, 8 // bits)."""
    values = _values_by_key(values_key)
    bits = {16: 4, 4: 2, 2: 1}[values.size]
    per = 8 // bits
    byte = np.arange(256, dtype=np.uint16)
    mask = (1 << bits) - 1
    table = np.stack([values[(byte >> (bits * j)) & mask] for j in range(per)], axis=1)
    table = np.ascontiguousarray(table, dtype=np.float32)
    table.flags.writeable = False
    return table


def _values_by_key(key: str) -> np.ndarray:
    return NF4_LUT if key == "nf4" else _code_values(key)


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
    """Evaluates one dense (row-major / column-major / strided) tensor region by region."""

    def __init__(self, t: Tensor, strict: bool) -> None:
        self.name = t.name
        desc = t.descriptor
        self.strict = strict
        shape = desc.shape
        if any(n is None for n in shape):
            self._unsupported("a dynamic dimension has no values to read", field="shape")
        self.logical_shape: tuple[int, ...] = tuple(int(n) for n in shape)  # type: ignore[arg-type]
        self.shape = self.logical_shape or (1,)
        self.size = _prod(self.shape)
        et = desc.element_type
        self.et = et
        if et.kind == "complex" or (not et.numpy and not et.packed):
            self._unsupported(f"element type {et.name} has no float32 value", field="type_tag")
        q = desc.quantization
        self.q = q
        if len(t.data) != len(desc.buffers):
            raise InconsistentError(
                f"the descriptor declares {len(desc.buffers)} buffers, the tensor carries {len(t.data)}",
                tensor=self.name, field="buffers",
            )
        self.bufs = tuple(as_u8(b) for b in t.data)
        for i, (h, b) in enumerate(zip(desc.buffers, self.bufs)):
            if b.size != h.byte_size:
                raise InconsistentError(
                    f"buffer {i} holds {b.size} bytes, its handle declares {h.byte_size}",
                    tensor=self.name, field=f"buffers[{i}].byte_size",
                )
        if not self.bufs and self.size:
            raise FormatError("a dense tensor needs a data buffer (buffer 0)", tensor=self.name, field="buffer_count")
        self.byte_offset = int(desc.byte_offset)
        # ---- the scheme: value table, axis geometry, parameter planes
        self.values_key = et.name
        self.axis = -1
        self.block = 1
        self.scale: _ParamPlane | None = None
        self.zero: _ParamPlane | None = None
        if q is not None:
            self._prepare_scheme(q)
        # ---- storage geometry and addressing
        self._prepare_layout(desc.layout)

    # -- errors ----------------------------------------------------------------

    def _unsupported(self, msg: str, **kw) -> None:
        raise UnsupportedError(msg, tensor=self.name, **kw)

    def _bad(self, msg: str, cls=FormatError, **kw) -> None:
        raise cls(msg, tensor=self.name, **kw)

    # -- scheme ------------------------------------------------------------------

    def _param_buffer(self, index: int, what: str, dtype: np.dtype, count: int) -> np.ndarray:
        if index >= len(self.bufs) or index < 0:
            self._bad(f"{what} buffer index {index} is not below buffer_count {len(self.bufs)}",
                      field=f"{what}_buffer_index")
        if index == 0:
            self._bad(f"the {what} buffer must not be the data buffer (index 0)", field=f"{what}_buffer_index")
        buf = self.bufs[index]
        need = count * dtype.itemsize
        if buf.size != need:
            cls = TruncatedError if buf.size < need else InconsistentError
            self._bad(f"{what} buffer {index} holds {buf.size} bytes, {count} values need exactly {need}",
                      cls=cls, field=f"buffers[{index}].byte_size")
        return buf.view(dtype)

    def _check_axis(self, axis: int) -> int:
        if not 0 <= axis < len(self.logical_shape):
            self._bad(f"axis {axis} is not below rank {len(self.logical_shape)}", field="quantization.axis")
        return axis

    def _prepare_scheme(self, q) -> None:
        et = self.et
        shape = self.shape
        if isinstance(q, PerTensorAffine):
            if et.name not in _AFFINE_STORAGE:
                self._bad(f"storage type {et.name} is not valid for per-tensor affine", field="type_tag")
            self.pt_scale = np.float32(q.scale)
            self.pt_zero = int(q.zero_point)
            if self.strict:
                if not np.isfinite(self.pt_scale) or self.pt_scale == 0:
                    self._bad(f"per-tensor scale {float(self.pt_scale)!r} is not finite and non-zero",
                              field="quantization.scale")
                lo, hi = _int_range(et)
                if not lo <= self.pt_zero <= hi:
                    self._bad(f"zero point {self.pt_zero} is outside the {et.name} range [{lo}, {hi}]",
                              field="quantization.zero_point")
            return
        axis = self._check_axis(int(q.axis))
        self.axis = axis
        S = shape[axis]
        P, Q = _prod(shape[:axis]), _prod(shape[axis + 1 :])
        if isinstance(q, PerChannelAffine):
            if et.name not in _AFFINE_STORAGE:
                self._bad(f"storage type {et.name} is not valid for per-channel affine", field="type_tag")
            if q.scale_type.name != "float32":
                self._bad(f"per-channel scale type must be float32, not {q.scale_type.name}",
                          field="quantization.scale_type_tag")
            self.block = 1
            sraw = self._param_buffer(q.scale_buffer_index, "scale", np.dtype("<f4"), S)
            self._validate_scales(sraw, "nonzero")
            self.scale = _ParamPlane(np.lib.stride_tricks.as_strided(sraw, (P, Q, S), (0, 0, sraw.strides[0])),
                                     _to_f32)
            if not q.symmetric:
                self._zero_plane(q, S, (P, Q, S), broadcast=True)
                if self.strict:
                    lo, hi = _int_range(et)
                    z = self.bufs[q.zero_point_buffer_index].view("<i4")
                    if z.size and (int(z.min()) < lo or int(z.max()) > hi):
                        self._bad(f"a zero point is outside the {et.name} range [{lo}, {hi}]",
                                  field="quantization.zero_point")
            return
        K = int(q.block_size)
        self.block = K
        if isinstance(q, PerBlockAffine):
            if et.name not in _BLOCK_STORAGE:
                self._bad(f"storage type {et.name} is not valid for per-block affine", field="type_tag")
            if q.scale_type.name not in _SCALE_TYPES:
                self._bad(f"per-block scale type must be float16, bfloat16 or float32, not {q.scale_type.name}",
                          field="quantization.scale_type_tag")
            self._check_block(K, 2, None, S)
            nb = -(-S // K)
            sraw = self._param_buffer(q.scale_buffer_index, "scale", q.scale_type.dtype.newbyteorder("<"), P * Q * nb)
            self._validate_scales(sraw, "nonzero")
            self.scale = _ParamPlane(sraw.reshape(P, Q, nb), _to_f32)
            if not q.symmetric:
                self._zero_plane(q, P * Q * nb, (P, Q, nb), broadcast=False)
        elif isinstance(q, NF4):
            if et.name != "uint4":
                self._bad(f"storage type {et.name} is not valid for NF4 (uint4 only)", field="type_tag")
            self._check_block(K, 8, None, S)
            nb = -(-S // K)
            sraw = self._param_buffer(q.scale_buffer_index, "scale", np.dtype("<f4"), P * Q * nb)
            self._validate_scales(sraw, "absmax")
            self.scale = _ParamPlane(sraw.reshape(P, Q, nb), _to_f32)
            self.values_key = "nf4"
        elif isinstance(q, MXFP):
            if et.name not in _MXFP_STORAGE:
                self._bad(f"storage type {et.name} is not valid for MXFP", field="type_tag")
            self._check_block(K, 16, 2048, S)
            if S == 0 or S % K:
                self._bad(f"MXFP needs shape[axis] = {S} to be a positive multiple of block_size {K}",
                          field="quantization.block_size")
            nb = S // K
            sraw = self._param_buffer(q.scale_buffer_index, "scale", np.dtype(np.uint8), P * Q * nb)
            self._validate_scales(sraw, "e8m0")
            self.scale = _ParamPlane(sraw.reshape(P, Q, nb), self._e8m0_scales)
        else:  # pragma: no cover - the model has no other scheme
            self._unsupported(f"quantization scheme {type(q).__name__} is not supported", field="quantization")

    def _check_block(self, K: int, low: int, high: int | None, S: int) -> None:
        if K < low or K & (K - 1) or (high is not None and K > high):
            rng = f"[{low}, {high}]" if high else f">= {low}"
            self._bad(f"block_size {K} must be a power of two {rng}", field="quantization.block_size")
        if S > 0 and K > S and not isinstance(self.q, MXFP):
            self._bad(f"block_size {K} exceeds shape[axis] = {S}", field="quantization.block_size")

    def _zero_plane(self, q, count: int, shape3, broadcast: bool) -> None:
        if q.zero_point_buffer_index == q.scale_buffer_index:
            self._unsupported("scale and zero point sharing one buffer is not supported "
                              "(the specification contradicts itself on its layout)",
                              field="quantization.zero_point_buffer_index")
        zraw = self._param_buffer(q.zero_point_buffer_index, "zero_point", np.dtype("<i4"), count)
        if broadcast:
            zraw = np.lib.stride_tricks.as_strided(zraw, shape3, (0, 0, zraw.strides[0]))
        else:
            zraw = zraw.reshape(shape3)
        self.zero = _ParamPlane(zraw, lambda z: z.astype(np.int64))

    # scale validation (once, over the whole buffer, before any value is produced) and
    # conversion (per piece, on a small slice)

    def _validate_scales(self, flat: np.ndarray, rule: str) -> None:
        if not self.strict:
            return
        step = 1 << 20
        for start in range(0, flat.size, step):
            c = flat[start : start + step]
            if rule == "e8m0":
                bad = (c == 0) | (c == 0xFF)
                what = "an MXFP scale byte is 0x00 or 0xFF (reserved)"
            else:
                f = _to_f32(c)
                bad = ~np.isfinite(f) | ((f == 0) if rule == "nonzero" else (f < 0))
                what = ("scale is zero, infinite or NaN (scales must be finite and non-zero)" if rule == "nonzero"
                        else "NF4 absmax is negative, infinite or NaN")
            if bad.any():
                b = start + int(np.argmax(bad))
                self._bad(f"block {b}: {what}", field="scale")

    @staticmethod
    def _e8m0_scales(raw: np.ndarray) -> np.ndarray:
        return np.take(_code_values("float8_e8m0"), raw, mode="clip")

    # -- layout ----------------------------------------------------------------

    def _prepare_layout(self, layout) -> None:
        et = self.et
        shape = self.shape
        # the storage shape: the seed's padded partial trailing block when the buffer has room
        ss = shape
        if (isinstance(self.q, (PerBlockAffine, NF4)) and shape[self.axis] % self.block
                and isinstance(layout, (RowMajor, ColumnMajor))):
            padded = list(shape)
            padded[self.axis] = -(-shape[self.axis] // self.block) * self.block
            if self.bufs and self.bufs[0].size - self.byte_offset >= buffer_size(et, _prod(padded)):
                ss = tuple(padded)
        self.storage_shape = ss
        if isinstance(layout, RowMajor):
            self.row_major = True
            strides = _c_strides(ss)
        elif isinstance(layout, ColumnMajor):
            self.row_major = len(shape) == 1 or _prod(shape) <= 1
            strides = _f_strides(ss)
        elif isinstance(layout, Strided):
            if len(layout.strides) != len(self.logical_shape):
                self._bad(f"{len(layout.strides)} strides for rank {len(self.logical_shape)}", field="strides")
            strides = tuple(int(s) for s in layout.strides) or (1,)
            self.row_major = strides == _c_strides(shape)
        else:
            name = type(layout).__name__
            self._unsupported(f"layout {name} (tag {layout.tag:#04x}) cannot be dequantized; "
                              "only row-major, column-major and strided layouts are supported", field="layout_tag")
        self.strides = strides
        if self.size == 0:
            return
        # bounds: every addressed element must lie inside buffer 0
        lo = sum(min(0, s * (n - 1)) for s, n in zip(strides, shape))
        hi = sum(max(0, s * (n - 1)) for s, n in zip(strides, shape))
        if ss != shape:
            hi = _prod(ss) - 1
        nbytes = self.bufs[0].size
        bo = self.byte_offset
        if et.bits == 6:
            first, end = bo + 3 * (lo // 4), bo + 3 * (hi // 4) + 3
        elif et.packed:
            per = 8 // et.bits
            first, end = bo + lo // per, bo + hi // per + 1
        else:
            first, end = bo + lo * (et.bits // 8), bo + (hi + 1) * (et.bits // 8)
        if first < 0:
            self._bad(f"element offset {lo} lies before the start of buffer 0 (byte_offset {bo})",
                      field="byte_offset")
        if end > nbytes:
            self._bad(f"the layout addresses bytes up to {end}, buffer 0 holds {nbytes}",
                      cls=TruncatedError, field="buffers[0].byte_size", offset=bo)
        if not et.packed and not self.row_major:
            isz = et.bits // 8
            self.full_view = np.ndarray(shape=shape, dtype=et.dtype, buffer=self.bufs[0], offset=bo,
                                        strides=tuple(s * isz for s in strides))
        if et.name == "float8_e8m0" and self.strict and self.q is None:
            self._check_e8m0_data()

    def _check_e8m0_data(self) -> None:
        for d, prefix, a, b in _regions(self.shape, DEFAULT_MAX_ELEMENTS):
            raw = self._raw(d, prefix, a, b)
            raw = raw.view(np.uint8)
            if raw.size and (raw.min() == 0 or raw.max() == 0xFF):
                self._bad("float8_e8m0 data holds 0x00 or 0xFF (reserved)", field="data")

    # -- fetching codes ----------------------------------------------------------

    def _offsets(self, d: int, prefix, a: int, b: int) -> np.ndarray:
        """Element offsets (relative to byte_offset) of the region, int64, flat."""
        st = self.strides
        base = sum(int(i) * s for i, s in zip(prefix, st))
        off = np.arange(a, b, dtype=np.int64) * st[d] + base
        for k in range(d + 1, len(self.shape)):
            off = off[..., None] + np.arange(self.shape[k], dtype=np.int64) * st[k]
        return off.reshape(-1)

    def _raw(self, d: int, prefix, a: int, b: int) -> np.ndarray:
        """Raw codes of the region, flat: uint8 codes for sub-byte types, else the element dtype."""
        et = self.et
        n = (b - a) * _prod(self.shape[d + 1 :])
        buf = self.bufs[0]
        bo = self.byte_offset
        if not et.packed:
            if not self.row_major:
                return np.ascontiguousarray(self.full_view[(*prefix, slice(a, b))]).reshape(-1)
            isz = et.bits // 8
            if self.storage_shape == self.shape or self.axis <= d:
                L0 = _linear(self.storage_shape, d, prefix, a)
                return buf[bo + L0 * isz : bo + (L0 + n) * isz].view(et.dtype)
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
            codes = self.bufs[0][bo + L0 * isz : bo + (L0 + n) * isz].view(et.dtype)
        codes = codes.reshape((b - a, *ss[d + 1 :]))
        index = [slice(None)] * codes.ndim
        index[self.axis - d] = slice(0, self.shape[self.axis])
        return np.ascontiguousarray(codes[tuple(index)]).reshape(-1)

    def _unpack_range(self, L0: int, n: int) -> np.ndarray:
        """uint8 codes of contiguous elements ``L0 .. L0+n`` (row-major storage order)."""
        et = self.et
        buf = self.bufs[0]
        bo = self.byte_offset
        if et.bits == 6:
            g0 = L0 // 4
            phase = L0 - 4 * g0
            groups = -(-(phase + n) // 4)
            b = buf[bo + 3 * g0 : bo + 3 * (g0 + groups)].reshape(groups, 3)
            out = np.empty((groups, 4), dtype=np.uint8)
            out[:, 0] = b[:, 0] & 0x3F
            out[:, 1] = (b[:, 0] >> 6) | ((b[:, 1] & 0x0F) << 2)
            out[:, 2] = (b[:, 1] >> 4) | ((b[:, 2] & 0x03) << 4)
            out[:, 3] = b[:, 2] >> 2
            return out.reshape(-1)[phase : phase + n]
        per = 8 // et.bits
        k0 = L0 // per
        phase = L0 - per * k0
        k1 = -(-(L0 + n) // per)
        b = buf[bo + k0 : bo + k1]
        if et.bits == 1:
            return np.unpackbits(b, bitorder="little")[phase : phase + n]
        mask = (1 << et.bits) - 1
        out = np.empty((b.size, per), dtype=np.uint8)
        for j in range(per):
            np.bitwise_and(b >> (et.bits * j), mask, out=out[:, j])
        return out.reshape(-1)[phase : phase + n]

    def _gather_packed(self, off: np.ndarray) -> np.ndarray:
        """uint8 codes of sub-byte elements at arbitrary element offsets."""
        et = self.et
        buf = self.bufs[0]
        bo = self.byte_offset
        if et.bits == 6:
            g = off // 4
            j = (off - 4 * g).astype(np.uint32)
            at = bo + 3 * g
            w = buf[at].astype(np.uint32) | (buf[at + 1].astype(np.uint32) << 8) | (buf[at + 2].astype(np.uint32) << 16)
            return ((w >> (6 * j)) & 0x3F).astype(np.uint8)
        per = 8 // et.bits
        byte = off // per
        bit = ((off - per * byte) * et.bits).astype(np.uint8)
        return (buf[bo + byte] >> bit) & np.uint8((1 << et.bits) - 1)

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
            if et.bits == 4 and _LITTLE and et.kind in ("int", "uint") and self.values_key == et.name:
                codes = _spread(b8, et.bits)[phase : phase + n]
                if et.kind == "int":  # two's complement sign extension in place: (c ^ h) - h
                    codes = codes.view(np.int8)
                    half = np.int8(1 << (et.bits - 1))
                    np.bitwise_xor(codes, half, out=codes)
                    np.subtract(codes, half, out=codes)
                np.copyto(dst[:n], codes, casting="unsafe")
                return dst[:n]
            table = _byte_table(self.values_key)
            if phase == 0 and dst.flags.c_contiguous and dst.size >= b8.size * per:
                target = _view_reshape(dst[: b8.size * per], (b8.size, per))
                np.take(table, b8, axis=0, out=target, mode="clip")
                return dst[:n]
            return np.take(table, b8, axis=0, mode="clip").reshape(-1)[phase : phase + n]
        raw = self._raw(d, prefix, a, b)
        if et.packed or et.bits == 8 and et.kind not in ("int", "uint"):
            table = _values_by_key(self.values_key)
            np.take(table, raw if raw.dtype == np.uint8 else raw.view(np.uint8), out=dst[:n], mode="clip")
        else:
            np.copyto(dst[:n], raw, casting="unsafe")
        return dst[:n]

    def _ints(self, d: int, prefix, a: int, b: int) -> np.ndarray:
        """Integer codes of the region as int64 (affine storage only)."""
        raw = self._raw(d, prefix, a, b)
        if self.et.packed and self.et.kind == "int":
            bits = self.et.bits
            return ((raw.astype(np.int64) ^ (1 << (bits - 1))) - (1 << (bits - 1)))
        return raw.astype(np.int64)

    # -- evaluation --------------------------------------------------------------

    @property
    def align(self) -> tuple[int, int]:
        return (self.axis, self.block) if self.block > 1 else (-1, 1)

    def fill(self, d: int, prefix, a: int, b: int, out: np.ndarray, work: "_Work") -> None:
        """Write the region's float32 values into the flat contiguous ``out``."""
        inner = _prod(self.shape[d + 1 :])
        pos = 0
        ad, al = self.align
        for rd, rp, ra, rb in _regions(self.shape, _PIECE, d, prefix, a, b, ad, al):
            n = (rb - ra) * _prod(self.shape[rd + 1 :])
            scratch = work.buffer(self, n + 8)
            with np.errstate(over="ignore", invalid="ignore", under="ignore"):  # inf/NaN results are values
                self._piece(rd, rp, ra, rb, out[pos : pos + n], scratch)
            pos += n
        assert pos == (b - a) * inner

    def _piece(self, d: int, prefix, a: int, b: int, out: np.ndarray, scratch: np.ndarray) -> None:
        q = self.q
        if q is None:
            v = self._values(d, prefix, a, b, out)
            if not _same(v, out):
                out[...] = v
            return
        if isinstance(q, PerTensorAffine):
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
        p0, p1, s0, s1, q0, q1 = _box3(self.shape, self.axis, d, prefix, a, b)
        P, n, Q = p1 - p0, s1 - s0, q1 - q0
        use_int = False
        if self.zero is not None:
            zmax_ok = self.et.bits <= 16
            if zmax_ok:
                zr = self.zero.raw[p0:p1, q0:q1, s0 // self.block : -(-s1 // self.block)]
                if zr.size and int(np.abs(zr.astype(np.int64)).max()) > (1 << 24) - (1 << 16):
                    zmax_ok = False
            use_int = not zmax_ok
        if use_int:
            v = self._ints(d, prefix, a, b)
        else:
            v = self._values(d, prefix, a, b, scratch)
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
            if z is None:
                np.multiply(vv, s, out=oo)
            elif use_int:
                np.multiply((vv - z).astype(np.float32), s, out=oo)
            else:
                np.subtract(vv, z.astype(np.float32), out=oo)
                np.multiply(oo, s, out=oo)
            x = g


_LITTLE = np.little_endian


@functools.cache
def _f16_table() -> np.ndarray:
    """float32 value of every float16 bit pattern (numpy's own cast, tabulated: a gather is
    ~3x faster than numpy's float16 → float32 conversion loop)."""
    t = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    t.flags.writeable = False
    return t


def _to_f32(raw: np.ndarray) -> np.ndarray:
    """Widen float16 / bfloat16 / float32 scales to float32, losslessly."""
    if raw.dtype.itemsize == 2 and raw.dtype.kind == "f":  # float16
        return np.take(_f16_table(), raw.view(np.uint16), mode="clip")
    if raw.dtype.itemsize == 2:  # bfloat16: the high half of a float32
        return (raw.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return raw.astype(np.float32, copy=False)


def _spread(b8: np.ndarray, bits: int) -> np.ndarray:
    """Unpack 4-bit codes (LSB-first) into one uint8 per code with whole-word shifts: each
    byte widens to a uint16 whose little-endian bytes are its two codes — a few SIMD passes,
    measurably faster than a per-byte table gather (for 2-bit codes the table wins).
    Little-endian hosts only."""
    assert bits == 4
    w = b8.astype(np.uint16)
    hi = np.left_shift(w, 4)
    np.bitwise_and(hi, 0x0F00, out=hi)
    np.bitwise_and(w, 0x000F, out=w)
    np.bitwise_or(w, hi, out=w)
    return w.view(np.uint8)


def _int_range(et: ElementType) -> tuple[int, int]:
    if et.kind == "int":
        return -(1 << (et.bits - 1)), (1 << (et.bits - 1)) - 1
    return 0, (1 << et.bits) - 1


def _c_strides(shape) -> tuple[int, ...]:
    st = []
    acc = 1
    for n in reversed(shape):
        st.append(acc)
        acc *= int(n)
    return tuple(reversed(st))


def _f_strides(shape) -> tuple[int, ...]:
    st = []
    acc = 1
    for n in shape:
        st.append(acc)
        acc *= int(n)
    return tuple(st)


class _Work:
    """Reusable float32 work buffers for one dequantization call, private to each thread
    and decoder (fresh 1 MiB allocations would page-fault on every piece).  Dropped with
    the call, so nothing outlives it."""

    def __init__(self) -> None:
        self._local = threading.local()

    def buffer(self, owner: object, n: int) -> np.ndarray:
        pool = getattr(self._local, "pool", None)
        if pool is None:
            pool = self._local.pool = {}
        buf = pool.get(id(owner))
        if buf is None or buf.size < n:
            buf = pool[id(owner)] = np.empty(max(n, _PIECE + 8), dtype=np.float32)
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
    role: int | None


class _Composite:
    """Partition and sealed-overlay composites, evaluated region by region."""

    def __init__(self, t: Tensor, strict: bool, depth: int) -> None:
        self.name = t.name
        desc = t.descriptor
        head = desc.layout
        assert isinstance(head, CompositeHead)
        if depth >= _MAX_DEPTH:
            raise FormatError(f"composites nest deeper than {_MAX_DEPTH} levels", tensor=self.name, field="layout_tag")
        if any(n is None for n in desc.shape):
            raise UnsupportedError("a dynamic dimension has no values to read", tensor=self.name, field="shape")
        self.logical_shape = tuple(int(n) for n in desc.shape)  # type: ignore[arg-type]
        self.shape = self.logical_shape or (1,)
        self.size = _prod(self.shape)
        if desc.buffers or desc.quantization is not None or desc.byte_offset:
            raise FormatError("a composite head owns no data: no buffers, quantization or byte_offset",
                              tensor=self.name, field="layout_tag")
        self.rule = head.composition_rule
        self.op = head.combine_op
        if self.rule not in (RULE_PARTITION, RULE_OVERLAY):
            what = "group" if self.rule == 3 else f"rule {self.rule:#04x}"
            raise UnsupportedError(f"a {what} composite has no single value view to dequantize",
                                   tensor=self.name, field="composition_rule")
        if self.rule == RULE_OVERLAY and self.op not in (OP_ADD, OP_REPLACE):
            raise FormatError(f"overlay combine_op {self.op:#04x} is neither replace nor add",
                              tensor=self.name, field="combine_op")
        if self.rule == RULE_PARTITION and self.op != 0:
            raise FormatError(f"partition combine_op must be 0, not {self.op:#04x}", tensor=self.name, field="combine_op")
        if len(t.members) != head.member_count:
            raise InconsistentError(f"the head declares {head.member_count} members, {len(t.members)} are attached",
                                    tensor=self.name, field="member_count")
        et = desc.element_type
        self.head_type = et
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
        members = []
        for i, m in enumerate(t.members):
            md = m.descriptor
            where = f"member {i} ({m.name!r})"
            if md.shard is None:
                raise FormatError(f"{where} has no shard section", tensor=self.name, field="shard")
            if tuple(md.shard.parent_shape) != self.logical_shape:
                raise InconsistentError(f"{where}: shard parent_shape {tuple(md.shard.parent_shape)} != head shape "
                                        f"{self.logical_shape}", tensor=self.name, field="shard.parent_shape")
            off = tuple(int(o) for o in md.shard.offset) or (0,)
            if any(n is None for n in md.shape):
                raise UnsupportedError(f"{where} has a dynamic dimension", tensor=self.name, field="shape")
            mshape = tuple(int(n) for n in md.shape) or (1,)  # type: ignore[arg-type]
            if len(off) != len(self.shape) or len(mshape) != len(self.shape):
                raise InconsistentError(f"{where}: rank differs from the head's", tensor=self.name, field="shard.offset")
            if any(o + n > h for o, n, h in zip(off, mshape, self.shape)):
                raise InconsistentError(f"{where}: box at {off} of shape {mshape} exceeds the head shape "
                                        f"{self.logical_shape}", tensor=self.name, field="shard.offset")
            role = md.composite_member.role if md.composite_member is not None else None
            if self.rule == RULE_OVERLAY:
                if role is None:
                    raise FormatError(f"{where} has no composite-member section", tensor=self.name,
                                      field="composite_member")
                want = ROLE_BASE if i == 0 else ROLE_CORRECTION
                if role != want:
                    raise FormatError(f"{where} has role {role}, expected {'base' if i == 0 else 'correction'}",
                                      tensor=self.name, field="member_role")
                if i == 0 and (any(off) or mshape != self.shape):
                    raise InconsistentError(f"{where}: the base must span the whole head", tensor=self.name,
                                            field="shard.offset")
            elif role is not None:
                raise FormatError(f"{where}: a partition member must not carry a composite-member section",
                                  tensor=self.name, field="composite_member")
            members.append(_Member(_make(m, strict, depth + 1), off, mshape, role))
        if self.rule == RULE_OVERLAY and not members:
            raise FormatError("an overlay needs a base member", tensor=self.name, field="member_count")
        if self.rule == RULE_PARTITION:
            self._check_partition(members)
        self.members = tuple(members)

    def _check_partition(self, members: list[_Member]) -> None:
        total = sum(_prod(m.shape) for m in members)
        for i, m in enumerate(members):
            for j in range(i):
                o = members[j]
                if all(m.offset[k] < o.offset[k] + o.shape[k] and o.offset[k] < m.offset[k] + m.shape[k]
                       for k in range(len(self.shape))) and _prod(m.shape) and _prod(o.shape):
                    raise InconsistentError(f"partition members {j} and {i} overlap", tensor=self.name,
                                            field="shard.offset")
        if total != self.size:
            raise InconsistentError(f"partition members cover {total} of {self.size} elements",
                                    tensor=self.name, field="shard.offset")

    align = (-1, 1)

    def fill(self, d: int, prefix, a: int, b: int, out: np.ndarray, work: "_Work") -> None:
        pos = 0
        for rd, rp, ra, rb in _regions(self.shape, _PIECE, d, prefix, a, b):
            n = (rb - ra) * _prod(self.shape[rd + 1 :])
            with np.errstate(over="ignore", invalid="ignore", under="ignore"):
                self._piece(rd, rp, ra, rb, out[pos : pos + n], work)
            pos += n

    def _piece(self, d: int, prefix, a: int, b: int, out: np.ndarray, work: "_Work") -> None:
        o = out.reshape((b - a, *self.shape[d + 1 :]))
        for idx, m in enumerate(self.members):
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
            if not add and dst.flags.c_contiguous:
                flat = _view_reshape(dst, (count,))
                m.decoder.fill(d, mprefix, a2 - off[d], b2 - off[d], flat, work)
                if self.round is not None:
                    self.round(flat)
                continue
            tmp = work.buffer(m, count)[:count]
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
    if not isinstance(t, Tensor):
        raise UsageError(f"expected a hurray_interop Tensor, got {type(t).__name__}")
    if isinstance(t.descriptor.layout, CompositeHead):
        return _Composite(t, strict, depth)
    return _Dense(t, strict)


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
    chunk is produced; with ``strict=False`` the *value* rules (finite non-zero
    scales, MXFP scale bytes 0x00/0xFF, zero-point ranges) are not enforced and
    such values decode arithmetically (0x00 → 2^-127, 0xFF → NaN).  ``threads``
    parallelizes the evaluation of each chunk (see :func:`dequantize`).
    """
    if max_elements < 1:
        raise UsageError(f"max_elements must be positive, not {max_elements}", tensor=tensor.name)
    dec = _make(tensor, strict)  # validate now, not at the first next()
    return _iter(dec, max_elements, threads)


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
