"""The format registry: one record per file format (after meshio's ``register_format``).

A :class:`Format` record names a format and says how to recognise it
(extensions, and a sniff predicate over the file's first bytes -- the one place
the magic bytes are declared for detection), and what the tool can do with it:
``to_hurray`` / ``from_hurray`` (its converters), ``open`` (its reader),
``inspect`` (what ``inspect`` shows) and ``verifier`` (its round-trip and pair
checks).  ``convert``, ``verify``, ``inspect``, :func:`hurray_interop.open` and
the CLI's ``--from/--to`` choices all dispatch through :func:`get_format` and
:func:`detect_format`.

The callables of the built-in records are small shims that import their module
when first called, so detecting a format (and inspecting a GGUF) loads only
what that format needs.

    >>> from hurray_interop import registry
    >>> registry.format_names()
    ('gguf', 'hurray', 'safetensors')
    >>> registry.sniff_format(b"GGUF\\x03\\x00\\x00\\x00").name
    'gguf'
    >>> registry.format_for_extension("model.hrry").name
    'hurray'
"""

from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .conversions.fallback import CHOICES as FALLBACK_CHOICES  # the --fallback vocabulary (no numpy)
from .conversions.fallback import DTYPE_CHOICES as DTYPE_FALLBACKS  # the fallbacks that store floats
from .conversions.fallback import EXACT as FALLBACK_EXACT
from .errors import BadMagicError, ConversionRefused, FormatError, HurrayInteropError, UsageError

__all__ = [
    "DTYPE_FALLBACKS",
    "FALLBACK_CHOICES",
    "FALLBACK_EXACT",
    "HURRAY",
    "SNIFF_BYTES",
    "Format",
    "register_format",
    "format_options",
    "import_to_intermediate",
    "get_format",
    "format_names",
    "formats",
    "sniff_format",
    "format_for_extension",
    "detect_format",
    "member_of",
    "output_stem",
    "output_in_directory",
    "dequantize_foreign",
    "group_models",
]

#: the name of the hub format every conversion goes through
HURRAY = "hurray"

#: how many leading bytes a sniff predicate is given
SNIFF_BYTES = 16

Converter = Callable[..., Any]


@dataclass(frozen=True)
class Format:
    """What the tool knows about one file format.

    ``to_hurray(src, dst, *, jobs=None, **options)`` and ``from_hurray`` take the
    common conversion options (``fallback``, ``dry_run``, ``force``, ``progress``)
    plus the format's own ``import_options`` / ``export_options`` (option name ->
    default; an option given away from its default to a format that does not take
    it is a usage error).  The Hurray hub itself has neither converter.
    ``member_of`` groups the files of a multi-file model (see the field).
    ``verifier()`` returns the object that runs ``roundtrip(path, result, fmt)`` and
    the pair checks (see :mod:`hurray_interop.verification.common`).
    """

    name: str
    title: str
    extensions: tuple[str, ...]
    sniff: Callable[[bytes], bool]
    open: Callable[[str], Any]
    inspect: Callable[..., dict[str, Any]]  # (path, fallback=None, max_items=16)
    verifier: Callable[[], Any]
    to_hurray: Converter | None = None
    from_hurray: Converter | None = None
    import_options: Mapping[str, Any] = field(default_factory=dict)
    export_options: Mapping[str, Any] = field(default_factory=dict)
    #: for a format whose models may span several files (GGUF split sets): ``member_of(path)``
    #: is ``(set key, place in the set, output stem)`` when the name makes the file a member
    #: of such a set, None for a file of its own (batches count a set as one source)
    member_of: Callable[[str], tuple[str, int, str] | None] | None = None
    #: for a format whose output may be several files: ``outputs(src, dst, **export_options)``
    #: lists the files converting ``src`` into ``dst`` would write or find in its way, as far
    #: as names and records tell before converting (None: ``dst`` alone); batches check them
    outputs: Callable[..., list[str]] | None = None
    #: ``dequantize(tensor, **options)``: the float32 values of a tensor this format's reader
    #: gave (``open(path).tensor(name)``), None for a tensor of another format's reader
    dequantize: Callable[..., Any] | None = None
    #: the format a file of this one converts to when only a directory is given
    #: (``convert SRC DIR/``, without ``--to``)
    counterpart: str = "hurray"
    #: the import takes ``fallback="exact"`` (exact expanded forms of what has no native
    #: mapping, with the values of the dtype fallbacks' reference decoder, bit for bit)
    exact_fallback: bool = False


_REGISTRY: dict[str, Format] = {}


