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
    """gguf.py through binary.Reader.u32 (Reader.need: ``pos + 4 > end``) (the version field with 3, 4, 5 bytes left)."""
    check_rule(lambda d: _parse_gguf(b"GGUF" + b"\x03\x00\x00\x00\x00"[: 4 + d]), r"version at offset 4: needs 4 bytes", UNDER)


def test_gguf_u64_field_needs_8_bytes():
    """gguf.py through binary.Reader.u64 (Reader.need: ``pos + 8 > end``) (the tensor count with 7, 8, 9 bytes left)."""
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
    """binary.Reader.string (GGUF strings): ``n > end - pos`` (a key of 9, 10, 11 bytes with 10 bytes left)."""
    check_rule(lambda d: _parse_gguf(_head(0, 1) + struct.pack("<Q", 10 + d) + bytes(10)), r"string length \d+ exceeds")


def test_gguf_scalar_value_against_bytes_left():
    """gguf.py _value through binary.Reader.scalar (Reader.need: ``pos + itemsize > end``) (a UINT32 value with 3, 4, 5 bytes left)."""
    check_rule(lambda d: _parse_gguf(_head(0, 1) + _s("k") + struct.pack("<I", GU32) + bytes(4 + d)),
               r"metadata 'k' at offset \d+: needs 4 bytes", UNDER)


def test_gguf_array_count_against_bytes_left():
    """gguf.py _value: ``count > left // min_size`` (UINT16 array of 4, 5, 6 with 10 bytes left)."""
    check_rule(lambda d: _parse_gguf(_head(0, 1) + _s("k") + struct.pack("<IIQ", GARRAY, GU16, 5 + d) + bytes(10)),
               r"array of \d+ UINT16 elements needs")


def test_gguf_string_array_count_against_bytes_left():
    """gguf.py _value: ``count > left // min_size`` for strings (8 bytes each; 24 bytes left: 2, 3, 4)."""
    check_rule(lambda d: _parse_gguf(_head(0, 1) + _s("k") + struct.pack("<IIQ", GARRAY, GSTRING, 3 + d) + bytes(24)),
               r"array of \d+ STRING elements needs")


def _nested(levels: int) -> bytes:
    """A metadata value of ``levels`` arrays, each holding one array, the innermost holding no UINT8."""
    body = struct.pack("<IQ", GU8, 0)
    for _ in range(levels - 1):
        body = struct.pack("<IQ", GARRAY, 1) + body
    return struct.pack("<I", GARRAY) + body


def test_gguf_array_nesting_depth():
    """gguf.py _value: ``depth + 1 >= MAX_ARRAY_DEPTH`` (7, 8, 9 nested arrays; 8 is the limit)."""
    from hurray_interop.formats.gguf import MAX_ARRAY_DEPTH

    assert MAX_ARRAY_DEPTH == 8
    check_rule(lambda d: _parse_gguf(_gguf([_s("k") + _nested(8 + d)], [])), "nested deeper than 8")
    assert _parse_gguf(_gguf([_s("k") + _nested(8)], []))().kv["k"] is not None


def test_gguf_last_string_of_an_array_against_the_end():
    """binary.Reader.string_starts: ``len(starts) < count`` (kernels.string_starts): the second
    string's bytes end 1 before, at, 1 after the end of the file."""
    def make(d: int) -> Callable[[], Any]:
        first = _s("ab")
        rest = b"xyz"
        return _parse_gguf(_head(0, 1) + _s("k") + struct.pack("<IIQ", GARRAY, GSTRING, 2) + first
                           + struct.pack("<Q", len(rest) + d) + rest)
    check_rule(make, r"'k'\[1\] length")
    assert list(make(AT)().kv["k"].value) == [b"ab", b"xyz"]


def test_gguf_string_array_length_prefix_against_the_end():
    """binary.Reader.string_starts through Reader.u64 (Reader.need: ``pos + 8 > end``): the second string's length prefix has
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


def test_binary_reader_string_in_an_embedded_region():
    """files/binary.py Reader.string: ``n > end - pos`` in ``buf[4:16]`` of a structure embedded at
    byte 100 (a 3-byte string with 2, 3, 4 bytes left): the offset is the length prefix's, plus base."""
    from hurray_interop.files.binary import Reader

    def make(d: int) -> Callable[[], Any]:
        buf = bytes(4) + struct.pack("<Q", 3) + b"abcd"
        return lambda: Reader(buf, 4, 15 + d, base=100, path="b").string("s")
    check_rule(make, r"b: s length at offset 104: string length 3 exceeds the \d+ bytes left", UNDER)
    assert Reader(bytes(4) + struct.pack("<Q", 3) + b"abcd", 4, 15).string("s") == b"abc"


