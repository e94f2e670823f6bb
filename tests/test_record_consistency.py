"""A .hrry's data must agree with the records of its import (docs/conversion-rules.md § 7).

The export rebuilds the GGUF from the stored tensors and metadata plus the records under
``hurray_interop.*``; a record that the stored data contradicts is bad input (exit 2, one
located line, nothing written), so ``verify`` of such a pair fails instead of passing.

* Metadata recorded as GGUF ``FLOAT32`` is stored as float64 (the float32 widened
  exactly): a value that is not exactly a float32 is refused like an integer out of range
  for its recorded type — tested at the limits (largest finite float32 and the float64s
  around it, subnormals, ±0, ±inf, NaN payloads), scalars and arrays.

The oracle for what was written is gguf-py's GGUFReader; the tampered files are built
with our HrryWriter from a real import.
"""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_factory import TensorDef, write_gguf_stream

from hurray_interop.cli import main
from hurray_interop.conversions.gguf import gguf_to_hurray, hurray_to_gguf
from hurray_interop.core.hrry import HrryFile, HrryWriter
from hurray_interop.core.kv import KVValue
from hurray_interop.dequant import dequantize
from hurray_interop.errors import FormatError, UsageError
from hurray_interop.formats import gguf as G

VT = G.ValueType


def rewrite_hrry(src: Path, dst: Path, edit) -> Path:
    """Copy a .hrry with its KV passed through ``edit(dict) -> dict``."""
    with HrryFile(src) as hf:
        kv = edit(dict(hf.kv))
        with HrryWriter(dst) as w:
            for n in hf.top_level_names():
                w.write_tensor(hf.tensor(n))
            w.finish(kv)
    return dst


