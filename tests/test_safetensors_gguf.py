"""GGUF ⇄ safetensors (issue 20): the report names the real source and its GGML types,
and hostile safetensors names are located in the input."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from fuzzing import run_cli

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "fixtures" / "tiny-llama.gguf"


def _safetensors(path: Path, header: str, data: bytes) -> Path:
    h = header.encode("ascii")
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


# -- messages: the source is the GGUF, with its own types -----------------------------------


def test_gguf_to_safetensors_report_names_the_gguf_and_its_types(tmp_path: Path) -> None:
    from hurray_interop.formats import gguf as G

    rc, out, err = run_cli(["convert", str(TINY), str(tmp_path / "t.safetensors"), "--fallback", "bfloat16", "--json"])
    assert rc == 0, err
    rep = json.loads(out)
    assert rep["source"] == str(TINY) and rep["source_format"] == "gguf"
    with G.read_gguf(str(TINY)) as gf:
        types = {t.name: t.type_name for t in gf.tensors}
        sizes = {t.name: t.nbytes for t in gf.tensors}
    assert {t["name"]: t["source_type"] for t in rep["tensors"]} == types  # Q8_0, not "per-block int8"
    assert {t["name"]: t["bytes_in"] for t in rep["tensors"]} == sizes
    assert rep["bytes_in"] == sum(sizes.values())


def test_a_refused_gguf_to_safetensors_names_the_gguf_and_its_types(tmp_path: Path) -> None:
    rc, out, err = run_cli(["convert", str(TINY), str(tmp_path / "t.safetensors")])
    assert rc == 1 and not (tmp_path / "t.safetensors").exists()
    assert f"{TINY} (gguf) -> " in out and "(hurray)" not in out
    assert "tensor 'token_embd.weight' (Q8_0)" in err and "per-block" not in err


def _convert(*argv: object) -> dict:
    rc, out, err = run_cli(["convert", *map(str, argv), "--fallback", "bfloat16", "--json"])
    assert rc == 0, err
    return json.loads(out)


@pytest.mark.parametrize("fixture", ["tiny-llama-kquant.gguf", "tiny-llama.gguf"])
def test_gguf_to_safetensors_writes_the_bytes_of_the_two_steps(tmp_path: Path, fixture: str) -> None:
    """GGUF → safetensors (whose intermediate .hrry keeps the K-quants in their exact
    expanded forms, dequantized once by the export) writes, and reports, what the two
    steps a user can run write: the GGUF imported with the float fallback, then exported."""
    src = REPO / "fixtures" / fixture
    direct = _convert(src, tmp_path / "direct.safetensors")
    first = _convert(src, tmp_path / "mid.hrry")
    _convert(tmp_path / "mid.hrry", tmp_path / "steps.safetensors")
    assert (tmp_path / "direct.safetensors").read_bytes() == (tmp_path / "steps.safetensors").read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no intermediate left
    imported = {t["name"]: t for t in first["tensors"]}
    for t in direct["tensors"]:
        assert t["source_type"] == imported[t["name"]]["source_type"]
        assert t["bytes_in"] == imported[t["name"]]["bytes_in"]
        if imported[t["name"]]["status"] == "lossy":  # the K-quants: the import's float fallback
            assert t["status"] == "lossy" and t["max_abs_error"] == imported[t["name"]]["max_abs_error"]


def test_gguf_to_safetensors_of_what_the_exact_forms_refuse_takes_the_float_fallback(tmp_path: Path) -> None:
    """A non-finite super-block scale has no exact expanded form; the float fallback stores
    the reference decoder's values (inf/NaN) as the two steps do."""
    import numpy as np
    from gguf_factory import write_gguf_raw
    from test_gguf_expanded import random_blocks

    blocks = random_blocks("Q4_K", 16, seed=1)
    blocks[5, 2:4] = np.array([np.inf], dtype=np.float16).view(np.uint8)  # dmin = inf
    src = write_gguf_raw(tmp_path / "inf.gguf", [("w.inf", "Q4_K", (8, 512), blocks)])
    out = tmp_path / "o" / "direct.safetensors"
    out.parent.mkdir()
    direct = _convert(src, out)
    _convert(src, tmp_path / "mid.hrry")
    _convert(tmp_path / "mid.hrry", tmp_path / "steps.safetensors")
    assert out.read_bytes() == (tmp_path / "steps.safetensors").read_bytes()
    assert direct["tensors"][0]["status"] == "lossy" and direct["tensors"][0]["source_type"] == "Q4_K"


