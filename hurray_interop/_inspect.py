"""The entry point of ``inspect``: :func:`inspect_file` (the format's record does the work)."""

from __future__ import annotations

import os
from typing import Any

from .registry import detect_format

__all__ = ["inspect_file"]


def inspect_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Describe a .hrry, .gguf or .safetensors file (format confirmed by magic bytes)."""
    p = os.fspath(path)
    return detect_format(p).inspect(p)
