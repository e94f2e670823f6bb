"""Locate and load the declarative tables in ``mappings/``.

The tables are the single source of truth for type correspondences (Hurray
element types, GGML types, MX element types).  They live in the repository's
top-level ``mappings/`` folder; a built wheel carries them as
``hurray_interop/mappings`` (``force-include`` in ``pyproject.toml``), while an
editable install finds them beside the package directory.  Both locations are
tried, in that order, and ``tests/test_packaging.py`` checks both installs.
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

__all__ = ["mappings_dir", "load_table"]


@functools.cache
def mappings_dir() -> Path:
    """The folder holding the ``*.toml`` mapping tables."""
    package = Path(__file__).resolve().parent
    for where in (package / "mappings", package.parent / "mappings"):  # wheel, then editable/source
        if where.is_dir():
            return where
    raise RuntimeError(  # an installation defect, not a user error
        "hurray_interop: the mappings/ tables are missing from this installation "
        f"(looked in {package / 'mappings'} and in {package.parent / 'mappings'})"
    )


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


@functools.cache
def load_table(name: str) -> Mapping[str, Any]:
    """Load ``mappings/<name>.toml`` as a read-only mapping (cached)."""
    path = mappings_dir() / f"{name}.toml"
    with path.open("rb") as fh:
        return _freeze(tomllib.load(fh))
