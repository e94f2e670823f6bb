"""One entry point for every conversion: :func:`convert`.

Formats are the records of :mod:`hurray_interop.registry` (``gguf``, ``hurray``,
``safetensors``).  The source format comes from ``src_format`` or the file
extension and is always confirmed by the file's magic bytes; the destination
format from ``dst_format`` or the extension.  Every conversion goes through
Hurray: a foreign source to a foreign destination is converted through a
temporary .hrry beside the destination (formats never talk to each other
directly).  A conversion within one format is the format's ``relayout`` (GGUF: a split
set merged, a model split, as gguf-split writes them), or a usage error.
"""

from __future__ import annotations

import inspect
import os
import tempfile
from typing import Any, Callable

from .errors import ConversionRefused, HurrayInteropError, OutputExistsError, UsageError
from .files.atomic import missing_directory, transient
from .parallel import check_jobs
from .registry import (DTYPE_FALLBACKS, EXPORT, FALLBACK_EXACT, HURRAY, IMPORT, Format, conversion_options,
                       detect_format, format_options, formats, lossy_options, option_defaults, output_in_directory,
                       run_options)
from .report import EXACT, LOSSY, REFUSED, VALUE_EXACT, ConversionReport, fallback_hint

__all__ = ["convert", "import_to_intermediate"]

Progress = Callable[[int, int], None] | None


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, progress: Progress = None,
            **options: Any) -> ConversionReport:
    """Convert ``src`` into ``dst``; return the per-tensor report.

    ``options`` are the conversion options the formats declare
    (:func:`hurray_interop.registry.conversion_options`, listed below) and how the conversion
    runs (``dry_run``, ``force``, ``jobs``: the threads that convert GGUF blocks, default up
    to two); a format's own option given to a conversion of other formats is a
    :class:`~hurray_interop.errors.UsageError`, an unknown keyword a :class:`TypeError`.
    ``progress(done, total)`` is called as bytes are written.

    Raises :class:`~hurray_interop.errors.ConversionRefused` when a tensor is
    not exactly representable and no ``fallback`` was chosen (nothing written),
    :class:`~hurray_interop.errors.FormatError` for malformed input and
    :class:`~hurray_interop.errors.UsageError` for impossible requests.
    """
    opts = _given(options)
    src_format, dst_format, fallback = opts["src_format"], opts["dst_format"], opts["fallback"]
    dry_run, force, jobs = opts["dry_run"], opts["force"], opts["jobs"]
    src_s, dst_s = os.fspath(src), os.fspath(dst)
    sf = detect_format(src_s, src_format)
    dst_s = _into_directory(src_s, dst_s, sf, dst_format)
    df = detect_format(dst_s, dst_format, must_exist=False)
    if os.path.abspath(src_s) == os.path.abspath(dst_s) or (os.path.exists(dst_s) and os.path.samefile(src_s, dst_s)):
        raise UsageError(f"{dst_s}: output is the input file")
    if sf is df:
        return _relayout(sf, src_s, dst_s, opts, progress)
    if not force and not dry_run and os.path.exists(dst_s):
        raise OutputExistsError(f"{dst_s}: exists (use --force to overwrite)")
    import_opts, export_opts = format_options(sf, df, opts)
    check_jobs(jobs, "--jobs")
    common: dict[str, Any] = dict(fallback=fallback, dry_run=dry_run, force=force, progress=progress, jobs=jobs)
    if df.name == HURRAY:
        return sf.to_hurray(src_s, dst_s, **common, **import_opts)  # type: ignore[misc]
    if sf.name == HURRAY:
        return df.from_hurray(src_s, dst_s, **common, **export_opts)  # type: ignore[misc]

    # foreign -> foreign: through a temporary .hrry next to the destination
    dst_dir = os.path.dirname(os.path.abspath(dst_s))
    if not os.path.isdir(dst_dir):  # before the intermediate's directory is made there
        raise missing_directory(os.path.dirname(dst_s))
    with tempfile.TemporaryDirectory(dir=dst_dir, prefix=".hurray-interop-") as tmp:
        mid = os.path.join(tmp, "intermediate.hrry")
        first_opts, second_opts = {**common, **import_opts}, {**common, **export_opts}
        return _through_hurray(src_s, sf, dst_s, df, mid, first_opts, second_opts)


