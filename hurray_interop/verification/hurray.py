"""What ``verify`` does with .hrry files: two of them compared tensor by tensor (descriptor,
bytes and dequantized values); a .hrry alone has no source to round-trip to."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from ..core.hrry import HrryFile
from ..core.model import Tensor
from ..dequant import iter_dequantize
from ..errors import UsageError
from .common import CHUNK_ROWS_ELEMENTS, TensorCheck, VerifyResult, first_value_diff

__all__ = ["VERIFIER", "HurrayVerifier"]


def _same_bytes(x: Any, y: Any, step: int = 1 << 20) -> bool:
    """Two buffers byte for byte, compared in slices (no temporary of the buffers' size)."""
    u, v = np.asarray(x).reshape(-1).view(np.uint8), np.asarray(y).reshape(-1).view(np.uint8)
    return u.size == v.size and all(np.array_equal(u[i:i + step], v[i:i + step]) for i in range(0, u.size, step))


def _same_tensor_bytes(a: Tensor, b: Tensor) -> bool:
    if a.descriptor != b.descriptor or len(a.data) != len(b.data) or len(a.members) != len(b.members):
        return False
    if not all(_same_bytes(x, y) for x, y in zip(a.data, b.data)):
        return False
    return all(_same_tensor_bytes(x, y) for x, y in zip(a.members, b.members))


def _flat(t: Tensor) -> Iterator[np.ndarray]:
    for _, values in iter_dequantize(t, max_elements=CHUNK_ROWS_ELEMENTS):
        yield values.reshape(-1)


def _paired(xs: Iterator[np.ndarray], ys: Iterator[np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Equal-length pieces of two flat value streams whose chunks need not line up (each
    layout aligns its chunks to its own blocks)."""
    x: np.ndarray | None = None
    y: np.ndarray | None = None
    while True:
        if x is None or not x.size:
            x = next(xs, None)
        if y is None or not y.size:
            y = next(ys, None)
        if x is None or y is None:
            return
        n = min(x.size, y.size)
        yield x[:n], y[:n]
        x, y = x[n:], y[n:]


def _compare_values(ta: Tensor, tb: Tensor, chk: TensorCheck) -> None:
    """Both tensors dequantized and compared bit for bit in windows: memory stays bounded
    whatever the tensors' size (a float-fallback .hrry of a 7B model has GB-sized tensors)."""
    done, first, worst = 0, -1, 0.0
    for a, b in _paired(_flat(ta), _flat(tb)):
        idx, mad = first_value_diff(a, b, signed_zero_equal=False)
        if idx >= 0:
            worst = None if (mad is None or worst is None) else max(worst, mad)
            if first < 0:
                first = done + idx
        done += a.size
    chk.values_equal, chk.max_abs_diff = first < 0, worst
    if first >= 0:
        chk.where = f"element {first}"


class HurrayVerifier:
    """The registry's verifier of the Hurray hub format."""

    def roundtrip(self, path: str, result: VerifyResult, fmt: Any) -> None:
        raise UsageError(f"{path}: a .hrry file has no source to round-trip to; give the file it came from too (verify SOURCE {path})")

    def pair_same(self, a: str, b: str, result: VerifyResult) -> None:
        with HrryFile(a) as ha, HrryFile(b) as hb:
            if list(ha.kv.items()) != list(hb.kv.items()):
                diffs = [k for k in ha.kv if hb.kv.get(k) != ha.kv[k]] + [k for k in hb.kv if k not in ha.kv]
                result.problems.append(f"metadata differs: {', '.join(diffs[:5]) or 'key order'}")
            for name in ha.top_level_names():
                ta = ha.tensor(name)
                chk = TensorCheck(name, ta.describe(), ta.describe())
                result.tensors.append(chk)
                if name not in hb:
                    chk.bytes_equal, chk.where = False, f"missing from {b}"
                    continue
                tb = hb.tensor(name)
                chk.mapping = tb.describe()
                chk.bytes_equal = _same_tensor_bytes(ta, tb)
                if tuple(ta.shape) != tuple(tb.shape):
                    chk.values_equal, chk.where = False, f"shape {tuple(ta.shape)} vs {tuple(tb.shape)}"
                    continue
                _compare_values(ta, tb, chk)
            extra = [n for n in hb.top_level_names() if n not in ha]
            if extra:
                result.problems.append(f"tensors only in {b}: {', '.join(extra[:5])}")


VERIFIER = HurrayVerifier()
