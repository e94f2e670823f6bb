"""Benchmark hurray-interop against `cp` and gguf-py on a synthetic llama-shaped GGUF.

    python3 bench/run.py                      # the full run: 4 GB model, 3 repeats -> docs/benchmarks.md
    python3 bench/run.py --size 64MB          # a smoke run in seconds
    python3 bench/run.py --size 16MB --repeat 1 --out-dir /tmp/b --doc /tmp/b/benchmarks.md

Every figure of a command is measured in a fresh child process (wall time with
``time.perf_counter``, peak RSS from ``os.wait4``'s rusage, ``ru_maxrss``), on a
warm page cache (the source is read once before the first run), each ``--repeat``
times; the table shows the median and the spread.  The dequantizer throughputs
are measured in this process, per type, on the same tensors for both sides.
The analysis section of an existing document (between the ``analysis`` markers)
is kept, so the hand-written explanation of the figures survives a rerun.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

import synth  # noqa: E402

PY = sys.executable
CLI = [PY, "-m", "hurray_interop"]
GPY = [PY, str(HERE / "gguf_py_tasks.py")]
INSPECT_ROWS = ("startup", "inspect_model", "inspect_vocab", "gguf_py_read_vocab")
MARK_A, MARK_B = "<!-- analysis -->", "<!-- /analysis -->"

#: (type, gguf-py's throughput quoted in the issue, MB/s of input)
DEQUANT_TYPES = ("Q4_0", "Q8_0", "Q4_1", "MXFP4")


@dataclass
class Row:
    key: str
    label: str
    times: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)  # bytes
    nbytes: int = 0  # bytes processed (for MB/s)
    note: str = ""

    @property
    def t(self) -> float:
        return statistics.median(self.times)

    @property
    def peak(self) -> int:
        return max(self.rss) if self.rss else 0


TIME = shutil.which("time", path="/usr/bin:/bin")


def run_child(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    """Run ``cmd``; return (wall seconds, peak RSS bytes of that command). Raises on failure.

    The peak RSS comes from GNU ``time`` (``%M``): Linux keeps the high-water mark
    of the *process that exec'd* (here the benchmark's own ~60 MiB Python), so
    ``os.wait4`` on a direct child would report at least that; ``time`` forks the
    command from its own small process.  Without ``/usr/bin/time`` the wait4 figure
    is used (an upper bound; the document says so)."""
    rss_file = None
    if TIME:
        import tempfile

        fd, rss_file = tempfile.mkstemp(prefix="bench-rss-")
        os.close(fd)
        cmd = [TIME, "-f", "%M", "-o", rss_file, *cmd]
    try:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        err = p.stderr.read().decode(errors="replace") if p.stderr else ""
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {p.returncode}: {err.strip()[-2000:]}")
        rss = ru.ru_maxrss * 1024
        if rss_file:
            lines = Path(rss_file).read_text().split()
            rss = int(lines[-1]) * 1024
        return wall, rss
    finally:
        if rss_file:
            os.unlink(rss_file)


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def settle() -> None:
    """Write back every dirty page first (untimed), so that each run starts from the same
    state: otherwise a run pays for the writeback of the previous run's output."""
    os.sync()


def measure(row: Row, repeat: int, cmd: Callable[[], list[str]], before: Callable[[], None] | None = None,
            after: Callable[[], None] | None = None, log: Callable[[str], None] = print) -> Row:
    for i in range(repeat):
        if before:
            before()
        settle()
        t, r = run_child(cmd())
        if after:
            after()
        row.times.append(t)
        row.rss.append(r)
        log(f"  {row.label}: run {i + 1}/{repeat}: {t:.2f} s, peak RSS {r / 2**20:.0f} MiB")
    return row


def rm(*paths: Path) -> Callable[[], None]:
    def go() -> None:
        for p in paths:
            p.unlink(missing_ok=True)
    return go


# ---------------------------------------------------------------------------
# dequantizer throughput (in process)


