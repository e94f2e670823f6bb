"""Proof that nothing changed: round trips and pairwise comparisons.

* :func:`verify_roundtrip` — convert a source (.gguf, .safetensors) to Hurray
  and back in a temporary directory, compare the result with the source byte
  for byte, and compare, per tensor, the shared dequantizer's values on the
  Hurray tensor with the source ecosystem's own decoder (gguf-py's
  ``gguf.quants.dequantize`` for GGUF; torch/ml_dtypes for MX), bit for bit.
* :func:`verify_pair` — compare two given files of any supported pair.
* :func:`verify_files` — what the ``verify`` command runs.

Values are compared on their float32 bit patterns.  The one documented
exception (docs/conversion-rules.md § 6): ggml decodes MXFP4 code 8 as +0 where
OCP/Hurray decode −0; for GGUF MXFP4 tensors +0 and −0 compare equal.
"""

from __future__ import annotations

import functools
import os
import tempfile
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .convert import detect_format
from .parallel import prefetch_chunks
from .core.hrry import HrryFile
from .core.model import Tensor
from .dequant import dequantize, iter_dequantize
from .errors import ConversionRefused, HurrayInteropError, UsageError
from .formats import gguf as G

__all__ = ["TensorCheck", "VerifyResult", "verify_roundtrip", "verify_pair", "verify_files", "compare_values"]

#: threads of the verification running in this context (None: each part's default)
_JOBS: ContextVar[int | None] = ContextVar("hurray_interop_verify_jobs", default=None)

#: elements compared per chunk (bounds memory for any tensor)
CHUNK_ROWS_ELEMENTS = 1 << 22


@dataclass
class TensorCheck:
    name: str
    source_type: str
    mapping: str
    bytes_equal: bool | None = None
    values_equal: bool | None = None
    max_abs_diff: float | None = None
    where: str = ""

    @property
    def ok(self) -> bool:
        return self.bytes_equal is not False and self.values_equal is not False


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
            tensors = f"{n} tensors exact (bytes and values)" if n else "no tensors (metadata only)"
            return f"OK     {what}: {self.kind}, {files}{tensors}"
        parts = []
        refused = [t for t in self.tensors if t.mapping == "refused"]
        if refused:
            parts.append(f"{len(refused)} tensor(s) refused: no exact Hurray mapping (first: {refused[0].name}, {refused[0].source_type})")
            bad = [t.name for t in self.tensors if not t.ok and t.mapping != "refused"]
        if self.file_bytes_equal is False:
            parts.append("files differ")
        if bad:
            parts.append(f"{len(bad)} of {n} tensors differ (first: {bad[0]})")
        if self.problems and not bad and not refused:
            parts.append(self.problems[0])
        return f"FAILED {what}: {self.kind}, " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        d["summary"] = self.summary_line()
        return d


# ---------------------------------------------------------------------------
# value comparison


def _first_diff(a: np.ndarray, b: np.ndarray, *, signed_zero_equal: bool) -> tuple[int, float | None]:
    """Index of the first differing float32 bit pattern (−1 if none) and the max |a−b|."""
    ab, bb = a.view(np.uint32), b.view(np.uint32)
    diff = ab != bb
    if signed_zero_equal:
        diff &= ~((a == 0) & (b == 0))
    if not diff.any():
        return -1, 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    d = d[diff & np.isfinite(d)]
    return int(np.argmax(diff)), (float(d.max()) if d.size else None)


def compare_values(
    name: str,
    ours: Tensor,
    reference_rows: Callable[[int, int], np.ndarray],
    *,
    block: int = 1,
    signed_zero_equal: bool = False,
) -> tuple[bool, float | None, str]:
    """Compare the shared dequantizer on ``ours`` with a reference decoder, chunk by chunk.

    ``reference_rows(start, stop)`` returns the reference float32 values of the
    flattened outer rows ``start:stop`` (rows run along the last axis).  Memory
    stays bounded by the chunk size whatever the tensor's size.
    Returns ``(equal, max_abs_diff, where)``; ``where`` locates the first difference.
    """
    shape = tuple(int(x) for x in ours.shape)
    ncols = max(shape[-1] if shape else 1, 1)
    worst: float | None = 0.0
    first = ""
    flat = 0
    # our dequantizer produces chunk k+1 in a worker thread while the reference decodes and
    # compares chunk k (numpy releases the GIL: the two decoders share the cores)
    chunks = iter_dequantize(ours, max_elements=CHUNK_ROWS_ELEMENTS, threads=_JOBS.get())
    for _, values in prefetch_chunks(chunks, 1):
        a = values.reshape(-1)
        lo, hi = flat, flat + a.size
        flat = hi
        if not a.size:
            continue
        r0, r1 = lo // ncols, -(-hi // ncols)
        ref = np.asarray(reference_rows(r0, r1), dtype=np.float32).reshape(-1)[lo - r0 * ncols : hi - r0 * ncols]
        idx, mad = _first_diff(a, np.ascontiguousarray(ref), signed_zero_equal=signed_zero_equal)
        if idx < 0:
            continue
        worst = None if (mad is None or worst is None) else max(worst, mad)
        if not first:
            at = lo + idx
            row, col = divmod(at, ncols)
            blk = f"block {at // block}, element {at % block}" if block > 1 else f"element {at}"
            first = f"{blk} (row {row}, column {col}): ours {float(a[idx])!r} vs reference {float(ref[idx])!r}"
    return (not first), worst, first


