"""Split GGUF sets (hurray_interop.formats.gguf_split): finding and checking a set from any
shard, the layout record, rewriting a set byte for byte, merging, planning new sets, and
all-or-nothing output.  Oracles: sets written by gguf-py's own GGUFWriter (fixtures and
fresh ones), gguf-py's GGUFReader for every file we write, and llama.cpp's gguf-split
rules (split points, sizes, key order) written out by hand."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from hurray_interop.errors import FormatError, OutputExistsError, SplitSetError, UsageError
from hurray_interop.formats import gguf as G
from hurray_interop.formats import gguf_split as S

gguf = pytest.importorskip("gguf")
from gguf_factory import TensorDef, kv_type_offset, write_gguf_py  # noqa: E402

VT = G.ValueType
SETS = {"tiny-split": [3, 3, 2], "nofirst": [0, 4, 4]}  # fixture sets: tensors per shard


def shard_files(folder: Path, prefix: str, count: int) -> list[Path]:
    return [folder / f"{prefix}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def copy_set(fixtures_dir: Path, dst: Path, prefix: str = "tiny-split") -> list[Path]:
    dst.mkdir(parents=True, exist_ok=True)
    out = []
    for p in shard_files(fixtures_dir, prefix, 3):
        shutil.copyfile(p, dst / p.name)
        out.append(dst / p.name)
    return out


def reader_tensors(paths) -> list[tuple[str, str, list[int], bytes]]:
    """Every tensor of these files in order, as gguf-py's GGUFReader reads it."""
    out = []
    for p in paths:
        r = gguf.GGUFReader(str(p))
        out += [(t.name, t.tensor_type.name, [int(x) for x in t.shape], t.data.tobytes()) for t in r.tensors]
        del r
    return out


def reader_fields(path) -> dict[str, tuple[list[int], list[bytes]]]:
    """Metadata as gguf-py reads it: key -> (types, raw bytes of every value part)."""
    r = gguf.GGUFReader(str(path))
    out = {k: ([int(t) for t in f.types], [f.parts[i].tobytes() for i in f.data]) for k, f in r.fields.items()
           if not k.startswith("GGUF.")}
    del r
    return out


def data_from(split_set):
    return split_set.tensor_data


def patch_u16(path: Path, key: str, value: int) -> None:
    at = kv_type_offset(path, key) + 4  # after the u32 type tag (found by gguf-py)
    raw = bytearray(path.read_bytes())
    raw[at : at + 2] = struct.pack("<H", value)
    path.write_bytes(bytes(raw))


def patch_i32(path: Path, key: str, value: int) -> None:
    at = kv_type_offset(path, key) + 4
    raw = bytearray(path.read_bytes())
    raw[at : at + 4] = struct.pack("<i", value)
    path.write_bytes(bytes(raw))


def hand_shard(path: Path, kv: list[tuple[str, G.GGUFValue]], names: list[str]) -> Path:
    """One shard with exact metadata and small F32 tensors (for sets no writer makes)."""
    specs = [G.TensorSpec(n, 0, (8,)) for n in names]
    with G.GGUFWriterStream(path, kv=kv, tensors=specs) as w:
        for s in w.tensors_in_file_order:
            w.write_tensor_data(np.arange(8, dtype=np.float32))
    return path


def split_kv(no, count, total, order=S.SPLIT_KEYS):
    vals = dict(S.split_entries(no, count, total))
    return [(k, vals[k]) for k in order]


# --------------------------------------------------------------------------
# names, sizes, plans
# --------------------------------------------------------------------------


def test_shard_names():
    assert S.parse_shard_name("tiny-00002-of-00005.gguf") == S.ShardName("tiny", 2, 5)
    assert S.parse_shard_name("a-00001-of-00002-00003-of-00004.gguf") == S.ShardName("a-00001-of-00002", 3, 4)
    for bad in ("tiny.gguf", "tiny-2-of-5.gguf", "-00001-of-00002.gguf", "tiny-00001-of-00002.gguf.tmp",
                "tiny-000001-of-00002.gguf", "tiny-00001-of-00002.GGUF"):
        assert S.parse_shard_name(bad) is None, bad
    assert S.shard_name("m", 0, 3) == "m-00001-of-00003.gguf"  # gguf-split's "%s-%05d-of-%05d.gguf"
    assert S.shard_name("m", 65534, 65535) == "m-65535-of-65535.gguf"


