"""The format registry: one record per file format (after meshio's ``register_format``).

A :class:`Format` record names a format and says how to recognise it
(extensions, and a sniff predicate over the file's first bytes -- the one place
the magic bytes are declared for detection), what the tool can do with it:
``to_hurray`` / ``from_hurray`` (its converters), ``open`` (its reader),
``inspect`` (what ``inspect`` shows), ``verifier`` (its round-trip and pair
checks) and ``edit`` (its metadata rewriter), and the options its import or export takes (:class:`Option`: name,
type, default, choices, help, the direction it applies to, the check).
``convert``, ``verify``, ``inspect``, :func:`hurray_interop.open`, the batch
layer and the CLI dispatch through :func:`get_format` and
:func:`detect_format`, and take their conversion options from
:func:`conversion_options`: ``convert()``'s keyword parameters,
``batch.ConvertOptions`` / ``VerifyOptions``, the CLI's flags and their help.

This module knows no format's internals.  Each built-in format is one module of
:mod:`hurray_interop.plugins` that declares its record and registers it
(:data:`BUILTIN_FORMATS` names them; they are loaded on the first look-up).  Its
callables import their modules when first called, so detecting a format (and
inspecting a GGUF) loads only what that format needs.  A new format is one such
module (its reader, converters and verifier beside it) and one entry in
:data:`BUILTIN_FORMATS` -- or a :func:`register_format` call of its own.

    >>> from hurray_interop import registry
    >>> registry.format_names()
    ('gguf', 'hurray', 'safetensors')
    >>> registry.sniff_format(b"GGUF\\x03\\x00\\x00\\x00").name
    'gguf'
    >>> registry.format_for_extension("model.hrry").name
    'hurray'
    >>> [o.cli_flag for o in registry.conversion_options()]
    ['--from', '--to', '--fallback', '--q4-1', '--merge', '--split-max-tensors', '--split-max-size', '--convention']
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .conversions.fallback import CHOICES as FALLBACK_CHOICES  # the --fallback vocabulary (no numpy)
from .conversions.fallback import DTYPE_CHOICES as DTYPE_FALLBACKS  # the fallbacks that store floats
from .conversions.fallback import EXACT as FALLBACK_EXACT
from .conversions.fallback import LOSSY_CHOICES as LOSSY_FALLBACKS
from .errors import BadMagicError, FormatError, UsageError

__all__ = [
    "DTYPE_FALLBACKS",
    "FALLBACK_CHOICES",
    "FALLBACK_EXACT",
    "HURRAY",
    "SNIFF_BYTES",
    "BUILTIN_FORMATS",
    "IMPORT",
    "EXPORT",
    "CONVERSION",
    "RUN",
    "Option",
    "Format",
    "register_format",
    "unregister_format",
    "conversion_options",
    "run_options",
    "option_defaults",
    "lossy_options",
    "format_options",
    "read_head",
    "SAID",
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

#: the built-in formats, in registration order: each the module ``hurray_interop.plugins.<name>``,
#: which declares the format's record and registers it (loaded on the first look-up)
BUILTIN_FORMATS = ("gguf", "hurray", "safetensors")

#: the directions an :class:`Option` applies to: a format's import (the format is the
#: source), its export (the destination), the whole conversion (every format), or the run
#: (how ``convert`` runs: not a property of the output, not taken by ``verify SRC DST``)
IMPORT, EXPORT, CONVERSION, RUN = "input", "output", "conversion", "run"

#: what ``verify SRC DST``'s help adds to an option's own
SAID = " (as the conversion SRC -> DST was given it)"

Converter = Callable[..., Any]


@dataclass(frozen=True)
class Option:
    """One option of a conversion, declared once; ``convert()``'s keyword parameter, the batch
    options' field, the CLI flag and its help, and the check all come from it.

    ``kind`` is ``str``, ``int`` or ``bool`` (a flag: ``store_true``); ``choices`` a tuple or a
    callable giving it (read when the CLI's ``convert``/``verify`` arguments are made or a
    value is checked); ``unknown`` the message for a value outside them (``{value!r}``,
    ``{choices}``); ``verify_help`` what ``verify``'s help adds (default :data:`SAID`);
    ``lossy`` the values that make a conversion lossy (a batch says "lossy as reported"; the
    import through Hurray then takes no exact expanded forms)."""

    name: str
    default: Any = None
    help: str = ""
    applies: str = IMPORT
    kind: type = str
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None
    unknown: str = ""
    flag: str = ""
    metavar: str | None = None
    verify_help: str = SAID
    lossy: tuple[Any, ...] = ()

    @property
    def cli_flag(self) -> str:
        """The command line's flag: ``flag``, else ``--name`` with dashes (``q4_1`` -> ``--q4-1``)."""
        return self.flag or "--" + self.name.replace("_", "-")

    def allowed(self) -> tuple[str, ...] | None:
        return self.choices() if callable(self.choices) else self.choices

    def check(self, value: Any) -> None:
        """Raise :class:`UsageError` for a value outside ``choices`` (the default always passes)."""
        allowed = self.allowed()
        if allowed is None or value == self.default or value in allowed:
            return
        text = self.unknown or "unknown " + self.cli_flag + " {value!r} (one of: {choices})"
        raise UsageError(text.format(value=value, choices=", ".join(allowed)))

    def argparse_kwargs(self, *, verify: bool = False) -> dict[str, Any]:
        """``add_argument(option.cli_flag, **this)``: the CLI's argument for the option."""
        kw: dict[str, Any] = {"dest": self.name, "help": self.help + (self.verify_help if verify else "")}
        if self.kind is bool:
            return {**kw, "action": "store_true"}
        if self.kind is int:
            kw["type"] = int
        if self.choices is not None:
            kw["choices"] = self.allowed()
        if self.default is not None:
            kw["default"] = self.default
        if self.metavar is not None:
            kw["metavar"] = self.metavar
        return kw


