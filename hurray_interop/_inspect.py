"""The entry point of ``inspect``: :func:`inspect_file` (the format's record does the work), and
the layout of its plain data as text (:func:`render_text`) or Markdown (:func:`render_markdown`)."""

from __future__ import annotations

import json
import os
from typing import Any

from .registry import detect_format

__all__ = ["inspect_file", "json_safe", "render_text", "render_markdown", "summary_text", "terminal_safe", "value_text"]


def inspect_file(path: str | os.PathLike[str], *, fallback: str | None = None, **shown: Any) -> dict[str, Any]:
    """Describe a .hrry, .gguf or .safetensors file (format confirmed by magic bytes).
    ``fallback``: the conversion plan shown is the one ``convert --fallback`` would follow.
    ``shown``: ``max_items=N`` -- metadata arrays show their first N items (default
    :data:`hurray_interop.inspection.MAX_ITEMS`; ``None``: all) and, always, their ``count``."""
    p = os.fspath(path)
    fmt = detect_format(p)
    return json_safe(fmt.inspect(p, fallback=fallback, **shown) if fallback else fmt.inspect(p, **shown))


#: the strings that stand for the floats strict JSON has no number for
_NON_FINITE = {float("inf"): "inf", float("-inf"): "-inf"}


def json_safe(data: Any) -> Any:
    """``data`` (inspect's plain data) with every non-finite float as a string -- ``"inf"``,
    ``"-inf"``, ``"nan"`` -- so that strict JSON (``json.dumps(..., allow_nan=False)``, jq)
    carries it; the entry's ``type`` (``FLOAT32``, ``ARRAY[FLOAT64]`` ...) still says it is a
    float, and ``float(value)`` reads every such value back (a NaN's payload is not shown)."""
    if isinstance(data, float):
        return "nan" if data != data else _NON_FINITE.get(data, data)
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        if all(type(x) is str or type(x) is int for x in data):  # a vocabulary: nothing to change
            return data
        return type(data)(json_safe(x) for x in data)
    return data


# ---------------------------------------------------------------------------
# rendering: inspect's plain data as text or Markdown (the CLI prints what these return)

#: code points never written raw to a terminal: C0 controls but the newline, DEL, C1
#: controls, line/paragraph separators, bidirectional overrides and isolates, lone surrogates
_UNSAFE = "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"

#: columns whose text wraps (within their own column) on a narrow terminal
_WRAPPING = ("hurray_mapping", "reason", "quantization", "layout")
_MIN_WRAP = 16  # a wrapping column is never made narrower


def terminal_safe(text: str) -> str:
    """``text`` with every code point of :data:`_UNSAFE` written as a ``\\uXXXX`` escape: safe on
    a terminal, and still valid JSON when ``text`` is JSON (such code points occur in strings only)."""
    import re

    return re.sub(_UNSAFE, lambda m: f"\\u{ord(m.group()):04x}", text)


