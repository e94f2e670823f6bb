"""No function in the package is over 100 lines (docs/design.md, § Layers).

Lengths are read with ``ast`` (``end_lineno - lineno + 1`` of every ``def``, methods and
nested functions included; decorators not counted)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "hurray_interop"
LIMIT = 100

def function_lengths(source: str, filename: str = "<source>") -> dict[str, int]:
    """``{qualified name: lines}`` of every function and method in ``source``."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                out[name] = child.end_lineno - child.lineno + 1  # type: ignore[operator]
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename), "")
    return out


def package_lengths() -> dict[str, int]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        for name, n in function_lengths(path.read_text(encoding="utf-8"), str(path)).items():
            out[f"{rel}:{name}"] = n
    return out


LENGTHS = package_lengths()


def test_the_measure_sees_methods_and_nested_functions() -> None:
    long_body = "\n".join(f"        x{i} = {i}" for i in range(LIMIT))
    src = f"class A:\n    def m(self):\n{long_body}\n\n        def inner():\n            pass\n\ndef f():\n    pass\n"
    got = function_lengths(src)
    assert got == {"A.m": LIMIT + 4, "A.m.inner": 2, "f": 2}


def test_the_package_was_read() -> None:
    assert "formats/gguf.py:GGUFFile._parse" in LENGTHS
    assert "conversions/safetensors.py:hurray_to_safetensors" in LENGTHS
    assert len(LENGTHS) > 500


def test_no_function_is_over_the_limit() -> None:
    over = {k: n for k, n in LENGTHS.items() if n > LIMIT}
    assert not over, f"functions over {LIMIT} lines (split them): {over}"

