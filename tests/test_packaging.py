"""The package installs as a wheel and editable, and finds mappings/ in both."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from hurray_interop.tables import load_table, mappings_dir

REPO = Path(__file__).resolve().parents[1]


def test_tables_load_from_this_install() -> None:
    d = mappings_dir()
    assert (d / "element_types.toml").is_file()
    assert load_table("element_types")["float32"]["tag"] == 0x03
    assert load_table("gguf_hurray")["types"]["Q4_0"]["storage"] == "int4"


def test_every_mapping_table_is_valid_toml() -> None:
    import tomllib

    names = sorted(p.stem for p in (REPO / "mappings").glob("*.toml"))
    assert {"element_types", "ggml_types", "gguf_hurray"} <= set(names)
    for n in names:
        with (REPO / "mappings" / f"{n}.toml").open("rb") as fh:
            assert tomllib.load(fh), n


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.fail(f"wheel build failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1
    return wheels[0]


def test_wheel_carries_mappings_and_typing_marker(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for toml in (REPO / "mappings").glob("*.toml"):
        assert f"hurray_interop/mappings/{toml.name}" in names
    assert "hurray_interop/py.typed" in names
    assert not any(n.startswith("tests/") for n in names)


@pytest.mark.slow
def test_installed_wheel_finds_mappings_outside_the_repo(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=True).create(env_dir)
    py = env_dir / "bin" / "python"
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
    )
    code = (
        "import hurray_interop.tables as t, pathlib; d = t.mappings_dir(); "
        "assert 'site' in d.parts, d; "
        "print(t.load_table('element_types')['int4']['tag'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    proc = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(0x48)
