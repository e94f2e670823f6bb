"""The standard library's ``dataclass``, with ``__repr__``, ``__eq__`` and ``__hash__`` shared.

``dataclasses.dataclass`` compiles every method it adds from source text when the class
is created (in Python 3.11 even those a class already has): ~0.1 ms per method here,
~5 ms of every command's start for the repr, eq and hash of the ~40 classes a GGUF
``inspect`` loads.  Those three do the same for every class, so they are written once
here (closed over each class's fields, as the generated ones are) and put on the class;
``dataclasses.dataclass`` then runs with ``repr=False, eq=False`` and generates the rest:
``__init__`` and a frozen class's ``__setattr__``/``__delattr__``.  The behaviour is the
generated methods': ``Cls(a=1, b='x')`` of the fields with ``repr=True`` (``...`` for a
recursive one), equality of the field tuples (``compare=True``) of two instances of the
same class (else ``NotImplemented``), the hash of the field tuple (``hash``, else
``compare``) for a frozen class, ``__hash__ = None`` for an unfrozen one, and
``__dataclass_params__`` as ``dataclass(frozen=frozen, eq=eq)`` sets it;
``tests/test_dataclass.py`` compares them with the standard library's.
"""

from __future__ import annotations

import dataclasses
import operator
import reprlib
from typing import Any, Callable, TypeVar

__all__ = ["dataclass"]

C = TypeVar("C", bound=type)


def _getter(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """``self -> (self.a, self.b, ...)``."""
    if not names:
        return lambda self: ()
    get = operator.attrgetter(*names)
    return get if len(names) > 1 else (lambda self: (get(self),))


def _methods(cls: type, fields: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """The shared methods of ``cls``; ``fields`` is filled once ``dataclasses`` has processed it."""

    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        return self.__class__.__qualname__ + "(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in fields["repr"]) + ")"

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            get = fields["compare"]
            return get(self) == get(other)
        return NotImplemented

    def __hash__(self: Any) -> int:
        return hash(fields["hash"](self))

    out = {"__repr__": __repr__, "__eq__": __eq__, "__hash__": __hash__}
    for name, fn in out.items():
        fn.__qualname__ = f"{cls.__qualname__}.{name}"
    return out


def dataclass(cls: C | None = None, /, *, frozen: bool = False, eq: bool = True) -> Any:
    """``dataclasses.dataclass(cls, frozen=frozen, eq=eq)``, with the shared methods (a class
    that writes its own ``__repr__``, ``__eq__`` or ``__hash__`` gets the standard one)."""

    def wrap(cls: C) -> C:
        if {"__repr__", "__eq__", "__hash__"} & set(cls.__dict__):
            return dataclasses.dataclass(cls, frozen=frozen, eq=eq)  # type: ignore[no-any-return]
        fields: dict[str, Any] = {}
        methods = _methods(cls, fields)
        cls.__repr__ = methods["__repr__"]  # type: ignore[assignment]
        if eq:
            cls.__eq__ = methods["__eq__"]  # type: ignore[assignment]
            cls.__hash__ = methods["__hash__"] if frozen else None  # type: ignore[assignment]
        # repr=False, eq=False: dataclasses compiles neither (it builds the methods it would
        # add even when the class has them); an explicit __hash__ (or None) is kept
        done = dataclasses.dataclass(cls, frozen=frozen, eq=False, repr=False)
        params = done.__dataclass_params__  # type: ignore[attr-defined]
        params.repr, params.eq = True, eq  # what the class is: as dataclass(frozen=frozen, eq=eq) says
        all_fields = dataclasses.fields(done)
        fields["repr"] = tuple(f.name for f in all_fields if f.repr)
        fields["compare"] = _getter([f.name for f in all_fields if f.compare])
        fields["hash"] = _getter([f.name for f in all_fields if (f.compare if f.hash is None else f.hash)])
        return done

    return wrap if cls is None else wrap(cls)
