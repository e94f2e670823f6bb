"""Every bounds rule of the readers and record parsers, at limit - 1, limit and limit + 1.

Each test names one comparison of a length, count or offset against its limit in
the product (module and rule in the test name and docstring) and builds the input
three times, with the compared quantity one below, at and one above the limit.
:func:`rule_fires` tells whether *that* rule rejected the input (its message, matched
by a pattern), not merely whether some later check did, so that a comparison moved
by one (``<`` for ``<=``) changes the outcome at exactly one of the three points.
``tests/mutate_bounds.py`` flips the covered comparisons one by one and checks
that this file catches each flip.

Inputs are hand-packed with ``struct`` (GGUF, safetensors, KV, records) or patched
into files written by the project's own writers (.hrry, descriptors), so the
expected outcome is computed here, not by the reader under test.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any, Callable

import numpy as np
import pytest

from hurray_interop.errors import HurrayInteropError

BELOW, AT, ABOVE = -1, 0, 1
DELTAS = (BELOW, AT, ABOVE)
#: the usual outcome: the input is rejected by the rule only beyond the limit
PAST = (False, False, True)
#: a minimum: rejected only below it
UNDER = (True, False, False)


def rule_fires(run: Callable[[], Any], pattern: str) -> bool:
    """Whether ``run()`` raised a project error whose one-line message matches ``pattern``
    (no error, or another rule's error, is False)."""
    try:
        run()
    except HurrayInteropError as e:
        return re.search(pattern, str(e)) is not None
    return False


def check_rule(make: Callable[[int], Callable[[], Any]], pattern: str, expect: tuple[bool, bool, bool] = PAST) -> None:
    """``make(delta)`` returns the call whose input sits ``delta`` from the limit."""
    got = tuple(rule_fires(make(d), pattern) for d in DELTAS)
    assert got == expect, f"rule /{pattern}/ fired {got} at limit-1, limit, limit+1; expected {expect}"


# ============================================================================================
# formats/gguf.py -- GGUFFile (in memory), hand-packed bytes


def _s(b: bytes | str) -> bytes:
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def _info(name: str, ne: list[int], type_id: int, offset: int) -> bytes:
    return _s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", type_id, offset)


def _head(n_t: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_t, n_kv)


def _gguf(kvs: list[bytes], infos: list[bytes], data: bytes = b"", align: int = 32) -> bytes:
    meta = _head(len(infos), len(kvs)) + b"".join(kvs) + b"".join(infos)
    return meta + bytes(-len(meta) % align) + data


GU8, GU16, GU32, GSTRING, GARRAY = 0, 2, 4, 8, 9
I8 = 24  # GGML type id of I8: one byte per element, block size 1
ALIGN1 = _s("general.alignment") + struct.pack("<II", GU32, 1)


def _parse_gguf(raw: bytes) -> Callable[[], Any]:
    from hurray_interop.formats.gguf import GGUFFile

    return lambda: GGUFFile(raw, path="bounds.gguf")


def test_gguf_magic_needs_4_bytes():
    """gguf.py _parse_header: ``size < 4`` -> "too short for the GGUF magic" (file of 3, 4, 5 bytes)."""
    check_rule(lambda d: _parse_gguf((b"GGUF" + bytes(8))[: 4 + d]), "too short for the GGUF magic", UNDER)
    assert rule_fires(_parse_gguf(b"GGUF"), "version at offset 4: needs 4 bytes")  # the magic was accepted


def test_gguf_u32_field_needs_4_bytes():
    """gguf.py _Parser.u32: ``end - pos < 4`` (the version field with 3, 4, 5 bytes left)."""
    check_rule(lambda d: _parse_gguf(b"GGUF" + b"\x03\x00\x00\x00\x00"[: 4 + d]), r"version at offset 4: needs 4 bytes", UNDER)


def test_gguf_u64_field_needs_8_bytes():
    """gguf.py _Parser.u64: ``end - pos < 8`` (the tensor count with 7, 8, 9 bytes left)."""
    check_rule(lambda d: _parse_gguf(b"GGUF" + struct.pack("<I", 3) + bytes(8 + d)), r"tensor count at offset 8: needs 8 bytes", UNDER)


def test_gguf_header_kv_count_against_bytes_left():
    """gguf.py _parse_header: ``n_kv > left // _MIN_KV`` (13 bytes per entry; 26 bytes left: 1, 2, 3 entries)."""
    check_rule(lambda d: _parse_gguf(_head(0, 2 + d) + bytes(26)), "metadata entries and .* cannot fit")


def test_gguf_header_tensor_count_against_bytes_left():
    """gguf.py _parse_header: ``n_tensors > left // _MIN_TENSOR_INFO`` (24 bytes per info; 48 left: 1, 2, 3)."""
    check_rule(lambda d: _parse_gguf(_head(2 + d, 0) + bytes(48)), "metadata entries and .* cannot fit")


def test_gguf_header_both_counts_against_bytes_left():
    """gguf.py _parse_header: ``n_kv * 13 + n_tensors * 24 > left`` (2 entries + 1 info = 50 bytes; 51, 50, 49 left)."""
    check_rule(lambda d: _parse_gguf(_head(1, 2) + bytes(50 - d)), "metadata entries and .* cannot fit")


def test_gguf_string_length_against_bytes_left():
    """gguf.py _Parser.string: ``n > end - pos`` (a key of 9, 10, 11 bytes with 10 bytes left)."""
    check_rule(lambda d: _parse_gguf(_head(0, 1) + struct.pack("<Q", 10 + d) + bytes(10)), r"string length \d+ exceeds")


def test_gguf_scalar_value_against_bytes_left():
    """gguf.py _Parser.value: ``end - pos < itemsize`` (a UINT32 value with 3, 4, 5 bytes left)."""
    check_rule(lambda d: _parse_gguf(_head(0, 1) + _s("k") + struct.pack("<I", GU32) + bytes(4 + d)),
               r"metadata 'k' at offset \d+: needs 4 bytes", UNDER)


def test_gguf_array_count_against_bytes_left():
    """gguf.py _Parser.value: ``count > left // min_size`` (UINT16 array of 4, 5, 6 with 10 bytes left)."""
    check_rule(lambda d: _parse_gguf(_head(0, 1) + _s("k") + struct.pack("<IIQ", GARRAY, GU16, 5 + d) + bytes(10)),
               r"array of \d+ UINT16 elements needs")


def test_gguf_string_array_count_against_bytes_left():
    """gguf.py _Parser.value: ``count > left // min_size`` for strings (8 bytes each; 24 bytes left: 2, 3, 4)."""
    check_rule(lambda d: _parse_gguf(_head(0, 1) + _s("k") + struct.pack("<IIQ", GARRAY, GSTRING, 3 + d) + bytes(24)),
               r"array of \d+ STRING elements needs")


def _nested(levels: int) -> bytes:
    """A metadata value of ``levels`` arrays, each holding one array, the innermost holding no UINT8."""
    body = struct.pack("<IQ", GU8, 0)
    for _ in range(levels - 1):
        body = struct.pack("<IQ", GARRAY, 1) + body
    return struct.pack("<I", GARRAY) + body


def test_gguf_array_nesting_depth():
    """gguf.py _Parser.value: ``depth + 1 >= MAX_ARRAY_DEPTH`` (7, 8, 9 nested arrays; 8 is the limit)."""
    from hurray_interop.formats.gguf import MAX_ARRAY_DEPTH

    assert MAX_ARRAY_DEPTH == 8
    check_rule(lambda d: _parse_gguf(_gguf([_s("k") + _nested(8 + d)], [])), "nested deeper than 8")
    assert _parse_gguf(_gguf([_s("k") + _nested(8)], []))().kv["k"] is not None


def test_gguf_last_string_of_an_array_against_the_end():
    """gguf.py _Parser._strings: ``len(starts) < count`` (kernels.string_starts): the second
    string's bytes end 1 before, at, 1 after the end of the file."""
    def make(d: int) -> Callable[[], Any]:
        first = _s("ab")
        rest = b"xyz"
        return _parse_gguf(_head(0, 1) + _s("k") + struct.pack("<IIQ", GARRAY, GSTRING, 2) + first
                           + struct.pack("<Q", len(rest) + d) + rest)
    check_rule(make, r"'k'\[1\] length")
    assert list(make(AT)().kv["k"].value) == [b"ab", b"xyz"]


def test_gguf_string_array_length_prefix_against_the_end():
    """gguf.py _Parser._string_overrun: ``end - at < 8``: the second string's length prefix has
    7, 8, 9 bytes (all 0xFF): "needs 8 bytes" only for 7; beyond it the length is too large."""
    def make(d: int) -> Callable[[], Any]:
        return _parse_gguf(_head(0, 1) + _s("k") + struct.pack("<IIQ", GARRAY, GSTRING, 2) + _s("ab") + b"\xff" * (8 + d))
    check_rule(make, r"'k'\[1\] length at offset \d+: needs 8 bytes", UNDER)
    assert rule_fires(make(AT), r"'k'\[1\] length at offset \d+: string length 18446744073709551615 exceeds")


def test_gguf_n_dims_maximum():
    """gguf.py _parse_tensor_info: ``n_dims > MAX_DIMS`` (3, 4, 5 dimensions)."""
    check_rule(lambda d: _parse_gguf(_gguf([], [_info("w", [1] * (4 + d), I8, 0)], bytes(32))), r"n_dims \d+ exceeds the maximum 4")


def test_gguf_ne_against_bytes_left():
    """gguf.py _parse_tensor_info: ``size - pos < 8 * n_dims`` (2 dimensions, 15, 16, 17 bytes left)."""
    check_rule(lambda d: _parse_gguf(_head(1, 0) + _s("w") + struct.pack("<I", 2) + bytes(16 + d)), r"'w' ne at offset \d+: needs 16 bytes", UNDER)


def test_gguf_ne_as_int64():
    """gguf.py _parse_tensor_info: ``d > _I64_MAX`` (ne[0] = 2**63 - 2, 2**63 - 1, 2**63)."""
    check_rule(lambda d: _parse_gguf(_gguf([], [_info("w", [2**63 - 1 + d], I8, 0)], bytes(32))), r"ne\[0\] = \d+ is negative as int64")


def test_gguf_element_count_as_int64():
    """gguf.py _parse_tensor_info: ``n_el > _I64_MAX`` (2**63 - 2, 2**63 - 1, 2**63 elements in two dimensions)."""
    shapes = {BELOW: [2**62 - 1, 2], AT: [2**63 - 1, 1], ABOVE: [2**62, 2]}
    check_rule(lambda d: _parse_gguf(_gguf([], [_info("w", shapes[d], I8, 0)], bytes(32))), "overflows int64")


def test_gguf_tensor_data_against_the_end():
    """gguf.py _place: ``start + nbytes > size`` (I8[31], I8[32], I8[33] with 32 data bytes)."""
    check_rule(lambda d: _parse_gguf(_gguf([], [_info("w", [32 + d], I8, 0)], bytes(32))), "extends past the end of the file")


def test_gguf_tensor_overlap():
    """gguf.py _check_data_region: ``t.data_offset < cur``: I8[33]@0 then I8[4] at 32, 33, 34
    (alignment 1). The issue's mutant accepted I8[4]@32."""
    def make(d: int) -> Callable[[], Any]:
        return _parse_gguf(_gguf([ALIGN1], [_info("a", [33], I8, 0), _info("b", [4], I8, 33 + d)], bytes(33 + d + 4), align=1))
    check_rule(make, "overlaps tensor 'a'", UNDER)


def test_gguf_trailing_bytes_after_the_data():
    """gguf.py _check_data_region: ``tail > pad`` (I8[20], alignment 32: 11, 12, 13 bytes after the data)."""
    check_rule(lambda d: _parse_gguf(_gguf([], [_info("w", [20], I8, 0)], bytes(20 + 12 + d))), "bytes follow the end of the tensor data")


def test_gguf_string_array_index_bounds():
    """gguf.py StringArray.__getitem__: ``i < 0`` and ``0 <= i < n``, and _span's ``i + 1 < len``
    (the last string ends at the array's end): indices -n-1 .. n+1 of a 3-string array."""
    from hurray_interop.formats.gguf import StringArray

    a = StringArray.from_list(["a", "bc", "def"])
    assert [a[i] for i in (-3, -2, -1, 0, 1, 2)] == [b"a", b"bc", b"def"] * 2
    for i in (-4, 3, 4):
        with pytest.raises(IndexError, match="StringArray index out of range"):
            a[i]


# ============================================================================================
# formats/safetensors.py -- SafetensorsFile on files in tmp_path, hand-packed headers


def _st(header: dict | bytes, data: bytes = b"", *, length_delta: int = 0) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) + length_delta) + raw + data


