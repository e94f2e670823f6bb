"""``inspect`` as a gguf-dump replacement (issue 20): shapes in numpy and GGUF order and
element counts, the plan's reason in full (wrapped on a terminal, never cut), a closing
summary with the ``--fallback exact`` hint, UTF-8 shown as text, arrays as their first items
plus a separate count (``--full`` / ``--max-items N`` / ``max_items=``), Markdown, and text
that cannot be encoded (lone surrogates) shown escaped instead of crashing half-way."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf_factory import TensorDef, write_gguf_raw, write_gguf_stream
from hurray_interop import _inspect
from hurray_interop import inspect as api_inspect
from hurray_interop.cli import main
from hurray_interop.errors import FormatError, UsageError
from hurray_interop.formats import gguf as G
from hurray_interop.inspection import MAX_ITEMS

ROOT = Path(__file__).resolve().parent.parent
KQUANT = "tiny-llama-kquant.gguf"  # Q4_K and Q6_K (refused by default), a 300-token vocabulary


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main([os.fspath(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def child(argv: list[str], **env: str) -> subprocess.CompletedProcess[bytes]:
    """The command in a fresh process, its output as bytes (the real stdout, not a capture)."""
    e = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    e.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "hurray_interop", *map(os.fspath, argv)], env=e, capture_output=True)


def table(out: str) -> tuple[str, list[str]]:
    """The tensor table of ``inspect``'s text: its header line and its lines (continuations included)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("name "))
    end = next(i for i, line in enumerate(lines) if line.startswith("metadata ("))
    return lines[start], lines[start + 1 : end]


# ---------------------------------------------------------------------------
# shapes and element counts


def test_gguf_rows_have_numpy_shape_ggml_ne_and_element_count(fixtures_dir: Path) -> None:
    """gguf-py's reader is the oracle: its ``shape`` is GGUF's ``ne`` order."""
    info = api_inspect(fixtures_dir / KQUANT)
    theirs = {t.name: (list(map(int, t.shape)), int(t.n_elements)) for t in gguf.GGUFReader(fixtures_dir / KQUANT).tensors}
    ours = {r["name"]: (r["ne"], r["elements"]) for r in info["tensors"]}
    assert ours == theirs
    assert all(r["shape"] == r["ne"][::-1] for r in info["tensors"])
    assert info["tensor_columns"][:4] == ["name", "shape", "ne", "elements"]
    assert info["summary"]["elements"] == sum(n for _, n in theirs.values())


def test_text_shows_shape_ne_and_elements(fixtures_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["inspect", fixtures_dir / KQUANT], capsys)
    header, rows = table(out)
    assert status == 0 and header.split()[:5] == ["name", "shape", "ne", "elements", "ggml_type"]
    row = next(r for r in rows if r.startswith("token_embd.weight "))
    assert "[300, 64]   [64, 300]   19200 " in row  # numpy order, GGUF order, elements


def test_split_set_rows_have_every_shards_shapes(fixtures_dir: Path) -> None:
    info = api_inspect(fixtures_dir / "tiny-split-00002-of-00003.gguf")
    theirs = {}
    for i in (1, 2, 3):
        for t in gguf.GGUFReader(fixtures_dir / f"tiny-split-0000{i}-of-00003.gguf").tensors:
            theirs[t.name] = list(map(int, t.shape))
    assert {r["name"]: r["ne"] for r in info["tensors"]} == theirs and len(theirs) == info["tensor_count"]


def test_hurray_rows_have_element_counts(fixtures_dir: Path, tmp_path: Path) -> None:
    hrry = tmp_path / "t.hrry"
    assert main(["convert", str(fixtures_dir / "tiny-llama.gguf"), str(hrry), "-q"]) == 0
    info = api_inspect(hrry)
    assert all(r["elements"] == int(np.prod(r["shape"])) for r in info["tensors"])
    top = [r for r in info["tensors"] if not r["member_of_composite"]]
    assert len(top) < len(info["tensors"])  # Q4_1 and Q5_1 as overlays: a head and two members each
    assert info["summary"] == {"tensors": len(info["tensors"]), "top_level": len(top),
                               "elements": sum(r["elements"] for r in top),
                               "stored_bytes": sum(r["stored_bytes"] for r in info["tensors"])}
    assert info["summary"]["elements"] == api_inspect(fixtures_dir / "tiny-llama.gguf")["summary"]["elements"]


# ---------------------------------------------------------------------------
# the reason in full


