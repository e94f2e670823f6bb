"""Hostile GGUF files: claimed sizes cost nothing, errors are located, only project errors escape.

tests/test_gguf_format.py already checks every malformation's message and class
on in-memory images; this file adds what those tests do not:

1. claimed counts and lengths (2**63 tensors, a 4 GiB key, a 2**40-element
   shape, an offset of 2**63, a nesting bomb) read from *disk* in a child process
   whose address space may grow by 64 MiB only and which is killed after 30 s,
   with the error's file, field and byte offset checked against offsets computed
   by the hand assembler below (not by the reader);
2. a wide array-of-arrays (the bomb that respects the depth limit) parses in
   time and memory proportional to the file;
3. thousands of seeded mutants of the fixtures parsed in a bounded child
   (:mod:`fuzzing`), and a few hundred converted end to end through the CLI.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from fuzzing import assert_cli_contract, fuzz_count, run_bounded, run_campaign, run_cli
from hurray_interop.errors import UsageError
from hurray_interop.formats.gguf import read_gguf

TESTS = os.fspath(Path(__file__).resolve().parent)
#: Python line events a tiny hostile file may cost: a few hundred for the header, up to ~40 000
#: for the first file that loads the GGML type table; a loop over a claimed count of 2**32 or
#: more would need billions
LINES_PER_HOSTILE_FILE = 100_000

# -- a hand assembler, independent of hurray_interop.formats.gguf ----------------------------


def s(b: bytes | str) -> bytes:
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def info(name: str, ne: list[int], type_id: int, offset: int) -> bytes:
    return s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", type_id, offset)


def gguf(kvs: list[bytes], infos: list[bytes], data: bytes = b"", *, n_kv: int | None = None, n_t: int | None = None) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos) if n_t is None else n_t, len(kvs) if n_kv is None else n_kv)
    meta = head + b"".join(kvs) + b"".join(infos)
    return meta + bytes(-len(meta) % 32) + data


U32, STRING, ARRAY, U8 = 4, 8, 9, 0
KEY0 = 24  # first metadata record
K = s("k")  # a 9-byte key
INFO0 = 24  # first tensor info when there is no metadata


def _hostile_cases() -> list[tuple[str, bytes, str, str, str | None, int, str | None]]:
    """(id, file bytes, error class, message regex, field, byte offset, tensor)."""
    nested = struct.pack("<IIQ", ARRAY, ARRAY, 1) + struct.pack("<IQ", ARRAY, 1) * 20 + struct.pack("<IQ", U8, 0)
    strings = K + struct.pack("<IIQ", ARRAY, STRING, 3) + s("ok") + struct.pack("<Q", 2**32) + b"x" * 64
    d = bytes(64)
    return [
        ("2**63 tensors", gguf([], [], n_t=2**63), "TruncatedError", "tensor infos cannot fit", "header counts", 8, None),
        ("2**64-1 kv", gguf([], [], n_kv=2**64 - 1), "TruncatedError", "metadata entries", "header counts", 8, None),
        ("4 GiB key", gguf([struct.pack("<Q", 2**32) + b"k" * 32], []), "TruncatedError", "string length 4294967296", "metadata key #0 length", KEY0, None),
        ("2**63-1 string value", gguf([K + struct.pack("<IQ", STRING, 2**63 - 1)], []), "TruncatedError", "string length 9223372036854775807",
         "metadata 'k' length", KEY0 + 9 + 4, None),
        ("2**62 u8 array", gguf([K + struct.pack("<IIQ", ARRAY, U8, 2**62)], []), "TruncatedError", "array of 4611686018427387904 UINT8",
         "metadata 'k' count", KEY0 + 9 + 4 + 4, None),
        ("2**40 string array", gguf([K + struct.pack("<IIQ", ARRAY, STRING, 2**40)], []), "TruncatedError", "array of 1099511627776 STRING",
         "metadata 'k' count", KEY0 + 9 + 4 + 4, None),
        ("4 GiB string in an array", gguf([strings], []), "TruncatedError", "string length 4294967296",
         "metadata 'k'[1] length", KEY0 + 9 + 4 + 12 + 10, None),
        ("nesting bomb", gguf([K + nested], []), "FormatError", "nested deeper than 8", None, -1, None),
        ("2**40-element shape", big := gguf([], [info("w", [2**20, 2**20], 0, 0)], d), "TruncatedError", "extends past the end of the file",
         "tensor data", len(big) - 64, "w"),
        ("2**128-element shape", gguf([], [info("w", [2**32] * 4, 0, 0)], d), "FormatError", "overflows int64", "ne", INFO0 + 9 + 4, "w"),
        ("offset 2**63", o1 := gguf([], [info("w", [4], 0, 2**63)], d), "TruncatedError", "extends past the end of the file",
         "tensor data", len(o1) - 64 + 2**63, "w"),
        ("offset 2**64-32", o2 := gguf([], [info("w", [4], 0, 2**64 - 32)], d), "TruncatedError", "extends past the end of the file",
         "tensor data", len(o2) - 64 + 2**64 - 32, "w"),
        ("2**63-1 F32 elements", o3 := gguf([], [info("w", [2**63 - 1], 0, 0)], d), "TruncatedError", "extends past the end of the file",
         "tensor data", len(o3) - 64, "w"),
        ("5 GiB tensor name", gguf([], [struct.pack("<Q", 5 << 30) + b"w" * 40]), "TruncatedError", "string length 5368709120",
         "tensor info #0 name length", INFO0, None),
    ]


CASES = _hostile_cases()


def test_claimed_sizes_cost_nothing_and_errors_are_located(tmp_path):
    """Every hostile file, read from disk in a child with 64 MiB of headroom: the expected
    typed error at the expected field and offset, naming the file, in a few KiB of Python
    allocations (tracemalloc) and a bounded number of Python line events each."""
    files = []
    for k, (cid, raw, *_rest) in enumerate(CASES):
        p = tmp_path / f"hostile{k}.gguf"
        p.write_bytes(raw)
        files.append(os.fspath(p))
    code = f"""
