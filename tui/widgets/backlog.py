"""The backlog panel: parked and waiting recoveries, inputs not yet promoted, failed summaries."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text

from backend.ops.records import DigestState, Status
from tui.format import age, cell, short, short_id
from tui.widgets.snapshot_table import Column, Palette, Record, SnapshotTable

WHAT_TONE = {"parked": "error", "failed": "error", "held": "error", "recov": "warning"}


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
    if what == "held":
        return f"{record.get('waiting', 0)} asleep · {record.get('reason') or ''} · u resumes"
    return str(record.get("detail", ""))


def _rows(snapshot: Status) -> Iterable[tuple[str, Record]]:
    backlog = snapshot["backlog"]
    for held in backlog["held"]:
        yield (
            f"held:{held['session_id']}",
            {"what": "held", "target": held["session_id"], "since": held["held_at"], **held},
        )
    for rec in sorted(backlog["recoveries"], key=lambda r: not r["parked"]):
        what = "parked" if rec["parked"] else "recov"
        yield (
            f"rec:{rec['execution_id']}",
            {"what": what, "target": rec["session_id"], "since": rec["time_created"], **rec},
        )
    for sj in backlog["summary_jobs"]["failed_rows"]:
        yield (
            f"sumfail:{sj['session_id']}",
            {"what": "failed", "target": sj["session_id"], "since": sj["time_updated"], **sj},
        )
    for item in backlog["inputs"]:
        yield (
            f"in:{item['session_id']}",
            {"what": "input", "target": item["session_id"], "since": item["oldest_at"], **item},
        )


def summary_line(snapshot: Status) -> str:
    """The aggregate counts that do not fit as rows: the index lag, summary jobs, Dream by state."""
    jobs, dream = snapshot["backlog"]["summary_jobs"], snapshot["backlog"]["dream"]
    index = snapshot["backlog"]["index"]
    lag = f"index {index['sessions_behind']} behind"
    if index["vectors_pending"]:
        lag += f" {index['vectors_pending']} vec"
    # the index lag first: the panel's border cuts the end of the line when it is narrow
    return (
        f"{lag} · sum {jobs['pending']} pend {jobs['in_progress']} run "
        f"{jobs['stale']} stale · dream {dream['pending']} pend "
        f"{dream['by_state'].get(DigestState.DEFERRED, 0)} def"
    )


class BacklogTable(SnapshotTable):
    """Work waiting: sessions held for an operator, recoveries (parked first), failed summaries, inputs."""

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

    def records(self, snapshot: Status) -> Iterable[tuple[str, Record]]:
        return _rows(snapshot)

    def titles(self, snapshot: Status) -> tuple[str, bool]:
        backlog = snapshot["backlog"]
        parked = sum(1 for r in backlog["recoveries"] if r["parked"])
        held = len(backlog["held"])
        title = (
            f"Backlog {snapshot['counts']['backlog']}"
            + (f" · {parked} parked" if parked else "")
            + (f" · {held} held" if held else "")
        )
        failed = backlog["summary_jobs"]["failed"]
        self.summary = summary_line(snapshot)
        return title, bool(parked or failed or held)