def f64(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


# ---------------------------------------------------------------------------
# 1. metadata recorded as FLOAT32

F32_MAX = float(np.finfo(np.float32).max)  # 0x7f7fffff
F32_TINY = float(np.finfo(np.float32).smallest_subnormal)  # 2**-149
F32_MAX_SUBNORMAL = float(np.float32(2.0**-126) - np.float32(F32_TINY))

#: float64 value → the float32 bits the export must write (a float32, exactly)
KEPT = {
    "max": (F32_MAX, 0x7F7FFFFF),
    "-max": (-F32_MAX, 0xFF7FFFFF),
    "smallest subnormal": (F32_TINY, 0x00000001),
    "largest subnormal": (F32_MAX_SUBNORMAL, 0x007FFFFF),
    "smallest normal": (2.0**-126, 0x00800000),
    "-0.0": (-0.0, 0x80000000),
    "+0.0": (0.0, 0x00000000),
    "inf": (float("inf"), 0x7F800000),
    "-inf": (float("-inf"), 0xFF800000),
    "float32(0.1) widened": (float(np.float32(0.1)), 0x3DCCCCCD),
    "quiet NaN": (f64(0x7FF8000000000000), 0x7FC00000),  # a payload that survives the narrowing
}
#: float64 values that are not exactly a float32, with what the message says
REFUSED = {
    "next float64 above max": (float(np.nextafter(F32_MAX, np.inf)), "not exactly representable"),
    "next float64 below max": (float(np.nextafter(F32_MAX, 0.0)), "not exactly representable"),
    "max + half an ulp (rounds to inf)": (F32_MAX + 2.0**103, "out of range"),
    "3.5e38": (3.5e38, "out of range"),
    "1e300": (1e300, "out of range"),
    "-1e300": (-1e300, "out of range"),
    "0.1": (0.1, "not exactly representable"),
    "next float64 above the smallest subnormal": (float(np.nextafter(F32_TINY, 1.0)), "not exactly representable"),
    "next float64 below the smallest subnormal": (float(np.nextafter(F32_TINY, 0.0)), "not exactly representable"),
    "half the smallest subnormal (rounds to 0)": (F32_TINY / 2, "not exactly representable"),
    "NaN with a payload float32 cannot hold": (f64(0x7FF8000000000001), "not exactly representable"),
}


@pytest.fixture(scope="module")
def float_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GGUF with a FLOAT32 key and an ARRAY[FLOAT32] key, imported."""
    d = tmp_path_factory.mktemp("f32")
    kv = [
        ("general.architecture", G.GGUFValue.of(VT.STRING, "test")),
        ("t.f32", G.GGUFValue.of(VT.FLOAT32, np.float32(1.5))),
        ("t.f32s", G.GGUFValue.of(VT.ARRAY, np.array([0.5, -2.0, 3.0], np.float32), VT.FLOAT32)),
    ]
    src = write_gguf_stream(d / "f.gguf", [TensorDef("w", "Q8_0", (2, 64))], kv=kv)
    out = d / "f.hrry"
    gguf_to_hurray(src, out)
    with HrryFile(out) as hf:  # the records this test tampers with are what we think
        plain = [k for k in hf.kv if not k.startswith("hurray_interop.")]
        types = dict(zip(plain, hf.kv["hurray_interop.gguf.kv_types"].value))
        assert types["t.f32"] == "FLOAT32" and types["t.f32s"] == "ARRAY[FLOAT32]"
        assert hf.kv["t.f32"] == KVValue.float64(1.5)
    return out


def _export_scalar(model: Path, tmp: Path, value: float) -> Path:
    bad = rewrite_hrry(model, tmp / "x.hrry", lambda kv: {**kv, "t.f32": KVValue.float64(value)})
    out = tmp / "x.gguf"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow RuntimeWarning must not escape
        hurray_to_gguf(bad, out)
    return out


@pytest.mark.parametrize("case", sorted(KEPT))
def test_recorded_float32_that_is_one_exports_bit_exact(float_model: Path, tmp_path: Path, case: str) -> None:
    value, bits = KEPT[case]
    out = _export_scalar(float_model, tmp_path, value)
    field = gguf.GGUFReader(str(out)).fields["t.f32"]
    assert field.types == [gguf.GGUFValueType.FLOAT32]
    assert bytes(field.parts[-1]) == struct.pack("<I", bits), case


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_recorded_float32_that_is_not_one_is_refused(float_model: Path, tmp_path: Path, case: str) -> None:
    value, says = REFUSED[case]
    with pytest.raises(FormatError, match=says) as e:
        _export_scalar(float_model, tmp_path, value)
    assert "t.f32" in str(e.value) and "FLOAT32" in str(e.value) and "x.hrry" in str(e.value)
    assert not (tmp_path / "x.gguf").exists()


def test_recorded_float32_array_element_is_held_to_the_same_rule(float_model: Path, tmp_path: Path) -> None:
    ok = rewrite_hrry(float_model, tmp_path / "ok.hrry",
                      lambda kv: {**kv, "t.f32s": KVValue.array("float64", [F32_MAX, -0.0, F32_TINY])})
    hurray_to_gguf(ok, tmp_path / "ok.gguf")
    got = gguf.GGUFReader(str(tmp_path / "ok.gguf")).fields["t.f32s"]
    assert [f32_bits(float(got.parts[i][0])) for i in got.data] == [0x7F7FFFFF, 0x80000000, 0x00000001]
    for value, says in ((0.1, "not exactly representable"), (1e300, "out of range")):
        bad = rewrite_hrry(float_model, tmp_path / f"bad{value}.hrry",
                           lambda kv: {**kv, "t.f32s": KVValue.array("float64", [0.5, -0.0, value])})
        with pytest.raises(FormatError, match=f"element 2: value .* {says}") as e:
            hurray_to_gguf(bad, tmp_path / "bad.gguf")
        assert "t.f32s" in str(e.value)
        assert not (tmp_path / "bad.gguf").exists()


def test_cli_export_and_verify_of_an_overflowing_float32_exit_2(float_model: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    bad = rewrite_hrry(float_model, tmp_path / "big.hrry", lambda kv: {**kv, "t.f32": KVValue.float64(1e300)})
    out = tmp_path / "big.gguf"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["convert", str(bad), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "t.f32" in err and "out of range for FLOAT32" in err, err
    assert "Warning" not in err and "Traceback" not in err and not out.exists()
    assert main(["verify", str(float_model.parent / "f.gguf"), str(bad)]) == 2  # the pair does not pass
    assert "out of range for FLOAT32" in capsys.readouterr().err


def test_gguf_value_constructor_refuses_overflow_and_rounds_otherwise() -> None:
    """The generic constructor (the GGUF writer's API) keeps numpy's rounding to FLOAT32
    (``of(FLOAT32, 1e-5)`` as in every llama.cpp converter) but refuses a finite value that
    would become inf, without a RuntimeWarning; ``exact=True`` is the record rule."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert G.GGUFValue.of(VT.FLOAT32, 0.1).value == np.float32(0.1)
        assert G.GGUFValue.of(VT.FLOAT32, F32_MAX).value == np.float32(F32_MAX)
        assert np.isinf(G.GGUFValue.of(VT.FLOAT32, float("inf")).value)
        with pytest.raises(UsageError, match="value 1e\\+300 is out of range for FLOAT32"):
            G.GGUFValue.of(VT.FLOAT32, 1e300)
        with pytest.raises(UsageError, match="element 1: value 3.5e\\+38 is out of range for FLOAT32"):
            G.GGUFValue.of(VT.ARRAY, [1.0, 3.5e38], VT.FLOAT32)
        with pytest.raises(UsageError, match="value 0.1 is not exactly representable as FLOAT32"):
            G.GGUFValue.of(VT.FLOAT32, 0.1, exact=True)
        with pytest.raises(UsageError, match="not exactly representable as FLOAT32"):
            G.GGUFValue.of(VT.FLOAT32, 2**60 + 1, exact=True)
        assert G.GGUFValue.of(VT.FLOAT32, 2**60, exact=True).value == np.float32(2.0**60)
        assert G.GGUFValue.of(VT.FLOAT64, 0.1, exact=True).value == np.float64(0.1)


# ---------------------------------------------------------------------------
# 2. stored stand-in scales of recorded all-zero blocks

from hurray_interop.conversions import gguf_exact  # noqa: E402
from hurray_interop.core.records import decode_scale_record, scale_record_key  # noqa: E402


@pytest.fixture(scope="module")
def imported(fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imp") / "m.hrry"
    gguf_to_hurray(fixtures_dir / "tiny-llama.gguf", out)
    return out


def scale_buffer(hf: HrryFile, name: str) -> tuple[int, np.dtype]:
    """File offset and dtype of the scale buffer of tensor (or member) ``name``."""
    q = hf.descriptor(name).quantization
    dt = np.dtype("u1") if q.__class__.__name__ == "MXFP" else np.dtype(f"<f{q.scale_type.bits // 8}")
    return hf.buffer_offsets(name)[q.scale_buffer_index], dt


def patch_scale(src: Path, dst: Path, name: str, block: int, value) -> Path:
    """Copy ``src`` with the stored scale of ``block`` of ``name`` set to ``value`` (bytes on disk)."""
    with HrryFile(src) as hf:
        off, dt = scale_buffer(hf, name)
    raw = bytearray(src.read_bytes())
    new = np.array([value], dtype=dt).tobytes()
    at = off + block * dt.itemsize
    assert raw[at : at + dt.itemsize] != new, "the tampering must change the stored scale"
    raw[at : at + dt.itemsize] = new
    dst.write_bytes(bytes(raw))
    return dst


def recorded(hf: HrryFile, name: str) -> tuple[np.ndarray, np.ndarray]:
    return decode_scale_record(hf.kv[scale_record_key(name)].value)


STAND_IN = "stored scale .* is not the stand-in"
#: (the compact forms' all-zero Q4_1/Q5_1 blocks are flipped too: stand-in d = +1 stored as −1 with the
#: broadcast scale qmax; a changed base scale no longer reads as flipped, and is then not the stand-in)
#: (recorded tensor or member, a stored scale that is not the stand-in, what the export says)
NATIVE = {
    "Q8_0 f16 1.0 -> 7.0": ("token_embd.weight", 7.0, STAND_IN),
    "Q8_0 f16 +1.0 -> -1.0": ("blk.0.attn_q.weight", -1.0, STAND_IN),
    "Q4_0 f16 -1.0 (for -0) -> +1.0": ("blk.0.attn_k.weight", 1.0, STAND_IN),
    "Q5_0 base f16 -1.0 -> 7.0": ("blk.0.attn_output.weight.base", 7.0, STAND_IN),
    "Q4_1 overlay base f16 -> 7.0": ("blk.0.attn_v.weight.base", 7.0, STAND_IN),
    "Q5_1 overlay base f16 -> 0.5": ("blk.0.ffn_gate.weight.base", 0.5, STAND_IN),
    "MXFP4 E8M0 0x7F -> 0x7B": ("blk.0.ffn_up.weight", 0x7B, STAND_IN),
    "MXFP4 E8M0 0x7F -> 0x80": ("extra.experts_mxfp4", 0x80, STAND_IN),
}


@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("case", sorted(NATIVE))
def test_stored_stand_in_that_the_rules_do_not_write_is_refused(imported: Path, tmp_path: Path, case: str,
                                                                where: str) -> None:
    name, value, says = NATIVE[case]
    with HrryFile(imported) as hf:
        blocks, _ = recorded(hf, name)
        assert blocks.size >= 2
        block = int(blocks[0] if where == "first" else blocks[-1])
    bad = patch_scale(imported, tmp_path / "bad.hrry", name, block, value)
    out = tmp_path / "o.gguf"
    with pytest.raises(FormatError, match=f"block {block}: {says}") as e:
        hurray_to_gguf(bad, out)
    tensor = name.removesuffix(".base")
    assert str(bad) in str(e.value) and repr(tensor)[:-1] in str(e.value)
    assert not out.exists()


def test_untampered_stand_ins_export_byte_identical(imported: Path, fixtures_dir: Path, tmp_path: Path) -> None:
    hurray_to_gguf(imported, tmp_path / "o.gguf")
    assert (tmp_path / "o.gguf").read_bytes() == (fixtures_dir / "tiny-llama.gguf").read_bytes()


def test_recorded_original_that_is_not_a_forbidden_scale_is_refused(imported: Path, tmp_path: Path) -> None:
    key = scale_record_key("token_embd.weight")

    def edit(kv):
        raw = bytearray(kv[key].value)
        count = struct.unpack_from("<Q", raw, 4)[0]
        raw[12 + 8 * count : 12 + 8 * count + 2] = np.float16(5.0).tobytes()  # the first original: 5.0, not ±0
        return {**kv, key: KVValue.bytes(bytes(raw))}

    bad = rewrite_hrry(imported, tmp_path / "bad.hrry", edit)
    with pytest.raises(FormatError, match="block 0: the recorded original scale 5.0 is not one the import replaces"):
        hurray_to_gguf(bad, tmp_path / "o.gguf")
    assert not (tmp_path / "o.gguf").exists()


def test_overlay_correction_of_a_zero_minimum_must_have_the_scale_one(fixtures_dir: Path, tmp_path: Path) -> None:
    """The per-element minimum overlay (§ 3a; files of earlier versions, and tensors the compact
    form cannot hold): m = ±0 is stored as correction codes 0 with scale ±1 (not recorded: the form says it)."""
    imported = fixtures_dir / "legacy" / "tiny-llama.hrry"
    name = "blk.0.attn_v.weight.min"
    with HrryFile(imported) as hf:
        codes = hf.tensor(name).data[0].reshape(-1, 8)
        zero = np.flatnonzero((codes == 0).all(axis=1))
        assert zero.size >= 2
    for block in (int(zero[0]), int(zero[-1])):
        bad = patch_scale(imported, tmp_path / f"bad{block}.hrry", name, block, 7.0)
        with pytest.raises(FormatError, match=f"block {block}: overlay correction with codes 0 .* scale 7.0"):
            hurray_to_gguf(bad, tmp_path / "o.gguf")
        assert not (tmp_path / "o.gguf").exists()
    ok = patch_scale(imported, tmp_path / "ok.hrry", name, int(zero[0]), -1.0)  # the other stand-in: m = -0
    hurray_to_gguf(ok, tmp_path / "ok.gguf")


def test_cli_convert_and_verify_of_a_changed_stand_in_exit_2(imported: Path, fixtures_dir: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The hostile-input campaign's case: ``verify`` passed ("files byte-identical") because the
    export restored the recorded original whatever was stored."""
    for name, value in (("token_embd.weight", 7.0), ("blk.0.ffn_up.weight", 0x7B)):
        bad = patch_scale(imported, tmp_path / "bad.hrry", name, 1, value)
        out = tmp_path / "o.gguf"
        assert main(["convert", str(bad), str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and not out.exists()
        assert str(bad) in err and repr(name) in err and "block 1" in err
        assert main(["verify", str(fixtures_dir / "tiny-llama.gguf"), str(bad)]) == 2
        assert "is not the stand-in" in capsys.readouterr().err


@pytest.mark.parametrize("fixture", ["gpt-oss-tiny.safetensors", "ct-mxfp4-tiny.safetensors", "mxfp8-tiny.safetensors"])
def test_mx_safetensors_stand_in_is_checked_on_export(fixtures_dir: Path, tmp_path: Path, fixture: str) -> None:
    from hurray_interop.conversions.safetensors import hurray_to_safetensors, safetensors_to_hurray

    h = tmp_path / "m.hrry"
    safetensors_to_hurray(fixtures_dir / fixture, h)
    with HrryFile(h) as hf:
        key = next(k for k in hf.kv if k.startswith("hurray_interop.scale_substitutions."))
        name = key.removeprefix("hurray_interop.scale_substitutions.")
        blocks, _ = recorded(hf, name)
    hurray_to_safetensors(h, tmp_path / "ok.safetensors")  # untampered: exports
    bad = patch_scale(h, tmp_path / "bad.hrry", name, int(blocks[-1]), 0x7E)
    with pytest.raises(FormatError, match=f"block {int(blocks[-1])}: stored scale 0x7e is not the stand-in 0x7f"):
        hurray_to_safetensors(bad, tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()


@pytest.fixture(scope="module")
def expanded(fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("exact") / "x.hrry"
    gguf_to_hurray(fixtures_dir / "ggml-quantized-types.gguf", out, fallback="exact")
    return out


def _expanded_names(path: Path) -> list[tuple[str, str]]:
    with HrryFile(path) as hf:
        out = []
        for n in hf.top_level_names():
            if gguf_exact.has_record(hf.kv, n):
                t = hf.tensor(n)
                out.append((n, (t.members[0] if t.members else t).name))
        return out


def _same_values(bad: Path, out: Path, top: str) -> bool:
    """Does the exported GGUF tensor ``top`` decode (gguf-py) to the .hrry's values, as bits?"""
    with HrryFile(bad) as hf:
        ours = dequantize(hf.tensor(top))
    info = next(t for t in gguf.GGUFReader(out).tensors if t.name == top)
    theirs = gguf.quants.dequantize(info.data, info.tensor_type).astype(np.float32).reshape(ours.shape)
    return bool(np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)))


def test_expanded_forms_refuse_a_changed_stand_in(expanded: Path, tmp_path: Path) -> None:
    """``--fallback exact``: a zero-scale sub-block is stored with the scale ±1 (docs/conversion-rules.md
    § 9); any other stored scale there is refused, for every expanded type (the export proves every
    stored scale against the record's headers) -- or, where the changed scales still factor into a
    header of the derived record (a flipped stand-in of a compact form turned into a real scale,
    § 11), the export is that header's block: the GGUF then means exactly what the .hrry means."""
    names = _expanded_names(expanded)
    assert len(names) >= 17
    wrong = []
    for top, name in names:
        with HrryFile(expanded) as hf:
            t = hf.tensor(name)
            q = t.descriptor.quantization
            s = t.data[q.scale_buffer_index].view(f"<f{q.scale_type.bits // 8}")
            ones = np.flatnonzero(np.abs(s) == 1)
            assert ones.size, name
            block, value = int(ones[-1]), float(-s[ones[-1]])  # the stand-in of the other sign
        bad = patch_scale(expanded, tmp_path / "bad.hrry", name, block, value)
        try:
            hurray_to_gguf(bad, tmp_path / "o.gguf")
            if not _same_values(bad, tmp_path / "o.gguf", top):
                wrong.append(f"{top}: accepted with other values")
            (tmp_path / "o.gguf").unlink()
        except FormatError as e:
            if top not in str(e) or "block" not in str(e):
                wrong.append(f"{top}: {e}")
        assert not (tmp_path / "o.gguf").exists()
        bad.unlink()
    assert not wrong, "\n".join(wrong)