@pytest.fixture
def open_st(tmp_path):
    """``open_st(raw)`` -> the call that opens ``raw`` written to a fresh .safetensors file."""
    from hurray_interop.formats.safetensors import SafetensorsFile

    count = iter(range(10**6))

    def make(raw: bytes) -> Callable[[], Any]:
        p = tmp_path / f"b{next(count)}.safetensors"
        p.write_bytes(raw)

        def run() -> None:
            with SafetensorsFile(p):
                pass
        return run
    return make


def _u8(n: int, begin: int = 0) -> dict:
    return {"dtype": "U8", "shape": [n], "data_offsets": [begin, begin + n]}


def test_safetensors_file_needs_8_bytes(open_st):
    """safetensors.py SafetensorsFile: ``size < 8`` (files of 7, 8, 9 bytes)."""
    check_rule(lambda d: open_st(bytes(8 + d)), "the header length needs 8", UNDER)


def test_safetensors_header_length_maximum(open_st):
    """safetensors.py SafetensorsFile: ``n > MAX_HEADER`` (a claimed header of 10**8 - 1, 10**8,
    10**8 + 1 bytes in a small file: only the last is over the limit, the others run past the end)."""
    from hurray_interop.formats.safetensors import MAX_HEADER

    check_rule(lambda d: open_st(struct.pack("<Q", MAX_HEADER + d) + b"{}"), rf"exceeds the {MAX_HEADER}-byte limit")
    assert rule_fires(open_st(struct.pack("<Q", MAX_HEADER) + b"{}"), "runs past the end")


