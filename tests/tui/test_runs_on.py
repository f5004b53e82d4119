"""`a`'s line naming who runs an approved call: the turn's live holder, or the next executor to take it."""

from __future__ import annotations

from typing import Any

from tui.runs_on import approved_runner_line

NOW = 1_000_000


def _snapshot(parked: str | None, *, others: int = 0) -> Any:
    executors = [
        {
            "owner_id": f"executor-h-{pid}-abc",
            "role": "executor",
            "state": "running",
            "heartbeat_at": NOW - 500,
        }
        for pid in (11, 12)
    ]
    call = {"call_id": "c0", "execution_id": "e1"}
    return {
        "leases": [
            {
                "kind": "execution",
                "id": "e1",
                "owner_id": "executor-h-11-abc",
                "parked": parked,
                "expires_at": NOW,
            }
        ],
        "workers": [
            *executors,
            {"owner_id": "dream-h-13-abc", "role": "dream", "state": "running", "heartbeat_at": NOW},
        ],
        "tools": {
            "awaiting_approval": [call]
            + [{"call_id": f"c{i}", "execution_id": "e1"} for i in range(1, others + 1)],
            "unknown_outcome": [],
        },
    }


def test_a_held_turn_runs_the_call_in_its_holder() -> None:
    line = approved_runner_line({"call_id": "c0", "execution_id": "e1"}, _snapshot(None), NOW)
    assert line == "Runs in executor executor-h-11-abc, which holds its turn now."


def test_a_parked_turn_runs_it_in_the_next_executor_to_take_it_once_nothing_else_waits() -> None:
    line = approved_runner_line(
        {"call_id": "c0", "execution_id": "e1"}, _snapshot("tool_awaiting_approval"), NOW
    )
    assert line.startswith(
        "Approving it un-parks the turn: runs in the next executor to take the turn (2 alive:"
    )
    assert "exec:11" in line and "exec:12" in line and "dream" not in line
    waiting = approved_runner_line(
        {"call_id": "c0", "execution_id": "e1"}, _snapshot("tool_awaiting_approval", others=2), NOW
    )
    assert waiting.startswith("Runs once the turn's 2 other waiting calls are decided, in the next executor")
