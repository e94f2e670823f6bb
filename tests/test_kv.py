"""KV section codec: spec bytes, pyhurray as oracle, strictness on hostile input."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings, strategies as st

from hurray_interop.core.kv import KVValue, as_kv_value, decode_kv, encode_kv
from hurray_interop.errors import FormatError, InconsistentError, TruncatedError, UsageError

hurray = pytest.importorskip("hurray")


def entry(key: bytes, tag: int, payload: bytes) -> bytes:
    """One KV entry built by hand from file-format.md § KV Section Encoding."""
    return struct.pack("<H", len(key)) + key + bytes([tag]) + payload


def section(*entries: bytes) -> bytes:
    return struct.pack("<I", len(entries)) + b"".join(entries)


def kv_to_python(kv):
    """Plain Python values, as ``hurray.load_kv`` returns them."""
    return {k: v.to_python() for k, v in kv.items()}


# -- the spec's encodings, built by hand ---------------------------------------------

SPEC_CASES = [
    (b"s", 0x01, struct.pack("<I", 3) + "é!".encode(), KVValue.string("é!")),
    (b"i", 0x02, struct.pack("<q", -5), KVValue.int64(-5)),
    (b"u", 0x03, struct.pack("<Q", 2**64 - 1), KVValue.uint64(2**64 - 1)),
    (b"f", 0x04, struct.pack("<d", 0.1), KVValue.float64(0.1)),
    (b"t", 0x05, b"\x01", KVValue.bool(True)),
    (b"n", 0x05, b"\x00", KVValue.bool(False)),
    (b"b", 0x06, struct.pack("<I", 2) + b"\x00\xff", KVValue.bytes(b"\x00\xff")),
    (b"ai", 0x07, b"\x02" + struct.pack("<I2q", 2, 1, -1), KVValue.array("int64", [1, -1])),
    (b"au", 0x07, b"\x03" + struct.pack("<I1Q", 1, 2**63), KVValue.array("uint64", [2**63])),
    (b"as", 0x07, b"\x01" + struct.pack("<II", 2, 1) + b"a" + struct.pack("<I", 0), KVValue.array("string", ["a", ""])),
    (b"ab", 0x07, b"\x05" + struct.pack("<I", 3) + b"\x01\x00\x01", KVValue.array("bool", [True, False, True])),
    (b"ay", 0x07, b"\x06" + struct.pack("<II", 1, 1) + b"z", KVValue.array("bytes", [b"z"])),
    (b"af", 0x07, b"\x04" + struct.pack("<I2d", 2, 1.5, -0.0), KVValue.array("float64", [1.5, -0.0])),
    (b"ae", 0x07, b"\x01" + struct.pack("<I", 0), KVValue.array("string", [])),
]


@pytest.mark.parametrize("key,tag,payload,value", SPEC_CASES, ids=[c[0].decode() for c in SPEC_CASES])
def test_spec_bytes_decode_and_reencode(key, tag, payload, value):
    raw = section(entry(key, tag, payload))
    got = decode_kv(raw)
    assert list(got) == [key.decode()]
    assert got[key.decode()] == value
    assert got[key.decode()].type == value.type and got[key.decode()].element_type == value.element_type
    assert encode_kv(got) == raw
    assert encode_kv({key.decode(): value}) == raw


def test_all_types_in_one_section_keep_order():
    raw = section(*(entry(k, t, p) for k, t, p, _ in SPEC_CASES))
    got = decode_kv(raw)
    assert list(got) == [c[0].decode() for c in SPEC_CASES]
    assert encode_kv(got) == raw


def test_int64_and_uint64_stay_distinct():
    a, b = KVValue.int64(5), KVValue.uint64(5)
    assert a != b
    assert decode_kv(encode_kv({"k": b}))["k"].type == "uint64"
    assert encode_kv({"k": a}) != encode_kv({"k": b})


def test_float_bits_are_exact():
    nan = struct.unpack("<d", b"\x01\x00\x00\x00\x00\x00\xf8\x7f")[0]  # NaN with a payload
    v = decode_kv(section(entry(b"x", 0x04, b"\x01\x00\x00\x00\x00\x00\xf8\x7f")))["x"]
    assert math.isnan(v.value)
    assert encode_kv({"x": v})[-8:] == b"\x01\x00\x00\x00\x00\x00\xf8\x7f"
    assert KVValue.float64(nan) == v
    assert KVValue.float64(0.0) != KVValue.float64(-0.0)


# -- plain Python mapping, as pyhurray.save does it -------------------------------------


def test_python_mapping():
    assert as_kv_value(True) == KVValue.bool(True)
    assert as_kv_value(7) == KVValue.int64(7)
    assert as_kv_value(1.0) == KVValue.float64(1.0)
    assert as_kv_value("x") == KVValue.string("x")
    assert as_kv_value(b"x") == KVValue.bytes(b"x")
    assert as_kv_value([1, 2]) == KVValue.array("int64", [1, 2])
    assert as_kv_value([True]) == KVValue.array("bool", [True])


@pytest.mark.parametrize(
    "value,match",
    [
        ([], "empty list has no element type"),
        ([1, "a"], "one type"),
        ([True, 1], "one type"),
        ([[1]], "no nested arrays"),
        (2**63, "does not fit int64"),
        ({"a": 1}, "unsupported KV value"),
        (None, "unsupported KV value"),
    ],
)
def test_python_mapping_refusals(value, match):
    with pytest.raises(UsageError, match=match):
        encode_kv({"k": value})


@pytest.mark.parametrize(
    "key,match",
    [("", "must not be empty"), ("a\x00b", "NUL"), ("x" * 65536, "u16"), (3, "must be str"), ("\udc80", "UTF-8")],
)
def test_bad_keys_refused_on_write(key, match):
    with pytest.raises(UsageError, match=match):
        encode_kv({key: 1})


def test_explicit_value_validation():
    with pytest.raises(UsageError, match="out of range for uint64"):
        KVValue.uint64(-1)
    with pytest.raises(UsageError, match="nested arrays"):
        KVValue("array", [], "array")
    with pytest.raises(UsageError, match="expected bool"):
        KVValue.array("bool", [1])
    with pytest.raises(UsageError, match="unknown KV value type"):
        KVValue("complex", 1)


# -- pyhurray as the oracle ------------------------------------------------------------


def _pyhurray_kv_section(tmp_path, kv) -> bytes:
    """Write a file with pyhurray and cut out its KV section using the trailer (hand-parsed)."""
    p = tmp_path / "o.hrry"
    hurray.save(str(p), {"t": hurray.Tensor(bytes(4), hurray.float32, [1])}, kv=kv)
    raw = p.read_bytes()
    _, _, kvoff, kvlen = struct.unpack_from("<QQQI", raw, len(raw) - 40)
    return raw[kvoff : kvoff + kvlen]


_scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
)
_values = st.one_of(
    _scalars,
    st.lists(st.booleans(), min_size=1, max_size=4),
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=4),
    st.lists(st.floats(allow_nan=False), min_size=1, max_size=4),
    st.lists(st.text(max_size=4), min_size=1, max_size=4),
    st.lists(st.binary(max_size=4), min_size=1, max_size=4),
)
_keys = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(kv=st.dictionaries(_keys, _values, min_size=1, max_size=5))
def test_encode_matches_pyhurray_bytes(tmp_path_factory, kv):
    ref = _pyhurray_kv_section(tmp_path_factory.mktemp("kv"), kv)
    assert encode_kv(kv) == ref
    back = decode_kv(ref)
    assert list(back) == list(kv)
    assert kv_to_python(back) == kv


# -- strict reading ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw,exc,match,offset",
    [
        (section(entry(b"a", 0x02, bytes(8)), entry(b"a", 0x02, bytes(8))), InconsistentError, "duplicate KV key 'a'", 4 + 12 + 2),
        (section(entry(b"", 0x02, bytes(8))), FormatError, "key_length must be at least 1", 4),
        (section(entry(b"a\x00", 0x02, bytes(8))), FormatError, "NUL", 6),
        (section(entry(b"\xff", 0x02, bytes(8))), FormatError, "invalid UTF-8", 6),
        (section(entry(b"s", 0x01, struct.pack("<I", 1) + b"\xc3")), FormatError, "invalid UTF-8", 12),
        (section(entry(b"b", 0x05, b"\x02")), FormatError, "bool byte must be 0x00 or 0x01, got 0x02", 8),
        (section(entry(b"b", 0x07, b"\x05" + struct.pack("<I", 2) + b"\x01\x07")), FormatError, "got 0x07", 14),
        (section(entry(b"r", 0x08, b"\x00")), FormatError, "reserved value tag 0x08", 7),
        (section(entry(b"r", 0xEF, b"\x00")), FormatError, "reserved value tag 0xEF", 7),
        (section(entry(b"r", 0xF0, b"\x00")), FormatError, "private value tag 0xF0", 7),
        (section(entry(b"r", 0xFF, b"\x00")), FormatError, "invalid value tag 0xFF", 7),
        (section(entry(b"r", 0x00, b"\x00")), FormatError, "invalid value tag 0x00", 7),
        (section(entry(b"n", 0x07, b"\x07" + struct.pack("<I", 0))), FormatError, "nested arrays", 8),
        (section(entry(b"n", 0x07, b"\x09" + struct.pack("<I", 0))), FormatError, "reserved value tag 0x09", 8),
        (section(entry(b"s", 0x01, struct.pack("<I", 100) + b"ab")), TruncatedError, "needs 100 bytes", 12),
        (section(entry(b"i", 0x02, bytes(7))), TruncatedError, "needs 8 bytes", 8),
        (section(entry(b"i", 0x02, bytes(8))) + b"\x00", InconsistentError, "1 unused bytes", 4 + 12),
        (struct.pack("<I", 1), TruncatedError, "kv_count 1 cannot fit", 0),
        (b"\x01\x00", TruncatedError, "needs 4 bytes", 0),
    ],
)
def test_hostile_sections(raw, exc, match, offset):
    with pytest.raises(exc, match=match) as ei:
        decode_kv(raw, path="f.hrry", base=1000)
    assert ei.value.offset == 1000 + offset
    assert ei.value.path == "f.hrry"


@pytest.mark.parametrize("etag,minsize", [(0x01, 4), (0x02, 8), (0x05, 1), (0x06, 4)])
def test_huge_counts_rejected_before_allocating(etag, minsize):
    raw = section(entry(b"a", 0x07, bytes([etag]) + struct.pack("<I", 2**32 - 1) + bytes(16)))
    from opcount import counting

    with counting() as c:
        with pytest.raises(TruncatedError, match="cannot fit"):
            decode_kv(raw)
    assert c.peak < 64 << 10 and c.lines < 1_000, (c.peak, c.lines)  # refused before looping or allocating
    with pytest.raises(TruncatedError, match="kv_count 4294967295 cannot fit"):
        decode_kv(struct.pack("<I", 2**32 - 1) + bytes(64))


def test_truncation_everywhere_raises_only_format_errors():
    raw = section(*(entry(k, t, p) for k, t, p, _ in SPEC_CASES))
    for cut in range(len(raw)):
        with pytest.raises(FormatError):
            decode_kv(raw[:cut])


def test_large_vocabulary_arrays_match_pyhurray(tmp_path):
    """Tokenizer-sized arrays (fast paths) encode exactly as the reference does and round-trip."""
    rng = __import__("random").Random(5)
    toks = ["".join(rng.choice("abcĠé▁😀\n") for _ in range(rng.randrange(0, 6))) for _ in range(30_000)]
    kv = {"tokens": toks, "scores": [rng.uniform(-1, 1) for _ in range(30_000)], "ids": list(range(-5, 29_995))}
    ref = _pyhurray_kv_section(tmp_path, kv)
    assert encode_kv(kv) == ref
    back = decode_kv(ref)
    assert kv_to_python(back) == kv and encode_kv(back) == ref


# --- big values: streamed on write, views on read ---------------------------------------


def test_streamed_bytes_encode_like_the_in_memory_value(tmp_path) -> None:
    """A StreamedBytes value encodes to the same bytes as KVValue("bytes", data), from any offset
    of its file and across read chunks; the hand-built entry is the oracle."""
    from hurray_interop.core import kv as K

    data = bytes(range(256)) * (K.STREAM_CHUNK // 256 + 3)  # more than one read chunk
    with open(tmp_path / "spool", "w+b") as f:
        f.write(b"junk" + data + b"more junk")
        items = {"a": KVValue.string("x"), "big": K.StreamedBytes(f, 4, len(data)), "z": 7}
        memory = {"a": KVValue.string("x"), "big": KVValue.bytes(data), "z": 7}
        total, parts = K.encode_kv_parts(items)
        assert any(isinstance(p, K.StreamedBytes) for p in parts)
        enc = encode_kv(items)
    assert enc == encode_kv(memory) and total == len(enc)
    assert enc == section(entry(b"a", 0x01, struct.pack("<I", 1) + b"x"),
                          entry(b"big", 0x06, struct.pack("<I", len(data)) + data),
                          entry(b"z", 0x02, struct.pack("<q", 7)))


def test_streamed_bytes_short_file_is_an_error(tmp_path) -> None:
    from hurray_interop.core.kv import StreamedBytes

    with open(tmp_path / "spool", "w+b") as f:
        f.write(b"12345")
        with pytest.raises(UsageError, match="short"):
            encode_kv({"k": StreamedBytes(f, 2, 10)})


def test_big_bytes_decoded_from_a_read_only_buffer_are_views() -> None:
    from hurray_interop.core.kv import VIEW_BYTES

    big, small = bytes(range(256)) * (VIEW_BYTES // 256 + 1), b"abc"
    raw = encode_kv({"big": big, "small": small})
    kv = decode_kv(raw)
    v = kv["big"].view()
    assert v.obj is raw  # no copy of the section
    assert bytes(v) == big and kv["big"].value == big and isinstance(kv["big"].value, bytes)
    assert kv["big"] == KVValue.bytes(big) and hash(kv["big"]) == hash(KVValue.bytes(big))
    assert kv["big"].encode() == KVValue.bytes(big).encode() and encode_kv(kv) == raw
    assert kv["big"].to_python() == big
    assert isinstance(kv["small"].value, bytes) and bytes(kv["small"].view()) == small
    copied = decode_kv(bytearray(raw))["big"]  # a writable buffer may change: copied
    assert isinstance(copied.view().obj, bytes)
    with pytest.raises(UsageError):
        KVValue.string("s").view()
