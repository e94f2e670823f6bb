"""Float-fallback exports to safetensors against the import of the same source into .hrry.

    python3 bench/st_stream.py --size 0.25GB 1GB 4GB   # the figures of docs/benchmarks.md
    python3 bench/st_stream.py --size 16MB             # a smoke run

Model (bench/synth.py, ``--mix``, default ``q4_k_m``: llama.cpp's Q4_K_M layout, the case of
issue 20, where a float fallback dequantizes the K-quants at import and the export
dequantizes the rest). Per size, each command in a fresh process after a ``sync`` (wall
time; peak RSS via GNU ``time``, see run.py), the rounds interleaved (``--repeat``):

* ``hrry``: ``convert --fallback bfloat16 SRC X.hrry`` -- the yardstick;
* ``gguf→st``: ``convert --fallback bfloat16 SRC G.safetensors`` (through a temporary .hrry);
* ``hrry→st``: ``convert --fallback bfloat16 X.hrry H.safetensors``.

Outputs are deleted after each command (a 4 GB Q4_K_M model is 14 GB as bfloat16). Prints a
Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402
import synth  # noqa: E402

FALLBACK = ["--fallback", "bfloat16"]


def _convert(src: Path, dst: Path, keep: bool = False) -> tuple[float, int]:
    """(wall s, peak RSS bytes) of one conversion in a fresh process; ``dst`` removed unless ``keep``."""
    run.settle()
    t, rss = run.run_child([*run.CLI, "convert", str(src), str(dst), *FALLBACK, "-q", "--force"], env=run.CHILD_ENV)
    if not keep:
        dst.unlink()
    return t, rss


def measure(out: Path, size: int, mix: str, repeat: int) -> dict[str, list[tuple[float, int]]]:
    src = out / f"st-{mix}.gguf"
    mid, g_st, h_st = out / f"st-{mix}.hrry", out / f"st-{mix}.g.safetensors", out / f"st-{mix}.h.safetensors"
    info = synth.write(src, size, mix=mix, vocab=32000)
    got: dict[str, list[tuple[float, int]]] = {"hrry": [], "gguf→st": [], "hrry→st": [], "bytes": [(info["bytes"], 0)]}
    try:
        for _ in range(repeat):
            got["hrry"].append(_convert(src, mid, keep=True))
            got["hrry→st"].append(_convert(mid, h_st))
            mid.unlink()
            got["gguf→st"].append(_convert(src, g_st))
    finally:
        for f in (src, mid, g_st, h_st):
            f.unlink(missing_ok=True)
    return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", nargs="+", default=["16MB"])
    p.add_argument("--mix", default="q4_k_m", choices=("default", *synth.MIXES))
    p.add_argument("--out-dir", default=str(HERE / "out"))
    p.add_argument("--repeat", type=int, default=1, help="interleaved rounds (the table shows medians, max RSS)")
    a = p.parse_args(argv)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    print(f"mix {a.mix}, {a.repeat} round(s); wall s (median), peak RSS (max); ratio: wall / the import's")
    print("| GGUF bytes | → .hrry s | RSS | GGUF → safetensors s | RSS | ratio | .hrry → safetensors s | RSS | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in a.size:
        got = measure(out, synth.parse_size(s), a.mix, a.repeat)
        t = {k: statistics.median(x[0] for x in got[k]) for k in ("hrry", "gguf→st", "hrry→st")}
        r = {k: max(x[1] for x in got[k]) / 2**20 for k in ("hrry", "gguf→st", "hrry→st")}
        print(f"| {got['bytes'][0][0]:,} | {t['hrry']:.1f} | {r['hrry']:.0f} MiB | {t['gguf→st']:.1f} | "
              f"{r['gguf→st']:.0f} MiB | {t['gguf→st'] / t['hrry']:.2f}× | {t['hrry→st']:.1f} | {r['hrry→st']:.0f} MiB | "
              f"{t['hrry→st'] / t['hrry']:.2f}× |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
