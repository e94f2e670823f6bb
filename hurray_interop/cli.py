"""The ``hurray-interop`` command line.

    hurray-interop convert SRC DST [--from F] [--to F] [--fallback float32|float16|bfloat16|exact]
                                   [--q4-1 overlay|requantize] [--convention gpt-oss|compressed-tensors|mxfp8]
                                   [--merge | --split-max-tensors N | --split-max-size SIZE]
                                   [--dry-run] [--force] [--json] [--quiet] [--jobs N]
    hurray-interop convert --to F --out-dir DIR SRC [SRC ...] [convert options] [--workers N | --scheduler ADDRESS]
    hurray-interop verify FILE [FILE ...] [--pair | --each] [--fallback exact] [--oracle ggml|gguf-py]
                                          [--json] [--quiet] [--jobs N] [--workers N | --scheduler ADDRESS]
    hurray-interop verify SRC DST [the options of the convert SRC DST that wrote DST]
    hurray-interop inspect FILE [--fallback F] [--json | --markdown] [--full | --max-items N]
    hurray-interop edit SRC (DST | --in-place) [--set KEY[:TYPE]=VALUE] [--set-file KEY=PATH] [--delete KEY]
                        [--rename OLD=NEW] [--dry-run] [--force] [--json] [--quiet]

Exit status: 0 success; 1 refused or inexact conversion, failed verification;
2 bad input or usage.  One line on stderr for every error; ``--debug`` adds the
traceback.  This is the only module that prints or exits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence, TextIO

# Nothing here asks BLAS for threads, and numpy's OpenBLAS starts one per core at numpy's
# import that spins for about 0.1 s of CPU: on two cores, time verify's workers lose.  Set
# before numpy is imported (nothing above imports it); a user's own setting stands.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from . import __version__
from .errors import ConversionRefused, HurrayInteropError, UsageError
from .registry import FALLBACK_CHOICES, conversion_options, format_names, lossy_options, option_defaults, run_options
from .report import ConversionReport

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

#: how a conversion runs (``--dry-run``, ``--force``, ``--jobs``), as the registry declares it
_RUN = {o.name: o for o in run_options()}


class _Formatter(argparse.HelpFormatter):
    """argparse's help layout, which looks the terminal's width up (importing shutil: ~3 ms
    of a start) when help or usage is laid out, not for every parser and argument made."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, width=0 if width is None else width)
        self._asked = (max_help_position, width)

    def format_help(self) -> str:
        max_help_position, width = self._asked
        if width is None:  # the width and help position argparse.HelpFormatter.__init__ sets
            import shutil

            width = shutil.get_terminal_size().columns - 2
            self._width = width
            self._max_help_position = min(max_help_position, max(width - 20, self._indent_increment * 2))
        return super().format_help()


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit status 2.

    A command's arguments are added when that command is parsed or its help is shown
    (``fill``): a run builds the arguments of its own command only."""

    def __init__(self, *args: Any, fill: Callable[[argparse.ArgumentParser], None] | None = None, **kw: Any) -> None:
        kw.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kw)
        self._fill = fill
        self._intermixing = False

    def complete(self) -> "_Parser":
        """This parser with all its arguments added."""
        fill, self._fill = self._fill, None
        if fill is not None:
            fill(self)
        return self

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """A command's options may come anywhere among its paths (``convert SRC --force DST``,
        as ``cp`` takes them): argparse's intermixed parsing, for every command parser."""
        parser = self.complete()
        if self._subparsers is not None or self._intermixing:  # the main parser; or the passes inside
            return super(_Parser, parser).parse_known_args(args, namespace)
        self._intermixing, usage = True, self.usage
        if usage is None:  # argparse would lay the usage out now, for messages we never print
            self.usage = _LazyUsage(self)  # type: ignore[assignment]
        try:
            return super(_Parser, parser).parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing, self.usage = False, usage

    def format_usage(self) -> str:
        return super(_Parser, self.complete()).format_usage()

    def format_help(self) -> str:
        return super(_Parser, self.complete()).format_help()

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


