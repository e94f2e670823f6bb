"""Hostile safetensors (MX checkpoint) files: bounded cost, typed and located errors.

tests/test_safetensors_mx.py checks the reader against the ``safetensors`` package
and a set of corrupt files; this file adds:

1. claimed sizes (a header length of 2**63 or just under the 100 MB cap, a
   2**80-byte tensor, data_offsets of 2**64, a 200 000-deep JSON nesting) read
   in a child with 64 MiB of headroom: typed error naming the file, tracemalloc
   peak far below the claim, a bounded number of Python line events;
2. thousands of mutants in a bounded child: byte mutants and structure-aware
   JSON mutants (hostile shapes, offsets, dtypes, duplicated entries, lying
   header lengths, nesting) of both fixture conventions;
3. mutants converted end to end (to .hrry and through it to .gguf) by the CLI;
4. regressions for the reader defects found here (fixed in bf7ae13 and 2381cab);
5. the header as JSON *text* (issue #20's campaign): escapes (``\\uXXXX``, lone surrogates,
   NUL), names that duplicate another only after unescaping, and number literals
   ``json.dumps`` never writes (``1e400``, ``-0``, 5000 digits), parsed in a bounded child
   and run through ``inspect`` / ``convert`` with stdout and stderr encoding strict UTF-8.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import pytest

from fuzzing import (
    assert_cli_contract,
    fuzz_count,
    mutants,
    run_bounded,
    run_campaign,
    run_cli,
    safetensors_escape_mutant,
    safetensors_json_mutant,
    safetensors_regions,
)
from hurray_interop.errors import FormatError, HurrayInteropError, InconsistentError
from hurray_interop.formats.safetensors import SafetensorsFile

TESTS = os.fspath(Path(__file__).resolve().parent)
#: Python line events a tiny hostile file may cost: a few thousand for the header and first
#: table loads; a loop over a claimed count of 2**32 or more would need billions
LINES_PER_HOSTILE_FILE = 100_000


def st(header: bytes | str, data: bytes = b"", *, length: int | None = None) -> bytes:
    h = header.encode() if isinstance(header, str) else header
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def entry(dtype: str, shape: list, offs: list) -> str:
    return json.dumps({"dtype": dtype, "shape": shape, "data_offsets": offs})


CASES = [
    # (id, bytes, error class, message regex, tensor)
    ("header length 2**63", st('{"a":' + entry("U8", [1], [0, 1]) + "}", b"x", length=2**63), "FormatError",
     "header length 9223372036854775808 exceeds", None),
    ("header length 99 999 992 in a tiny file", st("{}", length=99_999_992), "TruncatedError", "runs past the end", None),
    ("2**80-byte tensor", st('{"a":' + entry("F32", [2**39, 2**39], [0, 0]) + "}"), "InconsistentError", "needs 1208925819614629174706176", "a"),
    ("2**64 data_offsets", st('{"a":' + entry("U8", [2**64], [0, 2**64]) + "}", b"x"), "TruncatedError", "run past the 1-byte data section", "a"),
    ("begin after end", st('{"a":' + entry("U8", [1], [5, 4]) + "}", b"x"), "FormatError", "0 <= begin <= end", "a"),
    ("negative dimension", st('{"a":' + entry("U8", [-1], [0, 1]) + "}", b"x"), "FormatError", "non-negative integers", "a"),
    ("200 000-deep JSON", st('{"__metadata__":' + "[" * 200_000 + "]" * 200_000 + "}"), "FormatError", "not valid JSON", None),
    ("duplicate tensor", st('{"a":' + entry("U8", [1], [0, 1]) + ',"a":' + entry("U8", [1], [1, 2]) + "}", b"xy"),
     "InconsistentError", "duplicate key 'a'", None),
    ("overlap", st('{"a":' + entry("U8", [2], [0, 2]) + ',"b":' + entry("U8", [2], [1, 3]) + "}", b"xyz"),
     "InconsistentError", "overlaps", "b"),
    ("gap", st('{"a":' + entry("U8", [1], [0, 1]) + ',"b":' + entry("U8", [1], [2, 3]) + "}", b"xyz"), "InconsistentError", "gap", "b"),
    ("invalid UTF-8 header", st(b'{"\xff":' + entry("U8", [1], [0, 1]).encode() + b"}", b"x"), "FormatError", "not UTF-8", None),
    ("unknown dtype", st('{"a":' + entry("Q4_K", [1], [0, 1]) + "}", b"x"), "UnsupportedError", "not supported", "a"),
    ("not an object", st("[1, 2]"), "FormatError", "does not start with", None),
]


def test_claimed_sizes_cost_nothing(tmp_path):
    files = []
    for k, (cid, raw, *_rest) in enumerate(CASES):
        p = tmp_path / f"hostile{k}.safetensors"
        p.write_bytes(raw)
        files.append(os.fspath(p))
    code = f"""
