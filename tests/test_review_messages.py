"""Messages of the rarer paths of convert and verify (issue #20's review): a missing DST is
said before any work, a missing file of a pair is one error (not two round trips), a refused
GGUF -> safetensors names the user's files and suggests only what can work, a dry run that
would refuse says so, a refused run prints no note about what it did not write."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from hurray_interop.cli import main

FLOATS = "choose --fallback float32|float16|bfloat16 to store them dequantized"


def cli(argv: list[object], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def hrry(fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    h = tmp_path_factory.mktemp("review") / "t.hrry"
    assert main(["convert", str(fixtures_dir / "tiny-llama.gguf"), str(h), "-q"]) == 0
    return h


@pytest.mark.parametrize("missing", ["missing.safetensors", "missing.gguf"])
def test_a_missing_dst_is_said_before_any_work(hrry: Path, tmp_path: Path, missing: str,
                                               capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from hurray_interop import _verify

    ran: list[str] = []
    monkeypatch.setattr(_verify, "_exported", lambda *a, **k: ran.append("export"))
    rc, out, err = cli(["verify", hrry, tmp_path / missing], capsys)
    assert (rc, out, err) == (2, "", f"hurray-interop: error: {tmp_path / missing}: no such file\n")
    assert ran == []  # nothing was converted first
    import hurray_interop

    r = hurray_interop.verify(hrry, tmp_path / missing)  # the verb reports it, never raises
    assert not r.ok and "no such file" in r.error


def test_a_missing_source_of_a_pair_is_one_error(hrry: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(["verify", tmp_path / "missing.gguf", hrry], capsys)
    assert (rc, out) == (2, "") and err == f"hurray-interop: error: {tmp_path / 'missing.gguf'}: no such file\n"


def test_a_round_trip_usage_error_suggests_the_flags_with_their_values(fixtures_dir: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = cli(["verify", fixtures_dir / "tiny-llama.gguf", "--split-max-tensors", "3"], capsys)
    assert rc == 2 and err.rstrip().endswith("(verify SRC DST --split-max-tensors 3)"), err


def test_refused_gguf_to_safetensors_names_the_users_files_and_float_fallbacks_only(
        fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, dst = fixtures_dir / "tiny-llama-kquant.gguf", tmp_path / "k.safetensors"
    rc, out, err = cli(["convert", src, dst], capsys)
    assert rc == 1 and not dst.exists()
    assert out.splitlines()[-1] == (f"refused: nothing written; {src} (gguf) -> {dst} (safetensors): "
                                    f"27 tensors (25 exact, 2 refused); {FLOATS}")
    assert "note:" not in out  # nothing was written: no note about what was
    assert "--fallback exact" not in out + err and ".hurray-interop-" not in out + err
    assert err.splitlines()[-1].endswith(f"({FLOATS})")
    rc, out, _ = cli(["convert", "--dry-run", src, dst], capsys)
    assert rc == 1 and out.splitlines()[-1].startswith("would refuse: ") and out.splitlines()[-1].endswith(FLOATS)
    assert "--fallback exact" not in out and "note:" not in out  # the intermediate file's forms are not the output's
    rc, _, _ = cli(["convert", src, dst, "--fallback", "float16", "-q"], capsys)  # what the hint says works
    assert rc == 0 and dst.exists()


def test_a_refused_hrry_import_keeps_its_hint(fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "k.gguf"
    shutil.copyfile(fixtures_dir / "tiny-llama-kquant.gguf", src)
    rc, out, _ = cli(["convert", src, tmp_path / "k.hrry"], capsys)
    assert rc == 1 and "--fallback exact to store them exactly" in out.splitlines()[-1]


def _hrry_of(path: Path, type_name: str, values: np.ndarray) -> Path:
    from gguf_factory import write_gguf_raw

    src = write_gguf_raw(path.with_suffix(".gguf"), [("w", type_name, values.shape, values.astype(
        {"F32": np.float32, "F16": np.float16}[type_name]))])
    assert main(["convert", str(src), str(path), "-q"]) == 0
    return path


def test_two_hrry_files_are_compared_in_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``verify --pair A.hrry B.hrry`` (and a lossy pair's repeated import) compares values in
    windows, whatever the tensors' size and however each layout chunks: the first difference
    is found past the first window, equal values of two layouts are equal, and no whole
    tensor is ever held as floats."""
    import tracemalloc

    import hurray_interop
    from hurray_interop.verification import hurray as VH

    monkeypatch.setattr(VH, "CHUNK_ROWS_ELEMENTS", 1000)  # windows of 1,000 values: several per tensor
    n = 3 * 4096
    x = (np.arange(n, dtype=np.float32) % 97 - 48) / 4  # exactly representable in float16
    a = _hrry_of(tmp_path / "a.hrry", "F32", x.reshape(3, 4096))
    b = _hrry_of(tmp_path / "b.hrry", "F16", x.reshape(3, 4096))
    y = x.copy()
    y[9001] += 1
    c = _hrry_of(tmp_path / "c.hrry", "F32", y.reshape(3, 4096))
    same = hurray_interop.verify(a, b)
    (t,) = same.tensors
    assert (t.bytes_equal, t.values_equal) == (False, True), t
    (t,) = hurray_interop.verify(a, c).tensors
    assert (t.values_equal, t.where, t.max_abs_diff) == (False, "element 9001", 1.0), t
    monkeypatch.setattr(VH, "CHUNK_ROWS_ELEMENTS", 1 << 18)
    big = np.zeros(1 << 23, dtype=np.float32)  # 32 MiB of float32 per tensor
    big[-1] = 1
    d = _hrry_of(tmp_path / "d.hrry", "F32", big.reshape(1024, -1))
    e = _hrry_of(tmp_path / "e.hrry", "F32", np.zeros_like(big).reshape(1024, -1))
    tracemalloc.start()
    try:
        (t,) = hurray_interop.verify(d, e).tensors
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (t.values_equal, t.where) == (False, f"element {big.size - 1}")
    assert peak < 12 << 20, f"{peak >> 20} MiB traced for two 32 MiB tensors"
