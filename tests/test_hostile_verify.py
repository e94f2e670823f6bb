"""``verify`` on a GGUF and its .hrry with one flipped bit (issue #20's campaign).

A pair that ``verify`` passes is a promise that the .hrry exports back to the GGUF byte for
byte and that every tensor means the same values. So a single flipped bit in either file
must give exit 1 (a difference: the FAILED verdict on stdout) or 2 (a malformed file: one
line on stderr), never an internal error, unless the bit is provably meaningless:

* bytes of the .hrry outside every structure (alignment padding between the header,
  descriptors, buffers, KV section, index and trailer), which no reader looks at;
* the header's ``tensor_count_hint`` ("Readers MUST NOT rely on this field for
  correctness", Hurray file-format.md);
* a bit after which the file still means the same (:func:`_meaning`): the same KV values (e.g.
  an integer's int64/uint64 tag flipped while its value is the same) and the same tensors,
  buffer placement hints aside (``memory_class``, ``sync_mode``, device, buffer alignment:
  where a reader would put the bytes in memory, not what they are).

Every bit of a GGUF is meaningful (the export must reproduce it).
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest

from fuzzing import fuzz_count, run_cli

pytest.importorskip("gguf")


def _spans(path: Path) -> list[tuple[int, int, str]]:
    """(start, end, what) of every structure of a .hrry, each buffer on its own."""
    from hurray_interop.core.hrry import HrryFile

    with HrryFile(path) as f:
        t = f.trailer
        out = [(0, 28, "header"), (28, 36, "tensor_count_hint"), (36, 64, "header"), (t.index_offset, t.index_offset + t.index_length, "index"), (f.size - 40, f.size, "trailer")]
        if t.kv_offset:
            out.append((t.kv_offset, t.kv_offset + t.kv_length, "kv"))
        for e in f.entries:
            out.append((e.descriptor_offset, e.descriptor_offset + e.descriptor_length, f"descriptor of {e.name}"))
            offs = f.buffer_offsets(e.name)
            for i, b in enumerate(f.descriptor(e.name).buffers):
                out.append((offs[i], offs[i] + b.byte_size, f"buffer {i} of {e.name}"))
    return out


def _once_ignored(path: Path) -> dict[int, str]:
    """Bytes of the .hrry whose flip the export did not notice before issue #20's fixes
    (``hostile-fixes``), by class:

    * "float32 metadata": KV values recorded as GGUF FLOAT32 are stored as float64; a flip
      below float32's precision rounded away on export (now refused: not a float32);
    * "substitute scale": the stored substitute scale of a block whose original scale is
      recorded (all-zero blocks) was replaced by the record on export (now refused).
    """
    from hurray_interop.core.hrry import HrryFile
    from hurray_interop.core.records import SCALE_RECORD_PREFIX, decode_scale_record

    raw = path.read_bytes()
    out: dict[int, str] = {}
    with HrryFile(path) as f:
        kv = f.kv
        types = list(kv["hurray_interop.gguf.kv_types"].value) if "hurray_interop.gguf.kv_types" in kv else []
        plain = [k for k in kv if not k.startswith("hurray_interop.")]
        float32 = {k for k, ts in zip(plain, types) if ts in ("FLOAT32", "ARRAY[FLOAT32]")}
        pos = f.trailer.kv_offset + 4
        for k, v in kv.items():
            (klen,) = struct.unpack_from("<H", raw, pos)
            end = pos + 2 + klen + len(v.encode())
            if k in float32:
                out.update((i, "float32 metadata") for i in range(pos + 2 + klen + 1, end))
            pos = end
        for k, v in kv.items():
            if not k.startswith(SCALE_RECORD_PREFIX):
                continue
            name, _, idx = k[len(SCALE_RECORD_PREFIX):].partition("#")
            blocks, orig = decode_scale_record(v.value, key=k)
            at = f.buffer_offsets(name)[int(idx) if idx else 1]
            for b in blocks.tolist():
                out.update((at + b * orig.shape[1] + j, "substitute scale") for j in range(orig.shape[1]))
    return out


def _meaning(f) -> tuple:  # type: ignore[no-untyped-def]
    """What a .hrry means: KV values (as Python values, by repr), and per tensor its element type,
    shape, layout, quantization, sections, buffer sizes and bytes -- not where its buffers
    would be placed in memory (device, sync mode, memory class, buffer alignment)."""
    kv = tuple((k, repr(v.value)) for k, v in f.kv.items())  # repr: NaN equals NaN, -0.0 is not 0.0
    tensors = []
    for name in f.names:
        d = f.descriptor(name)
        data = tuple(bytes(memoryview(b).cast("B")) for b in f.tensor(name).data)
        tensors.append((name, d.element_type, d.shape, d.layout, d.byte_offset, d.quantization, d.shard, d.statistics,
                        d.extension_type, d.composite_member, tuple(b.byte_size for b in d.buffers), data))
    return kv, tuple(tensors)


def _same_meaning(original: Path, mutant: Path) -> bool:
    """The mutant means what the original means (see :func:`_meaning`)."""
    from hurray_interop.core.hrry import HrryFile

    try:
        with HrryFile(original) as a, HrryFile(mutant) as b:
            return _meaning(a) == _meaning(b)
    except Exception:  # noqa: BLE001 - a mutant that does not even open means something else
        return False


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, fixtures_dir) -> dict[str, tuple[Path, Path]]:
    from hurray_interop import convert

    d = tmp_path_factory.mktemp("pairs")
    out = {}
    for stem in ("kv-types", "tiny-llama"):
        convert(fixtures_dir / f"{stem}.gguf", d / f"{stem}.hrry")
        out[stem] = (fixtures_dir / f"{stem}.gguf", d / f"{stem}.hrry")
    return out


@pytest.mark.parametrize("stem,n,seed", [("kv-types", 60, 41), ("tiny-llama", 16, 42)])
def test_verify_with_one_flipped_bit(pairs, tmp_path, monkeypatch, stem, n, seed):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # speed only
    gguf, hrry = pairs[stem]
    graw, hraw = gguf.read_bytes(), hrry.read_bytes()
    spans = _spans(hrry)
    rng = random.Random(seed)
    mg, mh = tmp_path / "m.gguf", tmp_path / "m.hrry"
    seen = {0: 0, 1: 0, 2: 0}
    n = fuzz_count(n)
    for _ in range(n):
        in_gguf = rng.random() < 0.4
        if in_gguf:
            i = rng.randrange(len(graw))
        else:  # a structural byte of the .hrry: padding flips are meaningless by construction
            a, b, _ = rng.choice(spans)
            i = rng.randrange(a, b)
        bit = rng.randrange(8)
        raw = bytearray(graw if in_gguf else hraw)
        raw[i] ^= 1 << bit
        mg.write_bytes(bytes(raw) if in_gguf else graw)
        mh.write_bytes(hraw if in_gguf else bytes(raw))
        status, out, err = run_cli(["verify", "-q", os.fspath(mg), os.fspath(mh)])
        where = "GGUF" if in_gguf else "; ".join(s[2] for s in spans if s[0] <= i < s[1])
        assert "internal error" not in out + err and "Traceback" not in out + err, (where, i, bit, err)
        assert status in (0, 1, 2), (status, err)
        if status == 2:  # a malformed file: one line per problem on stderr, the first naming the flipped file
            lines = err.splitlines()
            assert lines and all(ln.startswith("hurray-interop: error: ") for ln in lines), err
            assert lines[0].startswith(f"hurray-interop: error: {mg if in_gguf else mh}: "), err
        if status == 1:  # a difference: the verdict on stdout, with its first difference
            assert "FAILED" in out and err == "", (out, err)
        seen[status] += 1
        if status == 0:
            assert not in_gguf, f"a flipped bit of the GGUF (byte {i}, bit {bit}) passed verify"
            if where == "tensor_count_hint":
                continue
            assert _same_meaning(hrry, mh), f"flipped bit in {where} (byte {i}, bit {bit}) passed verify"
    assert seen[1] > 0 and seen[2] > 0, seen


def test_flipped_padding_bit_of_the_hrry_is_meaningless(pairs, tmp_path):
    """The one class of bits allowed to pass: .hrry padding outside every structure (checked
    once so that the exemption above is not an assumption)."""
    gguf, hrry = pairs["kv-types"]
    raw = bytearray(hrry.read_bytes())
    covered = set()
    for a, b, _ in _spans(hrry):
        covered.update(range(a, b))
    i = next(j for j in range(len(raw)) if j not in covered)
    raw[i] ^= 0x10
    m = tmp_path / "pad.hrry"
    m.write_bytes(bytes(raw))
    status, _, err = run_cli(["verify", "-q", os.fspath(gguf), os.fspath(m)])
    assert status == 0, err


@pytest.mark.parametrize("stem", ["kv-types", "tiny-llama"])
def test_bits_the_export_once_ignored_now_fail_verify(pairs, tmp_path, stem):
    """Issue #20 (float32 metadata range; substitute-scale mismatch): a flip in a FLOAT32
    metadata value stored as float64, or in a recorded block's stored substitute scale, passed
    verify (exit 0). Sampled bytes of both classes, lowest and highest bit: exit 1 or 2."""
    gguf, hrry = pairs[stem]
    raw0 = hrry.read_bytes()
    by_class: dict[str, list[int]] = {}
    for i, what in sorted(_once_ignored(hrry).items()):
        by_class.setdefault(what, []).append(i)
    assert "float32 metadata" in by_class and (stem == "kv-types" or "substitute scale" in by_class), sorted(by_class)
    rng = random.Random(43)
    m = tmp_path / "m.hrry"
    for what, where in by_class.items():
        for i in rng.sample(where, min(6, len(where))):
            for bit in (0, 7):
                raw = bytearray(raw0)
                raw[i] ^= 1 << bit
                m.write_bytes(bytes(raw))
                status, out, err = run_cli(["verify", "-q", os.fspath(gguf), os.fspath(m)])
                assert status in (1, 2) and "internal error" not in out + err, (what, i, bit, status, out, err)
