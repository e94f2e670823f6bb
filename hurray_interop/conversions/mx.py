"""OCP Microscaling (MX) tensors in memory <-> Hurray MXFP (scheme 0x05) tensors.

What comes in and goes out
--------------------------
* element **codes** + E8M0 **scale bytes** + ``block_size`` + ``axis``, as
  - numpy arrays: ml_dtypes ``float8_e4m3fn``, ``float8_e5m2``, ``float6_e2m3fn``,
    ``float6_e3m2fn``, ``float4_e2m1fn``, ``int4`` (one code per byte), ``int8``, or
    ``uint8`` raw codes (then ``element=`` says what they are, and ``packed=True`` says the
    bytes are already Hurray-packed along the last axis: two FP4/INT4 codes per byte, four
    FP6 codes per three bytes);
  - torch tensors: ``float8_e4m3fn``, ``float8_e5m2``, ``float4_e2m1fn_x2`` (two codes per
    byte, the shape counts bytes), ``int8``, ``uint8``; scales ``float8_e8m0fnu`` or ``uint8``;
  - torchao ``MXTensor`` (:func:`from_torchao` / :func:`to_torchao`), swizzled scales and
    transposed (dim-0 blocked) tensors included.
* a Hurray :class:`~hurray_interop.core.model.Tensor` with ``MXFP(axis, block_size, 1)``:
  buffer 0 = codes in row-major order packed LSB-first (element-types.md), buffer 1 = one
  scale byte per block in Hurray block order ``b = outer * (S/K) + i_axis // K``.

torch and torchao are optional: they are imported inside the functions that need them.

Exactness rules (docs/conversion-rules.md §§ 4, 6, 8)
------------------------------------------------
* Codes and scale bytes move unchanged; only the packing changes (FP6 one-code-per-byte
  -> 4 codes in 3 bytes; FP4 from torch/gpt-oss/compressed-tensors is already Hurray's).
  Negative zero stays a code.
* Scale 0x00 (OCP: 2^-127) on a block whose codes are all +-0 is replaced by 0x7F and
  recorded (:attr:`MXImport.kv`, key ``hurray_interop.scale_substitutions.<name>``,
  :mod:`hurray_interop.core.records`); the exporters put the original byte back.
* Scale 0x00 on a block holding a non-zero code, and 0xFF (NaN block) anywhere, are not
  representable: :class:`~hurray_interop.errors.ConversionRefused` names the tensor and
  the first offending block, unless ``fallback`` ("float32", "float16", "bfloat16") is
  chosen -- then the tensor is stored dequantized (plain) and :class:`MXImport` says
  whether that is value-exact or lossy, with the max abs error.
* OCP MXINT8 elements are Q1.6 (an implied 2^-6); Hurray int8 MXFP is ``s * int8``.
  The bytes are copied and the scale is shifted: ``e_hurray = e_ocp - 6`` (and back), see
  ``ocp_exponent_shift`` in ``mappings/mx_types.toml``.  Blocks where that leaves
  [1, 254] are refused (all-zero blocks are substituted as above).  Pass
  ``int8="hurray"`` for int8 codes that already mean ``s * int8``.

Quantization (:func:`quantize_ocp`, :func:`quantize`) follows OCP MX v1.0 § 6.3 exactly as
torchao's ``to_mx`` FLOOR mode computes it (bit for bit, see tests/test_mx_oracles.py):
shared exponent = (biased float32 exponent of amax) - 127 - emax_elem, clamped to
[-127, 128]; elements = x / 2^shared (float32, with the divisor clamped to 2^-126 as
torchao does), saturated to +-max and cast round-to-nearest-even.  :func:`quantize`
produces a Hurray tensor and therefore differs from the OCP bytes in exactly two places:
an all-zero block gets scale 0x7F instead of 0x00, and a non-zero block whose exponent
would clamp to 2^-127 gets 0x01 (2^-126) -- the divisor torchao used for its codes anyway.
Non-finite inputs are refused.  MXINT8: codes = clamp(RNE(x * 64 / X), -127, 127);
MXINT4 (Hurray only): codes = clamp(RNE(x / 2^(floor(log2 amax) - 2)), -7, 7).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import ml_dtypes
import numpy as np

from ..core.elements import ElementType, buffer_size, element_type, pack, unpack
from ..core.model import MXFP, BufferHandle, Descriptor, RowMajor, Tensor
from ..core.records import encode_scale_record, restore_scales, scale_record_key
from ..errors import ConversionRefused, FormatError, InconsistentError, UnsupportedError, UsageError
from ..report import EXACT
from ..tables import load_table
from . import fallback as fallbacks

__all__ = [
    "MXElement",
    "MX_ELEMENTS",
    "mx_element",
    "MXImport",
    "MXCodes",
    "SUBSTITUTE_SCALE",
    "from_codes",
    "from_torchao",
    "to_numpy",
    "to_torch",
    "to_torchao",
    "mxfp_tensor",
    "mxfp_geometry",
    "check_block",
    "source_values",
    "quantize_ocp",
    "quantize",
    "ocp_scale_bytes",
]



# ---------------------------------------------------------------------------
# the MX element table


@dataclass(frozen=True)
class MXElement:
    """One row of ``mappings/mx_types.toml`` ``[elements.*]``."""

    name: str
    hurray: ElementType
    ocp: str
    torch: str
    torch_packed: bool
    torchao: str
    ml_dtypes: str
    emax_elem: int
    max_code: float
    ocp_exponent_shift: int
    source_packing: str
    zero_mask: int
    safetensors: str

    @property
    def bits(self) -> int:
        return self.hurray.bits

    @property
    def is_int(self) -> bool:
        return self.hurray.kind == "int"

    @property
    def np_dtype(self) -> np.dtype:
        """numpy/ml_dtypes dtype of one unpacked code."""
        return np.dtype(getattr(ml_dtypes, self.ml_dtypes)) if hasattr(ml_dtypes, self.ml_dtypes) else np.dtype(self.ml_dtypes)

    @property
    def code_mask(self) -> int:
        return (1 << self.bits) - 1

    def __str__(self) -> str:
        return self.name


def _build() -> Mapping[str, MXElement]:
    out: dict[str, MXElement] = {}
    for name, row in load_table("mx_types")["elements"].items():
        out[name] = MXElement(
            name=name,
            hurray=element_type(str(row["hurray"])),
            ocp=str(row["ocp"]),
            torch=str(row["torch"]),
            torch_packed=bool(row["torch_packed"]),
            torchao=str(row["torchao"]),
            ml_dtypes=str(row["ml_dtypes"]),
            emax_elem=int(row["emax_elem"]),
            max_code=float(row["max_code"]),
            ocp_exponent_shift=int(row["ocp_exponent_shift"]),
            source_packing=str(row["source_packing"]),
            zero_mask=int(row["zero_mask"]),
            safetensors=str(row["safetensors"]),
        )
    return out


MX_ELEMENTS: Mapping[str, MXElement] = _build()
SUBSTITUTE_SCALE: int = int(load_table("mx_types")["scale"]["substitute"])


@functools.cache
def _aliases() -> dict[str, MXElement]:
    al: dict[str, MXElement] = {}
    for el in MX_ELEMENTS.values():
        for key in (el.name, el.hurray.name, el.torch, el.torchao, el.ml_dtypes, el.ocp):
            if key:
                al.setdefault(key.lower(), el)
    extra = {
        "fp8_e4m3": "float8_e4m3", "e4m3": "float8_e4m3", "mxfp8": "float8_e4m3", "mxfp8_e4m3": "float8_e4m3",
        "fp8_e5m2": "float8_e5m2", "e5m2": "float8_e5m2", "mxfp8_e5m2": "float8_e5m2",
        "e2m3": "float6_e2m3", "mxfp6_e2m3": "float6_e2m3", "e3m2": "float6_e3m2", "mxfp6_e3m2": "float6_e3m2",
        "fp4": "float4_e2m1", "e2m1": "float4_e2m1", "fp4_e2m1": "float4_e2m1", "mxfp4": "float4_e2m1",
        "mxint8": "int8", "mxint4": "int4",
    }
    for k, v in extra.items():
        al[k] = MX_ELEMENTS[v]
    return al


def mx_element(key: Any) -> MXElement:
    """Look up an MX element type by name, Hurray element type, torch dtype, numpy dtype
    or torchao ``elem_dtype`` (``"fp6_e2m3"``) -- ``UnsupportedError`` if it is not one."""
    if isinstance(key, MXElement):
        return key
    if isinstance(key, ElementType):
        key = key.name
    elif not isinstance(key, str):
        if type(key).__module__.startswith("torch"):
            key = str(key).removeprefix("torch.")
        else:
            try:
                key = np.dtype(key).name
            except TypeError:
                raise UnsupportedError(f"{key!r} is not an MX element type") from None
    try:
        return _aliases()[key.lower()]
    except KeyError:
        raise UnsupportedError(
            f"{key!r} is not an MX element type (one of: {', '.join(MX_ELEMENTS)})"
        ) from None


# ---------------------------------------------------------------------------
# results


@dataclass
class MXImport:
    """The outcome of importing one MX tensor into Hurray."""

    tensor: Tensor
    element: MXElement
    status: str = EXACT  # report.EXACT, or report.VALUE_EXACT / LOSSY for a fallback
    substituted_blocks: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    original_scales: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    max_abs_error: float | None = None
    reason: str = ""

    @property
    def record(self) -> bytes | None:
        """The scale-substitution record (bytes) to store, or ``None``."""
        if self.substituted_blocks.size == 0:
            return None
        return encode_scale_record(self.substituted_blocks, self.original_scales)

    @property
    def kv(self) -> dict[str, bytes]:
        """KV entries a .hrry writer must store next to the tensor."""
        rec = self.record
        return {} if rec is None else {scale_record_key(self.tensor.name): rec}


@dataclass
class MXCodes:
    """An MX tensor outside Hurray: codes (numpy or torch), scales, and the block geometry.

    ``scales`` has the codes' logical shape with ``shape[axis] // block_size`` in place of
    the blocked axis and holds OCP scale bytes (MXINT8: OCP Q1.6 convention unless asked).
    """

    codes: Any
    scales: Any
    element: MXElement
    block_size: int
    axis: int
    shape: tuple[int, ...]


# ---------------------------------------------------------------------------
# helpers


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise UnsupportedError("torch is not installed (pip install 'hurray-interop[torch]')") from None
    return torch


def _torchao_mx() -> Any:
    _torch()
    try:
        from torchao.prototype.mx_formats import mx_tensor
    except ImportError:
        raise UnsupportedError("torchao is not installed (pip install 'hurray-interop[torch]')") from None
    return mx_tensor


def _is_torch(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "dtype") and hasattr(x, "numpy")


def _torch_to_numpy(t: Any) -> tuple[np.ndarray, str]:
    """(numpy array of the raw bytes/values, torch dtype name)."""
    torch = _torch()

    name = str(t.dtype).removeprefix("torch.")
    t = t.detach().cpu().contiguous()
    if t.dtype in (torch.int8, torch.uint8):
        return t.numpy(), name
    if t.element_size() != 1:
        raise UsageError(f"torch dtype {name} is not an MX code or scale dtype")
    return t.view(torch.uint8).numpy(), name


def _check_geometry(shape: tuple[int, ...], block_size: int, axis: int, name: str) -> int:
    rank = len(shape)
    if rank == 0:
        raise UsageError("an MXFP tensor needs rank >= 1", tensor=name)
    if not -rank <= axis < rank:
        raise UsageError(f"axis {axis} out of range for rank {rank}", tensor=name)
    axis %= rank
    if block_size < 16 or block_size > 2048 or block_size & (block_size - 1):
        raise UsageError(f"block size {block_size} is not a power of two in [16, 2048]", tensor=name)
    s = shape[axis]
    if s <= 0 or s % block_size:
        raise InconsistentError(
            f"shape[{axis}] = {s} is not a positive multiple of the block size {block_size} "
            "(Hurray MXFP has no partial blocks)",
            tensor=name,
        )
    return axis


def _blocked_shape(shape: tuple[int, ...], block_size: int, axis: int) -> tuple[int, ...]:
    return tuple(d // block_size if i == axis else d for i, d in enumerate(shape))


def _scales_to_hurray_order(scales: np.ndarray, axis: int) -> np.ndarray:
    """Natural blocked shape -> 1-D bytes in Hurray block order (zero-copy for the last axis)."""
    s = scales if axis == scales.ndim - 1 else np.moveaxis(scales, axis, -1)
    return np.ascontiguousarray(s).reshape(-1)


def _scales_from_hurray_order(buf: np.ndarray, shape: tuple[int, ...], block_size: int, axis: int) -> np.ndarray:
    rank = len(shape)
    other = tuple(d for i, d in enumerate(shape) if i != axis)
    arr = np.asarray(buf, dtype=np.uint8).reshape(other + (shape[axis] // block_size,))
    if axis != rank - 1:
        arr = np.ascontiguousarray(np.moveaxis(arr, -1, axis))
    return arr


def _block_codes(codes: np.ndarray, shape: tuple[int, ...], block_size: int, axis: int) -> np.ndarray:
    """Unpacked codes (logical shape) -> [num_blocks, block_size] in Hurray block order."""
    c = codes.reshape(shape)
    if axis != len(shape) - 1:
        c = np.moveaxis(c, axis, -1)
    return np.ascontiguousarray(c).reshape(-1, block_size)


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


def mxfp_tensor(
    name: str, element: Any, shape: tuple[int, ...], data: np.ndarray, scales: np.ndarray, block_size: int, axis: int
) -> Tensor:
    """Assemble a Hurray MXFP tensor from Hurray-packed data bytes and Hurray-order scale
    bytes (no checks beyond sizes; :func:`from_codes` is the checked entry point)."""
    el = mx_element(element)
    data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    scales = np.ascontiguousarray(scales).reshape(-1).view(np.uint8)
    desc = Descriptor(
        element_type=el.hurray,
        shape=tuple(int(d) for d in shape),
        buffers=(BufferHandle.cpu(int(data.size)), BufferHandle.cpu(int(scales.size))),
        layout=RowMajor(),
        quantization=MXFP(axis=axis, block_size=block_size, scale_buffer_index=1),
    )
    return Tensor(name=name, descriptor=desc, data=(_readonly(data), _readonly(scales)))


def _plain_tensor(name: str, values: np.ndarray, et_name: str) -> Tensor:
    et = element_type(et_name)
    raw = np.ascontiguousarray(values.astype(et.dtype)).reshape(-1).view(np.uint8)
    desc = Descriptor(element_type=et, shape=tuple(values.shape), buffers=(BufferHandle.cpu(int(raw.size)),))
    return Tensor(name=name, descriptor=desc, data=(_readonly(raw),))


# ---------------------------------------------------------------------------
# scale checks (shared with the safetensors importer)


@dataclass
class _ScaleCheck:
    scales: np.ndarray  # Hurray scale bytes (substituted where allowed)
    blocks: np.ndarray  # substituted block indices
    originals: np.ndarray  # their source bytes
    bad_block: int | None = None  # first unrepresentable block
    bad_reason: str = ""
    bad_count: int = 0


def check_block(
    scales_src: np.ndarray,
    element: MXElement,
    block_codes: Callable[[np.ndarray], np.ndarray],
    *,
    int8: str = "ocp",
) -> _ScaleCheck:
    """Map source scale bytes (1-D, Hurray block order) to Hurray scale bytes.

    ``block_codes(idx)`` returns the unpacked codes of the blocks ``idx`` as
    ``[len(idx), block_size]`` (only called for the rare blocks with a suspicious scale).
    """
    src = np.asarray(scales_src, dtype=np.uint8).reshape(-1)
    shift = element.ocp_exponent_shift if int8 == "ocp" else 0
    if shift:
        hur = src.astype(np.int16) + shift
        low = (hur < 1) | (src == 0xFF)
    else:
        hur = src
        low = (src == 0x00) | (src == 0xFF)
    suspicious = np.flatnonzero(low)
    if suspicious.size == 0:
        out = hur.astype(np.uint8) if shift else src
        return _ScaleCheck(out, np.zeros(0, np.uint64), np.zeros(0, np.uint8))
    codes = block_codes(suspicious)
    zero = ~np.any((codes.astype(np.uint8) & element.zero_mask) != 0, axis=1)
    nan = src[suspicious] == 0xFF
    subst = zero & ~nan
    bad = ~subst
    out = np.array(hur, dtype=np.int16 if shift else np.uint8, copy=True)
    out[suspicious[subst]] = SUBSTITUTE_SCALE
    chk = _ScaleCheck(out.astype(np.uint8), suspicious[subst].astype(np.uint64), src[suspicious[subst]].copy())
    if bad.any():
        first = int(suspicious[bad][0])
        b = int(src[first])
        chk.bad_block = first
        chk.bad_count = int(bad.sum())
        if b == 0xFF:
            chk.bad_reason = f"scale byte 0xFF (NaN block) at block {first}"
        elif shift:
            chk.bad_reason = (
                f"OCP MXINT8 scale byte {b:#04x} at block {first} (a block with non-zero codes) "
                f"is 2^{b - 127 + shift} in Hurray's s*int8 form, below the E8M0 range"
            )
        else:
            chk.bad_reason = f"scale byte 0x00 (2^-127) at block {first}, a block with non-zero codes"
        if chk.bad_count > 1:
            chk.bad_reason += f" ({chk.bad_count} blocks in all)"
    return chk


# ---------------------------------------------------------------------------
# source decoding (the MX ecosystem's value semantics, via ml_dtypes)


def _source_values64(
    codes: np.ndarray, scales: np.ndarray, el: MXElement, block_size: int, axis: int, int8: str
) -> np.ndarray:
    c = np.asarray(codes)
    axis %= c.ndim
    raw = c.view(np.uint8) if c.dtype.itemsize == 1 else c.astype(np.uint8)
    if el.is_int:
        vals = raw.view(np.int8) if el.bits == 8 else ((raw & 0x0F) << 4).view(np.int8) >> 4
        v = vals.astype(np.float64)
        if int8 == "ocp" and el.ocp_exponent_shift:
            v = v * 2.0**el.ocp_exponent_shift
    else:
        v = (raw & el.code_mask).view(el.np_dtype).astype(np.float64)
    s = np.asarray(scales).view(np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    return v * np.repeat(s, block_size, axis=axis)


def source_values(
    codes: np.ndarray, scales: np.ndarray, element: Any, block_size: int, axis: int = -1, *, int8: str = "ocp"
) -> np.ndarray:
    """Decode unpacked MX codes (logical shape) and natural-shape OCP scale bytes to float32
    the way ml_dtypes / torch decode them: ``code_value * 2^(e - 127)`` (0xFF -> NaN, 0x00 ->
    2^-127; MXINT8 with ``int8="ocp"`` includes the implied 2^-6).  Exact in float32 except
    overflow to inf."""
    el = mx_element(element)
    with np.errstate(over="ignore"):
        return _source_values64(codes, scales, el, block_size, axis, int8).astype(np.float32)


def _fallback_import(
    name: str, el: MXElement, codes: np.ndarray, scales_nat: np.ndarray, block_size: int, axis: int,
    fallback: str, reason: str, int8: str,
) -> MXImport:
    fallbacks.check(fallback, tensor=name)
    exact = _source_values64(codes, scales_nat, el, block_size, axis, int8)
    stored = fallbacks.cast(exact, fallback)
    err = fallbacks.max_abs_error(exact, stored)
    t = _plain_tensor(name, stored, fallback)
    return MXImport(t, el, fallbacks.status(err), max_abs_error=err, reason=f"{reason}; stored dequantized as {fallback}")


# ---------------------------------------------------------------------------
# import


def _normalize_codes(
    codes: Any, element: Any, packed: bool | None, name: str
) -> tuple[MXElement, np.ndarray, bool, tuple[int, ...] | None]:
    """-> (element, numpy array, already Hurray-packed?, logical shape if packed)."""
    torch_name = ""
    if _is_torch(codes):
        codes, torch_name = _torch_to_numpy(codes)
    arr = np.asarray(codes)
    el: MXElement | None = None
    if torch_name and torch_name not in ("uint8", "int8"):
        el = mx_element(torch_name)
        if el.torch_packed:
            packed = True
    elif arr.dtype != np.uint8:
        if arr.dtype.itemsize != 1:
            raise UsageError(f"codes dtype {arr.dtype} is not an MX code dtype", tensor=name)
        el = mx_element(arr.dtype)
    if element is not None:
        want = mx_element(element)
        if el is not None and el is not want:
            raise UsageError(f"codes have dtype {el.name} but element={want.name} was given", tensor=name)
        el = want
    if el is None:
        raise UsageError("uint8 codes need element= (the MX element type they hold)", tensor=name)
    if packed and el.hurray.packed:
        per_num, per_den = (2, 1) if el.bits == 4 else (4, 3)
        if arr.ndim == 0 or (arr.shape[-1] * per_num) % per_den:
            raise InconsistentError(f"packed {el.name} rows of {arr.shape[-1:]} bytes do not hold whole codes", tensor=name)
        shape = arr.shape[:-1] + (arr.shape[-1] * per_num // per_den,)
        return el, arr, True, shape
    return el, arr, False, None


def _normalize_scales(scales: Any, name: str) -> np.ndarray:
    if _is_torch(scales):
        scales, tname = _torch_to_numpy(scales)
        if tname not in ("float8_e8m0fnu", "uint8"):
            raise UsageError(f"scales must be float8_e8m0fnu or uint8, not torch.{tname}", tensor=name)
    arr = np.asarray(scales)
    if arr.dtype not in (np.dtype(np.uint8), np.dtype(ml_dtypes.float8_e8m0fnu)):
        raise UsageError(f"scales must be float8_e8m0fnu or uint8, not {arr.dtype}", tensor=name)
    return arr.view(np.uint8)


def from_codes(
    codes: Any,
    scales: Any,
    *,
    element: Any = None,
    block_size: int = 32,
    axis: int = -1,
    name: str = "tensor",
    packed: bool | None = None,
    int8: str = "ocp",
    fallback: str | None = None,
) -> MXImport:
    """Build a Hurray MXFP tensor from MX codes and E8M0 scale bytes (numpy or torch).

    ``scales`` must have the codes' logical shape with ``shape[axis] // block_size`` on the
    block axis.  Raises :class:`ConversionRefused` for unrepresentable scales (see module
    doc) unless ``fallback`` is given.
    """
    if int8 not in ("ocp", "hurray"):
        raise UsageError(f"int8 must be 'ocp' or 'hurray', not {int8!r}", tensor=name)
    fallback = fallbacks.dtype_choice(fallback, tensor=name)  # exact: no dtype fallback
    el, arr, is_packed, pshape = _normalize_codes(codes, element, packed, name)
    shape = tuple(int(d) for d in (pshape if is_packed else arr.shape))
    axis = _check_geometry(shape, block_size, axis, name)
    sc = _normalize_scales(scales, name)
    want = _blocked_shape(shape, block_size, axis)
    if sc.shape != want:
        raise InconsistentError(
            f"scales have shape {list(sc.shape)}, codes of shape {list(shape)} with block size "
            f"{block_size} along axis {axis} need {list(want)}",
            tensor=name,
            field="scales",
        )
    n = int(np.prod(shape))
    if is_packed:
        data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)

        def unpacked() -> np.ndarray:
            return unpack(data, el.hurray, n)

    else:
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        if el.hurray.packed:
            if np.any(raw & ~np.uint8(el.code_mask)):
                first = int(np.flatnonzero(raw & ~np.uint8(el.code_mask))[0])
                raise FormatError(
                    f"{el.name} code byte {int(raw[first]):#04x} at element {first} has bits above the "
                    f"low {el.bits} set (one code per byte expected)",
                    tensor=name,
                )
            data = pack(raw, el.hurray)
        else:
            data = raw

        def unpacked() -> np.ndarray:
            return raw

    src_scales = _scales_to_hurray_order(sc, axis)

    def block_codes(idx: np.ndarray) -> np.ndarray:
        if axis == len(shape) - 1:
            # blocks are contiguous runs of the stream: touch only the suspicious ones
            if is_packed:
                bpb = block_size * el.bits // 8
                sel = data.reshape(-1, bpb)[idx].reshape(-1)
                return unpack(sel, el.hurray, idx.size * block_size).reshape(-1, block_size)
            return raw.reshape(-1, block_size)[idx]
        return _block_codes(unpacked(), shape, block_size, axis)[idx]

    chk = check_block(src_scales, el, block_codes, int8=int8)
    if chk.bad_block is not None:
        if fallback is None:
            raise ConversionRefused(
                f"not representable in Hurray MXFP: {chk.bad_reason}",
                tensor=name,
                reasons=[(name, el.ocp or el.name, chk.bad_reason)],
            )
        codes_u = unpacked().reshape(shape)
        return _fallback_import(name, el, codes_u, sc, block_size, axis, fallback, chk.bad_reason, int8)
    t = mxfp_tensor(name, el, shape, data, chk.scales, block_size, axis)
    return MXImport(t, el, EXACT, chk.blocks, chk.originals)


# ---------------------------------------------------------------------------
# export


def mxfp_geometry(tensor: Tensor) -> tuple[MXElement, tuple[int, ...], int, int]:
    """Check that ``tensor`` is an exportable MXFP tensor; return (element, shape,
    block_size, axis)."""
    d = tensor.descriptor
    q = d.quantization
    if not isinstance(q, MXFP):
        raise UnsupportedError("not an MXFP (0x05) tensor", tensor=tensor.name)
    if not isinstance(d.layout, RowMajor) or d.byte_offset:
        raise UnsupportedError("only row-major MXFP tensors with byte_offset 0 are exported", tensor=tensor.name)
    if any(s is None for s in d.shape):
        raise UnsupportedError("dynamic dimensions cannot be exported", tensor=tensor.name)
    el = mx_element(d.element_type)
    shape = tuple(int(s) for s in d.shape)  # type: ignore[arg-type]
    axis = _check_geometry(shape, q.block_size, q.axis, tensor.name)
    nblocks = int(np.prod(shape)) // q.block_size
    if q.scale_buffer_index == 0 or q.scale_buffer_index >= len(tensor.data):
        raise FormatError(f"scale buffer index {q.scale_buffer_index} is not a parameter buffer", tensor=tensor.name)
    if tensor.data[q.scale_buffer_index].size != nblocks:
        raise InconsistentError(
            f"scale buffer holds {tensor.data[q.scale_buffer_index].size} bytes, {nblocks} blocks need as many",
            tensor=tensor.name,
        )
    return el, shape, q.block_size, axis


def _stand_in(shift: int, originals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rule :func:`check_block` follows, for a substitution record: the source bytes it
    replaces on all-zero blocks (below the E8M0 range once shifted, never 0xFF) and the
    stand-in it stores for them."""
    low = (originals.astype(np.int16) + shift < 1) if shift else originals == 0x00
    return low & (originals != 0xFF), np.full(originals.shape, SUBSTITUTE_SCALE, np.uint8)


