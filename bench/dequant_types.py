"""Our shared dequantizer against ggml's own ``to_float``, per GGML type, one thread.

    python3 bench/dequant_types.py                    # every type, 4096 x 1024 weights each, 5 rounds
    python3 bench/dequant_types.py --types Q4_0 Q4_K --rows 1024 --repeat 3
    python3 bench/dequant_types.py --write            # ... and puts the table into docs/benchmarks.md

One GGUF holds one tensor per type, quantized by ggml's own quantizer (``ggml_quantize_chunk`` of
``libggml-python``, the weights of bench/forms.py) and written with gguf-py; ``convert --fallback
exact`` imports it (each type in the form the converter chooses: plain, per-block affine, MXFP,
or the compact/expanded exact forms).  Per type, in one process, interleaved rounds (medians):

* ``ggml``: ``to_float`` of the tensor's blocks into a float32 window of 1 Mi values at a time
  (:func:`hurray_interop.formats.gguf_ggml.decode_blocks`, what ``verify --oracle ggml`` runs);
* ``ours``: :func:`hurray_interop.dequant.windows` of the imported tensor (its validation
  included), each window filled on the calling thread into one reused buffer, as ggml's is
  (verify's value check fills its thread's buffer -- or, on the compiled path, compares each
  chunk as it is computed and writes no window at all);
* both outputs compared bit for bit (the table says so; a mismatch is an error).

Throughput is in million values per second; ``ratio`` is ours / ggml (target >= 0.5).
``HURRAY_INTEROP_KERNEL=numpy`` measures the numpy path.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "fixtures"))

DOC = ROOT / "docs" / "benchmarks.md"
HEADING = "## Dequantizer per type against ggml"
TYPES = ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
         "Q6_K", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
         "IQ1_S", "IQ1_M")
#: values per window: the window verify's value check compares (verification/common.py)
WINDOW = 1 << 20


def write_gguf(path: Path, types: list[str], rows: int, cols: int, seed: int) -> None:
    import gguf
    from gguf import GGMLQuantizationType as Q

    import forms
    from make_kquant_fixtures import ggml_base

    lib, _ = ggml_base()
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    for t in types:
        x = forms.weights(rng, rows, cols)
        if t in ("F16", "BF16"):
            data = x.astype(np.float16) if t == "F16" else (x.view(np.uint32) >> 16).astype(np.uint16)
            w.add_tensor(t, data if t == "F16" else data.view(np.uint8).reshape(rows, -1), raw_dtype=Q[t])
            continue
        tid = int(Q[t])
        if lib.ggml_quantize_requires_imatrix(tid):
            lib.ggml_quantize_init(tid)
        out = np.zeros((rows, lib.ggml_row_size(tid, cols)), dtype=np.uint8)
        im = np.ones(cols, np.float32)
        n = lib.ggml_quantize_chunk(tid, x.ctypes.data, out.ctypes.data, 0, rows, cols,
                                    im.ctypes.data if lib.ggml_quantize_requires_imatrix(tid) else None)
        assert n == out.size, t
        w.add_tensor(t, out, raw_dtype=Q[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def ggml_pass(view: np.ndarray, ggml_type: int, block_elems: int, out: np.ndarray) -> float:
    """to_float over the tensor's blocks, window by window; returns a checksum-free time."""
    from hurray_interop.formats import gguf_ggml

    per = WINDOW // block_elems
    t0 = time.perf_counter()
    for i in range(0, view.shape[0], per):
        blk = view[i : i + per]
        gguf_ggml.decode_blocks(ggml_type, block_elems, view.shape[1], blk, out[: blk.shape[0] * block_elems])
    return time.perf_counter() - t0


def ours_pass(tensor, out: np.ndarray) -> float:
    from hurray_interop.dequant import windows

    t0 = time.perf_counter()
    w = windows(tensor, max_elements=WINDOW)  # validation included, as verify pays it
    for _, n, region in w.spans():
        w.fill(region, out[:n])
    return time.perf_counter() - t0


def same(tensor, view, ggml_type, block_elems) -> bool:
    from hurray_interop.dequant import iter_dequantize
    from hurray_interop.formats import gguf_ggml

    pos = 0
    flat = view.reshape(-1)
    for _, values in iter_dequantize(tensor, max_elements=WINDOW, threads=1):
        v = values.reshape(-1)
        nb = v.size // block_elems
        ref = np.empty(v.size, np.float32)
        bb = view.shape[1]
        gguf_ggml.decode_blocks(ggml_type, block_elems, bb, flat[pos * bb : (pos + nb) * bb].reshape(nb, bb), ref)
        pos += nb
        if not np.array_equal(v.view(np.uint32), ref.view(np.uint32)):
            return False
    return True


