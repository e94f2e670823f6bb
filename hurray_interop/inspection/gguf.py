"""``inspect`` of a GGUF file or split set: header facts, metadata with exact GGUF types, and the
conversion plan per tensor (what ``convert --dry-run`` would do)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from .common import MAX_ITEMS, _add_plan, _array_item, _elements, _head, _text_of, check_max_items, safe_text


def _gguf_value(key: str, v: Any, max_items: int | None) -> dict[str, Any]:
    """One GGUF metadata value as shown: exact GGUF type; an array as its first items and
    its count; strings as text (bytes that are not UTF-8 as ``\\xNN``)."""
    from ..formats import gguf as G

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
    from ..conversions.gguf import plan_gguf_open
    from ..formats import gguf as G

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
    from ..formats import gguf as G

    if not G.has_split_keys(gf):
        yield None
        return
    from ..formats.gguf_split import borrowed_set

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
