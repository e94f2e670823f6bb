"""Hurray → GGUF export, proven (docs/conversion-rules.md § 7).

* GGUF → Hurray → GGUF reproduces the source byte for byte: the fixture model,
  llama.cpp's own vocab files (one GGUF v2, unpadded ends), gguf-py files with every
  metadata value type, every mapped tensor type with zero blocks in 1-D..4-D, 300
  tensors, alignments 8..4096, v2 and unpadded files from the stream writer.
* Hurray → GGUF → Hurray keeps every exportable tensor's buffers byte for byte
  (.hrry files built with our HrryWriter and with pyhurray ``hurray.save``); the
  rest is refused with its reason, or exported by ``fallback``.
* Exported files open in gguf-py's GGUFReader and ``gguf.quants.dequantize`` gives
  the values of our dequantizer on the Hurray source, bit for bit (MXFP4: ±0 equal).

The oracles are gguf-py (reader, writer, quantizer, dequantizer), pyhurray and plain
file bytes; hurray_interop's own code is only the thing under test.
"""

from __future__ import annotations

import itertools
import json
import struct
from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf import GGUFValueType as GV
from gguf_factory import (
    ALL_TYPES,
    BLOCK_TYPES,
    TensorDef,
    all_types_defs,
    every_kv_gguf_py,
    every_kv_values,
    q4_1_blocks,
    q8_0_blocks,
    write_gguf_py,
    write_gguf_raw,
    write_gguf_stream,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hurray_interop.cli import main
from hurray_interop.conversions.gguf import gguf_to_hurray, hurray_to_gguf
from hurray_interop.core.elements import buffer_size, element_type
from hurray_interop.core.hrry import HrryFile, HrryWriter
from hurray_interop.core.kv import KVValue
from hurray_interop.core.model import (
    MXFP,
    NF4,
    OP_ADD,
    ROLE_BASE,
    ROLE_CORRECTION,
    RULE_OVERLAY,
    BufferHandle,
    CompositeHead,
    CompositeMember,
    Descriptor,
    PerBlockAffine,
    PerChannelAffine,
    Shard,
)
from hurray_interop.dequant import dequantize
from hurray_interop.errors import ConversionRefused, FormatError, HurrayInteropError
from hurray_interop.formats import gguf as G
from hurray_interop.tables import load_table

# ---------------------------------------------------------------------------
# helpers


def roundtrip_bytes(src: Path, tmp: Path) -> bytes:
    """GGUF → .hrry → GGUF with the library API; the re-exported file's bytes."""
    mid, back = tmp / (src.stem + ".hrry"), tmp / (src.stem + ".back.gguf")
    gguf_to_hurray(src, mid)
    hurray_to_gguf(mid, back)
    return back.read_bytes()


def assert_same_bytes(a: bytes, b: bytes) -> None:
    if a != b:
        n = min(len(a), len(b))
        first = next((i for i in range(n) if a[i] != b[i]), n)
        pytest.fail(f"files differ: sizes {len(a)} vs {len(b)}, first difference at byte {first}")


def gguf_py_values(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """gguf-py's decoded float32 values of every tensor of a GGUF file (numpy order)."""
    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        tt = t.tensor_type
        if tt in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F64,
                  gguf.GGMLQuantizationType.I8, gguf.GGMLQuantizationType.I16, gguf.GGMLQuantizationType.I32,
                  gguf.GGMLQuantizationType.I64):
            vals = np.asarray(t.data).astype(np.float32)
        else:
            vals = gguf.quants.dequantize(np.asarray(t.data), tt)
        out[t.name] = (tt.name, np.asarray(vals, dtype=np.float32).reshape(shape))
    return out


def assert_bitwise(ours: np.ndarray, ref: np.ndarray, *, signed_zero_equal: bool = False, what: str = "") -> None:
    assert ours.shape == ref.shape, what
    a = np.ascontiguousarray(ours, dtype=np.float32).reshape(-1).view(np.uint32)
    b = np.ascontiguousarray(ref, dtype=np.float32).reshape(-1).view(np.uint32)
    diff = a != b
    if signed_zero_equal:
        diff &= ~(((a << 1) == 0) & ((b << 1) == 0))
    if diff.any():
        i = int(np.argmax(diff))
        pytest.fail(f"{what}: element {i} differs: ours {a[i]:#010x} vs reference {b[i]:#010x} ({diff.sum()} in all)")


# ---------------------------------------------------------------------------
# GGUF → Hurray → GGUF, byte for byte


@pytest.mark.parametrize("name", ["tiny-llama.gguf", "kv-types.gguf"])
def test_fixture_roundtrip_is_byte_identical(fixtures_dir: Path, tmp_path: Path, name: str) -> None:
    src = fixtures_dir / name
    assert_same_bytes(roundtrip_bytes(src, tmp_path), src.read_bytes())


def test_llama_cpp_samples_roundtrip_byte_identical(gguf_samples_dir: Path, tmp_path: Path) -> None:
    files = sorted(gguf_samples_dir.glob("*.gguf"))
    assert len(files) >= 3, files
    versions = set()
    for i, src in enumerate(files):
        raw = src.read_bytes()
        versions.add(struct.unpack_from("<I", raw, 4)[0])
        sub = tmp_path / str(i)
        sub.mkdir()
        assert_same_bytes(roundtrip_bytes(src, sub), raw)
    assert 2 in versions and 3 in versions  # the samples really cover GGUF v2 and v3


def test_every_kv_type_written_by_gguf_py(tmp_path: Path) -> None:
    src = write_gguf_py(tmp_path / "kv.gguf", [TensorDef("w", "Q8_0", (2, 64))], kv=every_kv_gguf_py())
    # the file holds what we meant: every integer width and a nested array, per gguf-py's reader
    r = gguf.GGUFReader(str(src))
    types = {f.name: f.types for f in r.fields.values()}
    for vt in (GV.UINT8, GV.INT8, GV.UINT16, GV.INT16, GV.UINT32, GV.INT32, GV.UINT64, GV.INT64):
        assert types[f"test.{vt.name.lower()}.max"] == [vt]
        assert types[f"test.array.{vt.name.lower()}"] == [GV.ARRAY, vt]
    assert types["test.array.nested.i32"][:2] == [GV.ARRAY, GV.ARRAY]
    del r
    assert_same_bytes(roundtrip_bytes(src, tmp_path), src.read_bytes())


def test_empty_strings_empty_and_nested_arrays_not_utf8(tmp_path: Path) -> None:
    src = write_gguf_stream(tmp_path / "kv.gguf", [TensorDef("w", "Q4_0", (64,))], kv=every_kv_values())
    r = gguf.GGUFReader(str(src))  # an independent reader accepts the file
    f = r.fields["s.string.empty"]
    assert f.types == [GV.STRING] and bytes(f.parts[-1]) == b""
    # parts: key length, key, ARRAY, element type, count
    assert [int(p[0]) for p in r.fields["e.array"].parts[2:]] == [GV.ARRAY, GV.ARRAY, 0]
    assert [int(p[0]) for p in r.fields["e.uint32"].parts[2:]] == [GV.ARRAY, GV.UINT32, 0]
    assert r.fields["n.deep"].types == [GV.ARRAY, GV.ARRAY, GV.ARRAY, GV.INT64]
    del r
    assert_same_bytes(roundtrip_bytes(src, tmp_path), src.read_bytes())


def test_all_tensor_types_with_zero_blocks_1d_to_4d(tmp_path: Path) -> None:
    defs = all_types_defs()
    src = write_gguf_py(tmp_path / "types.gguf", defs)
    r = gguf.GGUFReader(str(src))
    got = {t.name: (t.tensor_type.name, len(t.shape)) for t in r.tensors}
    del r
    assert {d.name: (d.type, len(d.shape)) for d in defs} == got
    # zero blocks really present: every block type's 2-D tensor has blocks with scale 0
    mid = tmp_path / "types.hrry"
    report = gguf_to_hurray(src, mid)
    subst = {t.name: t.substituted_blocks for t in report.tensors}
    for t in BLOCK_TYPES:
        assert subst[f"t.{t.lower()}.2d"] >= 2, t
    back = tmp_path / "back.gguf"
    hurray_to_gguf(mid, back)
    assert_same_bytes(back.read_bytes(), src.read_bytes())


@pytest.mark.parametrize("shape", [(32,), (1, 32), (1, 1, 1, 32)])
def test_single_block_all_zero_mxfp4_tensor(tmp_path: Path, shape: tuple[int, ...]) -> None:
    """One MXFP4 block with E8M0 scale 0 (an all-zero 32-element tensor, e.g. a zero bias):
    the scale must be substituted and recorded like any other zero block."""
    src = write_gguf_py(tmp_path / "z.gguf", [TensorDef("z", "MXFP4", shape)])
    r = gguf.GGUFReader(str(src))
    assert np.asarray(r.tensors[0].data).reshape(-1)[0] == 0  # E8M0 byte 0
    del r
    assert_same_bytes(roundtrip_bytes(src, tmp_path), src.read_bytes())


def test_many_small_tensors(tmp_path: Path) -> None:
    defs = [TensorDef(f"blk.{i}.w", ALL_TYPES[i % len(ALL_TYPES)], (1 + i % 3, 64)) for i in range(300)]
    src = write_gguf_py(tmp_path / "many.gguf", defs, seed=3)
    assert_same_bytes(roundtrip_bytes(src, tmp_path), src.read_bytes())


@pytest.mark.parametrize("alignment", [8, 64, 256, 4096])
def test_unusual_alignments(tmp_path: Path, alignment: int) -> None:
    defs = [TensorDef("a", "F32", (3,)), TensorDef("b", "Q5_1", (2, 32)), TensorDef("c", "I16", (5,)),
            TensorDef("d", "MXFP4", (64,))]
    src = write_gguf_py(tmp_path / "al.gguf", defs, alignment=alignment)
    r = gguf.GGUFReader(str(src))
    assert r.alignment == alignment and all(t.data_offset % alignment == 0 for t in r.tensors)
    del r
    assert_same_bytes(roundtrip_bytes(src, tmp_path), src.read_bytes())


@pytest.mark.parametrize("version,pad_end,alignment", [(2, False, 32), (2, True, 64), (3, False, 8), (3, 3, 16)])
def test_stream_written_versions_and_tails(tmp_path: Path, version: int, pad_end: bool | int, alignment: int) -> None:
    defs = [TensorDef("x", "Q8_0", (1, 32)), TensorDef("y", "F16", (3,))]  # 6 bytes: the end is unaligned
    src = write_gguf_stream(tmp_path / "v.gguf", defs, kv=every_kv_values()[:5], version=version,
                            pad_end=pad_end, alignment=alignment)
    raw = src.read_bytes()
    assert struct.unpack_from("<I", raw, 4)[0] == version
    assert_same_bytes(roundtrip_bytes(src, tmp_path), raw)


def test_metadata_only_file(tmp_path: Path) -> None:
    src = write_gguf_stream(tmp_path / "empty.gguf", [], kv=every_kv_values())
    assert_same_bytes(roundtrip_bytes(src, tmp_path), src.read_bytes())


# ---------------------------------------------------------------------------
# Hurray → GGUF → Hurray


def cpu(n: int) -> BufferHandle:
    return BufferHandle.cpu(n)


def pb(shape: tuple[int, ...], storage: str, *, zp: bool = False, block: int = 32, scale: str = "float16",
       shard: bool = False, role: int | None = None) -> Descriptor:
    n = int(np.prod(shape))
    nb = n // block
    st = element_type(scale)
    bufs = [cpu(buffer_size(element_type(storage), n)), cpu(nb * st.dtype.itemsize if st.dtype is not None else nb * 2)]
    if zp:
        bufs.append(cpu(nb * 4))
    return Descriptor(
        element_type=element_type(storage),
        shape=shape,
        buffers=tuple(bufs),
        quantization=PerBlockAffine(axis=len(shape) - 1, block_size=block, scale_buffer_index=1,
                                    zero_point_buffer_index=2 if zp else None, scale_type=st),
        shard=Shard(parent_shape=shape, offset=(0,) * len(shape)) if shard else None,
        composite_member=CompositeMember(role) if role is not None else None,
    )


def f16_scales(rng: np.random.Generator, nb: int) -> bytes:
    s = rng.uniform(1e-3, 0.2, nb).astype(np.float16)
    s[1::3] *= np.float16(-1)  # negative scales are legal Hurray and legal GGML
    return s.tobytes()


def pow2_scales(rng: np.random.Generator, nb: int) -> np.ndarray:
    """f16 scales k·2⁻¹⁰ (k = 1..15): with integer zero points 0..15 the minimum −z·d is f16-exact."""
    return (rng.integers(1, 16, nb) * 2.0**-10).astype(np.float16)


def build_exportable(path: Path, seed: int = 1) -> dict[str, str]:
    """A .hrry holding one tensor of every exportable kind.  Returns {name: expected GGML type}."""
    rng = np.random.default_rng(seed)
    overlay = load_table("gguf_hurray")["overlay"]
    expect: dict[str, str] = {}
    with HrryWriter(path) as w:
        shape = (3, 64)
        nb = 6
        # per-block int8 symmetric K=32 f16 → Q8_0 (every int8 code)
        codes = np.arange(192, dtype=np.int64).astype(np.uint8).tobytes()
        w.write("sym8", pb(shape, "int8"), [codes, f16_scales(rng, nb)])
        expect["sym8"] = "Q8_0"
        # per-block int4 symmetric → Q4_0 (every nibble)
        w.write("sym4", pb(shape, "int4"), [rng.integers(0, 256, 96, dtype=np.uint8).tobytes(), f16_scales(rng, nb)])
        expect["sym4"] = "Q4_0"
        # 4-D int8 symmetric
        w.write("sym8_4d", pb((2, 1, 2, 32), "int8"), [rng.integers(0, 256, 128, dtype=np.uint8).tobytes(),
                                                        f16_scales(rng, 4)])
        expect["sym8_4d"] = "Q8_0"
        # uint4 with integer zero points, minimum f16-exact → Q4_1
        zp = rng.integers(0, 16, nb).astype("<i4")
        zp[0] = 0
        w.write("asym4", pb(shape, "uint4", zp=True),
                [rng.integers(0, 256, 96, dtype=np.uint8).tobytes(), pow2_scales(rng, nb).tobytes(), zp.tobytes()])
        expect["asym4"] = "Q4_1"
        # uint8 codes 0..31 with integer zero points → Q5_1
        w.write("asym5", pb(shape, "uint8", zp=True),
                [rng.integers(0, 32, 192, dtype=np.uint8).tobytes(), pow2_scales(rng, nb).tobytes(),
                 rng.integers(0, 32, nb).astype("<i4").tobytes()])
        expect["asym5"] = "Q5_1"
        # MXFP float4_e2m1 block 32 → MXFP4 (every code incl. 8 = −0; scales 1..254)
        mx_codes = rng.integers(0, 256, 96, dtype=np.uint8)
        mx_codes[:8] = np.arange(0, 256, 0x22, dtype=np.uint8)[:8]  # code pairs 0x00, 0x22, … 0xEE
        mx_codes[8:16] = 0x88
        w.write("mxfp4", Descriptor(element_type("float4_e2m1"), shape, (cpu(96), cpu(nb)),
                                    quantization=MXFP(axis=1, block_size=32, scale_buffer_index=1)),
                [mx_codes.tobytes(), rng.integers(1, 255, nb, dtype=np.uint8).tobytes()])
        expect["mxfp4"] = "MXFP4"
        # plain types as themselves
        for et, gt, arr in [
            ("float32", "F32", rng.standard_normal(7).astype(np.float32)),
            ("float16", "F16", rng.standard_normal((2, 3)).astype(np.float16)),
            ("bfloat16", "BF16", rng.standard_normal(5).astype(ml_dtypes.bfloat16)),
            ("float64", "F64", rng.standard_normal((1, 2, 3)).astype(np.float64)),
            ("int8", "I8", rng.integers(-128, 128, 9).astype(np.int8)),
            ("int16", "I16", rng.integers(-(2**15), 2**15, 4).astype(np.int16)),
            ("int32", "I32", rng.integers(-(2**31), 2**31, 4).astype(np.int32)),
            ("int64", "I64", rng.integers(-(2**62), 2**62, 2).astype(np.int64)),
        ]:
            w.write(f"plain_{et}", Descriptor(element_type(et), arr.shape, (cpu(arr.nbytes),)), [arr.tobytes()])
            expect[f"plain_{et}"] = gt
        # the exact minimum overlay: uint4 base + uint2 correction (constant minimum per block) → Q4_1
        for name, storage, gt, cbytes in [("ovl4", "uint4", "Q4_1", rng.integers(0, 256, 96, dtype=np.uint8)),
                                          ("ovl5", "uint8", "Q5_1", rng.integers(0, 32, 192, dtype=np.uint8))]:
            head = Descriptor(element_type("float32"), shape, (),
                              layout=CompositeHead(composition_rule=RULE_OVERLAY, combine_op=OP_ADD, member_count=2))
            mins = rng.uniform(-0.3, -0.01, nb).astype(np.float16)  # not integer multiples of d: stays an overlay
            ccodes = np.full((nb, 8), 0x55, np.uint8)
            ccodes[2] = 0  # a block whose minimum is 0: codes 0, scale +1 (as the importer writes it)
            mins[2] = np.float16(1.0)
            w.write_composite(name, head, [
                (name + overlay["base_suffix"], pb(shape, storage, shard=True, role=ROLE_BASE),
                 [cbytes.tobytes(), np.abs(np.frombuffer(f16_scales(rng, nb), np.float16)).tobytes()]),
                (name + overlay["correction_suffix"], pb(shape, "uint2", shard=True, role=ROLE_CORRECTION),
                 [ccodes.tobytes(), mins.tobytes()]),
            ])
            expect[name] = gt
        w.finish({"general.name": "built by test_export_gguf", "answer": 42})
    return expect


def assert_same_tensor(a, b, what: str) -> None:
    assert a.descriptor == b.descriptor, what
    assert len(a.data) == len(b.data), what
    for i, (x, y) in enumerate(zip(a.data, b.data)):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), f"{what}: buffer {i} differs"
    assert [m.name for m in a.members] == [m.name for m in b.members], what
    for x, y in zip(a.members, b.members):
        assert_same_tensor(x, y, f"{what}/{x.name}")


