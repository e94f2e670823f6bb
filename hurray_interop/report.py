"""Conversion and verification reports: plain data, shared by every converter.

Library code returns these; only the CLI renders them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

__all__ = ["EXACT", "VALUE_EXACT", "LOSSY", "REFUSED", "TensorPlan", "ConversionReport", "fallback_hint",
           "EXACT_FORM_HINT"]

#: every code and scale bit preserved
EXACT = "exact"
#: stored differently but every value identical (e.g. float32 fallback of a K-quant)
VALUE_EXACT = "value-exact"
#: a fallback the user chose that changes values (max_abs_error says how much)
LOSSY = "lossy"
#: not exactly representable and no fallback chosen
REFUSED = "refused"

#: what a refused tensor whose GGML type has an exact expanded form is told (a plan's row)
EXACT_FORM_HINT = "--fallback exact stores it exactly"


def fallback_hint(expandable: bool, dtypes: Sequence[str]) -> str:
    """The options that would convert refused tensors, as every refusal says it:
    ``choose --fallback exact to store them exactly, larger, or --fallback
    float32|float16|bfloat16 to store them dequantized`` (the ``--fallback exact`` part when
    ``expandable``: a refused tensor has an exact expanded form; ``dtypes``: the float
    fallbacks the conversion offers)."""
    exact = "--fallback exact to store them exactly, larger, or " if expandable else ""
    return f"choose {exact}--fallback {'|'.join(dtypes)} to store them dequantized"


@dataclass
class TensorPlan:
    """What happens (or happened) to one tensor."""

    name: str
    source_type: str  # e.g. "Q4_0", "F32", "MXFP4 (gpt-oss)"
    mapping: str  # e.g. "per-block affine int4 SYMMETRIC K=32 f16", or the target GGML type
    status: str  # EXACT / VALUE_EXACT / LOSSY / REFUSED
    bytes_in: int = 0
    bytes_out: int = 0
    reason: str = ""  # why refused, or what the fallback did
    max_abs_error: float | None = None
    substituted_blocks: int = 0  # forbidden scales replaced on all-zero blocks (recorded, restored on export)
    hint: str = ""  # refused: the option that would convert it (e.g. :data:`EXACT_FORM_HINT`)

    @property
    def note(self) -> str:
        """The reason, and the hint of a refused tensor: what a plan's row says."""
        return "; ".join(x for x in (self.reason, self.hint) if x)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ConversionReport:
    source: str
    destination: str | None
    source_format: str
    destination_format: str
    tensors: list[TensorPlan] = field(default_factory=list)
    dry_run: bool = False
    notes: list[str] = field(default_factory=list)
    hint: str = ""  # with refused tensors: the options that would convert them (:func:`fallback_hint`)
    #: notes on the forms the destination stores (overlays, expanded forms): shown after ``notes``,
    #: left out where the destination is an intermediate file (GGUF -> safetensors through Hurray)
    form_notes: list[str] = field(default_factory=list)
    #: a refusal of the whole file that a dry run found (the conversion would stop with it), "" if none
    refusal: str = ""

    @property
    def refused(self) -> list[TensorPlan]:
        return [t for t in self.tensors if t.status == REFUSED]

    @property
    def would_refuse(self) -> bool:
        """A dry run whose conversion would be refused: a tensor, or the whole file."""
        return bool(self.refused or self.refusal)

    @property
    def exact(self) -> bool:
        return all(t.status in (EXACT, VALUE_EXACT) for t in self.tensors)

    # bytes_in / bytes_out, per tensor and in total: each tensor's data in the source and in the
    # destination (an exact expanded form's restore record included), by the same rule in both
    # directions, so a file shows one figure whichever way it is converted; headers, metadata
    # and padding are not counted.

    @property
    def bytes_in(self) -> int:
        return sum(t.bytes_in for t in self.tensors)

    @property
    def bytes_out(self) -> int:
        return sum(t.bytes_out for t in self.tensors)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.status] = out.get(t.status, 0) + 1
        return out

    def substitutions(self) -> tuple[int, int]:
        """``(blocks, tensors)``: all-zero blocks whose scale (forbidden by the destination's
        rules) was stored as the rules' substitute and recorded -- a normal, exact case."""
        subst = [t.substituted_blocks for t in self.tensors if t.substituted_blocks]
        return sum(subst), len(subst)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "destination": self.destination,
            "source_format": self.source_format,
            "destination_format": self.destination_format,
            "dry_run": self.dry_run,
            "exact": self.exact and not self.refusal,
            "refusal": self.refusal,
            "counts": self.counts(),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "notes": self.notes + self.form_notes,
            "hint": self.hint,
            "tensors": [t.to_dict() for t in self.tensors],
        }