def test_safetensors_header_against_the_file(open_st):
    """safetensors.py SafetensorsFile: ``8 + n > size`` (header length one short, exact, one long)."""
    check_rule(lambda d: open_st(_st({}, length_delta=d)), "runs past the end")
    open_st(_st({}))()


def test_safetensors_shape_dimensions_non_negative(open_st):
    """safetensors.py _parse_header: ``d >= 0`` for every dimension (shape [-1], [0], [1])."""
    def make(d: int) -> Callable[[], Any]:
        n = max(d, 0)
        return open_st(_st({"t": {"dtype": "U8", "shape": [d], "data_offsets": [0, n]}}, bytes(n)))
    check_rule(make, "is not a list of non-negative integers", UNDER)
    make(AT)()
    make(ABOVE)()


def test_safetensors_begin_non_negative(open_st):
    """safetensors.py _parse_header: ``0 <= offs[0]`` (an empty tensor at -1, 0, 1)."""
    make = lambda d: open_st(_st({"t": {"dtype": "U8", "shape": [0], "data_offsets": [d, d]}}))  # noqa: E731
    check_rule(make, r"are not \[begin, end\]", UNDER)
    make(AT)()


def test_safetensors_begin_not_after_end(open_st):
    """safetensors.py _parse_header: ``offs[0] <= offs[1]`` (begin 1, end 0, 1, 2)."""
    make = lambda d: open_st(_st({"a": _u8(1), "t": {"dtype": "U8", "shape": [0], "data_offsets": [1, 1 + d]}}, bytes(1)))  # noqa: E731
    check_rule(make, r"are not \[begin, end\]", UNDER)
    make(AT)()


