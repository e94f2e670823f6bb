"""The export's typed plan (Hurray → GGUF): one block-source protocol, refusals raised as
:class:`~hurray_interop.conversions.gguf_pass.Refuse`, the records as
:class:`~hurray_interop.formats.gguf_split.TensorRow`, and one executor writing the blocks
where they belong (per shard: one positional writer, handed over explicitly).

The bytes these pieces write are proven elsewhere against gguf-py and the source files
(tests/test_export_gguf.py, tests/test_split_convert.py); here: their shape and contracts."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from test_export_gguf import build_exportable, build_refusable

from hurray_interop.conversions import gguf as C
from hurray_interop.conversions import gguf_pass as P
from hurray_interop.conversions.gguf_sources import BlockSource, ChunkedBlocks, Target
from hurray_interop.core.hrry import HrryFile
from hurray_interop.errors import UsageError
from hurray_interop.files.atomic import AtomicOutput
from hurray_interop.files.positional import PositionalWriter
from hurray_interop.formats import gguf_split as S


def test_every_exportable_tensor_matches_to_a_typed_block_source(tmp_path: Path) -> None:
    src = tmp_path / "e.hrry"
    expect = build_exportable(src)
    with HrryFile(src) as hf:
        kv = dict(hf.kv)
        for name, gtype in expect.items():
            m = C._export_match(hf.tensor(name), kv, None)
            assert m.type_name == gtype, name
            assert isinstance(m.source, BlockSource), (name, type(m.source))


def test_every_refusal_is_raised_with_its_reason(tmp_path: Path) -> None:
    src = tmp_path / "r.hrry"
    expect = build_refusable(src)
    with HrryFile(src) as hf:
        kv = dict(hf.kv)
        for name, pattern in expect.items():
            with pytest.raises(P.Refuse) as ei:
                C._export_match(hf.tensor(name), kv, None)
            assert pattern in ei.value.reason, (name, ei.value.reason)
        assert isinstance(C._export_match(hf.tensor("ok"), kv, None).source, BlockSource)


def test_expanded_tensors_rebuild_through_the_one_executor(fixtures_dir: Path, tmp_path: Path) -> None:
    """--fallback exact: the rebuilt K-quant blocks are a ChunkedBlocks like the joined ones."""
    mid = tmp_path / "kq.hrry"
    C.gguf_to_hurray(fixtures_dir / "tiny-llama-kquant.gguf", mid, fallback="exact")
    with HrryFile(mid) as hf:
        kv = dict(hf.kv)
        records = C._records(kv, str(mid))
        assert records is not None
        expanded = [r for r in records.tensors if r.type.endswith("_K")]
        assert expanded
        for r in expanded:
            m = C._export_match(hf.tensor(r.name), kv, r.type)
            assert m.type_name == r.type and isinstance(m.source, ChunkedBlocks), r


def test_records_are_tensor_rows(fixtures_dir: Path, tmp_path: Path) -> None:
    mid = tmp_path / "tl.hrry"
    C.gguf_to_hurray(fixtures_dir / "tiny-llama.gguf", mid)
    with HrryFile(mid) as hf:
        records = C._records(dict(hf.kv), str(mid))
    assert records is not None and records.tensors
    assert all(isinstance(r, S.TensorRow) for r in records.tensors)
    assert all(r.nbytes > 0 and r.offset % records.alignment == 0 for r in records.tensors)


class _Counting(ChunkedBlocks):
    """Block ``i`` is ``block_bytes`` bytes of ``i % 251``; the chunks it was asked for are kept."""

    def __init__(self, n: int, block_bytes: int, step: int) -> None:
        super().__init__(n, block_bytes, step)
        self.asked: list[tuple[int, int]] = []

    def chunk_function(self):
        def chunk(sl: slice) -> np.ndarray:
            self.asked.append((sl.start, sl.stop))
            rows = np.arange(sl.start, sl.stop, dtype=np.int64) % 251
            return np.repeat(rows.astype(np.uint8)[:, None], self.block_bytes, axis=1)

        return chunk


@pytest.mark.parametrize("n", [0, 1, 6, 7, 8])  # the chunk step is 7: one chunk below, at and above it
def test_chunked_blocks_land_at_their_offsets(tmp_path: Path, n: int) -> None:
    src = _Counting(n, 3, 7)
    dest = tmp_path / "out.bin"
    with AtomicOutput(dest) as fh:
        fh.write(b"H" * 5)
        src.write(Target(PositionalWriter(fh, None)), 5)
        fh.commit()
    want = b"H" * 5 + b"".join(bytes([i % 251]) * 3 for i in range(n))
    assert dest.read_bytes() == want
    assert sorted(src.asked) == [(a, min(a + 7, n)) for a in range(0, n, 7)]


def test_write_set_hands_each_shard_one_positional_writer(fixtures_dir: Path, tmp_path: Path) -> None:
    first = fixtures_dir / "tiny-split-00001-of-00003.gguf"
    s = S.open_split_set(first)
    assert s is not None
    seen: dict[str, PositionalWriter] = {}
    with s:
        by_name = {}
        for shard in s.shards:
            for info in shard.tensors:
                by_name[info.name] = info

        def write_at(name: str, pw: PositionalWriter, offset: int) -> None:
            seen[name] = pw
            pw.pwrite(np.asarray(by_name[name].data).reshape(-1).view(np.uint8), offset)

        paths = S.write_set(tmp_path / "tiny-split.gguf", s.layout(), s.model_kv(), write_at=write_at)
        names = [[r.name for r in sh.tensors] for sh in s.split_layout().shards]
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in sorted(fixtures_dir.glob("tiny-split-0000*"))]
    writers = [{id(seen[n]) for n in shard} for shard in names if shard]
    assert all(len(w) == 1 for w in writers)  # one writer per shard file ...
    assert len(set().union(*writers)) == len(writers)  # ... and its own


def test_write_shard_takes_exactly_one_way_to_the_bytes(fixtures_dir: Path, tmp_path: Path) -> None:
    s = S.open_split_set(fixtures_dir / "tiny-split-00001-of-00003.gguf")
    assert s is not None
    with s:
        shard = s.split_layout().shards[0]
        kv = s.model_kv()
        ways = [dict(), dict(data_for=s.tensor_data, write_at=lambda *a: None)]
        for kw in ways:
            with pytest.raises(UsageError, match="takes data_for, or write_at"):
                S.write_shard(io.BytesIO(), shard, kv, **kw)
        with pytest.raises(UsageError, match="write_at with an open output file"):
            S.write_shard(tmp_path / "x.gguf", shard, kv, write_at=lambda *a: None)
    assert not (tmp_path / "x.gguf").exists()


def _calls(path: Path, after: str | None = None, only: set[str] | None = None) -> list[tuple[str, int]]:
    """``(callee, line)`` of every call of ``getattr``/``hasattr``/``id`` in the functions of
    ``path`` defined after the class ``after`` (or named in ``only``)."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    start = next((n.lineno for n in tree.body if isinstance(n, ast.ClassDef) and n.name == after), 0)
    found = []
    for fn in tree.body:
        if not isinstance(fn, (ast.FunctionDef, ast.ClassDef)) or fn.lineno < start:
            continue
        if only is not None and fn.name not in only:
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"getattr", "hasattr", "id"}:
                found.append((node.func.id, node.lineno))
    return found