def test_set_paths(tmp_path):
    want = [tmp_path / f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert S.set_paths(tmp_path / "m-00001-of-00003.gguf", 3) == want  # the first shard's name
    assert S.set_paths(tmp_path / "m.gguf", 3) == want  # gguf-py: the stem
    assert S.set_paths(tmp_path / "m", 3) == want  # gguf-split: a prefix
    with pytest.raises(UsageError, match="names shard 2 of 3"):
        S.set_paths(tmp_path / "m-00002-of-00003.gguf", 3)
    with pytest.raises(UsageError, match="names shard 1 of 4"):
        S.set_paths(tmp_path / "m-00001-of-00004.gguf", 3)
    with pytest.raises(UsageError):
        S.set_paths(tmp_path / "m", 0)


def test_parse_split_size_is_gguf_splits_decimal_units():
    assert S.parse_split_size("500M") == 500_000_000
    assert S.parse_split_size("2G") == 2_000_000_000
    assert S.parse_split_size("1M") == 1_000_000
    for bad in ("0M", "1.5G", "500", "500K", "-1M", "M", "500m", "", "2 G"):
        with pytest.raises(UsageError, match="M \\(10\\^6 bytes\\)"):
            S.parse_split_size(bad)


def test_plan_split_max_tensors_matches_gguf_split():
    # gguf-split: a new shard at every tensor index i > 0 with i % N == 0
    assert S.plan_split([1] * 7, max_tensors=3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert S.plan_split([1] * 6, max_tensors=3) == [[0, 1, 2], [3, 4, 5]]
    assert S.plan_split([1] * 2, max_tensors=5) == [[0, 1]]
    assert S.plan_split([1] * 5, max_tensors=2, no_tensor_first_split=True) == [[], [0, 1], [2, 3], [4]]
    assert S.plan_split([], max_tensors=2) == [[]]


def test_plan_split_max_size_counts_tensors_padded_to_32():
    # padded sizes 32, 32, 32, 64: 32+32 fits in 64, the third would make 96
    assert S.plan_split([32, 32, 1, 40], max_size=64) == [[0, 1], [2], [3]]
    assert S.plan_split([33, 31], max_size=64) == [[0], [1]]  # 64 + 32 > 64
    assert S.plan_split([31, 31], max_size=64) == [[0, 1]]  # 32 + 32
    # a tensor larger than the limit gets a shard of its own
    assert S.plan_split([10, 100, 10], max_size=50) == [[0], [1], [2]]
    assert S.plan_split([100, 10], max_size=50, no_tensor_first_split=True) == [[], [0], [1]]


@pytest.mark.parametrize("kw", [{}, {"max_tensors": 2, "max_size": 10}, {"max_tensors": 0}, {"max_size": 0}])
def test_plan_split_refuses_bad_limits(kw):
    with pytest.raises(UsageError):
        S.plan_split([1, 2], **kw)


def test_plan_split_refuses_more_than_65535_shards():
    with pytest.raises(UsageError, match="65536 shards"):
        S.plan_split([1] * 65536, max_tensors=1)


def test_plan_split_agrees_with_gguf_py_split_max_tensors(tmp_path):
    defs = [TensorDef(f"t{i}", "F32", (32,)) for i in range(7)]
    for n, small in [(2, False), (3, True)]:
        folder = tmp_path / f"{n}{small}"
        folder.mkdir()
        write_gguf_py(folder / "m.gguf", defs, split_max_tensors=n, small_first_shard=small)
        shards = sorted(folder.glob("m-*.gguf"))
        per_shard = [[t[0] for t in reader_tensors([p])] for p in shards]
        plan = S.plan_split([128] * 7, max_tensors=n, no_tensor_first_split=small)
        assert per_shard == [[f"t{i}" for i in a] for a in plan]


# --------------------------------------------------------------------------
# reading sets
# --------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", sorted(SETS))
@pytest.mark.parametrize("which", [1, 2, 3])
def test_fixture_set_opens_from_any_shard(fixtures_dir, prefix, which):
    paths = shard_files(fixtures_dir, prefix, 3)
    with S.open_split_set(paths[which - 1]) as s:
        assert s.paths == paths and s.count == 3 and s.prefix == prefix
        assert [len(gf.tensors) for gf in s.shards] == SETS[prefix]
        assert s.total_tensors == s.tensors_count == 8
        ours = [(t.name, t.type_name, list(t.ne), t.data.tobytes()) for _, t in s.tensors]
        assert ours == reader_tensors(paths)  # set order = shard order, then file order
        assert [i for i, _ in s.tensors] == [i for i, n in enumerate(SETS[prefix]) for _ in range(n)]
        first = reader_fields(paths[0])
        model = s.model_kv()
        assert list(model) == [k for k in first if not k.startswith("split.")]
        for k, v in model.items():
            assert [int(v.type)] == first[k][0][:1], k
        for p in paths[1:]:  # llama.cpp and gguf-py put only the split keys into the other shards
            assert sorted(reader_fields(p)) == sorted(S.SPLIT_KEYS)


def test_fixture_split_key_orders(fixtures_dir):
    # gguf-py: no, count, tensors.count; gguf-split: no, tensors.count, count
    assert list(reader_fields(shard_files(fixtures_dir, "tiny-split", 3)[1])) == [
        "split.no", "split.count", "split.tensors.count"]
    assert list(reader_fields(shard_files(fixtures_dir, "nofirst", 3)[1])) == [
        "split.no", "split.tensors.count", "split.count"]


def test_gguf_py_split_max_size_set(tmp_path):
    defs = [TensorDef(f"blk.{i}.w", t, (4, 64)) for i, t in enumerate(["F32", "Q8_0", "F16", "Q4_0", "F32", "MXFP4"])]
    write_gguf_py(tmp_path / "m.gguf", defs, kv=[("general.name", "sized", VT.STRING)], split_max_size=1100)
    paths = sorted(tmp_path.glob("m-*.gguf"))
    assert len(paths) > 2
    with S.open_split_set(paths[-1]) as s:
        assert s.paths == paths
        assert [(t.name, t.data.tobytes()) for _, t in s.tensors] == [(t[0], t[3]) for t in reader_tensors(paths)]
        assert s.model_kv()["general.name"].value == b"sized"


def test_plain_files_are_not_sets(fixtures_dir, tmp_path):
    assert S.open_split_set(fixtures_dir / "tiny-llama.gguf") is None
    # named like a shard, but without split keys: a plain model
    shutil.copyfile(fixtures_dir / "tiny-llama.gguf", tmp_path / "m-00001-of-00002.gguf")
    assert S.open_split_set(tmp_path / "m-00001-of-00002.gguf") is None
    # split.count = 1 under a name that is no shard name: llama.cpp loads it as a whole model
    hand_shard(tmp_path / "one.gguf", split_kv(0, 1, 1), ["a"])
    assert S.open_split_set(tmp_path / "one.gguf") is None
    # ... and under a shard name it is a set of one
    hand_shard(tmp_path / "one-00001-of-00001.gguf", split_kv(0, 1, 1), ["a"])
    with S.open_split_set(tmp_path / "one-00001-of-00001.gguf") as s:
        assert s.count == 1 and s.total_tensors == 1


def test_split_set_of_keeps_ownership_of_a_plain_file(fixtures_dir):
    with G.read_gguf(fixtures_dir / "tiny-llama.gguf") as gf:
        assert S.split_set_of(gf) is None
        assert gf.tensors[0].data[:4].tobytes()  # still open and usable


# --------------------------------------------------------------------------
# bad sets: each a located SplitSetError naming the shard
# --------------------------------------------------------------------------


def _missing(files):
    files[1].unlink()
    return files[0], "tiny-split-00002-of-00003.gguf", "missing shard 2 of 3"


def _extra(files):
    shutil.copyfile(files[2], files[0].with_name("tiny-split-00004-of-00003.gguf"))
    return files[0], "tiny-split-00004-of-00003.gguf", "extra shard: number 4"


def _duplicated(files):
    shutil.copyfile(files[0], files[2])  # shard 3's name now holds another copy of split.no = 0
    return files[1], "tiny-split-00003-of-00003.gguf", "duplicated shard: split.no = 0"


def _count(files):
    patch_u16(files[1], "split.count", 4)
    return files[0], "tiny-split-00002-of-00003.gguf", "inconsistent split.count: 4"


def _total_one(files):
    patch_i32(files[2], "split.tensors.count", 9)
    return files[0], "tiny-split-00003-of-00003.gguf", "inconsistent split.tensors.count: 9"


def _total_all(files):
    for f in files:
        patch_i32(f, "split.tensors.count", 9)
    return files[2], "tiny-split-00001-of-00003.gguf", "hold 8 tensors, but split.tensors.count says 9"


def _dup_tensor(files):
    raw = files[1].read_bytes()
    assert raw.count(b"blk.0.attn_k.weight") == 1
    files[1].write_bytes(raw.replace(b"blk.0.attn_k.weight", b"blk.0.attn_q.weight"))
    return files[2], "tiny-split-00002-of-00003.gguf", "duplicate tensor name: 'blk.0.attn_q.weight' is also in tiny-split-00001"


def _mixed(files):
    shutil.copyfile(files[0], files[0].with_name("tiny-split-00001-of-00002.gguf"))
    return files[1], "tiny-split-00001-of-00002.gguf", "two different sets share the prefix"


def _name_vs_keys(files):
    os.rename(files[2], files[2].with_name("other-00002-of-00003.gguf"))
    return files[2].with_name("other-00002-of-00003.gguf"), "other-00002-of-00003.gguf", "name says shard 2 of 3"


def _misplaced_metadata(files):
    kv = split_kv(2, 3, 8)
    name = ("general.name", G.GGUFValue.of(VT.STRING, "x"))
    hand_shard(files[2], kv[:2] + [name] + kv[2:], ["output_norm.weight", "output.weight"])
    return files[0], "tiny-split-00003-of-00003.gguf", "metadata 'general.name' in shard 3"


def _no_keys(files):
    hand_shard(files[2], [("general.architecture", G.GGUFValue.of(VT.STRING, "llama"))], ["output.weight"])
    return files[0], "tiny-split-00003-of-00003.gguf", "has no split keys"


BAD_SETS = [_missing, _extra, _duplicated, _count, _total_one, _total_all, _dup_tensor, _mixed, _name_vs_keys,
            _misplaced_metadata, _no_keys]


@pytest.mark.parametrize("damage", BAD_SETS, ids=lambda f: f.__name__.strip("_"))
def test_bad_sets_raise_a_located_error(fixtures_dir, tmp_path, damage):
    files = copy_set(fixtures_dir, tmp_path)
    opened, culprit, message = damage(files)
    with pytest.raises(SplitSetError) as ei:
        S.open_split_set(opened)
    text = str(ei.value)
    assert "\n" not in text and message in text, text
    assert os.path.basename(ei.value.path) == culprit, text
    assert text.startswith(ei.value.path)


def test_split_keys_must_have_their_gguf_types(tmp_path):
    kv = [("split.no", G.GGUFValue.of(VT.UINT16, 0)), ("split.count", G.GGUFValue.of(VT.UINT32, 2)),
          ("split.tensors.count", G.GGUFValue.of(VT.INT32, 1))]
    hand_shard(tmp_path / "m-00001-of-00002.gguf", kv, ["a"])
    where = r"m-00001-of-00002\.gguf: split\.count at offset \d+: split\.count must be UINT16, found UINT32"
    with pytest.raises(FormatError, match=where):
        S.open_split_set(tmp_path / "m-00001-of-00002.gguf")
    hand_shard(tmp_path / "n-00001-of-00002.gguf", kv[:1], ["a"])
    with pytest.raises(SplitSetError, match=r"n-00001-of-00002\.gguf: split\.count: has split keys but no split\.count"):
        S.open_split_set(tmp_path / "n-00001-of-00002.gguf")
    hand_shard(tmp_path / "k.gguf", split_kv(0, 3, 1), ["a"])
    with pytest.raises(SplitSetError, match=r"k\.gguf: .*its name does not end in -0000N-of-0000M\.gguf"):
        S.open_split_set(tmp_path / "k.gguf")


@pytest.fixture
def count_opens(monkeypatch):
    opened: list[str] = []
    real = G.read_gguf

    def counting(path):
        opened.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(G, "read_gguf", counting)
    return opened


def test_split_count_65535_fails_on_names_alone(tmp_path, count_opens):
    big = hand_shard(tmp_path / "big-00001-of-65535.gguf", split_kv(0, 65535, 65535), ["a"])
    with pytest.raises(SplitSetError, match=r"big-00002-of-65535\.gguf: missing shard 2 of 65535"):
        S.open_split_set(big)
    assert count_opens == [os.fspath(big)]  # the one file given, nothing else
    # a claim that its name contradicts is refused before the folder is even listed
    lie = hand_shard(tmp_path / "lie-00001-of-00003.gguf", split_kv(0, 65535, 3), ["a"])
    with pytest.raises(SplitSetError, match="name says shard 1 of 3, but split.no = 0 and split.count = 65535"):
        S.open_split_set(lie)
    assert count_opens[1:] == [os.fspath(lie)]


def test_mixed_sets_fail_before_any_other_shard_is_opened(fixtures_dir, tmp_path, count_opens):
    files = copy_set(fixtures_dir, tmp_path)
    shutil.copyfile(files[0], tmp_path / "tiny-split-00002-of-00005.gguf")
    with pytest.raises(SplitSetError, match="tiny-split-00002-of-00005.gguf: shards of two different sets"):
        S.open_split_set(files[0])
    assert count_opens == [os.fspath(files[0])]


def test_a_bad_shard_stops_the_opening(fixtures_dir, tmp_path, count_opens):
    files = copy_set(fixtures_dir, tmp_path)
    patch_u16(files[1], "split.count", 7)
    with pytest.raises(SplitSetError, match="inconsistent split.count"):
        S.open_split_set(files[0])
    assert count_opens == [os.fspath(files[0]), os.fspath(files[1])]  # shard 3 was never opened


# --------------------------------------------------------------------------
# the layout record
# --------------------------------------------------------------------------


def test_layout_record_example(fixtures_dir):
    with S.open_split_set(shard_files(fixtures_dir, "nofirst", 3)[0]) as s:
        lay = s.layout()
    text = json.dumps(lay)
    assert json.loads(text) == lay  # JSON-serialisable as is
    assert lay["format"] == "gguf-split" and lay["count"] == 3 and lay["tensors_count"] == 8
    first, second = lay["shards"][0], lay["shards"][1]
    assert first["file"] == "-00001-of-00003.gguf" and first["tensors"] == []
    assert first["kv"][0] == "general.architecture" and first["kv"][-3:] == ["split.no", "split.tensors.count", "split.count"]
    assert second == {
        "file": "-00002-of-00003.gguf", "version": 3, "alignment": 32, "tail_bytes": 0,
        "kv": ["split.no", "split.tensors.count", "split.count"],
        "tensors": [["token_embd.weight", "Q8_0", [32, 32], 0], ["blk.0.attn_norm.weight", "F32", [32], 1088],
                    ["blk.0.attn_q.weight", "Q4_0", [32, 32], 1216], ["blk.0.attn_k.weight", "F16", [32, 32], 1792]],
    }
    # the tensor-less first shard ends with the padding after its metadata
    assert 0 < first["tail_bytes"] < 32


def _corrupt(lay, how):
    lay = json.loads(json.dumps(lay))
    sh = lay["shards"]
    if how == "count":
        lay["count"] = 2
    elif how == "file":
        sh[1]["file"] = "-00003-of-00003.gguf"
    elif how == "version":
        sh[0]["version"] = 4
    elif how == "alignment":
        sh[0]["alignment"] = 48
    elif how == "tail":
        sh[0]["tail_bytes"] = 32
    elif how == "kv-extra":
        sh[1]["kv"].append("general.name")
    elif how == "kv-missing":
        sh[0]["kv"].remove("split.no")
    elif how == "row":
        sh[1]["tensors"][0] = ["x", "Q8_0", [32, 32]]
    elif how == "type":
        sh[1]["tensors"][0][1] = "Q9_9"
    elif how == "blocks":
        sh[1]["tensors"][0][2] = [33, 32]
    elif how == "overlap":
        sh[1]["tensors"][1][3] = 32
    elif how == "unaligned":
        sh[1]["tensors"][1][3] = 1090
    elif how == "gap":
        sh[1]["tensors"][3][3] = 1 << 40
    elif how == "empty-far":
        sh[1]["tensors"].append(["empty", "F32", [0], 1 << 40])
        lay["tensors_count"] += 1
    elif how == "dup":
        sh[2]["tensors"][0][0] = sh[1]["tensors"][0][0]
    elif how == "total":
        lay["tensors_count"] = 9
    return lay


@pytest.mark.parametrize("how", ["count", "file", "version", "alignment", "tail", "kv-extra", "kv-missing", "row", "type",
                                 "blocks", "overlap", "unaligned", "gap", "empty-far", "dup", "total"])
def test_corrupt_layout_records_are_located_format_errors(fixtures_dir, how):
    with S.open_split_set(shard_files(fixtures_dir, "nofirst", 3)[0]) as s:
        lay = s.layout()
    assert S.SplitLayout.from_json(lay).to_json() == lay
    where = r"^m\.hrry: (tensor '[^']+': )?hurray_interop\.gguf\.split: corrupt split layout record"
    with pytest.raises(FormatError, match=where) as ei:
        S.SplitLayout.from_json(_corrupt(lay, how), path="m.hrry", field="hurray_interop.gguf.split")
    assert "\n" not in str(ei.value)


def test_tensor_rows():
    assert S.tensor_row(["s", "F32", [], 0]) == S.TensorRow("s", "F32", (), 0)  # GGUF allows n_dims 0
    assert S.tensor_row(["q", "Q4_0", [64, 2], 32]).nbytes == 72
    for bad in (["s", "F32", [], 0, 1], ["s", "F32", [1, 1, 1, 1, 1], 0], ["s", "F32", [True], 0], ["s", "F32", [4], -32],
                ["q", "Q4_0", [48], 0], ["x", "NOPE", [4], 0], "s"):
        with pytest.raises(ValueError):
            S.tensor_row(bad)
    with pytest.raises(ValueError, match=r"ne \(1-4 sizes\)"):
        S.tensor_row(["s", "F32", [], 0], min_dims=1)


def test_layout_from_json_text():
    with pytest.raises(FormatError, match="not valid JSON"):
        S.SplitLayout.from_json("{")
    with pytest.raises(FormatError, match="format 'gguf-split'"):
        S.SplitLayout.from_json('{"format": "x"}')


# --------------------------------------------------------------------------
# writing: byte-identical sets, merged files, new sets
# --------------------------------------------------------------------------


def _rewrite(src_first: Path, out: Path, **kw) -> tuple[list[Path], list[Path]]:
    with S.open_split_set(src_first) as s:
        record = json.loads(json.dumps(s.layout()))  # through JSON, as a .hrry stores it
        paths = S.write_set(out, record, s.model_kv(), data_from(s), **kw)
        return s.paths, paths


@pytest.mark.parametrize("prefix", sorted(SETS))
def test_set_layout_round_trip_is_byte_identical(fixtures_dir, tmp_path, prefix):
    src, written = _rewrite(shard_files(fixtures_dir, prefix, 3)[2], tmp_path / f"{prefix}.gguf")
    assert [p.name for p in written] == [p.name for p in src]
    for a, b in zip(src, written):
        assert a.read_bytes() == b.read_bytes(), b.name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in written)  # no temporaries


def test_gguf_py_sets_round_trip_byte_identical(tmp_path):
    defs = [TensorDef(f"t.{i}", t, (3, 64)) for i, t in enumerate(["Q8_0", "Q4_1", "F32", "BF16", "Q5_0", "F16", "I32"])]
    kv = [("general.name", "m", VT.STRING), ("m.list", [1, 2, 3], VT.ARRAY, VT.UINT64)]
    for name, kw in [("a", {"split_max_size": 700}), ("b", {"split_max_tensors": 2, "small_first_shard": True}),
                     ("c", {"split_max_tensors": 3})]:
        src = tmp_path / "src" / name
        src.mkdir(parents=True)
        write_gguf_py(src / f"{name}.gguf", defs, kv=kv, **kw)
        shards = sorted(src.glob("*.gguf"))
        dst = tmp_path / "out" / name
        dst.mkdir(parents=True)
        _, written = _rewrite(shards[0], dst / f"{name}-00001-of-{len(shards):05d}.gguf")
        assert [p.read_bytes() for p in written] == [p.read_bytes() for p in shards], name


def test_gguf_py_custom_alignment_sets_are_refused(tmp_path):
    # gguf-py 0.19.0 pads every shard to its custom alignment but writes general.alignment into
    # the first shard only: the others read (by llama.cpp too) with the default 32 do not fit
    defs = [TensorDef(f"t.{i}", "F32", (3,)) for i in range(4)]
    write_gguf_py(tmp_path / "c.gguf", defs, split_max_tensors=2, alignment=64)
    with pytest.raises(FormatError, match=r"c-00002-of-00002\.gguf: trailing data at offset \d+: \d+ bytes follow"):
        S.open_split_set(tmp_path / "c-00001-of-00002.gguf")


def test_exported_set_must_not_replace_its_input(fixtures_dir, tmp_path):
    files = copy_set(fixtures_dir, tmp_path)
    with pytest.raises(UsageError, match="same file as the input"):
        _rewrite(files[0], files[0], force=True, inputs=files)


def test_merge_loads_in_gguf_py_with_identical_tensors_and_metadata(fixtures_dir, tmp_path):
    for prefix in SETS:
        paths = shard_files(fixtures_dir, prefix, 3)
        with S.open_split_set(paths[0]) as s:
            (out,) = S.write_set(tmp_path / f"{prefix}.gguf", s.layout(), s.model_kv(), data_from(s), merge=True)
        assert reader_tensors([out]) == reader_tensors(paths)
        merged, first = reader_fields(out), reader_fields(paths[0])
        # gguf-split --merge: the first shard's metadata, split.count set to 0 and moved to the end
        assert list(merged) == [k for k in first if k != "split.count"] + ["split.count"]
        assert merged["split.count"] == ([int(VT.UINT16)], [struct.pack("<H", 0)])
        assert all(merged[k] == first[k] for k in first if k != "split.count")
        assert S.open_split_set(out) is None  # a whole model, not a shard
        with G.read_gguf(out) as gf:
            assert gf.version == 3 and gf.ends_padded and gf.canonical_layout


def test_single_file_to_new_set_and_back(fixtures_dir, tmp_path):
    src = fixtures_dir / "tiny-llama.gguf"
    with G.read_gguf(src) as gf:
        rows = [(t.name, t.type_name, t.ne) for t in gf.tensors]
        plan = S.plan_split([t.nbytes for t in gf.tensors], max_size=S.parse_split_size("1M") // 40)
        lay = S.new_split_layout(gf.kv, rows, plan, alignment=gf.alignment, prefix="tiny")
        by_name = {t.name: t.data for t in gf.tensors}
        paths = S.write_set(tmp_path / "tiny.gguf", lay, dict(gf.kv), by_name.__getitem__)
    assert len(paths) == len(plan) > 2
    assert reader_tensors(paths) == reader_tensors([src])
    for i, p in enumerate(paths):  # every shard loads on its own, with gguf-split's key order
        keys = list(reader_fields(p))
        assert keys[-3:] == ["split.no", "split.tensors.count", "split.count"] and (i == 0 or len(keys) == 3)
    with S.open_split_set(paths[1]) as s:
        assert s.count == len(plan) and [len(gf.tensors) for gf in s.shards] == [len(a) for a in plan]
        (merged,) = S.write_set(tmp_path / "merged.gguf", s.layout(), s.model_kv(), data_from(s), merge=True)
    assert reader_tensors([merged]) == reader_tensors([src])
    fields, orig = reader_fields(merged), reader_fields(src)
    assert {k: v for k, v in fields.items() if not k.startswith("split.")} == orig
    assert list(fields)[: len(orig)] == list(orig)


def test_retyped_tensor_relays_only_its_shard(fixtures_dir, tmp_path):
    paths = shard_files(fixtures_dir, "tiny-split", 3)
    with S.open_split_set(paths[0]) as s:
        _, t = s.tensor("blk.0.attn_k.weight")  # F16 in shard 2
        as_f32 = t.array().astype(np.float32)
        lay = S.SplitLayout.from_json(s.layout()).with_tensor_types({t.name: ("F32", t.ne)})

        def data_for(name):
            return as_f32 if name == t.name else s.tensor_data(name)

        written = S.write_set(tmp_path / "m.gguf", lay, s.model_kv(), data_for)
    assert [written[i].read_bytes() == paths[i].read_bytes() for i in range(3)] == [True, False, True]
    got = {n: (ty, data) for n, ty, _, data in reader_tensors(written)}
    assert got[t.name] == ("F32", as_f32.tobytes())
    assert {n: v for n, v in got.items() if n != t.name} == {n: (ty, d) for n, ty, _, d in reader_tensors(paths) if n != t.name}
    with pytest.raises(UsageError, match="no tensor named 'nope'"):
        lay.with_tensor_types({"nope": ("F32", (1,))})


def test_model_metadata_must_match_the_layout(fixtures_dir, tmp_path):
    with S.open_split_set(shard_files(fixtures_dir, "tiny-split", 3)[0]) as s:
        kv = s.model_kv()
        extra = dict(kv, **{"general.extra": G.GGUFValue.of(VT.UINT8, 1)})
        with pytest.raises(UsageError, match="'general.extra' has no place in the recorded layout"):
            S.write_set(tmp_path / "o.gguf", s.layout(), extra, data_from(s))
        with pytest.raises(UsageError, match="must not hold 'split.no'"):
            S.write_set(tmp_path / "o.gguf", s.layout(), dict(kv, **dict(S.split_entries(0, 1, 1))), data_from(s), merge=True)
        kv.pop("general.name")
        with pytest.raises(UsageError, match="places metadata 'general.name', which the model does not have"):
            S.write_set(tmp_path / "o.gguf", s.layout(), kv, data_from(s))
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------
# all or nothing
# --------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_interrupted_set_write_leaves_no_shard(fixtures_dir, tmp_path, exc):
    with S.open_split_set(shard_files(fixtures_dir, "tiny-split", 3)[0]) as s:
        second = s.shards[1].tensors[1].name

        def data_for(name):
            if name == second:
                raise exc
            return s.tensor_data(name)

        out = tmp_path / "out"
        out.mkdir()
        with pytest.raises(type(exc)):
            S.write_set(out / "m.gguf", s.layout(), s.model_kv(), data_for)
    assert list(out.iterdir()) == []  # no shard under its final name, no temporary file


def test_existing_set_is_kept_unless_forced(fixtures_dir, tmp_path, count_opens):
    out = tmp_path / "out"
    out.mkdir()
    (out / "m-00003-of-00003.gguf").write_bytes(b"keep me")
    with S.open_split_set(shard_files(fixtures_dir, "tiny-split", 3)[0]) as s:
        written = []
        with pytest.raises(OutputExistsError, match=r"m-00003-of-00003\.gguf: output exists"):
            S.write_set(out / "m.gguf", s.layout(), s.model_kv(), lambda n: written.append(n) or s.tensor_data(n))
        assert written == []  # every destination was checked before anything was written
        assert sorted(p.name for p in out.iterdir()) == ["m-00003-of-00003.gguf"]
        assert (out / "m-00003-of-00003.gguf").read_bytes() == b"keep me"
        S.write_set(out / "m.gguf", s.layout(), s.model_kv(), data_from(s), force=True)
        assert (out / "m-00003-of-00003.gguf").read_bytes() == s.paths[2].read_bytes()


def test_writing_beside_another_set_with_the_same_prefix_is_refused(fixtures_dir, tmp_path):
    (tmp_path / "m-00001-of-00002.gguf").write_bytes(b"other set")
    with S.open_split_set(shard_files(fixtures_dir, "tiny-split", 3)[0]) as s:
        with pytest.raises(UsageError, match=r"m-00001-of-00002\.gguf: belongs to another set"):
            S.write_set(tmp_path / "m.gguf", s.layout(), s.model_kv(), data_from(s), force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m-00001-of-00002.gguf"]


def test_progress_covers_the_whole_set(fixtures_dir, tmp_path):
    seen = []
    with S.open_split_set(shard_files(fixtures_dir, "tiny-split", 3)[0]) as s:
        S.write_set(tmp_path / "m.gguf", s.layout(), s.model_kv(), data_from(s), progress=lambda d, t: seen.append((d, t)))
        total = sum(t.nbytes for _, t in s.tensors)
    assert len(seen) == 8 and seen[-1] == (total, total) and all(a[0] < b[0] for a, b in zip(seen, seen[1:]))
