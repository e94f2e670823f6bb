"""The compiled kernel (hurray_interop/_kernel.c) against the numpy movers, byte for byte.

Every function of :mod:`hurray_interop.kernels` and of its GGML-specific companion
:mod:`hurray_interop.conversions.gguf_kernels` runs once through C and once with
the library switched off (``kernels._lib = None``: the numpy path, ``numpy_*``), on random
blocks of many sizes (0, 1, odd, across the numpy step of 8192 rows, large), read
through strided, reversed and every-other-row views of block buffers as the
converters read the memory-mapped file.  The scale scans are also checked against
numpy's own float16 classification (isfinite, == 0).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from hurray_interop import kernels as K
from hurray_interop.kernels import _np as B
from hurray_interop.conversions import gguf_kernels as GK  # GGML's own movers, same library

ROOT = Path(__file__).resolve().parents[1]
SIZES = (0, 1, 2, 7, 33, 8191, 8192, 8193, 20001)

needs_c = pytest.mark.skipif(
    K.KERNEL != "c",
    reason=f"compiled kernel not loaded ({K.LIBRARY.name} not built or {K.ENV_VAR}=numpy); "
    "build it with `python hatch_build.py`",
)


@contextlib.contextmanager
def numpy_path() -> Iterator[None]:
    saved, K._lib = K._lib, None
    try:
        yield
    finally:
        K._lib = saved


class _Recorder:
    """Stands in for the loaded library and notes which C functions were called."""

    def __init__(self, lib: Any) -> None:
        self.lib, self.calls = lib, []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        return getattr(self.lib, name)


def both(fn: Callable[[], Any], expect_c: bool | set[str] = True) -> tuple[Any, Any]:
    """``fn()`` through C (checking that C ran, not the fallback: any C function, or every one
    of ``expect_c``), then through numpy."""
    rec = _Recorder(K._lib)
    saved, K._lib = K._lib, rec
    try:
        c = fn()
    finally:
        K._lib = saved
    if isinstance(expect_c, set):
        assert expect_c <= set(rec.calls), f"C functions called: {rec.calls}"
    else:
        assert bool(rec.calls) == expect_c, f"C functions called: {rec.calls}"
    with numpy_path():
        n = fn()
    return c, n


def same(a: Any, b: Any) -> None:
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
        return
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def views(n: int, block_bytes: int, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """``(n, block_bytes)`` random blocks seen as the converters see them: contiguous,
    every other block of a larger buffer, and in reverse (a negative row stride)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(2 * n, block_bytes), dtype=np.uint8)
    yield "contiguous", raw[:n]
    yield "every-other", raw[::2]
    yield "reversed", raw[n:][::-1]


CASES = [(n, i) for i, n in enumerate(SIZES)]


@needs_c
@pytest.mark.parametrize(("n", "seed"), CASES)
def test_nibble_movers(n: int, seed: int) -> None:
    for _, blocks in views(n, 18, seed):  # Q4_0: d at 0, qs at 2..18
        qs = blocks[:, 2:18]
        for xor in (0, 0x88, 0x08):
            same(*both(lambda: K.split_to_pairs(qs, xor)))
            same(K.split_to_pairs(qs, xor), B.split_to_pairs(qs, xor))
        same(*both(lambda: K.pairs_to_split(qs)))
        assert np.array_equal(K.pairs_to_split(K.split_to_pairs(qs)), qs)  # inverses


@needs_c
@pytest.mark.parametrize("w", [32, 48, 64, 128])
@pytest.mark.parametrize(("n", "seed"), CASES)
def test_nibble_movers_wide_rows(w: int, n: int, seed: int) -> None:
    """Rows of several 16-byte groups: Q4_K's and Q5_K's 32-byte runs (an SSE2 body for
    multiples of 32 on x86-64), and the portable body for the others."""
    for _, blocks in views(n, 4 + w, seed):
        qs = blocks[:, 4 : 4 + w]
        for xor in (0, 0x88):
            same(*both(lambda: K.split_to_pairs(qs, xor)))
            same(K.split_to_pairs(qs, xor), B.split_to_pairs(qs, xor))
        same(*both(lambda: K.pairs_to_split(qs)))
        assert np.array_equal(K.pairs_to_split(K.split_to_pairs(qs)), qs)



@needs_c
def test_nibble_movers_portable_body(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The x86-64 build runs SSE2 bodies for rows of 16 bytes and of multiples of 32 (split_to_pairs); the portable body (every other
    target) is built here with ``__SSE2__`` undefined and checked against numpy the same way."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hatch_build", ROOT / "hatch_build.py")
    assert spec and spec.loader
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    monkeypatch.setenv("CFLAGS", "-U__SSE2__")
    why = hook.compile_kernel(ROOT, tmp_path / "portable.so")
    if why is not None:
        pytest.skip(f"cannot build the kernel here: {why}")
    monkeypatch.setattr(K, "LIBRARY", tmp_path / "portable.so")
    lib = K._load()
    assert lib is not None
    monkeypatch.setattr(K, "_lib", lib)
    for n, seed in ((1, 0), (33, 1), (8193, 2)):
        for w in (16, 32, 64):
            for _, blocks in views(n, 2 + w, seed):
                qs = blocks[:, 2 : 2 + w]
                for xor in (0, 0x88):
                    same(*both(lambda: K.split_to_pairs(qs, xor)))
                same(*both(lambda: K.pairs_to_split(qs)))

