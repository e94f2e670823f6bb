"""``hurray-interop verify``: exact round trips pass, and every planted difference is caught.

Round trips of the fixture model and of gguf-py files pass with one row per tensor;
then single bytes, single scale bits and metadata value types are changed — in the
.hrry of a GGUF/Hurray pair, in one GGUF of a GGUF/GGUF pair — and ``verify`` must
exit 1 and name the tensor and block (or the key).  Offsets of what we flip are found
with gguf-py's reader and cross-checked against the GGUF bytes, so the location the
tool prints is checked against an independent source.  ``--json`` carries the same
facts; several files print one summary line each; corrupt input exits 2 with one line
and no traceback; one subprocess run proves the ``python -m hurray_interop`` entry point.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_factory import (
    TensorDef,
    all_types_defs,
    every_kv_values,
    kv_type_offset,
    q8_0_blocks,
    write_gguf_py,
    write_gguf_raw,
    write_gguf_stream,
)

from hurray_interop.cli import main
from hurray_interop.conversions.gguf import gguf_to_hurray
from hurray_interop.core.hrry import HrryFile
from hurray_interop._verify import verify_files, verify_pair, verify_roundtrip

REPO = Path(__file__).resolve().parents[1]
Q8 = "blk.0.attn_q.weight"  # Q8_0 in tiny-llama.gguf: 34-byte blocks, f16 d then 32 int8 codes
Q4 = "blk.0.attn_k.weight"  # Q4_0: 18-byte blocks


@pytest.fixture(scope="module")
def model(fixtures_dir: Path) -> Path:
    return fixtures_dir / "tiny-llama.gguf"


@pytest.fixture(scope="module")
def model_hrry(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("verify") / "tiny-llama.hrry"
    gguf_to_hurray(model, out)
    return out


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def gguf_tensor(path: Path, name: str) -> tuple[int, np.ndarray]:
    """(absolute data offset, raw bytes) of a tensor, per gguf-py."""
    r = gguf.GGUFReader(str(path))
    t = next(t for t in r.tensors if t.name == name)
    off, data = int(t.data_offset), np.array(t.data, copy=True).view(np.uint8).reshape(-1)
    del r
    return off, data


def hrry_buffer_offsets(path: Path, name: str) -> list[int]:
    """Absolute offsets of a tensor's buffers: buffer 0 at the index entry's data offset,
    each next one at the following multiple of the file alignment."""
    with HrryFile(path) as hf:
        e, d, align = hf.entry(name), hf.descriptor(name), hf.alignment
        offs = [e.data_offset]
        for h in d.buffers[:-1]:
            end = offs[-1] + h.byte_size
            offs.append(-(-end // align) * align)
        return offs


def flipped(src: Path, dst: Path, offset: int, mask: int) -> Path:
    raw = bytearray(src.read_bytes())
    raw[offset] ^= mask
    dst.write_bytes(bytes(raw))
    return dst


def row_of(out: str, name: str) -> str:
    rows = [line for line in out.splitlines() if line.split() and line.split()[0] == name]
    assert len(rows) == 1, (name, out)
    return rows[0]


# ---------------------------------------------------------------------------
# exact round trips


def test_roundtrip_fixture_one_row_per_tensor(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["verify", str(model)], capsys)
    assert rc == 0, out + err
    r = gguf.GGUFReader(str(model))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    del r
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["tensor", "source", "mapping"]
    for name, typ in types.items():
        cells = row_of(out, name).split()
        assert cells[1] == typ
        assert "yes yes 0" in " ".join(cells), cells  # bytes equal, values equal, max abs diff 0
    assert lines[-1].startswith("OK ") and str(model) in lines[-1]
    assert "byte-identical" in lines[-1] and f"{len(types)} tensors exact" in lines[-1]
    assert err == ""


def test_roundtrip_json(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["verify", str(model), "--json"], capsys)
    assert rc == 0
    (res,) = json.loads(out)
    assert res["ok"] is True and res["kind"] == "round-trip" and res["file_bytes_equal"] is True
    assert res["error"] is None and res["problems"] == []
    r = gguf.GGUFReader(str(model))
    assert [t["name"] for t in res["tensors"]] == [t.name for t in r.tensors]
    assert [t["source_type"] for t in res["tensors"]] == [t.tensor_type.name for t in r.tensors]
    del r
    for t in res["tensors"]:
        assert (t["bytes_equal"], t["values_equal"], t["max_abs_diff"]) == (True, True, 0.0), t


def test_roundtrip_every_type_and_kv_api(tmp_path: Path) -> None:
    """verify_roundtrip on gguf-py / stream-written files: each tensor compared bytes and values."""
    a = write_gguf_py(tmp_path / "types.gguf", all_types_defs(), alignment=64)
    b = write_gguf_stream(tmp_path / "kv.gguf", [TensorDef("w", "Q5_0", (2, 32))], kv=every_kv_values(), version=2,
                          pad_end=False)
    for path in (a, b):
        res = verify_roundtrip(path)
        assert res.ok and res.file_bytes_equal, res.summary_line()
        r = gguf.GGUFReader(str(path))
        assert [(t.name, t.source_type) for t in res.tensors] == [(t.name, t.tensor_type.name) for t in r.tensors]
        del r
        assert all(t.bytes_equal and t.values_equal and t.max_abs_diff == 0 for t in res.tensors)


def test_exact_pair_gguf_and_hrry_either_order(model: Path, model_hrry: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([str(model), str(model_hrry)], [str(model_hrry), str(model)]):
        rc, out, _ = run(["verify", *argv, "--quiet"], capsys)
        assert rc == 0, out
        assert out.startswith("OK ") and "pair" in out and "byte-identical" in out


# ---------------------------------------------------------------------------
# planted differences


def test_code_byte_changed_in_hrry_of_a_pair(model: Path, model_hrry: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    block, elem = 5, 3
    codes_at = hrry_buffer_offsets(model_hrry, Q8)[0]
    goff, gdata = gguf_tensor(model, Q8)
    # the offset really is that code: the .hrry byte equals the GGUF Q8_0 block's code byte
    assert model_hrry.read_bytes()[codes_at + block * 32 + elem] == gdata[block * 34 + 2 + elem]
    bad = flipped(model_hrry, tmp_path / "bad.hrry", codes_at + block * 32 + elem, 0x01)
    rc, out, err = run(["verify", str(model), str(bad)], capsys)
    assert rc == 1, out + err
    row = row_of(out, Q8)
    assert "NO" in row and f"block {block}, byte {2 + elem}" in row
    assert f"tensor '{Q8}' block {block}, byte {2 + elem} (offset {goff + block * 34 + 2 + elem})" in out
    assert out.splitlines()[-1].startswith("FAILED") and "1 of 27 tensors differ" in out
    for other in ("token_embd.weight", Q4, "blk.0.ffn_up.weight"):
        assert "NO" not in row_of(out, other)
    assert "Traceback" not in err


def test_scale_bit_changed_in_hrry_of_a_pair(model: Path, model_hrry: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    block = 7
    scales_at = hrry_buffer_offsets(model_hrry, Q8)[1]
    _, gdata = gguf_tensor(model, Q8)
    assert model_hrry.read_bytes()[scales_at + 2 * block : scales_at + 2 * block + 2] == bytes(gdata[block * 34 : block * 34 + 2])
    bad = flipped(model_hrry, tmp_path / "scale.hrry", scales_at + 2 * block, 0x01)  # lowest mantissa bit of d
    rc, out, err = run(["verify", str(bad), str(model), "--json"], capsys)
    assert rc == 1, out + err
    (res,) = json.loads(out)
    assert res["ok"] is False and res["file_bytes_equal"] is False
    bad_rows = [t for t in res["tensors"] if not (t["bytes_equal"] and t["values_equal"])]
    assert [t["name"] for t in bad_rows] == [Q8]
    t = bad_rows[0]
    assert t["bytes_equal"] is False and t["values_equal"] is False and t["max_abs_diff"] > 0
    assert t["where"] == f"block {block}, byte 0"
    # the max abs diff is what gguf-py sees when the same bit flips in the GGUF block
    g = np.array(gdata, copy=True).reshape(-1, 34)
    before = gguf.quants.dequantize(g, gguf.GGMLQuantizationType.Q8_0)
    g[block, 0] ^= 0x01
    after = gguf.quants.dequantize(g, gguf.GGMLQuantizationType.Q8_0)
    assert t["max_abs_diff"] == float(np.max(np.abs(after.astype(np.float64) - before.astype(np.float64))))
    assert any(f"tensor '{Q8}' block {block}, byte 0" in p for p in res["problems"])
    assert res["summary"].startswith("FAILED")


@pytest.mark.parametrize("byte,mask", [(10, 0x10), (0, 0x01)], ids=["code", "scale-bit"])
def test_byte_changed_in_one_gguf_of_a_gguf_pair(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 byte: int, mask: int) -> None:
    block = 4
    goff, _ = gguf_tensor(model, Q4)
    bad = flipped(model, tmp_path / "bad.gguf", goff + block * 18 + byte, mask)
    rc, out, err = run(["verify", "--pair", str(model), str(bad)], capsys)
    assert rc == 1, out + err
    assert f"block {block}, byte {byte}" in row_of(out, Q4)
    assert f"tensor '{Q4}' block {block}, byte {byte} (offset {goff + block * 18 + byte})" in out
    res = verify_pair(model, bad)
    assert not res.ok and [t.name for t in res.tensors if not t.ok] == [Q4]


def test_kv_value_type_changed_uint32_to_int32(model: Path, model_hrry: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    key = "llama.context_length"
    off = kv_type_offset(model, key)
    raw = bytearray(model.read_bytes())
    assert raw[off : off + 4] == (4).to_bytes(4, "little")  # UINT32
    raw[off] = 5  # INT32: same width, same value bytes, different type
    bad = tmp_path / "int32.gguf"
    bad.write_bytes(bytes(raw))
    r = gguf.GGUFReader(str(bad))
    assert r.fields[key].types == [gguf.GGUFValueType.INT32]
    del r
    expect = f"metadata key '{key}': type UINT32 vs INT32"
    for argv in (["--pair", str(model), str(bad)], [str(model_hrry), str(bad)]):
        rc, out, err = run(["verify", *argv], capsys)
        assert rc == 1, out + err
        assert f"metadata key '{key}'" in out.splitlines()[-1]
        assert "type UINT32 vs INT32" in out or "type INT32 vs UINT32" in out
    rc, out, _ = run(["verify", "--pair", str(model), str(bad), "--json"], capsys)
    (res,) = json.loads(out)
    assert rc == 1 and expect in res["problems"]
    # the changed file is itself a valid GGUF and round-trips exactly (INT32 kept as INT32)
    assert verify_roundtrip(bad).ok


# ---------------------------------------------------------------------------
# several files, bad input, entry point


def test_several_files_one_summary_line_each(model: Path, fixtures_dir: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    extra = write_gguf_py(tmp_path / "x.gguf", [TensorDef("w", "Q4_1", (2, 64))])
    files = [model, fixtures_dir / "kv-types.gguf", extra]
    rc, out, _ = run(["verify", *map(str, files)], capsys)
    assert rc == 0, out
    lines = out.splitlines()
    assert len(lines) == len(files) + 1
    for line, f in zip(lines, files):
        assert line.startswith("OK ") and str(f) in line
    assert lines[-1] == f"{len(files)} of {len(files)} files verified exact"
    # one file with tensors that cannot be converted exactly: exit 1, still one line per file
    kq = fixtures_dir / "tiny-llama-kquant.gguf"
    rc, out, _ = run(["verify", str(model), str(kq), str(extra)], capsys)
    assert rc == 1
    lines = out.splitlines()
    assert len(lines) == 4 and lines[1].startswith("FAILED") and str(kq) in lines[1] and "Q4_K" in lines[1]
    assert lines[-1] == "2 of 3 files verified exact"
    results = verify_files([str(model), str(kq), str(extra)])
    assert [r.ok for r in results] == [True, False, True]


@pytest.mark.parametrize("damage", ["truncated", "bad_magic", "missing", "truncated_hrry"])
def test_corrupt_input_exit_2_one_line(model: Path, model_hrry: Path, tmp_path: Path, damage: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    if damage == "truncated":
        bad = tmp_path / "t.gguf"
        bad.write_bytes(model.read_bytes()[:5000])
        argv = [str(bad)]
    elif damage == "bad_magic":
        bad = tmp_path / "m.gguf"
        bad.write_bytes(b"GGUX" + model.read_bytes()[4:])
        argv = [str(bad)]
    elif damage == "missing":
        bad = tmp_path / "nothing.gguf"
        argv = [str(bad)]
    else:
        bad = tmp_path / "t.hrry"
        bad.write_bytes(model_hrry.read_bytes()[:3000])
        argv = [str(model), str(bad)]
    rc, out, err = run(["verify", *argv], capsys)
    assert rc == 2, out + err
    text = out + err
    assert "Traceback" not in text and "internal error" not in text
    errors = [line for line in text.splitlines() if "ERROR" in line or "error:" in line]
    assert len(errors) == 1 and bad.name in errors[0], text
    if damage != "missing":
        assert "offset" in errors[0]


def test_corrupt_input_prints_nothing_but_the_error(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole output for a corrupt file is the one error line (no empty table header)."""
    bad = tmp_path / "t.gguf"
    bad.write_bytes(model.read_bytes()[:5000])
    rc, out, err = run(["verify", str(bad)], capsys)
    assert rc == 2
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert len(lines) == 1, out + err


