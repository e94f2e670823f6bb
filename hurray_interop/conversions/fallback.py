"""Fallbacks: storing a tensor dequantized when no exact form exists, and one rule for the report.

Every path that stores values instead of codes -- GGUF import and export
(:mod:`.gguf`), safetensors import and export (:mod:`.safetensors`), in-memory MX
(:mod:`.mx`) -- casts with :func:`cast` and measures with :func:`max_abs_error` /
:class:`ErrorMeter`, so the same values get the same report whatever the formats:

* the values are cast to float32 (the dequantizer's type) and then to the chosen
  type, under ``np.errstate``: an overflow becomes ±inf and never a RuntimeWarning;
* per value, the error is ``|reference − stored|`` (float64); equal values (±0 and
  equal infinities included) and NaN against NaN cost 0; overflow to ±inf, opposite
  infinities and NaN against a number cost ``inf``;
* the tensor's max abs error is the max over its values; 0 means value-exact, anything
  else (``inf`` included) lossy (:func:`status`).

:data:`CHOICES` is what ``--fallback`` offers: a dtype name (:data:`DTYPE_CHOICES`), or
:data:`EXACT` -- GGUF types without a native mapping stored in their exact expanded form
(docs/conversion-rules.md § 9, :mod:`.gguf_exact`).  ``exact`` stores nothing dequantized:
every other path treats it as no fallback (:func:`dtype_choice`).

numpy is imported inside the functions, so that the command line can read
:data:`CHOICES` without loading it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..report import LOSSY, VALUE_EXACT

if TYPE_CHECKING:
    import numpy as np

__all__ = ["DTYPE_CHOICES", "LOSSY_CHOICES", "EXACT", "CHOICES", "check", "dtype_choice", "dtype", "cast", "lossless", "max_abs_error", "ErrorMeter", "status"]

#: the dtype fallbacks that may change a value (float32 holds every value the dequantizer gives)
LOSSY_CHOICES = ("float16", "bfloat16")
#: fallbacks that store the values as this Hurray element type
DTYPE_CHOICES = ("float32", *LOSSY_CHOICES)
#: the exact expanded forms of the GGML types without a native mapping (GGUF import)
EXACT = "exact"
#: every ``--fallback`` choice
CHOICES = DTYPE_CHOICES + (EXACT,)


def check(fallback: str | None, **where: Any) -> None:
    """Raise :class:`UsageError` unless ``fallback`` is ``None`` or one of :data:`CHOICES`."""
    if fallback is not None and fallback not in CHOICES:
        raise UsageError(f"unknown fallback {fallback!r} (one of: {', '.join(CHOICES)})", **where)


def dtype_choice(fallback: str | None, **where: Any) -> str | None:
    """The dtype fallback chosen (checked), or ``None`` for none and for :data:`EXACT`,
    which never stores values dequantized."""
    check(fallback, **where)
    return None if fallback == EXACT else fallback


def dtype(fallback: str) -> "np.dtype":
    """The numpy dtype a dtype fallback stores."""
    from ..core.elements import element_type

    check(fallback)
    return element_type(fallback).dtype


def cast(values: Any, fallback: str) -> "np.ndarray":
    """``values`` as float32, then as the fallback's dtype: overflow gives ±inf, silently."""
    import numpy as np

    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values, dtype=np.float32).astype(dtype(fallback))


def lossless(source: Any, fallback: str) -> bool:
    """True when every value of dtype ``source`` survives :func:`cast` unchanged (error 0
    without measuring): a float32 source and a float32 fallback."""
    import numpy as np

    return np.dtype(source) == np.dtype(np.float32) == dtype(fallback)


def max_abs_error(reference: Any, stored: Any) -> float:
    """The max abs error of ``stored`` against ``reference`` under the module's rule."""
    import numpy as np

    with np.errstate(invalid="ignore", over="ignore"):  # a signalling NaN widened is "invalid"
        a = np.asarray(reference).astype(np.float64, copy=False).reshape(-1)
        b = np.asarray(stored).astype(np.float64).reshape(-1)
    if a.size == 0:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(a - b)  # NaN for NaN operands and for inf − inf
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    err = float(np.max(np.where(same, 0.0, d)))
    return float("inf") if np.isnan(err) else err  # NaN against a number: unbounded


#: values measured at a time by :class:`ErrorMeter`: its float64 temporaries stay a few MiB
#: whatever the chunk it is given
METER_PIECE = 1 << 18


class ErrorMeter:
    """:func:`max_abs_error` over a tensor given chunk by chunk (each chunk measured in
    pieces of :data:`METER_PIECE` values: the max of the pieces' maxima is the same)."""

    def __init__(self) -> None:
        self.error = 0.0

    def add(self, reference: Any, stored: Any) -> None:
        import numpy as np

        a, b = np.asarray(reference).reshape(-1), np.asarray(stored).reshape(-1)
        for i in range(0, a.size, METER_PIECE):
            self.error = max(self.error, max_abs_error(a[i : i + METER_PIECE], b[i : i + METER_PIECE]))

    def add_cast(self, values: "np.ndarray", stored: "np.ndarray") -> None:
        """:meth:`add` for ``stored = cast(values, fallback)`` of float32 ``values``: computed
        in float32, which is exact here -- a float32 and its rounding to float16/bfloat16
        differ by a multiple of its ulp below 2^16 ulps (or by inf on overflow) -- so the
        maximum is :meth:`add`'s, at a tenth of the cost (no float64 copies)."""
        import numpy as np

        a, b = values.reshape(-1), stored.reshape(-1)
        if a.dtype != np.float32:
            raise TypeError(f"add_cast measures float32 values, not {a.dtype}")
        for i in range(0, a.size, METER_PIECE):
            x = a[i : i + METER_PIECE]
            with np.errstate(invalid="ignore", over="ignore"):
                y = b[i : i + METER_PIECE].astype(np.float32)
                d = np.abs(x - y)  # NaN for NaN operands and for inf - inf
            same = (x == y) | (np.isnan(x) & np.isnan(y))
            err = float(np.max(np.where(same, np.float32(0), d)))
            self.error = max(self.error, float("inf") if np.isnan(err) else err)


def status(error: float) -> str:
    """The report status of a fallback with this max abs error."""
    return VALUE_EXACT if error == 0.0 else LOSSY
