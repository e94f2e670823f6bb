"""Streaming helpers shared by the writers (.hrry, GGUF) and verify."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

__all__ = ["PREFETCH_CHUNKS", "prefetch_chunks"]


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
