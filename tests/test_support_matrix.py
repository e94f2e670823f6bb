"""The README's support matrix is the one generated from mappings/."""

from __future__ import annotations

from pathlib import Path

from hurray_interop.support import END, START, splice, support_matrix
from hurray_interop.tables import load_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_matrix_is_current() -> None:
    text = README.read_text(encoding="utf-8")
    assert splice(text, support_matrix()) == text, "regenerate: python -m hurray_interop.support --write README.md"


def test_matrix_lists_every_ggml_type_and_mx_element() -> None:
    matrix = support_matrix()
    for name, row in load_table("ggml_types").items():
        if row["family"] != "removed":
            assert f"| {name} | {int(row['id'])} |" in matrix
    for row in load_table("mx_types")["elements"].values():
        assert f"| {row['hurray']} |" in matrix


def test_splice_needs_markers() -> None:
    import pytest

    with pytest.raises(ValueError):
        splice("no markers here", "x")
    assert splice(f"a{START}old{END}b", "new\n") == f"a{START}\nnew\n{END}b"
