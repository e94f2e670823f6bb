"""The compact exact forms of Q2_K, Q4_K and Q5_K (``--fallback exact``; docs/conversion-rules.md
§ 11): what the import writes, read back by an independent decoder written here (the stored
bytes through their strides: the broadcast minimum's one code byte, the bit planes), compared
as bits with gguf-py's ``dequantize``; round trips byte-identical; the per-element form kept
where a sub-block cannot be flipped or would be read as flipped; hostile files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf_factory import write_gguf_raw
from test_fallback_exact import rewrite

import hurray_interop
from hurray_interop.cli import main
from hurray_interop.conversions import gguf_exact
from hurray_interop.conversions import gguf_expanded as X
from hurray_interop.conversions.gguf import gguf_to_hurray, hurray_to_gguf
from hurray_interop.core import model as M
from hurray_interop.core.hrry import HrryFile
from hurray_interop.core.kv import KVValue
from hurray_interop.errors import FormatError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TYPES = ("Q2_K", "Q4_K", "Q5_K")
#: data bits per weight of the forms (descriptors' buffers / elements): compact, per-element
BPW = {"Q2_K": (6.0, 8.0), "Q4_K": (6.0, 8.0), "Q5_K": (9.0, 12.0)}
QMAX = {"Q2_K": 3, "Q4_K": 15, "Q5_K": 31}


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).reshape(-1).view(np.uint32)


# --- an independent decoder: the stored bytes, read by hand --------------------------------


def _codes_by_hand(raw: np.ndarray, storage: str, strides: tuple[int, ...] | None, shape: tuple[int, ...]) -> np.ndarray:
    """One code per element, LSB first (uint2/uint4) or a byte each (uint8), through the
    layout's element strides (all 0: every element reads code 0)."""
    b = np.frombuffer(raw.tobytes(), dtype=np.uint8)
    if strides is not None:  # a strided uint8 member: as_strided over the stored bytes
        assert storage == "uint8"
        return np.lib.stride_tricks.as_strided(b, shape=shape, strides=strides).reshape(-1)
    per = {"uint2": 4, "uint4": 2, "uint8": 1}[storage]
    width = 8 // per
    n = int(np.prod(shape))
    c = np.stack([(b >> (width * i)) & ((1 << width) - 1) for i in range(per)], axis=1).reshape(-1)
    return c[:n]


def _member_values(m) -> np.ndarray:
    d = m.descriptor
    shape = tuple(d.shape)
    if d.quantization is None:  # a zero patch: float32 values
        return np.frombuffer(m.data[0].tobytes(), dtype="<f4")
    q = d.quantization
    assert isinstance(q, M.PerBlockAffine) and q.zero_point_buffer_index is None and q.axis == len(shape) - 1
    strides = tuple(s * 1 for s in d.layout.strides) if isinstance(d.layout, M.Strided) else None
    codes = _codes_by_hand(m.data[0], d.element_type.name, strides, shape).astype(np.float32)
    scales = np.frombuffer(m.data[1].tobytes(), dtype="<f4")
    assert scales.size == codes.size // q.block_size
    return (np.repeat(scales, q.block_size) * codes).astype(np.float32)


def decode_by_hand(t) -> np.ndarray:
    """The float32 values of an expanded tensor: each member by hand, added in emission order
    (a patch over its sub-block), as the overlay rule (hurray-spec/layouts/composite.md) says."""
    if not t.descriptor.is_composite:
        return _member_values(t)
    shape = tuple(t.descriptor.shape)
    out = _member_values(t.members[0]).copy()  # the base (not +0 + base: that loses a −0)
    for m in t.members[1:]:
        v = _member_values(m)
        start = int(np.ravel_multi_index(m.descriptor.shard.offset, shape)) if m.descriptor.quantization is None else 0
        out[start : start + v.size] = (out[start : start + v.size] + v).astype(np.float32)
    return out


