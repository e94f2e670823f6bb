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
from typing import Callable, Sequence

from .errors import ConversionRefused, HurrayInteropError, UnsupportedError, UsageError
from .registry import FALLBACK_EXACT, HURRAY, detect_format, group_models
from .parallel import check_jobs, use_jobs
from .verification.common import TensorCheck, VerifyResult

__all__ = ["TensorCheck", "VerifyResult", "verify_roundtrip", "verify_pair", "plan_checks", "verify_check", "verify_files"]


def _run(result: VerifyResult, fn: Callable[[], None], jobs: int | None = None) -> VerifyResult:
    check_jobs(jobs, "--jobs")
    with use_jobs(jobs):
        try:
            fn()
        except HurrayInteropError as exc:
            if isinstance(exc, ConversionRefused):
                result.problems.append(str(exc))
            else:
                result.error = str(exc)
    return result


def _check_fallback(fallback: str | None) -> None:
    if fallback not in (None, FALLBACK_EXACT):
        raise UsageError(f"verify takes --fallback {FALLBACK_EXACT} only (a dequantizing fallback cannot round-trip)")


def verify_roundtrip(path: str | os.PathLike[str], *, jobs: int | None = None, fallback: str | None = None) -> VerifyResult:
    """Round-trip one source file through Hurray and back; compare bytes and values.
    ``jobs``: threads for the conversions and the dequantizer (default: up to two).
    ``fallback="exact"``: the import stores types without a native mapping in their exact
    expanded form (docs/conversion-rules.md § 9), so they are checked too."""
    _check_fallback(fallback)
    p = os.fspath(path)
    result = VerifyResult(kind="round-trip", source=p)

    def go() -> None:
        fmt = detect_format(p)
        result.source_format = fmt.name
        if fallback is not None and fmt.to_hurray is not None:
            fmt = dataclasses.replace(fmt, to_hurray=functools.partial(fmt.to_hurray, fallback=fallback))
        fmt.verifier().roundtrip(p, result, fmt)

    return _run(result, go, jobs)


def verify_pair(a: str | os.PathLike[str], b: str | os.PathLike[str], *, jobs: int | None = None) -> VerifyResult:
    """Compare two files of any supported pair: two of one format, or a foreign file with a .hrry."""
    pa, pb = os.fspath(a), os.fspath(b)
    result = VerifyResult(kind="pair", source=pa, other=pb)

    def go() -> None:
        fa, fb = detect_format(pa), detect_format(pb)
        result.source_format = fa.name
        if fa is fb:
            fa.verifier().pair_same(pa, pb, result)
        elif fb.name == HURRAY:
            fa.verifier().pair_with_hurray(pa, fa, pb, result)
        elif fa.name == HURRAY:
            fb.verifier().pair_with_hurray(pb, fb, pa, result)
        else:
            raise UnsupportedError(
                f"cannot compare {fa.name} with {fb.name} directly; convert one of them to .hrry and compare with that"
            )

    return _run(result, go, jobs)


def plan_checks(
    files: Sequence[str], *, pair: bool = False, each: bool = False, fallback: str | None = None
) -> list[tuple[str, ...]]:
    """What ``hurray-interop verify FILE ...`` checks, one tuple per check: two files are
    a pair comparison, one file a round trip.  A pair when asked (``pair``), or for
    exactly two files of different formats (unless ``each`` or ``fallback``); otherwise
    a round trip of every model -- the shards given of one split GGUF set are one
    model, round-tripped once from the first of them (it covers the whole set).
    Usage errors (a wrong number of files for a pair, exclusive options) raise
    :class:`UsageError` here, before anything runs."""
    _check_fallback(fallback)
    if fallback is not None and pair:
        raise UsageError("--fallback applies to round trips, not to --pair")
    if pair and each:
        raise UsageError("--pair and --each exclude each other")
    if pair:
        if len(files) != 2:
            raise UsageError(f"--pair compares exactly two files, got {len(files)}")
        return [(files[0], files[1])]
    if len(files) == 2 and not each and fallback is None:
        try:
            fa, fb = detect_format(files[0]), detect_format(files[1])
        except HurrayInteropError:
            fa = fb = None  # the round trips report the bad file
        if fa is not fb:
            return [(files[0], files[1])]
    return [g[:1] for g in group_models(files)]


def verify_check(
    files: Sequence[str], *, jobs: int | None = None, fallback: str | None = None
) -> VerifyResult:
    """Run one check of :func:`plan_checks`: two files compared, or one round-tripped."""
    if len(files) == 2:
        return verify_pair(files[0], files[1], jobs=jobs)
    return verify_roundtrip(files[0], jobs=jobs, fallback=fallback)


def verify_files(
    files: Sequence[str], *, pair: bool = False, each: bool = False, jobs: int | None = None,
    fallback: str | None = None,
) -> list[VerifyResult]:
    """What ``hurray-interop verify`` runs: every check of :func:`plan_checks`, in order
    (``fallback``: see :func:`verify_roundtrip`)."""
    checks = plan_checks(files, pair=pair, each=each, fallback=fallback)
    return [verify_check(c, jobs=jobs, fallback=fallback) for c in checks]
