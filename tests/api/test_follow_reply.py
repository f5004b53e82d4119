"""`rem send --follow`'s reading of a session's events (backend/api/follow.py): which parts are the
reply to the input followed, when it ends, what a `reset` does; and the follower giving up on a
server that does not come back, saying how to follow the input again."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from backend.api import client
from backend.api.follow import Reply, follow
from backend.core.errors import ServerUnreachable

E0, E1 = "exe_0", "exe_1"


def _feed(reply: Reply, events: list[tuple[str, dict[str, Any]]]) -> tuple[str, list[str]]:
    printed, notes = [], []
    for kind, data in events:
        text, note = reply.take(kind, data)
        printed.append(text)
        notes += [note] if note else []
    return "".join(printed), notes


def _part(message_id: str, idx: int, text: str) -> tuple[str, dict[str, Any]]:
    return "part", {"message_id": message_id, "idx": idx, "type": "text", "text": text}


def test_only_the_turn_that_took_the_input_in_is_printed_to_its_completion() -> None:
    reply = Reply("in-2")
    printed, notes = _feed(
        reply,
        [
            ("input.promoted", {"execution_id": E0, "input_ids": ["in-1"]}),
            _part(f"{E0}:1", 0, "an earlier question's answer"),
            ("turn.completed", {"execution_id": E0, "input_ids": ["in-1"], "message_id": f"{E0}:1"}),
            ("input.promoted", {"execution_id": E1, "input_ids": ["in-2"]}),
            _part(f"{E1}:1", 0, "Let me look. "),
            ("tool_call", {"call_id": "c1", "tool": "demo.send", "state": "awaiting_approval"}),
            ("session.held", {"reason": "tool_awaiting_approval", "message": None}),
            _part(f"{E1}:2", 0, "Sent."),
            _part(f"{E1}:2", 1, " Done."),
        ],
    )
    assert printed == "Let me look. \nSent. Done." and not reply.done
    assert notes[0] == "rem: tool call c1 (demo.send) awaits approval: `rem approve c1` or `rem deny c1`"
    assert notes[1].startswith("rem: the session is held (tool_awaiting_approval)")
    _feed(reply, [("turn.completed", {"execution_id": E1, "input_ids": ["in-2"], "message_id": f"{E1}:2"})])
    assert reply.done and reply.message_id == f"{E1}:2" and reply.failure is None


def test_a_failed_turn_is_noted_and_a_parked_one_ends_the_follow() -> None:
    reply = Reply("in-1")
    _feed(reply, [("input.promoted", {"execution_id": E0, "input_ids": ["in-1"]})])
    _, notes = _feed(reply, [("turn.failed", {"execution_id": E0, "class": "auth", "message": "bad key"})])
    assert notes == ["rem: the turn answering it failed (auth): bad key"] and not reply.done
    _feed(reply, [("turn.completed", {"execution_id": E0, "input_ids": ["in-1"], "message_id": "m"})])
    assert reply.done and reply.failure == {"class": "auth", "message": "bad key"}
    parked = Reply("in-1", execution_id=E0)
    _feed(parked, [("turn.failed", {"execution_id": E0, "class": "recovery_parked", "message": "gave up"})])
    assert parked.done and parked.failure == {"class": "recovery_parked", "message": "gave up"}


def test_after_a_reset_the_parts_already_printed_are_skipped_and_before_it_none_is() -> None:
    reply = Reply("in-1", execution_id=E0)
    assert _feed(reply, [_part(f"{E0}:1", 0, "a"), _part(f"{E0}:1", 0, "a")])[0] == "aa"  # a fault shows
    _, notes = _feed(reply, [("reset", {"reason": "pruned"})])
    assert "cannot resume from its cursor (pruned)" in notes[0]
    printed, _ = _feed(reply, [_part(f"{E0}:1", 0, "a"), _part(f"{E0}:1", 1, "b")])
    assert printed == "b"


def test_the_follower_gives_up_on_a_server_that_does_not_come_back(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: every connection is refused
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        remote = client.Remote(url, "rem_" + "x" * 43)
        notes: list[str] = []
        with pytest.raises(ServerUnreachable) as raised:
            follow(
                remote, "s1", Reply("in-9"), after="0", write=notes.append, note=notes.append, give_up_s=1.5
            )
        remote.close()
    assert f"lost the event stream from {url} for 2 s" in str(raised.value)
    assert "--id in-9" in str(raised.value)
    assert len(notes) == 1 and notes[0].startswith(f"rem: lost the event stream from {url} (")  # said once
