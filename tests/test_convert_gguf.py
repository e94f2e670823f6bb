"""GGUF → Hurray: exact import, proven against gguf-py and pyhurray.

Every value check compares our shared dequantizer on the Hurray tensor with
gguf-py's own ``gguf.quants.dequantize`` on the source bytes, bit for bit.  The
one documented exception (docs/conversion-rules.md § 6): ggml decodes MXFP4 code 8 as +0
where OCP/Hurray decode −0.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from hurray_interop.cli import main
from hurray_interop.conversions.gguf import gguf_to_hurray, hurray_to_gguf, plan_gguf
from hurray_interop.core.hrry import HrryFile
from hurray_interop.core.records import decode_scale_record, scale_record_key
from hurray_interop.dequant import dequantize
from hurray_interop.errors import ConversionRefused
from hurray_interop.report import EXACT, LOSSY, REFUSED, VALUE_EXACT

QUANT = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.MXFP4]
PLAIN = [Q.F32, Q.F16, Q.BF16]


def _data(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * rng.uniform(0.01, 4.0)).astype(np.float32)
    flat = x.reshape(-1, 32)
    flat[::7] = 0.0  # all-zero blocks: d = 0 / e = 0 in the source
    flat[3::11] = -0.0
    return x


def _write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, Q]], *, arch: str = "llama") -> dict[str, np.ndarray]:
    """Quantize with gguf-py's reference quantizers and write with its writer; return the raw bytes."""
    w = gguf.GGUFWriter(str(path), arch)
    raws = {}
    for name, (x, qt) in tensors.items():
        if qt in (Q.F32, Q.F16):
            arr = x.astype(np.float32 if qt == Q.F32 else np.float16)
            w.add_tensor(name, arr)
            raws[name] = arr
        else:
            raw = gguf.quants.quantize(x, qt)
            w.add_tensor(name, raw, raw_dtype=qt)
            raws[name] = raw
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return raws


