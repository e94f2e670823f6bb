"""The Hurray hub format (``.hrry``): read, inspected and verified; every conversion goes through it."""

from __future__ import annotations

from typing import Any

from ..registry import HURRAY, Format


def sniff(head: bytes) -> bool:
    return head[:8] == b"HRRYFILE"


def _open(path: str) -> Any:
    from ..core.hrry import HrryFile

    return HrryFile(path)


def _inspect(path: str, fallback: str | None = None, **shown: Any) -> dict[str, Any]:
    from ..inspection.hurray import inspect_hurray

    return inspect_hurray(path, **shown)  # a .hrry has no conversion plan into it


def _metadata(path: str) -> Any:
    from ..inspection.metadata import hurray_metadata

    return hurray_metadata(path)


def _values(path: str) -> Any:
    from ..verification.compare import hurray_sources

    return hurray_sources(path)


def _verifier() -> Any:
    from ..verification.hurray import VERIFIER

    return VERIFIER


#: the record; the registry registers it when it loads the built-in formats
FORMAT = Format(
    name=HURRAY, title="Hurray", extensions=(".hrry",), sniff=sniff, open=_open, inspect=_inspect,
    verifier=_verifier, counterpart="gguf", metadata=_metadata, values=_values,
)
