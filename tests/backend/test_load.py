"""The synthetic load: with agent tools configured a share of its inputs ask for a note or a send
(what the offline agent answers with a tool call); without, the same inputs as before for a seed."""

from __future__ import annotations

from typing import Any

from backend.programs.load import ASKS, STEERS, TOOL_ASKS, LoadGenerator


def _inputs(**kwargs: Any) -> list[str]:
    generator = LoadGenerator(ctx=None, seed=7, **kwargs)  # type: ignore[arg-type]  # next_input reads no store
    return [generator.next_input()[1] for _ in range(200)]


def _shapes(templates: tuple[str, ...], texts: list[str]) -> int:
    return sum(any(t.split("{")[0] and text.startswith(t.split("{")[0]) for t in templates) for text in texts)


def test_tool_asks_only_when_asked_for_and_a_share_of_them_when_they_are() -> None:
    plain = _inputs()
    assert _shapes(TOOL_ASKS, plain) == 0 and _shapes(ASKS + STEERS, plain) == len(plain)
    with_tools = _inputs(tool_ratio=0.3)
    notes = sum(text.startswith(("Note that", "Make a note")) for text in with_tools)
    sends = sum(text.startswith("Send ") for text in with_tools)
    assert 20 <= notes + sends <= 80 and notes and sends  # ~0.3 of the ~160 asks
