"""safetensors (``.safetensors``), OCP MX checkpoints among them: the record and its shims."""

from __future__ import annotations

import struct
from typing import Any

from ..registry import EXPORT, Format, Option
from ..tables import load_table


def _sniff(head: bytes) -> bool:
    """An 8-byte little-endian header length, then the header's JSON object."""
    if len(head) < 9:
        return False
    (n,) = struct.unpack_from("<Q", head, 0)
    return 2 <= n < (1 << 31) and head[8:9] == b"{"


def _conventions() -> tuple[str, ...]:
    """The MX checkpoint conventions (``mappings/mx_types.toml``), read when asked."""
    return tuple(load_table("mx_types")["conventions"])


def _to_hurray(src: str, dst: str | None, *, jobs: int | None = None, **options: Any) -> Any:
    from ..conversions.safetensors import safetensors_to_hurray

    return safetensors_to_hurray(src, dst, **options)  # single-threaded: ``jobs`` does not apply


def _from_hurray(src: str, dst: str | None, *, jobs: int | None = None, **options: Any) -> Any:
    from ..conversions.safetensors import hurray_to_safetensors

    return hurray_to_safetensors(src, dst, **options)


def _dequantize(tensor: Any, **options: Any) -> Any:
    from ..conversions.safetensors import dequantize_safetensors

    return dequantize_safetensors(tensor, **options)


def _open(path: str) -> Any:
    from ..formats.safetensors import SafetensorsFile

    return SafetensorsFile(path)


def _inspect(path: str, fallback: str | None = None, **shown: Any) -> dict[str, Any]:
    from ..inspection.safetensors import inspect_safetensors

    return inspect_safetensors(path, **shown)  # no safetensors tensor has an expanded form


def _metadata(path: str) -> Any:
    from ..inspection.metadata import safetensors_metadata

    return safetensors_metadata(path)


def _values(path: str) -> Any:
    from ..formats.safetensors import SafetensorsFile
    from ..verification.compare import opened_sources
    from ..verification.safetensors import VERIFIER

    return opened_sources(SafetensorsFile, VERIFIER.checks, path, "safetensors")


def _edit(src: str, dst: str | None, edits: Any, **options: Any) -> Any:
    from ..formats.safetensors_edit import edit_safetensors

    return edit_safetensors(src, dst, edits, **options)


def _verifier() -> Any:
    from ..verification.safetensors import VERIFIER

    return VERIFIER


OPTIONS = (
    Option("convention", applies=EXPORT, choices=_conventions,
           unknown="unknown convention {value!r} (one of: {choices})",
           help="safetensors output: MX checkpoint convention (default: the one recorded at import)"),
)

#: the record; the registry registers it when it loads the built-in formats
FORMAT = Format(
    name="safetensors", title="safetensors", extensions=(".safetensors",), sniff=_sniff, open=_open,
    inspect=_inspect, verifier=_verifier, to_hurray=_to_hurray, from_hurray=_from_hurray, options=OPTIONS,
    dequantize=_dequantize, tensor_type="hurray_interop.formats.safetensors.STTensor", edit=_edit,
    metadata=_metadata, values=_values,
)