def _export_scales(tensor: Tensor, el: MXElement, record: bytes | None, int8: str) -> np.ndarray:
    q = tensor.descriptor.quantization
    assert isinstance(q, MXFP)
    hs = np.asarray(tensor.data[q.scale_buffer_index]).view(np.uint8)
    shift = el.ocp_exponent_shift if int8 == "ocp" else 0
    if shift:
        o = hs.astype(np.int16) - shift
        bad = np.flatnonzero(o > 254)
        out = o.clip(0, 255).astype(np.uint8)
    else:
        bad = np.zeros(0, np.intp)
        out = np.array(hs, copy=True)
    if record is not None:
        # checked against the stored scales, whose recorded blocks hold the stand-in (never out
        # of the OCP range, so none of them is in ``bad``); the originals go into ``out``
        out = restore_scales(hs, record, key=scale_record_key(tensor.name), rule=functools.partial(_stand_in, shift),
                             tensor=tensor.name, into=out)
    if bad.size:
        raise ConversionRefused(
            f"Hurray scale byte {int(hs[bad[0]]):#04x} at block {int(bad[0])} is 2^{int(hs[bad[0]]) - 127}; as an OCP "
            f"MXINT8 (Q1.6) scale that is above 2^127 ({bad.size} blocks)",
            tensor=tensor.name,
            reasons=[(tensor.name, el.hurray.name, "MXINT8 scale out of OCP range")],
        )
    return out