def register_format(fmt: Format) -> Format:
    """Add ``fmt`` to the registry (a name or extension may be registered once)."""
    if fmt.name in _REGISTRY:
        raise ValueError(f"format {fmt.name!r} is already registered")
    taken = {ext for f in _REGISTRY.values() for ext in f.extensions}
    if taken & set(fmt.extensions):
        raise ValueError(f"extension(s) {sorted(taken & set(fmt.extensions))} already registered")
    _REGISTRY[fmt.name] = fmt
    return fmt


def format_names() -> tuple[str, ...]:
    """The registered format names, in registration order (the CLI's ``--from/--to`` choices)."""
    return tuple(_REGISTRY)


def formats() -> tuple[Format, ...]:
    return tuple(_REGISTRY.values())


def format_options(src: Format, dst: Format, given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split the format-specific options of a conversion ``src`` -> ``dst`` between its import
    (source) and export (destination) step; an option set away from its default for a format
    that does not take it is refused (:class:`UsageError`)."""
    for side, fmt, attr in (("output", dst, "export_options"), ("input", src, "import_options")):
        for f in formats():
            for opt, default in getattr(f, attr).items():
                if f is not fmt and given.get(opt, default) != default:
                    raise UsageError(f"--{opt.replace('_', '-')} applies to {f.title} {side} only")
    return (
        {k: given.get(k, d) for k, d in src.import_options.items()},
        {k: given.get(k, d) for k, d in dst.export_options.items()},
    )


def import_to_intermediate(src_s: str, sf: Format, mid: str, opts: dict[str, Any]) -> Any:
    """The import into the intermediate .hrry of a conversion between two foreign formats
    (``convert`` writes it, ``verify`` checks such a pair through it: one rule for both).
    With a dtype fallback, a source whose import has exact expanded forms stores them
    instead (their values are the reference decoder's, bit for bit): the export then
    dequantizes and casts each tensor once, in windows, into the same bytes, where the dtype
    fallback would write (and the export copy) the whole model as floats.  A source those
    forms refuse (non-finite super-block scales) takes the dtype fallback itself."""
    from .files.atomic import transient

    with transient():  # the intermediate file is deleted at the end: only the result is made durable
        if sf.exact_fallback and opts["fallback"] in DTYPE_FALLBACKS and opts.get("q4_1") != "requantize":
            try:
                return sf.to_hurray(src_s, mid, **{**opts, "fallback": FALLBACK_EXACT})  # type: ignore[misc]
            except ConversionRefused:  # e.g. a non-finite super-block scale: the dtype fallback stores it
                pass
        return sf.to_hurray(src_s, mid, **opts)  # type: ignore[misc]


def get_format(name: str) -> Format:
    """The record named ``name``; :class:`UsageError` for an unknown name."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UsageError(f"unknown format {name!r} (one of {', '.join(_REGISTRY)})") from None


def sniff_format(head: bytes) -> Format | None:
    """The format whose magic ``head`` (a file's first :data:`SNIFF_BYTES` bytes) carries."""
    return next((f for f in _REGISTRY.values() if f.sniff(head)), None)


def format_for_extension(path: str | os.PathLike[str]) -> Format | None:
    ext = Path(os.fspath(path)).suffix.lower()
    return next((f for f in _REGISTRY.values() if ext in f.extensions), None)


def _read_head(p: str) -> bytes:
    try:
        with open(p, "rb") as fh:
            return fh.read(SNIFF_BYTES)
    except FileNotFoundError:
        raise UsageError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{p}: is a directory") from None
    except PermissionError:
        raise UsageError(f"{p}: permission denied") from None


def _list(words: list[str]) -> str:
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else "".join(words)


def member_of(path: str | os.PathLike[str]) -> tuple[str, int, str] | None:
    """Where the file's name places it in a multi-file model (see :attr:`Format.member_of`)."""
    fmt = format_for_extension(path)
    return fmt.member_of(os.fspath(path)) if fmt is not None and fmt.member_of is not None else None


def output_stem(path: str | os.PathLike[str]) -> str:
    """The name an output made from ``path`` takes before its extension: a multi-file
    model's prefix (a split set's ``PREFIX``), or the file's stem."""
    member = member_of(path)
    return member[2] if member is not None else Path(os.fspath(path)).stem


def output_in_directory(src: str, directory: str, src_format: Format, dst_format: str | None) -> str:
    """``directory/<stem>.<ext>``, as ``cp SRC DIR/`` names its copy: the extension of
    ``dst_format``, or of the source format's counterpart (GGUF -> .hrry, .hrry -> .gguf)."""
    fmt = get_format(dst_format if dst_format is not None else src_format.counterpart)
    return os.path.join(directory, output_stem(src) + fmt.extensions[0])


def dequantize_foreign(tensor: Any, **options: Any) -> Any:
    """The float32 values of a tensor of a foreign format's reader, by the format that made it
    (:attr:`Format.dequantize`); None when no format claims it."""
    for f in _REGISTRY.values():
        if f.dequantize is not None:
            values = f.dequantize(tensor, **options)
            if values is not None:
                return values
    return None


def group_models(paths: Sequence[str]) -> list[tuple[str, ...]]:
    """The models among ``paths``: each a tuple of the paths given, the first the one to read.

    Every path is a model of its own, except the files of a multi-file model (the
    shards of a split GGUF set, ``model-00001-of-00003.gguf`` ...; docs/conversion-rules.md
    § 10): those of one set -- all of them, some, or one -- form one group, in their
    order in the set, in the place of the first one given; a path given twice counts
    once.  Grouping goes by the names alone (``member_of``; paths are compared
    absolute): a lone file named like a shard is still the whole model it is.
    """
    groups: list[list[tuple[int, str]]] = []
    sets: dict[str, int] = {}
    for p in paths:
        member = member_of(os.path.abspath(p))
        if member is None:
            groups.append([(0, p)])
            continue
        key, place, _ = member
        if key not in sets:
            sets[key] = len(groups)
            groups.append([])
        group = groups[sets[key]]
        if all(os.path.abspath(q) != os.path.abspath(p) for _, q in group):
            group.append((place, p))
    return [tuple(p for _, p in sorted(g)) for g in groups]


def detect_format(path: str | os.PathLike[str], forced: str | None = None, *, must_exist: bool = True) -> Format:
    """A file's format: ``forced`` (a name) > its extension, confirmed by its magic bytes
    when the file must exist (inputs); for outputs (``must_exist=False``) the name or
    extension alone."""
    p = os.fspath(path)
    claimed = get_format(forced) if forced is not None else format_for_extension(p)
    if not must_exist:
        if claimed is None:
            exts = [e for f in _REGISTRY.values() for e in f.extensions]
            raise UsageError(
                f"{p}: cannot tell the output format from the extension "
                f"(use {_list(exts)}, or --to {'|'.join(_REGISTRY)})"
            )
        return claimed
    found = sniff_format(_read_head(p))
    if claimed is None:
        if found is None:
            titles = [f.title for f in _REGISTRY.values()]
            raise FormatError(f"not a {_list(titles)} file (unknown magic bytes)", path=p, field="magic", offset=0)
        return found
    if found is not claimed:
        what = f"--from {forced}" if forced else f"the extension {Path(p).suffix!r}"
        seen = f"looks like {found.name}" if found else "has no known magic bytes"
        raise BadMagicError(f"{what} says {claimed.name} but the file {seen}", path=p, field="magic", offset=0)
    return claimed


# ---------------------------------------------------------------------------
# the built-in formats; every shim imports its module on first call


def _sniff_gguf(head: bytes) -> bool:
    return head[:4] == b"GGUF"


def _sniff_hurray(head: bytes) -> bool:
    return head[:8] == b"HRRYFILE"


def _sniff_safetensors(head: bytes) -> bool:
    """An 8-byte little-endian header length, then the header's JSON object."""
    if len(head) < 9:
        return False
    (n,) = struct.unpack_from("<Q", head, 0)
    return 2 <= n < (1 << 31) and head[8:9] == b"{"


def _gguf_to_hurray(src: str, dst: str | None, *, jobs: int | None = None, **options: Any) -> Any:
    from .conversions.gguf import gguf_to_hurray

    return gguf_to_hurray(src, dst, jobs=jobs, **options)


def _hurray_to_gguf(src: str, dst: str | None, *, jobs: int | None = None, **options: Any) -> Any:
    from .conversions.gguf import hurray_to_gguf

    return hurray_to_gguf(src, dst, jobs=jobs, **options)


def _safetensors_to_hurray(src: str, dst: str | None, *, jobs: int | None = None, **options: Any) -> Any:
    from .conversions.safetensors import safetensors_to_hurray

    return safetensors_to_hurray(src, dst, **options)  # single-threaded: ``jobs`` does not apply


def _hurray_to_safetensors(src: str, dst: str | None, *, jobs: int | None = None, **options: Any) -> Any:
    from .conversions.safetensors import hurray_to_safetensors

    return hurray_to_safetensors(src, dst, **options)


def _gguf_member_of(path: str) -> tuple[str, int, str] | None:
    from .formats.gguf_split import parse_shard_name

    sn = parse_shard_name(os.path.basename(path))
    if sn is None:
        return None
    return os.path.join(os.path.dirname(path), f"{sn.prefix}-of-{sn.count}"), sn.number, sn.prefix


def _gguf_outputs(src: str, dst: str, *, merge: bool = False, split_max_tensors: int | None = None,
                  split_max_size: int | str | None = None) -> list[str]:
    """The files in the way of a GGUF export to ``dst`` (docs/conversion-rules.md § 10): ``dst``
    (``convert`` refuses an existing DST in any case), and the shards of a set: for a new set
    (its size unknown before converting) every shard of the sets that files named as its
    shards belong to (by the names' counts, the missing shards too), for a .hrry that
    recorded a set that set's shards; with ``merge`` only ``dst``."""
    from .formats import gguf_split as S

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
    from .formats.gguf_split import parse_shard_name, shard_name

    names = [(parse_shard_name(p.name), p) for p in found]
    counts = {(sn.prefix, sn.count): p for sn, p in names if sn is not None}
    return [os.fspath(p.with_name(shard_name(prefix, i, count)))
            for (prefix, count), p in sorted(counts.items()) for i in range(count)]


def _recorded_set_count(src: str) -> int | None:
    """The shard count of the split set a .hrry recorded (None: not a .hrry, no set, or a bad record)."""
    from .conversions.gguf import K_SPLIT
    from .core.hrry import HrryFile
    from .formats.gguf_split import SplitLayout

    try:
        if not _sniff_hurray(_read_head(src)):
            return None
        with HrryFile(src) as hf:
            v = hf.kv.get(K_SPLIT)
            return None if v is None or v.type != "string" else SplitLayout.from_json(v.value).count
    except HurrayInteropError:
        return None


def _dequantize_gguf(tensor: Any, **options: Any) -> Any:
    G = sys.modules.get("hurray_interop.formats.gguf")  # loaded: a GGUF tensor exists only then
    if G is None or not isinstance(tensor, G.GGUFTensorInfo):
        return None
    from .conversions.gguf import dequantize_gguf

    return dequantize_gguf(tensor, **options)


def _dequantize_safetensors(tensor: Any, **options: Any) -> Any:
    S = sys.modules.get("hurray_interop.formats.safetensors")  # loaded: such a tensor exists only then
    if S is None or not isinstance(tensor, S.STTensor):
        return None
    from .conversions.safetensors import dequantize_safetensors

    return dequantize_safetensors(tensor, **options)


def _open_gguf(path: str) -> Any:
    from .formats.gguf_split import open_model

    return open_model(path)  # a shard of a split set opens as the whole set (docs/conversion-rules.md § 10)


def _open_hurray(path: str) -> Any:
    from .core.hrry import HrryFile

    return HrryFile(path)


def _open_safetensors(path: str) -> Any:
    from .formats.safetensors import SafetensorsFile

    return SafetensorsFile(path)


def _inspect_gguf(path: str, fallback: str | None = None, **shown: Any) -> dict[str, Any]:
    from .inspection import inspect_gguf

    return inspect_gguf(path, fallback=fallback, **shown)


def _inspect_hurray(path: str, fallback: str | None = None, **shown: Any) -> dict[str, Any]:
    from .inspection import inspect_hurray

    return inspect_hurray(path, **shown)  # a .hrry has no conversion plan into it


def _inspect_safetensors(path: str, fallback: str | None = None, **shown: Any) -> dict[str, Any]:
    from .inspection import inspect_safetensors

    return inspect_safetensors(path, **shown)  # no safetensors tensor has an expanded form


def _gguf_verifier() -> Any:
    from .verification.gguf import VERIFIER

    return VERIFIER


def _hurray_verifier() -> Any:
    from .verification.hurray import VERIFIER

    return VERIFIER


def _safetensors_verifier() -> Any:
    from .verification.safetensors import VERIFIER

    return VERIFIER


register_format(Format(
    name="gguf", title="GGUF", extensions=(".gguf",), sniff=_sniff_gguf, open=_open_gguf, inspect=_inspect_gguf,
    verifier=_gguf_verifier, to_hurray=_gguf_to_hurray, from_hurray=_hurray_to_gguf,
    import_options={"q4_1": "overlay"},
    export_options={"merge": False, "split_max_tensors": None, "split_max_size": None},  # docs/conversion-rules.md § 10
    member_of=_gguf_member_of, outputs=_gguf_outputs, dequantize=_dequantize_gguf, exact_fallback=True,
))
register_format(Format(
    name=HURRAY, title="Hurray", extensions=(".hrry",), sniff=_sniff_hurray, open=_open_hurray,
    inspect=_inspect_hurray, verifier=_hurray_verifier, counterpart="gguf",
))
register_format(Format(
    name="safetensors", title="safetensors", extensions=(".safetensors",), sniff=_sniff_safetensors,
    open=_open_safetensors, inspect=_inspect_safetensors, verifier=_safetensors_verifier,
    to_hurray=_safetensors_to_hurray, from_hurray=_hurray_to_safetensors, export_options={"convention": None},
    dequantize=_dequantize_safetensors,
))
