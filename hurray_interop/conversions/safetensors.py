"""safetensors (OCP MX checkpoints) <-> ``.hrry``, byte-exact both ways.

:func:`safetensors_to_hurray` maps every MX pair (gpt-oss ``*_blocks``/``*_scales``,
compressed-tensors ``weight_packed``/``weight_scale``; see
:mod:`hurray_interop.formats.safetensors`) to ONE Hurray MXFP tensor and every other
tensor to a plain Hurray tensor, bytes unchanged.  :func:`hurray_to_safetensors` writes
the checkpoint back -- in the convention recorded at import, or the one asked for -- and
reproduces the source file byte for byte when the convention is unchanged.

KV keys written to the .hrry file (all values are strings or bytes):

``hurray_interop.safetensors.layout`` (str, JSON)
    ``{"version": 1, "convention": C, "tensors": [...]}`` -- one entry per source tensor in
    source header order: ``{"name", "dtype", "shape", "hurray", "role"}`` with ``role`` one
    of ``"plain"`` (``hurray`` = the plain Hurray tensor), ``"data"`` / ``"scale"`` (the
    two halves of the MX pair stored as Hurray tensor ``hurray``; entries also carry
    ``"convention"``), or ``"fallback"`` (an MX pair stored dequantized as a plain tensor;
    exported as that plain tensor).  ``C`` is ``"gpt-oss"``, ``"compressed-tensors"``,
    ``"mixed"`` or ``"none"``.
``hurray_interop.safetensors.header`` (bytes)
    The source JSON header exactly as read (padding included), reused verbatim on export
    when it still describes the tensors being written.
``hurray_interop.safetensors.metadata`` (str, JSON object)
    The source ``__metadata__`` (absent when the source had none).
``hurray_interop.safetensors.convention`` (str)
    Same as the layout's convention, for quick inspection.
GGUF metadata keys and ``hurray_interop.gguf.kv_types``
    The GGUF metadata the ``gguf.*`` entries of ``__metadata__`` hold (docs/format-notes.md
    § 3.11), stored as an import from GGUF stores it (:func:`.gguf.kv_to_hurray`), so that
    a GGUF export writes every key with its type.  An export of a .hrry without a recorded
    ``__metadata__`` writes the GGUF metadata it records as those entries.
``hurray_interop.scale_substitutions.<tensor>`` (bytes)
    :mod:`hurray_interop.core.records`: scale bytes 0x00 of all-zero blocks replaced by
    0x7F, restored on export.

Plain tensors whose safetensors dtype has no Hurray element type (BOOL, F8_E8M0, F6_*)
travel as 1-D uint8 tensors of their bytes; the layout record restores dtype and shape.

A .hrry file without these records (e.g. converted from GGUF) exports too: MXFP tensors
as gpt-oss pairs (or the convention asked for), plain tensors under their own names;
anything without a safetensors form is refused unless a fallback dtype is chosen.

The format registry's safetensors record points here for both directions; ``verify``'s
safetensors checks are in :mod:`hurray_interop.verification.safetensors` (the shared
dequantizer against ml_dtypes decoding of the source codes via
:func:`hurray_interop.conversions.mx.source_values`) and ``inspect``'s in
:func:`hurray_interop.inspection.inspect_safetensors` (a dry-run plan).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from .. import report
from ..core.elements import element_type
from ..core.hrry import HrryFile, HrryWriter
from ..core.kv import KVValue
from ..core.model import MXFP, BufferHandle, Descriptor, RowMajor, Tensor
from ..core.records import decode_scale_record, scale_record_key
from ..errors import ConversionRefused, FormatError, InconsistentError, UnsupportedError, UsageError, errors_name_source
from . import fallback as fallbacks
from . import gguf_metadata
from . import mx
from .gguf import K_TYPES, KEY_PREFIX, gguf_metadata_records, gguf_value, kv_to_hurray
from ..formats import gguf as G
from ..formats.safetensors import (
    CONVENTIONS,
    FileRange,
    SafetensorsFile,
    detect_pairs,
    dtype_nbytes,
    hurray_type_for,
    convention_for,
    pair_data_dtype,
    pair_names,
    pair_shapes,
    safetensors_dtype_for,
    write_safetensors,
)

__all__ = [
    "KV_PREFIX",
    "KV_LAYOUT",
    "KV_HEADER",
    "KV_METADATA",
    "KV_CONVENTION",
    "safetensors_to_hurray",
    "hurray_to_safetensors",
]

KV_PREFIX = "hurray_interop.safetensors."
KV_LAYOUT = KV_PREFIX + "layout"
KV_HEADER = KV_PREFIX + "header"
KV_METADATA = gguf_metadata.SAFETENSORS_METADATA  # KV_PREFIX + "metadata"
KV_CONVENTION = KV_PREFIX + "convention"
LAYOUT_VERSION = 1


def _plain_descriptor(et: Any, shape: tuple[int, ...], nbytes: int) -> Descriptor:
    return Descriptor(element_type=et, shape=shape, buffers=(BufferHandle.cpu(nbytes),), layout=RowMajor())


def dequantize_safetensors(t: Any, **options: Any) -> np.ndarray:
    """The float32 values of a tensor of :meth:`SafetensorsFile.tensor` by the import's mapping
    and the shared dequantizer (``options`` as for :func:`hurray_interop.dequant.dequantize`):
    the data tensor of an MX pair as the Hurray MXFP tensor the import makes of the pair (its
    logical shape); a plain tensor as its Hurray element type.  The scale tensor of a pair,
    and dtypes that travel as bytes, have no values of their own (:class:`UsageError`,
    :class:`UnsupportedError`)."""
    from ..dequant import dequantize

    st = t.file
    p = st.pairs_by_name.get(t.name)  # the file's pairs are found once (SafetensorsFile.mx_pairs)
    if p is not None:
        if t.name == p.scale.name:
            raise UsageError(f"is the scale tensor of the MX pair {p.data.name!r}: dequantize that one",
                             path=st.path, tensor=t.name)
        if t.name == p.data.name:
            imp = mx.from_codes(st.raw(p.data.name).reshape(p.shape[:-1] + (-1,)), st.raw(p.scale.name).reshape(p.scale.shape),
                                element=p.element, block_size=p.block_size, axis=-1, name=p.hurray_name, packed=True)
            return dequantize(imp.tensor, **options)
    et, exact_type = hurray_type_for(t.dtype, tensor=t.name)
    if not exact_type:
        raise UnsupportedError(f"dtype {t.dtype} travels as bytes (no Hurray element type): it has no values here",
                               path=st.path, tensor=t.name)
    return dequantize(Tensor(t.name, _plain_descriptor(et, tuple(t.shape), int(t.data.size)), (t.data,)), **options)


def pair_label(p: Any) -> str:
    el = mx.mx_element(p.element)
    return f"{el.ocp} ({p.convention})"


def _entry(e: Any, hurray: str, role: str, convention: str | None = None) -> dict[str, Any]:
    """One layout-record entry (key order is part of the written bytes)."""
    d = {"name": e.name, "dtype": e.dtype, "shape": list(e.shape), "hurray": hurray, "role": role}
    if convention is not None:
        d["convention"] = convention
    return d


def _check_unique(names: list[str], what: str, path: Any) -> None:
    """Raise InconsistentError naming the first name that occurs twice (``what`` says how)."""
    dup = next((n for n, c in Counter(names).items() if c > 1), None)
    if dup is not None:
        raise InconsistentError(f"{what} {dup!r}", path=path, tensor=dup)


def _check_storable_names(names: list[str], src: Any) -> None:
    """Names a .hrry can hold, checked before anything is written so that the error names the
    input: Hurray index names have at least one byte (the safetensors reader already refused
    text that is not Unicode, a lone surrogate escape of the JSON header)."""
    if "" in names:
        raise UnsupportedError("a tensor with an empty name cannot be stored in Hurray", path=src, tensor="")


@dataclass
class _ImportPlan:
    """What the import collects, tensor by tensor, before anything is written."""

    rep: report.ConversionReport
    items: list[tuple[str, Tensor]] = field(default_factory=list)
    kv_records: dict[str, bytes] = field(default_factory=dict)
    layout: list[dict[str, Any]] = field(default_factory=list)
    refusals: list[tuple[str, str, str]] = field(default_factory=list)
    #: the GGUF metadata of the ``gguf.*`` entries, as .hrry KV entries (see _gguf_keys)
    gguf: dict[str, KVValue] = field(default_factory=dict)

    def pair(self, st: SafetensorsFile, p: Any, e: Any, fallback: str | None) -> None:
        """The data half of an MX pair: one Hurray MXFP tensor (or its fallback), or a refusal."""
        data = st.raw(p.data.name).reshape(p.shape[:-1] + (-1,))
        scales = st.raw(p.scale.name).reshape(p.scale.shape)
        bytes_in = p.data.nbytes + p.scale.nbytes
        try:
            imp = mx.from_codes(
                data, scales, element=p.element, block_size=p.block_size, axis=-1,
                name=p.hurray_name, packed=True, fallback=fallback,
            )
        except ConversionRefused as exc:
            self.refusals.extend(exc.reasons)
            self.rep.tensors.append(report.TensorPlan(
                p.hurray_name, pair_label(p), "refused", report.REFUSED,
                bytes_in=bytes_in, reason=exc.reasons[0][2] if exc.reasons else str(exc),
            ))
            self.layout.append(_entry(e, p.hurray_name, "data", p.convention))
            return
        fell_back = imp.status != report.EXACT
        self.layout.append(_entry(e, p.hurray_name, "fallback" if fell_back else "data", p.convention))
        self.items.append((p.hurray_name, imp.tensor))
        self.kv_records.update(imp.kv)
        el = mx.mx_element(p.element)
        self.rep.tensors.append(report.TensorPlan(
            p.hurray_name, pair_label(p),
            f"plain {fallback}" if fell_back else f"MXFP {el.hurray.name} K={p.block_size} axis={p.axis}",
            imp.status, bytes_in=bytes_in, bytes_out=imp.tensor.nbytes, reason=imp.reason,
            max_abs_error=imp.max_abs_error, substituted_blocks=int(imp.substituted_blocks.size),
        ))

    def plain(self, st: SafetensorsFile, e: Any) -> None:
        """A tensor outside any pair: its bytes as a plain Hurray tensor."""
        et, exact_type = hurray_type_for(e.dtype, tensor=e.name)
        raw = st.raw(e.name)
        shape = e.shape if exact_type else (raw.size,)
        self.items.append((e.name, Tensor(e.name, _plain_descriptor(et, tuple(shape), int(raw.size)), (raw,))))
        self.layout.append(_entry(e, e.name, "plain"))
        self.rep.tensors.append(report.TensorPlan(
            e.name, e.dtype, et.name if exact_type else f"uint8 bytes (dtype {e.dtype} recorded)", report.EXACT,
            bytes_in=int(raw.size), bytes_out=int(raw.size),
        ))

    def mark_fallback_scales(self) -> None:
        """Scale entries come before we know their pair fell back; give them their role."""
        fb = {d["hurray"] for d in self.layout if d["role"] == "fallback"}
        for d in self.layout:
            if d["role"] in ("scale", "fallback-scale"):
                d["role"] = "fallback-scale" if d["hurray"] in fb else "scale"


def safetensors_to_hurray(
    src: "str | os.PathLike[str]",
    dst: "str | os.PathLike[str]",
    *,
    fallback: str | None = None,
    force: bool = False,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> report.ConversionReport:
    """Convert a safetensors checkpoint to a ``.hrry`` file (see module doc).

    Refuses (:class:`ConversionRefused`, nothing written) when an MX pair holds a scale
    Hurray cannot represent, unless ``fallback`` ("float32", "float16", "bfloat16") is
    given.  ``dry_run`` (or ``dst=None``): return the plan -- refused tensors included --
    and write nothing.  ``progress(done_bytes, total_bytes)`` is called after each tensor.
    """
    fallback = fallbacks.dtype_choice(fallback)  # exact: no dtype fallback
    rep = report.ConversionReport(
        str(src), None if dry_run or dst is None else str(dst), "safetensors", "hurray", dry_run=dry_run
    )
    with SafetensorsFile(src) as st:
        pairs, used = detect_pairs(st)
        by_data = {p.data.name: p for p in pairs}
        by_scale = {p.scale.name: p for p in pairs}
        plan = _ImportPlan(rep)  # every tensor in header order
        for e in st.entries:
            if e.name in by_scale:
                plan.layout.append(_entry(e, by_scale[e.name].hurray_name, "scale", by_scale[e.name].convention))
            elif e.name in by_data:
                plan.pair(st, by_data[e.name], e, fallback)
            else:
                plan.plain(st, e)
        plan.mark_fallback_scales()
        _check_unique([n for n, _ in plan.items], "two source tensors map to the Hurray name", src)
        if not dry_run and dst is not None:  # inspect and --dry-run show the plan of such a file
            _check_storable_names([n for n, _ in plan.items], src)
        if plan.refusals:
            rep.hint = report.fallback_hint(False, fallbacks.DTYPE_CHOICES)
        if plan.refusals and not dry_run and dst is not None:
            raise ConversionRefused(
                f"{len(plan.refusals)} tensor(s) not exactly representable ({rep.hint}): "
                + "; ".join(f"{t}: {r}" for t, _, r in plan.refusals),
                path=src, reasons=plan.refusals, report=rep,
            )
        conventions = {p.convention for p in pairs}
        convention = "none" if not conventions else (conventions.pop() if len(conventions) == 1 else "mixed")
        rep.notes.append(f"checkpoint convention: {convention}")
        plan.gguf = _gguf_keys(st, rep)
        if dry_run or dst is None:
            return rep
        _write_hrry(st, src, dst, plan, convention, force=force, progress=progress)
    return rep


#: the largest data alignment a GGUF export writes (the GGUF import's record allows no more)
MAX_ALIGNMENT = 1 << 30


def _alignment_problem(v: Any) -> str | None:
    """Why a ``general.alignment`` value cannot be the GGUF key (the GGUF reader requires a
    UINT32 power of two; the export writes at most :data:`MAX_ALIGNMENT`), or None."""
    if not isinstance(v, G.GGUFValue) or v.type != G.ValueType.UINT32:
        return "general.alignment must be a UINT32"
    a = int(v.value)
    if a < 1 or a & (a - 1) or a > MAX_ALIGNMENT:
        return f"general.alignment {a} is not a power of two up to 2^30"
    return None


def _key_problem(key: str, v: Any) -> str | None:
    """Why the GGUF key ``key`` (value ``v``) cannot be GGUF metadata of the .hrry (as the GGUF
    import requires, and keys the GGUF container writes itself), or None."""
    try:
        ok = "\x00" not in key and len(key.encode("utf-8")) <= 0xFFFF and not key.startswith(KEY_PREFIX)
    except UnicodeEncodeError:
        ok = False
    if not ok:
        return f"not a valid key (UTF-8 without NUL, at most 65535 bytes, outside {KEY_PREFIX!r})"
    if key in G.SPLIT_KEYS:
        return "a GGUF split key, which the GGUF container writes itself for a split set"
    return _alignment_problem(v) if key == "general.alignment" else None


def _gguf_keys(st: SafetensorsFile, rep: report.ConversionReport) -> dict[str, KVValue]:
    """The GGUF metadata the ``gguf.*`` entries of ``__metadata__`` hold (docs/format-notes.md
    § 3.11) as .hrry KV entries -- the keys with their natural types, then the record of their
    GGUF types, which a GGUF export writes back; the report says how many, and which entries
    under the prefix are not GGUF metadata (those stay in the safetensors metadata record)."""
    decoded, problems = gguf_metadata.decode(st.metadata or {}, st.path)
    items: list[tuple[str, Any]] = []
    for key, v in decoded:  # the entries decode() returned a problem for are not among these
        why = _key_problem(key, v)
        if why is None:
            items.append((key, v))
        else:
            problems.append((gguf_metadata.PREFIX + key, why))
    for name, why in problems:
        rep.notes.append(f"__metadata__ entry {name}: {why}; kept as safetensors metadata only, not as GGUF metadata")
    if not items:
        return {}
    kv: dict[str, KVValue] = {}
    types: list[str] = []
    for key, v in items:
        if isinstance(v, list):  # a vocabulary: the list of str it is in the .hrry (gguf_metadata.STRINGS)
            kv[key] = KVValue("array", v, "string")
            types.append(gguf_metadata.STRINGS)
        else:
            entries, recorded = kv_to_hurray([(key, v)])
            kv.update(entries)
            types.extend(recorded)
    rep.notes.append(f"GGUF metadata: {len(items)} key(s) from the gguf.* entries of __metadata__, with their GGUF types")
    return {**kv, K_TYPES: KVValue("array", types, "string")}


def _write_hrry(st: SafetensorsFile, src: Any, dst: Any, plan: _ImportPlan, convention: str, *,
                force: bool, progress: Callable[[int, int], None] | None) -> None:
    """Write the planned tensors and the records that let the export restore the file."""
    kv: dict[str, Any] = {
        **plan.gguf,  # GGUF's own keys first, as an import from GGUF stores them
        KV_CONVENTION: convention,
        KV_LAYOUT: json.dumps({"version": LAYOUT_VERSION, "convention": convention, "tensors": plan.layout},
                              separators=(",", ":"), ensure_ascii=False),
        KV_HEADER: st.header_bytes,
    }
    if st.metadata is not None:
        kv[KV_METADATA] = json.dumps(st.metadata, separators=(",", ":"), ensure_ascii=False)
    kv.update(plan.kv_records)
    total = sum(t.nbytes for _, t in plan.items)
    done = 0
    with HrryWriter(dst, force=force, tensor_count_hint=len(plan.items), inputs=(src,)) as w:
        for name, t in plan.items:
            w.write(name, t.descriptor, t.data)
            done += t.nbytes
            if progress:
                progress(done, total)
        w.finish(kv)


def _kv_value(kv: dict[str, Any], key: str, kind: type, path: Any) -> Any:
    if key not in kv:
        return None
    v = kv[key]
    v = getattr(v, "value", v)
    if not isinstance(v, kind):
        raise FormatError(f"KV {key!r} must be {kind.__name__}", path=path, field=key)
    return v


def _layout_entry_ok(d: Any) -> bool:
    if not isinstance(d, dict) or not {"name", "dtype", "shape", "hurray", "role"} <= set(d):
        return False
    if not all(isinstance(d[k], str) for k in ("name", "dtype", "hurray", "role")):
        return False
    if "convention" in d and not (isinstance(d["convention"], str) and d["convention"] in CONVENTIONS):
        return False
    shape = d["shape"]
    return isinstance(shape, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape)


def _json_record(kv: dict[str, Any], key: str, what: str, valid: Callable[[Any], bool], path: Any) -> Any:
    """The JSON value of the string record ``key`` (None when absent); FormatError unless
    it parses and ``valid`` accepts it."""
    raw = _kv_value(kv, key, str, path)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
        ok = valid(value)
    except (ValueError, RecursionError, TypeError, KeyError):  # JSONDecodeError is a ValueError
        ok = False
    if not ok:
        raise FormatError(f"malformed safetensors {what} record", path=path, field=key)
    return value


def _layout_ok(lay: Any) -> bool:
    ok = isinstance(lay, dict) and lay.get("version") == LAYOUT_VERSION and isinstance(lay.get("tensors"), list)
    return ok and all(_layout_entry_ok(d) for d in lay["tensors"])


def _metadata_ok(md: Any) -> bool:
    return isinstance(md, dict) and all(isinstance(v, str) for v in md.values())


#: one tensor as it will be written: (name, safetensors dtype, shape, bytes)
_Part = tuple[str, str, tuple[int, ...], Any]


#: values per window of a dequantized tensor (16 MiB of float32): the export's memory
#: does not depend on the tensor's size
WINDOW_ELEMENTS = 1 << 22
#: bytes of the source read between two releases of its pages (resident memory stays bounded)
RELEASE_BYTES = 64 << 20


class _Dequantized:
    """A fallback tensor's bytes, produced window by window when written.

    Calling it validates nothing more (the dequantizer checked the tensor when this was
    made) and yields the cast values of each window of :data:`WINDOW_ELEMENTS` values
    (the shared dequantizer's :func:`~hurray_interop.dequant.iter_dequantize`); the max
    abs error is measured on the way and written into ``plan`` when the last window is
    out (:meth:`measure` runs it without writing: a dry run)."""

    def __init__(self, hf: HrryFile, t: Tensor, fallback: str, plan: report.TensorPlan) -> None:
        from ..dequant import iter_dequantize  # the shared dequantizer (float32, exact)

        self.hf, self.fallback, self.plan = hf, fallback, plan
        self._windows: Any = iter_dequantize(t, max_elements=WINDOW_ELEMENTS)  # validates the tensor now
        self._lossless = fallbacks.lossless(np.float32, fallback)
        self._source_per_value = t.nbytes / max(1, plan.bytes_out // fallbacks.dtype(fallback).itemsize)

    def __call__(self) -> Iterator[np.ndarray]:
        if self._windows is None:
            raise UsageError(f"tensor {self.plan.name!r} was already dequantized", tensor=self.plan.name)
        windows, self._windows = self._windows, None
        meter = fallbacks.ErrorMeter()
        read = 0
        for _, vals in windows:
            stored = fallbacks.cast(vals, self.fallback)
            if not self._lossless:
                meter.add_cast(vals, stored)
            yield stored.reshape(-1).view(np.uint8)
            read += vals.size * self._source_per_value
            if read >= RELEASE_BYTES:
                self.hf.release_pages()
                read = 0
        self.hf.release_pages()
        self.plan.max_abs_error = meter.error
        self.plan.status = fallbacks.status(meter.error)

    def measure(self) -> None:
        for _ in self():
            pass


class _Export:
    """The parts of one .hrry → safetensors export, tensor by tensor, with the report."""

    def __init__(self, hf: HrryFile, src: Any, rep: report.ConversionReport, convention: str | None,
                 fallback: str | None) -> None:
        self.hf, self.src, self.rep = hf, src, rep
        self.convention, self.fallback = convention, fallback
        self.fd: int | None = None  # a read-only descriptor of the .hrry (see stored_bytes)
        self.out: list[_Part] = []
        self.refused: list[tuple[str, str, str]] = []
        self.dequantized: list[_Dequantized] = []
        self._mx: dict[str, Any] = {}

    def refuse(self, hname: str, t: Tensor, why: str) -> None:
        self.refused.append((hname, t.describe(), why))
        self.rep.tensors.append(report.TensorPlan(hname, t.describe(), "refused", report.REFUSED,
                                                  bytes_in=t.nbytes, reason=why))

    def fallback_part(self, hname: str, t: Tensor, why: str) -> _Part | None:
        """``t`` dequantized and cast to the fallback dtype (streamed: see
        :class:`_Dequantized`), or a refusal without one."""
        fallback = self.fallback
        if fallback is None:
            self.refuse(hname, t, why)
            return None
        dtype = safetensors_dtype_for(element_type(fallback))
        shape = tuple(int(x) for x in t.descriptor.shape)  # type: ignore[arg-type]
        plan = report.TensorPlan(
            hname, t.describe(), f"{dtype} (fallback)", report.VALUE_EXACT, bytes_in=t.nbytes,
            bytes_out=math.prod(shape) * fallbacks.dtype(fallback).itemsize,
            reason=f"{why}; written dequantized as {fallback}",
        )
        self.rep.tensors.append(plan)
        source = _Dequantized(self.hf, t, fallback, plan)
        self.hf.release_pages()  # the validation read every scale: keep resident memory bounded
        self.dequantized.append(source)
        return (hname, dtype, shape, source)

    def mx_parts(self, hname: str, conv: str) -> Any:
        """An MXFP tensor as ``("pair", data part, scale part, convention)``, as
        ``("fallback", part)``, or None (refused); computed once per tensor."""
        if hname not in self._mx:
            self._mx[hname] = self._mx_parts(hname, conv)
        return self._mx[hname]

    def _mx_parts(self, hname: str, conv: str) -> Any:
        t = self.hf.tensor(hname)
        try:
            el, shape, k, axis = mx.mxfp_geometry(t)
            conv = convention_for(el.hurray.name, conv)
            if axis != len(shape) - 1:
                raise UnsupportedError(f"{conv} stores blocks along the last axis, this tensor along axis {axis}", tensor=hname)
            dshape, sshape = pair_shapes(shape, el.hurray.name, k, conv, tensor=hname)
            dname, sname = pair_names(hname, conv)
            rec = _kv_value(self.hf.kv, scale_record_key(hname), bytes, self.src)
            scales = mx.ocp_scale_bytes(t, record=rec)
        except (UnsupportedError, ConversionRefused) as exc:
            part = self.fallback_part(hname, t, getattr(exc, "message", str(exc)))
            return None if part is None else ("fallback", part)
        self.rep.tensors.append(report.TensorPlan(
            hname, f"MXFP {el.hurray.name} K={k}", f"{el.ocp} ({conv}): {dname} + {sname}", report.EXACT,
            bytes_in=t.nbytes, bytes_out=t.nbytes,
            substituted_blocks=0 if rec is None else int(decode_scale_record(rec, key=scale_record_key(hname))[0].size),
        ))
        data = self.stored_bytes(hname, t)
        return ("pair", (dname, pair_data_dtype(el.hurray.name, conv), dshape, data), (sname, "U8", sshape, scales), conv)

    def plain_part(self, hname: str, dtype: str | None, shape: tuple[int, ...] | None) -> _Part | None:
        """A plain tensor's bytes under the recorded (or its own) dtype; a fallback otherwise."""
        t = self.hf.tensor(hname)
        d = t.descriptor
        if any(x is None for x in d.shape):  # no fallback either: nothing can be decoded without sizes
            self.refuse(hname, t, f"shape {['?' if x is None else x for x in d.shape]} has a dynamic dimension; "
                                  "safetensors needs sizes")
            return None
        if d.quantization is not None or not isinstance(d.layout, RowMajor) or len(t.data) != 1 or d.byte_offset:
            return self.fallback_part(hname, t, "only plain row-major tensors and MX pairs have a safetensors form")
        if dtype is None:
            try:
                dtype = safetensors_dtype_for(d.element_type, tensor=hname)
            except UnsupportedError as exc:
                return self.fallback_part(hname, t, exc.message)
            shape = tuple(int(s) for s in d.shape)  # type: ignore[arg-type]
        et, _ = hurray_type_for(dtype, tensor=hname)
        if et != d.element_type:
            raise InconsistentError(
                f"recorded dtype {dtype} does not match the stored element type {d.element_type.name}", path=self.src, tensor=hname
            )
        need = dtype_nbytes(dtype, shape or (), tensor=hname)
        if need != t.data[0].size:
            raise InconsistentError(
                f"recorded {dtype} {list(shape or ())} needs {need} bytes, the stored tensor holds {t.data[0].size}",
                path=self.src, tensor=hname,
            )
        self.rep.tensors.append(report.TensorPlan(hname, d.element_type.name, dtype, report.EXACT,
                                                  bytes_in=t.nbytes, bytes_out=t.nbytes))
        return (hname, dtype, tuple(shape or ()), self.stored_bytes(hname, t))

    def stored_bytes(self, hname: str, t: Tensor) -> Any:
        """The tensor's one buffer as it is stored: a range of the .hrry file that the
        writer copies by the kernel, or (no descriptor of the file) the memory-mapped view."""
        if self.fd is None:
            return t.data[0]
        return FileRange(self.fd, self.hf.buffer_offsets(hname)[0], int(t.data[0].size))

    def recorded(self, d: dict[str, Any]) -> None:
        """One entry of the layout record, in the record's order."""
        role, hname = d["role"], d["hurray"]
        if hname not in self.hf:
            raise FormatError(f"layout record names a tensor missing from the file: {hname!r}", path=self.src, tensor=hname)
        if role == "plain":
            part = self.plain_part(hname, d["dtype"], tuple(d["shape"]))
            if part is not None:
                self.out.append((d["name"], *part[1:]))
        elif role == "fallback":
            part = self.plain_part(hname, None, None)
            if part is not None:
                self.out.append(part)
                self.rep.notes.append(f"{hname}: was stored dequantized at import; written as plain {part[1]}")
        elif role in ("data", "scale"):
            self._recorded_pair_half(d)
        elif role != "fallback-scale":  # a fallback's scale half has nothing to write
            raise FormatError(f"unknown role {role!r} in the layout record", path=self.src, field=KV_LAYOUT)

    def _recorded_pair_half(self, d: dict[str, Any]) -> None:
        role, hname = d["role"], d["hurray"]
        rec_conv = d.get("convention") or "gpt-oss"
        got = self.mx_parts(hname, self.convention or rec_conv)
        if got is None:
            return
        if got[0] == "fallback":
            if role == "data":
                self.out.append(got[1])
            return
        part = got[1] if role == "data" else got[2]
        if got[3] == rec_conv:
            # the recorded name/dtype/shape (e.g. an F8_E8M0 scale tensor), same bytes
            if tuple(d["shape"]) != part[2] or d["name"] != part[0]:
                raise InconsistentError(
                    f"recorded {role} tensor {d['name']!r} {d['shape']} does not match the stored MX tensor",
                    path=self.src, tensor=hname,
                )
            if (role == "data" and d["dtype"] != part[1]) or (role == "scale" and d["dtype"] not in ("U8", "F8_E8M0")):
                raise FormatError(f"recorded dtype {d['dtype']!r} is not an MX byte dtype", path=self.src, tensor=hname)
            part = (part[0], d["dtype"], part[2], part[3])
        self.out.append(part)

    def unrecorded(self, hname: str) -> None:
        """A tensor the layout record does not know (or there is no record): file order."""
        t = self.hf.tensor(hname)
        if isinstance(t.descriptor.quantization, MXFP):
            got = self.mx_parts(hname, self.convention or "gpt-oss")
            if got is not None:
                self.out.extend(got[1:3] if got[0] == "pair" else [got[1]])
        else:
            part = self.plain_part(hname, None, None)
            if part is not None:
                self.out.append(part)


@errors_name_source  # records and buffers are input: errors say which file
def hurray_to_safetensors(
    src: "str | os.PathLike[str]",
    dst: "str | os.PathLike[str] | None",
    *,
    convention: str | None = None,
    fallback: str | None = None,
    force: bool = False,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> report.ConversionReport:
    """Write a ``.hrry`` file back as a safetensors checkpoint.

    MX tensors are written in ``convention`` (``"gpt-oss"`` / ``"compressed-tensors"``),
    default: the one recorded at import per tensor, else gpt-oss.  Recorded scale
    substitutions are undone; with the recorded convention the output is byte-identical
    to the imported file.  Tensors safetensors cannot hold exactly (other quantization
    schemes, composites, MXFP along a non-last axis or of an element type the convention
    lacks, element types without a safetensors dtype) are refused -- nothing is written --
    unless ``fallback`` ("float32", "float16", "bfloat16") is given: then they are written
    dequantized by the shared dequantizer (:mod:`hurray_interop.dequant`) and reported.

    The output streams in bounded memory: the header is computed from names, dtypes and
    shapes first; stored tensors are copied from the .hrry by the kernel, fallbacks are
    dequantized, cast and measured window by window (:data:`WINDOW_ELEMENTS` values), each
    written at its offset.  ``__metadata__``: the recorded source ``__metadata__``, else the
    GGUF metadata the file records as ``gguf.<key>`` entries (docs/format-notes.md § 3.11)
    after ``"format": "pt"``.
    """
    if convention is not None and convention not in CONVENTIONS:
        raise UsageError(f"unknown convention {convention!r} (one of: {', '.join(CONVENTIONS)})")
    fallback = fallbacks.dtype_choice(fallback)  # exact: no dtype fallback
    rep = report.ConversionReport(
        str(src), None if dst is None else str(dst), "hurray", "safetensors", dry_run=dry_run
    )
    with HrryFile(src) as hf, _read_only(src) as fd:
        layout = _json_record(hf.kv, KV_LAYOUT, "layout", _layout_ok, src)
        metadata = _json_record(hf.kv, KV_METADATA, "metadata", _metadata_ok, src)
        header = _kv_value(hf.kv, KV_HEADER, bytes, src)
        if metadata is None:  # GGUF metadata, every key with its type (docs/format-notes.md § 3.11)
            metadata = _gguf_entries(hf, src, rep)
        ex = _Export(hf, src, rep, convention, fallback)
        ex.fd = fd
        done: set[str] = set()
        for d in layout["tensors"] if layout else []:
            ex.recorded(d)
            done.add(d["hurray"])
        for hname in hf.top_level_names():
            if hname not in done:
                ex.unrecorded(hname)
        if ex.refused:
            rep.hint = report.fallback_hint(False, fallbacks.DTYPE_CHOICES)
        if ex.refused and not (dry_run or dst is None):
            raise ConversionRefused(
                f"{len(ex.refused)} tensor(s) have no exact safetensors form; nothing was written ({rep.hint})",
                path=src, reasons=ex.refused, report=rep,
            )
        if not ex.refused:
            _check_unique([o[0] for o in ex.out], "two tensors would be written as", src)
        if dry_run or dst is None:
            for part in ex.dequantized:  # the report's errors: measured, nothing written
                part.measure()
            return rep
        write_safetensors(dst, ex.out, metadata, force=force, header=header, inputs=(src,), progress=progress)
    return rep


def _gguf_entries(hf: HrryFile, src: Any, rep: report.ConversionReport) -> dict[str, str] | None:
    """The ``__metadata__`` of an export whose source recorded no safetensors metadata: the
    GGUF metadata the .hrry records, as ``gguf.<key>`` entries after ``"format": "pt"``
    (None when there is none)."""
    records = gguf_metadata_records(hf.kv, os.fspath(src))
    if records is None:
        other = [k for k in hf.kv if not k.startswith(KEY_PREFIX)]
        if other:
            rep.notes.append(f"{len(other)} metadata key(s) without a recorded GGUF type not written "
                             f"(safetensors metadata holds GGUF metadata only): {', '.join(other[:5])}"
                             + (" …" if len(other) > 5 else ""))
        return None
    rep.notes.append(f"GGUF metadata: {len(records)} key(s) written to __metadata__ as gguf.<key> entries "
                     f"with their GGUF types, and {gguf_metadata.FORMAT}={gguf_metadata.FORMAT_PT}")
    entries = gguf_metadata.encode(
        (k, list(v.value)) if ts == gguf_metadata.STRINGS and (v.type, v.element_type) == ("array", "string")
        else (k, gguf_value(k, v, ts, os.fspath(src)))
        for k, ts, v in records
    )
    return {gguf_metadata.FORMAT: gguf_metadata.FORMAT_PT, **entries}  # what loaders (transformers) require


@contextlib.contextmanager
def _read_only(path: Any) -> Iterator[int | None]:
    """A read-only descriptor of ``path`` for kernel copies (None when it cannot be opened:
    the writer then copies from the memory map)."""
    try:
        fd: int | None = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        fd = None
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)
