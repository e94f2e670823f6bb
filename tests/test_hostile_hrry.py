"""Hostile .hrry files: claimed sizes cost nothing, errors are located, only project errors escape.

tests/test_hrry.py, test_descriptor.py and test_kv.py check every MUST-reject rule
with its class and message; this file adds:

1. claimed lengths and counts (an index of 2**63 entries, a KV section of 1 TiB,
   a 4 GiB KV string, a descriptor of rank 2**32-1, a tensor of 2**40 elements
   ...) patched into a file written by **pyhurray** (the reference writer, so the
   base file is not our own output) at offsets found by hand-parsing the
   trailer, read in a child process with 64 MiB of address-space headroom,
   each with its expected class, field, offset and a tracemalloc peak far below
   the claimed size;
2. thousands of seeded mutants (index CRC recomputed for most, so they reach the
   index and descriptor parsers) of a KV-heavy and a composite-carrying file,
   parsed *and fully validated* in a bounded child;
3. mutants converted end to end (to .gguf and .safetensors) through the CLI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from fuzzing import assert_cli_contract, fuzz_count, hrry_fix_crc, hrry_regions, mutants, run_bounded, run_campaign, run_cli

hurray = pytest.importorskip("hurray")

TESTS = os.fspath(Path(__file__).resolve().parent)
#: Python line events a tiny hostile file may cost: a few thousand for the header and first
#: table loads; a loop over a claimed count of 2**32 or more would need billions
LINES_PER_HOSTILE_FILE = 100_000


@pytest.fixture(scope="module")
def ref_file(tmp_path_factory) -> Path:
    """Written by pyhurray: two dense tensors and a KV section (string, int, float list)."""
    p = tmp_path_factory.mktemp("ref") / "ref.hrry"
    a = hurray.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = hurray.from_numpy(np.arange(8, dtype=np.int16))
    hurray.save(os.fspath(p), {"a": a, "b": b}, kv={"name": "reference", "n": 3, "xs": [1.5, 2.5]})
    return p


@pytest.fixture(scope="module")
def converted(tmp_path_factory, fixtures_dir) -> dict[str, Path]:
    """Our own .hrry files from the GGUF fixtures: KV-heavy, and one with Q4_1 overlay composites."""
    from hurray_interop import convert

    d = tmp_path_factory.mktemp("conv")
    out = {}
    for stem in ("kv-types", "tiny-llama"):
        out[stem] = d / f"{stem}.hrry"
        convert(fixtures_dir / f"{stem}.gguf", out[stem])
    return out


def trailer(raw: bytes) -> dict:
    ioff, ilen, kvoff, kvlen, crc = struct.unpack_from("<QQQII", raw, len(raw) - 40)
    (n,) = struct.unpack_from("<Q", raw, ioff)
    p, entries = ioff + 8, []
    for _ in range(n):
        (ln,) = struct.unpack_from("<H", raw, p)
        doff, dlen, daoff, dalen, _fl = struct.unpack_from("<QIQQI", raw, p + 2 + ln)
        entries.append(dict(name=raw[p + 2 : p + 2 + ln].decode(), tail=p + 2 + ln, doff=doff, dlen=dlen, daoff=daoff, dalen=dalen))
        p += 2 + ln + 32
    return dict(t0=len(raw) - 40, ioff=ioff, ilen=ilen, kvoff=kvoff, kvlen=kvlen, entries=entries)


def _crc(raw: bytearray) -> None:
    import crc32c

    ioff, ilen = struct.unpack_from("<QQ", raw, len(raw) - 40)
    struct.pack_into("<I", raw, len(raw) - 12, crc32c.crc32c(bytes(raw[ioff : ioff + ilen])))


def _kv_first_value(raw: bytes, L: dict) -> int:
    """Offset of the first KV entry's value payload (after u32 count, u16 key length, key, u8 tag)."""
    (klen,) = struct.unpack_from("<H", raw, L["kvoff"] + 4)
    return L["kvoff"] + 4 + 2 + klen + 1


