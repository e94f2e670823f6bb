"""``compare`` against ``verify``'s value check on one synthetic model (bench/synth.py).

    python3 bench/compare.py --size 1GB        # one round; the figures go into docs/benchmarks.md by hand

Writes model A (seed 0), model B (seed 1: same layout, other values) and A's .hrry in
``--out-dir``, then times, each in a fresh process, after a warm-up read of its inputs:

* ``verify A.gguf A.hrry`` -- the pair check (values of the .hrry by the shared dequantizer
  against ggml's ``to_float`` on the GGUF, plus the export compared byte for byte);
* ``compare A.gguf A.hrry`` -- every value of both decoded (the kinds differ: no byte shortcut);
* ``compare A.gguf B.gguf`` -- every value differs (ggml's decoders on both sides);
* ``compare A.gguf copy.gguf`` -- identical bytes (no value decoded).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synth  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "hurray_interop"]


def timed(cmd: list[str]) -> tuple[float, int, int]:
    """Wall seconds, exit code and peak RSS (MiB, as GNU time measures it) of ``cmd``."""
    t = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    return time.perf_counter() - t, p.returncode, int(p.stderr.split()[-1]) >> 10


def warm(*paths: Path) -> None:
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1GB")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out")
    a = ap.parse_args(argv)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    src, other, copy, hr = (a.out_dir / n for n in ("cmp-a.gguf", "cmp-b.gguf", "cmp-copy.gguf", "cmp-a.hrry"))
    size = synth.parse_size(a.size)
    try:
        model = synth.write(src, size, 0)
        synth.write(other, size, 1)
        shutil.copy(src, copy)
        subprocess.run(CLI + ["convert", str(src), str(hr), "-q"], cwd=ROOT, check=True)
        print(f"model: {model['bytes']:,} bytes, {model.get('tensors', '?')} tensors")
        for label, cmd, inputs in [
            ("verify A.gguf A.hrry (pair)", ["verify", str(src), str(hr), "-q", "--oracle", "ggml"], (src, hr)),
            ("compare A.gguf A.hrry", ["compare", str(src), str(hr)], (src, hr)),
            ("compare A.gguf B.gguf (every value differs)", ["compare", str(src), str(other)], (src, other)),
            ("compare A.gguf copy.gguf (identical bytes)", ["compare", str(src), str(copy)], (src, copy)),
        ]:
            warm(*inputs)
            s, rc, rss = timed(CLI + cmd)
            print(f"| {label} | {s:.2f} | {rc} | {rss} |", flush=True)
    finally:
        for p in (src, other, copy, hr):
            p.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
