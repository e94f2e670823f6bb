"""Q1_0 and Q2_0, the GGML types only ggml's own C decoder knows (gguf-py has no Q1_0
decoder and does not know Q2_0): their exact expanded forms (Q1_0: int2 signs ±1, K = 128;
Q2_0: uint2 codes with zero point 1, K = 64; f16 d) against ggml's ``to_float`` bit for bit,
byte-identical round trips, and refused -- naming the missing decoder -- where ggml does not
load.  Blocks from ggml's own quantizer (``ggml_quantize_chunk``: all-zero rows included)
and random blocks with finite scales (±0, subnormal, the extremes)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from hurray_interop import convert, verify
from hurray_interop.core.hrry import HrryFile
from hurray_interop.dequant import dequantize
from hurray_interop.errors import ConversionRefused
from hurray_interop.formats import gguf as G
from hurray_interop.formats import gguf_ggml as ggml

pytestmark = pytest.mark.skipif(not ggml.available(), reason=f"ggml's library does not load: {ggml.unavailable_reason()}")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TYPES = {"Q1_0": (41, 128, 18), "Q2_0": (42, 64, 18)}
ROWS, COLS = 12, 512


def ggml_quantized(tid: int, rng: np.random.Generator) -> np.ndarray:
    sys.path.insert(0, str(FIXTURES))
    from make_kquant_fixtures import ggml_base

    lib, _ = ggml_base()
    x = (rng.standard_normal((ROWS, COLS)) * 0.02).astype(np.float32)
    x[3] = 0.0  # an all-zero row: ggml's quantizer writes d = 0 there
    out = np.zeros((ROWS, lib.ggml_row_size(tid, COLS)), np.uint8)
    assert lib.ggml_quantize_chunk(tid, x.ctypes.data, out.ctypes.data, 0, ROWS, COLS, None) == out.size
    return out


def random_blocks(block_bytes: int, n: int, rng: np.random.Generator) -> np.ndarray:
    b = rng.integers(0, 256, (n, block_bytes), dtype=np.uint8)
    d = rng.uniform(-2, 2, n).astype(np.float16)
    d[:6] = [0.0, -0.0, 6e-8, -6e-8, 65504.0, -65504.0]  # ±0, the smallest subnormals, the extremes
    b[:, :2] = d.view(np.uint8).reshape(n, 2)
    return b


def write(path: Path, tensors: dict[str, tuple[int, np.ndarray]]) -> Path:
    """A GGUF of ``ROWS x COLS`` tensors: name -> (GGML type id, their blocks)."""
    specs = [G.TensorSpec(name, tid, (COLS, ROWS)) for name, (tid, _) in tensors.items()]
    kv = [("general.architecture", G.GGUFValue.of(G.ValueType.STRING, "llama"))]
    with G.GGUFWriterStream(path, version=3, alignment=32, kv=kv, tensors=specs, pad_end=True) as w:
        for spec in w.tensors_in_file_order:
            w.write_tensor_data(tensors[spec.name][1].reshape(-1))
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(20261202)
    tensors = {}
    for name, (tid, k, bb) in TYPES.items():
        tensors[f"{name}.quantized"] = (tid, ggml_quantized(tid, rng))
        tensors[f"{name}.random"] = (tid, random_blocks(bb, ROWS * COLS // k, rng))
    return write(tmp_path_factory.mktemp("q12") / "q12.gguf", tensors)


def test_the_exact_forms_are_ggml_bit_for_bit_and_round_trip(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "q12.hrry"
    convert(model, out, fallback="exact")
    gf = G.read_gguf(model)
    try:
        with HrryFile(out) as hf:
            for info in gf.tensors:
                t = info.ggml_type
                ref = ggml.decode_blocks(t.id, t.block_elements, t.block_bytes, np.ascontiguousarray(
                    info.data.reshape(-1, t.block_bytes)))
                got = dequantize(hf.tensor(info.name)).reshape(-1)
                assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), info.name
                ht = hf.tensor(info.name)  # the form, or its base where zero-scale blocks add patches
                d = (ht.members[0] if ht.members else ht).descriptor
                assert d.element_type.name == {"Q1_0": "int2", "Q2_0": "uint2"}[t.name]
                assert d.quantization.block_size == t.block_elements
    finally:
        gf.close()
    back = tmp_path / "back.gguf"
    convert(out, back)
    assert back.read_bytes() == model.read_bytes()
    r = verify(model, fallback="exact")
    assert r.ok and r.oracle == "ggml" and all(c.values_equal for c in r.tensors), r.summary_line()


def test_without_ggml_they_are_refused_naming_the_decoder(model: Path, tmp_path: Path, no_ggml: None) -> None:
    out = tmp_path / "q12.hrry"
    with pytest.raises(ConversionRefused) as e:
        convert(model, out, fallback="exact")
    assert not out.exists()
    reasons = {name: why for name, _, why in e.value.reasons}
    assert set(reasons) == {f"{n}.{k}" for n in TYPES for k in ("quantized", "random")}
    assert all("needs ggml's own decoder" in why and "hurray-interop[ggml]" in why for why in reasons.values())


def test_by_default_they_are_refused_with_the_exact_form_named(model: Path, tmp_path: Path) -> None:
    with pytest.raises(ConversionRefused) as e:
        convert(model, tmp_path / "q12.hrry")
    assert all("no native mapping" in why for _, _, why in e.value.reasons)


def test_the_gguf_py_oracle_says_their_values_were_not_checked(model: Path) -> None:
    r = verify(model, fallback="exact", oracle="gguf-py")
    assert r.ok and r.file_bytes_equal
    assert all(c.values_equal is None and c.bytes_equal for c in r.tensors)
    assert "4 exact in bytes only (values not checked: no decoder of Q1_0, Q2_0 here)" in r.summary_line()


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_a_non_finite_scale_is_refused(tmp_path: Path, bad: str) -> None:
    rng = np.random.default_rng(1)
    blocks = random_blocks(18, ROWS * COLS // 64, rng)
    blocks[5, :2] = np.array([np.float16(bad)]).view(np.uint8)
    src = write(tmp_path / "bad.gguf", {"w": (42, blocks)})
    with pytest.raises(ConversionRefused) as e:
        convert(src, tmp_path / "bad.hrry", fallback="exact")
    (name, _, why), = e.value.reasons
    assert name == "w" and "not finite" in why
