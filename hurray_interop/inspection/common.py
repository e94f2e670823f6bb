"""What the per-format inspectors share: descriptors (layout, quantization), metadata items
and text as shown, and a conversion plan as rows.

Every result has a ``summary`` (tensors, elements, bytes; for a plan its counts and the
``--fallback exact`` hint).  A metadata item is ``{"key", "type", "value"}``; an array's
``value`` is its first ``max_items`` items (:data:`MAX_ITEMS`; ``None``: all) and its
``count`` is apart, so the items are always of the array's element type (a ``bytes`` value
or item is shown as ``"<N bytes>"``).  Text is ``str``
that any UTF-8 output can write: bytes that are not UTF-8 are ``\\xNN`` (the item has
``"utf8": false``), a lone surrogate is ``\\uXXXX`` (:func:`safe_text`).
"""

from __future__ import annotations

from typing import Any

from ..core.kv import KVValue
from ..errors import UsageError
from ..core.model import (
    LAYOUT_NAMES, OP_NAMES, RULE_NAMES, CompositeHead, Descriptor, Strided,
)

__all__ = ["describe_quantization", "describe_layout", "check_max_items", "safe_text", "MAX_ITEMS"]


def describe_layout(d: Descriptor) -> str:
    lay = d.layout
    if isinstance(lay, CompositeHead):
        op = OP_NAMES.get(lay.combine_op, str(lay.combine_op))
        return f"composite {RULE_NAMES.get(lay.composition_rule, lay.composition_rule)}{'(' + op + ')' if op else ''} x{lay.member_count}"
    name = LAYOUT_NAMES.get(lay.tag, f"private 0x{lay.tag:02x}")  # a layout class's name (core/layouts.py)
    return f"{name} {list(lay.strides)}" if isinstance(lay, Strided) else name  # [0, 0]: a broadcast member


def describe_quantization(d: Descriptor) -> dict[str, Any] | None:
    """The scheme's name and the fields its class shows (None: not quantized)."""
    q = d.quantization
    if q is None:
        return None
    from ..core.schemes import rule_of  # the scheme classes: not created for a GGUF's inspect

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
    from ..conversions.fallback import EXACT as FALLBACK_EXACT

    refused = [t for t in plan.tensors if t.status == "refused"]
    if not refused or fallback == FALLBACK_EXACT:
        return None
    from ..conversions import gguf_exact

    stored = [t for t in refused if gguf_exact.has_form(t.source_type)]
    if not stored:
        return None
    which = f"the {len(refused)}" if len(stored) == len(refused) else f"{len(stored)} of the {len(refused)}"
    types = ", ".join(sorted({t.source_type for t in stored}))
    return f"--fallback exact would store {which} refused tensor(s) ({types}) exactly, in their larger expanded form"
