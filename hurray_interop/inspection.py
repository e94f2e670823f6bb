"""What ``hurray-interop inspect`` shows per format, as plain data (the CLI renders it).

The format records (:mod:`hurray_interop.plugins`) call :func:`inspect_hurray`, :func:`inspect_gguf` and
:func:`inspect_safetensors`; :func:`hurray_interop.inspect` picks one by the
file's magic bytes.

For a .hrry file: every tensor (name, shape, element type, layout,
quantization scheme and parameters, stored bytes) and the KV metadata.
For a .gguf file: header facts, metadata with exact GGUF types, and the
conversion plan per tensor (what ``convert --dry-run`` would do).
For a .safetensors file: its tensors, the MX convention detected, metadata.
Only headers, indexes and (for the GGUF plan) scales are read.

Every result has a ``summary`` (tensors, elements, bytes; for a plan its counts and the
``--fallback exact`` hint).  A metadata item is ``{"key", "type", "value"}``; an array's
``value`` is its first ``max_items`` items (:data:`MAX_ITEMS`; ``None``: all) and its
``count`` is apart, so the items are always of the array's element type (a ``bytes`` value
or item is shown as ``"<N bytes>"``).  Text is ``str``
that any UTF-8 output can write: bytes that are not UTF-8 are ``\\xNN`` (the item has
``"utf8": false``), a lone surrogate is ``\\uXXXX`` (:func:`safe_text`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from .core.kv import KVValue
from .errors import UsageError
from .core.model import (
    LAYOUT_NAMES, OP_NAMES, RULE_NAMES, CompositeHead, Descriptor,
)

__all__ = ["inspect_hurray", "inspect_gguf", "inspect_safetensors", "describe_quantization", "describe_layout"]


def describe_layout(d: Descriptor) -> str:
    lay = d.layout
    if isinstance(lay, CompositeHead):
        op = OP_NAMES.get(lay.combine_op, str(lay.combine_op))
        return f"composite {RULE_NAMES.get(lay.composition_rule, lay.composition_rule)}{'(' + op + ')' if op else ''} x{lay.member_count}"
    return LAYOUT_NAMES.get(lay.tag, f"private 0x{lay.tag:02x}")  # a layout class's name (core/layouts.py)


def describe_quantization(d: Descriptor) -> dict[str, Any] | None:
    """The scheme's name and the fields its class shows (None: not quantized)."""
    q = d.quantization
    if q is None:
        return None
    from .core.schemes import rule_of  # the scheme classes: not created for a GGUF's inspect

    return rule_of(q).describe(q)  # type: ignore[union-attr]


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


#: array items shown by default (``--max-items N`` / ``max_items=N``; ``None``: every item)
MAX_ITEMS = 16


def check_max_items(max_items: int | None) -> None:
    """``max_items`` is ``None`` (whole arrays) or a non-negative int."""
    if max_items is not None and (isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 0):
        raise UsageError(f"max_items must be a non-negative integer or None (whole arrays), got {max_items!r}")


def safe_text(s: str) -> str:
    """``s`` with what is not a Unicode scalar value made visible: the bytes a GGUF name or
    key that is not UTF-8 kept as surrogate escapes as ``\\xNN``, a lone surrogate (a JSON
    ``"\\ud800"`` in a safetensors header) as ``\\uXXXX``; valid text is returned as is."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        pass
    return "".join(
        (f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else f"\\u{ord(c):04x}")
        if 0xD800 <= ord(c) <= 0xDFFF else c
        for c in s
    )


def _text_of(raw: bytes, bad: list[bool]) -> str:
    """GGUF string bytes as text: UTF-8 decoded; bytes that are not UTF-8 as ``\\xNN``
    (and ``bad`` set, so the item says ``"utf8": false``)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        bad[0] = True
        return raw.decode("utf-8", "backslashreplace")