def _cell(v: Any) -> str:
    """One value as table text, never cut: a list of ints (a shape) as ``[a, b]``, a string as is."""
    if v is None:
        return ""
    if isinstance(v, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return "[" + ", ".join(map(str, v)) + "]"
    s = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
    return terminal_safe(s.replace("\n", "\\n"))


def _widths(rows: list[list[str]], cols: list[str], width: int | None) -> list[int]:
    """Column widths: natural, or -- when the table is wider than ``width`` -- the wrapping
    columns share what the others leave, each taking no more than it needs (the widest get
    the rest) and none less than :data:`_MIN_WRAP` or its longest word (words are never
    split: a table with such a word is wider than ``width``, its columns still aligned)."""
    w = [max(len(r[c]) for r in rows) for c in range(len(cols))]
    wrap = sorted((c for c, name in enumerate(cols) if name in _WRAPPING), key=lambda c: w[c])
    if not width or not wrap or sum(w) + 2 * (len(w) - 1) <= width:
        return w
    left = width - 2 * (len(w) - 1) - sum(w[c] for c in range(len(w)) if c not in wrap)
    for i, c in enumerate(wrap):
        word = max((len(x) for r in rows for x in r[c].split()), default=0)
        w[c] = max(_MIN_WRAP, word, min(w[c], left // (len(wrap) - i)))
        left -= w[c]
    return w


def _table(rows: list[list[str]], cols: list[str], width: int | None) -> list[str]:
    """Aligned columns; a cell wider than its column wraps onto continuation lines of its
    own column (one logical row per tensor, nothing cut)."""
    w = _widths(rows, cols, width)
    lines = []
    for r in rows:
        cells = [_wrap(cell, w[c]) for c, cell in enumerate(r)]
        for k in range(max(len(c) for c in cells)):
            parts = [(c[k] if k < len(c) else "").ljust(w[i]) for i, c in enumerate(cells)]
            lines.append("  ".join(parts).rstrip())
    return lines


def _wrap(text: str, width: int) -> list[str]:
    if len(text) <= width:
        return [text]
    import textwrap

    # words whole: never split inside a word, nor at its hyphens (per-block-affine is one term)
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]


def value_text(item: dict[str, Any], limit: int | None, top: bool = True) -> str:
    """A metadata value: a string as text (cut at ``limit`` characters unless ``None``), an
    array as its items shown and its count."""
    v = item["value"]
    if "count" not in item:
        s = _cell(v)
        return s if limit is None or len(s) <= limit else s[: limit - 1] + "…"
    if any(isinstance(x, dict) for x in v):  # an array of arrays
        items = [value_text(x, limit, False) for x in v]
    elif str(item.get("type", "")).upper().startswith("ARRAY[FLOAT"):  # non-finite items as inf, -inf, nan
        items = [x if isinstance(x, str) else json.dumps(x) for x in v]
    else:  # one dump of the whole list: a --full vocabulary is 10^5 items
        items = [terminal_safe(json.dumps(v, ensure_ascii=False, default=str)[1:-1])] if v else []
    n = item["count"]
    if len(v) == n:
        return f"[{', '.join(items)}] ({_plural(n, 'item')})"
    more = f"{len(v)} of {n} items" + ("; --full or --max-items N shows more" if top else "")
    return f"[{', '.join(items + ['…'])}] ({more})"


def _plural(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def summary_text(info: dict[str, Any]) -> str:
    """The closing line: tensors, elements, bytes, the plan's counts and the ``--fallback exact`` hint."""
    s = info.get("summary") or {}
    parts = [_plural(s.get("tensors", info.get("tensor_count", 0)), "tensor")]
    if s.get("top_level", s.get("tensors")) != s.get("tensors"):
        parts[0] += f" ({s['top_level']:,} top-level)"
    if s.get("elements") is not None:
        parts.append(f"{s['elements']:,} elements")
    if "stored_bytes" in s:
        parts.append(f"{s['stored_bytes']:,} bytes stored")
    if "bytes_in" in s:
        parts.append(f"{s['bytes_in']:,} bytes of tensor data -> {s['bytes_out']:,} as Hurray")
    line = "summary: " + ", ".join(parts)
    if "counts" in s:
        line += "; plan: " + ", ".join(f"{n} {status}" for status, n in s["counts"].items())
    if s.get("hint"):
        line += f"; {s['hint']}"
    return terminal_safe(line)


def render_text(info: dict[str, Any], *, width: int | None = None, full: bool = False) -> str:
    """``inspect``'s text: header, shards, one row per tensor (wrapped on ``width`` columns,
    ``None``: never), metadata (strings cut at 100 characters unless ``full``), notes, summary."""
    lines = [terminal_safe(f"{info['path']}: {info['format']}" + "".join(
        f", {k.replace('_', ' ')} {info[k]}" for k in ("version", "alignment", "tensor_count", "file_size") if k in info))]
    split = info.get("split")
    if split:
        lines.append(terminal_safe(f"split GGUF set {split['prefix']!r}: {split['count']} shards, {split['tensors']} tensors"))
        rows = [["shard", "tensors", "bytes"]] + [[_cell(r["file"]), str(r["tensors"]), str(r["file_size"])]
                                                  for r in split["shards"]]
        lines += _table(rows, rows[0], None)
    tensors = info.get("tensors", [])
    if tensors:
        cols = info.get("tensor_columns") or list(tensors[0].keys())
        lines += _table([list(cols)] + [[_cell(t.get(c)) for c in cols] for t in tensors], cols, width)
    kv = info.get("metadata", [])
    if kv:
        lines.append(f"metadata ({_plural(len(kv), 'key')}):")
        limit = None if full else 100
        lines += [f"  {_cell(m['key'])} [{m['type']}] = {value_text(m, limit)}" for m in kv]
    lines += [terminal_safe(f"note: {n}") for n in info.get("notes", [])]
    lines.append(summary_text(info))
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    """A table cell's text for Markdown: pipes, code and emphasis marks escaped, HTML characters as entities."""
    for a, b in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("\\", "\\\\"), ("|", "\\|"), ("`", "\\`"), ("*", "\\*")):
        text = text.replace(a, b)
    return text


def _md_table(head: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    rule = ["---:" if c in right else ":---" for c in range(len(head))]
    return ["| " + " | ".join(r) + " |" for r in [[_md(h) for h in head], rule] + [[_md(c) for c in r] for r in rows]]


def render_markdown(info: dict[str, Any], *, full: bool = False) -> str:
    """``inspect`` as Markdown (as ``gguf-dump --markdown``): facts, metadata table, tensor table, summary."""
    out = [f"# {_md(_cell(info['path']))} - {info['format']}", ""]
    out += [f"- {k.replace('_', ' ')}: {info[k]}" for k in ("version", "alignment", "tensor_count", "file_size") if k in info]
    if info.get("split"):
        sp = info["split"]
        out += [f"- split set {_md(_cell(sp['prefix']))}: {sp['count']} shards, {sp['tensors']} tensors"]
    kv = info.get("metadata", [])
    limit = None if full else 100
    out += ["", f"## Metadata ({_plural(len(kv), 'key')})", ""]
    out += _md_table(["#", "key", "type", "count", "value"],
                     [[str(i), _cell(m["key"]), m["type"], str(m.get("count", 1)), value_text(m, limit)]
                      for i, m in enumerate(kv, 1)], {0, 3})
    tensors = info.get("tensors", [])
    cols = info.get("tensor_columns") or (list(tensors[0].keys()) if tensors else [])
    out += ["", f"## Tensors ({len(tensors)})", ""]
    numeric = {c for c, name in enumerate(cols) if name in ("elements", "bytes_in", "bytes_out", "stored_bytes")}
    out += _md_table(list(cols), [[_cell(t.get(c)) for c in cols] for t in tensors], numeric)
    out += [""] + [f"- note: {_md(terminal_safe(n))}" for n in info.get("notes", [])]
    out += ["", _md(summary_text(info))]
    return "\n".join(out) + "\n"
