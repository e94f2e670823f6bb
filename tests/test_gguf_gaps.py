"""Bytes of a GGUF that no tensor holds come back byte for byte (docs/conversion-rules.md § 7).

GGUF allows gaps between tensors, and its padding is zero only by convention. An import
records the bytes there that are not zero (``hurray_interop.gguf.padding``, at most
``MAX_PADDING_BYTES``) and the export writes them back, so such a file round-trips
byte-identically (``verify`` exit 0) instead of converting "exact" and coming back
different. Beyond the limit the conversion is refused (exit 1, nothing written), at
limit − 1, limit and limit + 1. The record is input too: a broken one is a located error.

Oracles: the source file's own bytes, and gguf-py's reader for the tensor offsets.
"""

from __future__ import annotations

import json

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
                                                f"\\(the first at offset {start}\\): more than the {LIMIT} bytes") as e:
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


def test_split_set_shard_padding_round_trips(fixtures_dir: Path, tmp_path: Path) -> None:
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
