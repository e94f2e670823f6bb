"""GGUF -> GGUF in one step: a split set merged, a model split, a set split again
(docs/conversion-rules.md § 10), as llama.cpp's ``gguf-split --merge`` / ``--split`` write them.

Nothing is converted and no Hurray file is made: the metadata comes from the source (the
first shard's model keys, without its ``split.*`` keys, then the split keys as gguf-split
writes them), the tensor infos in source order, and every tensor's bytes are copied by the
kernel (``copy_file_range``, :meth:`~..files.positional.PositionalWriter.copy`) from the
shard that holds them into the output through the export's set writer
(:func:`~..formats.gguf_split.write_set`), so the files are the export's from a .hrry of
the same source, byte for byte.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import OutputExistsError, UsageError, errors_name_source
from ..formats import gguf as G
from ..formats import gguf_split as S
from ..report import EXACT, ConversionReport, TensorPlan
from .gguf import SplitRequest, set_note, split_request

__all__ = ["relayout_gguf", "LAYOUT_FLAGS"]

Progress = Callable[[int, int], None] | None

#: the options that ask a GGUF -> GGUF conversion for a new layout
LAYOUT_FLAGS = "--merge, --split-max-tensors N or --split-max-size SIZE"


@errors_name_source
def relayout_gguf(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str] | None,
    *,
    dry_run: bool = False,
    force: bool = False,
    progress: Progress = None,
    merge: bool = False,
    split_max_tensors: int | None = None,
    split_max_size: int | str | None = None,
) -> ConversionReport:
    """Write the GGUF model ``src`` (a file, or any shard of a set: the whole set is read)
    to ``dst`` laid out again: one merged file (``merge``; the source must be a set) or a
    set of at most ``split_max_tensors`` tensors / ``split_max_size`` bytes per shard
    (named as :func:`~..formats.gguf_split.set_paths` names them).  No layout option is a
    :class:`UsageError`; so is ``merge`` of a file that is no shard of a set."""
    src_s = os.fspath(src)
    request = split_request(merge, split_max_tensors, split_max_size)
    if not request.merge and not request.split:
        raise UsageError(f"{src_s} is already GGUF; nothing to convert (give {LAYOUT_FLAGS} to lay it out again)")
    if dst is not None and not force and not dry_run and os.path.exists(dst):  # as convert says it
        raise OutputExistsError(f"{os.fspath(dst)}: exists (use --force to overwrite)")
    with contextlib.closing(S.open_model(src_s)) as model:
        layout = _layout(model, src_s, request)
        report = _report(model, src_s, dst, layout, request, dry_run)
        if not dry_run:
            _write(model, dst, layout, request.merge, force, progress)
    return report


def _layout(model: "G.GGUFFile | S.SplitModel", src: str, request: SplitRequest) -> S.SplitLayout:
    """The set to write: the source set itself for ``--merge`` (written merged), else the
    new split of the model's tensors in source order."""
    if request.merge:
        if not isinstance(model, S.SplitModel):
            raise UsageError("not a shard of a split GGUF set: nothing to merge (gguf-split --merge refuses it too)",
                             path=src)
        return model.set.split_layout()
    sizes = [t.nbytes for t in model.tensors]
    plan = S.plan_split(sizes, max_tensors=request.max_tensors, max_size=request.max_size)
    rows = [(t.name, t.type_name, t.ne) for t in model.tensors]
    return S.new_split_layout(list(model.kv), rows, plan, alignment=model.alignment)


def _report(model: Any, src: str, dst: Any, layout: S.SplitLayout, request: SplitRequest,
            dry_run: bool) -> ConversionReport:
    report = ConversionReport(source=src, destination=None if dst is None else os.fspath(dst), source_format="gguf",
                              destination_format="gguf", dry_run=dry_run)
    report.tensors = [TensorPlan(name=t.name, source_type=t.type_name, mapping=t.type_name, status=EXACT,
                                 bytes_in=t.nbytes, bytes_out=t.nbytes, reason="copied") for t in model.tensors]
    report.notes.append(set_note(layout, dst, request.merge, dry_run))
    if model.nonzero_padding:
        report.notes.append("the source's padding holds non-zero bytes; the new layout writes zeros there, as gguf-split")
    return report


def _paths(model: Any) -> list[Path]:
    return list(model.paths) if isinstance(model, S.SplitModel) else [Path(os.fspath(model.path))]


def _write(model: Any, dst: Any, layout: S.SplitLayout, merge: bool, force: bool, progress: Progress) -> None:
    """Every tensor copied by the kernel from its shard into the output (all or nothing)."""
    paths = _paths(model)
    where = {t.name: (i, t.data_offset, t.nbytes) for i, t in _placed(model)}
    model_kv = {k: v for k, v in model.kv.items() if k not in S.SPLIT_KEYS}
    with _opened(paths) as fds:

        def write_at(name: str, pw: Any, offset: int) -> None:
            shard, at, n = where[name]
            pw.copy(fds[shard], at, n, offset)

        S.write_set(dst, layout, model_kv, write_at=write_at, merge=merge, force=force, inputs=paths,
                    progress=progress)


def _placed(model: Any) -> Iterator[tuple[int, G.GGUFTensorInfo]]:
    """``(shard index, tensor)`` of every tensor in source order."""
    return iter(model.set.tensors) if isinstance(model, S.SplitModel) else ((0, t) for t in model.tensors)


@contextlib.contextmanager
def _opened(paths: list[Path]) -> Iterator[list[int]]:
    """Read-only descriptors of the source files (the kernel copies from them), closed on leaving."""
    fds: list[int] = []
    try:
        for p in paths:
            fds.append(os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)
