"""Many files at once: convert or verify a model collection, locally or on a cluster.

:func:`convert_many` and :func:`verify_many` run one task per source file on
any :class:`concurrent.futures.Executor` -- a
:class:`~concurrent.futures.ProcessPoolExecutor`, a Dask distributed
``Client.get_executor()``, or ``None`` to run in this process, one file after
another.  They check every path *before* submitting anything (each input
exists and is readable; no two sources map to the same output), then yield one
:class:`FileResult` per file as each finishes::

    from concurrent.futures import ProcessPoolExecutor
    from hurray_interop.batch import convert_many, summarize

    with ProcessPoolExecutor(4) as pool:
        results = list(convert_many(["a.gguf", "b.gguf"], "out", dst_format="hurray", executor=pool))
    print(summarize(results).exit_code)

Tasks carry paths, never file contents: every worker must see the same files
under the same (absolute) paths -- a shared file system on a cluster -- and
writes its outputs itself, atomically, exactly as a single conversion does.
A task never raises: an error inside it (malformed input, a refusal, a bug)
becomes that file's result; a failure of the executor itself (a lost worker, a
broken pool) becomes that file's result too.  One bad file never stops the
others.  Closing the result iterator early (or Ctrl-C while it waits) cancels
every task not yet finished.

The functions the tasks call -- :func:`convert_file`, :func:`plan_checks`,
:func:`verify_check`, :func:`output_extension`, :func:`output_paths` -- are the
only places this module touches the conversion and verification code.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from .errors import ConversionRefused, HurrayInteropError, OutputExistsError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    from .report import ConversionReport
    from .verification.common import VerifyResult

__all__ = [
    "OK",
    "REFUSED",
    "SKIPPED",
    "BAD_INPUT",
    "FAILED",
    "ERROR",
    "ConvertOptions",
    "VerifyOptions",
    "FileResult",
    "Summary",
    "convert_many",
    "verify_many",
    "convert_task",
    "verify_task",
    "Batch",
    "plan_convert",
    "plan_verify",
    "group_sources",
    "check_inputs",
    "plan_outputs",
    "check_outputs",
    "summarize",
    "open_executor",
    "DASK_HINT",
    "CONNECT_TIMEOUT",
    "CONNECT_TIMEOUT_ENV",
    "connect_timeout",
]

#: per-file statuses and the exit status each stands for (the worst one is the batch's)
OK = "ok"
REFUSED = "refused"
FAILED = "verification failed"
BAD_INPUT = "bad input"
ERROR = "error"  # a defect of ours or of the executor (lost worker, broken pool)
SKIPPED = "skipped"  # --skip-existing: its output exists complete (every shard of a split set)
EXIT_STATUS = {OK: 0, SKIPPED: 0, REFUSED: 1, FAILED: 1, BAD_INPUT: 2, ERROR: 2}

DASK_HINT = "--scheduler needs Dask distributed, which is not installed: install hurray-interop[dask] (pip install 'hurray-interop[dask]')"

#: seconds to wait for a Dask scheduler to answer; the environment variable overrides it
CONNECT_TIMEOUT = 10.0
CONNECT_TIMEOUT_ENV = "HURRAY_INTEROP_CONNECT_TIMEOUT"

Group = tuple[str, ...]


# ---------------------------------------------------------------------------
# the conversion and verification code: one adapter each


def convert_file(src: str, dst: str, options: "ConvertOptions") -> "ConversionReport":
    """Convert one source (the single-file entry point, every option passed through)."""
    from ._convert import convert

    return convert(src, dst, **options.asdict())


def plan_checks(files: Sequence[str], options: "VerifyOptions") -> list[tuple[str, ...]]:
    """The checks ``hurray-interop verify FILE ...`` runs for ``files`` (a pair, or round trips)."""
    from ._verify import plan_checks as plan

    return plan(list(files), pair=options.pair, each=options.each, **options.conversion())


def verify_check(files: Sequence[str], options: "VerifyOptions") -> "VerifyResult":
    """Run one check of :func:`plan_checks` (two files: a pair; one: a round trip)."""
    from ._verify import verify_check as check

    return check(list(files), jobs=options.jobs, oracle=options.oracle, **options.conversion())


def output_paths(src: str, dst: str, options: "ConvertOptions") -> list[str]:
    """The files converting ``src`` to ``dst`` writes, as far as names and records tell before
    converting (the output format's ``outputs``: a split GGUF set's shards; else ``dst``)."""
    from .registry import get_format

    fmt = get_format(options.dst_format or "")
    if fmt.outputs is None:
        return [dst]
    return fmt.outputs(src, dst, **{k: getattr(options, k) for k in fmt.export_options})


def output_extension(fmt: str) -> str:
    """The file extension of format ``fmt`` (``"hurray"`` -> ``".hrry"``)."""
    from .registry import get_format

    return get_format(fmt).extensions[0]


# ---------------------------------------------------------------------------
# results


class _Options:
    """Options by their API names, read as attributes (``options.q4_1``): every option the
    registry declares for this use (:meth:`defaults`), the ones not given at their default.
    Frozen and picklable (a task carries them to its worker); an unknown name is a
    :class:`TypeError`, as for a keyword :func:`hurray_interop.convert` does not take."""

    __slots__ = ("_values",)
    _values: dict[str, Any]

    @classmethod
    def defaults(cls) -> dict[str, Any]:  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def __init__(self, **given: Any) -> None:
        defaults = self.defaults()
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected option(s): {', '.join(unknown)}")
        object.__setattr__(self, "_values", {**defaults, **given})

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values") if not name.startswith("__") else {}
        try:
            return values[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no option {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to option {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), dict(self._values)))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._values == self._values  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), tuple(self._values.items())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    def asdict(self) -> dict[str, Any]:
        return dict(self._values)

    def replace(self, **changes: Any) -> "_Options":
        return type(self)(**{**self._values, **changes})


def _rebuild(cls: type[_Options], values: dict[str, Any]) -> _Options:
    """An unpickled options object, as it was made (its worker may know fewer formats)."""
    obj = object.__new__(cls)
    object.__setattr__(obj, "_values", values)
    return obj


class ConvertOptions(_Options):
    """The single-file options of :func:`hurray_interop.convert` (no progress callback): the
    conversion options the formats declare and ``dry_run``, ``force``, ``jobs``
    (:func:`hurray_interop.registry.option_defaults`)."""

    __slots__ = ()

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        from .registry import option_defaults

        return option_defaults(run=True)


class VerifyOptions(_Options):
    """The options of ``hurray-interop verify`` (as :func:`hurray_interop._verify.verify_files`
    takes them): ``pair``, ``each``, ``jobs``, ``oracle`` and the options of the conversion that made the
    second file of a pair from the first (:func:`hurray_interop.registry.conversion_options`)."""

    __slots__ = ()
    OWN = {"pair": False, "each": False, "jobs": None, "oracle": None}

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        from .registry import option_defaults

        return {**cls.OWN, **option_defaults()}

    def conversion(self) -> dict[str, Any]:
        """The conversion options, by their API names."""
        return {k: v for k, v in self._values.items() if k not in self.OWN}


@dataclass(frozen=True)
class FileResult:
    """What happened to one file: small and picklable, made where the file was handled.

    ``reason`` is one line (it names the file, and for malformed input the tensor
    and offset); ``output`` is the file written (None when nothing was);
    ``other`` the second file of a pair comparison; ``seconds`` the time the
    task took on its worker.
    """

    source: str
    status: str
    reason: str
    output: str | None = None
    other: str | None = None
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        return EXIT_STATUS[self.status]

    def to_dict(self) -> dict[str, Any]:
        return {"type": "file", **asdict(self), "exit_code": self.exit_code}


@dataclass
class Summary:
    """Counts per status; ``exit_code`` is the worst outcome (2 > 1 > 0)."""

    files: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    exit_code: int = 0

    def add(self, result: FileResult) -> None:
        self.files += 1
        self.counts[result.status] = self.counts.get(result.status, 0) + 1
        self.exit_code = max(self.exit_code, result.exit_code)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "summary", **asdict(self)}


def summarize(results: Iterable[FileResult]) -> Summary:
    summary = Summary()
    for r in results:
        summary.add(r)
    return summary


def _failure(source: str, exc: BaseException, started: float | None = None) -> FileResult:
    """The result of a file whose task raised ``exc`` (never raises itself)."""
    seconds = 0.0 if started is None else time.perf_counter() - started
    if isinstance(exc, ConversionRefused):
        status, reason = REFUSED, str(exc)
        if exc.reasons:
            name, typ, why = exc.reasons[0]
            reason += f"; first: tensor {name!r} ({typ}): {why}"
    elif isinstance(exc, HurrayInteropError):
        status, reason = BAD_INPUT, str(exc)
    elif isinstance(exc, OSError):
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else f"{source}: "
        status, reason = BAD_INPUT, f"{where}{exc.strerror or exc}"
    else:
        status, reason = ERROR, f"{source}: internal error: {type(exc).__name__}: {exc}"
    return FileResult(source=source, status=status, reason=" ".join(reason.split("\n")), seconds=seconds)


# ---------------------------------------------------------------------------
# tasks: top-level functions (picklable), run on the workers


def convert_task(group: Group, output: str, options: ConvertOptions) -> tuple[FileResult, ...]:
    """Convert one source (a group of files that form one model) into ``output``."""
    started = time.perf_counter()
    src = group[0]
    try:
        report = convert_file(src, output, options)
    except Exception as exc:  # noqa: BLE001 - every failure is this file's result
        return (_failure(src, exc, started),)
    seconds = time.perf_counter() - started
    counts = ", ".join(f"{v} {k}" for k, v in sorted(report.counts().items()))
    line = f"{src} -> {output}: {len(report.tensors)} tensors ({counts})"
    if options.dry_run:
        status = REFUSED if report.would_refuse else OK
        hint = f"; {report.refusal or report.hint}" if report.would_refuse and (report.refusal or report.hint) else ""
        return (FileResult(src, status, f"{line}, dry run: nothing written{hint}", seconds=seconds),)
    return (FileResult(src, OK, line, output=output, seconds=seconds),)


def verify_task(group: Group, options: VerifyOptions) -> tuple[FileResult, ...]:
    """Verify one file (a round trip), or two files with each other (a pair)."""
    started = time.perf_counter()
    try:
        r = verify_check(group, options)
    except Exception as exc:  # noqa: BLE001 - every failure is this file's result
        return (_failure(group[0], exc, started),)
    seconds = time.perf_counter() - started
    if r.error is not None:
        status, reason = BAD_INPUT, r.error
    else:
        status, reason = (OK if r.ok else FAILED), r.summary_line().split(None, 1)[1]
    return (FileResult(r.source, status, reason, other=r.other, seconds=seconds),)


# ---------------------------------------------------------------------------
# checks before anything is submitted


def group_sources(sources: Sequence[str]) -> list[Group]:
    """The models among ``sources`` (paths made absolute), each a tuple of files, its first the
    one to convert: the shards given of one split GGUF set are one group, in shard order
    (converting any shard converts the whole set, and a bad set is that group's located
    error; see :func:`hurray_interop.registry.group_models`)."""
    from .registry import group_models

    return group_models([os.path.abspath(s) for s in sources])


def _stem(path: str) -> str:
    """The output stem of a source: a split set's prefix, or the file's stem."""
    from .registry import output_stem

    return output_stem(path)


def check_inputs(groups: Iterable[Group]) -> None:
    """Every file exists and is a readable file; raises :class:`UsageError` naming the first one that is not."""
    problems = []
    for path in (p for g in groups for p in g):
        try:
            with open(path, "rb"):
                pass
        except FileNotFoundError:
            problems.append(f"{path}: no such file")
        except IsADirectoryError:
            problems.append(f"{path}: is a directory")
        except OSError as exc:
            problems.append(f"{path}: cannot read: {'permission denied' if isinstance(exc, PermissionError) else exc.strerror or exc}")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(problems[0] + more)


def plan_outputs(groups: Sequence[Group], out_dir: str | os.PathLike[str], dst_format: str) -> list[str]:
    """``out_dir/<stem>.<ext>`` for each group; raises :class:`UsageError` when two groups would share one."""
    ext = output_extension(dst_format)
    base = Path(os.path.abspath(out_dir))
    outputs = [str(base / (_stem(g[0]) + ext)) for g in groups]
    seen: dict[str, str] = {}
    for g, out in zip(groups, outputs):
        if out in seen:
            raise UsageError(f"{seen[out]} and {g[0]} would both be written to {out}")
        seen[out] = g[0]
    return outputs


def check_outputs(groups: Sequence[Group], outputs: Sequence[str], options: ConvertOptions) -> None:
    """Without ``force`` (and unless ``dry_run``) no output may exist yet: raises
    :class:`~hurray_interop.errors.OutputExistsError` listing the ones that do, before
    anything is submitted.  A split GGUF set's shards count (:func:`output_paths`)."""
    if options.force or options.dry_run:
        return
    existing = [p for g, out in zip(groups, outputs) for p in output_paths(g[0], out, options) if os.path.lexists(p)]
    if existing:
        shown = ", ".join(existing[:3]) + (f" and {len(existing) - 3} more" if len(existing) > 3 else "")
        raise OutputExistsError(f"{len(existing)} output(s) exist already (--force overwrites them): {shown}")


