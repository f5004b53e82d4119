"""The backlog panel: tool calls waiting for a person, held sessions, recoveries, failed summaries, inputs.

The agent tool calls an operator must decide come first, most urgent first: an unknown outcome
(`unknown`: an effect in flight when its executor died; `o` resolves it), then the calls
awaiting approval (`approve`: `a` approves, `n` denies), each oldest first; then the calls in
flight (`running`: the executor running each, how long it has run; `k` kills that executor)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from rich.text import Text

from backend.ops.records import DigestState, Status
from tui.format import age, cell, compact_json, owner_short, short, short_id
from tui.widgets.snapshot_table import Column, Palette, Record, SnapshotTable

WHAT_TONE = {
    "unknown": "error",
    "approve": "warning",
    "running": "primary",
    "parked": "error",
    "failed": "error",
    "held": "error",
    "recov": "warning",
}
# the backlog rows that are agent tool calls (their `what`), and the keys that decide them
TOOL_ROWS = {"unknown": "o resolves", "approve": "a approves · n denies", "running": "k kills it"}
# the hold reasons of a turn parked on its tool calls (`backend.execution.parking.TOOL_HOLDS`)
TOOL_HOLDS = ("tool_awaiting_approval", "tool_outcome_unknown")


def _what(record: Record, now: int, palette: Palette) -> Text:
    what = record["what"]
    return cell(what, WHAT_TONE.get(what), palette, bold=what in ("parked", "failed", "unknown"))


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
        reason = str(record.get("reason") or "")
        if reason in TOOL_HOLDS:  # parked on its tool calls (the rows above): decided there, not resumed
            return f"{record.get('waiting', 0)} asleep · {reason} · decide its tool call(s)"
        return f"{record.get('waiting', 0)} asleep · {reason} · u resumes"
    if what == "running":  # where it runs: the process `k` kills
        return (
            f"{record.get('tool')} · {record.get('effect')} · in {owner_short(record.get('owner_id'))}"
            f" · {TOOL_ROWS[what]} · {compact_json(record.get('arguments'), 40)}"
        )
    if what in TOOL_ROWS:
        owner = "" if record.get("owner_alive") else " · owner dead"
        return (
            f"{record.get('tool')} {compact_json(record.get('arguments'), 40)} · {record.get('effect')}"
            f"{owner} · {TOOL_ROWS[what]}"
        )
    return str(record.get("detail", ""))


def _tool_rows(snapshot: Status) -> Iterable[tuple[str, Record]]:
    """The tool calls waiting for a person (a moment recorded before tool calls had none)."""
    tools = snapshot.get("tools")
    if not tools:
        return
    for what, calls in (("unknown", tools["unknown_outcome"]), ("approve", tools["awaiting_approval"])):
        for call in calls:
            yield f"tool:{call['call_id']}", {"what": what, "target": call["session_id"], **call}
    for call in tools.get("running", []):  # (a moment recorded before they were listed has none)
        since = call["started_at"] or call["since"]  # its age: how long it has run
        yield (
            f"tool:{call['call_id']}",
            {"what": "running", "target": call["session_id"], **call, "since": since},
        )


def _rows(snapshot: Status) -> Iterable[tuple[str, Record]]:
    backlog = snapshot["backlog"]
    yield from _tool_rows(snapshot)
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


def parked_and_held(snapshot: Status) -> tuple[int, int]:
    """Recoveries parked and sessions held, counted (a window of the list may not hold them all);
    a moment recorded before the totals were has its rows counted."""
    recoveries = (cast(Mapping[str, Any], snapshot).get("totals") or {}).get("recoveries")
    if recoveries is None:
        return sum(1 for r in snapshot["backlog"]["recoveries"] if r["parked"]), len(
            snapshot["backlog"]["held"]
        )
    return recoveries["parked"], snapshot["counts"]["held"]


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
    """Work waiting: tool calls to decide, sessions held, recoveries (parked first), failed summaries, inputs."""

    PANEL_TITLE = "Backlog"
    PANEL_NAME = "backlog"
    EMPTY_TEXT = "✓ nothing waiting"
    COLUMNS = (
        Column("what", "what", 7, _what, sort=lambda r: r.get("what")),
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

    LIST = "backlog"

    def listed(self, snapshot: Status) -> int:
        """Its rows in all: an upper bound (sessions with inputs waiting are at most the inputs)."""
        counts = (snapshot.get("tools") or {}).get("counts", {})
        backlog, totals = snapshot["backlog"], snapshot["totals"]["recoveries"]
        return (
            counts.get("unknown", 0)
            + counts.get("awaiting_approval", 0)
            + counts.get("running", 0)
            + snapshot["counts"]["held"]
            + totals["waiting"]
            + totals["parked"]
            + backlog["summary_jobs"]["failed"]
            + backlog["inputs_total"]
        )

    def records(self, snapshot: Status) -> Iterable[tuple[str, Record]]:
        return _rows(snapshot)

    def titles(self, snapshot: Status) -> tuple[str, bool]:
        backlog = snapshot["backlog"]
        parked, held = parked_and_held(snapshot)
        counts = (snapshot.get("tools") or {}).get("counts", {})
        unknown, approvals = counts.get("unknown", 0), counts.get("awaiting_approval", 0)
        running = counts.get("running", 0)
        title = (
            f"Backlog {snapshot['counts']['backlog']}"
            + (f" · {unknown} unknown" if unknown else "")
            + (f" · {approvals} to approve" if approvals else "")
            + (f" · {running} running" if running else "")
            + (f" · {parked} parked" if parked else "")
            + (f" · {held} held" if held else "")
        )
        failed = backlog["summary_jobs"]["failed"]
        self.summary = summary_line(snapshot)
        return title, bool(parked or failed or held or unknown or approvals)
