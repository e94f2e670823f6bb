"""The package installs as a wheel and editable, and finds mappings/ in both."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import shutil
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


KERNEL_LIB = "hurray_interop/_kernel.dll" if os.name == "nt" else "hurray_interop/_kernel.so"


@functools.cache
def compiler_works(probe_dir: str) -> bool:
    """Does hatch_build.py's compiler (``$CC``, Python's CC, ``cc``) build the kernel here?"""
    spec = importlib.util.spec_from_file_location("hatch_build", REPO / "hatch_build.py")
    assert spec and spec.loader
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook.compile_kernel(REPO, Path(probe_dir) / "probe.so") is None


def build_wheel(out: Path, **env: str) -> tuple[Path, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    if proc.returncode != 0:
        pytest.fail(f"wheel build failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1
    return wheels[0], proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))[0]


def test_wheel_carries_the_kernel_when_a_compiler_works(wheel: Path, tmp_path: Path) -> None:
    if not compiler_works(str(tmp_path)):
        pytest.skip("no working C compiler: the wheel is pure Python (checked below)")
    z = zipfile.ZipFile(wheel)
    assert KERNEL_LIB in z.namelist() and "hurray_interop/_kernel.c" not in z.namelist()
    assert not wheel.name.endswith("-none-any.whl"), wheel.name  # platform-specific
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))).decode()
    assert "Root-Is-Purelib: false" in meta
    lib = tmp_path / Path(KERNEL_LIB).name
    lib.write_bytes(z.read(KERNEL_LIB))
    from hurray_interop.kernels import _ABI_VERSION  # the version the loader accepts

    assert ctypes.CDLL(str(lib)).hk_abi_version() == _ABI_VERSION


@pytest.mark.slow
def test_wheel_without_a_compiler_is_pure_python(tmp_path: Path) -> None:
    whl, log = build_wheel(tmp_path, CC="false")  # a "compiler" that always fails: the build goes on
    assert whl.name.endswith("-py3-none-any.whl"), whl.name
    names = zipfile.ZipFile(whl).namelist()
    assert KERNEL_LIB not in names and "hurray_interop/mappings/gguf_hurray.toml" in names
    assert "compiled kernel not built, the numpy path will run" in log


def _project_copy(dst: Path) -> Path:
    """The files an install reads, without anything built in this checkout."""
    dst.mkdir()
    for f in ("pyproject.toml", "hatch_build.py", "README.md"):
        shutil.copy2(REPO / f, dst / f)
    for d in ("hurray_interop", "mappings"):
        shutil.copytree(REPO / d, dst / d, ignore=shutil.ignore_patterns("__pycache__", "_kernel.so", "_kernel.dll"))
    return dst


@pytest.mark.slow
def test_editable_build_compiles_the_kernel_beside_the_source(tmp_path: Path) -> None:
    """``pip install -e .`` (PEP 660 build_editable): the kernel lands next to the source, the
    .pth points at the project, mappings/ ride along; without a compiler a stale kernel goes."""
    proj = _project_copy(tmp_path / "proj")
    lib = proj / KERNEL_LIB
    code = "import hurray_interop.kernels as k, hurray_interop.tables as t; print(k.KERNEL, t.mappings_dir())"
    for cc, kernel in ((None, "c"), ("false", "numpy")):
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CC", "HURRAY_INTEROP_KERNEL")}  # the kernel this build makes
        if cc:
            env["CC"] = cc
        out = tmp_path / f"editable-{kernel}"
        subprocess.run([sys.executable, "-c", f"from hatchling.build import build_editable; build_editable({str(out)!r})"],
                       cwd=proj, env=env, check=True, capture_output=True)
        z = zipfile.ZipFile(next(out.glob("*.whl")))
        pth = next(n for n in z.namelist() if n.endswith(".pth"))
        assert Path(z.read(pth).decode().strip()) == proj
        assert "hurray_interop/mappings/gguf_hurray.toml" in z.namelist()
        if kernel == "c" and not compiler_works(str(tmp_path)):
            continue
        assert lib.is_file() == (kernel == "c")
        env["PYTHONPATH"] = str(proj)
        got = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
        assert got.stdout.split() == [kernel, str(proj / "mappings")], got.stderr


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


def test_wheel_carries_the_license(wheel: Path) -> None:
    z = zipfile.ZipFile(wheel)
    names = z.namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in meta


# Repository files an sdist does not need: CI's entry point (it runs from a clone).
NOT_IN_SDIST = {".ci/run"}


def test_sdist_ships_every_tracked_file_the_suite_reads(tmp_path: Path) -> None:
    """The sdist carries the whole tracked tree but CI's script (docs/ and bench/ included: the
    suite checks the README's references and runs the benchmarks' smoke test), the LICENSE,
    and nothing built here."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout (an unpacked sdist): the tracked file list is unknown")
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\n")
    proc = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path), str(REPO)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import tarfile

    with tarfile.open(next(tmp_path.glob("*.tar.gz"))) as tar:
        shipped = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
        pkg_info = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("/PKG-INFO"))).read().decode()
    want = {f for f in tracked if f and (REPO / f).is_file()} - NOT_IN_SDIST
    assert want - shipped == set(), "tracked files missing from the sdist"
    assert shipped - want - {"PKG-INFO"} == set(), "files in the sdist that git does not track"
    assert "License-Expression: MIT" in pkg_info and "License-File: LICENSE" in pkg_info
