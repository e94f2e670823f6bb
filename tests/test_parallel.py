"""parallel.pmap_items: an ordered map over any iterable on the jobs() threads."""

from __future__ import annotations

import threading
import time

import pytest

from hurray_interop.parallel import pmap, pmap_items, use_jobs


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_results_come_in_order_whatever_finishes_first(jobs: int) -> None:
    def slow_evens(i: int) -> tuple[int, str]:
        if i % 2 == 0:
            time.sleep(0.002)
        return i * i, threading.current_thread().name

    with use_jobs(jobs):
        got = list(pmap_items(slow_evens, range(40)))
    assert [v for v, _ in got] == [i * i for i in range(40)]
    names = {n for _, n in got}
    assert (names == {threading.current_thread().name}) == (jobs == 1)  # worker threads iff jobs > 1


def test_items_are_taken_lazily_a_bounded_distance_ahead() -> None:
    taken: list[int] = []

    def items():
        for i in range(100):
            taken.append(i)
            yield i

    with use_jobs(2):
        it = pmap_items(lambda i: i, items())
        assert next(it) == 0
        assert len(taken) <= 2 * 2 + 1  # at most 2 * jobs in flight, plus the one replacing the first
        it.close()
    assert len(taken) < 100


def test_the_first_failing_item_raises_in_the_caller() -> None:
    def fn(i: int) -> int:
        if i in (5, 7):
            raise ValueError(f"item {i}")
        return i

    with use_jobs(2), pytest.raises(ValueError, match="item 5"):
        list(pmap_items(fn, range(20)))


def test_pmap_is_pmap_items_over_slices() -> None:
    with use_jobs(2):
        assert list(pmap(lambda sl: (sl.start, sl.stop), 10, 3)) == [(0, 3), (3, 6), (6, 9), (9, 10)]
        assert list(pmap(lambda sl: (sl.start, sl.stop), 2, 3)) == [(0, 2)]