@needs_c
@pytest.mark.parametrize(("n", "seed"), CASES)
def test_q5_movers(n: int, seed: int) -> None:
    for _, blocks in views(n, 24, seed):  # Q5_1: d 0, m 2, qh 4..8, qs 8..24
        qs, qh = blocks[:, 8:24], blocks[:, 4:8]
        same(*both(lambda: GK.q5_codes(qs, qh)))
        codes = GK.q5_codes(qs, qh)
        assert codes.max(initial=0) <= 31
        same(*both(lambda: GK.q5_pack(codes)))
        assert np.array_equal(np.hstack(GK.q5_pack(codes)), np.hstack([qs, qh]))
        # bits 5..7 of a code are ignored, by both paths
        noisy = blocks[:, :32] if blocks.shape[1] >= 32 else np.hstack([blocks, blocks])[:, :32]
        same(*both(lambda: GK.q5_pack(noisy)))
        same(*both(lambda: GK.q5_pack(noisy.view(np.int8))))
        same(*both(lambda: GK.q5_pack(noisy.astype(np.int16))))


@needs_c
@pytest.mark.parametrize(("n", "seed"), CASES)
def test_field_gathers(n: int, seed: int) -> None:
    for _, blocks in views(n, 34, seed):
        for off in (0, 1, 2, 32):
            same(*both(lambda: K.field_f16(blocks, off)))
        for off, size in ((0, 1), (2, 32), (16, 17), (33, 1), (5, 0), (0, 34)):
            same(*both(lambda: K.field_u8(blocks, off, size)))
        same(*both(lambda: K.field_u8(blocks.view(np.int8), 2, 4)))


@needs_c
@pytest.mark.parametrize(("n", "seed"), CASES)
def test_outputs_written_in_place(n: int, seed: int) -> None:
    """``out=`` into a strided block buffer (export) gives the returned bytes, in place."""
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    codes = rng.integers(0, 32, size=(n, 32), dtype=np.uint8)

    def export() -> tuple[np.ndarray, np.ndarray]:
        out = np.zeros((n, 24), dtype=np.uint8)
        codes_out = np.empty((n, 32), dtype=np.uint8)
        K.scatter_field(out, 0, np.random.default_rng(seed).standard_normal(n).astype("<f2"))
        K.pairs_to_split(h, out=out[:, 2:18])
        GK.q5_pack(codes, qs_out=out[:, 8:24], qh_out=out[:, 4:8])
        K.split_to_pairs(h, 0x88, out=out[:, 2:18])
        GK.q5_codes(out[:, 8:24], out[:, 4:8], out=codes_out)
        return out, codes_out

    movers = {"hk_pairs_to_split", "hk_q5_pack", "hk_split_to_pairs", "hk_q5_codes"}
    same(*both(export, expect_c=movers | ({"hk_move"} if n else set())))
    out = np.zeros((n, 20), dtype=np.uint8)
    K.pairs_to_split(h, out=out[:, 4:])
    assert np.array_equal(out[:, 4:], B.pairs_to_split(h)) and not out[:, :4].any()


@needs_c
def test_output_overlapping_its_input_takes_the_safe_path() -> None:
    rng = np.random.default_rng(5)
    qs = rng.integers(0, 256, size=(100, 16), dtype=np.uint8)
    want = B.split_to_pairs(qs, 0x88)
    got = K.split_to_pairs(qs, 0x88, out=qs)
    assert got is qs and np.array_equal(qs, want)


@needs_c
@pytest.mark.parametrize(("n", "seed"), CASES)
def test_scatter_field(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for values in (rng.integers(0, 2**16, n, dtype=np.uint16).view("<f2"),
                   rng.integers(0, 256, (n, 4), dtype=np.uint8),
                   rng.integers(0, 256, (2 * n, 3), dtype=np.uint8)[::2],
                   rng.integers(0, 256, n, dtype=np.uint8)):
        def put() -> np.ndarray:
            base = np.full((2 * n, 22), 0xA5, dtype=np.uint8)
            K.scatter_field(base[::2], 1, values)
            return base
        same(*both(put, expect_c=n > 0))
        if n:
            got = put()[::2]
            width = values.nbytes // n
            assert np.array_equal(got[:, 1 : 1 + width], np.ascontiguousarray(values).view(np.uint8).reshape(n, -1))


SPECIAL_F16 = np.array([0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF, 0x0001, 0x3C00, 0x7BFF],
                       dtype="<u2")


@needs_c
@pytest.mark.parametrize(("n", "seed"), CASES)
def test_scale_scans(n: int, seed: int) -> None:
    for _, blocks in views(n, 18, seed):
        k = min(n, SPECIAL_F16.size)
        if blocks.flags.writeable:
            blocks[:k, 2:4] = SPECIAL_F16[:k].view(np.uint8).reshape(-1, 2)
            blocks[:k, 0] = np.array([0, 0xFF, 1, 0x7F, 0, 0xFF, 2, 3, 0, 0], dtype=np.uint8)[:k]
        c, p = both(lambda: K.scale_class(blocks, 2, "f16"))
        same(c, p)
        d = B.field_f16(blocks, 2)  # the oracle: numpy's own float16 tests
        with np.errstate(invalid="ignore"):
            want = np.where(~np.isfinite(d), K.SCALE_BAD, np.where(d == 0, K.SCALE_ZERO, K.SCALE_OK))
        assert np.array_equal(c, want.astype(np.uint8))
        c, p = both(lambda: K.scale_class(blocks, 0, "e8m0"))
        same(c, p)
        e = blocks[:, 0]
        assert np.array_equal(c, np.where(e == 0xFF, 2, np.where(e == 0, 1, 0)).astype(np.uint8))
        for mask in (0xFF, 0x77):
            rows = blocks[:, 2:18] & np.uint8((0x01, 0x10, 0x88)[seed % 3])  # some rows all zero
            same(*both(lambda: K.all_zero(rows, mask)))
            same(*both(lambda: K.all_zero(blocks[:, 2:18], mask)))


def test_scale_scan_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="bf16"):
        K.scale_class(np.zeros((1, 4), np.uint8), 0, "bf16")