# -- hostile names: a lone surrogate escape is the input's fault --------------------------------


@pytest.mark.parametrize("verb", [["convert", "{src}", "{dst}.hrry"], ["convert", "{src}", "{dst}.gguf"],
                                  ["inspect", "{src}"]])
@pytest.mark.parametrize("where", ["tensor", "metadata key", "metadata value"])
def test_a_lone_surrogate_is_located_in_the_input(tmp_path: Path, verb: list[str], where: str) -> None:
    t = '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
    header = {
        "tensor": '{"\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
        "metadata key": '{"__metadata__":{"\\ud800":"x"},' + t + "}",
        "metadata value": '{"__metadata__":{"k":"\\udfff"},' + t + "}",
    }[where]
    src = _safetensors(tmp_path / "s.safetensors", header, bytes(8))
    rc, out, err = run_cli([a.format(src=src, dst=tmp_path / "out") for a in verb])
    assert rc == 2, (out, err)
    assert err.count("\n") == 1 and "Traceback" not in err and "internal error" not in err
    assert err.startswith(f"hurray-interop: error: {src}: ") and "at offset 9" in err and "surrogate" in err
    assert ("tensor '\\ud800'" in err) == (where == "tensor")
    assert [p.name for p in tmp_path.iterdir()] == ["s.safetensors"]


def test_a_surrogate_pair_is_ordinary_text(tmp_path: Path) -> None:
    """The escape of a character outside the BMP (a valid pair) is a name like any other."""
    src = _safetensors(tmp_path / "s.safetensors", '{"\\ud83d\\ude00":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
                       bytes(8))
    rc, out, err = run_cli(["convert", str(src), str(tmp_path / "s.hrry"), "--quiet"])
    assert rc == 0, err
    from hurray_interop.core.hrry import HrryFile

    with HrryFile(str(tmp_path / "s.hrry")) as hf:
        assert list(hf.top_level_names()) == ["\U0001f600"]


# -- GGUF metadata in __metadata__ (docs/format-notes.md § 3.11) ----------------------------------


def _kv(path: Path) -> list[tuple[str, str, bytes]]:
    """(key, GGUF type, exact GGUF encoding) of every metadata key, in order."""
    from hurray_interop.conversions.gguf_metadata import _type_string
    from hurray_interop.formats import gguf as G

    with G.read_gguf(str(path)) as gf:
        return [(k, _type_string(v), G.encode_value(v)) for k, v in gf.kv.items()]


def test_gguf_metadata_reaches_safetensors_metadata_with_its_types(tmp_path: Path) -> None:
    from safetensors import safe_open

    from hurray_interop.formats import gguf as G

    out = tmp_path / "t.safetensors"
    _convert(TINY, out)
    with safe_open(str(out), "np") as f:  # the safetensors package as the reader
        md = f.metadata()
    with G.read_gguf(str(TINY)) as gf:
        want = {f"gguf.{k}": v for k, v in gf.kv.items()}
    assert md is not None and set(md) == set(want) | {"format"} and md["format"] == "pt"
    for name, v in want.items():
        rec = json.loads(md[name])
        assert rec["type"] == _kv(TINY)[list(want).index(name)][1]
        assert rec["value"] == v.to_python()  # tokens, scores and token types included, whole
    assert len(json.loads(md["gguf.tokenizer.ggml.tokens"])["value"]) == 300


