"""hurray-interop: byte-exact conversion between GGUF, OCP MX and Hurray, with proof.

The public API is seven verbs, the same for every format (the format of a file is
told by its magic bytes, through :mod:`hurray_interop.registry`):

* :func:`convert` — one file into another (``.gguf``, ``.hrry``, ``.safetensors``);
* :func:`verify` — a round trip through Hurray, or two files compared;
* :func:`compare` — how far apart two models are: error figures per tensor, metadata differences;
* :func:`inspect` — what a file holds, as plain data;
* :func:`edit` — a copy (or the file itself) with its metadata changed, tensor data untouched;
* :func:`open` — a file's reader (a context manager);
* :func:`dequantize` — a tensor's float32 values (Hurray and safetensors: the one shared
  dequantizer; GGUF: gguf-py's decoding).

Each imports what it needs when first called, so ``import hurray_interop`` stays cheap.
The examples run from the repository root (``python -m pytest`` runs them).
"""

from __future__ import annotations

import os as _os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from .core.edits import EditResult
    from .core.model import Tensor
    from .report import ConversionReport
    from .verification.common import VerifyResult
    from ._compare import CompareResult

__version__ = "0.1.0"

__all__ = ["__version__", "convert", "verify", "compare", "inspect", "edit", "open", "dequantize"]


def convert(src: str | _os.PathLike[str], dst: str | _os.PathLike[str], **options: Any) -> "ConversionReport":
    """Convert ``src`` into ``dst`` (formats from the extensions, the source's confirmed by its
    magic bytes; GGUF ⇄ safetensors goes through Hurray; GGUF → GGUF with ``merge`` or
    ``split_max_*`` lays the model out again, tensors copied as they are) and return the
    per-tensor report.

    ``options``: the keyword parameters of :func:`hurray_interop._convert.convert`, one per
    option the formats declare in their registry records
    (:func:`hurray_interop.registry.conversion_options`; ``help(hurray_interop._convert.convert)``
    lists them with their choices and defaults): ``src_format``, ``dst_format``, ``fallback``
    (``"float32"``, ``"float16"``, ``"bfloat16"``, ``"exact"``), ``q4_1``
    (``"overlay"``/``"requantize"``, GGUF input), ``merge``, ``split_max_tensors``,
    ``split_max_size`` (GGUF output), ``convention`` (safetensors output), and ``dry_run``,
    ``force``, ``progress``, ``jobs``.  Raises
    :class:`~hurray_interop.errors.ConversionRefused` when a tensor has no exact form and no
    ``fallback`` was chosen (nothing written).

    >>> import os, tempfile, hurray_interop
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     report = hurray_interop.convert("fixtures/tiny-llama.gguf", os.path.join(tmp, "tiny-llama.hrry"))
    >>> report.counts(), report.destination_format
    ({'exact': 27}, 'hurray')
    >>> report.tensors[0].name, report.tensors[0].source_type, report.tensors[0].status
    ('token_embd.weight', 'Q8_0', 'exact')
    """
    from ._convert import convert as _convert

    return _convert(src, dst, **options)


def verify(
    path: str | _os.PathLike[str], other: str | _os.PathLike[str] | None = None, *, jobs: int | None = None,
    oracle: str | None = None, **options: Any,
) -> "VerifyResult":
    """Prove that nothing changes: with one file, convert it to Hurray and back in a temporary
    directory and compare bytes, and values against the source ecosystem's own decoder; with
    ``other``, compare the two files (a foreign file with a .hrry, or two of one format).
    ``options``: the conversion options of the :func:`convert` that wrote ``other`` from ``path``
    (:func:`hurray_interop.registry.conversion_options`: ``src_format``, ``dst_format``,
    ``fallback``, ``q4_1``, ``merge``, ``split_max_tensors``, ``split_max_size``, ``convention``;
    see ``verify SRC DST`` in the README); a round trip takes ``fallback="exact"``.
    ``oracle``: the reference decoder of GGUF values, ``"ggml"`` (llama.cpp's own C
    dequantizers, from ``hurray-interop[ggml]``; the default where they load) or ``"gguf-py"``;
    ``result.oracle`` names the one that ran.  Failures are in the result (``ok``, ``tensors``, ``problems``, ``error``), not raised.

    >>> import hurray_interop
    >>> result = hurray_interop.verify("fixtures/tiny-llama.gguf")
    >>> result.ok, result.file_bytes_equal, len(result.tensors)
    (True, True, 27)
    >>> print(result.summary_line())
    OK     fixtures/tiny-llama.gguf: round-trip (oracle ggml), files byte-identical, 27 tensors exact (bytes and values)
    """
    from ._verify import verify_pair, verify_roundtrip

    if other is None:
        return verify_roundtrip(path, jobs=jobs, oracle=oracle, **options)
    return verify_pair(path, other, jobs=jobs, oracle=oracle, **options)


