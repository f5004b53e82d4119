"""The sessions phase in worker processes: one per core (at most 4), each over a range of session ids
with a read-only connection of its own, in the same batches, merged in id order.

Workers are `python -m backend.ops.check_worker` processes (started through
`processes.python_child`), not multiprocessing's: a library call must not
depend on its caller's main module being import-safe (spawn re-imports it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import sqlite3
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from backend.core import processes
from backend.core.errors import RemError
from backend.core.settings import Settings
from backend.ops.checks.report import Progress, Report
from backend.ops.checks.sessions import check_sessions_sync
from backend.store.db import BUSY_TIMEOUT_MS, Conn, sqlite_errors, sqlite_target

T = TypeVar("T")

log = logging.getLogger("rem.checks")

# the sessions phase runs in processes from this many sessions on (below, starting one, ~0.5 s
# of imports, costs more than it saves; REM_CHECK_PARALLEL_SESSIONS), one per core, at most 4,
# each over one range of ids
PARALLEL_MIN_SESSIONS = Settings.check_parallel_sessions.default
CHECK_WORKERS = max(1, min(4, os.cpu_count() or 1))


async def _all_or_none(parts: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Every part's result, in order; when one fails (or on Ctrl-C) the others are cancelled too."""
    tasks = [asyncio.ensure_future(part) for part in parts]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:  # stop the others' processes too, then say why
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def check_sessions_in_processes(
    db: Any, report: Report, total: int, batch: int, workers: int, tell: Progress
) -> int:
    """The sessions phase over `workers` processes, each a range of ids; merged in id order."""
    step = max(batch, -(-total // workers))
    bounds = await db.read_in_thread(lambda conn: _range_bounds_sync(conn, step, total))
    ranges = list(zip(["", *bounds], [*bounds, None], strict=True))  # the last open: sessions added meanwhile
    log.info("checking %d sessions in %d worker process%s", total, len(ranges), "es" * (len(ranges) > 1))
    done = 0
    tell("sessions", done, total)

    def checked(n: int) -> None:
        nonlocal done
        done += n
        tell("sessions", done, max(done, total))

    results = await _all_or_none(
        [_check_range_in_worker(str(db.path), lo, hi, batch, checked) for lo, hi in ranges]
    )
    for part, _ in results:  # merged in id order: the same rows as one process lists
        report.merge(part)
    return sum(n for _, n in results)


async def _progress_and_errors(stderr: asyncio.StreamReader, checked: Callable[[int], None]) -> list[str]:
    """A worker's stderr to its end: each `checked N` line to `checked`, the other lines returned."""
    errors: list[str] = []
    async for raw in stderr:
        line = raw.decode(errors="replace").strip()
        if line.startswith("checked "):
            checked(int(line.split()[1]))
        elif line:
            errors.append(line)
    return errors


async def _check_range_in_worker(
    path: str, lo: str, hi: str | None, batch: int, checked: Callable[[int], None]
) -> tuple[Report, int]:
    args = (path, lo, hi or "", str(batch))
    worker = processes.python_child("backend.ops.check_worker", *args, cwd=Path(path).parent)
    proc = await worker.spawn(stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        out = asyncio.ensure_future(proc.stdout.read())  # read alongside stderr: neither pipe fills
        errors = await _progress_and_errors(proc.stderr, checked)
        result, code = await out, await proc.wait()
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if code != 0:
        detail = errors[-1] if errors else f"it exited with code {code}"
        raise RemError(f"checking the sessions after {lo!r} of {path}: {detail}")
    report, n = pickle.loads(result)
    assert isinstance(report, Report)
    return report, int(n)


def _range_bounds_sync(conn: Conn, step: int, total: int) -> list[str]:
    """The id of every `step`-th session before the last: the upper bounds of ranges of `step` sessions."""
    rows = conn.execute(
        "SELECT id FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM session) "
        "WHERE n % ? = 0 AND n < ?",
        (step, total),
    ).fetchall()
    return [r[0] for r in rows]


def check_range_in_process(
    path: str, lo: str, hi: str | None, batch: int, checked: Callable[[int], None] = lambda n: None
) -> tuple[Report, int]:
    """A worker's part: sessions `lo` < id <= `hi` (None: to the end) of the state.db at `path`,
    read-only, in batches of `batch`, each in its own short read transaction."""
    database, uri = sqlite_target(Path(path), True)
    with sqlite_errors(path):
        conn = sqlite3.connect(database, uri=uri, isolation_level=None)
        conn.row_factory = sqlite3.Row
        report = Report()
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA query_only = ON")
            return report, _check_batches(conn, report, lo, hi, batch, checked)
        finally:
            conn.close()


def _check_batches(
    conn: sqlite3.Connection,
    report: Report,
    lo: str,
    hi: str | None,
    batch: int,
    checked: Callable[[int], None],
) -> int:
    """Check sessions `lo` < id <= `hi` in batches, each in a read transaction of its own; how many."""
    done, after = 0, lo
    while True:
        conn.execute("BEGIN")
        try:
            last, n = check_sessions_sync(conn, report, after, batch, until=hi)
        finally:
            conn.execute("ROLLBACK")
        done += n
        if last is None:
            return done
        checked(n)
        after = last