def _gguf_reference(info: "G.GGUFTensorInfo") -> Callable[[int, int], np.ndarray]:
    """gguf-py's decoder over rows of a GGUF tensor (numpy's cast for plain types)."""
    t = info.ggml_type
    dt = t.dtype()
    ncols = info.ne[0] if info.ne else 1
    if dt is not None:
        flat = info.data.view(dt)

        def plain(start: int, stop: int) -> np.ndarray:
            return flat[start * ncols : stop * ncols].astype(np.float32)

        return plain
    from .conversions.gguf import reference_dequantizer

    decode = reference_dequantizer(t)
    assert decode is not None  # callers check _has_reference first
    row_bytes = ncols // t.block_elements * t.block_bytes
    rows = info.data.reshape(-1, row_bytes) if row_bytes else info.data.reshape(0, 1)

    def quant(start: int, stop: int) -> np.ndarray:
        return decode(rows[start:stop])

    return quant


# ---------------------------------------------------------------------------
# byte comparison with located differences


def first_byte_diff(a_path: str, b_path: str) -> tuple[int, int, int] | None:
    """``(offset, size_a, size_b)`` of the first differing byte, or None if identical.

    Reads both files in chunks (bounded memory, no mapping to leak)."""
    sa, sb = os.path.getsize(a_path), os.path.getsize(b_path)
    step = 16 << 20
    with open(a_path, "rb") as fa, open(b_path, "rb") as fb:
        off = 0
        while True:
            x, y = fa.read(step), fb.read(step)
            if not x or not y:
                break
            if x != y:
                n = min(len(x), len(y))
                xa, ya = np.frombuffer(x, np.uint8, n), np.frombuffer(y, np.uint8, n)
                ne = xa != ya
                if ne.any():
                    return off + int(np.argmax(ne)), sa, sb
            off += min(len(x), len(y))
    return None if sa == sb else (min(sa, sb), sa, sb)


def _locate_gguf(gf: "G.GGUFFile", offset: int) -> str:
    """Say what lies at ``offset`` of a GGUF file: header, a metadata key, a tensor block."""
    if offset < 24:
        return f"header (offset {offset})"
    keys = sorted(gf.kv_offsets.items(), key=lambda kv: kv[1])
    if offset < gf.tensor_infos_offset:
        name = next((k for k, o in reversed(keys) if o <= offset), None)
        return f"metadata key {name!r} (offset {offset})"
    if offset < gf.metadata_end:
        name = next((t.name for t in reversed(gf.tensors) if t.info_offset <= offset), None)
        return f"tensor info of {name!r} (offset {offset})"
    for t in gf.tensors:
        if t.data_offset <= offset < t.data_offset + t.nbytes:
            rel = offset - t.data_offset
            bt = t.ggml_type
            if bt.block_elements > 1:
                return f"tensor {t.name!r} block {rel // bt.block_bytes}, byte {rel % bt.block_bytes} (offset {offset})"
            return f"tensor {t.name!r} element {rel // bt.block_bytes} (offset {offset})"
    return f"padding (offset {offset})"