def _create_out_dir(out_dir: str | os.PathLike[str], *, create: bool = True) -> bool:
    """Check ``out_dir`` (and, with ``create``, make it): only its last component is created,
    as ``mkdir`` does, so a typo in a parent fails instead of growing a tree.  True when it
    was created here."""
    from .files.atomic import missing_directory

    p = Path(out_dir)
    if p.exists() and not p.is_dir():
        raise UsageError("the output directory is a file", path=p)
    parent = p.parent  # as the user spelled it ("." for a bare name)
    if not p.exists() and not parent.is_dir():
        raise missing_directory(parent, "--out-dir creates only its last directory")
    if not create or p.is_dir():
        return False
    try:
        p.mkdir()
    except FileExistsError:  # made meanwhile
        return False
    except OSError as exc:
        raise UsageError(f"cannot create the output directory: {exc.strerror or exc}", path=p) from None
    return True


# ---------------------------------------------------------------------------
# running


def _run(executor: cf.Executor | None, task: Callable[..., tuple[FileResult, ...]], calls: list[tuple[Any, ...]]) -> Iterator[FileResult]:
    """Run ``task(*call)`` for every call; yield the results as each task finishes.

    The first element of every call is the task's group of files (it names
    the result when the executor itself fails).  Leaving the loop early --
    an exception, Ctrl-C, ``close()`` -- cancels every task not yet started.
    """
    if executor is None:
        for call in calls:
            yield from task(*call)
        return
    futures = {executor.submit(task, *call): call for call in calls}
    try:
        for fut in cf.as_completed(futures):
            try:
                results = fut.result()
            except Exception as exc:  # noqa: BLE001 - the executor failed, not the task
                results = (_failure(futures[fut][0][0], exc),)
            yield from results
    finally:
        for fut in futures:
            fut.cancel()


