"""Which executor will run an approved tool call: the line `a`'s confirmation adds.

A turn waiting for an approval is parked: nobody holds it. The approval that
leaves nothing of the turn waiting un-parks it, and whichever executor takes
the turn next runs the call (so no name can be given yet: Backlog lists the
call under `running` with its executor once one has, and `k` there kills it).
A turn still held (its step had other calls running when this one was asked
for) runs the call in its holder. Read from what the console shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backend.ops.records import Status
from tui.format import owner_short
from tui.widgets.leases import owner_alive
from tui.widgets.workers import worker_alive

NAMED = 3  # live executors named; the rest counted


def approved_runner_line(record: Mapping[str, Any], snapshot: Status | None, now: int) -> str:
    """Who runs the call once approved: its turn's holder, or the next executor to take the turn."""
    if snapshot is None:
        return ""
    execution = record.get("execution_id")
    lease = next((x for x in snapshot["leases"] if x["kind"] == "execution" and x["id"] == execution), None)
    if lease is not None and not lease.get("parked") and owner_alive(_with_beat(lease, snapshot), now):
        return f"Runs in executor {lease['owner_id']}, which holds its turn now."
    tools = snapshot.get("tools") or {}
    waiting = [*tools.get("awaiting_approval", []), *tools.get("unknown_outcome", [])]
    others = sum(
        1 for c in waiting if c["execution_id"] == execution and c["call_id"] != record.get("call_id")
    )
    when = (
        f"Runs once the turn's {others} other waiting call{'s are' if others != 1 else ' is'} decided, in"
        if others
        else "Approving it un-parks the turn: runs in"
    )
    return f"{when} the next executor to take the turn ({_executors(snapshot, now)}); Backlog then lists it as running, with its executor (k kills it)."


def _with_beat(lease: Mapping[str, Any], snapshot: Status) -> dict[str, Any]:
    """The lease with its owner's heartbeat, as the Leases panel judges liveness."""
    worker = next((w for w in snapshot["workers"] if w["owner_id"] == lease["owner_id"]), None)
    if worker is None:
        return dict(lease)
    beat = {"owner_heartbeat_at": worker["heartbeat_at"], "owner_exited_at": worker.get("exited_at")}
    return {"owner_state": worker["state"], **lease, **beat}


def _executors(snapshot: Status, now: int) -> str:
    alive = [
        w["owner_id"] for w in snapshot["workers"] if w["role"] == "executor" and worker_alive(dict(w), now)
    ]
    if not alive:
        return "none alive now"
    named = ", ".join(owner_short(o) for o in alive[:NAMED]) + (
        f" +{len(alive) - NAMED}" if len(alive) > NAMED else ""
    )
    return f"{len(alive)} alive: {named}"