@needs_c
def test_odd_inputs_take_the_numpy_path_with_numpy_results() -> None:
    """Shapes, dtypes and offsets the C code does not take give numpy's answer (or error)."""
    blocks = np.arange(4 * 18, dtype=np.uint8).reshape(4, 18)
    cols = np.asfortranarray(blocks)[:, 2:18]  # bytes within a row not contiguous
    same(*both(lambda: K.split_to_pairs(cols), expect_c=False))
    same(*both(lambda: K.field_u8(blocks, -3, 2), expect_c=False))  # numpy's slicing rules
    same(*both(lambda: K.field_f16(blocks, -2), expect_c=False))
    for path in (contextlib.nullcontext, numpy_path):
        with path(), pytest.raises(ValueError):
            K.field_f16(blocks, 17)  # runs off the block
        with path(), pytest.raises(ValueError):
            K.pairs_to_split(np.zeros((3, 16), np.uint8), out=np.zeros((2, 16), np.uint8))


@needs_c
def test_two_threads_at_once() -> None:
    """ctypes drops the GIL: two threads in the C code at the same time both get their bytes."""
    rng = np.random.default_rng(9)
    parts = [rng.integers(0, 256, size=(200_000, 18), dtype=np.uint8) for _ in range(2)]
    results: list[Any] = [None, None]

    def work(i: int) -> None:
        results[i] = K.split_to_pairs(parts[i][:, 2:18], 0x88)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        same(results[i], B.split_to_pairs(parts[i][:, 2:18], 0x88))


