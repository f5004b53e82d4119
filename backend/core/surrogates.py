"""Lone surrogates in text from outside: found, or replaced by U+FFFD.

JSON may escape a UTF-16 surrogate without its pair (`"\\ud800"`), and
`json.loads` hands it over as a lone surrogate: a Python `str` that has no
UTF-8 form, so SQLite, PostgreSQL and every terminal refuse it (a
`UnicodeEncodeError` at the write). Text read from a model, an MCP client or
a file is checked here before anything stores it. Both walks are iterative
(an explicit stack), so a deeply nested value cannot exhaust the recursion
limit.
"""

from __future__ import annotations

import re
from typing import Any

LONE_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"
# a `\uD800`-`\uDFFF` escape in raw JSON text: only a line that holds one can decode to a lone
# surrogate (a valid pair decodes to one character, which the walk then leaves alone)
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def repaired_text(text: str) -> tuple[str, int]:
    """`text` with each lone surrogate replaced by U+FFFD, and how many were replaced."""
    if text.isascii():
        return text, 0
    return LONE_SURROGATE.subn(REPLACEMENT, text)


def repaired(value: Any) -> tuple[Any, int]:
    """A freshly parsed JSON value with every lone surrogate in its strings (keys too) replaced by
    U+FFFD, in place, and how many were replaced."""
    if isinstance(value, str):
        return repaired_text(value)
    total = 0
    stack = [value]
    while stack:
        container = stack.pop()
        if isinstance(container, list):
            for i, item in enumerate(container):
                if isinstance(item, str):
                    container[i], found = repaired_text(item)
                    total += found
                elif isinstance(item, dict | list):
                    stack.append(item)
        elif isinstance(container, dict):
            for key in list(container):
                total += _repair_entry(container, key, stack)
    return value, total


def _repair_entry(container: dict[Any, Any], key: Any, stack: list[Any]) -> int:
    """One dict entry repaired in place (its key too); a nested container pushed on `stack`."""
    item = container[key]
    new_key, found = repaired_text(key) if isinstance(key, str) else (key, 0)
    if found:
        del container[key]
    if isinstance(item, str):
        item, more = repaired_text(item)
        found += more
    elif isinstance(item, dict | list):
        stack.append(item)
    container[new_key] = item
    return found


def lone_surrogate_at(value: Any, path: str = "", whole: str = "the request") -> str | None:
    """Where the first string holding a lone surrogate is in a parsed JSON value (a dotted path;
    `whole` when it is the value itself or one of its top-level keys), if any."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and LONE_SURROGATE.search(item):
                return where or whole
            continue
        pairs: list[tuple[Any, Any]]
        if isinstance(item, dict):
            pairs = list(item.items())
        elif isinstance(item, list):
            pairs = list(enumerate(item))
        else:
            continue
        for key, child in reversed(pairs):  # reversed: the first one is looked at first
            inner = f"{where}.{key}" if where else str(key)
            stack.append((child, inner))
            if isinstance(key, str):
                stack.append((key, where))
    return None
