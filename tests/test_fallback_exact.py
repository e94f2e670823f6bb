"""``--fallback exact`` (docs/conversion-rules.md § 9): GGUF types without a native mapping stored in
their exact expanded form, restored byte for byte.

Oracles: gguf-py 0.19.0's ``gguf.quants.dequantize`` (values compared as uint32 bits, so ±0
counts), the source GGUF's own bytes (round trips), and pyhurray (``hurray.load``).
Blocks: ggml's own quantizer (``fixtures/ggml-quantized-types.gguf``) and random well-formed
blocks (``test_gguf_expanded.random_blocks``: sane f16 scales, d = ±0 over stale codes,
all-zero blocks, f16 extremes).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf_factory import tensor_bytes, write_gguf_raw
from test_gguf_expanded import random_blocks

from hurray_interop._inspect import inspect_file
from hurray_interop._verify import verify_roundtrip
from hurray_interop.cli import main
from hurray_interop.conversions import gguf_exact
from hurray_interop.conversions.gguf import gguf_to_hurray, hurray_to_gguf, plan_gguf
from hurray_interop.conversions.gguf_expanded import EXPANDED_TYPES, form
from hurray_interop.core.hrry import HrryFile, HrryWriter
from hurray_interop.core.kv import KVValue
from hurray_interop.dequant import dequantize
from hurray_interop.errors import FormatError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ggml-quantized-types.gguf"


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).reshape(-1).view(np.uint32)


def gguf_tensors(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (GGML type, gguf-py's float32 values)."""
    r = gguf.GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, gguf_dequantize(np.asarray(t.data), t.tensor_type)) for t in r.tensors}


def assert_values_bit_exact(src: Path, hrry: Path) -> None:
    with HrryFile(hrry) as hf:
        for name, (tname, ref) in gguf_tensors(src).items():
            got = dequantize(hf.tensor(name))
            assert got.shape == ref.shape, name
            diff = np.flatnonzero(bits(got) != bits(ref))
            assert diff.size == 0, f"{name} ({tname}): {diff.size} values differ, first at {diff[0]}"


def assert_round_trip(src: Path, tmp: Path) -> Path:
    hrry = tmp / (src.stem + ".hrry")
    gguf_to_hurray(src, hrry, fallback="exact", force=True)
    back = tmp / (src.stem + ".back.gguf")
    hurray_to_gguf(hrry, back, force=True)
    assert back.read_bytes() == src.read_bytes()
    return hrry


@pytest.fixture(scope="module")
def fixture_hrry(tmp_path_factory) -> Path:
    assert FIXTURE.is_file(), f"{FIXTURE} is committed; regenerate: python fixtures/make_kquant_fixtures.py"
    return assert_round_trip(FIXTURE, tmp_path_factory.mktemp("exact"))


# --- ggml's quantizer and random blocks: values and bytes ---------------------------------


def test_ggml_fixture_round_trips_byte_identical_and_values_are_gguf_py_bits(fixture_hrry: Path) -> None:
    assert_values_bit_exact(FIXTURE, fixture_hrry)


