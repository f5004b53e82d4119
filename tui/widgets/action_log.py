"""The action log: what this console did (and what it was refused), plus every operator.* event."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import count

from rich.text import Text

from backend.ops.records import EventRecord, Status
from tui.format import cell, clock_time, compact_json, short
from tui.widgets.snapshot_table import Column, Palette, Record, SnapshotTable

OUTCOME_TONE = {
    "ok": "success",
    "refused": "error",
    "failed": "error",
    "cancelled": "muted",
    "dry-run": "primary",
    "journal": None,
}
MAX_LOCAL = 200


def _outcome(record: Record, now: int, palette: Palette) -> Text:
    outcome = str(record.get("outcome") or "")
    return cell(outcome, OUTCOME_TONE.get(outcome), palette, bold=outcome in ("refused", "failed"))


def _journal_record(event: EventRecord) -> Record:
    return {
        "time": event["time"],
        "action": event["kind"].removeprefix("operator."),
        "target": event["target"] or event["session_id"],
        "session_id": event["session_id"],
        "outcome": "journal",
        "message": f"{event['actor']}: {compact_json(event['data'], 160)}",
        "by": event["actor"],
        "event_id": event["id"],
        "data": event["data"],
    }


class ActionLogTable(SnapshotTable):
    """Operator actions newest first: this console's attempts and the journal's operator.* rows."""

    PANEL_TITLE = "Action log"
    PANEL_NAME = "actions"
    EMPTY_TEXT = "no actions yet"
    STICKY_TOP = True
    COLUMNS = (
        Column(
            "time",
            "time",
            8,
            lambda r, n, p: cell(clock_time(r.get("time")), "muted", p),
            sort=lambda r: r.get("time"),
        ),
        Column("action", "action", 8, lambda r, n, p: cell(r.get("action")), sort=lambda r: r.get("action")),
        Column("outcome", "result", 8, _outcome, sort=lambda r: r.get("outcome")),
        Column(
            "target",
            "target",
            14,
            lambda r, n, p: cell(short(r.get("target"), 14)),
            sort=lambda r: r.get("target"),
        ),
        Column(
            "message",
            "detail",
            None,
            lambda r, n, p: cell(short(r.get("message"), 90)),
            sort=lambda r: r.get("message"),
        ),
    )

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._local: list[tuple[str, Record]] = []
        self._journal: list[tuple[str, Record]] = []
        self._seq = count(1)

    def log_action(
        self, *, time: int, action: str, target: str, outcome: str, message: str, by: str = "console"
    ) -> Record:
        """Record one of this console's attempts (shown even when nothing was journaled)."""
        record = {
            "time": time,
            "action": action,
            "target": target,
            "outcome": outcome,
            "message": message,
            "by": by,
        }
        self._local.insert(0, (f"local:{next(self._seq)}", record))
        del self._local[MAX_LOCAL:]
        self._merge()
        return record

    LIST = "actions"

    def list_complete(self) -> bool:
        # this console's own entries are all here: the journal's rows say whether more follow
        return self._asked is None or len(self._journal) < self._asked

    def records(self, snapshot: Status) -> Iterable[tuple[str, Record]]:
        self._journal = [(f"event:{e['id']}", _journal_record(e)) for e in snapshot["recent_actions"]]
        return self._merged()

    def _merged(self) -> list[tuple[str, Record]]:
        rows = self._local + self._journal
        return sorted(rows, key=lambda kv: -(kv[1].get("time") or 0))

    def _merge(self) -> None:
        """Re-show after a local entry, keeping the last journal view."""
        self._set_rows(self._merged(), self._now, self._palette)
        self._show_title(*self._title())
        self._sync()

    def titles(self, snapshot: Status) -> tuple[str, bool]:
        return self._title()

    def _title(self) -> tuple[str, bool]:
        if not self.list_complete():
            return "Action log · newest first", False
        return f"Action log {len(self._rows)}", False