def _array_item(key: str, type_name: str, items: list[Any], count: int, bad: list[bool] | None = None) -> dict[str, Any]:
    """An array as shown: its first items (``value``) and, apart, how many it has (``count``)."""
    item = {"key": key, "type": type_name, "value": items, "count": count}
    if bad and bad[0]:
        item["utf8"] = False
    return item


def _head(n: int, max_items: int | None) -> int:
    return n if max_items is None else min(n, max_items)


def _kv_plain(x: Any) -> Any:
    return f"<{len(x)} bytes>" if isinstance(x, (bytes, bytearray, memoryview)) else x


def _kv_item(key: str, v: KVValue, max_items: int | None = MAX_ITEMS) -> dict[str, Any]:
    if v.type == "array":
        vals = v.value
        return _array_item(key, f"array[{v.element_type}]", [_kv_plain(x) for x in vals[: _head(len(vals), max_items)]],
                           len(vals))
    if v.type == "bytes":
        return {"key": key, "type": "bytes", "value": f"<{len(v.value)} bytes>"}
    return {"key": key, "type": v.type, "value": v.value}


def _elements(shape: Any) -> int | None:
    """The element count of a shape (``None`` when a dimension is not fixed)."""
    n = 1
    for d in shape:
        if d is None:
            return None
        n *= int(d)
    return n


def inspect_hurray(path: str, *, max_items: int | None = MAX_ITEMS) -> dict[str, Any]:
    from .core.hrry import HrryFile

    check_max_items(max_items)
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
                    "elements": _elements(d.shape),
                    "type": d.element_type.name,
                    "layout": describe_layout(d),
                    "quantization": _quant_text(q),
                    "quantization_params": q,
                    "stored_bytes": sum(h.byte_size for h in d.buffers),
                    "member_of_composite": name in members,
                }
            )
        info = {
            "path": path,
            "format": "hurray",
            "tensor_count": len(hf.names),
            "file_size": os.path.getsize(path),
            "alignment": hf.header.alignment,
            "tensors": tensors,
            "tensor_columns": ["name", "shape", "elements", "type", "layout", "quantization", "stored_bytes"],
            "metadata": [_kv_item(k, v, max_items) for k, v in hf.kv.items()],
        }
    top = [t for t in tensors if not t["member_of_composite"]]  # a composite's members are its elements
    known = [t["elements"] for t in top if t["elements"] is not None]
    info["summary"] = {"tensors": len(tensors), "top_level": len(top),
                       "elements": sum(known) if len(known) == len(top) else None,
                       "stored_bytes": sum(t["stored_bytes"] for t in tensors)}
    return info


def _gguf_value(key: str, v: Any, max_items: int | None) -> dict[str, Any]:
    """One GGUF metadata value as shown: exact GGUF type; an array as its first items and
    its count; strings as text (bytes that are not UTF-8 as ``\\xNN``)."""
    from .formats import gguf as G

    bad = [False]
    if v.type != G.ValueType.ARRAY:
        value = _text_of(v.value, bad) if v.type == G.ValueType.STRING else v.to_python()
        item = {"key": key, "type": v.type.name, "value": value}
        if bad[0]:
            item["utf8"] = False
        return item
    et = v.element_type
    n = len(v)
    k = _head(n, max_items)
    if et == G.ValueType.STRING:
        raw = v.value.tolist() if k == n else [v.value[i] for i in range(k)]  # decode only what is shown
        shown: list[Any] = [_text_of(b, bad) for b in raw]
    elif et == G.ValueType.ARRAY:
        shown = [_gguf_value(key, inner, max_items) for inner in v.value[:k]]
        for inner in shown:
            inner.pop("key")
            bad[0] |= inner.get("utf8") is False
    elif et == G.ValueType.BOOL:
        shown = [bool(x) for x in v.value[:k].tolist()]
    else:
        shown = v.value[:k].tolist()
    return _array_item(key, f"ARRAY[{et.name if et is not None else '?'}]", shown, n, bad)


