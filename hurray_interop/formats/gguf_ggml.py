"""ggml's own C dequantizers, through ctypes: ``ggml_get_type_traits(type)->to_float`` of
the shared library that PyPI's ``libggml-python`` ships (``pip install hurray-interop[ggml]``).

This is the decoder llama.cpp itself runs, and ``verify``'s default oracle where it loads
(docs/format-notes.md § 1.8).  It decodes every GGML type
with a ``to_float``, including Q1_0 and Q2_0, which gguf-py cannot; the only wheel is for
CPython 3.11 on x86-64 Linux, so everything here degrades to "not available, and why".

``to_float(const void *x, float *y, int64_t k)`` trusts its arguments and reads raw memory.
:func:`decode_blocks` is one door to it, :func:`decoder_address` the other (for
``kernels.dequant_diff_decoded``, which checks the same things before its C runs it):
:func:`decode_blocks` takes a C-contiguous ``uint8`` array of
shape ``(n, block_bytes)`` (a view the GGUF reader has bounds-checked against the file),
a C-contiguous, writeable float32 ``out`` of exactly ``n * block_elements`` values, and
a type whose block geometry the library reports exactly as ``mappings/ggml_types.toml``
does (checked once per type, at first use).  Anything else is a
:class:`~hurray_interop.errors.UsageError` before a byte reaches C.

Nothing here is a format of its own: it belongs to the GGUF family (its types, its
blocks) and knows only the core's errors.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError

__all__ = ["ENV_VAR", "available", "unavailable_reason", "version", "has_decoder", "decode_blocks"]

#: ``HURRAY_INTEROP_GGML=off`` hides the library (the gguf-py oracle then runs, as on a machine without it)
ENV_VAR = "HURRAY_INTEROP_GGML"

#: the PyPI distribution that ships the library, and the version this module was written against
DISTRIBUTION = "libggml-python"


class _Traits(ctypes.Structure):
    """``struct ggml_type_traits`` (ggml.h) of ggml 0.9 / libggml-python 0.20."""

    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

#: type ids the library is asked about: those of ggml.h's ``enum ggml_type`` up to Q2_0 (42);
#: reading the traits of an id at or past ``GGML_TYPE_COUNT`` is undefined behaviour
_MAX_TYPE_ID = 42


def _library_path() -> Path:
    import libggml  # from libggml-python

    root = Path(libggml.__file__).resolve().parent
    for sub in ("lib64", "lib"):
        found = sorted((root / sub).glob("libggml-base.so*"))
        if found:
            return found[0]
    raise OSError(f"no libggml-base.so under {root}")


@functools.cache
def _load() -> tuple[Any, str, str]:
    """``(library, version, "")``, or ``(None, "", why not)``."""
    if os.environ.get(ENV_VAR, "").lower() in ("0", "off", "no", "false"):
        return None, "", f"{ENV_VAR}={os.environ[ENV_VAR]} turns it off"
    try:
        path = _library_path()
    except ImportError:
        return None, "", f"{DISTRIBUTION} is not installed (pip install 'hurray-interop[ggml]'; CPython 3.11, x86-64 Linux)"
    except OSError as exc:
        return None, "", f"{DISTRIBUTION} is installed but broken: {exc}"
    try:
        lib = ctypes.CDLL(str(path))
        lib.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
        lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    except (OSError, AttributeError) as exc:
        return None, "", f"{path.name} does not load: {exc}"
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        v = dist_version(DISTRIBUTION)
    except PackageNotFoundError:  # pragma: no cover - imported, so installed
        v = "?"
    return lib, v, ""


def available() -> bool:
    """Whether ggml's library loads here."""
    return _load()[0] is not None


def unavailable_reason() -> str:
    """Why the library does not load ("" when it does)."""
    return _load()[2]


def version() -> str:
    """The version of ``libggml-python`` loaded ("" when none)."""
    return _load()[1]


#: type ids whose ``to_float`` is not the value the type defines, so never used: F16 (1) quiets
#: signalling NaNs (0x7C01 -> 0x7FC02000, where the exact widening gives 0x7F802000); numpy's
#: cast decodes it under either oracle
_NOT_EXACT = frozenset({1})


@functools.cache
def _decoder(type_id: int, block_elements: int, block_bytes: int) -> Any:
    """The type's ``to_float``, or None: when the library has none, reports another block
    geometry than ours (another ggml's type of that id: never trusted with our bytes), or the
    type is in :data:`_NOT_EXACT`."""
    lib = _load()[0]
    if lib is None or not 0 <= type_id <= _MAX_TYPE_ID or type_id in _NOT_EXACT:
        return None
    tr = lib.ggml_get_type_traits(type_id).contents
    if not tr.to_float or tr.blck_size != block_elements or tr.type_size != block_bytes or tr.blck_size_interleave:
        return None
    return _TO_FLOAT(tr.to_float)


def decoder_address(type_id: int, block_elements: int, block_bytes: int) -> int | None:
    """The address of the type's ``to_float`` (:func:`has_decoder`'s), for C code that runs it
    over bounds-checked whole blocks (kernels.dequant_diff_decoded), or None."""
    fn = _decoder(type_id, block_elements, block_bytes)
    return ctypes.cast(fn, ctypes.c_void_p).value if fn is not None else None


def has_decoder(type_id: int, block_elements: int, block_bytes: int) -> bool:
    """Whether ggml decodes this type (id and block geometry as our table has them)."""
    return _decoder(type_id, block_elements, block_bytes) is not None


def decode_blocks(type_id: int, block_elements: int, block_bytes: int, blocks: np.ndarray,
                  out: np.ndarray | None = None) -> np.ndarray:
    """ggml's float32 values of ``blocks`` (``uint8``, shape ``(n, block_bytes)``, C-contiguous),
    written to ``out`` (float32, C-contiguous, ``n * block_elements`` values) or a new array.
    The library must decode the type (:func:`has_decoder`)."""
    fn = _decoder(type_id, block_elements, block_bytes)
    if fn is None:
        raise UsageError(f"ggml has no decoder for GGML type {type_id} here" + (
            f" ({unavailable_reason()})" if not available() else ""))
    if (not isinstance(blocks, np.ndarray) or blocks.dtype != np.uint8 or blocks.ndim != 2
            or blocks.shape[1] != block_bytes or not blocks.flags.c_contiguous):
        raise UsageError(f"ggml's decoder takes C-contiguous uint8 blocks of {block_bytes} bytes")
    n = blocks.shape[0] * block_elements
    if out is None:
        out = np.empty(n, dtype=np.float32)
    elif (not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.size != n
          or not out.flags.c_contiguous or not out.flags.writeable or np.may_share_memory(out, blocks)):
        raise UsageError(f"ggml's decoder writes {n} values into a C-contiguous, writeable float32 array "
                         "apart from its input")
    if n:
        fn(blocks.ctypes.data, out.ctypes.data, n)
    return out
