"""Zero-stride (broadcast) members and negative strides: what the compact exact forms of
docs/conversion-rules.md § 11 rest on (hurray-spec/layouts/strided.md: a zero stride is a
broadcast dimension whose data is not replicated; a conforming reader MUST support zero and
negative strides).

A per-block affine tensor whose strides are all 0 stores one code and still has one scale per
block (the block index comes from the logical position).  Our dequantizer is checked against
an independent numpy decoder (``as_strided`` over the stored bytes, the scales repeated per
block), and pyhurray 0.1.0 is shown to read such a file through its strides.  The three
pyhurray 0.1.0 bugs met on the way (docs/format-notes.md § 2.10) are pinned here, so that a
pyhurray that fixes them is noticed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hurray_interop.core.descriptor import validate_descriptor
from hurray_interop.core.elements import element_type
from hurray_interop.core.hrry import HrryFile, HrryWriter
from hurray_interop.core.model import (
    OP_ADD,
    OP_NONE,
    ROLE_BASE,
    ROLE_CORRECTION,
    RULE_OVERLAY,
    RULE_PARTITION,
    BufferHandle,
    CompositeHead,
    CompositeMember,
    Descriptor,
    PerBlockAffine,
    Shard,
    Strided,
    Tensor,
)
from hurray_interop.dequant import dequantize
from hurray_interop.errors import TruncatedError

ROWS, COLS, K = 4, 64, 32


def _scales(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(ROWS * COLS // K).astype(np.float32)


def _broadcast(code_bytes: int) -> Descriptor:
    q = PerBlockAffine(axis=1, block_size=K, scale_buffer_index=1, scale_type=element_type("float32"))
    return Descriptor(element_type("uint8"), (ROWS, COLS), (BufferHandle(code_bytes), BufferHandle(ROWS * COLS // K * 4)),
                      layout=Strided((0, 0)), quantization=q)


def _independent(codes: np.ndarray, strides: tuple[int, ...], shape: tuple[int, ...], scales: np.ndarray) -> np.ndarray:
    """Not our dequantizer: numpy's own strided view of the stored codes (element strides in
    bytes for uint8), times each block's scale."""
    q = np.lib.stride_tricks.as_strided(codes, shape=shape, strides=strides, writeable=False)
    return q.astype(np.float32) * np.repeat(scales.reshape(shape[0], -1), K, axis=1)


def _write(path: Path, name: str, desc: Descriptor, buffers: list[np.ndarray]) -> Path:
    with HrryWriter(path) as w:
        w.write(name, desc, buffers)
        w.finish({})
    return path


