"""The Dream drift panel: sessions whose revisions disagree, classified."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text

from backend.ops.records import DriftClass, Status
from tui.format import age, cell, short_id, short_revision
from tui.widgets.snapshot_table import Column, Palette, Record, SnapshotTable

CLASS_LABEL: dict[str, str] = {
    DriftClass.SUMMARY_STALE: "sum stale",
    DriftClass.DREAM_PENDING: "pending",
    DriftClass.STALE_COMPLETION: "stale done",
    DriftClass.DEFERRED: "deferred",
    DriftClass.UNDIGESTIBLE: "undigest",
    DriftClass.LEGACY_ONLY: "legacy",
}
CLASS_TONE: dict[str, str] = {
    DriftClass.UNDIGESTIBLE: "error",
    DriftClass.DEFERRED: "warning",
    DriftClass.STALE_COMPLETION: "warning",
    DriftClass.LEGACY_ONLY: "muted",
    DriftClass.SUMMARY_STALE: "primary",
}
CLASS_ABBREV: dict[DriftClass, str] = {
    DriftClass.SUMMARY_STALE: "sum",
    DriftClass.DREAM_PENDING: "pend",
    DriftClass.STALE_COMPLETION: "stale",
    DriftClass.DEFERRED: "def",
    DriftClass.UNDIGESTIBLE: "undig",
    DriftClass.LEGACY_ONLY: "legacy",
}


def _class(record: Record, now: int, palette: Palette) -> Text:
    klass = str(record.get("class"))
    return cell(
        CLASS_LABEL.get(klass, klass), CLASS_TONE.get(klass), palette, bold=klass == DriftClass.UNDIGESTIBLE
    )


def revisions(record: Record) -> str:
    """`in ab12cd3f → done 99ee11aa` (short published and completed revisions)."""
    text = (
        f"in {short_revision(record.get('input_revision'))} → "
        f"done {short_revision(record.get('completed_revision'))}"
    )
    if record.get("defer_reason"):
        text += f" ({record['defer_reason']})"
    return text


class DriftTable(SnapshotTable):
    """Dream revision drift by class: summary stale, pending, stale completion, deferred..."""

    PANEL_TITLE = "Dream drift"
    PANEL_NAME = "drift"
    EMPTY_TEXT = "✓ Dream up to date"
    COLUMNS = (
        Column(
            "session",
            "session",
            10,
            lambda r, n, p: cell(short_id(r.get("session_id"))),
            sort=lambda r: r.get("session_id"),
        ),
        Column("class", "class", 10, _class, sort=lambda r: r.get("class")),
        Column(
            "since",
            "since",
            6,
            lambda r, n, p: cell(age(r.get("since"), n)),
            sort=lambda r: -(r.get("since") or 0),
            live=True,
        ),
        Column(
            "attempts",
            "×",
            2,
            lambda r, n, p: cell(r.get("digest_attempts") or 0),
            sort=lambda r: r.get("digest_attempts") or 0,
        ),
        Column("revisions", "revisions", None, lambda r, n, p: cell(revisions(r)), sort=revisions),
    )

    LIST = "drift"

    def listed(self, snapshot: Status) -> int:
        return sum(snapshot["dream_counts"].values())

    def records(self, snapshot: Status) -> Iterable[tuple[str, Record]]:
        for row in snapshot["dream_drift"]:
            yield f"{row['class']}:{row['session_id']}", dict(row)

    def titles(self, snapshot: Status) -> tuple[str, bool]:
        counts = snapshot["dream_counts"]
        self.summary = " ".join(f"{CLASS_ABBREV[k]} {counts[k]}" for k in CLASS_ABBREV if counts.get(k))
        return f"Dream drift {sum(counts.values())}", bool(counts.get(DriftClass.UNDIGESTIBLE))
