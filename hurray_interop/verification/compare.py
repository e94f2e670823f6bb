"""``compare``'s tensor metrics: two tensors' float32 values streamed window by window,
the error accumulated in float64 (docs/commands.md § compare says what each figure means).

Each format gives its tensors as :class:`ValueSource` records (:func:`foreign_sources` for
GGUF and safetensors, :func:`hurray_sources` for .hrry; the registry's ``values`` field):

* a .hrry tensor's values are the shared dequantizer's (:func:`~hurray_interop.dequant.windows`);
* a GGUF tensor's are its oracle decoder's (ggml's own ``to_float`` where it loads, gguf-py's
  otherwise; numpy's cast for plain types), a safetensors tensor's its element decoding -- the
  references ``verify`` holds the shared dequantizer to, bit for bit.

Per window the figures are sums (:func:`window_stats`, one C pass where the kernel is
loaded, :func:`hurray_interop.kernels.compare_stats`; numpy otherwise), added in window order,
so the result does not depend on the thread count.  Semantics:

* two values are *equal* when ``a == b`` as floats (so +0 equals −0) or both are NaN (any
  payload); the first difference is the first position where they are not;
* at equal positions the difference counts as 0; elsewhere ``d = float64(a) − float64(b)``;
  max abs = max |d| (NaN when one side alone is NaN), RMSE = sqrt(Σd² / n),
  NMSE = Σd² / Σb² (``inf`` when B is all zero and A is not, 0 when all values are equal),
  cosine = Σab / sqrt(Σa² Σb²) (1 when all values are equal, NaN when one side is all zero);
* tensors with the same stored type, shape and bytes are identical without being decoded.
"""

from __future__ import annotations

import functools
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..core.hrry import HrryFile
from ..core.model import Tensor
from ..dequant import windows
from ..errors import UnsupportedError
from ..kernels import compare_stats, thread_buffer
from ..parallel import pmap_items
from .common import ForeignChecks, Unit, _release_pages
from .hurray import _same_tensor_bytes

__all__ = ["ValueSource", "TensorDiff", "WindowStats", "window_stats", "compare_tensors", "foreign_sources",
           "hurray_sources", "WINDOW", "IDENTICAL", "DIFFERS", "SHAPE", "NOT_DECODED"]

#: values per window (4 MiB of float32 per side and thread, as verify's value check)
WINDOW = 1 << 20

#: a tensor's status in a comparison
IDENTICAL, DIFFERS, SHAPE, NOT_DECODED = "identical", "differs", "shape mismatch", "not decoded"

_F32 = np.float32


@dataclass
class ValueSource:
    """One tensor of a model as ``compare`` reads it.

    ``read(lo, hi, out)`` writes the flat values ``lo:hi`` into ``out`` (any range); or, for
    a .hrry tensor, ``wins()`` gives its dequantizer windows (their own spans).  ``same(other)``
    says that two sources hold the same stored type, shape and bytes (so the same values)."""

    name: str
    label: str
    shape: tuple[int, ...]
    read: Callable[[int, int, np.ndarray], None] | None = None
    wins: Callable[[], Any] | None = None
    same: Callable[["ValueSource", Callable[[], None] | None], bool] = lambda other, release: False
    #: why its values cannot be given here ("": they can)
    problem: str = ""
    #: what ``same`` compares, by kind ("gguf", "hurray", ...): sources of different kinds never match
    kind: str = ""
    stored: Any = None


@dataclass
class WindowStats:
    """The sums of a stretch of values (see the module docstring)."""

    n: int = 0
    ssd: float = 0.0
    sa2: float = 0.0
    sb2: float = 0.0
    dot: float = 0.0
    max_abs: float = 0.0
    differing: int = 0
    first: int = -1  # flat index of the first unequal pair (−1: none)

    def add(self, lo: int, w: "WindowStats") -> None:
        """Add the window ``w`` that starts at flat index ``lo`` (windows added in order)."""
        if self.first < 0 and w.first >= 0:
            self.first = lo + w.first
        self.n += w.n
        self.ssd += w.ssd
        self.sa2 += w.sa2
        self.sb2 += w.sb2
        self.dot += w.dot
        self.differing += w.differing
        if math.isnan(w.max_abs) or math.isnan(self.max_abs):
            self.max_abs = math.nan
        else:
            self.max_abs = max(self.max_abs, w.max_abs)