def _write_raw(path: Path, raw: np.ndarray, qt: Q) -> Path:
    """One tensor ``t`` of hand-made GGML blocks (byte shape), written by gguf-py."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("t", raw, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _reference(raw: np.ndarray, qt: Q) -> np.ndarray:
    if qt in (Q.F32, Q.F16):
        return raw.astype(np.float32)
    return gguf.quants.dequantize(raw, qt).astype(np.float32)


def _assert_bit_exact(ours: np.ndarray, ref: np.ndarray, *, mxfp4: bool, codes_8: np.ndarray | None = None) -> None:
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    diff = ours.view(np.uint32) != ref.view(np.uint32)
    if mxfp4:
        # the one documented exception: ggml's +0 for code 8 where OCP has −0
        allowed = (ours == 0) & (ref == 0)
        assert not (diff & ~allowed).any()
        if diff.any():
            assert np.all(np.signbit(ours[diff])) and not np.any(np.signbit(ref[diff]))
    else:
        assert not diff.any(), f"first difference at flat index {int(np.argmax(diff.reshape(-1)))}"


@pytest.mark.parametrize("qt", QUANT + PLAIN, ids=lambda q: q.name)
@pytest.mark.parametrize("shape", [(64,), (3, 64), (2, 3, 96), (2, 2, 3, 32)], ids=lambda s: "x".join(map(str, s)))
def test_every_type_and_rank_decodes_bit_exact(tmp_path: Path, qt: Q, shape: tuple[int, ...]) -> None:
    x = _data(shape, seed=hash((qt.name, shape)) & 0xFFFF)
    src = tmp_path / "m.gguf"
    raws = _write_gguf(src, {"t": (x, qt)})
    report = gguf_to_hurray(src, tmp_path / "m.hrry")
    assert [t.status for t in report.tensors] == [EXACT]
    with HrryFile(tmp_path / "m.hrry") as hf:
        t = hf.tensor("t")
        assert t.shape == shape
        ours = dequantize(t)
    _assert_bit_exact(ours, _reference(raws["t"], qt), mxfp4=qt == Q.MXFP4)


def test_tens_of_megabytes(tmp_path: Path) -> None:
    x = _data((2048, 4096), seed=7)  # 8 Mi elements: Q8_0 is 8.9 MB, Q4_0 4.7 MB
    src = tmp_path / "big.gguf"
    raws = _write_gguf(src, {"q8": (x, Q.Q8_0), "q4": (x, Q.Q4_0)})
    gguf_to_hurray(src, tmp_path / "big.hrry")
    with HrryFile(tmp_path / "big.hrry") as hf:
        for name, qt in (("q8", Q.Q8_0), ("q4", Q.Q4_0)):
            _assert_bit_exact(dequantize(hf.tensor(name)), _reference(raws[name], qt), mxfp4=False)
    hurray_to_gguf(tmp_path / "big.hrry", tmp_path / "back.gguf")
    assert (tmp_path / "back.gguf").read_bytes() == src.read_bytes()


def test_mappings_follow_the_contract(tmp_path: Path) -> None:
    x = _data((4, 64), seed=3)
    src = tmp_path / "m.gguf"
    _write_gguf(src, {q.name: (x, q) for q in QUANT})
    gguf_to_hurray(src, tmp_path / "m.hrry")
    with HrryFile(tmp_path / "m.hrry") as hf:
        def d(name: str):  # noqa: ANN202
            return hf.tensor(name).descriptor

        assert d("Q8_0").element_type.name == "int8" and d("Q8_0").quantization.symmetric
        assert d("Q4_0").element_type.name == "int4" and d("Q4_0").quantization.symmetric
        assert d("MXFP4").element_type.name == "float4_e2m1" and type(d("MXFP4").quantization).__name__ == "MXFP"
        # the compact forms (docs/conversion-rules.md § 11): member suffixes and storages, in emission order
        for name, members in (("Q4_1", [(".base", "uint4"), (".min", "uint8")]),
                              ("Q5_1", [(".base", "uint4"), (".hi", "uint2"), (".min", "uint8")]),
                              ("Q5_0", [(".base", "uint4"), (".hi", "int2")])):
            t = hf.tensor(name)
            assert t.descriptor.is_composite
            assert [(m.name, m.descriptor.element_type.name) for m in t.members] == [(name + s, e) for s, e in members]
            if name != "Q5_0":
                assert t.members[-1].descriptor.layout.strides == (0, 0)  # the broadcast minimum
        for q in ("Q8_0", "Q4_0"):
            pq = d(q).quantization
            assert (pq.axis, pq.block_size, pq.scale_type.name) == (1, 32, "float16")


def test_q4_0_codes_are_repacked_signed_nibbles(tmp_path: Path) -> None:
    """Q4_0 stores q+8 in split halves; Hurray holds int4 q−8 packed LSB-first."""
    x = _data((1, 32), seed=11)
    x[:] = np.linspace(-1, 1, 32, dtype=np.float32)
    src = tmp_path / "m.gguf"
    raws = _write_gguf(src, {"t": (x, Q.Q4_0)})
    gguf_to_hurray(src, tmp_path / "m.hrry")
    qs = raws["t"].reshape(-1)[2:18]
    elements = np.concatenate([qs & 15, qs >> 4]).astype(np.int16) - 8  # element order
    with HrryFile(tmp_path / "m.hrry") as hf:
        packed = hf.tensor("t").data[0]
    lo = (packed & 15).astype(np.int16)
    hi = (packed >> 4).astype(np.int16)
    got = np.empty(32, np.int16)
    got[0::2], got[1::2] = lo, hi
    got = np.where(got > 7, got - 16, got)
    assert np.array_equal(got, elements)


def test_pyhurray_reads_what_we_write(tmp_path: Path) -> None:
    hurray = pytest.importorskip("hurray")
    x = _data((2, 64), seed=5)
    src = tmp_path / "m.gguf"
    _write_gguf(src, {q.name: (x, q) for q in QUANT + PLAIN})
    gguf_to_hurray(src, tmp_path / "m.hrry")
    loaded = hurray.load(str(tmp_path / "m.hrry"))
    with HrryFile(tmp_path / "m.hrry") as hf:
        assert set(loaded) == set(hf.top_level_names())
        for name in hf.top_level_names():
            ours = hf.tensor(name)
            theirs = loaded[name]
            assert tuple(theirs.shape) == ours.shape
            if ours.descriptor.is_composite:
                assert isinstance(theirs, hurray.Composite)
                assert theirs.member_count == len(ours.members)
                pairs = list(zip(theirs.members, ours.members))
            else:
                pairs = [(theirs, ours)]
            for th, ou in pairs:
                assert th.dtype.name == ou.element_type.name
                assert th.buffer_count == len(ou.data)
                for i in range(th.buffer_count):
                    assert np.asarray(th.buffer(i)).tobytes() == ou.data[i].tobytes()


def test_zero_blocks_are_substituted_and_recorded(tmp_path: Path) -> None:
    x = _data((4, 64), seed=9)
    src = tmp_path / "m.gguf"
    raws = _write_gguf(src, {"q8": (x, Q.Q8_0), "mx": (x, Q.MXFP4)})
    report = gguf_to_hurray(src, tmp_path / "m.hrry")
    assert all(t.substituted_blocks > 0 for t in report.tensors)
    with HrryFile(tmp_path / "m.hrry") as hf:
        blocks, orig = decode_scale_record(hf.kv[scale_record_key("q8")].value)
        d = raws["q8"].reshape(-1, 34)[:, :2].copy().view("<f2").reshape(-1)
        assert np.array_equal(blocks, np.flatnonzero(d == 0))
        assert np.array_equal(orig.reshape(-1).view("<f2"), d[d == 0])  # bits, incl. −0
        stored = hf.tensor("q8").data[1].view("<f2")
        assert np.all(np.abs(stored[blocks]) == 1.0) and np.all(stored[d != 0] == d[d != 0])
        eblocks, eorig = decode_scale_record(hf.kv[scale_record_key("mx")].value)
        e = raws["mx"].reshape(-1, 17)[:, 0]
        assert np.array_equal(eblocks, np.flatnonzero(e == 0)) and not eorig.any()
        assert np.all(hf.tensor("mx").data[1][eblocks] == 0x7F)


def _patch(path: Path, offset: int, data: bytes) -> None:
    b = bytearray(path.read_bytes())
    b[offset : offset + len(data)] = data
    path.write_bytes(bytes(b))


@pytest.mark.parametrize(
    "qt,patch,reason",
    [
        (Q.Q8_0, (0, b"\x00\x7e"), "block 0: scale d = nan is not finite"),
        (Q.Q4_0, (18, b"\x00\x7c"), "block 1: scale d = inf is not finite"),
        (Q.MXFP4, (17, b"\xff"), "block 1: E8M0 scale 0xFF (NaN) is not representable"),
        (Q.MXFP4, (0, b"\x00"), "block 0: E8M0 scale 0x00 on a block with non-zero codes is not representable"),
        (Q.Q8_0, (0, b"\x00\x00"), "block 0: scale d = 0 on a block with non-zero codes is not representable"),
        (Q.Q4_1, (2, b"\x00\xfc"), "block 0: minimum m = -inf is not finite"),
    ],
)
def test_forbidden_scales_are_refused(tmp_path: Path, qt: Q, patch: tuple[int, bytes], reason: str) -> None:
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32) + 3.0
    src = tmp_path / "m.gguf"
    _write_gguf(src, {"t": (x, qt)})
    from hurray_interop.formats.gguf import read_gguf

    with read_gguf(src) as gf:
        base = gf.tensors[0].data_offset
    _patch(src, base + patch[0], patch[1])
    with pytest.raises(ConversionRefused) as ei:
        gguf_to_hurray(src, tmp_path / "m.hrry")
    assert ei.value.reasons == [("t", qt.name, reason)]
    assert not (tmp_path / "m.hrry").exists()


def test_q4_1_with_integer_zero_points_maps_to_plain_affine(tmp_path: Path) -> None:
    """docs/conversion-rules.md § 2 (a): every block's minimum is an integer multiple of its scale."""
    rng = np.random.default_rng(2)
    nb = 8
    d = rng.choice([0.25, 0.5, 1.0, 0.125], nb).astype(np.float16)
    z = rng.integers(0, 16, nb)
    m = (np.float32(0) - z * d.astype(np.float32)).astype(np.float16)  # z = 0 gives +0
    qs = rng.integers(0, 256, (nb, 16), dtype=np.uint8)
    blocks = np.concatenate([d.reshape(-1, 1).view(np.uint8), m.reshape(-1, 1).view(np.uint8), qs], axis=1)
    src = _write_raw(tmp_path / "m.gguf", blocks.reshape(2, -1), Q.Q4_1)
    report = gguf_to_hurray(src, tmp_path / "m.hrry")
    assert "zero-point" in report.tensors[0].mapping
    with HrryFile(tmp_path / "m.hrry") as hf:
        t = hf.tensor("t")
        assert not t.descriptor.is_composite and t.descriptor.element_type.name == "uint4"
        assert np.array_equal(t.data[2].view("<i4"), z.astype(np.int32))
        _assert_bit_exact(dequantize(t), gguf.quants.dequantize(blocks.reshape(2, -1), Q.Q4_1), mxfp4=False)
    hurray_to_gguf(tmp_path / "m.hrry", tmp_path / "back.gguf")
    assert (tmp_path / "back.gguf").read_bytes() == src.read_bytes()


