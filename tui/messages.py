"""What the console's workers report (past tense); workers never touch widgets."""

from __future__ import annotations

from textual.message import Message

from backend.ops.console import ListLimits, StoreEvent
from backend.ops.records import Moment, Status
from tui.actions import ActionPlan, Outcome


class SnapshotLoaded(Message):
    """A status snapshot was read (in `took_ms`) at gate `data_version`, `limits` rows of each list."""

    def __init__(self, snapshot: Status, data_version: int, took_ms: float, limits: ListLimits) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.data_version = data_version
        self.took_ms = took_ms
        self.limits = limits


class DataDirChanged(Message):
    """state.db or its WAL changed on disk (the watcher saw it)."""


class StoreChanged(Message):
    """PostgreSQL's change feed reported: commits heard, listening again, or lost (retrying)."""

    def __init__(self, event: StoreEvent) -> None:
        super().__init__()
        self.event = event


class DryRunReady(Message):
    """The library's dry run finished; the plan carries its diff for the confirmation."""

    def __init__(self, plan: ActionPlan) -> None:
        super().__init__()
        self.plan = plan


class ActionCompleted(Message):
    """A confirmed action returned from `backend.ops` (its typed result and the line that says it)."""

    def __init__(self, plan: ActionPlan, outcome: Outcome) -> None:
        super().__init__()
        self.plan = plan
        self.outcome = outcome


class MomentLoaded(Message):
    """A recorded moment was read for the timeline (None: nothing further that way)."""

    def __init__(self, moment: Moment | None, how: str) -> None:
        super().__init__()
        self.moment = moment
        self.how = how
