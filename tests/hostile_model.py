"""A model that misbehaves on purpose: scenarios for the OpenAI-compatible server of tests/fake_openai.py.

Each builder returns a `Scenario` the server plays for one request (or, with `calls_once`,
for a whole tool-using turn), over the wire as a real endpoint would: what is hostile is in
the JSON the server streams, never in rem's code. A test picks the behaviour it needs
(`server.push(...)` or `server.set_default(...)`) and counts the requests the server
received (`server.requests()`):

* `lone_surrogate_text`: a text delta holding a `\\ud800` escape without its pair;
* `lone_surrogate_call` / `escaped_surrogate_call`: a tool call whose arguments hold one, as
  a surrogate inside the streamed delta, or as a `\\ud800` escape inside the arguments' own
  JSON text; `lone_surrogate_tool_name`: a function name holding one;
* `lone_surrogate_extras`: the finish reason and the usage object holding one;
* `nul_text`: a reply with NUL, a terminal escape and a bidi override in its text;
* `terminal_tool_name`: a function name with ESC, U+202E (bidi override) and NUL;
* `invented_tools`: calls to many tool names no configuration has;
* `tool_turn`: an honest tool-using turn (a call, then an answer) that reports usage on every
  step, the case `rem check`'s usage invariant must add up.
"""

from __future__ import annotations

import json
from typing import Any

from tests.fake_openai import Scenario

LONE = "\ud800"
ANSWER = "Done: the note is saved."


def _call(name: str, arguments: str, call_id: str = "m-1") -> dict[str, str]:
    return {"name": name, "arguments": arguments, "id": call_id}


def tool_turn(
    tool: str = "demo__notes_add", arguments: str | None = None, name: str = "tool_turn", **kw: Any
) -> Scenario:
    """A call to `tool` with `arguments` (JSON text), then (once its result is in the request) an
    answer; usage on both steps."""
    args = arguments if arguments is not None else json.dumps({"text": "standup at 10:30"})
    return Scenario(
        name=name,
        reply="Let me note that.",
        tool_calls=[_call(tool, args)],
        calls_once=True,
        then_reply=ANSWER,
        prompt_tokens=40,
        completion_tokens=9,
        cached_tokens=8,
        reasoning_tokens=3,
        **kw,
    )


def lone_surrogate_text(**kw: Any) -> Scenario:
    return Scenario(name="lone_surrogate_text", reply=f"lone{LONE}surrogate", **kw)


def lone_surrogate_call(**kw: Any) -> Scenario:
    """Arguments streamed with a lone surrogate in the delta itself (the wire escapes it)."""
    return tool_turn(arguments='{"to": "' + LONE + '"}', name="lone_surrogate_call", **kw)


def escaped_surrogate_call(**kw: Any) -> Scenario:
    """Arguments whose own JSON text escapes a lone surrogate (`{"to": "\\ud800"}` as six characters)."""
    return tool_turn(arguments='{"to": "\\ud800"}', name="escaped_surrogate_call", **kw)


def lone_surrogate_tool_name(**kw: Any) -> Scenario:
    return tool_turn(f"demo__notes{LONE}add", name="lone_surrogate_tool_name", **kw)


def nul_text(**kw: Any) -> Scenario:
    """A reply with a NUL and terminal escapes in its text (PostgreSQL's text refuses NUL)."""
    return Scenario(name="nul_text", reply="nul\x00byte \x1b[2J\u202e", **kw)


def lone_surrogate_extras(**kw: Any) -> Scenario:
    """A plain reply whose finish reason and usage object hold lone surrogates."""
    return Scenario(
        name="lone_surrogate_extras",
        reply="Fine.",
        finish_reason=f"stop{LONE}",
        usage_extra={f"note{LONE}": f"x{LONE}"},
        **kw,
    )


TERMINAL_NAME = "evil\x1b]0;pwned\x07\u202e\x00__tool"


def terminal_tool_name(**kw: Any) -> Scenario:
    """A call to a function name made of terminal escapes, a bidi override and NUL."""
    return tool_turn(TERMINAL_NAME, "{}", name="terminal_tool_name", **kw)


def invented_tools(count: int, **kw: Any) -> Scenario:
    """One reply asking for `count` tools no configuration names (`madeup{i}__tool`)."""
    scenario = tool_turn(name="invented_tools", **kw)
    scenario.tool_calls = [_call(f"madeup{i}__tool", "{}", f"m-{i}") for i in range(count)]
    return scenario
