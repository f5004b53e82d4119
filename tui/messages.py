"""What the console's workers report (past tense); workers never touch widgets."""

from __future__ import annotations

from textual.message import Message

from backend.ops.records import Moment
from tui.actions import ActionPlan, Outcome


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
