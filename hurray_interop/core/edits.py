"""Metadata edits, for any container: parsed and checked once, applied to an ordered list of keys.

``edit`` (docs/commands.md) takes ``--set KEY[:TYPE]=VALUE``, ``--set-file KEY[:TYPE]=PATH``,
``--delete KEY`` and ``--rename OLD=NEW``.  This module turns them into :class:`Edit`
records (:func:`parse_edits`: a bad spelling, a key edited twice -> :class:`UsageError`), and
applies them to a container's metadata in file order (:func:`apply_edits`): a set of an
existing key replaces it where it stands, a new key is appended, a rename keeps the place.
What a value *is* belongs to the container: a :class:`Codec` names its types
(:class:`ValueKind`), infers one for a value given without a type, builds its own value
objects, shows them, and names the keys the container owns (refused with the reason).

Values given as text are read the way GGUF's Python tools type them
(gguf-py ``GGUFValueType.get_type``): ``true``/``false`` -> bool, an integer -> integer,
a number with a point or exponent -> float, ``[...]`` -> a JSON array, anything else a
string.  An explicit type reads the text as that type (``STRING`` takes it verbatim).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from ..errors import UsageError
from ..files.atomic import AtomicOutput, check_output_path

__all__ = ["Edit", "ValueKind", "Codec", "Change", "Entry", "EditResult", "parse_edits", "apply_edits",
           "build_value", "int_kinds"]

SET, SET_FILE, DELETE, RENAME = "set", "set-file", "delete", "rename"

_INT = re.compile(r"[+-]?[0-9]+\Z")
_FLOAT = re.compile(r"[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?\Z")
_SPECIAL_FLOATS = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan}
_FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class Edit:
    """One edit as given: ``op`` (set, set-file, delete, rename), the key, the TYPE as written
    (None: inferred), the value's text (set; a file's text for set-file), the new key
    (rename), and the flag as given (for messages)."""

    op: str
    key: str
    type: str | None = None
    text: str | None = None
    new_key: str | None = None
    flag: str = ""


@dataclass(frozen=True)
class ValueKind:
    """A container's value type: its spelling, what Python values it holds (``int``,
    ``float``, ``bool``, ``string``, ``bytes``), an integer type's range, a float's width."""

    name: str
    kind: str
    lo: int = 0
    hi: int = 0
    bits: int = 64


def int_kinds(names_bits: Sequence[tuple[str, int, bool]]) -> list[ValueKind]:
    """Integer kinds from ``(name, bits, signed)``."""
    return [ValueKind(n, "int", -(1 << (b - 1)) if s else 0, (1 << (b - 1)) - 1 if s else (1 << b) - 1)
            for n, b, s in names_bits]


class Codec(Protocol):
    """What a container gives the generic edit (see the module docstring)."""

    #: the value types by upper-case spelling
    kinds: dict[str, ValueKind]
    #: every value is a string (safetensors ``__metadata__``): text taken verbatim, no arrays
    strings_only: bool

    def owned(self, key: str) -> str | None: ...  # why the container owns the key, or None
    def infer(self, value: Any) -> ValueKind: ...  # the kind of a bool/int/float/str given untyped
    def kind_of(self, value: Any) -> tuple[ValueKind, bool] | None: ...  # (kind, is array) of a value
    def make(self, kind: ValueKind, value: Any, array: bool) -> Any: ...
    def show(self, value: Any) -> str: ...
    def same(self, a: Any, b: Any) -> bool: ...


@dataclass(frozen=True)
class Change:
    """What an edit did: ``op`` is ``set`` (replaced), ``add``, ``delete``, ``rename`` or
    ``unchanged`` (set to what it was); ``old``/``new`` the values as shown."""

    op: str
    key: str
    old: str | None = None
    new: str | None = None
    new_key: str | None = None

    def line(self) -> str:
        if self.op == "add":
            return f"add     {self.key} = {self.new}"
        if self.op == "delete":
            return f"delete  {self.key} (was {self.old})"
        if self.op == "rename":
            return f"rename  {self.key} -> {self.new_key}"
        if self.op == "unchanged":
            return f"same    {self.key} = {self.old}"
        return f"set     {self.key}: {self.old} -> {self.new}"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass(frozen=True)
class Entry:
    """One key of the edited metadata: its value, and ``source``, the index of the original
    entry whose value it still is (None: a new value) -- so a writer can keep its bytes."""

    key: str
    value: Any
    source: int | None


@dataclass(frozen=True)
class EditResult:
    """What :func:`hurray_interop.edit` did (or, with ``dry_run``, would do)."""

    source: str
    format: str
    outputs: tuple[str, ...]
    changes: tuple[Change, ...]
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "format": self.format, "outputs": list(self.outputs),
                "dry_run": self.dry_run, "changes": [c.to_dict() for c in self.changes]}


# -- parsing --------------------------------------------------------------------------


def _split_key(left: str, flag: str) -> tuple[str, str | None]:
    key, colon, typ = left.rpartition(":")
    if not colon:
        key, typ = left, None
    elif not typ:
        raise UsageError(f"{flag}: empty TYPE after ':'")
    if not key:
        raise UsageError(f"{flag}: empty KEY")
    return key, typ


def _parse_set(spec: str, op: str) -> Edit:
    flag = f"--{op} {spec}"
    left, eq, text = spec.partition("=")
    if not eq:
        raise UsageError(f"{flag}: expected KEY=VALUE or KEY:TYPE=VALUE")
    key, typ = _split_key(left, flag)
    if op == SET_FILE:
        text = _read_text(text, flag)
    return Edit(op, key, typ, text, flag=flag)


def _read_text(path: str, flag: str) -> str:
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as e:
        raise UsageError(f"{flag}: cannot read {path!r}: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{flag}: {path!r} is not UTF-8 text (byte at offset {e.start})") from None


def _parse_rename(spec: str) -> Edit:
    old, eq, new = spec.partition("=")
    if not eq or not old or not new:
        raise UsageError(f"--rename {spec}: expected OLD=NEW")
    return Edit(RENAME, old, new_key=new, flag=f"--rename {spec}")


def parse_edits(set: Sequence[str] = (), set_file: Sequence[str] = (), delete: Sequence[str] = (),  # noqa: A002
                rename: Sequence[str] = ()) -> list[Edit]:
    """The edits, in the order set, set-file, delete, rename; a key named by two edits
    (a rename names two) is refused."""
    for given, what in ((set, "set"), (set_file, "set_file"), (delete, "delete"), (rename, "rename")):
        if isinstance(given, str):
            raise UsageError(f"{what}: give a list of strings, not one string")
    edits = [_parse_set(s, SET) for s in set] + [_parse_set(s, SET_FILE) for s in set_file]
    for k in delete:
        if not k:
            raise UsageError("--delete: empty KEY")
        edits.append(Edit(DELETE, k, flag=f"--delete {k}"))
    edits += [_parse_rename(s) for s in rename]
    seen: dict[str, Edit] = {}
    for e in edits:
        for k in (e.key, e.new_key):
            if k is None:
                continue
            if k in seen:
                raise UsageError(f"{e.flag}: key {k!r} is edited twice (also by {seen[k].flag})")
            seen[k] = e
    return edits


# -- values -------------------------------------------------------------------------------


def _literal(text: str, flag: str) -> Any:
    """A value's text read as GGUF's tools type it (the module docstring)."""
    if text in ("true", "false"):
        return text == "true"
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if text.startswith("["):
        return _json_array(text, flag)
    return text


def _json_array(text: str, flag: str) -> list[Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise UsageError(f"{flag}: not a JSON array ({e.msg} at offset {e.pos}); KEY:STRING=... sets text") from None
    if not isinstance(value, list):
        raise UsageError(f"{flag}: expected a JSON array, got {type(value).__name__}")
    for i, v in enumerate(value):
        if isinstance(v, (list, dict)) or v is None:
            raise UsageError(f"{flag}: element {i} is {json.dumps(v)[:20]}: arrays hold strings, numbers or booleans")
    return value


def _element_kind(values: list[Any]) -> str:
    """``bool``, ``int``, ``float`` or ``string``: what every element of a JSON array is
    (integers among floats make a float array: JSON has one number type)."""
    kinds = {"bool" if isinstance(v, bool) else "int" if isinstance(v, int) else
             "float" if isinstance(v, float) else "string" for v in values}
    if kinds == {"int", "float"}:
        return "float"
    if len(kinds) != 1:
        raise UsageError(f"an array of one type is needed, found {' and '.join(sorted(kinds))} elements")
    return kinds.pop()


def _coerce(kind: ValueKind, v: Any, where: str) -> Any:
    """``v`` (a Python scalar) as a value of ``kind``; :class:`UsageError` when it is not one."""
    k = kind.kind
    if k in ("string", "bytes"):
        if not isinstance(v, str):
            raise UsageError(f"{where}{json.dumps(v)} is not a string ({kind.name})")
        return v if k == "string" else v.encode("utf-8")
    if k == "bool":
        if not isinstance(v, bool):
            raise UsageError(f"{where}{v!r} is not true or false ({kind.name})")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (k == "int" and isinstance(v, float)):
        raise UsageError(f"{where}{v!r} is not {'an integer' if k == 'int' else 'a number'} ({kind.name})")
    if k == "int":
        if not kind.lo <= v <= kind.hi:
            raise UsageError(f"{where}{v} is out of the range of {kind.name} [{kind.lo}, {kind.hi}]")
        return v
    v = float(v)
    if kind.bits == 32 and math.isfinite(v) and abs(v) > _FLOAT32_MAX:
        raise UsageError(f"{where}{v!r} is out of the range of {kind.name}")
    return v


def _scalar_from_text(kind: ValueKind, text: str, flag: str) -> Any:
    if kind.kind in ("string", "bytes"):
        return _coerce(kind, text, f"{flag}: ")
    if kind.kind == "bool":
        if text not in ("true", "false"):
            raise UsageError(f"{flag}: {text!r} is not true or false ({kind.name})")
        return text == "true"
    if kind.kind == "float" and text.lower() in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[text.lower()]
    number = int(text) if _INT.match(text) else float(text) if _FLOAT.match(text) and kind.kind == "float" else None
    if number is None:
        raise UsageError(f"{flag}: {text!r} is not {'an integer' if kind.kind == 'int' else 'a number'} ({kind.name})")
    return _coerce(kind, number, f"{flag}: ")


def _type_spelling(codec: Codec, typ: str, flag: str) -> tuple[ValueKind, bool]:
    array = typ.startswith("[") and typ.endswith("]")
    name = typ[1:-1] if array else typ
    kind = codec.kinds.get(name.upper())
    if kind is None or (array and codec.strings_only):
        names = ", ".join(k.name for k in codec.kinds.values())
        arrays = "" if codec.strings_only else f" (arrays: [{next(iter(codec.kinds.values())).name}] ...)"
        raise UsageError(f"{flag}: unknown TYPE {typ!r} (one of {names}{arrays})")
    return kind, array


def _typed(codec: Codec, kind: ValueKind, array: bool, text: str, flag: str) -> Any:
    if not array:
        return codec.make(kind, _scalar_from_text(kind, text, flag), False)
    values = _json_array(text, flag)
    return codec.make(kind, [_coerce(kind, v, f"{flag}: element {i}: ") for i, v in enumerate(values)], True)


def _kept_type(codec: Codec, old: Any, lit: Any, text: str, flag: str) -> Any | None:
    """The new value in the existing value's type, when it fits it (else None)."""
    found = codec.kind_of(old)
    if found is None or found[1] != isinstance(lit, list):
        return None
    kind, array = found
    try:
        if array:
            return codec.make(kind, [_coerce(kind, v, "") for v in lit], True)
        return codec.make(kind, text if kind.kind == "string" else _scalar_from_text(kind, text, flag), False)
    except UsageError:
        return None


