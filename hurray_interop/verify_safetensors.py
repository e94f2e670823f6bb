"""Verification of safetensors MX checkpoints (the safetensors half of ``verify``).

Round trip: safetensors → .hrry → safetensors in a temporary directory, the file
compared byte for byte with the source, and per tensor our shared dequantizer on
the Hurray tensor against an independent decoding of the source codes and scale
bytes (ml_dtypes element values × 2^(e−127), :func:`hurray_interop.conversions.mx.source_values`).
Pairs: a safetensors file with a .hrry (either order), or two safetensors files.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable

import numpy as np

from .conversions.safetensors import pair_label, hurray_to_safetensors, safetensors_to_hurray
from .core.elements import unpack
from .core.hrry import HrryFile
from .errors import ConversionRefused, UnsupportedError
from .conversions import mx
from .formats.safetensors import SafetensorsFile, detect_pairs, hurray_type_for
from .verify import TensorCheck, compare_values, first_byte_diff, run_roundtrip

__all__ = ["verify_safetensors_roundtrip", "verify_safetensors_pair"]


def _locate_safetensors(st: SafetensorsFile, offset: int) -> str:
    """What lies at ``offset`` of a safetensors file."""
    if offset < 8:
        return f"header length (offset {offset})"
    if offset < st.data_offset:
        return f"JSON header (offset {offset})"
    rel = offset - st.data_offset
    for e in st.entries:
        if e.begin <= rel < e.end:
            return f"tensor {e.name!r} byte {rel - e.begin} (offset {offset})"
    return f"end of data (offset {offset})"


def _pair_reference(st: SafetensorsFile, p: Any) -> Callable[[int, int], np.ndarray]:
    """ml_dtypes decoding of a pair's source codes and scale bytes, by rows along the last axis."""
    el = mx.mx_element(p.element)
    ncols = p.shape[-1]
    nrows = int(np.prod(p.shape[:-1], dtype=np.int64)) if len(p.shape) > 1 else 1
    data = st.raw(p.data.name).reshape(nrows, -1)
    scales = st.raw(p.scale.name).reshape(nrows, -1)

    def rows(start: int, stop: int) -> np.ndarray:
        codes = unpack(np.ascontiguousarray(data[start:stop]), el.hurray, (stop - start) * ncols)
        return mx.source_values(codes.reshape(stop - start, ncols).view(el.np_dtype), scales[start:stop], el, p.block_size, -1)

    return rows


def _plain_reference(st: SafetensorsFile, name: str) -> Callable[[int, int], np.ndarray] | None:
    e = st.entry(name)
    et, exact_type = hurray_type_for(e.dtype, tensor=name)
    if not exact_type:
        return None
    n = int(np.prod(e.shape, dtype=np.int64))
    ncols = e.shape[-1] if e.shape else 1
    if et.packed:
        flat = unpack(st.raw(name), et, n).view(et.dtype)
    else:
        flat = st.raw(name).view(et.dtype)

    def rows(start: int, stop: int) -> np.ndarray:
        return flat[start * ncols : stop * ncols].astype(np.float32)

    return rows


def _check_against_hurray(st: SafetensorsFile, hf: HrryFile, result: Any, exported: SafetensorsFile | None) -> None:
    pairs, used = detect_pairs(st)
    by_data = {p.data.name: p for p in pairs}
    known: set[str] = set()
    for e in st.entries:
        if e.name in used and e.name not in by_data:
            continue  # the scale half of a pair: checked with its data tensor
        p = by_data.get(e.name)
        hname = p.hurray_name if p is not None else e.name
        known.add(hname)
        chk = TensorCheck(hname, pair_label(p) if p is not None else e.dtype, "-")
        result.tensors.append(chk)
        if hname not in hf:
            chk.values_equal, chk.where = False, "missing from the Hurray file"
            continue
        t = hf.tensor(hname)
        chk.mapping = t.describe()
        if exported is not None:
            names = (p.data.name, p.scale.name) if p is not None else (e.name,)
            eq = True
            for n in names:
                if n not in exported:
                    eq, chk.where = False, f"{n!r} missing after export"
                    break
                a, b = st.raw(n), exported.raw(n)
                if st.entry(n).dtype != exported.entry(n).dtype or st.entry(n).shape != exported.entry(n).shape:
                    eq, chk.where = False, f"{n!r} exported with a different dtype or shape"
                    break
                if not np.array_equal(a, b):
                    eq, chk.where = False, f"{n!r} byte {int(np.argmax(a != b))}"
                    break
            chk.bytes_equal = eq
        ref = _pair_reference(st, p) if p is not None else _plain_reference(st, e.name)
        if ref is None:
            continue
        eq, mad, where = compare_values(hname, t, ref, block=p.block_size if p is not None else 1)
        chk.values_equal, chk.max_abs_diff = eq, mad
        if where and not chk.where:
            chk.where = where
    extra = [n for n in hf.top_level_names() if n not in known]
    if extra:
        result.problems.append(f"tensors only in the Hurray file: {', '.join(extra[:5])}")