# (id, patch(raw, L) -> None, access ("open" | "kv" | "tensor"), class, message regex, field regex, offset(L, raw))
CASES = [
    ("index of 2**63 entries", lambda r, L: struct.pack_into("<Q", r, L["ioff"], 2**63), "open", "TruncatedError",
     "index_entry_count 9223372036854775808 cannot fit", "index_entry_count", lambda L, r: L["ioff"]),
    ("index_length 2**63", lambda r, L: struct.pack_into("<Q", r, L["t0"] + 8, 2**63), "open", "TruncatedError",
     "runs into the trailer", "index_length", lambda L, r: L["t0"] + 8),
    ("index_offset 2**64-8", lambda r, L: struct.pack_into("<Q", r, L["t0"], 2**64 - 8), "open", "TruncatedError",
     "runs into the trailer", "index_length", lambda L, r: L["t0"] + 8),
    ("KV of 1 TiB", lambda r, L: struct.pack_into("<Q", r, L["t0"] + 16, 2**40), "open", "FormatError",
     "KV offset 1099511627776 is not 8-aligned|outside the body", "kv_offset", lambda L, r: L["t0"] + 16),
    ("kv_length 2**32-1", lambda r, L: struct.pack_into("<I", r, L["t0"] + 24, 2**32 - 1), "open", "TruncatedError",
     "outside the body", "kv_offset", lambda L, r: L["t0"] + 16),
    ("kv_count 2**32-1", lambda r, L: struct.pack_into("<I", r, L["kvoff"], 2**32 - 1), "kv", "TruncatedError",
     "kv_count 4294967295 cannot fit", "kv_count", lambda L, r: L["kvoff"]),
    ("4 GiB KV string", lambda r, L: struct.pack_into("<I", r, _kv_first_value(r, L), 2**32 - 1), "kv", "TruncatedError",
     "needs 4294967295 bytes", r"KV 'name'", lambda L, r: _kv_first_value(r, L) + 4),
    ("descriptor_length 2**32-8", lambda r, L: struct.pack_into("<I", r, L["entries"][0]["tail"] + 8, 2**32 - 8), "open", "TruncatedError",
     "extends past the tensor data", "descriptor_offset", lambda L, r: L["entries"][0]["tail"]),
    ("data_length 2**62", lambda r, L: struct.pack_into("<Q", r, L["entries"][0]["tail"] + 20, 2**62), "open", "TruncatedError",
     "extends past the tensor data", "data_offset", lambda L, r: L["entries"][0]["tail"] + 12),
    ("data_offset 2**63", lambda r, L: struct.pack_into("<Q", r, L["entries"][0]["tail"] + 12, 2**63), "open", "TruncatedError",
     "extends past the tensor data", "data_offset", lambda L, r: L["entries"][0]["tail"] + 12),
    ("rank 2**32-1", lambda r, L: struct.pack_into("<I", r, L["entries"][0]["doff"] + 16, 2**32 - 1), "tensor", "FormatError",
     "rank", "rank", lambda L, r: L["entries"][0]["doff"] + 16),
    ("2**40-element shape", lambda r, L: struct.pack_into("<Q", r, L["entries"][0]["doff"] + 20, 2**40), "tensor", "FormatError",
     "needs|byte_size", None, lambda L, r: None),
    ("2**64-2 dimension", lambda r, L: struct.pack_into("<Q", r, L["entries"][0]["doff"] + 28, 2**64 - 2), "tensor", "FormatError",
     "needs|byte_size", None, lambda L, r: None),
]


