"""The typed records of the status snapshot: what `ops.status` returns, the console shows
and `rem status --json` prints (the same dicts: TypedDicts serialise as they are).

One module for both sides, so a change of shape is one change here that mypy
carries to every reader. Enum-typed fields hold members of the enums named;
`json.dumps` writes them as their plain string values.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from backend.execution.leases import ExecutionPhase
from backend.memory.index import IndexLag
from backend.models.health import ModelState
from backend.store.states import DigestState, DriftClass
from backend.store.workers import LeaseKind, WorkerRole, WorkerState
from backend.summaries.receipts import ReceiptVerdict
from backend.summaries.replay_report import ReplayReport, ReplayRow

# the replay report is built in the summaries layer, the drift classes in the store's vocabulary;
# named here too, so the console imports every record it reads from one module
__all__ = [
    "ApiLatency",
    "ApiRequestCount",
    "ApiServerRecord",
    "ApiStatus",
    "Backlog",
    "ChromaHealth",
    "Counts",
    "DigestState",
    "DriftClass",
    "ExecutionPhase",
    "LeaseKind",
    "ModelState",
    "ReceiptVerdict",
    "WorkerRole",
    "WorkerState",
    "DreamBacklog",
    "DriftRecord",
    "EventRecord",
    "FailedSummary",
    "HeldSession",
    "InputBacklog",
    "KeyDiff",
    "LatencyHistogram",
    "LeaseTotals",
    "OperatorActionCount",
    "LastModelError",
    "LeaseRecord",
    "ModelHealth",
    "ReceiptMismatch",
    "Receipts",
    "RecoveryBacklog",
    "Moment",
    "RecordedMoment",
    "RecoveryTotals",
    "ReplayReport",
    "ReplayRow",
    "SessionUsage",
    "Snapshot",
    "Status",
    "SummaryJobs",
    "Throughput",
    "ToolCallRecord",
    "ToolCalls",
    "ToolServerRecord",
    "Totals",
    "Usage",
    "UsageTotal",
    "WorkerRecord",
]


class InputBacklog(TypedDict):
    """A session with admitted inputs not promoted yet."""

    session_id: str
    pending: int
    oldest_at: int
    oldest_age_ms: int


class RecoveryBacklog(TypedDict):
    """An interrupted execution waiting for takeover, or parked for the operator."""

    execution_id: str
    session_id: str
    phase: ExecutionPhase
    wake_attempts: int
    recovery_error: str | None
    time_created: int
    parked: bool


class FailedSummary(TypedDict):
    session_id: str
    attempts: int
    last_error: str | None
    time_updated: int


class SummaryJobs(TypedDict):
    """summary_job counts by status (`stale`: raw turns changed since the last summary)."""

    pending: int
    in_progress: int
    failed: int
    stale: int
    failed_rows: list[FailedSummary]


class DreamBacklog(TypedDict):
    pending: int  # published revisions not completed
    by_state: dict[DigestState, int]


class HeldSession(TypedDict):
    """A session a model error holds until an operator acts (`rem resume`); its inputs wait asleep."""

    session_id: str
    held_at: int
    held_ms: int
    reason: str  # "<error class>: <message>"
    error_class: str | None
    waiting: int  # inputs not promoted yet


class Backlog(TypedDict):
    inputs: list[InputBacklog]
    inputs_total: int
    held: list[HeldSession]
    recoveries: list[RecoveryBacklog]
    summary_jobs: SummaryJobs
    dream: DreamBacklog
    # the recall index's lag (backend.memory.index.index_lag_sync)
    index: IndexLag


class LeaseRecord(TypedDict):
    """One held lease of any kind; `id` is what `rem release` takes."""

    kind: LeaseKind
    id: str  # the execution id, or the session id of a summary-job or Dream lease
    session_id: str
    owner_id: str | None
    epoch: int
    phase: ExecutionPhase | None  # executions only
    expires_at: int
    owner_state: WorkerState | None  # None: the owner has no worker row
    time_left_ms: int
    expired: bool  # past its expiry and not parked
    owner_alive: bool
    # an execution parked for a person (`tool_awaiting_approval`, `tool_outcome_unknown`): held by
    # nobody and renewed by nobody until a decision, so its expiry says nothing; else None
    parked: str | None


class KeyDiff(TypedDict):
    """One receipt-owned key that differs on the Chroma row, as the stored verdict names it."""

    key: str
    expected: Any
    actual: Any
    reason: str | None  # a KeyReason when rem wrote it; stored text is shown as it is


class ReceiptMismatch(TypedDict):
    summary_id: str
    session_id: str
    verdict: ReceiptVerdict
    keys: list[KeyDiff]
    detail: dict[str, Any]  # the stored verdict detail (the document diff, ...)
    checked_at: int | None
    quarantine_reason: str | None


class Receipts(TypedDict):
    counts: dict[str, int]  # by ReceiptVerdict, plus `unchecked`
    mismatched: list[ReceiptMismatch]


# `class` is a keyword: the functional form
DriftRecord = TypedDict(
    "DriftRecord",
    {
        "session_id": str,
        "input_revision": str | None,
        "completed_revision": str | None,
        "digest_state": DigestState | None,  # None: summary_stale rows with no Dream state
        "digest_attempts": int,
        "defer_reason": str | None,
        "since": int,
        "class": DriftClass,
    },
)


class WorkerRecord(TypedDict):
    owner_id: str
    role: WorkerRole
    pid: int
    host: str
    state: WorkerState
    started_at: int
    heartbeat_at: int
    heartbeat_age_ms: int
    exited_at: int | None  # when its supervisor saw the process exit (dead from then on)
    alive: bool


class EventRecord(TypedDict):
    """One journal row; `data` decoded (`{"raw": text}` if it is not JSON)."""

    id: int
    time: int
    kind: str  # an EventKind, or a kind a newer rem wrote
    actor: str
    session_id: str | None
    target: str | None
    data: dict[str, Any]


class Counts(TypedDict):
    """The headline figures (the console's header, trends and panel titles)."""

    backlog: int
    expired_leases: int
    mismatches: int
    dream_pending: int
    sessions: int
    held: int  # sessions held after a model error (Backlog.held)
    workers_alive: int


class RefusedListener(TypedDict):
    """A process rem refused to talk to, listening where the data dir's Chroma server was (or is)."""

    url: str
    uids: list[int]  # its owner, when another user's
    users: list[str]
    pids: list[int]  # as far as this user may see them
    error: str  # the refusal, one line
    since: int | None  # when it was journaled (ms), None when seen just now
    event_id: int | None


class ChromaHealth(TypedDict):
    url: str | None
    external: bool
    healthy: bool
    error: str | None
    lock_held: NotRequired[bool]  # the data dir's own server only
    pid: NotRequired[int | None]
    # something not rem's server listens where rem's was: nothing is sent to it (None: nothing is)
    refused: RefusedListener | None


class LeaseTotals(TypedDict):
    """The leases of one kind, all of them (the list stops at what a panel shows)."""

    held: int
    expired: int
    dead_owner: int
    expired_max_ms: int  # how long the longest-expired one has been expired (0: none)


class RecoveryTotals(TypedDict):
    waiting: int
    parked: int


class Totals(TypedDict):
    """Uncapped figures for metrics and alerts (`ops.totals`)."""

    leases: dict[str, LeaseTotals]  # by LeaseKind
    backlog: dict[str, int]  # input, recovery, summary, dream
    backlog_oldest_ms: dict[str, int]  # age of the oldest item of each backlog kind (0: empty)
    recoveries: RecoveryTotals


class LatencyHistogram(TypedDict):
    """Cumulative counts per upper bound (seconds), as Prometheus histograms are."""

    buckets_s: list[float]
    cumulative: list[int]
    count: int
    sum_s: float


class OperatorActionCount(TypedDict):
    action: str
    result: str
    count: int


class Throughput(TypedDict):
    """The journal tally (`ops.throughput`): counters since `since`, folded through an event id."""

    through_event_id: int
    since: int | None
    counters: dict[str, int]
    turn_latency: LatencyHistogram
    operator_actions: list[OperatorActionCount]


class LastModelError(TypedDict):
    """The newest failed model request attempt in the window."""

    time: int
    error_class: str  # a ModelErrorClass, or a class a newer rem wrote
    status: int | None
    message: str | None
    kind: str  # a CallKind, or a kind a newer rem wrote
    session_id: str | None


class ModelHealth(TypedDict):
    """The model endpoint over a recent window of request attempts (`ops.model_health`)."""

    state: ModelState
    window_ms: int
    endpoints: list[str]
    models: list[str]
    requests: int
    errors: int
    error_rate: float
    errors_by_class: dict[str, int]
    retries: int
    requests_by_kind: dict[str, int]
    ttft_ms_p50: float | None
    ttft_ms_p95: float | None
    last_error: LastModelError | None
    last_call_at: int | None


class SessionUsage(TypedDict):
    """One session's model usage: the session's token totals, written with each reply, and its cost."""

    session_id: str
    title: str
    model: str | None
    turns: int
    tokens: dict[str, int]  # input, output, reasoning, cache_read, cache_write
    tokens_total: int
    cost: float
    last_error: dict[str, Any] | None  # the session's last model error as journaled (class, status, message)
    held: bool
    time_updated: int


class UsageTotal(TypedDict):
    sessions: int
    cost: float
    tokens: dict[str, int]


class Usage(TypedDict):
    """Sessions that used a model (or failed to), costliest first, and the total over all of them."""

    total: UsageTotal
    sessions: list[SessionUsage]


class ToolCallRecord(TypedDict):
    """An agent tool call waiting for a person (`ops.tool_status`): an approval, or an unknown outcome;
    or one running."""

    call_id: str  # what `rem approve|deny|resolve` take
    session_id: str
    execution_id: str
    tool: str  # NAME.TOOL
    arguments: Any  # the call's JSON arguments, as durable before anything ran
    effect: str  # read, idempotent or effect (recorded when the call was made)
    permission: str  # allow, ask or deny
    state: str  # a ToolCallState: awaiting_approval, unknown, or running
    idempotency_key: str
    since: int  # when the call was made
    age_ms: int
    started_at: int | None  # when `running` was last committed (None: never started)
    updated_at: int  # when the call last moved (an unknown outcome: when it became unknown)
    starts: int
    retries: int  # the operator's journaled retries
    owner_id: str | None  # the lease the row last moved under
    epoch: int | None
    owner_alive: bool


class WaitingToolCalls(TypedDict):
    """The calls only an operator moves on (`ops.tool_calls_waiting`; MCP's `list_tool_calls_waiting`)."""

    awaiting_approval: list[ToolCallRecord]
    unknown_outcome: list[ToolCallRecord]


class ToolServerRecord(TypedDict):
    """A tool source (MCP server or entry point) as a live executor last recorded it (`ops.tool_status`)."""

    server: str
    up: bool
    error: str | None  # why it is down, in one line (None: up)
    since: int  # when it last went up or down
    worker: str  # the executor's owner id: each executor starts its own servers


class ToolCalls(TypedDict):
    """`rem status --json`'s `tools`: the waiting calls (capped, oldest first), every call counted,
    and the tool sources' health as live executors see it."""

    awaiting_approval: list[ToolCallRecord]
    unknown_outcome: list[ToolCallRecord]
    running: list[ToolCallRecord]  # in flight, oldest first; `owner_id`: the executor running it
    counts: dict[str, int]  # every ToolCallState, uncapped
    by_tool: dict[str, dict[str, int]]  # tool -> state -> n (at most TOOL_CAP tools, then "(other)")
    servers: list[ToolServerRecord]  # down first, then by name and executor


class ApiRequestCount(TypedDict):
    """Requests one API server answered with one code on one route, since it started."""

    method: str
    route: str  # the route's template (`/v1/sessions/{session_id}`), or `(unmatched)`
    code: int
    count: int


class ApiLatency(LatencyHistogram):
    """One route's time to the response's start (a stream's to its headers), since the server started."""

    method: str
    route: str


class ApiServerRecord(TypedDict):
    """A live `rem serve` as it last recorded itself in its worker row (`ops.api_status`)."""

    owner_id: str
    url: str | None
    requests_in_flight: int  # open streams included
    streams_open: int
    server_error_ratio: float  # the share of requests answered 5xx in its last five minutes
    requests: list[ApiRequestCount]
    latency: list[ApiLatency]


class ApiStatus(TypedDict):
    """`rem status --json`'s `api`: the live API servers."""

    servers: list[ApiServerRecord]


class Snapshot(TypedDict):
    """What one read transaction of state.db sees (`ops.snapshot.snapshot_sync`)."""

    generated_at: int
    backlog: Backlog
    leases: list[LeaseRecord]
    receipts: Receipts
    dream_drift: list[DriftRecord]
    dream_counts: dict[DriftClass, int]
    legacy_only: int
    workers: list[WorkerRecord]
    model: ModelHealth
    usage: Usage
    recent_actions: list[EventRecord]
    events: list[EventRecord]
    totals: Totals
    counts: Counts
    tools: ToolCalls
    api: ApiStatus


class RecordedMoment(TypedDict):
    """Where a timeline moment comes from (`ops.timeline`): one row of the status history."""

    id: int
    time: int
    reason: str  # interval, start, stop, or the operator event kind that triggered it
    alerts: list[str]
    incident: bool
    last_event_id: int
    index: NotRequired[int]  # 1-based position in the history
    count: NotRequired[int]
    asked: NotRequired[int]  # the time asked for (`--at`)


class Status(Snapshot):
    """`ops.status`: the snapshot plus where it came from and Chroma's health."""

    data_dir: str
    schema_version: int
    schema_version_supported: int
    read_only: bool
    throughput: Throughput
    chroma: ChromaHealth


class Moment(Status):
    """A recorded moment of the timeline (`ops.timeline.moment`): a status as it was, not live state."""

    recorded: RecordedMoment
    tool_lines: list[dict[str, Any]]  # each tool call's life around the moment (`ops.timeline_tools`)