def _reason_of(out: str, name: str) -> str:
    """The reason cell of tensor ``name``, its continuation lines joined."""
    header, rows = table(out)
    at = header.index("reason")
    i = next(k for k, r in enumerate(rows) if r.startswith(name + " "))
    parts = [rows[i][at:].strip()]
    for r in rows[i + 1 :]:
        if r[:1] != " ":
            break
        parts.append(r[at:].strip())
    return " ".join(p for p in parts if p)


@pytest.mark.parametrize("columns", [None, "80", "130", "140", "200"])
def test_the_reason_is_shown_in_full(fixtures_dir: Path, capsys, monkeypatch, columns: str | None) -> None:  # type: ignore[no-untyped-def]
    """Every word of the reason appears whole, in order (never split inside, nor at a hyphen:
    "(per-block-affine" is one word); on a terminal narrower than the table can be, it is
    wider than the terminal rather than split."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)  # a pipe: one line per tensor
    else:
        monkeypatch.setenv("COLUMNS", columns)
    reason = next(r["reason"] for r in api_inspect(fixtures_dir / KQUANT)["tensors"] if r["name"] == "blk.0.ffn_down.weight")
    status, out, _ = run(["inspect", fixtures_dir / KQUANT], capsys)
    assert status == 0 and len(reason) > 60 and "…" not in "".join(table(out)[1])
    assert "(per-block-affine" in reason.split()  # the word the old wrapping split ("(per-bloc" / "k-affine")
    shown = _reason_of(out, "blk.0.ffn_down.weight")
    assert shown.split() == reason.split() and shown == reason
    header, rows = table(out)
    names = [r.split()[0] for r in rows if r[:1] != " "]
    assert len(names) == 27  # one logical row per tensor
    if columns is None:
        assert len(rows) == 27  # not wrapped: one line each
    else:
        assert len(rows) > 27
        if int(columns) >= 140:  # room for the longest word of each wrapping column
            assert max(len(r) for r in [header, *rows]) <= int(columns)


def test_a_word_longer_than_its_column_overflows_whole_and_aligned() -> None:
    cols = ["name", "reason", "status"]
    word = "super-block-scales-and-minimums"  # longer than any column may be made (16)
    rows = [cols, ["a", f"one two {word} three four five six seven", "ok"], ["b", "x", "ok"]]
    lines = _inspect._table(rows, cols, 30)
    assert any(word in line.split() for line in lines)  # whole, on a line of its own width
    at = lines[0].index("status")
    assert all(line[at:].rstrip() in ("status", "ok", "") for line in lines)  # the next column stays aligned
    got = " ".join(line[lines[0].index("reason"):at].strip() for line in lines[1:-1])
    assert got.split() == rows[1][1].split()


def test_the_table_wraps_only_past_the_width() -> None:
    """Bounds: a table exactly as wide as the terminal is not wrapped; one column narrower wraps."""
    cols = ["name", "reason"]
    rows = [cols, ["a", "one two three four five six seven eight nine ten"]]
    natural = len("name") + 2 + len(rows[1][1])
    assert _inspect._table(rows, cols, natural + 1) == _inspect._table(rows, cols, None)
    assert _inspect._table(rows, cols, natural) == ["name  reason", "a     " + rows[1][1]]
    assert _inspect._table(rows, cols, natural) == _inspect._table(rows, cols, None)
    wrapped = _inspect._table(rows, cols, natural - 1)
    assert len(wrapped) == 3 and all(len(line) <= natural - 1 for line in wrapped)
    assert " ".join(line[6:].strip() for line in wrapped[1:]) == rows[1][1]


def test_a_narrow_terminal_still_shows_every_word(fixtures_dir: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Narrower than the fixed columns: the wrapping columns keep their minimum width."""
    monkeypatch.setenv("COLUMNS", "40")
    reason = next(r["reason"] for r in api_inspect(fixtures_dir / KQUANT)["tensors"] if r["name"] == "blk.1.ffn_down.weight")
    status, out, _ = run(["inspect", fixtures_dir / KQUANT], capsys)
    assert status == 0
    assert _reason_of(out, "blk.1.ffn_down.weight") == reason  # every word whole


# ---------------------------------------------------------------------------
# the summary line


