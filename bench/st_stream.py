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
import resource
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402
import synth  # noqa: E402

FALLBACK = ["--fallback", "bfloat16"]


def _convert(src: Path, dst: Path, keep: bool = False) -> tuple[float, int, float]:
    """(wall s, peak RSS bytes, CPU s: user + system) of one conversion in a fresh process;
    ``dst`` removed unless ``keep``."""
    run.settle()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t, rss = run.run_child([*run.CLI, "convert", str(src), str(dst), *FALLBACK, "-q", "--force"], env=run.CHILD_ENV)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not keep:
        dst.unlink()
    return t, rss, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def measure(out: Path, size: int, mix: str, repeat: int) -> dict[str, list[tuple[float, ...]]]:
    src = out / f"st-{mix}.gguf"
    mid, g_st, h_st = out / f"st-{mix}.hrry", out / f"st-{mix}.g.safetensors", out / f"st-{mix}.h.safetensors"
    info = synth.write(src, size, mix=mix, vocab=32000)
    got: dict[str, list[tuple[float, ...]]] = {"hrry": [], "gguf→st": [], "hrry→st": [], "bytes": [(info["bytes"], 0)]}
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
    print(f"mix {a.mix}, {a.repeat} round(s); wall s and CPU s (user + system) medians, peak RSS max; "
          "ratios: wall (CPU) / the import's")
    print("| GGUF bytes | → .hrry: wall s | CPU s | RSS | GGUF → safetensors: wall s | CPU s | RSS | ratio "
          "| .hrry → safetensors: wall s | CPU s | RSS | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    keys = ("hrry", "gguf→st", "hrry→st")
    for s in a.size:
        got = measure(out, synth.parse_size(s), a.mix, a.repeat)
        t = {k: statistics.median(x[0] for x in got[k]) for k in keys}
        c = {k: statistics.median(x[2] for x in got[k]) for k in keys}
        r = {k: max(x[1] for x in got[k]) / 2**20 for k in keys}
        cols = [f"{t[k]:.1f} | {c[k]:.1f} | {r[k]:.0f} MiB" for k in keys]
        ratios = [f"{t[k] / t['hrry']:.2f}× ({c[k] / c['hrry']:.2f}×)" for k in keys[1:]]
        print(f"| {got['bytes'][0][0]:,} | {cols[0]} | {cols[1]} | {ratios[0]} | {cols[2]} | {ratios[1]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