def _relayout(fmt: Format, src_s: str, dst_s: str, opts: dict[str, Any], progress: Progress) -> ConversionReport:
    """A conversion within one format: the file(s) laid out again by the format's ``relayout``
    (GGUF: a set merged, a model split; nothing is converted, so no fallback and no import
    option applies), or a usage error when the format has none."""
    if fmt.relayout is None:
        raise UsageError(f"{src_s} is already {fmt.name}; nothing to convert")
    import_opts, export_opts = format_options(fmt, fmt, opts)
    check_jobs(opts["jobs"], "--jobs")
    changed = [o.cli_flag for o in fmt.options if o.name in import_opts and import_opts[o.name] != o.default]
    if opts["fallback"] is not None:
        changed.insert(0, "--fallback")
    if changed:
        raise UsageError(f"{changed[0]}: {fmt.title} -> {fmt.title} copies every tensor as it is; nothing is converted")
    return fmt.relayout(src_s, dst_s, dry_run=opts["dry_run"], force=opts["force"], progress=progress,
                        **export_opts)  # type: ignore[no-any-return]


def _given(options: dict[str, Any]) -> dict[str, Any]:
    """Every option of :func:`convert` by name: those given, the others' defaults."""
    defaults = option_defaults(run=True)
    unknown = next((k for k in options if k not in defaults), None)
    if unknown is not None:
        raise TypeError(f"convert() got an unexpected keyword argument {unknown!r}")
    return {**defaults, **options}


def _options_doc() -> str:
    """The option list of :func:`convert`'s docstring, from the registry's declarations."""
    lines = []
    for o in (*conversion_options(), *run_options()):
        allowed = o.allowed() if o.choices is not None and not callable(o.choices) else None
        values = f" ({' | '.join(map(repr, allowed))})" if allowed else ""
        where = {IMPORT: "input", EXPORT: "output"}.get(o.applies)
        owner = next((f.title for f in formats() if o in f.options), None)
        scope = f"{owner} {where}: " if owner and where and not o.help.startswith(f"{owner} {where}") else ""
        lines.append(f"    * ``{o.name}={o.default!r}``{values} -- {scope}{o.help} (CLI ``{o.cli_flag}``)")
    return "\n".join(lines)


def _signature() -> inspect.Signature:
    """:func:`convert`'s signature with one keyword parameter per declared option (``help(convert)``)."""
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("src", "dst")]
    params += [inspect.Parameter(o.name, kw, default=o.default) for o in (*conversion_options(), *run_options())]
    params.append(inspect.Parameter("progress", kw, default=None))
    return inspect.Signature(params, return_annotation=ConversionReport)


convert.__signature__ = _signature()  # type: ignore[attr-defined]
convert.__doc__ = f"{convert.__doc__}\n    The options:\n\n{_options_doc()}\n"


def import_to_intermediate(src_s: str, sf: Format, mid: str, opts: dict[str, Any]) -> Any:
    """The import into the intermediate .hrry of a conversion between two foreign formats
    (``convert`` writes it, ``verify`` checks such a pair through it: one rule for both).
    With a dtype fallback, a source whose import has exact expanded forms stores them
    instead (their values are the reference decoder's, bit for bit): the export then
    dequantizes and casts each tensor once, in windows, into the same bytes, where the dtype
    fallback would write (and the export copy) the whole model as floats -- unless another
    option asks for a lossy import (``--q4-1 requantize``: the exact forms exclude it).  A
    source those forms refuse (non-finite super-block scales) takes the dtype fallback itself."""
    with transient():  # the intermediate file is deleted at the end: only the result is made durable
        if sf.exact_fallback and opts["fallback"] in DTYPE_FALLBACKS and not lossy_options(opts, but=("fallback",)):
            try:
                return sf.to_hurray(src_s, mid, **{**opts, "fallback": FALLBACK_EXACT})  # type: ignore[misc]
            except ConversionRefused:  # e.g. a non-finite super-block scale: the dtype fallback stores it
                pass
        return sf.to_hurray(src_s, mid, **opts)  # type: ignore[misc]


