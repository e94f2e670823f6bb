"""The verification skeleton every foreign format shares.

* Round trip: import the source to Hurray and export it back in a temporary
  directory, compare the two files byte for byte, then per tensor compare the
  exported bytes with the source's and the shared dequantizer's values on the
  Hurray tensor with the source ecosystem's own decoder, bit for bit.
* Pair with Hurray: export the .hrry to the foreign format, then the same checks.
* Pair of two files of one format: bytes per tensor, metadata.

What differs per format -- how to read it, name an offset, list its tensors and
their reference decoders -- is a :class:`ForeignChecks` record, given to
:class:`ForeignVerifier` by the format's module (``verification/gguf.py``,
``verification/safetensors.py``); the registry hands the verifier out.

Values are compared on their float32 bit patterns.  The one documented
exception (docs/conversion-rules.md § 6): ggml decodes MXFP4 code 8 as +0 where
OCP/Hurray decode −0; a unit may declare +0 and −0 equal.
"""

from __future__ import annotations

import functools
import mmap
import os
import tempfile
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from ..core.hrry import HrryFile
from ..core.model import Tensor
from ..dequant import windows
from ..errors import ConversionRefused, HurrayInteropError, UsageError
from ..files.atomic import transient
from ..files.comparing import comparing
from ..kernels import DECODED_CHUNK, first_diff_bytes, first_diff_f32, thread_buffer
from ..parallel import in_background, pmap_items

__all__ = [
    "TensorCheck",
    "VerifyResult",
    "compare_values",
    "first_value_diff",
    "first_byte_diff",
    "RawEntry",
    "Unit",
    "ForeignChecks",
    "ForeignVerifier",
    "run_roundtrip",
    "scratch_dir",
    "reporting",
    "ORACLES",
    "using_oracle",
    "requested_oracle",
]

#: the ``progress(done, total)`` callback of the check running in this context (tensors
#: compared), set by :func:`reporting`
_PROGRESS: ContextVar[Callable[[int, int], None] | None] = ContextVar("verify_progress", default=None)


@contextmanager
def reporting(progress: Callable[[int, int], None] | None) -> Iterator[None]:
    """Inside the block, the value checks report ``progress(done, total)`` per tensor compared."""
    token = _PROGRESS.set(progress)
    try:
        yield
    finally:
        _PROGRESS.reset(token)

#: the reference decoders ``verify --oracle`` chooses from for GGUF tensors (the first is the
#: default where it loads): ggml's own C dequantizers, gguf-py's numpy ones
ORACLES = ("ggml", "gguf-py")

#: the oracle asked for in this context (None: the default), set by :func:`using_oracle`
_ORACLE: ContextVar[str | None] = ContextVar("verify_oracle", default=None)


def check_oracle(name: str | None) -> str | None:
    """``name`` if it is None or one of :data:`ORACLES`; else :class:`UsageError`."""
    if name is not None and name not in ORACLES:
        raise UsageError(f"--oracle must be one of {', '.join(ORACLES)}, not {name!r}")
    return name


@contextmanager
def using_oracle(name: str | None) -> Iterator[None]:
    """Inside the block, the value checks decode with the oracle ``name`` (None: the default)."""
    token = _ORACLE.set(check_oracle(name))
    try:
        yield
    finally:
        _ORACLE.reset(token)


def requested_oracle() -> str | None:
    """The oracle :func:`using_oracle` asked for here (None: the default)."""
    return _ORACLE.get()


#: elements compared per window: 4 MiB of float32 for the reference's window (a thread's
#: buffer; on the compiled path ours never makes one), memory bounded for any tensor.  The
#: value check of the 1 GB model, without the export: 2.0 s with 256 Ki, 1.8 s with 512 Ki,
#: 1.64 s with 1 Mi (Python per window and the per-window job hand-offs)
CHUNK_ROWS_ELEMENTS = 1 << 20

#: elements compared between two calls of ``release`` (bounds the mapped pages resident)
RELEASE_ELEMENTS = 1 << 22

