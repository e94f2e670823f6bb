"""The exact expanded forms of docs/conversion-rules.md § 9 (hurray_interop.conversions.gguf_expanded).

Oracle: gguf-py 0.19.0's ``gguf.quants.dequantize`` (bit-identical to ggml's C decoder, § 9),
against the shared Hurray dequantizer's values of the expanded form, compared as uint32 bits
so that ±0 counts; blocks from ggml's own quantizer
(``fixtures/ggml-quantized-types.gguf``) and random well-formed blocks.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from hurray_interop.conversions import gguf_exact, gguf_expanded as ge
from hurray_interop.core.elements import element_type, pack
from hurray_interop.core.model import Tensor
from hurray_interop.dequant import dequantize as hurray_dequantize
from hurray_interop.errors import ConversionRefused, FormatError
from hurray_interop.tables import load_table

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ggml-quantized-types.gguf"
TYPES = ge.EXPANDED_TYPES

#: docs/conversion-rules.md § 9, "Measured forms": Hurray bits per weight of each form
CONTRACT_BPW = {
    "Q2_K": 8.0, "Q3_K": 6.0, "Q4_K": 8.0, "Q5_K": 12.0, "Q6_K": 10.0, "IQ4_NL": 8.5, "IQ4_XS": 9.0,
    "TQ1_0": 2.1875, "TQ2_0": 2.1875, "NVFP4": 9.0,
    "IQ2_XXS": 9.0, "IQ2_XS": 10.0, "IQ2_S": 10.0, "IQ3_XXS": 9.0, "IQ3_S": 9.0, "IQ1_S": 9.0, "IQ1_M": 10.0,
}  # fmt: skip

#: where each type keeps its float16 super-block scales (docs/format-notes.md § 1.4; ggml-common.h)
F16_FIELDS = {
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,),
    "IQ4_XS": (0,), "TQ1_0": (52,), "TQ2_0": (64,), "NVFP4": (), "IQ2_XXS": (0,), "IQ2_XS": (0,),
    "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ1_S": (0,), "IQ1_M": (),
}  # fmt: skip
OVERLAY = {"Q2_K", "Q4_K", "Q5_K"}


def block_bytes(t: str) -> int:
    return gguf.GGML_QUANT_SIZES[Q[t]][1]


def set_d(t: str, blocks: np.ndarray, rows: np.ndarray, value: np.ndarray, field: int = 0) -> None:
    """Write float16 ``value`` as the ``field``-th super-block scale of ``blocks[rows]``."""
    bits = np.asarray(value, dtype=np.float16).view(np.uint16)
    if t == "IQ1_M":  # d is split over the top nibbles of the four uint16 scales at 48..55
        for k in range(4):
            top = blocks[rows, 49 + 2 * k]
            blocks[rows, 49 + 2 * k] = (top & 0x0F) | (((bits >> (4 * k)) & 0xF) << 4).astype(np.uint8)
        return
    off = F16_FIELDS[t][field]
    blocks[rows, off : off + 2] = bits.reshape(-1, 1).view(np.uint8).reshape(-1, 2)


def random_blocks(t: str, n: int, seed: int) -> np.ndarray:
    """Random codes and sub-block scales with sane f16 super-block scales; then rows with
    d = +0 and d = −0 over stale codes, an all-zero block, and a d = −0 block of zero bytes."""
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(n, block_bytes(t)), dtype=np.uint8)
    all_rows = np.arange(n)
    for k in range(len(F16_FIELDS[t]) or (t == "IQ1_M")):
        set_d(t, b, all_rows, (rng.standard_normal(n) * 0.02).astype(np.float16), k)
    if F16_FIELDS[t] or t == "IQ1_M":
        set_d(t, b, np.array([3, 4]), np.array([0.0, 0.0]))
        set_d(t, b, np.array([5, 6]), np.array([-0.0, -0.0]))
        extremes = np.array([2.0**-24, -(2.0**-24), 65504.0, -65504.0, 6.1e-5])  # subnormal, f16 max
        for k in range((len(F16_FIELDS[t]) or 1) if n >= 15 else 0):
            set_d(t, b, np.arange(10, 15), extremes, k)
    b[7] = 0
    if t == "NVFP4":
        b[8, :4] = (0x00, 0x7F, 0x80, 0xFF)  # UE4M3 zeros (0x00, 0x7F; 0x80 reads as 0) over stale codes
    elif F16_FIELDS[t] or t == "IQ1_M":
        b[8] = 0
        set_d(t, b, np.array([8]), np.array([-0.0]))
    return b


def hurray_tensor(x: ge.Expanded, t: str) -> Tensor:
    """``x`` as the in-memory Hurray tensor the converter writes for it (the descriptors of
    ``gguf_exact``; the buffers filled from ``x`` as the Hurray spec lays them out)."""
    f = ge.form(t)
    n, subs = x.scales.shape
    shape = (n, subs * f.sub_block)
    composite, head, members = gguf_exact._layout("w", t, shape, x.zero_patch_index)
    per_element = lambda per_sub: np.repeat(per_sub.reshape(-1), f.sub_block)  # noqa: E731
    data = [[pack(x.codes.reshape(-1), f.storage), x.scales.reshape(-1).view(np.uint8)]]
    if f.zero_point is not None:
        data[0].append(np.full(n * subs, f.zero_point, dtype="<i4").view(np.uint8))
    if f.overlay:
        data.append([pack(per_element(x.correction_codes), "uint2"), x.correction.astype("<f4").reshape(-1).view(np.uint8)])
    data += [[p.astype("<f4").view(np.uint8)] for p in x.zero_patch]
    tensors = [Tensor(name, d, tuple(np.ascontiguousarray(b).reshape(-1) for b in bufs))
               for (name, d), bufs in zip(members, data, strict=True)]
    return Tensor("w", head, members=tuple(tensors)) if composite else tensors[0]


def assert_bits_equal(x: ge.Expanded, blocks: np.ndarray, t: str) -> None:
    """The Hurray form of ``x``, evaluated by the shared dequantizer, is gguf-py's values bit for bit."""
    ref = dequantize(blocks, Q[t]).astype(np.float32).reshape(blocks.shape[0], -1)
    got = hurray_dequantize(hurray_tensor(x, t))
    assert got.shape == ref.shape
    diff = np.flatnonzero(got.view(np.uint32) != ref.view(np.uint32))
    assert diff.size == 0, f"{t}: {diff.size} elements differ, first {diff[0]}: {got.flat[diff[0]]} vs {ref.flat[diff[0]]}"


