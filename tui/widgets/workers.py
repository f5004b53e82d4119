"""The workers strip: each daemon's role, pid, host, state and heartbeat age (live)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from rich.text import Text

from backend.ops.console import worker_alive as alive
from backend.ops.records import Status, WorkerState
from tui.format import age, cell, owner_short, short
from tui.widgets.snapshot_table import Column, Palette, Record, SnapshotTable


def worker_alive(record: Record, now: int) -> bool:
    beat = record.get("heartbeat_at")
    if beat is None:
        return bool(record.get("alive"))
    return alive(record.get("state"), beat, record.get("exited_at"), now)


def worker_state(record: Record, now: int) -> str:
    """`running`, `draining`, `stopped`, or `dead` (not stopped; seen to exit, or heartbeat too old)."""
    state = str(record.get("state") or "?")
    if state != WorkerState.STOPPED and not worker_alive(record, now):
        return "dead"
    return state


STATE_TONE = {"dead": "error", "draining": "warning", "stopped": "muted", "running": "success"}


def _state(record: Record, now: int, palette: Palette) -> Text:
    state = worker_state(record, now)
    shown = f"✗ {state}" if state == "dead" else state  # the mark its leases carry too
    return cell(shown, STATE_TONE.get(state), palette, bold=state == "dead")


def _beat(record: Record, now: int, palette: Palette) -> Text:
    tone = None if worker_alive(record, now) or record.get("state") == WorkerState.STOPPED else "error"
    return cell(age(record.get("heartbeat_at"), now), tone, palette)


class WorkerTable(SnapshotTable):
    """Live and recently stopped daemons; a dead heartbeat turns the row red."""

    PANEL_TITLE = "Workers"
    PANEL_NAME = "workers"
    EMPTY_TEXT = "no workers registered (is `rem up` running?)"
    COLUMNS = (
        Column(
            "worker",
            "worker",
            10,
            lambda r, n, p: cell(owner_short(r.get("owner_id"))),
            sort=lambda r: r.get("owner_id"),
        ),
        Column("state", "state", 8, _state, sort=lambda r: r.get("state"), live=True),
        Column("heartbeat", "beat", 6, _beat, sort=lambda r: -(r.get("heartbeat_at") or 0), live=True),
        Column(
            "leases", "leases", 6, lambda r, n, p: cell(r.get("leases", 0)), sort=lambda r: r.get("leases", 0)
        ),
        Column("pid", "pid", 7, lambda r, n, p: cell(r.get("pid")), sort=lambda r: r.get("pid")),
        Column(
            "host", "host", 14, lambda r, n, p: cell(short(r.get("host"), 14)), sort=lambda r: r.get("host")
        ),
        Column(
            "up",
            "up",
            7,
            lambda r, n, p: cell(age(r.get("started_at"), n)),
            sort=lambda r: -(r.get("started_at") or 0),
            live=True,
        ),
        Column("role", "role", 10, lambda r, n, p: cell(r.get("role")), sort=lambda r: r.get("role")),
        Column(
            "owner",
            "owner id",
            40,
            lambda r, n, p: cell(short(r.get("owner_id"), 40)),
            sort=lambda r: r.get("owner_id"),
        ),
    )

    def records(self, snapshot: Status) -> Iterable[tuple[str, Record]]:
        held = Counter(lease["owner_id"] for lease in snapshot["leases"])
        for worker in snapshot["workers"]:
            yield worker["owner_id"], {**worker, "leases": held[worker["owner_id"]]}

    def titles(self, snapshot: Status) -> tuple[str, bool]:
        return self.live_title(self._now)

    def live_title(self, now: int) -> tuple[str, bool]:
        records = self.all_records()
        dead = sum(1 for r in records if worker_state(r, now) == "dead")
        alive = sum(1 for r in records if worker_alive(r, now))
        hosts = len({r.get("host") for r in records})
        title = (
            f"Workers {alive} alive"
            + (f" on {hosts} hosts" if hosts > 1 else "")  # one host: the usual case, said by the host column
            + (f" · {dead} dead" if dead else "")
        )
        return title, dead > 0