def test_summary_counts_the_plan_and_hints_fallback_exact(fixtures_dir: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    status, out, _ = run(["inspect", fixtures_dir / KQUANT], capsys)
    last = out.splitlines()[-1]
    info = api_inspect(fixtures_dir / KQUANT)
    s = info["summary"]
    assert s["counts"] == {"exact": 25, "refused": 2} and s["tensors"] == 27
    assert s["bytes_in"] == sum(r["bytes_in"] for r in info["tensors"])
    assert last.startswith("summary: 27 tensors, 162,733 elements, ")
    assert f"{s['bytes_in']:,} bytes of tensor data -> {s['bytes_out']:,} as Hurray" in last
    assert "plan: 25 exact, 2 refused" in last and "--fallback exact would store the 2 refused tensor(s) (Q4_K, Q6_K)" in last


def test_no_hint_when_exact_is_chosen_or_would_not_help(fixtures_dir: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    status, out, _ = run(["inspect", fixtures_dir / KQUANT, "--fallback", "exact"], capsys)
    assert status == 0 and "plan: 27 exact" in out.splitlines()[-1] and "--fallback" not in out.splitlines()[-1]
    q8k = np.zeros((2, gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_K][1]), dtype=np.uint8)
    src = write_gguf_raw(tmp_path / "q8k.gguf", [("w", "Q8_K", (512,), q8k), ("k", "Q4_K", (256,), np.zeros(144, np.uint8))])
    info = api_inspect(src)
    assert info["summary"]["counts"] == {"refused": 2}
    assert info["summary"]["hint"].startswith("--fallback exact would store 1 of the 2 refused tensor(s) (Q4_K)")
    src = write_gguf_raw(tmp_path / "q8k1.gguf", [("w", "Q8_K", (512,), q8k)])
    assert api_inspect(src)["summary"]["hint"] is None
    assert api_inspect(fixtures_dir / "tiny-llama.gguf")["summary"]["hint"] is None


# ---------------------------------------------------------------------------
# text: UTF-8 as text, other bytes visible, nothing unsafe written raw


@pytest.fixture
def text_gguf(tmp_path: Path) -> Path:
    kv = [
        ("general.architecture", G.GGUFValue(G.ValueType.STRING, b"llama")),
        ("test.bytes", G.GGUFValue(G.ValueType.STRING, b"a\xffb\x1b[31mred\xe2\x80\xaeevil")),
        ("tokenizer.ggml.tokens", G.GGUFValue.of(G.ValueType.ARRAY, ["\u2581w0", b"\xfe", "x\ny", "\u00e9t\u00e9"],
                                                 G.ValueType.STRING)),
    ]
    return write_gguf_stream(tmp_path / "text.gguf", [TensorDef("w", "F32", (32,))], kv=kv)


def test_utf8_is_text_and_other_bytes_are_escaped(text_gguf: Path) -> None:
    meta = {m["key"]: m for m in api_inspect(text_gguf)["metadata"]}
    assert meta["tokenizer.ggml.tokens"]["value"] == ["\u2581w0", "\\xfe", "x\ny", "\u00e9t\u00e9"]
    assert meta["tokenizer.ggml.tokens"]["utf8"] is False and "utf8" not in meta["general.architecture"]
    assert meta["test.bytes"]["value"] == "a\\xffb\x1b[31mred\u202eevil" and meta["test.bytes"]["utf8"] is False
    for argv in (["inspect", text_gguf], ["inspect", text_gguf, "--json"], ["inspect", text_gguf, "--markdown"]):
        r = child(argv)
        assert r.returncode == 0 and r.stderr == b""
        out = r.stdout.decode("utf-8")
        assert "\u2581w0" in out and "\u00e9t\u00e9" in out and "\\u2581" not in out
        assert "\x1b" not in out and "\u202e" not in out and "\\u001b" in out and "\\u202e" in out
        assert "\\xff" in out or "\\\\xff" in out
    out = child(["inspect", text_gguf]).stdout.decode()
    assert 'tokenizer.ggml.tokens [ARRAY[STRING]] = ["\u2581w0", "\\\\xfe", "x\\ny", "\u00e9t\u00e9"] (4 items)' in out


def test_a_terminal_that_cannot_show_utf8_gets_escapes(text_gguf: Path) -> None:
    r = child(["inspect", text_gguf], PYTHONIOENCODING="ascii")
    assert r.returncode == 0 and r.stderr == b"" and b"\\u2581w0" in r.stdout
    r = child(["inspect", text_gguf, "--json"], PYTHONIOENCODING="ascii")
    assert r.returncode == 0 and r.stderr == b"" and json.loads(r.stdout)["metadata"] == api_inspect(text_gguf)["metadata"]


# ---------------------------------------------------------------------------
# arrays: first items plus a count, whole with --full, N with --max-items


def _arrays(info: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    return {m["key"]: m for m in info["metadata"] if "count" in m}


def test_arrays_are_their_first_items_and_a_separate_count(fixtures_dir: Path) -> None:
    reader = gguf.GGUFReader(fixtures_dir / KQUANT)
    arrays = _arrays(api_inspect(fixtures_dir / KQUANT))
    assert set(arrays) == {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}
    for key, m in arrays.items():
        whole = reader.fields[key].contents()
        assert m["count"] == len(whole) == 300 and m["value"] == whole[:MAX_ITEMS]
    assert all(isinstance(x, int) for x in arrays["tokenizer.ggml.token_type"]["value"])
    assert all(isinstance(x, float) for x in arrays["tokenizer.ggml.scores"]["value"])


@pytest.mark.parametrize("n", [0, 1, 299, 300, 301, None])
def test_max_items_at_its_bounds(fixtures_dir: Path, capsys, n: int | None) -> None:  # type: ignore[no-untyped-def]
    reader = gguf.GGUFReader(fixtures_dir / KQUANT)
    whole = reader.fields["tokenizer.ggml.tokens"].contents()
    info = api_inspect(fixtures_dir / KQUANT, max_items=n)
    tokens = _arrays(info)["tokenizer.ggml.tokens"]
    assert tokens["count"] == 300 and tokens["value"] == whole[: 300 if n is None else n]
    argv = ["inspect", fixtures_dir / KQUANT, "--json", *(["--full"] if n is None else ["--max-items", str(n)])]
    status, out, _ = run(argv, capsys)
    assert status == 0 and json.loads(out)["metadata"] == info["metadata"]
    status, out, _ = run(argv[:2] + argv[3:], capsys)
    line = next(x for x in out.splitlines() if x.startswith("  tokenizer.ggml.tokens "))
    if n is None or n >= 300:
        assert line.endswith("] (300 items)") and "…" not in line
    else:
        assert line.endswith(f", …] ({n} of 300 items; --full or --max-items N shows more)" if n else
                             "[…] (0 of 300 items; --full or --max-items N shows more)")


@pytest.mark.parametrize("bad", ["-1", "x", "1.5"])
def test_max_items_must_be_a_count(fixtures_dir: Path, capsys, bad: str) -> None:  # type: ignore[no-untyped-def]
    status, out, err = run(["inspect", fixtures_dir / KQUANT, f"--max-items={bad}"], capsys)
    assert (status, out) == (2, "") and len(err.splitlines()) == 1 and "--max-items" in err
    status, out, err = run(["inspect", fixtures_dir / KQUANT, "--full", "--max-items", "3"], capsys)
    assert (status, out) == (2, "") and "not allowed with" in err
    for wrong in (-1, True, 2.0):
        with pytest.raises(UsageError):
            api_inspect(fixtures_dir / KQUANT, max_items=wrong)  # type: ignore[arg-type]


def test_the_api_default_is_the_shown_default() -> None:
    assert api_inspect.__kwdefaults__["max_items"] == MAX_ITEMS == 16


def test_nested_and_empty_arrays_keep_counts_apart(tmp_path: Path) -> None:
    inner = G.GGUFValue.of(G.ValueType.ARRAY, list(range(20)), G.ValueType.INT32)
    kv = [("general.architecture", G.GGUFValue(G.ValueType.STRING, b"llama")),
          ("test.nested", G.GGUFValue.of(G.ValueType.ARRAY, [inner] * 3, G.ValueType.ARRAY)),
          ("test.empty", G.GGUFValue.of(G.ValueType.ARRAY, [], G.ValueType.INT32))]
    src = write_gguf_stream(tmp_path / "n.gguf", [TensorDef("w", "F32", (32,))], kv=kv)
    arrays = _arrays(api_inspect(src, max_items=2))
    assert arrays["test.nested"]["count"] == 3
    assert arrays["test.nested"]["value"] == [{"type": "ARRAY[INT32]", "value": [0, 1], "count": 20}] * 2
    assert arrays["test.empty"] == {"key": "test.empty", "type": "ARRAY[INT32]", "value": [], "count": 0}
    whole = _arrays(api_inspect(src, max_items=None))["test.nested"]["value"]
    assert whole == [{"type": "ARRAY[INT32]", "value": list(range(20)), "count": 20}] * 3


def test_hurray_arrays_have_the_same_model(fixtures_dir: Path, tmp_path: Path) -> None:
    hrry = tmp_path / "t.hrry"
    assert main(["convert", str(fixtures_dir / KQUANT), str(hrry), "-q", "--fallback", "exact"]) == 0
    whole = gguf.GGUFReader(fixtures_dir / KQUANT).fields["tokenizer.ggml.token_type"].contents()
    for n in (0, 16, None):
        m = _arrays(api_inspect(hrry, max_items=n))["tokenizer.ggml.token_type"]
        assert m["count"] == 300 and m["value"] == whole[: 300 if n is None else n]


# ---------------------------------------------------------------------------
# strict JSON: non-finite floats as strings


def _strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("fmt", ["gguf", "hurray"])
def test_json_is_strict_with_non_finite_floats_as_strings(fixtures_dir: Path, tmp_path: Path, capsys, fmt: str) -> None:  # type: ignore[no-untyped-def]
    src = fixtures_dir / "kv-types.gguf"
    if fmt == "hurray":
        src = tmp_path / "kv.hrry"
        assert main(["convert", str(fixtures_dir / "kv-types.gguf"), str(src), "-q"]) == 0
    status, out, _ = run(["inspect", src, "--json"], capsys)
    assert status == 0
    kv = {m["key"]: m for m in _strict(out)["metadata"]}  # jq's rules: no Infinity, no NaN
    assert kv["t.f32_inf"]["value"] == "inf" and kv["t.f64_nan"]["value"] == "nan"
    assert kv["t.f32_inf"]["type"].upper() in ("FLOAT32", "FLOAT64")  # the type still says: a float
    floats = kv["t.array_float32"]["value"]
    assert floats[-1] == "inf" and all(isinstance(x, float) for x in floats[:-1])  # finite ones stay numbers
    assert str(floats[-2]) == "-0.0"
    assert json.dumps(api_inspect(src), allow_nan=False)  # the API gives the same strict data


def test_json_safe_replaces_only_non_finite_floats() -> None:
    inf, nan = float("inf"), float("nan")
    data = {"a": [1.5, -inf, [nan, inf, "inf"]], "b": (0.0, -0.0), "c": 7, "d": ["x", 2], "e": None, "f": True}
    got = _inspect.json_safe(data)
    assert got == {"a": [1.5, "-inf", ["nan", "inf", "inf"]], "b": (0.0, -0.0), "c": 7, "d": ["x", 2], "e": None, "f": True}
    assert json.dumps(got, allow_nan=False)
    assert float(got["a"][1]) == -inf and float(got["a"][2][1]) == inf  # float() reads the strings back


def test_text_shows_non_finite_floats_bare(fixtures_dir: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    status, out, _ = run(["inspect", fixtures_dir / "kv-types.gguf"], capsys)
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  t.")}
    assert status == 0 and lines["t.f32_inf"].endswith("= inf") and lines["t.f64_nan"].endswith("= nan")
    assert lines["t.array_float32"].endswith(", -0.0, inf] (7 items)")


# ---------------------------------------------------------------------------
# Markdown


def test_markdown_tables(fixtures_dir: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    status, out, _ = run(["inspect", fixtures_dir / KQUANT, "--markdown"], capsys)
    lines = out.splitlines()
    assert status == 0 and lines[0] == f"# {fixtures_dir / KQUANT} - gguf"
    meta = lines[lines.index("## Metadata (25 keys)") + 2 :]
    assert meta[0] == "| # | key | type | count | value |" and meta[1].startswith("| ---: | :--- |")
    assert "| 16 | tokenizer.ggml.tokens | ARRAY[STRING] | 300 | [\"&lt;unk&gt;\", \"&lt;s&gt;\"," in out
    tensors = lines[lines.index("## Tensors (27)") + 2 :]
    rows = [x for x in tensors[2:] if x.startswith("| ")]
    assert len(rows) >= 27 and rows[0].startswith("| token_embd.weight | [300, 64] | [64, 300] | 19200 | Q8_0 |")
    assert all(r.count(" | ") == tensors[0].count(" | ") for r in rows[:27])  # pipes inside cells are escaped
    assert lines[-1].startswith("summary: 27 tensors")
    status, out, err = run(["inspect", fixtures_dir / KQUANT, "--markdown", "--json"], capsys)
    assert (status, out) == (2, "") and "not allowed with" in err


# ---------------------------------------------------------------------------
# text that is not encodable (issue 20, hostile-input campaign)


def _safetensors(path: Path, header: str) -> Path:
    h = header.encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * 8)
    return path


@pytest.mark.parametrize("where", ["metadata key", "metadata value", "tensor name"])
def test_lone_surrogates_in_safetensors_are_one_located_line(tmp_path: Path, where: str) -> None:
    """JSON escapes that make a lone surrogate are not Unicode text: the reader refuses them as the
    safetensors package does (was: half a table, then an internal UnicodeEncodeError). One line
    naming the file and the header offset, exit 2, nothing on stdout, in every output form."""
    entry = '"dtype": "F32", "shape": [2], "data_offsets": [0, 8]'
    header = {
        "metadata key": '{"__metadata__": {"\\ud800": "x", "k": "\\u2581"}, "a": {%s}}' % entry,
        "metadata value": '{"__metadata__": {"k": "v\\udfff"}, "a": {%s}}' % entry,
        "tensor name": '{"\\ud800b": {%s}}' % entry,
    }[where]
    src = _safetensors(tmp_path / "s.safetensors", header)
    for fmt in ([], ["--json"], ["--markdown"]):
        r = child(["inspect", src, *fmt])
        assert (r.returncode, r.stdout) == (2, b""), r
        lines = r.stderr.decode("utf-8").splitlines()
        assert len(lines) == 1 and str(src) in lines[0] and "offset" in lines[0] and "surrogate" in lines[0], lines
    with pytest.raises(FormatError):
        api_inspect(src)


def test_gguf_names_that_are_not_utf8_are_shown_as_bytes(tmp_path: Path) -> None:
    src = write_gguf_stream(tmp_path / "n.gguf", [TensorDef("w\udcff", "F32", (32,))],
                            kv=[("general.architecture", G.GGUFValue(G.ValueType.STRING, b"llama"))])
    assert [r["name"] for r in api_inspect(src)["tensors"]] == ["w\\xff"]
    r = child(["inspect", src])
    assert r.returncode == 0 and b"w\\xff  [32]" in r.stdout


def test_nothing_is_written_before_the_whole_text_is_made(fixtures_dir: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The text is made first, then written: a failure while making it leaves stdout empty."""
    real = _inspect.summary_text

    def failing(info):  # type: ignore[no-untyped-def]
        real(info)
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    monkeypatch.setattr(_inspect, "summary_text", failing)
    status, out, err = run(["inspect", fixtures_dir / KQUANT], capsys)
    assert (status, out) == (2, "") and err.startswith("hurray-interop: internal error: UnicodeEncodeError")


_ESCAPES = ["\\ud800", "\\udfff", "\\udbff\\udc00", "\\u0000", "\\u001b[2J", "\\u007f", "\\u009b", "\\u202e", "\\u2066",
            "\\u2028", "\\u2581", "\\u00e9", "\\n", "\\t", "\\\\", "\\\"", "|", "<s>", "`", "*"]


@pytest.mark.parametrize("seed", range(4))
def test_seeded_header_escapes_never_break_the_output(tmp_path: Path, capsys, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Safetensors headers whose metadata keys, values and tensor names are random runs of
    JSON escapes (surrogates, controls, bidirectional marks, Markdown and HTML characters):
    every format of ``inspect`` exits 0 with its whole output, or 2 with one line and no
    output; nothing unsafe reaches the output raw."""
    import random
    import re

    rng = random.Random(seed)
    unsafe = re.compile(_inspect._UNSAFE)
    for i in range(25):
        text = ["".join(rng.choice(_ESCAPES + ["a", "b"]) for _ in range(rng.randint(1, 6))) for _ in range(3)]
        entry = '"dtype": "F32", "shape": [2], "data_offsets": [0, 8]'
        src = _safetensors(tmp_path / f"{i}.safetensors",
                           '{"__metadata__": {"%s": "%s"}, "%s": {%s}}' % (text[0], text[1], text[2], entry))
        for fmt in ([], ["--json"], ["--markdown"]):
            status, out, err = run(["inspect", src, *fmt], capsys)
            assert status in (0, 2), err
            if status == 2:
                assert out == "" and len(err.splitlines()) == 1 and "internal error" not in err
                continue
            assert err == "" and not unsafe.search(out.replace("\n", "")), out
            if fmt == ["--json"]:
                assert json.loads(out)["metadata"][0]["key"] == api_inspect(src)["metadata"][0]["key"]
            else:
                assert out.splitlines()[-1].startswith("summary: 1 tensor,")