@dataclass(frozen=True)
class Format:
    """What the tool knows about one file format.

    ``to_hurray(src, dst, *, jobs=None, **options)`` and ``from_hurray`` take the
    common conversion options (``fallback``, ``dry_run``, ``force``, ``progress``)
    plus the format's own ``options`` that apply to its import / export (an option
    given away from its default to a format that does not take it is a usage error).
    The Hurray hub itself has neither converter.
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
    #: the options of the format's import (``applies=IMPORT``) and export (``EXPORT``)
    options: tuple[Option, ...] = ()
    #: for a format whose models may span several files (GGUF split sets): ``member_of(path)``
    #: is ``(set key, place in the set, output stem)`` when the name makes the file a member
    #: of such a set, None for a file of its own (batches count a set as one source)
    member_of: Callable[[str], tuple[str, int, str] | None] | None = None
    #: for a format whose output may be several files: ``outputs(src, dst, **export_options)``
    #: lists the files converting ``src`` into ``dst`` would write or find in its way, as far
    #: as names and records tell before converting (None: ``dst`` alone); batches check them
    outputs: Callable[..., list[str]] | None = None
    #: ``dequantize(tensor, **options)``: the float32 values of a tensor this format's reader
    #: gave (``open(path).tensor(name)``, an instance of :attr:`tensor_type`)
    dequantize: Callable[..., Any] | None = None
    #: the class of that reader's tensors, ``"module.Class"`` (looked up only once its module is
    #: loaded: such a tensor exists only then)
    tensor_type: str | None = None
    #: ``metadata(path)`` for ``compare``: ``(entries, keys left out)``, an entry ``(key, item as
    #: inspect shows it, comparable value)`` (see :mod:`hurray_interop.inspection.metadata`)
    metadata: Callable[[str], Any] | None = None
    #: ``values(path)`` for ``compare``: a context manager giving ``(value sources, release)``, the
    #: model's tensors (:class:`hurray_interop.verification.compare.ValueSource`) and a callable
    #: that drops the mapped pages read so far
    values: Callable[[str], Any] | None = None
    #: the format a file of this one converts to when only a directory is given
    #: (``convert SRC DIR/``, without ``--to``)
    counterpart: str = "hurray"
    #: for a format a file of which can be written to the same format laid out again (GGUF:
    #: a split set merged, a model split): ``relayout(src, dst, *, dry_run, force, progress,
    #: **export_options)``; ``convert`` calls it when source and destination formats are this
    #: one (None: such a conversion is a usage error, "nothing to convert")
    relayout: Converter | None = None
    #: the import takes ``fallback="exact"`` (exact expanded forms of what has no native
    #: mapping, with the values of the dtype fallbacks' reference decoder, bit for bit)
    exact_fallback: bool = False
    #: ``edit(src, dst, edits, *, force, dry_run)``: the container's metadata rewritten
    #: (:mod:`hurray_interop.core.edits` records; ``dst`` None: in place), the tensor data
    #: copied by the kernel; returns an :class:`~hurray_interop.core.edits.EditResult`
    #: (None: the format cannot be edited)
    edit: Converter | None = None

    @property
    def import_options(self) -> dict[str, Any]:
        """The import's options: name -> default."""
        return {o.name: o.default for o in self.options if o.applies == IMPORT}

    @property
    def export_options(self) -> dict[str, Any]:
        """The export's options: name -> default."""
        return {o.name: o.default for o in self.options if o.applies == EXPORT}


