"""GGUF -> GGUF in one step against a durable copy: split a synthetic model into a set
(``--split-max-size``) and merge the set back (``--merge``), each command in a fresh process.

    python3 bench/resplit.py                     # 1 GB model, 3 rounds (about a minute)
    python3 bench/resplit.py --size 64MB --repeat 1

The yardstick is a durable copy (``cp`` then an fsync of the copy, timed as one command,
bench/run.py's ``durable_copy``) of the same bytes: of the model before the split, of
every shard of the set before the merge (one ``cp`` + fsync per shard, as many files as
the split writes).  Rounds interleave (copy, split, copy of the set, merge); medians.
The tensor bytes are copied by the kernel (``copy_file_range``), so on a filesystem that
shares extents (btrfs, XFS with reflink) both may beat the copy; on ext4 they are copies.
Prints a Markdown table (paste it into docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (bench/run.py: fresh-process timing, durable copy)
import synth  # noqa: E402

FSYNC = "import os, sys\nfor p in sys.argv[1:]:\n    fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.close(fd)"


def durable_copy_of_set(shards: list[Path], dst: Path) -> list[str]:
    """``cp`` of every shard into ``dst``, then an fsync of each copy, in one child."""
    copies = " ".join(_q(dst / p.name) for p in shards)
    return ["sh", "-c", f'cp -- {" ".join(map(_q, shards))} {_q(dst)} && {_q(run.PY)} -I -S -c {_q(FSYNC)} {copies}']


def _q(x: object) -> str:
    return shlex.quote(str(x))


def clear(*folders: Path) -> Callable[[], None]:
    """Empty these folders (before and after a timed command: every run writes into an empty one)."""
    def go() -> None:
        for d in folders:
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)

    return go


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="1GB")
    p.add_argument("--split-size", default=None, help="--split-max-size of the split (default: a quarter of --size)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out-dir", default=str(HERE / "out" / "resplit"))
    p.add_argument("--keep", action="store_true")
    a = p.parse_args(argv)
    size = synth.parse_size(a.size)
    split_size = a.split_size or f"{max(1, size // 4 // 1_000_000)}M"
    out = Path(a.out_dir)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    model = out / "model.gguf"
    synth.write(model, size)
    split, copy, merged = out / "split", out / "copy", out / "merged"
    for d in (split, copy, merged):
        d.mkdir()
    # one untimed split first: the set the merge and the set's copy read
    run.run_child([*run.CLI, "convert", str(model), str(split / "s.gguf"), "--split-max-size", split_size, "-q"],
                  env=run.CHILD_ENV)
    shards = sorted(split.glob("s-*.gguf"))
    n = model.stat().st_size
    rows = {k: run.Row(k, label, nbytes=n) for k, label in [
        ("cp_model", "durable copy of the model (`cp` + fsync)"),
        ("split", f"`convert model.gguf s.gguf --split-max-size {split_size}` ({len(shards)} shards)"),
        ("cp_set", f"durable copy of the {len(shards)} shards (`cp` + fsync of each)"),
        ("merge", "`convert s-00001-of-….gguf m.gguf --merge`"),
    ]}
    resplit = out / "resplit"
    jobs = [
        run.Job(rows["cp_model"], run.durable_copy(model, copy / "model.gguf"), clear(copy), clear(copy)),
        run.Job(rows["split"], [*run.CLI, "convert", str(model), str(resplit / "s.gguf"), "--split-max-size",
                                split_size, "-q"], clear(resplit), clear(resplit)),
        run.Job(rows["cp_set"], durable_copy_of_set(shards, copy), clear(copy), clear(copy)),
        run.Job(rows["merge"], [*run.CLI, "convert", str(shards[0]), str(merged / "m.gguf"), "--merge", "-q"],
                clear(merged), None),
    ]
    run.run_interleaved(jobs, a.repeat)
    print(f"\n{size / 1e9:.2f} GB synthetic model ({n} bytes), {a.repeat} rounds, kernel {run._kernel()}\n")
    print("| operation | wall s (median) | range | MB/s | × durable copy | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    base = {"cp_model": "cp_model", "split": "cp_model", "cp_set": "cp_set", "merge": "cp_set"}
    for k, r in rows.items():
        ratio = r.t / rows[base[k]].t
        print(f"| {r.label} | {r.t:.2f} | {run._spread(r)} | {n / r.t / 1e6:.0f} | {ratio:.2f}× | {r.peak / 2**20:.0f} |")
    if not a.keep:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
