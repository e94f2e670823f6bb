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

import json
import os
from typing import Any, Callable

import numpy as np

from .. import report
from ..core.elements import element_type
from ..core.hrry import HrryFile, HrryWriter
from ..core.model import MXFP, BufferHandle, Descriptor, RowMajor, Tensor
from ..core.records import decode_scale_record, scale_record_key
from ..errors import ConversionRefused, FormatError, InconsistentError, UnsupportedError, UsageError, errors_name_source
from . import fallback as fallbacks
from . import mx
from ..formats.safetensors import (
    CONVENTIONS,
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
KV_METADATA = KV_PREFIX + "metadata"
KV_CONVENTION = KV_PREFIX + "convention"
LAYOUT_VERSION = 1


def _plain_descriptor(et: Any, shape: tuple[int, ...], nbytes: int) -> Descriptor:
    return Descriptor(element_type=et, shape=shape, buffers=(BufferHandle.cpu(nbytes),), layout=RowMajor())


def pair_label(p: Any) -> str:
    el = mx.mx_element(p.element)
    return f"{el.ocp} ({p.convention})"


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
        # plan: every tensor in header order -> (hurray name, tensor, kv, plan)
        items: list[tuple[str, Tensor]] = []
        kv_records: dict[str, bytes] = {}
        layout: list[dict[str, Any]] = []
        refusals: list[tuple[str, str, str]] = []
        conventions = {p.convention for p in pairs}
        for e in st.entries:
            if e.name in by_scale:
                p = by_scale[e.name]
                layout.append({"name": e.name, "dtype": e.dtype, "shape": list(e.shape), "hurray": p.hurray_name,
                               "role": "scale",
                               "convention": p.convention})
                continue
            if e.name in by_data:
                p = by_data[e.name]
                data = st.raw(p.data.name).reshape(p.shape[:-1] + (-1,))
                scales = st.raw(p.scale.name).reshape(p.scale.shape)
                try:
                    imp = mx.from_codes(
                        data, scales, element=p.element, block_size=p.block_size, axis=-1,
                        name=p.hurray_name, packed=True, fallback=fallback,
                    )
                except ConversionRefused as exc:
                    refusals.extend(exc.reasons)
                    rep.tensors.append(report.TensorPlan(
                        p.hurray_name, pair_label(p), "refused", report.REFUSED,
                        bytes_in=p.data.nbytes + p.scale.nbytes, reason=exc.reasons[0][2] if exc.reasons else str(exc),
                    ))
                    layout.append({"name": e.name, "dtype": e.dtype, "shape": list(e.shape), "hurray": p.hurray_name,
                                   "role": "data", "convention": p.convention})
                    continue
                fell_back = imp.status != mx.EXACT
                role = "fallback" if fell_back else "data"
                layout.append({"name": e.name, "dtype": e.dtype, "shape": list(e.shape), "hurray": p.hurray_name,
                               "role": role, "convention": p.convention})
                items.append((p.hurray_name, imp.tensor))
                kv_records.update(imp.kv)
                el = mx.mx_element(p.element)
                rep.tensors.append(report.TensorPlan(
                    p.hurray_name, pair_label(p),
                    f"plain {fallback}" if fell_back else
                    f"MXFP {el.hurray.name} K={p.block_size} axis={p.axis}",
                    {mx.EXACT: report.EXACT, mx.VALUE_EXACT: report.VALUE_EXACT, mx.LOSSY: report.LOSSY}[imp.status],
                    bytes_in=p.data.nbytes + p.scale.nbytes, bytes_out=imp.tensor.nbytes, reason=imp.reason,
                    max_abs_error=imp.max_abs_error, substituted_blocks=int(imp.substituted_blocks.size),
                ))
                continue
            et, exact_type = hurray_type_for(e.dtype, tensor=e.name)
            raw = st.raw(e.name)
            shape = e.shape if exact_type else (raw.size,)
            t = Tensor(e.name, _plain_descriptor(et, tuple(shape), int(raw.size)), (raw,))
            items.append((e.name, t))
            layout.append({"name": e.name, "dtype": e.dtype, "shape": list(e.shape), "hurray": e.name, "role": "plain"})
            rep.tensors.append(report.TensorPlan(
                e.name, e.dtype, et.name if exact_type else f"uint8 bytes (dtype {e.dtype} recorded)", report.EXACT,
                bytes_in=int(raw.size), bytes_out=int(raw.size),
            ))
        # scale entries were appended before we knew about fallbacks; fix their roles
        fb = {d["hurray"] for d in layout if d["role"] == "fallback"}
        for d in layout:
            if d["role"] in ("scale", "fallback-scale"):
                d["role"] = "fallback-scale" if d["hurray"] in fb else "scale"
        names = [n for n, _ in items]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise InconsistentError(f"two source tensors map to the Hurray name {dup!r}", path=src, tensor=dup)
        if refusals and not dry_run and dst is not None:
            raise ConversionRefused(
                f"{len(refusals)} tensor(s) not exactly representable (choose a fallback to store them dequantized): "
                + "; ".join(f"{t}: {r}" for t, _, r in refusals),
                path=src, reasons=refusals, report=rep,
            )
        convention = "none" if not conventions else (conventions.pop() if len(conventions) == 1 else "mixed")
        rep.notes.append(f"checkpoint convention: {convention}")
        if dry_run or dst is None:
            return rep
        kv: dict[str, Any] = {
            KV_CONVENTION: convention,
            KV_LAYOUT: json.dumps({"version": LAYOUT_VERSION, "convention": convention, "tensors": layout},
                                  separators=(",", ":"), ensure_ascii=False),
            KV_HEADER: st.header_bytes,
        }
        if st.metadata is not None:
            kv[KV_METADATA] = json.dumps(st.metadata, separators=(",", ":"), ensure_ascii=False)
        kv.update(kv_records)
        total = sum(t.nbytes for _, t in items)
        done = 0
        with HrryWriter(dst, force=force, tensor_count_hint=len(items), inputs=(src,)) as w:
            for name, t in items:
                w.write(name, t.descriptor, t.data)
                done += t.nbytes
                if progress:
                    progress(done, total)
            w.finish(kv)
    return rep


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


def _load_layout(kv: dict[str, Any], path: Any) -> dict[str, Any] | None:
    raw = _kv_value(kv, KV_LAYOUT, str, path)
    if raw is None:
        return None
    try:
        lay = json.loads(raw)
        ok = isinstance(lay, dict) and lay.get("version") == LAYOUT_VERSION and isinstance(lay.get("tensors"), list)
        ok = ok and all(_layout_entry_ok(d) for d in lay["tensors"])
    except (ValueError, RecursionError, TypeError, KeyError):  # JSONDecodeError is a ValueError
        ok = False
    if not ok:
        raise FormatError("malformed safetensors layout record", path=path, field=KV_LAYOUT)
    return lay


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
    """
    if convention is not None and convention not in CONVENTIONS:
        raise UsageError(f"unknown convention {convention!r} (one of: {', '.join(CONVENTIONS)})")
    fallback = fallbacks.dtype_choice(fallback)  # exact: no dtype fallback
    rep = report.ConversionReport(
        str(src), None if dst is None else str(dst), "hurray", "safetensors", dry_run=dry_run
    )
    with HrryFile(src) as hf:
        kv = hf.kv
        layout = _load_layout(kv, src)
        md_raw = _kv_value(kv, KV_METADATA, str, src)
        metadata = None
        if md_raw is not None:
            try:
                metadata = json.loads(md_raw)
            except (ValueError, RecursionError):
                metadata = None
            if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
                raise FormatError("malformed safetensors metadata record", path=src, field=KV_METADATA)
        header = _kv_value(kv, KV_HEADER, bytes, src)
        out: list[tuple[str, str, tuple[int, ...], Any]] = []
        done: set[str] = set()
        refused: list[tuple[str, str, str]] = []
        mx_cache: dict[str, Any] = {}

        def record_for(name: str) -> bytes | None:
            return _kv_value(kv, scale_record_key(name), bytes, src)

        def fallback_part(hname: str, t: Tensor, why: str) -> tuple[str, str, tuple[int, ...], Any] | None:
            src_type = t.describe()
            if fallback is None:
                refused.append((hname, src_type, why))
                rep.tensors.append(report.TensorPlan(hname, src_type, "refused", report.REFUSED, bytes_in=t.nbytes, reason=why))
                return None
            from ..dequant import dequantize  # the shared dequantizer (float32, exact)

            vals = dequantize(t)
            et = element_type(fallback)
            stored = fallbacks.cast(vals, fallback)
            err = fallbacks.max_abs_error(vals, stored)
            rep.tensors.append(report.TensorPlan(
                hname, src_type, f"{safetensors_dtype_for(et)} (fallback)",
                fallbacks.status(err), bytes_in=t.nbytes, bytes_out=stored.nbytes,
                reason=f"{why}; written dequantized as {fallback}", max_abs_error=err,
            ))
            return (hname, safetensors_dtype_for(et), tuple(int(x) for x in vals.shape), stored.reshape(-1).view(np.uint8))

        def mx_parts(hname: str, conv: str) -> Any:
            t = hf.tensor(hname)
            try:
                el, shape, k, axis = mx.mxfp_geometry(t)
                conv = convention_for(el.hurray.name, conv)
                if axis != len(shape) - 1:
                    raise UnsupportedError(f"{conv} stores blocks along the last axis, this tensor along axis {axis}", tensor=hname)
                dshape, sshape = pair_shapes(shape, el.hurray.name, k, conv, tensor=hname)
                dname, sname = pair_names(hname, conv)
                rec = record_for(hname)
                scales = mx.ocp_scale_bytes(t, record=rec)
            except (UnsupportedError, ConversionRefused) as exc:
                part = fallback_part(hname, t, getattr(exc, "message", str(exc)))
                return None if part is None else ("fallback", part)
            rep.tensors.append(report.TensorPlan(
                hname, f"MXFP {el.hurray.name} K={k}", f"{el.ocp} ({conv}): {dname} + {sname}", report.EXACT,
                bytes_in=t.nbytes, bytes_out=t.nbytes,
                substituted_blocks=0 if rec is None else int(decode_scale_record(rec, key=scale_record_key(hname))[0].size),
            ))
            return ("pair", (dname, pair_data_dtype(el.hurray.name, conv), dshape, t.data[0]), (sname, "U8", sshape, scales), conv)

        def plain_part(hname: str, dtype: str | None, shape: tuple[int, ...] | None) -> Any:
            t = hf.tensor(hname)
            d = t.descriptor
            if any(x is None for x in d.shape):  # no fallback either: nothing can be decoded without sizes
                why = f"shape {['?' if x is None else x for x in d.shape]} has a dynamic dimension; safetensors needs sizes"
                refused.append((hname, t.describe(), why))
                rep.tensors.append(report.TensorPlan(hname, t.describe(), "refused", report.REFUSED, bytes_in=t.nbytes, reason=why))
                return None
            if d.quantization is not None or not isinstance(d.layout, RowMajor) or len(t.data) != 1 or d.byte_offset:
                return fallback_part(hname, t, "only plain row-major tensors and MX pairs have a safetensors form")
            if dtype is None:
                try:
                    dtype = safetensors_dtype_for(d.element_type, tensor=hname)
                except UnsupportedError as exc:
                    return fallback_part(hname, t, exc.message)
                shape = tuple(int(s) for s in d.shape)  # type: ignore[arg-type]
            et, _ = hurray_type_for(dtype, tensor=hname)
            if et != d.element_type:
                raise InconsistentError(
                    f"recorded dtype {dtype} does not match the stored element type {d.element_type.name}", path=src, tensor=hname
                )
            if dtype_nbytes(dtype, shape or (), tensor=hname) != t.data[0].size:
                raise InconsistentError(
                    f"recorded {dtype} {list(shape or ())} needs {dtype_nbytes(dtype, shape or (), tensor=hname)} bytes, "
                    f"the stored tensor holds {t.data[0].size}",
                    path=src, tensor=hname,
                )
            rep.tensors.append(report.TensorPlan(hname, d.element_type.name, dtype, report.EXACT,
                                                 bytes_in=t.nbytes, bytes_out=t.nbytes))
            return (hname, dtype, tuple(shape or ()), t.data[0])

        entries = layout["tensors"] if layout else []
        for d in entries:
            role, hname = d["role"], d["hurray"]
            if hname not in hf:
                raise FormatError(f"layout record names a tensor missing from the file: {hname!r}", path=src, tensor=hname)
            if role == "plain":
                part = plain_part(hname, d["dtype"], tuple(d["shape"]))
                if part is not None:
                    out.append((d["name"],) + tuple(part[1:]))  # type: ignore[arg-type]
            elif role == "fallback":
                part = plain_part(hname, None, None)
                if part is not None:
                    out.append(part)
                    rep.notes.append(f"{hname}: was stored dequantized at import; written as plain {part[1]}")
            elif role == "fallback-scale":
                pass
            elif role in ("data", "scale"):
                rec_conv = d.get("convention") or "gpt-oss"
                conv = convention or rec_conv
                if hname not in mx_cache:
                    mx_cache[hname] = mx_parts(hname, conv)
                got = mx_cache[hname]
                if got is None:
                    pass
                elif got[0] == "fallback":
                    if role == "data":
                        out.append(got[1])
                else:
                    part = got[1] if role == "data" else got[2]
                    if got[3] == rec_conv:
                        # the recorded name/dtype/shape (e.g. an F8_E8M0 scale tensor), same bytes
                        if tuple(d["shape"]) != part[2] or d["name"] != part[0]:
                            raise InconsistentError(
                                f"recorded {role} tensor {d['name']!r} {d['shape']} does not match the stored MX tensor",
                                path=src, tensor=hname,
                            )
                        if (role == "data" and d["dtype"] != part[1]) or (role == "scale" and d["dtype"] not in ("U8", "F8_E8M0")):
                            raise FormatError(f"recorded dtype {d['dtype']!r} is not an MX byte dtype", path=src, tensor=hname)
                        part = (part[0], d["dtype"], part[2], part[3])
                    out.append(part)
            else:
                raise FormatError(f"unknown role {role!r} in the layout record", path=src, field=KV_LAYOUT)
            done.add(hname)
        # tensors the record does not know (or no record at all): file order
        for hname in hf.top_level_names():
            if hname in done:
                continue
            t = hf.tensor(hname)
            if isinstance(t.descriptor.quantization, MXFP):
                got = mx_parts(hname, convention or "gpt-oss")
                if got is not None:
                    out.extend(got[1:3] if got[0] == "pair" else [got[1]])
            else:
                part = plain_part(hname, None, None)
                if part is not None:
                    out.append(part)
        if refused:
            if dry_run or dst is None:
                return rep
            raise ConversionRefused(
                f"{len(refused)} tensor(s) have no exact safetensors form; nothing was written "
                "(choose --fallback float32|float16|bfloat16 to write them dequantized)",
                path=src, reasons=refused, report=rep,
            )
        names = [o[0] for o in out]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise InconsistentError(f"two tensors would be written as {dup!r}", path=src, tensor=dup)
        if dry_run or dst is None:
            return rep
        total = sum(int(np.asarray(o[3]).nbytes) for o in out)
        state = {"done": 0}

        def counted(src_buf: Any) -> Any:
            def gen() -> Any:
                yield src_buf
                state["done"] += int(np.asarray(src_buf).nbytes)
                if progress:
                    progress(state["done"], total)

            return gen

        write_safetensors(dst, [(n, d, s, counted(b)) for n, d, s, b in out], metadata,
                          force=force, header=header, inputs=(src,))
    return rep
