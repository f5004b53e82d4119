"""`rem check`: verify the invariants on a live data dir (numbered as in docs/architecture.md#guarantees-and-invariants).

Findings come in two kinds:

* **violations**: wrong whatever the timing (an input promoted twice, a
  completed reply published twice, a receipt that does not match its Chroma
  row while nobody holds its lease, Dream-owned metadata deleted).
* **unsettled**: work still in flight (a lease held, an input not promoted
  yet, a Dream revision pending). Normal on a busy system; with
  `settled=True` (what the drills use once load has stopped) each one is a
  violation too, because a settled system has none.

The state.db part visits every session's rows in bounded batches of
sessions (`CHECK_BATCH_SESSIONS`, in id order), each batch in its own short
read transaction: every invariant here is about one session's rows, so a
batch sees each of its sessions whole and consistent, and no read
transaction lives long enough to hold back a WAL checkpoint (a 10-million
message state.db is checked in thousands of reads of a few milliseconds,
not one of a minute). Findings are merged across batches in a fixed order,
counts whole and rows capped. From `PARALLEL_MIN_SESSIONS` sessions on,
state.db's sessions are checked by one worker process per core (at most 4),
each over a range of ids with a read-only connection of its own, the same
batches, merged in id order: the same report, in about half the time on two
cores (10 000 000 messages: 81 s -> 37 s). The structure checks (`quick_check`, foreign
keys) are one statement per table; state.db is first read ahead in file order
(`warm_page_cache`), since `quick_check` walks pages in b-tree order, which from a
cold page cache is random reads. The Chroma part reads the summary rows
in batches and compares them with the receipts.

The package, one module per invariant family and the machinery that runs them:

    structure    invariant 0: state.db reads back whole, every foreign key points at a row
    execution    invariants 1, 3 and 2's executions: inputs promoted once, one reply per step and input
    tools        invariant 10: no tool call both completed and running, every result fenced,
                 no effect call started twice without an operator's journaled retry
    counters     token totals and status counters equal the counts they keep
    receipts     invariants 2 and 5: summaries current, receipts match their Chroma rows, none corrupt
    dream        invariants 2 and 4: Dream at the published revision, its keys on the Chroma row
    turn_index   invariant 9: every raw turn in the recall index, FTS5 and Chroma
    journal      invariant 8: the operator events' hash chain, and the head `rem up` recorded
    family       what a family declares (`Family`, `Sweep`, the check signatures, the phases)
    registry     the families, in the order they run and their findings are listed
    report       `Report`, `Finding`, `summarize` (the `--json` document)
    sessions     one batch of sessions through every family's per-session checks
    workers      the sessions phase in worker processes (`backend.ops.check_worker`)

Adding a family (`tools` is the latest, a small example):

1. a module `backend/ops/checks/NAME.py` with its checks and one
   `FAMILY = Family(name="NAME", findings=(...), sessions=(...), state=(...))`:
   `sessions` checks take `(conn, report, lo, hi)` and read the sessions
   `lo < session_id <= hi` of one batch (through a session_id-leading index);
   `state` checks take `(conn, report, moment)` and run once, in a short read of
   their own; `chroma` checks take `(ctx, db, report)`. Each check calls
   `report.mark(name)` and `report.add(report.violations or report.unsettled,
   invariant, what, rows)`; every `what` it can report is listed in `findings`,
   in the order a report should list them (tests/backend/test_check_families.py
   holds every family to that);
2. one line, `NAME.FAMILY,`, in `registry.FAMILIES` (and `NAME` added to the
   import above it); its place there is where its findings are listed, and
   when its checks run within each phase.

Nothing else changes: the batches, the worker processes, `--json`, the exit code.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from backend.core import clock
from backend.core.errors import ChromaUnreachable
from backend.core.settings import settings
from backend.ops.checks.family import Moment, Sweep
from backend.ops.checks.registry import (
    FAMILIES,
    FINDING_ORDER,
    chroma_checks,
    finding_order,
    state_checks,
    sweeps,
)
from backend.ops.checks.report import ROW_CAP, Finding, Progress, Report, dumps, summarize
from backend.ops.checks.sessions import CHECK_BATCH_SESSIONS, check_sessions_sync
from backend.ops.checks.workers import (
    CHECK_WORKERS,
    PARALLEL_MIN_SESSIONS,
    check_range_in_process,
    check_sessions_in_processes,
)
from backend.store.db import Conn
from backend.store.journal_head import Head
from backend.store.maintenance import warm_page_cache

# what the Chroma part verifies: receipts (2, 6), Dream's keys on the rows (4), turn vectors (9)
CHROMA_INVARIANTS = ("2", "4", "6", "9")

__all__ = [
    "CHECK_BATCH_SESSIONS",
    "CHECK_WORKERS",
    "FAMILIES",
    "FINDING_ORDER",
    "PARALLEL_MIN_SESSIONS",
    "ROW_CAP",
    "Finding",
    "Progress",
    "Report",
    "check_chroma",
    "check_database_in_batches",
    "check_database_sync",
    "check_range_in_process",
    "dumps",
    "summarize",
    "warm_page_cache",
]


def check_database_sync(conn: Conn, now: int | None = None) -> Report:
    """All state.db invariants inside the caller's one read transaction (small data dirs, tests)."""
    report = Report()
    moment = Moment(clock.now_ms() if now is None else now)
    for sweep in sweeps(first=True):
        _sweep_sync(conn, report, sweep)
    lo: str | None = ""
    while lo is not None:
        lo, _ = check_sessions_sync(conn, report, lo)
    for check in state_checks():
        check(conn, report, moment)
    for sweep in sweeps(first=False):
        _sweep_sync(conn, report, sweep)
    report.ordered(finding_order())
    return report