@pytest.mark.parametrize("fixture", ["tiny-llama.gguf", "kv-types.gguf"])
def test_gguf_metadata_comes_home_with_its_types(tmp_path: Path, fixture: str) -> None:
    """GGUF → safetensors → GGUF, directly and through .hrry files: every key, in order, of
    its exact type and value (kv-types.gguf: every GGUF type, non-UTF-8 strings, NaN and
    infinite floats, nested and empty arrays, alignment 64)."""
    src = REPO / "fixtures" / fixture
    st = tmp_path / "m.safetensors"
    _convert(src, st)
    rc, _, err = run_cli(["convert", str(st), str(tmp_path / "direct.gguf"), "-q"])
    assert rc == 0, err
    for a, b in [(st, "m.hrry"), ("m.hrry", "back.gguf")]:
        rc, _, err = run_cli(["convert", str(tmp_path / a), str(tmp_path / b), "-q"])
        assert rc == 0, err
    assert _kv(tmp_path / "direct.gguf") == _kv(src)
    assert _kv(tmp_path / "back.gguf") == _kv(src)
    rc, _, err = run_cli(["convert", str(tmp_path / "m.hrry"), str(tmp_path / "again.safetensors"), "-q"])
    assert rc == 0, err
    assert (tmp_path / "again.safetensors").read_bytes() == st.read_bytes()  # safetensors ⇄ .hrry stays byte-exact