def test_binary_reader_string_starts_in_an_embedded_region():
    """files/binary.py Reader.string_starts: ``len(starts) < count``: two strings ("a", "bc") in
    ``buf[2:end]``, ``end`` 1 short of, at, 1 past the second's last byte; offsets are relative to
    ``buf`` and errors name the string and its length prefix (plus base)."""
    from hurray_interop.files.binary import Reader

    buf = b"zz" + struct.pack("<Q", 1) + b"a" + struct.pack("<Q", 2) + b"bc"
    def make(d: int) -> Callable[[], Any]:
        return lambda: Reader(buf, 2, len(buf) + d, base=100, path="b").string_starts(2, "v")
    check_rule(make, r"b: v\[1\] length at offset 111: string length 2 exceeds the 1 bytes left", UNDER)
    r = Reader(buf, 2)
    assert r.string_starts(2, "v").tolist() == [10, 19] and r.pos == len(buf)
    short = Reader(buf, 2, 15, base=100, path="b")  # the second length prefix cut to 4 bytes
    assert rule_fires(lambda: short.string_starts(2, "v"), r"b: v\[1\] length at offset 111: needs 8 bytes, only 4")


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


# ============================================================================================
# core/records.py -- scale-substitution records


def _scale_record(blocks: list[int], itemsize: int = 1) -> bytes:
    return struct.pack("<IQ", itemsize, len(blocks)) + struct.pack(f"<{len(blocks)}Q", *blocks) + bytes(itemsize * len(blocks))


def test_scale_record_head_minimum():
    """records.py decode_scale_record: ``len(raw) < _HEAD.size`` (11, 12, 13 bytes)."""
    from hurray_interop.core.records import decode_scale_record

    check_rule(lambda d: lambda: decode_scale_record(_scale_record([])[: 12 + d] + (b"\0" if d > 0 else b"")), "record is truncated", UNDER)
    assert decode_scale_record(_scale_record([]))[0].size == 0


def test_scale_record_length_exact():
    """records.py decode_scale_record: ``len(raw) != expected`` (one entry: 20, 21, 22 bytes)."""
    from hurray_interop.core.records import decode_scale_record

    raw = _scale_record([3])
    check_rule(lambda d: lambda: decode_scale_record(raw[:-1] if d < 0 else raw + bytes(d)), r"holds \d+ bytes, 1 entries need 21", (True, False, True))
    assert decode_scale_record(raw)[0].tolist() == [3]


def test_scale_record_indices_strictly_ascending():
    """records.py decode_scale_record: ``blocks[1:] > blocks[:-1]`` (second index 4, 5, 6 after 5)."""
    from hurray_interop.core.records import decode_scale_record

    check_rule(lambda d: lambda: decode_scale_record(_scale_record([5, 5 + d])), "not ascending", (True, True, False))


def test_scale_record_block_index_against_the_block_count():
    """records.py _checked_record (restore_scales): ``blocks[-1] >= scales.size`` (last index 7, 8, 9 for 8 blocks).
    The issue's surviving mutant accepted an index equal to the block count."""
    from hurray_interop.core.records import restore_scales

    check_rule(lambda d: lambda: restore_scales(np.ones(8, np.uint8), _scale_record([1, 8 + d])), r"names block \d+, tensor has 8 blocks",
               (False, True, True))
    assert restore_scales(np.ones(8, np.uint8), _scale_record([1, 7])).tolist() == [1, 0, 1, 1, 1, 1, 1, 0]


def _runs(raw: bytes) -> Callable[[], Any]:
    from hurray_interop.core.records import decode_byte_runs

    return lambda: decode_byte_runs(raw, key="runs")


def _run(part: int, offset: int, data: bytes, claim: int | None = None) -> bytes:
    return struct.pack("<IQQ", part, offset, len(data) if claim is None else claim) + data


def test_byte_runs_entry_header_against_the_end():
    """records.py decode_byte_runs: ``pos < mv.nbytes`` and ``mv.nbytes - pos < _RUN.size``: after
    one complete run, 19, 20, 21 bytes of a second (its 20-byte entry header and 1 data byte)."""
    second = _run(0, 8, b"y")
    check_rule(lambda d: _runs(_run(0, 0, b"x") + second[: 20 + d]), r"entry 1 at byte \d+ is truncated", UNDER)
    assert [bytes(r[2]) for r in _runs(_run(0, 0, b"x") + second)()] == [b"x", b"y"]


def test_byte_runs_length_against_the_end():
    """records.py decode_byte_runs: ``length > mv.nbytes - pos`` (a run claiming 1, 2, 3 bytes with 2 left)."""
    check_rule(lambda d: _runs(_run(0, 0, b"ab", claim=2 + d)), r"entry 0 claims \d+ bytes, 2 remain")
    assert bytes(_runs(_run(0, 0, b"ab"))()[0][2]) == b"ab"


def test_byte_runs_ascending_and_disjoint():
    """records.py decode_byte_runs: ``(part, offset) < prev``: a 4-byte run at 10, then one at 13, 14, 15."""
    check_rule(lambda d: _runs(_run(0, 10, b"abcd") + _run(0, 14 + d, b"e")), "overlaps or precedes the one before", UNDER)
    assert _runs(_run(0, 10, b"abcd") + _run(0, 14, b"e"))()[1][1] == 14