def test_hurray_gguf_hurray_keeps_every_buffer(tmp_path: Path) -> None:
    src, out, back = tmp_path / "src.hrry", tmp_path / "out.gguf", tmp_path / "back.hrry"
    expect = build_exportable(src)
    report = hurray_to_gguf(src, out)
    assert {t.name: t.mapping for t in report.tensors} == expect
    r = gguf.GGUFReader(str(out))
    assert {t.name: t.tensor_type.name for t in r.tensors} == expect  # gguf-py sees the intended types
    del r
    gguf_to_hurray(out, back)
    with HrryFile(src) as a, HrryFile(back) as b:
        assert list(b.top_level_names()) == list(a.top_level_names())
        for name in a.top_level_names():
            assert_same_tensor(a.tensor(name), b.tensor(name), name)


def test_exported_gguf_dequantizes_like_our_dequantizer(tmp_path: Path) -> None:
    src, out = tmp_path / "src.hrry", tmp_path / "out.gguf"
    expect = build_exportable(src, seed=2)
    hurray_to_gguf(src, out)
    ref = gguf_py_values(out)
    assert set(ref) == set(expect)
    with HrryFile(src) as hf:
        for name in expect:
            tt, vals = ref[name]
            ours = dequantize(hf.tensor(name))
            assert_bitwise(ours, vals, signed_zero_equal=tt == "MXFP4", what=name)
    # the MXFP4 exception is real and only that: −0 (code 8) from us, +0 from ggml
    with HrryFile(src) as hf:
        ours = dequantize(hf.tensor("mxfp4")).reshape(-1)
    theirs = ref["mxfp4"][1].reshape(-1)
    neg0 = np.signbit(ours) & (ours == 0)
    assert neg0.any() and not np.signbit(theirs[neg0]).any()


