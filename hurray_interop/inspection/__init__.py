"""What ``hurray-interop inspect`` shows per format, as plain data (the CLI renders it).

One module per format (:mod:`.hurray`, :mod:`.gguf`, :mod:`.safetensors`), each with its
``inspect_<format>``, which the format's record (:mod:`hurray_interop.plugins`) calls;
:func:`hurray_interop.inspect` picks the record by the file's magic bytes.  :mod:`.common`
holds what they share: descriptors, metadata items and text as shown, and a conversion
plan as rows.

For a .hrry file: every tensor (name, shape, element type, layout,
quantization scheme and parameters, stored bytes) and the KV metadata.
For a .gguf file: header facts, metadata with exact GGUF types, and the
conversion plan per tensor (what ``convert --dry-run`` would do).
For a .safetensors file: its tensors, the MX convention detected, metadata.
Only headers, indexes and (for the GGUF plan) scales are read.
What every result holds is said in :mod:`.common`.
"""

from .common import MAX_ITEMS, check_max_items, describe_layout, describe_quantization, safe_text
from .gguf import inspect_gguf
from .hurray import inspect_hurray
from .safetensors import inspect_safetensors

__all__ = ["inspect_hurray", "inspect_gguf", "inspect_safetensors", "describe_quantization", "describe_layout",
           "check_max_items", "safe_text", "MAX_ITEMS"]
