"""The entry points of ``verify``: round trips and pairwise comparisons, dispatched
through the format registry to each format's verifier (:mod:`hurray_interop.verification`).

* :func:`verify_roundtrip` — convert a source (.gguf, .safetensors) to Hurray
  and back in a temporary directory, compare the result with the source byte
  for byte, and compare, per tensor, the shared dequantizer's values on the
  Hurray tensor with the source ecosystem's own decoder, bit for bit.
* :func:`verify_pair` — compare two given files of any supported pair.
* :func:`verify_files` — what the ``verify`` command runs.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Sequence

from .errors import ConversionRefused, HurrayInteropError, UnsupportedError, UsageError
from .registry import FALLBACK_EXACT, HURRAY, detect_format
from .parallel import check_jobs, use_jobs
from .verification.common import TensorCheck, VerifyResult

__all__ = ["TensorCheck", "VerifyResult", "verify_roundtrip", "verify_pair", "verify_files"]


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


def verify_files(
    files: Sequence[str], *, pair: bool = False, each: bool = False, jobs: int | None = None,
    fallback: str | None = None,
) -> list[VerifyResult]:
    """What ``hurray-interop verify`` runs: a pair comparison when asked (or for two
    files of different formats), otherwise a round trip of every file (``fallback``: see
    :func:`verify_roundtrip`)."""
    _check_fallback(fallback)
    if fallback is not None:
        if pair:
            raise UsageError("--fallback applies to round trips, not to --pair")
        return [verify_roundtrip(f, jobs=jobs, fallback=fallback) for f in files]
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
            return [verify_roundtrip(f, jobs=jobs) for f in files]
        if fa is not fb:
            return [verify_pair(files[0], files[1], jobs=jobs)]
    return [verify_roundtrip(f, jobs=jobs) for f in files]
