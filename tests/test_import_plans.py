"""The import's typed plans (conversions/gguf_pass.py): planners write nothing, chunk
functions are pure, one executor carries plans out (and is the only place that takes
bytes back), the proof d·(q − z) ≡ d·q + m is stated once."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from test_onepass import _write  # a GGUF of raw blocks, written by gguf-py

import hurray_interop.conversions.gguf as cg
from hurray_interop.conversions import gguf_pass as P
from hurray_interop.conversions import gguf_codec as GC
from hurray_interop.conversions.gguf_codec import codec
from hurray_interop.core.hrry import HrryWriter, open_hrry
from hurray_interop.core.elements import element_type
from hurray_interop.core.model import BufferHandle, Descriptor
from hurray_interop.formats.gguf import read_gguf

CONVERSIONS = Path(cg.__file__).parent
BLOCK = {Q.Q4_0: 18, Q.Q4_1: 20, Q.Q8_0: 34, Q.MXFP4: 17, Q.Q4_K: 144}


def _blocks(qt: Q, n: int, seed: int) -> np.ndarray:
    """``n`` random GGML blocks of ``qt`` with ordinary scales (f16 in [0.5, 2), E8M0 near 1);
    block 1 (scale 0, codes 0) takes a substitution."""
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(n, BLOCK[qt]), dtype=np.uint8)
    if qt == Q.MXFP4:
        b[:, 0] = rng.integers(120, 135, size=n)
    else:
        b[:, 0:2] = rng.uniform(0.5, 2.0, size=n).astype("<f2").view(np.uint8).reshape(n, 2)
        if qt in (Q.Q4_1, Q.Q4_K):  # m (Q4_1) or dmin (Q4_K)
            b[:, 2:4] = rng.uniform(0.5, 2.0, size=n).astype("<f2").view(np.uint8).reshape(n, 2)
    if qt in (Q.Q4_0, Q.Q8_0):
        b[1] = 0x88 if qt == Q.Q4_0 else 0  # codes 0 (Q4_0: nibble 8 is 0)
        b[1, 0:2] = 0
    return b


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return _write(tmp_path / "m.gguf", {
        "a": (_blocks(Q.Q4_0, 96, 1), Q.Q4_0),
        "b": (_blocks(Q.Q4_1, 64, 2), Q.Q4_1),  # random minimums: the overlay
        "c": (_blocks(Q.MXFP4, 64, 3), Q.MXFP4),
        "d": (_blocks(Q.Q8_0, 40, 4), Q.Q8_0),
        "e": (np.arange(64, dtype=np.float32).reshape(2, 32), Q.F32),
    })


def test_planners_write_nothing_and_their_chunk_functions_are_pure(model: Path) -> None:
    """Every mapping kind's planner returns a plan; its chunk function leaves the source rows
    as they were, gives the same buffers twice, one per slot of the slot's size, and keeps
    what the dry run's scan keeps."""
    with read_gguf(model) as f:
        for info in f.tensors:
            c = codec(info.ggml_type.name)
            assert c is not None
            plan = cg._PLANNERS[c.mapping](info, c, "overlay").plan
            assert isinstance(plan, P.Plan) and plan.names[0] == info.name
            if plan.chunk is None:  # a plain tensor: copied whole
                assert plan.copy is not None and plan.copy[0].nbytes == info.nbytes
                continue
            before = plan.rows.copy()
            one, two = plan.chunk(plan.rows, 0), plan.chunk(plan.rows, 0)
            assert np.array_equal(plan.rows, before), info.name
            assert one.buffers.keys() == plan.slots.keys()
            for k, s in plan.slots.items():
                got = np.frombuffer(memoryview(one.buffers[k]).cast("B"), np.uint8).copy()
                assert got.nbytes == plan.rows.shape[0] * s.row_bytes == plan.entries[s.entry].desc.buffers[s.buffer].byte_size
                assert np.array_equal(got, np.frombuffer(memoryview(two.buffers[k]).cast("B"), np.uint8)), (info.name, k)
            assert plan.scan is not None
            scanned = plan.scan(plan.rows, 0).keep
            assert [np.asarray(x).tolist() for x in scanned] == [np.asarray(x).tolist() for x in one.keep], info.name
            if info.name in ("a", "d"):
                assert one.keep[0].tolist() == [1]  # block 1: substituted


def _functions(path: Path) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)]