def test_k_quants_are_refused_with_the_reason(fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "k.hrry"
    status = main(["convert", str(fixtures_dir / "tiny-llama-kquant.gguf"), str(out), "-q"])
    assert status == 1
    assert not out.exists() and not list(tmp_path.iterdir())
    err = capsys.readouterr().err.strip().splitlines()
    refused = [line for line in err if "refused" in line]
    assert len(refused) >= 2
    assert any("(Q4_K)" in line and "two-level super-block scales" in line for line in refused)
    assert any("(Q6_K)" in line for line in refused)
    assert "Traceback" not in "\n".join(err)


@pytest.mark.parametrize("fallback,status", [("float32", VALUE_EXACT), ("float16", LOSSY), ("bfloat16", LOSSY)])
def test_fallback_stores_refused_tensors_dequantized(fixtures_dir: Path, tmp_path: Path, fallback: str, status: str) -> None:
    src = fixtures_dir / "tiny-llama-kquant.gguf"
    report = gguf_to_hurray(src, tmp_path / "k.hrry", fallback=fallback)
    kq = [t for t in report.tensors if t.source_type in ("Q4_K", "Q6_K")]
    assert kq and all(t.status == status for t in kq)
    assert all(t.max_abs_error is not None for t in kq)
    if fallback == "float32":
        assert all(t.max_abs_error == 0.0 for t in kq)
    else:
        assert any(t.max_abs_error > 0 for t in kq)
    from hurray_interop.formats.gguf import read_gguf

    with read_gguf(src) as gf, HrryFile(tmp_path / "k.hrry") as hf:
        for info in gf.tensors:
            if info.type_name not in ("Q4_K", "Q6_K"):
                continue
            t = hf.tensor(info.name)
            assert t.element_type.name == fallback
            ref = gguf.quants.dequantize(info.array(), Q[info.type_name]).astype(np.float32)
            ours = dequantize(t)
            if fallback == "float32":
                assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))
            else:
                err = float(np.max(np.abs(ours - ref)))
                assert err == next(p.max_abs_error for p in kq if p.name == info.name)