def _after(first: list[FileResult], results: Iterator[FileResult]) -> Iterator[FileResult]:
    """``first``, then ``results`` (closing this closes ``results``: its tasks are cancelled)."""
    yield from first
    yield from results


@dataclass
class Batch:
    """Checked work, ready to run: ``task(*call)`` for every call, one call per model (or pair)."""

    task: Callable[..., tuple[FileResult, ...]]
    calls: list[tuple[Any, ...]]
    out_dir: str | None = None  # created when the batch runs
    created: bool = False  # whether :meth:`run` created ``out_dir``
    skipped: list[FileResult] = field(default_factory=list)  # --skip-existing: yielded first, never submitted

    @property
    def files(self) -> int:
        """The number of results the batch yields: one per model converted (a split set is
        one) or skipped, one per check verified (a pair is one)."""
        return len(self.skipped) + len(self.calls)

    def run(self, executor: cf.Executor | None = None) -> Iterator[FileResult]:
        """Submit the tasks to ``executor`` (None: run them here, in order); yield results as each
        finishes (the skipped files' first)."""
        if self.out_dir is not None:
            self.created = _create_out_dir(self.out_dir)
        return _after(self.skipped, _run(executor, self.task, self.calls))


def plan_convert(
    sources: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    dst_format: str,
    skip_existing: bool = False,
    **options: Any,
) -> Batch:
    """The checked :class:`Batch` of :func:`convert_many` (raises :class:`UsageError` on a bad path;
    ``options``: the fields of :class:`ConvertOptions`; ``skip_existing``: a source whose output
    exists complete is a SKIPPED result instead of an error, so that an interrupted batch resumes)."""
    opts = ConvertOptions(dst_format=dst_format, **options)
    if skip_existing and opts.force:
        raise UsageError("--skip-existing and --force exclude each other (skip existing outputs, or overwrite them)")
    groups = group_sources([os.fspath(s) for s in sources])
    check_inputs(groups)
    outputs = plan_outputs(groups, out_dir, dst_format)
    _create_out_dir(out_dir, create=False)
    todo, skipped = list(zip(groups, outputs)), []
    if skip_existing:
        there = _complete_outputs(todo, opts)
        skipped = [FileResult(g[0], SKIPPED, f"{g[0]} -> {p}: exists, skipped", output=out)
                   for (g, out), p in zip(todo, there) if p]
        todo = [job for job, p in zip(todo, there) if p is None]
    check_outputs([g for g, _ in todo], [out for _, out in todo], opts)
    calls: list[tuple[Any, ...]] = [(g, out, opts) for g, out in todo]
    return Batch(convert_task, calls, out_dir=None if opts.dry_run else os.fspath(out_dir), skipped=skipped)


