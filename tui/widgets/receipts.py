"""The receipt panel: summary rows whose latest verdict is not `present`, naming the keys."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.text import Text

from tui.format import age, cell, short, short_id
from tui.widgets.snapshot_table import Column, Palette, Record, SnapshotTable

VERDICT_LABEL = {
    "missing": "missing",
    "document_differs": "doc≠",
    "keys_differ": "keys≠",
    "quarantined": "quarant",
    "present": "present",
}
VERDICT_TONE = {
    "missing": "error",
    "quarantined": "error",
    "document_differs": "warning",
    "keys_differ": "warning",
}


def differing_keys(record: Mapping[str, Any]) -> str:
    """What differs, in words: the owned keys, the document, or why it is quarantined."""
    verdict = record.get("verdict")
    if verdict == "missing":
        return "row missing in Chroma"
    if verdict == "quarantined":
        return f"quarantined: {record.get('quarantine_reason') or '?'}"
    names = [str(k.get("key")) for k in record.get("keys") or [] if isinstance(k, dict)]
    if verdict == "document_differs":
        names = ["document", *[n for n in names if n != "document"]]
    return ", ".join(names) or "-"


def _verdict(record: Record, now: int, palette: Palette) -> Text:
    verdict = str(record.get("verdict"))
    return cell(
        VERDICT_LABEL.get(verdict, verdict),
        VERDICT_TONE.get(verdict),
        palette,
        bold=verdict in ("missing", "quarantined"),
    )


class ReceiptTable(SnapshotTable):
    """Mismatched receipts: which summary row, its verdict, and which owned keys differ."""

    PANEL_TITLE = "Receipts"
    PANEL_NAME = "receipts"
    EMPTY_TEXT = "✓ receipts all match"
    COLUMNS = (
        Column(
            "session",
            "session",
            10,
            lambda r, n, p: cell(short_id(r.get("session_id"))),
            sort=lambda r: r.get("session_id"),
        ),
        Column("verdict", "verdict", 7, _verdict, sort=lambda r: r.get("verdict")),
        Column(
            "keys", "differs", None, lambda r, n, p: cell(short(differing_keys(r), 60)), sort=differing_keys
        ),
        Column(
            "checked",
            "checked",
            7,
            lambda r, n, p: cell(age(r.get("checked_at"), n)),
            sort=lambda r: -(r.get("checked_at") or 0),
            live=True,
        ),
    )

    def records(self, snapshot: Mapping[str, Any]) -> Iterable[tuple[str, Record]]:
        for row in (snapshot.get("receipts") or {}).get("mismatched") or []:
            yield str(row.get("summary_id") or row.get("session_id")), dict(row)

    def titles(self, snapshot: Mapping[str, Any]) -> tuple[str, bool]:
        counts = (snapshot.get("receipts") or {}).get("counts") or {}
        mismatched = (snapshot.get("counts") or {}).get("mismatches", len(self._rows))
        self.summary = f"present {counts.get('present', 0)} · unchecked {counts.get('unchecked', 0)}"
        return f"Receipts · {mismatched} mismatched", mismatched > 0