# ============================================================================================
# conversions/gguf.py -- the GGUF conversion records of a .hrry file (_records, _check_offsets)


def _records_kv(**changes: Any) -> dict:
    from hurray_interop.conversions import gguf as C
    from hurray_interop.core.kv import KVValue

    kv = {
        C.K_SOURCE: KVValue("string", "gguf"),
        C.K_VERSION: KVValue("uint64", 3),
        C.K_ALIGN: KVValue("uint64", 32),
        C.K_TAIL: KVValue("uint64", 0),
        C.K_TYPES: KVValue("array", [], "string"),
        C.K_TENSORS: KVValue("string", json.dumps([["a", "I8", [33], 0]])),
    }
    for k, v in changes.items():
        kv[getattr(C, k)] = v if isinstance(v, KVValue) else KVValue("uint64" if isinstance(v, int) else "string", v)
    return kv


def _records(**changes: Any) -> Callable[[], Any]:
    from hurray_interop.conversions.gguf import _records as parse

    kv = _records_kv(**changes)
    return lambda: parse(kv, "bounds.hrry")


def test_gguf_record_alignment_range():
    """conversions/gguf.py _records: ``alignment < 1`` (0, 1, 2) and ``alignment > 1 << 30`` (2**29, 2**30, 2**31)."""
    pattern = "is not a power of two up to 2"
    check_rule(lambda d: _records(K_ALIGN=1 + d), pattern, UNDER)
    check_rule(lambda d: _records(K_ALIGN=2 ** (30 + d)), pattern)
    assert _records(K_ALIGN=1 << 30)().alignment == 1 << 30


def test_gguf_record_tail_bound():
    """conversions/gguf.py _records: ``tail >= max(alignment, 1)`` (tail 31, 32, 33 for alignment 32).
    The issue's surviving mutant accepted a tail equal to the alignment."""
    check_rule(lambda d: _records(K_TAIL=32 + d), "trailing padding bytes for alignment 32", (False, True, True))
    assert _records(K_TAIL=31)().tail == 31


def test_gguf_record_tensor_dimensions():
    """gguf_split.tensor_row as the records use it: ``min_dims <= len(ne) <= MAX_DIMS`` with
    min_dims 1 (0, 1, 2 dimensions) and MAX_DIMS 4 (3, 4, 5)."""
    def rows(n: int) -> str:
        return json.dumps([["a", "I8", [1] * n, 0]])
    check_rule(lambda d: _records(K_TENSORS=rows(1 + d)), r"entry 0: a tensor is not \[name", UNDER)
    check_rule(lambda d: _records(K_TENSORS=rows(4 + d)), r"entry 0: a tensor is not \[name")


def _check_offsets(rows: list, alignment: int = 1) -> Callable[[], Any]:
    from hurray_interop.conversions.gguf import _check_offsets as check, _Records
    from hurray_interop.formats.gguf_split import TensorRow

    rec = _Records(3, alignment, 0, [], [TensorRow(*r) for r in rows])
    sizes = {r[0]: int(np.prod(r[2])) for r in rows}  # I8: one byte per element
    return lambda: check(rec, sizes, "bounds.hrry")


def test_gguf_record_offsets_overlap():
    """conversions/gguf.py _check_offsets: ``off < end`` (I8[33]@0, then I8[4] at 32, 33, 34; alignment 1)."""
    check_rule(lambda d: _check_offsets([("a", "I8", (33,), 0), ("b", "I8", (4,), 33 + d)]), "overlaps the previous tensor", UNDER)
    assert _check_offsets([("a", "I8", (33,), 0), ("b", "I8", (4,), 33)])() is True


def test_gguf_record_offsets_gap_bound():
    """conversions/gguf.py _check_offsets: ``end - total > max(total, 1 << 20) + n * alignment``
    (gaps of 2**20 + 2 - 1, 2**20 + 2, 2**20 + 3 bytes for 37 bytes of data in 2 tensors, alignment 1)."""
    limit = (1 << 20) + 2
    check_rule(lambda d: _check_offsets([("a", "I8", (33,), 0), ("b", "I8", (4,), 33 + limit + d)]), "bytes of gaps for 37 bytes")


# ============================================================================================
# conversions/gguf_expanded.py -- Record.from_bytes (the exact-expanded form's restore record)


def _expanded_record(n_blocks: int, exceptions: list[int], *, first: int = 0, extra: int = 0) -> Callable[[], Any]:
    from hurray_interop.conversions.gguf_expanded import Record, _specs, form

    spec, h = _specs()["Q4_K"], form("Q4_K").record_bytes
    exc = b"".join(struct.pack("<I", i) + bytes(spec.block_bytes) for i in exceptions)
    data = bytes(n_blocks * h) + exc
    data = data[:extra] if extra < 0 else data + bytes(extra)
    return lambda: Record.from_bytes("Q4_K", data, n_blocks, first)