def test_safetensors_end_against_the_data_section(open_st):
    """safetensors.py _parse_header: ``offs[1] > data_size`` (U8[3], U8[4], U8[5] with 4 data bytes)."""
    check_rule(lambda d: open_st(_st({"t": _u8(4 + d)}, bytes(4))), "run past the 4-byte data section")
    open_st(_st({"t": _u8(4)}, bytes(4)))()


def test_safetensors_tensors_cover_the_data_section(open_st):
    """safetensors.py _parse_header: ``e.begin != pos`` / ``e.begin < pos`` and ``pos != data_size``:
    U8[4] at 0 then U8[4] at 3, 4, 5 (overlap, exact, gap), with data for exactly the second's end."""
    make = lambda d: open_st(_st({"a": _u8(4), "b": _u8(4, 4 + d)}, bytes(8 + d)))  # noqa: E731
    check_rule(make, "overlaps the previous tensor", UNDER)
    assert rule_fires(make(ABOVE), "leaves a gap of 1 bytes")
    make(AT)()
    check_rule(lambda d: open_st(_st({"a": _u8(4)}, bytes(4 + d))), r"tensors cover \d+ bytes of the")  # below: the end runs past


# ============================================================================================
# core/kv.py -- decode_kv on hand-packed KV sections; files/binary.py -- Reader


