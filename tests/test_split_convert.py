"""Split GGUF sets through the converter, the command line and the batch (issue 12,
docs/conversion-rules.md § 10): any shard imports the whole set into one .hrry, which
exports to the identical set, to one merged file, or to a new set; every bad set is a
located error with nothing written; verify and inspect see the whole set.

Oracles: sets written by gguf-py's own GGUFWriter (``split_max_tensors``,
``split_max_size``), the fixture set laid out as llama.cpp's gguf-split lays it out
(tensor-less first shard), and gguf-py's GGUFReader for every file we write."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fuzzing import run_cli
from gguf_factory import TensorDef, write_gguf_py
from hurray_interop import batch
from hurray_interop.core.kv import KVValue
from hurray_interop._convert import convert
from hurray_interop.formats import gguf as G
from hurray_interop.formats import gguf_split as S
from test_export_gguf import build_exportable, rewrite_hrry
from test_gguf_split import copy_set, hand_shard, patch_i32, patch_u16, reader_fields, reader_tensors, shard_files, split_kv

gguf = pytest.importorskip("gguf")
VT = G.ValueType
SPLIT = ("split.no", "split.count", "split.tensors.count")


def cli(*argv: object) -> tuple[int, str, str]:
    return run_cli([str(a) for a in argv])


def into(path: Path) -> Path:
    """``path`` in a folder of its own (created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def gguf_py_set(folder: Path, stem: str, **split: int) -> list[Path]:
    """A set written by gguf-py's GGUFWriter (its own splitting)."""
    folder.mkdir(parents=True, exist_ok=True)
    defs = [TensorDef(f"blk.{i}.w", t, (4, 64)) for i, t in enumerate(["F32", "Q8_0", "F16", "Q4_0", "Q5_1", "MXFP4", "F32"])]
    write_gguf_py(folder / f"{stem}.gguf", defs, kv=[("general.name", stem, VT.STRING)], **split)
    return sorted(folder.glob(f"{stem}-*.gguf"))


@pytest.fixture(params=["tiny-split", "nofirst", "gguf-py-max-size", "gguf-py-max-tensors"])
def source_set(request, fixtures_dir, tmp_path) -> list[Path]:
    """The shards of one set, in a folder of their own."""
    if request.param == "gguf-py-max-size":
        return gguf_py_set(tmp_path / "src", "sized", split_max_size=1100)
    if request.param == "gguf-py-max-tensors":
        return gguf_py_set(tmp_path / "src", "counted", split_max_tensors=2, small_first_shard=True)
    return copy_set(fixtures_dir, tmp_path / "src", request.param)


def model_fields(path: Path) -> dict:
    return {k: v for k, v in reader_fields(path).items() if k not in SPLIT}


def test_set_to_hurray_to_identical_set(source_set, tmp_path):
    n = len(source_set)
    assert n >= 3
    hrry = tmp_path / "m.hrry"
    status, out, err = cli("convert", source_set[-1], hrry, "-q")  # any shard: here the last
    assert (status, err) == (0, "")
    status, out, err = cli("inspect", hrry, "--json")
    tops = [t["name"] for t in json.loads(out)["tensors"] if not t["member_of_composite"]]
    assert tops == [t[0] for t in reader_tensors(source_set)]  # every tensor of the set, in set order
    for dst in (f"back/m-00001-of-{n:05d}.gguf", "plain/m.gguf"):  # the first shard's name, or PREFIX.gguf
        status, _, err = cli("convert", hrry, into(tmp_path / dst), "-q")
        assert (status, err) == (0, "")
        written = sorted((tmp_path / dst).parent.iterdir())
        assert [p.name for p in written] == [S.shard_name("m", i, n) for i in range(n)]
        assert [p.read_bytes() for p in written] == [p.read_bytes() for p in source_set]


def test_set_to_hurray_to_merged_loads_in_gguf_py(source_set, tmp_path):
    hrry, merged = tmp_path / "m.hrry", tmp_path / "merged.gguf"
    assert cli("convert", source_set[1], hrry, "-q")[0] == 0
    status, _, err = cli("convert", hrry, merged, "--merge", "-q")
    assert (status, err) == (0, "")
    assert reader_tensors([merged]) == reader_tensors(source_set)  # names, types, shapes, bytes, set order
    fields = reader_fields(merged)
    assert model_fields(merged) == model_fields(source_set[0])
    assert list(model_fields(merged)) == list(model_fields(source_set[0]))
    assert list(fields)[-1] == "split.count"  # as gguf-split --merge leaves it: 0, moved to the end
    r = gguf.GGUFReader(str(merged))
    assert int(r.fields["split.count"].contents()) == 0
    assert int(r.fields["split.tensors.count"].contents()) == len(r.tensors)
    del r


def test_single_file_to_split_max_tensors_and_merged_back(fixtures_dir, tmp_path):
    src = fixtures_dir / "tiny-llama.gguf"
    hrry = tmp_path / "t.hrry"
    assert cli("convert", src, hrry, "-q")[0] == 0
    assert cli("convert", hrry, tmp_path / "one.gguf", "-q")[0] == 0  # no recorded layout: one file
    assert (tmp_path / "one.gguf").read_bytes() == src.read_bytes()
    status, out, err = cli("convert", hrry, into(tmp_path / "set" / "t.gguf"), "--split-max-tensors", "5")
    assert (status, err) == (0, "")
    shards = sorted((tmp_path / "set").iterdir())
    counts = [len(gguf.GGUFReader(str(p)).tensors) for p in shards]
    total = len(reader_tensors([src]))
    assert counts == [5] * (total // 5) + ([total % 5] if total % 5 else [])  # gguf-split's rule
    assert "split GGUF set of" in out
    assert reader_tensors(shards) == reader_tensors([src])
    assert model_fields(shards[0]) == model_fields(src)
    # merged back through Hurray: the single file's tensors and metadata
    assert cli("convert", shards[2], tmp_path / "t2.hrry", "-q")[0] == 0
    assert cli("convert", tmp_path / "t2.hrry", tmp_path / "merged.gguf", "--merge", "-q")[0] == 0
    assert reader_tensors([tmp_path / "merged.gguf"]) == reader_tensors([src])
    assert model_fields(tmp_path / "merged.gguf") == model_fields(src)


def test_native_hurray_file_to_a_new_set(tmp_path):
    """A .hrry that never was GGUF: the set holds what its single-file export holds (DST a
    bare prefix, as gguf-split takes it)."""
    src = tmp_path / "n.hrry"
    build_exportable(src)
    assert cli("convert", src, tmp_path / "one.gguf", "-q")[0] == 0
    status, _, err = cli("convert", src, into(tmp_path / "set" / "n"), "--to", "gguf", "--split-max-tensors", "2", "-q")
    assert (status, err) == (0, "")
    shards = sorted((tmp_path / "set").iterdir())
    assert len(shards) == -(-len(reader_tensors([tmp_path / "one.gguf"])) // 2)
    assert reader_tensors(shards) == reader_tensors([tmp_path / "one.gguf"])
    assert model_fields(shards[0]) == model_fields(tmp_path / "one.gguf")


def test_split_max_size_writes_a_set_gguf_py_reads(tmp_path):
    src = tmp_path / "big.gguf"
    defs = [TensorDef(f"w{i}", "F32", (640, 1024)) for i in range(4)]  # 2.6 MB each
    write_gguf_py(src, defs, kv=[("general.name", "big", VT.STRING)])
    assert cli("convert", src, tmp_path / "big.hrry", "-q")[0] == 0
    status, _, err = cli("convert", tmp_path / "big.hrry", into(tmp_path / "out" / "big.gguf"), "--split-max-size", "6M", "-q")
    assert (status, err) == (0, "")
    shards = sorted((tmp_path / "out").iterdir())
    assert [p.name for p in shards] == [S.shard_name("big", i, 2) for i in range(2)]  # 2 tensors (5.2 MB) fit in 6M
    assert reader_tensors(shards) == reader_tensors([src])


def test_type_changed_by_export_keeps_the_set_layout(fixtures_dir, tmp_path):
    """A tensor that cannot come back in its recorded type (here: requantized at import,
    exported with --fallback) is stored as the fallback type; the other shards stay identical."""
    src = shard_files(fixtures_dir, "tiny-split", 3)
    assert cli("convert", src[0], tmp_path / "rq.hrry", "--q4-1", "requantize", "-q")[0] == 0
    status, _, err = cli("convert", tmp_path / "rq.hrry", into(tmp_path / "out" / "rq.gguf"), "--fallback", "float32", "-q")
    assert (status, err) == (0, "")
    shards = sorted((tmp_path / "out").iterdir())
    assert len(shards) == 3
    assert [shards[i].read_bytes() == src[i].read_bytes() for i in range(3)] == [True, False, True]
    got = {t[0]: t for t in reader_tensors(shards)}
    assert got["blk.0.ffn_up.weight"][1] == "F32"
    assert [t[0] for t in reader_tensors(shards)] == [t[0] for t in reader_tensors(src)]


def test_progress_counts_the_whole_set(fixtures_dir, tmp_path):
    src = shard_files(fixtures_dir, "nofirst", 3)
    total = sum(len(t[3]) for t in reader_tensors(src))
    calls: list[tuple[int, int]] = []
    convert(src[2], tmp_path / "m.hrry", progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (total, total) and all(t == total for _, t in calls)
    calls.clear()
    convert(tmp_path / "m.hrry", into(tmp_path / "o" / "m.gguf"), progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_existing_set_kept_unless_force(fixtures_dir, tmp_path):
    src = shard_files(fixtures_dir, "tiny-split", 3)
    hrry = tmp_path / "m.hrry"
    assert cli("convert", src[0], hrry, "-q")[0] == 0
    out = tmp_path / "out"
    out.mkdir()
    (out / "m-00002-of-00003.gguf").write_bytes(b"keep")
    status, _, err = cli("convert", hrry, out / "m-00001-of-00003.gguf", "-q")
    assert status == 2 and "m-00002-of-00003.gguf" in err and err.count("\n") == 1
    assert sorted(p.name for p in out.iterdir()) == ["m-00002-of-00003.gguf"]
    assert (out / "m-00002-of-00003.gguf").read_bytes() == b"keep"
    assert cli("convert", hrry, out / "m-00001-of-00003.gguf", "--force", "-q")[0] == 0
    assert [p.read_bytes() for p in sorted(out.iterdir())] == [p.read_bytes() for p in src]


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_interrupted_export_leaves_no_shard(fixtures_dir, tmp_path, monkeypatch, exc):
    src = shard_files(fixtures_dir, "tiny-split", 3)
    assert cli("convert", src[0], tmp_path / "m.hrry", "-q")[0] == 0
    real = S.write_shard
    calls = []

    def failing(dst, shard, *a, **kw):
        calls.append(shard.no)
        if shard.no == 1:  # the second shard fails after the first was written
            dst.write(b"partial")
            raise exc
        return real(dst, shard, *a, **kw)

    monkeypatch.setattr(S, "write_shard", failing)
    out = tmp_path / "out"
    out.mkdir()
    status, _, err = cli("convert", tmp_path / "m.hrry", out / "m.gguf", "-q")
    assert status in (2, 130) and err.count("\n") == 1
    assert calls == [0, 1]
    assert list(out.iterdir()) == []  # no shard under its final name, no temporary file


def test_export_options_are_checked(fixtures_dir, tmp_path):
    src = shard_files(fixtures_dir, "tiny-split", 3)
    hrry = tmp_path / "m.hrry"
    assert cli("convert", src[0], hrry, "-q")[0] == 0
    for argv, msg in [
        (("--merge", "--split-max-tensors", "2"), "excludes"),
        (("--split-max-size", "5K"), "500M"),
        (("--split-max-tensors", "0"), "at least 1"),
        (("--split-max-tensors", "2", "--split-max-size", "1M"), "exactly one"),
    ]:
        status, _, err = cli("convert", hrry, tmp_path / "x.gguf", *argv)
        assert status == 2 and msg in err, (argv, err)
    status, _, err = cli("convert", src[0], tmp_path / "x.hrry", "--merge")
    assert status == 2 and "GGUF output only" in err
    status, _, err = cli("convert", hrry, tmp_path / "m-00002-of-00003.gguf")
    assert status == 2 and "first shard" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.hrry"]


# --------------------------------------------------------------------------
# bad sets: exit 2, one line naming the shard, nothing written
# --------------------------------------------------------------------------


def _missing(d: Path) -> tuple[str, str]:
    (d / "tiny-split-00002-of-00003.gguf").unlink()
    return "tiny-split-00002-of-00003.gguf", "tiny-split-00003-of-00003.gguf"


def _duplicated(d: Path) -> tuple[str, str]:
    patch_u16(d / "tiny-split-00003-of-00003.gguf", "split.no", 1)
    return "tiny-split-00003-of-00003.gguf", "tiny-split-00001-of-00003.gguf"


def _extra(d: Path) -> tuple[str, str]:
    shutil.copyfile(d / "tiny-split-00003-of-00003.gguf", d / "tiny-split-00004-of-00003.gguf")
    return "tiny-split-00004-of-00003.gguf", "tiny-split-00002-of-00003.gguf"


def _count(d: Path) -> tuple[str, str]:
    patch_u16(d / "tiny-split-00002-of-00003.gguf", "split.count", 4)
    return "tiny-split-00002-of-00003.gguf", "tiny-split-00001-of-00003.gguf"


def _tensors_count(d: Path) -> tuple[str, str]:
    for p in shard_files(d, "tiny-split", 3):
        patch_i32(p, "split.tensors.count", 9)
    return "tiny-split-00001-of-00003.gguf", "tiny-split-00003-of-00003.gguf"


def _tensors_count_one(d: Path) -> tuple[str, str]:
    patch_i32(d / "tiny-split-00003-of-00003.gguf", "split.tensors.count", 7)
    return "tiny-split-00003-of-00003.gguf", "tiny-split-00001-of-00003.gguf"


def _two_sets(d: Path) -> tuple[str, str]:
    shutil.copyfile(d / "tiny-split-00001-of-00003.gguf", d / "tiny-split-00001-of-00002.gguf")
    return "tiny-split-00001-of-00002.gguf", "tiny-split-00002-of-00003.gguf"


def _duplicate_tensor(d: Path) -> tuple[str, str]:
    for p in shard_files(d, "tiny-split", 3):
        p.unlink()
    hand_shard(d / "tiny-split-00001-of-00002.gguf", [("general.name", G.GGUFValue.of(VT.STRING, "x"))]
               + split_kv(0, 2, 2), ["a"])
    hand_shard(d / "tiny-split-00002-of-00002.gguf", split_kv(1, 2, 2), ["a"])
    return "tiny-split-00002-of-00002.gguf", "tiny-split-00001-of-00002.gguf"


def _metadata_in_second(d: Path) -> tuple[str, str]:
    for p in shard_files(d, "tiny-split", 3):
        p.unlink()
    hand_shard(d / "tiny-split-00001-of-00002.gguf", split_kv(0, 2, 2), ["a"])
    hand_shard(d / "tiny-split-00002-of-00002.gguf", [("general.name", G.GGUFValue.of(VT.STRING, "x"))]
               + split_kv(1, 2, 2), ["b"])
    return "tiny-split-00002-of-00002.gguf", "tiny-split-00001-of-00002.gguf"


def _hostile_count(d: Path) -> tuple[str, str]:
    for p in shard_files(d, "tiny-split", 3)[1:]:
        p.unlink()
    p = d / "tiny-split-00001-of-65535.gguf"
    (d / "tiny-split-00001-of-00003.gguf").rename(p)
    patch_u16(p, "split.count", 65535)
    return "tiny-split-00002-of-65535.gguf", p.name  # the first missing shard: found from the listing, nothing opened


BAD_SETS = {
    "missing": (_missing, "missing shard 2 of 3"),
    "duplicated": (_duplicated, "duplicated shard"),
    "extra": (_extra, "extra shard"),
    "inconsistent-count": (_count, "split.count"),
    "tensors-count": (_tensors_count, "split.tensors.count says 9"),
    "tensors-count-one-shard": (_tensors_count_one, "inconsistent split.tensors.count"),
    "two-sets": (_two_sets, "two different sets"),
    "duplicate-tensor": (_duplicate_tensor, "duplicate tensor name"),
    "metadata-beyond-first": (_metadata_in_second, "first shard only"),
    "split-count-65535": (_hostile_count, "missing shard 2 of 65535"),
}


@pytest.mark.parametrize("case", sorted(BAD_SETS))
@pytest.mark.parametrize("command", ["convert", "inspect", "verify", "dry-run", "batch"])
def test_bad_set_is_a_located_error(fixtures_dir, tmp_path, case, command):
    d = tmp_path / "src"
    copy_set(fixtures_dir, d)
    make, message = BAD_SETS[case]
    named, given_name = make(d)
    given = d / given_name
    out = tmp_path / "out"
    out.mkdir()
    argv = {
        "convert": ("convert", given, out / "m.hrry"),
        "dry-run": ("convert", given, out / "m.hrry", "--dry-run"),
        "inspect": ("inspect", given),
        "verify": ("verify", given),
        "batch": ("convert", "--to", "hurray", "--out-dir", out, given),
    }[command]
    before = sorted((p.name, p.read_bytes()) for p in d.iterdir())
    status, _, err = cli(*argv)
    assert status == 2, err
    line = err.strip()
    assert "\n" not in line and named in line and message in line, line
    assert list(out.iterdir()) == []
    assert sorted((p.name, p.read_bytes()) for p in d.iterdir()) == before  # input untouched


def test_shard_name_without_split_keys_is_a_plain_model(fixtures_dir, tmp_path):
    p = tmp_path / "plain-00002-of-00005.gguf"
    shutil.copyfile(fixtures_dir / "tiny-llama.gguf", p)
    status, _, err = cli("convert", p, tmp_path / "p.hrry", "-q")
    assert (status, err) == (0, "")
    assert cli("convert", tmp_path / "p.hrry", tmp_path / "back.gguf", "-q")[0] == 0
    assert (tmp_path / "back.gguf").read_bytes() == p.read_bytes()


# --------------------------------------------------------------------------
# inspect, dry run, verify, batch
# --------------------------------------------------------------------------


def test_inspect_and_dry_run_show_the_whole_set(fixtures_dir, tmp_path):
    src = shard_files(fixtures_dir, "nofirst", 3)
    status, out, _ = cli("inspect", src[1], "--json")
    info = json.loads(out)
    assert info["split"]["count"] == 3 and info["tensor_count"] == 8
    assert [s["tensors"] for s in info["split"]["shards"]] == [0, 4, 4]
    assert [s["file"] for s in info["split"]["shards"]] == [p.name for p in src]
    assert [t["name"] for t in info["tensors"]] == [t[0] for t in reader_tensors(src)]
    assert "general.name" in [m["key"] for m in info["metadata"]]  # the set's metadata, from shard 1
    status, out, _ = cli("inspect", src[2])
    assert status == 0 and "3 shards, 8 tensors" in out
    status, out, _ = cli("convert", src[2], tmp_path / "m.hrry", "--dry-run", "--json")
    report = json.loads(out)
    assert [t["name"] for t in report["tensors"]] == [t[0] for t in reader_tensors(src)]
    assert any("3 shards" in n for n in report["notes"])
    assert not (tmp_path / "m.hrry").exists()


def test_verify_shard_round_trips_the_whole_set(source_set):
    status, out, err = cli("verify", source_set[1], "--json")
    assert (status, err) == (0, "")
    (r,) = json.loads(out)
    assert r["ok"] and r["file_bytes_equal"] is True
    assert [t["name"] for t in r["tensors"]] == [t[0] for t in reader_tensors(source_set)]
    assert all(t["bytes_equal"] and t["values_equal"] is not False for t in r["tensors"])


def test_verify_set_shard_with_hurray(fixtures_dir, tmp_path):
    src = shard_files(fixtures_dir, "tiny-split", 3)
    other = shard_files(fixtures_dir, "nofirst", 3)
    assert cli("convert", src[0], tmp_path / "m.hrry", "-q")[0] == 0
    assert cli("convert", other[0], tmp_path / "o.hrry", "-q")[0] == 0
    status, out, err = cli("verify", src[2], tmp_path / "m.hrry", "--json")
    assert (status, err) == (0, "")
    (r,) = json.loads(out)
    assert r["kind"] == "pair" and r["ok"] and r["file_bytes_equal"] is True and len(r["tensors"]) == 8
    status, out, _ = cli("verify", tmp_path / "m.hrry", src[1], "--json")  # either order
    assert status == 0 and json.loads(out)[0]["file_bytes_equal"] is True
    # the same tensors laid out as another set: values equal, shards differ
    status, out, _ = cli("verify", src[2], tmp_path / "o.hrry", "--json")
    (r,) = json.loads(out)
    assert status == 1 and r["file_bytes_equal"] is False
    assert any("tiny-split-00001-of-00003.gguf" in p for p in r["problems"])
    # a .hrry made from one merged file exports one file: still compared tensor by tensor
    assert cli("convert", tmp_path / "m.hrry", tmp_path / "merged.gguf", "--merge", "-q")[0] == 0
    assert cli("convert", tmp_path / "merged.gguf", tmp_path / "merged.hrry", "-q")[0] == 0
    status, out, _ = cli("verify", src[0], tmp_path / "merged.hrry", "--json")
    (r,) = json.loads(out)
    assert status == 1 and all(t["values_equal"] is not False for t in r["tensors"]) and len(r["tensors"]) == 8
    assert any("merged.hrry exports to one file" in p and "is a shard of a set of 3" in p for p in r["problems"])


def test_batch_counts_a_set_as_one_source(fixtures_dir, tmp_path):
    src = shard_files(fixtures_dir, "tiny-split", 3)
    assert batch.group_sources([str(src[2]), str(src[0]), "x.gguf", str(src[2])]) == [
        (str(src[0]), str(src[2])), (str(Path("x.gguf").resolve()),)]
    status, out, err = cli("convert", "--to", "hurray", "--out-dir", tmp_path / "b", src[1], src[2],
                           fixtures_dir / "tiny-llama.gguf")
    assert (status, err) == (0, "")
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["tiny-llama.hrry", "tiny-split.hrry"]
    assert "2 of 2 files converted" in out
    assert cli("convert", src[0], tmp_path / "single.hrry", "-q")[0] == 0
    assert (tmp_path / "b" / "tiny-split.hrry").read_bytes() == (tmp_path / "single.hrry").read_bytes()
    status, out, _ = cli("verify", *src, "--workers", "2")
    assert status == 0 and "1 of 1 files verified exact" in out
    status, out, _ = cli("verify", src[1], tmp_path / "single.hrry", "--workers", "2")
    assert status == 0 and "pair" in out


def _layout(fn):
    def edit(kv):
        kv[K_SPLIT] = KVValue.string(json.dumps(fn(json.loads(kv[K_SPLIT].value))))
        return kv

    return edit


def _swap_first_two_tensors(lay):
    t = lay["shards"][0]["tensors"]
    t[0][0], t[1][0] = t[1][0], t[0][0]
    return lay


K_SPLIT = "hurray_interop.gguf.split_layout"
LAYOUT_TAMPERINGS = {
    "not-json": lambda kv: {**kv, K_SPLIT: KVValue.string('{"format": ')},
    "not-a-string": lambda kv: {**kv, K_SPLIT: KVValue.uint64(3)},
    "count": _layout(lambda lay: {**lay, "count": 65535}),
    "tensor-order": _layout(_swap_first_two_tensors),
    "extra-key": _layout(lambda lay: {**lay, "shards": [{**lay["shards"][0], "kv": ["nope"] + lay["shards"][0]["kv"]},
                                                        *lay["shards"][1:]]}),
    "overlap": _layout(lambda lay: {**lay, "shards": [{**lay["shards"][0], "tensors": [
        [*r[:3], 0] for r in lay["shards"][0]["tensors"]]}, *lay["shards"][1:]]}),
    "metadata-in-second": _layout(lambda lay: {**lay, "shards": [lay["shards"][0], {
        **lay["shards"][1], "kv": ["general.name"] + lay["shards"][1]["kv"]}, lay["shards"][2]]}),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_TAMPERINGS))
def test_tampered_split_layout_is_a_located_error(fixtures_dir, tmp_path, case):
    src = shard_files(fixtures_dir, "tiny-split", 3)
    assert cli("convert", src[0], tmp_path / "m.hrry", "-q")[0] == 0
    bad = rewrite_hrry(tmp_path / "m.hrry", tmp_path / "bad.hrry", LAYOUT_TAMPERINGS[case])
    out = into(tmp_path / "out" / "m.gguf")
    for extra in ((), ("--merge",)):
        status, _, err = cli("convert", bad, out, *extra)
        assert status == 2 and err.count("\n") == 1 and "bad.hrry" in err and K_SPLIT in err, err
        assert list(out.parent.iterdir()) == []


# --------------------------------------------------------------------------
# the public reader, pairs of sets, several shards given, --merge without a layout
# --------------------------------------------------------------------------


def test_open_a_shard_presents_the_whole_set(fixtures_dir, tmp_path):
    import hurray_interop
    from hurray_interop.errors import SplitSetError

    src = shard_files(fixtures_dir, "nofirst", 3)
    with hurray_interop.open(src[1]) as m:
        assert isinstance(m, S.SplitModel) and m.count == 3 and m.paths == src
        got = [(t.name, t.type_name, list(t.ne), t.data.tobytes()) for t in m.tensors]
        assert [(n, ty, b) for n, ty, _, b in got] == [(n, ty, b) for n, ty, _, b in reader_tensors(src)]
        assert not any(k.startswith("split.") for k in m.kv)
        assert list(m.kv) == list(model_fields(src[0]))  # the first shard's model metadata, in order
        assert m.get("general.name") == gguf.GGUFReader(str(src[0])).fields["general.name"].contents()
        last = reader_tensors(src[2:])[0][0]
        assert m.shard_of(last) == src[2] and m.tensor(last).name == last
    with hurray_interop.open(fixtures_dir / "tiny-llama.gguf") as f:  # a whole model stays a GGUFFile
        assert isinstance(f, G.GGUFFile)
    d = tmp_path / "bad"
    copy_set(fixtures_dir, d)
    (d / "tiny-split-00002-of-00003.gguf").unlink()
    with pytest.raises(SplitSetError, match="missing shard 2 of 3"):
        hurray_interop.open(d / "tiny-split-00001-of-00003.gguf")


def _flip_last_byte_of_tensor(path: Path, name: str) -> None:
    with G.read_gguf(path) as gf:
        t = gf.tensor(name)
        at = t.data_offset + t.nbytes - 1
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))


def test_verify_pair_of_two_sets_compares_every_shard_and_tensor(fixtures_dir, tmp_path):
    a = copy_set(fixtures_dir, tmp_path / "a")
    b = copy_set(fixtures_dir, tmp_path / "b")
    status, out, err = cli("verify", "--pair", a[0], b[1], "--json")
    assert (status, err) == (0, "")
    (r,) = json.loads(out)
    assert r["ok"] and r["file_bytes_equal"] is True
    assert [t["name"] for t in r["tensors"]] == [t[0] for t in reader_tensors(a)]  # every tensor of the set
    # a difference in a shard neither argument names is found, located in that shard
    last = reader_tensors(b[2:])[-1][0]
    _flip_last_byte_of_tensor(b[2], last)
    status, out, _ = cli("verify", "--pair", a[0], b[0], "--json")
    (r,) = json.loads(out)
    assert status == 1 and r["file_bytes_equal"] is False
    assert any(p.startswith(f"shard {b[2].name} and {b[2].name} differ first at tensor {last!r}") for p in r["problems"])
    assert [t["name"] for t in r["tensors"] if not t["bytes_equal"]] == [last]
    # the same tensors as another set's layout, and as one merged file: tensors equal, files not
    other = shard_files(fixtures_dir, "nofirst", 3)
    status, out, _ = cli("verify", "--pair", a[2], other[1], "--json")
    (r,) = json.loads(out)
    assert status == 1 and r["file_bytes_equal"] is False and all(t["bytes_equal"] for t in r["tensors"])
    assert cli("convert", a[0], tmp_path / "m.hrry", "-q")[0] == 0
    assert cli("convert", tmp_path / "m.hrry", tmp_path / "merged.gguf", "--merge", "-q")[0] == 0
    status, out, _ = cli("verify", "--pair", tmp_path / "merged.gguf", a[1], "--json")
    (r,) = json.loads(out)
    assert status == 1 and all(t["bytes_equal"] for t in r["tensors"]) and len(r["tensors"]) == 8
    assert r["problems"] == [f"{tmp_path / 'merged.gguf'} is one file, {a[1]} is a shard of a split set of 3"]


def test_verify_several_shards_of_one_set_round_trips_it_once(fixtures_dir, tmp_path, monkeypatch):
    from hurray_interop import _verify

    src = shard_files(fixtures_dir, "tiny-split", 3)
    calls = []
    real = _verify.verify_roundtrip
    monkeypatch.setattr(_verify, "verify_roundtrip", lambda p, **kw: calls.append(p) or real(p, **kw))
    status, out, err = cli("verify", src[2], src[0], src[1], fixtures_dir / "kv-types.gguf", "--json")
    assert (status, err) == (0, "")
    results = json.loads(out)
    assert [r["source"] for r in results] == [str(src[0]), str(fixtures_dir / "kv-types.gguf")]  # the set once
    assert calls == [str(src[0]), str(fixtures_dir / "kv-types.gguf")]
    assert results[0]["file_bytes_equal"] is True and len(results[0]["tensors"]) == 8
    calls.clear()
    status, out, _ = cli("verify", src[1], src[2])  # two shards of one set: one round trip, not a pair
    assert status == 0 and calls == [str(src[1])] and out.count("OK") == 1


def test_merge_of_a_file_without_a_recorded_set_says_so(fixtures_dir, tmp_path):
    src = fixtures_dir / "tiny-llama.gguf"
    assert cli("convert", src, tmp_path / "t.hrry", "-q")[0] == 0
    status, out, err = cli("convert", tmp_path / "t.hrry", tmp_path / "t.gguf", "--merge", "--json")
    assert (status, err) == (0, "")
    assert any("records no split GGUF set" in n for n in json.loads(out)["notes"])
    assert (tmp_path / "t.gguf").read_bytes() == src.read_bytes()  # the one file it always writes
    status, out, _ = cli("convert", tmp_path / "t.hrry", tmp_path / "u.gguf")
    assert status == 0 and "records no split" not in out  # no note without --merge


def test_json_reports_cover_the_whole_set(fixtures_dir, tmp_path):
    src = shard_files(fixtures_dir, "nofirst", 3)
    names = [t[0] for t in reader_tensors(src)]
    status, out, err = cli("convert", src[1], tmp_path / "m.hrry", "--json")
    assert (status, err) == (0, "")
    report = json.loads(out)
    assert [t["name"] for t in report["tensors"]] == names and report["source"] == str(src[1])
    assert any("split GGUF set of 3 shards" in n for n in report["notes"])
    status, out, err = cli("convert", tmp_path / "m.hrry", into(tmp_path / "o" / "m.gguf"), "--json")
    assert (status, err) == (0, "")
    report = json.loads(out)
    assert [t["name"] for t in report["tensors"]] == names
    assert report["notes"] == ["wrote a split GGUF set of 3 shards (tensors per shard: "
                               "m-00001-of-00003.gguf 0, m-00002-of-00003.gguf 4, m-00003-of-00003.gguf 4)"]
    status, out, err = cli("convert", "--to", "hurray", "--out-dir", tmp_path / "b", "--json", src[2], src[0])
    assert (status, err) == (0, "")
    (line, summary) = [json.loads(x) for x in out.splitlines()]
    assert (line["source"], line["status"], line["output"]) == (str(src[0]), "ok", str(tmp_path / "b" / "nofirst.hrry"))
    assert "8 tensors" in line["reason"] and summary["files"] == 1


def test_set_conversion_memory_does_not_grow_with_the_set(tmp_path):
    """Streaming: the Python-heap peak (tracemalloc: numpy buffers included, mapped file pages
    not) of importing a set and exporting it again is the same for 2 shards as for 12 --
    bounded by about one tensor, not by the shards or the set's size."""
    import tracemalloc

    def peaks(n: int, tag: str = "") -> tuple[int, int, int]:
        d = tmp_path / f"n{n}{tag}"
        write_gguf_py(into(d / "src" / "m.gguf"), [TensorDef(f"blk.{i}.w", "Q8_0", (512, 4096)) for i in range(n)],
                      split_max_tensors=1, seed=n)
        shards = sorted((d / "src").iterdir())
        assert len(shards) == n
        out = []
        for a, b in ((shards[-1], d / "m.hrry"), (d / "m.hrry", into(d / "o" / "m.gguf"))):
            tracemalloc.start()
            try:
                convert(a, b)
                out.append(tracemalloc.get_traced_memory()[1])
            finally:
                tracemalloc.stop()
        assert [p.read_bytes() for p in sorted((d / "o").iterdir())] == [p.read_bytes() for p in shards]
        return out[0], out[1], sum(p.stat().st_size for p in shards)

    peaks(2, "warm-up")  # warm-up: first-use imports and tables are not the conversion's memory
    small, big = peaks(2), peaks(12)
    tensor = 512 * 4096 // 32 * 34  # one Q8_0 tensor's bytes
    assert big[2] > 5 * small[2] > 5 * 2 * tensor  # 6x the data ...
    for s, b in zip(small[:2], big[:2]):  # ... the same peak (import, export)
        assert b < s + tensor // 4, (small, big)
        assert b < 2 * tensor + (1 << 20), (small, big)


def test_fallbacks_compose_with_sets(fixtures_dir, tmp_path):
    """A set holding K-quants (the K-quant fixture, split by way of its exact import):
    refused without a fallback (nothing written), exact with --fallback exact (back to the
    identical set; verify --fallback exact of a shard passes), dequantized with --fallback float32."""
    single = fixtures_dir / "tiny-llama-kquant.gguf"
    assert cli("convert", single, tmp_path / "one.hrry", "--fallback", "exact", "-q") == (0, "", "")
    assert cli("convert", tmp_path / "one.hrry", into(tmp_path / "src" / "k.gguf"), "--split-max-tensors", "10", "-q") \
        == (0, "", "")
    shards = sorted((tmp_path / "src").iterdir())
    assert len(shards) == 3 and reader_tensors(shards) == reader_tensors([single])
    kquants = [t[0] for t in reader_tensors(shards) if t[1] in ("Q4_K", "Q6_K")]
    status, _, err = cli("convert", shards[1], tmp_path / "k.hrry", "-q")
    assert status == 1 and "refused" in err and not (tmp_path / "k.hrry").exists()
    assert cli("convert", shards[1], tmp_path / "k.hrry", "--fallback", "exact", "-q") == (0, "", "")
    assert cli("convert", tmp_path / "k.hrry", into(tmp_path / "o" / "k.gguf"), "-q") == (0, "", "")
    assert [p.read_bytes() for p in sorted((tmp_path / "o").iterdir())] == [p.read_bytes() for p in shards]
    status, out, err = cli("verify", "--fallback", "exact", shards[2], "--json")
    (r,) = json.loads(out)
    assert (status, err) == (0, "") and r["file_bytes_equal"] is True and len(r["tensors"]) == len(reader_tensors(shards))
    status, out, err = cli("convert", shards[0], tmp_path / "f.hrry", "--fallback", "float32", "--json")
    assert (status, err) == (0, "")
    mapped = {t["name"]: t["mapping"] for t in json.loads(out)["tensors"]}
    assert list(mapped) == [t[0] for t in reader_tensors(shards)] and kquants
    assert {mapped[n] for n in kquants} == {"float32 (fallback)"}
