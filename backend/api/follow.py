"""`rem send --follow`: the reply to one input, printed as it streams, across server restarts.

The reply is read from the session's event stream (`GET /v1/sessions/{id}/events`):
the `part` events of the turn that took the input in (the `input.promoted` naming
it), up to the `turn.completed` naming it. A fresh admission's stream starts at
the journal's live end taken before the input was admitted (`client.live_end`),
so none of the session's past is read; a re-sent input (`duplicate`) is followed
from the session's first event, since its reply may be under way or done.

When the stream breaks (the server drains, restarts or is SIGKILLed, or a load
balancer sends the client to another replica), the follower reconnects with the
last cursor it was given as `Last-Event-ID`. The cursor is a position in the
store's journal, so any `rem serve` on the same store resumes after it with every
later event once: each part is printed once, none is lost. It gives up after
GIVE_UP_S without a server (exit 3), saying how to follow the input again.

Holds, tool calls waiting for a person, a turn taken over after its executor
died and a failed turn are notes on stderr; the reply alone goes to stdout.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2

from backend.api import client
from backend.api.client import Remote, segment
from backend.core.errors import ExitCode, RemError, ServerUnreachable

RETRY_S = 1.0  # until the server's `retry:` says otherwise
MAX_BACKOFF_S = 5.0
GIVE_UP_S = 300.0
# the server sends a comment every 15 s: with three missed, the connection is taken as dead
STREAM_READ_TIMEOUT_S = 45.0
# one event's bound: a part is a few KiB (REM_STREAM_FLUSH_BYTES), a tool call's arguments at most 64 KiB
MAX_EVENT_BYTES = 8 * 1024 * 1024

Write = Callable[[str], None]


@dataclass
class Reply:
    """What the stream has said so far of the reply to one input."""

    input_id: str
    execution_id: str | None = None  # the turn that took the input in
    message_id: str | None = None  # the message of the last part printed
    texts: list[str] = field(default_factory=list)
    done: bool = False
    failure: dict[str, Any] | None = None  # a turn.failed of the input's turn
    # after a `reset` the stream starts again from the session's first event kept: the parts
    # already printed come again and are skipped (only then: a part seen twice is a fault)
    skip_seen: bool = False
    seen: set[tuple[str, int]] = field(default_factory=set)

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def take(self, kind: str, data: dict[str, Any]) -> tuple[str, str]:
        """One event: the text it adds to the reply, and a note for the person watching."""
        handler = HANDLERS.get(kind)
        return handler(self, data) if handler is not None else ("", "")

    def promoted(self, data: dict[str, Any]) -> tuple[str, str]:
        if self.input_id in (data.get("input_ids") or []):
            self.execution_id = str(data.get("execution_id"))
        return "", ""

    def part(self, data: dict[str, Any]) -> tuple[str, str]:
        idx, text = data.get("idx"), data.get("text")
        if self.execution_id is None or data.get("type") != "text" or not isinstance(text, str):
            return "", ""
        key = (str(data.get("message_id")), idx if isinstance(idx, int) else -1)
        if self.skip_seen and key in self.seen:
            return "", ""
        self.seen.add(key)
        if self.message_id not in (None, key[0]) and self.texts and not self.texts[-1].endswith("\n"):
            text = "\n" + text  # the turn's next reply (a step after a tool call) on a line of its own
        self.message_id = key[0]
        self.texts.append(text)
        return text, ""

    def completed(self, data: dict[str, Any]) -> tuple[str, str]:
        ours = self.input_id in (data.get("input_ids") or [])
        if ours or (self.execution_id is not None and data.get("execution_id") == self.execution_id):
            self.done = True
            self.message_id = data.get("message_id") or self.message_id
        return "", ""

    def failed(self, data: dict[str, Any]) -> tuple[str, str]:
        ours = self.execution_id is not None and data.get("execution_id") == self.execution_id
        if ours:
            self.failure = {"class": data.get("class"), "message": data.get("message")}
            self.done = data.get("class") == "recovery_parked"  # no turn.completed follows that one
        what = "the turn answering it" if ours else f"turn {data.get('execution_id')}"
        return "", f"rem: {what} failed ({data.get('class')}): {data.get('message')}"

    def recovered(self, data: dict[str, Any]) -> tuple[str, str]:
        if data.get("execution_id") != self.execution_id or self.execution_id is None:
            return "", ""
        return (
            "",
            "rem: the turn's executor died; another took it over (the reply goes on from its last step)",
        )

    def tool_call(self, data: dict[str, Any]) -> tuple[str, str]:
        call, tool, state = data.get("call_id"), data.get("tool"), data.get("state")
        if state == "awaiting_approval":
            return (
                "",
                f"rem: tool call {call} ({tool}) awaits approval: `rem approve {call}` or `rem deny {call}`",
            )
        if state == "unknown":
            return (
                "",
                f"rem: tool call {call} ({tool}) has an unknown outcome: `rem resolve {call} --done|--retry|--fail`",
            )
        return "", ""

    def held(self, data: dict[str, Any]) -> tuple[str, str]:
        return (
            "",
            f"rem: the session is held ({data.get('reason')}): {data.get('message') or 'it waits for a person'}",
        )

    def resumed(self, data: dict[str, Any]) -> tuple[str, str]:
        return "", "rem: the session's hold was lifted"

    def reset(self, data: dict[str, Any]) -> tuple[str, str]:
        self.skip_seen = True
        return "", (
            f"rem: the stream cannot resume from its cursor ({data.get('reason')}): reading the session again "
            "from its first event kept (parts already printed are skipped)"
        )


HANDLERS: dict[str, Callable[[Reply, dict[str, Any]], tuple[str, str]]] = {
    "input.promoted": Reply.promoted,
    "part": Reply.part,
    "turn.completed": Reply.completed,
    "turn.failed": Reply.failed,
    "turn.recovered": Reply.recovered,
    "tool_call": Reply.tool_call,
    "session.held": Reply.held,
    "session.resumed": Reply.resumed,
    "reset": Reply.reset,
}


@dataclass
class Cursor:
    """Where the follower is in the stream: the last `id:` it was given, and the server's `retry:`."""

    value: str | None
    retry_s: float = RETRY_S
    connected: bool = False  # the last attempt had its stream opened