def fixture_blocks() -> dict[str, np.ndarray]:
    assert FIXTURE.is_file(), f"{FIXTURE} is committed; regenerate: python fixtures/make_kquant_fixtures.py"
    r = gguf.GGUFReader(str(FIXTURE))
    return {t.name[2:]: np.asarray(t.data).reshape(-1, block_bytes(t.name[2:])) for t in r.tensors}


# --- the forms -----------------------------------------------------------------------


#: the data bits per weight of the compact forms (docs/conversion-rules.md § 11)
COMPACT_BPW = {"Q2_K": 6.0, "Q4_K": 6.0, "Q5_K": 9.0}


@pytest.mark.parametrize("t", TYPES)
def test_form_bits_per_weight(t: str) -> None:
    f = ge.form(t)
    elems, nbytes = gguf.GGML_QUANT_SIZES[Q[t]]
    assert f.ggml_bpw == nbytes * 8 / elems
    assert f.hurray_bpw(compact=False) == CONTRACT_BPW[t]  # the per-element forms of § 9
    assert f.hurray_bpw() == COMPACT_BPW.get(t, CONTRACT_BPW[t])  # what the import writes (§ 11)
    assert f.overlay == (t in OVERLAY)
    assert t in f.describe()


def test_block_geometry_and_storage_are_read_from_the_tables() -> None:
    """Each fact once: a type's elements and bytes per block are its ggml_types.toml row (and
    gguf-py's), a form's code and scale widths its element_types.toml rows."""
    assert not {"elements", "block_bytes"} & {f.name for f in dataclasses.fields(ge._Spec)}
    assert not hasattr(ge, "_STORAGE") and not hasattr(ge, "_SCALE_BITS")
    ggml = load_table("ggml_types")
    for t in TYPES:
        spec, f = ge._specs()[t], ge.form(t)
        assert (spec.elements, spec.block_bytes) == (ggml[t]["block_elements"], ggml[t]["block_bytes"]), t
        assert (spec.elements, spec.block_bytes) == gguf.GGML_QUANT_SIZES[Q[t]], t
        storage = element_type(f.storage)
        assert f.code_dtype == (np.int8 if f.storage.startswith("int") else np.uint8) and storage.bits <= 8, t
        assert f.scale_dtype == np.dtype(f.scale), t


