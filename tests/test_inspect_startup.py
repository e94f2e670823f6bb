"""``inspect`` of a GGUF starts fast (issue 13 item 4): it imports none of the heavy
optional modules and decodes only the strings it shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf_factory import TensorDef, write_gguf_stream
from hurray_interop import kernels as K
from hurray_interop.files.binary import Reader
from hurray_interop.formats import gguf as G
from hurray_interop.inspection import inspect_gguf

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("ml_dtypes", "crc32c", "tqdm", "torch", "torchao", "gguf", "hurray", "safetensors",
         # ours and the standard library's, needed only by other files or options: split sets,
         # --fallback exact, scratch files, package resources, the .hrry container
         "hurray_interop.formats.gguf_split", "hurray_interop.conversions.gguf_exact",
         "hurray_interop.conversions.gguf_expanded", "hurray_interop.core.hrry", "tempfile",
         "importlib.resources", "traceback",
         # argparse's help layout asks the terminal's width through shutil only when it lays out help
         "shutil",
         # the descriptor codec (a GGUF's inspect shows no .hrry descriptor)
         "hurray_interop.core.descriptor")


def _vocab_gguf(path: Path, n: int) -> Path:
    tokens = G.StringArray.from_list(f"tok{i}" for i in range(n))
    merges = G.StringArray.from_list(f"a{i} b{i}" for i in range(n))
    kv = [
        ("general.architecture", G.GGUFValue(G.ValueType.STRING, b"llama")),
        ("tokenizer.ggml.tokens", G.GGUFValue(G.ValueType.ARRAY, tokens, G.ValueType.STRING)),
        ("tokenizer.ggml.merges", G.GGUFValue(G.ValueType.ARRAY, merges, G.ValueType.STRING)),
    ]
    return write_gguf_stream(path, [TensorDef("w", "F32", (32,))], kv=kv)


def test_inspect_of_a_gguf_imports_no_heavy_module(tmp_path: Path) -> None:
    src = _vocab_gguf(tmp_path / "v.gguf", 1000)
    code = (
        "import sys, io, contextlib\n"
        "from hurray_interop import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = cli.main(['inspect', {str(src)!r}])\n"
        f"print(rc, [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split(" ", 1) == ["0", "[]\n"]


def test_inspect_of_a_gguf_builds_only_its_own_arguments(tmp_path: Path) -> None:
    """The command line adds the arguments of the command it runs only: ``inspect`` of a GGUF
    reads none of the tables that only ``convert``'s options (``--convention``) or the
    ``--fallback exact`` conversion need."""
    src = _vocab_gguf(tmp_path / "v.gguf", 10)
    code = (
        "import io, contextlib\n"
        "from hurray_interop import tables\n"
        "loaded = []\n"
        "real = tables.load_table\n"
        "tables.load_table = lambda name: loaded.append(name) or real(name)\n"
        "from hurray_interop import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = cli.main(['inspect', {str(src)!r}])\n"
        "print(rc, sorted(set(loaded)))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    rc, loaded = out.split(" ", 1)
    assert rc == "0" and "ggml_types" in loaded  # the recorder saw the GGUF side's table
    assert "mx_types" not in loaded and "gguf_expanded" not in loaded


def test_inspect_decodes_only_the_strings_it_shows(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    src = _vocab_gguf(tmp_path / "v.gguf", 5000)
    fetched: list[int] = []
    real = G.StringArray.__getitem__

    def counting(self, i):  # type: ignore[no-untyped-def]
        fetched.append(i)
        return real(self, i)

    def whole(self):  # type: ignore[no-untyped-def]
        raise AssertionError("inspect decoded a whole string array")

    monkeypatch.setattr(G.StringArray, "__getitem__", counting)
    monkeypatch.setattr(G.StringArray, "tolist", whole)
    info = inspect_gguf(str(src))
    shown = {m["key"]: m for m in info["metadata"]}
    assert shown["tokenizer.ggml.tokens"]["value"] == [f"tok{i}" for i in range(16)]
    assert shown["tokenizer.ggml.tokens"]["count"] == 5000
    assert len(fetched) == 2 * 16 == sum(len(m["value"]) for k, m in shown.items() if k != "general.architecture")
    json.dumps(info)  # plain data


def test_a_string_past_the_end_is_located_after_the_fast_walk(tmp_path: Path) -> None:
    """The string walk checks bounds once, after the loop: an overrun anywhere is still
    reported at the first string that runs past the end, with its index and offset."""
    src = _vocab_gguf(tmp_path / "v.gguf", 300)
    data = bytearray(src.read_bytes())
    with G.read_gguf(str(src)) as gf:
        arr = gf.kv["tokenizer.ggml.tokens"].value
        at = int(arr._starts[123]) - 8  # the length prefix of string 123
    data[at : at + 8] = (len(data)).to_bytes(8, "little")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    try:
        G.read_gguf(str(bad))
    except G.TruncatedError as e:
        assert e.offset == at and "'tokenizer.ggml.tokens'[123] length" in str(e)
    else:
        raise AssertionError("no error")


@pytest.mark.parametrize("every", [7, 1009])
def test_the_vectorised_string_walk_is_exact_on_awkward_strings(monkeypatch, every: int) -> None:  # type: ignore[no-untyped-def]
    """Empty strings, strings of 256+ bytes, runs of NUL bytes that look like length
    prefixes, windows that cut strings: the offsets found equal the ones written.
    Awkward strings one in 7 hand most of the walk to the plain loop; 3 in 1009 leave
    most of it to the vectorised windows -- both are exact."""
    rng = np.random.default_rng(3)
    items: list[bytes] = []
    for i in range(3000):
        kind = i % every
        if kind == 0:
            items.append(b"")
        elif kind == 1:
            items.append(bytes(rng.integers(0, 256, int(rng.integers(256, 700)), dtype=np.uint8)))
        elif kind == 2:
            items.append(b"\x05" + b"\x00" * int(rng.integers(7, 20)) + b"x")  # false prefixes inside
        else:
            items.append(bytes(rng.integers(1, 256, int(rng.integers(1, 40)), dtype=np.uint8)))
    arr = G.StringArray.from_list(items)
    raw = G._U64.pack(len(items)) + bytes(memoryview(arr._buf))  # count, then the strings
    for window in (64, 1000, 1 << 22):
        monkeypatch.setattr(K, "STRING_WINDOW", window)
        monkeypatch.setattr(K, "_lib", None)  # the numpy walk (tests/test_kernels.py: C = numpy)
        reader = Reader(raw + b"tail", 8, len(raw))
        starts = reader.string_starts(len(items), "k")
        assert reader.pos == len(raw) and list(G.StringArray(reader.obj, starts, 8, reader.pos)) == items
        assert np.array_equal(starts, arr._starts + 8)
        if every > 100 and window == 1 << 22:
            assert K._short_string_heads(raw, 8, len(items), len(raw))[2] > len(items) * 9 // 10


@pytest.mark.parametrize("preset", [None, "3"])
def test_the_command_line_spares_numpy_its_blas_threads(tmp_path: Path, preset: str | None) -> None:
    """Nothing here uses BLAS: a command started without numpy loaded sets OPENBLAS_NUM_THREADS=1
    before numpy starts its pool, and leaves a count the user chose alone."""
    src = _vocab_gguf(tmp_path / "v.gguf", 10)
    code = (
        "import io, os, sys, contextlib\n"
        "from hurray_interop import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = cli.main(['inspect', {str(src)!r}])\n"
        "print(rc, 'numpy' in sys.modules, os.environ.get('OPENBLAS_NUM_THREADS'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "True", preset or "1"]


@pytest.mark.parametrize("columns", ["24", "60", "200"])
def test_the_help_is_argparses_at_every_width(monkeypatch, columns: str) -> None:  # type: ignore[no-untyped-def]
    """The CLI's formatter (terminal width looked up late) lays help and usage out as
    argparse.HelpFormatter does, for the main parser and every command."""
    import argparse

    from hurray_interop import cli

    monkeypatch.setenv("COLUMNS", columns)

    def texts(formatter: type) -> list[str]:
        monkeypatch.setattr(cli, "_Formatter", formatter)
        p = cli._build_parser()
        subs = p._subparsers._group_actions[0].choices  # noqa: SLF001
        out = [p.format_help(), p.format_usage()]
        for name in ("convert", "verify", "inspect"):
            out += [subs[name].format_help(), subs[name].format_usage()]
        return out

    ours, theirs = texts(cli._Formatter), texts(argparse.HelpFormatter)
    assert ours == theirs and len(set(theirs)) == len(theirs)