def random_model(t: str, path: Path, n: int = 96) -> Path:
    blocks = random_blocks(t, n, seed=7 + sum(map(ord, t)))
    elems = gguf.GGML_QUANT_SIZES[Q[t]][0]
    return write_gguf_raw(path, [(f"w.{t}", t, (n * elems // 512, 512), blocks)])


@pytest.mark.parametrize("t", EXPANDED_TYPES)
def test_random_blocks_round_trip_and_bit_exact(t: str, tmp_path: Path) -> None:
    src = random_model(t, tmp_path / f"{t}.gguf")
    hrry = assert_round_trip(src, tmp_path)
    assert_values_bit_exact(src, hrry)
    hurray = pytest.importorskip("hurray")
    x = hurray.load(str(hrry))[f"w.{t}"]  # composite or not, pyhurray reads it
    assert tuple(x.shape) == (96 * gguf.GGML_QUANT_SIZES[Q[t]][0] // 512, 512)


def test_pyhurray_loads_every_form(fixture_hrry: Path) -> None:
    hurray = pytest.importorskip("hurray")
    loaded = hurray.load(str(fixture_hrry))
    with HrryFile(fixture_hrry) as hf:
        for t in EXPANDED_TYPES:
            name, f = f"q.{t}", form(t)
            x = loaded[name]
            assert tuple(x.shape) == (32, 512)
            ours = hf.tensor(name)
            if ours.descriptor.is_composite:
                assert isinstance(x, hurray.Composite)
                assert str(x.dtype).endswith("float32")
                members = list(x.members)
                assert len(members) == len(ours.members)
                # the compact forms of docs/conversion-rules.md § 11: base (low plane), high-bit
                # plane, the broadcast minimum (uint8, one code byte); the per-element form otherwise
                want = [f.base_storage] + ["uint2"] * f.planes + ["uint8"] * f.overlay if f.compact else \
                    [f.storage] + ["uint2"] * f.overlay
                for m, storage in zip(members, want):
                    assert str(m.dtype).endswith(storage) and tuple(m.shape) == (32, 512)
                for m in members[len(want) :]:  # zero patches: float32 (1, K) boxes
                    assert str(m.dtype).endswith("float32") and tuple(m.shape) == (1, f.sub_block)
            else:
                assert not f.overlay
                assert str(x.dtype).endswith(f.storage)


# --- a real-style model: Q4_K_M-like mix --------------------------------------------------


def fixture_blocks(t: str) -> np.ndarray:
    r = gguf.GGUFReader(str(FIXTURE))
    data = next(np.asarray(x.data) for x in r.tensors if x.name == f"q.{t}")
    return data.reshape(-1, gguf.GGML_QUANT_SIZES[Q[t]][1])


@pytest.fixture
def mixed_model(tmp_path: Path) -> Path:
    """Q4_K + Q6_K (ggml's quantizer) + Q5_0 + Q8_0 + F32, as in llama.cpp's Q4_K_M."""
    assert FIXTURE.is_file(), f"{FIXTURE} is committed; regenerate: python fixtures/make_kquant_fixtures.py"
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    return write_gguf_raw(tmp_path / "mixed.gguf", [
        ("blk.0.attn_q.weight", "Q4_K", (32, 512), fixture_blocks("Q4_K")),
        ("blk.0.ffn_down.weight", "Q6_K", (32, 512), fixture_blocks("Q6_K")),
        ("blk.0.attn_v.weight", "Q5_0", (8, 256), tensor_bytes("Q5_0", x)),
        ("token_embd.weight", "Q8_0", (8, 256), tensor_bytes("Q8_0", x)),
        ("blk.0.attn_norm.weight", "F32", (256,), x[0]),
    ])


def test_mixed_model_round_trips_byte_identical(mixed_model: Path, tmp_path: Path) -> None:
    hrry = assert_round_trip(mixed_model, tmp_path)
    assert_values_bit_exact(mixed_model, hrry)
    rep = plan_gguf(mixed_model, fallback="exact")
    by = {t.name: t for t in rep.tensors}
    assert by["blk.0.attn_q.weight"].mapping == form("Q4_K").describe()
    assert by["blk.0.attn_q.weight"].status == "exact" and "4.5 → " in by["blk.0.attn_q.weight"].reason
    assert by["blk.0.attn_v.weight"].mapping.startswith("compact overlay(add)")  # Q5_0: its native mapping
    assert any(n.startswith("--fallback exact: 2 tensor(s)") for n in rep.form_notes)


def test_dry_run_and_inspect_show_the_same_plan(mixed_model: Path) -> None:
    rep = plan_gguf(mixed_model, fallback="exact")
    rows = inspect_file(mixed_model, fallback="exact")["tensors"]
    assert [(r["name"], r["hurray_mapping"], r["status"], r["bytes_out"]) for r in rows] == [
        (t.name, t.mapping, t.status, t.bytes_out) for t in rep.tensors
    ]


def test_verify_fallback_exact(mixed_model: Path, capsys) -> None:
    r = verify_roundtrip(mixed_model, fallback="exact")
    assert r.ok and r.file_bytes_equal
    assert all(t.values_equal and t.bytes_equal for t in r.tensors)
    assert main(["verify", "--fallback", "exact", str(mixed_model)]) == 0
    assert main(["verify", str(mixed_model)]) == 1  # without it: the K-quants are refused


def test_default_refusal_unchanged(mixed_model: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "o.hrry"
    assert main(["convert", str(mixed_model), str(out), "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert not out.exists()
    refused = [line for line in err if "blk.0.attn_q.weight" in line or "blk.0.ffn_down.weight" in line]
    assert len(refused) == 2 and all("Q4_K" in s or "Q6_K" in s for s in refused)
    assert "exact" not in " ".join(refused)  # the per-tensor lines are as before
    assert "choose --fallback exact to store them exactly" in err[-1]  # the summary names the way out


def test_exact_excludes_lossy_options(mixed_model: Path, tmp_path: Path) -> None:
    assert main(["convert", str(mixed_model), str(tmp_path / "o.hrry"), "--fallback", "exact",
                 "--q4-1", "requantize"]) == 2


def test_types_without_a_reference_decoder_stay_refused(tmp_path: Path, capsys) -> None:
    q8k = np.zeros((2, gguf.GGML_QUANT_SIZES[Q.Q8_K][1]), dtype=np.uint8)
    src = write_gguf_raw(tmp_path / "q8k.gguf", [("w", "Q8_K", (512,), q8k)])
    out = tmp_path / "o.hrry"
    assert main(["convert", str(src), str(out), "--fallback", "exact", "-q"]) == 1
    assert not out.exists() and "no exact expanded form" in capsys.readouterr().err


def test_non_finite_super_block_scale_refused_naming_tensor_and_block(tmp_path: Path, capsys) -> None:
    blocks = random_blocks("Q4_K", 16, seed=1)
    blocks[5, 2:4] = np.array([np.inf], dtype=np.float16).view(np.uint8)  # dmin = inf
    src = write_gguf_raw(tmp_path / "inf.gguf", [("w.inf", "Q4_K", (8, 512), blocks)])
    out = tmp_path / "o.hrry"
    assert main(["convert", str(src), str(out), "--fallback", "exact", "-q"]) == 1
    err = capsys.readouterr().err
    assert not out.exists() and "w.inf" in err and "block 5" in err and "dmin" in err


# --- corrupt records: located errors, exit 2, nothing written ------------------------------


def rewrite(src: Path, dst: Path, *, kv_edit=None, tensor: str | None = None, member: int = 0,
            buffer: int = 0, edit=None) -> Path:
    """Copy a .hrry with its KV edited and/or one buffer of one (member of a) tensor edited."""
    with HrryFile(src) as hf:
        kv = dict(hf.kv)
        if kv_edit:
            kv_edit(kv)
        with HrryWriter(dst) as w:
            for n in hf.top_level_names():
                t = hf.tensor(n)
                if n == tensor:
                    target = t.members[member] if t.members else t
                    data = list(target.data)
                    data[buffer] = edit(data[buffer].copy())
                    new = dataclasses.replace(target, data=tuple(data))
                    if t.members:
                        ms = list(t.members)
                        ms[member] = new
                        t = dataclasses.replace(t, members=tuple(ms))
                    else:
                        t = new
                w.write_tensor(t)
            w.finish(kv)
    return dst


def _stale_scale(b: np.ndarray) -> np.ndarray:
    s = b.view("<u4")
    s[16] ^= 1  # one ulp: float32(d·sc) no longer matches the record (Q4_K: 8 sub-blocks, so block 2)
    return b


def _q3k_code_out_of_range(b: np.ndarray) -> np.ndarray:
    b[300] = (b[300] & 0xF0) | 0x07  # int4 code 7: Q3_K codes are −4..3 (element 600 = block 2)
    return b


def _truncate(kv: dict) -> None:
    key = gguf_exact.derived_key("q.Q3_K")  # (Q3_K: exception blocks; Q4_K's derived record is empty)
    kv[key] = KVValue("bytes", kv[key].value[:-1])


CORRUPTIONS = {
    "wrong length": dict(kv_edit=_truncate),
    "stale scale": dict(tensor="q.Q4_K", member=0, buffer=1, edit=_stale_scale),
    "code out of range": dict(tensor="q.Q3_K", member=0, buffer=0, edit=_q3k_code_out_of_range),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_record_is_a_located_error(case: str, fixture_hrry: Path, tmp_path: Path, capsys) -> None:
    bad = rewrite(fixture_hrry, tmp_path / "bad.hrry", **CORRUPTIONS[case])
    out = tmp_path / "o.gguf"
    with pytest.raises(FormatError) as e:
        hurray_to_gguf(bad, out)
    assert not out.exists()
    msg = str(e.value)
    assert str(bad) in msg and ("q.Q4_K" in msg or "q.Q3_K" in msg)
    if case != "wrong length":
        assert "block 2" in msg
    assert main(["convert", str(bad), str(out)]) == 2
    assert not out.exists() and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_expanded_tensor_without_record_exports_only_by_fallback(fixture_hrry: Path, tmp_path: Path) -> None:
    def drop(kv: dict) -> None:
        del kv[gguf_exact.derived_key("q.Q4_K")]

    bad = rewrite(fixture_hrry, tmp_path / "norec.hrry", kv_edit=drop)
    rep = hurray_to_gguf(bad, None, dry_run=True)
    assert {t.name: t.status for t in rep.tensors}["q.Q4_K"] == "refused"
    rep = hurray_to_gguf(bad, tmp_path / "f32.gguf", fallback="float32")
    q4k = {t.name: t for t in rep.tensors}["q.Q4_K"]
    assert q4k.mapping == "F32 (fallback)" and q4k.status == "value-exact"


def test_zero_patches_in_1d_and_3d_tensors(tmp_path: Path) -> None:
    """Zero patches are (1, …, 1, K) boxes at the sub-block's offset whatever the rank."""
    src = write_gguf_raw(tmp_path / "ranks.gguf", [
        ("a", "Q6_K", (2, 3, 1024), random_blocks("Q6_K", 24, 5)),
        ("b", "Q3_K", (4096,), random_blocks("Q3_K", 16, 6)),
        ("c", "IQ2_XS", (2, 2, 1024), random_blocks("IQ2_XS", 16, 7)),
    ])
    hrry = assert_round_trip(src, tmp_path)
    assert_values_bit_exact(src, hrry)
    with HrryFile(hrry) as hf:
        for name in "abc":
            t = hf.tensor(name)
            assert t.descriptor.is_composite and len(t.members) > 1  # random d = ±0 rows mix ±0
            for m in t.members[1:]:
                assert m.descriptor.shape[:-1] == (1,) * (len(t.descriptor.shape) - 1)


def test_record_spooled_chunk_by_chunk_equals_the_whole_tensor_record(tmp_path: Path) -> None:
    """The import spools the record per chunk (headers, then exception entries copied after
    them) and streams it into the KV section: it must equal the record of one expansion of
    the whole tensor, over several chunks with exception blocks in each."""
    from hurray_interop.conversions import gguf_expanded as X

    n = 2 * gguf_exact.CHUNK_BLOCKS + 124
    blocks = {t: random_blocks(t, n, seed=9) for t in ("Q4_K", "Q3_K")}
    src = write_gguf_raw(tmp_path / "chunks.gguf", [(f"w.{t}", t, (n // 2, 512), b) for t, b in blocks.items()])
    hrry = assert_round_trip(src, tmp_path)
    with HrryFile(hrry) as hf:
        for t, b in blocks.items():
            x = X.expand(t, b)
            want = X.DerivedRecord.of(x, X.stand_ins(t, x.scales, codes=x.codes))
            assert np.unique(want.exception_index // gguf_exact.CHUNK_BLOCKS).size == 3  # every chunk has some
            assert np.unique(want.index // gguf_exact.CHUNK_BLOCKS).size >= 2  # (random headers: recorded too)
            assert hf.kv[gguf_exact.derived_key(f"w.{t}")].value == want.to_bytes()


@pytest.mark.parametrize("width", [4, 8, 3])
def test_correction_codes_read_per_sub_block(width: int) -> None:
    """Whole sub-blocks of uint2 correction codes read as 1 (all 0b01), 0 (all zero) or 2
    (anything else), as one integer per sub-block where the width allows."""
    rng = np.random.default_rng(width)
    rows = np.where(rng.random((500, 1)) < 0.5, 0x55, 0).astype(np.uint8).repeat(width, axis=1)
    rows[rng.integers(0, 500, 40), rng.integers(0, width, 40)] ^= rng.integers(1, 256, 40).astype(np.uint8)
    want = np.where((rows == 0x55).all(axis=1), 1, np.where((rows == 0).all(axis=1), 0, 2))
    got = gguf_exact._sub_block_codes(rows.reshape(-1), width)
    assert got.dtype == np.uint8 and np.array_equal(got, want) and set(np.unique(got)) == {0, 1, 2}