class _LazyUsage:
    """A parser's usage while intermixed parsing runs: argparse's intermixed parsing lays the
    usage out before parsing (looking the terminal's width up); this lays it out only when
    help or usage is shown (argparse formats ``usage % {prog}``)."""

    def __init__(self, parser: "_Parser") -> None:
        self._parser = parser

    def __mod__(self, values: object) -> str:
        p = self._parser
        # the first pass hides the positionals (nargs SUPPRESS, the real one kept in save_nargs)
        hidden = [a for a in p._get_positional_actions() if a.nargs == argparse.SUPPRESS and hasattr(a, "save_nargs")]
        saved, p.usage = p.usage, None
        for a in hidden:
            a.nargs = a.save_nargs  # type: ignore[attr-defined]
        try:
            return p.format_usage()[len("usage: "):].rstrip("\n")
        finally:
            p.usage = saved  # type: ignore[assignment]
            for a in hidden:
                a.nargs = argparse.SUPPRESS


class _Version(argparse.Action):
    """``--version``, naming the block-moving kernel that runs ("c" or "numpy"), imported only when asked."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from .kernels import KERNEL

        print(f"hurray-interop {__version__} (kernel: {KERNEL})")
        parser.exit()


def _add_run_options(p: argparse.ArgumentParser, *, quiet: str) -> None:
    """Options that convert and verify share."""
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--quiet", "-q", action="store_true", help=quiet)
    p.add_argument("--jobs", "-j", **_RUN["jobs"].argparse_kwargs())
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)


def _add_batch_options(p: argparse.ArgumentParser, *, out_dir: bool = False) -> None:
    """Options of a batch: many files, in local processes or on a Dask cluster."""
    if out_dir:
        p.add_argument(
            "--out-dir", metavar="DIR",
            help="convert every SRC into DIR/<stem>.<extension of --to> (a batch; --to is required); "
            "DIR is created if its parent exists",
        )
    p.add_argument(
        "--workers", type=int, default=1, metavar="N",
        help="run the files in N local processes (default 1: one after another in this process)",
    )
    p.add_argument(
        "--scheduler", metavar="ADDRESS",
        help="run one task per file on the Dask distributed scheduler at ADDRESS (tcp://host:8786); "
        "needs hurray-interop[dask] and workers that see the same paths; waits up to 10 s for the scheduler "
        "($HURRAY_INTEROP_CONNECT_TIMEOUT seconds)",
    )


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="hurray-interop",
        description="Move quantized weights between GGUF, OCP MX (safetensors) and Hurray (.hrry), "
        "byte-exact, and prove it.",
    )
    p.add_argument("--version", action=_Version, nargs=0, help="show the version and which kernel runs, then exit")
    p.add_argument("--debug", action="store_true", help="show a traceback on errors")
    # prog: what argparse would compute (the main parser's prog: it has no positionals), without a layout
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser, prog=p.prog)
    sub.add_parser(
        "convert", fill=_convert_arguments,
        help="convert SRC into DST (formats from extensions, confirmed by magic bytes)",
    )
    sub.add_parser(
        "verify", fill=_verify_arguments,
        help="round-trip each FILE through Hurray and back and compare bytes and values; "
        "with --pair (or two files of different formats) compare the two files",
        description="Round-trip each FILE, or compare two files. verify SRC DST takes the options of the "
        "convert SRC DST that wrote DST: the check is that DST is what that conversion writes and true to SRC; "
        "tensors its report calls lossy pass 'as reported'. --fallback exact and --q4-1 overlay change nothing "
        "for a pair, --force is ignored (verify writes nothing).",
    )
    sub.add_parser(
        "compare", fill=_compare_arguments,
        help="compare two models of any formats: per tensor types, shapes and error figures, and metadata",
        description="Compare two models (GGUF, split sets, .hrry, safetensors), tensors matched by name: "
        "types, shapes, max abs error, RMSE, NMSE (relative to B), cosine similarity, the first differing "
        "element; tensors only in one; metadata keys only in one or different. Exit 0 when every value and "
        "key is identical, 1 when anything differs, 2 for bad input.",
    )
    sub.add_parser(
        "inspect", fill=_inspect_arguments,
        help="show tensors, their mapping and metadata of a .hrry, .gguf or .safetensors file",
    )
    sub.add_parser(
        "edit", fill=_edit_arguments,
        help="write SRC with its metadata changed into DST (or over SRC with --in-place); tensor data untouched",
        description="Change the metadata of a GGUF file (a split set: its first shard's), a .hrry's KV section or a "
        "safetensors __metadata__. Every other key keeps its type, bytes and place; the tensor data is copied by the "
        "kernel. No edits: a byte-identical copy.",
    )
    return p


def _convert_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "paths", nargs="+", metavar="PATH",
        help="SRC DST, or with --out-dir DIR: SRC [SRC ...]; a DST that is a directory (DIR/, or an existing DIR) "
        "gets DIR/<stem>.<ext> as with cp: the extension of --to, else the source's counterpart "
        "(GGUF and safetensors -> .hrry, .hrry -> .gguf; a split set's shards)",
    )
    _add_conversion_options(c)
    c.add_argument("--dry-run", **_RUN["dry_run"].argparse_kwargs())
    c.add_argument("--force", **_RUN["force"].argparse_kwargs())
    c.add_argument(
        "--skip-existing", action="store_true",
        help="with --out-dir: skip the sources whose output exists (outputs are atomic: an existing one is "
        "complete), so that an interrupted batch resumes; not with --force",
    )
    _add_run_options(c, quiet="no progress bar, no summary")
    _add_batch_options(c, out_dir=True)


def _add_conversion_options(c: argparse.ArgumentParser, *, verify: bool = False) -> None:
    """The options of a conversion: convert's, and verify's for the pair SRC DST they made --
    every option the registry declares (:func:`~hurray_interop.registry.conversion_options`),
    with its flag, type, choices, default and help."""
    for o in conversion_options():
        c.add_argument(o.cli_flag, **o.argparse_kwargs(verify=verify))


def _verify_arguments(v: argparse.ArgumentParser) -> None:
    from ._verify import ORACLES

    v.add_argument("files", nargs="+", metavar="FILE")
    v.add_argument("--pair", action="store_true", help="compare exactly two files with each other")
    v.add_argument("--each", action="store_true", help="round-trip every file, even two of different formats")
    v.add_argument(
        "--oracle", choices=ORACLES, default=None,
        help="the reference decoder GGUF values are held to, bit for bit: ggml (llama.cpp's own C dequantizers, "
        "from hurray-interop[ggml]; the default where they load) or gguf-py (its numpy ones; the default otherwise)",
    )
    _add_conversion_options(v, verify=True)
    v.add_argument("--force", action="store_true", help="accepted as convert takes it, and ignored: verify writes nothing")
    _add_run_options(v, quiet="print summary lines only")
    _add_batch_options(v)


def _compare_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("a", metavar="A", help="a model: .gguf (a shard stands for its set), .hrry or .safetensors")
    c.add_argument("b", metavar="B", help="the model A is compared with (NMSE is relative to B)")
    c.add_argument("--json", action="store_true", help="machine-readable output: every tensor, every figure")
    c.add_argument("--full", action="store_true", help="metadata values whole (default: shortened to 60 characters)")
    c.add_argument("-v", "--verbose", action="store_true", help="list identical tensors too (default: counted)")
    c.add_argument("--tensor", action="append", metavar="NAME", dest="tensors",
                   help="compare only this tensor (repeatable); the metadata is still compared")
    c.add_argument("--jobs", **_RUN["jobs"].argparse_kwargs())
    c.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)


def _inspect_arguments(i: argparse.ArgumentParser) -> None:
    i.add_argument("file", metavar="FILE")
    i.add_argument("--fallback", choices=FALLBACK_CHOICES, help="show the plan of convert --fallback CHOICE")
    how = i.add_mutually_exclusive_group()
    how.add_argument("--json", action="store_true", help="machine-readable output")
    how.add_argument("--markdown", action="store_true", help="Markdown output (as gguf-dump --markdown)")
    many = i.add_mutually_exclusive_group()
    many.add_argument("--full", action="store_true", help="whole arrays and strings (default: the first 16 items)")
    many.add_argument("--max-items", type=_count_arg, metavar="N", help="show the first N items of each array")
    i.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)


def _edit_arguments(e: argparse.ArgumentParser) -> None:
    e.add_argument("src", metavar="SRC")
    e.add_argument("dst", metavar="DST", nargs="?", help="the edited copy (the same format; a split set: its first shard's name)")
    e.add_argument("--set", action="append", default=[], metavar="KEY[:TYPE]=VALUE", dest="set",
                   help="set KEY (an existing key keeps its type when VALUE fits it; else the type is inferred: "
                   "true/false, integer, float, [JSON array], string); TYPE e.g. UINT32, STRING, [INT32] (repeatable)")
    e.add_argument("--set-file", action="append", default=[], metavar="KEY[:TYPE]=PATH", dest="set_file",
                   help="set KEY to the UTF-8 text of the file PATH, as a string (a chat template) (repeatable)")
    e.add_argument("--delete", action="append", default=[], metavar="KEY", help="remove KEY (repeatable)")
    e.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                   help="rename the key OLD to NEW, in its place (repeatable)")
    e.add_argument("--in-place", action="store_true",
                   help="replace SRC: a new file renamed over it when complete (SRC's bytes never change before)")
    e.add_argument("--from", dest="src_format", choices=format_names(), help="force the source format")
    e.add_argument("--dry-run", action="store_true", help="show what would change; write nothing")
    e.add_argument("--force", **_RUN["force"].argparse_kwargs())
    e.add_argument("--json", action="store_true", help="print the changes as JSON")
    e.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    e.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)


def _cmd_edit(args: argparse.Namespace, out: TextIO) -> int:
    from ._edit import edit

    result = edit(args.src, args.dst, set=args.set, set_file=args.set_file, delete=args.delete, rename=args.rename,
                  in_place=args.in_place, force=args.force, dry_run=args.dry_run, src_format=args.src_format)
    if args.json:
        out.write(json.dumps(result.to_dict(), indent=2) + "\n")
    elif not args.quiet:
        lines = [c.line() for c in result.changes] or ["no changes (a byte-identical copy)"]
        verb = "would write" if result.dry_run else "wrote"
        out.write("".join(line + "\n" for line in lines) + f"{verb} {', '.join(result.outputs)}\n")
    return EXIT_OK


def _count_arg(text: str) -> int:
    """A count option's value: a non-negative integer."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return n