def _kv_entry(key: str, tag: int, payload: bytes) -> bytes:
    k = key.encode()
    return struct.pack("<H", len(k)) + k + bytes([tag]) + payload


def _kv(entries: list[bytes], count: int | None = None, extra: bytes = b"") -> Callable[[], Any]:
    from hurray_interop.core.kv import decode_kv

    raw = struct.pack("<I", len(entries) if count is None else count) + b"".join(entries) + extra
    return lambda: decode_kv(raw, path="bounds.kv")


T_STRING, T_UINT64, T_BOOL, T_ARRAY = 0x01, 0x03, 0x05, 0x07


def test_kv_count_against_bytes_left():
    """kv.py decode_kv: ``count * 5 > r.remaining`` (10 bytes after the count: 1, 2, 3 entries)."""
    check_rule(lambda d: _kv([], count=2 + d, extra=bytes(10)), r"kv_count \d+ cannot fit")


def test_kv_array_count_against_bytes_left():
    """kv.py decode_kv: ``n * _MIN_PAYLOAD[ekind] > r.remaining`` (uint64 array of 1, 2, 3 with 16 bytes left)."""
    def make(d: int) -> Callable[[], Any]:
        return _kv([_kv_entry("k", T_ARRAY, bytes([T_UINT64]) + struct.pack("<I", 2 + d) + bytes(16))])
    check_rule(make, r"array of \d+ uint64 elements cannot fit")
    assert make(AT)()["k"].value == (0, 0)


def test_kv_string_array_length_prefix_against_the_end():
    """kv.py _read_strings: ``pos + 4 > end`` (the second string's length prefix has 3, 4, 5 bytes)."""
    def make(d: int) -> Callable[[], Any]:
        return _kv([_kv_entry("k", T_ARRAY, bytes([T_STRING]) + struct.pack("<I", 2) + struct.pack("<I", 1) + b"a" + bytes(4 + d))])
    check_rule(make, r"element 1 length at offset \d+: needs 4 bytes", UNDER)
    assert make(AT)()["k"].value == ("a", "")


def test_kv_string_array_element_against_the_end():
    """kv.py _read_strings: ``pos + ln > end`` (the second string claims 2, 3, 4 bytes; 3 are left)."""
    def make(d: int) -> Callable[[], Any]:
        return _kv([_kv_entry("k", T_ARRAY, bytes([T_STRING]) + struct.pack("<I", 2) + struct.pack("<I", 1) + b"a"
                              + struct.pack("<I", 3 + d) + b"xyz")])
    check_rule(make, r"element 1 at offset \d+: needs \d+ bytes")
    assert make(AT)()["k"].value == ("a", "xyz")


def test_kv_bool_byte_maximum():
    """kv.py _read_scalar: ``b > 1`` (bool bytes 0, 1, 2)."""
    check_rule(lambda d: _kv([_kv_entry("k", T_BOOL, bytes([1 + d]))]), "bool byte must be 0x00 or 0x01")
    assert _kv([_kv_entry("k", T_BOOL, b"\x01")])()["k"].value is True