def window_stats(a: np.ndarray, b: np.ndarray) -> WindowStats:
    """The sums of two equal-length float32 windows: the compiled pass where it loads
    (:func:`hurray_interop.kernels.compare_stats`), else :func:`window_stats_numpy`."""
    got = compare_stats(a, b)
    if got is None:
        return window_stats_numpy(a, b)
    ssd, sa2, sb2, dot, max_abs, differing, first = got
    return WindowStats(int(a.size), ssd, sa2, sb2, dot, max_abs, differing, first)


def window_stats_numpy(a: np.ndarray, b: np.ndarray) -> WindowStats:
    """:func:`window_stats` in numpy (the C pass's twin)."""
    with np.errstate(invalid="ignore", over="ignore"):
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        d = a64 - b64
        d[same] = 0.0
        differing = int(a.size - np.count_nonzero(same))
        first = int(np.argmin(same)) if differing else -1
        max_abs = float(np.max(np.abs(d))) if d.size else 0.0
        return WindowStats(int(a.size), float(d @ d), float(a64 @ a64), float(b64 @ b64), float(a64 @ b64),
                           max_abs, differing, first)


@dataclass
class TensorDiff:
    """One tensor of both models compared (see the module docstring for the figures)."""

    name: str
    type_a: str
    type_b: str
    shape_a: list[int]
    shape_b: list[int]
    status: str
    elements: int = 0
    differing: int = 0
    max_abs: float | None = None
    rmse: float | None = None
    nmse: float | None = None
    cosine: float | None = None
    #: the multi-index of the first differing element, and the two values there
    first_diff: list[int] | None = None
    first_values: list[float] | None = None
    #: the stored bytes are identical (values not decoded)
    bytes_identical: bool = False
    note: str = ""

    @property
    def identical(self) -> bool:
        return self.status == IDENTICAL

    def finish(self, s: WindowStats, a: float, b: float) -> None:
        """The figures from the sums ``s``; ``a``, ``b``: the values at the first difference."""
        self.elements, self.differing = s.n, s.differing
        self.status = IDENTICAL if s.differing == 0 else DIFFERS
        self.max_abs = s.max_abs
        self.rmse = math.sqrt(s.ssd / s.n) if s.n else 0.0
        if s.differing == 0:
            self.nmse, self.cosine = 0.0, 1.0
            return
        self.nmse = s.ssd / s.sb2 if s.sb2 > 0 else (math.inf if s.ssd > 0 else math.nan)
        norms = s.sa2 * s.sb2
        self.cosine = s.dot / math.sqrt(norms) if norms > 0 else math.nan
        self.first_diff = [int(i) for i in np.unravel_index(s.first, self.shape_a)] if self.shape_a else []
        self.first_values = [a, b]


def _identical(d: TensorDiff) -> TensorDiff:
    d.status, d.bytes_identical = IDENTICAL, True
    d.elements = math.prod(d.shape_a)
    d.max_abs, d.rmse, d.nmse, d.cosine = 0.0, 0.0, 0.0, 1.0
    return d


def compare_tensors(a: ValueSource, b: ValueSource, release: Callable[[], None] | None = None) -> TensorDiff:
    """``a`` against ``b``: shapes, then bytes, then values window by window on the
    :func:`~hurray_interop.parallel.jobs` threads (both sides of a window on one thread)."""
    d = TensorDiff(a.name, a.label, b.label, list(a.shape), list(b.shape), SHAPE)
    if a.shape != b.shape:
        d.note = f"shape {list(a.shape)} vs {list(b.shape)}"
        return d
    if a.kind and a.kind == b.kind and a.same(b, release):
        return _identical(d)
    problem = a.problem or b.problem
    if problem:
        d.status, d.note = NOT_DECODED, problem
        return d
    try:
        total, first = _streamed(a, b, release)
    except UnsupportedError as exc:  # a layout or type the dequantizer does not evaluate
        d.status, d.note = NOT_DECODED, exc.message
        return d
    d.finish(total, *first)
    return d


