"""``compare A B`` (issue #24 item 3): the figures against numpy/torch computed on values gguf-py
decodes (``gguf.quants.dequantize``), the first difference exact (also at window boundaries),
identical files, tensors and metadata keys only in one or different, every format pairing,
bad input as one line and exit 2, and the ``--json`` schema."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import save_file

import hurray_interop
from hurray_interop import kernels
from hurray_interop.cli import main
from hurray_interop.core.hrry import HrryFile
from hurray_interop.verification import compare as C

RNG = np.random.default_rng(24)
W = RNG.standard_normal((16, 64)).astype(np.float32)
NORM = (1 + 0.1 * RNG.standard_normal(64)).astype(np.float32)
LONG = "x" * 150


def write(path: Path, tensors: dict[str, tuple[str, np.ndarray]], kv: dict[str, Any] | None = None) -> Path:
    """A GGUF written by gguf-py: each tensor quantized by ``gguf.quants.quantize`` to its type."""
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in (kv or {}).items():
        w.add_string(k, v) if isinstance(v, str) else w.add_uint32(k, v)
    for name, (typ, x) in tensors.items():
        qt = Q[typ]
        data = x.astype(np.float32) if qt == Q.F32 else gguf.quants.quantize(x.astype(np.float32), qt)
        w.add_tensor(name, data, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def decoded(path: Path) -> dict[str, np.ndarray]:
    """Every tensor's values as gguf-py decodes them (the oracle)."""
    r = gguf.GGUFReader(str(path))
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
            for t in r.tensors}


