"""Fault injection points, off unless `REM_FAULTS` names them.

`REM_FAULTS="executor.mid_stream"` SIGKILLs the process the first time it
reaches that point; `name=raise` raises `FaultInjected` instead; `name@3`
fires on the third arrival. Several points are separated by commas. Tests use
this to kill a real process at an exact step.

Daemons call `validate()` before they start, so a typo in `REM_FAULTS` is a
one-line usage error at start-up, never a crash deep inside a task.

The issue's five crash windows map onto these points (the summarizer stages
its receipt *before* the Chroma write, write-ahead, so "between the Chroma
write and the receipt" cannot lose a receipt; its nearest windows are listed):

* between claim and promotion: `executor.after_claim`
* mid-stream: `executor.mid_stream`
* between the Chroma write and the receipt: `summarizer.after_receipt` /
  `summarizer.before_chroma_write` (receipt durable, row not written) and
  `summarizer.after_chroma_write` (row written, receipt not acknowledged)
* between receipt and acknowledge: `summarizer.before_acknowledge`, and for
  recovery's own replay `replay.after_rewrite`
* mid-Dream: `dream.mid_graph` (and `dream.before_attest`)
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass

from backend.core.errors import FaultInjected, UsageError
from backend.core.settings import settings

log = logging.getLogger("rem.faults")

# Every point the backend defines, so tests can iterate them and typos are refused.
POINTS = {
    "executor.after_claim": "between claiming the lease and promoting inputs",
    "executor.after_promote": "after promotion, before the first streamed part",
    "executor.mid_stream": "between two streamed parts of the assistant reply",
    "executor.before_complete": "after the last part, before the turn is completed",
    # an agent tool call's life (backend/execution/tool_runner.py); "request sent" is the tool
    # server's own delay (kill while it runs)
    "tools.after_insert": "a step's tool calls are durable (pending, arguments stored), none started",
    "tools.after_start": "`running` and the key committed, before the request is sent",
    "tools.after_result": "the tool's result received, before it is committed",
    "tools.after_finish": "the tool's result committed, before the next model step",
    # the summarizer stages its receipt BEFORE the Chroma write (write-ahead), so only
    # after_synthesis loses model output; every later point is replayed without the model
    "summarizer.after_synthesis": "after the model call, before the receipt is staged (output not durable)",
    "summarizer.after_receipt": "right after the receipt is staged durably, before the Chroma write",
    "summarizer.before_chroma_write": "receipt durable, about to upsert the Chroma row",
    "summarizer.after_chroma_write": "Chroma row written, before its read-back and acknowledge",
    "summarizer.before_acknowledge": "row written and read back, before the acknowledge transaction",
    "summarizer.after_acknowledge": "after the acknowledge transaction (job completed, revision published)",
    "replay.after_rewrite": "recovery re-wrote and read back Chroma rows, before its acknowledge transaction",
    "dream.mid_graph": "after part of the graph is written, before completion",
    "dream.before_attest": "after the graph, before attesting completion",
    "index.mid_rows": "after a chunk of recall-index rows (FTS5) is written, before the rest",
    "index.after_vectors": "turn vectors written to Chroma, before they are marked in state.db",
}


@dataclass
class _Fault:
    action: str
    at: int
    seen: int = 0


ACTIONS = ("kill", "raise")


def _parse(raw: str) -> dict[str, _Fault]:
    faults: dict[str, _Fault] = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        name, _, action = item.partition("=")
        name, _, at = name.partition("@")
        if name not in POINTS:
            raise UsageError(
                f"REM_FAULTS names an unknown fault point {name!r}; known points: {', '.join(sorted(POINTS))}"
            )
        if action and action not in ACTIONS:
            raise UsageError(f"REM_FAULTS: unknown action {action!r} for {name}; use =kill or =raise")
        if at and not (at.isdigit() and int(at) >= 1):
            raise UsageError(f"REM_FAULTS: {name}@{at} must name an arrival count of 1 or more")
        faults[name] = _Fault(action=action or "kill", at=int(at or 1))
    return faults


_faults: dict[str, _Fault] | None = None


def _active() -> dict[str, _Fault]:
    global _faults
    if _faults is None:
        if settings.faults and not settings.test_mode:
            raise UsageError(
                "REM_FAULTS is a test-only switch and is refused outside tests and drills: "
                "unset it, or set REM_TEST_MODE=1 as well if this really is a test"
            )
        _faults = _parse(settings.faults)
    return _faults


def validate() -> list[str]:
    """Parse `REM_FAULTS` now (daemon start-up); a bad value is a one-line UsageError."""
    return sorted(_active())


def reset() -> None:
    """Re-read `REM_FAULTS` (tests that change the environment in-process)."""
    global _faults
    _faults = None


def point(name: str) -> None:
    """Mark a fault point; kills or raises here when `REM_FAULTS` says so."""
    if name not in POINTS:
        raise ValueError(f"undeclared fault point {name!r}")
    fault = _active().get(name)
    if fault is None:
        return
    fault.seen += 1
    if fault.seen != fault.at:
        return
    log.warning("fault point %s fired (%s)", name, fault.action)
    if fault.action == "raise":
        raise FaultInjected(f"fault injected at {name}")
    os.kill(os.getpid(), signal.SIGKILL)