def _sweep_sync(conn: Conn, report: Report, sweep: Sweep) -> None:
    if sweep.whole is not None:
        sweep.whole(conn, report)
        return
    for item in sweep.items(conn):
        sweep.check(conn, report, item)


async def check_database_in_batches(
    db: Any,
    *,
    now: int | None = None,
    batch: int = CHECK_BATCH_SESSIONS,
    progress: Progress | None = None,
    workers: int | None = None,
    parallel_min: int | None = None,
    recorded: Head | None = None,
) -> Report:
    """All state.db invariants, one short read transaction per table or per batch of sessions.

    On state.db with at least `parallel_min` (REM_CHECK_PARALLEL_SESSIONS) sessions, the sessions are checked by `workers`
    processes (`CHECK_WORKERS`: one per core, at most 4), each over its own range of session
    ids with a read-only connection of its own, in the same batches, and the findings merged
    in id order: the same report as one process gives, in about 1/workers of the time.
    `recorded`: the operator journal's head `rem up` recorded for this store, if any.
    """
    report = Report()
    moment = Moment(clock.now_ms() if now is None else now, recorded)
    tell = progress or (lambda _phase, _done, _total: None)
    if not db.postgres:  # every page is read below: from a cold cache, in file order first
        await asyncio.to_thread(warm_page_cache, Path(db.path))
    for sweep in sweeps(first=True):
        await _sweep(db, report, sweep, tell)
    workers = CHECK_WORKERS if workers is None else workers
    parallel_min = settings.check_parallel_sessions if parallel_min is None else parallel_min
    await _check_sessions(db, report, batch, workers, parallel_min, tell)
    for check in state_checks():
        await db.read_in_thread(lambda conn, c=check: c(conn, report, moment))
    for sweep in sweeps(first=False):
        await _sweep(db, report, sweep, tell)
    report.ordered(finding_order())
    return report


async def _sweep(db: Any, report: Report, sweep: Sweep, tell: Progress) -> None:
    """One sweep's items, each in a short read of its own (none: its whole check, listing it as checked)."""
    items = await db.read_in_thread(sweep.items)
    for i, item in enumerate(items):
        tell(sweep.phase, i, len(items))
        await db.read_in_thread(lambda conn, it=item: sweep.check(conn, report, it))
    if not items and sweep.whole is not None:
        await db.read_in_thread(lambda conn: sweep.whole(conn, report))
    tell(sweep.phase, len(items), len(items))


async def _check_sessions(
    db: Any, report: Report, batch: int, workers: int, parallel_min: int, tell: Progress
) -> None:
    """Every session, batch by batch: in worker processes on a large state.db, else here."""
    total = int(await db.scalar("SELECT count(*) FROM session"))
    if not db.postgres and workers > 1 and total >= parallel_min:
        done = await check_sessions_in_processes(db, report, total, batch, workers, tell)
    else:
        lo: str | None = ""
        done = 0
        while lo is not None:
            tell("sessions", done, total)
            lo, n = await db.read_in_thread(
                lambda conn, after=lo: check_sessions_sync(conn, report, after, batch)
            )
            done += n
    tell("sessions", done, max(done, total))


async def check_chroma(ctx: Any, db: Any, report: Report) -> None:
    """The invariants checked against Chroma (receipts match their rows, Dream's keys survive, turn
    vectors are as written), each family's in turn. Reads only. Its findings follow state.db's, in
    the order the checks ran."""
    try:
        for check in chroma_checks():
            await check(ctx, db, report)
    except ChromaUnreachable as exc:
        # not a violation (nothing was found wrong) and not a pass either: said apart, exit 3
        report.not_checked.append(
            {"what": "chroma", "invariants": list(CHROMA_INVARIANTS), "error": str(exc)}
        )
        return
    report.checked.append("chroma")