def _kv_type_diffs(a: "G.GGUFFile", b: "G.GGUFFile") -> list[str]:
    out = []
    ka, kb = list(a.kv), list(b.kv)
    if ka != kb:
        missing = [k for k in ka if k not in b.kv]
        extra = [k for k in kb if k not in a.kv]
        if missing:
            out.append(f"metadata keys missing: {', '.join(missing[:5])}")
        if extra:
            out.append(f"metadata keys added: {', '.join(extra[:5])}")
        if not missing and not extra:
            out.append("metadata key order differs")
    for k in ka:
        if k in b.kv:
            va, vb = a.kv[k], b.kv[k]
            if va.type != vb.type or va.element_type != vb.element_type:
                out.append(f"metadata key {k!r}: type {_vt(va)} vs {_vt(vb)}")
            elif va != vb:
                out.append(f"metadata key {k!r}: value differs")
    if a.version != b.version:
        out.append(f"GGUF version {a.version} vs {b.version}")
    return out


def _vt(v: "G.GGUFValue") -> str:
    if v.type == G.ValueType.ARRAY and v.element_type is not None:
        return f"ARRAY[{v.element_type.name}]"
    return v.type.name


# ---------------------------------------------------------------------------
# GGUF


def _check_gguf_against_hurray(
    src: "G.GGUFFile", hf: HrryFile, result: VerifyResult, exported: "G.GGUFFile | None", *, files_equal: bool = False
) -> None:
    """Per tensor: bytes of the export against the source, values of ours against gguf-py.
    ``files_equal``: the whole files are known byte-identical (every tensor's bytes are then
    equal, so they are not compared a second time)."""
    exp = {t.name: t for t in exported.tensors} if exported is not None else {}
    for info in src.tensors:
        for f in (src, hf, exported):  # bounded resident memory (see GGUFFile.release_pages)
            if f is not None:
                f.release_pages()
        chk = TensorCheck(name=info.name, source_type=info.type_name, mapping="-")
        result.tensors.append(chk)
        if info.name not in hf:
            chk.values_equal = False
            chk.where = "missing from the Hurray file"
            continue
        t = hf.tensor(info.name)
        chk.mapping = t.describe()
        e = exp.get(info.name)
        if exported is not None:
            chk.bytes_equal = e is not None and e.type_id == info.type_id and e.ne == info.ne and (
                (files_equal and e.offset == info.offset) or bool(np.array_equal(e.data, info.data))
            )
            if not chk.bytes_equal and e is not None and e.nbytes == info.nbytes:
                bt = info.ggml_type
                rel = int(np.argmax(e.data != info.data))
                chk.where = (
                    f"block {rel // bt.block_bytes}, byte {rel % bt.block_bytes}" if bt.block_elements > 1 else f"byte {rel}"
                )
            elif not chk.bytes_equal:
                chk.where = "exported with a different type or shape" if e is not None else "missing after export"
        if info.ggml_type.dtype() is None and not _has_reference(info):
            chk.values_equal = None
            continue
        eq, mad, where = compare_values(
            info.name,
            t,
            _gguf_reference(info),
            block=info.ggml_type.block_elements,
            signed_zero_equal=info.type_name == "MXFP4",
        )
        chk.values_equal, chk.max_abs_diff = eq, mad
        if where and not chk.where:
            chk.where = where


def _has_reference(info: "G.GGUFTensorInfo") -> bool:
    from .conversions.gguf import reference_dequantizer

    return reference_dequantizer(info.ggml_type) is not None


def run_roundtrip(
    path: str,
    result: VerifyResult,
    *,
    to_hurray: Callable[[str, str], Any],
    from_hurray: Callable[[str, str], Any],
    suffix: str,
    check: Callable[[str, str, tuple[int, int, int] | None], None],
) -> None:
    """Import ``path`` to Hurray and export it back in a temporary directory, compare the
    files byte for byte, then ``check(hurray_copy, exported_copy, first_difference)``."""
    with tempfile.TemporaryDirectory(prefix="hurray-interop-verify-") as tmp:
        mid = os.path.join(tmp, "roundtrip.hrry")
        back = os.path.join(tmp, "roundtrip" + suffix)
        try:
            try:
                to_hurray(path, mid)
            except ConversionRefused as exc:
                for name, typ, reason in exc.reasons:
                    result.tensors.append(TensorCheck(name, typ, "refused", values_equal=False, where=reason))
                result.problems.append(f"{len(exc.reasons)} tensor(s) cannot be converted exactly")
                return
            from_hurray(mid, back)
            diff = first_byte_diff(path, back)
            result.file_bytes_equal = diff is None
            check(mid, back, diff)
        except HurrayInteropError as exc:
            if exc.path is not None and exc.path.startswith(tmp):
                # name the user's file, not our temporary copy that is about to vanish
                exc.message = f"{exc.message} (in the round-trip copy {os.path.basename(exc.path)})"
                exc.path = None
                exc.located(path=path)
            raise


