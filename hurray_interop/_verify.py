"""The entry points of ``verify``: round trips and pairwise comparisons, dispatched
through the format registry to each format's verifier (:mod:`hurray_interop.verification`).

* :func:`verify_roundtrip` — convert a source (.gguf, .safetensors) to Hurray
  and back in a temporary directory, compare the result with the source byte
  for byte, and compare, per tensor, the shared dequantizer's values on the
  Hurray tensor with the source ecosystem's own decoder, bit for bit.
* :func:`verify_pair` — compare two given files of any supported pair.
* :func:`plan_checks` / :func:`verify_files` — what the ``verify`` command checks, and runs
  (the batch in :mod:`hurray_interop.batch` runs the same checks, one task each).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Sequence

from .errors import ConversionRefused, HurrayInteropError, UsageError
from .parallel import check_jobs, use_jobs
from ._convert import import_to_intermediate
from .registry import (FALLBACK_EXACT, HURRAY, Format, conversion_options, detect_format, format_options, get_format,
                       group_models, option_defaults, output_in_directory)
from .report import LOSSY, VALUE_EXACT
from .verification.common import ORACLES, TensorCheck, VerifyResult, reporting, scratch_dir, using_oracle

__all__ = ["ORACLES", "resolve_output", "TensorCheck", "VerifyResult", "verify_roundtrip", "verify_pair", "plan_checks", "verify_check", "verify_files"]


def _run(result: VerifyResult, fn: Callable[[], None], jobs: int | None = None,
         oracle: str | None = None) -> VerifyResult:
    check_jobs(jobs, "--jobs")
    with use_jobs(jobs), using_oracle(oracle):
        try:
            fn()
        except HurrayInteropError as exc:
            if isinstance(exc, ConversionRefused):
                result.problems.append(str(exc))
            else:
                result.error = str(exc)
    return result


#: the statuses of a conversion's report that a pair check accepts "as reported"
_EXPLAINED = (LOSSY, VALUE_EXACT)


def _options(given: dict[str, Any]) -> dict[str, Any]:
    """Every option of ``convert`` that ``verify SRC DST`` takes (the registry's
    :func:`~hurray_interop.registry.conversion_options`: the check is that DST is what
    ``convert SRC DST`` with them writes, and true to SRC), by API name: those given, the
    others' defaults; the fallback checked."""
    defaults = option_defaults()
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise TypeError(f"unknown verify option(s): {', '.join(unknown)}")
    opts = {**defaults, **given}
    next(o for o in conversion_options() if o.name == "fallback").check(opts["fallback"])
    return opts


def _set_away(opts: dict[str, Any], but: tuple[str, ...]) -> list[tuple[str, Any]]:
    """``(flag, value)`` of the conversion options set away from their defaults, except ``but``."""
    return [(o.cli_flag, opts[o.name]) for o in conversion_options() if o.name not in but and opts[o.name] != o.default]


def _given(opts: dict[str, Any], *, but: tuple[str, ...] = ()) -> list[str]:
    """The conversion options set away from their defaults (as flags), except ``but``."""
    return [flag for flag, _ in _set_away(opts, but)]


def _flags(opts: dict[str, Any], *, but: tuple[str, ...] = ()) -> str:
    """The conversion options given (except ``but``), as a command line would say them."""
    return " ".join(flag if isinstance(v, bool) else f"{flag} {v}" for flag, v in _set_away(opts, but))


def _check_roundtrip_options(opts: dict[str, Any]) -> None:
    """A round trip takes --fallback exact (and --from) only: the other options describe a
    conversion between two given files."""
    if opts["fallback"] not in (None, FALLBACK_EXACT):
        raise UsageError(
            f"a round trip takes --fallback {FALLBACK_EXACT} only (a dequantizing fallback cannot round-trip); "
            f"give the file converted with --fallback {opts['fallback']} too: verify SRC DST --fallback {opts['fallback']}"
        )
    extra = _given(opts, but=("fallback", "src_format"))
    if extra:
        given = _flags(opts, but=("fallback", "src_format"))
        raise UsageError(f"{', '.join(extra)} describe(s) a conversion: give its SRC and DST (verify SRC DST {given})")


