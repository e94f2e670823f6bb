"""The exact forms the converter writes, measured on llama-quantize-like models.

    python3 bench/forms.py                        # every model, 5 interleaved rounds; prints the tables
    python3 bench/forms.py --write --label before # ... and puts them into docs/benchmarks.md
    python3 bench/forms.py --models q4_1 q4_0 --layers 1 --repeat 1   # a quick look

Models (seeded; weights Gaussian with Student-t rows (ν = 3) and a few all-zero rows, quantized by
ggml's own quantizer, ``ggml_quantize_chunk`` of ``libggml-python``, written with gguf-py's
``GGUFWriter``; norms F32):

* ``q4_k_m`` — llama-3-8B's Q4_K_M proportions scaled down: token embedding, output and half of
  the layers' ``ffn_down`` / ``attn_v`` Q6_K (about 19 % of the weights), the rest Q4_K;
* ``small_q6`` — a small llama whose embedding and output (47 % of the weights) are Q6_K, the
  rest Q4_K;
* pure-type models of the ``q4_k_m`` shape: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, Q4_1, Q5_1,
  Q5_0, Q4_0.

For each: the GGUF's and the .hrry's size (``convert``; with ``--fallback exact`` when the default
refuses), and per GGML type, read back from the .hrry (nothing assumed about the forms): the
construct (composite rule, member storages, ``bcast`` for a member whose strides are all 0),
bits per weight of data (every descriptor buffer of the tensor and its members) and of the
record (the ``hurray_interop.*`` KV entries naming the tensor: key and value bytes). Then the
import and the export wall time against the Q4_0 conversion of the model of the same shape
(each command in a fresh process after a durable copy of its input, as bench/run.py does;
medians of interleaved rounds), and whether the export is the source byte for byte.
"""

from __future__ import annotations

import argparse
import datetime
import filecmp
import json
import shlex
import statistics
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "fixtures"))

import run  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
HEADING = "## Compact exact forms"
PURE = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "Q4_1", "Q5_1", "Q5_0", "Q4_0")


@dataclass(frozen=True)
class Shape:
    """A llama: ``layers`` blocks of attention (GQA: ``kv`` columns of K/V) and a gated FFN."""

    layers: int
    dim: int
    kv: int
    ffn: int
    vocab: int

    def tensors(self) -> list[tuple[str, tuple[int, int]]]:
        """(name, (rows, cols)) of every matrix, GGUF order; norms are added by the writer."""
        out = [("token_embd.weight", (self.vocab, self.dim))]
        for i in range(self.layers):
            d, kv, f = self.dim, self.kv, self.ffn
            out += [(f"blk.{i}.attn_q.weight", (d, d)), (f"blk.{i}.attn_k.weight", (kv, d)),
                    (f"blk.{i}.attn_v.weight", (kv, d)), (f"blk.{i}.attn_output.weight", (d, d)),
                    (f"blk.{i}.ffn_gate.weight", (f, d)), (f"blk.{i}.ffn_up.weight", (f, d)),
                    (f"blk.{i}.ffn_down.weight", (d, f))]
        return out + [("output.weight", (self.vocab, self.dim))]


def shapes(layers: int) -> dict[str, Shape]:
    """``llama``: llama-3-8B's ratios (dim : kv : ffn = 4 : 1 : 14) with a vocabulary that puts
    about 19 % of the weights in Q6_K under the Q4_K_M rule; ``small``: embedding + output 47 %."""
    return {"llama": Shape(layers, 1024, 256, 3584, 384 * layers), "small": Shape(layers, 512, 128, 1536, 2624 * layers)}


def q4_k_m_type(name: str, layer_count: int) -> str:
    """The mix of the ``q4_k_m`` model: Q6_K for the embedding, the output and the
    ``ffn_down`` / ``attn_v`` of every other layer; Q4_K elsewhere."""
    if name in ("token_embd.weight", "output.weight"):
        return "Q6_K"
    if name.endswith(("ffn_down.weight", "attn_v.weight")) and int(name.split(".")[1]) % 2 == 0:
        return "Q6_K"
    return "Q4_K"


