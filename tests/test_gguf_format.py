"""GGUF container: reader vs gguf-py (the oracle), byte-exact rewrites, hostile input.

Oracles: llama.cpp's gguf-py (GGUFReader, GGUFWriter, its constants), files written
by llama.cpp tools (../shared/gguf-samples), and hand-packed bytes (struct) for the
malformed inputs.
"""

from __future__ import annotations

import importlib.util
import io
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hurray_interop.errors import (
    BadMagicError,
    FormatError,
    HurrayInteropError,
    InconsistentError,
    TruncatedError,
    UnsupportedError,
    UsageError,
)
from hurray_interop.formats import gguf as G
from hurray_interop.formats.gguf import GGUFValue, GGUFWriterStream, TensorSpec, ValueType, read_gguf

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402

FIXTURES = ["tiny-llama.gguf", "tiny-llama-kquant.gguf", "kv-types.gguf"]
#: the shards of the two split-set fixtures (tests/test_gguf_split.py uses them as sets)
SPLIT_FIXTURES = [f"{stem}-{i:05d}-of-00003.gguf" for stem in ("tiny-split", "nofirst") for i in (1, 2, 3)]
SAMPLES_FAST = ["ggml-vocab-llama-spm.gguf"]
# gguf-py needs ~6 s for gpt-2 and ~15 s for aquila, so aquila is only round-tripped
SAMPLES_SLOW = ["ggml-vocab-gpt-2.gguf"]
SAMPLES_ROUNDTRIP = ["ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-aquila.gguf"]


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def write_gguf_like(src: G.GGUFFile, dst, *, chunk_bytes: int = 64 << 20) -> int:
    """Write ``src`` again with our streaming writer, everything as read (version, metadata,
    tensor infos, offsets, padding, end padding); returns the bytes written."""
    w = GGUFWriterStream(dst, version=src.version, alignment=src.alignment, kv=src.kv, tensors=src.tensors,
                         pad_end=src.tail_bytes, padding=src.nonzero_padding)
    with w:
        by_name = {t.raw_name: t for t in src.tensors}
        for spec in w.tensors_in_file_order:
            data = by_name[spec.name.encode("utf-8", "surrogateescape")].data
            w.write_tensor_data(data[i : i + chunk_bytes] for i in range(0, max(len(data), 1), chunk_bytes))
    return w.bytes_written


def _rewrite(f: G.GGUFFile) -> bytes:
    buf = io.BytesIO()
    n = write_gguf_like(f, buf)
    assert n == len(buf.getvalue())
    return buf.getvalue()


def _flat_parts(field) -> list:
    return [field.parts[i] for i in field.data]


def assert_matches_gguf_py(path: Path) -> G.GGUFFile:
    """Everything our reader reports equals what gguf-py's GGUFReader reads."""
    r = gguf.GGUFReader(path)
    ours = read_gguf(path)
    fields = [(k, f) for k, f in r.fields.items() if not k.startswith("GGUF.")]
    assert [k for k, _ in fields] == list(ours.kv)
    assert int(r.fields["GGUF.version"].parts[0][0]) == ours.version
    assert int(r.fields["GGUF.kv_count"].parts[0][0]) == len(ours.kv)
    assert int(r.fields["GGUF.tensor_count"].parts[0][0]) == len(ours.tensors)
    for key, f in fields:
        v = ours.kv[key]
        assert ours.kv_offsets[key] == f.offset, key
        assert int(f.types[0]) == int(v.type), key
        if v.type == ValueType.STRING:
            assert f.parts[f.data[0]].tobytes() == v.value, key
        elif v.type != ValueType.ARRAY:
            # bit-exact: compare the bytes of the numpy scalars
            assert f.parts[f.data[0]].tobytes() == np.asarray(v.value).tobytes(), key
            assert np.asarray(v.value).dtype.itemsize == f.parts[f.data[0]].dtype.itemsize
        elif len(v) == 0:
            assert f.types == [V.ARRAY], key  # gguf-py forgets the element type; we keep it
            assert f.data == []
        elif v.element_type == ValueType.ARRAY:
            # gguf-py flattens nested arrays: [ARRAY, ARRAY, inner] and all leaves in a row
            # (the leaf type comes from the first inner array, and only if that one is non-empty)
            first = v.value[0]
            leaf = [int(first.element_type)] if len(first) else []
            assert [int(t) for t in f.types] == [int(V.ARRAY), int(V.ARRAY)] + leaf, key
            leaves: list[bytes] = []
            for item in v.value:
                if item.element_type == ValueType.STRING:
                    leaves += item.value.tolist()
                else:
                    leaves += [x.tobytes() for x in item.value]
            assert [p.tobytes() for p in _flat_parts(f)] == leaves, key
        else:
            assert int(f.types[1]) == int(v.element_type), key
            if v.element_type == ValueType.STRING:
                assert [p.tobytes() for p in _flat_parts(f)] == v.value.tolist(), key
                assert v.value.decode("replace") == [p.tobytes().decode("utf-8", "replace") for p in _flat_parts(f)]
            else:
                assert b"".join(p.tobytes() for p in _flat_parts(f)) == v.value.tobytes(), key
    assert int(r.alignment) == ours.alignment
    assert r.data_offset == ours.data_offset
    assert len(r.tensors) == len(ours.tensors)
    for rt, t in zip(r.tensors, ours.tensors):
        assert rt.name == t.name
        assert int(rt.tensor_type) == t.type_id
        assert rt.tensor_type.name == t.type_name
        assert rt.shape.tolist() == list(t.ne)
        assert rt.data_offset == t.data_offset
        assert rt.field.offset == t.info_offset
        assert int(rt.field.parts[5][0]) == t.offset
        assert rt.n_elements == t.n_elements
        if rt.tensor_type != Q.Q8_1:  # gguf-py 0.19.0 has the wrong Q8_1 size
            assert rt.n_bytes == t.nbytes
        assert rt.data.tobytes() == t.data.tobytes()
        arr = t.array()
        if rt.data.dtype != np.uint8 or arr.dtype == np.uint8:
            assert arr.shape == rt.data.shape
            assert arr.tobytes() == rt.data.tobytes()
    return ours


