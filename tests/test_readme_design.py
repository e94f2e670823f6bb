"""The layout in docs/design.md (§ Layout) and the package's folders say the same thing: every
module is named there (by its path, or by a line for its folder), and every path named there exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "hurray_interop"


def design_block() -> str:
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]  # the first fenced block: the layout


def named_paths(block: str) -> set[str]:
    """Paths (relative to the package) the block names: ``cli.py``, ``conversions/gguf.py``,
    folder lines ``core/``.  Names inside descriptions (``common.py``) count only when they
    exist at the package top level or under the line's folder, as written."""
    out = set()
    for line in block.splitlines()[1:]:  # the first line is the package itself
        if not line.startswith("  ") or line.startswith("   "):
            continue  # a continuation line or the mappings/ line
        head = line.strip().split("   ")[0]  # the names before the description
        for tok in re.findall(r"[\w./]+", head):
            if tok.endswith((".py", "/")):
                out.add(tok)
    return out


def test_every_module_is_in_the_design_section() -> None:
    named = named_paths(design_block())
    folders = {n for n in named if n.endswith("/")}
    missing = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel in named or any(rel.startswith(f) for f in folders):
            continue
        if rel.endswith("__init__.py") and rel != "__init__.py":
            continue  # a package marker of a folder whose modules are listed
        missing.append(rel)
    assert not missing, f"modules docs/design.md's layout does not name: {missing}"


def test_every_path_in_the_design_section_exists() -> None:
    gone = sorted(n for n in named_paths(design_block()) if not (PKG / n).exists())
    assert not gone, f"docs/design.md's layout names paths that do not exist: {gone}"


def test_the_reader_sees_the_layout() -> None:
    named = named_paths(design_block())
    assert {"cli.py", "_convert.py", "_inspect.py", "conversions/gguf.py", "core/", "files/"} <= named
