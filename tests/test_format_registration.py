"""A format is declared in one place: its record in the registry, with its options.

A toy format registered here -- one ``register_format`` call, one option of its own -- is
taken by ``convert()``, the batch layer and the command line (flag, help, check) with no
other edit; the built-in formats' options are the ones the API, the batch options, the CLI
and the ``__init__`` docstring name."""

from __future__ import annotations

import contextlib
import io
import pickle

import pytest

import hurray_interop
from hurray_interop import registry
from hurray_interop._convert import convert
from hurray_interop.batch import ConvertOptions, VerifyOptions, convert_many
from hurray_interop.cli import main
from hurray_interop.errors import UsageError
from hurray_interop.report import ConversionReport

TOY_OPTION = registry.Option(
    "toy_mode", "plain", "Toy input: how the toy blocks are read", applies=registry.IMPORT,
    choices=("plain", "fancy"), unknown="unknown --toy-mode {value!r} (one of: {choices})",
)


@pytest.fixture
def toy(tmp_path):
    """A registered toy format (``.toy``, magic ``TOY1``) whose import records the options it gets."""
    calls: list[dict] = []

    def to_hurray(src, dst, *, jobs=None, **options):
        calls.append(options)
        return ConversionReport(src, dst, "toy", "hurray", dry_run=options["dry_run"])

    def unused(*args, **kw):
        raise AssertionError("not called")

    registry.register_format(registry.Format(
        name="toy", title="Toy", extensions=(".toy",), sniff=lambda head: head[:4] == b"TOY1",
        open=unused, inspect=unused, verifier=unused, to_hurray=to_hurray, from_hurray=unused,
        options=(TOY_OPTION,),
    ))
    src = tmp_path / "model.toy"
    src.write_bytes(b"TOY1" + bytes(12))
    try:
        yield src, calls
    finally:
        registry.unregister_format("toy")
    assert registry.format_names() == ("gguf", "hurray", "safetensors")


def test_convert_takes_and_checks_a_registered_formats_option(toy, tmp_path, fixtures_dir):
    src, calls = toy
    convert(src, tmp_path / "out.hrry", toy_mode="fancy")
    assert calls[-1]["toy_mode"] == "fancy" and calls[-1]["fallback"] is None
    convert(src, tmp_path / "out.hrry")
    assert calls[-1]["toy_mode"] == "plain"  # the declared default
    with pytest.raises(UsageError, match=r"^unknown --toy-mode 'nope' \(one of: plain, fancy\)$"):
        convert(src, tmp_path / "out.hrry", toy_mode="nope")
    with pytest.raises(UsageError, match=r"^--toy-mode applies to Toy input only$"):
        convert(fixtures_dir / "tiny-llama.gguf", tmp_path / "t.hrry", toy_mode="fancy", dry_run=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'toy_mod'"):
        convert(src, tmp_path / "out.hrry", toy_mod="fancy")
    assert len(calls) == 2  # nothing ran for the refused options


def test_the_command_line_takes_a_registered_formats_option(toy, tmp_path, capsys):
    src, calls = toy
    assert main(["convert", str(src), str(tmp_path / "out.hrry"), "--toy-mode", "fancy", "-q"]) == 0
    assert calls[-1]["toy_mode"] == "fancy"
    assert main(["convert", str(src), str(tmp_path / "out.hrry"), "--toy-mode", "nope"]) == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err and len(calls) == 1
    for command, said in (("convert", ""), ("verify", registry.SAID)):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert main([command, "--help"]) == 0
        text = " ".join(out.getvalue().split())
        assert f"--toy-mode {{plain,fancy}} {TOY_OPTION.help}{said}" in text


def test_the_batch_layer_takes_a_registered_formats_option(toy, tmp_path):
    src, calls = toy
    results = list(convert_many([src], tmp_path / "out", dst_format="hurray", toy_mode="fancy"))
    assert [r.status for r in results] == ["ok"] and calls[-1]["toy_mode"] == "fancy"
    assert ConvertOptions(toy_mode="fancy").toy_mode == "fancy"
    assert VerifyOptions(toy_mode="fancy").conversion()["toy_mode"] == "fancy"


def test_options_are_the_registrys(toy):
    with pytest.raises(TypeError, match="unexpected option"):
        ConvertOptions(no_such_option=1)
    options = ConvertOptions(q4_1="requantize", jobs=2)
    assert pickle.loads(pickle.dumps(options)) == options  # a task carries them to its worker
    assert options.q4_1 == "requantize" and options.merge is False and options.toy_mode == "plain"
    with pytest.raises(AttributeError):
        options.q4_1 = "overlay"  # type: ignore[misc]
    assert set(VerifyOptions().conversion()) == {o.name for o in registry.conversion_options()}
    assert set(ConvertOptions().asdict()) == set(registry.option_defaults(run=True))


def test_an_option_name_registers_once():
    gguf = registry.get_format("gguf")
    clone = registry.Format(name="gguf2", title="GGUF2", extensions=(".gguf2",), sniff=gguf.sniff, open=gguf.open,
                            inspect=gguf.inspect, verifier=gguf.verifier, options=gguf.options[:1])
    with pytest.raises(ValueError, match=r"option\(s\) \['q4_1'\] already registered"):
        registry.register_format(clone)
    assert registry.format_names() == ("gguf", "hurray", "safetensors")


def test_the_api_docstrings_name_every_declared_option():
    """``hurray_interop.convert``'s docstring is written by hand: it names every option the
    formats declare and every --fallback choice (``_convert.convert``'s list is generated)."""
    doc = " ".join(hurray_interop.convert.__doc__.split())
    generated = convert.__doc__
    for o in (*registry.conversion_options(), *registry.run_options()):
        assert f"``{o.name}``" in doc, o.name
        assert f"``{o.name}={o.default!r}``" in generated and o.cli_flag in generated
    for choice in registry.FALLBACK_CHOICES:
        assert f'``"{choice}"``' in doc, choice
    verify_doc = " ".join(hurray_interop.verify.__doc__.split())
    assert all(f"``{o.name}``" in verify_doc for o in registry.conversion_options())


def test_importing_a_plugin_first_changes_no_order() -> None:
    """The registry registers the built-in records in the order of BUILTIN_FORMATS, whoever
    imports a plugin module first (the --from/--to choices and every "one of" message)."""
    import subprocess
    import sys

    code = ("import hurray_interop.plugins.gguf\n"
            "from hurray_interop.registry import format_names\nprint(','.join(format_names()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ",".join(registry.BUILTIN_FORMATS) == "gguf,hurray,safetensors"


def test_a_failed_load_of_the_built_in_formats_is_retried_whole(monkeypatch) -> None:
    """A plugin that fails to load leaves nothing registered; the next look-up loads every
    built-in record again (the plugins that had loaded are not lost)."""
    saved = dict(registry._REGISTRY)
    monkeypatch.setattr(registry, "_state", "new")
    registry._REGISTRY.clear()
    try:
        monkeypatch.setattr(registry, "BUILTIN_FORMATS", ("gguf", "hurray", "no_such_plugin"))
        with pytest.raises(ModuleNotFoundError):
            registry.format_names()
        assert registry._REGISTRY == {} and registry._state == "new"
        monkeypatch.setattr(registry, "BUILTIN_FORMATS", ("gguf", "hurray", "safetensors"))
        assert registry.format_names() == ("gguf", "hurray", "safetensors")
        assert {n: f.name for n, f in registry._REGISTRY.items()} == {n: f.name for n, f in saved.items()}
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved)
