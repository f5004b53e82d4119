"""Characters no store can hold, in text from outside: found, or replaced by U+FFFD.

Two characters a Python `str` may hold that a store refuses:

* a lone surrogate: JSON may escape a UTF-16 surrogate without its pair (`"\\ud800"`),
  and `json.loads` hands it over as a string with no UTF-8 form, so SQLite, PostgreSQL and
  every terminal refuse it (a `UnicodeEncodeError` at the write);
* NUL (U+0000, the escape `"\\u0000"`): PostgreSQL's `text` refuses it, and so does its
  `jsonb` when a JSON column is read through `json_extract` (SQLSTATE 22P05).

Text read from a model (or a client) is checked here before anything stores it. Both walks
are iterative (an explicit stack), so a deeply nested value cannot exhaust the recursion limit.
"""

from __future__ import annotations

import re
from typing import Any

UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"
# a `\u0000` or `\uD800`-`\uDFFF` escape in raw JSON text: only a line that holds one can decode to
# an unstorable character (a valid pair decodes to one character, which the walk leaves alone)
UNSTORABLE_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


def storable_text(text: str) -> tuple[str, int]:
    """`text` with each NUL and lone surrogate replaced by U+FFFD, and how many were replaced."""
    if text.isascii() and "\x00" not in text:
        return text, 0
    return UNSTORABLE.subn(REPLACEMENT, text)


def storable(value: Any) -> tuple[Any, int]:
    """A freshly parsed JSON value with every NUL and lone surrogate in its strings (keys too)
    replaced by U+FFFD, in place, and how many were replaced."""
    if isinstance(value, str):
        return storable_text(value)
    total = 0
    stack = [value]
    while stack:
        container = stack.pop()
        if isinstance(container, list):
            for i, item in enumerate(container):
                if isinstance(item, str):
                    container[i], found = storable_text(item)
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
    new_key, found = storable_text(key) if isinstance(key, str) else (key, 0)
    if found:
        del container[key]
    if isinstance(item, str):
        item, more = storable_text(item)
        found += more
    elif isinstance(item, dict | list):
        stack.append(item)
    container[new_key] = item
    return found


def first_match_at(
    value: Any, pattern: re.Pattern[str], path: str = "", whole: str = "the request"
) -> str | None:
    """Where the first string `pattern` finds something in is, in a parsed JSON value (a dotted
    path; `whole` when it is the value itself or one of its top-level keys), if any."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if pattern.search(item):
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
            stack.append((child, f"{where}.{key}" if where else str(key)))
            if isinstance(key, str):
                stack.append((key, where))
    return None


def lone_surrogate_at(value: Any, path: str = "", whole: str = "the request") -> str | None:
    """Where the first string holding a lone surrogate is in a parsed JSON value, if any."""
    return first_match_at(value, LONE_SURROGATE, path, whole)


def unstorable_at(value: Any, path: str = "", whole: str = "the request") -> str | None:
    """Where the first string holding a NUL or a lone surrogate is in a parsed JSON value, if any."""
    return first_match_at(value, UNSTORABLE, path, whole)
