"""hurray-interop: byte-exact conversion between GGUF, OCP MX and Hurray, with proof."""

from __future__ import annotations

__version__ = "0.1.0"
