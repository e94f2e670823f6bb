"""GGUF -> GGUF in one step (docs/conversion-rules.md § 10): ``convert SHARD merged.gguf
--merge``, ``convert MODEL OUT.gguf --split-max-tensors N | --split-max-size SIZE`` and a set
split again, without a Hurray file, every tensor copied by the kernel.

Oracles: gguf-py's GGUFWriter writes the expected files independently of our writer --
the merge as gguf-split --merge defines it (the first shard's metadata, ``split.count`` = 0
moved to the end, every tensor in set order, version 3, padded), and the split sets with
the split keys in gguf-split's order (``no, tensors.count, count``) --; gguf-py's reader;
and the two-step route through a .hrry, proven against the same rules
(tests/test_split_convert.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fuzzing import run_cli
from gguf_factory import TensorDef, write_gguf_py
from hurray_interop._convert import convert
from hurray_interop.files.positional import PositionalWriter
from hurray_interop.formats import gguf as G
from test_gguf_split import copy_set, reader_tensors, shard_files
from test_split_convert import BAD_SETS

gguf = pytest.importorskip("gguf")
VT = G.ValueType
DEFS = [TensorDef(f"blk.{i}.w", t, (4, 64)) for i, t in enumerate(["F32", "Q8_0", "F16", "Q4_0", "Q5_1", "MXFP4", "F32"])]
KV = [("general.name", "relayout", VT.STRING)]


def cli(*argv: object) -> tuple[int, str, str]:
    return run_cli([str(a) for a in argv])


class SplitKeyOrder(gguf.GGUFWriter):
    """gguf-py's writer with the split keys in gguf-split's order (its ``split.count`` is set twice)."""

    def add_shard_kv_data(self) -> None:
        super().add_shard_kv_data()
        for kv in self.kv_data:
            kv[gguf.Keys.Split.LLM_KV_SPLIT_COUNT] = kv.pop(gguf.Keys.Split.LLM_KV_SPLIT_COUNT)


def gguf_py(path: Path, **split: object) -> list[Path]:
    """The 7 tensors written by gguf-py (a set beside ``path`` when ``split`` asks for one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_gguf_py(path, DEFS, kv=KV, **split)  # type: ignore[arg-type]
    return sorted(path.parent.glob(f"{path.stem}-*.gguf")) or [path]


def gguf_split_set(path: Path, n: int) -> list[Path]:
    """The set gguf-split --split-max-tensors n writes of the 7 tensors, written by gguf-py."""
    import gguf_factory

    real = gguf.GGUFWriter
    gguf_factory.gguf.GGUFWriter = SplitKeyOrder
    try:
        return gguf_py(path, split_max_tensors=n)
    finally:
        gguf_factory.gguf.GGUFWriter = real


def expected_merge(path: Path) -> bytes:
    """What gguf-split --merge writes of a set of the 7 tensors (gguf-split.cpp: the first
    shard's KV, gguf_set_val_u16(split.count, 0) moving the key to the end; tensors in set
    order), written by gguf-py alone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    split_kv = [("split.no", 0, VT.UINT16), ("split.tensors.count", len(DEFS), VT.INT32), ("split.count", 0, VT.UINT16)]
    write_gguf_py(path, DEFS, kv=KV + split_kv)
    return path.read_bytes()


def files(paths: list[Path]) -> list[tuple[str, bytes]]:
    return [(p.name, p.read_bytes()) for p in paths]


def written(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.gguf"))


# --------------------------------------------------------------------------
# byte identity against gguf-split's rules, written by gguf-py
# --------------------------------------------------------------------------


@pytest.mark.parametrize("split", [{"split_max_tensors": 2}, {"split_max_tensors": 3, "small_first_shard": True},
                                   {"split_max_size": 1100}, {"split_max_tensors": 1}])
@pytest.mark.parametrize("given", [0, -1])
def test_merge_of_a_gguf_py_set_is_what_gguf_split_merge_writes(tmp_path, split, given):
    src = gguf_py(tmp_path / "src" / "m.gguf", **split)
    assert len(src) > 1
    before = files(src)
    out = tmp_path / "out" / "merged.gguf"
    out.parent.mkdir()
    assert cli("convert", src[given], out, "--merge", "-q")[0] == 0
    assert out.read_bytes() == expected_merge(tmp_path / "exp" / "e.gguf")
    assert files(src) == before  # the input untouched
    assert written(out.parent) == [out]


@pytest.mark.parametrize("n", [1, 2, 3, 6])
@pytest.mark.parametrize("source", ["file", "set"])
def test_split_is_what_gguf_split_writes(tmp_path, n, source):
    src = gguf_py(tmp_path / "src" / "m.gguf") if source == "file" else gguf_py(tmp_path / "src" / "m.gguf", split_max_tensors=4)
    expected = gguf_split_set(tmp_path / "exp" / "out.gguf", n)
    out = tmp_path / "out"
    out.mkdir()
    assert cli("convert", src[-1], out / "out.gguf", "--split-max-tensors", n, "-q")[0] == 0
    assert files(written(out)) == files(expected)


def test_split_max_size_follows_gguf_split(tmp_path):
    """gguf-split starts a shard where the next tensor (padded to 32) would pass SIZE: the
    first two tensors' bytes -1/0/+1 (in bytes through the API: the CLI's unit is 10^6)."""
    src = gguf_py(tmp_path / "src" / "m.gguf")
    sizes = [-(-G.tensor_nbytes(d.type, tuple(reversed(d.shape))) // 32) * 32 for d in DEFS]
    limit = sizes[0] + sizes[1]
    out = tmp_path / "out"
    for size, first in [(limit - 1, 1), (limit, 2), (limit + 1, 2)]:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        convert(src[0], out / "s.gguf", split_max_size=size)
        shards = written(out)
        assert len(reader_tensors(shards[:1])) == first, size
        assert [t[0] for t in reader_tensors(shards)] == [d.name for d in DEFS]


# --------------------------------------------------------------------------
# round trips and the two-step route through a .hrry
# --------------------------------------------------------------------------


def _fixture_sets(fixtures_dir: Path, tmp_path: Path) -> dict[str, list[Path]]:
    return {
        "tiny-split": copy_set(fixtures_dir, tmp_path / "a", "tiny-split"),
        "nofirst": copy_set(fixtures_dir, tmp_path / "b", "nofirst"),
        "gguf-py-size": gguf_py(tmp_path / "c" / "sized.gguf", split_max_size=1100),
    }


def test_split_merge_split_round_trips(fixtures_dir, tmp_path):
    for name, src in _fixture_sets(fixtures_dir, tmp_path / "src").items():
        d = tmp_path / name
        for sub in ("m1", "s1", "m2", "s2"):
            (d / sub).mkdir(parents=True)
        assert cli("convert", src[1], d / "m1" / "m.gguf", "--merge", "-q")[0] == 0
        assert cli("convert", d / "m1" / "m.gguf", d / "s1" / "s.gguf", "--split-max-tensors", "3", "-q")[0] == 0
        assert cli("convert", written(d / "s1")[-1], d / "m2" / "m.gguf", "--merge", "-q")[0] == 0
        assert cli("convert", d / "m2" / "m.gguf", d / "s2" / "s.gguf", "--split-max-tensors", "3", "-q")[0] == 0
        assert files(written(d / "m1")) == files(written(d / "m2")), name
        assert files(written(d / "s1")) == files(written(d / "s2")), name
        assert reader_tensors(written(d / "m1")) == reader_tensors(src), name


def _both_routes(src: Path, out: Path, *argv: object) -> tuple[list, list]:
    """Our one-step output and the two-step one through a .hrry, each in a folder of its own."""
    one, two = out / "one", out / "two"
    one.mkdir(parents=True)
    two.mkdir(parents=True)
    name = "out.gguf"
    assert cli("convert", src, one / name, *argv, "-q")[0] == 0
    hrry = out / "mid.hrry"
    assert cli("convert", src, hrry, "--fallback", "exact", "-q")[0] == 0  # K-quants: their exact forms
    assert cli("convert", hrry, two / name, *argv, "-q")[0] == 0
    return files(written(one)), files(written(two))


ROUTES = [("--merge",), ("--split-max-tensors", "1"), ("--split-max-tensors", "2"), ("--split-max-tensors", "7"),
          ("--split-max-tensors", "8"), ("--split-max-tensors", "9"), ("--split-max-size", "1M")]


@pytest.mark.parametrize("argv", ROUTES, ids=" ".join)
def test_one_step_equals_the_route_through_hurray_on_fixtures(fixtures_dir, tmp_path, argv):
    sources = dict(_fixture_sets(fixtures_dir, tmp_path / "src"))
    if argv != ("--merge",):
        for f in ("tiny-llama.gguf", "tiny-llama-kquant.gguf", "ggml-quantized-types.gguf", "kv-types.gguf"):
            sources[f] = [fixtures_dir / f]
    for name, src in sources.items():
        one, two = _both_routes(src[-1], tmp_path / name, *argv)
        assert one == two, name


def test_one_step_equals_the_route_through_hurray_on_real_files(gguf_samples_dir, tmp_path):
    """llama.cpp's own files (vocabularies: metadata, no tensors): split, then merged back."""
    samples = sorted(gguf_samples_dir.glob("*.gguf"))
    assert samples
    for src in samples:
        d = tmp_path / src.stem
        one, two = _both_routes(src, d / "split", "--split-max-tensors", "1")
        assert one == two, src.name
        first = written(d / "split" / "one")[0]
        one, two = _both_routes(first, d / "merge", "--merge")
        assert one == two, src.name
        assert reader_tensors(written(d / "merge" / "one")) == reader_tensors([src])


