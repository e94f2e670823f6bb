"""Threading, in one place: the thread-count rule, an ordered parallel map, a prefetch.

* **How many threads** (``--jobs``, ``jobs=``, ``threads=``): :func:`use_jobs` sets the
  count for everything run inside it (a context variable, so concurrent conversions do
  not see each other's); :func:`jobs` answers it, defaulting to :data:`DEFAULT_JOBS`
  but never more than the CPUs this process may run on.  :func:`check_jobs` is the one
  validation (a positive ``int``).
* :func:`pmap` -- ``fn`` over the chunk slices of ``n`` items, results in order, on
  :func:`jobs` threads (numpy releases the GIL in the gathers and bit operations that
  do the work); :func:`pmap_items` the same over any iterable.
* :func:`prefetch_chunks` -- a worker thread producing chunks ahead of a writer.
* :func:`in_background` -- one call on a worker thread while the caller does other work.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterable, Iterator, TypeVar

from .errors import UsageError

__all__ = [
    "DEFAULT_JOBS", "cpus", "check_jobs", "use_jobs", "jobs", "pmap", "pmap_items", "PREFETCH_CHUNKS", "prefetch_chunks",
    "in_background",
]

T = TypeVar("T")

#: threads used when nobody chose (``--jobs``): at most this many, one per CPU
DEFAULT_JOBS = 2

#: the thread count chosen for whatever runs in this context (None: the default)
_JOBS: ContextVar[int | None] = ContextVar("hurray_interop_jobs", default=None)


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def check_jobs(value: Any, name: str = "jobs") -> int | None:
    """``value`` if it is ``None`` or a positive ``int``; else :class:`UsageError`."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise UsageError(f"{name} must be positive (a number of threads), not {value!r}")
    return value


@contextmanager
def use_jobs(value: int | None, name: str = "jobs") -> Iterator[None]:
    """Run the body with ``value`` threads (``None``: keep the enclosing choice)."""
    check_jobs(value, name)
    if value is None:
        yield
        return
    token = _JOBS.set(value)
    try:
        yield
    finally:
        _JOBS.reset(token)


def jobs(value: int | None = None, name: str = "jobs") -> int:
    """The thread count: ``value`` if given (checked), else the one :func:`use_jobs` set,
    else :data:`DEFAULT_JOBS` capped by :func:`cpus`."""
    if check_jobs(value, name) is not None:
        return value  # type: ignore[return-value]
    chosen = _JOBS.get()
    return chosen if chosen is not None else min(DEFAULT_JOBS, cpus())


def pmap(fn: Callable[[slice], T], n: int, step: int) -> Iterator[T]:
    """``fn(sl)`` for the slices ``[i, i + step)`` covering ``range(n)``, in order.

    With more than one :func:`jobs` thread and more than one slice, up to ``2 * jobs``
    slices are computed ahead on a thread pool.  ``fn`` must return a fresh object each
    time.  An exception of ``fn`` is raised here, for the first failing slice."""
    slices = (slice(i, min(i + step, n)) for i in range(0, n, step))
    if n <= step:
        for sl in slices:
            yield fn(sl)
        return
    yield from pmap_items(fn, slices)


def pmap_items(fn: Callable[[Any], T], items: Iterable[Any]) -> Iterator[T]:
    """``fn(item)`` for every item of ``items``, results in order, on :func:`jobs` threads
    (up to ``2 * jobs`` items in flight; ``items`` is consumed as results are taken).
    ``fn`` must return a fresh object each time.  An exception of ``fn`` is raised here,
    for the first failing item; the items not yet started are then cancelled."""
    threads = jobs()
    if threads <= 1:
        for item in items:
            yield fn(item)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor
    from itertools import islice

    it = iter(items)
    pool = ThreadPoolExecutor(threads, thread_name_prefix="hurray-interop-convert")
    try:
        pending = deque(pool.submit(fn, item) for item in islice(it, 2 * threads))
        while pending:
            done = pending.popleft().result()
            for item in islice(it, 1):
                pending.append(pool.submit(fn, item))
            yield done
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


#: chunks a writer lets a worker thread produce ahead of the one being written
#: (0 turns the pipeline off)
PREFETCH_CHUNKS = 2

_DONE = object()


def prefetch_chunks(chunks: Iterable[Any], depth: int | None = None) -> Iterator[Any]:
    """Iterate ``chunks`` while a worker thread produces up to ``depth`` items ahead.

    The writers run every iterable of chunks through this: numpy releases the
    GIL, so converting chunk *i+1* (bit shuffling, gathers) overlaps writing
    chunk *i* (a copy into the page cache) on a second core.  Producers must
    yield a fresh object each time (never refill a buffer already yielded) --
    every producer in this package does.  An exception in the producer is
    re-raised here, unchanged; closing this iterator early stops the worker
    after the item it is producing.
    """
    depth = PREFETCH_CHUNKS if depth is None else depth
    if depth <= 0:
        yield from chunks
        return
    import contextvars
    import queue
    import threading

    it = iter(chunks)  # a TypeError for a non-iterable surfaces here, in the caller's thread
    q: "queue.Queue[tuple[bool, Any]]" = queue.Queue(depth)
    stop = threading.Event()

    def offer(item: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for c in it:
                if not offer((True, c)):
                    return
            offer((False, _DONE))
        except BaseException as e:  # handed to the consumer, re-raised there
            offer((False, e))

    # the producer runs in the caller's context (context variables such as the thread count)
    ctx = contextvars.copy_context()
    worker = threading.Thread(target=ctx.run, args=(run,), name="hurray-interop-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            ok, c = q.get()
            if ok:
                yield c
            elif c is _DONE:
                return
            else:
                raise c
    finally:
        stop.set()
        worker.join()


@contextmanager
def in_background(fn: Callable[[], T]) -> Iterator[Callable[[], T]]:
    """Run ``fn()`` on a worker thread (in the caller's context) while the body runs.

    The body gets a function that waits for ``fn`` and returns its result or raises its
    exception, unchanged.  Leaving the body always waits for the worker first (so it
    never outlives, say, the temporary directory it writes into)."""
    import contextvars
    import threading

    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as e:  # handed to the caller, re-raised there
            box.append((False, e))

    ctx = contextvars.copy_context()
    worker = threading.Thread(target=ctx.run, args=(run,), name="hurray-interop-background", daemon=True)
    worker.start()

    def result() -> T:
        worker.join()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    try:
        yield result
    finally:
        worker.join()
