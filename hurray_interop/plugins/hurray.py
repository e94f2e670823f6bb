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


def _edit(src: str, dst: str | None, edits: Any, **options: Any) -> Any:
    from ..conversions.gguf import edited_gguf_records
    from ..core.hrry_edit import edit_hrry

    return edit_hrry(src, dst, edits, records=edited_gguf_records, **options)  # an import from GGUF keeps its types


def _verifier() -> Any:
    from ..verification.hurray import VERIFIER

    return VERIFIER


#: the record; the registry registers it when it loads the built-in formats
FORMAT = Format(
    name=HURRAY, title="Hurray", extensions=(".hrry",), sniff=sniff, open=_open, inspect=_inspect,
    verifier=_verifier, counterpart="gguf", edit=_edit, metadata=_metadata, values=_values,
)
