"""One class per Hurray layout and per quantization scheme (core/layouts.py, core/schemes.py).

Every wire tag has exactly one class; a scheme's storage and scale types come from the
element-type table; and a new scheme or layout is one class: defined here (under a tag the
specification reserves), it round-trips through the descriptor codec, is validated by its
own rules, is shown by ``inspect`` and (a code-book scheme) is evaluated by the dequantizer
-- none of which knows it.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Iterator

import numpy as np
import pytest

from hurray_interop.core import layouts as LR
from hurray_interop.core import schemes as SR
from hurray_interop.core.descriptor import decode_descriptor, encode_descriptor, validate_descriptor
from hurray_interop.core.elements import ELEMENT_TYPES_BY_TAG, element_type
from hurray_interop.core.model import (
    LAYOUT_NAMES, NF4, SCHEME_NAMES, BufferHandle, Descriptor, PerChannelAffine, RowMajor, Tensor,
)
from hurray_interop.dequant import NF4_LUT, dequantize
from hurray_interop.errors import FormatError, InconsistentError, UnsupportedError
from hurray_interop.inspection import describe_layout, describe_quantization


def test_every_layout_tag_has_one_class_carrying_it() -> None:
    for tag, name in LAYOUT_NAMES.items():
        rule = LR.layout_rule(tag)
        assert rule is not None and rule.tag == tag and rule.name == name
        assert LR.rule_of(rule.model.__new__(rule.model)) is rule
    assert LR.layout_rule(0xF3) is LR.layout_rule(0xFE) is not None  # the private range: one class
    assert LR.layout_rule(0x0C) is None and LR.layout_rule(0xFF) is None
    assert len(set(LR.layout_models())) == len(LAYOUT_NAMES) + 1


def test_every_scheme_tag_has_one_class_carrying_it() -> None:
    for tag, name in SCHEME_NAMES.items():
        rule = SR.scheme_rule(tag)
        assert rule is not None and rule.tag == tag == rule.model.scheme_tag and rule.name == name
        assert rule.struct.unpack_from(rule.encode(_example(rule.model)))[0] == tag
    assert SR.scheme_rule(0x06) is None and SR.scheme_rule(0xF0) is None
    assert len(SR.scheme_models()) == len(SCHEME_NAMES)


def _example(model: type) -> object:
    f32 = element_type("float32")
    args = {"axis": 0, "block_size": 32, "scale_buffer_index": 1, "zero_point_buffer_index": None, "scale_type": f32,
            "scale": 1.0, "zero_point": 0}
    return model(**{f.name: args[f.name] for f in dataclasses.fields(model)})


def test_storage_and_scale_types_are_element_table_rows() -> None:
    """The tag sets the descriptor checks are the table's tags of the names each class lists,
    and the affine schemes' integer storage is the table's integer types of at most 32 bits."""
    by_name = {et.name: tag for tag, et in ELEMENT_TYPES_BY_TAG.items()}
    for tag in SCHEME_NAMES:
        rule = SR.scheme_rule(tag)
        assert rule.storage_tags == {by_name[n] for n in rule.storage}
    ints = {tag for tag, et in ELEMENT_TYPES_BY_TAG.items() if et.kind in ("int", "uint") and et.bits <= 32}
    assert SR.scheme_rule(0x01).storage_tags == SR.scheme_rule(0x02).storage_tags == ints
    assert SR.scheme_rule(0x03).scale_tags == {by_name[n] for n in ("float16", "bfloat16", "float32")}


def test_the_nf4_code_book_is_the_scheme_class_s() -> None:
    assert NF4_LUT.tolist() == [float(np.float32(v)) for v in SR.scheme_rule(NF4.scheme_tag).code_book]
    assert describe_quantization(Descriptor(element_type("uint4"), (64,), (BufferHandle(32), BufferHandle(8)),
                                            quantization=NF4(0, 32, 1))) == {"scheme": "NF4", "axis": 0, "block_size": 32}


# ---------------------------------------------------------------------------
# a new scheme is one class


@dataclasses.dataclass(frozen=True)
class Nf2:
    axis: int
    block_size: int
    scale_buffer_index: int
    scheme_tag = 0x06


@pytest.fixture
def fresh_registries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Classes defined by a test register into copies, dropped after it (the name tables,
    which the other modules hold by reference, are restored in place)."""
    for mod in (SR, LR):
        monkeypatch.setattr(mod, "_BY_TAG", dict(mod._BY_TAG))
        monkeypatch.setattr(mod, "_BY_MODEL", dict(mod._BY_MODEL))
    names = [(table, dict(table)) for table in (SCHEME_NAMES, LAYOUT_NAMES)]
    yield
    for table, saved in names:
        table.clear()
        table.update(saved)


