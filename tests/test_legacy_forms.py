"""Files written by earlier versions still export to the identical GGUF and pass ``verify``.

``fixtures/legacy/*.hrry`` are what the converter wrote before the compact exact forms
(docs/conversion-rules.md § 11; ``fixtures/legacy/make_legacy_fixtures.py`` names the commit
and rebuilds them): Q4_1/Q5_1 minimum overlays with a uint2 code per element, Q5_0 as int8,
the K-quant/IQ expanded forms with a record of every super-block header."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import hurray_interop
from hurray_interop.cli import main

#: legacy file -> (the GGUF it came from, the options it was written with)
LEGACY = {
    "tiny-llama.hrry": ("tiny-llama.gguf", {}),
    "tiny-llama-kquant.exact.hrry": ("tiny-llama-kquant.gguf", {"fallback": "exact"}),
    "ggml-quantized-types.exact.hrry": ("ggml-quantized-types.gguf", {"fallback": "exact"}),
}
#: the bytes the earlier version wrote (a legacy fixture must never be rewritten by today's code)
SHA256 = {
    "tiny-llama.hrry": "15739f41690f3c944e36d44fd87893dd6c522697f3556dad260fdc3a220cd597",
    "tiny-llama-kquant.exact.hrry": "a8577f21f076687abbc90830c21e776b6bb6945aa5e2af60e02486365d3837f0",
    "ggml-quantized-types.exact.hrry": "3e00003aedd25023c3c600c1c1c1c7366f0676a4181b3e8d0f9f03378e6d74e2",
}


def _legacy(fixtures_dir: Path, name: str) -> Path:
    path = fixtures_dir / "legacy" / name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHA256[name], f"{path} is not the legacy file"
    return path


@pytest.mark.parametrize("name", sorted(LEGACY))
def test_a_legacy_file_exports_to_the_identical_gguf(fixtures_dir: Path, tmp_path: Path, name: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    src, _ = LEGACY[name]
    out = tmp_path / "back.gguf"
    assert main(["convert", str(_legacy(fixtures_dir, name)), str(out), "--quiet"]) == 0, capsys.readouterr().err
    assert out.read_bytes() == (fixtures_dir / src).read_bytes()


@pytest.mark.parametrize("name", sorted(LEGACY))
def test_verify_accepts_a_legacy_file_against_its_source(fixtures_dir: Path, name: str) -> None:
    src, options = LEGACY[name]
    result = hurray_interop.verify(fixtures_dir / src, _legacy(fixtures_dir, name), **options)
    assert result.ok, (result.error, result.problems)
    assert result.file_bytes_equal
    assert result.tensors and all(t.ok for t in result.tensors)
