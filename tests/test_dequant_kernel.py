"""The shared dequantizer's compiled path (``hk_dequant`` in ``_kernel.c``) against its numpy
twin (the dequantizer's own numpy evaluation, ``kernels._lib = None``): bit for bit on every
storage type, scale type, block size, zero point, code book and overlay the compiled path
takes, on windows that start anywhere in a block; and the shapes it leaves to numpy."""

from __future__ import annotations

import numpy as np
import pytest

from test_dequant import head, make, pack, rand_codes, same_bits, storage_bytes
from test_kernels import numpy_path  # the library switched off: the numpy twins

import hurray_interop.dequant as dq
import hurray_interop.kernels as K
from hurray_interop.core.elements import element_type
from hurray_interop.core.model import (
    MXFP,
    NF4,
    OP_ADD,
    OP_REPLACE,
    ROLE_BASE,
    ROLE_CORRECTION,
    RULE_OVERLAY,
    RULE_PARTITION,
    ColumnMajor,
    PerBlockAffine,
    Shard,
    Strided,
)

pytestmark = pytest.mark.skipif(K.KERNEL != "c", reason=f"compiled kernel not loaded ({K.LIBRARY.name} not built "
                                f"or {K.ENV_VAR}=numpy); build it with `python hatch_build.py`")

RNG = np.random.default_rng(20261202)


def compiled(t) -> bool:
    """Whether the dequantizer evaluates ``t`` on the compiled path."""
    return dq._make(t, False).plan is not None


HAS_AVX2 = K.dequant_avx2()


