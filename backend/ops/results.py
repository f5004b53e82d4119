"""What each operator action returns: one TypedDict per action, shared by the CLI, the console and `--json`.

An action (`backend.ops.actions`) builds its result here, journals it in the
same transaction as its effect, and returns it; `rem ... --json` prints it as
it is (TypedDicts serialise as they are) and the console reads it by these
keys, which mypy checks. So a new action (approve, deny, resolve) adds its
TypedDict here, one `Action...` name in `ActionResult`, and its one-line
description in `tui/actions.py`, and every reader learns its shape at once.

Enum-typed fields hold members of the enums named; `json.dumps` writes them
as their plain string values.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from backend.execution.model_turns import ResumedSession
from backend.store.workers import LeaseKind, WorkerRole, WorkerState
from backend.summaries.replay_report import ReplayReport

__all__ = [
    "ActionResult",
    "DrainReport",
    "HeldLease",
    "KillReport",
    "LeaseReleased",
    "LeaseSeen",
    "ReplayReport",
    "ResumeReport",
    "ResumedSession",
    "RunningCall",
    "ToolDecision",
]


class LeaseSeen(TypedDict):
    """The grant a release found (and was fenced on), as it stood when the release ran."""

    owner_id: str
    epoch: int
    expires_at: int
    time_left_ms: int  # negative: it had expired already
    phase: NotRequired[str]  # an execution's phase (ExecutionPhase)


class LeaseReleased(TypedDict):
    """`release`: a lease expired now under a new epoch; its holder's late writes are fenced."""

    kind: LeaseKind
    id: str  # the lease as the operator named it: an execution id, or a session id
    owner_id: str
    old_epoch: int
    new_epoch: int
    forced: bool
    seen: LeaseSeen
    # an execution lease's release also says
    execution_id: NotRequired[str]
    session_id: NotRequired[str]
    owner_alive: NotRequired[bool]  # its owner was still heartbeating: it was stuck, not dead
    expected_epoch: NotRequired[int | None]
    unparked: NotRequired[bool]  # a parked execution got a fresh recovery budget
    released_at: NotRequired[int]


class DrainReport(TypedDict):
    """`drain`: the worker was asked to drain; with `--wait`, how it went until it stopped."""

    owner_id: str
    role: WorkerRole
    previous_state: WorkerState
    state: WorkerState
    # with --wait
    leases_held: NotRequired[int]
    waited_ms: NotRequired[int]


class ResumeReport(TypedDict):
    """`resume`: the sessions whose model-error hold was lifted."""

    resumed: list[ResumedSession]
    count: int
    reask: bool
    resumed_at: int


class ToolDecision(TypedDict):
    """`approve`, `deny`, `resolve`: an operator's decision on one agent tool call."""

    call_id: str
    session_id: str
    tool: str  # NAME.TOOL
    arguments: Any  # the call's arguments (JSON), as the model asked for them
    effect: str  # read, idempotent or effect (EffectClass)
    decision: Literal["approve", "deny", "done", "retry", "fail"]
    previous_state: str  # the state the decision found and re-checked (ToolCallState)
    state: str  # the state it moved the call to
    unparked: bool  # nothing else of the turn waits: an executor takes it over now
    decided_by: str
    decided_at: int  # Unix time in ms


class HeldLease(TypedDict):
    """A lease a killed worker held when the kill ran: it expires, or an operator releases it."""

    kind: str  # a LeaseKind: execution, summary_job or dream
    id: str  # the execution id, or the session id
    session_id: str


class RunningCall(TypedDict):
    """A tool call a killed worker had running: an effect becomes `unknown` at the takeover."""

    call_id: str
    session_id: str
    tool: str  # NAME.TOOL
    effect: str  # read, idempotent or effect
    started_at: int | None


class KillReport(TypedDict):
    """`kill`: one process SIGKILLed on this host, and what it held when it was (a drill)."""

    target: str  # the worker's owner id, or `chroma` (the data dir's Chroma server)
    role: str  # a WorkerRole, or `chroma`
    pid: int
    host: str
    process_started_at: float | None  # the kernel's start time it was identified by (None: not recorded)
    signal: str  # SIGKILL
    leases: list[HeldLease]
    running_calls: list[RunningCall]
    exited: bool  # seen gone within a second, and recorded dead (`exited_at`) at once
    killed_by: str
    killed_at: int  # Unix time in ms
    url: NotRequired[str]  # Chroma's


# every operator action's result
ActionResult = LeaseReleased | DrainReport | ReplayReport | ResumeReport | ToolDecision | KillReport
