"""Upstream conformance vectors: decode to the manifest, re-encode byte-identically,
and survive truncation at every length and every single-bit flip with only the
project's typed errors."""

from __future__ import annotations

import json

import pytest

from hurray_interop.core.descriptor import decode_descriptor, encode_descriptor
from hurray_interop.errors import FormatError, TruncatedError, UnsupportedError


def _vectors(vectors_dir):
    manifest = json.loads((vectors_dir / "manifest.json").read_text())
    return [(e["file"], (vectors_dir / e["file"]).read_bytes(), e["expect"]) for e in manifest["descriptors"]]


@pytest.fixture(scope="module")
def vectors(vectors_dir):
    v = _vectors(vectors_dir)
    assert len(v) == 11, "the manifest lists 11 descriptor vectors"
    return v


def test_vectors_decode_to_manifest_and_reencode_identically(vectors):
    for name, raw, exp in vectors:
        d = decode_descriptor(raw, path=name)
        got = {
            "version_major": d.version_major,
            "version_minor": d.version_minor,
            "element_type_tag": d.element_type.tag,
            "element_type": d.element_type.name,
            "shape": list(d.shape),
            "byte_offset": d.byte_offset,
            "layout_tag": d.layout.tag,
            "buffer_byte_sizes": [h.byte_size for h in d.buffers],
            "has_quantization": d.quantization is not None,
            "has_shard": d.shard is not None,
        }
        assert got == exp, name
        assert encode_descriptor(d) == raw, name


def test_vectors_decode_at_offset_with_trailing_bytes(vectors):
    # a descriptor embedded in a larger buffer: bytes after descriptor_length are ignored
    for name, raw, _ in vectors:
        d = decode_descriptor(b"\xaa" * 7 + raw + b"\x55" * 9, 7)
        assert encode_descriptor(d) == raw, name


def test_truncation_at_every_length_raises_truncated(vectors):
    for name, raw, _ in vectors:
        for n in range(len(raw)):
            with pytest.raises(TruncatedError) as ei:
                decode_descriptor(raw[:n], base=1000)
            assert ei.value.offset is not None and 1000 <= ei.value.offset <= 1000 + len(raw), (name, n)


def test_every_single_bit_flip_is_rejected_or_round_trips(vectors):
    outcomes = {"rejected": 0, "accepted": 0}
    for name, raw, _ in vectors:
        for bit in range(len(raw) * 8):
            mutated = bytearray(raw)
            mutated[bit // 8] ^= 1 << (bit % 8)
            try:
                d = decode_descriptor(bytes(mutated))
            except (FormatError, UnsupportedError) as exc:
                assert exc.field, (name, bit, exc)
                assert exc.offset is not None, (name, bit, exc)
                outcomes["rejected"] += 1
                continue
            # an accepted mutation must be a valid descriptor that re-encodes exactly,
            # except that a version_minor > 0 header keeps its trailing-tolerant length
            assert encode_descriptor(d) == bytes(mutated), (name, bit)
            outcomes["accepted"] += 1
    # most flips break something; some (shape/size pairs, strides, stats values) do not
    assert outcomes["rejected"] > 0 and outcomes["accepted"] > 0


def test_flip_in_magic_is_bad_magic(vectors):
    from hurray_interop.errors import BadMagicError

    _, raw, _ = vectors[0]
    with pytest.raises(BadMagicError, match="bad magic") as ei:
        decode_descriptor(b"HRRZ" + raw[4:], base=64)
    assert ei.value.field == "magic" and ei.value.offset == 64