def _complete_outputs(jobs: Sequence[tuple[Group, str]], opts: ConvertOptions) -> list[str | None]:
    """``--skip-existing``: for each (group, output) the file that shows its output exists
    complete (:func:`_existing`), or None; raises :class:`UsageError` naming every source
    whose split set is partial, before anything runs."""
    there, partial = [], []
    for g, out in jobs:
        try:
            there.append(_existing(g, out, opts))
        except UsageError as exc:
            partial.append(f"{g[0]} -> {out}: {exc}")
    if partial:
        more = f" (and {len(partial) - 1} more)" if len(partial) > 1 else ""
        raise UsageError(
            "--skip-existing skips only complete outputs; an incomplete split set is in the way "
            f"(delete its shards, or convert that source alone with --force): {partial[0]}{more}"
        )
    return there


def _existing(group: Group, output: str, opts: ConvertOptions) -> str | None:
    """``--skip-existing``: the first file of ``output`` when it exists complete, None when
    none of its files exists, among the files the conversion writes (:func:`output_paths`:
    ``output`` itself, or every shard of a split GGUF set; with ``--split-max-*`` each set
    whose shards are found by name).

    An output counts as existing only when it is complete: the one file, or every shard of
    one set (outputs are written atomically, a set's shards renamed into place together, so
    a complete set is what an earlier run wrote).  A set with some shards but not all (one
    deleted since, or shards of two sets) is bad input -- :class:`UsageError` listing the
    shards present and missing -- rather than re-run: re-running would overwrite the shards
    that remain, which is what ``--force`` asks for and ``--skip-existing`` excludes."""
    from .registry import group_models

    paths = output_paths(group[0], output, opts)
    if len(paths) == 1:
        return paths[0] if os.path.lexists(paths[0]) else None
    sets = [s for s in group_models(paths[1:]) if any(os.path.lexists(p) for p in s)]  # a set per prefix and count
    if not sets:
        return None
    present = [p for s in sets for p in s if os.path.lexists(p)]
    if len(sets) == 1 and len(present) == len(sets[0]):
        return present[0]
    missing = [p for s in sets for p in s if not os.path.lexists(p)]
    raise UsageError(f"shards present: {', '.join(present)}; missing: {', '.join(missing) or 'none (shards of two sets)'}")


