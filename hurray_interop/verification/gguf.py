"""What ``verify`` needs to know about GGUF: offsets named, metadata types compared, and the
reference decoder -- the *oracle* -- its values are held to, bit for bit:

* ``ggml`` (the default where it loads): ggml's own C dequantizers, ``to_float`` of the
  library llama.cpp runs (:mod:`~hurray_interop.formats.gguf_ggml`, ``libggml-python``);
  it also decodes Q1_0 and Q2_0;
* ``gguf-py``: llama.cpp's numpy dequantizers, ``gguf.quants.dequantize`` (through
  :func:`conversions.gguf.reference_dequantizer`).

Plain types without a ggml decoder (F32, the integers, F64) are numpy's cast under either.
For MXFP4, +0 and −0 compare equal (docs/conversion-rules.md § 6)."""

from __future__ import annotations

import functools
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..conversions import fallback as fallbacks
from ..conversions import gguf_exact
from ..conversions.gguf import PADDING_LOST, reference_dequantizer
from ..core.hrry import HrryFile
from ..errors import UsageError
from ..formats import gguf as G
from ..formats import gguf_ggml as ggml
from ..formats import gguf_split as S
from ..kernels import thread_buffer
from .common import (ForeignChecks, ForeignVerifier, RawEntry, Rows, Unit, VerifyResult, first_byte_diff,
                     requested_oracle, run_roundtrip, scratch_dir)

__all__ = ["VERIFIER"]


def oracle() -> str:
    """The oracle the value checks run here: the one asked for (:func:`~.common.using_oracle`),
    else ggml where it loads, else gguf-py.  :class:`UsageError` when ggml is asked for and
    does not load (the reason said)."""
    asked = requested_oracle()
    if asked == "ggml" and not ggml.available():
        raise UsageError(f"--oracle ggml: ggml's library does not load here: {ggml.unavailable_reason()}")
    if asked is not None:
        return asked
    return "ggml" if ggml.available() else "gguf-py"


def oracle_label(name: str) -> tuple[str, str]:
    """The oracle ``name`` and what it is, with its version (as a report says them)."""
    if name == "ggml":
        return name, f"ggml's C dequantizers, libggml-python {ggml.version()}"
    from importlib.metadata import version

    return name, f"gguf.quants.dequantize, gguf {version('gguf')}"