def _inferred(codec: Codec, lit: Any, flag: str) -> Any:
    if not isinstance(lit, list):
        return codec.make(codec.infer(lit), lit, False)
    if not lit:
        raise UsageError(f"{flag}: an empty array needs its element type (KEY:[TYPE]=[])")
    try:
        ek = _element_kind(lit)
    except UsageError as e:
        raise UsageError(f"{flag}: {e.message}") from None
    sample = {"bool": True, "string": "", "float": 0.0}.get(ek)
    kind = codec.infer(sample) if sample is not None else _widest_int(codec, lit)
    return codec.make(kind, [_coerce(kind, v, f"{flag}: ") for v in lit], True)


def _widest_int(codec: Codec, values: list[int]) -> ValueKind:
    lo, hi = min(values), max(values)
    a, b = codec.infer(lo), codec.infer(hi)
    return a if a.lo <= hi <= a.hi else b


def build_value(codec: Codec, e: Edit, old: Any | None) -> Any:
    """The value a set (or set-file) edit gives, as the module docstring reads it."""
    text = e.text or ""
    if e.type is not None:
        kind, array = _type_spelling(codec, e.type, e.flag)
        return _typed(codec, kind, array, text, e.flag)
    if codec.strings_only or e.op == SET_FILE:
        return codec.make(codec.infer(""), text, False)
    found = codec.kind_of(old) if old is not None else None
    if found is not None and found == (codec.infer(""), False):  # a string key stays one: any text fits
        return codec.make(found[0], text, False)
    lit = _literal(text, e.flag)
    if old is not None:
        kept = _kept_type(codec, old, lit, text, e.flag)
        if kept is not None:
            return kept
    return _inferred(codec, lit, e.flag)