def test_expanded_record_length():
    """gguf_expanded.py Record.from_bytes: ``rest < 0`` (a record of 4 blocks one byte short, exact,
    one byte long: only exact is a whole number of exception entries)."""
    check_rule(lambda d: _expanded_record(4, [], extra=d), r"bytes for 4 Q4_K blocks: expected", (True, False, True))
    _expanded_record(4, [])()


def test_expanded_record_exception_index_range():
    """gguf_expanded.py Record.check: ``idx < first_block`` (index 9, 10, 11 for blocks 10..13) and
    ``idx >= first_block + n_blocks`` (13, 14, 15)."""
    pattern = "out of order or outside blocks 10..13"
    check_rule(lambda d: _expanded_record(4, [10 + d], first=10), pattern, UNDER)
    check_rule(lambda d: _expanded_record(4, [14 + d], first=10), pattern, (False, True, True))
    _expanded_record(4, [10, 13], first=10)()


def test_expanded_record_exception_indices_ascending():
    """gguf_expanded.py Record.check: ``np.diff(idx) <= 0`` (second index 1, 2, 3 after 2)."""
    check_rule(lambda d: _expanded_record(4, [2, 2 + d]), "out of order or outside blocks", (True, True, False))


# ============================================================================================
# formats/gguf_split.py -- split keys of a shard; the split layout record (SplitLayout.from_json)


def _shard_keys(no: int, count: int, total: int) -> Callable[[], Any]:
    from hurray_interop.formats import gguf_split as S

    kvs = [_s("split.no") + struct.pack("<IH", GU16, no), _s("split.count") + struct.pack("<IH", GU16, count),
           _s("split.tensors.count") + struct.pack("<Ii", 5, total)]
    raw = _gguf(kvs, [])
    return lambda: S._split_keys(_parse_gguf(raw)())


def test_split_no_below_count():
    """gguf_split.py _split_keys: ``no >= count`` (split.no 2, 3, 4 of split.count 3)."""
    check_rule(lambda d: _shard_keys(3 + d, 3, 1), "is not below split.count", (False, True, True))
    assert _shard_keys(2, 3, 1)() == (2, 3, 1)


def test_split_tensors_count_non_negative():
    """gguf_split.py _split_keys: ``total < 0`` (split.tensors.count -1, 0, 1)."""
    check_rule(lambda d: _shard_keys(0, 3, d), "is negative", UNDER)
    assert _shard_keys(0, 3, 0)() == (0, 3, 0)


def _layout(**shard0: Any) -> Callable[[], Any]:
    from hurray_interop.formats import gguf_split as S

    base = S.new_split_layout(["general.name"], [("a", "I8", (33,)), ("b", "I8", (4,))], [[0, 1]], alignment=32)
    obj = json.loads(base.dumps())
    obj["shards"][0].update(shard0)
    text = json.dumps(obj)
    return lambda: S.SplitLayout.from_json(text, path="bounds.hrry", field="layout")


def test_split_layout_tail_range():
    """gguf_split.py _LayoutParser.shard: ``_is_int(tail, 0, alignment - 1)`` (tail -1, 0, 1 and 31, 32, 33; alignment 32)."""
    pattern = "trailing padding bytes for alignment 32"
    check_rule(lambda d: _layout(tail_bytes=d), pattern, UNDER)
    check_rule(lambda d: _layout(tail_bytes=32 + d), pattern, (False, True, True))
    _layout(tail_bytes=31)()


def test_split_layout_offsets_overlap():
    """gguf_split.py _LayoutParser.offsets: ``n and r.offset < end`` (I8[33]@0, I8[4] at 32, 33, 34; alignment 1)."""
    def make(d: int) -> Callable[[], Any]:
        return _layout(alignment=1, tensors=[["a", "I8", [33], 0], ["b", "I8", [4], 33 + d]])
    check_rule(make, "is unaligned or overlaps", UNDER)
    make(AT)()


def test_split_layout_gap_bound():
    """gguf_split.py _LayoutParser.offsets: ``reach - total > max(total, 1 << 20) + n * alignment``
    (gaps of 2**20 + 2 - 1, 2**20 + 2, 2**20 + 3 bytes for 37 data bytes in 2 tensors, alignment 1)."""
    limit = (1 << 20) + 2
    check_rule(lambda d: _layout(alignment=1, tensors=[["a", "I8", [33], 0], ["b", "I8", [4], 33 + limit + d]]), "bytes of gaps for 37 bytes")