def form_of(t) -> tuple[str, ...]:
    """The members' storages and layouts, e.g. ("uint4", "uint2", "uint8 strided")."""
    out = []
    for m in t.members:
        d = m.descriptor
        out.append(d.element_type.name + (" strided" if isinstance(d.layout, M.Strided) else ""))
    return tuple(out)


COMPACT = {"Q2_K": ("uint2", "uint8 strided"), "Q4_K": ("uint4", "uint8 strided"),
           "Q5_K": ("uint4", "uint2", "uint8 strided")}
PER_ELEMENT = {"Q2_K": ("uint2", "uint2"), "Q4_K": ("uint4", "uint2"), "Q5_K": ("uint8", "uint2")}


def data_bpw(t) -> float:
    n = int(np.prod(t.descriptor.shape))
    members = [m for m in t.members if m.descriptor.quantization is not None]
    return 8 * sum(h.byte_size for m in members for h in m.descriptor.buffers) / n


def check_file(src: Path, tmp: Path) -> tuple[Path, dict[str, tuple[str, ...]]]:
    """Import with --fallback exact, export back (byte-identical), verify, and compare every
    K-quant tensor read by hand with gguf-py's values as bits; the tensors' member forms."""
    hrry = tmp / (src.stem + ".hrry")
    gguf_to_hurray(src, hrry, fallback="exact", force=True)
    back = tmp / (src.stem + ".back.gguf")
    hurray_to_gguf(hrry, back, force=True)
    assert back.read_bytes() == src.read_bytes()
    result = hurray_interop.verify(src, hrry, fallback="exact")
    assert result.ok, (result.error, result.problems)
    forms = {}
    with HrryFile(hrry) as hf:
        for r in gguf.GGUFReader(str(src)).tensors:
            if r.tensor_type.name not in TYPES:
                continue
            ref = gguf_dequantize(np.asarray(r.data), r.tensor_type)
            t = hf.tensor(r.name)
            got = decode_by_hand(t)
            diff = np.flatnonzero(bits(got) != bits(ref))
            assert diff.size == 0, f"{r.name}: {diff.size} values differ, first at {diff[0]}"
            forms[r.name] = form_of(t)[: len(COMPACT[r.tensor_type.name])]
    return hrry, forms


# --- ggml's quantizer ---------------------------------------------------------------------


def _ggml_quantized(t: str, x: np.ndarray) -> np.ndarray:
    mk = pytest.importorskip("make_kquant_fixtures", reason="fixtures/ on the path")
    pytest.importorskip("libggml")
    lib, _ = mk.ggml_base()
    qt = int(Q[t])
    rows, cols = x.shape
    out = np.zeros((rows, lib.ggml_row_size(qt, cols)), dtype=np.uint8)
    x = np.ascontiguousarray(x, dtype=np.float32)
    assert lib.ggml_quantize_chunk(qt, x.ctypes.data, out.ctypes.data, 0, rows, cols, None) == out.size
    return out


@pytest.fixture(scope="module")
def ggml_model(tmp_path_factory) -> Path:
    """Per type a Gaussian and a Student-t matrix (64 × 4096) quantized by ggml."""
    import sys

    sys.path.insert(0, str(FIXTURES))
    rng = np.random.default_rng(22)
    tensors = []
    for t in TYPES:
        for kind, x in (("gauss", rng.standard_normal((64, 4096))), ("t4", rng.standard_t(4, (64, 4096)))):
            tensors.append((f"{kind}.{t}", t, (64, 4096), _ggml_quantized(t, x)))
    return write_gguf_raw(tmp_path_factory.mktemp("ggml") / "kq.gguf", tensors)


def test_ggml_quantized_k_quants_are_written_compact_and_exact(ggml_model: Path, tmp_path: Path) -> None:
    hrry, forms = check_file(ggml_model, tmp_path)
    assert forms == {f"{k}.{t}": COMPACT[t] for t in TYPES for k in ("gauss", "t4")}
    with HrryFile(hrry) as hf:
        for name in forms:
            t = name.split(".")[1]
            assert abs(data_bpw(hf.tensor(name)) - BPW[t][0]) < 1e-3, name  # + the one code byte
    with HrryFile(hrry) as hf:  # Q2_K on ggml's data has sub-blocks whose minimum is 0: flipped
        base = hf.tensor("gauss.Q2_K").members[0].data[1].view("<f4")
        assert (base < 0).any()


