"""safetensors MX checkpoints <-> .hrry: byte-identical round trips, conventions, bad files.

Oracles: the ``safetensors`` package (reads our output, wrote the fixtures), the gpt-oss /
HF reference MXFP4 decoder (LUT + ldexp, re-implemented here from openai
``_get_mxfp4_tensor``), byte comparison with the source files.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from hurray_interop.conversions.safetensors import (
    KV_CONVENTION,
    KV_HEADER,
    KV_LAYOUT,
    KV_METADATA,
    hurray_to_safetensors,
    safetensors_to_hurray,
)
from hurray_interop.core.hrry import HrryFile
from hurray_interop.core.model import MXFP
from hurray_interop.core.records import decode_scale_record, scale_record_key
from hurray_interop.errors import (
    ConversionRefused,
    FormatError,
    InconsistentError,
    OutputExistsError,
    TruncatedError,
    UnsupportedError,
)
from hurray_interop.formats.safetensors import SafetensorsFile, build_header, detect_pairs

safetensors = pytest.importorskip("safetensors")
torch = pytest.importorskip("torch")


def load_file(path: str) -> dict[str, np.ndarray]:
    """The safetensors package's view of a file (torch backend: it knows F8_E8M0 and F4);
    dtypes numpy lacks come back as their raw bytes (uint8)."""
    from safetensors import safe_open

    out = {}
    with safe_open(path, "pt") as so:
        for n in so.keys():
            t = so.get_tensor(n)
            try:
                out[n] = t.numpy()
            except TypeError:
                out[n] = t.reshape(-1).contiguous().view(torch.uint8).numpy()
    return out

GPT = "gpt-oss-tiny.safetensors"
CT = "ct-mxfp4-tiny.safetensors"
MX8 = "mxfp8-tiny.safetensors"
FP4_LUT = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def _kv(hf, key):
    v = hf.kv[key]
    return getattr(v, "value", v)


def _write_st(path: Path, tensors: list[tuple[str, str, list[int], bytes]], metadata=None, *, raw_header: bytes | None = None):
    """A safetensors file written by hand (struct + json), independent of our writer."""
    obj = {}
    if metadata is not None:
        obj["__metadata__"] = metadata
    pos = 0
    for n, d, s, b in tensors:
        obj[n] = {"dtype": d, "shape": s, "data_offsets": [pos, pos + len(b)]}
        pos += len(b)
    h = raw_header if raw_header is not None else json.dumps(obj).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors))
    return path


def compare_checkpoint_values(src, hrry, dequantize) -> dict[str, bool]:
    """Per MX pair of safetensors ``src``: is ``dequantize`` on the converted tensor in ``hrry``
    bitwise equal (NaN == NaN) to the ml_dtypes decoding of the source codes and scale bytes?"""
    from hurray_interop.conversions import mx
    from hurray_interop.core.elements import unpack

    out = {}
    with SafetensorsFile(src) as st, HrryFile(hrry) as hf:
        pairs, _ = detect_pairs(st)
        for p in pairs:
            el = mx.mx_element(p.element)
            n = int(np.prod(p.shape))
            codes = unpack(st.raw(p.data.name), el.hurray, n).reshape(p.shape).view(el.np_dtype)
            scales = st.raw(p.scale.name).reshape(p.scale.shape)
            ref = mx.source_values(codes, scales, el, p.block_size, -1)
            ours = np.asarray(dequantize(hf.tensor(p.hurray_name)), dtype=np.float32).reshape(-1)
            ref = ref.reshape(-1)
            out[p.hurray_name] = bool(((ours.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(ours) & np.isnan(ref))).all())
    return out


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("fixture,convention,n_mx", [(GPT, "gpt-oss", 4), (CT, "compressed-tensors", 3), (MX8, "mxfp8", 2)])
def test_fixture_round_trip_is_byte_identical(fixtures_dir, tmp_path, fixture, convention, n_mx):
    src = fixtures_dir / fixture
    rep = safetensors_to_hurray(src, tmp_path / "m.hrry")
    assert rep.exact and not rep.refused
    mxs = [t for t in rep.tensors if t.mapping.startswith("MXFP")]
    assert len(mxs) == n_mx
    assert sum(t.substituted_blocks for t in rep.tensors) > 0  # fixtures carry 0x00 on zero blocks
    with HrryFile(tmp_path / "m.hrry") as hf:
        assert _kv(hf, KV_CONVENTION) == convention
        assert json.loads(_kv(hf, KV_METADATA)) == {"format": "pt"}
        assert _kv(hf, KV_HEADER) == src.read_bytes()[8 : 8 + struct.unpack("<Q", src.read_bytes()[:8])[0]]
        assert len(hf.names) == len(load_file(str(src))) - n_mx
    rep2 = hurray_to_safetensors(tmp_path / "m.hrry", tmp_path / "back.safetensors")
    assert rep2.exact
    assert (tmp_path / "back.safetensors").read_bytes() == src.read_bytes()


def test_gpt_oss_pairs_map_to_one_mxfp_tensor_with_source_bytes(fixtures_dir, tmp_path):
    src = fixtures_dir / GPT
    safetensors_to_hurray(src, tmp_path / "m.hrry")
    ref = load_file(str(src))
    with HrryFile(tmp_path / "m.hrry") as hf:
        for layer in (0, 1):
            for nm in ("gate_up_proj", "down_proj"):
                base = f"model.layers.{layer}.mlp.experts.{nm}"
                blocks, scales = ref[base + "_blocks"], ref[base + "_scales"]
                t = hf.tensor(base)
                q = t.descriptor.quantization
                E, R, G, _ = blocks.shape
                assert isinstance(q, MXFP) and (q.axis, q.block_size) == (2, 32)
                assert t.shape == (E, R, G * 32) and t.descriptor.element_type.name == "float4_e2m1"
                assert bytes(t.data[0]) == blocks.tobytes()
                sc = scales.reshape(-1)
                hs = np.asarray(t.data[1])
                zero = sc == 0
                assert np.array_equal(hs[~zero], sc[~zero]) and np.all(hs[zero] == 0x7F)
                key = scale_record_key(base)
                if zero.any():
                    blocks_idx, orig = decode_scale_record(_kv(hf, key))
                    assert np.array_equal(blocks_idx, np.flatnonzero(zero)) and not orig.any()
                else:
                    assert key not in hf.kv
        assert "model.layers.0.mlp.experts.gate_up_proj_bias" in hf.names


def test_dequantizer_matches_the_gpt_oss_reference_decoder(fixtures_dir, tmp_path):
    try:
        from hurray_interop.dequant import dequantize
    except ImportError as e:  # pragma: no cover
        pytest.skip(f"shared dequantizer not importable: {e}")
    src = fixtures_dir / GPT
    safetensors_to_hurray(src, tmp_path / "m.hrry")
    ref = load_file(str(src))
    with HrryFile(tmp_path / "m.hrry") as hf:
        for base in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
            blk, sc = ref[base + "_blocks"], ref[base + "_scales"]
            # openai gpt_oss _get_mxfp4_tensor: interleaved nibbles, ldexp by (scale - 127)
            out = np.empty(blk.shape[:-1] + (32,), np.float32)
            out[..., 0::2] = FP4_LUT[blk & 0x0F]
            out[..., 1::2] = FP4_LUT[blk >> 4]
            want = np.ldexp(out, sc.astype(np.int32)[..., None] - 127).reshape(blk.shape[:-2] + (-1,))
            got = dequantize(hf.tensor(base))
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # -0.0 included
    cmp = compare_checkpoint_values(src, tmp_path / "m.hrry", dequantize)
    assert len(cmp) == 4 and all(cmp.values())


def test_ct_pairs_including_mxfp6_and_nvfp4_left_plain(fixtures_dir, tmp_path):
    src = fixtures_dir / CT
    safetensors_to_hurray(src, tmp_path / "m.hrry")
    ref = load_file(str(src))
    with HrryFile(tmp_path / "m.hrry") as hf:
        t6 = hf.tensor("model.layers.0.self_attn.q_proj.weight")
        assert t6.descriptor.element_type.name == "float6_e2m3" and t6.shape == (8, 64)
        assert bytes(t6.data[0]) == ref["model.layers.0.self_attn.q_proj.weight_packed"].tobytes()
        t4 = hf.tensor("model.layers.1.mlp.down_proj.weight")  # F8_E8M0 weight_scale
        assert t4.shape == (16, 128) and t4.descriptor.quantization.axis == 1
        for n in ("weight_packed", "weight_scale", "weight_global_scale"):
            assert f"model.layers.0.self_attn.k_proj.{n}" in hf.names  # NVFP4: plain
        mask = hf.tensor("model.mask")  # BOOL travels as uint8 bytes
        assert mask.descriptor.element_type.name == "uint8" and bytes(mask.data[0]) == ref["model.mask"].tobytes()
        assert hf.tensor("model.scalar").shape == ()
        lay = json.loads(_kv(hf, KV_LAYOUT))
        assert [d["name"] for d in lay["tensors"]] == list(SafetensorsFile(src).names)


def test_ct_global_scale_means_not_mx_even_with_e8m0_shaped_scales(tmp_path):
    """compressed-tensors uses the same names for NVFP4: a ``weight_global_scale`` beside
    ``weight_packed`` / ``weight_scale`` marks the tensor as not MX even when the scale is
    U8 with one byte per 32 elements, the shape MXFP4 has; all three stay plain tensors."""
    rng = np.random.default_rng(3)
    packed = rng.integers(0, 256, size=(4, 16), dtype=np.uint8)
    scale = np.full((4, 1), 127, np.uint8)
    tensors = [("m.weight_packed", "U8", [4, 16], packed.tobytes()), ("m.weight_scale", "U8", [4, 1], scale.tobytes())]
    plain = _write_st(tmp_path / "mx.safetensors", tensors)
    nv = _write_st(tmp_path / "nv.safetensors", tensors + [("m.weight_global_scale", "F32", [1], np.float32([448.0]).tobytes())])
    safetensors_to_hurray(plain, tmp_path / "mx.hrry")
    with HrryFile(tmp_path / "mx.hrry") as hf:  # without the global scale: an MXFP4 pair
        assert isinstance(hf.tensor("m.weight").descriptor.quantization, MXFP)
    safetensors_to_hurray(nv, tmp_path / "nv.hrry")
    with HrryFile(tmp_path / "nv.hrry") as hf:
        assert set(hf.names) == {"m.weight_packed", "m.weight_scale", "m.weight_global_scale"}
        assert all(hf.tensor(n).descriptor.quantization is None for n in hf.names)
        assert bytes(hf.tensor("m.weight_packed").data[0]) == packed.tobytes()
    hurray_to_safetensors(tmp_path / "nv.hrry", tmp_path / "back.safetensors")
    assert (tmp_path / "back.safetensors").read_bytes() == nv.read_bytes()


def test_convention_switch_gpt_oss_to_ct_and_back(fixtures_dir, tmp_path):
    src = fixtures_dir / GPT
    safetensors_to_hurray(src, tmp_path / "m.hrry")
    hurray_to_safetensors(tmp_path / "m.hrry", tmp_path / "ct.safetensors", convention="compressed-tensors")
    ref = load_file(str(src))
    ct = load_file(str(tmp_path / "ct.safetensors"))  # the safetensors package reads our writer
    base = "model.layers.0.mlp.experts.gate_up_proj"
    blk = ref[base + "_blocks"]
    assert ct[base + ".weight_packed"].shape == blk.shape[:-2] + (blk.shape[-2] * 16,)
    assert ct[base + ".weight_packed"].tobytes() == blk.tobytes()
    assert ct[base + ".weight_scale"].tobytes() == ref[base + "_scales"].tobytes()  # 0x00 restored
    assert base + "_blocks" not in ct and np.array_equal(ct["model.layers.0.mlp.router.bias"], ref["model.layers.0.mlp.router.bias"])
    # and back: the ct file re-imports as MXFP tensors named "<base>.weight"
    safetensors_to_hurray(tmp_path / "ct.safetensors", tmp_path / "ct.hrry")
    hurray_to_safetensors(tmp_path / "ct.hrry", tmp_path / "g.safetensors", convention="gpt-oss")
    g = load_file(str(tmp_path / "g.safetensors"))
    assert g[base + ".weight_blocks"].tobytes() == blk.tobytes() and g[base + ".weight_blocks"].shape == blk.shape


def test_mxfp6_cannot_be_written_as_gpt_oss_unless_fallback(fixtures_dir, tmp_path):
    safetensors_to_hurray(fixtures_dir / CT, tmp_path / "m.hrry")
    with pytest.raises(ConversionRefused, match="no exact safetensors form") as ei:
        hurray_to_safetensors(tmp_path / "m.hrry", tmp_path / "x.safetensors", convention="gpt-oss")
    assert ei.value.reasons == [("model.layers.0.self_attn.q_proj.weight", "MXFP float6_e2m3", ei.value.reasons[0][2])]
    assert "gpt-oss has no float6_e2m3" in ei.value.reasons[0][2]
    assert not (tmp_path / "x.safetensors").exists() and not _leftovers(tmp_path)
    plan = hurray_to_safetensors(tmp_path / "m.hrry", tmp_path / "x.safetensors", convention="gpt-oss", dry_run=True)
    assert [t.status for t in plan.tensors].count("refused") == 1 and not (tmp_path / "x.safetensors").exists()
    rep = hurray_to_safetensors(
        tmp_path / "m.hrry", tmp_path / "x.safetensors", convention="gpt-oss", fallback="float32"
    )
    (fb,) = [t for t in rep.tensors if t.name == "model.layers.0.self_attn.q_proj.weight"]
    assert fb.status == "value-exact" and fb.max_abs_error == 0.0
    out = load_file(str(tmp_path / "x.safetensors"))
    ref = load_file(str(fixtures_dir / CT))
    packed = ref["model.layers.0.self_attn.q_proj.weight_packed"].astype(np.uint32).reshape(8, -1, 3)
    word = packed[..., 0] | packed[..., 1] << 8 | packed[..., 2] << 16  # compressed-tensors LE bitstream
    codes = np.stack([(word >> (6 * i)) & 0x3F for i in range(4)], axis=-1).reshape(8, 64).astype(np.uint8)
    sc = ref["model.layers.0.self_attn.q_proj.weight_scale"]
    want = codes.view(ml_dtypes.float6_e2m3fn).astype(np.float32) * np.repeat(
        sc.view(ml_dtypes.float8_e8m0fnu).astype(np.float32), 32, axis=1
    )
    assert np.array_equal(out["model.layers.0.self_attn.q_proj.weight"], want)
    assert out["model.layers.0.mlp.down_proj.weight_blocks"].shape == (32, 2, 16)


def test_metadata_order_and_odd_header_are_reproduced(tmp_path):
    sc = bytes([127, 0])
    blocks = bytes(range(16)) + bytes(16)
    src = _write_st(
        tmp_path / "a.safetensors",
        [("w_blocks", "U8", [2, 1, 16], blocks), ("w_scales", "U8", [2, 1], sc), ("b", "BF16", [2], b"\x80\x3f\x00\x40")],
        {"zeta": "1", "alpha": "two", "ünïcode": "ok"},
    )
    safetensors_to_hurray(src, tmp_path / "a.hrry")
    hurray_to_safetensors(tmp_path / "a.hrry", tmp_path / "b.safetensors")
    assert (tmp_path / "b.safetensors").read_bytes() == src.read_bytes()
    meta = SafetensorsFile(tmp_path / "b.safetensors").metadata
    assert list(meta) == ["zeta", "alpha", "ünïcode"]


def test_writer_header_matches_the_safetensors_package_layout(tmp_path):
    from safetensors.torch import save_file

    t = {"a": torch.ones(3), "b": torch.zeros(2, dtype=torch.uint8)}
    save_file(t, str(tmp_path / "p.safetensors"), metadata={"format": "pt"})
    raw = (tmp_path / "p.safetensors").read_bytes()
    st = SafetensorsFile(tmp_path / "p.safetensors")
    h, _ = build_header([(e.name, e.dtype, e.shape) for e in st.entries], st.metadata)
    assert h == raw[8 : 8 + len(h)]


# ---------------------------------------------------------------------------
# scales Hurray cannot hold


def _pair_file(tmp_path, scale_byte: int, codes_nonzero: bool):
    blocks = np.zeros((1, 2, 16), np.uint8)
    if codes_nonzero:
        blocks[0, 1, 3] = 0x21
    sc = np.array([[127, scale_byte]], np.uint8)
    return _write_st(tmp_path / "p.safetensors", [("m_blocks", "U8", [1, 2, 16], blocks.tobytes()), ("m_scales", "U8", [1, 2], sc.tobytes())])


def test_zero_scale_on_nonzero_block_refused_nothing_written(tmp_path):
    src = _pair_file(tmp_path, 0x00, True)
    with pytest.raises(ConversionRefused, match=r"m: scale byte 0x00 \(2\^-127\) at block 1") as ei:
        safetensors_to_hurray(src, tmp_path / "o.hrry")
    assert ei.value.reasons[0][0] == "m"
    assert not (tmp_path / "o.hrry").exists() and not _leftovers(tmp_path)


def test_nan_scale_refused_and_fallback_float32(tmp_path):
    src = _pair_file(tmp_path, 0xFF, False)
    with pytest.raises(ConversionRefused, match="0xFF"):
        safetensors_to_hurray(src, tmp_path / "o.hrry")
    src = _pair_file(tmp_path, 0x00, True)
    rep = safetensors_to_hurray(src, tmp_path / "o.hrry", fallback="float32")
    (plan,) = rep.tensors
    assert plan.status == "value-exact" and plan.max_abs_error == 0.0 and "float32" in plan.reason
    with HrryFile(tmp_path / "o.hrry") as hf:
        t = hf.tensor("m")
        assert t.descriptor.quantization is None and t.shape == (1, 64)
        vals = np.asarray(t.data[0]).view(np.float32)
        # code 0x1 (0.5) and 0x2 (1.0) at elements 38, 39 of block 1 (scale 2^-127)
        assert vals[38] == np.float32(0.5 * 2.0**-127) and vals[39] == np.float32(2.0**-127)
    hurray_to_safetensors(tmp_path / "o.hrry", tmp_path / "o.safetensors")
    out = load_file(str(tmp_path / "o.safetensors"))
    assert list(out) == ["m"] and out["m"].dtype == np.float32


def test_output_exists_needs_force(fixtures_dir, tmp_path):
    (tmp_path / "m.hrry").write_bytes(b"keep")
    with pytest.raises(OutputExistsError):
        safetensors_to_hurray(fixtures_dir / GPT, tmp_path / "m.hrry")
    assert (tmp_path / "m.hrry").read_bytes() == b"keep"
    safetensors_to_hurray(fixtures_dir / GPT, tmp_path / "m.hrry", force=True)
    assert (tmp_path / "m.hrry").read_bytes()[:8] == b"HRRYFILE"


# ---------------------------------------------------------------------------
# malformed checkpoints


def test_blocks_without_scales(tmp_path):
    src = _write_st(tmp_path / "x.safetensors", [("a.w_blocks", "U8", [1, 1, 16], bytes(16))])
    with pytest.raises(FormatError, match=r"tensor 'a.w_blocks'.*no scale tensor 'a.w_scales'"):
        safetensors_to_hurray(src, tmp_path / "o.hrry")
    assert not _leftovers(tmp_path) and not (tmp_path / "o.hrry").exists()


def test_mismatched_pair_shapes(tmp_path):
    src = _write_st(tmp_path / "x.safetensors", [("w_blocks", "U8", [2, 1, 16], bytes(32)), ("w_scales", "U8", [1, 1], b"\x7f")])
    with pytest.raises(InconsistentError, match=r"tensor 'w_blocks'.*\[2, 1, 16\].*\[1, 1\]"):
        safetensors_to_hurray(src, tmp_path / "o.hrry")
    src = _write_st(tmp_path / "y.safetensors", [("w_blocks", "U8", [1, 1, 8], bytes(8)), ("w_scales", "U8", [1, 1], b"\x7f")])
    with pytest.raises(InconsistentError, match="w_blocks"):
        safetensors_to_hurray(src, tmp_path / "o.hrry")
    src = _write_st(
        tmp_path / "z.safetensors",
        [("m.weight_packed", "U8", [2, 20], bytes(40)), ("m.weight_scale", "U8", [2, 1], b"\x7f\x7f")],
    )
    with pytest.raises(InconsistentError, match=r"tensor 'm.weight_packed'.*\[2, 20\]"):
        safetensors_to_hurray(src, tmp_path / "o.hrry")


def test_wrong_pair_dtypes(tmp_path):
    src = _write_st(tmp_path / "x.safetensors", [("w_blocks", "F32", [1, 1, 4], bytes(16)), ("w_scales", "U8", [1, 1], b"\x7f")])
    with pytest.raises(FormatError, match=r"tensor 'w_blocks'.*must be U8, not F32"):
        safetensors_to_hurray(src, tmp_path / "o.hrry")
    src = _write_st(tmp_path / "y.safetensors", [("w_blocks", "U8", [1, 1, 16], bytes(16)), ("w_scales", "F16", [1, 1], b"\x00\x3c")])
    with pytest.raises(FormatError, match=r"tensor 'w_scales'.*not F16"):
        safetensors_to_hurray(src, tmp_path / "o.hrry")


@pytest.mark.parametrize(
    "mutate,err,match",
    [
        (lambda b: b[:5], TruncatedError, "header length needs 8"),
        (lambda b: struct.pack("<Q", 10**6) + b[8:], TruncatedError, "runs past the end"),
        (lambda b: b[:-3], TruncatedError, "run past the 9-byte data section"),
        (lambda b: b + b"xx", InconsistentError, "cover 12 bytes of the 14-byte data section"),
        (lambda b: b[:8] + b"[" + b[9:], FormatError, "start with"),
        (lambda b: b[:8] + b"{\xff" + b[10:], FormatError, "not UTF-8"),
        (lambda b: b[:8] + b.replace(b'"dtype":"F32"', b'"dtype":"F33"')[8:], UnsupportedError, "F33"),
        (lambda b: b[:8] + b.replace(b"[0,8]", b"[0,9]")[8:], InconsistentError, "hold 9 bytes"),
        (lambda b: b[:8] + b.replace(b'"a":{', b'"b":{')[8:], InconsistentError, "duplicate key 'b'"),
        (lambda b: b[:8] + b.replace(b'"shape":[2]', b'"shape":[-2]')[8:], FormatError, "non-negative"),
        (lambda b: b[:8] + b.replace(b"[8,12]", b"[4, 8]")[8:], InconsistentError, r"\[4, 8\] overlaps the previous tensor"),
    ],
)
def test_corrupt_files_raise_typed_errors(tmp_path, mutate, err, match):
    good = tmp_path / "g.safetensors"
    h = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}'
    _write_st(good, [("a", "F32", [2], bytes(8)), ("b", "F32", [1], bytes(4))], raw_header=h)
    bad = tmp_path / "b.safetensors"
    bad.write_bytes(mutate(good.read_bytes()))
    with pytest.raises(err, match=match):
        SafetensorsFile(bad)


def test_reader_agrees_with_safetensors_package(fixtures_dir):
    for f in (GPT, CT):
        ref = load_file(str(fixtures_dir / f)) if f == GPT else None
        st = SafetensorsFile(fixtures_dir / f)
        from safetensors import safe_open

        with safe_open(str(fixtures_dir / f), "pt") as so:
            for e in st.entries:
                t = so.get_tensor(e.name)
                want = t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
                assert st.raw(e.name).tobytes() == want, e.name
        if ref is not None:
            assert np.array_equal(st.array("model.layers.0.mlp.router.weight"), ref["model.layers.0.mlp.router.weight"])
        pairs, used = detect_pairs(st)
        assert len(used) == 2 * len(pairs)
        st.close()


def test_bf16_plain_tensor_view(fixtures_dir):
    st = SafetensorsFile(fixtures_dir / GPT)
    a = st.array("model.embed_tokens.weight")
    assert a.dtype == np.dtype(ml_dtypes.bfloat16) and a.shape == (16, 64)
    st.close()


def test_dry_run_writes_nothing(fixtures_dir, tmp_path):
    rep = safetensors_to_hurray(fixtures_dir / GPT, tmp_path / "m.hrry", dry_run=True)
    assert rep.dry_run and len(rep.tensors) == 15 and not os.listdir(tmp_path)


# ---------------------------------------------------------------------------
# verify / inspect hooks


@pytest.mark.parametrize("fixture", [GPT, CT, MX8])
def test_verify_round_trip_of_fixtures(fixtures_dir, fixture):
    from hurray_interop._verify import verify_roundtrip

    r = verify_roundtrip(fixtures_dir / fixture)
    assert r.ok and r.file_bytes_equal, r.summary_line()
    mxs = [t for t in r.tensors if t.mapping.startswith("MXFP")]
    assert mxs and all(t.values_equal and t.bytes_equal for t in mxs)


def test_verify_pair_finds_a_changed_code(fixtures_dir, tmp_path):
    from hurray_interop._verify import verify_pair

    src = fixtures_dir / GPT
    safetensors_to_hurray(src, tmp_path / "m.hrry")
    name = "model.layers.1.mlp.experts.down_proj"
    with HrryFile(tmp_path / "m.hrry") as hf:
        off = hf.entry(name).data_offset + 5
    raw = bytearray((tmp_path / "m.hrry").read_bytes())
    raw[off] ^= 0x01  # element 10 of block 0: one FP4 code changes
    (tmp_path / "bad.hrry").write_bytes(bytes(raw))
    assert verify_pair(src, tmp_path / "m.hrry").ok
    r = verify_pair(src, tmp_path / "bad.hrry")
    assert not r.ok and r.file_bytes_equal is False
    (bad,) = [t for t in r.tensors if not t.ok]
    assert bad.name == name and bad.bytes_equal is False and bad.values_equal is False
    assert "block 0, element 10" in bad.where or "byte 5" in bad.where
    assert any(f"tensor '{name}_blocks' byte 5" in p for p in r.problems)


def test_verify_and_inspect_report_refused_tensors(tmp_path):
    from hurray_interop._inspect import inspect_file
    from hurray_interop._verify import verify_roundtrip

    src = _pair_file(tmp_path, 0x00, True)
    r = verify_roundtrip(src)
    assert not r.ok and [t.name for t in r.tensors] == ["m"] and r.tensors[0].mapping == "refused"
    info = inspect_file(src)
    assert info["format"] == "safetensors" and info["convention"] == "gpt-oss"
    assert [(t["name"], t["status"]) for t in info["tensors"]] == [("m", "refused")]


# ---------------------------------------------------------------------------
# across formats: GGUF MXFP4 -> Hurray -> gpt-oss safetensors (codes and scales, no decoding)


def test_gguf_mxfp4_reaches_gpt_oss_layout_exactly(fixtures_dir, tmp_path):
    pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf import quants as gq

    from hurray_interop.conversions.gguf import gguf_to_hurray

    src = fixtures_dir / "tiny-llama.gguf"
    gguf_to_hurray(src, tmp_path / "m.hrry")
    rep = hurray_to_safetensors(tmp_path / "m.hrry", tmp_path / "m.safetensors", convention="gpt-oss", fallback="float32")
    out = load_file(str(tmp_path / "m.safetensors"))
    seen = 0
    for t in GGUFReader(str(src)).tensors:
        if t.tensor_type != GGMLQuantizationType.MXFP4:
            continue
        seen += 1
        blk, sc = out[t.name + "_blocks"], out[t.name + "_scales"]
        raw = np.asarray(t.data, np.uint8).reshape(-1, 17)
        assert np.array_equal(sc.reshape(-1), raw[:, 0])  # e8m0 bytes moved, 0x00 restored
        # gpt-oss decoder on our output == gguf-py decoder on the source (+-0 equal: ggml loses -0)
        vals = np.empty(blk.shape[:-1] + (32,), np.float32)
        vals[..., 0::2] = FP4_LUT[blk & 0x0F]
        vals[..., 1::2] = FP4_LUT[blk >> 4]
        mine = np.ldexp(vals, sc.astype(np.int32)[..., None] - 127).reshape(-1)
        ref = gq.dequantize(np.asarray(t.data), GGMLQuantizationType.MXFP4).reshape(-1)
        assert np.array_equal(mine, ref)
        # the split-half GGUF nibbles became interleaved ones: codes j and j+16 of block 0
        qs = raw[0, 1:]
        codes = np.concatenate([qs & 0x0F, qs >> 4])
        assert np.array_equal(blk.reshape(-1, 16)[0], codes[0::2] | (codes[1::2] << 4))
    assert seen >= 2 and any(t.status == "exact" and "MXFP4" in t.mapping for t in rep.tensors)


def test_gpt_oss_to_gguf_and_back_keeps_codes_and_scales(fixtures_dir, tmp_path):
    pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf import quants as gq

    from hurray_interop.conversions.gguf import gguf_to_hurray, hurray_to_gguf

    src = fixtures_dir / GPT
    safetensors_to_hurray(src, tmp_path / "a.hrry")
    hurray_to_gguf(tmp_path / "a.hrry", tmp_path / "m.gguf")
    ref = load_file(str(src))
    n = 0
    for t in GGUFReader(str(tmp_path / "m.gguf")).tensors:
        if t.tensor_type != GGMLQuantizationType.MXFP4:
            continue
        n += 1
        blk, sc = ref[t.name + "_blocks"], ref[t.name + "_scales"]
        raw = np.asarray(t.data, np.uint8).reshape(-1, 17)
        assert np.array_equal(raw[:, 0], sc.reshape(-1))  # 0x00 of all-zero blocks restored
        vals = np.empty(blk.shape[:-1] + (32,), np.float32)
        vals[..., 0::2] = FP4_LUT[blk & 0x0F]
        vals[..., 1::2] = FP4_LUT[blk >> 4]
        want = np.ldexp(vals, sc.astype(np.int32)[..., None] - 127).reshape(-1)
        got = gq.dequantize(np.asarray(t.data), GGMLQuantizationType.MXFP4).reshape(-1)
        assert np.array_equal(got, want)  # == treats ggml's +0 for code 8 as equal to -0
    assert n == 4
    gguf_to_hurray(tmp_path / "m.gguf", tmp_path / "b.hrry")
    hurray_to_safetensors(tmp_path / "b.hrry", tmp_path / "back.safetensors", convention="gpt-oss")
    back = load_file(str(tmp_path / "back.safetensors"))
    for k, v in ref.items():
        if k.endswith(("_blocks", "_scales")):
            assert back[k].tobytes() == v.tobytes() and back[k].shape == v.shape, k


# ---------------------------------------------------------------------------
# the reference implementation reads what we write; broken input never escapes the error tree


def test_pyhurray_reads_the_converted_checkpoint(fixtures_dir, tmp_path):
    hurray = pytest.importorskip("hurray")
    src = fixtures_dir / CT
    safetensors_to_hurray(src, tmp_path / "m.hrry")
    ref = load_file(str(src))
    files = hurray.load(str(tmp_path / "m.hrry"))
    t = files["model.layers.0.self_attn.q_proj.weight"]
    assert str(t.dtype) == "float6_e2m3" and tuple(t.shape) == (8, 64)
    q = t.quantization
    assert (q.axis, q.block_size, q.scale_buffer_index) == (1, 32, 1)
    assert np.asarray(t.buffer(0)).tobytes() == ref["model.layers.0.self_attn.q_proj.weight_packed"].tobytes()
    assert np.asarray(t.buffer(1)).tobytes() == ref["model.layers.0.self_attn.q_proj.weight_scale"].tobytes()
    kv = hurray.load_kv(str(tmp_path / "m.hrry"))
    assert kv[KV_CONVENTION] == "compressed-tensors" and json.loads(kv[KV_METADATA]) == {"format": "pt"}
    assert kv[scale_record_key("model.layers.0.mlp.down_proj.weight")][:4] == b"\x01\x00\x00\x00"


def test_random_corruption_raises_only_project_errors(fixtures_dir, tmp_path):
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as stn

    from hurray_interop.errors import HurrayInteropError

    good = (fixtures_dir / CT).read_bytes()
    hlen = struct.unpack("<Q", good[:8])[0]

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(pos=stn.integers(0, 8 + hlen + 64), val=stn.integers(0, 255), cut=stn.integers(0, len(good)))
    def check(pos, val, cut):
        raw = bytearray(good)
        raw[pos] = val
        p = tmp_path / "f.safetensors"
        p.write_bytes(bytes(raw[: max(cut, pos + 1)]))
        try:
            safetensors_to_hurray(p, tmp_path / "o.hrry", force=True)
        except HurrayInteropError:
            pass

    check()
    del hypothesis


def test_malformed_layout_record_is_a_format_error(fixtures_dir, tmp_path):
    from hurray_interop.core.hrry import HrryWriter

    safetensors_to_hurray(fixtures_dir / GPT, tmp_path / "m.hrry")
    with HrryFile(tmp_path / "m.hrry") as hf, HrryWriter(tmp_path / "bad.hrry") as w:
        for n in hf.names:
            t = hf.tensor(n)
            w.write(n, t.descriptor, t.data)
        kv = {k: v for k, v in hf.kv.items()}
        kv[KV_LAYOUT] = '{"version": 1, "tensors": [{"name": "x"}]}'
        w.finish(kv)
    with pytest.raises(FormatError, match="malformed safetensors layout record"):
        hurray_to_safetensors(tmp_path / "bad.hrry", tmp_path / "o.safetensors")
    assert not (tmp_path / "o.safetensors").exists()


def test_huge_shape_does_not_wrap_around(tmp_path):
    # 2^62 * 2^2 F32 elements would wrap to 0 bytes in int64 arithmetic
    h = b'{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}'
    p = _write_st(tmp_path / "h.safetensors", [], raw_header=h)
    with pytest.raises(InconsistentError, match="hold 0 bytes"):
        SafetensorsFile(p)


def test_mxfp8_pairs_and_per_channel_fp8_left_plain(fixtures_dir, tmp_path):
    from hurray_interop.dequant import dequantize

    src = fixtures_dir / MX8
    safetensors_to_hurray(src, tmp_path / "m.hrry")
    with HrryFile(tmp_path / "m.hrry") as hf, safetensors.safe_open(str(src), "pt") as so:
        for name, dt in (("model.layers.0.mlp.down_proj.weight", "float8_e4m3"), ("model.layers.1.mlp.down_proj.weight", "float8_e5m2")):
            t = hf.tensor(name)
            assert t.descriptor.element_type.name == dt and t.descriptor.quantization.axis == 1
            w, sc = so.get_tensor(name), so.get_tensor(name + "_scale")
            assert bytes(t.data[0]) == w.view(torch.uint8).numpy().tobytes()
            want = w.float() * sc.view(torch.float8_e8m0fnu).float().repeat_interleave(32, dim=1)
            assert np.array_equal(dequantize(t), want.numpy())  # torch decodes 0x00 as 2^-127: codes are 0
        q = hf.tensor("model.layers.0.self_attn.q_proj.weight")
        assert q.descriptor.quantization is None and q.descriptor.element_type.name == "float8_e4m3"
        assert "model.layers.0.self_attn.q_proj.weight_scale" in hf.names
        assert "model.layers.0.mlp.down_proj.weight_scale" not in hf.names


def test_compressed_tensors_convention_covers_mxfp8_naming(fixtures_dir, tmp_path):
    src = fixtures_dir / MX8
    safetensors_to_hurray(src, tmp_path / "m.hrry")
    hurray_to_safetensors(tmp_path / "m.hrry", tmp_path / "ct.safetensors", convention="compressed-tensors")
    assert (tmp_path / "ct.safetensors").read_bytes() == src.read_bytes()
    with pytest.raises(ConversionRefused, match="no exact safetensors form"):
        hurray_to_safetensors(tmp_path / "m.hrry", tmp_path / "g.safetensors", convention="gpt-oss")


@pytest.mark.parametrize(
    "layout",
    [
        "[" * 100000 + "]" * 100000,
        '{"version": 1, "tensors": [{"name": "a", "dtype": "U8", "shape": 3, "hurray": "a", "role": "plain"}]}',
        '{"version": 1, "tensors": [{"name": "a", "dtype": 5, "shape": [3], "hurray": "a", "role": "plain"}]}',
        '{"version": 1, "tensors": [{"name": "a", "dtype": "U8", "shape": [-3], "hurray": "a", "role": "plain"}]}',
        '{"version": 1, "tensors": [{"name": "a", "dtype": "U8", "shape": [3], "hurray": "a", "role": "data", "convention": "x"}]}',
        '{"version": 2, "tensors": []}',
    ],
)
def test_hostile_layout_records_are_format_errors(fixtures_dir, tmp_path, layout):
    from hurray_interop.core.hrry import HrryWriter

    safetensors_to_hurray(fixtures_dir / GPT, tmp_path / "m.hrry")
    with HrryFile(tmp_path / "m.hrry") as hf, HrryWriter(tmp_path / "bad.hrry") as w:
        for n in hf.names:
            t = hf.tensor(n)
            w.write(n, t.descriptor, t.data)
        kv = dict(hf.kv)
        kv[KV_LAYOUT] = layout
        w.finish(kv)
    with pytest.raises(FormatError, match="malformed safetensors layout record"):
        hurray_to_safetensors(tmp_path / "bad.hrry", tmp_path / "o.safetensors")


def test_layout_record_with_a_lying_shape_is_refused_before_writing(fixtures_dir, tmp_path):
    from hurray_interop.core.hrry import HrryWriter

    safetensors_to_hurray(fixtures_dir / GPT, tmp_path / "m.hrry")
    with HrryFile(tmp_path / "m.hrry") as hf, HrryWriter(tmp_path / "bad.hrry") as w:
        for n in hf.names:
            t = hf.tensor(n)
            w.write(n, t.descriptor, t.data)
        kv = dict(hf.kv)
        lay = json.loads(_kv(hf, KV_LAYOUT))
        (ent,) = [d for d in lay["tensors"] if d["name"] == "model.layers.0.mlp.router.bias"]
        ent["shape"] = [3]
        kv[KV_LAYOUT] = json.dumps(lay)
        kv[KV_METADATA] = "[" * 100000
        w.finish(kv)
    with pytest.raises(FormatError, match="malformed safetensors metadata record"):
        hurray_to_safetensors(tmp_path / "bad.hrry", tmp_path / "o.safetensors")
    with HrryFile(tmp_path / "bad.hrry") as hf, HrryWriter(tmp_path / "bad2.hrry") as w:
        for n in hf.names:
            t = hf.tensor(n)
            w.write(n, t.descriptor, t.data)
        kv = dict(hf.kv)
        del kv[KV_METADATA]
        w.finish(kv)
    with pytest.raises(InconsistentError, match=r"tensor 'model.layers.0.mlp.router.bias'.*needs 12 bytes.*holds 8"):
        hurray_to_safetensors(tmp_path / "bad2.hrry", tmp_path / "o.safetensors")
    assert not (tmp_path / "o.safetensors").exists() and not _leftovers(tmp_path)


@pytest.mark.parametrize("element", ["int8", "float8_e4m3"])
def test_export_restores_recorded_scales_with_one_decode_of_the_record(monkeypatch, element):
    """The export puts the recorded source scales back (MXINT8: through the exponent shift)
    after checking the stored stand-ins, decoding the record once; a record the stored scales
    contradict is refused."""
    from hurray_interop.conversions import mx
    from hurray_interop.core import records
    from hurray_interop.core.model import Tensor
    from hurray_interop.errors import FormatError

    codes = np.ones((4, 32), np.uint8)
    codes[1] = codes[3] = 0  # all-zero blocks: their 0x00 scales are replaced by the stand-in
    scales = np.array([[120], [0], [130], [0]], np.uint8)
    el = mx.mx_element(element)
    imp = mx.from_codes(codes.view(el.np_dtype), scales.view(ml_dtypes.float8_e8m0fnu), element=element, name="w")
    rec = imp.kv[records.scale_record_key("w")]
    assert imp.substituted_blocks.tolist() == [1, 3]
    calls = []
    decode = records.decode_scale_record
    monkeypatch.setattr(records, "decode_scale_record", lambda *a, **k: calls.append(1) or decode(*a, **k))
    back = mx.to_numpy(imp.tensor, record=rec)
    assert bytes(back.scales.view(np.uint8)) == bytes(scales) and len(calls) == 1
    stored = np.asarray(imp.tensor.data[1]).view(np.uint8)
    bad = Tensor("w", imp.tensor.descriptor, (imp.tensor.data[0], np.where(np.arange(4) == 3, 0x70, stored).astype(np.uint8)))
    with pytest.raises(FormatError, match="block 3: stored scale 0x70 is not the stand-in 0x7f"):
        mx.to_numpy(bad, record=rec)


def test_dequantizing_every_tensor_finds_the_pairs_once(fixtures_dir, monkeypatch):
    """hurray_interop.dequantize of each tensor of a checkpoint looks the MX pairs up on the
    reader, found once per file (was: all pairs found again per tensor, O(n²) over a file);
    the values are those of the pair's Hurray tensor."""
    import hurray_interop
    from hurray_interop.errors import UsageError
    from hurray_interop.formats import safetensors as S

    calls = []
    find = S._find_pairs
    monkeypatch.setattr(S, "_find_pairs", lambda st: calls.append(st) or find(st))
    with S.SafetensorsFile(fixtures_dir / GPT) as st:
        pairs = {p.data.name: p for p in S.detect_pairs(st)[0]}
        scales = {p.scale.name for p in pairs.values()}
        done = 0
        for name in st.names:
            if name in scales:
                with pytest.raises(UsageError, match="scale tensor of the MX pair"):
                    hurray_interop.dequantize(st.tensor(name))
                continue
            vals = hurray_interop.dequantize(st.tensor(name))
            if name in pairs:
                assert vals.shape == tuple(pairs[name].shape)
            done += 1
        assert len(calls) == 1 and done == len(st.names) - len(scales) and pairs
