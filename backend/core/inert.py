"""Text from the data made inert for a terminal: every control character shown, none obeyed.

Turns, speakers, model errors, journal targets and hosts come from outside
(models, imports, other processes, other hosts). Written to a terminal as
they are, an `ESC]0;…` sets its title, `ESC[2J` clears it, a NUL or a C1
`CSI` (U+009B) reaches the terminal's parser, a bidi override (U+202E)
reorders what the operator reads, and an invisible tag character (U+E0041)
hides text. `visible` replaces each of them with the escape Python writes
in a string literal (`\\x1b`, `\\x00`, `\\u202e`, `\\U000e0041`; `\\t`,
`\\n` and `\\r` as such), so the operator sees what is stored, on one line.

Escaped: every character of Unicode's control (Cc: C0, DEL, C1), format (Cf),
surrogate (Cs: a lone one cannot be encoded, so printing it would crash) and
line/paragraph separator (Zl, Zp) categories, except ZWNJ and ZWJ (U+200C,
U+200D): they join letters in Persian and Indic scripts and build emoji
sequences, and reorder or hide nothing. The format characters include the bidi
marks, embeddings, overrides and isolates, the zero-width space, word joiner,
BOM, soft hyphen and the tag characters.

A backslash is not escaped: `C:\\x1b` typed as text prints as itself. When
the exact bytes matter, `--json` has them (JSON escapes every control).

This is the one helper for it: the CLI (`backend.cli.render`) and the
console (`tui.format`) both call it; each then passes the result as plain
text, never as Rich markup. rem's log lines go through it too (`InertFormatter`):
a tool server's stderr line or a name from the data is read in a terminal there.
"""

from __future__ import annotations

import logging
import re
from typing import Any

# Unicode 15.1's Cc, Cf (but U+200C, U+200D), Cs, Zl and Zp, as ranges (a test checks them
# against the running Python's unicodedata)
_UNSAFE = (
    r"\x00-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e"
    r"\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
    r"\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    r"\U000e0001\U000e0020-\U000e007f"
)
_ANY_UNSAFE = re.compile(f"[{_UNSAFE}]")
# multi-line text keeps its line breaks and tabs (a transcript is read as lines)
_ANY_UNSAFE_IN_LINES = re.compile(f"(?![\\n\\t])[{_UNSAFE}]")
_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def escape_char(char: str) -> str:
    """One character as Python writes it in a string literal: `\\x1b`, `\\u202e`, `\\U000e0041`."""
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _escaped(match: re.Match[str]) -> str:
    return escape_char(match.group())


def visible(value: object, *, multiline: bool = False) -> str:
    """`value` as text with every control and invisible format character shown as its escape.

    `multiline=True` keeps line breaks (`\\r\\n` becomes `\\n`) and tabs, for text
    read as lines (a transcript's turns); otherwise the result is always one line.
    """
    text = value if isinstance(value, str) else str(value)
    if multiline:
        if _ANY_UNSAFE_IN_LINES.search(text) is None:
            return text
        return _ANY_UNSAFE_IN_LINES.sub(_escaped, text.replace("\r\n", "\n"))
    if _ANY_UNSAFE.search(text) is None:
        return text
    return _ANY_UNSAFE.sub(_escaped, text)


def is_inert(text: str, *, multiline: bool = False) -> bool:
    """Whether `text` holds nothing `visible` would escape."""
    pattern = _ANY_UNSAFE_IN_LINES if multiline else _ANY_UNSAFE
    return pattern.search(text) is None


class InertFormatter(logging.Formatter):
    """Log lines as `visible` text: a message on one line, a traceback on its own lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return visible(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return visible(super().formatException(ei), multiline=True)