@pytest.mark.parametrize("fixture", ["ggml-quantized-types.gguf", "tiny-llama-kquant.gguf"])
def test_fixtures_are_written_compact_and_exact(fixture: str, tmp_path: Path) -> None:
    _, forms = check_file(FIXTURES / fixture, tmp_path)
    assert forms and all(f == COMPACT[next(t for t in TYPES if f == COMPACT[t])] for f in forms.values())


def test_pyhurray_loads_the_compact_forms(ggml_model: Path, tmp_path: Path) -> None:
    hurray = pytest.importorskip("hurray")
    hrry, forms = check_file(ggml_model, tmp_path)
    loaded = hurray.load(str(hrry))
    for name, form in forms.items():
        x = loaded[name]
        assert isinstance(x, hurray.Composite) and tuple(x.shape) == (64, 4096)
        assert [str(m.dtype).rsplit(".", 1)[-1] for m in x.members] == [f.split()[0] for f in form]


# --- crafted blocks -------------------------------------------------------------------------


def _blocks(t: str, seed: int = 3, rows: int = 4) -> np.ndarray:
    """ggml-like blocks of ``t`` (a fixture tensor's, 4 rows × 512)."""
    r = gguf.GGUFReader(str(FIXTURES / "ggml-quantized-types.gguf"))
    data = next(np.asarray(x.data) for x in r.tensors if x.name == f"q.{t}")
    return data.reshape(-1, X._specs()[t].block_bytes)[16 : 16 + 2 * rows].copy()  # live rows 8..11


def _set_f16(blocks: np.ndarray, t: str, field: str, value: float, rows: slice = slice(None)) -> None:
    at = X._specs()[t].struct.at(field)
    blocks[rows, at : at + 2] = np.array([value], dtype="<f2").view(np.uint8)


def _craft(t: str, case: str) -> np.ndarray:
    b = _blocks(t)
    if case == "dmin +0":
        _set_f16(b, t, "dmin", 0.0)
    elif case == "dmin -0":
        _set_f16(b, t, "dmin", -0.0)
    elif case == "all-zero blocks":
        b[1::3] = 0
    elif case == "d < 0 and a zero minimum":
        _set_f16(b, t, "d", -0.25, slice(2, 3))
        _set_f16(b, t, "dmin", 0.0, slice(2, 3))
    return b


CRAFTED = {"dmin +0": True, "dmin -0": True, "all-zero blocks": True, "d < 0 and a zero minimum": False}


@pytest.mark.parametrize("case", sorted(CRAFTED))
@pytest.mark.parametrize("t", TYPES)
def test_crafted_blocks(t: str, case: str, tmp_path: Path) -> None:
    src = write_gguf_raw(tmp_path / "c.gguf", [("w", t, (4, 512), _craft(t, case))])
    hrry, forms = check_file(src, tmp_path)
    assert forms["w"] == (COMPACT if CRAFTED[case] else PER_ELEMENT)[t]
    with HrryFile(hrry) as hf:
        assert abs(data_bpw(hf.tensor("w")) - BPW[t][0 if CRAFTED[case] else 1]) < 0.01


def _q4k_ambiguous(m: int) -> np.ndarray:
    """Q4_K blocks whose every sub-block has d = dmin < 0, sc = 1 and minimum m: the base
    scale s = d < 0 and the correction −dmin·m = m·|d|, which for m = 15 = qmax is exactly
    what a flipped sub-block stores (qmax·(−b))."""
    b = _blocks("Q4_K")
    _set_f16(b, "Q4_K", "d", -0.125)
    _set_f16(b, "Q4_K", "dmin", -0.125)
    sc = X._specs()["Q4_K"].struct.at("scales")
    b[:, sc : sc + 4] = 1
    b[:, sc + 4 : sc + 8] = m
    b[:, sc + 8 : sc + 12] = 1 | (m << 4)
    return b


