"""The verify skeleton shared by every foreign format (verification/common.py): the same
checks and the same wording for GGUF and safetensors, only the format facts differ."""

from __future__ import annotations

from pathlib import Path

import pytest

import hurray_interop
from hurray_interop.registry import formats


@pytest.mark.parametrize(
    "foreign,other",
    [("kv-types.gguf", "tiny-llama.gguf"), ("gpt-oss-tiny.safetensors", "ct-mxfp4-tiny.safetensors")],
    ids=["gguf", "safetensors"],
)
def test_a_foreign_file_against_an_unrelated_hrry(fixtures_dir: Path, tmp_path: Path, foreign: str, other: str) -> None:
    """Tensors the .hrry lacks are rows that fail; tensors only the .hrry has are a problem
    naming the .hrry; the exported file's first difference is located in the foreign file."""
    hrry = tmp_path / "other.hrry"
    hurray_interop.convert(fixtures_dir / other, hrry)
    with hurray_interop.open(fixtures_dir / foreign) as f:
        first_name = (f.tensors[0].name if hasattr(f, "tensors") else f.entries[0].name)
    res = hurray_interop.verify(fixtures_dir / foreign, hrry)
    assert not res.ok and res.file_bytes_equal is False
    first = res.tensors[0]
    assert first.name == first_name and first.values_equal is False and first.where == "missing from the Hurray file"
    only = [p for p in res.problems if p.startswith("tensors only in ")]
    assert len(only) == 1 and only[0].startswith(f"tensors only in {hrry}: ")
    assert res.problems[0].startswith("the Hurray file exports to a ") and " that differs first at " in res.problems[0]


@pytest.mark.parametrize(
    "a,b,tensor,where",
    [
        ("tiny-llama.gguf", "tiny-llama-kquant.gguf", "blk.0.ffn_down.weight", "stored as Q4_K [256, 64], not F16 [128, 64]"),
        ("gpt-oss-tiny.safetensors", "ct-mxfp4-tiny.safetensors", "model.embed_tokens.weight",
         "stored as BF16 [8, 64], not BF16 [16, 64]"),
    ],
    ids=["gguf", "safetensors"],
)
def test_two_files_of_one_format_name_a_changed_type_or_shape(fixtures_dir: Path, a: str, b: str, tensor: str, where: str) -> None:
    res = hurray_interop.verify(fixtures_dir / a, fixtures_dir / b)
    assert res.kind == "pair" and not res.ok
    row = next(t for t in res.tensors if t.name == tensor)
    assert row.bytes_equal is False and row.where == where


def test_a_changed_plain_gguf_tensor_is_located_by_byte(fixtures_dir: Path, tmp_path: Path) -> None:
    """A plain (one element per block) type is located by byte, like in every other place."""
    src = fixtures_dir / "tiny-llama.gguf"
    with hurray_interop.open(src) as g:
        t = next(t for t in g.tensors if t.name == "extra.i32")
        at = t.data_offset + 4 * 3 + 1
    raw = bytearray(src.read_bytes())
    raw[at] ^= 0x01
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(raw))
    res = hurray_interop.verify(src, bad)
    (row,) = [t for t in res.tensors if not t.ok]
    assert row.name == "extra.i32" and row.where == "byte 13"
    assert f"files differ first at tensor 'extra.i32' element 3 (offset {at})" in res.problems


def test_every_foreign_format_has_a_round_trip(fixtures_dir: Path) -> None:
    """Each registered format with converters round-trips through the one skeleton."""
    sample = {"gguf": "tiny-llama.gguf", "safetensors": "mxfp8-tiny.safetensors"}
    foreign = [f.name for f in formats() if f.to_hurray is not None]
    assert sorted(foreign) == sorted(sample)
    for name in foreign:
        res = hurray_interop.verify(fixtures_dir / sample[name])
        assert res.ok and res.kind == "round-trip" and res.file_bytes_equal, res.summary_line()
