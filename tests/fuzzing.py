"""Seeded mutation fuzzing shared by the hostile-input tests (a helper, not a test module).

* :func:`mutate` / :func:`mutants` -- deterministic mutants of a valid file: bit
  flips, random bytes, "interesting" u16/u32/u64 values (0, 1, 2**31, 2**32-1,
  2**40, 2**63, 2**64-1 ...) written over fields, truncations, deletions,
  insertions and duplicated chunks.  Positions are drawn from ``regions`` (the
  structural parts of a file: headers, descriptors, indexes) so that mutants
  exercise the parser rather than opaque tensor bytes.
* :func:`fuzz_count` -- the number of mutants per campaign: the default suite
  keeps it small; ``HURRAY_INTEROP_FUZZ=20000`` raises it for a long run.
* :func:`run_campaign` -- runs a parse-only campaign **in a child process**
  under ``RLIMIT_AS`` (its address space after imports plus a fixed budget)
  with a per-mutant ``SIGALRM`` timeout, so a claimed size that gets allocated
  surfaces as ``MemoryError`` and a hang as a timeout, instead of taking the
  test machine down.  It returns the child's JSON summary: mutants run, how many
  raised a project error, and every escape (non-project exception, hang, error
  without a file path or, for GGUF and .hrry, without a byte offset).
* ``python3 tests/fuzzing.py FORMAT FILE N SEED`` runs one campaign by hand.

Only the project's exceptions (:class:`hurray_interop.errors.HurrayInteropError`)
may escape a parser.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Callable, Iterator, Sequence

FUZZ_ENV = "HURRAY_INTEROP_FUZZ"

INTERESTING_U64 = (0, 1, 7, 8, 0x7F, 0x80, 0xFF, 4096, 2**31 - 1, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1)
INTERESTING_U32 = (0, 1, 2, 8, 9, 12, 13, 0x7F, 0xFF, 4096, 0xFFFF, 2**31 - 1, 2**31, 2**32 - 1)
INTERESTING_U16 = (0, 1, 0x7F, 0xFF, 0x100, 0x7FFF, 0xFFFF)

Region = tuple[int, int]


def fuzz_count(default: int) -> int:
    """Mutants per campaign: ``default``, or ``$HURRAY_INTEROP_FUZZ`` when set (long run)."""
    v = os.environ.get(FUZZ_ENV, "").strip()
    if not v:
        return default
    n = int(v)
    if n <= 0:
        raise ValueError(f"{FUZZ_ENV} must be a positive integer, got {v!r}")
    return n


def _pos(rng: random.Random, size: int, regions: Sequence[Region] | None, width: int = 1) -> int:
    if size <= width:
        return 0
    if regions:
        a, b = rng.choice(regions)
        a, b = max(0, min(a, size - width)), max(0, min(b, size - width))
        if b > a:
            return rng.randrange(a, b)
        return a
    return rng.randrange(0, size - width)


def mutate(data: bytes, rng: random.Random, regions: Sequence[Region] | None = None) -> bytes:
    """One deterministic mutant of ``data`` (never identical to it unless it is empty)."""
    b = bytearray(data)
    n = len(b)
    if n == 0:
        return bytes([rng.randrange(256)])
    kind = rng.randrange(10)
    if kind == 0:  # 1-4 bit flips
        for _ in range(rng.randint(1, 4)):
            i = _pos(rng, n, regions)
            b[i] ^= 1 << rng.randrange(8)
    elif kind == 1:  # random byte
        i = _pos(rng, n, regions)
        b[i] = (b[i] + rng.randrange(1, 256)) & 0xFF
    elif kind in (2, 3):  # interesting u64 (aligned half the time)
        i = _pos(rng, n, regions, 8)
        if kind == 2:
            i &= ~7
        b[i : i + 8] = struct.pack("<Q", rng.choice(INTERESTING_U64))
    elif kind == 4:  # interesting u32
        i = _pos(rng, n, regions, 4)
        b[i : i + 4] = struct.pack("<I", rng.choice(INTERESTING_U32))
    elif kind == 5:  # interesting u16
        i = _pos(rng, n, regions, 2)
        b[i : i + 2] = struct.pack("<H", rng.choice(INTERESTING_U16))
    elif kind == 6:  # truncation anywhere
        del b[rng.randrange(0, n) :]
    elif kind == 7:  # delete a few bytes
        i = _pos(rng, n, regions)
        del b[i : i + rng.randint(1, 16)]
    elif kind == 8:  # insert a few random bytes
        i = _pos(rng, n, regions)
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    else:  # copy a chunk over another place (duplicate names, repeated records)
        i = _pos(rng, n, regions)
        j = _pos(rng, n, regions)
        k = rng.randint(4, 64)
        chunk = bytes(b[i : i + k])
        b[j : j + len(chunk)] = chunk
    out = bytes(b)
    if out == data:  # e.g. a copy onto itself: flip one bit instead
        i = _pos(rng, n, regions)
        b[i] ^= 1
        out = bytes(b)
    return out


def mutants(
    data: bytes,
    n: int,
    seed: int,
    regions: Sequence[Region] | None = None,
    fixup: Callable[[bytes, random.Random], bytes] | None = None,
) -> Iterator[tuple[int, bytes]]:
    """``n`` numbered mutants of ``data`` from ``random.Random(seed)``; ``fixup`` may
    post-process some (e.g. recompute a checksum so that the mutant gets past it)."""
    rng = random.Random(seed)
    for k in range(n):
        m = mutate(data, rng, regions)
        if rng.random() < 0.15:  # stack a second mutation now and then
            m = mutate(m, rng, regions)
        if fixup is not None:
            m = fixup(m, rng)
        yield k, m


# --------------------------------------------------------------------------
# format-specific parse-only drivers (run inside the child)


def hrry_fix_crc(m: bytes, rng: random.Random) -> bytes:
    """Recompute the index CRC-32C of a mutated .hrry 60 % of the time (when the
    trailer still locates an index inside the file), so mutants reach the index parser."""
    if rng.random() >= 0.6 or len(m) < 40:
        return m
    ioff, ilen = struct.unpack_from("<QQ", m, len(m) - 40)
    if ioff + ilen > len(m) - 40:
        return m
    import crc32c

    b = bytearray(m)
    struct.pack_into("<I", b, len(b) - 12, crc32c.crc32c(bytes(b[ioff : ioff + ilen])))
    return bytes(b)


def hrry_regions(path: "str | os.PathLike[str]") -> list[Region]:
    """Structural byte ranges of a valid .hrry: header, descriptors, KV, index, trailer."""
    from hurray_interop.core.hrry import HrryFile

    with HrryFile(path) as f:
        t = f.trailer
        regions = [(0, 64), (t.index_offset, f.size)]
        if t.kv_offset:
            regions.append((t.kv_offset, t.kv_offset + t.kv_length))
        for e in f.entries:
            regions.append((e.descriptor_offset, e.descriptor_offset + e.descriptor_length))
    return regions


def gguf_regions(data: bytes) -> list[Region]:
    from hurray_interop.formats.gguf import GGUFFile

    g = GGUFFile(data)
    return [(0, g.data_offset), (g.data_offset, min(len(data), g.data_offset + 256)), (max(0, len(data) - 64), len(data))]


def safetensors_regions(data: bytes) -> list[Region]:
    (hl,) = struct.unpack_from("<Q", data, 0)
    return [(0, 8 + hl), (0, 8 + hl), (0, 8 + hl), (8 + hl, min(len(data), 8 + hl + 64))]


_HOSTILE_JSON_VALUES = (
    -1, 0, 1, 2**31, 2**32, 2**40, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**30, 1.5, float("inf"), True, None, "1", [], {}, [[1]],
)


def safetensors_json_mutant(data: bytes, rng: random.Random) -> bytes:
    """A structure-aware mutant: the JSON header re-serialized with one entry's dtype,
    shape or data_offsets replaced by a hostile value, an entry duplicated or
    renamed, a lying header length, or deep nesting; the data section is kept."""
    (hl,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8 : 8 + hl])
    names = [k for k in header if k != "__metadata__"]
    name = rng.choice(names)
    entry = dict(header[name])
    kind = rng.randrange(9)
    if kind == 0:
        entry["shape"] = [rng.choice(_HOSTILE_JSON_VALUES) for _ in range(rng.randint(0, 3))] or rng.choice(_HOSTILE_JSON_VALUES)
    elif kind == 1:
        entry["data_offsets"] = [rng.choice(_HOSTILE_JSON_VALUES), rng.choice(_HOSTILE_JSON_VALUES)]
    elif kind == 2:
        entry["dtype"] = rng.choice(["F4", "F6_E2M3", "F8_E8M0", "U8", "BOOL", "F64", "C64", "", "f32", 7, None])
    elif kind == 3:  # the entry points into a neighbour's bytes (overlap) or shifts by a few bytes (gap)
        b, e = entry["data_offsets"]
        d = rng.choice([-64, -1, 1, 8, 4096])
        entry["data_offsets"] = [b + d, e + d]
    elif kind == 4:
        entry[rng.choice(["extra", "dtype ", "Shape"])] = 1
    elif kind == 5:
        header["__metadata__"] = rng.choice([{"k": 1}, ["x"], "s", {"k": "v" * 10}, {"k": [[[]]]}])
    elif kind == 6:  # rename onto a neighbour: the JSON keeps one of the two
        header[rng.choice(names)] = entry
    elif kind == 7:  # lying header length
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        return struct.pack("<Q", rng.choice([len(raw) - 1, len(raw) + 8, 2**63, 100_000_001, 0])) + raw + data[8 + hl :]
    else:  # deep nesting inside the metadata
        depth = rng.choice([100, 5000, 200_000])
        raw = json.dumps(header).encode()[:-1] + b', "__deep__": ' + b"[" * depth + b"]" * depth + b"}"
        raw += b" " * (-len(raw) % 8)
        return struct.pack("<Q", len(raw)) + raw + data[8 + hl :]
    header[name] = entry
    raw = json.dumps(header, allow_nan=True).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data[8 + hl :]


# --------------------------------------------------------------------------
# structure-aware families (issue #20's hostile-input campaign): each takes the valid
# original and a Random and returns one mutant that moves one count, length or offset to
# or around its limit, or rewrites one header/record in a way a byte mutator rarely finds

#: deltas applied to a field's valid value: at and around its limits
_BOUNDARY_DELTAS = (-1, 1, -2, 2, -8, 8, 32, -32)


def gguf_fields(data: bytes) -> list[tuple[int, str, int]]:
    """``(offset, struct code, valid value)`` of every count, length and offset of a valid
    GGUF: the header counts, each key and string length, array counts, n_dims, each ne and
    each tensor data offset (found by the reader, then read back with struct)."""
    from hurray_interop.formats.gguf import GGUFFile, ValueType

    g = GGUFFile(data)
    out = [(8, "<Q", struct.unpack_from("<Q", data, 8)[0]), (16, "<Q", struct.unpack_from("<Q", data, 16)[0])]
    for key, at in g.kv_offsets.items():
        klen = struct.unpack_from("<Q", data, at)[0]
        out.append((at, "<Q", klen))
        vat = at + 8 + klen + 4
        vt = g.kv[key].type
        if vt == ValueType.STRING:
            out.append((vat, "<Q", struct.unpack_from("<Q", data, vat)[0]))
        elif vt == ValueType.ARRAY:
            out.append((vat + 4, "<Q", struct.unpack_from("<Q", data, vat + 4)[0]))
            if g.kv[key].element_type == ValueType.STRING and len(g.kv[key].value):
                out.append((vat + 12, "<Q", struct.unpack_from("<Q", data, vat + 12)[0]))  # first string's length
    for t in g.tensors:
        at = t.info_offset
        nlen = struct.unpack_from("<Q", data, at)[0]
        out.append((at, "<Q", nlen))
        nd_at = at + 8 + nlen
        nd = struct.unpack_from("<I", data, nd_at)[0]
        out.append((nd_at, "<I", nd))
        for j in range(nd):
            out.append((nd_at + 4 + 8 * j, "<Q", struct.unpack_from("<Q", data, nd_at + 4 + 8 * j)[0]))
        off_at = nd_at + 4 + 8 * nd + 4
        out.append((off_at, "<Q", struct.unpack_from("<Q", data, off_at)[0]))
    return out


def gguf_boundary_mutant(data: bytes, rng: random.Random, fields: list[tuple[int, str, int]] | None = None) -> bytes:
    """One field moved by a small delta (or the alignment), to 0, to twice its value or to
    the largest value of its width; or the file cut 1 byte before/after a field boundary."""
    fields = fields if fields is not None else gguf_fields(data)
    at, code, v = rng.choice(fields)
    width = struct.calcsize(code)
    if rng.random() < 0.15:  # cut at a field boundary, +-1
        cut = max(0, min(len(data) - 1, at + rng.choice([0, width]) + rng.choice([-1, 0, 1])))
        return data[:cut]
    top = (1 << (8 * width)) - 1
    new = rng.choice([v + rng.choice(_BOUNDARY_DELTAS), v + rng.choice(_BOUNDARY_DELTAS), 0, 2 * v, top, top // 2 + rng.choice([0, 1])])
    new = min(max(new, 0), top)
    if new == v:
        new = v + 1 if v < top else v - 1
    b = bytearray(data)
    struct.pack_into(code, b, at, new)
    return bytes(b)


def gguf_padding_regions(data: bytes) -> list[Region]:
    """``[start, end)`` of every padding region of a valid GGUF: before the first tensor's
    data, between tensors, and after the last (bytes no tensor holds)."""
    from hurray_interop.formats.gguf import GGUFFile

    g = GGUFFile(data)
    out, pos = [], g.metadata_end
    for t in sorted((t for t in g.tensors if t.nbytes), key=lambda t: t.data_offset):
        out.append((pos, t.data_offset))
        pos = t.data_offset + t.nbytes
    out.append((pos, len(data)))
    return [(a, b) for a, b in out if b > a]


def gguf_padding_mutant(data: bytes, rng: random.Random, regions: Sequence[Region] | None = None) -> bytes:
    """Non-zero bytes written into the padding of a valid GGUF (1-3 regions: at a region's
    first or last byte, or inside it). Legal GGUF: an import records them and the export
    writes them back, so the mutant must come back byte for byte."""
    regions = regions if regions is not None else gguf_padding_regions(data)
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        a, e = rng.choice(regions)
        at = rng.choice([a, e - 1, rng.randrange(a, e)])
        n = min(rng.randint(1, 4), e - at)
        b[at : at + n] = bytes(rng.randrange(1, 256) for _ in range(n))
    return bytes(b)


#: JSON texts a header key or value may be rewritten to (escapes decoded by json.loads)
_ESCAPED_NAMES = ('"\\ud800"', '"\\udfff"', '"x\\udc80y"', '"\\ud83d\\ude00"', '"\\u0000"', '"\\u00e9"', '"\\ufeff"',
                  '"\\"quoted\\""', '"\\\\"', '""', '"\\u0041\\u0042"')
_HUGE_NUMBERS = ("1e400", "-1e400", "1e309", "-0", "0.0", "1E2", "9" * 5000, "18446744073709551616", "-9223372036854775809", "1.5")


def safetensors_escape_mutant(data: bytes, rng: random.Random) -> bytes:
    """The JSON header rewritten as text: a tensor name or a ``__metadata__`` key/value replaced
    by an escape (lone surrogates, NUL, a pair), a name re-spelled with \\uXXXX escapes so that
    it duplicates another after unescaping, or an offset/shape number replaced by a huge,
    negative-zero or float literal. The data section is kept."""
    (hl,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8 : 8 + hl])
    names = [k for k in header if k != "__metadata__"]
    enc = {k: json.dumps(k) for k in header}
    parts = {k: json.dumps(v) for k, v in header.items()}
    kind = rng.randrange(5)
    name = rng.choice(names)
    if kind == 0:  # a name becomes an escape
        enc[name] = rng.choice(_ESCAPED_NAMES)
    elif kind == 1:  # another tensor's name, spelled with escapes: a duplicate only after unescaping
        other = rng.choice(names)
        enc[name] = '"' + "".join(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else c for c in other) + '"'
    elif kind == 2:  # metadata key or value with an escape
        meta = dict(header.get("__metadata__") or {"format": "pt"})
        k = rng.choice(list(meta))
        items = [f"{json.dumps(a)}: {json.dumps(b)}" for a, b in meta.items() if a != k]
        esc = rng.choice(_ESCAPED_NAMES)
        items.append(f"{esc}: {json.dumps(meta[k])}" if rng.random() < 0.5 else f"{json.dumps(k)}: {esc}")
        enc.setdefault("__metadata__", '"__metadata__"')
        parts["__metadata__"] = "{" + ", ".join(items) + "}"
    elif kind == 3:  # a number of data_offsets or shape replaced by a literal json.dumps never writes
        e = header[name]
        field = rng.choice(["data_offsets", "shape"]) if e["shape"] else "data_offsets"
        vals = [str(x) for x in e[field]]
        vals[rng.randrange(len(vals))] = rng.choice(_HUGE_NUMBERS)
        parts[name] = json.dumps({k: v for k, v in e.items() if k != field})[:-1] + f', "{field}": [{", ".join(vals)}]}}'
    else:  # a raw duplicate key: the same tensor twice, once escaped
        dup = '"' + "".join(f"\\u{ord(c):04x}" for c in name) + '"'
        text = "{" + ", ".join(f"{enc[k]}: {parts[k]}" for k in header) + f", {dup}: {parts[name]}" + "}"
        raw = text.encode("utf-8", "surrogatepass")
        raw += b" " * (-len(raw) % 8)
        return struct.pack("<Q", len(raw)) + raw + data[8 + hl :]
    text = "{" + ", ".join(f"{enc[k]}: {parts[k]}" for k in enc) + "}"
    raw = text.encode("utf-8", "surrogatepass")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data[8 + hl :]


#: family name -> (parse driver format, mutant function)
FAMILIES: dict[str, tuple[str, Callable[[bytes, random.Random], bytes]]] = {
    "gguf-bounds": ("gguf", gguf_boundary_mutant),
    "safetensors-escapes": ("safetensors", safetensors_escape_mutant),
}


def split_set_mutant(shards: list[bytes], rng: random.Random) -> tuple[list[bytes | None], str]:
    """One mutant of a split set (the shards' bytes, in order): a split.* value moved to or
    around its limit in one shard, one shard truncated, one shard missing, duplicated or
    swapped, or an extra shard. Returns the new list (None = no such file; extra entries
    are extra shards) and a description."""
    from hurray_interop.formats.gguf import GGUFFile

    out: list[bytes | None] = list(shards)
    i = rng.randrange(len(shards))
    kind = rng.randrange(6)
    if kind <= 1:  # a split key
        g = GGUFFile(shards[i])
        key = rng.choice(["split.no", "split.count", "split.tensors.count"])
        at = g.kv_offsets[key] + 8 + len(key) + 4
        code = "<i" if key == "split.tensors.count" else "<H"
        v = struct.unpack_from(code, shards[i], at)[0]
        lim = {"split.no": [len(shards) - 1, len(shards), 0, i + 1, i - 1, 0xFFFF],
               "split.count": [0, 1, len(shards) - 1, len(shards) + 1, 0xFFFF],
               "split.tensors.count": [v - 1, v + 1, 0, -1, 2**31 - 1, -(2**31)]}[key]
        lo, hi = (-(2**31), 2**31 - 1) if code == "<i" else (0, 0xFFFF)
        new = rng.choice(sorted({min(max(x, lo), hi) for x in lim} - {v}))
        b = bytearray(shards[i])
        struct.pack_into(code, b, at, new)
        out[i] = bytes(b)
        return out, f"shard {i + 1}: {key} {v} -> {new}"
    if kind == 2:  # truncated
        cut = rng.choice([len(shards[i]) - 1, len(shards[i]) // 2, rng.randrange(1, len(shards[i]))])
        out[i] = shards[i][:cut]
        return out, f"shard {i + 1} cut to {cut} bytes"
    if kind == 3:
        out[i] = None
        return out, f"shard {i + 1} missing"
    if kind == 4:  # another shard's bytes under this shard's name
        j = rng.choice([j for j in range(len(shards)) if j != i])
        out[i] = shards[j]
        return out, f"shard {j + 1} copied over shard {i + 1}"
    out.append(shards[rng.randrange(len(shards))])
    return out, "an extra shard beyond the count"


PADDING_KEY = "hurray_interop.gguf.padding"
_PAD_RUN = struct.Struct("<IQQ")  # core/records.py encode_byte_runs: u32 shard | u64 offset | u64 length | bytes


def _runs_of(raw: bytes) -> list[list]:
    """The ``[shard, offset, bytes]`` entries of a byte-runs record (as long as they parse)."""
    runs, pos = [], 0
    while pos + _PAD_RUN.size <= len(raw):
        part, offset, n = _PAD_RUN.unpack_from(raw, pos)
        runs.append([part, offset, raw[pos + _PAD_RUN.size : pos + _PAD_RUN.size + n]])
        pos += _PAD_RUN.size + n
    return runs


def padding_mutant(raw: bytes, rng: random.Random, shards: int = 1) -> tuple[bytes, str]:
    """One mutant of a ``hurray_interop.gguf.padding`` record: a run's shard index at and
    around the set's count (``shards``), its offset or length moved by one or to a limit, a
    run added, duplicated or dropped, the record cut. Returns the new record and a description."""
    runs = _runs_of(raw)
    if not runs:
        return raw + _PAD_RUN.pack(0, 0, 1) + b"\x01", "run added to an empty record"
    r = rng.randrange(len(runs))
    kind = rng.randrange(8)
    if kind == 0:  # shard index: the last one, the count, beyond, the largest u32
        runs[r][0] = rng.choice([0, shards - 1, shards, shards + 1, 2**32 - 1])
    elif kind == 1:  # offset: one byte either way, 0, far beyond any file
        runs[r][1] = max(0, runs[r][1] + rng.choice([-1, 1, -(runs[r][1] + 1), 2**40, 2**63]))
    elif kind == 2:  # one byte more or fewer (the region's bounds), or an empty run
        runs[r][2] = rng.choice([runs[r][2] + b"\x01", runs[r][2][:-1], b""])
    elif kind == 3:  # a run duplicated (overlap) or dropped
        runs.insert(r, list(runs[r])) if rng.random() < 0.5 else runs.pop(r)
    elif kind == 4:  # the length field alone: one more or fewer than the bytes that follow, or huge
        out = bytearray(raw)
        pos = sum(_PAD_RUN.size + len(x[2]) for x in runs[:r])
        struct.pack_into("<Q", out, pos + 12, max(0, len(runs[r][2]) + rng.choice([-1, 1, 2**32, 2**64 - 1 - len(runs[r][2])])))
        return bytes(out), f"{PADDING_KEY} run {r} length field edited"
    elif kind == 5:  # the record cut inside an entry header or its bytes
        return raw[: rng.randrange(len(raw))], f"{PADDING_KEY} cut"
    elif kind == 6:  # the bytes themselves (the record then describes other padding: legal)
        runs[r][2] = bytes(rng.randrange(1, 256) for _ in runs[r][2])
    else:  # a run moved to the end of the file's padding (past the end of the file at most)
        runs[r][1] += rng.choice([31, 32, 33, 4096])
    out = b"".join(_PAD_RUN.pack(p, o, len(b)) + bytes(b) for p, o, b in runs)
    return out, f"{PADDING_KEY} run {r} kind {kind}"


def records_mutant(kv: dict, rng: random.Random, key: str | None = None) -> tuple[dict, str]:
    """One mutant of the conversion records of a .hrry's KV (``hurray_interop.gguf.*`` and
    scale-substitution records): a number moved to or around its limit, a JSON tensor row
    edited, a record dropped or given the wrong type. ``key``: mutate that record (else one
    drawn at random). Returns the new KV and a description."""
    from hurray_interop.core.kv import KVValue

    kv = dict(kv)
    keys = [k for k in kv if k.startswith("hurray_interop.")]
    key = key or rng.choice(keys)
    v = kv[key]
    if rng.random() < 0.08:
        del kv[key]
        return kv, f"{key} dropped"
    if rng.random() < 0.08:
        kv[key] = rng.choice([KVValue("string", "x"), KVValue("uint64", 1), KVValue("bytes", b"\0" * 12), KVValue("int64", -1)])
        return kv, f"{key} retyped"
    if v.type in ("uint64", "int64"):
        x = int(v.value)
        new = rng.choice([x - 1, x + 1, 0, 2 * x, x * 2 + 1, 1 << 30, 1 << 31, 2**63 - 1, 32, 31, 33])
        kv[key] = KVValue("uint64", max(new, 0))
        return kv, f"{key} {x} -> {new}"
    if v.type == "string" and key.endswith(".tensors"):
        rows = json.loads(v.value)
        r = rng.randrange(len(rows))
        row = rows[r]
        kind = rng.randrange(6)
        if kind == 0:
            row[3] = max(0, row[3] + rng.choice([-1, 1, -32, 32, 2**62, 2**40]))
        elif kind == 1:
            j = rng.randrange(len(row[2]))
            row[2][j] = max(0, row[2][j] + rng.choice([-1, 1, 32, -32]))
        elif kind == 2:
            row[2] = row[2] + [1] if len(row[2]) < 5 else row[2][:-1]
        elif kind == 3:
            row[1] = rng.choice(["F32", "Q4_0", "Q8_0", "I8", "Q4_K", "XX"])
        elif kind == 4:
            rows.append(list(row) if rng.random() < 0.5 else [row[0] + "x", row[1], row[2], row[3]])
        else:
            rows.pop(r)
        kv[key] = KVValue("string", json.dumps(rows))
        return kv, f"{key} row {r} kind {kind}"
    if v.type == "array" and v.element_type == "string":
        items = list(v.value)
        kind = rng.randrange(3)
        if kind == 0 and items:
            items.pop(rng.randrange(len(items)))
        elif kind == 1:
            items.insert(rng.randrange(len(items) + 1), rng.choice(["UINT8", "STRING", "ARRAY[FLOAT32]", "INT64"]))
        elif items:
            items[rng.randrange(len(items))] = rng.choice(["UINT32", "FLOAT32", "BOOL", "ARRAY[STRING]", "FLOAT64", "nope"])
        kv[key] = KVValue("array", items, "string")
        return kv, f"{key} types edited ({kind})"
    if v.type == "bytes" and key == PADDING_KEY:  # its own layout: shard | offset | length | bytes
        split = kv.get("hurray_interop.gguf.split_layout")
        shards = len(json.loads(split.value).get("shards", [None])) if split is not None and split.type == "string" else 1
        raw, what = padding_mutant(bytes(v.value), rng, shards)
        kv[key] = KVValue("bytes", raw)
        return kv, what
    if v.type == "bytes" and len(v.value) >= 12:  # a scale-substitution record: u32 itemsize | u64 count | ...
        b = bytearray(v.value)
        itemsize, count = struct.unpack_from("<IQ", b, 0)
        kind = rng.randrange(4)
        if kind == 0:
            struct.pack_into("<Q", b, 4, max(0, count + rng.choice([-1, 1, 2**61])))
        elif kind == 1 and count:
            last = 12 + 8 * (count - 1)
            struct.pack_into("<Q", b, last, struct.unpack_from("<Q", b, last)[0] + rng.choice([1, 2**20, 2**63]))
        elif kind == 2:
            b = b[: len(b) - rng.choice([1, itemsize])] if len(b) > 12 else b + b"\0"
        else:
            struct.pack_into("<I", b, 0, rng.choice([0, 1, 2, 3, 4, 8, 16]))
        kv[key] = KVValue("bytes", bytes(b))
        return kv, f"{key} record edited ({kind})"
    # anything else: a string record gets hostile JSON
    kv[key] = KVValue("string", rng.choice(["", "[", "{}", "[[]]", "null", '{"format": 1}', "[" * 5000]))
    return kv, f"{key} replaced"


def _parse_gguf(m: bytes, path: Path) -> None:
    from hurray_interop.formats.gguf import GGUFFile

    g = GGUFFile(m, path=os.fspath(path))
    for v in g.kv.values():
        v.to_python("replace")
    for t in g.tensors:
        t.array()


def _parse_hrry(m: bytes, path: Path) -> None:
    from hurray_interop.core.hrry import HrryFile

    path.write_bytes(m)
    with HrryFile(path) as f:
        f.validate()
        for name in f.names:
            f.tensor(name)


def _parse_safetensors(m: bytes, path: Path) -> None:
    from hurray_interop.formats.safetensors import SafetensorsFile, detect_pairs

    path.write_bytes(m)
    with SafetensorsFile(path) as f:
        for name in f.names:
            f.array(name)
        detect_pairs(f)


def _decode_gguf_ggml(m: bytes, path: Path) -> None:
    """Parse, then hand every tensor ggml decodes to its C ``to_float`` through verify's
    oracle (``verification/gguf._reference``): whatever the reader accepts must be safe to
    give to C (a crash kills the campaign's child, a failure of its own)."""
    from hurray_interop.formats.gguf import GGUFFile
    from hurray_interop.verification.gguf import _reference

    g = GGUFFile(m, path=os.fspath(path))
    for t in g.tensors:
        rows = _reference(t, "ggml")
        if rows is None:
            continue
        rows(0, t.data.size // t.ggml_type.block_bytes)  # every block (a plain type's block: one element)


_DRIVERS = {"gguf": (_parse_gguf, ".gguf"), "hrry": (_parse_hrry, ".hrry"), "safetensors": (_parse_safetensors, ".safetensors"),
            "gguf-ggml": (_decode_gguf_ggml, ".gguf")}


class _Hang(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Hang()


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")  # pragma: no cover


def _campaign(fmt: str, src: Path, n: int, seed: int, budget: int, per_mutant_timeout: int) -> dict:
    from hurray_interop.errors import FormatError, HurrayInteropError

    family = FAMILIES.get(fmt)
    if family is not None:
        fmt = family[0]
    parse, ext = _DRIVERS[fmt]
    fmt = fmt.split("-")[0]  # a driver of a format's family ("gguf-ggml") mutates as the format
    data = src.read_bytes()
    regions = {"gguf": lambda: gguf_regions(data), "hrry": lambda: hrry_regions(src), "safetensors": lambda: safetensors_regions(data)}[fmt]()
    fixup = hrry_fix_crc if fmt == "hrry" else None
    if fmt == "safetensors":  # 40 % structure-aware JSON mutants of the original, 60 % byte mutants

        def fixup(m: bytes, rng: random.Random) -> bytes:
            return safetensors_json_mutant(data, rng) if rng.random() < 0.4 else m

    parse(data, Path(tempfile.mkdtemp()) / f"valid{ext}")  # the original must parse
    # imports and warm-up are done: from here on the address space may grow by `budget` only
    limit = _vm_size() + budget
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    signal.signal(signal.SIGALRM, _alarm)
    work = Path(tempfile.mkdtemp()) / f"mutant{ext}"
    errors = accepted = 0
    escapes: list[dict] = []
    if family is not None:
        make, fam_rng = family[1], random.Random(seed)
        if make is gguf_boundary_mutant:
            fields = gguf_fields(data)
            make = lambda d, r: gguf_boundary_mutant(d, r, fields)  # noqa: E731
        source: Iterator[tuple[int, bytes]] = ((k, make(data, fam_rng)) for k in range(n))
    else:
        source = mutants(data, n, seed, regions, fixup)
    for k, m in source:
        signal.alarm(per_mutant_timeout)
        try:
            parse(m, work)
            accepted += 1
        except HurrayInteropError as e:
            errors += 1
            problem = None
            if e.path is None:
                problem = "error without a file path"
            elif isinstance(e, FormatError) and e.offset is None:
                problem = "format error without a byte offset"
            if problem:
                escapes.append({"mutant": k, "problem": problem, "error": f"{type(e).__name__}: {e}"[:300]})
        except _Hang:
            escapes.append({"mutant": k, "problem": f"no answer within {per_mutant_timeout} s"})
        except BaseException as e:  # MemoryError, IndexError, struct.error, numpy errors ...
            tb = traceback.extract_tb(e.__traceback__)[-1]
            escapes.append(
                {
                    "mutant": k,
                    "problem": "non-project exception",
                    "error": f"{type(e).__name__}: {e}"[:300],
                    "where": f"{Path(tb.filename).name}:{tb.lineno}",
                }
            )
        finally:
            signal.alarm(0)
    return {"format": fmt, "mutants": n, "seed": seed, "errors": errors, "accepted": accepted, "escapes": escapes[:50],
            "escape_count": len(escapes), "maxrss_kb": _peak_rss_kb()}


def _peak_rss_kb() -> int:
    """This process's peak RSS since exec (VmHWM).  ``ru_maxrss`` would also count the
    parent's image between fork and exec, i.e. the size of the pytest process that spawned us."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:  # pragma: no cover - not Linux
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_campaign(
    fmt: str,
    src: "str | os.PathLike[str]",
    n: int,
    seed: int,
    *,
    budget: int = 768 << 20,
    per_mutant_timeout: int = 10,
    timeout: float | None = None,
) -> dict:
    """Run a parse-only campaign of ``n`` mutants of ``src`` in a bounded child process."""
    repo = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, os.fspath(Path(__file__).resolve()), fmt, os.fspath(src), str(n), str(seed), str(budget), str(per_mutant_timeout)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.fspath(repo), os.environ.get("PYTHONPATH", "")]),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout or 60 + n * 0.05, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"fuzz child failed (status {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_bounded(code: str, *, budget: int = 256 << 20, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run ``code`` in a child Python whose address space may grow by ``budget`` bytes
    after ``import hurray_interop``'s readers (a claimed size that gets allocated
    raises MemoryError there) and which is killed after ``timeout`` seconds."""
    repo = Path(__file__).resolve().parents[1]
    prologue = (
        "import resource, hurray_interop.formats.gguf, hurray_interop.core.hrry, "
        "hurray_interop.formats.safetensors, hurray_interop.errors\n"
        f"exec(compile(open({os.fspath(Path(__file__).resolve())!r}).read(), 'fuzzing', 'exec'), _f := {{'__name__': 'fuzzing'}})\n"
        f"resource.setrlimit(resource.RLIMIT_AS, (_f['_vm_size']() + {budget}, resource.RLIM_INFINITY))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.fspath(repo), os.environ.get("PYTHONPATH", "")]),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", prologue + code], capture_output=True, text=True, timeout=timeout, env=env)


# --------------------------------------------------------------------------
# end-to-end: the command line on hostile input


def run_cli(argv: Sequence[str]) -> tuple[int, str, str]:
    """``hurray_interop.cli.main(argv)`` in-process; returns (status, stdout, stderr).

    Both streams encode strictly as UTF-8, as a terminal or a pipe does (a ``StringIO``
    would accept text that cannot be printed, e.g. a lone surrogate from a JSON escape)."""
    import contextlib
    import io

    from hurray_interop import cli

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(list(argv))
    return status, out.buffer.getvalue().decode("utf-8"), err.buffer.getvalue().decode("utf-8")  # type: ignore[attr-defined]


def assert_cli_contract(status: int, err: str, *, output: Path | None = None, before: set[str] | None = None) -> None:
    """What every failing command owes its user: exit 1 or 2, one line per problem on
    stderr naming it, never a traceback or an internal error; and for a conversion
    (``output``/``before`` = the output directory's listing before the run): no output
    file and no temporary file left behind."""
    assert status in (0, 1, 2), (status, err)
    assert "Traceback" not in err, err
    assert "internal error" not in err, err
    if status == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("hurray-interop: error: "), err
    if status == 1:
        assert err.startswith("hurray-interop: "), err
    if status != 0 and output is not None:
        assert not output.exists(), f"exit {status} but {output} was written: {err}"
    if before is not None and output is not None:
        after = set(os.listdir(output.parent))
        if status == 0:
            after.discard(output.name)
        assert after == before, f"left behind: {sorted(after - before)}"


if __name__ == "__main__":
    fmt, src, n, seed = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    budget = int(sys.argv[5]) if len(sys.argv) > 5 else 768 << 20
    per = int(sys.argv[6]) if len(sys.argv) > 6 else 10
    print(json.dumps(_campaign(fmt, src, n, seed, budget, per)))
