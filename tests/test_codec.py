"""The GGML block codecs (hurray_interop.conversions.gguf_codec) and the thread-count rule
(hurray_interop.parallel).

The codecs are checked against a naive per-element reading of ggml's block layouts
(written here, element by element, from ggml-common.h) and against gguf-py's block sizes;
the movers at block sizes other than 32 are what a new table row would use.
"""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest

from hurray_interop import parallel
from hurray_interop.conversions.gguf_codec import CODE_KINDS, BlockCodec, CodeKind, Parts, codec, codecs
from hurray_interop.core.elements import element_type, unpack
from hurray_interop.dequant import dequantize
from hurray_interop.errors import UsageError

BLOCK_CODECS = [c for c in codecs() if c.mapping != "plain"]


def naive_codes(c: BlockCodec, block: np.ndarray) -> list[int]:
    """GGML codes of one block, element by element (ggml-common.h), plus the code offset."""
    k, f = c.block_size, c.fields
    out = []
    for j in range(k):
        if c.kind.name == "i8":
            q = int(block[f["qs"] + j].astype(np.int8))
        else:
            byte = int(block[f["qs"] + j % (k // 2)])
            q = byte & 15 if j < k // 2 else byte >> 4
            if c.kind.name == "nibbles_qh":
                q |= (int(block[f["qh"] + j // 8]) >> (j % 8) & 1) << 4
        out.append(q + c.code_offset)
    return out


def hurray_codes(c: BlockCodec, codes: np.ndarray) -> list[int]:
    """Hurray storage bytes of one block → code values (signed for int storage)."""
    v = unpack(codes, c.storage, c.block_size).astype(np.int64)
    if c.storage.kind == "int" and c.storage.packed:
        v = np.where(v >= 1 << (c.storage.bits - 1), v - (1 << c.storage.bits), v)
    return v.tolist()


@pytest.mark.parametrize("c", BLOCK_CODECS, ids=lambda c: c.name)
def test_codec_sizes_are_ggml_sizes(c: BlockCodec) -> None:
    k, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[c.name]]
    assert (c.block_size, c.block_bytes) == (k, size)


def with_block_size(c: BlockCodec, k: int) -> BlockCodec:
    """The same layout at another block size (fields laid out one after another)."""
    widths = {"d": 2, "m": 2, "e": 1, "qh": k // 8, "qs": k if c.kind.name == "i8" else k // 2}
    fields, at = {}, 0
    for name in c.fields:
        fields[name] = at
        at += widths[name]
    return dataclasses.replace(c, block_size=k, block_bytes=at, fields=fields)


@pytest.mark.parametrize("k", [32, 64, 256])
@pytest.mark.parametrize("name", [c.name for c in BLOCK_CODECS])
def test_codes_and_fields_match_ggml_layout(name: str, k: int) -> None:
    c = codec(name) if k == 32 else with_block_size(codec(name), k)
    rng = np.random.default_rng(k)
    blocks = rng.integers(0, 256, (5, c.block_bytes), dtype=np.uint8)
    parts = c.split(blocks)
    assert parts.codes.shape == (5, c.code_bytes)
    for b in range(5):
        assert hurray_codes(c, parts.codes[b]) == naive_codes(c, blocks[b]), (name, k, b)
    sfield = c.fields[c.scale.field]
    assert parts.scales.tobytes() == blocks[:, sfield : sfield + parts.scales.itemsize].tobytes()
    assert c.join(parts).tobytes() == blocks.tobytes()  # every byte goes back where it was


def test_every_kind_moves_codes_through_unpack_and_pack() -> None:
    """A code kind is its two movers (and an optional reuse mover), nothing more: no hook
    that no registered kind sets and that the codec would branch on."""
    assert [f.name for f in dataclasses.fields(CodeKind)] == ["name", "bits", "signed", "unpack", "pack", "unpack_into"]
    assert [f.name for f in dataclasses.fields(Parts)] == ["codes", "scales", "minimum"]
    assert all(callable(k.unpack) and callable(k.pack) for k in CODE_KINDS.values())


def test_code_range_is_what_the_blocks_hold() -> None:
    assert {c.name: c.code_range() for c in BLOCK_CODECS} == {
        "Q8_0": (-128, 127), "Q4_0": (-8, 7), "Q5_0": (-16, 15), "Q4_1": (0, 15), "Q5_1": (0, 31), "MXFP4": (0, 15),
    }
    assert set(CODE_KINDS) >= {c.kind.name for c in BLOCK_CODECS}


def test_zero_mask_ignores_only_sign_bits() -> None:
    fp4 = codec("MXFP4")
    zeros = np.uint8([[0x00, 0x88, 0x08, 0x80]])
    assert not np.any(zeros & fp4.zero_mask)
    assert all(np.uint8(b) & fp4.zero_mask for b in (0x01, 0x10, 0x89, 0x7F))
    assert codec("Q4_0").zero_mask == 0xFF


# ---------------------------------------------------------------------------
# the one thread-count rule


def test_jobs_rule() -> None:
    assert parallel.jobs() == min(parallel.DEFAULT_JOBS, parallel.cpus())
    with parallel.use_jobs(3):
        assert parallel.jobs() == 3
        with parallel.use_jobs(None):
            assert parallel.jobs() == 3  # None keeps the enclosing choice
        assert parallel.jobs(1) == 1
    for bad in (0, -1, True, 2.0, "2"):
        with pytest.raises(UsageError, match="must be positive"):
            parallel.check_jobs(bad)


def test_dequantizer_follows_the_jobs_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    import hurray_interop.dequant as dq
    from hurray_interop.core.model import BufferHandle, Descriptor, Tensor

    calls = []
    real = dq._fill_all
    monkeypatch.setattr(dq, "_fill_all", lambda dec, flat, workers, *a: (calls.append(workers), real(dec, flat, 1, *a)))
    n = 4 * dq._PARALLEL_GRAIN
    t = Tensor("t", Descriptor(element_type("float32"), (n,), (BufferHandle.cpu(4 * n),)), (np.zeros(n, np.float32),))
    with parallel.use_jobs(1):
        dequantize(t)
    with parallel.use_jobs(3):
        dequantize(t)
        dequantize(t, threads=2)
    assert calls == [1, 3, 2]


def test_pmap_keeps_order_on_threads() -> None:
    with parallel.use_jobs(2):
        got = list(parallel.pmap(lambda sl: (sl.start, sl.stop), 10, 3))
    assert got == [(0, 3), (3, 6), (6, 9), (9, 10)]