def test_claimed_sizes_cost_nothing_and_errors_are_located(ref_file, tmp_path):
    base = ref_file.read_bytes()
    L = trailer(base)
    assert [e["name"] for e in L["entries"]] == ["a", "b"] and L["kvoff"]
    files = []
    for k, (cid, patch, access, *_rest) in enumerate(CASES):
        raw = bytearray(base)
        patch(raw, L)
        if cid != "index_length 2**63" and cid != "index_offset 2**64-8":
            _crc(raw)
        p = tmp_path / f"hostile{k}.hrry"
        p.write_bytes(raw)
        files.append((os.fspath(p), access))
    code = f"""
import json, sys
sys.path.insert(0, {TESTS!r})
from opcount import counting
from hurray_interop.core.hrry import HrryFile
from hurray_interop.errors import HurrayInteropError
out = []
for p, access in {files!r}:
    with counting() as c:
        try:
            with HrryFile(p) as f:
                if access == "kv": f.kv
                if access == "tensor": f.tensor("a")
            r = {{"ok": True}}
        except HurrayInteropError as e:
            r = {{"mro": [c.__name__ for c in type(e).__mro__], "msg": str(e), "path": e.path, "field": e.field,
                 "offset": e.offset, "tensor": e.tensor}}
    r["peak"], r["lines"] = c.peak, c.lines
    out.append(r)
print(json.dumps(out))
"""
    proc = run_bounded(code, budget=64 << 20, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    for (cid, _patch, access, cls, pattern, field, offset), (p, _), r in zip(CASES, files, results):
        assert not r.get("ok"), f"{cid}: accepted"
        assert cls in r["mro"], (cid, r)
        assert re.search(pattern, r["msg"]), (cid, r["msg"])
        assert r["path"] == p and r["msg"].startswith(p + ": "), (cid, r)
        assert r["offset"] is not None and 0 <= r["offset"] < len(base), (cid, r)
        if field is not None:
            assert re.match(field, r["field"]), (cid, r)
        want = offset(L, base)
        if want is not None:
            assert r["offset"] == want, (cid, r)
        if access == "tensor":
            assert r["tensor"] == "a", (cid, r)
        assert r["peak"] < 256 << 10, (cid, r["peak"])
        assert r["lines"] < LINES_PER_HOSTILE_FILE, (cid, r["lines"])  # no loop over a claimed count


def test_reference_file_itself_is_accepted(ref_file):
    """The base of the hostile cases is valid: what fails above fails because of the patch."""
    from hurray_interop.core.hrry import HrryFile

    with HrryFile(ref_file) as f:
        f.validate()
        assert np.frombuffer(f.tensor("a").data[0], np.float32).tolist() == list(range(6))
        assert set(f.kv) == {"name", "n", "xs"}


# -- fuzzing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("which,n,seed", [("ref", 1500, 11), ("kv-types", 1500, 12), ("tiny-llama", 600, 13)])
def test_mutants_raise_only_located_project_errors(ref_file, converted, which, n, seed):
    src = ref_file if which == "ref" else converted[which]
    n = fuzz_count(n)
    r = run_campaign("hrry", src, n, seed)
    assert r["escape_count"] == 0, json.dumps(r["escapes"][:10], indent=1)
    assert r["errors"] + r["accepted"] == n and r["errors"] > n // 2
    assert r["maxrss_kb"] < 400 << 10


def test_cli_on_mutants_end_to_end(converted, tmp_path, monkeypatch):
    """Mutated .hrry files converted to GGUF and to safetensors (with --fallback, so that
    most mutants reach the writers): exit 0/1/2, one line, no traceback, no output or
    temporary file after a failure, the input untouched; a written GGUF reads back."""
    from hurray_interop.formats.gguf import read_gguf

    monkeypatch.setattr(os, "fsync", lambda fd: None)  # speed only
    src_file = converted["kv-types"]
    raw = src_file.read_bytes()
    regions = hrry_regions(src_file)
    n = max(120, fuzz_count(120) // 20)
    src = tmp_path / "in" / "m.hrry"
    src.parent.mkdir()
    outdir = tmp_path / "out"
    outdir.mkdir()
    seen = {0: 0, 1: 0, 2: 0}
    for k, m in mutants(raw, n, 404, regions, hrry_fix_crc):
        src.write_bytes(m)
        for ext in (".gguf", ".safetensors"):
            out = outdir / f"m{ext}"
            before = set(os.listdir(outdir))
            status, _, err = run_cli(["convert", os.fspath(src), os.fspath(out), "-q", "--fallback", "float32"])
            assert_cli_contract(status, err, output=out, before=before)
            seen[status] += 1
            if status == 0:
                if ext == ".gguf":
                    with read_gguf(out):
                        pass
                out.unlink()
        assert src.read_bytes() == m
    assert seen[2] > n // 2 and seen[0] > 0, seen


# -- conversion records: attacker-controlled KV that the exporters trust ------------------------
#
# A .hrry written by gguf_to_hurray carries ``hurray_interop.gguf.*`` records (tensor order,
# types, offsets, padding, metadata value types) that hurray_to_gguf replays to reproduce the
# GGUF byte for byte.  In a file from a stranger they are input like any other: a corrupt record
# must be a FormatError naming the file and the record key, never an internal error, and must
# not make the exporter write output proportional to a claimed size.


def _with_records(src: Path, dst: Path, **changes) -> Path:
    from hurray_interop.core.hrry import load, save

    tensors, kv = load(src)
    kv = dict(kv)
    kv.update(changes)
    save(dst, tensors, kv, force=True)
    return dst


def _kv_types_with(src: Path, key: str, new_type: str):
    from hurray_interop.core.hrry import HrryFile
    from hurray_interop.core.kv import KVValue

    with HrryFile(src) as f:
        kv = f.kv
    keys = [k for k in kv if not k.startswith("hurray_interop.")]
    types = list(kv["hurray_interop.gguf.kv_types"].value)
    types[keys.index(key)] = new_type
    return KVValue("array", types, "string")


RECORD_CASES = {
    "tensors-null": ("hurray_interop.gguf.tensors", lambda src: ("string", "null")),
    "tensors-empty-row": ("hurray_interop.gguf.tensors", lambda src: ("string", "[[]]")),
    "tensors-offset-not-int": ("hurray_interop.gguf.tensors", lambda src: ("string", '[["t.tensor", "F32", [8, 3], "F32"]]')),
    "tensors-type-not-str": ("hurray_interop.gguf.tensors", lambda src: ("string", '[["t.tensor", [[1]], [8, 3], 0]]')),
    "tensors-deep-json": ("hurray_interop.gguf.tensors", lambda src: ("string", "[" * 100_000 + "]" * 100_000)),
    "kv-type-string-for-int": ("hurray_interop.gguf.kv_types", lambda src: _kv_types_with(src, "t.u8", "STRING")),
    "kv-type-string-for-raw": ("hurray_interop.gguf.kv_types", lambda src: _kv_types_with(src, "t.nested_i32", "STRING")),
}


@pytest.mark.parametrize("case", list(RECORD_CASES), ids=list(RECORD_CASES))
def test_corrupt_gguf_records_are_located_format_errors(converted, tmp_path, case):
    """Found here, fixed in 437af4e: corrupt ``hurray_interop.gguf.*`` records reached ``int()``,
    ``json.loads`` (RecursionError), tuple indexing and ``.encode`` unguarded in
    conversions/gguf.py -> "internal error".  Now: exit 2, one line naming the .hrry and the
    record key."""
    from hurray_interop.core.kv import KVValue

    key, make = RECORD_CASES[case]
    v = make(converted["kv-types"])
    src = _with_records(converted["kv-types"], tmp_path / "rec.hrry", **{key: v if isinstance(v, KVValue) else KVValue(*v)})
    dst = tmp_path / "out" / "o.gguf"
    dst.parent.mkdir()
    status, _, err = run_cli(["convert", os.fspath(src), os.fspath(dst), "-q"])
    assert "internal error" not in err, err
    assert_cli_contract(status, err, output=dst, before=set())
    assert status == 2 and os.fspath(src) in err and "hurray_interop.gguf" in err, err


@pytest.mark.parametrize("case", ["tail-bytes-33", "alignment-recorded-as-uint8"])
def test_bug_writer_refusals_from_records_name_no_file(converted, tmp_path, case):
    """Records that pass conversions/gguf.py's checks but not GGUFWriterStream's: a recorded
    ``hurray_interop.gguf.tail_bytes`` of 33 (alignment 64: at most 32 bytes of end padding
    remain) or ``general.alignment`` recorded as UINT8 in ``kv_types``.  The writer's
    UsageError surfaces as ``hurray-interop: error: pad_end=33: must be between 0 and 32`` /
    ``general.alignment GGUFValue(UINT8, ...) disagrees with alignment=64``: no file, no record
    key.  Expected: a FormatError naming the .hrry and the record (checked in
    hurray_to_gguf before the writer is built)."""
    from hurray_interop.core.kv import KVValue

    if case == "tail-bytes-33":
        change = {"hurray_interop.gguf.tail_bytes": KVValue("uint64", 33)}
    else:
        change = {"hurray_interop.gguf.kv_types": _kv_types_with(converted["kv-types"], "general.alignment", "UINT8")}
    src = _with_records(converted["kv-types"], tmp_path / "rec.hrry", **change)
    dst = tmp_path / "o.gguf"
    status, _, err = run_cli(["convert", os.fspath(src), os.fspath(dst), "-q"])
    assert_cli_contract(status, err, output=dst)
    assert status == 2 and err.startswith(f"hurray-interop: error: {src}: ") and "hurray_interop.gguf" in err, err


def test_recorded_gguf_offset_cannot_make_the_exporter_write_a_terabyte(converted, tmp_path):
    """Found here, fixed in 437af4e: a recorded tensor offset of 2**40 (hurray_interop.gguf.tensors)
    was replayed as 1 TiB of zero padding by hurray_to_gguf -> GGUFWriterStream._pad_to (output
    proportional to a claimed size, from a 6 kB input).  Run with RLIMIT_FSIZE = 64 MiB so that
    a regression shows as "File too large" instead of filling the disk.  Now a FormatError
    naming the record."""
    from hurray_interop.core.hrry import HrryFile
    from hurray_interop.core.kv import KVValue

    with HrryFile(converted["kv-types"]) as f:
        rows = json.loads(f.kv["hurray_interop.gguf.tensors"].value)
    assert rows[0][0] == "t.tensor" and rows[0][3] == 0
    rows[0][3] = 2**40
    src = _with_records(converted["kv-types"], tmp_path / "far.hrry", **{"hurray_interop.gguf.tensors": KVValue("string", json.dumps(rows))})
    dst = tmp_path / "far.gguf"
    code = f"""
import resource, signal, sys, io, contextlib
resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from hurray_interop.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    rc = main(["convert", {os.fspath(src)!r}, {os.fspath(dst)!r}, "-q"])
print(rc, err.getvalue().strip())
"""
    proc = run_bounded(code, budget=512 << 20, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    status, _, message = proc.stdout.strip().partition(" ")
    assert not dst.exists()
    assert "File too large" not in message, message
    assert status == "2" and "hurray_interop.gguf.tensors" in message, message


@pytest.mark.parametrize("first", [2**64 - 2**62, 2**64 - 1], ids=["index-error", "silently-block-63"])
def test_scale_record_block_index_above_2_63_is_a_format_error(first):
    """Found here, fixed in 437af4e: core/records.py checked ascending order on
    ``blocks.astype(int64)`` and bounded only the last index, so blocks [2**64 - 2**62, 5]
    raised IndexError ("internal error" on export) and [2**64 - 1, 5] silently restored the
    scale of block 63 (index -1).  Now FormatError for both."""
    from hurray_interop.core.records import restore_scales
    from hurray_interop.errors import FormatError

    record = struct.pack("<IQ", 1, 2) + struct.pack("<QQ", first, 5) + bytes([7, 9])
    with pytest.raises(FormatError):
        restore_scales(np.zeros(64, np.uint8), record, key="hurray_interop.scale_substitutions.w")


# -- composites: validation time proportional to the file -------------------------------------------


def _partition_file(path: Path, grid: tuple[int, int]) -> Path:
    """A float32 partition composite of ``grid[0] * grid[1]`` one-element members."""
    from hurray_interop.core.elements import element_type
    from hurray_interop.core.hrry import HrryWriter
    from hurray_interop.core.model import RULE_PARTITION, BufferHandle, CompositeHead, Descriptor, Shard

    f32 = element_type("float32")
    n = grid[0] * grid[1]
    head = Descriptor(f32, grid, (), layout=CompositeHead(RULE_PARTITION, 0, n))
    members = [
        (f"c.{r}.{c}", Descriptor(f32, (1, 1), (BufferHandle.cpu(4),), shard=Shard(grid, (r, c))), [struct.pack("<f", r * grid[1] + c)])
        for r in range(grid[0])
        for c in range(grid[1])
    ]
    with HrryWriter(path, force=True) as w:
        w.write_composite("c", head, members)
        w.finish()
    return path


@pytest.mark.parametrize("grids", [((1, 600), (1, 1200)), ((20, 30), (40, 30))], ids=["row", "grid"])
def test_wide_partition_validates_in_work_proportional_to_the_file(tmp_path, grids):
    """Fixed bug: the partition-overlap check compared every pair of members (hrry.py
    _check_composite), so a 12 MB file with 3000 members took ~30 s to read and a 120 MB one
    ~50 min -- a hang from a modest file.  Now a sweep: twice the members cost at most
    about twice the Python line events (all pairs would cost four times)."""
    from opcount import counting

    from hurray_interop.core.hrry import HrryFile

    lines = []
    for k, grid in enumerate(grids):
        p = _partition_file(tmp_path / f"wide{k}.hrry", grid)
        with HrryFile(p) as f:
            f.tensor("c.0.0")  # first use of the reader's tables, outside the count
            with counting() as c:
                t = f.tensor("c")
            assert len(t.members) == grid[0] * grid[1]
            assert struct.unpack("<f", bytes(t.members[-1].data[0])) == (grid[0] * grid[1] - 1,)
        lines.append(c.lines)
    assert lines[1] <= 2.3 * lines[0], lines


def test_partition_overlap_sweep_agrees_with_all_pairs():
    """The sweep finds an overlap exactly when some pair of boxes overlaps (brute force over
    all pairs is the oracle), and the pair it names does overlap."""
    import random

    from hurray_interop.core.composite import first_overlap as _first_overlap

    def overlap(a, b):
        (oa, sa), (ob, sb) = a, b
        return all(max(x, y) < min(x + lx, y + ly) for x, lx, y, ly in zip(oa, sa, ob, sb))

    rng = random.Random(99)
    found = 0
    for _ in range(3000):
        rank = rng.randint(1, 3)
        boxes = [
            (tuple(rng.randint(0, 6) for _ in range(rank)), tuple(rng.randint(0, 3) for _ in range(rank)))
            for _ in range(rng.randint(0, 7))
        ]
        brute = any(overlap(boxes[i], boxes[j]) for i in range(len(boxes)) for j in range(i + 1, len(boxes)))
        pair = _first_overlap(boxes)
        assert (pair is not None) == brute, boxes
        if pair is not None:
            i, j = pair
            assert i < j and overlap(boxes[i], boxes[j])
            found += 1
    assert 300 < found < 2700  # both outcomes are well exercised


@pytest.mark.parametrize("origin", ["gguf", "safetensors"])
def test_bug_corrupt_scale_record_error_names_the_file(tmp_path, fixtures_dir, origin):
    """A ``hurray_interop.scale_substitutions.*`` record one byte short, exported back to the
    source format.  GGUF export names the file; safetensors export does not:
    ``hurray-interop: error: hurray_interop.scale_substitutions.<t>: scale substitution record
    holds 29 bytes, 2 entries need 30`` (conversions/mx.py, the ``decode_scale_record(rec,
    key=...)`` call in the plan, line ~354, raises core/records.py's FormatError without
    re-locating it to the .hrry).  Expected: the one line names the .hrry (issue item 1)."""
    from hurray_interop import convert
    from hurray_interop.core.hrry import load, save
    from hurray_interop.core.kv import KVValue

    src_name = {"gguf": "tiny-llama.gguf", "safetensors": "ct-mxfp4-tiny.safetensors"}[origin]
    good = tmp_path / "good.hrry"
    convert(fixtures_dir / src_name, good)
    tensors, kv = load(good)
    kv = dict(kv)
    key = next(k for k in kv if k.startswith("hurray_interop.scale_substitutions."))
    kv[key] = KVValue("bytes", kv[key].value[:-1])
    bad = tmp_path / "bad.hrry"
    save(bad, tensors, kv)
    dst = tmp_path / ("o.gguf" if origin == "gguf" else "o.safetensors")
    status, _, err = run_cli(["convert", os.fspath(bad), os.fspath(dst), "-q"])
    assert status == 2 and "scale substitution record holds" in err, err
    assert_cli_contract(status, err, output=dst)
    assert err.startswith(f"hurray-interop: error: {bad}: "), err


# -- conversion records as a fuzzing family (issue #20's campaign) ---------------------------------


@pytest.fixture(scope="module")
def padded(tmp_path_factory, fixtures_dir) -> dict[str, tuple[Path, list[bytes]]]:
    """.hrry files that carry a ``hurray_interop.gguf.padding`` record, with the bytes of the
    GGUF files they were imported from: tiny-llama with junk at both ends of its header
    padding and in its end padding, and the 3-shard set with junk in two of its shards."""
    import shutil

    from fuzzing import gguf_padding_regions
    from hurray_interop import convert

    d = tmp_path_factory.mktemp("padded")
    out = {}
    one = d / "junk-llama.gguf"
    raw = bytearray((fixtures_dir / "tiny-llama.gguf").read_bytes())
    (a, b), (_, e) = gguf_padding_regions(bytes(raw))[0], gguf_padding_regions(bytes(raw))[-1]
    raw[a] = raw[b - 1] = 0x5A
    raw[e - 1] = 0xA5
    one.write_bytes(bytes(raw))
    convert(one, d / "junk-llama.hrry")
    out["junk-llama"] = (d / "junk-llama.hrry", [bytes(raw)])
    shards = []
    for i in (1, 2, 3):
        p = d / f"tiny-split-0000{i}-of-00003.gguf"
        shutil.copy(fixtures_dir / p.name, p)
        raw = bytearray(p.read_bytes())
        if i != 1:
            a, b = gguf_padding_regions(bytes(raw))[0]
            raw[a] = raw[b - 1] = i
        p.write_bytes(bytes(raw))
        shards.append(bytes(raw))
    convert(d / "tiny-split-00001-of-00003.gguf", d / "junk-split.hrry")
    out["junk-split"] = (d / "junk-split.hrry", shards)
    return out


def _written(outdir: Path) -> list[Path]:
    return sorted(outdir.glob("*.gguf"))


def _assert_exact_or_stable(what: str, written: list[Path], original: list[bytes], scratch: Path) -> None:
    """The strong oracle of an accepted record mutant: the export is the GGUF the .hrry was
    imported from, or (when the mutation legally changed it, e.g. the bytes a padding record
    writes back or a metadata value type) a GGUF that re-imports exactly: imported and
    exported again, it comes back byte for byte."""
    got = [p.read_bytes() for p in written]
    if got == original:
        return
    again = scratch / "again"
    shutil.rmtree(again, ignore_errors=True)
    again.mkdir()
    h = again / "again.hrry"
    status, _, err = run_cli(["convert", os.fspath(written[0]), os.fspath(h), "-q"])
    assert status == 0, (what, "the export does not re-import", err)
    status, _, err = run_cli(["convert", os.fspath(h), os.fspath(again / written[0].name), "-q"])
    assert status == 0, (what, "the re-import does not export", err)
    assert [(again / p.name).read_bytes() for p in written] == got, (what, "re-import + re-export is not stable")


def test_cli_on_record_mutants_end_to_end(converted, padded, tmp_path, monkeypatch, fixtures_dir):
    """The records a GGUF export replays (``hurray_interop.gguf.*``: version, alignment, tail
    bytes, value types, tensor rows, the padding record; scale-substitution records), one
    mutated per file (numbers to and around their limits, rows edited, records dropped or
    retyped, padding runs' shard index, offset and length at and around their limits),
    exported to GGUF: exit 0/1/2, one line naming the .hrry, no output after a failure, and a
    written GGUF is exact (see :func:`_assert_exact_or_stable`)."""
    import random

    from fuzzing import PADDING_KEY, records_mutant
    from hurray_interop.core.hrry import load, save

    monkeypatch.setattr(os, "fsync", lambda fd: None)  # speed only
    outdir = tmp_path / "out"
    outdir.mkdir()
    seen = {0: 0, 1: 0, 2: 0}
    n = max(40, fuzz_count(40) // 20)
    corpus = {k: (converted[k], [(fixtures_dir / f"{k}.gguf").read_bytes()]) for k in ("kv-types", "tiny-llama")}
    corpus.update(padded)
    for which, seed in (("kv-types", 808), ("tiny-llama", 809), ("junk-llama", 810), ("junk-split", 811)):
        h, original = corpus[which]
        tensors, kv = load(h)
        rng = random.Random(seed)
        focus = PADDING_KEY if PADDING_KEY in kv else None
        for k in range(n if focus is None else n // 2):
            mkv, what = records_mutant(kv, rng, focus if focus and rng.random() < 0.7 else None)
            src = tmp_path / f"{which}-{k}.hrry"
            save(src, tensors, mkv, force=True)
            out = outdir / "m.gguf"
            before = set(os.listdir(outdir))
            status, _, err = run_cli(["convert", os.fspath(src), os.fspath(out), "-q"])
            split = status == 0 and which == "junk-split"  # a set: m-0000i-of-00003.gguf, not m.gguf
            assert_cli_contract(status, err, output=out, before=None if split else before)
            assert status != 2 or os.fspath(src) in err, (what, err)
            seen[status] += 1
            if status == 0:
                assert set(os.listdir(outdir)) - before == {p.name for p in _written(outdir)}, what  # no temporary
                _assert_exact_or_stable(what, _written(outdir), original, tmp_path)
                for p in _written(outdir):
                    p.unlink()
            src.unlink()
    assert seen[2] > n // 2 and seen[0] > 0, seen


@pytest.mark.parametrize("kind,value", [("uint64", 1), ("string", "abcdefghijklmnop"), ("int64", -1)])
def test_bug_scale_record_of_another_type_is_a_format_error(converted, tmp_path, kind, value):
    """Found by the record family above: a ``hurray_interop.scale_substitutions.*`` record stored
    as an integer or a string (not bytes) reached ``len()`` / ``struct.unpack_from`` in
    core/records.py -> ``internal error: TypeError: object of type 'int' has no len()``. Now exit 2,
    one line naming the .hrry, the tensor and the record."""
    from hurray_interop.core.hrry import HrryFile
    from hurray_interop.core.kv import KVValue

    with HrryFile(converted["tiny-llama"]) as f:
        key = next(k for k in f.kv if k.startswith("hurray_interop.scale_substitutions."))
    src = _with_records(converted["tiny-llama"], tmp_path / "rec.hrry", **{key: KVValue(kind, value)})
    dst = tmp_path / "o.gguf"
    status, _, err = run_cli(["convert", os.fspath(src), os.fspath(dst), "-q"])
    assert_cli_contract(status, err, output=dst)
    tensor = key.removeprefix("hurray_interop.scale_substitutions.")
    assert status == 2 and err.startswith(f"hurray-interop: error: {src}: ") and tensor in err, err
    assert "scale substitution record is stored as" in err and "expected bytes" in err, err
