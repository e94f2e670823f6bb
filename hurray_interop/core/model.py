"""The central model: Hurray tensor descriptors and tensors (descriptor + buffers).

Every foreign format converts to and from these objects; nothing here knows
about GGUF, MX checkpoints or safetensors.  The classes mirror the Hurray wire
format one to one (metadata.md, quantization/*.md) so that a decoded
descriptor re-encodes to the identical bytes.  Binary encoding, decoding and
validation live in :mod:`hurray_interop.core.descriptor`.

Conventions:

* ``shape`` is numpy order (dimension 0 slowest); ``None`` is the dynamic
  dimension sentinel ``0xFFFFFFFFFFFFFFFF``.
* Quantization parameter buffers are referred to by their index in the
  descriptor's buffer table; ``zero_point_buffer_index is None`` means the
  SYMMETRIC flag (wire value ``0xFFFFFFFF``).
* Scale types and element types are :class:`ElementType` rows.
"""

from __future__ import annotations

import itertools
from dataclasses import field
from typing import TYPE_CHECKING, Any, Sequence, Union

import numpy as np

from .dataclass import dataclass
from .elements import ElementType, element_type

if TYPE_CHECKING:  # pragma: no cover
    from .model_extra import (
        NF4, BlockPaged, ColumnMajor, Coo, Csc, Csf, Csr, ExtensionType, Hilbert, Morton, PerTensorAffine,
        PrivateLayout, Statistics, Strided, Tiled,
    )

__all__ = [
    "DYNAMIC",
    "BufferHandle",
    "RowMajor",
    "ColumnMajor",
    "Strided",
    "Tiled",
    "Morton",
    "Coo",
    "Csr",
    "Csc",
    "Csf",
    "BlockPaged",
    "CompositeHead",
    "Hilbert",
    "PrivateLayout",
    "Layout",
    "PerTensorAffine",
    "PerChannelAffine",
    "PerBlockAffine",
    "NF4",
    "MXFP",
    "Quantization",
    "Shard",
    "Statistics",
    "ExtensionType",
    "CompositeMember",
    "Descriptor",
    "Tensor",
    "DEVICE_CPU",
    "ROLE_CORRECTION",
    "ROLE_BASE",
    "RULE_PARTITION",
    "RULE_OVERLAY",
    "RULE_GROUP",
    "OP_NONE",
    "OP_REPLACE",
    "OP_ADD",
    "LAYOUT_NAMES",
    "SCHEME_NAMES",
    "RULE_NAMES",
    "OP_NAMES",
]

#: The dynamic-dimension sentinel on the wire.
DYNAMIC = 0xFFFFFFFFFFFFFFFF

DEVICE_CPU = 0x00

ROLE_CORRECTION = 0x00
ROLE_BASE = 0x01

RULE_PARTITION = 1
RULE_OVERLAY = 2
RULE_GROUP = 3
OP_NONE = 0
OP_REPLACE = 1
OP_ADD = 2

#: the spec's layout tags and their names (private tags 0x80+ aside): the one table the
#: descriptor checks and every report use
LAYOUT_NAMES = {
    0x01: "row-major", 0x02: "column-major", 0x03: "strided", 0x04: "tiled", 0x05: "morton",
    0x06: "coo", 0x07: "csr", 0x08: "csc", 0x09: "csf", 0x0A: "block-paged", 0x0B: "composite", 0x40: "hilbert",
}
#: quantization scheme tags and their names
SCHEME_NAMES = {0x01: "per-tensor affine", 0x02: "per-channel affine", 0x03: "per-block affine", 0x04: "NF4", 0x05: "MXFP"}
#: composite rules and combine operations (OP_NONE has no name)
RULE_NAMES = {RULE_PARTITION: "partition", RULE_OVERLAY: "overlay", RULE_GROUP: "group"}
OP_NAMES = {OP_NONE: "", OP_REPLACE: "replace", OP_ADD: "add"}


# ---------------------------------------------------------------------------
# buffers


@dataclass(frozen=True)
class BufferHandle:
    """One 16-byte entry of a descriptor's buffer table (buffer-protocol.md)."""

    byte_size: int
    alignment: int = 64
    device: int = DEVICE_CPU
    sync_mode: int = 0
    memory_class: int = 0

    @classmethod
    def cpu(cls, byte_size: int) -> "BufferHandle":
        """A CPU buffer as the reference writers declare it (alignment 64; 1 when empty)."""
        return cls(byte_size=byte_size, alignment=64 if byte_size else 1)


# ---------------------------------------------------------------------------
# layouts (tag and layout-specific fields)


@dataclass(frozen=True)
class RowMajor:
    tag = 0x01


@dataclass(frozen=True)
class CompositeHead:
    composition_rule: int  # RULE_PARTITION / RULE_OVERLAY / RULE_GROUP
    combine_op: int  # OP_NONE, or for overlay OP_REPLACE / OP_ADD
    member_count: int
    tag = 0x0B


# ---------------------------------------------------------------------------
# quantization schemes


class _ZeroPoints:
    """Affine schemes with an optional zero-point buffer."""

    zero_point_buffer_index: int | None

    @property
    def symmetric(self) -> bool:
        return self.zero_point_buffer_index is None


@dataclass(frozen=True)
class PerChannelAffine(_ZeroPoints):
    axis: int
    scale_buffer_index: int
    zero_point_buffer_index: int | None = None  # None = SYMMETRIC
    scale_type: ElementType = field(default_factory=lambda: element_type("float32"))
    scheme_tag = 0x02