def test_kv_of_native_hurray_file_follows_the_documented_mapping(tmp_path: Path) -> None:
    src, out = tmp_path / "n.hrry", tmp_path / "n.gguf"
    with HrryWriter(src) as w:
        w.write("x", Descriptor(element_type("float32"), (2,), (cpu(8),)), [np.float32([1, 2]).tobytes()])
        w.finish({
            "s": "text ü", "i": -5, "f": 0.1, "b": True, "raw": b"\x00\xff",
            "ints": [1, -2, 3], "strs": ["a", ""], "floats": [0.5, -0.0], "bools": [True, False],
        })
    hurray_to_gguf(src, out)
    r = gguf.GGUFReader(str(out))
    f = r.fields
    got = {k: f[k].types for k in ("s", "i", "f", "b", "raw", "ints", "strs", "floats", "bools")}
    assert got == {
        "s": [GV.STRING], "i": [GV.INT64], "f": [GV.FLOAT64], "b": [GV.BOOL], "raw": [GV.ARRAY, GV.UINT8],
        "ints": [GV.ARRAY, GV.INT64], "strs": [GV.ARRAY, GV.STRING], "floats": [GV.ARRAY, GV.FLOAT64],
        "bools": [GV.ARRAY, GV.BOOL],
    }
    assert f["s"].contents() == "text ü" and f["i"].contents() == -5 and f["f"].contents() == 0.1
    assert f["raw"].contents() == [0, 255] and f["strs"].contents() == ["a", ""]
    assert list(r.fields)[-9:] == ["s", "i", "f", "b", "raw", "ints", "strs", "floats", "bools"]
    assert [t.name for t in r.tensors] == ["x"]
    assert r.tensors[0].data.tolist() == [1.0, 2.0]


