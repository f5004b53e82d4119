"""A citation a reader cannot open fails: the code cites the docs, and every link the pages hold resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.pages import DOCS, README, ROOT, anchors, links, pages

CODE_DIRS = ("backend", "tui", "tests", "benchmarks", "screenshots")
# a design section, a requirements seed or an issue number: documents a reader of the repository lacks
UNOPENABLE = re.compile(r"\bDESIGN\b|\b[Ss]eed 0\d\d\b|\b[Tt]he seed's\b|\b[Ii]ssue \d+\b")
DOC_REF = re.compile(r"\bdocs/([\w-]+\.md)(?:#([\w-]+))?")


def _code_files() -> list[Path]:
    return [p for d in CODE_DIRS for p in sorted((ROOT / d).rglob("*.py")) if "__snapshots__" not in p.parts]


def test_no_comment_or_docstring_cites_a_document_a_reader_cannot_open() -> None:
    found = []
    for path in _code_files():
        if path == Path(__file__):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if UNOPENABLE.search(line) and "random" not in line:
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "cite docs/<page>.md#<section> or say it in a sentence:\n" + "\n".join(found)


@pytest.mark.parametrize("path", _code_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_docs_page_the_code_cites_exists_with_its_section(path: Path) -> None:
    for page, anchor in DOC_REF.findall(path.read_text(encoding="utf-8")):
        target = DOCS / page
        assert target.is_file(), f"{path.relative_to(ROOT)} cites docs/{page}, which does not exist"
        if anchor:
            assert anchor in anchors(target), (
                f"{path.relative_to(ROOT)} cites docs/{page}#{anchor}: no such section"
            )


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_of_a_page_resolves(page: Path) -> None:
    """The site's pages are checked by `mkdocs build --strict` too; this covers the README and the
    pages the site leaves out, read as GitHub shows them."""
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # http:, mailto:
        file_part, _, anchor = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        assert resolved.exists(), f"{page.relative_to(ROOT)}: broken link {target}"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved), (
                f"{page.relative_to(ROOT)}: no section #{anchor} in {file_part}"
            )


def test_the_citation_check_can_fail() -> None:
    for cited in ("DESIGN section 5", "seed 004", "the seed's columns", "(issue 17)"):
        assert UNOPENABLE.search(cited), cited
    assert not UNOPENABLE.search("a random seed 42, by design")
    assert DOC_REF.findall("see docs/architecture.md#leases-epochs-and-fencing") == [
        ("architecture.md", "leases-epochs-and-fencing")
    ]
    assert "leases-epochs-and-fencing" in anchors(DOCS / "architecture.md")
    assert README.is_file()