@dataclass(frozen=True)
class PerBlockAffine(_ZeroPoints):
    axis: int
    block_size: int
    scale_buffer_index: int
    zero_point_buffer_index: int | None = None  # None = SYMMETRIC
    scale_type: ElementType = field(default_factory=lambda: element_type("float16"))
    scheme_tag = 0x03


@dataclass(frozen=True)
class MXFP:
    axis: int
    block_size: int
    scale_buffer_index: int
    scheme_tag = 0x05


# ---------------------------------------------------------------------------
# optional sections


@dataclass(frozen=True)
class Shard:
    parent_shape: tuple[int, ...]
    offset: tuple[int, ...]


@dataclass(frozen=True)
class CompositeMember:
    role: int  # ROLE_CORRECTION or ROLE_BASE


# ---------------------------------------------------------------------------
# descriptor


@dataclass(frozen=True)
class Descriptor:
    """A Hurray tensor descriptor (everything but the buffer contents)."""

    element_type: ElementType
    shape: tuple[int | None, ...]
    buffers: tuple[BufferHandle, ...]
    layout: Layout = field(default_factory=RowMajor)
    byte_offset: int = 0
    quantization: Quantization | None = None
    #: bytes after the scheme's fixed-length descriptor inside quantization_length
    #: (writer padding, kept so that decoding and re-encoding is byte-identical)
    quantization_padding: bytes = b""
    shard: Shard | None = None
    statistics: Statistics | None = None
    extension_type: ExtensionType | None = None
    composite_member: CompositeMember | None = None
    version_major: int = 1
    version_minor: int = 0

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int | None:
        """Number of logical elements, ``None`` if any dimension is dynamic."""
        n = 1
        for d in self.shape:
            if d is None:
                return None
            n *= d
        return n

    @property
    def is_composite(self) -> bool:
        return isinstance(self.layout, CompositeHead)


# ---------------------------------------------------------------------------
# tensor = descriptor + buffer contents


@dataclass
class Tensor:
    """A named Hurray tensor: its descriptor and the bytes of each buffer.

    ``data[i]`` is a read-only 1-D uint8 array (often a zero-copy view of a
    memory-mapped file) holding exactly ``descriptor.buffers[i].byte_size``
    bytes.  A composite head has no buffers; its ``members`` are the tensors
    that follow it.
    """

    name: str
    descriptor: Descriptor
    data: tuple[np.ndarray, ...] = ()
    members: tuple["Tensor", ...] = ()

    def buffer(self, i: int) -> np.ndarray:
        return self.data[i]

    @property
    def shape(self) -> tuple[int | None, ...]:
        return self.descriptor.shape

    @property
    def element_type(self) -> ElementType:
        return self.descriptor.element_type

    @property
    def nbytes(self) -> int:
        """Stored bytes, members included."""
        return sum(h.byte_size for h in self.descriptor.buffers) + sum(m.nbytes for m in self.members)

    def describe(self) -> str:
        """A short description for reports: ``float32``, ``per-block int4``,
        ``MXFP float4_e2m1``, ``overlay(uint4+uint2)``; a run of more than 8 members of one
        element type is counted: ``overlay(int4+96×float32)``."""
        d = self.descriptor
        if isinstance(d.layout, CompositeHead):
            rule = RULE_NAMES.get(d.layout.composition_rule, "composite")
            parts = []
            for name, run in itertools.groupby(m.element_type.name for m in self.members):
                k = len(list(run))
                parts += [f"{k}×{name}"] if k > 8 else [name] * k
            return f"{rule}({'+'.join(parts)})"
        if d.quantization is None:
            return d.element_type.name
        return f"{SCHEME_NAMES[d.quantization.scheme_tag].removesuffix(' affine')} {d.element_type.name}"


def as_u8(buf: "bytes | bytearray | memoryview | np.ndarray | Sequence[int]") -> np.ndarray:
    """View any bytes-like object as a 1-D uint8 numpy array (zero-copy when possible)."""
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1).view(np.uint8)
    return np.frombuffer(buf, dtype=np.uint8)


# ---------------------------------------------------------------------------
# the rest of the model, created on first use (core/model_extra.py)

_EXTRA = frozenset(
    ("ColumnMajor", "Strided", "Tiled", "Morton", "Coo", "Csr", "Csc", "Csf", "BlockPaged", "Hilbert",
     "PrivateLayout", "PerTensorAffine", "NF4", "Statistics", "ExtensionType")
)


def __getattr__(name: str) -> Any:
    """``Coo``, ``NF4``, ``Statistics``... from :mod:`.model_extra`, and the unions
    ``Layout`` and ``Quantization`` of every layout and scheme class."""
    if name not in _EXTRA and name not in ("Layout", "Quantization"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import model_extra as X

    g = globals()
    g.update((n, getattr(X, n)) for n in _EXTRA)
    g["Layout"] = Union[
        RowMajor, X.ColumnMajor, X.Strided, X.Tiled, X.Morton, X.Coo, X.Csr, X.Csc, X.Csf, X.BlockPaged, CompositeHead,
        X.Hilbert, X.PrivateLayout,
    ]
    g["Quantization"] = Union[X.PerTensorAffine, PerChannelAffine, PerBlockAffine, X.NF4, MXFP]
    return g[name]