def compare(a: str | _os.PathLike[str], b: str | _os.PathLike[str], *, tensors: Any = None,
            jobs: int | None = None) -> "CompareResult":
    """Compare two models of any formats (GGUF -- a shard stands for its split set --, .hrry,
    safetensors), tensors matched by name: types, shapes, max abs error, RMSE, NMSE (relative
    to ``b``), cosine similarity, the first differing element; tensors and metadata keys only in
    one, keys that differ.  ``tensors``: only these names.  ``result.identical`` is the answer,
    ``result.to_json()`` every figure, ``result.render_text()`` the report (docs/commands.md).

    >>> import hurray_interop
    >>> r = hurray_interop.compare("fixtures/tiny-llama.gguf", "fixtures/tiny-llama.gguf")
    >>> r.identical, len(r.tensors)
    (True, 27)
    """
    from ._compare import compare as _compare

    return _compare(a, b, tensors=tensors, jobs=jobs)


def inspect(path: str | _os.PathLike[str], *, fallback: str | None = None, max_items: int | None = 16) -> dict[str, Any]:
    """Describe a .hrry, GGUF or safetensors file as plain data (what ``hurray-interop inspect
    --json`` prints): header facts, tensors (for GGUF with ``shape``, ``ne`` and ``elements``)
    and metadata; for a foreign file also the conversion plan per tensor (``fallback``: the
    plan of ``convert --fallback``) and a ``summary``.  A metadata array is its first
    ``max_items`` items (``value``; ``None``: every item) and its ``count``.  A float with no
    JSON number (infinite, NaN) is the string ``"inf"``, ``"-inf"`` or ``"nan"`` (its entry's
    ``type`` says it is a float), so the data is strict JSON.  Only headers, indexes and
    scales are read.

    >>> import hurray_interop
    >>> info = hurray_interop.inspect("fixtures/tiny-llama.gguf")
    >>> info["format"], info["tensor_count"]
    ('gguf', 27)
    >>> row = info["tensors"][0]
    >>> row["name"], row["ggml_type"], row["status"]
    ('token_embd.weight', 'Q8_0', 'exact')
    >>> tokens = next(m for m in info["metadata"] if m["key"] == "tokenizer.ggml.tokens")
    >>> len(tokens["value"]), tokens["count"]
    (16, 300)
    """
    from ._inspect import inspect_file

    return inspect_file(path, fallback=fallback, max_items=max_items)


def edit(src: str | _os.PathLike[str], dst: str | _os.PathLike[str] | None = None, **options: Any) -> "EditResult":
    """Write ``src`` (GGUF, a split GGUF set, .hrry or safetensors) with its metadata edited into
    ``dst``, or over ``src`` with ``in_place=True``; the tensor data is copied by the kernel,
    every other key keeps its type, bytes and place.  ``options``: ``set`` (``"KEY=VALUE"``,
    ``"KEY:TYPE=VALUE"``, ``"KEY:[TYPE]=[JSON]"``), ``set_file`` (``"KEY=PATH"``), ``delete``
    (keys), ``rename`` (``"OLD=NEW"``), ``in_place``, ``force``, ``dry_run``, ``src_format``
    (see :func:`hurray_interop._edit.edit` and docs/commands.md, ``edit``).

    >>> import os, tempfile, hurray_interop
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     out = os.path.join(tmp, "tiny.gguf")
    ...     result = hurray_interop.edit("fixtures/tiny-llama.gguf", out, set=["llama.context_length=4096"])
    ...     with hurray_interop.open(out) as f:
    ...         value = f.kv["llama.context_length"]
    >>> print(result.changes[0].line())
    set     llama.context_length: UINT32 256 -> UINT32 4096
    >>> value.type.name, int(value.value)
    ('UINT32', 4096)
    """
    from ._edit import edit as _edit

    return _edit(src, dst, **options)