def _run(code: list[str], **env: str) -> str:
    e = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    p = subprocess.run([sys.executable, *code], capture_output=True, text=True, env=e, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


@pytest.mark.parametrize(("env", "kernel"), [("numpy", "numpy"), pytest.param("", "c", marks=needs_c)])
def test_environment_forces_the_numpy_path(env: str, kernel: str) -> None:
    assert _run(["-c", "import hurray_interop.kernels as k; print(k.KERNEL, k._lib is None)"],
                HURRAY_INTEROP_KERNEL=env) == f"{kernel} {kernel == 'numpy'}"
    assert _run(["-m", "hurray_interop", "--version"], HURRAY_INTEROP_KERNEL=env).endswith(f"(kernel: {kernel})")


def _ggml_elements(qs: np.ndarray) -> np.ndarray:
    """The oracle, element by element: GGML byte j holds element j (low nibble) and element
    j + w (high nibble) of a 2w-element block (docs/conversion-rules.md § 2)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _hurray_pairs(elements: np.ndarray) -> np.ndarray:
    """Hurray byte k holds elements 2k (low nibble) and 2k + 1 (high nibble)."""
    return (elements[:, 0::2] | elements[:, 1::2] << 4).astype(np.uint8)


@needs_c
@pytest.mark.parametrize("w", [16, 32, 64, 128])
def test_nibble_movers_of_any_block_width_follow_the_element_order(w: int) -> None:
    """The C movers take any width that is a multiple of 16 bytes (K-quant-sized blocks too)."""
    rng = np.random.default_rng(w)
    raw = rng.integers(0, 256, size=(300, w + 6), dtype=np.uint8)
    qs = raw[::3, 3 : 3 + w]
    want = _hurray_pairs(_ggml_elements(qs))
    assert np.array_equal(K.split_to_pairs(qs), want)
    assert np.array_equal(K.split_to_pairs(qs, 0x88), want ^ 0x88)
    assert np.array_equal(K.pairs_to_split(want), qs)


@needs_c
@pytest.mark.parametrize("k", [16, 32, 64, 256])
def test_q5_movers_of_any_block_width_follow_the_element_order(k: int) -> None:
    rng = np.random.default_rng(k)
    raw = rng.integers(0, 256, size=(200, k // 2 + k // 8 + 1), dtype=np.uint8)
    qs, qh = raw[:, 1 : 1 + k // 2], raw[:, 1 + k // 2 :]
    high = np.unpackbits(qh, axis=1, bitorder="little")  # bit j of qh: bit 4 of code j
    want = _ggml_elements(qs) | high << 4
    assert np.array_equal(GK.q5_codes(qs, qh), want)
    got_qs, got_qh = GK.q5_pack(want | 0xE0)  # bits 5..7 ignored
    assert np.array_equal(got_qs, qs) and np.array_equal(got_qh, qh)


# ---------------------------------------------------------------------------
# bit-field runs (the K-quant code and scale fields)


def _layout_runs() -> dict[str, tuple[tuple[int, ...], ...]]:
    from hurray_interop.conversions import gguf_expanded as G

    q6 = G._bits(256, G._q6k_code)
    q3 = G._bits(256, G._q3k_code)
    return {
        "q6k-codes": (q6.runs, 256, np.uint8, 210),
        "q3k-codes": (q3.runs, 256, np.uint8, 110),
        "q4k-scales": (G._specs()["Q4_K"].sc.runs, 8, np.uint8, 144),
        "f16-d": (G._specs()["Q6_K"].d.runs, 1, np.uint16, 210),
        # hand-made: unaligned lengths (tails), shifts and dsts into uint16 items
        "odd": (((0, 3, 13, 1, 0x7F, 0), (13, 1, 11, 5, 0x7, 9), (0, 20, 5, 0, 0xFF, 8)), 24, np.uint16, 25),
    }


RUN_LAYOUTS = _layout_runs()


@needs_c
@pytest.mark.parametrize("layout", sorted(RUN_LAYOUTS))
@pytest.mark.parametrize(("n", "seed"), [(0, 1), (1, 2), (7, 3), (8193, 4)])
def test_run_movers(layout: str, n: int, seed: int) -> None:
    runs, items, dtype, width = RUN_LAYOUTS[layout]
    for name, blocks in views(n, width, seed):
        c_runs = n > 0 and sum(r[2] for r in runs) >= K._MIN_RUN * len(runs)  # else numpy, by design
        c, m = both(lambda: K.unpack_runs(blocks, runs, items, dtype), {"hk_unpack_runs"} if c_runs else False)
        same(c, m)
        rng = np.random.default_rng(seed)
        base = rng.integers(0, 256, size=(2 * n, width), dtype=np.uint8)
        outs = [base.copy(), base.copy()]
        # a strided output, ORed into (not overwritten)
        both(lambda: K.pack_runs(c, runs, outs.pop()[::2]), {"hk_pack_runs"} if c_runs else False)
        assert not outs
        c_out, m_out = base.copy(), base.copy()
        K.pack_runs(c, runs, c_out[::2])
        with numpy_path():
            K.pack_runs(c, runs, m_out[::2])
        same(c_out, m_out)


@needs_c
@pytest.mark.parametrize("layout", ["q6k-codes", "q3k-codes"])
def test_run_movers_invert_each_other(layout: str) -> None:
    """Code fields cover their bytes' bits once each: packing the unpacked codes into zeroed
    blocks gives back the blocks' code bytes."""
    runs, items, dtype, width = RUN_LAYOUTS[layout]
    blocks = np.random.default_rng(9).integers(0, 256, size=(301, width), dtype=np.uint8)
    out = np.zeros_like(blocks)
    K.pack_runs(K.unpack_runs(blocks, runs, items, dtype), runs, out)
    covered = sorted({r[1] + j for r in runs for j in range(r[2])})
    assert out[:, covered].tobytes() == blocks[:, covered].tobytes()


@needs_c
def test_short_runs_take_the_numpy_path() -> None:
    runs = tuple((i, i, 1, 0, 0xF, 0) for i in range(8))
    blocks = np.random.default_rng(3).integers(0, 256, size=(5, 8), dtype=np.uint8)
    c, m = both(lambda: K.unpack_runs(blocks, runs, 8, np.uint8), expect_c=False)
    same(c, m)
    assert c.tobytes() == (blocks & 0xF).tobytes()


def _strings(items: list[bytes]) -> tuple[bytes, list[int]]:
    """The GGUF encoding of ``items`` (uint64 length, bytes) and the offset of each one's bytes."""
    raw, starts = bytearray(), []
    for s in items:
        raw += len(s).to_bytes(8, "little")
        starts.append(len(raw))
        raw += s
    return bytes(raw), starts


def _awkward(n: int, seed: int) -> list[bytes]:
    """Empty strings, 256+ byte strings, NUL runs that read as length prefixes, plain short ones."""
    rng = np.random.default_rng(seed)
    kinds = [b"", b"\x05" + b"\x00" * 12 + b"x", None, None, None, None]
    items = []
    for i in range(n):
        k = kinds[i % len(kinds)]
        if k is None and i % 97 == 3:
            items.append(bytes(rng.integers(0, 256, int(rng.integers(256, 600)), dtype=np.uint8)))
        else:
            items.append(k if k is not None else bytes(rng.integers(1, 256, int(rng.integers(1, 30)), dtype=np.uint8)))
    return items


@needs_c
@pytest.mark.parametrize("n", [0, 1, 2, 500, 5000])
def test_string_walk(n: int) -> None:
    items = _awkward(n, n)
    raw, starts = _strings(items)
    head = b"\x07" * 13  # the walk starts mid-buffer, and stops at `end` before the tail
    data = head + raw + b"\xff" * 9
    c, m = both(lambda: K.string_starts(data, len(head), n, len(head) + len(raw)), expect_c=n > 0)
    assert c[1] == m[1] == len(head) + len(raw)
    same(c[0], m[0])
    assert c[0].dtype == np.int64 and c[0].tolist() == [len(head) + s for s in starts]


@needs_c
@pytest.mark.parametrize("cut", ["prefix", "bytes", "huge-length", "too-many"])
def test_string_walk_stops_at_the_string_past_the_end(cut: str) -> None:
    """Both paths stop at the first string whose prefix or bytes run past ``end`` and point
    at its length prefix; the strings before it are returned."""
    items = _awkward(300, 1)
    raw, starts = _strings(items)
    data, count, bad = bytearray(raw), len(items), 123
    at = starts[bad] - 8
    if cut == "prefix":  # the file ends 3 bytes into string 123's length prefix
        data = data[: at + 3]
    elif cut == "bytes":
        data[at : at + 8] = (len(data) - at - 7).to_bytes(8, "little")  # one byte too long
    elif cut == "huge-length":
        data[at : at + 8] = (2**64 - 1).to_bytes(8, "little")
    else:  # one more string claimed than present: the walk stops at the end of the data
        count, bad, at = len(items) + 1, len(items), len(data)
    data = bytes(data)
    c, m = both(lambda: K.string_starts(data, 0, count, len(data)))
    same(c[0], m[0])
    assert c[1] == m[1] == at
    assert c[0].tolist() == starts[:bad]


def test_string_walk_rejects_a_start_past_the_end() -> None:
    with pytest.raises(ValueError):
        K.string_starts(b"\x00" * 8, 9, 1, 8)
# ---------------------------------------------------------------------------
# the K-quants' two-level scales (one pass: d·sc, −dmin·m, flags)


def _dsc_layouts() -> dict[str, tuple[dict, int, tuple[int, ...]]]:
    """The fused types' arguments, block bytes and float16 fields (d, dmin)."""
    from hurray_interop.conversions import gguf_expanded as G

    out = {}
    for t in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"):
        spec = G._specs()[t]
        args = G._fused(spec)
        assert args is not None, t
        out[t] = (args, spec.block_bytes, (args["d_off"],) + ((args["dmin_off"],) if "dmin_off" in args else ()))
    # items of three parts each (no K-quant has them): the C code interprets the runs
    # instead of building its per-item tables
    three = ((0, 4, 8, 0, 3, 0), (0, 4, 8, 2, 3, 2), (0, 12, 8, 0, 15, 4))
    out["three-part"] = (dict(out["Q4_K"][0], sc=three, m=three), 144, (0, 2))
    return out


DSC_LAYOUTS = _dsc_layouts()
#: float16 bit patterns the scale fields get besides random ones: ±0, subnormals, the largest, ±inf, NaN
F16_EDGES = np.array([0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x3C00], dtype=np.uint16)


def _dsc_blocks(blocks: np.ndarray, fields: tuple[int, ...], seed: int) -> None:
    """Random blocks with every float16 edge case in the scale fields, every tenth block's
    sub-block scale bytes zeroed (zero sub-block scales over stale codes)."""
    rng = np.random.default_rng(seed)
    n = blocks.shape[0]
    for off in fields:
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
        bits[: min(n, len(F16_EDGES))] = F16_EDGES[: min(n, len(F16_EDGES))]
        blocks[:, off : off + 2] = bits.astype("<u2").view(np.uint8).reshape(n, 2)


def _dsc_oracle(blocks: np.ndarray, args: dict) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """float64 products (exact for these operands) rounded once to float32, and the flags
    from numpy's float16 classification."""
    subs = args["subs"]
    sc = B.unpack_runs(blocks, args["sc"], subs, np.uint8)
    sc = (sc.view(np.int8) if args["sc_signed"] else sc).astype(np.float64) + args["add"]
    d = np.ascontiguousarray(blocks[:, args["d_off"] : args["d_off"] + 2]).view("<f2").astype(np.float64)
    with np.errstate(invalid="ignore"):
        scales = (d * sc).astype(np.float32)
    flags = (scales == 0).any(axis=1) * GK.DSC_ZERO | ~np.isfinite(d[:, 0]) * GK.DSC_BAD_D
    corr = None
    if "dmin_off" in args:
        dm = np.ascontiguousarray(blocks[:, args["dmin_off"] : args["dmin_off"] + 2]).view("<f2").astype(np.float64)
        with np.errstate(invalid="ignore"):
            corr = (-(dm * B.unpack_runs(blocks, args["m"], subs, np.uint8))).astype(np.float32)
        flags = flags | ~np.isfinite(dm[:, 0]) * GK.DSC_BAD_DMIN
    return scales, corr, flags.astype(np.uint8)


def _same_floats(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, but any NaN equals any NaN (NaN d: refused, whatever its payload)."""
    nan = np.isnan(a) & np.isnan(b)
    return bool(np.array_equal(a.view(np.uint32)[~nan], b.view(np.uint32)[~nan]))


@needs_c
@pytest.mark.parametrize("t", sorted(DSC_LAYOUTS))
@pytest.mark.parametrize(("n", "seed"), [(0, 1), (1, 2), (13, 3), (8193, 4)])
def test_dsc_scales(t: str, n: int, seed: int) -> None:
    args, width, fields = DSC_LAYOUTS[t]
    for name, blocks in views(n, width, seed):
        _dsc_blocks(blocks, fields, seed)
        blocks[::10, : fields[0]] = 0  # (most sub-block scale fields lie before d)
        c, m = both(lambda: GK.dsc_scales(blocks, **args), {"hk_dsc_scales"} if n else False)
        same(c[0], m[0]), same(c[2], m[2])
        assert (c[1] is None) == (m[1] is None) == ("dmin_off" not in args)
        if c[1] is not None:
            same(c[1], m[1])
        scales, corr, flags = _dsc_oracle(blocks, args)
        assert _same_floats(c[0], scales) and np.array_equal(c[2], flags), name
        assert corr is None or _same_floats(c[1], corr)
        if n > 10:  # the edge cases are there: ±0 d, a zero sub-block scale, inf and NaN d
            assert {0, GK.DSC_ZERO, GK.DSC_BAD_D} <= set(c[2] & 3)


def test_dsc_scales_outside_the_c_limits_take_the_numpy_path() -> None:
    args, width, _ = DSC_LAYOUTS["Q4_K"]
    blocks = np.random.default_rng(5).integers(0, 256, size=(9, width), dtype=np.uint8)
    wide = dict(args, subs=65)  # more than 64 sub-blocks per block: numpy only
    if K.KERNEL == "c":
        c, m = both(lambda: GK.dsc_scales(blocks, **wide), expect_c=False)
        same(c[0], m[0])
    assert GK.dsc_scales(blocks, **wide)[0][:, :8].tobytes() == GK.dsc_scales(blocks, **args)[0].tobytes()


# ---------------------------------------------------------------------------
# Q6_K's code fields


@needs_c
@pytest.mark.parametrize(("n", "seed"), CASES)
def test_q6k_movers(n: int, seed: int) -> None:
    """C against numpy, and both against the generic run movers of the same fields (the
    layout table of gguf_expanded, itself checked against gguf-py's dequantize)."""
    runs, items, dtype, width = RUN_LAYOUTS["q6k-codes"]
    for name, blocks in views(n, 210, seed):
        c, m = both(lambda: GK.q6k_codes(blocks), {"hk_q6k_codes"} if n else False)
        same(c, m)
        want = (B.unpack_runs(blocks, runs, items, dtype) + np.uint8(0xE0)).view(np.int8)
        assert c.tobytes() == want.tobytes(), name
        codes = c.copy()
        rng = np.random.default_rng(seed)
        if n:  # out-of-range codes: counted per row, their fields still (code + 32) & 63
            rows = rng.integers(0, n, 3)
            codes[rows, rng.integers(0, 256, 3)] = rng.choice(np.array([32, 100, -33, -128], dtype=np.int8), 3)
        base = rng.integers(0, 256, size=(2 * n, 210), dtype=np.uint8)
        c_out, m_out, r_out = base.copy(), base.copy(), base.copy()
        got = both(lambda: GK.q6k_pack(codes, (c_out if K._lib is not None else m_out)[::2]),
                   {"hk_q6k_pack"} if n else False)
        assert got[0] == got[1] == len(np.unique(rows) if n else [])
        same(c_out, m_out)
        B.pack_runs(codes.view(np.uint8) + np.uint8(32), runs, r_out[::2])
        same(c_out, r_out)


def test_q6k_pack_restores_the_code_fields() -> None:
    blocks = np.random.default_rng(8).integers(0, 256, size=(301, 210), dtype=np.uint8)
    out = np.zeros_like(blocks)
    assert GK.q6k_pack(GK.q6k_codes(blocks), out) == 0
    assert out[:, :192].tobytes() == blocks[:, :192].tobytes() and not out[:, 192:].any()


# ---------------------------------------------------------------------------
# the numpy twins against plain per-byte formulas (these run without the C library too)


def _pairs_by_formula(qs: np.ndarray, xor: int) -> np.ndarray:
    a, b = qs[:, 0::2].astype(np.uint16), qs[:, 1::2].astype(np.uint16)
    low, high = (a & 15) | ((b & 15) << 4), (a >> 4) | (b & 0xF0)
    return (np.concatenate([low, high], axis=1) ^ xor).astype(np.uint8)


@pytest.mark.parametrize("step", [1000, K._STEP])
@pytest.mark.parametrize("w", [8, 16, 24, 32, 48])
@pytest.mark.parametrize("n", [0, 1, 3, 8191, 8193, 16385])
def test_numpy_split_to_pairs_against_the_formula(w: int, n: int, step: int, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every output layout the twin stores whole words into, or not: a fresh array, a
    field inside longer rows (unaligned words), reversed rows, column-major rows; in one
    step and in many (the last one short)."""
    monkeypatch.setattr(K, "_STEP", step)
    rng = np.random.default_rng(w * 1000 + n)
    raw = rng.integers(0, 256, size=(n, w + 6), dtype=np.uint8)
    qs = raw[:, 3 : 3 + w]
    for xor in (0, 0x88):
        want = _pairs_by_formula(qs, xor)
        assert np.array_equal(B.split_to_pairs(qs, xor), want)
        for out in (np.full((n, w + 5), 7, np.uint8)[:, 2 : 2 + w],
                    np.full((2 * n, w), 7, np.uint8)[::-2],
                    np.asfortranarray(np.full((n, w), 7, np.uint8))):
            got = B.split_to_pairs(qs, xor, out)
            assert got is out and np.array_equal(out, want)
        back = B.pairs_to_split(want ^ xor)  # the inverse, into every layout too
        assert np.array_equal(back, qs)
        for out in (np.full((n, w + 5), 7, np.uint8)[:, 1 : 1 + w],
                    np.full((2 * n, w), 7, np.uint8)[::-2],
                    np.asfortranarray(np.full((n, w), 7, np.uint8))):
            assert B.pairs_to_split(np.ascontiguousarray(want[::-1] ^ xor), out) is out
            assert np.array_equal(out, qs[::-1])
    if n:
        assert np.array_equal(B.split_to_pairs(qs[::-1], 0), _pairs_by_formula(qs[::-1], 0))
        assert np.array_equal(B.pairs_to_split(_pairs_by_formula(qs, 0)[::-1]), qs[::-1])


def test_copy_rows_takes_words_only_where_they_fit() -> None:
    """Aligned word columns, unaligned rows, dtypes other than bytes, few rows: same bytes."""
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, size=(300, 40), dtype=np.uint8)
    for lo, hi in ((0, 16), (2, 18), (1, 17), (4, 12), (8, 40), (3, 5), (0, 2)):
        for rows in (raw, raw[::3], raw[::-1], raw[:5]):
            dst = np.zeros((len(rows), 41), np.uint8)
            K._copy_rows(dst[:, lo + 1 : hi + 1], rows[:, lo:hi])
            assert np.array_equal(dst[:, lo + 1 : hi + 1], rows[:, lo:hi])
            assert not dst[:, : lo + 1].any() and not dst[:, hi + 1 :].any()
    signed = raw.view(np.int8)
    dst = np.zeros((300, 16), np.int8)
    K._copy_rows(dst, signed[:, 2:18])
    assert np.array_equal(dst, signed[:, 2:18])


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_numpy_field_u8_against_slicing(size: int) -> None:
    rng = np.random.default_rng(size)
    raw = rng.integers(0, 256, size=(2 * 777, 18), dtype=np.uint8)
    for blocks in (raw[:777], raw[::2], raw[::-1], np.asfortranarray(raw)):
        for offset in (0, 1, 18 - size):
            want = blocks[:, offset : offset + size].copy()
            assert np.array_equal(B.field_u8(blocks, offset, size), want)
            out = np.zeros((len(blocks) + 1, size + 1), np.uint8)[1:, 1:]
            assert B.field_u8(blocks, offset, size, out) is out and np.array_equal(out, want)
    f16 = B.field_f16(raw, 5)
    assert f16.dtype == np.dtype("<f2") and f16.tobytes() == raw[:, 5:7].tobytes()  # NaNs included


def test_scale_class_against_the_definition() -> None:
    """Each float16 class boundary (±0, subnormals, the largest finite, ±inf, NaNs) and E8M0's
    0x00 and 0xFF, on both paths."""
    u = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
                  0x7C01, 0x7E00, 0xFFFF, 0x3C00], dtype="<u2")
    blocks = np.zeros((len(u), 5), np.uint8)
    blocks[:, 1:3] = u.view(np.uint8).reshape(-1, 2)
    blocks[:, 4] = [0, 0xFF, 1, 0x7F, 0xFE, 0, 0xFF, 3, 0, 0, 0xFF, 0xFF, 0, 9]
    v = u.view("<f2")
    want_f16 = np.where(~np.isfinite(v), K.SCALE_BAD, np.where(v == 0, K.SCALE_ZERO, K.SCALE_OK))
    e = blocks[:, 4]
    want_e8 = np.where(e == 0xFF, K.SCALE_BAD, np.where(e == 0, K.SCALE_ZERO, K.SCALE_OK))
    for path in (contextlib.nullcontext, numpy_path):
        with path():
            assert K.scale_class(blocks, 1, "f16").tolist() == want_f16.tolist()
            assert K.scale_class(blocks, 4, "e8m0").tolist() == want_e8.tolist()
            assert K.scale_class(blocks[::-1], 1, "f16").tolist() == want_f16[::-1].tolist()


def _q5k_planes(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Random Q5_K blocks, their codes (ggml's fields) and the planes of those codes
    (gguf_compact.split_planes): the oracle of the plane movers."""
    from hurray_interop.conversions import gguf_compact, gguf_expanded as X

    spec = X._specs()["Q5_K"]
    blocks = np.random.default_rng(n).integers(0, 256, (n, spec.block_bytes), dtype=np.uint8)
    codes = spec.codec.decode(blocks).astype(np.uint8)
    lo, hi = gguf_compact.split_planes(codes)
    return blocks, codes, lo.reshape(n, 128), hi.reshape(n, 64), spec.struct.at("qh")


@pytest.mark.parametrize("n", [0, 1, 7, 300])
def test_q5k_plane_movers_give_the_planes_of_the_codes(n: int) -> None:
    """Q5_K's high-bit plane and the codes joined from the two planes (the compact form,
    docs/conversion-rules.md § 11), on whichever path is loaded, against the planes of the
    codes ggml's fields give; hi codes 3 join as 48..63 (out of range: rebuild says so)."""
    blocks, codes, lo, hi, qh = _q5k_planes(n)
    assert np.array_equal(GK.q5k_plane(blocks, qh), hi)
    assert np.array_equal(GK.q5k_join(lo, hi), codes)
    strided = np.zeros((n, 256), np.uint8)[:, ::2]  # a strided source: the numpy twin
    strided[:] = lo
    assert np.array_equal(GK.q5k_join(strided, hi), codes)
    assert (GK.q5k_join(lo, np.full((n, 64), 0xFF, np.uint8)) >> 4 == 3).all()


@needs_c
@pytest.mark.parametrize("n", [0, 1, 7, 300])
def test_q5k_plane_movers_c_and_numpy_give_the_same_bytes(n: int) -> None:
    blocks, codes, lo, hi, qh = _q5k_planes(n)
    same(*both(lambda: GK.q5k_plane(blocks, qh), {"hk_q5_k_plane"} if n else False))
    same(*both(lambda: GK.q5k_join(lo, hi), {"hk_q5_k_join"} if n else False))
    out = np.zeros((n, 256), np.uint8)
    same(*both(lambda: GK.q5k_join(lo, hi, out=out).copy(), {"hk_q5_k_join"} if n else False))
    bad = np.full((n, 64), 0xFF, np.uint8)
    same(*both(lambda: GK.q5k_join(lo, bad), {"hk_q5_k_join"} if n else False))


# ---------------------------------------------------------------------------
# first_diff_f32: verify's per-window comparison


@needs_c
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 16, 17, 1000])
@pytest.mark.parametrize("zero_equal", [False, True])
def test_first_diff_f32_c_and_numpy_agree_at_every_position(n: int, zero_equal: bool) -> None:
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    assert K.first_diff_f32(a, a.copy(), zero_equal) == K.numpy_first_diff_f32(a, a.copy(), zero_equal) == -1
    for at in sorted({0, n // 2, max(n - 1, 0)}) if n else []:
        for change in ("bit", "sign_of_zero", "nan_payload"):
            x, y = a.copy(), a.copy()
            if change == "bit":
                y.view(np.uint32)[at] ^= 1
            elif change == "sign_of_zero":
                x[at], y[at] = 0.0, -0.0
            else:
                x.view(np.uint32)[at], y.view(np.uint32)[at] = 0x7FC00000, 0x7FC00001
            want = -1 if (change == "sign_of_zero" and zero_equal) else at
            with numpy_path():
                assert K.first_diff_f32(x, y, zero_equal) == want
            assert K.first_diff_f32(x, y, zero_equal) == want
            assert K.numpy_first_diff_f32(x, y, zero_equal) == want


def test_first_diff_f32_refuses_mismatched_arrays() -> None:
    with pytest.raises(ValueError):
        K.first_diff_f32(np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError):
        K.first_diff_f32(np.zeros(3, np.float64), np.zeros(3, np.float64))
    strided = np.zeros(8, np.float32)[::2]
    assert K.first_diff_f32(strided, np.zeros(4, np.float32)) == -1  # the numpy path takes it


# ---------------------------------------------------------------------------
# first_bad_scale: the descriptor rules' scale check


@needs_c
@pytest.mark.parametrize("kind", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 1000])
def test_first_bad_scale_c_and_numpy_agree_at_every_position(kind: str, n: int) -> None:
    dt = {"float16": np.float16, "float32": np.float32}.get(kind)
    rng = np.random.default_rng(n)
    good = rng.uniform(0.5, 2, n).astype(np.float32)
    if kind == "bfloat16":
        bits = (good.view(np.uint32) >> 16).astype(np.uint16)
        specials = {"+0": 0x0000, "-0": 0x8000, "inf": 0x7F80, "-inf": 0xFF80, "nan": 0x7FC1, "tiny": 0x0001}
    else:
        bits = good.astype(dt).view(np.uint16 if kind == "float16" else np.uint32)
        specials = ({"+0": 0x0000, "-0": 0x8000, "inf": 0x7C00, "-inf": 0xFC00, "nan": 0x7E01, "tiny": 0x0001}
                    if kind == "float16" else
                    {"+0": 0, "-0": 0x80000000, "inf": 0x7F800000, "-inf": 0xFF800000, "nan": 0x7FC00001, "tiny": 1})
    assert K.first_bad_scale(bits, kind) == K.numpy_first_bad_scale(bits, kind) == -1
    for at in sorted({0, n // 2, n - 1}) if n else []:
        for name, value in specials.items():
            b = bits.copy()
            b[at] = value
            want = -1 if name == "tiny" else at  # a subnormal is finite and non-zero
            assert K.first_bad_scale(b, kind) == want, (name, at)
            assert K.numpy_first_bad_scale(b, kind) == want, (name, at)
            with numpy_path():
                assert K.first_bad_scale(b, kind) == want


# ---------------------------------------------------------------------------
# first_diff_bytes: verify's byte comparisons (memcmp in C)


@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5])
def test_first_diff_bytes_c_and_numpy_agree_at_every_edge(n: int) -> None:
    rng = np.random.default_rng(n)
    a = rng.integers(0, 256, n, dtype=np.uint8)
    assert K.first_diff_bytes(a, a.copy()) == K.numpy_first_diff_bytes(a, a.copy()) == -1
    for at in {0, 4095, 4096, 4097, n // 2, n - 1} - {-1}:
        if not 0 <= at < n:
            continue
        b = a.copy()
        b[at] ^= 0x80
        b[min(at + 1, n - 1):] ^= 0x01 if at + 1 < n else 0  # later differences never win
        assert K.first_diff_bytes(a, b) == at, at
        assert K.numpy_first_diff_bytes(a, b) == at, at


def test_first_diff_bytes_takes_any_arrays_through_numpy() -> None:
    a = np.arange(20, dtype=np.uint8)
    b = a.copy()
    b[13] = 0
    assert K.first_diff_bytes(a[::2], b[::2]) == -1  # strided: numpy's answer (13 is odd)
    assert K.first_diff_bytes(a[1::2], b[1::2]) == 6
    assert K.first_diff_bytes(a.astype(np.int32), b.astype(np.int32)) == 13
    with numpy_path():
        assert K.first_diff_bytes(a, b) == 13
