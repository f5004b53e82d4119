"""The operator's drain of a worker: ask it to stop claiming, hand back its work and exit.

The request is checked against the registry and journaled (`operator.drain`)
in one transaction; the worker itself notices it at its next heartbeat
(`backend.runtime.daemon`), finishes or hands back what it holds and marks
itself stopped, which `wait_drained` watches for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from backend.core import clock
from backend.core.errors import Refused, WorkerNotFound
from backend.ops.results import DrainReport
from backend.store import workers
from backend.store.db import Database, execute, fetchone
from backend.store.events import EventKind, append_event
from backend.store.workers import WorkerRole, WorkerState, heartbeat_alive


async def request_drain(db: Database, owner_id: str, operator: str) -> DrainReport:
    """Ask a live worker to drain; refuses unknown, stopped or dead workers (journaled)."""
    now = clock.now_ms()
    async with db.tx() as conn:
        worker = await fetchone(
            conn,
            "SELECT role, pid, host, state, heartbeat_at, exited_at FROM worker WHERE owner_id = ?",
            (owner_id,),
        )
        if worker is None:
            raise WorkerNotFound(f"no worker {owner_id!r}; list workers with `rem status`")
        role, state, heartbeat_at = (
            WorkerRole(worker["role"]),
            WorkerState(worker["state"]),
            worker["heartbeat_at"],
        )
        if state == WorkerState.STOPPED:
            raise Refused(f"worker {owner_id} is already stopped; nothing to drain")
        if worker["exited_at"] is not None:
            raise Refused(
                f"worker {owner_id} is dead: its supervisor saw pid {worker['pid']} exit "
                f"{max(0, now - worker['exited_at']) // 1000} s ago, so it cannot drain; "
                "release its leases with `rem release`"
            )
        if not heartbeat_alive(heartbeat_at, now):
            raise Refused(
                f"worker {owner_id} has not heartbeated for {(now - heartbeat_at) // 1000} s and is "
                "presumed dead, so it cannot drain; release its leases with `rem release`"
            )
        if state == WorkerState.RUNNING:
            await execute(
                conn,
                "UPDATE worker SET state = 'draining', drain_requested_at = ? "
                "WHERE owner_id = ? AND state = 'running'",
                (now, owner_id),
            )
        seen = {
            "state": state,
            "heartbeat_age_ms": now - heartbeat_at,
            "pid": worker["pid"],
            "host": worker["host"],
        }
        await append_event(
            conn,
            kind=EventKind.OPERATOR_DRAIN,
            actor=operator,
            target=owner_id,
            data={
                "seen": seen,
                "result": WorkerState.DRAINING,
                "already_draining": state == WorkerState.DRAINING,
                "role": role,
            },
            now=now,
        )
    return DrainReport(owner_id=owner_id, role=role, previous_state=state, state=WorkerState.DRAINING)


async def wait_drained(
    db: Database,
    requested: DrainReport,
    *,
    timeout_s: float,
    progress: Callable[[DrainReport], None] | None = None,
) -> DrainReport:
    """Wait until the worker has marked itself stopped, calling `progress` with its state and leases held."""
    owner_id = requested["owner_id"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        state = await workers.state_of(db, owner_id)
        held = await workers.leases_held(db, owner_id)
        report = DrainReport(
            owner_id=owner_id,
            role=requested["role"],
            previous_state=requested["previous_state"],
            state=requested["state"] if state is None else state,
            leases_held=held,
            waited_ms=int((loop.time() - started) * 1000),
        )
        if progress is not None:
            progress(report)
        if state == WorkerState.STOPPED:
            return report
        if loop.time() - started > timeout_s:
            raise Refused(
                f"worker {owner_id} is still {state} after {timeout_s:.0f} s "
                f"({held} leases held); check its log, or release its leases"
            )
        await asyncio.sleep(0.1)
