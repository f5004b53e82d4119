"""The operator's SIGKILL of a worker or of the data dir's Chroma server (`rem kill`, the console's `k`).

A drill done by hand: the process dies as in a crash, and recovery is the
system's own (leases expire or are released, a takeover follows, an effect in
flight becomes `unknown`). What an operator gets over `kill -9 PID`:

* the target is named by what it is (an owner id, or `chroma`), and the kill
  says what it hits: the process's role, pid and host, the leases it holds and
  the tool calls it has running, journaled as `operator.kill` (hash-chained like
  every operator action) in the transaction that checked all of it, the signal
  sent inside it;
* refusals, one line each and journaled (`operator.refused`): a process on
  another host (rem never signals another machine), a worker already dead, a
  pid that is no longer the worker's (its start time, as the supervisor checks
  `up.json`'s: the worker row records its own at registration), this very
  process, and a read-only rem;
* the death recorded at once: the kill waits up to `EXIT_WAIT_S` for the
  process to be gone and records the worker's `exited_at` as its supervisor
  would (`worker.exited`, by the operator), so the console shows ✗ within the
  second even for a worker no supervisor watches. Its leases are not reaped:
  they expire, or an operator releases them, or its supervisor reaps them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from typing import Any
from urllib.parse import urlparse

from backend.chroma import server as chroma_server
from backend.chroma import trust
from backend.core import clock, processes
from backend.core.errors import Refused, WorkerNotFound
from backend.ops.actions import refusals_journaled
from backend.ops.operator_input import operator_id
from backend.ops.results import HeldLease, KillReport, RunningCall
from backend.runtime.context import Context
from backend.store import workers
from backend.store.db import Conn
from backend.store.events import EventKind, append_event_sync

log = logging.getLogger("rem.ops")

# `rem kill chroma`: the data dir's Chroma server (an owner id always names its role and host)
CHROMA = "chroma"
SIGNAL = signal.SIGKILL
# how long a kill waits to see the process gone before recording it dead (SIGKILL takes ms)
EXIT_WAIT_S = 1.0

WORKER_SQL = (
    "SELECT owner_id, role, pid, host, state, started_at, heartbeat_at, exited_at, info "
    "FROM worker WHERE owner_id = ?"
)
LEASES_SQL = """
    SELECT 'execution' AS kind, id, session_id FROM session_execution WHERE owner_id = :o
    UNION ALL
    SELECT 'summary_job', session_id, session_id FROM summary_job WHERE owner_id = :o AND status = 'in_progress'
    UNION ALL
    SELECT 'dream', session_id, session_id FROM dream_state WHERE owner_id = :o AND digest_state = 'in_progress'
    ORDER BY 1, 2"""
# the IN term repeats the partial index's predicate (`backend.ops.tool_status`)
RUNNING_SQL = """
    SELECT id, session_id, tool, effect, time_started FROM tool_call
    WHERE state IN ('pending', 'awaiting_approval', 'running', 'unknown') AND state = 'running'
      AND owner_id = ? ORDER BY time_started, id"""
EXITED_SQL = (
    "UPDATE worker SET exited_at = ? WHERE owner_id = ? AND state != 'stopped' AND exited_at IS NULL "
    "RETURNING owner_id"
)


async def kill(ctx: Context, target: str) -> KillReport:
    """SIGKILL a worker of this host (`target`: its owner id) or the data dir's Chroma server (`chroma`).

    Refused, journaled, for a worker on another host, one already dead, a pid no longer the
    worker's, this process itself, or a read-only rem. The worker's death is recorded once seen.
    """
    target = operator_id("worker id", target)
    ctx.require_writable(f"kill {target}")
    db = await ctx.db()
    here, operator = workers.host_name(), ctx.operator
    async with refusals_journaled(ctx, "kill", target):
        if target == CHROMA:
            return await db.write_in_thread(lambda conn: kill_chroma_sync(conn, ctx, here, operator))
        report = await db.write_in_thread(lambda conn: kill_worker_sync(conn, target, here, operator))
    report["exited"] = await asyncio.to_thread(processes.wait_gone, report["pid"], EXIT_WAIT_S)
    if report["exited"]:
        await db.write_in_thread(lambda conn: record_exit_sync(conn, report))
    return report


def kill_worker_sync(conn: Conn, owner_id: str, here: str, operator: str) -> KillReport:
    """Check the worker against the registry and its process, SIGKILL it, journal it: in the caller's tx."""
    row = conn.execute(WORKER_SQL, (owner_id,)).fetchone()
    if row is None:
        raise WorkerNotFound(f"no worker {owner_id!r}; list workers with `rem status`")
    pid, host = int(row["pid"]), str(row["host"])
    refuse_elsewhere(f"worker {owner_id}", host, here)
    if row["state"] == workers.WorkerState.STOPPED or row["exited_at"] is not None:
        raise Refused(f"worker {owner_id} is already dead ({_death(row)}); nothing to kill")
    started = _recorded_start(row["info"])
    refuse_not_it(f"worker {owner_id}", pid, started, registered_at=int(row["started_at"]))
    report = KillReport(
        target=owner_id,
        role=str(row["role"]),
        pid=pid,
        host=host,
        process_started_at=started,
        signal=SIGNAL.name,
        leases=held_leases_sync(conn, owner_id),
        running_calls=running_calls_sync(conn, owner_id),
        exited=False,
        killed_by=operator,
        killed_at=clock.now_ms(),
    )
    return _signal_and_journal(conn, report)