def verify_safetensors_roundtrip(path: "str | os.PathLike[str]", result: Any) -> None:
    """safetensors -> .hrry -> safetensors in a temporary directory: file bytes, per-tensor
    bytes, and our dequantizer against ml_dtypes decoding of the source codes."""
    p = os.fspath(path)

    def check(mid: str, back: str, diff: tuple[int, int, int] | None) -> None:
        with SafetensorsFile(p) as st, SafetensorsFile(back) as ex, HrryFile(mid) as hf:
            if diff is not None:
                off, sa, sb = diff
                where = _locate_safetensors(st, off) if off < sa else f"end of file (source {sa} bytes, result {sb} bytes)"
                result.problems.append(f"re-exported safetensors differs from the source first at {where}")
            _check_against_hurray(st, hf, result, ex)

    run_roundtrip(
        p, result, to_hurray=safetensors_to_hurray, from_hurray=hurray_to_safetensors, suffix=".safetensors", check=check
    )


def verify_safetensors_pair(pa: str, fa: str, pb: str, fb: str, result: Any) -> None:
    """Compare a safetensors file with a .hrry file (either order) or with another
    safetensors file."""
    if {fa, fb} == {"safetensors", "hurray"}:
        st_path, h_path = (pa, pb) if fa == "safetensors" else (pb, pa)
        with tempfile.TemporaryDirectory(prefix="hurray-interop-verify-") as tmp:
            back = os.path.join(tmp, "export.safetensors")
            try:
                hurray_to_safetensors(h_path, back)
            except ConversionRefused as exc:
                result.problems.append(f"{h_path}: {len(exc.reasons)} tensor(s) have no exact safetensors form")
                back = ""
            diff = first_byte_diff(st_path, back) if back else None
            if back:
                result.file_bytes_equal = diff is None
            with SafetensorsFile(st_path) as st, HrryFile(h_path) as hf:
                ex = SafetensorsFile(back) if back else None
                try:
                    if diff is not None:
                        off, sa, sb = diff
                        where = _locate_safetensors(st, off) if off < sa else f"end of file ({sa} vs {sb} bytes)"
                        result.problems.append(f"the Hurray file exports to a safetensors file that differs first at {where}")
                    _check_against_hurray(st, hf, result, ex)
                finally:
                    if ex is not None:
                        ex.close()
        return
    if (fa, fb) == ("safetensors", "safetensors"):
        diff = first_byte_diff(pa, pb)
        result.file_bytes_equal = diff is None
        with SafetensorsFile(pa) as a, SafetensorsFile(pb) as b:
            if diff is not None:
                off, sa, sb = diff
                where = _locate_safetensors(a, off) if off < sa else f"end of file ({sa} vs {sb} bytes)"
                result.problems.append(f"files differ first at {where}")
                if a.metadata != b.metadata:
                    result.problems.append("__metadata__ differs")
            for e in a.entries:
                chk = TensorCheck(e.name, e.dtype, "-")
                result.tensors.append(chk)
                if e.name not in b:
                    chk.bytes_equal, chk.where = False, f"missing from {pb}"
                    continue
                o = b.entry(e.name)
                x, y = a.raw(e.name), b.raw(e.name)
                chk.bytes_equal = o.dtype == e.dtype and o.shape == e.shape and bool(np.array_equal(x, y))
                if not chk.bytes_equal:
                    chk.where = f"byte {int(np.argmax(x != y))}" if x.size == y.size else f"{o.dtype} {list(o.shape)}"
            extra = [n for n in b.names if n not in a]
            if extra:
                result.problems.append(f"tensors only in {pb}: {', '.join(extra[:5])}")
        return
    raise UnsupportedError(
        f"cannot compare {fa} with {fb} directly; convert one of them to .hrry and compare with that"
    )