_REGISTRY: dict[str, Format] = {}
_LOADING = threading.RLock()
_state = "new"  # -> "loading" (the plugins' records are being registered) -> "loaded"


def _records() -> dict[str, Format]:
    """The registry, the built-in formats loaded first (the registry registers each plugin
    module's ``FORMAT``, in the order of :data:`BUILTIN_FORMATS`; another thread waits until
    all are in; a failed load leaves nothing registered and is tried again on the next call)."""
    global _state
    if _state != "loaded":
        with _LOADING:
            if _state == "new":  # "loading": a plugin's own register_format call, in this thread
                _state = "loading"
                try:
                    for name in BUILTIN_FORMATS:
                        register_format(importlib.import_module(f"{__package__}.plugins.{name}").FORMAT)
                except BaseException:
                    _REGISTRY.clear()
                    _state = "new"
                    raise
                _state = "loaded"
    return _REGISTRY


def register_format(fmt: Format) -> Format:
    """Add ``fmt`` to the registry (a name, extension or option name may be registered once)."""
    records = _records()
    if fmt.name in records:
        raise ValueError(f"format {fmt.name!r} is already registered")
    taken = {ext for f in records.values() for ext in f.extensions}
    if taken & set(fmt.extensions):
        raise ValueError(f"extension(s) {sorted(taken & set(fmt.extensions))} already registered")
    names = {o.name for o in (*COMMON_OPTIONS, *RUN_OPTIONS)} | {o.name for f in records.values() for o in f.options}
    clash = sorted(names & {o.name for o in fmt.options})
    if clash:
        raise ValueError(f"option(s) {clash} already registered")
    if any(o.applies not in (IMPORT, EXPORT) for o in fmt.options):
        raise ValueError("a format's options apply to its input or output")
    records[fmt.name] = fmt
    return fmt


def unregister_format(name: str) -> Format:
    """Remove the record named ``name`` (a format registered for a while, e.g. by a test)."""
    fmt = get_format(name)
    del _REGISTRY[name]
    return fmt


def format_names() -> tuple[str, ...]:
    """The registered format names, in registration order (the CLI's ``--from/--to`` choices)."""
    return tuple(_records())


def formats() -> tuple[Format, ...]:
    return tuple(_records().values())


#: the options of every conversion, whatever its formats
COMMON_OPTIONS = (
    Option("src_format", help="force the source format", applies=CONVERSION, choices=format_names, flag="--from",
           unknown="unknown format {value!r} (one of {choices})"),
    Option("dst_format", help="force the destination format", applies=CONVERSION, choices=format_names, flag="--to",
           unknown="unknown format {value!r} (one of {choices})"),
    Option(
        "fallback", applies=CONVERSION, choices=FALLBACK_CHOICES, lossy=LOSSY_FALLBACKS,
        unknown="unknown fallback {value!r} (one of: {choices})",
        help="store tensors that cannot be converted exactly dequantized as this type (reported per tensor); "
        "exact: GGUF types without a native mapping (K-quants, IQ, TQ, NVFP4) in their exact expanded form",
        verify_help="; verify: of the conversion SRC -> DST (a lossy tensor passes as reported when DST is what that "
        "conversion writes), or for a round trip --fallback exact",
    ),
)

