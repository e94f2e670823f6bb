"""Cross-implementation tests against pyhurray (the upstream reference binding).

The same content is built twice, independently: once with pyhurray's API
(``hurray.Tensor`` from raw bytes, its scheme and section classes) and once with
our model (:class:`Descriptor` and friends).  Then:

* ``hurray.save`` output loads in our reader with the expected names, types,
  shapes, buffer bytes and KV;
* our writer's output is byte-identical to ``hurray.save``'s;
* our output loads in ``hurray.load`` / ``hurray.load_kv`` to the same content.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hurray_interop.core.descriptor import encode_descriptor
from hurray_interop.core.elements import element_type
from hurray_interop.core.hrry import HrryFile, load, save
from hurray_interop.core.kv import KVValue
from hurray_interop.core.model import (
    MXFP,
    NF4,
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
    PerChannelAffine,
    PerTensorAffine,
    Shard,
    Statistics,
    Tensor,
)

hurray = pytest.importorskip("hurray")


# -- one content description, two independent builders -----------------------------------


@dataclass
class Spec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    data: bytes
    kind: str = "dense"  # dense | pt | pc | pb | nf4 | mx
    axis: int = 0
    block: int = 0
    symmetric: bool = True
    scale_type: str = "float32"
    scale: float = 1.0
    zero_point: int = 0
    aux: list[bytes] = field(default_factory=list)
    stats: dict[str, Any] | None = None
    shard: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    role: int | None = None  # overlay member role

    @property
    def buffers(self) -> list[bytes]:
        return [self.data, *self.aux]


def py_tensor(s: Spec):
    q = None
    if s.kind == "pt":
        q = hurray.PerTensorAffine(s.scale, s.zero_point)
    elif s.kind == "pc":
        q = hurray.PerChannelAffine.symmetric(s.axis, 1) if s.symmetric else hurray.PerChannelAffine.asymmetric(s.axis, 1, 2)
    elif s.kind == "pb":
        st_ = getattr(hurray.dtype, s.scale_type)
        q = (
            hurray.PerBlockAffine.symmetric(s.axis, s.block, 1, st_)
            if s.symmetric
            else hurray.PerBlockAffine.asymmetric(s.axis, s.block, 1, 2, st_)
        )
    elif s.kind == "nf4":
        q = hurray.NF4(s.axis, s.block, 1)
    elif s.kind == "mx":
        q = hurray.MXFP(s.axis, s.block, 1)
    kw: dict[str, Any] = {}
    if s.aux:
        kw["aux_buffers"] = list(s.aux)
    if q is not None:
        kw["quantization"] = q
    if s.stats is not None:
        kw["statistics"] = hurray.Statistics(**s.stats)
    if s.shard is not None:
        kw["shard"] = hurray.Shard(list(s.shard[0]), list(s.shard[1]))
    return hurray.Tensor(s.data, getattr(hurray.dtype, s.dtype), list(s.shape), **kw)


_STAT_BITS = [  # (mask bit, fields) as statistics.md defines computed_mask
    (0x01, ("nnz",)),
    (0x02, ("sparsity_ratio",)),
    (0x04, ("value_min", "value_max", "value_abs_max")),
    (0x08, ("value_mean", "value_stddev")),
    (0x10, ("nm_n", "nm_m")),
    (0x20, ("has_nan", "has_inf")),
]


def our_stats(d: dict[str, Any]) -> Statistics:
    mask = sum(bit for bit, names in _STAT_BITS if names[0] in d)
    return Statistics(computed_mask=mask, **{k: (int(v) if isinstance(v, bool) else v) for k, v in d.items()})


def our_descriptor(s: Spec) -> Descriptor:
    q = None
    if s.kind == "pt":
        q = PerTensorAffine(s.scale, s.zero_point)
    elif s.kind == "pc":
        q = PerChannelAffine(s.axis, 1, None if s.symmetric else 2)
    elif s.kind == "pb":
        q = PerBlockAffine(s.axis, s.block, 1, None if s.symmetric else 2, element_type(s.scale_type))
    elif s.kind == "nf4":
        q = NF4(s.axis, s.block, 1)
    elif s.kind == "mx":
        q = MXFP(s.axis, s.block, 1)
    # pyhurray declares alignment 64, or 1 for an empty buffer
    handles = tuple(BufferHandle(len(b), 64 if b else 1) for b in s.buffers)
    return Descriptor(
        element_type(s.dtype),
        s.shape,
        handles,
        quantization=q,
        statistics=our_stats(s.stats) if s.stats is not None else None,
        shard=Shard(*s.shard) if s.shard is not None else None,
        composite_member=CompositeMember(s.role) if s.role is not None else None,
    )


def our_tensor(s: Spec) -> Tensor:
    return Tensor(s.name, our_descriptor(s), tuple(np.frombuffer(b, np.uint8) for b in s.buffers))


@dataclass
class CompositeSpec:
    name: str
    rule: str  # partition | overlay
    shape: tuple[int, int]
    members: list[Spec]


def py_composite(c: CompositeSpec):
    kw = {"combine_op": "add"} if c.rule == "overlay" else {}
    return hurray.Composite(c.rule, shape=list(c.shape), dtype=hurray.float32, members=[py_tensor(m) for m in c.members], **kw)


def our_composite(c: CompositeSpec) -> Tensor:
    rule, op = (RULE_OVERLAY, OP_ADD) if c.rule == "overlay" else (RULE_PARTITION, OP_NONE)
    head = Descriptor(element_type("float32"), c.shape, (), layout=CompositeHead(rule, op, len(c.members)))
    return Tensor(c.name, head, (), tuple(our_tensor(m) for m in c.members))


def nbytes(dtype: str, n: int) -> int:
    return hurray.buffer_size_bytes(getattr(hurray.dtype, dtype), n)


def rbytes(rng: np.random.Generator, n: int) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def make_spec(rng: np.random.Generator, name: str, kind: str) -> Spec:
    """Valid content of ``kind`` with random sizes, values and optional sections."""
    rows, blocks = int(rng.integers(1, 4)), int(rng.integers(1, 3))
    if kind == "dense":
        dtype = str(rng.choice(["float32", "float16", "bfloat16", "int8", "uint8", "int32", "int4", "float8_e4m3"]))
        shape = (rows, 8 * blocks)
        s = Spec(name, dtype, shape, rbytes(rng, nbytes(dtype, rows * 8 * blocks)))
    elif kind == "empty":
        s = Spec(name, "float32", (0, int(rng.integers(1, 5))), b"")
    elif kind == "scalar":
        s = Spec(name, "float32", (), rbytes(rng, 4))
    elif kind == "pt":
        dtype = str(rng.choice(["int8", "uint8"]))
        zp = int(rng.integers(0, 128))
        s = Spec(name, dtype, (rows, 16), rbytes(rng, rows * 16), "pt", scale=float(np.float32(rng.uniform(0.01, 4))), zero_point=zp)
    elif kind == "pc":
        sym = bool(rng.integers(0, 2))
        axis = int(rng.integers(0, 2))
        shape = (rows, 8)
        ch = shape[axis]
        aux = [np.float32(rng.uniform(0.1, 2, ch)).tobytes()]
        if not sym:
            aux.append(rng.integers(-128, 128, ch).astype("<i4").tobytes())
        s = Spec(name, "int8", shape, rbytes(rng, rows * 8), "pc", axis=axis, symmetric=sym, aux=aux)
    elif kind == "pb":
        sym = bool(rng.integers(0, 2))
        dtype = str(rng.choice(["int4", "int8"]))
        k = int(rng.choice([32, 64]))
        scale_type = str(rng.choice(["float16", "float32", "bfloat16"]))
        n = rows * blocks
        sc = rng.uniform(0.1, 2, n)
        import ml_dtypes

        np_st = {"float16": np.float16, "float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[scale_type]
        aux = [sc.astype(np_st).tobytes()]
        if not sym:
            lo, hi = (-8, 8) if dtype == "int4" else (-128, 128)
            aux.append(rng.integers(lo, hi, n).astype("<i4").tobytes())
        s = Spec(
            name, dtype, (rows, k * blocks), rbytes(rng, nbytes(dtype, rows * k * blocks)), "pb",
            axis=1, block=k, symmetric=sym, scale_type=scale_type, aux=aux,
        )
    elif kind == "nf4":
        n = rows * blocks
        s = Spec(name, "uint4", (rows, 64 * blocks), rbytes(rng, rows * 32 * blocks), "nf4", axis=1, block=64,
                 aux=[np.float32(rng.uniform(0.1, 2, n)).tobytes()])
    elif kind == "mx":
        dtype = str(rng.choice(["float4_e2m1", "float8_e4m3", "float6_e2m3"]))
        n = rows * blocks
        s = Spec(name, dtype, (rows, 32 * blocks), rbytes(rng, nbytes(dtype, rows * 32 * blocks)), "mx", axis=1, block=32,
                 aux=[rng.integers(1, 255, n, dtype=np.uint8).tobytes()])
    else:
        raise AssertionError(kind)
    if kind not in ("empty", "scalar") and rng.random() < 0.3:
        groups = [g for g in _STAT_BITS if rng.random() < 0.5]
        st_: dict[str, Any] = {}
        for bit, names in groups:
            for f in names:
                st_[f] = (
                    int(rng.integers(0, 100)) if f in ("nnz", "nm_n", "nm_m")
                    else bool(rng.integers(0, 2)) if f in ("has_nan", "has_inf")
                    else float(rng.normal())
                )
        s.stats = st_
    if kind not in ("empty", "scalar") and rng.random() < 0.3:
        parent = tuple(d * 2 for d in s.shape)
        s.shard = (parent, tuple(d if rng.random() < 0.5 else 0 for d in s.shape))
    return s


def make_composite(rng: np.random.Generator, name: str) -> CompositeSpec:
    rows = int(rng.integers(1, 3))
    shape = (2 * rows, 8)
    top = Spec(f"{name}.0", "float32", (rows, 8), rbytes(rng, rows * 32), shard=(shape, (0, 0)))
    bot = Spec(f"{name}.1", "float32", (rows, 8), rbytes(rng, rows * 32), shard=(shape, (rows, 0)))
    if rng.random() < 0.5:
        return CompositeSpec(name, "partition", shape, [top, bot])
    base = Spec(f"{name}.0", "float32", shape, rbytes(rng, 2 * rows * 32), shard=(shape, (0, 0)), role=ROLE_BASE)
    corr = Spec(f"{name}.1", "float32", (1, 8), rbytes(rng, 32), shard=(shape, (1, 0)), role=ROLE_CORRECTION)
    return CompositeSpec(name, "overlay", shape, [base, corr])


ALL_KINDS = ["dense", "empty", "scalar", "pt", "pc", "pb", "nf4", "mx"]


def all_kv() -> dict[str, Any]:
    return {
        "str": "héllo",
        "int": -(2**62),
        "float": 0.1,
        "bool": True,
        "bytes": b"\x00\xff",
        "strs": ["a", "", "ü"],
        "ints": [1, -1, 2**63 - 1],
        "floats": [1.5, -0.0],
        "bools": [False, True],
        "blobs": [b"", b"x"],
    }


# -- checks ------------------------------------------------------------------------------


def check_ours_against_specs(path, items) -> None:
    tensors, kv_ = load(path)
    assert list(tensors) == [i.name for i in items]
    for item in items:
        t = tensors[item.name]
        if isinstance(item, CompositeSpec):
            assert t.descriptor.is_composite and t.shape == item.shape
            assert [m.name for m in t.members] == [m.name for m in item.members]
            pairs = list(zip(t.members, item.members))
        else:
            pairs = [(t, item)]
        for got, want in pairs:
            assert got.element_type.name == want.dtype
            assert got.shape == want.shape
            assert [bytes(b) for b in got.data] == want.buffers
            assert got.descriptor == our_descriptor(want)


def check_pyhurray_against_specs(path, items, kv) -> None:
    loaded = hurray.load(str(path))
    assert list(loaded) == [i.name for i in items]
    for item in items:
        t = loaded[item.name]
        members = list(zip(t.members, item.members)) if isinstance(item, CompositeSpec) else [(t, item)]
        for got, want in members:
            assert got.dtype.name == want.dtype
            assert tuple(got.shape) == want.shape
            assert got.buffer_count == len(want.buffers)
            assert [np.asarray(got.buffer(i)).tobytes() for i in range(got.buffer_count)] == want.buffers
            assert got.descriptor.encode() == encode_descriptor(our_descriptor(want))
    assert hurray.load_kv(str(path)) == kv


def round_trip(tmp_path, items, kv) -> None:
    ref = tmp_path / "ref.hrry"
    hurray.save(str(ref), {i.name: py_composite(i) if isinstance(i, CompositeSpec) else py_tensor(i) for i in items}, kv=kv)
    # pyhurray -> ours
    check_ours_against_specs(ref, items)
    _, got_kv = load(ref)
    assert {k: v.to_python() for k, v in got_kv.items()} == kv
    # ours, built independently, -> identical bytes
    ours = tmp_path / "ours.hrry"
    save(ours, [our_composite(i) if isinstance(i, CompositeSpec) else our_tensor(i) for i in items], kv=kv)
    assert ours.read_bytes() == ref.read_bytes()
    # ours -> pyhurray
    check_pyhurray_against_specs(ours, items, kv)


# -- tests -----------------------------------------------------------------------------------


def test_every_feature_in_one_file(tmp_path):
    rng = np.random.default_rng(7)
    items: list[Any] = [make_spec(rng, f"t_{k}", k) for k in ALL_KINDS]
    items += [make_spec(rng, f"t_pb{i}", "pb") for i in range(4)]
    items += [make_spec(rng, f"t_mx{i}", "mx") for i in range(3)]
    items.append(make_composite(rng, "part"))
    c = make_composite(rng, "ov")
    while c.rule != "overlay":
        c = make_composite(rng, "ov")
    items.append(c)
    round_trip(tmp_path, items, all_kv())


def test_reference_layout_facts(tmp_path):
    """Byte facts observed from the reference writer (docs/format-notes.md § 2.8), checked on pyhurray output."""
    ref = tmp_path / "r.hrry"
    q = Spec("q", "int8", (2, 4), bytes(8), "pc", axis=0, symmetric=True, aux=[np.float32([1, 2]).tobytes()])
    hurray.save(str(ref), {"q": py_tensor(q), "e": hurray.Tensor(b"", hurray.float32, [0]), "x": hurray.Tensor(bytes(4), hurray.float32, [1])})
    with HrryFile(ref) as f:
        assert f.entry("q").data_length == 8 + 4088 + 8  # inter-buffer padding, none after the last
        assert f.entry("e").descriptor_offset == 8200 and f.entry("e").data_length == 0
        assert f.entry("x").descriptor_offset == f.entry("e").data_offset  # empty tensor: same aligned offset
        assert f.header.tensor_count_hint == 0xFFFFFFFFFFFFFFFF and f.header.flags == 0x4
    ours = tmp_path / "o.hrry"
    save(ours, [our_tensor(q), Tensor("e", Descriptor(element_type("float32"), (0,), (BufferHandle(0, 1),)), (np.zeros(0, np.uint8),)),
                Tensor("x", Descriptor(element_type("float32"), (1,), (BufferHandle(4, 64),)), (np.zeros(4, np.uint8),))])
    assert ours.read_bytes() == ref.read_bytes()


def test_kv_types_pyhurray_cannot_write_are_read_by_it(tmp_path):
    """uint64 and empty arrays: the spec allows them, the reference writer cannot produce them,
    and the reference reader (hurray.load_kv) accepts what we write."""
    p = tmp_path / "k.hrry"
    kv = {"u": KVValue.uint64(2**64 - 1), "empty": KVValue.array("string", []), "ue": KVValue.array("uint64", [0, 2**63])}
    save(p, [Tensor("x", Descriptor(element_type("uint8"), (1,), (BufferHandle(1, 64),)), (np.ones(1, np.uint8),))], kv=kv)
    assert hurray.load_kv(str(p)) == {"u": 2**64 - 1, "empty": [], "ue": [0, 2**63]}
    with pytest.raises(Exception, match="must not be empty"):
        hurray.save(str(tmp_path / "r.hrry"), {"x": hurray.Tensor(b"\1", hurray.uint8, [1])}, kv={"e": []})
    _, back = load(p)
    assert back == kv and back["u"].type == "uint64"


@st.composite
def file_contents(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    kinds = draw(st.lists(st.sampled_from(ALL_KINDS + ["composite"]), min_size=0, max_size=6))
    rng = np.random.default_rng(seed)
    items = [make_composite(rng, f"c{i}") if k == "composite" else make_spec(rng, f"n{i}_{k}", k) for i, k in enumerate(kinds)]
    kv = draw(
        st.dictionaries(
            st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=5),
            st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=5), st.binary(max_size=5),
                      st.booleans(), st.lists(st.integers(-5, 5), min_size=1, max_size=3)),
            max_size=4,
        )
    )
    return items, kv


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=file_contents())
def test_random_files_byte_identical_to_pyhurray(tmp_path_factory, content):
    items, kv = content
    round_trip(tmp_path_factory.mktemp("rt"), items, kv)


def test_composite_between_plain_tensors_keeps_members_adjacent(tmp_path):
    """A composite written between plain tensors keeps its members adjacent (descriptor order)."""
    rng = np.random.default_rng(3)
    items = [make_spec(rng, "a", "dense"), make_composite(rng, "c"), make_spec(rng, "z", "pb")]
    round_trip(tmp_path, items, {})
    with HrryFile(tmp_path / "ours.hrry") as f:
        assert f.top_level_names() == ("a", "c", "z")
        assert f.names == ("a", "c", "c.0", "c.1", "z")
        assert struct.unpack_from("<Q", (tmp_path / "ours.hrry").read_bytes(), 28)[0] == 2**64 - 1
