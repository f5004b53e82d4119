"""The backlog panel: parked and waiting recoveries, inputs not yet promoted, failed summaries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.text import Text

from tui.format import age, cell, short, short_id
from tui.widgets.snapshot_table import Column, Palette, Record, SnapshotTable

WHAT_TONE = {"parked": "error", "failed": "error", "recov": "warning"}


def _what(record: Record, now: int, palette: Palette) -> Text:
    what = record["what"]
    return cell(what, WHAT_TONE.get(what), palette, bold=what in ("parked", "failed"))


def _age(record: Record, now: int, palette: Palette) -> Text:
    return cell(age(record.get("since"), now), None, palette)


def _detail(record: Record) -> str:
    what = record["what"]
    if what == "input":
        return f"{record.get('pending')} queued"
    if what in ("recov", "parked"):
        text = f"{record.get('phase')} ×{record.get('wake_attempts', 0)}"
        error = record.get("recovery_error")
        return f"{text} {error}" if error else text
    if what == "failed":
        return f"×{record.get('attempts', 0)} {record.get('last_error') or ''}".strip()
    return str(record.get("detail", ""))


def _rows(snapshot: Mapping[str, Any]) -> Iterable[tuple[str, Record]]:
    backlog = snapshot.get("backlog") or {}
    recoveries = sorted(backlog.get("recoveries") or [], key=lambda r: not r.get("parked"))
    for rec in recoveries:
        what = "parked" if rec.get("parked") else "recov"
        yield (
            f"rec:{rec.get('execution_id')}",
            {"what": what, "target": rec.get("session_id"), "since": rec.get("time_created"), **rec},
        )
    for sj in (backlog.get("summary_jobs") or {}).get("failed_rows") or []:
        yield (
            f"sumfail:{sj.get('session_id')}",
            {"what": "failed", "target": sj.get("session_id"), "since": sj.get("time_updated"), **sj},
        )
    for item in backlog.get("inputs") or []:
        yield (
            f"in:{item.get('session_id')}",
            {"what": "input", "target": item.get("session_id"), "since": item.get("oldest_at"), **item},
        )


def summary_line(snapshot: Mapping[str, Any]) -> str:
    """The aggregate counts that do not fit as rows: summary jobs, Dream by state, the index lag."""
    backlog = snapshot.get("backlog") or {}
    jobs = backlog.get("summary_jobs") or {}
    dream = backlog.get("dream") or {}
    by_state = dream.get("by_state") or {}
    index = backlog.get("index") or {}
    lag = f"index {index.get('sessions_behind', 0)} behind"
    if index.get("vectors_pending"):
        lag += f" {index['vectors_pending']} vec"
    # the index lag first: the panel's border cuts the end of the line when it is narrow
    return (
        f"{lag} · sum {jobs.get('pending', 0)} pend {jobs.get('in_progress', 0)} run "
        f"{jobs.get('stale', 0)} stale · dream {dream.get('pending', 0)} pend "
        f"{by_state.get('deferred', 0)} def"
    )


class BacklogTable(SnapshotTable):
    """Work waiting: recoveries (parked first), failed summaries, inputs by oldest."""

    PANEL_TITLE = "Backlog"
    PANEL_NAME = "backlog"
    EMPTY_TEXT = "✓ nothing waiting"
    COLUMNS = (
        Column("what", "what", 6, _what, sort=lambda r: r.get("what")),
        Column(
            "target",
            "session",
            10,
            lambda r, n, p: cell(short_id(r.get("target"))),
            sort=lambda r: r.get("target"),
        ),
        Column("age", "age", 5, _age, sort=lambda r: -(r.get("since") or 0), live=True),
        Column(
            "detail", "detail", None, lambda r, n, p: cell(short(_detail(r), 60)), sort=lambda r: _detail(r)
        ),
    )

    def records(self, snapshot: Mapping[str, Any]) -> Iterable[tuple[str, Record]]:
        return _rows(snapshot)

    def titles(self, snapshot: Mapping[str, Any]) -> tuple[str, bool]:
        counts = snapshot.get("counts") or {}
        backlog = snapshot.get("backlog") or {}
        parked = sum(1 for r in backlog.get("recoveries") or [] if r.get("parked"))
        total = counts.get("backlog", len(self._rows))
        title = f"Backlog {total}" + (f" · {parked} parked" if parked else "")
        failed = (backlog.get("summary_jobs") or {}).get("failed", 0)
        self.summary = summary_line(snapshot)
        return title, bool(parked or failed)