def test_ksigns_match_ggml() -> None:
    assert ge._KSIGNS.tobytes() == gguf.quants.IQ2_XXS.ksigns


# --- expand: bit-exact values; rebuild: byte-identical blocks -------------------------


@pytest.mark.parametrize("t", TYPES)
def test_random_blocks_bit_exact_and_rebuilt(t: str) -> None:
    blocks = random_blocks(t, 96, seed=sum(map(ord, t)))
    x = ge.expand(t, blocks)
    assert_bits_equal(x, blocks, t)
    f = ge.form(t)
    assert x.codes.dtype == (np.int8 if f.storage.startswith("int") else np.uint8)
    assert x.scales.dtype == np.dtype(f.scale) and np.all(x.scales != 0) and np.all(np.isfinite(x.scales))
    assert x.record.header.shape == (96, f.record_bytes)
    if f.overlay:
        assert x.correction is not None and np.all(x.correction != 0)
        assert len(x.zero_patch_index) == 0  # unsigned codes never mix ±0 (§ 9)
    else:
        assert x.correction is None
        assert len(x.zero_patch_index) > 0  # the d = ±0 rows over stale signed codes mix ±0
    assert len(x.record.exception_index) > 0  # zero-scale sub-blocks keep stale codes
    assert np.array_equal(ge.rebuild(x), blocks)


@pytest.mark.parametrize("t", TYPES)
def test_ggml_quantizer_blocks_bit_exact_and_rebuilt(t: str) -> None:
    blocks = fixture_blocks()[t]
    x = ge.expand(t, blocks)
    assert_bits_equal(x, blocks, t)
    assert np.array_equal(ge.rebuild(x), blocks)


def test_fixture_has_the_edge_cases() -> None:
    """ggml leaves stale codes under zero scales (§ 9): the fixture must show it."""
    fx = fixture_blocks()
    patched = [t for t in TYPES if len(ge.expand(t, fx[t]).zero_patch_index)]
    assert {"Q3_K", "Q6_K"} <= set(patched)


def test_all_zero_rows_need_no_exception_blocks() -> None:
    """ggml's all-zero blocks (fixture rows 0 and 1: all +0, all −0) rebuild from the header
    alone; only stale codes under zero scales are kept whole."""
    fx = fixture_blocks()
    for t in TYPES:
        per_row = fx[t].shape[0] // 32
        x = ge.expand(t, fx[t])
        assert not np.any(x.record.exception_index < 2 * per_row), t


@pytest.mark.parametrize("t", ["Q4_K", "Q6_K", "IQ4_NL", "TQ1_0", "NVFP4", "IQ2_XS", "IQ1_M"])
def test_chunks_and_serialised_record(t: str) -> None:
    """Chunks carry absolute exception indices; records survive to_bytes/from_bytes."""
    blocks = random_blocks(t, 40, seed=7)
    whole = ge.expand(t, blocks)
    out, indices = [], []
    for first, stop in ((0, 17), (17, 40)):
        x = ge.expand(t, blocks[first:stop], first_block=first)
        indices.append(x.record.exception_index)
        x.record = ge.Record.from_bytes(t, x.record.to_bytes(), stop - first, first)
        out.append(ge.rebuild(x, first_block=first))
    assert np.array_equal(np.concatenate(out), blocks)
    assert np.array_equal(np.concatenate(indices), whole.record.exception_index)


def test_tq1_non_canonical_bytes_are_recorded() -> None:
    """Random TQ1_0 bytes are mostly not ggml's canonical base-3 encoding: recorded whole."""
    b = random_blocks("TQ1_0", 16, seed=1)[9:]  # rows with d != 0
    x = ge.expand("TQ1_0", b)
    assert_bits_equal(x, b, "TQ1_0")
    assert len(x.record.exception_index) >= 5
    assert np.array_equal(ge.rebuild(x), b)
    no_exceptions = ge.Record("TQ1_0", x.record.header, np.zeros(0, np.uint32), np.zeros((0, 54), np.uint8))
    canonical = ge.rebuild(dataclasses.replace(x, record=no_exceptions))  # ggml's encoding of the same trits
    assert not np.array_equal(canonical, b)
    same = dequantize(canonical, Q.TQ1_0).view(np.uint32) == dequantize(b, Q.TQ1_0).view(np.uint32)
    assert same.all()