def test_tensor_bytes_are_copied_by_the_kernel(fixtures_dir, tmp_path, monkeypatch):
    calls = []
    real = PositionalWriter.copy

    def spy(self, fd, at, n, offset):
        calls.append(n)
        return real(self, fd, at, n, offset)

    monkeypatch.setattr(PositionalWriter, "copy", spy)
    monkeypatch.setattr(G.GGUFWriterStream, "write_tensor_data", None)  # no tensor passes through Python
    src = copy_set(fixtures_dir, tmp_path / "src")
    convert(src[0], tmp_path / "m.gguf", merge=True)
    assert sorted(calls) == sorted(t[3].__len__() for t in reader_tensors(src))
    assert not list(tmp_path.glob("*.hrry"))


# --------------------------------------------------------------------------
# the plan, existing outputs, verify
# --------------------------------------------------------------------------


def test_dry_run_names_the_shards_and_writes_nothing(fixtures_dir, tmp_path):
    src = copy_set(fixtures_dir, tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    status, text, _ = cli("convert", src[0], out / "m.gguf", "--split-max-tensors", "3", "--dry-run")
    assert status == 0
    assert "would write a split GGUF set of 3 shards" in text
    assert "m-00001-of-00003.gguf 3, m-00002-of-00003.gguf 3, m-00003-of-00003.gguf 2" in text
    status, text, _ = cli("convert", src[2], out / "m.gguf", "--merge", "--dry-run")
    assert status == 0 and "would write one merged GGUF of the 3-shard set (8 tensors)" in text
    assert list(out.iterdir()) == []


def test_existing_outputs_are_refused_without_force(fixtures_dir, tmp_path):
    src = copy_set(fixtures_dir, tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    (out / "m.gguf").write_bytes(b"old")
    (out / "s-00002-of-00003.gguf").write_bytes(b"old")
    for argv in (("m.gguf", "--merge"), ("s.gguf", "--split-max-tensors", "3")):
        status, _, err = cli("convert", src[0], out / argv[0], *argv[1:])
        assert status == 2 and err.count("\n") == 1 and "exists" in err and "force" in err, err
    assert sorted(p.read_bytes() for p in out.iterdir()) == [b"old", b"old"]
    assert cli("convert", src[0], out / "m.gguf", "--merge", "--force", "-q")[0] == 0
    assert cli("convert", src[0], out / "s.gguf", "--split-max-tensors", "3", "--force", "-q")[0] == 0
    assert reader_tensors([out / "m.gguf"]) == reader_tensors(src)
    assert reader_tensors(shard_files(out, "s", 3)) == reader_tensors(src)


def test_verify_src_dst_with_the_layout_option(fixtures_dir, tmp_path):
    """``verify SRC DST --merge`` / ``--split-max-*`` after the same ``convert``: DST is what
    that conversion writes (repeated in a temporary directory, compared shard by shard)."""
    src = copy_set(fixtures_dir, tmp_path / "src")
    merged = tmp_path / "m.gguf"
    assert cli("convert", src[1], merged, "--merge", "-q")[0] == 0
    (tmp_path / "s").mkdir()
    assert cli("convert", merged, tmp_path / "s" / "s.gguf", "--split-max-tensors", "2", "-q")[0] == 0
    status, out, err = cli("verify", src[2], merged, "--merge")
    assert status == 0 and "files byte-identical" in out, out + err
    status, out, err = cli("verify", merged, tmp_path / "s" / "s.gguf", "--split-max-tensors", "2")
    assert status == 0 and "files byte-identical" in out, out + err
    status, out, _ = cli("verify", merged, tmp_path / "s" / "s.gguf", "--split-max-tensors", "3")
    assert status == 1 and "convert's s-00001-of-00003.gguf is a shard of a split set of 3" in out, out
    assert "hurray-interop-verify" not in out  # no temporary path in the verdict
    bad = bytearray(merged.read_bytes())
    bad[-40] ^= 1  # inside the last tensor (output.weight), before the end padding
    (tmp_path / "bad.gguf").write_bytes(bytes(bad))
    status, out, _ = cli("verify", src[0], tmp_path / "bad.gguf", "--merge")
    assert status == 1 and "output.weight" in out, out
    status, _, err = cli("verify", src[0], merged, "--merge", "--fallback", "float32")
    assert status == 2 and err.count("\n") == 1, err


def test_verify_of_the_outputs_as_before(fixtures_dir, tmp_path):
    """Each output round-trips; a set against its merged file is one set and one file (exit 1,
    as for any set and file), with every tensor equal."""
    src = copy_set(fixtures_dir, tmp_path / "src")
    assert cli("convert", src[0], tmp_path / "m.gguf", "--merge", "-q")[0] == 0
    (tmp_path / "s").mkdir()
    assert cli("convert", tmp_path / "m.gguf", tmp_path / "s" / "s.gguf", "--split-max-tensors", "2", "-q")[0] == 0
    for f in (tmp_path / "m.gguf", tmp_path / "s" / "s-00004-of-00004.gguf"):
        status, out, err = cli("verify", f)
        assert status == 0 and "files byte-identical" in out, out + err
    status, out, _ = cli("verify", "--pair", src[0], tmp_path / "m.gguf", "--json")
    assert status == 1
    r = json.loads(out)[0]
    assert all(t["bytes_equal"] for t in r["tensors"]) and len(r["tensors"]) == 8
    assert any("is one file" in p for p in r["problems"])


def test_interrupted_write_leaves_nothing(fixtures_dir, tmp_path, monkeypatch):
    calls = []
    real = PositionalWriter.copy

    def failing(self, *args):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(self, *args)

    monkeypatch.setattr(PositionalWriter, "copy", failing)
    src = copy_set(fixtures_dir, tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(KeyboardInterrupt):
        convert(src[0], out / "s.gguf", split_max_tensors=2)
    assert list(out.iterdir()) == []


def test_progress_counts_every_tensor_byte(fixtures_dir, tmp_path):
    src = copy_set(fixtures_dir, tmp_path / "src")
    seen: list[tuple[int, int]] = []
    convert(src[0], tmp_path / "m.gguf", merge=True, progress=lambda done, total: seen.append((done, total)))
    total = sum(len(t[3]) for t in reader_tensors(src))
    assert seen[-1] == (total, total) and len(seen) == 8


# --------------------------------------------------------------------------
# errors: one line, exit 2, nothing written, the input untouched
# --------------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    ((), "nothing to convert (give --merge, --split-max-tensors N or --split-max-size SIZE"),
    (("--split-max-tensors", "-1"), "at least 1"),
    (("--split-max-tensors", "0"), "at least 1"),
    (("--split-max-size", "0M"), "positive whole number"),
    (("--split-max-size", "5K"), "500M"),
    (("--split-max-size", "1"), "500M"),
    (("--merge", "--split-max-tensors", "2"), "excludes"),
    (("--split-max-tensors", "2", "--split-max-size", "1M"), "exactly one"),
    (("--merge", "--fallback", "float32"), "--fallback: GGUF -> GGUF copies every tensor"),
    (("--merge", "--q4-1", "requantize"), "--q4-1: GGUF -> GGUF copies every tensor"),
    (("--merge", "--jobs", "0"), "--jobs"),
])
def test_bad_options_are_one_line(fixtures_dir, tmp_path, argv, message):
    src = copy_set(fixtures_dir, tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    status, _, err = cli("convert", src[0], out / "m.gguf", *argv)
    assert status == 2 and err.count("\n") == 1 and message in err, err
    assert list(out.iterdir()) == []


def test_merge_of_a_whole_model_is_refused(fixtures_dir, tmp_path):
    """gguf-split --merge refuses a file without split.count; so does a merged file (count 0)."""
    assert cli("convert", fixtures_dir / "tiny-llama.gguf", tmp_path / "a.gguf", "--merge")[0] == 2
    src = copy_set(fixtures_dir, tmp_path / "src")
    assert cli("convert", src[0], tmp_path / "m.gguf", "--merge", "-q")[0] == 0
    status, _, err = cli("convert", tmp_path / "m.gguf", tmp_path / "m2.gguf", "--merge")
    assert status == 2 and "m.gguf" in err and "nothing to merge" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "src"]


@pytest.mark.parametrize("n, shards", [(6, 2), (7, 1), (8, 1)])
def test_split_max_tensors_around_the_tensor_count(tmp_path, n, shards):
    """N at the tensor count -1/0/+1: gguf-split writes PREFIX-00001-of-00001.gguf for one shard."""
    src = gguf_py(tmp_path / "src" / "m.gguf")
    out = tmp_path / "out"
    out.mkdir()
    assert cli("convert", src[0], out / "s.gguf", "--split-max-tensors", n, "-q")[0] == 0
    assert [p.name for p in written(out)] == [f"s-{i:05d}-of-{shards:05d}.gguf" for i in range(1, shards + 1)]
    r = gguf.GGUFReader(str(written(out)[0]))
    assert int(r.fields["split.count"].parts[-1][0]) == shards
    assert reader_tensors(written(out)) == reader_tensors(src)


@pytest.mark.parametrize("case", sorted(BAD_SETS))
@pytest.mark.parametrize("argv", [("--merge",), ("--split-max-tensors", "2")], ids=" ".join)
def test_bad_set_is_a_located_error(fixtures_dir, tmp_path, case, argv):
    d = tmp_path / "src"
    copy_set(fixtures_dir, d)
    make, message = BAD_SETS[case]
    named, given_name = make(d)
    out = tmp_path / "out"
    out.mkdir()
    before = sorted((p.name, p.read_bytes()) for p in d.iterdir())
    status, _, err = cli("convert", d / given_name, out / "m.gguf", *argv)
    assert status == 2, err
    line = err.strip()
    assert "\n" not in line and named in line and message in line, line
    assert list(out.iterdir()) == []
    assert sorted((p.name, p.read_bytes()) for p in d.iterdir()) == before


# --------------------------------------------------------------------------
# README's one-step commands, run as written
# --------------------------------------------------------------------------


def readme_one_step_commands() -> list[list[str]]:
    """The commands of README's "GGUF → GGUF needs no .hrry" block (Split GGUF sets)."""
    import re
    import shlex

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = re.search(r"GGUF → GGUF needs no \.hrry.*?```sh\n(.*?)```", text, flags=re.S)
    assert block is not None
    return [shlex.split(line, comments=True) for line in block[1].splitlines() if line.strip()]


def test_readme_one_step_commands_run(fixtures_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fixtures").symlink_to(fixtures_dir)
    (tmp_path / "split").mkdir()
    commands = readme_one_step_commands()
    assert len(commands) == 3
    for argv in commands:
        assert argv[0] == "hurray-interop"
        status, _, err = cli(*argv[1:], "-q")
        assert status == 0, (argv, err)
    assert reader_tensors([tmp_path / "merged.gguf"]) == reader_tensors(shard_files(fixtures_dir, "tiny-split", 3))
    shards = written(tmp_path / "split")
    assert [p.name for p in shards] == [f"tiny-llama-{i:05d}-of-00007.gguf" for i in range(1, 8)]  # 27 tensors, 4 a shard
    assert reader_tensors(shards) == reader_tensors([fixtures_dir / "tiny-llama.gguf"])


def test_non_zero_padding_is_noted_and_zeroed_as_the_route_through_hurray(tmp_path):
    src = gguf_py(tmp_path / "src" / "m.gguf")[0]
    with G.read_gguf(src) as gf:
        t = gf.tensors[1]  # Q8_0 (4, 64): 272 bytes, 16 bytes of padding after it
        at = t.data_offset + t.nbytes
    data = bytearray(src.read_bytes())
    assert data[at] == 0
    data[at] = 0x5A
    src.write_bytes(bytes(data))
    report = convert(src, tmp_path / "dry.gguf", split_max_tensors=3, dry_run=True)
    assert any("non-zero" in n for n in report.notes)
    one, two = _both_routes(src, tmp_path / "routes", "--split-max-tensors", "3")
    assert one == two
    assert reader_tensors(written(tmp_path / "routes" / "one")) == reader_tensors([src])