def _define_nf2() -> SR.SchemeRule:
    class _Nf2(SR.SchemeRule):
        """A 2-bit code-book scheme: ``float32(absmax) · book[q]``, one absmax per block."""

        tag, model = 0x06, Nf2
        name = "NF2 (test)"
        struct = struct.Struct("<BBHIII")
        storage = ("uint2",)
        block_min = 4
        label = "NF2 "
        code_book = (-1.0, -0.25, 0.5, 1.0)

    return SR.scheme_rule(0x06)  # type: ignore[return-value]


def _nf2_tensor(codes: np.ndarray, scales: np.ndarray, et: str = "uint2") -> Tensor:
    packed = (codes.reshape(-1, 4) << np.array([0, 2, 4, 6], dtype=np.uint8)).sum(axis=1).astype(np.uint8)
    desc = Descriptor(element_type(et), codes.shape, (BufferHandle(packed.size), BufferHandle(scales.nbytes)),
                      quantization=Nf2(1, 4, 1))
    return Tensor("w", desc, (packed, scales.astype("<f4").view(np.uint8)))


def test_a_new_scheme_is_one_class(fresh_registries: None) -> None:
    rule = _define_nf2()
    codes = np.array([[0, 1, 2, 3, 3, 2, 1, 0], [1, 1, 1, 1, 2, 2, 2, 2]], dtype=np.uint8)
    scales = np.array([2.0, 4.0, 0.5, 8.0], dtype=np.float32)  # 2 rows × 2 blocks
    t = _nf2_tensor(codes, scales)
    raw = encode_descriptor(t.descriptor)
    q_at = 20 + 2 * 8 + 8 + 1 + 2 * 16  # header, shape, byte_offset, buffer table
    assert raw[q_at : q_at + 5] == struct.pack("<IB", 16, 0x06)  # quantization_length, scheme_tag
    assert decode_descriptor(raw) == t.descriptor
    assert describe_quantization(t.descriptor) == {"scheme": "NF2 (test)", "axis": 1, "block_size": 4}
    assert t.describe() == "NF2 (test) uint2"  # the name the export's report gives the source
    book = np.array(rule.code_book, dtype=np.float32)
    want = np.repeat(scales.reshape(2, 2), 4, axis=1) * book[codes]
    np.testing.assert_array_equal(dequantize(t), want)


def test_a_new_scheme_s_own_rules_are_enforced(fresh_registries: None) -> None:
    _define_nf2()
    codes = np.zeros((2, 8), dtype=np.uint8)
    with pytest.raises(InconsistentError, match="storage type uint4 is not allowed with NF2 [(]test[)]"):
        validate_descriptor(dataclasses.replace(_nf2_tensor(codes, np.ones(4)).descriptor, element_type=element_type("uint4")))
    bad = dataclasses.replace(_nf2_tensor(codes, np.ones(4)).descriptor, quantization=Nf2(1, 2, 1))
    with pytest.raises(FormatError, match="NF2 block_size 2 is less than 4"):
        validate_descriptor(bad)
    short = dataclasses.replace(_nf2_tensor(codes, np.ones(4)).descriptor, buffers=(BufferHandle(4), BufferHandle(12)))
    with pytest.raises(InconsistentError, match="scale buffer 1 holds 12 bytes, NF2 [(]test[)] needs 16"):
        validate_descriptor(short)


# ---------------------------------------------------------------------------
# a new layout is one class


@dataclasses.dataclass(frozen=True)
class Diagonal:
    """A square matrix stored as its diagonal (buffer 0 holds ``shape[0]`` elements)."""

    offset: int
    tag = 0x0C


