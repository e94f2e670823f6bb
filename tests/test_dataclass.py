"""``hurray_interop.core.dataclass`` behaves as the standard library's ``dataclass``: the
same repr, equality and hash (or none), field by field options included -- the oracle is
the same class body decorated by ``dataclasses.dataclass``."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, ClassVar

import pytest
from hurray_interop.core import dataclass as D


def _twins(frozen: bool, eq: bool) -> tuple[type, type]:
    """One class body, decorated both ways."""

    def body(deco: Any) -> type:
        @deco(frozen=frozen, eq=eq)
        class Rec:
            """A record."""

            a: int
            b: str = "x"
            hidden: float = dataclasses.field(default=0.5, repr=False)
            loose: int = dataclasses.field(default=0, compare=False)
            keyed: int = dataclasses.field(default=1, compare=False, hash=True)
            items: tuple[Any, ...] = dataclasses.field(default_factory=tuple)
            kind: ClassVar[str] = "rec"

        return Rec

    return body(dataclasses.dataclass), body(D.dataclass)


CASES = [(1, "y", 0.25, 3, 4, (1, 2)), (1, "y", 0.75, 9, 4, (1, 2)), (2, "y", 0.25, 3, 4, ()), (1, "y", 0.25, 3, 5, (1, 2))]


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("eq", [False, True])
def test_repr_eq_hash_are_the_standard_librarys(frozen: bool, eq: bool) -> None:
    std, ours = _twins(frozen, eq)
    for a in CASES:
        x, y = std(*a), ours(*a)
        assert repr(y).replace(ours.__qualname__, std.__qualname__) == repr(x)
        for b in CASES:
            assert (ours(*a) == ours(*b)) == (std(*a) == std(*b))
            assert (ours(*a) != ours(*b)) == (std(*a) != std(*b))
        assert (std.__hash__ is None) == (ours.__hash__ is None)
        if std.__hash__ is not None and eq:
            assert hash(y) == hash(x)
    assert ours(*CASES[0]).__eq__(object()) is NotImplemented
    row = lambda f: (f.name, f.repr, f.compare, f.hash, f.default)  # noqa: E731
    assert [row(f) for f in dataclasses.fields(ours)] == [row(f) for f in dataclasses.fields(std)]
    assert ours.__dataclass_params__.frozen is frozen and ours.__dataclass_params__.eq is eq
    if frozen:
        with pytest.raises(dataclasses.FrozenInstanceError):
            ours(1).a = 2  # type: ignore[misc]


def test_a_recursive_repr_and_an_empty_class_and_a_subclass() -> None:
    @D.dataclass
    class Node:
        child: Any = None

    n = Node()
    n.child = n
    assert repr(n) == "test_a_recursive_repr_and_an_empty_class_and_a_subclass.<locals>.Node(child=...)"

    @D.dataclass(frozen=True)
    class Empty:
        pass

    assert Empty() == Empty() and hash(Empty()) == hash(()) and repr(Empty()).endswith("Empty()")

    @D.dataclass(frozen=True)
    class Base:
        a: int

    @D.dataclass(frozen=True)
    class Sub(Base):
        b: int = 0

    assert Sub(1, 2) != Sub(1, 3) and hash(Sub(1, 2)) == hash((1, 2)) and Base(1) != Sub(1, 0)
    assert repr(Sub(1, 2)).endswith("Sub(a=1, b=2)")


def test_methods_a_class_writes_itself_are_kept() -> None:
    @D.dataclass(frozen=True)
    class Own:
        a: int

        def __repr__(self) -> str:
            return "own"

        def __eq__(self, other: object) -> bool:
            return True

    # as the standard library does: its own repr and eq, and a generated hash (eq defined, frozen)
    assert repr(Own(1)) == "own" and Own(1) == Own(2) and hash(Own(3)) == hash((3,))


def test_the_package_classes_use_it() -> None:
    """The classes a GGUF inspect loads carry the shared methods (the reason for the module)."""
    from hurray_interop.core.model import Descriptor, RowMajor
    from hurray_interop.formats.gguf import GGMLType

    for cls in (Descriptor, RowMajor, GGMLType):
        assert cls.__repr__.__module__ == D.__name__ == sys.modules[D.__name__].__name__
    assert RowMajor() == RowMajor() and repr(RowMajor()) == "RowMajor()" and hash(RowMajor()) == hash(())
