"""The entry point of ``compare``: two models of any formats, tensors matched by name, their
values' error figures (:mod:`hurray_interop.verification.compare`) and their metadata
(:mod:`hurray_interop.inspection.metadata`), through each format's registry record
(``values``, ``metadata``); the report as text (:meth:`CompareResult.render_text`) or JSON
(:meth:`CompareResult.to_json`)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from ._inspect import value_text, json_safe, terminal_safe
from .errors import UsageError
from .parallel import check_jobs, use_jobs
from .registry import detect_format
from .verification.compare import DIFFERS, IDENTICAL, NOT_DECODED, SHAPE, TensorDiff, compare_tensors

__all__ = ["compare", "CompareResult", "MetadataDiff", "SHORT", "ITEMS"]

#: characters a metadata value is shortened to (``…``) unless ``full``
SHORT = 60
#: array items a JSON report gives unless ``full`` (with the array's ``count``)
ITEMS = 16


@dataclass
class MetadataDiff:
    """Keys only in A, only in B, in both with different types or values (``(a, b)`` items),
    the number equal, and the container keys left out of the comparison (per side)."""

    only_in_a: list[dict[str, Any]] = field(default_factory=list)
    only_in_b: list[dict[str, Any]] = field(default_factory=list)
    differ: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    equal: int = 0
    left_out_a: list[str] = field(default_factory=list)
    left_out_b: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not (self.only_in_a or self.only_in_b or self.differ)


#: how the summary says each status
_SAID = {DIFFERS: "differ", SHAPE: "differ in shape", NOT_DECODED: "not decoded"}


@dataclass
class CompareResult:
    a: str
    b: str
    format_a: str
    format_b: str
    tensors: list[TensorDiff] = field(default_factory=list)
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    metadata: MetadataDiff = field(default_factory=MetadataDiff)

    @property
    def identical(self) -> bool:
        """Every tensor of both and every key identical (exit 0; else 1)."""
        return (not self.only_in_a and not self.only_in_b and all(t.identical for t in self.tensors)
                and self.metadata.identical)

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in (IDENTICAL, DIFFERS, SHAPE, NOT_DECODED)}
        for t in self.tensors:
            out[t.status] += 1
        return out

    def summary_line(self) -> str:
        what = f"{self.a} vs {self.b}"
        c, m = self.counts(), self.metadata
        if self.identical:
            return f"IDENTICAL {what}: {len(self.tensors)} tensors, {m.equal} metadata keys"
        parts = [f"{n} of {len(self.tensors)} tensors {_SAID[s]}" for s, n in c.items() if n and s != IDENTICAL]
        parts += [f"{len(x)} tensor(s) only in {w}" for x, w in ((self.only_in_a, "A"), (self.only_in_b, "B")) if x]
        parts += [f"{len(x)} metadata key(s) {w}" for x, w in
                  ((m.differ, "differ"), (m.only_in_a, "only in A"), (m.only_in_b, "only in B")) if x]
        return f"DIFFERENT {what}: " + ", ".join(parts)

    def to_json(self, *, full: bool = False) -> dict[str, Any]:
        """Every tensor with every figure; non-finite floats as ``"inf"``, ``"-inf"``, ``"nan"``
        (as ``inspect --json``); metadata items as ``inspect --json`` shows them (arrays their
        first :data:`ITEMS` items and ``count`` unless ``full``)."""
        m = self.metadata
        item = (lambda x: x) if full else _first_items
        data = {
            "a": self.a, "b": self.b, "format_a": self.format_a, "format_b": self.format_b,
            "identical": self.identical,
            "counts": self.counts(),
            "tensors": [dict(vars(t)) for t in self.tensors],
            "only_in_a": self.only_in_a, "only_in_b": self.only_in_b,
            "metadata": {
                "equal": m.equal,
                "differ": [{"key": x["key"], "a": _typed(item(x)), "b": _typed(item(y))} for x, y in m.differ],
                "only_in_a": [item(x) for x in m.only_in_a], "only_in_b": [item(x) for x in m.only_in_b],
                "left_out_a": m.left_out_a, "left_out_b": m.left_out_b,
            },
            "summary": self.summary_line(),
        }
        return json_safe(data)

    def render_text(self, *, verbose: bool = False, full: bool = False) -> str:
        """The report: the tensors that differ (every tensor with ``verbose``) as a table,
        tensors only in one model, the metadata differences, the summary line."""
        lines = [terminal_safe(f"A: {self.a} ({self.format_a})"), terminal_safe(f"B: {self.b} ({self.format_b})")]
        lines += _tensor_table(self.tensors, verbose)
        for names, side in ((self.only_in_a, "A"), (self.only_in_b, "B")):
            if names:
                lines.append(terminal_safe(f"tensors only in {side} ({len(names)}): {', '.join(names)}"))
        lines += _metadata_lines(self.metadata, full)
        lines.append(terminal_safe(self.summary_line()))
        return "\n".join(lines) + "\n"


def _first_items(item: dict[str, Any]) -> dict[str, Any]:
    if "count" in item and len(item["value"]) > ITEMS:
        return {**item, "value": item["value"][:ITEMS]}
    return item


def _typed(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k != "key"}


# ---------------------------------------------------------------------------
# text


_COLUMNS = ["tensor", "type A", "type B", "shape", "max abs", "RMSE", "NMSE", "cosine", "first diff"]


def _num(x: float | None, fmt: str = ".4g") -> str:
    if x is None:
        return ""
    if math.isnan(x):
        return "nan"
    return "inf" if math.isinf(x) else format(x, fmt)


def _row(t: TensorDiff) -> list[str]:
    shape = str(t.shape_a) if t.status != SHAPE else f"{t.shape_a} vs {t.shape_b}"
    if t.status == SHAPE or t.status == NOT_DECODED:
        return [t.name, t.type_a, t.type_b, shape, t.status, "", "", "", "" if t.status == SHAPE else t.note]
    first = ""
    if t.first_diff is not None and t.first_values is not None:
        first = f"[{','.join(map(str, t.first_diff))}]: {t.first_values[0]:.6g} vs {t.first_values[1]:.6g}"
    cos = "1" if t.cosine == 1.0 else _num(t.cosine, ".6f")
    return [t.name, t.type_a, t.type_b, shape, _num(t.max_abs), _num(t.rmse), _num(t.nmse), cos, first]


def _tensor_table(tensors: list[TensorDiff], verbose: bool) -> list[str]:
    shown = tensors if verbose else [t for t in tensors if not t.identical]
    same = sum(1 for t in tensors if t.identical)
    lines = [f"tensors in both: {len(tensors)}, {same} identical"
             + ("" if verbose or not same else " (not listed; -v lists every tensor)")]
    if not shown:
        return lines
    rows = [_COLUMNS] + [[terminal_safe(c) for c in _row(t)] for t in shown]
    w = [max(len(r[c]) for r in rows) for c in range(len(_COLUMNS))]
    lines += ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    return lines


def _shown(item: dict[str, Any], full: bool) -> str:
    text = value_text(item, None if full else SHORT)
    if not full and len(text) > SHORT:
        text = text[: SHORT - 1] + "…"
    return terminal_safe(f"[{item['type']}] {text}")


def _first_item_diff(x: dict[str, Any], y: dict[str, Any]) -> str:
    """Where two arrays of one type first differ: their counts, or the first differing item."""
    if "count" not in x or "count" not in y or x["type"] != y["type"]:
        return ""
    at = next((i for i, (p, q) in enumerate(zip(x["value"], y["value"])) if p != q), None)
    if at is not None:
        show = {"key": "", "type": "", "value": None}
        a, b = (value_text({**show, "value": v}, SHORT) for v in (x["value"][at], y["value"][at]))
        return f"(first differing item {at}: {a} vs {b})"
    return f"({x['count']:,} vs {y['count']:,} items)" if x["count"] != y["count"] else ""


def _metadata_lines(m: MetadataDiff, full: bool) -> list[str]:
    lines = [f"metadata: {m.equal} keys equal, {len(m.differ)} differ, {len(m.only_in_a)} only in A, "
             f"{len(m.only_in_b)} only in B"]
    for x, y in m.differ:
        lines.append(terminal_safe(f"  differs    {x['key']}: A {_shown(x, full)}"))
        pad = " " * (len(terminal_safe(x["key"])) + 14)
        lines.append(pad + f"B {_shown(y, full)}")
        where = _first_item_diff(x, y)
        if where:
            lines.append(pad + terminal_safe(where))
    lines += [terminal_safe(f"  only in A  {x['key']}: {_shown(x, full)}") for x in m.only_in_a]
    lines += [terminal_safe(f"  only in B  {x['key']}: {_shown(x, full)}") for x in m.only_in_b]
    return lines


# ---------------------------------------------------------------------------
# the comparison


def _metadata(fa: Any, pa: str, fb: Any, pb: str) -> MetadataDiff:
    (ea, la), (eb, lb) = fa.metadata(pa), fb.metadata(pb)
    by_b = {k: (item, c) for k, item, c in eb}
    keys_a = {k for k, _, _ in ea}
    m = MetadataDiff(left_out_a=la, left_out_b=lb)
    for k, item, c in ea:
        other = by_b.get(k)
        if other is None:
            m.only_in_a.append(item)
        elif other[1] == c:
            m.equal += 1
        else:
            m.differ.append((item, other[0]))
    m.only_in_b = [item for k, item, _ in eb if k not in keys_a]
    return m


def _tensors(fa: Any, pa: str, fb: Any, pb: str, result: CompareResult, names: Sequence[str] | None) -> None:
    with fa.values(pa) as (sa, release_a), fb.values(pb) as (sb, release_b):
        by_b = {s.name: s for s in sb}
        names_a = {s.name for s in sa}
        if names is not None:
            unknown = [n for n in names if n not in names_a and n not in by_b]
            if unknown:
                raise UsageError(f"--tensor {unknown[0]!r}: no tensor of that name in {pa} or {pb}")
            sa = [s for s in sa if s.name in names]
            sb = [s for s in sb if s.name in names]
        result.only_in_a = [s.name for s in sa if s.name not in by_b]
        result.only_in_b = [s.name for s in sb if s.name not in names_a]

        def release() -> None:
            release_a()
            release_b()

        result.tensors = [compare_tensors(s, by_b[s.name], release) for s in sa if s.name in by_b]


def compare(a: str | os.PathLike[str], b: str | os.PathLike[str], *, tensors: Sequence[str] | None = None,
            jobs: int | None = None) -> CompareResult:
    """Compare two models of any formats (a GGUF shard stands for its whole split set):
    tensors matched by name -- types, shapes, max abs error, RMSE, NMSE (relative to B),
    cosine similarity and the first differing element --, tensors only in one, and metadata.
    ``tensors``: compare only these (the metadata still whole); ``jobs``: threads (default:
    up to two).  Bad input raises the project's errors (the CLI: one line, exit 2)."""
    check_jobs(jobs, "--jobs")
    pa, pb = os.fspath(a), os.fspath(b)
    fa, fb = detect_format(pa), detect_format(pb)
    for f, p in ((fa, pa), (fb, pb)):
        if f.values is None or f.metadata is None:
            raise UsageError(f"{p}: compare cannot read {f.title} models")
    result = CompareResult(pa, pb, fa.name, fb.name)
    result.metadata = _metadata(fa, pa, fb, pb)
    with use_jobs(jobs):
        _tensors(fa, pa, fb, pb, result, tensors)
    return result


def to_json_text(result: CompareResult, *, full: bool = False) -> str:
    return json.dumps(result.to_json(full=full), indent=2, allow_nan=False) + "\n"
