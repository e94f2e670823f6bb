"""verify's two oracles: ggml's own C dequantizers (``to_float`` of libggml-python, through
:mod:`hurray_interop.formats.gguf_ggml`) and gguf-py's ``gguf.quants.dequantize``.

* One contract: on every type both decode, and every GGUF file the suite has, the two give
  the same float32 bit patterns (±0 and NaN payloads included) -- on ggml's quantizer
  output and on random bytes (NaN/Inf scales, e8m0 0xFF, anything).
* C is given only checked arrays: wrong dtype, shape, block size, contiguity, output size
  (at the limit −1, 0, +1), overlap or a type whose geometry the library reports otherwise
  are refused before the call; a fuzzed GGUF that the reader accepts decodes safely (the
  campaign runs in a child process: a crash would fail it).
* The choice is said: ``--oracle``, the default (ggml where it loads, else gguf-py), the
  summary line, the report and ``--json``; asking for ggml where it does not load is one
  error line and exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hurray_interop import verify
from hurray_interop.conversions.gguf import reference_dequantizer
from hurray_interop.errors import UsageError
from hurray_interop.formats import gguf as G
from hurray_interop.formats import gguf_ggml as ggml
from hurray_interop.verification import gguf as VG

from fuzzing import fuzz_count, run_campaign, run_cli

pytestmark = pytest.mark.skipif(not ggml.available(), reason=f"ggml's library does not load: {ggml.unavailable_reason()}")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BLOCK_TYPES = [t for t in G.ggml_types() if t.block_elements > 1]


def _both(t: "G.GGMLType") -> bool:
    return ggml.has_decoder(t.id, t.block_elements, t.block_bytes) and reference_dequantizer(t) is not None


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a, np.float32).reshape(-1), np.ascontiguousarray(b, np.float32).reshape(-1)
    return a.shape == b.shape and bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))


def test_ggml_decodes_what_gguf_py_does_and_q1_0_q2_0() -> None:
    ours = {t.name for t in G.ggml_types() if ggml.has_decoder(t.id, t.block_elements, t.block_bytes)}
    gpy = {t.name for t in BLOCK_TYPES if reference_dequantizer(t) is not None}
    assert len(gpy) >= 22
    assert gpy <= ours
    # BF16: numpy's shift under gguf-py; F16's to_float is refused (it quiets signalling NaNs)
    assert ours - gpy == {"Q1_0", "Q2_0", "BF16"} and "F16" not in ours


#: the lookup-grid types whose NaN values (a NaN f16 ``d``, never written by a quantizer) carry
#: another sign bit in C than in numpy: C multiplies ``d·(…)·grid``, gguf-py in another order,
#: and x86 keeps the sign of the NaN operand met first (docs/format-notes.md § 1.8)
NAN_SIGN_DIFFERS = {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"}


@pytest.mark.parametrize("t", [t for t in BLOCK_TYPES if _both(t)], ids=lambda t: t.name)
def test_both_oracles_agree_on_random_bytes(t: "G.GGMLType") -> None:
    rng = np.random.default_rng(t.id)
    blocks = rng.integers(0, 256, size=(512, t.block_bytes), dtype=np.uint8)
    theirs = reference_dequantizer(t)(blocks.reshape(1, -1)).reshape(-1)
    ours = ggml.decode_blocks(t.id, t.block_elements, t.block_bytes, blocks)
    assert ours.size == 512 * t.block_elements
    differ = ours.view(np.uint32) != theirs.view(np.uint32)
    if t.name in NAN_SIGN_DIFFERS:
        assert differ.any()  # random bytes do hold NaN scales
        sign = np.uint32(0x7FFFFFFF)
        assert np.isnan(ours[differ]).all() and np.isnan(theirs[differ]).all()
        assert np.array_equal(ours.view(np.uint32)[differ] & sign, theirs.view(np.uint32)[differ] & sign)
    else:
        assert not differ.any()


@pytest.mark.parametrize("name", sorted(NAN_SIGN_DIFFERS))
def test_a_nan_scale_of_those_types_never_reaches_a_value_check(tmp_path: Path, name: str) -> None:
    """The one disagreement (the sign of NaN) cannot decide a verdict: the import refuses the tensor."""
    import gguf

    t = gguf.GGMLQuantizationType[name]
    raw = np.random.default_rng(1).integers(0, 256, size=(2, 2 * gguf.GGML_QUANT_SIZES[t][1]), dtype=np.uint8)
    raw[:, :2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)  # d of each row's first block
    w = gguf.GGUFWriter(str(tmp_path / "nan.gguf"), "llama")
    w.add_tensor("t", raw, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for oracle in ("ggml", "gguf-py"):
        r = verify(tmp_path / "nan.gguf", fallback="exact", oracle=oracle)
        (chk,) = r.tensors
        assert not r.ok and chk.mapping == "refused" and "super-block scale d is not finite" in chk.where


def _gguf_files(samples: Path | None) -> list[Path]:
    files = sorted(FIXTURES.glob("*.gguf")) + sorted((FIXTURES / "legacy").glob("*.gguf"))
    return files + (sorted(samples.glob("*.gguf")) if samples is not None else [])


@pytest.mark.parametrize("name", [p.name for p in _gguf_files(None)])
def test_both_oracles_agree_on_every_fixture(name: str) -> None:
    _agree(FIXTURES / name)


def test_both_oracles_agree_on_the_shared_samples(gguf_samples_dir: Path) -> None:
    files = sorted(gguf_samples_dir.glob("*.gguf"))
    assert files
    for p in files:
        _agree(p)


def _agree(path: Path) -> None:
    compared = 0
    with G.read_gguf(path) as gf:
        expected = len(gf.tensors)
        for info in gf.tensors:
            a, b = VG._reference(info, "ggml"), VG._reference(info, "gguf-py")
            assert (a is None) == (b is None), info.name
            if a is None:
                continue
            n = info.data.size // info.ggml_type.block_bytes
            assert same_bits(a(0, n), b(0, n)), (path.name, info.name, info.type_name)
            # a window in the middle, as the value check asks for them
            lo, hi = n // 3, max(n // 3 + 1, 2 * n // 3)
            if hi <= n:
                assert same_bits(a(lo, hi), b(lo, hi)), (path.name, info.name)
            compared += 1
    assert compared == expected  # every tensor of the suite's files has a decoder under both


def test_the_fixtures_cover_every_type_both_decode() -> None:
    present: set[str] = set()
    for p in _gguf_files(None):
        with G.read_gguf(p) as gf:
            present |= {t.type_name for t in gf.tensors}
    assert {t.name for t in BLOCK_TYPES if _both(t)} <= present


# ---------------------------------------------------------------------------
# only checked arrays reach C


Q4_0 = G.ggml_type("Q4_0")
GEO = (Q4_0.id, Q4_0.block_elements, Q4_0.block_bytes)


def _blocks(n: int = 4) -> np.ndarray:
    b = np.zeros((n, Q4_0.block_bytes), dtype=np.uint8)
    b[:, 0:2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    b[:, 2:] = 0x9A
    return b


def test_decode_blocks_values() -> None:
    out = ggml.decode_blocks(*GEO, _blocks())
    # q = 0xA (low nibbles, elements 0..15) and 0x9 (high, 16..31), minus 8, times d = 1
    assert out.tolist() == ([2.0] * 16 + [1.0] * 16) * 4


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_decode_blocks_output_size_at_its_limit(delta: int) -> None:
    n = 4 * Q4_0.block_elements
    out = np.full(n + delta, 7.0, dtype=np.float32)
    if delta:
        with pytest.raises(UsageError, match="writes 128 values"):
            ggml.decode_blocks(*GEO, _blocks(), out)
        assert (out == 7.0).all()  # untouched: nothing reached C
    else:
        assert ggml.decode_blocks(*GEO, _blocks(), out) is out
        assert (out != 7.0).all()


@pytest.mark.parametrize("case", ["dtype", "ndim", "block_bytes-1", "block_bytes+1", "strided", "list"])
def test_decode_blocks_refuses_unchecked_input(case: str) -> None:
    b = _blocks(8)
    bad = {
        "dtype": b.view(np.int8),
        "ndim": b.reshape(-1),
        "block_bytes-1": b.reshape(-1)[: 8 * 17].reshape(8, 17),
        "block_bytes+1": b.reshape(-1)[: 7 * 19].reshape(7, 19),
        "strided": b[::2],
        "list": b.tolist(),
    }[case]
    with pytest.raises(UsageError, match="C-contiguous uint8 blocks of 18 bytes"):
        ggml.decode_blocks(*GEO, bad)


def test_decode_blocks_refuses_bad_outputs() -> None:
    n = 4 * Q4_0.block_elements
    ro = np.zeros(n, np.float32)
    ro.flags.writeable = False
    for out in (np.zeros(n, np.float64), np.zeros(2 * n, np.float32)[::2], ro):
        with pytest.raises(UsageError, match="C-contiguous, writeable float32"):
            ggml.decode_blocks(*GEO, _blocks(), out)
    shared = np.zeros(n * 4, np.uint8)
    blocks = shared[: 4 * Q4_0.block_bytes].reshape(4, -1)
    with pytest.raises(UsageError, match="apart from its input"):
        ggml.decode_blocks(*GEO, blocks, shared.view(np.float32))


@pytest.mark.parametrize("geometry", [(2, 32, 17), (2, 32, 19), (2, 31, 18), (2, 33, 18), (9, 32, 36), (15, 256, 292),
                                      (-1, 32, 18), (43, 32, 18), (1000, 32, 18), (0, 1, 4)])
def test_no_decoder_for_other_geometries_ids_or_types_without_to_float(geometry: tuple[int, int, int]) -> None:
    # Q4_0 with a block size off by one, Q8_1/Q8_K (no to_float), ids outside the enum, F32 (none)
    assert not ggml.has_decoder(*geometry)
    with pytest.raises(UsageError, match="ggml has no decoder"):
        ggml.decode_blocks(*geometry, np.zeros((1, max(geometry[2], 1)), np.uint8))


def test_fuzzed_gguf_reaches_c_only_through_checked_views(fixtures_dir: Path) -> None:
    r = run_campaign("gguf-ggml", fixtures_dir / "ggml-quantized-types.gguf", fuzz_count(150), 23)
    assert r["escape_count"] == 0, r["escapes"]
    assert r["errors"] > 0 and r["accepted"] > 0  # both kinds of mutant ran: rejected ones, decoded ones


# ---------------------------------------------------------------------------
# the choice, said


def test_default_oracle_is_ggml_and_the_report_says_so() -> None:
    r = verify(FIXTURES / "tiny-llama.gguf")
    assert r.ok and r.oracle == "ggml"
    assert f"libggml-python {ggml.version()}" in r.oracle_version
    assert r.summary_line().startswith("OK     ") and ": round-trip (oracle ggml), files byte-identical" in r.summary_line()
    d = r.to_dict()
    assert d["oracle"] == "ggml" and "(oracle ggml)" in d["summary"]


@pytest.mark.parametrize("oracle", ["ggml", "gguf-py"])
def test_cli_oracle_named_in_table_summary_and_json(oracle: str) -> None:
    path = str(FIXTURES / "tiny-llama-kquant.gguf")
    status, out, err = run_cli(["verify", path, "--fallback", "exact", "--oracle", oracle])
    assert status == 0, err
    assert f": round-trip (oracle {oracle}), files byte-identical" in out.splitlines()[-1]
    assert f"values held to {oracle}: " in out
    status, out, _ = run_cli(["verify", path, "--fallback", "exact", "--oracle", oracle, "--json"])
    (d,) = json.loads(out)
    assert status == 0 and d["oracle"] == oracle and d["ok"]
    assert ("libggml-python" if oracle == "ggml" else "gguf ") in d["oracle_version"]


def test_both_oracles_pass_the_exact_forms_alike() -> None:
    results = [verify(FIXTURES / "ggml-quantized-types.gguf", fallback="exact", oracle=o) for o in ("ggml", "gguf-py")]
    assert [r.oracle for r in results] == ["ggml", "gguf-py"]
    rows = [[(t.name, t.values_equal, t.bytes_equal) for t in r.tensors] for r in results]
    assert rows[0] == rows[1]
    assert len(rows[0]) == 17 and all(v is True and b is True for _, v, b in rows[0])


def test_safetensors_values_name_their_decoder() -> None:
    r = verify(FIXTURES / "gpt-oss-tiny.safetensors")
    assert r.ok and r.oracle == "ml_dtypes"


def test_without_ggml_the_default_is_gguf_py(no_ggml: None) -> None:
    assert not ggml.available() and "HURRAY_INTEROP_GGML=off" in ggml.unavailable_reason()
    r = verify(FIXTURES / "tiny-llama.gguf")
    assert r.ok and r.oracle == "gguf-py"


def test_asking_for_ggml_where_it_does_not_load_is_bad_usage(no_ggml: None) -> None:
    status, out, err = run_cli(["verify", str(FIXTURES / "tiny-llama.gguf"), "--oracle", "ggml"])
    assert status == 2
    assert err.splitlines() == ["hurray-interop: error: --oracle ggml: ggml's library does not load here: "
                                f"{ggml.ENV_VAR}=off turns it off"]


def test_an_unknown_oracle_is_bad_usage() -> None:
    status, _, err = run_cli(["verify", str(FIXTURES / "tiny-llama.gguf"), "--oracle", "torch"])
    assert status == 2 and "invalid choice: 'torch'" in err
    with pytest.raises(UsageError, match="--oracle must be one of ggml, gguf-py, not 'torch'"):
        verify(FIXTURES / "tiny-llama.gguf", oracle="torch")


# ---------------------------------------------------------------------------
# ggml's to_float run by our kernel beside our values (kernels.dequant_diff_decoded)


@pytest.fixture(scope="module")
def quantized_pair(tmp_path_factory) -> tuple[Path, Path]:
    """ggml's quantizer output of every type both oracles decode, and its exact import."""
    from hurray_interop import convert

    src = FIXTURES / "ggml-quantized-types.gguf"
    dst = tmp_path_factory.mktemp("decoded") / "types.hrry"
    convert(str(src), str(dst), fallback="exact")
    return src, dst