def test_split_layout_integer_ranges():
    """gguf_split.py _is_int: ``lo <= x <= hi`` (the layout's tensor offsets: -1, 0, 1 and
    2**62 - 2, 2**62 - 1, 2**62) and the shard count (0, 1, 2)."""
    from hurray_interop.formats import gguf_split as S

    assert [S._is_int(x) for x in (-1, 0, 1)] == [False, True, True]
    assert [S._is_int(x) for x in (2**62 - 2, 2**62 - 1, 2**62)] == [True, True, False]
    assert [S._is_int(x, 1, S.MAX_SHARDS) for x in (0, 1, S.MAX_SHARDS, S.MAX_SHARDS + 1)] == [False, True, True, False]
    check_rule(lambda d: _layout(tensors=[["a", "I8", [33], 2**62 - 64 + 64 * d], ["b", "I8", [4], 0]]), "a tensor is not", PAST)


# ============================================================================================
# core/descriptor.py -- length fields (decode_descriptor, decode_quantization)


@pytest.fixture(scope="module")
def plain_descriptor() -> bytes:
    from hurray_interop.core.descriptor import encode_descriptor
    from hurray_interop.core.elements import element_type
    from hurray_interop.core.model import BufferHandle, Descriptor, RowMajor

    return encode_descriptor(Descriptor(element_type=element_type("uint8"), shape=(4,), buffers=(BufferHandle.cpu(4),), layout=RowMajor()))


def _descriptor(raw: bytes | bytearray) -> Callable[[], Any]:
    from hurray_interop.core.descriptor import decode_descriptor

    return lambda: decode_descriptor(bytes(raw), path="bounds.hrry")


def test_descriptor_length_minimum(plain_descriptor):
    """descriptor.py _decode: ``length < 20`` (descriptor_length 19, 20, 21)."""
    def make(d: int) -> Callable[[], Any]:
        raw = bytearray(plain_descriptor)
        struct.pack_into("<I", raw, 6, 20 + d)
        return _descriptor(raw)
    check_rule(make, "is less than the 20-byte header", UNDER)


def test_descriptor_length_against_the_buffer(plain_descriptor):
    """descriptor.py _decode: ``length > avail`` (descriptor_length one short of, equal to, one
    past the bytes given)."""
    def make(d: int) -> Callable[[], Any]:
        raw = bytearray(plain_descriptor)
        struct.pack_into("<I", raw, 6, len(raw) + d)
        return _descriptor(raw)
    check_rule(make, r"descriptor_length \d+ exceeds the \d+ bytes available")
    make(AT)()


def test_descriptor_rank_maximum(plain_descriptor):
    """descriptor.py _decode: ``rank > MAX_RANK`` (rank 63, 64, 65)."""
    def make(d: int) -> Callable[[], Any]:
        raw = bytearray(plain_descriptor)
        struct.pack_into("<I", raw, 16, 64 + d)
        return _descriptor(raw)
    check_rule(make, "exceeds the maximum 64")


@pytest.fixture(scope="module")
def quantized_descriptor() -> tuple[bytes, int]:
    """An int8 [64] per-block affine (K=32, f16 scales) descriptor and the offset of its quantization_length."""
    from hurray_interop.core.descriptor import encode_descriptor, encode_quantization
    from hurray_interop.core.elements import element_type
    from hurray_interop.core.model import BufferHandle, Descriptor, PerBlockAffine, RowMajor

    q = PerBlockAffine(axis=0, block_size=32, scale_buffer_index=1)
    raw = encode_descriptor(Descriptor(element_type=element_type("int8"), shape=(64,), buffers=(BufferHandle.cpu(64), BufferHandle.cpu(4)),
                                       layout=RowMajor(), quantization=q))
    scheme = encode_quantization(q)
    at = raw.index(scheme) - 4
    assert struct.unpack_from("<I", raw, at)[0] >= len(scheme)
    return raw, at


def test_descriptor_quantization_length_against_the_descriptor(quantized_descriptor):
    """descriptor.py _decode_sections: ``qlen > rd.end - rd.pos`` (quantization_length one short of,
    equal to, one past the bytes left in the descriptor)."""
    raw, at = quantized_descriptor
    (qlen,) = struct.unpack_from("<I", raw, at)
    left = len(raw) - at - 4

    def make(d: int) -> Callable[[], Any]:
        b = bytearray(raw)
        struct.pack_into("<I", b, at, left + d)
        return _descriptor(b)
    check_rule(make, r"quantization_length \d+ exceeds the \d+ bytes left")
    assert left >= qlen


def test_quantization_length_fields():
    """descriptor.py decode_quantization: ``n > rd.end - offset`` (length one short of, equal to,
    one past the buffer) and _decode_scheme: ``n < 4`` (3, 4, 5) and ``n < need`` (23, 24, 25 for
    per-block affine)."""
    from hurray_interop.core.descriptor import decode_quantization, encode_quantization
    from hurray_interop.core.model import PerBlockAffine

    raw = encode_quantization(PerBlockAffine(axis=0, block_size=32, scale_buffer_index=1))
    assert len(raw) == 24
    q = lambda n, buf=raw: lambda: decode_quantization(buf, length=n, path="q")  # noqa: E731
    check_rule(lambda d: q(24 + d), r"quantization length \d+ exceeds the 24 bytes available")
    check_rule(lambda d: q(4 + d), "is shorter than the 4-byte scheme header", UNDER)
    check_rule(lambda d: q(24 + d), "is shorter than the 24-byte", UNDER)
    assert q(24)().block_size == 32


