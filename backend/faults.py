"""Fault injection points, off unless `REM_FAULTS` names them.

`REM_FAULTS="executor.mid_stream"` SIGKILLs the process the first time it
reaches that point; `name=raise` raises `FaultInjected` instead; `name@3`
fires on the third arrival. Several points are separated by commas. Tests use
this to kill a real process at an exact step.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass

from backend.errors import FaultInjected

log = logging.getLogger("rem.faults")

# Every point the backend defines, so tests can iterate them and typos are refused.
POINTS = {
    "executor.after_claim": "between claiming the lease and promoting inputs",
    "executor.after_promote": "after promotion, before the first streamed part",
    "executor.mid_stream": "between two streamed parts of the assistant reply",
    "executor.before_complete": "after the last part, before the turn is completed",
    # the summarizer stages its receipt BEFORE the Chroma write (write-ahead), so only
    # after_synthesis loses model output; every later point is replayed without the model
    "summarizer.after_synthesis": "after the model call, before the receipt is staged (output not durable)",
    "summarizer.after_receipt": "right after the receipt is staged durably, before the Chroma write",
    "summarizer.before_chroma_write": "receipt durable, about to upsert the Chroma row",
    "summarizer.after_chroma_write": "Chroma row written, before its read-back and acknowledge",
    "summarizer.before_acknowledge": "row written and read back, before the acknowledge transaction",
    "summarizer.after_acknowledge": "after the acknowledge transaction (job completed, revision published)",
    "dream.mid_graph": "after part of the graph is written, before completion",
    "dream.before_attest": "after the graph, before attesting completion",
}


@dataclass
class _Fault:
    action: str
    at: int
    seen: int = 0


def _parse(raw: str) -> dict[str, _Fault]:
    faults: dict[str, _Fault] = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        name, _, action = item.partition("=")
        name, _, at = name.partition("@")
        if name not in POINTS:
            raise ValueError(f"unknown fault point {name!r} in REM_FAULTS; known: {sorted(POINTS)}")
        faults[name] = _Fault(action=action or "kill", at=int(at or 1))
    return faults


_faults: dict[str, _Fault] | None = None


def _active() -> dict[str, _Fault]:
    global _faults
    if _faults is None:
        _faults = _parse(os.environ.get("REM_FAULTS", ""))
    return _faults


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