# ---------------------------------------------------------------------------
# progress


@contextmanager
def _progress(enabled: bool, desc: str, unit: str = "B") -> Iterator[Callable[[int, int], None] | None]:
    """A ``progress(done, total)`` callback (bytes, or files) drawing a tqdm bar on a terminal."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    scale = dict(unit_scale=True, unit_divisor=1024) if unit == "B" else {}
    bar = tqdm(total=0, unit=unit, **scale, desc=desc, leave=False, file=sys.stderr)

    def update(done: int, total: int) -> None:
        if bar.total != total:  # drawn at once: a short job shows its total, not a bare count
            bar.total = total
            bar.refresh()
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        bar.close()


# ---------------------------------------------------------------------------
# rendering


def _fmt_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    if not rows:
        return
    widths = [max(len(str(r[c])) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(str(cell).ljust(w) for cell, w in zip(r, widths)).rstrip() + "\n")


def _render_conversion(report: ConversionReport, out: TextIO) -> None:
    rows = [("tensor", "source", "hurray mapping" if report.destination_format == "hurray" else "mapping", "status", "bytes in", "bytes out", "note")]
    for t in report.tensors:
        note = t.note
        if t.max_abs_error is not None:
            note = (note + "; " if note else "") + f"max abs error {t.max_abs_error:.6g}"
        rows.append((t.name, t.source_type, t.mapping, t.status, _fmt_bytes(t.bytes_in), _fmt_bytes(t.bytes_out), note))
    _table(rows, out)
    stopped = report.refused and not report.dry_run  # the conversion stopped before writing anything
    for n in [] if stopped else report.notes + report.form_notes + _substitution_note(report):
        out.write(f"note: {n}\n")  # (a refused run's notes would describe what was not written)
    counts = ", ".join(f"{v} {k}" for k, v in sorted(report.counts().items()))
    what = (f"{report.source} ({report.source_format}) -> {report.destination} ({report.destination_format}): "
            f"{len(report.tensors)} tensors ({counts})")
    hint = f"; {report.hint}" if report.refused and report.hint else ""
    if stopped:
        out.write(f"refused: nothing written; {what}{hint}\n")
        return
    if report.refusal:  # a dry run: the conversion would stop before writing
        out.write(f"would refuse: {what}; {report.refusal}\n")
        return
    if report.refused:  # a dry run whose conversion would refuse these tensors
        out.write(f"would refuse: {what}{hint}\n")
        return
    sizes = f", {_fmt_bytes(report.bytes_in)} -> {_fmt_bytes(report.bytes_out)} of tensor data"
    out.write(f"{'would convert' if report.dry_run else 'converted'} {what}{sizes}{hint}\n")


def _substitution_note(report: ConversionReport) -> list[str]:
    """All-zero blocks whose source scale the destination forbids: one note for the run
    (normal and exact; ``--json`` has the count per tensor)."""
    blocks, tensors = report.substitutions()
    if not blocks:
        return []
    if report.destination_format != "hurray":  # an export: the recorded originals come back
        return [f"{blocks} all-zero block(s) in {tensors} tensor(s) get back their recorded original scale (exact)"]
    return [f"{blocks} all-zero block(s) in {tensors} tensor(s) stored with the rules' substitute for their "
            "forbidden scale and recorded: converting back restores the original bytes (normal; exact)"]


def _render_verify(result: Any, out: TextIO, quiet: bool) -> None:
    if not quiet:
        rows = [("tensor", "source", "mapping", "bytes equal", "values equal", "max abs diff", "where")]
        for t in result.tensors:
            rows.append(
                (
                    t.name,
                    t.source_type,
                    t.mapping,
                    "yes" if t.bytes_equal else ("n/a" if t.bytes_equal is None else "NO"),
                    "yes" if t.values_equal else ("n/a" if t.values_equal is None else "NO"),
                    "" if t.max_abs_diff is None else f"{t.max_abs_diff:.6g}",
                    "; ".join(x for x in (t.reported, t.where) if x),
                )
            )
        _table(rows, out)
        for p in result.problems:
            out.write(f"difference: {p}\n")
        if result.oracle:
            out.write(f"values held to {result.oracle}: {result.oracle_version}\n")
    out.write(result.summary_line() + "\n")


# ---------------------------------------------------------------------------
# commands


def _convert_options(args: argparse.Namespace) -> dict[str, Any]:
    """The single-file conversion options of the command line, by their API names (the
    registry's declarations: :class:`hurray_interop.batch.ConvertOptions`' fields)."""
    return {name: getattr(args, name) for name in option_defaults(run=True)}


def _cmd_convert(args: argparse.Namespace, out: TextIO) -> int:
    from ._convert import convert

    with _progress(not (args.quiet or args.json or args.dry_run), "convert") as progress:
        try:
            report = convert(args.src, args.dst, progress=progress, **_convert_options(args))
        except ConversionRefused as exc:
            report = exc.details.get("report")
            if report is not None and not args.quiet:
                if args.json:
                    out.write(json.dumps(report.to_dict(), indent=2) + "\n")
                else:
                    _render_conversion(report, out)
            for name, typ, reason in exc.reasons:
                sys.stderr.write(f"hurray-interop: refused: {args.src}: tensor {name!r} ({typ}): {reason}\n")
            raise
    if args.json:
        out.write(json.dumps(report.to_dict(), indent=2) + "\n")
    elif not args.quiet:
        _render_conversion(report, out)
    if args.dry_run and report.would_refuse:
        return EXIT_FAILED
    return EXIT_OK


def _verify_options(args: argparse.Namespace) -> dict[str, Any]:
    """The conversion options of ``verify SRC DST`` by their API names (:class:`hurray_interop.batch.VerifyOptions`)."""
    return {name: getattr(args, name) for name in option_defaults()}


def _cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    from ._verify import plan_checks, verify_check

    options = _verify_options(args)
    checks = plan_checks(args.files, pair=args.pair, each=args.each, **options)
    # one check: a bar over the tensors compared, on a terminal (several: one line each as before)
    with _progress(len(checks) == 1 and not (args.quiet or args.json), "verify", unit="tensor") as progress:
        results = [verify_check(c, jobs=args.jobs, progress=progress, oracle=args.oracle, **options) for c in checks]
    status = EXIT_OK
    if args.json:
        out.write(json.dumps([r.to_dict() for r in results], indent=2) + "\n")
    for r in results:
        if r.error is not None:
            # malformed input: one line on stderr, nothing else for this file
            sys.stderr.write(f"hurray-interop: error: {r.error}\n")
            status = EXIT_BAD_INPUT
            continue
        if not args.json:
            _render_verify(r, out, args.quiet or len(results) > 1)
        if not r.ok and status == EXIT_OK:
            status = EXIT_FAILED
    if len(results) > 1 and not args.json:
        good = sum(1 for r in results if r.ok)
        out.write(f"{good} of {len(results)} files verified exact\n")
    return status


def _cmd_inspect(args: argparse.Namespace, out: TextIO) -> int:
    from ._inspect import inspect_file, render_markdown, render_text, terminal_safe

    shown = {"max_items": None} if args.full else {} if args.max_items is None else {"max_items": args.max_items}
    info = inspect_file(args.file, fallback=args.fallback, **shown)
    # the whole text is made before any of it is written: an error leaves no half output
    enc = getattr(out, "encoding", None) or "utf-8"
    if args.json:  # UTF-8 as text; \uXXXX escapes where the output cannot encode it
        text = terminal_safe(json.dumps(info, indent=2, ensure_ascii=not _encodes(enc), default=str)) + "\n"
    else:
        text = render_markdown(info, full=args.full) if args.markdown else render_text(info, width=_columns(out), full=args.full)
        if not _encodes(enc, text):  # a terminal that cannot show some text: escapes instead
            text = text.encode(enc, "backslashreplace").decode(enc)
    out.write(text)
    return EXIT_OK


def _cmd_compare(args: argparse.Namespace, out: TextIO) -> int:
    from ._compare import compare, to_json_text

    result = compare(args.a, args.b, tensors=args.tensors, jobs=args.jobs)
    # the whole text is made before any of it is written: an error leaves no half output
    text = to_json_text(result, full=args.full) if args.json else result.render_text(verbose=args.verbose, full=args.full)
    enc = getattr(out, "encoding", None) or "utf-8"
    if not _encodes(enc, text):
        text = text.encode(enc, "backslashreplace").decode(enc)
    out.write(text)
    return EXIT_OK if result.identical else EXIT_FAILED


def _encodes(encoding: str, text: str = "\u2581\U0001f600") -> bool:
    """Can ``encoding`` write ``text`` (by default: does it write any Unicode)?"""
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _columns(out: TextIO) -> int | None:
    """The width to wrap ``inspect``'s table on: $COLUMNS, else the terminal's; None (no
    wrapping: one line per tensor) when writing to a pipe or file."""
    try:
        return max(int(os.environ["COLUMNS"]), 1)
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(out.fileno()).columns if out.isatty() else None
    except (AttributeError, OSError, ValueError):
        return None


# ---------------------------------------------------------------------------
# batches: many files, one result line (or JSON object) each as it finishes

_BATCH_LABELS = {"ok": "OK", "skipped": "SKIPPED", "refused": "REFUSED", "verification failed": "FAILED", "bad input": "ERROR", "error": "ERROR"}


def _cmd_convert_any(args: argparse.Namespace, out: TextIO) -> int:
    """``convert SRC DST``, or a batch: ``convert --to F --out-dir DIR SRC [SRC ...]``."""
    if args.out_dir is not None:
        return _cmd_convert_batch(args, out)
    if args.skip_existing:
        raise UsageError("--skip-existing resumes batches: give --out-dir DIR")
    if args.workers != 1 or args.scheduler is not None:
        raise UsageError("--workers and --scheduler run batches: give --out-dir DIR")
    if len(args.paths) != 2:
        if len(args.paths) == 1:
            raise UsageError("the following arguments are required: DST (or --out-dir DIR)")
        raise UsageError(f"convert takes SRC DST, not {len(args.paths)} paths; to convert several files give --out-dir DIR")
    args.src, args.dst = args.paths
    return _cmd_convert(args, out)


def _cmd_convert_batch(args: argparse.Namespace, out: TextIO) -> int:
    from .batch import plan_convert

    if args.dst_format is None:
        raise UsageError("--out-dir needs --to FORMAT (the format of the outputs)")
    batch = plan_convert(args.paths, args.out_dir, skip_existing=args.skip_existing, **_convert_options(args))
    return _run_batch(batch, args, out, "would convert" if args.dry_run else "converted")


def _cmd_verify_any(args: argparse.Namespace, out: TextIO) -> int:
    """``verify FILE ...`` in this process (today's output), or as a batch with --workers/--scheduler."""
    if args.workers == 1 and args.scheduler is None:
        return _cmd_verify(args, out)
    from .batch import plan_verify

    batch = plan_verify(args.files, pair=args.pair, each=args.each, jobs=args.jobs, oracle=args.oracle,
                        **_verify_options(args))
    # pairs of a lossy conversion pass "as reported" (float32 is value-exact: its values are equal)
    lossy = bool(lossy_options(vars(args)))
    return _run_batch(batch, args, out, "verified (lossy as reported)" if lossy else "verified exact")


def _run_batch(batch: Any, args: argparse.Namespace, out: TextIO, verb: str) -> int:
    """Run a checked batch; print each file's result as it finishes, then the summary."""
    from .batch import Summary, open_executor

    summary = Summary()
    show = not (args.quiet or args.json)
    try:
        with open_executor(args.workers, args.scheduler) as executor, \
                _progress(show and batch.files > 1, "files", unit="file") as progress:
            results = batch.run(executor)
            if batch.created and show:
                _write_line(out, f"created the output directory {batch.out_dir}")
            for result in results:
                summary.add(result)
                _write_result(result, args, out)
                if progress is not None:
                    progress(summary.files, batch.files)
    except KeyboardInterrupt:
        sys.stderr.write(
            f"hurray-interop: interrupted after {summary.files} of {batch.files} files; "
            "the others cancelled, no partial output\n"
        )
        return 130
    if args.json:
        _write_line(out, json.dumps(summary.to_dict()))
    elif not args.quiet:
        others = ", ".join(f"{n} {status}" for status, n in sorted(summary.counts.items()) if status != "ok")
        ok = summary.counts.get("ok", 0)
        _write_line(out, f"{ok} of {summary.files} files {verb}" + (f" ({others})" if others else ""))
    return summary.exit_code


def _write_result(result: Any, args: argparse.Namespace, out: TextIO) -> None:
    if args.json:
        _write_line(out, json.dumps(result.to_dict()))
    if result.exit_code == EXIT_BAD_INPUT:  # one line on stderr, as for a single file
        _write_line(sys.stderr, f"hurray-interop: error: {result.reason}")
    elif not args.json and not (args.quiet and result.exit_code == EXIT_OK):
        body = result.reason if result.reason.startswith(result.source) else f"{result.source}: {result.reason}"
        _write_line(out, f"{_BATCH_LABELS[result.status]:<7} {body}")


def _write_line(stream: TextIO, line: str) -> None:
    """Write one line now (a progress bar on the terminal steps aside)."""
    from tqdm import tqdm

    with tqdm.external_write_mode(file=stream):
        stream.write(line + "\n")
        stream.flush()


_COMMANDS = {"convert": _cmd_convert_any, "verify": _cmd_verify_any, "compare": _cmd_compare, "inspect": _cmd_inspect,
             "edit": _cmd_edit}


def _print_traceback() -> None:  # --debug only: not imported on every start
    import traceback

    traceback.print_exc()


def _no_blas_threads() -> None:
    """Nothing this tool does multiplies matrices, so numpy's OpenBLAS need not start its
    thread pool when numpy is imported (~40 ms of every command's start on a 2-core
    machine) -- unless the user chose a count, or numpy is already loaded."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (the console script exits with it)."""
    _no_blas_threads()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    out = sys.stdout
    try:
        args = _build_parser().parse_args(argv)
        if args.command is None:
            raise UsageError("no command given (use convert, verify, compare, inspect or edit; --help for help)")
        return _COMMANDS[args.command](args, out)
    except HurrayInteropError as exc:
        if debug:
            _print_traceback()
        if not isinstance(exc, ConversionRefused) or not exc.reasons:
            sys.stderr.write(f"hurray-interop: error: {exc}\n")
        else:
            sys.stderr.write(f"hurray-interop: {exc}\n")
        return exc.exit_status
    except KeyboardInterrupt:
        if debug:
            _print_traceback()
        sys.stderr.write("hurray-interop: interrupted; no output written\n")
        return 130
    except BrokenPipeError:  # the reader of our output went away (e.g. `| head`): stop quietly
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep interpreter shutdown from failing again
        except OSError:
            pass
        return 141
    except OSError as exc:  # file system trouble outside our checks (disk full, I/O error)
        if debug:
            _print_traceback()
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        sys.stderr.write(f"hurray-interop: error: {where}{exc.strerror or exc}\n")
        return EXIT_BAD_INPUT
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)
    except Exception as exc:  # a defect of ours: still one line, never a traceback unless asked
        if debug:
            _print_traceback()
        sys.stderr.write(
            f"hurray-interop: internal error: {type(exc).__name__}: {exc} "
            "(this is a bug; rerun with --debug for the traceback)\n"
        )
        return EXIT_BAD_INPUT