def _reference(info: "G.GGUFTensorInfo", name: str) -> Rows | None:
    """The oracle ``name``'s decoder over the blocks ``start:stop`` of a GGUF tensor (numpy's
    cast over elements for plain types it has no decoder for); None when it has no decoder
    for the type."""
    t = info.ggml_type
    if name == "ggml" and ggml.has_decoder(t.id, t.block_elements, t.block_bytes):  # (not F16: gguf_ggml._NOT_EXACT)
        # the reader bounds-checked the tensor's bytes: a whole number of contiguous blocks
        blocks = info.data.reshape(-1, t.block_bytes)

        def c(start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
            # into this thread's window (valid until its next call: compare_values reads it at once),
            # or into ``out`` (C-contiguous float32 of the blocks' values: compare's own window)
            if out is None:
                out = thread_buffer("verify.ggml", ((stop - start) * t.block_elements,), np.float32)
            return ggml.decode_blocks(t.id, t.block_elements, t.block_bytes, blocks[start:stop], out)

        c.into = True  # type: ignore[attr-defined]
        # compare_values may run ggml's to_float itself, window by window in C beside ours
        c.decoded = (ggml.decoder_address(t.id, t.block_elements, t.block_bytes), blocks,  # type: ignore[attr-defined]
                     t.block_elements)
        return c
    dt = t.dtype()
    if dt is not None:
        flat = info.data.view(dt)

        def plain(start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
            if out is None:
                return flat[start:stop].astype(np.float32)
            np.copyto(out, flat[start:stop], casting="unsafe")  # numpy's cast, as astype
            return out

        plain.into = True  # type: ignore[attr-defined]
        return plain
    decode = reference_dequantizer(t) if name == "gguf-py" else None
    if decode is None:
        return None
    blocks = info.data.reshape(-1, t.block_bytes)

    def quant(start: int, stop: int) -> np.ndarray:
        # one row: gguf-py runs its decoder once per group of 16 rows
        return decode(blocks[start:stop].reshape(1, -1))

    return quant


def _byte_where(bt: "G.GGMLType", rel: int) -> str:
    return f"block {rel // bt.block_bytes}, byte {rel % bt.block_bytes}" if bt.block_elements > 1 else f"byte {rel}"


def _locate(gf: "G.GGUFFile", offset: int) -> str:
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
            return f"tensor {t.name!r} {_tensor_where(t, offset - t.data_offset)} (offset {offset})"
    return f"padding (offset {offset})"


def _tensor_where(t: "G.GGUFTensorInfo", rel: int) -> str:
    bt = t.ggml_type
    if bt.block_elements > 1:
        return _byte_where(bt, rel)
    return f"element {rel // bt.block_bytes}"


def _vt(v: "G.GGUFValue") -> str:
    if v.type == G.ValueType.ARRAY and v.element_type is not None:
        return f"ARRAY[{v.element_type.name}]"
    return v.type.name


def _kv_diffs(a: "G.GGUFFile", b: "G.GGUFFile") -> list[str]:
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


def _entries(gf: "G.GGUFFile") -> dict[str, RawEntry]:
    return {
        t.name: RawEntry(t.type_name, (t.type_id, *t.ne), t.data, t.data_offset, functools.partial(_byte_where, t.ggml_type))
        for t in gf.tensors
    }


def _units(gf: "G.GGUFFile") -> Iterator[Unit]:
    name = oracle()
    for info in gf.tensors:
        yield Unit(
            info.name,
            info.type_name,
            (info.name,),
            functools.partial(_reference, info, name),
            block=info.ggml_type.block_elements,
            signed_zero_equal=info.type_name == "MXFP4",
            row=info.ggml_type.block_elements,  # the reference decodes blocks, bounded for any row length
            shape=tuple(int(n) for n in reversed(info.ne)),
        )


def _open_model(paths: Sequence[Path]) -> Any:
    """The exported file, or the split set its shards form (a context manager either way;
    a set reads as one model, every tensor in set order: :class:`~..formats.gguf_split.SplitModel`)."""
    return G.read_gguf(paths[0]) if len(paths) == 1 else S.open_model(paths[0])


def _files(m: Any) -> list[tuple[Path, "G.GGUFFile"]]:
    """The files of an opened model: a split set's shards, or the one file."""
    return list(zip(m.paths, m.shards)) if isinstance(m, S.SplitModel) else [(Path(m.path), m)]


def _describe(path: str, m: Any) -> str:
    return f"{path} is a shard of a split set of {m.count}" if isinstance(m, S.SplitModel) else f"{path} is one file"


def _exported(back: str) -> list[Path]:
    """The files an export to ``back`` wrote in its (private, temporary) folder: ``back``
    itself, or the shards of a split set named after it."""
    b = Path(back)
    return sorted(b.parent.glob(b.stem + "*.gguf"))


def _set_count(path: str) -> int | None:
    """The number of shards of the split set ``path`` belongs to (checked), or None."""
    with G.read_gguf(path) as gf, S.borrowed_set(gf) as s:
        return None if s is None else s.count


def _no_identity_claim(report: Any, result: VerifyResult) -> Any:
    """An export that wrote zeros where the .hrry records non-zero padding (a new layout)
    is not the file the .hrry was imported from: verify then claims no byte identity."""
    if report is not None and result.file_bytes_equal and any(PADDING_LOST in n for n in report.notes):
        result.file_bytes_equal = None
    return report


class _GGUFVerifier(ForeignVerifier):
    """The GGUF checks, for a split set as for one file (docs/conversion-rules.md § 10):
    a set round-trips to the same shards, each compared byte for byte, and every
    tensor of the set is compared by bytes and values; two sets compare shard by shard
    and tensor by tensor."""

    def pair_same(self, a: str, b: str, result: VerifyResult) -> None:
        if _set_count(a) is None and _set_count(b) is None:
            return super().pair_same(a, b, result)
        with S.open_model(a) as ma, S.open_model(b) as mb:
            fa, fb = _files(ma), _files(mb)
            if len(fa) != len(fb):
                result.file_bytes_equal = False
                result.problems.append(f"{_describe(a, ma)}, {_describe(b, mb)}")
            else:
                diffs = _file_diffs(fa, [p for p, _ in fb], "shard {a} and {b} differ first at {where}")
                result.file_bytes_equal = not diffs
                result.problems.extend(diffs)
            self.pair_tensors(ma, mb, b, result)

    def roundtrip(self, path: str, result: VerifyResult, fmt: Any) -> None:
        if _set_count(path) is None:
            return super().roundtrip(path, result, fmt)

        def check(mid: str, back: str, exported_diffs: Any) -> None:
            diffs = exported_diffs()  # the set compares after the export (one pass per shard)
            self._against_set(path, _exported(back), mid, result, diffs, "the Hurray file", files_equal=diffs is None)

        run_roundtrip(path, result, to_hurray=fmt.to_hurray, from_hurray=fmt.from_hurray, suffix=".gguf",
                      check=check, hint=self.checks.refusal_hint, compare=lambda a, b: _shard_diffs(a, _exported(b)))

    def pair_with_hurray(
        self, path: str, fmt: Any, hrry_path: str, result: VerifyResult, *,
        export_options: dict[str, Any] | None = None, explained: frozenset[str] = frozenset(),
    ) -> Any:
        """A GGUF (one file or a set) against a .hrry: the export is one file or a set too
        (as the .hrry recorded, or as ``export_options`` say); a layout that differs from the
        GGUF's is a difference, and the tensors are still compared one by one."""
        with scratch_dir() as tmp:
            back, report, same = self.export_compared(hrry_path, fmt, os.path.join(tmp, "export.gguf"), path,
                                                      result, export_options, explained)
            count = _set_count(path)
            if same and count is None:  # one file, byte-identical as it was made (never written)
                self.compare_export(path, back, hrry_path, result, explained, identical=True)
                return _no_identity_claim(report, result)
            if same:  # (a set's first shard matched by one exported file: written, compared as a set)
                back, report = self.export(hrry_path, fmt, back, result, export_options, explained)
            paths = _exported(back) if back else []
            if count is None and paths == [Path(back)]:
                self.compare_export(path, back, hrry_path, result, explained)
                return _no_identity_claim(report, result)
            diffs = None
            if paths:
                layout = _layout_difference(path, count, hrry_path, len(paths) if back and paths != [Path(back)] else None)
                diffs = [layout] if layout else _shard_diffs(path, paths)
                if not explained:
                    result.file_bytes_equal = diffs is None
            self._against_set(path, paths, hrry_path, result, None if explained else diffs, hrry_path, files_equal=False)
        return _no_identity_claim(report, result)

    def _against_set(self, path: str, exported: list[Path], hrry_path: str, result: VerifyResult, diffs: Any,
                     label: str, *, files_equal: bool) -> None:
        with ExitStack() as stack:
            src = stack.enter_context(S.open_model(path))
            hf = stack.enter_context(HrryFile(hrry_path))
            exp = stack.enter_context(_open_model(exported)) if exported else None
            for problem in diffs or ():
                result.problems.append(problem)
            self.against_hurray(src, hf, result, exp, files_equal=files_equal, hurray_label=label)


def _layout_difference(path: str, count: int | None, hrry_path: str, exported: int | None) -> str:
    """The first difference of two GGUF layouts: the set of ``count`` shards ``path`` belongs to
    (None: one file) and the ``exported`` shards the .hrry exports to (None: one file); "" if equal."""
    if count == exported:
        return ""
    ours = "one file" if exported is None else f"a set of {exported} shards"
    theirs = "is one file" if count is None else f"is a shard of a set of {count}"
    hint = ""
    if count is None or exported is None:  # the options that change the layout, in convert's order
        option = "--merge" if count is None else "--split-max-tensors N (or --split-max-size S)"
        hint = f" (if {path} was converted from it with {option}: verify {hrry_path} {path} {option})"
    return f"{hrry_path} exports to {ours}, {path} {theirs}{hint}"


def _shard_diffs(path: str, exported: list[Path]) -> list[str] | None:
    """Where each exported file first differs from the shard of ``path``'s set it should
    equal (None when every shard is byte-identical)."""
    with S.open_model(path) as src:
        files = _files(src)
        if len(exported) != len(files):
            return [f"the export wrote {len(exported)} file(s) for a set of {len(files)} shards"]
        return _file_diffs(files, exported, "shard {a} re-exported differs first at {where}") or None


def _file_diffs(files: list[tuple[Path, "G.GGUFFile"]], others: Sequence[Path], template: str) -> list[str]:
    """Where each of ``others`` first differs from the file of ``files`` in its place (``template``
    says it, from ``{a}``, ``{b}``: the two names, and ``{where}``), and their metadata differences."""
    out = []
    for (p, gf), q in zip(files, others):
        diff = first_byte_diff(os.fspath(p), os.fspath(q))
        if diff is not None:
            off, sa, sb = diff
            where = _locate(gf, off) if off < sa else f"end of file ({sa} vs {sb} bytes)"
            out.append(template.format(a=p.name, b=q.name, where=where))
            with G.read_gguf(q) as other:
                out.extend(f"{p.name}: {d}" for d in _kv_diffs(gf, other))
    return out


def _refusal_hint(types: list[str]) -> str:
    """The conversion summary's advice: types with an exact expanded form are checked by
    ``--fallback exact`` (docs/conversion-rules.md § 9)."""
    if any(gguf_exact.has_form(t) for t in types):
        return f"choose --fallback {fallbacks.EXACT} to verify them in their exact expanded form"
    return ""


VERIFIER = _GGUFVerifier(
    ForeignChecks(
        title="GGUF",
        exported_as="a GGUF",
        no_exact="no exact GGUF equivalent",
        open=G.read_gguf,
        locate=_locate,
        metadata_diffs=_kv_diffs,
        entries=_entries,
        units=_units,
        refusal_hint=_refusal_hint,
        oracle=lambda: oracle_label(oracle()),
    )
)