def _u8_desc(n: int, buffer: int, *, byte_offset: int = 0, strides: tuple[int, ...] | None = None) -> Any:
    from hurray_interop.core.elements import element_type
    from hurray_interop.core.model import BufferHandle, Descriptor, RowMajor, Strided

    layout = RowMajor() if strides is None else Strided(strides)
    return Descriptor(element_type=element_type("uint8"), shape=(n,), buffers=(BufferHandle.cpu(buffer),), layout=layout,
                      byte_offset=byte_offset)


def test_descriptor_buffer_against_byte_offset_plus_data():
    """descriptor.py _validate_data_size: ``got < byte_offset + want`` (uint8[4] at byte_offset 8 in
    a buffer of 11, 12, 13 bytes)."""
    from hurray_interop.core.descriptor import validate_descriptor

    check_rule(lambda d: lambda: validate_descriptor(_u8_desc(4, 12 + d, byte_offset=8), path="d"),
               r"buffer 0 holds \d+ bytes, byte_offset 8 \+ 4 needed", UNDER)


def test_strided_range_inside_buffer_0():
    """descriptor.py validate_addressed_range: ``end > have`` (stride 1 over 4 bytes, buffers of 3,
    4, 5 bytes) and ``first < 0`` (stride -1 over 4 elements from byte_offset 2, 3, 4)."""
    from hurray_interop.core.descriptor import validate_addressed_range

    check_rule(lambda d: lambda: validate_addressed_range(_u8_desc(4, 4 - d, strides=(1,)), path="d"), "addresses bytes up to 4")
    check_rule(lambda d: lambda: validate_addressed_range(_u8_desc(4, 8, byte_offset=3 + d, strides=(-1,)), path="d"),
               "bytes before the start of buffer 0", UNDER)


def test_safetensors_gpt_oss_blocks_rank_minimum(tmp_path):
    """safetensors.py detect_pairs: ``len(e.shape) < 2`` for gpt-oss ``_blocks`` ([..., G, 16]):
    blocks of rank 1, 2, 3 with scales of one rank less."""
    from hurray_interop.formats.safetensors import SafetensorsFile, detect_pairs

    def make(d: int) -> Callable[[], Any]:
        rank = 2 + d
        bshape, sshape = [1] * (rank - 1) + [16], [1] * (rank - 1)
        nb, ns = int(np.prod(bshape)), int(np.prod(sshape))
        header = {"x_blocks": {"dtype": "U8", "shape": bshape, "data_offsets": [0, nb]},
                  "x_scales": {"dtype": "U8", "shape": sshape, "data_offsets": [nb, nb + ns]}}
        p = tmp_path / f"r{rank}.safetensors"
        p.write_bytes(_st(header, bytes(nb) + b"\x7f" * ns))

        def run() -> Any:
            with SafetensorsFile(p) as f:
                return detect_pairs(f)
        return run
    check_rule(make, r"blocks shape \[.*\] and scales shape \[.*\] do not form", UNDER)
    pairs, _ = make(AT)()
    assert [p.shape for p in pairs] == [(32,)]


# ============================================================================================
# writers: the limits of what they accept (the readers' rules seen from the other side)


def test_gguf_split_plan_limits():
    """gguf_split.py plan_split: ``int(max_tensors) < 1`` and ``int(max_size) < 1`` (0, 1, 2), and
    ``used + padded > max_size``: two 32-byte tensors with --split-max-size 63, 64, 65 make 2, 1, 1 shards."""
    from hurray_interop.formats.gguf_split import plan_split

    check_rule(lambda d: lambda: plan_split([32, 32], max_tensors=1 + d), "must be at least 1", UNDER)
    check_rule(lambda d: lambda: plan_split([32, 32], max_size=1 + d), "must be at least 1 byte", UNDER)
    assert [len(plan_split([32, 32], max_size=64 + d)) for d in DELTAS] == [2, 1, 1]
    assert plan_split([32, 32], max_tensors=1) == [[0], [1]]  # ``i > 0``: no empty first shard