def kill_chroma_sync(conn: Conn, ctx: Context, here: str, operator: str) -> KillReport:
    """Check the data dir's Chroma server (its lock, its pid's start time, its port), SIGKILL it, journal it."""
    external = chroma_server.external_url(ctx.chroma_url)
    if external is not None:
        raise Refused(
            f"Chroma at {external} is not a server this data dir started (--chroma-url / REM_CHROMA_URL); "
            "rem signals only the data dir's own server"
        )
    info = chroma_server.read_lock_info(ctx.data) if chroma_server.lock_is_held(ctx.data) else {}
    pid, url = info.get("pid"), info.get("url")
    if not isinstance(pid, int) or not isinstance(url, str):
        raise Refused(f"no Chroma server runs for {ctx.data.root} (chroma.lock is free); nothing to kill")
    recorded = info.get("process_started_at")
    started = float(recorded) if isinstance(recorded, int | float) else None
    fallback = info.get("started_at")
    moment = float(fallback) if isinstance(fallback, int | float) else 0.0
    refuse_not_it("the Chroma server", pid, started, registered_at=int(moment * 1000))
    if trust.held_by(urlparse(url).port or 0, pid) is False:
        raise Refused(f"pid {pid} does not listen at {url}: it is not the data dir's Chroma server any more")
    report = KillReport(
        target=CHROMA,
        role=CHROMA,
        pid=pid,
        host=here,
        process_started_at=started,
        signal=SIGNAL.name,
        leases=[],
        running_calls=[],
        exited=False,
        killed_by=operator,
        killed_at=clock.now_ms(),
        url=url,
    )
    return _signal_and_journal(conn, report)


def refuse_elsewhere(what: str, host: str, here: str) -> None:
    """Refused unless `host` is this one: a pid names a process only on its own host."""
    if host != here:
        raise Refused(
            f"{what} runs on host {host}, not on this one ({here}): rem never signals another machine; "
            f"run `rem kill` on {host}, or `rem drain` it from here"
        )


def refuse_not_it(what: str, pid: int, started: float | None, *, registered_at: int) -> None:
    """Refused unless `pid` is still the process recorded: its kernel start time when recorded,
    else a process already running when it registered (`registered_at`, ms); never this process."""
    if pid == os.getpid():
        raise Refused(f"{what} is pid {pid}, this very process: rem does not kill itself")
    if processes.is_gone(pid):
        raise Refused(f"{what}'s pid {pid} has exited already (no record of it yet); nothing to kill")
    same = (
        processes.same_process(pid, started)
        if started is not None
        else processes.started_by(pid, registered_at / 1000)
    )
    if not same:
        raise Refused(
            f"pid {pid} is no longer {what}: it started at another time than the one recorded, so the "
            "kernel gave the number to another process; nothing was signalled"
        )


def held_leases_sync(conn: Conn, owner_id: str) -> list[HeldLease]:
    """The leases `owner_id` holds: executions, summary jobs, Dream claims."""
    rows = conn.execute(LEASES_SQL, {"o": owner_id}).fetchall()
    return [HeldLease(kind=r[0], id=r[1], session_id=r[2]) for r in rows]


def running_calls_sync(conn: Conn, owner_id: str) -> list[RunningCall]:
    """The tool calls `owner_id` has running (an effect among them becomes `unknown` at the takeover)."""
    rows = conn.execute(RUNNING_SQL, (owner_id,)).fetchall()
    return [RunningCall(call_id=r[0], session_id=r[1], tool=r[2], effect=r[3], started_at=r[4]) for r in rows]


def record_exit_sync(conn: Conn, report: KillReport) -> None:
    """The killed worker is gone: dead in the registry now, as its supervisor would record it."""
    if report["target"] == CHROMA:
        return
    now = clock.now_ms()
    if conn.execute(EXITED_SQL, (now, report["target"])).fetchone() is not None:
        append_event_sync(
            conn,
            kind=EventKind.WORKER_EXITED,
            actor=report["killed_by"],
            target=report["target"],
            data={
                "reason": f"killed by {report['signal']} (rem kill)",
                "pid": report["pid"],
                "reaped": False,
            },
            now=now,
        )


def _signal_and_journal(conn: Conn, report: KillReport) -> KillReport:
    """Send the signal, then journal what was seen (a signal that finds no process is a refusal)."""
    try:
        os.kill(report["pid"], SIGNAL)
    except ProcessLookupError:
        raise Refused(f"pid {report['pid']} exited before the signal; nothing to kill") from None
    # info, not warning: the journal is its record, and a warning would be printed over the console's screen
    log.info("%s killed %s pid %s with %s", report["killed_by"], report["target"], report["pid"], SIGNAL.name)
    append_event_sync(
        conn,
        kind=EventKind.OPERATOR_KILL,
        actor=report["killed_by"],
        target=report["target"],
        data={k: v for k, v in report.items() if k not in ("exited", "killed_by")},
        now=report["killed_at"],
    )
    return report


def _recorded_start(info: Any) -> float | None:
    """The start time a worker recorded of its process (`workers.own_process`), if it did."""
    try:
        parsed = json.loads(info) if isinstance(info, str) else info
    except ValueError:
        return None
    value = parsed.get(workers.PROCESS_STARTED_KEY) if isinstance(parsed, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _death(row: Any) -> str:
    if row["exited_at"] is not None:
        return f"pid {row['pid']} was seen to exit"
    return "stopped"