def test_q4_1_requantize_is_lossy_and_plain(fixtures_dir: Path, tmp_path: Path) -> None:
    report = gguf_to_hurray(fixtures_dir / "tiny-llama.gguf", tmp_path / "r.hrry", q4_1="requantize")
    q41 = [t for t in report.tensors if t.source_type in ("Q4_1", "Q5_1")]
    assert q41 and all(t.status == LOSSY and t.max_abs_error > 0 for t in q41)
    with HrryFile(tmp_path / "r.hrry") as hf:
        for t in q41:
            d = hf.tensor(t.name).descriptor
            assert not d.is_composite and d.quantization.zero_point_buffer_index == 2


def test_dry_run_plans_without_writing(fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.hrry"
    status = main(["convert", str(fixtures_dir / "tiny-llama-kquant.gguf"), str(out), "--dry-run", "--json"])
    assert status == 1  # the plan has refused tensors
    assert not out.exists()
    plan = json.loads(capsys.readouterr().out)
    statuses = {t["name"]: t["status"] for t in plan["tensors"]}
    assert REFUSED in statuses.values() and EXACT in statuses.values()
    assert plan["dry_run"] is True
    report = plan_gguf(fixtures_dir / "tiny-llama.gguf")
    assert report.exact and report.bytes_in == sum(t.bytes_in for t in report.tensors)


def test_inspect_gguf_shows_plan_and_metadata(fixtures_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(fixtures_dir / "tiny-llama.gguf"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "gguf" and info["version"] == 3
    keys = {m["key"]: m for m in info["metadata"]}
    assert keys["llama.block_count"]["type"] == "UINT32"
    assert keys["tokenizer.ggml.tokens"]["type"] == "ARRAY[STRING]"
    types = {t["name"]: t for t in info["tensors"]}
    assert types["blk.0.attn_v.weight"]["ggml_type"] == "Q4_1"
    assert types["blk.0.attn_v.weight"]["hurray_mapping"].startswith("compact overlay(add)")


def test_every_gguf_value_type_is_kept(fixtures_dir: Path, tmp_path: Path) -> None:
    from hurray_interop.formats.gguf import read_gguf

    src = fixtures_dir / "kv-types.gguf"
    gguf_to_hurray(src, tmp_path / "kv.hrry")
    with read_gguf(src) as gf, HrryFile(tmp_path / "kv.hrry") as hf:
        kv = hf.kv
        gkeys = list(gf.kv)
        assert list(kv)[: len(gkeys)] == gkeys  # GGUF keys first, in order
        types = list(kv["hurray_interop.gguf.kv_types"].value)
        assert len(types) == len(gkeys)
        for key, ts in zip(gkeys, types):
            v = gf.kv[key]
            if ts.startswith("RAW:"):
                assert kv[key].type == "bytes"
            elif v.type.name == "ARRAY":
                assert ts == f"ARRAY[{v.element_type.name}]" and kv[key].type == "array"
                assert len(kv[key].value) == len(v)
            else:
                assert ts == v.type.name
                if v.type.name == "STRING":
                    assert kv[key].value.encode() == bytes(v.value)
                elif v.type.name not in ("FLOAT32", "FLOAT64", "BOOL"):
                    assert kv[key].value == int(v.value)
        assert kv["hurray_interop.gguf.version"].value == gf.version
    hurray_to_gguf(tmp_path / "kv.hrry", tmp_path / "back.gguf")
    assert (tmp_path / "back.gguf").read_bytes() == src.read_bytes()


@pytest.mark.parametrize("cut", [3, 10, 30, 200, 5000, -100, -30])  # -30: inside the last tensor
def test_truncated_gguf_is_a_one_line_error(fixtures_dir: Path, tmp_path: Path, cut: int, capsys: pytest.CaptureFixture[str]) -> None:
    data = (fixtures_dir / "tiny-llama.gguf").read_bytes()
    src = tmp_path / "cut.gguf"
    src.write_bytes(data[:cut])
    out = tmp_path / "cut.hrry"
    assert main(["convert", str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(src) in err and "offset" in err
    assert not out.exists()
    assert src.read_bytes() == data[:cut]


def test_no_progress_output_when_not_a_terminal(fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", str(fixtures_dir / "tiny-llama.gguf"), str(tmp_path / "a.hrry")]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "27 tensors (27 exact)" in captured.out
    assert main(["convert", str(fixtures_dir / "tiny-llama.gguf"), str(tmp_path / "b.hrry"), "--quiet"]) == 0
    assert capsys.readouterr().out == ""


def test_fixture_converts_and_round_trips(fixtures_dir: Path, tmp_path: Path) -> None:
    src = fixtures_dir / "tiny-llama.gguf"
    gguf_to_hurray(src, tmp_path / "t.hrry")
    hurray_to_gguf(tmp_path / "t.hrry", tmp_path / "t.gguf")
    assert (tmp_path / "t.gguf").read_bytes() == src.read_bytes()


def test_q4_1_zero_minimum_still_maps_to_zero_points(tmp_path: Path) -> None:
    """m = +0 is z = 0 (−0·d would be −0): such blocks do not force the overlay."""
    nb = 4
    d = np.array([0.5, 0.25, 1.0, 0.5], dtype=np.float16)
    m = np.array([0.0, -1.0, 0.0, -2.0], dtype=np.float16)  # z = 0, 4, 0, 4
    qs = np.random.default_rng(4).integers(0, 256, (nb, 16), dtype=np.uint8)
    blocks = np.concatenate([d.reshape(-1, 1).view(np.uint8), m.reshape(-1, 1).view(np.uint8), qs], axis=1)
    src = _write_raw(tmp_path / "m.gguf", blocks.reshape(1, -1), Q.Q4_1)
    report = gguf_to_hurray(src, tmp_path / "m.hrry")
    assert "zero-point" in report.tensors[0].mapping
    with HrryFile(tmp_path / "m.hrry") as hf:
        assert list(hf.tensor("t").data[2].view("<i4")) == [0, 4, 0, 4]
        _assert_bit_exact(dequantize(hf.tensor("t")), gguf.quants.dequantize(blocks.reshape(1, -1), Q.Q4_1), mxfp4=False)
    hurray_to_gguf(tmp_path / "m.hrry", tmp_path / "back.gguf")
    assert (tmp_path / "back.gguf").read_bytes() == src.read_bytes()


def test_jobs_change_threads_not_bytes(fixtures_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    import concurrent.futures

    import hurray_interop.conversions.gguf as cg

    monkeypatch.setattr(cg, "PAR_BLOCKS", 4)  # small work items: the fixture's tensors take the pool path
    src = fixtures_dir / "tiny-llama.gguf"
    gguf_to_hurray(src, tmp_path / "two.hrry", jobs=2)
    hurray_to_gguf(tmp_path / "two.hrry", tmp_path / "two.gguf", jobs=2)

    def no_pool(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("jobs=1 must not start a thread pool")

    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", no_pool)
    gguf_to_hurray(src, tmp_path / "one.hrry", jobs=1)
    hurray_to_gguf(tmp_path / "one.hrry", tmp_path / "one.gguf", jobs=1)
    assert (tmp_path / "one.hrry").read_bytes() == (tmp_path / "two.hrry").read_bytes()
    assert (tmp_path / "one.gguf").read_bytes() == (tmp_path / "two.gguf").read_bytes() == src.read_bytes()
    with pytest.raises(AssertionError, match="thread pool"):
        gguf_to_hurray(src, tmp_path / "pool.hrry", jobs=2)
    assert not (tmp_path / "pool.hrry").exists()
    assert main(["convert", str(src), str(tmp_path / "zero.hrry"), "--jobs", "0"]) == 2
    assert "--jobs must be positive" in capsys.readouterr().err