def _streamed(a: ValueSource, b: ValueSource,
              release: Callable[[], None] | None) -> tuple[WindowStats, tuple[float, float]]:
    """The sums over every window, and the two values at the first difference."""
    total = WindowStats()
    first = (0.0, 0.0)
    done = 0
    for lo, w, vals in _windows(a, b):
        if total.first < 0 and w.first >= 0:
            first = vals
        total.add(lo, w)
        done += w.n
        if release is not None and done >= 4 * WINDOW:
            release()
            done = 0
    return total, first


Job = tuple[int, int, Any, Any]


def _windows(a: ValueSource, b: ValueSource) -> Iterator[tuple[int, WindowStats, tuple[float, float]]]:
    """``(start, sums, values at its first difference)`` of every window, in order."""
    wa = a.wins() if a.read is None else None  # validated here, in the caller's thread
    wb = b.wins() if b.read is None else None
    if wa is not None and wb is not None and list(_spans(wa)) != list(_spans(wb)):
        b = ValueSource(b.name, b.label, b.shape, read=_InOrder(wb).read)  # in order, on this thread
        yield from map(functools.partial(_job, a, b, wa, None), _jobs(a.shape, wa, None))
        return
    yield from pmap_items(functools.partial(_job, a, b, wa, wb), _jobs(a.shape, wa, wb))


def _spans(w: Any) -> Iterator[tuple[int, int]]:
    return ((lo, n) for lo, n, _ in w.spans())


def _jobs(shape: Sequence[int], wa: Any, wb: Any) -> Iterator[Job]:
    """The windows: those of a .hrry side where there is one (both sides' when they agree),
    else runs of :data:`WINDOW` values."""
    if wa is not None or wb is not None:
        if wa is not None and wb is not None:
            yield from ((lo, n, ka, kb) for (lo, n, ka), (_, _, kb) in zip(wa.spans(), wb.spans()) if n)
            return
        yield from ((lo, n, k, k) for lo, n, k in (wa or wb).spans() if n)
        return
    total = math.prod(shape)
    yield from ((lo, min(WINDOW, total - lo), None, None) for lo in range(0, total, WINDOW))


def _fill(src: ValueSource, w: Any, key: Any, lo: int, out: np.ndarray) -> None:
    if src.read is not None:
        src.read(lo, lo + out.size, out)
    else:
        w.fill(key, out)


def _job(a: ValueSource, b: ValueSource, wa: Any, wb: Any, item: Job) -> tuple[int, WindowStats, tuple[float, float]]:
    lo, n, ka, kb = item
    x = thread_buffer("compare.a", (WINDOW,), _F32)[:n]
    y = thread_buffer("compare.b", (WINDOW,), _F32)[:n]
    if x.size < n:  # a .hrry window may be larger than WINDOW (one long row)
        x, y = np.empty(n, _F32), np.empty(n, _F32)
    _fill(a, wa, ka, lo, x)
    _fill(b, wb, kb, lo, y)
    s = window_stats(x, y)
    return lo, s, ((float(x[s.first]), float(y[s.first])) if s.first >= 0 else (0.0, 0.0))


class _InOrder:
    """Any increasing ranges of a .hrry tensor's values, from its windows in order (for two
    .hrry tensors whose windows do not line up)."""

    def __init__(self, w: Any) -> None:
        self.w, self.spans = w, iter(w.spans())
        self.lo = self.hi = 0
        self.buf = np.empty(0, _F32)

    def read(self, lo: int, hi: int, out: np.ndarray) -> None:
        at = lo
        while at < hi:
            while not self.lo <= at < self.hi:
                start, n, key = next(self.spans)
                self.buf = self.w.fill(key, np.empty(n, _F32))
                self.lo, self.hi = start, start + n
            take = min(hi, self.hi) - at
            out[at - lo : at - lo + take] = self.buf[at - self.lo : at - self.lo + take]
            at += take


# ---------------------------------------------------------------------------
# the formats' tensors as value sources