# -- applying -------------------------------------------------------------------------


def _refuse_owned(codec: Codec, e: Edit) -> None:
    for k in (e.key, e.new_key):
        reason = codec.owned(k) if k is not None else None
        if reason is not None:
            raise UsageError(f"{e.flag}: {k!r} is refused: {reason}")


def apply_edits(items: Sequence[tuple[str, Any]], edits: Sequence[Edit], codec: Codec,
                *, path: str | None = None) -> tuple[list[Entry], list[Change]]:
    """The metadata after ``edits`` (in file order; see the module docstring) and what changed."""
    entries = [Entry(k, v, i) for i, (k, v) in enumerate(items)]
    where = {k: i for i, (k, _) in enumerate(items)}
    changes: list[Change] = []
    for e in edits:
        _refuse_owned(codec, e)
        at = where.get(e.key)
        if e.op in (DELETE, RENAME) and at is None:
            raise UsageError(f"{e.flag}: no key {e.key!r}", path=path)
        if e.op == DELETE:
            changes.append(Change("delete", e.key, old=codec.show(entries[at].value)))
            entries[at] = Entry(e.key, None, -1)  # removed below
        elif e.op == RENAME:
            if e.new_key in where:
                raise UsageError(f"{e.flag}: key {e.new_key!r} exists already", path=path)
            entries[at] = Entry(e.new_key, entries[at].value, entries[at].source)
            changes.append(Change("rename", e.key, new_key=e.new_key))
        else:
            changes.append(_set(codec, e, entries, at, path))
    return [x for x in entries if x.source != -1], changes