def measure(a: argparse.Namespace, work: Path) -> list[dict]:
    import gguf

    from hurray_interop.core import hrry

    src, dst = work / "types.gguf", work / "types.hrry"
    write_gguf(src, a.types, a.rows, a.cols, a.seed)
    subprocess.run([sys.executable, "-m", "hurray_interop", "convert", str(src), str(dst), "--fallback", "exact", "-q"], check=True)
    reader = gguf.GGUFReader(str(src))
    f = hrry.open_hrry(dst)
    rows = []
    for t in reader.tensors:
        name = t.name
        ggml_type = int(t.tensor_type)
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[t.tensor_type]
        view = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1, block_bytes)
        tensor = f.tensor(name)
        out = np.empty(WINDOW, np.float32)
        ok = same(tensor, view, ggml_type, block_elems)
        g, o = [], []
        for _ in range(a.repeat):
            g.append(ggml_pass(view, ggml_type, block_elems, out))
            o.append(ours_pass(tensor, out))
        n = int(t.n_elements)
        gm, om = statistics.median(g), statistics.median(o)
        rows.append({"type": name, "form": form_of(f, name), "n": n, "ggml": n / gm / 1e6, "ours": n / om / 1e6,
                     "ratio": gm / om, "same": ok})
        print(f"{name:8s} {rows[-1]['form']:28s} ggml {rows[-1]['ggml']:7.0f} Me/s  ours {rows[-1]['ours']:7.0f} Me/s"
              f"  ratio {rows[-1]['ratio']:.2f}  {'identical' if ok else 'DIFFERENT'}", flush=True)
    return rows


def form_of(f, name: str) -> str:
    """The construct of the imported tensor: scheme/storage, or the composite and its members."""
    from hurray_interop.core.model import CompositeHead

    t = f.tensor(name)
    d = t.descriptor

    def one(d) -> str:
        q = d.quantization
        s = d.element_type.name
        return f"{type(q).__name__}/{s}" if q is not None else s

    if isinstance(d.layout, CompositeHead):
        return "overlay(" + ", ".join(one(m.descriptor) for m in t.members) + ")"
    return one(d)


def render(rows: list[dict], a: argparse.Namespace) -> list[str]:
    from hurray_interop import kernels

    L = [HEADING, "",
         f"`python3 bench/dequant_types.py` ({a.rows}×{a.cols} weights per type, one thread, windows of "
         f"{WINDOW} values, medians of {a.repeat} interleaved rounds, kernel `{kernels.KERNEL}`). Million values "
         "per second; ratio = ours / ggml's `to_float` (libggml-python's build); `same` = bit-identical output.", "",
         "| type | imported form | ggml Me/s | ours Me/s | ratio | same |", "|---|---|---:|---:|---:|---|"]
    for r in rows:
        L.append(f"| {r['type']} | `{r['form']}` | {r['ggml']:.0f} | {r['ours']:.0f} | {r['ratio']:.2f} | "
                 f"{'yes' if r['same'] else 'NO'} |")
    return L + [""]


def write_doc(lines: list[str]) -> None:
    """Put the section into docs/benchmarks.md's analysis part (which bench/run.py keeps),
    replacing this script's earlier section."""
    end_mark = "<!-- /analysis -->"
    text = DOC.read_text(encoding="utf-8")
    start = text.find(HEADING)
    if start >= 0:
        ends = [i for i in (text.find("\n## ", start + len(HEADING)), text.find(end_mark, start)) if i >= 0]
        end = min(ends) if ends else len(text)
        text = text[:start] + text[end:].lstrip("\n")
    at = text.find(end_mark)
    block = "\n".join(lines).rstrip("\n") + "\n\n"
    text = text[:at] + block + text[at:] if at >= 0 else text.rstrip("\n") + "\n\n" + block
    DOC.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--types", nargs="+", default=list(TYPES))
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--seed", type=int, default=23)
    p.add_argument("--write", action="store_true")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hi-dqt-") as d:
        rows = measure(a, Path(d))
    lines = render(rows, a)
    print("\n".join(lines))
    if a.write:
        write_doc(lines)
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