def both_ways(t, *, max_elements: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``t``'s values through C (which must run) and through numpy; with ``max_elements``, in
    windows of that many values (starting inside blocks when it is not a multiple of them).
    Where the CPU has AVX2, C runs twice, with its AVX2 loops and with the SSE2 ones, which
    must give the same bits."""
    assert compiled(t)

    def run() -> np.ndarray:
        if max_elements is None:
            return dq.dequantize(t, strict=False, threads=1)
        flat = [v.reshape(-1) for _, v in dq.iter_dequantize(t, max_elements=max_elements, strict=False, threads=1)]
        return np.concatenate(flat).reshape(t.descriptor.shape)

    c = run()
    if HAS_AVX2:
        try:
            assert K.dequant_avx2(False) is False
            assert same_bits(c, run()), "the AVX2 and SSE2 loops differ"
        finally:
            K.dequant_avx2(True)
    with numpy_path():
        assert not compiled(t)
        n = run()
    return c, n


def special_scales(n: int, scale_type: str, edges: bool | slice = True) -> np.ndarray:
    """Random scales with the edge values mixed in: ±0, subnormals, ±inf, NaN, the extremes --
    anywhere (``edges`` True), only in the blocks of a slice, or nowhere (False: finite,
    non-zero scales, which C takes a whole 4096-value chunk at a time)."""
    st = element_type(scale_type)
    if scale_type == "float8_e8m0":
        s = RNG.integers(0, 256, n).astype(np.uint8)
        s[: min(n, 4)] = [0, 255, 1, 254][: min(n, 4)]
        return s
    s = RNG.uniform(-3, 3, n).astype(np.float32)
    s[s == 0] = 1.0
    edge = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 6e-8, 65504.0], np.float32)
    where = np.arange(n)[slice(None) if edges is True else edges] if edges is not False else np.arange(0)
    k = min(where.size, edge.size)
    s[RNG.choice(where, k, replace=False)] = edge[:k]
    if scale_type == "bfloat16":
        return (s.view(np.uint32) >> 16).astype(np.uint16)
    return s.astype(st.dtype)


def block_case(etype: str, shape, K_: int, scale_type: str = "float16", zero: str | None = None,
               scheme: str = "affine", edges: bool | slice = True):
    """A per-block (or MXFP / NF4) tensor along the last axis with random codes (``edges``:
    where the edge scales go, see :func:`special_scales`)."""
    codes = rand_codes(etype, shape)
    nblocks = int(np.prod(shape)) // K_
    params = [special_scales(nblocks, scale_type, edges)]
    if scheme == "mxfp":
        quant = MXFP(axis=len(shape) - 1, block_size=K_, scale_buffer_index=1)
    elif scheme == "nf4":
        quant = NF4(axis=len(shape) - 1, block_size=K_, scale_buffer_index=1)
    else:
        zbi = None
        if zero is not None:
            lo, hi = {"small": (-20, 20), "wide": (-(1 << 31), (1 << 31) - 1), "edge": ((1 << 30) - 2, (1 << 30) + 3)}[zero]
            z = RNG.integers(lo, hi, nblocks, dtype=np.int64, endpoint=True).astype(np.int32)
            if zero == "edge":  # both sides of the int32 fast path's limit, and the extremes
                z[:6] = [(1 << 30) - 1, 1 << 30, (1 << 30) + 1, -(1 << 30) - 1, -(1 << 31), (1 << 31) - 1][: min(6, nblocks)]
            params.append(z)
            zbi = 2
        quant = PerBlockAffine(axis=len(shape) - 1, block_size=K_, scale_buffer_index=1, zero_point_buffer_index=zbi,
                               scale_type=element_type(scale_type))
    return make("k", etype, shape, storage_bytes(codes, etype), tuple(params), quant=quant)


@pytest.mark.parametrize("etype", ["int8", "uint8", "int4", "uint4", "int2", "uint2"])
@pytest.mark.parametrize("scale_type", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("zero", [None, "small", "wide", "edge"])
def test_per_block_affine_c_and_numpy_agree(etype: str, scale_type: str, zero: str | None) -> None:
    c, n = both_ways(block_case(etype, (5, 96), 32, scale_type, zero))
    assert same_bits(c, n)


@pytest.mark.parametrize("K_", [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
@pytest.mark.parametrize("etype", ["int4", "uint2", "int8"])
def test_block_sizes_and_windows_inside_blocks(K_: int, etype: str) -> None:
    t = block_case(etype, (3, 2048), K_, "float32", "small")
    whole = both_ways(t)
    assert same_bits(*whole)
    for window in (7, 1000, 4095, 4096, 4097):  # the C chunk is 4096 values: its limit -1, 0, +1
        c, n = both_ways(t, max_elements=window)
        assert same_bits(c, n) and same_bits(c, whole[0])


@pytest.mark.parametrize("etype", ["float4_e2m1", "float8_e4m3", "float8_e5m2", "int8", "int4"])
def test_mxfp_c_and_numpy_agree(etype: str) -> None:
    c, n = both_ways(block_case(etype, (4, 256), 32, "float8_e8m0", scheme="mxfp"))
    assert same_bits(c, n)


def test_nf4_code_book_c_and_numpy_agree() -> None:
    c, n = both_ways(block_case("uint4", (4, 128), 64, "float32", scheme="nf4"))
    assert same_bits(c, n)


def member_of(t, parent, role, strides=None):
    """``t`` (a block tensor) as an overlay member covering ``parent``; ``strides=(0, 0)``: its
    first code alone, broadcast (the compact forms' minimum)."""
    d = t.descriptor
    layout = Strided(strides=strides) if strides is not None else d.layout
    return make(t.name, d.element_type.name, d.shape, t.data[0], t.data[1:], quant=d.quantization, layout=layout,
                shard=Shard(parent_shape=parent, offset=(0,) * len(parent)), role=role)


def overlay(parts, shape=(6, 256), op=OP_ADD, etype="float32", edges: bool | slice = True):
    """An overlay of per-block members: ``parts`` = ((storage, block size, scale type, zero,
    constant), ...); ``edges`` as :func:`special_scales` takes it, in element units (each
    member's blocks over those elements)."""
    members = []
    for i, (storage, K_, st, zero, constant) in enumerate(parts):
        e = edges if isinstance(edges, bool) else slice(edges.start // K_, -(-edges.stop // K_))
        t = block_case(storage, shape, K_, st, zero, edges=e)
        members.append(member_of(t, shape, ROLE_BASE if i == 0 else ROLE_CORRECTION,
                                 (0,) * len(shape) if constant else None))
    return head("ov", shape, RULE_OVERLAY, op, members, etype)


OVERLAYS = {
    "q4_k": [("uint4", 32, "float32", None, False), ("uint8", 32, "float32", None, True)],
    "q5_k": [("uint4", 32, "float32", None, False), ("uint2", 32, "float32", None, False),
             ("uint8", 32, "float32", None, True)],
    "q5_0": [("uint4", 32, "float16", None, False), ("int2", 32, "float16", None, False)],
    "q2_k": [("uint2", 16, "float32", None, False), ("uint8", 16, "float32", None, True)],
    "zero_points": [("uint4", 32, "float16", "small", False), ("int8", 32, "bfloat16", "edge", False),
                    ("uint8", 32, "float32", "wide", True)],
    "four": [("int4", 16, "float16", None, False), ("uint2", 16, "float32", None, False),
             ("int8", 16, "bfloat16", "small", False), ("uint8", 16, "float16", None, True)],
    "five": [("int4", 16, "float16", None, False)] * 5,  # beyond the fused path's four
    "mixed_blocks": [("uint4", 32, "float32", None, False), ("uint8", 16, "float32", None, True)],
    "constant_base": [("uint8", 32, "float16", None, True), ("int4", 32, "float16", None, False)],
    "big_blocks": [("int4", 512, "float32", "small", False), ("uint8", 512, "float32", None, True)],
    "pairs": [("int2", 2, "float16", "small", False), ("uint8", 2, "float32", None, True)],
}


@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_overlays_c_and_numpy_agree(name: str) -> None:
    t = overlay(OVERLAYS[name], shape=(6, 1024) if name == "big_blocks" else (6, 256))
    whole = both_ways(t)
    assert same_bits(*whole)
    c, n = both_ways(t, max_elements=1000)
    assert same_bits(c, n) and same_bits(c, whole[0])


#: the chunk of 4096 values C evaluates at once (HK_DQ_CHUNK in _kernel.c)
CHUNK = 4096


@pytest.mark.parametrize("name", sorted(OVERLAYS))
@pytest.mark.parametrize("edges", ["none", "third_chunk"])
def test_overlays_with_finite_scales_agree_chunk_by_chunk(name: str, edges: str) -> None:
    """Finite non-zero scales and no zero points: C takes a chunk in one vector pass without the
    per-block checks.  Four chunks, the edge scales (or none) in the third only, so chunks of
    both kinds meet in one tensor; windows start inside chunks and blocks."""
    e = False if edges == "none" else slice(2 * CHUNK, 3 * CHUNK)
    t = overlay(OVERLAYS[name], shape=(8, 2048), edges=e)
    whole = both_ways(t)
    assert same_bits(*whole)
    c, n = both_ways(t, max_elements=CHUNK + 1000)
    assert same_bits(c, n) and same_bits(c, whole[0])


@pytest.mark.parametrize("K_", [2, 4, 8, 16, 32, 64, 256, 1024])
@pytest.mark.parametrize("etype", ["int8", "uint8", "int4", "uint4", "int2", "uint2"])
def test_one_member_with_finite_scales_agrees(K_: int, etype: str) -> None:
    """A single per-block member, every scale finite and non-zero: each storage type and block
    size (under 16: no vector at all), in windows that start inside blocks."""
    t = block_case(etype, (4, 3 * 1024), K_, "float32", edges=False)
    whole = both_ways(t)
    assert same_bits(*whole)
    c, n = both_ways(t, max_elements=CHUNK - 3)
    assert same_bits(c, n)


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_a_scale_at_the_chunk_paths_limit_agrees(delta: int) -> None:
    """|scale| < 2^90 is where a whole chunk goes without the per-block checks (the values and
    their sums stay finite): one scale at 2^90 in ulps -1, 0, +1, in the middle chunk."""
    parts = OVERLAYS["q5_k"]
    t = overlay(parts, shape=(3, CHUNK), edges=False)
    limit = np.float32(2.0 ** 90)
    s = {-1: np.nextafter(limit, np.float32(0)), 0: limit, 1: np.nextafter(limit, np.float32(np.inf))}[delta]
    for m in t.members:
        scale = m.data[1].view(np.float32)  # the member's scales, float32 (the buffer itself)
        scale[scale.size // 2] = s * (-1 if delta else 1)
    assert same_bits(*both_ways(t))


def test_the_avx2_switch_reports_and_restores() -> None:
    """kernels.dequant_avx2: off, then back to what the CPU has."""
    before = K.dequant_avx2()
    try:
        assert K.dequant_avx2(False) is False and K.dequant_avx2() is False
    finally:
        assert K.dequant_avx2(True) is before
    with numpy_path():
        assert K.dequant_avx2() is False


def test_an_overlay_with_an_mxfp_member_agrees() -> None:
    shape = (4, 256)
    base = block_case("int4", shape, 32, "float16")
    mx = block_case("float4_e2m1", shape, 32, "float8_e8m0", scheme="mxfp")
    t = head("ov", shape, RULE_OVERLAY, OP_ADD, [member_of(base, shape, ROLE_BASE), member_of(mx, shape, ROLE_CORRECTION)])
    assert same_bits(*both_ways(t))


def test_the_fused_path_stores_the_numpy_roundings() -> None:
    """base + correction rounds after each member: values chosen so that a fused multiply-add
    or a different order would differ from numpy's."""
    shape = (1, 32)
    codes = np.full(shape, 7, np.int64)
    base = make("b", "uint4", shape, pack(codes, 4), (np.array([1.0000001], np.float32),),
                quant=PerBlockAffine(axis=1, block_size=32, scale_buffer_index=1, scale_type=element_type("float32")))
    corr = make("c", "uint8", shape, np.array([3], np.uint8), (np.array([-2.3333333], np.float32),),
                quant=PerBlockAffine(axis=1, block_size=32, scale_buffer_index=1, scale_type=element_type("float32")))
    t = head("ov", shape, RULE_OVERLAY, OP_ADD, [member_of(base, shape, ROLE_BASE),
                                                 member_of(corr, shape, ROLE_CORRECTION, (0, 0))])
    c, n = both_ways(t)
    expected = np.float32(7) * np.float32(1.0000001) + np.float32(3) * np.float32(-2.3333333)
    assert same_bits(c, n) and c[0, 0] == expected


def _plain(shape=(4, 64)):
    return block_case("int4", shape, 32, "float16")


NUMPY_ONLY = {
    "axis_not_last": lambda: make("t", "int4", (64, 4), pack(rand_codes("int4", (64, 4)), 4),
                                  (np.ones(8, np.float16),),
                                  quant=PerBlockAffine(axis=0, block_size=32, scale_buffer_index=1)),
    "partial_block": lambda: make("t", "int4", (2, 40), pack(rand_codes("int4", (2, 64)), 4), (np.ones(4, np.float16),),
                                  quant=PerBlockAffine(axis=1, block_size=32, scale_buffer_index=1)),
    "column_major": lambda: make("t", "int4", (4, 64), pack(rand_codes("int4", (4, 64)), 4), (np.ones(8, np.float16),),
                                 quant=PerBlockAffine(axis=1, block_size=32, scale_buffer_index=1), layout=ColumnMajor()),
    "float6_codes": lambda: block_case("float6_e2m3", (2, 64), 32, "float8_e8m0", scheme="mxfp"),
    "float16_head": lambda: overlay(OVERLAYS["q4_k"], etype="float16"),
    "replace": lambda: overlay(OVERLAYS["q4_k"], op=OP_REPLACE),
}


@pytest.mark.parametrize("name", sorted(NUMPY_ONLY))
def test_what_the_compiled_path_leaves_to_numpy(name: str) -> None:
    t = NUMPY_ONLY[name]()
    assert dq._make(t, False).plan is None
    with_library = dq.dequantize(t, strict=False)
    with numpy_path():
        assert same_bits(with_library, dq.dequantize(t, strict=False))


def test_a_partition_is_left_to_numpy_its_members_compiled() -> None:
    shape = (4, 64)
    parts = []
    for i in range(2):
        t = block_case("int4", (2, 64), 32, "float16")
        d = t.descriptor
        parts.append(make(f"p{i}", "int4", (2, 64), t.data[0], t.data[1:], quant=d.quantization,
                          shard=Shard(parent_shape=shape, offset=(2 * i, 0))))
    t = head("part", shape, RULE_PARTITION, 0, parts)
    dec = dq._make(t, False)
    assert dec.plan is None and all(m.decoder.plan is not None for m in dec.members)
    c = dq.dequantize(t, strict=False)
    with numpy_path():
        assert same_bits(c, dq.dequantize(t, strict=False))


@pytest.mark.parametrize("case", ["misaligned_scale", "table_with_zero", "short_table", "bits_6"])
def test_dequant_plan_refuses_what_c_cannot_take(case: str) -> None:
    spec = dict(dq._make(_plain(), False).spec)
    if case == "misaligned_scale":
        raw = np.zeros(2 * 8 + 1, np.uint8)[1:].view("<u2")
        spec["scale"] = raw
    elif case == "table_with_zero":
        spec["table"], spec["zero"] = np.zeros(16, np.float32), np.zeros(8, "<i4")
    elif case == "short_table":
        spec["table"] = np.zeros(15, np.float32)
    else:
        spec["bits"] = 6
    assert K.dequant_plan([spec], 256) is None
    assert K.dequant_plan([dict(dq._make(_plain(), False).spec)], 256) is not None


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_dequant_window_stays_inside_the_tensor(delta: int) -> None:
    t = _plain((4, 64))
    plan = dq._make(t, False).plan
    out = np.empty(64, np.float32)
    if delta <= 0:
        K.dequant_window(plan, 256 - 64 + delta, out)  # ends at the last element (or before)
        with numpy_path():
            ref = dq.dequantize(t, strict=False).reshape(-1)
        assert same_bits(out, ref[256 - 64 + delta : 256 + delta])
    else:
        with pytest.raises(ValueError):
            K.dequant_window(plan, 256 - 64 + delta, out)
    with pytest.raises(ValueError):
        K.dequant_window(plan, -1, out)


def test_dequant_window_refuses_a_wrong_output() -> None:
    plan = dq._make(_plain(), False).plan
    with pytest.raises(ValueError):
        K.dequant_window(plan, 0, np.empty(8, np.float64))
    with pytest.raises(ValueError):
        K.dequant_window(plan, 0, np.empty(16, np.float32)[::2])



@pytest.mark.parametrize("name", ["q4_k", "q5_k", "zero_points", "five", "mixed_blocks"])
@pytest.mark.parametrize("zero_equal", [False, True])
def test_dequant_diff_finds_the_first_difference_without_writing_the_window(name: str, zero_equal: bool) -> None:
    """Windows.first_diff (hk_dequant_diff) against fill + compare: -1 on equal values, else the
    first differing index -- at the first, a middle and the last element, across the C chunk
    of 4096 values, a +0/-0 difference counted unless ``zero_equal``."""
    t = overlay(OVERLAYS[name], shape=(4, 4096 + 256))
    assert compiled(t)
    wins = dq.windows(t, max_elements=3 * 4096 + 5, strict=False)
    spans = list(wins.spans())
    assert len(spans) > 1
    for lo, n, region in spans:
        ref = wins.fill(region, np.empty(n, np.float32))
        assert wins.first_diff(region, ref.copy(), zero_equal) == -1
        for at in (0, 4095, 4096, n // 2, n - 1):
            if at >= n:
                continue
            bad = ref.copy()
            bad.view(np.uint32)[at] ^= 1 << 3
            assert wins.first_diff(region, bad, zero_equal) == at
        zero_at = np.flatnonzero(ref == 0)  # a +0/-0 flip: a difference unless zero_equal
        if zero_at.size:
            flipped = ref.copy()
            flipped[zero_at[0]] = -flipped[zero_at[0]]
            assert wins.first_diff(region, flipped, zero_equal) == (-1 if zero_equal else zero_at[0])


def test_dequant_diff_refuses_a_reference_of_the_wrong_size() -> None:
    t = _plain((4, 64))
    wins = dq.windows(t, strict=False)
    (lo, n, region), = wins.spans()
    with pytest.raises(dq.UsageError):
        wins.first_diff(region, np.zeros(n - 1, np.float32))
    with pytest.raises(ValueError):
        K.dequant_diff(dq._make(t, False).plan, 1, np.zeros(n, np.float32))  # past the end by one
    assert K.dequant_diff(dq._make(t, False).plan, 0, wins.fill(region, np.empty(n, np.float32))) == -1


def test_first_diff_is_none_off_the_compiled_path() -> None:
    t = NUMPY_ONLY["column_major"]()
    wins = dq.windows(t, strict=False)
    (lo, n, region), = wins.spans()
    assert wins.first_diff(region, np.zeros(n, np.float32)) is None


# ---------------------------------------------------------------------------
# plain float16 / bfloat16 tensors: hk_halves against numpy's cast and shift


def halves_case(etype: str, shape=(4, 65536 // 4), byte_offset: int = 0, layout=None):
    """Every 16-bit pattern once (shuffled), as a float16/bfloat16 tensor without a scheme."""
    bits = RNG.permutation(np.arange(1 << 16, dtype=np.uint32)).astype("<u2")[: int(np.prod(shape))]
    data = np.concatenate([np.zeros(byte_offset, np.uint8), bits.view(np.uint8)])
    return make("h", etype, shape, data, byte_offset=byte_offset, layout=layout)


@pytest.mark.parametrize("etype", ["float16", "bfloat16"])
def test_every_half_pattern_agrees_with_numpy(etype: str) -> None:
    """All 65536 bit patterns (NaN payloads, signalling NaNs, subnormals, ±0, ±inf) through C
    and through numpy, whole and in windows that start anywhere."""
    t = halves_case(etype)
    assert isinstance(dq._make(t, True).plan, K.HalvesPlan)
    c = dq.dequantize(t, threads=1)
    flat = np.concatenate([v.reshape(-1) for _, v in dq.iter_dequantize(t, max_elements=4096 * 3 + 7, threads=1)])
    with numpy_path():
        assert dq._make(t, True).plan is None
        n = dq.dequantize(t, threads=1)
    assert same_bits(c, n) and same_bits(flat.reshape(c.shape), n)


@pytest.mark.parametrize("etype", ["float16", "bfloat16"])
def test_half_first_diff_finds_the_first_difference(etype: str) -> None:
    """Windows.first_diff of a plain half tensor (hk_plan_diff): -1 on equal values, else the
    index, at the first, the chunk's last and first and the last element."""
    t = halves_case(etype, shape=(2, 3 * 4096 + 5))
    wins = dq.windows(t, max_elements=2 * 4096 + 9)
    for lo, n, region in wins.spans():
        ref = wins.fill(region, np.empty(n, np.float32))
        assert wins.first_diff(region, ref.copy()) == -1
        for at in (0, 4095, 4096, n - 1):
            if at < n:
                bad = ref.copy()
                bad.view(np.uint32)[at] ^= 1
                assert wins.first_diff(region, bad) == at


@pytest.mark.parametrize("case", ["odd_byte_offset", "column_major"])
def test_halves_the_c_conversion_cannot_take_stay_on_numpy(case: str) -> None:
    if case == "odd_byte_offset":
        t = halves_case("float16", shape=(2, 64), byte_offset=1)
    else:
        t = halves_case("float16", shape=(2, 64), layout=ColumnMajor())
    assert dq._make(t, True).plan is None
    c = dq.dequantize(t)
    with numpy_path():
        assert same_bits(c, dq.dequantize(t))


def test_a_halves_plan_refuses_what_it_cannot_read() -> None:
    """halves_plan: no table for float16, a table of the wrong size, misaligned or wrong-typed
    bits give no plan (the numpy path); the plan's window and comparison check their ranges."""
    h = np.zeros(8, "<u2")
    table = dq._f16_table()
    assert K.halves_plan(h, "float16", None) is None
    assert K.halves_plan(h, "float16", table[:-1]) is None
    assert K.halves_plan(np.zeros(9, np.uint8)[1:].view("<u2"), "bfloat16", None) is None
    assert K.halves_plan(h.astype("<i2"), "bfloat16", None) is None
    plan = K.halves_plan(h, "float16", table)
    out = np.empty(8, np.float32)
    K.dequant_window(plan, 0, out)
    assert same_bits(out, np.zeros(8, np.float32))
    with pytest.raises(ValueError):
        K.dequant_window(plan, 1, out)  # one past the end
    with pytest.raises(ValueError):
        K.dequant_diff(plan, 0, np.empty(9, np.float32))
    assert K.dequant_diff(plan, 0, out) == -1
