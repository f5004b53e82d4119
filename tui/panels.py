"""The console's panels: their names (the ids, the focus keys 1-8, help and export names) and widgets."""

from __future__ import annotations

from tui.widgets.action_log import ActionLogTable
from tui.widgets.backlog import BacklogTable
from tui.widgets.drift import DriftTable
from tui.widgets.events import EventTable
from tui.widgets.leases import LeaseTable
from tui.widgets.receipts import ReceiptTable
from tui.widgets.sessions import SessionsTable
from tui.widgets.snapshot_table import SnapshotTable
from tui.widgets.workers import WorkerTable

# in focus-key order (1 … 8)
PANELS: tuple[tuple[str, type[SnapshotTable]], ...] = (
    ("backlog", BacklogTable),
    ("leases", LeaseTable),
    ("receipts", ReceiptTable),
    ("drift", DriftTable),
    ("workers", WorkerTable),
    ("events", EventTable),
    ("actions", ActionLogTable),
    ("sessions", SessionsTable),
)
# side by side across the screen
TOP = ("backlog", "leases", "receipts", "drift")
# the bottom grid, row by row: workers and sessions, then events and the action log
BOTTOM = ("workers", "sessions", "events", "actions")


def panel_key(name: str) -> int:
    """The number key that focuses a panel."""
    return [p for p, _ in PANELS].index(name) + 1


def new_panel(name: str) -> SnapshotTable:
    """A panel's widget, with its name as id."""
    return dict(PANELS)[name](id=name)