#: how ``convert`` runs (``convert()``'s keywords and ``batch.ConvertOptions``' fields; the CLI's
#: ``--dry-run``, ``--force`` and ``--jobs`` have the help of each command)
RUN_OPTIONS = (
    Option("dry_run", False, "show the plan per tensor; write nothing", applies=RUN, kind=bool),
    Option("force", False, "overwrite an existing DST", applies=RUN, kind=bool),
    Option("jobs", None, "threads for the block conversion and dequantization (default: up to 2, one per core)",
           applies=RUN, kind=int, metavar="N"),
)


def conversion_options() -> tuple[Option, ...]:
    """The options that describe a conversion: the common ones, then every format's own, in
    registration order (``verify SRC DST`` takes them all)."""
    return COMMON_OPTIONS + tuple(o for f in formats() for o in f.options)


def run_options() -> tuple[Option, ...]:
    return RUN_OPTIONS


def option_defaults(*, run: bool = False) -> dict[str, Any]:
    """Option name -> default, of :func:`conversion_options` (and, with ``run``, :data:`RUN_OPTIONS`)."""
    return {o.name: o.default for o in conversion_options() + (RUN_OPTIONS if run else ())}


def lossy_options(given: Mapping[str, Any], *, but: tuple[str, ...] = ()) -> list[str]:
    """The names of the options (except ``but``) whose value in ``given`` makes a conversion lossy."""
    return [o.name for o in conversion_options() if o.name not in but and o.lossy and given.get(o.name) in o.lossy]


def format_options(src: Format, dst: Format, given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split the format-specific options of a conversion ``src`` -> ``dst`` between its import
    (source) and export (destination) step, each value checked by its option; an option set
    away from its default for a format that does not take it is refused (:class:`UsageError`)."""
    for applies, fmt in ((EXPORT, dst), (IMPORT, src)):
        for f in formats():
            for o in f.options:
                if o.applies == applies and f is not fmt and given.get(o.name, o.default) != o.default:
                    raise UsageError(f"{o.cli_flag} applies to {f.title} {applies} only")
    mine = [o for o in src.options if o.applies == IMPORT] + [o for o in dst.options if o.applies == EXPORT]
    for o in mine:
        o.check(given.get(o.name, o.default))
    return (
        {o.name: given.get(o.name, o.default) for o in src.options if o.applies == IMPORT},
        {o.name: given.get(o.name, o.default) for o in dst.options if o.applies == EXPORT},
    )


def get_format(name: str) -> Format:
    """The record named ``name``; :class:`UsageError` for an unknown name."""
    try:
        return _records()[name]
    except KeyError:
        raise UsageError(f"unknown format {name!r} (one of {', '.join(_REGISTRY)})") from None


def sniff_format(head: bytes) -> Format | None:
    """The format whose magic ``head`` (a file's first :data:`SNIFF_BYTES` bytes) carries."""
    return next((f for f in formats() if f.sniff(head)), None)


def format_for_extension(path: str | os.PathLike[str]) -> Format | None:
    ext = Path(os.fspath(path)).suffix.lower()
    return next((f for f in formats() if ext in f.extensions), None)


def read_head(p: str) -> bytes:
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
    for f in formats():
        if f.dequantize is not None and f.tensor_type is not None:
            module, _, name = f.tensor_type.rpartition(".")
            loaded = sys.modules.get(module)
            if loaded is not None and isinstance(tensor, getattr(loaded, name)):
                return f.dequantize(tensor, **options)
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
            exts = [e for f in formats() for e in f.extensions]
            raise UsageError(
                f"{p}: cannot tell the output format from the extension "
                f"(use {_list(exts)}, or --to {'|'.join(format_names())})"
            )
        return claimed
    found = sniff_format(read_head(p))
    if claimed is None:
        if found is None:
            titles = [f.title for f in formats()]
            raise FormatError(f"not a {_list(titles)} file (unknown magic bytes)", path=p, field="magic", offset=0)
        return found
    if found is not claimed:
        what = f"--from {forced}" if forced else f"the extension {Path(p).suffix!r}"
        seen = f"looks like {found.name}" if found else "has no known magic bytes"
        raise BadMagicError(f"{what} says {claimed.name} but the file {seen}", path=p, field="magic", offset=0)
    return claimed


