"""The central model's report helpers."""

from __future__ import annotations

import pytest

from hurray_interop.core.elements import ELEMENT_TYPES, ELEMENT_TYPES_BY_TAG, element_type
from hurray_interop.core.model import (
    MXFP,
    OP_ADD,
    RULE_OVERLAY,
    RULE_PARTITION,
    BufferHandle,
    CompositeHead,
    Descriptor,
    PerBlockAffine,
    Tensor,
)


def _t(name: str, et: str, q=None, layout=None, members=()) -> Tensor:  # noqa: ANN001
    kw = {"layout": layout} if layout is not None else {}
    d = Descriptor(element_type(et), (2, 32), (BufferHandle.cpu(0),) if layout is None else (), quantization=q, **kw)
    return Tensor(name, d, members=tuple(members))


def test_describe_names_scheme_storage_and_composition() -> None:
    plain = _t("a", "float32")
    block = _t("b", "int4", PerBlockAffine(axis=1, block_size=32, scale_buffer_index=1))
    mx = _t("c", "float4_e2m1", MXFP(axis=1, block_size=32, scale_buffer_index=1))
    base, corr = _t("d.base", "uint4"), _t("d.min", "uint2")
    overlay = _t("d", "float32", layout=CompositeHead(RULE_OVERLAY, OP_ADD, 2), members=(base, corr))
    part = _t("e", "float32", layout=CompositeHead(RULE_PARTITION, 0, 2), members=(plain, plain))
    assert [x.describe() for x in (plain, block, mx, overlay, part)] == [
        "float32",
        "per-block int4",
        "MXFP float4_e2m1",
        "overlay(uint4+uint2)",
        "partition(float32+float32)",
    ]


def test_element_types_agree_with_pyhurray_for_every_tag() -> None:
    """Our element-type table against the reference binding, tag by tag (0..255): the same
    tags are known, under the same names, tiers, widths, signedness and sub-byte packing."""
    hurray = pytest.importorskip("hurray")
    ours = {et.tag: et for et in ELEMENT_TYPES.values()}
    assert len(ours) == len(ELEMENT_TYPES)  # no tag twice
    for tag in range(256):
        try:
            ref = hurray.Dtype.from_tag(tag)
        except (ValueError, NotImplementedError):
            ref = None
        et = ELEMENT_TYPES_BY_TAG.get(tag)
        if ref is not None and ref.name == "extension":  # 0xF0-0xFE: private, described per descriptor
            assert 0xF0 <= tag <= 0xFE and et is None
            continue
        if ref is None:
            assert et is None, f"0x{tag:02X}: {et} unknown to pyhurray"
            continue
        assert et is not None, f"0x{tag:02X} ({ref.name}) missing"
        assert (et.name, et.tier, et.bits, et.packed) == (ref.name, ref.tier, ref.bit_width, ref.is_sub_byte), tag
        assert element_type(ref.name) is et and ours[tag] is et
        if et.kind != "bool":
            assert et.signed == ref.is_signed, tag
