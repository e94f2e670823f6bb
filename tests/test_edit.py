"""``edit``: metadata changed, everything else kept -- checked against the formats' own readers
(gguf-py's GGUFReader, pyhurray, safetensors), never against our own output.

GGUF: types, values and order of every key after set/add/delete/rename, tensor data identical,
the data region re-aligned; no edits -> byte-identical (fixtures and the real samples); every
integer type's limits -1/0/+1; the parse errors, owned keys, hostile inputs and the in-place
replacement (the old inode's bytes never change; a failure leaves it intact).
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

import hurray_interop
from fuzzing import assert_cli_contract, run_cli
from hurray_interop.errors import UsageError
from hurray_interop.files import positional

FIX = Path(__file__).resolve().parents[1] / "fixtures"
TINY = FIX / "tiny-llama.gguf"
SPLIT = [FIX / f"tiny-split-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


def _fields(path: Path) -> dict[str, tuple[list[str], object]]:
    """gguf-py's reading of the metadata: key -> (type names, contents), in file order."""
    r = GGUFReader(path)
    return {f.name: ([t.name for t in f.types], f.contents()) for f in r.fields.values()
            if not f.name.startswith("GGUF.")}


def _tensors(path: Path) -> dict[str, bytes]:
    return {t.name: bytes(np.asarray(t.data).tobytes()) for t in GGUFReader(path).tensors}


def _copy(src: Path, d: Path) -> Path:
    out = d / src.name
    shutil.copyfile(src, out)
    return out


# -- no edits: byte-identical ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["tiny-llama.gguf", "kv-types.gguf", "tiny-llama-kquant.gguf",
                                  "ggml-quantized-types.gguf"])
def test_no_edits_is_byte_identical(name, tmp_path):
    out = tmp_path / "out.gguf"
    result = hurray_interop.edit(FIX / name, out)
    assert result.changes == ()
    assert out.read_bytes() == (FIX / name).read_bytes()


def test_no_edits_on_the_real_samples(gguf_samples_dir, tmp_path):
    samples = sorted(gguf_samples_dir.glob("*.gguf"))
    if not samples:
        pytest.skip(f"no .gguf in {gguf_samples_dir}")
    for p in samples:
        out = tmp_path / p.name
        hurray_interop.edit(p, out)
        assert out.read_bytes() == p.read_bytes(), p.name


