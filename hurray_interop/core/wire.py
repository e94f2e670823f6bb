"""What the descriptor codec and its layout and scheme rules share: where an error points
(:class:`Ctx`), the range check of a wire field (:func:`check_int`), cached vector structs and
the look-up of a model object's rule (:func:`rule_by_class`).

:mod:`hurray_interop.core.descriptor` frames a descriptor; :mod:`~hurray_interop.core.layouts`
and :mod:`~hurray_interop.core.schemes` hold one class per layout and per scheme.
"""

from __future__ import annotations

import struct
from typing import Mapping, TypeVar

import numpy as np

from ..errors import FormatError, HurrayInteropError

__all__ = ["Ctx", "NONE_U32", "check_int", "vec", "pow2", "rule_by_class"]

R = TypeVar("R")

#: the "no buffer" / SYMMETRIC wire value of a u32 index, and the reserved member count
NONE_U32 = 0xFFFFFFFF

def rule_by_class(rules: Mapping[type, R], obj: object) -> R | None:
    """The rule registered for ``obj``'s class, or for the nearest registered class it derives
    from (a subclass of a model class); None when there is none."""
    for cls in type(obj).__mro__:
        rule = rules.get(cls)
        if rule is not None:
            return rule
    return None


_STRUCT_CACHE: dict[tuple[str, int], struct.Struct] = {}


def vec(code: str, n: int) -> struct.Struct:
    """The struct of ``n`` little-endian ``code`` items (``code`` repeated when longer than one)."""
    st = _STRUCT_CACHE.get((code, n))
    if st is None:
        st = _STRUCT_CACHE[(code, n)] = struct.Struct(f"<{n}{code}" if len(code) == 1 else "<" + code * n)
    return st


def pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


class Ctx:
    """Where errors point: path, tensor, absolute offsets of the wire sections."""

    __slots__ = ("path", "tensor", "base", "shape", "byte_offset", "layout", "buffers", "quant", "shard", "stats", "ext", "member")

    def __init__(self, path: str | None, tensor: str | None, base: int) -> None:
        self.path = path
        self.tensor = tensor
        self.base = base

    def err(self, cls: type[HurrayInteropError], message: str, field: str, at: int | None) -> HurrayInteropError:
        return cls(message, path=self.path, tensor=self.tensor, field=field, offset=None if at is None else self.base + at)


def check_int(v: object, bits: int, ctx: Ctx, field: str, at: int | None, signed: bool = False) -> None:
    """FormatError unless ``v`` is an int that fits an (un)signed ``bits``-bit wire field."""
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise ctx.err(FormatError, f"{v!r} is not a {'signed' if signed else 'unsigned'} {bits}-bit integer", field, at)