def inspect_gguf(path: str, *, fallback: str | None = None, max_items: int | None = MAX_ITEMS) -> dict[str, Any]:
    from .conversions.gguf import plan_gguf_open
    from .formats import gguf as G

    check_max_items(max_items)
    with G.read_gguf(path) as gf, _split_set(gf) as s:
        model = s.shards[0] if s is not None else gf  # a set's metadata is its first shard's
        metadata = [_gguf_value(safe_text(k), v, max_items) for k, v in model.kv.items()]
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
        shapes = {t.name: t.ne for f in (s.shards if s is not None else [gf]) for t in f.tensors}
        plan = plan_gguf_open(gf if s is None else s, fallback=fallback)  # the plan of convert --dry-run [--fallback]
    _add_plan(info, plan, "ggml_type", fallback)
    rows = []
    for row, t in zip(info["tensors"], plan.tensors):
        ne = shapes[t.name]  # GGUF order (ne[0] innermost); numpy's shape is ne reversed
        name = row.pop("name")
        rows.append({"name": name, "shape": list(reversed(ne)), "ne": list(ne), "elements": _elements(ne), **row})
    info["tensors"] = rows
    info["tensor_columns"][1:1] = ["shape", "ne", "elements"]
    info["summary"]["elements"] = sum(r["elements"] for r in rows)
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


def _add_plan(info: dict[str, Any], plan: Any, source_key: str, fallback: str | None = None) -> None:
    """The conversion plan (a dry run's report) as rows of ``info``, and its summary."""
    info["tensors"] = [
        {
            "name": safe_text(t.name),
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
    info["notes"] = plan.notes + plan.form_notes + ([f"the conversion would be refused: {plan.refusal}"] if plan.refusal else [])
    info["summary"] = {
        "tensors": len(plan.tensors),
        "elements": None,  # filled in by the format that knows its shapes
        "bytes_in": plan.bytes_in,
        "bytes_out": plan.bytes_out,
        "counts": dict(sorted(plan.counts().items())),
        "hint": _hint(plan, fallback),
    }


def _hint(plan: Any, fallback: str | None) -> str | None:
    """``--fallback exact`` when it would store a tensor the plan refuses (its type has an exact
    expanded form); the module that knows is loaded only when something is refused."""
    from .conversions.fallback import EXACT as FALLBACK_EXACT

    refused = [t for t in plan.tensors if t.status == "refused"]
    if not refused or fallback == FALLBACK_EXACT:
        return None
    from .conversions import gguf_exact

    stored = [t for t in refused if gguf_exact.has_form(t.source_type)]
    if not stored:
        return None
    which = f"the {len(refused)}" if len(stored) == len(refused) else f"{len(stored)} of the {len(refused)}"
    types = ", ".join(sorted({t.source_type for t in stored}))
    return f"--fallback exact would store {which} refused tensor(s) ({types}) exactly, in their larger expanded form"


def inspect_safetensors(path: "str | os.PathLike[str]", *, max_items: int | None = MAX_ITEMS) -> dict[str, Any]:
    """Describe a safetensors file: tensors, the MX convention detected, metadata, and the
    Hurray mapping planned for each tensor (a dry run: nothing is written).  ``max_items``
    does not apply: safetensors metadata values are strings."""
    from .conversions.safetensors import safetensors_to_hurray
    from .formats.safetensors import SafetensorsFile, detect_pairs

    check_max_items(max_items)
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
            "metadata": [{"key": safe_text(k), "type": "string", "value": safe_text(v)}
                         for k, v in (st.metadata or {}).items()],
            "source_tensors": [
                {"name": safe_text(e.name), "dtype": e.dtype, "shape": list(e.shape), "elements": _elements(e.shape),
                 "bytes": e.nbytes}
                for e in st.entries
            ],
        }
    _add_plan(info, safetensors_to_hurray(p, None, dry_run=True), "source_type")
    return info