import json, sys
sys.path.insert(0, {TESTS!r})
from opcount import counting
from hurray_interop.formats.gguf import read_gguf
from hurray_interop.errors import HurrayInteropError
out = []
for p in {files!r}:
    with counting() as c:
        try:
            read_gguf(p); r = {{"ok": True}}
        except HurrayInteropError as e:
            r = {{"cls": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "msg": str(e), "path": e.path,
                 "field": e.field, "offset": e.offset, "tensor": e.tensor}}
    r["peak"], r["lines"] = c.peak, c.lines
    out.append(r)
print(json.dumps(out))
"""
    proc = run_bounded(code, budget=64 << 20, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    import re

    for (cid, raw, cls, pattern, field, offset, tensor), p, r in zip(CASES, files, results):
        assert not r.get("ok"), f"{cid}: accepted"
        assert cls in r["mro"], (cid, r)
        assert re.search(pattern, r["msg"]), (cid, r["msg"])
        assert r["path"] == p and r["msg"].startswith(p + ": "), (cid, r)
        if field is not None:
            assert r["field"] == field, (cid, r)
        else:
            assert r["field"].startswith("metadata 'k'"), (cid, r)
        if offset >= 0:
            assert r["offset"] == offset, (cid, r)
        else:
            assert r["offset"] is not None and KEY0 < r["offset"] < len(raw), (cid, r)
        assert r["tensor"] == tensor, (cid, r)
        assert r["peak"] < 256 << 10, (cid, r["peak"])  # nothing proportional to a claimed size
        assert r["lines"] < LINES_PER_HOSTILE_FILE, (cid, r["lines"])  # no loop over a claimed count


def test_wide_array_of_arrays_is_linear_in_the_file(tmp_path):
    """The depth limit stops tall bombs; a wide one (empty arrays inside an array) must
    parse in work and memory proportional to the file, not explode: twice the arrays cost
    at most about twice the Python line events and the traced memory."""
    counts = []
    for n in (15_000, 30_000):
        inner = struct.pack("<IQ", U8, 0) * n
        kv = K + struct.pack("<IIQ", ARRAY, ARRAY, 1) + struct.pack("<IQ", ARRAY, n) + inner
        p = tmp_path / f"wide{n}.gguf"
        p.write_bytes(gguf([kv], []))
        code = f"""
import json, sys
sys.path.insert(0, {TESTS!r})
from opcount import counting
from hurray_interop.formats.gguf import read_gguf
with counting() as c:
    g = read_gguf({os.fspath(p)!r})
    v = g.kv["k"]
print(json.dumps({{"outer": len(v.value), "inner": len(v.value[0].value), "leaf": len(v.value[0].value[-1].value),
                  "lines": c.lines, "peak": c.peak}}))
