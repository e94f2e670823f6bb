"""Bytes of a GGUF that no tensor holds come back byte for byte (docs/conversion-rules.md § 7).

GGUF allows gaps between tensors, and its padding is zero only by convention. An import
records the bytes there that are not zero (``hurray_interop.gguf.padding``, at most
``MAX_PADDING_BYTES``) and the export writes them back, so such a file round-trips
byte-identically (``verify`` exit 0) instead of converting "exact" and coming back
different. Beyond the limit the conversion is refused (exit 1, nothing written), at
limit − 1, limit and limit + 1. An export to a new layout (--merge, --split-max-*, changed
tensor sizes) cannot write them back: it says so, and verify claims no byte identity.
The record is input too: a broken one is a located error.

Oracles: the source file's own bytes, and gguf-py's reader for the tensor offsets.
"""

from __future__ import annotations

import json
import re

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from hurray_interop.cli import main
from hurray_interop.conversions import gguf as conv
from hurray_interop.conversions.gguf import gguf_to_hurray, hurray_to_gguf
from hurray_interop.core.hrry import HrryFile, HrryWriter
from hurray_interop.core.kv import KVValue
from hurray_interop.core.records import decode_byte_runs, encode_byte_runs
from hurray_interop.errors import ConversionRefused, FormatError, UsageError
from hurray_interop.formats import gguf as G

VT = G.ValueType
LIMIT = conv.MAX_PADDING_BYTES
ALIGN = 32


def data_spans(path: Path) -> list[tuple[int, int]]:
    import gguf

    r = gguf.GGUFReader(str(path))
    spans = sorted((int(t.data_offset), int(t.data_offset) + int(t.n_bytes)) for t in r.tensors if int(t.n_bytes))
    meta_end = int(r.data_offset)  # gguf-py: where the data section starts
    del r
    return [(meta_end, meta_end)] + spans


def with_junk(src: Path, dst: Path, patches: dict[int, bytes]) -> Path:
    raw = bytearray(src.read_bytes())
    for at, b in patches.items():
        raw[at : at + len(b)] = b
    dst.write_bytes(bytes(raw))
    return dst


def round_trip(src: Path, tmp: Path) -> bytes:
    h = tmp / (src.stem + ".hrry")
    gguf_to_hurray(src, h)
    out = tmp / (src.stem + ".back.gguf")
    hurray_to_gguf(h, out)
    return out.read_bytes()


@pytest.fixture()
def junk_model(fixtures_dir: Path, tmp_path: Path) -> Path:
    """tiny-llama with junk in a gap between two tensors (both ends of it), in the padding
    before the first tensor and in the end padding."""
    src = fixtures_dir / "tiny-llama.gguf"
    spans = data_spans(src)
    gap = next((a_end, b) for (_, a_end), (b, _) in zip(spans[1:], spans[2:]) if b > a_end)
    size = src.stat().st_size
    assert size > spans[-1][1], "the fixture ends padded"
    with G.read_gguf(src) as f:
        header_pad = f.metadata_end
        assert f.data_offset > header_pad and not f.nonzero_padding
    return with_junk(src, tmp_path / "junk.gguf", {
        gap[0]: b"\xaa", gap[1] - 1: b"\x55", header_pad: b"\x11\x00\x12", spans[-1][1]: b"\xee", size - 1: b"\x01",
    })


def test_junk_in_gaps_and_padding_round_trips_byte_identical(junk_model: Path, tmp_path: Path) -> None:
    with G.read_gguf(junk_model) as f:
        assert len(f.nonzero_padding) == 3  # the reader sees three regions that are not zero
    assert round_trip(junk_model, tmp_path) == junk_model.read_bytes()
    with HrryFile(tmp_path / "junk.hrry") as hf:
        runs = decode_byte_runs(hf.kv[conv.K_PADDING].value)
    assert [(p, len(b)) for p, _, b in runs] == [(0, 3), (0, 16), (0, 8)]  # trimmed to first..last non-zero byte