def convert_many(
    sources: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    dst_format: str,
    executor: cf.Executor | None = None,
    skip_existing: bool = False,
    **options: Any,
) -> Iterator[FileResult]:
    """Convert every source to ``out_dir/<stem>.<ext of dst_format>``; yield a result per file as each finishes.

    ``options`` are those of :func:`hurray_interop.convert` (the fields of
    :class:`ConvertOptions`: every conversion option the formats declare, ``dry_run``,
    ``force``, ``jobs``); the outputs are the bytes single conversions write.  Checks every path first
    (raises :class:`UsageError` before submitting anything) and creates
    ``out_dir`` (its last component only) unless ``dry_run``; ``skip_existing``
    yields a ``"skipped"`` result for each source whose output exists complete instead
    of refusing the batch (not with ``force``; a partial split set raises
    :class:`UsageError`, see :func:`_existing`).  Paths in the results are absolute.
    """
    return plan_convert(sources, out_dir, dst_format=dst_format, skip_existing=skip_existing, **options).run(executor)


def plan_verify(
    files: Sequence[str | os.PathLike[str]], *, pair: bool = False, each: bool = False, jobs: int | None = None,
    fallback: str | None = None, oracle: str | None = None, **conversion: Any,
) -> Batch:
    """The checked :class:`Batch` of :func:`verify_many`: one task per check that
    ``hurray-interop verify`` runs for ``files`` (:func:`hurray_interop._verify.plan_checks`:
    exactly two files of different formats are one pair task, otherwise a round trip per
    model, a split set once).  Raises :class:`UsageError` on a bad path or option."""
    from ._verify import resolve_output

    paths = [os.path.abspath(os.fspath(f)) for f in files]
    from .verification.common import check_oracle

    options = VerifyOptions(pair=pair, each=each, jobs=jobs, fallback=fallback, oracle=check_oracle(oracle), **conversion)
    if len(paths) == 2:  # DST as convert named it (a set's PREFIX.gguf)
        paths[1] = resolve_output(paths[0], paths[1], **options.conversion())
    check_inputs([tuple(paths)])
    return Batch(verify_task, [(check, options) for check in plan_checks(paths, options)])


