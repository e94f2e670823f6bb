"""`edit` of a synthetic GGUF against a durable copy (`cp`, then an fsync of the copy).

    python3 bench/edit.py --size 1GB            # 3 alternated rounds; prints the medians
    python3 bench/edit.py --size 64MB --repeat 1

Each command runs in a fresh process (this checkout's package), after `os.sync()`, on a
model written by bench/synth.py.  The edit changes a key's value and adds a chat template
of 4 KiB, so the header grows and the data region moves (the kernel copies it at a new
offset).  Outputs are deleted after each run.  The figure goes in docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import synth  # noqa: E402

PY = sys.executable
FSYNC = "import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); os.close(fd)"


def _timed(argv: list[str]) -> float:
    os.sync()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "out"))
    args = ap.parse_args()
    d = Path(args.out_dir)
    d.mkdir(parents=True, exist_ok=True)
    src, cpy, out = d / "edit-src.gguf", d / "edit-copy.gguf", d / "edit-out.gguf"
    template = d / "edit-template.jinja"
    synth.write(src, synth.parse_size(args.size))
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}" * 80, encoding="utf-8")
    edit = [PY, "-m", "hurray_interop", "edit", str(src), str(out), "--quiet",
            "--set", "llama.context_length=8192", "--set-file", f"tokenizer.chat_template={template}"]
    copy = ["sh", "-c", 'cp -- "$1" "$2" && "$3" -I -S -c "$4" "$2"', "sh", str(src), str(cpy), PY, FSYNC]
    times: dict[str, list[float]] = {"copy": [], "edit": []}
    try:
        for i in range(args.repeat):
            for name, argv, target in (("copy", copy, cpy), ("edit", edit, out)):
                times[name].append(_timed(argv))
                target.unlink()
            print(f"round {i + 1}: copy {times['copy'][-1]:.2f} s, edit {times['edit'][-1]:.2f} s", flush=True)
    finally:
        for p in (src, cpy, out, template):
            p.unlink(missing_ok=True)
    c, e = statistics.median(times["copy"]), statistics.median(times["edit"])
    print(f"{args.size}: durable copy {c:.2f} s, edit {e:.2f} s = {e / c:.2f}x the durable copy "
          f"(medians of {args.repeat}; ranges {min(times['copy']):.2f}-{max(times['copy']):.2f} s, "
          f"{min(times['edit']):.2f}-{max(times['edit']):.2f} s)")


if __name__ == "__main__":
    main()
