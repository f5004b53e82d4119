"""Reading the docs as a reader's tools do: pages, code blocks, inline code, heading anchors, links."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<lang>[\w-]*)")
HEADING = re.compile(r"^(#{1,6}) +(.+?)(?: +\{ *#(?P<id>[\w-]+) *\})? *#*$")
HTML_ID = re.compile(r"""<a id=["']([\w-]+)["']""")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def gen() -> ModuleType:
    """docs/gen.py, loaded as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("docs_gen", DOCS / "gen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pages(*, with_readme: bool = True) -> list[Path]:
    """Every Markdown page a reader opens: the docs (the site's and the excluded ones) and the README."""
    found = sorted(p for p in DOCS.glob("*.md") if not p.is_symlink())
    found.append(ROOT / "benchmarks" / "HISTORY.md")
    return [*found, README] if with_readme else found


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the block's first line of code
    lang: str
    text: str


def code_blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence, start, body = opened["fence"], i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(opened["indent"]) :])
            i += 1
        yield Block(path, start + 1, opened["lang"], "\n".join(body))
        i += 1


def prose(path: Path) -> str:
    """The page without its fenced code blocks (what inline code and headings are read from)."""
    text = path.read_text(encoding="utf-8")
    for block in code_blocks(path):
        text = text.replace(block.text, "")
    return text


def inline_code(path: Path) -> list[str]:
    return INLINE_CODE.findall(prose(path))


def anchors(path: Path) -> set[str]:
    """The ids a link to `path#...` may name: its headings' (as MkDocs and GitHub make them) and its own."""
    found = set(HTML_ID.findall(path.read_text(encoding="utf-8")))
    for line in prose(path).splitlines():
        heading = HEADING.match(line)
        if heading:
            if heading["id"]:
                found.add(heading["id"])
            text = re.sub(r"[`*]", "", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading[2]))
            found.add(slugify(text, "-"))
    return found


def links(path: Path) -> list[str]:
    """Every Markdown link target of the page's prose."""
    return [m["target"] for m in LINK.finditer(prose(path))]