def test_pyhurray_saved_file_exports(tmp_path: Path) -> None:
    hurray = pytest.importorskip("hurray")
    rng = np.random.default_rng(5)
    codes = rng.integers(-128, 128, 128).astype(np.int8)
    scales = rng.uniform(0.01, 1, 4).astype(np.float16)
    q = hurray.PerBlockAffine.symmetric(1, 32, 1, hurray.dtype.float16)
    t = hurray.Tensor(codes.tobytes(), hurray.dtype.int8, [2, 64], quantization=q, aux_buffers=[scales.tobytes()])
    plain = hurray.Tensor(np.float32([1.5, -2]).tobytes(), hurray.dtype.float32, [2])
    src, out = tmp_path / "py.hrry", tmp_path / "py.gguf"
    hurray.save(str(src), {"q": t, "p": plain}, kv={"general.name": "pyhurray"})
    hurray_to_gguf(src, out)
    r = gguf.GGUFReader(str(out))
    got = {x.name: x for x in r.tensors}
    assert got["q"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    blocks = np.asarray(got["q"].data).reshape(-1, 34)
    # Q8_0 block = f16 d, then 32 int8 codes: exactly pyhurray's buffers
    assert blocks[:, :2].tobytes() == scales.tobytes()
    assert blocks[:, 2:].tobytes() == codes.tobytes()
    vals = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0).reshape(2, 64)
    expect = (codes.astype(np.float32).reshape(4, 32) * scales.astype(np.float32)[:, None]).reshape(2, 64)
    assert_bitwise(vals, expect, what="q")
    assert got["p"].data.tolist() == [1.5, -2.0]
    assert r.fields["general.name"].contents() == "pyhurray"
    del r
    # and back into Hurray: pyhurray reads the same buffers and descriptors it wrote
    back = tmp_path / "back.hrry"
    gguf_to_hurray(out, back)
    a, b = hurray.load(str(src)), hurray.load(str(back))
    for name in ("q", "p"):
        x, y = a[name], b[name]
        assert x.descriptor.encode() == y.descriptor.encode(), name
        assert [np.asarray(x.buffer(i)).tobytes() for i in range(x.buffer_count)] == [
            np.asarray(y.buffer(i)).tobytes() for i in range(y.buffer_count)
        ], name


# ---------------------------------------------------------------------------
# refusals and fallbacks


def build_refusable(path: Path) -> dict[str, str]:
    """One tensor of each kind with no GGML equivalent.  Returns {name: reason pattern}."""
    rng = np.random.default_rng(9)
    shape = (2, 64)
    with HrryWriter(path) as w:
        w.write("bf16_scales", pb(shape, "int8", scale="bfloat16"),
                [rng.integers(0, 256, 128, dtype=np.uint8).tobytes(),
                 rng.uniform(0.01, 1, 4).astype(ml_dtypes.bfloat16).tobytes()])
        w.write("block64", pb(shape, "int8", block=64),
                [rng.integers(0, 256, 128, dtype=np.uint8).tobytes(), f16_scales(rng, 2)])
        w.write("nf4", Descriptor(element_type("uint4"), shape, (cpu(64), cpu(16)),
                                  quantization=NF4(axis=1, block_size=32, scale_buffer_index=1)),
                [rng.integers(0, 256, 64, dtype=np.uint8).tobytes(), rng.uniform(0.1, 1, 4).astype(np.float32).tobytes()])
        w.write("per_channel", Descriptor(element_type("int8"), shape, (cpu(128), cpu(8)),
                                          quantization=PerChannelAffine(axis=0, scale_buffer_index=1)),
                [rng.integers(0, 256, 128, dtype=np.uint8).tobytes(), rng.uniform(0.1, 1, 2).astype(np.float32).tobytes()])
        w.write("mxfp8", Descriptor(element_type("float8_e4m3"), shape, (cpu(128), cpu(4)),
                                    quantization=MXFP(axis=1, block_size=32, scale_buffer_index=1)),
                [rng.integers(0, 0x7E, 128, dtype=np.uint8).tobytes(), rng.integers(100, 140, 4, dtype=np.uint8).tobytes()])
        # uint4 with zero points whose minimum −z·d is not an f16 number
        zp_scales = np.float16([0.1, 0.3, 0.7, 0.11])
        w.write("inexact_min", pb(shape, "uint4", zp=True),
                [rng.integers(0, 256, 64, dtype=np.uint8).tobytes(), zp_scales.tobytes(), np.int32([7, 9, 3, 5]).tobytes()])
        w.write("ok", Descriptor(element_type("float32"), (2,), (cpu(8),)), [np.float32([3, 4]).tobytes()])
        w.finish()
    return {
        "bf16_scales": "no GGML type", "block64": "no GGML type", "nf4": "no GGML type",
        "per_channel": "no GGML type", "mxfp8": "MXFP other than float4_e2m1", "inexact_min": "f16-exact minimum",
    }