Rows = Callable[[int, int], np.ndarray]


@dataclass
class TensorCheck:
    name: str
    source_type: str
    mapping: str
    bytes_equal: bool | None = None
    values_equal: bool | None = None
    max_abs_diff: float | None = None
    where: str = ""
    #: the conversion's own report explains the difference (a lossy or value-exact fallback
    #: the options asked for, proven to be what that conversion writes): e.g. "lossy as reported"
    reported: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.reported) or (self.bytes_equal is not False and self.values_equal is not False)


@dataclass
class VerifyResult:
    kind: str  # "round-trip" or "pair"
    source: str
    other: str | None = None
    source_format: str = ""
    tensors: list[TensorCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    file_bytes_equal: bool | None = None
    error: str | None = None
    #: what to do about the refused tensors (e.g. the option that checks them exactly), or ""
    hint: str = ""
    #: the reference decoder the values were compared with ("ggml", "gguf-py", "ml_dtypes"),
    #: "" when no values were compared; and what it is, with its version
    oracle: str = ""
    oracle_version: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and not self.problems and all(t.ok for t in self.tensors)

    def summary_line(self) -> str:
        what = self.source if self.other is None else f"{self.source} vs {self.other}"
        if self.error is not None:
            return f"ERROR  {self.error}" if self.error.startswith(self.source) else f"ERROR  {what}: {self.error}"
        n = len(self.tensors)
        bad = [t.name for t in self.tensors if not t.ok]
        if self.ok:
            files = "files byte-identical, " if self.file_bytes_equal else ""
            reported = [t for t in self.tensors if t.reported]
            unchecked = [t for t in self.tensors if not t.reported and t.values_equal is None]
            exact = n - len(reported) - len(unchecked)
            tensors = f"{exact} tensors exact (bytes and values)" if n else "no tensors (metadata only)"
            if unchecked:  # the oracle that ran has no decoder of their type: bytes only
                types = ", ".join(sorted({t.source_type for t in unchecked}))
                only = f"{len(unchecked)} exact in bytes only (values not checked: no decoder of {types} here)"
                tensors = f"{tensors}, {only}" if exact else only
            if reported:
                tensors += f", {len(reported)} {_as_reported(reported)}"
            return f"OK     {what}: {self.kind}{self._by()}, {files}{tensors}"
        parts = []
        refused = [t for t in self.tensors if t.mapping == "refused"]
        if refused:
            parts.append(f"{len(refused)} tensor(s) refused: no exact Hurray mapping (first: {refused[0].name}, "
                         f"{refused[0].source_type})" + (f" ({self.hint})" if self.hint else ""))
            bad = [t.name for t in self.tensors if not t.ok and t.mapping != "refused"]
        if self.file_bytes_equal is False:
            parts.append("files differ")
        if bad:
            parts.append(f"{len(bad)} of {n} tensors differ (first: {bad[0]})")
        if self.problems and not bad and not refused:
            parts.append(self.problems[0])
        return f"FAILED {what}: {self.kind}{self._by()}, " + "; ".join(parts)

    def _by(self) -> str:
        """" (oracle NAME)" when values were compared with a reference decoder."""
        return f" (oracle {self.oracle})" if self.oracle else ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        d["reported"] = sum(1 for t in self.tensors if t.reported)
        d["summary"] = self.summary_line()
        return d


def _as_reported(reported: list[TensorCheck]) -> str:
    """"3 lossy as reported (first: NAME, ...)": the tensors the conversion's report explains."""
    kinds = sorted({t.reported.split(" as reported")[0] for t in reported})
    return f"{'/'.join(kinds)} as reported (first: {reported[0].name}, {reported[0].reported.split(': ', 1)[-1]})"


# ---------------------------------------------------------------------------
# value comparison


def first_value_diff(a: np.ndarray, b: np.ndarray, *, signed_zero_equal: bool) -> tuple[int, float | None]:
    """Index of the first differing float32 bit pattern (−1 if none) and the max |a−b|."""
    a, b = a.reshape(-1), b.reshape(-1)
    first = first_diff_f32(a, b, signed_zero_equal)  # one pass in C; the rest only on a difference
    if first < 0:
        return -1, 0.0
    diff = a.view(np.uint32) != b.view(np.uint32)
    if signed_zero_equal:
        diff &= ~((a == 0) & (b == 0))
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    d = d[diff & np.isfinite(d)]
    return first, (float(d.max()) if d.size else None)


def compare_values(
    name: str,
    ours: Tensor,
    reference_rows: Rows,
    *,
    block: int = 1,
    signed_zero_equal: bool = False,
    row: int = 0,
    release: Callable[[], None] | None = None,
) -> tuple[bool, float | None, str]:
    """Compare the shared dequantizer on ``ours`` with a reference decoder, chunk by chunk.

    ``reference_rows(start, stop)`` returns the reference float32 values of the
    flattened rows ``start:stop`` of ``row`` elements each (0: rows run along the last
    axis; a GGUF reference decodes blocks).  Memory stays bounded by the chunk size
    whatever the tensor's size; ``release()``, if given, is called every
    :data:`RELEASE_ELEMENTS` values to drop the mapped pages read so far.
    Returns ``(equal, max_abs_diff, where)``; ``where`` locates the first difference.
    """
    shape = tuple(int(x) for x in ours.shape)
    ncols = max(shape[-1] if shape else 1, 1)
    unit = row or ncols
    worst: float | None = 0.0
    first = ""
    since = 0

    wins = windows(ours, max_elements=CHUNK_ROWS_ELEMENTS)  # validated here, in the caller's thread
    # a reference that can be run over its blocks in C (ggml's to_float: `decoded` = its address,
    # the blocks, values per block): ours and it are then compared 4096 values at a time
    decoded = getattr(reference_rows, "decoded", None)
    if decoded is not None and (not decoded[0] or decoded[2] != unit or decoded[2] > DECODED_CHUNK):
        decoded = None

    def check(span: tuple[int, int, tuple]) -> tuple[int, int, int, float | None, tuple[float, float]]:
        """One window: our values (into this thread's buffer) against the reference's: its
        size, the first difference (−1: none), the max |a−ref| and the two values there.  Both
        windows are buffers reused by this thread: only scalars leave this call."""
        lo, n, region = span
        hi = lo + n
        r0, r1 = lo // unit, -(-hi // unit)
        if decoded is not None and lo % unit == 0 and hi % unit == 0:
            if wins.first_diff_decoded(region, decoded[0], decoded[1][r0:r1], unit, signed_zero_equal) == -1:
                return lo, n, -1, 0.0, (0.0, 0.0)  # (a difference: located below, from the windows)
        ref = np.asarray(reference_rows(r0, r1), dtype=np.float32).reshape(-1)[lo - r0 * unit : hi - r0 * unit]
        ref = np.ascontiguousarray(ref)
        if wins.first_diff(region, ref, signed_zero_equal) == -1:  # compiled: compared as computed
            return lo, n, -1, 0.0, (0.0, 0.0)
        a = wins.fill(region, thread_buffer("verify.ours", (CHUNK_ROWS_ELEMENTS,), np.float32)[:n])
        idx, mad = first_value_diff(a, ref, signed_zero_equal=signed_zero_equal)
        return lo, n, idx, mad, ((float(a[idx]), float(ref[idx])) if idx >= 0 else (0.0, 0.0))

    # every window is one job: our dequantizer and the reference decode it on the same thread,
    # parallel.jobs() threads at once (numpy and ctypes release the GIL), results in order
    for lo, size, idx, mad, (ov, rv) in pmap_items(check, (sp for sp in wins.spans() if sp[1])):
        since += size
        if release is not None and since >= RELEASE_ELEMENTS:
            release()
            since = 0
        if idx < 0:
            continue
        worst = None if (mad is None or worst is None) else max(worst, mad)
        if not first:
            at = lo + idx
            row, col = divmod(at, ncols)
            blk = f"block {at // block}, element {at % block}" if block > 1 else f"element {at}"
            first = f"{blk} (row {row}, column {col}): ours {ov!r} vs reference {rv!r}"
    return (not first), worst, first


# ---------------------------------------------------------------------------
# byte comparison with located differences


def first_byte_diff(a_path: str, b_path: str) -> tuple[int, int, int] | None:
    """``(offset, size_a, size_b)`` of the first differing byte, or None if identical.

    Compares memory maps of both files :data:`FILE_STEP` bytes at a time (a read would copy
    every byte once more; 1 GB against its copy in the page cache: 0.17 s, reads 1.1 s) and
    drops each step's pages from the process's resident set after comparing it."""
    sa, sb = os.path.getsize(a_path), os.path.getsize(b_path)
    n = min(sa, sb)
    if n:
        with open(a_path, "rb") as fa, open(b_path, "rb") as fb, \
                mmap.mmap(fa.fileno(), n, access=mmap.ACCESS_READ) as ma, \
                mmap.mmap(fb.fileno(), n, access=mmap.ACCESS_READ) as mb:
            at = _first_mapped_diff(ma, mb, n)
            if at is not None:
                return at, sa, sb
    return None if sa == sb else (n, sa, sb)


#: bytes compared per step of :func:`first_byte_diff`
FILE_STEP = 1 << 24


def _first_mapped_diff(ma: mmap.mmap, mb: mmap.mmap, n: int) -> int | None:
    x, y = np.frombuffer(ma, np.uint8, n), np.frombuffer(mb, np.uint8, n)

    def drop(lo: int, size: int) -> None:  # resident memory stays bounded for any size
        ma.madvise(mmap.MADV_DONTNEED, lo, size)
        mb.madvise(mmap.MADV_DONTNEED, lo, size)

    try:
        return _first_unequal(x, y, FILE_STEP, drop if hasattr(mmap, "MADV_DONTNEED") else None)
    finally:
        del x, y  # no view may outlive the maps (closing them would fail)


def _first_unequal(x: np.ndarray, y: np.ndarray, step: int,
                   after: Callable[[int, int], None] | None = None) -> int | None:
    """Index of the first differing item of two equal-length 1-D arrays, compared ``step``
    items at a time (cache-sized temporaries); None when equal.  ``after(lo, size)`` runs
    after each equal step."""
    for lo in range(0, x.size, step):
        xs, ys = x[lo : lo + step], y[lo : lo + step]
        i = first_diff_bytes(xs, ys)  # memcmp in C for bytes
        if i >= 0:
            return lo + i
        if after is not None:
            after(lo, xs.size)
    return None


@dataclass(frozen=True)
class RawEntry:
    """One stored tensor of a foreign file, as bytes."""

    label: str  # its type as the format names it
    key: tuple[Any, ...]  # type and shape: entries with different keys differ
    data: np.ndarray  # the stored bytes (uint8 view)
    offset: int  # absolute file offset of ``data``
    where: Callable[[int], str]  # names a byte offset inside ``data`` (e.g. block and byte)


#: bytes compared per step of :func:`compare_entries` (cache-sized temporaries)
CHUNK_BYTES = 1 << 20


def compare_entries(
    a: RawEntry, b: RawEntry, *, same_offsets_equal: bool = False, release: Callable[[], None] | None = None
) -> tuple[bool, str]:
    """Whether two stored tensors hold the same type, shape and bytes; where they first differ.
    ``same_offsets_equal``: the files are known identical, so equal offsets mean equal bytes.
    Compares :data:`CHUNK_BYTES` at a time; ``release()`` drops the mapped pages read so far."""
    if a.key != b.key:
        return False, f"stored as {b.label} {list(b.key[1:])}, not {a.label} {list(a.key[1:])}"
    if same_offsets_equal and a.offset == b.offset:
        return True, ""
    x, y = a.data.reshape(-1), b.data.reshape(-1)
    if x.size != y.size:
        return False, a.where(min(x.size, y.size))

    def every_release_step(lo: int, size: int) -> None:
        if lo % (RELEASE_ELEMENTS * 4) == 0:
            release()  # type: ignore[misc]

    at = _first_unequal(x, y, CHUNK_BYTES, every_release_step if release is not None else None)
    return (True, "") if at is None else (False, a.where(at))


@dataclass(frozen=True)
class Unit:
    """A source's tensor as the Hurray file holds it: the stored entries ``parts`` it came
    from, and ``reference()`` -- the source ecosystem's decoder over its rows, or None
    when there is none to compare with."""

    name: str
    label: str
    parts: tuple[str, ...]
    reference: Callable[[], Rows | None]
    block: int = 1
    signed_zero_equal: bool = False
    row: int = 0  # elements per row of ``reference()`` (0: the last axis; see compare_values)
    shape: tuple[int, ...] | None = None  # the shape the Hurray tensor must have (None: not checked)
    #: other names the Hurray tensor may have (a convention that renames it on export)
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class ForeignChecks:
    """What the skeleton needs to know about one foreign format."""

    title: str  # "re-exported GGUF differs ..."
    exported_as: str  # "the Hurray file exports to a GGUF that differs ..."
    no_exact: str  # "N tensor(s) have no exact GGUF equivalent"
    open: Callable[[str], Any]  # the reader, a context manager
    locate: Callable[[Any, int], str]  # what lies at a file offset
    metadata_diffs: Callable[[Any, Any], list[str]]  # metadata differences of two opened files
    entries: Callable[[Any], dict[str, RawEntry]]  # stored tensors by name, in file order
    units: Callable[[Any], Iterator[Unit]]  # the tensors as imported to Hurray
    #: the hint for tensors a round trip's import refused, from their source types ("": none)
    refusal_hint: Callable[[list[str]], str] = lambda types: ""
    #: the reference decoder the value checks run: its name and what it is, with its version
    oracle: Callable[[], tuple[str, str]] = lambda: ("", "")


def _release_pages(*files: Any) -> None:
    """Bounded resident memory while streaming (see GGUFFile.release_pages)."""
    for f in files:
        release = getattr(f, "release_pages", None)
        if release is not None:
            release()


#: what :meth:`ForeignVerifier.values` found: per unit its check and whether the Hurray file has
#: it, the names only the Hurray file has, whether any values were compared
Checked = tuple[list[tuple[Unit, TensorCheck, bool]], list[str], bool]


class ForeignVerifier:
    """Round trip and pair checks of one foreign format (the registry's ``verifier``)."""

    def __init__(self, checks: ForeignChecks) -> None:
        self.checks = checks

    def _where(self, f: Any, diff: tuple[int, int, int], end: str) -> str:
        off, sa, sb = diff
        return self.checks.locate(f, off) if off < sa else end.format(sa=sa, sb=sb)

    def against_hurray(
        self, src: Any, hf: HrryFile, result: VerifyResult, exported: Any, *, files_equal: bool, hurray_label: str
    ) -> None:
        """Per tensor: bytes of the export against the source, values of ours against the
        reference decoder; tensors the Hurray file has beyond the source's are a problem."""
        self.finish(src, self.values(src, hf), result, exported, files_equal=files_equal, hurray_label=hurray_label)

    def values(self, src: Any, hf: HrryFile) -> "Checked":
        """The value checks of every unit (ours against the reference decoder): needs no
        export, so it runs while the export is written.  Also the names only ``hf`` has, and
        whether any values were compared."""
        done: list[tuple[Unit, TensorCheck, bool]] = []
        compared = False
        known: set[str] = set()
        units, step = list(self.checks.units(src)), _PROGRESS.get()
        for i, u in enumerate(units):
            if step is not None:
                step(i, len(units))
            _release_pages(src, hf)
            name = next((n for n in (u.name, *u.aliases) if n in hf), None)
            known.add(u.name if name is None else name)
            chk = TensorCheck(u.name, u.label, "-")
            done.append((u, chk, name is not None))
            if name is None:
                chk.values_equal, chk.where = False, "missing from the Hurray file"
                continue
            t = hf.tensor(name)
            chk.mapping = t.describe()
            shape = tuple(int(x) for x in t.shape)
            if u.shape is not None and shape != u.shape:  # another model's tensor of that name
                chk.values_equal, chk.where = False, f"shape {list(shape)} in the Hurray file, {list(u.shape)} in the source"
                continue
            ref = u.reference()
            if ref is None:
                continue
            compared = True
            chk.values_equal, chk.max_abs_diff, chk.where = compare_values(
                u.name, t, ref, block=u.block, signed_zero_equal=u.signed_zero_equal, row=u.row,
                release=functools.partial(_release_pages, src, hf),
            )
        if step is not None:
            step(len(units), len(units))
        return done, [n for n in hf.top_level_names() if n not in known], compared

    def finish(
        self, src: Any, checked: "Checked", result: VerifyResult,
        exported: Any, *, files_equal: bool, hurray_label: str,
    ) -> None:
        """Add the export's byte checks to the value checks ``checked`` and record them all."""
        done, extra, compared = checked
        if exported is not None:
            src_entries, exp_entries = self.checks.entries(src), self.checks.entries(exported)
            release = functools.partial(_release_pages, src, exported)
            for u, chk, in_hurray in done:
                release()
                if in_hurray:
                    eq, where = self._export_bytes(u, src_entries, exp_entries, files_equal, release)
                    chk.bytes_equal, chk.where = eq, (where or chk.where)
        result.tensors.extend(chk for _, chk, _ in done)
        if compared:
            result.oracle, result.oracle_version = self.checks.oracle()
        if extra:
            result.problems.append(f"tensors only in {hurray_label}: {', '.join(extra[:5])}")

    @staticmethod
    def _export_bytes(
        u: Unit, src_entries: dict[str, RawEntry], exp_entries: dict[str, RawEntry], files_equal: bool,
        release: Callable[[], None],
    ) -> tuple[bool, str]:
        for n in u.parts:
            other = exp_entries.get(n)
            eq, where = (False, "missing after export") if other is None else compare_entries(
                src_entries[n], other, same_offsets_equal=files_equal, release=release
            )
            if not eq:
                return False, (f"{n!r} {where}" if len(u.parts) > 1 else where)
        return True, ""

    def roundtrip(self, path: str, result: VerifyResult, fmt: Any) -> None:
        """``fmt`` (the registry record) -> .hrry -> ``fmt`` in a temporary directory."""
        c = self.checks

        def check(mid: str, back: str, exported_diff: Callable[[], tuple[int, int, int] | None]) -> None:
            with c.open(path) as src, HrryFile(mid) as hf:
                checked = self.values(src, hf)  # while the export is written
                diff = exported_diff()
                # an export found byte-identical as it was made was never written: the source
                # stands for it
                with c.open(back if diff is not None or os.path.exists(back) else path) as exported:
                    if diff is not None:
                        where = self._where(src, diff, "end of file (source {sa} bytes, result {sb} bytes)")
                        result.problems.append(f"re-exported {c.title} differs from the source first at {where}")
                        result.problems.extend(c.metadata_diffs(src, exported))
                    self.finish(src, checked, result, exported, files_equal=diff is None, hurray_label="the Hurray file")

        run_roundtrip(
            path,
            result,
            to_hurray=fmt.to_hurray,  # threads: the enclosing parallel.use_jobs
            from_hurray=fmt.from_hurray,
            suffix=fmt.extensions[0],
            check=check,
            hint=c.refusal_hint,
        )

    def pair_with_hurray(
        self, path: str, fmt: Any, hrry_path: str, result: VerifyResult, *,
        export_options: dict[str, Any] | None = None, explained: frozenset[str] = frozenset(),
    ) -> Any:
        """Compare a file of this format with a .hrry: export the .hrry (with ``export_options``,
        those of the conversion that wrote ``path`` from it), compare files and tensors.
        ``explained``: tensors the import's report says it stored differently (a fallback, proven
        to be what that import writes): their export refusal and the file difference they make
        are expected.  Returns the export's report (None when it was refused)."""
        with scratch_dir() as tmp:
            back, report, same = self.export_compared(hrry_path, fmt, os.path.join(tmp, "export" + fmt.extensions[0]),
                                                      path, result, export_options, explained)
            self.compare_export(path, back, hrry_path, result, explained, identical=same)
        return report

    def export_compared(self, hrry_path: str, fmt: Any, back: str, reference: str, result: VerifyResult,
                        export_options: dict[str, Any] | None, explained: frozenset[str]) -> tuple[str, Any, bool]:
        """:meth:`export`, its bytes compared with ``reference`` as they are made
        (files.comparing): ``(back, report, True)`` when the export is ``reference`` byte for
        byte -- then nothing was written --, else the export written to ``back`` as
        :meth:`export` writes it and False."""
        with comparing(back, reference) as sink:
            out, report = self.export(hrry_path, fmt, back, result, export_options, explained)
        if not out or not sink.used or os.path.exists(back):
            return out, report, False  # refused, or written by a writer that took no comparer
        if sink.definitive and sink.difference() is None:
            return back, report, True
        out, report = self.export(hrry_path, fmt, back, result, export_options, explained)  # for the located report
        return out, report, False

    def export(self, hrry_path: str, fmt: Any, back: str, result: VerifyResult,
               export_options: dict[str, Any] | None, explained: frozenset[str]) -> tuple[str, Any]:
        """Export ``hrry_path`` to ``back``: ``(back, report)``, or ``("", None)`` when refused."""
        try:
            return back, fmt.from_hurray(hrry_path, back, **(export_options or {}))
        except ConversionRefused as exc:
            if not {name for name, _, _ in exc.reasons} <= explained:
                result.problems.append(f"{hrry_path}: {len(exc.reasons)} tensor(s) have {self.checks.no_exact}")
            return "", None

    def compare_export(self, path: str, back: str, hrry_path: str, result: VerifyResult,
                       explained: frozenset[str] = frozenset(), *, identical: bool = False) -> None:
        """The files ``path`` and ``back`` (the export of ``hrry_path``; "" when refused), and
        every tensor of ``path`` against the .hrry's and the export's.  ``identical``: the
        export was found to be ``path`` byte for byte as it was made (:meth:`export_compared`;
        ``back`` was never written, ``path`` stands for it)."""
        c = self.checks
        diff = None if identical else first_byte_diff(path, back) if back else None
        if back and not explained:
            result.file_bytes_equal = diff is None
        with ExitStack() as stack:
            src = stack.enter_context(c.open(path))
            hf = stack.enter_context(HrryFile(hrry_path))
            exported = stack.enter_context(c.open(path if identical else back)) if back else None
            if diff is not None and not explained:
                where = self._where(src, diff, "end of file ({sa} vs {sb} bytes)")
                result.problems.append(f"the Hurray file exports to {c.exported_as} that differs first at {where}")
                result.problems.extend(c.metadata_diffs(src, exported))
            self.against_hurray(src, hf, result, exported, files_equal=False, hurray_label=hrry_path)

    def pair_same(self, a: str, b: str, result: VerifyResult) -> None:
        """Compare two files of this format: first differing byte, metadata, tensor bytes."""
        c = self.checks
        diff = first_byte_diff(a, b)
        result.file_bytes_equal = diff is None
        with c.open(a) as fa, c.open(b) as fb:
            if diff is not None:
                result.problems.append(f"files differ first at {self._where(fa, diff, 'end of file ({sa} vs {sb} bytes)')}")
                result.problems.extend(c.metadata_diffs(fa, fb))
            self.pair_tensors(fa, fb, b, result)

    def pair_tensors(self, fa: Any, fb: Any, b: str, result: VerifyResult) -> None:
        """Every stored tensor of ``fa`` against the one of that name in ``fb`` (opened; ``b`` names it)."""
        ea, eb = self.checks.entries(fa), self.checks.entries(fb)
        for name, e in ea.items():
            chk = TensorCheck(name, e.label, "-")
            result.tensors.append(chk)
            o = eb.get(name)
            chk.bytes_equal, chk.where = (False, f"missing from {b}") if o is None else compare_entries(e, o)
        extra = [n for n in eb if n not in ea]
        if extra:
            result.problems.append(f"tensors only in {b}: {', '.join(extra[:5])}")


@contextmanager
def scratch_dir() -> Iterator[str]:
    """A temporary directory for verify's copies (round trips, exports to compare), deleted on
    leaving; every output written inside the block -- by this thread or a worker started in
    its context (:func:`~hurray_interop.parallel.in_background`) -- is transient
    (:func:`~hurray_interop.files.atomic.transient`): never sent to the disk on purpose."""
    with tempfile.TemporaryDirectory(prefix="hurray-interop-verify-") as tmp, transient():
        yield tmp


def run_roundtrip(
    path: str,
    result: VerifyResult,
    *,
    to_hurray: Callable[[str, str], Any],
    from_hurray: Callable[[str, str], Any],
    suffix: str,
    check: Callable[[str, str, Callable[[], tuple[int, int, int] | None]], None],
    compare: Callable[[str, str], Any] = first_byte_diff,
    hint: Callable[[list[str]], str] = lambda types: "",
) -> None:
    """Import ``path`` to Hurray, then ``check(hurray_copy, exported_copy, first_difference)``
    while a worker thread exports the copy back (in a temporary directory) and compares
    the files (``compare(path, exported)``: None when identical): ``first_difference()``
    waits for that and returns its result.  A refused import gives one refused row per tensor,
    and ``hint(source types)`` says what to do about them."""
    with scratch_dir() as tmp:
        mid = os.path.join(tmp, "roundtrip.hrry")
        back = os.path.join(tmp, "roundtrip" + suffix)
        try:
            try:
                to_hurray(path, mid)
            except ConversionRefused as exc:
                for name, typ, reason in exc.reasons:
                    result.tensors.append(TensorCheck(name, typ, "refused", values_equal=False, where=reason))
                result.problems.append(f"{len(exc.reasons)} tensor(s) cannot be converted exactly" if exc.reasons
                                       else exc.message)  # refused as a whole (e.g. GGUF padding beyond the record limit)
                result.hint = hint([typ for _, typ, _ in exc.reasons])
                return

            def export() -> tuple[int, int, int] | None:
                if compare is first_byte_diff:  # one file: compare the bytes as the export makes them
                    with comparing(back, path) as sink:
                        from_hurray(mid, back)
                    if sink.definitive and sink.difference() is None:
                        return None  # byte-identical, and nothing was written
                    if os.path.exists(back):  # the writer did not take the comparer
                        return compare(path, back)
                    # a difference (or bytes the comparer could not account for): write the
                    # export for real, for the located report
                from_hurray(mid, back)
                return compare(path, back)

            with in_background(export) as exported:  # (in this context: transient too)

                def first_difference() -> tuple[int, int, int] | None:
                    diff = exported()
                    result.file_bytes_equal = diff is None
                    return diff

                check(mid, back, first_difference)
        except HurrayInteropError as exc:
            if exc.path is not None and exc.path.startswith(tmp):
                # name the user's file, not our temporary copy that is about to vanish
                exc.message = f"{exc.message} (in the round-trip copy {os.path.basename(exc.path)})"
                exc.path = None
                exc.located(path=path)
            raise
