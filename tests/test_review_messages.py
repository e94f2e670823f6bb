"""Messages of the rarer paths of convert and verify (issue #20's review): a missing DST is
said before any work, a missing file of a pair is one error (not two round trips), a refused
GGUF -> safetensors names the user's files and suggests only what can work, a dry run that
would refuse says so, a refused run prints no note about what it did not write."""

from __future__ import annotations

import shutil
from pathlib import Path

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