def test_kv_bool_array_byte_maximum():
    """kv.py decode_kv: ``b > 1`` in a bool array (last element 0, 1, 2)."""
    def make(d: int) -> Callable[[], Any]:
        return _kv([_kv_entry("k", T_ARRAY, bytes([T_BOOL]) + struct.pack("<I", 2) + bytes([1, 1 + d]))])
    check_rule(make, r"element 1 at offset \d+: bool byte must be")
    assert make(AT)()["k"].value == (True, True)


def test_kv_private_tag_range():
    """kv.py _tag_kind: ``0xF0 <= tag <= 0xFE`` (tags 0xEF, 0xF0, 0xF1 and 0xFD, 0xFE, 0xFF)."""
    check_rule(lambda d: _kv([_kv_entry("k", 0xF0 + d, b"x")]), "private value tag", (False, True, True))
    check_rule(lambda d: _kv([_kv_entry("k", 0xFE + d, b"x")]), "private value tag", (True, True, False))


def test_binary_reader_need():
    """files/binary.py Reader.need: ``n < 0`` and ``pos + n > end`` (4 bytes: read 3, 4, 5 from 0;
    need -1, 0, 1 bytes at the end)."""
    from hurray_interop.files.binary import Reader

    check_rule(lambda d: lambda: Reader(bytes(4), path="b").bytes(4 + d, "field"), r"field at offset 0: needs \d+ bytes")
    assert Reader(bytes(range(4))).bytes(4, "f") == bytes(range(4))

    def at_end(d: int) -> Callable[[], Any]:
        r = Reader(bytes(4), 4, path="b")
        return lambda: r.skip(d, "field")
    check_rule(at_end, r"field at offset 4: needs", (True, False, True))


def test_binary_reader_array_count():
    """files/binary.py Reader.array: ``count < 0`` (counts -1, 0, 1 of 4 available bytes)."""
    from hurray_interop.files.binary import Reader

    check_rule(lambda d: lambda: Reader(bytes(4), path="b").array("<u2", d, "field"), "negative count", UNDER)
    assert Reader(bytes(4)).array("<u2", 0, "f").size == 0


# ============================================================================================
# core/hrry.py -- HrryFile on a file written by hrry.save, fields patched (index CRC recomputed)


def _crc32c(b: bytes) -> int:
    crc32c = pytest.importorskip("crc32c")
    return crc32c.crc32c(b)


@pytest.fixture(scope="module")
def hrry_base(tmp_path_factory) -> bytes:
    """Two uint8[4] tensors "a", "b" and a KV section, written by hrry.save."""
    from hurray_interop.core.hrry import save
    from hurray_interop.core.model import BufferHandle, Descriptor, RowMajor, Tensor
    from hurray_interop.core.elements import element_type

    def t(name: str) -> Tensor:
        desc = Descriptor(element_type=element_type("uint8"), shape=(4,), buffers=(BufferHandle.cpu(4),), layout=RowMajor())
        return Tensor(name, desc, (b"abcd",))
    p = tmp_path_factory.mktemp("hrry") / "base.hrry"
    save(p, [t("a"), t("b")], kv={"p": 1})
    return p.read_bytes()


def _hrry_layout(raw: bytes) -> dict:
    t0 = len(raw) - 40
    ioff, ilen, kvoff, kvlen = struct.unpack_from("<QQQI", raw, t0)
    (n,) = struct.unpack_from("<Q", raw, ioff)
    p, entries = ioff + 8, []
    for _ in range(n):
        (ln,) = struct.unpack_from("<H", raw, p)
        doff, dlen, daoff, dalen, _fl = struct.unpack_from("<QIQQI", raw, p + 2 + ln)
        entries.append(dict(tail=p + 2 + ln, doff=doff, dlen=dlen, daoff=daoff, dalen=dalen))
        p += 2 + ln + 32
    (first,) = struct.unpack_from("<Q", raw, 20)
    return dict(t0=t0, ioff=ioff, ilen=ilen, kvoff=kvoff, kvlen=kvlen, entries=entries, first=first, size=len(raw))


