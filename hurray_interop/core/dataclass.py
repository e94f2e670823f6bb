"""The standard library's ``dataclass``, with ``__repr__``, ``__eq__`` and ``__hash__`` shared.

``dataclasses.dataclass`` compiles every method it adds from source text when the class
is created (in Python 3.11 even those a class already has): ~0.1 ms per method here,
~5 ms of every command's start for the repr, eq and hash of the ~40 classes a GGUF
``inspect`` loads.  Those three do the same for every class, so they are written once
here (closed over each class's fields, as the generated ones are);
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


def _add_methods(cls: type, eq: bool, frozen: bool) -> None:
    """Put the shared methods on ``cls``, which ``dataclasses`` has processed."""
    fields = dataclasses.fields(cls)
    shown = tuple(f.name for f in fields if f.repr)
    compared = _getter([f.name for f in fields if f.compare])
    hashed = _getter([f.name for f in fields if (f.compare if f.hash is None else f.hash)])

    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        return self.__class__.__qualname__ + "(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in shown) + ")"

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return compared(self) == compared(other)
        return NotImplemented

    def __hash__(self: Any) -> int:
        return hash(hashed(self))

    methods: dict[str, Any] = {"__repr__": __repr__}
    if eq:
        methods["__eq__"] = __eq__
        methods["__hash__"] = __hash__ if frozen else None
    for name, fn in methods.items():
        if fn is not None:
            fn.__qualname__ = f"{cls.__qualname__}.{name}"
        setattr(cls, name, fn)


def dataclass(cls: C | None = None, /, *, frozen: bool = False, eq: bool = True) -> Any:
    """``dataclasses.dataclass(cls, frozen=frozen, eq=eq)``, with the shared methods (a class
    that writes its own ``__repr__``, ``__eq__`` or ``__hash__`` gets the standard ones)."""

    def wrap(cls: C) -> C:
        if {"__repr__", "__eq__", "__hash__"} & set(cls.__dict__):
            return dataclasses.dataclass(cls, frozen=frozen, eq=eq)  # type: ignore[no-any-return]
        # repr=False, eq=False: dataclasses compiles neither (in 3.11 it builds the methods it
        # would add even for a class that has them) and leaves __hash__ alone
        done = dataclasses.dataclass(cls, frozen=frozen, eq=False, repr=False)
        params = done.__dataclass_params__  # type: ignore[attr-defined]
        params.repr, params.eq = True, eq  # what the class is: as dataclass(frozen=frozen, eq=eq) says
        _add_methods(done, eq, frozen)
        return done

    return wrap if cls is None else wrap(cls)