def models(layers: int) -> dict[str, tuple[Shape, object]]:
    """name → (shape, tensor name → GGML type)."""
    sh = shapes(layers)
    out: dict[str, tuple[Shape, object]] = {
        "q4_k_m": (sh["llama"], lambda n: q4_k_m_type(n, layers)),
        "small_q6": (sh["small"], lambda n: "Q6_K" if n in ("token_embd.weight", "output.weight") else "Q4_K"),
        "small_q4_0": (sh["small"], lambda n: "Q4_0"),
    }
    for t in PURE:
        out[t.lower()] = (sh["llama"], lambda n, t=t: t)
    return out


def weights(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Gaussian rows, one in eight Student-t (ν = 3), one in 97 all zero; a typical 0.02 scale."""
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    t_rows = rng.random(rows) < 0.125
    x[t_rows] = rng.standard_t(3, size=(int(t_rows.sum()), cols)).astype(np.float32)
    x[::97] = 0.0
    return np.ascontiguousarray(x * np.float32(0.02))


def write_model(path: Path, shape: Shape, type_of, seed: int) -> int:
    """Quantize and write one model; returns the number of weights."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from make_kquant_fixtures import ggml_base

    lib, _ = ggml_base()
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    n = 0
    for name, (rows, cols) in shape.tensors():
        x = weights(rng, rows, cols)
        t = int(Q[type_of(name)])
        out = np.zeros((rows, lib.ggml_row_size(t, cols)), dtype=np.uint8)
        imatrix = np.ones(cols, np.float32)
        im = imatrix.ctypes.data if lib.ggml_quantize_requires_imatrix(t) else None
        assert lib.ggml_quantize_chunk(t, x.ctypes.data, out.ctypes.data, 0, rows, cols, im) == out.size
        w.add_tensor(name, out, raw_dtype=Q[type_of(name)])
        n += rows * cols
        if name.endswith("attn_output.weight") or name.endswith("ffn_down.weight"):
            norm = "attn_norm" if "attn" in name else "ffn_norm"
            w.add_tensor(name.replace(name.split(".")[2] + ".weight", f"{norm}.weight"), np.ones(shape.dim, np.float32))
    w.add_tensor("output_norm.weight", np.ones(shape.dim, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n


# ---------------------------------------------------------------------------
# reading the forms back


def construct(f, name: str) -> str:
    """A tensor's construct from its descriptors: ``uint4``, ``overlay[uint4 + uint8·bcast]``,
    ``partition[2× overlay[…], …]``."""
    from hurray_interop.core.model import RULE_NAMES, Strided

    d = f.descriptor(name)
    if not d.is_composite:
        label = d.element_type.name
        if isinstance(d.layout, Strided):
            label += "·bcast" if all(s == 0 for s in d.layout.strides) else "·strided"
        return label
    parts = Counter(construct(f, m) for m in f.member_names(name))
    rule = RULE_NAMES.get(d.layout.composition_rule, str(d.layout.composition_rule))
    if rule == "overlay":
        return f"overlay[{' + '.join(construct(f, m) for m in f.member_names(name))}]"
    return f"{rule}[{', '.join((f'{k}× ' if k > 1 else '') + p for p, k in parts.most_common())}]"


def data_bytes(f, name: str) -> int:
    return sum(b.byte_size for b in f.descriptor(name).buffers) + sum(data_bytes(f, m) for m in f.member_names(name))


def record_bytes(kv: dict, names: set[str]) -> dict[str, int]:
    """Bytes of the ``hurray_interop.*`` entries naming a tensor (key + value), by tensor: the
    longest run of the key's dot-separated parts that is a tensor name."""
    out: dict[str, int] = defaultdict(int)
    for key, value in kv.items():
        if not key.startswith("hurray_interop."):
            continue
        parts = key.split(".")
        hit = next((".".join(parts[i:j]) for i in range(1, len(parts)) for j in range(len(parts), i, -1)
                    if ".".join(parts[i:j]) in names), None)
        if hit is not None:
            v = value.value
            out[hit] += len(key) + (len(v) if isinstance(v, (bytes, bytearray, memoryview, str)) else 8)
    return out


def forms(hrry: Path) -> dict[str, dict]:
    """Per GGML type: weights, data bytes, record bytes, constructs (most common first)."""
    from hurray_interop.core.hrry import HrryFile

    by_type: dict[str, dict] = defaultdict(lambda: {"n": 0, "data": 0, "record": 0, "constructs": Counter()})
    with HrryFile(hrry) as f:
        kv = f.kv
        layout = json.loads(kv["hurray_interop.gguf.tensors"].value)
        names = {row[0] for row in layout}
        rec = record_bytes(kv, names)
        for name, ggml_type, ne, _ in layout:
            e = by_type[ggml_type]
            e["n"] += int(np.prod(ne))
            e["data"] += data_bytes(f, name)
            e["record"] += rec.get(name, 0)
            e["constructs"][construct(f, name)] += 1
    return dict(by_type)


# ---------------------------------------------------------------------------
# the conversions


@dataclass
class Result:
    model: str
    shape: str
    weights: int
    gguf: int = 0
    hrry: int = 0
    fallback: bool = False
    identical: bool = True
    imports: list[float] = field(default_factory=list)
    exports: list[float] = field(default_factory=list)
    types: dict[str, dict] = field(default_factory=dict)


def needs_exact(src: Path, dst: Path) -> bool:
    """Whether the default ``convert`` refuses the model (then ``--fallback exact``)."""
    p = subprocess.run([*run.CLI, "convert", str(src), str(dst), "--dry-run", "-q"], env=run.CHILD_ENV,
                       capture_output=True, text=True)
    return p.returncode != 0


def convert_rounds(results: dict[str, Result], paths: dict[str, Path], repeat: int) -> None:
    """Interleaved rounds: per model a durable copy of the GGUF, the import, a durable copy of
    the .hrry, the export; the copies are untimed here (they put both inputs in the same state)."""
    for i in range(repeat):
        for key, r in results.items():
            src = paths[key]
            mid, back, tmp = src.with_suffix(".hrry"), src.with_suffix(".back.gguf"), src.with_suffix(".copy")
            extra = ["--fallback", "exact"] if r.fallback else []
            run.run_child(run.durable_copy(src, tmp))
            run.settle()
            r.imports.append(run.run_child([*run.CLI, "convert", str(src), str(mid), "-q", "--force", *extra],
                                           env=run.CHILD_ENV)[0])
            tmp.unlink()
            run.run_child(run.durable_copy(mid, tmp))
            run.settle()
            r.exports.append(run.run_child([*run.CLI, "convert", str(mid), str(back), "-q", "--force"],
                                           env=run.CHILD_ENV)[0])
            tmp.unlink()
            r.identical &= filecmp.cmp(src, back, shallow=False)
            print(f"  round {i + 1}/{repeat}: {key}: import {r.imports[-1]:.2f} s, export {r.exports[-1]:.2f} s",
                  file=sys.stderr)


def measure(a: argparse.Namespace) -> list[Result]:
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = models(a.layers)
    chosen = list(a.models or table)
    for base in ("q4_0", "small_q4_0"):  # the yardsticks of each shape
        if base not in chosen and any(table[m][0] == table[base][0] for m in chosen):
            chosen.append(base)
    results: dict[str, Result] = {}
    paths: dict[str, Path] = {}
    for k, key in enumerate(chosen):
        shape, type_of = table[key]
        paths[key] = out / f"forms-{key}.gguf"
        shape_name = next(n for n, s in shapes(a.layers).items() if s == shape)
        results[key] = Result(key, shape_name, write_model(paths[key], shape, type_of, a.seed + k))
        results[key].gguf = paths[key].stat().st_size
        results[key].fallback = needs_exact(paths[key], paths[key].with_suffix(".hrry"))
        print(f"wrote {paths[key].name}: {results[key].gguf:,} bytes", file=sys.stderr)
    convert_rounds(results, paths, a.repeat)
    for key, r in results.items():
        r.hrry = paths[key].with_suffix(".hrry").stat().st_size
        r.types = forms(paths[key].with_suffix(".hrry"))
        if not a.keep:
            for p in (paths[key], paths[key].with_suffix(".hrry"), paths[key].with_suffix(".back.gguf")):
                p.unlink(missing_ok=True)
    return list(results.values())


# ---------------------------------------------------------------------------
# the tables


def _commit() -> str:
    p = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h"], capture_output=True, text=True)
    return p.stdout.strip() or "unknown"


def render(results: list[Result], a: argparse.Namespace) -> list[str]:
    L = [f"### {a.label}" if a.label else "### Measured", "",
         f"`python3 bench/forms.py {shlex.join(a.argv)}` at commit {_commit()}, {datetime.date.today()}; kernel "
         f"{run._kernel()}; {a.repeat} interleaved round(s), medians; weights per model: "
         + ", ".join(sorted({f'{r.shape} {r.weights:,}' for r in results})) + ".", "",
         "| model | GGUF bytes | .hrry bytes | .hrry / GGUF | convert | import s (× Q4_0) | export s (× Q4_0) | "
         "export identical |", "|---|---|---|---|---|---|---|---|"]
    base = {r.shape: r for r in results if r.model in ("q4_0", "small_q4_0")}
    for r in results:
        b = base.get(r.shape)
        ti, te = statistics.median(r.imports), statistics.median(r.exports)
        bi, be = (statistics.median(b.imports), statistics.median(b.exports)) if b else (ti, te)
        L.append(f"| {r.model} | {r.gguf:,} | {r.hrry:,} | {r.hrry / r.gguf:.2f} | "
                 f"{'--fallback exact' if r.fallback else 'default'} | {ti:.2f} ({ti / bi:.2f}×) | "
                 f"{te:.2f} ({te / be:.2f}×) | {'yes' if r.identical else 'NO'} |")
    L += ["", "Per GGML type (bits per weight, read back from the .hrry; the construct most tensors of the type use, "
          "with how many of them):", "",
          "| model | type | share of weights | construct | tensors | bpw GGUF | bpw data | bpw record | bpw total |",
          "|---|---|---|---|---|---|---|---|---|"]
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

    for r in results:
        quantized = sum(e["n"] for t, e in r.types.items() if t not in ("F32", "F16"))
        for t, e in sorted(r.types.items()):
            if t in ("F32", "F16"):
                continue
            bs, ts = GGML_QUANT_SIZES[Q[t]]
            (c, k), total = e["constructs"].most_common(1)[0], sum(e["constructs"].values())
            more = f" (+{len(e['constructs']) - 1} other)" if len(e["constructs"]) > 1 else ""
            L.append(f"| {r.model} | {t} | {100 * e['n'] / quantized:.1f} % | `{c}`{more} | {k}/{total} | {8 * ts / bs:.3f} | {8 * e['data'] / e['n']:.3f} | "
                     f"{8 * e['record'] / e['n']:.3f} | {8 * (e['data'] + e['record']) / e['n']:.3f} |")
    return L + [""]


def write_doc(doc: Path, lines: list[str], label: str) -> None:
    """Put the tables into the doc's hand-written part (kept by bench/run.py) under
    :data:`HEADING`: this label's subsection replaced, the others kept."""
    text = doc.read_text()
    head, rest = text.split(run.MARK_B, 1) if run.MARK_B in text else (text, "")
    block = "\n".join(lines)
    if HEADING not in head:
        intro = ("Written by `bench/forms.py --write` (one subsection per `--label`; a re-run replaces "
                 "its own label's subsection). What the forms are: docs/conversion-rules.md § 11.")
        head = head.rstrip("\n") + f"\n\n{HEADING}\n\n{intro}\n\n"
    before, after = head.split(HEADING, 1)
    sub = f"\n### {label}\n"
    body = after
    if sub in body:
        pre, post = body.split(sub, 1)
        pre += "\n"
        nxt = post.find("\n### ")
        nxt2 = post.find("\n## ")
        ends = [x for x in (nxt, nxt2) if x >= 0]
        post = post[min(ends) + 1 :] if ends else ""
        body = pre + block + "\n" + post
    else:
        cut = body.find("\n## ")
        body = (body.rstrip("\n") + "\n\n" + block + "\n") if cut < 0 else body[:cut].rstrip("\n") + "\n\n" + block + body[cut:]
    doc.write_text(before + HEADING + body.rstrip("\n") + "\n" + ("\n" + run.MARK_B + rest if run.MARK_B in text else ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", help=f"default: all ({', '.join(models(1))})")
    p.add_argument("--layers", type=int, default=4, help="llama blocks per model (default 4)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--seed", type=int, default=20261202)
    p.add_argument("--out-dir", default=str(HERE / "out"))
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    p.add_argument("--write", action="store_true", help=f"put the tables into {DOC.relative_to(ROOT)}")
    p.add_argument("--label", default="", help="the subsection title (e.g. 'before', 'after')")
    p.add_argument("--doc", default=str(DOC))
    a = p.parse_args(argv)
    a.argv = sys.argv[1:] if argv is None else argv
    unknown = set(a.models or ()) - set(models(1))
    if unknown:
        p.error(f"unknown models: {', '.join(sorted(unknown))}")
    lines = render(measure(a), a)
    print("\n".join(lines))
    if a.write:
        write_doc(Path(a.doc), lines, a.label or "Measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