# --- refusals and located errors -----------------------------------------------------


@pytest.mark.parametrize("t", [t for t in TYPES if F16_FIELDS[t] or t == "IQ1_M"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_d_refused(t: str, bad: float) -> None:
    blocks = random_blocks(t, 12, seed=3)
    set_d(t, blocks, np.array([9]), np.array([bad]))
    with pytest.raises(ge.NonFiniteScale) as e:
        ge.expand(t, blocks, first_block=100)
    assert e.value.block == 109 and "block 109" in str(e.value) and e.value.field == "d"
    assert isinstance(e.value, ConversionRefused)


@pytest.mark.parametrize("t", sorted(OVERLAY))
def test_non_finite_dmin_refused(t: str) -> None:
    blocks = random_blocks(t, 12, seed=3)
    set_d(t, blocks, np.array([2]), np.array([np.inf]), field=1)
    with pytest.raises(ge.NonFiniteScale, match="block 2: super-block scale dmin"):
        ge.expand(t, blocks)


def expanded(t: str, seed: int = 11) -> ge.Expanded:
    return ge.expand(t, random_blocks(t, 24, seed=seed), first_block=1000)


def raises_at(x: ge.Expanded, block: int, field: str) -> None:
    with pytest.raises(FormatError) as e:
        ge.rebuild(x, first_block=1000)
    assert f"block {1000 + block}" in str(e.value) and e.value.field == field, str(e.value)


@pytest.mark.parametrize("t", TYPES)
def test_stale_scale_is_located(t: str) -> None:
    x = expanded(t)
    x.scales.view(np.uint32 if x.scales.dtype == np.float32 else np.uint16)[13, -1] ^= 1  # one ulp off
    raises_at(x, 13, "scales")


@pytest.mark.parametrize("t", TYPES)
def test_stale_record_header_is_located(t: str) -> None:
    x = expanded(t)
    x.record.header[15] ^= np.uint8(0x01) if t != "IQ1_S" else np.uint8(0x10)
    with pytest.raises(FormatError, match="block 1015"):
        ge.rebuild(x, first_block=1000)


OUT_OF_RANGE = {  # a code no GGML block of the type can hold
    "Q2_K": 4, "Q3_K": 5, "Q4_K": 16, "Q5_K": 32, "Q6_K": 40, "IQ4_NL": 2, "IQ4_XS": 2, "TQ1_0": 3,
    "TQ2_0": 4, "NVFP4": 5, "IQ2_XXS": 9, "IQ2_XS": 9, "IQ2_S": 9, "IQ3_XXS": 5, "IQ3_S": 2, "IQ1_S": 3, "IQ1_M": 3,
}  # fmt: skip


@pytest.mark.parametrize("t", TYPES)
def test_out_of_range_code_is_located(t: str) -> None:
    x = expanded(t)
    x.codes[17, 5] = OUT_OF_RANGE[t]
    raises_at(x, 17, "codes")


@pytest.mark.parametrize("t", ["Q3_K", "Q6_K", "IQ4_XS", "NVFP4", "IQ1_M"])
def test_code_contradicting_the_record_is_located(t: str) -> None:
    """Codes of a block the record holds verbatim (an exception block) must be its codes."""
    x = expanded(t)
    b = int(x.record.exception_index[-1]) - 1000
    x.codes[b, 0] = x.codes.flat[np.flatnonzero(x.codes != x.codes[b, 0])[0]]
    with pytest.raises(FormatError, match=f"block {1000 + b}"):
        ge.rebuild(x, first_block=1000)


@pytest.mark.parametrize("t", sorted(OVERLAY))
def test_stale_correction_is_located(t: str) -> None:
    x = expanded(t)
    assert x.correction is not None
    x.correction[19, 2] = -x.correction[19, 2]
    raises_at(x, 19, "correction")


@pytest.mark.parametrize("t", ["Q3_K", "Q6_K", "IQ3_S", "NVFP4"])
def test_missing_zero_patch_is_located(t: str) -> None:
    x = expanded(t)
    assert len(x.zero_patch_index)
    first = int(x.zero_patch_index[0]) // x.scales.shape[1]
    x.zero_patch_index, x.zero_patch = x.zero_patch_index[1:], x.zero_patch[1:]
    raises_at(x, first, "zero_patch")


@pytest.mark.parametrize("t", ["Q2_K", "Q6_K", "TQ2_0", "IQ1_M"])
def test_record_of_wrong_length(t: str) -> None:
    x = expanded(t)
    data = x.record.to_bytes()
    for bad in (data[:-1], data + b"\0", data[: len(data) // 3]):
        with pytest.raises(FormatError) as e:
            ge.Record.from_bytes(t, bad, 24, 1000)
        assert e.value.field == "record"


def test_record_exception_outside_chunk() -> None:
    x = expanded("Q6_K")
    assert len(x.record.exception_index)
    x.record.exception_index = x.record.exception_index - 1000  # chunk-relative: wrong
    with pytest.raises(FormatError, match="outside blocks 1000..1023"):
        ge.Record.from_bytes("Q6_K", x.record.to_bytes(), 24, 1000)


def test_record_missing_an_exception_is_located() -> None:
    x = expanded("Q3_K")
    first = int(x.record.exception_index[0]) - 1000
    x.record.exception_index = x.record.exception_index[1:]
    x.record.exception_blocks = x.record.exception_blocks[1:]
    with pytest.raises(FormatError, match=f"block {1000 + first}"):
        ge.rebuild(x, first_block=1000)


def test_wrong_shapes_name_the_field() -> None:
    x = expanded("Q4_K")
    x.scales = x.scales.astype(np.float64)
    with pytest.raises(FormatError) as e:
        ge.rebuild(x)
    assert e.value.field == "scales"
    with pytest.raises(FormatError):
        ge.expand("Q4_K", np.zeros((2, 143), dtype=np.uint8))


# --- the fixture script --------------------------------------------------------------


def test_fixture_regenerates_identically(tmp_path: Path) -> None:
    if importlib.util.find_spec("libggml") is None:
        pytest.skip("libggml-python (prebuilt ggml) not installed: pip install libggml-python==0.20.2.post1")
    if not FIXTURE.is_file():
        pytest.skip(f"fixture missing: {FIXTURE}")
    script = FIXTURE.parent / "make_kquant_fixtures.py"
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, capture_output=True)
    assert (tmp_path / FIXTURE.name).read_bytes() == FIXTURE.read_bytes()


@pytest.mark.parametrize("t", TYPES)
def test_expand_packed_is_expand_with_the_codes_packed(t: str, monkeypatch) -> None:
    """The import's ``expand_packed`` (codes straight from the blocks where a type allows it,
    decoded only in zero-scale blocks) equals ``expand`` + the generic ``elements.pack``,
    with the C movers and with their numpy twins."""
    from hurray_interop import kernels
    from hurray_interop.core.elements import pack

    blocks = random_blocks(t, 300, seed=21)
    x = ge.expand(t, blocks, 1000)
    for twin in (False, True):
        if twin:
            monkeypatch.setattr(kernels, "_lib", None)
        y, packed = ge.expand_packed(t, blocks, 1000)
        assert y.codes is None and np.array_equal(packed, pack(x.codes, ge.form(t).storage))
        for field in ("scales", "correction", "correction_codes", "zero_patch_index", "zero_patch"):
            a, b = getattr(x, field), getattr(y, field)
            assert (a is None and b is None) or np.array_equal(ge._bits_of(a), ge._bits_of(b)), field
        assert x.record.to_bytes() == y.record.to_bytes() and x.record.exception_index.size > 0


@pytest.mark.parametrize("t", TYPES)
def test_chunks_without_zero_scales_plan_and_pack(t: str) -> None:
    """A chunk with no zero-scale sub-block (nothing to decode for the plan) gives the same
    scales, no patches and the same packed codes as the full expansion."""
    from hurray_interop.core.elements import pack

    blocks = random_blocks(t, 300, seed=22)
    x = ge.expand(t, blocks)
    rows = np.flatnonzero(~(np.abs(x.scales.astype(np.float32)) == 1).any(axis=1))[:40]  # no substituted scale
    b = np.ascontiguousarray(blocks[rows])
    x, s = ge.expand(t, b), ge.expand_scales(t, b)
    y, packed = ge.expand_packed(t, b)
    assert s.zero_patch_index.size == 0 and np.array_equal(ge._bits_of(s.scales), ge._bits_of(x.scales))
    assert np.array_equal(packed, pack(x.codes, ge.form(t).storage)) and y.record.to_bytes() == x.record.to_bytes()


FUSED = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]  # scales by gguf_kernels.dsc_scales


def _tampered(x: ge.Expanded, how: str) -> ge.Expanded:
    x = dataclasses.replace(x, codes=x.codes.copy(), scales=x.scales.copy(),
                            record=dataclasses.replace(x.record, header=x.record.header.copy()))
    zb = np.flatnonzero((np.abs(x.scales.astype(np.float32)) == 1).any(axis=1))
    if how == "zero-sub-block-code":  # a code in a substituted (zero-scale) sub-block
        b = int(zb[0])
        s = int(np.argmax(np.abs(x.scales[b].astype(np.float32)) == 1))
        k = ge.form(x.type).sub_block
        x.codes[b, s * k] ^= 1
    elif how == "exception-header":
        x.record.header[int(x.record.exception_index[0]) - 1000, -1] ^= 1
    elif how == "scale-sign":  # +1 for −1 where a zero scale was substituted
        b = int(zb[-1])
        x.scales[b] = -x.scales[b]
    return x


def _stored(x: ge.Expanded) -> np.ndarray:
    """``x``'s codes as the form stores them, a row of bytes per block."""
    from hurray_interop.core.elements import pack

    return pack(x.codes, ge.form(x.type).storage).reshape(x.codes.shape[0], -1)


def test_only_types_whose_codes_are_moved_rebuild_from_stored_codes() -> None:
    assert [t for t in TYPES if ge.rebuilds_packed(t)] == ["Q4_K"]
    x = expanded("Q6_K")
    with pytest.raises(ValueError, match="unpacked"):
        ge.rebuild(dataclasses.replace(x, codes=None), 1000, _stored(x))


@pytest.mark.parametrize("t", FUSED)
def test_compiled_and_numpy_paths_agree(t: str, monkeypatch) -> None:
    """expand, expand_packed and rebuild give the same bytes, and rebuild the same error for
    the same tampering, with the compiled kernels and with their numpy twins (random blocks
    with ±0 and subnormal d, zero-scale sub-blocks over stale codes, an odd block count)."""
    from hurray_interop import kernels

    blocks = random_blocks(t, 1031, seed=31)
    results = []
    for twin in (False, True):
        if twin:
            monkeypatch.setattr(kernels, "_lib", None)
        x = ge.expand(t, blocks, 1000)
        y, packed = ge.expand_packed(t, blocks, 1000)
        fields = [getattr(x, f) for f in ("codes", "scales", "correction", "correction_codes", "zero_patch_index", "zero_patch")]
        out = [b"" if a is None else np.ascontiguousarray(a).tobytes() for a in fields]
        out += [x.record.to_bytes(), y.record.to_bytes(), packed.tobytes(), ge.rebuild(x, 1000).tobytes()]
        errors = []
        for how in ("zero-sub-block-code", "exception-header", "scale-sign"):
            bad = _tampered(x, how)
            with pytest.raises(FormatError) as e:
                ge.rebuild(bad, 1000)
            errors.append((e.value.field, str(e.value)))
            if ge.rebuilds_packed(t):  # the export's path: the codes as stored, moved into the blocks
                with pytest.raises(FormatError) as e:
                    ge.rebuild(dataclasses.replace(bad, codes=None), 1000, _stored(bad))
                assert (e.value.field, str(e.value)) == errors[-1]
        if ge.rebuilds_packed(t):
            assert ge.rebuild(dataclasses.replace(x, codes=None), 1000, _stored(x)).tobytes() == blocks.tobytes()
        results.append((out, errors))
        assert out[-1] == blocks.tobytes() and x.record.exception_index.size
        assert x.zero_patch_index.size or t in OVERLAY  # (unsigned codes: a zero sub-block's zeros share a sign)
    assert results[0] == results[1]


# --- the rows and the reference path ------------------------------------------------------


def test_each_row_names_its_ggml_struct_and_the_struct_is_the_block() -> None:
    """Each type's row cites its ggml-common.h struct, field by field: the fields add up to
    the type's block bytes (ggml_types.toml), and the record keeps bytes of named fields."""
    for t in TYPES:
        spec = ge._specs()[t]
        assert spec.struct.name.lower() == "block_" + t.lower() and spec.struct.size == spec.block_bytes, t
        offsets = {b for n, size in spec.struct.fields for b in range(spec.struct.at(n), spec.struct.at(n) + size)}
        assert {b for b, _ in spec.header} <= offsets, t
    with pytest.raises(KeyError, match="block_q2_K has no field qh"):
        ge._specs()["Q2_K"].struct.at("qh")


def test_the_fused_scale_arguments_are_keyed_by_type_not_by_object() -> None:
    """A row equal to the table's (a copy) finds the same fused-kernel arguments."""
    for t in FUSED:
        spec = ge._specs()[t]
        assert ge._fused(dataclasses.replace(spec)) == ge._fused(spec) is not None, t


def _edge_blocks(t: str) -> np.ndarray:
    """Random blocks with the edge cases (±0 and subnormal/extreme d, zero blocks, stale
    codes under zero scales), ggml's quantizer blocks, all-0x00 and all-0xFF bytes but for
    a finite d."""
    fx = fixture_blocks()[t]
    ones = np.full((2, block_bytes(t)), 0xFF, dtype=np.uint8)
    if F16_FIELDS[t] or t == "IQ1_M":
        for k in range(len(F16_FIELDS[t]) or 1):
            set_d(t, ones, np.arange(2), np.array([1.0, -2.0 ** -14]), k)
    return np.concatenate([random_blocks(t, 211, seed=41), fx, np.zeros((1, block_bytes(t)), np.uint8), ones])


def _fields(x: ge.Expanded) -> dict[str, object]:
    out: dict[str, object] = {"record": x.record.to_bytes()}
    for f in ("codes", "scales", "correction", "correction_codes", "zero_patch_index", "zero_patch"):
        a = getattr(x, f)
        out[f] = None if a is None else (a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes())
    return out


@pytest.mark.parametrize("t", TYPES)
def test_reference_path_is_gguf_py_bit_for_bit(t: str) -> None:
    blocks = _edge_blocks(t)
    x = ge.reference_expand(t, blocks)
    assert_bits_equal(x, blocks, t)
    assert np.array_equal(ge.rebuild(x), blocks)


@pytest.mark.parametrize("t", TYPES)
@pytest.mark.parametrize("kernel", ["c", "numpy"])
def test_every_fast_path_is_byte_identical_to_the_reference(t: str, kernel: str, monkeypatch) -> None:
    """expand (fused scale pass, dense types decoding only zero-scale blocks), expand with
    known codes, expand_scales, expand_packed (codes moved straight from the blocks) and
    rebuild's own expansion give the reference path's bytes, with the C kernels and with
    their numpy twins."""
    from hurray_interop import kernels

    if kernel == "numpy":
        monkeypatch.setattr(kernels, "_lib", None)
    blocks = _edge_blocks(t)
    ref = _fields(ge.reference_expand(t, blocks, 1000))
    assert _fields(ge.expand(t, blocks, 1000)) == ref
    assert _fields(ge.expand(t, blocks, 1000, ge._specs()[t].codec.decode(blocks))) == ref
    scales = _fields(ge.expand_scales(t, blocks, 1000))
    assert {k: v for k, v in scales.items() if k not in ("codes", "record")} == \
        {k: v for k, v in ref.items() if k not in ("codes", "record")}
    x, packed = ge.expand_packed(t, blocks, 1000)
    assert {**_fields(x), "codes": None} == {**ref, "codes": None}
    r = ge.reference_expand(t, blocks, 1000)
    assert packed.tobytes() == pack(r.codes, ge.form(t).storage).tobytes()
    assert ge.rebuild(r, 1000).tobytes() == blocks.tobytes()
    if ge.rebuilds_packed(t):
        assert ge.rebuild(dataclasses.replace(r, codes=None), 1000, _stored(r)).tobytes() == blocks.tobytes()


@pytest.mark.parametrize("t", ["Q2_K", "Q3_K", "IQ4_NL", "TQ1_0", "IQ2_XS", "IQ1_M"])
def test_reference_path_refuses_a_non_finite_d_as_expand_does(t: str) -> None:
    blocks = random_blocks(t, 20, seed=43)
    set_d(t, blocks, np.array([13]), np.array([np.inf]))
    with pytest.raises(ge.NonFiniteScale) as fast:
        ge.expand(t, blocks, 50)
    with pytest.raises(ge.NonFiniteScale) as ref:
        ge.reference_expand(t, blocks, 50)
    want = (63, "d", "d: block 63: super-block scale d is not finite (0x7c00)")
    assert (ref.value.block, ref.value.field, str(ref.value)) == want
    assert (fast.value.block, fast.value.field, str(fast.value)) == want
