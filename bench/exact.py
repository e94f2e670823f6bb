"""``--fallback exact`` against the plain Q4_0 conversion of a model of the same size.

    python3 bench/exact.py --size 1GB      # writes the two synthetic models, converts both ways
    python3 bench/exact.py --size 64MB     # a smoke run

Models (bench/synth.py): ``q4_k_m`` (llama.cpp's Q4_K_M layout: Q4_K + Q6_K + F32, well-formed
random super-blocks) and ``q4_0`` (the same layout all Q4_0). Measured, each command in a fresh
process (wall time; peak RSS via GNU ``time``, see run.py): the import (``convert`` GGUF →
.hrry; the Q4_K_M one with ``--fallback exact``) and the export (.hrry → GGUF, byte-identical
checked with ``cmp``). Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402
import synth  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="64MB")
    p.add_argument("--out-dir", default=str(HERE / "out"))
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    a = p.parse_args(argv)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    size = synth.parse_size(a.size)
    rows = []
    for mix, extra in (("q4_0", []), ("q4_k_m", ["--fallback", "exact"])):
        src, mid, back = out / f"{mix}.gguf", out / f"{mix}.hrry", out / f"{mix}.back.gguf"
        info = synth.write(src, size, mix=mix, vocab=32000)
        run.settle()
        t_in, rss_in = run.run_child([*run.CLI, "convert", str(src), str(mid), "-q", "--force", *extra])
        run.settle()
        t_out, rss_out = run.run_child([*run.CLI, "convert", str(mid), str(back), "-q", "--force"])
        same = filecmp.cmp(src, back, shallow=False)
        rows.append((mix, info["bytes"], os.path.getsize(mid), t_in, rss_in, t_out, rss_out, same))
        if not a.keep:
            for f in (src, mid, back):
                f.unlink()
    base = rows[0]
    print("| model | GGUF bytes | .hrry bytes | import s (MB/s) | peak RSS | export s (MB/s) | peak RSS | "
          "byte-identical | import / export vs Q4_0 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mix, nb, nh, ti, ri, to, ro, same in rows:
        print(f"| {mix} | {nb:,} | {nh:,} | {ti:.1f} ({nb / ti / 1e6:.0f}) | {ri / 2**20:.0f} MiB | "
              f"{to:.1f} ({nb / to / 1e6:.0f}) | {ro / 2**20:.0f} MiB | {'yes' if same else 'NO'} | "
              f"{ti / base[3]:.2f}× / {to / base[5]:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