def _into_directory(src_s: str, dst_s: str, sf: Format, dst_format: str | None) -> str:
    """A destination that is a directory (``DIR/``, or an existing ``DIR``) gets the source's
    name in it, as ``cp`` does: ``DIR/<stem>.<ext>`` (:func:`~.registry.output_in_directory`)."""
    slash = dst_s.endswith(("/", os.sep))
    if not slash and not os.path.isdir(dst_s):
        return dst_s
    if not os.path.isdir(dst_s):
        raise missing_directory(dst_s.rstrip("/" + os.sep) or dst_s)
    return output_in_directory(src_s, dst_s, sf, dst_format)


def _renamed(exc: HurrayInteropError, old: str, new: str, note: str = "") -> HurrayInteropError:
    """Name the user's file instead of the vanished intermediate one."""
    if exc.path is not None and exc.path.startswith(os.path.dirname(old)):
        exc.path = None
        if note:
            exc.message = f"{exc.message} ({note})"
        exc.located(path=new)
    report = exc.details.get("report")
    if isinstance(report, ConversionReport) and report.source == old:
        report.source = new
    return exc


def _through_hurray(
    src_s: str, sf: Format, dst_s: str, df: Format, mid: str, first_opts: dict[str, Any], second_opts: dict[str, Any]
) -> ConversionReport:
    # a dry run writes the intermediate too (and deletes it): the export's plan needs the file
    dry_run = first_opts["dry_run"]
    try:
        first = import_to_intermediate(src_s, sf, mid, {**first_opts, "dry_run": False})
    except ConversionRefused as exc:
        if not dry_run:
            report = exc.details.get("report")
            if isinstance(report, ConversionReport):
                exc.message = exc.message.replace(report.hint, _for_destination(report, dst_s, df))
            raise _renamed(exc, mid, dst_s, "while writing the intermediate Hurray file") from None
        first = sf.to_hurray(src_s, None, **first_opts)  # type: ignore[misc]  # the import's plan: what it refuses
        _for_destination(first, dst_s, df)
        return first
    except HurrayInteropError as exc:
        raise _renamed(exc, mid, dst_s, "while writing the intermediate Hurray file") from None
    try:
        second = df.from_hurray(mid, dst_s, **second_opts)  # type: ignore[misc]
    except HurrayInteropError as exc:  # about the source's tensors, read back from the intermediate
        exc = _renamed(exc, mid, src_s)
        if isinstance(exc.details.get("report"), ConversionReport):
            _as_from_source(exc.details["report"], first, sf.name)
        if isinstance(exc, ConversionRefused):
            types = {t.name: t.source_type for t in first.tensors}
            exc.reasons = [(name, types.get(name, typ), why) for name, typ, why in exc.reasons]
        raise exc from None
    _as_from_source(second, first, sf.name)
    # the intermediate file's forms (form_notes) are not the user's: it is deleted
    second.notes = first.notes + [f"converted through a temporary Hurray file ({len(first.tensors)} tensors)"] + second.notes
    return second


def _for_destination(report: ConversionReport, dst_s: str, df: Format) -> str:
    """The import's report of a conversion through Hurray as one into ``dst_s`` (format ``df``):
    its destination, and the hints of what it refuses -- only the float fallbacks, since
    ``--fallback exact`` stores forms no format but Hurray holds. Returns the new hint."""
    report.destination, report.destination_format = dst_s, df.name
    report.form_notes = []  # the intermediate file's forms, and its scale substitutions, are not the output's
    for t in report.tensors:
        t.substituted_blocks = 0
    if report.refused:
        report.hint = fallback_hint(False, DTYPE_FALLBACKS)
        for t in report.refused:
            t.hint = ""
    return report.hint


_SEVERITY = (EXACT, VALUE_EXACT, LOSSY, REFUSED)


def _as_from_source(second: ConversionReport, first: ConversionReport, source_format: str) -> None:
    """The export's report of a conversion through Hurray as one of the user's source: its
    format, and per tensor the source's type and bytes; where the import already lost values
    (a float fallback), its status, error and reason."""
    second.source, second.source_format = first.source, source_format
    by_name = {t.name: t for t in first.tensors}
    for t in second.tensors:
        f = by_name.get(t.name)
        if f is None:
            continue
        t.source_type, t.bytes_in = f.source_type, f.bytes_in
        if _SEVERITY.index(f.status) > _SEVERITY.index(t.status):
            t.status, t.max_abs_error, t.reason = f.status, f.max_abs_error, f.reason
