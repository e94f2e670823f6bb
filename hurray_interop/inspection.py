"""What ``hurray-interop inspect`` shows per format, as plain data (the CLI renders it).

The registry's records call :func:`inspect_hurray`, :func:`inspect_gguf` and
:func:`inspect_safetensors`; :func:`hurray_interop.inspect` picks one by the
file's magic bytes.

For a .hrry file: every tensor (name, shape, element type, layout,
quantization scheme and parameters, stored bytes) and the KV metadata.
For a .gguf file: header facts, metadata with exact GGUF types, and the
conversion plan per tensor (what ``convert --dry-run`` would do).
For a .safetensors file: its tensors, the MX convention detected, metadata.
Only headers, indexes and (for the GGUF plan) scales are read.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from .core.kv import KVValue
from .core.model import (
    LAYOUT_NAMES, MXFP, OP_NAMES, RULE_NAMES, CompositeHead, Descriptor, PerBlockAffine, PerChannelAffine,
)

__all__ = ["inspect_hurray", "inspect_gguf", "inspect_safetensors", "describe_quantization", "describe_layout"]


def describe_layout(d: Descriptor) -> str:
    lay = d.layout
    name = LAYOUT_NAMES.get(lay.tag, f"private 0x{lay.tag:02x}")
    if isinstance(lay, CompositeHead):
        op = OP_NAMES.get(lay.combine_op, str(lay.combine_op))
        return f"composite {RULE_NAMES.get(lay.composition_rule, lay.composition_rule)}{'(' + op + ')' if op else ''} x{lay.member_count}"
    return name


def describe_quantization(d: Descriptor) -> dict[str, Any] | None:
    from .core.model import NF4, PerTensorAffine  # not created for a GGUF's inspect (core/model_extra.py)

    q = d.quantization
    if q is None:
        return None
    if isinstance(q, PerTensorAffine):
        return {"scheme": "per-tensor affine", "scale": q.scale, "zero_point": q.zero_point}
    if isinstance(q, PerChannelAffine):
        return {"scheme": "per-channel affine", "axis": q.axis, "symmetric": q.symmetric, "scale_type": q.scale_type.name}
    if isinstance(q, PerBlockAffine):
        return {
            "scheme": "per-block affine",
            "axis": q.axis,
            "block_size": q.block_size,
            "symmetric": q.symmetric,
            "scale_type": q.scale_type.name,
        }
    if isinstance(q, NF4):
        return {"scheme": "NF4", "axis": q.axis, "block_size": q.block_size}
    if isinstance(q, MXFP):
        return {"scheme": "MXFP", "axis": q.axis, "block_size": q.block_size, "scale_type": "float8_e8m0"}
    return {"scheme": type(q).__name__}  # pragma: no cover


def _quant_text(q: dict[str, Any] | None) -> str:
    if q is None:
        return ""
    parts = [q["scheme"]]
    if "block_size" in q:
        parts.append(f"K={q['block_size']}")
    if "axis" in q:
        parts.append(f"axis {q['axis']}")
    if "scale_type" in q:
        parts.append(q["scale_type"])
    if q.get("symmetric") is True:
        parts.append("symmetric")
    elif q.get("symmetric") is False:
        parts.append("zero points")
    if "scale" in q:
        parts.append(f"scale {q['scale']:g} zp {q['zero_point']}")
    return " ".join(parts)


def _kv_item(key: str, v: KVValue) -> dict[str, Any]:
    if v.type == "array":
        vals = list(v.value)
        shown: Any = vals if len(vals) <= 16 else vals[:16] + [f"… {len(vals)} items"]
        return {"key": key, "type": f"array[{v.element_type}]", "value": shown, "count": len(vals)}
    if v.type == "bytes":
        return {"key": key, "type": "bytes", "value": f"<{len(v.value)} bytes>"}
    return {"key": key, "type": v.type, "value": v.value}


def inspect_hurray(path: str) -> dict[str, Any]:
    from .core.hrry import HrryFile

    with HrryFile(path) as hf:
        tensors = []
        members = set(hf.names) - set(hf.top_level_names())
        for name in hf.names:
            d = hf.descriptor(name)
            q = describe_quantization(d)
            tensors.append(
                {
                    "name": name,
                    "shape": [None if x is None else int(x) for x in d.shape],
                    "type": d.element_type.name,
                    "layout": describe_layout(d),
                    "quantization": _quant_text(q),
                    "quantization_params": q,
                    "stored_bytes": sum(h.byte_size for h in d.buffers),
                    "member_of_composite": name in members,
                }
            )
        return {
            "path": path,
            "format": "hurray",
            "tensor_count": len(hf.names),
            "file_size": os.path.getsize(path),
            "alignment": hf.header.alignment,
            "tensors": tensors,
            "tensor_columns": ["name", "shape", "type", "layout", "quantization", "stored_bytes"],
            "metadata": [_kv_item(k, v) for k, v in hf.kv.items()],
        }


def _gguf_value(v: Any) -> tuple[str, Any]:
    from .formats import gguf as G

    t = v.type.name if v.type != G.ValueType.ARRAY else f"ARRAY[{v.element_type.name if v.element_type else '?'}]"
    if v.type == G.ValueType.ARRAY:
        n = len(v)
        if v.element_type == G.ValueType.ARRAY:
            return t, f"<{n} nested arrays>"
        head = [v.value[i] for i in range(min(n, 16))]
        if v.element_type == G.ValueType.STRING:
            shown: list[Any] = [bytes(b).decode("utf-8", "replace") for b in head]
        else:
            shown = [x.item() for x in head]
        if n > 16:
            shown = list(shown) + [f"… {n} items"]
        return t, shown
    return t, v.to_python("replace")


def inspect_gguf(path: str, *, fallback: str | None = None) -> dict[str, Any]:
    from .conversions.gguf import plan_gguf_open
    from .formats import gguf as G

    with G.read_gguf(path) as gf, _split_set(gf) as s:
        model = s.shards[0] if s is not None else gf  # a set's metadata is its first shard's
        metadata = []
        for k, v in model.kv.items():
            t, shown = _gguf_value(v)
            metadata.append({"key": k, "type": t, "value": shown})
        info = {
            "path": path,
            "format": "gguf",
            "version": gf.version,
            "alignment": gf.alignment,
            "tensor_count": len(gf.tensors) if s is None else s.total_tensors,
            "file_size": gf.file_size,
            "metadata": metadata,
        }
        if s is not None:
            info["split"] = _split_info(s)
        plan = plan_gguf_open(gf if s is None else s, fallback=fallback)  # the plan of convert --dry-run [--fallback]
    _add_plan(info, plan, "ggml_type")
    return info


@contextlib.contextmanager
def _split_set(gf: Any) -> Iterator[Any]:
    """The split GGUF set ``gf`` is a shard of (None for a whole model; the split module is
    loaded only for a file with split keys), borrowed for the ``with`` block."""
    from .formats import gguf as G

    if not G.has_split_keys(gf):
        yield None
        return
    from .formats.gguf_split import borrowed_set

    with borrowed_set(gf) as s:
        yield s


def _split_info(s: Any) -> dict[str, Any]:
    """The shards of a set: file, tensors, bytes (docs/conversion-rules.md § 10)."""
    return {
        "prefix": s.prefix,
        "count": s.count,
        "tensors": s.total_tensors,
        "shards": [
            {"file": p.name, "tensors": len(gf.tensors), "file_size": gf.file_size} for p, gf in zip(s.paths, s.shards)
        ],
    }


def _add_plan(info: dict[str, Any], plan: Any, source_key: str) -> None:
    """The conversion plan (a dry run's report) as rows of ``info``."""
    info["tensors"] = [
        {
            "name": t.name,
            source_key: t.source_type,
            "hurray_mapping": t.mapping,
            "status": t.status,
            "bytes_in": t.bytes_in,
            "bytes_out": t.bytes_out,
            "substituted_blocks": t.substituted_blocks,
            "reason": t.note,  # with the hint of a refused tensor
        }
        for t in plan.tensors
    ]
    info["tensor_columns"] = ["name", source_key, "hurray_mapping", "status", "bytes_in", "bytes_out", "reason"]
    info["notes"] = list(plan.notes)


def inspect_safetensors(path: "str | os.PathLike[str]") -> dict[str, Any]:
    """Describe a safetensors file: tensors, the MX convention detected, metadata, and the
    Hurray mapping planned for each tensor (a dry run: nothing is written)."""
    from .conversions.safetensors import safetensors_to_hurray
    from .formats.safetensors import SafetensorsFile, detect_pairs

    p = os.fspath(path)
    with SafetensorsFile(p) as st:
        pairs, _ = detect_pairs(st)
        convs = sorted({q.convention for q in pairs})
        info: dict[str, Any] = {
            "path": p,
            "format": "safetensors",
            "tensor_count": len(st.entries),
            "file_size": os.path.getsize(p),
            "convention": "none" if not convs else (convs[0] if len(convs) == 1 else "mixed"),
            "metadata": [{"key": k, "type": "string", "value": v} for k, v in (st.metadata or {}).items()],
            "source_tensors": [
                {"name": e.name, "dtype": e.dtype, "shape": list(e.shape), "bytes": e.nbytes} for e in st.entries
            ],
        }
    _add_plan(info, safetensors_to_hurray(p, None, dry_run=True), "source_type")
    return info