# A hand-packed GGUF builder for malformed inputs (independent of the module under test).


def s(b: bytes | str) -> bytes:
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def kv_u32(key: str, v: int) -> bytes:
    return s(key) + struct.pack("<II", int(V.UINT32), v)


def ti(name: str, ne: list[int], type_id: int, offset: int) -> bytes:
    return s(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, type_id, offset)


def build(kvs: list[bytes], tis: list[bytes], data: bytes = b"", *, version: int = 3, n_kv=None, n_t=None, align=32, pad_end=True) -> bytes:
    meta = b"GGUF" + struct.pack("<IQQ", version, len(tis) if n_t is None else n_t, len(kvs) if n_kv is None else n_kv)
    meta += b"".join(kvs) + b"".join(tis)
    out = meta + bytes((-len(meta)) % align) if (tis or pad_end) else meta
    out += data
    if pad_end:
        out += bytes((-len(out)) % align)
    return out


def parse(b: bytes) -> G.GGUFFile:
    return G.GGUFFile(b, path="x.gguf")


# --------------------------------------------------------------------------
# the GGML type table
# --------------------------------------------------------------------------


def test_ggml_type_table_matches_gguf_py_except_known_errata():
    ours = {t.name: t for t in G.ggml_types()}
    for q in Q:
        t = ours[q.name]
        assert t.id == int(q)
        blk, size = gguf.GGML_QUANT_SIZES[q]
        if q == Q.Q8_1:
            # block_q8_1 = {fp16 d, fp16 s, int8 qs[32]}: 36 bytes; gguf-py 0.19.0 says 40
            assert (blk, size) == (32, 40)
            assert (t.block_elements, t.block_bytes) == (32, 2 + 2 + 32)
        else:
            assert (t.block_elements, t.block_bytes) == (blk, size), q.name
    q2 = G.ggml_type("Q2_0")
    assert (q2.id, q2.block_elements, q2.block_bytes) == (42, 64, 2 + 64 * 2 // 8)
    known = {int(q) for q in Q} | {4, 5, 31, 32, 33, 36, 37, 38, 42}
    assert {t.id for t in G.ggml_types()} == known
    assert all(t.removed == (t.family == "removed") for t in G.ggml_types())
    families = {t.family for t in G.ggml_types()}
    assert families == {"float", "int", "legacy_quant", "low_bit", "k_quant", "iq", "ternary", "fp4", "removed"}
    assert G.ggml_type(39) is G.ggml_type("MXFP4")
    with pytest.raises(UnsupportedError, match="unknown GGML type 99"):
        G.ggml_type(99)


# --------------------------------------------------------------------------
# reading: gguf-py agrees
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURES + SPLIT_FIXTURES)
def test_reader_matches_gguf_py_on_fixtures(fixtures_dir, name):
    assert_matches_gguf_py(fixtures_dir / name)


@pytest.mark.parametrize("name", SAMPLES_FAST + [pytest.param(n, marks=pytest.mark.slow) for n in SAMPLES_SLOW])
def test_reader_matches_gguf_py_on_llama_cpp_samples(gguf_samples_dir, name):
    f = assert_matches_gguf_py(gguf_samples_dir / name)
    assert not f.tensors and not f.ends_padded and f.tail_bytes == 0  # llama.cpp vocab files end unpadded


