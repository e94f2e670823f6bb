"""Each format's model metadata as ``compare`` compares it: ``(key, item, comparable)`` per
key, the item as ``inspect`` shows it (whole: every array item), ``comparable`` the value
with its exact type (two keys are equal when their comparables are), and the keys left out.

Left out: the container's own keys, which describe how a file stores the model, not the
model -- GGUF's ``split.*`` (a split set reads as one model) and ``general.alignment``, and
the tool's ``hurray_interop.*`` records of a .hrry.  A .hrry imported from GGUF shows its GGUF
keys with their recorded GGUF types (``hurray_interop.gguf.kv_types``), so it compares equal
to its source, and one imported from safetensors the ``__metadata__`` it recorded
(``hurray_interop.safetensors.metadata``); other .hrry keys compare as Hurray KV values, safetensors ``__metadata__`` as
strings (a key of another kind of value is a type difference)."""

from __future__ import annotations

from typing import Any

from .common import _kv_item, safe_text
from .gguf import _gguf_value

__all__ = ["gguf_metadata", "hurray_metadata", "safetensors_metadata", "CONTAINER_KEYS"]

#: keys of the container, never compared (a key equal to one, or under one that ends in ".")
CONTAINER_KEYS = ("split.", "general.alignment", "hurray_interop.")

Metadata = tuple[list[tuple[str, dict[str, Any], Any]], list[str]]


def _container(key: str) -> bool:
    return any(key.startswith(k) if k.endswith(".") else key == k for k in CONTAINER_KEYS)


def _gguf_items(pairs: Any) -> Metadata:
    kept, left = [], []
    for k, v in pairs:
        if _container(k):
            left.append(k)
        else:
            kept.append((safe_text(k), _gguf_value(safe_text(k), v, None), ("gguf", v)))
    return kept, left


def gguf_metadata(path: str) -> Metadata:
    """A GGUF model's keys (of a split set: the set's, without ``split.*``)."""
    from ..formats.gguf_split import open_model

    with open_model(path) as m:
        return _gguf_items(list(m.kv.items()))


def hurray_metadata(path: str) -> Metadata:
    """A .hrry's keys: its GGUF keys with their recorded types where it has the record."""
    from ..conversions.gguf import gguf_metadata_records, gguf_value
    from ..core.hrry import HrryFile

    with HrryFile(path) as hf:
        kv = hf.kv
        recorded = _safetensors_record(kv, path)
        if recorded is not None:
            return _string_items(recorded), list(kv)
        records = gguf_metadata_records(kv, path)
        if records is not None:
            kept, left = _gguf_items([(k, gguf_value(k, v, ts, path)) for k, ts, v in records])
            return kept, left + [k for k in kv if k.startswith("hurray_interop.")]
        kept, left = [], []
        for k, v in kv.items():
            if _container(k):
                left.append(k)
            else:
                kept.append((safe_text(k), _kv_item(safe_text(k), v, None), ("kv", v)))
        return kept, left


#: the record of a .hrry imported from safetensors that holds the source's ``__metadata__``
ST_METADATA = "hurray_interop.safetensors.metadata"


def _safetensors_record(kv: dict[str, Any], path: str) -> dict[str, str] | None:
    """The source ``__metadata__`` a .hrry imported from safetensors recorded (None: none)."""
    import json

    from ..errors import FormatError

    v = kv.get(ST_METADATA)
    if v is None:
        return None
    try:
        got = json.loads(v.value) if v.type == "string" else None
    except ValueError:
        got = None
    if not isinstance(got, dict) or not all(isinstance(x, str) for x in got.values()):
        raise FormatError("is not a JSON object of strings", path=path, field=ST_METADATA)
    return got


def _string_items(metadata: dict[str, str]) -> list[tuple[str, dict[str, Any], Any]]:
    return [(safe_text(k), {"key": safe_text(k), "type": "string", "value": safe_text(v)}, ("string", v))
            for k, v in metadata.items()]


def safetensors_metadata(path: str) -> Metadata:
    """A safetensors file's ``__metadata__`` (strings)."""
    from ..formats.safetensors import SafetensorsFile

    with SafetensorsFile(path) as st:
        return _string_items(st.metadata or {}), []
