"""Boundary mutation check for tests/test_bounds.py (run by hand, not by pytest).

    python3 tests/mutate_bounds.py [--only SUBSTRING] [--list] [--equivalent]

For every bounds comparison listed in :data:`SITES` (a module, a unique piece of
the line, and the operator to move), the script rewrites that one operator by one
(``<`` -> ``<=``, ``<=`` -> ``<``, ``>`` -> ``>=``, ``>=`` -> ``>``) in the
working tree, runs ``tests/test_bounds.py`` against the mutant in a child process,
and restores the file (always, also on Ctrl-C). A mutant is *killed* when the
tests fail. It prints one line per site and the totals covered / mutated /
killed, and exits 1 when a mutant survives or a site is no longer found.

The working tree is modified while it runs: do not run it while something else
imports the package from this tree.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = "hurray_interop"

FLIP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}

#: (module under hurray_interop/, unique text of the line, operator, occurrence of that
#: operator in the line (0 = first)) -- one entry per comparison tests/test_bounds.py covers
SITES: list[tuple[str, str, str, int]] = [
    # formats/gguf.py
    ("formats/gguf.py", "if size < 4 or bytes(buf[:4]) != MAGIC:", "<", 0),
    ("formats/gguf.py", "if n_kv > left // _MIN_KV or", ">", 0),
    ("formats/gguf.py", "if n_kv > left // _MIN_KV or", ">", 1),
    ("formats/gguf.py", "if n_kv > left // _MIN_KV or", ">", 2),
    ("formats/gguf.py", "if count > left // min_size:", ">", 0),
    ("formats/gguf.py", "if depth + 1 >= MAX_ARRAY_DEPTH:", ">=", 0),
    ("formats/gguf.py", "if n_dims > MAX_DIMS:", ">", 0),
    ("formats/gguf.py", "if d > _I64_MAX:", ">", 0),
    ("formats/gguf.py", "if n_el > _I64_MAX:", ">", 0),
    ("formats/gguf.py", "if start + nbytes > size:", ">", 0),
    ("formats/gguf.py", "if prev is not None and t.data_offset < cur:", "<", 0),
    ("formats/gguf.py", "if tail > pad:", ">", 0),
    ("formats/gguf.py", "e = int(self._starts[i + 1]) - 8 if i + 1 < len(self._starts)", "<", 0),
    ("formats/gguf.py", "        if i < 0:", "<", 0),
    ("formats/gguf.py", "if not 0 <= i < n:", "<=", 0),
    ("formats/gguf.py", "if not 0 <= i < n:", "<", 0),
    # formats/safetensors.py
    ("formats/safetensors.py", "if size < 8:", "<", 0),
    ("formats/safetensors.py", "if n > MAX_HEADER:", ">", 0),
    ("formats/safetensors.py", "if 8 + n > size:", ">", 0),
    ("formats/safetensors.py", "and d >= 0 for d in shape", ">=", 0),
    ("formats/safetensors.py", "or not 0 <= offs[0] <= offs[1]", "<=", 0),
    ("formats/safetensors.py", "or not 0 <= offs[0] <= offs[1]", "<=", 1),
    ("formats/safetensors.py", "if offs[1] > data_size:", ">", 0),
    # core/kv.py
    ("core/kv.py", "if count * 5 > r.remaining:", ">", 0),
    ("core/kv.py", "if n * _MIN_PAYLOAD[ekind] > r.remaining:", ">", 0),
    ("core/kv.py", "        if b > 1:", ">", 0),
    ("core/kv.py", "bad = next((j for j, b in enumerate(raw) if b > 1), None)", ">", 0),
    ("core/kv.py", "elif 0xF0 <= tag <= 0xFE:", "<=", 0),
    ("core/kv.py", "elif 0xF0 <= tag <= 0xFE:", "<=", 1),
    # files/binary.py
    ("files/binary.py", "if n < 0 or self.pos + n > self.end:", "<", 0),
    ("files/binary.py", "if n < 0 or self.pos + n > self.end:", ">", 0),
    ("files/binary.py", "if count < 0:", "<", 0),
    ("files/binary.py", "if n > self.end - self.pos:", ">", 0),
    ("files/binary.py", "if len(starts) < count:", "<", 0),
    # core/hrry.py
    ("core/hrry.py", "if size < minimum:", "<", 0),
    ("core/hrry.py", "if major > 1:", ">", 0),
    ("core/hrry.py", "if align & (align - 1) or not MIN_ALIGNMENT <= align <= MAX_ALIGNMENT:", "<=", 0),
    ("core/hrry.py", "if align & (align - 1) or not MIN_ALIGNMENT <= align <= MAX_ALIGNMENT:", "<=", 1),
    ("core/hrry.py", "if first < HEADER_SIZE or first % 8:", "<", 0),
    ("core/hrry.py", "if ioff + ilen > end_of_body:", ">", 0),
    ("core/hrry.py", "if ioff < first:", "<", 0),
    ("core/hrry.py", "if ilen < 8:", "<", 0),
    ("core/hrry.py", "if kvoff < first or kvoff + kvlen > end_of_body:", "<", 0),
    ("core/hrry.py", "if kvoff < first or kvoff + kvlen > end_of_body:", ">", 0),
    ("core/hrry.py", "if count * (INDEX_ENTRY_FIXED + 1) > r.remaining:", ">", 0),
    ("core/hrry.py", "if dlen < 20:", "<", 0),
    ("core/hrry.py", "                if end > body_end:", ">", 0),
    ("core/hrry.py", "if start < h.first_descriptor_offset:", "<", 0),
    ("core/hrry.py", "if b[0] < a[1]:", "<", 0),
    # core/records.py
    ("core/records.py", "if len(raw) < _HEAD.size:", "<", 0),
    ("core/records.py", "if count > 1 and not np.all(blocks[1:] > blocks[:-1]):", ">", 1),
    ("core/records.py", "if blocks.size and int(blocks[-1]) >= scales.size:", ">=", 0),
    ("core/records.py", "    while pos < mv.nbytes:", "<", 0),
    ("core/records.py", "if mv.nbytes - pos < _RUN.size:", "<", 0),
    ("core/records.py", "if length == 0 or length > mv.nbytes - pos:", ">", 0),
    ("core/records.py", "if (part, offset) < prev:", "<", 0),
    # conversions/gguf.py (the GGUF conversion records)
    ("conversions/gguf.py", "if alignment < 1 or alignment & (alignment - 1) or alignment > 1 << 30:", "<", 0),
    ("conversions/gguf.py", "if alignment < 1 or alignment & (alignment - 1) or alignment > 1 << 30:", ">", 0),
    ("conversions/gguf.py", "if tail >= max(alignment, 1):", ">=", 0),
    ("conversions/gguf.py", "        if off < end:", "<", 0),
    ("conversions/gguf.py", "if end - total > max(total, 1 << 20) + len(rec.tensors) * rec.alignment:", ">", 0),
    # conversions/gguf_expanded.py (the exact-expanded restore record)
    ("conversions/gguf_expanded.py", "if rest < 0 or rest % (4 + spec.block_bytes):", "<", 0),
    ("conversions/gguf_expanded.py", "bad = (idx < first_block) | (idx >= first_block + n_blocks)", "<", 0),
    ("conversions/gguf_expanded.py", "bad = (idx < first_block) | (idx >= first_block + n_blocks)", ">=", 0),
    ("conversions/gguf_expanded.py", "bad[1:] |= np.diff(idx) <= 0", "<=", 0),
    # formats/gguf_split.py
    ("formats/gguf_split.py", "if no >= count:", ">=", 0),
    ("formats/gguf_split.py", "if total < 0:", "<", 0),
    ("formats/gguf_split.py", "and min_dims <= len(row[2]) <= G.MAX_DIMS", "<=", 0),
    ("formats/gguf_split.py", "and min_dims <= len(row[2]) <= G.MAX_DIMS", "<=", 1),
    ("formats/gguf_split.py", "return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi", "<=", 0),
    ("formats/gguf_split.py", "return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi", "<=", 1),
    ("formats/gguf_split.py", "if r.offset % alignment or (n and r.offset < end):", "<", 0),
    ("formats/gguf_split.py", "if reach - total > max(total, 1 << 20) + len(rows) * alignment:", ">", 0),
    # core/descriptor.py (length fields)
    ("core/descriptor.py", "    if length < 20:", "<", 0),
    ("core/descriptor.py", "    if length > avail:", ">", 0),
    ("core/descriptor.py", "    if rank > MAX_RANK:", ">", 0),
    ("core/descriptor.py", "if qlen > rd.end - rd.pos:", ">", 0),
    ("core/descriptor.py", "if n > rd.end - offset:", ">", 0),
    ("core/descriptor.py", "    if n < 4:", "<", 0),
    ("core/descriptor.py", "    if n < need:", "<", 0),
    ("core/descriptor.py", "if got < desc.byte_offset + want:", "<", 0),
    ("core/descriptor.py", "    if first < 0:", "<", 0),
    ("core/descriptor.py", "    if end > have:", ">", 0),
    ("formats/safetensors.py", "if len(e.shape) < 2 or str(e.shape[-1]) not in c", "<", 0),
    # writers: the limits they accept
    ("formats/gguf_split.py", "int(max_tensors) < 1):", "<", 0),
    ("formats/gguf_split.py", "int(max_size) < 1):", "<", 0),
    ("formats/gguf_split.py", "new = i > 0 and i % max_tensors == 0", ">", 0),
    ("formats/gguf_split.py", "new = bool(shards[-1]) and used + padded > max_size", ">", 0),
    ("formats/gguf.py", "if alignment <= 0 or alignment & (alignment - 1):", "<=", 0),
    ("formats/gguf.py", "if not 0 <= tail <= pad:", "<=", 0),
    ("formats/gguf.py", "if not 0 <= tail <= pad:", "<=", 1),
    ("formats/gguf.py", "if nb and self.data_offset + off < prev_end:", "<", 0),
    ("core/kv.py", "    if len(kb) > 0xFFFF:", ">", 0),
    ("core/kv.py", "if not lo <= v <= hi:", "<=", 0),
    ("core/kv.py", "if not lo <= v <= hi:", "<=", 1),
    ("core/hrry.py", "if len(nb) > 0xFFFF:", ">", 0),
    # the padding record (hurray_interop.gguf.padding): byte limit, shard index, where it may go
    ("conversions/gguf.py", "if sum(r[2].nbytes for r in runs) > MAX_PADDING_BYTES:", ">", 0),
    ("conversions/gguf.py", "    if total > MAX_PADDING_BYTES:", ">", 0),
    ("conversions/gguf.py", "if padding and max(padding) >= layout.count:", ">=", 0),
    ("formats/gguf.py", "if not n or o < prev or r == len(regions) or not regions[r][0] <= o or o + n > regions[r][1]:", "<", 0),
    ("formats/gguf.py", "if not n or o < prev or r == len(regions) or not regions[r][0] <= o or o + n > regions[r][1]:", "<=", 0),
    ("formats/gguf.py", "if not n or o < prev or r == len(regions) or not regions[r][0] <= o or o + n > regions[r][1]:", ">", 0),
]

#: comparisons of these modules flipped by hand and found *equivalent*: the flipped code
#: behaves the same on every input, so no test can tell them apart (not counted above)
EQUIVALENT: list[tuple[str, str, str, int, str]] = [
    ("formats/gguf.py", "if size < 4 and MAGIC.startswith", "<", 0,
     "size == 4 with the magic's 4 bytes never gets here (the line before lets it through)"),
    ("core/kv.py", "if pos + 4 > end:", ">", 0, "a pre-check: the Reader.need(4) it calls repeats the exact comparison"),
    ("core/kv.py", "if pos + ln > end:", ">", 0, "a pre-check: the Reader.need(ln) it calls repeats the exact comparison"),
    ("formats/safetensors.py", 'what = "overlaps the previous tensor" if e.begin < pos', "<", 0,
     "only reached when e.begin != pos, where < and <= agree"),
    ("core/records.py", "if count > len(raw) or len(raw) != expected:", ">", 0,
     "count == len(raw) also fails len(raw) != expected, with the same message"),
    ("core/hrry.py", 'if a.name.encode("utf-8") >= b.name.encode("utf-8"):', ">=", 0,
     "equal names are refused earlier as duplicates"),
    ("formats/gguf.py", "if end > start:", ">", 0, "_check_gap with end == start reads no byte either way"),
]


def _flip_line(line: str, op: str, occurrence: int) -> str:
    """``line`` with the ``occurrence``-th standalone ``op`` replaced by its flip."""
    pattern = re.compile(r"(?<![<>=!])" + re.escape(op) + r"(?![<>=])")
    hits = [m for m in pattern.finditer(line)]
    if occurrence >= len(hits):
        raise LookupError(f"operator {op!r} #{occurrence} not in: {line.strip()}")
    m = hits[occurrence]
    return line[: m.start()] + FLIP[op] + line[m.end() :]


def _run_tests() -> tuple[bool, str]:
    env = dict(os.environ, PYTHONPATH=os.fspath(REPO), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly", "-p", "no:cacheprovider", "tests/test_bounds.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    failed = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAILED")]
    return proc.returncode != 0, (failed[0][7:] if failed else proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the sites whose module or line contains this text")
    ap.add_argument("--list", action="store_true", help="list the sites and exit")
    ap.add_argument("--equivalent", action="store_true", help="flip the EQUIVALENT sites instead (each should survive)")
    args = ap.parse_args(argv)
    pool = [s[:4] for s in EQUIVALENT] if args.equivalent else SITES
    sites = [s for s in pool if not args.only or args.only in s[0] or args.only in s[1]]
    if args.list:
        for s in sites:
            print(*s, sep="  |  ")
        return 0
    ok, why = _run_tests()
    if ok:
        print(f"tests/test_bounds.py fails on the unmodified tree: {why}")
        return 1
    killed = missing = 0
    for module, text, op, occ in sites:
        path = REPO / PKG / module
        original = path.read_text()
        lines = original.splitlines(keepends=True)
        where = [i for i, ln in enumerate(lines) if text in ln]
        if len(where) != 1:
            print(f"NOT FOUND ({len(where)} matches)  {module}: {text}")
            missing += 1
            continue
        i = where[0]
        try:
            lines[i] = _flip_line(lines[i], op, occ)
        except LookupError as e:
            print(f"NOT FOUND  {module}:{i + 1}: {e}")
            missing += 1
            continue
        try:
            path.write_text("".join(lines))
            dead, why = _run_tests()
        finally:
            path.write_text(original)
        killed += dead
        print(f"{'killed  ' if dead else 'SURVIVED'}  {module}:{i + 1}  {op} -> {FLIP[op]}  {lines[i].strip()}"
              + (f"   [{why}]" if dead else ""))
    mutated = len(sites) - missing
    print(f"covered {len(sites)}, mutated {mutated}, killed {killed}, survived {mutated - killed}, not found {missing}")
    if args.equivalent:
        return 0 if killed == 0 and not missing else 1
    return 0 if killed == len(sites) else 1


if __name__ == "__main__":
    sys.exit(main())
