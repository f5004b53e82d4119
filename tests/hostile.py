"""Hostile stored text for the tests that show data on a terminal: markup, escapes, controls."""

from __future__ import annotations

from hypothesis import strategies as st

# the reproductions and their neighbours: Rich markup and emoji codes, a terminal title
# (OSC 0), a hyperlink (OSC 8), clear screen, NUL, a C1 CSI, DEL, CR, bidi override and isolate,
# an invisible tag character, a lone surrogate (JSON holds one; a TEXT column cannot), a backslash
FRAGMENTS = [
    "[/]",
    "[bold red]",
    "[/bold red]",
    "[link=https://evil.example]",
    ":thumbs_up:",
    "\x1b]0;pwned\x07",
    "\x1b]8;;https://evil.example\x1b\\",
    "\x1b[2J",
    "\x00",
    "\x9b31m",
    "\x7f",
    "\r",
    "\u202e",
    "\u2066",
    "\U000e0041",
    "\ud800",
    "\\",
]

# text as another process, a model or an import could have stored it (never blank)
hostile_text = (
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6)), min_size=1, max_size=6)
    .map("".join)
    .filter(lambda s: s.strip() != "")
)


def as_column(text: str) -> str:
    """`text` as a SQLite TEXT column can hold it (UTF-8: a lone surrogate becomes U+FFFD)."""
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