def test_fixture_contents(fixtures_dir):
    with read_gguf(fixtures_dir / "tiny-llama.gguf") as f:
        assert f.version == 3 and f.alignment == 32 and f.ends_padded and f.canonical_layout
        assert f.architecture == "llama"
        assert len(f.kv["tokenizer.ggml.tokens"]) == 300
        assert f.kv["tokenizer.ggml.scores"].element_type == ValueType.FLOAT32
        assert f.kv["tokenizer.ggml.token_type"].element_type == ValueType.INT32
        types = {t.type_name for t in f.tensors}
        assert types == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4", "I8", "I16", "I32", "F64"}
        assert {t.n_dims for t in f.tensors} == {1, 2, 3}
        t = f.tensor("extra.experts_mxfp4")
        assert t.ne == (64, 8, 2) and t.shape == (2, 8, 64)
        # zero-copy, read-only views into the mapping
        assert not t.data.flags.writeable and not t.data.flags.owndata
        # row 0 of every quantized matrix is all zero: all its block scales are zero
        q8 = f.tensor("token_embd.weight").array()
        assert q8.shape == (300, 64 // 32 * 34) and not q8[0].any()
    with read_gguf(fixtures_dir / "tiny-llama-kquant.gguf") as f:
        kq = {t.name: t.type_name for t in f.tensors if t.ggml_type.family == "k_quant"}
        assert kq == {"blk.0.ffn_down.weight": "Q4_K", "blk.1.ffn_down.weight": "Q6_K"}
        for name, qt in kq.items():
            deq = gguf.quants.dequantize(f.tensor(name).array(), Q[qt])
            assert deq.shape == (64, 256) and np.isfinite(deq).all()


def test_kv_types_fixture_exact_values(fixtures_dir):
    path = fixtures_dir / "kv-types.gguf"
    f = read_gguf(path)
    raw = path.read_bytes()
    kv = f.kv
    assert f.alignment == 64 and kv["general.alignment"].type == ValueType.UINT32
    expect_types = {
        "t.u8": ValueType.UINT8, "t.i8": ValueType.INT8, "t.u16": ValueType.UINT16, "t.i16": ValueType.INT16,
        "t.u32": ValueType.UINT32, "t.i32": ValueType.INT32, "t.u64": ValueType.UINT64, "t.i64": ValueType.INT64,
        "t.f32": ValueType.FLOAT32, "t.f64": ValueType.FLOAT64, "t.bool_true": ValueType.BOOL, "t.string": ValueType.STRING,
    }  # fmt: skip
    for k, t in expect_types.items():
        assert kv[k].type == t
    assert kv["t.u64"].to_python() == 2**64 - 1 and kv["t.i64"].to_python() == -(2**63)
    assert np.float32(kv["t.f32"].value).tobytes() == struct.pack("<f", 0.1)
    assert np.asarray(kv["t.f32_neg_zero"].value).tobytes() == b"\x00\x00\x00\x80"
    assert kv["t.bool_true"].to_python() is True and kv["t.bool_false"].to_python() is False
    assert kv["t.string_empty"].value == b"" and kv["t.string_empty"].to_python() == ""
    assert kv["t.string_bytes"].value == b"raw\x00bytes\xff"
    with pytest.raises(UnicodeDecodeError):
        kv["t.string_bytes"].to_python()  # strict by default; the raw bytes are the truth
    assert kv["t.string_bytes"].to_python("replace") == "raw\x00bytes\ufffd"
    assert kv["t.array_string"].to_python() == ["a", "", "ünïcode", "🙂"]
    assert kv["t.array_bool"].to_python() == [True, False, True]
    assert kv["t.nested_i32"].to_python() == [[1, 2, 3], [4], [5, 6]]
    assert [v.element_type for v in kv["t.nested_str"].value] == [ValueType.STRING] * 2
    assert [v.element_type for v in kv["t.nested_u8"].value] == [ValueType.UINT8] * 2
    empty = kv["t.array_empty"]
    assert empty.type == ValueType.ARRAY and empty.element_type == ValueType.UINT32 and len(empty) == 0
    # the spliced bytes, located independently
    at = raw.index(s("t.array_empty"))
    assert f.kv_offsets["t.array_empty"] == at
    assert raw[at + 8 + 13 : at + 8 + 13 + 16] == struct.pack("<IIQ", 9, 4, 0)


def test_encode_decode_single_values(fixtures_dir):
    path = fixtures_dir / "kv-types.gguf"
    raw = path.read_bytes()
    f = read_gguf(path)
    keys = list(f.kv)
    for i, (key, v) in enumerate(f.kv.items()):
        # the value's bytes in the file: after key string and type tag, up to the next record
        start = f.kv_offsets[key] + 8 + len(key.encode()) + 4
        end = f.kv_offsets[keys[i + 1]] if i + 1 < len(keys) else f.tensor_infos_offset
        enc = G.encode_value(v)
        assert enc == raw[start:end], key
        back = G.decode_value(v.type, enc, what=key)
        assert back == v and back.element_type == v.element_type
    with pytest.raises(InconsistentError, match="1 stray bytes after the value"):
        G.decode_value(ValueType.UINT16, b"\x01\x02\x03", what="k")
    with pytest.raises(TruncatedError, match="k count at offset 4"):
        G.decode_value(ValueType.ARRAY, struct.pack("<I", 4) + b"\x01", what="k")
    with pytest.raises(FormatError, match="invalid GGUF value type 77"):
        G.decode_value(77, b"")


# --------------------------------------------------------------------------
# byte-exact rewriting
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURES)
def test_roundtrip_fixtures_byte_identical(fixtures_dir, name, tmp_path):
    path = fixtures_dir / name
    f = read_gguf(path)
    out = tmp_path / "out.gguf"
    write_gguf_like(f, out)
    assert out.read_bytes() == path.read_bytes()