def open(path: str | _os.PathLike[str], format: str | None = None) -> Any:  # noqa: A001 - the verb is the API
    """Open a .hrry, GGUF or safetensors file for reading: a
    :class:`~hurray_interop.core.hrry.HrryFile`, :class:`~hurray_interop.formats.gguf.GGUFFile`
    or :class:`~hurray_interop.formats.safetensors.SafetensorsFile`, memory-mapped and
    usable as a context manager.  The format is the one the magic bytes say (``format``,
    a registry name, insists on one).  A shard of a split GGUF set opens as the whole
    set, as ``convert`` and ``verify`` read it: a
    :class:`~hurray_interop.formats.gguf_split.SplitModel` with the model metadata
    (``kv``, without the ``split.*`` keys), every tensor in set order and the shards
    themselves (``paths``, ``shards``); a bad set raises its located error.

    >>> import hurray_interop
    >>> with hurray_interop.open("fixtures/tiny-llama.gguf") as f:
    ...     type(f).__name__, f.tensors[0].name, f.tensors[0].type_name
    ('GGUFFile', 'token_embd.weight', 'Q8_0')
    >>> with hurray_interop.open("fixtures/tiny-split-00002-of-00003.gguf") as f:
    ...     type(f).__name__, f.count, len(f.tensors), f.shard_of(f.tensors[-1].name).name
    ('SplitModel', 3, 8, 'tiny-split-00003-of-00003.gguf')
    """
    from .registry import detect_format

    p = _os.fspath(path)
    return detect_format(p, format).open(p)


def dequantize(tensor: "Tensor | Any", **options: Any) -> "np.ndarray":
    """The float32 values of a tensor from :func:`open` (numpy order, shape ``tensor.shape``): a
    Hurray tensor's computed by the one dequantizer every check shares (``options``: ``out``,
    ``strict``, ``threads`` -- see :func:`hurray_interop.dequant.dequantize`); a GGUF tensor's
    as llama.cpp's gguf-py decodes them (the values ``verify`` holds the shared dequantizer
    to, bit for bit; :func:`hurray_interop.conversions.gguf.dequantize_gguf`); a safetensors
    tensor's (``SafetensorsFile.tensor(name)``; an MX pair by its data tensor) by the import's
    mapping and the shared dequantizer
    (:func:`hurray_interop.conversions.safetensors.dequantize_safetensors`).

    >>> import os, tempfile, hurray_interop
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     out = os.path.join(tmp, "tiny-llama.hrry")
    ...     _ = hurray_interop.convert("fixtures/tiny-llama.gguf", out)
    ...     with hurray_interop.open(out) as f:
    ...         w = hurray_interop.dequantize(f.tensor("blk.0.attn_k.weight"))  # Q4_0 in the GGUF
    >>> w.dtype, w.shape
    (dtype('float32'), (32, 64))
    >>> with hurray_interop.open("fixtures/tiny-llama.gguf") as f:
    ...     bool((hurray_interop.dequantize(f.tensor("blk.0.attn_k.weight")) == w).all())  # the same values
    True
    """
    from .core.model import Tensor
    from .dequant import dequantize as _dequantize

    if not isinstance(tensor, Tensor):
        from .registry import dequantize_foreign

        values = dequantize_foreign(tensor, **options)
        if values is not None:
            return values
    return _dequantize(tensor, **options)  # a Hurray tensor, or the error naming what was given
