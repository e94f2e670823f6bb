"""Atomic, crash-safe output files (one, or a set that appears all at once).

:class:`AtomicOutput` writes to a temporary file created in the destination's
own directory (so the final rename never crosses a file system), and only
:meth:`AtomicOutput.commit` makes it visible: flush, ``fsync``, rename into
place, ``fsync`` the directory.  If the ``with`` block raises (including
``KeyboardInterrupt``) or ``commit`` is never called, the temporary file is
removed and whatever was at the destination before is untouched.

Safety checks happen before any byte is written:

* an existing destination is refused unless ``force=True``
  (:class:`~hurray_interop.errors.OutputExistsError`); without ``force`` the
  final step is a hard link, which fails instead of clobbering a file that
  appeared meanwhile;
* a destination that is one of the ``inputs`` (same resolved path, or the same
  inode via :func:`os.path.samefile`) is refused even with ``force``;
* permission and other OS errors become one-line
  :class:`~hurray_interop.errors.UsageError` naming the path.

:class:`AtomicOutputSet` does the same for several files that belong together
(the shards of a split GGUF): every destination is checked before any byte is
written, each member is written to its own temporary file, and only when all
are complete are they moved into place; a failure at any point removes every
temporary file and every member already moved, so no member is ever left under
its final name without the others.
"""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from ..errors import OutputExistsError, UsageError
from .positional import writeback_function

#: bytes written between two starts of the kernel's writeback (see AtomicOutput.write)
WRITEBACK_STEP = 8 << 20

__all__ = ["AtomicOutput", "AtomicOutputSet", "check_output_path", "missing_directory", "transient"]


def _os_error(e: OSError, path: Path, doing: str) -> UsageError:
    reason = e.strerror or str(e)
    if isinstance(e, PermissionError):
        reason = "permission denied"
    return UsageError(f"cannot {doing}: {reason}", path=path)


def missing_directory(directory: "str | os.PathLike[str]", note: str = "") -> UsageError:
    """The one error for an output directory that does not exist: the folder of an output file,
    of a split set's shards, or the parent of a batch's ``--out-dir`` (``note`` adds why)."""
    return UsageError("the output directory does not exist" + (f" ({note})" if note else ""), path=directory)


def check_output_path(
    path: "str | os.PathLike[str]", *, force: bool = False, inputs: Iterable["str | os.PathLike[str]"] = ()
) -> Path:
    """Validate an output path (see the module docstring); returns it as a :class:`Path`."""
    dest = Path(os.fspath(path))
    if dest.name in ("", ".", ".."):
        raise UsageError("output path names a directory, not a file", path=dest)
    for inp in inputs:
        ip = Path(os.fspath(inp))
        same = False
        try:
            same = dest.resolve() == ip.resolve()
        except OSError:  # pragma: no cover - resolve() only fails on symlink loops
            pass
        if not same and dest.exists() and ip.exists():
            try:
                same = os.path.samefile(dest, ip)
            except OSError:  # pragma: no cover
                pass
        if same:
            raise UsageError(f"output is the same file as the input {os.fspath(ip)!r}", path=dest)
    if dest.is_dir():
        raise UsageError("output path is a directory", path=dest)
    if (dest.exists() or dest.is_symlink()) and not force:
        raise OutputExistsError("output exists (pass force to overwrite)", path=dest)
    parent = dest.parent if str(dest.parent) else Path(".")
    if not parent.is_dir():
        raise missing_directory(parent) if not parent.exists() else UsageError("not a directory", path=parent)
    return dest


def _umask() -> int:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)  # pragma: no cover - only without /proc
    os.umask(old)  # pragma: no cover
    return old  # pragma: no cover


#: whether the outputs opened in this context must survive a crash (see :func:`transient`)
_DURABLE: ContextVar[bool] = ContextVar("hurray_interop_durable", default=True)


@contextmanager
def transient() -> Iterator[None]:
    """Outputs opened inside (in this thread, or in threads started in its context) are
    not made durable: no writeback while writing, no ``fsync`` of the file or its
    directory.  The bytes and the all-or-nothing rename are the same.  For files deleted
    before anyone could rely on them: ``verify``'s round-trip copies, which would
    otherwise send two copies of the model to the disk."""
    token = _DURABLE.set(False)
    try:
        yield
    finally:
        _DURABLE.reset(token)