def verify_roundtrip(
    path: str | os.PathLike[str], *, jobs: int | None = None, fallback: str | None = None,
    oracle: str | None = None, **options: Any,
) -> VerifyResult:
    """Round-trip one source file through Hurray and back; compare bytes and values.
    ``jobs``: threads for the conversions and the dequantizer (default: up to two).
    ``oracle``: the reference decoder of GGUF tensors, one of :data:`ORACLES` ("ggml", ggml's
    own C dequantizers, the default where its library loads; "gguf-py").
    ``fallback="exact"``: the import stores types without a native mapping in their exact
    expanded form (docs/conversion-rules.md § 9), so they are checked too; ``src_format``
    forces the format.  The other conversion options are a :class:`UsageError` here."""
    opts = _options({**options, "fallback": fallback})
    _check_roundtrip_options(opts)
    src_format = opts["src_format"]
    p = os.fspath(path)
    result = VerifyResult(kind="round-trip", source=p)

    def go() -> None:
        fmt = detect_format(p, src_format)
        result.source_format = fmt.name
        if fallback is not None and fmt.to_hurray is not None:
            fmt = dataclasses.replace(fmt, to_hurray=functools.partial(fmt.to_hurray, fallback=fallback))
        fmt.verifier().roundtrip(p, result, fmt)

    return _run(result, go, jobs, oracle)


def verify_pair(a: str | os.PathLike[str], b: str | os.PathLike[str], *, jobs: int | None = None,
                oracle: str | None = None, **options: Any) -> VerifyResult:
    """Compare two files of any supported pair: two of one format, or a foreign file with a .hrry
    (or with a file of another foreign format, through a .hrry made in a temporary directory).

    ``options`` are those of ``convert`` (:func:`~hurray_interop.registry.conversion_options`) when ``b`` was converted
    from ``a`` with them: the check then repeats that conversion's export (``--merge``,
    ``--split-max-*``, ``--convention``, ``--fallback``) or import (``--fallback``, ``--q4-1``), and
    tensors its report calls lossy or value-exact pass "as reported" when ``b`` is byte for byte
    what that conversion writes.  Without options the order of ``a`` and ``b`` does not matter.
    ``oracle`` as for :func:`verify_roundtrip`."""
    opts = _options(options)
    pa, pb = os.fspath(a), os.fspath(b)
    result = VerifyResult(kind="pair", source=pa, other=pb)

    def go() -> None:
        fa = detect_format(pa, opts["src_format"])
        named = _in_directory(pa, pb, fa, opts)
        fb = detect_format(named, opts["dst_format"], must_exist=False)
        b_path = _existing_output(pa, named, fb, opts)
        result.other, result.source_format = b_path, fa.name  # the file that stands for DST
        if fa is fb and _relayout_asked(fa, opts):
            _relaid(pa, fa, b_path, result, opts)
        elif fa is fb:
            _check_same_format_pair(fa, opts)
            fa.verifier().pair_same(pa, b_path, result)
        elif fb.name == HURRAY:
            _imported(pa, fa, b_path, result, opts)
        elif fa.name == HURRAY:
            _exported(pa, b_path, fb, result, opts)
        else:
            _through_hurray(pa, fa, b_path, fb, result, opts)

    return _run(result, go, jobs, oracle)


def _check_same_format_pair(fmt: Format, opts: dict[str, Any]) -> None:
    extra = _given(opts, but=("src_format", "dst_format"))
    if extra:
        raise UsageError(f"{', '.join(extra)}: two {fmt.title} files are not a conversion; give SRC and the file converted from it")


def _relayout_asked(fmt: Format, opts: dict[str, Any]) -> bool:
    """``verify SRC DST`` of one format with the options of a relayout (``--merge``,
    ``--split-max-*`` of GGUF): DST was written by ``convert SRC DST`` with them."""
    return fmt.relayout is not None and any(opts[k] != d for k, d in fmt.export_options.items())


def _relaid(src: str, fmt: Format, dst: str, result: VerifyResult, opts: dict[str, Any]) -> None:
    """``dst`` laid out again from ``src`` by the format's ``relayout`` (which copies every
    tensor's bytes as they are): the relayout repeated into a temporary directory, and its
    output compared with ``dst`` as two files of one format (every shard byte for byte,
    every tensor's values)."""
    _check_same_format_pair(fmt, {**opts, **{k: d for k, d in fmt.export_options.items()}})
    _, export_opts = format_options(fmt, fmt, opts)
    member = fmt.member_of(dst) if fmt.member_of is not None else None
    name = member[2] + os.path.splitext(dst)[1] if member is not None else os.path.basename(dst)
    with scratch_dir() as tmp:
        out = os.path.join(tmp, name)
        fmt.relayout(src, out, **export_opts)  # type: ignore[misc]
        fmt.verifier().pair_same(_existing_output(src, out, fmt, opts), dst, result)
    where = os.path.join(tmp, "")  # the repeated output is "convert's", not a vanished temporary file
    result.problems = [p.replace(where, "convert's ") for p in result.problems]
    result.source = src