def _roundtrip_gguf(path: str, result: VerifyResult) -> None:
    from .conversions.gguf import gguf_to_hurray, hurray_to_gguf

    def check(mid: str, back: str, diff: tuple[int, int, int] | None) -> None:
        with G.read_gguf(path) as src, G.read_gguf(back) as exported, HrryFile(mid) as hf:
            if diff is not None:
                off, sa, sb = diff
                where = _locate_gguf(src, off) if off < sa else f"end of file (source {sa} bytes, result {sb} bytes)"
                result.problems.append(f"re-exported GGUF differs from the source first at {where}")
                result.problems.extend(_kv_type_diffs(src, exported))
            _check_gguf_against_hurray(src, hf, result, exported, files_equal=diff is None)

    jobs = _JOBS.get()
    run_roundtrip(
        path,
        result,
        to_hurray=functools.partial(gguf_to_hurray, jobs=jobs),
        from_hurray=functools.partial(hurray_to_gguf, jobs=jobs),
        suffix=".gguf",
        check=check,
    )


def _pair_gguf_hurray(gguf_path: str, hrry_path: str, result: VerifyResult) -> None:
    from .conversions.gguf import hurray_to_gguf

    with tempfile.TemporaryDirectory(prefix="hurray-interop-verify-") as tmp:
        back = os.path.join(tmp, "export.gguf")
        try:
            hurray_to_gguf(hrry_path, back, jobs=_JOBS.get())
        except ConversionRefused as exc:
            result.problems.append(f"{hrry_path}: {len(exc.reasons)} tensor(s) have no exact GGUF equivalent")
            back = ""
        if back:
            diff = first_byte_diff(gguf_path, back)
            result.file_bytes_equal = diff is None
        with G.read_gguf(gguf_path) as src, HrryFile(hrry_path) as hf:
            exported = G.read_gguf(back) if back else None
            try:
                if back and diff is not None:
                    off, sa, sb = diff
                    where = _locate_gguf(src, off) if off < sa else f"end of file ({sa} vs {sb} bytes)"
                    result.problems.append(f"the Hurray file exports to a GGUF that differs first at {where}")
                    result.problems.extend(_kv_type_diffs(src, exported))  # type: ignore[arg-type]
                _check_gguf_against_hurray(src, hf, result, exported)
                extra = [n for n in hf.top_level_names() if n not in {t.name for t in src.tensors}]
                if extra:
                    result.problems.append(f"tensors only in {hrry_path}: {', '.join(extra[:5])}")
            finally:
                if exported is not None:
                    exported.close()


def _pair_gguf_gguf(a: str, b: str, result: VerifyResult) -> None:
    diff = first_byte_diff(a, b)
    result.file_bytes_equal = diff is None
    with G.read_gguf(a) as ga, G.read_gguf(b) as gb:
        if diff is not None:
            off, sa, sb = diff
            where = _locate_gguf(ga, off) if off < sa else f"end of file ({sa} vs {sb} bytes)"
            result.problems.append(f"files differ first at {where}")
            result.problems.extend(_kv_type_diffs(ga, gb))
        tb = {t.name: t for t in gb.tensors}
        for t in ga.tensors:
            chk = TensorCheck(t.name, t.type_name, "-")
            result.tensors.append(chk)
            o = tb.get(t.name)
            if o is None:
                chk.bytes_equal, chk.where = False, f"missing from {b}"
                continue
            chk.bytes_equal = o.type_id == t.type_id and o.ne == t.ne and bool(np.array_equal(o.data, t.data))
            if not chk.bytes_equal and o.nbytes == t.nbytes:
                rel = int(np.argmax(o.data != t.data))
                bt = t.ggml_type
                chk.where = f"block {rel // bt.block_bytes}, byte {rel % bt.block_bytes}"