def test_non_exportable_tensors_are_refused_with_reasons(tmp_path: Path) -> None:
    src, out = tmp_path / "r.hrry", tmp_path / "r.gguf"
    expect = build_refusable(src)
    with pytest.raises(ConversionRefused, match=r"6 tensor\(s\) have no exact GGML equivalent") as ei:
        hurray_to_gguf(src, out)
    reasons = {name: reason for name, _, reason in ei.value.reasons}
    assert set(reasons) == set(expect)
    for name, pattern in expect.items():
        assert pattern in reasons[name], (name, reasons[name])
    assert not out.exists()
    # dry run: the same plan, nothing written
    report = hurray_to_gguf(src, out, dry_run=True)
    assert {t.name for t in report.refused} == set(expect) and not out.exists()


def test_cli_refusal_names_each_tensor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "r.hrry", tmp_path / "r.gguf"
    expect = build_refusable(src)
    assert main(["convert", str(src), str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    for name in expect:
        assert f"tensor {name!r}" in err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("fallback", ["float32", "float16", "bfloat16"])
def test_fallback_exports_dequantized_values(tmp_path: Path, capsys: pytest.CaptureFixture[str], fallback: str) -> None:
    src, out = tmp_path / "r.hrry", tmp_path / "r.gguf"
    expect = build_refusable(src)
    assert main(["convert", str(src), str(out), "--fallback", fallback, "--quiet"]) == 0
    gtype = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}[fallback]
    r = gguf.GGUFReader(str(out))
    got = {t.name: t for t in r.tensors}
    assert [t.name for t in r.tensors] == list(expect) + ["ok"]
    with HrryFile(src) as hf:
        for name in expect:
            t = got[name]
            assert t.tensor_type.name == gtype, name
            ours = dequantize(hf.tensor(name))
            if fallback == "bfloat16":
                stored = np.asarray(t.data).reshape(-1).view(ml_dtypes.bfloat16).astype(np.float32)
                want = ours.astype(ml_dtypes.bfloat16).astype(np.float32)
            else:
                stored = np.asarray(t.data).astype(np.float32)
                want = ours.astype(np.float16).astype(np.float32) if fallback == "float16" else ours
            assert_bitwise(stored.reshape(ours.shape), want, what=name)
    assert got["ok"].tensor_type.name == "F32" and got["ok"].data.tolist() == [3.0, 4.0]


# ---------------------------------------------------------------------------
# more layouts and properties


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    types=st.lists(st.sampled_from(ALL_TYPES), min_size=0, max_size=6),
    ranks=st.lists(st.integers(1, 4), min_size=6, max_size=6),
    alignment=st.sampled_from([1, 2, 8, 32, 64, 512]),
    version=st.sampled_from([2, 3]),
    pad_end=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_random_files_roundtrip(tmp_path: Path, types: list[str], ranks: list[int], alignment: int,
                                         version: int, pad_end: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    defs = []
    for i, t in enumerate(types):
        lead = tuple(int(x) for x in rng.integers(1, 4, ranks[i] - 1))
        defs.append(TensorDef(f"t{i}", t, lead + (32 * int(rng.integers(1, 4)),), zero_blocks=bool(rng.integers(0, 2))))
    sub = tmp_path / f"p{seed}-{alignment}-{version}-{len(types)}-{int(pad_end)}"
    sub.mkdir(exist_ok=True)
    src = write_gguf_stream(sub / "p.gguf", defs, kv=every_kv_values()[: int(rng.integers(1, 12))],
                            alignment=alignment, version=version, pad_end=pad_end, seed=seed)
    for f in ("p.hrry", "p.back.gguf"):
        (sub / f).unlink(missing_ok=True)
    assert_same_bytes(roundtrip_bytes(src, sub), src.read_bytes())


def test_tensor_infos_out_of_data_order_and_gaps(tmp_path: Path) -> None:
    """Recorded offsets are honoured: infos listed in reverse data order, with a gap."""
    rng = np.random.default_rng(4)
    x = quants_of("Q8_0", rng, (2, 32))
    y = rng.standard_normal(5).astype(np.float32)
    specs = [G.TensorSpec("y", int(gguf.GGMLQuantizationType.F32), (5,), 0),
             G.TensorSpec("x", int(gguf.GGMLQuantizationType.Q8_0), (32, 2), 128)]
    src = tmp_path / "order.gguf"
    with G.GGUFWriterStream(src, kv=[("general.architecture", G.GGUFValue.of(G.ValueType.STRING, "t"))],
                            tensors=specs) as w:
        data = {"x": x, "y": y}
        for spec in w.tensors_in_file_order:
            w.write_tensor_data(data[spec.name].view(np.uint8).reshape(-1))
    r = gguf.GGUFReader(str(src))
    assert [t.name for t in r.tensors] == ["y", "x"] and r.tensors[1].data_offset - r.tensors[0].data_offset == 128
    del r
    assert_same_bytes(roundtrip_bytes(src, tmp_path), src.read_bytes())


def quants_of(t: str, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return gguf.quants.quantize((rng.standard_normal(shape) * 0.1).astype(np.float32), gguf.GGMLQuantizationType[t])


def test_mxfp4_negative_zero_codes_survive(tmp_path: Path) -> None:
    """MXFP4 code 8 (−0 in OCP, +0 in ggml) round-trips byte for byte and compares equal."""
    blocks = np.zeros((3, 17), np.uint8)
    blocks[:, 0] = [127, 120, 130]
    blocks[:, 1:] = [[0x88] * 16, [0x80, 0x08] * 8, [0x18, 0x8F] * 8]
    src = tmp_path / "mx.gguf"
    w = gguf.GGUFWriter(str(src), "t")
    w.add_tensor("m", blocks.reshape(1, -1), raw_dtype=gguf.GGMLQuantizationType.MXFP4)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    assert_same_bytes(roundtrip_bytes(src, tmp_path), src.read_bytes())
    with HrryFile(tmp_path / "mx.hrry") as hf:
        ours = dequantize(hf.tensor("m"))
    theirs = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.MXFP4).reshape(ours.shape)
    assert np.signbit(ours).sum() > 0 and np.array_equal(ours, theirs)
    assert_bitwise(ours, theirs, signed_zero_equal=True, what="m")


def test_recorded_q5_0_with_codes_out_of_range_is_refused(fixtures_dir: Path, tmp_path: Path) -> None:
    """Q5_0 in the int8 form (files of earlier versions; tensors the compact form cannot hold)."""
    mid, out = tmp_path / "m.hrry", tmp_path / "o.gguf"
    mid.write_bytes((fixtures_dir / "legacy" / "tiny-llama.hrry").read_bytes())
    name = "blk.0.attn_output.weight"  # Q5_0 → int8 codes in [−16, 15]
    with HrryFile(mid) as hf:
        at = hf.entry(name).data_offset
        assert int(np.asarray(hf.tensor(name).data[0]).view(np.int8).max()) <= 15
    raw = bytearray(mid.read_bytes())
    raw[at + 40] = 0x40  # code 64
    mid.write_bytes(bytes(raw))
    with pytest.raises(ConversionRefused) as ei:
        hurray_to_gguf(mid, out)
    assert [(n, r) for n, _, r in ei.value.reasons] == [(name, "int8 codes outside Q5_0's range")]
    assert not out.exists()


def test_rank_5_tensor_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "r5.hrry"
    with HrryWriter(src) as w:
        w.write("r5", Descriptor(element_type("float32"), (1, 1, 1, 1, 2), (cpu(8),)), [np.float32([1, 2]).tobytes()])
        w.finish()
    with pytest.raises(ConversionRefused) as ei:
        hurray_to_gguf(src, tmp_path / "r5.gguf")
    assert "rank > 4" in ei.value.reasons[0][2]


def test_cli_convert_back_and_dry_run(fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = fixtures_dir / "tiny-llama.gguf"
    mid, out = tmp_path / "m.hrry", tmp_path / "o.gguf"
    assert main(["convert", str(src), str(mid), "--quiet"]) == 0
    assert main(["convert", str(mid), str(out), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "would convert" in plan and not out.exists()
    assert "blk.0.attn_v.weight" in plan and "Q4_1" in plan
    assert main(["convert", str(mid), str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [t["mapping"] for t in rep["tensors"]][:5] == ["Q8_0", "F32", "Q8_0", "Q4_0", "Q4_1"]
    assert out.read_bytes() == src.read_bytes()
    # an existing destination is not overwritten without --force
    before = out.read_bytes()
    assert main(["convert", str(mid), str(out), "--quiet"]) == 2
    assert out.read_bytes() == before
    assert main(["convert", str(mid), str(out), "--quiet", "--force"]) == 0


def test_export_progress_reaches_total(fixtures_dir: Path, tmp_path: Path) -> None:
    mid = tmp_path / "m.hrry"
    gguf_to_hurray(fixtures_dir / "tiny-llama.gguf", mid)
    calls: list[tuple[int, int]] = []
    report = hurray_to_gguf(mid, tmp_path / "o.gguf", progress=lambda d, t: calls.append((d, t)))
    total = sum(t.bytes_out for t in report.tensors)
    assert calls and calls[-1] == (total, total)
    assert all(b[0] >= a[0] for a, b in itertools.pairwise(calls))
    r = gguf.GGUFReader(str(tmp_path / "o.gguf"))
    assert total == sum(int(t.n_bytes) for t in r.tensors)


def test_kv_of_native_hurray_file_empty_and_wide_values(tmp_path: Path) -> None:
    src, out = tmp_path / "n.hrry", tmp_path / "n.gguf"
    with HrryWriter(src) as w:
        w.write("x", Descriptor(element_type("float32"), (1,), (cpu(4),)), [np.float32([1]).tobytes()])
        w.finish({
            "u": KVValue.uint64(2**64 - 1), "imin": -(2**63), "empty_s": "", "empty_b": b"",
            "e_u64": KVValue.array("uint64", []), "e_str": KVValue.array("string", []),
            "e_bytes": KVValue.array("bytes", []), "bytes_list": [b"ab", b""],
        })
    hurray_to_gguf(src, out)
    r = gguf.GGUFReader(str(out))
    f = r.fields
    assert f["u"].types == [GV.UINT64] and f["u"].contents() == 2**64 - 1
    assert f["imin"].types == [GV.INT64] and f["imin"].contents() == -(2**63)
    assert f["empty_s"].types == [GV.STRING] and bytes(f["empty_s"].parts[-1]) == b""
    # empty arrays keep their element type: parts = key length, key, ARRAY, element type, count 0
    elem = {k: [int(p[0]) for p in f[k].parts[2:]] for k in ("empty_b", "e_u64", "e_str", "e_bytes")}
    assert elem == {"empty_b": [GV.ARRAY, GV.UINT8, 0], "e_u64": [GV.ARRAY, GV.UINT64, 0],
                    "e_str": [GV.ARRAY, GV.STRING, 0], "e_bytes": [GV.ARRAY, GV.ARRAY, 0]}
    assert f["bytes_list"].types[:3] == [GV.ARRAY, GV.ARRAY, GV.UINT8]
    del r


def test_native_hurray_file_with_general_alignment_exports(tmp_path: Path) -> None:
    """A .hrry not from GGUF whose KV holds ``general.alignment`` (a plain int, as pyhurray
    and every Python writer store it): the exporter honours it, and GGUF requires it UINT32."""
    src, out = tmp_path / "a.hrry", tmp_path / "a.gguf"
    with HrryWriter(src) as w:
        w.write("x", Descriptor(element_type("float32"), (3,), (cpu(12),)), [np.float32([1, 2, 3]).tobytes()])
        w.write("y", Descriptor(element_type("int8"), (5,), (cpu(5),)), [np.int8([1, 2, 3, 4, 5]).tobytes()])
        w.finish({"general.alignment": 64})
    hurray_to_gguf(src, out)
    r = gguf.GGUFReader(str(out))
    assert r.fields["general.alignment"].types == [GV.UINT32]
    assert r.alignment == 64 and all(t.data_offset % 64 == 0 for t in r.tensors)
    assert [t.data.tolist() for t in r.tensors] == [[1.0, 2.0, 3.0], [1, 2, 3, 4, 5]]


def test_exported_native_file_is_a_standard_gguf(tmp_path: Path) -> None:
    """What the exporter writes from a native .hrry round-trips through Hurray byte for byte."""
    from hurray_interop._verify import verify_roundtrip

    src, out = tmp_path / "src.hrry", tmp_path / "out.gguf"
    build_exportable(src, seed=7)
    hurray_to_gguf(src, out)
    res = verify_roundtrip(out)
    assert res.ok and res.file_bytes_equal, res.summary_line()


def test_q4_1_with_integer_minima_roundtrips_through_zero_points(tmp_path: Path) -> None:
    """Q4_1 whose minima are integer multiples of d maps to plain uint4 + int32 zero points
    (docs/conversion-rules.md § 2 (a)) and comes back byte for byte; gguf-py decodes the blocks as built."""
    rng = np.random.default_rng(12)
    d = rng.integers(1, 16, 6) * 2.0**-10
    z = rng.integers(1, 16, 6)
    codes = rng.integers(0, 16, (6, 32))
    blocks = q4_1_blocks(d, -z * d, codes)
    ref = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_1)
    assert np.array_equal(ref, (d[:, None] * (codes - z[:, None])).astype(np.float32))
    src = write_gguf_raw(tmp_path / "zp.gguf", [("zp", "Q4_1", (3, 64), blocks),
                                                ("neg0", "Q8_0", (96,), q8_0_blocks([-0.0, 0.0, 0.5],
                                                 np.r_[np.zeros((2, 32)), rng.integers(-128, 128, (1, 32))]))])
    mid = tmp_path / "zp.hrry"
    report = gguf_to_hurray(src, mid)
    assert "zero-point" in report.tensors[0].mapping
    assert report.tensors[1].substituted_blocks == 2  # −0 and +0 scales on all-zero blocks
    with HrryFile(mid) as hf:
        t = hf.tensor("zp")
        assert t.descriptor.quantization.zero_point_buffer_index == 2
        assert np.asarray(t.data[2]).view("<i4").tolist() == z.tolist()
        assert_bitwise(dequantize(t), ref.reshape(3, 64), what="zp")
    back = tmp_path / "back.gguf"
    hurray_to_gguf(mid, back)
    assert_same_bytes(back.read_bytes(), src.read_bytes())


# ---------------------------------------------------------------------------
# tampered conversion records: a typed error that names the file, nothing written


def rewrite_hrry(src: Path, dst: Path, edit, drop: tuple[str, ...] = ()) -> Path:
    """Copy a .hrry with its KV passed through ``edit(dict) -> dict`` (and tensors dropped)."""
    with HrryFile(src) as hf:
        kv = edit(dict(hf.kv))
        with HrryWriter(dst) as w:
            for n in hf.top_level_names():
                if n not in drop:
                    w.write_tensor(hf.tensor(n))
            w.finish(kv)
    return dst


def _set(key: str, value):
    def edit(kv):
        kv[key] = value
        return kv

    return edit


def _types(fn):
    def edit(kv):
        kv["hurray_interop.gguf.kv_types"] = KVValue.array("string", fn(list(kv["hurray_interop.gguf.kv_types"].value)))
        return kv

    return edit


def _tensors(fn):
    def edit(kv):
        kv["hurray_interop.gguf.tensors"] = KVValue.string(json.dumps(fn(json.loads(kv["hurray_interop.gguf.tensors"].value))))
        return kv

    return edit


def _first_uint32_key_to(value):
    def edit(kv):
        types = list(kv["hurray_interop.gguf.kv_types"].value)
        key = [k for k in kv if not k.startswith("hurray_interop.")][types.index("UINT32")]
        kv[key] = value
        return kv

    return edit



TAMPERINGS = {
    "types_count": (_types(lambda t: t[:-1]), "kv_types"),
    "types_unknown": (_types(lambda t: t[:3] + ["UINT99"] + t[4:]), "UINT99"),
    "types_string_as_uint32": (_types(lambda t: ["UINT32"] + t[1:]), "general.architecture"),
    "value_out_of_range": (_first_uint32_key_to(KVValue.uint64(2**40)), "llama.context_length"),
    "tensors_json": (_set("hurray_interop.gguf.tensors", KVValue.string('[["x"')), "hurray_interop.gguf"),
    "tensors_not_a_list": (_set("hurray_interop.gguf.tensors", KVValue.string('{"a": 1}')), "hurray_interop.gguf.tensors"),
    "version": (_set("hurray_interop.gguf.version", KVValue.uint64(7)), "hurray_interop.gguf.version"),
    "alignment": (_set("hurray_interop.gguf.alignment", KVValue.uint64(48)), "hurray_interop.gguf.alignment"),
    "tail": (_set("hurray_interop.gguf.tail_bytes", KVValue.uint64(10**6)), "hurray_interop.gguf.tail_bytes"),
    "offsets_overlap": (_tensors(lambda t: [t[0], [*t[1][:3], t[0][3]], *t[2:]]), "blk.0.attn_norm.weight"),
    "ne_mismatch": (_tensors(lambda t: [[t[0][0], t[0][1], [1, 2, 3, 4, 5], t[0][3]], *t[1:]]), "token_embd.weight"),
    "ggml_type": (_tensors(lambda t: [[t[0][0], "NOPE", *t[0][2:]], *t[1:]]), "NOPE"),
    "duplicate": (_tensors(lambda t: t + [t[0]]), "token_embd.weight"),
    "substitution_record": (_set("hurray_interop.scale_substitutions.token_embd.weight", KVValue.bytes(b"\1\2")),
                            "token_embd.weight"),
}


@pytest.fixture(scope="module")
def imported_model(fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imp") / "m.hrry"
    gguf_to_hurray(fixtures_dir / "tiny-llama.gguf", out)
    return out


def test_tampered_records_are_format_errors(imported_model: Path, tmp_path: Path) -> None:
    """Records in the .hrry are input: each broken one must be a FormatError naming the file
    and the key or tensor (not a writer UsageError without a location), and no GGUF is written.
    All cases run; the failure lists every case that misbehaves."""
    with HrryFile(imported_model) as hf:
        assert "hurray_interop.scale_substitutions.token_embd.weight" in hf.kv  # the record we tamper with exists
    wrong = []
    for case, (edit, what) in sorted(TAMPERINGS.items()):
        bad = rewrite_hrry(imported_model, tmp_path / f"{case}.hrry", edit)
        out = tmp_path / f"{case}.gguf"
        try:
            hurray_to_gguf(bad, out)
        except FormatError as e:
            if str(bad) not in str(e) or what not in str(e):
                wrong.append(f"{case}: FormatError without the file or {what!r}: {e}")
        except HurrayInteropError as e:
            wrong.append(f"{case}: {type(e).__name__}: {e}")
        else:
            wrong.append(f"{case}: accepted")
        assert not out.exists(), case
    assert not wrong, "\n".join(wrong)


def test_recorded_tensor_missing_from_the_file(imported_model: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    bad = rewrite_hrry(imported_model, tmp_path / "bad.hrry", lambda kv: kv, drop=("extra.i8",))
    with pytest.raises(FormatError, match=r"tensor 'extra\.i8' is recorded but missing"):
        hurray_to_gguf(bad, tmp_path / "o.gguf")
    assert main(["convert", str(bad), str(tmp_path / "o.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not (tmp_path / "o.gguf").exists()


def test_stale_records_never_give_a_wrong_shape(imported_model: Path, tmp_path: Path) -> None:
    """A tensor reshaped after import (e.g. by another tool that kept the KV) while the
    records still hold the old ``ne``: the export must not silently write the old shape."""
    import dataclasses

    name = "token_embd.weight"  # (300, 64) Q8_0
    src = tmp_path / "reshaped.hrry"
    with HrryFile(imported_model) as hf:
        kv = dict(hf.kv)
        with HrryWriter(src) as w:
            for n in hf.top_level_names():
                t = hf.tensor(n)
                if n == name:
                    assert t.descriptor.shape == (300, 64)
                    t = dataclasses.replace(t, descriptor=dataclasses.replace(t.descriptor, shape=(600, 32)))
                w.write_tensor(t)
            w.finish(kv)
    out = tmp_path / "o.gguf"
    try:
        hurray_to_gguf(src, out)
    except FormatError as e:
        assert name in str(e)
        assert not out.exists()
        return
    r = gguf.GGUFReader(str(out))
    t = next(t for t in r.tensors if t.name == name)
    assert t.shape.tolist() == [32, 600], f"exported with the stale recorded shape {t.shape.tolist()}"


def test_zero_blocks_across_the_chunk_boundary(tmp_path: Path) -> None:
    """Converters work in chunks of 2**18 blocks: substituted zero-block scales on both sides
    of a chunk boundary (Q8_0 and MXFP4) must land on the right blocks, both ways."""
    from hurray_interop.conversions import gguf as conv

    rng = np.random.default_rng(21)
    nb = conv.CHUNK_BLOCKS + 64
    zero = [0, conv.CHUNK_BLOCKS - 1, conv.CHUNK_BLOCKS, conv.CHUNK_BLOCKS + 5, nb - 1]
    d = rng.uniform(0.01, 1, nb).astype(np.float16)
    codes = rng.integers(-128, 128, (nb, 32))
    d[zero] = [0.0, -0.0, 0.0, -0.0, 0.0]
    codes[zero] = 0
    q8 = q8_0_blocks(d, codes)
    mx = np.zeros((nb, 17), np.uint8)
    mx[:, 0] = rng.integers(1, 240, nb)
    mx[:, 1:] = rng.integers(0, 256, (nb, 16))
    mx[zero, 0] = 0
    mx[zero, 1:] = rng.choice([0x00, 0x08, 0x80, 0x88], (len(zero), 16))  # ±0 codes only
    src = write_gguf_raw(tmp_path / "big.gguf", [("q8", "Q8_0", (nb // 64, 2048), q8),
                                                 ("mx", "MXFP4", (nb // 64, 2048), mx)])
    mid = tmp_path / "big.hrry"
    report = gguf_to_hurray(src, mid)
    assert [t.substituted_blocks for t in report.tensors] == [len(zero), len(zero)]
    with HrryFile(mid) as hf:
        s = np.asarray(hf.tensor("q8").data[1]).view("<f2")
        assert (s != 0).all()  # a legal Hurray file: no zero scale anywhere
        e = np.asarray(hf.tensor("mx").data[1])
        assert (e != 0).all()
    back = tmp_path / "back.gguf"
    hurray_to_gguf(mid, back)
    assert_same_bytes(back.read_bytes(), src.read_bytes())
    from hurray_interop._verify import verify_roundtrip

    res = verify_roundtrip(src)
    assert res.ok and [(t.bytes_equal, t.values_equal) for t in res.tensors] == [(True, True)] * 2, res.summary_line()


def test_zero_size_tensors_of_every_type(tmp_path: Path) -> None:
    specs = [G.TensorSpec(f"z.{t}", int(gguf.GGMLQuantizationType[t]), (64 if t in BLOCK_TYPES else 3, 0)) for t in ALL_TYPES]
    specs.insert(4, G.TensorSpec("w", int(gguf.GGMLQuantizationType.F32), (2,)))
    src = tmp_path / "zero.gguf"
    with G.GGUFWriterStream(src, tensors=specs) as w:
        for s in w.tensors_in_file_order:
            w.write_tensor_data(np.float32([1, 2]).tobytes() if s.name == "w" else b"")
    r = gguf.GGUFReader(str(src))
    assert [int(t.n_bytes) for t in r.tensors].count(0) == len(ALL_TYPES)
    del r
    assert_same_bytes(roundtrip_bytes(src, tmp_path), src.read_bytes())


def test_shards_are_treated_alike_with_a_true_reason(tmp_path: Path) -> None:
    """A tensor carrying a shard section (a piece of a larger parent tensor): plain and
    quantized shards get the same decision, and a refusal names the shard (not the layout)."""
    src = tmp_path / "shard.hrry"
    with HrryWriter(src) as w:
        w.write("plain", Descriptor(element_type("float32"), (2,), (cpu(8),), shard=Shard((4,), (2,))),
                [np.float32([1, 2]).tobytes()])
        q = pb((1, 32), "int8")
        w.write("quant", Descriptor(q.element_type, q.shape, q.buffers, quantization=q.quantization,
                                    shard=Shard((2, 32), (1, 0))), [bytes(range(32)), np.float16([0.5]).tobytes()])
        w.finish()
    report = hurray_to_gguf(src, tmp_path / "o.gguf", dry_run=True)
    plans = {t.name: t for t in report.tensors}
    assert plans["plain"].status == plans["quant"].status, {n: (p.status, p.reason) for n, p in plans.items()}
    for p in plans.values():
        if p.status == "refused":
            assert "shard" in p.reason.lower(), p.reason


def test_kquant_fallback_file_exports_gguf_py_values(fixtures_dir: Path, tmp_path: Path) -> None:
    """K-quants imported with --fallback float32 export as F32 holding exactly gguf-py's
    dequantized values; every other tensor keeps its bytes; the file is laid out anew."""
    src = fixtures_dir / "tiny-llama-kquant.gguf"
    mid, out = tmp_path / "kq.hrry", tmp_path / "kq.gguf"
    gguf_to_hurray(src, mid, fallback="float32")
    report = hurray_to_gguf(mid, out)
    changed = {t.name: t.reason for t in report.tensors if t.status != "exact"}
    assert changed == {"blk.0.ffn_down.weight": "imported from Q4_K, exported as F32",
                       "blk.1.ffn_down.weight": "imported from Q6_K, exported as F32"}
    a, b = gguf.GGUFReader(str(src)), gguf.GGUFReader(str(out))
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    assert list(a.fields) == list(b.fields)
    for x, y in zip(a.tensors, b.tensors):
        if x.name in changed:
            assert y.tensor_type == gguf.GGMLQuantizationType.F32
            assert_bitwise(np.asarray(y.data), gguf.quants.dequantize(np.asarray(x.data), x.tensor_type), what=x.name)
        else:
            assert y.tensor_type == x.tensor_type and np.asarray(x.data).tobytes() == np.asarray(y.data).tobytes(), x.name