@pytest.fixture
def patched_hrry(hrry_base, tmp_path):
    """``patched_hrry(patch)(d)`` -> the call that opens the base file after ``patch(raw, L, d)``."""
    from hurray_interop.core.hrry import HrryFile

    count = iter(range(10**6))

    def with_patch(patch: Callable[[bytearray, dict, int], Any], *, crc: bool = True) -> Callable[[int], Callable[[], Any]]:
        def make(d: int) -> Callable[[], Any]:
            raw = bytearray(hrry_base)
            L = _hrry_layout(hrry_base)
            out = patch(raw, L, d)
            raw = out if out is not None else raw
            if crc:
                ioff, ilen = struct.unpack_from("<QQ", raw, len(raw) - 40)
                if ioff + ilen <= len(raw):
                    struct.pack_into("<I", raw, len(raw) - 12, _crc32c(bytes(raw[ioff: ioff + ilen])))
            p = tmp_path / f"p{next(count)}.hrry"
            p.write_bytes(bytes(raw))

            def run() -> None:
                with HrryFile(p):
                    pass
            return run
        return make
    return with_patch


def test_hrry_base_file_opens(patched_hrry):
    patched_hrry(lambda raw, L, d: None)(AT)()


def test_hrry_minimum_file_size(patched_hrry, hrry_base):
    """hrry.py _open: ``size < minimum`` (64 + 8 + 40 = 112; the first 111, 112, 113 bytes of a file)."""
    check_rule(patched_hrry(lambda raw, L, d: raw[: 112 + d], crc=False), "shorter than the minimum 112", UNDER)


def test_hrry_container_major_version(patched_hrry):
    """hrry.py _open: ``major > 1`` (container_version_major 0, 1, 2)."""
    def patch(raw: bytearray, L: dict, d: int) -> None:
        raw[8] = 1 + d
    check_rule(patched_hrry(patch), "newer than the supported 1.x")