def _pair_hurray_hurray(a: str, b: str, result: VerifyResult) -> None:
    with HrryFile(a) as ha, HrryFile(b) as hb:
        if list(ha.kv.items()) != list(hb.kv.items()):
            diffs = [k for k in ha.kv if hb.kv.get(k) != ha.kv[k]] + [k for k in hb.kv if k not in ha.kv]
            result.problems.append(f"metadata differs: {', '.join(diffs[:5]) or 'key order'}")
        for name in ha.top_level_names():
            ta = ha.tensor(name)
            chk = TensorCheck(name, ta.describe(), ta.describe())
            result.tensors.append(chk)
            if name not in hb:
                chk.bytes_equal, chk.where = False, f"missing from {b}"
                continue
            tb = hb.tensor(name)
            chk.mapping = tb.describe()
            chk.bytes_equal = _same_tensor_bytes(ta, tb)
            va, vb = dequantize(ta), dequantize(tb)
            if va.shape != vb.shape:
                chk.values_equal, chk.where = False, f"shape {va.shape} vs {vb.shape}"
                continue
            idx, mad = _first_diff(va.reshape(-1), vb.reshape(-1), signed_zero_equal=False)
            chk.values_equal, chk.max_abs_diff = idx < 0, mad
            if idx >= 0:
                chk.where = f"element {idx}"
        extra = [n for n in hb.top_level_names() if n not in ha]
        if extra:
            result.problems.append(f"tensors only in {b}: {', '.join(extra[:5])}")


def _same_tensor_bytes(a: Tensor, b: Tensor) -> bool:
    if a.descriptor != b.descriptor or len(a.data) != len(b.data) or len(a.members) != len(b.members):
        return False
    if not all(np.array_equal(x, y) for x, y in zip(a.data, b.data)):
        return False
    return all(_same_tensor_bytes(x, y) for x, y in zip(a.members, b.members))


# ---------------------------------------------------------------------------
# entry points


def _run(result: VerifyResult, fn: Callable[[], None], jobs: int | None = None) -> VerifyResult:
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise UsageError(f"--jobs takes a positive number of threads, not {jobs!r}")
    token = _JOBS.set(jobs)
    try:
        fn()
    except HurrayInteropError as exc:
        if isinstance(exc, ConversionRefused):
            result.problems.append(str(exc))
        else:
            result.error = str(exc)
    finally:
        _JOBS.reset(token)
    return result


def verify_roundtrip(path: str | os.PathLike[str], *, jobs: int | None = None) -> VerifyResult:
    """Round-trip one source file through Hurray and back; compare bytes and values.
    ``jobs``: threads for the conversions and the dequantizer (default: up to two)."""
    p = os.fspath(path)
    result = VerifyResult(kind="round-trip", source=p)

    def go() -> None:
        fmt = detect_format(p)
        result.source_format = fmt
        if fmt == "gguf":
            _roundtrip_gguf(p, result)
        elif fmt == "safetensors":
            from .verify_safetensors import verify_safetensors_roundtrip

            verify_safetensors_roundtrip(p, result)
        else:
            raise UsageError(f"{p}: a .hrry file has no source to round-trip to; give the file it came from too (verify SOURCE {p})")

    return _run(result, go, jobs)


def verify_pair(a: str | os.PathLike[str], b: str | os.PathLike[str], *, jobs: int | None = None) -> VerifyResult:
    """Compare two files of any supported pair (GGUF, Hurray, safetensors)."""
    pa, pb = os.fspath(a), os.fspath(b)
    result = VerifyResult(kind="pair", source=pa, other=pb)

    def go() -> None:
        fa, fb = detect_format(pa), detect_format(pb)
        result.source_format = fa
        pair = (fa, fb)
        if pair == ("gguf", "hurray"):
            _pair_gguf_hurray(pa, pb, result)
        elif pair == ("hurray", "gguf"):
            _pair_gguf_hurray(pb, pa, result)
        elif pair == ("gguf", "gguf"):
            _pair_gguf_gguf(pa, pb, result)
        elif pair == ("hurray", "hurray"):
            _pair_hurray_hurray(pa, pb, result)
        else:
            from .verify_safetensors import verify_safetensors_pair

            verify_safetensors_pair(pa, fa, pb, fb, result)

    return _run(result, go, jobs)


def verify_files(
    files: Sequence[str], *, pair: bool = False, each: bool = False, jobs: int | None = None
) -> list[VerifyResult]:
    """What ``hurray-interop verify`` runs: a pair comparison when asked (or for two
    files of different formats), otherwise a round trip of every file."""
    if pair and each:
        raise UsageError("--pair and --each exclude each other")
    if pair:
        if len(files) != 2:
            raise UsageError(f"--pair compares exactly two files, got {len(files)}")
        return [verify_pair(files[0], files[1], jobs=jobs)]
    if len(files) == 2 and not each:
        try:
            fa, fb = detect_format(files[0]), detect_format(files[1])
        except HurrayInteropError:
            fa = fb = ""
        if fa and fb and fa != fb:
            return [verify_pair(files[0], files[1], jobs=jobs)]
    return [verify_roundtrip(f, jobs=jobs) for f in files]
