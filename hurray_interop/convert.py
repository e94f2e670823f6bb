"""One entry point for every conversion: :func:`convert`.

Formats are named ``gguf``, ``hurray`` and ``safetensors``.  The source
format comes from ``src_format`` or the file extension and is always
confirmed by the file's magic bytes; the destination format from
``dst_format`` or the extension.  GGUF ⇄ safetensors goes through a
temporary .hrry beside the destination (formats never talk to each other
directly).
"""

from __future__ import annotations

import functools
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, Callable

from .errors import BadMagicError, FormatError, HurrayInteropError, UsageError
from .report import ConversionReport

__all__ = ["FORMATS", "EXTENSIONS", "detect_format", "sniff_format", "convert"]

FORMATS = ("gguf", "hurray", "safetensors")
EXTENSIONS = {".gguf": "gguf", ".hrry": "hurray", ".safetensors": "safetensors"}

Progress = Callable[[int, int], None] | None


def sniff_format(head: bytes) -> str | None:
    """The format whose magic bytes ``head`` (the first 16+ bytes of a file) carries."""
    if head[:4] == b"GGUF":
        return "gguf"
    if head[:8] == b"HRRYFILE":
        return "hurray"
    if len(head) >= 9:
        (n,) = struct.unpack_from("<Q", head, 0)
        if 2 <= n < (1 << 31) and head[8:9] == b"{":
            return "safetensors"
    return None


def _ext_format(path: str) -> str | None:
    return EXTENSIONS.get(Path(path).suffix.lower())


def detect_format(path: str | os.PathLike[str], forced: str | None = None, *, must_exist: bool = True) -> str:
    """Resolve a file's format: ``forced`` > extension, confirmed by magic bytes for inputs."""
    p = os.fspath(path)
    if forced is not None and forced not in FORMATS:
        raise UsageError(f"unknown format {forced!r} (one of {', '.join(FORMATS)})")
    claimed = forced or _ext_format(p)
    if not must_exist:
        if claimed is None:
            raise UsageError(
                f"{p}: cannot tell the output format from the extension "
                f"(use .gguf, .hrry or .safetensors, or --to {'|'.join(FORMATS)})"
            )
        return claimed
    try:
        with open(p, "rb") as fh:
            head = fh.read(16)
    except FileNotFoundError:
        raise UsageError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{p}: is a directory") from None
    except PermissionError:
        raise UsageError(f"{p}: permission denied") from None
    found = sniff_format(head)
    if claimed is None:
        if found is None:
            raise FormatError("not a GGUF, Hurray or safetensors file (unknown magic bytes)", path=p, field="magic", offset=0)
        return found
    if found != claimed:
        what = f"--from {forced}" if forced else f"the extension {Path(p).suffix!r}"
        seen = f"looks like {found}" if found else "has no known magic bytes"
        raise BadMagicError(f"{what} says {claimed} but the file {seen}", path=p, field="magic", offset=0)
    return claimed


def _pair(src_fmt: str, dst_fmt: str, jobs: int | None = None) -> Callable[..., ConversionReport]:
    from .conversions import gguf as cg

    if (src_fmt, dst_fmt) == ("gguf", "hurray"):
        return functools.partial(cg.gguf_to_hurray, jobs=jobs)
    if (src_fmt, dst_fmt) == ("hurray", "gguf"):
        return functools.partial(cg.hurray_to_gguf, jobs=jobs)
    from .conversions import safetensors as cm

    if (src_fmt, dst_fmt) == ("safetensors", "hurray"):
        return cm.safetensors_to_hurray
    if (src_fmt, dst_fmt) == ("hurray", "safetensors"):
        return cm.hurray_to_safetensors
    raise UsageError(f"no direct conversion from {src_fmt} to {dst_fmt}")  # pragma: no cover


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    src_format: str | None = None,
    dst_format: str | None = None,
    fallback: str | None = None,
    q4_1: str = "overlay",
    convention: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    progress: Progress = None,
    jobs: int | None = None,
) -> ConversionReport:
    """Convert ``src`` into ``dst``; return the per-tensor report.

    ``jobs`` sets the threads that convert GGUF blocks (default: up to two).

    Raises :class:`~hurray_interop.errors.ConversionRefused` when a tensor is
    not exactly representable and no ``fallback`` was chosen (nothing written),
    :class:`~hurray_interop.errors.FormatError` for malformed input and
    :class:`~hurray_interop.errors.UsageError` for impossible requests.
    """
    src_s, dst_s = os.fspath(src), os.fspath(dst)
    sf = detect_format(src_s, src_format)
    df = detect_format(dst_s, dst_format, must_exist=False)
    if os.path.abspath(src_s) == os.path.abspath(dst_s) or (os.path.exists(dst_s) and os.path.samefile(src_s, dst_s)):
        raise UsageError(f"{dst_s}: output is the input file")
    if sf == df:
        raise UsageError(f"{src_s} is already {sf}; nothing to convert")
    if not force and not dry_run and os.path.exists(dst_s):
        from .errors import OutputExistsError

        raise OutputExistsError(f"{dst_s}: exists (use --force to overwrite)")
    if convention is not None and df != "safetensors":
        raise UsageError("--convention applies to safetensors output only")
    opts: dict[str, Any] = dict(fallback=fallback, dry_run=dry_run, force=force, progress=progress)
    if sf == "gguf":
        opts["q4_1"] = q4_1
    elif q4_1 != "overlay":
        raise UsageError("--q4-1 applies to GGUF input only")
    if df == "safetensors":
        opts["convention"] = convention
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise UsageError(f"--jobs takes a positive number of threads, not {jobs!r}")
    if "hurray" in (sf, df):
        return _pair(sf, df, jobs)(src_s, dst_s, **opts)

    # gguf <-> safetensors: through a temporary .hrry next to the destination
    dst_dir = os.path.dirname(os.path.abspath(dst_s))
    with tempfile.TemporaryDirectory(dir=dst_dir, prefix=".hurray-interop-") as tmp:
        mid = os.path.join(tmp, "intermediate.hrry")
        return _through_hurray(src_s, sf, dst_s, df, mid, opts, dry_run, jobs)


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
    src_s: str, sf: str, dst_s: str, df: str, mid: str, opts: dict[str, Any], dry_run: bool, jobs: int | None
) -> ConversionReport:
    first_opts = {k: v for k, v in opts.items() if k != "convention"}
    try:
        first = _pair(sf, "hurray", jobs)(src_s, None if dry_run else mid, **first_opts)
    except HurrayInteropError as exc:
        raise _renamed(exc, mid, dst_s, "while writing the intermediate Hurray file") from None
    if dry_run:
        first.destination, first.destination_format = dst_s, df
        return first
    second_opts = {k: v for k, v in opts.items() if k != "q4_1"}
    try:
        second = _pair("hurray", df, jobs)(mid, dst_s, **second_opts)
    except HurrayInteropError as exc:  # about the source's tensors, read back from the intermediate
        raise _renamed(exc, mid, src_s) from None
    second.source, second.source_format = src_s, sf
    second.notes = first.notes + [f"converted through Hurray ({len(first.tensors)} tensors)"] + second.notes
    return second
