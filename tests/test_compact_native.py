"""Q4_1, Q5_1 and Q5_0 in their compact exact forms (docs/conversion-rules.md § 11; issue #22).

The import writes a uint4 base of the low code bits, a 5th-bit plane (scale 16·d) and a
broadcast minimum (one code byte, a scale per block; blocks whose minimum is ±0 flipped and
recorded), or the per-element form of §§ 2/3a where a block needs it.  Checked here against
independent oracles: gguf-py's ``gguf.quants.dequantize`` (float32 bits, ±0 counted), a numpy
decoder written below that reads the members' bytes as pyhurray 0.1.0 loads them (the
broadcast member through its zero strides, ``as_strided``), the source GGUF's bytes (round
trips), and ggml's block layout written by hand."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize
from gguf_factory import write_gguf_raw

import hurray_interop
import hurray_interop.errors
from hurray_interop.cli import main
from hurray_interop.conversions.gguf import COMPACT_TEXT, gguf_to_hurray, hurray_to_gguf, plan_gguf
from hurray_interop.core.hrry import HrryFile, HrryWriter
from hurray_interop.core.model import BufferHandle, Tensor
from hurray_interop.core.kv import KVValue
from hurray_interop.core.records import encode_scale_record, scale_record_key

QMAX = {"Q4_1": 15, "Q5_1": 31}
NATIVE = ("Q4_1", "Q5_1", "Q5_0")
#: member suffixes and storages of each compact form, in emission order
FORMS = {
    "Q4_1": [(".base", "uint4"), (".min", "uint8")],
    "Q5_1": [(".base", "uint4"), (".hi", "uint2"), (".min", "uint8")],
    "Q5_0": [(".base", "uint4"), (".hi", "int2")],
}


# ---------------------------------------------------------------------------
# GGML blocks by hand (ggml's layout: d, [m], [qh: bit j = bit 4 of element j], qs split halves)

def ggml_blocks(t: str, d, m, q) -> np.ndarray:
    q = np.asarray(q, np.uint8).reshape(-1, 32)
    n = q.shape[0]
    parts = [np.asarray(d, np.float16).reshape(n, 1).view(np.uint8)]
    if t in QMAX:
        parts.append(np.asarray(m, np.float16).reshape(n, 1).view(np.uint8))
    if t != "Q4_1":
        bits = ((q >> 4) & 1).astype(np.uint32) << np.arange(32, dtype=np.uint32)
        parts.append(bits.sum(axis=1, dtype=np.uint32).astype("<u4").reshape(n, 1).view(np.uint8))
    parts.append((q[:, :16] & 15) | ((q[:, 16:] & 15) << 4))
    return np.concatenate(parts, axis=1).astype(np.uint8)


def _codes(rng: np.random.Generator, t: str, n: int) -> np.ndarray:
    return rng.integers(0, 16 if t == "Q4_1" else 32, (n, 32)).astype(np.uint8)


SUB = float(np.float16(2.0**-20))  # subnormal float16
#: blocks every compact form holds: (d, m, codes: "rand" | "zero")
COMPACT_BLOCKS = [
    (0.5, 0.25, "rand"), (0.5, 0.0, "rand"), (0.5, -0.0, "rand"),  # m = ±0, d > 0: flipped
    (0.0, 0.0, "zero"), (0.0, -0.0, "zero"), (0.0, 0.75, "zero"), (-0.0, 0.75, "zero"),  # d = ±0
    (SUB, 0.0, "rand"), (SUB, 0.125, "rand"), (-0.25, 1.5, "rand"),
    (4094.0, 3.0, "rand"), (-4094.0, 3.0, "rand"),  # 16·d = ±65504: the largest exact plane scale
]
#: one block that keeps its tensor in the per-element form, per type it applies to
PER_ELEMENT = {
    "d < 0, m = +0": ((-0.5, 0.0), ("Q4_1", "Q5_1")),
    "d < 0, m = -0": ((-0.5, -0.0), ("Q4_1", "Q5_1")),
    "d = -0, m = +0": ((-0.0, 0.0), ("Q4_1", "Q5_1")),
    "d = -0, m = -0": ((-0.0, -0.0), ("Q4_1", "Q5_1")),
    "m = 0, qmax·d not f16-exact": ((1.0009765625, 0.0), ("Q4_1", "Q5_1")),
    "d < 0, m = qmax·(-d): reads as flipped": ((-0.5, None), ("Q4_1", "Q5_1")),
    "d = 4096: 16·d overflows": ((4096.0, 1.0), ("Q5_1", "Q5_0")),
    "d = -4096": ((-4096.0, 1.0), ("Q5_1", "Q5_0")),
    "d = 4100": ((4100.0, 1.0), ("Q5_1", "Q5_0")),
}


def _tensor(rng: np.random.Generator, t: str, rows: list[tuple[float, float | None, str]]) -> np.ndarray:
    d = [r[0] for r in rows]
    m = [QMAX.get(t, 0) * -r[0] if r[1] is None else r[1] for r in rows]
    q = _codes(rng, t, len(rows))
    for i, (_, _, kind) in enumerate(rows):
        if kind == "zero":
            q[i] = 16 if t == "Q5_0" else 0  # Q5_0's zero is the code 16 (q − 16 = 0)
    return ggml_blocks(t, d, m, q)


@pytest.fixture(scope="module")
def edge_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Per type: ``<T>.compact`` (the blocks every compact form holds, 2 rows of 6 blocks
    plus rows of random blocks) and one ``<T>.<case>`` tensor per per-element case."""
    rng = np.random.default_rng(22)
    tensors = []
    for t in NATIVE:
        rows = [r for r in COMPACT_BLOCKS if t in QMAX or r[0] != 0 or r[2] == "zero"]
        rows += [(float(np.float16(rng.uniform(0.001, 0.1))), float(np.float16(rng.uniform(-1, 1))), "rand")
                 for _ in range(-len(rows) % 4 + 8)]
        tensors.append((f"{t}.compact", t, (len(rows) // 4, 128), _tensor(rng, t, rows)))
        for case, ((d, m), types) in PER_ELEMENT.items():
            if t in types:
                rows = [(0.5, 0.25, "rand")] * 3 + [(d, m, "zero" if d == 0 else "rand")]
                tensors.append((f"{t}.{case}", t, (1, 128), _tensor(rng, t, rows)))
    return write_gguf_raw(tmp_path_factory.mktemp("edge") / "edge.gguf", tensors)


def _sources(*paths: Path) -> list[tuple[Path, str, str, np.ndarray]]:
    """(file, tensor, type, gguf-py's float32 values) of every Q4_1/Q5_1/Q5_0 tensor."""
    out = []
    for p in paths:
        for t in GGUFReader(str(p)).tensors:
            if t.tensor_type.name in NATIVE:
                out.append((p, t.name, t.tensor_type.name, gguf_dequantize(t.data, t.tensor_type).astype(np.float32)))
    return out


@pytest.fixture(scope="module")
def imported(edge_gguf: Path, fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Path]:
    d = tmp_path_factory.mktemp("imp")
    out = {}
    for src in (edge_gguf, fixtures_dir / "tiny-llama.gguf", fixtures_dir / "tiny-llama-kquant.gguf"):
        out[src] = d / (src.stem + ".hrry")
        gguf_to_hurray(src, out[src], fallback="exact" if "kquant" in src.name else None)
    return out


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).reshape(-1).view(np.uint32)


# ---------------------------------------------------------------------------
# the forms written, the values

def _is_compact(case: str) -> bool:
    return case == "compact" or case not in PER_ELEMENT


def test_the_import_writes_the_compact_form_where_it_is_exact(edge_gguf: Path, imported: dict[Path, Path]) -> None:
    with HrryFile(imported[edge_gguf]) as hf:
        for _, name, t, _ in _sources(edge_gguf):
            members = [(m.name, m.descriptor.element_type.name) for m in hf.tensor(name).members]
            case = name.split(".", 1)[1]
            if _is_compact(case):
                assert members == [(name + s, e) for s, e in FORMS[t]], name
            else:  # today's per-element forms: the § 3a overlay, Q5_0 as int8
                assert members == ([(name + ".base", "uint8" if t == "Q5_1" else "uint4"), (name + ".min", "uint2")]
                                   if t in QMAX else []), name
    rep = {r.name: r for r in plan_gguf(edge_gguf).tensors}
    for name, r in rep.items():
        case = name.split(".", 1)[1]
        assert r.mapping.startswith(COMPACT_TEXT) == _is_compact(case), (name, r.mapping)
        if not _is_compact(case):
            assert "compact form not exact: block 3: " in r.mapping, r.mapping


def test_all_zero_rows_of_tiny_llama_are_flipped_not_the_old_form(fixtures_dir: Path,
                                                                  imported: dict[Path, Path]) -> None:
    hrry = imported[fixtures_dir / "tiny-llama.gguf"]
    with HrryFile(hrry) as hf:
        for name in ("blk.0.attn_v.weight", "blk.0.ffn_gate.weight"):  # Q4_1, Q5_1: row 0 is d = m = 0
            t = hf.tensor(name)
            assert t.members[-1].descriptor.layout.strides == (0, 0)
            base, mn = t.members[0], t.members[-1]
            b, v = base.data[1].view("<f2"), mn.data[1].view("<f2")
            qmax = 15 if "attn_v" in name else 31
            flipped = (b < 0) & (v == -b * np.float16(qmax))  # told by the scales (gguf_compact.flipped)
            row = t.descriptor.shape[-1] // 32
            assert flipped[:row].all() and flipped.sum() >= row  # at least the blocks of the zero row
            assert scale_record_key(name + ".min") not in hf.kv  # their minimums are +0: nothing to record


@pytest.mark.parametrize("which", ["edge", "tiny-llama", "tiny-llama-kquant"])
def test_values_are_gguf_pys_bit_for_bit(which: str, edge_gguf: Path, fixtures_dir: Path,
                                         imported: dict[Path, Path]) -> None:
    src = edge_gguf if which == "edge" else fixtures_dir / f"{which}.gguf"
    found = _sources(src)
    assert found
    with hurray_interop.open(imported[src]) as hf:
        for _, name, _, want in found:
            got = hurray_interop.dequantize(hf.tensor(name))
            assert np.array_equal(_bits(got), _bits(want)), name


# ---------------------------------------------------------------------------
# an independent decoder over the bytes pyhurray 0.1.0 loads

def _unpack(raw: np.ndarray, bits: int, signed: bool, n: int) -> np.ndarray:
    """LSB-first sub-byte codes (format-notes § 2.4), sign-extended when ``signed``."""
    per = 8 // bits
    v = ((raw[:, None] >> (bits * np.arange(per, dtype=np.uint8))) & ((1 << bits) - 1)).reshape(-1)[:n].astype(np.int16)
    return np.where(v >= 1 << (bits - 1), v - (1 << bits), v) if signed else v


def _member_values(m, shape: tuple[int, ...]) -> np.ndarray:
    """float32 ``scale_b · code`` of a pyhurray member, decoded here (the codes through its strides)."""
    n = int(np.prod(shape))
    raw = np.asarray(m.buffer(0)).astype(np.uint8)
    scales = np.asarray(m.buffer(1)).astype(np.uint8).view("<f2").astype(np.float32)
    name = m.dtype.name
    if name == "uint8":
        strides = tuple(m.layout.strides)
        assert strides == (0,) * len(shape) and raw.size == 1  # the broadcast minimum: one code byte
        codes = np.lib.stride_tricks.as_strided(raw, shape=shape, strides=strides).astype(np.float32)
    else:
        bits = int(name[-1])
        codes = _unpack(raw, bits, name.startswith("int"), n).astype(np.float32).reshape(shape)
    k = m.quantization.block_size
    return (codes.reshape(-1, k) * scales[:, None]).astype(np.float32).reshape(shape)


@pytest.mark.parametrize("which", ["edge", "tiny-llama"])
def test_pyhurray_loads_the_files_and_an_independent_decoder_reads_them(which: str, edge_gguf: Path,
                                                                          fixtures_dir: Path,
                                                                          imported: dict[Path, Path]) -> None:
    hurray = pytest.importorskip("hurray")
    src = edge_gguf if which == "edge" else fixtures_dir / "tiny-llama.gguf"
    loaded = hurray.load(str(imported[src]))
    checked = 0
    for _, name, t, want in _sources(src):
        theirs = loaded[name]
        if not isinstance(theirs, hurray.Composite) or len(theirs.members) != len(FORMS[t]):
            continue  # a per-element form (checked by the suites of §§ 3a, 2)
        if [m.dtype.name for m in theirs.members] != [e for _, e in FORMS[t]]:
            continue
        shape = tuple(theirs.shape)
        total = _member_values(theirs.members[0], shape)  # the base, then the corrections in emission order
        for m in theirs.members[1:]:
            total = (total + _member_values(m, shape)).astype(np.float32)
        assert np.array_equal(_bits(total), _bits(want)), name
        checked += 1
    assert checked >= (3 if which == "edge" else 6)


# ---------------------------------------------------------------------------
# export: round trips, verify, the legacy files

@pytest.mark.parametrize("which", ["edge", "tiny-llama", "tiny-llama-kquant"])
def test_round_trip_is_byte_identical_and_verify_passes(which: str, edge_gguf: Path, fixtures_dir: Path,
                                                         imported: dict[Path, Path], tmp_path: Path) -> None:
    src = edge_gguf if which == "edge" else fixtures_dir / f"{which}.gguf"
    back = tmp_path / "back.gguf"
    hurray_to_gguf(imported[src], back)
    assert back.read_bytes() == src.read_bytes()
    opts = {"fallback": "exact"} if "kquant" in which else {}
    result = hurray_interop.verify(src, imported[src], **opts)
    assert result.ok and result.file_bytes_equal, (result.error, result.problems)
    roundtrip = hurray_interop.verify(src, **opts)  # GGUF → Hurray → GGUF in memory
    assert roundtrip.ok, (roundtrip.error, roundtrip.problems)


def test_a_legacy_file_still_exports_identically(fixtures_dir: Path, tmp_path: Path) -> None:
    back = tmp_path / "back.gguf"
    hurray_to_gguf(fixtures_dir / "legacy" / "tiny-llama.hrry", back)
    assert back.read_bytes() == (fixtures_dir / "tiny-llama.gguf").read_bytes()


def test_the_report_says_the_bits_per_weight(fixtures_dir: Path) -> None:
    rep = plan_gguf(fixtures_dir / "tiny-llama.gguf")
    by = {t.name: t.mapping for t in rep.tensors}
    assert "GGUF 5 → 5.00" in by["blk.0.attn_v.weight"]  # Q4_1
    assert "GGUF 6 → 7.50" in by["blk.0.ffn_gate.weight"]  # Q5_1
    assert "GGUF 5.5 → 7 bits" in by["blk.0.attn_output.weight"]  # Q5_0
    note = next(n for n in rep.form_notes if "compact exact forms" in n)
    assert "Q4_1 5 → 5" in note and "Q5_1 6 → 7.5" in note and "Q5_0 5.5 → 7" in note and "7, 8.5, 11" in note


def test_inspect_shows_the_members(imported: dict[Path, Path], fixtures_dir: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(imported[fixtures_dir / "tiny-llama.gguf"])]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("blk.0.ffn_gate.weight")}
    assert "composite overlay(add) x3" in rows["blk.0.ffn_gate.weight"]
    assert "uint4" in rows["blk.0.ffn_gate.weight.base"] and "uint2" in rows["blk.0.ffn_gate.weight.hi"]
    assert "strided [0, 0]" in rows["blk.0.ffn_gate.weight.min"]  # the broadcast minimum, 513 bytes
    assert rows["blk.0.ffn_gate.weight.min"].split()[-1] == "513"


# ---------------------------------------------------------------------------
# hostile files: one located error, exit 2, no output

def _rewrite(src: Path, dst: Path, member: str, edit) -> Path:
    """Copy ``src`` with the member ``member`` of its composite replaced by ``edit(tensor)``."""
    with HrryFile(src) as hf, HrryWriter(dst) as w:
        for n in hf.top_level_names():
            t = hf.tensor(n)
            if t.descriptor.is_composite and any(m.name == member for m in t.members):
                members = [edit(m) if m.name == member else m for m in t.members]
                w.write_composite(n, t.descriptor, [(m.name, m.descriptor, list(m.data)) for m in members])
            else:
                w.write_tensor(t)
        w.finish(dict(hf.kv))
    return dst


def _with_data(m: Tensor, index: int, data: np.ndarray, size: int | None = None) -> Tensor:
    import dataclasses

    data_list = [np.asarray(x).view(np.uint8).copy() for x in m.data]
    data_list[index] = data
    bufs = list(m.descriptor.buffers)
    if size is not None:
        bufs[index] = BufferHandle.cpu(size)
    desc = dataclasses.replace(m.descriptor, buffers=tuple(bufs))
    return Tensor(m.name, desc, tuple(data_list))


HOSTILE = {
    "broadcast code 2": ("blk.0.attn_v.weight.min",
                         lambda m: _with_data(m, 0, np.array([2], np.uint8)), "not the code 1"),
    "plane scale not 16·d": ("blk.0.attn_output.weight.hi",
                             lambda m: _with_data(m, 1, (np.asarray(m.data[1]).view("<f2") * np.float16(2)).view(np.uint8)),
                             "is not 16·d"),
}


def _short_scales(src: Path, dst: Path, member: str) -> Path:
    """Copy ``src`` with the declared size of ``member``'s scale buffer 2 bytes short (on disk:
    our writer refuses to write such a descriptor)."""
    with HrryFile(src) as hf:
        e, size = hf.entry(member), hf.descriptor(member).buffers[1].byte_size
    raw = bytearray(src.read_bytes())
    desc = raw[e.descriptor_offset : e.descriptor_offset + e.descriptor_length]
    at = desc.find(struct.pack("<Q", size))
    assert at > 0 and desc.find(struct.pack("<Q", size), at + 1) < 0
    raw[e.descriptor_offset + at : e.descriptor_offset + at + 8] = struct.pack("<Q", size - 2)
    dst.write_bytes(bytes(raw))
    return dst


@pytest.mark.parametrize("case", [*sorted(HOSTILE), "broadcast scale buffer short"])
def test_a_hostile_compact_member_is_one_located_error(case: str, fixtures_dir: Path, imported: dict[Path, Path],
                                                       tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = imported[fixtures_dir / "tiny-llama.gguf"]
    if case in HOSTILE:
        member, edit, says = HOSTILE[case]
        bad = _rewrite(src, tmp_path / "bad.hrry", member, edit)
    else:
        member, says = "blk.0.ffn_gate.weight.min", "buffer"
        bad = _short_scales(src, tmp_path / "bad.hrry", member)
    out = tmp_path / "o.gguf"
    capsys.readouterr()
    assert main(["convert", str(bad), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and member.rsplit(".", 1)[0] in err and says in err, err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("block, minimum, says", [
    (5, -0.0, "is recorded as flipped but its scales are not"),  # a block of row 2: not flipped
    (0, 0.0, "recorded minimum is +0"),
    (0, 0.5, "is not ±0"),
])
def test_a_minimum_record_that_contradicts_the_scales_is_a_located_error(
        fixtures_dir: Path, imported: dict[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        block: int, minimum: float, says: str) -> None:
    """A flipped block is told by its scales; the minimum's record names the flipped blocks whose
    minimum is −0 (ggml's all-zero blocks have +0: no record), and nothing else."""
    src = imported[fixtures_dir / "tiny-llama.gguf"]
    key = scale_record_key("blk.0.attn_v.weight.min")
    with HrryFile(src) as hf:
        t = hf.tensor("blk.0.attn_v.weight")
        assert block >= t.descriptor.shape[-1] // 32 or not says.startswith("is recorded")  # (not of the zero row)
        assert t.members[0].data[1].view("<f2")[block] > 0 or not says.startswith("is recorded")
    rec = KVValue("bytes", encode_scale_record(np.array([block]), np.array([minimum], np.float16)))
    with HrryFile(src) as hf, HrryWriter(tmp_path / "bad.hrry") as w:
        for n in hf.top_level_names():
            w.write_tensor(hf.tensor(n))
        w.finish({**hf.kv, key: rec})
    out = tmp_path / "o.gguf"
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "bad.hrry"), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and key in err and f"block {block}" in err, err
    assert not out.exists()


def test_a_flipped_block_with_a_minus_zero_minimum_round_trips(tmp_path: Path) -> None:
    """A block d = +0, m = −0 is flipped and its −0 recorded; the export writes it back."""
    blocks = np.zeros((4, 20), np.uint8)
    blocks[:, 0:2] = np.array([0.0, 0.5, 0.25, 0.0], np.float16).view(np.uint8).reshape(4, 2)
    blocks[:, 2:4] = np.array([-0.0, -1.0, -2.0, 0.0], np.float16).view(np.uint8).reshape(4, 2)
    blocks[1:3, 4:] = 0x5A
    src = write_gguf_raw(tmp_path / "m.gguf", [("w", "Q4_1", (2, 64), blocks)])
    out = tmp_path / "m.hrry"
    gguf_to_hurray(src, out)
    with HrryFile(out) as hf:
        from hurray_interop.core.records import decode_scale_record
        idx, orig = decode_scale_record(hf.kv[scale_record_key("w.min")].value, key="k")
        assert idx.tolist() == [0] and np.signbit(orig.view(np.float16)).all()
    hurray_to_gguf(out, tmp_path / "back.gguf")
    assert (tmp_path / "back.gguf").read_bytes() == Path(src).read_bytes()


def test_members_out_of_order_are_refused(fixtures_dir: Path, imported: dict[Path, Path], tmp_path: Path) -> None:
    src = imported[fixtures_dir / "tiny-llama.gguf"]
    name = "blk.0.ffn_gate.weight"
    with HrryFile(src) as hf, HrryWriter(tmp_path / "bad.hrry") as w:
        for n in hf.top_level_names():
            t = hf.tensor(n)
            if n == name:
                m = t.members
                w.write_composite(n, t.descriptor, [(x.name, x.descriptor, list(x.data)) for x in (m[0], m[2], m[1])])
            else:
                w.write_tensor(t)
        w.finish(dict(hf.kv))
    with pytest.raises(hurray_interop.errors.ConversionRefused) as e:
        hurray_to_gguf(tmp_path / "bad.hrry", tmp_path / "o.gguf")
    assert [(n, r.split(":")[0]) for n, _, r in e.value.reasons] == [(name, f"compact overlay members {[m.name for m in (m[0], m[2], m[1])]}")]
    assert not (tmp_path / "o.gguf").exists()


def _without_member(src: Path, dst: Path, name: str, drop: str) -> Path:
    import dataclasses

    with HrryFile(src) as hf, HrryWriter(dst) as w:
        for n in hf.top_level_names():
            t = hf.tensor(n)
            if n == name:
                keep = [m for m in t.members if m.name != drop]
                head = dataclasses.replace(t.descriptor, layout=dataclasses.replace(t.descriptor.layout,
                                                                                    member_count=len(keep)))
                w.write_composite(n, head, [(m.name, m.descriptor, list(m.data)) for m in keep])
            else:
                w.write_tensor(t)
        w.finish(dict(hf.kv))
    return dst


def test_a_missing_plane_is_refused_not_exported_as_another_type(fixtures_dir: Path, imported: dict[Path, Path],
                                                                 tmp_path: Path) -> None:
    """Q5_1 without its ``.hi`` plane is a well-formed Q4_1 compact form; the import recorded Q5_1."""
    name = "blk.0.ffn_gate.weight"
    bad = _without_member(imported[fixtures_dir / "tiny-llama.gguf"], tmp_path / "bad.hrry", name, name + ".hi")
    with pytest.raises(hurray_interop.errors.ConversionRefused) as e:
        hurray_to_gguf(bad, tmp_path / "o.gguf")
    assert [(n, r) for n, _, r in e.value.reasons] == [
        (name, "the import recorded Q5_1, whose compact form these members are not (a plane or the minimum missing?); "
               "they would be Q4_1")]
    assert not (tmp_path / "o.gguf").exists()


def test_a_substituted_block_must_hold_zero_codes(fixtures_dir: Path, imported: dict[Path, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Q4_1's all-zero row 0 (d = 0 substituted, m = 0 flipped: stored codes 15); a code changed there."""
    src = imported[fixtures_dir / "tiny-llama.gguf"]
    member = "blk.0.attn_v.weight.base"
    with HrryFile(src) as hf:
        at = hf.entry(member).data_offset
        assert np.asarray(hf.tensor(member).data[0])[:16].tolist() == [0xFF] * 16  # block 0, flipped
    raw = bytearray(src.read_bytes())
    raw[at + 3] = 0xF7
    (tmp_path / "bad.hrry").write_bytes(bytes(raw))
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "bad.hrry"), str(tmp_path / "o.gguf")]) == 2
    err = capsys.readouterr().err.strip()
    assert "block 0: a substituted scale d on a block whose codes are not zero" in err and member in err, err
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("k", [1, 2, 15, 16, 31, 4096])
def test_exact_multiples_over_every_float16(k: int) -> None:
    """gguf_compact.exact_multiple (bit arithmetic for powers of two) against float32 arithmetic
    here: ``k·s`` and whether it is exact in float16, for every float16 ``s`` that is finite."""
    from hurray_interop.conversions.gguf_compact import exact_multiple

    s = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    s = s[np.isfinite(s)]
    wide = s.astype(np.float32) * np.float32(k)
    with np.errstate(over="ignore"):
        want = wide.astype(np.float16)
    want_ok = np.isfinite(want) & (want.astype(np.float32) == wide)
    got, ok = exact_multiple(s, k)
    assert np.array_equal(ok, want_ok)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