def _compiled() -> bool:
    from hurray_interop import kernels as K

    return K.KERNEL == "c"


needs_compiled = pytest.mark.skipif(not _compiled(), reason="the compiled kernel runs ggml's decoder beside ours")


def _decoded_cases(quantized_pair):
    from hurray_interop.core.hrry import HrryFile
    from hurray_interop.dequant import windows

    src, dst = quantized_pair
    with G.read_gguf(src) as gf, HrryFile(str(dst)) as hf:
        for info in gf.tensors:
            ref = VG._reference(info, "ggml")
            decoded = getattr(ref, "decoded", None)
            if decoded is None or info.name not in hf:
                continue
            wins = windows(hf.tensor(info.name), max_elements=3 * 4096 + 2 * info.ggml_type.block_elements)
            if getattr(wins._dec, "plan", None) is None:
                continue
            yield info, decoded, wins


@needs_compiled
def test_the_decoded_compare_agrees_with_the_window_compare(quantized_pair) -> None:
    """Per type on the compiled path: equal values give -1 as the window compare does; a flipped
    byte in one block of a copy of the source gives the same first index as decoding that copy
    into a window and comparing (at the window's first, a middle and its last block)."""
    from hurray_interop import kernels as K

    seen = found = 0
    for info, (addr, blocks, be), wins in _decoded_cases(quantized_pair):
        seen += 1
        for lo, n, region in wins.spans():
            r0, r1 = lo // be, (lo + n) // be
            assert wins.first_diff_decoded(region, addr, blocks[r0:r1], be) == -1, info.name
            ours = wins.fill(region, np.empty(n, np.float32))
            for k in (0, (r1 - r0) // 2, r1 - r0 - 1):
                bad = np.array(blocks[r0:r1])
                bad[k, -1] ^= 0x11  # codes at the block's end (every type keeps codes last)
                expect = K.numpy_first_diff_f32(ours, ggml.decode_blocks(info.ggml_type.id, be, blocks.shape[1], bad))
                assert wins.first_diff_decoded(region, addr, bad, be) == expect, (info.name, k)
                found += expect >= 0
    assert seen >= 10  # Q4_0 … Q6_K, IQ types: the compiled-path types of the fixture
    assert found >= 2 * seen  # the flipped bytes do change values


@needs_compiled
@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_the_decoded_compare_takes_exactly_the_windows_blocks(quantized_pair, delta: int) -> None:
    """One block more or less than the window's values, a block larger than the C chunk, a
    window past the tensor, no decoder: refused before C runs."""
    from hurray_interop import kernels as K

    info, (addr, blocks, be), wins = next(iter(_decoded_cases(quantized_pair)))
    lo, n, region = next(iter(wins.spans()))
    plan = wins._dec.plan
    r1 = n // be + delta
    if delta == 0:
        assert K.dequant_diff_decoded(plan, lo, n, addr, np.ascontiguousarray(blocks[:r1]), be) == -1
    else:
        with pytest.raises(ValueError):
            K.dequant_diff_decoded(plan, lo, n, addr, np.ascontiguousarray(blocks[: max(r1, 0)]), be)
    with pytest.raises(ValueError):
        K.dequant_diff_decoded(plan, plan.size - n + be * (1 + delta + 1), n, addr, np.ascontiguousarray(blocks[: n // be]), be)
    with pytest.raises(ValueError):
        K.dequant_diff_decoded(plan, lo, n, 0, np.ascontiguousarray(blocks[: n // be]), be)
    with pytest.raises(ValueError):
        K.dequant_diff_decoded(plan, lo, 8192, addr, np.zeros((1, blocks.shape[1]), np.uint8), 8192)


@needs_compiled
def test_the_decoded_compare_of_plain_halves_agrees_with_the_window_compare(tmp_path: Path) -> None:
    """Plain bfloat16, every bit pattern, ggml's to_float run beside ours (verify's path for
    BF16): the same answer as decoding into a window and comparing, on the tensor as stored
    and with one element flipped in a copy of the source (first, middle, last)."""
    import gguf

    from hurray_interop import convert
    from hurray_interop import kernels as K
    from hurray_interop.core.hrry import HrryFile
    from hurray_interop.dequant import windows

    bits = np.random.default_rng(7).permutation(np.arange(1 << 16, dtype=np.uint32)).astype("<u2")
    src = tmp_path / "halves.gguf"
    w = gguf.GGUFWriter(str(src), "test")  # gguf-py's writer takes bfloat16 as its raw bytes
    w.add_tensor("h", bits.view(np.uint8).reshape(16, 8192), raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    convert(str(src), str(tmp_path / "halves.hrry"))
    with G.read_gguf(src) as gf, HrryFile(str(tmp_path / "halves.hrry")) as hf:
        info = gf.tensors[0]
        addr, blocks, be = VG._reference(info, "ggml").decoded
        assert addr and be == 1
        wins = windows(hf.tensor("h"), max_elements=3 * 4096 + 5)
        assert isinstance(wins._dec.plan, K.HalvesPlan)
        for lo, n, region in wins.spans():
            ours = wins.fill(region, np.empty(n, np.float32))
            for at in (None, 0, n // 2, n - 1):
                src_blocks = np.array(blocks[lo : lo + n])
                if at is not None:
                    src_blocks[at, 1] ^= 0x40  # an exponent bit
                ref = ggml.decode_blocks(info.ggml_type.id, 1, 2, src_blocks)
                expect = K.numpy_first_diff_f32(ours, ref, False)
                assert expect == (-1 if at is None else at)
                assert wins.first_diff_decoded(region, addr, src_blocks, 1) == expect, (lo, at)


def test_a_signalling_nan_in_f16_verifies_under_both_oracles(tmp_path: Path) -> None:
    """ggml's F16 to_float quiets signalling NaNs; F16's reference is the exact widening under
    either oracle, so a byte-identical round trip of one passes (it failed under ggml)."""
    from gguf_factory import write_gguf_raw

    b = np.full(64, 0x3C00, "<u2")
    b[5], b[9] = 0x7C01, 0xFD55  # signalling NaNs, both signs
    src = write_gguf_raw(tmp_path / "snan.gguf", [("h", "F16", (64,), b)])
    f16 = G.ggml_type("F16")
    assert not ggml.has_decoder(f16.id, 1, 2)  # refused (gguf_ggml._NOT_EXACT), because:
    raw = ggml._TO_FLOAT(ggml._load()[0].ggml_get_type_traits(f16.id).contents.to_float)
    out = np.empty(64, np.float32)
    raw(b.ctypes.data, out.ctypes.data, 64)
    assert out.view(np.uint32)[5] == 0x7FC02000  # ggml's value (the exact widening: 0x7F802000)
    for oracle in ("ggml", "gguf-py"):
        res = verify(str(src), oracle=oracle)
        assert res.ok and res.tensors[0].values_equal, oracle
