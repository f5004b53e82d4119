"""`visible`: every control and invisible format character shown as its escape, everything else kept."""

from __future__ import annotations

import sys
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from backend.core.inert import escape_char, is_inert, visible

UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}
KEPT = {"\u200c", "\u200d"}  # ZWNJ, ZWJ: scripts and emoji sequences need them
HOSTILE = ["\x1b]0;pwned\x07", "\x1b[2J", "\x00", "\x9b", "\u202e", "\u2066", "\U000e0041", "\r", "\ud800"]
# any code point, lone surrogates and hostile sequences included
texts = st.lists(
    st.one_of(st.text(st.characters(min_codepoint=0)), st.sampled_from(HOSTILE)), max_size=8
).map("".join)


def unsafe(char: str) -> bool:
    return unicodedata.category(char) in UNSAFE_CATEGORIES and char not in KEPT


def test_every_control_format_surrogate_and_separator_of_this_unicode_is_escaped() -> None:
    missed = [
        f"U+{cp:04X}" for cp in range(sys.maxunicode + 1) if unsafe(chr(cp)) and visible(chr(cp)) == chr(cp)
    ]
    assert not missed, missed


@given(texts)
def test_visible_text_holds_no_control_and_keeps_the_rest(text: str) -> None:
    shown = visible(text)
    assert is_inert(shown) and not any(unsafe(c) for c in shown)
    # each character is kept or replaced by its escape, in order: nothing dropped, nothing added
    assert shown == "".join(escape_char(c) if unsafe(c) else c for c in text)
    assert (shown == text) == is_inert(text)


@given(texts)
def test_multiline_keeps_line_breaks_and_tabs_only(text: str) -> None:
    shown = visible(text, multiline=True)
    assert not any(unsafe(c) for c in shown if c not in "\n\t")
    assert shown.count("\n") == text.replace("\r\n", "\n").count("\n")
    assert [visible(line) for line in shown.split("\n")] == [
        visible(line) for line in text.replace("\r\n", "\n").split("\n")
    ]


def test_the_issue_reproductions_read_as_python_escapes() -> None:
    assert visible("a\x1b]0;pwned\x07b\x1b[2J\x00") == "a\\x1b]0;pwned\\x07b\\x1b[2J\\x00"
    assert visible("\u202eevil\U000e0041\ud800\x9b") == "\\u202eevil\\U000e0041\\ud800\\x9b"
    assert visible("line\r\nnext\ttab") == "line\\r\\nnext\\ttab"
    assert visible("line\r\nnext\ttab\x1b", multiline=True) == "line\nnext\ttab\\x1b"
    # markup, emoji codes, backslashes, ZWJ emoji and other scripts are not controls: kept as typed
    kept = "[bold red]x[/] :thumbs_up: C:\\x1b 👩\u200d💻 می\u200cخواهم"
    assert visible(kept) == kept and visible(kept, multiline=True) == kept
    assert visible(None) == "None" and visible(42) == "42"