@pytest.mark.parametrize("prefix", ["tiny-split", "nofirst"])  # nofirst: a first shard without tensors
def test_no_edits_on_a_split_set_copies_every_shard(prefix, tmp_path):
    shards = [FIX / f"{prefix}-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    result = hurray_interop.edit(shards[1], tmp_path / "s-00001-of-00003.gguf")
    assert [Path(p).name for p in result.outputs] == [f"s-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for src, out in zip(shards, result.outputs):
        assert Path(out).read_bytes() == src.read_bytes()


def test_version_2_is_kept(tmp_path):
    v2 = tmp_path / "v2.gguf"
    data = bytearray(TINY.read_bytes())
    data[4:8] = struct.pack("<I", 2)
    v2.write_bytes(bytes(data))
    out = tmp_path / "out.gguf"
    hurray_interop.edit(v2, out, set=["general.name=v2"])
    assert out.read_bytes()[4:8] == struct.pack("<I", 2)
    assert _fields(out)["general.name"][1] == "v2"


# -- the edits, read back by gguf-py ----------------------------------------------------------

def test_set_add_delete_rename_read_by_gguf_py(tmp_path):
    out = tmp_path / "out.gguf"
    hurray_interop.edit(TINY, out, set=["llama.context_length=8192", "general.name=new name", "x.flag=true",
                                        "x.list=[1,2,3]", "x.big=4294967296"],
                        delete=["general.file_type"], rename=["llama.vocab_size=llama.vocab"])
    before, after = _fields(TINY), _fields(out)
    expected = {}
    for k, v in before.items():
        if k == "general.file_type":
            continue
        expected["llama.vocab" if k == "llama.vocab_size" else k] = v
    expected["llama.context_length"] = (["UINT32"], 8192)  # an existing key keeps its type
    expected["general.name"] = (["STRING"], "new name")
    expected.update({"x.flag": (["BOOL"], True), "x.list": (["ARRAY", "INT32"], [1, 2, 3]), "x.big": (["INT64"], 4294967296)})
    assert list(after) == list(expected)  # order: in place, renamed in place, new ones appended
    assert after == expected
    assert _tensors(out) == _tensors(TINY)


def test_a_longer_header_realigns_the_data(tmp_path):
    out = tmp_path / "out.gguf"
    hurray_interop.edit(TINY, out, set=["x.pad=" + "p" * 13])
    r = GGUFReader(out)
    assert r.data_offset % r.alignment == 0
    assert r.data_offset != GGUFReader(TINY).data_offset
    assert _tensors(out) == _tensors(TINY)


def test_set_file_reads_the_text(tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}\n{% endfor %}", encoding="utf-8")
    out = tmp_path / "out.gguf"
    hurray_interop.edit(TINY, out, set_file=[f"tokenizer.chat_template={template}"])
    assert _fields(out)["tokenizer.chat_template"] == (["STRING"], template.read_text(encoding="utf-8"))


@pytest.mark.parametrize("spec, types, value", [
    ("k=true", ["BOOL"], True),
    ("k=false", ["BOOL"], False),
    ("k=7", ["INT32"], 7),
    ("k=-2147483648", ["INT32"], -2147483648),
    ("k=2147483648", ["INT64"], 2147483648),
    ("k=9223372036854775808", ["UINT64"], 9223372036854775808),
    ("k=1.5", ["FLOAT32"], 1.5),
    ("k=1e3", ["FLOAT32"], 1000.0),
    ("k=hello", ["STRING"], "hello"),
    ("k=", ["STRING"], ""),
    ("k=True", ["STRING"], "True"),
    ('k=["a","b"]', ["ARRAY", "STRING"], ["a", "b"]),
    ("k=[1,2.5]", ["ARRAY", "FLOAT32"], [1.0, 2.5]),
    ("k=[true,false]", ["ARRAY", "BOOL"], [True, False]),
    ("k=[1,5000000000]", ["ARRAY", "INT64"], [1, 5000000000]),
    ("k:STRING=true", ["STRING"], "true"),
    ("k:FLOAT64=0.1", ["FLOAT64"], 0.1),
    ("k:float32=inf", ["FLOAT32"], float("inf")),
    ("k:[UINT16]=[1,2]", ["ARRAY", "UINT16"], [1, 2]),
])
def test_types_inferred_and_given(spec, types, value, tmp_path):
    out = tmp_path / "out.gguf"
    hurray_interop.edit(TINY, out, set=[spec])
    assert _fields(out)["k"] == (types, value)


def test_an_empty_array_keeps_its_element_type(tmp_path):
    out = tmp_path / "out.gguf"
    hurray_interop.edit(TINY, out, set=["k:[STRING]=[]"])
    field = GGUFReader(out).fields["k"]  # gguf-py drops an empty array's element type: its raw parts keep it
    assert field.contents() == [] and [int(p[0]) for p in field.parts[2:5]] == [9, 8, 0]  # ARRAY, STRING, count 0


@pytest.mark.parametrize("spec, types, value", [
    ("llama.context_length=-1", ["INT32"], -1),  # does not fit the UINT32: inferred
    ("llama.rope.freq_base=2", ["FLOAT32"], 2.0),  # an integer fits a float
    ("general.name=123", ["STRING"], "123"),  # any text fits a string
    ("general.name=[INST] x", ["STRING"], "[INST] x"),  # not read as JSON
    ("general.name=[1,2]", ["STRING"], "[1,2]"),
    ("tokenizer.ggml.token_type=[1,2]", ["ARRAY", "INT32"], [1, 2]),
    ("tokenizer.ggml.add_bos_token=false", ["BOOL"], False),
])
def test_an_existing_key_keeps_its_type_when_the_value_fits(spec, types, value, tmp_path):
    out = tmp_path / "out.gguf"
    hurray_interop.edit(TINY, out, set=[spec])
    assert _fields(out)[spec.split("=")[0]] == (types, value)


INT_TYPES = [("UINT8", 0, 255), ("INT8", -128, 127), ("UINT16", 0, 65535), ("INT16", -32768, 32767),
             ("UINT32", 0, 2**32 - 1), ("INT32", -2**31, 2**31 - 1), ("UINT64", 0, 2**64 - 1),
             ("INT64", -2**63, 2**63 - 1)]


@pytest.mark.parametrize("name, lo, hi", INT_TYPES)
@pytest.mark.parametrize("edge", ["lo", "hi"])
@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_integer_limits(name, lo, hi, edge, delta, tmp_path):
    v = (lo if edge == "lo" else hi) + delta
    inside = lo <= v <= hi
    out = tmp_path / "out.gguf"
    for spec in (f"k:{name}={v}", f"k:[{name}]=[{v}]"):
        if inside:
            hurray_interop.edit(TINY, out, set=[spec], force=True)
            types, got = _fields(out)["k"]
            assert types[-1] == name and (got == v or got == [v])
        else:
            with pytest.raises(UsageError, match="out of the range of " + name):
                hurray_interop.edit(TINY, out, set=[spec], force=True)


# -- errors: one line, exit 2, nothing written, the input untouched ---------------------------

@pytest.mark.parametrize("args, pattern", [
    (["--set", "k:FOO=1"], "unknown TYPE 'FOO'"),
    (["--set", "k:UINT8=1.5"], "is not an integer"),
    (["--set", "k:BOOL=1"], "is not true or false"),
    (["--set", "k:FLOAT32=1e39"], "out of the range of FLOAT32"),
    (["--set", "k:[UINT8]={}"], "expected a JSON array"),
    (["--set", "k:[UINT8]=[1,"], "not a JSON array"),
    (["--set", "k=[1,"], "not a JSON array"),
    (["--set", 'k=[1,"a"]'], "an array of one type"),
    (["--set", "k=[[1]]"], "arrays hold strings, numbers or booleans"),
    (["--set", "k=[]"], "empty array needs its element type"),
    (["--set", "k:[STRING]=[1]"], "is not a string"),
    (["--set", "novalue"], "expected KEY=VALUE"),
    (["--set", ":UINT8=1"], "empty KEY"),
    (["--set", "k:=1"], "empty TYPE"),
    (["--delete", "nope"], "no key 'nope'"),
    (["--rename", "nope=x"], "no key 'nope'"),
    (["--rename", "general.name=general.architecture"], "exists already"),
    (["--rename", "general.name"], "expected OLD=NEW"),
    (["--set", "general.name=a", "--delete", "general.name"], "edited twice"),
    (["--set", "a=1", "--set", "a=2"], "edited twice"),
    (["--set", "split.count:UINT16=1"], "'split.count' is refused: split"),
    (["--set", "general.alignment:UINT32=64"], "'general.alignment' is refused"),
    (["--rename", "general.name=hurray_interop.x"], "'hurray_interop.x' is refused"),
    (["--set-file", "k=/nonexistent/file"], "cannot read"),
])
def test_bad_edits_exit_2_with_one_line(args, pattern, tmp_path):
    src = _copy(TINY, tmp_path)
    before = src.read_bytes()
    out = tmp_path / "out.gguf"
    status, _, err = run_cli(["edit", str(src), str(out), *args])
    assert status == 2
    assert pattern in err
    assert_cli_contract(status, err, output=out, before={src.name})
    assert src.read_bytes() == before


@pytest.mark.parametrize("argv, pattern", [
    (["edit", "SRC"], "give DST, or --in-place"),
    (["edit", "SRC", "DST.gguf", "--in-place"], "not both"),
    (["edit", "SRC", "DST.hrry"], "edit keeps the format"),
    (["edit", "SRC", "SRC"], "same file as the input"),
])
def test_usage_errors(argv, pattern, tmp_path):
    src = _copy(TINY, tmp_path)
    argv = [str(src) if a == "SRC" else str(tmp_path / a) if a.startswith("DST") else a for a in argv]
    status, _, err = run_cli(argv)
    assert status == 2 and pattern in err
    assert_cli_contract(status, err)
    assert sorted(os.listdir(tmp_path)) == [src.name]


def test_an_existing_dst_needs_force(tmp_path):
    out = tmp_path / "out.gguf"
    out.write_bytes(b"old")
    status, _, err = run_cli(["edit", str(TINY), str(out), "--set", "general.name=x"])
    assert status == 2 and "output exists" in err and out.read_bytes() == b"old"
    status, _, _ = run_cli(["edit", str(TINY), str(out), "--set", "general.name=x", "--force"])
    assert status == 0 and _fields(out)["general.name"][1] == "x"


def _hostile(tmp_path: Path) -> dict[str, bytes]:
    data = TINY.read_bytes()
    kv_count = bytearray(data)
    kv_count[16:24] = struct.pack("<Q", 2**40)
    return {"truncated": data[: len(data) // 2], "kv count": bytes(kv_count), "empty": b"",
            "not gguf": b"GGUX" + data[4:]}


@pytest.mark.parametrize("case", ["truncated", "kv count", "empty", "not gguf"])
def test_hostile_input_exits_2_and_writes_nothing(case, tmp_path):
    src = tmp_path / "bad.gguf"
    src.write_bytes(_hostile(tmp_path)[case])
    before = src.read_bytes()
    out = tmp_path / "out.gguf"
    status, _, err = run_cli(["edit", str(src), str(out), "--set", "general.name=x"])
    assert status == 2 and "bad.gguf" in err
    assert_cli_contract(status, err, output=out, before={src.name})
    assert src.read_bytes() == before


# -- in place -------------------------------------------------------------------------------

def test_in_place_replaces_the_file_and_never_touches_the_old_bytes(tmp_path):
    src = _copy(TINY, tmp_path)
    before, inode = src.read_bytes(), src.stat().st_ino
    with open(src, "rb") as old:  # the old file, as a reader that has it open sees it
        status, out, _ = run_cli(["edit", str(src), "--in-place", "--set", "general.name=in place"])
        assert status == 0 and "general.name" in out
        assert os.read(old.fileno(), len(before) + 1) == before
    assert src.stat().st_ino != inode
    assert _fields(src)["general.name"][1] == "in place"
    assert sorted(os.listdir(tmp_path)) == [src.name]


def test_a_failure_in_place_leaves_the_file_intact(tmp_path, monkeypatch):
    src = _copy(TINY, tmp_path)
    before, inode = src.read_bytes(), src.stat().st_ino

    def fail(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(positional.PositionalWriter, "copy", fail)
    status, _, err = run_cli(["edit", str(src), "--in-place", "--set", "general.name=x"])
    assert status == 2
    assert_cli_contract(status, err)
    assert src.read_bytes() == before and src.stat().st_ino == inode
    assert sorted(os.listdir(tmp_path)) == [src.name]


def test_dry_run_writes_nothing(tmp_path):
    src = _copy(TINY, tmp_path)
    status, out, _ = run_cli(["edit", str(src), "--in-place", "--dry-run", "--set", "llama.context_length=4096"])
    assert status == 0 and "UINT32 256 -> UINT32 4096" in out and "would write" in out
    assert src.read_bytes() == TINY.read_bytes()


def test_quiet_and_json(tmp_path):
    status, out, _ = run_cli(["edit", str(TINY), str(tmp_path / "a.gguf"), "--quiet", "--set", "k=1"])
    assert status == 0 and out == ""
    import json

    status, out, _ = run_cli(["edit", str(TINY), str(tmp_path / "b.gguf"), "--json", "--set", "k=1"])
    assert json.loads(out)["changes"] == [{"op": "add", "key": "k", "new": "INT32 1"}]


# -- split sets -----------------------------------------------------------------------------

def test_a_split_set_into_dst_edits_the_first_shard_and_copies_the_others(tmp_path):
    result = hurray_interop.edit(SPLIT[2], tmp_path / "s-00001-of-00003.gguf", set=["general.name=split"])
    outs = [Path(p) for p in result.outputs]
    assert _fields(outs[0])["general.name"][1] == "split"
    assert {k: v for k, v in _fields(outs[0]).items() if k != "general.name"} == \
        {k: v for k, v in _fields(SPLIT[0]).items() if k != "general.name"}
    assert _tensors(outs[0]) == _tensors(SPLIT[0])
    assert outs[1].read_bytes() == SPLIT[1].read_bytes() and outs[2].read_bytes() == SPLIT[2].read_bytes()
    with hurray_interop.open(outs[1]) as f:  # the set still opens as one model
        assert f.count == 3 and f.get("general.name") == "split"


def test_a_split_set_in_place_replaces_only_the_first_shard(tmp_path):
    shards = [_copy(p, tmp_path) for p in SPLIT]
    inodes = [p.stat().st_ino for p in shards]
    result = hurray_interop.edit(shards[1], None, in_place=True, set=["general.name=here"])
    assert result.outputs == (str(shards[0]),)
    assert shards[0].stat().st_ino != inodes[0]
    assert [p.stat().st_ino for p in shards[1:]] == inodes[1:]
    assert _fields(shards[0])["general.name"][1] == "here"


def test_a_split_set_refuses_its_split_keys(tmp_path):
    with pytest.raises(UsageError, match="split.no"):
        hurray_interop.edit(SPLIT[0], tmp_path / "s.gguf", delete=["split.no"])


# -- .hrry, read by pyhurray ------------------------------------------------------------------

@pytest.fixture(scope="module")
def hrry(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("hrry") / "tiny.hrry"
    hurray_interop.convert(TINY, p)
    return p


def test_hrry_no_edits_is_byte_identical(hrry, tmp_path):
    out = tmp_path / "out.hrry"
    hurray_interop.edit(hrry, out)
    assert out.read_bytes() == hrry.read_bytes()


def test_hrry_edits_read_by_pyhurray(hrry, tmp_path):
    import hurray

    out = tmp_path / "out.hrry"
    hurray_interop.edit(hrry, out, set=["llama.context_length=8192", "x.f=1.5", "x.u:uint64=18446744073709551615",
                                        'x.a=["p","q"]', "x.b:bytes=raw"],
                        delete=["general.name"], rename=["llama.vocab_size=llama.vocab"])
    before, after = hurray.load_kv(str(hrry)), hurray.load_kv(str(out))
    expected = {("llama.vocab" if k == "llama.vocab_size" else k): v for k, v in before.items() if k != "general.name"}
    expected.update({"llama.context_length": 8192, "x.f": 1.5, "x.u": 2**64 - 1, "x.a": ["p", "q"], "x.b": b"raw"})
    types = after.pop("hurray_interop.gguf.kv_types")  # the GGUF type record, kept in step
    expected.pop("hurray_interop.gguf.kv_types")
    assert len(types) == sum(not k.startswith("hurray_interop.") for k in after)
    assert types[-4:] == ["FLOAT64", "UINT64", "ARRAY[STRING]", "ARRAY[UINT8]"]
    assert after == expected and list(after)[:3] == ["general.architecture", "llama.context_length", "llama.embedding_length"]
    tensors_before, tensors_after = hurray.load(str(hrry)), hurray.load(str(out))
    names = lambda t: sorted(t[0] if isinstance(t, tuple) else t)  # noqa: E731
    assert names(tensors_after) == names(tensors_before)


def test_hrry_from_gguf_exports_with_its_gguf_types(hrry, tmp_path):
    out, back = tmp_path / "out.hrry", tmp_path / "back.gguf"
    hurray_interop.edit(hrry, out, set=["llama.context_length=8192", "x.new=7"], delete=["general.name"])
    hurray_interop.convert(out, back)
    fields = _fields(back)
    assert fields["llama.context_length"] == (["UINT32"], 8192)  # the recorded GGUF type kept
    assert fields["x.new"] == (["INT64"], 7) and "general.name" not in fields
    assert _tensors(back) == _tensors(TINY)


def test_hrry_delete_every_plain_key_and_its_records_are_refused(hrry, tmp_path):
    with pytest.raises(UsageError, match="'hurray_interop.gguf.version' is refused"):
        hurray_interop.edit(hrry, tmp_path / "x.hrry", delete=["hurray_interop.gguf.version"])
    with pytest.raises(UsageError, match="out of the range of int64"):
        hurray_interop.edit(hrry, tmp_path / "x.hrry", set=["k:int64=9223372036854775808"])
    assert not (tmp_path / "x.hrry").exists()


@pytest.mark.parametrize("name, lo, hi", [("int64", -2**63, 2**63 - 1), ("uint64", 0, 2**64 - 1)])
@pytest.mark.parametrize("v_at", ["lo-1", "lo", "lo+1", "hi-1", "hi", "hi+1"])
def test_hrry_integer_limits(name, lo, hi, v_at, hrry, tmp_path):
    import hurray

    base, delta = v_at[:2], int(v_at[2:] or 0)
    v = (lo if base == "lo" else hi) + delta
    out = tmp_path / "out.hrry"
    if lo <= v <= hi:
        hurray_interop.edit(hrry, out, set=[f"k:{name}={v}"])
        assert hurray.load_kv(str(out))["k"] == v
    else:
        with pytest.raises(UsageError, match=f"out of the range of {name}"):
            hurray_interop.edit(hrry, out, set=[f"k:{name}={v}"])


def test_hrry_without_a_kv_section_gets_one(tmp_path):
    import hurray

    src, out = tmp_path / "plain.hrry", tmp_path / "out.hrry"
    hurray.save(str(src), {"w": hurray.Tensor(np.arange(8, dtype=np.float32).tobytes(), hurray.float32, [8])})
    hurray_interop.edit(src, out, set=["k=v"])
    assert hurray.load_kv(str(out)) == {"k": "v"}
    loaded = hurray.load(str(out))
    assert set(loaded[0] if isinstance(loaded, tuple) else loaded) == {"w"}
    hurray_interop.edit(out, tmp_path / "again.hrry", delete=["k"])
    assert hurray.load_kv(str(tmp_path / "again.hrry")) == {}


def test_hrry_truncated_exits_2(hrry, tmp_path):
    src = tmp_path / "bad.hrry"
    src.write_bytes(hrry.read_bytes()[:-10])
    out = tmp_path / "out.hrry"
    status, _, err = run_cli(["edit", str(src), str(out), "--set", "k=v"])
    assert status == 2 and "bad.hrry" in err
    assert_cli_contract(status, err, output=out, before={src.name})


# -- safetensors, read by safetensors.safe_open -------------------------------------------------

@pytest.mark.parametrize("name", ["ct-mxfp4-tiny.safetensors", "gpt-oss-tiny.safetensors", "mxfp8-tiny.safetensors"])
def test_safetensors_no_edits_is_byte_identical(name, tmp_path):
    out = tmp_path / name
    hurray_interop.edit(FIX / name, out)
    assert out.read_bytes() == (FIX / name).read_bytes()


def _st(path: Path) -> tuple[dict[str, str] | None, dict[str, bytes]]:
    import torch
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.metadata(), {k: f.get_tensor(k).reshape(-1).view(torch.uint8).numpy().tobytes() for k in f.keys()}


def test_safetensors_edits_read_by_safe_open(tmp_path):
    src, out = FIX / "gpt-oss-tiny.safetensors", tmp_path / "out.safetensors"
    hurray_interop.edit(src, out, set=["format=np", "n=1", "j=[1,2]", "t:STRING=true"])
    meta, tensors = _st(out)
    assert meta == {"format": "np", "n": "1", "j": "[1,2]", "t": "true"}  # every value a string, verbatim
    assert tensors == _st(src)[1]
    head = out.read_bytes()
    n = int.from_bytes(head[:8], "little")
    assert n % 8 == 0 and head[8:9] == b"{" and head[8 + n - 1 : 8 + n] in (b" ", b"}")


def test_safetensors_delete_and_rename(tmp_path):
    src, out = FIX / "gpt-oss-tiny.safetensors", tmp_path / "out.safetensors"
    hurray_interop.edit(src, out, rename=["format=fmt"])
    assert _st(out)[0] == {"fmt": "pt"}
    hurray_interop.edit(src, out, delete=["format"], force=True)
    assert _st(out)[0] is None and _st(out)[1] == _st(src)[1]


def test_safetensors_refuses_other_types(tmp_path):
    out = tmp_path / "out.safetensors"
    status, _, err = run_cli(["edit", str(FIX / "gpt-oss-tiny.safetensors"), str(out), "--set", "k:UINT8=1"])
    assert status == 2 and "unknown TYPE 'UINT8' (one of STRING)" in err
    assert_cli_contract(status, err, output=out)


# -- more hostile inputs and edge cases ---------------------------------------------------------

def _st_hostile() -> dict[str, bytes]:
    data = (FIX / "gpt-oss-tiny.safetensors").read_bytes()
    n = int.from_bytes(data[:8], "little")
    return {"truncated data": data[:-7], "header length past the end": (len(data) * 2).to_bytes(8, "little") + data[8:],
            "header not JSON": data[:8] + b"[" + data[9 : 8 + n] + data[8 + n :]}


@pytest.mark.parametrize("case", list(_st_hostile()))
def test_hostile_safetensors_exits_2_and_writes_nothing(case, tmp_path):
    src = tmp_path / "bad.safetensors"
    src.write_bytes(_st_hostile()[case])
    before = src.read_bytes()
    out = tmp_path / "out.safetensors"
    status, _, err = run_cli(["edit", str(src), str(out), "--set", "k=v"])
    assert status == 2 and "bad.safetensors" in err
    assert_cli_contract(status, err, output=out, before={src.name})
    assert src.read_bytes() == before


def test_in_place_old_bytes_are_intact_at_the_rename(tmp_path, monkeypatch):
    """The moment the new file is renamed over SRC, SRC still holds every old byte."""
    from hurray_interop.files import atomic

    src = _copy(TINY, tmp_path)
    before, seen = src.read_bytes(), []
    real = atomic.os.replace

    def replace(a, b):
        seen.append(Path(b).read_bytes() == before)
        return real(a, b)

    monkeypatch.setattr(atomic.os, "replace", replace)
    hurray_interop.edit(src, in_place=True, set=["general.name=x"])
    assert seen == [True] and _fields(src)["general.name"][1] == "x"


def test_in_place_through_a_symlink_replaces_its_target(tmp_path):
    real = _copy(TINY, tmp_path)
    link = tmp_path / "link.gguf"
    link.symlink_to(real.name)
    hurray_interop.edit(link, in_place=True, set=["general.name=via link"])
    assert link.is_symlink() and _fields(real)["general.name"][1] == "via link"


def test_set_to_the_same_value_is_reported_and_byte_identical(tmp_path):
    out = tmp_path / "out.gguf"
    result = hurray_interop.edit(TINY, out, set=["llama.context_length=256"])
    assert [c.op for c in result.changes] == ["unchanged"]
    assert out.read_bytes() == TINY.read_bytes()


def test_set_file_must_be_utf8(tmp_path):
    bad = tmp_path / "t.jinja"
    bad.write_bytes(b"ok \xff")
    with pytest.raises(UsageError, match="not UTF-8 text .byte at offset 3"):
        hurray_interop.edit(TINY, tmp_path / "out.gguf", set_file=[f"k={bad}"])


def test_dry_run_checks_dst(tmp_path):
    out = tmp_path / "out.gguf"
    out.write_bytes(b"x")
    with pytest.raises(UsageError, match="output exists"):
        hurray_interop.edit(TINY, out, set=["k=1"], dry_run=True)
    assert out.read_bytes() == b"x"


@pytest.mark.parametrize("fmt", ["gguf", "hrry", "safetensors"])
def test_in_place_keeps_the_permission_bits(fmt, hrry, tmp_path):
    src = {"gguf": TINY, "hrry": hrry, "safetensors": FIX / "gpt-oss-tiny.safetensors"}[fmt]
    p = _copy(src, tmp_path)
    os.chmod(p, 0o640)
    hurray_interop.edit(p, in_place=True, set=["k.new=v"])
    assert p.stat().st_mode & 0o7777 == 0o640
    out = tmp_path / ("copy." + p.suffix.lstrip("."))
    hurray_interop.edit(p, out)
    assert out.stat().st_mode & 0o7777 == 0o666 & ~_umask()


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old
