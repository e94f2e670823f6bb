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
from dataclasses import dataclass, field
from typing import Sequence, Union

import numpy as np

from .elements import ElementType, element_type

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
class ColumnMajor:
    tag = 0x02


@dataclass(frozen=True)
class Strided:
    """Strides in logical elements (may be negative or zero)."""

    strides: tuple[int, ...]
    tag = 0x03


@dataclass(frozen=True)
class Tiled:
    tile_shape: tuple[int, ...]
    outer_layout: int  # 1 row-major, 2 column-major, 3 strided
    inner_layout: int  # 1 row-major, 2 column-major, 3 strided, 4 nested tiled
    outer_strides: tuple[int, ...] | None = None
    inner_strides: tuple[int, ...] | None = None
    inner: "Tiled | None" = None
    tag = 0x04


@dataclass(frozen=True)
class Morton:
    bits: tuple[int, ...]
    tag = 0x05


@dataclass(frozen=True)
class Coo:
    nnz: int
    is_sorted: bool = False
    tag = 0x06


@dataclass(frozen=True)
class Csr:
    nnz: int
    tag = 0x07


@dataclass(frozen=True)
class Csc:
    nnz: int
    tag = 0x08


@dataclass(frozen=True)
class Csf:
    nnz: int
    mode_order: tuple[int, ...]
    tag = 0x09


@dataclass(frozen=True)
class BlockPaged:
    page_size: int
    num_pages: int
    paged_axis: int
    num_seqs: int
    kv_role: int
    layer_index: int
    block_table_index_type: int
    tag = 0x0A


@dataclass(frozen=True)
class CompositeHead:
    composition_rule: int  # RULE_PARTITION / RULE_OVERLAY / RULE_GROUP
    combine_op: int  # OP_NONE, or for overlay OP_REPLACE / OP_ADD
    member_count: int
    tag = 0x0B


@dataclass(frozen=True)
class Hilbert:
    order: int
    rank: int
    tag = 0x40


@dataclass(frozen=True)
class PrivateLayout:
    layout_tag: int  # 0xF0..0xFE
    extension_layout_id: int
    data: bytes = b""

    @property
    def tag(self) -> int:  # type: ignore[override]
        return self.layout_tag


# ---------------------------------------------------------------------------
# quantization schemes


class _ZeroPoints:
    """Affine schemes with an optional zero-point buffer."""

    zero_point_buffer_index: int | None

    @property
    def symmetric(self) -> bool:
        return self.zero_point_buffer_index is None


@dataclass(frozen=True)
class PerTensorAffine:
    scale: float  # a float32 value
    zero_point: int = 0
    scheme_tag = 0x01


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
class NF4:
    axis: int
    block_size: int
    scale_buffer_index: int
    scheme_tag = 0x04


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
class Statistics:
    """The 72-byte advisory statistics section; fields whose mask bit is clear are 0."""

    computed_mask: int = 0
    nnz: int = 0
    sparsity_ratio: float = 0.0
    value_min: float = 0.0
    value_max: float = 0.0
    value_abs_max: float = 0.0
    value_mean: float = 0.0
    value_stddev: float = 0.0
    nm_n: int = 0
    nm_m: int = 0
    has_nan: int = 0
    has_inf: int = 0


@dataclass(frozen=True)
class ExtensionType:
    bit_width: int
    packing_factor: int
    is_float: int
    is_signed: int
    sign_bits: int
    exponent_bits: int
    mantissa_bits: int
    exponent_bias: int
    has_nan: int
    has_inf: int


@dataclass(frozen=True)
class CompositeMember:
    role: int  # ROLE_CORRECTION or ROLE_BASE


#: every layout and every quantization scheme
Layout = Union[
    RowMajor, ColumnMajor, Strided, Tiled, Morton, Coo, Csr, Csc, Csf, BlockPaged, CompositeHead, Hilbert, PrivateLayout
]
Quantization = Union[PerTensorAffine, PerChannelAffine, PerBlockAffine, NF4, MXFP]


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
        tag = d.quantization.scheme_tag
        return f"{SCHEME_NAMES.get(tag, f'scheme 0x{tag:02x}').removesuffix(' affine')} {d.element_type.name}"


def as_u8(buf: "bytes | bytearray | memoryview | np.ndarray | Sequence[int]") -> np.ndarray:
    """View any bytes-like object as a 1-D uint8 numpy array (zero-copy when possible)."""
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1).view(np.uint8)
    return np.frombuffer(buf, dtype=np.uint8)