def _set(codec: Codec, e: Edit, entries: list[Entry], at: int | None, path: str | None) -> Change:
    try:
        new = build_value(codec, e, entries[at].value if at is not None else None)
    except UsageError as err:
        raise err.located(path=path) from None
    if at is None:
        entries.append(Entry(e.key, new, None))
        return Change("add", e.key, new=codec.show(new))
    old = entries[at].value
    if codec.same(old, new):
        return Change("unchanged", e.key, old=codec.show(old))
    entries[at] = Entry(e.key, new, None)
    return Change("set", e.key, old=codec.show(old), new=codec.show(new))


def write_edited(src: str, dst: str | None, write: Callable[[AtomicOutput, int], None], *, force: bool = False,
                 dry_run: bool = False) -> str:
    """The one file an edit writes: ``write(out, src_fd)`` into an atomic output at ``dst``
    (None: in place, over ``src`` with its permission bits, renamed over it only when complete),
    ``src`` open read-only for the kernel's copies.  A dry run only checks the output path.
    Returns the path written (or that would be)."""
    target = src if dst is None else dst
    inputs = () if dst is None else (src,)
    if dry_run:
        check_output_path(target, force=force or dst is None, inputs=inputs)
        return target
    mode = os.stat(src).st_mode & 0o7777 if dst is None else None  # in place: the file's own
    with AtomicOutput(target, force=force or dst is None, inputs=inputs, mode=mode) as out:
        fd = os.open(src, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            write(out, fd)
        finally:
            os.close(fd)
        out.commit()
    return target