@pytest.mark.parametrize("m, compact", [(15, False), (14, True)])
def test_an_unflipped_sub_block_that_reads_as_flipped_keeps_the_per_element_form(m: int, compact: bool,
                                                                               tmp_path: Path) -> None:
    src = write_gguf_raw(tmp_path / "a.gguf", [("w", "Q4_K", (4, 512), _q4k_ambiguous(m))])
    _, forms = check_file(src, tmp_path)
    assert forms["w"] == (COMPACT if compact else PER_ELEMENT)["Q4_K"]


def test_the_dry_run_and_the_report_say_the_form_and_its_bits(tmp_path: Path, capsys) -> None:
    src = write_gguf_raw(tmp_path / "r.gguf", [("a", "Q5_K", (4, 512), _blocks("Q5_K")),
                                              ("b", "Q4_K", (4, 512), _craft("Q4_K", "d < 0 and a zero minimum"))])
    for extra in (["--dry-run"], []):
        assert main(["convert", str(src), str(tmp_path / "r.hrry"), "--fallback", "exact", "--force", *extra]) == 0
        out = capsys.readouterr().out
        line = {ln.split()[0]: ln for ln in out.splitlines() if ln.split() and ln.split()[0] in "ab"}
        assert "overlay uint4 + uint2 high bit + broadcast minimum, K=32" in line["a"] and "(data 9," in line["a"]
        assert "overlay uint4+uint2" in line["b"] and "per-element form" in line["b"] and "(data 8," in line["b"]
        assert "5.5 →" in line["a"] and "4.5 →" in line["b"]


# --- the legacy forms still export (tests/test_legacy_forms.py); hostile compact files -------


