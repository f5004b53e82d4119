"""The lease panel: every execution, summary-job and Dream lease, soonest expiry first."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.text import Text

from backend.ops.console import worker_alive
from backend.ops.records import LeaseKind, Status, WorkerState
from tui.format import cell, owner_short, short_id, time_left
from tui.widgets.snapshot_table import Column, Palette, Record, SnapshotTable

KIND_LABEL: dict[str, str] = {
    LeaseKind.EXECUTION: "exec",
    LeaseKind.SUMMARY_JOB: "sum",
    LeaseKind.DREAM: "dream",
}
WARN_BEFORE_MS = 5_000


def lease_key(lease: Mapping[str, Any]) -> str:
    return f"{lease.get('kind', 'execution')}:{lease.get('id')}"


def owner_alive(record: Record, now: int) -> bool:
    """Alive by the owner's last heartbeat as of `now` (ticks without a refresh), and not seen to exit."""
    beat = record.get("owner_heartbeat_at")
    if beat is None:
        return bool(record.get("owner_alive"))
    return worker_alive(record.get("owner_state"), beat, record.get("owner_exited_at"), now)


def left_ms(record: Record, now: int) -> int:
    return int(record.get("expires_at") or 0) - now


def _left(record: Record, now: int, palette: Palette) -> Text:
    if record.get("parked"):  # held by nobody until a person decides: no countdown to watch
        return cell("held", "warning", palette)
    left = left_ms(record, now)
    if left <= 0:
        return cell(time_left(left), "error", palette, bold=True)
    return cell(time_left(left), "warning" if left <= WARN_BEFORE_MS else None, palette)


def _owner(record: Record, now: int, palette: Palette) -> Text:
    owner = owner_short(record.get("owner_id"))
    if not owner_alive(record, now):
        return cell(f"✗ {owner}", "error", palette)
    if record.get("owner_state") == WorkerState.DRAINING:
        return cell(f"⇣ {owner}", "warning", palette)
    return cell(f"● {owner}", None, palette)


class LeaseTable(SnapshotTable):
    """Leases with a live countdown; expired in the error colour, dead owners marked ✗."""

    PANEL_TITLE = "Leases"
    PANEL_NAME = "leases"
    EMPTY_TEXT = "no leases held"
    COLUMNS = (
        Column("left", "left", 5, _left, sort=lambda r: r.get("expires_at"), live=True),
        Column(
            "session",
            "session",
            10,
            lambda r, n, p: cell(short_id(r.get("session_id"))),
            sort=lambda r: r.get("session_id"),
        ),
        Column("owner", "owner", 12, _owner, sort=lambda r: r.get("owner_id"), live=True),
        Column(
            "kind",
            "kind",
            5,
            lambda r, n, p: cell(KIND_LABEL.get(str(r.get("kind")), r.get("kind"))),
            sort=lambda r: r.get("kind"),
        ),
        Column("epoch", "epoch", 5, lambda r, n, p: cell(r.get("epoch")), sort=lambda r: r.get("epoch")),
        Column(
            "phase", "phase", 8, lambda r, n, p: cell(r.get("phase") or "-"), sort=lambda r: r.get("phase")
        ),
    )

    def records(self, snapshot: Status) -> Iterable[tuple[str, Record]]:
        beats = {w["owner_id"]: w for w in snapshot["workers"]}
        for lease in snapshot["leases"]:
            record: Record = dict(lease)
            worker = beats.get(lease["owner_id"] or "")
            if worker is not None:
                record["owner_heartbeat_at"] = worker["heartbeat_at"]
                record["owner_exited_at"] = worker.get("exited_at")
                record.setdefault("owner_state", worker["state"])
            yield lease_key(lease), record

    def expired_count(self, now: int) -> int:
        return sum(1 for r in self.all_records() if left_ms(r, now) <= 0 and not r.get("parked"))

    def titles(self, snapshot: Status) -> tuple[str, bool]:
        return self.live_title(self._now)

    def live_title(self, now: int) -> tuple[str, bool]:
        expired = self.expired_count(now)
        return f"Leases {len(self._rows)}" + (f" · {expired} expired" if expired else ""), expired > 0