def oracle_figures(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    x, y = torch.from_numpy(a.astype(np.float64)).reshape(-1), torch.from_numpy(b.astype(np.float64)).reshape(-1)
    d = x - y
    return {"max_abs": float(d.abs().max()), "rmse": float(torch.sqrt((d * d).mean())),
            "nmse": float((d * d).sum() / (y * y).sum()),
            "cosine": float(torch.nn.functional.cosine_similarity(x, y, dim=0))}


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main(["compare", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """The same weights as Q8_0 and as F16 (plus a norm in F32), and one metadata key apart."""
    a = write(tmp_path / "q8.gguf", {"w": ("Q8_0", W), "norm": ("F32", NORM)}, {"general.name": "q8"})
    b = write(tmp_path / "f16.gguf", {"w": ("F16", W), "norm": ("F32", NORM)}, {"general.name": "f16"})
    return a, b


def test_q8_0_against_f16_figures_match_numpy_and_torch(pair: tuple[Path, Path]) -> None:
    a, b = pair
    r = hurray_interop.compare(a, b)
    va, vb = decoded(a)["w"], decoded(b)["w"]
    (t,) = [t for t in r.tensors if t.name == "w"]
    assert (t.type_a, t.type_b, t.shape_a, t.status) == ("Q8_0", "F16", [16, 64], C.DIFFERS)
    for k, want in oracle_figures(va, vb).items():
        assert getattr(t, k) == pytest.approx(want, rel=1e-12, abs=1e-15), k
    neq = va != vb
    first = np.unravel_index(int(np.argmax(neq.reshape(-1))), va.shape)
    assert t.first_diff == list(first) and t.first_values == [float(va[first]), float(vb[first])]
    assert t.differing == int(neq.sum()) and t.elements == va.size
    norm = next(t for t in r.tensors if t.name == "norm")
    assert norm.identical and norm.bytes_identical and not r.identical


def test_an_edited_copy_names_the_element(tmp_path: Path) -> None:
    x = RNG.standard_normal((4, 8, 32)).astype(np.float32)
    y = x.copy()
    y[2, 5, 7] += 0.5
    y[3, 0, 0] -= 2.0
    a = write(tmp_path / "a.gguf", {"t": ("F32", x)})
    b = write(tmp_path / "b.gguf", {"t": ("F32", y)})
    (t,) = hurray_interop.compare(a, b).tensors
    assert t.first_diff == [2, 5, 7] and t.first_values == [float(x[2, 5, 7]), float(y[2, 5, 7])]
    assert t.differing == 2 and t.max_abs == pytest.approx(2.0, rel=1e-6)
    assert t.rmse == pytest.approx(math.sqrt(((x.astype(np.float64) - y) ** 2).mean()), rel=1e-12)


@pytest.mark.parametrize("at", [63, 64, 65, 127, 128])  # a window of 64: its last element, the next one's first
@pytest.mark.parametrize("hurray", [False, True])
def test_the_first_difference_at_window_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   at: int, hurray: bool) -> None:
    monkeypatch.setattr(C, "WINDOW", 64)
    x = RNG.standard_normal((8, 32)).astype(np.float32)
    y = x.copy()
    y.reshape(-1)[at] = 7.0
    y.reshape(-1)[200] = 9.0  # a later difference never hides the first
    a = write(tmp_path / "a.gguf", {"t": ("F32", x)})
    b = write(tmp_path / "b.gguf", {"t": ("F32", y)})
    if hurray:
        hurray_interop.convert(a, tmp_path / "a.hrry")
        hurray_interop.convert(b, tmp_path / "b.hrry")
        a, b = tmp_path / "a.hrry", tmp_path / "b.hrry"
    (t,) = hurray_interop.compare(a, b).tensors
    assert t.first_diff == list(np.unravel_index(at, x.shape)) and t.differing == 2
    assert t.first_values == [float(x.reshape(-1)[at]), 7.0]


def test_identical_files_exit_0(capsys: pytest.CaptureFixture[str], fixtures_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.gguf"
    shutil.copy(fixtures_dir / "tiny-llama.gguf", copy)
    code, out, err = cli(capsys, fixtures_dir / "tiny-llama.gguf", copy)
    assert code == 0 and not err
    assert out.splitlines()[-1].startswith("IDENTICAL ") and "27 tensors" in out
    code, out, _ = cli(capsys, fixtures_dir / "tiny-llama.gguf", copy, "-v")
    assert code == 0 and sum(1 for line in out.splitlines() if line.startswith("blk.")) == 18


def test_differences_exit_1_and_the_table_says_them(capsys: pytest.CaptureFixture[str], pair: tuple[Path, Path]) -> None:
    code, out, err = cli(capsys, *pair)
    assert code == 1 and not err
    rows = [line.split() for line in out.splitlines() if line.startswith("w ")]
    assert rows and rows[0][:3] == ["w", "Q8_0", "F16"]
    assert "norm " not in out  # identical tensors are counted, not listed
    assert "differs    general.name: A [STRING] q8" in out and "B [STRING] f16" in out
    assert out.splitlines()[-1].startswith("DIFFERENT ") and "1 of 2 tensors differ" in out


def test_keys_only_in_one_and_long_values(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a = write(tmp_path / "a.gguf", {"t": ("F32", NORM)}, {"only.a": 1, "long": LONG + "a"})
    b = write(tmp_path / "b.gguf", {"t": ("F32", NORM)}, {"only.b": "here", "long": LONG + "b"})
    code, out, _ = cli(capsys, a, b)
    assert code == 1
    assert "only in A  only.a: [UINT32] 1" in out and "only in B  only.b: [STRING] here" in out
    line = next(s for s in out.splitlines() if "differs    long:" in s)
    shown = line.split("A [STRING] ", 1)[1]
    assert len(shown) == hurray_interop._compare.SHORT and shown.endswith("…")
    code, out, _ = cli(capsys, a, b, "--full")
    assert f"A [STRING] {LONG}a" in out and f"B [STRING] {LONG}b" in out
    m = hurray_interop.compare(a, b).metadata
    assert [x["key"] for x in m.only_in_a] == ["only.a"] and [x["key"] for x in m.only_in_b] == ["only.b"]
    assert m.equal == 1  # general.architecture; general.alignment is the container's, left out


def test_tensors_only_in_one_and_shape_mismatch(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a = write(tmp_path / "a.gguf", {"t": ("F32", W), "x": ("F32", NORM)})
    b = write(tmp_path / "b.gguf", {"t": ("F32", W.reshape(32, 32)), "y": ("F32", NORM)})
    r = hurray_interop.compare(a, b)
    assert r.only_in_a == ["x"] and r.only_in_b == ["y"]
    (t,) = r.tensors
    assert t.status == C.SHAPE and t.max_abs is None and t.first_diff is None
    code, out, _ = cli(capsys, a, b)
    assert code == 1 and "tensors only in A (1): x" in out and "shape mismatch" in out
    code, out, _ = cli(capsys, a, b, "--tensor", "t")
    assert code == 1 and "only in" not in out.split("metadata:")[0]


def _hrry(src: Path, dst: Path, **kw: Any) -> Path:
    hurray_interop.convert(src, dst, **kw)
    return dst


def test_every_format_pairing(tmp_path: Path, fixtures_dir: Path) -> None:
    gg = fixtures_dir / "tiny-llama.gguf"
    hr = _hrry(gg, tmp_path / "t.hrry")
    shard = fixtures_dir / "tiny-split-00001-of-00003.gguf"
    sh = _hrry(shard, tmp_path / "s.hrry")
    merged = _hrry(sh, tmp_path / "merged.gguf", merge=True)
    mx = fixtures_dir / "mxfp8-tiny.safetensors"
    mh = _hrry(mx, tmp_path / "mx.hrry")
    for a, b in [(gg, hr), (hr, gg), (shard, sh), (shard, merged), (sh, merged), (mx, mh), (mh, mx)]:
        r = hurray_interop.compare(a, b)
        assert r.identical, (a, b, r.summary_line())
    # plain safetensors against a GGUF of the same F32 values: the values identical, the keys not
    st = tmp_path / "plain.safetensors"
    save_file({"t": W, "norm": NORM}, str(st), metadata={"general.name": "q8"})
    gf = write(tmp_path / "plain.gguf", {"t": ("F32", W), "norm": ("F32", NORM)}, {"general.name": "q8"})
    r = hurray_interop.compare(st, gf)
    assert all(t.identical for t in r.tensors) and len(r.tensors) == 2
    assert [x["key"] for x, _ in r.metadata.differ] == ["general.name"]  # a string, not a GGUF STRING
    assert [x["key"] for x in r.metadata.only_in_b] == ["general.architecture"] and not r.identical


def test_a_quantized_hrry_against_its_f16_source(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    a, b = pair  # the .hrry's values (the shared dequantizer) are gguf-py's, bit for bit
    r = hurray_interop.compare(_hrry(a, tmp_path / "q8.hrry"), b)
    t = next(t for t in r.tensors if t.name == "w")
    assert t.max_abs == pytest.approx(oracle_figures(decoded(a)["w"], decoded(b)["w"])["max_abs"], rel=1e-12)


@pytest.mark.parametrize("cut", [1, 30, 200])
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, fixtures_dir: Path,
                                      cut: int) -> None:
    good = fixtures_dir / "tiny-llama.gguf"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(good.read_bytes()[:cut])
    code, out, err = cli(capsys, good, bad)
    assert code == 2 and not out and len(err.splitlines()) == 1 and str(bad) in err and "Traceback" not in err


@pytest.mark.parametrize("argv, says", [
    (["missing.gguf"], "no such file"),
    (["{good}", "--tensor", "nope"], "--tensor 'nope'"),
    (["{good}", "--jobs", "0"], "--jobs"),
])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], fixtures_dir: Path, argv: list[str], says: str) -> None:
    good = fixtures_dir / "tiny-llama.gguf"
    code, out, err = cli(capsys, good, *[a.format(good=good) for a in argv])
    assert code == 2 and not out and len(err.splitlines()) == 1 and says in err


def test_json_schema(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    zero = np.zeros(64, np.float32)
    a = write(tmp_path / "a.gguf", {"w": ("Q8_0", W), "z": ("F32", NORM)}, {"general.name": LONG})
    b = write(tmp_path / "b.gguf", {"w": ("F16", W), "z": ("F32", zero)}, {"general.name": "b"})
    code, out, _ = cli(capsys, a, b, "--json")
    data = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert code == 1 and data["identical"] is False
    assert set(data) == {"a", "b", "format_a", "format_b", "identical", "counts", "tensors", "only_in_a",
                         "only_in_b", "metadata", "summary"}
    w, z = data["tensors"]
    assert set(w) >= {"name", "type_a", "type_b", "shape_a", "shape_b", "status", "elements", "differing",
                      "max_abs", "rmse", "nmse", "cosine", "first_diff", "first_values", "bytes_identical"}
    va, vb = decoded(a)["w"], decoded(b)["w"]
    first = [int(i) for i in np.unravel_index(int(np.argmax((va != vb).reshape(-1))), va.shape)]
    assert isinstance(w["nmse"], float) and w["first_diff"] == first and w["status"] == "differs"
    assert z["nmse"] == "inf" and z["cosine"] == "nan"  # B all zero: documented as such
    (d,) = data["metadata"]["differ"]
    assert d["key"] == "general.name" and d["a"] == {"type": "STRING", "value": LONG} and d["b"]["value"] == "b"
    assert data["metadata"]["left_out_a"] == [] and data["counts"] == {
        "identical": 0, "differs": 2, "shape mismatch": 0, "not decoded": 0}


def test_container_keys_are_left_out(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "a.gguf"), "llama")
    w.add_custom_alignment(64)
    w.add_tensor("t", NORM)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    b = write(tmp_path / "b.gguf", {"t": ("F32", NORM)})
    r = hurray_interop.compare(tmp_path / "a.gguf", b)
    assert r.identical and r.metadata.left_out_a == ["general.alignment"] and r.metadata.left_out_b == []


def test_window_sums_semantics() -> None:
    nan, inf = np.float32("nan"), np.float32("inf")
    a = np.array([0.0, -0.0, nan, 1.0, inf, 2.0], np.float32)
    b = np.array([-0.0, 0.0, nan, 1.0, inf, 3.0], np.float32)
    s = C.window_stats_numpy(a, b)  # +0 == -0, NaN == NaN, equal infinities equal
    assert (s.differing, s.first, s.max_abs, s.ssd) == (1, 5, 1.0, 1.0)
    s = C.window_stats_numpy(np.array([1.0, nan], np.float32), np.array([1.0, 2.0], np.float32))
    assert (s.differing, s.first) == (1, 1) and math.isnan(s.max_abs)


def _same_sum(x: float, y: float) -> bool:
    return (math.isnan(x) and math.isnan(y)) or x == y or math.isclose(x, y, rel_tol=1e-12)


SPECIAL = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, 3.4e38, 1.0], np.float32)


@pytest.mark.skipif(kernels.KERNEL != "c", reason="the compiled kernel is not loaded")
@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 7, 8, 9, 1000, (1 << 20) + 3])
def test_the_c_sums_match_their_numpy_twin(n: int) -> None:
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    for case in range(4):
        b = a.copy()
        if case >= 1 and n:  # differences at the 4-lane boundaries and at random places
            for i in {0, n - 1, min(3, n - 1), min(4, n - 1), int(rng.integers(n))}:
                b[i] += np.float32(0.25)
        if case >= 2 and n:  # ±0, NaN on one side or both, infinities
            idx = rng.integers(n, size=min(n, 16))
            a[idx[: len(idx) // 2]] = rng.choice(SPECIAL, len(idx) // 2)
            b[idx] = rng.choice(SPECIAL, len(idx))
        if case == 3 and n:
            b[:] = a
            b[-1] = -a[-1] if a[-1] == 0 else b[-1]  # -0 against +0: equal
        got = kernels.compare_stats(a, b)
        want = C.window_stats_numpy(a, b)
        assert got is not None
        ssd, sa2, sb2, dot, max_abs, differing, first = got
        assert (differing, first) == (want.differing, want.first), case
        assert _same_sum(max_abs, want.max_abs), case
        for x, y in zip((ssd, sa2, sb2, dot), (want.ssd, want.sa2, want.sb2, want.dot)):
            assert _same_sum(x, y), (case, x, y)


def test_the_figures_do_not_depend_on_the_thread_count(pair: tuple[Path, Path]) -> None:
    one = hurray_interop.compare(*pair, jobs=1).to_json()
    two = hurray_interop.compare(*pair, jobs=2).to_json()
    assert one == two


def test_two_hrry_whose_windows_do_not_line_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x = RNG.standard_normal((3, 96)).astype(np.float32)
    a = _hrry(write(tmp_path / "q8.gguf", {"t": ("Q8_0", x)}), tmp_path / "q8.hrry")
    b = _hrry(write(tmp_path / "f32.gguf", {"t": ("F32", x)}), tmp_path / "f32.hrry")
    whole = hurray_interop.compare(a, b).to_json()
    monkeypatch.setattr(C, "WINDOW", 48)  # the F32 rows in windows of 48, the Q8_0 ones of its 32-value blocks
    from hurray_interop.dequant import windows
    with HrryFile(a) as ha, HrryFile(b) as hb:
        sa = [(lo, n) for lo, n, _ in windows(ha.tensor("t"), max_elements=48).spans()]
        sb = [(lo, n) for lo, n, _ in windows(hb.tensor("t"), max_elements=48).spans()]
    assert sa != sb
    (t,) = hurray_interop.compare(a, b).tensors
    want = oracle_figures(decoded(tmp_path / "q8.gguf")["t"], x)
    for k, v in want.items():
        assert getattr(t, k) == pytest.approx(v, rel=1e-12), k
    assert t.first_diff == whole["tensors"][0]["first_diff"] and t.differing == whole["tensors"][0]["differing"]


def test_split_sets_and_bad_hrry(capsys: pytest.CaptureFixture[str], tmp_path: Path, fixtures_dir: Path) -> None:
    first, third = (fixtures_dir / f"tiny-split-0000{i}-of-00003.gguf" for i in (1, 3))
    r = hurray_interop.compare(first, third)  # any shard stands for its set
    assert r.identical and len(r.tensors) > 3
    bad = tmp_path / "bad.hrry"
    hurray_interop.convert(fixtures_dir / "tiny-llama.gguf", tmp_path / "t.hrry")
    bad.write_bytes((tmp_path / "t.hrry").read_bytes()[:-40])
    code, out, err = cli(capsys, fixtures_dir / "tiny-llama.gguf", bad)
    assert code == 2 and not out and len(err.splitlines()) == 1 and str(bad) in err


def test_json_full_gives_whole_arrays(capsys: pytest.CaptureFixture[str], fixtures_dir: Path) -> None:
    a, b = fixtures_dir / "tiny-llama.gguf", fixtures_dir / "tiny-llama-kquant.gguf"
    short = json.loads(cli(capsys, a, b, "--json")[1])["metadata"]["differ"]
    full = json.loads(cli(capsys, a, b, "--json", "--full")[1])["metadata"]["differ"]
    scores = [d for d in short if d["key"] == "tokenizer.ggml.scores"][0]
    whole = [d for d in full if d["key"] == "tokenizer.ggml.scores"][0]
    assert len(scores["a"]["value"]) == 16 and scores["a"]["count"] == 300
    assert len(whole["a"]["value"]) == 300 == whole["a"]["count"]
    assert whole["a"]["value"] == decoded_kv(a, "tokenizer.ggml.scores")


def decoded_kv(path: Path, key: str) -> list[float]:
    f = gguf.GGUFReader(str(path)).fields[key]
    return [float(f.parts[i][0]) for i in f.data]


def test_a_tensor_the_dequantizer_cannot_evaluate_is_not_decoded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = write(tmp_path / "a.gguf", {"t": ("F32", NORM), "u": ("F32", NORM)})
    b = write(tmp_path / "b.gguf", {"t": ("F32", NORM), "u": ("F32", -NORM)})
    hb = _hrry(b, tmp_path / "b.hrry")

    def refuse(*args: Any, **kw: Any) -> Any:
        raise hurray_interop.errors.UnsupportedError("a layout not evaluated here", tensor="u")

    monkeypatch.setattr(C, "windows", refuse)
    r = hurray_interop.compare(a, hb)
    assert [(t.name, t.status, t.note) for t in r.tensors] == [
        ("t", C.NOT_DECODED, "a layout not evaluated here"), ("u", C.NOT_DECODED, "a layout not evaluated here")]
    assert not r.identical and "2 of 2 tensors not decoded" in r.summary_line()
