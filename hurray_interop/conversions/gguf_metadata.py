"""GGUF metadata in a safetensors ``__metadata__`` map, every key with its exact GGUF type
(docs/format-notes.md § 3.11).

safetensors metadata maps strings to strings.  Each GGUF key ``K`` is one entry
``gguf.K``, in GGUF key order, whose string is a JSON object:

* ``{"type": T, "value": V}``: ``T`` the GGUF type as the .hrry's ``kv_types`` record
  spells it (``UINT32``, ``FLOAT32``, ``STRING``, ``ARRAY[INT32]``, ``ARRAY[STRING]`` ...),
  ``V`` the value in JSON: integers, numbers (a FLOAT32 as the float64 that equals it,
  which reads back to the same float32), ``true``/``false``, UTF-8 strings, arrays of those;
* ``{"type": T, "gguf": B}`` for a value JSON cannot hold exactly -- a string that is not
  UTF-8, a NaN or infinite float, a BOOL byte other than 0/1, an array of arrays --: ``B``
  is the base64 of the value's GGUF encoding (without its type tag).

:func:`encode` writes the entries, :func:`decode` reads them back (an entry under the
prefix that is not of this form is returned as a problem, not guessed at).  Only the
GGUF container (:mod:`hurray_interop.formats.gguf`) is used: the values are its
:class:`~hurray_interop.formats.gguf.GGUFValue`.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any, Iterable, Mapping

import numpy as np

from ..errors import HurrayInteropError
from ..formats import gguf as G

__all__ = ["PREFIX", "FORMAT", "FORMAT_PT", "SAFETENSORS_METADATA", "encode", "decode", "unwritten_note"]

#: the prefix of the ``__metadata__`` entries that hold GGUF keys
PREFIX = "gguf."
#: the .hrry record in which a safetensors import keeps the source's ``__metadata__`` (a JSON
#: object; ``KV_METADATA`` of :mod:`.safetensors`)
SAFETENSORS_METADATA = "hurray_interop.safetensors.metadata"

#: the ``__metadata__`` entry naming the framework of a checkpoint; a safetensors export
#: of GGUF metadata writes ``"format": "pt"`` (as ``safetensors.torch.save_file`` does), which
#: loaders such as HF transformers require when ``__metadata__`` is present
FORMAT = "format"
FORMAT_PT = "pt"

VT = G.ValueType
_INTS = {VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32, VT.UINT64, VT.INT64}
_FLOATS = {VT.FLOAT32, VT.FLOAT64}


def _type_string(v: G.GGUFValue) -> str:
    if v.type == VT.ARRAY:
        return f"ARRAY[{v.element_type.name}]" if v.element_type is not None else "ARRAY"
    return v.type.name


def _json_items(et: G.ValueType, value: Any) -> list[Any] | None:
    """An array's items as JSON values, or None when JSON cannot hold them exactly."""
    if et == VT.ARRAY:
        return None
    if et == VT.STRING:
        try:
            return value.decode("strict")  # type: ignore[no-any-return]
        except UnicodeDecodeError:
            return None
    arr = np.asarray(value)
    if et == VT.BOOL:
        return [bool(x) for x in arr.tolist()] if not arr.size or int(arr.max()) <= 1 else None
    if et in _FLOATS and not np.isfinite(arr).all():
        return None
    return arr.tolist()  # type: ignore[no-any-return]


def _json_value(v: G.GGUFValue) -> tuple[bool, Any]:
    """``(True, the value as JSON)``, or ``(False, None)`` when JSON cannot hold it exactly."""
    if v.type == VT.ARRAY:
        items = _json_items(v.element_type, v.value)  # type: ignore[arg-type]
        return (items is not None, items)
    if v.type == VT.STRING:
        try:
            return (True, bytes(v.value).decode("utf-8"))
        except UnicodeDecodeError:
            return (False, None)
    if v.type == VT.BOOL:
        return (int(v.value) in (0, 1), bool(int(v.value)))
    x = v.value.item()
    return (not (v.type in _FLOATS and not math.isfinite(x)), x)


#: the type of a tokenizer vocabulary: given (and returned) as a list of ``str``, not
#: through :class:`~hurray_interop.formats.gguf.StringArray`, so that 262,144 tokens cost
#: one JSON array and nothing else
STRINGS = "ARRAY[STRING]"


