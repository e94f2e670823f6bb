"""The central model's report helpers."""

from __future__ import annotations

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


def test_tag_table_is_the_inverse_of_the_name_table() -> None:
    assert {et.tag: et for et in ELEMENT_TYPES.values()} == dict(ELEMENT_TYPES_BY_TAG)