def test_cli_convert_and_verify_of_junk_padding(junk_model: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    h = tmp_path / "j.hrry"
    assert main(["convert", str(junk_model), str(h)]) == 0
    assert "27 non-zero byte(s) of padding and gaps between tensors recorded" in capsys.readouterr().out
    assert main(["verify", str(junk_model)]) == 0
    assert "files byte-identical" in capsys.readouterr().out
    assert main(["verify", str(junk_model), str(h)]) == 0
    assert "files byte-identical" in capsys.readouterr().out


def test_clean_files_get_no_padding_record(fixtures_dir: Path, tmp_path: Path) -> None:
    h = tmp_path / "m.hrry"
    gguf_to_hurray(fixtures_dir / "tiny-llama.gguf", h)
    with HrryFile(h) as hf:
        assert conv.K_PADDING not in hf.kv


def gapped_model(path: Path, gap: int) -> tuple[Path, int]:
    """Two F32 tensors of 2 MiB each with ``gap`` bytes (a multiple of 32) between them;
    returns the file and the absolute offset where the gap starts."""
    n = 1 << 19
    specs = [G.TensorSpec("a", 0, (n,), 0), G.TensorSpec("b", 0, (n,), 4 * n + gap)]
    kv = [("general.architecture", G.GGUFValue.of(VT.STRING, "test"))]
    with G.GGUFWriterStream(path, kv=kv, tensors=specs) as w:
        w.write_tensor_data(np.full(n, 1.5, np.float32))
        w.write_tensor_data(np.full(n, -2.0, np.float32))
    with G.read_gguf(path) as f:
        return path, f.data_offset + 4 * n


@pytest.mark.parametrize("length", [LIMIT - 1, LIMIT, LIMIT + 1])
def test_junk_at_the_record_limit(tmp_path: Path, length: int, capsys: pytest.CaptureFixture[str]) -> None:
    src, start = gapped_model(tmp_path / "g.gguf", LIMIT + 64)
    raw = bytearray(src.read_bytes())
    raw[start] = raw[start + length - 1] = 0xFF  # first .. last non-zero byte: ``length`` bytes recorded
    src.write_bytes(bytes(raw))
    h = tmp_path / "g.hrry"
    if length <= LIMIT:
        assert round_trip(src, tmp_path) == bytes(raw)
        return
    with pytest.raises(ConversionRefused, match=f"{length} bytes of padding and gaps between tensors are not zero "
                                                f"\\(the limit is passed in the region at offset {start}\\): more than the {LIMIT} bytes") as e:
        gguf_to_hurray(src, h)
    assert str(src) in str(e.value)
    assert not h.exists() and not list(tmp_path.glob(".*.tmp"))
    assert main(["convert", str(src), str(h)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "more than the" in err and not h.exists()
    assert main(["convert", "--dry-run", str(src), str(h)]) == 1  # the plan says the conversion would be refused
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("would refuse: ") and "more than the" in last, last
    assert main(["convert", "--dry-run", "--json", str(src), str(h)]) == 1
    assert "more than the" in json.loads(capsys.readouterr().out)["refusal"]
    assert main(["inspect", str(src)]) == 0  # inspect describes the file; its notes say what convert would do
    assert "the conversion would be refused: " in capsys.readouterr().out
    assert main(["verify", str(src)]) == 1  # the round trip fails, saying why
    assert f"FAILED {src}: round-trip, {length} bytes of padding" in capsys.readouterr().out


def junk_split_set(fixtures_dir: Path, tmp_path: Path) -> tuple[Path, Path, int]:
    """The 3-shard fixture set with one junk byte in the padding of its second shard, and its
    import: ``(folder of the set, the .hrry, offset of the junk byte)``."""
    src = tmp_path / "in"
    src.mkdir()
    for p in fixtures_dir.glob("tiny-split-0000?-of-00003.gguf"):
        shutil.copy(p, src / p.name)
    second = src / "tiny-split-00002-of-00003.gguf"
    with G.read_gguf(second) as f:
        pad = f.metadata_end  # the padding before its first tensor
        assert f.data_offset > pad
    with_junk(second, second, {pad: b"\x7a"})
    h = tmp_path / "s.hrry"
    gguf_to_hurray(src / "tiny-split-00001-of-00003.gguf", h)
    return src, h, pad


def test_split_set_shard_padding_round_trips(fixtures_dir: Path, tmp_path: Path) -> None:
    src, h, pad = junk_split_set(fixtures_dir, tmp_path)
    second = src / "tiny-split-00002-of-00003.gguf"
    with HrryFile(h) as hf:
        assert [(p, o) for p, o, _ in decode_byte_runs(hf.kv[conv.K_PADDING].value)] == [(1, pad)]
    out = tmp_path / "out"
    out.mkdir()
    hurray_to_gguf(h, out / "tiny-split-00001-of-00003.gguf")
    for p in sorted(src.iterdir()):
        assert (out / p.name).read_bytes() == p.read_bytes(), p.name
    merged = tmp_path / "merged.gguf"
    hurray_to_gguf(h, merged, merge=True)  # another layout: the padding record does not apply, no error
    assert merged.exists()
    assert main(["verify", str(second)]) == 0  # the set's round trip: every shard byte for byte


# --- an export that writes a new layout cannot put the recorded bytes back: it says so ----------


@pytest.mark.parametrize("opts,why", [(["--merge"], "--merge writes a new layout"),
                                      (["--split-max-tensors", "5"], "--split-max-\\* writes a new layout")])
def test_new_layout_export_says_the_padding_is_not_restored(fixtures_dir: Path, tmp_path: Path, opts: list[str],
                                                            why: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, h, _ = junk_split_set(fixtures_dir, tmp_path)
    out = tmp_path / "new.gguf"
    for dry in (["--dry-run"], []):
        assert main(["convert", *dry, *opts, str(h), str(out)]) == 0
        assert re.search(rf"^note: 1 recorded non-zero padding byte\(s\) not restored \({conv.K_PADDING}\): {why}; "
                         "zeros are written there, so the output is not byte-identical", capsys.readouterr().out, re.M)
    written = sorted(tmp_path.glob("new*.gguf"))
    assert written
    for p in written:  # zeros where the source had its junk byte
        with G.read_gguf(p) as f:
            assert not f.nonzero_padding, p
    assert main(["verify", str(h), str(written[0]), *opts]) == 0  # the export's tensors match, exactly
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("OK") and "byte-identical" not in last, last


def test_recorded_layout_export_restores_the_padding_without_a_note(fixtures_dir: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    src, h, _ = junk_split_set(fixtures_dir, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    assert main(["convert", str(h), str(out / "tiny-split-00001-of-00003.gguf")]) == 0
    assert "not restored" not in capsys.readouterr().out
    assert main(["verify", str(h), str(src / "tiny-split-00001-of-00003.gguf")]) == 0
    assert "files byte-identical" in capsys.readouterr().out


def test_single_file_split_export_says_the_padding_is_not_restored(junk_model: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    h = tmp_path / "j.hrry"
    gguf_to_hurray(junk_model, h)
    assert main(["convert", "--split-max-tensors", "100", str(h), str(tmp_path / "o.gguf")]) == 0
    assert ("27 recorded non-zero padding byte(s) not restored (hurray_interop.gguf.padding): --split-max-* writes "
            "a new layout") in capsys.readouterr().out
    assert main(["convert", "--merge", str(h), str(tmp_path / "m.gguf")]) == 0  # one file: the recorded layout
    assert "not restored" not in capsys.readouterr().out
    assert (tmp_path / "m.gguf").read_bytes() == junk_model.read_bytes()


def test_changed_tensor_sizes_export_says_the_padding_is_not_restored(junk_model: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A record that says a float32 tensor was F16 (as if imported from F16): the export
    writes F32 (value-exact), the recorded offsets no longer fit, the layout is new."""
    h = tmp_path / "j.hrry"
    gguf_to_hurray(junk_model, h)
    with HrryFile(h) as hf:
        kv = dict(hf.kv)
        rows = json.loads(kv[conv.K_TENSORS].value)
        next(r for r in rows if r[1] == "F32")[1] = "F16"
        kv[conv.K_TENSORS] = KVValue.string(json.dumps(rows))
        with HrryWriter(tmp_path / "k.hrry") as w:
            for n in hf.top_level_names():
                w.write_tensor(hf.tensor(n))
            w.finish(kv)
    out = tmp_path / "k.gguf"
    assert main(["convert", str(tmp_path / "k.hrry"), str(out)]) == 0
    assert ("27 recorded non-zero padding byte(s) not restored (hurray_interop.gguf.padding): the tensors' sizes "
            "differ from the recorded ones") in capsys.readouterr().out
    with G.read_gguf(out) as f:
        assert not f.nonzero_padding
    assert main(["verify", str(tmp_path / "k.hrry"), str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("OK") and "byte-identical" not in last, last


def test_refusal_beyond_the_limit_names_the_shard_that_passes_it(tmp_path: Path) -> None:
    """In a split set the refusal names the shard where the count passes the limit (not the
    shard of the first non-zero byte)."""
    from types import SimpleNamespace

    def region(n: int) -> np.ndarray:
        g = np.zeros(n, np.uint8)
        g[0] = g[-1] = 1
        return g
    shards = [SimpleNamespace(path=str(tmp_path / f"s-0000{i}-of-00003.gguf"), nonzero_padding=p)
              for i, p in ((1, {100: region(10)}), (2, {}), (3, {200: region(LIMIT - 9)}))]
    gf = SimpleNamespace(split_set=object(), shards=shards, path=shards[0].path, nonzero_padding=True)
    with pytest.raises(ConversionRefused, match="the limit is passed in the region at offset 200") as e:
        conv._padding_runs(gf)
    assert e.value.path == shards[2].path
    shards[2].nonzero_padding = {200: region(LIMIT - 10)}  # exactly the limit: recorded
    assert [(p, o, b.size) for p, o, b in conv._padding_runs(gf)] == [(0, 100, 10), (2, 200, LIMIT - 10)]


# --- the record is input: broken ones are located errors --------------------------------------


def rewrite_kv(src: Path, dst: Path, value: KVValue) -> Path:
    with HrryFile(src) as hf:
        kv = dict(hf.kv)
        kv[conv.K_PADDING] = value
        with HrryWriter(dst) as w:
            for n in hf.top_level_names():
                w.write_tensor(hf.tensor(n))
            w.finish(kv)
    return dst


@pytest.fixture()
def junk_hrry(junk_model: Path, tmp_path: Path) -> tuple[Path, list]:
    h = tmp_path / "base.hrry"
    gguf_to_hurray(junk_model, h)
    with HrryFile(h) as hf:
        runs = [(p, o, bytes(b)) for p, o, b in decode_byte_runs(hf.kv[conv.K_PADDING].value)]
    return h, runs


def test_broken_padding_records_are_located_errors(junk_hrry: tuple[Path, list], tmp_path: Path) -> None:
    h, runs = junk_hrry
    (p0, o0, b0), (p1, o1, b1), _ = runs
    cases = {
        "truncated": KVValue.bytes(encode_byte_runs(runs)[:-1]),
        "header cut": KVValue.bytes(encode_byte_runs(runs) + b"\0" * 5),
        "overlapping": KVValue.bytes(encode_byte_runs([(p0, o0, b0), (p1, o0 + 1, b1)])),
        "empty run": KVValue.bytes(encode_byte_runs([(p0, o0, b"")])),
        "into tensor data": KVValue.bytes(encode_byte_runs([(p1, o1, b1 + b"\x01")])),  # one byte past the gap
        "shard of a single file": KVValue.bytes(encode_byte_runs([(1, o0, b0)])),
        "not bytes": KVValue.string("x"),
        "over the limit": KVValue.bytes(encode_byte_runs([(0, o0, b"\x01" * (LIMIT + 1))])),
    }
    wrong = []
    for case, value in cases.items():
        bad = rewrite_kv(h, tmp_path / f"{case}.hrry", value)
        out = tmp_path / f"{case}.gguf"
        try:
            hurray_to_gguf(bad, out)
            wrong.append(f"{case}: accepted")
        except FormatError as e:
            if str(bad) not in str(e) or "hurray_interop.gguf" not in str(e):
                wrong.append(f"{case}: {e}")
        assert not out.exists(), case
    assert not wrong, "\n".join(wrong)
    exact = rewrite_kv(h, tmp_path / "exact.hrry", KVValue.bytes(encode_byte_runs([(p1, o1, b1)])))
    hurray_to_gguf(exact, tmp_path / "exact.gguf")  # a run that ends exactly at the next tensor is fine


def test_padding_record_naming_a_shard_past_the_set_is_a_located_error(fixtures_dir: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    _, h, pad = junk_split_set(fixtures_dir, tmp_path)
    bad = rewrite_kv(h, tmp_path / "bad.hrry", KVValue.bytes(encode_byte_runs([(3, pad, b"\x7a")])))
    out = tmp_path / "out"
    out.mkdir()
    assert main(["convert", str(bad), str(out / "x.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err and conv.K_PADDING in err, err
    assert "names shard 4 of a 3-shard set" in err, err
    assert not list(out.iterdir())


def test_byte_runs_record_round_trips_and_checks() -> None:
    runs = [(0, 5, b"\x01"), (0, 6, b"\x02\x03"), (2, 0, b"\xff")]
    assert [(p, o, bytes(b)) for p, o, b in decode_byte_runs(encode_byte_runs(runs))] == runs
    assert decode_byte_runs(b"") == []
    raw = encode_byte_runs(runs)
    for bad, says in ((raw[:-1], "claims 1 bytes, 0 remain"), (raw + b"\0", "truncated"),
                      (encode_byte_runs([(0, 5, b"\x01\x02"), (0, 6, b"\x03")]), "overlaps"),
                      (encode_byte_runs([(1, 0, b"\x01"), (0, 9, b"\x03")]), "precedes")):
        with pytest.raises(FormatError, match=says):
            decode_byte_runs(bad, key="k")
    assert struct.calcsize("<IQQ") == 20


def test_writer_refuses_padding_overrides_outside_the_padding(tmp_path: Path) -> None:
    specs = [G.TensorSpec("a", 0, (8,), 0), G.TensorSpec("b", 0, (4,), 64)]  # data [0, 32) and [64, 80)
    w = G.GGUFWriterStream(tmp_path / "probe.gguf", tensors=specs)
    start, meta_end = w.data_offset, w.metadata_end
    w.abort()
    assert start > meta_end
    # the padding: [meta_end, start), the gap [start + 32, start + 64), the end [start + 80, start + 96)
    ok = {meta_end: b"\x01", start + 32: b"\x02" * 32, start + 95: b"\x03"}
    with G.GGUFWriterStream(tmp_path / "ok.gguf", tensors=specs, padding=ok) as w:
        w.write_tensor_data(np.ones(8, np.float32))
        w.write_tensor_data(np.ones(4, np.float32))
    raw = (tmp_path / "ok.gguf").read_bytes()
    assert len(raw) == start + 96 and all(raw[o : o + len(b)] == b for o, b in ok.items())
    with G.read_gguf(tmp_path / "ok.gguf") as f:
        assert set(f.nonzero_padding) == {meta_end, start + 32, start + 80}
    for bad in ({start - 1: b"\x01\x01"}, {start + 31: b"\x01"}, {start + 32: b"\x02" * 33}, {start + 95: b"\x01\x01"},
                {start + 40: b"\x01\x02", start + 41: b"\x03"}, {start + 33: b""}):
        with pytest.raises(UsageError, match="is not inside the padding"):
            G.GGUFWriterStream(tmp_path / "bad.gguf", tensors=specs, padding=bad)