def dequant_rates(gguf_path: Path, hrry_path: Path, threads: int | None, repeat: int,
                  max_bytes: int) -> list[dict[str, Any]]:
    import gguf as gpy

    from hurray_interop import dequant
    from hurray_interop.core.hrry import HrryFile
    from hurray_interop.formats import gguf as G

    out = []
    with G.read_gguf(gguf_path) as gf, HrryFile(hrry_path) as hf:
        for tname in DEQUANT_TYPES:
            cand = [t for t in gf.tensors if t.type_name == tname]
            if not cand:
                continue
            info = max(cand, key=lambda t: t.nbytes)
            rows = info.array()
            rows = rows.reshape(-1, rows.shape[-1])
            nrows = max(1, min(rows.shape[0], max_bytes // rows.strides[0]))
            raw = np.ascontiguousarray(rows[:nrows])
            qtype = gpy.GGMLQuantizationType[tname]
            tensor = hf.tensor(info.name)
            # our dequantizer works on a whole Hurray tensor; time it on the same first rows
            from hurray_interop.core.model import Tensor  # noqa: F401

            def ours() -> np.ndarray:
                return _dequant_rows(dequant, tensor, nrows, threads)

            def theirs() -> np.ndarray:
                return gpy.quants.dequantize(raw, qtype)

            a, b = ours(), theirs()  # warm up, and check they agree
            a, b = a.reshape(-1), b.reshape(-1).astype(np.float32)
            same = bool(np.array_equal(a, b))  # -0.0 == 0.0: GGML decodes the FP4 code -0 as +0
            bits = bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))
            del a, b
            t_ours = min(_timed(ours) for _ in range(repeat))
            t_theirs = min(_timed(theirs) for _ in range(repeat))
            out.append({"type": tname, "tensor": info.name, "bytes": raw.nbytes, "ours_s": t_ours,
                        "gguf_py_s": t_theirs, "equal": same, "bit_identical": bits})
            hf.release_pages()
            gf.release_pages()
    return out


def _dequant_rows(dequant: Any, tensor: Any, nrows: int, threads: int | None) -> np.ndarray:
    shape = tensor.descriptor.shape
    per_row = int(shape[-1])
    want = nrows * per_row
    parts = []
    got = 0
    for chunk in dequant.iter_dequantize(tensor, max_elements=want, threads=threads):
        arr = np.asarray(chunk[1] if isinstance(chunk, tuple) else chunk).reshape(-1)
        parts.append(arr[: want - got])
        got += parts[-1].size
        if got >= want:
            break
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------
# the document


def machine() -> dict[str, str]:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    try:
        from threadpoolctl import threadpool_info

        blas = ", ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})" for i in threadpool_info())
    except Exception:
        blas = "?"
    import gguf

    import hurray_interop

    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
    except OSError:
        rev = "?"
    return {
        "cpu": f"{cpu}, {os.cpu_count()} logical CPUs (affinity {len(os.sched_getaffinity(0))})",
        "memory": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "gguf-py": getattr(gguf, "__version__", None) or _dist_version("gguf"),
        "hurray-interop": f"{hurray_interop.__version__} (git {rev})",
        "coreutils cp": subprocess.run(["cp", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        "BLAS": blas,
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "(unset)"),
    }


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    try:
        return version(name)
    except Exception:
        return "?"


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f}"


def _ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}×" if base > 0 else "n/a"


def _spread(r: Row) -> str:
    if len(r.times) < 2:
        return ""
    return f"{min(r.times):.2f}–{max(r.times):.2f}"


