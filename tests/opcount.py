"""Operation counts for tests about cost (a test helper, not a test module).

Wall-clock limits fail on a loaded machine and pass on a fast one whatever the code
does; these counts do not depend on the machine.  :func:`counting` measures, for the
code run inside it:

* ``lines`` -- Python line events (``sys.settrace``) in every function called: a
  Python loop over a claimed size, or over pairs of members, shows up here;
* ``peak`` -- the peak of traced allocations in bytes (``tracemalloc``; numpy
  registers its buffers there too): an allocation sized by a claim shows up here.

Lines of the ``with`` body itself are not counted, only those of what it calls.
"""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class Counts:
    lines: int = 0
    peak: int = 0


@contextmanager
def counting() -> Iterator[Counts]:
    c = Counts()

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            c.lines += 1
        return local

    def new_frame(frame: Any, event: str, arg: Any) -> Any:
        return local

    old = sys.gettrace()
    tracemalloc.start()
    sys.settrace(new_frame)
    try:
        yield c
    finally:
        sys.settrace(old)
        c.peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()

