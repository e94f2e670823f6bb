"""A seeded, llama-shaped synthetic GGUF of a chosen size, written fast.

Nothing is quantized: block codes are random bytes and the scale fields are
overwritten with well-formed values (float16 scales in [2^-10, 2^-4], E8M0
exponents 118..130), so a 4 GB file takes seconds, not hours.  Every block type
also gets a run of all-zero blocks as gguf-py's quantizers write them (scale 0,
the zero code; Q4_1 with a zero minimum), which exercise the importer's zero-block paths.

The mix per layer (llama layout, ``blk.N.*``):

    attn_q, attn_k   Q4_0        attn_v     Q8_0       attn_output Q4_1
    ffn_gate         MXFP4       ffn_up     Q4_0       ffn_down    Q8_0
    attn_norm, ffn_norm F32

plus ``token_embd`` (F16), ``output_norm`` (F32) and ``output`` (Q8_0), and
llama tokenizer metadata (``tokenizer.ggml.tokens`` / ``scores`` / ``token_type``).

Other mixes (``--mix``, :data:`MIXES`): ``q4_k_m`` -- llama.cpp's Q4_K_M layout (Q4_K
everywhere but Q6_K for attn_v, ffn_down and output; F32 norms) with well-formed random
super-blocks (f16 d/dmin in [2^-10, 2^-4], every 6-bit sub-block scale non-zero), the
input of ``--fallback exact`` (bench/exact.py); ``q4_0`` -- the same layout all Q4_0, its
baseline of the same size.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hurray_interop.formats import gguf as G  # noqa: E402

V = G.ValueType

#: GGML block types: (block bytes, [(offset, kind)] scale fields)
BLOCKS = {
    "Q4_0": (18, [(0, "f16")]),
    "Q8_0": (34, [(0, "f16")]),
    "Q4_1": (20, [(0, "f16"), (2, "f16m")]),
    "MXFP4": (17, [(0, "e8m0")]),
    # K-quants: super-blocks of 256 elements; "sc4k"/"sc6k": make every sub-block scale non-zero
    "Q4_K": (144, [(0, "f16"), (2, "f16"), (4, "sc4k")]),
    "Q6_K": (210, [(208, "f16"), (192, "sc6k")]),
}
ELEMENTS = {"Q4_K": 256, "Q6_K": 256}  # elements per block (others: 32)

LAYER = [
    ("attn_q", "Q4_0", "dd"),
    ("attn_k", "Q4_0", "dd"),
    ("attn_v", "Q8_0", "dd"),
    ("attn_output", "Q4_1", "dd"),
    ("ffn_gate", "MXFP4", "fd"),
    ("ffn_up", "Q4_0", "fd"),
    ("ffn_down", "Q8_0", "df"),
]

#: other layer mixes: layer tensor -> type, and the types of token_embd / output
MIXES = {
    "q4_k_m": ({"attn_v": "Q6_K", "ffn_down": "Q6_K", None: "Q4_K"}, "Q4_K", "Q6_K"),
    "q4_0": ({None: "Q4_0"}, "Q4_0", "Q4_0"),
}

GGML_ID = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14, "MXFP4": 39}

CHUNK = 32 << 20


def parse_size(s: str) -> int:
    s = s.strip().upper()
    for suffix, mul in (("GB", 10**9), ("GIB", 1 << 30), ("MB", 10**6), ("MIB", 1 << 20), ("KB", 10**3)):
        if s.endswith(suffix):
            return int(float(s[: -len(suffix)]) * mul)
    return int(s)


def _nbytes(t: str, n: int) -> int:
    if t in BLOCKS:
        return n // ELEMENTS.get(t, 32) * BLOCKS[t][0]
    return n * (2 if t == "F16" else 4)


def dims_for(size: int) -> tuple[int, int, int]:
    """(n_embd, n_ff, n_vocab) for a target file size."""
    if size >= 1_000_000_000:
        return 4096, 11008, 32000
    if size >= 200_000_000:
        return 2048, 5632, 32000
    if size >= 40_000_000:
        return 1024, 2816, 16000
    return 256, 704, 4000


def plan(size: int, mix: str = "default") -> tuple[list[tuple[str, str, tuple[int, ...]]], int]:
    """The tensor list ``[(name, type, numpy shape)]`` and the vocabulary size."""
    e, f, v = dims_for(size)
    dim = {"d": e, "f": f}
    layer, embd, output = ([(n, t, s) for n, t, s in LAYER], "F16", "Q8_0") if mix == "default" else (
        [(n, MIXES[mix][0].get(n, MIXES[mix][0][None]), s) for n, _, s in LAYER], MIXES[mix][1], MIXES[mix][2])
    head = [("token_embd.weight", embd, (v, e))]
    tail = [("output_norm.weight", "F32", (e,)), ("output.weight", output, (v, e))]
    fixed = sum(_nbytes(t, int(np.prod(s))) for _, t, s in head + tail)
    per = sum(_nbytes(t, dim[a] * dim[b]) for _, t, (a, b) in layer) + 2 * 4 * e
    layers = max(1, round((size - fixed) / per))
    out = list(head)
    for i in range(layers):
        out.append((f"blk.{i}.attn_norm.weight", "F32", (e,)))
        for name, t, (a, b) in layer:
            out.append((f"blk.{i}.{name}.weight", t, (dim[b], dim[a])))
        out.append((f"blk.{i}.ffn_norm.weight", "F32", (e,)))
    out += tail
    return out, v


def _block_chunks(rng: np.random.Generator, t: str, nblocks: int, zero_run: tuple[int, int]) -> Iterator[np.ndarray]:
    bs, fields = BLOCKS[t]
    step = max(1, CHUNK // bs)
    for lo in range(0, nblocks, step):
        hi = min(nblocks, lo + step)
        b = np.frombuffer(rng.bytes((hi - lo) * bs), dtype=np.uint8).reshape(hi - lo, bs).copy()
        n = hi - lo
        for off, kind in fields:
            if kind == "e8m0":
                b[:, off] = rng.integers(118, 131, size=n, dtype=np.uint8)
            elif kind == "sc4k":  # Q4_K: low bits of sc0..3 (bytes 4..7) and sc4..7 (low nibbles of 12..15)
                b[:, off : off + 4] |= 1
                b[:, off + 8 : off + 12] |= 1
            elif kind == "sc6k":  # Q6_K: int8 sub-block scales, kept positive and non-zero
                b[:, off : off + 16] = (b[:, off : off + 16] & 0x3F) | 1
            else:
                # float16 in [2^-10, 2^-4] (minimum: negative, like real Q4_1)
                exp = rng.integers(5, 12, size=n, dtype=np.uint16)
                bits = (exp << 10) | rng.integers(0, 1024, size=n, dtype=np.uint16)
                if kind == "f16m":
                    bits |= 0x8000
                b[:, off : off + 2] = bits.astype("<u2").view(np.uint8).reshape(n, 2)
        z0, z1 = max(zero_run[0], lo), min(zero_run[1], hi)
        if z0 < z1:  # what gguf-py's quantizers write for an all-zero block
            b[z0 - lo : z1 - lo] = 0
            if t == "Q4_0":
                b[z0 - lo : z1 - lo, 2:] = 0x88  # code 8 is zero
        yield b


def _float_chunks(rng: np.random.Generator, t: str, shape: tuple[int, ...], norm: bool) -> Iterator[np.ndarray]:
    n = int(np.prod(shape))
    dt = np.float16 if t == "F16" else np.float32
    step = CHUNK // np.dtype(dt).itemsize
    for lo in range(0, n, step):
        k = min(n, lo + step) - lo
        x = rng.standard_normal(k, dtype=np.float32) * (0.02 if not norm else 0.1)
        if norm:
            x += 1.0
        yield x.astype(dt)


def write(path: str | os.PathLike[str], size: int, seed: int = 0, *, vocab: int | None = None,
          mix: str = "default") -> dict:
    """Write the synthetic model; returns a summary (tensor count, types, bytes)."""
    rng = np.random.default_rng(seed)
    tensors, v = plan(size, mix)
    if vocab is not None:
        v = vocab
    e, f, _ = dims_for(size)
    layers = sum(1 for n, _, _ in tensors if n.endswith("attn_q.weight"))
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"tok{i}_\u2581w".encode() for i in range(3, v)]
    kv = [
        ("general.architecture", G.GGUFValue.of(V.STRING, "llama")),
        ("general.name", G.GGUFValue.of(V.STRING, f"synthetic-llama-seed{seed}")),
        ("llama.context_length", G.GGUFValue.of(V.UINT32, 4096)),
        ("llama.embedding_length", G.GGUFValue.of(V.UINT32, e)),
        ("llama.feed_forward_length", G.GGUFValue.of(V.UINT32, f)),
        ("llama.block_count", G.GGUFValue.of(V.UINT32, layers)),
        ("llama.attention.head_count", G.GGUFValue.of(V.UINT32, max(1, e // 128))),
        ("llama.attention.layer_norm_rms_epsilon", G.GGUFValue.of(V.FLOAT32, 1e-5)),
        ("general.file_type", G.GGUFValue.of(V.UINT32, 2)),
        ("tokenizer.ggml.model", G.GGUFValue.of(V.STRING, "llama")),
        ("tokenizer.ggml.tokens", G.GGUFValue.of(V.ARRAY, tokens, V.STRING)),
        ("tokenizer.ggml.scores", G.GGUFValue.of(V.ARRAY, -np.arange(v, dtype=np.float32), V.FLOAT32)),
        ("tokenizer.ggml.token_type", G.GGUFValue.of(V.ARRAY, np.where(np.arange(v) < 3, 3, 1).astype(np.int32), V.INT32)),
        ("tokenizer.ggml.bos_token_id", G.GGUFValue.of(V.UINT32, 1)),
        ("tokenizer.ggml.eos_token_id", G.GGUFValue.of(V.UINT32, 2)),
    ]
    specs = [G.TensorSpec(n, GGML_ID[t], tuple(reversed(s))) for n, t, s in tensors]
    types: dict[str, int] = {}
    with G.GGUFWriterStream(path, kv=kv, tensors=specs) as w:
        by_name = {n: (t, s) for n, t, s in tensors}
        for spec in w.tensors_in_file_order:
            t, s = by_name[spec.name]
            n = int(np.prod(s))
            types[t] = types.get(t, 0) + 1
            if t in BLOCKS:
                nb = n // ELEMENTS.get(t, 32)
                z = (nb // 2, nb // 2 + min(64, nb // 4))
                w.write_tensor_data(_block_chunks(rng, t, nb, z), name=spec.name)
            else:
                w.write_tensor_data(_float_chunks(rng, t, s, norm=len(s) == 1), name=spec.name)
    return {"tensors": len(tensors), "layers": layers, "types": types, "bytes": os.path.getsize(path), "vocab": v,
            "n_embd": e, "n_ff": f}


def write_big_vocab(path: str | os.PathLike[str], vocab: int = 262144, seed: int = 0) -> dict:
    """A small GGUF (two tensors) whose metadata carries a ``vocab``-token tokenizer
    with BPE merges, like Gemma 3's: what makes metadata parsing slow."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    lens = rng.integers(2, 12, size=vocab)
    buf = letters[rng.integers(0, 26, size=int(lens.sum()))].tobytes()
    ends = np.cumsum(lens)
    tokens = [b"\xe2\x96\x81" + buf[a - l : a] + str(i).encode() for i, (a, l) in enumerate(zip(ends.tolist(), lens.tolist()))]
    merges = [tokens[i][3:5] + b" " + tokens[i][5:8] for i in range(vocab)]
    kv = [
        ("general.architecture", G.GGUFValue.of(V.STRING, "gemma3")),
        ("tokenizer.ggml.model", G.GGUFValue.of(V.STRING, "llama")),
        ("tokenizer.ggml.tokens", G.GGUFValue.of(V.ARRAY, tokens, V.STRING)),
        ("tokenizer.ggml.scores", G.GGUFValue.of(V.ARRAY, rng.standard_normal(vocab).astype(np.float32), V.FLOAT32)),
        ("tokenizer.ggml.token_type", G.GGUFValue.of(V.ARRAY, np.ones(vocab, dtype=np.int32), V.INT32)),
        ("tokenizer.ggml.merges", G.GGUFValue.of(V.ARRAY, merges, V.STRING)),
    ]
    e = 256
    specs = [G.TensorSpec("token_embd.weight", GGML_ID["Q8_0"], (e, 64)), G.TensorSpec("output_norm.weight", 0, (e,))]
    with G.GGUFWriterStream(path, kv=kv, tensors=specs) as w:
        w.write_tensor_data(next(_block_chunks(rng, "Q8_0", e * 64 // 32, (0, 1))))
        w.write_tensor_data(np.ones(e, dtype=np.float32))
    return {"vocab": vocab, "bytes": os.path.getsize(path)}


if __name__ == "__main__":  # pragma: no cover
    import argparse
    import json
    import time

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--size", default="64MB")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--big-vocab", type=int, default=0, help="write the big-vocabulary metadata file instead")
    p.add_argument("--mix", default="default", choices=("default", *MIXES), help="the tensor types (see the docstring)")
    a = p.parse_args()
    t0 = time.perf_counter()
    info = (write_big_vocab(a.out, a.big_vocab, a.seed) if a.big_vocab
            else write(a.out, parse_size(a.size), a.seed, mix=a.mix))
    info["seconds"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(info))