def _in_directory(src: str, dst: str, src_fmt: Format, opts: dict[str, Any]) -> str:
    """A DST that is a directory stands for the file ``convert SRC DIR/`` writes in it
    (``DIR/<stem>.<ext>``, :func:`~.registry.output_in_directory`)."""
    if not os.path.isdir(dst):
        return dst
    return output_in_directory(src, dst, src_fmt, opts["dst_format"])


def _existing_output(src: str, dst: str, fmt: Format, opts: dict[str, Any]) -> str:
    """``dst`` as ``convert`` named it: a GGUF split set given as ``PREFIX.gguf`` (or a bare
    prefix) is found by its first shard (the format's ``outputs``); else ``dst`` itself."""
    if os.path.exists(dst):
        return dst
    if fmt.outputs is None:
        detect_format(dst, opts["dst_format"])  # the missing file, said as for any input, before any work
        return dst
    export = {k: opts[k] for k in fmt.export_options}
    found = sorted(p for p in fmt.outputs(src, dst, **export)[1:] if os.path.exists(p))
    if found:
        return found[0]
    detect_format(dst, opts["dst_format"])  # the missing file, said as for any input
    return dst


def resolve_output(src: str, dst: str, **options: Any) -> str:
    """The file that stands for ``dst`` in ``verify SRC DST [options]`` (see :func:`verify_pair`):
    the first shard of a set named ``PREFIX.gguf``, else ``dst`` (checked when it runs)."""
    opts = _options(options)
    try:
        named = _in_directory(src, dst, detect_format(src, opts["src_format"]), opts)
        return _existing_output(src, named, detect_format(named, opts["dst_format"], must_exist=False), opts)
    except HurrayInteropError:
        return dst


def _plans(report: Any) -> dict[str, Any]:
    return {} if report is None else {t.name: t for t in report.tensors if t.status in _EXPLAINED}


def _mark_reported(result: VerifyResult, plans: dict[str, Any]) -> None:
    """Tensors the conversion's report says it stored lossy or value-exact pass as reported
    (value-exact ones only when their values are equal)."""
    for chk in result.tensors:
        plan = plans.get(chk.name)
        if plan is None or (plan.status == VALUE_EXACT and chk.values_equal is False):
            continue
        error = "" if plan.max_abs_error is None else f", max abs error {plan.max_abs_error:.6g}"
        chk.reported = f"{plan.status} as reported: {plan.mapping}{error}"


def _imported(path: str, fmt: Format, hrry: str, result: VerifyResult, opts: dict[str, Any]) -> None:
    """``hrry`` converted from ``path`` (with ``opts``): the pair check; a lossy import (a float
    fallback, ``--q4-1 requantize``) is repeated and must give ``hrry`` byte for byte."""
    import_opts, _ = format_options(fmt, get_format(HURRAY), opts)
    plans: dict[str, Any] = {}
    if opts["fallback"] not in (None, FALLBACK_EXACT) or any(import_opts[k] != d for k, d in fmt.import_options.items()):
        plans = _repeat_import(path, fmt, hrry, result, opts, import_opts)
    fmt.verifier().pair_with_hurray(path, fmt, hrry, result, explained=frozenset(plans))
    _mark_reported(result, plans)


def _repeat_import(path: str, fmt: Format, hrry: str, result: VerifyResult, opts: dict[str, Any],
                   import_opts: dict[str, Any]) -> dict[str, Any]:
    """Convert ``path`` again with the options into a temporary .hrry and compare it with ``hrry``:
    the report's lossy and value-exact tensors by name when they agree, else {} and the difference."""
    with scratch_dir() as tmp:
        mid = os.path.join(tmp, "import.hrry")
        report = fmt.to_hurray(path, mid, fallback=opts["fallback"], **import_opts)
        same = VerifyResult(kind="pair", source=mid, other=hrry)
        get_format(HURRAY).verifier().pair_same(mid, hrry, same)
    if same.ok:
        return _plans(report)
    bad = next((t for t in same.tensors if not t.ok), None)
    first = same.problems[0] if same.problems else f"tensor {bad.name!r} differs" if bad else "it differs"
    result.problems.append(f"{hrry} is not what convert {path} {hrry} {_flags(opts)} writes: {first}")
    return {}


