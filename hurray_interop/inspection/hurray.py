"""``inspect`` of a .hrry file: every tensor (name, shape, element type, layout, quantization
scheme and parameters, stored bytes) and the KV metadata."""

from __future__ import annotations

import os
from typing import Any

from .common import MAX_ITEMS, _elements, _kv_item, _quant_text, check_max_items, describe_layout, describe_quantization


def inspect_hurray(path: str, *, max_items: int | None = MAX_ITEMS) -> dict[str, Any]:
    from ..core.hrry import HrryFile

    check_max_items(max_items)
    with HrryFile(path) as hf:
        tensors = []
        members = set(hf.names) - set(hf.top_level_names())
        for name in hf.names:
            d = hf.descriptor(name)
            q = describe_quantization(d)
            tensors.append(
                {
                    "name": name,
                    "shape": [None if x is None else int(x) for x in d.shape],
                    "elements": _elements(d.shape),
                    "type": d.element_type.name,
                    "layout": describe_layout(d),
                    "quantization": _quant_text(q),
                    "quantization_params": q,
                    "stored_bytes": sum(h.byte_size for h in d.buffers),
                    "member_of_composite": name in members,
                }
            )
        info = {
            "path": path,
            "format": "hurray",
            "tensor_count": len(hf.names),
            "file_size": os.path.getsize(path),
            "alignment": hf.header.alignment,
            "tensors": tensors,
            "tensor_columns": ["name", "shape", "elements", "type", "layout", "quantization", "stored_bytes"],
            "metadata": [_kv_item(k, v, max_items) for k, v in hf.kv.items()],
        }
    top = [t for t in tensors if not t["member_of_composite"]]  # a composite's members are its elements
    known = [t["elements"] for t in top if t["elements"] is not None]
    info["summary"] = {"tensors": len(tensors), "top_level": len(top),
                       "elements": sum(known) if len(known) == len(top) else None,
                       "stored_bytes": sum(t["stored_bytes"] for t in tensors)}
    return info
