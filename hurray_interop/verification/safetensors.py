"""What ``verify`` needs to know about safetensors MX checkpoints: offsets named, MX
pairs (codes + scales) as one Hurray tensor, and an independent decoding of the source
codes and scale bytes as the reference (ml_dtypes element values × 2^(e−127),
:func:`hurray_interop.conversions.mx.source_values`)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator

import numpy as np

from ..conversions import mx
from ..conversions.safetensors import pair_label
from ..core.elements import unpack
from ..formats.safetensors import SafetensorsFile, detect_pairs, hurray_type_for, pair_names
from .common import ForeignChecks, ForeignVerifier, RawEntry, Unit

__all__ = ["VERIFIER"]


def _locate(st: SafetensorsFile, offset: int) -> str:
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
    if et.packed:
        flat = unpack(st.raw(name), et, n).view(et.dtype)
    else:
        flat = st.raw(name).view(et.dtype)

    def rows(start: int, stop: int) -> np.ndarray:  # rows of one element (Unit.row): bounded windows
        return flat[start:stop].astype(np.float32)

    return rows


def _metadata_diffs(a: SafetensorsFile, b: SafetensorsFile) -> list[str]:
    return [] if a.metadata == b.metadata else ["__metadata__ differs"]


def _byte_where(rel: int) -> str:
    return f"byte {rel}"


def _entries(st: SafetensorsFile) -> dict[str, RawEntry]:
    return {
        e.name: RawEntry(e.dtype, (e.dtype, *e.shape), st.raw(e.name), st.data_offset + e.begin, _byte_where)
        for e in st.entries
    }


def _aliases(p: Any) -> tuple[str, ...]:
    """The Hurray name an export may have written this pair from: compressed-tensors names the
    pair of a Hurray ``X`` without the ``.weight`` suffix ``X.weight_packed``, read back as ``X.weight``."""
    base = p.hurray_name.rsplit(".", 1)[0]
    if base != p.hurray_name and pair_names(base, p.convention) == (p.data.name, p.scale.name):
        return (base,)
    return ()


def _units(st: SafetensorsFile) -> Iterator[Unit]:
    pairs, used = detect_pairs(st)
    by_data = {p.data.name: p for p in pairs}
    for e in st.entries:
        p = by_data.get(e.name)
        if p is not None:
            ref = functools.partial(_pair_reference, st, p)
            yield Unit(p.hurray_name, pair_label(p), (p.data.name, p.scale.name), ref, block=p.block_size,
                       shape=tuple(int(n) for n in p.shape), aliases=_aliases(p))
        elif e.name not in used:  # (the scale half of a pair is checked with its data tensor)
            yield Unit(e.name, e.dtype, (e.name,), functools.partial(_plain_reference, st, e.name), row=1,
                       shape=tuple(int(n) for n in e.shape))


def _oracle() -> tuple[str, str]:
    from importlib.metadata import version

    return "ml_dtypes", f"ml_dtypes {version('ml_dtypes')} element values, numpy casts"


VERIFIER = ForeignVerifier(
    ForeignChecks(
        title="safetensors",
        exported_as="a safetensors file",
        no_exact="no exact safetensors form",
        open=SafetensorsFile,
        locate=_locate,
        metadata_diffs=_metadata_diffs,
        entries=_entries,
        units=_units,
        oracle=_oracle,
    )
)
