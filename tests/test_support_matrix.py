"""The README's support matrix is the one generated from mappings/."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hurray_interop.support import END, START, splice, support_matrix

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_matrix_is_current() -> None:
    text = README.read_text(encoding="utf-8")
    assert splice(text, support_matrix()) == text, "regenerate: python -m hurray_interop.support --write README.md"


def _rows(matrix: str, header: str) -> dict[str, list[str]]:
    """The rows of the table that follows ``header``, by first cell."""
    lines = matrix[matrix.index(header):].splitlines()[4:]
    rows = {}
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


def test_ggml_rows_agree_with_gguf_py() -> None:
    """Every GGML type gguf-py knows has a row under its gguf-py id; a row claims a float
    ``--fallback`` (stores it "dequantized") exactly when gguf-py can dequantize the type, and
    an exact block mapping names gguf-py's block size."""
    gguf = pytest.importorskip("gguf")
    rows = _rows(support_matrix(), "GGUF tensor types")
    for qt in gguf.GGMLQuantizationType:
        assert rows[qt.name][1] == str(int(qt)), qt.name
    assert set(rows) - set(gguf.GGMLQuantizationType.__members__) <= {"Q2_0"}  # newer than gguf-py 0.19.0
    for qt in gguf.GGMLQuantizationType:
        cells = rows[qt.name]
        block, size = gguf.GGML_QUANT_SIZES[qt]
        if cells[2] == "exact":
            if block > 1:
                assert f"K={block}" in cells[3], cells
            continue
        try:
            gguf.quants.dequantize(np.zeros(size, np.uint8), qt)
            decodes = True
        except NotImplementedError:
            decodes = False
        assert ("dequantized" in cells[2]) == decodes, cells


def test_mx_rows_name_real_dtypes() -> None:
    """The MX table's element names exist where it says: Hurray (pyhurray), ml_dtypes, torch."""
    import ml_dtypes

    hurray = pytest.importorskip("hurray")
    torch = pytest.importorskip("torch")
    rows = _rows(support_matrix(), "OCP MX element types")
    assert {c[1] for c in rows.values()} >= {"float8_e4m3", "float8_e5m2", "float6_e2m3", "float6_e3m2", "float4_e2m1", "int8"}
    for cells in rows.values():
        assert hurray.Dtype.from_name(cells[1]).name == cells[1]
        mld = cells[3].strip("`")
        assert np.dtype(getattr(ml_dtypes, mld, None) or mld).itemsize == 1, mld
        tdt = cells[2].strip("`")
        if tdt != "—":
            assert isinstance(getattr(torch, tdt), torch.dtype), tdt


def test_splice_needs_markers() -> None:
    with pytest.raises(ValueError):
        splice("no markers here", "x")
    assert splice(f"a{START}old{END}b", "new\n") == f"a{START}\nnew\n{END}b"