def to_numpy(tensor: Tensor, *, record: bytes | None = None, int8: str = "ocp", packed: bool = False) -> MXCodes:
    """Hurray MXFP tensor -> numpy codes (ml_dtypes dtype, one code per byte, logical shape;
    ``packed=True``: Hurray-packed uint8 bytes along the last axis) and OCP scale bytes
    (``float8_e8m0fnu``, natural blocked shape).  ``record``: the tensor's
    scale-substitution record, if the file has one -- restores the source bytes."""
    el, shape, k, axis = mxfp_geometry(tensor)
    n = int(np.prod(shape))
    data = np.asarray(tensor.data[0]).view(np.uint8)
    if data.size != buffer_size(el.hurray, n):
        raise InconsistentError(f"data buffer holds {data.size} bytes, {n} {el.hurray.name} codes need {buffer_size(el.hurray, n)}", tensor=tensor.name)
    if packed and el.hurray.packed:
        per_num, per_den = (2, 1) if el.bits == 4 else (4, 3)
        if (shape[-1] * per_den) % per_num:
            raise UnsupportedError(f"last dimension {shape[-1]} does not pack into whole bytes", tensor=tensor.name)
        codes = data.reshape(shape[:-1] + (shape[-1] * per_den // per_num,))
    elif el.hurray.packed:
        codes = unpack(data, el.hurray, n).reshape(shape).view(el.np_dtype)
    else:
        codes = data.view(el.np_dtype).reshape(shape)
    sc = _export_scales(tensor, el, record, int8)
    scales = _scales_from_hurray_order(sc, shape, k, axis).view(ml_dtypes.float8_e8m0fnu)
    return MXCodes(codes, scales, el, k, axis, shape)


def to_torch(tensor: Tensor, *, record: bytes | None = None, int8: str = "ocp") -> MXCodes:
    """Hurray MXFP tensor -> torch codes and ``float8_e8m0fnu`` scales.

    FP8 -> ``float8_e4m3fn`` / ``float8_e5m2``; FP4 -> ``float4_e2m1fn_x2`` (two codes per
    byte along the last axis, which must be even); FP6 -> ``uint8`` one code per byte
    (torchao's convention; torch has no float6); INT8 -> ``int8``; INT4 -> ``int8`` holding
    the sign-extended values (torch's int4 is a shell dtype)."""
    torch = _torch()

    el, shape, k, axis = mxfp_geometry(tensor)
    if el.torch_packed:
        if shape[-1] % 2:
            raise UnsupportedError(f"float4_e2m1fn_x2 needs an even last dimension, not {shape[-1]}", tensor=tensor.name)
        mc = to_numpy(tensor, record=record, int8=int8, packed=True)
        codes = torch.from_numpy(np.array(mc.codes, copy=True)).view(getattr(torch, el.torch))
    else:
        mc = to_numpy(tensor, record=record, int8=int8)
        raw = np.array(mc.codes, copy=True).view(np.uint8)
        if el.name == "int4":
            codes = torch.from_numpy((((raw & 0x0F) << 4).view(np.int8) >> 4).copy())
        elif el.torch:
            codes = torch.from_numpy(raw).view(getattr(torch, el.torch))
        else:
            codes = torch.from_numpy(raw)
    scales = torch.from_numpy(np.array(mc.scales, copy=True).view(np.uint8)).view(torch.float8_e8m0fnu)
    return MXCodes(codes, scales, el, k, axis, shape)


def from_torchao(mx: Any, *, name: str = "tensor", fallback: str | None = None) -> MXImport:
    """torchao ``MXTensor`` -> Hurray MXFP tensor (blocks along the last dim; a transposed
    2-D MXTensor has its blocks along dim 0; swizzled scales are unswizzled)."""
    torch = _torch()

    el = mx_element(mx.elem_dtype)
    k = int(mx.block_size)
    q = mx.qdata
    scale = mx.scale
    transposed = not q.is_contiguous()
    if transposed:
        if q.ndim != 2 or not q.t().is_contiguous():
            raise UnsupportedError("only contiguous or 2-D transposed MXTensor qdata is supported", tensor=name)
        q = q.t()
        scale = scale.t()
    lshape = tuple(q.shape[:-1]) + ((q.shape[-1] * 2,) if el.torch_packed else (q.shape[-1],))
    if mx.is_swizzled_scales:
        from torchao.prototype.mx_formats.utils import from_blocked

        rows = int(np.prod(lshape[:-1]))
        scale = from_blocked(scale.reshape(-1), rows, lshape[-1] // k).reshape(lshape[:-1] + (lshape[-1] // k,))
    scale = scale.contiguous()
    if el.torch_packed:
        qn = q.contiguous().view(torch.uint8).numpy()
        codes_u = unpack(qn.reshape(-1), el.hurray, int(np.prod(lshape))).reshape(lshape)
    else:
        qn = q.contiguous()
        codes_u = qn.view(torch.uint8).numpy() if qn.dtype != torch.uint8 else qn.numpy()
    sn = scale.view(torch.uint8).numpy()
    if transposed:
        codes_u = codes_u.T
        sn = sn.T
        axis = 0
    else:
        axis = codes_u.ndim - 1
    return from_codes(
        np.ascontiguousarray(codes_u), np.ascontiguousarray(sn), element=el, block_size=k, axis=axis,
        name=name, packed=False, fallback=fallback,
    )


def to_torchao(tensor: Tensor, *, record: bytes | None = None, orig_dtype: Any = None) -> Any:
    """Hurray MXFP tensor -> torchao ``MXTensor`` (elements torchao supports, blocks along
    the last axis; unswizzled scales)."""
    torch = _torch()
    MXTensor = _torchao_mx().MXTensor

    el, shape, k, axis = mxfp_geometry(tensor)
    if not el.torchao:
        raise UnsupportedError(f"torchao has no MX element type for {el.name}", tensor=tensor.name)
    if axis != len(shape) - 1:
        raise UnsupportedError("torchao MXTensor blocks run along the last dimension only", tensor=tensor.name)
    mc = to_torch(tensor, record=record)
    qdata = mc.codes.view(torch.uint8) if el.torch_packed else mc.codes
    elem = getattr(torch, el.torchao) if hasattr(torch, el.torchao) and not el.torchao.startswith("fp6") else el.torchao
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    return MXTensor(
        qdata, mc.scales, elem, k, orig_dtype if orig_dtype is not None else torch.float32,
        KernelPreference.EMULATED, None, False,
    )


# ---------------------------------------------------------------------------
# quantization (OCP MX v1.0 § 6.3, torchao FLOOR bit for bit)


def _quant_core(x: Any, el: MXElement, block_size: int, axis: int, hurray: bool, name: str):
    if _is_torch(x):
        torch = _torch()
        x = x.detach().cpu().to(torch.float32).numpy()
    a = np.asarray(x)
    if a.dtype.kind != "f" and a.dtype != np.dtype(ml_dtypes.bfloat16):
        raise UsageError(f"quantize needs floating-point input, not {a.dtype}", tensor=name)
    a = a.astype(np.float32)
    shape = tuple(int(d) for d in a.shape)
    axis = _check_geometry(shape, block_size, axis, name)
    blocks = _block_codes(a, shape, block_size, axis)  # [nb, K] float32, Hurray block order
    amax = np.max(np.abs(blocks), axis=1)
    isnan = np.isnan(amax)
    if hurray and not np.all(np.isfinite(amax)):
        first = int(np.flatnonzero(~np.isfinite(amax))[0])
        raise ConversionRefused(
            f"block {first} holds a non-finite value (Hurray MXFP has no NaN/inf scale)",
            tensor=name, reasons=[(name, "float32", "non-finite input")],
        )
    expbits = ((amax.view(np.uint32) >> 23) & 0xFF).astype(np.int32)
    # shared exponent in OCP terms (MXINT8: emax_elem 0 on Q1.6 elements)
    ocp_emax = el.emax_elem + el.ocp_exponent_shift
    unbiased = np.clip(expbits - 127 - ocp_emax, -127, 128)
    biased = unbiased + 127  # OCP byte (255 only for NaN/inf amax)
    biased = np.where(isnan, 255, biased)
    if hurray:
        biased = np.maximum(biased, 1 - el.ocp_exponent_shift)
    # Hurray exponent used for the division: s_h = 2^(biased + shift - 127)
    if el.is_int:
        e_h = (biased + el.ocp_exponent_shift - 127).astype(np.float64)
        with np.errstate(invalid="ignore"):
            q = np.rint(np.ldexp(blocks.astype(np.float64), (-e_h).astype(np.int32)[:, None]))
        q = np.clip(np.nan_to_num(q, nan=0.0), -el.max_code, el.max_code).astype(np.int8)
        codes = q if el.bits == 8 else (q.view(np.uint8) & 0x0F).view(el.np_dtype)
    else:
        scale32 = (biased.astype(np.uint32) << 23).view(np.float32)
        scale32 = np.maximum(scale32, np.float32(2.0**-126))  # torchao: clamp to F32_MIN_NORMAL
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            d = blocks / scale32[:, None]
            d = np.clip(d, -el.max_code, el.max_code).astype(np.float32)
        codes = d.astype(el.np_dtype)
    zero_blocks = amax == 0
    return codes, biased.astype(np.int32), zero_blocks, shape, axis


def _from_block_order(codes_b: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    if axis == len(shape) - 1:
        return codes_b.reshape(shape)
    moved = tuple(d for i, d in enumerate(shape) if i != axis) + (shape[axis],)
    return np.ascontiguousarray(np.moveaxis(codes_b.reshape(moved), -1, axis))


def quantize_ocp(x: Any, element: Any, *, block_size: int = 32, axis: int = -1) -> MXCodes:
    """Quantize floats to OCP MX bytes exactly like torchao ``to_mx`` (FLOOR): codes
    (ml_dtypes dtype, one per byte, logical shape) and OCP scale bytes (natural blocked
    shape, ``float8_e8m0fnu``; 0x00 for all-zero blocks, 0xFF for NaN blocks).  MXINT8 codes
    are OCP Q1.6 bytes."""
    el = mx_element(element)
    codes_b, biased, _, shape, axis = _quant_core(x, el, block_size, axis, False, "input")
    codes = _from_block_order(codes_b, shape, axis)
    sc = _scales_from_hurray_order(biased.astype(np.uint8), shape, block_size, axis).view(ml_dtypes.float8_e8m0fnu)
    return MXCodes(codes, sc, el, block_size, axis, shape)


def quantize(x: Any, element: Any, *, block_size: int = 32, axis: int = -1, name: str = "tensor") -> Tensor:
    """Quantize floats (numpy or torch) straight to a Hurray MXFP tensor (see module doc for
    the two differences from the OCP bytes)."""
    el = mx_element(element)
    codes_b, biased, zero, shape, axis = _quant_core(x, el, block_size, axis, True, name)
    hs = biased + el.ocp_exponent_shift
    hs = np.where(zero, SUBSTITUTE_SCALE, hs).astype(np.uint8)
    codes = _from_block_order(codes_b, shape, axis).reshape(-1).view(np.uint8)
    data = pack(codes, el.hurray) if el.hurray.packed else codes
    return mxfp_tensor(name, el, shape, data, hs, block_size, axis)


def ocp_scale_bytes(tensor: Tensor, *, record: bytes | None = None, int8: str = "ocp") -> np.ndarray:
    """The tensor's scales as OCP bytes in Hurray block order (1-D), records restored."""
    el, *_ = mxfp_geometry(tensor)
    return _export_scales(tensor, el, record, int8)