import json, sys
sys.path.insert(0, {TESTS!r})
from opcount import counting
from hurray_interop.formats.safetensors import SafetensorsFile
from hurray_interop.errors import HurrayInteropError
out = []
for p in {files!r}:
    with counting() as c:
        try:
            with SafetensorsFile(p): pass
            r = {{"ok": True}}
        except HurrayInteropError as e:
            r = {{"mro": [c.__name__ for c in type(e).__mro__], "msg": str(e), "path": e.path, "tensor": e.tensor}}
    r["peak"], r["lines"] = c.peak, c.lines
    out.append(r)
print(json.dumps(out))
"""
    proc = run_bounded(code, budget=64 << 20, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for (cid, raw, cls, pattern, tensor), p, r in zip(CASES, files, json.loads(proc.stdout.splitlines()[-1])):
        assert not r.get("ok"), f"{cid}: accepted"
        assert cls in r["mro"], (cid, r)
        assert re.search(pattern, r["msg"]), (cid, r["msg"])
        assert r["path"] == p and r["msg"].startswith(p + ": "), (cid, r)
        assert r["tensor"] == tensor, (cid, r)
        # the deep-nesting case holds the 400 kB header itself; nothing else is proportional to a claim
        assert r["peak"] < max(4 * len(raw), 256 << 10), (cid, r["peak"])
        assert r["lines"] < LINES_PER_HOSTILE_FILE, (cid, r["lines"])  # no loop over a claimed count


# -- fuzzing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,seed", [("ct-mxfp4-tiny.safetensors", 21), ("gpt-oss-tiny.safetensors", 22)])
def test_mutants_raise_only_project_errors(fixtures_dir, name, seed):
    n = fuzz_count(1500)
    r = run_campaign("safetensors", fixtures_dir / name, n, seed)
    assert r["escape_count"] == 0, json.dumps(r["escapes"][:10], indent=1)
    assert r["errors"] + r["accepted"] == n and r["errors"] > n // 2
    assert r["maxrss_kb"] < 400 << 10


def test_json_mutants_change_the_header_not_the_data(fixtures_dir):
    """The structure-aware mutator keeps the data section (so mutants fail for their header)."""
    import random

    raw = (fixtures_dir / "ct-mxfp4-tiny.safetensors").read_bytes()
    (hl,) = struct.unpack_from("<Q", raw)
    rng = random.Random(3)
    seen_lengths = set()
    for _ in range(200):
        m = safetensors_json_mutant(raw, rng)
        assert m != raw and m.endswith(raw[8 + hl :])
        seen_lengths.add(struct.unpack_from("<Q", m)[0])
    assert len(seen_lengths) > 5


def test_cli_on_mutants_end_to_end(fixtures_dir, tmp_path, monkeypatch):
    import random

    monkeypatch.setattr(os, "fsync", lambda fd: None)  # speed only
    raw = (fixtures_dir / "ct-mxfp4-tiny.safetensors").read_bytes()
    src = tmp_path / "in" / "m.safetensors"
    src.parent.mkdir()
    outdir = tmp_path / "out"
    outdir.mkdir()
    n = max(120, fuzz_count(120) // 20)
    rng = random.Random(5)

    def json_half(m: bytes, r: random.Random) -> bytes:
        return safetensors_json_mutant(raw, r) if r.random() < 0.5 else m

    seen = {0: 0, 1: 0, 2: 0}
    for k, m in mutants(raw, n, 505, safetensors_regions(raw), json_half):
        src.write_bytes(m)
        out = outdir / ("m.hrry" if rng.random() < 0.8 else "m.gguf")
        before = set(os.listdir(outdir))
        status, _, err = run_cli(["convert", os.fspath(src), os.fspath(out), "-q", "--fallback", "float32"])
        assert_cli_contract(status, err, output=out, before=before)
        seen[status] += 1
        if status == 0:
            out.unlink()
        assert src.read_bytes() == m
    assert seen[2] > n // 2 and seen[0] > 0, seen


# -- regressions: defects found here and fixed in safetensors_mx.py (bf7ae13) ---------------------


def test_huge_integer_literal_is_a_format_error(tmp_path):
    """A 5000-digit integer in the JSON header: Python's int-from-string limit raised a bare
    ValueError from json.loads that escaped _parse_header.  Now a FormatError naming the file."""
    p = tmp_path / "bigint.safetensors"
    p.write_bytes(st('{"a":{"dtype":"U8","shape":[' + "9" * 5000 + '],"data_offsets":[0,1]}}', b"x"))
    with pytest.raises(HurrayInteropError) as ei:
        SafetensorsFile(p)
    assert isinstance(ei.value, FormatError) and ei.value.path == os.fspath(p)
    status, _, err = run_cli(["convert", os.fspath(p), os.fspath(tmp_path / "o.hrry")])
    assert status == 2 and "internal error" not in err


def test_sub_byte_shape_error_names_the_file(tmp_path):
    """An F4 tensor with an odd element count: dtype_nbytes raised InconsistentError with
    the tensor but without ``path``.  Now the file is named."""
    p = tmp_path / "odd.safetensors"
    p.write_bytes(st('{"a":' + entry("F4", [3], [0, 2]) + "}", b"xy"))
    with pytest.raises(InconsistentError, match="not a whole number of bytes") as ei:
        SafetensorsFile(p)
    assert ei.value.path == os.fspath(p)


@pytest.mark.parametrize(
    "cid,header,data,offset",
    [
        # the offending entry's position in the file: 8 (length prefix) + its index in the header text
        ("data_offsets mismatch", '{"a":' + entry("U8", [2], [0, 1]) + "}", b"x", 8 + 1),
        ("bad shape", '{"a":' + entry("U8", [-1], [0, 1]) + "}", b"x", 8 + 1),
        ("overlap", '{"a":' + entry("U8", [2], [0, 2]) + ',"b":' + entry("U8", [2], [1, 3]) + "}", b"xyz", None),
    ],
    ids=["data_offsets-mismatch", "bad-shape", "overlap"],
)
def test_header_errors_carry_a_byte_offset(tmp_path, cid, header, data, offset):
    """Issue item 1 asks for the byte offset of every malformation; entry-level header
    errors (shape, dtype, data_offsets, overlap) had ``offset=None``.  Now: the offset of
    the offending entry (at least somewhere inside the header)."""
    p = tmp_path / "h.safetensors"
    raw = st(header, data)
    p.write_bytes(raw)
    with pytest.raises(FormatError) as ei:
        SafetensorsFile(p)
    e = ei.value
    (hl,) = struct.unpack_from("<Q", raw)
    assert e.offset is not None and 8 <= e.offset < 8 + hl, (cid, str(e))
    if offset is not None:
        assert e.offset >= offset


# -- more regressions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        '{"a":' + entry("U8", [1], [0, 1]) + ',"a":' + entry("U8", [1], [1, 2]) + "}",
        '{"a":{"dtype":"U8","shape":[1],"shape":[1],"data_offsets":[0,1]}}',
    ],
    ids=["duplicate-tensor", "duplicate-field"],
)
def test_duplicate_json_key_error_has_an_offset(tmp_path, header):
    """Found here, fixed in 2381cab: a duplicate key in the JSON header (a tensor listed twice,
    or a field twice inside an entry) was reported with ``offset=None``.  Now located inside
    the header."""
    p = tmp_path / "dup.safetensors"
    raw = st(header, b"xy")
    p.write_bytes(raw)
    with pytest.raises(InconsistentError, match="duplicate key") as ei:
        SafetensorsFile(p)
    (hl,) = struct.unpack_from("<Q", raw)
    assert ei.value.offset is not None and 8 <= ei.value.offset < 8 + hl, str(ei.value)


# -- truncation at every boundary -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ct-mxfp4-tiny.safetensors", "gpt-oss-tiny.safetensors"])
def test_truncation_at_every_boundary(fixtures_dir, tmp_path, name):
    """Cut the file at every byte of the length prefix, at the start, middle and end of every
    header entry, and at every tensor's first, middle and last data byte: a TruncatedError
    naming the file, with an offset inside the file (boundaries from a hand parse)."""
    from hurray_interop.errors import TruncatedError

    raw = (fixtures_dir / name).read_bytes()
    (hl,) = struct.unpack_from("<Q", raw)
    header = raw[8 : 8 + hl].decode()
    entries = json.loads(header)
    cuts = set(range(0, 9)) | {8 + hl - 1, 8 + hl}
    for k in entries:
        at = 8 + len(header[: header.index(json.dumps(k))].encode())
        cuts |= {at, at + 1, at + 20}
        if k != "__metadata__":
            b, e = entries[k]["data_offsets"]
            cuts |= {8 + hl + b, 8 + hl + (b + e) // 2, 8 + hl + e - 1}
    cuts = sorted(c for c in cuts if 0 <= c < len(raw))
    assert len(cuts) > 30
    p = tmp_path / name
    for cut in cuts:
        p.write_bytes(raw[:cut])
        with pytest.raises(TruncatedError) as ei:
            SafetensorsFile(p)
        e = ei.value
        assert e.path == os.fspath(p) and e.offset is not None and 0 <= e.offset <= max(cut, 8), (cut, str(e))


# -- the header as JSON text: escapes, surrogates, duplicates after unescaping, huge numbers --------


def test_escape_mutants_raise_only_project_errors(fixtures_dir):
    n = fuzz_count(400)
    r = run_campaign("safetensors-escapes", fixtures_dir / "gpt-oss-tiny.safetensors", n, 31)
    assert r["escape_count"] == 0, json.dumps(r["escapes"][:10], indent=1)
    assert r["errors"] + r["accepted"] == n and r["errors"] > n // 4 and r["accepted"] > 0, r


def test_cli_on_escape_mutants_end_to_end(fixtures_dir, tmp_path, monkeypatch):
    """``inspect``, ``inspect --json`` and ``convert`` of header-text mutants: exit 0/1/2, one
    line, no internal error (stdout/stderr are strict UTF-8, like a terminal), a refusal
    names the input file, not the output, and an accepted mutant is exact: converted back to
    safetensors, every tensor has its name, dtype, shape and bytes."""
    import random

    monkeypatch.setattr(os, "fsync", lambda fd: None)  # speed only
    src, outdir = tmp_path / "in" / "m.safetensors", tmp_path / "out"
    src.parent.mkdir()
    outdir.mkdir()
    n = max(40, fuzz_count(40) // 20)
    seen = {0: 0, 1: 0, 2: 0}
    for name in ("gpt-oss-tiny.safetensors", "mxfp8-tiny.safetensors"):
        raw = (fixtures_dir / name).read_bytes()
        rng = random.Random(606)
        for _ in range(n):
            m = safetensors_escape_mutant(raw, rng)
            src.write_bytes(m)
            for argv in (["inspect", os.fspath(src)], ["inspect", "--json", os.fspath(src)]):
                status, _, err = run_cli(argv)
                assert_cli_contract(status, err)
            out = outdir / "m.hrry"
            before = set(os.listdir(outdir))
            status, _, err = run_cli(["convert", os.fspath(src), os.fspath(out), "-q"])
            assert_cli_contract(status, err, output=out, before=before)
            assert status != 2 or os.fspath(src) in err, err
            seen[status] += 1
            if status == 0:
                back = outdir / "back.safetensors"
                status, _, err = run_cli(["convert", os.fspath(out), os.fspath(back), "-q"])
                assert status == 0, ("an accepted mutant does not convert back", err)
                assert _tensors(back) == _tensors(src), "an accepted mutant does not come back exactly"
                back.unlink()
                out.unlink()
            assert src.read_bytes() == m
    assert seen[2] > 0 and seen[0] > 0, seen


def _tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """name -> (dtype, shape, bytes) of every tensor of a safetensors file (the project's reader)."""
    from hurray_interop.formats.safetensors import SafetensorsFile

    with SafetensorsFile(path) as f:
        return {n: (f.entry(n).dtype, tuple(f.entry(n).shape), f.raw(n).tobytes()) for n in f.names}


SURROGATE_HEADERS = {
    "tensor-name": '{"\\ud800": ' + entry("U8", [2], [0, 2]) + "}",
    "name-inside": '{"w\\udc80x": ' + entry("U8", [2], [0, 2]) + "}",
    "metadata-key": '{"__metadata__": {"\\ud800": "v"}, "w": ' + entry("U8", [2], [0, 2]) + "}",
    "metadata-value": '{"__metadata__": {"k": "\\udfff"}, "w": ' + entry("U8", [2], [0, 2]) + "}",
}


@pytest.mark.parametrize("case", list(SURROGATE_HEADERS))
def test_bug_lone_surrogate_in_the_header_refusal_names_the_input(tmp_path, case):
    """Issue #20: ``convert`` of a safetensors file whose tensor name or ``__metadata__`` key/value
    is a lone surrogate (JSON ``"\\ud800"``) was refused naming the *output* file
    (``o.hrry: tensor '\\ud800': tensor name is not encodable as UTF-8``). Now exit 2, one line
    naming the input and the header offset, nothing written: the reader refuses such text, as the
    safetensors package does (``inspect`` too: tests/test_inspect.py)."""
    src, dst = tmp_path / "s.safetensors", tmp_path / "o.hrry"
    src.write_bytes(st(SURROGATE_HEADERS[case], b"ab"))
    with pytest.raises(FormatError, match="lone surrogate"):
        SafetensorsFile(src)
    status, out, err = run_cli(["convert", os.fspath(src), os.fspath(dst)])
    assert_cli_contract(status, err, output=dst, before=set(os.listdir(tmp_path)))
    assert status == 2 and err.startswith(f"hurray-interop: error: {src}: ") and "lone surrogate" in err, err
    assert out == ""


def test_bug_empty_tensor_name_refusal_names_the_input(tmp_path):
    """A tensor named ``""`` (legal JSON, legal safetensors) cannot be a Hurray index name; the
    refusal named the output file (``o.hrry: tensor names must be non-empty strings``). Now it
    names the input and the (empty) tensor, exit 2, nothing written."""
    src, dst = tmp_path / "s.safetensors", tmp_path / "o.hrry"
    src.write_bytes(st('{"": ' + entry("U8", [2], [0, 2]) + "}", b"ab"))
    status, _, err = run_cli(["convert", os.fspath(src), os.fspath(dst)])
    assert_cli_contract(status, err, output=dst, before=set(os.listdir(tmp_path)))
    assert status == 2 and err.startswith(f"hurray-interop: error: {src}: ") and "empty name" in err, err
