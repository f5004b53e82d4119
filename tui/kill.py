"""The kill key's plans: which process `k` names, its blast radius, and the refusals said in one line.

`k` names a process by what the operator has selected: a worker row, the owner
of a lease or of a tool call (a `running` row in Backlog: the executor running
it), or the header's Chroma indicator (the data dir's Chroma server). The
confirmation (`tui/screens/kill.py`) names the process (role, pid, host, owner
id), the leases it holds and the tool calls it has running as the console
shows them, and the signal; `backend.ops.kill` checks all of it again against
the database and the process itself, sends SIGKILL and journals it. What the
console can tell from what it shows is refused at once, in one line: another
host, a worker already dead, the console's own process, Chroma not started
here (the library refuses these too, and a pid that is no longer the worker's).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from backend.ops.records import Status, ToolCallRecord
from tui.actions import ActionPlan, NotActionable
from tui.format import age, duration, short
from tui.widgets.leases import KIND_LABEL, left_ms
from tui.widgets.workers import worker_state

CHROMA = "chroma"  # `ops.kill`'s name for the data dir's Chroma server
LISTED = 6  # leases and calls named one by one; the rest counted
# what a death costs each role, after the leases and calls it holds
AFTER = {
    "executor": "Its turns wait for their leases to expire (or for you to release them, l in Leases); "
    "then another executor takes each over and recovers it.",
    "summarizer": "Its summary jobs wait for their leases; a receipt staged before the kill is replayed, "
    "with no model call.",
    "dream": "Its Dream claims wait for their leases; the revision it was digesting is digested again.",
    "server": "Its API requests and event streams are cut; clients resume on another server "
    "(Last-Event-ID), admissions are idempotent.",
}


class KillRefused(NotActionable):
    """`k` refused before any confirmation (the action log records it as refused)."""

    def __init__(self, target: str, message: str) -> None:
        super().__init__(message)
        self.target = target


def worker_named(record: Mapping[str, Any], panel: str, snapshot: Status) -> dict[str, Any]:
    """The worker row `k` means: the row itself (Workers), else the owner of a lease or tool call."""
    if panel == "workers":
        return dict(record)
    owner = record.get("owner_id")
    if not owner:
        raise NotActionable(
            "this row names no process: select a worker (5), a lease (2) or a running call (1)"
        )
    for worker in snapshot["workers"]:
        if worker["owner_id"] == owner:
            return dict(worker)
    raise KillRefused(str(owner), f"kill refused: {owner} is not a registered worker any more")


def worker_kill_plan(
    worker: Mapping[str, Any], snapshot: Status, now: int, *, here: str, own_pid: int | None = None
) -> ActionPlan:
    """SIGKILL one worker: its process, its leases, its running tool calls, the signal."""
    owner, pid, host = str(worker.get("owner_id")), worker.get("pid"), str(worker.get("host"))
    _refuse(worker, now, here=here, own_pid=os.getpid() if own_pid is None else own_pid)
    role, state = str(worker.get("role")), worker_state(dict(worker), now)
    leases = [lease for lease in snapshot["leases"] if lease["owner_id"] == owner]
    calls = [c for c in (snapshot.get("tools") or {}).get("running", []) if c["owner_id"] == owner]
    sections = [
        (
            "process",
            [
                f"role {role} · pid {pid} · host {host} (this host)",
                f"owner id {owner}",
                f"{state} · up {age(worker.get('started_at'), now)} · "
                f"heartbeat {age(worker.get('heartbeat_at'), now)} ago",
            ],
        ),
        (f"holds {_count(len(leases), 'lease')}", _lease_lines(leases, now)),
        (f"runs {_count(len(calls), 'tool call')}", _call_lines(calls, now)),
        (
            "signal",
            [f"SIGKILL to pid {pid}: no clean-up, no hand-back; it dies as in a crash.", AFTER.get(role, "")],
        ),
    ]
    return _plan(owner, f"SIGKILL {role} {owner}", sections, _warning(calls))


def chroma_kill_plan(snapshot: Status, *, here: str) -> ActionPlan:
    """SIGKILL the data dir's Chroma server: a drill of the vector store."""
    chroma = snapshot["chroma"]
    if chroma["external"]:
        raise KillRefused(
            CHROMA, f"kill refused: Chroma at {chroma['url']} is external; rem signals only its own"
        )
    pid = chroma.get("pid")
    if pid is None:
        raise KillRefused(
            CHROMA, "kill refused: no Chroma server runs for this data dir (chroma.lock is free)"
        )
    sections = [
        (
            "process",
            [
                f"role chroma · pid {pid} · host {here} (this host)",
                f"the data dir's server at {chroma['url']}",
            ],
        ),
        (
            "holds",
            [
                "the summary rows and the recall vectors (state.db keeps every receipt and turn)",
                "summarizer and Dream writes wait and retry; recall falls back to lexical search",
            ],
        ),
        ("signal", [f"SIGKILL to pid {pid}; `rem up` starts it again on the same port."]),
    ]
    return _plan(CHROMA, "SIGKILL the Chroma server", sections, "")


def _refuse(worker: Mapping[str, Any], now: int, *, here: str, own_pid: int) -> None:
    owner, host, pid = str(worker.get("owner_id")), str(worker.get("host")), worker.get("pid")
    if host != here:
        raise KillRefused(
            owner,
            f"kill refused: {owner} runs on host {host}, not this one ({here}); rem never signals another machine",
        )
    state = worker_state(dict(worker), now)
    if state in ("dead", "stopped"):
        raise KillRefused(owner, f"kill refused: {owner} is already {state}")
    if pid == own_pid:
        raise KillRefused(owner, f"kill refused: pid {pid} is this console's own process")


def _plan(target: str, title: str, sections: list[tuple[str, list[str]]], warning: str) -> ActionPlan:
    return ActionPlan(
        action="kill",
        title=title,
        targets=[target],
        lines=[line for _, lines in sections for line in lines if line],
        confirm_label="Kill",
        params={"target": target},
        warning=warning,
        sections=sections,
    )


def _lease_lines(leases: Sequence[Mapping[str, Any]], now: int) -> list[str]:
    lines = []
    for lease in leases[:LISTED]:
        kind = KIND_LABEL.get(str(lease["kind"]), str(lease["kind"]))
        left = left_ms(dict(lease), now)
        when = (
            "parked for a person"
            if lease.get("parked")
            else (f"expires in {duration(left)}" if left > 0 else f"expired {duration(-left)} ago")
        )
        lines.append(f"{kind} {short(lease['session_id'], 30)} · epoch {lease['epoch']} · {when}")
    return lines + ([f"… and {len(leases) - LISTED} more"] if len(leases) > LISTED else [])


def _call_lines(calls: Sequence[ToolCallRecord], now: int) -> list[str]:
    lines = [
        f"{c['tool']} of {short(c['session_id'], 30)} · {c['effect']} · running {duration(now - (c['started_at'] or now))}"
        for c in calls[:LISTED]
    ]
    return lines + ([f"… and {len(calls) - LISTED} more"] if len(calls) > LISTED else [])


def _warning(calls: Sequence[ToolCallRecord]) -> str:
    effects = sum(1 for c in calls if c["effect"] == "effect")
    if not effects:
        return ""
    return (
        f"{_count(effects, 'effect')} in flight: the takeover cannot know whether it happened, so it becomes "
        "`unknown` and holds its session until you resolve it (o in Backlog)."
    )


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"