class AtomicOutput:
    """Context manager for an all-or-nothing output file.

    ``with AtomicOutput(path) as out:`` gives a writable binary file object
    (``out.write``, ``out.tell``, ``out.flush``, ``out.fileno`` … are those of
    the temporary file); call ``out.commit()`` inside the block once the
    content is complete.  Leaving the block without ``commit()`` discards the
    temporary file.  :meth:`write` starts the kernel's writeback of every
    :data:`WRITEBACK_STEP` bytes as they are written (where the OS offers a call for it),
    so the final fsync of ``commit`` finds little left to write.
    """

    def __init__(
        self,
        path: "str | os.PathLike[str]",
        *,
        force: bool = False,
        inputs: Iterable["str | os.PathLike[str]"] = (),
        mode: int | None = None,
    ) -> None:
        self.path = Path(os.fspath(path))
        self.force = force
        self.inputs = tuple(inputs)
        #: the permission bits of the file (None: 0o666 less the umask, as ``open`` creates files)
        self.mode = mode
        self.temp_path: Path | None = None
        self._file: IO[bytes] | None = None
        self.committed = False
        #: fsync on commit, writeback while writing (False inside :func:`transient`)
        self.durable = _DURABLE.get()
        self._writeback = writeback_function() if self.durable else None
        self._scratch: list[IO[bytes]] = []
        self._written_from = 0  # start of the bytes whose writeback has not been started
        self._unstarted = 0

    # -- lifecycle -----------------------------------------------------------

    def open(self) -> "AtomicOutput":
        if self._file is not None or self.committed:
            raise UsageError("AtomicOutput is already open or committed", path=self.path)
        dest = check_output_path(self.path, force=self.force, inputs=self.inputs)
        parent = dest.parent if str(dest.parent) else Path(".")
        for _ in range(16):
            tmp = parent / f".{dest.name}.{os.urandom(6).hex()}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            except FileExistsError:  # pragma: no cover - 48 random bits
                continue
            except OSError as e:
                raise _os_error(e, dest, f"create a file in {os.fspath(parent)!r}") from None
            break
        else:  # pragma: no cover
            raise UsageError("cannot create a unique temporary file", path=dest)
        self.temp_path = tmp
        self._file = os.fdopen(fd, "wb", buffering=1 << 20)
        return self

    def __enter__(self) -> "AtomicOutput":
        return self.open()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if not self.committed:
            self.abort()
        return False  # never swallow (KeyboardInterrupt included)

    @property
    def file(self) -> IO[bytes]:
        if self._file is None:
            raise UsageError("AtomicOutput is not open", path=self.path)
        return self._file

    def write(self, data: Any) -> int:
        """Write ``data``; every :data:`WRITEBACK_STEP` bytes the kernel is asked to start
        writing back what came before, so the final fsync has little
        left to do (docs/benchmarks.md, "Positional output"); the bytes are the same."""
        try:
            n = self.file.write(data)
            self._unstarted += n
            if self._unstarted >= WRITEBACK_STEP and self._writeback is not None:
                self._start_writeback()
            return n
        except OSError as e:
            raise _os_error(e, self.path, "write the output") from None

    def _start_writeback(self) -> None:
        f = self.file
        f.flush()
        start, end = self._written_from, f.tell()
        self._written_from, self._unstarted = end, 0
        if end > start and self._writeback is not None:
            try:
                self._writeback(f.fileno(), start, end - start)
            except OSError:  # only a speed-up
                self._writeback = None

    def tell(self) -> int:
        return self.file.tell()

    def scratch(self) -> IO[bytes]:
        """A new temporary file (``w+b``) in the destination's directory, for data that is
        needed while the output is written: unnamed where the OS allows, and closed, so
        removed, when the output is committed or discarded."""
        parent = self.path.parent if str(self.path.parent) else Path(".")
        try:
            import tempfile  # only for scratch files: keeps the import of every command light

            f = tempfile.TemporaryFile(dir=parent, prefix=f".{self.path.name}.", suffix=".scratch")
        except OSError as e:
            raise _os_error(e, self.path, f"create a file in {os.fspath(parent)!r}") from None
        self._scratch.append(f)
        return f

    def _close_scratch(self) -> None:
        files, self._scratch = self._scratch, []
        for f in files:
            try:
                f.close()
            except OSError:
                pass

    def __getattr__(self, name: str) -> Any:  # flush, fileno, writelines …
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.file, name)

    def commit(self) -> Path:
        """Flush, fsync, and move the temporary file into place; returns the path."""
        self.prepare()
        return self.publish()

    def prepare(self) -> None:
        """First half of :meth:`commit`: flush, set the mode, fsync and close the
        temporary file (it stays under its temporary name until :meth:`publish`).
        :class:`AtomicOutputSet` prepares every member before publishing any."""
        if self.prepared:
            return
        f = self.file
        try:
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask() if self.mode is None else self.mode)
            if self.durable:
                os.fsync(f.fileno())
            f.close()
            self._file = None
        except OSError as e:
            self.abort()
            raise _os_error(e, self.path, "write the output") from None

    @property
    def prepared(self) -> bool:
        """True once :meth:`prepare` has closed the complete temporary file."""
        return self._file is None and self.temp_path is not None and not self.committed

    def publish(self) -> Path:
        """Second half of :meth:`commit`: move the prepared temporary file into place."""
        if not self.prepared:
            raise UsageError("AtomicOutput is not prepared", path=self.path)
        tmp = self.temp_path
        assert tmp is not None
        try:
            if self.force:
                os.replace(tmp, self.path)
            else:
                self._link_no_clobber(tmp)
        except OutputExistsError:
            self.abort()
            raise
        except OSError as e:
            self.abort()
            raise _os_error(e, self.path, "write the output") from None
        self.committed = True
        self.temp_path = None
        self._close_scratch()
        if self.durable:
            _fsync_dir(self.path.parent if str(self.path.parent) else Path("."))
        return self.path

    def _link_no_clobber(self, tmp: Path) -> None:
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            raise OutputExistsError("output appeared while writing (pass force to overwrite)", path=self.path) from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
                raise
            # file system without hard links: re-check, then rename (small race window)
            if self.path.exists() or self.path.is_symlink():
                raise OutputExistsError("output appeared while writing (pass force to overwrite)", path=self.path) from None
            os.replace(tmp, self.path)
            return
        os.unlink(tmp)

    def abort(self) -> None:
        """Discard the temporary file (idempotent)."""
        self._close_scratch()
        f, self._file = self._file, None
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
        tmp, self.temp_path = self.temp_path, None
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    def __del__(self) -> None:  # best effort if the object is dropped mid-way
        try:
            if not self.committed:
                self.abort()
        except Exception:  # pragma: no cover
            pass


