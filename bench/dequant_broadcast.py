"""Our dequantizer on the compact forms' overlay: a broadcast minimum against a per-element one.

    python3 bench/dequant_broadcast.py                 # 4096×4096, 7 interleaved rounds
    python3 bench/dequant_broadcast.py --rows 1024 --repeat 3

Builds, in memory, the overlay of a Q4_1-like tensor (docs/conversion-rules.md § 11): a
row-major uint4 base (float16 scales, blocks of 32) plus the minimum member as

* ``broadcast``: per-block affine uint8, strides all 0, a one-byte code buffer (the compact form);
* ``uint2``: per-block affine uint2, row-major, code 1 for every element (the form of § 3a);

and times ``dequantize`` of each (fresh output each call; medians of interleaved rounds, one
thread and the default threads), after checking that both give the same float32 bits; and the
peak of what numpy allocates during one call into a given output (tracemalloc: the work
buffers and temporaries, not the 64 MiB of values). Run it
with ``PYTHONPATH`` pointing at another checkout to measure that checkout's dequantizer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

if "PYTHONPATH" not in os.environ:  # this checkout, unless told which
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hurray_interop.core.elements import element_type, pack  # noqa: E402
from hurray_interop.core.model import (  # noqa: E402
    OP_ADD,
    ROLE_BASE,
    ROLE_CORRECTION,
    RULE_OVERLAY,
    BufferHandle,
    CompositeHead,
    CompositeMember,
    Descriptor,
    PerBlockAffine,
    RowMajor,
    Shard,
    Strided,
    Tensor,
)
from hurray_interop.dequant import dequantize  # noqa: E402

K = 32


def _member(name, storage, shape, codes: np.ndarray, scales: np.ndarray, layout, role) -> Tensor:
    q = PerBlockAffine(axis=1, block_size=K, scale_buffer_index=1, scale_type=element_type("float16"))
    bufs = (codes, scales.view(np.uint8))
    desc = Descriptor(element_type(storage), shape, tuple(BufferHandle.cpu(b.size) for b in bufs), layout=layout,
                      quantization=q, shard=Shard(parent_shape=shape, offset=(0, 0)),
                      composite_member=CompositeMember(role))
    return Tensor(name, desc, bufs)


def build(rows: int, cols: int, seed: int = 0) -> dict[str, Tensor]:
    """The two overlays, sharing the base and the minimum's scales."""
    rng = np.random.default_rng(seed)
    shape = (rows, cols)
    blocks = rows * cols // K
    d = (rng.random(blocks) * 0.01 + 1e-4).astype(np.float16)
    m = (rng.standard_normal(blocks) * 0.05).astype(np.float16)
    m[m == 0] = np.float16(0.25)
    base = _member("base", "uint4", shape, pack(rng.integers(0, 16, rows * cols).astype(np.uint8), "uint4"), d,
                   RowMajor(), ROLE_BASE)
    minima = {
        "broadcast": _member("minimum", "uint8", shape, np.array([1], np.uint8), m, Strided((0, 0)), ROLE_CORRECTION),
        "uint2": _member("minimum", "uint2", shape, np.full(rows * cols // 4, 0x55, np.uint8), m, RowMajor(),
                         ROLE_CORRECTION),
    }
    head = Descriptor(element_type("float32"), shape, (),
                      layout=CompositeHead(composition_rule=RULE_OVERLAY, combine_op=OP_ADD, member_count=2))
    return {k: Tensor("w", head, members=(base, mm)) for k, mm in minima.items()}


def measure(rows: int, cols: int, repeat: int) -> list[tuple[str, int | None, float, float, float, int]]:
    forms = build(rows, cols)
    ref = dequantize(forms["uint2"])
    got = dequantize(forms["broadcast"])
    if not np.array_equal(ref.view(np.uint32), got.view(np.uint32)):
        raise SystemExit("the two forms disagree")
    times: dict[tuple[str, int | None], list[float]] = {(f, th): [] for f in forms for th in (1, None)}
    for _ in range(repeat):  # A B A B: a busy phase of the shared machine spreads over both rows
        for (f, th), ts in times.items():
            t0 = time.perf_counter()
            dequantize(forms[f], threads=th)
            ts.append(time.perf_counter() - t0)
    return [(f, th, statistics.median(ts), min(ts), max(ts), sum(b.size for b in forms[f].members[1].data),
             _temporaries(forms[f], th)) for (f, th), ts in times.items()]


def _temporaries(t: Tensor, threads: int | None) -> int:
    """Peak bytes numpy allocated during one call beyond the output itself (tracemalloc)."""
    out = np.empty(t.descriptor.shape, np.float32)
    tracemalloc.start()
    dequantize(t, out=out, threads=threads)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args(argv)
    rows = measure(a.rows, a.cols, a.repeat)
    n = a.rows * a.cols
    print(f"{a.rows}×{a.cols} overlay (uint4 base + minimum), float32 values; {a.repeat} interleaved rounds, "
          "median (min–max)")
    print("| minimum member | its bytes | threads | dequantize s | M values/s | peak temporaries |")
    print("|---|---|---|---|---|---|")
    for f, th, med, lo, hi, stored, temp in rows:
        print(f"| {f} | {stored:,} | {th or 'default'} | {med:.3f} ({lo:.3f}–{hi:.3f}) | {n / med / 1e6:.0f} | "
              f"{temp / 2**20:.1f} MiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