def test_no_planner_takes_an_output_and_only_the_executor_rewinds() -> None:
    """No function of the import's planning takes an output (or a writer), none branches
    on ``out is None``; ``mark()``/``rewind()`` are called in the executor only."""
    for module in ("gguf.py", "gguf_exact.py"):
        for fn in _functions(CONVERSIONS / module):
            args = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
            if fn.name.lstrip("_").startswith("plan"):
                assert not args & {"out", "to", "w", "offs"}, (module, fn.name, args)
            if fn.name != "dequantize_gguf":  # its ``out`` is the caller's array
                outputs = args & {"out", "to", "w", "offs", "output", "writer", "dst_writer"}
                for node in ast.walk(fn):  # ``x is None`` / ``x is not None`` of an output argument
                    if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id in outputs
                            and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)):
                        raise AssertionError(f"{module}: {fn.name} branches on whether there is an output")
    for path in CONVERSIONS.glob("*.py"):
        calls = {n.func.attr for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        if path.name != "gguf_pass.py":
            assert not calls & {"mark", "rewind"}, path.name


# d (float32 bits), z: blocks whose first code q with d·(q − z) ≠ d·q + m (m = f32(−z·d)) is 14, 15, 16
FIRST_MISS = {14: (1067785010, -24), 15: (1066158232, 88), 16: (1075146775, 67)}


@pytest.mark.parametrize("first", sorted(FIRST_MISS))
def test_the_proof_counts_codes_up_to_the_codec_limit(first: int) -> None:
    """Q4_1's codes end at 15: a block that fails the proof only at code 16 (limit + 1) is
    exact, at 15 (the limit) or 14 (limit − 1) it is not."""
    qmax = codec("Q4_1").code_range()[1]
    assert qmax == 15
    bits, z = FIRST_MISS[first]
    d = np.array([bits], np.uint32).view(np.float32)
    zz = np.array([z], np.int32)
    m = np.float32(0) - zz.astype(np.float32) * d
    assert not GC.zero_point_misses(d, zz, m, first - 1).any()  # the search that found the rows holds
    assert bool(GC.zero_point_misses(d, zz, m, qmax)[0]) == (first <= qmax)


def test_the_import_asks_the_one_statement_of_the_proof(monkeypatch: pytest.MonkeyPatch) -> None:
    d = np.array([0.5, 1.0], np.float16)
    m = np.array([-1.0, -3.0], np.float16)  # z = 2, 3: exact
    assert cg._minimum_check(d, m, 15).tolist() == [2, 3]
    monkeypatch.setattr(cg, "zero_point_misses", lambda d32, z, m32, qmax: np.ones(d32.shape, bool))
    assert cg._minimum_check(d, m, 15) is None


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_the_executor_refuses_a_buffer_of_the_wrong_size(tmp_path: Path, delta: int) -> None:
    """A chunk function's buffer must be exactly its rows × the slot's bytes per row (one
    less or one more is a planner's bug, raised before anything lands)."""
    rows = np.zeros((4, 8), np.uint8)
    desc = Descriptor(element_type=element_type("uint8"), shape=(32,), buffers=(BufferHandle.cpu(32),))

    def chunk(r: np.ndarray, start: int) -> P.Piece:
        return P.Piece(start, {"v": np.full(r.size + delta, 7, np.uint8)})

    plan = P.Plan((P.Entry("t", desc),), rows, 2, {"v": P.Slot(0, 0, 8)}, chunk)
    dst = tmp_path / "t.hrry"
    if delta:
        with pytest.raises(AssertionError, match="bytes for 2 rows of 8"), HrryWriter(dst) as w:
            P.Output(w, w.positional()).execute(plan)
        assert not dst.exists()
        return
    with HrryWriter(dst) as w:
        assert P.Output(w, w.positional()).execute(plan).keeps == [0, 2]
        w.finish()
    with open_hrry(dst) as h:
        assert bytes(h["t"].data[0]) == b"\x07" * 32


def test_fallback_chunks_on_the_workers_write_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--fallback float16`` in many small work items on two threads: the bytes and the
    max abs error of one item on one thread."""
    src = _write(tmp_path / "k.gguf", {"k": (_blocks(Q.Q4_K, 48, 5), Q.Q4_K)})
    one = cg.gguf_to_hurray(src, tmp_path / "one.hrry", fallback="float16", jobs=1)
    monkeypatch.setattr(cg, "FALLBACK_VALUES", 256)  # one row of 256 values a work item
    many = cg.gguf_to_hurray(src, tmp_path / "many.hrry", fallback="float16", jobs=2)
    assert (tmp_path / "one.hrry").read_bytes() == (tmp_path / "many.hrry").read_bytes()
    assert many.tensors[0].max_abs_error == one.tensors[0].max_abs_error > 0
    dry = cg.plan_gguf(src, fallback="float16")
    assert dry.tensors[0].max_abs_error == one.tensors[0].max_abs_error
