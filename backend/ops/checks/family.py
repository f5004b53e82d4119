"""What an invariant family hands `rem check`: its findings, in order, and its checks, by phase.

A check run goes through its phases in this order, and within each phase
through the families in their registration order (`registry.FAMILIES`):

1. the opening sweeps (`Sweep(first=True)`: the database's own structure, item by item);
2. `sessions`: every batch of sessions, in id order, each in one short read
   transaction (in worker processes on a large state.db);
3. `state`: once each, in a short read of its own, after the sessions;
4. the closing sweeps (the status counters, one read each);
5. `chroma`: against Chroma, when `rem check` verifies it (not in the worker processes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from backend.ops.checks.report import Report
from backend.store.db import Conn
from backend.store.journal_head import Head

# the sessions lo < id <= hi of one batch, inside the batch's read transaction
SessionsCheck = Callable[[Conn, Report, str, str], None]


@dataclass(frozen=True)
class Moment:
    """What a whole-store check may need: the time of the run, and the journal head `rem up` recorded."""

    now: int
    recorded: Head | None = None


# once per run, in its own short read transaction
StateCheck = Callable[[Conn, Report, Moment], None]
# against Chroma: (the context, its Database, the report)
ChromaCheck = Callable[[Any, Any, Report], Awaitable[None]]


@dataclass(frozen=True)
class Sweep:
    """A check run once per item (`items` lists them), each item in its own short read transaction,
    told to progress as `phase`. A check made in one read transaction runs `whole` instead, if
    given (one statement over everything), as does a run that found no items (so it lists the
    check as checked)."""

    phase: str
    items: Callable[[Conn], Sequence[Any]]
    check: Callable[[Conn, Report, Any], None]
    whole: Callable[[Conn, Report], None] | None = None
    first: bool = False  # before the sessions (else after the state checks)


@dataclass(frozen=True)
class Family:
    """One invariant family: everything `rem check` runs for it, and the findings it can report."""

    name: str
    # the `what` of each finding it reports, in the order a report lists them
    findings: tuple[str, ...] = ()
    sessions: tuple[SessionsCheck, ...] = ()
    state: tuple[StateCheck, ...] = ()
    sweeps: tuple[Sweep, ...] = ()
    chroma: tuple[ChromaCheck, ...] = ()