def verify_many(
    files: Sequence[str | os.PathLike[str]],
    *,
    executor: cf.Executor | None = None,
    pair: bool = False,
    each: bool = False,
    jobs: int | None = None,
    fallback: str | None = None,
    oracle: str | None = None,
    **conversion: Any,
) -> Iterator[FileResult]:
    """Verify like ``hurray-interop verify FILE ...``, one task per file; yield a result per file as each finishes.

    ``pair`` (or two files of different formats without ``each``) compares the
    files with each other in one task; ``fallback="exact"`` round-trips with the
    import's exact expanded forms; for a pair, ``fallback`` and ``conversion`` (the other
    options of the conversion that wrote the second file, as for
    :func:`hurray_interop._verify.verify_pair`) pass through.  Checks every path and option first.  Paths in
    the results are absolute.
    """
    return plan_verify(files, pair=pair, each=each, jobs=jobs, fallback=fallback, oracle=oracle,
                       **conversion).run(executor)


# ---------------------------------------------------------------------------
# executors for the command line


def _dask_executor(address: str) -> tuple[cf.Executor, Any]:
    try:
        from distributed import Client
        from distributed.comm import get_address_host_port
    except ImportError:
        raise UsageError(DASK_HINT) from None
    try:
        get_address_host_port(address)  # a malformed address fails here, before a client exists
    except ValueError as exc:
        raise UsageError(f"--scheduler {address}: {exc} (expected tcp://host:port)") from None
    timeout = connect_timeout()
    try:
        client = Client(address, timeout=timeout, set_as_default=False)
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"cannot reach the Dask scheduler at {address} (waited up to {timeout:g} s; {CONNECT_TIMEOUT_ENV} "
            f"sets the limit): {' '.join(str(exc).split())}"
        ) from None
    return client.get_executor(pure=False), client


def connect_timeout() -> float:
    """Seconds to wait for the Dask scheduler: ``$HURRAY_INTEROP_CONNECT_TIMEOUT``, default
    :data:`CONNECT_TIMEOUT` (Dask's own default, 30 s, is long for a typo in the address)."""
    text = os.environ.get(CONNECT_TIMEOUT_ENV, "").strip()
    if not text:
        return CONNECT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise UsageError(f"{CONNECT_TIMEOUT_ENV}={text!r}: expected a positive number of seconds")
    return value


def _cancel(executor: cf.Executor) -> None:
    try:
        executor.shutdown(wait=False, cancel_futures=True)
    except TypeError:  # executors without cancel_futures (Dask's cancels on wait=False)
        executor.shutdown(wait=False)


@contextmanager
def open_executor(workers: int = 1, scheduler: str | None = None) -> Iterator[cf.Executor | None]:
    """``None`` (run in this process) for one worker, a process pool for more, or an
    executor on the Dask scheduler at ``scheduler`` (``tcp://host:8786``).

    On an exception (Ctrl-C) the tasks not yet started are cancelled.
    """
    if not isinstance(workers, int) or workers < 1:
        raise UsageError(f"--workers takes a positive number of processes, not {workers!r}")
    if scheduler is not None and workers != 1:
        raise UsageError("--workers and --scheduler exclude each other (the cluster's workers run the tasks)")
    if scheduler is None and workers == 1:
        yield None
        return
    client = None
    if scheduler is not None:
        executor, client = _dask_executor(scheduler)
    else:
        import multiprocessing

        executor = cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        yield executor
    except BaseException:
        _cancel(executor)
        raise
    else:
        executor.shutdown(wait=True)
    finally:
        if client is not None:
            client.close()