def test_gguf_writer_limits():
    """gguf.py GGUFWriterStream: ``alignment <= 0`` (0, 1, 2), ``0 <= tail <= pad`` for an integer
    pad_end (-1, 0, 1 and pad - 1, pad, pad + 1) and the overlap rule ``data_offset + off < prev_end``
    (I8[33]@0, then I8[4] at 32, 33, 34; alignment 1)."""
    import io

    from hurray_interop.formats.gguf import GGUFWriterStream, TensorSpec

    def writer(**kw: Any) -> Callable[[], Any]:
        def run() -> None:
            GGUFWriterStream(io.BytesIO(), **kw).abort()
        return run
    check_rule(lambda d: writer(alignment=1 + d), "is not a power of two", UNDER)
    pad = 32 - 24 % 32  # no metadata, no tensors: the 24-byte header, padded to 32
    check_rule(lambda d: writer(pad_end=d), r"pad_end=-?\d+: must be between 0 and", UNDER)
    check_rule(lambda d: writer(pad_end=pad + d), rf"must be between 0 and {pad}")
    tensors = lambda d: [TensorSpec("a", I8, (33,), 0), TensorSpec("b", I8, (4,), 33 + d)]  # noqa: E731
    check_rule(lambda d: writer(alignment=1, kv=[("general.alignment", _u32(1))], tensors=tensors(d)), "overlaps the previous tensor", UNDER)


def _u32(v: int) -> Any:
    from hurray_interop.formats.gguf import GGUFValue, ValueType

    return GGUFValue.of(ValueType.UINT32, v)


def test_kv_key_length_maximum():
    """kv.py _check_key: ``len(kb) > 0xFFFF`` (keys of 65534, 65535, 65536 bytes)."""
    from hurray_interop.core.kv import decode_kv, encode_kv

    check_rule(lambda d: lambda: encode_kv({"k" * (0xFFFF + d): 1}), "exceeds the u16 key_length field")
    assert list(decode_kv(encode_kv({"k" * 0xFFFF: 1}))) == ["k" * 0xFFFF]


def test_kv_integer_ranges():
    """kv.py _check_scalar: ``lo <= v <= hi`` for int64 (-2**63 - 1 .. -2**63 + 1, 2**63 - 2 .. 2**63)
    and uint64 (-1, 0, 1 and 2**64 - 2 .. 2**64)."""
    from hurray_interop.core.kv import KVValue

    pattern = r"is out of range for u?int64"
    check_rule(lambda d: lambda: KVValue("int64", -(2**63) + d), pattern, UNDER)
    check_rule(lambda d: lambda: KVValue("int64", 2**63 - 1 + d), pattern)
    check_rule(lambda d: lambda: KVValue("uint64", d), pattern, UNDER)
    check_rule(lambda d: lambda: KVValue("uint64", 2**64 - 1 + d), pattern)


def test_hrry_writer_tensor_name_length_maximum(tmp_path):
    """hrry.py HrryWriter.write_tensor: ``len(nb) > 0xFFFF`` (names of 65534, 65535, 65536 bytes)."""
    from hurray_interop.core.elements import element_type
    from hurray_interop.core.hrry import HrryFile, save
    from hurray_interop.core.model import BufferHandle, Descriptor, RowMajor, Tensor

    desc = Descriptor(element_type=element_type("uint8"), shape=(1,), buffers=(BufferHandle.cpu(1),), layout=RowMajor())

    def make(d: int) -> Callable[[], Any]:
        name = "n" * (0xFFFF + d)
        return lambda: save(tmp_path / f"n{d}.hrry", [Tensor(name, desc, (b"x",))])
    check_rule(make, "exceeds the u16 name_length")
    with HrryFile(tmp_path / "n0.hrry") as f:
        assert f.names == ("n" * 0xFFFF,)


# ============================================================================================
# the padding record (hurray_interop.gguf.padding): its byte limit, its shard index, where it may go


def test_gguf_padding_record_byte_limit():
    """conversions/gguf.py _padding_record (the export's reading of the record):
    ``sum(lengths) > MAX_PADDING_BYTES`` (limit - 1, limit, limit + 1 recorded bytes)."""
    from hurray_interop.conversions import gguf as C
    from hurray_interop.core.kv import KVValue
    from hurray_interop.core.records import encode_byte_runs

    def rec(d: int) -> Callable[[], Any]:
        return _records(K_PADDING=KVValue("bytes", encode_byte_runs([(0, 64, b"\x01" * (C.MAX_PADDING_BYTES + d))])))
    check_rule(rec, f"more than the {C.MAX_PADDING_BYTES} bytes an import records")
    assert rec(AT)().padding[0][64].nbytes == C.MAX_PADDING_BYTES


def test_gguf_padding_import_byte_limit():
    """conversions/gguf.py _padding_runs (the import): ``total > MAX_PADDING_BYTES`` (limit - 1,
    limit, limit + 1 non-zero bytes, from the first to the last, in one region)."""
    from types import SimpleNamespace

    from hurray_interop.conversions import gguf as C

    def runs(d: int) -> Callable[[], Any]:
        g = np.zeros(C.MAX_PADDING_BYTES + 8, np.uint8)
        g[0] = g[C.MAX_PADDING_BYTES + d - 1] = 1
        gf = SimpleNamespace(split_set=None, path="bounds.gguf", nonzero_padding={100: g})
        return lambda: C._padding_runs(gf)
    check_rule(runs, "bytes of padding and gaps between tensors are not zero")
    assert runs(AT)()[0][2].size == C.MAX_PADDING_BYTES


