"""The parts of the Hurray model a GGUF file never needs: the layouts other than row-major
and composite, the per-tensor affine and NF4 schemes, the statistics and extension-type
sections.  They are :mod:`hurray_interop.core.model`'s (import them from there); they live
here so that a command which never meets them does not create their classes (each
dataclass costs ~0.4 ms of start-up: ``inspect`` of a GGUF loads the model, not these).
:mod:`~hurray_interop.core.model` loads this module on first use of one of the names.
"""

from __future__ import annotations

from .dataclass import dataclass

__all__ = [
    "ColumnMajor", "Strided", "Tiled", "Morton", "Coo", "Csr", "Csc", "Csf", "BlockPaged", "Hilbert",
    "PrivateLayout", "PerTensorAffine", "NF4", "Statistics", "ExtensionType",
]


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


@dataclass(frozen=True)
class PerTensorAffine:
    scale: float  # a float32 value
    zero_point: int = 0
    scheme_tag = 0x01


@dataclass(frozen=True)
class NF4:
    axis: int
    block_size: int
    scale_buffer_index: int
    scheme_tag = 0x04


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
