"""``.hrry`` reader and writer: the conformance file, hostile files, streaming, laziness."""

from __future__ import annotations

import json
import random
import struct

import crc32c
import numpy as np
import pytest

import hurray_interop.core.hrry as hrry
from hurray_interop.core.elements import element_type
from hurray_interop.core.hrry import HrryFile, HrryWriter, load, save
from hurray_interop.core.kv import KVValue
from hurray_interop.core.model import (
    BufferHandle,
    CompositeHead,
    Descriptor,
    PerBlockAffine,
    Shard,
    RowMajor,
    Tensor,
    RULE_PARTITION,
)
from hurray_interop.errors import (
    BadMagicError,
    ChecksumError,
    FormatError,
    InconsistentError,
    OutputExistsError,
    TruncatedError,
    UnsupportedError,
    UsageError,
)

FORMAT_ERRORS = (FormatError, UnsupportedError)


def dense(et: str, shape, nbytes: int) -> Descriptor:
    return Descriptor(element_type(et), tuple(shape), (BufferHandle.cpu(nbytes),))


def rng_bytes(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


# -- the conformance file ----------------------------------------------------------------


def test_basic_hrry_matches_manifest(vectors_dir):
    manifest = json.loads((vectors_dir / "manifest.json").read_text())
    (spec,) = [f for f in manifest["files"] if f["file"] == "files/basic.hrry"]
    with HrryFile(vectors_dir / spec["file"]) as f:
        assert list(f.names) == [t["name"] for t in spec["tensors"]]
        for t in spec["tensors"]:
            tensor = f.tensor(t["name"])
            assert tensor.element_type.name == t["element_type"]
            assert tensor.element_type.tag == t["element_type_tag"]
            assert list(tensor.shape) == t["shape"]
            assert sum(len(b) for b in tensor.data) == t["data_bytes"]
        kv = f.kv
        assert list(kv) == [e["key"] for e in spec["kv"]]
        for e in spec["kv"]:
            v = kv[e["key"]]
            assert v.type == e["kind"]
            assert v.value == (e["value_string"] if e["kind"] == "string" else e["value_int"])
        # F3: the reference leaves HAS_KV_METADATA clear although a KV section exists
        assert f.header.flags == hrry.FLAG_HAS_INDEX_CRC32C


def test_basic_hrry_crc_verifies_independently(vectors_dir):
    raw = (vectors_dir / "files/basic.hrry").read_bytes()
    ioff, ilen, _, _, crc = struct.unpack_from("<QQQII", raw, len(raw) - 40)
    assert crc32c.crc32c(raw[ioff : ioff + ilen]) == crc == 0x51349F72


def test_basic_hrry_rewritten_byte_identically(vectors_dir, tmp_path):
    src = vectors_dir / "files/basic.hrry"
    tensors, kv = load(src)
    save(tmp_path / "a.hrry", tensors, kv=kv)
    assert (tmp_path / "a.hrry").read_bytes() == src.read_bytes()
    # and through the streaming writer, every buffer as 1-byte chunks
    with HrryFile(src) as f, HrryWriter(tmp_path / "b.hrry") as w:
        for name in f.names:
            w.write(name, f.descriptor(name), [(bytes([x]) for x in b) for b in f.buffers(name)])
        w.finish(f.kv)
    assert (tmp_path / "b.hrry").read_bytes() == src.read_bytes()


def test_buffers_are_zero_copy_read_only_views(vectors_dir):
    with HrryFile(vectors_dir / "files/basic.hrry") as f:
        (buf,) = f.tensor("bias").data
        assert buf.dtype == np.uint8 and not buf.flags.writeable and not buf.flags.owndata
        assert np.shares_memory(buf, f._u8)
        with pytest.raises(ValueError):
            buf[0] = 1
    assert bytes(buf) == b"\0\0\0"  # still valid after close: the mapping lives with the view


# -- a small multi-tensor file used by the hostile tests ---------------------------------------


def small_file(path, **kw):
    """Three tensors (one quantized with two buffers) and a KV section."""
    q = Descriptor(
        element_type("int8"),
        (2, 64),
        (BufferHandle.cpu(128), BufferHandle.cpu(4)),
        quantization=PerBlockAffine(axis=1, block_size=64, scale_buffer_index=1),
    )
    scales = np.array([0.5, 2.0], dtype=np.float16).tobytes()
    with HrryWriter(path, **kw) as w:
        w.write("a", dense("float32", (2, 3), 24), [rng_bytes(24, 1)])
        w.write("q", q, [rng_bytes(128, 2), scales])
        w.write("empty", dense("float32", (0, 4), 0), [b""])
        w.finish({"name": "small", "n": 3, "list": [1.5, 2.5]})
    return path


@pytest.fixture
def small(tmp_path):
    return small_file(tmp_path / "small.hrry")


def layout(raw: bytes):
    """Hand-parse trailer and index (independent of the reader under test)."""
    ioff, ilen, kvoff, kvlen, crc = struct.unpack_from("<QQQII", raw, len(raw) - 40)
    (n,) = struct.unpack_from("<Q", raw, ioff)
    p = ioff + 8
    entries = []
    for _ in range(n):
        (ln,) = struct.unpack_from("<H", raw, p)
        name = raw[p + 2 : p + 2 + ln].decode(errors="replace")
        doff, dlen, daoff, dalen, fl = struct.unpack_from("<QIQQI", raw, p + 2 + ln)
        entries.append(dict(name=name, at=p, tail=p + 2 + ln, doff=doff, dlen=dlen, daoff=daoff, dalen=dalen))
        p += 2 + ln + 32
    return dict(ioff=ioff, ilen=ilen, kvoff=kvoff, kvlen=kvlen, crc=crc, entries=entries, size=len(raw))


def refresh_crc(raw: bytearray) -> bytearray:
    ioff, ilen = struct.unpack_from("<QQ", raw, len(raw) - 40)
    struct.pack_into("<I", raw, len(raw) - 12, crc32c.crc32c(bytes(raw[ioff : ioff + ilen])))
    return raw


def test_small_file_reads_back(small):
    tensors, kv = load(small)
    assert list(tensors) == ["a", "q", "empty"]
    assert bytes(tensors["a"].data[0]) == rng_bytes(24, 1)
    assert bytes(tensors["q"].data[0]) == rng_bytes(128, 2)
    assert np.frombuffer(tensors["q"].data[1], np.float16).tolist() == [0.5, 2.0]
    assert tensors["empty"].data[0].size == 0
    assert kv == {"name": KVValue.string("small"), "n": KVValue.int64(3), "list": KVValue.array("float64", [1.5, 2.5])}
    lay = layout(small.read_bytes())
    # reference padding: q's two buffers are 4096 apart (inter-buffer padding), no padding after the last
    q = lay["entries"][1]
    assert q["dalen"] == 4096 + 4 and q["daoff"] % 4096 == 0
    assert lay["entries"][2]["doff"] == q["daoff"] + 4096 + 8  # 4 bytes of scales, then pad to 8


def hostile(small, patch, *, crc=True) -> bytes:
    raw = bytearray(small.read_bytes())
    lay = layout(bytes(raw))
    patch(raw, lay)
    if crc:
        refresh_crc(raw)
    return bytes(raw)


def _set(fmt, off_fn):
    def patch(raw, lay, value):
        struct.pack_into(fmt, raw, off_fn(lay), value)

    return patch


HOSTILE = [
    # (id, patch(raw, lay), error class, message regex, refresh the CRC after patching)
    ("bad magic", lambda r, l: r.__setitem__(slice(0, 8), b"HRRYFILX"), BadMagicError, "not a Hurray file", False),
    ("major 2", lambda r, l: r.__setitem__(8, 2), UnsupportedError, "container version 2.0", False),
    ("major 0", lambda r, l: r.__setitem__(8, 0), FormatError, "container_version_major 0", False),
    ("header reserved", lambda r, l: r.__setitem__(10, 1), FormatError, "header _reserved at offset 10", False),
    ("reserved flags", lambda r, l: struct.pack_into("<I", r, 12, 0x0C), FormatError, r"reserved file flag bits set \(0x0000000C\)", False),
    ("alignment", lambda r, l: struct.pack_into("<I", r, 16, 1000), FormatError, "1000 is not a power of two", False),
    ("alignment small", lambda r, l: struct.pack_into("<I", r, 16, 2048), FormatError, "2048 is not a power of two between 4096", False),
    ("first desc", lambda r, l: struct.pack_into("<Q", r, 20, 60), FormatError, "first_descriptor_offset", False),
    ("reserved header", lambda r, l: r.__setitem__(40, 1), FormatError, "_reserved_header at offset 36", False),
    ("trailer magic", lambda r, l: r.__setitem__(slice(-4, None), b"HRRX"), BadMagicError, "trailer magic", False),
    ("trailer reserved", lambda r, l: r.__setitem__(-6, 1), FormatError, "trailer _reserved", False),
    ("index into trailer", lambda r, l: struct.pack_into("<Q", r, len(r) - 32, l["ilen"] + 8), TruncatedError, "runs into the trailer", False),
    ("index misaligned", lambda r, l: struct.pack_into("<Q", r, len(r) - 40, l["ioff"] - 4), FormatError, "index offset .* is not 8-aligned", False),
    ("bad crc", lambda r, l: r.__setitem__(l["entries"][0]["tail"] + 30, 1), ChecksumError, "index CRC-32C is 0x", False),
    ("crc without flag", lambda r, l: struct.pack_into("<I", r, 12, 0), FormatError, "HAS_INDEX_CRC32C is clear", False),
    ("index count 2^63", lambda r, l: struct.pack_into("<Q", r, l["ioff"], 2**63), TruncatedError, "index_entry_count 9223372036854775808 cannot fit", True),
    ("index count +1", lambda r, l: struct.pack_into("<Q", r, l["ioff"], 4), TruncatedError, "index_entry_count 4 cannot fit", True),
    ("name past end", lambda r, l: struct.pack_into("<H", r, l["entries"][2]["at"], 5000), TruncatedError, "index entry 2 name", True),
    ("name length 0", lambda r, l: struct.pack_into("<H", r, l["entries"][0]["at"], 0), FormatError, "name_length must be at least 1", True),
    ("bad utf8 name", lambda r, l: r.__setitem__(l["entries"][0]["at"] + 2, 0xFF), FormatError, "not valid UTF-8", True),
    ("duplicate names", lambda r, l: r.__setitem__(l["entries"][1]["at"] + 2, ord("a")), InconsistentError, "duplicate tensor name 'a'", True),
    ("entry flags", lambda r, l: struct.pack_into("<I", r, l["entries"][1]["tail"] + 28, 1), FormatError, "index entry flags must be 0", True),
    ("desc misaligned", lambda r, l: struct.pack_into("<Q", r, l["entries"][1]["tail"], l["entries"][1]["doff"] + 4), FormatError, "descriptor offset .* is not 8-aligned", True),
    ("desc too short", lambda r, l: struct.pack_into("<I", r, l["entries"][1]["tail"] + 8, 12), FormatError, "descriptor_length 12 is below", True),
    ("data beyond file", lambda r, l: struct.pack_into("<Q", r, l["entries"][0]["tail"] + 20, 10**9), TruncatedError, "data range .* extends past", True),
    ("data misaligned", lambda r, l: struct.pack_into("<Q", r, l["entries"][0]["tail"] + 12, 4104), FormatError, "not a multiple of data_buffer_alignment", True),
    ("data over descriptor", lambda r, l: struct.pack_into("<Q", r, l["entries"][0]["tail"] + 20, 4096 + 8), InconsistentError, "overlaps", True),
    ("descriptors overlap", lambda r, l: struct.pack_into("<Q", r, l["entries"][1]["tail"], 64), InconsistentError, "descriptor of tensor .* overlaps descriptor of tensor", True),
    ("data over kv", lambda r, l: struct.pack_into("<Q", r, l["entries"][1]["tail"] + 20, l["kvoff"] - l["entries"][1]["daoff"] + 8), InconsistentError, "overlaps data of tensor 'q'", True),
    ("kv into index", lambda r, l: struct.pack_into("<I", r, len(r) - 16, l["kvlen"] + 16), InconsistentError, "overlaps KV section", False),
    ("kv misaligned", lambda r, l: struct.pack_into("<Q", r, len(r) - 24, l["kvoff"] + 4), FormatError, "KV offset .* is not 8-aligned", False),
    ("kv half", lambda r, l: struct.pack_into("<I", r, len(r) - 16, 0), InconsistentError, "both zero or both non-zero", False),
    ("kv flag without kv", lambda r, l: (struct.pack_into("<QI", r, len(r) - 24, 0, 0), struct.pack_into("<I", r, 12, 5)), InconsistentError, "HAS_KV_METADATA is set", False),
    ("index trailing", lambda r, l: struct.pack_into("<Q", r, l["ioff"], 2), InconsistentError, "unused bytes after the last index entry", True),
]


@pytest.mark.parametrize("name,patch,exc,match,crc", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_files_rejected_at_open(small, tmp_path, name, patch, exc, match, crc):
    p = tmp_path / "bad.hrry"
    p.write_bytes(hostile(small, patch, crc=crc))
    with pytest.raises(exc, match=match) as ei:
        HrryFile(p)
    assert ei.value.path == str(p) and ei.value.offset is not None


def test_hostile_kv_rejected_on_access(small, tmp_path):
    def patch(r, l):
        struct.pack_into("<I", r, l["kvoff"], 2**32 - 1)

    p = tmp_path / "bad.hrry"
    p.write_bytes(hostile(small, patch, crc=False))
    with HrryFile(p) as f:  # KV is decoded lazily
        with pytest.raises(TruncatedError, match="kv_count 4294967295 cannot fit") as ei:
            f.kv
        assert ei.value.offset == layout(p.read_bytes())["kvoff"]
    with pytest.raises(TruncatedError):
        load(p)

    q = tmp_path / "dup.hrry"
    raw = bytearray(small.read_bytes())
    lay = layout(bytes(raw))
    off = lay["kvoff"] + 4
    assert raw[off + 2 : off + 6] == b"name"
    raw[off + 2 : off + 6] = b"list"  # first key now duplicates the third
    q.write_bytes(bytes(raw))
    with HrryFile(q) as f, pytest.raises(InconsistentError, match="duplicate KV key 'list'"):
        f.kv


def test_index_descriptor_length_must_match_descriptor(small, tmp_path):
    def patch(r, l):
        e = l["entries"][0]
        struct.pack_into("<I", r, e["tail"] + 8, e["dlen"] + 8)

    p = tmp_path / "bad.hrry"
    p.write_bytes(hostile(small, patch))
    with HrryFile(p) as f:
        f.tensor("q")  # other tensors are fine
        with pytest.raises(InconsistentError, match="descriptor says its length is 61, the index says 69") as ei:
            f.descriptor("a")
        assert ei.value.offset == 64 + 6 and ei.value.tensor == "a"


def test_index_data_length_must_match_buffer_table(small, tmp_path):
    def patch(r, l):
        e = l["entries"][1]
        struct.pack_into("<Q", r, e["tail"] + 20, e["dalen"] - 1)

    p = tmp_path / "bad.hrry"
    p.write_bytes(hostile(small, patch))
    with HrryFile(p) as f, pytest.raises(InconsistentError, match="index data_length is 4099 but the buffer table needs 4100"):
        f.tensor("q")


def test_bad_parameter_values_rejected_on_read(small, tmp_path):
    raw = bytearray(small.read_bytes())
    q = layout(bytes(raw))["entries"][1]
    scale_at = q["daoff"] + 4096 + 2  # second float16 scale
    raw[scale_at : scale_at + 2] = np.array([np.inf], np.float16).tobytes()
    p = tmp_path / "bad.hrry"
    p.write_bytes(bytes(raw))
    with HrryFile(p) as f:
        f.tensor("a")
        f.descriptor("q")  # the descriptor itself is fine
        with pytest.raises(FormatError, match="block 1 is inf") as ei:
            f.tensor("q")
        assert ei.value.tensor == "q" and ei.value.offset == scale_at


def test_crc_flag_clear_and_zero_is_accepted(small, tmp_path):
    def patch(r, l):
        struct.pack_into("<I", r, 12, 0)
        struct.pack_into("<I", r, len(r) - 12, 0)

    p = tmp_path / "nocrc.hrry"
    p.write_bytes(hostile(small, patch, crc=False))
    tensors, kv = load(p)
    assert list(tensors) == ["a", "q", "empty"] and kv["n"] == KVValue.int64(3)


def test_kv_flag_set_is_accepted(small, tmp_path):
    p = tmp_path / "kvflag.hrry"
    p.write_bytes(hostile(small, lambda r, l: struct.pack_into("<I", r, 12, 5), crc=False))
    assert load(p)[1]["name"] == KVValue.string("small")


def test_truncation_at_every_boundary(small, tmp_path):
    raw = small.read_bytes()
    lay = layout(raw)
    cuts = {0, 1, 7, 8, 9, 16, 63, 64, 65, lay["kvoff"], lay["kvoff"] + 4, lay["ioff"], lay["ioff"] + 8}
    for e in lay["entries"]:
        cuts |= {e["doff"], e["doff"] + 10, e["doff"] + e["dlen"], e["daoff"], e["daoff"] + e["dalen"]}
    cuts |= {len(raw) - k for k in (1, 4, 12, 20, 39, 40, 41)}
    p = tmp_path / "cut.hrry"
    for cut in sorted(c for c in cuts if c < len(raw)):
        p.write_bytes(raw[:cut])
        with pytest.raises(FORMAT_ERRORS):
            load(p)


def _all_checked(p) -> None:
    tensors, kv = load(p)
    for t in tensors.values():
        for b, h in zip(t.data, t.descriptor.buffers):
            assert b.size == h.byte_size


def composite_file(path):
    """A composite (partition head + 2 members) between two plain tensors, plus KV."""
    head, m0, m1 = partition()
    with HrryWriter(path) as w:
        w.write("x", dense("int4", (2, 8), 8), [rng_bytes(8, 3)])
        w.write_composite("c", head, [("c.0", m0, [rng_bytes(32, 1)]), ("c.1", m1, [rng_bytes(32, 2)])])
        w.write("s", dense("float16", (), 2), [b"\0<"])
        w.finish({"k": KVValue.uint64(7), "arr": ["a", "b"], "flag": False})
    return path


@pytest.mark.parametrize("build", [small_file, composite_file])
def test_random_byte_flips_raise_only_project_errors(build, tmp_path):
    """Seeded mutants: each either loads consistently or raises a FormatError (or UnsupportedError).

    Flips target the bytes that carry structure (header, descriptors, KV,
    index, trailer); index mutants get their CRC recomputed half the time so
    that the index parser itself is exercised.
    """
    raw = build(tmp_path / "orig.hrry").read_bytes()
    lay = layout(raw)
    regions = [range(0, 64), range(lay["kvoff"], lay["kvoff"] + lay["kvlen"]), range(lay["ioff"], len(raw))]
    regions += [range(e["doff"], e["doff"] + e["dlen"]) for e in lay["entries"]]
    positions = [p for r in regions for p in r]
    rnd = random.Random(1234)
    p = tmp_path / "m.hrry"
    outcomes = {"ok": 0, "err": 0}
    for i in range(300):
        m = bytearray(raw)
        for _ in range(rnd.choice((1, 1, 2, 3))):
            at = rnd.choice(positions)
            m[at] = m[at] ^ (1 << rnd.randrange(8)) if rnd.random() < 0.7 else rnd.randrange(256)
        if i % 2:
            refresh_crc(m) if _index_intact(m) else None
        p.write_bytes(bytes(m))
        try:
            _all_checked(p)
            outcomes["ok"] += 1
        except FORMAT_ERRORS:
            outcomes["err"] += 1
    assert outcomes["err"] > 100 and outcomes["ok"] > 0, outcomes


def _index_intact(m: bytearray) -> bool:
    try:
        ioff, ilen = struct.unpack_from("<QQ", m, len(m) - 40)
        return ioff + ilen <= len(m) - 40
    except struct.error:  # pragma: no cover
        return False


# -- laziness -----------------------------------------------------------------------------------


def test_open_touches_only_the_index(tmp_path, monkeypatch):
    """10,000 tensors: opening decodes no descriptor; a corrupt, never-read descriptor is harmless."""
    n = 10_000
    d = dense("float32", (0,), 0)  # empty tensors: each takes one aligned slot
    p = tmp_path / "many.hrry"
    with HrryWriter(p, tensor_count_hint=n) as w:
        for i in range(n):
            w.write(f"t{i}", d, [b""])
        w.finish()
    raw = bytearray(p.read_bytes())
    victim = layout(bytes(raw))["entries"][7777]
    raw[victim["doff"] + 14] = 0xEE  # reserved element type tag
    p.write_bytes(bytes(raw))

    calls = []
    real = hrry.decode_descriptor
    monkeypatch.setattr(hrry, "decode_descriptor", lambda *a, **k: calls.append(1) or real(*a, **k))
    f = HrryFile(p)
    assert calls == [] and len(f) == n and f.header.tensor_count_hint == n  # opening decodes no descriptor
    assert f.tensor("t5").shape == (0,) and calls == [1]
    with pytest.raises(FormatError) as ei:
        f.descriptor("t7777")
    assert ei.value.offset == victim["doff"] + 14 and ei.value.tensor == "t7777"
    f.close()


# -- the writer -----------------------------------------------------------------------------


def test_streaming_chunks_equal_whole_buffers(tmp_path):
    data = rng_bytes(10_000, 5)
    d = dense("uint8", (10_000,), 10_000)
    save(tmp_path / "whole.hrry", [Tensor("x", d, (np.frombuffer(data, np.uint8),))])
    chunks = (data[i : i + 777] for i in range(0, len(data), 777))
    with HrryWriter(tmp_path / "chunks.hrry") as w:
        w.write("x", d, [chunks])
        w.finish()
    assert (tmp_path / "chunks.hrry").read_bytes() == (tmp_path / "whole.hrry").read_bytes()
    # numpy arrays of any dtype are written as their bytes
    with HrryWriter(tmp_path / "np.hrry") as w:
        w.write("x", d, [np.frombuffer(data, np.uint32).reshape(50, 50)])
        w.finish()
    assert (tmp_path / "np.hrry").read_bytes() == (tmp_path / "whole.hrry").read_bytes()


def test_failing_generator_leaves_nothing(tmp_path):
    def gen():
        yield b"\0" * 100
        raise RuntimeError("source died")

    p = tmp_path / "out.hrry"
    with pytest.raises(RuntimeError, match="source died"):
        with HrryWriter(p) as w:
            w.write("x", dense("uint8", (200,), 200), [gen()])
            w.finish()
    assert list(tmp_path.iterdir()) == []
    p.write_bytes(b"precious")
    with pytest.raises(RuntimeError, match="source died"):
        with HrryWriter(p, force=True) as w:
            w.write("x", dense("uint8", (200,), 200), [gen()])
            w.finish()
    assert p.read_bytes() == b"precious"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.hrry"]


def test_existing_output_refused_without_force(small):
    before = small.read_bytes()
    with pytest.raises(OutputExistsError, match="output exists"):
        save(small, [])
    assert small.read_bytes() == before


@pytest.mark.parametrize(
    "bufs,match",
    [
        ([b"\0" * 7], "buffer 0 has 7 bytes, the descriptor declares 8"),
        ([b"\0" * 9], "more than the declared 8 bytes"),
        ([iter([b"\0" * 4, b"\0" * 5])], "more than the declared 8 bytes"),
        ([[1, 2]], "bytes-like"),
        ([b"\0" * 8, b""], "2 buffers given, the descriptor declares 1"),
        (b"\0" * 8, "one entry per buffer"),
    ],
)
def test_size_mismatches_refused(tmp_path, bufs, match):
    p = tmp_path / "o.hrry"
    with pytest.raises(UsageError, match=match):
        with HrryWriter(p) as w:
            w.write("x", dense("uint8", (8,), 8), bufs)
            w.finish()
    assert not p.exists()


def test_writer_refusals(tmp_path):
    p = tmp_path / "o.hrry"
    with pytest.raises(UsageError, match="duplicate tensor name"):
        with HrryWriter(p) as w:
            w.write("x", dense("uint8", (1,), 1), [b"\0"])
            w.write("x", dense("uint8", (1,), 1), [b"\0"])
    with pytest.raises(UsageError, match=r"finish\(\) was not called"):
        with HrryWriter(p) as w:
            w.write("x", dense("uint8", (1,), 1), [b"\0"])
    with pytest.raises(UsageError, match="tensor_count_hint was 2 but 1"):
        with HrryWriter(p, tensor_count_hint=2) as w:
            w.write("x", dense("uint8", (1,), 1), [b"\0"])
            w.finish()
    with pytest.raises(UsageError, match="alignment must be a power of two"):
        HrryWriter(p, alignment=1000)
    with pytest.raises(FormatError):  # encode_descriptor validates: 3 bytes cannot hold float32 [1]
        with HrryWriter(p) as w:
            w.write("x", dense("float32", (1,), 3), [b"\0" * 3])
    bad_scales = np.array([0.0, 1.0], np.float16).tobytes()
    q = Descriptor(element_type("int8"), (2, 64), (BufferHandle.cpu(128), BufferHandle.cpu(4)),
                   quantization=PerBlockAffine(axis=1, block_size=64, scale_buffer_index=1))
    with pytest.raises(FormatError):  # zero scale
        with HrryWriter(p) as w:
            w.write("q", q, [bytes(128), bad_scales])
    assert list(tmp_path.iterdir()) == []


def test_header_options_and_sorted_index(tmp_path):
    p = tmp_path / "s.hrry"
    with HrryWriter(p, alignment=8192, tensor_count_hint=3, sorted_index=True) as w:
        for name in ("zeta", "alpha", "Mid"):
            w.write(name, dense("uint8", (3,), 3), [name[:3].encode()])
        w.finish()
    raw = p.read_bytes()
    flags, align, first, hint = struct.unpack_from("<IIQQ", raw, 12)
    assert (flags, align, first, hint) == (0x6, 8192, 64, 3)
    with HrryFile(p) as f:
        assert f.names == ("Mid", "alpha", "zeta")  # UTF-8 byte order
        assert f.descriptor_order() == ("zeta", "alpha", "Mid")
        assert [e.data_offset % 8192 for e in f.entries] == [0, 0, 0]
        assert bytes(f.tensor("alpha").data[0]) == b"alp"
    # an index claiming SORTED_INDEX that is not sorted is rejected
    lay = layout(raw)
    m = bytearray(raw)
    first_entry = lay["entries"][0]
    m[first_entry["at"] + 2 : first_entry["at"] + 5] = b"zzz"  # "Mid" -> "zzz" sorts last
    refresh_crc(m)
    p.write_bytes(bytes(m))
    with pytest.raises(InconsistentError, match="SORTED_INDEX is set but 'alpha' follows 'zzz'"):
        HrryFile(p)


def partition(shape=(4, 4)):
    head = Descriptor(element_type("float32"), shape, (), layout=CompositeHead(RULE_PARTITION, 0, 2))
    half = (shape[0] // 2, shape[1])
    m0 = Descriptor(element_type("float32"), half, (BufferHandle.cpu(4 * half[0] * half[1]),), shard=Shard(shape, (0, 0)))
    m1 = Descriptor(element_type("float32"), half, (BufferHandle.cpu(4 * half[0] * half[1]),), shard=Shard(shape, (half[0], 0)))
    return head, m0, m1


def test_composite_round_trip_and_reference_padding(tmp_path):
    head, m0, m1 = partition()
    p = tmp_path / "c.hrry"
    with HrryWriter(p) as w:
        w.write("x", dense("uint8", (1,), 1), [b"\1"])
        w.write_composite("c", head, [("c.0", m0, [rng_bytes(32, 1)]), ("c.1", m1, [rng_bytes(32, 2)])])
        w.finish()
    with HrryFile(p) as f:
        assert f.top_level_names() == ("x", "c")
        c = f.tensor("c")
        assert [m.name for m in c.members] == ["c.0", "c.1"]
        assert bytes(c.members[1].data[0]) == rng_bytes(32, 2)
        e = f.entry("c")
        # F2: the head (no buffers) is still padded to the data alignment
        assert e.data_length == 0 and e.data_offset % 4096 == 0 and f.entry("c.0").descriptor_offset == e.data_offset
    tensors, _ = load(p)
    assert list(tensors) == ["x", "c"]
    save(tmp_path / "c2.hrry", tensors)
    assert (tmp_path / "c2.hrry").read_bytes() == p.read_bytes()


def test_torn_and_invalid_composites(tmp_path):
    head, m0, m1 = partition()
    p = tmp_path / "c.hrry"
    with pytest.raises(UsageError, match="incomplete: 1 more members"):
        with HrryWriter(p) as w:
            w.write_composite("c", head, [("c.0", m0, [bytes(32)])])
    with pytest.raises(UsageError, match="torn composite"):
        with HrryWriter(p) as w:
            w.write("c", head)
            w.write("c.0", m0, [bytes(32)])
            w.finish()
    assert not p.exists()
    # a file whose head claims 3 members but only 2 follow (member_count is not CRC-protected)
    with HrryWriter(p) as w:
        w.write_composite("c", head, [("c.0", m0, [bytes(32)]), ("c.1", m1, [bytes(32)])])
        w.finish()
    raw = bytearray(p.read_bytes())
    struct.pack_into("<I", raw, 64 + 20 + 16 + 8 + 4, 3)  # header, shape[2], byte_offset, rule/op/reserved
    p.write_bytes(bytes(raw))
    with HrryFile(p) as f:
        with pytest.raises(InconsistentError, match="torn composite: member_count is 3") as ei:
            f.tensor("c")
        assert ei.value.offset == 64 and ei.value.tensor == "c"
    # overlapping partition members: both at offset (0, 0)
    bad1 = Descriptor(m1.element_type, m1.shape, m1.buffers, shard=Shard((4, 4), (0, 0)))
    q = tmp_path / "o.hrry"
    with HrryWriter(q) as w:
        w.write_composite("c", head, [("c.0", m0, [bytes(32)]), ("c.1", bad1, [bytes(32)])])
        w.finish()
    with HrryFile(q) as f, pytest.raises(InconsistentError, match="partition members 'c.0' and 'c.1' overlap"):
        f.tensor("c")


def test_missing_input_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        HrryFile(tmp_path / "nope.hrry")
    (tmp_path / "short").write_bytes(b"HRRYFILE" + bytes(20))
    with pytest.raises(TruncatedError, match="shorter than the minimum 112"):
        HrryFile(tmp_path / "short")
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(TruncatedError, match="empty file"):
        HrryFile(tmp_path / "empty")


def test_nested_composites_pre_order(tmp_path):
    """A group composite whose first member is itself a partition composite (pre-order members)."""
    from hurray_interop.core.model import RULE_GROUP

    head, m0, m1 = partition()
    group = Descriptor(element_type("float32"), (4, 4), (), layout=CompositeHead(RULE_GROUP, 0, 2))
    p = tmp_path / "n.hrry"
    with HrryWriter(p) as w:
        w.write_composite(
            "g",
            group,
            [("g.0", head, ()), ("g.0.0", m0, [bytes(32)]), ("g.0.1", m1, [bytes(32)]), ("g.1", dense("float32", (4, 4), 64), [bytes(64)])],
        )
        w.write("after", dense("uint8", (1,), 1), [b"\7"])
        w.finish()
    with HrryFile(p) as f:
        assert f.top_level_names() == ("g", "after")
        assert f.member_names("g") == ("g.0", "g.1")
        g = f.tensor("g")
        assert [m.name for m in g.members] == ["g.0", "g.1"]
        assert [m.name for m in g.members[0].members] == ["g.0.0", "g.0.1"]
    tensors, _ = load(p)
    assert list(tensors) == ["g", "after"]
    save(tmp_path / "n2.hrry", tensors)
    assert (tmp_path / "n2.hrry").read_bytes() == p.read_bytes()
    with pytest.raises(UsageError, match="more members than its member_count 2"):
        with HrryWriter(tmp_path / "x.hrry") as w:
            w.write_composite("c", head, [("c.0", m0, [bytes(32)]), ("c.1", m1, [bytes(32)]), ("c.2", m1, [bytes(32)])])
    with pytest.raises(UsageError, match="objects"):
        with HrryWriter(tmp_path / "x.hrry") as w:
            w.write("o", dense("uint8", (8,), 8), [np.array([None] * 8)])
    assert not (tmp_path / "x.hrry").exists()


def test_memory_stays_bounded_when_streaming_and_reading(tmp_path):
    import tracemalloc

    mib = 1 << 20
    n = 32
    d = dense("uint8", (n * mib,), n * mib)
    p = tmp_path / "big.hrry"
    tracemalloc.start()
    try:
        with HrryWriter(p) as w:
            w.write("big", d, [(bytes([i]) * mib for i in range(n))])
            w.finish()
        _, peak_write = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        with HrryFile(p) as f:
            t = f.tensor("big")
            assert t.data[0].size == n * mib and int(t.data[0][5 * mib]) == 5
        _, peak_read = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_write < 8 * mib, peak_write
    assert peak_read < 2 * mib, peak_read


def test_kv_value_streamed_from_a_scratch_file_is_written_byte_identically(tmp_path):
    """A record spooled to the writer's scratch file and streamed into the KV section gives the
    file the in-memory value gives; the scratch file is gone after finish and after abort."""
    from hurray_interop.core.kv import StreamedBytes

    data = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    desc = Descriptor(element_type=element_type("uint8"), shape=(4,), buffers=(BufferHandle.cpu(4),), layout=RowMajor())
    save(tmp_path / "memory.hrry", {"t": Tensor("t", desc, (b"abcd",))}, kv={"p": 1, "rec": KVValue.bytes(data)})
    with HrryWriter(tmp_path / "streamed.hrry") as w:
        f = w.scratch("records")
        assert w.scratch("records") is f
        f.write(b"x" + data)
        w.write("t", desc, [b"abcd"])
        w.finish(kv={"p": 1, "rec": StreamedBytes(f, 1, len(data))})
    assert f.closed
    assert (tmp_path / "streamed.hrry").read_bytes() == (tmp_path / "memory.hrry").read_bytes()
    with HrryFile(tmp_path / "streamed.hrry") as hf:
        assert hf.kv["rec"].value == data
    w = HrryWriter(tmp_path / "aborted.hrry")
    g = w.scratch("x")
    w.abort()
    assert g.closed and not (tmp_path / "aborted.hrry").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.hrry", "streamed.hrry"]


def test_kv_value_streamed_from_a_file_without_descriptor_is_read_in_chunks(tmp_path):
    """The kernel copy needs a file descriptor; a value streamed from an in-memory file is
    read and written in chunks instead -- the same bytes."""
    import io

    from hurray_interop.core.kv import StreamedBytes

    data = np.random.default_rng(2).integers(0, 256, (1 << 20) + 7, dtype=np.uint8).tobytes()
    desc = Descriptor(element_type=element_type("uint8"), shape=(4,), buffers=(BufferHandle.cpu(4),), layout=RowMajor())
    save(tmp_path / "memory.hrry", {"t": Tensor("t", desc, (b"abcd",))}, kv={"rec": KVValue.bytes(data)})
    with HrryWriter(tmp_path / "streamed.hrry") as w:
        w.write("t", desc, [b"abcd"])
        w.finish(kv={"rec": StreamedBytes(io.BytesIO(b"yz" + data), 2, len(data))})
    assert (tmp_path / "streamed.hrry").read_bytes() == (tmp_path / "memory.hrry").read_bytes()