def render(res: dict[str, Any], analysis: str) -> str:
    rows: dict[str, Row] = res["rows"]
    size = res["model"]["bytes"]
    cp, cps = rows["cp"].t, rows["cp_sync"].t
    L: list[str] = []
    w = L.append
    w("# Benchmarks")
    w("")
    w(f"Generated by `python3 bench/run.py {res['argv']}` on {res['date']}. "
      "Do not edit the tables by hand: rerun the script (the analysis section is kept).")
    w("")
    w("## Machine")
    w("")
    for k, v in res["machine"].items():
        w(f"- **{k}**: {v}")
    if not TIME:
        w("- **peak RSS**: /usr/bin/time missing: figures are wait4 upper bounds including ~60 MiB of the launcher")
    w(f"- **load average** before / after the run: {res['load_before']} / {res['load_after']} "
      "(other processes share the 2 cores; figures are medians of the repeats)")
    w("")
    m = res["model"]
    w("## Model")
    w("")
    w(f"Synthetic llama-shaped GGUF (`bench/synth.py`, seed {m['seed']}): {m['bytes']:,} bytes "
      f"({m['bytes'] / 2**30:.2f} GiB), {m['tensors']} tensors in {m['layers']} layers, n_embd {m['n_embd']}, "
      f"n_ff {m['n_ff']}, vocabulary {m['vocab']}; tensors per type: "
      + ", ".join(f"{k} {v}" for k, v in sorted(m["types"].items()))
      + ". Q4_0/Q4_1/Q8_0/MXFP4 codes are random bytes with well-formed scales; each block tensor "
      "has a run of all-zero blocks (zero scales, as gguf-py's quantizers write them).")
    w("")
    w("## Whole-file operations")
    w("")
    w(f"Each row: a fresh process, {res['repeat']} run(s), warm page cache. `cp` is the physical limit; our converters "
      "fsync their output before renaming it into place, so `cp + fsync` (`cp` then `sync FILE`) is the like-for-like "
      "baseline; both ratios are shown.")
    w("")
    w("| operation | wall s (median) | range | MB/s | × cp | × cp+fsync | peak RSS MiB | target | result |")
    w("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for r in rows.values():
        if r.key in INSPECT_ROWS:
            continue
        tgt, ok = res["targets"].get(r.key, ("", None))
        mbps = _mb(r.nbytes / r.t) if r.nbytes else ""
        w(f"| {r.label} | {r.t:.2f} | {_spread(r)} | {mbps} | {_ratio(r.t, cp)} | {_ratio(r.t, cps)} | "
          f"{r.peak / 2**20:,.0f} | {tgt} | {_verdict(ok)} |")
    w("")
    w(f"GGUF → Hurray → GGUF output identical to the source (cmp): **{'yes' if res['roundtrip_identical'] else 'NO'}**.")
    w("")
    w("## inspect (and the start-up floor)")
    w("")
    w("Short commands are dominated by starting Python and importing numpy; the first row measures that floor "
      "on this machine in this run.")
    w("")
    w("| operation | wall s (median) | range | peak RSS MiB | target | result |")
    w("|---|---:|---:|---:|---|---|")
    for r in rows.values():
        if r.key not in INSPECT_ROWS:
            continue
        tgt, ok = res["targets"].get(r.key, ("", None))
        w(f"| {r.label} | {r.t:.2f} | {_spread(r)} | {r.peak / 2**20:,.0f} | {tgt} | {_verdict(ok)} |")
    w("")
    w("## Dequantizer throughput")
    w("")
    w(f"Per type, the largest tensor of that type (at most {res['dequant_max_mb']} MB of GGUF input, its first rows), "
      f"best of {res['repeat']}; MB/s of GGUF input. Ours: `hurray_interop.dequant.iter_dequantize` on the converted "
      f"Hurray tensor (threads={res['threads']}); gguf-py: `gguf.quants.dequantize` on the GGUF blocks. "
      "`equal values`: both give the same float32 values (`yes, ±0`: equal, but GGML decodes the FP4 code −0 as "
      "+0 where OCP MXFP4, and so ours, keeps −0).")
    w("")
    w("| type | tensor | MB | ours MB/s | gguf-py MB/s | speed-up | equal values | target | result |")
    w("|---|---|---:|---:|---:|---:|---|---|---|")
    for d in res["dequant"]:
        sp = d["gguf_py_s"] / d["ours_s"]
        ok = sp >= 2.0
        w(f"| {d['type']} | `{d['tensor']}` | {_mb(d['bytes'])} | {_mb(d['bytes'] / d['ours_s'])} | "
          f"{_mb(d['bytes'] / d['gguf_py_s'])} | {sp:.2f}× | {('yes' if d['bit_identical'] else 'yes, ±0') if d['equal'] else 'NO'} | ≥ 2× | {_verdict(ok)} |")
    w("")
    w("## Targets")
    w("")
    goals = res["goals"]
    w(f"{sum(1 for g in goals if g[3])} of {len(goals)} targets met in this run (each judged on this run's own figures).")
    w("")
    w("| target | measured | goal | result |")
    w("|---|---|---|---|")
    for what, got, goal, ok in goals:
        w(f"| {what} | {got} | {goal} | {_verdict(ok)} |")
    w("")
    w(MARK_A)
    w(analysis.strip("\n") if analysis.strip() else "_(no analysis written yet)_")
    w(MARK_B)
    w("")
    return "\n".join(L)


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else ("**pass**" if ok else "**MISS**")


def old_analysis(doc: Path) -> str:
    try:
        text = doc.read_text()
    except OSError:
        return ""
    if MARK_A in text and MARK_B in text:
        return text.split(MARK_A, 1)[1].split(MARK_B, 1)[0]
    return ""


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="4GB", help="model size (e.g. 4GB, 64MB, 16MB)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out-dir", default=str(HERE / "out"), help="where the model and outputs go (git-ignored)")
    p.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    p.add_argument("--vocab", type=int, default=None,
                   help="tokens of the big-vocabulary inspect file (default 262144; 16384 below 1 GB)")
    p.add_argument("--threads", type=int, default=None, help="dequantizer threads (default: its own choice)")
    p.add_argument("--dequant-mb", type=int, default=64, help="bytes of GGUF input per dequantizer measurement")
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    p.add_argument("--json", help="also write the raw results here")
    a = p.parse_args(argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731

    size = synth.parse_size(a.size)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tag = a.size.replace(" ", "")
    src = out / f"synth-{tag}-s{a.seed}.gguf"
    cpy, hr, back, gp = (out / f"{src.stem}.{x}" for x in ("copy.gguf", "hrry", "back.gguf", "gguf-py.gguf"))
    vocab = a.vocab or (262144 if size >= 1_000_000_000 else 16384)
    vsrc = out / f"vocab{vocab}.gguf"
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    mach = machine()  # before the runs: the git revision measured

    t0 = time.perf_counter()
    model = synth.write(src, size, a.seed)
    model["seed"] = a.seed
    synth.write_big_vocab(vsrc, vocab, a.seed)
    log(f"generated {src} ({model['bytes']:,} bytes) and {vsrc} in {time.perf_counter() - t0:.1f} s")
    warm(src)
    nbytes = model["bytes"]
    R = a.repeat
    rows: dict[str, Row] = {}

    def add(key: str, label: str, cmd: list[str], n: int = nbytes, **kw: Any) -> Row:
        rows[key] = measure(Row(key, label, nbytes=n), kw.pop("repeat", R), lambda: cmd, log=log, **kw)
        return rows[key]

    try:
        # cp, and cp followed by an fsync of the copy
        rows["cp"] = Row("cp", "`cp` (physical limit)", nbytes=nbytes)
        rows["cp_sync"] = Row("cp_sync", "`cp` + fsync", nbytes=nbytes)
        for i in range(R):
            rm(cpy)()
            settle()
            t, r = run_child(["cp", str(src), str(cpy)])
            ts, _ = run_child(["sync", str(cpy)])
            rows["cp"].times.append(t)
            rows["cp"].rss.append(r)
            rows["cp_sync"].times.append(t + ts)
            rows["cp_sync"].rss.append(r)
            log(f"  cp: run {i + 1}/{R}: {t:.2f} s (+ fsync {ts:.2f} s)")
        rm(cpy)()
        add("gguf_py_rewrite", "gguf-py GGUFReader → GGUFWriter (no fsync)", GPY + ["rewrite", str(src), str(gp)],
            before=rm(gp))
        rm(gp)()
        add("startup", "start-up floor: `python3 -c 'import numpy'`", [PY, "-c", "import numpy"], n=0)
        add("to_hurray", "**ours: GGUF → Hurray**", CLI + ["convert", str(src), str(hr), "-q"], before=rm(hr))
        add("to_gguf", "**ours: Hurray → GGUF**", CLI + ["convert", str(hr), str(back), "-q"], before=rm(back))
        same = _same_file(src, back)
        rm(back)()
        add("gguf_py_dequant", "gguf-py: dequantize every tensor (`gguf.quants.dequantize`)",
            GPY + ["dequantize", str(src)])
        add("verify", "**ours: `verify` (round trip + byte and value compare)**", CLI + ["verify", str(src), "-q"])
        add("inspect_model", f"ours: `inspect` of the {model['bytes'] / 2**30:.2f} GiB model",
            CLI + ["inspect", str(src)], n=0)
        add("inspect_vocab", f"ours: `inspect` of a GGUF with a {vocab:,}-token vocabulary (+ merges)",
            CLI + ["inspect", str(vsrc)], n=0)
        add("gguf_py_read_vocab", f"gguf-py: `GGUFReader` of the same {vocab:,}-token file", GPY + ["read", str(vsrc)],
            n=0, repeat=1)
        log("dequantizer throughput …")
        deq = dequant_rates(src, hr, a.threads, R, a.dequant_mb << 20)
        for d in deq:
            log(f"  {d['type']}: ours {d['bytes'] / d['ours_s'] / 1e6:.0f} MB/s, gguf-py {d['bytes'] / d['gguf_py_s'] / 1e6:.0f} MB/s")
    finally:
        if not a.keep:
            rm(src, cpy, hr, back, gp, vsrc)()

    cp_t = rows["cp"].t
    cps_t = rows["cp_sync"].t
    small = size < 1_000_000_000
    deq_x = {d["type"]: d["gguf_py_s"] / d["ours_s"] for d in deq}
    t_h, t_g = rows["to_hurray"], rows["to_gguf"]
    # (what, measured, target, met)
    goals: list[tuple[str, str, str, bool]] = [
        ("GGUF → Hurray wall time", f"{t_h.t / cp_t:.2f}× cp ({t_h.t / cps_t:.2f}× cp+fsync)", "≤ 1.5× cp",
         t_h.t <= 1.5 * cp_t),
        ("Hurray → GGUF wall time", f"{t_g.t / cp_t:.2f}× cp ({t_g.t / cps_t:.2f}× cp+fsync)", "≤ 1.5× cp",
         t_g.t <= 1.5 * cp_t),
        ("GGUF → Hurray peak RSS", f"{t_h.peak / 2**20:,.0f} MiB", "≤ 512 MiB", t_h.peak <= 512 << 20),
        ("Hurray → GGUF peak RSS", f"{t_g.peak / 2**20:,.0f} MiB", "≤ 512 MiB", t_g.peak <= 512 << 20),
        ("GGUF → Hurray → GGUF output", "identical" if same else "DIFFERENT", "= source bytes", same),
        ("`verify` wall time", f"{rows['verify'].t / rows['gguf_py_dequant'].t:.2f}× gguf-py dequantize",
         "≤ 2× gguf-py dequantize", rows["verify"].t <= 2 * rows["gguf_py_dequant"].t),
    ]
    for tname in DEQUANT_TYPES:
        if tname in deq_x:
            goals.append((f"dequantizer {tname}", f"{deq_x[tname]:.2f}× gguf-py", "≥ 2× gguf-py", deq_x[tname] >= 2))
    goals.append((f"`inspect`, {vocab:,}-token vocabulary", f"{rows['inspect_vocab'].t:.2f} s", "≤ 0.5 s",
                  rows["inspect_vocab"].t <= 0.5))
    targets = {
        "to_hurray": ("≤ 1.5× cp; ≤ 512 MiB", goals[0][3] and goals[2][3]),
        "to_gguf": ("≤ 1.5× cp; ≤ 512 MiB; = source", goals[1][3] and goals[3][3] and same),
        "verify": ("≤ 2× gguf-py dequantize", goals[5][3]),
        "inspect_vocab": ("≤ 0.5 s", goals[-1][3]),
    }
    res = {
        "argv": " ".join(argv if argv is not None else sys.argv[1:]) or "(defaults)",
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": mach,
        "load_before": load_before,
        "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "model": model,
        "repeat": R,
        "rows": rows,
        "targets": targets,
        "goals": goals,
        "dequant": deq,
        "threads": a.threads if a.threads is not None else "default",
        "dequant_max_mb": a.dequant_mb,
        "small": small,
        "roundtrip_identical": same,
    }
    doc = Path(a.doc)
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(render(res, old_analysis(doc)))
    log(f"wrote {doc}")
    if a.json:
        Path(a.json).write_text(json.dumps({**res, "rows": {k: vars(v) for k, v in rows.items()}}, indent=2, default=str))
    return 0


def _same_file(a: Path, b: Path) -> bool:
    return subprocess.run(["cmp", "-s", str(a), str(b)]).returncode == 0


if __name__ == "__main__":
    sys.exit(main())