def _exported(hrry: str, path: str, fmt: Format, result: VerifyResult, opts: dict[str, Any]) -> None:
    """``path`` converted from ``hrry`` (with ``opts``): the export is repeated with them; when it
    gives ``path`` byte for byte, the tensors its report calls lossy or value-exact pass as reported."""
    _, export_opts = format_options(get_format(HURRAY), fmt, opts)
    report = fmt.verifier().pair_with_hurray(path, fmt, hrry, result,
                                             export_options={"fallback": opts["fallback"], **export_opts})
    if result.file_bytes_equal:
        _mark_reported(result, _plans(report))


def _through_hurray(path: str, fmt: Format, dst: str, dst_fmt: Format, result: VerifyResult,
                    opts: dict[str, Any]) -> None:
    """``dst`` (another foreign format) converted from ``path`` through Hurray, as ``convert`` does:
    the import into a temporary .hrry is checked against ``path``, the export against ``dst``."""
    import_opts, export_opts = format_options(fmt, dst_fmt, opts)
    with scratch_dir() as tmp:
        mid = os.path.join(tmp, "through.hrry")
        plans = _plans(import_to_intermediate(path, fmt, mid, {"fallback": opts["fallback"], **import_opts}))
        first = VerifyResult(kind="pair", source=path, other=mid)
        fmt.verifier().pair_with_hurray(path, fmt, mid, first, explained=frozenset(plans))
        _mark_reported(first, plans)
        export = {"fallback": opts["fallback"], **export_opts}  # as convert passes them to the export
        report = dst_fmt.verifier().pair_with_hurray(dst, dst_fmt, mid, result, export_options=export)
        if result.file_bytes_equal:
            plans = {**_plans(report), **plans}
            _mark_reported(result, plans)
    imported = first.problems + [f"tensor {t.name!r} differs ({t.where or 'values'})" for t in first.tensors if not t.ok]
    result.problems = [p.replace(mid, "the intermediate .hrry") for p in [f"{path} -> Hurray: {p}" for p in imported]
                       + result.problems]


def plan_checks(
    files: Sequence[str], *, pair: bool = False, each: bool = False, **options: Any
) -> list[tuple[str, ...]]:
    """What ``hurray-interop verify FILE ...`` checks, one tuple per check: two files are
    a pair comparison, one file a round trip.  A pair when asked (``pair``), or for
    exactly two files of different formats (unless ``each``); otherwise
    a round trip of every model -- the shards given of one split GGUF set are one
    model, round-tripped once from the first of them (it covers the whole set).
    Usage errors (a wrong number of files for a pair, exclusive options, conversion
    options for round trips) raise :class:`UsageError` here, before anything runs."""
    opts = _options(options)
    if pair and each:
        raise UsageError("--pair and --each exclude each other")
    if pair:
        if len(files) != 2:
            raise UsageError(f"--pair compares exactly two files, got {len(files)}")
    if len(files) == 2 and not each:
        try:
            fa = detect_format(files[0], opts["src_format"])
            fb = detect_format(_in_directory(files[0], files[1], fa, opts), opts["dst_format"], must_exist=False)
        except HurrayInteropError:
            fa = fb = None  # a missing or unknown file: the pair check reports it (not two round trips)
        relaid = fa is not None and fa is fb and _relayout_asked(fa, opts)
        if pair and fa is not None and fa is fb and not relaid:
            _check_same_format_pair(fa, opts)
        if pair or relaid or fa is None or fa is not fb:
            return [(files[0], files[1])]
    _check_roundtrip_options(opts)
    return [g[:1] for g in group_models(files)]


def verify_check(files: Sequence[str], *, jobs: int | None = None,
                 progress: Callable[[int, int], None] | None = None, oracle: str | None = None,
                 **options: Any) -> VerifyResult:
    """Run one check of :func:`plan_checks`: two files compared, or one round-tripped;
    ``progress(done, total)`` is called per tensor whose values were compared."""
    with reporting(progress):
        if len(files) == 2:
            return verify_pair(files[0], files[1], jobs=jobs, oracle=oracle, **options)
        return verify_roundtrip(files[0], jobs=jobs, oracle=oracle, **options)


def verify_files(
    files: Sequence[str], *, pair: bool = False, each: bool = False, jobs: int | None = None,
    oracle: str | None = None, **options: Any,
) -> list[VerifyResult]:
    """What ``hurray-interop verify`` runs: every check of :func:`plan_checks`, in order
    (``options``: see :func:`verify_pair`; for round trips ``fallback="exact"``, see
    :func:`verify_roundtrip`; ``oracle``, ibid.)."""
    checks = plan_checks(files, pair=pair, each=each, **options)
    return [verify_check(c, jobs=jobs, oracle=oracle, **options) for c in checks]
