"""The console's action runner: from a key to a confirmed `backend.ops` call, a notification and a log line.

`tui/actions.py` says *what* an action is (its plan: targets, the lines the
confirmation shows, how to call the library, how to describe the result);
this module runs it in the console: it picks the selected row, asks the
library for a replay's dry run first, shows the confirmation that names the
targets, runs the confirmed plan in a worker, and reports the outcome (ok,
refused, failed, cancelled, dry-run) as a notification and a line in the
action log. The library re-checks every precondition; the console never
writes on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, Protocol

from textual.message import Message
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widget import Widget
from textual.worker import Worker

from backend.ops.console import Refused, RemError, host_name, now_ms
from backend.ops.records import Moment, Status
from tui import actions, kill
from tui.actions import ActionPlan, NotActionable
from tui.console_backend import ConsoleBackend
from tui.messages import ActionCompleted, DryRunReady
from tui.panels import panel_key
from tui.refresh import WorkerGroup
from tui.runs_on import approved_runner_line
from tui.screens.confirm import ConfirmScreen
from tui.screens.kill import KillScreen
from tui.screens.resolve import ResolveScreen
from tui.widgets.action_log import ActionLogTable
from tui.widgets.header import ConsoleHeader
from tui.widgets.snapshot_table import SnapshotTable

log = logging.getLogger("rem.console")

# the actions that change something (disabled when read-only or in the past)
ACTIONS = frozenset(
    {"replay_selected", "replay_all", "drain", "release", "resume", "approve", "deny", "resolve"}
)
# the kill keys: greyed out alike, but pressed anyway they say in one line why not (`kill`)
KILL_ACTIONS = frozenset({"kill", "kill_chroma"})


class ActionHost(Protocol):
    """What running an action needs of the app: panels, the snapshot shown, screens, workers."""

    @property
    def applied(self) -> Status | None: ...
    @property
    def backend(self) -> ConsoleBackend | None: ...
    @property
    def focused(self) -> Widget | None: ...
    @property
    def moment(self) -> Moment | None: ...

    read_only: bool

    def panel(self, name: str) -> SnapshotTable: ...
    def focused_panel(self) -> SnapshotTable: ...
    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
    ) -> None: ...
    def push_screen(
        self, screen: Screen[Any], callback: Callable[[bool | None], None] | None = None
    ) -> Any: ...
    def post_message(self, message: Message) -> bool: ...
    def run_worker(
        self,
        work: Callable[[], Coroutine[Any, Any, None]],
        name: str | None = "",
        group: str = "default",
        description: str = "",
        exit_on_error: bool = True,
        start: bool = True,
        exclusive: bool = False,
    ) -> Worker[None]: ...
    def request_refresh(self, force: bool = False, urgent: bool = False) -> None: ...
    def one_line(self, error: BaseException | None) -> str: ...


class ActionRunner:
    """Selection → (dry run) → confirmation → worker → notification and action log."""

    def __init__(self, host: ActionHost) -> None:
        self.host = host
        self._running: dict[Worker[Any], ActionPlan] = {}

    # -- from a key to a confirmation ---------------------------------------------------
    def _selected(self, name: str, what: str) -> dict[str, Any] | None:
        record = self.host.panel(name).selected_record()
        if record is None:
            self.host.notify(
                f"no {what} selected: focus the {name} panel ({panel_key(name)}) and pick a row",
                severity="warning",
            )
        return record

    def replay_selected(self) -> None:
        record = self._selected("receipts", "receipt")
        if record is not None:
            self.prepare_replay([record], False)

    def replay_all(self) -> None:
        receipts = self.host.panel("receipts")  # every row it lists, not those on screen: named in the plan
        receipts.with_whole_list(lambda: self._replay_all(receipts.all_records()))

    def _replay_all(self, records: list[dict[str, Any]]) -> None:
        if not records:
            self.host.notify("no mismatched receipts to replay", severity="information")
            return
        self.prepare_replay(records, True)

    def prepare_replay(self, records: list[dict[str, Any]], all_mismatched: bool) -> None:
        """Ask the library for the dry-run diff in a worker; the confirmation then shows it."""
        work = partial(self._dry_run, records, all_mismatched)  # started with the worker, as `@work` does
        self.host.run_worker(
            work, name="replay", group=WorkerGroup.DRY_RUN, exclusive=True, exit_on_error=False
        )

    async def _dry_run(self, records: list[dict[str, Any]], all_mismatched: bool) -> None:
        backend = self.host.backend
        assert backend is not None
        ids = None if all_mismatched else [str(r.get("summary_id")) for r in records]
        result = await backend.replay(ids, all_mismatched=all_mismatched, dry_run=True)
        self.host.post_message(
            DryRunReady(actions.replay_plan(records, all_mismatched=all_mismatched, dry_run=result))
        )

    def dry_run_ready(self, message: DryRunReady) -> None:
        """The library's dry run is in the plan: log it, then confirm with it."""
        plan = message.plan
        self.log(
            plan.action, plan.target_text, "dry-run", plan.preview.splitlines()[0] if plan.preview else ""
        )
        self.confirm(plan)

    def drain(self) -> None:
        record = self._selected("workers", "worker")
        if record is not None:
            leases = self.host.applied["leases"] if self.host.applied is not None else []
            self.confirm(actions.drain_plan(record, leases, now_ms()))

    def resume(self) -> None:
        panel = self.host.focused_panel()
        record = panel.selected_record() if panel.PANEL_NAME in ("backlog", "sessions") else None
        if record is None:
            self.host.notify(
                "no held session selected: focus Backlog (1) or Sessions (8) and pick a held row",
                severity="warning",
            )
            return
        self._confirm_or_say(lambda: actions.resume_plan(record))

    def release(self) -> None:
        record = self._selected("leases", "lease")
        if record is not None:
            self._confirm_or_say(lambda: actions.release_plan(record, now_ms()))

    def approve(self) -> None:
        self._decide_tool_call("approve")

    def deny(self) -> None:
        self._decide_tool_call("deny")

    def resolve(self) -> None:
        self._decide_tool_call("resolve")

    def _decide_tool_call(self, action: str) -> None:
        """A tool call selected in Backlog: confirm (resolve: choose) with everything it is, then decide."""
        record = self._selected("backlog", "tool call")
        if record is None:
            return
        try:
            plan = actions.tool_call_plan(record, action, now_ms())
        except NotActionable as exc:
            self.host.notify(str(exc), severity="warning")
            return
        if action == "approve":  # who will run it (tui/runs_on.py)
            plan.lines.insert(-1, approved_runner_line(record, self.host.applied, now_ms()))
        if action != "resolve":
            self.confirm(plan)
            return

        def chosen(choice: tuple[str, str] | None) -> None:
            if choice is None:
                self.log(plan.action, plan.target_text, "cancelled", "cancelled at the confirmation")
                return
            plan.params.update(choice=choice[0], text=choice[1])
            self.execute(plan)

        self.host.push_screen(ResolveScreen(plan), callback=chosen)  # type: ignore[arg-type]

    def kill(self) -> None:
        """`k`: SIGKILL the process the selection names (a worker, a lease's or a call's owner), or
        Chroma when the header has the focus; refused in one line when the console can tell why."""
        if isinstance(self.host.focused, ConsoleHeader):
            self.kill_chroma()
            return
        panel = self.host.focused_panel()
        record = panel.selected_record() if panel.PANEL_NAME in ("workers", "leases", "backlog") else None
        if record is None:
            self.host.notify(
                "nothing to kill selected: pick a worker (5), a lease (2) or a running call in Backlog (1), "
                "or the header's Chroma (0)",
                severity="warning",
            )
            return
        self._kill(
            lambda snap: self._worker_plan(record, panel.PANEL_NAME, snap), str(record.get("owner_id"))
        )

    def kill_chroma(self) -> None:
        self._kill(lambda snap: kill.chroma_kill_plan(snap, here=host_name()), kill.CHROMA)

    def _worker_plan(self, record: dict[str, Any], panel: str, snapshot: Status) -> ActionPlan:
        worker = kill.worker_named(record, panel, snapshot)
        return kill.worker_kill_plan(worker, snapshot, now_ms(), here=host_name())

    def _kill(self, plan: Callable[[Status], ActionPlan], target: str) -> None:
        snapshot = self.host.applied
        try:
            if self.host.read_only:
                raise kill.KillRefused(target, "kill refused: this console is read-only")
            if self.host.moment is not None:
                raise kill.KillRefused(
                    target, "kill refused: the console shows the past; t goes back to live"
                )
            if snapshot is None:
                raise NotActionable("nothing is shown yet: wait for the first snapshot")
            self.confirm(plan(snapshot))
        except kill.KillRefused as exc:
            self.host.notify(str(exc), title="kill refused", severity="error", timeout=8)
            self.log("kill", exc.target, "refused", str(exc))
        except NotActionable as exc:
            self.host.notify(str(exc), severity="warning")

    def _confirm_or_say(self, plan: Callable[[], ActionPlan]) -> None:
        try:
            self.confirm(plan())
        except NotActionable as exc:
            self.host.notify(str(exc), severity="warning")

    def confirm(self, plan: ActionPlan) -> None:
        """Show the confirmation; run the plan only if the operator confirms."""

        def decided(confirmed: bool | None) -> None:
            if confirmed:
                self.execute(plan)
            else:
                self.log(plan.action, plan.target_text, "cancelled", "cancelled at the confirmation")

        screen = KillScreen(plan) if plan.action == "kill" else ConfirmScreen(plan)
        self.host.push_screen(screen, callback=decided)

    # -- running it and saying how it went ---------------------------------------------
    def execute(self, plan: ActionPlan) -> Worker[None]:
        """Run a confirmed plan in a worker (its failure comes back through `failed`)."""
        worker = self.host.run_worker(
            partial(self._run, plan), name=plan.action, group=WorkerGroup.ACTION, exit_on_error=False
        )
        self._running[worker] = plan
        return worker

    async def _run(self, plan: ActionPlan) -> None:
        backend = self.host.backend
        assert backend is not None
        self.host.post_message(ActionCompleted(plan, await actions.execute(plan, backend)))

    def action_completed(self, message: ActionCompleted) -> None:
        """The library did it: say what it did, log it, and read the new state at once."""
        plan, text = message.plan, message.outcome.text
        self.host.notify(text, title=f"{plan.action} done", timeout=8)
        self.log(plan.action, plan.target_text, "ok", text)
        self.host.request_refresh(force=True, urgent=True)  # the operator waits for what it did

    def finished(self, worker: Worker[Any]) -> None:
        self._running.pop(worker, None)

    def failed(self, worker: Worker[Any], error: BaseException | None) -> None:
        """A dry run or a confirmed action raised: refused (read-only included) or failed."""
        plan = self._running.pop(worker, None)
        outcome = "refused" if isinstance(error, Refused) else "failed"  # ReadOnly is a Refused
        action = plan.action if plan else worker.name
        target = plan.target_text if plan else "-"
        message = self.host.one_line(error)
        self.host.notify(
            f"{action} {target} {outcome}: {message}",
            title=f"{action} {outcome}",
            severity="error",
            timeout=8,
        )
        self.log(action, target, outcome, message)
        if not isinstance(error, RemError):
            log.error("%s failed", action, exc_info=error)

    def log(self, action: str, target: str, outcome: str, message: str) -> None:
        """One line in the action log, stamped now."""
        action_log = self.host.panel("actions")
        assert isinstance(action_log, ActionLogTable)
        action_log.log_action(time=now_ms(), action=action, target=target, outcome=outcome, message=message)
