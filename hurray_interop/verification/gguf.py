"""What ``verify`` needs to know about GGUF: offsets named, metadata types compared, and
gguf-py's ``gguf.quants.dequantize`` (through :func:`conversions.gguf.reference_dequantizer`)
as the reference decoder.  For MXFP4, +0 and −0 compare equal (docs/conversion-rules.md § 6)."""

from __future__ import annotations

import functools
from typing import Iterator

import numpy as np

from ..conversions.gguf import reference_dequantizer
from ..formats import gguf as G
from .common import ForeignChecks, ForeignVerifier, RawEntry, Rows, Unit

__all__ = ["VERIFIER"]


def _reference(info: "G.GGUFTensorInfo") -> Rows | None:
    """gguf-py's decoder over the blocks ``start:stop`` of a GGUF tensor (numpy's cast
    over elements for plain types); None when gguf-py has no decoder for the type."""
    t = info.ggml_type
    dt = t.dtype()
    if dt is not None:
        flat = info.data.view(dt)

        def plain(start: int, stop: int) -> np.ndarray:
            return flat[start:stop].astype(np.float32)

        return plain
    decode = reference_dequantizer(t)
    if decode is None:
        return None
    blocks = info.data.reshape(-1, t.block_bytes)

    def quant(start: int, stop: int) -> np.ndarray:
        # one row: gguf-py runs its decoder once per group of 16 rows
        return decode(blocks[start:stop].reshape(1, -1))

    return quant


def _byte_where(bt: "G.GGMLType", rel: int) -> str:
    return f"block {rel // bt.block_bytes}, byte {rel % bt.block_bytes}" if bt.block_elements > 1 else f"byte {rel}"


def _locate(gf: "G.GGUFFile", offset: int) -> str:
    """Say what lies at ``offset`` of a GGUF file: header, a metadata key, a tensor block."""
    if offset < 24:
        return f"header (offset {offset})"
    keys = sorted(gf.kv_offsets.items(), key=lambda kv: kv[1])
    if offset < gf.tensor_infos_offset:
        name = next((k for k, o in reversed(keys) if o <= offset), None)
        return f"metadata key {name!r} (offset {offset})"
    if offset < gf.metadata_end:
        name = next((t.name for t in reversed(gf.tensors) if t.info_offset <= offset), None)
        return f"tensor info of {name!r} (offset {offset})"
    for t in gf.tensors:
        if t.data_offset <= offset < t.data_offset + t.nbytes:
            return f"tensor {t.name!r} {_tensor_where(t, offset - t.data_offset)} (offset {offset})"
    return f"padding (offset {offset})"


def _tensor_where(t: "G.GGUFTensorInfo", rel: int) -> str:
    bt = t.ggml_type
    if bt.block_elements > 1:
        return _byte_where(bt, rel)
    return f"element {rel // bt.block_bytes}"


def _vt(v: "G.GGUFValue") -> str:
    if v.type == G.ValueType.ARRAY and v.element_type is not None:
        return f"ARRAY[{v.element_type.name}]"
    return v.type.name


def _kv_diffs(a: "G.GGUFFile", b: "G.GGUFFile") -> list[str]:
    out = []
    ka, kb = list(a.kv), list(b.kv)
    if ka != kb:
        missing = [k for k in ka if k not in b.kv]
        extra = [k for k in kb if k not in a.kv]
        if missing:
            out.append(f"metadata keys missing: {', '.join(missing[:5])}")
        if extra:
            out.append(f"metadata keys added: {', '.join(extra[:5])}")
        if not missing and not extra:
            out.append("metadata key order differs")
    for k in ka:
        if k in b.kv:
            va, vb = a.kv[k], b.kv[k]
            if va.type != vb.type or va.element_type != vb.element_type:
                out.append(f"metadata key {k!r}: type {_vt(va)} vs {_vt(vb)}")
            elif va != vb:
                out.append(f"metadata key {k!r}: value differs")
    if a.version != b.version:
        out.append(f"GGUF version {a.version} vs {b.version}")
    return out


def _entries(gf: "G.GGUFFile") -> dict[str, RawEntry]:
    return {
        t.name: RawEntry(t.type_name, (t.type_id, *t.ne), t.data, t.data_offset, functools.partial(_byte_where, t.ggml_type))
        for t in gf.tensors
    }


def _units(gf: "G.GGUFFile") -> Iterator[Unit]:
    for info in gf.tensors:
        yield Unit(
            info.name,
            info.type_name,
            (info.name,),
            functools.partial(_reference, info),
            block=info.ggml_type.block_elements,
            signed_zero_equal=info.type_name == "MXFP4",
            row=info.ggml_type.block_elements,  # the reference decodes blocks, bounded for any row length
        )


VERIFIER = ForeignVerifier(
    ForeignChecks(
        title="GGUF",
        exported_as="a GGUF",
        no_exact="no exact GGUF equivalent",
        open=G.read_gguf,
        locate=_locate,
        metadata_diffs=_kv_diffs,
        entries=_entries,
        units=_units,
    )
)
