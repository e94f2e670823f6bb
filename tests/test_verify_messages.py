"""What single ``verify`` runs say (issue #20): the FAILED line of a round trip refused for
K-quant types names ``--fallback exact`` as the conversion summary does; a progress bar on a
terminal only, through the machinery convert uses (``cli._progress``)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Iterator

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf_factory import write_gguf_raw

from hurray_interop import cli
from hurray_interop.batch import verify_many
from hurray_interop.cli import main

HINT = "(choose --fallback exact to verify them in their exact expanded form)"
REPO = Path(__file__).resolve().parents[1]


def test_refused_kquant_round_trip_names_fallback_exact(fixtures_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = fixtures_dir / "tiny-llama-kquant.gguf"
    assert main(["verify", str(src)]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("FAILED ") and "2 tensor(s) refused" in last and last.endswith(HINT)
    (r,) = verify_many([src])  # a batch's FAILED line is the same summary
    assert r.status == "verification failed" and r.reason.endswith(HINT)
    assert main(["verify", str(src), "--fallback", "exact", "-q"]) == 0  # and the hint is right


def test_no_hint_for_types_without_an_expanded_form(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q8k = np.zeros((2, gguf.GGML_QUANT_SIZES[Q.Q8_K][1]), dtype=np.uint8)
    src = write_gguf_raw(tmp_path / "q8k.gguf", [("w", "Q8_K", (512,), q8k)])
    for extra in ([], ["--fallback", "exact"]):
        assert main(["verify", str(src), *extra]) == 1
        last = capsys.readouterr().out.splitlines()[-1]
        assert last.startswith("FAILED ") and "1 tensor(s) refused" in last and "--fallback" not in last


@pytest.fixture()
def bars(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Every progress bar the command line asks for: enabled or not, its unit and calls."""
    made: list[dict] = []

    @contextlib.contextmanager
    def progress(enabled: bool, desc: str, unit: str = "B") -> Iterator:
        bar = {"enabled": enabled, "desc": desc, "unit": unit, "calls": []}
        made.append(bar)
        yield (lambda done, total: bar["calls"].append((done, total))) if enabled else None

    monkeypatch.setattr(cli, "_progress", progress)
    return made


def test_single_verify_draws_a_bar_over_the_tensors(fixtures_dir: Path, bars: list[dict],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(fixtures_dir / "tiny-llama.gguf")]) == 0
    (bar,) = bars
    assert bar["enabled"] and bar["desc"] == "verify" and bar["unit"] == "tensor"
    assert bar["calls"][0] == (0, 27) and bar["calls"][-1] == (27, 27)
    assert [d for d, _ in bar["calls"]] == sorted(d for d, _ in bar["calls"])


def test_a_pair_draws_a_bar_too(fixtures_dir: Path, tmp_path: Path, bars: list[dict]) -> None:
    hrry = tmp_path / "t.hrry"
    assert main(["convert", str(fixtures_dir / "tiny-llama.gguf"), str(hrry), "-q"]) == 0
    bars.clear()
    assert main(["verify", str(fixtures_dir / "tiny-llama.gguf"), str(hrry)]) == 0
    (bar,) = bars
    assert bar["enabled"] and bar["calls"][-1] == (27, 27)


@pytest.mark.parametrize("extra", [["--quiet"], ["--json"]])
def test_no_bar_with_quiet_or_json(extra: list[str], fixtures_dir: Path, bars: list[dict],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(fixtures_dir / "tiny-llama.gguf"), *extra]) == 0
    (bar,) = bars
    assert not bar["enabled"] and bar["calls"] == []


def test_no_bar_for_several_files(fixtures_dir: Path, bars: list[dict], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(fixtures_dir / "tiny-llama.gguf"), str(fixtures_dir / "kv-types.gguf")]) == 0
    (bar,) = bars
    assert not bar["enabled"]  # one summary line per file, as before


def test_nothing_on_stderr_when_not_a_terminal(fixtures_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(fixtures_dir / "tiny-llama.gguf")]) == 0
    assert capsys.readouterr().err == ""


def _on_a_terminal(argv: list[str]) -> tuple[int, str, bytes]:
    """Run the command with stderr on a pseudo-terminal of 100 columns: (status, stdout, terminal bytes)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-m", "hurray_interop", *argv], stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    out = p.stdout.read().decode() if p.stdout else ""
    status = p.wait(timeout=120)
    seen = b""
    while select.select([master], [], [], 0.2)[0]:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return status, out, seen


def test_the_bar_on_a_real_terminal(fixtures_dir: Path) -> None:
    src = str(fixtures_dir / "tiny-llama.gguf")
    status, out, seen = _on_a_terminal(["verify", src])
    assert status == 0 and out.splitlines()[-1].startswith("OK ")
    assert b"verify:" in seen and b"/27 [" in seen and b"tensor" in seen  # drawn, then cleared
    for extra in (["--quiet"], ["--json"]):
        status, out, seen = _on_a_terminal(["verify", src, *extra])
        assert status == 0 and seen == b""