def test_a_broadcast_member_has_one_code_and_a_scale_per_block(tmp_path: Path) -> None:
    scales = _scales()
    code = np.array([1], np.uint8)
    path = _write(tmp_path / "b.hrry", "m", _broadcast(1), [code, scales.view(np.uint8)])
    with HrryFile(path) as f:
        ours = dequantize(f.tensor("m"))
        assert f.descriptor("m").buffers[0].byte_size == 1  # not replicated
    want = _independent(code, (0, 0), (ROWS, COLS), scales)
    assert np.array_equal(ours.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(want[:, :K], np.repeat(scales.reshape(ROWS, -1)[:, :1], K, axis=1))


@pytest.mark.parametrize("code_bytes, ok", [(0, False), (1, True), (2, True)])
def test_a_broadcast_member_needs_its_one_code(code_bytes: int, ok: bool) -> None:
    """The addressed range of all-zero strides is one element: 0 bytes is short (refused when
    the values are computed, as for any strided tensor), 1 is enough, more is allowed (strided
    buffers may hold bytes no element addresses)."""
    desc = _broadcast(code_bytes)
    scales = _scales(1)
    t = Tensor("m", desc, (np.ones(code_bytes, np.uint8), scales.view(np.uint8)))
    validate_descriptor(desc)  # the structure is fine; the addressed range is the dequantizer's check
    if not ok:
        with pytest.raises(TruncatedError, match="the layout addresses bytes up to 1, buffer 0 holds 0"):
            dequantize(t)
        return
    want = _independent(np.ones(1, np.uint8), (0, 0), (ROWS, COLS), scales)
    assert np.array_equal(dequantize(t).view(np.uint32), want.view(np.uint32))


def test_pyhurray_reads_a_broadcast_member_through_its_strides(tmp_path: Path) -> None:
    hurray = pytest.importorskip("hurray")
    scales = _scales(2)
    path = _write(tmp_path / "b.hrry", "m", _broadcast(1), [np.array([1], np.uint8), scales.view(np.uint8)])
    theirs = hurray.load(str(path))["m"]
    assert tuple(theirs.layout.strides) == (0, 0) and theirs.buffer_handles[0].byte_size == 1
    codes = np.asarray(theirs)  # pyhurray gives the stored codes (it does not dequantize)
    assert codes.shape == (ROWS, COLS) and codes.strides == (0, 0) and (codes == 1).all()


def test_pyhurray_constructor_sizes_buffers_without_strides() -> None:
    """pyhurray 0.1.0 bug: ``hurray.Tensor(...)`` wants element count × element size bytes
    even for a zero-stride layout, so compact members are built with our writer."""
    hurray = pytest.importorskip("hurray")
    with pytest.raises(hurray.BufferError, match="need at least 256 bytes for 256 elements of uint8, got 1"):
        hurray.Tensor(bytes([1]), hurray.uint8, [ROWS, COLS], layout=hurray.StridedLayout([0, 0]))


def test_negative_strides_from_a_byte_offset(tmp_path: Path) -> None:
    """Rows stored last to first (strides [-8, 1] from byte_offset 24): ours reads the rows
    numpy reads; pyhurray 0.1.0 ignores the byte offset with negative strides (bug) and its
    first column is not the stored one."""
    buf = np.arange(32, dtype=np.uint8)
    desc = Descriptor(element_type("uint8"), (4, 8), (BufferHandle(32),), layout=Strided((-8, 1)), byte_offset=24)
    path = _write(tmp_path / "n.hrry", "n", desc, [buf])
    want = np.lib.stride_tricks.as_strided(buf[24:], shape=(4, 8), strides=(-8, 1), writeable=False)
    assert want[:, 0].tolist() == [24, 16, 8, 0]
    with HrryFile(path) as f:
        assert np.array_equal(dequantize(f.tensor("n")), want.astype(np.float32))
    hurray = pytest.importorskip("hurray")
    theirs = np.asarray(hurray.load(str(path))["n"])
    assert theirs.shape == (4, 8) and theirs[:, 0].tolist() != want[:, 0].tolist()


def _f32_member(name: str, values: np.ndarray, parent: tuple[int, ...], offset: tuple[int, ...],
                role: int | None = None) -> tuple[str, Descriptor, list[np.ndarray]]:
    v = np.ascontiguousarray(values, np.float32)
    desc = Descriptor(element_type("float32"), v.shape, (BufferHandle.cpu(v.nbytes),),
                      shard=Shard(parent_shape=parent, offset=offset),
                      composite_member=None if role is None else CompositeMember(role))
    return name, desc, [v.view(np.uint8).reshape(-1)]


def test_pyhurray_cannot_construct_a_nested_composite_it_loads(tmp_path: Path) -> None:
    """pyhurray 0.1.0 bug: a partition of (a plain tensor, an add-overlay) -- the row-range
    construction of the compact forms -- written by our writer loads in pyhurray (the nested
    overlay's shard on its ``descriptor``) and re-saves to the same values, but its
    ``Composite(...)`` constructor takes no shard, so the nested overlay it builds cannot be a
    partition member."""
    hurray = pytest.importorskip("hurray")
    parent, rows = (4, 8), (2, 8)
    top = np.arange(16, dtype=np.float32).reshape(rows)
    base, corr = np.full(rows, 1.5, np.float32), np.full(rows, -0.25, np.float32)
    head = Descriptor(element_type("float32"), parent, (),
                      layout=CompositeHead(composition_rule=RULE_PARTITION, combine_op=OP_NONE, member_count=2))
    overlay = Descriptor(element_type("float32"), rows, (),
                         layout=CompositeHead(composition_rule=RULE_OVERLAY, combine_op=OP_ADD, member_count=2),
                         shard=Shard(parent_shape=parent, offset=(2, 0)))
    path = tmp_path / "nested.hrry"
    with HrryWriter(path) as w:
        w.write("p", head, ())
        w.write(*_f32_member("top", top, parent, (0, 0)))
        w.write_composite("o", overlay, [_f32_member("ob", base, rows, (0, 0), ROLE_BASE),
                                         _f32_member("oc", corr, rows, (0, 0), ROLE_CORRECTION)])
        w.finish({})
    want = np.concatenate([top, base + corr])
    with HrryFile(path) as f:
        assert np.array_equal(dequantize(f.tensor("p")), want)
    loaded = hurray.load(str(path))["p"]
    nested = loaded.members[1]
    assert tuple(nested.descriptor.shard.shard_offset) == (2, 0)  # loaded with its shard
    hurray.save(str(tmp_path / "resaved.hrry"), {"p": loaded})
    with HrryFile(tmp_path / "resaved.hrry") as f:
        assert np.array_equal(dequantize(f.tensor("p")), want)
    # ... but the constructor cannot make that member
    with pytest.raises(TypeError, match="unexpected keyword argument 'shard'"):
        hurray.Composite("overlay", shape=list(rows), dtype=hurray.float32, members=list(nested.members),
                         combine_op="add", shard=hurray.Shard(list(parent), [2, 0]))
    built = hurray.Composite("overlay", shape=list(rows), dtype=hurray.float32, members=list(nested.members),
                             combine_op="add")
    assert built.descriptor.shard is None
    with pytest.raises(hurray.InvalidDescriptorError, match="composite member 1 is missing a shard section"):
        hurray.Composite("partition", shape=list(parent), dtype=hurray.float32, members=[loaded.members[0], built])