def test_the_export_asks_no_object_what_it_has() -> None:
    """Sources are typed (no ``getattr``/``hasattr`` duck typing) and nothing is keyed by ``id()``:
    the export half of conversions/gguf.py, its sources, and gguf_split's set writer."""
    pkg = Path(C.__file__).resolve().parents[1]
    assert _calls(pkg / "conversions" / "gguf.py", after="_Export") == []
    assert _calls(pkg / "conversions" / "gguf_sources.py") == []
    assert _calls(pkg / "formats" / "gguf_split.py", only={"write_shard", "write_set"}) == []


def test_a_refused_destination_leaves_no_open_descriptor(fixtures_dir: Path, tmp_path: Path) -> None:
    """The source's descriptor (kernel copies) is closed when the output cannot be opened
    (the destination exists, no --force): Nth refusal, no more descriptors than before."""
    import os

    from hurray_interop.errors import HurrayInteropError

    hrry = tmp_path / "t.hrry"
    C.gguf_to_hurray(fixtures_dir / "tiny-llama.gguf", hrry)
    dst = tmp_path / "exists.gguf"
    dst.write_bytes(b"keep")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(HurrayInteropError):
            C.hurray_to_gguf(hrry, dst)
    assert len(os.listdir("/proc/self/fd")) == before
    assert dst.read_bytes() == b"keep"