def test_corrupt_input_json_carries_the_error(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "t.gguf"
    bad.write_bytes(model.read_bytes()[:5000])
    rc, out, _ = run(["verify", str(bad), "--json"], capsys)
    (res,) = json.loads(out)
    assert rc == 2 and res["ok"] is False and "offset" in res["error"] and res["summary"].startswith("ERROR")


def test_entry_point_subprocess(model: Path, model_hrry: Path, tmp_path: Path) -> None:
    shutil.copy(model, tmp_path / "m.gguf")
    ok = subprocess.run([sys.executable, "-m", "hurray_interop", "verify", "--quiet", str(tmp_path / "m.gguf")],
                        capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("OK ") and ok.stderr == ""


def test_nonzero_padding_round_trips_and_a_pair_points_at_it(model: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Non-zero padding between tensors is recorded at import and written back: the round trip
    is byte-identical (exit 0); a pair of GGUFs that differ only there fails (exit 1) and
    points at the padding."""
    r = gguf.GGUFReader(str(model))
    spans = sorted((int(t.data_offset), int(t.data_offset) + int(t.n_bytes)) for t in r.tensors)
    del r
    gap = next(end for (_, end), (nxt, _) in itertools.pairwise(spans) if nxt > end)
    bad = flipped(model, tmp_path / "pad.gguf", gap, 0xAA)
    rc, out, err = run(["verify", str(bad)], capsys)
    assert rc == 0, out + err
    assert out.splitlines()[-1].startswith("OK") and "files byte-identical" in out.splitlines()[-1]
    rc, out, err = run(["verify", "--pair", str(model), str(bad)], capsys)
    assert rc == 1, out + err
    assert f"padding (offset {gap})" in out
    assert out.splitlines()[-1].startswith("FAILED") and "files differ" in out.splitlines()[-1]


def test_hurray_pair(model_hrry: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "same.hrry"
    shutil.copy(model_hrry, copy)
    rc, out, _ = run(["verify", "--pair", str(model_hrry), str(copy), "--quiet"], capsys)
    assert rc == 0 and out.startswith("OK "), out
    scales_at = hrry_buffer_offsets(model_hrry, Q8)[1]
    bad = flipped(model_hrry, tmp_path / "bad.hrry", scales_at + 2 * 3 + 1, 0x04)  # an exponent bit of block 3's d
    res = verify_pair(model_hrry, bad)
    assert not res.ok
    (t,) = [t for t in res.tensors if not t.ok]
    assert t.name == Q8 and t.bytes_equal is False and t.values_equal is False
    assert t.where.startswith(f"element {3 * 32}") or "block 3" in t.where, t.where


def test_native_hurray_file_against_its_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A .hrry not from GGUF and the GGUF exported from it: every value checked with gguf-py."""
    from test_export_gguf import build_exportable

    from hurray_interop.conversions.gguf import hurray_to_gguf

    src, out = tmp_path / "n.hrry", tmp_path / "n.gguf"
    expect = build_exportable(src, seed=11)
    hurray_to_gguf(src, out)
    rc, text, _ = run(["verify", str(out), str(src)], capsys)
    assert rc == 0, text
    for name, gtype in expect.items():
        cells = row_of(text, name).split()
        assert cells[1] == gtype and "yes yes 0" in " ".join(cells), cells


def test_several_files_json(model: Path, fixtures_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kq = fixtures_dir / "tiny-llama-kquant.gguf"
    rc, out, _ = run(["verify", str(model), str(kq), "--json"], capsys)
    assert rc == 1
    a, b = json.loads(out)
    assert (a["source"], a["ok"]) == (str(model), True)
    assert (b["source"], b["ok"]) == (str(kq), False)
    refused = {t["name"]: t for t in b["tensors"] if t["mapping"] == "refused"}
    assert set(refused) == {"blk.0.ffn_down.weight", "blk.1.ffn_down.weight"}
    assert refused["blk.0.ffn_down.weight"]["source_type"] == "Q4_K" and refused["blk.0.ffn_down.weight"]["where"]


def test_hrry_alone_has_no_round_trip(model_hrry: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["verify", str(model_hrry)], capsys)
    assert rc == 2
    assert "no source to round-trip" in out + err and "Traceback" not in out + err


def test_llama_cpp_samples_verify_one_line_each(gguf_samples_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(str(p) for p in gguf_samples_dir.glob("*.gguf"))
    rc, out, _ = run(["verify", *files], capsys)
    assert rc == 0, out
    lines = out.splitlines()
    assert [line.split()[1].rstrip(":") for line in lines[:-1]] == files
    assert all(line.startswith("OK ") and "files byte-identical" in line for line in lines[:-1])
    assert lines[-1] == f"{len(files)} of {len(files)} files verified exact"


def test_kv_value_type_changed_in_the_hrry_of_a_pair(model: Path, model_hrry: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The recorded GGUF type of ``llama.context_length`` rewritten UINT32 → INT32 in the .hrry."""
    from test_export_gguf import rewrite_hrry

    from hurray_interop.core.kv import KVValue

    key = "llama.context_length"

    def edit(kv):
        keys = [k for k in kv if not k.startswith("hurray_interop.")]
        types = list(kv["hurray_interop.gguf.kv_types"].value)
        i = keys.index(key)
        assert types[i] == "UINT32"
        types[i] = "INT32"
        kv["hurray_interop.gguf.kv_types"] = KVValue.array("string", types)
        return kv

    bad = rewrite_hrry(model_hrry, tmp_path / "int32.hrry", edit)
    rc, out, err = run(["verify", str(model), str(bad)], capsys)
    assert rc == 1, out + err
    assert f"metadata key '{key}'" in out.splitlines()[-1]
    assert f"metadata key '{key}': type UINT32 vs INT32" in out
    assert all("NO" not in row_of(out, n) for n in ("token_embd.weight", Q8, Q4))  # tensors are still exact


def test_difference_beyond_the_first_chunk_is_located(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 9 MB Q8_0 tensor (more than one 2**18-block chunk, more than one 4 Mi-element value
    chunk): one code changed in its last chunk is reported at the right block and byte."""
    from gguf_factory import q8_0_blocks, write_gguf_raw

    rng = np.random.default_rng(3)
    nb = (1 << 18) + 4096
    blocks = q8_0_blocks(rng.uniform(0.01, 1, nb), rng.integers(-127, 127, (nb, 32)))
    src = write_gguf_raw(tmp_path / "big.gguf", [("w", "Q8_0", (nb // 32, 1024), blocks)])
    mid = tmp_path / "big.hrry"
    gguf_to_hurray(src, mid)
    block, elem = nb - 7, 30
    codes_at = hrry_buffer_offsets(mid, "w")[0]
    assert mid.read_bytes()[codes_at + block * 32 + elem] == blocks[block, 2 + elem]
    bad = flipped(mid, tmp_path / "bad.hrry", codes_at + block * 32 + elem, 0x02)
    rc, out, err = run(["verify", str(src), str(bad), "--json"], capsys)
    assert rc == 1, out + err
    (res,) = json.loads(out)
    (t,) = res["tensors"]
    assert t["where"] == f"block {block}, byte {2 + elem}"
    assert t["values_equal"] is False and t["max_abs_diff"] == pytest.approx(2 * float(np.float16(blocks[block, :2].view(np.float16)[0])), rel=0)


# ---------------------------------------------------------------------------
# the sign of zero: equal only for GGML MXFP4 code 8 (docs/conversion-rules.md § 6)


@pytest.fixture(scope="module")
def signed_zero_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A GGUF with an F32 tensor holding +0, a Q8_0 tensor with an all-zero block at d = +1
    and an MXFP4 tensor full of code 8; its .hrry; and a copy of that .hrry in which the F32
    zero is −0 and the Q8_0 block's scale is −1 -- values that differ from the source only
    in the sign of zeros."""
    d = tmp_path_factory.mktemp("signed-zero")
    rng = np.random.default_rng(8)
    f32 = rng.standard_normal((2, 32)).astype(np.float32)
    f32[1, 5] = 0.0
    codes = rng.integers(-127, 128, size=(4, 32), dtype=np.int16).astype(np.int8)
    codes[2] = 0
    mxfp4 = np.zeros((2, 17), np.uint8)
    mxfp4[:, 0] = 127
    mxfp4[:, 1:] = 0x38  # element j: code 8 (ggml +0, OCP/Hurray −0); element j+16: code 3 (1.5)
    src = write_gguf_raw(d / "z.gguf", [
        ("f32", "F32", (2, 32), f32),
        ("q8", "Q8_0", (2, 64), q8_0_blocks([0.5, 0.25, 1.0, 2.0], codes)),
        ("mx", "MXFP4", (1, 64), mxfp4),
    ])
    good = d / "z.hrry"
    gguf_to_hurray(src, good)
    raw = bytearray(good.read_bytes())
    f32_at = hrry_buffer_offsets(good, "f32")[0] + 4 * (32 + 5)
    assert raw[f32_at : f32_at + 4] == bytes(4)
    raw[f32_at + 3] ^= 0x80  # +0 -> −0
    scale_at = hrry_buffer_offsets(good, "q8")[1] + 2 * 2
    assert raw[scale_at : scale_at + 2] == np.float16(1.0).tobytes()
    raw[scale_at + 1] ^= 0x80  # d = +1 -> −1 on a block whose codes are all 0
    bad = d / "z-signs.hrry"
    bad.write_bytes(bytes(raw))
    return src, good, bad


def _rows_by_name(out: str) -> dict[str, dict]:
    (res,) = json.loads(out)
    return {t["name"]: t for t in res["tensors"]}


def test_mxfp4_code_8_is_the_one_accepted_sign_of_zero(signed_zero_files, capsys: pytest.CaptureFixture[str]) -> None:
    src, good, _ = signed_zero_files
    from hurray_interop.dequant import dequantize

    with HrryFile(good) as hf:
        ours = dequantize(hf.tensor("mx")).reshape(-1)
    theirs = gguf.quants.dequantize(gguf_tensor(src, "mx")[1].reshape(1, 34), gguf.GGMLQuantizationType.MXFP4).reshape(-1)
    zero = ours == 0
    assert zero.sum() == 32 and np.signbit(ours[zero]).all() and not np.signbit(theirs[zero]).any()  # the case is real
    rc, out, err = run(["verify", str(src), "--json"], capsys)
    assert rc == 0, out + err
    assert _rows_by_name(out)["mx"]["values_equal"] is True
    rc, out, err = run(["verify", str(src), str(good), "--json"], capsys)
    assert rc == 0, out + err


@pytest.mark.parametrize("against", ["gguf", "hrry"])
def test_a_sign_of_zero_is_a_difference_for_every_other_type(signed_zero_files, against: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """F32 and Q8_0 values that differ only by the sign of a zero are reported as different
    (max abs diff 0), against the GGUF source and against the good .hrry; MXFP4 stays equal."""
    src, good, bad = signed_zero_files
    other = src if against == "gguf" else good
    rc, out, err = run(["verify", str(other), str(bad), "--pair", "--json"], capsys)
    assert rc == 1, out + err
    rows = _rows_by_name(out)
    for name in ("f32", "q8"):
        assert rows[name]["values_equal"] is False and rows[name]["max_abs_diff"] == 0.0, rows[name]
    assert rows["mx"]["values_equal"] is True
    if against == "gguf":  # located by the bytes of the export: the sign bits of the scale and of the float
        assert (rows["q8"]["where"], rows["f32"]["where"]) == ("block 2, byte 1", "byte 151")
    else:
        assert (rows["q8"]["where"], rows["f32"]["where"]) == ("element 64", "element 37")


def test_the_round_trip_copies_are_not_sent_to_the_disk(model: Path, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """verify's temporary .hrry and GGUF are written as transient outputs (files.atomic.transient):
    no fsync, no writeback -- while a conversion of the same file syncs its output."""
    import os

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    result = verify_roundtrip(str(model))
    assert result.ok and result.file_bytes_equal and synced == []
    gguf_to_hurray(model, tmp_path / "x.hrry")
    assert synced  # the conversion's own output is durable
