"""``inspect`` of a safetensors file: its tensors, the MX convention detected, metadata, and the
Hurray mapping planned per tensor."""

from __future__ import annotations

import os
from typing import Any

from .common import MAX_ITEMS, _add_plan, _elements, check_max_items, safe_text


def inspect_safetensors(path: "str | os.PathLike[str]", *, max_items: int | None = MAX_ITEMS) -> dict[str, Any]:
    """Describe a safetensors file: tensors, the MX convention detected, metadata, and the
    Hurray mapping planned for each tensor (a dry run: nothing is written).  ``max_items``
    does not apply: safetensors metadata values are strings."""
    from ..conversions.safetensors import safetensors_to_hurray
    from ..formats.safetensors import SafetensorsFile, detect_pairs

    check_max_items(max_items)
    p = os.fspath(path)
    with SafetensorsFile(p) as st:
        pairs, _ = detect_pairs(st)
        convs = sorted({q.convention for q in pairs})
        info: dict[str, Any] = {
            "path": p,
            "format": "safetensors",
            "tensor_count": len(st.entries),
            "file_size": os.path.getsize(p),
            "convention": "none" if not convs else (convs[0] if len(convs) == 1 else "mixed"),
            "metadata": [{"key": safe_text(k), "type": "string", "value": safe_text(v)}
                         for k, v in (st.metadata or {}).items()],
            "source_tensors": [
                {"name": safe_text(e.name), "dtype": e.dtype, "shape": list(e.shape), "elements": _elements(e.shape),
                 "bytes": e.nbytes}
                for e in st.entries
            ],
        }
    _add_plan(info, safetensors_to_hurray(p, None, dry_run=True), "source_type")
    return info
