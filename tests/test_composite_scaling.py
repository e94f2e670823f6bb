"""Composite checks cost linear (or n·log n) work in the member count.

Regression for the "quadratic composites" defect (issue 10): a partition composite of
3,000 members (written by pyhurray) took ~6 s to ``inspect`` and to convert against
~0.9 s for 1,000 -- the dequantizer re-checked members pairwise and ``inspect`` recomputed
the top-level names once per tensor.

No wall clock: the work is counted as the calls the package's own code makes to the
builtins its loops run on (``len``, ``range``, ``all``, ``any``, ``zip``, ``min``, ``max``,
``sum``, ``sorted``, ``enumerate``) -- each package module's global is swapped for a
counting wrapper with ``monkeypatch``, so every Python-level loop iteration over members
shows up, whichever function it sits in.  Three times the members may cost at most 3.5
times the calls (a pairwise check costs ~9 times).
"""

from __future__ import annotations

import builtins
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

hurray = pytest.importorskip("hurray")

from hurray_interop.cli import main  # noqa: E402
from hurray_interop.core.hrry import HrryFile  # noqa: E402
from hurray_interop.dequant import dequantize  # noqa: E402

_COUNTED = ("len", "range", "all", "any", "zip", "min", "max", "sum", "sorted", "enumerate")
_COLS = 8


def _partition(path, n: int):
    """A float32 partition composite ``w`` of ``n`` one-row members, written by pyhurray."""
    members = [
        hurray.Tensor(np.full((1, _COLS), i, np.float32).tobytes(), hurray.float32, [1, _COLS],
                      shard=hurray.Shard([n, _COLS], [i, 0]))
        for i in range(n)
    ]
    hurray.save(str(path), {"w": hurray.Composite("partition", shape=[n, _COLS], dtype=hurray.float32,
                                                  members=members)})
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("composites")
    return {n: _partition(d / f"p{n}.hrry", n) for n in (1000, 3000)}


def _import_all() -> None:
    """Import every Python module of the package, so that what a verb imports on first use
    (the format records of plugins/, the converters behind their shims) is counted in every run."""
    import hurray_interop

    root = Path(hurray_interop.__file__).parent
    for f in sorted(root.rglob("*.py")):
        parts = f.relative_to(root).with_suffix("").parts
        if parts[-1] == "__main__":  # that one runs the CLI
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        importlib.import_module(".".join(("hurray_interop", *parts)))


class _Counter:
    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        _import_all()
        for name, mod in list(sys.modules.items()):
            if mod is None or not (name == "hurray_interop" or name.startswith("hurray_interop.")):
                continue
            for b in _COUNTED:
                monkeypatch.setattr(mod, b, self._wrap(getattr(builtins, b)), raising=False)

    def _wrap(self, fn):
        def counted(*args, **kw):
            self.calls += 1
            return fn(*args, **kw)

        return counted


def _work(monkeypatch, action) -> int:
    with monkeypatch.context() as m:
        c = _Counter(m)
        action()
        return c.calls


def _assert_linear(monkeypatch, files, action) -> None:
    small = _work(monkeypatch, lambda: action(files[1000]))
    large = _work(monkeypatch, lambda: action(files[3000]))
    assert small > 1000  # the counter sees the member loops at all
    assert large <= 3.5 * small, (small, large)


def test_inspect_work_is_linear_in_members(monkeypatch, files, capsys):
    _assert_linear(monkeypatch, files, lambda p: main(["inspect", str(p)]))
    capsys.readouterr()


def test_dequantize_work_is_linear_in_members(monkeypatch, files):
    def action(p):
        with HrryFile(p) as f:
            t = f.tensor("w")
            v = dequantize(t)
        n = len(t.members)
        assert np.array_equal(v, np.repeat(np.arange(n, dtype=np.float32), _COLS).reshape(n, _COLS))

    _assert_linear(monkeypatch, files, action)


@pytest.mark.parametrize("ext", ["gguf", "safetensors"])
def test_convert_work_is_linear_in_members(monkeypatch, files, tmp_path, capsys, ext):
    def action(p):
        out = tmp_path / f"{p.stem}.{ext}"
        assert main(["convert", str(p), str(out), "--fallback", "float32"]) == 0

    _assert_linear(monkeypatch, files, action)
    capsys.readouterr()
