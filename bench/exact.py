"""``--fallback exact`` against the plain Q4_0 conversion of a model of the same size.

    python3 bench/exact.py --size 1GB      # writes the two synthetic models, converts both ways
    python3 bench/exact.py --size 64MB     # a smoke run
    python3 bench/exact.py --size 1.1GB --repeat 3   # interleaved rounds, medians

Models (bench/synth.py): ``q4_k_m`` (llama.cpp's Q4_K_M layout: Q4_K + Q6_K + F32, well-formed
random super-blocks) and ``q4_0`` (the same layout all Q4_0). Measured, each command in a fresh
process after a ``sync`` (wall time; peak RSS via GNU ``time``, see run.py), the rounds
interleaved (``--repeat``): the import (``convert`` GGUF →
.hrry; the Q4_K_M one with ``--fallback exact``) and the export (.hrry → GGUF, byte-identical
checked with ``cmp``). Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import resource
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402
import synth  # noqa: E402


def _convert(cmd: list[str]) -> tuple[float, int, float]:
    """(wall s, peak RSS bytes, CPU s: user + system, which a busy machine disturbs less)."""
    run.settle()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t, rss = run.run_child([*run.CLI, "convert", *cmd, "-q", "--force"], env=run.CHILD_ENV)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return t, rss, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="64MB")
    p.add_argument("--out-dir", default=str(HERE / "out"))
    p.add_argument("--repeat", type=int, default=1, help="interleaved rounds (the table shows medians)")
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    a = p.parse_args(argv)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    size = synth.parse_size(a.size)
    mixes = (("q4_0", []), ("q4_k_m", ["--fallback", "exact"]))
    paths = {mix: (out / f"{mix}.gguf", out / f"{mix}.hrry", out / f"{mix}.back.gguf") for mix, _ in mixes}
    info = {mix: synth.write(paths[mix][0], size, mix=mix, vocab=32000) for mix, _ in mixes}
    times: dict[str, list[tuple[float, ...]]] = {mix: [] for mix, _ in mixes}
    same = {mix: True for mix, _ in mixes}
    for _ in range(a.repeat):  # A B A B: a busy phase of the shared machine spreads over both rows
        for mix, extra in mixes:
            src, mid, back = paths[mix]
            t_in, rss_in, cpu_in = _convert([str(src), str(mid), *extra])
            t_out, rss_out, cpu_out = _convert([str(mid), str(back)])
            times[mix].append((t_in, rss_in, t_out, rss_out, cpu_in, cpu_out))
            same[mix] &= filecmp.cmp(src, back, shallow=False)
    rows = []
    for mix, _ in mixes:
        ti, to, ci, co = (statistics.median(t[k] for t in times[mix]) for k in (0, 2, 4, 5))
        ri, ro = (max(t[k] for t in times[mix]) for k in (1, 3))
        spread = [(min(t[k] for t in times[mix]), max(t[k] for t in times[mix])) for k in (0, 2)]
        rows.append((mix, info[mix]["bytes"], os.path.getsize(paths[mix][1]), ti, ri, to, ro, same[mix], spread, ci, co))
    if not a.keep:
        for f in (f for ps in paths.values() for f in ps):
            f.unlink()
    base = rows[0]
    print(f"{a.repeat} round(s); times: median (min–max; MB/s of GGUF), CPU: user + system, median")
    print("| model | GGUF bytes | .hrry bytes | import s | CPU s | peak RSS | export s | CPU s | peak RSS | "
          "byte-identical | import / export vs Q4_0 (CPU) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mix, nb, nh, ti, ri, to, ro, ok, ((i0, i1), (o0, o1)), ci, co in rows:
        print(f"| {mix} | {nb:,} | {nh:,} | {ti:.1f} ({i0:.1f}–{i1:.1f}; {nb / ti / 1e6:.0f}) | {ci:.1f} | "
              f"{ri / 2**20:.0f} MiB | {to:.1f} ({o0:.1f}–{o1:.1f}; {nb / to / 1e6:.0f}) | {co:.1f} | "
              f"{ro / 2**20:.0f} MiB | {'yes' if ok else 'NO'} | {ti / base[3]:.2f}× / {to / base[5]:.2f}× "
              f"({ci / base[9]:.2f}× / {co / base[10]:.2f}×) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
