"""What ``verify`` does with .hrry files: two of them compared tensor by tensor (descriptor,
bytes and dequantized values); a .hrry alone has no source to round-trip to."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.hrry import HrryFile
from ..core.model import Tensor
from ..dequant import dequantize
from ..errors import UsageError
from .common import TensorCheck, VerifyResult, first_value_diff

__all__ = ["VERIFIER", "HurrayVerifier"]


def _same_tensor_bytes(a: Tensor, b: Tensor) -> bool:
    if a.descriptor != b.descriptor or len(a.data) != len(b.data) or len(a.members) != len(b.members):
        return False
    if not all(np.array_equal(x, y) for x, y in zip(a.data, b.data)):
        return False
    return all(_same_tensor_bytes(x, y) for x, y in zip(a.members, b.members))


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
                va, vb = dequantize(ta), dequantize(tb)
                if va.shape != vb.shape:
                    chk.values_equal, chk.where = False, f"shape {va.shape} vs {vb.shape}"
                    continue
                idx, mad = first_value_diff(va.reshape(-1), vb.reshape(-1), signed_zero_equal=False)
                chk.values_equal, chk.max_abs_diff = idx < 0, mad
                if idx >= 0:
                    chk.where = f"element {idx}"
            extra = [n for n in hb.top_level_names() if n not in ha]
            if extra:
                result.problems.append(f"tensors only in {b}: {', '.join(extra[:5])}")


VERIFIER = HurrayVerifier()