def encode(items: Iterable[tuple[str, "G.GGUFValue | list[str]"]]) -> dict[str, str]:
    """The ``__metadata__`` entries of GGUF metadata (see the module doc), in order; a
    value given as a list of ``str`` is an ARRAY[STRING] of those strings."""
    out: dict[str, str] = {}
    for key, v in items:
        if isinstance(v, list):
            out[PREFIX + key] = json.dumps({"type": STRINGS, "value": v}, separators=(",", ":"), ensure_ascii=False)
            continue
        ok, value = _json_value(v)
        rec: dict[str, Any] = {"type": _type_string(v)}
        if ok:
            rec["value"] = value
        else:
            rec["gguf"] = base64.b64encode(G.encode_value(v)).decode("ascii")
        out[PREFIX + key] = json.dumps(rec, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return out


def _parse_type(t: Any) -> tuple[G.ValueType, G.ValueType | None]:
    if not isinstance(t, str):
        raise ValueError("no type")
    if t.startswith("ARRAY[") and t.endswith("]"):
        return VT.ARRAY, VT[t[6:-1]]
    if t == "ARRAY":
        raise ValueError("ARRAY without an element type")
    return VT[t], None


def _scalar_ok(vt: G.ValueType, x: Any) -> bool:
    """Is the JSON value ``x`` exactly a value of the GGUF type ``vt``?"""
    if vt in _INTS:
        return isinstance(x, int) and not isinstance(x, bool)
    if vt in _FLOATS:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            return False
        return vt == VT.FLOAT64 or float(np.float32(x)) == x
    if vt == VT.BOOL:
        return isinstance(x, bool)
    if vt == VT.STRING:
        return isinstance(x, str)
    return False


def _items_ok(et: G.ValueType, x: list[Any]) -> bool:
    """:func:`_scalar_ok` for every item of a JSON array (numbers checked with numpy)."""
    if et in _INTS:
        return all(type(i) is int for i in x)  # not bool, not float
    if et in _FLOATS:
        if not all(type(i) in (int, float) for i in x):
            return False
        a = np.array(x, dtype=np.float64)
        return bool(np.isfinite(a).all()) and (et == VT.FLOAT64 or np.array_equal(a.astype(np.float32), a))
    return all(_scalar_ok(et, i) for i in x)


def _from_json(vt: G.ValueType, et: G.ValueType | None, x: Any) -> G.GGUFValue:
    if vt == VT.ARRAY:
        assert et is not None
        if et == VT.ARRAY or not isinstance(x, list) or not _items_ok(et, x):
            raise ValueError(f"value is not a JSON array of {et.name}")
        if et in _FLOATS:
            x = np.array(x, dtype=np.float64)
        return G.GGUFValue.of(vt, x, et)
    if not _scalar_ok(vt, x):
        raise ValueError(f"value is not a {vt.name}")
    return G.GGUFValue.of(vt, float(x) if vt in _FLOATS else x)


def _entry(key: str, text: str, path: Any) -> "G.GGUFValue | list[str]":
    rec = json.loads(text)
    if not isinstance(rec, dict) or set(rec) not in ({"type", "value"}, {"type", "gguf"}):
        raise ValueError('not a JSON object {"type", "value"} or {"type", "gguf"}')
    vt, et = _parse_type(rec["type"])
    if rec["type"] == STRINGS and isinstance(rec.get("value"), list):
        if not all(type(x) is str for x in rec["value"]) or not _is_unicode("".join(rec["value"])):
            raise ValueError("value is not a JSON array of STRING")
        return rec["value"]  # type: ignore[no-any-return]
    if "value" in rec:
        v = _from_json(vt, et, rec["value"])
    else:
        if not isinstance(rec["gguf"], str):
            raise ValueError('"gguf" is not a base64 string')
        v = G.decode_value(vt, base64.b64decode(rec["gguf"], validate=True), what=PREFIX + key, path=path)
        if v.element_type != et:
            raise ValueError(f"the encoded value is {_type_string(v)}, not {rec['type']}")
    return v


def _is_unicode(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape
        return False
    return True


def decode(metadata: Mapping[str, str], path: Any = None) -> tuple[list[tuple[str, "G.GGUFValue | list[str]"]], list[tuple[str, str]]]:
    """The GGUF keys the ``gguf.*`` entries of ``metadata`` hold, in order (an ARRAY[STRING]
    given as JSON as a list of ``str``, see :data:`STRINGS`), and ``(entry name, why)`` for
    each entry under the prefix that does not hold one (not among the keys), which the
    caller reports."""
    items: list[tuple[str, G.GGUFValue | list[str]]] = []
    problems: list[tuple[str, str]] = []
    for name, text in metadata.items():
        if not name.startswith(PREFIX):
            continue
        key = name[len(PREFIX):]
        try:
            if not key:
                raise ValueError("empty GGUF key")
            items.append((key, _entry(key, text, path)))
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError, HurrayInteropError) as e:
            why = getattr(e, "message", None) or (f"unknown type {e}" if isinstance(e, KeyError) else str(e))
            problems.append((name, why))
    return items, problems


def unwritten_note(kv: Mapping[str, Any]) -> list[str]:
    """For a GGUF export of a .hrry made from safetensors: a note naming the recorded
    ``__metadata__`` entries that hold no GGUF key, which GGUF has no place for; empty when
    there are none.  ``format`` (:data:`FORMAT`: the framework tag every safetensors writer
    adds, and a safetensors export writes) is not named."""
    v = kv.get(SAFETENSORS_METADATA)
    try:
        md = json.loads(v.value) if v is not None and v.type == "string" else {}
    except (ValueError, RecursionError):
        md = {}  # a corrupt record is the safetensors export's error to report
    other = [k for k in md if not k.startswith(PREFIX) and k != FORMAT] if isinstance(md, dict) else []
    if not other:
        return []
    return [f"{len(other)} safetensors __metadata__ entr{'y' if len(other) == 1 else 'ies'} without a GGUF key not "
            f"written: {', '.join(other[:5])}" + (" …" if len(other) > 5 else "")]
