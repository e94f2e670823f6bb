"""The one pass of GGUF ⇄ Hurray (docs/benchmarks.md, "One pass"): refusals found mid-way,
rewinds for fallbacks, the compiled and numpy kernels end to end, bounded memory."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from hurray_interop import kernels as K
import hurray_interop.conversions.gguf as cg
from hurray_interop.conversions.gguf import gguf_to_hurray, hurray_to_gguf
from hurray_interop.errors import ConversionRefused
from hurray_interop.files.positional import PositionalWriter
from hurray_interop.formats.gguf import read_gguf

ROOT = Path(__file__).resolve().parents[1]
BLOCK = {Q.Q4_0: 18, Q.Q8_0: 34, Q.MXFP4: 17}


def _blocks(qt: Q, n: int, seed: int) -> np.ndarray:
    """``n`` random GGML blocks of ``qt`` with ordinary scales (f16 in [0.5, 2), E8M0 near 1)."""
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(n, BLOCK[qt]), dtype=np.uint8)
    if qt == Q.MXFP4:
        b[:, 0] = rng.integers(120, 135, size=n)
    else:
        b[:, 0:2] = rng.uniform(0.5, 2.0, size=n).astype("<f2").view(np.uint8).reshape(n, 2)
    return b


def _write(path: Path, tensors: dict[str, tuple[np.ndarray, Q]]) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (raw, qt) in tensors.items():
        w.add_tensor(name, raw, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _model(tmp_path: Path) -> Path:
    """Five tensors; ``b`` (its last block: scale 0 on non-zero codes) and ``d`` (a NaN scale
    in its middle) are refused, after ``a`` and most of ``b`` were written."""
    b = _blocks(Q.Q4_0, 256, 2)
    b[-1, 0:2] = 0
    d = _blocks(Q.Q8_0, 64, 4)
    d[40, 0:2] = np.frombuffer(b"\x00\x7e", np.uint8)
    return _write(tmp_path / "m.gguf", {
        "a": (_blocks(Q.Q4_0, 128, 1), Q.Q4_0),
        "b": (b, Q.Q4_0),
        "c": (_blocks(Q.MXFP4, 64, 3), Q.MXFP4),
        "d": (d, Q.Q8_0),
        "e": (np.arange(64, dtype=np.float32).reshape(2, 32), Q.F32),
    })


def test_refusal_mid_way_deletes_the_output_and_names_every_refused_tensor(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    src = _model(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(cg, "PAR_BLOCKS", 8)  # many chunks: b is refused after some were written
    written: list[int] = []
    lock = threading.Lock()
    real = PositionalWriter.pwrite

    def pwrite(self: PositionalWriter, data: object, offset: int) -> None:
        with lock:
            written.append(memoryview(data).nbytes)  # type: ignore[arg-type]
        real(self, data, offset)

    monkeypatch.setattr(PositionalWriter, "pwrite", pwrite)
    with pytest.raises(ConversionRefused) as ei:
        gguf_to_hurray(src, out / "m.hrry", jobs=2)
    assert [r[0] for r in ei.value.reasons] == ["b", "d"]
    assert "block 255: scale d = 0 on a block with non-zero codes" in ei.value.reasons[0][2]
    assert "block 40: scale d = nan is not finite" in ei.value.reasons[1][2]
    assert os.listdir(out) == []  # the temporary file is gone too
    # a (128 blocks) and part of b were written; nothing after b's refusal (c, d, e only scanned)
    per_block = 16 + 2
    assert 128 * per_block < sum(written) < (128 + 256) * per_block


def test_a_fallback_after_a_mid_way_refusal_writes_the_same_bytes(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    src = _model(tmp_path)
    monkeypatch.setattr(cg, "PAR_BLOCKS", 8)  # b's first chunks are written, then taken back
    gguf_to_hurray(src, tmp_path / "rewound.hrry", fallback="float32", jobs=2)
    monkeypatch.setattr(cg, "PAR_BLOCKS", 1 << 20)  # one chunk: refused before any of b is written
    gguf_to_hurray(src, tmp_path / "direct.hrry", fallback="float32", jobs=1)
    assert (tmp_path / "rewound.hrry").read_bytes() == (tmp_path / "direct.hrry").read_bytes()
    hurray_to_gguf(tmp_path / "rewound.hrry", tmp_path / "back.gguf")
    with read_gguf(tmp_path / "back.gguf") as back, read_gguf(src) as orig:
        for t, u in zip(back.tensors, orig.tensors):
            if t.name in ("a", "c", "e"):
                assert np.array_equal(t.data, u.data), t.name
            else:  # stored dequantized: gguf-py's values
                assert t.type_name == "F32"


def _cli(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "-m", "hurray_interop", *args, "-q"], check=True, env=env, cwd=ROOT)


@pytest.mark.parametrize("fixture,fallback", [("tiny-llama.gguf", None), ("ggml-quantized-types.gguf", "float32"),
                                              ("tiny-llama-kquant.gguf", "exact")])
@pytest.mark.skipif(K.KERNEL != "c", reason="compiled kernel not built (python hatch_build.py)")
def test_kernel_and_numpy_paths_write_the_same_bytes(fixtures_dir: Path, tmp_path: Path, fixture: str,
                                                    fallback: str | None) -> None:
    """Both directions, end to end, with the compiled kernel (when built) and with numpy."""
    src = fixtures_dir / fixture
    opts = ["--fallback", fallback] if fallback else []
    outputs = {}
    for kernel in ("c", "numpy"):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        env.pop("HURRAY_INTEROP_KERNEL", None)
        if kernel == "numpy":
            env["HURRAY_INTEROP_KERNEL"] = "numpy"
        h, g = tmp_path / f"{kernel}.hrry", tmp_path / f"{kernel}.gguf"
        _cli(env, "convert", str(src), str(h), *opts)
        _cli(env, "convert", str(h), str(g), *([] if fallback == "exact" else opts))
        outputs[kernel] = (h.read_bytes(), g.read_bytes())
        version = subprocess.run([sys.executable, "-m", "hurray_interop", "--version"], env=env, cwd=ROOT,
                                 capture_output=True, text=True, check=True).stdout
        assert version.strip().endswith(f"(kernel: {kernel})"), version  # each run took the path it names
    assert outputs["c"] == outputs["numpy"]


def test_without_positional_calls_the_bytes_are_the_same(fixtures_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """No pwrite, preadv, copy_file_range (Windows): seek-and-write under a lock, a buffer
    copy, and the sequential writes around them still land where they belong."""
    src = fixtures_dir / "tiny-llama.gguf"
    monkeypatch.setattr(cg, "PAR_BLOCKS", 4)  # many positional writes from both threads
    gguf_to_hurray(src, tmp_path / "a.hrry", jobs=2)
    hurray_to_gguf(tmp_path / "a.hrry", tmp_path / "a.gguf", jobs=2)
    for name in ("pwrite", "preadv", "copy_file_range"):
        monkeypatch.delattr(os, name, raising=False)
    gguf_to_hurray(src, tmp_path / "b.hrry", jobs=2)
    hurray_to_gguf(tmp_path / "b.hrry", tmp_path / "b.gguf", jobs=2)
    assert (tmp_path / "a.hrry").read_bytes() == (tmp_path / "b.hrry").read_bytes()
    assert (tmp_path / "b.gguf").read_bytes() == (tmp_path / "a.gguf").read_bytes() == src.read_bytes()


def _peak(fn: object) -> int:
    tracemalloc.start()
    try:
        fn()  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("direction", ["import", "export"])
def test_memory_does_not_grow_with_the_tensor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direction: str) -> None:
    """Python-allocated peak (tracemalloc): the same for a tensor 8× the size (reused chunk
    buffers, nothing per tensor), and far below the tensor itself (on both kernel paths:
    the numpy twins' temporaries are larger than C's, ~2.7 MiB here)."""
    monkeypatch.setattr(cg, "PAR_BLOCKS", 1 << 13)
    peaks = []
    for n in (1 << 16, 1 << 19):  # 1.1 MiB and 9 MiB of Q4_0 (plus as much Q8_0)
        d = tmp_path / str(n)
        d.mkdir()
        src = _write(d / "m.gguf", {"q4": (_blocks(Q.Q4_0, n, 5), Q.Q4_0), "q8": (_blocks(Q.Q8_0, n // 2, 6), Q.Q8_0)})
        gguf_to_hurray(src, d / "warm.hrry", jobs=2)  # first calls load tables and modules: not measured
        hurray_to_gguf(d / "warm.hrry", d / "warm.gguf", jobs=2)
        if direction == "import":
            peaks.append(_peak(lambda: gguf_to_hurray(src, d / "m.hrry", jobs=2)))
        else:
            gguf_to_hurray(src, d / "m.hrry", jobs=2)
            peaks.append(_peak(lambda: hurray_to_gguf(d / "m.hrry", d / "back.gguf", jobs=2)))
            assert (d / "back.gguf").read_bytes() == src.read_bytes()
    small, big = peaks
    # the chunks in flight vary with the threads' timing (numpy twins: ~0.6 MiB each); a
    # peak that followed the tensor would grow by ~8 MiB
    assert big < small + (3 << 19), peaks
    assert big < (1 << 19) * 18 // 2, peaks  # under half of the 9 MiB Q4_0 tensor