"""
        proc = run_bounded(code, budget=256 << 20, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        r = json.loads(proc.stdout.splitlines()[-1])
        assert (r["outer"], r["inner"], r["leaf"]) == (1, n, 0)
        counts.append(r)
    small, big = counts
    assert big["lines"] <= 2.2 * small["lines"], (small, big)
    assert big["peak"] <= 2.2 * small["peak"], (small, big)


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_read_gguf_unopenable_path_is_a_usage_error(tmp_path, what):
    # was: FileNotFoundError / IsADirectoryError escaping read_gguf (the other readers already mapped them)
    p = tmp_path / "nope.gguf" if what == "missing" else tmp_path
    with pytest.raises(UsageError, match=r"cannot open: (No such file|Is a directory)") as ei:
        read_gguf(p)
    assert ei.value.path == os.fspath(p)


# -- fuzzing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,n,seed", [("kv-types.gguf", 2500, 101), ("tiny-llama.gguf", 1500, 202)])
def test_mutants_raise_only_located_project_errors(fixtures_dir, name, n, seed):
    n = fuzz_count(n)
    r = run_campaign("gguf", fixtures_dir / name, n, seed)
    assert r["escape_count"] == 0, json.dumps(r["escapes"][:10], indent=1)
    assert r["mutants"] == n and r["errors"] + r["accepted"] == n
    assert r["errors"] > n // 4  # the mutants reach the checks (not only opaque tensor bytes)
    assert r["maxrss_kb"] < 400 << 10


def test_cli_on_mutants_end_to_end(fixtures_dir, tmp_path, monkeypatch):
    """Mutated GGUF files through ``convert`` (to .hrry), ``inspect`` and ``verify``:
    exit 0/1/2, one line on stderr, no traceback, no output or temp file after a failure,
    a readable .hrry after success, the input untouched."""
    import random

    from fuzzing import gguf_regions, mutants
    from hurray_interop.core.hrry import HrryFile

    monkeypatch.setattr(os, "fsync", lambda fd: None)  # speed: durability is test_atomic's business
    raw = (fixtures_dir / "kv-types.gguf").read_bytes()
    n = max(120, fuzz_count(120) // 20)
    src, out = tmp_path / "in" / "m.gguf", tmp_path / "out" / "m.hrry"
    src.parent.mkdir()
    out.parent.mkdir()
    rng = random.Random(7)
    statuses = {0: 0, 1: 0, 2: 0}
    for k, m in mutants(raw, n, 303, gguf_regions(raw)):
        src.write_bytes(m)
        before = set(os.listdir(out.parent))
        status, _, err = run_cli(["convert", os.fspath(src), os.fspath(out), "-q"])
        assert_cli_contract(status, err, output=out, before=before)
        assert src.read_bytes() == m
        statuses[status] += 1
        if status == 0:
            with HrryFile(out) as f:
                f.validate()
            out.unlink()
        if rng.random() < 0.2:
            status, _, err = run_cli(["inspect", os.fspath(src)])
            assert_cli_contract(status, err)
            # verify: a malformed file is one line on stderr (exit 2); a difference is a report (exit 1)
            status, out_text, err = run_cli(["verify", "-q", os.fspath(src)])
            assert status in (0, 1, 2) and "Traceback" not in out_text + err
            assert "internal error" not in out_text + err, err
            if status == 2:
                assert_cli_contract(status, err)
    assert statuses[2] > n // 4 and statuses[0] > 0, statuses


def test_uint64_array_with_values_above_int64_encodes_exactly():
    """Fixed bug (found by test_gguf_format's writer property test): numpy turns the Python
    list [0, 2**63] into float64, so GGUFValue.of(ARRAY, ..., UINT64) called the values
    non-integers.  Now exact, and out-of-range values are still refused."""
    from hurray_interop.formats.gguf import GGUFValue, ValueType, encode_value

    v = GGUFValue.of(ValueType.ARRAY, [0, 2**63, 2**64 - 1], ValueType.UINT64)
    assert encode_value(v) == struct.pack("<IQ3Q", 10, 3, 0, 2**63, 2**64 - 1)
    with pytest.raises(UsageError, match="out of range for UINT64"):
        GGUFValue.of(ValueType.ARRAY, [0, 2**64], ValueType.UINT64)
    with pytest.raises(UsageError, match="out of range for INT64"):
        GGUFValue.of(ValueType.ARRAY, [-1, 2**63], ValueType.INT64)


# -- structure-aware boundaries (issue #20's campaign) -------------------------------------------


def test_boundary_mutants_raise_only_located_project_errors(fixtures_dir):
    """Every count, length, n_dims, ne and data offset of the fixtures moved to or around its
    limit (+-1, +-2, +-8, +-32, 0, twice, the width's maximum) or the file cut at a field
    boundary +-1, parsed in the bounded child: only located project errors."""
    for name, n, seed in (("kv-types.gguf", 400, 111), ("tiny-llama.gguf", 400, 222)):
        n = fuzz_count(n)
        r = run_campaign("gguf-bounds", fixtures_dir / name, n, seed)
        assert r["escape_count"] == 0, json.dumps(r["escapes"][:10], indent=1)
        assert r["errors"] + r["accepted"] == n and r["errors"] > n // 2, r


def test_cli_on_boundary_mutants_end_to_end(fixtures_dir, tmp_path, monkeypatch):
    """Boundary mutants through ``convert`` to .hrry: exit 0/1/2, one line naming the input,
    no output or temporary file after a failure, and after success a valid .hrry that is
    exact: exported back, it gives the mutant byte for byte."""
    import random

    from fuzzing import gguf_boundary_mutant, gguf_fields, gguf_padding_mutant, gguf_padding_regions
    from hurray_interop.core.hrry import HrryFile

    monkeypatch.setattr(os, "fsync", lambda fd: None)  # speed only
    raw = (fixtures_dir / "kv-types.gguf").read_bytes()
    fields, pads = gguf_fields(raw), gguf_padding_regions(raw)
    rng = random.Random(909)
    src, out = tmp_path / "in" / "m.gguf", tmp_path / "out" / "m.hrry"
    src.parent.mkdir()
    out.parent.mkdir()
    seen = {0: 0, 1: 0, 2: 0}
    for k in range(max(40, fuzz_count(40) // 20)):
        # every 4th: junk in the padding (legal, so it must convert and come back exactly)
        m = gguf_padding_mutant(raw, rng, pads) if k % 4 == 3 else gguf_boundary_mutant(raw, rng, fields)
        src.write_bytes(m)
        before = set(os.listdir(out.parent))
        status, _, err = run_cli(["convert", os.fspath(src), os.fspath(out), "-q"])
        assert_cli_contract(status, err, output=out, before=before)
        assert status != 2 or os.fspath(src) in err, err
        seen[status] += 1
        if status == 0:
            with HrryFile(out) as f:
                f.validate()
            back = out.parent / "back.gguf"
            status, _, err = run_cli(["convert", os.fspath(out), os.fspath(back), "-q"])
            assert status == 0 and back.read_bytes() == m, ("accepted mutant does not come back exactly", status, err)
            back.unlink()
            out.unlink()
    assert seen[2] > 0 and seen[0] > 0, seen


def _write_set(folder: Path, prefix: str, shards: list) -> Path:
    """Write a (mutated) set: entry i is shard i + 1 of ``count`` = the original count (None: absent)."""
    count = 3
    for i, b in enumerate(shards):
        if b is not None:
            (folder / f"{prefix}-{i + 1:05d}-of-{count:05d}.gguf").write_bytes(b)
    return folder / f"{prefix}-00001-of-{count:05d}.gguf"


def test_cli_on_split_set_mutants(fixtures_dir, tmp_path, monkeypatch):
    """Split sets with one defect each (a split.no / split.count / split.tensors.count moved to
    or around its limit in one shard, one shard truncated, missing, another shard's copy, an
    extra shard 4 of 3) through ``convert`` and ``inspect`` of the first shard: never exit 0
    for ``convert`` (each defect breaks the set), one line naming a file of the set, no output,
    no traceback."""
    import random

    from fuzzing import split_set_mutant

    monkeypatch.setattr(os, "fsync", lambda fd: None)  # speed only
    shards = [(fixtures_dir / f"tiny-split-{i:05d}-of-00003.gguf").read_bytes() for i in (1, 2, 3)]
    rng = random.Random(717)
    seen: dict[int, int] = {0: 0, 1: 0, 2: 0}
    for k in range(max(40, fuzz_count(40) // 20)):
        folder = tmp_path / f"m{k}"
        folder.mkdir()
        mutated, what = split_set_mutant(shards, rng)
        if mutated[0] is None and len(mutated) == 3:  # the first shard missing: convert the second
            first = _write_set(folder, "s", mutated).with_name("s-00002-of-00003.gguf")
        else:
            first = _write_set(folder, "s", mutated)
        if len(mutated) > 3:
            (folder / "s-00004-of-00003.gguf").write_bytes(mutated[3])
        out = tmp_path / "out" / f"m{k}.hrry"
        out.parent.mkdir(exist_ok=True)
        before = set(os.listdir(out.parent))
        status, _, err = run_cli(["convert", os.fspath(first), os.fspath(out), "-q"])
        assert_cli_contract(status, err, output=out, before=before)
        if what == "shard 1: split.count 3 -> 0":  # gguf-split's own "not a split": shard 1 is a file by itself
            assert status == 0, (what, err)
        else:
            assert status != 0, f"{what}: converted"
            assert os.fspath(folder) in err, (what, err)
        seen[status] += 1
        status, _, err = run_cli(["inspect", os.fspath(first)])
        assert_cli_contract(status, err)
    assert seen[2] > 0, seen
