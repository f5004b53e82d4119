"""The Dream drift panel: sessions whose revisions disagree, classified."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.text import Text

from tui.format import age, cell, short_id, short_revision
from tui.widgets.snapshot_table import Column, Palette, Record, SnapshotTable

CLASS_LABEL = {
    "summary_stale": "sum stale",
    "dream_pending": "pending",
    "stale_completion": "stale done",
    "deferred": "deferred",
    "undigestible": "undigest",
    "legacy_only": "legacy",
}
CLASS_TONE = {
    "undigestible": "error",
    "deferred": "warning",
    "stale_completion": "warning",
    "legacy_only": "muted",
    "summary_stale": "primary",
}
CLASS_ABBREV = {
    "summary_stale": "sum",
    "dream_pending": "pend",
    "stale_completion": "stale",
    "deferred": "def",
    "undigestible": "undig",
    "legacy_only": "legacy",
}


def _class(record: Record, now: int, palette: Palette) -> Text:
    klass = str(record.get("class"))
    return cell(CLASS_LABEL.get(klass, klass), CLASS_TONE.get(klass), palette, bold=klass == "undigestible")


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

    def records(self, snapshot: Mapping[str, Any]) -> Iterable[tuple[str, Record]]:
        for row in snapshot.get("dream_drift") or []:
            yield f"{row.get('class')}:{row.get('session_id')}", dict(row)

    def titles(self, snapshot: Mapping[str, Any]) -> tuple[str, bool]:
        counts = snapshot.get("dream_counts") or {}
        total = sum(v for v in counts.values() if isinstance(v, int)) if counts else len(self._rows)
        self.summary = " ".join(f"{CLASS_ABBREV[k]} {counts[k]}" for k in CLASS_ABBREV if counts.get(k))
        return f"Dream drift {total}", bool(counts.get("undigestible"))