@pytest.mark.parametrize("name", SAMPLES_ROUNDTRIP)
def test_roundtrip_llama_cpp_samples_byte_identical(gguf_samples_dir, name):
    path = gguf_samples_dir / name
    f = read_gguf(path)
    assert _rewrite(f) == path.read_bytes()
    if name == "ggml-vocab-aquila.gguf":
        assert f.version == 2


@pytest.mark.parametrize("alignment", [1, 8, 32, 64, 256])
def test_roundtrip_gguf_py_files_with_alignments(tmp_path, alignment):
    rng = np.random.default_rng(alignment)
    path = tmp_path / "a.gguf"
    w = gguf.GGUFWriter(path, "llama")
    if alignment != 32:
        w.add_custom_alignment(alignment)
    w.add_uint64("x.u64", 2**40 + 3)
    w.add_array("x.floats", [0.5, -1.25, 3.0])
    w.add_tensor("a", rng.standard_normal((3, 5)).astype(np.float32))  # 60 bytes: not aligned
    w.add_tensor("b", gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), Q.Q4_1), raw_dtype=Q.Q4_1)
    w.add_tensor("c", rng.integers(-5, 5, size=(7,), dtype=np.int8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = assert_matches_gguf_py(path)
    assert f.alignment == alignment and f.canonical_layout and f.ends_padded
    assert _rewrite(f) == path.read_bytes()
    # the writer alone, given only what the gguf-py caller gave, reproduces gguf-py's bytes
    kv = {k: v for k, v in f.kv.items()}
    specs = [TensorSpec(t.name, t.type_id, t.ne) for t in f.tensors]
    buf = io.BytesIO()
    with GGUFWriterStream(buf, version=3, alignment=alignment, kv=kv, tensors=specs) as ws:
        assert [t.offset for t in ws.tensors_in_file_order] == [t.offset for t in f.tensors]
        for t in f.tensors:
            ws.write_tensor_data(t.data.tobytes(), name=t.name)
    assert buf.getvalue() == path.read_bytes()


def test_writer_from_values_reproduces_gguf_py_bytes(tmp_path):
    """Values built with GGUFValue.of, not read back: our encoder equals gguf-py's."""
    path = tmp_path / "g.gguf"
    w = gguf.GGUFWriter(path, "test")
    w.add_uint8("a.u8", 7)
    w.add_int16("a.i16", -300)
    w.add_float32("a.f32", 1e-5)
    w.add_float64("a.f64", 2.5)
    w.add_bool("a.b", True)
    w.add_string("a.s", "ünï")
    w.add_key_value("a.arr", [1, 2, 2**33], V.ARRAY, sub_type=V.UINT64)
    w.add_key_value("a.strs", ["x", "", "z"], V.ARRAY, sub_type=V.STRING)
    w.add_key_value("a.nested", [[1, 2], [3]], V.ARRAY, sub_type=V.ARRAY)
    w.add_tensor("t", np.arange(6, dtype=np.float16).reshape(2, 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    of = GGUFValue.of
    kv = [
        ("general.architecture", of(ValueType.STRING, "test")),
        ("a.u8", of(ValueType.UINT8, 7)),
        ("a.i16", of(ValueType.INT16, -300)),
        ("a.f32", of(ValueType.FLOAT32, 1e-5)),
        ("a.f64", of(ValueType.FLOAT64, 2.5)),
        ("a.b", of(ValueType.BOOL, True)),
        ("a.s", of(ValueType.STRING, "ünï")),
        ("a.arr", of(ValueType.ARRAY, [1, 2, 2**33], ValueType.UINT64)),
        ("a.strs", of(ValueType.ARRAY, ["x", "", "z"], ValueType.STRING)),
        ("a.nested", of(ValueType.ARRAY, [of(ValueType.ARRAY, [1, 2], ValueType.INT32), of(ValueType.ARRAY, [3], ValueType.INT32)], ValueType.ARRAY)),
    ]
    out = tmp_path / "o.gguf"
    data = np.arange(6, dtype=np.float16)
    with GGUFWriterStream(out, kv=kv, tensors=[TensorSpec("t", 1, (3, 2))]) as ws:
        ws.write_tensor_data([data[:2], data[2:].tobytes()])  # chunks of mixed kinds
    assert out.read_bytes() == path.read_bytes()
    with pytest.raises(UsageError, match="out of range for UINT8"):
        of(ValueType.UINT8, 256)
    with pytest.raises(UsageError, match="needs an element_type"):
        of(ValueType.ARRAY, [1])


def test_writer_version_2_unpadded_end_and_empty_values():
    of = GGUFValue.of
    kv = {
        "general.architecture": of(ValueType.STRING, b""),
        "e.arr": of(ValueType.ARRAY, [], ValueType.FLOAT64),
        "e.strs": of(ValueType.ARRAY, [], ValueType.STRING),
        "e.bool_raw": GGUFValue(ValueType.BOOL, np.uint8(2)),  # a bool byte of 2 survives
        "e.nan": GGUFValue(ValueType.FLOAT32, np.frombuffer(b"\x01\x00\xc0\x7f", "<f4")[0]),  # NaN payload
    }
    for pad_end, tail in [(False, 0), (True, None), (3, 3)]:
        buf = io.BytesIO()
        with GGUFWriterStream(buf, version=2, kv=kv, pad_end=pad_end):
            pass
        raw = buf.getvalue()
        expect = (
            b"GGUF" + struct.pack("<IQQ", 2, 0, 5)
            + s("general.architecture") + struct.pack("<I", 8) + s(b"")
            + s("e.arr") + struct.pack("<IIQ", 9, 12, 0)
            + s("e.strs") + struct.pack("<IIQ", 9, 8, 0)
            + s("e.bool_raw") + struct.pack("<IB", 7, 2)
            + s("e.nan") + struct.pack("<I", 6) + b"\x01\x00\xc0\x7f"
        )  # fmt: skip
        pad = (-len(expect)) % 32
        assert raw == expect + bytes(pad if tail is None else tail)
        f = parse(raw)
        assert f.version == 2 and f.tail_bytes == (pad if tail is None else tail)
        assert f.ends_padded == (tail is None or tail == pad)
        assert f.kv["e.arr"].element_type == ValueType.FLOAT64
        assert _rewrite(f) == raw


def test_writer_accepts_open_file_and_checks_usage(tmp_path):
    specs = [TensorSpec("a", 0, (4,)), TensorSpec("b", 8, (32, 2))]
    kv = {"general.alignment": GGUFValue.of(ValueType.UINT32, 64)}
    with open(tmp_path / "f.gguf", "wb") as fh:
        fh.write(b"")
        ws = GGUFWriterStream(fh, alignment=64, kv=kv, tensors=specs)
        ws.write_tensor_data(np.arange(4, dtype=np.float32))
        ws.write_tensor_data(bytes(68))
        ws.close()
        assert not fh.closed
    f = read_gguf(tmp_path / "f.gguf")
    assert [t.offset for t in f.tensors] == [0, 64] and f.file_size == f.data_offset + 64 + 128
    with pytest.raises(UsageError, match="general.alignment"):
        GGUFWriterStream(io.BytesIO(), alignment=64)
    with pytest.raises(UsageError, match="disagrees"):
        GGUFWriterStream(io.BytesIO(), alignment=32, kv=kv)
    with pytest.raises(UsageError, match="not a multiple of the Q8_0 block size"):
        GGUFWriterStream(io.BytesIO(), tensors=[TensorSpec("q", 8, (16,))])
    with pytest.raises(UsageError, match="removed"):
        GGUFWriterStream(io.BytesIO(), tensors=[TensorSpec("q", 4, (32,))])
    ws = GGUFWriterStream(io.BytesIO(), tensors=specs)
    with pytest.raises(UsageError, match="got 12 bytes of data, expected 16"):
        ws.write_tensor_data(bytes(12))
    ws = GGUFWriterStream(io.BytesIO(), tensors=specs)
    ws.write_tensor_data(bytes(16))
    with pytest.raises(UsageError, match="before the data of tensor 'b'"):
        ws.close()
    with pytest.raises(UsageError, match="overlaps"):
        GGUFWriterStream(io.BytesIO(), tensors=[TensorSpec("a", 0, (16,), 0), TensorSpec("b", 0, (4,), 32)])


def test_large_vocabulary_parses_exactly():
    """A 262,144-token vocabulary (gemma-sized), built independently with struct."""
    n = 262144
    toks = [f"tok{i}".encode() if i % 97 else b"" for i in range(n)]
    toks[5] = "▁Überraschung🙂".encode()
    toks[6] = b"\xff\xfe"  # not UTF-8
    body = b"".join(struct.pack("<Q", len(t)) + t for t in toks)
    scores = -np.arange(n, dtype=np.float32) / 7
    types = (np.arange(n) % 5).astype(np.int32)
    kvs = [
        s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, n) + body,
        s("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, n) + scores.tobytes(),
        s("tokenizer.ggml.token_type") + struct.pack("<IIQ", 9, 5, n) + types.tobytes(),
    ]
    raw = build(kvs, [], pad_end=False)
    f = parse(raw)
    t = f.kv["tokenizer.ggml.tokens"].value
    assert len(t) == n and t.tolist() == toks
    assert t[5] == toks[5] and t[-1] == toks[-1] and t[6] == b"\xff\xfe"
    assert f.kv["tokenizer.ggml.scores"].value.tobytes() == scores.tobytes()
    assert f.kv["tokenizer.ggml.token_type"].value.tobytes() == types.tobytes()
    assert _rewrite(f) == raw


_SCALARS = {
    ValueType.UINT8: (0, 2**8 - 1), ValueType.INT8: (-(2**7), 2**7 - 1),
    ValueType.UINT16: (0, 2**16 - 1), ValueType.INT16: (-(2**15), 2**15 - 1),
    ValueType.UINT32: (0, 2**32 - 1), ValueType.INT32: (-(2**31), 2**31 - 1),
    ValueType.UINT64: (0, 2**64 - 1), ValueType.INT64: (-(2**63), 2**63 - 1),
}  # fmt: skip


def _value_strategy():
    from hypothesis import strategies as st

    of = GGUFValue.of
    ints = [st.integers(lo, hi).map(lambda x, t=t: of(t, x)) for t, (lo, hi) in _SCALARS.items()]
    f32 = st.binary(min_size=4, max_size=4).map(lambda b: GGUFValue(ValueType.FLOAT32, np.frombuffer(b, "<f4")[0]))
    f64 = st.floats(allow_nan=False).map(lambda x: of(ValueType.FLOAT64, x))
    boo = st.booleans().map(lambda x: of(ValueType.BOOL, x))
    strs = st.binary(max_size=12).map(lambda b: of(ValueType.STRING, b))
    int_arrays = [
        st.lists(st.integers(lo, hi), max_size=5).map(lambda xs, t=t: of(ValueType.ARRAY, xs, t)) for t, (lo, hi) in _SCALARS.items()
    ]
    str_arrays = st.lists(st.binary(max_size=6), max_size=5).map(lambda xs: of(ValueType.ARRAY, xs, ValueType.STRING))
    leaf_arrays = st.one_of(*int_arrays, str_arrays)
    nested = st.lists(leaf_arrays, min_size=1, max_size=3).map(lambda xs: of(ValueType.ARRAY, xs, ValueType.ARRAY))
    return st.one_of(*ints, f32, f64, boo, strs, leaf_arrays, nested)


def test_writer_output_is_read_identically_by_gguf_py(tmp_path_factory):
    """Property: whatever our writer writes, gguf-py reads as we do, and we rewrite it byte for byte."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    qtypes = [Q.F32, Q.F16, Q.Q8_0, Q.Q4_K, Q.MXFP4, Q.I8]

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        kv=st.dictionaries(st.text("abc.", min_size=1, max_size=6), _value_strategy(), max_size=6),
        tensors=st.lists(st.tuples(st.sampled_from(qtypes), st.integers(1, 2), st.integers(1, 3)), max_size=4),
        align_exp=st.integers(0, 7),
        pad_end=st.booleans(),
        version=st.sampled_from([2, 3]),
    )
    def run(kv, tensors, align_exp, pad_end, version):
        alignment = 1 << align_exp
        kv = dict(kv)
        kv.pop("general.alignment", None)
        if alignment != 32:
            kv["general.alignment"] = GGUFValue.of(ValueType.UINT32, alignment)
        specs = []
        for i, (qt, rows, depth) in enumerate(tensors):
            blk = gguf.GGML_QUANT_SIZES[qt][0]
            specs.append(TensorSpec(f"t{i}", int(qt), (blk * 2, rows, depth)[: 1 + (i % 3)]))
        path = tmp_path_factory.mktemp("w") / "w.gguf"
        with GGUFWriterStream(path, version=version, alignment=alignment, kv=kv, tensors=specs, pad_end=pad_end) as w:
            for spec in w.tensors_in_file_order:
                n = G.tensor_nbytes(spec.type_id, spec.ne)
                w.write_tensor_data(bytes((k * 7 + 3) & 0xFF for k in range(n)))
        f = assert_matches_gguf_py(path)
        assert f.version == version and f.alignment == alignment and f.canonical_layout
        assert list(f.kv) == list(kv) and all(f.kv[k] == v for k, v in kv.items())
        assert f.ends_padded or not pad_end
        assert _rewrite(f) == path.read_bytes()

    run()


# --------------------------------------------------------------------------
# hostile input
# --------------------------------------------------------------------------


def _expect(raw: bytes, cls, match: str):
    with pytest.raises(cls, match=match) as ei:
        parse(raw)
    return ei.value


def test_header_errors():
    good = build([kv_u32("a", 1)], [])
    _expect(b"GGUX" + good[4:], BadMagicError, r"magic b'GGUX'")
    _expect(b"", TruncatedError, "too short for the GGUF magic")
    _expect(good[:10], TruncatedError, "tensor count at offset 8")
    e = _expect(build([], [], version=1), UnsupportedError, "version 1 is not supported")
    assert e.offset == 4
    _expect(build([], [], version=4), UnsupportedError, "version 4")
    be = b"GGUF" + struct.pack(">IQQ", 3, 0, 0)
    _expect(be, UnsupportedError, "big-endian GGUF")
    _expect(build([], [], n_kv=1), TruncatedError, "1 metadata entries")
    _expect(build([], [], n_t=2**63), TruncatedError, "9223372036854775808 tensor infos cannot fit")


def test_kv_errors():
    _expect(build([s("k") + struct.pack("<I", 13) + b"\0" * 8], []), FormatError, "invalid GGUF value type 13")
    _expect(build([s("k") + struct.pack("<IQ", 8, 2**32)], []), TruncatedError, "string length 4294967296 exceeds")
    _expect(build([kv_u32("a", 1), kv_u32("a", 2)], []), InconsistentError, "duplicate metadata key 'a'")
    _expect(build([s("k") + struct.pack("<IIQ", 9, 4, 2**40)], []), TruncatedError, "array of 1099511627776 UINT32")
    _expect(build([s("k") + struct.pack("<IIQ", 9, 9, 2**60)], []), TruncatedError, "array of 1152921504606846976 ARRAY")
    _expect(build([s("k") + struct.pack("<IIQ", 9, 99, 0)], []), FormatError, "invalid GGUF value type 99")
    # nesting bomb: arrays of arrays of ... (each level one element)
    bomb = struct.pack("<IQ", 9, 1) * 50 + struct.pack("<IQ", 0, 0)
    e = _expect(build([s("k") + struct.pack("<I", 9) + bomb], []), FormatError, "nested deeper than 8")
    assert e.offset is not None and e.field.startswith("metadata 'k'")
    _expect(build([s("general.alignment") + struct.pack("<IQ", 10, 32)], []), FormatError, "must be UINT32, found UINT64")
    e = _expect(build([kv_u32("general.alignment", 48)], []), FormatError, "48 is not a power of two")
    assert e.offset == 24
    _expect(build([kv_u32("general.alignment", 0)], []), FormatError, "0 is not a power of two")


def test_tensor_info_errors():
    d64 = bytes(64)
    _expect(build([], [ti("w", [32], 99, 0)], d64), FormatError, r"tensor 'w': type at offset \d+: unknown GGML type id 99")
    _expect(build([], [ti("w", [32], 4, 0)], d64), FormatError, r"GGML type id 4 \(Q4_2\) was removed")
    _expect(build([], [ti("w", [16], 8, 0)], d64), FormatError, "ne\\[0\\] = 16 is not a multiple of the Q8_0 block size 32")
    _expect(build([], [ti("w", [1, 1, 1, 1, 1], 0, 0)], d64), FormatError, "n_dims 5 exceeds the maximum 4")
    _expect(build([], [ti("w", [2**63], 0, 0)], d64), FormatError, "negative as int64")
    _expect(build([], [ti("w", [2**32, 2**32], 0, 0)], d64), FormatError, "overflows int64")
    _expect(build([], [ti("w", [2**20, 2**20], 0, 0)], d64), TruncatedError, "extends past the end of the file")
    _expect(build([], [ti("w", [4], 0, 0), ti("w", [4], 0, 32)], d64), InconsistentError, "tensor 'w'.*duplicate tensor name")
    _expect(build([], [ti("w", [4], 0, 16)], d64), InconsistentError, "offset 16 is not a multiple of the alignment 32")
    e = _expect(build([], [ti("a", [16], 0, 0), ti("b", [4], 0, 32)], d64 + bytes(32)), InconsistentError, "overlaps tensor 'a'")
    assert e.tensor == "b"
    _expect(build([], [ti("w", [4], 0, 0)], bytes(16), pad_end=False)[:-1], TruncatedError, "extends past the end")
    _expect(build([], [ti("w", [4], 0, 0)], bytes(16)) + bytes(64), InconsistentError, "bytes follow the end of the tensor data")
    liar = struct.pack("<Q", 2**40) + bytes(24)  # tensor info #1 whose name length is 1 TiB
    _expect(build([], [ti("w", [4], 0, 0), liar], bytes(16)), TruncatedError, r"tensor info #1 name length at offset \d+: string length 1099511627776 exceeds")


def test_tolerated_layouts_are_reproduced():
    # n_dims = 0 (a scalar), trailing 1s kept, zero-size tensor, out-of-order offsets, non-zero padding
    data = bytes(range(1, 17)) + b"\xaa" * 16 + bytes(range(100, 104)) + b"\xbb" * 28 + struct.pack("<f", 7.0)
    raw = build([], [ti("s", [], 0, 64), ti("v", [4, 1, 1], 0, 0), ti("z", [0, 3], 0, 32), ti("w", [1], 0, 32)], data)
    f = parse(raw)
    assert [t.ne for t in f.tensors] == [(), (4, 1, 1), (0, 3), (1,)]
    assert [t.nbytes for t in f.tensors] == [4, 16, 0, 4]
    assert f.tensor("s").array().tolist() == 7.0 and f.tensor("v").array().shape == (1, 1, 4)
    assert not f.canonical_layout
    assert set(f.nonzero_padding) == {f.data_offset + 16, f.data_offset + 36}
    assert _rewrite(f) == raw
    # a zero-size tensor placed past the data still marks the end of the data section
    raw = build([], [ti("a", [4], 0, 0), ti("z", [0], 0, 128)], bytes(128))
    f = parse(raw)
    assert f.tail_bytes == 0 and f.file_size == f.data_offset + 128 and _rewrite(f) == raw


def _boundaries(f: G.GGUFFile) -> set[int]:
    cuts = set(range(0, 25))
    cuts |= set(f.kv_offsets.values()) | {o + d for o in f.kv_offsets.values() for d in (1, 7, 8, 9, 12, 13)}
    for t in f.tensors:
        cuts |= {t.info_offset + d for d in (0, 1, 8, 9, 12, 16)} | {t.data_offset, t.data_offset + 1, t.data_offset + t.nbytes - 1}
    cuts |= {f.tensor_infos_offset, f.metadata_end - 1, f.metadata_end, f.data_offset}
    return {c for c in cuts if 0 <= c < f.file_size}


@pytest.mark.parametrize("name", FIXTURES)
def test_truncation_everywhere_raises_truncated(fixtures_dir, name):
    raw = (fixtures_dir / name).read_bytes()
    f = parse(raw)
    data_end = f.file_size - f.tail_bytes
    cuts = set(range(f.metadata_end + 1)) if name == "kv-types.gguf" else _boundaries(f)
    assert len(cuts) > 100
    for cut in sorted(cuts):
        if cut >= data_end:  # only end padding is cut: still a valid (unpadded) file
            g = parse(raw[:cut])
            assert g.tail_bytes == cut - data_end and _rewrite(g) == raw[:cut]
            continue
        with pytest.raises(TruncatedError) as ei:
            parse(raw[:cut])
        e = ei.value
        # located: at or before the cut, or (for tensor data) at the start of the cut-off tensor
        assert e.offset is not None and (e.offset <= cut or (e.tensor and e.field == "tensor data")), (cut, str(e))


@pytest.mark.parametrize("name", FIXTURES)
def test_byte_flips_raise_only_typed_errors(fixtures_dir, name):
    raw = (fixtures_dir / name).read_bytes()
    f = parse(raw)
    rng = np.random.default_rng(1234)
    region = f.metadata_end + 8  # header, metadata, tensor infos (+ a little)
    accepted = rejected = 0
    for _ in range(300):
        b = bytearray(raw)
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(0, region))] ^= 1 << int(rng.integers(0, 8))
        mutant = bytes(b)
        try:
            g = parse(mutant)
        except (FormatError, UnsupportedError) as e:
            assert isinstance(e, HurrayInteropError) and e.path == "x.gguf"
            assert e.offset is not None, str(e)
            rejected += 1
            continue
        accepted += 1
        assert _rewrite(g) == mutant  # whatever parses is reproduced byte for byte
    assert rejected > 50 and accepted > 10


def test_views_survive_close(fixtures_dir):
    f = read_gguf(fixtures_dir / "tiny-llama.gguf")
    t = f.tensor("blk.0.attn_norm.weight")
    toks = f.kv["tokenizer.ggml.tokens"].value
    f.close()
    assert t.array().shape == (64,) and toks[1] == b"<s>"
    with pytest.raises(UsageError, match="no tensor named 'nope'"):
        f.tensor("nope")


def test_sniff(fixtures_dir):
    """Detection lives in the format registry (the reader's own magic check is for parsing)."""
    from hurray_interop.registry import sniff_format

    assert sniff_format((fixtures_dir / "kv-types.gguf").read_bytes()[:16]).name == "gguf"
    assert sniff_format(b"HRRY\x00\x00") is None and sniff_format(b"GG") is None


# --------------------------------------------------------------------------
# fixtures are reproducible
# --------------------------------------------------------------------------


def test_fixtures_regenerate_identically(fixtures_dir, tmp_path):
    if importlib.util.find_spec("gguf") is None:  # pragma: no cover
        pytest.skip("gguf-py is not installed")
    subprocess.run([sys.executable, str(fixtures_dir / "make_gguf_fixtures.py"), str(tmp_path)], check=True)
    for name in FIXTURES + SPLIT_FIXTURES:
        assert (tmp_path / name).read_bytes() == (fixtures_dir / name).read_bytes(), name
    assert sorted(p.name for p in tmp_path.glob("*.gguf")) == sorted(FIXTURES + SPLIT_FIXTURES)  # nothing unchecked