class AtomicOutputSet:
    """All-or-nothing output of several files.

    ::

        with AtomicOutputSet([a, b, c], force=False, inputs=srcs) as outs:
            for i in range(len(outs)):
                out = outs.open(i)      # an opened AtomicOutput (temporary file)
                out.write(...)
                outs.close(i)           # optional: fsync and close now (bounds open files)
            outs.commit()               # all members appear, or none

    Entering checks every destination (as :func:`check_output_path`; the same
    path twice is refused) before any temporary file exists.  Members are
    opened when first asked for, so at most the members being written hold a
    file descriptor.  :meth:`commit` needs every member opened; it closes them
    all, then moves them into place one by one; if one move fails, the members
    already moved are removed again (with ``force``, what they replaced is gone:
    no half-old, half-new set is left either).  Leaving the block without
    :meth:`commit` -- an exception, ``KeyboardInterrupt`` -- removes every
    temporary file.
    """

    def __init__(
        self,
        paths: Iterable["str | os.PathLike[str]"],
        *,
        force: bool = False,
        inputs: Iterable["str | os.PathLike[str]"] = (),
        mode: int | None = None,
    ) -> None:
        self.paths = [Path(os.fspath(p)) for p in paths]
        self.force = force
        self.inputs = tuple(inputs)
        self.mode = mode  # every member's (see AtomicOutput)
        self._members: list[AtomicOutput | None] = [None] * len(self.paths)
        self._entered = False
        self.committed = False

    def __len__(self) -> int:
        return len(self.paths)

    def __enter__(self) -> "AtomicOutputSet":
        seen: dict[str, Path] = {}
        for p in self.paths:
            key = os.path.normcase(os.path.abspath(p))
            if key in seen:
                raise UsageError("the same output path is given twice", path=p)
            seen[key] = p
        for p in self.paths:  # every destination, before anything is created
            check_output_path(p, force=self.force, inputs=self.inputs)
        self._entered = True
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if not self.committed:
            self.abort()
        return False

    def open(self, i: int) -> AtomicOutput:
        """Member ``i`` as an open :class:`AtomicOutput` (opened on first use)."""
        if not self._entered or self.committed:
            raise UsageError("AtomicOutputSet is not open", path=self.paths[i] if self.paths else None)
        m = self._members[i]
        if m is None:
            m = AtomicOutput(self.paths[i], force=self.force, inputs=self.inputs, mode=self.mode)
            self._members[i] = m
            m.open()
        return m

    def close(self, i: int) -> None:
        """Finish member ``i`` now: flush, fsync and close its temporary file."""
        m = self._members[i]
        if m is None:
            raise UsageError("output was never opened", path=self.paths[i])
        m.prepare()

    def commit(self) -> list[Path]:
        """Move every member into place (all or none); returns the paths."""
        missing = [p for p, m in zip(self.paths, self._members) if m is None]
        if missing:
            raise UsageError("output was never written", path=missing[0])
        members = [m for m in self._members if m is not None]
        for m in members:
            m.prepare()
        done: list[AtomicOutput] = []
        try:
            for m in members:
                m.publish()
                done.append(m)
        except BaseException:
            for m in done:
                try:
                    os.unlink(m.path)
                except FileNotFoundError:
                    pass
            raise
        self.committed = True
        return list(self.paths)

    def abort(self) -> None:
        """Remove every temporary file (idempotent)."""
        for m in self._members:
            if m is not None and not m.committed:
                m.abort()


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - not all platforms can open directories
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)
