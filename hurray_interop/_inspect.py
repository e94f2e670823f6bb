"""The entry point of ``inspect``: :func:`inspect_file` (the format's record does the work)."""

from __future__ import annotations

import os
from typing import Any

from .registry import detect_format

__all__ = ["inspect_file"]


def inspect_file(path: str | os.PathLike[str], *, fallback: str | None = None) -> dict[str, Any]:
    """Describe a .hrry, .gguf or .safetensors file (format confirmed by magic bytes).
    ``fallback``: the conversion plan shown is the one ``convert --fallback`` would follow."""
    p = os.fspath(path)
    fmt = detect_format(p)
    return fmt.inspect(p, fallback=fallback) if fallback else fmt.inspect(p)