def test_gguf_padding_record_shard_of_a_single_file():
    """conversions/gguf.py _padding_record: a file that records no split set has shard 0 only
    (shard index 0 accepted; 1 and 2 refused)."""
    from hurray_interop.core.kv import KVValue
    from hurray_interop.core.records import encode_byte_runs

    def rec(part: int) -> Callable[[], Any]:
        return _records(K_PADDING=KVValue("bytes", encode_byte_runs([(part, 64, b"\x01")])))
    assert [rule_fires(rec(p), "but the file records no split set") for p in (0, 1, 2)] == [False, True, True]
    assert rule_fires(rec(1), r"names shard 2, but the file records no split set")


@pytest.fixture(scope="module")
def split_padding_hrry(fixtures_dir, tmp_path_factory):
    """The 3-shard fixture set with one non-zero byte in the padding of its second shard,
    imported: ``(the .hrry, metadata end of each shard)``."""
    import shutil

    from hurray_interop.conversions.gguf import gguf_to_hurray
    from hurray_interop.formats.gguf import read_gguf

    d = tmp_path_factory.mktemp("split-pad")
    ends = []
    for i in (1, 2, 3):
        p = d / f"tiny-split-0000{i}-of-00003.gguf"
        shutil.copy(fixtures_dir / p.name, p)
        with read_gguf(p) as f:
            assert f.data_offset > f.metadata_end, "each shard's data starts after padding"
            ends.append(f.metadata_end)
    raw = bytearray((d / "tiny-split-00002-of-00003.gguf").read_bytes())
    raw[ends[1]] = 0x7A
    (d / "tiny-split-00002-of-00003.gguf").write_bytes(bytes(raw))
    gguf_to_hurray(d / "tiny-split-00001-of-00003.gguf", d / "s.hrry")
    return d / "s.hrry", ends


def test_gguf_padding_record_shard_of_a_set(split_padding_hrry, tmp_path):
    """conversions/gguf.py _write_set: ``max(padding) >= layout.count`` (shard index 2, 3, 4
    of a 3-shard set: the last shard is accepted, the 4th and 5th refused, naming them)."""
    from hurray_interop.conversions import gguf as C
    from hurray_interop.core.hrry import HrryFile, HrryWriter
    from hurray_interop.core.kv import KVValue
    from hurray_interop.core.records import encode_byte_runs

    h, ends = split_padding_hrry
    count = iter(range(100))

    def export(part: int) -> Callable[[], Any]:
        bad = tmp_path / f"shard{part}-{next(count)}.hrry"
        with HrryFile(h) as hf:
            kv = dict(hf.kv)
            kv[C.K_PADDING] = KVValue("bytes", encode_byte_runs([(part, ends[min(part, 2)], b"\x01")]))
            with HrryWriter(bad) as w:
                for n in hf.top_level_names():
                    w.write_tensor(hf.tensor(n))
                w.finish(kv)
        out = tmp_path / bad.stem
        out.mkdir()
        return lambda: C.hurray_to_gguf(bad, out / "tiny-split-00001-of-00003.gguf")
    check_rule(lambda d: export(3 + d), r"names shard \d of a 3-shard set", (False, True, True))
    assert rule_fires(export(3), "names shard 4 of a 3-shard set")
    export(2)()
    raw = next(tmp_path.glob("shard2-*/tiny-split-00003-of-00003.gguf")).read_bytes()
    assert raw[ends[2]] == 1  # the accepted record went where it said


def test_gguf_writer_padding_regions():
    """gguf.py GGUFWriterStream._check_padding: an override must lie inside one padding region.
    Specs F32[8]@0, F32[4]@64 (alignment 32): the gap between them is [start + 32, start + 64).
    ``not regions[r][0] <= o`` (one byte at start + 31, 32, 33), ``o + n > regions[r][1]``
    (from start + 62: 1, 2, 3 bytes) and ``o < prev`` (after 2 bytes at start + 40: the next at
    start + 41, 42, 43)."""
    import io

    from hurray_interop.formats.gguf import GGUFWriterStream, TensorSpec

    specs = [TensorSpec("a", 0, (8,), 0), TensorSpec("b", 0, (4,), 64)]
    probe = GGUFWriterStream(io.BytesIO(), tensors=specs)
    start = probe.data_offset
    probe.abort()

    def writer(padding: dict) -> Callable[[], Any]:
        return lambda: GGUFWriterStream(io.BytesIO(), tensors=specs, padding=padding).abort()
    pattern = r"padding override at \d+ \(\d+ bytes\) is not inside the padding"
    check_rule(lambda d: writer({start + 32 + d: b"\x01"}), pattern, UNDER)
    check_rule(lambda d: writer({start + 62: b"\x01" * (2 + d)}), pattern)
    check_rule(lambda d: writer({start + 40: b"\x01\x02", start + 42 + d: b"\x03"}), pattern, UNDER)