def test_a_large_vocabulary_travels_whole(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    import synth

    src = tmp_path / "vocab.gguf"
    synth.write_big_vocab(src, vocab=65536)
    _convert(src, tmp_path / "v.safetensors")
    rc, _, err = run_cli(["convert", str(tmp_path / "v.safetensors"), str(tmp_path / "v.gguf"), "-q"])
    assert rc == 0, err
    assert _kv(tmp_path / "v.gguf") == _kv(src)


def _st_with_metadata(tmp_path: Path, metadata: dict[str, str]) -> Path:
    header = json.dumps({"__metadata__": metadata, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})
    return _safetensors(tmp_path / "s.safetensors", header, bytes(8))


def _gguf_keys(tmp_path: Path, metadata: dict[str, str]) -> tuple[dict, list[str]]:
    from hurray_interop.formats import gguf as G

    src = _st_with_metadata(tmp_path, metadata)
    rc, out, err = run_cli(["convert", str(src), str(tmp_path / "s.gguf"), "--json"])
    assert rc == 0, err
    with G.read_gguf(str(tmp_path / "s.gguf")) as gf:
        return {k: v.to_python() for k, v in gf.kv.items()}, json.loads(out)["notes"]


@pytest.mark.parametrize(("rec", "ok"), [
    ({"type": "UINT8", "value": 255}, True),  # the limit
    ({"type": "UINT8", "value": 256}, False),  # limit + 1
    ({"type": "UINT8", "value": -1}, False),
    ({"type": "INT64", "value": -(2**63)}, True),
    ({"type": "INT64", "value": -(2**63) - 1}, False),
    ({"type": "UINT32", "value": 1.0}, False),
    ({"type": "UINT32", "value": True}, False),
    ({"type": "FLOAT32", "value": 0.10000000149011612}, True),
    ({"type": "FLOAT32", "value": 0.1}, False),  # not a float32: never rounded silently
    ({"type": "FLOAT64", "value": 0.1}, True),
    ({"type": "BOOL", "value": 1}, False),
    ({"type": "STRING", "value": 7}, False),
    ({"type": "ARRAY[INT32]", "value": [1, 2]}, True),
    ({"type": "ARRAY[INT32]", "value": [1, "2"]}, False),
    ({"type": "ARRAY[ARRAY]", "value": [[1]]}, False),
    ({"type": "ARRAY[INT32]", "value": [1, True]}, False),
    ({"type": "ARRAY[INT32]", "value": [2**31 - 1]}, True),
    ({"type": "ARRAY[INT32]", "value": [2**31]}, False),
    ({"type": "ARRAY[FLOAT32]", "value": [0.5, 1, -0.0]}, True),
    ({"type": "ARRAY[FLOAT32]", "value": [0.5, 0.1]}, False),
    ({"type": "ARRAY[FLOAT64]", "value": [0.1, 1e300]}, True),
    ({"type": "ARRAY[STRING]", "value": ["a", "\ud800"]}, False),
    ({"type": "ARRAY[STRING]", "value": ["a", 1]}, False),
    ({"type": "ARRAY[STRING]", "value": ["a", "ü"]}, True),
    ({"type": "QUAD", "value": 1}, False),
    ({"type": "STRING", "gguf": "AQAAAAAAAAB4"}, True),  # "x"
    ({"type": "STRING", "gguf": "AQAAAAAAAAB4eA=="}, False),  # a stray byte after the value
    ({"type": "ARRAY[INT32]", "gguf": "CAAAAAEAAAAAAAAAAQAAAAAAAAB4"}, False),  # an ARRAY[STRING] inside
    ({"type": "STRING", "gguf": "not base64!"}, False),
    ({"type": "STRING", "value": "x", "extra": 1}, False),
])
def test_gguf_entries_are_read_exactly_or_reported(tmp_path: Path, rec: dict, ok: bool) -> None:
    kv, notes = _gguf_keys(tmp_path, {"gguf.k": json.dumps(rec), "format": "pt"})
    assert ("k" in kv) == ok, notes
    assert "format" not in kv
    if not ok:
        assert any(n.startswith("__metadata__ entry gguf.k: ") and "not as GGUF metadata" in n for n in notes)


def test_reserved_and_empty_gguf_keys_are_reported_not_written(tmp_path: Path) -> None:
    rec = json.dumps({"type": "UINT32", "value": 1})
    kv, notes = _gguf_keys(tmp_path, {"gguf.": rec, "gguf.hurray_interop.source_format": rec, "gguf.ok": rec})
    assert kv == {"ok": 1}
    assert sum("not as GGUF metadata" in n for n in notes) == 2


@pytest.mark.parametrize("fallback", [[], ["--fallback", "bfloat16"]])
def test_a_dry_run_shows_the_plan_of_the_conversion(tmp_path: Path, fallback: list[str]) -> None:
    """GGUF → safetensors --dry-run plans both steps (the export refuses what safetensors
    cannot hold; with a fallback: the errors): the same verdicts and exit status as the
    conversion, and nothing written."""
    dst = tmp_path / "d.safetensors"
    rc_dry, out, err = run_cli(["convert", str(TINY), str(dst), "--dry-run", "--json", *fallback])
    assert not list(tmp_path.iterdir())
    rc, real, _ = run_cli(["convert", str(TINY), str(dst), "--json", *fallback])
    assert rc_dry == rc == (1 if not fallback else 0)
    plan = [(t["name"], t["source_type"], t["status"], t["max_abs_error"]) for t in json.loads(out)["tensors"]]
    if fallback:
        assert plan == [(t["name"], t["source_type"], t["status"], t["max_abs_error"]) for t in json.loads(real)["tensors"]]
    else:
        assert sum(p[2] == "refused" for p in plan) == 12 and ("token_embd.weight", "Q8_0", "refused", None) in plan


def test_metadata_without_a_gguf_key_is_named_when_gguf_has_no_place_for_it(tmp_path: Path) -> None:
    """An entry without a GGUF key is named by a GGUF export; ``format`` (the framework tag
    every safetensors writer adds) is left out silently."""
    src = _st_with_metadata(tmp_path, {"format": "pt", "author": "me", "gguf.k": json.dumps({"type": "UINT8", "value": 1})})
    for dst in (tmp_path / "direct.gguf", tmp_path / "mid.hrry", tmp_path / "back.gguf"):
        rc, out, err = run_cli(["convert", str(tmp_path / "mid.hrry" if dst.name == "back.gguf" else src), str(dst), "--json"])
        assert rc == 0, err
        notes = json.loads(out)["notes"]
        said = [n for n in notes if "without a GGUF key not written" in n]
        assert said == ([] if dst.suffix == ".hrry" else ["1 safetensors __metadata__ entry without a GGUF key not "
                                                            "written: author"]), notes  # the .hrry keeps them


def test_gguf_key_length_is_held_to_the_hurray_limit(tmp_path: Path) -> None:
    """A .hrry key holds at most 65535 UTF-8 bytes (as for a GGUF import): limit − 1 and the
    limit become GGUF keys, limit + 1 is named in the report."""
    rec = json.dumps({"type": "UINT8", "value": 1})
    keys = {n: "k" * n for n in (65534, 65535, 65536)}
    kv, notes = _gguf_keys(tmp_path, {f"gguf.{k}": rec for k in keys.values()})
    assert set(kv) == {keys[65534], keys[65535]}
    assert sum("not a valid key" in n for n in notes) == 1


def _bad_entries(notes: list[str]) -> list[str]:
    """The ``__metadata__`` entries the report says are kept as safetensors metadata only."""
    tail = "; kept as safetensors metadata only, not as GGUF metadata"
    return [n[len("__metadata__ entry "):].split(": ", 1)[0] for n in notes if n.endswith(tail)]


def _through_hrry(tmp_path: Path, metadata: dict[str, str]) -> tuple[dict, list[str]]:
    """safetensors → .hrry → GGUF (both exit 0): the GGUF's keys and the import's notes."""
    from hurray_interop.formats import gguf as G

    src = _st_with_metadata(tmp_path, metadata)
    rc, out, err = run_cli(["convert", str(src), str(tmp_path / "s.hrry"), "--json", "--force"])
    assert rc == 0, err
    notes = json.loads(out)["notes"]
    rc, _, err = run_cli(["convert", str(tmp_path / "s.hrry"), str(tmp_path / "h.gguf"), "-q", "--force"])
    assert rc == 0, err
    with G.read_gguf(str(tmp_path / "h.gguf")) as gf:  # the tool's own reader takes what it wrote
        return {k: v.to_python() for k, v in gf.kv.items()}, notes


_ONE = json.dumps({"type": "UINT32", "value": 1})


@pytest.mark.parametrize("bad", ["hurray_interop.a: b", "a\x00: b", "a\x00", "x: " + "k" * 65533])
def test_a_bad_gguf_key_with_a_colon_is_kept_out_of_the_gguf_metadata(tmp_path: Path, bad: str) -> None:
    """Keys holding ": " (reserved, with a NUL, over-long) are named and kept out like any
    other invalid key, on the way to a .hrry and to GGUF directly."""
    md = {f"gguf.{bad}": _ONE, "gguf.ok": _ONE, "gguf.ok: too": _ONE}
    kv, notes = _through_hrry(tmp_path, md)
    assert kv == {"ok": 1, "ok: too": 1}
    assert _bad_entries(notes) == [f"gguf.{bad}".split(": ", 1)[0]]
    assert sum("not a valid key" in n for n in notes) == 1
    kv, _ = _gguf_keys(tmp_path, md)
    assert kv == {"ok": 1, "ok: too": 1}


@pytest.mark.parametrize("n", [65534, 65535, 65536])
def test_gguf_key_length_with_a_colon_at_the_limit(tmp_path: Path, n: int) -> None:
    """The key length limit (65535 UTF-8 bytes) for a key holding ": ", at −1, the limit, +1."""
    key = ("x: " + "k" * n)[:n]
    kv, notes = _through_hrry(tmp_path, {f"gguf.{key}": _ONE, "gguf.ok": _ONE})
    assert kv == ({"ok": 1, key: 1} if n <= 65535 else {"ok": 1}), notes
    assert len(_bad_entries(notes)) == (n > 65535)


def test_gguf_split_keys_are_not_taken_as_gguf_metadata(tmp_path: Path) -> None:
    """split.* keys belong to the GGUF container (the GGUF import strips them): named, not
    written, and the GGUF export is a file the reader takes."""
    u16 = lambda v: json.dumps({"type": "UINT16", "value": v})  # noqa: E731
    md = {"gguf.split.count": u16(3), "gguf.split.no": u16(0), "gguf.split.tensors.count": json.dumps({"type": "INT32", "value": 1}),
          "gguf.split.other": _ONE, "gguf.ok": _ONE}
    kv, notes = _through_hrry(tmp_path, md)
    assert kv == {"split.other": 1, "ok": 1}
    assert _bad_entries(notes) == ["gguf.split.count", "gguf.split.no", "gguf.split.tensors.count"]
    assert all("split key" in n for n in notes if "kept as safetensors metadata only" in n)


@pytest.mark.parametrize(("rec", "ok"), [
    ({"type": "UINT32", "value": 64}, True),
    ({"type": "UINT32", "value": 1}, True),
    ({"type": "UINT32", "value": 2**30}, True),  # the limit
    ({"type": "UINT32", "value": 2**30 - 1}, False),
    ({"type": "UINT32", "value": 2**31}, False),  # limit + 1 (power of two)
    ({"type": "UINT32", "value": 0}, False),
    ({"type": "UINT32", "value": 48}, False),
    ({"type": "UINT8", "value": 64}, False),
    ({"type": "UINT64", "value": 64}, False),
    ({"type": "STRING", "value": "64"}, False),
])
def test_gguf_alignment_is_checked_at_import(tmp_path: Path, rec: dict, ok: bool) -> None:
    """general.alignment is the GGUF container's: a UINT32 power of two (as the GGUF reader
    requires, up to the 2^30 a GGUF export writes) becomes the key, else it is named at import."""
    from hurray_interop.formats import gguf as G

    md = {"gguf.general.alignment": json.dumps(rec), "gguf.ok": _ONE}
    if not ok:
        kv, notes = _through_hrry(tmp_path, md)
        assert kv == {"ok": 1} and _bad_entries(notes) == ["gguf.general.alignment"], notes
        return
    src = _st_with_metadata(tmp_path, md)
    for a, b in [(src, "s.hrry"), ("s.hrry", "s.gguf")]:
        rc, _, err = run_cli(["convert", str(tmp_path / a), str(tmp_path / b), "-q"])
        assert rc == 0, err
    with G.read_gguf(str(tmp_path / "s.gguf")) as gf:
        assert gf.alignment == rec["value"] and {k: v.to_python() for k, v in gf.kv.items()} == {
            "general.alignment": rec["value"], "ok": 1}


def test_gguf_to_safetensors_loads_in_torch_with_format_pt(tmp_path: Path) -> None:
    """The __metadata__ of GGUF metadata says "format": "pt" (loaders such as transformers
    refuse metadata without a known format); the way back does not name it."""
    torch_st = pytest.importorskip("safetensors.torch")
    from safetensors import safe_open

    out = tmp_path / "t.safetensors"
    _convert(TINY, out)
    with safe_open(str(out), "np") as f:
        assert f.metadata()["format"] == "pt"
        names = set(f.keys())
    assert set(torch_st.load_file(str(out))) == names and names
    rc, o, err = run_cli(["convert", str(out), str(tmp_path / "back.gguf"), "--json"])
    assert rc == 0, err
    assert not [n for n in json.loads(o)["notes"] if "without a GGUF key" in n or "format" in n.split(":")[0]]
    assert _kv(tmp_path / "back.gguf") == _kv(TINY)


def test_a_recorded_format_is_kept(tmp_path: Path) -> None:
    """A .hrry that records the source's own __metadata__ exports it as it was: no format added."""
    from safetensors import safe_open

    src = _st_with_metadata(tmp_path, {"gguf.ok": _ONE})
    for a, b in [(src, "s.hrry"), ("s.hrry", "again.safetensors")]:
        rc, _, err = run_cli(["convert", str(tmp_path / a), str(tmp_path / b), "-q"])
        assert rc == 0, err
    assert (tmp_path / "again.safetensors").read_bytes() == src.read_bytes()
    with safe_open(str(tmp_path / "again.safetensors"), "np") as f:
        assert f.metadata() == {"gguf.ok": _ONE}
