"""What rem's state columns hold: the vocabularies of stored values, with no database code.

Workers' roles and states and the lease kinds (`worker`, kept by `backend.store.workers`), an
input's delivery (`session_input.delivery`, `backend.execution.sessions`), a summary job's
status (`backend.summaries.summarizer`), a Dream row's
`digest_state` and, read beside what synthesis published, why it drifts (the Drift panel's
classes; Dream itself, `backend.dream.digester`, writes the states). The modules that write them
re-export them; readers (`rem status`, the console, `rem check`, the CLI's option types) import
them from here without loading those modules, or a database driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class WorkerRole(StrEnum):
    """What a daemon does (`worker.role`)."""

    EXECUTOR = "executor"
    SUMMARIZER = "summarizer"
    DREAM = "dream"
    # `rem serve`: the application API (it holds no lease; it registers so every view shows it)
    SERVER = "server"


class WorkerState(StrEnum):
    """`worker.state`: running; draining (asked to stop: finishing, handing back); stopped."""

    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


# states of a worker that still heartbeats and may hold leases
LIVE_STATES = (WorkerState.RUNNING, WorkerState.DRAINING)


class LeaseKind(StrEnum):
    """The three fenced leases a worker can hold."""

    EXECUTION = "execution"  # a session's turn (`session_execution`)
    SUMMARY_JOB = "summary_job"  # a session's summary synthesis or replay (`summary_job`)
    DREAM = "dream"  # a session's Dream digestion (`dream_state`)


class ToolCallState(StrEnum):
    """`tool_call.state`: opencode's tool states plus rem's (approval, denial, an unknown outcome)."""

    PENDING = "pending"  # durable, not started (allowed, approved, or to be retried)
    AWAITING_APPROVAL = "awaiting_approval"  # an `ask` tool: waits for `rem approve` / `rem deny`
    RUNNING = "running"  # committed before the request is sent
    COMPLETED = "completed"  # the result is committed (a tool's own error result included)
    ERROR = "error"  # never ran, or failed: the model is told
    DENIED = "denied"  # refused by the configuration or an operator
    UNKNOWN = "unknown"  # an effect in flight when its process died or timed out: `rem resolve`


# the states a call leaves only by an operator's decision
WAITING_STATES = (ToolCallState.AWAITING_APPROVAL, ToolCallState.UNKNOWN)
# the states nothing moves on from (their results feed the model)
TERMINAL_STATES = (ToolCallState.COMPLETED, ToolCallState.ERROR, ToolCallState.DENIED)
# a turn parked for a person (`session_execution.parked`, and its session's `held_reason`):
# a call awaits approval, an effect's outcome is unknown (`backend.execution.parking`)
PARKED_AWAITING_APPROVAL = "tool_awaiting_approval"
PARKED_OUTCOME_UNKNOWN = "tool_outcome_unknown"
TOOL_HOLDS = (PARKED_AWAITING_APPROVAL, PARKED_OUTCOME_UNKNOWN)


class Delivery(StrEnum):
    """How an admitted input reaches the agent (`session_input.delivery`)."""

    QUEUE = "queue"  # starts the next turn when the session is idle
    STEER = "steer"  # joins the running turn at its next step boundary


class JobStatus(StrEnum):
    """`summary_job.status` (`backend.summaries.summarizer` writes it)."""

    PENDING = "pending"  # drifted, waiting for a summarizer (or its retry time)
    IN_PROGRESS = "in_progress"  # claimed: a summarizer holds its lease
    COMPLETED = "completed"  # the receipt is acknowledged
    FAILED = "failed"  # out of attempts for this revision: shown to the operator


class DigestState(StrEnum):
    """`dream_state.digest_state`."""

    PENDING = "pending"  # a published revision waits for Dream
    IN_PROGRESS = "in_progress"  # a Dream daemon holds the claim lease
    DIGESTED = "digested"  # the published revision is in the graph
    DEFERRED = "deferred"  # the last digestion failed; retried after a backoff
    UNDIGESTIBLE = "undigestible"  # failed MAX_DIGEST_ATTEMPTS times: parked until a new revision
    LEGACY = "legacy"  # honoured as digested by the legacy `graphDigested` flag alone


class DriftClass(StrEnum):
    """Why a session's Dream state disagrees with what synthesis published (the Drift panel)."""

    SUMMARY_STALE = "summary_stale"  # raw turns changed since the last summary
    DREAM_PENDING = "dream_pending"  # never digested at the published revision
    STALE_COMPLETION = "stale_completion"  # digested an older revision
    DEFERRED = "deferred"
    UNDIGESTIBLE = "undigestible"
    LEGACY_ONLY = "legacy_only"  # only the legacy `graphDigested` flag says it is digested
    CURRENT = "current"  # no drift (never listed)


# the classes the Drift panel lists, in its order
DRIFT_CLASSES = tuple(c for c in DriftClass if c is not DriftClass.CURRENT)
# classify_drift runs per row of the status snapshot, and an Enum member attribute costs
# ~0.5 us on Python 3.11: plain module names for the members it compares and returns
_LEGACY, _UNDIGESTIBLE, _DEFERRED = DigestState.LEGACY, DigestState.UNDIGESTIBLE, DigestState.DEFERRED
_D_LEGACY, _D_UNDIGESTIBLE, _D_DEFERRED = DriftClass.LEGACY_ONLY, DriftClass.UNDIGESTIBLE, DriftClass.DEFERRED
_D_STALE, _D_CURRENT = DriftClass.SUMMARY_STALE, DriftClass.CURRENT
_D_STALE_COMPLETION, _D_PENDING = DriftClass.STALE_COMPLETION, DriftClass.DREAM_PENDING


def classify_drift(row: Mapping[str, Any]) -> DriftClass:
    """The drift class of one dream_state row (optionally joined with summary_job's seqs).

    CURRENT when the row needs nothing. Order is most actionable first: a
    parked revision before a stale summary before plain pending work.
    """
    state = row.get("digest_state")
    published, completed = row.get("input_revision"), row.get("completed_revision")
    if state == _LEGACY or (published is None and row.get("legacy_digested")):
        return _D_LEGACY
    if state == _UNDIGESTIBLE:
        return _D_UNDIGESTIBLE
    if state == _DEFERRED:
        return _D_DEFERRED
    dirty, clean = row.get("dirty_seq"), row.get("clean_seq")
    if dirty is not None and clean is not None and dirty > clean:
        return _D_STALE
    if published is None or completed == published:
        return _D_CURRENT
    return _D_STALE_COMPLETION if completed is not None else _D_PENDING