@pytest.fixture(scope="module")
def compact_hrry(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("hostile")
    src = write_gguf_raw(tmp / "h.gguf", [("w.Q5_K", "Q5_K", (4, 512), _craft("Q5_K", "dmin +0")),
                                          ("w.Q4_K", "Q4_K", (4, 512), _blocks("Q4_K"))])
    return check_file(src, tmp)[0]


def _export_fails(bad: Path, tmp: Path, capsys, *words: str) -> str:
    out = tmp / "o.gguf"
    with pytest.raises(FormatError) as e:
        hurray_to_gguf(bad, out)
    msg = str(e.value)
    assert not out.exists() and all(w in msg for w in words), msg
    assert main(["convert", str(bad), str(out)]) == 2
    assert not out.exists() and len(capsys.readouterr().err.strip().splitlines()) == 1
    return msg


def test_a_broadcast_code_that_is_not_one_is_a_located_error(compact_hrry: Path, tmp_path: Path, capsys) -> None:
    for code in (0, 2):
        def edit(b: np.ndarray, code: int = code) -> np.ndarray:
            b[0] = code
            return b

        bad = rewrite(compact_hrry, tmp_path / f"code{code}.hrry", tensor="w.Q4_K", member=1, buffer=0, edit=edit)
        _export_fails(bad, tmp_path, capsys, "w.Q4_K.min", f"code is {code}")


@pytest.mark.parametrize("member", [1, 2])  # Q5_K: the high-bit plane, the broadcast minimum
@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_a_scale_buffer_one_byte_short_or_long(compact_hrry: Path, tmp_path: Path, capsys, member: int,
                                              delta: int) -> None:
    with HrryFile(compact_hrry) as hf:
        t = hf.tensor("w.Q5_K")
        m = t.members[member]
        scales = np.frombuffer(m.data[1].tobytes(), dtype=np.uint8)
        new = np.concatenate([scales, np.zeros(1, np.uint8)]) if delta > 0 else scales[: scales.size + delta]
        bufs = list(m.descriptor.buffers)
        bufs[1] = M.BufferHandle.cpu(new.size)
        d = dataclasses.replace(m.descriptor, buffers=tuple(bufs))
    bad = tmp_path / "short.hrry"
    try:
        _patch_descriptor(bad, compact_hrry, "w.Q5_K", member, d, new)
    except hurray_interop.errors.HurrayInteropError as e:  # the writer refuses scales that do not fit
        assert delta != 0 and "w.Q5_K" in str(e) and "scale buffer" in str(e), e
        return
    if delta == 0:
        out = tmp_path / "ok.gguf"
        hurray_to_gguf(bad, out)
        return
    with pytest.raises(Exception) as e:
        hurray_to_gguf(bad, tmp_path / "o.gguf")
    assert isinstance(e.value, hurray_interop.errors.HurrayInteropError), repr(e.value)
    assert "w.Q5_K" in str(e.value) and not (tmp_path / "o.gguf").exists()


def _patch_descriptor(dst: Path, src: Path, name: str, member: int, desc, scales: np.ndarray) -> None:
    """Rewrite ``src`` to ``dst`` with member ``member`` of ``name`` given ``desc`` and ``scales``."""
    from hurray_interop.core.hrry import HrryWriter

    with HrryFile(src) as hf:
        kv = dict(hf.kv)
        with HrryWriter(dst) as w:
            for n in hf.top_level_names():
                t = hf.tensor(n)
                if n == name:
                    ms = list(t.members)
                    data = list(ms[member].data)
                    data[1] = scales
                    ms[member] = dataclasses.replace(ms[member], descriptor=desc, data=tuple(data))
                    t = dataclasses.replace(t, members=tuple(ms))
                w.write_tensor(t)
            w.finish(kv)


def test_a_wrong_plane_scale_is_a_located_error(compact_hrry: Path, tmp_path: Path, capsys) -> None:
    def edit(b: np.ndarray) -> np.ndarray:
        s = b.view("<u4")
        s[9] ^= 1  # one ulp off 16·s: block 1, sub-block 1
        return b

    bad = rewrite(compact_hrry, tmp_path / "hi.hrry", tensor="w.Q5_K", member=1, buffer=1, edit=edit)
    _export_fails(bad, tmp_path, capsys, "w.Q5_K", "block 1", "high-bit plane")


def test_a_flipped_sub_block_whose_header_gives_a_minimum_is_a_located_error(compact_hrry: Path, tmp_path: Path,
                                                                            capsys) -> None:
    with HrryFile(compact_hrry) as hf:  # w.Q5_K has dmin = +0: every sub-block flipped
        assert (hf.tensor("w.Q5_K").members[0].data[1].view("<f4") < 0).all()
    key = gguf_exact.derived_key("w.Q5_K")
    spec = X._specs()["Q5_K"]
    block = int(np.flatnonzero(X._unpack(_craft("Q5_K", "dmin +0"), spec.m).any(axis=1))[0])  # a minimum m ≠ 0

    def edit(kv: dict) -> None:  # the derived record keeps that block's header (dmin +0 with m ≠ 0 does not factor)
        rec = np.frombuffer(kv[key].value, dtype=np.uint8).copy()
        h = X.form("Q5_K").record_bytes
        entries = rec[: rec.size - rec.size % (4 + h)].reshape(-1, 4 + h)
        index = entries[:, :4].copy().view("<u4").reshape(-1)
        assert block in index.tolist(), "the derived record keeps the crafted block's header"
        at = int(np.flatnonzero(index == block)[0]) * (4 + h) + 4 + [b for b, _ in spec.header].index(spec.struct.at("dmin"))
        rec[at : at + 2] = np.array([1.0], dtype="<f2").view(np.uint8)  # dmin 1: −dmin·m ≠ 0
        kv[key] = KVValue("bytes", rec.tobytes())

    bad = rewrite(compact_hrry, tmp_path / "flip.hrry", kv_edit=edit)
    _export_fails(bad, tmp_path, capsys, "w.Q5_K", f"block {block}", "stored flipped")
