"""The cross-member rules of composite tensors (layouts/composite.md § Validation), in one place.

The ``.hrry`` reader checks them when it binds a head to its members, and the dequantizer
checks them on in-memory tensors; both call :func:`validate_composite`.  The single-descriptor
rules of a head (no buffers, no quantization, a legal ``combine_op``) and of a member's shard
section (in bounds of its ``parent_shape``) are descriptor rules
(:func:`~hurray_interop.core.descriptor.validate_descriptor`).

Every check is linear in the member count except the partition non-overlap check, a sweep
(:func:`first_overlap`) that costs about n log n for row, column or grid partitions.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from ..errors import FormatError, InconsistentError
from .model import RULE_OVERLAY, RULE_PARTITION, ROLE_BASE, ROLE_CORRECTION, CompositeHead, Descriptor

__all__ = ["MAX_COMPOSITE_DEPTH", "check_nesting", "validate_composite", "first_overlap", "boxes_overlap"]

#: maximum composite nesting depth (layouts/composite.md § Binding)
MAX_COMPOSITE_DEPTH = 8

Box = tuple[Sequence[int], Sequence[int]]  # (offset, shape)


def check_nesting(depth: int, *, path: str | None = None, tensor: str | None = None, offset: int | None = None) -> None:
    """Raise :class:`FormatError` when a composite head sits ``depth`` levels below a
    top-level tensor (0: it is one) and so nests deeper than :data:`MAX_COMPOSITE_DEPTH`."""
    if depth >= MAX_COMPOSITE_DEPTH:
        raise FormatError(f"composite nesting deeper than {MAX_COMPOSITE_DEPTH}", path=path, tensor=tensor,
                          field="layout", offset=offset)


def validate_composite(
    name: str,
    head: Descriptor,
    members: Sequence[tuple[str, Descriptor]],
    *,
    path: str | None = None,
    offset_of: Callable[[str], int | None] | None = None,
) -> None:
    """Raise :class:`InconsistentError` unless ``members`` (``(name, descriptor)`` pairs in
    binding order) satisfy the cross-member rules of composite head ``name``:

    * as many members as ``member_count``; an overlay has at least one (its base);
    * an unquantized standard member stores the head's element type (its decoded type);
    * partition and overlay members carry a shard section whose ``parent_shape`` is the
      head's shape;
    * overlay members carry a composite-member section: the first is the base and spans the
      whole head, the others are corrections; partition and group members carry none;
    * partition members neither overlap nor leave a gap.

    The error names the offending member (or the head) as its tensor, field ``"composite"``,
    and ``offset_of(tensor)`` as its offset (a file reader passes the descriptor offsets).
    """
    lay = head.layout
    assert isinstance(lay, CompositeHead)

    def bad(msg: str, member: str | None = None) -> InconsistentError:
        who = member or name
        return InconsistentError(msg, path=path, tensor=who, field="composite",
                                 offset=offset_of(who) if offset_of is not None else None)

    rule = lay.composition_rule
    if len(members) != lay.member_count:
        raise bad(f"the head declares {lay.member_count} members, {len(members)} are attached")
    if rule == RULE_OVERLAY and lay.member_count == 0:
        raise bad("an overlay composite needs a base member (member_count is 0)")
    head_shape = tuple(head.shape)
    for k, (mname, md) in enumerate(members):
        if md.quantization is None and md.extension_type is None and head.extension_type is None:
            if md.element_type.tag != head.element_type.tag:
                raise bad(f"member element type {md.element_type.name} differs from the head's {head.element_type.name}", mname)
        if rule in (RULE_PARTITION, RULE_OVERLAY):
            if md.shard is None:
                raise bad("partition and overlay members need a shard section", mname)
            if tuple(md.shard.parent_shape) != head_shape:
                raise bad(f"shard parent_shape {list(md.shard.parent_shape)} differs from the head shape {list(head.shape)}", mname)
        if rule == RULE_OVERLAY:
            if md.composite_member is None:
                raise bad("overlay members need a composite-member section", mname)
            want = ROLE_BASE if k == 0 else ROLE_CORRECTION
            if md.composite_member.role != want:
                raise bad(f"overlay member {k} must have role {'base' if k == 0 else 'correction'}", mname)
            if k == 0 and (any(md.shard.offset) or tuple(md.shape) != head_shape):  # type: ignore[union-attr]
                raise bad("the overlay base must span the whole head", mname)
        elif md.composite_member is not None:
            raise bad("only overlay members may carry a composite-member section", mname)
    if rule == RULE_PARTITION:
        boxes = [(md.shard.offset, md.shape) for _, md in members]  # type: ignore[union-attr]
        pair = first_overlap(boxes)  # type: ignore[arg-type]
        if pair is not None:
            i, j = pair
            raise bad(f"partition members {members[i][0]!r} and {members[j][0]!r} overlap", members[j][0])
        vol = sum(math.prod(shp) for _, shp in boxes)  # type: ignore[arg-type]
        total = None if None in head_shape else math.prod(head_shape)  # type: ignore[arg-type]
        if vol != total:
            raise bad(f"partition members cover {vol} of {total} elements (gap)")


def boxes_overlap(a: Box, b: Box) -> bool:
    """Whether boxes ``(offset, shape)`` share an element (composite.md § Partition)."""
    return all(max(a0, b0) < min(a0 + al, b0 + bl) for a0, al, b0, bl in zip(a[0], a[1], b[0], b[1]))


def first_overlap(boxes: Sequence[Box]) -> tuple[int, int] | None:
    """``(i, j)``, ``i < j``, of two overlapping boxes ``(offset, shape)``, or None.

    A sweep along the axis with the most distinct start offsets: each box is compared only
    with the boxes whose interval on that axis it meets, so a row, column or grid partition
    of n members costs about n log n (n**1.5 for a square grid) instead of n**2 -- a file
    with thousands of members must not take minutes to open.  Empty boxes overlap nothing.
    """
    live = [(k, tuple(o), tuple(s)) for k, (o, s) in enumerate(boxes) if all(x > 0 for x in s)]
    if len(live) < 2:
        return None
    rank = len(live[0][1])
    if rank == 0:  # two non-empty scalars: the same single element
        return live[0][0], live[1][0]
    axis = max(range(rank), key=lambda a: len({o[a] for _, o, _ in live}))
    live.sort(key=lambda b: (b[1][axis], b[0]))
    active: list[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = []
    found: tuple[int, int] | None = None
    for k, o, s in live:
        start = o[axis]
        active = [a for a in active if a[0] > start]
        for _, j, oj, sj in active:
            if boxes_overlap((oj, sj), (o, s)):
                pair = (min(j, k), max(j, k))
                found = pair if found is None or pair < found else found
                break
        if found is not None:
            break
        active.append((start + s[axis], k, o, s))
    return found
