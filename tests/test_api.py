"""The public API (seven verbs at the top level) and the format registry behind it.

The verbs' docstring examples are run here (from the repository root, where they
find ``fixtures/``); the README's Python API section names the same verbs."""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hurray_interop
from hurray_interop import registry
from hurray_interop.core.hrry import HrryFile
from hurray_interop.errors import BadMagicError, FormatError, UsageError
from hurray_interop.formats.gguf import GGUFFile
from hurray_interop.formats.safetensors import SafetensorsFile

REPO = Path(__file__).resolve().parents[1]
VERBS = ("convert", "verify", "compare", "inspect", "open", "dequantize")


@pytest.mark.parametrize("module", [hurray_interop, registry], ids=lambda m: m.__name__)
def test_docstring_examples_run(module, monkeypatch):
    monkeypatch.chdir(REPO)
    failed, attempted = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=False)
    assert attempted > 0 and failed == 0, f"{failed} of {attempted} examples failed (run doctest -v on {module.__name__})"


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_a_runnable_example(verb):
    f = getattr(hurray_interop, verb)
    assert callable(f) and verb in hurray_interop.__all__
    examples = doctest.DocTestParser().get_examples(f.__doc__ or "")
    assert any(f"hurray_interop.{verb}(" in e.source for e in examples), verb


def _readme_api() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return readme.split("## Python API", 1)[1].split("\n## ", 1)[0]


def test_readme_python_api_example_runs(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    block = _readme_api().split("```python\n", 1)[1].split("```", 1)[0]
    for verb in VERBS:
        assert f"hurray_interop.{verb}(" in block, verb
    exec(compile(block, "README.md (Python API)", "exec"), {})
    assert capsys.readouterr().out.startswith("gguf 27\n")


@pytest.mark.parametrize(
    "fixture,cls", [("tiny-llama.gguf", GGUFFile), ("gpt-oss-tiny.safetensors", SafetensorsFile)]
)
def test_open_sniffs_the_format(fixtures_dir, tmp_path, fixture, cls):
    hidden = tmp_path / "no-extension"  # the magic bytes decide, not the name
    hidden.write_bytes((fixtures_dir / fixture).read_bytes())
    with hurray_interop.open(hidden) as f:
        assert type(f) is cls
    hrry = tmp_path / "m.hrry"
    hurray_interop.convert(fixtures_dir / fixture, hrry)
    with hurray_interop.open(hrry) as f:
        assert type(f) is HrryFile and len(f.names) > 0


def test_open_refuses_what_the_bytes_deny(fixtures_dir, tmp_path):
    with pytest.raises(BadMagicError, match="says safetensors but the file looks like gguf"):
        hurray_interop.open(fixtures_dir / "tiny-llama.gguf", "safetensors")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\0" * 32)
    with pytest.raises(FormatError, match=r"not a GGUF, Hurray or safetensors file \(unknown magic bytes\)"):
        hurray_interop.open(junk)


def test_verify_with_two_files_compares_them(fixtures_dir, tmp_path):
    src = fixtures_dir / "tiny-llama.gguf"
    hrry = tmp_path / "m.hrry"
    hurray_interop.convert(src, hrry)
    res = hurray_interop.verify(src, hrry)
    assert res.kind == "pair" and res.ok and res.file_bytes_equal
    assert [t.name for t in res.tensors] == [t.name for t in hurray_interop.convert(src, hrry, dry_run=True).tensors]


def test_dequantize_matches_gguf_py(fixtures_dir, tmp_path):
    """The verb is the shared dequantizer; gguf-py is the independent oracle."""
    gguf = pytest.importorskip("gguf")
    name = "blk.0.attn_k.weight"  # Q4_0
    hrry = tmp_path / "m.hrry"
    hurray_interop.convert(fixtures_dir / "tiny-llama.gguf", hrry)
    t = next(t for t in gguf.GGUFReader(str(fixtures_dir / "tiny-llama.gguf")).tensors if t.name == name)
    expect = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    with hurray_interop.open(hrry) as f:
        got = hurray_interop.dequantize(f.tensor(name))
    assert got.shape == expect.shape and np.array_equal(got.view(np.uint32), expect.astype(np.float32).view(np.uint32))


def test_entry_modules_are_private_and_old_paths_gone():
    """`hurray_interop.convert` is the verb; the modules behind the verbs are private."""
    for old in ("convert", "verify", "inspect", "verify_safetensors"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"hurray_interop.{old}")
    for kept in ("hurray_interop.dequant", "hurray_interop.core.hrry", "hurray_interop.conversions.mx"):
        importlib.import_module(kept)
    assert callable(hurray_interop.convert) and hurray_interop.inspect.__module__ == "hurray_interop"


# ---------------------------------------------------------------------------
# the registry


def test_registry_records():
    assert registry.format_names() == ("gguf", "hurray", "safetensors")
    hub = registry.get_format(registry.HURRAY)
    assert hub.to_hurray is None and hub.from_hurray is None
    for f in registry.formats():
        if f is not hub:
            assert callable(f.to_hurray) and callable(f.from_hurray)
        assert f.extensions and all(e.startswith(".") for e in f.extensions)
    with pytest.raises(UsageError, match=r"unknown format 'onnx' \(one of gguf, hurray, safetensors\)"):
        registry.get_format("onnx")


def test_a_name_or_extension_registers_once():
    gguf = registry.get_format("gguf")
    with pytest.raises(ValueError, match="already registered"):
        registry.register_format(gguf)
    with pytest.raises(ValueError, match=r"\.gguf"):
        registry.register_format(dataclasses.replace(gguf, name="gguf2"))
    assert registry.format_names() == ("gguf", "hurray", "safetensors")


@pytest.mark.parametrize(
    "head,name",
    [
        (b"GGUF\x03\x00\x00\x00" + bytes(8), "gguf"),
        (b"HRRYFILE" + bytes(8), "hurray"),
        ((40).to_bytes(8, "little") + b'{"a":', "safetensors"),
        ((1).to_bytes(8, "little") + b"{", None),  # a header of one byte cannot be JSON
        ((40).to_bytes(8, "little") + b"[", None),
        (b"GG", None),
        (b"", None),
    ],
)
def test_sniff(head, name):
    found = registry.sniff_format(head)
    assert (found.name if found else None) == name


def test_cli_format_choices_come_from_the_registry():
    from hurray_interop.cli import _build_parser

    convert = _build_parser()._subparsers._group_actions[0].choices["convert"].complete()  # noqa: SLF001
    choices = {a.dest: a.choices for a in convert._actions if a.dest in ("src_format", "dst_format")}  # noqa: SLF001
    assert choices == {"src_format": registry.format_names(), "dst_format": registry.format_names()}


def test_detecting_and_inspecting_a_gguf_loads_only_what_gguf_needs(fixtures_dir):
    """The registry's shims import a format's modules on first use: inspecting a GGUF loads
    neither the safetensors side, the verifier nor torch."""
    code = (
        "import sys, json, hurray_interop\n"
        f"hurray_interop.inspect({str(fixtures_dir / 'tiny-llama.gguf')!r})\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('hurray_interop', 'torch')))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded = set(json.loads(out))
    assert {"hurray_interop.inspection", "hurray_interop.conversions.gguf", "hurray_interop.formats.gguf"} <= loaded
    for absent in ("hurray_interop.formats.safetensors", "hurray_interop.conversions.safetensors",
                   "hurray_interop.verification", "hurray_interop._verify", "hurray_interop._convert", "torch"):
        assert absent not in loaded, absent