def _define_diagonal() -> LR.LayoutRule:
    payload = struct.Struct("<i")

    class _Diagonal(LR.LayoutRule):
        tag, model = 0x0C, Diagonal
        name = "diagonal (test)"

        def encode(self, layout, rank):  # type: ignore[no-untyped-def]
            return payload.pack(layout.offset)

        def decode(self, rd, tag, rank, ctx, start):  # type: ignore[no-untyped-def]
            return Diagonal(*rd.unpack(payload, "diagonal"))

        def check_semantics(self, layout, desc, ctx, at):  # type: ignore[no-untyped-def]
            if len(desc.shape) != 2 or desc.shape[0] != desc.shape[1]:
                raise ctx.err(InconsistentError, f"a diagonal tensor must be square, not {list(desc.shape)}", "rank", 16)

        def data_size(self, desc):  # type: ignore[no-untyped-def]
            return desc.shape[0] * desc.element_type.bits // 8

    return LR.layout_rule(0x0C)  # type: ignore[return-value]


def test_a_new_layout_is_one_class(fresh_registries: None) -> None:
    rule = _define_diagonal()
    f32 = element_type("float32")
    desc = Descriptor(f32, (3, 3), (BufferHandle(12),), layout=Diagonal(-1))
    raw = encode_descriptor(desc)
    assert raw[15] == 0x0C and raw[20 + 16 + 8 : 20 + 16 + 12] == struct.pack("<i", -1)
    assert decode_descriptor(raw) == desc
    assert rule.name == "diagonal (test)"
    assert describe_layout(desc) == "diagonal (test)"  # what inspect shows
    with pytest.raises(InconsistentError, match="must be square"):
        validate_descriptor(dataclasses.replace(desc, shape=(3, 4)))
    with pytest.raises(InconsistentError, match="buffer 0 holds 36 bytes, but float32 \\[3, 3\\] needs 12"):
        validate_descriptor(dataclasses.replace(desc, buffers=(BufferHandle(36),)))
    per_channel = dataclasses.replace(desc, buffers=(BufferHandle(12), BufferHandle(12)),
                                      element_type=element_type("int8"), quantization=PerChannelAffine(0, 1))
    with pytest.raises(InconsistentError, match="buffer 0 holds 12 bytes, but int8 \\[3, 3\\] needs 3"):
        validate_descriptor(per_channel)


def test_unregistered_tags_are_still_rejected() -> None:
    f32 = element_type("float32")
    raw = bytearray(encode_descriptor(Descriptor(f32, (3,), (BufferHandle(12),), layout=RowMajor())))
    raw[15] = 0x0C
    with pytest.raises(FormatError, match="unknown or reserved layout_tag 0x0c"):
        decode_descriptor(bytes(raw))


@dataclasses.dataclass(frozen=True)
class Transposed:
    """A matrix stored as its transpose (column-major by another name)."""

    tag = 0x0D


def test_the_dequantizer_asks_the_layout_class(fresh_registries: None) -> None:
    """A new dense layout whose class gives its element strides is evaluated through them;
    one whose class does not is refused by name."""

    class _Transposed(LR.LayoutRule):
        tag, model = 0x0D, Transposed
        name = "transposed (test)"
        contiguous = evaluable = True

        def element_strides(self, layout, shape, storage):  # type: ignore[no-untyped-def]
            return LR.f_strides(storage), False

    _define_diagonal()
    f32 = element_type("float32")
    stored = np.arange(6, dtype="<f4")
    t = Tensor("m", Descriptor(f32, (2, 3), (BufferHandle(24),), layout=Transposed()), (stored.view(np.uint8),))
    assert decode_descriptor(encode_descriptor(t.descriptor)) == t.descriptor
    np.testing.assert_array_equal(dequantize(t), stored.reshape(3, 2).T)
    d = Tensor("d", Descriptor(f32, (3, 3), (BufferHandle(12),), layout=Diagonal(0)), (np.zeros(12, np.uint8),))
    with pytest.raises(UnsupportedError, match="layout Diagonal [(]tag 0x0c[)] cannot be dequantized"):
        dequantize(d)
