"""Every document a comment, test, table or page cites is in the repository.

* No reference to the design documents the project started from (they are not in the
  clone): the conversion contract by that name, the GGUF / Hurray / MX research notes and
  any path into the design folder beside the clone.
* Every ``docs/<page>.md § N`` (also ``§§ A, B`` and ``§§ A–B``) names an existing page
  and a heading numbered ``N`` in it.
* Every relative link in ``docs/*.md`` and the README names an existing file and, with a
  ``#anchor``, a heading of that file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: character classes keep these patterns from matching this file's own text
OUTSIDE = re.compile(
    r"(?<![\w/.-])(?:[c]ontract\s*§|[C]ontract\s*§|(?:gguf|hurray|mx)-[n]otes\b|conversion-[c]ontract"
    r"|architecture-[e]xamples|\.\./[d]esign\b|(?<![\w/])[d]esign/[\w-]+\.md|/work/[s]hared)"
)
NUM = r"\d+(?:\.\d+)*[a-z]?"
DOC_REF = re.compile(
    rf"docs/(?P<page>[\w-]+\.md)(?:``|`)?(?P<tail>(?:\s*(?:§§?|,|–|-|/|and)\s*{NUM}\b)*)"
)
HEADING = re.compile(r"^#{1,6}\s+(?P<num>\d+(?:\.\d+)*[a-z]?)\.?\s+(?P<title>.*)$", re.M)
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def _scanned() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for folder, pattern in (("hurray_interop", "*.py"), ("tests", "*.py"), ("mappings", "*.toml"),
                            ("fixtures", "*.py"), ("fixtures", "*.md"), ("bench", "*.py"), ("bench", "*.md")):
        files += sorted((REPO / folder).rglob(pattern))
    return [f for f in files if f.is_file()]


def _numbers(page: Path) -> set[str]:
    return {m["num"] for m in HEADING.finditer(page.read_text(encoding="utf-8"))}


def _slug(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    s = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return s.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("#")}


def test_docs_pages_exist() -> None:
    for page in ("conversion-rules.md", "format-notes.md"):
        assert (REPO / "docs" / page).is_file(), page


def test_conversion_rules_keep_the_contract_numbering() -> None:
    """Comments written against the original contract keep their numbers: § 1 … § 10 and § 3a."""
    nums = _numbers(REPO / "docs" / "conversion-rules.md")
    assert {str(n) for n in range(1, 11)} | {"3a"} <= nums


@pytest.mark.parametrize("path", _scanned(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_reference_leaves_the_repository(path: Path) -> None:
    if path == Path(__file__).resolve():
        return
    bad = [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
           if OUTSIDE.search(line)]
    assert not bad, "cites a document outside the repository (cite docs/<page>.md § N):\n" + "\n".join(bad)


@pytest.mark.parametrize("path", _scanned(), ids=lambda p: str(p.relative_to(REPO)))
def test_docs_section_references_resolve(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    problems = []
    for m in DOC_REF.finditer(text):
        page = REPO / "docs" / m["page"]
        if not page.is_file():
            problems.append(f"docs/{m['page']}: no such page")
            continue
        wanted = re.findall(NUM, m["tail"])
        missing = sorted(set(wanted) - _numbers(page))
        if missing:
            problems.append(f"{m[0].strip()!r}: no heading {', '.join(missing)} in docs/{m['page']}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_relative_links_resolve(path: Path) -> None:
    problems = []
    for m in LINK.finditer(path.read_text(encoding="utf-8")):
        target = m["target"]
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and anchor not in _anchors(dest):
            problems.append(f"{target}: no such heading")
    assert not problems, "\n".join(problems)


def test_the_checker_sees_what_it_must() -> None:
    """The patterns above catch the forms the old references took, and accept the new ones."""
    c, n, d = "con" + "tract", "no" + "tes", "des" + "ign"  # spelled apart: the rewrite script must not touch them
    old = [f"({c} § 3a)", f"{c.title()} § 4:", f"conversion {c} §§ 2–5", f"(gguf-{n} § 1.6)",
           f"``{d}/hurray-{n}.md``", f"../{d}/mx-{n}.md §§ 1-5", f"conversion-{c}.md § 6"]
    assert all(OUTSIDE.search(s) for s in old)
    assert not OUTSIDE.search("docs/conversion-rules.md § 3a and docs/format-notes.md § 1.3; assert_cli_contract(")
    refs = [(m["page"], re.findall(NUM, m["tail"])) for m in DOC_REF.finditer(
        "see docs/conversion-rules.md §§ 2–5, 7 and ``docs/format-notes.md`` § 2.4, docs/format-notes.md § 3.9/3.10")]
    assert refs == [("conversion-rules.md", ["2", "5", "7"]), ("format-notes.md", ["2.4"]),
                    ("format-notes.md", ["3.9", "3.10"])]