@pytest.mark.parametrize("limit,expect", [(4096, UNDER), (2 << 20, PAST)], ids=["MIN_ALIGNMENT", "MAX_ALIGNMENT"])
def test_hrry_alignment_range(patched_hrry, limit, expect):
    """hrry.py _open: ``MIN_ALIGNMENT <= align <= MAX_ALIGNMENT`` (the powers of two around each
    limit: a non-power of two fails the power-of-two rule whatever the range)."""
    def patch(raw: bytearray, L: dict, d: int) -> None:
        struct.pack_into("<I", raw, 16, limit * 2**d if d >= 0 else limit // 2)
    check_rule(patched_hrry(patch), "is not a power of two between 4096 and 2097152", expect)


def test_hrry_first_descriptor_offset_minimum(patched_hrry):
    """hrry.py _open: ``first < HEADER_SIZE`` (first_descriptor_offset 56, 64, 72: the 8-aligned neighbours of 64)."""
    def patch(raw: bytearray, L: dict, d: int) -> None:
        struct.pack_into("<Q", raw, 20, 64 + 8 * d)
    check_rule(patched_hrry(patch), "is not an 8-aligned offset >= 64", UNDER)


def test_hrry_index_against_the_trailer(patched_hrry):
    """hrry.py _open: ``ioff + ilen > end_of_body`` (index_length reaching 1 before, to, 1 into the trailer)."""
    def patch(raw: bytearray, L: dict, d: int) -> None:
        struct.pack_into("<Q", raw, L["t0"] + 8, L["t0"] - L["ioff"] + d)
    check_rule(patched_hrry(patch), "runs into the trailer")


def test_hrry_index_offset_minimum(patched_hrry):
    """hrry.py _open: ``ioff < first`` (index_offset first - 8, first, first + 8; its end kept)."""
    def patch(raw: bytearray, L: dict, d: int) -> None:
        ioff = L["first"] + 8 * d
        struct.pack_into("<QQ", raw, L["t0"], ioff, L["ioff"] + L["ilen"] - ioff)
    check_rule(patched_hrry(patch), "lies inside the file header", UNDER)


def test_hrry_index_length_minimum(patched_hrry):
    """hrry.py _open: ``ilen < 8`` (index_length 7, 8, 9)."""
    def patch(raw: bytearray, L: dict, d: int) -> None:
        struct.pack_into("<Q", raw, L["t0"] + 8, 8 + d)
    check_rule(patched_hrry(patch), "cannot hold its entry count", UNDER)


def test_hrry_kv_offset_minimum(patched_hrry):
    """hrry.py _open: ``kvoff < first`` (kv_offset first - 8, first, first + 8; its end kept)."""
    def patch(raw: bytearray, L: dict, d: int) -> None:
        kvoff = L["first"] + 8 * d
        struct.pack_into("<QI", raw, L["t0"] + 16, kvoff, L["kvoff"] + L["kvlen"] - kvoff)
    check_rule(patched_hrry(patch), r"KV section \[\d+, \d+\) is outside the body", UNDER)


def test_hrry_kv_end_against_the_trailer(patched_hrry):
    """hrry.py _open: ``kvoff + kvlen > end_of_body`` (kv_length reaching 1 before, to, 1 into the trailer)."""
    def patch(raw: bytearray, L: dict, d: int) -> None:
        struct.pack_into("<I", raw, L["t0"] + 24, L["t0"] - L["kvoff"] + d)
    check_rule(patched_hrry(patch), r"KV section \[\d+, \d+\) is outside the body")


def test_hrry_index_entry_count_against_the_index(patched_hrry):
    """hrry.py _parse_index: ``count * (INDEX_ENTRY_FIXED + 1) > r.remaining`` (index of 2 one-letter
    entries, 2 * 33 + ... bytes: counts limit - 1, limit, limit + 1 with limit = remaining // 31)."""
    def patch(raw: bytearray, L: dict, d: int) -> None:
        limit = (L["ilen"] - 8) // 31
        struct.pack_into("<Q", raw, L["ioff"], limit + d)
    check_rule(patched_hrry(patch), r"index_entry_count \d+ cannot fit")


def test_hrry_descriptor_length_minimum(patched_hrry):
    """hrry.py _parse_index: ``dlen < 20`` (descriptor_length 19, 20, 21)."""
    def patch(raw: bytearray, L: dict, d: int) -> None:
        struct.pack_into("<I", raw, L["entries"][0]["tail"] + 8, 20 + d)
    check_rule(patched_hrry(patch), "is below the minimum 20", UNDER)


def test_hrry_data_range_against_the_body(patched_hrry):
    """hrry.py _check_ranges: ``end > body_end`` (the last tensor's data_length reaching 1 before,
    to, 1 past the end of the body)."""
    def patch(raw: bytearray, L: dict, d: int) -> None:
        e = max(L["entries"], key=lambda e: e["daoff"])
        struct.pack_into("<Q", raw, e["tail"] + 20, L["t0"] - e["daoff"] + d)
    check_rule(patched_hrry(patch), r"data range \[\d+, \d+\) extends past the tensor data")


def test_hrry_descriptor_offset_minimum(patched_hrry):
    """hrry.py _check_ranges: ``start < h.first_descriptor_offset`` (first_descriptor_offset moved
    to the first descriptor's offset - 8, itself, + 8)."""
    def patch(raw: bytearray, L: dict, d: int) -> None:
        doff = min(e["doff"] for e in L["entries"])
        struct.pack_into("<Q", raw, 20, doff + 8 * d)
    check_rule(patched_hrry(patch), "lies before first_descriptor_offset", PAST)


def test_hrry_ranges_overlap(patched_hrry):
    """hrry.py _check_ranges: ``b[0] < a[1]`` (the first descriptor's length ending 1 before, at,
    1 after the start of the next range)."""
    def patch(raw: bytearray, L: dict, d: int) -> None:
        e = min(L["entries"], key=lambda e: e["doff"])
        starts = [x["doff"] for x in L["entries"]] + [x["daoff"] for x in L["entries"]] + [L["kvoff"], L["ioff"]]
        nxt = min(s for s in starts if s > e["doff"])
        struct.pack_into("<I", raw, e["tail"] + 8, nxt - e["doff"] + d)
    check_rule(patched_hrry(patch), r"descriptor of tensor '\w' \[\d+, \d+\) overlaps|overlaps descriptor of tensor")