def _unit_reader(u: Unit, shape: tuple[int, ...]) -> tuple[Callable[[int, int, np.ndarray], None] | None, str]:
    """Flat ranges of a unit's reference decoder (rows of ``u.row`` values, or the last axis)."""
    ref = u.reference()
    if ref is None:
        return None, f"no decoder of {u.label} here"
    unit = u.row or (shape[-1] if shape else 1) or 1
    into = getattr(ref, "into", False)  # the decoder writes into a given window (GGUF's)

    def read(lo: int, hi: int, out: np.ndarray) -> None:
        r0, r1 = lo // unit, -(-hi // unit)
        if into and lo % unit == 0 and hi % unit == 0:
            ref(r0, r1, out)
            return
        out[:] = np.asarray(ref(r0, r1), dtype=_F32).reshape(-1)[lo - r0 * unit : hi - r0 * unit]

    return read, ""


#: bytes compared between two calls of ``release`` (bounds the mapped pages resident)
RELEASE_BYTES = 1 << 26


def _equal_bytes(x: np.ndarray, y: np.ndarray, release: Callable[[], None] | None, step: int = 1 << 24) -> bool:
    """Two stored buffers byte for byte, ``step`` bytes at a time, ``release()`` every
    :data:`RELEASE_BYTES` and at the end."""
    u, v = x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)
    if u.size != v.size:
        return False
    for lo in range(0, u.size, step):
        if not np.array_equal(u[lo : lo + step], v[lo : lo + step]):
            return False
        if release is not None and (lo + step) % RELEASE_BYTES == 0:
            release()
    if release is not None:
        release()
    return True


def _same_parts(mine: list[Any], other: "ValueSource", release: Callable[[], None] | None) -> bool:
    theirs = other.stored
    return (len(mine) == len(theirs) and all(x.key == y.key for x, y in zip(mine, theirs))
            and all(_equal_bytes(x.data, y.data, release) for x, y in zip(mine, theirs)))


def foreign_sources(checks: ForeignChecks, opened: Any, kind: str) -> list[ValueSource]:
    """The tensors of an opened GGUF model or safetensors file, as the Hurray import names them
    (an MX pair is one tensor), with their stored entries for the byte shortcut."""
    entries = checks.entries(opened)
    out = []
    for u in checks.units(opened):
        shape = tuple(int(n) for n in (u.shape or ()))
        parts = [entries[n] for n in u.parts]
        try:
            read, problem = _unit_reader(u, shape)
        except UnsupportedError as exc:
            read, problem = None, exc.message
        out.append(ValueSource(u.name, u.label, shape, read=read, problem=problem, kind=kind, stored=parts,
                               same=lambda other, release, parts=parts: _same_parts(parts, other, release)))
    return out


def _hurray_source(hf: HrryFile, name: str) -> ValueSource:
    t = hf.tensor(name)
    shape = tuple(t.shape)
    problem = "" if all(isinstance(n, int) for n in shape) else "dynamic dimensions"

    def same(other: ValueSource, release: Callable[[], None] | None, t: Tensor = t) -> bool:
        return _same_tensor_bytes(t, other.stored)  # (a composite's members: their own buffers)

    return ValueSource(name, t.describe(), tuple(-1 if n is None else int(n) for n in shape),
                       wins=lambda: windows(t, max_elements=WINDOW), same=same, problem=problem, kind="hurray", stored=t)


@contextmanager
def hurray_sources(path: str) -> Iterator[tuple[list[ValueSource], Callable[[], None]]]:
    """The top-level tensors of a .hrry (a composite is one tensor), and the page release."""
    with HrryFile(path) as hf:
        yield [_hurray_source(hf, n) for n in hf.top_level_names()], hf.release_pages


@contextmanager
def opened_sources(open_model: Callable[[str], Any], checks: ForeignChecks, path: str,
                   kind: str) -> Iterator[tuple[list[ValueSource], Callable[[], None]]]:
    """:func:`foreign_sources` of the model ``open_model(path)`` opens, while it is open."""
    with open_model(path) as m:
        yield foreign_sources(checks, m, kind), lambda: _release_pages(m)
