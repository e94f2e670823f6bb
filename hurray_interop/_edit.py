"""The ``edit`` verb: a model file's metadata changed, its tensor data copied by the kernel.

The edits are parsed and checked first (:func:`hurray_interop.core.edits.parse_edits`), then
the source's format (by its magic bytes) rewrites its own metadata through its registry
record's ``edit`` (:attr:`hurray_interop.registry.Format.edit`): GGUF (a split set's model
metadata, in its first shard), ``.hrry`` (its KV section), safetensors (``__metadata__``).
The output is written beside its destination and renamed into place when complete; with
``in_place`` the new file is renamed over the old one, whose bytes never change before.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from .core.edits import EditResult, parse_edits
from .errors import UnsupportedError, UsageError
from .registry import detect_format

__all__ = ["edit"]


def _check_paths(src: Any, dst: Any, in_place: bool, fmt: Any) -> str | None:
    if in_place and dst is not None:
        raise UsageError("give DST or --in-place, not both")
    if not in_place and dst is None:
        raise UsageError("give DST, or --in-place to replace SRC")
    if dst is None:
        return None
    out = detect_format(dst, must_exist=False)
    if out is not fmt:
        raise UsageError(f"edit keeps the format: DST must be a {fmt.title} file (use convert to change it)", path=dst)
    return os.fspath(dst)


def edit(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str] | None = None,
    *,
    set: Sequence[str] = (),  # noqa: A002 - the CLI's --set
    set_file: Sequence[str] = (),
    delete: Sequence[str] = (),
    rename: Sequence[str] = (),
    in_place: bool = False,
    force: bool = False,
    dry_run: bool = False,
    src_format: str | None = None,
) -> EditResult:
    """Write ``src`` with its metadata edited into ``dst`` (or over ``src`` with ``in_place``).

    ``set``: ``"KEY=VALUE"`` / ``"KEY:TYPE=VALUE"`` (``TYPE`` a value type of the format,
    ``[TYPE]`` an array given as JSON); ``set_file``: ``"KEY=PATH"``, the file's UTF-8 text
    as a string; ``delete``: keys; ``rename``: ``"OLD=NEW"``.  No edits: a byte-identical
    copy.  ``force`` overwrites an existing ``dst``; ``dry_run`` writes nothing and returns
    what would change.  Bad edits or input raise :class:`~hurray_interop.errors.UsageError`
    / :class:`~hurray_interop.errors.FormatError` before anything is written.
    """
    edits = parse_edits(set=set, set_file=set_file, delete=delete, rename=rename)
    fmt = detect_format(src, src_format)
    target = _check_paths(src, dst, in_place, fmt)
    if fmt.edit is None:
        raise UnsupportedError(f"{fmt.title} files cannot be edited", path=src)
    path = os.path.realpath(src) if in_place else os.fspath(src)  # a symlink stays: its target is replaced
    return fmt.edit(path, target, edits, force=force, dry_run=dry_run)