def follow(
    remote: Remote,
    session_id: str,
    reply: Reply,
    *,
    after: str | None,
    write: Write,
    note: Write,
    give_up_s: float = GIVE_UP_S,
) -> None:
    """Read the session's events after `after` (None: from its first) until `reply` is done, printing
    its parts with `write` as they come; reconnect from the last cursor whenever the stream breaks."""
    cursor = Cursor(after)
    down_since: float | None = None
    attempts = 0
    while not reply.done:
        cursor.connected = False
        try:
            _read(remote, session_id, cursor, reply, write, note)
            reason = "the server ended the stream"
        except httpx2.SSEError as exc:  # an event over the bound: the same again on every reconnect
            raise ServerUnreachable(f"the event stream from {remote.url} broke its bound: {exc}") from None
        except httpx2.HTTPError as exc:
            reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        except RemError as exc:  # a proxy with no server behind it, a draining server, a store away
            if exc.exit_code != ExitCode.UNREACHABLE:
                raise  # refused for good: a revoked token, a session gone
            reason = str(exc)
        if reply.done:
            return
        now = time.monotonic()
        if cursor.connected or down_since is None:
            down_since, attempts = now, 0
        if now - down_since > give_up_s:
            raise ServerUnreachable(
                f"lost the event stream from {remote.url} for {give_up_s:.0f} s ({reason}); input "
                f"{reply.input_id} was admitted: follow it again with the same `rem send` and --id {reply.input_id}"
            )
        if attempts == 0:
            note(f"rem: lost the event stream from {remote.url} ({reason}); resuming from its cursor")
        time.sleep(min(cursor.retry_s * 2**attempts, MAX_BACKOFF_S))
        attempts += 1


def _read(remote: Remote, session_id: str, cursor: Cursor, reply: Reply, write: Write, note: Write) -> None:
    """One connection's events, until the reply is done or the stream ends."""
    headers = {"Last-Event-ID": cursor.value} if cursor.value else {}
    path = f"/v1/sessions/{segment(session_id)}/events"
    with remote.stream(path, headers, STREAM_READ_TIMEOUT_S) as response:
        cursor.connected = True
        for event in httpx2.EventSource(response, max_event_size=MAX_EVENT_BYTES):
            if event.retry is not None:
                cursor.retry_s = max(event.retry, 100) / 1000
            if event.event == "reset":  # an empty `id:` here: a reconnect starts at the session's first
                cursor.value = event.id or None
            elif event.id:
                cursor.value = event.id
            if not event.data:
                continue  # the priming block
            text, said = reply.take(event.event, _object(event.data))
            if said:
                note(said)
            if text:
                write(text)
            if reply.done:
                return


def _object(data: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def send(
    remote: Remote,
    session_id: str,
    text: str,
    *,
    delivery: str,
    input_id: str | None,
    project: str | None,
    admitted: Callable[[dict[str, Any]], None],
    write: Write,
    note: Write,
) -> dict[str, Any]:
    """`rem send --follow`: admit the input, tell `admitted`, follow its reply to the end; the
    admission with the reply (`message_id`: its last message; `text`: what was printed)."""
    after = client.live_end(remote)  # before the admission: all its events come after this
    result = client.send(remote, session_id, text, delivery=delivery, input_id=input_id, project=project)
    admitted(result)
    reply = Reply(result["input_id"])
    follow(remote, session_id, reply, after=None if result["duplicate"] else after, write=write, note=note)
    return {**result, "reply": {"message_id": reply.message_id, "text": reply.text, "failure": reply.failure}}
