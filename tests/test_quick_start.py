"""The README's Quick start: exactly two commands, each making its own virtual environment
(so they work where the system Python refuses ``pip install``, PEP 668); the first converts
and verifies a fixture, the second is what CI runs, verbatim."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S)]


def test_exactly_two_commands_each_in_its_own_venv() -> None:
    cmds = quick_start_commands()
    assert len(cmds) == 2, cmds
    for cmd in cmds:
        assert "\n" not in cmd, f"one command, one line: {cmd!r}"
        assert cmd.startswith("python3 -m venv .venv && .venv/bin/pip install "), cmd
        assert " python3 -m pip" not in cmd and "sudo" not in cmd, cmd
    convert, tests = cmds
    fixtures = re.findall(r"fixtures/[\w.-]+", convert)
    assert fixtures and all((ROOT / f).is_file() for f in fixtures), fixtures
    assert " convert " in convert and " verify " in convert
    assert tests.endswith("-m pytest"), tests


def test_ci_runs_the_second_command_verbatim() -> None:
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    lines = [ln.strip() for ln in run.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert quick_start_commands()[1] in lines, lines


def _externally_managed_python() -> str | None:
    """A python3 whose installation refuses ``pip install`` (PEP 668), e.g. Debian's."""
    for marker in glob.glob("/usr/lib/python3*/EXTERNALLY-MANAGED"):
        exe = Path("/usr/bin") / Path(marker).parent.name
        if exe.is_file():
            return str(exe)
    return None


@pytest.mark.slow
def test_first_command_works_under_an_externally_managed_python(tmp_path: Path) -> None:
    py = _externally_managed_python()
    if py is None:
        pytest.skip("no externally-managed (PEP 668) system Python on this machine")
    probe = subprocess.run([py, "-m", "venv", "--without-pip", str(tmp_path / "probe")], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"{py} has no venv module (Debian: python3-venv)")
    clone = tmp_path / "clone"
    clone.mkdir()
    for f in ("pyproject.toml", "hatch_build.py", "README.md", "LICENSE"):
        shutil.copy2(ROOT / f, clone / f)
    for d in ("hurray_interop", "mappings", "fixtures"):
        shutil.copytree(ROOT / d, clone / d, ignore=shutil.ignore_patterns("__pycache__", "_kernel.so", "_kernel.dll"))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(py)  # `python3` in the command is the externally managed one
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    refused = subprocess.run([py, "-m", "pip", "install", "--dry-run", "."], cwd=clone, env=env, capture_output=True, text=True)
    assert "externally-managed-environment" in refused.stderr + refused.stdout  # the situation the command must survive
    got = subprocess.run(["bash", "-c", quick_start_commands()[0]], cwd=clone, env=env, capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-3000:]
    assert "files byte-identical" in got.stdout and (clone / "tiny-llama.hrry").is_file()
