"""The receipt panel: summary rows whose latest verdict is not `present`, naming the keys."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.text import Text

from backend.ops.records import ReceiptVerdict, Status
from tui.format import age, cell, short, short_id
from tui.widgets.snapshot_table import Column, Palette, Record, SnapshotTable

VERDICT_LABEL: dict[str, str] = {
    ReceiptVerdict.MISSING: "missing",
    ReceiptVerdict.DOCUMENT_DIFFERS: "doc≠",
    ReceiptVerdict.KEYS_DIFFER: "keys≠",
    ReceiptVerdict.QUARANTINED: "quarant",
    ReceiptVerdict.PRESENT: "present",
}
VERDICT_TONE: dict[str, str] = {
    ReceiptVerdict.MISSING: "error",
    ReceiptVerdict.QUARANTINED: "error",
    ReceiptVerdict.DOCUMENT_DIFFERS: "warning",
    ReceiptVerdict.KEYS_DIFFER: "warning",
}


def differing_keys(record: Mapping[str, Any]) -> str:
    """What differs, in words: the owned keys, the document, or why it is quarantined."""
    verdict = record.get("verdict")
    if verdict == ReceiptVerdict.MISSING:
        return "row missing in Chroma"
    if verdict == ReceiptVerdict.QUARANTINED:
        return f"quarantined: {record.get('quarantine_reason') or '?'}"
    names = [str(k.get("key")) for k in record.get("keys") or [] if isinstance(k, dict)]
    if verdict == ReceiptVerdict.DOCUMENT_DIFFERS:
        names = ["document", *[n for n in names if n != "document"]]
    return ", ".join(names) or "-"


def _verdict(record: Record, now: int, palette: Palette) -> Text:
    verdict = str(record.get("verdict"))
    return cell(
        VERDICT_LABEL.get(verdict, verdict),
        VERDICT_TONE.get(verdict),
        palette,
        bold=verdict in (ReceiptVerdict.MISSING, ReceiptVerdict.QUARANTINED),
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

    LIST = "mismatched"

    def listed(self, snapshot: Status) -> int:
        return snapshot["counts"]["mismatches"]

    def records(self, snapshot: Status) -> Iterable[tuple[str, Record]]:
        for row in snapshot["receipts"]["mismatched"]:
            yield row["summary_id"], dict(row)

    def titles(self, snapshot: Status) -> tuple[str, bool]:
        counts = snapshot["receipts"]["counts"]
        mismatched = snapshot["counts"]["mismatches"]
        self.summary = f"present {counts[ReceiptVerdict.PRESENT]} · unchecked {counts['unchecked']}"
        return f"Receipts · {mismatched} mismatched", mismatched > 0
