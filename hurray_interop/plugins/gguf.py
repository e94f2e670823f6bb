"""GGUF (``.gguf``, llama.cpp), split sets of shards included: the record, its options and shims."""

from __future__ import annotations

import os
from typing import Any

from ..errors import HurrayInteropError, UsageError
from ..registry import EXPORT, HURRAY, IMPORT, Format, Option, get_format, read_head


def _sniff(head: bytes) -> bool:
    return head[:4] == b"GGUF"


def _to_hurray(src: str, dst: str | None, *, jobs: int | None = None, **options: Any) -> Any:
    from ..conversions.gguf import gguf_to_hurray

    return gguf_to_hurray(src, dst, jobs=jobs, **options)


def _from_hurray(src: str, dst: str | None, *, jobs: int | None = None, **options: Any) -> Any:
    from ..conversions.gguf import hurray_to_gguf

    return hurray_to_gguf(src, dst, jobs=jobs, **options)


def _relayout(src: str, dst: str | None, **options: Any) -> Any:
    from ..conversions.gguf_resplit import relayout_gguf

    return relayout_gguf(src, dst, **options)


def _member_of(path: str) -> tuple[str, int, str] | None:
    from ..formats.gguf_split import parse_shard_name

    sn = parse_shard_name(os.path.basename(path))
    if sn is None:
        return None
    return os.path.join(os.path.dirname(path), f"{sn.prefix}-of-{sn.count}"), sn.number, sn.prefix


def _outputs(src: str, dst: str, *, merge: bool = False, split_max_tensors: int | None = None,
             split_max_size: int | str | None = None) -> list[str]:
    """The files in the way of a GGUF export to ``dst`` (docs/conversion-rules.md § 10): ``dst``
    (``convert`` refuses an existing DST in any case), and the shards of a set: for a new set
    (its size unknown before converting) every shard of the sets that files named as its
    shards belong to (by the names' counts, the missing shards too), for a .hrry that
    recorded a set that set's shards; with ``merge`` only ``dst``."""
    from ..formats import gguf_split as S

    if merge:
        return [dst]
    if split_max_tensors is not None or split_max_size is not None:
        return [dst, *_whole_sets(S.shards_in_the_way(dst))]
    count = _recorded_set_count(src)
    try:
        return [dst] if count is None else [dst, *(os.fspath(p) for p in S.set_paths(dst, count))]
    except UsageError:  # the conversion reports it, located
        return [dst]


def _whole_sets(found: list[Any]) -> list[str]:
    """Every shard of each set that the shard-named files ``found`` belong to, found or not
    (by their names' counts), in set order: a batch tells a complete set from a partial one."""
    from ..formats.gguf_split import parse_shard_name, shard_name

    names = [(parse_shard_name(p.name), p) for p in found]
    counts = {(sn.prefix, sn.count): p for sn, p in names if sn is not None}
    return [os.fspath(p.with_name(shard_name(prefix, i, count)))
            for (prefix, count), p in sorted(counts.items()) for i in range(count)]


def _recorded_set_count(src: str) -> int | None:
    """The shard count of the split set a .hrry recorded (None: not a .hrry, no set, or a bad record)."""
    from ..conversions.gguf import K_SPLIT
    from ..core.hrry import HrryFile
    from ..formats.gguf_split import SplitLayout

    try:
        if not get_format(HURRAY).sniff(read_head(src)):
            return None
        with HrryFile(src) as hf:
            v = hf.kv.get(K_SPLIT)
            return None if v is None or v.type != "string" else SplitLayout.from_json(v.value).count
    except HurrayInteropError:
        return None


def _dequantize(tensor: Any, **options: Any) -> Any:
    from ..conversions.gguf import dequantize_gguf

    return dequantize_gguf(tensor, **options)


def _open(path: str) -> Any:
    from ..formats.gguf_split import open_model

    return open_model(path)  # a shard of a split set opens as the whole set (docs/conversion-rules.md § 10)


def _inspect(path: str, fallback: str | None = None, **shown: Any) -> dict[str, Any]:
    from ..inspection.gguf import inspect_gguf

    return inspect_gguf(path, fallback=fallback, **shown)


def _metadata(path: str) -> Any:
    from ..inspection.metadata import gguf_metadata

    return gguf_metadata(path)


def _values(path: str) -> Any:
    from ..formats.gguf_split import open_model
    from ..verification.compare import opened_sources
    from ..verification.gguf import VERIFIER

    return opened_sources(open_model, VERIFIER.checks, path, "gguf")


def _edit(src: str, dst: str | None, edits: Any, **options: Any) -> Any:
    from ..formats.gguf_edit import edit_gguf

    return edit_gguf(src, dst, edits, **options)


def _verifier() -> Any:
    from ..verification.gguf import VERIFIER

    return VERIFIER


#: the import's Q4_1/Q5_1 mode, and the export's file layout (docs/conversion-rules.md § 10)
OPTIONS = (
    Option("q4_1", "overlay", applies=IMPORT, choices=("overlay", "requantize"), lossy=("requantize",),
           unknown="unknown --q4-1 mode {value!r} (overlay or requantize)",
           help="Q4_1/Q5_1: exact minimum overlay composite (default) or lossy plain per-block affine"),
    Option("merge", False, applies=EXPORT, kind=bool,
           help="GGUF output: one file with every tensor of a split set (as gguf-split --merge writes it)"),
    Option("split_max_tensors", applies=EXPORT, kind=int, metavar="N",
           help="GGUF output: a split set (gguf-split shards) of at most N tensors per shard"),
    Option("split_max_size", applies=EXPORT, metavar="SIZE",
           help="GGUF output: a split set of shards of at most SIZE tensor bytes (500M, 2G: 10^6, 10^9 bytes)"),
)

#: the record; the registry registers it when it loads the built-in formats
FORMAT = Format(
    name="gguf", title="GGUF", extensions=(".gguf",), sniff=_sniff, open=_open, inspect=_inspect,
    verifier=_verifier, to_hurray=_to_hurray, from_hurray=_from_hurray, options=OPTIONS,
    member_of=_member_of, outputs=_outputs, relayout=_relayout, dequantize=_dequantize,
    tensor_type="hurray_interop.formats.gguf.GGUFTensorInfo", exact_fallback=True, edit=_edit,
    metadata=_metadata, values=_values,
)
